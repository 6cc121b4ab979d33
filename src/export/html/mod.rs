//! The HTML pages of a run report: the index (summary first, then each run's section) and the
//! fidelity page. Rust gathers the text of each page into a view; the askama templates in
//! `templates/` lay it out and HTML-escape every value.

pub(crate) mod charts;
mod fleet;
pub(crate) mod style;
mod sweep;

use askama::Template;

use super::{Export, ExportError, Exporter};
use crate::analysis::class::MetricClass;
use crate::analysis::quantity::format_range;
use crate::export::param_value;
use crate::export::summary::SummaryRow;
use crate::export::words::fmt_value;
use crate::lab::fidelity::{Agreement, ThreadReport};
use crate::lab::threads::ThreadLine;
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

/// The report's index page: its first screen (the summary table, the threads), built from
/// every run at once. A report of many runs is written one run at a time
/// (`ReportWriter` in `export::report`); this is the same page for runs at hand.
#[derive(Debug, Clone, Copy)]
pub struct Html;

impl Exporter for Html {
    fn serialize(&self, export: &Export<'_>) -> Result<Vec<u8>, ExportError> {
        Ok(page(export.runs, export.fidelity)?.into_bytes())
    }
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

/// The CSS class of a verdict's class (its colour).
pub(crate) fn css(class: Option<MetricClass>) -> &'static str {
    match class {
        Some(MetricClass::Faster) => "better",
        Some(MetricClass::Slower) => "worse",
        Some(MetricClass::NotDecided) => "undecided",
        Some(MetricClass::NoChange) | None => "",
    }
}

#[derive(Template)]
#[template(path = "index.html")]
struct Index {
    scenarios: Vec<ScenarioRows>,
    any_setup: bool,
    columns: usize,
    threads: Vec<ThreadView>,
    warnings: Vec<String>,
    runs_words: String,
    fleet_file: &'static str,
    fidelity: Option<String>,
    fidelity_file: &'static str,
    how: &'static [(&'static str, &'static str)],
    host: Option<HostLine>,
}

/// A scenario's question and its rows.
struct ScenarioRows {
    name: String,
    question: String,
    rows: Vec<RowView>,
}

struct RowView {
    page: String,
    /// The backend and the host (a model run's host is the modelled one).
    host: String,
    setup: String,
    answer: String,
    css: &'static str,
    number: String,
    cause: String,
    others: String,
}

struct ThreadView {
    /// The thread's title (shown on hover).
    title: String,
    /// Its line: before → after, and its fidelity.
    line: String,
    /// The pages of the runs that show it.
    pages: Vec<String>,
}

struct HostLine {
    machine: String,
    tool: String,
}

/// What the first screen shows besides the rows.
pub struct FirstScreen<'a> {
    /// Runs in the report.
    pub runs: usize,
    /// The threads, one line each.
    pub threads: &'a [ThreadLine],
    /// The model against the threads.
    pub fidelity: &'a [ThreadReport],
    /// The machine the measured runs ran on, when any did.
    pub host: Option<&'a hvlab_core::host::HostInfo>,
    /// Warnings that change how to read a row.
    pub warnings: Vec<String>,
    /// The pages of the showcase runs, by run id.
    pub showcase_pages: &'a std::collections::BTreeMap<String, String>,
}

/// The index page from its rows.
pub fn index_page(rows: &[SummaryRow], first: &FirstScreen<'_>) -> askama::Result<String> {
    let mut scenarios: Vec<ScenarioRows> = Vec::new();
    for row in rows {
        let view = RowView {
            page: row.page.clone(),
            host: if row.backend == "model" {
                row.host.clone()
            } else {
                format!("{} on {}", row.backend, row.host)
            },
            setup: row.setup.clone(),
            // The terminal's `--reps 7` marks a command; a page has no markup for it here.
            answer: row.answer.replace('`', ""),
            css: css(row.class),
            number: row.number.clone(),
            cause: row.cause.clone(),
            others: row.others.clone(),
        };
        match scenarios.last_mut().filter(|s| s.name == row.scenario) {
            Some(s) => s.rows.push(view),
            None => scenarios.push(ScenarioRows {
                name: row.scenario.clone(),
                question: row.question.clone(),
                rows: vec![view],
            }),
        }
    }
    let any_setup = rows.iter().any(|r| !r.setup.is_empty());
    let index = Index {
        scenarios,
        any_setup,
        columns: if any_setup { 5 } else { 4 },
        threads: first
            .threads
            .iter()
            .map(|t| ThreadView {
                title: super::words::thread_title(t),
                line: super::words::thread_line(t),
                pages: t
                    .headlines
                    .iter()
                    .filter_map(|h| {
                        first
                            .showcase_pages
                            .get(&h.run_id)
                            .filter(|p| !p.is_empty())
                            .cloned()
                    })
                    .collect(),
            })
            .collect(),
        warnings: first.warnings.clone(),
        runs_words: format!(
            "{} run{}.",
            crate::analysis::quantity::count(first.runs as f64),
            if first.runs == 1 { "" } else { "s" }
        ),
        fleet_file: fleet::FILE,
        fidelity: (!first.fidelity.is_empty())
            .then(|| super::words::fidelity_headline(first.fidelity)),
        fidelity_file: FIDELITY_FILE,
        how: &super::words::HOW_TO_READ,
        host: first.host.map(host_line),
    };
    Ok(index.render()? + "\n")
}

/// The index page of runs at hand (every run with a page under `runs/`).
pub fn page(records: &[RunRecord], fidelity: &[ThreadReport]) -> askama::Result<String> {
    let mut summary = super::summary::Summary::new();
    for (i, r) in records.iter().enumerate() {
        summary.add(r, super::summary::run_page_name(i, r));
    }
    let rows = summary.rows(super::summary::group_page_name);
    let refs: Vec<&RunRecord> = records.iter().collect();
    let threads = crate::lab::threads::lines(&refs, fidelity);
    index_page(
        &rows,
        &FirstScreen {
            runs: records.len(),
            threads: &threads,
            fidelity,
            host: records
                .iter()
                .find(|r| r.backend.capabilities().real_time)
                .map(|r| &r.host),
            warnings: super::summary::warnings(&rows),
            showcase_pages: summary.showcase_pages(),
        },
    )
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

#[derive(Template)]
#[template(path = "run.html")]
struct RunPage {
    s: Section,
}

/// One run's page, verdicts first: self-contained, its one link back to the index.
struct Section {
    id: String,
    title: String,
    question: String,
    verdicts: Vec<VerdictView>,
    findings: Vec<String>,
    started: String,
    finished: String,
    host: String,
    params: String,
    noise: Option<String>,
    warnings: Vec<String>,
    charts: Vec<Figure>,
    variants: Vec<VariantView>,
}

struct VerdictView {
    text: String,
    css: &'static str,
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

/// A run's own page: its question, verdicts and findings first, then where it ran, its noise,
/// charts and every variant's metrics.
pub fn run_page(r: &RunRecord) -> askama::Result<String> {
    let title = super::summary::run_title(r);
    let question = crate::scenario::find(&r.scenario)
        .map(|i| {
            let q = &i.question;
            match q.baseline {
                Some(b) => format!("{} (baseline: {b})", q.asks),
                None => q.asks.to_string(),
            }
        })
        .unwrap_or_default();
    let page = RunPage {
        s: Section {
            id: r.run_id.clone(),
            title,
            question,
            verdicts: r
                .verdicts
                .iter()
                .map(|v| VerdictView {
                    text: v.to_string(),
                    css: css(Some(v.class())),
                })
                .collect(),
            findings: r
                .variants
                .iter()
                .flat_map(|v| v.findings.iter().map(move |f| format!("{}: {f}", v.name)))
                .collect(),
            started: r.started_at.clone(),
            finished: r.finished_at.clone(),
            host: super::summary::host(r),
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
        },
    };
    Ok(page.render()? + "\n")
}

#[derive(Template)]
#[template(path = "group.html")]
struct GroupPage {
    title: String,
    question: String,
    answer: String,
    note: String,
    runs: Vec<GroupRun>,
}

struct GroupRun {
    id: String,
    page: Option<String>,
    setup: String,
    answer: String,
    css: &'static str,
    number: String,
    cause: String,
}

/// A row's page when several runs share it (the points of a sweep): one line per run, each
/// linking to the run's own page where it has one.
pub fn group_page(row: &SummaryRow) -> askama::Result<String> {
    let page = GroupPage {
        title: format!("{} on {}, {}", row.scenario, row.backend, row.host),
        question: row.question.clone(),
        answer: format!("{}; {}", row.answer, row.number),
        note: "A sweep point has no page of its own: `hvlab show RUN` prints one point's account, `hvlab report RUN` makes its page, `hvlab report --sweep ID` draws the sweep.".into(),
        runs: row
            .lines
            .iter()
            .map(|l| GroupRun {
                id: l.run_id.clone(),
                page: (!l.page.is_empty()).then(|| format!("../{}", l.page)),
                setup: l
                    .params
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                answer: l
                    .answer
                    .as_ref()
                    .map_or_else(|| "nothing compared".into(), |a| a.short.clone()),
                css: css(l.answer.as_ref().map(|a| a.class)),
                number: super::summary::line_number(l),
                cause: l.answer.as_ref().map(|a| a.cause.clone()).unwrap_or_default(),
            })
            .collect(),
    };
    Ok(page.render()? + "\n")
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
