//! When a drain thread re-arms its CPU's periods: the period-redraw policy, free of I/O so that
//! it can be tested (and its statistical argument shown) without the kernel.
//!
//! Time is cut into consecutive windows of `interval` starting when the thread started. In each
//! window the thread re-arms once, at an instant drawn uniformly inside that window; the drain
//! thread's poll timeout is that instant (the wake-up also reads the ring when its last read is
//! `read_every` old). That is one timed wake-up per CPU per window (the other wake-ups are the ring's
//! half-full watermark). Consecutive re-arms are therefore less than `2 * interval` apart ;
//! a window without one only happens when the thread was late by a whole window.
//!
//! Why a random instant is enough (README.md, "Periods"): `PERF_EVENT_IOC_PERIOD` restarts the
//! event's timer, so the samples after a re-arm at time `r` with period `p` are taken at
//! `r + k·p`. If `r` is uniform over a window much longer than the period `W` of any periodic
//! workload, `r mod W` is uniform, hence so is `(r + k·p) mod W` for every `k` and every `p`:
//! each sample's phase against the workload is uniform in expectation, whatever the period in
//! force. How often we re-arm only sets how many independent phases a profile averages over,
//! not whether it is biased; the randomized period then spreads the phases within a window too.

use rand::{Rng, RngExt};

/// The per-CPU re-arm schedule (all times perf-clock nanoseconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedrawSchedule {
    interval: u64,
    /// End (exclusive) of the window the next re-arm belongs to.
    window_end: u64,
    /// The instant of the next re-arm, inside `[window_end - interval, window_end)`.
    due_at: u64,
}

impl RedrawSchedule {
    /// The first window starts at `now`. `interval` is at least 1 ns.
    pub fn new<R: Rng>(now: u64, interval: u64, rng: &mut R) -> Self {
        let interval = interval.max(1);
        Self {
            interval,
            window_end: now.saturating_add(interval),
            due_at: now.saturating_add(rng.random_range(0..interval)),
        }
    }

    pub fn interval(&self) -> u64 {
        self.interval
    }

    /// The instant of the next re-arm.
    pub fn due_at(&self) -> u64 {
        self.due_at
    }

    /// Whether a wake-up at `now` should re-arm.
    pub fn is_due(&self, now: u64) -> bool {
        now >= self.due_at
    }

    /// How long the drain thread may sleep from `now`: until the re-arm instant, in whole
    /// milliseconds rounded up (poll's unit; waking early would only loop).
    pub fn timeout_ms(&self, now: u64) -> i32 {
        let ns = self.due_at.saturating_sub(now);
        i32::try_from(ns.div_ceil(1_000_000)).unwrap_or(i32::MAX)
    }

    /// The re-arm of the current window happened (or was skipped) at `now`: draw the instant of
    /// the next window. A thread that was late by more than a window skips to the window after
    /// the one containing `now` rather than re-arming at once again, which would put the re-arm
    /// at a non-random instant.
    pub fn advance<R: Rng>(&mut self, now: u64, rng: &mut R) {
        let start = if now < self.window_end {
            self.window_end
        } else {
            // Windows stay aligned on the first one: the one after the window holding `now`.
            let late = now - self.window_end;
            self.window_end + (late / self.interval + 1) * self.interval
        };
        self.window_end = start.saturating_add(self.interval);
        self.due_at = start.saturating_add(rng.random_range(0..self.interval));
    }
}

/// Whether an event may be re-armed `since_arm` ns after its last re-arm. The ioctl restarts a
/// clock event's timer: re-arming one sooner than its period would suppress its next sample.
pub fn spaced(time_based: bool, since_arm: u64, current_period: u64) -> bool {
    !time_based || since_arm >= current_period
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::StdRng;
    use rand::SeedableRng;

    const S: u64 = 1_000_000_000;

    #[test]
    fn one_rearm_per_window_at_a_point_inside_it() {
        let mut rng = StdRng::seed_from_u64(7);
        let t0 = 5 * S + 123;
        let mut s = RedrawSchedule::new(t0, S, &mut rng);
        for k in 0..1000u64 {
            let (lo, hi) = (t0 + k * S, t0 + (k + 1) * S);
            assert!(
                (lo..hi).contains(&s.due_at()),
                "window {k}: due {} not in [{lo}, {hi})",
                s.due_at()
            );
            assert!(!s.is_due(s.due_at() - 1));
            assert!(s.is_due(s.due_at()));
            // The drain thread wakes at the instant (or a little later) and re-arms.
            let now = s.due_at() + 50_000;
            s.advance(now, &mut rng);
        }
    }

    #[test]
    fn consecutive_rearms_are_less_than_two_windows_apart_and_spread_over_the_window() {
        let mut rng = StdRng::seed_from_u64(11);
        let mut s = RedrawSchedule::new(0, S, &mut rng);
        let mut prev = s.due_at();
        let mut deciles = [0u32; 10];
        for k in 0..5000u64 {
            deciles[((s.due_at() - k * S) * 10 / S) as usize] += 1;
            s.advance(s.due_at(), &mut rng);
            let gap = s.due_at() - prev;
            assert!(gap > 0 && gap < 2 * S, "gap {gap}");
            prev = s.due_at();
        }
        // Uniform inside the window: chi-square, 9 dof, P(> 27.88) = 0.001.
        let e = 500.0;
        let chi2: f64 = deciles.iter().map(|&c| (f64::from(c) - e).powi(2) / e).sum();
        assert!(chi2 < 27.88, "{deciles:?}");
    }

    #[test]
    fn a_late_thread_skips_to_a_later_window_instead_of_rearming_at_once() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut s = RedrawSchedule::new(0, S, &mut rng);
        // Stalled for 3.5 windows.
        let now = 3 * S + S / 2;
        assert!(s.is_due(now));
        s.advance(now, &mut rng);
        assert!((4 * S..5 * S).contains(&s.due_at()), "{}", s.due_at());
        assert!(s.timeout_ms(now) >= 1);
    }

    #[test]
    fn timeout_rounds_up_to_the_instant() {
        let mut rng = StdRng::seed_from_u64(5);
        let s = RedrawSchedule::new(0, S, &mut rng);
        let now = s.due_at().saturating_sub(1_500_000);
        assert_eq!(s.timeout_ms(now), if s.due_at() >= 1_500_000 { 2 } else { 1 });
        assert_eq!(s.timeout_ms(s.due_at() + 10), 0);
    }

    #[test]
    fn clock_events_are_not_rearmed_within_one_period() {
        assert!(!spaced(true, 999, 1000));
        assert!(spaced(true, 1000, 1000));
        assert!(spaced(false, 0, 1000));
    }

    /// Phase (in eighths of the workload's cycle) of every sample of a simulated CPU-bound
    /// workload with a cycle of `cycle` ns, sampled at a *fixed* period `period` that is
    /// re-armed at the instants `rearm(k)` of each window `k`.
    fn phases(
        cycle: u64,
        period: u64,
        windows: u64,
        mut rearm: impl FnMut(u64) -> u64,
    ) -> [u64; 8] {
        let mut hist = [0u64; 8];
        for k in 0..windows {
            let r = rearm(k);
            let end = rearm(k + 1);
            let mut t = r + period;
            while t < end {
                hist[((t % cycle) * 8 / cycle) as usize] += 1;
                t += period;
            }
        }
        hist
    }

    fn chi2(h: &[u64; 8]) -> f64 {
        let e = h.iter().sum::<u64>() as f64 / 8.0;
        h.iter().map(|&c| (c as f64 - e).powi(2) / e).sum()
    }

    /// The argument of the module docs at the production rate (one re-arm per second): with
    /// the period fixed *and equal to the workload's cycle* (the worst case: every sample of a
    /// window falls at one phase), re-arming at a uniformly random instant of each window makes
    /// the phases of all samples uniform; re-arming at instants locked to a 4 ms scheduler tick
    /// (what a drain thread woken by tick-aligned events does) puts every sample at one phase.
    #[test]
    fn random_rearm_instants_make_sample_phases_uniform_whatever_the_period() {
        const CYCLE: u64 = 4_000_000;
        let mut rng = StdRng::seed_from_u64(42);
        let mut s = RedrawSchedule::new(0, S, &mut rng);
        let mut instants = vec![s.due_at()];
        for _ in 0..4000 {
            s.advance(s.due_at(), &mut rng);
            instants.push(s.due_at());
        }
        for period in [CYCLE, CYCLE / 2, 3_999_000, 1_000_000, 7_777_777] {
            let h = phases(CYCLE, period, 4000, |k| instants[k as usize]);
            // 7 dof: P(chi2 > 24.32) = 0.001. Samples of one window are not independent (they
            // share the window's phase), so judge the shares rather than only chi2 per sample.
            let n = h.iter().sum::<u64>() as f64;
            let worst = h.iter().map(|&c| (c as f64 / n - 0.125).abs()).fold(0.0, f64::max);
            assert!(worst < 0.02, "period {period}: phases not uniform {h:?}");
        }
        // Tick-locked re-arms (every window at a multiple of the 4 ms tick, plus a fixed
        // wake-up latency): all samples at one phase for a period equal to the cycle.
        let h = phases(CYCLE, CYCLE, 4000, |k| k * S + 37_000);
        assert!(chi2(&h) > 1000.0 && h.iter().filter(|&&c| c > 0).count() == 1, "{h:?}");
    }
}
