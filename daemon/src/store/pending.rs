//! Increments held in memory between a batch's arrival and its spool write, bounded in bytes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use profile_format::{EpochId, EventDesc, ProfileWho};

use crate::aggregate::{OffsetCounts, PidProfiles, Resolved};
use crate::who::WhoBatch;

use super::spool::{Increment, SpoolImage};
use super::who::WhoProfiles;
use super::EventInfo;
use crate::aggregate::ResolvedProfile;

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
    /// Per-process and per-cgroup profiles (`by_pid`, `by_cgroup`): the same samples as
    /// `profiles` again, so they count in no summary.
    pub who_profiles: Vec<PendingProfile>,
    pub samples: u64,
    pub unknown: u64,
    pub lost: u64,
    pub throttled: u64,
    pub bytes: u64,
    /// Its summary delta was applied when its first profile was published straight to the
    /// database (the spool could not take it); the rest of it follows profile by profile.
    pub summarized: bool,
    /// Its number in arrival order ([`super::fresh::Fresh::arrive`]; 0: not numbered). 32
    /// bits keep the batch within 128 bytes (clippy's large-error bound on `publish_direct`):
    /// one batch per flush interval (200 ms at least) numbers 27 years.
    pub arrival: u32,
}

impl PendingBatch {
    /// The batch's profiles as the spool appends them (one record per batch).
    pub(super) fn increments(&self) -> Vec<Increment<'_>> {
        self.profiles
            .iter()
            .chain(&self.who_profiles)
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
    pub(super) fn from_resolved(
        mut resolved: Resolved,
        events: &[EventInfo],
        epoch: Option<EpochId>,
        lost: u64,
        throttled: u64,
        who: WhoProfiles,
        unknown_event: &mut dyn FnMut(u16),
    ) -> Option<Self> {
        let mut who_profiles = Vec::new();
        let mut who_bytes = 0;
        if let Some(pp) = resolved.pid_profiles.take() {
            if who.any() {
                who_bytes = qualified(pp, &resolved.who, events, who, &mut who_profiles);
            }
        }
        let mut profiles = Vec::with_capacity(resolved.profiles.len() + 1);
        let mut bytes = 64u64;
        for ((image_id, ev), rp) in resolved.profiles {
            let Some(info) = events.get(usize::from(ev)) else {
                unknown_event(ev);
                continue;
            };
            if let Some((p, b)) = pending_of(&rp, image_id.to_text(), None, info, &rp.counts) {
                bytes += b;
                profiles.push(p);
            }
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
        bytes += who_bytes;
        Some(Self {
            epoch,
            profiles,
            who_profiles,
            samples: resolved.samples,
            unknown,
            lost,
            throttled,
            bytes,
            summarized: false,
            arrival: 0,
        })
    }
}

/// A profile to spool under the spool name `name` (flat: the image id; qualified: with the
/// pid or cgroup component), with `counts` as sorted (offset, count) pairs and their period
/// sum, and the bytes it holds; `None` when no offset has a sample.
fn pending_of(
    rp: &ResolvedProfile,
    name: String,
    who: Option<ProfileWho>,
    info: &EventInfo,
    counts: &OffsetCounts,
) -> Option<(PendingProfile, u64)> {
    let mut total_period = 0u64;
    let mut pairs: Vec<(u64, u64)> = counts
        .iter()
        .filter(|(_, (c, _))| *c > 0)
        .map(|(o, (c, p))| {
            total_period = total_period.saturating_add(*p);
            (*o, *c)
        })
        .collect();
    if pairs.is_empty() {
        return None;
    }
    pairs.sort_unstable();
    let bytes = 160 + rp.image.path.len() as u64 + 16 * pairs.len() as u64;
    let image = SpoolImage {
        kind: rp.image.kind,
        path: rp.image.path.clone(),
        jit: rp.image.jit_symbols.clone(),
        who,
    };
    let p = PendingProfile {
        image: Some((name, image)),
        desc: info.desc.clone(),
        counts: pairs,
        total_period,
    };
    Some((p, bytes))
}

/// The per-process profiles of a batch as `by_pid` profiles, added up per cgroup (the
/// last one the process was seen in during the batch, as in the who table) as `by_cgroup`
/// ones, and per command (the who table's command of the process) as `by_command` ones.
/// Samples of a process whose cgroup is not known (no cgroup v2, a kernel before 5.7)
/// are in no cgroup profile. Returns the bytes held.
fn qualified(
    pp: PidProfiles,
    names: &WhoBatch,
    events: &[EventInfo],
    who: WhoProfiles,
    out: &mut Vec<PendingProfile>,
) -> u64 {
    let mut bytes = 0;
    let mut push = |rp: &ResolvedProfile,
                    id: &profile_format::ImageId,
                    q: ProfileWho,
                    counts: &OffsetCounts| {
        let Some(info) = events.get(usize::from(rp.event)) else { return };
        let name = format!("{}.{}", id.to_text(), q.file_component());
        if let Some((p, b)) = pending_of(rp, name, Some(q), info, counts) {
            bytes += b;
            out.push(p);
        }
    };
    type Sums<K> = BTreeMap<(K, String, u16), (ResolvedProfile, profile_format::ImageId)>;
    /// Add `rp` into the sum of `key` (taken whole when it is the first: no copy).
    fn add_up<K: Ord>(
        sums: &mut Sums<K>,
        key: K,
        id: &profile_format::ImageId,
        ev: u16,
        rp: ResolvedProfile,
    ) {
        match sums.entry((key, id.to_text(), ev)) {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert((rp, id.clone()));
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                let acc = &mut o.get_mut().0;
                for (off, (c, p)) in rp.counts {
                    let e = acc.counts.entry(off).or_insert((0, 0));
                    e.0 += c;
                    e.1 = e.1.saturating_add(p);
                }
            }
        }
    }
    let mut by_cgroup: Sums<String> = BTreeMap::new();
    let mut by_command: Sums<Vec<u8>> = BTreeMap::new();
    for ((id, ev, pid), rp) in pp {
        if who.by_pid {
            let q = ProfileWho::Pid { pid, command: names.command(pid) };
            push(&rp, &id, q, &rp.counts);
        }
        let cgroup = if who.by_cgroup {
            Some(names.cgroup(pid)).filter(|p| p.starts_with('/'))
        } else {
            None
        };
        // The process's profile is moved into the last sum that takes it, copied only when
        // both per-cgroup and per-command profiles are on.
        match (cgroup, who.by_command) {
            (Some(path), true) => {
                add_up(&mut by_cgroup, path, &id, ev, rp.clone());
                add_up(&mut by_command, names.command(pid), &id, ev, rp);
            }
            (Some(path), false) => add_up(&mut by_cgroup, path, &id, ev, rp),
            (None, true) => add_up(&mut by_command, names.command(pid), &id, ev, rp),
            (None, false) => {}
        }
    }
    for ((path, _, _), (rp, id)) in by_cgroup {
        push(&rp, &id, ProfileWho::Cgroup { path }, &rp.counts);
    }
    for ((command, _, _), (rp, id)) in by_command {
        push(&rp, &id, ProfileWho::Command { command }, &rp.counts);
    }
    bytes
}

/// Samples held in memory and samples dropped, readable without the store's lock: a stop
/// whose last database operation hangs must still know what it loses.
#[derive(Debug, Default)]
pub struct Losses {
    /// Samples of the held batches (their flat profiles) not yet written anywhere, including
    /// a batch an operation in progress has taken out of the queue.
    pub held: AtomicU64,
    /// Samples dropped: past the memory bound, or held at exit.
    pub dropped: AtomicU64,
}

impl Losses {
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Acquire)
    }
}

/// The samples of a pending profile.
pub(super) fn samples_of(p: &PendingProfile) -> u64 {
    p.counts.iter().fold(0u64, |a, c| a.saturating_add(c.1))
}

/// Batches not yet in the spool or the database, oldest first, and what was dropped past the
/// memory bound.
#[derive(Default)]
pub(super) struct PendingQueue {
    batches: VecDeque<PendingBatch>,
    bytes: u64,
    pub dropped_samples: u64,
    pub dropped_batches: u64,
    /// Dropped samples not yet added to an epoch summary's `lost`.
    pub dropped_unreported: u64,
    losses: Arc<Losses>,
}

impl PendingQueue {
    pub(super) fn losses(&self) -> Arc<Losses> {
        Arc::clone(&self.losses)
    }

    /// Add a batch; past `max_bytes` drop the oldest (they would be written first, but the
    /// newest data is what the user is looking at) and count their samples as lost.
    pub(super) fn push(&mut self, b: PendingBatch, max_bytes: u64) {
        self.bytes += b.bytes;
        let n: u64 = b.profiles.iter().map(samples_of).sum();
        self.losses.held.fetch_add(n, Ordering::AcqRel);
        self.batches.push_back(b);
        while self.bytes > max_bytes {
            let Some(old) = self.batches.pop_front() else { break };
            self.bytes -= old.bytes;
            if self.dropped_batches == 0 {
                tracing::error!(
                    max_memory_bytes = max_bytes,
                    "store: memory bound reached while neither the spool nor the database can be written; dropping the oldest samples (counted as dropped and lost)"
                );
            }
            self.drop_batch(old);
        }
    }

    fn drop_batch(&mut self, old: PendingBatch) {
        let n: u64 = old.profiles.iter().map(samples_of).sum();
        self.losses.held.fetch_sub(n, Ordering::AcqRel);
        self.losses.dropped.fetch_add(n, Ordering::AcqRel);
        self.dropped_samples += n;
        self.dropped_unreported += n;
        self.dropped_batches += 1;
    }

    /// Drop every batch still held (the daemon exits with them); returns their samples.
    pub(super) fn drop_all(&mut self) -> u64 {
        let before = self.dropped_samples;
        while let Some(b) = self.pop() {
            self.drop_batch(b);
        }
        self.dropped_samples - before
    }

    /// `samples` of a batch taken out by [`PendingQueue::pop`] are written (to the spool or
    /// the database): no longer held.
    pub(super) fn written(&self, samples: u64) {
        self.losses.held.fetch_sub(samples, Ordering::AcqRel);
    }

    /// `samples` of a batch taken out by [`PendingQueue::pop`] can be written nowhere (an
    /// invalid profile name): dropped.
    pub(super) fn discard(&mut self, samples: u64) {
        self.losses.held.fetch_sub(samples, Ordering::AcqRel);
        self.losses.dropped.fetch_add(samples, Ordering::AcqRel);
        self.dropped_samples += samples;
        self.dropped_unreported += samples;
    }

    /// Samples held (see [`Losses::held`]).
    pub(super) fn held_samples(&self) -> u64 {
        self.losses.held()
    }

    pub(super) fn pop(&mut self) -> Option<PendingBatch> {
        let b = self.batches.pop_front()?;
        self.bytes -= b.bytes;
        Some(b)
    }

    /// Put back a batch that could not be written.
    pub(super) fn unpop(&mut self, b: PendingBatch) {
        self.bytes += b.bytes;
        self.batches.push_front(b);
    }

    pub(super) fn len(&self) -> usize {
        self.batches.len()
    }

    /// The arrival number of the oldest batch held (none held: `None`).
    pub(super) fn oldest_arrival(&self) -> Option<u64> {
        self.batches.iter().map(|b| u64::from(b.arrival)).min()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }
}
