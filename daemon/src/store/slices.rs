//! Counts per time slice (FORMAT.md §14): each batch's flat profile counts are added, at the
//! time the batch arrives, into the open slice of its epoch (`slice_interval` long, aligned to
//! Unix time so that every host of a fleet cuts at the same instants); a slice that has ended
//! is closed and appended at the next tick, as one framed record, its offsets at
//! [`SLICE_RESOLUTION`] bytes, to its UTC hour's segment `<host dir>/slices.<hour>.log`
//! (FORMAT.md §14.5). An hour whose minutes are older than the roll-up age is merged into one
//! hour slice at [`ROLLUP_RESOLUTION`] bytes, appended to `slices.hours.log`, and its segment
//! removed: nothing live is rewritten.
//!
//! Exactly once: a slice's counts are appended by one `write` (a record is visible whole or
//! not at all, FORMAT.md §14.3) and dropped from memory only when that succeeded; a failed
//! append is cut back, so it is never half there, and retried. The counts do not go through
//! the spool: a kill -9 loses the open slice and the closed ones not yet appended (at most
//! one slice plus a flush interval) from the time axis, never from the epoch totals, and
//! never doubles one.
//!
//! Cost, measured on the busy mix of issue 36 (2 CPUs, compile + Python + exec churn, 1 kHz
//! per CPU): BENCHMARKS.md "Time slices".

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use profile_format::{EpochId, ImageId, SegmentWriter, Slice, SliceKey};

use super::pending::PendingBatch;
use super::{Store, StoreError};
use crate::sys;

/// Hour slices: what slices older than the roll-up age become.
pub const ROLLUP_SLICE: u64 = 3600;
/// Offset resolution (bytes) of the slices appended (FORMAT.md §14.2): 16, the alignment of
/// functions on x86-64 (LLVM's, the kernel's, gcc's -O2 when it costs at most 10 bytes of
/// padding), so that a per-symbol report over a time range is exact for aligned functions,
/// while the per-instruction detail stays in the epoch totals. Measured on the busy mix
/// (BENCHMARKS.md "Time slices"): it cuts a minute slice by a third to a half; most pairs of a
/// minute are counted once, so neither the previous minute nor zstd can do it.
pub const SLICE_RESOLUTION: u64 = 16;
/// Offset resolution (bytes) of the hour slices a roll-up makes: older than the roll-up age,
/// a time range is asked per image or per (large enough) function, not per instruction.
pub const ROLLUP_RESOLUTION: u64 = 256;
/// Pairs held in closed slices not yet appended (the database failing) before the oldest are
/// dropped: ~40 bytes each, 160 MB at most... kept well under `max_memory_mb`'s default.
const MAX_HELD_PAIRS: usize = 2_000_000;

/// The slice settings (`slice_interval`, `slice_rollup_after`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceSettings {
    /// Slice length; zero: no slices are kept.
    pub interval: Duration,
    /// Slices that ended longer ago than this are rolled up into hour slices.
    pub rollup_after: Duration,
}

impl Default for SliceSettings {
    fn default() -> Self {
        Self { interval: Duration::ZERO, rollup_after: Duration::from_secs(6 * 3600) }
    }
}

/// What publishing slices cost so far (tests, the storage benchmark's log line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SliceStats {
    /// Records appended and their bytes.
    pub records: u64,
    pub bytes: u64,
    /// Thread CPU time of closing, encoding, appending and rolling up (ns).
    pub cpu_ns: u64,
    /// Roll-ups done and the bytes they rewrote.
    pub rollups: u64,
    pub rollup_bytes: u64,
    /// Samples dropped from the time axis because their slices could not be appended for long.
    pub dropped_samples: u64,
}

/// The open slice of one epoch.
#[derive(Default)]
struct Open {
    start: u64,
    /// (event, image id text; empty for the event's unknown samples) → offset → count.
    counts: hashbrown::HashMap<(String, String), hashbrown::HashMap<u64, u64>>,
    pairs: usize,
    /// Arrival number of the last batch added (issue 36 item 6, [`super::fresh`]).
    last_arrival: u64,
}

#[derive(Default)]
pub(super) struct SliceAccum {
    settings: SliceSettings,
    open: BTreeMap<EpochId, Open>,
    /// Where the last closed slice of each epoch ended: a slice closed early (a flush, an
    /// epoch change) is continued from there, so that records never overlap.
    last_end: BTreeMap<EpochId, u64>,
    closed: VecDeque<(EpochId, Slice)>,
    /// (epoch, start) of each closed slice not yet appended: its last batch's arrival number.
    closed_last: BTreeMap<(EpochId, u64), u64>,
    closed_pairs: usize,
    writer: Option<(EpochId, SegmentWriter)>,
    /// Epochs whose log is of a newer format version (left alone) or that failed to open, and
    /// whether that was logged.
    refused: BTreeMap<EpochId, bool>,
    dropped_logged: bool,
    pub(super) stats: SliceStats,
}

fn unix_s(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl SliceAccum {
    /// The slice length in force (zero: slices off).
    pub(super) fn settings_interval(&self) -> Duration {
        self.settings.interval
    }

    fn interval_s(&self) -> u64 {
        self.settings.interval.as_secs()
    }

    /// Close `epoch`'s open slice at `end` (not before its start + 1 s).
    fn close(&mut self, epoch: &EpochId, end: u64) {
        let Some(o) = self.open.remove(epoch) else { return };
        if o.counts.is_empty() {
            return;
        }
        let end = end.max(o.start + 1);
        let mut counts = BTreeMap::new();
        for ((event, img), m) in o.counts {
            let image = if img.is_empty() {
                None
            } else {
                match ImageId::parse(&img) {
                    Ok(i) => Some(i),
                    // Never: the text came from an `ImageId`.
                    Err(_) => continue,
                }
            };
            let mut v: Vec<(u64, u64)> = m.into_iter().filter(|(_, c)| *c > 0).collect();
            v.sort_unstable();
            counts.insert(SliceKey { event, image }, v);
        }
        self.last_end.insert(epoch.clone(), end);
        self.closed_last.insert((epoch.clone(), o.start), o.last_arrival);
        self.closed_pairs += o.pairs;
        self.closed.push_back((
            epoch.clone(),
            Slice { start: o.start, len: end - o.start, seq: 0, counts },
        ));
        while self.closed_pairs > MAX_HELD_PAIRS && self.closed.len() > 1 {
            let Some((e, s)) = self.closed.pop_front() else { break };
            self.closed_last.remove(&(e, s.start));
            self.closed_pairs -= s.counts.values().map(Vec::len).sum::<usize>();
            self.stats.dropped_samples += s.samples();
            if !self.dropped_logged {
                tracing::warn!("store: time slices not written for long; dropping the oldest from the time axis (the epoch totals keep them)");
                self.dropped_logged = true;
            }
        }
    }
}

impl Store {
    /// Apply `slice_interval` and `slice_rollup_after` (at start and on reload). Turning
    /// slices off closes what is open; it is appended at the next tick.
    pub fn set_slices(&mut self, s: SliceSettings) {
        if s.interval != self.slices.settings.interval {
            let now = unix_s(SystemTime::now());
            let epochs: Vec<EpochId> = self.slices.open.keys().cloned().collect();
            for e in epochs {
                self.slices.close(&e, now);
            }
        }
        self.slices.settings = s;
    }

    /// What publishing slices cost so far.
    pub fn slice_stats(&self) -> SliceStats {
        self.slices.stats
    }

    /// Add a batch's flat profile counts into the open slice of its epoch, at wall time `at`.
    pub(super) fn slices_add(&mut self, b: &PendingBatch, at: SystemTime) {
        let iv = self.slices.interval_s();
        let Some(epoch) = b.epoch.clone().or_else(|| self.epoch.clone()) else { return };
        if iv == 0 || b.profiles.is_empty() {
            return;
        }
        let c0 = sys::time::thread_cpu_ns();
        // The names of its keys, for `fresh.json` (FORMAT.md §7.3): a lookup per profile.
        let names = match self.fresh.names.get_mut(&epoch) {
            Some(n) => n,
            None => self.fresh.names.entry(epoch.clone()).or_default(),
        };
        for p in &b.profiles {
            if let Some((id, img)) = &p.image {
                names.learn(&p.desc, id, img.kind, &img.path);
            }
        }
        let acc = &mut self.slices;
        let at = unix_s(at);
        // A batch for a slice that is already closed, or older than the open one, goes to
        // the newest: a batch cut at a boundary belongs to the slice that ends there, but a
        // tick that began just before the boundary may have closed that slice already (its
        // clock read after), and a tick held up past the next boundary on a loaded machine
        // may have opened the slice after it. Slices never overlap; a clock set back further
        // than a slice is handled below.
        let newest = acc.open.get(&epoch).map(|o| o.start).max(acc.last_end.get(&epoch).copied());
        let at = match newest {
            Some(n) if at < n && at + iv >= n => n,
            _ => at,
        };
        let aligned = at - at % iv;
        if let Some(o) = acc.open.get(&epoch) {
            let end = o.start - o.start % iv + iv;
            if at < o.start || at >= end {
                // Ended (or the clock went back): closed where it ends, at the latest.
                acc.close(&epoch, end.min(at.max(o.start + 1)));
            }
        }
        let resume = acc.last_end.get(&epoch).copied().filter(|e| *e > aligned && *e <= at);
        let o = acc
            .open
            .entry(epoch)
            .or_insert_with(|| Open { start: resume.unwrap_or(aligned), ..Default::default() });
        o.last_arrival = o.last_arrival.max(u64::from(b.arrival));
        for p in &b.profiles {
            let img = p.image.as_ref().map(|(id, _)| id.clone()).unwrap_or_default();
            let m = o.counts.entry((p.desc.name.clone(), img)).or_default();
            for &(off, c) in &p.counts {
                let e = m.entry(off).or_insert(0);
                if *e == 0 {
                    o.pairs += 1;
                }
                *e = e.saturating_add(c);
            }
        }
        acc.stats.cpu_ns += sys::time::thread_cpu_ns().saturating_sub(c0);
    }

    /// Close the slices that have ended (all open ones with `force`: a flush, a stop) or whose
    /// epoch is no longer current, append the closed ones, and roll up the current epoch's log
    /// when its oldest minutes are due. Called at every tick and full flush.
    pub(super) fn slices_step(&mut self, force: bool) {
        let c0 = sys::time::thread_cpu_ns();
        let now = unix_s(SystemTime::now());
        let iv = self.slices.interval_s();
        let current = self.epoch.clone();
        let due: Vec<(EpochId, u64)> = self
            .slices
            .open
            .iter()
            .filter_map(|(e, o)| {
                let end = if iv == 0 { now } else { o.start - o.start % iv + iv };
                if end <= now {
                    Some((e.clone(), end))
                } else if force || Some(e) != current.as_ref() {
                    Some((e.clone(), now))
                } else {
                    None
                }
            })
            .collect();
        for (e, end) in due {
            self.slices.close(&e, end);
        }
        if !self.slices.closed.is_empty() && self.db.is_some() && self.check_lease().is_ok() {
            let before = self.slices.stats;
            if let Err(e) = self.append_closed() {
                self.set_db_error(&e);
            }
            if let Err(e) = self.maybe_rollup(now) {
                self.set_db_error(&e);
            }
            let st = &self.slices.stats;
            // Once per slice: what publishing it cost (bench/slices.py reads these lines).
            tracing::debug!(
                records = st.records - before.records,
                bytes = st.bytes - before.bytes,
                total_records = st.records,
                total_bytes = st.bytes,
                total_cpu_ns = st.cpu_ns + sys::time::thread_cpu_ns().saturating_sub(c0),
                rollups = st.rollups,
                names_writes = self.fresh.names_writes,
                names_bytes = self.fresh.names_bytes,
                "store: time slices appended"
            );
        }
        // Forget where finished epochs' slices ended.
        let open = &self.slices.open;
        self.slices.last_end.retain(|e, _| Some(e) == current.as_ref() || open.contains_key(e));
        let closed = &self.slices.closed;
        self.fresh.names.retain(|e, _| {
            Some(e) == current.as_ref()
                || open.contains_key(e)
                || closed.iter().any(|(c, _)| c == e)
        });
        self.slices.stats.cpu_ns += sys::time::thread_cpu_ns().saturating_sub(c0);
    }

    fn append_closed(&mut self) -> Result<(), StoreError> {
        while let Some(epoch) = self.slices.closed.front().map(|(e, _)| e.clone()) {
            if !self.slices.refused.contains_key(&epoch) {
                match self.slice_writer(&epoch) {
                    Ok(_) => {}
                    Err(StoreError::Db(e @ profile_format::Error::UnknownVersion { .. })) => {
                        tracing::warn!(epoch = %epoch, error = %e,
                            "store: slice log of a newer format version left untouched; no time slices for this epoch from this daemon");
                        self.slices.refused.insert(epoch.clone(), true);
                    }
                    Err(e) => return Err(e),
                }
            }
            let acc = &mut self.slices;
            let Some((_, slice)) = acc.closed.front() else { break };
            if acc.refused.contains_key(&epoch) {
                acc.stats.dropped_samples += slice.samples();
                acc.closed_last.remove(&(epoch.clone(), slice.start));
            } else {
                if acc.writer.is_none() {
                    break;
                }
                // Names first: a reader that finds a key in the log finds its name (§7.3).
                self.write_fresh_names(&epoch)?;
                let acc = &mut self.slices;
                let Some((_, slice)) = acc.closed.front() else { break };
                let Some((_, w)) = &mut acc.writer else { break };
                let (n, rep) = w.append(slice)?;
                let (start, end) = (slice.start, slice.end());
                let aside = rep.and_then(|rep| {
                    let p = w.path_for(start);
                    log_open(&p, &rep);
                    rep.set_aside.map(|(_, why)| (p, why))
                });
                if let Some((p, why)) = aside {
                    self.note_set_aside(&p, &why);
                }
                let acc = &mut self.slices;
                acc.stats.records += 1;
                acc.stats.bytes += n;
                if let Some(last) = acc.closed_last.remove(&(epoch.clone(), start)) {
                    self.fresh.appended(&epoch, end, last);
                    // Its summary records the new freshness mark (FORMAT.md §7.3).
                    self.summaries.dirty.insert(epoch.to_string());
                }
            }
            let acc = &mut self.slices;
            if let Some((_, s)) = acc.closed.pop_front() {
                acc.closed_pairs =
                    acc.closed_pairs.saturating_sub(s.counts.values().map(Vec::len).sum());
            }
        }
        self.slices.dropped_logged = false;
        Ok(())
    }

    /// Before the front closed slice (of `epoch`) is appended: rewrite `fresh.json` (FORMAT.md
    /// §7.3) when the slice holds image keys that neither have a profile published by this
    /// daemon nor are named there yet. So it is written when new images appear (a few times
    /// an epoch), not at every slice, and holds only keys not yet published.
    fn write_fresh_names(&mut self, epoch: &EpochId) -> Result<(), StoreError> {
        let Some((_, slice)) = self.slices.closed.front() else { return Ok(()) };
        let ep = epoch.to_string();
        let schedule = &self.schedule;
        let unpublished = |event: &str, id: &str| {
            !schedule.was_published(&super::spool::SpoolKey {
                epoch: ep.clone(),
                image: Some(id.to_owned()),
                event: event.to_owned(),
            })
        };
        let names = self.fresh.names.entry(epoch.clone()).or_default();
        let new = slice.counts.keys().any(|k| {
            k.image.as_ref().is_some_and(|id| {
                let id = id.to_text();
                !names.is_written(&k.event, &id) && unpublished(&k.event, &id)
            })
        });
        if !new {
            return Ok(());
        }
        let hd = self.host_dir(epoch)?;
        let names = self.fresh.names.entry(epoch.clone()).or_default();
        if names.needs_resume() {
            // What an earlier run of this epoch named (unreadable: named again from now on).
            names.resume(hd.read_fresh_names().ok().flatten());
        }
        let schedule = &self.schedule;
        let unpublished = |event: &str, id: &str| {
            !schedule.was_published(&super::spool::SpoolKey {
                epoch: ep.clone(),
                image: Some(id.to_owned()),
                event: event.to_owned(),
            })
        };
        let idx = names.index(&unpublished);
        let n = hd.write_fresh_names(&idx)?;
        self.fresh.names_writes += 1;
        self.fresh.names_bytes += n;
        Ok(())
    }

    /// The writer of `epoch`'s log, (re)opened if it is another epoch's or its file is no
    /// longer the one at the path.
    fn slice_writer(&mut self, epoch: &EpochId) -> Result<&mut SegmentWriter, StoreError> {
        let keep = matches!(&self.slices.writer, Some((e, w)) if e == epoch && w.is_current());
        if !keep {
            self.slices.writer = None;
            let hd = self.host_dir(epoch)?;
            let (mut w, rep) = SegmentWriter::open(&hd)?;
            w.set_resolution(SLICE_RESOLUTION);
            for h in &rep.finished_rollups {
                tracing::info!(file = %hd.slice_segment_path(*h).display(),
                    "store: removed a minute segment already rolled up (a crash between a roll-up and its removal)");
            }
            if let Some(r) = &rep.hours {
                log_open(&hd.slice_hours_path(), r);
                if let Some((_, why)) = &r.set_aside {
                    self.note_set_aside(&hd.slice_hours_path(), why);
                }
            }
            self.slices.writer = Some((epoch.clone(), w));
        }
        match &mut self.slices.writer {
            Some((_, w)) => Ok(w),
            None => Err(StoreError::NoDatabase(self.cfg.db.clone())),
        }
    }

    /// Roll up the current epoch's minute segments whose whole hour ended more than
    /// `rollup_after` ago: each becomes one hour slice appended to the roll-up file, and the
    /// segment is removed (FORMAT.md §14.5), so a roll-up writes about one hour slice an hour.
    fn maybe_rollup(&mut self, now: u64) -> Result<(), StoreError> {
        let after = self.slices.settings.rollup_after.as_secs();
        let Some((_, w)) = &mut self.slices.writer else { return Ok(()) };
        let cutoff = now.saturating_sub(after);
        let due: Vec<u64> =
            w.segment_hours().iter().copied().filter(|h| h + ROLLUP_SLICE <= cutoff).collect();
        for h in due {
            match w.rollup(h, ROLLUP_RESOLUTION) {
                Ok(n) => {
                    self.slices.stats.rollups += 1;
                    self.slices.stats.rollup_bytes += n;
                    tracing::debug!(hour = h, bytes = n, "store: rolled up an hour of time slices");
                }
                // An unreadable segment was set aside (its minutes stay out of the time axis;
                // the epoch totals keep them): the next hours go on.
                Err(e @ profile_format::Error::Io { .. }) => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(hour = h, error = %e,
                        "store: unreadable minute segment set aside instead of rolled up");
                }
            }
        }
        Ok(())
    }
}

/// Log what opening a slice file found (FORMAT.md §14.3).
fn log_open(path: &std::path::Path, rep: &profile_format::OpenReport) {
    if let Some(v) = rep.upgraded_from {
        tracing::info!(file = %path.display(), from = v,
            "store: rewrote a slice log of an older format version in the current one");
    }
    if rep.truncated > 0 {
        tracing::info!(file = %path.display(), bytes = rep.truncated,
            "store: cut the torn tail of a slice log (a crash while appending)");
    }
    if let Some((to, why)) = &rep.set_aside {
        tracing::warn!(file = %path.display(), moved_to = %to.display(), error = %why,
            "store: unreadable slice log set aside; starting a new one");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profile_format::ImageKind;

    /// A store of host h1 in `dir`, as the daemon opens it.
    fn store_in(dir: &std::path::Path) -> Store {
        Store::open(super::super::StoreConfig {
            db: dir.join("db"),
            spool: dir.join("spool"),
            host: "h1".into(),
            flush_interval: Duration::from_secs(2),
            publish_interval: Duration::from_secs(60),
            publish_max_delay: Duration::from_secs(360),
            max_memory_bytes: 64 << 20,
            retention_days: 7,
            retention_keep: 3,
        })
    }

    fn cpu_clock() -> profile_format::EventDesc {
        profile_format::EventDesc {
            name: "cpu-clock".into(),
            perf_type: 1,
            perf_config: 0,
            period_mean: 1000,
            period_min: 1000,
            period_max: 1000,
        }
    }

    /// [`store_in`] with slices of `secs` seconds (minutes rolled up after 6 h), and its
    /// current epoch.
    fn store_with_slices(dir: &std::path::Path, secs: u64) -> (Store, EpochId) {
        let mut s = store_in(dir);
        let epoch = s.current_epoch().unwrap().clone();
        s.set_slices(SliceSettings {
            interval: Duration::from_secs(secs),
            rollup_after: Duration::from_secs(6 * 3600),
        });
        (s, epoch)
    }

    /// A batch of `epoch` holding three unknown cpu-clock samples.
    fn three_unknown(epoch: &EpochId) -> PendingBatch {
        PendingBatch {
            epoch: Some(epoch.clone()),
            profiles: vec![super::super::pending::PendingProfile {
                image: None,
                desc: cpu_clock(),
                counts: vec![(1, 3)],
                total_period: 3000,
            }],
            who_profiles: Vec::new(),
            samples: 3,
            unknown: 3,
            lost: 0,
            throttled: 0,
            bytes: 0,
            summarized: false,
            arrival: 0,
        }
    }

    fn minute(start: u64, off: u64) -> Slice {
        let key =
            SliceKey { event: "cpu-clock".into(), image: Some(ImageId::BuildId(vec![7; 20])) };
        Slice { start, len: 60, seq: 0, counts: [(key, vec![(off, 2)])].into_iter().collect() }
    }

    /// `fresh.json` (FORMAT.md §7.3): written before a slice with an image key that is
    /// neither published nor named yet is appended, naming every such key of the epoch; not
    /// rewritten for slices of keys already named; a published key is left out of the next one.
    #[test]
    fn fresh_json_names_new_images_before_their_slice_and_only_then() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store_in(dir.path());
        let epoch = s.current_epoch().unwrap().clone();
        let desc = cpu_clock();
        let id = |n: u8| ImageId::BuildId(vec![n; 20]);
        let slice = |start: u64, n: u8| {
            let key = SliceKey { event: "cpu-clock".into(), image: Some(id(n)) };
            Slice { start, len: 60, seq: 0, counts: [(key, vec![(0x10, 2)])].into_iter().collect() }
        };
        let learn = |s: &mut Store, n: u8| {
            let path = format!("/opt/app{n}");
            s.fresh.names.entry(epoch.clone()).or_default().learn(
                &desc,
                &id(n).to_text(),
                ImageKind::Elf,
                path.as_bytes(),
            );
        };
        let hd = s.host_dir(&epoch).unwrap();
        let named = || -> Vec<String> {
            let idx = hd.read_fresh_names().unwrap().unwrap_or_default();
            idx.images.iter().map(|t| t.path.clone()).collect()
        };
        learn(&mut s, 7);
        s.slices.closed.push_back((epoch.clone(), slice(600, 7)));
        s.append_closed().unwrap();
        assert_eq!((named(), s.fresh.names_writes), (vec!["/opt/app7".to_owned()], 1));
        // The same image again: no rewrite.
        s.slices.closed.push_back((epoch.clone(), slice(660, 7)));
        s.append_closed().unwrap();
        assert_eq!(s.fresh.names_writes, 1);
        // Image 7 is published, image 8 is new: the file names image 8 alone.
        let key = super::super::spool::SpoolKey {
            epoch: epoch.to_string(),
            image: Some(id(7).to_text()),
            event: "cpu-clock".into(),
        };
        s.schedule.done(key, std::time::Instant::now(), Some(4));
        learn(&mut s, 8);
        s.slices.closed.push_back((epoch.clone(), slice(720, 8)));
        s.append_closed().unwrap();
        assert_eq!((named(), s.fresh.names_writes), (vec!["/opt/app8".to_owned()], 2));
        assert_eq!(hd.read_slices().unwrap().unwrap().slices.len(), 3);
    }

    /// A batch cut at a boundary goes to the slice that ends there, unless a tick that began
    /// just before the boundary closed that slice already: then to the next one, never into a
    /// second slice over the same seconds.
    #[test]
    fn a_batch_for_a_closed_slice_goes_to_the_next_one() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, epoch) = store_with_slices(dir.path(), 60);
        let batch = || three_unknown(&epoch);
        let t = |secs: u64| UNIX_EPOCH + Duration::from_secs(secs);
        let b = 1_800_000_000; // a minute boundary
        s.slices_add(&batch(), t(b - 30));
        s.slices.close(&epoch, b);
        // The boundary's batch, after its slice was closed: the next slice.
        s.slices_add(&batch(), t(b - 1));
        s.slices.close(&epoch, b + 60);
        let starts: Vec<(u64, u64)> =
            s.slices.closed.iter().map(|(_, x)| (x.start, x.start + x.len)).collect();
        assert_eq!(starts, vec![(b - 60, b), (b, b + 60)]);
        // Unless closed, a boundary's batch goes to the slice that ends there.
        s.slices_add(&batch(), t(b + 90));
        s.slices_add(&batch(), t(b + 119));
        s.slices.close(&epoch, b + 120);
        let last = s.slices.closed.back().map(|(_, x)| (x.start, x.len, x.samples()));
        assert_eq!(last, Some((b + 60, 60, 6)));
    }

    /// A tick held up past a boundary opened the slice after it before the boundary's own
    /// batch arrived: that batch goes into the open slice, not into a slice before it (which
    /// closed the open one early and then overlapped the next: e2e
    /// `slices::slices_of_a_run_add_up_to_the_epoch_totals` saw it on a loaded CI machine).
    #[test]
    fn a_late_boundary_batch_never_opens_a_slice_before_the_open_one() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, epoch) = store_with_slices(dir.path(), 1);
        let batch = || three_unknown(&epoch);
        let t = |secs: u64| UNIX_EPOCH + Duration::from_secs(secs);
        let b = 1_800_000_000;
        // B-1 is open; a slow tick adds at B+1 (closing B-1 at B, opening B+1); the batch cut
        // at B+1's boundary arrives for B; the next tick adds at B+2.
        s.slices_add(&batch(), t(b - 1));
        s.slices_add(&batch(), t(b + 1));
        s.slices_add(&batch(), t(b));
        s.slices_add(&batch(), t(b + 2));
        s.slices.close(&epoch, b + 3);
        let spans: Vec<(u64, u64, u64)> =
            s.slices.closed.iter().map(|(_, x)| (x.start, x.start + x.len, x.samples())).collect();
        assert_eq!(spans, vec![(b - 1, b, 3), (b + 1, b + 2, 6), (b + 2, b + 3, 3)]);
    }

    /// The roll-up policy: nothing before a whole hour of minutes is older than
    /// `rollup_after`, then those hours become hour slices (one roll-up per hour, FORMAT.md
    /// §14.5); every sample stays.
    #[test]
    fn old_minutes_become_hours_once_a_whole_hour_is_due() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = store_in(dir.path());
        let epoch = s.current_epoch().unwrap().clone();
        let after = 6 * 3600;
        s.set_slices(SliceSettings {
            interval: Duration::from_secs(60),
            rollup_after: Duration::from_secs(after),
        });
        // Three hours of minutes from 10:00 (Unix time of day), as appended while running.
        let t0 = 10 * 3600;
        for m in 0..180 {
            s.slices.closed.push_back((epoch.clone(), minute(t0 + m * 60, m % 5)));
            s.slices.closed_pairs += 1;
        }
        s.append_closed().unwrap();
        let hd = s.host_dir(&epoch).unwrap();
        let read = || hd.read_slices().unwrap().unwrap();
        assert_eq!(read().slices.len(), 180);
        // 16:59: not even the first hour ended 6 h ago.
        s.maybe_rollup(t0 + after + 3599).unwrap();
        assert_eq!((read().slices.len(), s.slices.stats.rollups), (180, 0));
        // 17:00: 10:00-11:00 is due and becomes one slice.
        s.maybe_rollup(t0 + after + 3600).unwrap();
        let log = read();
        assert_eq!((log.slices.len(), s.slices.stats.rollups), (1 + 120, 1));
        assert_eq!((log.slices[0].start, log.slices[0].len), (t0, 3600));
        // 17:30: nothing new is due, no rewrite.
        s.maybe_rollup(t0 + after + 5400).unwrap();
        assert_eq!(s.slices.stats.rollups, 1);
        // 19:00: the other two hours.
        s.maybe_rollup(t0 + after + 3 * 3600).unwrap();
        let log = read();
        assert_eq!(log.slices.len(), 3);
        assert!(log.slices.iter().all(|x| x.len == 3600));
        assert_eq!(log.samples(), 180 * 2, "every sample kept");
        // Hours at the roll-up's resolution; the minutes were appended at the slices'.
        assert!(log.slices.iter().all(|x| log.resolution_of(x) == ROLLUP_RESOLUTION));
        // Appending goes on in the next hour's segment.
        s.slices.closed.push_back((epoch.clone(), minute(t0 + 4 * 3600, 1)));
        s.slices.closed_pairs += 1;
        s.append_closed().unwrap();
        assert_eq!(s.slices.closed_pairs, 0);
        let log = read();
        assert_eq!(log.slices.len(), 4);
        assert_eq!(log.resolution_of(&log.slices[3]), SLICE_RESOLUTION);
    }
}
