//! Randomized overflow periods, measured on the real kernel (cpu-clock):
//! - every sample is stamped with a period inside the window `[P - P/32, P + P/32]`;
//! - the draws spread over the whole window, roughly uniformly;
//! - each CPU re-arms once per `redraw_interval` window (at a random instant of it), so a
//!   period is never in force for two whole windows;
//! - the stamp is the period that was really in force: within a run of one period, the time
//!   between consecutive samples matches that period, not the previous one.

use crate::sampler_support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dcpid::perf::{parse_event_list, Sampler, SamplerConfig};
use dcpid::types::Sample;
use sampler_support::{spin_for, CollectSink};

/// A run: consecutive samples of one CPU stamped with the same period.
#[derive(Debug)]
struct Run {
    period: u64,
    times: Vec<u64>,
}

fn runs_per_cpu(samples: &[(u32, Sample)]) -> BTreeMap<u32, Vec<Run>> {
    let mut by_cpu: BTreeMap<u32, Vec<&Sample>> = BTreeMap::new();
    for (cpu, s) in samples {
        by_cpu.entry(*cpu).or_default().push(s);
    }
    let mut out = BTreeMap::new();
    for (cpu, mut v) in by_cpu {
        v.sort_by_key(|s| s.time);
        let mut runs: Vec<Run> = Vec::new();
        for s in v {
            match runs.last_mut() {
                Some(r) if r.period == s.period => r.times.push(s.time),
                _ => runs.push(Run { period: s.period, times: vec![s.time] }),
            }
        }
        out.insert(cpu, runs);
    }
    out
}

/// Keep every online CPU busy for `d` (one spinning thread pinned per CPU is not possible from
/// safe code; several threads are enough to keep 2 vCPUs busy).
fn busy_all_cpus(d: Duration) {
    let n = std::thread::available_parallelism().map_or(2, std::num::NonZero::get);
    let hs: Vec<_> = (0..n).map(|_| std::thread::spawn(move || spin_for(d))).collect();
    for h in hs {
        h.join().unwrap();
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(u64::MAX)
}

#[dcpi_testkit::test(perf)]
fn periods_are_drawn_from_the_window_and_redrawn_often() {
    drop(periods_drawn_and_stamped(Duration::ZERO));
}

/// As the daemon runs: timed wake-ups re-arm every window but read the ring only every
/// `read_every`, so several re-arms fall between two reads and each sample must still get the
/// period in force at its time.
#[dcpi_testkit::test(perf)]
fn periods_are_stamped_right_when_reads_are_rarer_than_rearms() {
    let Some((drains, redraws, secs)) = periods_drawn_and_stamped(Duration::from_millis(500))
    else {
        return;
    };
    for ((cpu, d), r) in drains.into_iter().zip(redraws) {
        // Reads at least 500 ms apart (plus the start and the final pass), while the re-arms
        // come once per 100 ms window. A loaded machine stretches the run: judge by its length.
        let most = (secs / 0.5) as usize + 3;
        assert!(d >= 3 && d <= most, "cpu {cpu}: {d} reads in {secs:.1} s, read_every 500 ms");
        assert!(d as u64 * 3 < r, "cpu {cpu}: {d} reads for {r} re-arms");
    }
}

/// Returns the passes delivered per CPU, the re-arms per CPU and how long the sampler ran
/// (always `Some`: the callers' `#[dcpi_testkit::test(perf)]` checks perf).
fn periods_drawn_and_stamped(
    read_every: Duration,
) -> Option<(BTreeMap<u32, usize>, Vec<u64>, f64)> {
    const P: u64 = 4_000_000;
    const LO: u64 = P - P / 32;
    const HI: u64 = P + P / 32;
    const W: u64 = P / 16;
    // Many windows, so that the draws can be judged: 100 ms windows give ~80 draws per CPU.
    const WINDOW: u64 = 100_000_000;
    let sink = Arc::new(CollectSink::default());
    let cfg = SamplerConfig {
        events: parse_event_list(&format!("cpu-clock:{P}")).unwrap(),
        redraw_interval: Duration::from_nanos(WINDOW),
        read_every,
        ..SamplerConfig::default()
    };
    let started = std::time::Instant::now();
    let sampler = Sampler::start(&cfg, Arc::<CollectSink>::clone(&sink)).expect("start");
    busy_all_cpus(Duration::from_secs(8));
    let status = sampler.status();
    sampler.stop();
    let secs = started.elapsed().as_secs_f64();
    let samples = sink.take_cpu_samples();
    assert!(samples.len() > 2000, "only {} samples in 8 s at 250 Hz per CPU", samples.len());
    for (_, s) in &samples {
        assert!((LO..=HI).contains(&s.period), "period {} outside [{LO}, {HI}]", s.period);
    }
    let runs = runs_per_cpu(&samples);
    let mut draws: Vec<u64> = Vec::new();
    let mut max_run = 0;
    let mut max_span = 0;
    let (mut err_true, mut err_prev) = (Vec::new(), Vec::new());
    for (cpu, rs) in &runs {
        // The first and last runs are cut by start/stop; judge the complete ones.
        let inner = &rs[1..rs.len().saturating_sub(1).max(1)];
        for r in inner {
            draws.push(r.period);
            max_run = max_run.max(r.times.len());
            max_span = max_span.max(r.times.last().unwrap() - r.times[0]);
        }
        for w in rs.windows(2) {
            let (prev, r) = (&w[0], &w[1]);
            // The first intervals of a run: taken entirely under the new period.
            for t in r.times.windows(2).take(8) {
                let d = t[1] - t[0];
                err_true.push(d.abs_diff(r.period));
                err_prev.push(d.abs_diff(prev.period));
            }
        }
        eprintln!("cpu {cpu}: {} runs", rs.len());
    }
    draws.sort_unstable();
    let distinct = {
        let mut d = draws.clone();
        d.dedup();
        d.len()
    };
    let (mn, mx) = (draws[0], *draws.last().unwrap());
    let mut quartiles = [0u64; 4];
    for &p in &draws {
        quartiles[(((p - LO) * 4) / (W + 1)) as usize] += 1;
    }
    let expect = draws.len() as f64 / 4.0;
    let chi2: f64 = quartiles.iter().map(|&q| (q as f64 - expect).powi(2) / expect).sum();
    let (et, ep) = (median(err_true.clone()), median(err_prev.clone()));
    eprintln!(
        "draws {} distinct {distinct} min {mn} max {mx} quartiles {quartiles:?} chi2 {chi2:.2} \
         max run {max_run} samples, max run span {:.3} s; median |interval - stamped period| \
         {et} ns vs {ep} ns against the previous period; redraws per CPU {:?}",
        draws.len(),
        max_span as f64 / 1e9,
        status.cpus.iter().map(|c| c.period_redraws).collect::<Vec<_>>()
    );
    assert!(distinct >= 8, "only {distinct} distinct periods");
    assert!(mn < LO + W / 5, "smallest draw {mn} far from the window's low edge {LO}");
    assert!(mx > HI - W / 5, "largest draw {mx} far from the window's high edge {HI}");
    // 3 degrees of freedom: P(chi2 > 16.27) = 0.001 for a uniform draw.
    assert!(chi2 < 16.27, "draws not uniform over the window: quartiles {quartiles:?}");
    // One re-arm per window, at a random instant of it: less than two windows apart (plus
    // wake-up latency on a loaded machine).
    assert!(max_span <= 2 * WINDOW + 50_000_000, "a period stayed in force for {max_span} ns");
    assert!(max_run as u64 <= (2 * WINDOW + 50_000_000) / LO + 1, "run of {max_run} samples");
    // The stamp is the period in force: consecutive samples of a run are that period apart.
    assert!(err_true.len() > 50);
    assert!(et < W / 10, "intervals differ from the stamped period by {et} ns (median)");
    assert!(et * 3 < ep, "stamped period ({et} ns) no better than the previous one ({ep} ns)");
    let redraws: Vec<u64> = status.cpus.iter().map(|c| c.period_redraws).collect();
    assert!(redraws.iter().all(|&r| r >= 40), "redraws per CPU {redraws:?}: not one per window");
    let drains = sink.drains.lock().unwrap().iter().map(|(cpu, v)| (*cpu, v.len())).collect();
    Some((drains, redraws, secs))
}

#[dcpi_testkit::test(perf)]
fn slow_events_are_redrawn_every_second() {
    // 20 Hz with the default 1 s windows: re-armed less than 2 s apart (plus latency).
    const P: u64 = 50_000_000;
    let sink = Arc::new(CollectSink::default());
    let cfg = SamplerConfig {
        events: parse_event_list(&format!("cpu-clock:{P}")).unwrap(),
        ..SamplerConfig::default()
    };
    let sampler = Sampler::start(&cfg, Arc::<CollectSink>::clone(&sink)).expect("start");
    busy_all_cpus(Duration::from_secs(5));
    sampler.stop();
    let samples = sink.take_cpu_samples();
    let runs = runs_per_cpu(&samples);
    let mut checked = 0;
    for (cpu, rs) in &runs {
        if rs.len() < 3 {
            continue;
        }
        for r in &rs[1..rs.len() - 1] {
            let span = r.times.last().unwrap() - r.times[0];
            assert!(span <= 2_100_000_000, "cpu {cpu}: period {} held {span} ns", r.period);
            assert!(r.times.len() <= 43, "cpu {cpu}: period held for {} samples", r.times.len());
            checked += 1;
        }
    }
    eprintln!("checked {checked} complete runs");
    assert!(checked >= 2, "too few complete runs ({checked}) to judge the 1 s redraw");
}
