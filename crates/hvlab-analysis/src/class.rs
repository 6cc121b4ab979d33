//! The one vocabulary of verdicts, a type per level: what one metric's comparison says
//! ([`MetricClass`]: `run`'s verdicts, `compare`, the suite's summary, a kab's ranked metric) and
//! what a kernel A/B says of a whole variant judged on many metrics ([`VariantClass`]: kab,
//! `--per-patch`, bisect). Each enum is declared in its display order (`Ord` follows it), so a
//! tally sorts by the class itself; every partition of the classes is a `match` without a
//! wildcard, here or in the renderer, so a new class does not compile until each one places it.

use serde::{Deserialize, Serialize};

/// One metric, B against A, judged by the rule ([`crate::verdict::call`]) the way the metric is
/// better. Serialized as the lowercase words scripts match on (`"no change"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum MetricClass {
    /// B is better by more than the threshold, established (lower, or higher for a
    /// higher-is-better metric).
    #[serde(rename = "faster")]
    Faster,
    /// B is worse by more than the threshold, established: for a gate, a regression.
    #[serde(rename = "slower")]
    Slower,
    /// No difference beyond the threshold, where the test could have called one.
    #[serde(rename = "no change")]
    NoChange,
    /// Nothing can be said yet (too few samples, a level out of reach, a difference not
    /// established): the verdict says what would decide it.
    #[serde(rename = "not decided")]
    NotDecided,
}

impl MetricClass {
    /// The word printed (the JSON word in capitals).
    pub fn word(self) -> &'static str {
        match self {
            MetricClass::Faster => "FASTER",
            MetricClass::Slower => "SLOWER",
            MetricClass::NoChange => "NO CHANGE",
            MetricClass::NotDecided => "NOT DECIDED",
        }
    }

    /// Whether a difference was called, either way.
    pub fn called(self) -> bool {
        match self {
            MetricClass::Faster | MetricClass::Slower => true,
            MetricClass::NoChange | MetricClass::NotDecided => false,
        }
    }
}

impl std::fmt::Display for MetricClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

/// A whole variant of a kernel A/B, judged on its metrics, stalls and the patched functions'
/// calls. Serialized as the printed word (`"NO CHANGE"`), as kab's JSON has always said it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum VariantClass {
    /// A's recurring stall is gone on B, and the stall count is established lower.
    #[serde(rename = "FIXED")]
    Fixed,
    /// B is established better on a judged metric, and worse on none.
    #[serde(rename = "IMPROVED")]
    Improved,
    /// B is established worse on a judged metric, gained a recurring stall, or failed what A
    /// ran.
    #[serde(rename = "REGRESSED")]
    Regressed,
    /// No judged metric moved beyond what the rule allows, where it could have called one.
    #[serde(rename = "NO CHANGE")]
    NoChange,
    /// A metric B looks worse on that the samples cannot settle, a side without samples, or a
    /// busy host: the verdict says which.
    #[serde(rename = "NOT DECIDED")]
    NotDecided,
    /// The patched functions ran 0 times on both kernels in this variant: the run could not
    /// have seen the patch, whatever its metrics say.
    #[serde(rename = "NOT EXERCISED")]
    NotExercised,
}

impl VariantClass {
    /// The word printed.
    pub fn word(self) -> &'static str {
        match self {
            VariantClass::Fixed => "FIXED",
            VariantClass::Improved => "IMPROVED",
            VariantClass::Regressed => "REGRESSED",
            VariantClass::NoChange => "NO CHANGE",
            VariantClass::NotDecided => "NOT DECIDED",
            VariantClass::NotExercised => "NOT EXERCISED",
        }
    }
}

impl std::fmt::Display for VariantClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.word())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The display order is the declaration order; the JSON words are the printed ones
    /// (capitals for a variant, lowercase for a metric, as each has always been written).
    #[test]
    fn classes_sort_in_display_order_and_serialize_as_their_words() {
        let mut v = vec![
            VariantClass::NotExercised,
            VariantClass::NoChange,
            VariantClass::Regressed,
            VariantClass::Fixed,
            VariantClass::NotDecided,
            VariantClass::Improved,
        ];
        v.sort();
        let words: Vec<&str> = v.iter().map(|c| c.word()).collect();
        assert_eq!(
            words,
            [
                "FIXED",
                "IMPROVED",
                "REGRESSED",
                "NO CHANGE",
                "NOT DECIDED",
                "NOT EXERCISED"
            ]
        );
        for c in v {
            assert_eq!(
                serde_json::to_value(c).expect("json"),
                serde_json::Value::from(c.word())
            );
        }
        let mut m = vec![
            MetricClass::NotDecided,
            MetricClass::NoChange,
            MetricClass::Slower,
            MetricClass::Faster,
        ];
        m.sort();
        assert_eq!(
            m,
            [
                MetricClass::Faster,
                MetricClass::Slower,
                MetricClass::NoChange,
                MetricClass::NotDecided
            ]
        );
        for c in m {
            assert_eq!(
                serde_json::to_value(c).expect("json"),
                serde_json::Value::from(c.word().to_lowercase())
            );
        }
    }
}
