//! Scenario parameters, each declared once: a typed table entry (its name, what it does, the
//! values it takes, and how `--set` text reads into the scenario's own `Params` type and is
//! spelled back), after cloud-hypervisor's `performance-metrics` table of typed controls. A
//! scenario's defaults are its `Params::default()`; code (fidelity, showcases, calibration,
//! validation points) builds `Params` values directly. Text appears only at the edge: `--set`
//! and a sweep's grid are read once here ([`parse`]), and a run record's parameters are spelled
//! here ([`record`]).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::InputError;
use hvlab_core::{BackendKind, Capabilities};

/// The values a parameter takes, as `hvlab list` shows them and its reader checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Values {
    /// A whole number in this range (inclusive).
    Range(u32, u32),
    /// One of these words.
    Choices(&'static [&'static str]),
    /// What the doc says (sizes, lists, numbers the host bounds).
    Described,
}

/// One parameter of a scenario whose parameters are `P`: the one declaration of it.
pub struct Param<P: 'static> {
    /// Key for `--set`.
    pub name: &'static str,
    /// What it does.
    pub doc: &'static str,
    /// The values it takes.
    pub values: Values,
    /// Only the model reads it; a real backend runs its kernel as it is.
    pub model_only: bool,
    /// Reads `--set` text into `P` (checked against [`Param::values`]: see [`Text`]).
    pub read: fn(&mut P, &Text<'_>) -> Result<(), InputError>,
    /// The value in `P` as `--set` spells it (empty: unset), which `read` reads back.
    pub spell: fn(&P) -> String,
}

impl<P> std::fmt::Debug for Param<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Param")
            .field("name", &self.name)
            .field("values", &self.values)
            .finish_non_exhaustive()
    }
}

/// A parameter that is a whole number within a range, kept in the field of its name (`model`:
/// only the model reads it): `whole!(devices, "doc", 0, 256)`.
macro_rules! whole {
    ($field:ident, $doc:expr, $low:expr, $high:expr) => {
        $crate::scenario::params::whole!($field, $doc, $low, $high, false)
    };
    ($field:ident, $doc:expr, $low:expr, $high:expr, model) => {
        $crate::scenario::params::whole!($field, $doc, $low, $high, true)
    };
    ($field:ident, $doc:expr, $low:expr, $high:expr, $model_only:expr) => {
        $crate::scenario::params::Param {
            name: stringify!($field),
            doc: $doc,
            values: $crate::scenario::params::Values::Range($low, $high),
            model_only: $model_only,
            read: |p, t| {
                p.$field = t.whole()?.into();
                Ok(())
            },
            spell: |p| p.$field.to_string(),
        }
    };
}
pub(crate) use whole;

/// A parameter that picks one of a [`Choice`]'s values, kept in the field of its name, or of
/// the name given first (`model`: only the model reads it):
/// `choice!("spacing" => back_to_back, SPACING, "doc", model)`.
macro_rules! choice {
    ($field:ident, $choice:expr, $doc:expr $(, $model:ident)?) => {
        $crate::scenario::params::choice!(stringify!($field) => $field, $choice, $doc $(, $model)?)
    };
    ($name:expr => $field:ident, $choice:expr, $doc:expr) => {
        $crate::scenario::params::choice!(@ $name, $field, $choice, $doc, false)
    };
    ($name:expr => $field:ident, $choice:expr, $doc:expr, model) => {
        $crate::scenario::params::choice!(@ $name, $field, $choice, $doc, true)
    };
    (@ $name:expr, $field:ident, $choice:expr, $doc:expr, $model_only:expr) => {
        $crate::scenario::params::Param {
            name: $name,
            doc: $doc,
            values: $crate::scenario::params::Values::Choices(&$choice.names),
            model_only: $model_only,
            read: |p, t| {
                p.$field = $choice.read(t)?;
                Ok(())
            },
            spell: |p| $choice.name(p.$field).to_string(),
        }
    };
}
pub(crate) use choice;

/// A parameter that is a byte size (`256MiB`, `4096`), kept in the field given, spelled as
/// [`size_text`] spells it: `bytes!("size" => size_bytes, "doc")`.
macro_rules! bytes {
    ($name:expr => $field:ident, $doc:expr) => {
        $crate::scenario::params::Param {
            name: $name,
            doc: $doc,
            values: $crate::scenario::params::Values::Described,
            model_only: false,
            read: |p, t| {
                p.$field = t.bytes()?;
                Ok(())
            },
            spell: |p| $crate::scenario::params::size_text(p.$field),
        }
    };
}
pub(crate) use bytes;

/// A parameter's `--set` text, with what its reader needs to check it: the declaration (its
/// name and values, for messages) and what the backend can do (limits that are the host's).
#[derive(Debug, Clone, Copy)]
pub struct Text<'a> {
    /// The text after `key=`.
    pub raw: &'a str,
    /// The parameter's name.
    pub name: &'static str,
    /// The parameter's values.
    pub values: Values,
    /// What the backend the run is for can do.
    pub can: Capabilities,
}

impl Text<'_> {
    /// The error for this value, saying `why`.
    pub fn bad(&self, why: impl Into<String>) -> InputError {
        InputError::BadValue {
            key: self.name.to_string(),
            value: self.raw.to_string(),
            why: why.into(),
        }
    }

    /// A whole number within the declared [`Values::Range`].
    pub fn whole(&self) -> Result<u32, InputError> {
        let Values::Range(low, high) = self.values else {
            return Err(self.bad("hvlab declares no range for it (a bug to report)"));
        };
        self.raw
            .parse::<u32>()
            .ok()
            .filter(|v| (low..=high).contains(v))
            .ok_or_else(|| {
                self.bad(format!(
                    "{} takes a whole number from {low} to {high}",
                    self.name
                ))
            })
    }

    /// A whole number within the declared range, or `None` for empty text (unset).
    pub fn optional_whole(&self) -> Result<Option<u32>, InputError> {
        match self.raw {
            "" => Ok(None),
            _ => self.whole().map(Some),
        }
    }

    /// A flag written 0 or 1 (declared as the range 0-1).
    pub fn flag(&self) -> Result<bool, InputError> {
        self.whole().map(|v| v == 1)
    }

    /// Its position among the declared [`Values::Choices`].
    pub fn choice(&self) -> Result<usize, InputError> {
        let Values::Choices(choices) = self.values else {
            return Err(self.bad("hvlab declares no choices for it (a bug to report)"));
        };
        choices
            .iter()
            .position(|c| *c == self.raw)
            .ok_or_else(|| self.bad(format!("{} is one of {}", self.name, choices.join(", "))))
    }

    /// A byte size such as `256MiB`, `6GiB`, `512M`, `4096`.
    pub fn bytes(&self) -> Result<u64, InputError> {
        parse_size(self.raw).ok_or_else(|| {
            self.bad("sizes are a number with an optional unit: 256MiB, 6GiB, 512M, 4096")
        })
    }
}

/// The words of a parameter that picks one of `N` typed values, beside the values: the one
/// place a word and its value meet, read by [`Choice::read`] and spelled by [`Choice::name`].
#[derive(Debug)]
pub struct Choice<T: 'static, const N: usize> {
    /// The words, as `--set` takes them ([`Values::Choices`] of the parameter).
    pub names: [&'static str; N],
    /// The value each word stands for.
    pub values: [T; N],
}

impl<T: Copy + PartialEq, const N: usize> Choice<T, N> {
    /// The value `text` names (its declared choices are [`Choice::names`]).
    pub fn read(&self, text: &Text<'_>) -> Result<T, InputError> {
        let i = text.choice()?;
        self.values
            .get(i)
            .copied()
            .ok_or_else(|| text.bad("hvlab declares other choices for it (a bug to report)"))
    }

    /// The word for `value`.
    pub fn name(&self, value: T) -> &'static str {
        self.values
            .iter()
            .position(|v| *v == value)
            .and_then(|i| self.names.get(i))
            .copied()
            .unwrap_or("")
    }
}

/// A parameter as `hvlab list` and a record's reader see it, whatever the scenario's type.
#[derive(Debug, Clone, Serialize)]
pub struct ParamInfo {
    /// Key for --set.
    pub name: &'static str,
    /// The default, as `--set` spells it (empty: unset).
    pub default: String,
    /// What it does.
    pub doc: &'static str,
    /// Only the model reads it.
    pub model_only: bool,
    /// The whole numbers it takes, when it declares a range.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range: Option<[u32; 2]>,
    /// The words it takes, when it declares choices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub choices: Option<&'static [&'static str]>,
}

/// The table as `hvlab list` shows it, with each default spelled from `P::default()`.
pub fn infos<P: Default>(table: &[Param<P>]) -> Vec<ParamInfo> {
    let defaults = P::default();
    table
        .iter()
        .map(|p| ParamInfo {
            name: p.name,
            default: (p.spell)(&defaults),
            doc: p.doc,
            model_only: p.model_only,
            range: match p.values {
                Values::Range(low, high) => Some([low, high]),
                _ => None,
            },
            choices: match p.values {
                Values::Choices(c) => Some(c),
                _ => None,
            },
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

/// `--set key=value` arguments read once into the scenario's parameters: its defaults with
/// each given value read over them, in the table's order. A key the table lacks names the
/// known ones; a model parameter given to a real backend (`can` not modelled) is refused.
pub fn parse<P: Default>(
    scenario: &str,
    table: &[Param<P>],
    sets: &[String],
    can: Capabilities,
) -> Result<P, InputError> {
    let mut given: BTreeMap<&'static str, String> = BTreeMap::new();
    for arg in sets {
        let (key, value) = parse_set(arg)?;
        let Some(param) = table.iter().find(|p| p.name == key) else {
            return Err(InputError::UnknownParam {
                key,
                scenario: scenario.to_string(),
                known: table.iter().map(|p| p.name).collect::<Vec<_>>().join(", "),
            });
        };
        given.insert(param.name, value);
    }
    let mut params = P::default();
    for param in table {
        if let Some(raw) = given.get(param.name) {
            (param.read)(
                &mut params,
                &Text {
                    raw,
                    name: param.name,
                    values: param.values,
                    can,
                },
            )?;
        }
    }
    if !can.modelled
        && let Some(param) = table
            .iter()
            .find(|p| p.model_only && given.contains_key(p.name))
    {
        let key = param.name;
        return Err(InputError::BadValue {
            key: key.to_string(),
            value: given[key].clone(),
            why: format!(
                "{key} is a model parameter; the kvm backend runs this kernel as it is (add --backend model)"
            ),
        });
    }
    Ok(params)
}

/// Every parameter in effect on `backend`, for the run record, spelled as `--set` spells it
/// (numbers as numbers); a real backend's record does not claim the model's knobs.
pub fn record<P>(
    table: &[Param<P>],
    params: &P,
    backend: BackendKind,
) -> BTreeMap<String, serde_json::Value> {
    table
        .iter()
        .filter(|p| backend.capabilities().modelled || !p.model_only)
        .map(|p| {
            let text = (p.spell)(params);
            let value = text
                .parse::<u64>()
                .map_or_else(|_| serde_json::Value::from(text), serde_json::Value::from);
            (p.name.to_string(), value)
        })
        .collect()
}

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
    use crate::scenario::lifecycle::{LifecycleParams, PARAMS};

    fn lifecycle(sets: &[&str], backend: BackendKind) -> Result<LifecycleParams, InputError> {
        let sets: Vec<String> = sets.iter().map(ToString::to_string).collect();
        parse("lifecycle", &PARAMS, &sets, backend.capabilities())
    }

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
        let msg = lifecycle(&["devcies=8"], BackendKind::Model)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("devcies") && msg.contains("devices"), "{msg}");
    }

    #[test]
    fn out_of_range_numbers_say_the_declared_range() {
        let msg = lifecycle(&["devices=300"], BackendKind::Model)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("from 0 to 256"), "{msg}");
        assert!(lifecycle(&["devices=two"], BackendKind::Model).is_err());
        let listed = infos(&PARAMS);
        let devices = listed.iter().find(|p| p.name == "devices").unwrap();
        assert_eq!(devices.range, Some([0, 256]));
    }

    #[test]
    fn model_parameters_are_refused_on_a_real_backend() {
        let msg = lifecycle(&["strategy=always-sync"], BackendKind::Kvm)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("model parameter"), "{msg}");
        assert!(lifecycle(&["strategy=always-sync"], BackendKind::Model).is_ok());
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
        let p = lifecycle(&[], BackendKind::Kvm).unwrap();
        assert_eq!(p.vcpus, 1);
        let kvm = record(&PARAMS, &p, BackendKind::Kvm);
        assert!(kvm.contains_key("devices"));
        assert!(!kvm.contains_key("strategy"));
        assert!(record(&PARAMS, &p, BackendKind::Model).contains_key("strategy"));
    }

    /// Every value the table spells reads back to itself: text written into a record or a
    /// sweep's key is the text the parser reads.
    #[test]
    fn every_scenario_reads_back_what_it_spells() {
        for kind in crate::scenario::Kind::ALL {
            let defaults = kind.defaults();
            let sets: Vec<String> = kind
                .param_infos()
                .iter()
                .filter(|p| !p.default.is_empty())
                .map(|p| format!("{}={}", p.name, p.default))
                .collect();
            let read = kind
                .parse(&sets, BackendKind::Model.capabilities())
                .unwrap();
            assert_eq!(
                format!("{read:?}"),
                format!("{defaults:?}"),
                "{}",
                kind.name()
            );
        }
    }
}
