//! The drain pass: a drain thread's loop over its CPU's ring.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;

use crate::perf::records::{self, Record};
use crate::perf::redraw::{self, RedrawSchedule};
use crate::perf::ring::{RingBuffer, RingReader};
use crate::sys::perf as sp;
use crate::sys::time::{monotonic_ns, thread_cpu_ns};
use crate::types::{EventIdx, Sample, TimedSideBand};

use super::{lock, CpuRing, CpuStats, Shared, NO_CLOCK};
use crate::perf::callchain::StackTable;
use crate::sys;

/// `drained_until` lags the clock read before `data_head` by this much, for records whose time
/// was taken just before they were written.
pub(super) const DRAIN_SLACK_NS: u64 = 1_000_000;

/// How often each drain thread reads `time_enabled/time_running` of its fds between cuts: they
/// go into the summary at flushes (5 s by default), and each cut (a flush, a new epoch) and the
/// thread's stop read them once more, so a read at most every few wake-ups (a syscall each) is
/// enough.
pub(super) const TIMES_INTERVAL_NS: u64 = 5_000_000_000;

/// At most one loss/throttle warning per CPU per this interval.
pub(super) const WARN_INTERVAL: Duration = Duration::from_secs(60);

/// The period in force for one event on one CPU, and the ones before the re-arms that samples
/// not yet read may straddle.
#[derive(Clone, Debug)]
pub(super) struct PeriodState {
    cur: u64,
    /// `(switch time, period before it)` of the switches that samples not yet read may
    /// straddle, oldest first: a sample with TIME before a switch was taken under the period
    /// before it. Emptied as passes read past them (a few entries at most).
    switches: Vec<(u64, u64)>,
}

impl PeriodState {
    pub(super) fn new(period: u64) -> Self {
        Self { cur: period, switches: Vec::new() }
    }

    pub(super) fn at(&self, time: u64) -> u64 {
        self.switches.iter().find(|&&(t, _)| time < t).map_or(self.cur, |&(_, before)| before)
    }

    pub(super) fn switch(&mut self, at: u64, period: u64) {
        self.switches.push((at, self.cur));
        self.cur = period;
    }

    /// Every sample with TIME before `until` has been read.
    pub(super) fn read_until(&mut self, until: u64) {
        self.switches.retain(|&(t, _)| t > until);
    }
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

/// [`read_pass`] of events opened with `PERF_SAMPLE_CALLCHAIN` when `stacks` is given: each
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
    mut stacks: Option<&mut StackTable>,
) -> PassCounts {
    let layout = records::SampleLayout {
        callchain: stacks.is_some(),
        user_stack: stacks.as_deref().is_some_and(StackTable::dwarf),
    };
    let mut c = PassCounts::default();
    per_event.iter_mut().for_each(|x| *x = 0);
    let before = samples.len();
    samples.reserve(1024);
    let ds = reader.drain(ring, |rec| match records::parse_record_layout(rec, layout) {
        Record::Sample(s) => {
            let Some(idx) = ids.iter().position(|&id| id == s.identifier) else {
                c.malformed += 1;
                return;
            };
            per_event[idx] += 1;
            let stack = match stacks.as_deref_mut() {
                Some(t) if layout.user_stack => t.intern_dwarf(
                    records::sample_callchain(&s, rec.body),
                    s.pid,
                    s.user_regs,
                    records::sample_user_stack(&s, rec.body),
                ),
                Some(t) => t.intern(records::sample_callchain(&s, rec.body)),
                None => 0,
            };
            samples.push(Sample {
                time: s.time,
                pid: s.pid,
                tid: s.tid,
                pc: s.ip,
                event: idx as EventIdx,
                period: period_at(idx, s.time),
                kernel: s.kernel,
                cgroup: s.cgroup,
                stack,
            });
        }
        Record::SideBand(sb) => {
            if let Some(t) = stacks.as_deref_mut() {
                t.note_sideband(&sb.record);
            }
            sideband.push(sb)
        }
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
    /// `monotonic_ns` at the start of the last pass.
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
        let full = table.as_deref().is_some_and(StackTable::past_high_water);
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
                drop(fd.disable());
            }
            (false, true)
        } else {
            let r = self.wait();
            if r.woken {
                self.honour_barrier();
                // A cut (flush, new epoch) is asking: the counters' times go with the samples
                // of this pass, so an epoch's summary says how long it was sampled to within
                // the cut, not up to TIMES_INTERVAL_NS late (dcpidiff divides counts by it).
                self.read_times(true);
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

pub(super) fn drain_thread(shared: &Shared, stats: &CpuStats, ring: CpuRing) {
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
    if let Some(id) = sys::time::own_thread_clock() {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
