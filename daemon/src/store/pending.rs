//! Increments held in memory between a batch's arrival and its spool write, bounded in bytes.

use std::collections::{BTreeMap, VecDeque};

use profile_format::{EpochId, EventDesc};

use crate::aggregate::Resolved;

use super::spool::{Increment, SpoolImage};
use super::EventInfo;

/// One profile's part of a batch: counts as (offset, count), offsets ascending.
pub(super) struct PendingProfile {
    /// Image id text and what the spool records about it; `None` = the event's unknown profile.
    pub image: Option<(String, SpoolImage)>,
    pub desc: EventDesc,
    pub counts: Vec<(u64, u64)>,
    pub total_period: u64,
}

pub(super) struct PendingBatch {
    pub epoch: Option<EpochId>,
    pub profiles: Vec<PendingProfile>,
    pub samples: u64,
    pub unknown: u64,
    pub lost: u64,
    pub throttled: u64,
    pub bytes: u64,
}

impl PendingBatch {
    /// The batch's profiles as the spool appends them (one record per batch).
    pub fn increments(&self) -> Vec<Increment<'_>> {
        self.profiles
            .iter()
            .map(|p| Increment {
                image: p.image.as_ref().map(|(id, img)| (id.as_str(), img)),
                desc: &p.desc,
                total_period: p.total_period,
                counts: &p.counts,
            })
            .collect()
    }

    /// Convert a resolved batch; `None` if it carries nothing. Profiles of event indexes that
    /// are not configured are dropped (reported once through `unknown_event`).
    pub fn from_resolved(
        resolved: Resolved,
        events: &[EventInfo],
        epoch: Option<EpochId>,
        lost: u64,
        throttled: u64,
        unknown_event: &mut dyn FnMut(u16),
    ) -> Option<Self> {
        let mut profiles = Vec::with_capacity(resolved.profiles.len() + 1);
        let mut bytes = 64u64;
        for ((image_id, ev), rp) in resolved.profiles {
            let Some(info) = events.get(usize::from(ev)) else {
                unknown_event(ev);
                continue;
            };
            let mut total_period = 0u64;
            let mut counts: Vec<(u64, u64)> = rp
                .counts
                .iter()
                .filter(|(_, (c, _))| *c > 0)
                .map(|(o, (c, p))| {
                    total_period = total_period.saturating_add(*p);
                    (*o, *c)
                })
                .collect();
            counts.sort_unstable();
            if counts.is_empty() {
                continue;
            }
            bytes += 160 + rp.image.path.len() as u64 + 16 * counts.len() as u64;
            profiles.push(PendingProfile {
                image: Some((
                    image_id.to_text(),
                    SpoolImage {
                        kind: rp.image.kind,
                        path: rp.image.path.clone(),
                        jit: rp.image.jit_symbols.clone(),
                    },
                )),
                desc: info.desc.clone(),
                counts,
                total_period,
            });
        }
        let mut unknown_by_event: BTreeMap<u16, (Vec<(u64, u64)>, u64)> = BTreeMap::new();
        let mut unknown = 0;
        for ((ev, reason), (c, p)) in resolved.unknown {
            if c == 0 || usize::from(ev) >= events.len() {
                continue;
            }
            unknown += c;
            let e = unknown_by_event.entry(ev).or_default();
            e.0.push((reason as u64, c));
            e.1 = e.1.saturating_add(p);
        }
        for (ev, (mut counts, total_period)) in unknown_by_event {
            counts.sort_unstable();
            bytes += 160 + 16 * counts.len() as u64;
            profiles.push(PendingProfile {
                image: None,
                desc: events[usize::from(ev)].desc.clone(),
                counts,
                total_period,
            });
        }
        if profiles.is_empty() && resolved.samples == 0 && lost == 0 && throttled == 0 {
            return None;
        }
        Some(Self { epoch, profiles, samples: resolved.samples, unknown, lost, throttled, bytes })
    }
}

/// Batches not yet in the spool, oldest first, and what was dropped past the memory bound.
#[derive(Default)]
pub(super) struct PendingQueue {
    batches: VecDeque<PendingBatch>,
    bytes: u64,
    pub dropped_samples: u64,
    pub dropped_batches: u64,
    /// Dropped samples not yet added to an epoch summary's `lost`.
    pub dropped_unreported: u64,
}

impl PendingQueue {
    /// Add a batch; past `max_bytes` drop the oldest (they would be written first, but the
    /// newest data is what the user is looking at) and count their samples as lost.
    pub fn push(&mut self, b: PendingBatch, max_bytes: u64) {
        self.bytes += b.bytes;
        self.batches.push_back(b);
        while self.bytes > max_bytes {
            let Some(old) = self.batches.pop_front() else { break };
            self.bytes -= old.bytes;
            let n: u64 = old.profiles.iter().flat_map(|p| p.counts.iter()).map(|c| c.1).sum();
            if self.dropped_batches == 0 {
                tracing::error!(
                    max_memory_bytes = max_bytes,
                    "store: memory bound reached while the spool cannot be written; dropping the oldest samples (counted as lost)"
                );
            }
            self.dropped_samples += n;
            self.dropped_unreported += n;
            self.dropped_batches += 1;
        }
    }

    pub fn pop(&mut self) -> Option<PendingBatch> {
        let b = self.batches.pop_front()?;
        self.bytes -= b.bytes;
        Some(b)
    }

    /// Put back a batch that could not be written.
    pub fn unpop(&mut self, b: PendingBatch) {
        self.bytes += b.bytes;
        self.batches.push_front(b);
    }

    pub fn len(&self) -> usize {
        self.batches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}
