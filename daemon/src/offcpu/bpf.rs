//! The in-kernel off-CPU source (`off_cpu_source = "bpf"`, tried first by `"auto"`).
//!
//! A BPF program on `tp_btf/sched_switch` (daemon/bpf/offcpu.bpf.c, compiled once and
//! committed as offcpu.bpf.o; the build command is in the C file) pairs switch-outs with
//! switch-ins in the kernel: at a blocking switch-out (not a preemption, not the idle task,
//! not an exit) it keeps `{time, kernel stack id, user stack id, tgid}` under the tid in an
//! LRU hash (`starts`: a thread that exits while blocked is evicted, not leaked); when that
//! tid runs again it adds the wait's nanoseconds and a count under
//! `(tgid, tid, user stack id, kernel stack id)`, or under stack ids -1 when the wait was
//! shorter than `off_cpu_threshold`. The stacks are in a `STACK_TRACE` map. So per context
//! switch the kernel does a hash update and a stack hash, writes no record and wakes nobody.
//!
//! The reading thread (`dcpi-offcpu`, one pass every [`PASS_MS`]) drains the aggregate and
//! hands the sink the same [`Sample`]s as the perf sources ([`samples`]): one per key, weighted
//! by its nanoseconds, at the user pc where the thread entered the kernel (a kernel thread's:
//! its first kernel frame), with the stack interned in the off-CPU slot's stack table. The
//! tgid's command comes from the resolver's who/comm tables, as for every sample.
//!
//! **Draining without losing concurrent additions.** There are two waits maps and a
//! generation (an `ARRAY` of one `u32`) that says which one the program adds to. A pass flips
//! the generation, then reads and deletes the other map key by key. A program that read the
//! generation just before the flip may still add to the old map for the rest of its run
//! (microseconds, with preemption off); an addition to a key already read and deleted then
//! creates the key again and is read two passes later (not lost); only an addition that lands
//! between the lookup and the delete of the same key, within those microseconds of the flip,
//! is lost. A single map read and deleted key by key would lose every addition between each
//! lookup and its delete, for the whole pass, on the busiest keys.
//!
//! **Stack ids.** `bpf_get_stackid` stores each distinct stack once, in the bucket its hash
//! names, and fails (`-EEXIST`, counted) when that bucket holds another stack. Ids stay valid
//! until deleted and a bucket's content never changes before that, so resolved stacks are
//! cached here. The stacks of short waits are taken too (at the switch-out the wait's length
//! is unknown) and nothing refers to them, so the map is swept: every [`SWEEP_PASSES`] passes,
//! or at once when the program counted a failed stack id, every id that neither a blocked
//! thread (`starts`) nor the current waits map refers to is deleted, and the cache cleared.
//! A thread that blocks between the sweep's listing of the ids and its deletes, on a stack
//! already stored, may lose its stack (its wait counts without one): a window of the sweep's
//! duration, once a minute. Two different stacks whose hashes name the same bucket cannot both
//! be stored (the birthday bound: ~8 collisions among the first 500 distinct stacks of 16 384
//! buckets); the later one's waits count without a stack until a sweep frees the bucket.
//!
//! **Kernel memory** (preallocated, charged to dcpid's memory cgroup): the stack map 17 MB
//! (16 384 stacks of 127 frames), the blocked threads 6.3 MB (65 536), each waits map 1.6 MB
//! (16 384 keys): 27 MB, from `bpftool map show` on this kernel.
//!
//! **What differs from the perf sources.** A pass hands over each key's sum, at the time its
//! latest wait ended (not one sample per wait at its end): the waits of a pass fall in the
//! epoch and slice of their key's latest, at most a pass (a second) later than their own. Waits
//! below `off_cpu_threshold` are keyed without stack ids (so as not to multiply keys) but with
//! their pc, as the perf sources count them. A wait still going on at shutdown is not counted,
//! as with the perf sources.
//!
//! **Without stacks** (`callchains = "none"`, the shipped configuration: no stack table) the
//! program walks no stack: it reads one frame, the saved user ip where the thread entered the
//! kernel (a kernel thread's first kernel frame), which is all a flat profile needs.

use std::collections::HashMap;
use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use aya::maps::{Array, HashMap as BpfHash, MapData, MapError, PerCpuArray, StackTraceMap};
use aya::programs::{BtfTracePoint, ProgramError};
use aya::{Btf, BtfError, Ebpf, EbpfError, EbpfLoader, Pod};

use crate::perf::callchain::StackTables;
use crate::resolve::KERNEL_START;
use crate::sys;
use crate::sys::perf::{self as sp, EventFd};
use crate::types::{EventIdx, Sample, SampleSink};

use super::{OffCpuConfig, Stats};

/// The program, aligned as aya requires (an ELF64 object's headers are 8-byte aligned).
fn object() -> &'static [u8] {
    aya::include_bytes_aligned!("../../bpf/offcpu.bpf.o")
}

/// Time between two passes, in milliseconds.
pub const PASS_MS: i32 = 1000;
/// Passes between two sweeps of the stack map (without a failed stack id).
pub const SWEEP_PASSES: u64 = 60;

/// Counter indices of the program's `counters` map (`C_*` in offcpu.bpf.c).
const C_SWITCHES: u32 = 0;
const C_WAITS: u32 = 1;
const C_STACK_FAILED: u32 = 2;
const C_WAITS_FULL: u32 = 3;
const COUNTERS: u32 = 4;

/// A key of the waits maps (`struct wkey`). A negative stack id is none; `pc` is where the
/// thread entered the kernel (a kernel thread's kernel pc), 0 if unknown.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WaitKey {
    pub tgid: u32,
    pub tid: u32,
    pub ustack: i32,
    pub kstack: i32,
    pub pc: u64,
}

/// A value of the waits maps (`struct wval`): nanoseconds off CPU, waits, and when the latest
/// of them ended.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitVal {
    pub ns: u64,
    pub n: u64,
    pub last: u64,
}

/// A blocked thread (`struct start`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Start {
    ts: u64,
    pc: u64,
    ustack: i32,
    kstack: i32,
    tgid: u32,
    pad: u32,
}

// SAFETY: `repr(C)` structs of integers only, laid out without padding (24, 24 and 32 bytes:
// every field is at a multiple of its size), so every bit pattern of their size is a value,
// as aya's `Pod` requires of what it copies to and from the kernel.
unsafe impl Pod for WaitKey {}
// SAFETY: as above.
unsafe impl Pod for WaitVal {}
// SAFETY: as above.
unsafe impl Pod for Start {}

const _: () = assert!(std::mem::size_of::<WaitKey>() == 24);
const _: () = assert!(std::mem::size_of::<WaitVal>() == 24);
const _: () = assert!(std::mem::size_of::<Start>() == 32);

/// Why the BPF source cannot run. The messages hold aya's whole chain of causes (its errors
/// say which map failed, their sources why: "Operation not permitted" is the one to see).
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("cannot read the kernel's BTF (/sys/kernel/btf/vmlinux): {}", chain(.0))]
    Btf(BtfError),
    #[error("cannot load the BPF object: {}", chain(.0))]
    Load(EbpfError),
    #[error("the kernel refused the sched_switch program: {}", chain(.0))]
    Program(ProgramError),
    #[error("BPF map {name}: {}", chain(.source))]
    Map { name: &'static str, source: MapError },
    #[error("the BPF object has no {0}")]
    Missing(&'static str),
}

impl From<BtfError> for BpfError {
    fn from(e: BtfError) -> Self {
        Self::Btf(e)
    }
}

impl From<EbpfError> for BpfError {
    fn from(e: EbpfError) -> Self {
        Self::Load(e)
    }
}

impl From<ProgramError> for BpfError {
    fn from(e: ProgramError) -> Self {
        Self::Program(e)
    }
}

/// An error and its causes, "a: b: c".
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cause = c.source();
    }
    s
}

fn map_err(name: &'static str) -> impl FnOnce(MapError) -> BpfError {
    move |source| BpfError::Map { name, source }
}

/// The loaded and attached program and its maps; dropping it detaches the program.
pub struct Loaded {
    /// Holds the program and its link.
    _ebpf: Ebpf,
    waits: [BpfHash<MapData, WaitKey, WaitVal>; 2],
    generation: Array<MapData, u32>,
    starts: BpfHash<MapData, u32, Start>,
    stacks: StackTraceMap<MapData>,
    counters: PerCpuArray<MapData, u64>,
    /// The generation the program adds to.
    current: u32,
}

impl fmt::Debug for Loaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Loaded").field("current", &self.current).finish_non_exhaustive()
    }
}

impl Loaded {
    /// Load the program with `threshold_ns` and attach it to `sched_switch`; `with_stacks`:
    /// whether it takes stacks (without, only the pc where each thread entered the kernel).
    pub fn load(threshold_ns: u64, with_stacks: bool) -> Result<Self, BpfError> {
        let btf = Btf::from_sys_fs()?;
        // A C `bool`: one byte.
        let with_stacks = u8::from(with_stacks);
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .override_global("threshold_ns", &threshold_ns, true)
            .override_global("with_stacks", &with_stacks, true)
            .load(object())?;
        let prog: &mut BtfTracePoint = ebpf
            .program_mut("on_switch")
            .ok_or(BpfError::Missing("program on_switch"))?
            .try_into()?;
        prog.load("sched_switch", &btf)?;
        prog.attach()?;
        let mut take = |name: &'static str| ebpf.take_map(name).ok_or(BpfError::Missing(name));
        let waits0 = BpfHash::try_from(take("waits0")?).map_err(map_err("waits0"))?;
        let waits1 = BpfHash::try_from(take("waits1")?).map_err(map_err("waits1"))?;
        let generation = Array::try_from(take("gen")?).map_err(map_err("gen"))?;
        let starts = BpfHash::try_from(take("starts")?).map_err(map_err("starts"))?;
        let stacks = StackTraceMap::try_from(take("stacks")?).map_err(map_err("stacks"))?;
        let counters = PerCpuArray::try_from(take("counters")?).map_err(map_err("counters"))?;
        Ok(Self {
            _ebpf: ebpf,
            waits: [waits0, waits1],
            generation,
            starts,
            stacks,
            counters,
            current: 0,
        })
    }

    /// Flip the generation and move every wait of the old one into `out` (see the module docs).
    fn drain(&mut self, out: &mut Vec<(WaitKey, WaitVal)>) -> Result<(), BpfError> {
        let old = self.current;
        self.current ^= 1;
        self.generation.set(0, self.current, 0).map_err(map_err("gen"))?;
        let map = &mut self.waits[old as usize];
        let keys: Vec<WaitKey> = map.keys().filter_map(Result::ok).collect();
        for k in keys {
            // A key gone meanwhile (it cannot be: only this thread deletes) is skipped.
            if let Ok(v) = map.get(&k, 0) {
                drop(map.remove(&k));
                out.push((k, v));
            }
        }
        Ok(())
    }

    /// The frames of stack `id`, leaf first, from the kernel.
    fn stack(&self, id: i32) -> Option<Vec<u64>> {
        let id = u32::try_from(id).ok()?;
        let t = self.stacks.get(&id, 0).ok()?;
        Some(t.frames().iter().map(|f| f.ip).collect())
    }

    /// The program's counters, summed over the CPUs.
    fn counters(&self) -> [u64; COUNTERS as usize] {
        let mut c = [0; COUNTERS as usize];
        for (i, v) in (0..COUNTERS).zip(c.iter_mut()) {
            if let Ok(per_cpu) = self.counters.get(&i, 0) {
                *v = per_cpu.iter().fold(0u64, |a, &b| a.wrapping_add(b));
            }
        }
        c
    }

    /// Delete every stored stack that no blocked thread nor the current waits map refers to.
    /// Returns how many were deleted.
    fn sweep(&mut self) -> usize {
        let ids: Vec<u32> = self.stacks.stack_ids().filter_map(Result::ok).collect();
        let mut keep = HashSet::new();
        for s in self.starts.iter().filter_map(Result::ok) {
            keep.extend([s.1.ustack, s.1.kstack]);
        }
        for k in self.waits[self.current as usize].keys().filter_map(Result::ok) {
            keep.extend([k.ustack, k.kstack]);
        }
        let mut deleted = 0;
        for id in ids {
            let referenced = i32::try_from(id).is_ok_and(|i| keep.contains(&i));
            if !referenced && self.stacks.remove(&id).is_ok() {
                deleted += 1;
            }
        }
        deleted
    }
}

/// What a pass made of the waits it read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub waits: u64,
    pub ns: u64,
    /// Waits counted without a stack (below the threshold, a failed or missing stack id).
    pub without_stack: u64,
}

/// The samples of `waits`, one per key, appended to `out` in time order: weighted by the key's
/// nanoseconds, at its user stack's first frame (where the thread entered the kernel), else
/// (a kernel thread) its kernel stack's first frame, else pc 0; timed when the key's latest wait
/// ended (the thread existed then: a pass's time may be after its process exited, and the
/// resolver would not know the pid any more), kept inside the pass's window `(after, until)`.
/// `frames(id)` gives a stack id's frames (leaf first), `intern(pcs, truncated)` its id in the
/// off-CPU slot's stack table (0: none). Pure, so that it is tested without BPF.
pub fn samples(
    waits: &[(WaitKey, WaitVal)],
    (after, until): (u64, u64),
    event: EventIdx,
    max_stack: usize,
    mut frames: impl FnMut(i32) -> Option<Vec<u64>>,
    mut intern: Option<&mut dyn FnMut(&[u64], bool) -> u32>,
    out: &mut Vec<Sample>,
) -> Totals {
    let mut t = Totals::default();
    let mut pcs = Vec::new();
    let first = out.len();
    for (k, v) in waits {
        t.waits = t.waits.saturating_add(v.n);
        t.ns = t.ns.saturating_add(v.ns);
        let kernel = (k.kstack >= 0).then(|| frames(k.kstack)).flatten().unwrap_or_default();
        let user = (k.ustack >= 0).then(|| frames(k.ustack)).flatten().unwrap_or_default();
        // As `process_chain` makes perf's chains: a return address points after its call, so
        // every frame but the first of each part is moved back into the call instruction.
        pcs.clear();
        let parts = [&kernel, &user];
        for part in parts {
            let adjusted =
                part.iter()
                    .enumerate()
                    .map(|(i, &pc)| if i == 0 { pc } else { pc.saturating_sub(1) });
            pcs.extend(adjusted);
        }
        let truncated = pcs.len() > max_stack.max(1);
        pcs.truncate(max_stack.max(1));
        let (pc, in_kernel) = match (user.first(), kernel.first()) {
            (Some(&u), _) => (u, false),
            (None, Some(&kpc)) => (kpc, true),
            // No stack (below the threshold, `callchains = "none"`, a failed id): the pc the
            // program read.
            (None, None) => (k.pc, k.pc >= KERNEL_START),
        };
        let stack = match intern.as_mut() {
            Some(f) if !pcs.is_empty() => f(&pcs, truncated),
            _ => 0,
        };
        if stack == 0 {
            t.without_stack = t.without_stack.saturating_add(v.n);
        }
        out.push(Sample {
            time: v.last.max(after.saturating_add(1)).min(until.saturating_sub(1)),
            pid: k.tgid,
            tid: k.tid,
            pc,
            event,
            period: v.ns.max(1),
            kernel: in_kernel,
            cgroup: 0,
            stack,
        });
    }
    // The sink takes a slot's samples in time order.
    out[first..].sort_by_key(|s| s.time);
    t
}

/// The reading thread of the BPF source.
pub(super) struct BpfReader {
    pub(super) cfg: OffCpuConfig,
    pub(super) loaded: Loaded,
    pub(super) sink: Arc<dyn SampleSink>,
    pub(super) stacks: Option<Arc<StackTables>>,
    pub(super) stats: Arc<Stats>,
    /// Resolved stacks, valid until the next sweep (a stored id's frames never change).
    cache: HashMap<i32, Vec<u64>>,
    waits: Vec<(WaitKey, WaitVal)>,
    samples: Vec<Sample>,
    passes: u64,
    /// The program's failed stack ids at the last sweep.
    failed_at_sweep: u64,
    /// The last drain error was logged (it is not repeated at every pass).
    warned: bool,
    /// What the last pass told the sink it had delivered up to.
    drained_until: u64,
}

impl BpfReader {
    pub(super) fn new(
        cfg: OffCpuConfig,
        loaded: Loaded,
        sink: Arc<dyn SampleSink>,
        stacks: Option<Arc<StackTables>>,
        stats: Arc<Stats>,
    ) -> Self {
        Self {
            cfg,
            loaded,
            sink,
            stacks,
            stats,
            cache: HashMap::new(),
            waits: Vec::new(),
            samples: Vec::new(),
            passes: 0,
            failed_at_sweep: 0,
            warned: false,
            drained_until: 0,
        }
    }

    pub(super) fn run(&mut self, stop: &EventFd, stopping: &AtomicBool) {
        let clock = sys::time::own_thread_clock();
        loop {
            if let Err(e) = sp::poll_rings(&[], stop, PASS_MS) {
                tracing::warn!(error = %e, "off-CPU: poll failed; reading on a timer");
                std::thread::sleep(std::time::Duration::from_millis(PASS_MS as u64));
            }
            let last = stopping.load(Ordering::Acquire);
            self.pass();
            if let Some(c) = clock.and_then(sys::time::clock_ns) {
                self.stats.cpu_ns.store(c, Ordering::Relaxed);
            }
            if last {
                return;
            }
        }
    }

    fn pass(&mut self) {
        // Every wait in the old generation ended before the flip, which follows this instant.
        let now = sys::time::monotonic_ns();
        if let Err(e) = self.loaded.drain(&mut self.waits) {
            if !std::mem::replace(&mut self.warned, true) {
                tracing::warn!(error = %e, "off-CPU: cannot read the BPF waits map");
            }
        }
        let counters = self.loaded.counters();
        let max_stack = usize::from(self.cfg.max_stack.max(1));
        let mut table = self.stacks.as_ref().map(|t| t.cpu(self.cfg.slot));
        if let Some(t) = table.as_mut() {
            t.begin_pass();
        }
        let (loaded, cache) = (&self.loaded, &mut self.cache);
        let frames = |id: i32| {
            if let Some(f) = cache.get(&id) {
                return Some(f.clone());
            }
            let f = loaded.stack(id)?;
            cache.insert(id, f.clone());
            Some(f)
        };
        let mut intern = |pcs: &[u64], truncated: bool| match table.as_mut() {
            Some(t) => t.intern_pcs(pcs, truncated),
            None => 0,
        };
        let has_table = self.stacks.is_some();
        let intern: Option<&mut dyn FnMut(&[u64], bool) -> u32> =
            if has_table { Some(&mut intern) } else { None };
        // Every wait of the old generation ended after the last pass's flip and before this
        // one's: the slot is drained up to `now`.
        let totals = samples(
            &self.waits,
            (self.drained_until, now),
            self.cfg.event,
            max_stack,
            frames,
            intern,
            &mut self.samples,
        );
        self.waits.clear();
        drop(table);
        self.sink.on_drain(self.cfg.slot, now, &mut self.samples, &mut Vec::new());
        self.drained_until = now;
        self.samples.clear();
        if let Some(t) = self.stacks.as_ref() {
            t.cpu(self.cfg.slot).end_pass();
        }
        let failed = counters[C_STACK_FAILED as usize];
        self.passes += 1;
        if failed > self.failed_at_sweep || self.passes.is_multiple_of(SWEEP_PASSES) {
            if failed > self.failed_at_sweep && self.failed_at_sweep == 0 {
                tracing::info!(failed, "off-CPU: the BPF stack map had no room for a stack; sweeping it (the waits count without that stack)");
            }
            let deleted = self.loaded.sweep();
            tracing::debug!(deleted, "off-CPU: swept the BPF stack map");
            self.cache.clear();
            self.failed_at_sweep = failed;
        }
        let s = &self.stats;
        s.switches.store(counters[C_SWITCHES as usize], Ordering::Relaxed);
        // The program's own count of waits timed, up to date at the last pass (the nanoseconds
        // below are those handed over, which trail it by the current generation's).
        s.waits.store(counters[C_WAITS as usize], Ordering::Relaxed);
        s.off_cpu_ns.fetch_add(totals.ns, Ordering::Relaxed);
        s.without_stack.fetch_add(totals.without_stack, Ordering::Relaxed);
        // A wait the program could not store (the waits map full) is lost.
        s.lost.store(counters[C_WAITS_FULL as usize], Ordering::Relaxed);
        s.passes.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KPC: u64 = 0xffff_ffff_8100_0000;

    fn key(tid: u32, ustack: i32, kstack: i32) -> WaitKey {
        WaitKey { tgid: 7, tid, ustack, kstack, pc: 0 }
    }

    /// Each key becomes one sample weighted by its nanoseconds, at the user pc where the
    /// thread entered the kernel; its stack is the kernel frames then the user frames, every
    /// frame but the first of each part moved back into its call; keys below the threshold
    /// (-1) and unknown ids count without a stack, at the pc the program read; a kernel thread
    /// waits at its kernel leaf.
    #[test]
    fn waits_become_samples_with_their_stacks() {
        let stacks: HashMap<i32, Vec<u64>> = HashMap::from([
            (1, vec![0x40_1000, 0x40_2005, 0x40_3009]),
            (2, vec![KPC, KPC + 0x40]),
            (3, vec![KPC + 8, KPC + 0x80]),
        ]);
        let waits = [
            (key(42, 1, 2), WaitVal { ns: 600, n: 3, last: 1500 }),
            // Below the threshold (or without stacks): the pc the program read.
            (WaitKey { pc: 0x40_5000, ..key(43, -1, -1) }, WaitVal { ns: 50, n: 5, last: 1200 }),
            (WaitKey { pc: KPC + 0x10, ..key(46, -1, -1) }, WaitVal { ns: 30, n: 2, last: 1300 }),
            // Ended before the window (a program that read the generation before the last
            // flip) and after it (between the pass's clock read and its flip).
            (key(44, -14, 3), WaitVal { ns: 70, n: 1, last: 900 }),
            (key(45, 9, 9), WaitVal { ns: 0, n: 1, last: 2500 }),
        ];
        let mut interned: Vec<(Vec<u64>, bool)> = Vec::new();
        let mut intern = |pcs: &[u64], truncated: bool| {
            interned.push((pcs.to_vec(), truncated));
            interned.len() as u32
        };
        let mut out = Vec::new();
        let t = samples(
            &waits,
            (1000, 2000),
            3,
            64,
            |id| stacks.get(&id).cloned(),
            Some(&mut intern),
            &mut out,
        );
        assert_eq!(t, Totals { waits: 12, ns: 750, without_stack: 8 });
        let got: Vec<_> =
            out.iter().map(|s| (s.time, s.tid, s.pc, s.kernel, s.period, s.stack)).collect();
        // In time order, each at its latest wait's end, inside the window.
        assert_eq!(
            got,
            [
                (1001, 44, KPC + 8, true, 70, 2),
                (1200, 43, 0x40_5000, false, 50, 0),
                (1300, 46, KPC + 0x10, true, 30, 0),
                (1500, 42, 0x40_1000, false, 600, 1),
                // No frames (ids the map no longer has) and a zero-length wait: period 1.
                (1999, 45, 0, false, 1, 0),
            ]
        );
        assert!(out.iter().all(|s| s.pid == 7 && s.event == 3));
        assert_eq!(interned[0], (vec![KPC, KPC + 0x3f, 0x40_1000, 0x40_2004, 0x40_3008], false));
        assert_eq!(interned[1], (vec![KPC + 8, KPC + 0x7f], false));
        assert_eq!(interned.len(), 2);

        // A stack deeper than `max_stack` is cut there and said truncated; without a stack
        // table every wait counts without a stack.
        interned.clear();
        out.clear();
        let mut intern = |pcs: &[u64], truncated: bool| {
            interned.push((pcs.to_vec(), truncated));
            1
        };
        let w = &waits[..1];
        samples(w, (0, 9), 3, 3, |id| stacks.get(&id).cloned(), Some(&mut intern), &mut out);
        assert_eq!(interned, [(vec![KPC, KPC + 0x3f, 0x40_1000], true)]);
        out.clear();
        let t = samples(&waits, (0, 9), 3, 64, |id| stacks.get(&id).cloned(), None, &mut out);
        assert_eq!(t.without_stack, 12);
        assert!(out.iter().all(|s| s.stack == 0));
    }

    /// The committed object is what its source compiles to (the command in offcpu.bpf.c), so
    /// that neither the build nor CI needs clang. Needs Debian 12's clang 14, which built it:
    /// another clang makes other bytes from the same source.
    #[test]
    fn bpf_object_is_what_its_source_compiles_to() {
        use std::process::Command;
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bpf");
        let version = match Command::new("clang").arg("--version").output() {
            Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
            _ => dcpi_testkit::skip!(
                "clang is not installed (apt-get install clang llvm libbpf-dev)"
            ),
        };
        if !version.contains("clang version 14.") {
            dcpi_testkit::skip!(
                "offcpu.bpf.o was built by clang 14 (Debian 12); this is {}",
                version.lines().next().unwrap_or("")
            );
        }
        if Command::new("llvm-strip").arg("--version").output().is_err() {
            dcpi_testkit::skip!("llvm-strip is not installed (apt-get install llvm)");
        }
        if !std::path::Path::new("/usr/include/bpf/bpf_helpers.h").exists() {
            dcpi_testkit::skip!("libbpf's headers are not installed (apt-get install libbpf-dev)");
        }
        let tmp = tempfile::tempdir().unwrap();
        for f in ["offcpu.bpf.c", "offcpu.h"] {
            std::fs::copy(dir.join(f), tmp.path().join(f)).unwrap();
        }
        let prefix = format!("-fdebug-prefix-map={}=.", tmp.path().display());
        let st = Command::new("clang")
            .current_dir(tmp.path())
            .args(["-O2", "-g", "-target", "bpf", "-D__TARGET_ARCH_x86", &prefix])
            .args(["-c", "offcpu.bpf.c", "-o", "offcpu.bpf.o"])
            .status()
            .unwrap();
        assert!(st.success(), "clang failed");
        let st = Command::new("llvm-strip")
            .current_dir(tmp.path())
            .args(["-g", "offcpu.bpf.o"])
            .status()
            .unwrap();
        assert!(st.success(), "llvm-strip failed");
        let built = std::fs::read(tmp.path().join("offcpu.bpf.o")).unwrap();
        let committed = std::fs::read(dir.join("offcpu.bpf.o")).unwrap();
        assert!(
            built == committed,
            "daemon/bpf/offcpu.bpf.o differs from what offcpu.bpf.c compiles to ({} vs {} \
             bytes): rebuild it with the command in offcpu.bpf.c and commit it",
            built.len(),
            committed.len()
        );
    }
}
