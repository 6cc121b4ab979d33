//! From repetitions to metric records: the bookkeeping every scenario's analysis shares.

use std::collections::BTreeMap;

use crate::analysis::statistics::seed_for;
use crate::record::VariantStatus;
use crate::record::{MetricRecord, VariantRecord};

/// Samples of every metric of one variant, repetition by repetition.
#[derive(Debug, Default)]
pub struct Series {
    rep: usize,
    metrics: BTreeMap<String, (String, Vec<f64>)>,
}

impl Series {
    /// An empty series.
    pub fn new() -> Series {
        Series::default()
    }

    /// Values pushed from now on belong to repetition `rep`.
    pub fn at(&mut self, rep: usize) -> &mut Series {
        self.rep = rep;
        self
    }

    /// Records `value` of `metric` for the current repetition. A metric first seen in a later
    /// repetition (a statistic that did not move before) was zero in the earlier ones.
    pub fn push(&mut self, metric: &str, unit: &str, value: f64) -> &mut Series {
        let entry = self
            .metrics
            .entry(metric.to_string())
            .or_insert_with(|| (unit.to_string(), Vec::new()));
        entry.1.resize(self.rep, 0.0);
        entry.1.push(value);
        self
    }

    /// Summarises every metric over `reps` repetitions (zero where a metric did not appear),
    /// each with its own resampling seed.
    pub fn finish(self, reps: usize, variant: &str, seed: u64) -> BTreeMap<String, MetricRecord> {
        self.metrics
            .into_iter()
            .map(|(metric, (unit, mut samples))| {
                samples.resize(reps, 0.0);
                let record = MetricRecord::new(&unit, samples, seed_for(seed, &[variant, &metric]));
                (metric, record)
            })
            .collect()
    }
}

/// One record per variant: the failure status as it is, or `analyse(name, samples)`.
pub fn per_variant<T>(
    names: &[String],
    results: &[Result<Vec<T>, VariantStatus>],
    mut analyse: impl FnMut(usize, &str, &[T]) -> VariantRecord,
) -> Vec<VariantRecord> {
    names
        .iter()
        .zip(results)
        .enumerate()
        .map(|(i, (name, result))| match result {
            Err(status) => VariantRecord {
                name: name.clone(),
                status: status.clone(),
                metrics: BTreeMap::new(),
                findings: Vec::new(),
                timeline: Vec::new(),
                pinned_bytes: Vec::new(),
            },
            Ok(samples) => analyse(i, name, samples),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn late_metrics_are_zero_filled_before_and_after() {
        let mut s = Series::new();
        s.at(0).push("a", "ms", 1.0);
        s.at(1)
            .push("a", "ms", 2.0)
            .push("kvm.vcpu.x", "count", 5.0);
        s.at(2).push("a", "ms", 3.0);
        let m = s.finish(3, "v", 1);
        assert_eq!(m["a"].samples, vec![1.0, 2.0, 3.0]);
        assert_eq!(m["kvm.vcpu.x"].samples, vec![0.0, 5.0, 0.0]);
        assert_eq!(m["kvm.vcpu.x"].unit, "count");
    }

    #[test]
    fn failures_keep_their_status() {
        let names = vec!["ok".to_string(), "bad".to_string()];
        let results: Vec<Result<Vec<u32>, VariantStatus>> =
            vec![Ok(vec![1]), Err("unsupported: x".into())];
        let out = per_variant(&names, &results, |_, name, _| VariantRecord {
            name: name.into(),
            status: crate::record::VariantStatus::Ok,
            metrics: BTreeMap::new(),
            findings: vec![],
            timeline: Vec::new(),
            pinned_bytes: Vec::new(),
        });
        assert_eq!(out[0].status, "ok");
        assert_eq!(out[1].status, "unsupported: x");
    }
}
