//! The `pinning` model: SPE buffer pins under a policy, over a context-switch trace.
//!
//! Mirrors the proposed KVM arm64 SPE handling (Alexandru Elisei, "KVM: arm64: Pin the SPE
//! buffer in the host and map it at stage 2", RFC v6 29/35): on a guest write that enables
//! the profiling buffer (`PMBLIMITR_EL1.E`), KVM walks the guest's stage 1 over the buffer
//! — on every enable, even when the pages are still pinned, because the guest may have
//! changed VA→IPA since — then pins every page (`pin_user_pages()`, faulting a page in
//! first when it is not resident) and maps it at stage 2; on disable it unmaps and unpins.
//! A pin and an unpin each have a fixed part (locking, allocation, TLB invalidation) and a
//! per-page part. The heuristics the thread proposes keep pins across disables and release
//! them by intersection or age, under a cap on pinned memory. `no-pin` is the other option
//! the thread weighs: nothing pinned, the buffer faulted in at stage 2 as SPE writes it, each
//! fault a blackout (the SPU stops and raises PMBIRQ; records are lost until the fault is
//! handled and profiling restarts). `gmem-prefault` is the series' newest revision: the
//! buffer in guest_memfd (never migrated or reclaimed, so its stage-2 mappings stay), mapped
//! once with `KVM_PRE_FAULT_MEMORY`; an enable pins nothing and walks nothing.

use super::profile::{Profile, ProfileError};
use hvlab_core::error::BackendError;
use hvlab_core::pinning::{
    PinCache, PinPlan, PinPolicy, PinResult, Pinner, RECORDS_PER_PAGE, buffer_addr,
};

/// Pin costs: fixed parts per operation, per-page parts.
#[derive(Debug, Clone, Copy)]
pub struct PinCosts {
    pin_fixed: f64,
    pin_page: f64,
    repin_page: f64,
    unpin_fixed: f64,
    unpin_page: f64,
    stage2_page: f64,
    walk_page: f64,
    fault: f64,
    irq_latency: f64,
}

impl PinCosts {
    /// Reads the costs.
    pub fn from_profile(p: &Profile) -> Result<PinCosts, ProfileError> {
        let g = |k| p.get(k, "spe");
        Ok(PinCosts {
            pin_fixed: g("pin_fixed_ns")?,
            pin_page: g("pin_page_ns")?,
            repin_page: g("repin_page_ns")?,
            unpin_fixed: g("unpin_fixed_ns")?,
            unpin_page: g("unpin_page_ns")?,
            stage2_page: g("stage2_map_page_ns")?,
            walk_page: g("stage1_walk_page_ns")?,
            fault: g("stage2_fault_ns")?,
            irq_latency: g("pmbirq_latency_ns")?,
        })
    }
}

/// Pins as the profile prices them: the fixed part, then per page a pin (or re-pin of a
/// resident page) and a stage-2 map; an unpin is the fixed part and per page an unmap and an
/// unpin. The stage-1 walk is the enable's, not the pin's: [`run`] charges it.
#[derive(Debug, Clone, Copy)]
pub struct CostPinner {
    costs: PinCosts,
}

fn ns_of(v: f64) -> u64 {
    // Costs are non-negative and far below u64::MAX ns.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = v.max(0.0).round() as u64;
    n
}

fn pages(bytes: u64) -> f64 {
    (bytes / 4096) as f64
}

impl Pinner for CostPinner {
    fn pin(&mut self, _: u64, bytes: u64, resident: bool) -> Result<u64, BackendError> {
        let c = self.costs;
        let per_page = c.stage2_page + if resident { c.repin_page } else { c.pin_page };
        Ok(ns_of(c.pin_fixed + pages(bytes) * per_page))
    }

    fn unpin(&mut self, _: u64, bytes: u64) -> Result<u64, BackendError> {
        let c = self.costs;
        Ok(ns_of(
            c.unpin_fixed + pages(bytes) * (c.unpin_page + c.stage2_page),
        ))
    }

    /// `KVM_PRE_FAULT_MEMORY` over a guest_memfd buffer (`kvm_arch_vcpu_pre_fault_memory()` →
    /// `kvm_gmem_get_pfn()` then the stage-2 map): per page, the first fault-in of a fresh
    /// page that `pin_page_ns` measures (allocation and zeroing; no pin is taken) and the
    /// stage-2 map. One ioctl, no pin bookkeeping: no fixed part beyond the pages.
    fn prefault(&mut self, _: u64, bytes: u64) -> Result<u64, BackendError> {
        let c = self.costs;
        Ok(ns_of(pages(bytes) * (c.pin_page + c.stage2_page)))
    }
}

/// The buffer's stage-2 mappings without pinning, and where SPE writes next.
#[derive(Debug)]
struct Unpinned {
    mapped: Vec<bool>,
    /// Next record, counted from the buffer's start (the buffer wraps).
    cursor: u64,
}

impl Unpinned {
    fn new(buffer_bytes: u64) -> Unpinned {
        Unpinned {
            mapped: vec![false; usize::try_from(buffer_bytes / 4096).unwrap_or(0)],
            cursor: 0,
        }
    }

    /// SPE writes `records` over a slice: every unmapped page it reaches faults. A fault
    /// stops profiling for the PMBIRQ latency plus the fault's handling, losing the records
    /// that time would have taken; then the page is mapped and writing resumes.
    /// Returns (faults, records lost, ns in faults).
    fn write(&mut self, records: u64, records_per_ms: u64, c: &PinCosts) -> (u64, u64, u64) {
        let n = self.mapped.len() as u64;
        if n == 0 || records_per_ms == 0 {
            return (0, 0, 0);
        }
        let blackout_ns = c.irq_latency + c.fault;
        // Records the SPU would have written while stopped (at least the faulting one).
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let lost_per_fault = ((blackout_ns * records_per_ms as f64 / 1e6).ceil() as u64).max(1);
        let (mut faults, mut lost, mut written) = (0, 0, 0);
        while written + lost < records {
            let page = usize::try_from((self.cursor / RECORDS_PER_PAGE) % n).unwrap_or(0);
            if !self.mapped[page] {
                self.mapped[page] = true;
                faults += 1;
                let l = lost_per_fault.min(records - written - lost);
                lost += l;
            } else {
                // Write up to the end of this page.
                let room = RECORDS_PER_PAGE - self.cursor % RECORDS_PER_PAGE;
                let w = room.min(records - written - lost);
                written += w;
                self.cursor += w;
            }
        }
        (faults, lost, ns_of(faults as f64 * c.fault))
    }

    /// While the task is switched out the host removes `pct`% of the mapped pages from
    /// stage 2 (spread over the buffer, a different set each time).
    fn unmap(&mut self, pct: u32, round: u32) {
        if pct == 0 {
            return;
        }
        for (i, m) in self.mapped.iter_mut().enumerate() {
            let spread = (i as u64 * 7919 + u64::from(round) * 104_729) % 100;
            if spread < u64::from(pct) {
                *m = false;
            }
        }
    }
}

/// Runs the trace on a simulated clock: the profiled task runs `slices` slices, switched out
/// for `off_ns` between them; in per-task mode the buffer is disabled at every switch-out and
/// enabled at every switch-in. Every enable walks guest stage 1 over the buffer.
pub fn run(costs: &PinCosts, plan: &PinPlan) -> Result<PinResult, BackendError> {
    let mut cache = PinCache::new(CostPinner { costs: *costs }, plan);
    let records_per_slice = plan.slice_ns / 1_000_000 * plan.records_per_ms;
    let walk_ns = ns_of(pages(plan.buffer_bytes) * costs.walk_page);
    let no_pin = plan.policy == PinPolicy::NoPin;
    let mut unpinned = no_pin.then(|| Unpinned::new(plan.buffer_bytes));
    let mut now = 0u64;
    // The enabled buffer and whether it is pinned.
    let mut enabled: Option<(u64, bool)> = None;
    for slice in 0..plan.slices {
        let addr = buffer_addr(plan, 0x4000_0000, slice);
        if plan.per_task || enabled.map(|(a, _)| a) != Some(addr) {
            if let Some((old, _)) = enabled.take() {
                now += cache.disable(now, old)?;
            }
            if !no_pin && plan.policy != PinPolicy::GmemPrefault {
                // The enable path walks first, pinned or not: VA→IPA may have changed.
                // (gmem-prefault: stage 2 is mapped ahead and stays, nothing to walk for.)
                cache.walked(walk_ns);
                now += walk_ns;
            }
            let (pinned, spent) = cache.enable(now, addr)?;
            now += spent;
            enabled = Some((addr, pinned));
            // A relocated buffer is new memory: nothing of it is mapped yet.
            if let Some(u) = unpinned.as_mut().filter(|_| {
                slice > 0 && plan.relocate_every > 0 && slice % plan.relocate_every == 0
            }) {
                *u = Unpinned::new(plan.buffer_bytes);
            }
        }
        if let Some(u) = unpinned.as_mut() {
            let (faults, lost, ns) = u.write(records_per_slice, plan.records_per_ms, costs);
            cache.faulted(faults, ns);
            cache.blackout(lost);
            now += ns;
        } else if enabled.is_some_and(|(_, pinned)| !pinned) {
            cache.blackout(records_per_slice);
        }
        now += plan.slice_ns;
        if plan.per_task
            && let Some((a, _)) = enabled.take()
        {
            now += cache.disable(now, a)?;
        }
        if let Some(u) = unpinned.as_mut() {
            u.unmap(plan.unmap_pct, slice);
        }
        now += plan.off_ns;
        now += cache.age(now, enabled.map(|(a, _)| a))?;
    }
    if let Some((a, _)) = enabled {
        now += cache.disable(now, a)?;
    }
    // The idle tail: the aging timer fires as pins come of age.
    let end = now + plan.tail_ns;
    while let Some(expiry) = cache.next_expiry().filter(|e| *e <= end) {
        now = now.max(expiry);
        now += cache.age(now, None)?;
    }
    Ok(cache.finish(now.max(end)).0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvlab_core::pinning::RECORDS_PER_MS;

    fn plan(policy: PinPolicy) -> PinPlan {
        PinPlan {
            buffer_bytes: 256 << 20,
            slices: 100,
            per_task: true,
            cap_bytes: 1 << 30,
            policy,
            slice_ns: 3_000_000,
            off_ns: 1_000_000,
            relocate_every: 0,
            tail_ns: 200_000_000,
            method: hvlab_core::pinning::PinMethod::Mlock,
            records_per_ms: RECORDS_PER_MS,
            unmap_pct: 0,
        }
    }

    fn costs() -> PinCosts {
        PinCosts::from_profile(&Profile::load("neoverse-n2-spe").unwrap()).unwrap()
    }

    #[test]
    fn eager_pins_every_slice_and_keep_pins_once() {
        let eager = run(&costs(), &plan(PinPolicy::Eager)).unwrap();
        let keep = run(&costs(), &plan(PinPolicy::Keep)).unwrap();
        assert!(
            eager.pin_ns >= 10 * keep.pin_ns,
            "{} vs {}",
            eager.pin_ns,
            keep.pin_ns
        );
        assert_eq!((eager.blackout_records, keep.blackout_records), (0, 0));
        assert_eq!(keep.unpin_ns, 0);
        // Keeping the pin does not spare the walk: every enable walks stage 1.
        assert_eq!(keep.walk_ns, eager.walk_ns);
        let one_walk = ns_of(65536.0 * costs().walk_page);
        assert_eq!(keep.walk_ns, 100 * one_walk);
        assert_eq!(keep.pinned_bytes_end, 256 << 20);
        assert_eq!(eager.pinned_bytes_end, 0);
    }

    #[test]
    fn aging_releases_pins_in_the_idle_tail() {
        let aging = run(&costs(), &plan(PinPolicy::Aging(50_000_000))).unwrap();
        assert_eq!(aging.pinned_bytes_end, 0);
        assert_eq!(aging.pinned_bytes_max, 256 << 20);
        let last = aging.timeline.iter().rev().find(|(_, b)| *b == 0).unwrap();
        assert!(last.0 > 400_000_000, "released at {} ns", last.0);
    }

    #[test]
    fn a_buffer_over_the_cap_blacks_out() {
        let mut p = plan(PinPolicy::Keep);
        p.cap_bytes = 128 << 20;
        let r = run(&costs(), &p).unwrap();
        assert_eq!(r.pin_ns, 0);
        assert_eq!(r.blackout_records, 100 * 3 * RECORDS_PER_MS);
    }

    #[test]
    fn gmem_prefault_maps_each_buffer_once_and_pins_and_walks_nothing() {
        let gmem = run(&costs(), &plan(PinPolicy::GmemPrefault)).unwrap();
        assert_eq!((gmem.pins, gmem.prefaults), (0, 1));
        assert_eq!((gmem.pin_ns, gmem.unpin_ns, gmem.walk_ns), (0, 0, 0));
        assert_eq!(gmem.pinned_bytes_max, 0);
        assert_eq!(gmem.blackout_records, 0);
        let c = costs();
        assert_eq!(
            gmem.prefault_ns,
            ns_of(65536.0 * (c.pin_page + c.stage2_page))
        );
        // A relocated buffer is new memory: one pre-fault per generation.
        let mut moving = plan(PinPolicy::GmemPrefault);
        moving.relocate_every = 25;
        assert_eq!(run(&costs(), &moving).unwrap().prefaults, 4);
        // Cheaper per switch than pinning once and walking on every enable.
        let keep = run(&costs(), &plan(PinPolicy::Keep)).unwrap();
        assert!(gmem.prefault_ns < keep.pin_ns + keep.walk_ns);
    }

    use proptest::prelude::*;

    proptest! {
        /// No policy, trace or cap ever holds more pinned bytes than the cap allows.
        #[test]
        fn pinned_bytes_never_exceed_the_cap(
            policy in 0u8..4,
            buffer_pages in 1u64..2048,
            cap_pages in 1u64..8192,
            slices in 1u32..60,
            relocate_every in 0u32..8,
            per_task in any::<bool>(),
        ) {
            let plan = PinPlan {
                buffer_bytes: buffer_pages * 4096,
                slices,
                per_task,
                cap_bytes: cap_pages * 4096,
                policy: [PinPolicy::Eager, PinPolicy::Keep, PinPolicy::Intersect, PinPolicy::Aging(5_000_000)][usize::from(policy)],
                slice_ns: 3_000_000,
                off_ns: 1_000_000,
                relocate_every,
                tail_ns: 20_000_000,
                method: hvlab_core::pinning::PinMethod::Mlock,
                records_per_ms: RECORDS_PER_MS,
                unmap_pct: 0,
            };
            let r = run(&costs(), &plan).unwrap();
            prop_assert!(r.pinned_bytes_max <= plan.cap_bytes, "{} > cap {}", r.pinned_bytes_max, plan.cap_bytes);
            prop_assert!(r.timeline.iter().all(|(_, b)| *b <= plan.cap_bytes));
            // A buffer that fits is never blacked out.
            if plan.buffer_bytes <= plan.cap_bytes {
                prop_assert_eq!(r.blackout_records, 0);
            }
        }
    }

    #[test]
    fn intersect_drops_the_old_buffer_when_the_guest_moves_it() {
        let mut p = plan(PinPolicy::Intersect);
        p.relocate_every = 10;
        let r = run(&costs(), &p).unwrap();
        assert_eq!(r.pinned_bytes_max, 256 << 20);
        let mut k = plan(PinPolicy::Keep);
        k.relocate_every = 10;
        let kept = run(&costs(), &k).unwrap();
        assert_eq!(kept.pinned_bytes_max, 1 << 30, "keep holds up to the cap");
    }

    #[test]
    fn every_enable_walks_and_per_cpu_mode_walks_once() {
        let mut p = plan(PinPolicy::Keep);
        p.per_task = false;
        let r = run(&costs(), &p).unwrap();
        assert_eq!(r.walk_ns, ns_of(65536.0 * costs().walk_page));
    }

    #[test]
    fn pin_costs_have_a_fixed_part() {
        let c = costs();
        let mut pinner = CostPinner { costs: c };
        let one = pinner.pin(0, 4096, true).unwrap();
        let two = pinner.pin(0, 8192, true).unwrap();
        assert!(one > 0 && two > one);
        // Doubling one page does not double the cost: the fixed part dominates.
        assert!(two < 2 * one);
    }

    #[test]
    fn no_pin_faults_each_page_once_and_loses_records_per_fault() {
        let mut p = plan(PinPolicy::NoPin);
        // 16 pages, written round and round by 100 slices of 300 records.
        p.buffer_bytes = 64 << 10;
        let r = run(&costs(), &p).unwrap();
        assert_eq!((r.pin_ns, r.unpin_ns, r.walk_ns), (0, 0, 0));
        assert_eq!(r.pinned_bytes_max, 0);
        // Each page faults in once and then stays mapped.
        assert_eq!(r.stage2_faults, 16, "{r:?}");
        assert!(r.blackout_records >= r.stage2_faults, "{r:?}");
        assert!(r.blackout_records < 100 * 300);
        // A host that keeps taking pages away makes the guest fault again and again.
        p.unmap_pct = 100;
        let worst = run(&costs(), &p).unwrap();
        assert!(worst.stage2_faults >= 100 * 4, "{worst:?}");
        assert!(worst.blackout_records > r.blackout_records);
        // Without records there is nothing to fault on.
        p.records_per_ms = 0;
        assert_eq!(run(&costs(), &p).unwrap().stage2_faults, 0);
    }
}
