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
//! host, events, `redraw_interval`, `window_divisor`, `ring_pages`, socket, ...) needs a restart: its
//! running value is kept and the reload reports it. A configuration with an error is
//! rejected as a whole (file, line, reason) and the running one stays.
//!
//! Exit status: 0 after a clean stop; 2 for a configuration the daemon can never run with
//! (bad event, unwritable database or spool, unusable socket path, sampling not permitted,
//! missing socket group); 1 for other failures to start, a `--duration` run that could not
//! publish everything, or a run that dropped samples (written neither to the spool nor to the
//! database: kept in memory up to `max_memory_mb`, then counted in `dropped_samples`).

mod control;
mod flush;
mod reload;
mod shared;
mod shutdown;
mod start;

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::config::{ConfigError, Settings};
use crate::control::check_path;
use crate::control::{Access, ControlError, ControlServer};
use crate::faults::{Faults, FaultsError};
use crate::notify::Notifier;
use crate::offcpu::OffCpuError;
use crate::perf::events::{parse_event_list, EventError};
use crate::perf::sampler::SamplerError;
use crate::store::{Store, StoreError};
use crate::watch::{self, FaultInjector, Watch, DEGRADED_EXIT_CODE};

use control::ControlHandler;
use flush::Flusher;
use shared::{lock, Counters, Shared, StatusOnly};
use shutdown::{serve_until_stop, shut_down, spawn_signal_thread, Wake};
use start::{
    open_store, prepare_spool, prime_resolver, register_sampler, socket_group_id, start_off_cpu,
    start_sampling, store_config, CreatedDirs,
};

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
    pub faults: Option<Arc<dyn FaultInjector>>,
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
    Faults(#[from] FaultsError),
    #[error("cannot start sampling: {0}")]
    Sampler(#[from] SamplerError),
    /// `off_cpu = true` and the context-switch event cannot be opened.
    #[error("cannot start off-CPU sampling (off_cpu = true): {0}")]
    OffCpu(#[from] OffCpuError),
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
            Self::Degraded(_) => DEGRADED_EXIT_CODE,
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

/// Run the daemon until a signal or the end of `--duration`.
///
/// Everything that can be checked without creating anything comes first (events, socket
/// group, socket path); then the spool, sampling and the database. A start that fails removes
/// the (empty) directories it created.
pub fn run(settings: Settings, mut hooks: Hooks) -> Result<(), ServiceError> {
    let notifier = hooks.notifier.take().unwrap_or_else(Notifier::from_env);
    let specs = parse_event_list(&settings.events)?;
    let faults = Faults::from_env()?;
    let group = socket_group_id(&settings)?;
    check_path(&settings.socket)?;
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
    register_sampler(&sampler, &settings, &mut store).map_err(|e| orderly(&watch, e))?;
    let offcpu = start_off_cpu(&settings, &aggregator, &sampler).map_err(|e| orderly(&watch, e))?;
    prime_resolver(&aggregator, &mut store, t0);
    let access = Arc::new(Access::new(group));
    let shared = Arc::new(Shared {
        settings: RwLock::new(settings.clone()),
        hooks,
        access: Arc::clone(&access),
        status_only: Mutex::new(StatusOnly::default()),
        flusher: Mutex::new(None),
        started: sampling_since,
        aggregator,
        store_status: Mutex::new(store.status()),
        store_busy: store.busy_since(),
        flush_running: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        store_cfg: store.config().clone(),
        events: store.events().to_vec(),
        losses: store.losses(),
        store: Mutex::new(store),
        sampler: RwLock::new(Some(sampler)),
        offcpu: Mutex::new(offcpu),
        counters: Mutex::new(Counters {
            lost: 0,
            throttled: 0,
            unknown_by_reason: BTreeMap::new(),
            resolved_samples: 0,
            event_times: Vec::new(),
        }),
        watch: Arc::clone(&watch),
        top_answer: Mutex::new(None),
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
        let mut msg = watch::describe(&failures);
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
