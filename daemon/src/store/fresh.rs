//! Fresh reports without a flush (issue 36 item 6, FORMAT.md §7.3): profiles are published
//! only up to a slice boundary, which `summary.json` records with the spool sequence it
//! stands for; a reader adds the slices after it to the profiles, exactly.
//!
//! Why it is exact: every batch is numbered on arrival ([`Fresh::arrive`]); it goes into the
//! open slice of that instant and, in arrival order, into the spool, which gives it an
//! increasing sequence. When the slice ending at `T` has been appended to `slices.log` and
//! every batch that arrived before its end has been spooled (the last with sequence `B`), the
//! batches of the slices ending at or before `T` are exactly those with a sequence `<= B`.
//! The mark `(T, B)` goes into `summary.json`; only once that is written are profiles
//! published, and then only with increments of sequence `<= B` (the cap), and stamped with
//! `sequence = B`. So a profile stamped `B` holds exactly the slices up to `T`, and the
//! slices after `T` hold what it lacks. Publishing stays cheap: a slice costs one append;
//! marks are recorded with the summary (once per publish interval).
//!
//! A batch published straight into the database (the spool failing) has no sequence: the
//! epoch then gets no more marks and its recorded ones are dropped (readers fall back to the
//! profiles alone, as before), and its cap is lifted.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use profile_format::{EpochId, EventDesc, FreshMark, ImageKind, ProfileHeader, SummaryIndex};

/// Per epoch: the names of the image keys its slices hold, for `fresh.json` (FORMAT.md §7.3).
#[derive(Default)]
pub(super) struct Names {
    /// event name → image id text → (kind, path, event).
    known: hashbrown::HashMap<String, hashbrown::HashMap<String, (ImageKind, Vec<u8>, EventDesc)>>,
    /// (event, image id) of the keys in the file as last written (or read back at start).
    written: BTreeSet<(String, String)>,
    /// Whether the file left by an earlier run was read back into `written`/`known`.
    resumed: bool,
}

impl Names {
    /// Remember the names of a batch's key: a lookup for a key already known, no allocation.
    pub(super) fn learn(&mut self, event: &EventDesc, id: &str, kind: ImageKind, path: &[u8]) {
        let m = match self.known.get_mut(event.name.as_str()) {
            Some(m) => m,
            None => self.known.entry(event.name.clone()).or_default(),
        };
        if !m.contains_key(id) {
            m.insert(id.to_owned(), (kind, path.to_vec(), event.clone()));
        }
    }

    /// Whether `(event, id)` is in the file as written.
    pub(super) fn is_written(&self, event: &str, id: &str) -> bool {
        self.written.contains(&(event.to_owned(), id.to_owned()))
    }

    /// The file left by an earlier run (its names stay until this run writes them again).
    pub(super) fn resume(&mut self, old: Option<SummaryIndex>) {
        if std::mem::replace(&mut self.resumed, true) {
            return;
        }
        let Some(old) = old else { return };
        let epoch = EpochId::parse("19700101T000000Z").expect("a valid epoch name");
        for t in &old.images {
            let Ok(h) = t.header(&old, "", &epoch) else { continue };
            let id = h.image_id.to_text();
            self.learn(&h.event, &id, h.kind, &h.image_path);
        }
    }

    pub(super) fn needs_resume(&self) -> bool {
        !self.resumed
    }

    /// The file's content: every known key `unpublished(event, id)` says has no profile yet.
    /// Records what it holds as written.
    pub(super) fn index(&mut self, unpublished: &dyn Fn(&str, &str) -> bool) -> SummaryIndex {
        let mut idx = SummaryIndex::default();
        let mut written = BTreeSet::new();
        let mut keys: Vec<(&String, &String, &(ImageKind, Vec<u8>, EventDesc))> = self
            .known
            .iter()
            .flat_map(|(e, m)| m.iter().map(move |(id, v)| (e, id, v)))
            .filter(|(e, id, _)| unpublished(e, id))
            .collect();
        keys.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        for (e, id, (kind, path, desc)) in keys {
            let Ok(image_id) = profile_format::ImageId::parse(id) else { continue };
            idx.push(&ProfileHeader {
                kind: *kind,
                image_id,
                image_path: path.clone(),
                event: desc.clone(),
                host: String::new(),
                epoch: EpochId::parse("19700101T000000Z").expect("a valid epoch name"),
                total_samples: 0,
                total_period: 0,
                sequence: 0,
                jit_symbols: Vec::new(),
            });
            written.insert((e.clone(), id.clone()));
        }
        self.written = written;
        idx
    }
}

/// The freshness bookkeeping of a store.
#[derive(Default)]
pub(super) struct Fresh {
    /// Number of the last batch that arrived (from 1).
    next_arrival: u32,
    /// Per epoch: the end of the newest appended slice and the last batch in it.
    appended: BTreeMap<EpochId, (u64, u64)>,
    /// Spooled batches (arrival, sequence), in order, not yet covered by a mark.
    spooled: VecDeque<(u64, u64)>,
    /// Per epoch: the sequence of its newest recorded mark (the publication cap).
    cap: BTreeMap<EpochId, u64>,
    /// Epochs that had a batch published around the spool: no marks, no cap.
    poisoned: BTreeSet<EpochId>,
    /// Keys whose increments were held back by the cap at their turn (published later).
    pub(super) held_back: Vec<super::spool::SpoolKey>,
    /// Epochs that got a new mark since last asked (their held-back profiles can go now).
    pub(super) new_marks: BTreeSet<EpochId>,
    /// Per epoch: the names of its slices' keys (`fresh.json`).
    pub(super) names: BTreeMap<EpochId, Names>,
    /// `fresh.json` files written and their bytes (what naming new images costs).
    pub(super) names_writes: u64,
    pub(super) names_bytes: u64,
}

impl Fresh {
    /// Number an arriving batch.
    pub(super) fn arrive(&mut self) -> u32 {
        self.next_arrival = self.next_arrival.saturating_add(1);
        self.next_arrival
    }

    /// A slice of `epoch` ending at `end`, whose last batch arrived as `last`, was appended
    /// to its log.
    pub(super) fn appended(&mut self, epoch: &EpochId, end: u64, last: u64) {
        let e = self.appended.entry(epoch.clone()).or_insert((end, last));
        if end >= e.0 {
            *e = (end, last.max(e.1));
        }
    }

    /// The batch that arrived as `arrival` was spooled with `seq`.
    pub(super) fn spooled(&mut self, arrival: u32, seq: u64) {
        self.spooled.push_back((u64::from(arrival), seq));
        // Bounded: a mark needs only the newest spooled batch before its boundary.
        while self.spooled.len() > 100_000 {
            self.spooled.pop_front();
        }
    }

    /// A batch of `epoch` went around the spool.
    pub(super) fn poison(&mut self, epoch: &EpochId) {
        if self.poisoned.insert(epoch.clone()) {
            tracing::info!(epoch = %epoch, "store: a batch was published around the spool; reports of this epoch are fresh only up to its profiles");
        }
        self.cap.remove(epoch);
    }

    /// The mark to record for `epoch` now, if its newest appended slice is complete in the
    /// spool: `oldest_pending` is the arrival of the oldest batch not yet spooled (any epoch).
    pub(super) fn mark(
        &self,
        epoch: &EpochId,
        oldest_pending: Option<u64>,
        recorded: &[FreshMark],
    ) -> Option<FreshMark> {
        if self.poisoned.contains(epoch) {
            return None;
        }
        let &(end, last) = self.appended.get(epoch)?;
        if oldest_pending.is_some_and(|a| a <= last) {
            return None;
        }
        let prev = recorded.last().copied().unwrap_or_default();
        let seq = self.spooled.iter().rev().find(|(a, _)| *a <= last).map_or(0, |(_, s)| *s);
        let seq = seq.max(prev.sequence);
        // A slice after a restart may end in the second the previous mark did (it does not
        // know where the last one ended): the same boundary, more samples.
        if end < prev.slice_end || (end == prev.slice_end && seq <= prev.sequence) {
            return None;
        }
        Some(FreshMark { slice_end: end, sequence: seq })
    }

    /// A summary read back from the database records `marks` for `epoch` (a restart): the
    /// newest is the publication cap until a newer one is recorded.
    pub(super) fn resume(&mut self, epoch: &EpochId, marks: &[FreshMark]) {
        if let Some(m) = marks.last() {
            let c = self.cap.entry(epoch.clone()).or_insert(0);
            *c = (*c).max(m.sequence);
        }
    }

    /// `m` is now recorded (durably) for `epoch`: it is the new publication cap.
    pub(super) fn recorded(&mut self, epoch: &EpochId, m: FreshMark) {
        self.cap.insert(epoch.clone(), m.sequence);
        self.new_marks.insert(epoch.clone());
    }

    /// Whether `epoch`'s marks were given up.
    pub(super) fn is_poisoned(&self, epoch: &EpochId) -> bool {
        self.poisoned.contains(epoch)
    }

    /// The publication cap of `epoch`'s flat profiles: `Some(0)` before its first mark,
    /// `None` without one (slices off, poisoned).
    pub(super) fn cap(&self, epoch: &EpochId, slices_on: bool) -> Option<u64> {
        if !slices_on || self.poisoned.contains(epoch) {
            return None;
        }
        Some(self.cap.get(epoch).copied().unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_waits_for_its_slice_to_be_spooled() {
        let e = EpochId::parse("20261129T000000Z").unwrap();
        let mut f = Fresh::default();
        let (a1, a2, a3) = (f.arrive(), f.arrive(), f.arrive());
        assert_eq!(f.mark(&e, None, &[]), None, "nothing appended yet");
        f.appended(&e, 120, u64::from(a2));
        assert_eq!(f.mark(&e, Some(a2.into()), &[]), None, "its last batch is still pending");
        f.spooled(a1, 1000);
        f.spooled(a2, 1001);
        let m = f.mark(&e, Some(a3.into()), &[]).unwrap();
        assert_eq!(m, FreshMark { slice_end: 120, sequence: 1001 });
        assert_eq!(f.cap(&e, true), Some(0), "no cap before the mark is recorded");
        f.recorded(&e, m);
        assert_eq!(f.cap(&e, true), Some(1001));
        assert_eq!(f.mark(&e, Some(a3.into()), &[m]), None, "nothing new");
        f.poison(&e);
        assert_eq!((f.cap(&e, true), f.mark(&e, None, &[m])), (None, None));
    }
}
