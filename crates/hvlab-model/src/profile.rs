//! Cost profiles: what each primitive costs on one kind of host, every value with its unit and
//! where it came from.
//!
//! A profile is TOML:
//! ```toml
//! name = "this-host"
//! describes = "AMD EPYC under PVM, Linux 6.18, HZ=250"
//! mmu = "shadow"            # shadow | tdp | tdp-mmu (the MMU that handles stage-2 faults)
//! [costs.hz]
//! value = 250
//! unit = "Hz"
//! provenance = "kernel config (/proc/config.gz)"
//! ```
//! `hvlab calibrate` writes one measured on this host; built-ins describe hosts hvlab cannot run
//! on, each value cited.

use std::collections::BTreeMap;
use std::path::Path;

use hvlab_core::host::Clock;
use serde::{Deserialize, Serialize};

/// One cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// The number.
    pub value: f64,
    /// Its unit (`ns`, `Hz`, `jiffies`, `cycles`, `bool`, ...).
    pub unit: String,
    /// Where the number comes from.
    pub provenance: String,
    /// When the value is fitted rather than sourced: the one published result it was fitted
    /// on (the others are predictions; `hvlab fidelity` lists it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fitted_on: Option<String>,
    /// The experiment (`thread/setup`, as `hvlab fidelity` names its rows' experiments) the
    /// figure `fitted_on` belongs to: every row of that experiment that moves with this value
    /// re-shows the fit and is `fitted`, not a test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fitted_experiment: Option<String>,
}

/// Which MMU handles stage-2 faults, which decides prefetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MmuKind {
    /// Shadow paging (no EPT/NPT, or PVM): the legacy MMU, which prefetches.
    Shadow,
    /// EPT/NPT with the legacy (non-TDP-MMU) code: direct maps, prefetches.
    Tdp,
    /// EPT/NPT with the TDP MMU: no prefetch.
    TdpMmu,
}

/// A cost profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Short name (`--profile NAME`).
    pub name: String,
    /// The hardware and kernel it describes.
    pub describes: String,
    /// The stage-2 MMU.
    pub mmu: MmuKind,
    /// The KVM flavour of the host it describes, which a model run's host names (never the
    /// machine that computed it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flavour: Option<hvlab_core::host::KvmFlavour>,
    /// The CPUs of the host it describes, where its source gives them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    /// A built-in profile this one differs from: every cost it does not give is the base's
    /// (so a variant of a machine, e.g. another HZ, states only what differs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
    /// The clock its times are on: `icount` for a profile calibrated on QEMU's instruction
    /// clock, where every `ns` is one guest instruction (a model run on it is on that clock);
    /// absent is the wall clock.
    #[serde(default, skip_serializing_if = "Clock::is_wall")]
    pub clock: Clock,
    /// Costs by key.
    pub costs: BTreeMap<String, Cost>,
    /// The keys a model has read, shared by every clone of this profile: what a result
    /// depends on, so `hvlab fidelity` lists exactly the fitted values behind a thread's rows.
    #[serde(skip)]
    read: KeysRead,
}

/// The keys read from a profile and its clones.
#[derive(Debug, Clone, Default)]
struct KeysRead(std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>);

impl PartialEq for KeysRead {
    /// Which keys were read says nothing about the profile's values.
    fn eq(&self, _: &KeysRead) -> bool {
        true
    }
}

/// Profile errors.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum ProfileError {
    /// Unknown profile `{0}`: give a built-in name ({1}) or a path to a profile TOML.
    Unknown(String, String),
    /// Cannot read profile {0}: {1}
    Read(String, std::io::Error),
    /// Profile {0} is not valid TOML for a profile{1}: {2}
    Parse(String, String, Box<toml::de::Error>),
    /// Profile {profile} has no `{key}`, which {needed_by} needs; {have}; or add a [costs.{key}] table with value, unit and provenance, or run `hvlab calibrate` where the kvm backend can measure it.
    Missing {
        /// The profile.
        profile: String,
        /// The key.
        key: String,
        /// The model that needs it.
        needed_by: &'static str,
        /// Which built-in profiles give it, in words.
        have: String,
    },
    /// Cannot write profile {0}: {1}
    Write(String, std::io::Error),
    /// Profile {profile} is on the {clock} clock but its base {base} is on the {base_clock} clock: the costs it takes from the base would be of another clock; give it `clock = "{base_clock}"` or a base on the {clock} clock.
    BaseClock {
        /// The profile.
        profile: String,
        /// Its clock.
        clock: Clock,
        /// Its base.
        base: String,
        /// The base's clock.
        base_clock: Clock,
    },
    /// Profile {profile}: `costs.{key}` = {value} is out of range: {range}.
    BadValue {
        /// The profile.
        profile: String,
        /// The key.
        key: String,
        /// The value as read.
        value: f64,
        /// The allowed range, in words.
        range: String,
    },
}

impl ProfileError {
    /// Whether this is a failure to write, not a bad profile.
    pub fn is_write(&self) -> bool {
        matches!(self, ProfileError::Write(..))
    }
}

/// What values a cost may take.
#[derive(Debug, Clone, Copy)]
enum Range {
    /// A whole number in `min..=max`.
    Whole(f64, f64),
    /// Any number in `min..=max`.
    Real(f64, f64),
    /// 0 or 1.
    Flag,
}

impl Range {
    fn admits(self, v: f64) -> bool {
        match self {
            Range::Whole(lo, hi) => v.is_finite() && v.fract() == 0.0 && (lo..=hi).contains(&v),
            Range::Real(lo, hi) => v.is_finite() && (lo..=hi).contains(&v),
            Range::Flag => v == 0.0 || v == 1.0,
        }
    }

    fn describe(self) -> String {
        match self {
            Range::Whole(lo, hi) => format!("a whole number from {lo} to {hi}"),
            Range::Real(lo, hi) => format!("a finite number from {lo} to {hi}"),
            Range::Flag => "0 or 1".into(),
        }
    }
}

/// Longest time any one primitive may cost: 1000 s.
const MAX_NS: f64 = 1e12;

/// Every cost the models read, with its allowed range. A profile must give all of them.
const KEYS: &[(&str, Range)] = &[
    ("hz", Range::Whole(24.0, 10_000.0)),
    ("srcu_wakeup_ns", Range::Real(0.0, MAX_NS)),
    ("srcu_timer_cpu_busy", Range::Real(0.0, 1.0)),
    ("first_vcpu_adds_memslot", Range::Flag),
    ("ioctl_create_vm_ns", Range::Real(0.0, MAX_NS)),
    ("ioctl_tss_ns", Range::Real(0.0, MAX_NS)),
    ("ioctl_irqchip_ns", Range::Real(0.0, MAX_NS)),
    ("ioctl_pit_ns", Range::Real(0.0, MAX_NS)),
    ("ioctl_memslot_ns", Range::Real(0.0, MAX_NS)),
    ("ioctl_vcpu_ns", Range::Real(0.0, MAX_NS)),
    ("ioctl_ioeventfd_ns", Range::Real(0.0, MAX_NS)),
    ("ioctl_regs_ns", Range::Real(0.0, MAX_NS)),
    ("first_run_ns", Range::Real(0.0, MAX_NS)),
    ("vmm_gap_ns", Range::Real(0.0, MAX_NS)),
    ("stage2_fault_ns", Range::Real(0.0, MAX_NS)),
    ("host_fault_ns", Range::Real(0.0, MAX_NS)),
    ("host_fault_huge_ns", Range::Real(0.0, MAX_NS)),
    ("prefetch_page_ns", Range::Real(0.0, MAX_NS)),
    ("touch_page_ns", Range::Real(0.0, MAX_NS)),
    ("uffd_fault_ns", Range::Real(0.0, MAX_NS)),
    ("uffd_copy_page_ns", Range::Real(0.0, MAX_NS)),
    ("exit_userspace_ns", Range::Real(0.0, MAX_NS)),
    ("exit_kernel_ns", Range::Real(0.0, MAX_NS)),
    ("pebs_isolation", Range::Flag),
    ("pin_page_ns", Range::Real(0.0, MAX_NS)),
    ("repin_page_ns", Range::Real(0.0, MAX_NS)),
    ("unpin_page_ns", Range::Real(0.0, MAX_NS)),
    ("stage1_walk_page_ns", Range::Real(0.0, MAX_NS)),
    ("ctx_switch_ns", Range::Real(0.0, MAX_NS)),
    ("cpu_ghz", Range::Real(0.1, 10.0)),
    ("load_cycles", Range::Real(0.0, 1e4)),
    ("store_cycles", Range::Real(0.0, 1e4)),
    ("alu_cycles", Range::Real(0.0, 1e4)),
    ("sysreg_read_cycles", Range::Real(0.0, 1e4)),
    ("atomic_cycles", Range::Real(0.0, 1e4)),
    ("store_forward_stall_cycles", Range::Real(0.0, 1e4)),
    ("percpu_segment_base", Range::Flag),
    ("pte_write_ns", Range::Real(0.0, MAX_NS)),
    ("tlbi_broadcast_ns", Range::Real(0.0, MAX_NS)),
    ("tlbi_ack_per_cpu_ns", Range::Real(0.0, MAX_NS)),
    ("anon_fault_ns", Range::Real(0.0, MAX_NS)),
    ("fork_ns", Range::Real(0.0, MAX_NS)),
    ("exec_ns", Range::Real(0.0, MAX_NS)),
    ("memcg_create_ns", Range::Real(0.0, MAX_NS)),
    ("hotplug_section_ns", Range::Real(0.0, MAX_NS)),
    ("kernel_pgd_bytes", Range::Whole(0.0, 1_073_741_824.0)),
];

/// Costs added after profiles were first calibrated: checked when present, so a profile
/// `hvlab calibrate` wrote earlier still loads (the model names a missing one when a variant
/// needs it, and a fresh calibrate copies them from the built-in); every built-in gives them.
const LATER_KEYS: &[(&str, Range)] = &[
    ("exit_fastpath_cycles", Range::Real(0.0, 1e9)),
    ("msr_load_entry_cycles", Range::Real(0.0, 1e9)),
    ("msr_load_list_cycles", Range::Real(0.0, 1e9)),
    ("wrmsr_cycles", Range::Real(0.0, 1e9)),
    ("pin_fixed_ns", Range::Real(0.0, MAX_NS)),
    ("unpin_fixed_ns", Range::Real(0.0, MAX_NS)),
    ("stage2_map_page_ns", Range::Real(0.0, MAX_NS)),
    ("pmbirq_latency_ns", Range::Real(0.0, MAX_NS)),
    ("memslot_node_ns", Range::Real(0.0, MAX_NS)),
    ("srcu_local_handoff_ns", Range::Real(0.0, MAX_NS)),
    ("msr_write_cycles", Range::Real(0.0, 1e9)),
];

/// Costs only a measured host has (`hvlab calibrate` writes them): checked when present; the
/// model falls back to its simpler mechanism without them (each names its fallback).
const OPTIONAL_KEYS: &[(&str, Range)] = &[
    ("teardown_tick_phase_ns", Range::Real(0.0, MAX_NS)),
    ("teardown_tick_phase_iqr_ns", Range::Real(0.0, MAX_NS)),
    ("boot_teardown_tick_phase_ns", Range::Real(0.0, MAX_NS)),
    ("boot_teardown_tick_phase_iqr_ns", Range::Real(0.0, MAX_NS)),
    ("vmm_setup_ns", Range::Real(0.0, MAX_NS)),
    ("vmm_setup_iqr_ns", Range::Real(0.0, MAX_NS)),
    ("boot_vmm_setup_ns", Range::Real(0.0, MAX_NS)),
    ("boot_vmm_setup_iqr_ns", Range::Real(0.0, MAX_NS)),
    ("boot_thread_tick_bound", Range::Real(0.0, 1.0)),
    ("boot_thread_pull_ns", Range::Real(0.0, MAX_NS)),
    ("boot_sleep_late_ns", Range::Real(0.0, MAX_NS)),
    ("boot_exit_wake_ns", Range::Real(0.0, MAX_NS)),
    ("ioctl_cpuid_ns", Range::Real(0.0, MAX_NS)),
    ("boot_thread_start_ns", Range::Real(0.0, MAX_NS)),
    ("first_run_long_mode_ns", Range::Real(0.0, MAX_NS)),
    // How the host logs dirty pages (1: Intel PML); absent is write-protection.
    ("dirty_log_pml", Range::Flag),
    // Measured on the instruction clock first: where the boot thread's first run falls, and an
    // MMIO exit's instruction emulation.
    ("boot_thread_wait_ns", Range::Real(0.0, MAX_NS)),
    // The share of boot threads that first ran before their spawner went on to KVM_RUN (on one
    // CPU: the new thread preempted its spawner), and from that first run to the spawner's
    // KVM_RUN.
    ("boot_thread_first_share", Range::Real(0.0, 1.0)),
    ("boot_spawner_resume_ns", Range::Real(0.0, MAX_NS)),
    ("mmio_emulate_ns", Range::Real(0.0, MAX_NS)),
    // An MMIO read's second emulation pass on re-entry (complete_emulated_io()).
    ("mmio_read_complete_ns", Range::Real(0.0, MAX_NS)),
    // A boot order's memslot update, vCPU 0 running, where no grace period was in flight.
    ("boot_memslot_ns", Range::Real(0.0, MAX_NS)),
    // Whether the kernel the registering ioctls were measured on synchronizes in
    // `kvm_io_bus_register_dev()` (1: their costs hold that wait); absent is a kernel that
    // defers (every built-in profile's were measured on 6.18 or later, or assumed from those).
    ("registration_synchronizes", Range::Flag),
];

/// Built-in profiles: (name, TOML).
pub const BUILT_IN: &[(&str, &str)] = &[
    ("pvm-epyc", include_str!("../../../profiles/pvm-epyc.toml")),
    (
        "intel-spr-vmx",
        include_str!("../../../profiles/intel-spr-vmx.toml"),
    ),
    (
        "neoverse-n2-spe",
        include_str!("../../../profiles/neoverse-n2-spe.toml"),
    ),
    (
        "arm64-server-160",
        include_str!("../../../profiles/arm64-server-160.toml"),
    ),
    (
        "x86-vmx-hz100",
        include_str!("../../../profiles/x86-vmx-hz100.toml"),
    ),
    (
        "tcg-icount-epyc",
        include_str!("../../../profiles/tcg-icount-epyc.toml"),
    ),
];

/// The built-in profiles that give `key` themselves, as advice: `--profile NAME` runs with it.
/// Read from their text, so naming them never parses (or fails on) a profile.
fn built_ins_with(key: &str) -> String {
    let table = format!("[costs.{key}]");
    let names: Vec<&str> = BUILT_IN
        .iter()
        .filter(|(_, text)| text.contains(&table))
        .map(|(name, _)| *name)
        .collect();
    if names.is_empty() {
        "no built-in profile gives it".into()
    } else {
        format!(
            "a built-in profile that gives it runs instead (--profile {})",
            names.join(" or --profile ")
        )
    }
}

impl Profile {
    /// A built-in profile by name, or a TOML file by path.
    pub fn load(name_or_path: &str) -> Result<Profile, ProfileError> {
        if let Some((_, text)) = BUILT_IN.iter().find(|(n, _)| *n == name_or_path) {
            return Profile::parse(name_or_path, text);
        }
        let path = Path::new(name_or_path);
        if path.exists() {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ProfileError::Read(name_or_path.into(), e))?;
            return Profile::parse(name_or_path, &text);
        }
        Err(ProfileError::Unknown(
            name_or_path.into(),
            BUILT_IN
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
        ))
    }

    /// Parses profile TOML; `origin` names it in errors. Every cost the models read must be
    /// present and in its range (a negative time, NaN, infinity or `hz = 0` is refused here,
    /// not silently clamped later); costs hvlab does not know must at least be finite.
    pub fn parse(origin: &str, text: &str) -> Result<Profile, ProfileError> {
        let profile: Profile = toml::from_str(text).map_err(|e| {
            // Name the table the error is in: the TOML error shows the line, not the key.
            let section = e
                .span()
                .and_then(|span| text.get(..span.start.min(text.len())))
                .and_then(|before| {
                    before
                        .lines()
                        .rev()
                        .find(|l| l.trim_start().starts_with('['))
                })
                .map(|h| format!(
                    " (in {}: a cost is a table with a number `value`, a `unit` and a `provenance`)",
                    h.trim()
                ))
                .unwrap_or_default();
            ProfileError::Parse(origin.into(), section, Box::new(e))
        })?;
        let mut profile = profile;
        if let Some(base) = profile.base.clone() {
            // Only a built-in can be a base, and not the profile itself: no cycles, no files
            // reached through a profile.
            if base == profile.name || !BUILT_IN.iter().any(|(n, _)| *n == base) {
                return Err(ProfileError::Unknown(
                    base,
                    BUILT_IN
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join(", "),
                ));
            }
            let base_profile = Profile::load(&base)?;
            // A cost taken from the base is a time on the base's clock.
            if base_profile.clock != profile.clock {
                return Err(ProfileError::BaseClock {
                    profile: origin.into(),
                    clock: profile.clock,
                    base,
                    base_clock: base_profile.clock,
                });
            }
            profile.inherit(&base_profile, |provenance| provenance.to_string());
        }
        profile.validate(origin)?;
        Ok(profile)
    }

    /// Takes every cost this profile lacks from `base`, its provenance rewritten by
    /// `provenance`; returns the keys taken.
    pub fn inherit(&mut self, base: &Profile, provenance: impl Fn(&str) -> String) -> Vec<String> {
        let mut taken = Vec::new();
        for (key, cost) in &base.costs {
            if let std::collections::btree_map::Entry::Vacant(slot) = self.costs.entry(key.clone())
            {
                taken.push(key.clone());
                slot.insert(Cost {
                    provenance: provenance(&cost.provenance),
                    ..cost.clone()
                });
            }
        }
        taken
    }

    /// Checks every cost against its range; `origin` names the profile in errors.
    pub fn validate(&self, origin: &str) -> Result<(), ProfileError> {
        for (key, range) in KEYS {
            let Some(cost) = self.costs.get(*key) else {
                return Err(ProfileError::Missing {
                    profile: origin.into(),
                    key: (*key).into(),
                    needed_by: "the model",
                    have: built_ins_with(key),
                });
            };
            if !range.admits(cost.value) {
                return Err(ProfileError::BadValue {
                    profile: origin.into(),
                    key: (*key).into(),
                    value: cost.value,
                    range: range.describe(),
                });
            }
        }
        for (key, range) in LATER_KEYS.iter().chain(OPTIONAL_KEYS) {
            if let Some(cost) = self.costs.get(*key)
                && !range.admits(cost.value)
            {
                return Err(ProfileError::BadValue {
                    profile: origin.into(),
                    key: (*key).into(),
                    value: cost.value,
                    range: range.describe(),
                });
            }
        }
        for (key, cost) in &self.costs {
            if !cost.value.is_finite() {
                return Err(ProfileError::BadValue {
                    profile: origin.into(),
                    key: key.clone(),
                    value: cost.value,
                    range: "a finite number".into(),
                });
            }
        }
        Ok(())
    }

    /// A cost in whole nanoseconds (non-negative), for models that count time in `u64`.
    pub fn ns(&self, key: &str, needed_by: &'static str) -> Result<u64, ProfileError> {
        let v = self.get(key, needed_by)?;
        // Costs are non-negative nanoseconds well inside u64.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(v.max(0.0).round() as u64)
    }

    /// A cost the model `needed_by` cannot do without.
    pub fn get(&self, key: &str, needed_by: &'static str) -> Result<f64, ProfileError> {
        if let Ok(mut read) = self.read.0.lock() {
            read.insert(key.to_string());
        }
        self.costs
            .get(key)
            .map(|c| c.value)
            .ok_or_else(|| ProfileError::Missing {
                profile: self.name.clone(),
                key: key.into(),
                needed_by,
                have: built_ins_with(key),
            })
    }

    /// A cost only a measured host's profile gives (`hvlab calibrate` writes it), where the
    /// model leaves its mechanism unpriced without it: `None` when the profile has none.
    pub fn optional(&self, key: &str) -> Option<f64> {
        self.costs.contains_key(key).then(|| {
            if let Ok(mut read) = self.read.0.lock() {
                read.insert(key.to_string());
            }
            self.costs[key].value
        })
    }

    /// The keys read so far from this profile or any clone of it.
    pub fn keys_read(&self) -> std::collections::BTreeSet<String> {
        self.read.0.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Sets a cost.
    pub fn set(&mut self, key: &str, value: f64, unit: &str, provenance: impl Into<String>) {
        self.costs.insert(
            key.into(),
            Cost {
                value,
                unit: unit.into(),
                provenance: provenance.into(),
                fitted_on: None,
                fitted_experiment: None,
            },
        );
    }

    /// Writes the profile as TOML.
    pub fn write(&self, path: &Path) -> Result<(), ProfileError> {
        let text = toml::to_string_pretty(self).map_err(|e| {
            ProfileError::Write(path.display().to_string(), std::io::Error::other(e))
        })?;
        std::fs::write(path, text).map_err(|e| ProfileError::Write(path.display().to_string(), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_cost_names_the_built_ins_that_give_it() {
        let p = Profile::load("neoverse-n2-spe").unwrap();
        let e = p.get("dirty_wp_fault_ns", "dirty").unwrap_err().to_string();
        assert!(
            e.contains("--profile pvm-epyc") && !e.contains("intel"),
            "{e}"
        );
        assert!(built_ins_with("no_such_cost").contains("no built-in profile"));
        assert!(built_ins_with("hz").contains("--profile intel-spr-vmx or --profile"));
    }

    #[test]
    fn every_built_in_profile_parses_and_cites_every_value() {
        for (name, text) in BUILT_IN {
            let p = Profile::parse(name, text).unwrap();
            assert_eq!(&p.name, name);
            assert!(!p.costs.is_empty());
            for (key, c) in &p.costs {
                assert!(
                    c.provenance.len() > 20,
                    "{name}.{key} has no real provenance: {:?}",
                    c.provenance
                );
                assert!(!c.unit.is_empty(), "{name}.{key} has no unit");
                assert!(
                    c.value.is_finite() && c.value >= 0.0,
                    "{name}.{key} = {}",
                    c.value
                );
            }
        }
    }

    #[test]
    fn every_built_in_gives_the_later_keys() {
        for (name, text) in BUILT_IN {
            let p = Profile::parse(name, text).unwrap();
            for (key, _) in LATER_KEYS {
                assert!(p.costs.contains_key(*key), "{name} lacks {key}");
            }
        }
    }

    /// The instruction clock's profile was calibrated, so it gives every cost a calibration
    /// writes, the measured-only ones too, each said to be in guest instructions.
    #[test]
    fn the_instruction_clock_profile_gives_every_key_in_instructions() {
        let p = Profile::load("tcg-icount-epyc").unwrap();
        for (key, _) in KEYS.iter().chain(LATER_KEYS).chain(OPTIONAL_KEYS) {
            if *key == "dirty_log_pml" || *key == "boot_memslot_ns" {
                // A VMX feature: absent on SVM; and on 7.3 the boot memslot update always
                // waits for the boot registrations' grace period, so it has no unstalled cost.
                continue;
            }
            assert!(p.costs.contains_key(*key), "tcg-icount-epyc lacks {key}");
        }
        assert!(p.describes.contains("instruction clock"), "{}", p.describes);
        for (key, c) in &p.costs {
            if c.provenance
                .contains("calibrated on QEMU's instruction clock")
            {
                assert!(
                    c.provenance.contains("QEMU 7.2") && c.provenance.contains("hvlab vm"),
                    "{key}: {}",
                    c.provenance
                );
            } else {
                assert!(
                    c.provenance
                        .starts_with("not measured on the instruction clock"),
                    "{key}"
                );
            }
        }
    }

    /// A profile names its clock when it is QEMU's instruction clock; one that names none
    /// is on the wall clock, and a calibrated profile keeps its clock through a file.
    #[test]
    fn a_profile_is_on_the_wall_clock_unless_it_names_the_instruction_clock() {
        let wall = Profile::load("intel-spr-vmx").unwrap();
        assert_eq!(wall.clock, Clock::Wall);
        assert!(!BUILT_IN[1].1.contains("\nclock ="));
        let icount = Profile::load("tcg-icount-epyc").unwrap();
        assert_eq!(icount.clock, Clock::Icount);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        icount.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("clock = \"icount\""), "{text}");
        assert_eq!(
            Profile::load(path.to_str().unwrap()).unwrap().clock,
            Clock::Icount
        );
        wall.write(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("clock ="), "{text}");
        // A clock hvlab does not know is refused, naming the profile.
        let bad = text.replacen("mmu =", "clock = \"cycles\"\nmmu =", 1);
        let e = Profile::parse("mine.toml", &bad).unwrap_err().to_string();
        assert!(e.contains("mine.toml"), "{e}");
    }

    /// A profile's base gives costs on the base's clock: a profile on another clock cannot
    /// take them.
    #[test]
    fn a_base_on_another_clock_is_refused() {
        let text = "name = \"mine\"\ndescribes = \"x\"\nmmu = \"tdp-mmu\"\nbase = \"tcg-icount-epyc\"\n[costs]\n";
        let e = Profile::parse("mine.toml", text).unwrap_err().to_string();
        assert!(
            e.contains("mine.toml")
                && e.contains("wall")
                && e.contains("tcg-icount-epyc")
                && e.contains("clock = \"icount\""),
            "{e}"
        );
        let same = text.replacen("base =", "clock = \"icount\"\nbase =", 1);
        let p = Profile::parse("mine.toml", &same).unwrap();
        assert_eq!(p.clock, Clock::Icount);
    }

    #[test]
    fn unknown_names_list_the_built_ins() {
        let e = Profile::load("nonesuch").unwrap_err().to_string();
        assert!(e.contains("pvm-epyc") && e.contains("path"), "{e}");
    }

    #[test]
    fn a_missing_cost_names_the_key_and_the_fix() {
        let p = Profile::load("pvm-epyc").unwrap();
        let e = p.get("warp_drive_ns", "srcu").unwrap_err().to_string();
        assert!(
            e.contains("warp_drive_ns") && e.contains("srcu") && e.contains("calibrate"),
            "{e}"
        );
    }

    #[test]
    fn profiles_round_trip_through_toml() {
        let p = Profile::load("pvm-epyc").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        p.write(&path).unwrap();
        assert_eq!(Profile::load(path.to_str().unwrap()).unwrap(), p);
    }

    #[test]
    fn a_profile_with_a_base_states_only_what_differs() {
        let base = Profile::load("intel-spr-vmx").unwrap();
        let hz100 = Profile::load("x86-vmx-hz100").unwrap();
        assert_eq!(hz100.get("hz", "test").unwrap(), 100.0);
        // The thread's host differs in HZ and in how busy its CPUs are, nothing else.
        for (key, cost) in &base.costs {
            if key != "hz" && key != "srcu_timer_cpu_busy" {
                assert_eq!(hz100.costs[key], *cost, "{key}");
            }
        }
        let own = "name = \"x\"\ndescribes = \"x\"\nmmu = \"shadow\"\nbase = \"x\"\n[costs]\n";
        assert!(matches!(
            Profile::parse("x", own),
            Err(ProfileError::Unknown(..))
        ));
    }
}
