//! Pinning host memory for real: `mlock`, the pin primitive `hvlab calibrate` measures (and
//! the pin manager of the pinning scenario builds on).

use std::time::Instant;

use crate::KvmError;
use crate::guest_memory::{Backing, GuestMemory};

/// Measured per-page costs of pinning a buffer with `mlock`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MlockCosts {
    /// First pin (faults the pages in), ns per 4 KiB page.
    pub pin_page_ns: f64,
    /// Pin of resident pages, ns per page.
    pub repin_page_ns: f64,
    /// Unpin, ns per page.
    pub unpin_page_ns: f64,
}

fn rlimit_memlock() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the valid, owned `r`.
    (unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0).then_some(r.rlim_cur)
}

/// Pins, unpins and re-pins a `bytes` buffer with `mlock`/`munlock`, timing each.
pub fn mlock_costs(bytes: usize) -> Result<MlockCosts, KvmError> {
    let buf = GuestMemory::backed(bytes, Backing::Lazy)?;
    let pages = (bytes / 4096) as f64;
    let call = |f: unsafe extern "C" fn(*const libc::c_void, usize) -> libc::c_int, what: &str| {
        let t = Instant::now();
        // SAFETY: the range is our own live mapping; mlock/munlock change residency only.
        let rc = unsafe { f(buf.as_ptr().cast(), bytes) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            // Without CAP_IPC_LOCK, RLIMIT_MEMLOCK bounds what may be locked.
            if matches!(err.raw_os_error(), Some(libc::ENOMEM | libc::EPERM)) {
                let limit =
                    rlimit_memlock().map_or("unknown".to_string(), |l| format!("{l} bytes"));
                return Err(KvmError::Lacks(format!(
                    "{what} of {bytes} bytes refused ({err}); RLIMIT_MEMLOCK is {limit}: raise it (ulimit -l) or grant CAP_IPC_LOCK"
                )));
            }
            return Err(KvmError::Host {
                what: format!("{what} of {bytes} bytes"),
                source: err,
            });
        }
        Ok(t.elapsed().as_nanos() as f64 / pages)
    };
    let pin = call(libc::mlock, "mlock")?;
    let unpin = call(libc::munlock, "munlock")?;
    let repin = call(libc::mlock, "mlock")?;
    call(libc::munlock, "munlock")?;
    Ok(MlockCosts {
        pin_page_ns: pin,
        repin_page_ns: repin,
        unpin_page_ns: unpin,
    })
}

/// Whether this process may lock memory beyond RLIMIT_MEMLOCK (CAP_IPC_LOCK, bit 14).
pub fn can_lock_unlimited() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 14) != 0)
}

/// Refuses a plan that could pin more than RLIMIT_MEMLOCK allows, saying so.
pub fn check_memlock(cap_bytes: u64, buffer_bytes: u64) -> Result<(), KvmError> {
    if can_lock_unlimited() {
        return Ok(());
    }
    let need = cap_bytes.min(buffer_bytes.max(cap_bytes));
    match rlimit_memlock() {
        Some(limit) if limit != libc::RLIM_INFINITY && limit < need => {
            Err(KvmError::Lacks(format!(
                "RLIMIT_MEMLOCK is {limit} bytes but the pin cap is {need}: raise it (ulimit -l), lower --set cap, or grant CAP_IPC_LOCK"
            )))
        }
        _ => Ok(()),
    }
}

fn elapsed_ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Pins guest memory with `mlock`, timed.
#[derive(Debug)]
pub struct MlockPinner {
    /// Host address of guest-physical `gpa_base`.
    pub host_base: usize,
    /// The guest-physical address the mapping starts at.
    pub gpa_base: u64,
}

impl MlockPinner {
    fn host(&self, gpa: u64) -> *const libc::c_void {
        (self.host_base + usize::try_from(gpa - self.gpa_base).unwrap_or(0)) as *const libc::c_void
    }
}

impl hvlab_core::pinning::Pinner for MlockPinner {
    fn pin(
        &mut self,
        addr: u64,
        bytes: u64,
        _: bool,
    ) -> Result<u64, hvlab_core::error::BackendError> {
        let len = usize::try_from(bytes).unwrap_or(usize::MAX);
        let t = Instant::now();
        // SAFETY: [addr, addr + bytes) lies in the guest memory this pinner was built over,
        // which outlives it; mlock changes residency, not contents.
        if unsafe { libc::mlock(self.host(addr), len) } != 0 {
            let err = std::io::Error::last_os_error();
            return Err(KvmError::Lacks(format!(
                "mlock of {bytes} bytes refused: {err}; check RLIMIT_MEMLOCK (ulimit -l)"
            ))
            .into());
        }
        Ok(elapsed_ns(t))
    }

    fn unpin(&mut self, addr: u64, bytes: u64) -> Result<u64, hvlab_core::error::BackendError> {
        let len = usize::try_from(bytes).unwrap_or(usize::MAX);
        let t = Instant::now();
        // SAFETY: as in pin.
        if unsafe { libc::munlock(self.host(addr), len) } != 0 {
            return Err(KvmError::Host {
                what: "munlock".into(),
                source: std::io::Error::last_os_error(),
            }
            .into());
        }
        Ok(elapsed_ns(t))
    }
}

/// Pins guest memory by registering it as an io_uring fixed buffer (the kernel pins it with
/// `pin_user_pages`), one ring per pin, timed.
pub struct IoUringPinner {
    mlock: MlockPinner,
    rings: Vec<(u64, io_uring::IoUring)>,
}

impl std::fmt::Debug for IoUringPinner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoUringPinner")
            .field("pins", &self.rings.len())
            .finish()
    }
}

impl IoUringPinner {
    /// A pinner over guest memory at `host_base` (guest-physical `gpa_base`).
    pub fn new(host_base: usize, gpa_base: u64) -> IoUringPinner {
        IoUringPinner {
            mlock: MlockPinner {
                host_base,
                gpa_base,
            },
            rings: Vec::new(),
        }
    }
}

/// io_uring registers at most 1 GiB per buffer.
const IORING_MAX_BUFFER: u64 = 1 << 30;

impl hvlab_core::pinning::Pinner for IoUringPinner {
    fn pin(
        &mut self,
        addr: u64,
        bytes: u64,
        _: bool,
    ) -> Result<u64, hvlab_core::error::BackendError> {
        let iovecs: Vec<libc::iovec> = (0..bytes.div_ceil(IORING_MAX_BUFFER))
            .map(|i| {
                let off = i * IORING_MAX_BUFFER;
                libc::iovec {
                    iov_base: self.mlock.host(addr + off).cast_mut(),
                    iov_len: usize::try_from((bytes - off).min(IORING_MAX_BUFFER)).unwrap_or(0),
                }
            })
            .collect();
        let t = Instant::now();
        let ring = io_uring::IoUring::new(2).map_err(|e| {
            KvmError::Lacks(format!(
                "cannot create an io_uring ({e}); use --set pin=mlock"
            ))
        })?;
        // SAFETY: the iovecs describe guest memory that outlives the ring (the ring is dropped
        // on unpin or with this pinner, before the VM's memory).
        unsafe { ring.submitter().register_buffers(&iovecs) }.map_err(|e| {
            KvmError::Lacks(format!(
                "io_uring buffer registration of {bytes} bytes refused: {e}; check RLIMIT_MEMLOCK"
            ))
        })?;
        let ns = elapsed_ns(t);
        self.rings.push((addr, ring));
        Ok(ns)
    }

    fn unpin(&mut self, addr: u64, _: u64) -> Result<u64, hvlab_core::error::BackendError> {
        let t = Instant::now();
        if let Some(i) = self.rings.iter().position(|(a, _)| *a == addr) {
            let (_, ring) = self.rings.remove(i);
            ring.submitter()
                .unregister_buffers()
                .map_err(|source| KvmError::Host {
                    what: "io_uring buffer unregistration".into(),
                    source,
                })?;
        }
        Ok(elapsed_ns(t))
    }
}
