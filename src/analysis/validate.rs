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
            .map(|m| (m.median, m.unit.clone()))
    };
    let ((predicted, unit), (measured, _)) = (get(model)?, get(kvm)?);
    Some(judge(
        &model.scenario,
        variant,
        metric,
        &unit,
        predicted,
        measured,
        rule,
    ))
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

/// The median stall duration of a variant's first stall finding.
pub fn stall_ms(r: &RunRecord, variant: &str) -> Option<f64> {
    r.variant(variant)?.findings.iter().find_map(|f| match f {
        Finding::SrcuStall { median_ms, .. } => Some(*median_ms),
        _ => None,
    })
}

/// Judges one pair of numbers.
pub fn judge(
    scenario: &str,
    variant: &str,
    metric: &str,
    unit: &str,
    predicted: f64,
    measured: f64,
    rule: Rule,
) -> Check {
    let error_pct = if measured == 0.0 {
        if predicted == 0.0 { 0.0 } else { 100.0 }
    } else {
        (predicted - measured) / measured * 100.0
    };
    let (tolerance_pct, pass) = match rule {
        Rule::Within(t) => (t, error_pct.abs() <= t),
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
}
