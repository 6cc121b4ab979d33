//! A/B comparison of two sample sets: ratio of medians with a bootstrap CI, and a verdict.

use serde::{Deserialize, Serialize};

use super::statistics::{bootstrap_ratio_ci, median, seed_for};
use crate::record::VariantRecord;

/// The outcome of comparing a faster candidate against a slower one on one metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// The metric compared.
    pub metric: String,
    /// The side with the lower median.
    pub faster: String,
    /// The side with the higher median.
    pub slower: String,
    /// median(slower) / median(faster): how many times faster `faster` is.
    pub ratio: f64,
    /// 95% bootstrap CI of that ratio.
    pub ci95: [f64; 2],
    /// Whether the CI excludes 1.
    pub significant: bool,
    /// The unit of the medians.
    #[serde(default)]
    pub unit: String,
    /// Medians of the faster and the slower side.
    #[serde(default)]
    pub medians: [f64; 2],
    /// The stall that explains the gap, where the analysis found one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<StallCause>,
}

/// An SRCU stall that explains why the slower side of a verdict is slower.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StallCause {
    /// The ioctl that waited.
    pub ioctl: String,
    /// The registration that started the grace period.
    pub caused_by: Option<String>,
    /// How long it took (median), ms.
    pub median_ms: f64,
    /// Its excess, in jiffies.
    pub jiffies: f64,
}

/// Compares two sample sets of a lower-is-better metric. `unit` labels the medians.
pub fn compare(
    metric: &str,
    unit: &str,
    (name_a, a): (&str, &[f64]),
    (name_b, b): (&str, &[f64]),
    seed: u64,
) -> Verdict {
    let (ma, mb) = (median(a), median(b));
    let ((fast, fast_s, fast_m), (slow, slow_s, slow_m)) = if ma <= mb {
        ((name_a, a, ma), (name_b, b, mb))
    } else {
        ((name_b, b, mb), (name_a, a, ma))
    };
    let ratio = slow_m / fast_m;
    let ci95 = bootstrap_ratio_ci(slow_s, fast_s, seed);
    let significant = ci95[0] > 1.0 || ci95[1] < 1.0;
    Verdict {
        metric: metric.to_string(),
        faster: fast.to_string(),
        slower: slow.to_string(),
        ratio,
        ci95,
        significant,
        unit: unit.to_string(),
        medians: [fast_m, slow_m],
        cause: None,
    }
}

/// Every variant that produced `metric` against the one with the lowest median of it (lower is
/// better), in variant order, in the metric's recorded unit.
pub fn against_fastest(variants: &[VariantRecord], metric: &str, seed: u64) -> Vec<Verdict> {
    let ok: Vec<&VariantRecord> = variants
        .iter()
        .filter(|v| v.is_ok() && v.metrics.contains_key(metric))
        .collect();
    let Some(best) = ok.iter().min_by(|a, b| {
        a.metrics[metric]
            .median
            .total_cmp(&b.metrics[metric].median)
    }) else {
        return Vec::new();
    };
    ok.iter()
        .filter(|v| v.name != best.name)
        .map(|v| {
            compare(
                metric,
                &best.metrics[metric].unit,
                (&best.name, &best.metrics[metric].samples),
                (&v.name, &v.metrics[metric].samples),
                seed_for(seed, &["verdict", &best.name, &v.name]),
            )
        })
        .collect()
}

/// An A/B comparison of two builds, hosts or policies on one metric (lower is better).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbComparison {
    /// The metric.
    pub metric: String,
    /// Its unit.
    pub unit: String,
    /// What side A is (run ids, variant).
    pub a: String,
    /// What side B is.
    pub b: String,
    /// Samples per side (per-run medians when a side has several runs).
    pub n: [usize; 2],
    /// Medians.
    pub median: [f64; 2],
    /// median(B) / median(A).
    pub ratio: f64,
    /// 95% bootstrap CI of the ratio.
    pub ci95: [f64; 2],
    /// Two-sided p-value of the exact rank (permutation) test.
    pub p_value: f64,
    /// Samples per side the exact test needs before it can reach p < 0.05 (equal sides).
    pub min_n: usize,
    /// Whether these sample counts can give a verdict at all (`2 / C(nA + nB, nA) < 0.05`).
    pub enough_samples: bool,
    /// B against A.
    pub verdict: AbVerdict,
    /// The threshold a change must exceed, as a fraction.
    pub threshold: f64,
}

/// What an A/B comparison concluded; serialized as the words scripts match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AbVerdict {
    /// B is significantly faster.
    #[serde(rename = "faster")]
    Faster,
    /// B is significantly slower: a regression.
    #[serde(rename = "slower")]
    Slower,
    /// No change beyond the threshold with confidence.
    #[serde(rename = "no significant change")]
    NoChange,
    /// Too few samples for the exact test to reach p < 0.05.
    #[serde(rename = "too few samples")]
    TooFew,
}

/// Compares side B against side A: a change counts when the ratio's CI excludes 1, the exact
/// rank test agrees (p < 0.05), and it is larger than `threshold` (a fraction, 0.05 for 5%).
/// With so few samples that no split could reach p < 0.05 (3 per side), the verdict is
/// [`AbVerdict::TooFew`] and the text says how many are needed.
pub fn ab(
    metric: &str,
    unit: &str,
    (name_a, a): (&str, &[f64]),
    (name_b, b): (&str, &[f64]),
    threshold: f64,
    seed: u64,
) -> AbComparison {
    let (ma, mb) = (median(a), median(b));
    let ratio = mb / ma;
    let ci95 = bootstrap_ratio_ci(b, a, seed);
    let p_value = super::statistics::exact_rank_p(a, b);
    let min_n = super::statistics::exact_min_n(0.05);
    let enough_samples = super::statistics::exact_min_p(a.len(), b.len()) < 0.05;
    let verdict = if !enough_samples {
        AbVerdict::TooFew
    } else if p_value < 0.05 && ci95[1] < 1.0 && ratio < 1.0 - threshold {
        AbVerdict::Faster
    } else if p_value < 0.05 && ci95[0] > 1.0 && ratio > 1.0 + threshold {
        AbVerdict::Slower
    } else {
        AbVerdict::NoChange
    };
    AbComparison {
        metric: metric.into(),
        unit: unit.into(),
        a: name_a.into(),
        b: name_b.into(),
        n: [a.len(), b.len()],
        median: [ma, mb],
        ratio,
        ci95,
        p_value,
        min_n,
        enough_samples,
        verdict,
        threshold,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_names_the_faster_side_whichever_order_it_is_given_in() {
        let slow = [7.4, 7.6, 7.5, 7.7, 7.5, 7.6];
        let fast = [0.10, 0.11, 0.12, 0.11, 0.10, 0.11];
        for v in [
            compare(
                "ready_ms",
                "ms",
                ("irqchip-first", &slow),
                ("memslots-first", &fast),
                1,
            ),
            compare(
                "ready_ms",
                "ms",
                ("memslots-first", &fast),
                ("irqchip-first", &slow),
                1,
            ),
        ] {
            assert_eq!(v.faster, "memslots-first");
            assert!(v.significant);
            assert!(v.ratio > 60.0 && v.ratio < 80.0, "{}", v.ratio);
            assert!(v.ci95[0] > 1.0);
            assert!(v.to_string().starts_with("memslots-first is "), "{v}");
        }
    }

    #[test]
    fn ab_verdicts_respect_direction_and_threshold() {
        let a = [7.4, 7.6, 7.5, 7.7, 7.5, 7.6, 7.4, 7.8];
        let b = [0.50, 0.51, 0.49, 0.52, 0.50, 0.48, 0.51, 0.50];
        let v = ab("ready_ms", "ms", ("A", &a), ("B", &b), 0.05, 1);
        assert_eq!(v.verdict, AbVerdict::Faster);
        assert!(v.ci95[1] < 1.0);
        assert_eq!(
            ab("ready_ms", "ms", ("B", &b), ("A", &a), 0.05, 1).verdict,
            AbVerdict::Slower
        );
        // A real but tiny change stays under the threshold.
        let c: Vec<f64> = a.iter().map(|x| x * 1.02).collect();
        assert_eq!(
            ab("ready_ms", "ms", ("A", &a), ("C", &c), 0.05, 1).verdict,
            AbVerdict::NoChange
        );
    }

    #[test]
    fn overlapping_samples_are_no_significant_difference() {
        let a = [1.0, 1.2, 0.9, 1.1, 1.0, 1.05];
        let b = [1.1, 0.95, 1.0, 1.15, 1.0, 0.98];
        let v = compare("ready_ms", "ms", ("a", &a), ("b", &b), 1);
        assert!(!v.significant, "{v:?}");
        assert!(v.to_string().contains("no significant difference"));
    }
}
