//! The vCPU watchdog: a guest that neither signals nor exits is interrupted, never waited for.

use std::time::Duration;

use vmm_sys_util::signal::{SIGRTMIN, register_signal_handler};

/// The signal the watchdog sends to a vCPU thread stuck in `KVM_RUN`; its handler does
/// nothing, the point is that `KVM_RUN` returns `EINTR`.
pub fn kick_signal() -> libc::c_int {
    SIGRTMIN()
}

extern "C" fn ignore_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

/// Installs the no-op handler for the kick signal, once per process.
pub fn install_kick_handler() -> Result<(), crate::KvmError> {
    static INSTALLED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            register_signal_handler(kick_signal(), ignore_kick).map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| {
            crate::KvmError::Internal(format!("cannot install the watchdog signal handler: {e}"))
        })
}

/// Interrupts the calling thread's `KVM_RUN` if it is not disarmed within `timeout`, so a guest
/// that never signals is reported instead of hanging the run.
///
/// A POSIX per-thread timer (`SIGEV_THREAD_ID`) rather than a watchdog thread: arming costs two
/// syscalls instead of a thread spawn, which would otherwise show up in the construction time
/// the lifecycle scenario measures. After the first expiry it re-fires every 10 ms, because a
/// single signal can land just before `KVM_RUN` blocks again.
#[derive(Debug)]
pub struct Watchdog {
    timer: libc::timer_t,
    deadline: std::time::Instant,
}

impl Watchdog {
    /// Arms a watchdog for the current thread.
    pub fn arm(timeout: Duration) -> Result<Watchdog, crate::KvmError> {
        install_kick_handler()?;
        let deadline = std::time::Instant::now() + timeout;
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() };
        // SAFETY: sigevent is plain data; all-zero is a valid starting value, and the fields
        // that matter are set below (libc keeps a private padding field, so no literal).
        let mut event: libc::sigevent = unsafe { std::mem::zeroed() };
        event.sigev_notify = libc::SIGEV_THREAD_ID;
        event.sigev_signo = kick_signal();
        event.sigev_notify_thread_id = tid;
        let mut timer: libc::timer_t = std::ptr::null_mut();
        // SAFETY: `event` and `timer` are valid for the call; the kernel fills `timer`.
        if unsafe { libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer) } != 0 {
            return Err(crate::KvmError::Host {
                what: "creating the watchdog timer".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        let dog = Watchdog { timer, deadline };
        let spec = libc::itimerspec {
            it_interval: timespec(Duration::from_millis(10)),
            it_value: timespec(timeout.max(Duration::from_nanos(1))),
        };
        // SAFETY: `timer` was just created and is owned by `dog`; `spec` is valid.
        if unsafe { libc::timer_settime(dog.timer, 0, &spec, std::ptr::null_mut()) } != 0 {
            return Err(crate::KvmError::Host {
                what: "arming the watchdog timer".into(),
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(dog)
    }
}

impl Watchdog {
    /// Whether the timeout has passed. `KVM_RUN` also returns `EINTR` for io_uring's task work
    /// (the pinning scenario's rings) and for signals meant for the process: before the
    /// deadline such an interruption is not the watchdog's, and the run loop re-enters.
    pub fn expired(&self) -> bool {
        std::time::Instant::now() >= self.deadline
    }
}

fn timespec(d: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: libc::time_t::try_from(d.as_secs()).unwrap_or(libc::time_t::MAX),
        tv_nsec: libc::c_long::from(d.subsec_nanos()),
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // SAFETY: the timer is owned by this value and deleted exactly once; deleting also
        // disarms it.
        unsafe { libc::timer_delete(self.timer) };
    }
}
