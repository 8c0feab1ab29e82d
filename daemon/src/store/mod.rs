//! From resolved batches to the shared profile database, without losing or doubling samples.
//!
//! Path of a sample count:
//! 1. `add()` converts a [`Resolved`] batch into per-profile increments held in memory
//!    (bounded by `max_memory_bytes`: past it the oldest batches are dropped and counted).
//! 2. Every flush interval `tick()` appends the held increments to the host-local spool
//!    ([`spool::Spool`], an append-only log) as one record: from then on a kill -9 loses
//!    nothing. The record holds only that flush's increments, ~2 bytes per (offset, count).
//! 3. `tick()` also publishes a few changed profiles whose turn has come (each profile at most
//!    once per publish interval, turns spread over the interval, and a profile already
//!    published only once it has grown enough or waited long enough: [`publish::PUBLISH_GROWTH`]): read the existing file of our
//!    own host directory, merge the spooled increments whose sequence number is above the
//!    file's `header.sequence`, write atomically with `sequence` = the highest merged one, then
//!    tell the spool they are published (it deletes a segment once nothing in it is pending).
//!    A crash between the rename and that is harmless: on restart the increments are found
//!    with `seq <= sequence` and skipped. Each increment is published exactly once; so is each
//!    summary delta (`summary.json` records `spool_sequence`).
//!
//! Failures of the database (disk full, read-only, NFS server gone) are logged once, shown in
//! the status, and retried every tick; the spool keeps the data meanwhile. If the spool itself
//! fails (its disk full), each batch is published straight into the database instead
//! (`publish::write_direct`: merged into the published files, their `sequence` untouched, so
//! spooled increments are still merged exactly once). What can be written to neither stays in
//! memory up to the bound, and is then dropped and counted (`dropped_samples`), as is what is
//! still held when the daemon exits. A corrupt profile file is renamed aside to
//! `*.corrupt` and replaced by a fresh one; a corrupt spool record is quarantined.
//!
//! Epochs: every record carries the epoch it was collected in. Each tick checks the database's
//! current epoch; when another host (or `dcpictl epoch new`) started a new one, everything of
//! the old epoch is published first, then new data goes to the new epoch.

mod epochs;
mod fresh;
mod kallsyms;
mod lease;
mod pending;
mod publish;
mod retention;
mod rotation;
mod slices;
mod sole;
pub mod spool;
mod stacks;
mod summaries;
mod symtabs;
mod who;
pub use rotation::{EpochSchedule, Rotation};
pub use slices::{SliceSettings, SliceStats, ROLLUP_RESOLUTION, ROLLUP_SLICE, SLICE_RESOLUTION};
pub use symtabs::{SymtabCounters, SYMTAB_THREAD};
pub use who::WhoProfiles;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use profile_format::{Database, EpochId, EventDesc, HostDir, Profile, ProfileWho, StackProfile};

use crate::aggregate::Resolved;
use crate::faults::Faults;
pub use kallsyms::KernelSymbolSource;
use kallsyms::KernelSymbols;
use lease::LeaseState;
pub use pending::Losses;
use pending::{PendingBatch, PendingQueue};
use profile_format::safeio;
use publish::Schedule;
use spool::{Spool, SpoolError, SpoolKey};
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
    /// Another live daemon holds this host name in the database (FORMAT.md §2.1).
    #[error("host name {host:?} in database {db} is held by {owner} (lease file {lease}); stop that daemon, or give this one another --host")]
    LeaseHeld { host: String, db: PathBuf, owner: String, lease: PathBuf },
    /// The lease was taken over while this daemon ran (it looked dead to another one).
    #[error("host name {host:?} was taken over by {owner}; this daemon no longer publishes (its data stays in the spool)")]
    LeaseLost { host: String, owner: String },
    /// Test hook: simulated crash between a profile's rename and its spool delete.
    #[error("injected crash after writing {0}")]
    InjectedCrash(PathBuf),
}

/// Temporary files (`.tmp-*`) older than this in this host's directories are leftovers of a
/// killed writer (a write takes seconds even on a slow NFS server), removed at start.
pub const STALE_TMP_AGE: Duration = Duration::from_secs(600);

/// Settings of the store.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct StoreConfig {
    pub db: PathBuf,
    /// The spool's base directory; this host's log is in its subdirectory named after the
    /// host, so that two daemons of different host names never share one.
    pub spool: PathBuf,
    pub host: String,
    pub flush_interval: Duration,
    pub publish_interval: Duration,
    /// Longest wait of a published profile's new samples that have not doubled it.
    pub publish_max_delay: Duration,
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

/// Failures, timings and counters for the status.
#[derive(Default)]
struct Health {
    db_error: Option<String>,
    spool_error: Option<String>,
    /// Whether the current failing state was logged (see `settle_logs`).
    db_error_logged: bool,
    spool_error_logged: bool,
    last_flush: Option<OpStat>,
    last_publish: Option<OpStat>,
    published_files: u64,
    corrupt_files: u64,
    last_set_aside: Option<String>,
    /// Profiles of a newer format version left untouched (FORMAT.md §3.1), and the last one.
    newer_files: HashSet<PathBuf>,
    last_newer: Option<String>,
    backlog: (u64, u64),
    bytes: BytesWritten,
}

/// The store. Not thread-safe by itself: the service keeps it behind a mutex.
pub struct Store {
    cfg: StoreConfig,
    db: Option<Database>,
    spool: Option<Spool>,
    epoch: Option<EpochId>,
    /// The epochs directory's stamp at the last listing that can be reused, and the current
    /// epoch it gave (`follow_epoch`).
    epochs_seen: Option<(profile_format::EpochsStamp, Option<EpochId>)>,
    host: HostInfo,
    kernel: KernelSymbols,
    pending: PendingQueue,
    schedule: Schedule,
    /// Sole-command stubs written or found (FORMAT.md §5.6.1).
    sole: sole::SoleStubs,
    summaries: Summaries,
    health: Health,
    created_dirs: HashSet<PathBuf>,
    last_retention: Option<Instant>,
    /// The scheduled epoch whose failed start was logged (once per boundary, not per tick).
    rotation_warned: Option<EpochId>,
    crash_after_writes: Option<u32>,
    lease: LeaseState,
    tmp_cleaned: bool,
    /// Unix ms at which the operation in progress (a tick, a flush) began; 0 when idle. Read
    /// without the store's lock by `dcpictl status`, which reports a stall while a database
    /// operation hangs.
    busy_since: Arc<AtomicU64>,
    stall_db: Option<PathBuf>,
    who: who::WhoAccum,
    /// Call-stack increments not yet spooled.
    stacks: stacks::PendingStacks,
    /// Counts per time slice not yet appended to the slice logs (FORMAT.md §14).
    slices: slices::SliceAccum,
    /// Where the published profiles end on the time axis (FORMAT.md §7.3).
    fresh: fresh::Fresh,
    /// Images whose symbol tables were handed to the symbol store's thread (FORMAT.md §10).
    symtabs: symtabs::SymtabStore,
}

/// Thread CPU time one [`Store::tick`] spent writing the spool and publishing (ns): where the
/// flush thread's time goes, for `dcpictl status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TickCpu {
    pub spool_ns: u64,
    pub publish_ns: u64,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("cfg", &self.cfg).field("epoch", &self.epoch).finish()
    }
}

/// Move the segments of a spool from before spools were per host (`<spool>/seg-*.log`) into
/// this host's subdirectory, so that what an older dcpid spooled is still published.
fn adopt_shared_spool(base: &Path, dir: &Path) {
    let Ok(rd) = std::fs::read_dir(base) else { return };
    let old: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.starts_with("seg-") && n.ends_with(".log")
        })
        .map(|e| e.path())
        .collect();
    if old.is_empty() || std::fs::create_dir_all(dir).is_err() {
        return;
    }
    for p in old {
        let Some(name) = p.file_name() else { continue };
        match std::fs::rename(&p, dir.join(name)) {
            Ok(()) => tracing::info!(from = %p.display(), to = %dir.display(),
                "store: spool segment of an older dcpid moved into this host's spool"),
            Err(e) => tracing::warn!(file = %p.display(), error = %e,
                "store: cannot move an older spool segment into this host's spool"),
        }
    }
}

/// Whether reading the profile at `path` failed only because it is a whole profile of a newer
/// format version than this build reads (FORMAT.md §3.1): such a file is left alone, not set
/// aside as corrupt. Garbage that happens to start with the magic is not one.
fn is_newer(e: &profile_format::Error, path: &Path) -> bool {
    matches!(e, profile_format::Error::UnknownVersion { version, supported, .. } if version > supported)
        && profile_format::Profile::is_newer_version(path)
}

/// Set aside a database directory that is something else (`NotDirectory`), logged; `on_aside`
/// hears of it. `Err` if it cannot be renamed.
fn set_aside_dir(
    path: std::path::PathBuf,
    kind: &'static str,
    on_aside: &mut dyn FnMut(&Path, String),
) -> Result<(), profile_format::Error> {
    let why = format!("is {kind}, not a directory");
    match safeio::set_aside(&path) {
        Ok(to) => tracing::error!(dir = %path.display(), moved_to = %to.display(), reason = %why,
            "store: a database directory was replaced by something else (another writer?); set aside, never written through"),
        Err(e) => {
            tracing::error!(dir = %path.display(), reason = %why, error = %e,
                "store: a database directory is not one and cannot be set aside; not written");
            return Err(profile_format::Error::NotDirectory { path, kind });
        }
    }
    on_aside(&path, why);
    Ok(())
}

/// [`Database::create`], a link (or anything but a directory) in place of `epochs/` set aside
/// ([`set_aside_dir`]) and a real directory made instead (FORMAT.md §6.1).
fn create_database(
    root: &Path,
    on_aside: &mut dyn FnMut(&Path, String),
) -> Result<Database, profile_format::Error> {
    let mut r = Database::create(root);
    for _ in 0..2 {
        let Err(profile_format::Error::NotDirectory { path, kind }) = r else { break };
        set_aside_dir(path, kind, on_aside)?;
        r = Database::create(root);
    }
    r
}

/// Enter this host's directory `hd` (creating what is missing, or, `known`: one created before,
/// only checking it), through real directories only (FORMAT.md §6.1). A link or any other
/// non-directory in place of `epochs/`, the epoch's or the host's directory is set aside
/// (`on_aside` hears of it) and a real directory made in its place; the marker of `current`
/// is put back if it went with it.
fn enter_host_dir(
    db: &Database,
    hd: &HostDir,
    known: bool,
    current: Option<&EpochId>,
    on_aside: &mut dyn FnMut(&Path, String),
) -> Result<(), StoreError> {
    // One set-aside per level (`epochs/`, the epoch's, the host's directory) at most.
    let mut set_aside = 0;
    loop {
        let r = if known {
            hd.check().and_then(|ok| if ok { Ok(()) } else { hd.create() })
        } else {
            hd.create()
        };
        match r {
            Ok(()) => return Ok(()),
            Err(profile_format::Error::NotDirectory { path, kind }) if set_aside < 3 => {
                set_aside += 1;
                set_aside_dir(path, kind, on_aside)?;
                if let Some(cur) = current {
                    db.ensure_epoch(cur, &hd.host)?;
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Marks the store busy (since now) while it lives; nested marks keep the outer time.
struct Busy(Arc<AtomicU64>, bool);

impl Busy {
    fn mark(at: Arc<AtomicU64>) -> Self {
        let now = unix_ms(SystemTime::now()).max(1);
        let first = at.compare_exchange(0, now, Ordering::AcqRel, Ordering::Acquire).is_ok();
        Self(at, first)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.1 {
            self.0.store(0, Ordering::Release);
        }
    }
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// How far a publication goes in a profile's spooled increments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Upto {
    /// Up to the epoch's last freshness mark (FORMAT.md §7.3); the rest at a later turn.
    Mark,
    /// Everything spooled, whatever the marks cover: a flush, shutdown or the end of a run
    /// publishes every sample taken before it (e2e `barrier::`). A profile stamped past the last
    /// mark is read as published, with no slices added (FORMAT.md §7.3), so nothing counts
    /// twice. The mark alone did not always cover the newest batch: a new image's samples
    /// were missing after one flush in five in CI
    /// (`barrier::flush_publishes_every_sample_taken_before_it`).
    Everything,
}

impl Store {
    /// Open the database (creating it and its first epoch if needed) and the spool. Never
    /// fails: what cannot be opened now is retried on every tick, and reported in the status.
    pub fn open(cfg: StoreConfig) -> Self {
        let mut s = Self::unopened(cfg);
        s.ensure_open(Instant::now());
        s
    }

    /// [`Store::open`] for the daemon: first take the lease on the host name
    /// ([`Store::take_lease`]), before anything of this host's spool or directories is
    /// touched. Fails only with [`StoreError::LeaseHeld`]; other failures to take it are
    /// logged and retried at each tick.
    pub fn open_leased(cfg: StoreConfig) -> Result<Self, StoreError> {
        Self::open_leased_with_faults(cfg, &Faults::default())
    }

    /// [`Store::open_leased`] with injected faults (tests; see [`crate::faults`]) in force from
    /// the first database operation on.
    pub fn open_leased_with_faults(cfg: StoreConfig, faults: &Faults) -> Result<Self, StoreError> {
        let mut s = Self::unopened(cfg);
        s.inject_faults(faults);
        match s.take_lease() {
            Ok(()) => {}
            Err(e @ StoreError::LeaseHeld { .. }) => return Err(e),
            Err(e) => tracing::warn!(error = %e,
                "store: cannot take the lease on this host name now; retrying at each flush"),
        }
        s.ensure_open(Instant::now());
        Ok(s)
    }

    fn unopened(cfg: StoreConfig) -> Self {
        Self {
            cfg,
            db: None,
            spool: None,
            epoch: None,
            epochs_seen: None,
            host: HostInfo::default(),
            kernel: KernelSymbols::default(),
            pending: PendingQueue::default(),
            schedule: Schedule::default(),
            sole: sole::SoleStubs::default(),
            summaries: Summaries::default(),
            health: Health::default(),
            created_dirs: HashSet::new(),
            last_retention: None,
            rotation_warned: None,
            crash_after_writes: None,
            lease: LeaseState::default(),
            tmp_cleaned: false,
            busy_since: Arc::new(AtomicU64::new(0)),
            stall_db: None,
            who: who::WhoAccum::default(),
            stacks: stacks::PendingStacks::default(),
            slices: slices::SliceAccum::default(),
            fresh: fresh::Fresh::default(),
            symtabs: symtabs::SymtabStore::default(),
        }
    }

    /// What the symbol store's thread did so far (FORMAT.md §10).
    pub fn symtab_counters(&self) -> Arc<SymtabCounters> {
        self.symtabs.counters()
    }

    pub fn config(&self) -> &StoreConfig {
        &self.cfg
    }

    /// Unix ms at which the store's current operation began (0: idle), readable while the
    /// operation holds the store: a value far in the past means the database hangs.
    pub fn busy_since(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.busy_since)
    }

    /// Spool everything held (no database access): what a stop does first, so that a hung
    /// database cannot cost the samples.
    pub fn spool_held(&mut self) {
        let now = Instant::now();
        self.ensure_spool_open(now);
        if self.epoch.is_some() {
            self.spool_pending(now, false);
        }
        if let Some(sp) = self.spool.as_mut() {
            if let Err(e) = sp.sync() {
                self.set_spool_error(&e);
            }
        }
    }

    /// Samples held in memory and dropped, readable while an operation holds the store.
    pub fn losses(&self) -> Arc<Losses> {
        self.pending.losses()
    }

    /// The daemon exits: what is still held in memory (written neither to the spool nor to
    /// the database) is dropped, counted in `dropped_samples` and logged once. Returns its
    /// samples.
    pub fn drop_held(&mut self) -> u64 {
        let n = self.pending.drop_all();
        if n > 0 {
            tracing::error!(samples = n, spool_error = self.health.spool_error.as_deref(), db_error = self.health.db_error.as_deref(),
                "store: samples held in memory could be written neither to the spool nor to the database; dropped at exit");
        }
        n
    }

    /// Append one resolved batch to this host's spool without the store (whose lock a hung
    /// database operation may hold): opens the spool directory afresh and adds one record,
    /// published by the next start. For the daemon's stop only.
    pub fn spool_directly(
        cfg: &StoreConfig,
        events: &[EventInfo],
        epoch: &EpochId,
        mut resolved: Resolved,
        lost: u64,
        throttled: u64,
        who: WhoProfiles,
    ) -> Result<u64, StoreError> {
        // The stack increments go too: the next start publishes them like the store's own.
        let stacks: Vec<(EventDesc, StackProfile)> = std::mem::take(&mut resolved.stacks)
            .into_iter()
            .filter(|(_, p)| !p.is_empty())
            .filter_map(|(ev, mut p)| {
                let info = events.get(usize::from(ev))?;
                p.event = info.desc.name.clone();
                p.epoch = epoch.to_string();
                Some((info.desc.clone(), p))
            })
            .collect();
        let batch = PendingBatch::from_resolved(
            resolved,
            events,
            Some(epoch.clone()),
            lost,
            throttled,
            who,
            &mut |_| {},
        );
        if batch.is_none() && stacks.is_empty() {
            return Ok(0);
        }
        let dir = cfg.spool.join(&cfg.host);
        let (mut sp, _) = Spool::open(&dir, cfg.publish_interval)?;
        let now = Instant::now();
        if let Some(batch) = &batch {
            let delta = summaries::delta_of(batch, 0, events, &[]);
            let incs = batch.increments();
            sp.append(epoch.as_str(), &incs, &delta, now)?;
        }
        if !stacks.is_empty() {
            let refs: Vec<_> = stacks.iter().map(|(d, p)| (d, p)).collect();
            sp.append_stacks(epoch.as_str(), &refs, now)?;
        }
        sp.sync()?;
        Ok(batch.map_or(0, |b| b.samples))
    }

    /// This host's spool log: `<spool>/<host>/`.
    pub fn spool_dir(&self) -> PathBuf {
        self.cfg.spool.join(&self.cfg.host)
    }

    /// Apply the settings that may change while running (on reload). A changed retention is
    /// applied at the next tick instead of within the hour.
    pub fn reconfigure(&mut self, new: &StoreConfig) {
        // Where the data goes is fixed for the daemon's life; the rest may change.
        let new = StoreConfig {
            db: self.cfg.db.clone(),
            spool: self.cfg.spool.clone(),
            host: self.cfg.host.clone(),
            ..new.clone()
        };
        if self.cfg.retention_days != new.retention_days
            || self.cfg.retention_keep != new.retention_keep
        {
            self.last_retention = None;
        }
        if let Some(sp) = self.spool.as_mut() {
            sp.set_rotate_after(new.publish_interval);
        }
        self.cfg = new;
    }

    /// Check at start that this host can write into the database: create it (and the first
    /// epoch) if needed, this host's directory of the current epoch, and a small file there.
    /// The daemon refuses to start on a database it can never write (wrong path, permissions,
    /// read-only); failures that may pass (disk full, NFS server down) are only reported.
    pub fn check_db_writable(db: &Path, host: &str) -> Result<(), StoreError> {
        let db = create_database(db, &mut |_, _| {})?;
        let epoch = match db.current_epoch()? {
            Some(e) => e,
            None => db.new_epoch(SystemTime::now(), host)?,
        };
        let hd = db.host_dir(&epoch, host)?;
        enter_host_dir(&db, &hd, false, Some(&epoch), &mut |_, _| {})?;
        // A fresh name, created exclusively and without following a link: a link planted
        // under a predictable name would make this write go wherever it points.
        let probe = hd.path.join(format!(
            ".dcpid-write-check-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let io = |e| StoreError::Db(profile_format::Error::Io { path: probe.clone(), source: e });
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(libc::O_NOFOLLOW)
                .mode(0o600)
                .open(&probe)
                .map_err(io)?;
            f.write_all(b"dcpid\n").map_err(io)?;
        }
        std::fs::remove_file(&probe).map_err(io)?;
        Ok(())
    }

    /// The events, indexed by `EventIdx`, as the sampler opened them.
    pub fn set_events(&mut self, events: Vec<EventInfo>) {
        self.host.events = events;
    }

    pub fn events(&self) -> &[EventInfo] {
        &self.host.events
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

    /// Test hook: make the n-th following profile write fail right after its rename (before
    /// the spool is told), as a crash there would.
    #[doc(hidden)]
    pub fn inject_faults(&mut self, faults: &Faults) {
        self.crash_after_writes = faults.crash_after_writes;
        self.stall_db.clone_from(&faults.stall_db);
    }

    /// Take a resolved batch (plus the sampler's lost/throttled counts since the previous
    /// batch) into memory; written to the spool by the next `tick`. Its flat counts go to the
    /// time slice of this instant.
    pub fn add(&mut self, resolved: Resolved, lost: u64, throttled: u64) {
        self.add_at(resolved, lost, throttled, SystemTime::now());
    }

    /// [`Store::add`] into the time slice of the instant `at` (a batch cut at a slice
    /// boundary holds the samples before it: its slice is the one that ends there).
    pub fn add_at(&mut self, mut resolved: Resolved, lost: u64, throttled: u64, at: SystemTime) {
        self.who_add(&resolved.who);
        self.stacks_add(std::mem::take(&mut resolved.stacks));
        // New images' symbol tables are stored by a background thread: here only a set
        // lookup per image of the batch.
        self.symtabs.offer(
            &self.cfg.db,
            self.epoch.as_ref().map(EpochId::as_str),
            resolved.profiles.values().map(|p| &*p.image),
        );
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
        if let Some(mut b) = PendingBatch::from_resolved(
            resolved,
            &self.host.events,
            self.epoch.clone(),
            lost,
            throttled,
            self.who.profiles,
            &mut unknown_event,
        ) {
            b.arrival = self.fresh.arrive();
            self.slices_add(&b, at);
            self.pending.push(b, self.cfg.max_memory_bytes);
        }
    }

    /// The periodic work: write held increments to the spool, follow epoch changes, publish
    /// the profiles whose turn has come, write summary and kallsyms files, apply retention.
    /// Returns what its spool and publish steps cost.
    pub fn tick(&mut self) -> TickCpu {
        self.tick_at(Instant::now())
    }

    /// [`Store::tick`] with an explicit clock (tests simulate the passing of time).
    pub fn tick_at(&mut self, now: Instant) -> TickCpu {
        use crate::sys::time::thread_cpu_ns;
        let _busy = Busy::mark(Arc::clone(&self.busy_since));
        let c0 = thread_cpu_ns();
        let t1 = self.spool_step(now);
        let c1 = thread_cpu_ns();
        let published = self.publish_due(now);
        let c2 = thread_cpu_ns();
        let cpu = TickCpu { spool_ns: c1.saturating_sub(c0), publish_ns: c2.saturating_sub(c1) };
        self.refresh_kallsyms(false);
        self.write_side_files(now, false);
        self.publish_marked_epochs(now);
        if published > 0 {
            self.health.last_publish = Some(OpStat {
                unix_ms: unix_ms(SystemTime::now()),
                duration_ms: t1.elapsed().as_secs_f64() * 1e3,
                items: published as u64,
            });
        }
        self.slices_step(false);
        self.maybe_retention(now);
        self.write_marks(now);
        self.refresh_backlog();
        self.settle_logs();
        cpu
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
        // The local spool first: a database that hangs must not keep this flush's samples out
        // of it (a SIGTERM during the hang then loses nothing that was flushed).
        self.ensure_spool_open(now);
        let mut spooled = if self.epoch.is_some() { self.spool_pending(now, false) } else { 0 };
        self.ensure_db_open();
        self.follow_epoch(now);
        // Now with the database: what the spool cannot take is published straight into it.
        spooled += self.spool_pending(now, true);
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
        let _busy = Busy::mark(Arc::clone(&self.busy_since));
        let now = Instant::now();
        let t1 = self.spool_step(now);
        self.renew_lease(now, true);
        // Slices first, then their freshness marks: profiles are published up to the last
        // mark (FORMAT.md §7.3), which now covers everything spooled.
        self.slices_step(true);
        self.write_side_files(now, true);
        self.fresh.new_marks.clear();
        let result = self.publish_all(now, None, Upto::Everything);
        self.refresh_kallsyms(false);
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
        self.settle_logs();
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

    /// A snapshot for `dcpictl status`.
    pub fn status(&self) -> StoreStatus {
        let h = &self.health;
        let mut bytes = h.bytes.clone();
        bytes.spool = self.spool.as_ref().map_or(0, spool::Spool::bytes_appended);
        StoreStatus {
            epoch: self.epoch.as_ref().map(ToString::to_string),
            last_flush: h.last_flush.clone(),
            last_publish: h.last_publish.clone(),
            spool_rows: h.backlog.0,
            spool_bytes: h.backlog.1,
            spool_quarantined: self.spool.as_ref().map_or(0, spool::Spool::quarantined),
            dirty_profiles: self.schedule.len() as u64,
            pending_batches: self.pending.len() as u64,
            pending_bytes: self.pending.bytes(),
            pending_samples: self.pending.held_samples(),
            max_memory_bytes: self.cfg.max_memory_bytes,
            dropped_samples: self.pending.dropped_samples,
            dropped_batches: self.pending.dropped_batches,
            published_files: h.published_files,
            corrupt_files_set_aside: h.corrupt_files,
            bytes_written: bytes,
            db_error: h.db_error.clone(),
            spool_error: h.spool_error.clone(),
            last_set_aside: h.last_set_aside.clone(),
            newer_format_files: h.newer_files.len() as u64,
            last_newer_format: h.last_newer.clone(),
            lease_file: self.lease.mine.as_ref().and_then(|l| {
                Some(
                    Database::open(&self.cfg.db)
                        .ok()?
                        .lease_path(&l.host)
                        .ok()?
                        .display()
                        .to_string(),
                )
            }),
            lease_renewed_unix_ms: self.lease.mine.as_ref().map_or(0, |l| l.renewed_unix_ms),
            lease_lost_to: self.lease.lost_to.clone(),
            kallsyms_refreshes: self.kernel.refreshes,
            kallsyms_changes: self.kernel.changed,
            symbol_tables: self.symtabs.counters().status(),
            // Known only outside the store (its status is taken between operations).
            publish_stalled_since_unix_ms: None,
        }
    }

    // ---- internals ----

    // Errors are logged once per change of state (failing / working), not once per attempt:
    // `set_*` logs on entering the failing state; `clear_*` only records success, and
    // `settle_logs`, at the end of each operation, logs the recovery if the operation ended
    // without error. A database that fails for one file and works for the next within one
    // tick, every tick, is one failing state, not two log lines per tick.

    fn set_db_error(&mut self, e: &dyn std::fmt::Display) {
        let msg = e.to_string();
        if !self.health.db_error_logged {
            tracing::error!(db = %self.cfg.db.display(), error = %msg,
                "store: cannot write the profile database; keeping data in the spool (in memory, bounded, while the spool cannot take it) and retrying every flush");
            self.health.db_error_logged = true;
        }
        self.health.db_error = Some(msg);
        self.created_dirs.clear();
    }

    fn clear_db_error(&mut self) {
        self.health.db_error = None;
    }

    fn set_spool_error(&mut self, e: &dyn std::fmt::Display) {
        let msg = e.to_string();
        if !self.health.spool_error_logged {
            tracing::error!(spool = %self.cfg.spool.display(), error = %msg,
                "store: cannot write the spool; publishing straight to the database (what it cannot take is held in memory, bounded) and retrying every flush");
            self.health.spool_error_logged = true;
        }
        self.health.spool_error = Some(msg);
    }

    fn clear_spool_error(&mut self) {
        self.health.spool_error = None;
    }

    /// Log the recoveries of the operation that ends (see above).
    fn settle_logs(&mut self) {
        let h = &mut self.health;
        if h.db_error.is_none() && h.db_error_logged {
            h.db_error_logged = false;
            tracing::info!(db = %self.cfg.db.display(), "store: profile database writable again");
        }
        if h.spool_error.is_none() && h.spool_error_logged {
            h.spool_error_logged = false;
            tracing::info!(spool = %self.cfg.spool.display(), "store: spool writable again");
        }
    }

    fn ensure_open(&mut self, now: Instant) {
        self.ensure_db_open();
        self.ensure_spool_open(now);
    }

    fn ensure_db_open(&mut self) {
        self.db_gate();
        if self.db.is_none() {
            let mut aside = Vec::new();
            let r = create_database(&self.cfg.db, &mut |p, why| aside.push((p.to_path_buf(), why)));
            for (p, why) in aside {
                self.note_set_aside(&p, &why);
            }
            match r {
                Ok(db) => {
                    self.db = Some(db);
                    if !self.tmp_cleaned {
                        self.tmp_cleaned = true;
                        self.clean_stale_tmp();
                    }
                }
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
    }

    /// Injected fault ([`crate::faults::Faults::stall_db`]): while that file exists, every
    /// database phase of the store blocks, as on a hung NFS server.
    fn db_gate(&self) {
        if let Some(trigger) = &self.stall_db {
            while trigger.exists() {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    fn ensure_spool_open(&mut self, now: Instant) {
        if self.spool.is_none() {
            let dir = self.spool_dir();
            adopt_shared_spool(&self.cfg.spool, &dir);
            match Spool::open(&dir, self.cfg.publish_interval) {
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
                        self.schedule.mark(k, now, self.cfg.publish_interval, None);
                    }
                    self.refresh_backlog();
                }
                Err(e) => self.set_spool_error(&e),
            }
        }
    }

    /// Remove the temporary files (`.tmp-*`) that a killed writer left in this host's
    /// directories (every epoch), once, when the database is first opened. Only this host's
    /// directories (no other host writes there, FORMAT.md §2) and only files older than
    /// [`STALE_TMP_AGE`]: a write in progress is never that old.
    fn clean_stale_tmp(&mut self) {
        let Some(db) = self.db.clone() else { return };
        let epochs = match db.epochs() {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(error = %e, "store: cannot list epochs to clean stale temporary files");
                return;
            }
        };
        let mut removed = 0;
        for e in epochs {
            let Ok(hd) = db.host_dir(&e, &self.cfg.host) else { continue };
            match hd.remove_stale_tmp(SystemTime::now(), STALE_TMP_AGE) {
                Ok(n) => removed += n,
                Err(e) => tracing::warn!(error = %e, "store: cannot clean stale temporary files"),
            }
        }
        if removed > 0 {
            tracing::info!(
                files = removed,
                "store: removed temporary files left by a killed writer"
            );
        }
    }

    fn refresh_backlog(&mut self) {
        if let Some(sp) = &self.spool {
            self.health.backlog = sp.backlog();
        }
    }

    /// Append held batches to the spool, oldest first, one record each; with `direct`, a
    /// batch the spool cannot take is published straight to the database
    /// ([`Store::publish_direct`]). Returns the increments written.
    fn spool_pending(&mut self, now: Instant, direct: bool) -> usize {
        let mut written = 0;
        while self.spool.is_some() || direct {
            let Some(batch) = self.pending.pop() else { break };
            let Some(epoch) = batch.epoch.clone().or_else(|| self.epoch.clone()) else {
                self.pending.unpop(batch);
                break;
            };
            if self.spool.is_none() || batch.summarized {
                if !direct {
                    self.pending.unpop(batch);
                    break;
                }
                self.fresh.poison(&epoch);
                match self.publish_direct(&epoch, batch) {
                    Ok(n) => {
                        written += n;
                        continue;
                    }
                    Err(batch) => {
                        self.pending.unpop(batch);
                        break;
                    }
                }
            }
            // Load the summary before appending, so that it is not built from the spool's
            // deltas with this one already among them.
            self.summary_for(&epoch);
            let delta = summaries::delta_of(
                &batch,
                self.pending.dropped_unreported,
                &self.host.events,
                &self.host.event_times,
            );
            let incs = batch.increments();
            let Some(sp) = self.spool.as_mut() else { break };
            let result = sp.append(epoch.as_str(), &incs, &delta, now);
            let n_incs = incs.len();
            drop(incs);
            match result {
                Ok(seq) => {
                    self.fresh.spooled(batch.arrival, seq);
                    written += n_incs;
                    self.pending.written(batch.profiles.iter().map(pending::samples_of).sum());
                    self.pending.dropped_unreported = 0;
                    self.host.event_times.iter_mut().for_each(|t| *t = (0, 0));
                    summaries::apply(self.summary_for(&epoch), &delta);
                    self.summaries.dirty.insert(epoch.to_string());
                    for p in batch.profiles.into_iter().chain(batch.who_profiles) {
                        let key = SpoolKey {
                            epoch: epoch.to_string(),
                            image: p.image.map(|(id, _)| id),
                            event: p.desc.name,
                        };
                        let samples = p.counts.iter().fold(0u64, |a, (_, c)| a.saturating_add(*c));
                        self.schedule.mark(key, now, self.cfg.publish_interval, Some(samples));
                    }
                    self.clear_spool_error();
                }
                Err(e) => {
                    self.set_spool_error(&e);
                    if !direct {
                        self.pending.unpop(batch);
                        break;
                    }
                    self.fresh.poison(&epoch);
                    match self.publish_direct(&epoch, batch) {
                        Ok(n) => written += n,
                        Err(batch) => {
                            self.pending.unpop(batch);
                            break;
                        }
                    }
                }
            }
        }
        if self.spool.is_some() {
            written += self.spool_stacks(now);
        }
        written
    }

    /// Publish a batch that the spool cannot take straight into the database, profile by
    /// profile ([`publish::write_direct`]), so that a full or failing spool does not stop
    /// publishing. On a failure the batch comes back without the profiles already written
    /// (held, within the memory bound, and retried at the next flush). Returns the profiles
    /// written.
    fn publish_direct(
        &mut self,
        epoch: &EpochId,
        mut batch: PendingBatch,
    ) -> Result<usize, PendingBatch> {
        let hd = match self.check_lease().and_then(|()| self.host_dir(epoch)) {
            Ok(hd) => hd,
            Err(e) => {
                self.set_db_error(&e);
                return Err(batch);
            }
        };
        // The summary delta of the whole batch goes in with its first profile.
        let mut delta = (!batch.summarized).then(|| {
            self.summary_for(epoch);
            summaries::delta_of(
                &batch,
                self.pending.dropped_unreported,
                &self.host.events,
                &self.host.event_times,
            )
        });
        let mut written = 0;
        loop {
            // Flat profiles first (they hold the samples), then the per-process and
            // per-cgroup ones; each is taken off the batch once it is in the database.
            let flat = !batch.profiles.is_empty();
            let list = if flat { &batch.profiles } else { &batch.who_profiles };
            let Some(p) = list.last() else { break };
            let key = SpoolKey {
                epoch: epoch.to_string(),
                image: p.image.as_ref().map(|(id, _)| id.clone()),
                event: p.desc.name.clone(),
            };
            if flat {
                // Samples without a spool sequence cannot be told to be the stub's command's
                // alone: the stub becomes a copy of the flat profile first (FORMAT.md §5.6.1).
                if let Err(e) = self.end_stub(&hd, &key) {
                    self.set_db_error(&e);
                    return Err(batch);
                }
            }
            let mut aside = Vec::new();
            let r = publish::write_direct(&hd, &key, p, &self.cfg.host, &mut |path, e| {
                aside.push((path.to_path_buf(), e.to_string()))
            });
            let samples = if flat { pending::samples_of(p) } else { 0 };
            for (path, e) in aside {
                self.set_aside(&path, &e);
            }
            match r {
                Ok(publish::Direct::Written(bytes)) => {
                    self.health.bytes.profiles += bytes;
                    self.health.published_files += 1;
                    self.pending.written(samples);
                }
                Ok(publish::Direct::Discarded) => self.pending.discard(samples),
                Err(e) => {
                    self.set_db_error(&e);
                    return Err(batch);
                }
            }
            if flat {
                batch.profiles.pop();
            } else {
                batch.who_profiles.pop();
            }
            written += 1;
            if let Some(d) = delta.take() {
                batch.summarized = true;
                self.pending.dropped_unreported = 0;
                self.host.event_times.iter_mut().for_each(|t| *t = (0, 0));
                summaries::apply(self.summary_for(epoch), &d);
            }
            self.summaries.dirty.insert(epoch.to_string());
            self.clear_db_error();
        }
        Ok(written)
    }

    /// Publish the profiles whose turn has come, oldest turn first, a bounded number per tick
    /// so that writes are spread over the publish interval.
    fn publish_due(&mut self, now: Instant) -> usize {
        self.db_gate();
        self.renew_lease(now, false);
        if self.check_lease().is_err() {
            return 0;
        }
        let ticks = (self.cfg.publish_interval.as_secs_f64()
            / self.cfg.flush_interval.as_secs_f64())
        .max(1.0);
        let cap = ((2.0 * self.schedule.len() as f64 / ticks).ceil() as usize).max(8);
        let due = self.schedule.due(now, cap, self.cfg.publish_max_delay);
        let mut n = 0;
        for key in due {
            match self.publish_key(&key, Upto::Mark) {
                Ok(samples) => {
                    n += 1;
                    self.schedule.done(key, now, samples);
                    self.clear_db_error();
                }
                Err(e) => {
                    self.note_publish_error(&e);
                    break;
                }
            }
        }
        self.remark_held_back(now);
        n
    }

    /// Profiles whose newest increments the freshness cap held back (FORMAT.md §7.3) stay
    /// due: at their next turn, or as soon as a mark covers them.
    fn remark_held_back(&mut self, now: Instant) {
        for key in std::mem::take(&mut self.fresh.held_back) {
            self.schedule.mark(key, now, self.cfg.publish_interval, None);
        }
    }

    /// Epochs other than the current one that got a new freshness mark: publish what the
    /// cap held back of them now (a closing epoch is complete a tick after its last slice).
    fn publish_marked_epochs(&mut self, now: Instant) {
        let marked = std::mem::take(&mut self.fresh.new_marks);
        for e in marked {
            if Some(&e) != self.epoch.as_ref() && self.schedule.has_epoch(e.as_str()) {
                if let Err(err) = self.publish_all(now, Some(e.as_str()), Upto::Mark) {
                    tracing::debug!(epoch = %e, error = %err, "store: held-back profiles not published yet");
                }
            }
        }
    }

    fn note_publish_error(&mut self, e: &StoreError) {
        match e {
            StoreError::Spool(se) => self.set_spool_error(se),
            other => self.set_db_error(other),
        }
    }

    /// Publish every dirty profile (of `epoch`, or all), each up to `upto`.
    fn publish_all(
        &mut self,
        now: Instant,
        epoch: Option<&str>,
        upto: Upto,
    ) -> Result<(), StoreError> {
        self.db_gate();
        self.check_lease()?;
        for key in self.schedule.all(epoch) {
            match self.publish_key(&key, upto) {
                Ok(samples) => {
                    self.schedule.done(key, now, samples);
                    self.clear_db_error();
                }
                Err(e) => {
                    self.note_publish_error(&e);
                    self.remark_held_back(now);
                    return Err(e);
                }
            }
        }
        self.remark_held_back(now);
        Ok(())
    }

    /// This host's directory of `epoch`, created if needed. Checked (`lstat`, FORMAT.md §6.1)
    /// at every use, not only when created: another writer of a shared database may replace
    /// it, `epochs/` or the epoch's directory by a link at any time, and a link would send
    /// this daemon's files (and its removals of temporaries) wherever it points, as root.
    fn host_dir(&mut self, epoch: &EpochId) -> Result<HostDir, StoreError> {
        let db = self.db.clone().ok_or_else(|| StoreError::NoDatabase(self.cfg.db.clone()))?;
        let hd = db.host_dir(epoch, &self.cfg.host)?;
        let known = self.created_dirs.contains(&hd.path);
        let current = self.epoch.clone();
        let mut aside = Vec::new();
        let r = enter_host_dir(&db, &hd, known, current.as_ref(), &mut |p, why| {
            aside.push((p.to_path_buf(), why))
        });
        for (p, why) in aside {
            self.note_set_aside(&p, &why);
            self.created_dirs.clear();
        }
        r?;
        self.created_dirs.insert(hd.path.clone());
        Ok(hd)
    }

    /// Merge one profile's spooled increments into its file, exactly once. Returns the
    /// samples of the file written, `None` if nothing was (and for stack files, which are
    /// rewritten at every turn).
    fn publish_key(&mut self, key: &SpoolKey, upto: Upto) -> Result<Option<u64>, StoreError> {
        if stacks::is_stacks_key(key) {
            return self.publish_stacks(key).map(|()| None);
        }
        // Flat profiles only up to the freshness mark (FORMAT.md §7.3); the rest at a later
        // turn. Per-process profiles have no time axis: never held back.
        let cap = match EpochId::parse(&key.epoch) {
            Ok(e) if !publish::is_qualified(key) => {
                // Its recorded marks (a restart) are the cap until a newer one.
                self.summary_for(&e);
                match upto {
                    Upto::Mark => self.fresh.cap(&e, !self.slices.settings_interval().is_zero()),
                    Upto::Everything => None,
                }
            }
            _ => None,
        };
        let spool =
            self.spool.as_mut().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
        let mut incs = spool.increments(key);
        if let Some(cap) = cap {
            let all = incs.len();
            incs.retain(|r| r.seq <= cap);
            if incs.len() < all {
                self.fresh.held_back.push(key.clone());
            }
        }
        let Some(last_seq) = incs.last().map(|r| r.seq) else { return Ok(None) };
        let Some(target) = publish::Target::of(key) else {
            // Logged by `Target::of`; nothing can be published under a name that is invalid.
            spool.published(key, last_seq);
            return Ok(None);
        };
        let hd = self.host_dir(&target.epoch)?;
        // A per-command profile standing for the flat one (FORMAT.md §5.6.1): its increments
        // are the flat profile's, which marks them published as it takes them.
        let per_command = target.who.as_deref().is_some_and(|w| w.starts_with("cmd-"));
        let stub = if target.image.is_some() && (per_command || target.who.is_none()) {
            self.sole.stub_of(&hd, key)?
        } else {
            None
        };
        let mut path = target.path(&hd, key);
        if per_command && stub.as_deref() == Some(path.as_path()) {
            return Ok(None);
        }
        let mut existing = publish::read_existing(&path);
        if let Err(publish::Existing::Corrupt(e)) = &existing {
            if let (true, Some(cont)) =
                (is_newer(e, &path), profile_format::continuation_path(&path))
            {
                // Never set aside nor overwritten: its samples stay; ours continue beside it.
                let e = profile_format::Error::Invalid {
                    what: "profile",
                    value: path.display().to_string(),
                    detail: e.to_string(),
                };
                self.note_newer(&path, &e);
                path = cont;
                existing = publish::read_existing(&path);
            }
        }
        let existing = match existing {
            Ok(p) => p,
            Err(publish::Existing::Io(e)) => return Err(e.into()),
            Err(publish::Existing::Corrupt(e)) => {
                self.set_aside(&path, &e);
                None
            }
        };
        if per_command && stub.is_none() && existing.is_none() && path == target.path(&hd, key) {
            if let Some(done) = self.publish_sole_stub(key, &target, &hd, &path, &incs)? {
                return Ok(done);
            }
        }
        // The flat profile of an image with a stub: before it takes an increment that is not
        // all the stub's command's, the stub becomes a copy of it as it is now.
        let before = stub.as_ref().map(|_| existing.clone());
        let spool =
            self.spool.as_mut().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
        let merged = target.merge(existing, &incs, spool, &self.cfg.host)?;
        if let Some(mismatch) = &merged.set_aside {
            self.set_aside(&path, mismatch);
        }
        let mut sole_command = None;
        if let (Some(stub), Some(before), Some(_)) = (&stub, before, &merged.profile) {
            let cmd = sole::command_key(key, stub);
            let published_seq = before.as_ref().map_or(0, |p| p.header.sequence);
            let spool =
                self.spool.as_mut().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
            let keep = match &cmd {
                Some(c) => sole::all_of_one_command(spool, &incs, published_seq, c)?,
                None => false,
            };
            if keep {
                sole_command = cmd;
            } else {
                self.health.bytes.profiles += sole::replace_stub(stub, before)?;
                self.sole.remove(&hd, key);
                if let Some(c) = cmd {
                    // Its increments above the copy's sequence are merged at its next turn.
                    let now = Instant::now();
                    self.schedule.mark(c, now, self.cfg.publish_interval, None);
                }
            }
        }
        let mut written = None;
        if let Some(mut m) = merged.profile {
            written = Some(m.header.total_samples);
            // Stamped with the mark it is complete up to, so that readers find it.
            m.header.sequence = m.header.sequence.max(last_seq).max(cap.unwrap_or(0));
            self.health.bytes.profiles += m.write(&path)?;
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
            if let Some(c) = &sole_command {
                // The stub's command's increments of these flushes are in the flat profile.
                sp.published(c, last_seq);
            }
        }
        Ok(written)
    }

    /// Replace the sole-command stub of the flat profile of `key`, if any, by a copy of the
    /// flat profile as it is.
    fn end_stub(&mut self, hd: &HostDir, key: &SpoolKey) -> Result<(), profile_format::Error> {
        let Some(stub) = self.sole.stub_of(hd, key)? else { return Ok(()) };
        let Some(image) = key.image.as_deref().and_then(|t| profile_format::ImageId::parse(t).ok())
        else {
            return Ok(());
        };
        let flat = match publish::read_existing(&hd.profile_path(&image, &key.event)) {
            Ok(p) => p,
            Err(publish::Existing::Io(e)) => return Err(e),
            Err(publish::Existing::Corrupt(_)) => None,
        };
        self.health.bytes.profiles += sole::replace_stub(&stub, flat)?;
        self.sole.remove(hd, key);
        if let Some(c) = sole::command_key(key, &stub) {
            // Its spooled increments above the copy's sequence are merged at its next turn.
            self.schedule.mark(c, Instant::now(), self.cfg.publish_interval, None);
        }
        Ok(())
    }

    /// Publish a per-command profile that has no file yet as a sole-command stub (FORMAT.md
    /// §5.6.1) if its command's samples up to the flat profile's `sequence` are exactly the
    /// flat profile's. `None`: not so, publish it as usual. Its increments above that
    /// sequence stay spooled: the flat profile marks them published as it takes them.
    fn publish_sole_stub(
        &mut self,
        key: &SpoolKey,
        target: &publish::Target,
        hd: &HostDir,
        path: &Path,
        incs: &[spool::SpooledIncrement],
    ) -> Result<Option<Option<u64>>, StoreError> {
        let Some(image) = &target.image else { return Ok(None) };
        let flat_key = SpoolKey {
            epoch: key.epoch.clone(),
            image: Some(image.to_text()),
            event: key.event.clone(),
        };
        // A cheap refusal first: the flat profile is read only when it may be this one's (the
        // file holds at least what this daemon last published into it).
        if let Some(flat_samples) = self.schedule.published_samples(&flat_key) {
            let spool =
                self.spool.as_mut().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
            let all = target.merge(None, incs, spool, &self.cfg.host)?;
            if all.profile.is_none_or(|p| p.header.total_samples < flat_samples) {
                return Ok(None);
            }
        }
        let Ok(Some(flat)) = publish::read_existing(&hd.profile_path(image, &key.event)) else {
            return Ok(None);
        };
        let upto = flat.header.sequence;
        let covered: Vec<_> = incs.iter().filter(|i| i.seq <= upto).cloned().collect();
        if covered.is_empty() || flat.header.total_samples == 0 {
            return Ok(None);
        }
        let spool =
            self.spool.as_mut().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
        let merged = target.merge(None, &covered, spool, &self.cfg.host)?;
        let Some(mine) = merged.profile else { return Ok(None) };
        let Some(ProfileWho::Command { command }) = &mine.who else { return Ok(None) };
        if mine.counts != flat.counts || mine.header.total_period != flat.header.total_period {
            return Ok(None);
        }
        let stub = Profile::sole_command_stub(&flat.header, command.clone(), upto);
        self.health.bytes.profiles += stub.write(path)?;
        self.health.published_files += 1;
        self.sole.insert(hd, key, path.to_path_buf());
        if let Some(sp) = self.spool.as_mut() {
            sp.published(key, upto);
        }
        Ok(Some(None))
    }

    fn set_aside(&mut self, path: &Path, why: &dyn std::fmt::Display) {
        publish::set_aside(path, why);
        self.note_set_aside(path, &why.to_string());
    }

    /// Counted and shown in the status (`corrupt_files_set_aside`, `last_set_aside`).
    fn note_set_aside(&mut self, path: &Path, why: &str) {
        self.health.corrupt_files += 1;
        self.health.last_set_aside = Some(format!("{}: {why}", path.display()));
    }

    /// Set aside a database entry that is not a profile (the lease file, a directory), logged
    /// as `what` it is: a FIFO in place of the lease is no "corrupt profile".
    fn set_aside_entry(&mut self, path: &Path, why: &dyn std::fmt::Display, what: &str) {
        match safeio::set_aside(path) {
            Ok(to) => {
                tracing::warn!(file = %path.display(), moved_to = %to.display(), error = %why,
                "store: unusable {what} set aside; replacing it")
            }
            Err(e) => tracing::warn!(file = %path.display(), error = %why, rename_error = %e,
                "store: unusable {what} could not be set aside"),
        }
        self.note_set_aside(path, &format!("{what}: {why}"));
    }

    /// A profile of a newer format version than this build reads (another dcpid version of
    /// this host wrote it, earlier in the epoch: a rolling downgrade). Left as it is, and
    /// shown in the status; this daemon's samples go beside it (FORMAT.md §3.1).
    fn note_newer(&mut self, path: &Path, e: &profile_format::Error) {
        if self.health.newer_files.insert(path.to_path_buf()) {
            tracing::warn!(file = %path.display(), error = %e,
                "store: profile of a newer format version left untouched; this daemon's samples go beside it");
        }
        self.health.last_newer = Some(format!("{}: {e}", path.display()));
    }
}
