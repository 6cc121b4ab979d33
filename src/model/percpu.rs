//! The `percpu` model: the cost of `this_cpu_*()` operations under each scheme.
//!
//! Offset scheme (arch/arm64/include/asm/percpu.h, include/asm-generic/percpu.h):
//! `preempt_disable_notrace()`, `__my_cpu_offset` from `TPIDR_EL1`/`TPIDR_EL2`, the address,
//! the op, `preempt_enable_notrace()` with its reschedule check — `offset_op_cycles`.
//! Local-map scheme (the RFC's `HAVE_LOCAL_PER_CPU_MAP`): the op at a fixed address —
//! `fixed_op_cycles` — paid for by upkeep: every kernel mapping change outside the shared
//! part of the tables, and every per-CPU allocation, must be written into each CPU's copy
//! (`pgtable_sync_ns` per copy), and each copy costs a top-level table (`kernel_pgd_bytes`).

use super::profile::{Profile, ProfileError};
use crate::backend::percpu::{PercpuPlan, PercpuResult, PercpuScheme};

/// Per-op and upkeep costs.
#[derive(Debug, Clone, Copy)]
pub struct PercpuCosts {
    ghz: f64,
    offset_cycles: f64,
    fixed_cycles: f64,
    sync_ns: f64,
    pgd_bytes: f64,
}

impl PercpuCosts {
    /// Reads the costs.
    pub fn from_profile(p: &Profile) -> Result<PercpuCosts, ProfileError> {
        let g = |k| p.get(k, "percpu");
        Ok(PercpuCosts {
            ghz: g("cpu_ghz")?.max(0.001),
            offset_cycles: g("offset_op_cycles")?,
            fixed_cycles: g("fixed_op_cycles")?,
            sync_ns: g("pgtable_sync_ns")?,
            pgd_bytes: g("kernel_pgd_bytes")?,
        })
    }
}

/// Predicts one second of one CPU's sys time.
pub fn predict(costs: &PercpuCosts, plan: &PercpuPlan) -> PercpuResult {
    let w = plan.workload;
    let cpus = f64::from(plan.cpus);
    let (op_cycles, sync_ns_per_cpu_s, copies) = match plan.scheme {
        PercpuScheme::Offset => (costs.offset_cycles, 0.0, 0.0),
        PercpuScheme::LocalMap => {
            // System-wide events, each written into every CPU's copy, the work spread over all
            // CPUs: per CPU that is (events/s × cpus × sync) / cpus.
            let events = w.kernel_map_changes_per_s + w.percpu_allocs_per_s;
            (costs.fixed_cycles, events * costs.sync_ns, cpus)
        }
    };
    let op_ns = op_cycles / costs.ghz;
    PercpuResult {
        op_ns,
        sys_ns_per_cpu_s: w.ops_per_sys_s * op_ns + sync_ns_per_cpu_s,
        sync_ns_per_cpu_s,
        // A whole number of tables.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        pgtable_bytes: (copies * costs.pgd_bytes) as u64,
    }
}
