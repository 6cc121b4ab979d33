//! `percpu`: per-CPU data access by offset + preemption toggle vs a per-CPU page table.
//!
//! On arm64 a `this_cpu_*()` op disables preemption, reads the per-CPU offset from
//! `TPIDR_EL1`, computes the address, does the operation, re-enables preemption and checks for
//! a pending reschedule. The proposal (Yang Shi, LSF/MM/BPF 2026; RFC v1, linux-arm-kernel
//! 2026-04-29) gives each CPU its own kernel page table mapping one fixed virtual range to that
//! CPU's per-CPU area, so an op is a plain access at a constant address. It costs a page-table
//! copy per CPU, keeping the copies in sync when kernel mappings change, and mapping every
//! per-CPU allocation into every copy. The model predicts the sys-time change per workload; the
//! model backend runs it (a kvm backend with per-vCPU CR3s comes later).

use super::params::{ParamInfo, Settings};
use super::runner::{RunRequest, ScenarioOutcome};
use super::samples::{Series, per_variant};
use super::{Experiment, Observed};
use super::{MetricInfo, ScenarioInfo, VariantInfo};
use crate::analysis::compare::against_fastest;
use crate::backend::percpu::{PercpuPlan, PercpuResult, PercpuScheme, Workload};
use crate::backend::{Backend, BackendKind};
use crate::error::{Error, InputError};
use crate::record::{Finding, VariantRecord};

/// The catalog entry.
pub static INFO: ScenarioInfo = ScenarioInfo {
    name: "percpu",
    summary: "this_cpu ops by offset + preempt toggle vs a per-CPU page table: predicted sys-time change",
    variants: &[],
    model_variants: &VARIANTS,
    params: &PARAMS,
    metrics: &METRICS,
    headline: "sys_ns_per_cpu_s",
    backends: &[BackendKind::Model],
    default_reps: 5,
    default_warmup: 0,
};

static VARIANTS: [VariantInfo; 2] = [
    VariantInfo {
        name: "offset",
        doc: "this_cpu ops through TPIDR_EL1 offset with preempt_disable/enable (arm64 today)",
    },
    VariantInfo {
        name: "local-map",
        doc: "per-CPU kernel page tables mapping a fixed per-CPU virtual range (the proposal)",
    },
];

static PARAMS: [ParamInfo; 2] = [
    ParamInfo {
        name: "cpus",
        default: "160",
        doc: "CPUs (1-256)",
        model_only: false,
    },
    ParamInfo {
        name: "workload",
        default: "kernel-build",
        doc: "kernel-build, mm-stress or fork-heavy",
        model_only: false,
    },
];

static METRICS: [MetricInfo; 5] = [
    MetricInfo {
        name: "sys_ns_per_cpu_s",
        unit: "ns",
        doc: "kernel time one CPU spends on the workload's per-CPU work per second of its sys time",
    },
    MetricInfo {
        name: "sys_time_change_pct",
        unit: "%",
        doc: "change of total sys time against the offset scheme",
    },
    MetricInfo {
        name: "op_ns",
        unit: "ns",
        doc: "cost of one this_cpu op",
    },
    MetricInfo {
        name: "sync_ns_per_cpu_s",
        unit: "ns",
        doc: "page-table copy upkeep per CPU per second",
    },
    MetricInfo {
        name: "pgtable_bytes",
        unit: "bytes",
        doc: "memory for the per-CPU page-table copies",
    },
];

/// The workloads. These densities are assumptions, not measurements: `kernel-build` is set so
/// the model reproduces the RFC's measured 13-18% sys-time reduction on the 160-core
/// AmpereOne (profile arm64-server-160); `mm-stress` has more per-CPU counter traffic (vmstat,
/// memcg) and `fork-heavy` more page-table and per-CPU allocation churn. Replace them with a
/// traced op count to predict a specific workload.
pub const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "kernel-build",
        ops_per_sys_s: 60.0e6,
        kernel_map_changes_per_s: 200.0,
        percpu_allocs_per_s: 500.0,
    },
    Workload {
        name: "mm-stress",
        ops_per_sys_s: 90.0e6,
        kernel_map_changes_per_s: 2_000.0,
        percpu_allocs_per_s: 2_000.0,
    },
    Workload {
        name: "fork-heavy",
        ops_per_sys_s: 70.0e6,
        kernel_map_changes_per_s: 5_000.0,
        percpu_allocs_per_s: 20_000.0,
    },
];

/// The requested variants with their plans.
pub fn plans(
    settings: &Settings,
    request: &RunRequest,
) -> Result<Vec<(String, PercpuPlan)>, InputError> {
    let cpus = settings.u32_in("cpus", 1..=256)?;
    let wname = settings.choice("workload", &["kernel-build", "mm-stress", "fork-heavy"])?;
    let workload = WORKLOADS
        .into_iter()
        .find(|w| w.name == wname)
        .ok_or_else(|| InputError::BadValue {
            key: "workload".into(),
            value: wname.into(),
            why: "the workload has no op mix defined".into(),
        })?;
    let names: Vec<String> = if request.variants.is_empty() {
        VARIANTS.iter().map(|v| v.name.to_string()).collect()
    } else {
        request.variants.clone()
    };
    names
        .into_iter()
        .map(|name| {
            let scheme = match name.as_str() {
                "offset" => PercpuScheme::Offset,
                "local-map" => PercpuScheme::LocalMap,
                _ => return Err(INFO.unknown_variant(&name, BackendKind::Model)),
            };
            Ok((
                name,
                PercpuPlan {
                    scheme,
                    cpus,
                    workload,
                },
            ))
        })
        .collect()
}

fn analyse_variant(
    name: &str,
    plan: &PercpuPlan,
    preds: &[PercpuResult],
    baseline: Option<f64>,
    seed: u64,
) -> VariantRecord {
    let mut series = Series::new();
    for (rep, p) in preds.iter().enumerate() {
        series
            .at(rep)
            .push("sys_ns_per_cpu_s", "ns", p.sys_ns_per_cpu_s)
            .push("op_ns", "ns", p.op_ns)
            .push("sync_ns_per_cpu_s", "ns", p.sync_ns_per_cpu_s)
            .push("pgtable_bytes", "bytes", p.pgtable_bytes as f64);
        if let Some(b) = baseline {
            // Against one second of sys time, of which the offset scheme spends `b` ns on this.
            series.push(
                "sys_time_change_pct",
                "%",
                (p.sys_ns_per_cpu_s - b) / 1e9 * 100.0,
            );
        }
    }
    let metrics = series.finish(preds.len(), name, seed);
    let findings = vec![Finding::PercpuAssumptions {
        workload: plan.workload.name.to_string(),
        cpus: plan.cpus,
    }];
    VariantRecord {
        name: name.to_string(),
        status: crate::record::VariantStatus::Ok,
        metrics,
        findings,
        timeline: Vec::new(),
        pinned_bytes: Vec::new(),
    }
}

/// The percpu scenario.
#[derive(Debug)]
pub struct Percpu;

impl Experiment for Percpu {
    type Plan = PercpuPlan;
    type Sample = PercpuResult;

    fn info(&self) -> &'static ScenarioInfo {
        &INFO
    }

    fn plans(
        &self,
        settings: &Settings,
        request: &RunRequest,
        _backend: BackendKind,
    ) -> Result<Vec<(String, PercpuPlan)>, InputError> {
        plans(settings, request)
    }

    fn execute(&self, backend: &mut dyn Backend, plan: &PercpuPlan) -> Result<PercpuResult, Error> {
        backend.percpu(plan)
    }

    fn analyse(&self, o: Observed<'_, PercpuPlan, PercpuResult>) -> ScenarioOutcome {
        let baseline = o
            .results
            .iter()
            .zip(o.plans)
            .find(|(_, p)| p.scheme == PercpuScheme::Offset)
            .and_then(|(r, _)| r.as_ref().ok())
            .and_then(|r| r.first())
            .map(|r| r.sys_ns_per_cpu_s);
        let variants = per_variant(o.names, o.results, |i, name, preds| {
            analyse_variant(name, &o.plans[i], preds, baseline, o.seed)
        });
        let verdicts = against_fastest(&variants, INFO.headline, "ns", o.seed);
        ScenarioOutcome { variants, verdicts }
    }
}
