//! `percpu`: per-CPU data access by offset + preemption toggle vs a per-CPU page table.
//!
//! On arm64 a `this_cpu_*()` op disables preemption, reads the per-CPU offset from
//! `TPIDR_EL1`, computes the address, does the operation, re-enables preemption and checks for
//! a pending reschedule. The proposal (Yang Shi, LSF/MM/BPF 2026; RFC v1, linux-arm-kernel
//! 2026-04-29, "Optimize this_cpu_*() ops for non-x86") gives each CPU its own kernel page
//! table mapping one fixed virtual range to that CPU's per-CPU area, so an op is a plain access
//! at a constant address. It pays by mapping every populated per-CPU chunk page into every
//! CPU's table, an extra TLB flush when they are unmapped, syncing every table on memory
//! hotplug, and a page-table copy per CPU. The model prices one work item of a workload (the
//! kernel events it causes) under each scheme on `cpus` CPUs; `model::percpu` holds the
//! instruction sequences and the per-event op counts. On x86 both schemes are one `%gs`
//! instruction and the change is zero. A kvm backend with per-vCPU page tables comes later.

use super::params::{ParamInfo, SetParam, Settings};
use super::runner::{RunRequest, ScenarioOutcome};
use super::samples::{Series, per_variant};
use super::{Experiment, Observed};
use super::{MetricInfo, ScenarioInfo, Showcase, VariantInfo};
use crate::analysis::compare::against_fastest;

use crate::backend::percpu::{PercpuPlan, PercpuResult, PercpuScheme, Workload};
use crate::backend::{BackendKind, Capabilities};
use crate::error::InputError;
use crate::record::{Finding, VariantRecord};

/// Only a backend that predicts per-CPU access costs runs it.
fn has_predictor(can: Capabilities) -> bool {
    can.percpu
}

/// The catalog entry.
pub static INFO: ScenarioInfo = ScenarioInfo {
    name: "percpu",
    summary: "this_cpu ops by offset + preempt toggle vs a per-CPU page table: predicted sys and wall time per work item",
    variants: &[],
    model_variants: &VARIANTS,
    params: &PARAMS,
    metrics: &METRICS,
    headline: "sys_ns",
    runs_on: has_predictor,
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

/// Most CPUs a sweep may ask for (the model has no CPU-count limit of its own; arm64's
/// `NR_CPUS` maximum is 4096).
const MAX_CPUS: u32 = 4096;

static PARAMS: [ParamInfo; 2] = [
    ParamInfo {
        name: "cpus",
        default: "160",
        doc: "CPUs, each with its own kernel page table under local-map (1-4096)",
        model_only: false,
    },
    ParamInfo {
        name: "workload",
        default: "kernel-build",
        doc: "kernel-build, stress-ng-vm, stress-ng-mmapfork, stress-ng-fork, memcg-create or memory-hotplug",
        model_only: false,
    },
];

static METRICS: [MetricInfo; 10] = [
    MetricInfo {
        name: "sys_ns",
        unit: "ns",
        doc: "kernel time per work item",
    },
    MetricInfo {
        name: "wall_ns",
        unit: "ns",
        doc: "kernel plus user time per work item",
    },
    MetricInfo {
        name: "sys_time_change_pct",
        unit: "%",
        doc: "change of kernel time per item against the offset scheme",
    },
    MetricInfo {
        name: "wall_time_change_pct",
        unit: "%",
        doc: "change of wall time per item against the offset scheme",
    },
    MetricInfo {
        name: "throughput_change_pct",
        unit: "%",
        doc: "change of items per second against the offset scheme (stress-ng's bogo-ops rate)",
    },
    MetricInfo {
        name: "op_cycles",
        unit: "cycles",
        doc: "longest dependent chain of one this_cpu_add()",
    },
    MetricInfo {
        name: "op_ns",
        unit: "ns",
        doc: "one this_cpu_add()",
    },
    MetricInfo {
        name: "ops_per_item",
        unit: "ops",
        doc: "this_cpu ops per work item (call-site counts per kernel event)",
    },
    MetricInfo {
        name: "upkeep_ns",
        unit: "ns",
        doc: "per item: mapping per-CPU chunk pages into every CPU's table, the extra TLB flush, hotplug sync",
    },
    MetricInfo {
        name: "pgtable_bytes",
        unit: "bytes",
        doc: "memory of the per-CPU kernel page tables",
    },
];

/// Per-CPU bytes of one mm, per CPU unit: `mm_init()` → `percpu_counter_init_many()` of
/// `rss_stat` (`NR_MM_COUNTERS` = 4 counters, each an `s32` per CPU) and `mm_alloc_cid()`
/// (`struct mm_cid`: a `u64` and two `int`s, 16 bytes) — the allocations Yang Shi names for
/// fork ("rss counters and mm_cid_cpu").
const MM_PERCPU_BYTES: f64 = 4.0 * 4.0 + 16.0;
/// Per-CPU bytes of one memcg in the local mapping: 2112 KiB for 10,000 memcgs, as the RFC's
/// memcg test reports it (an input of that setup; the rows judge its time and page tables).
const MEMCG_PERCPU_BYTES: f64 = 2112.0 * 1024.0 / 10_000.0;
/// Memcgs the RFC's regression test creates.
const MEMCGS: f64 = 10_000.0;

/// The workloads: the kernel events of one work item. Counts come from what the workload
/// does; the share of time in the kernel is an assumption per workload, said where it is set.
pub const WORKLOADS: [Workload; 6] = [
    // One compile job of `make -j160` (Fedora config): make → sh → gcc → cc1 and as, three
    // fork + exec pairs; cc1 touches ~80 MiB of anonymous memory (20,000 pages). Kernel share
    // assumed 0.3 (no published figure for this machine).
    Workload {
        name: "kernel-build",
        anon_faults: 20_000.0,
        forks: 3.0,
        execs: 3.0,
        memcg_creates: 0.0,
        hotplug_sections: 0.0,
        percpu_alloc_bytes: 6.0 * MM_PERCPU_BYTES,
        percpu_free_bytes: 6.0 * MM_PERCPU_BYTES,
        // The 160 instances' mms.
        percpu_live_bytes: 160.0 * MM_PERCPU_BYTES,
        sys_share: 0.3,
    },
    // stress-ng --vm: unmaps and maps its buffer every pass (no --vm-keep), so one item is one
    // page faulted, written, checked and freed. Kernel share assumed 0.5: the user side writes
    // and verifies patterns (--vm-method all), which the model does not price.
    Workload {
        name: "stress-ng-vm",
        anon_faults: 1.0,
        forks: 0.0,
        execs: 0.0,
        memcg_creates: 0.0,
        hotplug_sections: 0.0,
        percpu_alloc_bytes: 0.0,
        percpu_free_bytes: 0.0,
        percpu_live_bytes: 0.0,
        sys_share: 0.5,
    },
    // stress-ng --mmapfork --mmapfork-bytes 128M: one bogo-op forks a child that maps and
    // touches 128 MiB (32,768 pages) and exits. Kernel share assumed 0.95.
    Workload {
        name: "stress-ng-mmapfork",
        anon_faults: 32_768.0,
        forks: 1.0,
        execs: 0.0,
        memcg_creates: 0.0,
        hotplug_sections: 0.0,
        percpu_alloc_bytes: MM_PERCPU_BYTES,
        percpu_free_bytes: MM_PERCPU_BYTES,
        // The 160 instances' mms.
        percpu_live_bytes: 160.0 * MM_PERCPU_BYTES,
        sys_share: 0.95,
    },
    // stress-ng --fork: fork, the child exits at once, wait. Kernel share assumed 0.9.
    Workload {
        name: "stress-ng-fork",
        anon_faults: 0.0,
        forks: 1.0,
        execs: 0.0,
        memcg_creates: 0.0,
        hotplug_sections: 0.0,
        percpu_alloc_bytes: MM_PERCPU_BYTES,
        percpu_free_bytes: MM_PERCPU_BYTES,
        // The 160 instances' mms.
        percpu_live_bytes: 160.0 * MM_PERCPU_BYTES,
        sys_share: 0.9,
    },
    // The RFC's regression test: create 10,000 memcgs; nothing is freed.
    Workload {
        name: "memcg-create",
        anon_faults: 0.0,
        forks: 0.0,
        execs: 0.0,
        memcg_creates: 1.0,
        hotplug_sections: 0.0,
        percpu_alloc_bytes: MEMCG_PERCPU_BYTES,
        percpu_free_bytes: 0.0,
        percpu_live_bytes: MEMCGS * MEMCG_PERCPU_BYTES,
        sys_share: 0.95,
    },
    // Hot-add of one 128 MiB memory section, all kernel time.
    Workload {
        name: "memory-hotplug",
        anon_faults: 0.0,
        forks: 0.0,
        execs: 0.0,
        memcg_creates: 0.0,
        hotplug_sections: 1.0,
        percpu_alloc_bytes: 0.0,
        percpu_free_bytes: 0.0,
        percpu_live_bytes: 0.0,
        sys_share: 1.0,
    },
];

/// The workload names, for `--set workload=`.
fn workload_names() -> [&'static str; WORKLOADS.len()] {
    WORKLOADS.map(|w| w.name)
}

/// Today's (offset scheme) prediction, against which both variants' changes are stated.
#[derive(Debug, Clone, Copy)]
struct Today {
    sys_ns: f64,
    wall_ns: f64,
}

fn analyse_variant(
    name: &str,
    plan: &PercpuPlan,
    preds: &[PercpuResult],
    today: Option<Today>,
    seed: u64,
) -> VariantRecord {
    let mut series = Series::new();
    for (rep, p) in preds.iter().enumerate() {
        series
            .at(rep)
            .push("sys_ns", "ns", p.sys_ns)
            .push("wall_ns", "ns", p.wall_ns)
            .push("op_cycles", "cycles", p.op_cycles)
            .push("op_ns", "ns", p.op_ns)
            .push("ops_per_item", "ops", p.ops_per_item)
            .push("upkeep_ns", "ns", p.upkeep_ns)
            .push("pgtable_bytes", "bytes", p.pgtable_bytes as f64);
        if let Some(t) = today {
            series
                .push(
                    "sys_time_change_pct",
                    "%",
                    (p.sys_ns / t.sys_ns - 1.0) * 100.0,
                )
                .push(
                    "wall_time_change_pct",
                    "%",
                    (p.wall_ns / t.wall_ns - 1.0) * 100.0,
                )
                .push(
                    "throughput_change_pct",
                    "%",
                    (t.wall_ns / p.wall_ns - 1.0) * 100.0,
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

/// Where the mechanism lives: the RFC's 160-core AmpereOne (on x86 both schemes are one `%gs`
/// instruction and nothing changes).
static SHOWCASES: [Showcase; 2] = [
    Showcase {
        profile: "arm64-server-160",
        variants: &[],
        sets: &[&Set::Workload("kernel-build"), &Set::Cpus(160)],
        why: "002: the RFC's kernel build on its 160-core AmpereOne; dropping the preempt toggle saves about 13% of kernel time",
    },
    Showcase {
        profile: "arm64-server-160",
        variants: &[],
        sets: &[&Set::Workload("stress-ng-fork"), &Set::Cpus(4096)],
        why: "002: fork's per-CPU allocations are mapped into every CPU's page table; at 4096 CPUs that upkeep outweighs the saving and fork regresses",
    },
];

/// The percpu scenario.
#[derive(Debug)]
pub struct Percpu;

/// A percpu parameter set in code (the lab's published setups).
#[derive(Debug, Clone, Copy)]
pub enum Set {
    /// `cpus`.
    Cpus(u32),
    /// `workload`, by name.
    Workload(&'static str),
}

impl SetParam for Set {
    fn key_value(&self) -> (&'static str, String) {
        match *self {
            Set::Cpus(n) => ("cpus", n.to_string()),
            Set::Workload(name) => ("workload", name.to_string()),
        }
    }
}

/// The parameters of one run.
#[derive(Debug, Clone, Copy)]
pub struct PercpuParams {
    /// CPUs of the modelled machine.
    pub cpus: u32,
    /// The event mix.
    pub workload: Workload,
}

impl Experiment for Percpu {
    type Plan = PercpuPlan;
    type Params = PercpuParams;
    const INFO: &'static ScenarioInfo = &INFO;

    fn params(&self, settings: &Settings, _: Capabilities) -> Result<PercpuParams, InputError> {
        let cpus = settings.u32_in("cpus", 1..=MAX_CPUS)?;
        let wname = settings.choice("workload", &workload_names())?;
        let workload = WORKLOADS
            .into_iter()
            .find(|w| w.name == wname)
            .ok_or_else(|| InputError::BadValue {
                key: "workload".into(),
                value: wname.into(),
                why: "the workload has no event mix defined".into(),
            })?;
        Ok(PercpuParams { cpus, workload })
    }

    fn plan(
        &self,
        p: &PercpuParams,
        name: &str,
        _: &RunRequest,
    ) -> Result<Option<PercpuPlan>, InputError> {
        let scheme = match name {
            "offset" => PercpuScheme::Offset,
            "local-map" => PercpuScheme::LocalMap,
            _ => return Ok(None),
        };
        Ok(Some(PercpuPlan {
            scheme,
            cpus: p.cpus,
            workload: p.workload,
        }))
    }

    /// Its variants are all the model's: a backend without the predictor is refused before
    /// ([`ScenarioInfo::require_backend`]), so they are selected as the model's.
    fn plans(
        &self,
        p: &PercpuParams,
        request: &RunRequest,
        _: Capabilities,
    ) -> Result<Vec<(String, PercpuPlan)>, InputError> {
        let model = BackendKind::Model.capabilities();
        let names = INFO.selected_variants(request, model)?;
        super::plan_each(self, p, names, request, model)
    }

    fn showcases(&self) -> &'static [Showcase] {
        &SHOWCASES
    }

    fn analyse(&self, o: Observed<'_, PercpuPlan, PercpuResult>) -> ScenarioOutcome {
        let today = o
            .results
            .iter()
            .zip(o.plans)
            .find(|(_, p)| p.scheme == PercpuScheme::Offset)
            .and_then(|(r, _)| r.as_ref().ok())
            .and_then(|r| r.first())
            .map(|r| Today {
                sys_ns: r.sys_ns,
                wall_ns: r.wall_ns,
            });
        let variants = per_variant(o.names, o.results, |i, name, preds| {
            analyse_variant(name, &o.plans[i], preds, today, o.seed)
        });
        let verdicts = against_fastest(&variants, INFO.headline, o.seed);
        ScenarioOutcome { variants, verdicts }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plans(settings: &Settings) -> Result<Vec<(String, PercpuPlan)>, InputError> {
        let model = BackendKind::Model.capabilities();
        crate::scenario::planned(&Percpu, settings, &RunRequest::default(), model)
    }

    #[test]
    fn every_showcase_is_a_valid_setup_on_a_built_in_profile() {
        for s in &SHOWCASES {
            let sets = crate::scenario::params::sets_of(s.sets);
            let settings = Settings::parse(&INFO, &sets).unwrap();
            assert_eq!(plans(&settings).unwrap().len(), 2);
            crate::model::profile::Profile::load(s.profile).unwrap();
        }
    }

    #[test]
    fn unknown_workloads_and_cpu_counts_are_refused_by_name() {
        for bad in ["workload=mm-stress", "cpus=0", "cpus=5000"] {
            let settings = Settings::parse(&INFO, &[bad.to_string()]).unwrap();
            let err = plans(&settings).unwrap_err();
            let key = bad.split('=').next().unwrap();
            assert!(err.to_string().contains(key), "{bad}: {err}");
        }
    }
}
