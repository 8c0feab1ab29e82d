//! Per-CPU aggregation of samples, ordered against side-band records by time.
//!
//! CONTRACT (used by `store` and `service`; owned by the resolver work):
//! - `Aggregator::new(resolver, ncpus) -> Arc<Aggregator>`; it implements `SampleSink`.
//! - `take_resolved(&self) -> Resolved`: swaps out every per-CPU table and resolves each entry.
//! - `flush_all(&self) -> Resolved`: like `take_resolved`, but first applies every queued
//!   side-band record and aggregates every pending sample regardless of the watermark (used at
//!   shutdown and when an epoch is closed).
//! - `stats(&self) -> AggregatorStats`.
//! - `with_resolver(&self, f)` gives access to the resolver (status, kallsyms snapshot).
//!
//! ORDERING (daemon/ARCHITECTURE.md "Ordering across CPUs"): each drain thread reports
//! `drained_until`; the watermark is the minimum over CPUs that reported within
//! [`STALE_AFTER`] (never moving back). Side-band records are queued per CPU and applied to the
//! resolver in time order (a merge of the per-CPU queues) once the watermark reaches them; a
//! record arriving at or below the watermark (from a CPU that was left out) is applied at once
//! and counted in `late_sideband`. Samples wait per CPU until the watermark reaches them, then
//! go into that CPU's table under `(pid, asid, pc, event, kernel)`, where `asid` is the
//! address-space version in force at the sample's time (`Resolver::asid_at`); kernel samples
//! use pid 0 / asid 0. A CPU's eligible samples are aggregated at its next drain or at the next
//! `take_resolved`, whichever comes first; either way the resolver still holds every version
//! they can name, because `Resolver::gc` runs only after `take_resolved` has aggregated and
//! resolved everything up to the watermark it collects below. Per sample: one hash lookup of
//! the pid, a binary search of its versions and one table upsert; no allocation.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use profile_format::{ImageId, ImageKind, JitSymbol, UnknownReason};

use crate::resolve::{Resolution, Resolver, KERNEL_START};
use crate::types::{EventIdx, PerfTime, Sample, SampleSink, TimedSideBand};

/// What a profile on disk needs to know about its image.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ImageInfo {
    pub kind: ImageKind,
    pub id: ImageId,
    /// Path as seen (`/usr/bin/foo`, `[kernel.kallsyms]`, `[vdso]`, `[anon:1234]`, module name).
    pub path: Vec<u8>,
    /// For `Anon` images: symbols from /tmp/perf-PID.map, if the process published one.
    pub jit_symbols: Vec<JitSymbol>,
}

/// Samples of one (image, event), resolved: offset → (count, sum of periods in force).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ResolvedProfile {
    pub image: Arc<ImageInfo>,
    pub event: EventIdx,
    pub counts: BTreeMap<u64, (u64, u64)>,
}

/// Output of one flush of the per-CPU tables.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Resolved {
    /// Keyed by (image id, event index).
    pub profiles: HashMap<(ImageId, EventIdx), ResolvedProfile>,
    /// Keyed by (event index, reason): (count, period sum).
    pub unknown: HashMap<(EventIdx, UnknownReason), (u64, u64)>,
    /// Total samples in this batch (resolved + unknown).
    pub samples: u64,
}

/// Counters for `dcpictl status`.
#[derive(Clone, PartialEq, Debug, Default, serde::Serialize)]
pub struct AggregatorStats {
    /// Samples received from drain threads.
    pub samples_in: u64,
    /// Samples added into the per-CPU tables.
    pub samples_aggregated: u64,
    /// Table entries created (each distinct key per flush); samples_aggregated / entries_created
    /// is the aggregation factor.
    pub entries_created: u64,
    /// Samples waiting for the watermark.
    pub pending: u64,
    /// Side-band records that arrived after the watermark had passed their time.
    pub late_sideband: u64,
    /// Current watermark (perf clock ns).
    pub watermark: u64,
}

/// A CPU that has not reported for this long is left out of the watermark.
pub const STALE_AFTER: Duration = Duration::from_secs(3);

/// FxHash: the per-sample table lookup must be cheap; keys are not attacker-chosen in a way
/// that matters (a process can only choose its own pcs, and a collision costs time, not
/// correctness).
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
type Table = FxMap<Key, (u64, u64)>;

/// Aggregation key: kernel samples use pid 0 / asid 0 (one kernel address space).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Key {
    pc: u64,
    asid: u64,
    pid: u32,
    event: EventIdx,
    kernel: bool,
}

#[derive(Default)]
struct CpuState {
    /// Samples waiting for the watermark, in ring order.
    pending: VecDeque<Sample>,
    table: Table,
}

#[derive(Clone, Copy)]
struct CpuClock {
    drained_until: PerfTime,
    last_report: Instant,
}

struct Shared {
    resolver: Resolver,
    clocks: Vec<CpuClock>,
    /// Side-band records not yet applied, per CPU, in ring (= time) order.
    queues: Vec<VecDeque<TimedSideBand>>,
    watermark: PerfTime,
    stats: AggregatorStats,
}

impl Shared {
    /// Apply queued records with `time <= limit`, oldest first across CPUs.
    fn apply_until(&mut self, limit: PerfTime) {
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
                self.resolver.apply(&rec);
            }
        }
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
    cpus: Vec<Mutex<CpuState>>,
}

impl std::fmt::Debug for Aggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregator").field("cpus", &self.cpus.len()).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic in another drain thread must not stop profiling: the tables stay consistent
    // (every update is a single insert).
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Move the samples of `cpu` with `time <= limit` (all if `limit` is `None`) into its table.
fn aggregate_pending(
    cpu: &mut CpuState,
    resolver: &Resolver,
    stats: &mut AggregatorStats,
    limit: Option<PerfTime>,
) -> PerfTime {
    let mut max_time = 0;
    while let Some(s) = cpu.pending.front() {
        if limit.is_some_and(|l| s.time > l) {
            break;
        }
        let s = *s;
        cpu.pending.pop_front();
        max_time = max_time.max(s.time);
        let kernel = s.kernel || s.pc >= KERNEL_START;
        let key = if kernel {
            Key { pc: s.pc, asid: 0, pid: 0, event: s.event, kernel }
        } else {
            let asid = resolver.asid_at(s.pid, s.time).unwrap_or(0);
            Key { pc: s.pc, asid, pid: s.pid, event: s.event, kernel }
        };
        let e = cpu.table.entry(key).or_insert_with(|| {
            stats.entries_created += 1;
            (0, 0)
        });
        e.0 += 1;
        e.1 = e.1.saturating_add(s.period);
        stats.samples_aggregated += 1;
    }
    max_time
}

impl Aggregator {
    /// `ncpus` = highest CPU id + 1. Samples of a CPU id beyond share a table with `id % ncpus`.
    pub fn new(resolver: Resolver, ncpus: usize) -> Arc<Aggregator> {
        let n = ncpus.max(1);
        let now = Instant::now();
        Arc::new(Aggregator {
            shared: Mutex::new(Shared {
                resolver,
                clocks: vec![CpuClock { drained_until: 0, last_report: now }; n],
                queues: (0..n).map(|_| VecDeque::new()).collect(),
                watermark: 0,
                stats: AggregatorStats::default(),
            }),
            cpus: (0..n).map(|_| Mutex::new(CpuState::default())).collect(),
        })
    }

    fn slot(&self, cpu: u32) -> usize {
        cpu as usize % self.cpus.len()
    }

    /// Swap out every per-CPU table (after aggregating what the watermark allows) and resolve.
    pub fn take_resolved(&self) -> Resolved {
        let mut sh = lock(&self.shared);
        let wm = sh.watermark;
        let (tables, _) = self.take_tables(&mut sh, Some(wm));
        let out = resolve_tables(&mut sh.resolver, tables);
        sh.resolver.gc(wm);
        out
    }

    /// Apply every queued side-band record and aggregate every pending sample regardless of
    /// the watermark (which moves to the newest time seen), then resolve.
    pub fn flush_all(&self) -> Resolved {
        let mut sh = lock(&self.shared);
        let newest_sb = sh.queues.iter().filter_map(|q| q.back().map(|r| r.time)).max();
        sh.apply_until(PerfTime::MAX);
        let (tables, newest_sample) = self.take_tables(&mut sh, None);
        let newest = sh.watermark.max(newest_sb.unwrap_or(0)).max(newest_sample);
        sh.watermark = newest;
        let out = resolve_tables(&mut sh.resolver, tables);
        sh.resolver.gc(newest);
        out
    }

    /// Returns the tables and the newest sample time aggregated.
    fn take_tables(&self, sh: &mut Shared, limit: Option<PerfTime>) -> (Vec<Table>, PerfTime) {
        let Shared { resolver, stats, .. } = sh;
        let mut newest = 0;
        let tables = self
            .cpus
            .iter()
            .map(|c| {
                let mut c = lock(c);
                newest = newest.max(aggregate_pending(&mut c, resolver, stats, limit));
                let cap = c.table.len();
                std::mem::replace(
                    &mut c.table,
                    FxMap::with_capacity_and_hasher(cap, Default::default()),
                )
            })
            .collect();
        (tables, newest)
    }

    pub fn stats(&self) -> AggregatorStats {
        let sh = lock(&self.shared);
        let mut s = sh.stats.clone();
        s.watermark = sh.watermark;
        s.pending = self.cpus.iter().map(|c| lock(c).pending.len() as u64).sum();
        s
    }

    /// Run `f` with the resolver locked (drain threads wait meanwhile, which is what the
    /// start-up `/proc` scan wants). `f` must not call back into this aggregator.
    pub fn with_resolver<R>(&self, f: impl FnOnce(&mut Resolver) -> R) -> R {
        let mut sh = lock(&self.shared);
        f(&mut sh.resolver)
    }
}

fn resolve_tables(resolver: &mut Resolver, tables: Vec<Table>) -> Resolved {
    resolver.begin_batch();
    let mut out = Resolved::default();
    // Profiles of one image share an Arc: look the image up by pointer before cloning its id.
    for table in tables {
        for (k, (count, period)) in table {
            out.samples += count;
            match resolver.resolve(k.pid, k.asid, k.pc, k.kernel) {
                Resolution::Image { image, offset } => {
                    let p = out.profiles.entry((image.id.clone(), k.event)).or_insert_with(|| {
                        ResolvedProfile {
                            image: image.clone(),
                            event: k.event,
                            counts: BTreeMap::new(),
                        }
                    });
                    if p.image.kind == ImageKind::Anon
                        && p.image.jit_symbols.len() < image.jit_symbols.len()
                    {
                        p.image = image.clone();
                    }
                    let c = p.counts.entry(offset).or_insert((0, 0));
                    c.0 += count;
                    c.1 = c.1.saturating_add(period);
                }
                Resolution::Unknown(reason) => {
                    resolver.note_unknown(reason, count);
                    let u = out.unknown.entry((k.event, reason)).or_insert((0, 0));
                    u.0 += count;
                    u.1 = u.1.saturating_add(period);
                }
            }
        }
    }
    out
}

impl SampleSink for Aggregator {
    fn on_drain(
        &self,
        cpu: u32,
        drained_until: PerfTime,
        samples: &mut Vec<Sample>,
        sideband: &mut Vec<TimedSideBand>,
    ) {
        let now = Instant::now();
        let mut sh = lock(&self.shared);
        let slot = cpu as usize;
        if slot >= sh.clocks.len() {
            // A CPU id beyond the count given at start (hotplug): track its clock too.
            sh.clocks.resize(slot + 1, CpuClock { drained_until: 0, last_report: now });
            sh.queues.resize_with(slot + 1, VecDeque::new);
        }
        sh.stats.samples_in += samples.len() as u64;
        for rec in sideband.drain(..) {
            if rec.time <= sh.watermark {
                // From a CPU that was left out of the watermark (or a sampler bug): apply now.
                sh.stats.late_sideband += 1;
                sh.resolver.apply(&rec);
            } else {
                sh.queues[slot].push_back(rec);
            }
        }
        let c = &mut sh.clocks[slot];
        c.drained_until = c.drained_until.max(drained_until);
        c.last_report = now;
        sh.recompute_watermark(now);
        let wm = sh.watermark;
        sh.apply_until(wm);
        let mut state = lock(&self.cpus[self.slot(cpu)]);
        state.pending.extend(samples.drain(..));
        let Shared { resolver, stats, .. } = &mut *sh;
        aggregate_pending(&mut state, resolver, stats, Some(wm));
    }
}
