//! The Markdown summary: what each run found, in words.

use std::fmt::Write;

use super::escape::markdown as md;
use super::sweep::SweepView;
use super::words::fmt_value;
use super::{Export, ExportError, Exporter};
use crate::analysis::quantity::format_range;
use crate::lab::fidelity::ThreadReport;
use crate::record::RunRecord;

/// The report's summary (`summary.md`): the table first, then each run in words.
#[derive(Debug, Clone, Copy)]
pub struct Markdown;

impl Exporter for Markdown {
    fn serialize(&self, export: &Export<'_>) -> Result<Vec<u8>, ExportError> {
        Ok(summary(export.runs, export.fidelity).into_bytes())
    }
}

/// The summary of every run, in the order of the HTML page: the table first, how to read
/// it, then each run with its verdicts first; the fidelity table last.
pub fn summary(records: &[RunRecord], fidelity: &[ThreadReport]) -> String {
    let mut s = String::from("# hvlab report\n\n");
    summary_table(&mut s, records);
    s.push_str("\nHow to read this:\n\n");
    for (term, text) in super::words::HOW_TO_READ {
        let _ = writeln!(s, "- **{}**: {}", md(term), md(text));
    }
    if !fidelity.is_empty() {
        let _ = writeln!(
            s,
            "\n{} (table at the end).",
            md(&super::words::fidelity_headline(fidelity))
        );
    }
    s.push('\n');
    let setups = super::words::distinguishing_params(records);
    for (r, setup) in records.iter().zip(&setups) {
        run_section(&mut s, r, setup);
    }
    if !fidelity.is_empty() {
        s.push_str("## Fidelity: the model against the kernel threads\n\n| thread | figure | setup | published | model | verdict |\n|---|---|---|---|---|---|\n");
        for cells in super::words::fidelity_cells(fidelity) {
            let row: Vec<String> = cells.iter().map(|c| md(c)).collect();
            let _ = writeln!(s, "| {} |", row.join(" | "));
        }
        s.push('\n');
        for line in super::words::fidelity_fitted(fidelity) {
            let _ = writeln!(s, "- {}", md(&line));
        }
    }
    s
}

/// The table every report opens with: a row per run.
fn summary_table(s: &mut String, records: &[RunRecord]) {
    let rows = super::words::summary_rows(records);
    let any_setup = rows.iter().any(|r| !r.setup.is_empty());
    s.push_str("| scenario | backend | host |");
    if any_setup {
        s.push_str(" setup |");
    }
    s.push_str(" verdict | the number | what it buys |\n|---|---|---|");
    if any_setup {
        s.push_str("---|");
    }
    s.push_str("---|---|---|\n");
    for row in &rows {
        let _ = write!(
            s,
            "| [{}](#{}) | {} | {} |",
            md(&row.scenario),
            anchor(&row.run_id),
            md(&row.backend),
            md(&row.host)
        );
        if any_setup {
            let _ = write!(s, " {} |", md(&row.setup));
        }
        let _ = writeln!(
            s,
            " {} | {} | {} |",
            md(&row.verdict),
            md(&row.number),
            md(&row.buys)
        );
    }
}

/// One run in words: its verdicts, each variant's status and findings, where it ran, its
/// noise and warnings.
fn run_section(s: &mut String, r: &RunRecord, setup: &str) {
    let _ = writeln!(
        s,
        "<a id=\"{}\"></a>\n\n## {} on {}{}{}\n",
        anchor(&r.run_id),
        md(&r.scenario),
        r.backend,
        r.profile
            .as_ref()
            .map_or(String::new(), |p| format!(" (profile {})", md(p))),
        if setup.is_empty() {
            String::new()
        } else {
            format!(", {}", md(setup))
        }
    );
    for v in &r.verdicts {
        let _ = writeln!(s, "- **verdict**: {}", md(&v.to_string()));
    }
    for v in &r.variants {
        if !v.is_ok() {
            let _ = writeln!(s, "- **{}**: {}", md(&v.name), md(&v.status.to_string()));
        }
        for f in &v.findings {
            let _ = writeln!(s, "- **{}**: {}", md(&v.name), md(&f.to_string()));
        }
    }
    let _ = writeln!(
        s,
        "\nRun {} on {} ({}, {}, HZ={}).\n",
        md(&r.run_id),
        md(&r.host.kernel),
        md(&r.host.cpu),
        r.host.kvm_flavour,
        r.host.hz
    );
    if let Some(n) = &r.noise {
        let _ = writeln!(s, "{}.\n", md(&super::words::noise_line(n)));
    }
    for w in &r.warnings {
        let _ = writeln!(s, "- **warning**: {}", md(&w.to_string()));
    }
    s.push('\n');
}

/// A run id as an anchor: only characters that need no escaping in a link or an attribute.
fn anchor(run_id: &str) -> String {
    run_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// The Markdown summary of a sweep: the same table.
pub fn sweep_summary(view: &SweepView) -> String {
    let mut s = format!(
        "# hvlab sweep {}\n\n{} on {}, {} points; {} median per point (95% CI).\n\n|",
        md(&view.id),
        md(&view.scenario),
        md(&view.backend),
        view.points(),
        md(&view.metric)
    );
    for (k, _) in &view.axes {
        let _ = write!(s, " {} |", md(k));
    }
    s.push_str(" variant | median | 95% CI |\n|");
    for _ in 0..view.axes.len() + 3 {
        s.push_str("---|");
    }
    s.push('\n');
    for (values, variant, m) in &view.cells {
        s.push('|');
        for v in values {
            let _ = write!(s, " {} |", md(&v.to_string()));
        }
        let _ = writeln!(
            s,
            " {} | {} | {} |",
            md(variant),
            md(&fmt_value(m.median, &m.unit)),
            md(&format_range(m.ci95[0], m.ci95[1], &m.unit))
        );
    }
    s
}
