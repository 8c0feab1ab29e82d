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
/// `flush_interval` at most this long (the default), every flush's wake-up does it.
pub(super) const HOTPLUG_EVERY: Duration = Duration::from_secs(5);

/// The shortest time between two flushes when a stack table asks for an early one. A table
/// holds one flush interval's distinct stacks: at 4 kHz per CPU, half a second of them fits in
/// half the default table even when every stack is new.
pub(super) const EARLY_FLUSH_GAP: Duration = Duration::from_millis(500);

impl Flusher {
    pub(super) fn spawn(shared: &Arc<Shared>) -> Result<Self, ServiceError> {
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let thread = {
            let shared = Arc::clone(shared);
            let stop = Arc::clone(&stop);
            let watch = Arc::clone(&shared.watch);
            Arc::clone(&watch)
                .spawn(FLUSH_THREAD.into(), true, move || {
                    let mut last = Instant::now();
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
                        let (interval, every, stack_interval) = {
                            let s = read(&shared.settings);
                            (s.flush_interval, s.epoch_interval, s.stack_flush_interval)
                        };
                        let mut next = last + interval;
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
                            // Rotates too when the boundary is due.
                            shared.flush_tick(take_stacks);
                            last = Instant::now();
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
    pub(super) fn record_tick(&self, status: Option<&SamplerStatus>) {
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
        while t.len() > 2 {
            t.pop_front();
        }
    }

    pub(super) fn recent_window(&self) -> Option<RecentWindow> {
        let so = lock(&self.status_only);
        let t = &so.ticks;
        let (a, b) = (t.front()?, t.back()?);
        if t.len() < 2 {
            return None;
        }
        Some(RecentWindow {
            seconds: b.at.saturating_duration_since(a.at).as_secs_f64(),
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
    pub(super) fn flush_tick(&self, stacks: bool) {
        use crate::sys::time::thread_cpu_ns;
        let c0 = thread_cpu_ns();
        // One status for the tick's window and the batch's counters: taken before the batch,
        // so a loss counted now goes with this batch or the next, never nowhere.
        let status = read(&self.sampler).as_ref().map(super::super::perf::sampler::Sampler::status);
        self.record_tick(status.as_ref());
        let c1 = thread_cpu_ns();
        let mut store = lock(&self.store);
        let t0 = thread_cpu_ns();
        let resolved = self.aggregator.take_resolved(stacks);
        let t1 = thread_cpu_ns();
        self.sync_store(&mut store);
        self.absorb_with(&mut store, resolved, status.as_ref());
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
