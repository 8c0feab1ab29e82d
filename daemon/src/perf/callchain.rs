//! Call chains (`callchains = "fp"`): the per-CPU stack tables that intern each sampled chain
//! once, so that a hot stack costs a hash lookup and one counter increment, never a copy.
//!
//! A drain thread turns a sample's `PERF_SAMPLE_CALLCHAIN` into a *stack*: the context markers
//! (`PERF_CONTEXT_KERNEL`, `PERF_CONTEXT_USER`, ...) are dropped, guest and hypervisor frames
//! too, and every frame but the first of each context becomes `return address − 1`, which lies
//! inside the call instruction, so that the caller's frame symbolizes to the call site even
//! when the call is the last instruction of its function. The first frame of a context is the
//! interrupted pc itself (the sample's ip, or the user pc at kernel entry) and stays exact.
//!
//! A stack is **truncated** when it does not reach a root: the chain held `max_stack` frames
//! (the kernel cut it), or its user part stopped after its first frame (frame-pointer
//! unwinding found no caller: code built without frame pointers). Deeper breaks (an unwinder
//! that stops in the middle of a stack) cannot be told apart from a root here; the report tool
//! looks at the outermost frame's symbol for those.
//!
//! The table of a CPU is written only by its drain thread (once per pass, under its mutex) and
//! read by the flusher, which resolves the stacks its batch counted and then [`prune`]s every
//! stack that nothing still names: not a sample pending in the aggregator, not a count since
//! the batch was taken, and not a sample still in its drain thread's hands. The last are the
//! stacks interned since the drain thread began the pass it has not yet handed to the sink
//! ([`begin_pass`], [`end_pass`]): a pass's ids stay valid until the aggregator holds them,
//! however long the thread is held up in between. Ids are stable while an entry lives.
//!
//! So a table holds the distinct stacks of one flush interval and of what is pending, not
//! more: on a machine whose stacks are nearly all distinct (compilers), a table that also kept
//! the previous interval's stacks filled up and lost most new stacks. The table holds at most
//! `capacity` stacks; a new stack beyond that is not recorded (its sample is still counted in
//! the flat profile) and counted in `overflow`. A table past half of it asks for
//! an early flush ([`StackTables::request_flush`]): a flush interval whose stacks would not fit
//! (a high rate, a long interval, a flush delayed by load) is cut short instead.
//!
//! [`begin_pass`]: StackTable::begin_pass
//! [`end_pass`]: StackTable::end_pass
//!
//! [`prune`]: StackTable::prune

use crate::perf::dwarf::DwarfShared;
use crate::perf::dwarf::DwarfUnwinder;
use crate::perf::dwarf::UnwindCounters;
use crate::perf::records::UserRegs;
use crate::types::SideBand;
use hashbrown::HashTable;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// `PERF_CONTEXT_*` markers: every value at or above this (as u64) is one.
const PERF_CONTEXT_MAX: u64 = -4095i64 as u64;
const PERF_CONTEXT_KERNEL: u64 = -128i64 as u64;
const PERF_CONTEXT_USER: u64 = -512i64 as u64;

/// Default deepest chain asked of the kernel (`sample_max_stack`).
pub const DEFAULT_MAX_STACK: u16 = 64;
/// Stacks each CPU's table holds at most.
pub const DEFAULT_STACKS_PER_CPU: usize = 8 * 1024;
/// Pruned stacks' pcs a table keeps for reuse at most (at the default depth bound, at most
/// 2 MiB a CPU, and only after a flush pruned that many).
const RECYCLED_MAX: usize = 4096;

/// A stack id in a sample: 0 = no stack, else table slot + 1.
pub type StackId = u32;

/// One interned stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackEntry {
    /// Leaf first; kernel frames are kernel addresses, the others user addresses.
    pub pcs: Box<[u64]>,
    pub truncated: bool,
}

/// Counters of one table, for status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct StackCounters {
    /// Samples that carried a chain and got a stack id.
    pub interned: u64,
    /// Samples whose stack was new while the table was full (not recorded as stacks).
    pub overflow: u64,
    /// Samples whose stack is truncated (depth limit hit or no caller found).
    pub truncated: u64,
    /// Chains with no frame at all (only markers, or malformed).
    pub empty: u64,
    /// Samples whose stack was not taken (`stack_one_in`: one sample in N is, at random).
    pub skipped: u64,
}

/// A stack's key in its table's index: 128 bits of XXH3 with a seed drawn at random for each
/// table, over the raw chain as the kernel wrote it (`fp`) or over the pcs (DWARF, off-CPU).
/// The low half places the entry, the high half tells stacks apart: a hit compares 64 bits in
/// the index entry and reads neither the slot nor its pcs (two more cold cache lines, and
/// often two more pages, per sample, for a thread that wakes once a second), and an `fp` hit
/// does not even turn the chain into pcs. Two different stacks share a key with probability
/// about n² / 2¹²⁹ for n stacks in a table; the seed is unknown outside the daemon, so a
/// program cannot aim its stacks at another's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    place: u64,
    check: u64,
}

impl Key {
    fn of(bytes: &[u8], seed: u64) -> Self {
        let h = twox_hash::XxHash3_128::oneshot_with_seed(seed, bytes);
        Self { place: h as u64, check: (h >> 64) as u64 }
    }

    fn of_pcs(pcs: &[u64], seed: u64) -> Self {
        // The pcs as their bytes in memory: u64 has no padding and every byte is initialized.
        let bytes = zerocopy::IntoBytes::as_bytes(pcs);
        // A seed of its own: a pcs key never equals a raw chain's key of the same bytes.
        Self::of(bytes, seed ^ 0x5bd1_e995_5bd1_e995)
    }
}

/// One stack in a table's index: its key, its slot, and what a hit updates.
#[derive(Clone, Copy, Debug)]
struct IndexEntry {
    key: Key,
    slot: u32,
    /// The prune generation in which it was last interned.
    last_gen: u64,
    truncated: bool,
}

/// The pcs of pruned stacks, by length, for new stacks of that length to reuse: a flush
/// prunes the hot stacks it counted and the drain thread interns them again within the next
/// interval. Freed on the flush thread and allocated on the drain thread, each such pair went
/// through the allocator's shared arena, whose consolidation of what the flush had freed the
/// drain thread paid for (malloc was a tenth of its CPU with `fp` stacks).
#[derive(Debug, Default)]
struct Recycled {
    by_len: Vec<Vec<Box<[u64]>>>,
    count: usize,
}

impl Recycled {
    /// `pcs` in a kept box of the same length if there is one, else a new one.
    fn boxed(&mut self, pcs: &[u64]) -> Box<[u64]> {
        match self.by_len.get_mut(pcs.len()).and_then(Vec::pop) {
            Some(mut b) => {
                self.count -= 1;
                b.copy_from_slice(pcs);
                b
            }
            None => pcs.into(),
        }
    }

    /// Keep a pruned stack's pcs, up to [`RECYCLED_MAX`] boxes (past that, and for lengths
    /// beyond `max_len`, freed).
    fn put(&mut self, pcs: Box<[u64]>, max_len: usize) {
        let len = pcs.len();
        if self.count >= RECYCLED_MAX || len > max_len {
            return;
        }
        if self.by_len.len() <= len {
            self.by_len.resize_with(len + 1, Vec::new);
        }
        self.by_len[len].push(pcs);
        self.count += 1;
    }
}

/// One CPU's stack table.
#[derive(Debug)]
pub struct StackTable {
    /// Slots by their stack's [`Key`]: each stack's pcs are stored once, in its slot, and a
    /// hit never reads them (a map keyed by the pcs held them twice, and allocated twice per
    /// new stack).
    index: HashTable<IndexEntry>,
    slots: Vec<Option<StackEntry>>,
    free: Vec<u32>,
    recycled: Recycled,
    capacity: usize,
    /// Advanced by every prune; an entry records the generation it was last interned in.
    generation: u64,
    /// Passes begun and not yet handed to the sink (two drain threads share a table when a
    /// CPU id is beyond the count at start), and the generation the oldest of them began in.
    in_hand: u32,
    in_hand_since: u64,
    /// The index's hash seed ([`Key`]), drawn at random for each table.
    seed: u64,
    max_stack: usize,
    scratch: Vec<u64>,
    pub counters: StackCounters,
    /// `callchains = "dwarf"`: this CPU's unwinder of copied user stacks.
    dwarf: Option<DwarfUnwinder>,
    /// `stack_one_in`: a sample's stack is taken with probability 1 / this (1: every one).
    one_in: u32,
    /// xorshift64 state of that draw (never 0).
    draw: u64,
}

/// Turn a raw chain (native-endian u64s as the kernel wrote them) into leaf-first pcs in
/// `out`; returns whether it is truncated (module docs), or `None` if it has no frame.
pub fn process_chain(chain: &[u8], max_stack: usize, out: &mut Vec<u64>) -> Option<bool> {
    out.clear();
    #[derive(PartialEq)]
    enum Ctx {
        Kernel,
        User,
        Other,
    }
    let mut ctx = Ctx::Other;
    let mut first_in_ctx = true;
    let mut frames = 0usize;
    let mut user_frames = 0usize;
    let mut saw_user = false;
    for w in chain.chunks_exact(8) {
        let v = u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        if v >= PERF_CONTEXT_MAX {
            ctx = match v {
                PERF_CONTEXT_KERNEL => Ctx::Kernel,
                PERF_CONTEXT_USER => {
                    saw_user = true;
                    Ctx::User
                }
                // Hypervisor (PERF_CONTEXT_HV) and guest frames are not this host's code.
                _ => Ctx::Other,
            };
            first_in_ctx = true;
            continue;
        }
        frames += 1;
        if ctx == Ctx::Other {
            continue;
        }
        if ctx == Ctx::User {
            user_frames += 1;
        }
        // A return address points after the call: back into the call instruction.
        let pc = if first_in_ctx { v } else { v.saturating_sub(1) };
        first_in_ctx = false;
        out.push(pc);
    }
    if out.is_empty() {
        return None;
    }
    let truncated = frames >= max_stack || (saw_user && user_frames == 1);
    Some(truncated)
}

impl StackTable {
    pub fn new(capacity: usize, max_stack: u16) -> Self {
        Self {
            index: HashTable::new(),
            slots: Vec::new(),
            free: Vec::new(),
            recycled: Recycled::default(),
            capacity: capacity.max(1),
            generation: 1,
            in_hand: 0,
            in_hand_since: 0,
            seed: rand::random(),
            max_stack: usize::from(max_stack.max(1)),
            scratch: Vec::with_capacity(usize::from(max_stack) + 4),
            counters: StackCounters::default(),
            dwarf: None,
            one_in: 1,
            draw: 0x9e37_79b9_7f4a_7c15,
        }
    }

    /// Take a sample's stack with probability `1 / n` only (`stack_one_in`), drawn with
    /// `seed`; each taken stack then stands for `n` samples ([`StackTables::one_in`]).
    pub fn set_one_in(&mut self, n: u32, seed: u64) {
        self.one_in = n.max(1);
        self.draw = seed | 1;
    }

    /// The samples each stack this table took stands for (`stack_one_in`; 1 for a table whose
    /// stacks are all taken, the off-CPU source's).
    pub fn one_in(&self) -> u32 {
        self.one_in
    }

    /// Whether this sample's stack is taken: a Bernoulli draw of probability `1 / one_in`,
    /// independent of the sample, so that the taken stacks are an unbiased sample of all and
    /// a count times `one_in` estimates the samples (not a 1-in-N rotation, which a periodic
    /// workload could alias with). xorshift64: a few instructions, no syscall.
    fn take(&mut self) -> bool {
        if self.one_in <= 1 {
            return true;
        }
        let mut x = self.draw;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.draw = x;
        if x.is_multiple_of(u64::from(self.one_in)) {
            true
        } else {
            self.counters.skipped += 1;
            false
        }
    }

    /// A table whose samples carry user registers and a user stack copy, unwound with
    /// `dwarf` (`callchains = "dwarf"`).
    pub fn with_dwarf(capacity: usize, max_stack: u16, dwarf: DwarfUnwinder) -> Self {
        Self { dwarf: Some(dwarf), ..Self::new(capacity, max_stack) }
    }

    /// Whether samples carry a user stack to unwind (the layout the ring's records have).
    pub fn dwarf(&self) -> bool {
        self.dwarf.is_some()
    }

    /// The DWARF unwinder's counters (zero without one).
    pub fn unwind_counters(&self) -> UnwindCounters {
        self.dwarf.as_ref().map(|d| d.counters).unwrap_or_default()
    }

    /// A side-band record seen by this CPU's drain thread: an exec or an exit makes the
    /// process's unwinder stale (its maps are read again at its next sample).
    pub fn note_sideband(&mut self, sb: &SideBand) {
        let Some(d) = self.dwarf.as_mut() else { return };
        match *sb {
            SideBand::Comm { pid, exec: true, .. } => d.forget(pid),
            SideBand::Exit { pid, tid, .. } if pid == tid => d.forget(pid),
            _ => {}
        }
    }

    /// Intern the stack of a sample of the DWARF layout: the kernel frames of its chain
    /// (the kernel gives no user frames: `exclude_callchain_user`), then its user stack
    /// unwound from its registers and stack copy. Truncated when the kernel part was cut at
    /// `max_stack`, or the user part did not reach a root (the copy's end, a frame without
    /// unwind information and no frame pointer, the depth bound).
    pub fn intern_dwarf(
        &mut self,
        chain: &[u8],
        pid: u32,
        regs: Option<UserRegs>,
        stack: &[u8],
    ) -> StackId {
        if !self.take() {
            return 0;
        }
        let mut pcs = std::mem::take(&mut self.scratch);
        let mut truncated = process_chain(chain, self.max_stack, &mut pcs).unwrap_or(false);
        if let (Some(regs), Some(d)) = (regs, self.dwarf.as_mut()) {
            let room = self.max_stack.saturating_sub(pcs.len());
            if room == 0 {
                truncated = true;
            } else {
                truncated |= d.unwind(pid, regs, stack, room, &mut pcs);
            }
        }
        let id = if pcs.is_empty() {
            self.counters.empty += 1;
            0
        } else {
            self.intern_pcs(&pcs, truncated)
        };
        self.scratch = pcs;
        id
    }

    /// Intern a raw chain; returns its id (0: no frame, or a new stack while full). A stack
    /// seen before is found by its raw chain's key alone; only a new one is turned into pcs.
    pub fn intern(&mut self, chain: &[u8]) -> StackId {
        if !self.take() {
            return 0;
        }
        let key = Key::of(chain, self.seed);
        if let Some(id) = self.hit(key) {
            return id;
        }
        let mut pcs = std::mem::take(&mut self.scratch);
        let id = match process_chain(chain, self.max_stack, &mut pcs) {
            None => {
                self.counters.empty += 1;
                0
            }
            Some(truncated) => self.insert(key, &pcs, truncated),
        };
        self.scratch = pcs;
        id
    }

    /// Intern processed pcs (leaf first).
    pub fn intern_pcs(&mut self, pcs: &[u64], truncated: bool) -> StackId {
        let key = Key::of_pcs(pcs, self.seed);
        self.hit(key).unwrap_or_else(|| self.insert(key, pcs, truncated))
    }

    /// The id of the stack of `key` if the table holds it, counted as interned.
    fn hit(&mut self, key: Key) -> Option<StackId> {
        let e = self.index.find_mut(key.place, |e| e.key == key)?;
        e.last_gen = self.generation;
        self.counters.interned += 1;
        self.counters.truncated += u64::from(e.truncated);
        Some(e.slot + 1)
    }

    /// A new stack (not in the table): its id, or 0 when the table is full.
    fn insert(&mut self, key: Key, pcs: &[u64], truncated: bool) -> StackId {
        if self.index.len() >= self.capacity {
            self.counters.overflow += 1;
            return 0;
        }
        let entry = StackEntry { pcs: self.recycled.boxed(pcs), truncated };
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(entry);
                s
            }
            None => {
                self.slots.push(Some(entry));
                (self.slots.len() - 1) as u32
            }
        };
        let e = IndexEntry { key, slot, last_gen: self.generation, truncated };
        self.index.insert_unique(key.place, e, |e| e.key.place);
        self.counters.interned += 1;
        self.counters.truncated += u64::from(truncated);
        slot + 1
    }

    /// The stack of an id.
    pub fn get(&self, id: StackId) -> Option<&StackEntry> {
        self.slots.get(id.checked_sub(1)? as usize)?.as_ref()
    }

    /// Stacks held.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Half full: time to flush. The other half takes new stacks until the flush has pruned
    /// (a second at 4 kHz even when every stack is new, for a flush at most
    /// `EARLY_FLUSH_GAP` after the last and held up by load).
    pub fn past_high_water(&self) -> bool {
        self.index.len() >= self.capacity / 2
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// A drain thread begins a pass whose samples' ids the sink does not hold yet.
    pub fn begin_pass(&mut self) {
        if self.in_hand == 0 {
            self.in_hand_since = self.generation;
        }
        self.in_hand += 1;
    }

    /// The sink holds that pass's samples now (or the pass is abandoned).
    pub fn end_pass(&mut self) {
        self.in_hand = self.in_hand.saturating_sub(1);
    }

    /// Free every stack that is not `referenced` (by a sample pending in the aggregator or a
    /// count not yet taken) and not interned since a pass still in a drain thread's hands
    /// began, then start a new generation. Returns how many were freed.
    pub fn prune(&mut self, referenced: impl Fn(StackId) -> bool) -> usize {
        let keep_from = if self.in_hand > 0 { self.in_hand_since } else { u64::MAX };
        let mut freed = 0;
        let (slots, free, recycled, max_stack) =
            (&mut self.slots, &mut self.free, &mut self.recycled, self.max_stack);
        self.index.retain(|e| {
            if e.last_gen >= keep_from || referenced(e.slot + 1) {
                return true;
            }
            if let Some(s) = slots.get_mut(e.slot as usize).and_then(Option::take) {
                recycled.put(s.pcs, max_stack);
            }
            free.push(e.slot);
            freed += 1;
            false
        });
        self.generation += 1;
        freed
    }
}

/// Wakes the flusher for an early flush.
type Waker = Box<dyn Fn() + Send + Sync>;

/// The stack tables of every CPU (shared by the drain threads and the aggregator).
pub struct StackTables {
    cpus: Vec<Mutex<StackTable>>,
    /// `callchains = "dwarf"`: bytes of user stack each sample copies (0: frame pointers).
    user_stack: u32,
    /// `callchains = "dwarf"`: the state the CPUs' unwinders share.
    dwarf: Option<Arc<DwarfShared>>,
    max_stack: u16,
    /// `stack_one_in`: one sample in this many (at random) has its stack taken; a stack's
    /// count is multiplied by it when resolved.
    one_in: u32,
    /// `callchains = "auto"`: caller frames of frame-pointer functions are stepped by it.
    auto: bool,
    /// A table is past its high-water mark; cleared by the flusher as it flushes.
    flush_wanted: AtomicBool,
    early_flushes: AtomicU64,
    wake_flusher: OnceLock<Waker>,
}

impl std::fmt::Debug for StackTables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackTables")
            .field("cpus", &self.cpus.len())
            .field("max_stack", &self.max_stack)
            .field("flush_wanted", &self.flush_wanted)
            .finish_non_exhaustive()
    }
}

impl StackTables {
    /// `ncpus` tables; a CPU id beyond shares the table of `id % ncpus`.
    pub fn new(ncpus: usize, capacity: usize, max_stack: u16) -> Self {
        Self::build(ncpus, max_stack, 0, || StackTable::new(capacity, max_stack))
    }

    /// `callchains = "dwarf"` (or `"auto"`): tables whose samples carry `user_stack` bytes of
    /// user stack, unwound by one [`crate::perf::dwarf::DwarfUnwinder`] per CPU over one image
    /// cache of at most `cache_bytes`; with `auto`, caller frames of functions that keep a frame
    /// pointer are stepped by it ([`crate::perf::dwarf::walk`]).
    pub fn new_dwarf(
        ncpus: usize,
        capacity: usize,
        max_stack: u16,
        user_stack: u32,
        cache_bytes: usize,
        auto: bool,
    ) -> std::io::Result<Self> {
        let shared = DwarfShared::start(cache_bytes, Default::default())?;
        let mut t = Self::build(ncpus, max_stack, user_stack, || {
            let s = Arc::clone(&shared);
            let u = if auto { DwarfUnwinder::new_auto(s) } else { DwarfUnwinder::new(s) };
            StackTable::with_dwarf(capacity, max_stack, u)
        });
        t.dwarf = Some(shared);
        t.auto = auto;
        Ok(t)
    }

    /// Take one sample's stack in `n` (at random, per CPU: `stack_one_in`) in the tables of the
    /// first `sampled` slots (the CPUs' drain threads; not the off-CPU source's slot after
    /// them, whose stacks are all taken); each such stack then counts `n` samples. Before the
    /// drain threads start.
    pub fn set_one_in(&mut self, n: u32, sampled: usize) {
        self.one_in = n.max(1);
        for (i, t) in self.cpus.iter_mut().enumerate().take(sampled) {
            let seed = rand::random::<u64>() ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            t.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).set_one_in(n, seed);
        }
    }

    /// `stack_one_in`: the samples each stack the CPUs' tables took stands for.
    pub fn one_in(&self) -> u32 {
        self.one_in
    }

    /// Whether `callchains = "auto"`.
    pub fn auto(&self) -> bool {
        self.auto
    }

    fn build(
        ncpus: usize,
        max_stack: u16,
        user_stack: u32,
        table: impl Fn() -> StackTable,
    ) -> Self {
        Self {
            cpus: (0..ncpus.max(1)).map(|_| Mutex::new(table())).collect(),
            user_stack,
            dwarf: None,
            max_stack,
            one_in: 1,
            auto: false,
            flush_wanted: AtomicBool::new(false),
            early_flushes: AtomicU64::new(0),
            wake_flusher: OnceLock::new(),
        }
    }

    /// What wakes the flusher when a table asks for an early flush (set once).
    pub fn set_flusher_waker(&self, wake: Waker) {
        drop(self.wake_flusher.set(wake));
    }

    /// A drain thread found its table past the high-water mark: ask for a flush, waking the
    /// flusher once per request (not at every pass until it flushes).
    pub fn request_flush(&self) {
        if !self.flush_wanted.swap(true, Ordering::AcqRel) {
            if let Some(w) = self.wake_flusher.get() {
                w();
            }
        }
    }

    /// Whether an early flush is wanted.
    pub fn flush_wanted(&self) -> bool {
        self.flush_wanted.load(Ordering::Acquire)
    }

    /// The flusher is about to take the tables (`early`: before its interval was up, for
    /// this request): a table that fills again after this asks anew. Returns whether a flush
    /// was asked for (it must then take the stacks, so that the table is pruned).
    pub fn clear_flush_request(&self, early: bool) -> bool {
        let wanted = self.flush_wanted.swap(false, Ordering::AcqRel);
        if wanted && early {
            self.early_flushes.fetch_add(1, Ordering::Relaxed);
        }
        wanted
    }

    pub fn max_stack(&self) -> u16 {
        self.max_stack
    }

    /// Bytes of user stack a sample copies (`callchains = "dwarf"`), 0 for frame pointers.
    pub fn user_stack(&self) -> u32 {
        self.user_stack
    }

    /// `callchains = "dwarf"`: the state the CPUs' unwinders share.
    pub fn dwarf_shared(&self) -> Option<&Arc<DwarfShared>> {
        self.dwarf.as_ref()
    }

    /// The DWARF unwinders' counters summed over every CPU.
    pub fn unwind_counters(&self) -> UnwindCounters {
        let mut c = UnwindCounters::default();
        for t in &self.cpus {
            let u = t.lock().unwrap_or_else(std::sync::PoisonError::into_inner).unwind_counters();
            c.unwound += u.unwound;
            c.not_loaded += u.not_loaded;
            c.truncated += u.truncated;
            c.truncated_copy_end += u.truncated_copy_end;
            c.truncated_depth += u.truncated_depth;
            c.unwind_ns += u.unwind_ns;
            c.fp_steps += u.fp_steps;
        }
        c
    }

    pub fn len(&self) -> usize {
        self.cpus.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cpus.is_empty()
    }

    /// The table of `cpu`.
    pub fn cpu(&self, cpu: u32) -> MutexGuard<'_, StackTable> {
        let m = &self.cpus[cpu as usize % self.cpus.len()];
        m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counters, table sizes and bounds, for `dcpictl status`.
    pub fn report(&self) -> dcpi_proto::StackReport {
        let c = self.counters();
        let mut distinct = Vec::with_capacity(self.cpus.len());
        let mut capacity = 0;
        for t in &self.cpus {
            let t = t.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            distinct.push(t.len() as u64);
            capacity = t.capacity as u64;
        }
        dcpi_proto::StackReport {
            recorded: c.interned,
            truncated: c.truncated,
            overflow: c.overflow,
            empty: c.empty,
            distinct_per_cpu: distinct,
            capacity_per_cpu: capacity,
            max_stack: u64::from(self.max_stack),
            early_flushes: self.early_flushes.load(Ordering::Relaxed),
            dwarf: self.dwarf.as_ref().map(|d| {
                let u = self.unwind_counters();
                let l = d.loader_state();
                dcpi_proto::DwarfReport {
                    unwound: u.unwound,
                    fp_fallback: u.not_loaded,
                    truncated: u.truncated,
                    truncated_copy_end: u.truncated_copy_end,
                    truncated_depth: u.truncated_depth,
                    unwind_ms: u.unwind_ns as f64 / 1e6,
                    procs_loaded: l.procs_loaded,
                    loader_queue: l.queued,
                    load_panics: l.load_panics,
                    loader_running: l.running,
                    tables_bytes: l.cache_bytes,
                    tables_limit_bytes: l.cache_limit,
                    images: l.images,
                    auto: self.auto,
                    fp_steps: u.fp_steps,
                }
            }),
            one_in: u64::from(self.one_in),
            skipped: c.skipped,
        }
    }

    /// Counters summed over every CPU.
    pub fn counters(&self) -> StackCounters {
        let mut c = StackCounters::default();
        for t in &self.cpus {
            let t = t.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            c.interned += t.counters.interned;
            c.overflow += t.counters.overflow;
            c.truncated += t.counters.truncated;
            c.empty += t.counters.empty;
            c.skipped += t.counters.skipped;
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;

    fn raw(words: &[u64]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_ne_bytes()).collect()
    }

    const K: u64 = 0xffff_ffff_8100_0000;

    /// `stack_one_in`: a stack is taken with probability 1/N, at random (about N-th of the
    /// samples, not every N-th), the others skipped and counted; N = 1 takes every one.
    #[test]
    fn one_in_n_takes_a_random_share_of_the_stacks() {
        let chain = raw(&[PERF_CONTEXT_USER, 0x40_1000, 0x40_2005]);
        let mut all = StackTable::new(16, 64);
        assert!((0..1000).all(|_| all.intern(&chain) != 0));
        assert_eq!(all.counters.skipped, 0);
        let mut t = StackTable::new(16, 64);
        t.set_one_in(4, 12345);
        let taken: Vec<bool> = (0..40_000).map(|_| t.intern(&chain) != 0).collect();
        let n = taken.iter().filter(|&&x| x).count() as u64;
        // Binomial(40000, 1/4): mean 10000, standard deviation 87; 6 of them either side.
        assert!((9_480..=10_520).contains(&n), "{n} of 40000 taken");
        assert_eq!((t.counters.interned, t.counters.skipped), (n, 40_000 - n));
        // Not a rotation: the gaps between taken stacks vary.
        let idx: Vec<usize> = (0..taken.len()).filter(|&i| taken[i]).collect();
        let gaps: std::collections::HashSet<usize> = idx.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.len() > 10, "gaps {gaps:?}");
    }

    #[test]
    fn markers_dropped_and_return_addresses_minus_one() {
        let mut out = Vec::new();
        // A kernel-mode sample: kernel ip, two kernel returns, then the user pc at entry and
        // two user return addresses.
        let chain = raw(&[
            PERF_CONTEXT_KERNEL,
            K + 0x10,
            K + 0x20,
            K + 0x30,
            PERF_CONTEXT_USER,
            0x40_1000,
            0x40_2005,
            0x40_3009,
        ]);
        assert_eq!(process_chain(&chain, 64, &mut out), Some(false));
        assert_eq!(out, [K + 0x10, K + 0x1f, K + 0x2f, 0x40_1000, 0x40_2004, 0x40_3008]);
        // Guest and hypervisor frames are dropped; a chain of markers only has no stack.
        let chain = raw(&[-32i64 as u64, 0x1234, PERF_CONTEXT_USER, 0x40_1000, 0x40_2005]);
        assert_eq!(process_chain(&chain, 64, &mut out), Some(false));
        assert_eq!(out, [0x40_1000, 0x40_2004]);
        assert_eq!(process_chain(&raw(&[PERF_CONTEXT_USER]), 64, &mut out), None);
        assert_eq!(process_chain(&[1, 2, 3], 64, &mut out), None, "partial word");
    }

    #[test]
    fn truncation_is_counted() {
        let mut out = Vec::new();
        // The user unwinder found no caller: only the leaf.
        let chain = raw(&[PERF_CONTEXT_USER, 0x40_1000]);
        assert_eq!(process_chain(&chain, 64, &mut out), Some(true));
        // The kernel cut the chain at max_stack frames.
        let deep: Vec<u64> =
            std::iter::once(PERF_CONTEXT_USER).chain((0..8).map(|i| 0x40_0000 + i * 16)).collect();
        assert_eq!(process_chain(&raw(&deep), 8, &mut out), Some(true));
        assert_eq!(process_chain(&raw(&deep), 9, &mut out), Some(false));
        // A kernel thread's stack has no user part: complete.
        let chain = raw(&[PERF_CONTEXT_KERNEL, K, K + 8]);
        assert_eq!(process_chain(&chain, 64, &mut out), Some(false));
        let mut t = StackTable::new(16, 64);
        let a = t.intern(&raw(&[PERF_CONTEXT_USER, 0x40_1000]));
        let b = t.intern(&raw(&[PERF_CONTEXT_USER, 0x40_1000, 0x40_2000]));
        t.intern(&raw(&[PERF_CONTEXT_USER, 0x40_1000]));
        assert!(a != 0 && b != 0 && a != b);
        assert_eq!((t.counters.interned, t.counters.truncated), (3, 2));
        assert!(t.get(a).unwrap().truncated && !t.get(b).unwrap().truncated);
    }

    #[test]
    fn hot_stack_is_one_entry_and_full_table_overflows() {
        let mut t = StackTable::new(2, 64);
        let s1 = raw(&[PERF_CONTEXT_USER, 1, 2, 3]);
        let s2 = raw(&[PERF_CONTEXT_USER, 1, 5, 3]);
        let s3 = raw(&[PERF_CONTEXT_USER, 9, 9, 9]);
        let id1 = t.intern(&s1);
        for _ in 0..100 {
            assert_eq!(t.intern(&s1), id1);
        }
        let id2 = t.intern(&s2);
        assert_eq!(t.len(), 2);
        assert_eq!(t.intern(&s3), 0, "full: not recorded");
        assert_eq!(t.counters.overflow, 1);
        assert_eq!(&*t.get(id2).unwrap().pcs, &[1, 4, 2]);
    }

    #[test]
    fn a_pruned_stack_gives_its_pcs_to_the_next_new_stack_of_its_length() {
        let mut t = StackTable::new(8, 64);
        let old = t.intern(&raw(&[PERF_CONTEXT_USER, 1, 2, 3]));
        let ptr = t.get(old).unwrap().pcs.as_ptr();
        assert_eq!(t.prune(|_| false), 1);
        // Another length allocates; the same length takes the kept box, with its own pcs.
        let short = t.intern(&raw(&[PERF_CONTEXT_USER, 5, 6]));
        assert_ne!(t.get(short).unwrap().pcs.as_ptr(), ptr);
        let same = t.intern(&raw(&[PERF_CONTEXT_USER, 9, 8, 7]));
        assert_eq!(t.get(same).unwrap().pcs.as_ptr(), ptr, "the pruned stack's box reused");
        assert_eq!(&*t.get(same).unwrap().pcs, &[9, 7, 6]);
        assert_eq!(t.intern(&raw(&[PERF_CONTEXT_USER, 9, 8, 7])), same, "found by its new pcs");
        // The pool is bounded: a prune of more than RECYCLED_MAX stacks keeps that many.
        let mut big = StackTable::new(RECYCLED_MAX + 10, 64);
        for i in 0..(RECYCLED_MAX as u64 + 10) {
            big.intern(&raw(&[PERF_CONTEXT_USER, 100 + i]));
        }
        assert_eq!(big.prune(|_| false), RECYCLED_MAX + 10);
        assert_eq!(big.recycled.count, RECYCLED_MAX);
        assert_eq!(big.recycled.by_len[1].len(), RECYCLED_MAX);
    }

    #[test]
    fn prune_frees_what_nothing_names_and_ids_stay_stable() {
        let mut t = StackTable::new(2, 64);
        // A pass in a drain thread's hands: what it interned survives prunes until it ends.
        t.begin_pass();
        let hot = t.intern(&raw(&[PERF_CONTEXT_USER, 1, 2]));
        let pending = t.intern(&raw(&[PERF_CONTEXT_USER, 3, 4]));
        assert_eq!(t.prune(|_| false), 0);
        assert_eq!(t.prune(|_| false), 0, "still in hand, however many prunes pass");
        t.end_pass();
        // In the sink now: only what it still names is kept.
        assert_eq!(t.prune(|id| id == pending), 1, "hot: counted and taken, so freed");
        assert!(t.get(hot).is_none());
        assert_eq!(t.get(pending).unwrap().pcs.len(), 2);
        // The freed slot is reused; the table has room again.
        let new = t.intern(&raw(&[PERF_CONTEXT_USER, 7, 8]));
        assert_eq!(new, hot);
        assert_eq!(t.counters.overflow, 0);
        assert_eq!(t.get(pending).unwrap().pcs.len(), 2, "ids stay stable while entries live");
        // A pass in hand keeps what was interned in the generation it began in (it may have
        // been interned by that pass), and nothing older.
        t.begin_pass();
        assert_eq!(t.prune(|_| false), 1, "pending: last interned generations before the pass");
        assert!(t.get(pending).is_none());
        assert!(t.get(new).is_some(), "interned in the generation the pass in hand began in");
        t.end_pass();
        t.begin_pass();
        assert_eq!(t.prune(|_| false), 1, "interned before the pass in hand began");
        let again = t.intern(&raw(&[PERF_CONTEXT_USER, 7, 8]));
        assert_eq!(t.prune(|_| false), 0, "interned by the pass in hand");
        t.end_pass();
        assert_eq!(t.prune(|_| false), 1);
        assert!(t.get(again).is_none());
    }

    /// Many stacks interned, pruned and interned again (slots reused, the index rehashed as
    /// it grows): every live id still names the pcs it was interned with, and interning its
    /// chain again finds it.
    #[test]
    fn ids_name_their_stacks_through_prunes_and_reuse() {
        use rand::{RngExt, SeedableRng};
        let mut rng = StdRng::seed_from_u64(7);
        let mut t = StackTable::new(1500, 64);
        let mut live: Vec<(StackId, Vec<u64>, Vec<u8>)> = Vec::new();
        for round in 0..20 {
            for _ in 0..1000 {
                let depth = rng.random_range(1..12);
                let pcs: Vec<u64> = (0..depth).map(|_| rng.random_range(0..64u64)).collect();
                let mut chain = vec![PERF_CONTEXT_USER];
                chain.extend(pcs.iter().enumerate().map(|(i, &p)| if i == 0 { p } else { p + 1 }));
                let chain = raw(&chain);
                let id = t.intern(&chain);
                if id != 0 {
                    live.push((id, pcs, chain));
                }
            }
            for (id, pcs, chain) in &live {
                assert_eq!(&*t.get(*id).expect("live id").pcs, &pcs[..], "round {round}");
                assert_eq!(t.intern(chain), *id, "round {round}: found again");
            }
            // Keep a random third named; the rest may go.
            live.retain(|_| rng.random_range(0..3) == 0);
            let keep: std::collections::HashSet<StackId> = live.iter().map(|l| l.0).collect();
            t.prune(|id| keep.contains(&id));
            assert_eq!(t.len(), keep.len(), "round {round}: only the named stacks stay");
        }
    }

    /// Stacks interned as pcs (DWARF, off-CPU) are found by their pcs; tables of different
    /// seeds give the same answers (the seed only places entries).
    #[test]
    fn pcs_are_found_by_their_own_key_whatever_the_seed() {
        for _ in 0..4 {
            let mut t = StackTable::new(64, 64);
            let a = t.intern_pcs(&[0x40_1000, 0x40_2004], false);
            let b = t.intern_pcs(&[0x40_1000, 0x40_2005], true);
            let c = t.intern_pcs(&[0x40_1000], false);
            assert!(a != 0 && b != 0 && c != 0 && a != b && b != c && a != c);
            assert_eq!(t.intern_pcs(&[0x40_1000, 0x40_2004], false), a);
            assert_eq!(t.intern_pcs(&[0x40_1000, 0x40_2005], true), b);
            assert_eq!(t.len(), 3);
            assert_eq!((t.counters.interned, t.counters.truncated), (5, 2));
            assert_eq!(&*t.get(b).unwrap().pcs, &[0x40_1000, 0x40_2005]);
        }
    }

    /// Two drain threads on one table (a CPU id beyond the count at start): the stacks of the
    /// older pass stay until both passes are handed over.
    #[test]
    fn passes_of_two_threads_on_one_table_keep_the_older_ones_stacks() {
        let mut t = StackTable::new(4, 64);
        t.begin_pass();
        let a = t.intern(&raw(&[PERF_CONTEXT_USER, 1]));
        assert_eq!(t.prune(|_| false), 0);
        t.begin_pass();
        let b = t.intern(&raw(&[PERF_CONTEXT_USER, 2]));
        t.end_pass();
        assert_eq!(t.prune(|_| false), 0, "a's pass may be the one still in hand");
        assert!(t.get(a).is_some() && t.get(b).is_some());
        t.end_pass();
        assert_eq!(t.prune(|_| false), 2);
    }
}
