//! The statistics behind `dcpidiff` and `dcpistats`: the comparison of two Poisson rates
//! (`dcpidiff`'s default), a two-proportion z-test on sample counts (`dcpidiff --compare
//! share`), Holm's step-down correction for the number of rows compared, and weighted spread
//! measures.
//!
//! A sampling profiler's counts are Poisson: a function that keeps the CPUs busy for a fraction
//! of the time gets samples at a steady rate, independently of everything else sampled, so its
//! count over `t` seconds is Poisson with mean `rate * t`. Comparing two such counts, the test
//! conditions on their sum `n`: under "same rate", the second count is binomial with `n` trials
//! and probability `t2 / (t1 + t2)` ([`poisson_rate_test`]). Comparing shares instead models
//! each of a selection's `n` samples of an image as landing in a symbol with probability `p`
//! (its true share) ([`two_proportion_z`]). Either way this is the noise a sampling profiler
//! adds by itself; variation of the workload between epochs or hosts comes on top and is what
//! `dcpistats` measures.

/// Complementary error function (Numerical Recipes `erfcc`: Chebyshev fit, fractional error
/// below 1.2e-7 everywhere, which is far finer than any significance level).
pub fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// Two-sided p-value of a standard normal statistic.
pub fn two_sided_p(z: f64) -> f64 {
    erfc(z.abs() / std::f64::consts::SQRT_2).clamp(0.0, 1.0)
}

/// Pooled two-proportion z statistic for `x1` of `n1` against `x2` of `n2` (positive when the
/// second share is larger). Zero when there is no evidence either way (no samples, or a share
/// of exactly 0 or 1 on both sides).
pub fn two_proportion_z(x1: u64, n1: u64, x2: u64, n2: u64) -> f64 {
    if n1 == 0 || n2 == 0 {
        return 0.0;
    }
    let (x1, n1, x2, n2) = (x1 as f64, n1 as f64, x2 as f64, n2 as f64);
    let p = (x1 + x2) / (n1 + n2);
    let se = (p * (1.0 - p) * (1.0 / n1 + 1.0 / n2)).sqrt();
    if se <= 0.0 || !se.is_finite() {
        return 0.0;
    }
    (x2 / n2 - x1 / n1) / se
}

/// `ln Γ(x)` for `x > 0` (Lanczos, g = 7, 9 terms: relative error below 1e-13 for the
/// arguments used here, counts up to 2^53).
pub fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x) Γ(1 − x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).abs().ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// Continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes
/// `betacf`). It needs about `sqrt(max(a, b))` terms near the mean: the bound is generous.
fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const MAX_ITER: usize = 100_000;
    const EPS: f64 = 1e-15;
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut h = d;
    // One Lentz step: the coefficient `aa` updates `d` and `c`, and `h` takes their product.
    let step = |aa: f64, c: &mut f64, d: &mut f64| {
        *d = 1.0 + aa * *d;
        if d.abs() < TINY {
            *d = TINY;
        }
        *c = 1.0 + aa / *c;
        if c.abs() < TINY {
            *c = TINY;
        }
        *d = 1.0 / *d;
        *d * *c
    };
    for m in 1..=MAX_ITER {
        let m = m as f64;
        let m2 = 2.0 * m;
        h *= step(m * (b - m) * x / ((qam + m2) * (a + m2)), &mut c, &mut d);
        let del = step(-(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)), &mut c, &mut d);
        h *= del;
        if (del - 1.0).abs() < EPS {
            break;
        }
    }
    h
}

/// Regularized incomplete beta function `I_x(a, b)` for `a, b > 0`, `0 <= x <= 1`.
pub fn beta_inc(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    let front = ln_front.exp();
    // The continued fraction converges fast on this side of the mean; use symmetry otherwise.
    if x < (a + 1.0) / (a + b + 2.0) {
        (front * beta_cf(a, b, x) / a).clamp(0.0, 1.0)
    } else {
        (1.0 - front * beta_cf(b, a, 1.0 - x) / b).clamp(0.0, 1.0)
    }
}

/// `P(X <= k)` for `X ~ Binomial(n, p)`.
pub fn binomial_cdf(k: u64, n: u64, p: f64) -> f64 {
    if k >= n {
        return 1.0;
    }
    // P(X <= k) = I_{1-p}(n - k, k + 1).
    beta_inc((n - k) as f64, k as f64 + 1.0, 1.0 - p)
}

/// `P(X >= k)` for `X ~ Binomial(n, p)`, computed directly (not as 1 − cdf, which would lose
/// the small tail to rounding).
pub fn binomial_sf(k: u64, n: u64, p: f64) -> f64 {
    if k == 0 {
        return 1.0;
    }
    if k > n {
        return 0.0;
    }
    // P(X >= k) = I_p(k, n - k + 1).
    beta_inc(k as f64, (n - k) as f64 + 1.0, p)
}

/// Compare two Poisson counts with their exposures: `x1` events in `t1` (seconds, or any
/// positive measure of how long each side was observed) against `x2` in `t2`. Returns the
/// signed z score (positive when the second rate is higher) and the exact two-sided p-value of
/// the conditional binomial test: given `n = x1 + x2`, `x2 ~ Binomial(n, t2 / (t1 + t2))` when
/// the rates are equal; the p-value is twice the smaller tail (at most 1), which never
/// exceeds the nominal level (conservative at small counts). No samples on either side, or an
/// exposure that is not positive, gives `(0, 1)`: no evidence.
pub fn poisson_rate_test(x1: u64, t1: f64, x2: u64, t2: f64) -> (f64, f64) {
    let n = x1.saturating_add(x2);
    if n == 0 || !(t1 > 0.0 && t2 > 0.0 && t1.is_finite() && t2.is_finite()) {
        return (0.0, 1.0);
    }
    let p0 = t2 / (t1 + t2);
    let nf = n as f64;
    let sd = (nf * p0 * (1.0 - p0)).sqrt();
    let z = if sd > 0.0 { (x2 as f64 - nf * p0) / sd } else { 0.0 };
    let lower = binomial_cdf(x2, n, p0);
    let upper = binomial_sf(x2, n, p0);
    (z, (2.0 * lower.min(upper)).min(1.0))
}

/// Holm–Bonferroni adjusted p-values (same order as `p`): the k-th smallest raw p-value is
/// multiplied by (m − k + 1), then made monotone. Rejecting where the adjusted value is below
/// alpha keeps the chance of any false alarm among the m rows at most alpha.
pub fn holm_adjust(p: &[f64]) -> Vec<f64> {
    let m = p.len();
    let mut order: Vec<usize> = (0..m).collect();
    order.sort_by(|&a, &b| p[a].total_cmp(&p[b]));
    let mut out = vec![1.0; m];
    let mut running: f64 = 0.0;
    for (k, &i) in order.iter().enumerate() {
        let adj = (p[i] * (m - k) as f64).min(1.0);
        running = running.max(adj);
        out[i] = running;
    }
    out
}

/// Median of a non-empty slice (NaN when empty).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Weighted mean and (population) standard deviation of `(value, weight)` pairs.
pub fn weighted_mean_sd(v: &[(f64, f64)]) -> (f64, f64) {
    let wsum: f64 = v.iter().map(|&(_, w)| w).sum();
    if wsum <= 0.0 {
        return (0.0, 0.0);
    }
    let mean = v.iter().map(|&(x, w)| x * w).sum::<f64>() / wsum;
    let var = v.iter().map(|&(x, w)| w * (x - mean) * (x - mean)).sum::<f64>() / wsum;
    (mean, var.max(0.0).sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_tail_matches_tables() {
        // Standard normal two-sided tail probabilities.
        for (z, p) in [(0.0, 1.0), (1.0, 0.317_310_5), (1.959_964, 0.05), (2.575_829, 0.01)] {
            assert!((two_sided_p(z) - p).abs() < 1e-6, "z={z}: {} vs {p}", two_sided_p(z));
            assert!((two_sided_p(-z) - p).abs() < 1e-6);
        }
        assert!(two_sided_p(40.0) < 1e-300);
    }

    #[test]
    fn z_test_direction_and_degenerate_cases() {
        let z = two_proportion_z(500, 1000, 200, 1000);
        assert!(z < -13.0, "{z}");
        assert!(two_proportion_z(200, 1000, 500, 1000) > 13.0);
        assert_eq!(two_proportion_z(300, 1000, 300, 1000), 0.0);
        assert_eq!(two_proportion_z(0, 0, 5, 10), 0.0);
        assert_eq!(two_proportion_z(10, 10, 20, 20), 0.0);
        // 30% of 1000 vs 33% of 1000: z about 1.44.
        let z = two_proportion_z(300, 1000, 330, 1000);
        assert!((z - 1.44).abs() < 0.02, "{z}");
    }

    #[test]
    fn holm_is_step_down_and_monotone() {
        let adj = holm_adjust(&[0.01, 0.04, 0.03, 0.005]);
        // Sorted: 0.005*4=0.02, 0.01*3=0.03, 0.03*2=0.06, 0.04*1=0.04 -> monotone 0.06.
        let want = [0.03, 0.06, 0.06, 0.02];
        for (a, w) in adj.iter().zip(want) {
            assert!((a - w).abs() < 1e-12, "{adj:?}");
        }
        assert_eq!(holm_adjust(&[0.9, 0.8]), vec![1.0, 1.0]);
        assert!(holm_adjust(&[]).is_empty());
    }

    #[test]
    fn spread_helpers() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        let (m, sd) = weighted_mean_sd(&[(1.0, 1.0), (3.0, 1.0)]);
        assert!((m - 2.0).abs() < 1e-12 && (sd - 1.0).abs() < 1e-12);
        let (m, _) = weighted_mean_sd(&[(1.0, 3.0), (5.0, 1.0)]);
        assert!((m - 2.0).abs() < 1e-12);
    }

    #[test]
    fn gamma_beta_and_binomial_match_closed_forms() {
        // ln Γ(n) = ln (n − 1)!.
        let mut f = 0.0f64;
        for n in 1..30u32 {
            assert!((ln_gamma(f64::from(n)) - f).abs() < 1e-10 * f.max(1.0), "n={n}");
            f += f64::from(n).ln();
        }
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-12);
        // Binomial(10, 1/2): P(X <= 2) = 56/1024, P(X >= 8) = 56/1024.
        assert!((binomial_cdf(2, 10, 0.5) - 56.0 / 1024.0).abs() < 1e-12);
        assert!((binomial_sf(8, 10, 0.5) - 56.0 / 1024.0).abs() < 1e-12);
        assert_eq!(binomial_cdf(10, 10, 0.3), 1.0);
        assert_eq!(binomial_sf(0, 10, 0.3), 1.0);
        assert_eq!(binomial_sf(11, 10, 0.3), 0.0);
        // Binomial(20, 0.3): P(X <= 3) = sum of the exact terms.
        let exact: f64 = (0..=3u64)
            .map(|k| {
                let c =
                    (ln_gamma(21.0) - ln_gamma(k as f64 + 1.0) - ln_gamma(21.0 - k as f64)).exp();
                c * 0.3f64.powi(k as i32) * 0.7f64.powi(20 - k as i32)
            })
            .sum();
        assert!((binomial_cdf(3, 20, 0.3) - exact).abs() < 1e-12, "{exact}");
        // Large n stays accurate: Binomial(1e6, 1/2) at its mean is about 1/2.
        let c = binomial_cdf(500_000, 1_000_000, 0.5);
        assert!((c - 0.5).abs() < 1e-3, "{c}");
    }

    #[test]
    fn poisson_rate_test_direction_exposure_and_degenerate_cases() {
        // Equal counts over equal time: no evidence.
        let (z, p) = poisson_rate_test(1000, 10.0, 1000, 10.0);
        assert!(z.abs() < 1e-9 && p > 0.95, "{z} {p}");
        // Equal counts over twice the time after: the rate halved.
        let (z, p) = poisson_rate_test(1000, 10.0, 1000, 20.0);
        assert!(z < -10.0 && p < 1e-20, "{z} {p}");
        // Same rate, different exposures: no evidence.
        let (z, p) = poisson_rate_test(1000, 10.0, 2000, 20.0);
        assert!(z.abs() < 1e-9 && p > 0.95, "{z} {p}");
        // 1.3x the count in the same time: clearly up.
        let (z, p) = poisson_rate_test(4000, 1.0, 5200, 1.0);
        assert!(z > 10.0 && p < 1e-20, "{z} {p}");
        assert_eq!(poisson_rate_test(0, 1.0, 0, 1.0), (0.0, 1.0));
        assert_eq!(poisson_rate_test(5, 0.0, 7, 1.0), (0.0, 1.0));
        assert_eq!(poisson_rate_test(5, f64::NAN, 7, 1.0), (0.0, 1.0));
        // A function that appears: 0 before, 20 after, equal time: p = 2 * 2^-20.
        let (z, p) = poisson_rate_test(0, 1.0, 20, 1.0);
        assert!(z > 4.0 && (p - 2.0 * 0.5f64.powi(20)).abs() < 1e-15, "{z} {p}");
    }

    /// xorshift64*: reproducible draws.
    struct Rng(u64);

    impl Rng {
        fn uniform(&mut self) -> f64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }
        /// A Poisson count of mean `mean`: arrivals of a unit-rate process up to `mean`.
        fn poisson(&mut self, mean: f64) -> u64 {
            let (mut t, mut k) = (0.0, 0);
            loop {
                t -= self.uniform().ln();
                if t > mean {
                    return k;
                }
                k += 1;
            }
        }
    }

    #[test]
    fn rate_test_holds_its_level_under_h0_and_finds_a_1_3x_shift() {
        let mut rng = Rng(0x39_0002);
        let trials = 2000;
        // H0, unequal exposures (10 s before, 25 s after), 40 samples/s: rejections at 0.05
        // and 0.01 stay at or below the level (the exact test is conservative), and not far
        // below it (it still has the level's power to false-alarm: it is not degenerate).
        let (mut r05, mut r01) = (0, 0);
        for _ in 0..trials {
            let x1 = rng.poisson(400.0);
            let x2 = rng.poisson(1000.0);
            let (_, p) = poisson_rate_test(x1, 10.0, x2, 25.0);
            r05 += usize::from(p < 0.05);
            r01 += usize::from(p < 0.01);
        }
        let (f05, f01) = (r05 as f64 / trials as f64, r01 as f64 / trials as f64);
        eprintln!("H0 rejection rate: {f05:.4} at 0.05, {f01:.4} at 0.01");
        // Binomial noise of 2000 trials at 0.05 is 0.0049 (sd): 0.067 is 3.5 sd above.
        assert!((0.03..=0.067).contains(&f05), "at 0.05: {f05}");
        assert!(f01 <= 0.02, "at 0.01: {f01}");
        // Small counts (mean 3): the exact test must not over-reject.
        let mut r = 0;
        for _ in 0..trials {
            let (_, p) = poisson_rate_test(rng.poisson(3.0), 1.0, rng.poisson(3.0), 1.0);
            r += usize::from(p < 0.05);
        }
        assert!((r as f64 / trials as f64) <= 0.06, "small counts: {r} of {trials}");
        // Power: a function 1.3x slower, 800 samples before, same time (z about 5.6 in
        // expectation): with 20 rows compared, Holm's correction (0.01 / 20 for the smallest
        // p-value) keeps it found nearly always while the 19 unchanged rows raise (almost) no
        // alarm. (With 500 samples, z 4.4, it was found in 82 % of the trials.)
        let (mut found, mut false_alarms) = (0, 0);
        let power_trials = 200;
        for _ in 0..power_trials {
            let mut p = Vec::new();
            for row in 0..20 {
                let after = if row == 0 { 1040.0 } else { 800.0 };
                p.push(poisson_rate_test(rng.poisson(800.0), 1.0, rng.poisson(after), 1.0).1);
            }
            let adj = holm_adjust(&p);
            found += usize::from(adj[0] < 0.01);
            false_alarms += usize::from(adj[1..].iter().any(|&a| a < 0.01));
        }
        eprintln!("1.3x found in {found} of {power_trials}; family false alarms {false_alarms}");
        assert!(found >= 185, "power {found} of {power_trials}");
        // Family-wise level 0.01: expected at most 2 of 200.
        assert!(false_alarms <= 8, "{false_alarms} families with a false alarm");
    }
}
