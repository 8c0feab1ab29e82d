//! Opens the configured events on every online CPU, runs one drain thread per CPU (pinned to it),
//! randomizes overflow periods, counts LOST/THROTTLE records, follows CPU hotplug.
//!
//! Per CPU: one fd per event (pid = -1), the first of which carries the side-band bits and owns
//! the mmap ring; the others are redirected into it with `SET_OUTPUT`. The drain thread wakes when
//! the ring is half full, at the random re-arm instant of each `redraw_interval`
//! ([`super::redraw`]), or when a barrier asks it to ([`Sampler::barrier`]); it delivers what it
//! read to the [`SampleSink`], and at the re-arm instant redraws the periods of its CPU's events
//! with `PERF_EVENT_IOC_PERIOD` (cheap because it runs on that CPU).
//!
//! A timed wake-up always re-arms, but reads the ring only if the last read is at least
//! `read_every` old (or the ring is empty, which costs nothing to "read" and keeps an idle CPU's
//! `drained_until` moving). Reading every second or every 2-3 s costs the same per wake-up, but a
//! pass's parse and aggregation mostly pay cache misses (the ring's lines, the table buckets
//! of every key seen), which a bigger batch shares: 5-12 % less CPU for the whole daemon, side
//! by side at 1 kHz on the 2-vCPU VM (BENCHMARKS.md, "Tenth pass"). Watermark, barrier and stop
//! wake-ups always read.
//!
//! Which period stamps a sample: a redraw happens at time `T` (clock read right after the ioctl
//! returned). Samples taken before `T` were produced under the previous period even if they are
//! only read in a later pass, so each event remembers the switches its unread samples may
//! straddle ([`drain::PeriodState`]) and a sample gets the period in force at its TIME. Records carry no
//! PERIOD field ([`crate::sys::perf::SAMPLE_TYPE`]): for clock events it keeps the period given
//! at open time.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;

use crate::faults::Faults;
use crate::perf::callchain::StackTables;
use crate::perf::events::{self, EventKind, EventSpec};
use crate::sys;
use crate::sys::perf::{self as sp, AttrSpec, EventFd, PerfFd, RingMap};
use crate::sys::time::monotonic_ns;
use crate::types::{EventIdx, SampleSink};
use crate::watch::Watch;

mod cpus;
mod drain;
mod resolve_events;

pub use cpus::{
    cpu_changes, online_cpus, parse_cpu_list, possible_cpus, read_cpu_list, ONLINE_CPUS,
    POSSIBLE_CPUS,
};
pub use drain::{read_pass, read_pass_stacks, PassCounts};

use cpus::{cfg_online_cpus, supervise, Hotplug, HOTPLUG_THREAD};
use drain::drain_thread;
use resolve_events::{resolve_events, EventPlan};

/// Longest `redraw_interval`: a drain thread reports `drained_until` only when it reads its
/// ring, and the aggregator leaves a CPU silent for [`crate::aggregate::STALE_AFTER`] (6 s) out
/// of its watermark: a live thread is silent at most `read_every` plus two windows (4.3 s).
pub const MAX_REDRAW_INTERVAL: Duration = Duration::from_millis(1400);

/// Longest `read_every` (see [`MAX_REDRAW_INTERVAL`]).
pub const MAX_READ_EVERY: Duration = Duration::from_millis(1500);

#[derive(Clone, Debug)]
pub struct SamplerConfig {
    pub events: Vec<EventSpec>,
    /// Periods are drawn from `[P - P/2D, P + P/2D]`: a window of width `P/D` centred on the
    /// nominal period, so that the mean rate is the one asked for (as `perf record -c P`).
    pub window_divisor: u64,
    /// Data pages per CPU ring (power of two). The drain thread wakes when half of it is full.
    pub ring_pages: usize,
    /// Every drain thread re-arms its periods once per window of this length, at a random
    /// instant of the window (its only timed wake-up).
    pub redraw_interval: Duration,
    /// A timed wake-up reads the ring only if the last read is at least this old (module docs);
    /// zero: at every wake-up. The daemon uses `min(1.5 s, flush_interval / 3)`, so that a
    /// flush still finds what is at most a few seconds old.
    pub read_every: Duration,
    /// false: keep every event at its nominal period P (for comparisons; never in production).
    pub randomize: bool,
    /// How often the online CPU list is re-read.
    pub hotplug_interval: Duration,
    /// true: a thread of its own re-reads the online CPU list every `hotplug_interval`.
    /// false: the owner calls [`Sampler::hotplug_tick`] about that often (the daemon does it
    /// from its flush thread, which wakes every few seconds anyway: one thread and one timer
    /// wake-up fewer, ~0.02 ms/s on a VM).
    pub hotplug_thread: bool,
    /// Faults injected by tests (none by default; never set from configuration).
    pub faults: Faults,
    /// Run drain threads `SCHED_FIFO` (priority 1) so that they run as soon as the ring wakes
    /// them instead of at the next scheduler tick; see README.md (phase locking).
    pub realtime_drain: bool,
    /// Test hook: read the online CPU list from this file instead of [`ONLINE_CPUS`].
    pub online_cpus_path: Option<std::path::PathBuf>,
    /// The daemon's thread watch: drain and hotplug threads run under it (a panic is
    /// recorded, and status says degraded). `None`: plain threads.
    pub watch: Option<Arc<Watch>>,
    /// `callchains = "fp"`: sample call chains (at most `max_stack()` frames) and intern them
    /// into these per-CPU tables, which the aggregator reads. `None`: flat samples only.
    pub stacks: Option<Arc<StackTables>>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            events: vec![EventSpec {
                name: "auto".to_string(),
                kind: EventKind::Auto,
                period: None,
            }],
            window_divisor: 16,
            ring_pages: 128,
            redraw_interval: Duration::from_secs(1),
            read_every: Duration::ZERO,
            randomize: true,
            hotplug_interval: Duration::from_secs(5),
            hotplug_thread: true,
            faults: Faults::default(),
            realtime_drain: true,
            online_cpus_path: None,
            watch: None,
            stacks: None,
        }
    }
}

/// Whether an event counts in hardware, in software, or is cpu-clock standing in for a hardware
/// event the machine cannot count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventSource {
    Hardware,
    Software,
    Fallback,
}

impl EventSource {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Hardware => "hardware",
            Self::Software => "software",
            Self::Fallback => "fallback",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct OpenedEvent {
    pub desc: profile_format::EventDesc,
    pub source: EventSource,
    /// What the user asked for (`auto`, `cycles:1000000`, ...).
    pub requested: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("cannot open event `{event}` on CPU {cpu}: {errno_name}: {source}")]
    Open {
        event: String,
        cpu: u32,
        errno_name: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("cannot read {path}: {source}")]
    OnlineList {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("bad CPU list in {path}: `{text}`")]
    BadCpuList { path: String, text: String },
    #[error("no online CPU could be sampled: {0}")]
    NoCpu(String),
    #[error("invalid sampler configuration: {0}")]
    Config(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
}

/// Symbolic name of the errnos `perf_event_open` commonly returns.
pub fn errno_name(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ENOENT) => "ENOENT",
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP",
        Some(libc::EACCES) => "EACCES",
        Some(libc::EPERM) => "EPERM",
        Some(libc::EINVAL) => "EINVAL",
        Some(libc::ENODEV) => "ENODEV",
        Some(libc::EBUSY) => "EBUSY",
        Some(libc::EMFILE) => "EMFILE",
        Some(libc::ENFILE) => "ENFILE",
        Some(libc::E2BIG) => "E2BIG",
        Some(libc::ENOSPC) => "ENOSPC",
        Some(libc::ENOMEM) => "ENOMEM",
        Some(libc::ESRCH) => "ESRCH",
        Some(libc::EOVERFLOW) => "EOVERFLOW",
        Some(_) => "errno",
        None => "error",
    }
}

/// Per-CPU counters, shared between the drain thread and status readers.
#[derive(Debug)]
struct CpuStats {
    cpu: u32,
    online: AtomicBool,
    /// Ask the thread to exit (CPU went offline).
    stop: AtomicBool,
    samples: AtomicU64,
    per_event: Vec<AtomicU64>,
    lost: AtomicU64,
    throttled: AtomicU64,
    unthrottled: AtomicU64,
    malformed: AtomicU64,
    periods: Vec<AtomicU64>,
    redraws: AtomicU64,
    time_enabled: Vec<AtomicU64>,
    time_running: Vec<AtomicU64>,
    /// `monotonic_ns` of the last completed loop iteration (0 = none yet).
    heartbeat: AtomicU64,
    /// Everything this CPU's ring held with a time below this has been given to the sink.
    drained_until: AtomicU64,
    /// Wakes this CPU's drain thread alone (barrier requests).
    kick: EventFd,
    /// Loop iterations (poll returns), and the CPU time the drain thread has used: read from
    /// its CPU-time clock while it runs (`clock`, [`NO_CLOCK`] when there is none), kept in
    /// `cpu_ns` when it ends.
    wakeups: AtomicU64,
    cpu_ns: AtomicU64,
    clock: AtomicI64,
    /// Where the passes' time goes (ns of the monotonic clock, summed): reading and parsing
    /// the ring, the sink's aggregation, the period re-arms. Two clock reads per pass (vDSO,
    /// tens of ns) against a pass of tens of µs: cheap enough to keep on.
    parse_ns: AtomicU64,
    aggregate_ns: AtomicU64,
    rearm_ns: AtomicU64,
    error: Mutex<Option<String>>,
}

const NO_CLOCK: i64 = i64::MAX;

impl CpuStats {
    fn new(cpu: u32, nevents: usize) -> io::Result<Self> {
        let v = || (0..nevents).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Ok(Self {
            cpu,
            online: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            samples: AtomicU64::new(0),
            per_event: v(),
            lost: AtomicU64::new(0),
            throttled: AtomicU64::new(0),
            unthrottled: AtomicU64::new(0),
            malformed: AtomicU64::new(0),
            periods: v(),
            redraws: AtomicU64::new(0),
            time_enabled: v(),
            time_running: v(),
            heartbeat: AtomicU64::new(0),
            drained_until: AtomicU64::new(0),
            kick: EventFd::new()?,
            wakeups: AtomicU64::new(0),
            cpu_ns: AtomicU64::new(0),
            clock: AtomicI64::new(NO_CLOCK),
            parse_ns: AtomicU64::new(0),
            aggregate_ns: AtomicU64::new(0),
            rearm_ns: AtomicU64::new(0),
            error: Mutex::new(None),
        })
    }

    /// The drain thread's CPU time so far.
    fn cpu_ns(&self) -> u64 {
        let kept = self.cpu_ns.load(Ordering::Acquire);
        let clock = self.clock.load(Ordering::Acquire);
        let now = i32::try_from(clock).ok().and_then(sys::time::clock_ns).unwrap_or(0);
        kept.max(now)
    }

    fn set_error(&self, msg: String) {
        *lock(&self.error) = Some(msg);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking drain thread must not take status down with it.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[derive(Debug)]
struct CpuSlot {
    stats: Arc<CpuStats>,
    thread: Option<JoinHandle<()>>,
    last_attempt: Instant,
}

struct Shared {
    cfg: SamplerConfig,
    plans: Vec<EventPlan>,
    names: Vec<String>,
    sink: Arc<dyn SampleSink>,
    stop: AtomicBool,
    wake: EventFd,
    /// The newest barrier instant asked for (perf clock; 0 = none).
    barrier_until: AtomicU64,
    build_id: AtomicBool,
    /// Samples carry `PERF_SAMPLE_CGROUP` (cleared, for every CPU, when the kernel refuses it).
    cgroup: AtomicBool,
    started: Instant,
    cpus: Mutex<BTreeMap<u32, CpuSlot>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("names", &self.names).finish_non_exhaustive()
    }
}

/// Everything opened on one CPU; moved into its drain thread.
#[derive(Debug)]
struct CpuRing {
    fds: Vec<PerfFd>,
    ring: RingMap,
    ids: Vec<u64>,
    periods: Vec<u64>,
}

fn attr_for(
    shared_cfg: &SamplerConfig,
    plan: &EventPlan,
    period: u64,
    sideband: bool,
    build_id: bool,
) -> AttrSpec {
    let pages = shared_cfg.ring_pages.max(1);
    let data_bytes = pages.saturating_mul(sp::page_size());
    // Half the ring: the drain thread has the other half of the time to answer.
    let wm = (data_bytes / 2).max(sp::SAMPLE_RECORD_SIZE);
    AttrSpec {
        perf_type: plan.perf_type,
        config: plan.config,
        period,
        sideband,
        build_id: sideband && build_id,
        wakeup_watermark: u32::try_from(wm).unwrap_or(u32::MAX),
        cgroup: false,
        max_stack: shared_cfg.stacks.as_ref().map_or(0, |t| t.max_stack()),
        user_stack: shared_cfg.stacks.as_ref().map_or(0, |t| t.user_stack()),
        context_switch: false,
        lean: false,
        raw: false,
        exits: false,
    }
}

/// `perf_event_open`, or the ENOENT a PMU-less machine gives when simulating one.
fn open_fd(cfg: &SamplerConfig, spec: &AttrSpec, cpu: u32) -> io::Result<PerfFd> {
    if cfg.faults.simulate_no_pmu
        && matches!(spec.perf_type, sp::PERF_TYPE_HARDWARE | sp::PERF_TYPE_RAW)
    {
        return Err(io::Error::from_raw_os_error(libc::ENOENT));
    }
    PerfFd::open(spec, cpu)
}

fn open_cpu(shared: &Shared, cpu: u32, rng: &mut StdRng) -> Result<CpuRing, (usize, io::Error)> {
    let mut fds = Vec::with_capacity(shared.plans.len());
    let mut periods = Vec::with_capacity(shared.plans.len());
    for (i, plan) in shared.plans.iter().enumerate() {
        let period = plan.draw(rng);
        let sideband = i == 0;
        let build_id = shared.build_id.load(Ordering::Relaxed);
        if i == 0 && shared.cgroup.load(Ordering::Relaxed) {
            // Every event of the ring must have the same sample layout, so the choice is made
            // on the first event of the first CPU and kept.
            let mut spec = attr_for(&shared.cfg, plan, period, sideband, build_id);
            spec.cgroup = true;
            if let Err(e) = PerfFd::open(&spec, cpu) {
                if e.raw_os_error() == Some(libc::EINVAL) {
                    shared.cgroup.store(false, Ordering::Relaxed);
                    tracing::warn!(
                        "kernel refuses PERF_SAMPLE_CGROUP (before 5.7?): no per-cgroup \
                         attribution; commands, pids and CPUs are still recorded"
                    );
                }
            }
        }
        let with_cgroup = |mut s: sp::AttrSpec| {
            s.cgroup = shared.cgroup.load(Ordering::Relaxed);
            s
        };
        let fd = match PerfFd::open(
            &with_cgroup(attr_for(&shared.cfg, plan, period, sideband, build_id)),
            cpu,
        ) {
            Err(e) if sideband && build_id && e.raw_os_error() == Some(libc::EINVAL) => {
                // Kernels before 5.12 do not know attr.build_id.
                let r = open_fd(
                    &shared.cfg,
                    &with_cgroup(attr_for(&shared.cfg, plan, period, true, false)),
                    cpu,
                );
                if r.is_ok() {
                    shared.build_id.store(false, Ordering::Relaxed);
                    tracing::info!(
                        "kernel does not put build-ids in MMAP2 records; relying on /proc"
                    );
                }
                r
            }
            r => r,
        }
        .map_err(|e| (i, e))?;
        fds.push(fd);
        periods.push(period);
    }
    let ring = RingMap::new(&fds[0], shared.cfg.ring_pages).map_err(|e| (0, e))?;
    for (i, fd) in fds.iter().enumerate().skip(1) {
        fd.set_output(&fds[0]).map_err(|e| (i, e))?;
    }
    let mut ids = Vec::with_capacity(fds.len());
    for (i, fd) in fds.iter().enumerate() {
        ids.push(fd.id().map_err(|e| (i, e))?);
    }
    for (i, fd) in fds.iter().enumerate() {
        fd.enable().map_err(|e| (i, e))?;
    }
    Ok(CpuRing { fds, ring, ids, periods })
}

fn spawn_cpu(
    shared: &Arc<Shared>,
    cpu: u32,
    ring: CpuRing,
    stats: Arc<CpuStats>,
) -> io::Result<JoinHandle<()>> {
    stats.online.store(true, Ordering::Release);
    stats.stop.store(false, Ordering::Release);
    stats.heartbeat.store(monotonic_ns(), Ordering::Release);
    *lock(&stats.error) = None;
    for (i, p) in ring.periods.iter().enumerate() {
        stats.periods[i].store(*p, Ordering::Relaxed);
    }
    let sh = Arc::clone(shared);
    let st = Arc::clone(&stats);
    let name = format!("dcpi-drain-{cpu}");
    // A drain thread may end on its own (CPU offline, events hung up): only a panic counts.
    let r = match &shared.cfg.watch {
        Some(w) => w.spawn(name, false, move || drain_thread(&sh, &st, ring)),
        None => std::thread::Builder::new().name(name).spawn(move || drain_thread(&sh, &st, ring)),
    };
    if r.is_err() {
        stats.online.store(false, Ordering::Release);
    }
    r
}

/// Runs the drain threads; see the module documentation.
#[derive(Debug)]
pub struct Sampler {
    shared: Arc<Shared>,
    events: Vec<OpenedEvent>,
    supervisor: Option<JoinHandle<()>>,
    /// The hotplug state when the owner drives it ([`SamplerConfig::hotplug_thread`] false).
    hotplug: Mutex<Option<Hotplug>>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct CpuStatus {
    pub cpu: u32,
    /// A drain thread is running with the events open on this CPU.
    pub online: bool,
    pub samples: u64,
    /// Samples per event (same order as [`Sampler::events`]).
    pub samples_per_event: Vec<u64>,
    pub lost: u64,
    pub throttled: u64,
    pub unthrottled: u64,
    /// Records that could not be parsed.
    pub malformed: u64,
    /// Period currently in force, per event.
    pub periods: Vec<u64>,
    pub period_redraws: u64,
    /// Times the drain thread woke (ring half full, re-arm instant, barrier, stop).
    pub wakeups: u64,
    /// CPU time the drain thread has used (ns).
    pub drain_cpu_ns: u64,
    /// Parts of it, timed inside each pass (ns): reading and parsing the ring, aggregating,
    /// re-arming the period.
    pub parse_ns: u64,
    pub aggregate_ns: u64,
    pub rearm_ns: u64,
    /// Milliseconds since the drain thread last completed a loop (None: never).
    pub last_progress_ms: Option<u64>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct EventStatus {
    pub name: String,
    pub requested: String,
    pub source: EventSource,
    pub period_min: u64,
    pub period_max: u64,
    pub samples: u64,
    /// Sums over CPUs (ns).
    pub time_enabled: u64,
    pub time_running: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SamplerStatus {
    pub window_divisor: u64,
    pub randomize: bool,
    pub build_id_in_mmap2: bool,
    pub events: Vec<EventStatus>,
    pub cpus: Vec<CpuStatus>,
}

fn validate(cfg: &SamplerConfig) -> Result<(), SamplerError> {
    if cfg.events.is_empty() {
        return Err(SamplerError::Config("no events".into()));
    }
    if cfg.ring_pages == 0 || !cfg.ring_pages.is_power_of_two() {
        return Err(SamplerError::Config(format!(
            "ring_pages must be a power of two, got {}",
            cfg.ring_pages
        )));
    }
    if cfg.read_every > MAX_READ_EVERY {
        return Err(SamplerError::Config(format!(
            "read_every must be at most {MAX_READ_EVERY:?}, got {:?}",
            cfg.read_every
        )));
    }
    if cfg.redraw_interval < Duration::from_millis(1) || cfg.redraw_interval > MAX_REDRAW_INTERVAL {
        return Err(SamplerError::Config(format!(
            "redraw_interval must be between 1ms and {MAX_REDRAW_INTERVAL:?}, got {:?}",
            cfg.redraw_interval
        )));
    }
    if cfg.window_divisor == 0 {
        return Err(SamplerError::Config("window_divisor must be at least 1".into()));
    }
    if cfg.events.len() > usize::from(EventIdx::MAX) {
        return Err(SamplerError::Config("too many events".into()));
    }
    Ok(())
}

impl Sampler {
    /// Open every event on every online CPU and start the drain threads.
    pub fn start(cfg: &SamplerConfig, sink: Arc<dyn SampleSink>) -> Result<Self, SamplerError> {
        validate(cfg)?;
        let online = cfg_online_cpus(cfg)?;
        let Some(&first) = online.first() else {
            return Err(SamplerError::NoCpu(format!("{ONLINE_CPUS} lists no CPU")));
        };
        let (plans, events) = resolve_events(cfg, first)?;
        let wake =
            EventFd::new().map_err(|source| SamplerError::Io { what: "eventfd".into(), source })?;
        let names = events.iter().map(|e| e.desc.name.clone()).collect();
        let shared = Arc::new(Shared {
            cfg: cfg.clone(),
            plans,
            names,
            sink,
            stop: AtomicBool::new(false),
            wake,
            barrier_until: AtomicU64::new(0),
            build_id: AtomicBool::new(true),
            cgroup: AtomicBool::new(true),
            started: Instant::now(),
            cpus: Mutex::new(BTreeMap::new()),
        });
        let mut rng = rand::make_rng::<StdRng>();
        let mut first_error: Option<SamplerError> = None;
        let mut running = 0usize;
        for &cpu in &online {
            let stats = Arc::new(CpuStats::new(cpu, shared.plans.len()).map_err(|source| {
                SamplerError::Io { what: format!("eventfd for CPU {cpu}"), source }
            })?);
            let thread = match open_cpu(&shared, cpu, &mut rng) {
                Ok(ring) => match spawn_cpu(&shared, cpu, ring, Arc::clone(&stats)) {
                    Ok(h) => {
                        running += 1;
                        Some(h)
                    }
                    Err(e) => {
                        stats.set_error(format!("spawn: {e}"));
                        None
                    }
                },
                Err((i, e)) => {
                    let name = shared.names.get(i).cloned().unwrap_or_default();
                    tracing::warn!(cpu, event = %name, error = %e, "cannot open event on CPU; will retry");
                    stats.set_error(format!("{name}: {}: {e}", errno_name(&e)));
                    if first_error.is_none() {
                        first_error = Some(SamplerError::Open {
                            event: name,
                            cpu,
                            errno_name: errno_name(&e),
                            source: e,
                        });
                    }
                    None
                }
            };
            lock(&shared.cpus).insert(cpu, CpuSlot { stats, thread, last_attempt: Instant::now() });
        }
        let mut sampler = Self { shared, events, supervisor: None, hotplug: Mutex::new(None) };
        if running == 0 {
            sampler.shutdown();
            return Err(first_error
                .unwrap_or_else(|| SamplerError::NoCpu("no drain thread started".into())));
        }
        if cfg.hotplug_thread {
            let sh = Arc::clone(&sampler.shared);
            let sup = match &cfg.watch {
                Some(w) => w.spawn(HOTPLUG_THREAD.into(), true, move || supervise(&sh)),
                None => std::thread::Builder::new()
                    .name(HOTPLUG_THREAD.into())
                    .spawn(move || supervise(&sh)),
            }
            .map_err(|source| SamplerError::Io { what: "spawn hotplug thread".into(), source });
            match sup {
                Ok(h) => sampler.supervisor = Some(h),
                Err(e) => {
                    sampler.shutdown();
                    return Err(e);
                }
            }
        } else {
            *lock(&sampler.hotplug) = Some(Hotplug::default());
        }
        tracing::info!(
            cpus = running,
            events = ?sampler.events.iter().map(|e| e.desc.name.as_str()).collect::<Vec<_>>(),
            "sampling started"
        );
        Ok(sampler)
    }

    pub fn events(&self) -> &[OpenedEvent] {
        &self.events
    }

    pub fn status(&self) -> SamplerStatus {
        let now = monotonic_ns();
        let cpus = lock(&self.shared.cpus);
        let n = self.events.len();
        let mut enabled = vec![0u64; n];
        let mut running = vec![0u64; n];
        let mut per_event = vec![0u64; n];
        let mut out = Vec::with_capacity(cpus.len());
        for slot in cpus.values() {
            let s = &slot.stats;
            let load = |v: &Vec<AtomicU64>| {
                v.iter().map(|a| a.load(Ordering::Relaxed)).collect::<Vec<u64>>()
            };
            let spe = load(&s.per_event);
            for i in 0..n {
                per_event[i] += spe[i];
                enabled[i] += s.time_enabled[i].load(Ordering::Relaxed);
                running[i] += s.time_running[i].load(Ordering::Relaxed);
            }
            let hb = s.heartbeat.load(Ordering::Acquire);
            out.push(CpuStatus {
                cpu: s.cpu,
                online: s.online.load(Ordering::Acquire),
                samples: s.samples.load(Ordering::Relaxed),
                samples_per_event: spe,
                lost: s.lost.load(Ordering::Relaxed),
                throttled: s.throttled.load(Ordering::Relaxed),
                unthrottled: s.unthrottled.load(Ordering::Relaxed),
                malformed: s.malformed.load(Ordering::Relaxed),
                periods: load(&s.periods),
                period_redraws: s.redraws.load(Ordering::Relaxed),
                wakeups: s.wakeups.load(Ordering::Relaxed),
                drain_cpu_ns: s.cpu_ns(),
                parse_ns: s.parse_ns.load(Ordering::Relaxed),
                aggregate_ns: s.aggregate_ns.load(Ordering::Relaxed),
                rearm_ns: s.rearm_ns.load(Ordering::Relaxed),
                last_progress_ms: (hb != 0).then(|| now.saturating_sub(hb) / 1_000_000),
                error: lock(&s.error).clone(),
            });
        }
        SamplerStatus {
            window_divisor: self.shared.cfg.window_divisor,
            randomize: self.shared.cfg.randomize,
            build_id_in_mmap2: self.shared.build_id.load(Ordering::Relaxed),
            events: self
                .events
                .iter()
                .enumerate()
                .map(|(i, e)| EventStatus {
                    name: e.desc.name.clone(),
                    requested: e.requested.clone(),
                    source: e.source,
                    period_min: e.desc.period_min,
                    period_max: e.desc.period_max,
                    samples: per_event[i],
                    time_enabled: enabled[i],
                    time_running: running[i],
                })
                .collect(),
            cpus: out,
        }
    }

    /// Every live drain thread completed a loop iteration within `max_age` (and at least one
    /// is live).
    pub fn drain_threads_progressing(&self, max_age: Duration) -> bool {
        let now = monotonic_ns();
        let max = u64::try_from(max_age.as_nanos()).unwrap_or(u64::MAX);
        let cpus = lock(&self.shared.cpus);
        let mut live = 0;
        for slot in cpus.values() {
            if !slot.stats.online.load(Ordering::Acquire) {
                continue;
            }
            live += 1;
            let hb = slot.stats.heartbeat.load(Ordering::Acquire);
            if now.saturating_sub(hb) > max {
                return false;
            }
        }
        live > 0
    }

    /// A barrier at the instant `until` (perf clock): every live drain thread reads its ring
    /// (everything recorded before `until`) and hands it to the sink, and this waits for all
    /// of them, at most `timeout`. Returns the CPUs whose drain thread did not answer in time.
    pub fn barrier(&self, until: u64, timeout: Duration) -> Vec<u32> {
        self.shared.barrier_until.fetch_max(until, Ordering::AcqRel);
        let live: Vec<Arc<CpuStats>> = lock(&self.shared.cpus)
            .values()
            .filter(|s| s.thread.is_some() && s.stats.online.load(Ordering::Acquire))
            .map(|s| Arc::clone(&s.stats))
            .collect();
        for st in &live {
            if let Err(e) = st.kick.signal() {
                tracing::warn!(cpu = st.cpu, error = %e, "cannot wake a drain thread for a barrier");
            }
        }
        let deadline = Instant::now() + timeout;
        loop {
            let waiting: Vec<u32> = live
                .iter()
                .filter(|s| {
                    s.online.load(Ordering::Acquire)
                        && s.drained_until.load(Ordering::Acquire) < until
                })
                .map(|s| s.cpu)
                .collect();
            if waiting.is_empty() || Instant::now() >= deadline {
                return waiting;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Follow CPU hotplug once, on the caller's thread, when the sampler was started without a
    /// hotplug thread (otherwise nothing to do). Stops the drain threads of CPUs that went
    /// offline and opens the CPUs that came online. Returns the online list it read, for the
    /// owner's other per-CPU sources (None: no check was made, or the list was unreadable).
    pub fn hotplug_tick(&self) -> Option<Vec<u32>> {
        if self.shared.stop.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.hotplug).as_mut().and_then(|hp| hp.step(&self.shared))
    }

    /// How long the sampler has been running.
    pub fn uptime(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Disable the events, let every drain thread deliver a final pass, join them. Returns the
    /// final status: the counters' enabled/running times the threads read as they stopped are
    /// only there (they read them every few seconds while running).
    pub fn stop(mut self) -> SamplerStatus {
        self.shutdown();
        self.status()
    }

    fn shutdown(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Err(e) = self.shared.wake.signal() {
            tracing::warn!(error = %e, "cannot wake drain threads; they stop within their poll timeout");
        }
        if let Some(h) = self.supervisor.take() {
            drop(h.join());
        }
        let handles: Vec<JoinHandle<()>> =
            lock(&self.shared.cpus).values_mut().filter_map(|s| s.thread.take()).collect();
        for h in handles {
            if h.join().is_err() {
                tracing::error!("a drain thread panicked");
            }
        }
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        if !self.shared.stop.load(Ordering::Acquire) {
            self.shutdown();
        }
    }
}

/// Check that sampling works: open cpu-clock system-wide on the first online CPU.
pub fn probe() -> Result<String, SamplerError> {
    let online = online_cpus()?;
    let Some(&cpu) = online.first() else {
        return Err(SamplerError::NoCpu(format!("{ONLINE_CPUS} lists no CPU")));
    };
    let cfg = SamplerConfig::default();
    let clock = EventKind::Software(sp::PERF_COUNT_SW_CPU_CLOCK as u64);
    let plan = EventPlan::new(clock, events::default_period(&clock), &cfg);
    let fd = PerfFd::open(&attr_for(&cfg, &plan, plan.max, true, true), cpu)
        .or_else(|_| PerfFd::open(&attr_for(&cfg, &plan, plan.max, true, false), cpu))
        .map_err(|e| SamplerError::Open {
            event: "cpu-clock".into(),
            cpu,
            errno_name: errno_name(&e),
            source: e,
        })?;
    drop(fd);
    let hw = EventKind::Hardware(sp::PERF_COUNT_HW_CPU_CYCLES as u64);
    let hwplan = EventPlan::new(hw, events::default_period(&hw), &cfg);
    let pmu = match PerfFd::open(&attr_for(&cfg, &hwplan, hwplan.max, false, false), cpu) {
        Ok(_) => "hardware PMU available (cycles opens)".to_string(),
        Err(e) => {
            format!("no hardware PMU (cycles: {}), `auto` will use cpu-clock", errno_name(&e))
        }
    };
    Ok(format!(
        "perf_event_open works: cpu-clock opened system-wide on CPU {cpu}; {} online CPUs; {pmu}",
        online.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_validated() {
        let bad = SamplerConfig { ring_pages: 100, ..SamplerConfig::default() };
        assert!(validate(&bad).unwrap_err().to_string().contains("ring_pages"));
        let bad = SamplerConfig { events: vec![], ..SamplerConfig::default() };
        assert!(validate(&bad).is_err());
        let bad = SamplerConfig { window_divisor: 0, ..SamplerConfig::default() };
        assert!(validate(&bad).is_err());
        assert!(validate(&SamplerConfig::default()).is_ok());
    }
}
