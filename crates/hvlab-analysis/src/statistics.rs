//! Median, percentile-bootstrap confidence intervals, and deterministic seeding.
//!
//! Timing distributions here are skewed and heavy-tailed (a grace period lasts "a few
//! jiffies"), so hvlab summarises with the median and a bootstrap CI of the median rather than
//! a mean and a normal-theory interval. Every resampling is seeded from the run's seed and the
//! metric's name, so the same samples always give the same interval.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Bootstrap resamples per interval.
pub const RESAMPLES: usize = 2000;

/// The median; `NaN` for no samples.
pub fn median(samples: &[f64]) -> f64 {
    let mut v = samples.to_vec();
    median_in_place(&mut v)
}

fn median_in_place(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_unstable_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len() % 2 == 1 {
        v[mid]
    } else {
        (v[mid - 1] + v[mid]) / 2.0
    }
}

/// The `q` quantile (0..=1) of sorted data, by linear interpolation between order statistics.
pub fn quantile_sorted(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let pos = q.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let lo = pos.floor();
    let frac = pos - lo;
    // pos is within [0, len-1], so the conversion cannot truncate meaningfully.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let i = lo as usize;
    match sorted.get(i + 1) {
        Some(next) => sorted[i] + frac * (next - sorted[i]),
        None => sorted[i],
    }
}

/// A stable 64-bit seed from a base seed and labels (FNV-1a), so each metric's resampling is
/// independent of the order in which metrics are summarised.
pub fn seed_for(base: u64, labels: &[&str]) -> u64 {
    labels.iter().fold(FNV1A_OFFSET ^ base, |h, label| {
        fnv1a(h, label.bytes().chain(std::iter::once(0xff)))
    })
}

/// FNV-1a's offset basis: the state a hash starts from.
pub const FNV1A_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a (64-bit) over `bytes`, continuing from `state`.
pub fn fnv1a(state: u64, bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(state, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Bootstrap medians of one sample, found by counting ranks instead of sorting each resample.
///
/// A resample draws the same indices, in the same order, as sorting would need; its median is
/// then the order statistic where the running count of drawn ranks crosses the middle, which
/// is O(n) a resample instead of O(n log n). The values are exactly the sorted ones
/// (`f64::total_cmp` orders both), so intervals are unchanged bit for bit. Sorting was three
/// quarters of `hvlab fidelity`'s time.
struct MedianResampler {
    /// The sample in `f64::total_cmp` order.
    sorted: Vec<f64>,
    /// Where each sample (in its original order) sits in `sorted`.
    rank: Vec<usize>,
    /// How often each rank was drawn in the current resample.
    drawn: Vec<u32>,
}

impl MedianResampler {
    fn new(samples: &[f64]) -> Self {
        let mut order: Vec<usize> = (0..samples.len()).collect();
        order.sort_by(|&a, &b| samples[a].total_cmp(&samples[b]));
        let mut rank = vec![0; samples.len()];
        for (r, &i) in order.iter().enumerate() {
            rank[i] = r;
        }
        MedianResampler {
            sorted: order.iter().map(|&i| samples[i]).collect(),
            rank,
            drawn: vec![0; samples.len()],
        }
    }

    /// The median of one resample (n draws with replacement); `NaN` for no samples.
    fn median(&mut self, rng: &mut ChaCha8Rng) -> f64 {
        let n = self.rank.len();
        if n == 0 {
            return f64::NAN;
        }
        self.drawn.fill(0);
        for _ in 0..n {
            self.drawn[self.rank[rng.random_range(0..n)]] += 1;
        }
        // The order statistics k = mid - 1 and mid (0-based) of the resample.
        let mid = n / 2;
        let (mut below_mid, mut at_mid) = (None, None);
        let mut seen = 0usize;
        for (r, &count) in self.drawn.iter().enumerate() {
            seen += count as usize;
            if below_mid.is_none() && mid > 0 && seen > mid - 1 {
                below_mid = Some(self.sorted[r]);
            }
            if seen > mid {
                at_mid = Some(self.sorted[r]);
                break;
            }
        }
        let at_mid = at_mid.unwrap_or(f64::NAN);
        if n % 2 == 1 {
            at_mid
        } else {
            (below_mid.unwrap_or(f64::NAN) + at_mid) / 2.0
        }
    }
}

/// Percentile-bootstrap 95% CI of the median.
pub fn bootstrap_median_ci(samples: &[f64], seed: u64) -> [f64; 2] {
    if samples.is_empty() {
        return [f64::NAN, f64::NAN];
    }
    // Every resample of identical values has that value as its median: the answer the
    // resampling would give, without it. Most of a model run's metrics are counts that do not
    // vary, and resampling them was 85% of a sweep point's time.
    if samples.iter().all(|x| x.to_bits() == samples[0].to_bits()) {
        return [samples[0], samples[0]];
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut resampler = MedianResampler::new(samples);
    let mut medians: Vec<f64> = (0..RESAMPLES).map(|_| resampler.median(&mut rng)).collect();
    medians.sort_unstable_by(f64::total_cmp);
    [
        quantile_sorted(&medians, 0.025),
        quantile_sorted(&medians, 0.975),
    ]
}

/// Percentile-bootstrap 95% CI of `median(a) / median(b)`, resampling both sides independently.
pub fn bootstrap_ratio_ci(a: &[f64], b: &[f64], seed: u64) -> [f64; 2] {
    if a.is_empty() || b.is_empty() {
        return [f64::NAN, f64::NAN];
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (mut from_a, mut from_b) = (MedianResampler::new(a), MedianResampler::new(b));
    let mut ratios: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let ma = from_a.median(&mut rng);
            let mb = from_b.median(&mut rng);
            ma / mb
        })
        .filter(|r| r.is_finite())
        .collect();
    ratios.sort_unstable_by(f64::total_cmp);
    [
        quantile_sorted(&ratios, 0.025),
        quantile_sorted(&ratios, 0.975),
    ]
}

/// Largest pooled sample the exact rank test enumerates; above it the normal approximation
/// of [`mann_whitney_p`] is accurate.
const EXACT_MAX_N: usize = 60;

/// Midranks (1-based, ties averaged) of the pooled samples, doubled so they are integers; the
/// first `a.len()` entries belong to `a`.
fn doubled_midranks(a: &[f64], b: &[f64]) -> Vec<usize> {
    let mut all: Vec<(f64, usize)> = a.iter().chain(b).copied().zip(0..).collect();
    all.sort_unstable_by(|x, y| x.0.total_cmp(&y.0));
    let mut ranks = vec![0usize; all.len()];
    let mut i = 0;
    while i < all.len() {
        let mut j = i;
        while j + 1 < all.len() && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        // Doubled midrank of positions i..=j (1-based): (i + 1) + (j + 1).
        for x in &all[i..=j] {
            ranks[x.1] = i + j + 2;
        }
        i = j + 1;
    }
    ranks
}

/// A rank test's answer: its two-sided p-value and which way B's samples rank against A's.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RankTest {
    /// Two-sided p-value ([`exact_rank_p`]).
    pub p: f64,
    /// Whether B ranks above A (`Greater`), below it or neither: the sign of A's rank sum's
    /// distance from its mean, the distance the p-value is about.
    pub b_ranks: std::cmp::Ordering,
}

/// The rank test of `a` against `b`, p-value and direction from one ranking.
pub fn rank_test(a: &[f64], b: &[f64]) -> RankTest {
    let (n1, n) = (a.len(), a.len() + b.len());
    if a.is_empty() || b.is_empty() {
        return RankTest {
            p: 1.0,
            b_ranks: std::cmp::Ordering::Equal,
        };
    }
    let ranks = doubled_midranks(a, b);
    let observed: usize = ranks[..n1].iter().sum();
    let total: usize = ranks.iter().sum();
    // A's rank sum below its mean n1·total/n means B ranks above.
    let b_ranks = (n1 * total).cmp(&(n * observed));
    let p = if n > EXACT_MAX_N || a.iter().chain(b).any(|x| !x.is_finite()) {
        mann_whitney_p(a, b)
    } else {
        exact_permutation_p(&ranks, n1, observed, total)
    };
    RankTest { p, b_ranks }
}

/// Two-sided p-value of an exact permutation test on the rank sum (the exact Wilcoxon-Mann-
/// Whitney test, ties as midranks): of all C(n1 + n2, n1) ways to split the pooled samples
/// into sides of these sizes, the share whose rank sum is at least as far from its mean as the
/// observed one. Valid at any n, unlike the normal approximation; pooled samples above
/// 60 fall back to [`mann_whitney_p`]. 1.0 when either side is empty.
pub fn exact_rank_p(a: &[f64], b: &[f64]) -> f64 {
    rank_test(a, b).p
}

/// The exact permutation p-value of A's doubled rank sum `observed` among `ranks` (the
/// pooled doubled midranks, A's `n1` first; `total` their sum).
fn exact_permutation_p(ranks: &[usize], n1: usize, observed: usize, total: usize) -> f64 {
    let n = ranks.len();
    let max_sum = total;
    // ways[k][s]: subsets of k of the ranks seen so far with doubled rank sum s.
    let mut ways = vec![vec![0f64; max_sum + 1]; n1 + 1];
    ways[0][0] = 1.0;
    for &r in ranks {
        for k in (1..=n1).rev() {
            let (lo, hi) = ways.split_at_mut(k);
            let (prev, cur) = (&lo[k - 1], &mut hi[0]);
            for s in (r..=max_sum).rev() {
                cur[s] += prev[s - r];
            }
        }
    }
    let all: f64 = ways[n1].iter().sum();
    // Compare |2·n·S − n1·total| to stay in integers: the mean of S is n1·total/n.
    let dev = |s: usize| (2 * n * s).abs_diff(2 * n1 * total);
    let obs_dev = dev(observed);
    let extreme: f64 = ways[n1]
        .iter()
        .enumerate()
        .filter(|(s, w)| **w > 0.0 && dev(*s) >= obs_dev)
        .map(|(_, w)| *w)
        .sum();
    (extreme / all).clamp(0.0, 1.0)
}

/// The smallest two-sided p-value the exact rank test can give with `n1` and `n2` samples:
/// 2 / C(n1 + n2, n1). A verdict at level `alpha` needs this to be below `alpha`.
pub fn exact_min_p(n1: usize, n2: usize) -> f64 {
    if n1 == 0 || n2 == 0 {
        return 1.0;
    }
    let (n, k) = (n1 + n2, n1.min(n2));
    let mut c = 1.0f64;
    for i in 0..k {
        c = c * (n - i) as f64 / (i + 1) as f64;
    }
    (2.0 / c).min(1.0)
}

/// The fewest samples per side (equal sides) with which the exact rank test can reach
/// `p < alpha`.
pub fn exact_min_n(alpha: f64) -> usize {
    (1..=64).find(|n| exact_min_p(*n, *n) < alpha).unwrap_or(64)
}

/// Two-sided Mann-Whitney U test p-value (normal approximation with tie correction and
/// continuity correction): how surprising the two samples' ranks are if they come from one
/// distribution. Robust to the heavy tails of timings; 1.0 when either side is empty.
pub fn mann_whitney_p(a: &[f64], b: &[f64]) -> f64 {
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    if a.is_empty() || b.is_empty() {
        return 1.0;
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|x| (*x, true))
        .chain(b.iter().map(|x| (*x, false)))
        .collect();
    all.sort_unstable_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len();
    let (mut rank_a, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        let avg = (i + j) as f64 / 2.0 + 1.0;
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        rank_a += all[i..=j].iter().filter(|x| x.1).count() as f64 * avg;
        i = j + 1;
    }
    let u = rank_a - n1 * (n1 + 1.0) / 2.0;
    let mean = n1 * n2 / 2.0;
    let nn = n1 + n2;
    let var = n1 * n2 / 12.0 * ((nn + 1.0) - ties / (nn * (nn - 1.0)));
    if var <= 0.0 {
        return 1.0; // every value equal: no evidence of a difference
    }
    let z = ((u - mean).abs() - 0.5).max(0.0) / var.sqrt();
    (2.0 * (1.0 - normal_cdf(z))).clamp(0.0, 1.0)
}

/// Standard normal CDF (Abramowitz-Stegun 7.1.26 for erf, error < 1.5e-7).
fn normal_cdf(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-x * x).exp();
    0.5 * (1.0 + if x >= 0.0 { erf } else { -erf })
}

/// The standard normal quantile: the `z` with `normal_cdf(z) = q`, by bisection on
/// [`normal_cdf`] (to 1e-9 in z; `q` is clamped to (1e-15, 1 − 1e-15)).
pub fn normal_quantile(q: f64) -> f64 {
    let q = q.clamp(1e-15, 1.0 - 1e-15);
    let (mut lo, mut hi) = (-9.0f64, 9.0f64);
    while hi - lo > 1e-9 {
        let mid = 0.5 * (lo + hi);
        if normal_cdf(mid) < q {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// Two modes of one sample set: each group's median and size, lower first.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Modes {
    /// Median of the lower and of the upper group.
    pub medians: [f64; 2],
    /// Samples in each group.
    pub counts: [usize; 2],
}

/// Median, its 95% CI, and the range of one sample set.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Median.
    pub median: f64,
    /// 95% bootstrap CI of the median.
    pub ci95: [f64; 2],
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Number of samples.
    pub n: usize,
}

impl Summary {
    /// Summarises `samples` with a CI seeded by `seed`.
    pub fn of(samples: &[f64], seed: u64) -> Summary {
        let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
        let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Summary {
            median: median(samples),
            ci95: bootstrap_median_ci(samples, seed),
            min,
            max,
            n: samples.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counting ranks gives each resample's median exactly as sorting the drawn values does:
    /// odd and even sizes, ties, signed zeros, one sample.
    #[test]
    fn counted_resample_medians_equal_sorted_ones_bit_for_bit() {
        let mut shapes: Vec<Vec<f64>> = vec![
            vec![4.0],
            vec![2.0, 1.0],
            vec![0.0, -0.0, 0.0, -0.0, 1.0],
            vec![3.0, 3.0, 3.0, 1.0, 1.0, 2.0],
            exponential(41, 2.0, 5),
            normal(200, 10.0, 3.0, 6),
        ];
        shapes.push(shapes[4].iter().map(|x| x.round()).collect());
        for sample in &shapes {
            let (mut counted, mut sorted) =
                (ChaCha8Rng::seed_from_u64(11), ChaCha8Rng::seed_from_u64(11));
            let mut resampler = MedianResampler::new(sample);
            for _ in 0..300 {
                let mut drawn: Vec<f64> = (0..sample.len())
                    .map(|_| sample[sorted.random_range(0..sample.len())])
                    .collect();
                let expected = median_in_place(&mut drawn);
                let got = resampler.median(&mut counted);
                assert_eq!(got.to_bits(), expected.to_bits(), "{sample:?}");
            }
        }
    }

    /// Inverse-CDF samples of known distributions, from a fixed seed.
    fn normal(n: usize, mean: f64, sd: f64, seed: u64) -> Vec<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                // Box-Muller.
                let u1: f64 = rng.random_range(f64::EPSILON..1.0);
                let u2: f64 = rng.random_range(0.0..1.0);
                mean + sd * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
            })
            .collect()
    }

    fn exponential(n: usize, mean: f64, seed: u64) -> Vec<f64> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        (0..n)
            .map(|_| -mean * rng.random_range(f64::EPSILON..1.0f64).ln())
            .collect()
    }

    #[test]
    fn identical_samples_have_that_value_as_their_interval() {
        assert_eq!(bootstrap_median_ci(&[2.5; 20], 1), [2.5, 2.5]);
        // One differing sample and the interval comes from resampling again.
        let mut v = vec![2.5; 19];
        v.push(9.0);
        let ci = bootstrap_median_ci(&v, 1);
        assert!(ci[0] <= 2.5 && ci[1] >= 2.5, "{ci:?}");
    }

    #[test]
    fn median_of_odd_even_and_identical_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[65.0; 7]), 65.0);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn ci_of_identical_samples_is_a_point() {
        let s = Summary::of(&[8193.0; 20], 1);
        assert_eq!(s.ci95, [8193.0, 8193.0]);
        assert_eq!((s.min, s.max, s.n), (8193.0, 8193.0, 20));
    }

    #[test]
    fn bootstrap_ci_covers_the_true_median_at_about_the_nominal_rate() {
        // Over 200 independent samples of n=41 from N(10, 2), a 95% interval should contain the
        // true median 10 in roughly 95% of cases; a broken bootstrap (wrong quantiles,
        // resampling without replacement) lands far outside 85..=100%.
        let covered = (0..200u64)
            .filter(|i| {
                let s = normal(41, 10.0, 2.0, 1000 + i);
                let [lo, hi] = bootstrap_median_ci(&s, *i);
                lo <= 10.0 && 10.0 <= hi
            })
            .count();
        assert!((170..=200).contains(&covered), "coverage {covered}/200");
    }

    #[test]
    fn bootstrap_ci_of_a_skewed_distribution_brackets_its_median() {
        // Exponential(mean 5): median is 5 ln 2.
        let truth = 5.0 * std::f64::consts::LN_2;
        let s = exponential(400, 5.0, 7);
        let [lo, hi] = bootstrap_median_ci(&s, 3);
        assert!(lo < truth && truth < hi, "[{lo}, {hi}] vs {truth}");
        assert!(hi - lo < 1.5, "interval too wide: [{lo}, {hi}]");
    }

    #[test]
    fn bootstrap_is_reproducible_from_its_seed() {
        let s = exponential(30, 1.0, 9);
        assert_eq!(bootstrap_median_ci(&s, 42), bootstrap_median_ci(&s, 42));
        assert_ne!(bootstrap_median_ci(&s, 42), bootstrap_median_ci(&s, 43));
    }

    #[test]
    fn ratio_ci_brackets_the_true_ratio_and_excludes_one_when_different() {
        let a = normal(40, 75.0, 10.0, 1);
        let b = normal(40, 1.0, 0.1, 2);
        let [lo, hi] = bootstrap_ratio_ci(&a, &b, 5);
        assert!(lo < 75.0 && 75.0 < hi, "[{lo}, {hi}]");
        assert!(lo > 1.0);
        let c = normal(40, 1.0, 0.1, 3);
        let [lo, hi] = bootstrap_ratio_ci(&b, &c, 5);
        assert!(lo < 1.0 && 1.0 < hi, "same distribution: [{lo}, {hi}]");
    }

    #[test]
    fn seeds_differ_by_label_and_are_stable() {
        assert_eq!(seed_for(1, &["a", "b"]), seed_for(1, &["a", "b"]));
        assert_ne!(seed_for(1, &["a", "b"]), seed_for(1, &["ab"]));
        assert_ne!(seed_for(1, &["a"]), seed_for(2, &["a"]));
    }

    #[test]
    fn mann_whitney_separates_shifted_samples_and_not_identical_ones() {
        // Textbook case: complete separation of 5 vs 5 gives U = 0, p ≈ 0.012 (normal
        // approximation with continuity correction).
        let a = [1.0, 2.0, 3.0, 4.0, 5.0];
        let b = [6.0, 7.0, 8.0, 9.0, 10.0];
        let p = mann_whitney_p(&a, &b);
        assert!((p - 0.0122).abs() < 0.002, "p = {p}");
        assert!(mann_whitney_p(&a, &a) > 0.9);
        assert_eq!(mann_whitney_p(&[3.0; 6], &[3.0; 6]), 1.0);
        let x = normal(60, 10.0, 1.0, 1);
        let y = normal(60, 10.0, 1.0, 2);
        assert!(mann_whitney_p(&x, &y) > 0.05, "same distribution flagged");
        let z = normal(60, 11.0, 1.0, 3);
        assert!(mann_whitney_p(&x, &z) < 0.001, "a 1-sd shift missed");
    }

    #[test]
    fn normal_cdf_matches_tables() {
        assert!((normal_cdf(0.0) - 0.5).abs() < 1e-7);
        assert!((normal_cdf(1.96) - 0.975).abs() < 1e-4);
        assert!((normal_cdf(-1.0) - 0.158_655).abs() < 1e-4);
        assert!((normal_quantile(0.975) - 1.96).abs() < 1e-3);
        assert!((normal_quantile(0.5)).abs() < 1e-6);
        assert!((normal_quantile(0.001) + 3.090).abs() < 1e-3);
    }

    #[test]
    fn quantiles_interpolate() {
        let s = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert_eq!(quantile_sorted(&s, 0.0), 1.0);
        assert_eq!(quantile_sorted(&s, 1.0), 5.0);
        assert_eq!(quantile_sorted(&s, 0.5), 3.0);
        assert!((quantile_sorted(&s, 0.125) - 1.5).abs() < 1e-12);
    }

    #[test]
    fn exact_rank_test_matches_hand_counts_and_knows_its_floor() {
        // Fully separated 3 vs 3: 2 of 20 splits are as extreme (both tails).
        let p = exact_rank_p(&[1.0, 2.0, 3.0], &[10.0, 11.0, 12.0]);
        assert!((p - 0.1).abs() < 1e-12, "{p}");
        assert!((exact_min_p(3, 3) - 0.1).abs() < 1e-12);
        // 4 vs 4 separated: 2 / 70.
        let p = exact_rank_p(&[1.0, 2.0, 3.0, 4.0], &[10.0, 11.0, 12.0, 13.0]);
        assert!((p - 2.0 / 70.0).abs() < 1e-12, "{p}");
        assert_eq!(exact_min_n(0.05), 4);
        // Identical samples: nothing to see.
        assert!((exact_rank_p(&[1.0, 1.0, 1.0], &[1.0, 1.0]) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn the_rank_tests_direction_is_bs_side_of_the_mean_at_any_size() {
        use std::cmp::Ordering::{Equal, Greater, Less};
        let up = rank_test(&[1.0, 2.0, 3.0], &[10.0, 11.0, 12.0]);
        assert_eq!(up.b_ranks, Greater);
        assert_eq!(up.p, exact_rank_p(&[1.0, 2.0, 3.0], &[10.0, 11.0, 12.0]));
        assert_eq!(rank_test(&[10.0, 11.0], &[1.0, 2.0, 3.0]).b_ranks, Less);
        assert_eq!(rank_test(&[2.0; 4], &[2.0; 5]).b_ranks, Equal);
        // Medians tie at 0 while a minority of A stalled: the ranks still see it.
        let a = [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        assert_eq!(rank_test(&a, &[0.0; 7]).b_ranks, Less);
        // Past the exact test's size (the normal approximation's p), the same ranking.
        let big_a: Vec<f64> = (0..40).map(f64::from).collect();
        let big_b: Vec<f64> = (20..60).map(f64::from).collect();
        let t = rank_test(&big_a, &big_b);
        assert_eq!((t.b_ranks, t.p), (Greater, mann_whitney_p(&big_a, &big_b)));
        assert_eq!(rank_test(&[], &[1.0]).b_ranks, Equal);
    }
}
