//! The host description: what a machine is and what its KVM can do. Both backends describe
//! their samples with it; `hvlab-host` reads it from /proc and sysfs (`probe_with`), the kvm
//! backend adds what `/dev/kvm` reports.
//!
//! Every stored run carries this fingerprint, so a result can always be read against the kernel,
//! the KVM flavour (VMX, SVM, PVM, arm64), the MMU mode and the tick rate that produced it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Which KVM implementation backs `/dev/kvm`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvmFlavour {
    /// Intel VT-x (`kvm_intel`).
    Vmx,
    /// AMD-V (`kvm_amd`).
    Svm,
    /// Pagetable-based virtual machine (`kvm_pvm`): shadow paging, no hardware virtualization.
    Pvm,
    /// KVM on arm64.
    Arm64,
    /// No usable KVM.
    None,
}

impl std::fmt::Display for KvmFlavour {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            KvmFlavour::Vmx => "vmx",
            KvmFlavour::Svm => "svm",
            KvmFlavour::Pvm => "pvm",
            KvmFlavour::Arm64 => "arm64",
            KvmFlavour::None => "none",
        };
        f.write_str(s)
    }
}

/// The host fingerprint stored with every run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    /// `uname -r`.
    pub kernel: String,
    /// CPU model name.
    pub cpu: String,
    /// Online CPUs.
    pub cores: usize,
    /// KVM implementation.
    pub kvm_flavour: KvmFlavour,
    /// Two-dimensional paging (EPT/NPT) in use; false means shadow paging.
    pub tdp: Option<bool>,
    /// The TDP MMU (`kvm.tdp_mmu`) is enabled.
    pub tdp_mmu: Option<bool>,
    /// Guest PMU virtualization (`kvm.enable_pmu`).
    pub vpmu: Option<bool>,
    /// Timer ticks per second.
    pub hz: u32,
    /// Where `hz` came from: the kernel config, or a measurement.
    pub hz_source: String,
    /// Transparent huge page mode (`always`, `madvise`, `never`).
    pub thp: String,
    /// The hypervisor this host itself runs under, by its CPUID signature (leaf 0x40000000:
    /// `KVMKVMKVM`, `TCGTCGTCGTCG`, `Microsoft Hv`, ...); `None` on bare metal.
    #[serde(default)]
    pub hypervisor: Option<String>,
    /// `ok`, or why `/dev/kvm` cannot be used.
    pub kvm_access: String,
    /// The KVM capabilities hvlab uses, and whether this host has them.
    pub capabilities: BTreeMap<String, bool>,
    /// hvlab's version.
    pub hvlab_version: String,
    /// The git revision hvlab was built from.
    pub git_rev: String,
    /// When this host is a kernel under test booted by `hvlab vm`/`hvlab kab`: which kernel,
    /// from where, and how it was booted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub under_test: Option<UnderTest>,
    /// The clock this host's times are measured on: the wall clock, or QEMU's instruction
    /// clock in a kernel under test booted with `-icount` (absent in JSON: the wall clock).
    #[serde(default, skip_serializing_if = "Clock::is_wall")]
    pub clock: Clock,
}

/// The clock a host measures time on. Times of two clocks never compare: under `icount` a
/// "nanosecond" is one guest instruction, and a jiffy a tick of virtual time.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// Real time, as it passes (bare metal, KVM, a VM's own wall clock, QEMU TCG without
    /// icount).
    #[default]
    Wall,
    /// QEMU's instruction clock (`-icount shift=0`): the guest's time advances one nanosecond
    /// per instruction it executes, and an idle guest jumps to its next timer. A time is an
    /// instruction count; a jiffy is a tick of that virtual time.
    Icount,
}

impl Clock {
    /// Every clock, for parsing and messages.
    pub const ALL: [Clock; 2] = [Clock::Wall, Clock::Icount];

    /// The kernel command-line parameter by which `hvlab vm` tells the guest's hvlab its clock
    /// (`hvlab.clock=icount`): only the VMM that boots the kernel can set it, so a process on
    /// a real host cannot claim a clock it does not have.
    pub const KERNEL_PARAM: &'static str = "hvlab.clock";

    /// The environment variable by which the `/init` of `hvlab vm` gives a guest on the
    /// instruction clock the seconds from its clock to the host's. Its RTC starts at one date
    /// on every boot (a date the kernel mixes into its random pool would make boots differ),
    /// and its runs' times are still the host's: the guest adds this to its clock.
    pub const GUEST_OFFSET_ENV: &'static str = "HVLAB_CLOCK_OFFSET_S";

    /// Whether other work on the host can move a time read on this clock: on the wall clock it
    /// stretches one; on the instruction clock a time is the instructions the guest ran, which
    /// a busy host slows down but cannot change, so nothing measured on it is "busy".
    pub fn load_moves_times(self) -> bool {
        match self {
            Clock::Wall => true,
            Clock::Icount => false,
        }
    }

    /// Its name (`wall`, `icount`).
    pub fn as_str(self) -> &'static str {
        match self {
            Clock::Wall => "wall",
            Clock::Icount => "icount",
        }
    }

    /// Whether this is the wall clock (what a record without a clock was measured on).
    pub fn is_wall(&self) -> bool {
        *self == Clock::Wall
    }

    /// The clock a kernel command line names (`hvlab.clock=icount`); the wall clock when it
    /// names none or one this hvlab does not know.
    pub fn from_cmdline(cmdline: &str) -> Clock {
        cmdline
            .split_whitespace()
            .filter_map(|w| w.strip_prefix(Clock::KERNEL_PARAM)?.strip_prefix('='))
            .next_back()
            .and_then(|v| v.parse().ok())
            .unwrap_or_default()
    }

    /// The unit a time measured in `unit` on this clock is stored in. On the wall clock every
    /// unit is itself; on the instruction clock a nanosecond is an instruction, so `ns` becomes
    /// `insn`, `us` `kinsn`, `ms` `Minsn`, `s` `Ginsn` (the value unchanged: 6.96 ms of virtual
    /// time is 6.96 million instructions), and `ns/page` `insn/page`. Other units (counts,
    /// bytes, jiffies) are the same on both clocks, and a rate per time is per instructions
    /// (`pages/ms` becomes `pages/Minsn`).
    pub fn unit(self, unit: &str) -> String {
        if self == Clock::Wall {
            return unit.to_string();
        }
        if let Some((num, per)) = unit.split_once('/') {
            return format!("{}/{}", self.unit(num), self.unit(per));
        }
        match unit {
            "ns" => "insn",
            "us" | "µs" | "μs" => "kinsn",
            "ms" => "Minsn",
            "s" => "Ginsn",
            other => other,
        }
        .to_string()
    }
}

impl std::fmt::Display for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Clock {
    type Err = String;

    fn from_str(s: &str) -> Result<Clock, String> {
        Clock::ALL
            .into_iter()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| format!("`{s}` is not a clock: give icount or wall"))
    }
}

/// A kernel under test, booted in a VM by `hvlab vm`: stored in its runs' host fingerprint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnderTest {
    /// `uname -r` in the VM.
    pub release: String,
    /// The spec as given (`debian:6.12`, a path).
    pub spec: String,
    /// Where it came from (package and version, or a path).
    pub source: String,
    /// QEMU's accelerator: `kvm` (nested) or `tcg` (emulated; times mean nothing).
    pub accel: String,
    /// QEMU's CPU model (`EPYC,+svm,+npt`, `host`).
    pub cpu_model: String,
    /// When a kernel A/B (`hvlab kab`) booted it: which kab and which side, so the runs of
    /// both sides can be found and judged together later (`hvlab fidelity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kab: Option<KabSide>,
}

/// One side of a kernel A/B, as its runs remember it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KabSide {
    /// The kab's id, shared by both sides' runs.
    pub id: String,
    /// `A` (the base) or `B` (the patched kernel).
    pub side: String,
    /// The patches this side was built with, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub patches: Vec<PatchId>,
    /// The model's strategy the user declared for this side's change (`kab --model-strategy`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_strategy: Option<String>,
    /// The memory model's prefetch strategy for this side's kernel (`legacy`,
    /// `legacy-skip-trailing`, `:N` for `PTE_PREFETCH_NUM` N), recognised from its patches or
    /// declared: what `hvlab fidelity`'s memory rows run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_strategy: Option<String>,
}

/// A patch by its file name and content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PatchId {
    /// File name.
    pub file: String,
    /// The sha256 of its bytes, hex.
    pub sha256: String,
}

impl HostInfo {
    /// Length of one jiffy in nanoseconds.
    pub fn jiffy_ns(&self) -> u64 {
        1_000_000_000 / u64::from(self.hz.max(1))
    }

    /// How this kernel's KVM uses `kvm->srcu` while a VM is built.
    pub fn srcu_kernel(&self) -> crate::ioctl_table::SrcuKernel {
        crate::ioctl_table::SrcuKernel::of(&self.kernel, self.kvm_flavour == KvmFlavour::Vmx)
    }

    /// Whether this host's own CPU is emulated in software (QEMU TCG): every VM exit is then
    /// emulated too, so timings say nothing about hardware; counts and behaviour still hold.
    pub fn cpu_emulated(&self) -> bool {
        self.hypervisor.as_deref() == Some("TCGTCGTCGTCG")
    }

    /// The hypervisor this host runs under, by name (`KVM` for `KVMKVMKVM`); an unknown
    /// signature as it is.
    pub fn hypervisor_name(&self) -> Option<String> {
        self.hypervisor.as_deref().map(hypervisor_name)
    }

    /// Whether `/dev/kvm` opened.
    pub fn kvm_usable(&self) -> bool {
        self.kvm_access == "ok"
    }

    /// Whether a named capability is present.
    pub fn has_cap(&self, name: &str) -> bool {
        self.capabilities.get(name).copied().unwrap_or(false)
    }
}

/// A hypervisor's name from its CPUID signature (leaf 0x40000000, as each hypervisor's source
/// sets it); an unknown signature is returned as it is.
pub fn hypervisor_name(signature: &str) -> String {
    match signature.trim() {
        "KVMKVMKVM" => "KVM",
        "Linux KVM Hv" => "KVM (with Hyper-V enlightenments)",
        "TCGTCGTCGTCG" => "QEMU TCG",
        "Microsoft Hv" => "Hyper-V",
        "VMwareVMware" => "VMware",
        "XenVMMXenVMM" => "Xen",
        "VBoxVBoxVBox" => "VirtualBox",
        "ACRNACRNACRN" => "ACRN",
        "bhyve bhyve" => "bhyve",
        "lrpepyh  vr" | "prl hyperv" => "Parallels",
        "QNXQVMBSQG" => "QNX Hypervisor",
        other => other,
    }
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instruction_clock_stores_times_as_instructions_and_leaves_other_units() {
        assert_eq!(Clock::Icount.unit("ns"), "insn");
        assert_eq!(Clock::Icount.unit("us"), "kinsn");
        assert_eq!(Clock::Icount.unit("ms"), "Minsn");
        assert_eq!(Clock::Icount.unit("s"), "Ginsn");
        assert_eq!(Clock::Icount.unit("ns/page"), "insn/page");
        assert_eq!(Clock::Icount.unit("pages/ms"), "pages/Minsn");
        for other in ["count", "bytes", "jiffies", "ratio", ""] {
            assert_eq!(Clock::Icount.unit(other), other);
        }
        for unit in ["ns", "ms", "ns/page", "count"] {
            assert_eq!(Clock::Wall.unit(unit), unit);
        }
    }

    #[test]
    fn a_guest_learns_its_clock_from_the_kernel_command_line_only() {
        let line = "console=ttyS0 quiet hvlab.clock=icount tsc=reliable";
        assert_eq!(Clock::from_cmdline(line), Clock::Icount);
        assert_eq!(Clock::from_cmdline("console=ttyS0 quiet"), Clock::Wall);
        // A value this hvlab does not know, or a parameter that only starts alike, is no clock.
        assert_eq!(Clock::from_cmdline("hvlab.clock=cycles"), Clock::Wall);
        assert_eq!(Clock::from_cmdline("hvlab.clocks=icount"), Clock::Wall);
        // The kernel takes the last of a repeated parameter.
        assert_eq!(
            Clock::from_cmdline("hvlab.clock=icount hvlab.clock=wall"),
            Clock::Wall
        );
        assert_eq!("icount".parse::<Clock>(), Ok(Clock::Icount));
        assert!("tsc".parse::<Clock>().is_err());
    }

    #[test]
    fn a_host_without_a_clock_in_its_json_is_on_the_wall_clock_and_says_icount_only() {
        let host = |clock: Clock| HostInfo {
            kernel: "7.3.4".into(),
            cpu: "AMD EPYC".into(),
            cores: 1,
            kvm_flavour: KvmFlavour::Svm,
            tdp: Some(true),
            tdp_mmu: Some(true),
            vpmu: Some(false),
            hz: 250,
            hz_source: "config".into(),
            thp: "always".into(),
            hypervisor: Some("TCGTCGTCGTCG".into()),
            kvm_access: "ok".into(),
            capabilities: BTreeMap::new(),
            hvlab_version: "0".into(),
            git_rev: "x".into(),
            under_test: None,
            clock,
        };
        let wall = serde_json::to_string(&host(Clock::Wall)).unwrap();
        assert!(!wall.contains("clock"), "{wall}");
        let icount = serde_json::to_string(&host(Clock::Icount)).unwrap();
        assert!(icount.contains(r#""clock":"icount""#), "{icount}");
        let back: HostInfo = serde_json::from_str(&icount).unwrap();
        assert_eq!(back.clock, Clock::Icount);
        let old: HostInfo = serde_json::from_str(&wall).unwrap();
        assert_eq!(old.clock, Clock::Wall);
    }
}
