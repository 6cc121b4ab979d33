//! Executes a lifecycle construction plan on real KVM.

use kvm_ioctls::Kvm;

use super::KvmError;
use super::guest::{ENTRY_GPA, signal_payload};
use super::memory::GuestMemory;
use super::stats::{StatsReader, named_deltas};
use super::vm::Vm;
use crate::backend::lifecycle::{ConstructionPlan, ConstructionTrace, IoctlEvent, Step};

/// QEMU's choice; VMX needs three free pages below 4 GiB for real-mode emulation.
const TSS_GPA: usize = 0xfffb_d000;
/// virtio-mmio devices sit above RAM; each has a QueueNotify doorbell at offset 0x50.
const MMIO_DEVICES_GPA: u64 = 0xd000_0000;
const MMIO_DEVICE_STRIDE: u64 = 0x200;
const QUEUE_NOTIFY: u64 = 0x50;

/// Builds one VM in the plan's order and runs vCPU 0 until the guest signals.
///
/// Guest memory is mapped and the payload written before the clock starts: that is VMM work
/// independent of the order under test.
pub fn construct(kvm: &Kvm, plan: &ConstructionPlan) -> Result<ConstructionTrace, KvmError> {
    if plan
        .steps
        .iter()
        .any(|s| matches!(s, Step::BootIoeventfds | Step::BootMemslot))
    {
        return Err(KvmError::Unsupported(
            "registrations while vCPUs run need a vCPU thread running beside them; the model backend runs them".into(),
        ));
    }
    let mut memory = Some(GuestMemory::anonymous(plan.mem_bytes)?);
    if let Some(m) = memory.as_mut() {
        m.write(
            usize::try_from(ENTRY_GPA).unwrap_or(usize::MAX),
            &signal_payload(),
        )?;
    }
    let mut vm = Vm::create(kvm)?;
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
                    let gpa = MMIO_DEVICES_GPA + u64::from(i) * MMIO_DEVICE_STRIDE + QUEUE_NOTIFY;
                    vm.register_ioeventfd_mmio(gpa, 0)?;
                }
            }
            Step::Run => {
                vm.run_until_signal(0, plan.run_timeout)?;
                ready_ns = Some(vm.elapsed_ns());
            }
            Step::BootIoeventfds | Step::BootMemslot => {}
        }
    }
    let ready_ns = ready_ns.ok_or_else(|| KvmError::Internal("the plan has no run step".into()))?;
    let mut kvm_stats = since_creation(vm.fd(), "kvm.vm");
    if let Some(vcpu) = vm.vcpu(0) {
        kvm_stats.extend(since_creation(vcpu, "kvm.vcpu"));
    }
    let ioctls = vm
        .log()
        .iter()
        .map(|t| IoctlEvent {
            name: t.name.to_string(),
            start_ns: t.start_ns,
            dur_ns: t.dur_ns,
            flags: t.flags,
        })
        .collect();
    Ok(ConstructionTrace {
        ioctls,
        ready_ns,
        kvm_stats,
        srcu_effects: Vec::new(),
    })
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
