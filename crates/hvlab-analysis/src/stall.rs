//! Grace-period stall detection and attribution over an ioctl timeline.
//!
//! A *stall* is an ioctl slower than its own unstalled baseline by more than half a jiffy:
//! nothing in KVM's construction ioctls takes that long except waiting for an SRCU grace
//! period. It is attributed to the I/O-bus registration that started the grace period in
//! flight: the first registration since the last point at which no grace period could be
//! pending (the previous stall, or a memslot update that did not stall — an expedited
//! `synchronize_srcu_expedited` finishes only after any normal grace period in flight), or a
//! later one that came when that grace period must have ended (a normal grace period without
//! long readers ends within two jiffies: device activation during boot starts its own).
//!
//! The same code reads hvlab's own lifecycle timelines and external VMMs' strace timelines.

use std::collections::HashMap;

use hvlab_core::ioctl_table::{SrcuEffect, SrcuKernel, srcu_effect};
use hvlab_core::lifecycle::IoctlEvent;

/// `KVM_RUN` durations are guest execution, not ioctl cost; they are never stalls.
fn judged(name: &str) -> bool {
    name != "KVM_RUN"
}

/// Unstalled cost per ioctl name: the fastest observation of that ioctl. With at least one
/// unstalled observation this is the unstalled cost; when every observation stalled it is
/// inflated, which can only hide a stall, never invent one.
#[derive(Debug, Clone, Default)]
pub struct Baselines {
    fastest: HashMap<String, u64>,
    typical: u64,
}

impl Baselines {
    /// Learns baselines from any number of timelines.
    pub fn learn<'a>(events: impl IntoIterator<Item = &'a IoctlEvent>) -> Baselines {
        let mut fastest: HashMap<String, u64> = HashMap::new();
        let mut all = Vec::new();
        for e in events.into_iter().filter(|e| judged(&e.name)) {
            let entry = fastest.entry(e.name.clone()).or_insert(u64::MAX);
            *entry = (*entry).min(e.dur_ns);
            all.push(e.dur_ns);
        }
        all.sort_unstable();
        let typical = all.get(all.len() / 2).copied().unwrap_or(0);
        Baselines { fastest, typical }
    }

    /// The baseline of `name`: its fastest observation, but never above the median of all
    /// ioctls. No construction ioctl legitimately takes half a jiffy, so the cap cannot invent
    /// a stall; it keeps a run where every observation stalled (a single stalling order, an
    /// ioctl seen once) from hiding the stall in its own baseline.
    pub fn of(&self, name: &str) -> u64 {
        self.fastest
            .get(name)
            .map_or(self.typical, |fastest| (*fastest).min(self.typical))
    }
}

/// A stall is an ioctl slower than its baseline by more than a jiffy divided by this: half a
/// jiffy, since nothing in the construction ioctls but a grace period takes that long.
const JIFFY_DIVISOR: u64 = 2;

/// The stall rule in jiffies (half a jiffy): slower by more is a grace period waited out, by
/// less none was (a kab judges an ioctl's jiffies by it too).
#[allow(clippy::cast_precision_loss)] // 2
pub const STALL_JIFFIES: f64 = 1.0 / JIFFY_DIVISOR as f64;

/// An ioctl slower than its unstalled baseline by more than half a jiffy.
#[derive(Debug, Clone, PartialEq)]
pub struct Stall {
    /// Index of the stalled event in the timeline.
    pub index: usize,
    /// Its name.
    pub name: String,
    /// Its duration.
    pub dur_ns: u64,
    /// Duration beyond the baseline.
    pub excess_ns: u64,
    /// The excess in jiffies.
    pub jiffies: f64,
    /// The ioctl that started the SRCU grace period this one waited for: (index, name), its
    /// own index when it waited out a grace period of its own. `None` means the slowness has
    /// no known cause: the ioctl cannot wait for `kvm->srcu` on this kernel, or no grace
    /// period was in flight. Only a `Some` is an SRCU stall.
    pub caused_by: Option<(usize, String)>,
}

/// How long after a registration its grace period can still be pending: generous, since
/// SRCU's normal grace period is a few jiffies plus callback invocation.
pub const MAX_GRACE_PERIOD_JIFFIES: u64 = 16;

/// How long a normal grace period with no long readers lasts at most: its work is delayed one
/// jiffy, which runs on the second tick (`srcu_funnel_gp_start()`, the timer wheel's
/// round-up), plus the hand-offs. A registration later than this after the one that started
/// the pending grace period finds SRCU idle and starts a grace period of its own.
pub const IDLE_GRACE_PERIOD_JIFFIES: u64 = 3;

/// The SRCU effect of each event of a timeline from a real kernel, by ioctl and flags.
pub fn kernel_effects(kernel: SrcuKernel) -> impl Fn(usize, &IoctlEvent) -> SrcuEffect {
    move |_, e| srcu_effect(&e.name, e.flags, &kernel)
}

/// Finds the stalls of one timeline (events in issue order). `effect` says what each event
/// does to `kvm->srcu`: [`kernel_effects`] for a real kernel, or exactly what a model did.
///
/// A grace period is pending from the first event that starts one until an event that can
/// wait finishes (an expedited synchronization finishes only after any normal grace period in
/// flight). A slow event that can wait while one is pending waited for it; any other slow
/// event is slow for a reason this analysis does not know.
pub fn find_stalls(
    events: &[IoctlEvent],
    baselines: &Baselines,
    jiffy_ns: u64,
    effect: impl Fn(usize, &IoctlEvent) -> SrcuEffect,
) -> Vec<Stall> {
    let threshold = jiffy_ns / JIFFY_DIVISOR;
    let window = jiffy_ns.saturating_mul(MAX_GRACE_PERIOD_JIFFIES);
    let ended = jiffy_ns.saturating_mul(IDLE_GRACE_PERIOD_JIFFIES);
    let mut pending: Option<usize> = None;
    let mut stalls = Vec::new();
    for (i, e) in events.iter().enumerate() {
        if !judged(&e.name) {
            continue;
        }
        // A grace period started too long ago has surely ended.
        if let Some(p) = pending
            && e.start_ns.saturating_sub(events[p].start_ns) > window
        {
            pending = None;
        }
        let srcu = effect(i, e);
        let excess = e.dur_ns.saturating_sub(baselines.of(&e.name));
        let stalled = excess > threshold;
        if stalled {
            stalls.push(Stall {
                index: i,
                name: e.name.clone(),
                dur_ns: e.dur_ns,
                excess_ns: excess,
                jiffies: excess as f64 / jiffy_ns.max(1) as f64,
                caused_by: pending
                    .or(srcu.own_gp.then_some(i))
                    .filter(|_| srcu.waits)
                    .map(|p| (p, events[p].name.clone())),
            });
        }
        // An event that may either wait or start one (a traced KVM_IOEVENTFD whose flags are
        // not visible) proves nothing when it is fast; when it is slow it was the waiting kind.
        let ambiguous = srcu.waits && srcu.starts_gp;
        if srcu.waits && (stalled || !ambiguous) {
            pending = None;
        } else if srcu.starts_gp
            && pending.is_none_or(|p| e.start_ns.saturating_sub(events[p].start_ns) > ended)
        {
            pending = Some(i);
        }
    }
    stalls
}

#[cfg(test)]
mod tests {
    use super::*;

    use hvlab_core::ioctl_table::BusRegistration;

    const JIFFY: u64 = 4_000_000; // HZ=250
    const K6_18: SrcuKernel = SrcuKernel {
        registration: BusRegistration::Defers,
        vcpu_creation_adds_memslot: false,
    };
    const K6_12: SrcuKernel = SrcuKernel {
        registration: BusRegistration::Synchronizes,
        vcpu_creation_adds_memslot: false,
    };

    fn stalls_on(kernel: SrcuKernel, t: &[IoctlEvent], base: &Baselines) -> Vec<Stall> {
        find_stalls(t, base, JIFFY, kernel_effects(kernel))
    }

    fn timeline(steps: &[(&str, u64)]) -> Vec<IoctlEvent> {
        let mut t = 0;
        steps
            .iter()
            .map(|(name, dur)| {
                let e = IoctlEvent {
                    name: (*name).into(),
                    start_ns: t,
                    dur_ns: *dur,
                    flags: None,
                };
                t += dur + 1_000;
                e
            })
            .collect()
    }

    #[test]
    fn memslot_after_irqchip_is_a_stall_caused_by_the_irqchip() {
        let slow = timeline(&[
            ("KVM_CREATE_VM", 200_000),
            ("KVM_CREATE_IRQCHIP", 70_000),
            ("KVM_CREATE_PIT2", 70_000),
            ("KVM_SET_USER_MEMORY_REGION", 7_500_000),
            ("KVM_CREATE_VCPU", 60_000),
            ("KVM_RUN", 90_000),
        ]);
        let fast = timeline(&[
            ("KVM_CREATE_VM", 200_000),
            ("KVM_SET_USER_MEMORY_REGION", 40_000),
            ("KVM_CREATE_IRQCHIP", 30_000),
            ("KVM_CREATE_PIT2", 50_000),
            ("KVM_CREATE_VCPU", 60_000),
            ("KVM_RUN", 90_000),
        ]);
        let base = Baselines::learn(slow.iter().chain(&fast));
        let stalls = stalls_on(K6_18, &slow, &base);
        assert_eq!(stalls.len(), 1);
        let s = &stalls[0];
        assert_eq!(
            (s.index, s.name.as_str()),
            (3, "KVM_SET_USER_MEMORY_REGION")
        );
        assert_eq!(s.caused_by, Some((1, "KVM_CREATE_IRQCHIP".into())));
        assert_eq!(s.excess_ns, 7_460_000);
        assert!((s.jiffies - 1.865).abs() < 1e-9);
        assert!(stalls_on(K6_18, &fast, &base).is_empty());
    }

    #[test]
    fn the_first_registration_since_the_last_sync_gets_the_blame() {
        // QEMU microvm: eight deferred ioeventfd registrations, the ninth waits.
        let mut steps = vec![("KVM_CREATE_VM", 300_000)];
        steps.extend(std::iter::repeat_n(("KVM_IOEVENTFD", 13_000), 8));
        steps.push(("KVM_IOEVENTFD", 6_615_000));
        steps.extend(std::iter::repeat_n(("KVM_IOEVENTFD", 26_000), 5));
        let t = timeline(&steps);
        let stalls = stalls_on(K6_18, &t, &Baselines::learn(&t));
        assert_eq!(stalls.len(), 1);
        assert_eq!(stalls[0].index, 9);
        assert_eq!(stalls[0].caused_by, Some((1, "KVM_IOEVENTFD".into())));
    }

    #[test]
    fn an_unstalled_memslot_update_clears_the_pending_grace_period() {
        let t = timeline(&[
            ("KVM_CREATE_IRQCHIP", 70_000),
            ("KVM_SET_USER_MEMORY_REGION", 40_000),
            ("KVM_SET_USER_MEMORY_REGION", 40_000),
            ("KVM_CREATE_VCPU", 60_000),
            ("KVM_CREATE_VCPU", 6_000_000),
        ]);
        let stalls = stalls_on(K6_18, &t, &Baselines::learn(&t));
        assert_eq!(stalls.len(), 1);
        assert_eq!(
            stalls[0].caused_by, None,
            "no registration since the last sync"
        );
    }

    #[test]
    fn slowness_below_half_a_jiffy_is_not_a_stall() {
        let t = timeline(&[
            ("KVM_IOEVENTFD", 13_000),
            ("KVM_SET_USER_MEMORY_REGION", 40_000),
            ("KVM_SET_USER_MEMORY_REGION", 40_000 + JIFFY / 2 - 1),
        ]);
        assert!(stalls_on(K6_18, &t, &Baselines::learn(&t)).is_empty());
    }

    #[test]
    fn kvm_run_is_guest_time_never_a_stall() {
        let t = timeline(&[
            ("KVM_IOEVENTFD", 13_000),
            ("KVM_RUN", 50_000_000),
            ("KVM_RUN", 1_000),
        ]);
        assert!(stalls_on(K6_18, &t, &Baselines::learn(&t)).is_empty());
    }

    #[test]
    fn registrations_older_than_the_window_are_not_blamed() {
        let late = JIFFY * (MAX_GRACE_PERIOD_JIFFIES + 5);
        let ev = |name: &str, start_ns, dur_ns| IoctlEvent {
            name: name.into(),
            start_ns,
            dur_ns,
            flags: None,
        };
        // Only the window can clear the pending registration: no sync lies in between. The
        // trailing unstalled memslot gives the baseline.
        let t = vec![
            ev("KVM_CREATE_IRQCHIP", 0, 70_000),
            ev("KVM_SET_USER_MEMORY_REGION", late, 6_000_000),
            ev("KVM_SET_USER_MEMORY_REGION", late + 7_000_000, 40_000),
        ];
        let stalls = stalls_on(K6_18, &t, &Baselines::learn(&t));
        assert_eq!(stalls.len(), 1);
        assert_eq!(stalls[0].caused_by, None);
    }

    #[test]
    fn a_single_observation_is_judged_against_the_typical_ioctl() {
        let t = timeline(&[
            ("KVM_CREATE_VM", 300_000),
            ("KVM_CREATE_IRQCHIP", 70_000),
            ("KVM_SET_TSS_ADDR", 12_000),
            ("KVM_ENABLE_CAP", 12_000),
            ("KVM_SET_USER_MEMORY_REGION", 7_000_000),
        ]);
        let stalls = stalls_on(K6_18, &t, &Baselines::learn(&t));
        assert_eq!(stalls.len(), 1);
        assert_eq!(stalls[0].caused_by, Some((1, "KVM_CREATE_IRQCHIP".into())));
    }

    #[test]
    fn on_a_synchronizing_kernel_slow_noise_is_not_an_srcu_stall() {
        // Linux 6.12 under emulation: every ioctl is sometimes slow, but no registration
        // starts a grace period, so nothing can be blamed on one.
        let t = timeline(&[
            ("KVM_SET_REGS", 10_000),
            ("KVM_SET_REGS", 10_000),
            ("KVM_SET_REGS", 10_000),
            ("KVM_SET_REGS", 10_000),
            ("KVM_CREATE_VM", 16_000_000),
            ("KVM_CREATE_IRQCHIP", 70_000),
            ("KVM_CREATE_PIT2", 6_000_000),
            ("KVM_SET_USER_MEMORY_REGION", 40_000),
            ("KVM_SET_SREGS", 5_000_000),
            ("KVM_SET_USER_MEMORY_REGION", 9_000_000),
        ]);
        let stalls = stalls_on(K6_12, &t, &Baselines::learn(&t));
        assert_eq!(stalls.len(), 4);
        assert!(stalls.iter().all(|s| s.caused_by.is_none()), "{stalls:?}");
    }

    #[test]
    fn an_ioctl_that_cannot_wait_is_never_blamed_on_a_pending_grace_period() {
        let t = timeline(&[
            ("KVM_CREATE_IRQCHIP", 70_000),
            ("KVM_SET_SREGS", 40_000),
            ("KVM_SET_SREGS", 6_000_000),
            ("KVM_SET_USER_MEMORY_REGION", 7_000_000),
            ("KVM_SET_USER_MEMORY_REGION", 40_000),
        ]);
        let stalls = stalls_on(K6_18, &t, &Baselines::learn(&t));
        assert_eq!(stalls.len(), 2);
        assert_eq!(
            (stalls[0].name.as_str(), &stalls[0].caused_by),
            ("KVM_SET_SREGS", &None)
        );
        // The grace period was still pending when the memslot update came.
        assert_eq!(stalls[1].caused_by, Some((0, "KVM_CREATE_IRQCHIP".into())));
    }

    #[test]
    fn a_registration_long_after_the_pending_one_starts_its_own_grace_period() {
        // Device activation during boot: the irqchip's grace period ended long before the
        // boot registrations, so the memslot update waits for theirs.
        let ev = |name: &str, start_ns, dur_ns| IoctlEvent {
            name: name.into(),
            start_ns,
            dur_ns,
            flags: None,
        };
        let boot = 50_000_000;
        let t = vec![
            ev("KVM_SET_USER_MEMORY_REGION", 0, 40_000),
            ev("KVM_CREATE_IRQCHIP", 100_000, 30_000),
            ev("KVM_IOEVENTFD", boot, 2_000),
            ev("KVM_IOEVENTFD", boot + 10_000, 2_000),
            ev("KVM_SET_USER_MEMORY_REGION", boot + 20_000, 7_000_000),
        ];
        let stalls = stalls_on(K6_18, &t, &Baselines::learn(&t));
        assert_eq!(stalls.len(), 1);
        assert_eq!(stalls[0].caused_by, Some((2, "KVM_IOEVENTFD".into())));
        // Within the grace period's reach, the first registration keeps the blame.
        let mut near = t.clone();
        near[2].start_ns = 200_000;
        near[3].start_ns = 210_000;
        near[4].start_ns = 220_000;
        let stalls = stalls_on(K6_18, &near, &Baselines::learn(&near));
        assert_eq!(stalls[0].caused_by, Some((1, "KVM_CREATE_IRQCHIP".into())));
    }

    #[test]
    fn a_deassign_waits_and_an_assign_does_not() {
        let mut t = timeline(&[
            ("KVM_IOEVENTFD", 13_000),
            ("KVM_IOEVENTFD", 5_000_000),
            ("KVM_IOEVENTFD", 13_000),
        ]);
        t[0].flags = Some(0);
        t[1].flags = Some(hvlab_core::ioctl_table::KVM_IOEVENTFD_FLAG_DEASSIGN);
        let stalls = stalls_on(K6_18, &t, &Baselines::learn(&t));
        assert_eq!(stalls[0].caused_by, Some((0, "KVM_IOEVENTFD".into())));
        t[1].flags = Some(0);
        let stalls = stalls_on(K6_18, &t, &Baselines::learn(&t));
        assert_eq!(
            stalls[0].caused_by, None,
            "an assign defers, it never waits on 6.18"
        );
    }
}
