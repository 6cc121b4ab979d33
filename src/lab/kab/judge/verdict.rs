//! A variant's verdict: its class from its metrics and stalls, the changes and their causes,
//! and the hint that would reach patched functions it never ran.

use serde::Serialize;

use crate::analysis::calls::{FunctionCalls, never_ran};
use crate::analysis::class::VariantClass;
use crate::analysis::icount::{BootsDisagree, IcountAb};
use crate::analysis::metric_ab::MetricJudgement;
use crate::analysis::stall::STALL_JIFFIES;
use crate::lab::kab::BusyBoot;
use crate::scenario;

use super::events::{EventsBeside, MSR_WRITES_METRIC, events_beside, msr_writes_moved};
use super::metric::{MetricAb, MetricOutcome, Trust};
use super::stall::{StallAb, StallSide};
use super::{ScenarioAb, SideFailure, VariantAb, both_ran, uncounted};

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

/// A time judged changed on the instruction clock: its delta in instructions, the spread and
/// the tolerance it was judged against.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstructionChange {
    /// The metric.
    pub metric: String,
    /// The judgement.
    pub judged: IcountAb,
}

/// A finding: one side's boots disagree on a time on the instruction clock by more than
/// their repetitions spread, so something in the guest is not deterministic; the metric's
/// tolerance was widened to the disagreement.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BootsDisagreement {
    /// The metric.
    pub metric: String,
    /// The side, its boots' medians and the spread within a boot.
    pub boots: BootsDisagree,
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
    pub class: VariantClass,
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
    /// The regressions and improvements judged on the instruction clock, in instructions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instruction_clock: Vec<InstructionChange>,
    /// Times whose boots of one side disagree (a finding, whatever the class).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub boots_disagree: Vec<BootsDisagreement>,
    /// What the instruction clock does not see: the events that moved beside a time judged
    /// on it (MSR writes, TLB flushes, KVM's statistics).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<EventsBeside>,
    /// The model's estimate of the instruction delta in wall time on real hosts (an
    /// estimate, never measured), filled in by the kab from its profiles
    /// (`crate::lab::kab::predict::price_events`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<crate::lab::kab::predict::EventEstimate>,
}

fn change(m: &MetricAb, within_jiffy: bool) -> Change {
    Change {
        metric: m.metric.clone(),
        unit: m.unit.clone(),
        a: m.median[0],
        b: m.median[1],
        within_jiffy,
        undeclared: !m.declared.declared,
        tolerance: (m.outcome == MetricOutcome::WithinTolerance)
            .then_some(m.declared.count_tolerance),
    }
}

/// Whether B is judged better on `m` (the declared way), and whether by under half a jiffy.
fn better(m: &MetricAb) -> Option<bool> {
    (m.outcome == MetricOutcome::Improvement)
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
        .filter_map(|c| c.metric.strip_prefix("ioctl.").map(str::to_string))
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
        [None, Some(b)] if b.is_failure() => VariantClass::Regressed,
        _ => VariantClass::NotDecided,
    };
    VariantVerdict {
        failures: v.failures.clone(),
        calls: v.calls.clone(),
        ..VariantVerdict::of_class(scenario, &v.variant, class)
    }
}

impl VariantVerdict {
    /// A verdict of `class` with nothing behind it yet: no stalls, changes, causes, failures
    /// or calls, for a caller to fill in what it knows.
    pub fn of_class(scenario: &str, variant: &str, class: VariantClass) -> VariantVerdict {
        VariantVerdict {
            scenario: scenario.to_string(),
            variant: variant.to_string(),
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
            failures: [None, None],
            calls: [None, None],
            reach: None,
            instruction_clock: Vec::new(),
            boots_disagree: Vec::new(),
            events: None,
            estimate: None,
        }
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
    let mut regressions: Vec<Change> = v
        .metrics
        .iter()
        .filter(|m| m.outcome == MetricOutcome::Regression)
        .map(|m| change(m, false))
        .collect();
    let costs: Vec<Change> = v
        .metrics
        .iter()
        .filter(|m| m.outcome == MetricOutcome::Cost)
        .map(|m| change(m, true))
        .collect();
    let mut improvements: Vec<Change> = v
        .metrics
        .iter()
        .filter_map(|m| better(m).map(|within| change(m, within)))
        .collect();
    // What the instruction clock prices at one instruction: the host's MSR writes, judged as
    // a count beside it.
    let events = events_beside(scenario, v);
    if let Some([a, b]) = events.as_ref().and_then(msr_writes_moved) {
        let c = Change {
            metric: MSR_WRITES_METRIC.to_string(),
            unit: "count".into(),
            a,
            b,
            within_jiffy: false,
            undeclared: false,
            tolerance: None,
        };
        if b > a {
            regressions.push(c);
        } else {
            improvements.push(c);
        }
    }
    let mut undecided: Vec<String> = v
        .metrics
        .iter()
        .filter(|m| m.outcome.inconclusive().is_some())
        .map(|m| m.metric.clone())
        .collect();
    let changes: Vec<Change> = v
        .metrics
        .iter()
        .filter(|m| m.outcome == MetricOutcome::WithinTolerance)
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
        VariantClass::NotExercised
    } else if !regressions.is_empty() {
        VariantClass::Regressed
    } else if stalls_gone && stalls_judged_lower {
        VariantClass::Fixed
    } else if improvements.iter().any(|c| !c.within_jiffy) {
        VariantClass::Improved
    } else if !undecided.is_empty() {
        VariantClass::NotDecided
    } else {
        VariantClass::NoChange
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
        instruction_clock: instruction_changes(v),
        boots_disagree: boots_disagree(v),
        events,
        estimate: None,
    }
}

/// The variant's times judged changed on the instruction clock.
fn instruction_changes(v: &VariantAb) -> Vec<InstructionChange> {
    v.metrics
        .iter()
        .filter(|m| {
            matches!(
                m.outcome,
                MetricOutcome::Regression | MetricOutcome::Improvement
            )
        })
        .filter_map(|m| match &m.judgement {
            MetricJudgement::InstructionClock { judged } => Some(InstructionChange {
                metric: m.metric.clone(),
                judged: judged.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// The variant's times whose boots of one side disagree.
fn boots_disagree(v: &VariantAb) -> Vec<BootsDisagreement> {
    v.metrics
        .iter()
        .flat_map(|m| match &m.judgement {
            MetricJudgement::InstructionClock { judged } => judged
                .boots_disagree
                .iter()
                .map(|d| BootsDisagreement {
                    metric: m.metric.clone(),
                    boots: *d,
                })
                .collect(),
            _ => Vec::new(),
        })
        .collect()
}

/// Every variant's verdict, in the order judged.
pub fn verdicts(judged: &[ScenarioAb]) -> Vec<VariantVerdict> {
    judged
        .iter()
        .flat_map(|s| s.variants.iter().map(|v| verdict(&s.scenario, v)))
        .collect()
}
