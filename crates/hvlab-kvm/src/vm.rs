//! The timed VM builder: every construction ioctl is a step with a start and a duration on one
//! clock, so an ordering effect (a grace-period stall) shows up as one slow step.

use std::time::{Duration, Instant};

use kvm_bindings::{CpuId, KVM_MAX_CPUID_ENTRIES, kvm_pit_config, kvm_userspace_memory_region};
use kvm_ioctls::{IoEventAddress, Kvm, VcpuFd, VmFd};
use vmm_sys_util::eventfd::EventFd;

use super::KvmError;
use super::guest::runner::{self, Flow, GuestExit};
use super::guest::{Cpl, ENTRY_GPA, Signal, long_mode};
use super::guest_memory::GuestMemory;
use hvlab_core::ioctl_table::KVM_IOEVENTFD_FLAG_DATAMATCH;

/// `KVM_CAP_GUEST_MEMFD_FLAGS` (Linux 6.18, include/uapi/linux/kvm.h): the guest_memfd flags
/// this VM may use; not in kvm-bindings 0.14.
const KVM_CAP_GUEST_MEMFD_FLAGS: libc::c_ulong = 244;
/// `GUEST_MEMFD_FLAG_MMAP`: the VMM may mmap the guest_memfd.
const GUEST_MEMFD_FLAG_MMAP: u64 = 1 << 0;
/// `GUEST_MEMFD_FLAG_INIT_SHARED`: its memory starts shared (usable by a plain VM).
const GUEST_MEMFD_FLAG_INIT_SHARED: u64 = 1 << 1;

/// One ioctl as the builder issued it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedIoctl {
    /// KVM name of the request.
    pub name: &'static str,
    /// Start, in ns since the builder's clock started (just before `KVM_CREATE_VM`).
    pub start_ns: u64,
    /// Duration in ns.
    pub dur_ns: u64,
    /// The flags argument, where it decides what the ioctl does (`KVM_IOEVENTFD`).
    pub flags: Option<u32>,
}

/// A VM under construction. Fields drop in declaration order: vCPUs and eventfds before the
/// VM fd, the VM before the memory its memslots point at.
#[derive(Debug)]
pub struct Vm {
    vcpus: Vec<VcpuFd>,
    ioeventfds: Vec<EventFd>,
    fd: VmFd,
    memory: Vec<GuestMemory>,
    /// What this host's KVM supports, given to every vCPU as its CPUID.
    cpuid: CpuId,
    clock: Instant,
    /// Time since the last timer tick when the clock started (see [`since_last_tick_ns`]).
    tick_phase_ns: u64,
    log: Vec<TimedIoctl>,
}

/// Time since the last timer tick, ns. `CLOCK_MONOTONIC_COARSE` is the time of the last
/// timekeeping update, which the tick makes (`tick_do_update_jiffies64()` →
/// `update_wall_time()`) but in whole tick lengths from the clocksource's own origin
/// (`timekeeping_advance()` keeps the remainder): it lags the tick by a constant, measured
/// once ([`coarse_tick`]). Where a build starts against the tick decides how long its grace
/// periods wait, since SRCU's delayed work fires on ticks.
pub(crate) fn since_last_tick_ns() -> u64 {
    let tick = coarse_tick();
    let (fine, coarse) = fine_and_coarse_ns();
    let since = fine - coarse - tick.lag_ns;
    // Wrapped onto the tick, not clamped: where the lag was read late (a slow or emulated
    // CPU), clamping would pile every early reading onto 0 and fake a phase.
    let since = if tick.len_ns > 0 {
        since.rem_euclid(tick.len_ns)
    } else {
        since.max(0)
    };
    u64::try_from(since).unwrap_or(0)
}

fn fine_and_coarse_ns() -> (i128, i128) {
    use rustix::time::{ClockId, clock_gettime};
    let ns =
        |t: rustix::time::Timespec| i128::from(t.tv_sec) * 1_000_000_000 + i128::from(t.tv_nsec);
    let coarse = clock_gettime(ClockId::MonotonicCoarse);
    let fine = clock_gettime(ClockId::Monotonic);
    (ns(fine), ns(coarse))
}

/// The coarse clock against the tick: how far it lags the tick that updated it, and the
/// tick's length.
#[derive(Clone, Copy)]
struct CoarseTick {
    /// `fine - coarse` seen just after the coarse clock steps by one tick (a tick just
    /// happened), the least over a dozen such steps seen promptly. A step of two ticks at once
    /// is a late tick catching up (the host stole the CPU): the coarse clock then jumps past
    /// the usual lag, and one such reading (1.3 ms against 2.75 ms here, at 16% steal) put
    /// every phase of a process 1.5 ms late. A step seen long after the look before it may be
    /// late itself. Both are left out.
    lag_ns: i128,
    /// The least step of the coarse clock: one tick (a tickless CPU may skip several).
    len_ns: i128,
}

/// A look after a step counts only when the look before it was this recent (the loop itself
/// takes under a microsecond; a tick's interrupt on this CPU some tens).
const PROMPT_LOOK_NS: i128 = 100_000;

/// Spins for about a dozen ticks (50 ms at HZ=250), once per process, to read [`CoarseTick`].
fn coarse_tick() -> CoarseTick {
    static TICK: std::sync::OnceLock<CoarseTick> = std::sync::OnceLock::new();
    *TICK.get_or_init(|| {
        let deadline = Instant::now() + std::time::Duration::from_millis(150);
        let (mut previous_look, mut last) = fine_and_coarse_ns();
        // (step of the coarse clock, fine - coarse, time since the previous look) per step.
        let mut steps: Vec<(i128, i128, i128)> = Vec::new();
        let mut first = true;
        while steps.len() < 12 && Instant::now() < deadline {
            let (fine, coarse) = fine_and_coarse_ns();
            if coarse != last {
                // The first step may be seen late (the loop started mid-jiffy): skip it.
                if !first {
                    steps.push((coarse - last, fine - coarse, fine - previous_look));
                }
                first = false;
                last = coarse;
            }
            previous_look = fine;
        }
        CoarseTick::from_steps(&steps)
    })
}

impl CoarseTick {
    /// From the coarse clock's steps as seen: (step, `fine - coarse` just after it, time since
    /// the look before it), ns.
    fn from_steps(steps: &[(i128, i128, i128)]) -> CoarseTick {
        let len_ns = steps.iter().map(|s| s.0).min().unwrap_or(0);
        let prompt_single = steps
            .iter()
            .filter(|s| s.0 == len_ns && s.2 <= PROMPT_LOOK_NS)
            .map(|s| s.1)
            .min();
        let lag_ns = prompt_single.unwrap_or_else(|| {
            // Every step was late or doubled: the median is the least wrong.
            let mut lags: Vec<i128> = steps.iter().map(|s| s.1).collect();
            lags.sort_unstable();
            lags.get(lags.len() / 2).copied().unwrap_or(0)
        });
        CoarseTick { lag_ns, len_ns }
    }
}

/// ns from `clock` to `t` (0 if `t` is earlier).
pub(super) fn ns_since(clock: Instant, t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(clock).as_nanos()).unwrap_or(u64::MAX)
}

/// Runs one ioctl and appends its timing to `log`, whether it succeeded or not.
pub(super) fn timed<T>(
    log: &mut Vec<TimedIoctl>,
    clock: Instant,
    name: &'static str,
    op: impl FnOnce() -> Result<T, kvm_ioctls::Error>,
) -> Result<T, KvmError> {
    let start = Instant::now();
    let out = op();
    let end = Instant::now();
    log.push(TimedIoctl {
        name,
        start_ns: ns_since(clock, start),
        dur_ns: ns_since(start, end),
        flags: None,
    });
    out.map_err(crate::ioctl_error(name))
}

/// `KVM_IOEVENTFD` on a 4-byte MMIO doorbell of `fd` with a datamatch, the way virtio-mmio
/// VMMs register queue notifications, timed into `log`. The caller keeps the eventfd open
/// until the VM is gone.
pub(super) fn register_ioeventfd(
    fd: &VmFd,
    log: &mut Vec<TimedIoctl>,
    clock: Instant,
    gpa: u64,
    datamatch: u32,
) -> Result<EventFd, KvmError> {
    let evt = EventFd::new(libc::EFD_NONBLOCK).map_err(|e| KvmError::Ioctl {
        op: "eventfd",
        source: e,
    })?;
    let registered = timed(log, clock, "KVM_IOEVENTFD", || {
        fd.register_ioevent(&evt, &IoEventAddress::Mmio(gpa), datamatch)
    });
    // kvm-ioctls sets DATAMATCH for a value to match; an assign, never a deassign.
    if let Some(last) = log.last_mut() {
        last.flags = Some(KVM_IOEVENTFD_FLAG_DATAMATCH);
    }
    registered?;
    Ok(evt)
}

impl Vm {
    /// `KVM_CREATE_VM`; the builder's clock starts just before it.
    pub fn create(kvm: &Kvm) -> Result<Vm, KvmError> {
        // A system ioctl on /dev/kvm, not part of the VM's construction: read before the clock.
        let cpuid = kvm
            .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
            .map_err(crate::ioctl_error("KVM_GET_SUPPORTED_CPUID"))?;
        let tick_phase_ns = since_last_tick_ns();
        let clock = Instant::now();
        let fd = kvm
            .create_vm()
            .map_err(crate::ioctl_error("KVM_CREATE_VM"))?;
        let end = Instant::now();
        Ok(Vm {
            vcpus: Vec::new(),
            ioeventfds: Vec::new(),
            fd,
            memory: Vec::new(),
            cpuid,
            clock,
            tick_phase_ns,
            log: vec![TimedIoctl {
                name: "KVM_CREATE_VM",
                start_ns: 0,
                dur_ns: ns_since(clock, end),
                flags: None,
            }],
        })
    }

    fn timed<T>(
        &mut self,
        name: &'static str,
        op: impl FnOnce(&VmFd, &mut Vec<VcpuFd>) -> Result<T, kvm_ioctls::Error>,
    ) -> Result<T, KvmError> {
        let (fd, vcpus) = (&self.fd, &mut self.vcpus);
        timed(&mut self.log, self.clock, name, || op(fd, vcpus))
    }

    /// `KVM_SET_TSS_ADDR` (VMX needs three pages for real-mode emulation; other flavours accept
    /// and ignore it).
    pub fn set_tss_addr(&mut self, gpa: usize) -> Result<(), KvmError> {
        self.timed("KVM_SET_TSS_ADDR", |vm, _| vm.set_tss_address(gpa))
    }

    /// `KVM_CREATE_IRQCHIP`: the PIC pair and IOAPIC, registered on the PIO and MMIO buses.
    pub fn create_irqchip(&mut self) -> Result<(), KvmError> {
        self.timed("KVM_CREATE_IRQCHIP", |vm, _| vm.create_irq_chip())
    }

    /// `KVM_CREATE_PIT2`: the i8254, registered on the PIO bus.
    pub fn create_pit2(&mut self) -> Result<(), KvmError> {
        self.timed("KVM_CREATE_PIT2", |vm, _| {
            vm.create_pit2(kvm_pit_config::default())
        })
    }

    /// `KVM_ENABLE_CAP(KVM_CAP_PMU_CAPABILITY, KVM_PMU_CAP_DISABLE)`: no vPMU for this VM.
    /// Must precede vCPU creation.
    pub fn disable_pmu(&mut self) -> Result<(), KvmError> {
        let mut cap = kvm_bindings::kvm_enable_cap {
            cap: kvm_bindings::KVM_CAP_PMU_CAPABILITY,
            ..Default::default()
        };
        cap.args[0] = u64::from(kvm_bindings::KVM_PMU_CAP_DISABLE);
        self.timed("KVM_ENABLE_CAP", |vm, _| vm.enable_cap(&cap))
    }

    /// `KVM_SET_USER_MEMORY_REGION` mapping `memory` at `gpa` in the next free slot.
    pub fn add_memslot(&mut self, gpa: u64, memory: GuestMemory) -> Result<u32, KvmError> {
        let slot = u32::try_from(self.memory.len())
            .map_err(|_| KvmError::Layout("too many memslots".into()))?;
        let region = kvm_userspace_memory_region {
            slot,
            guest_phys_addr: gpa,
            memory_size: memory.len() as u64,
            userspace_addr: memory.host_addr(),
            flags: 0,
        };
        // The memory moves into `self` before the ioctl so it provably outlives the memslot.
        self.memory.push(memory);
        self.timed("KVM_SET_USER_MEMORY_REGION", |vm, _| {
            // SAFETY: the region describes a live mapping owned by this Vm, which drops the VM
            // fd (and with it the memslot) before unmapping.
            unsafe { vm.set_user_memory_region(region) }
        })?;
        Ok(slot)
    }

    /// A guest_memfd of `len` bytes that the VMM can map (`KVM_CREATE_GUEST_MEMFD` with
    /// `GUEST_MEMFD_FLAG_MMAP | GUEST_MEMFD_FLAG_INIT_SHARED`, Linux 6.18): shared memory a
    /// plain VM type can use, faulted from the file rather than from a userspace mapping.
    /// Hosts whose `KVM_CAP_GUEST_MEMFD_FLAGS` lacks those flags only have private
    /// guest_memfd, which needs a confidential VM type: unsupported, with the reason.
    pub fn guest_memfd(&mut self, kvm: &Kvm, len: usize) -> Result<GuestMemory, KvmError> {
        if kvm.check_extension_raw(libc::c_ulong::from(kvm_bindings::KVM_CAP_GUEST_MEMFD)) <= 0 {
            return Err(KvmError::MissingCap("KVM_CAP_GUEST_MEMFD"));
        }
        let flags = self.fd.check_extension_raw(KVM_CAP_GUEST_MEMFD_FLAGS);
        let want = GUEST_MEMFD_FLAG_MMAP | GUEST_MEMFD_FLAG_INIT_SHARED;
        if u64::try_from(flags).unwrap_or(0) & want != want {
            return Err(KvmError::Lacks(format!(
                "guest_memfd here is private-only (KVM_CAP_GUEST_MEMFD_FLAGS = {flags}, lacking GUEST_MEMFD_FLAG_MMAP | GUEST_MEMFD_FLAG_INIT_SHARED): a plain VM cannot use it, and this host's KVM_CAP_VM_TYPES = {} offers no confidential VM type",
                kvm.check_extension_raw(libc::c_ulong::from(kvm_bindings::KVM_CAP_VM_TYPES))
            )));
        }
        let gmem = kvm_bindings::kvm_create_guest_memfd {
            size: len as u64,
            flags: want,
            ..Default::default()
        };
        let raw = self.timed("KVM_CREATE_GUEST_MEMFD", |vm, _| {
            vm.create_guest_memfd(gmem)
        })?;
        // SAFETY: KVM_CREATE_GUEST_MEMFD returned a new fd that nothing else owns.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(raw) };
        GuestMemory::shared(fd, len)
    }

    /// `KVM_SET_USER_MEMORY_REGION2` mapping the guest_memfd `memory` (from
    /// [`Vm::guest_memfd`]) at `gpa` in the next free slot, `KVM_MEM_GUEST_MEMFD`.
    pub fn add_gmem_slot(&mut self, gpa: u64, memory: GuestMemory) -> Result<u32, KvmError> {
        let slot = u32::try_from(self.memory.len())
            .map_err(|_| KvmError::Layout("too many memslots".into()))?;
        let gmem = memory
            .file()
            .map(|f| std::os::fd::AsRawFd::as_raw_fd(&f))
            .and_then(|fd| u32::try_from(fd).ok())
            .ok_or_else(|| KvmError::Internal("guest_memfd slot without its file".into()))?;
        let region = kvm_bindings::kvm_userspace_memory_region2 {
            slot,
            flags: kvm_bindings::KVM_MEM_GUEST_MEMFD,
            guest_phys_addr: gpa,
            memory_size: memory.len() as u64,
            userspace_addr: memory.host_addr(),
            guest_memfd_offset: 0,
            guest_memfd: gmem,
            ..Default::default()
        };
        self.memory.push(memory);
        self.timed("KVM_SET_USER_MEMORY_REGION2", |vm, _| {
            // SAFETY: the region describes a live mapping and guest_memfd owned by this Vm,
            // which drops the VM fd (and with it the memslot) before both.
            unsafe { vm.set_user_memory_region2(region) }
        })?;
        Ok(slot)
    }

    /// `KVM_CREATE_VCPU` with the next id, then `KVM_SET_CPUID2` with everything the host
    /// supports, as every VMM does before any other vCPU state: since Linux 6.12.112 (stable)
    /// `KVM_SET_SREGS` checks EFER against the guest CPUID (`kvm_valid_efer()`), so long mode
    /// needs CPUID.80000001H:EDX.LM. Returns the vCPU's index.
    pub fn create_vcpu(&mut self) -> Result<usize, KvmError> {
        let id = self.vcpus.len() as u64;
        self.timed("KVM_CREATE_VCPU", |vm, vcpus| {
            vcpus.push(vm.create_vcpu(id)?);
            Ok(())
        })?;
        let index = self.vcpus.len() - 1;
        let (cpuid, vcpus) = (&self.cpuid, &self.vcpus);
        timed(&mut self.log, self.clock, "KVM_SET_CPUID2", || {
            vcpus[index].set_cpuid2(cpuid)
        })?;
        Ok(index)
    }

    /// `KVM_IOEVENTFD` on a 4-byte MMIO doorbell with a datamatch, the way virtio-mmio VMMs
    /// register queue notifications.
    pub fn register_ioeventfd_mmio(&mut self, gpa: u64, datamatch: u32) -> Result<(), KvmError> {
        let evt = register_ioeventfd(&self.fd, &mut self.log, self.clock, gpa, datamatch)?;
        self.ioeventfds.push(evt);
        Ok(())
    }

    /// Points vCPU `index` at the real-mode lifecycle payload and runs it until the guest
    /// signals `Ready`. Any other exit is an error carrying the exit and the registers; a
    /// guest that neither signals nor exits within `timeout` is interrupted by the watchdog.
    pub fn run_until_signal(&mut self, index: usize, timeout: Duration) -> Result<(), KvmError> {
        let (clock, log) = (self.clock, &mut self.log);
        let vcpu = self
            .vcpus
            .get_mut(index)
            .ok_or_else(|| KvmError::Internal(format!("no vCPU {index} to run")))?;
        // Real mode at the payload: CS base 0, IP at the entry point.
        let mut sregs = timed(log, clock, "KVM_GET_SREGS", || vcpu.get_sregs())?;
        sregs.cs.base = 0;
        sregs.cs.selector = 0;
        timed(log, clock, "KVM_SET_SREGS", || vcpu.set_sregs(&sregs))?;
        let mut regs = timed(log, clock, "KVM_GET_REGS", || vcpu.get_regs())?;
        regs.rip = ENTRY_GPA;
        regs.rflags = 0x2;
        timed(log, clock, "KVM_SET_REGS", || vcpu.set_regs(&regs))?;

        if index > 0 {
            // With an in-kernel local APIC an application processor starts in
            // wait-for-SIPI (KVM_MP_STATE_UNINITIALIZED); the guest here has no BSP to send
            // INIT-SIPI, so the VMM starts it as runnable.
            let runnable = kvm_bindings::kvm_mp_state {
                mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
            };
            timed(log, clock, "KVM_SET_MP_STATE", || {
                vcpu.set_mp_state(runnable)
            })?;
        }
        let start = Instant::now();
        let mut ready_at = None;
        runner::run(vcpu, timeout, |exit| match exit {
            GuestExit::Signal {
                signal: Signal::Ready,
                at,
                ..
            } => {
                ready_at = Some(at);
                Ok(Flow::Stop)
            }
            other => Err(KvmError::Guest(format!(
                "unexpected {other:?} before the ready signal"
            ))),
        })?;
        let end = ready_at.unwrap_or_else(Instant::now);
        log.push(TimedIoctl {
            name: "KVM_RUN",
            start_ns: ns_since(clock, start),
            dur_ns: ns_since(start, end),
            flags: None,
        });
        Ok(())
    }

    /// Puts vCPU `index` in 64-bit mode at `cpl`, at the payload's entry point.
    pub fn setup_long_mode(&mut self, index: usize, cpl: Cpl) -> Result<(), KvmError> {
        let (clock, log) = (self.clock, &mut self.log);
        let vcpu = self
            .vcpus
            .get_mut(index)
            .ok_or_else(|| KvmError::Internal(format!("no vCPU {index}")))?;
        let mut sregs = timed(log, clock, "KVM_GET_SREGS", || vcpu.get_sregs())?;
        long_mode::set_long_mode(&mut sregs, cpl);
        timed(log, clock, "KVM_SET_SREGS", || vcpu.set_sregs(&sregs))?;
        let regs = long_mode::entry_regs();
        timed(log, clock, "KVM_SET_REGS", || vcpu.set_regs(&regs))
    }

    /// vCPU `index`, to run.
    pub fn vcpu_mut(&mut self, index: usize) -> Option<&mut VcpuFd> {
        self.vcpus.get_mut(index)
    }

    /// Time since the last timer tick when `KVM_CREATE_VM` was issued, ns.
    pub fn tick_phase_ns(&self) -> u64 {
        self.tick_phase_ns
    }

    /// The clock every timing of this VM counts from (just before `KVM_CREATE_VM`).
    pub fn clock(&self) -> Instant {
        self.clock
    }

    /// ns since the clock started.
    pub fn elapsed_ns(&self) -> u64 {
        ns_since(self.clock, Instant::now())
    }

    /// Every ioctl issued so far, in order.
    pub fn log(&self) -> &[TimedIoctl] {
        &self.log
    }

    /// The VM fd.
    pub fn fd(&self) -> &VmFd {
        &self.fd
    }

    /// vCPU `index`.
    pub fn vcpu(&self, index: usize) -> Option<&VcpuFd> {
        self.vcpus.get(index)
    }

    /// Every vCPU, to run each on its own thread.
    pub fn vcpus_mut(&mut self) -> &mut [VcpuFd] {
        &mut self.vcpus
    }
}

/// `KVM_CAP_MAX_VCPUS` of this host's KVM (the most vCPUs one VM may have), or `None` when
/// /dev/kvm cannot be opened (the run then fails on that, with its own message).
pub fn max_vcpus() -> Option<u32> {
    let kvm = crate::open_kvm().ok()?;
    u32::try_from(kvm.get_max_vcpus()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Steps as this PVM host shows them (µs → ns): one-tick steps seen within a few µs read
    /// the coarse clock's lag, 2.753 ms here.
    fn seen(steps: &[(i128, i128, i128)]) -> Vec<(i128, i128, i128)> {
        steps
            .iter()
            .map(|&(step, lag, gap)| (step * 1000, lag * 1000, gap * 1000))
            .collect()
    }

    #[test]
    fn a_late_tick_catching_up_two_ticks_does_not_set_the_lag() {
        // The last step: the coarse clock jumped two ticks 1.275 ms after the update.
        let steps = seen(&[
            (4000, 2775, 23),
            (4000, 2753, 1),
            (4000, 2772, 19),
            (8000, 1275, 2726),
        ]);
        let tick = CoarseTick::from_steps(&steps);
        assert_eq!((tick.lag_ns, tick.len_ns), (2_753_000, 4_000_000));
    }

    #[test]
    fn a_step_seen_long_after_the_look_before_does_not_set_the_lag() {
        // A one-tick step seen after a 2.5 ms gap with an early-looking reading.
        let steps = seen(&[(4000, 2776, 24), (4000, 1200, 2500), (4000, 2769, 16)]);
        assert_eq!(CoarseTick::from_steps(&steps).lag_ns, 2_769_000);
    }

    #[test]
    fn with_no_prompt_one_tick_step_the_median_reading_stands() {
        let steps = seen(&[(8000, 1000, 3000), (8000, 2000, 3000), (8000, 3000, 3000)]);
        assert_eq!(CoarseTick::from_steps(&steps).lag_ns, 2_000_000);
        assert_eq!(CoarseTick::from_steps(&[]).lag_ns, 0);
    }
}
