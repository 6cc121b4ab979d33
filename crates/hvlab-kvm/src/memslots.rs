//! `memslots` on real KVM: one VM, its memslots updated one by one by
//! `KVM_SET_USER_MEMORY_REGION`, each call timed on the host clock.
//!
//! The VM has no vCPU and no irqchip: no SRCU reader and no grace period in flight, so every
//! update pays what `kvm_set_memslot()` itself costs, its `kvm_swap_active_memslots()` waits
//! included. The slots' memory is one `MAP_NORESERVE` mapping that is never touched: KVM
//! records the host range without faulting it in.

use std::time::Instant;

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VmFd};

use super::KvmError;
use super::guest_memory::GuestMemory;
use hvlab_core::memslots::{MemslotPlan, MemslotResult, SlotOp};

/// Guest-physical address bits when the host does not say (36: the smallest MAXPHYADDR of
/// any x86-64 CPU).
const FALLBACK_GPA_BITS: u32 = 36;

/// The guest-physical address bits a VM here can use: MAXPHYADDR from the CPUID leaf
/// 0x80000008 KVM supports (EAX bits 7:0), which bounds every memslot's end.
fn guest_phys_bits(kvm: &Kvm) -> u32 {
    kvm.get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .ok()
        .and_then(|c| {
            c.as_slice()
                .iter()
                .find(|e| e.function == 0x8000_0008)
                .map(|e| e.eax & 0xff)
        })
        .filter(|bits| (32..=64).contains(bits))
        .unwrap_or(FALLBACK_GPA_BITS)
}

/// Refuses a plan the host cannot take, with its limits, before any VM is built.
fn admit(kvm: &Kvm, plan: &MemslotPlan) -> Result<(), KvmError> {
    // KVM_CAP_NR_MEMSLOTS: user memslots per address space (KVM_USER_MEM_SLOTS, 32764 on x86).
    let cap = kvm.get_nr_memslots();
    if usize::try_from(plan.slots).map_or(true, |n| n > cap) {
        return Err(KvmError::Lacks(format!(
            "slots={} is more than this host's KVM_CAP_NR_MEMSLOTS ({cap}): choose at most {cap}",
            plan.slots
        )));
    }
    let end = plan.gpa(0, false) + plan.span_bytes();
    let bits = guest_phys_bits(kvm);
    if bits < 64 && end > 1u64 << bits {
        return Err(KvmError::Lacks(format!(
            "{} slots of {} bytes, moved above themselves, end at guest-physical {end:#x}, beyond this host's {bits}-bit guest-physical space: use fewer or smaller slots (--set slot_size)",
            plan.slots, plan.slot_bytes
        )));
    }
    Ok(())
}

fn region(
    plan: &MemslotPlan,
    memory: &GuestMemory,
    i: u32,
    gpa: u64,
    bytes: u64,
) -> kvm_userspace_memory_region {
    kvm_userspace_memory_region {
        slot: i,
        flags: 0,
        guest_phys_addr: gpa,
        memory_size: bytes,
        userspace_addr: memory.host_addr() + u64::from(i) * plan.slot_bytes,
    }
}

/// One `KVM_SET_USER_MEMORY_REGION`, timed.
fn set(vm: &VmFd, r: kvm_userspace_memory_region, op: &'static str) -> Result<u64, KvmError> {
    let start = Instant::now();
    // SAFETY: every region points into `memory`, which the caller keeps alive until the VM
    // (and with it every slot) is dropped.
    unsafe { vm.set_user_memory_region(r) }.map_err(crate::ioctl_error(op))?;
    Ok(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// Builds a VM, applies the plan's update to every slot, and returns each update's time.
pub fn update_memslots(kvm: &Kvm, plan: &MemslotPlan) -> Result<MemslotResult, KvmError> {
    admit(kvm, plan)?;
    let total = usize::try_from(u64::from(plan.slots) * plan.slot_bytes).map_err(|_| {
        KvmError::Layout(format!("{} slots of {} bytes", plan.slots, plan.slot_bytes))
    })?;
    let memory = GuestMemory::anonymous(total)?;
    let vm = kvm
        .create_vm()
        .map_err(crate::ioctl_error("KVM_CREATE_VM"))?;
    let add = |i: u32| region(plan, &memory, i, plan.gpa(i, false), plan.slot_bytes);
    let mut op_ns = Vec::with_capacity(plan.slots as usize);
    for i in 0..plan.slots {
        let ns = set(&vm, add(i), "KVM_SET_USER_MEMORY_REGION (create)")?;
        if plan.op == SlotOp::Add {
            op_ns.push(ns);
        }
    }
    match plan.op {
        SlotOp::Add => {}
        SlotOp::Move => {
            for i in 0..plan.slots {
                let moved = region(plan, &memory, i, plan.gpa(i, true), plan.slot_bytes);
                op_ns.push(set(&vm, moved, "KVM_SET_USER_MEMORY_REGION (move)")?);
            }
        }
        SlotOp::Delete => {
            for i in 0..plan.slots {
                // A size of 0 deletes the slot (KVM_MR_DELETE).
                let gone = region(plan, &memory, i, plan.gpa(i, false), 0);
                op_ns.push(set(&vm, gone, "KVM_SET_USER_MEMORY_REGION (delete)")?);
            }
        }
    }
    drop(vm);
    drop(memory);
    Ok(MemslotResult {
        op_ns,
        swaps_per_op: None,
    })
}
