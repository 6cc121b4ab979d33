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

/// A guest PMU configuration for the model (`pmu` mechanism).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmuConfig {
    /// The guest has a vPMU.
    pub guest_vpmu: bool,
    /// The guest uses PEBS.
    pub guest_pebs: bool,
    /// The host has PEBS events active.
    pub host_pebs: bool,
    /// The PEBS-isolation scheme (false: the old one).
    pub new_scheme: bool,
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
    /// MSR writes per roundtrip (model), and what the race explorer found.
    pub msr_writes: Option<u32>,
    /// The race explorer's verdict, for PEBS variants (model).
    pub race: Option<RaceReport>,
}

/// What the PMU race explorer found for one scheme: whether some interleaving leaves a stale
/// enable bit after VM-exit, the first such interleaving, and how many states it explored.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RaceReport {
    /// The scheme explored (`old`: PEBS_ENABLE switched on every transition; `new`: left
    /// alone where the CPU isolates PEBS).
    pub scheme: String,
    /// Whether a stale enable bit survives VM-exit in some interleaving.
    pub stale_bit: bool,
    /// The shortest such interleaving, step by step (empty when none).
    pub interleaving: Vec<String>,
    /// Distinct states explored.
    pub states: usize,
}
