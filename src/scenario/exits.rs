//! `exits`: VM-exit roundtrip cost by exit type, and PMU MSR switching.
//!
//! Every exit and re-entry costs a fixed part plus state switching; an exit that needs the VMM
//! (port I/O, MMIO to an unbacked address) adds a return to userspace and back into
//! `KVM_RUN`, while one KVM completes itself (CPUID, a hypercall, an ioeventfd write) does not.
//! With a guest vPMU, KVM also swaps PMU MSRs on every transition (`PERF_GLOBAL_CTRL`, and for
//! PEBS `PEBS_ENABLE`, `DS_AREA`, `PEBS_DATA_CFG`), which `pmu-on`/`pmu-off` compare where
//! `KVM_CAP_PMU_CAPABILITY` exists. The model variants build those lists per MSR before and
//! after the PEBS_ENABLE series over a fastpath exit (the thread's base), report the lists,
//! the writes per roundtrip and the race explorer's findings (`model::exits`).
//!
//! Each repetition builds a VM whose guest runs one exit-causing instruction `iterations`
//! times between its `Start` and `End` signals. `roundtrip_ns` is host time over that batch per
//! iteration; `tsc_per_iter` the guest's own TSC ticks per iteration; `kvm.vcpu.<stat>` the
//! statistics' deltas per iteration. `kvm.vcpu.exits` should be 1.0 per iteration; where a host
//! does not count every roundtrip in it (PVM does not) a self-check finding says so.

use super::memory::{GuestRun, guest_cpl, guest_timeout};
use super::params::{Param, Values, whole};
use super::runner::{RunRequest, ScenarioOutcome};
use super::samples::{Series, per_variant};
use super::{Chart, Observed, Scenario, ValidationPoint};
use super::{IcountTolerance, MetricInfo, ScenarioInfo, VariantInfo};
use crate::analysis::Direction;
use crate::analysis::validate::check;
use crate::error::InputError;
use crate::record::RunRecord;
use crate::record::VariantStatus;
use crate::record::{Finding, SelfCheck, VariantRecord};
use hvlab_core::exits::{
    ExitKind, ExitPlan, ExitResult, PmuConfig, PmuOutcome, PmuScheme, SwitchedVia,
};
use hvlab_core::host::HostInfo;

/// The catalog entry.
pub static INFO: ScenarioInfo = ScenarioInfo {
    name: "exits",
    summary: "VM-exit roundtrip cost by exit type (PIO, MMIO, CPUID, hypercall, HLT, ioeventfd) and vPMU on/off",
    variants: &VARIANTS,
    model_variants: &MODEL_VARIANTS,
    metrics: &METRICS,
    headline: "roundtrip_ns",
    question: super::Question {
        asks: "what each exit type costs per roundtrip, and what the vPMU's MSR switching adds (pmu-on against pmu-off; the model's PMU lists each against the scheme before it)",
        baseline: Some("pmu-off"),
        // The exit types are answered by their cost; the vPMU by a verdict.
        judged: &["pmu-on"],
        // The model's variants are fastpath WRMSR exits, not pio-out like pmu-off: each is
        // judged against its own before (thread 003: the series, then the quiescing fix).
        pairs: &[
            ("vpmu-none", "fastpath"),
            ("vpmu-new", "vpmu-old"),
            ("vpmu-quiesced", "vpmu-new"),
            ("pebs-new", "pebs-old"),
            ("pebs-quiesced", "pebs-new"),
        ],
        within: None,
        costs: true,
    },
    runs_on: super::any_backend,
    default_reps: 10,
    default_warmup: 1,
};

static VARIANTS: [VariantInfo; 10] = [
    VariantInfo {
        name: "pio-out",
        doc: "out to a port the VMM handles (userspace exit)",
    },
    VariantInfo {
        name: "pio-in",
        doc: "in from a port the VMM handles (userspace exit)",
    },
    VariantInfo {
        name: "mmio-write",
        doc: "store to an unbacked GPA (userspace exit)",
    },
    VariantInfo {
        name: "mmio-read",
        doc: "load from an unbacked GPA (userspace exit)",
    },
    VariantInfo {
        name: "cpuid",
        doc: "CPUID leaf 0, completed in KVM",
    },
    VariantInfo {
        name: "hypercall",
        doc: "VMCALL/VMMCALL (by CPU vendor), completed in KVM",
    },
    VariantInfo {
        name: "hlt",
        doc: "HLT with no in-kernel irqchip (userspace exit; CPL0 only)",
    },
    VariantInfo {
        name: "ioeventfd",
        doc: "store to an ioeventfd doorbell, completed in KVM (no userspace exit)",
    },
    VariantInfo {
        name: "pmu-on",
        doc: "pio-out with the guest vPMU enabled (needs KVM_CAP_PMU_CAPABILITY)",
    },
    VariantInfo {
        name: "pmu-off",
        doc: "pio-out with the vPMU disabled by KVM_CAP_PMU_CAPABILITY",
    },
];

static MODEL_VARIANTS: [VariantInfo; 8] = [
    VariantInfo {
        name: "fastpath",
        doc: "model: a WRMSR KVM completes in the run loop's fastpath (handle_fastpath_set_msr_irqoff), no vPMU switching (kvm: unsupported, hvlab's guest arms no LAPIC timer)",
    },
    VariantInfo {
        name: "vpmu-none",
        doc: "model: fastpath exit, guest without a vPMU; perf still switches PMU MSRs when the host has PEBS events",
    },
    VariantInfo {
        name: "vpmu-old",
        doc: "model: fastpath exit, guest vPMU without PEBS, MSRs listed before the PEBS_ENABLE series",
    },
    VariantInfo {
        name: "vpmu-new",
        doc: "model: fastpath exit, guest vPMU without PEBS, after the series (PEBS isolation: PEBS_ENABLE never switched)",
    },
    VariantInfo {
        name: "vpmu-quiesced",
        doc: "model: vpmu-new, and KVM zeroes PERF_GLOBAL_CTRL before building the list (Peter Zijlstra's point)",
    },
    VariantInfo {
        name: "pebs-old",
        doc: "model: fastpath exit, guest using PEBS, before the series",
    },
    VariantInfo {
        name: "pebs-new",
        doc: "model: fastpath exit, guest using PEBS, after the series",
    },
    VariantInfo {
        name: "pebs-quiesced",
        doc: "model: pebs-new, and KVM zeroes PERF_GLOBAL_CTRL before building the list",
    },
];

/// Each parameter, declared once.
pub static PARAMS: [Param<ExitParams>; 6] = [
    whole!(iterations, "exits per repetition", 1, 10_000_000),
    guest_cpl(),
    guest_timeout("watchdog for one repetition, ms"),
    Param {
        name: "host_pebs",
        doc: "model: the host has PEBS events active (1) or not (0)",
        values: Values::Range(0, 1),
        model_only: true,
        read: |p, t| {
            p.host_pebs = t.flag()?;
            Ok(())
        },
        spell: |p| u8::from(p.host_pebs).to_string(),
    },
    Param {
        name: "host_pebs_data_cfg",
        doc: "model: the host's PEBS event uses adaptive PEBS data groups, so PEBS_DATA_CFG is non-zero (1) or not (0)",
        values: Values::Range(0, 1),
        model_only: true,
        read: |p, t| {
            p.host_pebs_data_cfg = t.flag()?;
            Ok(())
        },
        spell: |p| u8::from(p.host_pebs_data_cfg).to_string(),
    },
    whole!(
        guest_pebs_data_cfg,
        "model: the PEBS guest's PEBS_DATA_CFG (the host's is 3, memory info and GPRs); the thread does not give it, and the default 1 (memory info alone) differs from the host's, so no entry drops out of the lists by coincidence",
        0,
        255,
        model
    ),
];

/// An exit's roundtrip on the instruction clock: two boots of one kernel agree on every exit
/// within 0.03% (under 2 of about 5,000 instructions), and one boot's repetitions within ±5
/// instructions, so 50 instructions (five times the repetitions' range) or 0.5% is already a
/// change of the exit path, where a time's default would let 200 pass.
const ROUNDTRIP_ICOUNT: IcountTolerance = IcountTolerance {
    relative: 0.005,
    floor_insn: 50.0,
};

static METRICS: [MetricInfo; 7] = [
    MetricInfo {
        name: "roundtrip_ns",
        unit: "ns",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: ROUNDTRIP_ICOUNT,
        doc: "host time from Start to End per iteration (exit + handling + re-entry)",
    },
    MetricInfo {
        name: "tsc_per_iter",
        unit: "ticks",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "guest TSC ticks per iteration",
    },
    MetricInfo {
        name: "userspace_exits_per_iter",
        unit: "ratio",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "exits that reached hvlab, per iteration",
    },
    MetricInfo {
        name: "kvm.vcpu.<stat>",
        unit: "ratio",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "vCPU statistic deltas per iteration (exits, io_exits, mmio_exits, ...)",
    },
    MetricInfo {
        name: "msr_writes_per_roundtrip",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "MSR writes per roundtrip (model PMU variants): the loads plus the explicit WRMSRs",
    },
    MetricInfo {
        name: "msr_loads_per_roundtrip",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "MSR loads the CPU does per roundtrip from the switch lists and the VMCS fields (model PMU variants)",
    },
    MetricInfo {
        name: "wrmsr_per_roundtrip",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "explicit WRMSRs before VM-entry per roundtrip (model PMU variants)",
    },
];

/// Metrics, self-check findings and verdicts.
pub fn analyse(
    names: &[String],
    kinds: &[ExitKind],
    results: &[Result<Vec<ExitResult>, VariantStatus>],
    seed: u64,
) -> ScenarioOutcome {
    let variants = per_variant(names, results, |i, name, batches| {
        analyse_variant(name, kinds[i], batches, seed)
    });
    ScenarioOutcome { variants }
}

fn analyse_variant(name: &str, kind: ExitKind, batches: &[ExitResult], seed: u64) -> VariantRecord {
    let mut series = Series::new();
    for (rep, b) in batches.iter().enumerate() {
        let n = b.iterations.max(1) as f64;
        series
            .at(rep)
            .push("roundtrip_ns", "ns", b.elapsed_ns as f64 / n)
            .push("tsc_per_iter", "ticks", b.tsc_ticks as f64 / n)
            .push(
                "userspace_exits_per_iter",
                "ratio",
                b.userspace_exits as f64 / n,
            );
        for (stat, _, delta) in &b.kvm_stats {
            series.push(stat, "ratio", *delta as f64 / n);
        }
        if let Some(pmu) = &b.pmu {
            series
                .push("msr_writes_per_roundtrip", "count", f64::from(pmu.writes()))
                .push("msr_loads_per_roundtrip", "count", f64::from(pmu.loads()))
                .push("wrmsr_per_roundtrip", "count", f64::from(pmu.wrmsrs));
        }
    }
    let metrics = series.finish(batches.len(), name, seed);
    let mut findings = Vec::new();
    if let Some(pmu) = batches.first().and_then(|b| b.pmu.as_ref()) {
        findings.extend(pmu_findings(pmu));
    }
    let exits = metrics.get("kvm.vcpu.exits").map_or(1.0, |m| m.median);
    if batches.iter().any(|b| !b.kvm_stats.is_empty()) && (exits - 1.0).abs() > 0.05 {
        findings.push(Finding::SelfCheck {
            check: SelfCheck::ExitsStatistic,
            variant: name.to_string(),
            metric: "kvm.vcpu.exits".into(),
            expected: 1.0,
            observed: exits,
        });
    }
    let userspace = metrics
        .get("userspace_exits_per_iter")
        .map_or(0.0, |m| m.median);
    let expected = if kind.exits_to_userspace() { 1.0 } else { 0.0 };
    if (userspace - expected).abs() > 0.05 {
        findings.push(Finding::SelfCheck {
            check: SelfCheck::UserspaceExits,
            variant: name.to_string(),
            metric: "userspace_exits_per_iter".into(),
            expected,
            observed: userspace,
        });
    }
    VariantRecord::ok(name, metrics, findings)
}

/// What the PMU model found: the lists as built, the host-PEBS restriction, the races.
fn pmu_findings(pmu: &PmuOutcome) -> Vec<Finding> {
    let names = |via: SwitchedVia| -> Vec<String> {
        pmu.msrs
            .iter()
            .filter(|m| m.via == via)
            .map(|m| m.msr.name().to_string())
            .collect()
    };
    let mut out = vec![Finding::PmuMsrLists {
        load_list: names(SwitchedVia::LoadList),
        vmcs_fields: names(SwitchedVia::VmcsField),
        dropped: names(SwitchedVia::Dropped),
        wrmsrs: pmu.wrmsrs,
    }];
    if pmu.guest_pebs_suppressed {
        out.push(Finding::GuestPebsDisabled);
    }
    out.extend(pmu.races.iter().cloned().map(Finding::RaceExplored));
    out
}

/// The exits scenario.
#[derive(Debug)]
pub struct Exits;

/// The parameters of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExitParams {
    /// Roundtrips per batch.
    pub iterations: u64,
    /// The guest's privilege level and watchdog per batch.
    pub guest: GuestRun,
    /// The host has a PEBS event of its own (model).
    pub host_pebs: bool,
    /// The host's PEBS event uses PEBS_DATA_CFG (model).
    pub host_pebs_data_cfg: bool,
    /// The guest's PEBS_DATA_CFG value (model).
    pub guest_pebs_data_cfg: u64,
}

impl Default for ExitParams {
    fn default() -> ExitParams {
        ExitParams {
            iterations: 10_000,
            guest: GuestRun::default(),
            host_pebs: true,
            host_pebs_data_cfg: true,
            guest_pebs_data_cfg: 1,
        }
    }
}

super::memory::runs_guest!(ExitParams);

impl Scenario for Exits {
    type Plan = ExitPlan;
    type Params = ExitParams;
    const INFO: &'static ScenarioInfo = &INFO;
    const PARAMS: &'static [Param<ExitParams>] = &PARAMS;

    fn plan(
        &self,
        name: &str,
        request: &RunRequest<ExitParams>,
    ) -> Result<Option<ExitPlan>, InputError> {
        let p = &request.params;
        let pmu = |guest_vpmu, guest_pebs, scheme| {
            Some(PmuConfig {
                guest_vpmu,
                guest_pebs,
                host_pebs: p.host_pebs,
                host_pebs_data_cfg: p.host_pebs_data_cfg,
                guest_pebs_data_cfg: p.guest_pebs_data_cfg,
                scheme,
            })
        };
        // The thread measures PMU switching over a fastpath exit.
        let fast = ExitKind::Fastpath;
        let (kind, pmu) = match name {
            "fastpath" => (fast, None),
            "vpmu-none" => (fast, pmu(false, false, PmuScheme::Old)),
            "vpmu-old" => (fast, pmu(true, false, PmuScheme::Old)),
            "vpmu-new" => (fast, pmu(true, false, PmuScheme::New)),
            "vpmu-quiesced" => (fast, pmu(true, false, PmuScheme::NewQuiesced)),
            "pebs-old" => (fast, pmu(true, true, PmuScheme::Old)),
            "pebs-new" => (fast, pmu(true, true, PmuScheme::New)),
            "pebs-quiesced" => (fast, pmu(true, true, PmuScheme::NewQuiesced)),
            other => match ExitKind::ALL.into_iter().find(|k| k.name() == other) {
                Some(kind) => (kind, None),
                None => return Ok(None),
            },
        };
        Ok(Some(ExitPlan {
            kind,
            iterations: p.iterations,
            cpl: p.guest.cpl,
            timeout: p.guest.timeout,
            pmu,
        }))
    }

    fn analyse(&self, o: Observed<'_, ExitPlan, ExitResult>) -> ScenarioOutcome {
        let kinds: Vec<ExitKind> = o.plans.iter().map(|p| p.kind).collect();
        analyse(o.names, &kinds, o.results, o.seed)
    }

    fn showcases(&self) -> Vec<super::Showcase<ExitParams>> {
        vec![super::Showcase {
            profile: "intel-spr-vmx",
            variants: &[
                "fastpath",
                "vpmu-none",
                "vpmu-old",
                "vpmu-new",
                "vpmu-quiesced",
                "pebs-old",
                "pebs-new",
            ],
            params: ExitParams {
                host_pebs: true,
                iterations: 1000,
                ..ExitParams::default()
            },
            why: "003 (PEBS_ENABLE on KVM transitions): on a PEBS-isolating Intel server with a host PEBS event, the series drops 7 MSR writes per fastpath roundtrip (3 with guest PEBS); the race explorer finds the stuck PEBS_ENABLE bit before it for every guest, a stale PERF_GLOBAL_CTRL after it, and neither once KVM zeroes PERF_GLOBAL_CTRL first",
            headline: Some(super::Headline {
                thread: "003",
                before_run: None,
                sides: None,
                pairs: &[
                    super::HeadlinePair {
                        about: "a guest using PEBS, per roundtrip",
                        before: "pebs-old",
                        after: "pebs-new",
                        metric: "roundtrip_ns",
                        shown: &["msr_writes_per_roundtrip"],
                    },
                    super::HeadlinePair {
                        about: "a guest vPMU without PEBS, per roundtrip",
                        before: "vpmu-old",
                        after: "vpmu-new",
                        metric: "roundtrip_ns",
                        shown: &["msr_writes_per_roundtrip"],
                    },
                ],
            }),
        }]
    }

    fn charts(&self, _record: &RunRecord) -> Vec<Chart> {
        vec![Chart::Bars {
            metric: INFO.headline,
            title: "exit roundtrip by exit type",
        }]
    }

    fn validation(&self, host: &HostInfo) -> Option<ValidationPoint<ExitParams>> {
        // An emulated CPU takes tens of microseconds per exit: fewer iterations there.
        let params = ExitParams {
            iterations: if host.cpu_emulated() { 200 } else { 5000 },
            ..ExitParams::default()
        };
        Some(ValidationPoint {
            variants: &["pio-out", "mmio-read", "cpuid"],
            params,
            model_params: params,
            checks: |model, kvm, v, time| {
                check(model, kvm, v, "roundtrip_ns", time)
                    .into_iter()
                    .collect()
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvlab_core::BackendKind;

    #[test]
    fn every_variant_has_a_kind_and_unknown_ones_list_the_rest() {
        let all = crate::scenario::plans_of(&Exits, &[], &[], BackendKind::Kvm).unwrap();
        assert_eq!(all.len(), 10);
        assert!(all.iter().all(|(n, p)| p.kind.name() == n));
        assert!(
            crate::scenario::plans_of(&Exits, &[], &["rdmsr"], BackendKind::Kvm)
                .unwrap_err()
                .to_string()
                .contains("ioeventfd")
        );
    }

    fn batch(exits: i128, userspace: u64) -> ExitResult {
        ExitResult {
            iterations: 1000,
            elapsed_ns: 18_400_000,
            tsc_ticks: 45_000_000,
            userspace_exits: userspace,
            kvm_stats: vec![("kvm.vcpu.exits".into(), "count".into(), exits)],
            pmu: None,
        }
    }

    #[test]
    fn self_checks_flag_an_uncounted_exit_and_a_missed_userspace_exit() {
        let out = analyse(
            &["pio-out".into(), "cpuid".into(), "ioeventfd".into()],
            &[ExitKind::PioOut, ExitKind::Cpuid, ExitKind::Ioeventfd],
            &[
                Ok(vec![batch(1000, 1000); 3]),
                Ok(vec![batch(0, 0); 3]),
                Ok(vec![batch(1000, 1000); 3]),
            ],
            1,
        );
        assert!(
            out.variants[0].findings.is_empty(),
            "{:?}",
            out.variants[0].findings
        );
        assert_eq!(out.variants[0].metrics["roundtrip_ns"].median, 18_400.0);
        assert_eq!(out.variants[0].metrics["tsc_per_iter"].median, 45_000.0);
        let cpuid = &out.variants[1].findings;
        assert_eq!(cpuid.len(), 1);
        assert!(
            cpuid[0]
                .to_string()
                .contains("does not count every roundtrip")
        );
        let ioeventfd = &out.variants[2].findings;
        assert!(
            ioeventfd[0]
                .to_string()
                .contains("reached the VMM 1.00 times"),
            "{ioeventfd:?}"
        );
    }
}
