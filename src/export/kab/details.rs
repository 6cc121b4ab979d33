//! A kab's per-metric comparison, after the verdicts: per scenario and variant the metrics
//! that moved or were not decided, the counts the same on both kernels, and what was counted
//! rather than shown.

use crate::analysis::class::MetricClass;
use crate::analysis::direction::{Direction, change_pct};
use crate::analysis::icount::{IcountAb, IcountCall};
use crate::analysis::metric_ab::{CountCall, MetricJudgement, RankedCount, Shift};
use crate::analysis::multilevel::{BootsAb, BootsCall};
use crate::analysis::quantity::{fixed_decimals, p_equals};
use crate::analysis::stall::STALL_JIFFIES;
use crate::lab::kab::{MetricAb, MetricOutcome, ScenarioAb, Trust, VariantAb};

use super::words::instruction_words;
use crate::scenario;

/// The per-metric comparison, after the verdicts.
pub(super) fn details(judged: &[ScenarioAb]) -> String {
    let mut out: Vec<String> = Vec::new();
    for s in judged {
        out.extend(scenario_details(s));
    }
    out.extend(undecided(judged));
    out.join("\n")
}

/// The metrics a scenario's details count instead of showing, said in its last lines.
#[derive(Default)]
struct Unshown {
    /// Counts exactly the same on both kernels.
    same: usize,
    /// Jiffies under half a jiffy on both kernels, with no significant change.
    quiet: usize,
    /// Counts varying between repetitions, with no significant change.
    varying: usize,
    /// Timing-driven counts, not judged.
    timing_counts: usize,
    /// Why times are not judged, when they are not.
    times_not_judged: Option<String>,
}

fn scenario_details(s: &ScenarioAb) -> Vec<String> {
    let mut out = vec![format!(
        "\n{}: {} run(s) on A, {} on B",
        s.scenario,
        s.runs[0].len(),
        s.runs[1].len()
    )];
    let headline = scenario::find(&s.scenario)
        .map(|i| i.headline)
        .unwrap_or("");
    let mut unshown = Unshown::default();
    for v in &s.variants {
        out.extend(variant_details(v, headline, &mut unshown));
    }
    let Unshown {
        same,
        quiet,
        varying,
        timing_counts,
        times_not_judged,
    } = unshown;
    out.push(format!(
        "  counts: {same} exactly the same on both kernels, {varying} varying between repetitions with no significant change; {timing_counts} timing-driven counters (timer interrupts, preemptions) shown in --json, not judged under TCG"
    ));
    out.push(format!(
        "  jiffies: {quiet} ioctl time(s) under half a jiffy on both kernels with no significant change"
    ));
    if let Some(why) = times_not_judged {
        out.push(format!("  times are shown, not judged: {why}"));
    }
    out
}

/// A variant's lines under its name: the metrics shown, then its counts the same on both
/// kernels; nothing when it has neither.
fn variant_details(v: &VariantAb, headline: &str, unshown: &mut Unshown) -> Vec<String> {
    let mut lines = Vec::new();
    let mut same_here: Vec<String> = Vec::new();
    for m in &v.metrics {
        let line = match m.trust {
            Trust::Count => count_line(m, unshown, &mut same_here),
            Trust::Jiffies => jiffies_line(m, unshown),
            Trust::Time => time_line(m, headline, unshown),
        };
        lines.extend(line);
    }
    lines.extend(same_counts_line(same_here));
    if lines.is_empty() {
        return lines;
    }
    let mut out = vec![format!("  {}:", v.variant)];
    out.extend(lines);
    out
}

/// A count that changed, regressed or is not decided; the others are counted (and a count the
/// same on both kernels listed in `same_here`).
fn count_line(m: &MetricAb, unshown: &mut Unshown, same_here: &mut Vec<String>) -> Option<String> {
    let call = match &m.judgement {
        MetricJudgement::Count { call } => call,
        MetricJudgement::NotJudged { .. } => {
            unshown.timing_counts += 1;
            return None;
        }
        MetricJudgement::Ranked { .. }
        | MetricJudgement::InstructionClock { .. }
        | MetricJudgement::Boots { .. } => return None,
    };
    match call {
        CountCall::Same => {
            unshown.same += 1;
            same_here.push(format!("{} {}", m.metric, fixed_decimals(m.median[0])));
            return None;
        }
        CountCall::Varies(RankedCount {
            shift: Shift::NotSignificant | Shift::OutOfReach { .. },
            ..
        }) if m.outcome.inconclusive().is_none() => {
            unshown.varying += 1;
            return None;
        }
        _ => {}
    }
    // The change as LKP prints it, beside the call.
    let word = match change_pct(m.median[0], m.median[1]) {
        Some(pct) => format!("{call}, {pct}"),
        None => call.to_string(),
    };
    let tag = match m.outcome {
        MetricOutcome::Regression => format!("REGRESSION: {word}"),
        MetricOutcome::Inconclusive(_) => format!("NOT DECIDED: {word}"),
        MetricOutcome::WithinTolerance => format!(
            "{word}, a change under the {}% it tolerates",
            fixed_decimals(m.declared.count_tolerance * 100.0)
        ),
        MetricOutcome::Improvement | MetricOutcome::Cost | MetricOutcome::Unmoved => word,
    };
    let tag = match direction_note(m) {
        Some(note) => format!("{tag}; {note}"),
        None => tag,
    };
    Some(format!(
        "    [count: {tag}] {}: A {} → B {}",
        m.metric,
        side_text(m, 0),
        side_text(m, 1)
    ))
}

/// Which way a count is better when it is not kab's default (lower, declared).
fn direction_note(m: &MetricAb) -> Option<String> {
    match (m.declared.declared, m.declared.direction) {
        (false, _) => Some("not declared by its scenario: judged lower-is-better".into()),
        (true, Direction::LowerIsBetter) => None,
        (true, Direction::MustEqual(other)) => Some(format!(
            "must equal {other}{}",
            m.off_by.map_or(String::new(), |[a, b]| format!(
                " (off by {} on A, {} on B)",
                fixed_decimals(a),
                fixed_decimals(b)
            ))
        )),
        (true, d) => Some(d.to_string()),
    }
}

/// A jiffies metric with its rank test, unless it stayed under half a jiffy on both kernels
/// with no significant change (then it is counted).
fn jiffies_line(m: &MetricAb, unshown: &mut Unshown) -> Option<String> {
    if let MetricJudgement::InstructionClock { judged } = &m.judgement {
        return jiffies_on_instruction_clock_line(m, judged, unshown);
    }
    let c = m.judgement.comparison();
    let verdict = match c {
        Some(_) if m.outcome.inconclusive().is_some() => "B higher, not established",
        Some(c) => verdict_word(c.verdict),
        None => "not judged",
    };
    let p = c.map_or(String::new(), |c| {
        format!(
            ", rank test {}, 95% CI of the ratio {:.2}–{:.2}",
            p_equals(c.p_value),
            c.ci95[0],
            c.ci95[1]
        )
    });
    let significant = c.is_some_and(|c| c.verdict.called());
    if m.median[0].max(m.median[1]) < STALL_JIFFIES && !significant {
        unshown.quiet += 1;
        return None;
    }
    let tag = jiffies_tag(&m.outcome);
    let note = m
        .judgement
        .not_judged()
        .map_or(String::new(), |n| format!("; {n}"));
    Some(format!(
        "    [{tag}: {verdict}{p}{note}] {}: A {} → B {}",
        m.metric,
        side_text(m, 0),
        side_text(m, 1)
    ))
}

/// The tag of a jiffies line: what its outcome makes of B.
fn jiffies_tag(outcome: &MetricOutcome) -> &'static str {
    match outcome {
        MetricOutcome::Regression => "REGRESSION, jiffies",
        MetricOutcome::Inconclusive(_) => "NOT DECIDED, jiffies",
        MetricOutcome::Improvement
        | MetricOutcome::Cost
        | MetricOutcome::WithinTolerance
        | MetricOutcome::Unmoved => "jiffies",
    }
}

/// An instruction-clock call in words.
fn icount_call_words(call: IcountCall) -> &'static str {
    match call {
        IcountCall::Higher => "B longer",
        IcountCall::Lower => "B shorter",
        IcountCall::Same => "within the spread or the tolerance",
    }
}

/// A time in virtual ticks on the instruction clock: in jiffies, and the instructions the call
/// was made on. Quiet under half a jiffy on both kernels unless it moved.
fn jiffies_on_instruction_clock_line(
    m: &MetricAb,
    judged: &IcountAb,
    unshown: &mut Unshown,
) -> Option<String> {
    let verdict = icount_call_words(judged.call);
    if m.median[0].max(m.median[1]) < STALL_JIFFIES && judged.call == IcountCall::Same {
        unshown.quiet += 1;
        return None;
    }
    let tag = jiffies_tag(&m.outcome);
    Some(format!(
        "    [{tag}, instruction clock: {verdict}; {}] {}: A {} → B {}",
        instruction_words(&m.metric, judged),
        m.metric,
        side_text(m, 0),
        side_text(m, 1)
    ))
}

/// A time: the scenario's headline is shown even when times are not judged (why is kept for
/// the scenario's last lines); another time only when judged and it regressed.
fn time_line(m: &MetricAb, headline: &str, unshown: &mut Unshown) -> Option<String> {
    if let Some(why) = m.judgement.not_judged() {
        unshown.times_not_judged = Some(why.to_string());
        return (m.metric == headline).then(|| {
            format!(
                "    [time, shown, not judged] {}: A {} → B {}",
                m.metric,
                side_text(m, 0),
                side_text(m, 1)
            )
        });
    }
    let shown = m.metric == headline
        || matches!(
            m.outcome,
            MetricOutcome::Regression | MetricOutcome::Improvement
        );
    match &m.judgement {
        MetricJudgement::InstructionClock { judged } => {
            return shown.then(|| {
                let call = icount_call_words(judged.call);
                format!(
                    "    [time, instruction clock: {call}] {}",
                    instruction_words(&m.metric, judged)
                )
            });
        }
        MetricJudgement::Boots { judged } => {
            return (shown || m.outcome.inconclusive().is_some()).then(|| {
                format!(
                    "    [time, per boot: {}, ratio {:.3} ({:.3}–{:.3}), Welch p = {:.3}; {}] {}: A {} → B {}",
                    boots_word(judged.call),
                    judged.ratio,
                    judged.ci[0],
                    judged.ci[1],
                    judged.p_value,
                    reps_words(judged),
                    m.metric,
                    side_text(m, 0),
                    side_text(m, 1)
                )
            });
        }
        _ => {}
    }
    let c = m.judgement.comparison()?;
    (m.metric == headline || m.outcome == MetricOutcome::Regression).then(|| {
        format!(
            "    [time: {}{}] {}: A {} → B {}",
            verdict_word(c.verdict),
            format_args!(", {}", p_equals(c.p_value)),
            m.metric,
            side_text(m, 0),
            side_text(m, 1)
        )
    })
}

/// The counts the same on both kernels in every repetition: fault counts first (they are what
/// a paging change moves), six at most.
fn same_counts_line(mut same_here: Vec<String>) -> Option<String> {
    if same_here.is_empty() {
        return None;
    }
    same_here.sort_by_key(|t| !(t.contains("pf_") || t.contains("fault")));
    let shown: Vec<&str> = same_here.iter().take(6).map(String::as_str).collect();
    let more = same_here.len().saturating_sub(shown.len());
    let tail = if more > 0 {
        format!(" (+{more} more)")
    } else {
        String::new()
    };
    Some(format!(
        "    [count, exact: same on both, every repetition] {}{tail}",
        shown.join(", ")
    ))
}

/// The judged metrics B looked worse on that the samples could not settle (twelve at most).
fn undecided(judged: &[ScenarioAb]) -> Vec<String> {
    let undecided: Vec<String> = judged
        .iter()
        .flat_map(|s| {
            s.variants.iter().flat_map(move |v| {
                v.metrics.iter().filter_map(move |m| {
                    m.outcome
                        .inconclusive()
                        .map(|why| format!("{} {} {}: {why}", s.scenario, v.variant, m.metric))
                })
            })
        })
        .collect();
    let mut out = Vec::new();
    if !undecided.is_empty() {
        // Not "no change": B looked worse and the samples could not say whether it is.
        out.push(format!(
            "\nundecided: {} judged metric(s) higher on B than the samples can separate from noise:",
            undecided.len()
        ));
    }
    for u in undecided.iter().take(12) {
        out.push(format!("  {u}"));
    }
    out
}

fn boots_word(c: BootsCall) -> &'static str {
    match c {
        BootsCall::Higher => "B longer",
        BootsCall::Lower => "B shorter",
        BootsCall::Same => "no change beyond the threshold",
        BootsCall::NotDecided => "not decided by the boots",
    }
}

/// Each side's boots and the repetitions per boot its variance components make optimal.
fn reps_words(b: &BootsAb) -> String {
    let side = |i: usize| {
        let v = &b.variance[i];
        let reps = b.reps_per_boot[i].map_or_else(
            || "no variance between boots seen".to_string(),
            |r| format!("{r} reps a boot optimal"),
        );
        format!(
            "{} boots, sd {:.1}% between, {:.1}% within, {reps}",
            v.boots,
            100.0 * v.between.sqrt(),
            100.0 * v.within.sqrt()
        )
    };
    format!("A {}; B {}", side(0), side(1))
}

fn verdict_word(v: MetricClass) -> &'static str {
    match v {
        MetricClass::Faster => "B shorter",
        MetricClass::Slower => "B longer",
        MetricClass::NoChange => "no significant change",
        MetricClass::NotDecided => "not decided by the rank test",
    }
}

fn spread(x: &[f64]) -> String {
    let lo = x.iter().copied().fold(f64::MAX, f64::min);
    let hi = x.iter().copied().fold(f64::MIN, f64::max);
    format!("{}–{}", fixed_decimals(lo), fixed_decimals(hi))
}

fn side_text(m: &MetricAb, i: usize) -> String {
    format!(
        "{} {} (range {}, n = {})",
        fixed_decimals(m.median[i]),
        m.unit,
        spread(&m.samples[i]),
        m.samples[i].len()
    )
}
