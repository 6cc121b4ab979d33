//! `memslots`: memslot updates as a VM's slot count grows, the KVM selftests'
//! `memslot_perf_test` question ("what does one map, unmap or move cost at N slots?").
//!
//! Each repetition builds a VM with no vCPU and applies one update to each of `slots` memslots
//! in turn (`add`: creates them one by one; `move` and `delete`: first adds them untimed, then
//! moves or deletes each), timing every `KVM_SET_USER_MEMORY_REGION`. Since Linux 5.17 an
//! update edits two sets of trees (O(log n)) and waits for one expedited SRCU grace period per
//! set swap: one for a create, two for a delete or a move, which first publishes an invalid
//! copy of the slot (`kvm_set_memslot()`, `kvm_invalidate_memslot()`). So the model predicts
//! a flat cost per update as slots grow, and a delete or move at about twice a create; the kvm
//! backend measures both on this host.

use super::params::{Param, Text, Values, size_text, whole};
use super::runner::{RunRequest, ScenarioOutcome};
use super::samples::{Series, per_variant};
use super::{Chart, Observed, Scenario};
use super::{IcountTolerance, MetricInfo, ScenarioInfo, VariantInfo};
use crate::analysis::Direction;
use crate::error::InputError;
use crate::record::{RunRecord, VariantRecord};
use hvlab_core::memslots::{MemslotPlan, MemslotResult, SlotOp};

/// The catalog entry.
pub static INFO: ScenarioInfo = ScenarioInfo {
    name: "memslots",
    summary: "memslot updates at scale: add, move and delete one slot at a time, each with its SRCU grace periods",
    variants: &VARIANTS,
    model_variants: &[],
    metrics: &METRICS,
    headline: "op_us",
    question: super::Question {
        asks: "whether one memslot update costs more as the VM's slot count grows (the last tenth of the updates against the first)",
        baseline: None,
        judged: &[],
        pairs: &[],
        within: Some(("last_us", "first_us")),
        costs: false,
    },
    runs_on: super::any_backend,
    default_reps: 5,
    default_warmup: 1,
};

static VARIANTS: [VariantInfo; 3] = [
    VariantInfo {
        name: "add",
        doc: "KVM_MR_CREATE: slot after slot until --set slots (one set swap each)",
    },
    VariantInfo {
        name: "move",
        doc: "KVM_MR_MOVE: every slot moved above the others (an invalidating swap, then the swap)",
    },
    VariantInfo {
        name: "delete",
        doc: "KVM_MR_DELETE: every slot deleted in order (an invalidating swap, then the swap)",
    },
];

/// Each parameter, declared once.
pub static PARAMS: [Param<MemslotsParams>; 2] = [
    whole!(
        slots,
        "memslots in the VM (at most x86's KVM_USER_MEM_SLOTS; the kvm backend checks the host's KVM_CAP_NR_MEMSLOTS)",
        1,
        MAX_SLOTS
    ),
    Param {
        name: "slot_size",
        doc: "bytes per slot, a multiple of 4KiB up to 1GiB; reserved, never touched",
        values: Values::Described,
        model_only: false,
        read: |p, t| {
            p.slot_bytes = slot_bytes(t)?;
            Ok(())
        },
        spell: |p| size_text(p.slot_bytes),
    },
];

/// `slot_size`: a non-zero multiple of 4 KiB up to 1 GiB.
fn slot_bytes(t: &Text<'_>) -> Result<u64, InputError> {
    let bytes = t.bytes()?;
    if bytes == 0 || bytes % 4096 != 0 || bytes > 1 << 30 {
        return Err(t.bad("slot_size must be a non-zero multiple of 4KiB up to 1GiB"));
    }
    Ok(bytes)
}

static METRICS: [MetricInfo; 6] = [
    MetricInfo {
        name: "op_us",
        unit: "us",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "mean time of one update over all slots",
    },
    MetricInfo {
        name: "first_us",
        unit: "us",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "mean time of the first tenth of the updates (add: the smallest VM; delete: the largest)",
    },
    MetricInfo {
        name: "last_us",
        unit: "us",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "mean time of the last tenth of the updates",
    },
    MetricInfo {
        name: "growth",
        unit: "ratio",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "last_us / first_us: 1 when an update costs the same at every slot count",
    },
    MetricInfo {
        name: "total_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "every update of the repetition",
    },
    MetricInfo {
        name: "swaps_per_op",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "kvm_swap_active_memslots() calls (expedited SRCU grace periods) per update (model)",
    },
];

/// The largest slot count x86 KVM takes (`KVM_USER_MEM_SLOTS`, 32768 less the private slots).
const MAX_SLOTS: u32 = 32_764;

/// Mean of `ns` in µs (0 for none).
fn mean_us(ns: &[u64]) -> f64 {
    if ns.is_empty() {
        return 0.0;
    }
    ns.iter().map(|&x| x as f64).sum::<f64>() / ns.len() as f64 / 1e3
}

fn analyse_variant(name: &str, results: &[MemslotResult], seed: u64) -> VariantRecord {
    let mut series = Series::new();
    for (rep, r) in results.iter().enumerate() {
        let tenth = r.op_ns.len().div_ceil(10);
        let (first, last) = (
            mean_us(&r.op_ns[..tenth]),
            mean_us(&r.op_ns[r.op_ns.len() - tenth..]),
        );
        series
            .at(rep)
            .push("op_us", "us", mean_us(&r.op_ns))
            .push("first_us", "us", first)
            .push("last_us", "us", last)
            .push(
                "growth",
                "ratio",
                if first > 0.0 { last / first } else { 0.0 },
            )
            .push(
                "total_ms",
                "ms",
                r.op_ns.iter().map(|&x| x as f64).sum::<f64>() / 1e6,
            );
        if let Some(swaps) = r.swaps_per_op {
            series.push("swaps_per_op", "count", f64::from(swaps));
        }
    }
    VariantRecord::ok(name, series.finish(results.len(), name, seed), Vec::new())
}

/// The memslots scenario.
#[derive(Debug)]
pub struct Memslots;

/// The parameters of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemslotsParams {
    /// Memslots per VM.
    pub slots: u32,
    /// Bytes per memslot.
    pub slot_bytes: u64,
}

impl Default for MemslotsParams {
    fn default() -> MemslotsParams {
        MemslotsParams {
            slots: 256,
            slot_bytes: 2 << 20,
        }
    }
}

impl Scenario for Memslots {
    type Plan = MemslotPlan;
    type Params = MemslotsParams;
    const INFO: &'static ScenarioInfo = &INFO;
    const PARAMS: &'static [Param<MemslotsParams>] = &PARAMS;

    fn plan(
        &self,
        name: &str,
        request: &RunRequest<MemslotsParams>,
    ) -> Result<Option<MemslotPlan>, InputError> {
        let op = match name {
            "add" => SlotOp::Add,
            "move" => SlotOp::Move,
            "delete" => SlotOp::Delete,
            _ => return Ok(None),
        };
        Ok(Some(MemslotPlan {
            slots: request.params.slots,
            slot_bytes: request.params.slot_bytes,
            op,
        }))
    }

    fn analyse(&self, o: Observed<'_, MemslotPlan, MemslotResult>) -> ScenarioOutcome {
        let variants = per_variant(o.names, o.results, |_, name, r| {
            analyse_variant(name, r, o.seed)
        });
        ScenarioOutcome { variants }
    }

    fn charts(&self, _record: &RunRecord) -> Vec<Chart> {
        vec![
            Chart::Bars {
                metric: "op_us",
                title: "one memslot update, by kind",
            },
            Chart::Bars {
                metric: "growth",
                title: "last tenth of the updates against the first (1: flat as slots grow)",
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvlab_core::BackendKind;

    fn plan_of(sets: &[&str], variant: &str) -> Result<MemslotPlan, InputError> {
        crate::scenario::plans_of(&Memslots, sets, &[variant], BackendKind::Kvm)
            .map(|mut v| v.remove(0).1)
    }

    #[test]
    fn variants_map_to_slot_updates() {
        let p = plan_of(&["slots=1000"], "move").unwrap();
        assert_eq!((p.slots, p.slot_bytes, p.op), (1000, 2 << 20, SlotOp::Move));
        assert_eq!(plan_of(&[], "delete").unwrap().op, SlotOp::Delete);
    }

    #[test]
    fn bad_slot_counts_and_sizes_say_what_is_allowed() {
        for (set, needle) in [
            ("slots=0", "from 1 to 32764"),
            ("slots=40000", "from 1 to 32764"),
            ("slot_size=5000", "multiple of 4KiB"),
            ("slot_size=2GiB", "up to 1GiB"),
        ] {
            let msg = plan_of(&[set], "add").unwrap_err().to_string();
            assert!(msg.contains(needle), "{set}: {msg}");
        }
        let msg = plan_of(&[], "resize").unwrap_err().to_string();
        assert!(msg.contains("add, move, delete"), "{msg}");
    }

    #[test]
    fn growth_compares_the_last_tenth_with_the_first() {
        let r = MemslotResult {
            op_ns: (0..20)
                .map(|i| {
                    if i < 2 {
                        10_000
                    } else if i >= 18 {
                        30_000
                    } else {
                        20_000
                    }
                })
                .collect(),
            swaps_per_op: Some(1),
        };
        let v = analyse_variant("add", &[r.clone(), r.clone(), r.clone(), r], 1);
        assert_eq!(v.metrics["first_us"].median, 10.0);
        assert_eq!(v.metrics["last_us"].median, 30.0);
        assert_eq!(v.metrics["growth"].median, 3.0);
        assert_eq!(v.metrics["op_us"].median, 20.0);
        assert_eq!(v.metrics["swaps_per_op"].median, 1.0);
    }
}
