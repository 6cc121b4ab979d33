//! The `lifecycle` model: KVM's I/O-bus registrations and memslot swaps on an SRCU timeline.
//!
//! The grace-period machinery of kernel/rcu/srcutree.c, step by step, in time (ns) with timer
//! ticks every jiffy:
//! - `call_srcu()` → `__call_srcu()` → `srcu_gp_start_if_needed()` queues the callback for the
//!   grace period `rcu_seq_snap()` names: the next one when SRCU is idle, the one *after* the
//!   grace period in flight otherwise. `srcu_funnel_gp_start()` records the need and, when idle,
//!   starts the grace period (`srcu_gp_start()`: state `SRCU_STATE_SCAN1`) and queues the
//!   grace-period work with `!!srcu_get_delay()`: no delay when an expedited grace period is
//!   wanted, one jiffy (`SRCU_INTERVAL`) for a normal one. A request for an already-requested
//!   grace period only raises the expedited mark (`srcu_funnel_exp_start()`): it does not
//!   re-queue work that is already waiting for its timer.
//! - A delayed work or timer of `d` jiffies fires on the `(d+1)`-th tick after it is armed:
//!   the timer wheel rounds every expiry up by one bucket so that a timer armed just before a
//!   tick cannot fire early (`calc_index()` in kernel/time/timer.c). One jiffy of delay is
//!   therefore between one and two jiffies of time.
//! - `process_srcu()` runs `srcu_advance_state()`: SCAN1 checks the inactive reader index with
//!   `try_check_zero()` (one check, one more if expedited, 5 µs apart), flips, SCAN2 checks the
//!   other (two checks); with no readers both pass in the same pass and `srcu_gp_end()` ends
//!   the grace period. A reader makes the check fail and the work re-queue after
//!   `srcu_get_delay()`: 0 while expedited (a bounded number of times, `srcu_max_nodelay_phase`),
//!   else one jiffy plus the grace period's age, at most `SRCU_MAX_INTERVAL` (10).
//! - `srcu_gp_end()` hands the finished grace period's callbacks to `srcu_invoke_callbacks()`
//!   at once when an expedited grace period is wanted (`cbdelay` 0), else one jiffy later
//!   (`cbdelay` 1, `timer_reduce()` on the per-CPU delay timer), and starts the next grace
//!   period at once (`srcu_reschedule(ssp, 0)`) if one is needed.
//! - `synchronize_srcu_expedited()` is `__synchronize_srcu(ssp, do_norm = rcu_gp_is_normal())`,
//!   i.e. `do_norm = false`: a callback that wakes the caller, queued like any other. It cannot
//!   complete before the normal grace period in flight, and then needs one more.
//!
//! In virt/kvm/kvm_main.c: `kvm_io_bus_register_dev()` frees the old bus array after a grace
//! period: `synchronize_srcu_expedited()` before 7d9a0273, `call_srcu()` after it, and in Sean
//! Christopherson's proposed fix `synchronize_srcu_expedited()` while `kvm->created_vcpus` is 0
//! and `call_srcu()` afterwards. `kvm_swap_active_memslots()` calls
//! `synchronize_srcu_expedited()`; on x86 `__x86_set_memory_region()` creates a private memslot
//! in each address space (two with SMM), which VMX does for the APIC-access page when the first
//! vCPU is created (`kvm_alloc_apic_access_page()`). vCPUs in `KVM_RUN` are SRCU readers while
//! they handle exits in the kernel.
//!
//! Why the first `KVM_CREATE_VCPU` waits more than one grace period (Nikita Kalyazin's
//! question in thread 001): the registrations of `KVM_CREATE_IRQCHIP` start a normal grace
//! period whose work waits one jiffy of delay, which the timer wheel turns into the second tick
//! after the registration: 1 to 2 jiffies. The registrations after the first (the rest of the
//! irqchip's, the PIT's) and the vCPU's expedited synchronization all need the grace period
//! *after* that one (the grace period in flight may have started before their updates). That
//! second grace period runs at once when the first ends (expedited, no delay), so the vCPU
//! waits the rest of the first — 1 to 2 jiffies after the irqchip — plus the workqueue
//! hand-offs. Measured from the vCPU's own start (~0.1 ms after the irqchip) that can fall a
//! hair under one jiffy on an idle host. On a busy host (Firecracker's, in the thread) the
//! timer that queues the grace-period work fires on a CPU running another task, and the
//! kworker waits for it, up to the next tick (`Srcu::work_runs`): 1 to 3 jiffies, more than
//! one grace period every time, and the thread's 25.18 ms (2.5 jiffies) within reach.
//!
//! Registrations while the guest boots (`boot-activation`): the VMM's boot thread registers
//! `boot_ms` after it starts, and the memslot update after its registrations waits until the
//! second tick after the first one. Where that falls against the tick is the boot thread's
//! business ([`costs::boot_thread_start`]). A thread left behind the spinning vCPU thread runs
//! on the next tick, so it registers `boot_ms` modulo the jiffy after a tick, plus its hand-over and its
//! sleep's lateness, wherever the build started (HZ=250, boot_ms=50: about 2.2 ms after a tick,
//! a 5.85 ms wait). A thread that runs at once registers `boot_ms` after the guest's first exit,
//! so its phase moves with the build's (7.3-7.9 ms waits here). The grace-period kworker is not
//! held off by the spinning vCPU: the tick that fires its timer takes the vCPU out of the guest,
//! and the kworker runs before the vCPU re-enters.

mod construct;
mod costs;
mod srcu;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

pub use construct::{BackToBack, construct};
pub use costs::LifecycleCosts;
pub use srcu::Srcu;

/// A seeded generator for a run.
pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}
