//! `hvlab kab A B`: a kernel A/B. Boots A and B alternately (ABBA over `--boots`), runs the
//! scenarios in each, and judges each metric as far as the accelerator lets it be trusted:
//!
//! - counts (KVM statistics, stalls, faults, exits): exact; reported as the same or as
//!   differing, a regression when B is higher in every repetition than A in any;
//! - jiffies (the lifecycle ioctls' time in jiffies of the guest's HZ: a grace-period wait is
//!   a whole number of ticks, which an emulator stretches but does not invent): the rank test
//!   of [`crate::analysis::compare::ab`];
//! - times: judged with that test only under `kvm` acceleration; under TCG every guest
//!   instruction is emulated, so they are shown and not judged.

use serde::Serialize;

use crate::analysis::compare::{AbComparison, AbVerdict, ab};
use crate::analysis::statistics::{median, seed_for};
use crate::record::{Finding, RunRecord};
use crate::scenario::runner::DEFAULT_SEED;

use crate::kernel::vm::Accel;

/// How far a metric can be trusted on this accelerator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Trust {
    /// Exact counts.
    Count,
    /// Ticks of the guest's timer.
    Jiffies,
    /// Wall-clock time.
    Time,
}

/// One metric of one variant, A against B.
#[derive(Debug, Clone, Serialize)]
pub struct MetricAb {
    /// The metric (`ioctl.KVM_SET_USER_MEMORY_REGION` in jiffies, `kvm.vcpu.pf_fixed`, ...).
    pub metric: String,
    /// Its unit.
    pub unit: String,
    /// Its trust class.
    pub trust: Trust,
    /// Samples (all repetitions of all boots) per side.
    pub samples: [Vec<f64>; 2],
    /// Medians per side.
    pub median: [f64; 2],
    /// For counts: `same`, `higher` (every B above every A), `lower`, or `differs`.
    pub exact: Option<String>,
    /// For judged jiffies and times: the rank test.
    pub comparison: Option<AbComparison>,
    /// Whether this metric was judged; when not, why.
    pub not_judged: Option<String>,
    /// Whether B regressed on it.
    pub regression: bool,
    /// When B looks worse by more than would count, but the rank test cannot tell it from
    /// noise with these samples: what was seen and what would decide it. Never a regression,
    /// never silently "no change" either.
    pub inconclusive: Option<String>,
}

/// One variant of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct VariantAb {
    /// The variant.
    pub variant: String,
    /// Its metrics.
    pub metrics: Vec<MetricAb>,
    /// What B's runs found that A's did not (an SRCU stall and the registration behind it).
    pub causes: Vec<String>,
}

/// One scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioAb {
    /// The scenario.
    pub scenario: String,
    /// Runs per side.
    pub runs: [Vec<String>; 2],
    /// Per variant both sides ran.
    pub variants: Vec<VariantAb>,
}

/// Which side a boot is.
pub fn abba(boots_per_side: u32) -> Vec<usize> {
    (0..boots_per_side * 2)
        .map(|i| usize::from(matches!(i % 4, 1 | 2)))
        .collect()
}

fn is_time(unit: &str) -> bool {
    matches!(unit, "ns" | "us" | "ms" | "s")
}

fn pooled(runs: &[&RunRecord], variant: &str, metric: &str) -> Vec<f64> {
    runs.iter()
        .filter_map(|r| r.variant(variant).filter(|v| v.is_ok()))
        .filter_map(|v| v.metrics.get(metric))
        .flat_map(|m| m.samples.iter().copied())
        .collect()
}

/// Per (stalled ioctl, cause): median jiffies per boot, stalled and measured repetitions, kernel.
type StallSeen = (Vec<f64>, usize, usize, String);

/// The SRCU stalls the runs found, one line per (stalled ioctl, registration behind it).
fn stall_causes(runs: &[&RunRecord], variant: &str) -> Vec<String> {
    let mut seen: std::collections::BTreeMap<(String, String), StallSeen> =
        std::collections::BTreeMap::new();
    for r in runs {
        let Some(v) = r.variant(variant) else {
            continue;
        };
        for f in &v.findings {
            if let Finding::SrcuStall {
                ioctl,
                caused_by,
                jiffies,
                stalled_reps,
                reps,
                ..
            } = f
            {
                let cause = caused_by
                    .clone()
                    .unwrap_or_else(|| "an unknown registration".into());
                let e = seen
                    .entry((ioctl.clone(), cause))
                    .or_insert_with(|| (Vec::new(), 0, 0, r.host.kernel.clone()));
                e.0.push(*jiffies);
                e.1 += stalled_reps;
                e.2 += reps;
            }
        }
    }
    seen.into_iter()
        .map(|((ioctl, cause), (jiffies, stalled, reps, kernel))| {
            let lo = jiffies.iter().copied().fold(f64::MAX, f64::min);
            let hi = jiffies.iter().copied().fold(f64::MIN, f64::max);
            format!(
                "{ioctl} waited for an SRCU grace period started by {cause}: {lo:.1}–{hi:.1} jiffies over its baseline (median per boot), in {stalled} of {reps} repetitions on {kernel}"
            )
        })
        .collect()
}

fn of_scenario<'a>(runs: &'a [RunRecord], scenario: &str) -> Vec<&'a RunRecord> {
    runs.iter().filter(|r| r.scenario == scenario).collect()
}

/// Judges B against A, scenario by scenario.
pub fn judge(
    scenarios: &[String],
    a: &[RunRecord],
    b: &[RunRecord],
    accel: Accel,
    threshold: f64,
) -> Vec<ScenarioAb> {
    let mut out = Vec::new();
    for scenario in scenarios {
        let (ra, rb) = (of_scenario(a, scenario), of_scenario(b, scenario));
        let Some(first) = ra.first() else { continue };
        let mut variants = Vec::new();
        for v in first.variants.iter().filter(|v| v.is_ok()) {
            if !rb
                .iter()
                .any(|r| r.variant(&v.name).is_some_and(|x| x.is_ok()))
            {
                continue;
            }
            let mut metrics = Vec::new();
            for (name, m) in &v.metrics {
                let (xa, xb) = (pooled(&ra, &v.name, name), pooled(&rb, &v.name, name));
                if xa.is_empty() || xb.is_empty() {
                    continue;
                }
                // Events, and events per iteration (the exits scenario's `ratio`s).
                if m.unit == "count" || m.unit == "ratio" {
                    metrics.push(count(name, &m.unit, xa, xb, accel, threshold));
                    continue;
                }
                if !is_time(&m.unit) {
                    continue;
                }
                // The lifecycle's ioctl times in the guest's jiffies: judged everywhere.
                if scenario == "lifecycle" && name.starts_with("ioctl.") && m.unit == "ms" {
                    let jiffy_ms = |runs: &[&RunRecord]| {
                        1000.0 / f64::from(runs.first().map_or(250, |r| r.host.hz.max(1)))
                    };
                    let (ja, jb) = (jiffy_ms(&ra), jiffy_ms(&rb));
                    let xa_j: Vec<f64> = xa.iter().map(|x| x / ja).collect();
                    let xb_j: Vec<f64> = xb.iter().map(|x| x / jb).collect();
                    let metric = name.trim_end_matches("_ms").to_string();
                    let mut m = rank(
                        &metric,
                        "jiffies",
                        Trust::Jiffies,
                        xa_j,
                        xb_j,
                        threshold,
                        None,
                    );
                    // A grace period is whole ticks: a change under half a jiffy is not one
                    // gained or lost, whatever the test says about the emulator's noise.
                    if m.median[1] - m.median[0] < 0.5 {
                        m.inconclusive = None;
                        if m.regression {
                            m.regression = false;
                            m.not_judged = Some(
                                "longer by less than half a jiffy: no grace period gained".into(),
                            );
                        }
                    }
                    metrics.push(m);
                }
                let not_judged = (accel != Accel::Kvm).then(|| {
                    "TCG emulates every guest instruction: its times measure the emulator, not the kernel".to_string()
                });
                metrics.push(rank(
                    name,
                    &m.unit,
                    Trust::Time,
                    xa,
                    xb,
                    threshold,
                    not_judged,
                ));
            }
            let before = stall_causes(&ra, &v.name);
            let causes = stall_causes(&rb, &v.name)
                .into_iter()
                .filter(|c| {
                    let head = c.split(" (").next().unwrap_or(c);
                    !before.iter().any(|b| b.starts_with(head))
                })
                .collect();
            variants.push(VariantAb {
                variant: v.name.clone(),
                metrics,
                causes,
            });
        }
        out.push(ScenarioAb {
            scenario: scenario.clone(),
            runs: [
                ra.iter().map(|r| r.run_id.clone()).collect(),
                rb.iter().map(|r| r.run_id.clone()).collect(),
            ],
            variants,
        });
    }
    out
}

/// Counters that follow wall time (timer interrupts, preemptions, halts), not the code path:
/// under TCG their wall time is the emulator's.
fn timing_driven(name: &str) -> bool {
    let stat = name.rsplit('.').next().unwrap_or(name);
    stat == "exits"
        || stat.starts_with("preemption_")
        || stat.starts_with("halt_")
        || stat.ends_with("irq_exits")
        || stat == "host_state_reload"
        || stat.starts_with("nmi_")
        || stat == "signal_exits"
}

/// A count: exact when each side repeats one value; otherwise rank-tested (a stall that
/// occurs in most repetitions), except timing-driven counters under TCG (shown, not judged).
fn count(
    name: &str,
    unit: &str,
    xa: Vec<f64>,
    xb: Vec<f64>,
    accel: Accel,
    threshold: f64,
) -> MetricAb {
    let constant = |x: &[f64]| x.iter().all(|v| *v == x[0]);
    if constant(&xa) && constant(&xb) {
        return exact(name, unit, xa, xb);
    }
    if timing_driven(name) && accel != Accel::Kvm {
        let why = "a timing-driven counter (timer interrupts, preemptions), varying between repetitions; under TCG its wall time is the emulator's".to_string();
        return rank(name, unit, Trust::Count, xa, xb, threshold, Some(why));
    }
    // A count that is zero on one side has no ratio: judge it by the rank test's p and the
    // direction of the medians.
    let p = crate::analysis::statistics::exact_rank_p(&xa, &xb);
    let (ma, mb) = (median(&xa), median(&xb));
    let word = if p < 0.05 && mb > ma {
        "higher (rank test)"
    } else if p < 0.05 && mb < ma {
        "lower (rank test)"
    } else {
        "varies between repetitions, no significant change (rank test)"
    };
    let inconclusive = (p >= 0.05 && mb > ma * (1.0 + threshold)).then(|| {
        let unsettled = format!("the rank test cannot tell it from noise (p = {p:.3})");
        undecided("B's median is higher, but", &unsettled, &xa, &xb)
    });
    MetricAb {
        metric: name.to_string(),
        unit: unit.to_string(),
        trust: Trust::Count,
        median: [ma, mb],
        samples: [xa, xb],
        exact: Some(format!("{word}, p = {p:.3}")),
        comparison: None,
        not_judged: None,
        regression: word.starts_with("higher"),
        inconclusive,
    }
}

fn exact(name: &str, unit: &str, xa: Vec<f64>, xb: Vec<f64>) -> MetricAb {
    let max = |x: &[f64]| x.iter().copied().fold(f64::MIN, f64::max);
    let min = |x: &[f64]| x.iter().copied().fold(f64::MAX, f64::min);
    let (same_a, same_b) = (min(&xa) == max(&xa), min(&xb) == max(&xb));
    let word = if same_a && same_b && xa[0] == xb[0] {
        "same"
    } else if min(&xb) > max(&xa) {
        "higher"
    } else if max(&xb) < min(&xa) {
        "lower"
    } else {
        "differs"
    };
    MetricAb {
        metric: name.to_string(),
        unit: unit.to_string(),
        trust: Trust::Count,
        median: [median(&xa), median(&xb)],
        samples: [xa, xb],
        exact: Some(word.to_string()),
        comparison: None,
        not_judged: None,
        regression: word == "higher",
        inconclusive: None,
    }
}

fn rank(
    name: &str,
    unit: &str,
    trust: Trust,
    xa: Vec<f64>,
    xb: Vec<f64>,
    threshold: f64,
    not_judged: Option<String>,
) -> MetricAb {
    let seed = seed_for(DEFAULT_SEED, &["kab", name]);
    let c = ab(name, unit, ("A", &xa), ("B", &xb), threshold, seed);
    let regression = not_judged.is_none() && c.verdict == AbVerdict::Slower;
    // B beyond the threshold on the median, yet not significant: too few samples against
    // this much noise (a few emulator hiccups on one side sink a 6-sample rank test).
    let inconclusive = (not_judged.is_none()
        && c.verdict == AbVerdict::NotDecided
        && c.ratio > 1.0 + threshold)
        .then(|| {
            let (seen, unsettled) = if c.p_adjusted < c.alpha {
                (
                    format!(
                        "B's median is {:.2}× A's and the rank test separates them (p = {:.3}), but the 95% CI of the ratio ({:.2}–{:.2}) reaches below the +{:.0}% threshold, so",
                        c.ratio,
                        c.p_value,
                        c.ci95[0],
                        c.ci95[1],
                        threshold * 100.0,
                    ),
                    "the change's size is not established".to_string(),
                )
            } else {
                (
                    "B's median is higher, but".to_string(),
                    format!(
                        "the rank test cannot tell it from noise (p = {:.3})",
                        c.p_value
                    ),
                )
            };
            undecided(&seen, &unsettled, &xa, &xb)
        });
    MetricAb {
        metric: name.to_string(),
        unit: unit.to_string(),
        trust,
        median: [median(&xa), median(&xb)],
        samples: [xa, xb],
        exact: None,
        comparison: not_judged.is_none().then_some(c),
        not_judged,
        regression,
        inconclusive,
    }
}

/// Why a worse-looking B is not a verdict yet (what was seen, what is unsettled with these
/// samples), and what would make one.
fn undecided(seen: &str, unsettled: &str, xa: &[f64], xb: &[f64]) -> String {
    format!(
        "{seen} with n = {} vs {} {unsettled}; more repetitions (--reps) or boots (--boots) can decide",
        xb.len(),
        xa.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boots_alternate_abba() {
        assert_eq!(abba(2), vec![0, 1, 1, 0]);
        assert_eq!(abba(1), vec![0, 1]);
        assert_eq!(abba(3), vec![0, 1, 1, 0, 0, 1]);
    }

    #[test]
    fn counts_are_compared_exactly() {
        let m = exact("stalls", "count", vec![0.0, 0.0], vec![1.0, 1.0]);
        assert_eq!(m.exact.as_deref(), Some("higher"));
        assert!(m.regression);
        let m = exact("kvm.vcpu.pf_fixed", "count", vec![5.0, 5.0], vec![5.0, 5.0]);
        assert_eq!(m.exact.as_deref(), Some("same"));
        assert!(!m.regression);
        let m = exact("kvm.vcpu.exits", "count", vec![5.0, 7.0], vec![6.0, 5.0]);
        assert_eq!(m.exact.as_deref(), Some("differs"));
    }

    #[test]
    fn tcg_times_are_shown_not_judged() {
        let m = rank(
            "ready_ms",
            "ms",
            Trust::Time,
            vec![1.0; 8],
            vec![9.0; 8],
            0.05,
            Some("TCG".into()),
        );
        assert!(m.comparison.is_none());
        assert!(!m.regression);
        assert!(
            m.inconclusive.is_none(),
            "a time not judged is not undecided either"
        );
    }

    /// An ioctl's jiffies, judged at kab's default threshold.
    fn jiffies(a: Vec<f64>, b: Vec<f64>) -> MetricAb {
        rank("ioctl.X", "jiffies", Trust::Jiffies, a, b, 0.05, None)
    }

    /// The memslot update's jiffies from a CI run where two of A's six repetitions were
    /// stretched by the emulator: B is 5× A on the median, p = 0.13. Not a regression, and
    /// not "no change" either: inconclusive, saying what would decide it.
    #[test]
    fn a_worse_b_the_test_cannot_separate_is_inconclusive_not_no_change() {
        let a = vec![0.106, 0.099, 0.189, 1.431, 0.735, 0.102];
        let b = vec![1.658, 0.735, 0.626, 1.270, 0.514, 0.776];
        let m = jiffies(a, b);
        assert!(!m.regression);
        assert_eq!(
            m.comparison.as_ref().map(|c| c.verdict),
            Some(AbVerdict::NotDecided)
        );
        let why = m.inconclusive.expect("inconclusive");
        assert!(
            why.contains("n = 6 vs 6") && why.contains("--reps"),
            "{why}"
        );
        // The same spread with the samples a default kab takes (20 per side) decides it.
        let a: Vec<f64> = [
            0.106, 0.099, 0.189, 1.431, 0.735, 0.102, 0.09, 0.08, 0.1, 0.11,
        ]
        .repeat(2);
        let b: Vec<f64> = [1.658, 0.735, 0.626, 1.270, 0.514, 0.776, 0.9, 0.8, 1.1, 0.7].repeat(2);
        let m = jiffies(a, b);
        assert!(m.regression && m.inconclusive.is_none());
        // Separated by the rank test, but the ratio's interval reaches below the threshold.
        let a: Vec<f64> = (0..20).map(|i| 1.0 + f64::from(i) * 0.01).collect();
        let b: Vec<f64> = a.iter().map(|x| x * 1.08).collect();
        let m = jiffies(a, b);
        let c = m.comparison.as_ref().expect("judged");
        assert!(c.p_value < 0.05 && c.ci95[0] < 1.05, "{c:?}");
        let why = m.inconclusive.expect("inconclusive");
        assert!(why.contains("reaches below the +5% threshold"), "{why}");
        // Equal sides are neither.
        let m = jiffies(vec![0.1; 6], vec![0.1; 6]);
        assert!(!m.regression && m.inconclusive.is_none());
    }

    #[test]
    fn a_count_higher_on_b_without_significance_is_inconclusive() {
        let m = count(
            "stalls",
            "count",
            vec![0.0, 1.0, 0.0],
            vec![1.0, 0.0, 1.0],
            Accel::Tcg,
            0.05,
        );
        assert!(!m.regression);
        assert!(m.inconclusive.is_some(), "{m:?}");
        // Lower on B, or higher by less than the threshold: nothing to decide.
        for (a, b) in [
            (vec![1.0, 0.0, 1.0], vec![0.0, 1.0, 0.0]),
            (vec![100.0, 101.0, 99.0], vec![101.0, 100.0, 102.0]),
        ] {
            let m = count("x", "count", a, b, Accel::Tcg, 0.05);
            assert!(m.inconclusive.is_none(), "{m:?}");
        }
    }
}
