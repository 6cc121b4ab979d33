//! Sentences shared by every rendering of a run (terminal, Markdown, HTML), so the three say
//! the same thing in the same words.

use crate::record::RunRecord;

/// One line that opens a run's account, as hyperfine opens with its summary: the scenario and
/// backend, then the strongest significant verdict (or that there was none), how many
/// variants ran and how many findings there are.
pub fn run_headline(r: &RunRecord) -> String {
    let ran = r.variants.iter().filter(|v| v.is_ok()).count();
    let findings: usize = r.variants.iter().map(|v| v.findings.len()).sum();
    let verdict = r
        .verdicts
        .iter()
        .filter(|v| v.significant)
        .max_by(|a, b| a.ratio.total_cmp(&b.ratio))
        .map_or_else(
            || {
                if r.verdicts.is_empty() {
                    "no comparison".to_string()
                } else {
                    "no significant difference between variants".to_string()
                }
            },
            |v| v.text.clone(),
        );
    format!(
        "{} on {}: {verdict} ({ran} of {} variants ran, {findings} finding{})",
        r.scenario,
        r.backend,
        r.variants.len(),
        if findings == 1 { "" } else { "s" }
    )
}
