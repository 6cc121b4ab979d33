//! `hvlab compare`: B against A, where each side is a run, a run's variant (`RUN:variant`) or
//! several runs (`A1,A2`, compared by per-run medians), and what a regression means for the
//! exit code.

use crate::analysis::compare::{AbComparison, AbVerdict};
use crate::error::{Error, InputError};
use crate::record::RunRecord;
use crate::scenario;
use crate::scenario::runner::DEFAULT_SEED;
use crate::store::Store;

/// What a comparison found.
#[derive(Debug, Clone)]
pub struct CompareOutcome {
    /// One comparison per variant pair.
    pub comparisons: Vec<AbComparison>,
    /// Whether any B is significantly slower than its A.
    pub regression: bool,
    /// The pairs with too few samples for a verdict: "name (n = b vs a)".
    pub too_few: Vec<String>,
}

/// Compares side `b` against side `a` on `metric` (default: the scenario's headline).
pub fn compare(
    store: &Store,
    a: &str,
    b: &str,
    metric: Option<&str>,
    threshold: f64,
) -> Result<CompareOutcome, Error> {
    let comparisons = compare_sides(store, a, b, metric, threshold)?;
    let regression = comparisons.iter().any(|c| c.verdict == AbVerdict::Slower);
    let too_few = comparisons
        .iter()
        .filter(|c| !c.enough_samples)
        .map(|c| format!("{} (n = {} vs {})", c.b, c.n[1], c.n[0]))
        .collect();
    Ok(CompareOutcome {
        comparisons,
        regression,
        too_few,
    })
}

/// `5%`, `0.05` or `5` (percent when above 1).
pub fn parse_threshold(text: &str) -> Result<f64, Error> {
    let t = text.trim().trim_end_matches('%');
    let v: f64 = t.parse().map_err(|_| InputError::BadValue {
        key: "--threshold".into(),
        value: text.into(),
        why: "give a percentage such as 5% or a fraction such as 0.05".into(),
    })?;
    let fraction = if text.contains('%') || v > 1.0 {
        v / 100.0
    } else {
        v
    };
    if !(0.0..1.0).contains(&fraction) {
        return Err(InputError::BadValue {
            key: "--threshold".into(),
            value: text.into(),
            why: "the threshold is between 0% and 100%".into(),
        }
        .into());
    }
    Ok(fraction)
}

/// One side: runs and, optionally, the variant to take from them.
struct Side {
    runs: Vec<RunRecord>,
    variant: Option<String>,
}

fn load_side(store: &Store, spec: &str) -> Result<Side, Error> {
    let mut runs = Vec::new();
    let mut variant: Option<String> = None;
    for part in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        // Run ids contain colons (their timestamps): try the whole reference first.
        let (run, v) = match store.load(part) {
            Ok(r) => (r, None),
            Err(first) => match part.rsplit_once(':') {
                Some((id, v)) => (store.load(id).map_err(|_| first)?, Some(v.to_string())),
                None => return Err(first.into()),
            },
        };
        if let (Some(v), Some(prev)) = (&v, &variant)
            && v != prev
        {
            return Err(InputError::TwoVariantsOnOneSide(prev.clone(), v.clone()).into());
        }
        variant = variant.or(v);
        runs.push(run);
    }
    if runs.is_empty() {
        return Err(InputError::NoSuchRun(spec.into()).into());
    }
    Ok(Side { runs, variant })
}

/// The samples of `metric` of `variant` on one side: the samples of its one run, or one
/// median per run when there are several (a run is the unit of replication then).
fn side_samples(side: &Side, variant: &str, metric: &str) -> Option<Vec<f64>> {
    let per_run: Vec<&crate::record::MetricRecord> = side
        .runs
        .iter()
        .filter_map(|r| {
            r.variant(variant)
                .filter(|v| v.is_ok())
                .and_then(|v| v.metrics.get(metric))
        })
        .collect();
    match per_run.as_slice() {
        [] => None,
        [one] => Some(one.samples.clone()),
        many => Some(many.iter().map(|m| m.median).collect()),
    }
}

fn compare_sides(
    store: &Store,
    a: &str,
    b: &str,
    metric: Option<&str>,
    threshold: f64,
) -> Result<Vec<AbComparison>, Error> {
    let (sa, sb) = (load_side(store, a)?, load_side(store, b)?);
    let scenario_name = &sa.runs[0].scenario;
    if let Some(other) = sa
        .runs
        .iter()
        .chain(&sb.runs)
        .find(|r| &r.scenario != scenario_name)
    {
        return Err(InputError::ScenarioMismatch(
            sa.runs[0].run_id.clone(),
            scenario_name.clone(),
            other.run_id.clone(),
            other.scenario.clone(),
        )
        .into());
    }
    let info = scenario::find(scenario_name)?;
    let metric = metric.unwrap_or(info.headline);
    let pairs: Vec<(String, String)> = match (&sa.variant, &sb.variant) {
        (Some(va), Some(vb)) => vec![(va.clone(), vb.clone())],
        (Some(v), None) | (None, Some(v)) => vec![(v.clone(), v.clone())],
        (None, None) => sa.runs[0]
            .variants
            .iter()
            .filter(|v| {
                v.is_ok()
                    && sb
                        .runs
                        .iter()
                        .any(|r| r.variant(&v.name).is_some_and(|x| x.is_ok()))
            })
            .map(|v| (v.name.clone(), v.name.clone()))
            .collect(),
    };
    if pairs.is_empty() {
        return Err(InputError::NoSharedVariant.into());
    }
    let mut out = Vec::new();
    for (va, vb) in pairs {
        let xa = side_samples(&sa, &va, metric).ok_or_else(|| InputError::MissingMetric {
            side: 'A',
            metric: metric.to_string(),
            variant: va.clone(),
        })?;
        let xb = side_samples(&sb, &vb, metric).ok_or_else(|| InputError::MissingMetric {
            side: 'B',
            metric: metric.to_string(),
            variant: vb.clone(),
        })?;
        let unit = sa.runs[0]
            .variant(&va)
            .and_then(|v| v.metrics.get(metric))
            .map_or("", |m| m.unit.as_str());
        let seed = crate::analysis::statistics::seed_for(DEFAULT_SEED, &["compare", &va, &vb]);
        out.push(crate::analysis::compare::ab(
            metric,
            unit,
            (&format!("A:{va}"), &xa),
            (&format!("B:{vb}"), &xb),
            threshold,
            seed,
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_read_as_percent_or_fraction_and_stay_in_range() {
        assert!((parse_threshold("5%").unwrap() - 0.05).abs() < 1e-12);
        assert!((parse_threshold("0.05").unwrap() - 0.05).abs() < 1e-12);
        assert!((parse_threshold("5").unwrap() - 0.05).abs() < 1e-12);
        assert!(parse_threshold("150%").is_err());
        assert!(parse_threshold("five").is_err());
    }
}
