//! The HTML page.

use std::fmt::Write;

use super::charts_for;
use super::style::STYLE;
use crate::analysis::quantity::format_range;
use crate::lab::fidelity::{Agreement, ThreadReport};
use crate::record::RunRecord;
use crate::report::words::fmt_value;

pub(super) fn esc(text: &str) -> String {
    super::escape::html(text)
}

/// A run parameter as written on a page: strings bare, anything else as JSON.
pub(super) fn param_value(v: &serde_json::Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), String::from)
}

/// The file of the fidelity page, beside `index.html`.
pub const FIDELITY_FILE: &str = "fidelity.html";

/// The whole page, summary first: one table (a row per run, each linking to its section),
/// how to read it, the host, and then each run's section, verdicts first.
pub fn page(records: &[RunRecord], fidelity: &[ThreadReport]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>hvlab report</title><style>{STYLE}</style></head><body><h1>hvlab report</h1>"
    );
    summary_table(&mut s, records);
    let _ = write!(
        s,
        "<p class=\"links\">{} run{}. <a href=\"{}\">Fleet: the runs by host</a>",
        records.len(),
        if records.len() == 1 { "" } else { "s" },
        super::fleet::FILE
    );
    if !fidelity.is_empty() {
        let _ = write!(
            s,
            " · <a href=\"{FIDELITY_FILE}\">{}</a>",
            esc(&super::words::fidelity_headline(fidelity))
        );
    }
    s.push_str("</p><details class=\"how\" open><summary>How to read this</summary><dl>");
    for (term, text) in super::words::HOW_TO_READ {
        let _ = write!(s, "<dt>{}</dt><dd>{}</dd>", esc(term), esc(text));
    }
    s.push_str("</dl></details>");
    if let Some(h) = records.first().map(|r| &r.host) {
        let _ = write!(
            s,
            "<table class=\"host\"><tr><th>host</th><td>{} ({} cores), {} KVM, Linux {}, HZ={}, {} paging, vPMU {}, THP {}</td></tr><tr><th>hvlab</th><td>{} ({})</td></tr></table>",
            esc(&h.cpu),
            h.cores,
            h.kvm_flavour,
            esc(&h.kernel),
            h.hz,
            if h.tdp == Some(true) { "TDP" } else { "shadow" },
            if h.vpmu == Some(true) { "on" } else { "off" },
            esc(&h.thp),
            esc(&h.hvlab_version),
            esc(&h.git_rev)
        );
    }
    let setups = super::words::distinguishing_params(records);
    for (r, setup) in records.iter().zip(&setups) {
        run(&mut s, r, setup);
    }
    s.push_str("</body></html>\n");
    s
}

/// The opening table: a row per run (scenario × backend × host, with the profile or the
/// kernel under test and the parameters that set it apart), each linking to its section.
fn summary_table(s: &mut String, records: &[RunRecord]) {
    let rows = super::words::summary_rows(records);
    let any_setup = rows.iter().any(|r| !r.setup.is_empty());
    s.push_str("<table class=\"summary\"><tr><th>scenario</th><th>backend</th><th>host</th>");
    if any_setup {
        s.push_str("<th>setup</th>");
    }
    s.push_str("<th>verdict</th><th>the number</th><th>what it buys</th></tr>");
    for row in &rows {
        let _ = write!(
            s,
            "<tr><td><a href=\"#{}\">{}</a></td><td>{}</td><td>{}</td>",
            esc(&row.run_id),
            esc(&row.scenario),
            esc(&row.backend),
            esc(&row.host)
        );
        if any_setup {
            let _ = write!(s, "<td>{}</td>", esc(&row.setup));
        }
        let _ = write!(
            s,
            "<td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&row.verdict),
            esc(&row.number),
            esc(&row.buys)
        );
    }
    s.push_str("</table>");
}

/// The fidelity page: the model against the kernel threads, one row per published figure.
pub fn fidelity_page(fidelity: &[ThreadReport]) -> String {
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>hvlab fidelity</title><style>{STYLE}</style></head><body><h1>Fidelity: the model against the kernel threads</h1><p><a href=\"index.html\">Back to the report</a></p><p class=\"verdict\">{}</p>",
        esc(&super::words::fidelity_headline(fidelity))
    );
    fidelity_table(&mut s, fidelity);
    s.push_str("</body></html>\n");
    s
}

fn run(s: &mut String, r: &RunRecord, setup: &str) {
    let _ = write!(
        s,
        "<h2 id=\"{}\">{} on {}{}{}</h2>",
        esc(&r.run_id),
        esc(&r.scenario),
        esc(&r.backend.to_string()),
        r.profile
            .as_ref()
            .map_or(String::new(), |p| format!(" (profile {})", esc(p))),
        if setup.is_empty() {
            String::new()
        } else {
            format!(", {}", esc(setup))
        }
    );
    // The section opens with what it found: verdicts, then findings; the evidence follows.
    for v in &r.verdicts {
        let _ = write!(s, "<p class=\"verdict\">{}</p>", esc(&v.to_string()));
    }
    for v in &r.variants {
        for f in &v.findings {
            let _ = write!(
                s,
                "<p class=\"finding\">{}: {}</p>",
                esc(&v.name),
                esc(&f.to_string())
            );
        }
    }
    let _ = write!(
        s,
        "<p>run <code>{}</code>, {} to {}; parameters: {}</p>",
        esc(&r.run_id),
        esc(&r.started_at),
        esc(&r.finished_at),
        esc(&r
            .params
            .iter()
            .filter(|(_, v)| v.as_str() != Some(""))
            .map(|(k, v)| format!("{k}={}", param_value(v)))
            .collect::<Vec<_>>()
            .join(", "))
    );
    // The conditions of the measurement come before its numbers: a busy host inflates them.
    if let Some(n) = &r.noise {
        let _ = write!(
            s,
            "<p class=\"noise\">{}</p>",
            esc(&super::words::noise_line(n))
        );
    }
    for w in &r.warnings {
        let _ = write!(
            s,
            "<p class=\"warning\">warning: {}</p>",
            esc(&w.to_string())
        );
    }
    for (caption, svg) in charts_for(r) {
        let _ = write!(
            s,
            "<figure>{svg}<figcaption>{}</figcaption></figure>",
            esc(&caption)
        );
    }
    for v in &r.variants {
        let _ = write!(s, "<h3>{}</h3>", esc(&v.name));
        if !v.is_ok() {
            let _ = write!(s, "<p class=\"status\">{}</p>", esc(&v.status.to_string()));
            continue;
        }
        let table = |s: &mut String, filter: &dyn Fn(&str) -> bool| {
            let _ = write!(
                s,
                "<table><tr><th>metric</th><th>median</th><th>95% CI</th><th>min</th><th>max</th><th>n</th></tr>"
            );
            for (name, m) in v.metrics.iter().filter(|(k, _)| filter(k)) {
                let _ = write!(
                    s,
                    "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                    esc(name),
                    esc(&fmt_value(m.median, &m.unit)),
                    esc(&format_range(m.ci95[0], m.ci95[1], &m.unit)),
                    esc(&fmt_value(m.min, &m.unit)),
                    esc(&fmt_value(m.max, &m.unit)),
                    m.n
                );
            }
            s.push_str("</table>");
        };
        table(s, &|k| !k.starts_with("kvm."));
        if v.metrics.keys().any(|k| k.starts_with("kvm.")) {
            s.push_str("<details><summary>KVM statistics</summary>");
            table(s, &|k| k.starts_with("kvm."));
            s.push_str("</details>");
        }
    }
}

/// The model against the kernel threads: one row per published figure.
fn fidelity_table(s: &mut String, fidelity: &[ThreadReport]) {
    s.push_str(
        "<h2 id=\"fidelity\">Fidelity: the model against the kernel threads</h2><table class=\"fidelity\"><tr><th>thread</th><th>figure</th><th>setup</th><th>published</th><th>model</th><th>verdict</th></tr>",
    );
    // The cells come row for row in the order of the threads' rows.
    let rows = fidelity.iter().flat_map(|t| &t.rows);
    for (cells, row) in super::words::fidelity_cells(fidelity).iter().zip(rows) {
        s.push_str("<tr>");
        for (i, c) in cells.iter().enumerate() {
            let class = if i == 5 && row.agreement != Agreement::Within {
                " class=\"status\""
            } else {
                ""
            };
            let _ = write!(s, "<td{class} style=\"text-align:left\">{}</td>", esc(c));
        }
        s.push_str("</tr>");
    }
    s.push_str("</table><ul>");
    for line in super::words::fidelity_fitted(fidelity) {
        let _ = write!(s, "<li>{}</li>", esc(&line));
    }
    s.push_str("</ul>");
}
