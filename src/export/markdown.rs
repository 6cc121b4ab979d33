//! The Markdown summary: what each run found, in words.

use std::fmt::Write;

use super::escape::markdown as md;
use super::sweep::SweepView;
use super::words::fmt_value;
use super::{Export, ExportError, Exporter};
use crate::analysis::quantity::format_range;
use crate::export::summary::SummaryRow;
use crate::lab::fidelity::ThreadReport;
use crate::lab::threads::ThreadLine;
use crate::record::RunRecord;

/// The report's summary (`summary.md`): the table first, then each run in words.
#[derive(Debug, Clone, Copy)]
pub struct Markdown;

impl Exporter for Markdown {
    fn serialize(&self, export: &Export<'_>) -> Result<Vec<u8>, ExportError> {
        Ok(summary(export.runs, export.fidelity).into_bytes())
    }
}

/// The summary of every run, in the order of the HTML page: the first screen (the table, the
/// threads, how to read it), then each run with its verdicts first; the fidelity table last.
pub fn summary(records: &[RunRecord], fidelity: &[ThreadReport]) -> String {
    let mut summary = super::summary::Summary::new();
    let mut sections = String::new();
    for (i, r) in records.iter().enumerate() {
        let page = super::summary::run_page_name(i, r);
        if !page.is_empty() {
            run_section(&mut sections, r);
        }
        summary.add(r, page);
    }
    let rows = summary.rows(super::summary::group_page_name);
    let refs: Vec<&RunRecord> = records.iter().collect();
    let threads = crate::lab::threads::lines(&refs, fidelity);
    let warnings = super::summary::warnings(&rows);
    first_screen(&rows, &threads, fidelity, &warnings) + &sections + &fidelity_table(fidelity)
}

/// The first screen in Markdown: the table (a row per scenario × backend × host), the
/// scenarios' questions, the threads, the warnings, how to read it.
pub fn first_screen(
    rows: &[SummaryRow],
    threads: &[ThreadLine],
    fidelity: &[ThreadReport],
    warnings: &[String],
) -> String {
    let mut s = String::from("# hvlab report\n\n");
    s.push_str(
        "| scenario | backend | host | setup | answer | the number | cause | also |\n|---|---|---|---|---|---|---|---|\n",
    );
    for row in rows {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            md(&row.scenario),
            md(&row.backend),
            md(&row.host),
            md(&row.setup),
            md(&row.answer),
            md(&row.number),
            md(&row.cause),
            md(&row.others)
        );
    }
    s.push_str("\nQuestions:\n\n");
    let mut asked = std::collections::BTreeSet::new();
    for row in rows {
        if asked.insert(row.scenario.as_str()) {
            let _ = writeln!(s, "- **{}**: {}", md(&row.scenario), md(&row.question));
        }
    }
    if !threads.is_empty() {
        s.push_str("\nThreads:\n\n");
        for t in threads {
            let _ = writeln!(s, "- {}", md(&super::words::thread_line(t)));
        }
    }
    if !warnings.is_empty() {
        s.push('\n');
        for w in warnings {
            let _ = writeln!(s, "- **warning**: {}", md(w));
        }
    }
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
    s
}

/// The fidelity table, at the end of the summary.
pub fn fidelity_table(fidelity: &[ThreadReport]) -> String {
    let mut s = String::new();
    if fidelity.is_empty() {
        return s;
    }
    s.push_str("## Fidelity: the model against the kernel threads\n\n| thread | figure | setup | published | model | verdict |\n|---|---|---|---|---|---|\n");
    for cells in super::words::fidelity_cells(fidelity) {
        let row: Vec<String> = cells.iter().map(|c| md(c)).collect();
        let _ = writeln!(s, "| {} |", row.join(" | "));
    }
    s.push('\n');
    for line in super::words::fidelity_fitted(fidelity) {
        let _ = writeln!(s, "- {}", md(&line));
    }
    s
}

/// One run in words: its verdicts, each variant's status and findings, where it ran, its
/// noise and warnings.
pub fn run_section(s: &mut String, r: &RunRecord) {
    let _ = writeln!(
        s,
        "<a id=\"{}\"></a>\n\n## {}\n",
        super::summary::anchor(&r.run_id),
        md(&super::summary::run_title(r)),
    );
    for v in &r.verdicts {
        let _ = writeln!(s, "- **{}**: {}", v.class(), md(&v.to_string()));
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
        "\nRun {} on {}.\n",
        md(&r.run_id),
        md(&super::summary::host(r))
    );
    if let Some(n) = &r.noise {
        let _ = writeln!(s, "{}.\n", md(&super::words::noise_line(n)));
    }
    for w in &r.warnings {
        let _ = writeln!(s, "- **warning**: {}", md(&w.to_string()));
    }
    s.push('\n');
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
