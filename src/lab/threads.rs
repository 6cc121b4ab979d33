//! The kernel threads' headlines as verdicts: each showcase that is a before/after
//! ([`Headline`]) judged as one comparison in the thread's terms (001 at HZ=100: always-defer
//! 22.0 ms → lifecycle-keyed 0.500 ms, FIXED), one line per thread beside the thread's fidelity
//! status. Data only; `export::words` words it.

use crate::analysis::class::{MetricClass, VariantClass};
use crate::analysis::compare::{AbComparison, ab, judge_together};
use crate::analysis::direction::Better;
use crate::analysis::statistics::seed_for;
use crate::analysis::verdict::{ALPHA, Correction};
use crate::lab::fidelity::{Judged, THREADS, ThreadReport};
use crate::record::{RunRecord, RunTag};
use crate::scenario::{Headline, HeadlinePair, Kind};

/// The minimum effect a headline must show (as a run's verdicts).
const THRESHOLD: f64 = crate::analysis::compare::RUN_THRESHOLD;

/// One thread: what it is, how the model fares against its figures, and its headlines.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadLine {
    /// The seed number (`001`).
    pub id: &'static str,
    /// The mechanism and the thread's subject.
    pub title: &'static str,
    /// The model against the thread's published figures, when evaluated.
    pub fidelity: Option<Fidelity>,
    /// The before/after verdicts of its showcases among the runs given.
    pub headlines: Vec<HeadlineVerdict>,
}

/// A thread's fidelity, counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fidelity {
    /// Figures judged (fitted ones are not).
    pub judged: usize,
    /// Within the published range.
    pub within: usize,
    /// Outside it: misses.
    pub outside: usize,
    /// Rows that re-show a fitted value, shown apart.
    pub fitted: usize,
}

/// One showcase's headline, judged.
#[derive(Debug, Clone, PartialEq)]
pub struct HeadlineVerdict {
    /// The modelled host's profile.
    pub profile: String,
    /// Its HZ.
    pub hz: u32,
    /// The runs' names for before and after, when they differ by run, not by variant.
    pub sides: Option<(&'static str, &'static str)>,
    /// The run that holds the after side (its section in the report).
    pub run_id: String,
    /// Each comparison.
    pub pairs: Vec<PairVerdict>,
}

/// One before/after comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct PairVerdict {
    /// What it is about, in the thread's terms.
    pub about: &'static str,
    /// The declaration.
    pub pair: HeadlinePair,
    /// After (B) against before (A).
    pub comparison: AbComparison,
    /// The verdict, stalls taken into account (FIXED, REGRESSED).
    pub class: PairClass,
    /// Repetitions with a stall before and after, where the scenario counts stalls.
    pub stalled: Option<[[usize; 2]; 2]>,
    /// Further metrics, before → after: (metric, unit, before median, after median).
    pub shown: Vec<(String, String, f64, f64)>,
}

/// A before/after's verdict: its metric's class, or where the scenario counts stalls, kab's
/// word for a stall that went or came with the change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairClass {
    /// The metric's class, the stalls (if counted) not changing it.
    Metric(MetricClass),
    /// FASTER, and A's recurring stall gone on B.
    Fixed,
    /// SLOWER, and a recurring stall gained on B.
    Regressed,
}

impl PairClass {
    /// `class` with the stalls taken into account: an established faster B whose A stalled
    /// and that does not is FIXED; an established slower B that gained a stall is REGRESSED.
    pub fn with_stalls(class: MetricClass, a_stalls: bool, b_stalls: bool) -> PairClass {
        match class {
            MetricClass::Faster if a_stalls && !b_stalls => PairClass::Fixed,
            MetricClass::Slower if !a_stalls && b_stalls => PairClass::Regressed,
            MetricClass::Faster
            | MetricClass::Slower
            | MetricClass::NoChange
            | MetricClass::NotDecided => PairClass::Metric(class),
        }
    }

    /// Whether a difference was called, either way.
    pub fn called(self) -> bool {
        match self {
            PairClass::Metric(c) => c.called(),
            PairClass::Fixed | PairClass::Regressed => true,
        }
    }

    /// The word printed: the metric's, or the variant class's a kab would print.
    pub fn word(self) -> &'static str {
        match self {
            PairClass::Metric(c) => c.word(),
            PairClass::Fixed => VariantClass::Fixed.word(),
            PairClass::Regressed => VariantClass::Regressed.word(),
        }
    }
}

impl std::fmt::Display for PairClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

/// The unit of a suite run: `suite/SCENARIO/model/PROFILE/N` for a showcase.
fn showcase_index(r: &RunRecord) -> Option<usize> {
    r.params
        .get("suite_unit")?
        .as_str()?
        .rsplit('/')
        .next()?
        .parse()
        .ok()
}

fn suite_of(r: &RunRecord) -> Option<&str> {
    r.params.get("suite")?.as_str()
}

/// One line per thread, in seed order: its fidelity (from `fidelity`, when evaluated) and the
/// headlines of the showcases among `records` (the suite's showcase runs).
pub fn lines(records: &[&RunRecord], fidelity: &[ThreadReport]) -> Vec<ThreadLine> {
    let showcases: Vec<&RunRecord> = records
        .iter()
        .copied()
        .filter(|r| r.tag == Some(RunTag::Showcase))
        .collect();
    let mut headlines: Vec<(&'static str, HeadlineVerdict)> = Vec::new();
    for after in &showcases {
        let Some((headline, i)) = Kind::named(&after.scenario).ok().and_then(|k| {
            let i = showcase_index(after)?;
            Some((k.showcases().get(i)?.headline?, i))
        }) else {
            continue;
        };
        let before = match headline.before_run {
            None => Some(*after),
            Some(j) => showcases.iter().copied().find(|r| {
                r.scenario == after.scenario
                    && suite_of(r) == suite_of(after)
                    && showcase_index(r) == Some(j)
                    && j != i
            }),
        };
        if let Some(before) = before {
            headlines.push((headline.thread, judge(&headline, before, after)));
        }
    }
    THREADS
        .iter()
        .map(|t| {
            let info = t.info();
            ThreadLine {
                id: info.id,
                title: info.title,
                fidelity: fidelity.iter().find(|f| f.id == info.id).map(|f| Fidelity {
                    judged: f.judged(),
                    within: f.within(),
                    outside: f.outside(),
                    fitted: f.fitted_rows(),
                }),
                headlines: headlines
                    .iter()
                    .filter(|(id, _)| *id == info.id)
                    .map(|(_, h)| h.clone())
                    .collect(),
            }
        })
        .collect()
}

/// Repetitions with a stall, and of all, from a variant's `stalls` samples.
fn stalled(r: &RunRecord, variant: &str) -> Option<[usize; 2]> {
    let m = r.variant(variant)?.metrics.get("stalls")?;
    Some([m.samples.iter().filter(|x| **x > 0.0).count(), m.n])
}

/// A stall that recurs: in at least half the repetitions (the findings' rule).
pub(crate) fn recurs(s: [usize; 2]) -> bool {
    s[1] > 0 && 2 * s[0] >= s[1]
}

/// A pair's class where the scenario counts stalls, by kab's rule (`lab::kab`): a stall gone
/// is FIXED, one gained is REGRESSED; a stall on both sides whose length the rank test does
/// not separate and that moved by less than a jiffy is NO CHANGE: the mechanism is the same
/// on both (001's boot-time registrations still defer), and no sample count would make a
/// sub-jiffy shift of where the grace period's ticks fall a change of that mechanism.
fn stall_class(c: &AbComparison, a_stalls: bool, b_stalls: bool, hz: u32) -> PairClass {
    let class = PairClass::with_stalls(c.verdict, a_stalls, b_stalls);
    let jiffy_ms = 1000.0 / f64::from(hz.max(1));
    let moved_ms = match c.unit.as_str() {
        "ms" => Some((c.median[1] - c.median[0]).abs()),
        "us" | "µs" => Some((c.median[1] - c.median[0]).abs() / 1000.0),
        _ => None,
    };
    if class == PairClass::Metric(MetricClass::NotDecided)
        && a_stalls
        && b_stalls
        && moved_ms.is_some_and(|m| m < jiffy_ms)
    {
        PairClass::Metric(MetricClass::NoChange)
    } else {
        class
    }
}

/// Judges a headline's pairs together: after against before, each.
fn judge(h: &Headline, before: &RunRecord, after: &RunRecord) -> HeadlineVerdict {
    let mut judged: Vec<(HeadlinePair, AbComparison)> = h
        .pairs
        .iter()
        .filter_map(|p| {
            let a = before.variant(p.before)?.metrics.get(p.metric)?;
            let b = after.variant(p.after)?.metrics.get(p.metric)?;
            let (name_a, name_b) = h.sides.unwrap_or((p.before, p.after));
            let seed = seed_for(0, &["headline", h.thread, p.before, p.after, p.metric]);
            // Judged the way the scenario declares the metric better.
            let better = crate::scenario::find(&before.scenario)
                .map_or(Better::Lower, |i| i.declared(p.metric).direction.better());
            let c = ab(
                p.metric,
                &a.unit,
                (name_a, &a.samples),
                (name_b, &b.samples),
                THRESHOLD,
                seed,
            )
            .judged_by(better);
            Some((*p, c))
        })
        .collect();
    {
        let mut family: Vec<&mut AbComparison> = judged.iter_mut().map(|(_, c)| c).collect();
        judge_together(&mut family, ALPHA, Correction::Holm);
    }
    let pairs = judged
        .into_iter()
        .map(|(p, comparison)| {
            let stalls = stalled(before, p.before).zip(stalled(after, p.after));
            let class = match stalls {
                Some((a, b)) => stall_class(&comparison, recurs(a), recurs(b), after.host.hz),
                None => PairClass::Metric(comparison.verdict),
            };
            let shown = p
                .shown
                .iter()
                .filter_map(|m| {
                    let a = before.variant(p.before)?.metrics.get(*m)?;
                    let b = after.variant(p.after)?.metrics.get(*m)?;
                    Some((m.to_string(), a.unit.clone(), a.median, b.median))
                })
                .collect();
            PairVerdict {
                about: p.about,
                pair: p,
                comparison,
                class,
                stalled: stalls.map(|(a, b)| [a, b]),
                shown,
            }
        })
        .collect();
    HeadlineVerdict {
        profile: after.profile.clone().unwrap_or_default(),
        hz: after.host.hz,
        sides: h.sides,
        run_id: after.run_id.clone(),
        pairs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 20 boot-time memslots a side that stall every time, at HZ=100 (a 10 ms jiffy).
    fn stalls_of(before_ms: f64, after_ms: f64, spread: f64) -> AbComparison {
        let side = |m: f64| -> Vec<f64> {
            (0..20)
                .map(|i| m + spread * (f64::from(i % 5) - 2.0))
                .collect()
        };
        ab(
            "boot.memslot_ms",
            "ms",
            ("always-defer", &side(before_ms)),
            ("lifecycle-keyed", &side(after_ms)),
            THRESHOLD,
            7,
        )
    }

    #[test]
    fn a_stall_on_both_sides_that_moved_less_than_a_jiffy_is_no_change() {
        // 001's boot-time registrations: 19.7 → 18.1 ms, wide spread, both stall.
        let c = stalls_of(19.7, 18.1, 2.0);
        assert_eq!(c.verdict, MetricClass::NotDecided, "{c:?}");
        let metric = PairClass::Metric;
        assert_eq!(
            stall_class(&c, true, true, 100),
            metric(MetricClass::NoChange)
        );
        // The same shift at HZ=1000 is more than a jiffy: still not decided.
        assert_eq!(
            stall_class(&c, true, true, 1000),
            metric(MetricClass::NotDecided)
        );
        // Without a stall on both sides the stall rule says nothing.
        assert_eq!(
            stall_class(&c, false, false, 100),
            metric(MetricClass::NotDecided)
        );
        // A stall gone, established faster, is FIXED; a gained one, slower, REGRESSED; a
        // stall gone with a slower B, or gained with a faster one, is the metric's class.
        let fixed = stalls_of(22.0, 0.5, 0.01);
        assert_eq!(stall_class(&fixed, true, false, 100), PairClass::Fixed);
        assert_eq!(
            stall_class(&fixed, false, true, 100),
            metric(MetricClass::Faster)
        );
        let broke = stalls_of(0.5, 22.0, 0.01);
        assert_eq!(stall_class(&broke, false, true, 100), PairClass::Regressed);
        assert_eq!(
            stall_class(&broke, true, false, 100),
            metric(MetricClass::Slower)
        );
    }
}
