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

use super::params::{Choice, Param, Values, whole};
use super::runner::{RunRequest, ScenarioOutcome};
use super::samples::{Series, per_variant};
use super::{
    Headline, HeadlinePair, IcountTolerance, MetricInfo, ScenarioInfo, Showcase, VariantInfo,
};
use super::{Observed, Scenario};
use crate::analysis::Direction;

use crate::error::InputError;
use crate::record::{Finding, VariantRecord};
use hvlab_core::percpu::{PercpuPlan, PercpuResult, PercpuScheme, Workload};
use hvlab_core::{BackendKind, Capabilities};

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
    metrics: &METRICS,
    headline: "sys_ns",
    question: super::Question {
        asks: "what the RFC's per-CPU page tables (local-map) change in kernel time against today's per-CPU offset",
        baseline: Some("offset"),
        judged: &[],
        pairs: &[],
        within: None,
        costs: false,
    },
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

/// Each parameter, declared once.
pub static PARAMS: [Param<PercpuParams>; 3] = [
    // The model has no CPU-count limit of its own; arm64's `NR_CPUS` maximum is 4096.
    whole!(
        cpus,
        "CPUs, each with its own kernel page table under local-map",
        1,
        4096
    ),
    Param {
        name: "workload",
        doc: "the event mix of one item of work",
        values: Values::Choices(&WORKLOAD.names),
        model_only: false,
        read: |p, t| {
            p.workload = WORKLOAD.read(t)?;
            Ok(())
        },
        spell: |p| p.workload.name.to_string(),
    },
    Param {
        name: "sys_pct",
        doc: "the kernel's share of an item's wall time, percent (default: the workload's assumed share, which the wall-time figures rest on)",
        values: Values::Range(1, 100),
        model_only: false,
        read: |p, t| {
            p.sys_pct = t.optional_whole()?;
            Ok(())
        },
        spell: |p| p.sys_pct.map_or_else(String::new, |pct| pct.to_string()),
    },
];

static METRICS: [MetricInfo; 10] = [
    MetricInfo {
        name: "sys_ns",
        unit: "ns",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "kernel time per work item",
    },
    MetricInfo {
        name: "wall_ns",
        unit: "ns",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "kernel plus user time per work item",
    },
    MetricInfo {
        name: "sys_time_change_pct",
        unit: "%",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "change of kernel time per item against the offset scheme",
    },
    MetricInfo {
        name: "wall_time_change_pct",
        unit: "%",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "change of wall time per item against the offset scheme",
    },
    MetricInfo {
        name: "throughput_change_pct",
        unit: "%",
        // Items per second.
        better: Direction::HigherIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "change of items per second against the offset scheme (stress-ng's bogo-ops rate)",
    },
    MetricInfo {
        name: "op_cycles",
        unit: "cycles",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "longest dependent chain of one this_cpu_add()",
    },
    MetricInfo {
        name: "op_ns",
        unit: "ns",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "one this_cpu_add()",
    },
    MetricInfo {
        name: "ops_per_item",
        unit: "ops",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "this_cpu ops per work item (call-site counts per kernel event)",
    },
    MetricInfo {
        name: "upkeep_ns",
        unit: "ns",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "per item: mapping per-CPU chunk pages into every CPU's table, the extra TLB flush, hotplug sync",
    },
    MetricInfo {
        name: "pgtable_bytes",
        unit: "bytes",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
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

/// `workload`: each workload by its name.
static WORKLOAD: Choice<Workload, { WORKLOADS.len() }> = Choice {
    names: {
        let mut names = [""; WORKLOADS.len()];
        let mut i = 0;
        while i < WORKLOADS.len() {
            names[i] = WORKLOADS[i].name;
            i += 1;
        }
        names
    },
    values: WORKLOADS,
};

/// The workload `name` names (`--set workload=NAME`).
pub fn workload(name: &str) -> Result<Workload, InputError> {
    WORKLOADS
        .into_iter()
        .find(|w| w.name == name)
        .ok_or_else(|| InputError::BadValue {
            key: "workload".into(),
            value: name.into(),
            why: format!("workload is one of {}", WORKLOAD.names.join(", ")),
        })
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
    VariantRecord::ok(name, metrics, findings)
}

/// Where the mechanism lives: the RFC's 160-core AmpereOne (on x86 both schemes are one `%gs`
/// instruction and nothing changes).
fn showcases() -> Vec<Showcase<PercpuParams>> {
    let on = |name: &str, cpus| PercpuParams {
        workload: workload(name).unwrap_or(WORKLOADS[0]),
        cpus,
        ..PercpuParams::default()
    };
    vec![
        Showcase {
            profile: "arm64-server-160",
            variants: &[],
            params: on("kernel-build", 160),
            why: "002: the RFC's kernel build on its 160-core AmpereOne; dropping the preempt toggle saves about 13% of kernel time",
            headline: Some(Headline {
                thread: "002",
                before_run: None,
                sides: None,
                pairs: &[HeadlinePair {
                    about: "kernel-build sys time",
                    before: "offset",
                    after: "local-map",
                    metric: "sys_ns",
                    shown: &[],
                }],
            }),
        },
        Showcase {
            profile: "arm64-server-160",
            variants: &[],
            params: on("stress-ng-fork", 4096),
            why: "002: fork's per-CPU allocations are mapped into every CPU's page table; at 4096 CPUs that upkeep outweighs the saving and fork regresses",
            headline: Some(Headline {
                thread: "002",
                before_run: None,
                sides: None,
                pairs: &[HeadlinePair {
                    about: "fork at 4096 CPUs, sys time",
                    before: "offset",
                    after: "local-map",
                    metric: "sys_ns",
                    shown: &[],
                }],
            }),
        },
    ]
}

/// The percpu scenario.
#[derive(Debug)]
pub struct Percpu;

/// The parameters of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PercpuParams {
    /// CPUs of the modelled machine.
    pub cpus: u32,
    /// The event mix.
    pub workload: Workload,
    /// The kernel's share of an item's wall time, %, in place of the workload's assumption.
    pub sys_pct: Option<u32>,
}

impl Default for PercpuParams {
    /// The RFC's kernel build on its 160-core machine.
    fn default() -> PercpuParams {
        PercpuParams {
            cpus: 160,
            workload: WORKLOADS[0],
            sys_pct: None,
        }
    }
}

impl PercpuParams {
    /// The workload with the kernel share `sys_pct` gives it, if any.
    fn workload(&self) -> Workload {
        Workload {
            sys_share: self
                .sys_pct
                .map_or(self.workload.sys_share, |pct| f64::from(pct) / 100.0),
            ..self.workload
        }
    }
}

impl Scenario for Percpu {
    type Plan = PercpuPlan;
    type Params = PercpuParams;
    const INFO: &'static ScenarioInfo = &INFO;
    const PARAMS: &'static [Param<PercpuParams>] = &PARAMS;

    fn plan(
        &self,
        name: &str,
        request: &RunRequest<PercpuParams>,
    ) -> Result<Option<PercpuPlan>, InputError> {
        let scheme = match name {
            "offset" => PercpuScheme::Offset,
            "local-map" => PercpuScheme::LocalMap,
            _ => return Ok(None),
        };
        Ok(Some(PercpuPlan {
            scheme,
            cpus: request.params.cpus,
            workload: request.params.workload(),
        }))
    }

    /// Its variants are all the model's: a backend without the predictor is refused before
    /// ([`ScenarioInfo::require_backend`]), so they are selected as the model's.
    fn plans(
        &self,
        request: &RunRequest<PercpuParams>,
        _: Capabilities,
    ) -> Result<Vec<(String, PercpuPlan)>, InputError> {
        let model = BackendKind::Model.capabilities();
        let names = INFO.selected_variants(&request.variants, model)?;
        super::plan_each(self, names, request, model)
    }

    fn showcases(&self) -> Vec<Showcase<PercpuParams>> {
        showcases()
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
        ScenarioOutcome { variants }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_showcase_is_a_valid_setup_on_a_built_in_profile() {
        for s in showcases() {
            let request = RunRequest::new(s.params);
            let model = BackendKind::Model.capabilities();
            assert_eq!(
                crate::scenario::planned(&Percpu, &request, model)
                    .unwrap()
                    .len(),
                2
            );
            crate::model::profile::Profile::load(s.profile).unwrap();
        }
    }

    #[test]
    fn sys_pct_replaces_the_workloads_assumed_kernel_share() {
        let share = |sets: &[&str]| {
            crate::scenario::plans_of(&Percpu, sets, &["offset"], BackendKind::Model).unwrap()[0]
                .1
                .workload
                .sys_share
        };
        assert_eq!(share(&[]), 0.3, "kernel-build's assumption");
        assert_eq!(share(&["sys_pct=60"]), 0.6);
        assert_eq!(share(&["workload=stress-ng-vm", "sys_pct=57"]), 0.57);
        let bad = crate::scenario::plans_of(&Percpu, &["sys_pct=0"], &[], BackendKind::Model);
        assert!(bad.unwrap_err().to_string().contains("from 1 to 100"));
    }

    #[test]
    fn unknown_workloads_and_cpu_counts_are_refused_by_name() {
        for bad in ["workload=mm-stress", "cpus=0", "cpus=5000"] {
            let err =
                crate::scenario::plans_of(&Percpu, &[bad], &[], BackendKind::Model).unwrap_err();
            let key = bad.split('=').next().unwrap();
            assert!(err.to_string().contains(key), "{bad}: {err}");
        }
    }
}
