//! From resolved batches to the shared profile database, without losing or doubling samples.
//!
//! Path of a sample count:
//! 1. `add()` converts a [`Resolved`] batch into per-profile increments held in memory
//!    (bounded by `max_memory_bytes`: past it the oldest batches are dropped and counted).
//! 2. Every flush interval `tick()` appends the held increments to the host-local spool
//!    ([`spool::Spool`], an append-only log) as one record: from then on a kill -9 loses
//!    nothing. The record holds only that flush's increments, ~2 bytes per (offset, count).
//! 3. `tick()` also publishes a few changed profiles whose turn has come (each profile at most
//!    once per publish interval, turns spread over the interval): read the existing file of our
//!    own host directory, merge the spooled increments whose sequence number is above the
//!    file's `header.sequence`, write atomically with `sequence` = the highest merged one, then
//!    tell the spool they are published (it deletes a segment once nothing in it is pending).
//!    A crash between the rename and that is harmless: on restart the increments are found
//!    with `seq <= sequence` and skipped. Each increment is published exactly once; so is each
//!    summary delta (`summary.json` records `spool_sequence`).
//!
//! Failures of the database (disk full, read-only, NFS server gone) are logged once, shown in
//! the status, and retried every tick; the spool keeps the data meanwhile. If the spool itself
//! fails, data stays in memory up to the bound. A corrupt profile file is renamed aside to
//! `*.corrupt` and replaced by a fresh one; a corrupt spool record is quarantined.
//!
//! Epochs: every record carries the epoch it was collected in. Each tick checks the database's
//! current epoch; when another host (or `dcpictl epoch new`) started a new one, everything of
//! the old epoch is published first, then new data goes to the new epoch.

mod pending;
mod publish;
pub mod spool;
mod summaries;
mod who;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use profile_format::{
    Database, EpochId, EventDesc, EventSummary, HostDir, HostSummary, KallsymsSnapshot,
};

use crate::aggregate::Resolved;
use pending::{PendingBatch, PendingQueue};
use publish::Schedule;
use spool::{Increment, Spool, SpoolError, SpoolKey};
use summaries::Summaries;

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

pub use dcpi_proto::status::{BytesWritten, OpStat, StoreStatus};

/// What the host tells the store about itself, recorded in summaries.
#[derive(Default)]
struct HostInfo {
    events: Vec<EventInfo>,
    kernel_release: String,
    cpus: Vec<u32>,
    /// Per event index: counter enabled/running time (ns) not yet in a spooled record. Reports
    /// scale counts by enabled/running when the kernel multiplexed the counters.
    event_times: Vec<(u64, u64)>,
    unknown_event_logged: bool,
}

/// The kernel symbol snapshot to reference from each epoch.
#[derive(Default)]
struct KernelSymbols {
    /// The encoded `kallsyms.snap`: a fraction of the decoded snapshot's memory.
    encoded: Option<Vec<u8>>,
    written: Option<EpochId>,
}

/// Failures, timings and counters for the status.
#[derive(Default)]
struct Health {
    db_error: Option<String>,
    spool_error: Option<String>,
    last_flush: Option<OpStat>,
    last_publish: Option<OpStat>,
    published_files: u64,
    corrupt_files: u64,
    backlog: (u64, u64),
    bytes: BytesWritten,
}

/// The store. Not thread-safe by itself: the service keeps it behind a mutex.
pub struct Store {
    cfg: StoreConfig,
    db: Option<Database>,
    spool: Option<Spool>,
    epoch: Option<EpochId>,
    host: HostInfo,
    kernel: KernelSymbols,
    pending: PendingQueue,
    schedule: Schedule,
    summaries: Summaries,
    health: Health,
    created_dirs: HashSet<PathBuf>,
    last_retention: Option<Instant>,
    crash_after_writes: Option<u32>,
    who: who::WhoAccum,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("cfg", &self.cfg).field("epoch", &self.epoch).finish()
    }
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
            host: HostInfo::default(),
            kernel: KernelSymbols::default(),
            pending: PendingQueue::default(),
            schedule: Schedule::default(),
            summaries: Summaries::default(),
            health: Health::default(),
            created_dirs: HashSet::new(),
            last_retention: None,
            crash_after_writes: None,
            who: who::WhoAccum::default(),
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
        if let Some(sp) = self.spool.as_mut() {
            sp.set_rotate_after(publish_interval);
        }
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
        self.host.events = events;
    }

    /// Add counter enabled/running time deltas (ns, summed over CPUs) per event index; they go
    /// into the current epoch's summary with the next spooled batch.
    pub fn add_event_times(&mut self, deltas: &[(u64, u64)]) {
        let t = &mut self.host.event_times;
        if t.len() < deltas.len() {
            t.resize(deltas.len(), (0, 0));
        }
        for (acc, d) in t.iter_mut().zip(deltas) {
            acc.0 = acc.0.saturating_add(d.0);
            acc.1 = acc.1.saturating_add(d.1);
        }
    }

    /// Facts recorded in each epoch's `summary.json`.
    pub fn set_host_info(&mut self, kernel_release: String, cpus: Vec<u32>) {
        self.host.kernel_release = kernel_release;
        self.host.cpus = cpus;
    }

    /// The kernel symbol snapshot: stored once per database, referenced from each epoch's
    /// host directory.
    pub fn set_kallsyms(&mut self, snap: KallsymsSnapshot) {
        match snap.to_file_bytes(Path::new("kallsyms.snap")) {
            Ok(mut b) => {
                b.shrink_to_fit();
                self.kernel.encoded = Some(b);
            }
            Err(e) => {
                tracing::warn!(error = %e, "kallsyms snapshot not kept; kernel samples will not be symbolized");
                self.kernel.encoded = None;
            }
        }
        self.kernel.written = None;
    }

    pub fn current_epoch(&self) -> Option<&EpochId> {
        self.epoch.as_ref()
    }

    /// Test hook: make the n-th following profile write fail right after its rename (before
    /// the spool is told), as a crash there would.
    #[doc(hidden)]
    pub fn inject_crash_after_write(&mut self, n: u32) {
        self.crash_after_writes = Some(n);
    }

    /// Take a resolved batch (plus the sampler's lost/throttled counts since the previous
    /// batch) into memory; written to the spool by the next `tick`.
    pub fn add(&mut self, resolved: Resolved, lost: u64, throttled: u64) {
        self.who_add(&resolved.who);
        let logged = &mut self.host.unknown_event_logged;
        let mut unknown_event = |ev: u16| {
            if !*logged {
                tracing::error!(
                    event = ev,
                    "store: batch names an event index that is not configured; dropped"
                );
                *logged = true;
            }
        };
        if let Some(b) = PendingBatch::from_resolved(
            resolved,
            &self.host.events,
            self.epoch.clone(),
            lost,
            throttled,
            &mut unknown_event,
        ) {
            self.pending.push(b, self.cfg.max_memory_bytes);
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
        let published = self.publish_due(now);
        self.write_side_files(now, false);
        if published > 0 {
            self.health.last_publish = Some(OpStat {
                unix_ms: unix_ms(SystemTime::now()),
                duration_ms: t1.elapsed().as_secs_f64() * 1e3,
                items: published as u64,
            });
        }
        self.maybe_retention(now);
        self.write_marks(now);
        self.refresh_backlog();
    }

    /// Record in the spool which profiles were published (see [`spool`]); a failure only
    /// means a restart re-offers them, and the published files' sequences skip them.
    fn write_marks(&mut self, now: Instant) {
        if let Some(sp) = self.spool.as_mut() {
            if let Err(e) = sp.write_marks(now) {
                self.set_spool_error(&e);
            }
        }
    }

    /// The first half of a tick or a full flush: reopen what failed, follow the current
    /// epoch, write held increments to the spool. Returns when it ended (publishing is timed
    /// from there).
    fn spool_step(&mut self, now: Instant) -> Instant {
        let t0 = Instant::now();
        self.ensure_open(now);
        self.follow_epoch(now);
        let spooled = self.spool_pending(now);
        self.health.last_flush = Some(OpStat {
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
        self.write_marks(now);
        if let Some(sp) = self.spool.as_mut() {
            if let Err(e) = sp.sync() {
                self.set_spool_error(&e);
            }
        }
        self.health.last_publish = Some(OpStat {
            unix_ms: unix_ms(SystemTime::now()),
            duration_ms: t1.elapsed().as_secs_f64() * 1e3,
            items: self.health.published_files,
        });
        self.refresh_backlog();
        result?;
        if !self.pending.is_empty() {
            return Err(StoreError::Unwritten(self.pending.len()));
        }
        if let Some(e) = &self.health.db_error {
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
                sp.forget_epoch(e.as_str());
            }
            self.schedule.forget_epoch(e.as_str());
            self.summaries.current.remove(e.as_str());
            self.summaries.dirty.remove(e.as_str());
            removed.push(e.clone());
        }
        self.write_marks(Instant::now());
        // Snapshots no epoch references any more (of any host); young ones may be about to be
        // referenced by a host that has just stored them.
        let gc = self.db.as_ref().map(|db| db.gc_kallsyms(now, Duration::from_secs(3600)));
        match gc.unwrap_or(Ok(Vec::new())) {
            Ok(ids) if !ids.is_empty() => {
                tracing::info!(
                    snapshots = ids.len(),
                    "store: retention removed unreferenced kernel symbol snapshots"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "store: kernel symbol snapshot retention failed"),
        }
        Ok(removed)
    }

    /// A snapshot for `dcpictl status`.
    pub fn status(&self) -> StoreStatus {
        let h = &self.health;
        let mut bytes = h.bytes.clone();
        bytes.spool = self.spool.as_ref().map_or(0, |s| s.bytes_appended());
        StoreStatus {
            epoch: self.epoch.as_ref().map(|e| e.to_string()),
            last_flush: h.last_flush.clone(),
            last_publish: h.last_publish.clone(),
            spool_rows: h.backlog.0,
            spool_bytes: h.backlog.1,
            spool_quarantined: self.spool.as_ref().map_or(0, |s| s.quarantined()),
            dirty_profiles: self.schedule.len() as u64,
            pending_batches: self.pending.len() as u64,
            pending_bytes: self.pending.bytes(),
            max_memory_bytes: self.cfg.max_memory_bytes,
            dropped_samples: self.pending.dropped_samples,
            dropped_batches: self.pending.dropped_batches,
            published_files: h.published_files,
            corrupt_files_set_aside: h.corrupt_files,
            bytes_written: bytes,
            db_error: h.db_error.clone(),
            spool_error: h.spool_error.clone(),
        }
    }

    // ---- internals ----

    fn set_db_error(&mut self, e: &dyn std::fmt::Display) {
        let msg = e.to_string();
        if self.health.db_error.is_none() {
            tracing::error!(db = %self.cfg.db.display(), error = %msg,
                "store: cannot write the profile database; keeping data in the spool and retrying every flush");
        }
        self.health.db_error = Some(msg);
        self.created_dirs.clear();
    }

    fn clear_db_error(&mut self) {
        if self.health.db_error.take().is_some() {
            tracing::info!(db = %self.cfg.db.display(), "store: profile database writable again");
        }
    }

    fn set_spool_error(&mut self, e: &dyn std::fmt::Display) {
        let msg = e.to_string();
        if self.health.spool_error.is_none() {
            tracing::error!(spool = %self.cfg.spool.display(), error = %msg,
                "store: cannot write the spool; holding data in memory (bounded) and retrying every flush");
        }
        self.health.spool_error = Some(msg);
    }

    fn clear_spool_error(&mut self) {
        if self.health.spool_error.take().is_some() {
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
            match Spool::open(&self.cfg.spool, self.cfg.publish_interval) {
                Ok((s, recovered)) => {
                    if !recovered.keys.is_empty() {
                        tracing::info!(
                            profiles = recovered.keys.len(),
                            quarantined = recovered.quarantined,
                            "store: spool holds unpublished increments from a previous run"
                        );
                    }
                    // Epochs with summary deltas but no profile increments still need their
                    // summary written.
                    self.summaries.dirty.extend(s.summary_epochs());
                    self.spool = Some(s);
                    self.clear_spool_error();
                    for k in recovered.keys {
                        self.schedule.mark(k, now, self.cfg.publish_interval);
                    }
                    self.refresh_backlog();
                }
                Err(e) => self.set_spool_error(&e),
            }
        }
    }

    fn refresh_backlog(&mut self) {
        if let Some(sp) = &self.spool {
            self.health.backlog = sp.backlog();
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

    /// The epoch's cumulative summary: in memory, or the published `summary.json` plus the
    /// spool's deltas above the sequence it records.
    fn summary_for(&mut self, epoch: &EpochId) -> &mut HostSummary {
        let key = epoch.as_str();
        if !self.summaries.current.contains_key(key) {
            let published = self.db.as_ref().and_then(|db| {
                let hd = db.host_dir(epoch, &self.cfg.host).ok()?;
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
                    summaries::apply(&mut s, &d);
                }
            }
            self.summaries.current.insert(key.to_owned(), s);
        }
        self.summaries.current.get_mut(key).expect("inserted above")
    }

    /// Append held batches to the spool, oldest first, one record each. Returns the
    /// increments written.
    fn spool_pending(&mut self, now: Instant) -> usize {
        let mut written = 0;
        while self.spool.is_some() {
            let Some(batch) = self.pending.pop() else { break };
            let Some(epoch) = batch.epoch.clone().or_else(|| self.epoch.clone()) else {
                self.pending.unpop(batch);
                break;
            };
            // Load the summary before appending, so that it is not built from the spool's
            // deltas with this one already among them.
            self.summary_for(&epoch);
            let delta = summaries::delta_of(
                &batch,
                self.pending.dropped_unreported,
                &self.host.events,
                &self.host.event_times,
            );
            let incs: Vec<Increment<'_>> = batch
                .profiles
                .iter()
                .map(|p| Increment {
                    image: p.image.as_ref().map(|(id, img)| (id.as_str(), img)),
                    desc: &p.desc,
                    total_period: p.total_period,
                    counts: &p.counts,
                })
                .collect();
            let Some(sp) = self.spool.as_mut() else { break };
            let result = sp.append(epoch.as_str(), &incs, &delta, now);
            let n_incs = incs.len();
            drop(incs);
            match result {
                Ok(_) => {
                    written += n_incs;
                    self.pending.dropped_unreported = 0;
                    self.host.event_times.iter_mut().for_each(|t| *t = (0, 0));
                    summaries::apply(self.summary_for(&epoch), &delta);
                    self.summaries.dirty.insert(epoch.to_string());
                    for p in batch.profiles {
                        let key = SpoolKey {
                            epoch: epoch.to_string(),
                            image: p.image.map(|(id, _)| id),
                            event: p.desc.name,
                        };
                        self.schedule.mark(key, now, self.cfg.publish_interval);
                    }
                    self.clear_spool_error();
                }
                Err(e) => {
                    self.pending.unpop(batch);
                    self.set_spool_error(&e);
                    break;
                }
            }
        }
        written
    }

    /// Publish the profiles whose turn has come, oldest turn first, a bounded number per tick
    /// so that writes are spread over the publish interval.
    fn publish_due(&mut self, now: Instant) -> usize {
        let ticks = (self.cfg.publish_interval.as_secs_f64()
            / self.cfg.flush_interval.as_secs_f64())
        .max(1.0);
        let cap = ((2.0 * self.schedule.len() as f64 / ticks).ceil() as usize).max(8);
        let due = self.schedule.due(now, cap);
        let mut n = 0;
        for key in due {
            match self.publish_key(&key) {
                Ok(()) => {
                    n += 1;
                    self.schedule.done(key, now);
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
        for key in self.schedule.all(epoch) {
            match self.publish_key(&key) {
                Ok(()) => {
                    self.schedule.done(key, now);
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

    /// Merge one profile's spooled increments into its file, exactly once.
    fn publish_key(&mut self, key: &SpoolKey) -> Result<(), StoreError> {
        let spool =
            self.spool.as_mut().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
        let incs = spool.increments(key);
        let Some(last_seq) = incs.last().map(|r| r.seq) else { return Ok(()) };
        let Some(target) = publish::Target::of(key) else {
            // Logged by `Target::of`; nothing can be published under a name that is invalid.
            spool.published(key, last_seq);
            return Ok(());
        };
        let hd = self.host_dir(&target.epoch)?;
        let path = target.path(&hd, key);
        let existing = match publish::read_existing(&path) {
            Ok(p) => p,
            Err(publish::Existing::Io(e)) => return Err(e.into()),
            Err(publish::Existing::Corrupt(e)) => {
                self.set_aside(&path, &e);
                None
            }
        };
        let spool =
            self.spool.as_mut().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
        let merged = target.merge(existing, &incs, spool, &self.cfg.host)?;
        if let Some(mismatch) = &merged.set_aside {
            self.set_aside(&path, mismatch);
        }
        if let Some(mut m) = merged.profile {
            m.header.sequence = m.header.sequence.max(last_seq);
            let bytes = m.encode();
            m.write(&path)?;
            self.health.bytes.profiles += bytes.len() as u64;
            self.health.published_files += 1;
            // Its totals changed: the summary index of this epoch must be rewritten.
            self.summaries.dirty.insert(target.epoch.to_string());
            if let Some(n) = self.crash_after_writes.as_mut() {
                if *n <= 1 {
                    self.crash_after_writes = None;
                    return Err(StoreError::InjectedCrash(path));
                }
                *n -= 1;
            }
        }
        if let Some(sp) = self.spool.as_mut() {
            sp.published(key, last_seq);
        }
        Ok(())
    }

    fn set_aside(&mut self, path: &Path, why: &dyn std::fmt::Display) {
        publish::set_aside(path, why);
        self.health.corrupt_files += 1;
    }

    /// The kallsyms snapshot of the current epoch, if not written yet.
    fn write_kallsyms(&mut self) {
        let Some(epoch) = self.epoch.clone() else { return };
        if self.kernel.encoded.is_none() || self.kernel.written.as_ref() == Some(&epoch) {
            return;
        }
        // Stored once per database under its content id (a stat when it is there already),
        // then referenced from this epoch's host directory.
        let r = self.host_dir(&epoch).and_then(|hd| {
            let db = self.db.as_ref().ok_or_else(|| StoreError::NoDatabase(self.cfg.db.clone()))?;
            let bytes = self.kernel.encoded.as_deref().unwrap_or_default();
            let (id, stored) = db.put_kallsyms(bytes)?;
            Ok(stored + hd.write_kallsyms_ref(&id)?)
        });
        match r {
            Ok(n) => {
                self.health.bytes.kallsyms += n;
                self.kernel.written = Some(epoch);
            }
            Err(e) => self.set_db_error(&e),
        }
    }

    /// `summary.json` of one epoch, with the host's facts and the spool sequence it includes.
    fn write_summary(&mut self, epoch: &EpochId) -> Result<(), StoreError> {
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
        // The per-(image, event) totals of what is published now (FORMAT.md §7.1), so that
        // per-image reports read this file instead of every profile.
        s.index = profile_format::SummaryIndex::of_host_dir(&hd).ok();
        let n = s.write(&hd.summary_path())?;
        self.health.bytes.summaries += n;
        self.write_who(epoch)?;
        if let Some(sp) = self.spool.as_mut() {
            sp.summary_published(epoch.as_str(), seq);
        }
        self.summaries.current.insert(epoch.to_string(), s);
        Ok(())
    }

    /// `summary.json` of touched epochs and the kallsyms snapshot of the current epoch.
    fn write_side_files(&mut self, now: Instant, force: bool) {
        if self.db.is_none() {
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
            let other_epoch = Some(e.as_str()) != self.epoch.as_ref().map(|x| x.as_str());
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
        let cur = self.epoch.as_ref().map(|e| e.to_string());
        let schedule = &self.schedule;
        let dirty = &self.summaries.dirty;
        self.summaries
            .current
            .retain(|e, _| Some(e) == cur.as_ref() || dirty.contains(e) || schedule.has_epoch(e));
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
