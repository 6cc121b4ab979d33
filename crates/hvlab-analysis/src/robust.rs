//! Robust descriptions of one sample set that a median alone hides: outliers (median ± k·MAD)
//! and two modes (a split at the widest gap). Both are said next to the median, with a remedy,
//! like hyperfine's warnings; neither changes the median or the verdict.

use super::statistics::median;
use crate::record::{RunRecord, Warning};
use hvlab_core::noise::Noise;

/// A sample is an outlier when it lies more than this many scaled MADs from the median
/// (3 is the usual robust cut: about 0.3% of a normal sample falls outside it).
pub const OUTLIER_K: f64 = 3.0;

/// MAD × 1.4826 estimates the standard deviation of a normal sample.
pub const MAD_TO_SD: f64 = 1.4826;

/// The median absolute deviation from the median; `NaN` for no samples.
pub fn mad(samples: &[f64]) -> f64 {
    let m = median(samples);
    let dev: Vec<f64> = samples.iter().map(|x| (x - m).abs()).collect();
    median(&dev)
}

/// The samples farther than `k` scaled MADs from the median, as indices. A set whose MAD is
/// zero (most samples identical, as counts are) has no scale to judge by: none are named.
pub fn outliers(samples: &[f64], k: f64) -> Vec<usize> {
    let m = median(samples);
    let scale = mad(samples) * MAD_TO_SD;
    if scale.is_nan() || scale <= 0.0 {
        return Vec::new();
    }
    samples
        .iter()
        .enumerate()
        .filter(|(_, x)| (*x - m).abs() > k * scale)
        .map(|(i, _)| i)
        .collect()
}

pub use super::statistics::Modes;

/// On the instruction clock, the smallest departure from the median (a fraction of it) that
/// counts as an outlier: the guest's repetitions differ by a few instructions, or by a timer
/// interrupt's work (a few thousand), which 3 MADs of a near-zero spread would all flag.
pub const ICOUNT_OUTLIER_FLOOR: f64 = 0.01;

/// Fewest samples in which two modes are looked for.
pub const BIMODAL_MIN_N: usize = 6;

/// The smallest ratio between the groups' neighbouring samples that counts as a gap.
pub const BIMODAL_MIN_GAP_RATIO: f64 = 1.5;

/// Two modes, when the samples (all positive) split at their widest gap on a log scale into
/// two groups that each hold at least a fifth of them (and at least 2), the upper group
/// starting at least [`BIMODAL_MIN_GAP_RATIO`] times above the lower one's top, and the gap
/// wider than twice either group's own spread (its scaled MAD, on the log scale). Timings are
/// multiplicative, so gaps and spreads are compared as ratios.
pub fn bimodal(samples: &[f64]) -> Option<Modes> {
    let n = samples.len();
    if n < BIMODAL_MIN_N || samples.iter().any(|x| !(x.is_finite() && *x > 0.0)) {
        return None;
    }
    let mut logs: Vec<f64> = samples.iter().map(|x| x.ln()).collect();
    logs.sort_unstable_by(f64::total_cmp);
    let min_group = (n.div_ceil(5)).max(2);
    let (split, gap) = (min_group..=n - min_group)
        .map(|i| (i, logs[i] - logs[i - 1]))
        .max_by(|a, b| a.1.total_cmp(&b.1))?;
    if gap < BIMODAL_MIN_GAP_RATIO.ln() {
        return None;
    }
    let (low, high) = logs.split_at(split);
    let spread = |g: &[f64]| mad(g) * MAD_TO_SD;
    if gap <= 2.0 * spread(low).max(spread(high)) {
        return None;
    }
    Some(Modes {
        medians: [median(low).exp(), median(high).exp()],
        counts: [low.len(), high.len()],
    })
}

/// The warnings a run carries: a busy host (from `noise`), the clock source changing, and per
/// variant the outliers and two modes of its `headline` metric.
pub fn warnings(r: &RunRecord, headline: &str, noise: Option<&Noise>) -> Vec<Warning> {
    let mut out = Vec::new();
    if let Some(n) = noise {
        if n.is_busy() {
            out.push(Warning::BusyHost {
                reasons: n.busy.clone(),
                pinned: n.pinned_cpus.is_some(),
            });
        }
        if !n.clocksource_stable {
            out.push(Warning::ClockSourceChanged {
                from: n.clocksource.clone(),
            });
        }
    }
    for v in r.variants.iter().filter(|v| v.is_ok()) {
        let Some(m) = v.metrics.get(headline) else {
            continue;
        };
        if let Some(modes) = bimodal(&m.samples) {
            out.push(Warning::Bimodal {
                variant: v.name.clone(),
                metric: headline.to_string(),
                unit: m.unit.clone(),
                modes,
            });
            // Two modes explain the far samples: they are not outliers of one mode.
            continue;
        }
        let clock = r.clock();
        let count = match clock {
            hvlab_core::host::Clock::Wall => outliers(&m.samples, OUTLIER_K).len(),
            // A few instructions of spread make the MAD tiny; only what moves beyond the
            // clock's own jitter (a timer interrupt's work) is worth a warning.
            hvlab_core::host::Clock::Icount => {
                let floor = ICOUNT_OUTLIER_FLOOR * median(&m.samples).abs();
                outliers(&m.samples, OUTLIER_K)
                    .into_iter()
                    .filter(|&i| (m.samples[i] - m.median).abs() > floor)
                    .count()
            }
        };
        if count > 0 {
            out.push(Warning::Outliers {
                variant: v.name.clone(),
                metric: headline.to_string(),
                count,
                n: m.samples.len(),
                k: OUTLIER_K,
                clock,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `n` evenly spaced values from `base` to `base·(1 + spread)`.
    fn cluster(n: usize, base: f64, spread: f64) -> Vec<f64> {
        let steps = (n.max(2) - 1) as f64;
        (0..n)
            .map(|j| base * (1.0 + spread * j as f64 / steps))
            .collect()
    }

    #[test]
    fn a_lifecycle_variant_at_half_a_millisecond_and_two_to_six_is_two_modes() {
        // 0.5 ms most of the time, 2–6 ms when a grace period was in flight.
        let s = [
            0.5, 0.52, 2.1, 0.49, 3.4, 0.51, 5.8, 0.5, 2.6, 0.53, 4.4, 0.5,
        ];
        let m = bimodal(&s).expect("two modes");
        assert_eq!(m.counts, [7, 5]);
        assert!((m.medians[0] - 0.5).abs() < 0.02, "{m:?}");
        assert!(m.medians[1] > 2.0 && m.medians[1] < 6.0, "{m:?}");
    }

    #[test]
    fn identical_counts_have_no_outliers_and_one_mode() {
        assert!(outliers(&[65.0; 10], OUTLIER_K).is_empty());
        assert!(bimodal(&[65.0; 10]).is_none());
    }

    proptest! {
        #[test]
        fn injected_far_values_are_exactly_the_outliers(
            n in 8usize..40, base in 0.01f64..1e6, spread in 0.0f64..0.2,
            far in 10.0f64..1000.0, k_frac in 0.0f64..0.24,
        ) {
            // floor(0.24·n) < n/4 injected values cannot move the median out of the cluster.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let k = (k_frac * n as f64) as usize;
            let mut s = cluster(n, base, spread.max(0.01));
            let mut want = Vec::new();
            for i in 0..k {
                let at = (i * 3) % n;
                if !want.contains(&at) {
                    s[at] = base * far;
                    want.push(at);
                }
            }
            want.sort_unstable();
            prop_assert_eq!(outliers(&s, OUTLIER_K), want);
        }

        #[test]
        fn a_tight_unimodal_set_is_never_two_modes(
            n in 6usize..60, base in 1e-3f64..1e7, spread in 0.0f64..0.45,
        ) {
            // Evenly spaced within a ×1.45 range: no gap between neighbours reaches ×1.5.
            prop_assert!(bimodal(&cluster(n, base, spread)).is_none());
        }

        #[test]
        fn two_tight_clusters_far_apart_are_two_modes_with_their_medians(
            n_low in 3usize..20, n_high in 3usize..20, base in 1e-3f64..1e6,
            apart in 2.0f64..100.0, spread in 0.0f64..0.1,
        ) {
            let (n, small) = (n_low + n_high, n_low.min(n_high));
            prop_assume!(small >= n.div_ceil(5).max(2));
            let mut s = cluster(n_low, base, spread);
            s.extend(cluster(n_high, base * apart, spread));
            let m = bimodal(&s);
            prop_assert!(m.is_some(), "{:?}", s);
            let m = m.unwrap();
            prop_assert_eq!(m.counts, [n_low, n_high]);
            prop_assert!(m.medians[0] >= base && m.medians[0] <= base * (1.0 + spread) * 1.0001);
            prop_assert!(m.medians[1] >= base * apart * 0.9999
                && m.medians[1] <= base * apart * (1.0 + spread) * 1.0001);
        }
    }
}
