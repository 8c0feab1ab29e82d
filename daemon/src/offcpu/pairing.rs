//! Pairing of switch-outs with switch-ins across CPUs (pure; no perf, no threads).
//!
//! A thread leaves the CPU on one CPU and comes back on any CPU, and each CPU's records are
//! in that CPU's ring: the records of one thread's wait are in two rings, read in whatever
//! order. So every switch is buffered, and only those at or below a *watermark* (a time
//! below which every ring has been read) are processed, in time order. A switch-out that was
//! voluntary (the thread blocked, not preempted) opens a wait; the thread's next switch-in
//! closes it and yields a [`Wait`] weighted by its length in nanoseconds.
//!
//! Lost records: a switch-in without an open wait is ignored; a second switch-out while a
//! wait is open (its switch-in was lost) replaces it, and the lost one is counted in
//! `unpaired`. A thread that exits while off-CPU never switches in: its `PERF_RECORD_EXIT`
//! closes (drops) its wait, and the final switch-out of the dead task that follows the exit
//! is ignored. Memory is bounded whatever is lost: at most `max_threads` open waits (past
//! it the oldest eighth is dropped, counted in `evicted`), and exit marks older than
//! [`EXIT_MARK_NS`] or beyond `max_threads` are forgotten.

use hashbrown::HashMap;

/// How long the mark of an exited thread is kept (its final switch-out comes microseconds
/// after its exit record).
pub const EXIT_MARK_NS: u64 = 10_000_000_000;

/// The stack of a switch-out sample: pcs leaf first (kernel frames first, then user frames),
/// as `perf::callchain::process_chain` makes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocking {
    pub pid: u32,
    /// Where the wait is attributed in flat profiles: the user pc at which the thread entered
    /// the kernel, or for a kernel thread the sample's kernel pc.
    pub pc: u64,
    pub kernel: bool,
    /// Leaf-first frames; empty when call stacks are off or the chain was empty. The buffer
    /// the switch sample's chain was processed into, moved here (not copied) and recycled
    /// once the wait is emitted (`super::Reader::emit`).
    pub pcs: Vec<u64>,
    pub truncated: bool,
}

/// What a record says about a thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The thread left the CPU; `voluntary` false when it was preempted (still runnable,
    /// `PERF_RECORD_MISC_SWITCH_OUT_PREEMPT`); `blocking` is its switch sample, `None` if
    /// that was lost.
    Out { voluntary: bool, blocking: Option<Blocking> },
    /// The thread runs again.
    In,
    /// `PERF_RECORD_EXIT` of the thread.
    Exit,
}

/// One switch record (perf clock, nanoseconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Switch {
    pub time: u64,
    pub tid: u32,
    pub kind: Kind,
}

/// One finished wait.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wait {
    pub tid: u32,
    pub start: u64,
    pub end: u64,
    pub blocking: Blocking,
}

impl Wait {
    pub fn ns(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }
}

/// Counters since the start (monotonic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairingCounters {
    /// Switch-outs processed (voluntary or not).
    pub switch_outs: u64,
    /// Voluntary switch-outs (waits opened).
    pub voluntary: u64,
    /// Waits closed by a switch-in.
    pub waits: u64,
    /// Waits whose switch-in was lost (replaced by the thread's next switch-out).
    pub unpaired: u64,
    /// Waits opened without their switch sample (lost): timed, not attributed.
    pub unattributed: u64,
    /// Open waits dropped at the `max_threads` bound.
    pub evicted: u64,
    /// Open waits dropped because their thread exited.
    pub exited: u64,
    /// Records that arrived below the watermark already processed (a ring read late).
    pub late: u64,
}

/// An open wait: its start and its blocking stack (an index into [`Pairing::slab`], or
/// [`NO_STACK`]).
#[derive(Clone, Copy, Debug)]
struct Open {
    start: u64,
    blocking: u32,
}

/// `Buffered::what` of a switch-in, an exit, a preempted switch-out and a voluntary one whose
/// sample was lost; any other value is the slab index of a voluntary switch-out's stack.
const IN: u32 = u32::MAX;
const EXIT: u32 = u32::MAX - 1;
const PREEMPTED: u32 = u32::MAX - 2;
const NO_STACK: u32 = u32::MAX - 3;

/// A buffered record, 16 bytes: sorting and moving these is what a pass does with every
/// switch, so the stack (a `Blocking` with its buffer, 56 bytes) waits in the slab instead.
/// (With the stack inline, a record was 72 bytes, and the stable sort's scratch buffer for a
/// pass of a few thousand records was past malloc's mmap threshold: an mmap, its page faults
/// and a munmap per pass, ~10 % of the reading thread in a profile of the release build.)
#[derive(Clone, Copy, Debug)]
struct Buffered {
    time: u64,
    tid: u32,
    what: u32,
}

/// The pairing state; see the module docs.
#[derive(Debug)]
pub struct Pairing {
    buffered: Vec<Buffered>,
    /// Stacks of buffered or open voluntary switch-outs; `free` lists the empty entries.
    slab: Vec<Option<Blocking>>,
    free: Vec<u32>,
    open: HashMap<u32, Open>,
    exited: HashMap<u32, u64>,
    max_threads: usize,
    processed_until: u64,
    pub counters: PairingCounters,
}

impl Pairing {
    pub fn new(max_threads: usize) -> Self {
        Self {
            buffered: Vec::new(),
            slab: Vec::new(),
            free: Vec::new(),
            open: HashMap::new(),
            exited: HashMap::new(),
            max_threads: max_threads.max(8),
            processed_until: 0,
            counters: PairingCounters::default(),
        }
    }

    /// Buffer one record (any order).
    pub fn push(&mut self, s: Switch) {
        if s.tid == 0 {
            // The idle task is never counted.
            return;
        }
        if s.time <= self.processed_until {
            self.counters.late += 1;
        }
        let what = match s.kind {
            Kind::In => IN,
            Kind::Exit => EXIT,
            Kind::Out { voluntary: false, .. } => PREEMPTED,
            Kind::Out { voluntary: true, blocking: None } => NO_STACK,
            Kind::Out { voluntary: true, blocking: Some(b) } => self.store(b),
        };
        self.buffered.push(Buffered { time: s.time, tid: s.tid, what });
    }

    fn store(&mut self, b: Blocking) -> u32 {
        if let Some(i) = self.free.pop() {
            self.slab[i as usize] = Some(b);
            return i;
        }
        self.slab.push(Some(b));
        // Bounded by the open waits and one pass's buffered records: far below NO_STACK.
        u32::try_from(self.slab.len() - 1).unwrap_or(NO_STACK)
    }

    fn take(&mut self, i: u32) -> Option<Blocking> {
        let b = self.slab.get_mut(i as usize)?.take();
        if b.is_some() {
            self.free.push(i);
        }
        b
    }

    /// Waits open now.
    pub fn open_waits(&self) -> usize {
        self.open.len()
    }

    /// Records buffered above the last watermark.
    pub fn buffered(&self) -> usize {
        self.buffered.len()
    }

    /// Process every buffered record at or below `watermark`, in time order, appending the
    /// waits they close to `out`.
    pub fn advance(&mut self, watermark: u64, out: &mut Vec<Wait>) {
        // Stable: records of one ring with equal times keep their ring order. Each ring's
        // records are in time order already, and the stable sort merges such runs (in a
        // profile the unstable one, which does not look for runs, took 16 % of the thread).
        self.buffered.sort_by_key(|b| b.time);
        let n = self.buffered.partition_point(|b| b.time <= watermark);
        let mut buf = std::mem::take(&mut self.buffered);
        for b in buf.drain(..n) {
            self.apply(b, out);
        }
        self.buffered = buf;
        self.processed_until = self.processed_until.max(watermark);
        let horizon = watermark.saturating_sub(EXIT_MARK_NS);
        if self.exited.len() > self.max_threads {
            self.exited.clear();
        } else {
            self.exited.retain(|_, t| *t >= horizon);
        }
    }

    /// Drop an open wait (and its stack).
    fn close(&mut self, tid: u32) -> bool {
        match self.open.remove(&tid) {
            Some(o) => {
                drop(self.take(o.blocking));
                true
            }
            None => false,
        }
    }

    fn apply(&mut self, b: Buffered, out: &mut Vec<Wait>) {
        match b.what {
            IN => {
                let Some(o) = self.open.remove(&b.tid) else { return };
                let Some(blocking) = self.take(o.blocking) else { return };
                self.counters.waits += 1;
                out.push(Wait { tid: b.tid, start: o.start, end: b.time, blocking });
            }
            EXIT => {
                if self.close(b.tid) {
                    self.counters.exited += 1;
                }
                self.exited.insert(b.tid, b.time);
            }
            what => {
                self.counters.switch_outs += 1;
                if let Some(&t) = self.exited.get(&b.tid) {
                    if b.time >= t {
                        // The dead task's last switch: it never runs again.
                        self.exited.remove(&b.tid);
                        drop(self.take(what));
                        return;
                    }
                }
                if self.close(b.tid) {
                    self.counters.unpaired += 1;
                }
                if what == PREEMPTED {
                    return;
                }
                self.counters.voluntary += 1;
                if what == NO_STACK {
                    self.counters.unattributed += 1;
                }
                if self.open.len() >= self.max_threads {
                    self.evict_oldest();
                }
                self.open.insert(b.tid, Open { start: b.time, blocking: what });
            }
        }
    }

    /// Drop the oldest eighth of the open waits (one pass to find the cut).
    fn evict_oldest(&mut self) {
        let mut starts: Vec<u64> = self.open.values().map(|o| o.start).collect();
        let k = (starts.len() / 8).max(1) - 1;
        let (_, cut, _) = starts.select_nth_unstable(k);
        let cut = *cut;
        let before = self.open.len();
        let mut dropped = Vec::new();
        self.open.retain(|_, o| {
            let keep = o.start > cut;
            if !keep {
                dropped.push(o.blocking);
            }
            keep
        });
        for i in dropped {
            drop(self.take(i));
        }
        self.counters.evicted += (before - self.open.len()) as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blk(pc: u64) -> Blocking {
        Blocking { pid: 7, pc, kernel: false, pcs: vec![pc], truncated: false }
    }
    fn out(time: u64, tid: u32, pc: u64) -> Switch {
        Switch { time, tid, kind: Kind::Out { voluntary: true, blocking: Some(blk(pc)) } }
    }
    fn preempt(time: u64, tid: u32) -> Switch {
        Switch { time, tid, kind: Kind::Out { voluntary: false, blocking: Some(blk(1)) } }
    }
    fn sin(time: u64, tid: u32) -> Switch {
        Switch { time, tid, kind: Kind::In }
    }

    #[test]
    fn waits_pair_across_cpus_whatever_the_order_records_arrive_in() {
        let mut p = Pairing::new(1024);
        let mut w = Vec::new();
        // CPU 1's ring (the switch-ins) is read before CPU 0's (the switch-outs).
        p.push(sin(150, 10));
        p.push(sin(400, 10));
        p.push(sin(260, 11));
        p.push(out(100, 10, 0xa));
        p.push(out(300, 10, 0xb));
        p.push(out(200, 11, 0xc));
        p.advance(1000, &mut w);
        let got: Vec<(u32, u64, u64)> = w.iter().map(|w| (w.tid, w.blocking.pc, w.ns())).collect();
        assert_eq!(got, vec![(10, 0xa, 50), (11, 0xc, 60), (10, 0xb, 100)]);
        assert_eq!(p.open_waits(), 0);
    }

    #[test]
    fn records_above_the_watermark_wait_for_it() {
        let mut p = Pairing::new(1024);
        let mut w = Vec::new();
        p.push(out(100, 10, 0xa));
        p.push(sin(500, 10));
        p.advance(300, &mut w);
        assert!(w.is_empty());
        assert_eq!((p.open_waits(), p.buffered()), (1, 1));
        p.advance(600, &mut w);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].ns(), 400);
    }

    #[test]
    fn preemption_is_not_off_cpu_time() {
        let mut p = Pairing::new(1024);
        let mut w = Vec::new();
        p.push(preempt(100, 10));
        p.push(sin(900, 10));
        p.advance(1000, &mut w);
        assert!(w.is_empty());
        assert_eq!(p.counters.switch_outs, 1);
        assert_eq!(p.counters.voluntary, 0);
    }

    #[test]
    fn idle_task_is_never_counted() {
        let mut p = Pairing::new(1024);
        let mut w = Vec::new();
        p.push(out(100, 0, 0xa));
        p.push(sin(200, 0));
        p.advance(1000, &mut w);
        assert!(w.is_empty());
        assert_eq!(p.counters.switch_outs, 0);
    }

    #[test]
    fn lost_records_lose_one_wait_not_the_pairing() {
        let mut p = Pairing::new(1024);
        let mut w = Vec::new();
        // Switch-in at 150 lost: the next switch-out replaces the open wait.
        p.push(out(100, 10, 0xa));
        p.push(out(200, 10, 0xb));
        p.push(sin(230, 10));
        // Switch-out of tid 11 lost: its switch-in is ignored.
        p.push(sin(240, 11));
        // Sample lost: the wait is timed but not attributed.
        p.push(Switch { time: 300, tid: 12, kind: Kind::Out { voluntary: true, blocking: None } });
        p.push(sin(350, 12));
        p.advance(1000, &mut w);
        let got: Vec<(u32, u64)> = w.iter().map(|w| (w.tid, w.ns())).collect();
        assert_eq!(got, vec![(10, 30)]);
        assert_eq!(p.counters.unpaired, 1);
        assert_eq!(p.counters.unattributed, 1);
        assert_eq!(p.open_waits(), 0);
    }

    #[test]
    fn a_thread_that_exits_off_cpu_leaves_nothing_behind() {
        let mut p = Pairing::new(1024);
        let mut w = Vec::new();
        p.push(out(100, 10, 0xa));
        p.push(Switch { time: 150, tid: 10, kind: Kind::Exit });
        // The dead task's final switch-out, after its exit record.
        p.push(out(160, 10, 0xb));
        p.advance(1000, &mut w);
        assert!(w.is_empty());
        assert_eq!(p.open_waits(), 0);
        assert_eq!(p.counters.exited, 1);
        // The tid is reused later: a new thread pairs normally.
        p.push(out(2000, 10, 0xc));
        p.push(sin(2100, 10));
        p.advance(3000, &mut w);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].blocking.pc, 0xc);
    }

    #[test]
    fn memory_stays_bounded_when_threads_never_come_back() {
        let max = 64;
        let mut p = Pairing::new(max);
        let mut w = Vec::new();
        // 10 000 threads block and vanish without exit records (all lost).
        for tid in 1..=10_000u32 {
            p.push(out(u64::from(tid) * 10, tid, 0xa));
            if tid % 100 == 0 {
                p.advance(u64::from(tid) * 10, &mut w);
                assert!(p.open_waits() <= max, "{} open", p.open_waits());
            }
        }
        p.advance(u64::MAX, &mut w);
        assert!(p.open_waits() <= max);
        assert!(p.counters.evicted >= 10_000 - max as u64);
        // The stacks of evicted waits were dropped: only the open waits hold one.
        assert_eq!(p.slab.iter().flatten().count(), p.open_waits());
        // The newest survive: the last thread's wait still pairs.
        p.push(sin(200_000, 10_000));
        p.advance(u64::MAX, &mut w);
        assert_eq!(w.len(), 1);
        // Exit marks are bounded too.
        for tid in 20_000..30_000u32 {
            p.push(Switch { time: 300_000, tid, kind: Kind::Exit });
        }
        p.advance(u64::MAX, &mut w);
        assert!(p.exited.len() <= max);
    }
}
