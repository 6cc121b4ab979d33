//! Many vCPUs touching memory at once: the same per-fault path as [`crate::mmu`], run by
//! several vCPU threads on a few host CPUs, with `kvm->mmu_lock` between them.
//!
//! Mirrors arch/x86/kvm/mmu/mmu.c: `kvm_mmu_page_fault()` → `direct_page_fault()` (and, with
//! shadow paging, `FNAME(page_fault)` in paging_tmpl.h) first resolves the host page outside
//! the lock (`kvm_mmu_faultin_pfn()` → `__kvm_faultin_pfn()`, where a host fault happens),
//! then takes `write_lock(&vcpu->kvm->mmu_lock)` to install the SPTE and prefetch
//! (`direct_map()` / `FNAME(fetch)`, `direct_pte_prefetch()`). The TDP MMU takes the lock for
//! read (`kvm_tdp_mmu_page_fault()` under `read_lock()`), so its faults never wait for each
//! other. `mmu_lock` is an `rwlock_t` (x86 defines `KVM_HAVE_MMU_RWLOCK`): a waiter spins on
//! its CPU with preemption off, and the holder cannot be preempted. The host scheduler shares
//! the CPUs among more vCPU threads than CPUs in slices of `sysctl_sched_base_slice`.

use std::collections::VecDeque;

use super::memory::{Counts, Mmu, MmuCosts, PER_PAGE_MAX_PAGES, PassError, prefetch_for};
use super::profile::{MmuKind, Profile, ProfileError};
use hvlab_core::guest::GuestPage;
use hvlab_core::memory::{HostBacking, Touch, TouchPlan, TouchResult};

/// One stretch of a vCPU thread's work.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Segment {
    /// CPU time it needs, ns.
    pub work_ns: f64,
    /// Whether it runs holding `mmu_lock` exclusively.
    pub locked: bool,
}

/// The host the vCPU threads run on.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Machine {
    /// Host CPUs the vCPU threads share.
    pub cpus: usize,
    /// The scheduler's time slice, ns.
    pub slice_ns: f64,
}

impl Machine {
    /// `cpus` CPUs with the EEVDF base slice the kernel sets for them:
    /// `sysctl_sched_base_slice` (0.75 ms) scaled by `1 + ilog2(min(cpus, 8))`
    /// (`get_update_sysctl_factor()`, kernel/sched/fair.c, the default
    /// `SCHED_TUNABLESCALING_LOG`).
    pub fn with_cpus(cpus: usize) -> Machine {
        let cpus = cpus.max(1);
        let factor = 1 + cpus.min(8).ilog2();
        Machine {
            cpus,
            slice_ns: 750_000.0 * f64::from(factor),
        }
    }
}

/// Runs every thread's segments to the end and returns each thread's finish time, ns from a
/// common start. Discrete events: a running thread advances its segment; one reaching a locked
/// segment takes the lock if it is free, else spins on its CPU (making no progress, not
/// preemptible) until the holder releases it; a thread whose slice ran out is preempted at an
/// unlocked point when another waits for a CPU.
pub fn simulate(threads: &[Vec<Segment>], machine: Machine) -> Vec<f64> {
    const EPS: f64 = 1e-6;
    let n = threads.len();
    let mut pos = vec![0usize; n];
    let mut left: Vec<f64> = threads
        .iter()
        .map(|t| t.first().map_or(0.0, |s| s.work_ns))
        .collect();
    let mut done = vec![0.0f64; n];
    let mut ready: VecDeque<usize> = (0..n).filter(|i| !threads[*i].is_empty()).collect();
    let mut cores: Vec<Option<(usize, f64)>> = vec![None; machine.cpus.max(1)];
    let mut holder: Option<usize> = None;
    let mut t = 0.0f64;
    loop {
        for core in &mut cores {
            if core.is_none()
                && let Some(th) = ready.pop_front()
            {
                *core = Some((th, t + machine.slice_ns));
            }
        }
        let mut next = f64::INFINITY;
        for &(th, slice_end) in cores.iter().flatten() {
            let seg = threads[th][pos[th]];
            if seg.locked && holder != Some(th) {
                if holder.is_some() {
                    continue; // spinning
                }
                holder = Some(th);
            }
            let mut end = t + left[th];
            if !seg.locked {
                end = end.min(slice_end);
            }
            next = next.min(end);
        }
        if !next.is_finite() {
            // Nothing runs: all done (the holder always runs, so spinners cannot stall).
            break;
        }
        let dt = (next - t).max(0.0);
        for &(th, _) in cores.iter().flatten() {
            let seg = threads[th][pos[th]];
            if !seg.locked || holder == Some(th) {
                left[th] -= dt;
            }
        }
        t = next;
        for core in &mut cores {
            let Some((th, slice_end)) = *core else {
                continue;
            };
            let mut seg = threads[th][pos[th]];
            if left[th] <= EPS && (!seg.locked || holder == Some(th)) {
                if seg.locked {
                    holder = None;
                }
                pos[th] += 1;
                if pos[th] == threads[th].len() {
                    done[th] = t;
                    *core = None;
                    continue;
                }
                seg = threads[th][pos[th]];
                left[th] = seg.work_ns;
            }
            if t + EPS >= slice_end && !seg.locked {
                if ready.is_empty() {
                    *core = Some((th, t + machine.slice_ns));
                } else {
                    ready.push_back(th);
                    *core = None;
                }
            }
        }
    }
    done
}

/// The extra inputs of a many-vCPU pass.
#[derive(Debug, Clone, Copy)]
pub struct ParallelCosts {
    /// ns of each stage-2 fault spent holding `mmu_lock` (SPTE install), part of
    /// `stage2_fault_ns`.
    pub lock_hold: f64,
    /// The host's CPUs.
    pub machine: Machine,
}

impl ParallelCosts {
    /// Reads `mmu_lock_hold_ns` and `host_cpus`.
    pub fn from_profile(p: &Profile) -> Result<ParallelCosts, ProfileError> {
        let hold = p.get("mmu_lock_hold_ns", "memory with vcpus > 1")?;
        let cpus = p.get("host_cpus", "memory with vcpus > 1")?;
        // A CPU count read from TOML: a small positive whole number.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let cpus = cpus.max(1.0).round() as usize;
        Ok(ParallelCosts {
            lock_hold: hold,
            machine: Machine::with_cpus(cpus),
        })
    }
}

fn delta(after: Counts, before: Counts) -> Counts {
    Counts {
        faults: after.faults - before.faults,
        prefetched: after.prefetched - before.prefetched,
        host_faults: after.host_faults - before.host_faults,
        host_huge_faults: after.host_huge_faults - before.host_huge_faults,
        uffd_faults: after.uffd_faults - before.uffd_faults,
        uffd_pages: after.uffd_pages - before.uffd_pages,
        huge_mappings: after.huge_mappings - before.huge_mappings,
    }
}

/// One pass with `plan.vcpus` vCPUs. The vCPUs' accesses run through one shared [`Mmu`]
/// (interleaved one page each, as they run at once); each access becomes the vCPU's segments:
/// the fault's unlocked part (host fault, the exit and walk), then its `mmu_lock` part (SPTE
/// install and prefetch; shared, so never waited for, with the TDP MMU). The sum over all
/// segments is the single-vCPU model's time for the same pages.
pub fn touch(
    costs: &MmuCosts,
    par: &ParallelCosts,
    plan: &TouchPlan,
) -> Result<TouchResult, PassError> {
    let pages = plan.size_bytes / 4096;
    if pages > PER_PAGE_MAX_PAGES {
        return Err(PassError::ParallelTooLarge(pages));
    }
    let orders = plan.vcpu_orders();
    #[allow(clippy::cast_possible_truncation)] // bounded by PER_PAGE_MAX_PAGES
    let mut mmu = Mmu::new(
        pages as usize,
        plan.backing,
        prefetch_for(plan, costs.mmu),
        plan.guest_page == GuestPage::Huge,
    );
    let exclusive = costs.mmu != MmuKind::TdpMmu;
    let per_touch = match plan.touch {
        Touch::FirstByte => costs.touch_page,
        Touch::WholePage => costs.touch_page * 64.0,
    };
    let hold = par.lock_hold.min(costs.stage2_fault);
    let mut threads: Vec<Vec<Segment>> = vec![Vec::new(); orders.len()];
    let mut pending = vec![0.0f64; orders.len()];
    let longest = orders.iter().map(Vec::len).max().unwrap_or(0);
    for k in 0..longest {
        for (i, order) in orders.iter().enumerate() {
            let Some(&gfn) = order.get(k) else { continue };
            let before = mmu.counts;
            mmu.access(gfn as usize);
            let d = delta(mmu.counts, before);
            let mut free = per_touch
                + d.host_faults as f64 * costs.host_fault
                + d.host_huge_faults as f64 * costs.host_fault_huge
                + d.uffd_faults as f64 * costs.uffd_fault
                + d.uffd_pages as f64 * costs.uffd_copy_page
                + d.faults as f64 * (costs.stage2_fault - hold);
            let mut locked = d.faults as f64 * hold + d.prefetched as f64 * costs.prefetch_page;
            if !exclusive {
                free += locked;
                locked = 0.0;
            }
            pending[i] += free;
            if locked > 0.0 {
                threads[i].push(Segment {
                    work_ns: pending[i],
                    locked: false,
                });
                threads[i].push(Segment {
                    work_ns: locked,
                    locked: true,
                });
                pending[i] = 0.0;
            }
        }
    }
    for (t, p) in threads.iter_mut().zip(pending) {
        if p > 0.0 {
            t.push(Segment {
                work_ns: p,
                locked: false,
            });
        }
    }
    let finish = simulate(&threads, par.machine);
    // Model times are sums of non-negative costs.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let vcpu_ns: Vec<u64> = finish.iter().map(|f| f.round() as u64).collect();
    let c = mmu.counts;
    let touched: u64 = orders.iter().map(|o| o.len() as u64).sum();
    let count = |n: u64| i128::from(n);
    Ok(TouchResult {
        pages: touched,
        elapsed_ns: vcpu_ns.iter().copied().max().unwrap_or(0),
        uffd_faults: matches!(
            plan.backing,
            HostBacking::Uffd(_) | HostBacking::UffdMinor(_) | HostBacking::UffdMinorHugetlb
        )
        .then_some(c.uffd_faults),
        guest_table_pages: None,
        kvm_stats: vec![
            ("faults".into(), "count".into(), count(c.faults)),
            ("prefetched".into(), "count".into(), count(c.prefetched)),
            ("kvm.vcpu.pf_fixed".into(), "count".into(), count(c.faults)),
        ],
        vcpu_ns,
        hugetlb_pool: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(work_ns: f64, locked: bool) -> Segment {
        Segment { work_ns, locked }
    }

    #[test]
    fn one_thread_takes_the_sum_of_its_segments() {
        let t = vec![seg(10.0, false), seg(5.0, true), seg(3.0, false)];
        assert_eq!(simulate(&[t], Machine::with_cpus(2)), vec![18.0]);
    }

    #[test]
    fn two_threads_on_two_cpus_wait_only_for_the_lock() {
        // Both reach the lock at 10: one holds it 0-5 later, the other spins then holds.
        let t = vec![seg(10.0, false), seg(5.0, true)];
        let done = simulate(&[t.clone(), t], Machine::with_cpus(2));
        assert_eq!(done, vec![15.0, 20.0]);
        // Without locked work they run fully in parallel.
        let free = vec![seg(15.0, false)];
        assert_eq!(
            simulate(&[free.clone(), free], Machine::with_cpus(2)),
            vec![15.0, 15.0]
        );
    }

    #[test]
    fn more_threads_than_cpus_share_them_in_slices() {
        let m = Machine {
            cpus: 2,
            slice_ns: 1.0,
        };
        let t = vec![seg(100.0, false)];
        let done = simulate(&vec![t; 4], m);
        // 400 ns of work on 2 CPUs: the last ends at 200, none before 100.
        let last = done.iter().copied().fold(0.0, f64::max);
        assert!((last - 200.0).abs() < 1e-6, "{done:?}");
        assert!(done.iter().all(|d| *d >= 100.0 - 1e-6), "{done:?}");
    }

    #[test]
    fn the_base_slice_grows_with_the_log_of_the_cpus() {
        assert_eq!(Machine::with_cpus(1).slice_ns, 750_000.0);
        assert_eq!(Machine::with_cpus(2).slice_ns, 1_500_000.0);
        assert_eq!(Machine::with_cpus(64).slice_ns, 3_000_000.0);
    }

    fn costs(mmu: MmuKind) -> MmuCosts {
        MmuCosts {
            stage2_fault: 10_000.0,
            host_fault: 2_000.0,
            host_fault_huge: 500_000.0,
            prefetch_page: 40.0,
            touch_page: 3.0,
            uffd_fault: 20_000.0,
            uffd_copy_page: 1_000.0,
            mmu,
        }
    }

    fn plan(vcpus: u32) -> TouchPlan {
        TouchPlan {
            size_bytes: 16 << 20,
            pattern: hvlab_core::memory::Pattern::Seq,
            seed: 1,
            access: hvlab_core::memory::Access::Write,
            touch: Touch::FirstByte,
            guest_page: GuestPage::Small,
            backing: HostBacking::Anonymous(hvlab_core::guest::Backing::Lazy),
            cpl: None,
            timeout: std::time::Duration::from_secs(1),
            prefetch: None,
            vcpus,
        }
    }

    fn par(hold: f64, cpus: usize) -> ParallelCosts {
        ParallelCosts {
            lock_hold: hold,
            machine: Machine::with_cpus(cpus),
        }
    }

    #[test]
    fn one_vcpu_costs_what_the_single_vcpu_model_says() {
        let c = costs(MmuKind::Shadow);
        let one = touch(&c, &par(1_000.0, 2), &plan(1)).unwrap();
        let single = crate::memory::touch(&c, &plan(1)).unwrap();
        assert_eq!(one.elapsed_ns, single.elapsed_ns);
        assert_eq!(one.kvm_stats, single.kvm_stats);
    }

    #[test]
    fn the_counts_do_not_depend_on_the_vcpus_and_the_cpus_bound_the_rate() {
        let c = costs(MmuKind::Shadow);
        let one = touch(&c, &par(1_000.0, 2), &plan(1)).unwrap();
        let two = touch(&c, &par(1_000.0, 2), &plan(2)).unwrap();
        let eight = touch(&c, &par(1_000.0, 2), &plan(8)).unwrap();
        assert_eq!(two.kvm_stats, one.kvm_stats);
        assert_eq!(eight.kvm_stats, one.kvm_stats);
        assert_eq!(eight.vcpu_ns.len(), 8);
        // Two CPUs: at most twice as fast, with eight vCPUs no faster than with two.
        let speedup = |r: &TouchResult| one.elapsed_ns as f64 / r.elapsed_ns as f64;
        assert!(
            speedup(&two) > 1.8 && speedup(&two) <= 2.0,
            "{}",
            speedup(&two)
        );
        assert!(
            speedup(&eight) <= speedup(&two) * 1.001,
            "{}",
            speedup(&eight)
        );
    }

    #[test]
    fn an_exclusive_mmu_lock_serialises_faults_and_the_tdp_mmus_shared_one_does_not() {
        // The whole fault under the lock: with two vCPUs shadow paging gains only the host
        // faults (2 of 12 µs per page) that run outside it, so the lock's 10 µs per page of
        // 4096 pages bound the pass.
        let shadow = costs(MmuKind::Shadow);
        let one = touch(&shadow, &par(10_000.0, 2), &plan(1))
            .unwrap()
            .elapsed_ns as f64;
        let two = touch(&shadow, &par(10_000.0, 2), &plan(2))
            .unwrap()
            .elapsed_ns as f64;
        assert!(
            two >= 4096.0 * 10_000.0 && two > 0.8 * one,
            "shadow: {one} vs {two}"
        );
        let tdp = costs(MmuKind::TdpMmu);
        let one = touch(&tdp, &par(10_000.0, 2), &plan(1)).unwrap().elapsed_ns as f64;
        let two = touch(&tdp, &par(10_000.0, 2), &plan(2)).unwrap().elapsed_ns as f64;
        assert!(two < 0.51 * one, "tdp mmu: {one} vs {two}");
    }
}
