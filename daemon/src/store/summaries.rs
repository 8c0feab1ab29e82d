//! Per-epoch `summary.json`: the cumulative counts in memory, rebuilt after a restart from the
//! published file plus the spool's deltas above its `spool_sequence`.

use std::collections::{HashMap, HashSet};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use profile_format::sumidx;
use profile_format::{EpochId, EventSummary, HostDir, HostSummary};

use super::pending::PendingBatch;
use super::publish;
use super::spool::{EventDelta, SummaryDelta};
use super::{is_newer, EventInfo, Store, StoreError};

/// Summaries of the epochs this store touched.
#[derive(Default)]
pub(super) struct Summaries {
    pub current: HashMap<String, HostSummary>,
    /// Changed since last written.
    pub dirty: HashSet<String>,
    pub written_at: HashMap<String, Instant>,
}

fn event_mut<'a>(s: &'a mut HostSummary, info: &profile_format::EventDesc) -> &'a mut EventSummary {
    let pos = s.events.iter().position(|e| e.desc.as_ref().map(|d| &d.name) == Some(&info.name));
    match pos {
        Some(i) => &mut s.events[i],
        None => {
            s.events.push(EventSummary { desc: Some(info.clone()), ..EventSummary::default() });
            s.events.last_mut().expect("just pushed")
        }
    }
}

/// Add one spool record's delta.
pub(super) fn apply(s: &mut HostSummary, d: &SummaryDelta) {
    s.samples = s.samples.saturating_add(d.samples);
    s.unknown = s.unknown.saturating_add(d.unknown);
    s.lost = s.lost.saturating_add(d.lost);
    s.throttled = s.throttled.saturating_add(d.throttled);
    for e in &d.events {
        let x = event_mut(s, &e.desc);
        x.samples = x.samples.saturating_add(e.samples);
        x.total_period = x.total_period.saturating_add(e.total_period);
        x.time_enabled_ns = x.time_enabled_ns.saturating_add(e.time_enabled_ns);
        x.time_running_ns = x.time_running_ns.saturating_add(e.time_running_ns);
    }
}

/// What a batch adds to its epoch's summary: its counters, the samples dropped before it, and
/// the counters' enabled/running times accumulated since the previous spooled batch.
pub(super) fn delta_of(
    batch: &PendingBatch,
    dropped: u64,
    events: &[EventInfo],
    times: &[(u64, u64)],
) -> SummaryDelta {
    let mut d = SummaryDelta {
        samples: batch.samples,
        unknown: batch.unknown,
        lost: batch.lost.saturating_add(dropped),
        throttled: batch.throttled,
        events: Vec::new(),
    };
    let mut slot = |desc: &profile_format::EventDesc| -> usize {
        match d.events.iter().position(|e| e.desc.name == desc.name) {
            Some(i) => i,
            None => {
                d.events.push(EventDelta {
                    desc: desc.clone(),
                    samples: 0,
                    total_period: 0,
                    time_enabled_ns: 0,
                    time_running_ns: 0,
                });
                d.events.len() - 1
            }
        }
    };
    let mut adds = Vec::new();
    for p in &batch.profiles {
        let n = p.counts.iter().fold(0u64, |a, c| a.saturating_add(c.1));
        adds.push((slot(&p.desc), n, p.total_period, 0, 0));
    }
    for (i, (en, run)) in times.iter().enumerate() {
        let Some(info) = events.get(i) else { continue };
        if *en == 0 && *run == 0 {
            continue;
        }
        adds.push((slot(&info.desc), 0, 0, *en, *run));
    }
    for (i, n, p, en, run) in adds {
        let e = &mut d.events[i];
        e.samples = e.samples.saturating_add(n);
        e.total_period = e.total_period.saturating_add(p);
        e.time_enabled_ns = e.time_enabled_ns.saturating_add(en);
        e.time_running_ns = e.time_running_ns.saturating_add(run);
    }
    d
}

impl Store {
    /// The epoch's cumulative summary: in memory, or the published `summary.json` plus the
    /// spool's deltas above the sequence it records.
    pub(super) fn summary_for(&mut self, epoch: &EpochId) -> &mut HostSummary {
        let key = epoch.as_str();
        if !self.summaries.current.contains_key(key) {
            let published = self.db.as_ref().and_then(|db| {
                let hd = db.host_dir(epoch, &self.cfg.host).ok()?;
                // Not through a link (FORMAT.md §6.1): another directory's summary is not ours.
                hd.check().ok()?.then_some(())?;
                HostSummary::read(&hd.summary_path()).ok()
            });
            let mut s = published.unwrap_or_else(|| HostSummary {
                format_version: 1,
                host: self.cfg.host.clone(),
                epoch: epoch.to_string(),
                ..HostSummary::default()
            });
            if let Some(sp) = &self.spool {
                for d in sp.summary_deltas(key, s.spool_sequence) {
                    apply(&mut s, &d);
                }
            }
            self.fresh.resume(epoch, &s.fresh);
            self.summaries.current.insert(key.to_owned(), s);
        }
        self.summaries.current.get_mut(key).expect("inserted above")
    }

    /// `summary.json` of one epoch, with the host's facts and the spool sequence it includes.
    pub(super) fn write_summary(&mut self, epoch: &EpochId) -> Result<(), StoreError> {
        let seq = self.spool.as_ref().map_or(0, |sp| sp.summary_seq(epoch.as_str()));
        let mut s = self.summary_for(epoch).clone();
        s.format_version = s.format_version.max(1);
        s.host = self.cfg.host.clone();
        s.epoch = epoch.to_string();
        s.spool_sequence = s.spool_sequence.max(seq);
        if !self.host.kernel_release.is_empty() {
            s.kernel_release = self.host.kernel_release.clone();
        }
        if !self.host.cpus.is_empty() {
            s.cpus = self.host.cpus.clone();
        }
        for info in &self.host.events {
            match s
                .events
                .iter_mut()
                .find(|x| x.desc.as_ref().map(|d| &d.name) == Some(&info.desc.name))
            {
                Some(x) => x.source = info.source.clone(),
                None => s.events.push(EventSummary {
                    desc: Some(info.desc.clone()),
                    source: info.source.clone(),
                    ..EventSummary::default()
                }),
            }
        }
        let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        if s.first_written == 0 {
            s.first_written = t;
        }
        s.last_written = t;
        s.dcpid_version = env!("CARGO_PKG_VERSION").to_string();
        let hd = self.host_dir(epoch)?;
        // The per-(image, event) totals of what is published now, in `summary.idx` (FORMAT.md
        // §7.2) so that per-image reports read that one small file instead of every profile.
        // Written before summary.json, so it is never older than it; without an index (a
        // profile unreadable) a previous one must not outlive the files it described.
        let idx_path = hd.summary_index_path();
        let mut n = 0;
        // Read through the store, so that a hostile or corrupt profile is set aside (and left
        // out) rather than failing the index.
        match self.index_of(&hd) {
            Some(idx) => {
                s.index = Some(idx);
                n += sumidx::write(&s, &idx_path)?;
            }
            None => {
                tracing::debug!(dir = %hd.path.display(), "no summary index");
                match std::fs::remove_file(&idx_path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                        return Err(profile_format::Error::Io { path: idx_path, source: e }.into())
                    }
                    _ => {}
                }
            }
        }
        // The freshness mark of the newest appended slice, once all of it is spooled
        // (FORMAT.md §7.3); it becomes the publication cap once written.
        let mark = if self.fresh.is_poisoned(epoch) {
            s.fresh.clear();
            None
        } else {
            self.fresh.mark(epoch, self.pending.oldest_arrival(), &s.fresh)
        };
        if let Some(m) = mark {
            s.fresh.push(m);
        }
        // The JSON index (§7.1) is no longer written: the binary one holds the same totals.
        s.index = None;
        n += s.write(&hd.summary_path())?;
        if let Some(m) = mark {
            self.fresh.recorded(epoch, m);
        }
        self.health.bytes.summaries += n;
        self.write_who(epoch)?;
        if let Some(sp) = self.spool.as_mut() {
            sp.summary_published(epoch.as_str(), seq);
        }
        self.summaries.current.insert(epoch.to_string(), s);
        Ok(())
    }

    /// The summary index of this host's directory (FORMAT.md §7.1), reading every profile.
    /// A file that is not a valid profile (corrupt, or hostile: a FIFO, a link, a huge file)
    /// is set aside, so that the index matches the files that remain; `None` if a file could
    /// not be read for another reason (the index is then left out rather than wrong).
    ///
    /// Also `None` when a profile is of a newer format version (left untouched) or continued
    /// beside one (FORMAT.md §3.1): the index has one entry per (image, event) and stands for
    /// the file of its canonical name, so it would leave out the newer file's samples (for
    /// readers that can read it) or this daemon's; readers list the directory instead.
    pub(super) fn index_of(&mut self, hd: &HostDir) -> Option<profile_format::SummaryIndex> {
        let mut idx = profile_format::SummaryIndex::default();
        let mut complete = true;
        for entry in hd.profiles().ok()? {
            complete &= !entry.is_continuation();
            match publish::read_existing(&entry.path) {
                Ok(Some(p)) => idx.push(&p.header),
                // Removed meanwhile (retention, an administrator).
                Ok(None) => {}
                Err(publish::Existing::Corrupt(e)) if is_newer(&e, &entry.path) => {
                    complete = false;
                    self.note_newer(&entry.path, &e);
                }
                Err(publish::Existing::Corrupt(e)) => self.set_aside(&entry.path, &e),
                Err(publish::Existing::Io(_)) => return None,
            }
        }
        complete.then_some(idx)
    }

    /// `summary.json` of touched epochs and the kallsyms snapshot of the current epoch.
    pub(super) fn write_side_files(&mut self, now: Instant, force: bool) {
        if self.db.is_none() || self.check_lease().is_err() {
            return;
        }
        self.write_kallsyms();
        let mut epochs: Vec<String> = self.summaries.dirty.iter().cloned().collect();
        epochs.sort();
        for e in epochs {
            let recent = self
                .summaries
                .written_at
                .get(&e)
                .is_some_and(|t| now.saturating_duration_since(*t) < self.cfg.publish_interval);
            let other_epoch =
                Some(e.as_str()) != self.epoch.as_ref().map(profile_format::EpochId::as_str);
            if recent && !force && !other_epoch {
                continue;
            }
            let Ok(epoch) = EpochId::parse(&e) else {
                self.summaries.dirty.remove(&e);
                continue;
            };
            match self.write_summary(&epoch) {
                Ok(()) => {
                    self.summaries.dirty.remove(&e);
                    self.summaries.written_at.insert(e, now);
                }
                Err(err) => {
                    self.set_db_error(&err);
                    break;
                }
            }
        }
        // Summaries of finished epochs that are fully written are no longer needed in memory.
        let cur = self.epoch.as_ref().map(ToString::to_string);
        let schedule = &self.schedule;
        let dirty = &self.summaries.dirty;
        self.summaries
            .current
            .retain(|e, _| Some(e) == cur.as_ref() || dirty.contains(e) || schedule.has_epoch(e));
    }
}
