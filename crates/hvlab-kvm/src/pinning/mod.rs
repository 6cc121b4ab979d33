//! The `pinning` scenario on real KVM: a guest that plays a profiled task, a pin manager that
//! pins its buffer's host memory for real.

pub mod pins;

use std::time::{Duration, Instant};

use kvm_ioctls::Kvm;

use super::KvmError;
use super::guest::layout::{DATA_GPA, GuestPage, Layout, PIN_DOORBELL_GPA};
use super::guest::payload::{self, PinLoop};
use super::guest::runner::{Flow, GuestExit};
use super::guest_memory::{Backing, GuestMemory};
use super::host::HostInfo;
use super::measure::{section, unexpected};
use super::vm::Vm;
use hvlab_core::error::BackendError;
use hvlab_core::pinning::{
    PinCache, PinMethod, PinPlan, PinPolicy, PinResult, Pinner, RECORDS_PER_MS,
};
use pins::{IoUringPinner, MlockPinner, check_memlock};

const STRIDE_PAD: u64 = 2 << 20;

/// Runs one trace. `Start`..`End` is the profiled task; between its slices the host sleeps
/// `off_ns` (other tasks run); after it, an idle tail lets the aging timer act.
pub fn pin_trace(kvm: &Kvm, host: &HostInfo, plan: &PinPlan) -> Result<PinResult, BackendError> {
    let _ = host;
    if plan.policy == PinPolicy::NoPin {
        return Err(KvmError::Lacks(
            "no-pin is model-only: without SPE hardware the kvm backend cannot see records lost to stage-2 faults".into(),
        )
        .into());
    }
    let gmem = plan.policy == PinPolicy::GmemPrefault;
    if gmem {
        let cap = |nr: u32| kvm.check_extension_raw(libc::c_ulong::from(nr)) > 0;
        let (has_gmem, has_prefault) = (
            cap(kvm_bindings::KVM_CAP_GUEST_MEMFD),
            cap(kvm_bindings::KVM_CAP_PRE_FAULT_MEMORY),
        );
        if !(has_gmem && has_prefault) {
            let yes = |b: bool| if b { "yes" } else { "no" };
            return Err(KvmError::Lacks(format!(
                "gmem-prefault needs guest_memfd and KVM_PRE_FAULT_MEMORY; this host's KVM has KVM_CAP_GUEST_MEMFD: {}, KVM_CAP_PRE_FAULT_MEMORY: {} (the memory scenario's gmem variant runs guest_memfd alone)",
                yes(has_gmem),
                yes(has_prefault)
            ))
            .into());
        }
    } else {
        check_memlock(plan.cap_bytes, plan.buffer_bytes)?;
    }
    let generations = if plan.relocate_every == 0 {
        1
    } else {
        plan.slices.div_ceil(plan.relocate_every)
    };
    let stride = plan.buffer_bytes + STRIDE_PAD;
    let data_bytes = (u64::from(generations) * stride).next_multiple_of(2 << 20);
    let layout = Layout::new(data_bytes, GuestPage::Huge, 0)?;
    let records = plan.slice_ns / 1_000_000 * RECORDS_PER_MS;
    let code = payload::pin_loop(&PinLoop {
        slices: u64::from(plan.slices),
        records,
        buffer_bytes: plan.buffer_bytes,
        stride,
        relocate_every: u64::from(plan.relocate_every),
        per_task: plan.per_task,
    })?;
    let usize_of =
        |v: u64| usize::try_from(v).map_err(|_| KvmError::Layout("region too large".into()));
    let mut system = GuestMemory::backed(usize_of(layout.system_bytes)?, Backing::Populated)?;
    layout.write_system(&mut system, &code)?;
    let mut vm = Vm::create(kvm)?;
    vm.add_memslot(0, system)?;
    if gmem {
        // The whole data region in guest_memfd; each buffer is pre-faulted on first enable.
        let data = vm.guest_memfd(kvm, usize_of(data_bytes)?)?;
        vm.add_gmem_slot(DATA_GPA, data)?;
        vm.create_vcpu()?;
        vm.setup_long_mode(0, crate::guest::Cpl::Three)?;
        let vcpu = vm
            .vcpu(0)
            .ok_or_else(|| KvmError::Internal("no vCPU 0".into()))?;
        // SAFETY: the vCPU fd stays open for this borrow (the Vm owns it and outlives it).
        let borrowed =
            unsafe { std::os::fd::BorrowedFd::borrow_raw(std::os::fd::AsRawFd::as_raw_fd(vcpu)) };
        let fd = borrowed
            .try_clone_to_owned()
            .map_err(|source| KvmError::Host {
                what: "duplicating the vCPU fd for KVM_PRE_FAULT_MEMORY".into(),
                source,
            })?;
        return run(&mut vm, plan, records, PrefaultPinner { vcpu: fd });
    }
    let data = GuestMemory::backed(usize_of(data_bytes)?, Backing::Lazy)?;
    let host_base = data.as_ptr() as usize;
    vm.add_memslot(DATA_GPA, data)?;
    vm.create_vcpu()?;
    vm.setup_long_mode(0, crate::guest::Cpl::Three)?;
    match plan.method {
        PinMethod::Mlock => run(
            &mut vm,
            plan,
            records,
            MlockPinner {
                host_base,
                gpa_base: DATA_GPA,
            },
        ),
        PinMethod::IoUring => run(
            &mut vm,
            plan,
            records,
            IoUringPinner::new(host_base, DATA_GPA),
        ),
    }
}

fn run<P: Pinner>(
    vm: &mut Vm,
    plan: &PinPlan,
    records: u64,
    pinner: P,
) -> Result<PinResult, BackendError> {
    let mut cache = PinCache::new(pinner, plan);
    let t0 = Instant::now();
    let now = || u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let mut failure: Option<BackendError> = None;
    let timeout = Duration::from_nanos(
        (plan.slice_ns + plan.off_ns) * u64::from(plan.slices) * 20 + 10_000_000_000,
    );
    let enable = PIN_DOORBELL_GPA;
    let disable = PIN_DOORBELL_GPA + 8;
    let measured = section(vm, timeout, |exit| {
        let GuestExit::MmioWrite { gpa, data } = exit else {
            return Err(unexpected(&exit));
        };
        let addr = data.try_into().map(u64::from_le_bytes).unwrap_or(0);
        let step = if gpa == enable {
            cache.enable(now(), addr).map(|(pinned, _)| {
                if !pinned {
                    cache.blackout(records);
                }
            })
        } else if gpa == disable {
            let r = cache.disable(now(), addr).map(drop);
            // The profiled task is switched out: other tasks run meanwhile.
            std::thread::sleep(Duration::from_nanos(plan.off_ns));
            r.and_then(|()| cache.age(now(), None).map(drop))
        } else {
            return Err(KvmError::Guest(format!(
                "store to {gpa:#x}, not a doorbell"
            )));
        };
        match step {
            Ok(()) => Ok(Flow::Continue),
            Err(e) => {
                let msg = e.to_string();
                failure = Some(e);
                Err(KvmError::Guest(msg))
            }
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    measured?;
    // The idle tail: the aging timer fires as pins come of age.
    let end = now() + plan.tail_ns;
    while let Some(expiry) = cache.next_expiry().filter(|e| *e <= end) {
        let wait = expiry.saturating_sub(now());
        std::thread::sleep(Duration::from_nanos(wait));
        cache.age(now(), None)?;
    }
    std::thread::sleep(Duration::from_nanos(
        end.saturating_sub(now()).min(plan.tail_ns),
    ));
    let (result, pinner) = cache.finish(now());
    // Whatever is still pinned is released with the pinner (and the VM's memory).
    drop(pinner);
    Ok(result)
}

/// gmem-prefault's "pinner": pins nothing; maps a buffer's guest_memfd pages at stage 2 with
/// `KVM_PRE_FAULT_MEMORY` (on a duplicate of vCPU 0's fd, which the run loop holds).
struct PrefaultPinner {
    vcpu: std::os::fd::OwnedFd,
}

impl Pinner for PrefaultPinner {
    fn pin(&mut self, _: u64, _: u64, _: bool) -> Result<u64, BackendError> {
        Err(KvmError::Internal("gmem-prefault never pins".into()).into())
    }

    fn unpin(&mut self, _: u64, _: u64) -> Result<u64, BackendError> {
        Err(KvmError::Internal("gmem-prefault never unpins".into()).into())
    }

    fn prefault(&mut self, addr: u64, bytes: u64) -> Result<u64, BackendError> {
        let t = Instant::now();
        super::memory::pre_fault_on(&self.vcpu, addr, bytes)?;
        Ok(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
}
