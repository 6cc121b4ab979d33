//! `hvlab kab A B`: a kernel A/B. Boots A and B alternately (ABBA over `--boots`), runs the
//! scenarios in each, and judges each metric as far as the accelerator lets it be trusted:
//!
//! - counts (KVM statistics, stalls, faults, exits): exact when each side repeats one value
//!   (a regression when B's is higher); rank-tested when they vary between repetitions;
//! - jiffies (the lifecycle ioctls' time in jiffies of the guest's HZ: a grace-period wait is
//!   a whole number of ticks, which an emulator stretches but does not invent): the rank test
//!   of [`crate::analysis::compare::ab`];
//! - times: judged with that test only under `kvm` acceleration; under TCG every guest
//!   instruction is emulated, so they are shown and not judged.
//!
//! Every rank test of one kab (jiffies, times, varying counts, across all its scenarios and
//! variants) is corrected together with Holm before anything is called, as the suite and
//! `compare` correct theirs: dozens of comparisons each at p < 0.05 alone call a change in
//! most A/A kabs. A stall B gained regresses it only as its stall count does.

//!
//! [`run`] is the whole A/B as a library function (after Firecracker's `git_ab_test`): it
//! resolves and builds both kernels, boots them in ABBA order, stores their runs and returns
//! a [`KabOutcome`]; the command line only renders it.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use crate::analysis::compare::{AbComparison, AbVerdict, ab};
use crate::analysis::metric_ab::{
    CountCall, MetricJudgement, NotJudged, RankedCount, Shift, correct_together,
};
use crate::analysis::stall::STALL_JIFFIES;
use crate::analysis::statistics::{median, seed_for};
use crate::analysis::verdict::{self, ALPHA, Class, Undecided};
use crate::error::{Error, InputError};
use crate::kernel::build::{self, BuildInfo, BuildProgress, Step};
use crate::kernel::vm::{self, AccelChoice, VmConfig, VmError};
use crate::kernel::{self, Kernel};
use crate::record::{Finding, RunRecord, VariantRecord, VariantStatus};
use crate::scenario;
use crate::scenario::runner::DEFAULT_SEED;
use crate::store::Store;

use crate::kernel::calibration::{self, Identity};
use crate::kernel::vm::Accel;
use crate::lab::fidelity::patch::{self, PatchRow, StrategyChoice, Wait};
use crate::lab::fidelity::srcu::{OnReportersHost, on_reporters_host};
use crate::record::pooled;
use hvlab_core::host::{KabSide, PatchId};

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

/// Which side a boot is.
pub fn abba(boots_per_side: u32) -> Vec<usize> {
    (0..boots_per_side * 2)
        .map(|i| usize::from(matches!(i % 4, 1 | 2)))
        .collect()
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

fn of_scenario<'a>(runs: &'a [RunRecord], scenario: &str) -> Vec<&'a RunRecord> {
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
            let v = match (on_a, on_b) {
                (Ok(v), Ok(_)) => v,
                (a, b) => {
                    variants.push(VariantAb {
                        variant: name,
                        metrics: Vec::new(),
                        stalls: Vec::new(),
                        failures: [a.err(), b.err()],
                    });
                    continue;
                }
            };
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
                if scenario == crate::scenario::Kind::Lifecycle.name()
                    && name.starts_with("ioctl.")
                    && m.unit == "ms"
                {
                    let (ja, jb) = (patch::jiffy_ms(&ra), patch::jiffy_ms(&rb));
                    let xa_j: Vec<f64> = xa.iter().map(|x| x / ja).collect();
                    let xb_j: Vec<f64> = xb.iter().map(|x| x / jb).collect();
                    let metric = name.trim_end_matches("_ms").to_string();
                    let m = jiffies_metric(&metric, xa_j, xb_j, threshold);
                    metrics.push(m);
                }
                let not_judged = (accel != Accel::Kvm).then_some(NotJudged::TimeUnderTcg);
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
            variants.push(VariantAb {
                variant: v.name.clone(),
                metrics,
                stalls: stalls_ab(&ra, &rb, &v.name),
                failures: [None, None],
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
    m.regression = m.judgement.higher();
    m.cost = false;
    m.inconclusive = match &m.judgement {
        MetricJudgement::Ranked { comparison } => ranked_unsettled(comparison, threshold),
        MetricJudgement::Count {
            call: CountCall::Varies(r),
        } => count_unsettled(r, m.median, threshold),
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
fn ranked_unsettled(c: &AbComparison, threshold: f64) -> Option<(String, String)> {
    if let Some(Undecided::Unreachable { .. }) = c.undecided {
        return Some(out_of_reach(c.ratio, c.judged_together));
    }
    if c.verdict != AbVerdict::NotDecided || c.ratio <= 1.0 + threshold {
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
            "B's median is higher, but".to_string(),
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
) -> Option<(String, String)> {
    match r.shift {
        Shift::OutOfReach { .. } => Some(out_of_reach(mb / ma, r.judged_together)),
        Shift::NotSignificant if mb > ma * (1.0 + threshold) => Some((
            "B's median is higher, but".to_string(),
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
    /// The class: FIXED, IMPROVED, REGRESSED, NO CHANGE or NOT DECIDED.
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
    /// Why nothing was judged: the boots the host was busy during (then the class is NOT
    /// DECIDED, whatever the samples say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_busy: Option<String>,
    /// Why A, and why B, has no samples of the variant, when a side has none: B failing
    /// what A ran is REGRESSED; anything else without samples on both sides is NOT DECIDED.
    #[serde(default, skip_serializing_if = "both_ran")]
    pub failures: [Option<SideFailure>; 2],
}

fn change(m: &MetricAb, within_jiffy: bool) -> Change {
    Change {
        metric: m.metric.clone(),
        unit: m.unit.clone(),
        a: m.median[0],
        b: m.median[1],
        within_jiffy,
    }
}

/// Whether B is judged better on `m`, and whether by under half a jiffy.
fn better(m: &MetricAb) -> Option<bool> {
    m.judgement
        .lower()
        .then(|| m.trust == Trust::Jiffies && m.median[0] - m.median[1] < STALL_JIFFIES)
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
        host_busy: None,
        failures: v.failures.clone(),
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
    let class = if !regressions.is_empty() {
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
        host_busy: None,
        failures: [None, None],
    }
}

/// Not judged: the host was busy during `busy` (the boots, in words). Under TCG every time is
/// the emulator's, and a boot whose QEMU waited for a CPU is slowed as a whole: its
/// repetitions share the slowdown, so the rank test across them would take it for the
/// kernel's (a saturated host made qemu-order's KVM_CREATE_VM 0.20 → 0.82 jiffies, REGRESSED).
/// Stalls are found by their length, so their counts are no safer, and neither is a FIXED.
/// A variant a side has no samples of keeps its verdict: a failure (a page the dirty log lost)
/// is the kernel's answer, not a time a starved emulator stretched.
pub(crate) fn not_judged_on_a_busy_host(v: &mut VariantVerdict, busy: &str) {
    if !both_ran(&v.failures) {
        return;
    }
    v.class = Class::NotDecided;
    v.host_busy = Some(busy.to_string());
    // The judgments go with the class; the samples stay in the per-metric details.
    v.regressions.clear();
    v.improvements.clear();
    v.costs.clear();
}

/// The boots the host was busy during, in words (`boot 2 (B): tasks waited for a CPU 49% of
/// the time`), or `None` when it was quiet during all.
fn host_busy_during(boots: &[BootSummary]) -> Option<String> {
    let busy: Vec<String> = boots
        .iter()
        .enumerate()
        .filter_map(|(i, b)| {
            let why = b.host_busy.as_ref()?;
            Some(format!("boot {} ({}): {why}", i + 1, b.side))
        })
        .collect();
    (!busy.is_empty()).then(|| busy.join("; "))
}

/// Why a boot's times cannot be judged, when they cannot: other work kept tasks waiting for a
/// CPU (PSI) or a hypervisor below took time (steal). The load and the runnable count are not
/// asked: QEMU's single TCG thread beside one busy loop on two cores keeps a CPU of its own
/// (pressure 2% here), while two busy loops starve it (49%).
pub(crate) fn busy_during_boot(noise: &hvlab_core::noise::Noise) -> Option<String> {
    use hvlab_core::noise::BusyReason;
    let reasons: Vec<BusyReason> = noise
        .busy
        .iter()
        .copied()
        .filter(|r| matches!(r, BusyReason::Pressure { .. } | BusyReason::Steal { .. }))
        .collect();
    (!reasons.is_empty()).then(|| crate::analysis::words::busy_words(&reasons))
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
    if let Some(busy) = host_busy_during(boots) {
        for v in &mut verdicts {
            not_judged_on_a_busy_host(v, &busy);
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

/// What `hvlab kab` compares, and how.
#[derive(Debug, Clone)]
pub struct KabRequest {
    /// A: a kernel spec, `SPEC[+PATCH...]`.
    pub base: String,
    /// B.
    pub patched: String,
    /// Scenarios (default `lifecycle`).
    pub scenarios: Vec<String>,
    /// Variants to run (all when empty).
    pub variants: Vec<String>,
    /// `--set key=value` for the scenarios that have the key.
    pub sets: Vec<String>,
    /// Boots per kernel.
    pub boots: u32,
    /// Repetitions per variant per boot.
    pub reps: u32,
    /// Smallest change that counts for judged jiffies and times (0.05 = 5%).
    pub threshold: f64,
    /// How each VM boots.
    pub vm: VmConfig,
    /// The model's strategy for B's change (`always-defer`, `always-sync`, `lifecycle-keyed`),
    /// when the patch is not one the model recognises by its hash.
    pub model_strategy: Option<String>,
    /// Calibrate the base in its first boot when no profile of it is cached, so the model
    /// can predict the change on this host (about 10 s under TCG, once per kernel).
    pub calibrate: bool,
    /// Whether kernel builds must run sandboxed (`--no-sandbox` turns it off).
    pub sandbox: crate::kernel::sandbox::SandboxPolicy,
}

/// Where a kab's progress goes (building is reported through [`BuildProgress`]).
pub trait KabProgress: BuildProgress {
    /// Both kernels are ready: what they are and how the VMs run.
    fn kernels(&self, kernels: &[Kernel; 2], notes: &[String], accel: &AccelChoice);
    /// Boot `n` of `total` starts.
    fn boot_start(&self, n: usize, total: usize, side: &str, kernel: &Kernel);
    /// It ended.
    fn boot_end(&self, boot: &BootSummary);
    /// Something the user should know as it happens (a calibration kept, or not).
    fn note(&self, text: &str);
}

/// A guest command that did not exit 0.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GuestFailure {
    /// hvlab's arguments in the guest.
    pub args: Vec<String>,
    /// Its exit code.
    pub rc: Option<i32>,
    /// What it printed on stderr.
    pub stderr: String,
}

/// One boot.
#[derive(Debug, Clone, Serialize)]
pub struct BootSummary {
    /// `A` or `B`.
    pub side: String,
    /// `uname -r` in the guest.
    pub release: String,
    /// Seconds to the first hvlab command.
    pub to_first_command_s: Option<f64>,
    /// Seconds QEMU ran.
    pub wall_s: f64,
    /// The serial log.
    pub console: PathBuf,
    /// Runs brought back.
    pub runs: usize,
    /// Of those, new to the store.
    pub stored: usize,
    /// Where they were stored.
    pub store: String,
    /// Guest commands that failed.
    pub failures: Vec<GuestFailure>,
    /// What kept this boot's QEMU waiting for a CPU, when anything did (see
    /// [`busy_during_boot`]).
    pub host_busy: Option<String>,
}

/// This host, as the cover letter names it.
#[derive(Debug, Clone, Serialize)]
pub struct HostSummary {
    /// `uname -r`.
    pub kernel: String,
    /// CPU model.
    pub cpu: String,
    /// Online CPUs.
    pub cores: usize,
    /// The hypervisor this host runs under, when any.
    pub hypervisor: Option<String>,
}

/// Wall times of a kab.
#[derive(Debug, Clone, Serialize)]
pub struct WallTimes {
    /// Resolving, fetching and building the kernels.
    pub build_s: f64,
    /// The boots.
    pub boots_s: f64,
    /// All of it.
    pub total_s: f64,
}

/// Everything a kab found: both kernels and how they were made, the boots, the per-metric
/// comparison and the per-variant verdicts. `--json` prints it as is.
#[derive(Debug, Clone, Serialize)]
pub struct KabOutcome {
    /// hvlab's version and git revision.
    pub hvlab_version: String,
    /// Kernel A.
    pub a: Kernel,
    /// Kernel B.
    pub b: Kernel,
    /// How A and B were built (`None`: used as given).
    pub builds: [Option<BuildInfo>; 2],
    /// Steps the builds shared (fetching, unpacking and preparing the source).
    pub build_steps: Vec<Step>,
    /// What the reader must know about the pair (`they differ by the patch alone`).
    pub notes: Vec<String>,
    /// The accelerator.
    pub accel: AccelChoice,
    /// This host.
    pub host: HostSummary,
    /// Scenarios run.
    pub scenario_names: Vec<String>,
    /// Boots per kernel and repetitions per boot.
    pub boots_per_side: u32,
    /// Repetitions per variant per boot.
    pub reps: u32,
    /// The boots, in order.
    pub boots: Vec<BootSummary>,
    /// The per-metric comparison.
    pub scenarios: Vec<ScenarioAb>,
    /// The per-variant verdicts.
    pub verdicts: Vec<VariantVerdict>,
    /// Whether any verdict is REGRESSED (a judged metric worse, a stall gained, or a
    /// variant A ran that B failed): what `--fail-on-regression` reads.
    pub regression: bool,
    /// Judged metrics the samples could not settle.
    pub inconclusive: usize,
    /// Wall times.
    pub wall: WallTimes,
    /// Seconds in all (kept for older readers of the JSON).
    pub wall_s: f64,
    /// The model's prediction of the same change (lifecycle only): predicted, never measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction: Option<KabPrediction>,
}

/// The model's prediction of the change a kab measured: on this host under the same
/// accelerator (priced by the base kernel calibrated in its own guest), and on the host where
/// the thread behind the strategy saw the bug. Every figure here is predicted, none measured.
#[derive(Debug, Clone, Serialize)]
pub struct KabPrediction {
    /// `predicted`.
    pub label: &'static str,
    /// The model's strategy for A and for B, when the model knows the kernel.
    pub strategies: [Option<StrategyChoice>; 2],
    /// Why a side's kernel is not one the model knows (then nothing is predicted).
    pub unknown: Vec<String>,
    /// On this host, under this accelerator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub this_host: Option<ThisHostPrediction>,
    /// Why there is no prediction for this host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub this_host_missing: Option<String>,
    /// On the reporter's host: A's strategy, then B's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reporters_host: Option<[OnReportersHost; 2]>,
}

/// The prediction on this host.
#[derive(Debug, Clone, Serialize)]
pub struct ThisHostPrediction {
    /// The calibrated profile's name.
    pub profile: String,
    /// Its file.
    pub profile_path: PathBuf,
    /// Calibrated in this kab's first boot (else taken from the cache).
    pub calibrated_now: bool,
    /// Variant by variant, A's strategy against B's.
    pub variants: Vec<VariantPrediction>,
    /// Each side's prediction against its measurement (`hvlab fidelity`'s rows for this kab).
    pub rows: [Vec<PatchRow>; 2],
}

/// One variant as the model predicts it on both kernels.
#[derive(Debug, Clone, Serialize)]
pub struct VariantPrediction {
    /// The variant.
    pub variant: String,
    /// Stalls per VM built (medians), A and B.
    pub stalls: [f64; 2],
    /// The waits the model predicts on either kernel, with the waiting ioctl in jiffies.
    pub waits: Vec<PredictedWait>,
    /// Whether each side's prediction agrees with what was measured (its row within).
    pub agrees: [Option<bool>; 2],
}

/// An ioctl the model has waiting for another's grace period on A, B or both.
#[derive(Debug, Clone, Serialize)]
pub struct PredictedWait {
    /// The ioctl that waits.
    pub ioctl: String,
    /// The registration it waits for.
    pub on: String,
    /// On which side the model has it wait.
    pub sides: [bool; 2],
    /// The waiting ioctl's median time in jiffies, A and B.
    pub jiffies: [f64; 2],
}

impl KabOutcome {
    /// The verdict of `variant` (in any scenario).
    pub fn verdict_of(&self, variant: &str) -> Option<&VariantVerdict> {
        self.verdicts.iter().find(|v| v.variant == variant)
    }

    /// The boots the host was busy during, in words, when any (then nothing was judged).
    pub fn host_busy(&self) -> Option<String> {
        host_busy_during(&self.boots)
    }
}

/// The hvlab command each boot runs, per scenario; `--variant` and `--set` go to the
/// scenarios that have them, and each must fit at least one.
pub(crate) fn guest_commands(req: &KabRequest) -> Result<Vec<Vec<String>>, Error> {
    let infos = req
        .scenarios
        .iter()
        .map(|s| scenario::find(s))
        .collect::<Result<Vec<_>, _>>()?;
    let key_of = |kv: &str| kv.split_once('=').map_or(kv, |(k, _)| k).to_string();
    let has_param = |info: &scenario::ScenarioInfo, kv: &str| {
        let key = key_of(kv);
        key.starts_with("guest.") || info.has_param(&key)
    };
    let has_variant =
        |info: &scenario::ScenarioInfo, v: &str| info.variants.iter().any(|x| x.name == v);
    let unknown = |key: &str, value: &str, what: &str| -> Error {
        InputError::BadValue {
            key: key.into(),
            value: value.to_string(),
            why: format!(
                "no scenario of {} has that {what}; `hvlab list` shows them",
                req.scenarios.join(", ")
            ),
        }
        .into()
    };
    if let Some(kv) = req
        .sets
        .iter()
        .find(|kv| !infos.iter().any(|i| has_param(i, kv)))
    {
        return Err(unknown("--set", kv, "parameter"));
    }
    if let Some(v) = req
        .variants
        .iter()
        .find(|v| !infos.iter().any(|i| has_variant(i, v)))
    {
        return Err(unknown("--variant", v, "variant"));
    }
    Ok(infos
        .iter()
        .map(|info| {
            let mut c = vec![
                "run".to_string(),
                info.name.to_string(),
                "--reps".into(),
                req.reps.to_string(),
                "--warmup".into(),
                "1".into(),
                "--json".into(),
            ];
            for v in req.variants.iter().filter(|v| has_variant(info, v)) {
                c.extend(["--variant".to_string(), v.clone()]);
            }
            for kv in req.sets.iter().filter(|kv| has_param(info, kv)) {
                c.extend(["--set".to_string(), kv.clone()]);
            }
            c
        })
        .collect())
}

/// Where a boot's console log goes.
pub fn logs_dir(release: &str) -> PathBuf {
    kernel::cache_dir().join("logs").join(format!(
        "{}-{release}-{}",
        kernel::now_stamp(),
        std::process::id()
    ))
}

/// The kernel A/B: resolves (and builds) both kernels, checks them before any boot, boots
/// them in ABBA order, stores every run as it comes back, and judges B against A.
pub fn run(
    req: &KabRequest,
    store: &mut Store,
    progress: &dyn KabProgress,
) -> Result<KabOutcome, Error> {
    let start = Instant::now();
    let commands = guest_commands(req)?;
    vm::qemu()?;
    let kernels = KabKernels::resolve(req, progress)?;
    let build_s = start.elapsed().as_secs_f64();
    let lifecycle = req
        .scenarios
        .iter()
        .any(|s| s == scenario::Kind::Lifecycle.name());
    let strategies = kernels.model_strategies(req.model_strategy.as_deref());
    // The base's profile, calibrated in its own guest under this accelerator: what prices the
    // model's prediction of the change here. Kept per kernel, so only a kab's first run on a
    // base pays for it (in its first boot, after the scenarios).
    let base = Identity::of(&kernels.kernels[0], &kernels.choice);
    let cached = cached_calibration(&base, progress);
    let calibrate_now =
        req.calibrate && lifecycle && strategies.iter().all(Result::is_ok) && cached.is_none();
    let tags = kab_tags(&kernels.builds, req.model_strategy.as_deref());
    let plan = BootPlan {
        kernels: &kernels,
        commands: &commands,
        tags: &tags,
        calibrate_now,
        base: &base,
    };
    let boots_start = Instant::now();
    let booted = plan.boot_abba(req, store, progress)?;
    let boots_s = boots_start.elapsed().as_secs_f64();
    let calibrated = booted.calibrated.or(cached);
    let failed_commands = ["A", "B"].map(|side| {
        booted
            .summaries
            .iter()
            .filter(|b| b.side == side)
            .flat_map(|b| b.failures.iter().cloned())
            .collect::<Vec<GuestFailure>>()
    });
    let judged = judge(
        &req.scenarios,
        &req.variants,
        [0, 1].map(|i| SideRuns {
            runs: &booted.sides[i],
            failed_commands: &failed_commands[i],
        }),
        kernels.choice.accel,
        req.threshold,
    );
    let host = super::host::probe();
    let prediction = lifecycle
        .then(|| {
            predict(
                &strategies,
                &booted.sides,
                calibrated.as_ref(),
                calibrate_now,
                req.calibrate,
                &host,
            )
        })
        .transpose()?;
    let wall = WallTimes {
        build_s,
        boots_s,
        total_s: start.elapsed().as_secs_f64(),
    };
    Ok(KabOutcome::new(
        req,
        kernels,
        booted.summaries,
        judged,
        host,
        prediction,
        wall,
    ))
}

/// Both kernels of a kab, resolved (built when patched) and checked, and how their VMs run.
struct KabKernels {
    kernels: [Kernel; 2],
    builds: [Option<BuildInfo>; 2],
    /// Fetching, unpacking and preparing the source.
    build_steps: Vec<Step>,
    notes: Vec<String>,
    choice: AccelChoice,
}

impl KabKernels {
    /// Resolves (and builds) both kernels, picks the accelerator, and checks that both can
    /// host hvlab before either boots.
    fn resolve(req: &KabRequest, progress: &dyn KabProgress) -> Result<KabKernels, Error> {
        let resolved = build::resolve(&[&req.base, &req.patched], None, req.sandbox, progress)
            .map_err(VmError::from)?;
        let [a, b]: [build::Built; 2] = resolved.sides.try_into().map_err(|_| {
            VmError::Io(
                PathBuf::from(&req.base),
                std::io::Error::other("two kernels expected"),
            )
        })?;
        let choice = vm::choose_accel(req.vm.accel)?;
        let kernels = [a.kernel, b.kernel];
        for k in &kernels {
            kernel::check_kvm(k, &choice.vendor_module).map_err(VmError::from)?;
            kernel::check_guest_config(k).map_err(VmError::from)?;
        }
        progress.kernels(&kernels, &resolved.notes, &choice);
        Ok(KabKernels {
            kernels,
            builds: [a.build, b.build],
            build_steps: resolved.steps,
            notes: resolved.notes,
            choice,
        })
    }

    /// The model's strategy for each side: from its release and patches, and for B the
    /// strategy `declared` for a change the model does not recognise.
    fn model_strategies(&self, declared: Option<&str>) -> [Result<StrategyChoice, String>; 2] {
        [
            patch::strategy_for(
                &self.kernels[0].release,
                &patch_ids(self.builds[0].as_ref()),
                None,
            ),
            patch::strategy_for(
                &self.kernels[1].release,
                &patch_ids(self.builds[1].as_ref()),
                declared,
            ),
        ]
    }
}

/// The base's profile as the calibration cache keeps it, if any (an unreadable cache is said
/// and treated as none).
fn cached_calibration(
    base: &Identity,
    progress: &dyn KabProgress,
) -> Option<(PathBuf, crate::model::profile::Profile)> {
    match calibration::load(base) {
        Ok(found) => found,
        Err(e) => {
            progress.note(&format!("the cached calibration of A cannot be read: {e}"));
            None
        }
    }
}

/// What every boot of a kab shares.
struct BootPlan<'a> {
    kernels: &'a KabKernels,
    /// The hvlab commands each guest runs.
    commands: &'a [Vec<String>],
    /// What each side's runs remember of the kab.
    tags: &'a [KabSide; 2],
    /// Calibrate the base in the first boot (A's).
    calibrate_now: bool,
    base: &'a Identity,
}

/// What the boots brought back: each side's runs, the boots' summaries, and the base's
/// calibration when a boot made one and it was kept.
struct Booted {
    sides: [Vec<RunRecord>; 2],
    summaries: Vec<BootSummary>,
    calibrated: Option<(PathBuf, crate::model::profile::Profile)>,
}

impl BootPlan<'_> {
    /// Boots the kernels in ABBA order over `req.boots`, storing each boot's runs as they
    /// come back; a boot that failed ends the kab after its runs are stored.
    fn boot_abba(
        &self,
        req: &KabRequest,
        store: &mut Store,
        progress: &dyn KabProgress,
    ) -> Result<Booted, Error> {
        let mut booted = Booted {
            sides: [Vec::new(), Vec::new()],
            summaries: Vec::new(),
            calibrated: None,
        };
        let order = abba(req.boots);
        for (i, &side) in order.iter().enumerate() {
            let k = &self.kernels.kernels[side];
            let name = ["A", "B"][side];
            progress.boot_start(i + 1, order.len(), name, k);
            let mut these = self.commands.to_vec();
            if self.calibrate_now && i == 0 {
                // --force: an emulated host's own readings call it busy, and its costs are the
                // emulator's anyway (the model then predicts jiffies and counts, not times).
                these.push(vec!["calibrate".into(), "--force".into()]);
            }
            let before = hvlab_host::noise::Snapshot::take();
            let (mut boot, failure) = vm::boot(k, &req.vm, &these, &logs_dir(&k.release))?;
            // QEMU's TCG thread is the one runnable thread of this boot.
            let noise =
                hvlab_host::noise::between(&before, &hvlab_host::noise::Snapshot::take(), &[], 1);
            for r in &mut boot.runs {
                if let Some(u) = r.host.under_test.as_mut() {
                    u.kab = Some(self.tags[side].clone());
                }
            }
            let busy = busy_during_boot(&noise);
            if let Some(toml) = boot.calibrated.take() {
                match &busy {
                    // Its costs would be a starved emulator's, priced into every prediction
                    // made with this kernel's cached calibration.
                    Some(why) => progress.note(&format!(
                        "calibration of A not kept: the host was busy during the boot ({why}); the next kab calibrates again"
                    )),
                    None => booted.calibrated = self.keep_calibration(&toml, progress),
                }
            }
            let tally = vm::store_runs(store, &boot.runs)?;
            let mut summary =
                BootSummary::of(name, &boot, tally.stored, store.location().to_string());
            summary.host_busy = busy;
            progress.boot_end(&summary);
            booted.summaries.push(summary);
            booted.sides[side].extend(boot.runs);
            if let Some(f) = failure {
                return Err(f.into());
            }
        }
        Ok(booted)
    }

    /// Keeps the calibration a boot brought back as the base's (only the first boot
    /// calibrates, and it is A's: ABBA), saying where, or why not.
    fn keep_calibration(
        &self,
        toml: &str,
        progress: &dyn KabProgress,
    ) -> Option<(PathBuf, crate::model::profile::Profile)> {
        match calibration::save(self.base, toml) {
            Ok((path, profile)) => {
                progress.note(&format!(
                    "calibrated A in its guest: {} (kept for this kernel under {})",
                    path.display(),
                    self.kernels.choice.accel
                ));
                Some((path, profile))
            }
            Err(e) => {
                progress.note(&format!("calibration of A not kept: {e}"));
                None
            }
        }
    }
}

impl BootSummary {
    /// Side `side`'s `boot`, of whose runs `stored` were new to `store`.
    pub(crate) fn of(side: &str, boot: &vm::Boot, stored: usize, store: String) -> BootSummary {
        BootSummary {
            side: side.to_string(),
            release: boot.release.clone(),
            to_first_command_s: boot.to_first_command_s,
            wall_s: boot.wall_s,
            console: boot.console.clone(),
            runs: boot.runs.len(),
            stored,
            store,
            failures: boot
                .commands
                .iter()
                .filter(|c| c.rc != Some(0))
                .map(|c| GuestFailure {
                    args: c.args.clone(),
                    rc: c.rc,
                    stderr: c.stderr.clone(),
                })
                .collect(),
            host_busy: None,
        }
    }
}

impl KabOutcome {
    /// The outcome of a kab whose `kernels` booted as `boots` said, judged as `judged`, with
    /// the model's `prediction` when it ran lifecycle.
    fn new(
        req: &KabRequest,
        kernels: KabKernels,
        boots: Vec<BootSummary>,
        judged: Vec<ScenarioAb>,
        host: hvlab_core::host::HostInfo,
        prediction: Option<KabPrediction>,
        wall: WallTimes,
    ) -> KabOutcome {
        let Judgement {
            verdicts,
            regression,
            inconclusive,
        } = judgement(&judged, &boots);
        let [a, b] = kernels.kernels;
        KabOutcome {
            hvlab_version: format!("{} ({})", host.hvlab_version, host.git_rev),
            a,
            b,
            builds: kernels.builds,
            build_steps: kernels.build_steps,
            notes: kernels.notes,
            accel: kernels.choice,
            host: HostSummary {
                kernel: host.kernel,
                cpu: host.cpu,
                cores: host.cores,
                hypervisor: host.hypervisor,
            },
            scenario_names: req.scenarios.clone(),
            boots_per_side: req.boots,
            reps: req.reps,
            boots,
            scenarios: judged,
            verdicts,
            regression,
            inconclusive,
            wall_s: wall.total_s,
            wall,
            prediction,
        }
    }
}

/// A side's patches by file name and sha256.
fn patch_ids(build: Option<&BuildInfo>) -> Vec<(String, String)> {
    build.map_or_else(Vec::new, |b| {
        b.patches
            .iter()
            .map(|p| (p.file.clone(), p.sha256.clone()))
            .collect()
    })
}

/// What each side's runs remember of this kab: its id, the side, the patches, and B's
/// declared strategy.
fn kab_tags(builds: &[Option<BuildInfo>; 2], declared: Option<&str>) -> [KabSide; 2] {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let id = format!(
        "kab-{}-{:08x}",
        crate::scenario::runner::now_rfc3339(),
        nanos ^ std::process::id()
    );
    let side = |i: usize| KabSide {
        id: id.clone(),
        side: ["A", "B"][i].to_string(),
        patches: patch_ids(builds[i].as_ref())
            .into_iter()
            .map(|(file, sha256)| PatchId { file, sha256 })
            .collect(),
        model_strategy: (i == 1).then(|| declared.map(str::to_string)).flatten(),
    };
    [side(0), side(1)]
}

/// The runs of `scenario` that produced samples: a run kept only for its variants' failures
/// has nothing to predict against.
fn measured<'a>(side: &'a [RunRecord], scenario: &str) -> Vec<&'a RunRecord> {
    of_scenario(side, scenario)
        .into_iter()
        .filter(|r| r.produced_samples())
        .collect()
}

/// The model's prediction of the change: on this host from the base's calibration, against
/// what both sides measured, and on the reporter's host from its built-in profile.
fn predict(
    strategies: &[Result<StrategyChoice, String>; 2],
    sides: &[Vec<RunRecord>; 2],
    calibrated: Option<&(PathBuf, crate::model::profile::Profile)>,
    calibrated_now: bool,
    may_calibrate: bool,
    host: &hvlab_core::host::HostInfo,
) -> Result<KabPrediction, Error> {
    let unknown: Vec<String> = strategies
        .iter()
        .zip(["A", "B"])
        .filter_map(|(s, side)| s.as_ref().err().map(|why| format!("{side}: {why}")))
        .collect();
    let known = [strategies[0].clone().ok(), strategies[1].clone().ok()];
    let mut out = KabPrediction {
        label: "predicted",
        strategies: known.clone(),
        unknown,
        this_host: None,
        this_host_missing: None,
        reporters_host: None,
    };
    let [Some(sa), Some(sb)] = known else {
        return Ok(out);
    };
    out.reporters_host = Some([
        on_reporters_host(host, sa.strategy(), DEFAULT_SEED)?,
        on_reporters_host(host, sb.strategy(), DEFAULT_SEED)?,
    ]);
    let lifecycle = scenario::Kind::Lifecycle.name();
    let (ra, rb) = (
        measured(&sides[0], lifecycle),
        measured(&sides[1], lifecycle),
    );
    let Some((path, profile)) = calibrated else {
        out.this_host_missing = Some(if may_calibrate {
            "the base's calibration in its guest was not kept or did not come back (the notes above say why)".into()
        } else {
            "no profile of A calibrated under this accelerator is cached, and --no-calibrate was given".into()
        });
        return Ok(out);
    };
    if ra.is_empty() || rb.is_empty() {
        out.this_host_missing = Some("a side brought back no lifecycle run".into());
        return Ok(out);
    }
    let tolerance = patch::TOLERANCE_PCT;
    let (ma, rows_a) = patch::compare(&ra, sa.strategy(), profile, tolerance, DEFAULT_SEED)?;
    let (mb, rows_b) = patch::compare(&rb, sb.strategy(), profile, tolerance, DEFAULT_SEED)?;
    let agrees = |rows: &[PatchRow], v: &str| {
        rows.iter()
            .find(|r| r.variant == v)
            .map(|r| r.agreement == crate::lab::fidelity::Agreement::Within)
    };
    let variants = ma
        .variants
        .iter()
        .filter(|v| v.is_ok() && mb.variant(&v.name).is_some_and(|x| x.is_ok()))
        .map(|v| {
            let models = [&ma, &mb];
            let stalls = models.map(|m| median(&pooled(&[m], &v.name, "stalls")));
            let sets = models.map(|m| patch::waits(&[m], &v.name));
            let waits = sets[0]
                .union(&sets[1])
                .map(|w: &Wait| PredictedWait {
                    ioctl: w.ioctl.clone(),
                    on: w.on.clone(),
                    sides: [sets[0].contains(w), sets[1].contains(w)],
                    jiffies: models.map(|m| {
                        median(&pooled(&[m], &v.name, &format!("ioctl.{}_ms", w.ioctl)))
                            / patch::jiffy_ms(&[m])
                    }),
                })
                .collect();
            VariantPrediction {
                variant: v.name.clone(),
                stalls,
                waits,
                agrees: [agrees(&rows_a, &v.name), agrees(&rows_b, &v.name)],
            }
        })
        .collect();
    out.this_host = Some(ThisHostPrediction {
        profile: profile.name.clone(),
        profile_path: path.clone(),
        calibrated_now,
        variants,
        rows: [rows_a, rows_b],
    });
    Ok(out)
}

/// A kab of a patch that makes dirty logging lose one page per pass (issue 37), as stored:
/// A ran every dirty variant, B failed each (`tests/fixtures/kab-dirty-lost-page/`).
#[cfg(test)]
pub(crate) mod fixture {
    use super::*;

    const RUNS: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kab-dirty-lost-page/runs.jsonl"
    ));

    /// What B's dirty log said in every variant.
    pub const LOST: &str =
        "the dirty log reported 4095 pages in pass 1 of repetition 1, the guest wrote 4096";

    /// The four runs, through a store and back: a run whose every variant failed is stored
    /// like any other.
    pub fn runs() -> Vec<RunRecord> {
        let parsed: Vec<RunRecord> = RUNS
            .lines()
            .map(|l| serde_json::from_str(l).expect("a stored run"))
            .collect();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut store = Store::open(&dir.path().join("kab.db")).expect("a store");
        let tally = crate::store::transfer::ingest_all(&mut store, &parsed).expect("ingested");
        assert_eq!(tally.stored, 4);
        parsed
            .iter()
            .map(|r| store.load(&r.run_id).expect("stored"))
            .collect()
    }

    /// Side `side`'s runs (`A` or `B`).
    pub fn side(runs: &[RunRecord], side: &str) -> Vec<RunRecord> {
        runs.iter()
            .filter(|r| {
                r.host
                    .under_test
                    .as_ref()
                    .and_then(|u| u.kab.as_ref())
                    .is_some_and(|k| k.side == side)
            })
            .cloned()
            .collect()
    }

    /// The kab judged as `hvlab kab --scenario dirty` judges it, with each side's failed
    /// guest commands.
    pub fn judged(
        a: &[RunRecord],
        b: &[RunRecord],
        failed_commands: [&[GuestFailure]; 2],
    ) -> Vec<ScenarioAb> {
        judge(
            &["dirty".to_string()],
            &[],
            [
                SideRuns {
                    runs: a,
                    failed_commands: failed_commands[0],
                },
                SideRuns {
                    runs: b,
                    failed_commands: failed_commands[1],
                },
            ],
            Accel::Tcg,
            0.05,
        )
    }

    /// B's guest command for the dirty scenario, exiting 4 as `hvlab run` does when every
    /// variant failed.
    pub fn b_command_failed(stderr: &str) -> GuestFailure {
        GuestFailure {
            args: ["run", "dirty", "--reps", "4", "--json"]
                .map(str::to_string)
                .to_vec(),
            rc: Some(4),
            stderr: stderr.to_string(),
        }
    }
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

    fn call_of(m: &MetricAb) -> &CountCall {
        match &m.judgement {
            MetricJudgement::Count { call } => call,
            other => panic!("a count expected, got {other:?}"),
        }
    }

    #[test]
    fn counts_are_compared_exactly() {
        let m = count(
            "stalls",
            "count",
            vec![0.0; 2],
            vec![1.0; 2],
            Accel::Tcg,
            0.05,
        );
        assert_eq!(call_of(&m), &CountCall::Higher);
        assert!(m.regression);
        let m = count(
            "kvm.vcpu.pf_fixed",
            "count",
            vec![5.0; 2],
            vec![5.0; 2],
            Accel::Tcg,
            0.05,
        );
        assert_eq!(call_of(&m), &CountCall::Same);
        assert!(!m.regression);
        // Varying: the rank test, alone here; its words say so.
        let m = count(
            "kvm.vcpu.pf_fixed",
            "count",
            vec![5.0, 7.0, 6.0, 5.0],
            vec![6.0, 5.0, 7.0, 5.0],
            Accel::Kvm,
            0.05,
        );
        assert!(matches!(
            call_of(&m),
            CountCall::Varies(RankedCount {
                shift: Shift::NotSignificant,
                ..
            })
        ));
        assert!(
            call_of(&m)
                .to_string()
                .starts_with("varies between repetitions, no significant change (rank test), p = ")
        );
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
            Some(NotJudged::TimeUnderTcg),
        );
        assert!(m.judgement.comparison().is_none());
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
            m.judgement.comparison().map(|c| c.verdict),
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
        // Separated by the rank test, but the ratio's interval reaches below the threshold
        // (longer by most of a jiffy: the half-jiffy rule does not settle it).
        let a: Vec<f64> = (0..20).map(|i| 10.0 + f64::from(i) * 0.1).collect();
        let b: Vec<f64> = a.iter().map(|x| x * 1.08).collect();
        let m = jiffies(a, b);
        let c = m.judgement.comparison().expect("judged");
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
        // Three a side can never be called: out of reach, said whichever way B looks.
        let m = count(
            "x",
            "count",
            vec![1.0, 0.0, 1.0],
            vec![0.0, 1.0, 0.0],
            Accel::Tcg,
            0.05,
        );
        assert!(!m.regression && m.inconclusive.is_some(), "{m:?}");
        // Lower on B, or higher by less than the threshold, with samples enough: nothing to
        // decide.
        for (a, b) in [
            (
                vec![1.0, 0.0, 1.0, 1.0, 0.0, 1.0],
                vec![0.0, 1.0, 0.0, 0.0, 1.0, 0.0],
            ),
            (
                vec![100.0, 101.0, 99.0, 100.0, 101.0, 99.0],
                vec![101.0, 100.0, 102.0, 101.0, 100.0, 102.0],
            ),
        ] {
            let m = count("x", "count", a, b, Accel::Tcg, 0.05);
            assert!(m.inconclusive.is_none(), "{m:?}");
        }
    }

    fn variant(metrics: Vec<MetricAb>, stalls: Vec<StallAb>) -> VariantAb {
        VariantAb {
            variant: "v".into(),
            metrics,
            stalls,
            failures: [None, None],
        }
    }

    fn stall(a: Option<usize>, b: Option<usize>) -> StallAb {
        let side = |n: usize| StallSide {
            stalled_reps: n,
            reps: 20,
            jiffies: [1.1, 1.3],
        };
        StallAb {
            ioctl: "KVM_SET_USER_MEMORY_REGION".into(),
            cause: "KVM_CREATE_IRQCHIP".into(),
            a: a.map(side),
            b: b.map(side),
        }
    }

    fn stalls(a: Vec<f64>, b: Vec<f64>) -> MetricAb {
        count("stalls", "count", a, b, Accel::Tcg, 0.05)
    }

    /// The 001 fix on irqchip-first, as measured on 7.3.4: 1 → 0 stalls in 20 of 20, the
    /// memslot update 1.22 → 0.062 jiffies.
    #[test]
    fn a_stall_a_had_and_b_never_has_is_fixed() {
        let memslot = jiffies_metric(
            "ioctl.KVM_SET_USER_MEMORY_REGION",
            (0..20).map(|i| 1.22 + f64::from(i) * 0.01).collect(),
            (0..20).map(|i| 0.062 + f64::from(i) * 0.001).collect(),
            0.05,
        );
        let v = verdict(
            "lifecycle",
            &variant(
                vec![stalls(vec![1.0; 20], vec![0.0; 20]), memslot],
                vec![stall(Some(20), None)],
            ),
        );
        assert_eq!(v.class, Class::Fixed);
        assert_eq!(
            v.stall_reps,
            Some([
                StallReps {
                    stalled: 20,
                    reps: 20
                },
                StallReps {
                    stalled: 0,
                    reps: 20
                }
            ])
        );
        assert!(
            v.improvements
                .iter()
                .any(|c| c.metric.ends_with("MEMORY_REGION") && !c.within_jiffy)
        );
    }

    fn noise_with(busy: Vec<hvlab_core::noise::BusyReason>) -> hvlab_core::noise::Noise {
        hvlab_core::noise::Noise {
            cores: 2,
            load1: [2.5, 2.5],
            runnable_others: [1, 1],
            cpu_pressure_some_pct: None,
            cpu_pressure_full_pct: None,
            steal_pct: None,
            involuntary_switches: 0,
            voluntary_switches: 0,
            migrations: None,
            involuntary_per_rep: Vec::new(),
            clocksource: "tsc".into(),
            clocksource_stable: true,
            wall_s: 7.0,
            pinned_cpus: None,
            quiet_wait: None,
            own_threads: 1,
            busy,
        }
    }

    fn boot(side: &str, host_busy: Option<&str>) -> BootSummary {
        BootSummary {
            side: side.into(),
            release: "7.3.4+deb13-amd64".into(),
            to_first_command_s: Some(3.0),
            wall_s: 7.0,
            console: PathBuf::from("console.log"),
            runs: 1,
            stored: 1,
            store: "kab.db".into(),
            failures: Vec::new(),
            host_busy: host_busy.map(str::to_string),
        }
    }

    /// QEMU's one TCG thread keeps a CPU of its own beside one busy loop (load and runnable
    /// say busy, pressure 2%): judged. Two busy loops starve it (pressure 49%): not judged.
    #[test]
    fn only_cpu_pressure_or_steal_during_a_boot_makes_it_busy() {
        use hvlab_core::noise::BusyReason;
        let one_loop = noise_with(vec![
            BusyReason::Load {
                load1: 2.5,
                cores: 2,
            },
            BusyReason::Runnable {
                others: 1,
                cores: 2,
            },
        ]);
        assert_eq!(busy_during_boot(&one_loop), None);
        let two_loops = noise_with(vec![
            BusyReason::Runnable {
                others: 2,
                cores: 2,
            },
            BusyReason::Pressure { some_pct: 49.4 },
        ]);
        assert_eq!(
            busy_during_boot(&two_loops).as_deref(),
            Some("tasks waited for a CPU 49% of the time")
        );
        assert_eq!(
            busy_during_boot(&noise_with(vec![BusyReason::Steal { pct: 12.0 }])).as_deref(),
            Some("steal 12%")
        );
    }

    /// The saturated host's kab: qemu-order REGRESSED on KVM_CREATE_VM 0.20 → 0.82 jiffies, a
    /// boot slowed as a whole. With a busy boot nothing is judged, a FIXED neither; with
    /// quiet boots the verdicts stand.
    #[test]
    fn a_busy_boot_leaves_every_verdict_not_decided_and_names_the_boot() {
        let create_vm = jiffies_metric(
            "ioctl.KVM_CREATE_VM",
            (0..10).map(|i| 0.20 + f64::from(i) * 0.001).collect(),
            (0..10).map(|i| 0.82 + f64::from(i) * 0.001).collect(),
            0.05,
        );
        let mut regressed = verdict("lifecycle", &variant(vec![create_vm], Vec::new()));
        assert_eq!(regressed.class, Class::Regressed);
        let mut fixed = verdict(
            "lifecycle",
            &variant(
                vec![stalls(vec![1.0; 20], vec![0.0; 20])],
                vec![stall(Some(20), None)],
            ),
        );
        assert_eq!(fixed.class, Class::Fixed);
        let quiet = [boot("A", None), boot("B", None)];
        assert_eq!(host_busy_during(&quiet), None);
        let busy = host_busy_during(&[
            boot("A", None),
            boot("B", Some("tasks waited for a CPU 49% of the time")),
        ])
        .unwrap();
        assert_eq!(busy, "boot 2 (B): tasks waited for a CPU 49% of the time");
        for v in [&mut regressed, &mut fixed] {
            not_judged_on_a_busy_host(v, &busy);
            assert_eq!(v.class, Class::NotDecided);
            assert_eq!(v.host_busy.as_deref(), Some(busy.as_str()));
            assert!(v.regressions.is_empty() && v.costs.is_empty());
        }
    }

    /// Under TCG one repetition of B can look stalled (the emulator paused): the recurring
    /// stall is still gone, and the count is lower beyond noise.
    #[test]
    fn a_stray_stalled_repetition_on_b_does_not_hide_a_fix() {
        let mut b = vec![0.0; 20];
        b[7] = 1.0;
        let v = verdict(
            "lifecycle",
            &variant(vec![stalls(vec![1.0; 20], b)], vec![stall(Some(20), None)]),
        );
        assert_eq!(v.class, Class::Fixed, "{v:?}");
        // Without a recurring stall on A to match, B must never stall.
        let mut b = vec![0.0; 20];
        b[7] = 1.0;
        let v = verdict(
            "lifecycle",
            &variant(vec![stalls(vec![1.0; 20], b)], vec![]),
        );
        assert_eq!(v.class, Class::Improved, "{v:?}");
    }

    /// An expedited grace period per registration: KVM_IOEVENTFD 0.018 → 0.118 jiffies is
    /// longer beyond doubt, by under half a jiffy: a cost, not a regression.
    #[test]
    fn a_registration_slower_within_a_jiffy_is_a_cost_not_a_regression() {
        let spread =
            |base: f64| -> Vec<f64> { (0..20).map(|i| base + f64::from(i) * 0.001).collect() };
        let m = jiffies_metric("ioctl.KVM_IOEVENTFD", spread(0.018), spread(0.118), 0.05);
        assert!(m.cost && !m.regression, "{m:?}");
        let v = verdict(
            "lifecycle",
            &variant(vec![stalls(vec![0.0; 20], vec![0.0; 20]), m], vec![]),
        );
        assert_eq!(v.class, Class::NoChange);
        assert_eq!(v.costs.len(), 1);
        assert!((v.costs[0].b - 0.118).abs() < 0.01 && v.costs[0].within_jiffy);
        // Longer by a grace period's worth: a regression.
        let m = jiffies_metric("ioctl.KVM_IOEVENTFD", spread(0.018), spread(1.2), 0.05);
        assert!(m.regression && !m.cost);
        assert_eq!(
            verdict("lifecycle", &variant(vec![m], vec![])).class,
            Class::Regressed
        );
    }

    /// boot-activation under the 001 fix: it stalls on both kernels; the verdict is unchanged,
    /// and the stall is reported as both sides', never as B's alone.
    #[test]
    fn a_stall_on_both_kernels_is_no_change_and_named_on_both() {
        let v = verdict(
            "lifecycle",
            &variant(
                vec![stalls(vec![1.0; 20], vec![1.0; 20])],
                vec![stall(Some(19), Some(20))],
            ),
        );
        assert_eq!(v.class, Class::NoChange);
        assert!(v.stalls[0].a.is_some() && v.stalls[0].b.is_some());
    }

    #[test]
    fn a_stall_b_gained_is_a_regression() {
        let v = verdict(
            "lifecycle",
            &variant(
                vec![stalls(vec![0.0; 20], vec![1.0; 20])],
                vec![stall(None, Some(20))],
            ),
        );
        assert_eq!(v.class, Class::Regressed);
        assert_eq!(v.regressions[0].metric, "stalls");
    }

    #[test]
    fn a_grace_period_lost_without_a_stall_count_is_improved() {
        let m = jiffies_metric("ioctl.KVM_CREATE_VCPU", vec![1.5; 12], vec![0.2; 12], 0.05);
        let v = verdict("lifecycle", &variant(vec![m], vec![]));
        assert_eq!(v.class, Class::Improved);
        // Shorter by a fraction of a jiffy only: listed, but not a class of its own.
        let m = jiffies_metric("ioctl.KVM_CREATE_VCPU", vec![0.3; 12], vec![0.2; 12], 0.05);
        let v = verdict("lifecycle", &variant(vec![m], vec![]));
        assert_eq!(v.class, Class::NoChange);
        assert!(v.improvements[0].within_jiffy);
    }

    /// The model's prediction of the 001 fix beside a real kab of it (the stored runs of
    /// one, trimmed): here, from the base calibrated in its guest, every order's stall count
    /// as measured, boot-activation still waiting on both kernels; on thread 001's host,
    /// about the 20 ms per VM creation the thread reported. A change the model does not know
    /// gets no prediction, and the reason says how to declare one.
    #[test]
    fn the_fix_is_predicted_here_and_where_it_was_reported() {
        use crate::lab::fidelity::patch::fixture;
        let runs = fixture::runs();
        let side = |s: &str| -> Vec<RunRecord> {
            fixture::side(&runs, "001-lifecycle-keyed.patch", s)
                .into_iter()
                .cloned()
                .collect()
        };
        let sides = [side("A"), side("B")];
        let release = "7.3.4+deb13-amd64";
        let fix = patch::KNOWN_CHANGES[0].sha256;
        let strategies = [
            patch::strategy_for(release, &[], None),
            patch::strategy_for(release, &[("fix.patch".into(), fix.into())], None),
        ];
        let profile = (PathBuf::from("fixture.toml"), fixture::profile());
        let host = hvlab_host::probe::probe_with("model".into(), Default::default());
        let p = predict(&strategies, &sides, Some(&profile), false, true, &host).unwrap();
        let here = p.this_host.as_ref().expect("a prediction here");
        let v = |name: &str| here.variants.iter().find(|v| v.variant == name).unwrap();
        for (name, stalls) in [
            ("irqchip-first", [1.0, 0.0]),
            ("memslots-first", [0.0, 0.0]),
            ("qemu-order", [1.0, 0.0]),
            ("firecracker-order", [1.0, 0.0]),
            ("boot-activation", [1.0, 1.0]),
        ] {
            assert_eq!(v(name).stalls, stalls, "{name}");
            assert_eq!(v(name).agrees[1], Some(true), "{name}: B as measured");
        }
        let boot = &v("boot-activation").waits[0];
        assert_eq!(
            (boot.on.as_str(), boot.sides),
            ("KVM_IOEVENTFD", [true, true])
        );
        // Stock irqchip-first after boot-activation's teardown, as the kernel ran it (see
        // fidelity::patch's tests).
        assert_eq!(v("irqchip-first").agrees[0], Some(true));
        let [a, b] = p.reporters_host.as_ref().expect("the reporter's host");
        let saved = a.ready_ms.median - b.ready_ms.median;
        assert!((15.0..25.0).contains(&saved), "{saved} ms");
        assert_eq!((a.stalls.median, b.stalls.median), (1.0, 0.0));
        let unknown = [
            strategies[0].clone(),
            patch::strategy_for(release, &[("doc.patch".into(), "00".into())], None),
        ];
        let p = predict(&unknown, &sides, Some(&profile), false, true, &host).unwrap();
        assert!(p.this_host.is_none() && p.reporters_host.is_none());
        assert!(
            p.unknown[0].starts_with("B: doc.patch") && p.unknown[0].contains("--model-strategy")
        );
    }

    /// A stalled in 2 of 6 repetitions, B in none: too few to call it fixed.
    #[test]
    fn a_rare_stall_gone_is_not_decided_not_fixed() {
        let v = verdict(
            "lifecycle",
            &variant(
                vec![stalls(vec![1.0, 0.0, 0.0, 1.0, 0.0, 0.0], vec![0.0; 6])],
                vec![],
            ),
        );
        assert_eq!(v.class, Class::NotDecided);
        assert_eq!(v.undecided, ["stalls"]);
    }

    fn quiet_boots() -> Vec<BootSummary> {
        vec![boot("A", None), boot("B", None)]
    }

    fn scenario_of(variants: Vec<VariantAb>) -> ScenarioAb {
        ScenarioAb {
            scenario: "lifecycle".into(),
            runs: [vec!["a".into()], vec!["b".into()]],
            variants,
        }
    }

    /// Issue 36: a stall B gained regresses it as its stall count does. In 12 of 20
    /// repetitions, with no other metric worse, the count is higher beyond chance: REGRESSED,
    /// and the gate (`KabOutcome.regression`, what `--fail-on-regression` reads) fails. In 3
    /// of 20 the count cannot be told from noise: B looks worse, NOT DECIDED naming the
    /// stalls, and the gate passes (on the code before, one boot's recurring finding made it
    /// REGRESSED whatever the count said).
    #[test]
    fn a_stall_b_gained_regresses_as_its_count_does_and_the_gate_follows_the_class() {
        let ioeventfd = || {
            jiffies_metric(
                "ioctl.KVM_IOEVENTFD",
                (0..20).map(|i| 0.018 + f64::from(i) * 0.001).collect(),
                (0..20).map(|i| 0.018 + f64::from(i) * 0.001).collect(),
                0.05,
            )
        };
        let mut often = vec![0.0; 20];
        for i in (0..20).filter(|i| i % 5 != 0) {
            often[i] = if i < 15 { 1.0 } else { 0.0 };
        }
        assert_eq!(often.iter().filter(|x| **x > 0.0).count(), 12);
        let v = variant(
            vec![stalls(vec![0.0; 20], often), ioeventfd()],
            vec![stall(None, Some(12))],
        );
        assert!(!v.metrics[1].regression && !v.metrics[1].cost, "{v:?}");
        let j = judgement(&[scenario_of(vec![v])], &quiet_boots());
        assert_eq!(j.verdicts[0].class, Class::Regressed);
        assert_eq!(j.verdicts[0].regressions[0].metric, "stalls");
        assert!(j.regression, "a printed REGRESSED must fail the gate");
        let mut rare = vec![0.0; 20];
        rare[3] = 1.0;
        rare[9] = 1.0;
        rare[15] = 1.0;
        let v = variant(
            vec![stalls(vec![0.0; 20], rare), ioeventfd()],
            vec![stall(None, Some(3))],
        );
        assert!(v.metrics.iter().all(|m| !m.regression), "{v:?}");
        let j = judgement(&[scenario_of(vec![v])], &quiet_boots());
        assert_eq!(j.verdicts[0].class, Class::NotDecided);
        assert_eq!(j.verdicts[0].undecided, ["stalls"]);
        assert!(
            !j.regression,
            "nothing but a printed REGRESSED fails the gate"
        );
        // A rare stall gone is not decided either, and passes.
        let v = variant(
            vec![stalls(vec![1.0, 0.0, 0.0, 1.0, 0.0, 0.0], vec![0.0; 6])],
            vec![],
        );
        let j = judgement(&[scenario_of(vec![v])], &quiet_boots());
        assert_eq!(j.verdicts[0].class, Class::NotDecided);
        assert!(!j.regression);
    }

    /// Issue 37: B's dirty log loses a page per pass, so every dirty variant failed on B and
    /// ran on A. Each is REGRESSED with B's failure, none left out, and the gate fails.
    #[test]
    fn a_variant_a_ran_and_b_failed_is_regressed_with_b_s_failure() {
        let runs = fixture::runs();
        let (a, b) = (fixture::side(&runs, "A"), fixture::side(&runs, "B"));
        assert!(b.iter().all(|r| !r.produced_samples()));
        let failed = [fixture::b_command_failed("error: the dirty run failed")];
        let judged = fixture::judged(&a, &b, [&[], &failed]);
        let names: Vec<&str> = judged[0]
            .variants
            .iter()
            .map(|v| v.variant.as_str())
            .collect();
        assert_eq!(names, ["bitmap", "clear", "ring"]);
        let j = judgement(&judged, &quiet_boots());
        for v in &j.verdicts {
            assert_eq!(v.class, Class::Regressed, "{v:?}");
            assert_eq!(
                v.failures,
                [
                    None,
                    Some(SideFailure::Failed {
                        why: fixture::LOST.into(),
                        failed: 2,
                        runs: 2,
                    })
                ]
            );
        }
        assert!(j.regression);
    }

    /// A variant failing on both kernels compares nothing: NOT DECIDED, with both failures;
    /// it alone does not fail the gate.
    #[test]
    fn a_variant_failing_on_both_kernels_is_not_decided_with_both_failures() {
        let runs = fixture::runs();
        let mut a = fixture::side(&runs, "A");
        let broke = "the guest shut down in pass 2 of repetition 1";
        for r in &mut a {
            for v in &mut r.variants {
                v.status = VariantStatus::Failed(broke.into());
                v.metrics.clear();
            }
        }
        let b = fixture::side(&runs, "B");
        let j = judgement(&fixture::judged(&a, &b, [&[], &[]]), &quiet_boots());
        assert_eq!(j.verdicts.len(), 3);
        for v in &j.verdicts {
            assert_eq!(v.class, Class::NotDecided, "{v:?}");
            let why = |f: &Option<SideFailure>| match f {
                Some(SideFailure::Failed { why, .. }) => why.clone(),
                other => panic!("a failure expected, got {other:?}"),
            };
            assert_eq!(why(&v.failures[0]), broke);
            assert_eq!(why(&v.failures[1]), fixture::LOST);
        }
        assert!(!j.regression);
    }

    /// B's guest command crashed and brought no run back: every variant A ran is still in
    /// the table. With the command's failure on B it is REGRESSED, naming the command; with
    /// no failure to name, NOT DECIDED. With no run from either side, the scenario's own
    /// variants are listed, each NOT DECIDED.
    #[test]
    fn a_side_that_brought_no_run_back_leaves_no_variant_out() {
        let runs = fixture::runs();
        let a = fixture::side(&runs, "A");
        let crashed = fixture::b_command_failed("thread 'main' panicked at src/scenario/dirty.rs");
        let judged = fixture::judged(&a, &[], [&[], std::slice::from_ref(&crashed)]);
        let j = judgement(&judged, &quiet_boots());
        assert_eq!(j.verdicts.len(), 3);
        for v in &j.verdicts {
            assert_eq!(v.class, Class::Regressed);
            assert_eq!(
                v.failures[1],
                Some(SideFailure::NoRun {
                    command: Some(crashed.clone())
                })
            );
        }
        assert!(j.regression);
        // No command failed (a run went missing some other way): nothing to blame on B.
        let j = judgement(&fixture::judged(&a, &[], [&[], &[]]), &quiet_boots());
        assert!(j.verdicts.iter().all(|v| v.class == Class::NotDecided));
        assert!(!j.regression);
        // Neither side brought a run: the dirty scenario's own variants, none judged.
        let j = judgement(&fixture::judged(&[], &[], [&[], &[]]), &quiet_boots());
        let own: Vec<&str> = scenario::find("dirty")
            .unwrap()
            .variants
            .iter()
            .map(|v| v.name)
            .collect();
        let listed: Vec<&str> = j.verdicts.iter().map(|v| v.variant.as_str()).collect();
        assert_eq!(listed, own);
        assert!(j.verdicts.iter().all(|v| v.class == Class::NotDecided));
        // A variant asked for by name is listed even when no run has it.
        let judged = judge(
            &["dirty".to_string()],
            &["ring".to_string()],
            [
                SideRuns {
                    runs: &[],
                    failed_commands: &[],
                },
                SideRuns {
                    runs: &[],
                    failed_commands: &[],
                },
            ],
            Accel::Tcg,
            0.05,
        );
        assert_eq!(judged[0].variants.len(), 1);
        assert_eq!(judged[0].variants[0].variant, "ring");
    }

    /// A failure in one of B's boots is B's failure, beside a boot where the variant ran.
    #[test]
    fn a_variant_failing_in_one_boot_of_b_is_regressed() {
        let runs = fixture::runs();
        let a = fixture::side(&runs, "A");
        let mut b = fixture::side(&runs, "B");
        b[0] = a[0].clone();
        let j = judgement(&fixture::judged(&a, &b, [&[], &[]]), &quiet_boots());
        assert!(j.verdicts.iter().all(|v| v.class == Class::Regressed));
        assert!(matches!(
            &j.verdicts[0].failures[1],
            Some(SideFailure::Failed {
                failed: 1,
                runs: 2,
                ..
            })
        ));
    }

    /// A busy host leaves the comparisons NOT DECIDED, not a failure: a lost page is the
    /// kernel's answer, not a time a starved emulator stretched.
    #[test]
    fn a_busy_host_does_not_hide_a_failure_of_b() {
        let runs = fixture::runs();
        let (a, b) = (fixture::side(&runs, "A"), fixture::side(&runs, "B"));
        let busy = [
            boot("A", None),
            boot("B", Some("tasks waited for a CPU 49% of the time")),
        ];
        let j = judgement(&fixture::judged(&a, &b, [&[], &[]]), &busy);
        assert!(j.verdicts.iter().all(|v| v.class == Class::Regressed));
        assert!(j.regression);
    }

    /// A/A kabs: both sides of every metric drawn from one distribution. Six variants of
    /// twelve metrics, as a lifecycle kab under TCG judges them (two boots a side of five
    /// repetitions): six ioctl times in jiffies (three of them stalling in about half the
    /// repetitions, so their medians straddle the half jiffy) and six counts (a 0/1 `stalls`,
    /// two more 0/1 counts, three varying near 100).
    mod aa {
        use super::*;
        use proptest::prelude::*;
        use rand::{RngExt, SeedableRng};
        use rand_chacha::ChaCha8Rng;

        const VARIANTS: usize = 6;
        const BOOTS: usize = 2;
        const REPS: usize = 5;

        fn exp(rng: &mut ChaCha8Rng) -> f64 {
            -rng.random_range(f64::EPSILON..1.0f64).ln()
        }

        /// One sample of metric `m` (0..12), in its recorded unit.
        fn sample(rng: &mut ChaCha8Rng, m: usize, stall_chance: f64) -> f64 {
            match m {
                // Jiffies (recorded in ms at HZ=250): a fast ioctl with an emulator's tail,
                // half of them waiting out a grace period in some repetitions.
                0..6 => {
                    let fast = 0.1 + 0.05 * exp(rng);
                    let stalled = m < 3 && rng.random_range(0.0..1.0) < stall_chance;
                    let j = if stalled {
                        fast + 1.0 + 0.3 * rng.random_range(0.0..1.0)
                    } else {
                        fast
                    };
                    j * 4.0
                }
                // 0/1 counts: a stall in a repetition, or not.
                6..9 => f64::from(u8::from(rng.random_range(0.0..1.0) < stall_chance)),
                // Counts near 100 that vary by a few events.
                _ => (100.0 + 3.0 * exp(rng)).floor(),
            }
        }

        fn metric_name(m: usize) -> (String, &'static str) {
            match m {
                0..6 => (format!("ioctl.KVM_AA_{m}_ms"), "ms"),
                6 => ("stalls".into(), "count"),
                _ => (format!("kvm.vm.aa_{m}"), "count"),
            }
        }

        /// One side's runs: a run per boot, every variant with every metric.
        fn side(
            template: &RunRecord,
            rng: &mut ChaCha8Rng,
            stall_chance: f64,
            side: &str,
        ) -> Vec<RunRecord> {
            (0..BOOTS)
                .map(|boot| {
                    let mut r = template.clone();
                    r.run_id = format!("aa-{side}-{boot}");
                    r.variants = (0..VARIANTS)
                        .map(|v| VariantRecord {
                            name: format!("order-{v}"),
                            status: VariantStatus::Ok,
                            metrics: (0..12)
                                .map(|m| {
                                    let samples: Vec<f64> =
                                        (0..REPS).map(|_| sample(rng, m, stall_chance)).collect();
                                    let (name, unit) = metric_name(m);
                                    let record = crate::record::MetricRecord {
                                        unit: unit.into(),
                                        median: median(&samples),
                                        ci95: [0.0, 0.0],
                                        min: 0.0,
                                        max: 0.0,
                                        n: samples.len(),
                                        samples,
                                    };
                                    (name, record)
                                })
                                .collect(),
                            findings: Vec::new(),
                            timeline: Vec::new(),
                            pinned_bytes: Vec::new(),
                        })
                        .collect();
                    r
                })
                .collect()
        }

        /// The classes of one A/A kab, as `hvlab kab` judges and prints them.
        fn aa_kab(template: &RunRecord, seed: u64, stall_chance: f64) -> Vec<Class> {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let a = side(template, &mut rng, stall_chance, "A");
            let b = side(template, &mut rng, stall_chance, "B");
            let judged = judge(
                &["lifecycle".to_string()],
                &[],
                [
                    SideRuns {
                        runs: &a,
                        failed_commands: &[],
                    },
                    SideRuns {
                        runs: &b,
                        failed_commands: &[],
                    },
                ],
                Accel::Tcg,
                0.05,
            );
            let quiet = [boot("A", None), boot("B", None)];
            judgement(&judged, &quiet)
                .verdicts
                .iter()
                .map(|v| v.class)
                .collect()
        }

        /// Kabs out of `kabs` with any variant called changed (REGRESSED, IMPROVED or FIXED).
        fn falsely_called(seed: u64, kabs: u64, stall_chance: f64) -> u64 {
            let runs = crate::lab::fidelity::patch::fixture::runs();
            let template = &runs[0];
            (0..kabs)
                .filter(|k| {
                    aa_kab(template, seed.wrapping_mul(1_000_003) + k, stall_chance)
                        .iter()
                        .any(|c| matches!(c, Class::Regressed | Class::Improved | Class::Fixed))
                })
                .count() as u64
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2))]

            /// The family's error rate holds for the kab as a whole: of 200 A/A kabs, at
            /// most 5% print any REGRESSED, IMPROVED or FIXED.
            #[test]
            fn a_a_kabs_are_called_changed_at_most_five_percent_of_the_time(
                seed in 0u64..1_000_000, stall_chance in 0.3f64..0.6,
            ) {
                let called = falsely_called(seed, 200, stall_chance);
                eprintln!("A/A: {called} of 200 kabs called changed (seed {seed}, stall chance {stall_chance:.2})");
                prop_assert!(called <= 10, "{} of 200 A/A kabs called changed", called);
            }
        }
    }
}
