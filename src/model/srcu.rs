//! The `lifecycle` model: KVM's I/O-bus registrations and memslot swaps on an SRCU timeline.
//!
//! Mirrors, in kernel/rcu/srcutree.c: `call_srcu()` → `srcu_gp_start_if_needed()` /
//! `srcu_funnel_gp_start()` (a callback queued while a grace period is in flight needs the
//! *next* one), the normal grace period's state machine driven from `process_srcu()` with
//! `SRCU_STATE_SCAN1`/`SRCU_STATE_SCAN2` re-queued `srcu_get_delay()` = `SRCU_INTERVAL` (one
//! jiffy) apart, so it completes on a timer tick; `synchronize_srcu_expedited()` →
//! `__synchronize_srcu(do_norm = false)`, which cannot complete before the normal grace period
//! in flight and then expedites the next; and `synchronize_srcu()`, which takes the expedited
//! path when `srcu_might_be_idle()` (no readers) and waits a normal grace period otherwise.
//! In virt/kvm/kvm_main.c: `kvm_io_bus_register_dev()` (defer or sync the old bus array's
//! free, per strategy) and `kvm_swap_active_memslots()` (expedited sync).

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::profile::{Profile, ProfileError};
use crate::backend::ioctl_table::SrcuEffect;
use crate::backend::lifecycle::{ConstructionPlan, ConstructionTrace, IoctlEvent, Step, Strategy};

/// SRCU state for one VM's `kvm->srcu`.
#[derive(Debug, Clone)]
pub struct Srcu {
    tick_ns: u64,
    /// Where ticks fall: boundaries at `phase + k × tick`.
    phase_ns: u64,
    phases: u64,
    wakeup_ns: u64,
    /// End of the normal grace period in flight.
    in_flight: Option<u64>,
    /// A callback queued after the in-flight grace period started needs another one.
    next_needed: bool,
}

impl Srcu {
    /// An idle SRCU whose timer ticks start `phase_ns` into the first jiffy.
    pub fn new(tick_ns: u64, phase_ns: u64, phases: u64, wakeup_ns: u64) -> Srcu {
        Srcu {
            tick_ns: tick_ns.max(1),
            phase_ns: phase_ns % tick_ns.max(1),
            phases: phases.max(1),
            wakeup_ns,
            in_flight: None,
            next_needed: false,
        }
    }

    /// The first tick strictly after `t`.
    fn next_tick(&self, t: u64) -> u64 {
        if t < self.phase_ns {
            return self.phase_ns;
        }
        self.phase_ns + ((t - self.phase_ns) / self.tick_ns + 1) * self.tick_ns
    }

    /// When a normal grace period started at `t` completes: each scan phase runs from the
    /// workqueue on the next tick, and the waiters run after the callbacks are invoked.
    fn normal_gp_end(&self, t: u64) -> u64 {
        self.next_tick(t) + (self.phases - 1) * self.tick_ns + self.wakeup_ns
    }

    /// Retires grace periods that ended by `now`, starting the one a queued callback needs.
    fn advance(&mut self, now: u64) {
        while let Some(end) = self.in_flight {
            if end > now {
                return;
            }
            self.in_flight = if self.next_needed {
                self.next_needed = false;
                Some(self.normal_gp_end(end))
            } else {
                None
            };
        }
    }

    /// Whether a normal grace period is in flight at `now`.
    pub fn busy(&mut self, now: u64) -> bool {
        self.advance(now);
        self.in_flight.is_some()
    }

    /// `call_srcu()` at `now`: returns at once; starts a normal grace period, or queues behind
    /// the one in flight.
    pub fn call_srcu(&mut self, now: u64) {
        self.advance(now);
        if self.in_flight.is_some() {
            self.next_needed = true;
        } else {
            self.in_flight = Some(self.normal_gp_end(now));
        }
    }

    /// `synchronize_srcu_expedited()` at `now`: how long the caller waits beyond the expedited
    /// grace period itself (part of the ioctl's base cost): the rest of a normal grace period
    /// in flight. The grace period a queued callback needed is then expedited too.
    pub fn synchronize_expedited(&mut self, now: u64) -> u64 {
        self.advance(now);
        let wait = self.in_flight.map_or(0, |end| end - now);
        self.in_flight = None;
        self.next_needed = false;
        wait
    }

    /// `synchronize_srcu()` at `now`: expedited when idle with no readers, else a whole normal
    /// grace period (after the one in flight, if any).
    pub fn synchronize(&mut self, now: u64, readers: bool) -> u64 {
        self.advance(now);
        match (self.in_flight, readers) {
            (None, false) => 0,
            (None, true) => self.normal_gp_end(now) - now,
            (Some(end), _) => {
                let after = self.normal_gp_end(end);
                self.in_flight = Some(after);
                self.next_needed = false;
                after - now
            }
        }
    }
}

/// Per-step costs from a profile.
#[derive(Debug, Clone)]
pub struct LifecycleCosts {
    hz: u64,
    phases: u64,
    wakeup_ns: u64,
    first_vcpu_adds_memslot: bool,
    create_vm: u64,
    tss: u64,
    irqchip: u64,
    pit: u64,
    memslot: u64,
    vcpu: u64,
    ioeventfd: u64,
    regs: u64,
    first_run: u64,
    gap: u64,
}

fn ns(p: &Profile, key: &str) -> Result<u64, ProfileError> {
    let v = p.get(key, "srcu")?;
    // Costs are non-negative nanoseconds well inside u64.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    Ok(v.max(0.0).round() as u64)
}

impl LifecycleCosts {
    /// Reads the lifecycle costs; `hz` overrides the profile's.
    pub fn from_profile(p: &Profile, hz: Option<u32>) -> Result<LifecycleCosts, ProfileError> {
        Ok(LifecycleCosts {
            hz: hz.map_or(ns(p, "hz")?, u64::from).max(1),
            phases: ns(p, "srcu_gp_phases")?,
            wakeup_ns: ns(p, "srcu_wakeup_ns")?,
            first_vcpu_adds_memslot: ns(p, "first_vcpu_adds_memslot")? != 0,
            create_vm: ns(p, "ioctl_create_vm_ns")?,
            tss: ns(p, "ioctl_tss_ns")?,
            irqchip: ns(p, "ioctl_irqchip_ns")?,
            pit: ns(p, "ioctl_pit_ns")?,
            memslot: ns(p, "ioctl_memslot_ns")?,
            vcpu: ns(p, "ioctl_vcpu_ns")?,
            ioeventfd: ns(p, "ioctl_ioeventfd_ns")?,
            regs: ns(p, "ioctl_regs_ns")?,
            first_run: ns(p, "first_run_ns")?,
            gap: ns(p, "vmm_gap_ns")?,
        })
    }

    /// One jiffy.
    pub fn jiffy_ns(&self) -> u64 {
        1_000_000_000 / self.hz
    }
}

/// `kvm_io_bus_register_dev()` calls per construction ioctl: the PIC registers its master,
/// slave and ELCR ranges and the IOAPIC one MMIO range (`kvm_pic_init`, `kvm_ioapic_init`);
/// the PIT its ports and the speaker (`kvm_create_pit`); an ioeventfd one range.
const IRQCHIP_REGISTRATIONS: u32 = 4;
const PIT_REGISTRATIONS: u32 = 2;

struct Timeline<'a> {
    costs: &'a LifecycleCosts,
    srcu: Srcu,
    strategy: Strategy,
    now: u64,
    vcpus: u32,
    running: bool,
    events: Vec<IoctlEvent>,
    effects: Vec<SrcuEffect>,
    /// What the ioctl under way did to SRCU so far.
    effect: SrcuEffect,
}

impl Timeline<'_> {
    /// One ioctl: `base` ns of its own work, then `srcu_work` at its end (which may wait).
    fn ioctl(&mut self, name: &str, base: u64, srcu_work: impl FnOnce(&mut Self) -> u64) {
        self.now += self.costs.gap;
        let start = self.now;
        self.now += base;
        self.effect = SrcuEffect::default();
        let wait = srcu_work(self);
        self.now += wait;
        self.effects.push(self.effect);
        self.events.push(IoctlEvent {
            name: name.to_string(),
            start_ns: start,
            dur_ns: self.now - start,
            flags: None,
        });
    }

    /// `synchronize_srcu_expedited()` at the end of the ioctl under way.
    fn synchronize_expedited(&mut self) -> u64 {
        self.effect.waits = true;
        self.srcu.synchronize_expedited(self.now)
    }

    /// `kvm_io_bus_register_dev()`'s free of the old bus array, per strategy.
    fn register(&mut self) -> u64 {
        let defer = match self.strategy {
            Strategy::AlwaysDefer => true,
            Strategy::AlwaysSync => false,
            Strategy::LifecycleKeyed => self.vcpus > 0,
        };
        if defer {
            self.effect.starts_gp |= !self.srcu.busy(self.now);
            self.srcu.call_srcu(self.now);
            0
        } else {
            self.effect.waits = true;
            // With readers and nothing in flight, synchronize_srcu() runs a whole grace
            // period of its own.
            self.effect.own_gp |= self.running && !self.srcu.busy(self.now);
            self.srcu.synchronize(self.now, self.running)
        }
    }

    fn registrations(&mut self, n: u32) -> u64 {
        (0..n).map(|_| self.register()).sum()
    }
}

/// Builds one VM in the plan's order on the model's timeline. `rng` draws where the timer
/// ticks fall relative to `KVM_CREATE_VM`: the one thing that varies between real runs.
pub fn construct(
    costs: &LifecycleCosts,
    plan: &ConstructionPlan,
    rng: &mut ChaCha8Rng,
) -> ConstructionTrace {
    let jiffy = costs.jiffy_ns();
    let phase = rng.random_range(0..jiffy);
    let mut t = Timeline {
        costs,
        srcu: Srcu::new(jiffy, phase, costs.phases, costs.wakeup_ns),
        strategy: plan.strategy,
        now: 0,
        vcpus: 0,
        running: false,
        events: Vec::new(),
        effects: Vec::new(),
        effect: SrcuEffect::default(),
    };
    let mut ready_ns = 0;
    for step in &plan.steps {
        match step {
            Step::CreateVm => t.ioctl("KVM_CREATE_VM", costs.create_vm, |_| 0),
            Step::TssAddr => t.ioctl("KVM_SET_TSS_ADDR", costs.tss, |_| 0),
            Step::Irqchip => t.ioctl("KVM_CREATE_IRQCHIP", costs.irqchip, |t| {
                t.registrations(IRQCHIP_REGISTRATIONS)
            }),
            Step::Pit => t.ioctl("KVM_CREATE_PIT2", costs.pit, |t| {
                t.registrations(PIT_REGISTRATIONS)
            }),
            Step::Memslot | Step::BootMemslot => {
                t.ioctl(
                    "KVM_SET_USER_MEMORY_REGION",
                    costs.memslot,
                    Timeline::synchronize_expedited,
                );
            }
            Step::Vcpus => {
                for _ in 0..plan.vcpus {
                    let adds_memslot = t.vcpus == 0 && costs.first_vcpu_adds_memslot;
                    t.ioctl("KVM_CREATE_VCPU", costs.vcpu, |t| {
                        if adds_memslot {
                            t.synchronize_expedited()
                        } else {
                            0
                        }
                    });
                    t.vcpus += 1;
                }
            }
            Step::Ioeventfds | Step::BootIoeventfds => {
                for _ in 0..plan.devices {
                    t.ioctl("KVM_IOEVENTFD", costs.ioeventfd, Timeline::register);
                }
            }
            Step::Run => {
                for name in [
                    "KVM_GET_SREGS",
                    "KVM_SET_SREGS",
                    "KVM_GET_REGS",
                    "KVM_SET_REGS",
                ] {
                    t.ioctl(name, costs.regs, |_| 0);
                }
                t.ioctl("KVM_RUN", costs.first_run, |_| 0);
                ready_ns = t.now;
                // From here vCPUs are in KVM_RUN: SRCU readers.
                t.running = true;
            }
        }
    }
    ConstructionTrace {
        ioctls: t.events,
        ready_ns,
        kvm_stats: Vec::new(),
        srcu_effects: t.effects,
    }
}

/// A seeded generator for a run.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const JIFFY: u64 = 4_000_000;

    #[test]
    fn a_normal_grace_period_completes_on_the_second_tick_after_it_starts() {
        let mut s = Srcu::new(JIFFY, 1_000_000, 2, 0);
        s.call_srcu(2_000_000);
        // Ticks at 1, 5, 9 ms: the GP started at 2 ms ends at 9 ms.
        assert_eq!(s.synchronize_expedited(2_500_000), 6_500_000);
        assert_eq!(
            s.synchronize_expedited(2_600_000),
            0,
            "nothing left in flight"
        );
    }

    #[test]
    fn a_callback_during_a_grace_period_needs_the_next_one() {
        let mut s = Srcu::new(JIFFY, 0, 2, 0);
        s.call_srcu(100); // GP1: ends at 8 ms
        s.call_srcu(200); // needs GP2, started when GP1 ends: ends at 16 ms
        assert!(s.busy(9_000_000), "GP2 runs after GP1");
        assert!(!s.busy(16_000_000));
        // An expedited sync during GP1 waits for GP1 only, then expedites GP2.
        let mut s = Srcu::new(JIFFY, 0, 2, 0);
        s.call_srcu(100);
        s.call_srcu(200);
        assert_eq!(s.synchronize_expedited(1_000_000), 7_000_000);
        assert!(!s.busy(1_000_001));
    }

    #[test]
    fn the_same_seed_gives_the_same_timeline_and_another_seed_another() {
        let p = Profile::load("pvm-epyc").unwrap();
        let costs = LifecycleCosts::from_profile(&p, None).unwrap();
        let plan = ConstructionPlan {
            // The irqchip-first order.
            steps: vec![
                Step::CreateVm,
                Step::Irqchip,
                Step::Pit,
                Step::Memslot,
                Step::Vcpus,
                Step::Ioeventfds,
                Step::Run,
            ],
            vcpus: 1,
            devices: 8,
            mem_bytes: 1 << 24,
            run_timeout: std::time::Duration::from_secs(1),
            strategy: Strategy::AlwaysDefer,
            hz: None,
        };
        let a = construct(&costs, &plan, &mut rng(7));
        let b = construct(&costs, &plan, &mut rng(7));
        let c = construct(&costs, &plan, &mut rng(8));
        assert_eq!(a, b);
        assert_ne!(a.ready_ns, c.ready_ns);
        // The memslot after the irqchip waits between 1 and 2 jiffies plus the wake-up.
        let memslot = a
            .ioctls
            .iter()
            .find(|e| e.name == "KVM_SET_USER_MEMORY_REGION")
            .unwrap();
        assert!(
            memslot.dur_ns > 4_000_000 && memslot.dur_ns < 8_000_000 + 1_000_000,
            "{}",
            memslot.dur_ns
        );
    }

    #[test]
    fn synchronize_is_cheap_without_readers_and_a_grace_period_with_them() {
        let mut s = Srcu::new(JIFFY, 0, 2, 0);
        assert_eq!(s.synchronize(1_000_000, false), 0);
        assert_eq!(s.synchronize(1_000_000, true), 7_000_000);
    }
}
