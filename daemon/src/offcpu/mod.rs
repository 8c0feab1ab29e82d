//! Off-CPU time (`off_cpu = true`): where threads wait, with the stack that made them wait.
//!
//! MECHANISM (issue 40, chosen by measurement; BENCHMARKS.md "Off-CPU"). By default
//! (`off_cpu_source = "auto"`) a BPF program on `sched_switch` pairs the waits in the kernel
//! and sums them per thread and stack, so that nothing is written per switch ([`bpf`]: its own
//! reader, the same samples). Where it cannot be loaded (no `CAP_BPF`, no kernel BTF, a kernel
//! older than 5.18), dcpid says why and uses perf events, on every CPU, each alone in its ring:
//! - *switch-outs*: the `sched:sched_switch` tracepoint with the kernel-side filter
//!   `prev_pid != 0 && prev_state & 255` ([`tracepoint`]), samples TID, TIME, CALLCHAIN: only a
//!   thread that **blocks** leaves a record, taken in its own context, so the chain is the
//!   blocking stack (kernel frames through ORC, user frames through frame pointers), with
//!   `attr.task` for the exit records;
//! - *switch-ins*: a `dummy` software event with `attr.context_switch`, whose
//!   `PERF_RECORD_SWITCH_CPU_WIDE` records (32 bytes, no chain) say when each thread runs
//!   again. Not the tracepoint: on this machine's kernel (6.18) a thread that wakes on a CPU
//!   that had just gone idle runs again with no `sched_switch` from the idle task (ftrace
//!   shows it too: in a pinned pipe ping-pong, half the switch-ins), while perf's switch-in
//!   hook sees every one; timing waits by the tracepoint's switch-ins lost half of them.
//!
//! A preempted thread, a yield and the idle task cost no chain. Where tracefs is not mounted
//! (the tracepoint's id is only there) or the tracepoint cannot be opened, the fallback
//! (`"switch-records"`) is perf's software `context-switches` event with `sample_period = 1`
//! and `PERF_SAMPLE_CALLCHAIN` (a sample with a chain at *every* switch-out, preemptions and
//! the idle task included), plus the switch records, flagged
//! `PERF_RECORD_MISC_SWITCH_OUT_PREEMPT` when the thread was preempted (not a wait). The BPF
//! program is compiled once with clang and committed (daemon/bpf/), so that neither the build
//! nor CI needs a BPF toolchain. Both perf ways sample only PID/TID, TIME and the chain: the fewer bytes the kernel writes and
//! the reader reads per switch, the less both pay. The kernel's per-wait call chain is paid by
//! every blocking program, hence `off_cpu` is off by default.
//!
//! One thread (`dcpi-offcpu`) reads every CPU's ring (watermark wake-ups at half a ring, else
//! every [`POLL_MS`]), joins each switch-out sample with the switch-out record that follows it
//! in the same ring, and pairs switch-outs with switch-ins across CPUs ([`pairing`]) below a
//! watermark: the instant the pass began minus [`SLACK_NS`] (one thread reads every ring, so
//! every record older than that has been read). Each finished wait becomes one sample of the
//! `off-cpu` event for the aggregator, weighted by the wait in nanoseconds (its `period`),
//! time-stamped at the switch-in (the wait counts in the epoch and slice where it ended), at
//! the **user pc where the thread entered the kernel** (the syscall in libc, the first user
//! frame of the chain; a kernel thread's waits are at the kernel pc of the switch). The kernel
//! pc of every switch is the scheduler's, so it would put all waits in one function; the
//! syscall site names what the thread waited for, and the stack (kernel part included: the
//! pipe read, the futex, the disk) says why. The aggregator counts the off-CPU event's
//! nanoseconds, not its samples (FORMAT.md §5.2: counts in nanoseconds, period 1).
//!
//! **Priority.** The reading thread runs at nice [`LOW_NICE`]: it does a few hundred
//! nanoseconds of user-space work per switch (pairing, interning, aggregating), and at normal
//! priority that work competed with the programs of the machine. Measured on the unpaced
//! ping-pong (BENCHMARKS.md "Off-CPU: the reader at nice 19"): beside two compilers, the
//! program made 62-65 k round trips per 4 s with the reader at nice 0 and 80-97 k at nice 19;
//! on an otherwise idle machine the difference was within the runs' spread. Reading late is
//! safe up to the ring's size, so the thread watches how full the fullest ring was when read: at
//! [`BOOST_FILL_PERMILLE`] or more (a machine busy enough to starve it) it returns to nice 0
//! for at least [`BOOST_NS`], so that no record is lost for its politeness. Raising the
//! priority back needs `RLIMIT_NICE` (`LimitNICE=+0` in the unit) or `CAP_SYS_NICE`; without
//! either it stays at nice 19 and says so once.
//!
//! The samples go to the aggregator as those of an extra CPU slot (`ncpus`, its own clock,
//! table and stack table), so that they never disorder a real CPU's pending samples.
//! Waits shorter than `off_cpu_threshold` are counted in the flat profiles but get no stack.
//! The idle task (pid 0) is never counted.

pub mod bpf;
pub mod pairing;
pub mod tracepoint;

use std::collections::BTreeSet;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::perf::callchain::{process_chain, StackTables};
use crate::perf::ring::{RawRecord, RingReader};
use crate::perf::sampler;
use crate::resolve::KERNEL_START;
use crate::sys;
use crate::sys::perf::{self as sp, AttrSpec, EventFd, PerfFd, RingMap};
use crate::types::{EventIdx, Sample, SampleSink};

use pairing::{Blocking, Kind, Pairing, Switch, Wait};

/// The event's name in profiles and reports.
pub const EVENT_NAME: &str = "off-cpu";
/// The reading thread's name.
pub const THREAD: &str = "dcpi-offcpu";
/// Longest sleep between two reads of the rings, in milliseconds.
pub const POLL_MS: i32 = 250;
/// Records older than the start of a pass minus this have all been read.
pub const SLACK_NS: u64 = 1_000_000;
/// Data pages of each CPU's ring: at ~250 bytes per switch (a sample with a 20-frame chain and
/// two switch records), 1 MiB holds ~4 000 switches, 0.4 s at 10 000/s with wake-ups at half.
pub const RING_PAGES: usize = 256;
/// The reading thread's nice value while the rings keep up (see the module docs).
pub const LOW_NICE: i32 = 19;
/// A ring at least this full (per mille of its data area) when read means the thread ran
/// late: it returns to nice 0. Wake-ups come at half a ring, so a thread that runs when woken
/// reads ~500; 625 leaves three eighths of the ring for the time it takes to raise it.
pub const BOOST_FILL_PERMILLE: u64 = 625;
/// Shortest stay at nice 0 once raised.
pub const BOOST_NS: u64 = 5_000_000_000;
/// Threads off CPU tracked at most (each holds its blocking stack, ≤ `sample_max_stack` pcs).
pub const MAX_THREADS: usize = 16 * 1024;
/// Chain buffers kept for reuse ([`Spare`]): a pass emits at most this many waits' buffers
/// back; more are freed (at `CHAIN_CAPACITY` u64s each, 4 MiB at most).
pub const SPARE_BUFFERS: usize = 16 * 1024;
/// Capacity of a chain buffer made when none is spare: a blocking stack is ~20 frames (a
/// syscall's kernel path and the user frames above it), and a buffer grown from empty took
/// three reallocations (a profile of the unpaced ping-pong, quiet: malloc, realloc and free at
/// 7 % of the reading thread, from passes of more blocking samples than buffers were spare).
const CHAIN_CAPACITY: usize = 32;

/// What the off-CPU source needs.
#[derive(Clone, Debug)]
pub struct OffCpuConfig {
    /// Index of the `off-cpu` event in the daemon's event list.
    pub event: EventIdx,
    /// The CPU id the aggregator knows the source's samples by (`ncpus`: its own slot).
    pub slot: u32,
    /// Waits shorter than this get no stack.
    pub threshold_ns: u64,
    /// Deepest chain asked of the kernel.
    pub max_stack: u16,
    pub ring_pages: usize,
    pub max_threads: usize,
    /// Which kernel events time the waits.
    pub source: Source,
}

/// `off_cpu_source`: which kernel events time the waits (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Source {
    /// The BPF program where the kernel takes it, else the tracepoints where tracefs has them,
    /// else the switch records.
    #[default]
    Auto,
    /// The `sched:sched_switch` tracepoints, or an error.
    Tracepoint,
    /// The `context-switches` event with switch records.
    SwitchRecords,
    /// The in-kernel pairing of [`bpf`], or an error.
    Bpf,
}

impl Source {
    /// The configuration values, in the order of the enum.
    pub const NAMES: [&'static str; 4] = ["auto", "tracepoint", "switch-records", "bpf"];

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "auto" => Some(Self::Auto),
            "tracepoint" => Some(Self::Tracepoint),
            "switch-records" => Some(Self::SwitchRecords),
            "bpf" => Some(Self::Bpf),
            _ => None,
        }
    }

    /// The configuration value.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => Self::NAMES[0],
            Self::Tracepoint => Self::NAMES[1],
            Self::SwitchRecords => Self::NAMES[2],
            Self::Bpf => Self::NAMES[3],
        }
    }
}

/// Errors starting the source.
#[derive(Debug, thiserror::Error)]
pub enum OffCpuError {
    #[error("off-CPU: cannot open the context-switches event on CPU {cpu}: {source}")]
    Open { cpu: u32, source: io::Error },
    #[error("off-CPU: cannot map the ring of CPU {cpu}: {source}")]
    Map { cpu: u32, source: io::Error },
    #[error("off-CPU: the sched:sched_switch tracepoint (off_cpu_source = \"tracepoint\"): {0}")]
    Tracepoint(#[from] tracepoint::TracepointError),
    #[error("off-CPU: cannot open the sched:sched_switch tracepoint on CPU {cpu} (off_cpu_source = \"tracepoint\"): {source}")]
    OpenTracepoint { cpu: u32, source: io::Error },
    #[error("off-CPU: the kernel refused the filter {filter:?} of the sched:sched_switch tracepoint on CPU {cpu}: {source}")]
    Filter { cpu: u32, filter: String, source: io::Error },
    #[error("off-CPU: the BPF program (off_cpu_source = \"bpf\"): {0}")]
    Bpf(#[from] bpf::BpfError),
    #[error("off-CPU: {0}")]
    Io(#[from] io::Error),
}

/// Counters of the source (monotonic since start), for `dcpictl status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuStatus {
    /// The kernel events in use: `bpf`, `tracepoint` or `switch-records` ([`Source::name`]).
    pub source: &'static str,
    /// Context switches seen, the idle task's excluded: switch-outs (voluntary or not) with
    /// the switch records, switch-ins with the tracepoints and the BPF program (which count
    /// at the switch-in).
    pub switches: u64,
    /// Waits timed and handed to the aggregator (`bpf`: timed by the program, as of the last
    /// pass; their nanoseconds are handed over at the pass after they ended).
    pub waits: u64,
    /// Their total, nanoseconds.
    pub off_cpu_ns: u64,
    /// Waits without a stack (shorter than the threshold, or the stack table was full).
    pub waits_without_stack: u64,
    /// Records the kernel dropped (`PERF_RECORD_LOST`).
    pub lost: u64,
    /// Waits lost to pairing: switch-in lost, sample lost, evicted at the thread bound.
    pub unpaired: u64,
    /// Threads off CPU now.
    pub open: u64,
    /// The reading thread's CPU time, nanoseconds.
    pub cpu_ns: u64,
    pub passes: u64,
    /// CPUs whose ring is open now (it follows CPU hotplug: [`OffCpu::follow_cpus`]).
    pub cpus: u64,
    /// The reading thread's nice value now ([`LOW_NICE`], or 0 while raised).
    pub nice: i32,
    /// Times it was raised to nice 0 because a ring filled past [`BOOST_FILL_PERMILLE`].
    pub boosts: u64,
}

#[derive(Debug, Default)]
struct Stats {
    switches: AtomicU64,
    waits: AtomicU64,
    off_cpu_ns: AtomicU64,
    without_stack: AtomicU64,
    lost: AtomicU64,
    unpaired: AtomicU64,
    open: AtomicU64,
    cpu_ns: AtomicU64,
    passes: AtomicU64,
    cpus: AtomicU64,
    nice: AtomicI32,
    boosts: AtomicU64,
}

/// The running source: stop it with [`OffCpu::stop`] (also on drop).
#[derive(Debug)]
pub struct OffCpu {
    stop: Arc<EventFd>,
    stopping: Arc<AtomicBool>,
    stats: Arc<Stats>,
    /// The newest online CPU list handed to [`OffCpu::follow_cpus`], for the reading thread.
    online: Arc<Mutex<Option<Vec<u32>>>>,
    thread: Option<JoinHandle<()>>,
    source: Source,
}

/// Chain buffers for reuse: a blocking switch-out moves its sample's buffer into the open
/// wait and takes an empty one from here; an emitted wait gives its buffer back. So no
/// allocation, free or copy happens per switch in the steady state (the debug build's
/// profile had malloc/free at ~6 % of the reading thread, and the copy was one more).
#[derive(Debug, Default)]
pub(crate) struct Spare(Vec<Vec<u64>>);

impl Spare {
    fn take(&mut self) -> Vec<u64> {
        self.0.pop().unwrap_or_else(|| Vec::with_capacity(CHAIN_CAPACITY))
    }

    fn give(&mut self, mut v: Vec<u64>) {
        if self.0.len() < SPARE_BUFFERS {
            v.clear();
            self.0.push(v);
        }
    }
}

/// What a ring's records are (each kind of event has its own rings, so that no record needs
/// an IDENTIFIER to say which event wrote it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// `context-switches` samples and switch records (the fallback).
    Records,
    /// `sched_switch` samples of blocking switch-outs, with their chains.
    Out,
    /// Switch records of the `dummy` event: their switch-ins.
    In,
}

/// One event of the plan: opened on every CPU, each with its own ring.
#[derive(Clone, Debug)]
struct RingPlan {
    role: Role,
    spec: AttrSpec,
    pages: usize,
    filter: Option<&'static std::ffi::CStr>,
}

struct CpuRing {
    cpu: u32,
    role: Role,
    fd: PerfFd,
    ring: RingMap,
    /// The last switch sample read, waiting for the switch-out record that follows it.
    last: LastSample,
}

impl CpuRing {
    /// The event on one CPU, filtered, not enabled yet.
    fn open(plan: &RingPlan, cpu: u32) -> Result<Self, OffCpuError> {
        let tp = plan.role != Role::Records;
        let fd = PerfFd::open(&plan.spec, cpu).map_err(|source| {
            if tp {
                OffCpuError::OpenTracepoint { cpu, source }
            } else {
                OffCpuError::Open { cpu, source }
            }
        })?;
        if let Some(f) = plan.filter {
            fd.set_filter(f).map_err(|source| OffCpuError::Filter {
                cpu,
                filter: f.to_string_lossy().into_owned(),
                source,
            })?;
        }
        let ring =
            RingMap::new(&fd, plan.pages).map_err(|source| OffCpuError::Map { cpu, source })?;
        Ok(Self { cpu, role: plan.role, fd, ring, last: LastSample::default() })
    }

    fn enable(&self) -> Result<(), OffCpuError> {
        self.fd.enable().map_err(|source| OffCpuError::Open { cpu: self.cpu, source })
    }
}

/// Every plan's event on every CPU of `cpus`, not enabled yet.
fn open_all(plans: &[RingPlan], cpus: &[u32]) -> Result<Vec<CpuRing>, OffCpuError> {
    let mut rings = Vec::with_capacity(cpus.len() * plans.len());
    for &cpu in cpus {
        for p in plans {
            rings.push(CpuRing::open(p, cpu)?);
        }
    }
    Ok(rings)
}

/// The events of `source`: the two tracepoint events, or the switch records.
fn plans(cfg: &OffCpuConfig, source: Source) -> Result<Vec<RingPlan>, OffCpuError> {
    let pages = cfg.ring_pages.max(1).next_power_of_two();
    // Wake-ups at half a ring: measured against 64 KiB (fresher data in the caches, but 8
    // times the wake-ups), half a ring cost less per switch (BENCHMARKS.md, branch offcpu3).
    let wm = |pages: usize| u32::try_from(pages * sp::page_size() / 2).unwrap_or(u32::MAX);
    let base = AttrSpec {
        perf_type: sp::PERF_TYPE_SOFTWARE,
        config: u64::from(sp::PERF_COUNT_SW_CONTEXT_SWITCHES),
        period: 1,
        sideband: false,
        build_id: false,
        wakeup_watermark: wm(pages),
        cgroup: false,
        max_stack: cfg.max_stack.max(1),
        user_stack: 0,
        context_switch: false,
        lean: true,
        raw: false,
        exits: true,
    };
    if source == Source::SwitchRecords {
        let spec = AttrSpec { context_switch: true, ..base };
        return Ok(vec![RingPlan { role: Role::Records, spec, pages, filter: None }]);
    }
    let tp = tracepoint::find()?;
    let out = AttrSpec { perf_type: sp::PERF_TYPE_TRACEPOINT, config: tp.id, ..base.clone() };
    // Switch records are 32 bytes, a switch-out sample ~200 (a chain of ~20 frames), and
    // there are two records per context switch: a quarter of the ring wakes the reader
    // about as often.
    let in_pages = (pages / 4).max(1);
    let inn = AttrSpec {
        config: u64::from(sp::PERF_COUNT_SW_DUMMY),
        max_stack: 0,
        exits: false,
        context_switch: true,
        wakeup_watermark: wm(in_pages),
        ..base
    };
    Ok(vec![
        RingPlan { role: Role::Out, spec: out, pages, filter: Some(tracepoint::OUT_FILTER) },
        RingPlan { role: Role::In, spec: inn, pages: in_pages, filter: None },
    ])
}

/// The events for `cfg.source` opened on `cpus`, and the source they are: with `Auto`, the
/// tracepoints, else (tracefs absent, the tracepoint refused) the switch records, saying why.
fn open_source(
    cfg: &OffCpuConfig,
    cpus: &[u32],
) -> Result<(Source, Vec<RingPlan>, Vec<CpuRing>), OffCpuError> {
    let records = || {
        let p = plans(cfg, Source::SwitchRecords)?;
        let rings = open_all(&p, cpus)?;
        Ok((Source::SwitchRecords, p, rings))
    };
    if cfg.source == Source::SwitchRecords {
        return records();
    }
    let tracepoints =
        plans(cfg, Source::Tracepoint).and_then(|p| open_all(&p, cpus).map(|rings| (p, rings)));
    match tracepoints {
        Ok((p, rings)) => Ok((Source::Tracepoint, p, rings)),
        Err(e) if cfg.source == Source::Tracepoint => Err(e),
        Err(e) => {
            tracing::warn!(error = %e, "off-CPU: the sched:sched_switch tracepoint cannot be \
                used; timing waits with switch records instead, which costs a sample with a \
                call chain and two records at every context switch (BENCHMARKS.md, Off-CPU)");
            records()
        }
    }
}

impl OffCpu {
    /// Open the events on every CPU of `cpus` and start the reading thread.
    pub fn start(
        cfg: OffCpuConfig,
        cpus: &[u32],
        sink: Arc<dyn SampleSink>,
        stacks: Option<Arc<StackTables>>,
    ) -> Result<Self, OffCpuError> {
        let mut bpf_failed = None;
        if matches!(cfg.source, Source::Bpf | Source::Auto) {
            match bpf::Loaded::load(cfg.threshold_ns, stacks.is_some()) {
                Ok(loaded) => return Self::start_bpf(cfg, cpus, loaded, sink, stacks),
                Err(e) if cfg.source == Source::Bpf => return Err(e.into()),
                Err(e) => bpf_failed = Some(e),
            }
        }
        let (source, plans, rings) = open_source(&cfg, cpus)?;
        if let Some(e) = bpf_failed {
            tracing::warn!(error = %e, source = source.name(), "off-CPU: the BPF program cannot \
                be used (it needs CAP_BPF and CAP_PERFMON, the kernel's BTF and a kernel of 5.18 \
                or later); timing waits with perf records instead, which the kernel writes at \
                every blocking switch (BENCHMARKS.md, Off-CPU)");
        }
        for r in &rings {
            r.enable()?;
        }
        let stop = Arc::new(EventFd::new()?);
        let stopping = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::default());
        stats.cpus.store(cpus.len() as u64, Ordering::Relaxed);
        let online = Arc::new(Mutex::new(None));
        let mut reader = Reader {
            plans,
            online: Arc::clone(&online),
            failed: BTreeSet::new(),
            pairing: Pairing::new(cfg.max_threads),
            cfg,
            rings,
            ring_reader: RingReader::new(),
            sink,
            stacks,
            stats: Arc::clone(&stats),
            waits: Vec::new(),
            samples: Vec::new(),
            spare: Spare::default(),
            priority: Priority::default(),
        };
        let (stop2, stopping2) = (Arc::clone(&stop), Arc::clone(&stopping));
        let thread = std::thread::Builder::new()
            .name(THREAD.into())
            .spawn(move || reader.run(&stop2, &stopping2))?;
        Ok(Self { stop, stopping, stats, online, thread: Some(thread), source })
    }

    /// The BPF source: its reading thread.
    fn start_bpf(
        cfg: OffCpuConfig,
        cpus: &[u32],
        loaded: bpf::Loaded,
        sink: Arc<dyn SampleSink>,
        stacks: Option<Arc<StackTables>>,
    ) -> Result<Self, OffCpuError> {
        let stop = Arc::new(EventFd::new()?);
        let stopping = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(Stats::default());
        // The program runs on every CPU, those that come online included.
        stats.cpus.store(cpus.len() as u64, Ordering::Relaxed);
        let mut reader = bpf::BpfReader::new(cfg, loaded, sink, stacks, Arc::clone(&stats));
        let (stop2, stopping2) = (Arc::clone(&stop), Arc::clone(&stopping));
        let thread = std::thread::Builder::new()
            .name(THREAD.into())
            .spawn(move || reader.run(&stop2, &stopping2))?;
        let online = Arc::new(Mutex::new(None));
        Ok(Self { stop, stopping, stats, online, thread: Some(thread), source: Source::Bpf })
    }

    /// The kernel events in use (never `Auto`).
    pub fn source(&self) -> Source {
        self.source
    }

    /// CPU hotplug: from its next pass the reading thread closes the rings of CPUs not in
    /// `online` and opens the event on those of `online` it has no ring for (as the sampler
    /// does for the sampled events; dcpid's flush thread hands over the list each hotplug
    /// check reads). A CPU whose event cannot be opened is retried at the next call.
    pub fn follow_cpus(&self, online: &[u32]) {
        *self.online.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            Some(online.to_vec());
    }

    /// Counters since start.
    pub fn status(&self) -> OffCpuStatus {
        let s = &self.stats;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        OffCpuStatus {
            source: self.source.name(),
            switches: l(&s.switches),
            waits: l(&s.waits),
            off_cpu_ns: l(&s.off_cpu_ns),
            waits_without_stack: l(&s.without_stack),
            lost: l(&s.lost),
            unpaired: l(&s.unpaired),
            open: l(&s.open),
            cpu_ns: l(&s.cpu_ns),
            passes: l(&s.passes),
            cpus: l(&s.cpus),
            nice: s.nice.load(Ordering::Relaxed),
            boosts: l(&s.boosts),
        }
    }

    /// Disable the events, deliver a last pass and join the thread.
    pub fn stop(&mut self) {
        self.stopping.store(true, Ordering::Release);
        drop(self.stop.signal());
        if let Some(t) = self.thread.take() {
            drop(t.join());
        }
    }
}

impl Drop for OffCpu {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Reader {
    cfg: OffCpuConfig,
    /// The events each CPU has, for CPUs that come online.
    plans: Vec<RingPlan>,
    online: Arc<Mutex<Option<Vec<u32>>>>,
    /// CPUs whose event failed to open at the last attempt (warned once).
    failed: BTreeSet<u32>,
    rings: Vec<CpuRing>,
    ring_reader: RingReader,
    pairing: Pairing,
    sink: Arc<dyn SampleSink>,
    stacks: Option<Arc<StackTables>>,
    stats: Arc<Stats>,
    waits: Vec<Wait>,
    samples: Vec<Sample>,
    spare: Spare,
    priority: Priority,
}

/// When the reading thread changes its nice value (see the module docs); pure, so that the
/// policy is tested without a scheduler.
#[derive(Debug, Default)]
struct Priority {
    /// At [`LOW_NICE`] now.
    low: bool,
    /// Raising it back failed once (no `RLIMIT_NICE`): it stays low.
    cannot_raise: bool,
    /// When it was last raised.
    raised_at: u64,
}

impl Priority {
    /// The nice value to set after a pass whose fullest ring was `fill` per mille full at
    /// `now`, if it should change.
    fn after_pass(&self, fill: u64, now: u64) -> Option<i32> {
        if self.low {
            (fill >= BOOST_FILL_PERMILLE && !self.cannot_raise).then_some(0)
        } else {
            (self.raised_at != 0
                && now.saturating_sub(self.raised_at) >= BOOST_NS
                && fill < BOOST_FILL_PERMILLE)
                .then_some(LOW_NICE)
        }
    }

    /// `nice` was set (`ok`) or refused at `now`.
    fn set(&mut self, nice: i32, ok: bool, now: u64) {
        match (nice == LOW_NICE, ok) {
            (true, true) => self.low = true,
            (false, true) => (self.low, self.raised_at) = (false, now.max(1)),
            (false, false) => self.cannot_raise = true,
            // Lowering failed: it stays where it is and is not retried at every pass.
            (true, false) => self.raised_at = 0,
        }
    }
}

impl Reader {
    /// Set the thread's nice value and record it; a refusal is logged once.
    fn renice(&mut self, nice: i32, now: u64) {
        let res = sp::set_own_nice(nice);
        let ok = res.is_ok();
        if let Err(e) = res {
            if nice == LOW_NICE {
                tracing::info!(error = %e, "off-CPU: the reading thread stays at its nice value (setpriority refused)");
            } else {
                tracing::warn!(error = %e, nice = LOW_NICE, "off-CPU: the rings filled past {BOOST_FILL_PERMILLE}\u{2030} but the reading thread cannot raise its priority (needs LimitNICE=+0 or CAP_SYS_NICE); records may be lost under load");
            }
        }
        self.priority.set(nice, ok, now);
        let s = &self.stats;
        if ok {
            s.nice.store(nice, Ordering::Relaxed);
            s.boosts.fetch_add(u64::from(nice != LOW_NICE), Ordering::Relaxed);
        }
    }

    fn run(&mut self, stop: &EventFd, stopping: &AtomicBool) {
        let clock = sys::time::own_thread_clock();
        self.renice(LOW_NICE, sys::time::monotonic_ns());
        loop {
            let fds: Vec<&PerfFd> = self.rings.iter().map(|r| &r.fd).collect();
            if let Err(e) = sp::poll_rings(&fds, stop, POLL_MS) {
                tracing::warn!(error = %e, "off-CPU: poll failed; reading on a timer");
                std::thread::sleep(std::time::Duration::from_millis(POLL_MS as u64));
            }
            let last = stopping.load(Ordering::Acquire);
            if last {
                for r in &self.rings {
                    drop(r.fd.disable());
                }
            }
            let fullest = self.pass();
            let now = sys::time::monotonic_ns();
            if let Some(nice) = self.priority.after_pass(fullest, now) {
                self.renice(nice, now);
            }
            if !last {
                let online =
                    self.online.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
                if let Some(online) = online {
                    self.follow(&online);
                }
            }
            if let Some(c) = clock.and_then(sys::time::clock_ns) {
                self.stats.cpu_ns.store(c, Ordering::Relaxed);
            }
            if last {
                return;
            }
        }
    }

    /// After a pass (which read the rings of CPUs that went offline a last time): close those,
    /// open the event on CPUs that came online. Their records start after the open, above
    /// the watermark of the pass that read everything before it.
    fn follow(&mut self, online: &[u32]) {
        let mut have: Vec<u32> = self.rings.iter().map(|r| r.cpu).collect();
        have.dedup();
        let (gone, new) = sampler::cpu_changes(&have, online);
        if !gone.is_empty() {
            tracing::info!(cpus = ?gone, "off-CPU: CPUs went offline; closing their events");
            self.rings.retain(|r| !gone.contains(&r.cpu));
        }
        self.failed.retain(|c| online.contains(c));
        for cpu in new {
            let opened = open_all(&self.plans, &[cpu])
                .and_then(|rs| rs.iter().try_for_each(CpuRing::enable).map(|()| rs));
            match opened {
                Ok(rs) => {
                    tracing::info!(cpu, "off-CPU: CPU online; timing its waits");
                    self.failed.remove(&cpu);
                    self.rings.extend(rs);
                }
                Err(e) => {
                    if self.failed.insert(cpu) {
                        tracing::warn!(cpu, error = %e, "off-CPU: cannot open a CPU that came online; retrying at the next hotplug check");
                    }
                }
            }
        }
        self.rings.sort_by_key(|r| r.cpu);
        let cpus = self.rings.len() / self.plans.len().max(1);
        self.stats.cpus.store(cpus as u64, Ordering::Relaxed);
    }

    /// Read every ring, pair what is below the watermark and hand the waits over. Returns how
    /// full the fullest ring was when read, per mille of its data area.
    fn pass(&mut self) -> u64 {
        let now = sys::time::monotonic_ns();
        let max_stack = usize::from(self.cfg.max_stack.max(1));
        let mut lost = 0;
        let mut switches = 0;
        let mut fullest = 0;
        for r in &mut self.rings {
            let pairing = &mut self.pairing;
            let last = &mut r.last;
            let spare = &mut self.spare;
            let role = r.role;
            let size = r.ring.data_size() as u64;
            let read = self.ring_reader.drain(&r.ring, |rec| {
                match on_record(rec, role, max_stack, last, spare) {
                    Rec::Switch(s) => {
                        // A context switch: with the switch records, every switch-out; with the
                        // tracepoints, which see no preemption, every switch-in.
                        let counted = match role {
                            Role::Records => matches!(s.kind, Kind::Out { .. }),
                            Role::In => true,
                            Role::Out => false,
                        };
                        switches += u64::from(counted && s.tid != 0);
                        pairing.push(s);
                    }
                    Rec::Nothing => {}
                    Rec::Lost(n) => lost += n,
                }
            });
            fullest = fullest.max(read.bytes.saturating_mul(1000) / size.max(1));
        }
        let wm = now.saturating_sub(SLACK_NS);
        self.pairing.advance(wm, &mut self.waits);
        self.emit(wm);
        let s = &self.stats;
        s.switches.fetch_add(switches, Ordering::Relaxed);
        s.lost.fetch_add(lost, Ordering::Relaxed);
        let c = self.pairing.counters;
        s.unpaired.store(c.unpaired + c.unattributed + c.evicted, Ordering::Relaxed);
        s.open.store(self.pairing.open_waits() as u64, Ordering::Relaxed);
        s.passes.fetch_add(1, Ordering::Relaxed);
        fullest
    }

    fn emit(&mut self, wm: u64) {
        let mut total = 0u64;
        let mut without = 0u64;
        let n = self.waits.len() as u64;
        let mut table = self.stacks.as_ref().map(|t| t.cpu(self.cfg.slot));
        if let Some(t) = table.as_mut() {
            t.begin_pass();
        }
        for w in self.waits.drain(..) {
            let ns = w.ns();
            total = total.saturating_add(ns);
            let stack = match table.as_mut() {
                Some(t) if ns >= self.cfg.threshold_ns && !w.blocking.pcs.is_empty() => {
                    t.intern_pcs(&w.blocking.pcs, w.blocking.truncated)
                }
                _ => 0,
            };
            without += u64::from(stack == 0);
            let Blocking { pid, pc, kernel, pcs, .. } = w.blocking;
            self.spare.give(pcs);
            self.samples.push(Sample {
                time: w.end,
                pid,
                tid: w.tid,
                pc,
                event: self.cfg.event,
                period: ns.max(1),
                kernel,
                cgroup: 0,
                stack,
            });
        }
        drop(table);
        // Every pass reports, with or without waits: the slot's clock must stay fresh.
        self.sink.on_drain(self.cfg.slot, wm, &mut self.samples, &mut Vec::new());
        self.samples.clear();
        if let Some(t) = self.stacks.as_ref() {
            t.cpu(self.cfg.slot).end_pass();
        }
        let s = &self.stats;
        s.waits.fetch_add(n, Ordering::Relaxed);
        s.off_cpu_ns.fetch_add(total, Ordering::Relaxed);
        s.without_stack.fetch_add(without, Ordering::Relaxed);
    }
}

/// What a record of a CPU's ring means to the source.
enum Rec {
    Switch(Switch),
    Lost(u64),
    Nothing,
}

/// The last switch sample of a CPU, until the switch-out record that follows it says whether
/// the thread blocked: only then is its chain copied out (half the switches of a loaded
/// machine are preemptions, whose chains are dropped).
#[derive(Debug, Default)]
struct LastSample {
    valid: bool,
    tid: u32,
    pid: u32,
    truncated: bool,
    /// Leaf-first pcs (reused: no allocation per sample).
    pcs: Vec<u64>,
}

impl LastSample {
    /// The blocking stack, if this sample is the switch-out of `tid`: the chain's buffer moves
    /// into it and an empty one from `spare` takes its place.
    fn take(&mut self, tid: u32, voluntary: bool, spare: &mut Spare) -> Option<Blocking> {
        if !std::mem::take(&mut self.valid) || self.tid != tid || !voluntary {
            return None;
        }
        // A kernel thread's: the chain's first frame, the sample's ip (the layout has no IP).
        let (pc, kernel) = match self.pcs.iter().copied().find(|&pc| pc < KERNEL_START) {
            Some(pc) => (pc, false),
            None => (self.pcs.first().copied()?, true),
        };
        Some(Blocking {
            pid: self.pid,
            pc,
            kernel,
            pcs: std::mem::replace(&mut self.pcs, spare.take()),
            truncated: self.truncated,
        })
    }
}

/// The events' layout (`sys::perf::make_attr` with `lean`): a sample is PID/TID, TIME, then
/// CALLCHAIN (`nr`, `nr` u64s) or RAW (`size` u32, `size` bytes); every other record ends with
/// the `sample_id` trailer PID/TID, TIME.
const TRAILER: usize = 16;

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// The thread and time of a record's `sample_id` trailer.
fn trailer(body: &[u8]) -> Option<(u32, u64)> {
    let at = body.len().checked_sub(TRAILER)?;
    Some((u32_at(body, at + 4)?, u64_at(body, at + 8)?))
}

/// One record of a CPU's ring of `role`. With the switch records, a switch sample is kept in
/// `last` until the switch-out record of the same thread that follows it; a tracepoint's
/// switch-out sample is a blocking switch-out by itself (the kernel filtered the others). A
/// malformed record is skipped.
fn on_record(
    rec: RawRecord<'_>,
    role: Role,
    max_stack: usize,
    last: &mut LastSample,
    spare: &mut Spare,
) -> Rec {
    let b = rec.body;
    match (rec.kind, role) {
        // The switch-in ring: only its switch-ins (the tracepoint gives the blocking
        // switch-outs, with their chains).
        (sp::PERF_RECORD_SWITCH_CPU_WIDE, Role::In) => {
            let Some((tid, time)) = trailer(b) else { return Rec::Nothing };
            if u32::from(rec.misc) & sp::PERF_RECORD_MISC_SWITCH_OUT != 0 {
                return Rec::Nothing;
            }
            Rec::Switch(Switch { time, tid, kind: Kind::In })
        }
        (sp::PERF_RECORD_SAMPLE, Role::Out) => {
            let (Some(tid), Some(time)) = (u32_at(b, 4), u64_at(b, 8)) else {
                return Rec::Nothing;
            };
            if !read_chain(b, max_stack, last) {
                return Rec::Nothing;
            }
            let blocking = last.take(tid, true, spare);
            Rec::Switch(Switch { time, tid, kind: Kind::Out { voluntary: true, blocking } })
        }
        (sp::PERF_RECORD_SAMPLE, _) => {
            read_chain(b, max_stack, last);
            Rec::Nothing
        }
        (sp::PERF_RECORD_SWITCH_CPU_WIDE, _) => {
            let Some((tid, time)) = trailer(b) else { return Rec::Nothing };
            let misc = u32::from(rec.misc);
            if misc & sp::PERF_RECORD_MISC_SWITCH_OUT != 0 {
                let voluntary = misc & sp::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT == 0;
                let blocking = last.take(tid, voluntary, spare);
                let kind = Kind::Out { voluntary, blocking };
                Rec::Switch(Switch { time, tid, kind })
            } else {
                Rec::Switch(Switch { time, tid, kind: Kind::In })
            }
        }
        // pid, ppid, tid, ptid, time.
        (sp::PERF_RECORD_EXIT, _) => match (u32_at(b, 8), u64_at(b, 16)) {
            (Some(tid), Some(time)) => Rec::Switch(Switch { time, tid, kind: Kind::Exit }),
            _ => Rec::Nothing,
        },
        // id, lost.
        (sp::PERF_RECORD_LOST, _) => u64_at(b, 8).map_or(Rec::Nothing, Rec::Lost),
        _ => Rec::Nothing,
    }
}

/// A switch sample's thread and chain into `last` (PID/TID, TIME, CALLCHAIN); false (and
/// `last` invalid) if the record is malformed or the idle task's.
fn read_chain(b: &[u8], max_stack: usize, last: &mut LastSample) -> bool {
    last.valid = false;
    let (Some(pid), Some(tid), Some(nr)) = (u32_at(b, 0), u32_at(b, 4), u64_at(b, 16)) else {
        return false;
    };
    if tid == 0 {
        return false;
    }
    let chain = usize::try_from(nr)
        .ok()
        .and_then(|n| n.checked_mul(8))
        .and_then(|len| b.get(24..24usize.checked_add(len)?));
    let Some(chain) = chain else { return false };
    last.truncated = process_chain(chain, max_stack, &mut last.pcs).unwrap_or(false);
    (last.valid, last.tid, last.pid) = (true, tid, pid);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    /// The priority policy: low while the rings are read in time, raised when one fills past
    /// the threshold, low again once raised for `BOOST_NS` and the rings keep up.
    #[test]
    fn the_reader_is_raised_when_a_ring_fills_and_lowered_once_it_keeps_up() {
        let mut p = Priority::default();
        p.set(LOW_NICE, true, S);
        // Read at half a ring (its wake-up) or less: it stays low.
        assert_eq!(p.after_pass(500, 2 * S), None);
        assert_eq!(p.after_pass(0, 3 * S), None);
        // Read late: raised.
        assert_eq!(p.after_pass(BOOST_FILL_PERMILLE, 4 * S), Some(0));
        p.set(0, true, 4 * S);
        // Not lowered before BOOST_NS, even with empty rings, nor after it while still late.
        assert_eq!(p.after_pass(0, 4 * S + BOOST_NS - 1), None);
        assert_eq!(p.after_pass(900, 4 * S + BOOST_NS), None);
        assert_eq!(p.after_pass(400, 4 * S + BOOST_NS), Some(LOW_NICE));
        p.set(LOW_NICE, true, 4 * S + BOOST_NS);
        assert_eq!(p.after_pass(400, 20 * S), None);
    }

    /// Without the right to raise it back (no `RLIMIT_NICE`), it stays low and stops asking;
    /// if it could not be lowered at all, it stays where it is and never asks again.
    #[test]
    fn a_refused_priority_change_is_not_retried_at_every_pass() {
        let mut p = Priority::default();
        p.set(LOW_NICE, true, S);
        p.set(0, false, 2 * S);
        assert_eq!(p.after_pass(1000, 3 * S), None);
        let mut q = Priority::default();
        q.set(LOW_NICE, false, S);
        assert_eq!(q.after_pass(0, 100 * S), None);
        assert_eq!(q.after_pass(1000, 100 * S), None);
    }

    /// `set_own_nice` changes the calling thread only (Linux nice values are per thread).
    #[test]
    fn set_own_nice_lowers_only_the_calling_thread() {
        fn nice_of(path: &str) -> i64 {
            // /proc/.../stat: the command is in parentheses and may hold spaces; the nice value
            // is the 19th field, the 17th after the closing parenthesis.
            let stat = std::fs::read_to_string(path).unwrap();
            let rest = &stat[stat.rfind(')').unwrap() + 2..];
            rest.split(' ').nth(16).unwrap().parse().unwrap()
        }
        let before = nice_of("/proc/thread-self/stat");
        let inside = std::thread::spawn(|| {
            sp::set_own_nice(LOW_NICE).unwrap();
            nice_of("/proc/thread-self/stat")
        })
        .join()
        .unwrap();
        assert_eq!(inside, i64::from(LOW_NICE));
        assert_eq!(nice_of("/proc/thread-self/stat"), before);
    }

    const KPC: u64 = 0xffff_ffff_8100_0000;

    fn u64s(v: &[u64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    /// A sample body of the off-CPU event: PID/TID, TIME, CALLCHAIN.
    fn sample_body(pid: u32, tid: u32, time: u64, chain: &[u64]) -> Vec<u8> {
        let ids = u64::from(pid) | (u64::from(tid) << 32);
        let mut v = vec![ids, time, chain.len() as u64];
        v.extend_from_slice(chain);
        u64s(&v)
    }

    /// A `PERF_RECORD_SWITCH_CPU_WIDE` body: next/prev pid and tid, then the `sample_id`
    /// (PID/TID, TIME).
    fn switch_body(pid: u32, tid: u32, time: u64) -> Vec<u8> {
        let ids = u64::from(pid) | (u64::from(tid) << 32);
        u64s(&[0, ids, time])
    }

    fn rec(kind: u32, misc: u16, body: &[u8]) -> RawRecord<'_> {
        RawRecord { kind, misc, body }
    }

    /// A record of the switch-records rings.
    fn on_record_r(
        rec: RawRecord<'_>,
        max_stack: usize,
        last: &mut LastSample,
        spare: &mut Spare,
    ) -> Rec {
        on_record(rec, Role::Records, max_stack, last, spare)
    }

    #[test]
    fn tracepoint_samples_are_blocking_switch_outs_and_switch_records_the_switch_ins() {
        let ctx_kernel = -128i64 as u64;
        let ctx_user = -512i64 as u64;
        let chain = [ctx_kernel, KPC, ctx_user, 0x40_1000, 0x40_2005];
        let (mut last, mut spare) = (LastSample::default(), Spare::default());
        let out = sample_body(7, 42, 100, &chain);
        let Rec::Switch(s) =
            on_record(rec(sp::PERF_RECORD_SAMPLE, 1, &out), Role::Out, 64, &mut last, &mut spare)
        else {
            panic!("no switch-out")
        };
        assert_eq!((s.time, s.tid), (100, 42));
        let Kind::Out { voluntary: true, blocking: Some(b) } = s.kind else { panic!("{s:?}") };
        assert_eq!((b.pid, b.pc, b.kernel), (7, 0x40_1000, false));
        assert_eq!(*b.pcs, [KPC, 0x40_1000, 0x40_2004]);

        // The switch-in ring: a switch-in record ends a wait; its switch-outs are ignored
        // (the tracepoint gives the blocking ones).
        let sw = switch_body(7, 42, 250);
        let Rec::Switch(s) = on_record(
            rec(sp::PERF_RECORD_SWITCH_CPU_WIDE, 0, &sw),
            Role::In,
            64,
            &mut last,
            &mut spare,
        ) else {
            panic!("no switch-in")
        };
        assert_eq!((s.time, s.tid, s.kind), (250, 42, Kind::In));
        let out_misc = sp::PERF_RECORD_MISC_SWITCH_OUT as u16;
        let r = on_record(
            rec(sp::PERF_RECORD_SWITCH_CPU_WIDE, out_misc, &sw),
            Role::In,
            64,
            &mut last,
            &mut spare,
        );
        assert!(matches!(r, Rec::Nothing));

        // Truncated: the switch record's trailer, the chain past the record.
        let cut = (&sw[..12], Role::In, sp::PERF_RECORD_SWITCH_CPU_WIDE);
        for (body, role, kind) in [cut, (&out[..out.len() - 8], Role::Out, sp::PERF_RECORD_SAMPLE)]
        {
            let r = on_record(rec(kind, 0, body), role, 64, &mut last, &mut spare);
            assert!(matches!(r, Rec::Nothing));
        }
        // Exit records come on the switch-out ring.
        let exit = u64s(&[7 | (1 << 32), 42 | (7 << 32), 300, 7 | (42 << 32), 300]);
        let r =
            on_record(rec(sp::PERF_RECORD_EXIT, 0, &exit), Role::Out, 64, &mut last, &mut spare);
        assert!(matches!(r, Rec::Switch(Switch { tid: 42, kind: Kind::Exit, .. })));
    }

    #[test]
    fn a_switch_sample_and_its_switch_out_record_make_one_blocking_stack() {
        let ctx_kernel = -128i64 as u64;
        let ctx_user = -512i64 as u64;
        let chain = [ctx_kernel, KPC, KPC + 0x40, ctx_user, 0x40_1000, 0x40_2005];
        let mut last = LastSample::default();
        let mut spare = Spare::default();
        let out = sp::PERF_RECORD_MISC_SWITCH_OUT as u16;
        let preempt = out | sp::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT as u16;
        let sample = sample_body(7, 42, 100, &chain);
        let sw = switch_body(7, 42, 101);

        // Blocked: the wait is at the user pc where the thread entered the kernel.
        let r = on_record_r(rec(sp::PERF_RECORD_SAMPLE, 1, &sample), 64, &mut last, &mut spare);
        assert!(matches!(r, Rec::Nothing));
        let Rec::Switch(s) =
            on_record_r(rec(sp::PERF_RECORD_SWITCH_CPU_WIDE, out, &sw), 64, &mut last, &mut spare)
        else {
            panic!("no switch")
        };
        assert_eq!((s.time, s.tid), (101, 42));
        let Kind::Out { voluntary: true, blocking: Some(b) } = s.kind else { panic!("{s:?}") };
        assert_eq!((b.pid, b.pc, b.kernel), (7, 0x40_1000, false));
        assert_eq!(*b.pcs, [KPC, KPC + 0x3f, 0x40_1000, 0x40_2004]);

        // Preempted: a switch-out without a blocking stack (not a wait).
        on_record_r(rec(sp::PERF_RECORD_SAMPLE, 1, &sample), 64, &mut last, &mut spare);
        let Rec::Switch(s) = on_record_r(
            rec(sp::PERF_RECORD_SWITCH_CPU_WIDE, preempt, &sw),
            64,
            &mut last,
            &mut spare,
        ) else {
            panic!("no switch")
        };
        assert_eq!(s.kind, Kind::Out { voluntary: false, blocking: None });

        // A kernel thread (no user frames) waits at its first kernel frame; a switch-out of another
        // thread does not take this one's sample.
        let k = sample_body(3, 3, 200, &[ctx_kernel, KPC + 8]);
        on_record_r(rec(sp::PERF_RECORD_SAMPLE, 1, &k), 64, &mut last, &mut spare);
        let other = switch_body(5, 5, 201);
        let Rec::Switch(s) = on_record_r(
            rec(sp::PERF_RECORD_SWITCH_CPU_WIDE, out, &other),
            64,
            &mut last,
            &mut spare,
        ) else {
            panic!("no switch")
        };
        assert_eq!(s.kind, Kind::Out { voluntary: true, blocking: None });
        on_record_r(rec(sp::PERF_RECORD_SAMPLE, 1, &k), 64, &mut last, &mut spare);
        let kt = switch_body(3, 3, 202);
        let Rec::Switch(s) =
            on_record_r(rec(sp::PERF_RECORD_SWITCH_CPU_WIDE, out, &kt), 64, &mut last, &mut spare)
        else {
            panic!("no switch")
        };
        let Kind::Out { blocking: Some(b), .. } = s.kind else { panic!("{s:?}") };
        assert_eq!((b.pc, b.kernel), (KPC + 8, true));

        // An exit record (pid, ppid, tid, ptid, time, sample_id) and a lost record (id, lost,
        // sample_id); truncated records are skipped, not read past.
        let exit = u64s(&[7 | (1 << 32), 42 | (7 << 32), 300, 7 | (42 << 32), 300]);
        let Rec::Switch(s) =
            on_record_r(rec(sp::PERF_RECORD_EXIT, 0, &exit), 64, &mut last, &mut spare)
        else {
            panic!("no exit")
        };
        assert_eq!((s.time, s.tid, s.kind), (300, 42, Kind::Exit));
        let lost = u64s(&[9, 5, 0, 0]);
        let r = on_record_r(rec(sp::PERF_RECORD_LOST, 0, &lost), 64, &mut last, &mut spare);
        assert!(matches!(r, Rec::Lost(5)));
        for kind in [sp::PERF_RECORD_SAMPLE, sp::PERF_RECORD_SWITCH_CPU_WIDE, sp::PERF_RECORD_EXIT]
        {
            let r = on_record_r(rec(kind, out, &sample[..12]), 64, &mut last, &mut spare);
            assert!(matches!(r, Rec::Nothing));
        }
        let long_chain = sample_body(7, 42, 100, &[ctx_user, 1, 2]);
        let r = on_record_r(
            rec(sp::PERF_RECORD_SAMPLE, 1, &long_chain[..long_chain.len() - 8]),
            64,
            &mut last,
            &mut spare,
        );
        assert!(matches!(r, Rec::Nothing) && !last.valid, "a chain past the record is skipped");

        // A switch-in.
        let Rec::Switch(s) =
            on_record_r(rec(sp::PERF_RECORD_SWITCH_CPU_WIDE, 0, &sw), 64, &mut last, &mut spare)
        else {
            panic!("no switch")
        };
        assert_eq!(s.kind, Kind::In);
    }
}
