//! Output paths given on the command line (`-o`, `--report`): checked before any work, and
//! their failures named with the option that chose them.

use std::path::{Path, PathBuf};

use crate::cli::Error;
use crate::lab;
use crate::record::RunRecord;

/// Whether the process can write `path` (an existing file, opened without truncating) or
/// create files in it (a directory: a probe file is created and removed). Trying is the only
/// answer that covers permissions, read-only mounts and root alike.
fn writable(path: &Path) -> Result<(), std::io::Error> {
    if path.is_dir() {
        let probe = path.join(format!(".hvlab-write-test-{}", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)?;
        std::fs::remove_file(&probe)
    } else {
        std::fs::OpenOptions::new().write(true).open(path).map(drop)
    }
}

/// Checks that a file can be written at `path` (creating its directory), before any work.
pub(super) fn check_output_file(
    path: &Path,
    what: &'static str,
    option: &'static str,
) -> Result<(), Error> {
    let fail = |why: String| Error::OutputPath {
        what,
        path: path.to_path_buf(),
        option,
        why,
    };
    if path.is_dir() {
        return Err(fail(
            "it is a directory; give a file path such as DIR/profile.toml".into(),
        ));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| {
        fail(format!(
            "cannot create its directory {}: {e}",
            dir.display()
        ))
    })?;
    let target = if path.exists() { path } else { dir };
    writable(target).map_err(|e| {
        fail(format!(
            "{} is not writable ({e}); choose a writable path",
            target.display()
        ))
    })
}

/// Checks that `dir` is (or can become) a writable directory, before any work.
pub(super) fn check_output_dir(
    dir: &Path,
    what: &'static str,
    option: &'static str,
) -> Result<(), Error> {
    let fail = |why: String| Error::OutputPath {
        what,
        path: dir.to_path_buf(),
        option,
        why,
    };
    if dir.exists() && !dir.is_dir() {
        return Err(fail(
            "a file of that name exists; the option takes a directory (hvlab writes index.html and summary.md into it): give a new or existing directory".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| {
        fail(format!(
            "cannot create the directory: {e}; choose a writable place"
        ))
    })?;
    writable(dir).map_err(|e| {
        fail(format!(
            "the directory is not writable ({e}); choose a writable place"
        ))
    })
}

/// Writes the report into `dir`, naming the path and the option on failure.
pub(super) fn write_report(
    records: &[RunRecord],
    fidelity: &[lab::fidelity::ThreadReport],
    fleet: &[RunRecord],
    dir: &Path,
    option: &'static str,
) -> Result<PathBuf, Error> {
    write_report_with(dir, option, |dir| {
        crate::export::write(records, fidelity, fleet, dir)
    })
}

/// Checks the report directory `dir` (given with `option`), then writes a report into it one
/// run at a time: `feed` hands each run to the function it is given
/// ([`crate::export::report::ReportWriter`]); the fleet page shows the first run of each
/// scenario and backend on each host among them. A failure leaves the previous report as it
/// was.
pub(super) fn write_report_streaming(
    dir: &Path,
    option: &'static str,
    fidelity: &[crate::lab::fidelity::ThreadReport],
    feed: impl FnOnce(&mut dyn FnMut(&RunRecord) -> Result<(), Error>) -> Result<(), Error>,
) -> Result<PathBuf, Error> {
    check_output_dir(dir, "the report", option)?;
    let fail = |e: std::io::Error| Error::OutputPath {
        what: "the report",
        path: dir.to_path_buf(),
        option,
        why: format!("{e}; choose a writable place"),
    };
    let mut writer = crate::export::report::ReportWriter::new(dir).map_err(fail)?;
    feed(&mut |r| writer.add(r).map_err(fail))?;
    writer.finish(fidelity, None).map_err(fail)
}

/// Checks the report directory `dir` (given with `option`), then writes the report into it with
/// `write`, an I/O failure becoming an error naming the directory and the option.
pub(super) fn write_report_with(
    dir: &Path,
    option: &'static str,
    write: impl FnOnce(&Path) -> std::io::Result<PathBuf>,
) -> Result<PathBuf, Error> {
    check_output_dir(dir, "the report", option)?;
    write(dir).map_err(|e| Error::OutputPath {
        what: "the report",
        path: dir.to_path_buf(),
        option,
        why: format!("{e}; choose a writable place"),
    })
}
