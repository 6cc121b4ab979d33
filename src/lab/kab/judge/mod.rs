//! Judging a kab: each metric of each variant, A against B, as far as the accelerator lets it
//! be trusted, corrected over the kab's family; each variant's verdict from its metrics and
//! stalls; and the judgement a kab's gate reads.

use serde::Serialize;

use crate::analysis::calls::{FunctionCalls, never_ran, side_calls};
use crate::analysis::compare::{AbComparison, AbVerdict, ab};
use crate::analysis::direction::{Declared, Direction, change_pct};
use crate::analysis::metric_ab::{
    CountCall, MetricJudgement, NotJudged, RankedCount, Shift, correct_together,
};
use crate::analysis::stall::STALL_JIFFIES;
use crate::analysis::statistics::{median, seed_for};
use crate::analysis::verdict::{self, ALPHA, Class, Undecided};
use crate::record::{Finding, RunRecord, VariantRecord, VariantStatus};
use crate::scenario;
use crate::scenario::runner::DEFAULT_SEED;

use crate::kernel::vm::Accel;
use crate::lab::fidelity::patch::{self};
use crate::record::pooled;

use super::{BootSummary, BusyBoot, GuestFailure};
use hvlab_core::noise::BusyReason;

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
    /// Whether B regressed on it.
    pub regression: bool,
    /// When B looks worse by more than would count, but the rank test cannot tell it from
    /// noise with these samples: what was seen and what would decide it. Never a regression,
    /// never silently "no change" either.
    pub inconclusive: Option<String>,
    /// B is significantly worse, by less than would make it a regression (a jiffies metric
    /// longer by under half a jiffy: an expedited grace period, not a normal one).
    pub cost: bool,
    /// Which way is better and the count tolerance, as its scenario declares them.
    pub declared: Declared,
    /// For a must-equal metric, how far each side's median is from the metric it must
    /// equal (A, B), when the variant has that metric.
    pub off_by: Option<[f64; 2]>,
    /// Whether B is judged better on it, the declared way.
    pub improved: bool,
    /// An exact count that moved by less than its declared tolerance: a change, judged
    /// neither a regression nor an improvement.
    pub within_tolerance: bool,
}

/// How kab judges a metric until its scenario's declaration is read (and a test's metric):
/// lower is better, every change counts.
const LOWER_IS_BETTER: Declared = Declared {
    direction: Direction::LowerIsBetter,
    count_tolerance: 0.0,
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
            inconclusive: &'a Option<String>,
            cost: bool,
            #[serde(skip_serializing_if = "Option::is_none")]
            better: Option<String>,
            #[serde(skip_serializing_if = "Option::is_none")]
            change_pct: Option<String>,
            #[serde(skip_serializing_if = "std::ops::Not::not")]
            within_tolerance: bool,
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
            regression: self.regression,
            inconclusive: &self.inconclusive,
            cost: self.cost,
            better: direction_words(&self.declared),
            // Counts that moved, as LKP prints them.
            change_pct: (self.trust == Trust::Count && self.median[0] != self.median[1])
                .then(|| change_pct(self.median[0], self.median[1]))
                .flatten(),
            within_tolerance: self.within_tolerance,
        }
        .serialize(serializer)
    }
}

/// One variant of one scenario.
#[derive(Debug, Clone, Serialize)]
pub struct VariantAb {
    /// The variant.
    pub variant: String,
    /// Its metrics (none when a side has no samples of it).
    pub metrics: Vec<MetricAb>,
    /// The SRCU stalls either side's runs found, each with the registration behind it.
    pub stalls: Vec<StallAb>,
    /// Why A, and why B, has no samples of it, when a side has none: then nothing is
    /// compared, and the verdict comes from these.
    #[serde(default, skip_serializing_if = "both_ran")]
    pub failures: [Option<SideFailure>; 2],
    /// Calls of the patched functions on A and on B, summed over the side's boots (`None`:
    /// that side counted none).
    #[serde(default, skip_serializing_if = "uncounted")]
    pub calls: [Option<Vec<FunctionCalls>>; 2],
    /// Pages the guest touched per pass on A and on B, when the scenario counts its faults
    /// against them (memory's `FaultsPerPage`): what a fault count's mechanism is read from.
    #[serde(skip)]
    pub pages_touched: [Option<u64>; 2],
}

fn uncounted(calls: &[Option<Vec<FunctionCalls>>; 2]) -> bool {
    calls.iter().all(Option::is_none)
}

/// What would reach patched functions a variant never ran, as the scenario declares it
/// ([`scenario::Reaches`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReachHint {
    /// What reaches them (`the legacy MMU`).
    pub by: String,
    /// The `--kvm-param` that selects it (`kvm.tdp_mmu=N`).
    pub kvm_param: String,
    /// Whether this kab already ran with it (then it did not reach them either).
    pub given: bool,
}

/// The scenario's way to reach the functions `calls` name, when it declares one for any.
fn reach_hint(scenario: &str, calls: &[Option<Vec<FunctionCalls>>; 2]) -> Option<ReachHint> {
    let names: Vec<&str> = calls
        .iter()
        .flatten()
        .flatten()
        .map(|f| f.function.rsplit(':').next().unwrap_or(&f.function))
        .collect();
    scenario::reaches(scenario)
        .iter()
        .find(|r| names.iter().any(|n| r.functions.contains(n)))
        .map(|r| ReachHint {
            by: r.by.to_string(),
            kvm_param: r.kvm_param.to_string(),
            given: false,
        })
}

/// Whether `--kvm-param`s `given` already hold `param` (`kvm.tdp_mmu=N` is given as
/// `kvm.tdp_mmu=0`, `=n` or `=N`, and `kvm-` for `kvm_`).
fn param_given(given: &[String], param: &str) -> bool {
    let norm = |p: &str| -> Option<(String, String)> {
        let (key, value) = p.split_once('=')?;
        let value = match value.to_ascii_lowercase().as_str() {
            "n" | "0" | "false" | "off" => "0".to_string(),
            "y" | "1" | "true" | "on" => "1".to_string(),
            v => v.to_string(),
        };
        Some((key.replace('-', "_"), value))
    };
    let wanted = norm(param);
    wanted.is_some() && given.iter().any(|g| norm(g) == wanted)
}

/// Marks the hints of `verdicts` that this kab's `--kvm-param`s already followed.
pub fn mark_given(verdicts: &mut [VariantVerdict], kvm_params: &[String]) {
    for r in verdicts.iter_mut().filter_map(|v| v.reach.as_mut()) {
        r.given = param_given(kvm_params, &r.kvm_param);
    }
}

/// Why one side of a kab has no samples of a variant.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SideFailure {
    /// It ran and failed in `failed` of the `runs` runs of this side that have it.
    Failed {
        /// The first failure's status (`the dirty log reported 4095 pages in pass 1 of
        /// repetition 1, the guest wrote 4096`).
        why: String,
        /// Runs in which it failed.
        failed: usize,
        /// Runs of this side that have the variant.
        runs: usize,
    },
    /// This side's guest cannot run it (a capability its KVM lacks).
    Unsupported {
        /// Why, as the run recorded it.
        why: String,
    },
    /// No run of this side has it.
    NoRun {
        /// The guest command of its scenario that failed on this side, when one did.
        command: Option<GuestFailure>,
    },
}

impl SideFailure {
    /// Whether this is the side's own failure (it ran and failed, or its command failed
    /// without a run), not a limit of its host or a run that is merely absent.
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            SideFailure::Failed { .. } | SideFailure::NoRun { command: Some(_) }
        )
    }
}

fn both_ran(failures: &[Option<SideFailure>; 2]) -> bool {
    failures.iter().all(Option::is_none)
}

/// One side's share of a stall: repetitions and jiffies.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StallSide {
    /// Repetitions in which the ioctl stalled (summed over the boots where it recurred).
    pub stalled_reps: usize,
    /// Repetitions of the variant on this side.
    pub reps: usize,
    /// The lowest and highest per-boot median excess, in jiffies.
    pub jiffies: [f64; 2],
}

/// An SRCU stall (an ioctl waiting out a grace period another ioctl started), per side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StallAb {
    /// The ioctl that waited.
    pub ioctl: String,
    /// The registration whose grace period it waited for.
    pub cause: String,
    /// On A, when A's runs found it.
    pub a: Option<StallSide>,
    /// On B, when B's runs found it.
    pub b: Option<StallSide>,
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

fn is_time(unit: &str) -> bool {
    matches!(unit, "ns" | "us" | "ms" | "s")
}

/// The SRCU stalls one side's runs found, per (stalled ioctl, registration behind it).
fn stalls_of(
    runs: &[&RunRecord],
    variant: &str,
) -> std::collections::BTreeMap<(String, String), StallSide> {
    let reps: usize = pooled(runs, variant, "stalls").len();
    let mut seen: std::collections::BTreeMap<(String, String), StallSide> =
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
                ..
            } = f
            {
                let cause = caused_by
                    .clone()
                    .unwrap_or_else(|| "an unknown registration".into());
                let e = seen.entry((ioctl.clone(), cause)).or_insert(StallSide {
                    stalled_reps: 0,
                    reps,
                    jiffies: [f64::MAX, f64::MIN],
                });
                e.stalled_reps += stalled_reps;
                e.jiffies = [e.jiffies[0].min(*jiffies), e.jiffies[1].max(*jiffies)];
            }
        }
    }
    seen
}

/// Both sides' stalls, matched by ioctl and cause.
/// One side's calls of `variant`, summed over its runs.
fn calls_of(runs: &[&RunRecord], variant: &str) -> Option<Vec<FunctionCalls>> {
    side_calls(runs.iter().map(|r| r.calls.as_slice()), variant)
}

fn stalls_ab(ra: &[&RunRecord], rb: &[&RunRecord], variant: &str) -> Vec<StallAb> {
    let (mut a, mut b) = (stalls_of(ra, variant), stalls_of(rb, variant));
    let keys: std::collections::BTreeSet<(String, String)> =
        a.keys().chain(b.keys()).cloned().collect();
    keys.into_iter()
        .map(|k| StallAb {
            a: a.remove(&k),
            b: b.remove(&k),
            ioctl: k.0,
            cause: k.1,
        })
        .collect()
}

pub(super) fn of_scenario<'a>(runs: &'a [RunRecord], scenario: &str) -> Vec<&'a RunRecord> {
    runs.iter().filter(|r| r.scenario == scenario).collect()
}

/// What one side's boots brought back: its runs, and the guest commands that did not exit 0.
#[derive(Debug, Clone, Copy)]
pub struct SideRuns<'a> {
    /// The runs.
    pub runs: &'a [RunRecord],
    /// The guest commands that failed.
    pub failed_commands: &'a [GuestFailure],
}

/// The variants of `scenario` a kab judges, none left out: every variant either side's runs
/// have (A's order first), and those asked for (`--variant`, else the scenario's own) that
/// no run has.
fn variant_names(of: &str, asked: &[String], runs: [&[&RunRecord]; 2]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut add = |name: &str| {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    };
    for r in runs.iter().flat_map(|side| side.iter()) {
        for v in &r.variants {
            add(&v.name);
        }
    }
    let own: Vec<&str> = scenario::find(of)
        .map(|info| info.variants.iter().map(|v| v.name).collect())
        .unwrap_or_default();
    if asked.is_empty() {
        // Runs name what ran; with none from either side, what the guests were asked to run.
        if runs.iter().all(|side| side.is_empty()) {
            own.iter().for_each(|v| add(v));
        }
    } else {
        asked
            .iter()
            .filter(|v| own.contains(&v.as_str()))
            .for_each(|v| add(v));
    }
    names
}

/// Whether a guest command was `hvlab run SCENARIO …`.
fn runs_scenario(command: &GuestFailure, scenario: &str) -> bool {
    command.args.first().is_some_and(|a| a == "run")
        && command.args.get(1).is_some_and(|s| s == scenario)
}

/// One side's record of `variant` with samples, or why it has none. A failure in any run
/// of the side is its failure, even beside runs that went well: a dirty log that loses a
/// page in one boot of B loses data.
fn side_variant<'a>(
    runs: &[&'a RunRecord],
    variant: &str,
    scenario: &str,
    failed_commands: &[GuestFailure],
) -> Result<&'a VariantRecord, SideFailure> {
    let records: Vec<&VariantRecord> = runs.iter().filter_map(|r| r.variant(variant)).collect();
    let failed: Vec<&str> = records
        .iter()
        .filter_map(|v| match &v.status {
            VariantStatus::Failed(why) => Some(why.as_str()),
            _ => None,
        })
        .collect();
    if let Some(why) = failed.first() {
        return Err(SideFailure::Failed {
            why: (*why).to_string(),
            failed: failed.len(),
            runs: records.len(),
        });
    }
    if let Some(ok) = records.iter().find(|v| v.is_ok()) {
        return Ok(ok);
    }
    if let Some(VariantStatus::Unsupported(why)) = records.first().map(|v| &v.status) {
        return Err(SideFailure::Unsupported { why: why.clone() });
    }
    Err(SideFailure::NoRun {
        command: failed_commands
            .iter()
            .find(|c| runs_scenario(c, scenario))
            .cloned(),
    })
}

/// Judges B against A, scenario by scenario: every variant either side ran or was asked to
/// run, those a side has no samples of with the reason.
pub fn judge(
    scenarios: &[String],
    asked: &[String],
    sides: [SideRuns<'_>; 2],
    accel: Accel,
    threshold: f64,
) -> Vec<ScenarioAb> {
    let mut out = judge_uncorrected(scenarios, asked, sides, accel, threshold);
    correct_family(&mut out, threshold);
    out
}

/// [`judge`] before the family's correction: for a caller that judges several pairs as one
/// family (a series' commits), each comparison at its own p until [`correct_family`].
pub fn judge_uncorrected(
    scenarios: &[String],
    asked: &[String],
    sides: [SideRuns<'_>; 2],
    accel: Accel,
    threshold: f64,
) -> Vec<ScenarioAb> {
    let mut out = Vec::new();
    for scenario in scenarios {
        let (ra, rb) = (
            of_scenario(sides[0].runs, scenario),
            of_scenario(sides[1].runs, scenario),
        );
        let mut variants = Vec::new();
        for name in variant_names(scenario, asked, [&ra, &rb]) {
            let on_a = side_variant(&ra, &name, scenario, sides[0].failed_commands);
            let on_b = side_variant(&rb, &name, scenario, sides[1].failed_commands);
            let (v, vb) = match (on_a, on_b) {
                (Ok(v), Ok(vb)) => (v, vb),
                (a, b) => {
                    variants.push(VariantAb {
                        calls: [calls_of(&ra, &name), calls_of(&rb, &name)],
                        variant: name,
                        metrics: Vec::new(),
                        stalls: Vec::new(),
                        failures: [a.err(), b.err()],
                        pages_touched: [None, None],
                    });
                    continue;
                }
            };
            let info = scenario::find(scenario).ok();
            let declared = |metric: &str| info.map_or(Declared::UNDECLARED, |i| i.declared(metric));
            let mut metrics = Vec::new();
            for (name, m) in &v.metrics {
                let (xa, xb) = (pooled(&ra, &v.name, name), pooled(&rb, &v.name, name));
                if xa.is_empty() || xb.is_empty() {
                    continue;
                }
                // Events, and events per iteration (the exits scenario's `ratio`s).
                if m.unit == "count" || m.unit == "ratio" {
                    let c = count(name, &m.unit, xa, xb, accel, threshold);
                    metrics.push(declared_as(c, declared(name), threshold));
                    continue;
                }
                if !is_time(&m.unit) {
                    continue;
                }
                // The lifecycle's ioctl times in the guest's jiffies: judged everywhere.
                if scenario == crate::scenario::Kind::Lifecycle.name()
                    && name.starts_with("ioctl.")
                    && m.unit == "ms"
                {
                    let (ja, jb) = (patch::jiffy_ms(&ra), patch::jiffy_ms(&rb));
                    let xa_j: Vec<f64> = xa.iter().map(|x| x / ja).collect();
                    let xb_j: Vec<f64> = xb.iter().map(|x| x / jb).collect();
                    let metric = name.trim_end_matches("_ms").to_string();
                    let m = jiffies_metric(&metric, xa_j, xb_j, threshold);
                    metrics.push(declared_as(m, declared(name), threshold));
                }
                let not_judged = (accel != Accel::Kvm).then_some(NotJudged::TimeUnderTcg);
                let time = rank(name, &m.unit, Trust::Time, xa, xb, threshold, not_judged);
                metrics.push(declared_as(time, declared(name), threshold));
            }
            judge_must_equal(&mut metrics, threshold);
            variants.push(VariantAb {
                variant: v.name.clone(),
                metrics,
                stalls: stalls_ab(&ra, &rb, &v.name),
                failures: [None, None],
                calls: [calls_of(&ra, &v.name), calls_of(&rb, &v.name)],
                pages_touched: [pages_touched(v), pages_touched(vb)],
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

/// `m` judged as its scenario declares it (which way is better, its count tolerance).
fn declared_as(mut m: MetricAb, declared: Declared, threshold: f64) -> MetricAb {
    m.declared = declared;
    settle(&mut m, threshold);
    m
}

/// Judges each must-equal metric of a variant by how far each side is from the metric it
/// must equal: B further off is worse (a page the dirty log lost), nearer is better.
fn judge_must_equal(metrics: &mut [MetricAb], threshold: f64) {
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
fn pages_touched(v: &VariantRecord) -> Option<u64> {
    v.findings.iter().find_map(|f| match f {
        Finding::FaultsPerPage { pages, .. } => Some(*pages),
        _ => None,
    })
}

/// An ioctl's time in jiffies, rank-tested; [`settle`] applies the half-jiffy rule to it.
fn jiffies_metric(metric: &str, xa: Vec<f64>, xb: Vec<f64>, threshold: f64) -> MetricAb {
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
fn count(
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
    let medians = [median(&xa), median(&xb)];
    let call = CountCall::Varies(RankedCount::alone(&xa, &xb, medians));
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
fn exact(name: &str, unit: &str, xa: Vec<f64>, xb: Vec<f64>) -> MetricAb {
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
fn rank(
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
        regression: false,
        inconclusive: None,
        cost: false,
        declared: LOWER_IS_BETTER,
        off_by: None,
        improved: false,
        within_tolerance: false,
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
    m.within_tolerance = (higher || lower) && within_tolerance(m);
    let (worse, better) = if m.within_tolerance {
        (false, false)
    } else {
        match m.declared.direction {
            Direction::LowerIsBetter => (higher, lower),
            Direction::HigherIsBetter => (lower, higher),
            Direction::Neither => (false, false),
            // Off its partner by more on B is worse, whichever way it moved.
            Direction::MustEqual(_) => match m.off_by {
                Some([a, b]) if higher || lower => (b > a, b < a),
                _ => (false, false),
            },
        }
    };
    m.regression = worse;
    m.improved = better;
    m.cost = false;
    let direction = m.declared.direction;
    m.inconclusive = match &m.judgement {
        MetricJudgement::Ranked { comparison } => {
            ranked_unsettled(comparison, threshold, direction)
        }
        MetricJudgement::Count {
            call: CountCall::Varies(r),
        } => count_unsettled(r, m.median, threshold, direction),
        _ => None,
    }
    .map(|(seen, unsettled)| undecided(&seen, &unsettled, &m.samples[0], &m.samples[1]));
    if m.trust == Trust::Jiffies && m.median[1] - m.median[0] < STALL_JIFFIES {
        m.inconclusive = None;
        if m.regression {
            m.regression = false;
            m.cost = true;
        }
    }
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

/// Which way B's median moved when it looks worse: `higher`, or `lower` for a
/// higher-is-better metric.
fn worse_word(direction: Direction) -> &'static str {
    match direction {
        Direction::HigherIsBetter => "lower",
        _ => "higher",
    }
}

/// `p = 0.012`, and when judged with others what the correction made of it.
fn p_words(p: f64, adjusted: f64, together: usize) -> String {
    if together > 1 {
        format!(
            "p = {p:.3}, {adjusted:.3} corrected over the {together} comparisons judged together"
        )
    } else {
        format!("p = {p:.3}")
    }
}

/// What was seen and what is unsettled, when a ranked comparison leaves B's worse look or the
/// level itself undecided.
fn ranked_unsettled(
    c: &AbComparison,
    threshold: f64,
    direction: Direction,
) -> Option<(String, String)> {
    if let Some(Undecided::Unreachable { .. }) = c.undecided {
        return Some(out_of_reach(c.ratio, c.judged_together));
    }
    if c.verdict != AbVerdict::NotDecided || !looks_worse(c.ratio, threshold, direction) {
        return None;
    }
    // B beyond the threshold on the median, yet not significant: too few samples against
    // this much noise (a few emulator hiccups on one side sink a 6-sample rank test).
    Some(if c.p_adjusted < c.alpha {
        (
            format!(
                "B's median is {:.2}× A's and the rank test separates them ({}), but the 95% CI of the ratio ({:.2}–{:.2}) reaches below the +{:.0}% threshold, so",
                c.ratio,
                p_words(c.p_value, c.p_adjusted, c.judged_together),
                c.ci95[0],
                c.ci95[1],
                threshold * 100.0,
            ),
            "the change's size is not established".to_string(),
        )
    } else {
        (
            format!("B's median is {}, but", worse_word(direction)),
            format!(
                "the rank test cannot tell it from noise ({})",
                p_words(c.p_value, c.p_adjusted, c.judged_together)
            ),
        )
    })
}

/// The same for a varying count, whose direction is its medians'.
fn count_unsettled(
    r: &RankedCount,
    [ma, mb]: [f64; 2],
    threshold: f64,
    direction: Direction,
) -> Option<(String, String)> {
    match r.shift {
        Shift::OutOfReach { .. } => Some(out_of_reach(mb / ma, r.judged_together)),
        Shift::NotSignificant if looks_worse(mb / ma, threshold, direction) => Some((
            format!("B's median is {}, but", worse_word(direction)),
            format!(
                "the rank test cannot tell it from noise ({})",
                p_words(r.p_value, r.p_adjusted, r.judged_together)
            ),
        )),
        _ => None,
    }
}

/// A comparison no arrangement of whose samples could be called at the level, corrected over
/// the `together` comparisons judged with it.
fn out_of_reach(ratio: f64, together: usize) -> (String, String) {
    (
        format!("B's median is {ratio:.2}× A's, but"),
        format!(
            "no difference can reach p < {ALPHA} once corrected over the {together} comparisons judged together"
        ),
    )
}

/// Corrects every comparison of a kab together (Holm over every ranked jiffies and time
/// comparison and every varying count's rank p, across all its scenarios, variants and
/// metrics: a kab of 6 variants × 12 metrics judged each at p < 0.05 alone calls a change in
/// most A/A kabs), then settles each metric again from its corrected call. Exact counts and
/// the variants a side failed are outside the family.
pub fn correct_family(judged: &mut [ScenarioAb], threshold: f64) {
    let mut members: Vec<(&mut MetricJudgement, [f64; 2])> = judged
        .iter_mut()
        .flat_map(|s| s.variants.iter_mut())
        .flat_map(|v| v.metrics.iter_mut())
        .map(|m| {
            let medians = m.median;
            (&mut m.judgement, medians)
        })
        .collect();
    correct_together(&mut members);
    for m in judged
        .iter_mut()
        .flat_map(|s| s.variants.iter_mut())
        .flat_map(|v| v.metrics.iter_mut())
    {
        settle(m, threshold);
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

/// A class as kab's JSON spells it: the printed word (`NO CHANGE`).
fn class_word<S: serde::Serializer>(class: &Class, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(class.word())
}

/// A judged metric that moved: medians in its judged unit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// The metric.
    pub metric: String,
    /// `jiffies`, `count`, or a time unit.
    pub unit: String,
    /// A's median.
    pub a: f64,
    /// B's median.
    pub b: f64,
    /// By less than half a jiffy: no grace period gained or lost.
    pub within_jiffy: bool,
    /// The scenario does not declare the metric: it was judged lower-is-better.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub undeclared: bool,
    /// An exact count's declared tolerance, when it moved by less (a change, not a verdict).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerance: Option<f64>,
}

/// Why a variant moved, as data (the renderers word it): what the scenario attributes the
/// change to.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Cause {
    /// An ioctl waits for a different SRCU grace period on B than on A.
    GracePeriod {
        /// The ioctl (`KVM_SET_USER_MEMORY_REGION`).
        ioctl: String,
        /// What it waited for on A and on B.
        waits: [GraceWait; 2],
    },
    /// The stage-2 faults moved as the pages each fault maps did (SPTE prefetch): pages
    /// touched over `kvm.vcpu.pf_fixed`, per side.
    PagesPerFault {
        /// Pages the guest touched per pass, A and B.
        pages: [u64; 2],
        /// `kvm.vcpu.pf_fixed` per pass (median), A and B.
        faults: [f64; 2],
    },
}

/// What an ioctl's time says it waited for, by the stall rule: half a jiffy or more is a
/// normal grace period waited out (it ends on a tick); less is at most an expedited one.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "grace_period", rename_all = "kebab-case")]
pub enum GraceWait {
    /// Under half a jiffy: no normal grace period, at most an expedited one.
    Expedited {
        /// The ioctl's median, in jiffies.
        jiffies: f64,
    },
    /// Half a jiffy or more: a normal grace period.
    Normal {
        /// The ioctl's median, in jiffies.
        jiffies: f64,
        /// The registration whose grace period it was, when the side's stall records name it.
        #[serde(skip_serializing_if = "Option::is_none")]
        started_by: Option<String>,
    },
}

impl GraceWait {
    /// The ioctl's median, in jiffies.
    pub fn jiffies(&self) -> f64 {
        match self {
            GraceWait::Expedited { jiffies } | GraceWait::Normal { jiffies, .. } => *jiffies,
        }
    }
}

/// Repetitions with at least one SRCU stall, per side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StallReps {
    /// Repetitions with a stall.
    pub stalled: usize,
    /// Repetitions.
    pub reps: usize,
}

/// One variant's verdict, with its mechanism as data.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VariantVerdict {
    /// The scenario.
    pub scenario: String,
    /// The variant.
    pub variant: String,
    /// The class: FIXED, IMPROVED, REGRESSED, NO CHANGE, NOT DECIDED or NOT EXERCISED.
    #[serde(serialize_with = "class_word")]
    pub class: Class,
    /// Repetitions with a stall on A and on B (the `stalls` count), when the scenario counts them.
    pub stall_reps: Option<[StallReps; 2]>,
    /// The stalls, matched across sides.
    pub stalls: Vec<StallAb>,
    /// Judged metrics B is worse on.
    pub regressions: Vec<Change>,
    /// Judged metrics B is better on.
    pub improvements: Vec<Change>,
    /// Judged metrics B is significantly worse on by less than a regression (within a jiffy).
    pub costs: Vec<Change>,
    /// Metrics B looks worse on that the samples cannot settle.
    pub undecided: Vec<String>,
    /// Exact counts that moved by less than their declared tolerance: changes, judged
    /// neither way.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub changes: Vec<Change>,
    /// What the scenario attributes the regressions and improvements to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<Cause>,
    /// Why nothing was judged: the boots the host was busy during (then the class is NOT
    /// DECIDED, whatever the samples say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_busy: Option<Vec<BusyBoot>>,
    /// Why A, and why B, has no samples of the variant, when a side has none: B failing
    /// what A ran is REGRESSED; anything else without samples on both sides is NOT DECIDED.
    #[serde(default, skip_serializing_if = "both_ran")]
    pub failures: [Option<SideFailure>; 2],
    /// Calls of the patched functions on A and on B, when counted: all 0 on both sides makes
    /// the variant NOT EXERCISED.
    #[serde(default, skip_serializing_if = "uncounted")]
    pub calls: [Option<Vec<FunctionCalls>>; 2],
    /// What would reach the patched functions, when NOT EXERCISED and the scenario knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reach: Option<ReachHint>,
}

fn change(m: &MetricAb, within_jiffy: bool) -> Change {
    Change {
        metric: m.metric.clone(),
        unit: m.unit.clone(),
        a: m.median[0],
        b: m.median[1],
        within_jiffy,
        undeclared: !m.declared.declared,
        tolerance: m.within_tolerance.then_some(m.declared.count_tolerance),
    }
}

/// Whether B is judged better on `m` (the declared way), and whether by under half a jiffy.
fn better(m: &MetricAb) -> Option<bool> {
    m.improved
        .then(|| m.trust == Trust::Jiffies && m.median[0] - m.median[1] < STALL_JIFFIES)
}

/// What one side's ioctl waited for: its median in jiffies, by the stall rule, and the
/// registration the side's stall records name for it.
fn wait(ioctl: &str, jiffies: f64, stall: Option<&StallAb>, on_b: bool) -> GraceWait {
    if jiffies < STALL_JIFFIES {
        return GraceWait::Expedited { jiffies };
    }
    let recorded = stall.filter(|s| if on_b { s.b.is_some() } else { s.a.is_some() });
    GraceWait::Normal {
        jiffies,
        started_by: recorded
            .filter(|s| s.ioctl == ioctl)
            .map(|s| s.cause.clone()),
    }
}

/// The causes of a variant's judged changes: for each ioctl whose jiffies moved by a grace
/// period (or that gained or lost a stall), what it waited for on each side; for a fault
/// count that moved, the pages each fault mapped per side.
fn causes(v: &VariantAb, moved: &[&Change]) -> Vec<Cause> {
    let mut out = Vec::new();
    let mut ioctls: Vec<String> = moved
        .iter()
        .filter(|c| c.unit == "jiffies" && !c.within_jiffy)
        .map(|c| c.metric.trim_start_matches("ioctl.").to_string())
        .collect();
    for s in v.stalls.iter().filter(|s| s.a.is_some() != s.b.is_some()) {
        if !ioctls.contains(&s.ioctl) {
            ioctls.push(s.ioctl.clone());
        }
    }
    for ioctl in ioctls {
        let metric = format!("ioctl.{ioctl}");
        let stall = v.stalls.iter().find(|s| s.ioctl == ioctl);
        // The ioctl's jiffies when measured, else the stall records' excess.
        let jiffies = v
            .metrics
            .iter()
            .find(|m| m.metric == metric && m.trust == Trust::Jiffies)
            .map(|m| m.median)
            .or_else(|| {
                stall.map(|s| {
                    let side = |x: &Option<StallSide>| x.as_ref().map_or(0.0, |x| x.jiffies[1]);
                    [side(&s.a), side(&s.b)]
                })
            });
        if let Some([a, b]) = jiffies {
            out.push(Cause::GracePeriod {
                waits: [wait(&ioctl, a, stall, false), wait(&ioctl, b, stall, true)],
                ioctl,
            });
        }
    }
    if let (Some(c), [Some(pa), Some(pb)]) = (
        moved.iter().find(|c| c.metric == "kvm.vcpu.pf_fixed"),
        v.pages_touched,
    ) {
        out.push(Cause::PagesPerFault {
            pages: [pa, pb],
            faults: [c.a, c.b],
        });
    }
    out
}

/// The verdict of a variant a side has no samples of: REGRESSED when B failed what A ran
/// (it failed, or its command failed without a run), otherwise NOT DECIDED (both failed, A
/// failed, or a side could not run it or brought no run back), each side's reason kept.
fn failed_verdict(scenario: &str, v: &VariantAb) -> VariantVerdict {
    let class = match &v.failures {
        [None, Some(b)] if b.is_failure() => Class::Regressed,
        _ => Class::NotDecided,
    };
    VariantVerdict {
        scenario: scenario.to_string(),
        variant: v.variant.clone(),
        class,
        stall_reps: None,
        stalls: Vec::new(),
        regressions: Vec::new(),
        improvements: Vec::new(),
        costs: Vec::new(),
        undecided: Vec::new(),
        changes: Vec::new(),
        causes: Vec::new(),
        host_busy: None,
        failures: v.failures.clone(),
        calls: v.calls.clone(),
        reach: None,
    }
}

/// The verdict of one variant: the class, and the stalls and metrics behind it.
pub fn verdict(scenario: &str, v: &VariantAb) -> VariantVerdict {
    if !both_ran(&v.failures) {
        return failed_verdict(scenario, v);
    }
    let stall_metric = v.metrics.iter().find(|m| m.metric == "stalls");
    let stall_reps = stall_metric.map(|m| {
        let side = |i: usize| StallReps {
            stalled: m.samples[i].iter().filter(|x| **x > 0.0).count(),
            reps: m.samples[i].len(),
        };
        [side(0), side(1)]
    });
    let regressions: Vec<Change> = v
        .metrics
        .iter()
        .filter(|m| m.regression)
        .map(|m| change(m, false))
        .collect();
    let costs: Vec<Change> = v
        .metrics
        .iter()
        .filter(|m| m.cost)
        .map(|m| change(m, true))
        .collect();
    let improvements: Vec<Change> = v
        .metrics
        .iter()
        .filter_map(|m| better(m).map(|within| change(m, within)))
        .collect();
    let mut undecided: Vec<String> = v
        .metrics
        .iter()
        .filter(|m| m.inconclusive.is_some())
        .map(|m| m.metric.clone())
        .collect();
    let changes: Vec<Change> = v
        .metrics
        .iter()
        .filter(|m| m.within_tolerance)
        .map(|m| change(m, false))
        .collect();
    let moved: Vec<&Change> = regressions.iter().chain(&improvements).collect();
    let causes = causes(v, &moved);
    let gained = v.stalls.iter().any(|s| s.a.is_none() && s.b.is_some());
    let on_b = v.stalls.iter().any(|s| s.b.is_some());
    let gone = v.stalls.iter().any(|s| s.a.is_some() && s.b.is_none());
    let stalls_judged_lower = stall_metric.is_some_and(|m| m.judgement.lower());
    let stalls_judged_higher = stall_metric.is_some_and(|m| m.judgement.higher());
    // Fixed: a stall that recurred on A recurs on B no more, and the stall count says so
    // beyond noise (an emulator's hiccup can still make one repetition of B look stalled).
    // Without recurring stalls to match, B must never stall.
    let stalls_gone = if gone {
        !on_b
    } else {
        stall_reps.is_some_and(|[a, b]| a.stalled > 0 && b.stalled == 0)
    };
    // A stall B gained regresses it only as its stall count does: higher beyond chance in the
    // family judged together (then `stalls` is among the regressions). A stall recurring in one
    // boot of B, not in A, is what an emulator's pause can make: B looks worse, not decided.
    let unsettled_stall =
        (stalls_gone && !stalls_judged_lower) || (gained && !stalls_judged_higher);
    if unsettled_stall && !undecided.iter().any(|m| m == "stalls") {
        undecided.push("stalls".into());
    }
    // The patched code never ran on either kernel: nothing here can be the patch's doing.
    let not_exercised = never_ran([v.calls[0].as_deref(), v.calls[1].as_deref()]);
    let class = if not_exercised {
        Class::NotExercised
    } else if !regressions.is_empty() {
        Class::Regressed
    } else if stalls_gone && stalls_judged_lower {
        Class::Fixed
    } else if improvements.iter().any(|c| !c.within_jiffy) {
        Class::Improved
    } else if !undecided.is_empty() {
        Class::NotDecided
    } else {
        Class::NoChange
    };
    VariantVerdict {
        scenario: scenario.to_string(),
        variant: v.variant.clone(),
        class,
        stall_reps,
        stalls: v.stalls.clone(),
        regressions,
        improvements,
        costs,
        undecided,
        changes,
        causes,
        host_busy: None,
        failures: [None, None],
        calls: v.calls.clone(),
        reach: not_exercised
            .then(|| reach_hint(scenario, &v.calls))
            .flatten(),
    }
}

/// Not judged: the host was busy during the `busy` boots. Under TCG every time is
/// the emulator's, and a boot whose QEMU waited for a CPU is slowed as a whole: its
/// repetitions share the slowdown, so the rank test across them would take it for the
/// kernel's (a saturated host made qemu-order's KVM_CREATE_VM 0.20 → 0.82 jiffies, REGRESSED).
/// Stalls are found by their length, so their counts are no safer, and neither is a FIXED.
/// A variant a side has no samples of keeps its verdict: a failure (a page the dirty log lost)
/// is the kernel's answer, not a time a starved emulator stretched.
/// Neither is a NOT EXERCISED: its calls are counts of code that never ran, whatever the time.
pub(crate) fn not_judged_on_a_busy_host(v: &mut VariantVerdict, busy: &[BusyBoot]) {
    if !both_ran(&v.failures) || v.class == Class::NotExercised {
        return;
    }
    v.class = Class::NotDecided;
    v.host_busy = Some(busy.to_vec());
    // The judgments go with the class; the samples stay in the per-metric details.
    v.regressions.clear();
    v.improvements.clear();
    v.costs.clear();
}

/// The boots the host was busy during, none when it was quiet during all.
pub(super) fn host_busy_during(boots: &[BootSummary]) -> Vec<BusyBoot> {
    boots
        .iter()
        .enumerate()
        .filter_map(|(i, b)| {
            Some(BusyBoot {
                boot: i + 1,
                side: b.side.clone(),
                reasons: b.host_busy.clone()?,
            })
        })
        .collect()
}

/// Why a boot's times cannot be judged, when they cannot: other work kept tasks waiting for a
/// CPU (PSI) or a hypervisor below took time (steal). The load and the runnable count are not
/// asked: QEMU's single TCG thread beside one busy loop on two cores keeps a CPU of its own
/// (pressure 2% here), while two busy loops starve it (49%).
pub(crate) fn busy_during_boot(noise: &hvlab_core::noise::Noise) -> Option<Vec<BusyReason>> {
    let reasons: Vec<BusyReason> = noise
        .busy
        .iter()
        .copied()
        .filter(|r| matches!(r, BusyReason::Pressure { .. } | BusyReason::Steal { .. }))
        .collect();
    (!reasons.is_empty()).then_some(reasons)
}

/// Whether the variant's class rests on counts alone: every metric it judged is a count each
/// side repeated exactly (`pf_fixed` 512 on every repetition of A, 4097 on every one of B;
/// times shown but not judged, as under TCG), and no stall was seen. Such a count is the
/// kernel's arithmetic, not a time: a host busy enough to stretch every time cannot make the
/// MMU map 1 page per fault instead of 8, nor hide a change in a time nobody judged, so the
/// verdict stands. A stall count is found by a time's length and does not qualify.
fn decided_by_exact_counts(v: &VariantAb) -> bool {
    let judged: Vec<&MetricAb> = v
        .metrics
        .iter()
        .filter(|m| !matches!(m.judgement, MetricJudgement::NotJudged { .. }))
        .collect();
    let exact = |m: &MetricAb| {
        m.metric != "stalls"
            && matches!(
                m.judgement,
                MetricJudgement::Count {
                    call: CountCall::Same | CountCall::Higher | CountCall::Lower
                }
            )
    };
    !judged.is_empty() && judged.iter().all(|m| exact(m)) && v.stalls.is_empty()
}

/// Every variant's verdict, in the order judged.
pub fn verdicts(judged: &[ScenarioAb]) -> Vec<VariantVerdict> {
    judged
        .iter()
        .flat_map(|s| s.variants.iter().map(|v| verdict(&s.scenario, v)))
        .collect()
}

/// A kab's verdicts as printed, and what its gate reads from them.
#[derive(Debug, Clone, PartialEq)]
pub struct Judgement {
    /// Every variant's verdict, after the boots' host busyness.
    pub verdicts: Vec<VariantVerdict>,
    /// Whether any printed class is REGRESSED (`--fail-on-regression`).
    pub regression: bool,
    /// Judged metrics the samples could not settle.
    pub inconclusive: usize,
}

/// The verdicts of `judged` with the `boots` they came from (a busy boot leaves the
/// comparisons NOT DECIDED), and the gate decided once, from the classes: REGRESSED printed
/// is exactly what fails `--fail-on-regression`, a stall B gained as much as a worse metric.
pub fn judgement(judged: &[ScenarioAb], boots: &[BootSummary]) -> Judgement {
    let mut verdicts = verdicts(judged);
    let busy = host_busy_during(boots);
    if !busy.is_empty() {
        let variants = judged.iter().flat_map(|s| &s.variants);
        for (v, ab) in verdicts.iter_mut().zip(variants) {
            if !decided_by_exact_counts(ab) {
                not_judged_on_a_busy_host(v, &busy);
            }
        }
    }
    let regression = verdicts.iter().any(|v| v.class == Class::Regressed);
    let inconclusive = judged
        .iter()
        .flat_map(|s| &s.variants)
        .flat_map(|v| &v.metrics)
        .filter(|m| m.inconclusive.is_some())
        .count();
    Judgement {
        verdicts,
        regression,
        inconclusive,
    }
}

#[cfg(test)]
mod tests;
