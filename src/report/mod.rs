//! Reports: one self-contained HTML page (inline CSS and SVG, no scripts, no external
//! references) and a Markdown summary, from stored run records.

mod charts;
pub mod escape;
mod fleet;
mod html;
mod markdown;
mod style;
mod sweep;
pub mod words;

use std::path::{Path, PathBuf};

use crate::lab::fidelity::ThreadReport;
use crate::record::RunRecord;
use crate::scenario::Chart;
pub use sweep::SweepView;

/// The charts of one run, in reading order: (caption, SVG). Every run opens with the
/// distribution of its headline metric; its scenario names the rest.
pub fn charts_for(r: &RunRecord) -> Vec<(String, String)> {
    let Ok(scenario) = crate::scenario::scenario(&r.scenario) else {
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

/// Writes `index.html` (summary first), `summary.md` and the fleet page `fleet.html` (the
/// `fleet` runs grouped by host) into `dir`; returns the index's path. `fidelity`, when given,
/// is the model against the kernel threads: its headline is linked from the index, its table
/// is a page of its own (`fidelity.html`). Written as [`publish`] writes.
pub fn write(
    records: &[RunRecord],
    fidelity: &[ThreadReport],
    fleet: &[RunRecord],
    dir: &Path,
) -> std::io::Result<PathBuf> {
    let mut files = vec![
        ("index.html", html::page(records, fidelity)),
        (fleet::FILE, fleet::page(fleet)),
        ("summary.md", markdown::summary(records, fidelity)),
    ];
    if !fidelity.is_empty() {
        files.push((html::FIDELITY_FILE, html::fidelity_page(fidelity)));
    }
    publish(dir, &files)?;
    Ok(dir.join("index.html"))
}

/// Writes a sweep's `index.html` and `summary.md` into `dir`; returns the HTML path.
pub fn write_sweep(view: &SweepView, dir: &Path) -> std::io::Result<PathBuf> {
    publish(
        dir,
        &[
            ("index.html", sweep::page(view)),
            ("summary.md", sweep::summary(view)),
        ],
    )?;
    Ok(dir.join("index.html"))
}

/// Puts `files` (name, content) into `dir` so that no failure leaves a truncated page or loses
/// the previous report: every file is written and synced in a fresh staging directory inside
/// `dir` (same file system), and only then renamed into place. Only regular files are
/// replaced: a symlink (followed, it would overwrite its target elsewhere), a FIFO or a device
/// at one of the names is refused before anything is written.
pub fn publish(dir: &Path, files: &[(&str, String)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, _) in files {
        let path = dir.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if !meta.is_file() => {
                let what = if meta.file_type().is_symlink() {
                    "a symbolic link"
                } else if meta.is_dir() {
                    "a directory"
                } else {
                    "not a regular file"
                };
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!(
                        "{} is {what}: hvlab replaces only its own regular files there; remove it or choose another directory",
                        path.display()
                    ),
                ));
            }
            _ => {}
        }
    }
    let staging = tempfile::Builder::new()
        .prefix(".hvlab-report-")
        .tempdir_in(dir)?;
    for (name, content) in files {
        let path = staging.path().join(name);
        let mut file = std::fs::File::create(&path)?;
        std::io::Write::write_all(&mut file, content.as_bytes())?;
        file.sync_all()?;
    }
    for (name, _) in files {
        std::fs::rename(staging.path().join(name), dir.join(name))?;
    }
    // The staging directory, now empty, goes with `staging`.
    Ok(())
}
