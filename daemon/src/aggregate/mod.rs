//! Per-CPU aggregation of samples, ordered against side-band records by time.
//!
//! CONTRACT (used by `store` and `service`; owned by the resolver work):
//! - `Aggregator::new(resolver, ncpus) -> Arc<Aggregator>` (default [`AggregatorConfig`]) or
//!   `Aggregator::with_config(resolver, ncpus, cfg)`; it implements `SampleSink`.
//! - `take_resolved(&self) -> Resolved`: swaps out every per-CPU table and resolves each entry.
//! - `flush_all(&self) -> Resolved`: like `take_resolved`, but first applies every queued
//!   side-band record and aggregates every pending sample regardless of the watermark (used at
//!   shutdown and when an epoch is closed).
//! - `stats(&self) -> AggregatorStats`.
//! - `with_resolver(&self, f)` gives access to the resolver (status, kallsyms snapshot).
//! - `start_resolver_thread(&Arc<Self>, watch)` / `stop_resolver_thread(&self)`: the
//!   resolver thread ([`RESOLVER_THREAD`]); `resolver_thread_stats(&self)`.
//!
//! ORDERING (daemon/ARCHITECTURE.md "Ordering across CPUs"): each drain thread reports
//! `drained_until`; the watermark is the minimum over CPUs that reported within
//! [`STALE_AFTER`] (never moving back). Side-band records are queued per CPU and applied to the
//! resolver in time order (a merge of the per-CPU queues) once the watermark reaches them; a
//! record arriving at or below the watermark (from a CPU that was left out) is applied by the
//! next pass of the resolver thread (or flush), before the others, and counted in
//! `late_sideband`; until then drain threads aggregate no sample at or after its time
//! (`late_floor`). Samples wait per CPU until the watermark and `applied_until` reach them,
//! then go into that CPU's table under `(pid, asid, pc, event, kernel)`, where `asid` is the
//! address-space version in force at the sample's time (`Resolver::asid_at`); kernel samples
//! use asid 0 and pid 1, except those of the idle task (pid 0), which keep pid 0 and resolve
//! to the `[idle]` pseudo-image ([`crate::who`]). With per-process profiles on
//! ([`Aggregator::set_who_profiles`], dcpid's `by_pid`/`by_cgroup`) kernel samples keep their
//! pid too, and each batch also carries its profiles per process ([`Resolved::pid_profiles`]).
//!
//! THREADS. Drain threads (one per CPU, `SCHED_FIFO`) never read a file and never take the
//! resolver for writing: records due and full overflow buffers go to one resolver thread
//! (daemon/ARCHITECTURE.md "The resolver thread"), woken (thread unpark) at most once per
//! drain pass and only when a pass found records due, a late record or a full buffer; a
//! pass that queues nothing due does not wake it. Without a resolver thread (unit tests,
//! benches), the caller of `on_drain` does that work itself, never waiting for the resolver.
//!
//! LOCKS. The sample path takes no shared lock per sample, and a drain thread never waits for
//! the resolver. Per drain pass, a drain thread
//! (1) appends its samples to its CPU's pending queue (its own CPU mutex, which only it, the
//! resolver thread and the flusher touch), (2) takes the shared mutex once to queue side-band
//! records (late ones into `Shared::late`) and move the watermark; if nothing is due and
//! nothing late, `applied_until` moves to the watermark (sound because records are only ever
//! popped and applied together under the shared mutex, with the resolver held), otherwise it
//! will wake the resolver thread, (3) aggregates its samples up to `min(watermark,
//! applied_until, cut cap)` under its CPU mutex, handing a full overflow buffer over
//! (`CpuState::stashed`), and then wakes the resolver thread if (2) or (3) asked for it.
//! Step 3 finds asids in a per-CPU cache `pid → (asid, valid from, valid until)`
//! ([`Resolver::asid_span`], `until` capped at `applied_until`); on a miss it takes the
//! resolver's read lock once for the rest of the pass, and only with `try_read`: if the
//! resolver thread or a flush holds the resolver, the samples stay pending (a later pass or
//! the flush aggregates them). The cache is cleared when `epoch` changes: after a late
//! record, a `with_resolver` call and every `gc`, the only events that change what
//! `asid_span` answers for times below `applied_until`.
//! The resolver thread, per wake-up: copies (under the shared mutex, briefly) the records due
//! up to the watermark `W` that need a file read, reads those files with no lock held
//! ([`RecordIo::prepare`]), then takes the resolver and the shared mutex, pops and applies
//! the late records and every record up to `W` (any record up to `W` that arrived since was
//! late, hence popped too), moves `applied_until` to `W` and releases the shared mutex; then,
//! if a buffer was handed over, it takes the stashed buffers out of the CPUs with the
//! resolver still held and resolves them into `early`.
//! A flush (`take_resolved`, `cut`, `flush_all`) does the same read-then-apply for the
//! records up to its limit, holds the shared mutex only while it applies them, then releases
//! it and takes the tables (and stashed buffers) and resolves them holding only the resolver
//! (and each CPU mutex briefly, to swap its table): drain threads keep draining meanwhile.
//! Because stashed buffers leave a CPU only with the resolver held, a flush finds every
//! handed-over buffer either still stashed or already in `early`: barriers stay exact.
//! Step 1 happens before step 2 so that when a flush aggregates everything up to the
//! watermark and then runs `Resolver::gc`, no sample at or below that watermark is still in a
//! drain thread's hands. Lock order: resolver → shared (the resolver thread and flushes);
//! resolver → `early` → CPU (taking stashed buffers, swapping tables); a drain thread holds
//! at most one of the shared and CPU mutexes at a time, and takes the resolver only with
//! `try_read` under its CPU mutex.
//!
//! BOUNDED MEMORY (see [`table`]): each CPU has a fixed-size 4-way set-associative table and
//! an overflow buffer for evicted entries. When the overflow buffer fills, the drain thread
//! swaps in the spare buffer and hands the full one to the resolver thread, which resolves it
//! into `early` (merged into the next `take_resolved`) and hands it back as the spare. While
//! the spare is out, a drain pass whose overflow buffer fills again stops there and leaves the
//! rest of its samples pending. Resolving early gives the same images as resolving at the
//! flush: the versions named by the entries are kept until a flush has resolved everything
//! below its watermark.
//!
//! `entries_created` counts entries put in a table; each leaves it exactly once (evicted or
//! drained), so it is also the number of entries drained, and
//! `samples_aggregated / entries_created` is DCPI's aggregation factor.

mod stacks;
mod table;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use profile_format::{ImageId, ImageKind, UnknownReason};

use crate::resolve::{AsidSpan, Prepared, RecordIo, Resolution, Resolver, KERNEL_START};
use crate::types::{EventIdx, PerfTime, Sample, SampleSink, SideBand, TimedSideBand};

use hashbrown::hash_map;
use table::{Added, Entry, Table};

use crate::who::{CgroupNames, CpuWho, HotView, Recent, WhoBatch};

use crate::perf::callchain::StackTables;
use crate::resolve::ResolverStats;
use crate::sys;
pub use crate::types::ImageInfo;
use crate::watch::Watch;
use crate::who::idle_image;
use crate::who::ThreadNames;

/// Samples of one (image, event), resolved: offset → (count, sum of periods in force).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ResolvedProfile {
    pub image: Arc<ImageInfo>,
    pub event: EventIdx,
    pub counts: OffsetCounts,
}

/// (count, period sum) per offset of one resolved profile. A hash map: a flush inserts one
/// offset per table entry, and a B-tree's search and node splits there were a seventh of the
/// flush thread; the store sorts the offsets once when it takes the batch.
pub type OffsetCounts = hashbrown::HashMap<u64, (u64, u64)>;

/// Output of one flush of the per-CPU tables.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Resolved {
    /// Keyed by (image id, event index).
    pub profiles: hashbrown::HashMap<(ImageId, EventIdx), ResolvedProfile>,
    /// Keyed by (event index, reason): (count, period sum).
    pub unknown: HashMap<(EventIdx, UnknownReason), (u64, u64)>,
    /// Total samples in this batch (resolved + unknown).
    pub samples: u64,
    /// Who used the CPU: per process, command, cgroup and CPU ([`crate::who`]).
    pub who: WhoBatch,
    /// Sampled call stacks per event index (`callchains = "fp"`; empty otherwise). Host,
    /// epoch and event names are left empty: the store fills them in.
    pub stacks: BTreeMap<EventIdx, profile_format::StackProfile>,
    /// The profiles again per process, keyed by (image id, event index, pid), kernel samples
    /// under the process the kernel ran for; `None` unless per-process or per-cgroup profiles
    /// are on ([`Aggregator::set_who_profiles`]). The store makes the `by_pid` and `by_cgroup`
    /// profiles from them.
    pub pid_profiles: Option<PidProfiles>,
}

/// [`Resolved::pid_profiles`].
pub type PidProfiles = hashbrown::HashMap<(ImageId, EventIdx, u32), ResolvedProfile>;

/// Counters for `dcpictl status`.
#[derive(Clone, PartialEq, Debug, Default, serde::Serialize)]
pub struct AggregatorStats {
    /// Samples received from drain threads.
    pub samples_in: u64,
    /// Samples added into the per-CPU tables.
    pub samples_aggregated: u64,
    /// Table entries created; each is drained exactly once (evicted to the overflow buffer or
    /// taken by a flush), so `samples_aggregated` / `entries_created` is the aggregation factor
    /// (samples per entry drained).
    pub entries_created: u64,
    /// Samples waiting for the watermark.
    pub pending: u64,
    /// Side-band records that arrived after the watermark had passed their time.
    pub late_sideband: u64,
    /// Current watermark (perf clock ns).
    pub watermark: u64,
    /// Entries evicted from a full bucket to the overflow buffer.
    pub overflow_evictions: u64,
    /// Overflow buffers that filled and were resolved before the flush.
    pub early_drains: u64,
    /// Memory held by the per-CPU tables and overflow buffers (bounded by the configuration).
    pub table_bytes: u64,
    /// Samples whose address-space version was not in the drain thread's cache (each costs a
    /// resolver lookup under its read lock).
    pub asid_cache_misses: u64,
    /// Samples whose stack was not counted because the CPU's stack counts were full.
    pub stack_keys_dropped: u64,
}

/// Sizes of the per-CPU aggregation state.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AggregatorConfig {
    /// Largest number of entries of each CPU's table (32 bytes each; rounded up to a power of
    /// two, at least 4). There are two tables per CPU (the flusher swaps in a clean one).
    /// Tables start at [`INITIAL_TABLE_ENTRIES`] and are resized at each flush to what the
    /// last interval needed, up to this.
    pub table_entries_per_cpu: usize,
    /// Entries of each CPU's overflow buffer (32 bytes each, at least 1); two per CPU. When it
    /// fills, the resolver thread resolves it early.
    pub overflow_entries_per_cpu: usize,
}

impl Default for AggregatorConfig {
    fn default() -> Self {
        // 1 MiB table + 2 × 128 KiB overflow, ×2 for the flusher's swap: ~2.5 MiB per CPU.
        Self { table_entries_per_cpu: 32 * 1024, overflow_entries_per_cpu: 4096 }
    }
}

/// Starting size of each CPU's table: a 2 s flush interval at the default ~1 kHz creates at
/// most 2 000 entries per CPU. Only busier CPUs pay for bigger tables, which matters on hosts
/// with many mostly idle CPUs (128 CPUs × 2 × 1 MiB would be 256 MiB).
pub const INITIAL_TABLE_ENTRIES: usize = 4096;

/// Flushes in a row with a mostly empty table before it is halved (a minute at the default
/// 5 s flush interval).
const SHRINK_AFTER: u32 = 12;

/// A CPU that has not reported for this long is left out of the watermark. A live drain thread
/// reports at least every `read_every` plus two redraw windows (1.5 + 2 × 1.4 s at most).
pub const STALE_AFTER: Duration = Duration::from_secs(6);

const CACHE_SLOTS: usize = 1024;

/// Direct-mapped `pid → asid` cache of one CPU; see the module docs.
#[derive(Clone, Copy, Default)]
struct CacheSlot {
    pid: u32,
    /// `until` is only the applied horizon at the lookup, not the next version: it can be
    /// extended while no record for this slot's pids has been applied since.
    open: bool,
    asid: u64,
    from: PerfTime,
    /// Exclusive; 0 marks an empty slot.
    until: PerfTime,
}

/// Shared state an asid cache miss may consult (atomics, no lock).
struct Horizon<'a> {
    applied_until: &'a AtomicU64,
    /// Per cache slot: the newest time of an applied record about a pid of that slot.
    changed: &'a [AtomicU64],
}

struct AsidCache {
    slots: Box<[CacheSlot]>,
    epoch: u64,
}

impl AsidCache {
    fn new() -> Self {
        Self { slots: vec![CacheSlot::default(); CACHE_SLOTS].into_boxed_slice(), epoch: 0 }
    }

    #[inline]
    fn slot(pid: u32) -> usize {
        (pid.wrapping_mul(0x9e37_79b9) >> (32 - CACHE_SLOTS.trailing_zeros())) as usize
    }

    #[inline]
    fn get(&mut self, pid: u32, time: PerfTime, h: &Horizon<'_>) -> Option<u64> {
        let i = Self::slot(pid);
        let s = &mut self.slots[i];
        if s.pid != pid || time < s.from {
            return None;
        }
        if time < s.until {
            return Some(s.asid);
        }
        if !s.open {
            return None;
        }
        // Records are applied in time order: if none about this slot has been applied since
        // the horizon the entry was valid to, it is valid to the current horizon. (Loading
        // `applied_until` first: the `changed` stores of those records happened before.)
        let applied = h.applied_until.load(Ordering::Acquire);
        if time > applied || h.changed[i].load(Ordering::Acquire) >= s.until {
            return None;
        }
        s.until = applied.saturating_add(1);
        Some(s.asid)
    }

    fn put(&mut self, pid: u32, span: AsidSpan, applied_until: PerfTime) {
        let cap = applied_until.saturating_add(1);
        self.slots[Self::slot(pid)] = CacheSlot {
            pid,
            open: span.until > cap,
            asid: span.asid.unwrap_or(0),
            from: span.from,
            until: span.until.min(cap),
        };
    }

    fn check_epoch(&mut self, epoch: u64) {
        if self.epoch != epoch {
            self.slots.fill(CacheSlot::default());
            self.epoch = epoch;
        }
    }
}

struct CpuState {
    /// Samples waiting for the watermark, in ring order.
    pending: VecDeque<Sample>,
    table: Table,
    /// The clean table the flusher swaps in (None while it resolves the other one).
    spare: Option<Table>,
    overflow: Vec<Entry>,
    /// Empty, with capacity, unless an early drain or a flush holds it.
    spare_overflow: Vec<Entry>,
    /// A full overflow buffer handed to the resolver thread (or, if a flush comes first, taken
    /// by the flush); its spare is out until the resolver thread hands it back.
    stashed: Option<Vec<Entry>>,
    overflow_cap: usize,
    cache: AsidCache,
    /// Per-sample attribution of this CPU's samples (command, cgroup, CPU).
    who: CpuWho,
    /// Samples per (pid, asid, stack, event) (`callchains = "fp"`).
    stacks: stacks::CpuStacks,
    /// Key kernel samples by their process too (per-process/per-cgroup profiles), instead of
    /// one shared key for every process but the idle task.
    keep_pids: bool,
    /// The time-weighted event (`Aggregator::set_time_event`), if any.
    time_event: Option<EventIdx>,
    samples_aggregated: u64,
    entries_created: u64,
    overflow_evictions: u64,
    early_drains: u64,
    asid_cache_misses: u64,
    /// Bounds of the table size, and the counters at the last resize decision.
    min_entries: usize,
    max_entries: usize,
    entries_at_take: u64,
    evictions_at_take: u64,
    /// Consecutive flushes whose interval would have fitted a table half this size.
    small_takes: u32,
}

impl CpuState {
    fn new(cfg: &AggregatorConfig) -> Self {
        let cap = cfg.overflow_entries_per_cpu.max(1);
        let max_entries = Table::capacity_for(cfg.table_entries_per_cpu);
        let min_entries = Table::capacity_for(INITIAL_TABLE_ENTRIES.min(max_entries));
        Self {
            pending: VecDeque::new(),
            table: Table::new(min_entries),
            spare: Some(Table::new(min_entries)),
            overflow: Vec::with_capacity(cap),
            spare_overflow: Vec::with_capacity(cap),
            stashed: None,
            overflow_cap: cap,
            cache: AsidCache::new(),
            who: CpuWho::default(),
            stacks: stacks::CpuStacks::default(),
            keep_pids: false,
            time_event: None,
            samples_aggregated: 0,
            entries_created: 0,
            overflow_evictions: 0,
            early_drains: 0,
            asid_cache_misses: 0,
            min_entries,
            max_entries,
            entries_at_take: 0,
            evictions_at_take: 0,
            small_takes: 0,
        }
    }

    /// Table size for the next interval, from what this one needed: double when the table was
    /// over half full or more than 1/32 of its new entries were evicted to the overflow buffer
    /// (each eviction costs an early drain later), halve after [`SHRINK_AFTER`] intervals in a
    /// row under 1/8 full. Shrinking at once made a machine whose load comes and goes
    /// allocate fresh tables at most flushes: each is hundreds of KiB that are page-faulted in
    /// and unmapped again (with TLB shootdowns on the drain threads' CPUs).
    fn next_table_entries(&mut self) -> usize {
        let used = self.entries_created - self.entries_at_take;
        let evicted = self.overflow_evictions - self.evictions_at_take;
        self.entries_at_take = self.entries_created;
        self.evictions_at_take = self.overflow_evictions;
        let cap = self.table.capacity();
        let want = if used * 2 > cap as u64 || evicted * 32 > used {
            self.small_takes = 0;
            cap * 2
        } else if (used * 8) < cap as u64 {
            self.small_takes = self.small_takes.saturating_add(1);
            if self.small_takes >= SHRINK_AFTER {
                self.small_takes = 0;
                cap / 2
            } else {
                cap
            }
        } else {
            self.small_takes = 0;
            cap
        };
        want.clamp(self.min_entries, self.max_entries)
    }

    /// Swap the full overflow buffer out for the spare one.
    fn take_overflow(&mut self) -> Vec<Entry> {
        let mut next = std::mem::take(&mut self.spare_overflow);
        if next.capacity() < self.overflow_cap {
            // The spare is out (another drain of it has not returned yet): only the flusher
            // gets here, and only while an early drain is in flight.
            next = Vec::with_capacity(self.overflow_cap);
        }
        std::mem::replace(&mut self.overflow, next)
    }

    fn return_overflow(&mut self, mut v: Vec<Entry>) {
        v.clear();
        if self.spare_overflow.capacity() < self.overflow_cap {
            self.spare_overflow = v;
        }
    }

    fn bytes(&self) -> usize {
        let tables = self.table.bytes() + self.spare.as_ref().map_or(0, Table::bytes);
        tables
            + (self.overflow.capacity() + self.spare_overflow.capacity())
                * std::mem::size_of::<Entry>()
    }
}

/// Why [`aggregate_pending`] stopped.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Stop {
    /// Every sample up to the limit is in the table.
    Done,
    /// The overflow buffer is full: drain it and call again.
    OverflowFull,
    /// An asid lookup needed the resolver and it was busy: the rest stays pending.
    Busy,
}

#[derive(Clone, Copy)]
struct CpuClock {
    drained_until: PerfTime,
    last_report: Instant,
}

struct Shared {
    clocks: Vec<CpuClock>,
    /// Side-band records not yet applied, per CPU, in ring (= time) order.
    queues: Vec<VecDeque<TimedSideBand>>,
    watermark: PerfTime,
    samples_in: u64,
    late_sideband: u64,
    /// Records that arrived at or below the watermark; whoever applies records next (the
    /// resolver thread or a flush) applies them first.
    late: Vec<TimedSideBand>,
}

impl Shared {
    /// Pop queued records with `time <= limit`, oldest first across CPUs, into `out`.
    fn due_until(&mut self, limit: PerfTime, out: &mut Vec<TimedSideBand>) {
        loop {
            let mut best: Option<(usize, PerfTime)> = None;
            for (i, q) in self.queues.iter().enumerate() {
                if let Some(r) = q.front() {
                    if r.time <= limit && best.is_none_or(|(_, t)| r.time < t) {
                        best = Some((i, r.time));
                    }
                }
            }
            let Some((i, _)) = best else { return };
            if let Some(rec) = self.queues[i].pop_front() {
                out.push(rec);
            }
        }
    }

    /// Copies of the records a pop up to `limit` would apply (late ones first) whose
    /// application reads a file: what [`RecordIo::prepare`] reads before the locks are taken.
    fn io_needs(&self, limit: PerfTime) -> Vec<TimedSideBand> {
        let queued = self.queues.iter().flat_map(|q| q.iter().take_while(|r| r.time <= limit));
        self.late.iter().chain(queued).filter(|r| RecordIo::needs_io(r)).cloned().collect()
    }

    /// Whether a pop up to `limit` would apply anything.
    fn anything_due(&self, limit: PerfTime) -> bool {
        !self.late.is_empty()
            || self.queues.iter().any(|q| q.front().is_some_and(|r| r.time <= limit))
    }

    fn recompute_watermark(&mut self, now: Instant) {
        let min = self
            .clocks
            .iter()
            .filter(|c| now.saturating_duration_since(c.last_report) < STALE_AFTER)
            .map(|c| c.drained_until)
            .min();
        if let Some(m) = min {
            self.watermark = self.watermark.max(m);
        }
    }
}

/// Per-CPU aggregation ordered against side-band records; see the module docs.
pub struct Aggregator {
    shared: Mutex<Shared>,
    resolver: RwLock<Resolver>,
    /// Every record with a time at or below this has been applied to the resolver, in order.
    applied_until: AtomicU64,
    /// The oldest late record not yet applied (MAX: none): drain threads aggregate no sample
    /// at or after it until the resolver thread has applied it. Written under the shared
    /// mutex.
    late_floor: AtomicU64,
    /// Bumped when the resolver changes in a way the per-CPU asid caches cannot see.
    epoch: AtomicU64,
    /// See [`Horizon::changed`].
    changed: Box<[AtomicU64]>,
    cpus: Vec<Mutex<CpuState>>,
    /// Drain threads aggregate no sample newer than this ([`Aggregator::cut`]; MAX = no cut
    /// in progress).
    cap: AtomicU64,
    /// The `[idle]` pseudo-image, made from the kernel image the first time it is needed.
    idle: OnceLock<Arc<ImageInfo>>,
    /// cgroup id → path, for the who attribution.
    cgroups: Mutex<CgroupNames>,
    /// Names of threads no record named, read from /proc.
    thread_names: Mutex<ThreadNames>,
    /// The last batches' hottest rows (`dcpictl top`).
    recent: Mutex<Recent>,
    /// The time-weighted event (`u32::MAX`: none); see [`Aggregator::set_time_event`].
    time_event: std::sync::atomic::AtomicU32,
    /// The drain threads' stack tables, when call chains are sampled.
    stack_tables: OnceLock<Arc<StackTables>>,
    /// Batches carry [`Resolved::pid_profiles`].
    who_profiles: std::sync::atomic::AtomicBool,
    /// Overflow buffers resolved by the resolver thread since the last flush. Only touched
    /// with the resolver held for writing (its mutex is never contended).
    early: Mutex<Resolved>,
    /// The file reads of applying records, done before the resolver is locked.
    record_io: RecordIo,
    /// The resolver thread ([`Aggregator::start_resolver_thread`]) and its counters.
    worker: Worker,
    /// Tests: the names of the threads that took the resolver for writing.
    #[cfg(test)]
    writers: Mutex<Vec<String>>,
}

/// What [`Aggregator::apply_due`] returns: the guards (released by the caller), the newest
/// time applied (0: none) and the number of records applied.
type AppliedDue<'a> = (MutexGuard<'a, Shared>, RwLockWriteGuard<'a, Resolver>, PerfTime, usize);

/// Name of the resolver thread.
pub const RESOLVER_THREAD: &str = "dcpi-resolve";

/// How long [`Aggregator::stop_resolver_thread`] waits for the thread.
pub const RESOLVER_STOP_WAIT: Duration = Duration::from_secs(5);

/// The resolver thread's wake-up and counters.
#[derive(Default)]
struct Worker {
    /// Work was handed over (records due, a full overflow buffer) since the thread last
    /// looked: a drain pass that finds it set does not wake the thread again.
    wanted: AtomicBool,
    /// A drain thread handed a full overflow buffer over (`CpuState::stashed`).
    buffers: AtomicBool,
    thread: OnceLock<std::thread::Thread>,
    handle: Mutex<Option<std::thread::JoinHandle<()>>>,
    stop: AtomicBool,
    /// Passes run (each follows a wake-up that found work).
    wakeups: AtomicU64,
    /// Times a drain pass woke the thread (the others found a wake-up pending).
    unparks: AtomicU64,
    /// The thread's CPU time (ns) at its last pass.
    cpu_ns: AtomicU64,
    records: AtomicU64,
    early_buffers: AtomicU64,
}

/// Counters of the resolver thread, for `dcpictl status`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize)]
pub struct ResolverThreadStats {
    /// Whether the thread runs (without it, whoever calls `on_drain` does its work).
    pub running: bool,
    /// Wake-ups that found work (one pass each).
    pub wakeups: u64,
    /// CPU time of the thread since start.
    pub cpu_ns: u64,
    /// Side-band records it applied.
    pub records_applied: u64,
    /// Full overflow buffers it resolved.
    pub early_buffers: u64,
}

impl std::fmt::Debug for Aggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregator").field("cpus", &self.cpus.len()).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another drain thread must not stop profiling: the tables stay consistent
    // (every update is a single store of an entry).
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write(r: &RwLock<Resolver>) -> RwLockWriteGuard<'_, Resolver> {
    r.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn try_read(r: &RwLock<Resolver>) -> Option<RwLockReadGuard<'_, Resolver>> {
    match r.try_read() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(e)) => Some(e.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Samples handled per step of [`aggregate_pending`]: their buckets are loaded together so
/// that the cache misses overlap.
const CHUNK: usize = 16;

/// Move the samples of `c` with `time <= limit` (all if `None`) into its table, stopping at
/// the first one beyond. `span` looks up an asid the cache does not have (None: resolver busy).
fn aggregate_pending<F>(
    c: &mut CpuState,
    limit: Option<PerfTime>,
    h: &Horizon<'_>,
    mut span: F,
) -> Stop
where
    F: FnMut(u32, PerfTime) -> Option<(AsidSpan, PerfTime)>,
{
    let limit = limit.unwrap_or(PerfTime::MAX);
    let CpuState {
        pending,
        table,
        overflow,
        overflow_cap,
        cache,
        who,
        stacks,
        keep_pids,
        time_event,
        ..
    } = c;
    let (keep_pids, time_event) = (*keep_pids, *time_event);
    let (mut done, mut created, mut evicted, mut misses) = (0usize, 0u64, 0u64, 0u64);
    let mut stop = Stop::Done;
    // (bucket, pc, tag, pid, period) of the chunk's samples, and (pid, cgroup, time) for `who`.
    let mut keys = [(0usize, 0u64, 0u64, 0u32, 0u64); CHUNK];
    let mut owners = [(0u32, 0u32, 0u64, 0u64); CHUNK];
    // (stack, process asid) of the chain's samples (stack 0: none).
    let mut chains = [(0u32, 0u64); CHUNK];
    let (front, back) = pending.as_slices();
    'outer: for part in [front, back] {
        for chunk in part.chunks(CHUNK) {
            let mut n = 0;
            let mut touched = 0u32;
            for s in chunk {
                if s.time > limit {
                    break;
                }
                let kernel = s.kernel || s.pc >= KERNEL_START;
                // A kernel sample's stack may go on in user space: its process's version.
                let proc_asid = if !kernel || (s.stack != 0 && s.pid != 0) {
                    match cache.get(s.pid, s.time, h) {
                        Some(a) => a,
                        None => match span(s.pid, s.time) {
                            Some((sp, applied)) => {
                                misses += 1;
                                cache.put(s.pid, sp, applied);
                                sp.asid.unwrap_or(0)
                            }
                            None => {
                                stop = Stop::Busy;
                                break;
                            }
                        },
                    }
                } else {
                    0
                };
                let (pid, asid) = if kernel {
                    // The kernel image is the same in every process, but the idle task
                    // (pid 0, the swapper) is kept apart: its samples become `[idle]`.
                    // Per-process profiles need every process's kernel samples apart.
                    (if keep_pids { s.pid } else { u32::from(s.pid != 0) }, 0)
                } else {
                    (s.pid, proc_asid)
                };
                let tag = Entry::tag(asid, s.event, kernel);
                let b = table.bucket_of(s.pc, tag, pid);
                touched = touched.wrapping_add(table.touch(b));
                keys[n] = (b, s.pc, tag, pid, s.period);
                owners[n] = (s.pid, s.tid, s.cgroup, s.time);
                chains[n] = (s.stack, proc_asid);
                n += 1;
            }
            std::hint::black_box(touched);
            for (i, &(b, pc, tag, pid, period)) in keys[..n].iter().enumerate() {
                // Counted as it enters the table: a sample left pending is not counted twice.
                let (owner, tid, cgroup, time) = owners[i];
                let (event, kernel) = Entry::tag_event_kernel(tag);
                who.count(owner, tid, cgroup, event, kernel, time);
                if chains[i].0 != 0 {
                    // A time-weighted event's stacks count its nanoseconds, as its profiles do.
                    let weight = if time_event == Some(event) { period } else { 1 };
                    stacks.add(owner, chains[i].1, chains[i].0, event, weight);
                }
                match table.add_at(b, pc, tag, pid, period) {
                    Added::Hit => {}
                    Added::New => created += 1,
                    Added::Evicted(e) => {
                        created += 1;
                        evicted += 1;
                        overflow.push(e);
                        if overflow.len() >= *overflow_cap {
                            done += i + 1;
                            stop = Stop::OverflowFull;
                            break 'outer;
                        }
                    }
                }
            }
            done += n;
            if n < chunk.len() {
                break 'outer;
            }
        }
    }
    pending.drain(..done);
    c.samples_aggregated += done as u64;
    c.entries_created += created;
    c.overflow_evictions += evicted;
    c.asid_cache_misses += misses;
    stop
}

impl Aggregator {
    /// `ncpus` = highest CPU id + 1. Samples of a CPU id beyond share a table with `id % ncpus`.
    pub fn new(resolver: Resolver, ncpus: usize) -> Arc<Self> {
        Self::with_config(resolver, ncpus, AggregatorConfig::default())
    }

    pub fn with_config(resolver: Resolver, ncpus: usize, cfg: AggregatorConfig) -> Arc<Self> {
        let n = ncpus.max(1);
        let now = Instant::now();
        let record_io = resolver.record_io();
        Arc::new(Self {
            shared: Mutex::new(Shared {
                clocks: vec![CpuClock { drained_until: 0, last_report: now }; n],
                queues: (0..n).map(|_| VecDeque::new()).collect(),
                watermark: 0,
                samples_in: 0,
                late_sideband: 0,
                late: Vec::new(),
            }),
            resolver: RwLock::new(resolver),
            applied_until: AtomicU64::new(0),
            late_floor: AtomicU64::new(PerfTime::MAX),
            epoch: AtomicU64::new(0),
            changed: (0..CACHE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            cpus: (0..n).map(|_| Mutex::new(CpuState::new(&cfg))).collect(),
            cap: AtomicU64::new(PerfTime::MAX),
            idle: OnceLock::new(),
            cgroups: Mutex::new(CgroupNames::discover()),
            thread_names: Mutex::new(ThreadNames::default()),
            recent: Mutex::new(Recent::default()),
            stack_tables: OnceLock::new(),
            time_event: std::sync::atomic::AtomicU32::new(u32::MAX),
            who_profiles: std::sync::atomic::AtomicBool::new(false),
            early: Mutex::new(Resolved::default()),
            record_io,
            worker: Worker::default(),
            #[cfg(test)]
            writers: Mutex::new(Vec::new()),
        })
    }

    /// Per-process (and so per-cgroup) profiles on or off: from the next drain pass, kernel
    /// samples are keyed by their process too, and batches carry [`Resolved::pid_profiles`].
    /// Off (the default), the drain path is as it was: one key for every process's kernel
    /// samples.
    pub fn set_who_profiles(&self, on: bool) {
        if self.who_profiles.swap(on, Ordering::AcqRel) == on {
            return;
        }
        for cpu in &self.cpus {
            lock(cpu).keep_pids = on;
        }
        if on {
            lock(&self.early).pid_profiles.get_or_insert_with(Default::default);
        }
    }

    /// Make `event` time-weighted (the off-CPU event, `crate::offcpu`): each of its samples
    /// carries a duration in nanoseconds as its period, and its profiles and stacks count
    /// those nanoseconds instead of samples, with a period of 1 (FORMAT.md §5.2), so that
    /// every reader that weights counts gets nanoseconds.
    pub fn set_time_event(&self, event: EventIdx) {
        self.time_event.store(u32::from(event), Ordering::Release);
        for cpu in &self.cpus {
            lock(cpu).time_event = Some(event);
        }
    }

    fn time_event(&self) -> Option<EventIdx> {
        EventIdx::try_from(self.time_event.load(Ordering::Acquire)).ok()
    }

    /// A batch to resolve into: with per-process profiles when they are on.
    fn fresh_batch(&self) -> Resolved {
        Resolved {
            pid_profiles: self.who_profiles.load(Ordering::Acquire).then(Default::default),
            ..Resolved::default()
        }
    }

    /// Call chains are sampled into `tables` (one per CPU slot of this aggregator, same
    /// count): samples' stack ids are counted and resolved at each flush.
    pub fn set_stack_tables(&self, tables: Arc<StackTables>) {
        drop(self.stack_tables.set(tables));
    }

    /// The stack tables, when stacks are sampled.
    pub fn stack_tables(&self) -> Option<&Arc<StackTables>> {
        self.stack_tables.get()
    }

    /// The call-stack counters, when stacks are sampled.
    pub fn stack_report(&self) -> Option<dcpi_proto::StackReport> {
        self.stack_tables.get().map(|t| t.report())
    }

    fn slot(&self, cpu: u32) -> usize {
        cpu as usize % self.cpus.len()
    }

    fn horizon(&self) -> Horizon<'_> {
        Horizon { applied_until: &self.applied_until, changed: &self.changed }
    }

    /// Apply records to the resolver (in the order given), noting the pids they concern for
    /// the asid caches.
    fn apply(&self, r: &mut Resolver, recs: &[TimedSideBand], prepared: &Prepared) {
        for rec in recs {
            if let SideBand::Cgroup { id, path } = &rec.record {
                lock(&self.cgroups).note(*id, path);
                continue;
            }
            r.apply_prepared(rec, prepared);
            let pid = match &rec.record {
                SideBand::Cgroup { .. } => continue,
                SideBand::Mmap2 { pid, .. }
                | SideBand::Comm { pid, .. }
                | SideBand::Fork { pid, .. }
                | SideBand::Exit { pid, .. } => *pid,
            };
            self.changed[AsidCache::slot(pid)].fetch_max(rec.time, Ordering::Release);
        }
    }

    /// The resolver for writing (tests note who took it).
    fn write_resolver(&self) -> RwLockWriteGuard<'_, Resolver> {
        #[cfg(test)]
        lock(&self.writers).push(std::thread::current().name().unwrap_or("?").to_string());
        write(&self.resolver)
    }

    /// Pop every record due up to `limit` (late ones first) and apply them, under the resolver
    /// and the shared mutex (taken here, in that order: module docs, LOCKS), after reading the
    /// files they need with neither held. Returns the guards, the newest time applied (0:
    /// none) and the number of records applied.
    fn apply_due(&self, limit: PerfTime) -> AppliedDue<'_> {
        let prepared = self.prepare_due(limit);
        self.apply_due_locked(self.write_resolver(), limit, &prepared)
    }

    /// [`Aggregator::apply_due`], or `None` if the resolver is busy.
    fn try_apply_due(&self, limit: PerfTime) -> Option<AppliedDue<'_>> {
        let prepared = self.prepare_due(limit);
        Some(self.apply_due_locked(self.try_write_resolver()?, limit, &prepared))
    }

    /// The file reads of the records due up to `limit`, done with no lock held.
    fn prepare_due(&self, limit: PerfTime) -> Prepared {
        let needs = lock(&self.shared).io_needs(limit);
        // A record popped by someone else meanwhile was applied with its own reads; one that
        // arrived meanwhile is read under the locks (late records only: anything newer than
        // `limit` stays queued).
        self.record_io.prepare(&needs)
    }

    fn apply_due_locked<'a>(
        &'a self,
        mut r: RwLockWriteGuard<'a, Resolver>,
        limit: PerfTime,
        prepared: &Prepared,
    ) -> AppliedDue<'a> {
        let mut sh = lock(&self.shared);
        let mut due = Vec::new();
        sh.due_until(limit, &mut due);
        let late = std::mem::take(&mut sh.late);
        let newest = due.last().map_or(0, |d| d.time);
        self.apply(&mut r, &late, prepared);
        self.apply(&mut r, &due, prepared);
        self.late_floor.store(PerfTime::MAX, Ordering::Release);
        if !late.is_empty() {
            // Late records change answers below `applied_until`: the caches must not keep them.
            self.epoch.fetch_add(1, Ordering::Release);
        }
        (sh, r, newest, late.len() + due.len())
    }

    fn try_write_resolver(&self) -> Option<RwLockWriteGuard<'_, Resolver>> {
        let g = match self.resolver.try_write() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        #[cfg(test)]
        lock(&self.writers).push(std::thread::current().name().unwrap_or("?").to_string());
        Some(g)
    }

    /// Take the resolver for a flush: everything queued up to `limit` (and every late
    /// record) is applied under the shared mutex, which is then released, so that drain
    /// threads are never blocked while the flush resolves (they find the resolver busy, leave
    /// their samples pending and go back to sleep). Returns the early results too.
    fn begin_take(&self, limit: PerfTime) -> (RwLockWriteGuard<'_, Resolver>, Resolved, PerfTime) {
        let (sh, r, newest, _) = self.apply_due(limit);
        drop(sh);
        let mut out = std::mem::replace(&mut *lock(&self.early), self.fresh_batch());
        if self.who_profiles.load(Ordering::Acquire) {
            out.pid_profiles.get_or_insert_with(Default::default);
        }
        (r, out, newest)
    }

    /// Start the resolver thread ([`RESOLVER_THREAD`], under `watch` if given): from then on,
    /// drain threads hand records due and full overflow buffers to it instead of doing the
    /// work themselves. It ends when [`Aggregator::stop_resolver_thread`] is called or the
    /// aggregator is dropped.
    pub fn start_resolver_thread(
        self: &Arc<Self>,
        watch: Option<&Arc<Watch>>,
    ) -> std::io::Result<()> {
        let weak = Arc::downgrade(self);
        let w = watch.cloned();
        let body = move || loop {
            // Holding only a weak reference between passes: dropping the aggregator ends it.
            let Some(agg) = weak.upgrade() else { return };
            if agg.worker.stop.load(Ordering::Acquire) {
                return;
            }
            if let Some(w) = &w {
                w.fault_point(RESOLVER_THREAD);
            }
            if agg.worker.wanted.swap(false, Ordering::AcqRel) {
                agg.worker.wakeups.fetch_add(1, Ordering::Relaxed);
                agg.resolve_pass(true);
                agg.worker.cpu_ns.store(sys::time::thread_cpu_ns(), Ordering::Relaxed);
                continue;
            }
            drop(agg);
            // An unpark between the check above and here makes this return at once.
            std::thread::park();
        };
        let handle = match watch {
            Some(w) => w.spawn(RESOLVER_THREAD.into(), true, body)?,
            None => std::thread::Builder::new().name(RESOLVER_THREAD.into()).spawn(body)?,
        };
        drop(self.worker.thread.set(handle.thread().clone()));
        *lock(&self.worker.handle) = Some(handle);
        Ok(())
    }

    /// Stop the resolver thread and wait for it, at most [`RESOLVER_STOP_WAIT`]: one stuck in
    /// a file read (a hung NFS mount) is left behind, and the last flush applies what is
    /// still queued (flushes do that anyway).
    pub fn stop_resolver_thread(&self) {
        self.worker.stop.store(true, Ordering::Release);
        if let Some(t) = self.worker.thread.get() {
            t.unpark();
        }
        let Some(h) = lock(&self.worker.handle).take() else { return };
        if h.thread().id() == std::thread::current().id() {
            return;
        }
        let deadline = Instant::now() + RESOLVER_STOP_WAIT;
        while !h.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if h.is_finished() {
            // A panic was recorded by the watch (or, unwatched, is the caller's to see).
            drop(h.join());
        } else {
            tracing::error!(
                thread = RESOLVER_THREAD,
                "stuck (a file read that does not return?); stopping without it"
            );
        }
    }

    pub fn resolver_thread_stats(&self) -> ResolverThreadStats {
        let w = &self.worker;
        ResolverThreadStats {
            running: w.thread.get().is_some() && !w.stop.load(Ordering::Acquire),
            wakeups: w.wakeups.load(Ordering::Relaxed),
            cpu_ns: w.cpu_ns.load(Ordering::Relaxed),
            records_applied: w.records.load(Ordering::Relaxed),
            early_buffers: w.early_buffers.load(Ordering::Relaxed),
        }
    }

    /// Hand work to the resolver thread: wake it unless a wake-up is already pending.
    /// Returns false when there is no resolver thread.
    fn wake_resolver(&self) -> bool {
        let Some(t) = self.worker.thread.get() else { return false };
        if !self.worker.wanted.swap(true, Ordering::AcqRel) {
            self.worker.unparks.fetch_add(1, Ordering::Relaxed);
            t.unpark();
        }
        true
    }

    /// The resolver thread's work (module docs, LOCKS): apply the records due up to the
    /// watermark (reading their files first, with no lock held), move `applied_until`, then
    /// resolve the full overflow buffers drain threads handed over. Without a resolver thread
    /// (unit tests, benches), `on_drain`'s caller runs it with `wait` false: it then never
    /// waits for the resolver (work it finds busy is left for the next pass or the flush).
    fn resolve_pass(&self, wait: bool) {
        let wm = {
            let sh = lock(&self.shared);
            sh.anything_due(sh.watermark).then_some(sh.watermark)
        };
        let applied = wm.and_then(|wm| {
            let a = if wait { Some(self.apply_due(wm)) } else { self.try_apply_due(wm) };
            Some((wm, a?))
        });
        if let Some((wm, (sh, r, _, n))) = applied {
            // Every record at or below `wm` is applied: any that arrived since the peek above
            // with a time at or below it was late (the watermark had passed it) and applied.
            self.applied_until.fetch_max(wm, Ordering::Release);
            drop(r);
            drop(sh);
            self.worker.records.fetch_add(n as u64, Ordering::Relaxed);
        }
        if self.worker.buffers.swap(false, Ordering::AcqRel) {
            // Taken from the CPUs only with the resolver held, so that a flush (which holds
            // it too) either finds a buffer still stashed or its entries in `early`: a cut
            // never misses one nor gets one of a later batch.
            let r = if wait { Some(self.write_resolver()) } else { self.try_write_resolver() };
            let Some(mut r) = r else {
                self.worker.buffers.store(true, Ordering::Release);
                return;
            };
            r.begin_batch();
            let mut early = lock(&self.early);
            let te = self.time_event();
            for cpu in &self.cpus {
                let Some(full) = lock(cpu).stashed.take() else { continue };
                full.iter().for_each(|e| resolve_entry(&mut r, &self.idle, te, e, &mut early));
                lock(cpu).return_overflow(full);
                self.worker.early_buffers.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Swap out every per-CPU table (after aggregating what the watermark allows) and resolve.
    ///
    /// `stacks` false: the call stacks counted so far stay counted, but for those of processes
    /// the resolver may forget at this take ([`Resolver::unsettled_pids`]): each take resolves every
    /// stack it takes, however often it was taken before, and stacks are published far less
    /// often than flat profiles (`stack_flush_interval`).
    pub fn take_resolved(&self, stacks: bool) -> Resolved {
        let wm = lock(&self.shared).watermark;
        let (mut r, mut out, _) = self.begin_take(wm);
        self.applied_until.fetch_max(wm, Ordering::Release);
        self.take_tables(&mut r, Some(wm), stacks, &mut out);
        r.gc(wm);
        drop(r);
        self.epoch.fetch_add(1, Ordering::Release);
        out
    }

    /// Apply every queued side-band record and aggregate every pending sample regardless of
    /// the watermark (which moves to the newest time seen), then resolve.
    pub fn flush_all(&self) -> Resolved {
        let (mut r, mut out, newest_sb) = self.begin_take(PerfTime::MAX);
        let newest_sample = self.take_tables(&mut r, None, true, &mut out);
        let newest = {
            let mut sh = lock(&self.shared);
            sh.watermark = sh.watermark.max(newest_sb).max(newest_sample);
            sh.watermark
        };
        self.applied_until.fetch_max(newest, Ordering::Release);
        r.gc(newest);
        drop(r);
        self.epoch.fetch_add(1, Ordering::Release);
        out
    }

    /// Close a batch at an instant. Stops the drain threads from aggregating, reads the clock
    /// (`T`), runs `barrier(T)` (which must make every drain thread deliver its ring up to `T`),
    /// then takes exactly the samples with a time at or below `T`: side-band records up to `T`
    /// are applied whatever the watermark, later samples stay pending for the next batch.
    /// Every sample therefore goes to the batch of the instant that contains it, whichever
    /// pass delivered it. Returns the batch, what `barrier` returned and `T`.
    pub fn cut<B>(&self, barrier: impl FnOnce(PerfTime) -> B) -> (Resolved, B, PerfTime) {
        self.cut_taking(true, barrier)
    }

    /// [`Self::cut`] that takes every call stack only with `all_stacks`; otherwise, as
    /// [`Self::take_resolved`] without stacks, only those the resolver may not keep resolvable
    /// (a timed flush at a slice boundary: the flat counts are cut at the instant, the stacks
    /// keep their own interval).
    pub fn cut_taking<B>(
        &self,
        all_stacks: bool,
        barrier: impl FnOnce(PerfTime) -> B,
    ) -> (Resolved, B, PerfTime) {
        // Freeze before reading the clock: a drain pass that saw the old cap computed its
        // watermark from a clock read before this store, hence before T.
        self.cap.store(0, Ordering::SeqCst);
        let t = sys::time::monotonic_ns();
        self.cap.store(t, Ordering::SeqCst);
        let b = barrier(t);
        let out = self.take_until(t, all_stacks);
        self.cap.store(PerfTime::MAX, Ordering::SeqCst);
        (out, b, t)
    }

    /// Apply every side-band record up to `limit`, aggregate every sample up to it (the
    /// watermark moves to at least `limit`), swap out the tables and resolve.
    fn take_until(&self, limit: PerfTime, all_stacks: bool) -> Resolved {
        let (mut r, mut out, _) = self.begin_take(limit);
        {
            let mut sh = lock(&self.shared);
            sh.watermark = sh.watermark.max(limit);
        }
        self.applied_until.fetch_max(limit, Ordering::Release);
        self.take_tables(&mut r, Some(limit), all_stacks, &mut out);
        r.gc(limit);
        drop(r);
        self.epoch.fetch_add(1, Ordering::Release);
        out
    }

    /// Aggregate what `limit` allows, swap out every table and overflow buffer and resolve
    /// them into `out`, with every call stack counted (`all_stacks`) or only those the
    /// resolver may not keep resolvable. Returns the newest sample time aggregated.
    fn take_tables(
        &self,
        r: &mut Resolver,
        limit: Option<PerfTime>,
        all_stacks: bool,
        out: &mut Resolved,
    ) -> u64 {
        r.begin_batch();
        let applied = self.applied_until.load(Ordering::Acquire);
        let epoch = self.epoch.load(Ordering::Acquire);
        let mut newest = 0;
        let mut taken = Vec::with_capacity(self.cpus.len());
        let unsettled =
            (!all_stacks && self.stack_tables.get().is_some()).then(|| r.unsettled_pids());
        for cpu in &self.cpus {
            let mut c = lock(cpu);
            c.cache.check_epoch(epoch);
            newest = newest.max(newest_pending(&c.pending, limit));
            let mut full: Vec<Vec<Entry>> = c.stashed.take().into_iter().collect();
            loop {
                if c.overflow.len() >= c.overflow_cap {
                    // Left full by a drain pass that could not hand it over.
                    full.push(c.take_overflow());
                }
                let rr: &Resolver = r;
                let stop = aggregate_pending(&mut c, limit, &self.horizon(), |pid, t| {
                    Some((rr.asid_span(pid, t), applied))
                });
                if stop != Stop::OverflowFull {
                    break;
                }
                // Resolved below, once this CPU's lock is released.
                full.push(c.take_overflow());
            }
            let want = c.next_table_entries();
            let spare = match c.spare.take() {
                Some(t) if t.capacity() == want => t,
                _ => Table::new(want),
            };
            let table = std::mem::replace(&mut c.table, spare);
            let overflow = c.take_overflow();
            c.who.take_into(taken.len() as u32, &mut out.who);
            // Without `all_stacks`, only the stacks of processes the gc after this take may
            // change: the others resolve as well at a later take.
            let stack_counts = match &unsettled {
                Some(u) if u.is_empty() => stacks::CpuStacks::default(),
                Some(u) => c.stacks.take_if(|pid| u.contains(&pid)),
                None => c.stacks.take(),
            };
            taken.push((table, overflow, full, stack_counts));
        }
        let mut comms = stacks::Comms::new();
        for (i, (mut table, overflow, full, stack_counts)) in taken.into_iter().enumerate() {
            if let Some(t) = self.stack_tables.get() {
                let (idle, slot) = (&self.idle, i as u32);
                stacks::resolve_cpu(r, idle, t, slot, stack_counts, &mut comms, &mut out.stacks);
                // Under the CPU lock: no sample moves from pending into the counts meanwhile.
                // A take of some stacks leaves the others counted: nothing to free.
                if all_stacks {
                    let c = lock(&self.cpus[i]);
                    stacks::prune(t, i as u32, c.pending.iter(), &c.stacks);
                }
            }
            let te = self.time_event();
            full.iter().flatten().for_each(|e| resolve_entry(r, &self.idle, te, e, out));
            overflow.iter().for_each(|e| resolve_entry(r, &self.idle, te, e, out));
            table.drain(|e| resolve_entry(r, &self.idle, te, &e, out));
            let mut c = lock(&self.cpus[i]);
            c.return_overflow(overflow);
            // A table of the old size is dropped here; the next flush allocates one of the
            // size then wanted.
            if table.capacity() == c.table.capacity() {
                c.spare.get_or_insert(table);
            }
        }
        self.name_who(r, &mut out.who);
        lock(&self.recent).push(&mut out.who);
        newest
    }

    /// The hottest (process, image, offset) rows of the batches taken within `window` and
    /// their total samples (first event), from memory.
    /// The answer is shared: the same `Arc` as the last call's when no batch was recorded or
    /// aged out of the window since (nothing is merged again).
    pub fn top(&self, window: Duration, limit: usize) -> Arc<HotView> {
        lock(&self.recent).top(window, limit)
    }

    /// How long ago the newest batch of the live view was recorded (by a flush or a `top`
    /// request); None when none is kept.
    pub fn since_last_batch(&self) -> Option<Duration> {
        lock(&self.recent).last_recorded().map(|t| t.elapsed())
    }

    /// Commands and cgroup paths of the pids a batch counts.
    fn name_who(&self, r: &Resolver, who: &mut WhoBatch) {
        let pids: Vec<u32> = who.pids().filter(|p| !who.comms.contains_key(p)).collect();
        for pid in pids {
            if let Some(c) = r.comm(pid, 0) {
                who.comms.insert(pid, c.to_vec());
            }
        }
        who.read_missing_comms(r.proc_root());
        // Thread names: what COMM records said, else /proc (threads named before dcpid
        // started, or named as their process), read once per thread.
        let mut threads: Vec<(u32, u32)> = who.threads.keys().map(|k| (k.0, k.1)).collect();
        threads.sort_unstable();
        threads.dedup();
        let mut read = lock(&self.thread_names);
        for (pid, tid) in threads {
            let name = match r.thread_name(pid, tid) {
                Some(n) => Some(n.to_vec()),
                None => read.name(r.proc_root(), pid, tid),
            };
            if let Some(n) = name {
                who.thread_names.insert((pid, tid), n);
            }
        }
        drop(read);
        let mut names = lock(&self.cgroups);
        let ids: Vec<u64> = who.cgroups.values().copied().collect();
        for id in ids {
            if let hash_map::Entry::Vacant(v) = who.cgroup_paths.entry(id) {
                if let Some(p) = names.path(id) {
                    v.insert(p);
                }
            }
        }
    }

    pub fn stats(&self) -> AggregatorStats {
        let mut s = {
            let sh = lock(&self.shared);
            AggregatorStats {
                samples_in: sh.samples_in,
                late_sideband: sh.late_sideband,
                watermark: sh.watermark,
                ..Default::default()
            }
        };
        for cpu in &self.cpus {
            let c = lock(cpu);
            s.pending += c.pending.len() as u64;
            s.samples_aggregated += c.samples_aggregated;
            s.entries_created += c.entries_created;
            s.overflow_evictions += c.overflow_evictions;
            s.early_drains += c.early_drains;
            s.asid_cache_misses += c.asid_cache_misses;
            s.stack_keys_dropped += c.stacks.dropped;
            s.table_bytes += c.bytes() as u64;
        }
        s
    }

    /// The resolver's counters, unless a flush holds the resolver (`try_read`: a status
    /// request never waits for a flush, and the drain threads' caches stay valid).
    pub fn try_resolver_stats(&self) -> Option<ResolverStats> {
        self.resolver.try_read().ok().map(|r| r.stats())
    }

    /// Run `f` with the resolver locked for writing (drain threads leave their samples pending
    /// meanwhile, which is what the start-up `/proc` scan wants). `f` must not call back into
    /// this aggregator.
    pub fn with_resolver<R>(&self, f: impl FnOnce(&mut Resolver) -> R) -> R {
        let out = f(&mut self.write_resolver());
        self.epoch.fetch_add(1, Ordering::Release);
        out
    }

    /// Step 3 of a drain pass (module docs): aggregate what the watermark allows (never past a
    /// cut in progress, nor past what has been applied to the resolver). Never waits for the
    /// resolver: when it is busy, the samples stay pending. A full overflow buffer is handed
    /// to the resolver thread (`stashed`) and aggregation goes on in the spare; when the spare
    /// is out too, the rest stays pending until a later pass. Returns whether it handed a
    /// buffer over.
    fn aggregate_cpu(&self, slot: usize, wm: PerfTime) -> bool {
        let mut c = lock(&self.cpus[slot]);
        let mut handed = false;
        loop {
            if c.overflow.len() >= c.overflow_cap {
                // The resolver thread holds the spare until it has resolved the last one.
                if c.stashed.is_some() || c.spare_overflow.capacity() < c.overflow_cap {
                    break;
                }
                c.early_drains += 1;
                let full = c.take_overflow();
                c.stashed = Some(full);
                self.worker.buffers.store(true, Ordering::Release);
                handed = true;
            }
            let wm = wm
                .min(self.cap.load(Ordering::SeqCst))
                .min(self.applied_until.load(Ordering::Acquire))
                .min(self.late_floor.load(Ordering::Acquire).saturating_sub(1));
            let c = &mut *c;
            c.cache.check_epoch(self.epoch.load(Ordering::Acquire));
            let mut guard: Option<RwLockReadGuard<'_, Resolver>> = None;
            let stop = aggregate_pending(c, Some(wm), &self.horizon(), |pid, t| {
                if guard.is_none() {
                    guard = Some(try_read(&self.resolver)?);
                }
                let applied = self.applied_until.load(Ordering::Acquire);
                guard.as_ref().map(|r| (r.asid_span(pid, t), applied))
            });
            drop(guard);
            if stop != Stop::OverflowFull {
                break;
            }
        }
        // Counts kept across flushes (`stack_flush_interval`) must not reach the bound that
        // drops stacks: half way, ask for a take as a full stack table does.
        if c.stacks.past_high_water() {
            if let Some(t) = self.stack_tables.get() {
                t.request_flush();
            }
        }
        handed
    }
}

fn newest_pending(pending: &VecDeque<Sample>, limit: Option<PerfTime>) -> PerfTime {
    pending
        .iter()
        .take_while(|s| limit.is_none_or(|l| s.time <= l))
        .map(|s| s.time)
        .max()
        .unwrap_or(0)
}

/// A borrowed `Resolved::profiles` key: hashes and compares as the owned tuple.
#[derive(Hash)]
struct ProfileKeyRef<'a>(&'a ImageId, EventIdx);

impl hashbrown::Equivalent<(ImageId, EventIdx)> for ProfileKeyRef<'_> {
    fn equivalent(&self, k: &(ImageId, EventIdx)) -> bool {
        *self.0 == k.0 && self.1 == k.1
    }
}

fn resolve_entry(
    resolver: &mut Resolver,
    idle: &OnceLock<Arc<ImageInfo>>,
    time_event: Option<EventIdx>,
    e: &Entry,
    out: &mut Resolved,
) {
    let event = e.event();
    // A time-weighted event counts its nanoseconds (the sum of its samples' periods), with a
    // period of 1 per count; its samples (waits) are still what `samples` counts.
    let (count, period) = if time_event == Some(event) {
        (e.period_sum, e.period_sum)
    } else {
        (u64::from(e.count), e.period_sum)
    };
    out.samples += u64::from(e.count);
    match resolver.resolve(e.pid, e.asid(), e.pc, e.kernel()) {
        Resolution::Image { image, offset } => {
            let image = if e.kernel() && e.pid == 0 && image.kind == ImageKind::Kernel {
                idle.get_or_init(|| idle_image(&image))
            } else {
                &image
            };
            // Profiles of one image share an Arc: clone the id only for a new profile.
            let key = ProfileKeyRef(&image.id, event);
            if !out.profiles.contains_key(&key) {
                out.profiles.insert(
                    (image.id.clone(), event),
                    ResolvedProfile {
                        image: Arc::clone(image),
                        event,
                        counts: OffsetCounts::default(),
                    },
                );
            }
            let Some(p) = out.profiles.get_mut(&key) else { return };
            if p.image.kind == ImageKind::Anon
                && p.image.jit_symbols.len() < image.jit_symbols.len()
            {
                p.image = Arc::clone(image);
            }
            let c = p.counts.entry(offset).or_insert((0, 0));
            c.0 += count;
            c.1 = c.1.saturating_add(period);
            if let Some(pp) = out.pid_profiles.as_mut() {
                let p =
                    pp.entry((image.id.clone(), event, e.pid)).or_insert_with(|| ResolvedProfile {
                        image: Arc::clone(image),
                        event,
                        counts: OffsetCounts::default(),
                    });
                if p.image.jit_symbols.len() < image.jit_symbols.len() {
                    p.image = Arc::clone(image);
                }
                let c = p.counts.entry(offset).or_insert((0, 0));
                c.0 += count;
                c.1 = c.1.saturating_add(period);
            }
            if e.kernel() {
                // Not the idle task's (pid 0 even with `keep_pids` off, see `drain`).
                if e.pid != 0 {
                    out.who.hot_kernel.push((Arc::clone(image), offset, event, count));
                }
            } else {
                // Kernel entries are shared by every process; `CpuWho` counts their owners.
                out.who.add_user(e.pid, Some(image), event, count);
                out.who.hot.push((e.pid, Arc::clone(image), offset, event, count));
                if let hash_map::Entry::Vacant(v) = out.who.comms.entry(e.pid) {
                    if let Some(c) = resolver.comm(e.pid, e.asid()) {
                        v.insert(c.to_vec());
                    }
                }
            }
        }
        Resolution::Unknown(reason) => {
            if !e.kernel() {
                out.who.add_user(e.pid, None, event, count);
            }
            resolver.note_unknown(reason, count);
            let u = out.unknown.entry((event, reason)).or_insert((0, 0));
            u.0 += count;
            u.1 = u.1.saturating_add(period);
        }
    }
}

impl SampleSink for Aggregator {
    fn on_drain(
        &self,
        cpu: u32,
        drained_until: PerfTime,
        samples: &mut Vec<Sample>,
        sideband: &mut Vec<TimedSideBand>,
    ) {
        let slot = self.slot(cpu);
        let n = samples.len() as u64;
        if n > 0 {
            // Before the clock moves (module docs, LOCKS).
            // A slice of Copy values: one memcpy (or two at the deque's wrap).
            lock(&self.cpus[slot]).pending.extend(samples.iter());
            samples.clear();
        }
        let now = Instant::now();
        let (wm, due) = {
            let mut sh = lock(&self.shared);
            let clock = cpu as usize;
            if clock >= sh.clocks.len() {
                // A CPU id beyond the count given at start (hotplug): track its clock too.
                sh.clocks.resize(clock + 1, CpuClock { drained_until: 0, last_report: now });
                sh.queues.resize_with(clock + 1, VecDeque::new);
            }
            sh.samples_in += n;
            let mut late = 0;
            for rec in sideband.drain(..) {
                if rec.time <= sh.watermark {
                    // From a CPU that was left out of the watermark (or a sampler bug).
                    self.late_floor.fetch_min(rec.time, Ordering::AcqRel);
                    sh.late.push(rec);
                    late += 1;
                } else {
                    sh.queues[clock].push_back(rec);
                }
            }
            sh.late_sideband += late;
            let c = &mut sh.clocks[clock];
            c.drained_until = c.drained_until.max(drained_until);
            c.last_report = now;
            sh.recompute_watermark(now);
            let wm = sh.watermark;
            let due = sh.anything_due(wm);
            if !due {
                // Every record up to the watermark was applied by whoever popped it (always
                // under this mutex, with the resolver held).
                self.applied_until.fetch_max(wm, Ordering::Release);
            }
            (wm, due)
        };
        let handed = self.aggregate_cpu(slot, wm);
        if !(due || handed) || self.wake_resolver() {
            return;
        }
        // No resolver thread: this caller does its work, then aggregates what it allows.
        loop {
            self.resolve_pass(false);
            if !self.aggregate_cpu(slot, wm) {
                break;
            }
        }
    }
}

impl Drop for Aggregator {
    fn drop(&mut self) {
        // The resolver thread holds no reference between passes; let it see the end.
        self.worker.stop.store(true, Ordering::Release);
        if let Some(t) = self.worker.thread.get() {
            t.unpark();
        }
    }
}

#[cfg(test)]
mod tests;
