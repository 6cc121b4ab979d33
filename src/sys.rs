//! The few system calls that neither std nor rustix wraps safely, each behind a safe function:
//! the stop-signal handlers a long-running child needs (a trace, a QEMU boot), the death signal
//! a child sets between fork and exec, and closing descriptors inherited by number. With the
//! kvm crate, the only place hvlab writes `unsafe`; everything else goes through rustix.

use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

use rustix::io::FdFlags;
use rustix::process::Signal;

/// The signal that asked hvlab to stop (0: none).
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    STOP.store(sig, Ordering::SeqCst);
}

/// SIGINT, SIGTERM and SIGHUP handlers for the time of a long-running child: they only record
/// the signal, and the caller's loop forwards it, cleans up and returns ([`Self::pending`]). A
/// signal ignored by whoever started hvlab (nohup, a background job) stays ignored. The
/// previous handlers come back when the last guard is dropped: guards nest, so boots that run
/// side by side, each holding one, share one installation and see the same signal.
#[derive(Debug)]
pub struct StopSignals {
    _private: (),
}

/// The handlers hvlab replaced, and how many guards hold the installation.
struct Installed {
    holders: usize,
    old: Vec<(libc::c_int, libc::sigaction)>,
}

/// `None` while no guard exists.
static INSTALLED: std::sync::Mutex<Option<Installed>> = std::sync::Mutex::new(None);

impl StopSignals {
    /// Installs the handlers (the first guard forgets any stop signal recorded before; a
    /// later one joins the installation in place).
    pub fn install() -> StopSignals {
        let mut installed = INSTALLED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(i) = installed.as_mut() {
            i.holders += 1;
            return StopSignals { _private: () };
        }
        STOP.store(0, Ordering::SeqCst);
        let mut old = Vec::new();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler
            // only stores to an atomic, which is async-signal-safe; `prev` is ours, written by
            // the kernel.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as usize;
                libc::sigemptyset(&raw mut act.sa_mask);
                let mut prev: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &raw const act, &raw mut prev) == 0 {
                    if prev.sa_sigaction == libc::SIG_IGN {
                        // Ignored by whoever started hvlab (nohup, a background job): keep it so.
                        libc::sigaction(sig, &raw const prev, std::ptr::null_mut());
                    } else {
                        old.push((sig, prev));
                    }
                }
            }
        }
        *installed = Some(Installed { holders: 1, old });
        StopSignals { _private: () }
    }

    /// The stop signal received since [`Self::install`], if any.
    pub fn pending() -> Option<i32> {
        match STOP.load(Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        let mut installed = INSTALLED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Some(i) = installed.as_mut() else {
            return;
        };
        i.holders -= 1;
        if i.holders > 0 {
            return;
        }
        for (sig, prev) in &i.old {
            // SAFETY: restoring the sigaction that was in place before the first `install`.
            unsafe { libc::sigaction(*sig, prev, std::ptr::null_mut()) };
        }
        *installed = None;
    }
}

/// The name of a stop signal, for messages.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// A stop signal as the kill functions take it (SIGKILL for anything else).
pub fn signal(sig: i32) -> Signal {
    Signal::from_named_raw(sig).unwrap_or(Signal::KILL)
}

/// Makes `cmd`'s child die with hvlab, even by SIGKILL (`PR_SET_PDEATHSIG`, set in the child
/// between fork and exec), and inherit the descriptor `keep` (its close-on-exec flag cleared
/// there, so nothing else hvlab starts gets it).
pub fn die_with_parent_keeping(cmd: &mut Command, keep: RawFd) {
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (prctl, fcntl) on values captured by copy; `keep` is a
    // descriptor the parent holds open across the spawn, so it is open in the child.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            rustix::io::fcntl_setfd(BorrowedFd::borrow_raw(keep), FdFlags::empty())?;
            Ok(())
        });
    }
}

/// Makes `cmd`'s child the leader of a new session (so of a new process group, with no
/// controlling terminal: nothing it starts can read or inject keystrokes into the user's
/// terminal), dying with hvlab even by SIGKILL (`PR_SET_PDEATHSIG`), and without the right
/// to gain privileges by exec (`no_new_privs`). The death signal follows the *thread* that
/// spawns: spawn from the thread that waits for the child.
pub fn own_session_dying_with_parent(cmd: &mut Command) {
    let parent = rustix::process::getpid();
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (setsid, prctl, getppid) on values captured by copy.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::setsid()?;
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            rustix::thread::set_no_new_privs(true)?;
            // hvlab died between fork and prctl: the death signal will never come.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::Error::other("hvlab exited while starting it"));
            }
            Ok(())
        });
    }
}

/// Limits what `cmd`'s child and everything it starts may do: no file larger than
/// `file_bytes` (`RLIMIT_FSIZE`), with `SIGXFSZ` ignored so that a write past it fails with
/// `EFBIG` ("File too large", in the writer's own words) rather than killing the writer
/// unseen; and, given the `cgroup.procs` of a pids cgroup, the child writes itself into it
/// before exec, so every process it starts is counted there from the first. A child the
/// cgroup refuses still runs (the caller checks where it landed).
pub fn limit_child(cmd: &mut Command, file_bytes: u64, cgroup_procs: Option<RawFd>) {
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (setrlimit, signal, write) on values captured by copy;
    // `cgroup_procs` is a descriptor the parent holds open across the spawn (without
    // close-on-exec mattering: it is used before exec), so it is open in the child.
    unsafe {
        cmd.pre_exec(move || {
            let cap = rustix::process::Rlimit {
                current: Some(file_bytes),
                maximum: Some(file_bytes),
            };
            rustix::process::setrlimit(rustix::process::Resource::Fsize, cap)?;
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            if let Some(fd) = cgroup_procs {
                // "0" is the writer itself, in cgroup v1 and v2 alike.
                let _ = rustix::io::write(BorrowedFd::borrow_raw(fd), b"0");
            }
            Ok(())
        });
    }
}

/// Closes descriptors inherited by number (those a parent passed down for another process),
/// ignoring any that is not open.
pub fn close_inherited(fds: impl IntoIterator<Item = RawFd>) {
    for fd in fds {
        // SAFETY: close(2) on a number this process holds only by inheritance and will not
        // use: nothing in it refers to the descriptor; one not open fails with EBADF.
        unsafe { libc::close(fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_signals_are_named_and_sent_as_themselves() {
        assert_eq!(signal_name(libc::SIGTERM), "SIGTERM");
        assert_eq!(signal_name(libc::SIGUSR1), "a signal");
        assert_eq!(signal(libc::SIGINT), Signal::INT);
        assert_eq!(signal(libc::SIGHUP), Signal::HUP);
    }
}
