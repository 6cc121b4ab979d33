//! The series' table: every commit judged against its parent and the base, corrected as one
//! family, with the rows a reader sees.

use serde::Serialize;

use crate::analysis::class::VariantClass;
use crate::kernel::build::BuildError;
use crate::kernel::objdiff::BuildsDelta;
use crate::lab::kab::{self, MetricAb, ScenarioAb, SideRuns, Trust, VariantAb, VariantVerdict};

use super::boots::{KernelRuns, RunsAsked};
use super::source::SeriesStep;

/// A commit as built: its runs, or the compiler's first error.
#[derive(Debug, Clone)]
pub enum StepState {
    /// It built (and booted).
    Built(KernelRuns),
    /// It does not build: the first error.
    DoesNotBuild {
        /// The compiler's first error (or the build's message when it has none).
        error: String,
    },
}

/// The first error of a build that failed: the compiler's, or the whole message.
pub fn first_error(e: &BuildError) -> String {
    match e {
        BuildError::PatchedCompile { errors, .. } | BuildError::BaseCompile { errors, .. } => {
            errors
                .lines()
                .map(str::trim)
                .find(|l| !l.is_empty())
                .unwrap_or("the compiler printed no error line")
                .to_string()
        }
        other => other.to_string(),
    }
}

/// LKP's numbers for one metric: parent | commit | %change, each with its %stddev.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Numbers {
    /// The metric.
    pub metric: String,
    /// Its unit as judged.
    pub unit: String,
    /// The parent's median.
    pub parent: f64,
    /// The commit's median.
    pub commit: f64,
    /// (commit − parent) / parent, in %.
    pub change_pct: f64,
    /// Each side's standard deviation in % of its mean (LKP's ±%stddev).
    pub stddev_pct: [f64; 2],
}

/// One variant of one commit: its verdict against its parent and against the base.
#[derive(Debug, Clone, Serialize)]
pub struct VariantRow {
    /// The scenario.
    pub scenario: String,
    /// The variant.
    pub variant: String,
    /// Against its parent (the last commit before it that built, or the base).
    pub vs_parent: VariantVerdict,
    /// Against the base.
    pub vs_base: VariantVerdict,
    /// The metric behind the verdict against the parent, LKP-style, when one was compared.
    pub numbers: Option<Numbers>,
}

/// A commit's row.
#[derive(Debug, Clone, Serialize)]
pub struct CommitRow {
    /// 1-based position in the series.
    pub position: usize,
    /// The step.
    pub step: SeriesStep,
    /// What it was judged against: the label of the last commit before it that built, or
    /// `base`.
    pub parent: String,
    /// Why it has no verdicts: the compiler's first error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub does_not_build: Option<String>,
    /// Per variant (none when it does not build).
    pub variants: Vec<VariantRow>,
    /// Its object code against its parent's, when both were built here. Identical (line-number
    /// constants aside): it was not booted, its parent's runs are its own, and every row is an
    /// exact NO CHANGE against its parent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<BuildsDelta>,
}

impl CommitRow {
    /// Whether its object code is its parent's, so it was not booted.
    pub fn object_identical(&self) -> bool {
        self.object.as_ref().is_some_and(BuildsDelta::identical)
    }
}

/// The per-patch table.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesTable {
    /// The base spec.
    pub base: String,
    /// One row per commit, in order.
    pub commits: Vec<CommitRow>,
    /// Comparisons corrected together (every commit, both columns, every variant and metric).
    pub judged_together: usize,
}

/// Counts the family members: ranked comparisons and varying counts.
fn family_size(judged: &[ScenarioAb]) -> usize {
    use crate::analysis::metric_ab::{CountCall, MetricJudgement};
    judged
        .iter()
        .flat_map(|s| &s.variants)
        .flat_map(|v| &v.metrics)
        .filter(|m| {
            matches!(
                m.judgement,
                MetricJudgement::Ranked { .. }
                    | MetricJudgement::Count {
                        call: CountCall::Varies(_)
                    }
            )
        })
        .count()
}

/// What a series is judged with.
#[derive(Debug, Clone)]
pub struct JudgeSettings<'a> {
    /// The runs judged: scenarios, variants (all when empty), `--set`, reps, accelerator.
    pub asked: RunsAsked<'a>,
    /// Smallest change that counts.
    pub threshold: f64,
    /// The metric to show in the numbers when none moved (else the first judged).
    pub metric: Option<&'a str>,
}

/// Judges every commit that built against its parent (the last commit before it that built)
/// and against the base, all comparisons corrected as one family, and makes the table.
pub fn judge_series(
    base_spec: &str,
    base: &KernelRuns,
    steps: &[SeriesStep],
    states: &[StepState],
    settings: &JudgeSettings<'_>,
) -> SeriesTable {
    // Per judged commit: (its index, its parent's index or None for the base, the comparisons).
    let mut pairs: Vec<(usize, Option<usize>, usize)> = Vec::new();
    let mut family: Vec<ScenarioAb> = Vec::new();
    let mut parent: Option<usize> = None;
    for (i, state) in states.iter().enumerate() {
        let StepState::Built(runs) = state else {
            continue;
        };
        let parent_runs = match parent {
            Some(p) => match &states[p] {
                StepState::Built(r) => r,
                StepState::DoesNotBuild { .. } => base,
            },
            None => base,
        };
        let vs_parent = judge_pair(parent_runs, runs, settings);
        let count = vs_parent.len();
        family.extend(vs_parent);
        // Against the base only when the parent is not the base: the same comparison twice
        // would count twice in the family.
        if parent.is_some() {
            family.extend(judge_pair(base, runs, settings));
        }
        pairs.push((i, parent, count));
        parent = Some(i);
    }
    let judged_together = family_size(&family);
    kab::correct_family(&mut family, settings.threshold);
    let mut rows: Vec<CommitRow> = Vec::new();
    let mut rest = family.into_iter();
    let mut judged = pairs.into_iter().peekable();
    for (i, step) in steps.iter().enumerate() {
        let mut row = CommitRow {
            position: i + 1,
            step: step.clone(),
            parent: "base".into(),
            does_not_build: None,
            variants: Vec::new(),
            object: None,
        };
        if let Some(StepState::DoesNotBuild { error }) = states.get(i) {
            row.does_not_build = Some(error.clone());
            rows.push(row);
            continue;
        }
        let Some((_, parent, count)) = judged.next_if(|(j, _, _)| *j == i) else {
            rows.push(row);
            continue;
        };
        let vs_parent: Vec<ScenarioAb> = rest.by_ref().take(count).collect();
        let vs_base: Vec<ScenarioAb> = if parent.is_some() {
            rest.by_ref().take(count).collect()
        } else {
            vs_parent.clone()
        };
        if let Some(p) = parent {
            row.parent = steps[p].label.clone();
        }
        let busy = busy_of(&states[i], parent.map(|p| &states[p]), base);
        row.variants = variant_rows(&vs_parent, &vs_base, &busy, settings.metric);
        rows.push(row);
    }
    SeriesTable {
        base: base_spec.to_string(),
        commits: rows,
        judged_together,
    }
}

/// `candidate`'s runs against `against`'s by the pair judge ([`kab::judge_pair`]), each
/// comparison at its own p until the family is corrected.
fn judge_pair<'a>(
    against: &'a KernelRuns,
    candidate: &'a KernelRuns,
    settings: &JudgeSettings<'_>,
) -> Vec<ScenarioAb> {
    let side = |k: &'a KernelRuns| SideRuns {
        runs: &k.runs,
        failed_commands: &k.failed_commands,
    };
    kab::judge_pair(
        &settings.asked.names(),
        settings.asked.variants,
        [side(against), side(candidate)],
        settings.asked.accel,
        settings.threshold,
    )
}

/// One commit's kernel judged against another's on their own (corrected as a family of their
/// own), as a series' row judges a commit against its parent: each variant's verdict, with the
/// metric behind it. What each step of a bisection is judged by.
pub fn judge_commit(
    against: &KernelRuns,
    candidate: &KernelRuns,
    settings: &JudgeSettings<'_>,
) -> Vec<VariantRow> {
    let mut judged = judge_pair(against, candidate, settings);
    kab::correct_family(&mut judged, settings.threshold);
    let mut busy = candidate.host_busy.clone();
    busy.extend(against.host_busy.iter().cloned());
    variant_rows(&judged, &judged, &busy, settings.metric)
}

/// Whether the host was busy during a boot of the commit, its parent or the base.
fn busy_of(
    commit: &StepState,
    parent: Option<&StepState>,
    base: &KernelRuns,
) -> Vec<kab::BusyBoot> {
    let of = |s: &StepState| match s {
        StepState::Built(k) => k.host_busy.clone(),
        StepState::DoesNotBuild { .. } => Vec::new(),
    };
    let mut out = of(commit);
    out.extend(parent.map_or_else(|| base.host_busy.clone(), of));
    out
}

/// The rows of one commit: each variant's verdicts, matched by scenario and variant.
fn variant_rows(
    vs_parent: &[ScenarioAb],
    vs_base: &[ScenarioAb],
    busy: &[kab::BusyBoot],
    metric: Option<&str>,
) -> Vec<VariantRow> {
    let mut out = Vec::new();
    for s in vs_parent {
        for v in &s.variants {
            let mut parent_verdict = kab::verdict(&s.scenario, v);
            let base_v = vs_base
                .iter()
                .filter(|b| b.scenario == s.scenario)
                .flat_map(|b| &b.variants)
                .find(|b| b.variant == v.variant);
            let mut base_verdict =
                base_v.map_or_else(|| parent_verdict.clone(), |b| kab::verdict(&s.scenario, b));
            if !busy.is_empty() {
                kab::not_judged_on_a_busy_host(&mut parent_verdict, busy);
                kab::not_judged_on_a_busy_host(&mut base_verdict, busy);
            }
            out.push(VariantRow {
                scenario: s.scenario.clone(),
                variant: v.variant.clone(),
                numbers: numbers(v, &parent_verdict, metric),
                vs_parent: parent_verdict,
                vs_base: base_verdict,
            });
        }
    }
    out
}

/// The metric to show: one the verdict judged, never a time shown but not judged (every time
/// under TCG). The one that decided the class (the first regression of a REGRESSED; for a
/// FIXED the ioctl that no longer stalls, else its first improvement; the first unsettled
/// metric of a NOT DECIDED), else any that moved (a cost), else the one asked for when it was
/// judged, else an ioctl that stalls on either side (what a reader of a lifecycle row wants to
/// see unchanged), else the first judged metric: jiffies, then a count, then a time. None
/// when nothing was judged.
fn numbers(v: &VariantAb, verdict: &VariantVerdict, asked: Option<&str>) -> Option<Numbers> {
    use crate::analysis::metric_ab::MetricJudgement;
    let judged = |m: &&MetricAb| !matches!(m.judgement, MetricJudgement::NotJudged { .. });
    let named = |n: &str| v.metrics.iter().filter(judged).find(|m| m.metric == n);
    let changes = |c: &[kab::Change]| c.iter().map(|c| c.metric.clone()).collect::<Vec<_>>();
    let stalled = |gone_only: bool| {
        verdict
            .stalls
            .iter()
            .filter(move |s| !gone_only || (s.a.is_some() && s.b.is_none()))
            .map(|s| format!("ioctl.{}", s.ioctl))
    };
    let deciding: Vec<String> = match verdict.class {
        VariantClass::Regressed => changes(&verdict.regressions),
        VariantClass::Fixed => stalled(true)
            .chain(changes(&verdict.improvements))
            .collect(),
        VariantClass::Improved => changes(&verdict.improvements),
        VariantClass::NotDecided => verdict.undecided.clone(),
        VariantClass::NoChange | VariantClass::NotExercised => Vec::new(),
    };
    let moved = changes(&verdict.regressions)
        .into_iter()
        .chain(changes(&verdict.improvements))
        .chain(changes(&verdict.costs));
    let first_judged = || {
        let by_trust = |t: Trust| v.metrics.iter().filter(judged).find(|m| m.trust == t);
        by_trust(Trust::Jiffies)
            .or_else(|| by_trust(Trust::Count))
            .or_else(|| by_trust(Trust::Time))
    };
    let m: &MetricAb = deciding
        .into_iter()
        .chain(moved)
        .chain(asked.map(str::to_string))
        .chain(stalled(false))
        .find_map(|n| named(&n))
        .or_else(first_judged)?;
    let [a, b] = m.median;
    Some(Numbers {
        metric: m.metric.clone(),
        unit: m.unit.clone(),
        parent: a,
        commit: b,
        change_pct: if a == 0.0 {
            if b == 0.0 { 0.0 } else { f64::INFINITY }
        } else {
            (b - a) / a * 100.0
        },
        stddev_pct: [stddev_pct(&m.samples[0]), stddev_pct(&m.samples[1])],
    })
}

/// The sample standard deviation in % of the mean (0 for a constant or empty side).
fn stddev_pct(x: &[f64]) -> f64 {
    if x.len() < 2 {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss)] // sample counts are far below 2^52
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    if mean == 0.0 {
        return 0.0;
    }
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0);
    var.sqrt() / mean.abs() * 100.0
}

impl SeriesTable {
    /// Whether any row against its parent is REGRESSED (`--fail-on-regression`).
    pub fn regression(&self) -> bool {
        self.commits
            .iter()
            .flat_map(|c| &c.variants)
            .any(|v| v.vs_parent.class == VariantClass::Regressed)
    }
}
