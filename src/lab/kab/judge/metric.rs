//! Judging one metric, A against B: exact counts, rank-tested counts, jiffies and times, each
//! as far as the accelerator lets it be trusted, then settled (a call, a cost, or what the
//! samples could not decide) and corrected over the kab's family.

use serde::Serialize;

use crate::analysis::class::MetricClass;
use crate::analysis::compare::{AbComparison, ab};
use crate::analysis::direction::{Declared, Direction, change_pct};
use crate::analysis::icount::{IcountAb, IcountTolerance};
use crate::analysis::metric_ab::{
    CountCall, MetricJudgement, NotJudged, RankedCount, Shift, correct_together,
};
use crate::analysis::multilevel::{BootsAb, BootsCall};
use crate::analysis::stall::STALL_JIFFIES;
use crate::analysis::statistics::{median, seed_for};
use crate::analysis::verdict::{self, ALPHA, Undecided};
use crate::kernel::vm::Accel;
use crate::record::{Finding, VariantRecord};
use crate::scenario::runner::DEFAULT_SEED;

use super::ScenarioAb;

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

/// One metric of one variant, A against B. Its JSON keeps the fields scripts read
/// (`exact`, `comparison`, `not_judged`), made from the typed judgement.
#[derive(Debug, Clone)]
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
    /// How it was judged: a count, a ranked comparison, or not at all and why.
    pub judgement: MetricJudgement,
    /// What the judgement makes of B, the declared way.
    pub outcome: MetricOutcome,
    /// Which way is better and the count tolerance, as its scenario declares them.
    pub declared: Declared,
    /// For a must-equal metric, how far each side's median is from the metric it must
    /// equal (A, B), when the variant has that metric.
    pub off_by: Option<[f64; 2]>,
}

/// What one metric's judgement makes of B, the way its scenario declares it better: one of
/// these, never two.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MetricOutcome {
    /// Judged worse: a regression.
    Regression,
    /// Judged better.
    Improvement,
    /// Significantly worse, by less than would make it a regression (a jiffies metric longer
    /// by under half a jiffy: an expedited grace period, not a normal one).
    Cost,
    /// An exact count that moved by less than its declared tolerance: a change, judged
    /// neither a regression nor an improvement.
    WithinTolerance,
    /// B looks worse by more than would count, or the family put the level out of reach, and
    /// the rank test cannot tell it from noise with these samples: what was seen (more
    /// repetitions or boots would decide it). Never a regression, never silently "no change"
    /// either.
    Inconclusive(Inconclusive),
    /// Nothing to settle: the same, within the rule's threshold, neither way better, or not
    /// judged.
    Unmoved,
}

impl MetricOutcome {
    /// What is unsettled, for an inconclusive outcome.
    pub fn inconclusive(&self) -> Option<&Inconclusive> {
        match self {
            MetricOutcome::Inconclusive(why) => Some(why),
            MetricOutcome::Regression
            | MetricOutcome::Improvement
            | MetricOutcome::Cost
            | MetricOutcome::WithinTolerance
            | MetricOutcome::Unmoved => None,
        }
    }
}

/// Why a worse-looking B is not a verdict yet: what stays unsettled with these samples.
/// Words in `src/export/kab/words.rs`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Inconclusive {
    /// What was seen and what is unsettled.
    #[serde(flatten)]
    pub unsettled: Unsettled,
    /// Samples per side (A, B).
    pub n: [usize; 2],
}

/// What a worse-looking B's comparison leaves unsettled.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Unsettled {
    /// The rank test separates the sides, but the 95% CI of the ratio reaches below the
    /// threshold: the change's size is not established.
    SizeNotEstablished {
        /// B's median over A's.
        ratio: f64,
        /// The rank test's p.
        p: CorrectedP,
        /// The 95% CI of the ratio.
        ci95: [f64; 2],
        /// The threshold (0.05 for 5%).
        threshold: f64,
    },
    /// B's median is worse, but the rank test cannot tell it from noise.
    Noise {
        /// Which way B's median moved.
        worse: WorseWay,
        /// The rank test's p.
        p: CorrectedP,
    },
    /// Judged with the boot as the unit, the interval of the ratio reaches across the
    /// threshold: more boots would decide it.
    BootsNotEstablished {
        /// The ratio of the boots' geometric means, B over A.
        ratio: f64,
        /// Its interval, at the level divided among `together`.
        ci: [f64; 2],
        /// Boots per side (A, B).
        boots: [usize; 2],
        /// Comparisons judged with the boot as the unit in the kab.
        together: usize,
    },
    /// No arrangement of the samples could reach the level once corrected.
    OutOfReach {
        /// B's median over A's.
        ratio: f64,
        /// The level.
        alpha: f64,
        /// How many comparisons were judged together.
        together: usize,
    },
}

/// A p-value, and what the correction over the comparisons judged together made of it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CorrectedP {
    /// Alone.
    pub p: f64,
    /// Corrected.
    pub adjusted: f64,
    /// How many comparisons were judged together (1: no correction).
    pub together: usize,
}

/// Which way a worse B's median moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorseWay {
    /// Higher (lower is better).
    Higher,
    /// Lower (higher is better).
    Lower,
}

/// How kab judges a metric until its scenario's declaration is read (and a test's metric):
/// lower is better, every change counts.
const LOWER_IS_BETTER: Declared = Declared {
    direction: Direction::LowerIsBetter,
    count_tolerance: 0.0,
    icount_tolerance: IcountTolerance::TIME,
    declared: true,
};

/// The direction as the JSON says it: nothing for a declared lower-is-better metric (kab's
/// default), otherwise which way and whether the scenario declared it.
fn direction_words(d: &Declared) -> Option<String> {
    match (d.declared, d.direction) {
        (true, Direction::LowerIsBetter) => None,
        (true, direction) => Some(direction.to_string()),
        (false, _) => Some("lower is better (the scenario does not declare it)".into()),
    }
}

impl Serialize for MetricAb {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// The JSON as kab has always printed it.
        #[derive(Serialize)]
        struct Json<'a> {
            metric: &'a str,
            unit: &'a str,
            trust: Trust,
            samples: &'a [Vec<f64>; 2],
            median: [f64; 2],
            exact: Option<String>,
            comparison: Option<&'a AbComparison>,
            not_judged: Option<String>,
            regression: bool,
            inconclusive: Option<&'a Inconclusive>,
            cost: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            better: Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            change_pct: Option<String>,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            within_tolerance: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            instruction_clock: Option<&'a IcountAb>,
            #[serde(skip_serializing_if = "Option::is_none")]
            boots: Option<&'a BootsAb>,
        }
        let exact = match &self.judgement {
            MetricJudgement::Count { call } => Some(call.to_string()),
            _ => None,
        };
        Json {
            metric: &self.metric,
            unit: &self.unit,
            trust: self.trust,
            samples: &self.samples,
            median: self.median,
            exact,
            comparison: self.judgement.comparison(),
            not_judged: self.judgement.not_judged().map(|why| why.to_string()),
            regression: self.outcome == MetricOutcome::Regression,
            inconclusive: self.outcome.inconclusive(),
            cost: self.outcome == MetricOutcome::Cost,
            better: direction_words(&self.declared),
            // Counts that moved, as LKP prints them.
            change_pct: (self.trust == Trust::Count && self.median[0] != self.median[1])
                .then(|| change_pct(self.median[0], self.median[1]))
                .flatten(),
            within_tolerance: self.outcome == MetricOutcome::WithinTolerance,
            instruction_clock: match &self.judgement {
                MetricJudgement::InstructionClock { judged } => Some(judged),
                _ => None,
            },
            boots: match &self.judgement {
                MetricJudgement::Boots { judged } => Some(judged),
                _ => None,
            },
        }
        .serialize(serializer)
    }
}

/// `m` judged as its scenario declares it (which way is better, its count tolerance).
pub(super) fn declared_as(mut m: MetricAb, declared: Declared, threshold: f64) -> MetricAb {
    m.declared = declared;
    settle(&mut m, threshold);
    m
}

/// Judges each must-equal metric of a variant by how far each side is from the metric it
/// must equal: B further off is worse (a page the dirty log lost), nearer is better.
pub(super) fn judge_must_equal(metrics: &mut [MetricAb], threshold: f64) {
    let medians: Vec<(String, [f64; 2])> = metrics
        .iter()
        .map(|m| (m.metric.clone(), m.median))
        .collect();
    for m in metrics.iter_mut() {
        let Direction::MustEqual(other) = m.declared.direction else {
            continue;
        };
        m.off_by = medians
            .iter()
            .find(|(name, _)| name == other)
            .map(|(_, o)| [0, 1].map(|i| (m.median[i] - o[i]).abs()));
        settle(m, threshold);
    }
}

/// Pages the guest touched per pass, where the scenario counts its faults against them.
pub(super) fn pages_touched(v: &VariantRecord) -> Option<u64> {
    v.findings.iter().find_map(|f| match f {
        Finding::FaultsPerPage { pages, .. } => Some(*pages),
        _ => None,
    })
}

/// An ioctl's time in jiffies, rank-tested; [`settle`] applies the half-jiffy rule to it.
pub(super) fn jiffies_metric(metric: &str, xa: Vec<f64>, xb: Vec<f64>, threshold: f64) -> MetricAb {
    rank(metric, "jiffies", Trust::Jiffies, xa, xb, threshold, None)
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
pub(super) fn count(
    name: &str,
    unit: &str,
    xa: Vec<f64>,
    xb: Vec<f64>,
    accel: Accel,
    threshold: f64,
) -> MetricAb {
    if verdict::constant(&xa) && verdict::constant(&xb) {
        return exact(name, unit, xa, xb);
    }
    if timing_driven(name) && accel != Accel::Kvm {
        let why = Some(NotJudged::TimingDrivenUnderTcg);
        return rank(name, unit, Trust::Count, xa, xb, threshold, why);
    }
    let call = CountCall::Varies(RankedCount::alone(&xa, &xb));
    metric_ab(
        name,
        unit,
        Trust::Count,
        [xa, xb],
        MetricJudgement::Count { call },
        threshold,
    )
}

/// A count each side of which repeats one value: the same, higher or lower, nothing to test.
pub(super) fn exact(name: &str, unit: &str, xa: Vec<f64>, xb: Vec<f64>) -> MetricAb {
    let (a, b) = (median(&xa), median(&xb));
    let call = if a == b {
        CountCall::Same
    } else if b > a {
        CountCall::Higher
    } else {
        CountCall::Lower
    };
    // No threshold applies: an exact count is never inconclusive.
    metric_ab(
        name,
        unit,
        Trust::Count,
        [xa, xb],
        MetricJudgement::Count { call },
        0.0,
    )
}

/// A time or a jiffies metric: by the verdict rule's rank test and interval, or shown and not
/// judged for `not_judged`'s reason.
pub(super) fn rank(
    name: &str,
    unit: &str,
    trust: Trust,
    xa: Vec<f64>,
    xb: Vec<f64>,
    threshold: f64,
    not_judged: Option<NotJudged>,
) -> MetricAb {
    let judgement = match not_judged {
        Some(reason) => MetricJudgement::NotJudged { reason },
        None => {
            let seed = seed_for(DEFAULT_SEED, &["kab", name]);
            MetricJudgement::Ranked {
                comparison: ab(name, unit, ("A", &xa), ("B", &xb), threshold, seed),
            }
        }
    };
    metric_ab(name, unit, trust, [xa, xb], judgement, threshold)
}

/// A time on the instruction clock, judged exactly ([`crate::analysis::icount::judge`]).
pub(super) fn instruction_clock(
    name: &str,
    unit: &str,
    xa: Vec<f64>,
    xb: Vec<f64>,
    judged: IcountAb,
) -> MetricAb {
    let judgement = MetricJudgement::InstructionClock { judged };
    // No threshold applies: the tolerance is the metric's own.
    metric_ab(name, unit, Trust::Time, [xa, xb], judgement, 0.0)
}

/// A lifecycle time in the guest's jiffies on the instruction clock: judged as any time there
/// ([`instruction_clock`]), read in virtual ticks, so the stall rule's half a jiffy applies.
pub(super) fn jiffies_on_instruction_clock(
    name: &str,
    xa: Vec<f64>,
    xb: Vec<f64>,
    judged: IcountAb,
) -> MetricAb {
    let judgement = MetricJudgement::InstructionClock { judged };
    metric_ab(name, "jiffies", Trust::Jiffies, [xa, xb], judgement, 0.0)
}

/// A wall-clock time judged with the boot as the unit
/// ([`crate::analysis::multilevel::judge`]).
pub(super) fn by_boots(
    name: &str,
    unit: &str,
    xa: Vec<f64>,
    xb: Vec<f64>,
    judged: BootsAb,
    threshold: f64,
) -> MetricAb {
    let judgement = MetricJudgement::Boots { judged };
    metric_ab(name, unit, Trust::Time, [xa, xb], judgement, threshold)
}

/// A metric with its judgement, settled ([`settle`]).
fn metric_ab(
    name: &str,
    unit: &str,
    trust: Trust,
    samples: [Vec<f64>; 2],
    judgement: MetricJudgement,
    threshold: f64,
) -> MetricAb {
    let mut m = MetricAb {
        metric: name.to_string(),
        unit: unit.to_string(),
        trust,
        median: [median(&samples[0]), median(&samples[1])],
        samples,
        judgement,
        outcome: MetricOutcome::Unmoved,
        declared: LOWER_IS_BETTER,
        off_by: None,
    };
    settle(&mut m, threshold);
    m
}

/// What a metric's judgement makes of B: a regression when judged higher; else, when B looks
/// worse beyond `threshold` or the family put the level out of reach, why the samples cannot
/// settle it. A jiffies metric follows the stall rule: B longer by under half a jiffy
/// ([`STALL_JIFFIES`]) gained no grace period, whatever the test says about the emulator's
/// noise, so it is not a regression but a cost (an expedited grace period is a fraction of a
/// jiffy), and nothing to settle.
fn settle(m: &mut MetricAb, threshold: f64) {
    let (higher, lower) = (m.judgement.higher(), m.judgement.lower());
    if (higher || lower) && within_tolerance(m) {
        m.outcome = MetricOutcome::WithinTolerance;
        return;
    }
    let (worse, better) = match m.declared.direction {
        Direction::LowerIsBetter => (higher, lower),
        Direction::HigherIsBetter => (lower, higher),
        Direction::Neither => (false, false),
        // Off its partner by more on B is worse, whichever way it moved.
        Direction::MustEqual(_) => match m.off_by {
            Some([a, b]) if higher || lower => (b > a, b < a),
            _ => (false, false),
        },
    };
    let under_half_a_jiffy = m.trust == Trust::Jiffies && m.median[1] - m.median[0] < STALL_JIFFIES;
    m.outcome = if worse && under_half_a_jiffy {
        MetricOutcome::Cost
    } else if worse {
        MetricOutcome::Regression
    } else if better {
        MetricOutcome::Improvement
    } else if under_half_a_jiffy {
        MetricOutcome::Unmoved
    } else {
        let direction = m.declared.direction;
        let unsettled = match &m.judgement {
            MetricJudgement::Ranked { comparison } => {
                ranked_unsettled(comparison, threshold, direction)
            }
            MetricJudgement::Count {
                call: CountCall::Varies(r),
            } => count_unsettled(r, m.median, threshold, direction),
            MetricJudgement::Boots { judged } => boots_unsettled(judged, threshold, direction),
            MetricJudgement::Count { .. }
            | MetricJudgement::InstructionClock { .. }
            | MetricJudgement::NotJudged { .. } => None,
        };
        unsettled.map_or(MetricOutcome::Unmoved, |unsettled| {
            MetricOutcome::Inconclusive(Inconclusive {
                unsettled,
                n: [m.samples[0].len(), m.samples[1].len()],
            })
        })
    };
}

/// Whether `m` is an exact count that moved by less than its declared tolerance (a lazy pass
/// of 4096 pages faulting 4097 times: +0.02%, under memory's 1%).
fn within_tolerance(m: &MetricAb) -> bool {
    let exact = matches!(
        m.judgement,
        MetricJudgement::Count {
            call: CountCall::Higher | CountCall::Lower
        }
    );
    let [a, b] = m.median;
    exact && a != 0.0 && ((b - a) / a).abs() < m.declared.count_tolerance
}

/// Whether a median ratio B/A looks worse, beyond `threshold`, the way `direction` says; a
/// metric neither way better (or must-equal, judged by its partner) never looks worse by it.
fn looks_worse(ratio: f64, threshold: f64, direction: Direction) -> bool {
    match direction {
        Direction::LowerIsBetter => ratio > 1.0 + threshold,
        Direction::HigherIsBetter => ratio < 1.0 / (1.0 + threshold),
        Direction::Neither | Direction::MustEqual(_) => false,
    }
}

/// Which way B's median moved when it looks worse: higher, or lower for a higher-is-better
/// metric.
fn worse_way(direction: Direction) -> WorseWay {
    match direction {
        Direction::HigherIsBetter => WorseWay::Lower,
        _ => WorseWay::Higher,
    }
}

/// What is unsettled, when a ranked comparison leaves B's worse look or the level itself
/// undecided.
fn ranked_unsettled(c: &AbComparison, threshold: f64, direction: Direction) -> Option<Unsettled> {
    if let Some(Undecided::Unreachable { .. }) = c.undecided {
        return Some(out_of_reach(c.ratio, c.judged_together));
    }
    if c.verdict != MetricClass::NotDecided || !looks_worse(c.ratio, threshold, direction) {
        return None;
    }
    let p = CorrectedP {
        p: c.p_value,
        adjusted: c.p_adjusted,
        together: c.judged_together,
    };
    // B beyond the threshold on the median, yet not significant: too few samples against
    // this much noise (a few emulator hiccups on one side sink a 6-sample rank test).
    Some(if c.p_adjusted < c.alpha {
        Unsettled::SizeNotEstablished {
            ratio: c.ratio,
            p,
            ci95: c.ci95,
            threshold,
        }
    } else {
        Unsettled::Noise {
            worse: worse_way(direction),
            p,
        }
    })
}

/// The same for a time judged with the boot as the unit: B looks worse beyond the threshold
/// and the boots' interval reaches across it.
fn boots_unsettled(b: &BootsAb, threshold: f64, direction: Direction) -> Option<Unsettled> {
    (b.call == BootsCall::NotDecided && looks_worse(b.ratio, threshold, direction)).then(|| {
        Unsettled::BootsNotEstablished {
            ratio: b.ratio,
            ci: b.ci,
            boots: [b.boot_medians[0].len(), b.boot_medians[1].len()],
            together: b.judged_together,
        }
    })
}

/// The same for a varying count, whose direction is its medians'.
fn count_unsettled(
    r: &RankedCount,
    [ma, mb]: [f64; 2],
    threshold: f64,
    direction: Direction,
) -> Option<Unsettled> {
    match r.shift {
        Shift::OutOfReach { .. } => Some(out_of_reach(mb / ma, r.judged_together)),
        Shift::NotSignificant if looks_worse(mb / ma, threshold, direction) => {
            Some(Unsettled::Noise {
                worse: worse_way(direction),
                p: CorrectedP {
                    p: r.p_value,
                    adjusted: r.p_adjusted,
                    together: r.judged_together,
                },
            })
        }
        _ => None,
    }
}

/// A comparison no arrangement of whose samples could be called at the level, corrected over
/// the `together` comparisons judged with it.
fn out_of_reach(ratio: f64, together: usize) -> Unsettled {
    Unsettled::OutOfReach {
        ratio,
        alpha: ALPHA,
        together,
    }
}

/// Corrects every comparison of a kab together (Holm over every ranked jiffies and time
/// comparison and every varying count's rank p, across all its scenarios, variants and
/// metrics: a kab of 6 variants × 12 metrics judged each at p < 0.05 alone calls a change in
/// most A/A kabs), then settles each metric again from its corrected call. Exact counts, times
/// on the instruction clock and the variants a side failed are outside the family; times
/// judged with the boot as the unit divide the level among themselves.
pub fn correct_family(judged: &mut [ScenarioAb], threshold: f64) {
    let mut members: Vec<&mut MetricJudgement> = judged
        .iter_mut()
        .flat_map(|s| s.variants.iter_mut())
        .flat_map(|v| v.metrics.iter_mut())
        .map(|m| &mut m.judgement)
        .collect();
    correct_together(&mut members);
    // Times judged with the boot as the unit: their level divided among them.
    let mut by_boots: Vec<&mut BootsAb> = judged
        .iter_mut()
        .flat_map(|s| s.variants.iter_mut())
        .flat_map(|v| v.metrics.iter_mut())
        .filter_map(|m| match &mut m.judgement {
            MetricJudgement::Boots { judged } => Some(judged),
            _ => None,
        })
        .collect();
    let together = by_boots.len();
    by_boots.iter_mut().for_each(|b| b.rejudge(together));
    for m in judged
        .iter_mut()
        .flat_map(|s| s.variants.iter_mut())
        .flat_map(|v| v.metrics.iter_mut())
    {
        settle(m, threshold);
    }
}
