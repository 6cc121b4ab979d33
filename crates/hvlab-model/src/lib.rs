//! The model backend: executable models of the kernel mechanisms behind each scenario, driven
//! by a cost profile. Deterministic: the same seed gives the same output on every machine.
//!
//! One module per mechanism, named as the mechanism, with [`mmu_lock`] (the vCPUs' contention
//! on `kvm->mmu_lock`, which memory and dirty both model); [`profile`] holds the costs.
//!
//! A mechanism has one name in every layer (docs/ARCHITECTURE.md has the same table):
//!
//! | mechanism | scenario | core | kvm | model |
//! |---|---|---|---|---|
//! | VM construction vs SRCU | `lifecycle` | `lifecycle` | `lifecycle` | `lifecycle` |
//! | stage-2 faults, prefetch | `memory` | `memory` | `memory` | `memory` |
//! | exit roundtrips, PMU switching | `exits` | `exits` | `exits` | `exits` |
//! | SPE buffer pins | `pinning` | `pinning` | `pinning` | `pinning` |
//! | per-CPU data access | `percpu` | `percpu` | (model only) | `percpu` |
//! | dirty logging | `dirty` | `dirty` | `dirty` | `dirty` |
//! | memslot updates | `memslots` | `memslots` | `memslots` | `memslots` |

pub mod dirty;
pub mod exits;
pub mod lifecycle;
pub mod memory;
pub mod memslots;
pub mod mmu_lock;
pub mod percpu;
pub mod pinning;
pub mod profile;

use rand_chacha::ChaCha8Rng;

use hvlab_core::error::{BackendError, Fault};
use hvlab_core::exits::{ExitKind, ExitPlan, ExitResult, PmuConfig, RaceReport};
use hvlab_core::host::{HostInfo, KvmFlavour};
use hvlab_core::lifecycle::{ConstructionPlan, ConstructionTrace};
use hvlab_core::memory::{TouchPlan, TouchResult};
use hvlab_core::percpu::{PercpuPlan, PercpuResult};
use hvlab_core::pinning::{PinPlan, PinResult};
use hvlab_core::{Backend, BackendKind, PercpuPredictor};
use profile::{MmuKind, Profile, ProfileError};

/// Model errors: its cost profile (what a plan the modelled host cannot run is, the backend
/// seam's one [`BackendError::Unsupported`], says).
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum ModelError {
    /// {0}
    Profile(#[from] ProfileError),
}

impl ModelError {
    /// What kind of failure it is: a profile that cannot be read or lacks a cost is bad input;
    /// one that cannot be written, a failure.
    pub fn fault(&self) -> Fault {
        match self {
            ModelError::Profile(p) if !p.is_write() => Fault::BadInput,
            ModelError::Profile(_) => Fault::Failed,
        }
    }
}

impl From<ModelError> for BackendError {
    /// What the model refuses through the [`Backend`] trait: a profile that lacks or spoils a
    /// cost is bad input.
    fn from(e: ModelError) -> BackendError {
        match e {
            ModelError::Profile(p) => BackendError::Config(Box::new(p)),
        }
    }
}

/// The modelled host cannot run a plan (a profile without the costs it needs, a mechanism
/// the modelled hardware lacks): the variant is unsupported.
fn unsupported(why: impl std::fmt::Display) -> BackendError {
    BackendError::Unsupported(why.to_string())
}

/// The model backend with one profile.
#[derive(Debug)]
pub struct ModelBackend {
    profile: Profile,
    /// The host this backend presents: the modelled one (see [`ModelBackend::new`]), with the
    /// HZ of the last VM it built. Stored with the run; scenarios read the jiffy from it.
    host: HostInfo,
    /// The modelled host's HZ and where it came from, before a plan overrides it.
    profile_hz: (u32, String),
    rng: ChaCha8Rng,
    /// Where the timer ticks fall for the next VM built back to back.
    lifecycle: lifecycle::BackToBack,
    /// The PEBS race explorer's reports by configuration: the same for every batch and rep,
    /// and a state-space search each time.
    races: Vec<((PmuConfig, exits::PebsCpu), Vec<RaceReport>)>,
    /// The lifecycle's costs, read from the profile once per HZ a plan asks for (a run
    /// builds hundreds of VMs on the same costs).
    lifecycle_costs: Option<(Option<u32>, lifecycle::LifecycleCosts)>,
}

impl ModelBackend {
    /// A model of the host `profile` describes; `host` is the machine running the model (its
    /// fingerprint is stored with the run), `seed` drives every random draw.
    pub fn new(profile: Profile, mut host: HostInfo, seed: u64) -> ModelBackend {
        // The run describes the modelled host: its HZ and paging, not this machine's.
        if let Ok(hz) = profile.get("hz", "model") {
            // Profiles give HZ as a small whole number.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            {
                host.hz = hz.max(1.0) as u32;
            }
            host.hz_source = format!("profile {}", profile.name);
        }
        host.tdp = Some(profile.mmu != MmuKind::Shadow);
        host.tdp_mmu = Some(profile.mmu == MmuKind::TdpMmu);
        // Its times are on the profile's clock, not on that of the machine computing them: a
        // wall-clock profile run in a guest on QEMU's instruction clock gives nanoseconds.
        host.clock = profile.clock;
        ModelBackend {
            profile,
            profile_hz: (host.hz, host.hz_source.clone()),
            host,
            rng: lifecycle::rng(seed),
            lifecycle: lifecycle::BackToBack::default(),
            races: Vec::new(),
            lifecycle_costs: None,
        }
    }

    /// The profile.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// [`exits::explore`] for `cfg` on `cpu`, explored once per backend.
    fn races(&mut self, cfg: PmuConfig, cpu: exits::PebsCpu) -> Vec<RaceReport> {
        if let Some((_, races)) = self.races.iter().find(|(key, _)| *key == (cfg, cpu)) {
            return races.clone();
        }
        let races = exits::explore(cfg, cpu);
        self.races.push(((cfg, cpu), races.clone()));
        races
    }
}

impl Backend for ModelBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Model
    }

    fn host(&self) -> &HostInfo {
        &self.host
    }

    fn profile_name(&self) -> Option<String> {
        Some(self.profile.name.clone())
    }

    fn construct_vm(&mut self, plan: &ConstructionPlan) -> Result<ConstructionTrace, BackendError> {
        // The kernel this VM is built on ticks at the plan's HZ (`--set hz`) when it names one:
        // that is the host this backend presents from now on, the one the run stores.
        (self.host.hz, self.host.hz_source) = match plan.hz {
            Some(hz) => (hz, "--set hz".to_string()),
            None => self.profile_hz.clone(),
        };
        let costs = match &self.lifecycle_costs {
            Some((hz, costs)) if *hz == plan.hz => costs,
            _ => {
                let costs = lifecycle::LifecycleCosts::from_profile(&self.profile, plan.hz)
                    .map_err(ModelError::from)?;
                &self.lifecycle_costs.insert((plan.hz, costs)).1
            }
        };
        Ok(lifecycle::construct(
            costs,
            plan,
            &mut self.rng,
            &mut self.lifecycle,
        ))
    }

    fn touch_memory(&mut self, plan: &TouchPlan) -> Result<TouchResult, BackendError> {
        let costs = memory::MmuCosts::from_profile(&self.profile).map_err(ModelError::from)?;
        if plan.backing == hvlab_core::memory::HostBacking::PreFault && costs.mmu == MmuKind::Shadow
        {
            return Err(unsupported(format!(
                "KVM_PRE_FAULT_MEMORY needs TDP; profile {} describes shadow paging",
                self.profile.name
            )));
        }
        if plan.vcpus > 1 {
            // A profile without the contention inputs cannot say what many vCPUs do.
            let par = mmu_lock::ParallelCosts::from_profile(&self.profile).map_err(unsupported)?;
            return mmu_lock::touch(&costs, &par, plan).map_err(unsupported);
        }
        memory::touch(&costs, plan).map_err(unsupported)
    }

    fn exit_roundtrips(&mut self, plan: &ExitPlan) -> Result<ExitResult, BackendError> {
        let g = |k| self.profile.get(k, "pmu").map_err(ModelError::from);
        let ghz = g("cpu_ghz")?;
        let base = match plan.kind {
            ExitKind::Cpuid | ExitKind::Hypercall => g("exit_kernel_ns")?,
            // An ioeventfd write completes in the kernel but goes through the MMIO bus.
            ExitKind::Ioeventfd => (g("exit_kernel_ns")? + g("exit_userspace_ns")?) / 3.0,
            ExitKind::Fastpath => g("exit_fastpath_cycles")? / ghz,
            // An MMIO exit is a userspace exit whose instruction KVM decodes and emulates
            // first: `npf_interception()` (SVM) or `handle_ept_misconfig()` (VMX) ->
            // `kvm_mmu_page_fault()` -> `x86_emulate_instruction()`, where a PIO exit's
            // exit information gives port, size and value. A profile that has not measured
            // the emulation prices it as a PIO exit.
            ExitKind::MmioWrite => {
                g("exit_userspace_ns")? + self.profile.optional("mmio_emulate_ns").unwrap_or(0.0)
            }
            // A read cannot finish before userspace gives the data: on the next KVM_RUN,
            // `complete_emulated_mmio()` copies it and `complete_emulated_io()` emulates the
            // load a second time (`kvm_emulate_instruction(EMULTYPE_NO_DECODE)`, the read
            // now served from `mmio_read_completed`) to write its register and advance RIP;
            // a write's completion returns without emulating. Unmeasured: no second pass.
            ExitKind::MmioRead => {
                g("exit_userspace_ns")?
                    + self.profile.optional("mmio_emulate_ns").unwrap_or(0.0)
                    + self
                        .profile
                        .optional("mmio_read_complete_ns")
                        .unwrap_or(0.0)
            }
            _ => g("exit_userspace_ns")?,
        };
        // Only PMU variants read the PMU costs, so a profile calibrated before they existed
        // still runs the plain exit kinds.
        let pmu = match plan.pmu {
            Some(cfg) => {
                let cpu = exits::PebsCpu {
                    isolation: g("pebs_isolation")? != 0.0,
                    ..exits::PebsCpu::isolated()
                };
                let costs = exits::SwitchCosts {
                    load_entry: g("msr_load_entry_cycles")?,
                    list: g("msr_load_list_cycles")?,
                    wrmsr: g("wrmsr_cycles")?,
                };
                let mut outcome = exits::switch_plan(cfg, cpu);
                outcome.races = self.races(cfg, cpu);
                let extra = exits::switch_cycles(&outcome, &costs) / ghz;
                Some((outcome, extra))
            }
            None => None,
        };
        let per_iter = base + pmu.as_ref().map_or(0.0, |(_, ns)| *ns);
        let n = plan.iterations;
        let userspace = if plan.kind.exits_to_userspace() { n } else { 0 };
        Ok(ExitResult {
            iterations: n,
            // Non-negative model time.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            elapsed_ns: (per_iter * n as f64).round() as u64,
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            tsc_ticks: (per_iter * n as f64 * ghz).round() as u64,
            userspace_exits: userspace,
            kvm_stats: Vec::new(),
            pmu: pmu.map(|(o, _)| o),
        })
    }

    fn pin_trace(&mut self, plan: &PinPlan) -> Result<PinResult, BackendError> {
        let costs = pinning::PinCosts::from_profile(&self.profile).map_err(ModelError::from)?;
        pinning::run(&costs, plan)
    }

    fn percpu(&mut self) -> Option<&mut dyn PercpuPredictor> {
        Some(self)
    }

    fn dirty_log(
        &mut self,
        plan: &hvlab_core::dirty::DirtyPlan,
    ) -> Result<hvlab_core::dirty::DirtyResult, BackendError> {
        dirty::admit(plan).map_err(unsupported)?;
        dirty::admit_profile(&self.profile).map_err(unsupported)?;
        // A profile without the dirty-logging costs (calibrated before they existed, or a
        // host nobody measured them on) cannot run this scenario: a limitation, said as one.
        let mut costs = dirty::DirtyCosts::from_profile(&self.profile).map_err(unsupported)?;
        if plan.vcpus > 1 {
            // A profile without the contention inputs cannot say what many vCPUs do.
            costs = costs.with_vcpus(&self.profile).map_err(unsupported)?;
        }
        Ok(dirty::run(&costs, plan))
    }

    fn update_memslots(
        &mut self,
        plan: &hvlab_core::memslots::MemslotPlan,
    ) -> Result<hvlab_core::memslots::MemslotResult, BackendError> {
        // A profile without the memslot costs (calibrated before they existed) cannot run
        // this scenario: a limitation, said as one.
        let costs = memslots::MemslotCosts::from_profile(&self.profile).map_err(unsupported)?;
        Ok(memslots::run(
            &costs,
            plan,
            rand::RngExt::random(&mut self.rng),
        ))
    }
}

impl PercpuPredictor for ModelBackend {
    fn predict_percpu(&mut self, plan: &PercpuPlan) -> Result<PercpuResult, BackendError> {
        let costs = percpu::PercpuCosts::from_profile(&self.profile).map_err(ModelError::from)?;
        Ok(percpu::predict(&costs, plan))
    }
}

/// The built-in profile nearest to a host of `flavour`, and how well it matches.
pub fn builtin_for(flavour: KvmFlavour) -> (&'static str, &'static str) {
    match flavour {
        KvmFlavour::Vmx => ("intel-spr-vmx", "the built-in profile for VMX hosts"),
        KvmFlavour::Svm => (
            "intel-spr-vmx",
            "no built-in profile describes an SVM host; the nearest is intel-spr-vmx (x86, TDP MMU)",
        ),
        KvmFlavour::Arm64 => ("neoverse-n2-spe", "the built-in profile for arm64 hosts"),
        KvmFlavour::Pvm | KvmFlavour::None => ("pvm-epyc", "the built-in profile for PVM hosts"),
    }
}

/// A profile calibrated by an older hvlab lacks the costs added since: they come from the
/// built-in profile calibrate starts from, marked as such, with a note to recalibrate.
fn complete_from_builtin(
    host: &HostInfo,
    path: &std::path::Path,
) -> Result<(Profile, Option<String>), ProfileError> {
    let origin = path.to_string_lossy().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| ProfileError::Read(origin.clone(), e))?;
    let mut p: Profile = toml::from_str(&text)
        .map_err(|e| ProfileError::Parse(origin.clone(), String::new(), Box::new(e)))?;
    let (name, _) = builtin_for(host.kvm_flavour);
    let added = p.inherit(&Profile::load(name)?, |provenance| {
        format!(
            "not in the calibrated profile (written by an older hvlab); from built-in profile {name}: {provenance}"
        )
    });
    p.validate(&origin)?;
    let note = format!(
        "the calibrated profile {origin} predates {}; they come from built-in profile {name} until `hvlab calibrate` runs again",
        added.join(", ")
    );
    Ok((p, Some(note)))
}

/// The profile to use when none is given: the one calibrated on this host, else the built-in
/// closest to it, with a note when that is not a match for this host's flavour.
pub fn default_profile(
    host: &HostInfo,
    calibrated: Option<&std::path::Path>,
) -> Result<(Profile, Option<String>), ProfileError> {
    if let Some(path) = calibrated.filter(|p| p.exists()) {
        let origin = path.to_string_lossy();
        return match Profile::load(&origin) {
            Err(ProfileError::Missing { .. }) => complete_from_builtin(host, path),
            loaded => Ok((loaded?, None)),
        };
    }
    let (name, how) = builtin_for(host.kvm_flavour);
    let note = (host.kvm_flavour == KvmFlavour::Svm).then(|| {
        format!("no calibrated profile for this host, and {how}; `hvlab calibrate` measures one")
    });
    Ok((Profile::load(name)?, note))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn host() -> HostInfo {
        HostInfo {
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
            hypervisor: None,
            kvm_access: "ok".into(),
            capabilities: BTreeMap::new(),
            hvlab_version: "0".into(),
            git_rev: "x".into(),
            under_test: None,
            clock: hvlab_core::host::Clock::Wall,
        }
    }

    fn roundtrip(profile: &Profile, kind: ExitKind) -> u64 {
        let mut model = ModelBackend::new(profile.clone(), host(), 1);
        let plan = ExitPlan {
            kind,
            iterations: 100,
            cpl: None,
            timeout: std::time::Duration::from_secs(1),
            pmu: None,
        };
        model.exit_roundtrips(&plan).unwrap().elapsed_ns / 100
    }

    /// An MMIO exit is a PIO exit plus the instruction's emulation where the profile measured
    /// it; a profile that did not prices both alike, as before.
    #[test]
    fn an_mmio_exit_adds_the_measured_emulation_to_a_pio_exit() {
        let mut p = Profile::load("intel-spr-vmx").unwrap();
        let pio = roundtrip(&p, ExitKind::PioOut);
        assert_eq!(roundtrip(&p, ExitKind::MmioRead), pio);
        p.set("mmio_emulate_ns", 2_635.0, "ns", "test");
        assert_eq!(roundtrip(&p, ExitKind::PioOut), pio);
        assert_eq!(roundtrip(&p, ExitKind::MmioWrite), pio + 2_635);
        assert_eq!(roundtrip(&p, ExitKind::MmioRead), pio + 2_635);
    }

    /// A read's second emulation pass on re-entry (complete_emulated_io()) is the read's
    /// alone: a write, a PIO exit and a CPUID exit are priced as without it.
    #[test]
    fn an_mmio_read_adds_its_completion_pass_and_nothing_else_does() {
        let mut p = Profile::load("intel-spr-vmx").unwrap();
        p.set("mmio_emulate_ns", 2_635.0, "ns", "test");
        let before: Vec<u64> = [ExitKind::PioOut, ExitKind::MmioWrite, ExitKind::Cpuid]
            .into_iter()
            .map(|k| roundtrip(&p, k))
            .collect();
        let read = roundtrip(&p, ExitKind::MmioRead);
        p.set("mmio_read_complete_ns", 331.0, "ns", "test");
        let after: Vec<u64> = [ExitKind::PioOut, ExitKind::MmioWrite, ExitKind::Cpuid]
            .into_iter()
            .map(|k| roundtrip(&p, k))
            .collect();
        assert_eq!(before, after);
        assert_eq!(roundtrip(&p, ExitKind::MmioRead), read + 331);
        assert_eq!(roundtrip(&p, ExitKind::MmioRead), after[1] + 331);
    }

    /// A model run is on its profile's clock, whatever the clock of the machine running it:
    /// the instruction-clock profile's inside a wall-clock host, the wall clock for a
    /// wall-clock profile inside a guest on QEMU's instruction clock.
    #[test]
    fn the_model_presents_its_profiles_clock() {
        use hvlab_core::host::Clock;
        let icount = Profile::load("tcg-icount-epyc").unwrap();
        assert_eq!(icount.clock, Clock::Icount);
        assert_eq!(
            ModelBackend::new(icount, host(), 1).host().clock,
            Clock::Icount
        );
        let mut guest = host();
        guest.clock = Clock::Icount;
        let wall = Profile::load("intel-spr-vmx").unwrap();
        assert_eq!(wall.clock, Clock::Wall);
        assert_eq!(ModelBackend::new(wall, guest, 1).host().clock, Clock::Wall);
    }
}
