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
    /// Costs by key.
    pub costs: BTreeMap<String, Cost>,
}

/// Profile errors.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum ProfileError {
    /// Unknown profile `{0}`: give a built-in name ({1}) or a path to a profile TOML.
    Unknown(String, String),
    /// Cannot read profile {0}: {1}
    Read(String, std::io::Error),
    /// Profile {0} is not valid TOML for a profile: {1}
    Parse(String, toml::de::Error),
    /// Profile {profile} has no `{key}`, which {needed_by} needs; add it (see profiles/this-host.example.toml) or run `hvlab calibrate`.
    Missing {
        /// The profile.
        profile: String,
        /// The key.
        key: String,
        /// The model that needs it.
        needed_by: &'static str,
    },
    /// Cannot write profile {0}: {1}
    Write(String, std::io::Error),
}

/// Built-in profiles: (name, TOML).
pub const BUILT_IN: &[(&str, &str)] = &[
    ("pvm-epyc", include_str!("../../profiles/pvm-epyc.toml")),
    (
        "intel-spr-vmx",
        include_str!("../../profiles/intel-spr-vmx.toml"),
    ),
    (
        "neoverse-n2-spe",
        include_str!("../../profiles/neoverse-n2-spe.toml"),
    ),
    (
        "arm64-server-160",
        include_str!("../../profiles/arm64-server-160.toml"),
    ),
];

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

    /// Parses profile TOML; `origin` names it in errors.
    pub fn parse(origin: &str, text: &str) -> Result<Profile, ProfileError> {
        toml::from_str(text).map_err(|e| ProfileError::Parse(origin.into(), e))
    }

    /// A cost the model `needed_by` cannot do without.
    pub fn get(&self, key: &str, needed_by: &'static str) -> Result<f64, ProfileError> {
        self.costs
            .get(key)
            .map(|c| c.value)
            .ok_or_else(|| ProfileError::Missing {
                profile: self.name.clone(),
                key: key.into(),
                needed_by,
            })
    }

    /// Sets a cost.
    pub fn set(&mut self, key: &str, value: f64, unit: &str, provenance: impl Into<String>) {
        self.costs.insert(
            key.into(),
            Cost {
                value,
                unit: unit.into(),
                provenance: provenance.into(),
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
}
