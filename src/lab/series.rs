//! `hvlab kab BASE SERIES --per-patch`: a verdict per commit of a series, each commit against
//! its parent and against the base, LKP-style (parent | commit | %change, with the spread).
//!
//! - A series is an ordered list of steps ([`SeriesStep`]: a label, a subject and a kernel
//!   spec `resolve` accepts), from a [`SeriesSource`]: the messages of an mbox on a Debian
//!   base ([`MboxSeries`]), or a git range (the git spec's own source, when it is given one).
//! - Boots follow [`sweep_order`]: base, 1, 2, …, N, N, …, 2, 1, base per round, so every
//!   adjacent pair (parent, commit) sees ABBA and each kernel's boot serves both pairs it is in.
//! - Runs are stored as they come back and found again by kernel ([`stored_runs`]): an
//!   interrupted run, a shard's or a bisection's boots count toward the next, and a kernel with
//!   enough stored boots is not booted again.
//! - Every comparison of the table (N commits × 2 × variants × metrics) is corrected together
//!   ([`judge_series`]): a table of 576 comparisons each at p < 0.05 alone would flag a change
//!   in nearly every A/A series.
//! - A commit that does not build keeps its row with the compiler's first error, and the next
//!   commit is judged against the last one that built.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::analysis::verdict::Class;
use crate::error::{Error, InputError};
use crate::kernel::build::{BuildError, PatchedSpec};
use crate::kernel::vm::{Accel, VmError};
use crate::lab::kab::{
    self, GuestFailure, MetricAb, ScenarioAb, SideRuns, VariantAb, VariantVerdict,
};
use crate::lab::shard::Shard;
use crate::record::RunRecord;
use crate::store::Store;

/// One commit of a series: how output names it and the kernel spec that builds it (the base
/// with every commit up to and including this one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeriesStep {
    /// `[PATCH 2/4]`, or a commit's short hash.
    pub label: String,
    /// The subject, without the label.
    pub subject: String,
    /// A spec `resolve` accepts (`debian:7.3+0001.patch+0002.patch`, `git:~/linux@3f2a…`).
    pub spec: String,
}

/// Where a series' steps come from: an mbox on a Debian base, a git range.
pub trait SeriesSource {
    /// The spec every step is judged against (the series' base).
    fn base(&self) -> &str;
    /// The steps, oldest first.
    fn steps(&self) -> Result<Vec<SeriesStep>, Error>;
    /// What the reader must know about the series (a range that follows first parents past
    /// a merge).
    fn notes(&self) -> Vec<String> {
        Vec::new()
    }
}

/// `debian:7.3+v3.mbox`: each message of the mbox a step, written to a file of its own under
/// hvlab's cache (named by the mbox's hash, so the same series finds its builds and runs
/// again), the step's spec the base with the files up to it.
#[derive(Debug, Clone)]
pub struct MboxSeries {
    base: String,
    spec: PatchedSpec,
    dir: PathBuf,
}

impl MboxSeries {
    /// Reads `spec` (`BASE+SERIES.mbox[+MORE]`); every message of every patch file is a step.
    pub fn parse(spec: &str) -> Result<MboxSeries, Error> {
        let parsed = PatchedSpec::parse(spec).map_err(VmError::from)?;
        if parsed.patches.is_empty() {
            return Err(not_a_series(spec, "it has no patch file"));
        }
        let hashes: String = parsed.patches.iter().map(|p| p.sha256.as_str()).collect();
        let id = crate::kernel::patch::sha256_hex(hashes.as_bytes());
        let dir = crate::kernel::cache_dir()
            .join("series")
            .join(&id[..16.min(id.len())]);
        Ok(MboxSeries {
            base: parsed.base.clone(),
            spec: parsed,
            dir,
        })
    }

    /// The same, its per-message files under `dir` (tests).
    pub fn in_dir(spec: &str, dir: &Path) -> Result<MboxSeries, Error> {
        let mut s = MboxSeries::parse(spec)?;
        s.dir = dir.to_path_buf();
        Ok(s)
    }
}

fn not_a_series(spec: &str, why: &str) -> Error {
    InputError::BadValue {
        key: "SERIES".into(),
        value: spec.to_string(),
        why: format!(
            "{why}; --per-patch takes BASE+SERIES.mbox (debian:7.3+v3.mbox) or a git range (git:PATH@A..B)"
        ),
    }
    .into()
}

/// `[PATCH 2/4] kvm: x` → (`[PATCH 2/4]`, `kvm: x`); a subject without a bracket gets
/// `patch i/N`.
fn label_of(subject: Option<&str>, n: usize, total: usize) -> (String, String) {
    let fallback = format!("patch {n}/{total}");
    let Some(s) = subject.map(str::trim) else {
        return (fallback, String::new());
    };
    if let Some(rest) = s.strip_prefix('[')
        && let Some((tag, after)) = rest.split_once(']')
    {
        return (format!("[{tag}]"), after.trim().to_string());
    }
    (fallback, s.to_string())
}

impl SeriesSource for MboxSeries {
    fn base(&self) -> &str {
        &self.base
    }

    fn steps(&self) -> Result<Vec<SeriesStep>, Error> {
        let messages: Vec<&crate::kernel::patch::Patch> = self
            .spec
            .patches
            .iter()
            .flat_map(|f| f.patches.iter())
            .collect();
        if messages.is_empty() {
            return Err(not_a_series(&self.spec.given, "its files carry no diff"));
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| VmError::Io(self.dir.clone(), e))?;
        let total = messages.len();
        let mut spec = self.base.clone();
        let mut out = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            let path = self.dir.join(format!("{:04}.patch", i + 1));
            write_if_changed(&path, &m.text)?;
            // A `+` in the path would read as a patch separator.
            if path.to_string_lossy().contains('+') {
                return Err(not_a_series(
                    &self.spec.given,
                    &format!(
                        "hvlab's cache path {} holds a `+`, which a spec reads as a patch separator; set XDG_CACHE_HOME to a path without one",
                        path.display()
                    ),
                ));
            }
            spec = format!("{spec}+{}", path.display());
            let (label, subject) = label_of(m.subject.as_deref(), i + 1, total);
            out.push(SeriesStep {
                label,
                subject,
                spec: spec.clone(),
            });
        }
        Ok(out)
    }
}

/// `git:PATH@A..B`: each first-parent commit of the range a step, labelled by its short
/// hash, from the build layer's [`crate::kernel::build::series_prefixes`] (which reads the
/// repository only); the base is A's commit.
#[derive(Debug, Clone)]
pub struct GitRangeSeries {
    base: String,
    steps: Vec<SeriesStep>,
    /// What the reader must know (a range that follows first parents past a merge).
    pub notes: Vec<String>,
}

impl GitRangeSeries {
    /// Resolves the range `spec` (`git:PATH@A..B`).
    pub fn parse(spec: &str) -> Result<GitRangeSeries, Error> {
        let series = crate::kernel::build::series_prefixes(spec).map_err(VmError::from)?;
        let total = series.steps.len();
        let steps = series
            .steps
            .iter()
            .enumerate()
            .map(|(i, st)| SeriesStep {
                label: st
                    .commit
                    .as_ref()
                    .map_or_else(|| format!("patch {}/{total}", i + 1), |c| c.short.clone()),
                subject: st.subject.clone(),
                spec: st.spec.clone(),
            })
            .collect();
        Ok(GitRangeSeries {
            base: series.base,
            steps,
            notes: series.notes,
        })
    }
}

impl SeriesSource for GitRangeSeries {
    fn base(&self) -> &str {
        &self.base
    }

    fn steps(&self) -> Result<Vec<SeriesStep>, Error> {
        Ok(self.steps.clone())
    }

    fn notes(&self) -> Vec<String> {
        self.notes.clone()
    }
}

/// The series `spec` names: a git range (`git:PATH@A..B`), else an mbox on a base
/// (`debian:7.3+v3.mbox`).
pub fn source_of(spec: &str) -> Result<Box<dyn SeriesSource>, Error> {
    if crate::kernel::git::names_range(spec) {
        Ok(Box::new(GitRangeSeries::parse(spec)?))
    } else {
        Ok(Box::new(MboxSeries::parse(spec)?))
    }
}

/// Whether `base` is the base of the series `spec` resolved to `resolved`: the same spec, or
/// for a range `git:PATH@A..B` its `git:PATH@A` (which resolves to A's commit).
pub fn is_base_of(base: &str, spec: &str, resolved: &str) -> bool {
    base == resolved
        || (crate::kernel::git::names_range(spec)
            && spec.split_once("..").is_some_and(|(a, _)| a == base))
}

/// Writes `text` to `path` unless it already holds it, through a temporary file renamed into
/// place, so a reader never sees half a patch.
fn write_if_changed(path: &Path, text: &str) -> Result<(), Error> {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(());
    }
    let tmp = path.with_extension("patch.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| VmError::Io(path.to_path_buf(), e).into())
}

/// The boot order of `kernels` kernels in a chain (0 the base, i the i-th commit), each booted
/// `boots_each` times: rounds of 0, 1, …, k−1 then k−1, …, 0, so each adjacent pair sees
/// ABBA (i, i+1, i+1, i) within a round and every boot serves both pairs its kernel is in.
/// With an odd `boots_each` the last round is forward only.
pub fn sweep_order(kernels: usize, boots_each: u32) -> Vec<usize> {
    let mut out = Vec::new();
    for round in 0..boots_each {
        if round % 2 == 0 {
            out.extend(0..kernels);
        } else {
            out.extend((0..kernels).rev());
        }
    }
    out
}

/// [`sweep_order`] without the boots already stored: `stored[i]` boots of kernel `i` are
/// taken off the front of the order, so an interrupted run resumes where it stopped.
pub fn remaining_order(stored: &[u32], boots_each: u32) -> Vec<usize> {
    let mut skip: Vec<u32> = stored.to_vec();
    sweep_order(stored.len(), boots_each)
        .into_iter()
        .filter(|&k| {
            if skip[k] > 0 {
                skip[k] -= 1;
                false
            } else {
                true
            }
        })
        .collect()
}

/// The runs of the kernel built from `spec` under `accel` that the store holds, of `scenarios`.
pub fn stored_runs(
    store: &Store,
    spec: &str,
    accel: Accel,
    scenarios: &[String],
) -> Result<Vec<RunRecord>, Error> {
    let all = crate::store::transfer::select(store, &[])?;
    Ok(of_kernel(all, spec, accel, scenarios))
}

/// Of `runs`, those made on the kernel of `spec` under `accel`, of `scenarios`.
pub fn of_kernel(
    runs: Vec<RunRecord>,
    spec: &str,
    accel: Accel,
    scenarios: &[String],
) -> Vec<RunRecord> {
    let accel = accel.to_string();
    runs.into_iter()
        .filter(|r| {
            r.host
                .under_test
                .as_ref()
                .is_some_and(|u| u.spec == spec && u.accel == accel)
                && scenarios.contains(&r.scenario)
        })
        .collect()
}

/// How many boots `runs` hold: the fewest runs of any of `scenarios` (each boot runs each once).
pub fn boots_in(runs: &[RunRecord], scenarios: &[String]) -> u32 {
    scenarios
        .iter()
        .map(|s| runs.iter().filter(|r| &r.scenario == s).count())
        .min()
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// What one kernel of the series brought back.
#[derive(Debug, Clone, Default)]
pub struct KernelRuns {
    /// Its runs.
    pub runs: Vec<RunRecord>,
    /// Guest commands that failed on it.
    pub failed_commands: Vec<GuestFailure>,
    /// Its boots the host was busy during (none when it was quiet during all).
    pub host_busy: Vec<kab::BusyBoot>,
}

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
    /// Scenarios.
    pub scenarios: &'a [String],
    /// Variants asked for (all when empty).
    pub variants: &'a [String],
    /// The accelerator the runs were made under.
    pub accel: Accel,
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
    let side = |k: &'_ KernelRuns| -> (Vec<RunRecord>, Vec<GuestFailure>) {
        (k.runs.clone(), k.failed_commands.clone())
    };
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
        let (pa, pf) = side(parent_runs);
        let (cr, cf) = side(runs);
        let (ba, bf) = side(base);
        let judge = |a: &[RunRecord], af: &[GuestFailure]| {
            kab::judge_uncorrected(
                settings.scenarios,
                settings.variants,
                [
                    SideRuns {
                        runs: a,
                        failed_commands: af,
                    },
                    SideRuns {
                        runs: &cr,
                        failed_commands: &cf,
                    },
                ],
                settings.accel,
                settings.threshold,
            )
        };
        let vs_parent = judge(&pa, &pf);
        let count = vs_parent.len();
        family.extend(vs_parent);
        // Against the base only when the parent is not the base: the same comparison twice
        // would count twice in the family.
        if parent.is_some() {
            family.extend(judge(&ba, &bf));
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

/// The metric to show: the first that moved (a regression, an improvement, a cost), else the
/// one asked for, else the first compared.
fn numbers(v: &VariantAb, verdict: &VariantVerdict, asked: Option<&str>) -> Option<Numbers> {
    let moved = verdict
        .regressions
        .iter()
        .chain(&verdict.improvements)
        .chain(&verdict.costs)
        .map(|c| c.metric.as_str())
        .next();
    let name = moved.or(asked);
    let m: &MetricAb = match name {
        Some(n) => v.metrics.iter().find(|m| m.metric == n)?,
        None => v.metrics.first()?,
    };
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
            .any(|v| v.vs_parent.class == Class::Regressed)
    }
}

/// The kernels a shard boots: unit `k` (0-based position in the series) is commit `k` booted
/// against its parent, so a shard on its own node judges each of its commits against a parent
/// booted on the same host. Returns, per selected commit, its index and its parent's (None for
/// the base). A parent is booted by its child's shard too: its own shard may run on another
/// node, and a comparison across hosts would measure the hosts.
pub fn shard_units(steps: usize, shard: &Shard) -> Vec<(usize, Option<usize>)> {
    (0..steps)
        .filter(|&k| shard.selects(k))
        .map(|k| (k, k.checked_sub(1)))
        .collect()
}

/// What `hvlab kab BASE SERIES --per-patch` runs.
#[derive(Debug, Clone)]
pub struct PerPatchRequest {
    /// The kab's settings: `base` is BASE, `patched` the SERIES spec; boots and reps per
    /// kernel.
    pub kab: kab::KabRequest,
    /// The metric shown in each row's numbers when none moved.
    pub metric: Option<String>,
    /// The slice of the series this process runs (the whole series without `--shard`).
    pub shard: Shard,
}

/// A per-patch run: the table, the boots it made, and its phases' times.
#[derive(Debug, Clone, Serialize)]
pub struct PerPatchOutcome {
    /// The table (a shard's: its commits only).
    pub table: SeriesTable,
    /// The shard (`1/1` for the whole series).
    pub shard: String,
    /// Each boot made now, with the commit it booted (`base` for the base).
    pub boots: Vec<(String, kab::BootSummary)>,
    /// Boots found in the store and not made again, per kernel label.
    pub reused_boots: Vec<(String, u32)>,
    /// What the reader must know (builds, reuse, pooling across shards).
    pub notes: Vec<String>,
    /// The accelerator.
    pub accel: crate::kernel::vm::AccelChoice,
    /// Wall times: building, booting, judging.
    pub wall: kab::WallTimes,
    /// Seconds judging.
    pub judge_s: f64,
}

/// One kernel of the series as resolved: its label, spec, and the kernel or why it has none.
struct Resolved {
    label: String,
    spec: String,
    kernel: Result<crate::kernel::Kernel, String>,
}

/// Builds `specs` (the base first): together when all build, each beside the base when one
/// does not, so a commit that does not compile costs its own row and not the series.
fn build_all(
    specs: &[(String, String)],
    req: &kab::KabRequest,
    progress: &dyn kab::KabProgress,
    notes: &mut Vec<String>,
) -> Result<Vec<Resolved>, Error> {
    use crate::kernel::build;
    let refs: Vec<&str> = specs.iter().map(|(_, s)| s.as_str()).collect();
    let together = build::resolve(&refs, None, req.sandbox, progress);
    let kernels: Vec<Result<crate::kernel::Kernel, String>> = match together {
        Ok(r) => {
            notes.extend(r.notes);
            r.sides.into_iter().map(|b| Ok(b.kernel)).collect()
        }
        Err(e @ (BuildError::PatchedCompile { .. } | BuildError::DoesNotApply { .. })) => {
            progress.note(&format!(
                "the series does not build as a whole ({}); building each commit beside the base to find which",
                first_error(&e)
            ));
            let mut out = Vec::new();
            for (i, spec) in refs.iter().enumerate() {
                let pair: Vec<&str> = if i == 0 {
                    vec![spec]
                } else {
                    vec![refs[0], spec]
                };
                out.push(match build::resolve(&pair, None, req.sandbox, progress) {
                    Ok(r) => r
                        .sides
                        .into_iter()
                        .last()
                        .map(|b| b.kernel)
                        .ok_or_else(|| "the build returned no kernel".to_string()),
                    Err(e) if i > 0 && e.fault() == hvlab_core::error::Fault::BadInput => {
                        Err(first_error(&e))
                    }
                    Err(e) => return Err(VmError::from(e).into()),
                });
            }
            out
        }
        Err(e) => return Err(VmError::from(e).into()),
    };
    Ok(specs
        .iter()
        .zip(kernels)
        .map(|((label, spec), kernel)| Resolved {
            label: label.clone(),
            spec: spec.clone(),
            kernel,
        })
        .collect())
}

/// The boots a chain made (with the label of the kernel each booted), and the boots per
/// kernel label found stored and not made again.
type ChainBoots = (Vec<(String, kab::BootSummary)>, Vec<(String, u32)>);

/// Boots `chain` (indices into `kernels`) in [`remaining_order`] until each has `boots`
/// boots stored, storing every run as it comes back; returns the boots made and those reused.
#[allow(clippy::too_many_arguments)] // one boot loop for the whole series, each shard unit, each bisect step
pub(crate) fn boot_chain(
    chain: &[usize],
    kernels: &[(String, crate::kernel::Kernel)],
    req: &kab::KabRequest,
    commands: &[Vec<String>],
    accel: Accel,
    store: &mut Store,
    progress: &dyn kab::KabProgress,
    busy: &mut [Vec<kab::BusyBoot>],
    failed: &mut [Vec<GuestFailure>],
) -> Result<ChainBoots, Error> {
    let stored: Vec<u32> = chain
        .iter()
        .map(|&k| {
            stored_runs(store, &kernels[k].1.spec, accel, &req.scenarios)
                .map(|r| boots_in(&r, &req.scenarios).min(req.boots))
        })
        .collect::<Result<_, _>>()?;
    let reused: Vec<(String, u32)> = chain
        .iter()
        .zip(&stored)
        .filter(|(_, n)| **n > 0)
        .map(|(&k, &n)| (kernels[k].0.clone(), n))
        .collect();
    let order = remaining_order(&stored, req.boots);
    let mut made = Vec::new();
    for (n, &pos) in order.iter().enumerate() {
        let k = chain[pos];
        let (label, kernel) = &kernels[k];
        progress.boot_start(n + 1, order.len(), label, kernel);
        let before = hvlab_host::noise::Snapshot::take();
        let (boot, failure) =
            crate::kernel::vm::boot(kernel, &req.vm, commands, &kab::logs_dir(&kernel.release))?;
        let noise =
            hvlab_host::noise::between(&before, &hvlab_host::noise::Snapshot::take(), &[], 1);
        let tally = crate::kernel::vm::store_runs(store, &boot.runs)?;
        let mut summary =
            kab::BootSummary::of(label, &boot, tally.stored, store.location().to_string());
        summary.host_busy = kab::busy_during_boot(&noise);
        if let Some(reasons) = &summary.host_busy {
            busy[k].push(kab::BusyBoot {
                boot: n + 1,
                side: label.clone(),
                reasons: reasons.clone(),
            });
        }
        failed[k].extend(summary.failures.iter().cloned());
        progress.boot_end(&summary);
        made.push((label.clone(), summary));
        if let Some(f) = failure {
            return Err(f.into());
        }
    }
    Ok((made, reused))
}

/// `hvlab kab BASE SERIES --per-patch`: builds each commit of the series (its shard's, and
/// their parents), boots them so each adjacent pair is ABBA, stores every run, and judges
/// every commit against its parent and the base as one family.
pub fn run_per_patch(
    req: &PerPatchRequest,
    source: &dyn SeriesSource,
    store: &mut Store,
    progress: &dyn kab::KabProgress,
) -> Result<PerPatchOutcome, Error> {
    let start = std::time::Instant::now();
    let k = &req.kab;
    let commands = kab::guest_commands(k)?;
    crate::kernel::vm::qemu()?;
    let steps = source.steps()?;
    let choice = crate::kernel::vm::choose_accel(k.vm.accel)?;
    // The kernels this process needs: every one for the whole series; a shard's commits and
    // each one's parent.
    let units = shard_units(steps.len(), &req.shard);
    let needed: Vec<bool> = (0..steps.len())
        .map(|i| req.shard.is_whole() || units.iter().any(|&(c, _)| c == i || c == i + 1))
        .collect();
    let mut specs = vec![("base".to_string(), source.base().to_string())];
    let wanted: Vec<usize> = (0..steps.len()).filter(|&i| needed[i]).collect();
    specs.extend(
        wanted
            .iter()
            .map(|&i| (steps[i].label.clone(), steps[i].spec.clone())),
    );
    let mut notes = source.notes();
    let resolved = build_all(&specs, k, progress, &mut notes)?;
    let build_s = start.elapsed().as_secs_f64();
    // Index 0 the base, i + 1 commit i.
    let mut states: Vec<Option<Result<crate::kernel::Kernel, String>>> =
        vec![None; steps.len() + 1];
    let mut it = resolved.into_iter();
    if let Some(b) = it.next() {
        states[0] = Some(b.kernel.map_err(|e| format!("the base {}: {e}", b.spec)));
    }
    for (&i, r) in wanted.iter().zip(it) {
        let checked = r.kernel.and_then(|kern| {
            crate::kernel::check_kvm(&kern, &choice.vendor_module)
                .and_then(|()| crate::kernel::check_guest_config(&kern))
                .map(|()| kern)
                .map_err(|e| e.to_string())
        });
        if let Err(e) = &checked {
            progress.note(&format!("{} does not build: {e}", r.label));
        }
        states[i + 1] = Some(checked);
    }
    let base_kernel = match states[0].clone() {
        Some(Ok(b)) => b,
        Some(Err(e)) => {
            return Err(InputError::BadValue {
                key: "BASE".into(),
                value: source.base().to_string(),
                why: e,
            }
            .into());
        }
        None => return Err(not_a_series(&k.patched, "it has no base")),
    };
    let mut labelled: Vec<(String, crate::kernel::Kernel)> = vec![("base".into(), base_kernel)];
    let mut slot: Vec<Option<usize>> = vec![Some(0); 1];
    for (i, st) in states.iter().enumerate().skip(1) {
        if let Some(Ok(kern)) = st {
            slot.push(Some(labelled.len()));
            labelled.push((steps[i - 1].label.clone(), kern.clone()));
        } else {
            slot.push(None);
        }
    }
    // The chains to boot: the whole series as one, or each shard unit with its parent (the
    // last kernel before it that built).
    let built_before = |i: usize| (0..=i).rev().find_map(|j| slot[j]);
    let chains: Vec<Vec<usize>> = if req.shard.is_whole() {
        vec![slot.iter().flatten().copied().collect()]
    } else {
        units
            .iter()
            .filter_map(|&(c, _)| {
                let me = slot[c + 1]?;
                Some(vec![built_before(c).unwrap_or(0), me])
            })
            .collect()
    };
    let boots_start = std::time::Instant::now();
    let mut busy = vec![Vec::new(); labelled.len()];
    let mut failed = vec![Vec::new(); labelled.len()];
    let mut boots = Vec::new();
    let mut reused = Vec::new();
    for chain in &chains {
        let (made, re) = boot_chain(
            chain,
            &labelled,
            k,
            &commands,
            choice.accel,
            store,
            progress,
            &mut busy,
            &mut failed,
        )?;
        boots.extend(made);
        reused.extend(re);
    }
    let boots_s = boots_start.elapsed().as_secs_f64();
    let judge_start = std::time::Instant::now();
    let all = crate::store::transfer::select(store, &[])?;
    let runs_of = |slot_i: usize| KernelRuns {
        runs: of_kernel(
            all.clone(),
            &labelled[slot_i].1.spec,
            choice.accel,
            &k.scenarios,
        ),
        failed_commands: failed[slot_i].clone(),
        host_busy: busy[slot_i].clone(),
    };
    let base_runs = runs_of(0);
    let step_states: Vec<StepState> = (0..steps.len())
        .map(|i| match (&states[i + 1], slot[i + 1]) {
            (Some(Ok(_)), Some(s)) => StepState::Built(runs_of(s)),
            (Some(Err(e)), _) => StepState::DoesNotBuild { error: e.clone() },
            // Another shard's commit: no runs here, judged where it ran and after `merge`.
            _ => StepState::Built(KernelRuns::default()),
        })
        .collect();
    let mut table = judge_series(
        source.base(),
        &base_runs,
        &steps,
        &step_states,
        &JudgeSettings {
            scenarios: &k.scenarios,
            variants: &k.variants,
            accel: choice.accel,
            threshold: k.threshold,
            metric: req.metric.as_deref(),
        },
    );
    if !req.shard.is_whole() {
        table
            .commits
            .retain(|c| units.iter().any(|&(u, _)| u + 1 == c.position));
        notes.push(format!(
            "shard {}: its commits only, each booted against its parent on this host (a parent is booted again by its child's shard: the shards may run on different hosts); `hvlab merge` the shards' files, then run this command again without --shard against the merged store for the whole table",
            req.shard
        ));
    }
    if !reused.is_empty() {
        notes.push(format!(
            "boots found in the store and not made again: {}",
            reused
                .iter()
                .map(|(l, n)| format!("{l} ({n})"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let judge_s = judge_start.elapsed().as_secs_f64();
    Ok(PerPatchOutcome {
        table,
        shard: req.shard.to_string(),
        boots,
        reused_boots: reused,
        notes,
        accel: choice,
        wall: kab::WallTimes {
            build_s,
            boots_s,
            total_s: start.elapsed().as_secs_f64(),
        },
        judge_s,
    })
}

/// The table of a series from the store alone (after `hvlab merge`): each commit's runs found
/// by its spec; a commit with none is NOT DECIDED on every row, its runs missing (it did not
/// build, or its shard did not run).
pub fn table_from_store(
    store: &Store,
    source: &dyn SeriesSource,
    settings: &JudgeSettings<'_>,
) -> Result<SeriesTable, Error> {
    let steps = source.steps()?;
    let all = crate::store::transfer::select(store, &[])?;
    let runs = |spec: &str| KernelRuns {
        runs: of_kernel(all.clone(), spec, settings.accel, settings.scenarios),
        ..KernelRuns::default()
    };
    let base = runs(source.base());
    let states: Vec<StepState> = steps
        .iter()
        .map(|s| {
            let r = runs(&s.spec);
            if r.runs.is_empty() {
                StepState::DoesNotBuild {
                    error:
                        "no runs stored: it did not build, or its shard's file has not been merged"
                            .into(),
                }
            } else {
                StepState::Built(r)
            }
        })
        .collect();
    Ok(judge_series(
        source.base(),
        &base,
        &steps,
        &states,
        settings,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{MetricRecord, VariantRecord, VariantStatus};
    use std::collections::BTreeMap;

    /// splitmix64: a seeded stream for simulated samples.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            #[allow(clippy::cast_precision_loss)]
            let u = (z >> 11) as f64 / (1u64 << 53) as f64;
            u
        }
        /// Normal(mean, sd), Box–Muller.
        fn normal(&mut self, mean: f64, sd: f64) -> f64 {
            let (u1, u2) = (self.next().max(1e-12), self.next());
            mean + sd * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
        }
    }

    const SCENARIO: &str = "memory";

    /// One boot's run of the kernel `spec`: `variants` × `metrics` times in µs around 100
    /// with a relative spread `cv`, `reps` repetitions each; `shift(variant, metric)` scales
    /// the mean (a change the commit made).
    #[allow(clippy::too_many_arguments)]
    fn run(
        id: &str,
        spec: &str,
        variants: usize,
        metrics: usize,
        reps: usize,
        cv: f64,
        rng: &mut Rng,
        shift: &dyn Fn(usize, usize) -> f64,
    ) -> RunRecord {
        // One template for every simulated run: the fixture goes through a store to load.
        static TEMPLATE: std::sync::OnceLock<RunRecord> = std::sync::OnceLock::new();
        let mut r = TEMPLATE
            .get_or_init(|| kab::fixture::runs()[0].clone())
            .clone();
        r.run_id = id.to_string();
        r.scenario = SCENARIO.into();
        r.verdicts.clear();
        r.warnings.clear();
        r.noise = None;
        if let Some(u) = r.host.under_test.as_mut() {
            u.spec = spec.to_string();
            u.accel = "kvm".into();
            u.kab = None;
        }
        r.variants = (0..variants)
            .map(|v| VariantRecord {
                name: format!("v{v}"),
                status: VariantStatus::Ok,
                metrics: (0..metrics)
                    .map(|m| {
                        let mean = 100.0 * shift(v, m);
                        let samples: Vec<f64> =
                            (0..reps).map(|_| rng.normal(mean, mean * cv)).collect();
                        (format!("m{m:02}"), metric(samples, "us"))
                    })
                    .chain(std::iter::once((
                        "kvm.vm.exits".to_string(),
                        metric(vec![7.0; reps], "count"),
                    )))
                    .collect::<BTreeMap<_, _>>(),
                findings: Vec::new(),
                timeline: Vec::new(),
                pinned_bytes: Vec::new(),
            })
            .collect();
        r
    }

    fn metric(samples: Vec<f64>, unit: &str) -> MetricRecord {
        let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
        let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        MetricRecord {
            unit: unit.into(),
            median: crate::analysis::statistics::median(&samples),
            ci95: [min, max],
            min,
            max,
            n: samples.len(),
            samples,
        }
    }

    /// A kernel's runs: `boots` boots.
    #[allow(clippy::too_many_arguments)]
    fn kernel(
        spec: &str,
        boots: usize,
        variants: usize,
        metrics: usize,
        reps: usize,
        cv: f64,
        rng: &mut Rng,
        shift: &dyn Fn(usize, usize) -> f64,
    ) -> KernelRuns {
        KernelRuns {
            runs: (0..boots)
                .map(|b| {
                    run(
                        &format!("{spec}-boot{b}"),
                        spec,
                        variants,
                        metrics,
                        reps,
                        cv,
                        rng,
                        shift,
                    )
                })
                .collect(),
            ..KernelRuns::default()
        }
    }

    fn steps(n: usize) -> Vec<SeriesStep> {
        (1..=n)
            .map(|i| SeriesStep {
                label: format!("[PATCH {i}/{n}]"),
                subject: format!("change {i}"),
                spec: format!("debian:7.3+{i}"),
            })
            .collect()
    }

    fn settings(scenarios: &[String]) -> JudgeSettings<'_> {
        JudgeSettings {
            scenarios,
            variants: &[],
            accel: Accel::Kvm,
            threshold: 0.05,
            metric: None,
        }
    }

    fn flagged(t: &SeriesTable) -> bool {
        t.commits.iter().flat_map(|c| &c.variants).any(|v| {
            [v.vs_parent.class, v.vs_base.class]
                .iter()
                .any(|c| matches!(c, Class::Regressed | Class::Improved | Class::Fixed))
        })
    }

    #[test]
    fn sweep_order_gives_every_adjacent_pair_abba_and_boots_each_kernel_once_a_turn() {
        assert_eq!(sweep_order(4, 2), vec![0, 1, 2, 3, 3, 2, 1, 0]);
        for kernels in 2..6 {
            for boots in 1..5u32 {
                let order = sweep_order(kernels, boots);
                for k in 0..kernels {
                    let n = order.iter().filter(|&&x| x == k).count();
                    assert_eq!(n, boots as usize);
                }
                if boots % 2 == 0 {
                    for i in 0..kernels - 1 {
                        let pair: Vec<usize> = order
                            .iter()
                            .filter(|&&x| x == i || x == i + 1)
                            .map(|&x| usize::from(x == i + 1))
                            .collect();
                        assert_eq!(pair, kab::abba(boots), "pair {i} of {kernels}");
                    }
                }
            }
        }
    }

    #[test]
    fn an_interrupted_run_boots_only_what_is_missing() {
        // base and commit 1 fully stored, commit 2 once: commit 2's second boot, commit 3's two.
        assert_eq!(remaining_order(&[2, 2, 1, 0], 2), vec![3, 3, 2]);
        assert!(remaining_order(&[2, 2], 2).is_empty());
    }

    #[test]
    fn every_commit_is_one_shards_unit_with_its_parent() {
        for n in 1..6 {
            let mut seen = Vec::new();
            for i in 0..n {
                let shard = Shard::new(i, n).expect("a shard");
                for (c, p) in shard_units(7, &shard) {
                    assert_eq!(p, c.checked_sub(1));
                    seen.push(c);
                }
            }
            seen.sort_unstable();
            assert_eq!(seen, (0..7).collect::<Vec<_>>(), "{n} shards");
        }
    }

    /// One simulated table of N = 4 commits × 6 variants × 12 metrics, every kernel booted
    /// twice with `reps` repetitions at a 5% spread; commit 3 scales v0's m00 by `shift`.
    fn aa_table(seed: u64, reps: usize, shift: f64) -> SeriesTable {
        let scenarios = vec![SCENARIO.to_string()];
        let mut rng = Rng(seed);
        let same = |_: usize, _: usize| 1.0;
        let changed = |v: usize, m: usize| if v == 0 && m == 0 { shift } else { 1.0 };
        let base = kernel("debian:7.3", 2, 6, 12, reps, 0.05, &mut rng, &same);
        let st = steps(4);
        let states: Vec<StepState> = st
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let f: &dyn Fn(usize, usize) -> f64 = if i == 2 { &changed } else { &same };
                StepState::Built(kernel(&s.spec, 2, 6, 12, reps, 0.05, &mut rng, f))
            })
            .collect();
        let t = judge_series("debian:7.3", &base, &st, &states, &settings(&scenarios));
        assert_eq!(
            t.commits.iter().map(|c| c.variants.len()).sum::<usize>(),
            24
        );
        // 4 commits against their parents and 3 against the base (the first's parent is it).
        assert_eq!(t.judged_together, 7 * 6 * 12);
        t
    }

    /// A/A: every kernel's runs drawn from one distribution, judged as one family: at most 5%
    /// of tables flag anything (1 of 20). The cost is the statistics (a bootstrap and an exact
    /// rank test per comparison, 504 a table): 5 repetitions a boot (10 samples a side, the
    /// fewest whose exact test can still reach Holm's 0.05/504) take ~0.8 s a table on a
    /// loaded host where 10 took 2.5 s. The same tables with a real 30% change must flag it,
    /// so a correction too strict to call anything cannot pass as "no false flags".
    #[test]
    fn an_aa_series_flags_a_change_in_at_most_five_percent_of_tables() {
        let (trials, reps) = (20u32, 5);
        let flagged_tables = (0..trials)
            .filter(|&trial| flagged(&aa_table(0x5eed_0000 + u64::from(trial), reps, 1.0)))
            .count();
        let share =
            f64::from(u32::try_from(flagged_tables).unwrap_or(u32::MAX)) / f64::from(trials);
        println!(
            "A/A: {flagged_tables} of {trials} tables ({:.1}%) flagged a change, 504 comparisons each",
            100.0 * share
        );
        assert!(
            share <= 0.05,
            "{flagged_tables} of {trials} A/A tables flagged a change"
        );
        let found = (0..2u32)
            .filter(|&trial| {
                let t = aa_table(0xc0de_0000 + u64::from(trial), reps, 1.3);
                t.commits[2].variants[0].vs_parent.class == Class::Regressed
            })
            .count();
        println!("the same tables with commit 3 30% slower on v0 m00: {found} of 2 flag it");
        assert_eq!(found, 2, "{found} of 2 tables found a 30% regression");
    }

    /// Documentation-only commits: every kernel's runs from one distribution (1% spread);
    /// every row against its parent and against the base is NO CHANGE.
    #[test]
    fn a_documentation_only_series_is_no_change_on_every_row() {
        let scenarios = vec![SCENARIO.to_string()];
        let mut rng = Rng(38);
        let same = |_: usize, _: usize| 1.0;
        let base = kernel("debian:7.3", 2, 6, 12, 10, 0.01, &mut rng, &same);
        let st = steps(4);
        let states: Vec<StepState> = st
            .iter()
            .map(|s| StepState::Built(kernel(&s.spec, 2, 6, 12, 10, 0.01, &mut rng, &same)))
            .collect();
        let t = judge_series("debian:7.3", &base, &st, &states, &settings(&scenarios));
        for c in &t.commits {
            assert_eq!(c.variants.len(), 6);
            for v in &c.variants {
                assert_eq!(
                    v.vs_parent.class,
                    Class::NoChange,
                    "{} {}",
                    c.step.label,
                    v.variant
                );
                assert_eq!(
                    v.vs_base.class,
                    Class::NoChange,
                    "{} {}",
                    c.step.label,
                    v.variant
                );
            }
        }
        assert!(
            crate::export::series::answer(&t)[0].starts_with("no commit changed anything"),
            "{:?}",
            crate::export::series::answer(&t)
        );
        assert!(!t.regression());
    }

    /// Commit 2 does not build; commit 3 regresses v0's m00 by 30%: its row is REGRESSED
    /// against commit 1 (the last that built), the answer leads with it, and commit 2's row
    /// carries the compiler's error.
    #[test]
    fn a_commit_that_does_not_build_keeps_its_row_and_the_next_is_judged_past_it() {
        let scenarios = vec![SCENARIO.to_string()];
        let mut rng = Rng(7);
        let same = |_: usize, _: usize| 1.0;
        let slower = |v: usize, m: usize| if v == 0 && m == 0 { 1.3 } else { 1.0 };
        let st = steps(3);
        let base = kernel("debian:7.3", 2, 2, 3, 10, 0.01, &mut rng, &same);
        let states = vec![
            StepState::Built(kernel(&st[0].spec, 2, 2, 3, 10, 0.01, &mut rng, &same)),
            StepState::DoesNotBuild {
                error: "virt/kvm/kvm_main.c:1702:9: error: implicit declaration".into(),
            },
            StepState::Built(kernel(&st[2].spec, 2, 2, 3, 10, 0.01, &mut rng, &slower)),
        ];
        let t = judge_series("debian:7.3", &base, &st, &states, &settings(&scenarios));
        assert_eq!(
            t.commits[1].does_not_build.as_deref(),
            Some("virt/kvm/kvm_main.c:1702:9: error: implicit declaration")
        );
        assert!(t.commits[1].variants.is_empty());
        let third = &t.commits[2];
        assert_eq!(third.parent, "[PATCH 1/3]");
        let v0 = &third.variants[0];
        assert_eq!(v0.vs_parent.class, Class::Regressed);
        assert_eq!(v0.vs_base.class, Class::Regressed);
        let n = v0.numbers.as_ref().expect("numbers");
        assert_eq!(n.metric, "m00");
        assert!((n.change_pct - 30.0).abs() < 3.0, "{n:?}");
        assert_eq!(third.variants[1].vs_parent.class, Class::NoChange);
        let answer = crate::export::series::answer(&t);
        assert!(
            answer[0].starts_with("[PATCH 2/3] DOES NOT BUILD: virt/kvm"),
            "{answer:?}"
        );
        assert!(
            answer[1].starts_with("[PATCH 3/3] REGRESSED v0: m00 "),
            "{answer:?}"
        );
        assert!(t.regression());
    }

    struct Fixed(Vec<SeriesStep>);
    impl SeriesSource for Fixed {
        fn base(&self) -> &str {
            "debian:7.3"
        }
        fn steps(&self) -> Result<Vec<SeriesStep>, Error> {
            Ok(self.0.clone())
        }
    }

    /// Shards' runs stored in their own files, merged as `hvlab merge` merges them, and the
    /// table made from the merged store: commit 2's regression found across shards.
    #[test]
    fn shards_merged_give_the_whole_table_from_the_store() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let scenarios = vec![SCENARIO.to_string()];
        let st = steps(3);
        let mut rng = Rng(11);
        let same = |_: usize, _: usize| 1.0;
        let slower = |v: usize, m: usize| if v == 1 && m == 2 { 1.25 } else { 1.0 };
        let mut files = Vec::new();
        for i in 0..2u32 {
            let shard = Shard::new(i, 2).expect("a shard");
            let path = dir.path().join(format!("shard{i}.db"));
            let mut store = Store::open(&path).expect("a store");
            for (c, parent) in shard_units(st.len(), &shard) {
                let parent_spec = parent.map_or("debian:7.3", |p| st[p].spec.as_str());
                // Commit 2 (index 1) made the change; every commit after it keeps it.
                let shift: &dyn Fn(usize, usize) -> f64 = if c >= 1 { &slower } else { &same };
                let parent_shift: &dyn Fn(usize, usize) -> f64 = if parent.is_some_and(|p| p >= 1) {
                    &slower
                } else {
                    &same
                };
                let mut runs = kernel(parent_spec, 2, 2, 3, 10, 0.01, &mut rng, parent_shift).runs;
                runs.extend(kernel(&st[c].spec, 2, 2, 3, 10, 0.01, &mut rng, shift).runs);
                for r in &mut runs {
                    r.run_id = format!("{}-shard{i}", r.run_id);
                }
                crate::store::transfer::ingest_all(&mut store, &runs).expect("stored");
            }
            files.push(path);
        }
        let mut merged = Store::open(&dir.path().join("merged.db")).expect("a store");
        for f in &files {
            crate::store::transfer::merge_file(&mut merged, f).expect("merged");
        }
        let t = table_from_store(&merged, &Fixed(st), &settings(&scenarios)).expect("a table");
        assert_eq!(t.commits.len(), 3);
        let classes: Vec<Vec<Class>> = t
            .commits
            .iter()
            .map(|c| c.variants.iter().map(|v| v.vs_parent.class).collect())
            .collect();
        assert_eq!(
            classes,
            vec![
                vec![Class::NoChange, Class::NoChange],
                vec![Class::NoChange, Class::Regressed],
                vec![Class::NoChange, Class::NoChange],
            ]
        );
        // Commit 3 against the base keeps commit 2's regression.
        assert_eq!(t.commits[2].variants[1].vs_base.class, Class::Regressed);
    }

    #[test]
    fn an_mbox_series_becomes_one_step_per_message() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let msg = |n: usize, file: &str| {
            format!(
                "From dev@example.org Mon Mar  9 12:30:5{n} 2026\nFrom: Dev <dev@example.org>\nSubject: [PATCH {n}/2] kvm: part {n}\n\nWhy.\n---\ndiff --git a/{file} b/{file}\n--- a/{file}\n+++ b/{file}\n@@ -1 +1 @@\n-old\n+new\n\n"
            )
        };
        let mbox = dir.path().join("v3.mbox");
        std::fs::write(
            &mbox,
            format!(
                "{}{}",
                msg(1, "Documentation/x.rst"),
                msg(2, "virt/kvm/kvm_main.c")
            ),
        )
        .expect("written");
        let spec = format!("debian:7.3+{}", mbox.display());
        let s = MboxSeries::in_dir(&spec, &dir.path().join("steps")).expect("a series");
        assert_eq!(s.base(), "debian:7.3");
        let st = s.steps().expect("steps");
        assert_eq!(st.len(), 2);
        assert_eq!(st[0].label, "[PATCH 1/2]");
        assert_eq!(st[1].subject, "kvm: part 2");
        // Each step's spec is the base with every message up to it, each its own file.
        let parsed = PatchedSpec::parse(&st[1].spec).expect("a spec resolve accepts");
        assert_eq!(parsed.base, "debian:7.3");
        assert_eq!(parsed.patches.len(), 2);
        assert!(parsed.touched().contains("virt/kvm/kvm_main.c"));
        assert_eq!(
            PatchedSpec::parse(&st[0].spec)
                .expect("a spec")
                .patches
                .len(),
            1
        );
        // The same series again: the same files, the same specs (its builds and runs found).
        assert_eq!(s.steps().expect("steps"), st);
    }
}
