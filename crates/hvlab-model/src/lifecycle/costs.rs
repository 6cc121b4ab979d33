//! What a construction costs, read from a profile: the hand-offs, the ioctls' own work, the
//! spread between builds and the boot thread's start.

use rand::RngExt;
use rand_chacha::ChaCha8Rng;

use crate::profile::{Profile, ProfileError};

/// Per-step costs from a profile.
#[derive(Debug, Clone)]
pub struct LifecycleCosts {
    hz: u64,
    pub(super) wakeup_ns: u64,
    /// A hand-off on the same CPU (`srcu_local_handoff_ns`; a profile without it prices it as
    /// `srcu_wakeup_ns`).
    pub(super) local_handoff_ns: u64,
    pub(super) timer_cpu_busy: f64,
    pub(super) first_vcpu_adds_memslot: bool,
    /// The registering ioctls' costs (`irqchip`, `pit`, `ioeventfd`) were measured on a kernel
    /// whose `kvm_io_bus_register_dev()` waits in `synchronize_srcu_expedited()` (before
    /// 6.18): each holds one expedited grace period on an idle SRCU per registration
    /// (`registration_synchronizes`; absent: measured on a kernel that defers, as every
    /// built-in profile's were).
    pub(super) registration_wait_measured: bool,
    pub(super) create_vm: u64,
    pub(super) tss: u64,
    pub(super) irqchip: u64,
    pub(super) pit: u64,
    pub(super) memslot: u64,
    /// A boot order's memslot update while vCPU 0 runs, where the profile measured it on a
    /// kernel where it does not stall (`None`: priced as the first memslot of a VM).
    pub(super) boot_memslot: Option<u64>,
    pub(super) vcpu: u64,
    pub(super) ioeventfd: u64,
    pub(super) regs: u64,
    pub(super) first_run: u64,
    pub(super) gap: u64,
    /// Where back-to-back builds start against the tick on a measured host (`None` each:
    /// not measured; each build starts where the last ended).
    pub(super) between_builds: BetweenBuilds,
    /// How the VMM's boot thread gets a CPU and wakes, on a measured host (`None`: it runs as
    /// soon as it is spawned and wakes from its `boot_ms` sleep exactly on time).
    pub(super) boot_thread: Option<BootThreadCosts>,
    /// `KVM_SET_CPUID2` per vCPU, where the profile prices it (x86 VMMs issue it).
    pub(super) cpuid: Option<u64>,
    /// Orders that boot, where the profile measured them: starting the boot thread (VMM
    /// time) and the first `KVM_RUN` of the 64-bit guest, ns.
    pub(super) boot_start: Option<(u64, u64)>,
}

/// What a VMM does between two back-to-back builds, on a measured host: it tears the last VM
/// down, then sets the next one up.
///
/// The teardown ends where `kvm_destroy_vm()` lets it, and that is on a tick: closing the VM's
/// last fd waits in `srcu_barrier(&kvm->srcu)` for the callbacks its registrations deferred
/// (`call_srcu()`, a normal grace period: its work and the callbacks' invocation both fire on
/// ticks), and with the TDP MMU in `rcu_barrier()` (`kvm_mmu_uninit_tdp_mmu()`, for the RCU
/// callbacks that free its page tables), then finishes the rest of the teardown (the memslots,
/// the VM's pages, the VMM's unmap of guest memory). So where a teardown ends against the tick
/// is a property of the VM torn down, whatever the tick was when its build ended; measured
/// here (AMD EPYC, Linux 6.18 PVM, HZ=250): 6-35 ms teardowns ending 0.29-0.48 ms after a tick
/// for the orders that do not boot, 0.57-0.67 ms for boot-activation (its vCPU thread stopped,
/// its populated memory unmapped); Debian 7.3 under TCG: 0.75-0.87 ms and 1.59 ms. The next
/// build's setup (its memory mapped and the payload written) is plain VMM time: 0.39-0.46 ms
/// here, 1.05-1.18 ms for a booting order's populated 64-bit guest (TCG: 1.72-1.74 ms and
/// 4.50 ms).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct BetweenBuilds {
    /// Where the last VM's teardown ended: time since the last tick, median and interquartile
    /// range, ns; `[the VM did not boot, it booted]`.
    teardown_end: [Option<(u64, u64)>; 2],
    /// The VMM's setup of the next VM, from that end to its `KVM_CREATE_VM`: median and
    /// interquartile range, ns; `[the next VM does not boot, it boots]`.
    setup: [Option<(u64, u64)>; 2],
}

impl BetweenBuilds {
    /// Where a build that `boots` starts after a VM that `previous_booted`: the time since
    /// the last tick at its `KVM_CREATE_VM`, when both parts are measured.
    pub(super) fn start_since_tick(
        &self,
        previous_booted: bool,
        boots: bool,
        jiffy_ns: u64,
        rng: &mut ChaCha8Rng,
    ) -> Option<u64> {
        let (teardown_end, setup) = (
            self.teardown_end[usize::from(previous_booted)]?,
            self.setup[usize::from(boots)]?,
        );
        Some((draw_spread(teardown_end, rng) + draw_spread(setup, rng)) % jiffy_ns.max(1))
    }
}

/// A uniform draw with a measured median and interquartile range: `[m - iqr, m + iqr]` has
/// that IQR.
fn draw_spread((median, iqr): (u64, u64), rng: &mut ChaCha8Rng) -> u64 {
    if iqr == 0 {
        median
    } else {
        rng.random_range(median.saturating_sub(iqr)..=median + iqr)
    }
}

/// The VMM's boot thread on a measured host (see [`boot_thread_start`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct BootThreadCosts {
    /// The share of builds whose boot thread first runs only after the next tick of the CPU
    /// that runs vCPU 0.
    pub(super) tick_bound: f64,
    /// From that tick to the thread's first run, ns.
    pub(super) pull_ns: u64,
    /// From the end its `boot_ms` sleep asked for to its first registration, ns.
    pub(super) sleep_late_ns: u64,
    /// From its spawn to its first run when no tick holds it back, ns (`None`: not measured;
    /// it runs once the spawner goes on, as with an idle CPU to take it). With no idle CPU
    /// (one CPU, the vCPU thread spinning in the guest on it) `wake_up_new_task()` queues it
    /// behind the vCPU thread, and it first runs when the scheduler preempts that thread.
    pub(super) untied_wait_ns: Option<u64>,
    /// From when it can go on (it has first run and vCPU 0 has made its first exit) to its
    /// going on, the vCPU thread's message received, ns (`None`: not measured; one wake-up,
    /// `srcu_wakeup_ns`). Its wake-up (`try_to_wake_up()`) may put it behind the vCPU thread
    /// that sent the message and went back into the guest, on a CPU that thread holds until
    /// the scheduler preempts it: medians of 0.08-0.26 ms on one emulated CPU (Debian 7.3 under
    /// TCG), 1.4-22 us here (AMD EPYC, Linux 6.18 PVM, 2 CPUs).
    exit_wake_ns: Option<u64>,
    /// Boot threads that first run before their spawner goes on to `KVM_RUN`: their share,
    /// and from that first run to the spawner's `KVM_RUN`, ns (`None`: not measured; the
    /// spawner goes on once `clone3()` returns). With one CPU, `wake_up_new_task()` →
    /// `wakeup_preempt()` can give the new thread the CPU on the spawner's return from
    /// `clone3()`, and the spawner runs again only once the new thread blocks (waiting for the
    /// guest's first exit): measured on Debian 6.12 under TCG in 10 of 10 builds, on 7.3 in
    /// none (there the new thread waited 0.55 ms for the vCPU thread to be preempted).
    pub(super) runs_first: Option<(f64, u64)>,
}

impl BootThreadCosts {
    /// When a boot thread that first ran at `started_ns` goes on from the guest's first exit
    /// at `ready_ns`.
    pub(super) fn went_on(costs: &LifecycleCosts, started_ns: u64, ready_ns: u64) -> u64 {
        match costs.boot_thread.and_then(|b| b.exit_wake_ns) {
            Some(wake) => started_ns.max(ready_ns) + wake,
            None => started_ns.max(ready_ns + costs.wakeup_ns),
        }
    }
}

/// When the VMM's boot thread, spawned at `spawned_ns` (just before vCPU 0 enters `KVM_RUN`)
/// at a cost of `spawn_cost_ns`, first runs, with ticks at `phase_ns + k × jiffy_ns`;
/// `tick_bound` is the hand-over after the tick when it waits for one.
///
/// `wake_up_new_task()` may leave the new thread on the spawner's CPU, queued behind the vCPU
/// thread, which then spins in guest mode and does not yield to it. An idle CPU takes it at
/// once only when its newly-idle balance pulls it (`sched_balance_newidle()`; traced here: when
/// KVM's NX-recovery thread, started by the first `KVM_RUN`, goes to sleep on the other CPU).
/// That balance has conditions of its own (the CPU's `avg_idle` against the cost of
/// balancing), so whether it happens depends on what ran before. Otherwise the thread waits
/// for the spinning CPU's next tick: `sched_tick()` → `sched_balance_trigger()` →
/// `nohz_balancer_kick()` has the idle CPU pull it, or the tick ends the vCPU thread's slice.
/// Measured here (AMD EPYC, Linux 6.18 PVM, 2 CPUs): 0 of 20 boot threads waited for a tick in
/// solo boot-activation runs, 5 to 9 of 10 in runs interleaving every lifecycle order, each
/// running 45-120 us after the tick.
/// A thread no tick holds back first runs `untied_wait_ns` after its spawn where the profile
/// measured that, else once the spawner goes on.
pub(super) fn boot_thread_start(
    spawned_ns: u64,
    spawn_cost_ns: u64,
    untied_wait_ns: Option<u64>,
    tick_bound: Option<u64>,
    phase_ns: u64,
    jiffy_ns: u64,
) -> u64 {
    match tick_bound {
        Some(pull_ns) => {
            let next_tick = if spawned_ns < phase_ns {
                phase_ns
            } else {
                phase_ns + ((spawned_ns - phase_ns) / jiffy_ns + 1) * jiffy_ns
            };
            next_tick + pull_ns
        }
        None => spawned_ns + untied_wait_ns.unwrap_or(spawn_cost_ns),
    }
}

fn ns(p: &Profile, key: &str) -> Result<u64, ProfileError> {
    p.ns(key, "srcu")
}

/// A cost only a measured profile has (`None` without it: the model's simpler mechanism).
fn optional_ns(p: &Profile, key: &str) -> Result<Option<u64>, ProfileError> {
    p.costs.contains_key(key).then(|| ns(p, key)).transpose()
}

/// Two measured costs that only mean something together.
fn optional_pair(p: &Profile, a: &str, b: &str) -> Result<Option<(u64, u64)>, ProfileError> {
    Ok(optional_ns(p, a)?.zip(optional_ns(p, b)?))
}

impl LifecycleCosts {
    /// Reads the lifecycle costs; `hz` overrides the profile's.
    pub fn from_profile(p: &Profile, hz: Option<u32>) -> Result<LifecycleCosts, ProfileError> {
        Ok(LifecycleCosts {
            // The profile's HZ only when not overridden: an override leaves it unread.
            hz: match hz {
                Some(hz) => u64::from(hz),
                None => ns(p, "hz")?,
            }
            .max(1),
            wakeup_ns: ns(p, "srcu_wakeup_ns")?,
            local_handoff_ns: match optional_ns(p, "srcu_local_handoff_ns")? {
                Some(local) => local,
                None => ns(p, "srcu_wakeup_ns")?,
            },
            timer_cpu_busy: p.get("srcu_timer_cpu_busy", "srcu")?,
            first_vcpu_adds_memslot: ns(p, "first_vcpu_adds_memslot")? != 0,
            registration_wait_measured: optional_ns(p, "registration_synchronizes")?
                .is_some_and(|flag| flag != 0),
            create_vm: ns(p, "ioctl_create_vm_ns")?,
            tss: ns(p, "ioctl_tss_ns")?,
            irqchip: ns(p, "ioctl_irqchip_ns")?,
            pit: ns(p, "ioctl_pit_ns")?,
            memslot: ns(p, "ioctl_memslot_ns")?,
            boot_memslot: optional_ns(p, "boot_memslot_ns")?,
            vcpu: ns(p, "ioctl_vcpu_ns")?,
            ioeventfd: ns(p, "ioctl_ioeventfd_ns")?,
            regs: ns(p, "ioctl_regs_ns")?,
            first_run: ns(p, "first_run_ns")?,
            gap: ns(p, "vmm_gap_ns")?,
            between_builds: BetweenBuilds {
                teardown_end: [
                    optional_pair(p, "teardown_tick_phase_ns", "teardown_tick_phase_iqr_ns")?,
                    optional_pair(
                        p,
                        "boot_teardown_tick_phase_ns",
                        "boot_teardown_tick_phase_iqr_ns",
                    )?,
                ],
                setup: [
                    optional_pair(p, "vmm_setup_ns", "vmm_setup_iqr_ns")?,
                    optional_pair(p, "boot_vmm_setup_ns", "boot_vmm_setup_iqr_ns")?,
                ],
            },
            boot_thread: match (
                p.costs
                    .contains_key("boot_thread_tick_bound")
                    .then(|| p.get("boot_thread_tick_bound", "srcu"))
                    .transpose()?,
                optional_pair(p, "boot_thread_pull_ns", "boot_sleep_late_ns")?,
            ) {
                (Some(tick_bound), Some((pull_ns, sleep_late_ns))) => Some(BootThreadCosts {
                    tick_bound,
                    pull_ns,
                    sleep_late_ns,
                    exit_wake_ns: optional_ns(p, "boot_exit_wake_ns")?,
                    untied_wait_ns: optional_ns(p, "boot_thread_wait_ns")?,
                    runs_first: match (
                        p.costs
                            .contains_key("boot_thread_first_share")
                            .then(|| p.get("boot_thread_first_share", "srcu"))
                            .transpose()?,
                        optional_ns(p, "boot_spawner_resume_ns")?,
                    ) {
                        (Some(share), Some(resume)) => Some((share, resume)),
                        _ => None,
                    },
                }),
                _ => None,
            },
            cpuid: optional_ns(p, "ioctl_cpuid_ns")?,
            boot_start: optional_pair(p, "boot_thread_start_ns", "first_run_long_mode_ns")?,
        })
    }

    /// One jiffy.
    pub fn jiffy_ns(&self) -> u64 {
        1_000_000_000 / self.hz
    }
}
