//! The HTML pages of a run report: the index (summary first, then each run's section) and the
//! fidelity page. Rust gathers the text of each page into a view; the askama templates in
//! `templates/` lay it out and HTML-escape every value.

pub(crate) mod charts;
mod fleet;
pub(crate) mod style;
mod sweep;

use askama::Template;

use super::{Export, ExportError, Exporter};
use crate::analysis::quantity::format_range;
use crate::export::words::{SummaryRow, fmt_value};
use crate::lab::fidelity::{Agreement, ThreadReport};
use crate::record::{RunRecord, VariantRecord};
use crate::scenario::Chart;
pub use fleet::{FILE as FLEET_FILE, page as fleet_page};
pub use sweep::page as sweep_page;

/// The charts of one run, in reading order: (caption, SVG). Every run opens with the
/// distribution of its headline metric; its scenario names the rest.
pub fn charts_for(r: &RunRecord) -> Vec<(String, String)> {
    let Ok(scenario) = crate::scenario::Kind::named(&r.scenario) else {
        return Vec::new();
    };
    let headline = scenario.info().headline;
    let mut out = Vec::new();
    let mut add = |title: &str, svg: Option<String>| {
        if let Some(svg) = svg {
            out.push((title.to_string(), svg));
        }
    };
    add("distribution", charts::distribution(r, headline));
    for chart in scenario.charts(r) {
        match chart {
            Chart::Timeline => add("timeline", charts::timeline(r)),
            Chart::Bars { metric, title } => add(title, charts::bars(r, metric, title)),
            Chart::PinnedBytes => add("pinned bytes", charts::pinned_bytes(r)),
        }
    }
    out
}

/// The report's index page (summary first, then each run's section; the fidelity headline
/// linked).
#[derive(Debug, Clone, Copy)]
pub struct Html;

impl Exporter for Html {
    fn serialize(&self, export: &Export<'_>) -> Result<Vec<u8>, ExportError> {
        Ok(page(export.runs, export.fidelity)?.into_bytes())
    }
}

/// A run parameter as written on a page: strings bare, anything else as JSON.
pub(crate) fn param_value(v: &serde_json::Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), String::from)
}

/// The file of the fidelity page, beside `index.html`.
pub const FIDELITY_FILE: &str = "fidelity.html";

/// A chart: its caption and plotters' SVG (which escapes its own text).
pub(crate) struct Figure {
    pub(crate) caption: String,
    pub(crate) svg: String,
}

impl Figure {
    pub(crate) fn all(charts: Vec<(String, String)>) -> Vec<Figure> {
        charts
            .into_iter()
            .map(|(caption, svg)| Figure { caption, svg })
            .collect()
    }
}

#[derive(Template)]
#[template(path = "index.html")]
struct Index {
    rows: Vec<SummaryRow>,
    any_setup: bool,
    runs: usize,
    fleet_file: &'static str,
    fidelity: Option<String>,
    fidelity_file: &'static str,
    how: &'static [(&'static str, &'static str)],
    host: Option<HostLine>,
    sections: Vec<Section>,
}

struct HostLine {
    machine: String,
    tool: String,
}

/// One run's section, verdicts first.
struct Section {
    id: String,
    title: String,
    verdicts: Vec<String>,
    findings: Vec<String>,
    started: String,
    finished: String,
    params: String,
    noise: Option<String>,
    warnings: Vec<String>,
    charts: Vec<Figure>,
    variants: Vec<VariantView>,
}

struct VariantView {
    name: String,
    /// Why the variant has no numbers (then it has no tables).
    status: Option<String>,
    /// Its own metrics, then (when it has any) KVM's statistics, folded away.
    tables: Vec<MetricTable>,
}

struct MetricTable {
    kvm: bool,
    rows: Vec<MetricRow>,
}

struct MetricRow {
    name: String,
    median: String,
    ci: String,
    min: String,
    max: String,
    n: usize,
}

/// The whole page, summary first: one table (a row per run, each linking to its section),
/// how to read it, the host, and then each run's section, verdicts first.
pub fn page(records: &[RunRecord], fidelity: &[ThreadReport]) -> askama::Result<String> {
    let rows = super::words::summary_rows(records);
    let setups = super::words::distinguishing_params(records);
    let index = Index {
        any_setup: rows.iter().any(|r| !r.setup.is_empty()),
        rows,
        runs: records.len(),
        fleet_file: fleet::FILE,
        fidelity: (!fidelity.is_empty()).then(|| super::words::fidelity_headline(fidelity)),
        fidelity_file: FIDELITY_FILE,
        how: &super::words::HOW_TO_READ,
        host: records.first().map(|r| host_line(&r.host)),
        sections: records
            .iter()
            .zip(&setups)
            .map(|(r, setup)| section(r, setup))
            .collect(),
    };
    Ok(index.render()? + "\n")
}

fn host_line(h: &hvlab_core::host::HostInfo) -> HostLine {
    HostLine {
        machine: format!(
            "{} ({} cores), {} KVM, Linux {}, HZ={}, {} paging, vPMU {}, THP {}",
            h.cpu,
            h.cores,
            h.kvm_flavour,
            h.kernel,
            h.hz,
            if h.tdp == Some(true) { "TDP" } else { "shadow" },
            if h.vpmu == Some(true) { "on" } else { "off" },
            h.thp
        ),
        tool: format!("{} ({})", h.hvlab_version, h.git_rev),
    }
}

fn section(r: &RunRecord, setup: &str) -> Section {
    let mut title = format!("{} on {}", r.scenario, r.backend);
    if let Some(p) = &r.profile {
        title.push_str(&format!(" (profile {p})"));
    }
    if !setup.is_empty() {
        title.push_str(&format!(", {setup}"));
    }
    Section {
        id: r.run_id.clone(),
        title,
        verdicts: r.verdicts.iter().map(ToString::to_string).collect(),
        findings: r
            .variants
            .iter()
            .flat_map(|v| v.findings.iter().map(move |f| format!("{}: {f}", v.name)))
            .collect(),
        started: r.started_at.clone(),
        finished: r.finished_at.clone(),
        params: r
            .params
            .iter()
            .filter(|(_, v)| v.as_str() != Some(""))
            .map(|(k, v)| format!("{k}={}", param_value(v)))
            .collect::<Vec<_>>()
            .join(", "),
        noise: r.noise.as_ref().map(super::words::noise_line),
        warnings: r.warnings.iter().map(ToString::to_string).collect(),
        charts: Figure::all(charts_for(r)),
        variants: r.variants.iter().map(variant).collect(),
    }
}

fn variant(v: &VariantRecord) -> VariantView {
    if !v.is_ok() {
        return VariantView {
            name: v.name.clone(),
            status: Some(v.status.to_string()),
            tables: Vec::new(),
        };
    }
    let rows = |kvm: bool| -> Vec<MetricRow> {
        v.metrics
            .iter()
            .filter(|(k, _)| k.starts_with("kvm.") == kvm)
            .map(|(name, m)| MetricRow {
                name: name.clone(),
                median: fmt_value(m.median, &m.unit),
                ci: format_range(m.ci95[0], m.ci95[1], &m.unit),
                min: fmt_value(m.min, &m.unit),
                max: fmt_value(m.max, &m.unit),
                n: m.n,
            })
            .collect()
    };
    let mut tables = vec![MetricTable {
        kvm: false,
        rows: rows(false),
    }];
    let kvm = rows(true);
    if !kvm.is_empty() {
        tables.push(MetricTable {
            kvm: true,
            rows: kvm,
        });
    }
    VariantView {
        name: v.name.clone(),
        status: None,
        tables,
    }
}

#[derive(Template)]
#[template(path = "fidelity.html")]
struct Fidelity {
    headline: String,
    rows: Vec<Vec<Cell>>,
    fitted: Vec<String>,
}

/// A cell of the fidelity table; a verdict other than "within" is flagged.
struct Cell {
    flagged: bool,
    text: String,
}

/// The fidelity page: the model against the kernel threads, one row per published figure.
pub fn fidelity_page(fidelity: &[ThreadReport]) -> askama::Result<String> {
    // The cells come row for row in the order of the threads' rows.
    let rows = fidelity.iter().flat_map(|t| &t.rows);
    let page = Fidelity {
        headline: super::words::fidelity_headline(fidelity),
        rows: super::words::fidelity_cells(fidelity)
            .into_iter()
            .zip(rows)
            .map(|(cells, row)| {
                cells
                    .into_iter()
                    .enumerate()
                    .map(|(i, text)| Cell {
                        flagged: i == 5 && row.agreement != Agreement::Within,
                        text,
                    })
                    .collect()
            })
            .collect(),
        fitted: super::words::fidelity_fitted(fidelity),
    };
    Ok(page.render()? + "\n")
}
