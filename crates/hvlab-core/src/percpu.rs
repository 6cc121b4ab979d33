//! The percpu vocabulary: which per-CPU access scheme, on how many CPUs, under which workload,
//! and what the backend predicts for one work item of it.

/// The two schemes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PercpuScheme {
    /// arm64 today: the per-CPU offset from `TPIDR_EL1`/`TPIDR_EL2` inside a preemption toggle.
    Offset,
    /// The RFC (`HAVE_LOCAL_PER_CPU_MAP`): one kernel page table per CPU maps a fixed virtual
    /// range to that CPU's per-CPU area; an op is one access at a constant address.
    LocalMap,
}

/// A workload as the kernel events one work item causes. Counts are per item (a compile job,
/// one stress-ng bogo-op, one memcg created, one memory section hot-added); what each event
/// costs and how many `this_cpu_*()` ops it runs is the model's business.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// Name (`--set workload=`).
    pub name: &'static str,
    /// Anonymous 4 KiB page faults, each with the later unmap and free of the page.
    pub anon_faults: f64,
    /// `fork()` + child `exit()` + `wait()` of a small process.
    pub forks: f64,
    /// `execve()` (a new mm, the old one dropped).
    pub execs: f64,
    /// cgroup v2 memcg creations (`mkdir` in the memory controller).
    pub memcg_creates: f64,
    /// Memory sections hot-added (`add_memory()`, 128 MiB each on arm64 with 4 KiB pages).
    pub hotplug_sections: f64,
    /// Per-CPU bytes allocated per item, per CPU unit (`pcpu_alloc()` sizes summed).
    pub percpu_alloc_bytes: f64,
    /// Of which freed again within the item (`free_percpu()`).
    pub percpu_free_bytes: f64,
    /// Per-CPU bytes live at the end of the run, per CPU unit, in the local-map area (sizes
    /// the per-CPU page tables).
    pub percpu_live_bytes: f64,
    /// Share of the item's wall time spent in the kernel (sys), today; the rest is user time.
    pub sys_share: f64,
}

/// One prediction to make.
#[derive(Debug, Clone, PartialEq)]
pub struct PercpuPlan {
    /// Scheme.
    pub scheme: PercpuScheme,
    /// CPUs (each has its own kernel page table under [`PercpuScheme::LocalMap`]).
    pub cpus: u32,
    /// Workload.
    pub workload: Workload,
}

/// What the model predicts for one work item.
#[derive(Debug, Clone, PartialEq)]
pub struct PercpuResult {
    /// Cycles of one `this_cpu_add()`: the longest dependent chain of its instructions.
    pub op_cycles: f64,
    /// The same in ns.
    pub op_ns: f64,
    /// `this_cpu_*()` ops per item.
    pub ops_per_item: f64,
    /// Kernel (sys) time per item, ns.
    pub sys_ns: f64,
    /// Of which keeping the per-CPU page tables: mapping and unmapping per-CPU chunk pages in
    /// every CPU's table, the extra TLB invalidation, hotplug sync (0 for the offset scheme).
    pub upkeep_ns: f64,
    /// Wall time per item (sys + user), ns.
    pub wall_ns: f64,
    /// Memory of the per-CPU page tables, bytes.
    pub pgtable_bytes: u64,
}
