//! A userfaultfd server: how a VMM restores guest memory lazily (post-copy migration, snapshot
//! restore), with the same prefetch choice KVM faces one level down.
//!
//! The region is registered in missing mode; a thread serves each fault with `UFFDIO_COPY` of
//! the faulting page and, with a window W > 1, of the following not-yet-served pages up to the
//! end of the W-aligned block, so a sequential reader faults once per block.

use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use userfaultfd::{Event, Uffd, UffdBuilder};

use super::KvmError;
use super::memory::GuestMemory;

const PAGE: usize = 4096;

/// What the server did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UffdStats {
    /// Page-fault events read.
    pub faults: u64,
    /// Pages copied in.
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
        // Not user-mode-only: the faults come from KVM's get_user_pages in the kernel.
        let uffd = UffdBuilder::new()
            .close_on_exec(true)
            .non_blocking(true)
            .user_mode_only(false)
            .create()
            .map_err(|e| {
                KvmError::Guest(format!(
                    "cannot create a userfaultfd that handles kernel faults ({e}); it needs root, CAP_SYS_PTRACE or vm.unprivileged_userfaultfd=1"
                ))
            })?;
        let base = region.as_ptr() as usize;
        let len = region.len();
        uffd.register(region.as_ptr().cast(), len).map_err(|e| {
            KvmError::Guest(format!("cannot register {len} bytes with userfaultfd: {e}"))
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("hvlab-uffd".into())
                .spawn(move || serve(&uffd, base, len, window, &stop))
                .map_err(|e| KvmError::Guest(format!("cannot start the userfaultfd thread: {e}")))?
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
            .ok_or_else(|| KvmError::Guest("uffd server already finished".into()))?;
        thread
            .join()
            .map_err(|_| KvmError::Guest("the userfaultfd thread panicked".into()))?
            .map_err(KvmError::Guest)
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

fn serve(
    uffd: &Uffd,
    base: usize,
    len: usize,
    window: usize,
    stop: &AtomicBool,
) -> Result<UffdStats, String> {
    let pages = len / PAGE;
    let mut served = vec![false; pages];
    let source = vec![0u8; window.max(1) * PAGE];
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
        while let Some(event) = uffd
            .read_event()
            .map_err(|e| format!("reading userfaultfd: {e}"))?
        {
            let Event::Pagefault { addr, .. } = event else {
                continue;
            };
            stats.faults += 1;
            let page = (addr as usize).saturating_sub(base) / PAGE;
            if page >= pages {
                return Err(format!("fault at {addr:?} outside the registered region"));
            }
            for (first, count) in serve_plan(&served, page, window) {
                let dst = (base + first * PAGE) as *mut libc::c_void;
                // SAFETY: `source` holds at least `count` pages (count ≤ window) and
                // [dst, dst + count pages) lies in the registered region.
                let copied = unsafe { uffd.copy(source.as_ptr().cast(), dst, count * PAGE, true) };
                let done = match copied {
                    Ok(_) => count,
                    // Interrupted midway: the rest faults again and is served then.
                    Err(userfaultfd::Error::PartiallyCopied(bytes)) => bytes / PAGE,
                    // Already mapped (a racing fault): nothing is missing there any more.
                    Err(userfaultfd::Error::CopyFailed(errno)) if errno as i32 == libc::EEXIST => {
                        count
                    }
                    Err(e) => return Err(format!("UFFDIO_COPY of {count} pages: {e}")),
                };
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
