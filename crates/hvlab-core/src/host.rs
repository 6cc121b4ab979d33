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
