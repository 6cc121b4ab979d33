//! The `memory` scenario on real KVM: first touches of a freshly backed region, with
//! stage-2 fault counts from KVM's own statistics.

use kvm_ioctls::Kvm;
use vmm_sys_util::ioctl::ioctl_with_mut_ref;
use vmm_sys_util::ioctl_iowr_nr;

use super::KvmError;
use super::guest::layout::{DATA_GPA, GuestPage, Layout};
use super::guest::{Cpl, payload};
use super::host::HostInfo;
use super::measure::{section, unexpected};
use super::memory::{Backing, GuestMemory};
use super::uffd::UffdServer;
use super::vm::Vm;
use crate::backend::memory::{HostBacking, TouchPlan, TouchResult};

ioctl_iowr_nr!(
    KVM_PRE_FAULT_MEMORY,
    0xAE,
    0xd5,
    kvm_bindings::kvm_pre_fault_memory
);

/// Runs one pass of the plan in a fresh VM.
pub fn touch(kvm: &Kvm, host: &HostInfo, plan: &TouchPlan) -> Result<TouchResult, KvmError> {
    match plan.backing {
        HostBacking::Anonymous(Backing::Thp) if host.thp == "never" => {
            return Err(KvmError::Unsupported(
                "THP is disabled on this host (/sys/kernel/mm/transparent_hugepage/enabled is never)".into(),
            ));
        }
        HostBacking::PreFault if !host.has_cap("KVM_CAP_PRE_FAULT_MEMORY") => {
            return Err(KvmError::MissingCap("KVM_CAP_PRE_FAULT_MEMORY"));
        }
        _ => {}
    }
    let order = plan.page_order();
    let pages = order.len() as u64;
    let layout = Layout::new(plan.size_bytes, plan.guest_page, pages)?;
    let code = payload::touch_loop(pages, layout.index_bytes, plan.access, plan.touch)?;
    // The system slot is populated so that only the data region's faults are in question.
    let mut system = GuestMemory::backed(usize_of(layout.system_bytes)?, Backing::Populated)?;
    layout.write_system(&mut system, &code)?;
    layout.write_index(&mut system, &order)?;
    let size = usize_of(plan.size_bytes)?;
    let (data, server) = match plan.backing {
        HostBacking::Anonymous(backing) => (GuestMemory::backed(size, backing)?, None),
        HostBacking::Uffd(window) => {
            let data = GuestMemory::backed(size, Backing::Lazy)?;
            let server = UffdServer::start(&data, window)?;
            (data, Some(server))
        }
        // Populated first: on memory that is not yet present, KVM_PRE_FAULT_MEMORY (a read
        // fault) maps the shared zero page read-only and every guest write faults again.
        HostBacking::PreFault => (GuestMemory::backed(size, Backing::Populated)?, None),
    };
    let mut vm = Vm::create(kvm)?;
    vm.add_memslot(0, system)?;
    vm.add_memslot(DATA_GPA, data)?;
    vm.create_vcpu()?;
    let cpl = plan.cpl.unwrap_or(Cpl::default_for(host.kvm_flavour));
    vm.setup_long_mode(0, cpl)?;
    if plan.backing == HostBacking::PreFault {
        pre_fault(&vm, DATA_GPA, plan.size_bytes)?;
    }
    let measured = section(&mut vm, plan.timeout, |exit| Err(unexpected(&exit)))?;
    let uffd_faults = server
        .map(UffdServer::finish)
        .transpose()?
        .map(|s| s.faults);
    Ok(TouchResult {
        pages,
        elapsed_ns: measured.elapsed_ns,
        uffd_faults,
        kvm_stats: measured.kvm_stats,
        guest_table_pages: Some(guest_table_pages(&order, plan.guest_page)),
    })
}

/// The 4 KiB pages of the guest's own page tables that a pass over `order` reads for the
/// first time: the data region's PD pages (one per GiB) and, with 4 KiB guest pages, its PT
/// pages (one per 2 MiB). The index array and everything else the loop reads were touched
/// before the measured section.
fn guest_table_pages(order: &[u32], guest_page: GuestPage) -> u64 {
    let distinct = |shift: u32| {
        order
            .iter()
            .map(|p| p >> shift)
            .collect::<std::collections::BTreeSet<_>>()
            .len() as u64
    };
    // 4 KiB pages: 512 per PT page, 512 × 512 per PD page.
    let pds = distinct(18);
    match guest_page {
        GuestPage::Huge => pds,
        GuestPage::Small => pds + distinct(9),
    }
}

/// `KVM_PRE_FAULT_MEMORY` over [gpa, gpa + size), resumed until done: the kernel returns
/// early (with the range advanced) when it has a signal or needs to reschedule.
fn pre_fault(vm: &Vm, gpa: u64, size: u64) -> Result<(), KvmError> {
    let vcpu = vm
        .vcpu(0)
        .ok_or_else(|| KvmError::Internal("no vCPU 0".into()))?;
    let mut range = kvm_bindings::kvm_pre_fault_memory {
        gpa,
        size,
        ..Default::default()
    };
    while range.size > 0 {
        // SAFETY: the argument is a valid kvm_pre_fault_memory the kernel reads and updates;
        // `vcpu` is a live vCPU fd.
        let rc = unsafe { ioctl_with_mut_ref(vcpu, KVM_PRE_FAULT_MEMORY(), &mut range) };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if matches!(err.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) {
                continue;
            }
            return Err(KvmError::Ioctl {
                op: "KVM_PRE_FAULT_MEMORY",
                source: err,
            });
        }
    }
    Ok(())
}

fn usize_of(v: u64) -> Result<usize, KvmError> {
    usize::try_from(v)
        .map_err(|_| KvmError::Layout(format!("{v} bytes do not fit this host's address space")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_pages_are_one_pd_per_gib_and_one_pt_per_2mib_touched() {
        let seq: Vec<u32> = (0..2048).collect(); // 8 MiB
        assert_eq!(guest_table_pages(&seq, GuestPage::Huge), 1);
        assert_eq!(guest_table_pages(&seq, GuestPage::Small), 1 + 4);
        let two_gib: Vec<u32> = (0..524_288).step_by(4096).collect(); // stride 16 MiB
        assert_eq!(guest_table_pages(&two_gib, GuestPage::Huge), 2);
        assert_eq!(guest_table_pages(&two_gib, GuestPage::Small), 2 + 128);
    }
}
