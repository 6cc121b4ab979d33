//! Judging a kab: each metric of each variant, A against B, as far as the accelerator lets it
//! be trusted, corrected over the kab's family; each variant's verdict from its metrics and
//! stalls; and the judgement a kab's gate reads.

mod busy;
mod events;
mod metric;
mod stall;
mod verdict;

use serde::Serialize;

use crate::analysis::calls::{FunctionCalls, SideEvents, side_calls, side_events};
use crate::analysis::class::VariantClass;
use crate::analysis::direction::Declared;
use crate::analysis::icount::{self, insn_per};
use crate::analysis::metric_ab::{MetricJudgement, NotJudged};
use crate::analysis::multilevel::{self, Costs};
use crate::kernel::vm::Accel;
use crate::lab::fidelity::patch::{self};
use crate::record::{RunRecord, VariantRecord, VariantStatus, pooled};
use crate::scenario;
use hvlab_core::host::Clock;

use super::{BootSummary, GuestFailure};
use busy::decided_by_exact_counts;
use metric::{
    by_boots, count, declared_as, instruction_clock, jiffies_metric, jiffies_on_instruction_clock,
    judge_must_equal, pages_touched, rank,
};
use stall::stalls_ab;

pub(super) use busy::host_busy_during;
pub(crate) use busy::{busy_during_boot, not_judged_on_a_busy_host};
pub use events::{EventsBeside, HostEventAb, KeyMoved, KvmCountAb, MSR_WRITES_METRIC};
pub use metric::{
    CorrectedP, Inconclusive, MetricAb, MetricOutcome, Trust, Unsettled, WorseWay, correct_family,
};
pub use stall::{StallAb, StallSide};
pub use verdict::{
    Cause, Change, GraceWait, StallReps, VariantVerdict, mark_given, verdict, verdicts,
};

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
    /// The host kernel's events on A and on B, counted with the calls (`None`: that side
    /// counted none).
    #[serde(default, skip_serializing_if = "no_events")]
    pub events: [Option<SideEvents>; 2],
    /// Pages the guest touched per pass on A and on B, when the scenario counts its faults
    /// against them (memory's `FaultsPerPage`): what a fault count's mechanism is read from.
    #[serde(skip)]
    pub pages_touched: [Option<u64>; 2],
}

fn uncounted(calls: &[Option<Vec<FunctionCalls>>; 2]) -> bool {
    calls.iter().all(Option::is_none)
}

fn no_events(events: &[Option<SideEvents>; 2]) -> bool {
    events.iter().all(Option::is_none)
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

/// A time: on the wall clock, or on the instruction clock (its units, [`Clock::unit`]).
fn is_time(unit: &str) -> bool {
    matches!(
        unit,
        "ns" | "us" | "ms" | "s" | "insn" | "kinsn" | "Minsn" | "Ginsn"
    )
}

/// Whether every run of both sides measured on QEMU's instruction clock, where a time is the
/// instructions the guest ran: the same from one repetition and one boot to the next, so it is
/// judged under TCG too.
fn on_instruction_clock(runs: [&[&RunRecord]; 2]) -> bool {
    runs.iter().all(|side| !side.is_empty())
        && runs
            .iter()
            .flat_map(|side| side.iter())
            .all(|r| r.host.clock == Clock::Icount)
}

/// One side's samples of `metric` of `variant`, one list per boot: each run is one boot's.
fn per_boot(runs: &[&RunRecord], variant: &str, metric: &str) -> Vec<Vec<f64>> {
    runs.iter()
        .map(|r| pooled(std::slice::from_ref(r), variant, metric))
        .filter(|x| !x.is_empty())
        .collect()
}

/// `metric` of `variant` judged on the instruction clock from each side's boots, its values
/// `insn_per_unit` instructions each ([`icount::judge`]).
fn in_instructions(
    [ra, rb]: [&[&RunRecord]; 2],
    variant: &str,
    metric: &str,
    insn_per_unit: f64,
    tolerance: icount::IcountTolerance,
) -> icount::IcountAb {
    let insn = |runs: &[&RunRecord]| -> Vec<Vec<f64>> {
        per_boot(runs, variant, metric)
            .into_iter()
            .map(|b| b.into_iter().map(|x| x * insn_per_unit).collect())
            .collect()
    };
    icount::judge(&insn(ra), &insn(rb), tolerance)
}

/// The boots a side from which a wall-clock time is judged with the boot as the unit. Two a
/// side give Welch's interval one or two degrees of freedom: its 97.5% quantile is 4.3–12.7
/// alone and near 100 once the level is divided among a kab's time comparisons, so nothing
/// could be called; with two, the repetitions stay pooled under the family's rank rule, as a
/// series' two boots a commit are judged.
const BOOTS_AS_UNIT: usize = 3;

/// A wall-clock boot's cost until its first command, in seconds: what a debian:7.3 boot under
/// TCG took (3.7–3.9 s measured); under KVM acceleration a boot is shorter, so the
/// repetitions per boot suggested are at most this many.
const WALL_BOOT_S: f64 = 3.8;

/// What a boot and a repetition cost on these runs: [`WALL_BOOT_S`], and the runs' wall time
/// over the repetitions they made (every variant's); a repetition's cost is 0 (no
/// suggestion) when the runs' times cannot be read.
fn costs(runs: [&[&RunRecord]; 2]) -> Costs {
    let (mut seconds, mut reps) = (0.0, 0usize);
    for r in runs.iter().flat_map(|side| side.iter()) {
        let at = |t: &str| humantime::parse_rfc3339_weak(t).ok();
        let Some(took) = at(&r.finished_at)
            .zip(at(&r.started_at))
            .and_then(|(end, start)| end.duration_since(start).ok())
        else {
            continue;
        };
        seconds += took.as_secs_f64();
        reps += r
            .variants
            .iter()
            .filter_map(|v| v.metrics.values().map(|m| m.samples.len()).max())
            .sum::<usize>();
    }
    Costs {
        boot_s: WALL_BOOT_S,
        rep_s: if reps == 0 {
            0.0
        } else {
            seconds / reps as f64
        },
    }
}

/// The times (`variant: metric`) a kab judged on the instruction clock changed while a side
/// had a single boot: each kernel should boot once more, since nothing yet says whether its
/// boots agree (a guest that is not deterministic moves between boots what no patch changed).
/// After the second boot a side's disagreeing boots become a finding
/// (`VariantVerdict::boots_disagree`) and widen the metric's tolerance, and the kab is judged
/// again. The lifecycle's times read in jiffies are not asked: the stall rule reads them, and
/// what it calls is a grace period gained or lost (half a jiffy and more, where the guest's
/// nondeterminism never moved a time by more than 2.1% before its randomness was fixed) or a
/// cost beside the verdict. Pure: the caller decides whether it boots.
pub fn changed_with_one_boot(judged: &[ScenarioAb]) -> Vec<String> {
    judged
        .iter()
        .flat_map(|s| &s.variants)
        .flat_map(|v| v.metrics.iter().map(move |m| (v, m)))
        .filter(|(_, m)| m.trust != Trust::Jiffies)
        .filter(|(_, m)| match &m.judgement {
            MetricJudgement::InstructionClock { judged } => {
                (judged.call != icount::IcountCall::Same) && judged.boots.contains(&1)
            }
            _ => false,
        })
        .map(|(v, m)| format!("{}: {}", v.variant, m.metric))
        .collect()
}

/// One side's calls of `variant`, summed over its runs.
fn calls_of(runs: &[&RunRecord], variant: &str) -> Option<Vec<FunctionCalls>> {
    side_calls(runs.iter().map(|r| r.calls.as_slice()), variant)
}

/// One side's host events of `variant`, summed over its runs.
fn events_of(runs: &[&RunRecord], variant: &str) -> Option<SideEvents> {
    side_events(runs.iter().map(|r| r.calls.as_slice()), variant)
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
    let mut out = judge_pair(scenarios, asked, sides, accel, threshold);
    correct_family(&mut out, threshold);
    out
}

/// The pair judge: B's runs against A's, each comparison at its own p until
/// [`correct_family`]. A kab corrects its one pair's ([`judge`]); `--per-patch` corrects every
/// pair of its table together, and a bisection's step its pair alone
/// (`crate::lab::series::judge_commit`).
pub fn judge_pair(
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
        let icount = on_instruction_clock([&ra, &rb]);
        let mut variants = Vec::new();
        for name in variant_names(scenario, asked, [&ra, &rb]) {
            let on_a = side_variant(&ra, &name, scenario, sides[0].failed_commands);
            let on_b = side_variant(&rb, &name, scenario, sides[1].failed_commands);
            let (v, vb) = match (on_a, on_b) {
                (Ok(v), Ok(vb)) => (v, vb),
                (a, b) => {
                    variants.push(VariantAb {
                        calls: [calls_of(&ra, &name), calls_of(&rb, &name)],
                        events: [events_of(&ra, &name), events_of(&rb, &name)],
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
                let mut not_judged =
                    (accel != Accel::Kvm && !icount).then_some(NotJudged::TimeUnderTcg);
                // The lifecycle's ioctl times in the guest's jiffies: judged everywhere. On the
                // instruction clock its other times too (a VM's ready time, a boot's memslot
                // wait): there a jiffy is exact, and what moves them by less than half of one
                // is no grace period gained or lost but an expedited one's cost.
                if scenario == crate::scenario::Kind::Lifecycle.name()
                    && (name.starts_with("ioctl.") || icount)
                    && (m.unit == "ms" || m.unit == "Minsn")
                {
                    let (ja, jb) = (patch::jiffy_ms(&ra), patch::jiffy_ms(&rb));
                    let xa_j: Vec<f64> = xa.iter().map(|x| x / ja).collect();
                    let xb_j: Vec<f64> = xb.iter().map(|x| x / jb).collect();
                    let metric = name.trim_end_matches("_ms").to_string();
                    let m = match insn_per(&m.unit).filter(|_| icount) {
                        // A virtual tick is a count of instructions: judged exactly like any
                        // time there, outside the family, so a few repetitions settle it.
                        Some(k) => {
                            let judged = in_instructions(
                                [&ra, &rb],
                                &v.name,
                                name,
                                k,
                                declared(name).icount_tolerance,
                            );
                            jiffies_on_instruction_clock(&metric, xa_j, xb_j, judged)
                        }
                        None => jiffies_metric(&metric, xa_j, xb_j, threshold),
                    };
                    metrics.push(declared_as(m, declared(name), threshold));
                    if icount {
                        not_judged = Some(NotJudged::JudgedInJiffies);
                    }
                }
                if not_judged.is_none() {
                    // On the instruction clock: exactly, against the spread and the metric's
                    // tolerance, outside the family.
                    if let Some(k) = insn_per(&m.unit).filter(|_| icount) {
                        let judged = in_instructions(
                            [&ra, &rb],
                            &v.name,
                            name,
                            k,
                            declared(name).icount_tolerance,
                        );
                        let m = instruction_clock(name, &m.unit, xa, xb, judged);
                        metrics.push(declared_as(m, declared(name), threshold));
                        continue;
                    }
                    // On the wall clock with boots to compare: the boot is the unit.
                    let (ba, bb) = (per_boot(&ra, &v.name, name), per_boot(&rb, &v.name, name));
                    if !icount && ba.len() >= BOOTS_AS_UNIT && bb.len() >= BOOTS_AS_UNIT {
                        let judged = multilevel::judge(&ba, &bb, threshold, costs([&ra, &rb]));
                        let m = by_boots(name, &m.unit, xa, xb, judged, threshold);
                        metrics.push(declared_as(m, declared(name), threshold));
                        continue;
                    }
                }
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
                events: [events_of(&ra, &v.name), events_of(&rb, &v.name)],
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
    let regression = verdicts.iter().any(|v| v.class == VariantClass::Regressed);
    let inconclusive = judged
        .iter()
        .flat_map(|s| &s.variants)
        .flat_map(|v| &v.metrics)
        .filter(|m| m.outcome.inconclusive().is_some())
        .count();
    Judgement {
        verdicts,
        regression,
        inconclusive,
    }
}

#[cfg(test)]
mod tests;
