//! The `pinning` model: SPE buffer pins under a policy, over a context-switch trace.
//!
//! Mirrors the proposed KVM arm64 SPE handling: on a guest write enabling the profiling buffer
//! (PMBLIMITR_EL1.E), walk guest stage 1 over the buffer and pin and map every page
//! (`pin_user_pages` semantics: a page not yet resident is faulted in first); on disable,
//! unpin — plus the proposed heuristics, which keep pins across disables and release them by
//! intersection or age, under a cap on pinned memory (least recently used pins go first).

use super::profile::{Profile, ProfileError};
use crate::backend::pinning::{PinCache, PinPlan, PinResult, Pinner, RECORDS_PER_MS, buffer_addr};
use crate::error::Error;

/// Per-page costs.
#[derive(Debug, Clone, Copy)]
pub struct PinCosts {
    pin_page: f64,
    repin_page: f64,
    unpin_page: f64,
    walk_page: f64,
}

impl PinCosts {
    /// Reads the costs.
    pub fn from_profile(p: &Profile) -> Result<PinCosts, ProfileError> {
        let g = |k| p.get(k, "spe");
        Ok(PinCosts {
            pin_page: g("pin_page_ns")?,
            repin_page: g("repin_page_ns")?,
            unpin_page: g("unpin_page_ns")?,
            walk_page: g("stage1_walk_page_ns")?,
        })
    }
}

/// Pins as the profile prices them: a stage-1 walk and a pin (or re-pin) per page.
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

impl Pinner for CostPinner {
    fn pin(&mut self, _: u64, bytes: u64, resident: bool) -> Result<u64, Error> {
        let per_page = self.costs.walk_page
            + if resident {
                self.costs.repin_page
            } else {
                self.costs.pin_page
            };
        Ok(ns_of((bytes / 4096) as f64 * per_page))
    }

    fn unpin(&mut self, _: u64, bytes: u64) -> Result<u64, Error> {
        Ok(ns_of((bytes / 4096) as f64 * self.costs.unpin_page))
    }
}

/// Runs the trace on a simulated clock: the profiled task runs `slices` slices, switched out
/// for `off_ns` between them; in per-task mode the buffer is disabled at every switch-out and
/// enabled at every switch-in.
pub fn run(costs: &PinCosts, plan: &PinPlan) -> Result<PinResult, Error> {
    let mut cache = PinCache::new(CostPinner { costs: *costs }, plan);
    let records_per_slice = plan.slice_ns / 1_000_000 * RECORDS_PER_MS;
    let mut now = 0u64;
    // The enabled buffer and whether it is pinned.
    let mut enabled: Option<(u64, bool)> = None;
    for slice in 0..plan.slices {
        let addr = buffer_addr(plan, 0x4000_0000, slice);
        if plan.per_task || enabled.map(|(a, _)| a) != Some(addr) {
            if let Some((old, _)) = enabled.take() {
                now += cache.disable(now, old)?;
            }
            let (pinned, spent) = cache.enable(now, addr)?;
            now += spent;
            enabled = Some((addr, pinned));
        }
        if enabled.is_some_and(|(_, pinned)| !pinned) {
            cache.blackout(records_per_slice);
        }
        now += plan.slice_ns;
        if plan.per_task
            && let Some((a, _)) = enabled.take()
        {
            now += cache.disable(now, a)?;
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
    use crate::backend::pinning::PinPolicy;

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
            method: crate::backend::pinning::PinMethod::Mlock,
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
                method: crate::backend::pinning::PinMethod::Mlock,
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
}
