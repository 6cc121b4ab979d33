//! The `dirty` scenario on real KVM: a guest writes a logged memslot in passes while the VMM
//! collects the log after each, by `KVM_GET_DIRTY_LOG`, by `KVM_CLEAR_DIRTY_LOG` under manual
//! protect, or from the per-vCPU dirty ring.
//!
//! kvm-ioctls 0.25 has `get_dirty_log` (used here); it has no `KVM_CLEAR_DIRTY_LOG`, no
//! `KVM_RESET_DIRTY_RINGS` and no ring mapping, which are raw ioctls and an `mmap` of the vCPU
//! fd at `KVM_DIRTY_LOG_PAGE_OFFSET` pages, as the API document describes them.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

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
use super::guest_memory::{Backing, GuestMemory};
use super::host::HostInfo;
use super::hugetlb::PoolGuard;
use super::stats::{StatsReader, StatsSnapshot, named_deltas};
use super::vm::{Vm, ns_since};
use hvlab_core::dirty::{DirtyBacking, DirtyPass, DirtyPlan, DirtyResult, LogMode, ring_refusal};

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
                Some(why) => Err(KvmError::Lacks(why)),
                None => Ok(()),
            },
        }
    }
}

/// The guest: forever, signal `Start`, write the first byte of every `stride`-th page of the
/// data region, signal `End`. The VMM collects the log between `End` and the next `Start`.
/// No stack, no other memory: the only guest writes in a pass are the ones counted.
pub fn dirty_loop(written: u64, stride: u64) -> Result<Vec<u8>, KvmError> {
    pass_loop(stride, |a| {
        a.mov(rbx, DATA_GPA)?;
        a.mov(rcx, written)
    })
}

/// [`dirty_loop`] for one of several vCPUs: the slice's first page comes in `rsi` (a GPA)
/// and its write count in `r13`, set by the VMM before the first run; the inner loop is the
/// same four instructions.
pub fn dirty_slice_loop(stride: u64) -> Result<Vec<u8>, KvmError> {
    pass_loop(stride, |a| {
        a.mov(rbx, rsi)?;
        a.mov(rcx, r13)
    })
}

/// The pass both loops make: signal `Start`, load the first page into `rbx` and the count
/// into `rcx` (`load`), write one byte every `stride` pages, signal `End`, again.
fn pass_loop(
    stride: u64,
    load: impl Fn(&mut CodeAssembler) -> Result<(), IcedError>,
) -> Result<Vec<u8>, KvmError> {
    let build = || -> Result<Vec<u8>, IcedError> {
        let mut a = CodeAssembler::new(64)?;
        let mut pass = a.create_label();
        a.set_label(&mut pass)?;
        a.mov(dx, u32::from(SIGNAL_PORT))?;
        a.mov(al, u32::from(Signal::Start.al()))?;
        a.out(dx, al)?;
        load(&mut a)?;
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

// SAFETY: the ring is a shared mapping owned by this value; another thread only reaches it
// through the `Mutex` that holds it, and KVM's concurrent writes are to the entries' flags,
// which are accessed atomically.
unsafe impl Send for Ring {}

impl Ring {
    fn map(vcpu: &VcpuFd, entries: u64) -> Result<Ring, KvmError> {
        let bytes = usize::try_from(entries * hvlab_core::dirty::RING_ENTRY_BYTES)
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
    fn harvest(&mut self, seen: &[AtomicBool]) -> u64 {
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
                && let Some(page) = usize::try_from(offset).ok().and_then(|o| seen.get(o))
            {
                page.store(true, Ordering::Relaxed);
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
#[derive(Debug, Clone, Copy)]
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
/// In ring mode every vCPU's ring is harvested, then one `KVM_RESET_DIRTY_RINGS` resets them
/// all.
fn collect(
    vm: &VmFd,
    plan: &DirtyPlan,
    rings: &[Mutex<Ring>],
    seen: &[AtomicBool],
    pass: &mut DirtyPass,
) -> Result<(), KvmError> {
    let pages = plan.pages();
    let size = usize::try_from(plan.size_bytes)
        .map_err(|_| KvmError::Layout("region larger than the address space".into()))?;
    match plan.mode {
        LogMode::Bitmap => {
            let t = Instant::now();
            let bitmap = vm
                .get_dirty_log(DATA_SLOT, size)
                .map_err(crate::ioctl_error("KVM_GET_DIRTY_LOG"))?;
            pass.get_ns += ns_since(t, Instant::now());
            pass.ioctls += 1;
            pass.found = popcount(&bitmap);
        }
        LogMode::Clear { chunk_pages } => {
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
        LogMode::Ring { .. } if rings.is_empty() => {
            return Err(KvmError::Internal("ring mode without a mapped ring".into()));
        }
        LogMode::Ring { .. } => {
            let mut held = rings
                .iter()
                .map(|r| r.lock().map_err(|_| poisoned()))
                .collect::<Result<Vec<_>, _>>()?;
            let t = Instant::now();
            for ring in &mut held {
                ring.harvest(seen);
            }
            let t1 = Instant::now();
            reset_rings(vm)?;
            pass.harvest_ns += ns_since(t, t1);
            pass.reset_ns += ns_since(t1, Instant::now());
            pass.ioctls += 1;
            pass.found = seen.iter().filter(|s| s.load(Ordering::Relaxed)).count() as u64;
            for s in seen {
                s.store(false, Ordering::Relaxed);
            }
        }
    }
    Ok(())
}

fn poisoned() -> KvmError {
    KvmError::Internal("a vCPU thread panicked holding a dirty ring".into())
}

fn harvest_and_reset(
    vm: &impl std::os::fd::AsRawFd,
    ring: &mut Ring,
    seen: &[AtomicBool],
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

/// One vCPU's pass: its record, when its measured section began and ended, and how long
/// it stood in ring-full stops.
struct VcpuPass {
    pass: DirtyPass,
    start: Instant,
    end: Instant,
    paused_ns: u64,
}

/// Runs the guest through one pass: from its `Start` to its `End`, harvesting the ring
/// whenever KVM stops the vCPU with `KVM_EXIT_DIRTY_RING_FULL` (that time counts as
/// collection, not as dirtying). `at_start` runs at `Start`, before the clock starts (the
/// rendezvous of several vCPUs).
fn run_pass(
    vm: VmRaw,
    vcpu: &mut VcpuFd,
    plan: &DirtyPlan,
    stats: &Stats,
    ring: Option<&Mutex<Ring>>,
    seen: &[AtomicBool],
    at_start: &mut dyn FnMut() -> Result<(), KvmError>,
) -> Result<VcpuPass, KvmError> {
    let watchdog = Watchdog::arm(plan.timeout)?;
    let mut pass = DirtyPass {
        written: plan.written_per_vcpu(),
        ..DirtyPass::default()
    };
    let mut start: Option<(Instant, Snap)> = None;
    let mut paused_ns = 0u64;
    let out = loop {
        let ran = vcpu.run();
        // An interruption before the deadline is not the watchdog's: re-enter.
        if ran
            .as_ref()
            .is_err_and(|e| matches!(e.errno(), libc::EINTR | libc::EAGAIN) && !watchdog.expired())
        {
            continue;
        }
        let exit = match ran {
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
            Ok(Signal::Start) => {
                at_start()?;
                start = Some((Instant::now(), stats.snapshot()?));
            }
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
                break VcpuPass {
                    pass,
                    start: t0,
                    end: at,
                    paused_ns,
                };
            }
            Ok(other) => {
                return Err(KvmError::Guest(format!("unexpected signal {other:?}")));
            }
            Err(None) => {
                let r = ring.ok_or_else(|| {
                    KvmError::Guest("KVM_EXIT_DIRTY_RING_FULL without a ring".into())
                })?;
                let t = Instant::now();
                let mut r = r.lock().map_err(|_| poisoned())?;
                harvest_and_reset(&vm, &mut r, seen, &mut pass)?;
                drop(r);
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
    };
    drop(watchdog);
    Ok(out)
}

/// The logged region's host memory, populated, and the hugetlb pool it draws from (set back
/// when dropped, after the VM).
fn data_memory(plan: &DirtyPlan) -> Result<(GuestMemory, Option<PoolGuard>), KvmError> {
    let size = usize::try_from(plan.size_bytes)
        .map_err(|_| KvmError::Layout("region larger than the address space".into()))?;
    Ok(match plan.backing {
        DirtyBacking::Anonymous => (GuestMemory::backed(size, Backing::Populated)?, None),
        DirtyBacking::Shmem => {
            let mem = GuestMemory::memfd(size, None)?;
            mem.populate()?;
            (mem, None)
        }
        DirtyBacking::Hugetlb(huge) => {
            let pool = PoolGuard::reserve(huge, plan.size_bytes)?;
            let mem = GuestMemory::memfd(size, Some(huge))?;
            mem.populate()?;
            (mem, Some(pool))
        }
        DirtyBacking::GuestMemfd => {
            return Err(KvmError::Lacks(
                DirtyBacking::GuestMemfd
                    .refusal()
                    .unwrap_or("guest_memfd cannot be dirty-logged")
                    .into(),
            ));
        }
    })
}

/// What the VMM learned from a pass: the passes of every vCPU merged. Counts and statistics
/// add up; the pass lasts from the earliest start to the last end, each vCPU's time from
/// that common start to its own end less its own ring-full stops.
fn merge(parts: Vec<VcpuPass>) -> Result<DirtyPass, KvmError> {
    let start = parts
        .iter()
        .map(|p| p.start)
        .min()
        .ok_or_else(|| KvmError::Internal("no vCPU ran the pass".into()))?;
    let mut out = DirtyPass::default();
    let mut wp = Some(0u64);
    for p in parts {
        let ns = ns_since(start, p.end).saturating_sub(p.paused_ns);
        out.vcpu_ns.push(ns);
        out.dirty_ns = out.dirty_ns.max(ns);
        out.written += p.pass.written;
        out.harvest_ns += p.pass.harvest_ns;
        out.reset_ns += p.pass.reset_ns;
        out.ioctls += p.pass.ioctls;
        out.ring_full_exits += p.pass.ring_full_exits;
        wp = wp.zip(p.pass.wp_faults).map(|(a, b)| a + b);
        for (name, unit, delta) in p.pass.kvm_stats {
            match out.kvm_stats.iter_mut().find(|(n, _, _)| *n == name) {
                Some(entry) => entry.2 += delta,
                None => out.kvm_stats.push((name, unit, delta)),
            }
        }
    }
    out.wp_faults = wp;
    Ok(out)
}

/// A meeting point of the vCPU threads and the VMM's collector, once per phase of a pass.
/// A failed party breaks it (so nobody waits for a thread that will never come) and a
/// deadline bounds each wait.
struct Rendezvous {
    n: usize,
    state: Mutex<Meet>,
    cv: Condvar,
    timeout: Duration,
}

#[derive(Default)]
struct Meet {
    arrived: usize,
    generation: u64,
    failed: bool,
}

impl Rendezvous {
    fn new(n: usize, timeout: Duration) -> Rendezvous {
        Rendezvous {
            n,
            state: Mutex::new(Meet::default()),
            cv: Condvar::new(),
            timeout,
        }
    }

    fn broken() -> KvmError {
        KvmError::Guest("another vCPU thread failed, or the collector did".into())
    }

    fn wait(&self) -> Result<(), KvmError> {
        let mut s = self.state.lock().map_err(|_| Rendezvous::broken())?;
        if s.failed {
            return Err(Rendezvous::broken());
        }
        let generation = s.generation;
        s.arrived += 1;
        if s.arrived == self.n {
            s.arrived = 0;
            s.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout;
        while s.generation == generation && !s.failed {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                s.failed = true;
                self.cv.notify_all();
                return Err(KvmError::Guest(format!(
                    "the vCPUs did not all reach the end of a pass within {:?}",
                    self.timeout
                )));
            }
            s = self
                .cv
                .wait_timeout(s, left)
                .map_err(|_| Rendezvous::broken())?
                .0;
        }
        if s.generation == generation {
            return Err(Rendezvous::broken());
        }
        Ok(())
    }

    fn fail(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.failed = true;
        }
        self.cv.notify_all();
    }
}

/// `plan.vcpus` vCPUs, each on its own thread, through every pass (memstress's shape,
/// tools/testing/selftests/kvm/lib/memstress.c): all meet at `Start`, write their slices at
/// once, and meet again at `End`; then this thread collects the log while they wait, and
/// the next pass begins. Returns the passes, the first (unmeasured) one included.
fn run_parallel(
    kvm: &Kvm,
    vm: &mut Vm,
    vm_raw: VmRaw,
    plan: &DirtyPlan,
    rings: &[Mutex<Ring>],
    seen: &[AtomicBool],
) -> Result<Vec<DirtyPass>, KvmError> {
    let vm_stats = StatsReader::open(vm.fd()).ok();
    // The collector's own handle on the VM: the VM's is borrowed with the vCPUs lent to
    // their threads.
    // SAFETY: dup() of a valid open fd; the VmFd built from it closes the copy.
    let dup = unsafe { libc::dup(vm_raw.0) };
    if dup < 0 {
        return Err(KvmError::Host {
            what: "duplicating the VM fd for the log collector".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    // SAFETY: `dup` is a VM fd this function just created and hands over.
    let collector = unsafe { kvm.create_vmfd_from_rawfd(dup) }
        .map_err(crate::ioctl_error("KVM_CREATE_VM (dup)"))?;
    let n = vm.vcpus_mut().len();
    let meet = Rendezvous::new(n + 1, plan.timeout);
    let slots: Vec<Mutex<Option<VcpuPass>>> = (0..n).map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        let handles: Vec<_> = vm
            .vcpus_mut()
            .iter_mut()
            .enumerate()
            .map(|(i, vcpu)| {
                let (meet, slots) = (&meet, &slots);
                scope.spawn(move || {
                    let out = vcpu_passes(vm_raw, vcpu, plan, rings.get(i), seen, meet, &slots[i]);
                    if out.is_err() {
                        meet.fail();
                    }
                    out
                })
            })
            .collect();
        let collected = collect_passes(
            &collector,
            vm_stats.as_ref(),
            plan,
            rings,
            seen,
            &meet,
            &slots,
        );
        if collected.is_err() {
            meet.fail();
        }
        let mut first_err = None;
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(KvmError::Internal("a vCPU thread panicked".into())));
            if let Err(e) = r {
                // The first real cause, not the rendezvous it broke.
                if first_err.is_none() || !e.to_string().contains("another vCPU thread failed") {
                    first_err.get_or_insert(e);
                }
            }
        }
        match (collected, first_err) {
            (Ok(passes), None) => Ok(passes),
            (_, Some(e)) => Err(e),
            (Err(e), None) => Err(e),
        }
    })
}

/// One vCPU thread: every pass, meeting the others at `Start` (in the pass), after its `End`
/// (its record left in `slot`), and after the collection.
fn vcpu_passes(
    vm: VmRaw,
    vcpu: &mut VcpuFd,
    plan: &DirtyPlan,
    ring: Option<&Mutex<Ring>>,
    seen: &[AtomicBool],
    meet: &Rendezvous,
    slot: &Mutex<Option<VcpuPass>>,
) -> Result<(), KvmError> {
    let stats = Stats {
        vcpu: StatsReader::open(&*vcpu).ok(),
        vm: None,
    };
    for _ in 0..=plan.passes {
        let pass = run_pass(vm, vcpu, plan, &stats, ring, seen, &mut || meet.wait())?;
        *slot.lock().map_err(|_| poisoned())? = Some(pass);
        meet.wait()?;
        meet.wait()?;
    }
    Ok(())
}

/// The collector's side of [`run_parallel`]: each pass, the VM's statistics around it, the
/// vCPUs' records merged, and the log collected while they wait.
fn collect_passes(
    vm: &VmFd,
    vm_stats: Option<&StatsReader>,
    plan: &DirtyPlan,
    rings: &[Mutex<Ring>],
    seen: &[AtomicBool],
    meet: &Rendezvous,
    slots: &[Mutex<Option<VcpuPass>>],
) -> Result<Vec<DirtyPass>, KvmError> {
    let mut passes = Vec::with_capacity(plan.passes as usize + 1);
    for _ in 0..=plan.passes {
        let before = vm_stats.map(StatsReader::snapshot).transpose()?;
        meet.wait()?;
        meet.wait()?;
        let after = vm_stats.map(StatsReader::snapshot).transpose()?;
        let parts = slots
            .iter()
            .map(|s| {
                s.lock()
                    .map_err(|_| poisoned())?
                    .take()
                    .ok_or_else(|| KvmError::Internal("a vCPU left no record of its pass".into()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut pass = merge(parts)?;
        if let (Some(r), Some(b), Some(a)) = (vm_stats, before, after) {
            pass.kvm_stats
                .extend(named_deltas(r.layout(), &b, &a, "kvm.vm"));
        }
        collect(vm, plan, rings, seen, &mut pass)?;
        passes.push(pass);
        meet.wait()?;
    }
    Ok(passes)
}

/// Refuses, before any VM is built, what this host cannot log (naming the capability and
/// its limit); the capabilities it has.
fn admit(kvm: &Kvm, plan: &DirtyPlan) -> Result<DirtyCaps, KvmError> {
    let caps = DirtyCaps::probe(kvm);
    caps.admit(plan.mode)?;
    if let Some(why) = plan.backing.refusal() {
        return Err(KvmError::Lacks(why.into()));
    }
    let max = u32::try_from(kvm.get_max_vcpus()).unwrap_or(u32::MAX);
    if plan.vcpus > max {
        return Err(KvmError::Lacks(format!(
            "{} vCPUs exceed this host's KVM_CAP_MAX_VCPUS, {max}",
            plan.vcpus
        )));
    }
    Ok(caps)
}

/// The plan's vCPUs in long mode at `cpl`; with several, each pointed at its own slice.
fn create_vcpus(vm: &mut Vm, plan: &DirtyPlan, cpl: Cpl) -> Result<(), KvmError> {
    let vcpus = plan.vcpus.max(1);
    for i in 0..vcpus {
        let index = vm.create_vcpu()?;
        vm.setup_long_mode(index, cpl)?;
        if vcpus > 1 {
            let vcpu = vm
                .vcpu_mut(index)
                .ok_or_else(|| KvmError::Internal(format!("no vCPU {index}")))?;
            let mut regs = vcpu
                .get_regs()
                .map_err(crate::ioctl_error("KVM_GET_REGS"))?;
            regs.rsi = DATA_GPA + plan.slice_start(i) * 4096;
            regs.r13 = plan.written_per_vcpu();
            vcpu.set_regs(&regs)
                .map_err(crate::ioctl_error("KVM_SET_REGS"))?;
        }
    }
    Ok(())
}

/// The passes of one vCPU, each followed by its collection on the same thread.
fn run_single(
    vm: &mut Vm,
    vm_raw: VmRaw,
    plan: &DirtyPlan,
    rings: &[Mutex<Ring>],
    seen: &[AtomicBool],
) -> Result<Vec<DirtyPass>, KvmError> {
    let stats = Stats {
        vcpu: vm.vcpu(0).and_then(|v| StatsReader::open(v).ok()),
        vm: StatsReader::open(vm.fd()).ok(),
    };
    let mut passes = Vec::with_capacity(plan.passes as usize + 1);
    for _ in 0..=plan.passes {
        let vcpu = vm
            .vcpu_mut(0)
            .ok_or_else(|| KvmError::Internal("no vCPU 0".into()))?;
        let mut pass = run_pass(vm_raw, vcpu, plan, &stats, rings.first(), seen, &mut || {
            Ok(())
        })?
        .pass;
        collect(vm.fd(), plan, rings, seen, &mut pass)?;
        passes.push(pass);
    }
    Ok(passes)
}

/// Runs the plan in a fresh VM: one unmeasured pass that maps every page (its log collected
/// and discarded), then `plan.passes` measured ones.
pub fn dirty_log(kvm: &Kvm, host: &HostInfo, plan: &DirtyPlan) -> Result<DirtyResult, KvmError> {
    let caps = admit(kvm, plan)?;
    let vcpus = plan.vcpus.max(1);
    let stride = u64::from(plan.stride.max(1));
    let layout = Layout::new(plan.size_bytes, GuestPage::Huge, 0)?;
    let code = if vcpus == 1 {
        dirty_loop(plan.written_per_vcpu(), stride)?
    } else {
        dirty_slice_loop(stride)?
    };
    let system_len = usize::try_from(layout.system_bytes)
        .map_err(|_| KvmError::Layout("system memory larger than the address space".into()))?;
    let mut system = GuestMemory::backed(system_len, Backing::Populated)?;
    layout.write_system(&mut system, &code)?;
    // Declared before the VM so they are unmapped (and the pool set back) after the VM and
    // its memslot are gone.
    let (data, pool) = data_memory(plan)?;
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
            entries * hvlab_core::dirty::RING_ENTRY_BYTES,
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
    create_vcpus(
        &mut vm,
        plan,
        plan.cpl.unwrap_or(Cpl::default_for(host.kvm_flavour)),
    )?;
    let rings = match plan.mode {
        LogMode::Ring { entries } => (0..vcpus as usize)
            .map(|i| {
                let vcpu = vm
                    .vcpu(i)
                    .ok_or_else(|| KvmError::Internal(format!("no vCPU {i}")))?;
                Ring::map(vcpu, entries).map(Mutex::new)
            })
            .collect::<Result<Vec<_>, _>>()?,
        _ => Vec::new(),
    };
    let seen: Vec<AtomicBool> = (0..plan.pages()).map(|_| AtomicBool::new(false)).collect();
    // The fd stays open as long as `vm`, which outlives every pass.
    let vm_raw = VmRaw(std::os::fd::AsRawFd::as_raw_fd(vm.fd()));
    let mut passes = if vcpus == 1 {
        run_single(&mut vm, vm_raw, plan, &rings, &seen)?
    } else {
        run_parallel(kvm, &mut vm, vm_raw, plan, &rings, &seen)?
    };
    drop(rings);
    drop(vm);
    drop(data);
    drop(pool);
    passes.remove(0);
    Ok(DirtyResult { passes })
}
