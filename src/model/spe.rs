//! The `pinning` model: SPE buffer pins under a policy, over a context-switch trace.
//!
//! Mirrors the proposed KVM arm64 SPE handling: on a guest write enabling the profiling buffer
//! (PMBLIMITR_EL1.E), walk guest stage 1 over the buffer and pin and map every page
//! (`pin_user_pages` semantics: a page not yet resident is faulted in first); on disable,
//! unpin — plus the proposed heuristics, which keep pins across disables and release them by
//! intersection or age, under a cap on pinned memory (least recently used pins go first).

use super::profile::{Profile, ProfileError};
use crate::scenario::pinning::{PinPlan, PinPolicy, PinResult};

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

/// Records SPE writes per ms of profiling (a 4 KiB page holds 64 records of 64 bytes; at the
/// default sampling interval a busy task fills a few pages a millisecond).
pub const RECORDS_PER_MS: u64 = 100;

#[derive(Debug, Clone)]
struct Pin {
    /// Guest address of the buffer (relocations give new addresses).
    addr: u64,
    bytes: u64,
    last_used: u64,
}

struct PinManager<'a> {
    costs: &'a PinCosts,
    plan: &'a PinPlan,
    pins: Vec<Pin>,
    /// Buffers whose pages have been faulted in once.
    resident: Vec<u64>,
    now: u64,
    out: PinResult,
}

impl PinManager<'_> {
    fn pinned(&self) -> u64 {
        self.pins.iter().map(|p| p.bytes).sum()
    }

    fn record(&mut self) {
        let pinned = self.pinned();
        self.out.pinned_bytes_max = self.out.pinned_bytes_max.max(pinned);
        self.out.timeline.push((self.now, pinned));
    }

    fn unpin(&mut self, index: usize) {
        let p = self.pins.remove(index);
        let ns = (p.bytes / 4096) as f64 * self.costs.unpin_page;
        self.out.unpin_ns += ns_of(ns);
        self.now += ns_of(ns);
        self.record();
    }

    /// The aging timer: release pins unused for T (except `keep_addr`, in use now).
    fn age(&mut self, keep_addr: Option<u64>) {
        if let PinPolicy::Aging(t) = self.plan.policy {
            while let Some(i) = self.pins.iter().position(|p| {
                Some(p.addr) != keep_addr && self.now.saturating_sub(p.last_used) >= t
            }) {
                self.unpin(i);
            }
        }
    }

    /// The guest enables the buffer at `addr`; returns whether it is pinned (else blackout).
    fn enable(&mut self, addr: u64) -> bool {
        let bytes = self.plan.buffer_bytes;
        self.age(Some(addr));
        if let Some(p) = self.pins.iter_mut().find(|p| p.addr == addr) {
            p.last_used = self.now;
            return true;
        }
        if self.plan.policy == PinPolicy::Intersect {
            // Buffers are [addr, addr + bytes); relocated ones never overlap.
            while let Some(i) = self
                .pins
                .iter()
                .position(|p| p.addr + p.bytes <= addr || addr + bytes <= p.addr)
            {
                self.unpin(i);
            }
        }
        // Least recently used first, until the new pin fits under the cap.
        while self.pinned() + bytes > self.plan.cap_bytes && !self.pins.is_empty() {
            let lru = self
                .pins
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.last_used)
                .map_or(0, |(i, _)| i);
            self.unpin(lru);
        }
        if bytes > self.plan.cap_bytes {
            return false;
        }
        let resident = self.resident.contains(&addr);
        let per_page = self.costs.walk_page
            + if resident {
                self.costs.repin_page
            } else {
                self.costs.pin_page
            };
        let ns = ns_of((bytes / 4096) as f64 * per_page);
        self.out.pin_ns += ns;
        self.now += ns;
        if !resident {
            self.resident.push(addr);
        }
        self.pins.push(Pin {
            addr,
            bytes,
            last_used: self.now,
        });
        self.record();
        true
    }

    fn disable(&mut self, addr: u64) {
        if let Some(i) = self.pins.iter().position(|p| p.addr == addr) {
            self.pins[i].last_used = self.now;
            if self.plan.policy == PinPolicy::Eager {
                self.unpin(i);
            }
        }
    }
}

fn ns_of(v: f64) -> u64 {
    // Costs are non-negative and far below u64::MAX ns.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = v.max(0.0).round() as u64;
    n
}

/// Runs the trace: the profiled task runs `slices` slices, switched out for `off_ns` between
/// them; in per-task mode the buffer is disabled at every switch-out and enabled at every
/// switch-in.
pub fn run(costs: &PinCosts, plan: &PinPlan) -> PinResult {
    let mut m = PinManager {
        costs,
        plan,
        pins: Vec::new(),
        resident: Vec::new(),
        now: 0,
        out: PinResult {
            pin_ns: 0,
            unpin_ns: 0,
            pinned_bytes_max: 0,
            pinned_bytes_end: 0,
            blackout_records: 0,
            slices: plan.slices,
            timeline: vec![(0, 0)],
        },
    };
    let records_per_slice = plan.slice_ns / 1_000_000 * RECORDS_PER_MS;
    let addr_of = |slice: u32| {
        let generation = slice.checked_div(plan.relocate_every).unwrap_or(0);
        0x4000_0000 + u64::from(generation) * (plan.buffer_bytes + (1 << 21))
    };
    let mut enabled: Option<(u64, bool)> = None;
    for slice in 0..plan.slices {
        let addr = addr_of(slice);
        let pinned = match enabled {
            Some((a, p)) if a == addr && !plan.per_task => p,
            _ => {
                if let Some((old, _)) = enabled.take() {
                    m.disable(old);
                }
                m.enable(addr)
            }
        };
        enabled = Some((addr, pinned));
        if !pinned {
            m.out.blackout_records += records_per_slice;
        }
        m.now += plan.slice_ns;
        if plan.per_task {
            m.disable(addr);
            enabled = None;
        }
        m.now += plan.off_ns;
        m.age(None);
    }
    if let Some((a, _)) = enabled {
        m.disable(a);
    }
    // The idle tail: nothing runs; the aging timer fires when pins pass their age.
    let end = m.now + plan.tail_ns;
    if let PinPolicy::Aging(t) = plan.policy {
        while let Some(expiry) = m
            .pins
            .iter()
            .map(|p| p.last_used + t)
            .min()
            .filter(|e| *e <= end)
        {
            m.now = m.now.max(expiry);
            m.age(None);
        }
    }
    m.now = m.now.max(end);
    m.out.pinned_bytes_end = m.pinned();
    m.record();
    m.out
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }

    fn costs() -> PinCosts {
        PinCosts::from_profile(&Profile::load("neoverse-n2-spe").unwrap()).unwrap()
    }

    #[test]
    fn eager_pins_every_slice_and_keep_pins_once() {
        let eager = run(&costs(), &plan(PinPolicy::Eager));
        let keep = run(&costs(), &plan(PinPolicy::Keep));
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
        let aging = run(&costs(), &plan(PinPolicy::Aging(50_000_000)));
        assert_eq!(aging.pinned_bytes_end, 0);
        assert_eq!(aging.pinned_bytes_max, 256 << 20);
        let last = aging.timeline.iter().rev().find(|(_, b)| *b == 0).unwrap();
        assert!(last.0 > 400_000_000, "released at {} ns", last.0);
    }

    #[test]
    fn a_buffer_over_the_cap_blacks_out() {
        let mut p = plan(PinPolicy::Keep);
        p.cap_bytes = 128 << 20;
        let r = run(&costs(), &p);
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
            };
            let r = run(&costs(), &plan);
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
        let r = run(&costs(), &p);
        assert_eq!(r.pinned_bytes_max, 256 << 20);
        let mut k = plan(PinPolicy::Keep);
        k.relocate_every = 10;
        let kept = run(&costs(), &k);
        assert_eq!(kept.pinned_bytes_max, 1 << 30, "keep holds up to the cap");
    }
}
