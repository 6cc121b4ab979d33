//! The `percpu` model: what a `this_cpu_*()` op costs under each scheme, from the instructions
//! each scheme executes, and what the per-CPU page tables cost to keep, from the events that
//! touch them.
//!
//! **The op.** arm64 today (arch/arm64/include/asm/percpu.h `_pcp_protect()`,
//! arch/arm64/include/asm/preempt.h): `preempt_disable_notrace()` is `__preempt_count_add()`,
//! a 32-bit load, add and store of `thread_info.preempt.count`; `__kern_my_cpu_offset()` reads
//! `TPIDR_EL1` (`TPIDR_EL2` with VHE); the op (`__percpu_add_case_64()`: `STADD` with LSE);
//! `preempt_enable_notrace()` is `__preempt_count_dec_and_test()`: a 64-bit load of
//! `preempt_count` (count and need_resched together), the decrement, a 32-bit store of the
//! count, and — when the result is non-zero, the usual case — a second 64-bit load to re-check
//! need_resched. Both 64-bit loads read 8 bytes right after a 4-byte store to the same address,
//! so the store cannot forward its data and the load waits for the store to reach the cache
//! (`store_forward_stall_cycles`). The RFC (`HAVE_LOCAL_PER_CPU_MAP`, patch 7 "introduce
//! `__per_cpu_local_off`", patch 11 "use local percpu for this_cpu_*() APIs") computes the
//! address from a constant offset and drops the toggle: load the offset, add, the op.
//! [`op_cycles`] walks each sequence as a dependency graph (the longest chain of latencies);
//! latencies are per instruction class from the profile.
//! On x86 (`percpu_segment_base = 1`) an op is one `%gs`-prefixed instruction in both schemes.
//!
//! **The upkeep.** Each CPU has its own kernel page table. When `pcpu_populate_chunk()` backs
//! a chunk page (`pcpu_map_pages()` → `vmap_pages_range_noflush()` into the shared table), the
//! RFC also maps each CPU's unit page at the fixed address in that CPU's own table (patch 8
//! passes the pgd to `vmap_range_noflush()`; patch 9 "allocate and free local percpu vm area"):
//! one PTE write (`__set_pte()`) per CPU, in a table other CPUs do not share. Depopulation
//! (`pcpu_depopulate_chunk()` → `pcpu_unmap_pages()`, `pcpu_post_unmap_tlb_flush()`) unmaps in
//! every table and adds one more `flush_tlb_kernel_range()` for the local range (Yang Shi:
//! "one more TLB flush call with the same virtual address for all CPUs") — a broadcast TLBI
//! whose `DSB` completes only when every CPU has acknowledged it. Memory hotplug
//! (`__create_pgd_mapping()`) must copy the new top-level entries of the linear map and of
//! vmemmap into every CPU's table (the thread's known issue 3: not done yet). All of this
//! scales with the CPU count. Pages populated per item are bounded from above by the bytes
//! allocated (`pcpu_alloc()`) over the page size: the model assumes no reuse of populated
//! pages, the worst case for the RFC.

use super::profile::{Profile, ProfileError};
use hvlab_core::percpu::{PercpuPlan, PercpuResult, PercpuScheme, Workload};

/// Bytes of a per-CPU unit page (4 KiB granule).
const PAGE_BYTES: f64 = 4096.0;
/// Entries of a last-level table (4 KiB granule, 8-byte descriptors).
const PTES_PER_TABLE: f64 = 512.0;
/// Upper-level tables each CPU's copy needs for the local range besides its pgd: one pud and
/// one pmd table (4-level tables, the only layout the RFC supports: known issue 4).
const UPPER_TABLES_PER_CPU: f64 = 2.0;
/// Top-level entries a hot-added section adds: one for the linear map, one for vmemmap.
const TOP_ENTRIES_PER_SECTION: f64 = 2.0;

/// `this_cpu_*()` ops (the preemption-toggling kind, not `__this_cpu_*()`/`raw_cpu_*()`) per
/// anonymous fault and the later free of that page, counted from the call sites:
/// fault — `count_vm_event(PGFAULT)` in `handle_mm_fault()` 1, `count_memcg_event_mm()` 1,
/// `css_get()` via `percpu_ref_get()` on charge 1, `__lruvec_stat_mod_folio(NR_ANON_MAPPED)`
/// → `__mod_memcg_lruvec_state()` (memcg and lruvec counters) and `memcg_rstat_updated()`
/// (update and read) 4, `inc_mm_counter(MM_ANONPAGES)` → `percpu_counter_add_batch()` (read,
/// cmpxchg) 2; free — `add_mm_rss_vec()` 2, `folio_remove_rmap_ptes()` stat update 4,
/// uncharge (`uncharge_batch()` event + `css_put()`) 2.
pub const OPS_PER_ANON_FAULT: f64 = 17.0;
/// Per small-process fork + exit + wait, counted roughly: about 120 slab objects allocated and
/// freed (task, mm, signal, files, ~40 VMAs and their anon_vma chains: SLUB's fast path does
/// one `this_cpu_try_cmpxchg()` per alloc and per free) 240, page-table pages and rss updates
/// in `copy_page_range()`/`zap_pte_range()` ~20, ~10 copy-on-write faults after fork at 9 each.
pub const OPS_PER_FORK: f64 = 350.0;
/// Per `execve()`: a new mm (`mm_alloc()`), mapping the binary and loader (~20 VMAs), the old
/// mm torn down; counted like [`OPS_PER_FORK`], roughly.
pub const OPS_PER_EXEC: f64 = 250.0;
/// Per memcg created: css and objcg `percpu_ref` inits and gets, rstat and stats updates on the
/// creating path, counted roughly.
pub const OPS_PER_MEMCG_CREATE: f64 = 30.0;

/// One instruction class, priced by the profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insn {
    /// A load that hits L1.
    Load,
    /// A load wider than the store to the same address just before it: no store forwarding.
    LoadAfterNarrowStore,
    /// A store (its latency is when a later load can see it).
    Store,
    /// Integer add/sub, or a predicted branch on a register.
    Alu,
    /// `MRS` of `TPIDR_EL1`/`TPIDR_EL2`.
    SysRegRead,
    /// The per-CPU op itself (`STADD`, or x86's `%gs`-prefixed `add`).
    Atomic,
}

/// One instruction of a sequence and the earlier ones (by index) whose results it needs.
#[derive(Debug, Clone, Copy)]
pub struct Step {
    /// The instruction, as arm64 compiles it.
    pub asm: &'static str,
    /// Its class.
    pub insn: Insn,
    /// Indices of the steps it waits for.
    pub after: &'static [usize],
}

const fn step(asm: &'static str, insn: Insn, after: &'static [usize]) -> Step {
    Step { asm, insn, after }
}

/// `this_cpu_add()` on arm64 today (`current` is already in a register: `get_current()` reads
/// `SP_EL0` once per function).
pub const OFFSET_ADD: [Step; 12] = [
    step("ldr w1, [x0, #preempt.count]", Insn::Load, &[]),
    step("add w1, w1, #1", Insn::Alu, &[0]),
    step("str w1, [x0, #preempt.count]", Insn::Store, &[1]),
    step("mrs x2, tpidr_el1", Insn::SysRegRead, &[]),
    step("add x2, x2, pcp", Insn::Alu, &[3]),
    step("stadd x3, [x2]", Insn::Atomic, &[4]),
    step(
        "ldr x1, [x0, #preempt_count]",
        Insn::LoadAfterNarrowStore,
        &[2],
    ),
    step("sub x1, x1, #1", Insn::Alu, &[6]),
    step("str w1, [x0, #preempt.count]", Insn::Store, &[7]),
    step("cbz x1, preempt_schedule", Insn::Alu, &[7]),
    step(
        "ldr x1, [x0, #preempt_count]",
        Insn::LoadAfterNarrowStore,
        &[8],
    ),
    step("cbz x1, preempt_schedule", Insn::Alu, &[10]),
];

/// `this_cpu_add()` under the RFC: the fixed local alias of the variable.
pub const LOCAL_MAP_ADD: [Step; 3] = [
    step("ldr x2, __per_cpu_local_off", Insn::Load, &[]),
    step("add x2, x2, pcp", Insn::Alu, &[0]),
    step("stadd x3, [x2]", Insn::Atomic, &[1]),
];

/// `this_cpu_add()` on x86: `add %gs:pcp, reg`.
pub const SEGMENT_ADD: [Step; 1] = [step("add %gs:pcp, reg", Insn::Atomic, &[])];

/// Latencies by instruction class, cycles.
#[derive(Debug, Clone, Copy)]
pub struct InsnCycles {
    /// L1 load-to-use.
    pub load: f64,
    /// Store to a dependent load.
    pub store: f64,
    /// Integer ALU.
    pub alu: f64,
    /// `MRS` of a thread-ID register.
    pub sysreg_read: f64,
    /// The atomic op.
    pub atomic: f64,
    /// Extra wait of a load the store before it cannot forward to.
    pub store_forward_stall: f64,
}

impl InsnCycles {
    fn of(&self, insn: Insn) -> f64 {
        match insn {
            Insn::Load => self.load,
            Insn::LoadAfterNarrowStore => self.load + self.store_forward_stall,
            Insn::Store => self.store,
            Insn::Alu => self.alu,
            Insn::SysRegRead => self.sysreg_read,
            Insn::Atomic => self.atomic,
        }
    }
}

/// The longest chain of dependent latencies through `seq`, cycles: what one op costs when
/// nothing else hides it. Steps may only wait for earlier steps.
pub fn op_cycles(seq: &[Step], lat: &InsnCycles) -> f64 {
    let mut done: Vec<f64> = Vec::with_capacity(seq.len());
    for s in seq {
        let ready = s
            .after
            .iter()
            .filter_map(|&i| done.get(i).copied())
            .fold(0.0, f64::max);
        done.push(ready + lat.of(s.insn));
    }
    done.into_iter().fold(0.0, f64::max)
}

/// Everything the model reads from the profile.
#[derive(Debug, Clone, Copy)]
pub struct PercpuCosts {
    ghz: f64,
    lat: InsnCycles,
    segment_base: bool,
    pte_write_ns: f64,
    tlbi_broadcast_ns: f64,
    tlbi_ack_per_cpu_ns: f64,
    anon_fault_ns: f64,
    fork_ns: f64,
    exec_ns: f64,
    memcg_create_ns: f64,
    hotplug_section_ns: f64,
    table_bytes: f64,
}

impl PercpuCosts {
    /// Reads the costs.
    pub fn from_profile(p: &Profile) -> Result<PercpuCosts, ProfileError> {
        let g = |k| p.get(k, "percpu");
        Ok(PercpuCosts {
            ghz: g("cpu_ghz")?.max(0.001),
            lat: InsnCycles {
                load: g("load_cycles")?,
                store: g("store_cycles")?,
                alu: g("alu_cycles")?,
                sysreg_read: g("sysreg_read_cycles")?,
                atomic: g("atomic_cycles")?,
                store_forward_stall: g("store_forward_stall_cycles")?,
            },
            segment_base: g("percpu_segment_base")? != 0.0,
            pte_write_ns: g("pte_write_ns")?,
            tlbi_broadcast_ns: g("tlbi_broadcast_ns")?,
            tlbi_ack_per_cpu_ns: g("tlbi_ack_per_cpu_ns")?,
            anon_fault_ns: g("anon_fault_ns")?,
            fork_ns: g("fork_ns")?,
            exec_ns: g("exec_ns")?,
            memcg_create_ns: g("memcg_create_ns")?,
            hotplug_section_ns: g("hotplug_section_ns")?,
            table_bytes: g("kernel_pgd_bytes")?,
        })
    }

    /// The instruction sequence of `this_cpu_add()` under `scheme` on this architecture. An
    /// architecture with a per-CPU segment base does not select `HAVE_LOCAL_PER_CPU_MAP`: both
    /// schemes are its one instruction.
    pub fn sequence(&self, scheme: PercpuScheme) -> &'static [Step] {
        match (self.segment_base, scheme) {
            (true, _) => &SEGMENT_ADD,
            (false, PercpuScheme::Offset) => &OFFSET_ADD,
            (false, PercpuScheme::LocalMap) => &LOCAL_MAP_ADD,
        }
    }

    /// `flush_tlb_kernel_range()` of one small range: the broadcast TLBI and the `DSB ISH`
    /// that waits for every CPU's acknowledgement.
    pub fn tlbi_broadcast_ns(&self, cpus: f64) -> f64 {
        self.tlbi_broadcast_ns + cpus * self.tlbi_ack_per_cpu_ns
    }

    /// What the RFC adds per item: local mapping of populated chunk pages in every CPU's
    /// table, their unmapping and the extra flush, and hotplug sync.
    pub fn upkeep_ns(&self, w: &Workload, cpus: f64) -> f64 {
        let populated = w.percpu_alloc_bytes / PAGE_BYTES;
        let depopulated = w.percpu_free_bytes / PAGE_BYTES;
        let flush = self.tlbi_broadcast_ns(cpus);
        populated * cpus * self.pte_write_ns
            + depopulated * (cpus * self.pte_write_ns + flush)
            + w.hotplug_sections * (cpus * TOP_ENTRIES_PER_SECTION * self.pte_write_ns + flush)
    }

    /// Memory of the per-CPU tables: a pgd copy, the upper tables of the local range and its
    /// PTE tables, per CPU.
    pub fn pgtable_bytes(&self, w: &Workload, cpus: f64) -> f64 {
        let pte_tables = (w.percpu_live_bytes / PAGE_BYTES / PTES_PER_TABLE)
            .ceil()
            .max(1.0);
        cpus * (1.0 + UPPER_TABLES_PER_CPU + pte_tables) * self.table_bytes
    }
}

/// `this_cpu_*()` ops per item.
pub fn ops_per_item(w: &Workload) -> f64 {
    w.anon_faults * OPS_PER_ANON_FAULT
        + w.forks * OPS_PER_FORK
        + w.execs * OPS_PER_EXEC
        + w.memcg_creates * OPS_PER_MEMCG_CREATE
}

/// Predicts one work item.
pub fn predict(costs: &PercpuCosts, plan: &PercpuPlan) -> PercpuResult {
    let w = &plan.workload;
    let cpus = f64::from(plan.cpus);
    let ns = |cycles: f64| cycles / costs.ghz;
    let today_op_ns = ns(op_cycles(costs.sequence(PercpuScheme::Offset), &costs.lat));
    let op_cycles = op_cycles(costs.sequence(plan.scheme), &costs.lat);
    let op_ns = ns(op_cycles);
    let ops = ops_per_item(w);
    // The event costs are today's kernel, whose ops run the offset sequence.
    let today_sys_ns = w.anon_faults * costs.anon_fault_ns
        + w.forks * costs.fork_ns
        + w.execs * costs.exec_ns
        + w.memcg_creates * costs.memcg_create_ns
        + w.hotplug_sections * costs.hotplug_section_ns;
    let user_ns = today_sys_ns * (1.0 - w.sys_share) / w.sys_share.max(1e-6);
    let local_map = plan.scheme == PercpuScheme::LocalMap && !costs.segment_base;
    let upkeep_ns = if local_map {
        costs.upkeep_ns(w, cpus)
    } else {
        0.0
    };
    let sys_ns = today_sys_ns - ops * (today_op_ns - op_ns) + upkeep_ns;
    PercpuResult {
        op_cycles,
        op_ns,
        ops_per_item: ops,
        sys_ns,
        upkeep_ns,
        wall_ns: sys_ns + user_ns,
        // A whole number of table pages.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        pgtable_bytes: if local_map {
            costs.pgtable_bytes(w, cpus) as u64
        } else {
            0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AMPERE1: InsnCycles = InsnCycles {
        load: 4.0,
        store: 1.0,
        alu: 1.0,
        sysreg_read: 1.0,
        atomic: 4.0,
        store_forward_stall: 0.0,
    };

    #[test]
    fn the_preempt_count_chain_is_the_critical_path_of_todays_op() {
        // ldr, add, str, ldr, sub, str, ldr, cbz: the count goes through memory three times.
        assert_eq!(
            op_cycles(&OFFSET_ADD, &AMPERE1),
            4.0 + 1.0 + 1.0 + 4.0 + 1.0 + 1.0 + 4.0 + 1.0
        );
        // Without the toggle: ldr offset, add, stadd.
        assert_eq!(op_cycles(&LOCAL_MAP_ADD, &AMPERE1), 4.0 + 1.0 + 4.0);
    }

    #[test]
    fn each_failed_store_forward_lengthens_todays_op_and_not_the_rfcs() {
        let stalled = InsnCycles {
            store_forward_stall: 10.0,
            ..AMPERE1
        };
        assert_eq!(
            op_cycles(&OFFSET_ADD, &stalled) - op_cycles(&OFFSET_ADD, &AMPERE1),
            20.0
        );
        assert_eq!(
            op_cycles(&LOCAL_MAP_ADD, &stalled),
            op_cycles(&LOCAL_MAP_ADD, &AMPERE1)
        );
    }

    #[test]
    fn every_step_waits_only_for_earlier_steps() {
        for seq in [&OFFSET_ADD[..], &LOCAL_MAP_ADD[..], &SEGMENT_ADD[..]] {
            for (i, s) in seq.iter().enumerate() {
                assert!(s.after.iter().all(|&d| d < i), "{}", s.asm);
            }
        }
    }
}
