//! The vCPU run loop: `KVM_RUN` until the handler says stop, every exit turned into a
//! [`GuestExit`] for the scenario, every failure into an error that carries the exit and the
//! registers. A watchdog bounds the whole run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvm_ioctls::{VcpuExit, VcpuFd};

use super::{SIGNAL_PORT, Signal, Watchdog};
use crate::KvmError;

/// An exit, as the handler sees it.
#[derive(Debug)]
pub enum GuestExit<'a> {
    /// The guest wrote to [`SIGNAL_PORT`]; `vcpu` is there to read registers.
    Signal {
        /// What it said.
        signal: Signal,
        /// When `KVM_RUN` returned with it.
        at: Instant,
        /// The vCPU (registers carry the values).
        vcpu: &'a VcpuFd,
    },
    /// `out` to another port.
    PioOut {
        /// Port.
        port: u16,
    },
    /// `in`: fill `data`.
    PioIn {
        /// Port.
        port: u16,
        /// What the guest will read.
        data: &'a mut [u8],
    },
    /// A load from unbacked memory: fill `data`.
    MmioRead {
        /// Guest-physical address.
        gpa: u64,
        /// What the guest will read.
        data: &'a mut [u8],
    },
    /// A store to unbacked memory.
    MmioWrite {
        /// Guest-physical address.
        gpa: u64,
        /// What the guest stored.
        data: &'a [u8],
    },
    /// `hlt` with no in-kernel irqchip.
    Hlt,
}

/// What the handler wants next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    /// Re-enter the guest.
    Continue,
    /// Return from [`run`].
    Stop,
}

enum Step {
    Handled(Flow),
    Signal(u8, Instant),
    Failed(String),
}

/// Registers for a failure report.
pub fn describe(vcpu: &VcpuFd) -> String {
    match (vcpu.get_regs(), vcpu.get_sregs()) {
        (Ok(r), Ok(s)) => format!(
            "rip={:#x} rsp={:#x} rax={:#x} rbx={:#x} rcx={:#x} rdx={:#x} rflags={:#x} cr0={:#x} cr2={:#x} cr3={:#x} cs={:#x} cpl={}",
            r.rip,
            r.rsp,
            r.rax,
            r.rbx,
            r.rcx,
            r.rdx,
            r.rflags,
            s.cr0,
            s.cr2,
            s.cr3,
            s.cs.selector,
            s.cs.dpl
        ),
        (Err(e), _) | (_, Err(e)) => format!("registers unreadable: {e}"),
    }
}

/// Runs `vcpu` until `on_exit` returns [`Flow::Stop`]. A guest that neither stops nor exits
/// within `timeout` is interrupted and reported.
pub fn run(
    vcpu: &mut VcpuFd,
    timeout: Duration,
    on_exit: impl FnMut(GuestExit<'_>) -> Result<Flow, KvmError>,
) -> Result<(), KvmError> {
    run_stoppable(vcpu, timeout, None, on_exit)
}

/// [`run`], and with `stop` another thread may end the run: it sets the flag and kicks this
/// thread, and the interrupted `KVM_RUN` ends the run without error.
pub fn run_stoppable(
    vcpu: &mut VcpuFd,
    timeout: Duration,
    stop: Option<&AtomicBool>,
    mut on_exit: impl FnMut(GuestExit<'_>) -> Result<Flow, KvmError>,
) -> Result<(), KvmError> {
    let watchdog = Watchdog::arm(timeout)?;
    let outcome = loop {
        let result = vcpu.run();
        let step = match result {
            // Only signals need the time: on hosts whose clocksource is not vDSO-capable a
            // clock read is a syscall, which would add to every measured exit.
            Ok(VcpuExit::IoOut(port, data)) if port == SIGNAL_PORT => {
                Step::Signal(data.first().copied().unwrap_or(0), Instant::now())
            }
            Ok(VcpuExit::IoOut(port, _)) => Step::Handled(on_exit(GuestExit::PioOut { port })?),
            Ok(VcpuExit::IoIn(port, data)) => {
                Step::Handled(on_exit(GuestExit::PioIn { port, data })?)
            }
            Ok(VcpuExit::MmioRead(gpa, data)) => {
                Step::Handled(on_exit(GuestExit::MmioRead { gpa, data })?)
            }
            Ok(VcpuExit::MmioWrite(gpa, data)) => {
                Step::Handled(on_exit(GuestExit::MmioWrite { gpa, data })?)
            }
            Ok(VcpuExit::Hlt) => Step::Handled(on_exit(GuestExit::Hlt)?),
            Ok(VcpuExit::Shutdown) => Step::Failed("the guest shut down (triple fault)".into()),
            Ok(VcpuExit::InternalError) => {
                Step::Failed("KVM internal error (emulation failure?)".into())
            }
            Ok(VcpuExit::FailEntry(reason, cpu)) => Step::Failed(format!(
                "VM entry failed: hardware reason {reason:#x} on CPU {cpu}"
            )),
            Ok(other) => Step::Failed(format!("unexpected exit {other:?}")),
            Err(e)
                if (e.errno() == libc::EINTR || e.errno() == libc::EAGAIN)
                    && stop.is_some_and(|s| s.load(Ordering::SeqCst)) =>
            {
                Step::Handled(Flow::Stop)
            }
            // An interruption before the deadline is not the watchdog's: re-enter, as any VMM.
            Err(e)
                if (e.errno() == libc::EINTR || e.errno() == libc::EAGAIN)
                    && !watchdog.expired() =>
            {
                Step::Handled(Flow::Continue)
            }
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Step::Failed(
                format!("no signal within {timeout:?}: the watchdog interrupted KVM_RUN"),
            ),
            Err(e) => Step::Failed(format!("KVM_RUN failed: {e}")),
        };
        match step {
            Step::Handled(Flow::Continue) => {}
            Step::Handled(Flow::Stop) => break Ok(()),
            Step::Signal(al, at) => {
                let flow = on_exit(GuestExit::Signal {
                    signal: Signal::from_al(al),
                    at,
                    vcpu,
                })?;
                if flow == Flow::Stop {
                    break Ok(());
                }
            }
            Step::Failed(why) => break Err(KvmError::Guest(format!("{why}; {}", describe(vcpu)))),
        }
    };
    drop(watchdog);
    outcome
}
