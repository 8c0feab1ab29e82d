//! Opens the configured events on every online CPU, runs one drain thread per CPU (pinned to it),
//! randomizes overflow periods, counts LOST/THROTTLE records, follows CPU hotplug.
//!
//! Per CPU: one fd per event (pid = -1), the first of which carries the side-band bits and owns
//! the mmap ring; the others are redirected into it with SET_OUTPUT. The drain thread wakes on the
//! ring's watermark (about `wakeup_samples` sample records) or after a timeout, delivers what it
//! read to the [`SampleSink`], then redraws the periods of its CPU's events with
//! PERF_EVENT_IOC_PERIOD (cheap because it runs on that CPU).
//!
//! Which period stamps a sample: a redraw happens after a pass has read the ring, at time `T`
//! (clock read right after the ioctl returned). Samples taken before `T` were produced under the
//! previous period even if they are only drained in the next pass, so each event remembers
//! `(previous, switch time, current)` and a sample gets `previous` if its TIME is before the
//! switch. The record's own PERIOD field cannot be used: for clock events it keeps the period
//! given at open time.

use std::collections::BTreeMap;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::RngExt;

use crate::perf::events::{self, EventKind, EventSpec};
use crate::perf::records::{self, Record};
use crate::perf::ring::RingReader;
use crate::sys::perf::{self as sp, AttrSpec, EventFd, PerfFd, RingMap};
use crate::sys::time::monotonic_ns;
use crate::types::{EventIdx, Sample, SampleSink, TimedSideBand};

/// Where the list of online CPUs comes from.
pub const ONLINE_CPUS: &str = "/sys/devices/system/cpu/online";

/// `drained_until` lags the clock read before `data_head` by this much, for records whose time
/// was taken just before they were written.
const DRAIN_SLACK_NS: u64 = 1_000_000;

/// How often each drain thread reads time_enabled/time_running of its fds.
const TIMES_INTERVAL_NS: u64 = 1_000_000_000;

/// Counting (non-clock) events are re-armed at a random point within this long after a pass.
const COUNT_RESTART_SPREAD_NS: u64 = 1_000_000;

/// At most one loss/throttle warning per CPU per this interval.
const WARN_INTERVAL: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
pub struct SamplerConfig {
    pub events: Vec<EventSpec>,
    /// Periods are drawn from `[P - P/D, P]`.
    pub window_divisor: u64,
    /// Data pages per CPU ring (power of two).
    pub ring_pages: usize,
    /// Wake the drain thread after about this many sample records.
    pub wakeup_samples: u32,
    /// Every drain thread loops, and redraws periods, at least this often.
    pub redraw_interval: Duration,
    /// Test hook: the drain thread of this CPU stops making progress after this long.
    pub stall_drain: Option<(u32, Duration)>,
    /// false: keep every event at its nominal period P (for comparisons; never in production).
    pub randomize: bool,
    /// How often the online CPU list is re-read.
    pub hotplug_interval: Duration,
    /// Test hook: hardware and raw events fail to open with ENOENT, as on a machine without a
    /// PMU (lets the `auto` fallback be tested on machines that have one).
    pub simulate_no_pmu: bool,
    /// Run drain threads SCHED_FIFO (priority 1) so that they run as soon as the ring wakes
    /// them instead of at the next scheduler tick; see README.md (phase locking).
    pub realtime_drain: bool,
    /// Test hook: read the online CPU list from this file instead of [`ONLINE_CPUS`].
    pub online_cpus_path: Option<std::path::PathBuf>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            events: vec![EventSpec {
                name: "auto".to_string(),
                kind: EventKind::Auto,
                period: None,
            }],
            window_divisor: 16,
            ring_pages: 128,
            wakeup_samples: 64,
            redraw_interval: Duration::from_secs(1),
            stall_drain: None,
            randomize: true,
            hotplug_interval: Duration::from_secs(5),
            simulate_no_pmu: false,
            realtime_drain: true,
            online_cpus_path: None,
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
            EventSource::Hardware => "hardware",
            EventSource::Software => "software",
            EventSource::Fallback => "fallback",
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
    parse_cpu_list(&text).ok_or_else(|| SamplerError::BadCpuList {
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
    fn new(kind: EventKind, period: u64, cfg: &SamplerConfig) -> EventPlan {
        let (perf_type, config) = events::perf_type_config(&kind);
        let max = period.max(1);
        let min = if cfg.randomize && cfg.window_divisor > 0 {
            (max - max / cfg.window_divisor).max(1)
        } else {
            max
        };
        EventPlan { perf_type, config, min, max, time_based: events::period_is_time(&kind) }
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
    error: Mutex<Option<String>>,
}

impl CpuStats {
    fn new(cpu: u32, nevents: usize) -> CpuStats {
        let v = || (0..nevents).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        CpuStats {
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
            error: Mutex::new(None),
        }
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
    build_id: AtomicBool,
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
    let want = (shared_cfg.wakeup_samples.max(1) as usize).saturating_mul(sp::SAMPLE_RECORD_SIZE);
    let wm = want.min(data_bytes / 2).max(sp::SAMPLE_RECORD_SIZE);
    AttrSpec {
        perf_type: plan.perf_type,
        config: plan.config,
        period,
        sideband,
        build_id: sideband && build_id,
        wakeup_watermark: u32::try_from(wm).unwrap_or(u32::MAX),
    }
}

/// perf_event_open, or the ENOENT a PMU-less machine gives when simulating one.
fn open_fd(cfg: &SamplerConfig, spec: &AttrSpec, cpu: u32) -> io::Result<PerfFd> {
    if cfg.simulate_no_pmu && matches!(spec.perf_type, sp::PERF_TYPE_HARDWARE | sp::PERF_TYPE_RAW) {
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
        let fd =
            match PerfFd::open(&attr_for(&shared.cfg, plan, period, sideband, build_id), cpu) {
                Err(e) if sideband && build_id && e.raw_os_error() == Some(libc::EINVAL) => {
                    // Kernels before 5.12 do not know attr.build_id.
                    let r = open_fd(
                        &shared.cfg,
                        &attr_for(&shared.cfg, plan, period, true, false),
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

/// The period in force for one event on one CPU, and the one before it.
#[derive(Clone, Copy, Debug)]
struct PeriodState {
    prev: u64,
    cur: u64,
    /// Samples with TIME before this were taken under `prev`.
    switched_at: u64,
    /// Samples counted under `cur` so far.
    since_arm: u64,
}

impl PeriodState {
    fn at(&self, time: u64) -> u64 {
        if time < self.switched_at {
            self.prev
        } else {
            self.cur
        }
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
    let r = std::thread::Builder::new()
        .name(format!("dcpi-drain-{cpu}"))
        .spawn(move || drain_thread(&sh, &st, ring));
    if r.is_err() {
        stats.online.store(false, Ordering::Release);
    }
    r
}

fn drain_thread(shared: &Shared, stats: &CpuStats, ring: CpuRing) {
    let cpu = stats.cpu;
    if let Err(e) = sp::pin_current_thread(cpu) {
        tracing::warn!(cpu, error = %e, "cannot pin drain thread to its CPU; CPU going offline?");
        stats.set_error(format!("sched_setaffinity: {e}"));
        stats.online.store(false, Ordering::Release);
        return;
    }
    let cfg = &shared.cfg;
    if cfg.realtime_drain {
        if let Err(e) = sp::set_fifo_priority(1) {
            // The systemd unit denies realtime on purpose (RestrictRealtime=yes); the random
            // re-arm delay alone still defeats phase-locking (sampler_phase test), so this is
            // expected, not a fault.
            tracing::info!(cpu, error = %e, "drain thread stays SCHED_OTHER (SCHED_FIFO refused)");
        }
    }
    let n = shared.plans.len();
    let mut rng = rand::make_rng::<StdRng>();
    let t0 = monotonic_ns();
    let mut ps: Vec<PeriodState> = ring
        .periods
        .iter()
        .map(|&p| PeriodState { prev: p, cur: p, switched_at: 0, since_arm: 0 })
        .collect();
    let mut armed_at = vec![t0; n];
    let mut reader = RingReader::new();
    let mut samples: Vec<Sample> = Vec::with_capacity(1024);
    let mut sideband: Vec<TimedSideBand> = Vec::new();
    let mut per_event = vec![0u64; n];
    let mut due = vec![false; n];
    let mut last_times = 0u64;
    let mut last_warn: Option<Instant> = None;
    let (mut lost_unwarned, mut throttle_unwarned) = (0u64, 0u64);
    let mut stall_at =
        cfg.stall_drain.filter(|(c, _)| *c == cpu).map(|(_, after)| Instant::now() + after);
    let redraw_ns =
        u64::try_from(cfg.redraw_interval.as_nanos()).unwrap_or(u64::MAX).max(1_000_000);

    loop {
        if stall_at.is_some_and(|t| Instant::now() >= t) {
            // Test hook: stop making progress (no heartbeat) until told to exit.
            tracing::warn!(cpu, "drain thread stalled by the stall_drain test hook");
            while !shared.stop.load(Ordering::Acquire) && !stats.stop.load(Ordering::Acquire) {
                shared.wake.wait(100);
            }
            // Stopping: deliver the final pass like every other thread.
            stall_at = None;
            continue;
        }
        let stopping = shared.stop.load(Ordering::Acquire) || stats.stop.load(Ordering::Acquire);
        let mut hangup = false;
        if stopping {
            for fd in &ring.fds {
                let _ = fd.disable();
            }
        } else {
            let now = monotonic_ns();
            let next = armed_at
                .iter()
                .map(|a| a.saturating_add(redraw_ns))
                .min()
                .unwrap_or(now + redraw_ns);
            let timeout_ns = next.saturating_sub(now).clamp(1_000_000, redraw_ns);
            let timeout_ms = i32::try_from(timeout_ns / 1_000_000).unwrap_or(i32::MAX);
            match sp::poll_ring(&ring.fds[0], &shared.wake, timeout_ms) {
                Ok(r) => hangup = r.hangup,
                Err(e) => {
                    stats.set_error(format!("poll: {e}"));
                    hangup = true;
                }
            }
        }

        // Everything with a TIME before this has been written to the ring by the time we read
        // data_head (records are written from this CPU, with preemption disabled).
        let drained_until = monotonic_ns().saturating_sub(DRAIN_SLACK_NS);
        let (mut lost, mut thr, mut unthr, mut bad) = (0u64, 0u64, 0u64, 0u64);
        per_event.iter_mut().for_each(|c| *c = 0);
        samples.reserve(1024);
        let ds = reader.drain(&ring.ring, |rec| match records::parse_record(rec) {
            Record::Sample(s) => {
                let Some(idx) = ring.ids.iter().position(|&id| id == s.identifier) else {
                    bad += 1;
                    return;
                };
                let st = &mut ps[idx];
                let period = st.at(s.time);
                if s.time >= st.switched_at {
                    st.since_arm += 1;
                }
                per_event[idx] += 1;
                samples.push(Sample {
                    time: s.time,
                    pid: s.pid,
                    tid: s.tid,
                    pc: s.ip,
                    cpu: s.cpu,
                    event: idx as EventIdx,
                    period,
                    kernel: s.kernel,
                });
            }
            Record::SideBand(sb) => sideband.push(sb),
            Record::Lost { lost: l } => lost += l,
            Record::Throttle { .. } => thr += 1,
            Record::Unthrottle { .. } => unthr += 1,
            Record::Malformed => bad += 1,
            Record::Other => {}
        });
        if ds.corrupt {
            bad += 1;
        }
        let nsamples = samples.len() as u64;
        shared.sink.on_drain(cpu, drained_until, &mut samples, &mut sideband);
        samples.clear();
        sideband.clear();

        stats.samples.fetch_add(nsamples, Ordering::Relaxed);
        for (i, c) in per_event.iter().enumerate() {
            if *c > 0 {
                stats.per_event[i].fetch_add(*c, Ordering::Relaxed);
            }
        }
        if lost > 0 {
            stats.lost.fetch_add(lost, Ordering::Relaxed);
        }
        if thr > 0 {
            stats.throttled.fetch_add(thr, Ordering::Relaxed);
        }
        if unthr > 0 {
            stats.unthrottled.fetch_add(unthr, Ordering::Relaxed);
        }
        if bad > 0 {
            stats.malformed.fetch_add(bad, Ordering::Relaxed);
        }
        lost_unwarned += lost;
        throttle_unwarned += thr;
        if (lost_unwarned > 0 || throttle_unwarned > 0)
            && last_warn.is_none_or(|t| t.elapsed() >= WARN_INTERVAL)
        {
            tracing::warn!(
                cpu,
                lost_samples = lost_unwarned,
                throttled = throttle_unwarned,
                "perf ring lost samples or the kernel throttled sampling on this CPU \
                 (more ring pages or a longer period help); totals are in status"
            );
            last_warn = Some(Instant::now());
            lost_unwarned = 0;
            throttle_unwarned = 0;
        }

        if stopping {
            break;
        }
        if hangup {
            tracing::warn!(
                cpu,
                "perf events on this CPU hung up; CPU offline? will reopen when online"
            );
            if lock(&stats.error).is_none() {
                stats.set_error("perf event hung up".to_string());
            }
            break;
        }

        if cfg.randomize {
            let now = monotonic_ns();
            let mut max_delay = u64::MAX;
            for (i, plan) in shared.plans.iter().enumerate() {
                let st = &ps[i];
                let elapsed = now.saturating_sub(armed_at[i]);
                // The ioctl restarts a clock event's timer: re-arming within one period would
                // suppress samples.
                let spaced = !plan.time_based || elapsed >= st.cur;
                due[i] =
                    plan.min < plan.max && (st.since_arm > 0 || elapsed >= redraw_ns) && spaced;
                if due[i] {
                    let d = if plan.time_based { st.cur } else { COUNT_RESTART_SPREAD_NS };
                    max_delay = max_delay.min(d);
                }
            }
            if max_delay != u64::MAX {
                // The re-arm restarts the counter, so the time of the ioctl fixes the phase of
                // the samples that follow. This pass may have been started by something
                // phase-locked to the scheduler tick (side-band records of other processes, a
                // timeout), so re-arm at a uniformly random point of the next period.
                let delay = rng.random_range(0..max_delay.clamp(1, redraw_ns / 4));
                std::thread::sleep(Duration::from_nanos(delay));
                for (i, fd) in ring.fds.iter().enumerate() {
                    if !due[i] {
                        continue;
                    }
                    let st = &mut ps[i];
                    let p = shared.plans[i].draw(&mut rng);
                    match fd.set_period(p) {
                        Ok(()) => {
                            let t = monotonic_ns();
                            *st =
                                PeriodState { prev: st.cur, cur: p, switched_at: t, since_arm: 0 };
                            armed_at[i] = t;
                            stats.periods[i].store(p, Ordering::Relaxed);
                            stats.redraws.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            stats.set_error(format!("PERF_EVENT_IOC_PERIOD: {e}"));
                            armed_at[i] = monotonic_ns();
                        }
                    }
                }
            }
        }

        let now = monotonic_ns();
        if now.saturating_sub(last_times) >= TIMES_INTERVAL_NS {
            last_times = now;
            for (i, fd) in ring.fds.iter().enumerate() {
                if let Ok(t) = fd.read_times() {
                    stats.time_enabled[i].store(t.time_enabled, Ordering::Relaxed);
                    stats.time_running[i].store(t.time_running, Ordering::Relaxed);
                }
            }
        }
        stats.heartbeat.store(now, Ordering::Release);
    }
    for (i, fd) in ring.fds.iter().enumerate() {
        if let Ok(t) = fd.read_times() {
            stats.time_enabled[i].store(t.time_enabled, Ordering::Relaxed);
            stats.time_running[i].store(t.time_running, Ordering::Relaxed);
        }
    }
    stats.online.store(false, Ordering::Release);
}

/// Runs the drain threads; see the module documentation.
#[derive(Debug)]
pub struct Sampler {
    shared: Arc<Shared>,
    events: Vec<OpenedEvent>,
    supervisor: Option<JoinHandle<()>>,
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
                try_open(&plan).map_err(|e| SamplerError::Open {
                    event: requested.clone(),
                    cpu,
                    errno_name: errno_name(&e),
                    source: e,
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
    pub fn start(cfg: &SamplerConfig, sink: Arc<dyn SampleSink>) -> Result<Sampler, SamplerError> {
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
            build_id: AtomicBool::new(true),
            started: Instant::now(),
            cpus: Mutex::new(BTreeMap::new()),
        });
        let mut rng = rand::make_rng::<StdRng>();
        let mut first_error: Option<SamplerError> = None;
        let mut running = 0usize;
        for &cpu in &online {
            let stats = Arc::new(CpuStats::new(cpu, shared.plans.len()));
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
        let mut sampler = Sampler { shared, events, supervisor: None };
        if running == 0 {
            sampler.shutdown();
            return Err(first_error
                .unwrap_or_else(|| SamplerError::NoCpu("no drain thread started".into())));
        }
        let sh = Arc::clone(&sampler.shared);
        let sup = std::thread::Builder::new()
            .name("dcpi-hotplug".into())
            .spawn(move || supervise(&sh))
            .map_err(|source| SamplerError::Io { what: "spawn hotplug thread".into(), source });
        match sup {
            Ok(h) => sampler.supervisor = Some(h),
            Err(e) => {
                sampler.shutdown();
                return Err(e);
            }
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

    /// How long the sampler has been running.
    pub fn uptime(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Disable the events, let every drain thread deliver a final pass, join them.
    pub fn stop(mut self) {
        self.shutdown();
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

/// Follows CPU hotplug: stops the threads of CPUs that went offline, (re)opens CPUs that are
/// online without a running thread.
fn supervise(shared: &Arc<Shared>) {
    let interval_ms =
        i32::try_from(shared.cfg.hotplug_interval.as_millis()).unwrap_or(i32::MAX).max(10);
    let mut rng = rand::make_rng::<StdRng>();
    let mut list_error_warned = false;
    while !shared.wake.wait(interval_ms) && !shared.stop.load(Ordering::Acquire) {
        let online = match cfg_online_cpus(&shared.cfg) {
            Ok(v) => v,
            Err(e) => {
                if !list_error_warned {
                    tracing::warn!(error = %e, "cannot re-read the online CPU list");
                    list_error_warned = true;
                }
                continue;
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
            let slot = cpus.entry(cpu).or_insert_with(|| CpuSlot {
                stats: Arc::new(CpuStats::new(cpu, nev)),
                thread: None,
                last_attempt: Instant::now() - shared.cfg.hotplug_interval,
            });
            if slot.thread.is_some() || slot.last_attempt.elapsed() < shared.cfg.hotplug_interval {
                continue;
            }
            slot.last_attempt = Instant::now();
            match open_cpu(shared, cpu, &mut rng) {
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

    #[test]
    fn period_state_stamps_by_time() {
        let st = PeriodState { prev: 100, cur: 90, switched_at: 1000, since_arm: 0 };
        assert_eq!(st.at(999), 100);
        assert_eq!(st.at(1000), 90);
        assert_eq!(st.at(5000), 90);
    }

    #[test]
    fn window() {
        let cfg = SamplerConfig::default();
        let p = EventPlan::new(EventKind::Software(0), 1_600_000, &cfg);
        assert_eq!((p.min, p.max), (1_500_000, 1_600_000));
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
