//! The `memory` scenario on real KVM: first touches of a freshly backed region, with
//! stage-2 fault counts from KVM's own statistics.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kvm_ioctls::Kvm;
use vmm_sys_util::ioctl::ioctl_with_mut_ref;
use vmm_sys_util::ioctl_iowr_nr;

use super::KvmError;
use super::guest::layout::{DATA_GPA, GuestPage, Layout};
use super::guest::runner::{self, Flow, GuestExit};
use super::guest::{Cpl, Signal, payload};
use super::guest_memory::{Backing, GuestMemory, HugeSize};
use super::host::HostInfo;
use super::hugetlb::PoolGuard;
use super::measure::{section, unexpected};
use super::stats::{StatsReader, named_deltas};
use super::uffd::UffdServer;
use super::vm::Vm;
use hvlab_core::memory::{HostBacking, TouchPlan, TouchResult};

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
            return Err(KvmError::Lacks(
                "THP is disabled on this host (/sys/kernel/mm/transparent_hugepage/enabled is never)".into(),
            ));
        }
        HostBacking::PreFault if !host.has_cap("KVM_CAP_PRE_FAULT_MEMORY") => {
            return Err(KvmError::MissingCap("KVM_CAP_PRE_FAULT_MEMORY"));
        }
        _ => {}
    }
    if plan.vcpus > 1 {
        return touch_parallel(kvm, host, plan);
    }
    let order = plan.page_order();
    let pages = order.len() as u64;
    let layout = Layout::new(plan.size_bytes, plan.guest_page, pages)?;
    let code = payload::touch_loop(pages, layout.index_bytes, plan.access, plan.touch)?;
    // The system slot is populated so that only the data region's faults are in question.
    let mut system = GuestMemory::backed(usize_of(layout.system_bytes)?, Backing::Populated)?;
    layout.write_system(&mut system, &code)?;
    layout.write_index(&mut system, &order)?;
    let mut vm = Vm::create(kvm)?;
    vm.add_memslot(0, system)?;
    let region = add_data_region(&mut vm, kvm, plan)?;
    vm.create_vcpu()?;
    let cpl = plan.cpl.unwrap_or(Cpl::default_for(host.kvm_flavour));
    vm.setup_long_mode(0, cpl)?;
    if plan.backing == HostBacking::PreFault {
        pre_fault(&vm, DATA_GPA, plan.size_bytes)?;
    }
    let measured = section(&mut vm, plan.timeout, |exit| Err(unexpected(&exit)))?;
    let pool = pool_sizes(&region);
    let uffd_faults = region
        .server
        .map(UffdServer::finish)
        .transpose()?
        .map(|s| s.faults);
    // The VM (and its hugetlb mapping) goes before the pool shrinks back.
    drop(vm);
    drop(region.pool);
    Ok(TouchResult {
        pages,
        elapsed_ns: measured.elapsed_ns,
        uffd_faults,
        kvm_stats: measured.kvm_stats,
        guest_table_pages: Some(guest_table_pages(&order, plan.guest_page)),
        vcpu_ns: Vec::new(),
        hugetlb_pool: pool,
    })
}

/// What keeps the data region served while the guest runs: its userfaultfd server and its
/// hugetlb pool (given back when dropped, after the VM).
struct DataRegion {
    server: Option<UffdServer>,
    pool: Option<PoolGuard>,
}

/// Backs the data region as the plan says and maps it at [`DATA_GPA`].
fn add_data_region(vm: &mut Vm, kvm: &Kvm, plan: &TouchPlan) -> Result<DataRegion, KvmError> {
    let size = usize_of(plan.size_bytes)?;
    let mut region = DataRegion {
        server: None,
        pool: None,
    };
    let data = match plan.backing {
        HostBacking::Anonymous(backing) => GuestMemory::backed(size, backing)?,
        HostBacking::Uffd(window) => {
            let data = GuestMemory::backed(size, Backing::Lazy)?;
            region.server = Some(UffdServer::start(&data, window)?);
            data
        }
        // Populated first: on memory that is not yet present, KVM_PRE_FAULT_MEMORY (a read
        // fault) maps the shared zero page read-only and every guest write faults again.
        HostBacking::PreFault => GuestMemory::backed(size, Backing::Populated)?,
        HostBacking::Shmem => GuestMemory::memfd(size, None)?,
        HostBacking::Hugetlb(huge) => {
            region.pool = Some(PoolGuard::reserve(huge, plan.size_bytes)?);
            GuestMemory::memfd(size, Some(huge))?
        }
        HostBacking::UffdMinor(window) => {
            let data = GuestMemory::memfd(size, None)?;
            data.fill_file()?;
            region.server = Some(UffdServer::start_mode(&data, window, true)?);
            data
        }
        HostBacking::UffdMinorHugetlb => {
            region.pool = Some(PoolGuard::reserve(HugeSize::Mib2, plan.size_bytes)?);
            let data = GuestMemory::memfd(size, Some(HugeSize::Mib2))?;
            data.fill_file()?;
            region.server = Some(UffdServer::start_minor_hugetlb(&data)?);
            data
        }
        HostBacking::GuestMemfd => {
            let data = vm.guest_memfd(kvm, size)?;
            vm.add_gmem_slot(DATA_GPA, data)?;
            return Ok(region);
        }
    };
    vm.add_memslot(DATA_GPA, data)?;
    Ok(region)
}

/// The hugetlb pool's size before and after hvlab grew it, for the pass that used it.
fn pool_sizes(region: &DataRegion) -> Option<(u64, u64)> {
    region.pool.as_ref().map(|p| p.before_after)
}

/// One pass with `plan.vcpus` vCPUs, each on its own host thread touching its own slice
/// (memstress's shape, tools/testing/selftests/kvm/lib/memstress.c). Every vCPU first
/// pre-touches its slice of the order array and signals `Start`; all then wait for each
/// other, so the measured section begins together on every vCPU. Each vCPU's time runs from
/// that common start to its own `End`; the pass's from the start to the last `End`.
/// Statistics: the VM's, and every vCPU's summed.
fn touch_parallel(kvm: &Kvm, host: &HostInfo, plan: &TouchPlan) -> Result<TouchResult, KvmError> {
    let orders = plan.vcpu_orders();
    let n = orders.len();
    let pages: u64 = orders.iter().map(|o| o.len() as u64).sum();
    let (mut vm, region) = parallel_vm(kvm, host, plan, &orders)?;
    let vm_stats = StatsReader::open(vm.fd()).ok();
    let gate = Gate::new(n, plan.timeout);
    let vm_before = std::sync::Mutex::new(None);
    let outcomes: Vec<Result<VcpuPass, KvmError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = vm
            .vcpus_mut()
            .iter_mut()
            .map(|vcpu| {
                let (gate, vm_stats, vm_before) = (&gate, &vm_stats, &vm_before);
                scope.spawn(move || {
                    let out = run_slice(vcpu, plan.timeout, gate, || {
                        // The last vCPU to arrive reads the VM's statistics while all wait.
                        if let Some(r) = vm_stats
                            && let Ok(mut b) = vm_before.lock()
                        {
                            *b = Some(r.snapshot()?);
                        }
                        Ok(())
                    });
                    if out.is_err() {
                        gate.fail();
                    }
                    out
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(KvmError::Internal("a vCPU thread panicked".into())))
            })
            .collect()
    });
    let vm_after = vm_stats.as_ref().map(StatsReader::snapshot).transpose()?;
    let pool = pool_sizes(&region);
    let uffd_faults = region
        .server
        .map(UffdServer::finish)
        .transpose()?
        .map(|s| s.faults);
    drop(vm);
    drop(region.pool);
    let passes = outcomes.into_iter().collect::<Result<Vec<_>, _>>()?;
    let start = passes
        .iter()
        .map(|p| p.start)
        .min()
        .ok_or_else(|| KvmError::Internal("no vCPU ran".into()))?;
    let ns = |t: Instant| {
        u64::try_from(t.saturating_duration_since(start).as_nanos()).unwrap_or(u64::MAX)
    };
    let vcpu_ns: Vec<u64> = passes.iter().map(|p| ns(p.end)).collect();
    let mut kvm_stats = summed_stats(passes);
    if let (Some(r), Ok(Some(before)), Some(after)) = (
        vm_stats.as_ref(),
        vm_before
            .into_inner()
            .map_err(|_| KvmError::Internal("poisoned".into())),
        vm_after,
    ) {
        kvm_stats.extend(named_deltas(r.layout(), &before, &after, "kvm.vm"));
    }
    let all: Vec<u32> = orders.concat();
    Ok(TouchResult {
        pages,
        elapsed_ns: vcpu_ns.iter().copied().max().unwrap_or(0),
        uffd_faults,
        kvm_stats,
        guest_table_pages: Some(guest_table_pages(&all, plan.guest_page)),
        vcpu_ns,
        hugetlb_pool: pool,
    })
}

/// The VM of a parallel pass: the guest code, each vCPU's slice of the order array (on pages
/// of its own), the data region, and one vCPU per slice pointed at its slice.
fn parallel_vm(
    kvm: &Kvm,
    host: &HostInfo,
    plan: &TouchPlan,
    orders: &[Vec<u32>],
) -> Result<(Vm, DataRegion), KvmError> {
    // Each slice of the order array starts on a page of its own, so one vCPU's pre-touch
    // covers exactly its slice.
    let slots: Vec<u64> = orders
        .iter()
        .map(|o| (o.len() as u64 * 4).next_multiple_of(4096) / 4)
        .collect();
    let index_entries: u64 = slots.iter().sum();
    let layout = Layout::new(plan.size_bytes, plan.guest_page, index_entries)?;
    let code = payload::touch_slice_loop(plan.access, plan.touch)?;
    let mut system = GuestMemory::backed(usize_of(layout.system_bytes)?, Backing::Populated)?;
    layout.write_system(&mut system, &code)?;
    let mut flat = Vec::with_capacity(usize_of(index_entries)?);
    for (o, slot) in orders.iter().zip(&slots) {
        flat.extend_from_slice(o);
        flat.resize(flat.len() + usize_of(*slot)? - o.len(), 0);
    }
    layout.write_index(&mut system, &flat)?;
    let mut vm = Vm::create(kvm)?;
    vm.add_memslot(0, system)?;
    let region = add_data_region(&mut vm, kvm, plan)?;
    let cpl = plan.cpl.unwrap_or(Cpl::default_for(host.kvm_flavour));
    let mut start_gpa = super::guest::layout::INDEX_GPA;
    for (i, (o, slot)) in orders.iter().zip(&slots).enumerate() {
        vm.create_vcpu()?;
        vm.setup_long_mode(i, cpl)?;
        let vcpu = vm
            .vcpu_mut(i)
            .ok_or_else(|| KvmError::Internal(format!("no vCPU {i}")))?;
        let mut regs = vcpu
            .get_regs()
            .map_err(crate::ioctl_error("KVM_GET_REGS"))?;
        regs.rsi = start_gpa;
        regs.r13 = o.len() as u64;
        vcpu.set_regs(&regs)
            .map_err(crate::ioctl_error("KVM_SET_REGS"))?;
        start_gpa += slot * 4;
    }
    if plan.backing == HostBacking::PreFault {
        pre_fault(&vm, DATA_GPA, plan.size_bytes)?;
    }
    Ok((vm, region))
}

/// Every vCPU's statistics, each summed over the vCPUs, in the order first seen.
fn summed_stats(passes: Vec<VcpuPass>) -> Vec<(String, String, i128)> {
    let mut kvm_stats: Vec<(String, String, i128)> = Vec::new();
    for (name, unit, delta) in passes.into_iter().flat_map(|p| p.stats) {
        match kvm_stats.iter_mut().find(|(n, _, _)| *n == name) {
            Some(entry) => entry.2 += delta,
            None => kvm_stats.push((name, unit, delta)),
        }
    }
    kvm_stats
}

/// What one vCPU's thread measured.
struct VcpuPass {
    start: Instant,
    end: Instant,
    stats: Vec<(String, String, i128)>,
}

/// A rendezvous of the vCPU threads at `Start` that a failed thread breaks (so no thread
/// waits for one that will never come) and a deadline bounds.
struct Gate {
    arrived: AtomicUsize,
    released: AtomicBool,
    failed: AtomicBool,
    n: usize,
    deadline: Instant,
}

impl Gate {
    fn new(n: usize, timeout: Duration) -> Gate {
        Gate {
            arrived: AtomicUsize::new(0),
            released: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            n,
            deadline: Instant::now() + timeout,
        }
    }

    fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
    }

    /// Waits for every thread; the last to arrive runs `last` before releasing the rest.
    fn wait(&self, last: impl FnOnce() -> Result<(), KvmError>) -> Result<Instant, KvmError> {
        if self.arrived.fetch_add(1, Ordering::SeqCst) + 1 == self.n {
            let done = last();
            if done.is_err() {
                self.fail();
            }
            self.released.store(true, Ordering::SeqCst);
            done?;
        }
        // More vCPU threads than cores: yield rather than spin, so the late ones can arrive.
        while !self.released.load(Ordering::SeqCst) {
            if self.failed.load(Ordering::SeqCst) {
                return Err(KvmError::Guest(
                    "another vCPU failed before the start".into(),
                ));
            }
            if Instant::now() > self.deadline {
                return Err(KvmError::Guest(
                    "the vCPUs did not all reach the start before the watchdog".into(),
                ));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
        if self.failed.load(Ordering::SeqCst) {
            return Err(KvmError::Guest(
                "another vCPU failed before the start".into(),
            ));
        }
        Ok(Instant::now())
    }
}

/// Runs one vCPU through its slice: its statistics are read at its own `Start` (before the
/// rendezvous) and its own `End`.
fn run_slice(
    vcpu: &mut kvm_ioctls::VcpuFd,
    timeout: Duration,
    gate: &Gate,
    last: impl FnOnce() -> Result<(), KvmError>,
) -> Result<VcpuPass, KvmError> {
    let reader = StatsReader::open(&*vcpu).ok();
    let mut last = Some(last);
    let mut before = None;
    let mut start = None;
    let mut pass = None;
    runner::run(vcpu, timeout, |exit| match exit {
        GuestExit::Signal {
            signal: Signal::Start,
            ..
        } => {
            before = reader.as_ref().map(StatsReader::snapshot).transpose()?;
            let last = last
                .take()
                .ok_or_else(|| KvmError::Guest("the guest signalled Start twice".into()))?;
            start = Some(gate.wait(last)?);
            Ok(Flow::Continue)
        }
        GuestExit::Signal {
            signal: Signal::End,
            at,
            ..
        } => {
            let start = start
                .take()
                .ok_or_else(|| KvmError::Guest("the guest signalled End before Start".into()))?;
            let mut stats = Vec::new();
            if let (Some(r), Some(b)) = (reader.as_ref(), before.as_ref()) {
                stats = named_deltas(r.layout(), b, &r.snapshot()?, "kvm.vcpu");
            }
            pass = Some(VcpuPass {
                start,
                end: at,
                stats,
            });
            Ok(Flow::Stop)
        }
        other => Err(unexpected(&other)),
    })?;
    pass.ok_or_else(|| KvmError::Guest("the guest stopped without signalling End".into()))
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
    pre_fault_on(vcpu, gpa, size)
}

/// [`pre_fault`] on the vCPU fd `vcpu` (a vCPU, or a duplicate of one's fd).
pub(crate) fn pre_fault_on(
    vcpu: &impl std::os::fd::AsRawFd,
    gpa: u64,
    size: u64,
) -> Result<(), KvmError> {
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
