//! A/B comparison of two sample sets: ratio of medians with a bootstrap CI, and a verdict.

use serde::{Deserialize, Serialize};

use super::class::MetricClass;
use super::direction::Better;
use super::statistics::{bootstrap_ratio_ci, exact_rank_p, median, seed_for};
use super::verdict::{self, ALPHA, Call, Correction, Evidence, Family, Undecided};
use crate::record::VariantRecord;

pub use crate::record::{StallCause, Verdict};

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
    let p_value = exact_rank_p(fast_s, slow_s);
    let mut v = Verdict {
        metric: metric.to_string(),
        faster: fast.to_string(),
        slower: slow.to_string(),
        ratio,
        ci95,
        significant: false,
        too_few: false,
        n: [fast_s.len(), slow_s.len()],
        p_value,
        p_adjusted: p_value,
        unit: unit.to_string(),
        medians: [fast_m, slow_m],
        cause: None,
        exact: false,
        undecided: None,
        baseline: None,
    };
    v.exact = verdict::constant(fast_s) && verdict::constant(slow_s);
    v.rejudge(Family::alone(v.n, ALPHA));
    v
}

/// The minimum effect a variant verdict in a run must show (`run` has no `--threshold`).
pub const RUN_THRESHOLD: f64 = 0.05;

/// The verdict rule's evidence of a comparison in the `family` judged with it: a [`Verdict`]
/// and an [`AbComparison`] keep it in fields of the same names.
macro_rules! evidence {
    ($comparison:expr, $family:expr) => {
        Evidence {
            n: $comparison.n,
            ratio: $comparison.ratio,
            ci95: $comparison.ci95,
            p_value: $comparison.p_value,
            p_adjusted: $comparison.p_adjusted,
            family: $family,
            exact: $comparison.exact,
        }
    };
}

/// Why the rule's `call` is not decided, when it is not.
fn undecided(call: &Call) -> Option<Undecided> {
    match call {
        Call::NotDecided(why) => Some(*why),
        _ => None,
    }
}

impl Verdict {
    /// Applies the verdict rule to this verdict's evidence (its `p_adjusted` as it stands, its
    /// place in the family judged with it).
    fn rejudge(&mut self, family: Family) {
        let call = verdict::call(&evidence!(self, family), RUN_THRESHOLD, ALPHA);
        self.undecided = undecided(&call);
        self.too_few = matches!(self.undecided, Some(Undecided::TooFew { .. }));
        self.significant = call == Call::Higher;
    }
}

/// `variant` against `baseline` on one metric (lower is better): [`compare`], with the side it
/// is against named, so its words and class read "variant against baseline".
pub fn against(
    metric: &str,
    unit: &str,
    (baseline, a): (&str, &[f64]),
    (variant, b): (&str, &[f64]),
    seed: u64,
) -> Verdict {
    Verdict {
        baseline: Some(baseline.to_string()),
        ..compare(metric, unit, (baseline, a), (variant, b), seed)
    }
}

/// Each `(variant, baseline)` pair of `variants` on `metric`, judged together (Holm over the
/// pairs), in the order given; a pair whose side did not produce the metric is left out.
pub fn against_baselines(
    variants: &[VariantRecord],
    metric: &str,
    pairs: &[(String, String)],
    seed: u64,
) -> Vec<Verdict> {
    let ok = |name: &str| {
        variants
            .iter()
            .find(|v| v.name == name && v.is_ok())
            .and_then(|v| v.metrics.get(metric))
    };
    let mut out: Vec<Verdict> = pairs
        .iter()
        .filter_map(|(variant, baseline)| {
            let (b, a) = (ok(variant)?, ok(baseline)?);
            Some(against(
                metric,
                &a.unit,
                (baseline, &a.samples),
                (variant, &b.samples),
                seed_for(seed, &["verdict", baseline, variant]),
            ))
        })
        .collect();
    judge_variants_together(&mut out);
    out
}

impl Verdict {
    /// The side judged against: the baseline, or for records without one the faster side
    /// (those compared every variant against the fastest).
    pub fn against(&self) -> &str {
        self.baseline.as_deref().unwrap_or(&self.faster)
    }

    /// The side judged: the one that is not the baseline.
    pub fn variant(&self) -> &str {
        if self.against() == self.faster {
            &self.slower
        } else {
            &self.faster
        }
    }

    /// Whether the judged side has the lower median.
    fn variant_is_faster(&self) -> bool {
        self.variant() == self.faster && self.faster != self.slower
    }

    /// The medians of the judged side and of the baseline.
    pub fn medians_variant_baseline(&self) -> [f64; 2] {
        let [fast, slow] = self.medians;
        if self.variant_is_faster() {
            [fast, slow]
        } else {
            [slow, fast]
        }
    }

    /// The verdict in the one vocabulary: the judged side against its baseline.
    pub fn class(&self) -> MetricClass {
        if self.undecided.is_some() {
            MetricClass::NotDecided
        } else if !self.significant {
            MetricClass::NoChange
        } else if self.variant_is_faster() {
            MetricClass::Faster
        } else {
            MetricClass::Slower
        }
    }
}

/// Every variant that produced `metric` against the one with the lowest median of it (lower is
/// better), in variant order, in the metric's recorded unit. Not a scenario's default any
/// more (each declares its question: `scenario::Question`); `hvlab run --against-fastest`
/// asks for it.
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
    let mut out: Vec<Verdict> = ok
        .iter()
        .filter(|v| v.name != best.name)
        .map(|v| {
            against(
                metric,
                &best.metrics[metric].unit,
                (&best.name, &best.metrics[metric].samples),
                (&v.name, &v.metrics[metric].samples),
                seed_for(seed, &["verdict", &best.name, &v.name]),
            )
        })
        .collect();
    judge_variants_together(&mut out);
    out
}

/// Verdicts of one run's variants judged together: Holm over their p-values, then the rule.
pub fn judge_variants_together(verdicts: &mut [Verdict]) {
    let p: Vec<f64> = verdicts.iter().map(|v| v.p_value).collect();
    let n: Vec<[usize; 2]> = verdicts.iter().map(|v| v.n).collect();
    let adjusted = verdict::holm(&p);
    let families = verdict::family(&p, &n, Correction::Holm, ALPHA);
    for ((v, p), family) in verdicts.iter_mut().zip(adjusted).zip(families) {
        v.p_adjusted = p;
        v.rejudge(family);
    }
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
    /// The p-value after the correction for the comparisons judged together.
    #[serde(default)]
    pub p_adjusted: f64,
    /// The correction applied.
    #[serde(default)]
    pub correction: Correction,
    /// How many comparisons were judged together.
    #[serde(default)]
    pub judged_together: usize,
    /// The level a difference is called at (0.05; 0.01 for `--fail-on-regression`).
    #[serde(default)]
    pub alpha: f64,
    /// Samples per side the rule needs at this level (equal sides).
    pub min_n: usize,
    /// Whether these sample counts can give a verdict at all (at least 4 per side and
    /// `2 / C(nA + nB, nA) < alpha`).
    pub enough_samples: bool,
    /// Neither side has any spread: judged by the ratio alone.
    #[serde(default)]
    pub exact: bool,
    /// B against A.
    pub verdict: MetricClass,
    /// Why it was not decided and what would decide it ([`MetricClass::NotDecided`] only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undecided: Option<Undecided>,
    /// The threshold a change must exceed, as a fraction.
    pub threshold: f64,
    /// Which way is better: FASTER is B lower, or for a higher-is-better metric (pages per
    /// ms) B higher. Left out of stored comparisons when lower.
    #[serde(default, skip_serializing_if = "Better::is_lower")]
    pub better: Better,
}

/// The fewest samples per side the rule can call anything with at level `alpha`.
pub fn min_n(alpha: f64) -> usize {
    super::statistics::exact_min_n(alpha).max(verdict::MIN_PER_SIDE)
}

impl AbComparison {
    /// Applies the verdict rule to this comparison's evidence at its level: its `p_adjusted`
    /// as it stands, its place in the `family` judged with it.
    pub fn rejudge(&mut self, family: Family) {
        self.min_n = min_n(self.alpha);
        self.enough_samples = if self.exact {
            self.n.iter().all(|&n| n >= verdict::MIN_PER_SIDE)
        } else {
            self.n.iter().all(|&n| n >= verdict::MIN_PER_SIDE) && family.attainable < self.alpha
        };
        let call = verdict::call(&evidence!(self, family), self.threshold, self.alpha);
        self.undecided = undecided(&call);
        self.verdict = match (call, self.better) {
            (Call::Lower, Better::Lower) | (Call::Higher, Better::Higher) => MetricClass::Faster,
            (Call::Higher, Better::Lower) | (Call::Lower, Better::Higher) => MetricClass::Slower,
            (Call::NoChange, _) => MetricClass::NoChange,
            (Call::NotDecided(_), _) => MetricClass::NotDecided,
        };
    }
}

/// Judges comparisons made together (every metric and variant of one `compare`): corrects
/// their p-values with `correction` and calls each at level `alpha`.
pub fn judge_together(comparisons: &mut [&mut AbComparison], alpha: f64, correction: Correction) {
    let p: Vec<f64> = comparisons.iter().map(|c| c.p_value).collect();
    let n: Vec<[usize; 2]> = comparisons.iter().map(|c| c.n).collect();
    let adjusted = verdict::adjust(&p, correction);
    let families = verdict::family(&p, &n, correction, alpha);
    let m = comparisons.len();
    for ((c, p), family) in comparisons.iter_mut().zip(adjusted).zip(families) {
        c.p_adjusted = p;
        c.correction = correction;
        c.judged_together = m;
        c.alpha = alpha;
        c.rejudge(family);
    }
}

/// Compares side B against side A by the verdict rule ([`verdict::call`]) as one comparison
/// at p < 0.05; [`judge_together`] corrects a family of them and sets their level. A change
/// counts when the exact rank test gives p below the level and the whole 95% interval of the
/// ratio lies beyond `threshold` (a fraction, 0.05 for 5%). When nothing could be called (too
/// few samples, or a difference the samples cannot establish) the verdict is
/// [`MetricClass::NotDecided`] and the text says what would decide it.
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
    let p_value = exact_rank_p(a, b);
    let mut c = AbComparison {
        metric: metric.into(),
        unit: unit.into(),
        a: name_a.into(),
        b: name_b.into(),
        n: [a.len(), b.len()],
        median: [ma, mb],
        ratio,
        ci95,
        p_value,
        p_adjusted: p_value,
        correction: Correction::Holm,
        judged_together: 1,
        alpha: ALPHA,
        min_n: min_n(ALPHA),
        enough_samples: false,
        exact: verdict::constant(a) && verdict::constant(b),
        verdict: MetricClass::NoChange,
        undecided: None,
        threshold,
        better: Better::Lower,
    };
    c.rejudge(Family::alone(c.n, ALPHA));
    c
}

impl AbComparison {
    /// The same comparison, judged as `better` says: a higher-is-better metric that went up
    /// is FASTER, not SLOWER.
    pub fn judged_by(mut self, better: Better) -> AbComparison {
        self.better = better;
        self.rejudge(Family::alone(self.n, self.alpha));
        self
    }

    /// Whether B's median is established higher than A's (whichever way is better).
    pub fn b_higher(&self) -> bool {
        match self.better {
            Better::Lower => self.verdict == MetricClass::Slower,
            Better::Higher => self.verdict == MetricClass::Faster,
        }
    }

    /// Whether B's median is established lower than A's.
    pub fn b_lower(&self) -> bool {
        match self.better {
            Better::Lower => self.verdict == MetricClass::Faster,
            Better::Higher => self.verdict == MetricClass::Slower,
        }
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
            // Without a declared baseline the faster side is the one judged against.
            assert!(
                v.to_string()
                    .starts_with("irqchip-first against memslots-first: SLOWER on ready_ms, "),
                "{v}"
            );
            assert_eq!(v.class(), MetricClass::Slower);
            let named = against(
                "ready_ms",
                "ms",
                ("irqchip-first", &slow),
                ("memslots-first", &fast),
                1,
            );
            assert_eq!(named.class(), MetricClass::Faster);
            assert!(
                named
                    .to_string()
                    .starts_with("memslots-first against irqchip-first: FASTER on ready_ms, "),
                "{named}"
            );
        }
    }

    #[test]
    fn ab_verdicts_respect_direction_and_threshold() {
        let a = [7.4, 7.6, 7.5, 7.7, 7.5, 7.6, 7.4, 7.8];
        let b = [0.50, 0.51, 0.49, 0.52, 0.50, 0.48, 0.51, 0.50];
        let v = ab("ready_ms", "ms", ("A", &a), ("B", &b), 0.05, 1);
        assert_eq!(v.verdict, MetricClass::Faster);
        assert!(v.ci95[1] < 1.0);
        assert_eq!(
            ab("ready_ms", "ms", ("B", &b), ("A", &a), 0.05, 1).verdict,
            MetricClass::Slower
        );
        // A real but tiny change stays under the threshold.
        let c: Vec<f64> = a.iter().map(|x| x * 1.02).collect();
        assert_eq!(
            ab("ready_ms", "ms", ("A", &a), ("C", &c), 0.05, 1).verdict,
            MetricClass::NoChange
        );
    }

    /// A rate that went up is FASTER when higher is better (pages per ms), SLOWER when it
    /// went down; the words give the factor of the change either way, and the stored
    /// comparison keeps which way it was judged.
    #[test]
    fn a_higher_is_better_metric_that_went_up_is_faster() {
        let a = [100.0, 101.0, 99.0, 100.5, 100.0, 99.5, 100.2, 99.8];
        let b: Vec<f64> = a.iter().map(|x| x * 1.5).collect();
        let up = ab(
            "total_pages_per_ms",
            "pages/ms",
            ("A", &a),
            ("B", &b),
            0.05,
            1,
        )
        .judged_by(Better::Higher);
        assert_eq!(up.verdict, MetricClass::Faster);
        assert!(up.b_higher() && !up.b_lower());
        assert!(up.to_string().contains("FASTER, 1.5"), "{up}");
        let down = ab(
            "total_pages_per_ms",
            "pages/ms",
            ("A", &b),
            ("B", &a),
            0.05,
            1,
        )
        .judged_by(Better::Higher);
        assert_eq!(down.verdict, MetricClass::Slower);
        assert!(down.to_string().contains("SLOWER, 1.5"), "{down}");
        let json = serde_json::to_value(&down).expect("json");
        assert_eq!(json["better"], "higher");
        // Lower is better by default, and left out of the JSON.
        let cost = ab("ready_ms", "ms", ("A", &a), ("B", &b), 0.05, 1);
        assert_eq!(cost.verdict, MetricClass::Slower);
        assert!(
            serde_json::to_value(&cost)
                .expect("json")
                .get("better")
                .is_none()
        );
    }

    #[test]
    fn overlapping_samples_are_no_change_only_when_tight_enough_to_rule_one_out() {
        // ±10% noise, 6 a side: the medians agree but the interval reaches past ±5%.
        let a = [1.0, 1.2, 0.9, 1.1, 1.0, 1.05];
        let b = [1.1, 0.95, 1.0, 1.15, 1.0, 0.98];
        let v = compare("ready_ms", "ms", ("a", &a), ("b", &b), 1);
        assert!(!v.significant, "{v:?}");
        assert!(v.to_string().contains("NOT DECIDED"), "{v}");
        // ±1% noise: the interval fits inside ±5%.
        let a = [1.0, 1.01, 0.99, 1.005, 1.0, 0.995];
        let b = [1.0, 0.99, 1.01, 1.0, 1.005, 0.995];
        let v = compare("ready_ms", "ms", ("a", &a), ("b", &b), 1);
        assert!(!v.significant, "{v:?}");
        assert!(v.to_string().contains("NO CHANGE"), "{v}");
    }
}
