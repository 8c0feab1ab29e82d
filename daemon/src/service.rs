//! The daemon's life: start order, the flush loop, control commands, signals, shutdown.
//!
//! Start order (ARCHITECTURE.md): check the socket path; create and probe the spool; open every
//! event on every CPU; open the database (first epoch if none); scan /proc; kallsyms snapshot;
//! control socket; READY=1. A failed start removes the empty directories it created. Then every flush
//! interval: take the resolved per-CPU tables into the store, spool, publish what is due,
//! STATUS=, and WATCHDOG=1 only while every drain thread makes progress and no daemon thread
//! died ([`crate::watch`]: status then says `degraded`, and the exit status is 3). SIGTERM/SIGINT (or the
//! end of `--duration`): STOPPING=1, stop sampling, flush everything, publish everything, exit 0
//! (non-zero if samples were dropped: the closing line `dcpid stopped samples=N dropped=D`).
//!
//! SIGHUP or `dcpictl reload` re-reads the configuration file (the command-line flags still
//! win). The keys in [`crate::config::RELOADABLE`] change live; every other key (db, spool,
//! host, events, redraw_interval, window_divisor, ring_pages, socket, ...) needs a restart: its
//! running value is kept and the reload reports it. A configuration with an error is
//! rejected as a whole (file, line, reason) and the running one stays.
//!
//! Exit status: 0 after a clean stop; 2 for a configuration the daemon can never run with
//! (bad event, unwritable database or spool, unusable socket path, sampling not permitted,
//! missing socket group); 1 for other failures to start, a `--duration` run that could not
//! publish everything, or a run that dropped samples (written neither to the spool nor to the
//! database: kept in memory up to `max_memory_mb`, then counted in `dropped_samples`).

use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use crate::aggregate::{Aggregator, Resolved};
use crate::config::{ConfigError, Settings};
use crate::control::{Access, ControlError, ControlServer, Handler, Request, Response};
use crate::notify::Notifier;
use crate::perf::events::{parse_event_list, EventError};
use crate::perf::sampler::{online_cpus, Sampler, SamplerConfig, SamplerError};
use crate::resolve::{Resolver, ResolverConfig};
use crate::status::{RecentWindow, ReloadReport, StatusInputs, StatusReport};
use crate::store::{EventInfo, Store, StoreConfig, StoreError};
use crate::watch::Watch;

/// A drain thread that has not completed a loop for this long withholds WATCHDOG=1.
const PROGRESS_MAX_AGE: Duration = Duration::from_secs(5);

/// How long a flush or `epoch new` waits for the drain threads to read their rings up to the
/// request's instant; a CPU that has not answered by then is named in the response.
const BARRIER_TIMEOUT: Duration = Duration::from_secs(2);

/// A store operation (tick or flush) running longer than this (or two flush intervals, if
/// more) means the database is not answering: `status` reports publishing as stalled.
const STALL_AFTER: Duration = Duration::from_secs(10);
/// Returning freed heap to the kernel after a flush, at most this often (sys::malloc).
const TRIM_EVERY: Duration = Duration::from_secs(60);
/// The main thread's longest sleep outside systemd: signals and `--duration` wake it anyway.
const IDLE_WAKE: Duration = Duration::from_secs(60);
/// How long `dcpictl flush` waits for the store before answering with an error.
const FLUSH_WAIT: Duration = Duration::from_secs(20);
/// At a stop: how long to wait for the flush thread, and for the store's lock.
const STOP_WAIT: Duration = Duration::from_secs(3);
/// At a stop with a database that answers: how long the last publish may take.
const STOP_PUBLISH_WAIT: Duration = Duration::from_secs(60);

/// The outcome of closing a batch at an instant ([`Shared::cut`]).
struct Cut {
    /// The instant (perf clock ns): the batch holds every sample up to it, none after.
    until: u64,
    /// CPUs whose drain thread did not read its ring up to `until` in time.
    unanswered: Vec<u32>,
}

/// Reads the configuration again (file + the original flags) for a reload.
pub type Reloader = Box<dyn Fn() -> Result<Settings, ConfigError> + Send + Sync>;
/// Changes the log filter of the running daemon.
pub type SetLogLevel = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// What `main` lends the service so that it can reload its configuration.
#[derive(Default)]
pub struct Hooks {
    pub reload: Option<Reloader>,
    pub set_log_level: Option<SetLogLevel>,
    /// Tests only: faults injected into the daemon's threads (see [`crate::watch`]).
    pub faults: Option<Arc<dyn crate::watch::FaultInjector>>,
    /// Where systemd notifications go; `None`: from the environment (`NOTIFY_SOCKET`, ...).
    /// Lets a test watch them without changing its process's environment, which other tests
    /// of the same binary read concurrently.
    pub notifier: Option<Notifier>,
}

impl std::fmt::Debug for Hooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hooks")
            .field("reload", &self.reload.is_some())
            .field("set_log_level", &self.set_log_level.is_some())
            .field("faults", &self.faults.is_some())
            .field("notifier", &self.notifier)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("events: {0}")]
    Events(#[from] EventError),
    #[error(
        "sampling not permitted: perf_event_open of `{event}` on CPU {cpu} failed with \
         {errno_name}. System-wide sampling needs root or CAP_PERFMON (CAP_SYS_ADMIN before \
         Linux 5.8), or kernel.perf_event_paranoid <= 0 (it is {paranoid} here). Run dcpid as \
         root or as the systemd unit does, or lower the sysctl; `dcpid --probe` checks."
    )]
    NotPermitted { event: String, cpu: u32, errno_name: &'static str, paranoid: String },
    #[error("database {db} is not writable: {source}")]
    Database {
        db: String,
        #[source]
        source: StoreError,
    },
    #[error("spool {0}: {1}")]
    Spool(String, String),
    /// Another live dcpid holds this host name in the database.
    #[error("{0}")]
    LeaseHeld(StoreError),
    #[error(transparent)]
    Faults(#[from] crate::faults::FaultsError),
    #[error("cannot start sampling: {0}")]
    Sampler(#[from] SamplerError),
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("--socket-group: no group named {0:?}")]
    NoGroup(String),
    #[error("signal handling: {0}")]
    Signals(std::io::Error),
    #[error("cannot start the flush thread: {0}")]
    Thread(String),
    #[error(
        "{why}: could not publish everything that was sampled: {error}; what reached the \
         spool {spool} is published at the next start"
    )]
    Unpublished { why: &'static str, error: String, spool: String },
    #[error("ran degraded: {0}")]
    Degraded(String),
    #[error(
        "dropped {dropped} of the {samples} samples taken: they could be written neither to \
         the spool nor to the database{error}"
    )]
    Dropped { dropped: u64, samples: u64, error: String },
}

impl ServiceError {
    /// Process exit status: 2 for what only a change of configuration or privileges fixes.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Events(_)
            | Self::NotPermitted { .. }
            | Self::Database { .. }
            | Self::Spool(..)
            | Self::LeaseHeld(_)
            | Self::Faults(_)
            | Self::NoGroup(_)
            | Self::Sampler(SamplerError::Config(_))
            | Self::Control(
                ControlError::Io { .. }
                | ControlError::NotASocket { .. }
                | ControlError::BadDirectory { .. },
            ) => 2,
            Self::Degraded(_) => crate::watch::DEGRADED_EXIT_CODE,
            _ => 1,
        }
    }
}

/// `SamplerError` with "not permitted" turned into the one explanation of what to change.
pub fn explain_sampler_error(e: SamplerError) -> ServiceError {
    match e {
        SamplerError::Open { event, cpu, errno_name, source }
            if matches!(source.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM)) =>
        {
            let paranoid = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into());
            ServiceError::NotPermitted { event, cpu, errno_name, paranoid }
        }
        other => ServiceError::Sampler(other),
    }
}

/// Whether a failure to write the database at start is one that waiting will not fix.
fn permanent_db_error(e: &StoreError) -> bool {
    let StoreError::Db(profile_format::Error::Io { source, .. }) = e else { return false };
    matches!(
        source.raw_os_error(),
        Some(
            libc::EACCES
                | libc::EPERM
                | libc::EROFS
                | libc::ENOTDIR
                | libc::EEXIST
                | libc::EISDIR
                | libc::ENAMETOOLONG
                | libc::ELOOP
                | libc::EINVAL
        )
    )
}

/// Directories a start created; removed again (if still empty) unless the start succeeds, so
/// that a failed start leaves nothing behind.
#[derive(Debug, Default)]
struct CreatedDirs {
    dirs: Vec<std::path::PathBuf>,
}

impl CreatedDirs {
    /// `create_dir_all`, remembering each directory it made.
    fn create_all(&mut self, dir: &std::path::Path) -> std::io::Result<()> {
        let missing: Vec<&std::path::Path> = dir
            .ancestors()
            .filter(|a| !a.as_os_str().is_empty())
            .take_while(|a| std::fs::symlink_metadata(a).is_err())
            .collect();
        for d in missing.into_iter().rev() {
            // 0700: the spool holds the symbol names of every user's processes, and only dcpid
            // reads it (under systemd the unit's RuntimeDirectory= makes it, 0750).
            match std::os::unix::fs::DirBuilderExt::mode(&mut std::fs::DirBuilder::new(), 0o700)
                .create(d)
            {
                Ok(()) => self.dirs.push(d.to_path_buf()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The start succeeded: keep them.
    fn keep(mut self) {
        self.dirs.clear();
    }
}

impl Drop for CreatedDirs {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev() {
            // remove_dir, never remove_dir_all: only what is still empty goes.
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// The spool must be a directory that exists or can be created, and that this process can
/// write (a read-only directory or file system, `/proc/x`): checked by creating it and a small
/// file in it. Directories created are recorded in `created`.
fn prepare_spool(spool: &std::path::Path, created: &mut CreatedDirs) -> Result<(), ServiceError> {
    let bad = |d: String| ServiceError::Spool(spool.display().to_string(), d);
    if spool.is_file() {
        return Err(bad(
            "is a file; the spool is a directory (an SQLite spool of an older dcpid? it is \
             published at that dcpid's shutdown; remove it or choose another path)"
                .into(),
        ));
    }
    for a in spool.ancestors().skip(1).filter(|a| !a.as_os_str().is_empty()) {
        match std::fs::metadata(a) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => return Err(bad(format!("{} is not a directory", a.display()))),
            Err(_) => continue,
        }
    }
    created.create_all(spool).map_err(|e| bad(format!("cannot create it: {e}")))?;
    let probe = spool.join(format!(".dcpid-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"dcpid\n")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| bad(format!("cannot write in it: {e}")))
}

fn jit_limits(s: &Settings) -> crate::resolve::jit::JitLimits {
    crate::resolve::jit::JitLimits {
        max_bytes: s.perf_map_max_bytes,
        max_entries: s.perf_map_max_entries,
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// (instant, samples, daemon CPU s, per CPU (cpu, drain wake-ups, drain CPU ns), resolver
/// thread (wake-ups, CPU ns)).
type Tick = (Instant, u64, f64, Vec<(u32, u64, u64)>, (u64, u64));

struct Counters {
    lost: u64,
    throttled: u64,
    unknown_by_reason: BTreeMap<String, u64>,
    resolved_samples: u64,
    /// Cumulative (enabled, running) ns per event as last seen, to turn them into deltas.
    event_times: Vec<(u64, u64)>,
}

/// What the flush loop and the control commands share.
struct Shared {
    /// The settings in force; reload replaces the live-changeable ones.
    settings: RwLock<Settings>,
    hooks: Hooks,
    access: Arc<Access>,
    last_reload: Mutex<Option<ReloadReport>>,
    /// (time, samples so far, daemon CPU seconds, per CPU (cpu, wake-ups, drain CPU ns)) at
    /// the last flush ticks.
    ticks: Mutex<VecDeque<Tick>>,
    /// The flush thread, woken when a reload changes its interval.
    flusher: Mutex<Option<std::thread::Thread>>,
    started: Instant,
    aggregator: Arc<Aggregator>,
    sampler: RwLock<Option<Sampler>>,
    store: Mutex<Store>,
    counters: Mutex<Counters>,
    /// CPU time of the periodic flushes, by stage (for `status`: where the cost goes).
    stages: Mutex<crate::status::StageCpu>,
    /// Last store status, so `status` answers while a slow publish holds the store.
    store_status: Mutex<crate::store::StoreStatus>,
    /// The daemon's threads: which died.
    watch: Arc<Watch>,
    /// The resolver's counters as last read (status does not wait for a flush holding it).
    resolver_stats: Mutex<crate::resolve::ResolverStats>,
    /// When the store's running operation began (0: idle), readable without its lock.
    store_busy: Arc<std::sync::atomic::AtomicU64>,
    /// A `dcpictl flush` is running (possibly stuck on a hung database).
    flush_running: Arc<std::sync::atomic::AtomicBool>,
    /// What a stop needs to spool the last samples when a hung database holds the store.
    store_cfg: StoreConfig,
    events: Vec<EventInfo>,
    /// Samples the store holds in memory and has dropped, readable without its lock (a stop
    /// whose last database operation hangs still says what it loses).
    losses: Arc<crate::store::Losses>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("settings", &self.settings).finish()
    }
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Shared {
    fn settings(&self) -> Settings {
        read(&self.settings).clone()
    }

    /// Give the store the live settings if a reload changed them.
    fn sync_store(&self, store: &mut Store) {
        let s = read(&self.settings);
        let want = store_config(&s);
        if *store.config() != want {
            store.reconfigure(&want);
        }
        store.set_who_by_pid(s.by_pid);
        store.set_who_profiles(who_profiles(&s));
        self.aggregator.set_who_profiles(s.by_pid || s.by_cgroup);
    }

    /// Re-read the configuration and apply what can change live. Never stops the daemon.
    fn reload(&self, trigger: &str) -> ReloadReport {
        let mut rep = ReloadReport {
            unix_ms: unix_ms_now(),
            trigger: trigger.to_string(),
            ..ReloadReport::default()
        };
        let new = match &self.hooks.reload {
            Some(f) => f().map_err(|e| e.to_string()),
            None => Err("this dcpid has no configuration to reload".to_string()),
        };
        match new.and_then(|n| self.apply_reload(n)) {
            Ok((applied, restart)) => {
                rep.ok = true;
                if !restart.is_empty() {
                    tracing::warn!(keys = %restart.join(", "), "reload: these settings need a restart of dcpid; keeping their running values");
                }
                tracing::info!(trigger, applied = %applied.join("; "), "configuration reloaded");
                rep.applied = applied;
                rep.restart_required = restart;
            }
            Err(e) => {
                tracing::error!(trigger, error = %e, "reload rejected; keeping the running configuration");
                rep.error = Some(e);
            }
        }
        *lock(&self.last_reload) = Some(rep.clone());
        rep
    }

    fn apply_reload(&self, new: Settings) -> Result<(Vec<String>, Vec<String>), String> {
        let old = self.settings();
        let changed = old.changed(&new);
        let (live, restart): (Vec<&str>, Vec<&str>) =
            changed.iter().partition(|k| crate::config::RELOADABLE.contains(k));
        let mut restart: Vec<String> = restart.into_iter().map(str::to_owned).collect();
        // What can fail comes first, so that a rejected reload changes nothing.
        let group = if live.contains(&"socket_group") {
            let gid = match &new.socket_group {
                Some(name) => match crate::sys::sock::group_id(name) {
                    Some(g) => Some(g),
                    None if new.socket_group_explicit => {
                        return Err(format!("socket_group: no group named {name:?}"))
                    }
                    None => None,
                },
                None => None,
            };
            Some(gid)
        } else {
            None
        };
        let mut applied = Vec::new();
        let mut taken = Vec::new();
        for &key in &live {
            match key {
                "log_level" => match &self.hooks.set_log_level {
                    Some(f) => f(&new.log_level).map_err(|e| format!("log_level: {e}"))?,
                    None => {
                        restart.push(key.into());
                        continue;
                    }
                },
                "perf_map_max_bytes" | "perf_map_max_entries" => {
                    self.aggregator.with_resolver(|r| r.set_jit_limits(jit_limits(&new)));
                }
                "socket_group" => {
                    if let Some(gid) = group {
                        self.access.set_group(&old.socket, gid).map_err(|e| e.to_string())?;
                    }
                }
                // The others are read from the settings where they are used.
                _ => {}
            }
            applied.push(format!("{key}: {} -> {}", old.show(key), new.show(key)));
            taken.push(key);
        }
        {
            let mut s = self.settings.write().unwrap_or_else(|p| p.into_inner());
            for key in taken {
                s.take(key, &new);
            }
            s.socket_group_explicit = new.socket_group_explicit;
            s.config_file = new.config_file.clone();
        }
        // A publish in progress holds the store; the next tick applies the change then.
        if let Ok(mut store) = self.store.try_lock() {
            self.sync_store(&mut store);
        }
        if let Some(t) = lock(&self.flusher).as_ref() {
            t.unpark();
        }
        Ok((applied, restart))
    }

    fn record_tick(&self, status: Option<&crate::perf::sampler::SamplerStatus>) {
        let (u, s) = crate::sys::sock::self_cpu_time();
        let (samples, per_cpu) = match status {
            Some(st) => (
                st.cpus.iter().map(|c| c.samples).sum(),
                st.cpus.iter().map(|c| (c.cpu, c.wakeups, c.drain_cpu_ns)).collect(),
            ),
            None => (0, Vec::new()),
        };
        let rt = self.aggregator.resolver_thread_stats();
        let mut t = lock(&self.ticks);
        t.push_back((
            Instant::now(),
            samples,
            (u + s).as_secs_f64(),
            per_cpu,
            (rt.wakeups, rt.cpu_ns),
        ));
        while t.len() > 2 {
            t.pop_front();
        }
    }

    fn recent_window(&self) -> Option<RecentWindow> {
        let t = lock(&self.ticks);
        let (a, b) = (t.front()?, t.back()?);
        if t.len() < 2 {
            return None;
        }
        Some(RecentWindow {
            seconds: b.0.saturating_duration_since(a.0).as_secs_f64(),
            samples: b.1.saturating_sub(a.1),
            cpu_s: (b.2 - a.2).max(0.0),
            per_cpu: b
                .3
                .iter()
                .map(|&(cpu, w, ns)| {
                    let (w0, ns0) = a.3.iter().find(|p| p.0 == cpu).map_or((0, 0), |p| (p.1, p.2));
                    (cpu, w.saturating_sub(w0), ns.saturating_sub(ns0))
                })
                .collect(),
            resolver: (b.4 .0.saturating_sub(a.4 .0), b.4 .1.saturating_sub(a.4 .1)),
        })
    }

    /// Move one resolved batch (and sampler loss counters since the last one) into the store.
    fn absorb(&self, store: &mut Store, resolved: Resolved) {
        let status = read(&self.sampler).as_ref().map(|s| s.status());
        self.absorb_with(store, resolved, status.as_ref());
    }

    /// [`Shared::absorb`] with the sampler's status already taken (`None`: no sampler).
    fn absorb_with(
        &self,
        store: &mut Store,
        resolved: Resolved,
        status: Option<&crate::perf::sampler::SamplerStatus>,
    ) {
        let (lost, throttled, times) = match status {
            Some(st) => (
                st.cpus.iter().map(|c| c.lost).sum(),
                st.cpus.iter().map(|c| c.throttled).sum(),
                st.events.iter().map(|e| (e.time_enabled, e.time_running)).collect(),
            ),
            None => {
                let c = lock(&self.counters);
                (c.lost, c.throttled, c.event_times.clone())
            }
        };
        let (dl, dt) = {
            let mut c = lock(&self.counters);
            // The kernel's times are cumulative per fd; the summary wants this epoch's share.
            if c.event_times.len() < times.len() {
                c.event_times.resize(times.len(), (0, 0));
            }
            let deltas: Vec<(u64, u64)> = times
                .iter()
                .zip(&c.event_times)
                .map(|(now, seen)| (now.0.saturating_sub(seen.0), now.1.saturating_sub(seen.1)))
                .collect();
            for (seen, now) in c.event_times.iter_mut().zip(&times) {
                seen.0 = seen.0.max(now.0);
                seen.1 = seen.1.max(now.1);
            }
            store.add_event_times(&deltas);
            let d = (lost.saturating_sub(c.lost), throttled.saturating_sub(c.throttled));
            c.lost = c.lost.max(lost);
            c.throttled = c.throttled.max(throttled);
            c.resolved_samples += resolved.samples;
            for ((_, reason), (n, _)) in &resolved.unknown {
                *c.unknown_by_reason.entry(reason.as_str().to_string()).or_insert(0) += n;
            }
            d
        };
        store.add(resolved, dl, dt);
    }

    /// `dcpictl top`: take what the watermark allows now (into the store's memory, as a
    /// periodic flush does, but writing nothing), then report the last few seconds from the
    /// aggregator's recent batches.
    fn top(&self) -> dcpi_proto::TopResult {
        const WINDOW: Duration = Duration::from_secs(5);
        {
            let mut store = lock(&self.store);
            let resolved = self.aggregator.take_resolved();
            self.absorb(&mut store, resolved);
        }
        let (samples, rows) = self.aggregator.top(WINDOW, 200);
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        dcpi_proto::TopResult {
            window_ms: WINDOW.as_millis() as u64,
            samples,
            rows: rows
                .into_iter()
                .map(|r| dcpi_proto::TopRow {
                    command: text(&r.command),
                    pid: r.pid,
                    image: text(&r.image),
                    build_id: r.build_id.as_deref().map(hex::encode),
                    offset: r.offset,
                    samples: r.samples,
                })
                .collect(),
        }
    }

    /// The periodic flush: what the watermark allows goes to the store. The store lock is
    /// taken before the batch: a batch and an epoch change can then never interleave (the
    /// batch would otherwise land in the epoch after the one its samples belong to).
    fn flush_tick(&self) {
        use crate::sys::time::thread_cpu_ns;
        let c0 = thread_cpu_ns();
        // One status for the tick's window and the batch's counters: taken before the batch,
        // so a loss counted now goes with this batch or the next, never nowhere.
        let status = read(&self.sampler).as_ref().map(|s| s.status());
        self.record_tick(status.as_ref());
        let c1 = thread_cpu_ns();
        let mut store = lock(&self.store);
        let t0 = thread_cpu_ns();
        let resolved = self.aggregator.take_resolved();
        let t1 = thread_cpu_ns();
        self.sync_store(&mut store);
        self.absorb_with(&mut store, resolved, status.as_ref());
        let tick = store.tick();
        *lock(&self.store_status) = store.status();
        drop(store);
        crate::sys::malloc::trim_at_most_every(TRIM_EVERY);
        let t2 = thread_cpu_ns();
        let mut st = lock(&self.stages);
        st.resolve_ns += t1.saturating_sub(t0);
        st.store_ns += t2.saturating_sub(t1);
        st.spool_ns += tick.spool_ns;
        st.publish_ns += tick.publish_ns;
        st.checks_ns += c1.saturating_sub(c0);
    }

    /// Close a batch at this instant: every drain thread reads its ring up to it (bounded
    /// wait), every sample up to it goes into the store, none after. The caller holds the store.
    fn cut(&self, store: &mut Store) -> Cut {
        let sampler = read(&self.sampler);
        let (resolved, unanswered, until) = self.aggregator.cut(|t| match sampler.as_ref() {
            Some(s) => s.barrier(t, BARRIER_TIMEOUT),
            None => Vec::new(),
        });
        drop(sampler);
        if !unanswered.is_empty() {
            tracing::warn!(cpus = ?unanswered, "drain threads did not read their rings up to the request in time; their samples go to a later batch");
        }
        self.sync_store(store);
        self.absorb(store, resolved);
        Cut { until, unanswered }
    }

    /// A store operation of a control command on its own thread, waited for at most
    /// [`FLUSH_WAIT`]: a hung database must not hang the client too. The operation goes on in
    /// the background (one at a time); the samples are safe in the spool meanwhile.
    fn bounded_store_op<T: Send + 'static>(
        self: &Arc<Self>,
        op: impl FnOnce(&Self) -> Result<T, String> + Send + 'static,
    ) -> Result<T, String> {
        use std::sync::atomic::Ordering;
        let stalled = |sh: &Self| {
            let s = sh.settings();
            match sh.stalled_since(&s) {
                Some(t) => format!(
                    "publishing stalled for {:.0} s (the database is not answering)",
                    unix_ms_now().saturating_sub(t) as f64 / 1e3
                ),
                None => "the store is busy".into(),
            }
        };
        if self.flush_running.swap(true, Ordering::AcqRel) {
            return Err(format!(
                "a previous flush or epoch change has not finished: {}; samples are kept in the spool",
                stalled(self)
            ));
        }
        let (tx, rx) = mpsc::channel();
        let sh = Arc::clone(self);
        let spawned = std::thread::Builder::new().name("dcpid-ctl-store".into()).spawn(move || {
            let r = op(&sh);
            sh.flush_running.store(false, Ordering::Release);
            let _ = tx.send(r);
        });
        if let Err(e) = spawned {
            self.flush_running.store(false, Ordering::Release);
            return Err(format!("cannot start: {e}"));
        }
        match rx.recv_timeout(FLUSH_WAIT) {
            Ok(r) => r,
            Err(_) => Err(format!(
                "not done after {} s: {}; samples are kept in the local spool and published when it answers",
                FLUSH_WAIT.as_secs(),
                stalled(self)
            )),
        }
    }

    /// `dcpictl flush`: a cut, then the store spools and publishes everything.
    fn flush_now(&self) -> Result<Cut, (Cut, String)> {
        let mut store = lock(&self.store);
        let cut = self.cut(&mut store);
        let r = store.flush_everything().map_err(|e| e.to_string());
        *lock(&self.store_status) = store.status();
        match r {
            Ok(()) => Ok(cut),
            Err(e) => Err((cut, e)),
        }
    }

    /// `dcpictl epoch new`: a cut closes the current epoch at an instant, then the next epoch
    /// starts; both under the store lock, so no batch can fall between them.
    fn new_epoch(&self) -> (Cut, Result<profile_format::EpochId, StoreError>) {
        let mut store = lock(&self.store);
        let cut = self.cut(&mut store);
        let r = store.new_epoch();
        *lock(&self.store_status) = store.status();
        (cut, r)
    }

    /// At shutdown, after the sampler stopped (its drain threads delivered a final pass).
    fn flush_everything(&self) -> Result<(), StoreError> {
        let mut store = lock(&self.store);
        let resolved = self.aggregator.flush_all();
        self.sync_store(&mut store);
        self.absorb(&mut store, resolved);
        let r = store.flush_everything();
        *lock(&self.store_status) = store.status();
        r
    }

    /// Since when (Unix ms) the store's running operation has been stuck, if it has run for
    /// longer than a healthy one could.
    fn stalled_since(&self, settings: &Settings) -> Option<u64> {
        let since = self.store_busy.load(std::sync::atomic::Ordering::Acquire);
        let bound = STALL_AFTER.max(settings.flush_interval * 2).as_millis() as u64;
        (since != 0 && unix_ms_now().saturating_sub(since) > bound).then_some(since)
    }

    /// The last store status, with a stall of the running operation (which holds the store,
    /// so its own status is not fresh).
    fn store_status_now(&self, settings: &Settings) -> crate::store::StoreStatus {
        let mut st = lock(&self.store_status).clone();
        st.publish_stalled_since_unix_ms = self.stalled_since(settings);
        st
    }

    fn status(&self) -> StatusReport {
        let sampler_status =
            self.sampler.read().unwrap_or_else(|p| p.into_inner()).as_ref().map(|s| s.status());
        let agg = self.aggregator.stats();
        let settings = self.settings();
        let recent = self.recent_window();
        let last_reload = lock(&self.last_reload).clone();
        let resolver = {
            let mut cached = lock(&self.resolver_stats);
            if let Some(s) = self.aggregator.try_resolver_stats() {
                *cached = s;
            }
            cached.clone()
        };
        let c = lock(&self.counters);
        crate::status::build(StatusInputs {
            host: &settings.host,
            db: &settings.db.display().to_string(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            sampler: sampler_status.as_ref(),
            aggregator: &agg,
            unknown_by_reason: &c.unknown_by_reason,
            resolved_samples: c.resolved_samples,
            store: self.store_status_now(&settings),
            settings: &settings,
            last_reload,
            recent,
            virtualized: crate::status::virtualized(),
            stages: *lock(&self.stages),
            failed_threads: self.watch.failures(),
            resolver: &resolver,
            resolver_thread: self.aggregator.resolver_thread_stats(),
            stacks: self.aggregator.stack_report(),
        })
    }
}

struct ControlHandler(Arc<Shared>);

impl Handler for ControlHandler {
    fn handle(&self, req: Request) -> Response {
        let sh = &self.0;
        match req {
            Request::Status => Response::ok_with(&sh.status()),
            Request::Flush => match sh.bounded_store_op(|sh| {
                sh.flush_now()
                    .map_err(|(cut, e)| format!("{e}{}", unanswered_note(&cut.unanswered)))
            }) {
                Ok(cut) => Response::ok_with(&dcpi_proto::FlushResult {
                    flushed: true,
                    until_ns: cut.until,
                    unanswered_cpus: cut.unanswered.clone(),
                }),
                Err(e) => Response::err(format!("flush incomplete: {e}")),
            },
            Request::Reload => {
                let r = sh.reload("dcpictl");
                match serde_json::to_value(&r) {
                    Ok(v) if r.ok => Response::ok(v),
                    Ok(_) => Response::err(format!(
                        "reload rejected, running configuration kept: {}",
                        r.error.unwrap_or_default()
                    )),
                    Err(e) => Response::err(e.to_string()),
                }
            }
            Request::Top => Response::ok_with(&sh.top()),
            Request::EpochShow => {
                let e = lock(&sh.store_status).epoch.clone();
                Response::ok_with(&dcpi_proto::EpochResult {
                    epoch: e,
                    until_ns: 0,
                    unanswered_cpus: Vec::new(),
                })
            }
            Request::EpochNew => match sh.bounded_store_op(|sh| match sh.new_epoch() {
                (cut, Ok(e)) => Ok((cut, e)),
                (cut, Err(e)) => Err(format!("{e}{}", unanswered_note(&cut.unanswered))),
            }) {
                Ok((cut, e)) => Response::ok_with(&dcpi_proto::EpochResult {
                    epoch: Some(e.to_string()),
                    until_ns: cut.until,
                    unanswered_cpus: cut.unanswered.clone(),
                }),
                Err(e) => Response::err(format!("cannot start a new epoch: {e}")),
            },
        }
    }
}

fn unanswered_note(cpus: &[u32]) -> String {
    if cpus.is_empty() {
        String::new()
    } else {
        format!(" (drain threads of CPUs {cpus:?} did not answer the barrier)")
    }
}

enum Wake {
    Stop(&'static str),
    Reload,
}

/// Run the daemon until a signal or the end of `--duration`.
///
/// Everything that can be checked without creating anything comes first (events, socket
/// group, socket path); then the spool, sampling and the database. A start that fails removes
/// the (empty) directories it created.
pub fn run(settings: Settings, mut hooks: Hooks) -> Result<(), ServiceError> {
    let notifier = hooks.notifier.take().unwrap_or_else(Notifier::from_env);
    let specs = parse_event_list(&settings.events)?;
    let faults = crate::faults::Faults::from_env()?;
    let group = socket_group_id(&settings)?;
    crate::control::check_path(&settings.socket)?;
    let watch = Watch::new(hooks.faults.clone());
    // Before any thread starts: a host name held by a live daemon is an orderly refusal
    // (exit 2), not threads started and torn down again (issue 35). Taken for real below.
    Store::check_lease_free(&store_config(&settings)).map_err(ServiceError::LeaseHeld)?;
    let mut created = CreatedDirs::default();
    prepare_spool(&settings.spool, &mut created)?;
    let (aggregator, sampler, sampling_since, t0) =
        start_sampling(&settings, specs, &faults, &watch)?;
    // From here on threads run: a failed start stops them on purpose (`Watch::stopping`), so
    // that their end is not reported as a thread death.
    let mut store = open_store(&settings, &faults).map_err(|e| orderly(&watch, e))?;
    register_sampler(&sampler, &mut store).map_err(|e| orderly(&watch, e))?;
    prime_resolver(&aggregator, &mut store, t0);
    let access = Arc::new(Access::new(group));
    let shared = Arc::new(Shared {
        settings: RwLock::new(settings.clone()),
        hooks,
        access: Arc::clone(&access),
        last_reload: Mutex::new(None),
        ticks: Mutex::new(VecDeque::new()),
        flusher: Mutex::new(None),
        started: sampling_since,
        aggregator,
        store_status: Mutex::new(store.status()),
        store_busy: store.busy_since(),
        flush_running: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        store_cfg: store.config().clone(),
        events: store.events().to_vec(),
        losses: store.losses(),
        stages: Mutex::new(crate::status::StageCpu::default()),
        store: Mutex::new(store),
        sampler: RwLock::new(Some(sampler)),
        counters: Mutex::new(Counters {
            lost: 0,
            throttled: 0,
            unknown_by_reason: BTreeMap::new(),
            resolved_samples: 0,
            event_times: Vec::new(),
        }),
        watch: Arc::clone(&watch),
        resolver_stats: Mutex::new(crate::resolve::ResolverStats::default()),
    });
    let mut control = ControlServer::start_watched(
        &settings.socket,
        access,
        Arc::new(ControlHandler(Arc::clone(&shared))),
        Some(Arc::clone(&watch)),
    )
    .map_err(|e| orderly(&watch, e.into()))?;
    let (tx, rx) = mpsc::channel::<Wake>();
    let (sig_handle, _) =
        spawn_signal_thread(tx.clone(), &watch).map_err(|e| orderly(&watch, e))?;
    created.keep();
    notifier.ready();
    tracing::info!(socket = %settings.socket.display(), host = %settings.host, db = %settings.db.display(), "dcpid ready");
    let flusher = Flusher::spawn(&shared).map_err(|e| orderly(&watch, e))?;
    let reason = serve_until_stop(&shared, &notifier, &rx, settings.duration);

    watch.stopping();
    tracing::info!(reason, "stopping: flushing and publishing everything");
    notifier.stopping();
    notifier.status("stopping: publishing");
    // The last publish may be slow on a shared database; ask systemd not to kill us for it.
    notifier.extend_timeout(Duration::from_secs(120));
    sig_handle.close();
    drop(tx);
    flusher.stop();
    let last = shut_down(&shared);
    control.stop();
    // As perf record's closing line: what this run took, and of it what was dropped
    // (written neither to the spool nor to the database); the rest is published or in the
    // spool, so an operator can check it against the database. What is still held in memory
    // now (a hung last publish holds it) is lost with the process.
    let samples = lock(&shared.counters).resolved_samples;
    let dropped = shared.losses.dropped() + shared.losses.held();
    tracing::info!(samples, dropped, "dcpid stopped");
    let failures = watch.failures();
    if !failures.is_empty() {
        let mut msg = crate::watch::describe(&failures);
        if let Err(e) = &last {
            msg += &format!("; and could not publish everything: {e}");
        }
        if dropped > 0 {
            msg += &format!("; and dropped {dropped} of {samples} samples");
        }
        return Err(ServiceError::Degraded(msg));
    }
    if dropped > 0 {
        return Err(ServiceError::Dropped {
            dropped,
            samples,
            error: last.err().map_or_else(String::new, |e| format!(" (last error: {e})")),
        });
    }
    match last {
        // A `--duration` run is asked for its result: anything not published is a failure.
        // A service stopped by a signal has done its job if the samples are in the spool (the
        // next start publishes them); only samples that never reached it are a failure.
        Err(e) if settings.duration.is_some() || matches!(e, StoreError::Unwritten(_)) => {
            Err(ServiceError::Unpublished {
                why: reason,
                error: e.to_string(),
                spool: settings.spool.display().to_string(),
            })
        }
        _ => Ok(()),
    }
}

/// A start that fails after threads were started: they end because the daemon stops, which is
/// no thread death to report.
fn orderly(watch: &Watch, e: ServiceError) -> ServiceError {
    watch.stopping();
    e
}

fn socket_group_id(settings: &Settings) -> Result<Option<u32>, ServiceError> {
    match &settings.socket_group {
        Some(name) => match crate::sys::sock::group_id(name) {
            Some(g) => Ok(Some(g)),
            None if settings.socket_group_explicit => Err(ServiceError::NoGroup(name.clone())),
            None => Ok(None),
        },
        None => Ok(None),
    }
}

/// The database (first epoch if none) and the spool, which `prepare_spool` checked.
/// The store's part of the settings (at start, and after each reload).
fn store_config(s: &Settings) -> StoreConfig {
    StoreConfig {
        db: s.db.clone(),
        spool: s.spool.clone(),
        host: s.host.clone(),
        flush_interval: s.flush_interval,
        publish_interval: s.publish_interval,
        publish_max_delay: s.publish_max_delay,
        max_memory_bytes: s.max_memory_mb.saturating_mul(1 << 20),
        retention_days: s.retention_days,
        retention_keep: s.retention_keep,
    }
}

fn open_store(settings: &Settings, faults: &crate::faults::Faults) -> Result<Store, ServiceError> {
    if let Err(e) = Store::check_db_writable(&settings.db, &settings.host) {
        if permanent_db_error(&e) {
            return Err(ServiceError::Database {
                db: settings.db.display().to_string(),
                source: e,
            });
        }
        tracing::warn!(db = %settings.db.display(), error = %e,
            "database not writable now; sampling anyway, keeping data in the spool and retrying");
    }
    let mut store = Store::open_leased_with_faults(store_config(settings), faults)
        // One daemon per host name: two would overwrite each other's profiles.
        .map_err(ServiceError::LeaseHeld)?;
    store.set_who_by_pid(settings.by_pid);
    store.set_who_profiles(who_profiles(settings));
    Ok(store)
}

/// The per-process and per-cgroup profiles the settings ask for (FORMAT.md §5.6).
fn who_profiles(s: &Settings) -> crate::store::WhoProfiles {
    crate::store::WhoProfiles { by_pid: s.by_pid, by_cgroup: s.by_cgroup }
}

/// Every event on every CPU (before anything is written: a daemon that may not sample creates
/// nothing). Returns the sampling start instant (uptime counts from it, so that samples/s is
/// right) and the perf clock read before the events were opened (T0 of the /proc scan).
fn start_sampling(
    settings: &Settings,
    specs: Vec<crate::perf::EventSpec>,
    faults: &crate::faults::Faults,
    watch: &Arc<Watch>,
) -> Result<(Arc<Aggregator>, Sampler, Instant, u64), ServiceError> {
    let cpus = online_cpus()?;
    let ncpus = cpus.iter().max().map(|m| *m as usize + 1).unwrap_or(1);
    let mut resolver = Resolver::new(ResolverConfig::default());
    resolver.set_jit_limits(jit_limits(settings));
    let aggregator = Aggregator::new(resolver, ncpus);
    // Before the first sample: kernel samples are keyed per process from the start.
    aggregator.set_who_profiles(settings.by_pid || settings.by_cgroup);
    // Before the drain threads start: they hand side-band records and full overflow buffers
    // to it (they never read a file nor take the resolver for writing).
    aggregator
        .start_resolver_thread(Some(watch))
        .map_err(|e| ServiceError::Thread(format!("{}: {e}", crate::aggregate::RESOLVER_THREAD)))?;
    let stacks = (settings.callchains == "fp").then(|| {
        let t = Arc::new(crate::perf::callchain::StackTables::new(
            ncpus,
            crate::perf::callchain::DEFAULT_STACKS_PER_CPU,
            settings.sample_max_stack,
        ));
        aggregator.set_stack_tables(Arc::clone(&t));
        t
    });
    let scfg = SamplerConfig {
        stacks,
        events: specs,
        window_divisor: settings.window_divisor,
        ring_pages: settings.ring_pages,
        redraw_interval: settings.redraw_interval,
        read_every: read_every(settings.flush_interval),
        faults: faults.clone(),
        watch: Some(Arc::clone(watch)),
        // The flush thread follows hotplug (FlushThread::spawn): it wakes every few seconds
        // anyway.
        hotplug_thread: false,
        ..SamplerConfig::default()
    };
    let t0 = crate::sys::time::monotonic_ns();
    let since = Instant::now();
    let sampler = Sampler::start(&scfg, Arc::<Aggregator>::clone(&aggregator))
        .map_err(|e| orderly(watch, explain_sampler_error(e)))?;
    Ok((aggregator, sampler, since, t0))
}

/// The store learns the events as opened, the CPUs and the kernel release.
fn register_sampler(sampler: &Sampler, store: &mut Store) -> Result<(), ServiceError> {
    store.set_events(
        sampler
            .events()
            .iter()
            .map(|e| EventInfo { desc: e.desc.clone(), source: e.source.as_str().to_string() })
            .collect(),
    );
    for e in sampler.events() {
        tracing::info!(event = %e.desc.name, requested = %e.requested, source = e.source.as_str(),
            period_min = e.desc.period_min, period_max = e.desc.period_max, "event");
    }
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    store.set_host_info(release, online_cpus()?);
    Ok(())
}

/// Start steps 3 and 4: processes that already exist (side-band records older than the scan
/// are ignored for them), then the kernel symbol snapshot for the epoch.
fn prime_resolver(aggregator: &Aggregator, store: &mut Store, t0: u64) {
    let scan = aggregator.with_resolver(|r| r.scan_proc(t0));
    tracing::info!(
        processes = scan.processes,
        mappings = scan.mappings,
        unreadable = scan.unreadable,
        "scanned /proc"
    );
    store.set_kallsyms_source(Box::new(ProcKernelSymbols(ResolverConfig::default())));
    store.tick();
}

/// Fresh kernel symbol snapshots from /proc, refreshed when /proc/modules changes.
struct ProcKernelSymbols(ResolverConfig);

impl crate::store::KernelSymbolSource for ProcKernelSymbols {
    fn fingerprint(&mut self) -> Option<Vec<u8>> {
        let text =
            crate::resolve::procfs::read_bounded(&self.0.proc_root.join("modules"), 16 << 20)
                .ok()?;
        // Name, size and address of each module: not the use counts, which change all the
        // time without changing any symbol.
        let mut fp = Vec::new();
        for line in String::from_utf8_lossy(&text).lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            for i in [0, 1, 5] {
                fp.extend_from_slice(f.get(i).unwrap_or(&"").as_bytes());
                fp.push(b' ');
            }
            fp.push(b'\n');
        }
        Some(fp)
    }
    fn snapshot(&mut self) -> Result<profile_format::KallsymsSnapshot, String> {
        crate::resolve::kallsyms_snapshot(&self.0).map_err(|e| e.to_string())
    }
    fn snapshot_file_bytes(&mut self) -> Result<Vec<u8>, String> {
        crate::resolve::kallsyms_file_bytes(&self.0).map_err(|e| e.to_string())
    }
}

/// SIGTERM/SIGINT stop, SIGHUP reloads; each arrives on `tx`.
fn spawn_signal_thread(
    tx: mpsc::Sender<Wake>,
    watch: &Arc<Watch>,
) -> Result<(signal_hook::iterator::Handle, std::thread::JoinHandle<()>), ServiceError> {
    let mut signals =
        signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT, libc::SIGHUP])
            .map_err(ServiceError::Signals)?;
    let handle = signals.handle();
    // It ends by itself after a stop signal, before the watch is told: only a panic counts.
    let thread = watch
        .spawn("dcpi-signals".into(), false, move || {
            for sig in signals.forever() {
                let wake = match sig {
                    libc::SIGHUP => Wake::Reload,
                    libc::SIGINT => Wake::Stop("SIGINT"),
                    _ => Wake::Stop("SIGTERM"),
                };
                let stop = matches!(wake, Wake::Stop(_));
                if tx.send(wake).is_err() || stop {
                    break;
                }
            }
        })
        .map_err(ServiceError::Signals)?;
    Ok((handle, thread))
}

const FLUSH_THREAD: &str = "dcpid-flush";

/// How old a drain thread's last read of its ring must be for a timed wake-up to read it again
/// (`SamplerConfig::read_every`): fewer, bigger passes are cheaper per sample, and a third of
/// the flush interval keeps what a flush (or a kill -9) leaves behind within a few seconds.
/// Fixed at start: a reload that changes `flush_interval` keeps it.
fn read_every(flush_interval: Duration) -> Duration {
    (flush_interval / 3).min(crate::perf::sampler::MAX_READ_EVERY)
}

/// The periodic flush, on its own thread: a publish that hangs on a dead NFS server must
/// neither stop the watchdog pings (which only speak for the drain threads) nor the stop path.
struct Flusher {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// How often, at least, the flush thread re-reads the online CPU list (CPU hotplug); with a
/// `flush_interval` at most this long (the default), every flush's wake-up does it.
const HOTPLUG_EVERY: Duration = Duration::from_secs(5);

/// The shortest time between two flushes when a stack table asks for an early one. A table
/// holds one flush interval's distinct stacks: at 4 kHz per CPU, half a second of them fits in
/// half the default table even when every stack is new.
const EARLY_FLUSH_GAP: Duration = Duration::from_millis(500);

impl Flusher {
    fn spawn(shared: &Arc<Shared>) -> Result<Self, ServiceError> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let shared = Arc::clone(shared);
            let stop = Arc::clone(&stop);
            let watch = Arc::clone(&shared.watch);
            Arc::clone(&watch)
                .spawn(FLUSH_THREAD.into(), true, move || {
                    let mut last = Instant::now();
                    let mut last_hotplug = last;
                    let stacks = shared.aggregator.stack_tables();
                    while !stop.load(std::sync::atomic::Ordering::Acquire) {
                        watch.fault_point(FLUSH_THREAD);
                        // Read each time: a reload may change it.
                        let interval = read(&shared.settings).flush_interval;
                        let mut next = last + interval;
                        // A stack table past its high-water mark cuts the interval short
                        // (perf::callchain), though to no less than EARLY_FLUSH_GAP: a table
                        // held full by pending samples must not turn into a flush storm.
                        if stacks.is_some_and(|t| t.flush_wanted()) {
                            next = next.min(last + EARLY_FLUSH_GAP);
                        }
                        // With flushes at least as frequent, the check rides on each flush's
                        // wake-up: one wake-up per interval, not two a few ms apart.
                        let next_hotplug = if interval <= HOTPLUG_EVERY {
                            next
                        } else {
                            last_hotplug + HOTPLUG_EVERY
                        };
                        let now = Instant::now();
                        if now >= next_hotplug {
                            // Before the store: a database that hangs in this flush delays
                            // only the next checks, not this one.
                            let c0 = crate::sys::time::thread_cpu_ns();
                            if let Some(s) = read(&shared.sampler).as_ref() {
                                s.hotplug_tick();
                            }
                            let spent = crate::sys::time::thread_cpu_ns().saturating_sub(c0);
                            lock(&shared.stages).checks_ns += spent;
                            last_hotplug = now;
                        }
                        if now >= next {
                            if let Some(t) = stacks {
                                t.clear_flush_request(now < last + interval);
                            }
                            shared.flush_tick();
                            last = Instant::now();
                        } else {
                            std::thread::park_timeout(next.min(next_hotplug) - now);
                        }
                    }
                })
                .map_err(|e| ServiceError::Thread(e.to_string()))?
        };
        *lock(&shared.flusher) = Some(thread.thread().clone());
        if let Some(t) = shared.aggregator.stack_tables() {
            let flusher = thread.thread().clone();
            t.set_flusher_waker(Box::new(move || flusher.unpark()));
        }
        Ok(Self { stop, thread })
    }

    /// Stop the flush thread, waiting at most [`STOP_WAIT`]: one stuck in a hung database
    /// is left behind (the stop then spools without it).
    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.thread.thread().unpark();
        let deadline = Instant::now() + STOP_WAIT;
        while !self.thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !self.thread.is_finished() {
            tracing::error!("the flush thread is stuck (hung database?); stopping without it");
            return;
        }
        // A panic was recorded by the watch.
        let _ = self.thread.join();
    }
}

/// The main thread's loop: reloads, systemd STATUS= and WATCHDOG=1 (only while every drain
/// thread progresses), until a stop signal or the end of `--duration`. Returns why it stopped.
fn serve_until_stop(
    shared: &Shared,
    notifier: &Notifier,
    rx: &mpsc::Receiver<Wake>,
    duration: Option<Duration>,
) -> &'static str {
    let deadline = duration.map(|d| Instant::now() + d);
    // Ping twice per recommended interval (a quarter of WATCHDOG_USEC): a loaded machine may
    // delay one wake-up without systemd seeing a gap.
    let watchdog_every = notifier.watchdog_interval().map(|w| w / 2);
    let mut next_status = Instant::now() + read(&shared.settings).status_interval;
    loop {
        let now = Instant::now();
        let mut wake_at = if notifier.is_enabled() { next_status } else { now + IDLE_WAKE };
        if let Some(w) = watchdog_every {
            wake_at = wake_at.min(now + w);
        }
        if let Some(d) = deadline {
            wake_at = wake_at.min(d);
        }
        match rx.recv_timeout(wake_at.saturating_duration_since(now)) {
            Ok(Wake::Stop(why)) => return why,
            Ok(Wake::Reload) => {
                let r = shared.reload("SIGHUP");
                notifier.status(&if r.ok {
                    format!("configuration reloaded; {}", shared.status().one_line())
                } else {
                    format!("reload rejected: {}", r.error.unwrap_or_default())
                });
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return "signal thread gone",
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return "--duration elapsed";
        }
        // A full status reads /proc and every component's counters: outside systemd nobody
        // reads the line, and the collector's cost is judged against perf's (issue 13).
        if now >= next_status && notifier.is_enabled() {
            next_status = now + read(&shared.settings).status_interval;
            notifier.status(&shared.status().one_line());
        }
        if watchdog_every.is_some() {
            // A dead thread (flush, control...) stops the pings too: systemd then restarts us.
            let progressing = !shared.watch.degraded()
                && read(&shared.sampler)
                    .as_ref()
                    .is_some_and(|s| s.drain_threads_progressing(PROGRESS_MAX_AGE));
            if progressing {
                notifier.watchdog();
            }
        }
    }
}

/// Stop sampling (every drain thread disables its events and delivers a final pass, which is
/// the barrier for SIGTERM and `--duration`), then spool and publish everything.
///
/// A hung database must not hold the stop: the last samples go to the local spool first;
/// publishing is skipped if the database has stalled, and bounded otherwise; if a stuck
/// operation holds the store, the samples are spooled without it. An error says what was not
/// published (a `--duration` run fails on it) or, `Unwritten`, what did not even reach the
/// spool (always a failure).
fn shut_down(shared: &Arc<Shared>) -> Result<(), StoreError> {
    let last = shared.sampler.write().unwrap_or_else(|p| p.into_inner()).take().map(|s| s.stop());
    // The last flush applies what is still queued itself.
    shared.aggregator.stop_resolver_thread();
    let settings = shared.settings();
    let deadline = Instant::now() + STOP_WAIT;
    let mut store = loop {
        match shared.store.try_lock() {
            Ok(g) => break Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => break Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(std::sync::TryLockError::WouldBlock) => break None,
        }
    };
    let resolved = shared.aggregator.flush_all();
    let Some(st) = store.as_mut() else {
        lock(&shared.counters).resolved_samples += resolved.samples;
        spool_without_store(shared, resolved)?;
        return Err(StoreError::NoDatabase(settings.db.clone()));
    };
    shared.sync_store(st);
    // With the sampler's last status: its final counter times and losses go into this batch.
    shared.absorb_with(st, resolved, last.as_ref());
    st.spool_held();
    *lock(&shared.store_status) = st.status();
    if let Some(since) = shared.stalled_since(&settings) {
        let dropped = st.drop_held();
        tracing::error!(
            stalled_since_unix_ms = since,
            dropped,
            "the database is not answering; not publishing at stop, the spool keeps {}",
            kept(dropped)
        );
        return Err(StoreError::NoDatabase(settings.db.clone()));
    }
    drop(store);
    // The last publish, bounded: the database may hang right now.
    let (tx, rx) = mpsc::channel();
    let sh = Arc::clone(shared);
    let spawned = std::thread::Builder::new().name("dcpid-stop".into()).spawn(move || {
        let r = sh.flush_everything();
        let mut st = lock(&sh.store);
        // Whatever is still held (the spool full, the database failing) ends with the process.
        let dropped = st.drop_held();
        st.release_lease();
        let _ = tx.send((r, dropped));
    });
    match spawned.map(|_| rx.recv_timeout(STOP_PUBLISH_WAIT)) {
        Ok(Ok((Ok(()), _))) => Ok(()),
        Ok(Ok((Err(e), dropped))) => {
            tracing::error!(error = %e, dropped,
                "could not publish everything; the spool keeps {}", kept(dropped));
            Err(e)
        }
        Ok(Err(_)) => {
            let held = shared.losses.held();
            tracing::error!(
                wait_s = STOP_PUBLISH_WAIT.as_secs(),
                dropped = held,
                "the last publish did not finish; the spool keeps {}",
                kept(held)
            );
            Err(StoreError::NoDatabase(settings.db.clone()))
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot start the last publish");
            Err(StoreError::NoDatabase(settings.db.clone()))
        }
    }
}

/// What the spool keeps at a stop that could not publish everything, for its log line: the
/// spool does not keep what was dropped.
fn kept(dropped: u64) -> String {
    if dropped == 0 {
        "everything for the next start".into()
    } else {
        format!(
            "what it took for the next start; {dropped} samples written neither to it nor to \
             the database are dropped"
        )
    }
}

/// The stop's last samples, when a stuck database operation holds the store: appended to the
/// spool directly, for the next start to publish. What it cannot take is counted as dropped.
fn spool_without_store(shared: &Shared, resolved: Resolved) -> Result<(), StoreError> {
    let n = resolved.profiles.len();
    let samples = resolved.samples;
    let lost = |why: &dyn std::fmt::Display| {
        tracing::error!(samples, error = %why, "could not spool the last samples; they are dropped");
        shared.losses.dropped.fetch_add(samples, std::sync::atomic::Ordering::AcqRel);
        Err(StoreError::Unwritten(n))
    };
    let epoch = lock(&shared.store_status).epoch.clone();
    let Some(epoch) = epoch.and_then(|e| profile_format::EpochId::parse(&e).ok()) else {
        return lost(&"no epoch known");
    };
    let who = who_profiles(&read(&shared.settings));
    match Store::spool_directly(&shared.store_cfg, &shared.events, &epoch, resolved, 0, 0, who) {
        Ok(samples) => {
            tracing::error!(samples,
                "a stuck database operation holds the store; the last samples were spooled directly for the next start");
            Ok(())
        }
        Err(e) => lost(&e),
    }
}
