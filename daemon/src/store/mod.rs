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

mod lease;
mod pending;
mod publish;
pub mod spool;
mod stacks;
mod summaries;
mod who;
pub use who::WhoProfiles;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use profile_format::{
    Database, EpochId, EventDesc, EventSummary, HostDir, HostSummary, KallsymsSnapshot, Lease,
    StackProfile,
};

use crate::aggregate::Resolved;
pub use pending::Losses;
use pending::{PendingBatch, PendingQueue};
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

/// Where fresh kernel symbol snapshots come from (the daemon: /proc; tests: a fake).
pub trait KernelSymbolSource: Send {
    /// Cheap, read at each tick: changes when a snapshot would (the daemon: the content of
    /// /proc/modules, so that a module loaded or unloaded is noticed within one flush).
    fn fingerprint(&mut self) -> Option<Vec<u8>>;
    /// A fresh snapshot (reads several MB: only when the fingerprint changed, or an epoch
    /// starts).
    fn snapshot(&mut self) -> Result<KallsymsSnapshot, String>;
    /// A fresh snapshot as the bytes of its `kallsyms.snap`, which is all the store keeps.
    /// The default encodes [`Self::snapshot`]; the daemon's source builds the bytes without
    /// the decoded snapshot, which was most of its peak RSS (issue 13).
    fn snapshot_file_bytes(&mut self) -> Result<Vec<u8>, String> {
        self.snapshot()?
            .to_file_bytes(Path::new("kallsyms.snap"))
            .map_err(|e| format!("kallsyms snapshot not kept: {e}"))
    }
}

/// The kernel symbol snapshot to reference from each epoch.
#[derive(Default)]
struct KernelSymbols {
    /// The encoded `kallsyms.snap`: a fraction of the decoded snapshot's memory.
    encoded: Option<Vec<u8>>,
    /// The epoch whose host directory references `encoded` (re-referenced when it changes).
    written: Option<EpochId>,
    source: Option<Box<dyn KernelSymbolSource>>,
    fingerprint: Option<Vec<u8>>,
    /// Snapshots taken after the first one, and how many of them were new content.
    refreshes: u64,
    changed: u64,
    refresh_failing: bool,
}

/// This daemon's lease on its host name (FORMAT.md §2.1).
#[derive(Default)]
struct LeaseState {
    /// Held and renewed.
    mine: Option<Lease>,
    /// `take_lease` was asked for: retried at each tick while the database is unavailable.
    wanted: bool,
    last_renew: Option<Instant>,
    /// Taken over by another daemon: publishing stops.
    lost_to: Option<String>,
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
    summaries: Summaries,
    health: Health,
    created_dirs: HashSet<PathBuf>,
    last_retention: Option<Instant>,
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
        .filter_map(|e| e.ok())
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
    match profile_format::safeio::set_aside(&path) {
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
        Self::open_leased_with_faults(cfg, &crate::faults::Faults::default())
    }

    /// [`Store::open_leased`] with injected faults (tests; see [`crate::faults`]) in force from
    /// the first database operation on.
    pub fn open_leased_with_faults(
        cfg: StoreConfig,
        faults: &crate::faults::Faults,
    ) -> Result<Self, StoreError> {
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
            summaries: Summaries::default(),
            health: Health::default(),
            created_dirs: HashSet::new(),
            last_retention: None,
            crash_after_writes: None,
            lease: LeaseState::default(),
            tmp_cleaned: false,
            busy_since: Arc::new(AtomicU64::new(0)),
            stall_db: None,
            who: who::WhoAccum::default(),
            stacks: stacks::PendingStacks::default(),
        }
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

    /// Take the lease on this host name in the database (FORMAT.md §2.1), or fail with
    /// [`StoreError::LeaseHeld`] naming the live daemon that holds it. A stale lease (its
    /// owner dead on this machine, or not renewed for several of its intervals) is taken over,
    /// and that is logged. Other failures (the database unavailable now) are returned too;
    /// the store then keeps trying at each tick.
    pub fn take_lease(&mut self) -> Result<(), StoreError> {
        self.lease.wanted = true;
        let mut aside = Vec::new();
        let db = create_database(&self.cfg.db, &mut |p, why| aside.push((p.to_path_buf(), why)));
        for (p, why) in aside {
            self.note_set_aside(&p, &why);
        }
        let db = db?;
        let interval_ms = self.cfg.publish_interval.as_millis().min(u128::from(u64::MAX)) as u64;
        let me = lease::mine(&self.cfg.host, interval_ms);
        let path = db.lease_path(&self.cfg.host)?;
        // A few rounds: another daemon may create or take over the lease between our read and
        // our write; the round after sees it.
        for _ in 0..3 {
            let held = match db.read_lease(&self.cfg.host) {
                Ok(h) => h,
                Err(e @ profile_format::Error::Io { .. }) => return Err(e.into()),
                Err(profile_format::Error::NotDirectory { path: dir, kind }) => {
                    // `leases/` is a link (or a file): never written through; a fresh one is
                    // made in its place by `create_lease`.
                    self.set_aside_entry(
                        &dir,
                        &format!("is {kind}, not a directory"),
                        "leases directory",
                    );
                    None
                }
                Err(e) => {
                    // Not a lease (corrupt, a FIFO, a link, ...): nobody can prove ownership
                    // with it. Read without following a link nor blocking on a FIFO (safeio).
                    self.set_aside_entry(&path, &e, "lease file");
                    None
                }
            };
            match held {
                None => {
                    if db.create_lease(&me)? {
                        tracing::info!(lease = %path.display(), "store: took the lease on this host name");
                        return self.hold_lease(me);
                    }
                }
                Some(h) if profile_format::same_owner(&h, &me) => return self.hold_lease(me),
                Some(h) => match lease::stale_reason(&h, &me, lease::unix_ms_now()) {
                    None => {
                        return Err(StoreError::LeaseHeld {
                            host: self.cfg.host.clone(),
                            db: self.cfg.db.clone(),
                            owner: lease::describe(&h, lease::unix_ms_now()),
                            lease: path,
                        })
                    }
                    Some(why) => {
                        tracing::warn!(lease = %path.display(), previous_owner = %h, reason = %why,
                            "store: taking over a stale lease on this host name");
                        db.write_lease(&me)?;
                        if db
                            .read_lease(&self.cfg.host)?
                            .is_some_and(|l| profile_format::same_owner(&l, &me))
                        {
                            return self.hold_lease(me);
                        }
                    }
                },
            }
        }
        Err(StoreError::LeaseHeld {
            host: self.cfg.host.clone(),
            db: self.cfg.db.clone(),
            owner: "another daemon taking it at the same time".into(),
            lease: path,
        })
    }

    /// Whether the host name is free to take, without creating or changing anything: for the
    /// daemon's start, before any thread runs. `Err(LeaseHeld)` if a live daemon holds it;
    /// `Ok` otherwise (no database yet, no lease, a stale or unreadable one: [`Store::take_lease`]
    /// decides those for real).
    pub fn check_lease_free(cfg: &StoreConfig) -> Result<(), StoreError> {
        let Ok(db) = Database::open(&cfg.db) else { return Ok(()) };
        let Ok(Some(held)) = db.read_lease(&cfg.host) else { return Ok(()) };
        let me = lease::mine(&cfg.host, 0);
        if profile_format::same_owner(&held, &me)
            || lease::stale_reason(&held, &me, lease::unix_ms_now()).is_some()
        {
            return Ok(());
        }
        Err(StoreError::LeaseHeld {
            host: cfg.host.clone(),
            db: cfg.db.clone(),
            owner: lease::describe(&held, lease::unix_ms_now()),
            lease: db.lease_path(&cfg.host)?,
        })
    }

    fn hold_lease(&mut self, me: Lease) -> Result<(), StoreError> {
        self.lease.mine = Some(me);
        self.lease.last_renew = Some(Instant::now());
        self.lease.lost_to = None;
        Ok(())
    }

    /// Give the lease up (a clean stop), so that a successor need not wait for it to go stale.
    pub fn release_lease(&mut self) {
        let Some(me) = self.lease.mine.take() else { return };
        self.lease.wanted = false;
        if let Some(db) = &self.db {
            if let Err(e) = db.release_lease(&me) {
                tracing::warn!(error = %e, "store: could not release the lease on this host name");
            }
        }
    }

    /// Renew the lease once per publish interval (`force`: now), first checking that it is
    /// still ours: if another daemon took it over, stop publishing. Retake it while wanted
    /// but not yet held (the database was unavailable at start).
    fn renew_lease(&mut self, now: Instant, force: bool) {
        if self.lease.lost_to.is_some() || self.db.is_none() {
            return;
        }
        let Some(mine) = self.lease.mine.clone() else {
            if self.lease.wanted {
                match self.take_lease() {
                    Ok(()) => {}
                    Err(StoreError::LeaseHeld { owner, .. }) => self.lose_lease(owner),
                    Err(e) => self.set_db_error(&e),
                }
            }
            return;
        };
        let due = self
            .lease
            .last_renew
            .is_none_or(|t| now.saturating_duration_since(t) >= self.cfg.publish_interval);
        if !due && !force {
            return;
        }
        let Some(db) = self.db.clone() else { return };
        let r = db.read_lease(&self.cfg.host).map_err(StoreError::from).and_then(|held| {
            if let Some(h) = held.filter(|h| !profile_format::same_owner(h, &mine)) {
                return Ok(Some(h));
            }
            let mut renewed = mine.clone();
            renewed.renewed_unix_ms = lease::unix_ms_now();
            db.write_lease(&renewed)?;
            self.lease.mine = Some(renewed);
            Ok(None)
        });
        match r {
            Ok(None) => self.lease.last_renew = Some(now),
            Ok(Some(other)) => self.lose_lease(lease::describe(&other, lease::unix_ms_now())),
            Err(e) => self.set_db_error(&e),
        }
    }

    fn lose_lease(&mut self, owner: String) {
        tracing::error!(host = %self.cfg.host, owner = %owner,
            "store: another daemon holds this host name now; publishing stops, data stays in the spool");
        self.lease.mine = None;
        self.lease.lost_to = Some(owner);
    }

    /// `Err` if the lease on the host name was lost: nothing may be written into its
    /// directories any more.
    fn check_lease(&self) -> Result<(), StoreError> {
        match &self.lease.lost_to {
            Some(owner) => {
                Err(StoreError::LeaseLost { host: self.cfg.host.clone(), owner: owner.clone() })
            }
            None => Ok(()),
        }
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

    /// Where to take fresh kernel symbol snapshots from: one is taken now, again when the
    /// source's fingerprint changes (a module loaded or unloaded; checked at each tick) and
    /// whenever an epoch starts. Each is stored only if its content is new (FORMAT.md §8.1).
    pub fn set_kallsyms_source(&mut self, mut source: Box<dyn KernelSymbolSource>) {
        self.kernel.fingerprint = source.fingerprint();
        match source.snapshot_file_bytes() {
            Ok(bytes) => self.set_kallsyms_bytes(bytes),
            Err(e) => {
                tracing::warn!(error = %e, "no kallsyms snapshot; kernel samples will not be symbolized")
            }
        }
        self.kernel.source = Some(source);
    }

    /// Take a fresh snapshot if `force` (a new epoch) or the source's fingerprint changed;
    /// the current epoch references it from then on.
    fn refresh_kallsyms(&mut self, force: bool) {
        let Some(source) = self.kernel.source.as_mut() else { return };
        let fp = source.fingerprint();
        if !force && fp == self.kernel.fingerprint {
            return;
        }
        let bytes = match source.snapshot_file_bytes() {
            Ok(s) => s,
            Err(e) => {
                // Keep the old one; retried at each tick, logged once until it works again.
                if !self.kernel.refresh_failing {
                    tracing::warn!(error = %e, "store: could not refresh the kallsyms snapshot; keeping the previous one");
                    self.kernel.refresh_failing = true;
                }
                return;
            }
        };
        if std::mem::take(&mut self.kernel.refresh_failing) {
            tracing::info!("store: kallsyms snapshot refreshed again");
        }
        self.kernel.fingerprint = fp;
        self.kernel.refreshes += 1;
        let old = self.kernel.encoded.take();
        let old_written = self.kernel.written.take();
        self.set_kallsyms_bytes(bytes);
        if self.kernel.encoded == old {
            // Same content: the epoch that references it already need not be written again.
            self.kernel.written = old_written;
        } else {
            self.kernel.changed += 1;
            tracing::info!(
                "store: kernel symbols changed; new kallsyms snapshot for the current epoch"
            );
        }
    }

    /// The kernel symbol snapshot: stored once per database, referenced from each epoch's
    /// host directory.
    pub fn set_kallsyms(&mut self, snap: KallsymsSnapshot) {
        match snap.to_file_bytes(Path::new("kallsyms.snap")) {
            Ok(b) => self.set_kallsyms_bytes(b),
            Err(e) => {
                tracing::warn!(error = %e, "kallsyms snapshot not kept; kernel samples will not be symbolized");
                self.kernel.encoded = None;
                self.kernel.written = None;
            }
        }
    }

    /// [`Self::set_kallsyms`] with the snapshot already encoded (`kallsyms.snap`'s bytes).
    fn set_kallsyms_bytes(&mut self, mut bytes: Vec<u8>) {
        bytes.shrink_to_fit();
        self.kernel.encoded = Some(bytes);
        self.kernel.written = None;
    }

    pub fn current_epoch(&self) -> Option<&EpochId> {
        self.epoch.as_ref()
    }

    /// Test hook: make the n-th following profile write fail right after its rename (before
    /// the spool is told), as a crash there would.
    #[doc(hidden)]
    pub fn inject_faults(&mut self, faults: &crate::faults::Faults) {
        self.crash_after_writes = faults.crash_after_writes;
        self.stall_db.clone_from(&faults.stall_db);
    }

    /// Take a resolved batch (plus the sampler's lost/throttled counts since the previous
    /// batch) into memory; written to the spool by the next `tick`.
    pub fn add(&mut self, mut resolved: Resolved, lost: u64, throttled: u64) {
        self.who_add(&resolved.who);
        self.stacks_add(std::mem::take(&mut resolved.stacks));
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
            self.who.profiles,
            &mut unknown_event,
        ) {
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
        let result = self.publish_all(now, None);
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

    /// Close the current epoch with everything flushed into it and start a new one.
    pub fn new_epoch(&mut self) -> Result<EpochId, StoreError> {
        self.flush_everything()?;
        let _busy = Busy::mark(Arc::clone(&self.busy_since));
        let db = self.db.as_ref().ok_or_else(|| StoreError::NoDatabase(self.cfg.db.clone()))?;
        let e = db.new_epoch(SystemTime::now(), &self.cfg.host)?;
        tracing::info!(epoch = %e, "store: started a new epoch");
        self.epoch = Some(e.clone());
        self.refresh_kallsyms(true);
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

    /// Follow a new epoch started elsewhere: everything collected so far belongs to the old one.
    fn follow_epoch(&mut self, now: Instant) {
        let Some(db) = &self.db else { return };
        // One stat per flush instead of a listing: the epochs directory changes when an epoch
        // starts or goes away, and a listing is reused only while it stays the same.
        let stamp = db.epochs_stamp();
        let newest = match (stamp, &self.epochs_seen) {
            (Some(s), Some((seen, e))) if s == *seen => e.clone(),
            _ => {
                let listed_at = SystemTime::now();
                match db.current_epoch_settled() {
                    Ok((n, settled)) => {
                        self.epochs_seen = stamp
                            .filter(|s| settled && s.settled_at(listed_at))
                            .map(|s| (s, n.clone()));
                        n
                    }
                    Err(e) => {
                        self.epochs_seen = None;
                        self.set_db_error(&e);
                        return;
                    }
                }
            }
        };
        let Some(old) = self.epoch.clone() else {
            self.epoch = newest;
            return;
        };
        let Some(newest) = newest.filter(|n| *n >= old) else {
            // Our epoch was current, so it had its marker: the database (or this epoch's
            // directory) was removed while we ran.
            self.restore_layout(&old);
            return;
        };
        if newest == old {
            return;
        }
        self.spool_pending(now, true);
        if let Err(e) = self.publish_all(now, Some(old.as_str())) {
            tracing::warn!(error = %e, epoch = %old, "store: could not publish all of the closing epoch yet; will retry");
        }
        self.write_side_files(now, true);
        tracing::info!(old = %old, new = %newest, "store: following a new epoch");
        self.epoch = Some(newest);
        self.refresh_kallsyms(true);
    }

    /// The database, or the current epoch's directory, vanished (removed by hand, a wiped
    /// NFS export): recreate the whole layout, not just this host's directory: `epochs/`, the
    /// epoch with its `EPOCH` marker (without it no reader sees the epoch as current), and,
    /// by the following writes, the kernel symbol snapshot and its reference, the summary and
    /// the lease. What was published before is gone; what the spool holds is published again.
    fn restore_layout(&mut self, epoch: &EpochId) {
        let mut aside = Vec::new();
        let mut r = create_database(&self.cfg.db, &mut |p, why| aside.push((p.to_path_buf(), why)))
            .and_then(|db| {
                let created = db.ensure_epoch(epoch, &self.cfg.host)?;
                Ok((db, created))
            });
        for (p, why) in aside {
            self.note_set_aside(&p, &why);
        }
        // A link (or anything but a directory) in place of `epochs/` or the epoch's directory:
        // set aside, never written through (FORMAT.md §6.1), and the layout made afresh.
        for _ in 0..2 {
            let Err(profile_format::Error::NotDirectory { path, kind }) = &r else { break };
            let (path, why) = (path.clone(), format!("is {kind}, not a directory"));
            self.set_aside_entry(&path, &why, "database directory");
            self.created_dirs.clear();
            r = Database::create(&self.cfg.db).and_then(|db| {
                let created = db.ensure_epoch(epoch, &self.cfg.host)?;
                Ok((db, created))
            });
        }
        match r {
            Ok((db, created)) => {
                if created {
                    tracing::warn!(db = %self.cfg.db.display(), epoch = %epoch,
                        "store: the database or the current epoch was removed; recreated its layout");
                }
                self.db = Some(db);
                self.created_dirs.clear();
                self.kernel.written = None;
                self.summaries.dirty.insert(epoch.to_string());
                // Every profile of the epoch must be written again from the cumulative state:
                // not possible for what was published, but the next writes start fresh files.
            }
            Err(e) => self.set_db_error(&e),
        }
    }

    /// The epoch's cumulative summary: in memory, or the published `summary.json` plus the
    /// spool's deltas above the sequence it records.
    fn summary_for(&mut self, epoch: &EpochId) -> &mut HostSummary {
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
                    summaries::apply(&mut s, &d);
                }
            }
            self.summaries.current.insert(key.to_owned(), s);
        }
        self.summaries.current.get_mut(key).expect("inserted above")
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
                Ok(_) => {
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
            match self.publish_key(&key) {
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
        self.db_gate();
        self.check_lease()?;
        for key in self.schedule.all(epoch) {
            match self.publish_key(&key) {
                Ok(samples) => {
                    self.schedule.done(key, now, samples);
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
    fn publish_key(&mut self, key: &SpoolKey) -> Result<Option<u64>, StoreError> {
        if stacks::is_stacks_key(key) {
            return self.publish_stacks(key).map(|()| None);
        }
        let spool =
            self.spool.as_mut().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
        let incs = spool.increments(key);
        let Some(last_seq) = incs.last().map(|r| r.seq) else { return Ok(None) };
        let Some(target) = publish::Target::of(key) else {
            // Logged by `Target::of`; nothing can be published under a name that is invalid.
            spool.published(key, last_seq);
            return Ok(None);
        };
        let hd = self.host_dir(&target.epoch)?;
        let mut path = target.path(&hd, key);
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
        let spool =
            self.spool.as_mut().ok_or_else(|| StoreError::NoSpool(self.cfg.spool.clone()))?;
        let merged = target.merge(existing, &incs, spool, &self.cfg.host)?;
        if let Some(mismatch) = &merged.set_aside {
            self.set_aside(&path, mismatch);
        }
        let mut written = None;
        if let Some(mut m) = merged.profile {
            written = Some(m.header.total_samples);
            m.header.sequence = m.header.sequence.max(last_seq);
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
        }
        Ok(written)
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
        match profile_format::safeio::set_aside(path) {
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
            // `kallsyms/` is a link (or a file): set aside, never written through (FORMAT.md
            // §6.1); the next tick stores the snapshot in a real directory.
            Err(StoreError::Db(profile_format::Error::NotDirectory { path, kind })) => {
                let why = format!("is {kind}, not a directory");
                self.set_aside_entry(&path, &why, "database directory");
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
                n += profile_format::sumidx::write(&s, &idx_path)?;
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
        // The JSON index (§7.1) is no longer written: the binary one holds the same totals.
        s.index = None;
        n += s.write(&hd.summary_path())?;
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
    fn index_of(&mut self, hd: &HostDir) -> Option<profile_format::SummaryIndex> {
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
    fn write_side_files(&mut self, now: Instant, force: bool) {
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
