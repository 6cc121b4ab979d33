//! The exits vocabulary: a batch of exit roundtrips of one kind, and what a backend measured.

use std::time::Duration;

use super::guest::Cpl;

/// The instruction a variant repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitKind {
    /// `out dx, al`.
    PioOut,
    /// `in al, dx`.
    PioIn,
    /// Store to unbacked memory.
    MmioWrite,
    /// Load from unbacked memory.
    MmioRead,
    /// `cpuid`.
    Cpuid,
    /// `vmcall`/`vmmcall`.
    Hypercall,
    /// `hlt`.
    Hlt,
    /// Store to an ioeventfd.
    Ioeventfd,
    /// `out` with the vPMU on.
    PmuOn,
    /// `out` with the vPMU off.
    PmuOff,
    /// A WRMSR KVM completes in `vcpu_enter_guest()`'s fastpath
    /// (`handle_fastpath_set_msr_irqoff()`, e.g. `IA32_TSC_DEADLINE`), never leaving the run
    /// loop.
    Fastpath,
}

impl ExitKind {
    /// Every kind, in variant order.
    pub const ALL: [ExitKind; 10] = [
        ExitKind::PioOut,
        ExitKind::PioIn,
        ExitKind::MmioWrite,
        ExitKind::MmioRead,
        ExitKind::Cpuid,
        ExitKind::Hypercall,
        ExitKind::Hlt,
        ExitKind::Ioeventfd,
        ExitKind::PmuOn,
        ExitKind::PmuOff,
    ];

    /// The variant name.
    pub fn name(self) -> &'static str {
        match self {
            ExitKind::PioOut => "pio-out",
            ExitKind::PioIn => "pio-in",
            ExitKind::MmioWrite => "mmio-write",
            ExitKind::MmioRead => "mmio-read",
            ExitKind::Cpuid => "cpuid",
            ExitKind::Hypercall => "hypercall",
            ExitKind::Hlt => "hlt",
            ExitKind::Ioeventfd => "ioeventfd",
            ExitKind::PmuOn => "pmu-on",
            ExitKind::PmuOff => "pmu-off",
            ExitKind::Fastpath => "fastpath",
        }
    }

    /// Whether every iteration should come back to the VMM.
    pub fn exits_to_userspace(self) -> bool {
        matches!(
            self,
            ExitKind::PioOut
                | ExitKind::PioIn
                | ExitKind::MmioWrite
                | ExitKind::MmioRead
                | ExitKind::Hlt
                | ExitKind::PmuOn
                | ExitKind::PmuOff
        )
    }
}

/// Which PMU MSR-switching scheme a model variant runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmuScheme {
    /// Before "perf/x86: Don't write PEBS_ENABLED on KVM transitions": every PEBS MSR listed.
    Old,
    /// After it: `PEBS_ENABLE` never listed on CPUs with PEBS isolation.
    New,
    /// After it, and KVM zeroes `PERF_GLOBAL_CTRL` before asking perf for the list (Peter
    /// Zijlstra's point in the thread, not part of the series).
    NewQuiesced,
}

/// A guest PMU configuration for the model (`pmu` mechanism).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmuConfig {
    /// The guest has a vPMU.
    pub guest_vpmu: bool,
    /// The guest uses PEBS.
    pub guest_pebs: bool,
    /// The host has a PEBS event active.
    pub host_pebs: bool,
    /// The host's PEBS event uses adaptive PEBS data groups (`PEBS_DATA_CFG` non-zero).
    pub host_pebs_data_cfg: bool,
    /// The guest's `PEBS_DATA_CFG` when it uses PEBS (adaptive PEBS data groups; the host's
    /// is [`HOST_PEBS_DATA_CFG`] when it has one).
    pub guest_pebs_data_cfg: u64,
    /// The switching scheme.
    pub scheme: PmuScheme,
}

/// The host's `PEBS_DATA_CFG` when its PEBS event uses adaptive groups: memory info and GPRs.
pub const HOST_PEBS_DATA_CFG: u64 = 0b11;

/// The guest's `PEBS_DATA_CFG` unless told otherwise: the memory-info group alone, a value
/// unlike the host's. The thread does not say what the guest's PEBS records carry; with the
/// host's value the DATA_CFG entry would drop out of the lists by coincidence, making a PEBS
/// guest cheaper than a non-PEBS one before the series, which the thread never reports.
pub const GUEST_PEBS_DATA_CFG: u64 = 0b01;

/// A perf MSR KVM may switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MsrKind {
    /// `MSR_CORE_PERF_GLOBAL_CTRL`.
    PerfGlobalCtrl,
    /// `MSR_IA32_PEBS_ENABLE`.
    PebsEnable,
    /// `MSR_IA32_DS_AREA`.
    DsArea,
    /// `MSR_PEBS_DATA_CFG`.
    PebsDataCfg,
}

impl MsrKind {
    /// The kernel's name.
    pub fn name(self) -> &'static str {
        match self {
            MsrKind::PerfGlobalCtrl => "PERF_GLOBAL_CTRL",
            MsrKind::PebsEnable => "PEBS_ENABLE",
            MsrKind::DsArea => "DS_AREA",
            MsrKind::PebsDataCfg => "PEBS_DATA_CFG",
        }
    }
}

/// How one listed MSR is switched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchedVia {
    /// Host and guest values are equal: removed from the lists.
    Dropped,
    /// The VMCS's guest/host `IA32_PERF_GLOBAL_CTRL` fields (entry and exit controls).
    VmcsField,
    /// One entry in the VM-entry MSR-load list and one in the VM-exit list.
    LoadList,
}

/// One MSR as KVM switches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwitchedMsr {
    /// Which.
    pub msr: MsrKind,
    /// Host value.
    pub host: u64,
    /// Guest value.
    pub guest: u64,
    /// How.
    pub via: SwitchedVia,
}

/// What the PMU race explorer found for one scheme and one register: whether some
/// interleaving leaves a stale enable bit after VM-exit, the first such interleaving, and how
/// many states it explored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RaceReport {
    /// The scheme explored (`old`, `new`, `new-quiesced`).
    pub scheme: String,
    /// The register whose bit may go stale (`PEBS_ENABLE`, `PERF_GLOBAL_CTRL`).
    pub register: String,
    /// Whether a stale bit survives VM-exit in some interleaving.
    pub stale_bit: bool,
    /// The shortest such interleaving, step by step (empty when none).
    pub interleaving: Vec<String>,
    /// Distinct states explored (all: the search is exhaustive).
    pub states: usize,
}

impl PmuScheme {
    /// The scheme's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            PmuScheme::Old => "old",
            PmuScheme::New => "new",
            PmuScheme::NewQuiesced => "new-quiesced",
        }
    }
}

/// The PMU switching of one model variant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PmuOutcome {
    /// Every MSR perf listed, and how KVM switches it.
    pub msrs: Vec<SwitchedMsr>,
    /// Explicit WRMSRs before VM-entry.
    pub wrmsrs: u32,
    /// The guest's PEBS counters are cut because the host uses PEBS.
    pub guest_pebs_suppressed: bool,
    /// The race explorer's reports (empty without a host PEBS event).
    pub races: Vec<RaceReport>,
}

impl PmuOutcome {
    /// MSR loads the CPU does per roundtrip (from the lists and the VMCS fields).
    pub fn loads(&self) -> u32 {
        self.msrs
            .iter()
            .map(|m| if m.via == SwitchedVia::Dropped { 0 } else { 2 })
            .sum()
    }

    /// MSR writes per roundtrip: loads plus explicit WRMSRs.
    pub fn writes(&self) -> u32 {
        self.loads() + self.wrmsrs
    }
}

/// One batch to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ExitPlan {
    /// What to repeat.
    pub kind: ExitKind,
    /// How often.
    pub iterations: u64,
    /// Guest privilege level; `None`: the backend's default for its host ([`Cpl::default_for`]).
    pub cpl: Option<Cpl>,
    /// Watchdog.
    pub timeout: Duration,
    /// The PMU configuration a model variant switches MSRs for.
    pub pmu: Option<PmuConfig>,
}

/// What one batch measured.
#[derive(Debug, Clone, PartialEq)]
pub struct ExitResult {
    /// Iterations run.
    pub iterations: u64,
    /// Host time from Start to End, ns.
    pub elapsed_ns: u64,
    /// Guest TSC ticks from Start to End.
    pub tsc_ticks: u64,
    /// Exits hvlab handled between the signals.
    pub userspace_exits: u64,
    /// Statistics that changed during the batch: (metric name, unit, delta).
    pub kvm_stats: Vec<(String, String, i128)>,
    /// The PMU switching and race reports (model PMU variants).
    pub pmu: Option<PmuOutcome>,
}
