//! The daemon's life: start order, the flush loop, control commands, signals, shutdown.
//!
//! Start order (ARCHITECTURE.md): open the database (first epoch if none) and spool; open every
//! event on every CPU; scan /proc; kallsyms snapshot; control socket; READY=1. Then every flush
//! interval: take the resolved per-CPU tables into the store, spool, publish what is due,
//! STATUS=, and WATCHDOG=1 only while every drain thread makes progress. SIGTERM/SIGINT (or the
//! end of `--duration`): STOPPING=1, stop sampling, flush everything, publish everything, exit 0.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use crate::aggregate::{Aggregator, Resolved};
use crate::config::Settings;
use crate::control::{ControlError, ControlServer, Handler, Request, Response};
use crate::notify::Notifier;
use crate::perf::events::{parse_event_list, EventError};
use crate::perf::sampler::{online_cpus, Sampler, SamplerConfig, SamplerError};
use crate::resolve::{Resolver, ResolverConfig};
use crate::status::{StatusInputs, StatusReport};
use crate::store::{EventInfo, Store, StoreConfig};

/// Env var (tests only): `CPU:MS` makes the drain thread of CPU stop progressing after MS ms.
pub const TEST_STALL_ENV: &str = "DCPI_TEST_STALL_DRAIN";

/// A drain thread that has not completed a loop for this long withholds WATCHDOG=1.
const PROGRESS_MAX_AGE: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("--events: {0}")]
    Events(#[from] EventError),
    #[error("{TEST_STALL_ENV}: expected CPU:MS, got {0:?}")]
    StallEnv(String),
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
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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
    settings: Settings,
    started: Instant,
    aggregator: Arc<Aggregator>,
    sampler: RwLock<Option<Sampler>>,
    store: Mutex<Store>,
    counters: Mutex<Counters>,
    /// Last store status, so `status` answers while a slow publish holds the store.
    store_status: Mutex<crate::store::StoreStatus>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("settings", &self.settings).finish()
    }
}

impl Shared {
    /// Move one resolved batch (and sampler loss counters since the last one) into the store.
    fn absorb(&self, store: &mut Store, resolved: Resolved) {
        let (lost, throttled, times) =
            match self.sampler.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
                Some(s) => {
                    let st = s.status();
                    (
                        st.cpus.iter().map(|c| c.lost).sum(),
                        st.cpus.iter().map(|c| c.throttled).sum(),
                        st.events.iter().map(|e| (e.time_enabled, e.time_running)).collect(),
                    )
                }
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

    fn flush_tick(&self) {
        let resolved = self.aggregator.take_resolved();
        let mut store = lock(&self.store);
        self.absorb(&mut store, resolved);
        store.tick();
        *lock(&self.store_status) = store.status();
    }

    fn flush_everything(&self) -> Result<(), String> {
        let resolved = self.aggregator.flush_all();
        let mut store = lock(&self.store);
        self.absorb(&mut store, resolved);
        let r = store.flush_everything().map_err(|e| e.to_string());
        *lock(&self.store_status) = store.status();
        r
    }

    fn status(&self) -> StatusReport {
        let sampler_status =
            self.sampler.read().unwrap_or_else(|p| p.into_inner()).as_ref().map(|s| s.status());
        let agg = self.aggregator.stats();
        let c = lock(&self.counters);
        StatusReport::build(StatusInputs {
            host: &self.settings.host,
            db: &self.settings.db.display().to_string(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            sampler: sampler_status.as_ref(),
            aggregator: &agg,
            unknown_by_reason: &c.unknown_by_reason,
            resolved_samples: c.resolved_samples,
            store: lock(&self.store_status).clone(),
        })
    }
}

struct ControlHandler(Arc<Shared>);

impl Handler for ControlHandler {
    fn handle(&self, req: Request) -> Response {
        let sh = &self.0;
        match req {
            Request::Status => match serde_json::to_value(sh.status()) {
                Ok(v) => Response::ok(v),
                Err(e) => Response::err(e.to_string()),
            },
            Request::Flush => match sh.flush_everything() {
                Ok(()) => Response::ok(serde_json::json!({ "flushed": true })),
                Err(e) => Response::err(format!("flush incomplete: {e}")),
            },
            Request::EpochShow => {
                let e = lock(&sh.store_status).epoch.clone();
                Response::ok(serde_json::json!({ "epoch": e }))
            }
            Request::EpochNew => {
                let resolved = sh.aggregator.flush_all();
                let mut store = lock(&sh.store);
                sh.absorb(&mut store, resolved);
                let r = store.new_epoch();
                *lock(&sh.store_status) = store.status();
                match r {
                    Ok(e) => Response::ok(serde_json::json!({ "epoch": e.to_string() })),
                    Err(e) => Response::err(format!("cannot start a new epoch: {e}")),
                }
            }
        }
    }
}

fn stall_from_env() -> Result<Option<(u32, Duration)>, ServiceError> {
    let Some(v) = std::env::var_os(TEST_STALL_ENV) else { return Ok(None) };
    let v = v.to_string_lossy().into_owned();
    let parsed = v
        .split_once(':')
        .and_then(|(c, ms)| Some((c.trim().parse::<u32>().ok()?, ms.trim().parse::<u64>().ok()?)));
    match parsed {
        Some((cpu, ms)) => Ok(Some((cpu, Duration::from_millis(ms)))),
        None => Err(ServiceError::StallEnv(v)),
    }
}

enum Wake {
    Stop(&'static str),
}

/// Run the daemon until a signal or the end of `--duration`.
pub fn run(settings: Settings) -> Result<(), ServiceError> {
    let notifier = Notifier::from_env();
    let specs = parse_event_list(&settings.events)?;
    let stall_drain = stall_from_env()?;
    let group = match &settings.socket_group {
        Some(name) => match crate::sys::sock::group_id(name) {
            Some(g) => Some(g),
            None if settings.socket_group_explicit => {
                return Err(ServiceError::NoGroup(name.clone()))
            }
            None => None,
        },
        None => None,
    };

    // 1. Database and spool.
    let mut store = Store::open(StoreConfig {
        db: settings.db.clone(),
        spool: settings.spool.clone(),
        host: settings.host.clone(),
        flush_interval: settings.flush_interval,
        publish_interval: settings.publish_interval,
        max_memory_bytes: settings.max_memory_mb.saturating_mul(1 << 20),
        retention_days: settings.retention_days,
        retention_keep: settings.retention_keep,
    });

    // 2. Sampling on every CPU.
    let cpus = online_cpus()?;
    let ncpus = cpus.iter().max().map(|m| *m as usize + 1).unwrap_or(1);
    let aggregator = Aggregator::new(Resolver::new(ResolverConfig::default()), ncpus);
    let scfg = SamplerConfig {
        events: specs,
        window_divisor: settings.window_divisor,
        ring_pages: settings.ring_pages,
        stall_drain,
        ..SamplerConfig::default()
    };
    let t0 = crate::sys::time::monotonic_ns();
    let sampler = Sampler::start(&scfg, aggregator.clone())?;
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
    store.set_host_info(release, cpus.clone());

    // 3. Processes that already exist.
    let scan = aggregator.with_resolver(|r| r.scan_proc(t0));
    tracing::info!(
        processes = scan.processes,
        mappings = scan.mappings,
        unreadable = scan.unreadable,
        "scanned /proc"
    );

    // 4. Kernel symbols, control socket, READY.
    match aggregator.with_resolver(|r| r.kallsyms_snapshot()) {
        Ok(snap) => store.set_kallsyms(snap),
        Err(e) => {
            tracing::warn!(error = %e, "no kallsyms snapshot; kernel samples will not be symbolized")
        }
    }
    store.tick();
    let shared = Arc::new(Shared {
        settings: settings.clone(),
        started: Instant::now(),
        aggregator,
        store_status: Mutex::new(store.status()),
        store: Mutex::new(store),
        sampler: RwLock::new(Some(sampler)),
        counters: Mutex::new(Counters {
            lost: 0,
            throttled: 0,
            unknown_by_reason: BTreeMap::new(),
            resolved_samples: 0,
            event_times: Vec::new(),
        }),
    });
    let mut control = ControlServer::start(
        &settings.socket,
        group,
        Arc::new(ControlHandler(Arc::clone(&shared))),
    )?;

    let (tx, rx) = mpsc::channel::<Wake>();
    let mut signals = signal_hook::iterator::Signals::new([libc::SIGTERM, libc::SIGINT])
        .map_err(ServiceError::Signals)?;
    let sig_handle = signals.handle();
    {
        let tx = tx.clone();
        std::thread::Builder::new()
            .name("dcpi-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    let _ =
                        tx.send(Wake::Stop(if sig == libc::SIGINT { "SIGINT" } else { "SIGTERM" }));
                }
            })
            .map_err(ServiceError::Signals)?;
    }
    notifier.ready();
    tracing::info!(socket = %settings.socket.display(), host = %settings.host, db = %settings.db.display(), "dcpid ready");

    let deadline = settings.duration.map(|d| Instant::now() + d);
    let flush_every = settings.flush_interval;
    // Flushing runs on its own thread: a publish that hangs on a dead NFS server must neither
    // stop the watchdog pings (which only speak for the drain threads) nor the stop path.
    let flusher_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let shared = Arc::clone(&shared);
        let stop = Arc::clone(&flusher_stop);
        std::thread::Builder::new()
            .name("dcpid-flush".into())
            .spawn(move || {
                let mut next = Instant::now() + flush_every;
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    let now = Instant::now();
                    if now >= next {
                        shared.flush_tick();
                        next = Instant::now() + flush_every;
                    } else {
                        std::thread::park_timeout(next - now);
                    }
                }
            })
            .map_err(|e| ServiceError::Thread(e.to_string()))?
    };
    // Ping twice per recommended interval (a quarter of WATCHDOG_USEC): a loaded machine may
    // delay one wake-up without systemd seeing a gap.
    let watchdog_every = notifier.watchdog_interval().map(|w| w / 2);
    let mut next_status = Instant::now() + flush_every;
    let reason = loop {
        let now = Instant::now();
        let mut wake_at = next_status;
        if let Some(w) = watchdog_every {
            wake_at = wake_at.min(now + w);
        }
        if let Some(d) = deadline {
            wake_at = wake_at.min(d);
        }
        match rx.recv_timeout(wake_at.saturating_duration_since(now)) {
            Ok(Wake::Stop(why)) => break why,
            Err(mpsc::RecvTimeoutError::Disconnected) => break "signal thread gone",
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            break "--duration elapsed";
        }
        if now >= next_status {
            next_status = now + flush_every;
            notifier.status(&shared.status().one_line());
        }
        if watchdog_every.is_some() {
            let progressing = shared
                .sampler
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(|s| s.drain_threads_progressing(PROGRESS_MAX_AGE));
            if progressing {
                notifier.watchdog();
            }
        }
    };

    // Shutdown.
    tracing::info!(reason, "stopping: flushing and publishing everything");
    notifier.stopping();
    notifier.status("stopping: publishing");
    // The last publish may be slow on a shared database; ask systemd not to kill us for it.
    notifier.extend_timeout(Duration::from_secs(120));
    sig_handle.close();
    drop(tx);
    flusher_stop.store(true, std::sync::atomic::Ordering::Release);
    flusher.thread().unpark();
    if flusher.join().is_err() {
        tracing::error!("flush thread panicked");
    }
    if let Some(s) = shared.sampler.write().unwrap_or_else(|p| p.into_inner()).take() {
        s.stop();
    }
    if let Err(e) = shared.flush_everything() {
        tracing::error!(error = %e, "could not publish everything; the spool keeps it for the next start");
    }
    control.stop();
    tracing::info!("dcpid stopped");
    Ok(())
}
