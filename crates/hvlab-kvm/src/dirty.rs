//! The `dirty` scenario on real KVM: a guest writes a logged memslot in passes while the VMM
//! collects the log after each, by `KVM_GET_DIRTY_LOG`, by `KVM_CLEAR_DIRTY_LOG` under manual
//! protect, or from the per-vCPU dirty ring.
//!
//! kvm-ioctls 0.25 has `get_dirty_log` (used here); it has no `KVM_CLEAR_DIRTY_LOG`, no
//! `KVM_RESET_DIRTY_RINGS` and no ring mapping, which are raw ioctls and an `mmap` of the vCPU
//! fd at `KVM_DIRTY_LOG_PAGE_OFFSET` pages, as the API document describes them.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use iced_x86::IcedError;
use iced_x86::code_asm::*;
use kvm_bindings::{
    KVM_CAP_DIRTY_LOG_RING, KVM_CAP_DIRTY_LOG_RING_ACQ_REL, KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
    KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE, KVM_DIRTY_LOG_PAGE_OFFSET, KVM_EXIT_DIRTY_RING_FULL,
    KVM_MEM_LOG_DIRTY_PAGES, kvm_clear_dirty_log, kvm_clear_dirty_log__bindgen_ty_1, kvm_dirty_gfn,
    kvm_enable_cap, kvm_userspace_memory_region,
};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use vmm_sys_util::ioctl::{ioctl, ioctl_with_ref};
use vmm_sys_util::{ioctl_io_nr, ioctl_iowr_nr};

use super::KvmError;
use super::guest::layout::{CODE_GPA, DATA_GPA, GuestPage, Layout};
use super::guest::{Cpl, SIGNAL_PORT, Signal, Watchdog};
use super::host::HostInfo;
use super::memory::{Backing, GuestMemory};
use super::stats::{StatsReader, StatsSnapshot, named_deltas};
use super::vm::{Vm, ns_since};
use crate::backend::dirty::{DirtyPass, DirtyPlan, DirtyResult, LogMode, ring_refusal};

ioctl_iowr_nr!(KVM_CLEAR_DIRTY_LOG, 0xAE, 0xc0, kvm_clear_dirty_log);
ioctl_io_nr!(KVM_RESET_DIRTY_RINGS, 0xAE, 0xc7);

/// The logged data region's memslot (slot 0 is the system memory).
const DATA_SLOT: u32 = 1;
/// `KVM_DIRTY_GFN_F_DIRTY`: KVM published the entry.
const GFN_DIRTY: u32 = 1;
/// `KVM_DIRTY_GFN_F_RESET`: the VMM harvested it; KVM may reset it.
const GFN_RESET: u32 = 2;

/// What this host's KVM offers for dirty logging, read before any VM is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirtyCaps {
    /// `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`: the flags it accepts (0: absent).
    pub manual_protect: i32,
    /// `KVM_CAP_DIRTY_LOG_RING`: the largest ring in bytes (0: absent).
    pub ring_max_bytes: i32,
    /// `KVM_CAP_DIRTY_LOG_RING_ACQ_REL`: the same for the ordered ring (0: absent).
    pub ring_acq_rel_max_bytes: i32,
}

impl DirtyCaps {
    /// Reads the capabilities from /dev/kvm.
    pub fn probe(kvm: &Kvm) -> DirtyCaps {
        let raw = |cap: u32| kvm.check_extension_raw(libc::c_ulong::from(cap)).max(0);
        DirtyCaps {
            manual_protect: raw(KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2),
            ring_max_bytes: raw(KVM_CAP_DIRTY_LOG_RING),
            ring_acq_rel_max_bytes: raw(KVM_CAP_DIRTY_LOG_RING_ACQ_REL),
        }
    }

    /// The ring capability to enable (the plain one where offered, as on x86) and its limit.
    fn ring(self) -> (u32, i32) {
        if self.ring_max_bytes > 0 {
            (KVM_CAP_DIRTY_LOG_RING, self.ring_max_bytes)
        } else {
            (KVM_CAP_DIRTY_LOG_RING_ACQ_REL, self.ring_acq_rel_max_bytes)
        }
    }

    /// Refuses a plan this host cannot run, naming the capability and the host's limit.
    pub fn admit(self, mode: LogMode) -> Result<(), KvmError> {
        match mode {
            LogMode::Bitmap => Ok(()),
            LogMode::Clear { .. } if self.manual_protect & 1 == 0 => {
                Err(KvmError::MissingCap("KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2"))
            }
            LogMode::Clear { .. } => Ok(()),
            LogMode::Ring { entries } => match ring_refusal(entries, i64::from(self.ring().1)) {
                Some(why) => Err(KvmError::Unsupported(why)),
                None => Ok(()),
            },
        }
    }
}

/// The guest: forever, signal `Start`, write the first byte of every `stride`-th page of the
/// data region, signal `End`. The VMM collects the log between `End` and the next `Start`.
/// No stack, no other memory: the only guest writes in a pass are the ones counted.
pub fn dirty_loop(written: u64, stride: u64) -> Result<Vec<u8>, KvmError> {
    let build = || -> Result<Vec<u8>, IcedError> {
        let mut a = CodeAssembler::new(64)?;
        let mut pass = a.create_label();
        a.set_label(&mut pass)?;
        a.mov(dx, u32::from(SIGNAL_PORT))?;
        a.mov(al, u32::from(Signal::Start.al()))?;
        a.out(dx, al)?;
        a.mov(rbx, DATA_GPA)?;
        a.mov(rcx, written)?;
        a.mov(r8, stride * 4096)?;
        let mut next = a.create_label();
        a.set_label(&mut next)?;
        a.mov(byte_ptr(rbx), 1u32)?;
        a.add(rbx, r8)?;
        a.dec(rcx)?;
        a.jnz(next)?;
        a.mov(dx, u32::from(SIGNAL_PORT))?;
        a.mov(al, u32::from(Signal::End.al()))?;
        a.out(dx, al)?;
        a.jmp(pass)?;
        a.assemble(CODE_GPA)
    };
    build().map_err(|e| KvmError::Assemble(e.to_string()))
}

/// A vCPU's dirty ring, mapped from its fd; unmapped on drop.
struct Ring {
    base: std::ptr::NonNull<kvm_dirty_gfn>,
    entries: u64,
    bytes: usize,
    /// The next entry to harvest (free-running, as KVM's indices are).
    next: u64,
}

impl Ring {
    fn map(vcpu: &VcpuFd, entries: u64) -> Result<Ring, KvmError> {
        let bytes = usize::try_from(entries * crate::backend::dirty::RING_ENTRY_BYTES)
            .map_err(|_| KvmError::Layout("dirty ring larger than the address space".into()))?;
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096);
        let offset = libc::off_t::from(KVM_DIRTY_LOG_PAGE_OFFSET) * page;
        // SAFETY: a fresh shared mapping of the vCPU fd's ring pages at an address of the
        // kernel's choosing aliases nothing of ours; the result is checked before use.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(vcpu),
                offset,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(KvmError::Host {
                what: "mmap of the vCPU's dirty ring".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        let base = std::ptr::NonNull::new(addr.cast::<kvm_dirty_gfn>())
            .ok_or_else(|| KvmError::Internal("mmap of the dirty ring returned NULL".into()))?;
        Ok(Ring {
            base,
            entries,
            bytes,
            next: 0,
        })
    }

    /// Reads every published entry in order, records the data slot's pages in `seen`, and
    /// marks each harvested (the VMM's half of the protocol in api.rst, "dirty ring").
    fn harvest(&mut self, seen: &mut [bool]) -> u64 {
        let mut n = 0;
        loop {
            let index = usize::try_from(self.next & (self.entries - 1)).unwrap_or(0);
            // SAFETY: index < entries, inside the mapping; the entry stays mapped while `self`
            // lives. Flags are read and written atomically, as KVM writes them concurrently.
            let entry = unsafe { self.base.as_ptr().add(index) };
            // SAFETY: `flags` is the first u32 of an entry in the shared mapping, 4-aligned.
            let flags = unsafe { AtomicU32::from_ptr(std::ptr::addr_of_mut!((*entry).flags)) };
            if flags.load(Ordering::Acquire) & GFN_DIRTY == 0 {
                return n;
            }
            // SAFETY: KVM published this entry (DIRTY, read with acquire) and does not touch it
            // until we set RESET.
            let (slot, offset) = unsafe { ((*entry).slot, (*entry).offset) };
            if slot == DATA_SLOT
                && let Some(page) = usize::try_from(offset).ok().and_then(|o| seen.get_mut(o))
            {
                *page = true;
            }
            flags.store(GFN_RESET, Ordering::Release);
            self.next += 1;
            n += 1;
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping `map` made.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.bytes);
        }
    }
}

fn enable_cap(vm: &VmFd, cap: u32, arg: u64, name: &'static str) -> Result<(), KvmError> {
    let mut c = kvm_enable_cap {
        cap,
        ..Default::default()
    };
    c.args[0] = arg;
    vm.enable_cap(&c).map_err(crate::ioctl_error(name))
}

/// `KVM_CLEAR_DIRTY_LOG` over the slot in chunks of `chunk` pages, each with the part of
/// `bitmap` it covers; returns the number of calls.
fn clear_chunks(vm: &VmFd, bitmap: &mut [u64], pages: u64, chunk: u64) -> Result<u64, KvmError> {
    let mut calls = 0;
    let mut first = 0u64;
    while first < pages {
        let num = chunk.min(pages - first);
        let word = usize::try_from(first / 64)
            .map_err(|_| KvmError::Layout("bitmap index overflow".into()))?;
        let words = bitmap
            .get_mut(word..)
            .ok_or_else(|| KvmError::Internal("clear chunk beyond the bitmap".into()))?;
        let arg = kvm_clear_dirty_log {
            slot: DATA_SLOT,
            num_pages: u32::try_from(num)
                .map_err(|_| KvmError::Layout("clear chunk above 2^32 pages".into()))?,
            first_page: first,
            __bindgen_anon_1: kvm_clear_dirty_log__bindgen_ty_1 {
                dirty_bitmap: words.as_mut_ptr().cast(),
            },
        };
        // SAFETY: `vm` is a live VM fd; the bitmap pointer covers `num` bits from `first`
        // (the slice runs to the slot's end), and KVM only reads it.
        let rc = unsafe { ioctl_with_ref(vm, KVM_CLEAR_DIRTY_LOG(), &arg) };
        if rc < 0 {
            return Err(KvmError::Ioctl {
                op: "KVM_CLEAR_DIRTY_LOG",
                source: std::io::Error::last_os_error(),
            });
        }
        calls += 1;
        first += num;
    }
    Ok(calls)
}

/// A VM fd by number, for `KVM_RESET_DIRTY_RINGS` while the vCPU (another field of the same
/// [`Vm`]) is borrowed to run.
struct VmRaw(std::os::fd::RawFd);

impl std::os::fd::AsRawFd for VmRaw {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0
    }
}

fn reset_rings(vm: &impl std::os::fd::AsRawFd) -> Result<(), KvmError> {
    // SAFETY: `vm` is a live VM fd; the ioctl takes no argument.
    let rc = unsafe { ioctl(vm, KVM_RESET_DIRTY_RINGS()) };
    if rc < 0 {
        return Err(KvmError::Ioctl {
            op: "KVM_RESET_DIRTY_RINGS",
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

fn popcount(bitmap: &[u64]) -> u64 {
    bitmap.iter().map(|w| u64::from(w.count_ones())).sum()
}

/// Collects the log of the pass just ended into `pass` (timed), re-protecting what it found.
fn collect(
    vm: &VmFd,
    plan: &DirtyPlan,
    ring: Option<&mut Ring>,
    seen: &mut [bool],
    pass: &mut DirtyPass,
) -> Result<(), KvmError> {
    let pages = plan.pages();
    let size = usize::try_from(plan.size_bytes)
        .map_err(|_| KvmError::Layout("region larger than the address space".into()))?;
    match (plan.mode, ring) {
        (LogMode::Bitmap, _) => {
            let t = Instant::now();
            let bitmap = vm
                .get_dirty_log(DATA_SLOT, size)
                .map_err(crate::ioctl_error("KVM_GET_DIRTY_LOG"))?;
            pass.get_ns += ns_since(t, Instant::now());
            pass.ioctls += 1;
            pass.found = popcount(&bitmap);
        }
        (LogMode::Clear { chunk_pages }, _) => {
            let t = Instant::now();
            let mut bitmap = vm
                .get_dirty_log(DATA_SLOT, size)
                .map_err(crate::ioctl_error("KVM_GET_DIRTY_LOG"))?;
            let t1 = Instant::now();
            let calls = clear_chunks(vm, &mut bitmap, pages, chunk_pages)?;
            pass.get_ns += ns_since(t, t1);
            pass.clear_ns += ns_since(t1, Instant::now());
            pass.ioctls += 1 + calls;
            pass.found = popcount(&bitmap);
        }
        (LogMode::Ring { .. }, Some(ring)) => {
            harvest_and_reset(vm, ring, seen, pass)?;
            pass.found = seen.iter().filter(|s| **s).count() as u64;
            seen.fill(false);
        }
        (LogMode::Ring { .. }, None) => {
            return Err(KvmError::Internal("ring mode without a mapped ring".into()));
        }
    }
    Ok(())
}

fn harvest_and_reset(
    vm: &impl std::os::fd::AsRawFd,
    ring: &mut Ring,
    seen: &mut [bool],
    pass: &mut DirtyPass,
) -> Result<(), KvmError> {
    let t = Instant::now();
    ring.harvest(seen);
    let t1 = Instant::now();
    reset_rings(vm)?;
    pass.harvest_ns += ns_since(t, t1);
    pass.reset_ns += ns_since(t1, Instant::now());
    pass.ioctls += 1;
    Ok(())
}

struct Stats {
    vcpu: Option<StatsReader>,
    vm: Option<StatsReader>,
}

type Snap = (Option<StatsSnapshot>, Option<StatsSnapshot>);

impl Stats {
    fn snapshot(&self) -> Result<Snap, KvmError> {
        Ok((
            self.vcpu.as_ref().map(StatsReader::snapshot).transpose()?,
            self.vm.as_ref().map(StatsReader::snapshot).transpose()?,
        ))
    }

    fn deltas(&self, before: Snap, after: Snap) -> Vec<(String, String, i128)> {
        let mut out = Vec::new();
        for (reader, b, a, prefix) in [
            (&self.vcpu, before.0, after.0, "kvm.vcpu"),
            (&self.vm, before.1, after.1, "kvm.vm"),
        ] {
            if let (Some(r), Some(b), Some(a)) = (reader, b, a) {
                out.extend(named_deltas(r.layout(), &b, &a, prefix));
            }
        }
        out
    }
}

/// Runs the guest through one pass: from its `Start` to its `End`, harvesting the ring
/// whenever KVM stops the vCPU with `KVM_EXIT_DIRTY_RING_FULL` (that time counts as
/// collection, not as dirtying).
fn run_pass(
    vm: &VmRaw,
    vcpu: &mut VcpuFd,
    plan: &DirtyPlan,
    stats: &Stats,
    mut ring: Option<&mut Ring>,
    seen: &mut [bool],
) -> Result<DirtyPass, KvmError> {
    let watchdog = Watchdog::arm(plan.timeout)?;
    let mut pass = DirtyPass {
        written: plan.written_per_pass(),
        ..DirtyPass::default()
    };
    let mut start: Option<(Instant, Snap)> = None;
    let mut paused_ns = 0u64;
    loop {
        let exit = match vcpu.run() {
            Ok(VcpuExit::IoOut(port, data)) if port == SIGNAL_PORT => {
                Ok(Signal::from_al(data.first().copied().unwrap_or(0)))
            }
            Ok(VcpuExit::Unsupported(KVM_EXIT_DIRTY_RING_FULL)) => Err(None),
            Ok(other) => Err(Some(format!("unexpected exit {other:?}"))),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Err(Some(format!(
                "the pass did not end within {:?}: the watchdog interrupted KVM_RUN",
                plan.timeout
            ))),
            Err(e) => Err(Some(format!("KVM_RUN failed: {e}"))),
        };
        let at = Instant::now();
        match exit {
            Ok(Signal::Start) => start = Some((at, stats.snapshot()?)),
            Ok(Signal::End) => {
                let (t0, before) = start.take().ok_or_else(|| {
                    KvmError::Guest("the guest signalled End before Start".into())
                })?;
                let after = stats.snapshot()?;
                pass.dirty_ns = ns_since(t0, at).saturating_sub(paused_ns);
                pass.kvm_stats = stats.deltas(before, after);
                pass.wp_faults = pass
                    .kvm_stats
                    .iter()
                    .find(|(n, _, _)| n == "kvm.vcpu.pf_taken")
                    .map(|(_, _, d)| u64::try_from(*d).unwrap_or(0));
                break;
            }
            Ok(other) => {
                return Err(KvmError::Guest(format!("unexpected signal {other:?}")));
            }
            Err(None) => {
                let r = ring.as_deref_mut().ok_or_else(|| {
                    KvmError::Guest("KVM_EXIT_DIRTY_RING_FULL without a ring".into())
                })?;
                let t = Instant::now();
                harvest_and_reset(vm, r, seen, &mut pass)?;
                paused_ns += ns_since(t, Instant::now());
                pass.ring_full_exits += 1;
            }
            Err(Some(why)) => {
                return Err(KvmError::Guest(format!(
                    "{why}; {}",
                    super::guest::runner::describe(vcpu)
                )));
            }
        }
    }
    drop(watchdog);
    Ok(pass)
}

/// Runs the plan in a fresh VM: one unmeasured pass that maps every page (its log collected
/// and discarded), then `plan.passes` measured ones.
pub fn dirty_log(kvm: &Kvm, host: &HostInfo, plan: &DirtyPlan) -> Result<DirtyResult, KvmError> {
    // Refused before any VM is built, naming the capability and this host's limit.
    let caps = DirtyCaps::probe(kvm);
    caps.admit(plan.mode)?;
    let written = plan.written_per_pass();
    let layout = Layout::new(plan.size_bytes, GuestPage::Huge, 0)?;
    let code = dirty_loop(written, u64::from(plan.stride.max(1)))?;
    let system_len = usize::try_from(layout.system_bytes)
        .map_err(|_| KvmError::Layout("system memory larger than the address space".into()))?;
    let mut system = GuestMemory::backed(system_len, Backing::Populated)?;
    layout.write_system(&mut system, &code)?;
    let size = usize::try_from(plan.size_bytes)
        .map_err(|_| KvmError::Layout("region larger than the address space".into()))?;
    // Declared before the VM so it is unmapped after the VM (and its memslot) is gone.
    let data = GuestMemory::backed(size, Backing::Populated)?;
    let mut vm = Vm::create(kvm)?;
    match plan.mode {
        LogMode::Bitmap => {}
        LogMode::Clear { .. } => enable_cap(
            vm.fd(),
            KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
            u64::from(KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE),
            "KVM_ENABLE_CAP(KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2)",
        )?,
        // Before any vCPU exists: KVM sizes each vCPU's ring at creation.
        LogMode::Ring { entries } => enable_cap(
            vm.fd(),
            caps.ring().0,
            entries * crate::backend::dirty::RING_ENTRY_BYTES,
            "KVM_ENABLE_CAP(KVM_CAP_DIRTY_LOG_RING)",
        )?,
    }
    vm.add_memslot(0, system)?;
    let region = kvm_userspace_memory_region {
        slot: DATA_SLOT,
        guest_phys_addr: DATA_GPA,
        memory_size: plan.size_bytes,
        userspace_addr: data.host_addr(),
        flags: KVM_MEM_LOG_DIRTY_PAGES,
    };
    // SAFETY: the region describes `data`, a live mapping that outlives the VM (declared
    // before it, so dropped after it).
    unsafe { vm.fd().set_user_memory_region(region) }
        .map_err(crate::ioctl_error("KVM_SET_USER_MEMORY_REGION"))?;
    vm.create_vcpu()?;
    let cpl = plan.cpl.unwrap_or(Cpl::default_for(host.kvm_flavour));
    vm.setup_long_mode(0, cpl)?;
    let vcpu_stats = vm.vcpu(0).and_then(|v| StatsReader::open(v).ok());
    let stats = Stats {
        vcpu: vcpu_stats,
        vm: StatsReader::open(vm.fd()).ok(),
    };
    let mut ring = match plan.mode {
        LogMode::Ring { entries } => {
            let vcpu = vm
                .vcpu(0)
                .ok_or_else(|| KvmError::Internal("no vCPU 0".into()))?;
            Some(Ring::map(vcpu, entries)?)
        }
        _ => None,
    };
    let mut seen = vec![
        false;
        usize::try_from(plan.pages())
            .map_err(|_| KvmError::Layout("too many pages".into()))?
    ];
    // The fd stays open as long as `vm`, which outlives this loop.
    let vm_raw = VmRaw(std::os::fd::AsRawFd::as_raw_fd(vm.fd()));
    let mut passes = Vec::with_capacity(plan.passes as usize);
    for index in 0..=plan.passes {
        let vcpu = vm
            .vcpu_mut(0)
            .ok_or_else(|| KvmError::Internal("no vCPU 0".into()))?;
        let mut pass = run_pass(&vm_raw, vcpu, plan, &stats, ring.as_mut(), &mut seen)?;
        collect(vm.fd(), plan, ring.as_mut(), &mut seen, &mut pass)?;
        if index > 0 {
            passes.push(pass);
        }
    }
    drop(ring);
    Ok(DirtyResult { passes })
}
