//! `--set key=value` parameters, validated against each scenario's declared parameters.

use std::collections::BTreeMap;

use serde::Serialize;

use super::ScenarioInfo;
use crate::error::InputError;

/// A parameter a scenario accepts.
#[derive(Debug, Clone, Serialize)]
pub struct ParamInfo {
    /// Key for --set.
    pub name: &'static str,
    /// Default value, as it would be written on the command line (empty: unset).
    pub default: &'static str,
    /// What it does.
    pub doc: &'static str,
    /// Only the model reads it; a real backend runs its kernel as it is.
    pub model_only: bool,
}

/// The parameters of one run: defaults overlaid with --set values.
#[derive(Debug, Clone)]
pub struct Settings {
    scenario: &'static str,
    model_only: Vec<&'static str>,
    values: BTreeMap<String, String>,
    explicit: std::collections::BTreeSet<String>,
}

/// A parameter set in code, typed: each scenario's `Set` enum spells its values as its own
/// parser reads them back, so the lab never writes `key=value` text.
pub trait SetParam: std::fmt::Debug + Sync {
    /// The key, and the value as `--set` spells it.
    fn key_value(&self) -> (&'static str, String);
}

/// Typed parameters of any scenario, held by reference (showcases, validation points and the
/// lab's setups are fixed in code).
impl<T: SetParam + ?Sized> SetParam for &T {
    fn key_value(&self) -> (&'static str, String) {
        (**self).key_value()
    }
}

/// Typed parameters of whichever scenario a shared struct (a showcase, a validation point)
/// belongs to: `sets_of` spells them for the run request, once.
pub type Sets = &'static [&'static dyn SetParam];

/// A byte size as `--set` spells it: the largest binary unit that divides it whole (`6GiB`,
/// `64MiB`, `4096`), which [`parse_size`] reads back to the same number.
pub fn size_text(bytes: u64) -> String {
    const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
    UNITS
        .iter()
        .find(|(shift, _)| bytes != 0 && bytes.is_multiple_of(1u64 << shift))
        .map_or_else(
            || bytes.to_string(),
            |(shift, unit)| format!("{}{unit}", bytes >> shift),
        )
}

/// The `--set` arguments of typed parameters, in order: the one place typed parameters
/// become the text `Settings` reads.
pub fn sets_of<P: SetParam>(params: &[P]) -> Vec<String> {
    params
        .iter()
        .map(|p| {
            let (key, value) = p.key_value();
            format!("{key}={value}")
        })
        .collect()
}

/// Splits `key=value`.
pub fn parse_set(arg: &str) -> Result<(String, String), InputError> {
    match arg.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(InputError::SetSyntax(arg.to_string())),
    }
}

impl Settings {
    /// Validates `sets` against the scenario's parameters.
    pub fn parse(info: &ScenarioInfo, sets: &[String]) -> Result<Settings, InputError> {
        let mut values: BTreeMap<String, String> = info
            .params
            .iter()
            .map(|p| (p.name.to_string(), p.default.to_string()))
            .collect();
        let mut explicit = std::collections::BTreeSet::new();
        for arg in sets {
            let (k, v) = parse_set(arg)?;
            if !values.contains_key(&k) {
                return Err(InputError::UnknownParam {
                    key: k,
                    scenario: info.name.to_string(),
                    known: info
                        .params
                        .iter()
                        .map(|p| p.name)
                        .collect::<Vec<_>>()
                        .join(", "),
                });
            }
            values.insert(k.clone(), v);
            explicit.insert(k);
        }
        Ok(Settings {
            scenario: info.name,
            model_only: info
                .params
                .iter()
                .filter(|p| p.model_only)
                .map(|p| p.name)
                .collect(),
            values,
            explicit,
        })
    }

    /// Whether `key` was given with --set.
    pub fn is_set(&self, key: &str) -> bool {
        self.explicit.contains(key)
    }

    /// Refuses model-only parameters when `backend` is a real one.
    pub fn reject_model_only_on(
        &self,
        backend: crate::backend::Capabilities,
    ) -> Result<(), InputError> {
        if !backend.modelled {
            self.reject_model_only()?;
        }
        Ok(())
    }

    /// Refuses model-only parameters given to a real backend.
    pub fn reject_model_only(&self) -> Result<(), InputError> {
        match self.model_only.iter().find(|k| self.is_set(k)) {
            Some(key) => Err(InputError::BadValue {
                key: (*key).to_string(),
                value: self.raw(key).to_string(),
                why: format!(
                    "{key} is a model parameter; the kvm backend runs this kernel as it is (add --backend model)"
                ),
            }),
            None => Ok(()),
        }
    }

    /// The raw value (empty when unset).
    pub fn raw(&self, key: &str) -> &str {
        self.values.get(key).map_or("", String::as_str)
    }

    /// A whole number within `range`.
    pub fn u32_in(
        &self,
        key: &str,
        range: std::ops::RangeInclusive<u32>,
    ) -> Result<u32, InputError> {
        let raw = self.raw(key);
        raw.parse::<u32>()
            .ok()
            .filter(|v| range.contains(v))
            .ok_or_else(|| InputError::BadValue {
                key: key.to_string(),
                value: raw.to_string(),
                why: format!(
                    "{} takes a whole number from {} to {}",
                    key,
                    range.start(),
                    range.end()
                ),
            })
    }

    /// One of `choices`.
    pub fn choice<'a>(&self, key: &str, choices: &[&'a str]) -> Result<&'a str, InputError> {
        let raw = self.raw(key);
        choices
            .iter()
            .find(|c| **c == raw)
            .copied()
            .ok_or_else(|| InputError::BadValue {
                key: key.to_string(),
                value: raw.to_string(),
                why: format!("{key} is one of {}", choices.join(", ")),
            })
    }

    /// A byte size such as `256MiB`, `6GiB`, `512M`, `4096`.
    pub fn bytes(&self, key: &str) -> Result<u64, InputError> {
        let raw = self.raw(key);
        parse_size(raw).ok_or_else(|| InputError::BadValue {
            key: key.to_string(),
            value: raw.to_string(),
            why: "sizes are a number with an optional unit: 256MiB, 6GiB, 512M, 4096".into(),
        })
    }

    /// Every parameter in effect on `backend`, for the run record (a real backend's record
    /// does not claim the model's knobs).
    pub fn to_json(
        &self,
        backend: crate::backend::BackendKind,
    ) -> BTreeMap<String, serde_json::Value> {
        self.values
            .iter()
            .filter(|(k, _)| {
                backend.capabilities().modelled || !self.model_only.contains(&k.as_str())
            })
            .map(|(k, v)| {
                let value = v
                    .parse::<u64>()
                    .map(serde_json::Value::from)
                    .unwrap_or_else(|_| serde_json::Value::from(v.clone()));
                (k.clone(), value)
            })
            .collect()
    }

    /// The scenario these settings belong to.
    pub fn scenario(&self) -> &'static str {
        self.scenario
    }
}

/// Parses `256MiB`, `6GiB`, `1G`, `512k`, `4096` (binary units; `B` optional).
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().ok()?;
    let shift = match unit
        .trim()
        .to_ascii_lowercase()
        .trim_end_matches('b')
        .trim_end_matches('i')
    {
        "" => 0,
        "k" => 10,
        "m" => 20,
        "g" => 30,
        "t" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::lifecycle::INFO;

    #[test]
    fn set_needs_key_equals_value() {
        assert_eq!(
            parse_set("devices=8").unwrap(),
            ("devices".into(), "8".into())
        );
        assert!(matches!(
            parse_set("devices"),
            Err(InputError::SetSyntax(_))
        ));
        assert!(matches!(parse_set("=8"), Err(InputError::SetSyntax(_))));
    }

    #[test]
    fn unknown_keys_are_named_with_the_known_ones() {
        let err = Settings::parse(&INFO, &["devcies=8".into()]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("devcies") && msg.contains("devices"), "{msg}");
    }

    #[test]
    fn out_of_range_numbers_say_the_range() {
        let s = Settings::parse(&INFO, &["vcpus=0".into()]).unwrap();
        let msg = s.u32_in("vcpus", 1..=64).unwrap_err().to_string();
        assert!(msg.contains("from 1 to 64"), "{msg}");
        let s = Settings::parse(&INFO, &["vcpus=two".into()]).unwrap();
        assert!(s.u32_in("vcpus", 1..=64).is_err());
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("256MiB"), Some(256 << 20));
        assert_eq!(parse_size("6GiB"), Some(6 << 30));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("512k"), Some(512 << 10));
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("4096B"), Some(4096));
        assert_eq!(parse_size("lots"), None);
        assert_eq!(parse_size("12XB"), None);
        assert_eq!(parse_size("99999999999T"), None);
    }

    #[test]
    fn sizes_are_spelled_as_they_parse_back() {
        for bytes in [
            6u64 << 30,
            64 << 20,
            16 << 20,
            512 << 10,
            4096,
            4097,
            3 << 40,
            0,
        ] {
            assert_eq!(parse_size(&size_text(bytes)), Some(bytes), "{bytes}");
        }
        assert_eq!(size_text(6 << 30), "6GiB");
        assert_eq!(size_text(128 << 20), "128MiB");
        assert_eq!(size_text(4097), "4097");
    }

    #[test]
    fn defaults_apply_and_are_recorded() {
        let s = Settings::parse(&INFO, &[]).unwrap();
        assert_eq!(s.u32_in("vcpus", 1..=64).unwrap(), 1);
        assert!(
            s.to_json(crate::backend::BackendKind::Kvm)
                .contains_key("devices")
        );
        assert!(
            !s.to_json(crate::backend::BackendKind::Kvm)
                .contains_key("strategy")
        );
        assert!(
            s.to_json(crate::backend::BackendKind::Model)
                .contains_key("strategy")
        );
    }
}
