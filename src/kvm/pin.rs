//! Pinning host memory for real: `mlock`, the pin primitive `hvlab calibrate` measures (and
//! the pin manager of the pinning scenario builds on).

use std::time::Instant;

use super::KvmError;
use super::memory::{Backing, GuestMemory};

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
                return Err(KvmError::Unsupported(format!(
                    "{what} of {bytes} bytes refused ({err}); RLIMIT_MEMLOCK is {limit}: raise it (ulimit -l) or grant CAP_IPC_LOCK"
                )));
            }
            return Err(KvmError::Guest(format!("{what} failed: {err}")));
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
