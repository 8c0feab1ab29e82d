//! From resolved batches to the shared profile database, without losing or doubling samples.
//!
//! Path of a sample count:
//! 1. `add()` converts a [`Resolved`] batch into per-profile increments held in memory
//!    (bounded by `max_memory_bytes`: past it the oldest batches are dropped and counted).
//! 2. Every flush interval `tick()` appends the held increments to the host-local spool
//!    ([`spool::Spool`], SQLite) in one transaction: from then on a kill -9 loses nothing.
//! 3. `tick()` also publishes a few changed profiles whose turn has come (each profile at most
//!    once per publish interval, turns spread over the interval): read the existing file of our
//!    own host directory, merge the spool rows whose sequence number is above the file's
//!    `header.sequence`, write atomically with `sequence` = the highest merged row, then delete
//!    those rows. A crash between the rename and the delete is harmless: on restart the rows
//!    are found with `seq <= sequence` and skipped. Each increment is published exactly once.
//!
//! Failures of the database (disk full, read-only, NFS server gone) are logged once, shown in
//! the status, and retried every tick; the spool keeps the data meanwhile. If the spool itself
//! fails, data stays in memory up to the bound. A corrupt profile file is renamed aside to
//! `*.corrupt` and replaced by a fresh one.
//!
//! Epochs: every row carries the epoch it was collected in. Each tick checks the database's
//! current epoch; when another host (or `dcpictl epoch new`) started a new one, everything of
//! the old epoch is published first, then new data goes to the new epoch.

pub mod spool;

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use profile_format::{
    write_atomic, Database, EpochId, EventDesc, EventSummary, HostDir, HostSummary, ImageId,
    ImageKind, KallsymsSnapshot, Profile, ProfileHeader,
};

use crate::aggregate::Resolved;
use spool::{Increment, Spool, SpoolError, SpoolImage, SpoolKey};

/// Errors of store operations; the daemon logs them and carries on.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Spool(#[from] SpoolError),
    #[error("database: {0}")]
    Db(#[from] profile_format::Error),
    #[error("database {0} is not available yet")]
    NoDatabase(PathBuf),
    #[error("spool {0} is not available")]
    NoSpool(PathBuf),
    #[error("{0} increments could not be written yet (disk failing)")]
    Unwritten(usize),
    /// Test hook: simulated crash between a profile's rename and its spool delete.
    #[error("injected crash after writing {0}")]
    InjectedCrash(PathBuf),
}

/// Settings of the store.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    pub db: PathBuf,
    pub spool: PathBuf,
    pub host: String,
    pub flush_interval: Duration,
    pub publish_interval: Duration,
    /// Bound on increments held in memory while they cannot be written to the spool.
    pub max_memory_bytes: u64,
    pub retention_days: u32,
    pub retention_keep: usize,
}

/// A configured event as the store records it (index = `EventIdx`).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct EventInfo {
    pub desc: EventDesc,
    /// `hardware`, `software` or `fallback`.
    pub source: String,
}

pub use dcpi_proto::status::{OpStat, StoreStatus};

struct PendingProfile {
    /// `None` = the event's unknown profile.
    image: Option<(String, SpoolImage)>,
    desc: EventDesc,
    counts: Vec<(u64, u64, u64)>,
}

struct PendingBatch {
    epoch: Option<EpochId>,
    profiles: Vec<PendingProfile>,
    samples: u64,
    unknown: u64,
    lost: u64,
    throttled: u64,
    bytes: u64,
}

#[derive(Clone, Copy, Debug)]
struct Dirty {
    due: Instant,
}

/// The store. Not thread-safe by itself: the service keeps it behind a mutex.
pub struct Store {
    cfg: StoreConfig,
    db: Option<Database>,
    spool: Option<Spool>,
    epoch: Option<EpochId>,
    events: Vec<EventInfo>,
    kernel_release: String,
    cpus: Vec<u32>,
    /// The encoded `kallsyms.snap`: a fraction of the decoded snapshot's memory.
    kallsyms: Option<Vec<u8>>,
    kallsyms_written: Option<EpochId>,
    pending: VecDeque<PendingBatch>,
    pending_bytes: u64,
    dropped_samples: u64,
    dropped_batches: u64,
    /// Dropped samples not yet added to an epoch summary's `lost`.
    dropped_unreported: u64,
    /// Per event index: counter enabled/running time (ns) not yet in a spooled summary. Reports
    /// scale counts by enabled/running when the kernel multiplexed the counters.
    event_times: Vec<(u64, u64)>,
    dirty: BTreeMap<SpoolKey, Dirty>,
    last_published: HashMap<SpoolKey, Instant>,
    summaries: HashMap<String, HostSummary>,
    summary_dirty: HashSet<String>,
    summary_written_at: HashMap<String, Instant>,
    created_dirs: HashSet<PathBuf>,
    db_error: Option<String>,
    spool_error: Option<String>,
    last_flush: Option<OpStat>,
    last_publish: Option<OpStat>,
    published_files: u64,
    corrupt_files: u64,
    backlog: (u64, u64),
    last_retention: Option<Instant>,
    unknown_event_logged: bool,
    crash_after_writes: Option<u32>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("cfg", &self.cfg).field("epoch", &self.epoch).finish()
    }
}

/// Identity and path of the per-event unknown profile.
fn unknown_image() -> (ImageId, Vec<u8>) {
    (ImageId::special("[unknown]", b""), b"[unknown]".to_vec())
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Store {
    /// Open the database (creating it and its first epoch if needed) and the spool. Never
    /// fails: what cannot be opened now is retried on every tick, and reported in the status.
    pub fn open(cfg: StoreConfig) -> Store {
        let mut s = Store {
            cfg,
            db: None,
            spool: None,
            epoch: None,
            events: Vec::new(),
            kernel_release: String::new(),
            cpus: Vec::new(),
            kallsyms: None,
            kallsyms_written: None,
            pending: VecDeque::new(),
            pending_bytes: 0,
            dropped_samples: 0,
            dropped_batches: 0,
            dropped_unreported: 0,
            event_times: Vec::new(),
            dirty: BTreeMap::new(),
            last_published: HashMap::new(),
            summaries: HashMap::new(),
            summary_dirty: HashSet::new(),
            summary_written_at: HashMap::new(),
            created_dirs: HashSet::new(),
            db_error: None,
            spool_error: None,
            last_flush: None,
            last_publish: None,
            published_files: 0,
            corrupt_files: 0,
            backlog: (0, 0),
            last_retention: None,
            unknown_event_logged: false,
            crash_after_writes: None,
        };
        s.ensure_open(Instant::now());
        s
    }

    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// Apply the settings that may change while running (on reload). A changed retention is
    /// applied at the next tick instead of within the hour.
    pub fn reconfigure(
        &mut self,
        flush_interval: Duration,
        publish_interval: Duration,
        max_memory_bytes: u64,
        retention_days: u32,
        retention_keep: usize,
    ) {
        let c = &mut self.cfg;
        if c.retention_days != retention_days || c.retention_keep != retention_keep {
            self.last_retention = None;
        }
        c.flush_interval = flush_interval;
        c.publish_interval = publish_interval;
        c.max_memory_bytes = max_memory_bytes;
        c.retention_days = retention_days;
        c.retention_keep = retention_keep;
    }

    /// Check at start that this host can write into the database: create it (and the first
    /// epoch) if needed, this host's directory of the current epoch, and a small file there.
    /// The daemon refuses to start on a database it can never write (wrong path, permissions,
    /// read-only); failures that may pass (disk full, NFS server down) are only reported.
    pub fn check_db_writable(db: &Path, host: &str) -> Result<(), StoreError> {
        let db = Database::create(db)?;
        let epoch = match db.current_epoch()? {
            Some(e) => e,
            None => db.new_epoch(SystemTime::now(), host)?,
        };
        let hd = db.host_dir(&epoch, host)?;
        hd.create()?;
        let probe = hd.path.join(format!(".dcpid-write-check-{}", std::process::id()));
        let io = |e| StoreError::Db(profile_format::Error::Io { path: probe.clone(), source: e });
        std::fs::write(&probe, b"dcpid\n").map_err(io)?;
        std::fs::remove_file(&probe).map_err(io)?;
        Ok(())
    }

    /// The events, indexed by `EventIdx`, as the sampler opened them.
    pub fn set_events(&mut self, events: Vec<EventInfo>) {
        self.events = events;
    }

    /// Add counter enabled/running time deltas (ns, summed over CPUs) per event index; they go
    /// into the current epoch's summary with the next spooled batch.
    pub fn add_event_times(&mut self, deltas: &[(u64, u64)]) {
        if self.event_times.len() < deltas.len() {
            self.event_times.resize(deltas.len(), (0, 0));
        }
        for (acc, d) in self.event_times.iter_mut().zip(deltas) {
            acc.0 = acc.0.saturating_add(d.0);
            acc.1 = acc.1.saturating_add(d.1);
        }
    }

    /// Facts recorded in each epoch's `summary.json`.
    pub fn set_host_info(&mut self, kernel_release: String, cpus: Vec<u32>) {
        self.kernel_release = kernel_release;
        self.cpus = cpus;
    }

    /// The kernel symbol snapshot, written once into each epoch's host directory.
    pub fn set_kallsyms(&mut self, snap: KallsymsSnapshot) {
        match snap.to_file_bytes(Path::new("kallsyms.snap")) {
            Ok(mut b) => {
                b.shrink_to_fit();
                self.kallsyms = Some(b);
            }
            Err(e) => {
                tracing::warn!(error = %e, "kallsyms snapshot not kept; kernel samples will not be symbolized");
                self.kallsyms = None;
            }
        }
        self.kallsyms_written = None;
    }

    pub fn current_epoch(&self) -> Option<&EpochId> {
        self.epoch.as_ref()
    }

    /// Test hook: make the n-th following profile write fail right after its rename (before
    /// the spool rows are deleted), as a crash there would.
    #[doc(hidden)]
    pub fn inject_crash_after_write(&mut self, n: u32) {
        self.crash_after_writes = Some(n);
    }

    /// Take a resolved batch (plus the sampler's lost/throttled counts since the previous
    /// batch) into memory; written to the spool by the next `tick`.
    pub fn add(&mut self, resolved: Resolved, lost: u64, throttled: u64) {
        let mut profiles = Vec::with_capacity(resolved.profiles.len() + 1);
        let mut bytes = 64u64;
        for ((image_id, ev), rp) in resolved.profiles {
            let Some(info) = self.events.get(usize::from(ev)) else {
                if !self.unknown_event_logged {
                    tracing::error!(
                        event = ev,
                        "store: batch names an event index that is not configured; dropped"
                    );
                    self.unknown_event_logged = true;
                }
                continue;
            };
            let counts: Vec<(u64, u64, u64)> = rp
                .counts
                .iter()
                .filter(|(_, (c, _))| *c > 0)
                .map(|(o, (c, p))| (*o, *c, *p))
                .collect();
            if counts.is_empty() {
                continue;
            }
            bytes += 160 + rp.image.path.len() as u64 + 48 * counts.len() as u64;
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
            });
        }
        let mut unknown_by_event: BTreeMap<u16, Vec<(u64, u64, u64)>> = BTreeMap::new();
        let mut unknown = 0;
        for ((ev, reason), (c, p)) in resolved.unknown {
            if c == 0 || usize::from(ev) >= self.events.len() {
                continue;
            }
            unknown += c;
            unknown_by_event.entry(ev).or_default().push((reason as u64, c, p));
        }
        for (ev, mut counts) in unknown_by_event {
            counts.sort_unstable();
            bytes += 160 + 48 * counts.len() as u64;
            profiles.push(PendingProfile {
                image: None,
                desc: self.events[usize::from(ev)].desc.clone(),
                counts,
            });
        }
        if profiles.is_empty() && resolved.samples == 0 && lost == 0 && throttled == 0 {
            return;
        }
        self.pending_bytes += bytes;
        self.pending.push_back(PendingBatch {
            epoch: self.epoch.clone(),
            profiles,
            samples: resolved.samples,
            unknown,
            lost,
            throttled,
            bytes,
        });
        // Past the bound, drop the oldest: they would be the first written, but the newest
        // data is what the user is looking at.
        while self.pending_bytes > self.cfg.max_memory_bytes {
            let Some(old) = self.pending.pop_front() else { break };
            self.pending_bytes -= old.bytes;
            let n: u64 = old.profiles.iter().flat_map(|p| p.counts.iter()).map(|c| c.1).sum();
            if self.dropped_batches == 0 {
                tracing::error!(
                    max_memory_bytes = self.cfg.max_memory_bytes,
                    "store: memory bound reached while the spool cannot be written; dropping the oldest samples (counted as lost)"
                );
            }
            self.dropped_samples += n;
            self.dropped_unreported += n;
            self.dropped_batches += 1;
        }
    }

    /// The periodic work: write held increments to the spool, follow epoch changes, publish
    /// the profiles whose turn has come, write summary and kallsyms files, apply retention.
    pub fn tick(&mut self) {
        self.tick_at(Instant::now());
    }

    /// [`Store::tick`] with an explicit clock (tests simulate the passing of time).
    pub fn tick_at(&mut self, now: Instant) {
        let t1 = self.spool_step(now);
        let published = self.publish_due(now, false);
        self.write_side_files(now, false);
        if published > 0 {
            self.last_publish = Some(OpStat {
                unix_ms: unix_ms(SystemTime::now()),
                duration_ms: t1.elapsed().as_secs_f64() * 1e3,
                items: published as u64,
            });
        }
        self.maybe_retention(now);
        self.refresh_backlog();
    }

    /// The first half of a tick or a full flush: reopen what failed, follow the current
    /// epoch, write held increments to the spool. Returns when it ended (publishing is timed
    /// from there).
    fn spool_step(&mut self, now: Instant) -> Instant {
        let t0 = Instant::now();
        self.ensure_open(now);
        self.follow_epoch(now);
        let spooled = self.spool_pending(now);
        self.last_flush = Some(OpStat {
            unix_ms: unix_ms(SystemTime::now()),
            duration_ms: t0.elapsed().as_secs_f64() * 1e3,
            items: spooled as u64,
        });
        Instant::now()
    }

    /// Write everything held to the spool and publish every changed profile now (`dcpictl
    /// flush`, shutdown, end of an epoch). Errors if something could not be written.
    pub fn flush_everything(&mut self) -> Result<(), StoreError> {
        let now = Instant::now();
        let t1 = self.spool_step(now);
        let result = self.publish_all(now, None);
        self.write_side_files(now, true);
        self.last_publish = Some(OpStat {
            unix_ms: unix_ms(SystemTime::now()),
            duration_ms: t1.elapsed().as_secs_f64() * 1e3,
            items: self.published_files,
        });
        self.refresh_backlog();
        result?;
        if !self.pending.is_empty() {
            return Err(StoreError::Unwritten(self.pending.len()));
        }
        if let Some(e) = &self.db_error {
            return Err(StoreError::Db(profile_format::Error::Invalid {
                what: "database",
                value: self.cfg.db.display().to_string(),
                detail: e.clone(),
            }));
        }
        Ok(())
    }

    /// Close the current epoch with everything flushed into it and start a new one.
    pub fn new_epoch(&mut self) -> Result<EpochId, StoreError> {
        self.flush_everything()?;
        let db = self.db.as_ref().ok_or_else(|| StoreError::NoDatabase(self.cfg.db.clone()))?;
        let e = db.new_epoch(SystemTime::now(), &self.cfg.host)?;
        tracing::info!(epoch = %e, "store: started a new epoch");
        self.epoch = Some(e.clone());
        self.write_side_files(Instant::now(), true);
        Ok(e)
    }

    /// Apply retention now: remove this host's directories of epochs older than
    /// `retention_days`, always keeping the newest `retention_keep` epochs and the current one.
    /// Returns the epochs this host's directory was removed from.
    pub fn apply_retention(&mut self, now: SystemTime) -> Result<Vec<EpochId>, StoreError> {
        let db = self.db.as_ref().ok_or_else(|| StoreError::NoDatabase(self.cfg.db.clone()))?;
        let epochs = db.epochs()?;
        let keep_from = epochs.len().saturating_sub(self.cfg.retention_keep);
        let max_age = Duration::from_secs(u64::from(self.cfg.retention_days) * 86400);
        let mut removed = Vec::new();
        for (i, e) in epochs.iter().enumerate() {
            if i >= keep_from || Some(e) == self.epoch.as_ref() {
                continue;
            }
            let old = now.duration_since(e.start_time()).map(|age| age > max_age).unwrap_or(false);
            if !old || !db.hosts(e)?.iter().any(|h| h == &self.cfg.host) {
                continue;
            }
            db.remove_host_epoch(e, &self.cfg.host)?;
            tracing::info!(epoch = %e, "store: retention removed this host's directory");
            if let Some(sp) = self.spool.as_mut() {
                sp.delete_epoch(e.as_str())?;
            }
            self.dirty.retain(|k, _| k.epoch != e.as_str());
            self.summaries.remove(e.as_str());
            self.summary_dirty.remove(e.as_str());
            removed.push(e.clone());
        }
        Ok(removed)
    }

    /// A snapshot for `dcpictl status`.
    pub fn status(&self) -> StoreStatus {
        StoreStatus {
            epoch: self.epoch.as_ref().map(|e| e.to_string()),
            last_flush: self.last_flush.clone(),
            last_publish: self.last_publish.clone(),
            spool_rows: self.backlog.0,
            spool_bytes: self.backlog.1,
            dirty_profiles: self.dirty.len() as u64,
            pending_batches: self.pending.len() as u64,
            pending_bytes: self.pending_bytes,
            max_memory_bytes: self.cfg.max_memory_bytes,
            dropped_samples: self.dropped_samples,
            dropped_batches: self.dropped_batches,
            published_files: self.published_files,
            corrupt_files_set_aside: self.corrupt_files,
            db_error: self.db_error.clone(),
            spool_error: self.spool_error.clone(),
        }
    }

    // ---- internals ----

    fn set_db_error(&mut self, e: &dyn std::fmt::Display) {
        let msg = e.to_string();
        if self.db_error.is_none() {
            tracing::error!(db = %self.cfg.db.display(), error = %msg,
                "store: cannot write the profile database; keeping data in the spool and retrying every flush");
        }
        self.db_error = Some(msg);
        self.created_dirs.clear();
    }

    fn clear_db_error(&mut self) {
        if self.db_error.take().is_some() {
            tracing::info!(db = %self.cfg.db.display(), "store: profile database writable again");
        }
    }

    fn set_spool_error(&mut self, e: &dyn std::fmt::Display) {
        let msg = e.to_string();
        if self.spool_error.is_none() {
            tracing::error!(spool = %self.cfg.spool.display(), error = %msg,
                "store: cannot write the spool; holding data in memory (bounded) and retrying every flush");
        }
        self.spool_error = Some(msg);
    }

    fn clear_spool_error(&mut self) {
        if self.spool_error.take().is_some() {
            tracing::info!(spool = %self.cfg.spool.display(), "store: spool writable again");
        }
    }

    fn ensure_open(&mut self, now: Instant) {
        if self.db.is_none() {
            match Database::create(&self.cfg.db) {
                Ok(db) => self.db = Some(db),
                Err(e) => self.set_db_error(&e),
            }
        }
        if self.epoch.is_none() {
            if let Some(db) = &self.db {
                let r = match db.current_epoch() {
                    Ok(Some(e)) => Ok(e),
                    Ok(None) => db.new_epoch(SystemTime::now(), &self.cfg.host),
                    Err(e) => Err(e),
                };
                match r {
                    Ok(e) => {
                        tracing::info!(epoch = %e, "store: current epoch");
                        self.epoch = Some(e);
                    }
                    Err(e) => self.set_db_error(&e),
                }
            }
        }
        if self.spool.is_none() {
            match Spool::open(&self.cfg.spool).and_then(|s| s.dirty_keys().map(|k| (s, k))) {
                Ok((s, keys)) => {
                    self.spool = Some(s);
                    self.clear_spool_error();
                    if !keys.is_empty() {
                        tracing::info!(
                            profiles = keys.len(),
                            "store: spool holds unpublished increments from a previous run"
                        );
                    }
                    for (k, _) in keys {
                        self.mark_dirty(k, now);
                    }
                    self.refresh_backlog();
                }
                Err(e) => self.set_spool_error(&e),
            }
        }
    }

    fn refresh_backlog(&mut self) {
        if let Some(sp) = &self.spool {
            if let Ok(b) = sp.backlog() {
                self.backlog = b;
            }
        }
    }

    /// Follow a new epoch started elsewhere: everything collected so far belongs to the old one.
    fn follow_epoch(&mut self, now: Instant) {
        let Some(db) = &self.db else { return };
        let newest = match db.current_epoch() {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                self.set_db_error(&e);
                return;
            }
        };
        let Some(old) = self.epoch.clone() else {
            self.epoch = Some(newest);
            return;
        };
        if newest == old {
            return;
        }
        self.spool_pending(now);
        if let Err(e) = self.publish_all(now, Some(old.as_str())) {
            tracing::warn!(error = %e, epoch = %old, "store: could not publish all of the closing epoch yet; will retry");
        }
        self.write_side_files(now, true);
        tracing::info!(old = %old, new = %newest, "store: following a new epoch");
        self.epoch = Some(newest);
    }

    fn mark_dirty(&mut self, key: SpoolKey, now: Instant) {
        if self.dirty.contains_key(&key) {
            return;
        }
        let pi = self.cfg.publish_interval;
        let due = match self.last_published.get(&key) {
            Some(t) => (*t + pi).max(now),
            None => {
                // A stable per-profile phase spreads first publications over the interval.
                let mut h = std::collections::hash_map::DefaultHasher::new();
                key.hash(&mut h);
                let ms = pi.as_millis().max(1) as u64;
                now + Duration::from_millis(h.finish() % ms)
            }
        };
        self.dirty.insert(key, Dirty { due });
    }

    fn summary_for(&mut self, epoch: &EpochId) -> HostSummary {
        if let Some(s) = self.summaries.get(epoch.as_str()) {
            return s.clone();
        }
        let from_spool =
            self.spool.as_ref().and_then(|sp| sp.summary(epoch.as_str()).ok().flatten());
        let s = from_spool
            .or_else(|| {
                // The spool was lost or is new: continue the counts of a summary already
                // published for this epoch.
                let db = self.db.as_ref()?;
                let hd = db.host_dir(epoch, &self.cfg.host).ok()?;
                HostSummary::read(&hd.summary_path()).ok()
            })
            .unwrap_or_else(|| HostSummary {
                format_version: 1,
                host: self.cfg.host.clone(),
                epoch: epoch.to_string(),
                ..HostSummary::default()
            });
        self.summaries.insert(epoch.to_string(), s.clone());
        s
    }

    /// Append held batches to the spool, oldest first. Returns the increments written.
    fn spool_pending(&mut self, now: Instant) -> usize {
        let mut written = 0;
        while self.spool.is_some() {
            let Some(batch) = self.pending.pop_front() else { break };
            let Some(epoch) = batch.epoch.clone().or_else(|| self.epoch.clone()) else {
                self.pending.push_front(batch);
                break;
            };
            let mut summary = self.summary_for(&epoch);
            summary.samples += batch.samples;
            summary.unknown += batch.unknown;
            summary.lost += batch.lost + self.dropped_unreported;
            summary.throttled += batch.throttled;
            for p in &batch.profiles {
                let (n, period) = p
                    .counts
                    .iter()
                    .fold((0u64, 0u64), |(n, s), c| (n + c.1, s.saturating_add(c.2)));
                let pos = summary
                    .events
                    .iter()
                    .position(|e| e.desc.as_ref().map(|d| &d.name) == Some(&p.desc.name));
                let i = match pos {
                    Some(i) => i,
                    None => {
                        summary.events.push(EventSummary {
                            desc: Some(p.desc.clone()),
                            ..EventSummary::default()
                        });
                        summary.events.len() - 1
                    }
                };
                summary.events[i].samples += n;
                summary.events[i].total_period =
                    summary.events[i].total_period.saturating_add(period);
            }
            for (i, (en, run)) in self.event_times.iter().enumerate() {
                let Some(info) = self.events.get(i) else { continue };
                let pos = summary
                    .events
                    .iter()
                    .position(|e| e.desc.as_ref().map(|d| &d.name) == Some(&info.desc.name));
                let j = match pos {
                    Some(j) => j,
                    None => {
                        summary.events.push(EventSummary {
                            desc: Some(info.desc.clone()),
                            source: info.source.clone(),
                            ..EventSummary::default()
                        });
                        summary.events.len() - 1
                    }
                };
                summary.events[j].time_enabled_ns =
                    summary.events[j].time_enabled_ns.saturating_add(*en);
                summary.events[j].time_running_ns =
                    summary.events[j].time_running_ns.saturating_add(*run);
            }
            let incs: Vec<Increment<'_>> = batch
                .profiles
                .iter()
                .map(|p| Increment {
                    image: p.image.as_ref().map(|(id, img)| (id.clone(), img)),
                    desc: &p.desc,
                    counts: &p.counts,
                })
                .collect();
            let Some(sp) = self.spool.as_mut() else { break };
            let result = sp.append(epoch.as_str(), &incs, &summary);
            let n_incs = incs.len();
            drop(incs);
            match result {
                Ok(_) => {
                    written += n_incs;
                    self.dropped_unreported = 0;
                    self.event_times.iter_mut().for_each(|t| *t = (0, 0));
                    self.pending_bytes -= batch.bytes;
                    self.summaries.insert(epoch.to_string(), summary);
                    self.summary_dirty.insert(epoch.to_string());
                    for p in batch.profiles {
                        let key = SpoolKey {
                            epoch: epoch.to_string(),
                            image: p.image.map(|(id, _)| id),
                            event: p.desc.name,
                        };
                        self.mark_dirty(key, now);
                    }
                    self.clear_spool_error();
                }
                Err(e) => {
                    self.pending.push_front(batch);
                    self.set_spool_error(&e);
                    break;
                }
            }
        }
        written
    }

    /// Publish the profiles whose turn has come, oldest turn first, a bounded number per tick
    /// so that writes are spread over the publish interval.
    fn publish_due(&mut self, now: Instant, _force: bool) -> usize {
        let mut due: Vec<(Instant, SpoolKey)> = self
            .dirty
            .iter()
            .filter(|(_, d)| d.due <= now)
            .map(|(k, d)| (d.due, k.clone()))
            .collect();
        if due.is_empty() {
            return 0;
        }
        due.sort();
        let ticks = (self.cfg.publish_interval.as_secs_f64()
            / self.cfg.flush_interval.as_secs_f64())
        .max(1.0);
        let cap = ((2.0 * self.dirty.len() as f64 / ticks).ceil() as usize).max(8);
        let mut n = 0;
        for (_, key) in due.into_iter().take(cap) {
            match self.publish_key(&key) {
                Ok(()) => {
                    n += 1;
                    self.dirty.remove(&key);
                    self.last_published.insert(key, now);
                    self.clear_db_error();
                }
                Err(e) => {
                    self.note_publish_error(&e);
                    break;
                }
            }
        }
        n
    }

    fn note_publish_error(&mut self, e: &StoreError) {
        match e {
            StoreError::Spool(se) => self.set_spool_error(se),
            other => self.set_db_error(other),
        }
    }

    /// Publish every dirty profile (of `epoch`, or all).
    fn publish_all(&mut self, now: Instant, epoch: Option<&str>) -> Result<(), StoreError> {
        let mut keys: Vec<(Instant, SpoolKey)> = self
            .dirty
            .iter()
            .filter(|(k, _)| epoch.is_none_or(|e| k.epoch == e))
            .map(|(k, d)| (d.due, k.clone()))
            .collect();
        keys.sort();
        for (_, key) in keys {
            match self.publish_key(&key) {
                Ok(()) => {
                    self.dirty.remove(&key);
                    self.last_published.insert(key, now);
                    self.clear_db_error();
                }
                Err(e) => {
                    self.note_publish_error(&e);
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    fn host_dir(&mut self, epoch: &EpochId) -> Result<HostDir, StoreError> {
        let db = self.db.as_ref().ok_or_else(|| StoreError::NoDatabase(self.cfg.db.clone()))?;
        let hd = db.host_dir(epoch, &self.cfg.host)?;
        if !self.created_dirs.contains(&hd.path) {
            hd.create()?;
            self.created_dirs.insert(hd.path.clone());
        }
        Ok(hd)
    }

    /// Merge one profile's spool rows into its file, exactly once.
    fn publish_key(&mut self, key: &SpoolKey) -> Result<(), StoreError> {
        let spool =
            self.spool.as_ref().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
        let rows = spool.rows(key)?;
        let Some(last_seq) = rows.last().map(|r| r.seq) else { return Ok(()) };
        let epoch = match EpochId::parse(&key.epoch) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(epoch = key.epoch, error = %e, "store: spool rows name an invalid epoch; discarded");
                if let Some(sp) = self.spool.as_mut() {
                    sp.delete_upto(key, last_seq)?;
                }
                return Ok(());
            }
        };
        let (image_id, kind, image_path, jit) = match &key.image {
            None => {
                let (id, path) = unknown_image();
                (id, ImageKind::Unknown, path, Vec::new())
            }
            Some(text) => {
                let id = match ImageId::parse(text) {
                    Ok(id) => id,
                    Err(e) => {
                        tracing::error!(image = text, error = %e, "store: spool rows name an invalid image id; discarded");
                        if let Some(sp) = self.spool.as_mut() {
                            sp.delete_upto(key, last_seq)?;
                        }
                        return Ok(());
                    }
                };
                let img = spool.image(text)?.unwrap_or(SpoolImage {
                    kind: ImageKind::Elf,
                    path: Vec::new(),
                    jit: Vec::new(),
                });
                (id, img.kind, img.path, img.jit)
            }
        };
        let hd = self.host_dir(&epoch)?;
        let path = match &key.image {
            None => hd.unknown_path(&key.event),
            Some(_) => hd.profile_path(&image_id, &key.event),
        };
        let existing = match Profile::read(&path) {
            Ok(p) => Some(p),
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
        };
        let published_seq = existing.as_ref().map(|p| p.header.sequence).unwrap_or(0);
        let mut merged: Option<Profile> = existing;
        let mut changed = false;
        for row in rows.iter().filter(|r| r.seq > published_seq) {
            let mut delta = Profile::new(ProfileHeader {
                kind,
                image_id: image_id.clone(),
                image_path: image_path.clone(),
                event: row.desc.clone(),
                host: self.cfg.host.clone(),
                epoch: epoch.clone(),
                total_samples: 0,
                total_period: 0,
                sequence: row.seq,
                jit_symbols: jit.clone(),
            });
            let spool =
                self.spool.as_ref().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
            for (off, c, p) in spool.counts(row)? {
                delta.add(off, c, p);
            }
            merged = Some(match merged.take() {
                None => delta,
                Some(mut m) => match m.merge(&delta) {
                    Ok(()) => m,
                    Err(e) => {
                        // The file describes another image or event than its name says.
                        self.set_aside(&path, &e);
                        delta
                    }
                },
            });
            changed = true;
        }
        if changed {
            if let Some(mut m) = merged {
                m.header.sequence = m.header.sequence.max(last_seq);
                m.write(&path)?;
                self.published_files += 1;
                self.summary_dirty.insert(key.epoch.clone()); // its index changed
                if let Some(n) = self.crash_after_writes.as_mut() {
                    if *n <= 1 {
                        self.crash_after_writes = None;
                        return Err(StoreError::InjectedCrash(path));
                    }
                    *n -= 1;
                }
            }
        }
        if let Some(sp) = self.spool.as_mut() {
            sp.delete_upto(key, last_seq)?;
        }
        Ok(())
    }

    fn set_aside(&mut self, path: &Path, why: &dyn std::fmt::Display) {
        let mut aside = path.as_os_str().to_owned();
        aside.push(".corrupt");
        let mut aside = PathBuf::from(aside);
        if aside.exists() {
            let mut a = aside.into_os_string();
            a.push(format!(".{}", unix_ms(SystemTime::now())));
            aside = PathBuf::from(a);
        }
        match std::fs::rename(path, &aside) {
            Ok(()) => {
                tracing::warn!(file = %path.display(), moved_to = %aside.display(), error = %why,
                "store: corrupt profile set aside; starting a fresh one")
            }
            Err(e) => tracing::warn!(file = %path.display(), error = %why, rename_error = %e,
                "store: corrupt profile could not be renamed aside; overwriting it"),
        }
        self.corrupt_files += 1;
    }

    /// `summary.json` of touched epochs and the kallsyms snapshot of the current epoch.
    fn write_side_files(&mut self, now: Instant, force: bool) {
        if self.db.is_none() {
            return;
        }
        if let Some(epoch) = self.epoch.clone() {
            if self.kallsyms.is_some() && self.kallsyms_written.as_ref() != Some(&epoch) {
                let r = self.host_dir(&epoch).and_then(|hd| {
                    let bytes = self.kallsyms.as_deref().unwrap_or_default();
                    write_atomic(&hd.kallsyms_path(), bytes).map_err(StoreError::from)
                });
                match r {
                    Ok(()) => self.kallsyms_written = Some(epoch),
                    Err(e) => self.set_db_error(&e),
                }
            }
        }
        let mut epochs: Vec<String> = self.summary_dirty.iter().cloned().collect();
        epochs.sort();
        for e in epochs {
            let recent = self
                .summary_written_at
                .get(&e)
                .is_some_and(|t| now.saturating_duration_since(*t) < self.cfg.publish_interval);
            let other_epoch = Some(e.as_str()) != self.epoch.as_ref().map(|x| x.as_str());
            if recent && !force && !other_epoch {
                continue;
            }
            let Ok(epoch) = EpochId::parse(&e) else {
                self.summary_dirty.remove(&e);
                continue;
            };
            let mut s = self.summary_for(&epoch);
            s.format_version = s.format_version.max(1);
            s.host = self.cfg.host.clone();
            s.epoch = e.clone();
            if !self.kernel_release.is_empty() {
                s.kernel_release = self.kernel_release.clone();
            }
            if !self.cpus.is_empty() {
                s.cpus = self.cpus.clone();
            }
            for info in &self.events {
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
            let r = self.host_dir(&epoch).and_then(|hd| {
                // Totals of the files as published now; no index rather than a wrong one.
                s.index = profile_format::SummaryIndex::of_host_dir(&hd).ok();
                s.write(&hd.summary_path()).map_err(StoreError::from)
            });
            match r {
                Ok(()) => {
                    self.summaries.insert(e.clone(), s);
                    self.summary_dirty.remove(&e);
                    self.summary_written_at.insert(e, now);
                }
                Err(err) => {
                    self.set_db_error(&err);
                    break;
                }
            }
        }
        if let (Some(sp), Some(cur)) = (self.spool.as_mut(), self.epoch.as_ref()) {
            let _ = sp.prune_summaries(cur.as_str());
        }
        // Summaries of finished epochs that are fully written are no longer needed in memory.
        let cur = self.epoch.as_ref().map(|e| e.to_string());
        let dirty = &self.dirty;
        let sdirty = &self.summary_dirty;
        self.summaries.retain(|e, _| {
            Some(e) == cur.as_ref() || sdirty.contains(e) || dirty.keys().any(|k| &k.epoch == e)
        });
    }

    fn maybe_retention(&mut self, now: Instant) {
        if self
            .last_retention
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(3600))
        {
            return;
        }
        if self.db.is_none() {
            return;
        }
        self.last_retention = Some(now);
        if let Err(e) = self.apply_retention(SystemTime::now()) {
            tracing::warn!(error = %e, "store: retention failed; will retry in an hour");
        }
    }
}
