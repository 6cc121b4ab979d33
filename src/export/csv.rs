//! CSV for a spreadsheet: one row per run, variant and metric (the summary with its unit and
//! 95% CI, no samples); not read back.

use super::{Export, ExportError, Exporter};
use crate::record::RunRecord;

/// The CSV columns, in order.
pub const CSV_HEADER: [&str; 21] = [
    "run_id",
    "started_at",
    "scenario",
    "backend",
    "profile",
    "kernel",
    "cpu",
    "hz",
    "clock",
    "tag",
    "suite",
    "sweep",
    "params",
    "variant",
    "status",
    "metric",
    "unit",
    "median",
    "ci95_low",
    "ci95_high",
    "n",
];

/// Runs as CSV (RFC 4180 quoting by the csv crate): one row per run × variant × metric,
/// numbers as Rust prints them (shortest round-trip), parameters as `k=v` joined by `;`.
#[derive(Debug, Clone, Copy)]
pub struct Csv;

impl Exporter for Csv {
    fn serialize(&self, export: &Export<'_>) -> Result<Vec<u8>, ExportError> {
        let mut out = Vec::new();
        write_csv(export.runs, &mut out)?;
        Ok(out)
    }
}

fn write_csv(runs: &[RunRecord], out: &mut Vec<u8>) -> Result<(), ExportError> {
    let fail = |e: ::csv::Error| ExportError::Output(std::io::Error::other(e));
    let mut w = ::csv::Writer::from_writer(out);
    w.write_record(CSV_HEADER).map_err(fail)?;
    for run in runs {
        let params: Vec<String> = run
            .params
            .iter()
            .map(|(k, v)| format!("{k}={}", super::param_value(v)))
            .collect();
        let param = |k: &str| {
            run.params
                .get(k)
                .map(super::param_value)
                .unwrap_or_default()
        };
        for v in &run.variants {
            let status = v.status.to_string();
            // A variant without samples still gets a row, so its status shows.
            let rows: Vec<Option<(&String, &crate::record::MetricRecord)>> = if v.metrics.is_empty()
            {
                vec![None]
            } else {
                v.metrics.iter().map(Some).collect()
            };
            for m in rows {
                let num = |f: fn(&crate::record::MetricRecord) -> String| {
                    m.map(|(_, m)| f(m)).unwrap_or_default()
                };
                w.write_record([
                    run.run_id.clone(),
                    run.started_at.clone(),
                    run.scenario.clone(),
                    run.backend.to_string(),
                    run.profile.clone().unwrap_or_default(),
                    run.host.kernel.clone(),
                    run.host.cpu.clone(),
                    run.host.hz.to_string(),
                    run.clock().to_string(),
                    run.tag.map(|t| t.to_string()).unwrap_or_default(),
                    param("suite"),
                    param("sweep"),
                    params.join(";"),
                    v.name.clone(),
                    status.clone(),
                    m.map(|(name, _)| name.clone()).unwrap_or_default(),
                    num(|m| m.unit.clone()),
                    num(|m| m.median.to_string()),
                    num(|m| m.ci95[0].to_string()),
                    num(|m| m.ci95[1].to_string()),
                    num(|m| m.n.to_string()),
                ])
                .map_err(fail)?;
            }
        }
    }
    w.flush().map_err(ExportError::Output)
}
