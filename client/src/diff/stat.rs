//! The statistics behind `dcpidiff` and `dcpistats`: a two-proportion z-test on sample counts,
//! Holm's step-down correction for the number of rows compared, and weighted spread measures.
//!
//! Sampling is modelled as binomial: each of a selection's `n` samples of an image lands in a
//! given symbol with probability `p` (its true share). That is the noise a sampling profiler
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
}
