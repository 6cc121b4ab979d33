//! One metric of an A/B, judged as far as its kind lets it be trusted: a count exactly, or by
//! the rank test when it varies between repetitions; a time (or ticks of a timer) by the
//! verdict rule's rank test and interval; or not at all, for a typed reason. The facts stay
//! typed; renderers make the words.
//!
//! Comparisons judged together are corrected together ([`correct_together`]): every ranked
//! comparison and every varying count's rank p of one A/B, Holm over all of them (the rule of
//! [`crate::verdict`]). Counts that are constant on both sides are exact and stay outside the
//! family: there is no chance in them to correct for.

use serde::Serialize;

use crate::compare::AbComparison;
use crate::icount::{IcountAb, IcountCall};
use crate::multilevel::BootsAb;
use crate::statistics::rank_test;
use crate::verdict::{self, ALPHA, Correction, Family};

/// How one metric was judged, B against A (lower is better).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum MetricJudgement {
    /// A count, compared as counts.
    Count {
        /// What the counts say.
        call: CountCall,
    },
    /// Ranked by the verdict rule: the comparison, with its interval and its family.
    Ranked {
        /// The comparison.
        comparison: AbComparison,
    },
    /// A time on QEMU's instruction clock, judged exactly: beyond both sides' spread and the
    /// metric's declared tolerance ([`crate::icount::judge`]). Outside the family: there is
    /// no chance in it to correct for.
    InstructionClock {
        /// The instructions, the spread and the tolerance.
        judged: IcountAb,
    },
    /// A wall-clock time with several boots a side, judged with the boot as the unit
    /// ([`crate::multilevel::judge`]).
    Boots {
        /// The per-boot comparison and the variance of each level.
        judged: BootsAb,
    },
    /// Shown, not judged.
    NotJudged {
        /// Why.
        reason: NotJudged,
    },
}

/// A count, B against A.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "call", rename_all = "kebab-case")]
pub enum CountCall {
    /// Each side repeats one value, the same on both.
    Same,
    /// Each side repeats one value, B's higher.
    Higher,
    /// Each side repeats one value, B's lower.
    Lower,
    /// The count varies between repetitions: judged by the rank test.
    Varies(RankedCount),
}

/// A varying count's rank test, corrected over the comparisons judged with it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RankedCount {
    /// The exact rank test's two-sided p-value.
    pub p_value: f64,
    /// After the correction for the comparisons judged together.
    pub p_adjusted: f64,
    /// Comparisons judged together (1: alone).
    pub judged_together: usize,
    /// Samples per side.
    pub n: [usize; 2],
    /// What the test says.
    pub shift: Shift,
    /// Which way B's samples rank against A's: the test's direction. Not the medians', which
    /// tie at 0 when a stall hits 7 of 20 repetitions of A and none of B.
    #[serde(skip)]
    pub b_ranks: std::cmp::Ordering,
}

/// What a varying count's rank test says about B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Shift {
    /// B's median is higher, and the corrected p is below the level.
    Higher,
    /// B's median is lower, and the corrected p is below the level.
    Lower,
    /// Not significant, where the family could have reached the level.
    NotSignificant,
    /// No arrangement of these samples could reach the level once corrected for the family.
    OutOfReach {
        /// Samples per side with which it could (`None`: more than [`verdict::MAX_PLANNED`]).
        needed: Option<usize>,
    },
}

/// Why a metric is shown and not judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotJudged {
    /// A time measured under TCG: the emulator's, not the kernel's.
    TimeUnderTcg,
    /// A counter that follows wall time (timer interrupts, preemptions), under TCG.
    TimingDrivenUnderTcg,
    /// An ioctl's time on the instruction clock whose SRCU wait is judged in virtual jiffies
    /// (the same time, divided by the tick): the stall rule decides it, once.
    JudgedInJiffies,
}

impl RankedCount {
    /// A varying count's rank test, judged alone.
    pub fn alone(a: &[f64], b: &[f64]) -> RankedCount {
        let test = rank_test(a, b);
        let n = [a.len(), b.len()];
        let mut r = RankedCount {
            p_value: test.p,
            p_adjusted: test.p,
            judged_together: 1,
            n,
            shift: Shift::NotSignificant,
            b_ranks: test.b_ranks,
        };
        r.rejudge(Family::alone(n, ALPHA));
        r
    }

    /// The shift at this count's `p_adjusted` and place in its `family`. A count that is zero
    /// on a side has no ratio, so no interval: the direction is the ranks' (the sign of the
    /// Mann-Whitney U statistic's distance from its mean), the one the test's p is about.
    fn rejudge(&mut self, family: Family) {
        use std::cmp::Ordering;
        self.shift = if self.p_adjusted < ALPHA && self.b_ranks == Ordering::Greater {
            Shift::Higher
        } else if self.p_adjusted < ALPHA && self.b_ranks == Ordering::Less {
            Shift::Lower
        } else if self.n.iter().any(|&n| n < verdict::MIN_PER_SIDE) || family.attainable >= ALPHA {
            Shift::OutOfReach {
                needed: family.needed,
            }
        } else {
            Shift::NotSignificant
        };
    }
}

impl MetricJudgement {
    /// Whether B is judged higher (worse): an exact count higher, a varying count's test
    /// higher, a ranked comparison SLOWER.
    pub fn higher(&self) -> bool {
        match self {
            MetricJudgement::Count { call } => matches!(
                call,
                CountCall::Higher
                    | CountCall::Varies(RankedCount {
                        shift: Shift::Higher,
                        ..
                    })
            ),
            MetricJudgement::Ranked { comparison } => comparison.b_higher(),
            MetricJudgement::InstructionClock { judged } => judged.call == IcountCall::Higher,
            MetricJudgement::Boots { judged } => judged.b_higher(),
            MetricJudgement::NotJudged { .. } => false,
        }
    }

    /// Whether B is judged lower (better).
    pub fn lower(&self) -> bool {
        match self {
            MetricJudgement::Count { call } => matches!(
                call,
                CountCall::Lower
                    | CountCall::Varies(RankedCount {
                        shift: Shift::Lower,
                        ..
                    })
            ),
            MetricJudgement::Ranked { comparison } => comparison.b_lower(),
            MetricJudgement::InstructionClock { judged } => judged.call == IcountCall::Lower,
            MetricJudgement::Boots { judged } => judged.b_lower(),
            MetricJudgement::NotJudged { .. } => false,
        }
    }

    /// The ranked comparison, when judged by the rank test and interval.
    pub fn comparison(&self) -> Option<&AbComparison> {
        match self {
            MetricJudgement::Ranked { comparison } => Some(comparison),
            _ => None,
        }
    }

    /// Why not judged, when not.
    pub fn not_judged(&self) -> Option<NotJudged> {
        match self {
            MetricJudgement::NotJudged { reason } => Some(*reason),
            _ => None,
        }
    }
}

/// Corrects the judgements of one A/B together: Holm over every ranked comparison and every
/// varying count's rank p among `judged`, then each called again at its corrected p and its place in the family. Exact counts and metrics not
/// judged are left as they are.
pub fn correct_together(judged: &mut [&mut MetricJudgement]) {
    let mut members: Vec<(usize, f64, [usize; 2])> = Vec::new();
    for (i, j) in judged.iter().enumerate() {
        match &**j {
            MetricJudgement::Ranked { comparison } => {
                members.push((i, comparison.p_value, comparison.n));
            }
            MetricJudgement::Count {
                call: CountCall::Varies(r),
            } => members.push((i, r.p_value, r.n)),
            _ => {}
        }
    }
    let p: Vec<f64> = members.iter().map(|m| m.1).collect();
    let n: Vec<[usize; 2]> = members.iter().map(|m| m.2).collect();
    let adjusted = verdict::adjust(&p, Correction::Holm);
    let families = verdict::family(&p, &n, Correction::Holm, ALPHA);
    let together = members.len();
    for (((i, _, _), p_adjusted), family) in members.iter().zip(adjusted).zip(families) {
        match &mut *judged[*i] {
            MetricJudgement::Ranked { comparison: c } => {
                c.p_adjusted = p_adjusted;
                c.correction = Correction::Holm;
                c.judged_together = together;
                c.alpha = ALPHA;
                c.rejudge(family);
            }
            MetricJudgement::Count {
                call: CountCall::Varies(r),
            } => {
                r.p_adjusted = p_adjusted;
                r.judged_together = together;
                r.rejudge(family);
            }
            _ => {}
        }
    }
}

impl std::fmt::Display for NotJudged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NotJudged::TimeUnderTcg => {
                "TCG emulates every guest instruction: its times measure the emulator, not the kernel"
            }
            NotJudged::TimingDrivenUnderTcg => {
                "a timing-driven counter (timer interrupts, preemptions), varying between repetitions; under TCG its wall time is the emulator's"
            }
            NotJudged::JudgedInJiffies => {
                "on the instruction clock these lifecycle times are judged once, in virtual jiffies (the same instructions over the tick), by the stall rule"
            }
        })
    }
}

impl std::fmt::Display for CountCall {
    /// `same`, `higher`, `lower`; for a varying count the test's answer and its raw p
    /// (`higher (rank test), p = 0.001`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CountCall::Same => f.write_str("same"),
            CountCall::Higher => f.write_str("higher"),
            CountCall::Lower => f.write_str("lower"),
            CountCall::Varies(r) => {
                let word = match r.shift {
                    Shift::Higher => "higher (rank test)".to_string(),
                    Shift::Lower => "lower (rank test)".to_string(),
                    Shift::NotSignificant => {
                        "varies between repetitions, no significant change (rank test)".to_string()
                    }
                    Shift::OutOfReach { needed } => format!(
                        "varies between repetitions, not decided: {} comparisons judged together cannot reach p < {ALPHA} with n = {} vs {} ({} a side can)",
                        r.judged_together,
                        r.n[0],
                        r.n[1],
                        needed.map_or_else(|| "far more".to_string(), |k| k.to_string()),
                    ),
                };
                write!(f, "{word}, p = {:.3}", r.p_value)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::class::MetricClass;
    use crate::compare::ab;

    fn varies(a: &[f64], b: &[f64]) -> MetricJudgement {
        MetricJudgement::Count {
            call: CountCall::Varies(RankedCount::alone(a, b)),
        }
    }

    /// Alone, p ≈ 0.002 is a call; among 40 comparisons judged together whose other p-values
    /// are null, Holm puts it at 40 × 0.002 = 0.08: not a call any more, for the count and
    /// for the ranked comparison alike. An exact count stays what it was.
    #[test]
    fn a_call_alone_is_corrected_away_in_a_large_family() {
        let a: Vec<f64> = (0..8).map(f64::from).collect();
        let b: Vec<f64> = (0..8).map(|i| f64::from(i) + 4.5).collect();
        let mut count = varies(&a, &b);
        assert!(count.higher(), "{count:?}");
        let mut ranked = MetricJudgement::Ranked {
            comparison: ab("x", "ms", ("A", &a), ("B", &b), 0.05, 1),
        };
        let mut exact = MetricJudgement::Count {
            call: CountCall::Higher,
        };
        let flat: Vec<f64> = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
        let mut nulls: Vec<MetricJudgement> = (0..38).map(|_| varies(&flat, &flat)).collect();
        let mut judged: Vec<&mut MetricJudgement> = vec![&mut count, &mut ranked, &mut exact];
        judged.extend(nulls.iter_mut());
        correct_together(&mut judged);
        let MetricJudgement::Count {
            call: CountCall::Varies(r),
        } = &count
        else {
            panic!("{count:?}")
        };
        assert_eq!(r.judged_together, 40);
        assert!(r.p_adjusted >= 0.05 && !count.higher(), "{r:?}");
        assert_eq!(r.shift, Shift::NotSignificant);
        let c = ranked.comparison().expect("ranked");
        assert_eq!(c.judged_together, 40);
        assert_ne!(c.verdict, MetricClass::Slower, "{c:?}");
        assert!(exact.higher(), "an exact count is outside the family");
    }

    /// Four against four in a family of 30: no arrangement reaches the level, so the count is
    /// out of reach, with the samples a side that would decide.
    #[test]
    fn a_family_that_cannot_reach_the_level_leaves_counts_out_of_reach() {
        let a = [0.0, 1.0, 0.0, 1.0];
        let mut js: Vec<MetricJudgement> = (0..30).map(|_| varies(&a, &a)).collect();
        let mut judged: Vec<&mut MetricJudgement> = js.iter_mut().collect();
        correct_together(&mut judged);
        let MetricJudgement::Count {
            call: CountCall::Varies(r),
        } = &js[0]
        else {
            panic!()
        };
        assert!(
            matches!(r.shift, Shift::OutOfReach { needed: Some(k) } if k > 4),
            "{r:?}"
        );
        assert!(
            js[0]
                .to_string_call()
                .contains("30 comparisons judged together")
        );
    }

    impl MetricJudgement {
        fn to_string_call(&self) -> String {
            match self {
                MetricJudgement::Count { call } => call.to_string(),
                _ => String::new(),
            }
        }
    }
}
