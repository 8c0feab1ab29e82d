//! Opens the configured events on every online CPU, runs one drain thread per CPU (pinned to it),
//! randomizes overflow periods, counts LOST/THROTTLE records, follows CPU hotplug.
//!
//! Per CPU: one fd per event (pid = -1), the first of which carries the side-band bits and owns
//! the mmap ring; the others are redirected into it with SET_OUTPUT. The drain thread wakes when
//! the ring is half full, at the random re-arm instant of each `redraw_interval`
//! ([`super::redraw`]), or when a barrier asks it to ([`Sampler::barrier`]); it delivers what it
//! read to the [`SampleSink`], and at the re-arm instant redraws the periods of its CPU's events
//! with PERF_EVENT_IOC_PERIOD (cheap because it runs on that CPU).
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
//! straddle ([`PeriodState`]) and a sample gets the period in force at its TIME. Records carry no
//! PERIOD field ([`crate::sys::perf::SAMPLE_TYPE`]): for clock events it keeps the period given
//! at open time.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::RngExt;

use crate::perf::events::{self, EventKind, EventSpec};
use crate::perf::records::{self, Record};
use crate::perf::redraw::{self, RedrawSchedule};
use crate::perf::ring::{RingBuffer, RingReader};
use crate::sys::perf::{self as sp, AttrSpec, EventFd, PerfFd, RingMap};
use crate::sys::time::{monotonic_ns, thread_cpu_ns};
use crate::types::{EventIdx, Sample, SampleSink, TimedSideBand};

/// Where the list of online CPUs comes from.
pub const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// `drained_until` lags the clock read before `data_head` by this much, for records whose time
/// was taken just before they were written.
const DRAIN_SLACK_NS: u64 = 1_000_000;

/// How often each drain thread reads time_enabled/time_running of its fds: they go into the
/// summary at flushes (5 s by default) and once more when the thread stops, so a read at most
/// every few wake-ups (a syscall each) is enough.
const TIMES_INTERVAL_NS: u64 = 5_000_000_000;

/// Longest `redraw_interval`: a drain thread reports `drained_until` only when it reads its
/// ring, and the aggregator leaves a CPU silent for [`crate::aggregate::STALE_AFTER`] (6 s) out
/// of its watermark: a live thread is silent at most `read_every` plus two windows (4.3 s).
pub const MAX_REDRAW_INTERVAL: Duration = Duration::from_millis(1400);

/// Longest `read_every` (see [`MAX_REDRAW_INTERVAL`]).
pub const MAX_READ_EVERY: Duration = Duration::from_millis(1500);

/// At most one loss/throttle warning per CPU per this interval.
const WARN_INTERVAL: Duration = Duration::from_secs(60);

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
    pub faults: crate::faults::Faults,
    /// Run drain threads SCHED_FIFO (priority 1) so that they run as soon as the ring wakes
    /// them instead of at the next scheduler tick; see README.md (phase locking).
    pub realtime_drain: bool,
    /// Test hook: read the online CPU list from this file instead of [`ONLINE_CPUS`].
    pub online_cpus_path: Option<std::path::PathBuf>,
    /// The daemon's thread watch: drain and hotplug threads run under it (a panic is
    /// recorded, and status says degraded). `None`: plain threads.
    pub watch: Option<Arc<crate::watch::Watch>>,
    /// `callchains = "fp"`: sample call chains (at most `max_stack()` frames) and intern them
    /// into these per-CPU tables, which the aggregator reads. `None`: flat samples only.
    pub stacks: Option<Arc<crate::perf::callchain::StackTables>>,
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
            faults: crate::faults::Faults::default(),
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

/// Symbolic name of the errnos perf_event_open commonly returns.
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

/// Parse a kernel CPU list (`0-3,5,8-9`).
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    let t = text.trim();
    if t.is_empty() {
        return Some(out);
    }
    for part in t.split(',') {
        let part = part.trim();
        if let Some((a, b)) = part.split_once('-') {
            let a: u32 = a.trim().parse().ok()?;
            let b: u32 = b.trim().parse().ok()?;
            if b < a || b - a > 65536 {
                return None;
            }
            out.extend(a..=b);
        } else {
            out.push(part.parse().ok()?);
        }
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// The online CPUs, from [`ONLINE_CPUS`].
pub fn online_cpus() -> Result<Vec<u32>, SamplerError> {
    read_cpu_list(std::path::Path::new(ONLINE_CPUS))
}

/// A CPU list file in the kernel's format.
pub fn read_cpu_list(path: &std::path::Path) -> Result<Vec<u32>, SamplerError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| SamplerError::OnlineList { path: path.display().to_string(), source })?;
    parse_cpu_list_of(path, &text)
}

/// [`parse_cpu_list`] of the online list read from `path`, with an error that names the file.
/// A list that names no CPU is an error too: the kernel always has one CPU online, so an empty
/// read is a file caught between its truncation and its write (the hotplug tests rewrite theirs
/// in place), and following it would stop every drain thread.
fn parse_cpu_list_of(path: &std::path::Path, text: &str) -> Result<Vec<u32>, SamplerError> {
    parse_cpu_list(text).filter(|cpus| !cpus.is_empty()).ok_or_else(|| SamplerError::BadCpuList {
        path: path.display().to_string(),
        text: text.trim().chars().take(200).collect(),
    })
}

fn cfg_online_cpus(cfg: &SamplerConfig) -> Result<Vec<u32>, SamplerError> {
    match &cfg.online_cpus_path {
        Some(p) => read_cpu_list(p),
        None => online_cpus(),
    }
}

/// The online CPU list, re-read through one open file: a periodic hotplug check then costs one
/// `pread` at offset 0 (sysfs regenerates the text), not a path walk through sysfs and an open,
/// which were most of a quiet flush's CPU. Reopened after an error.
#[derive(Debug, Default)]
struct CpuListFile {
    file: Option<std::fs::File>,
}

impl CpuListFile {
    fn read(&mut self, cfg: &SamplerConfig) -> Result<Vec<u32>, SamplerError> {
        use std::os::unix::fs::FileExt;
        let path = cfg.online_cpus_path.as_deref().unwrap_or(std::path::Path::new(ONLINE_CPUS));
        let io_err = |source| SamplerError::OnlineList { path: path.display().to_string(), source };
        let file = match self.file.take() {
            Some(f) => f,
            None => std::fs::File::open(path).map_err(io_err)?,
        };
        let mut text = Vec::with_capacity(64);
        let mut buf = [0u8; 256];
        loop {
            // Bounded: a CPU list of the largest machines is a few KiB.
            let n = file.read_at(&mut buf, text.len() as u64).map_err(io_err)?;
            if n == 0 || text.len() > 1 << 20 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
        }
        self.file = Some(file);
        parse_cpu_list_of(path, &String::from_utf8_lossy(&text))
    }
}

/// One configured event, resolved (auto → cycles or cpu-clock) with its period window.
#[derive(Clone, Debug)]
struct EventPlan {
    perf_type: u32,
    config: u64,
    min: u64,
    max: u64,
    time_based: bool,
}

impl EventPlan {
    fn new(kind: EventKind, period: u64, cfg: &SamplerConfig) -> Self {
        let (perf_type, config) = events::perf_type_config(&kind);
        let nominal = period.max(1);
        // Centred on the nominal period: a window below it (`[P - P/D, P]`, until issue 13's
        // seventh pass) sampled 3.2 % faster than asked, so "the same rate" as perf was not.
        let half = if cfg.randomize && cfg.window_divisor > 0 {
            nominal / cfg.window_divisor / 2
        } else {
            0
        };
        let (min, max) = ((nominal - half).max(1), nominal.saturating_add(half));
        Self { perf_type, config, min, max, time_based: events::period_is_time(&kind) }
    }

    fn draw(&self, rng: &mut StdRng) -> u64 {
        if self.min >= self.max {
            self.max
        } else {
            rng.random_range(self.min..=self.max)
        }
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
    /// monotonic_ns of the last completed loop iteration (0 = none yet).
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
        let now = i32::try_from(clock).ok().and_then(crate::sys::time::clock_ns).unwrap_or(0);
        kept.max(now)
    }

    fn set_error(&self, msg: String) {
        *lock(&self.error) = Some(msg);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking drain thread must not take status down with it.
    m.lock().unwrap_or_else(|p| p.into_inner())
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
    /// Samples carry PERF_SAMPLE_CGROUP (cleared, for every CPU, when the kernel refuses it).
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
    }
}

/// perf_event_open, or the ENOENT a PMU-less machine gives when simulating one.
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

/// The period in force for one event on one CPU, and the ones before the re-arms that samples
/// not yet read may straddle.
#[derive(Clone, Debug)]
struct PeriodState {
    cur: u64,
    /// `(switch time, period before it)` of the switches that samples not yet read may
    /// straddle, oldest first: a sample with TIME before a switch was taken under the period
    /// before it. Emptied as passes read past them (a few entries at most).
    switches: Vec<(u64, u64)>,
}

impl PeriodState {
    fn new(period: u64) -> Self {
        Self { cur: period, switches: Vec::new() }
    }

    fn at(&self, time: u64) -> u64 {
        self.switches.iter().find(|&&(t, _)| time < t).map_or(self.cur, |&(_, before)| before)
    }

    fn switch(&mut self, at: u64, period: u64) {
        self.switches.push((at, self.cur));
        self.cur = period;
    }

    /// Every sample with TIME before `until` has been read.
    fn read_until(&mut self, until: u64) {
        self.switches.retain(|&(t, _)| t > until);
    }
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

/// What one pass over the ring found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassCounts {
    pub samples: u64,
    pub lost: u64,
    pub throttled: u64,
    pub unthrottled: u64,
    pub malformed: u64,
}

/// The parsing half of a drain pass (what every drain thread runs, and what
/// `benches/aggregate.rs` times): read every record out of `ring`, turn samples into
/// [`Sample`]s (event index from the record's identifier among `ids`, period from
/// `period_at(event index, TIME)`) appended to `samples`, side-band records to `sideband`;
/// counts per event go to `per_event` (zeroed first).
pub fn read_pass<R: RingBuffer>(
    reader: &mut RingReader,
    ring: &R,
    ids: &[u64],
    period_at: impl Fn(usize, u64) -> u64,
    per_event: &mut [u64],
    samples: &mut Vec<Sample>,
    sideband: &mut Vec<TimedSideBand>,
) -> PassCounts {
    read_pass_stacks(reader, ring, ids, period_at, per_event, samples, sideband, None)
}

/// [`read_pass`] of events opened with PERF_SAMPLE_CALLCHAIN when `stacks` is given: each
/// sample's chain is interned into that (this CPU's) table and the sample carries its id.
#[allow(clippy::too_many_arguments)]
pub fn read_pass_stacks<R: RingBuffer>(
    reader: &mut RingReader,
    ring: &R,
    ids: &[u64],
    period_at: impl Fn(usize, u64) -> u64,
    per_event: &mut [u64],
    samples: &mut Vec<Sample>,
    sideband: &mut Vec<TimedSideBand>,
    mut stacks: Option<&mut crate::perf::callchain::StackTable>,
) -> PassCounts {
    let callchain = stacks.is_some();
    let mut c = PassCounts::default();
    per_event.iter_mut().for_each(|x| *x = 0);
    let before = samples.len();
    samples.reserve(1024);
    let ds = reader.drain(ring, |rec| match records::parse_record_cc(rec, callchain) {
        Record::Sample(s) => {
            let Some(idx) = ids.iter().position(|&id| id == s.identifier) else {
                c.malformed += 1;
                return;
            };
            per_event[idx] += 1;
            let stack = match stacks.as_deref_mut() {
                Some(t) => t.intern(records::sample_callchain(&s, rec.body)),
                None => 0,
            };
            samples.push(Sample {
                time: s.time,
                pid: s.pid,
                pc: s.ip,
                event: idx as EventIdx,
                period: period_at(idx, s.time),
                kernel: s.kernel,
                cgroup: s.cgroup,
                stack,
            });
        }
        Record::SideBand(sb) => sideband.push(sb),
        Record::Lost { lost: l } => c.lost += l,
        Record::Throttle { .. } => c.throttled += 1,
        Record::Unthrottle { .. } => c.unthrottled += 1,
        Record::Malformed => c.malformed += 1,
        Record::Other => {}
    });
    if ds.corrupt {
        c.malformed += 1;
    }
    c.samples = (samples.len() - before) as u64;
    c
}

/// A drain thread's own state (module docs): one concern per method.
struct Drainer<'a> {
    shared: &'a Shared,
    stats: &'a CpuStats,
    ring: CpuRing,
    rng: StdRng,
    periods: Vec<PeriodState>,
    armed_at: Vec<u64>,
    /// monotonic_ns at the start of the last pass.
    last_read: u64,
    read_every: u64,
    schedule: RedrawSchedule,
    reader: RingReader,
    samples: Vec<Sample>,
    sideband: Vec<TimedSideBand>,
    per_event: Vec<u64>,
    last_times: u64,
    last_warn: Option<Instant>,
    lost_unwarned: u64,
    throttle_unwarned: u64,
    stall_at: Option<Instant>,
}

/// Why the loop ends after this pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    Continue,
    Stop,
    HangUp,
}

impl<'a> Drainer<'a> {
    fn new(shared: &'a Shared, stats: &'a CpuStats, ring: CpuRing) -> Self {
        let n = shared.plans.len();
        let mut rng = rand::make_rng::<StdRng>();
        let t0 = monotonic_ns();
        let redraw_ns =
            u64::try_from(shared.cfg.redraw_interval.as_nanos()).unwrap_or(u64::MAX).max(1_000_000);
        let periods = ring.periods.iter().map(|&p| PeriodState::new(p)).collect();
        let stall_at = shared
            .cfg
            .faults
            .stall_drain
            .filter(|(c, _)| *c == stats.cpu)
            .map(|(_, after)| Instant::now() + after);
        Drainer {
            shared,
            stats,
            ring,
            schedule: RedrawSchedule::new(t0, redraw_ns, &mut rng),
            rng,
            periods,
            armed_at: vec![t0; n],
            last_read: t0,
            read_every: u64::try_from(shared.cfg.read_every.as_nanos()).unwrap_or(u64::MAX),
            reader: RingReader::new(),
            samples: Vec::with_capacity(1024),
            sideband: Vec::new(),
            per_event: vec![0; n],
            last_times: 0,
            last_warn: None,
            lost_unwarned: 0,
            throttle_unwarned: 0,
            stall_at,
        }
    }

    fn stopping(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire) || self.stats.stop.load(Ordering::Acquire)
    }

    /// Test hook: stop making progress (no heartbeat, no barrier answers) until told to exit.
    fn stall_if_asked(&mut self) {
        if self.stall_at.is_some_and(|t| Instant::now() >= t) {
            tracing::warn!(
                cpu = self.stats.cpu,
                "drain thread stalled by the stall_drain test hook"
            );
            while !self.stopping() {
                self.shared.wake.wait(100);
            }
            // Stopping: deliver the final pass like every other thread.
            self.stall_at = None;
        }
    }

    /// Sleep until the ring is half full, the re-arm instant, a barrier or stop.
    fn wait(&mut self) -> sp::PollResult {
        let timeout_ms = self.schedule.timeout_ms(monotonic_ns());
        let waited =
            sp::poll_ring(&self.ring.fds[0], &self.shared.wake, &self.stats.kick, timeout_ms);
        let r = match waited {
            Ok(r) => r,
            Err(e) => {
                self.stats.set_error(format!("poll: {e}"));
                sp::PollResult { readable: true, hangup: true, woken: true }
            }
        };
        self.stats.wakeups.fetch_add(1, Ordering::Relaxed);
        r
    }

    /// A barrier asked for everything up to an instant this pass would not yet cover: wait
    /// until the clock is past it (at most [`DRAIN_SLACK_NS`] plus scheduling), so that this pass
    /// answers it. The kick is consumed first: a newer request then wakes the next poll. Only
    /// called when poll saw an eventfd: the timed and ring wake-ups (nearly all of them) then
    /// cost no read of an empty eventfd.
    fn honour_barrier(&self) {
        self.stats.kick.clear();
        let target = self.shared.barrier_until.load(Ordering::Acquire);
        if target <= self.stats.drained_until.load(Ordering::Acquire) {
            return;
        }
        let need = target.saturating_add(DRAIN_SLACK_NS);
        let now = monotonic_ns();
        if now < need {
            std::thread::sleep(Duration::from_nanos(need - now));
        }
    }

    /// Read the ring, stamp samples with the period in force, count the other records.
    fn read_ring(&mut self) -> PassCounts {
        let ps = &self.periods;
        // Held for the pass only: the flusher reads the table between passes. The pass's ids
        // must outlive prunes until the sink holds them: `pass` ends it after the sink.
        let mut table = self.shared.cfg.stacks.as_ref().map(|t| t.cpu(self.stats.cpu));
        if let Some(t) = table.as_deref_mut() {
            t.begin_pass();
        }
        let c = read_pass_stacks(
            &mut self.reader,
            &self.ring.ring,
            &self.ring.ids,
            |idx, time| ps[idx].at(time),
            &mut self.per_event,
            &mut self.samples,
            &mut self.sideband,
            table.as_deref_mut(),
        );
        let full =
            table.as_deref().is_some_and(crate::perf::callchain::StackTable::past_high_water);
        drop(table);
        if let (true, Some(t)) = (full, &self.shared.cfg.stacks) {
            t.request_flush();
        }
        c
    }

    /// One pass: read everything written so far and hand it to the sink.
    fn pass(&mut self) -> PassCounts {
        // Everything with a TIME before this has been written to the ring by the time we read
        // data_head (records are written from this CPU, with preemption disabled).
        let start = monotonic_ns();
        self.last_read = start;
        let drained_until = start.saturating_sub(DRAIN_SLACK_NS);
        let c = self.read_ring();
        self.periods.iter_mut().for_each(|p| p.read_until(drained_until));
        let parsed = monotonic_ns();
        self.shared.sink.on_drain(
            self.stats.cpu,
            drained_until,
            &mut self.samples,
            &mut self.sideband,
        );
        if let Some(t) = &self.shared.cfg.stacks {
            t.cpu(self.stats.cpu).end_pass();
        }
        let aggregated = monotonic_ns();
        self.stats.parse_ns.fetch_add(parsed.saturating_sub(start), Ordering::Relaxed);
        self.stats.aggregate_ns.fetch_add(aggregated.saturating_sub(parsed), Ordering::Relaxed);
        self.samples.clear();
        self.sideband.clear();
        // After the sink has it: a barrier waiting on this CPU may now take it.
        self.stats.drained_until.fetch_max(drained_until, Ordering::Release);
        c
    }

    fn account(&mut self, c: &PassCounts) {
        let st = self.stats;
        st.samples.fetch_add(c.samples, Ordering::Relaxed);
        for (i, n) in self.per_event.iter().enumerate() {
            if *n > 0 {
                st.per_event[i].fetch_add(*n, Ordering::Relaxed);
            }
        }
        for (counter, n) in [
            (&st.lost, c.lost),
            (&st.throttled, c.throttled),
            (&st.unthrottled, c.unthrottled),
            (&st.malformed, c.malformed),
        ] {
            if n > 0 {
                counter.fetch_add(n, Ordering::Relaxed);
            }
        }
        self.lost_unwarned += c.lost;
        self.throttle_unwarned += c.throttled;
        if (self.lost_unwarned > 0 || self.throttle_unwarned > 0)
            && self.last_warn.is_none_or(|t| t.elapsed() >= WARN_INTERVAL)
        {
            tracing::warn!(
                cpu = st.cpu,
                lost_samples = self.lost_unwarned,
                throttled = self.throttle_unwarned,
                "perf ring lost samples or the kernel throttled sampling on this CPU \
                 (more ring pages or a longer period help); totals are in status"
            );
            self.last_warn = Some(Instant::now());
            self.lost_unwarned = 0;
            self.throttle_unwarned = 0;
        }
    }

    /// At the window's random instant: draw new periods and re-arm (which restarts each
    /// event's timer at this instant: README.md, "Periods").
    fn redraw_if_due(&mut self) {
        let now = monotonic_ns();
        if !self.schedule.is_due(now) {
            return;
        }
        self.schedule.advance(now, &mut self.rng);
        if !self.shared.cfg.randomize {
            return;
        }
        for (i, fd) in self.ring.fds.iter().enumerate() {
            let plan = &self.shared.plans[i];
            let st = &mut self.periods[i];
            if !redraw::spaced(plan.time_based, now.saturating_sub(self.armed_at[i]), st.cur) {
                continue;
            }
            let p = plan.draw(&mut self.rng);
            let before = monotonic_ns();
            let set = fd.set_period(p);
            // Read after the ioctl: samples taken after this instant have the new period.
            let t = monotonic_ns();
            self.stats.rearm_ns.fetch_add(t.saturating_sub(before), Ordering::Relaxed);
            match set {
                Ok(()) => {
                    st.switch(t, p);
                    self.armed_at[i] = t;
                    self.stats.periods[i].store(p, Ordering::Relaxed);
                    self.stats.redraws.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    self.stats.set_error(format!("PERF_EVENT_IOC_PERIOD: {e}"));
                    self.armed_at[i] = t;
                }
            }
        }
    }

    fn read_times(&mut self, force: bool) {
        let now = monotonic_ns();
        if !force && now.saturating_sub(self.last_times) < TIMES_INTERVAL_NS {
            return;
        }
        self.last_times = now;
        for (i, fd) in self.ring.fds.iter().enumerate() {
            if let Ok(t) = fd.read_times() {
                self.stats.time_enabled[i].store(t.time_enabled, Ordering::Relaxed);
                self.stats.time_running[i].store(t.time_running, Ordering::Relaxed);
            }
        }
    }

    /// Whether a timed wake-up reads the ring: the last read is `read_every` old, or there is
    /// nothing to read (a pass over an empty ring only reports `drained_until`).
    fn read_due(&self) -> bool {
        monotonic_ns().saturating_sub(self.last_read) >= self.read_every
            || self.ring.ring.head() == self.ring.ring.tail()
    }

    /// One loop iteration: wait, drain (module docs: not at every timed wake-up), account,
    /// re-arm if due.
    fn step(&mut self) -> Next {
        self.stall_if_asked();
        let stopping = self.stopping();
        let (hangup, read) = if stopping {
            for fd in &self.ring.fds {
                let _ = fd.disable();
            }
            (false, true)
        } else {
            let r = self.wait();
            if r.woken {
                self.honour_barrier();
            }
            (r.hangup, r.readable || r.woken || r.hangup || self.read_due())
        };
        if read {
            let counts = self.pass();
            self.account(&counts);
        }
        if stopping {
            return Next::Stop;
        }
        if hangup {
            return Next::HangUp;
        }
        self.redraw_if_due();
        self.read_times(false);
        self.stats.heartbeat.store(monotonic_ns(), Ordering::Release);
        Next::Continue
    }
}

fn drain_thread(shared: &Shared, stats: &CpuStats, ring: CpuRing) {
    let cpu = stats.cpu;
    if let Err(e) = sp::pin_current_thread(cpu) {
        tracing::warn!(cpu, error = %e, "cannot pin drain thread to its CPU; CPU going offline?");
        stats.set_error(format!("sched_setaffinity: {e}"));
        stats.online.store(false, Ordering::Release);
        return;
    }
    if shared.cfg.realtime_drain {
        if let Err(e) = sp::set_fifo_priority(1) {
            // The systemd unit denies realtime on purpose (RestrictRealtime=yes); the random
            // re-arm instant alone defeats phase-locking (sampler_phase test), so this is
            // expected, not a fault.
            tracing::info!(cpu, error = %e, "drain thread stays SCHED_OTHER (SCHED_FIFO refused)");
        }
    }
    if let Some(id) = crate::sys::time::own_thread_clock() {
        stats.clock.store(i64::from(id), Ordering::Release);
    }
    let mut d = Drainer::new(shared, stats, ring);
    let name = format!("dcpi-drain-{cpu}");
    loop {
        if let Some(w) = &shared.cfg.watch {
            w.fault_point(&name);
        }
        match d.step() {
            Next::Continue => {}
            Next::Stop => break,
            Next::HangUp => {
                tracing::warn!(
                    cpu,
                    "perf events on this CPU hung up; CPU offline? will reopen when online"
                );
                if lock(&stats.error).is_none() {
                    stats.set_error("perf event hung up".to_string());
                }
                break;
            }
        }
    }
    d.read_times(true);
    // The clock goes with the thread (and its id may name a later thread): keep the total.
    stats.clock.store(NO_CLOCK, Ordering::Release);
    stats.cpu_ns.fetch_max(thread_cpu_ns(), Ordering::AcqRel);
    stats.online.store(false, Ordering::Release);
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

fn is_no_pmu(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EOPNOTSUPP) | Some(libc::ENODEV))
}

/// Decide what each spec opens as, by opening it once (without a ring) on `cpu`.
fn resolve_events(
    cfg: &SamplerConfig,
    cpu: u32,
) -> Result<(Vec<EventPlan>, Vec<OpenedEvent>), SamplerError> {
    let mut plans: Vec<EventPlan> = Vec::new();
    let mut opened: Vec<OpenedEvent> = Vec::new();
    let try_open = |plan: &EventPlan| {
        open_fd(cfg, &attr_for(cfg, plan, plan.max, false, false), cpu).map(drop)
    };
    for spec in &cfg.events {
        let requested = match spec.period {
            Some(p) => format!("{}:{p}", spec.name),
            None => spec.name.clone(),
        };
        let (kind, source) = match spec.kind {
            EventKind::Auto => {
                let hw = EventKind::Hardware(sp::PERF_COUNT_HW_CPU_CYCLES as u64);
                let plan =
                    EventPlan::new(hw, spec.period.unwrap_or(events::default_period(&hw)), cfg);
                match try_open(&plan) {
                    Ok(()) => (hw, EventSource::Hardware),
                    Err(e) if is_no_pmu(&e) => {
                        tracing::warn!(
                            error = %e,
                            "no hardware PMU (cycles: {}): sampling cpu-clock instead of cycles",
                            errno_name(&e)
                        );
                        (
                            EventKind::Software(sp::PERF_COUNT_SW_CPU_CLOCK as u64),
                            EventSource::Fallback,
                        )
                    }
                    Err(e) => {
                        return Err(SamplerError::Open {
                            event: "auto (cycles)".into(),
                            cpu,
                            errno_name: errno_name(&e),
                            source: e,
                        })
                    }
                }
            }
            k => {
                let plan =
                    EventPlan::new(k, spec.period.unwrap_or(events::default_period(&k)), cfg);
                try_open(&plan).map_err(|e| {
                    if !is_no_pmu(&e) {
                        return SamplerError::Open {
                            event: requested.clone(),
                            cpu,
                            errno_name: errno_name(&e),
                            source: e,
                        };
                    }
                    // The kernel has no such counter here (no PMU in a VM, or an event this
                    // CPU lacks): a configuration problem, with what would work instead.
                    let openable: Vec<&str> = events::named()
                        .filter(|(_, k)| {
                            try_open(&EventPlan::new(*k, events::default_period(k), cfg)).is_ok()
                        })
                        .map(|(n, _)| n)
                        .collect();
                    SamplerError::Config(format!(
                        "event `{requested}` cannot be counted on this machine ({}: the kernel \
                         has no such counter here, e.g. no hardware PMU in a virtual machine); \
                         events that open here: {}; `auto` samples cycles where there is a \
                         PMU and cpu-clock where there is not",
                        errno_name(&e),
                        if openable.is_empty() { "none".into() } else { openable.join(", ") }
                    ))
                })?;
                let src = if matches!(k, EventKind::Software(_)) {
                    EventSource::Software
                } else {
                    EventSource::Hardware
                };
                (k, src)
            }
        };
        // With auto, a given period is meant for whichever event auto became... except that a
        // cycles period makes no sense as nanoseconds: use the fallback's own default then.
        let period = match (source, spec.period) {
            (EventSource::Fallback, _) => events::default_period(&kind),
            (_, Some(p)) => p,
            (_, None) => events::default_period(&kind),
        };
        let name = events::kind_name(&kind);
        if opened.iter().any(|o| o.desc.name == name) {
            tracing::warn!(event = %name, requested = %requested, "event listed twice after resolving `auto`; sampling it once");
            continue;
        }
        let plan = EventPlan::new(kind, period, cfg);
        opened.push(OpenedEvent {
            desc: profile_format::EventDesc {
                name,
                perf_type: plan.perf_type,
                perf_config: plan.config,
                period_mean: plan.min + (plan.max - plan.min) / 2,
                period_min: plan.min,
                period_max: plan.max,
            },
            source,
            requested,
        });
        plans.push(plan);
    }
    Ok((plans, opened))
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
    /// offline and opens the CPUs that came online.
    pub fn hotplug_tick(&self) {
        if self.shared.stop.load(Ordering::Acquire) {
            return;
        }
        if let Some(hp) = lock(&self.hotplug).as_mut() {
            hp.step(&self.shared);
        }
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
            let _ = h.join();
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

const HOTPLUG_THREAD: &str = "dcpi-hotplug";

/// Follows CPU hotplug on its own thread (when [`SamplerConfig::hotplug_thread`]): stops the
/// threads of CPUs that went offline, (re)opens CPUs that are online without a running thread.
fn supervise(shared: &Arc<Shared>) {
    let interval_ms =
        i32::try_from(shared.cfg.hotplug_interval.as_millis()).unwrap_or(i32::MAX).max(10);
    let mut hp = Hotplug::default();
    while !shared.wake.wait(interval_ms) && !shared.stop.load(Ordering::Acquire) {
        if let Some(w) = &shared.cfg.watch {
            w.fault_point(HOTPLUG_THREAD);
        }
        hp.step(shared);
    }
}

/// What a hotplug check keeps between calls.
#[derive(Debug, Default)]
struct Hotplug {
    rng: Option<StdRng>,
    list: CpuListFile,
    list_error_warned: bool,
}

impl Hotplug {
    fn step(&mut self, shared: &Arc<Shared>) {
        let online = match self.list.read(&shared.cfg) {
            Ok(v) => v,
            Err(e) => {
                if !self.list_error_warned {
                    tracing::warn!(error = %e, "cannot re-read the online CPU list");
                    self.list_error_warned = true;
                }
                return;
            }
        };
        let mut cpus = lock(&shared.cpus);
        for (cpu, slot) in cpus.iter_mut() {
            if !online.contains(cpu) && slot.stats.online.load(Ordering::Acquire) {
                tracing::info!(cpu, "CPU went offline; stopping its drain thread");
                slot.stats.stop.store(true, Ordering::Release);
            }
            if slot.thread.as_ref().is_some_and(|h| h.is_finished()) {
                if let Some(h) = slot.thread.take() {
                    if h.join().is_err() {
                        tracing::error!(cpu, "drain thread panicked");
                    }
                }
            }
        }
        for &cpu in &online {
            let nev = shared.plans.len();
            let slot = match cpus.entry(cpu) {
                std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::btree_map::Entry::Vacant(v) => match CpuStats::new(cpu, nev) {
                    Ok(st) => v.insert(CpuSlot {
                        stats: Arc::new(st),
                        thread: None,
                        last_attempt: Instant::now() - shared.cfg.hotplug_interval,
                    }),
                    Err(e) => {
                        tracing::warn!(cpu, error = %e, "cannot create an eventfd for a new CPU");
                        continue;
                    }
                },
            };
            if slot.thread.is_some() || slot.last_attempt.elapsed() < shared.cfg.hotplug_interval {
                continue;
            }
            slot.last_attempt = Instant::now();
            let rng = self.rng.get_or_insert_with(rand::make_rng::<StdRng>);
            match open_cpu(shared, cpu, rng) {
                Ok(ring) => match spawn_cpu(shared, cpu, ring, Arc::clone(&slot.stats)) {
                    Ok(h) => {
                        tracing::info!(cpu, "CPU online; sampling it");
                        slot.thread = Some(h);
                    }
                    Err(e) => slot.stats.set_error(format!("spawn: {e}")),
                },
                Err((i, e)) => {
                    let name = shared.names.get(i).cloned().unwrap_or_default();
                    slot.stats.set_error(format!("{name}: {}: {e}", errno_name(&e)));
                }
            }
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
    use rand::SeedableRng;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,5\n"), Some(vec![0, 1, 2, 3, 5]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("8-9,0-1"), Some(vec![0, 1, 8, 9]));
        assert_eq!(parse_cpu_list(""), Some(vec![]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("a"), None);
        assert_eq!(parse_cpu_list("0-"), None);
    }

    /// The kept file sees a list rewritten in place (as sysfs regenerates it, and as the
    /// hotplug tests write it), shorter or longer than before; a removed file is an error
    /// that names it, and the list is read again once it is back.
    #[test]
    fn cpu_list_file_is_reread_through_one_open_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("online");
        let cfg = SamplerConfig { online_cpus_path: Some(path.clone()), ..Default::default() };
        let mut f = CpuListFile::default();
        std::fs::write(&path, "0-3,8-11\n").unwrap();
        assert_eq!(f.read(&cfg).unwrap(), vec![0, 1, 2, 3, 8, 9, 10, 11]);
        std::fs::write(&path, "1\n").unwrap();
        assert_eq!(f.read(&cfg).unwrap(), vec![1]);
        let long: String = (0..400).map(|c| format!("{},", c * 2)).collect::<String>() + "1000";
        std::fs::write(&path, &long).unwrap();
        assert_eq!(f.read(&cfg).unwrap().len(), 401, "longer than one read");
        std::fs::write(&path, "garbage").unwrap();
        assert!(matches!(f.read(&cfg), Err(SamplerError::BadCpuList { .. })));
        // What a reader sees between a rewrite's truncation and its write.
        std::fs::write(&path, "").unwrap();
        assert!(matches!(f.read(&cfg), Err(SamplerError::BadCpuList { .. })), "empty list");
        std::fs::write(&path, " \n").unwrap();
        assert!(matches!(f.read(&cfg), Err(SamplerError::BadCpuList { .. })), "blank list");
        std::fs::remove_file(&path).unwrap();
        // The open file still reads the unlinked inode; an error comes once it is reopened.
        f.file = None;
        let e = f.read(&cfg).unwrap_err().to_string();
        assert!(e.contains(&path.display().to_string()), "{e}");
        std::fs::write(&path, "2-3").unwrap();
        assert_eq!(f.read(&cfg).unwrap(), vec![2, 3]);
    }

    #[test]
    fn period_state_stamps_by_time() {
        let mut st = PeriodState::new(100);
        assert_eq!(st.at(0), 100);
        st.switch(1000, 90);
        assert_eq!(st.at(999), 100);
        assert_eq!(st.at(1000), 90);
        assert_eq!(st.at(5000), 90);
        // Several re-arms before a read: each sample gets the period in force at its time.
        st.switch(2000, 80);
        st.switch(3000, 70);
        assert_eq!((st.at(999), st.at(1500), st.at(2500), st.at(3000)), (100, 90, 80, 70));
        // Read up to 2500: the switches at 1000 and 2000 are behind every unread sample.
        st.read_until(2500);
        assert_eq!(st.switches, vec![(3000, 80)]);
        assert_eq!((st.at(2600), st.at(3000)), (80, 70));
        st.read_until(3000);
        assert!(st.switches.is_empty());
        assert_eq!(st.at(2999), 70);
    }

    #[test]
    fn window() {
        let cfg = SamplerConfig::default();
        let p = EventPlan::new(EventKind::Software(0), 1_600_000, &cfg);
        assert_eq!((p.min, p.max), (1_550_000, 1_650_000));
        let mut rng = StdRng::seed_from_u64(1);
        for _ in 0..1000 {
            let d = p.draw(&mut rng);
            assert!((p.min..=p.max).contains(&d));
        }
        let fixed = SamplerConfig { randomize: false, ..SamplerConfig::default() };
        let p = EventPlan::new(EventKind::Software(0), 1_600_000, &fixed);
        assert_eq!((p.min, p.max), (1_600_000, 1_600_000));
        let p = EventPlan::new(EventKind::Software(2), 1, &cfg);
        assert_eq!((p.min, p.max), (1, 1));
    }

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
