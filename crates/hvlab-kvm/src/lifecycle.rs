//! Executes a lifecycle construction plan on real KVM.

use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VmFd};

use super::KvmError;
use super::guest::layout::{GuestPage, Layout};
use super::guest::runner::{self, Flow, GuestExit};
use super::guest::watchdog::kick_signal;
use super::guest::{Cpl, ENTRY_GPA, Signal, payload, signal_payload};
use super::guest_memory::{Backing, GuestMemory};
use super::stats::{StatsReader, named_deltas};
use super::vm::{TimedIoctl, Vm, ns_since, register_ioeventfd, timed};
use hvlab_core::lifecycle::{BootThread, ConstructionPlan, ConstructionTrace, IoctlEvent, Step};

/// QEMU's choice; VMX needs three free pages below 4 GiB for real-mode emulation.
const TSS_GPA: usize = 0xfffb_d000;
/// virtio-mmio devices sit above RAM; each has a QueueNotify doorbell at offset 0x50.
const MMIO_DEVICES_GPA: u64 = 0xd000_0000;
const MMIO_DEVICE_STRIDE: u64 = 0x200;
const QUEUE_NOTIFY: u64 = 0x50;

/// Where the boot orders' second memslot goes: clear of the layout, the data region and the
/// MMIO doorbells.
const BOOT_MEMSLOT_GPA: u64 = 0x8000_0000;
const BOOT_MEMSLOT_BYTES: usize = 64 << 10;

/// The QueueNotify doorbell of virtio-mmio device `i`.
fn doorbell_gpa(i: u32) -> u64 {
    MMIO_DEVICES_GPA + u64::from(i) * MMIO_DEVICE_STRIDE + QUEUE_NOTIFY
}

/// The steps after `run`: the boot steps, done beside the running vCPU (validation allows
/// nothing else there).
fn boot_steps_of(plan: &ConstructionPlan) -> &[Step] {
    plan.steps
        .iter()
        .position(|s| *s == Step::Run)
        .map_or(&[], |run| &plan.steps[run + 1..])
}

/// Builds one VM in the plan's order and runs each vCPU in turn until the guest signals (boot
/// orders: vCPU 0, which keeps spinning).
///
/// Guest memory is mapped and the payload written before the clock starts: that is VMM work
/// independent of the order under test. Orders with boot steps run a long-mode guest that keeps
/// spinning after its signal, on this thread, while a second thread does the boot steps.
/// Returns the trace, the VM's clock origin (the instant of `KVM_CREATE_VM`) and when the VM
/// was torn down (every fd closed, guest memory unmapped), from which the caller measures the
/// time between back-to-back builds.
pub fn construct(
    kvm: &Kvm,
    plan: &ConstructionPlan,
) -> Result<(ConstructionTrace, Instant, Instant), KvmError> {
    // Present exactly when the order boots. Declared before the VM so it is unmapped after the
    // VM (and its memslot) is gone.
    let boot_memory = if boot_steps_of(plan).is_empty() {
        None
    } else {
        Some(GuestMemory::anonymous(BOOT_MEMSLOT_BYTES)?)
    };
    let mut memory = Some(guest_memory(plan, boot_memory.is_some())?);
    let mut vm = Vm::create(kvm)?;
    let mut boot_log = Vec::new();
    let mut boot_thread = None;
    let mut ready_ns = None;
    for step in &plan.steps {
        match step {
            Step::CreateVm => {}
            Step::TssAddr => vm.set_tss_addr(TSS_GPA)?,
            Step::Irqchip => vm.create_irqchip()?,
            Step::Pit => vm.create_pit2()?,
            Step::Memslot => {
                let m = memory
                    .take()
                    .ok_or_else(|| KvmError::Internal("memslot step given twice".into()))?;
                vm.add_memslot(0, m)?;
            }
            Step::Vcpus => {
                for _ in 0..plan.vcpus {
                    vm.create_vcpu()?;
                }
            }
            Step::Ioeventfds => {
                for i in 0..plan.devices {
                    vm.register_ioeventfd_mmio(doorbell_gpa(i), 0)?;
                }
            }
            Step::Run => match &boot_memory {
                Some(boot_memory) => {
                    let (ready, log, thread) = run_while_booting(kvm, &mut vm, plan, boot_memory)?;
                    ready_ns = Some(ready);
                    boot_log = log;
                    boot_thread = Some(thread);
                }
                // Every vCPU runs the guest to its signal, in turn: the VM is ready when the
                // last has.
                None => {
                    for index in 0..vm.vcpus_mut().len().max(1) {
                        vm.run_until_signal(index, plan.run_timeout)?;
                    }
                    ready_ns = Some(vm.elapsed_ns());
                }
            },
            // The boot thread does these, in this order, beside the running vCPU.
            Step::BootIoeventfds | Step::BootMemslot => {}
        }
    }
    let ready_ns = ready_ns.ok_or_else(|| KvmError::Internal("the plan has no run step".into()))?;
    let mut kvm_stats = since_creation(vm.fd(), "kvm.vm");
    if let Some(vcpu) = vm.vcpu(0) {
        kvm_stats.extend(since_creation(vcpu, "kvm.vcpu"));
    }
    let mut ioctls: Vec<IoctlEvent> = vm
        .log()
        .iter()
        .chain(&boot_log)
        .map(|t| IoctlEvent {
            name: t.name.to_string(),
            start_ns: t.start_ns,
            dur_ns: t.dur_ns,
            flags: t.flags,
        })
        .collect();
    ioctls.sort_by_key(|e| e.start_ns);
    let clock = vm.clock();
    let tick_phase_ns = vm.tick_phase_ns();
    // The teardown, timed: closing the last fd runs kvm_destroy_vm(), whose barriers
    // (srcu_barrier() on kvm->srcu, rcu_barrier() in the TDP MMU's kvm_mmu_uninit_tdp_mmu())
    // wait for grace periods, so it can end on a tick; then the memory goes.
    drop(vm);
    drop(memory);
    drop(boot_memory);
    let torn_down = Instant::now();
    Ok((
        ConstructionTrace {
            ioctls,
            ready_ns,
            kvm_stats,
            srcu_effects: Vec::new(),
            since_last_ns: None,
            since_teardown_ns: None,
            tick_phase_ns: Some(tick_phase_ns),
            boot_thread,
        },
        clock,
        torn_down,
    ))
}

/// The guest's RAM with its payload written, before the clock starts: a long-mode guest that
/// keeps spinning for orders that `boot`, else the signal payload at the entry point.
fn guest_memory(plan: &ConstructionPlan, boot: bool) -> Result<GuestMemory, KvmError> {
    if boot {
        let layout = Layout::new(2 << 20, GuestPage::Huge, 0)?;
        let mut system = GuestMemory::backed(
            usize::try_from(layout.system_bytes)
                .map_err(|_| KvmError::Layout("layout too large".into()))?,
            Backing::Populated,
        )?;
        layout.write_system(&mut system, &payload::spin_loop()?)?;
        Ok(system)
    } else {
        let mut m = GuestMemory::anonymous(plan.mem_bytes)?;
        m.write(
            usize::try_from(ENTRY_GPA).unwrap_or(usize::MAX),
            &signal_payload(),
        )?;
        Ok(m)
    }
}

/// The statistics a fresh VM or vCPU accumulated since it was created (they start at zero).
/// Statistics are context here, not the measurement: a kernel without `KVM_GET_STATS_FD` just
/// reports none.
fn since_creation(owner: &impl std::os::fd::AsRawFd, prefix: &str) -> Vec<(String, String, i128)> {
    let Ok(reader) = StatsReader::open(owner) else {
        return Vec::new();
    };
    let Ok(now) = reader.snapshot() else {
        return Vec::new();
    };
    named_deltas(reader.layout(), &reader.zero(), &now, prefix)
}

/// Runs vCPU 0 in 64-bit mode at CPL3 on this thread until it is stopped, while a second
/// thread waits for the guest's `Start` and then does the plan's boot steps in order, timing
/// each; then it stops the vCPU. Returns the time of `Start` (the VM is ready), the boot
/// thread's ioctls and when the boot thread was spawned, first ran and was to wake, on the VM's
/// clock.
fn run_while_booting(
    kvm: &Kvm,
    vm: &mut Vm,
    plan: &ConstructionPlan,
    memory: &GuestMemory,
) -> Result<(u64, Vec<TimedIoctl>, BootThread), KvmError> {
    vm.setup_long_mode(0, Cpl::Three)?;
    let vm_fd = boot_thread_vm_fd(kvm, vm)?;
    let clock = vm.clock();
    // SAFETY: pthread_self has no preconditions.
    let vcpu_thread = unsafe { libc::pthread_self() };
    let stop = AtomicBool::new(false);
    let stopped = AtomicBool::new(false);
    let (started_tx, started_rx) = mpsc::channel::<()>();
    let budget = plan.run_timeout + Duration::from_millis(u64::from(plan.boot_ms));
    let region = boot_memslot_region(memory);
    let (spawned_ns, run_start, ready_at, booted) = std::thread::scope(|scope| {
        let (stop, stopped, vm_fd) = (&stop, &stopped, &vm_fd);
        // Where the scheduler puts the new thread, and when it first runs, is part of what is
        // measured: it sets where the boot registrations fall against the tick.
        let spawned_ns = ns_since(clock, Instant::now());
        let booting = scope.spawn(move || {
            let started_ns = ns_since(clock, Instant::now());
            let out = boot_steps(vm_fd, &started_rx, plan, region, clock, budget)
                .map(|(log, went_on_ns, wake_ns)| (log, started_ns, went_on_ns, wake_ns));
            stop.store(true, Ordering::SeqCst);
            kick_until_stopped(vcpu_thread, stopped);
            out
        });
        let run_start = Instant::now();
        let (ran, ready_at) = run_spinning_vcpu(vm, budget, stop, &started_tx);
        drop(started_tx);
        stopped.store(true, Ordering::SeqCst);
        let booted = booting
            .join()
            .unwrap_or_else(|_| Err(KvmError::Internal("the boot thread panicked".into())));
        (spawned_ns, run_start, ready_at, ran.and(booted))
    });
    let (mut log, started_ns, went_on_ns, wake_ns) = booted?;
    let ready_at =
        ready_at.ok_or_else(|| KvmError::Guest("the guest never signalled Start".into()))?;
    log.insert(
        0,
        TimedIoctl {
            name: "KVM_RUN",
            start_ns: ns_since(clock, run_start),
            dur_ns: ns_since(run_start, ready_at),
            flags: None,
        },
    );
    let thread = BootThread {
        spawned_ns,
        started_ns,
        went_on_ns,
        wake_ns,
    };
    Ok((ns_since(clock, ready_at), log, thread))
}

/// A second handle on the VM for the boot thread: the VM's own is borrowed by the vCPU.
fn boot_thread_vm_fd(kvm: &Kvm, vm: &Vm) -> Result<VmFd, KvmError> {
    // SAFETY: dup() of a valid open fd; the new fd is owned by the VmFd built from it.
    let dup = unsafe { libc::dup(vm.fd().as_raw_fd()) };
    if dup < 0 {
        return Err(KvmError::Host {
            what: "duplicating the VM fd for the boot thread".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `dup` is a VM fd this function just created and hands over.
    unsafe { kvm.create_vmfd_from_rawfd(dup) }.map_err(crate::ioctl_error("KVM_CREATE_VM (dup)"))
}

/// The boot orders' second memslot, over `memory`.
fn boot_memslot_region(memory: &GuestMemory) -> kvm_userspace_memory_region {
    kvm_userspace_memory_region {
        slot: 1,
        guest_phys_addr: BOOT_MEMSLOT_GPA,
        memory_size: memory.len() as u64,
        userspace_addr: memory.host_addr(),
        flags: 0,
    }
}

/// Kicks the vCPU thread out of `KVM_RUN` until it says it has `stopped`.
fn kick_until_stopped(vcpu_thread: libc::pthread_t, stopped: &AtomicBool) {
    // A kick can land just before the vCPU re-enters KVM_RUN: repeat until it is out.
    while !stopped.load(Ordering::SeqCst) {
        // SAFETY: the vCPU thread outlives this scope; the kick signal has a no-op
        // handler installed by the runner's watchdog.
        unsafe { libc::pthread_kill(vcpu_thread, kick_signal()) };
        // Short: the time until the next build starts sets where its ticks fall, and
        // the vCPU is usually out after the first kick.
        std::thread::sleep(Duration::from_micros(50));
    }
}

/// Runs vCPU 0's spinning guest until `stop`, telling the boot thread on `started` when the
/// guest signals `Start`; returns how the run ended and when `Start` came.
fn run_spinning_vcpu(
    vm: &mut Vm,
    budget: Duration,
    stop: &AtomicBool,
    started: &mpsc::Sender<()>,
) -> (Result<(), KvmError>, Option<Instant>) {
    let mut ready_at = None;
    let ran = match vm.vcpu_mut(0) {
        None => Err(KvmError::Internal("no vCPU 0 to run".into())),
        Some(vcpu) => {
            runner::run_stoppable(vcpu, budget + Duration::from_secs(1), Some(stop), |exit| {
                match exit {
                    GuestExit::Signal {
                        signal: Signal::Start,
                        at,
                        ..
                    } => {
                        ready_at = Some(at);
                        let _ = started.send(());
                        Ok(Flow::Continue)
                    }
                    other => Err(KvmError::Guest(format!(
                        "unexpected {other:?} from the spinning guest"
                    ))),
                }
            })
        }
    };
    (ran, ready_at)
}

/// The boot thread: waits for the guest to run, then does the plan's boot steps in order, each
/// timed on the VM's clock. Like the model, it lets the guest boot `boot_ms` before
/// registering the boot ioeventfds. Returns the ioctls, when it went on from the guest's first
/// exit and when that sleep was to end.
fn boot_steps(
    vm_fd: &VmFd,
    started: &mpsc::Receiver<()>,
    plan: &ConstructionPlan,
    region: kvm_userspace_memory_region,
    clock: Instant,
    budget: Duration,
) -> Result<(Vec<TimedIoctl>, u64, u64), KvmError> {
    started
        .recv_timeout(budget)
        .map_err(|_| KvmError::Guest("the guest never signalled Start".into()))?;
    let mut log = Vec::new();
    let went_on_ns = ns_since(clock, Instant::now());
    let mut wake_ns = went_on_ns;
    // The eventfds stay open until the VM is gone: KVM holds its own reference.
    let mut fds = Vec::new();
    for step in boot_steps_of(plan) {
        match step {
            Step::BootIoeventfds => {
                let boot = Duration::from_millis(u64::from(plan.boot_ms));
                wake_ns = ns_since(clock, Instant::now() + boot);
                std::thread::sleep(boot);
                for i in 0..plan.devices {
                    fds.push(register_ioeventfd(
                        vm_fd,
                        &mut log,
                        clock,
                        doorbell_gpa(i),
                        0,
                    )?);
                }
            }
            Step::BootMemslot => {
                timed(&mut log, clock, "KVM_SET_USER_MEMORY_REGION", || {
                    // SAFETY: the region maps memory the caller keeps alive until after the VM
                    // is dropped.
                    unsafe { vm_fd.set_user_memory_region(region) }
                })?;
            }
            other => {
                return Err(KvmError::Internal(format!(
                    "step {} after run: the plan was not validated",
                    other.name()
                )));
            }
        }
    }
    Ok((log, went_on_ns, wake_ns))
}
