//! Call-stack increments in the store: held per (epoch, event) until the next tick spools them
//! (spool record kind 3), then merged into `<host dir>/stacks.<event>.stk` (FORMAT.md §13)
//! when their spool key's publish turn comes, exactly once, like the flat profiles: the file's
//! `sequence` skips what an earlier, interrupted publish already merged.

use std::collections::BTreeMap;
use std::time::Instant;

use profile_format::{EpochId, StackProfile};

use super::spool::{SpoolKey, STACKS_KEY_IMAGE};
use super::{Store, StoreError};
use crate::types::EventIdx;

/// Stack increments not yet spooled, merged per (epoch, event index): bounded by the distinct
/// stacks of the interval, however many flushes the spool misses.
#[derive(Debug, Default)]
pub(super) struct PendingStacks {
    held: Vec<(Option<EpochId>, EventIdx, StackProfile)>,
}

impl PendingStacks {
    fn add(&mut self, epoch: Option<EpochId>, event: EventIdx, p: &StackProfile) {
        match self.held.iter_mut().find(|(e, ev, _)| *e == epoch && *ev == event) {
            // Both have empty event names (set when spooled): merging cannot mismatch.
            Some((_, _, held)) => {
                drop(held.merge(p));
            }
            None => self.held.push((epoch, event, p.clone())),
        }
    }
}

/// Is this spool key a stack profile's?
pub(super) fn is_stacks_key(key: &SpoolKey) -> bool {
    key.image.as_deref() == Some(STACKS_KEY_IMAGE)
}

impl Store {
    /// Hold a batch's stacks (from [`crate::aggregate::Resolved::stacks`]) for the next tick.
    pub(super) fn stacks_add(&mut self, stacks: BTreeMap<EventIdx, StackProfile>) {
        for (ev, p) in stacks {
            if !p.is_empty() {
                let epoch = self.epoch.clone();
                self.stacks.add(epoch, ev, &p);
            }
        }
    }

    /// Append held stack increments to the spool, one record per epoch. Returns how many
    /// profiles were written.
    pub(super) fn spool_stacks(&mut self, now: Instant) -> usize {
        let mut written = 0;
        let held = std::mem::take(&mut self.stacks.held);
        let mut keep = Vec::new();
        let mut by_epoch: BTreeMap<String, Vec<(EventIdx, StackProfile)>> = BTreeMap::new();
        for (epoch, ev, p) in held {
            match epoch.or_else(|| self.epoch.clone()) {
                Some(e) => by_epoch.entry(e.to_string()).or_default().push((ev, p)),
                None => keep.push((None, ev, p)),
            }
        }
        for (epoch, list) in by_epoch {
            let mut named = Vec::new();
            for (ev, mut p) in list {
                // Events the store was not told about are dropped (as flat profiles are).
                let Some(info) = self.host.events.get(usize::from(ev)) else { continue };
                p.event = info.desc.name.clone();
                p.epoch = epoch.clone();
                named.push((info.desc.clone(), ev, p));
            }
            let Some(sp) = self.spool.as_mut() else {
                keep.extend(
                    named.into_iter().map(|(_, ev, p)| (EpochId::parse(&epoch).ok(), ev, p)),
                );
                continue;
            };
            let refs: Vec<_> = named.iter().map(|(d, _, p)| (d, p)).collect();
            match sp.append_stacks(&epoch, &refs, now) {
                Ok(_) => {
                    written += named.len();
                    for (d, _, _) in &named {
                        let key = SpoolKey {
                            epoch: epoch.clone(),
                            image: Some(STACKS_KEY_IMAGE.to_owned()),
                            event: d.name.clone(),
                        };
                        self.schedule.mark(key, now, self.cfg.publish_interval, None);
                    }
                }
                Err(e) => {
                    self.set_spool_error(&e);
                    for (_, ev, mut p) in named {
                        p.event.clear();
                        keep.push((EpochId::parse(&epoch).ok(), ev, p));
                    }
                }
            }
        }
        self.stacks.held = keep;
        written
    }

    /// Merge a stack profile's spooled increments into its file, exactly once.
    pub(super) fn publish_stacks(&mut self, key: &SpoolKey) -> Result<(), StoreError> {
        let spool =
            self.spool.as_mut().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
        let incs = spool.increments(key);
        let Some(last_seq) = incs.last().map(|r| r.seq) else { return Ok(()) };
        let Ok(epoch) = EpochId::parse(&key.epoch) else {
            tracing::error!(epoch = %key.epoch, "spool: stack increments of an invalid epoch; dropped");
            spool.published(key, last_seq);
            return Ok(());
        };
        let hd = self.host_dir(&epoch)?;
        let path = hd.stacks_path(&key.event);
        let mut merged = match StackProfile::read(&path) {
            Ok(p) if p.event == key.event => Some(p),
            Ok(p) => {
                self.set_aside(&path, &format!("holds event {:?}, not {:?}", p.event, key.event));
                None
            }
            Err(profile_format::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            Err(e @ profile_format::Error::Io { .. }) => return Err(e.into()),
            Err(e) => {
                self.set_aside(&path, &e);
                None
            }
        }
        .unwrap_or_else(|| StackProfile::new(&self.cfg.host, epoch.as_str(), &key.event));
        let spool =
            self.spool.as_mut().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
        let mut changed = false;
        for inc in &incs {
            if inc.seq <= merged.sequence {
                continue;
            }
            if let Some(mut p) = spool.stack_profile(inc) {
                p.event = key.event.clone();
                if merged.merge(&p).is_ok() {
                    changed = true;
                }
            }
        }
        if changed {
            merged.host = self.cfg.host.clone();
            merged.epoch = epoch.to_string();
            merged.sequence = merged.sequence.max(last_seq);
            let n = merged.write(&path)?;
            self.health.bytes.profiles += n;
            self.health.published_files += 1;
        }
        if let Some(sp) = self.spool.as_mut() {
            sp.published(key, last_seq);
        }
        Ok(())
    }
}
