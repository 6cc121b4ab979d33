//! The Markdown summary: what each run found, in words.

use std::fmt::Write;

use super::escape::markdown as md;
use crate::lab::fidelity::ThreadReport;
use crate::record::RunRecord;

/// The summary of every run.
pub fn summary(records: &[RunRecord], fidelity: &[ThreadReport]) -> String {
    let mut s = String::from("# hvlab report\n\n## Summary\n\n");
    for r in records {
        let _ = writeln!(s, "- {}", md(&super::words::run_headline(r)));
    }
    if !fidelity.is_empty() {
        let _ = writeln!(s, "- {}", md(&super::words::fidelity_headline(fidelity)));
        s.push_str("\n## Fidelity: the model against the kernel threads\n\n| thread | figure | setup | published | model | verdict |\n|---|---|---|---|---|---|\n");
        for cells in super::words::fidelity_cells(fidelity) {
            let row: Vec<String> = cells.iter().map(|c| md(c)).collect();
            let _ = writeln!(s, "| {} |", row.join(" | "));
        }
        s.push('\n');
        for line in super::words::fidelity_fitted(fidelity) {
            let _ = writeln!(s, "- {}", md(&line));
        }
    }
    s.push('\n');
    for r in records {
        let _ = writeln!(
            s,
            "## {} on {}{}\n\nRun {} on {} ({}, {}, HZ={}).\n",
            md(&r.scenario),
            r.backend,
            r.profile
                .as_ref()
                .map_or(String::new(), |p| format!(" (profile {})", md(p))),
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
        for v in &r.variants {
            if !v.is_ok() {
                let _ = writeln!(s, "- **{}**: {}", md(&v.name), md(&v.status.to_string()));
            }
            for f in &v.findings {
                let _ = writeln!(s, "- **{}**: {}", md(&v.name), md(&f.to_string()));
            }
        }
        if !r.verdicts.is_empty() {
            let _ = writeln!(s, "\nVerdicts:\n");
            for v in &r.verdicts {
                let _ = writeln!(s, "- {}", md(&v.to_string()));
            }
        }
        s.push('\n');
    }
    s
}
