//! The `exits` scenario on real KVM: a batch of one exit-causing instruction, each exit
//! handled the way a minimal VMM would.

use kvm_ioctls::Kvm;

use super::KvmError;
use super::guest::layout::{GuestPage, IOEVENTFD_GPA, Layout, MMIO_TEST_GPA};
use super::guest::payload::{self, Vendor};
use super::guest::runner::{Flow, GuestExit};
use super::guest::{Cpl, TEST_PORT};
use super::guest_memory::{Backing, GuestMemory};
use super::host::HostInfo;
use super::measure::{section, unexpected};
use super::vm::Vm;
use hvlab_core::exits::{ExitKind, ExitPlan, ExitResult};

/// Runs one batch of the plan in a fresh VM.
pub fn roundtrips(kvm: &Kvm, host: &HostInfo, plan: &ExitPlan) -> Result<ExitResult, KvmError> {
    let cpl = plan.cpl.unwrap_or(Cpl::default_for(host.kvm_flavour));
    if plan.pmu.is_some() {
        return Err(KvmError::Lacks(
            "PMU MSR-switching configurations are model variants".into(),
        ));
    }
    match plan.kind {
        ExitKind::Fastpath => {
            return Err(KvmError::Lacks(
                "fastpath exits (handle_fastpath_set_msr_irqoff) need a guest that arms an in-kernel LAPIC TSC-deadline timer, which hvlab's guest does not; the variant is model-only".into(),
            ));
        }
        ExitKind::Hlt if cpl == Cpl::Three => {
            return Err(KvmError::Lacks(
                "hlt needs guest CPL0 (--set guest.cpl=0): at CPL3 it raises #GP".into(),
            ));
        }
        ExitKind::PmuOn | ExitKind::PmuOff if !host.has_cap("KVM_CAP_PMU_CAPABILITY") => {
            return Err(KvmError::MissingCap("KVM_CAP_PMU_CAPABILITY"));
        }
        ExitKind::PmuOn if host.vpmu != Some(true) => {
            return Err(KvmError::Lacks(
                "the host's KVM has no vPMU (kvm.enable_pmu=N)".into(),
            ));
        }
        _ => {}
    }
    // The smallest layout: the exit loop touches no data.
    let layout = Layout::new(2 << 20, GuestPage::Huge, 0)?;
    let code = payload::exit_loop(plan.kind, plan.iterations, Vendor::of_host())?;
    let mut system = GuestMemory::backed(
        usize::try_from(layout.system_bytes)
            .map_err(|_| KvmError::Layout("layout too large".into()))?,
        Backing::Populated,
    )?;
    layout.write_system(&mut system, &code)?;
    let mut vm = Vm::create(kvm)?;
    if plan.kind == ExitKind::PmuOff {
        vm.disable_pmu()?;
    }
    vm.add_memslot(0, system)?;
    if plan.kind == ExitKind::Ioeventfd {
        vm.register_ioeventfd_mmio(IOEVENTFD_GPA, 0)?;
    }
    vm.create_vcpu()?;
    vm.setup_long_mode(0, cpl)?;
    let mut userspace_exits = 0u64;
    let measured = section(&mut vm, plan.timeout, |exit| {
        match exit {
            GuestExit::PioOut { port } if port == TEST_PORT => {}
            GuestExit::PioIn { port, data } if port == TEST_PORT => data.fill(0),
            GuestExit::MmioRead { gpa, data } if gpa == MMIO_TEST_GPA => data.fill(0),
            GuestExit::MmioWrite { gpa, .. } if gpa == MMIO_TEST_GPA || gpa == IOEVENTFD_GPA => {}
            GuestExit::Hlt => {}
            other => return Err(unexpected(&other)),
        }
        userspace_exits += 1;
        Ok(Flow::Continue)
    })?;
    Ok(ExitResult {
        iterations: plan.iterations,
        elapsed_ns: measured.elapsed_ns,
        tsc_ticks: measured.tsc_ticks,
        userspace_exits,
        kvm_stats: measured.kvm_stats,
        pmu: None,
    })
}
