//! A measured section: the guest's `Start` to `End` signals, timed on the host clock and by
//! the guest's TSC, with KVM binary statistics read at both ends.

use std::time::{Duration, Instant};

use super::KvmError;
use super::guest::Signal;
use super::guest::runner::{self, Flow, GuestExit};
use super::stats::{StatsReader, StatsSnapshot, named_deltas};
use super::vm::Vm;

/// What a section measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// Host ns from the `Start` exit (after reading statistics) to the `End` exit.
    pub elapsed_ns: u64,
    /// Guest TSC ticks the payload reported in `RBX`.
    pub tsc_ticks: u64,
    /// Statistics that changed over the section: (`kvm.vcpu.*`/`kvm.vm.*`, unit, delta).
    pub kvm_stats: Vec<(String, String, i128)>,
}

struct Readers {
    vcpu: Option<StatsReader>,
    vm: Option<StatsReader>,
}

impl Readers {
    fn snapshot(&self) -> Result<(Option<StatsSnapshot>, Option<StatsSnapshot>), KvmError> {
        let vcpu = self.vcpu.as_ref().map(StatsReader::snapshot).transpose()?;
        let vm = self.vm.as_ref().map(StatsReader::snapshot).transpose()?;
        Ok((vcpu, vm))
    }
}

type Snapshots = (Option<StatsSnapshot>, Option<StatsSnapshot>);

/// Runs vCPU 0 of `vm` through one section; exits other than the signals go to `on_exit`.
/// Statistics are skipped on kernels without `KVM_GET_STATS_FD`.
pub fn section(
    vm: &mut Vm,
    timeout: Duration,
    mut on_exit: impl FnMut(GuestExit<'_>) -> Result<Flow, KvmError>,
) -> Result<Measured, KvmError> {
    let readers = Readers {
        vcpu: vm.vcpu(0).and_then(|v| StatsReader::open(v).ok()),
        vm: StatsReader::open(vm.fd()).ok(),
    };
    let vcpu = vm
        .vcpu_mut(0)
        .ok_or_else(|| KvmError::Internal("no vCPU 0".into()))?;
    let mut before: Option<(Snapshots, Instant)> = None;
    let mut measured = None;
    runner::run(vcpu, timeout, |exit| match exit {
        GuestExit::Signal {
            signal: Signal::Start,
            ..
        } => {
            let snaps = readers.snapshot()?;
            before = Some((snaps, Instant::now()));
            Ok(Flow::Continue)
        }
        GuestExit::Signal {
            signal: Signal::End,
            at,
            vcpu,
        } => {
            let ((vcpu_before, vm_before), start) = before
                .take()
                .ok_or_else(|| KvmError::Guest("the guest signalled End before Start".into()))?;
            let (vcpu_after, vm_after) = readers.snapshot()?;
            let tsc_ticks = vcpu
                .get_regs()
                .map_err(crate::ioctl_error("KVM_GET_REGS"))?
                .rbx;
            let mut kvm_stats = Vec::new();
            for (reader, b, a, prefix) in [
                (&readers.vcpu, vcpu_before, vcpu_after, "kvm.vcpu"),
                (&readers.vm, vm_before, vm_after, "kvm.vm"),
            ] {
                if let (Some(r), Some(b), Some(a)) = (reader, b, a) {
                    kvm_stats.extend(named_deltas(r.layout(), &b, &a, prefix));
                }
            }
            measured = Some(Measured {
                elapsed_ns: u64::try_from(at.saturating_duration_since(start).as_nanos())
                    .unwrap_or(u64::MAX),
                tsc_ticks,
                kvm_stats,
            });
            Ok(Flow::Stop)
        }
        GuestExit::Signal { signal, .. } => {
            Err(KvmError::Guest(format!("unexpected signal {signal:?}")))
        }
        other => on_exit(other),
    })?;
    measured.ok_or_else(|| KvmError::Guest("the guest stopped without signalling End".into()))
}

/// The error for an exit a payload should not cause.
pub fn unexpected(exit: &GuestExit<'_>) -> KvmError {
    KvmError::Guest(format!(
        "unexpected exit during the measured section: {exit:?}"
    ))
}
