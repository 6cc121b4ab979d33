//! Reports: one self-contained HTML page (inline CSS and SVG, no scripts, no external
//! references) and a Markdown summary, from stored run records.

mod charts;
mod html;
mod markdown;

use std::path::{Path, PathBuf};

use crate::record::RunRecord;

/// The charts of one run, in reading order: (caption, SVG).
pub fn charts_for(r: &RunRecord) -> Vec<(String, String)> {
    let headline = crate::scenario::find(&r.scenario).map_or("", |i| i.headline);
    let mut out = Vec::new();
    let mut add = |title: &str, svg: Option<String>| {
        if let Some(svg) = svg {
            out.push((title.to_string(), svg));
        }
    };
    add("distribution", charts::distribution(r, headline));
    match r.scenario.as_str() {
        "lifecycle" => add("timeline", charts::timeline(r)),
        "memory" => {
            let metric = if r.backend == "model" {
                "faults"
            } else {
                "kvm.vcpu.pf_fixed"
            };
            add(
                "faults",
                charts::bars(r, metric, "stage-2 faults per pass by host backing"),
            );
        }
        "exits" => add(
            "exit costs",
            charts::bars(r, headline, "exit roundtrip by exit type"),
        ),
        "pinning" => {
            add("pinned bytes", charts::pinned_bytes(r));
            add("pin time", charts::bars(r, "pin_ms", "time pinning"));
        }
        _ => add(headline, charts::bars(r, headline, headline)),
    }
    out
}

/// Writes `index.html` and `summary.md` into `dir`; returns the HTML path.
pub fn write(records: &[RunRecord], dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let index = dir.join("index.html");
    std::fs::write(&index, html::page(records))?;
    std::fs::write(dir.join("summary.md"), markdown::summary(records))?;
    Ok(index)
}
