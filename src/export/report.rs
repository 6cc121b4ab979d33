//! Writing a report one run at a time, so its size does not bound the memory it takes: each
//! run's page goes to disk as it comes (a sweep point has a line in its row's page instead:
//! thousands of points would be thousands of chart pages), and only a line per run stays for
//! the first screen ([`Summary`]). Everything is written into a staging directory inside the
//! report's directory and moved into place at the end ([`ReportWriter::finish`]), so no
//! failure leaves a half-written report or loses the previous one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::html;
use super::summary::{GROUPS_DIR, RUNS_DIR, Summary, group_page_name, run_page_name, warnings};
use crate::lab::fidelity::ThreadReport;
use crate::lab::fleet::HostFingerprint;
use crate::record::{RunRecord, RunTag};

/// A report being written.
#[derive(Debug)]
pub struct ReportWriter {
    dir: PathBuf,
    staging: tempfile::TempDir,
    summary: Summary,
    /// The suite's showcases (a handful), for the threads' headlines.
    showcases: Vec<RunRecord>,
    /// The latest run of each scenario and backend on each host, for the fleet page when the
    /// caller has none of its own.
    latest: Vec<RunRecord>,
    latest_keys: BTreeSet<(String, String, HostFingerprint)>,
    /// The Markdown sections of the runs with pages.
    markdown: String,
    /// The machine of the first measured run.
    host: Option<hvlab_core::host::HostInfo>,
    runs: usize,
}

impl ReportWriter {
    /// Starts a report in `dir` (created if missing), refusing before anything is written a
    /// name hvlab would replace that is not its own regular file or directory.
    pub fn new(dir: &Path) -> std::io::Result<ReportWriter> {
        std::fs::create_dir_all(dir)?;
        for name in [
            "index.html",
            "summary.md",
            html::FLEET_FILE,
            html::FIDELITY_FILE,
        ] {
            refuse_foreign(&dir.join(name), false)?;
        }
        for name in [RUNS_DIR, GROUPS_DIR] {
            refuse_foreign(&dir.join(name), true)?;
        }
        let staging = tempfile::Builder::new()
            .prefix(".hvlab-report-")
            .tempdir_in(dir)?;
        std::fs::create_dir(staging.path().join(RUNS_DIR))?;
        std::fs::create_dir(staging.path().join(GROUPS_DIR))?;
        Ok(ReportWriter {
            dir: dir.to_path_buf(),
            staging,
            summary: Summary::new(),
            showcases: Vec::new(),
            latest: Vec::new(),
            latest_keys: BTreeSet::new(),
            markdown: String::new(),
            host: None,
            runs: 0,
        })
    }

    /// Adds the next run: its page written now, a line of it kept.
    pub fn add(&mut self, r: &RunRecord) -> std::io::Result<()> {
        let page = run_page_name(self.runs, r);
        if !page.is_empty() {
            let html = html::run_page(r).map_err(super::rendering)?;
            write_synced(&self.staging.path().join(&page), html.as_bytes())?;
            super::markdown::run_section(&mut self.markdown, r);
        }
        self.summary.add(r, page);
        if r.tag == Some(RunTag::Showcase) {
            self.showcases.push(r.clone());
        }
        if self.latest_keys.insert((
            r.scenario.clone(),
            r.backend.to_string(),
            HostFingerprint::of_run(r),
        )) && self.latest.len() < 1000
        {
            self.latest.push(r.clone());
        }
        if self.host.is_none() && r.backend.capabilities().real_time {
            self.host = Some(r.host.clone());
        }
        self.runs += 1;
        Ok(())
    }

    /// Writes the first screen, the rows' pages, the fleet page (of `fleet`, else the first
    /// run of each scenario and backend on each host among those added), the fidelity page and
    /// the Markdown summary, and moves the report into place. Returns the index's path.
    pub fn finish(
        self,
        fidelity: &[ThreadReport],
        fleet: Option<&[RunRecord]>,
    ) -> std::io::Result<PathBuf> {
        let ReportWriter {
            dir,
            staging,
            mut summary,
            showcases,
            latest,
            markdown,
            host,
            runs,
            ..
        } = self;
        let mut rows = summary.rows(group_page_name);
        for (i, row) in rows.iter_mut().enumerate() {
            if row.runs > 1 || row.page.is_empty() {
                row.page = group_page_name(i);
                let page = html::group_page(row).map_err(super::rendering)?;
                write_synced(&staging.path().join(&row.page), page.as_bytes())?;
            }
        }
        let refs: Vec<&RunRecord> = showcases.iter().collect();
        let threads = crate::lab::threads::lines(&refs, fidelity);
        let warnings = warnings(&rows);
        let first = html::FirstScreen {
            runs,
            threads: &threads,
            fidelity,
            host: host.as_ref(),
            warnings: warnings.clone(),
            showcase_pages: summary.showcase_pages(),
        };
        let index = html::index_page(&rows, &first).map_err(super::rendering)?;
        let fleet = html::fleet_page(fleet.unwrap_or(&latest)).map_err(super::rendering)?;
        let md = super::markdown::first_screen(&rows, &threads, fidelity, &warnings)
            + &markdown
            + &super::markdown::fidelity_table(fidelity);
        let mut files: Vec<(&str, Vec<u8>)> = vec![
            ("index.html", index.into_bytes()),
            (html::FLEET_FILE, fleet.into_bytes()),
            ("summary.md", md.into_bytes()),
        ];
        if !fidelity.is_empty() {
            files.push((
                html::FIDELITY_FILE,
                html::fidelity_page(fidelity)
                    .map_err(super::rendering)?
                    .into_bytes(),
            ));
        }
        for (name, content) in &files {
            write_synced(&staging.path().join(name), content)?;
        }
        // The page directories first (each swapped whole), then the files that link to them.
        for name in [RUNS_DIR, GROUPS_DIR] {
            swap_dir(&staging.path().join(name), &dir.join(name))?;
        }
        for (name, _) in &files {
            std::fs::rename(staging.path().join(name), dir.join(name))?;
        }
        Ok(dir.join("index.html"))
    }
}

/// Refuses a path hvlab would replace that is a symbolic link, a FIFO or a device (followed,
/// it would write elsewhere); `dir`: it must be a directory if it exists.
fn refuse_foreign(path: &Path, dir: bool) -> std::io::Result<()> {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    let fine = if dir { meta.is_dir() } else { meta.is_file() };
    if fine {
        return Ok(());
    }
    let what = if meta.file_type().is_symlink() {
        "a symbolic link"
    } else if meta.is_dir() {
        "a directory"
    } else if dir {
        "not a directory"
    } else {
        "not a regular file"
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        format!(
            "{} is {what}: hvlab replaces only its own files there; remove it or choose another directory",
            path.display()
        ),
    ))
}

fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    std::io::Write::write_all(&mut file, bytes)?;
    file.sync_all()
}

/// Moves the directory `new` to `target`, the previous one (if any) aside first and removed
/// after, so a reader finds a whole directory at every moment but the two renames.
fn swap_dir(new: &Path, target: &Path) -> std::io::Result<()> {
    if target.exists() {
        let old = target.with_file_name(format!(
            ".{}-old-{}",
            target.file_name().unwrap_or_default().to_string_lossy(),
            std::process::id()
        ));
        std::fs::rename(target, &old)?;
        std::fs::rename(new, target)?;
        std::fs::remove_dir_all(&old)
    } else {
        std::fs::rename(new, target)
    }
}
