//! A userfaultfd server: how a VMM restores guest memory lazily (post-copy migration, snapshot
//! restore), with the same prefetch choice KVM faces one level down.
//!
//! The region is registered in missing mode; a thread serves each fault with `UFFDIO_COPY` of
//! the faulting page and, with a window W > 1, of the following not-yet-served pages up to the
//! end of the W-aligned block, so a sequential reader faults once per block. In MINOR mode (a
//! shmem region whose page cache is already full, as after a snapshot restore into a memfd)
//! the fault is for a page present in the file but not yet mapped, and the server maps the
//! same window with `UFFDIO_CONTINUE` instead of copying. On a hugetlb memfd
//! (`UFFD_FEATURE_MINOR_HUGETLBFS`) the unit is the huge page: a fault names one, and
//! `UFFDIO_CONTINUE` maps it whole (its range must be huge-page aligned).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

// The UAPI structs and ioctl numbers come pregenerated from linux-raw-sys, so building hvlab
// needs no bindgen or libclang (a fresh machine has only the toolchain).
use linux_raw_sys::general::{
    UFFD_API, UFFD_EVENT_PAGEFAULT, UFFD_FEATURE_MINOR_HUGETLBFS, UFFD_FEATURE_MINOR_SHMEM,
    UFFDIO_REGISTER_MODE_MINOR, UFFDIO_REGISTER_MODE_MISSING, uffd_msg, uffdio_api,
    uffdio_continue, uffdio_copy, uffdio_range, uffdio_register,
};
use linux_raw_sys::ioctl::{UFFDIO_API, UFFDIO_CONTINUE, UFFDIO_COPY, UFFDIO_REGISTER};
use rustix::mm::UserfaultfdFlags;

use super::KvmError;
use super::guest_memory::GuestMemory;

const PAGE: usize = 4096;

/// How faults are registered and answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Missing pages, `UFFDIO_COPY`.
    Missing,
    /// Pages in a shmem file's cache not yet mapped, `UFFDIO_CONTINUE` 4 KiB at a time.
    MinorShmem,
    /// The same on hugetlbfs, a 2 MiB page at a time.
    MinorHugetlb,
}

impl Mode {
    /// The unit of a fault, bytes.
    fn page(self) -> usize {
        match self {
            Mode::MinorHugetlb => 2 << 20,
            Mode::Missing | Mode::MinorShmem => PAGE,
        }
    }

    /// The userfaultfd feature a minor mode needs, in words.
    fn feature(self) -> &'static str {
        match self {
            Mode::MinorHugetlb => {
                "userfaultfd MINOR mode on hugetlbfs (UFFD_FEATURE_MINOR_HUGETLBFS, Linux 5.13+)"
            }
            _ => "userfaultfd MINOR mode on shmem (UFFD_FEATURE_MINOR_SHMEM, Linux 5.14+)",
        }
    }
}

/// What the server did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UffdStats {
    /// Page-fault events read.
    pub faults: u64,
    /// Pages copied in or mapped: 4 KiB pages, or huge pages on hugetlbfs.
    pub pages_served: u64,
}

/// The pages to copy for a fault on `page`: runs of unserved pages from `page` to the end of
/// its `window`-aligned block, each run as (first page, count).
pub fn serve_plan(served: &[bool], page: usize, window: usize) -> Vec<(usize, usize)> {
    let window = window.max(1);
    let block_end = ((page / window + 1) * window).min(served.len());
    let mut runs = Vec::new();
    let mut p = page;
    while p < block_end {
        if served[p] {
            p += 1;
            continue;
        }
        let start = p;
        while p < block_end && !served[p] {
            p += 1;
        }
        runs.push((start, p - start));
    }
    runs
}

/// A running server for one region.
#[derive(Debug)]
pub struct UffdServer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<UffdStats, String>>>,
}

impl UffdServer {
    /// Registers `region` with a new userfaultfd and starts serving it with `window` pages per
    /// fault. The region must not have been touched yet.
    pub fn start(region: &GuestMemory, window: usize) -> Result<UffdServer, KvmError> {
        UffdServer::start_mode(region, window, false)
    }

    /// [`UffdServer::start`] in MINOR mode (`minor`) for a shmem region whose file holds
    /// every page: faults are answered with `UFFDIO_CONTINUE`.
    pub fn start_mode(
        region: &GuestMemory,
        window: usize,
        minor: bool,
    ) -> Result<UffdServer, KvmError> {
        let mode = if minor {
            Mode::MinorShmem
        } else {
            Mode::Missing
        };
        UffdServer::start_with(region, window, mode)
    }

    /// MINOR mode on a hugetlb memfd of 2 MiB pages whose file holds every page: each fault
    /// is answered with one `UFFDIO_CONTINUE` of its huge page.
    pub fn start_minor_hugetlb(region: &GuestMemory) -> Result<UffdServer, KvmError> {
        UffdServer::start_with(region, 1, Mode::MinorHugetlb)
    }

    fn start_with(region: &GuestMemory, window: usize, mode: Mode) -> Result<UffdServer, KvmError> {
        let minor = mode != Mode::Missing;
        // Not user-mode-only: the faults come from KVM's get_user_pages in the kernel.
        // SAFETY: the call has no memory effects; the fd only ever serves `region`.
        let uffd = unsafe { rustix::mm::userfaultfd(UserfaultfdFlags::CLOEXEC | UserfaultfdFlags::NONBLOCK) }
            .map_err(|e| {
                KvmError::Host {
                    what: "cannot create a userfaultfd that handles kernel faults (it needs root, CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1)".into(),
                    source: e.into(),
                }
            })?;
        let mut api = uffdio_api {
            api: u64::from(UFFD_API),
            features: u64::from(match mode {
                Mode::Missing => 0,
                Mode::MinorShmem => UFFD_FEATURE_MINOR_SHMEM,
                Mode::MinorHugetlb => UFFD_FEATURE_MINOR_HUGETLBFS,
            }),
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API takes a pointer to a uffdio_api that lives across the call.
        uffd_ioctl(&uffd, UFFDIO_API, (&raw mut api).cast()).map_err(|source| {
            if minor {
                KvmError::Lacks(format!(
                    "{}: the UFFDIO_API handshake refused it: {source}",
                    mode.feature()
                ))
            } else {
                KvmError::Host {
                    what: "the UFFDIO_API handshake".into(),
                    source,
                }
            }
        })?;
        let base = region.as_ptr() as usize;
        let len = region.len();
        let mut register = uffdio_register {
            range: uffdio_range {
                start: base as u64,
                len: len as u64,
            },
            mode: u64::from(if minor {
                UFFDIO_REGISTER_MODE_MINOR
            } else {
                UFFDIO_REGISTER_MODE_MISSING
            }),
            ioctls: 0,
        };
        uffd_ioctl(&uffd, UFFDIO_REGISTER, (&raw mut register).cast()).map_err(|e| {
            KvmError::Host {
                what: format!("registering {len} bytes with userfaultfd"),
                source: e,
            }
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("hvlab-uffd".into())
                .spawn(move || serve(&uffd, base, len, window, mode, &stop))
                .map_err(|source| KvmError::Host {
                    what: "starting the userfaultfd thread".into(),
                    source,
                })?
        };
        Ok(UffdServer {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the server and returns what it did.
    pub fn finish(mut self) -> Result<UffdStats, KvmError> {
        self.stop.store(true, Ordering::Release);
        let thread = self
            .thread
            .take()
            .ok_or_else(|| KvmError::Internal("uffd server already finished".into()))?;
        thread
            .join()
            .map_err(|_| KvmError::Internal("the userfaultfd thread panicked".into()))?
            .map_err(|e| KvmError::Host {
                what: "serving userfaultfd".into(),
                source: std::io::Error::other(e),
            })
    }
}

impl Drop for UffdServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One userfaultfd ioctl whose argument struct `arg` points at.
fn uffd_ioctl(uffd: &OwnedFd, request: u32, arg: *mut libc::c_void) -> std::io::Result<()> {
    // SAFETY: every caller passes the struct its request expects, alive across the call.
    let rc = unsafe { libc::ioctl(uffd.as_raw_fd(), libc::c_ulong::from(request), arg) };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Reads the next event, or `None` when none is queued (the fd is non-blocking).
fn read_event(uffd: &OwnedFd) -> Result<Option<uffd_msg>, String> {
    let mut msg = std::mem::MaybeUninit::<uffd_msg>::zeroed();
    let size = std::mem::size_of::<uffd_msg>();
    loop {
        // SAFETY: reads at most `size` bytes into `msg`, which is that large.
        let n = unsafe { libc::read(uffd.as_raw_fd(), msg.as_mut_ptr().cast(), size) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(format!("reading userfaultfd: {e}")),
            }
        }
        if usize::try_from(n).ok() != Some(size) {
            return Err(format!(
                "short read of a userfaultfd message: {n} of {size} bytes"
            ));
        }
        // SAFETY: the kernel wrote a whole uffd_msg; every bit pattern is a valid one.
        return Ok(Some(unsafe { msg.assume_init() }));
    }
}

/// Copies `len` bytes from `src` to `dst` with `UFFDIO_COPY` and wakes the faulting threads.
/// Returns the bytes copied: a partial copy (interrupted) or `EEXIST` (a racing fault mapped the
/// page already) are not errors.
fn copy(uffd: &OwnedFd, src: *const u8, dst: usize, len: usize) -> Result<usize, String> {
    let mut args = uffdio_copy {
        dst: dst as u64,
        src: src as u64,
        len: len as u64,
        mode: 0,
        copy: 0,
    };
    match uffd_ioctl(uffd, UFFDIO_COPY, (&raw mut args).cast()) {
        Ok(()) => Ok(len),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(len),
        // Interrupted (or the mm changing under us): whatever was copied counts.
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
            Ok(usize::try_from(args.copy).unwrap_or(0))
        }
        Err(e) => Err(format!("UFFDIO_COPY of {len} bytes: {e}")),
    }
}

/// Maps `len` bytes at `dst` from the page cache with `UFFDIO_CONTINUE` and wakes the faulting
/// threads; returns the bytes mapped (as [`copy`] does).
fn cont(uffd: &OwnedFd, dst: usize, len: usize) -> Result<usize, String> {
    let mut args = uffdio_continue {
        range: uffdio_range {
            start: dst as u64,
            len: len as u64,
        },
        mode: 0,
        mapped: 0,
    };
    match uffd_ioctl(uffd, UFFDIO_CONTINUE, (&raw mut args).cast()) {
        Ok(()) => Ok(len),
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => Ok(len),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => {
            Ok(usize::try_from(args.mapped).unwrap_or(0))
        }
        Err(e) => Err(format!("UFFDIO_CONTINUE of {len} bytes: {e}")),
    }
}

fn serve(
    uffd: &OwnedFd,
    base: usize,
    len: usize,
    window: usize,
    mode: Mode,
    stop: &AtomicBool,
) -> Result<UffdStats, String> {
    let unit = mode.page();
    let pages = len / unit;
    let mut served = vec![false; pages];
    let source = if mode == Mode::Missing {
        vec![0u8; window.max(1) * PAGE]
    } else {
        Vec::new()
    };
    let mut stats = UffdStats::default();
    let mut pfd = libc::pollfd {
        fd: uffd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd for the uffd this thread owns.
        let ready = unsafe { libc::poll(&mut pfd, 1, 10) };
        if ready < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("poll on userfaultfd: {e}"));
        }
        if ready == 0 {
            if stop.load(Ordering::Acquire) {
                return Ok(stats);
            }
            continue;
        }
        while let Some(msg) = read_event(uffd)? {
            if u32::from(msg.event) != UFFD_EVENT_PAGEFAULT {
                continue;
            }
            // SAFETY: for a page-fault event the kernel fills the `pagefault` member.
            let addr = unsafe { msg.arg.pagefault.address };
            stats.faults += 1;
            // Hugetlb faults name the huge page (the address rounded down, unless
            // UFFD_FEATURE_EXACT_ADDRESS); dividing by the unit covers both.
            let page = usize::try_from(addr)
                .unwrap_or(usize::MAX)
                .saturating_sub(base)
                / unit;
            if page >= pages {
                return Err(format!("fault at {addr:#x} outside the registered region"));
            }
            for (first, count) in serve_plan(&served, page, window) {
                // `source` holds at least `count` pages (count ≤ window) and the destination
                // run lies in the registered region; an interrupted copy leaves the rest to
                // fault again and be served then.
                let bytes = if mode == Mode::Missing {
                    copy(uffd, source.as_ptr(), base + first * unit, count * unit)?
                } else {
                    cont(uffd, base + first * unit, count * unit)?
                };
                let done = bytes / unit;
                served[first..first + done].fill(true);
                stats.pages_served += done as u64;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_one_serves_only_the_faulting_page() {
        assert_eq!(serve_plan(&[false; 16], 5, 1), vec![(5, 1)]);
    }

    #[test]
    fn a_window_serves_to_the_end_of_its_aligned_block() {
        assert_eq!(serve_plan(&[false; 16], 0, 8), vec![(0, 8)]);
        assert_eq!(serve_plan(&[false; 16], 5, 8), vec![(5, 3)]);
        assert_eq!(serve_plan(&[false; 16], 8, 8), vec![(8, 8)]);
    }

    #[test]
    fn served_pages_split_the_run_and_the_region_end_clips_it() {
        let mut served = vec![false; 12];
        served[10] = true;
        assert_eq!(serve_plan(&served, 8, 8), vec![(8, 2), (11, 1)]);
        assert_eq!(serve_plan(&[false; 12], 9, 8), vec![(9, 3)]);
    }
}
