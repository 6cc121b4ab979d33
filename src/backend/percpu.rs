//! The percpu vocabulary: which per-CPU access scheme, under which workload's op mix, and
//! what the backend predicts for it.

/// The two schemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PercpuScheme {
    /// Offset register + preemption toggle.
    Offset,
    /// Per-CPU page table, fixed address.
    LocalMap,
}

/// A workload as an op mix.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// Name.
    pub name: &'static str,
    /// `this_cpu_*()` ops per second of sys time on one CPU.
    pub ops_per_sys_s: f64,
    /// Kernel mapping changes that must reach every page-table copy, per second, system-wide
    /// (vmalloc/vfree of page-table-level ranges, module loads, memory hotplug).
    pub kernel_map_changes_per_s: f64,
    /// Per-CPU allocations that must be mapped into every copy, per second, system-wide.
    pub percpu_allocs_per_s: f64,
}

/// One prediction to make.
#[derive(Debug, Clone, PartialEq)]
pub struct PercpuPlan {
    /// Scheme.
    pub scheme: PercpuScheme,
    /// CPUs.
    pub cpus: u32,
    /// Workload.
    pub workload: Workload,
}

/// What the model predicts.
#[derive(Debug, Clone, PartialEq)]
pub struct PercpuResult {
    /// ns per op.
    pub op_ns: f64,
    /// ns per CPU per sys-second spent on per-CPU ops and upkeep.
    pub sys_ns_per_cpu_s: f64,
    /// Of which page-table upkeep.
    pub sync_ns_per_cpu_s: f64,
    /// Page-table copy memory.
    pub pgtable_bytes: u64,
}
