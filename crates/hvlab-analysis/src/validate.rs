//! `hvlab validate`: the model against the kvm backend on this host, metric by metric.

use serde::Serialize;

use crate::record::{Finding, RunRecord};

/// One comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// Scenario.
    pub scenario: String,
    /// Variant.
    pub variant: String,
    /// What is compared.
    pub metric: String,
    /// Unit.
    pub unit: String,
    /// Model median.
    pub predicted: f64,
    /// kvm median.
    pub measured: f64,
    /// (predicted - measured) / measured, %.
    pub error_pct: f64,
    /// Allowed |error|, % (0 for exact counts, which may differ by `slack` events).
    pub tolerance_pct: f64,
    /// The kvm side's own spread: its samples' 10th and 90th percentiles (the median twice
    /// where only a median is known). A time passes within this band widened by the tolerance.
    pub band: [f64; 2],
    /// Whether it passed.
    pub pass: bool,
    /// False for a time measured on a host whose CPU is emulated: shown, not judged.
    pub judged: bool,
}

/// How a metric is judged.
#[derive(Debug, Clone, Copy)]
pub enum Rule {
    /// Within `tolerance` percent.
    Within(f64),
    /// Equal, up to `slack` events (a stray fault on the guest's own stack, say).
    Exact(f64),
    /// A time on a host whose CPU is emulated (QEMU TCG): every exit is emulated, so the
    /// comparison is shown but not judged.
    Unjudged,
}

/// Compares `metric` of `variant` in both runs.
pub fn check(
    model: &RunRecord,
    kvm: &RunRecord,
    variant: &str,
    metric: &str,
    rule: Rule,
) -> Option<Check> {
    let get = |r: &RunRecord| {
        r.variant(variant)
            .filter(|v| v.is_ok())
            .and_then(|v| v.metrics.get(metric))
            .map(|m| (m.median, m.unit.clone(), spread(&m.samples, m.median)))
    };
    let ((predicted, unit, _), (measured, _, band)) = (get(model)?, get(kvm)?);
    Some(judge_in_band(
        &model.scenario,
        variant,
        metric,
        &unit,
        predicted,
        measured,
        band,
        rule,
    ))
}

/// The 10th to 90th percentile of `samples` (`[median, median]` without samples): the kvm
/// side's own noise band.
pub fn spread(samples: &[f64], median: f64) -> [f64; 2] {
    let mut v: Vec<f64> = samples.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return [median, median];
    }
    v.sort_by(f64::total_cmp);
    [
        crate::statistics::quantile_sorted(&v, 0.1).min(median),
        crate::statistics::quantile_sorted(&v, 0.9).max(median),
    ]
}

/// Compares a count, adding to the model's prediction the events the model does not keep but
/// the kvm run reports as known extras (`extras`: the guest's own page-table pages, which fault
/// at stage 2 only with TDP).
pub fn check_count(
    model: &RunRecord,
    kvm: &RunRecord,
    variant: &str,
    metric: &str,
    extras: &str,
    slack: f64,
) -> Option<Check> {
    let get = |r: &RunRecord, m: &str| {
        r.variant(variant)
            .filter(|v| v.is_ok())
            .and_then(|v| v.metrics.get(m))
            .map(|m| (m.median, m.unit.clone()))
    };
    let ((predicted, unit), (measured, _)) = (get(model, metric)?, get(kvm, metric)?);
    let extra = get(kvm, extras).map_or(0.0, |(e, _)| e);
    Some(judge(
        &model.scenario,
        variant,
        metric,
        &unit,
        predicted + extra,
        measured,
        Rule::Exact(slack),
    ))
}

/// The median stall duration of a variant's first stall finding, with its range over the
/// stalled repetitions (the median alone where the record has no range).
pub fn stall_ms(r: &RunRecord, variant: &str) -> Option<(f64, [f64; 2])> {
    r.variant(variant)?.findings.iter().find_map(|f| match f {
        Finding::SrcuStall {
            median_ms,
            range_ms,
            ..
        } => Some((*median_ms, range_ms.unwrap_or([*median_ms, *median_ms]))),
        _ => None,
    })
}

/// Judges one pair of numbers (the measured one without a spread).
pub fn judge(
    scenario: &str,
    variant: &str,
    metric: &str,
    unit: &str,
    predicted: f64,
    measured: f64,
    rule: Rule,
) -> Check {
    judge_in_band(
        scenario,
        variant,
        metric,
        unit,
        predicted,
        measured,
        [measured, measured],
        rule,
    )
}

/// Judges a prediction against a measurement with its noise band: a time passes when it lies
/// within the band widened by the tolerance on each side (the model need not be closer to the
/// kvm median than the kvm samples are to each other).
#[allow(clippy::too_many_arguments)]
pub fn judge_in_band(
    scenario: &str,
    variant: &str,
    metric: &str,
    unit: &str,
    predicted: f64,
    measured: f64,
    band: [f64; 2],
    rule: Rule,
) -> Check {
    let error_pct = if measured == 0.0 {
        if predicted == 0.0 { 0.0 } else { 100.0 }
    } else {
        (predicted - measured) / measured * 100.0
    };
    let (tolerance_pct, pass) = match rule {
        Rule::Within(t) => (
            t,
            predicted >= band[0] * (1.0 - t / 100.0) && predicted <= band[1] * (1.0 + t / 100.0),
        ),
        Rule::Exact(slack) => (0.0, (predicted - measured).abs() <= slack),
        Rule::Unjudged => (0.0, true),
    };
    Check {
        scenario: scenario.into(),
        variant: variant.into(),
        metric: metric.into(),
        unit: unit.into(),
        predicted,
        measured,
        error_pct,
        tolerance_pct,
        band,
        pass,
        judged: !matches!(rule, Rule::Unjudged),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tolerance_and_exactness_are_judged_as_stated() {
        assert!(judge("m", "v", "x", "ns", 108.0, 100.0, Rule::Within(15.0)).pass);
        assert!(!judge("m", "v", "x", "ns", 120.0, 100.0, Rule::Within(15.0)).pass);
        assert!(judge("m", "v", "f", "count", 65536.0, 65537.0, Rule::Exact(2.0)).pass);
        assert!(!judge("m", "v", "f", "count", 65536.0, 8193.0, Rule::Exact(2.0)).pass);
        assert_eq!(
            judge("m", "v", "f", "count", 0.0, 0.0, Rule::Exact(0.0)).error_pct,
            0.0
        );
        let shown = judge("m", "v", "x", "ns", 900.0, 100.0, Rule::Unjudged);
        assert!(shown.pass && !shown.judged);
    }

    #[test]
    fn a_time_passes_within_the_kvm_sides_own_spread_plus_the_tolerance() {
        // kvm samples 80..=200 ns around a median of 100: a prediction of 210 is 110% off the
        // median but within the band's top (90th percentile) + 15%.
        let samples: Vec<f64> = (0..=12).map(|i| 80.0 + 10.0 * f64::from(i)).collect();
        let band = spread(&samples, 100.0);
        assert!(band[0] <= 92.0 && band[1] >= 188.0, "{band:?}");
        let within =
            |p: f64| judge_in_band("m", "v", "x", "ns", p, 100.0, band, Rule::Within(15.0));
        assert!(within(210.0).pass);
        assert!(within(band[0] * 0.86).pass);
        assert!(!within(band[1] * 1.16).pass);
        assert!(!within(band[0] * 0.84).pass);
        // Without samples the band is the median: the plain tolerance.
        assert_eq!(spread(&[], 100.0), [100.0, 100.0]);
    }
}
