//! The periodic flush on its own thread, and the CPU time of its stages.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::config::EpochInterval;
use crate::status::RecentWindow;
use crate::store::EpochSchedule;

use super::shared::{lock, read, Shared};
use super::shutdown::STOP_WAIT;
use super::ServiceError;
use crate::perf::sampler::SamplerStatus;
use crate::perf::sampler::MAX_READ_EVERY;
use crate::perf::Sampler;
use crate::sys;
use crate::sys::malloc;
use crate::sys::sock;

/// Returning freed heap to the kernel after a flush (past `malloc::KEEP_FREE`), at most this
/// often (`sys::malloc`).
pub(super) const TRIM_EVERY: Duration = Duration::from_secs(60);

/// One flush tick as recorded for `status`'s recent window ([`Shared::recent_window`]).
pub(super) struct Tick {
    pub(super) at: Instant,
    /// Samples so far.
    pub(super) samples: u64,
    /// Daemon CPU seconds.
    pub(super) cpu_s: f64,
    /// Per CPU (cpu, drain wake-ups, drain CPU ns).
    pub(super) per_cpu: Vec<(u32, u64, u64)>,
    /// Resolver thread (wake-ups, CPU ns).
    pub(super) resolver: (u64, u64),
}
pub(super) const FLUSH_THREAD: &str = "dcpid-flush";

/// How old a drain thread's last read of its ring must be for a timed wake-up to read it again
/// (`SamplerConfig::read_every`): fewer, bigger passes are cheaper per sample, and a third of
/// the flush interval keeps what a flush (or a kill -9) leaves behind within a few seconds.
/// Fixed at start: a reload that changes `flush_interval` keeps it.
pub(super) fn read_every(flush_interval: Duration) -> Duration {
    (flush_interval / 3).min(MAX_READ_EVERY)
}

/// The periodic flush, on its own thread: a publish that hangs on a dead NFS server must
/// neither stop the watchdog pings (which only speak for the drain threads) nor the stop path.
pub(super) struct Flusher {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// How often, at least, the flush thread re-reads the online CPU list (CPU hotplug); with a
/// `flush_interval` at most this long (the default), every flush's wake-up does it. Every
/// wake-up of a thread that slept for seconds costs far more than its work on a busy VM (the
/// "checks" stage of `bench/stacks.py`: up to 0.47 ms/s for a read of one sysfs file every
/// 5 s), and CPUs come and go rarely: 15 s late to sample a new CPU is the price.
pub(super) const HOTPLUG_EVERY: Duration = Duration::from_secs(15);

/// Past a slice boundary by this much when the flush thread wakes for it: the wall clock read
/// then is past the boundary, however the monotonic instant was rounded.
const BOUNDARY_SLACK: Duration = Duration::from_millis(1);

fn since_unix(t: SystemTime) -> Duration {
    t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
}

/// The last slice boundary (a multiple of `slice` in Unix time, FORMAT.md §14) in
/// `(from, to]`, if any. `slice` zero: no slices, none.
pub(super) fn last_boundary(
    from: SystemTime,
    to: SystemTime,
    slice: Duration,
) -> Option<SystemTime> {
    let s = slice.as_nanos();
    if s == 0 {
        return None;
    }
    let (f, t) = (since_unix(from).as_nanos() / s, since_unix(to).as_nanos() / s);
    let b = u64::try_from(t * s).ok()?;
    (t > f).then(|| std::time::UNIX_EPOCH + Duration::from_nanos(b))
}

/// How long from `now` until just past the first slice boundary after `last` (zero if that
/// boundary has already passed); `None` without slices.
pub(super) fn until_next_boundary(
    last: SystemTime,
    now: SystemTime,
    slice: Duration,
) -> Option<Duration> {
    let s = slice.as_nanos();
    if s == 0 {
        return None;
    }
    let next = (since_unix(last).as_nanos() / s + 1) * s;
    let now = since_unix(now).as_nanos();
    let wait = u64::try_from(next.saturating_sub(now)).unwrap_or(u64::MAX);
    Some(if wait == 0 { Duration::ZERO } else { Duration::from_nanos(wait) + BOUNDARY_SLACK })
}

/// At most this many flush ticks are kept for the recent window: early flushes (a full stack
/// table) every [`EARLY_FLUSH_GAP`] under a long flush interval must not grow the list.
const MAX_TICKS: usize = 64;

/// Drops the oldest ticks while the next oldest still lies `span` or more before the newest
/// (or while there are more than [`MAX_TICKS`]); at least two are kept.
pub(super) fn keep_span(t: &mut std::collections::VecDeque<Tick>, span: Duration) {
    let Some(newest) = t.back().map(|b| b.at) else { return };
    while t.len() > 2
        && (t.len() > MAX_TICKS
            || t.get(1).is_some_and(|n| newest.saturating_duration_since(n.at) >= span))
    {
        t.pop_front();
    }
}

/// The shortest time between two flushes when a stack table asks for an early one. A table
/// holds one flush interval's distinct stacks: at 4 kHz per CPU, half a second of them fits in
/// half the default table even when every stack is new.
pub(super) const EARLY_FLUSH_GAP: Duration = Duration::from_millis(500);

impl Flusher {
    pub(super) fn spawn(shared: &Arc<Shared>) -> Result<Self, ServiceError> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        // A tick at the start: the first flush's window then spans its whole interval, even
        // when a slice boundary's flush follows it closely.
        {
            let status = read(&shared.sampler).as_ref().map(Sampler::status);
            shared.record_tick(status.as_ref(), read(&shared.settings).flush_interval);
        }
        let thread = {
            let shared = Arc::clone(shared);
            let stop = Arc::clone(&stop);
            let watch = Arc::clone(&shared.watch);
            Arc::clone(&watch)
                .spawn(FLUSH_THREAD.into(), true, move || {
                    let mut last = Instant::now();
                    // When the last flush began, in Unix time: a slice boundary after it is
                    // due a flush of its own (`flush_tick`'s `boundary`).
                    let mut last_wall = SystemTime::now();
                    let mut last_hotplug = last;
                    // The last flush that took the call stacks (stack_flush_interval).
                    let mut last_stacks = last;
                    // The next scheduled epoch boundary as an instant of the monotonic clock
                    // this thread sleeps on, with the `epoch_interval` it was computed for.
                    let mut boundary: Option<(EpochInterval, Instant)> = None;
                    let stacks = shared.aggregator.stack_tables();
                    while !stop.load(std::sync::atomic::Ordering::Acquire) {
                        watch.fault_point(FLUSH_THREAD);
                        // Read each time: a reload may change them.
                        let (interval, every, stack_interval, slice) = {
                            let s = read(&shared.settings);
                            (
                                s.flush_interval,
                                s.epoch_interval,
                                s.stack_flush_interval,
                                s.slice_interval,
                            )
                        };
                        let mut next = last + interval;
                        // And at the next slice boundary (a wall clock set back is caught by
                        // the interval above).
                        if let Some(wait) = until_next_boundary(last_wall, SystemTime::now(), slice)
                        {
                            next = next.min(Instant::now() + wait);
                        }
                        // A stack table past its high-water mark cuts the interval short
                        // (perf::callchain), though to no less than EARLY_FLUSH_GAP: a table
                        // held full by pending samples must not turn into a flush storm.
                        if stacks.is_some_and(|t| t.flush_wanted()) {
                            next = next.min(last + EARLY_FLUSH_GAP);
                        }
                        // With flushes at least as frequent, the check rides on each flush's
                        // wake-up: one wake-up per interval, not two a few ms apart.
                        let next_hotplug = if interval <= HOTPLUG_EVERY {
                            next
                        } else {
                            last_hotplug + HOTPLUG_EVERY
                        };
                        let now = Instant::now();
                        if now >= next_hotplug {
                            // Before the store: a database that hangs in this flush delays
                            // only the next checks, not this one.
                            let c0 = sys::time::thread_cpu_ns();
                            let online =
                                read(&shared.sampler).as_ref().and_then(Sampler::hotplug_tick);
                            // The off-CPU source follows the same list, read once.
                            if let (Some(online), Some(o)) = (online, lock(&shared.offcpu).as_ref())
                            {
                                o.follow_cpus(&online);
                            }
                            let spent = sys::time::thread_cpu_ns().saturating_sub(c0);
                            lock(&shared.status_only).stages.checks_ns += spent;
                            last_hotplug = now;
                        }
                        // Past the boundary (or the interval changed): the rotation check,
                        // and the next boundary from the wall clock as it is now. A clock that
                        // jumped while this thread slept is seen here, or at the next flush
                        // tick, which checks too: one wake-up per boundary, no polling.
                        let boundary_passed = boundary.is_some_and(|(_, at)| now >= at);
                        if boundary_passed || boundary.is_none_or(|(e, _)| e != every) {
                            boundary = every
                                .get()
                                .and_then(EpochSchedule::new)
                                .map(|s| (every, Instant::now() + s.until_next(SystemTime::now())));
                        }
                        if now >= next {
                            // A full stack table asked for this flush: it must prune.
                            let wanted = stacks
                                .is_some_and(|t| t.clear_flush_request(now < last + interval));
                            let take_stacks = wanted || now >= last_stacks + stack_interval;
                            let wall = SystemTime::now();
                            let at_boundary = last_boundary(last_wall, wall, slice);
                            // Rotates too when the boundary is due.
                            shared.flush_tick(take_stacks, at_boundary);
                            last = Instant::now();
                            last_wall = wall;
                            if take_stacks {
                                last_stacks = last;
                            }
                        } else if boundary_passed {
                            shared.scheduled_rotation();
                        } else {
                            let wake = boundary.map_or(next, |(_, at)| at.min(next));
                            std::thread::park_timeout(wake.min(next_hotplug) - now);
                        }
                    }
                })
                .map_err(|e| ServiceError::Thread(e.to_string()))?
        };
        *lock(&shared.flusher) = Some(thread.thread().clone());
        if let Some(t) = shared.aggregator.stack_tables() {
            let flusher = thread.thread().clone();
            t.set_flusher_waker(Box::new(move || flusher.unpark()));
        }
        Ok(Self { stop, thread })
    }

    /// Stop the flush thread, waiting at most [`STOP_WAIT`]: one stuck in a hung database
    /// is left behind (the stop then spools without it).
    pub(super) fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Release);
        self.thread.thread().unpark();
        let deadline = Instant::now() + STOP_WAIT;
        while !self.thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !self.thread.is_finished() {
            tracing::error!("the flush thread is stuck (hung database?); stopping without it");
            return;
        }
        // A panic was recorded by the watch.
        drop(self.thread.join());
    }
}

impl Shared {
    /// Keeps the ticks the recent window needs: the newest one, and the newest one at least
    /// `span` (a flush interval) older than it. A slice boundary's flush can follow an
    /// interval's by milliseconds; a window between those two would rate a handful of drain
    /// deliveries over a few ms (0 or thousands of samples/s), so the window reaches back to
    /// the last tick a whole interval earlier instead.
    pub(super) fn record_tick(&self, status: Option<&SamplerStatus>, span: Duration) {
        let (u, s) = sock::self_cpu_time();
        let (samples, per_cpu) = match status {
            Some(st) => (
                st.cpus.iter().map(|c| c.samples).sum(),
                st.cpus.iter().map(|c| (c.cpu, c.wakeups, c.drain_cpu_ns)).collect(),
            ),
            None => (0, Vec::new()),
        };
        let rt = self.aggregator.resolver_thread_stats();
        let mut so = lock(&self.status_only);
        let t = &mut so.ticks;
        t.push_back(Tick {
            at: Instant::now(),
            samples,
            cpu_s: (u + s).as_secs_f64(),
            per_cpu,
            resolver: (rt.wakeups, rt.cpu_ns),
        });
        keep_span(t, span);
    }

    /// The window from the oldest kept tick to the newest; `None` (status then rates since
    /// start) until the daemon has flushed once a whole `span` (flush interval) after the
    /// flush thread's first tick: a window of a few ms after a boundary flush would rate a
    /// drain delivery or two as 0 or thousands of samples/s.
    pub(super) fn recent_window(&self, span: Duration) -> Option<RecentWindow> {
        let so = lock(&self.status_only);
        let t = &so.ticks;
        let (a, b) = (t.front()?, t.back()?);
        let seconds = b.at.saturating_duration_since(a.at);
        if t.len() < 2 || seconds < span {
            return None;
        }
        Some(RecentWindow {
            seconds: seconds.as_secs_f64(),
            samples: b.samples.saturating_sub(a.samples),
            cpu_s: (b.cpu_s - a.cpu_s).max(0.0),
            per_cpu: b
                .per_cpu
                .iter()
                .map(|&(cpu, w, ns)| {
                    let (w0, ns0) =
                        a.per_cpu.iter().find(|p| p.0 == cpu).map_or((0, 0), |p| (p.1, p.2));
                    (cpu, w.saturating_sub(w0), ns.saturating_sub(ns0))
                })
                .collect(),
            resolver: (
                b.resolver.0.saturating_sub(a.resolver.0),
                b.resolver.1.saturating_sub(a.resolver.1),
            ),
        })
    }

    /// A scheduled epoch boundary passed between two flush ticks: rotate now if it is due
    /// ([`Shared::rotate_if_due`]).
    pub(super) fn scheduled_rotation(&self) {
        let c0 = sys::time::thread_cpu_ns();
        let mut store = lock(&self.store);
        self.rotate_if_due(&mut store);
        *lock(&self.store_status) = store.status();
        drop(store);
        let spent = sys::time::thread_cpu_ns().saturating_sub(c0);
        lock(&self.status_only).stages.store_ns += spent;
    }

    /// The periodic flush: what the watermark allows goes to the store. The store lock is
    /// taken before the batch: a batch and an epoch change can then never interleave (the
    /// batch would otherwise land in the epoch after the one its samples belong to).
    ///
    /// `stacks`: take the call stacks counted so far too; otherwise only those whose processes
    /// the resolver is about to forget (`Aggregator::take_resolved`).
    ///
    /// `boundary`: the time-slice boundary passed since the last flush: the batch is cut at
    /// this instant with a barrier (every drain thread reads its ring up to it) and goes into
    /// the slice that ends at the boundary, so that slice holds exactly the samples taken
    /// before it (to within this thread's wake-up delay), whatever the flush interval. Other
    /// flushes take what the watermark allows, without waking the drain threads.
    pub(super) fn flush_tick(&self, stacks: bool, boundary: Option<SystemTime>) {
        use crate::sys::time::thread_cpu_ns;
        let c0 = thread_cpu_ns();
        // One status for the tick's window and the batch's counters: taken before the batch,
        // so a loss counted now goes with this batch or the next, never nowhere.
        let status = read(&self.sampler).as_ref().map(Sampler::status);
        let span = read(&self.settings).flush_interval;
        self.record_tick(status.as_ref(), span);
        let c1 = thread_cpu_ns();
        let mut store = lock(&self.store);
        let t0 = thread_cpu_ns();
        let resolved = if boundary.is_some() {
            let (resolved, unanswered, _) = self.cut_batch(stacks);
            if !unanswered.is_empty() {
                tracing::debug!(cpus = ?unanswered, "drain threads did not answer a slice boundary's barrier in time; their samples go to the next slice");
            }
            resolved
        } else {
            self.aggregator.take_resolved(stacks)
        };
        let t1 = thread_cpu_ns();
        self.sync_store(&mut store);
        // A second before the boundary: the slice that ends there (slices are whole seconds).
        let slice_at = boundary.map(|b| b.checked_sub(Duration::from_nanos(1)).unwrap_or(b));
        self.absorb_with(&mut store, resolved, status.as_ref(), slice_at);
        let tick = store.tick();
        self.rotate_if_due(&mut store);
        *lock(&self.store_status) = store.status();
        drop(store);
        malloc::trim_if_holding(malloc::KEEP_FREE, TRIM_EVERY);
        let t2 = thread_cpu_ns();
        let mut so = lock(&self.status_only);
        let st = &mut so.stages;
        st.resolve_ns += t1.saturating_sub(t0);
        st.store_ns += t2.saturating_sub(t1);
        st.spool_ns += tick.spool_ns;
        st.publish_ns += tick.publish_ns;
        st.checks_ns += c1.saturating_sub(c0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minute boundary in Unix time.
    const B: f64 = 1_800_000_000.0;

    fn at(secs: f64) -> SystemTime {
        std::time::UNIX_EPOCH + Duration::from_secs_f64(secs)
    }

    #[test]
    fn a_flush_falls_just_past_every_slice_boundary() {
        let m = Duration::from_secs(60);
        // 10 s before a minute boundary: wake 10 s (and the slack) later.
        let w = until_next_boundary(at(B - 10.0), at(B - 10.0), m).expect("slices");
        assert!(w.abs_diff(Duration::from_secs(10) + BOUNDARY_SLACK) < Duration::from_micros(1));
        // The last flush was before the boundary and it has passed: flush now.
        assert_eq!(until_next_boundary(at(B - 10.0), at(B + 1.0), m), Some(Duration::ZERO));
        // A flush just past the boundary waits for the next one.
        let w = until_next_boundary(at(B + 0.001), at(B + 0.002), m).expect("slices");
        assert!(w > Duration::from_secs(59) && w <= Duration::from_secs(60), "{w:?}");
        // No slices: no boundary flushes.
        assert_eq!(until_next_boundary(at(B), at(B + 1.0), Duration::ZERO), None);
    }

    #[test]
    fn the_recent_window_spans_a_flush_interval_across_a_boundary_flush() {
        let t0 = Instant::now();
        let tick = |ms: u64| Tick {
            at: t0 + Duration::from_millis(ms),
            samples: ms,
            cpu_s: 0.0,
            per_cpu: Vec::new(),
            resolver: (0, 0),
        };
        let span = Duration::from_millis(500);
        let mut t = std::collections::VecDeque::new();
        // Interval flushes at 0 and 500 ms, a boundary flush at 720 ms.
        for ms in [0, 500, 720] {
            t.push_back(tick(ms));
            keep_span(&mut t, span);
        }
        // The window reaches back to the 0 ms tick: 720 ms, not the 220 ms since the last.
        let ats: Vec<_> = t.iter().map(|k| k.samples).collect();
        assert_eq!(ats, [0, 500, 720]);
        // The next interval flush (1220 ms): the 720 ms tick alone spans the interval.
        t.push_back(tick(1220));
        keep_span(&mut t, span);
        assert_eq!(t.front().map(|k| k.samples), Some(720));
        assert_eq!(t.len(), 2);
        // Early flushes every few ms under a long interval: the list stays bounded.
        for ms in 1221..1400 {
            t.push_back(tick(ms));
            keep_span(&mut t, Duration::from_secs(3600));
        }
        assert_eq!(t.len(), MAX_TICKS);
    }

    #[test]
    fn a_boundary_is_crossed_once() {
        let m = Duration::from_secs(60);
        let b = |f: f64, t: f64| last_boundary(at(f), at(t), m);
        assert_eq!(b(B - 0.1, B), Some(at(B)));
        // Two passed (a starved thread): the last one.
        assert_eq!(b(B - 10.0, B + 80.0), Some(at(B + 60.0)));
        assert_eq!(b(B, B + 59.9), None);
        assert_eq!(b(B + 1.0, B + 10.0), None);
        assert_eq!(last_boundary(at(B - 10.0), at(B + 30.0), Duration::ZERO), None);
        // A clock set back crosses nothing.
        assert_eq!(b(B + 30.0, B - 10.0), None);
    }
}
