//! The lifecycle vocabulary: a VM construction plan, and the timeline a backend observed
//! while executing it.

use std::collections::BTreeSet;
use std::time::Duration;

use super::ioctl_table::SrcuEffect;
use crate::error::BadOrder;

/// One ioctl on a timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoctlEvent {
    /// KVM name.
    pub name: String,
    /// Start in ns from an arbitrary origin shared by the timeline.
    pub start_ns: u64,
    /// Duration in ns.
    pub dur_ns: u64,
    /// The ioctl's flags where the issuer knows them (`KVM_IOEVENTFD` assign or deassign);
    /// `None` where they are not visible (strace shows a pointer).
    pub flags: Option<u32>,
}

impl IoctlEvent {
    /// End time.
    pub fn end_ns(&self) -> u64 {
        self.start_ns.saturating_add(self.dur_ns)
    }
}

/// One construction step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Step {
    /// `KVM_CREATE_VM`.
    CreateVm,
    /// `KVM_SET_TSS_ADDR`.
    TssAddr,
    /// `KVM_CREATE_IRQCHIP`.
    Irqchip,
    /// `KVM_CREATE_PIT2`.
    Pit,
    /// `KVM_SET_USER_MEMORY_REGION` for guest RAM.
    Memslot,
    /// `KVM_CREATE_VCPU` × vcpus.
    Vcpus,
    /// `KVM_IOEVENTFD` × devices.
    Ioeventfds,
    /// The first `KVM_RUN` of vCPU 0, until the guest signals.
    Run,
    /// `KVM_IOEVENTFD` × devices while vCPU 0 runs guest code (device activation during boot).
    BootIoeventfds,
    /// A memslot update while vCPU 0 runs, after the boot registrations (a second memslot).
    BootMemslot,
}

/// How `kvm_io_bus_register_dev()` frees the old bus array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// `call_srcu()`: what Linux 6.18 does.
    AlwaysDefer,
    /// `synchronize_srcu_expedited()` and free at once: Linux before 7d9a0273.
    AlwaysSync,
    /// Sean Christopherson's fix in thread 001: `synchronize_srcu_expedited()` while
    /// `kvm->created_vcpus` is 0 (no readers: cheap), `call_srcu()` afterwards.
    LifecycleKeyed,
}

impl Step {
    /// Every step, in the names `--set order=` takes.
    pub const ALL: [Step; 10] = [
        Step::CreateVm,
        Step::TssAddr,
        Step::Irqchip,
        Step::Pit,
        Step::Memslot,
        Step::Vcpus,
        Step::Ioeventfds,
        Step::Run,
        Step::BootIoeventfds,
        Step::BootMemslot,
    ];

    /// The name in `--set order=`.
    pub fn name(self) -> &'static str {
        match self {
            Step::CreateVm => "create-vm",
            Step::TssAddr => "tss",
            Step::Irqchip => "irqchip",
            Step::Pit => "pit",
            Step::Memslot => "memslot",
            Step::Vcpus => "vcpus",
            Step::Ioeventfds => "ioeventfds",
            Step::Run => "run",
            Step::BootIoeventfds => "boot-ioeventfds",
            Step::BootMemslot => "boot-memslot",
        }
    }

    /// The step called `s` in `--set order=`.
    pub fn parse(s: &str) -> Option<Step> {
        Step::ALL.into_iter().find(|step| step.name() == s)
    }
}

use Step::{BootIoeventfds, BootMemslot, CreateVm, Irqchip, Memslot, Pit, Run, Vcpus};

/// One VM to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConstructionPlan {
    /// Steps in order.
    pub steps: Vec<Step>,
    /// vCPUs to create.
    pub vcpus: u32,
    /// ioeventfds to register.
    pub devices: u32,
    /// Guest RAM bytes.
    pub mem_bytes: usize,
    /// Watchdog for the first run.
    pub run_timeout: Duration,
    /// How registrations free the old bus array (the model's knob; real KVM does what its
    /// kernel does).
    pub strategy: Strategy,
    /// HZ for the model (`None`: the profile's).
    pub hz: Option<u32>,
    /// How long vCPU 0 runs the guest before the boot registrations: the guest's own boot,
    /// long enough for the construction's grace periods to have ended.
    pub boot_ms: u32,
    /// Model: each VM is built right after the previous one, as the kvm backend's repetitions
    /// are (`true`), or at a random time, as separate VMM processes are (`false`).
    pub back_to_back: bool,
    /// Model: percent of the time a running vCPU spends in an SRCU read-side section
    /// (handling exits in the kernel); hvlab's guest loops barely exit (0).
    pub reader_pct: u32,
}

impl ConstructionPlan {
    /// Rejects orders KVM cannot execute, saying why, before any VM is built.
    pub fn validate(&self) -> Result<(), BadOrder> {
        let bad = |why: String| Err(BadOrder(why));
        let pos = |s: Step| self.steps.iter().position(|x| *x == s);
        if self.steps.first() != Some(&CreateVm) {
            return bad("the order must start with create-vm".into());
        }
        let after_run: Vec<Step> = self
            .steps
            .iter()
            .skip_while(|s| **s != Run)
            .skip(1)
            .copied()
            .collect();
        if !self.steps.contains(&Run)
            || after_run
                .iter()
                .any(|s| !matches!(s, BootIoeventfds | BootMemslot))
        {
            return bad("the order must end with run (or run followed only by boot-ioeventfds, boot-memslot)".into());
        }
        // Boot steps happen beside the running vCPU: before it they would be plain steps that the
        // model delays by boot_ms and the kvm backend runs on its boot thread anyway.
        if let Some(early) = self
            .steps
            .iter()
            .take_while(|s| **s != Run)
            .find(|s| matches!(s, BootIoeventfds | BootMemslot))
        {
            return bad(format!(
                "{} happens while vCPU 0 runs: put it after run (or use {} before run)",
                early.name(),
                if *early == BootIoeventfds {
                    Step::Ioeventfds.name()
                } else {
                    Memslot.name()
                }
            ));
        }
        let mut seen = BTreeSet::new();
        for s in &self.steps {
            if !seen.insert(*s) {
                return bad(format!("step {} appears twice", s.name()));
            }
        }
        for needed in [Memslot, Vcpus] {
            if pos(needed).is_none() {
                return bad(format!(
                    "the guest cannot run without the {} step",
                    needed.name()
                ));
            }
        }
        if let Some(pit) = pos(Pit)
            && pos(Irqchip).is_none_or(|irq| irq > pit)
        {
            return bad("pit needs the in-kernel irqchip: put irqchip before pit".into());
        }
        if let (Some(irq), Some(vcpus)) = (pos(Irqchip), pos(Vcpus))
            && irq > vcpus
        {
            return bad(
                "KVM rejects KVM_CREATE_IRQCHIP once a vCPU exists: put irqchip before vcpus"
                    .into(),
            );
        }
        Ok(())
    }
}

/// The VMM thread that does a booting order's steps beside the running vCPU, on the build's
/// clock (ns since `KVM_CREATE_VM`). Where it starts and wakes against the timer tick decides
/// where the grace period of its first registration starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BootThread {
    /// The VMM spawned it (just before vCPU 0 enters `KVM_RUN`).
    pub spawned_ns: u64,
    /// It first ran.
    pub started_ns: u64,
    /// It went on from the guest's first exit (the vCPU thread's message received, on a CPU
    /// that thread may still hold): its `boot_ms` sleep starts here.
    pub went_on_ns: u64,
    /// Its `boot_ms` sleep was to end (the sleep's start plus `boot_ms`).
    pub wake_ns: u64,
}

/// One VM's construction as a backend observed it.
#[derive(Debug, Clone, PartialEq)]
pub struct ConstructionTrace {
    /// Every ioctl in issue order.
    pub ioctls: Vec<IoctlEvent>,
    /// `KVM_CREATE_VM` to the first guest exit, ns.
    pub ready_ns: u64,
    /// KVM statistics accumulated since creation: (metric name, unit, value).
    pub kvm_stats: Vec<(String, String, i128)>,
    /// What each ioctl did to SRCU, when the backend knows exactly (the model); empty: the
    /// kernel's semantics decide, by ioctl and flags ([`SrcuKernel`]).
    pub srcu_effects: Vec<SrcuEffect>,
    /// Time from the end of the previous build's last step on the same backend to this
    /// build's `KVM_CREATE_VM`, ns: the VMM tearing that VM down and setting this one up. It
    /// sets where the timer ticks fall when this build's grace periods start (`None`: the
    /// first build, or builds that are not back to back).
    pub since_last_ns: Option<u64>,
    /// Time from the end of the previous build's teardown (its VM's fds closed, its memory
    /// unmapped) to this build's `KVM_CREATE_VM`, ns: the VMM setting this VM up. The rest of
    /// `since_last_ns` is the teardown, whose end a barrier in `kvm_destroy_vm()` can hold
    /// until a tick (`None`: as for `since_last_ns`, or a backend that does not tear down).
    pub since_teardown_ns: Option<u64>,
    /// Time from the last timer tick to `KVM_CREATE_VM`, ns, where the backend can see the
    /// ticks (`None`: it cannot).
    pub tick_phase_ns: Option<u64>,
    /// An order that boots: its boot thread (`None`: the order does not boot, or the backend
    /// has no such thread).
    pub boot_thread: Option<BootThread>,
}

impl ConstructionTrace {
    /// When the build's last step ended, on its own clock (ns since `KVM_CREATE_VM`).
    #[must_use]
    pub fn end_ns(&self) -> u64 {
        self.ioctls
            .iter()
            .map(|e| e.start_ns + e.dur_ns)
            .fold(self.ready_ns, u64::max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(steps: &[Step]) -> ConstructionPlan {
        ConstructionPlan {
            steps: steps.to_vec(),
            vcpus: 1,
            devices: 2,
            mem_bytes: 2 << 20,
            run_timeout: Duration::from_secs(1),
            strategy: Strategy::AlwaysDefer,
            hz: None,
            boot_ms: 0,
            back_to_back: true,
            reader_pct: 0,
        }
    }

    #[test]
    fn boot_steps_before_run_are_refused_naming_the_fix() {
        for (boot, plain) in [(BootIoeventfds, "ioeventfds"), (BootMemslot, "memslot")] {
            let msg = plan(&[CreateVm, Memslot, Vcpus, boot, Run])
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                msg.contains(boot.name()) && msg.contains("after run") && msg.contains(plain),
                "{msg}"
            );
        }
        plan(&[CreateVm, Memslot, Vcpus, Run, BootMemslot, BootIoeventfds])
            .validate()
            .unwrap();
    }
}
