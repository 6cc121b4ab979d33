//! Moving runs between stores: `hvlab merge` ingests per-shard SQLite files, `hvlab export`
//! and `hvlab import` carry runs as JSON Lines (one [`RunRecord`] per line, the output
//! contract's shape). All three are idempotent: runs keep their ids (which end in 64 random
//! bits, so ids from different hosts and shards do not meet), a run already stored with the
//! same content is skipped, and one stored with the same id but different content is kept and
//! reported, never overwritten or silently dropped.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use super::{Ingested, Location, Store, StoreError, sqlite};
use crate::record::RunRecord;

/// How runs are written for another site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One run record (JSON, the output contract's shape) per line.
    Jsonl,
}

/// How `hvlab export` writes runs: for another site (JSON Lines, which `import` reads back) or
/// for a spreadsheet (CSV, one row per run, variant and metric; not read back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// One run record (JSON, the output contract's shape) per line.
    Jsonl,
    /// One row per run, variant and metric: the summary with its unit and 95% CI, no samples.
    Csv,
}

impl ExportFormat {
    /// Writes `runs` to `out` in this format.
    pub fn write(self, runs: &[RunRecord], out: &mut dyn Write) -> Result<(), StoreError> {
        match self {
            ExportFormat::Jsonl => write_jsonl(runs, out),
            ExportFormat::Csv => write_csv(runs, out),
        }
    }
}

/// The CSV columns, in order.
pub const CSV_HEADER: [&str; 20] = [
    "run_id",
    "started_at",
    "scenario",
    "backend",
    "profile",
    "kernel",
    "cpu",
    "hz",
    "tag",
    "suite",
    "sweep",
    "params",
    "variant",
    "status",
    "metric",
    "unit",
    "median",
    "ci95_low",
    "ci95_high",
    "n",
];

/// Writes `runs` as CSV (RFC 4180 quoting by the csv crate): one row per run × variant ×
/// metric, numbers as Rust prints them (shortest round-trip), parameters as `k=v` joined by `;`.
pub fn write_csv(runs: &[RunRecord], out: &mut dyn Write) -> Result<(), StoreError> {
    let fail = |e: csv::Error| StoreError::Output(std::io::Error::other(e));
    let mut w = csv::Writer::from_writer(out);
    w.write_record(CSV_HEADER).map_err(fail)?;
    for run in runs {
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        let params: Vec<String> = run
            .params
            .iter()
            .map(|(k, v)| format!("{k}={}", text(v)))
            .collect();
        let param = |k: &str| run.params.get(k).map(text).unwrap_or_default();
        for v in &run.variants {
            let status = v.status.to_string();
            // A variant without samples still gets a row, so its status shows.
            let rows: Vec<Option<(&String, &crate::record::MetricRecord)>> = if v.metrics.is_empty()
            {
                vec![None]
            } else {
                v.metrics.iter().map(Some).collect()
            };
            for m in rows {
                let num = |f: fn(&crate::record::MetricRecord) -> String| {
                    m.map(|(_, m)| f(m)).unwrap_or_default()
                };
                w.write_record([
                    run.run_id.clone(),
                    run.started_at.clone(),
                    run.scenario.clone(),
                    run.backend.to_string(),
                    run.profile.clone().unwrap_or_default(),
                    run.host.kernel.clone(),
                    run.host.cpu.clone(),
                    run.host.hz.to_string(),
                    run.tag.map(|t| t.to_string()).unwrap_or_default(),
                    param("suite"),
                    param("sweep"),
                    params.join(";"),
                    v.name.clone(),
                    status.clone(),
                    m.map(|(name, _)| name.clone()).unwrap_or_default(),
                    num(|m| m.unit.clone()),
                    num(|m| m.median.to_string()),
                    num(|m| m.ci95[0].to_string()),
                    num(|m| m.ci95[1].to_string()),
                    num(|m| m.n.to_string()),
                ])
                .map_err(fail)?;
            }
        }
    }
    w.flush().map_err(StoreError::Output)
}

/// What ingesting a set of runs did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Tally {
    /// Runs newly stored.
    pub stored: usize,
    /// Runs that were stored already, with the same content.
    pub already_stored: usize,
    /// Ids stored already with different content: not stored.
    pub conflicts: Vec<String>,
}

impl Tally {
    /// Runs seen.
    pub fn total(&self) -> usize {
        self.stored + self.already_stored + self.conflicts.len()
    }

    /// Adds another tally's counts.
    pub fn add(&mut self, other: &Tally) {
        self.stored += other.stored;
        self.already_stored += other.already_stored;
        self.conflicts.extend(other.conflicts.iter().cloned());
    }

    /// The conflicts as an error, when there are any.
    pub fn conflicts_error(&self) -> Option<StoreError> {
        (!self.conflicts.is_empty()).then(|| StoreError::Conflicts {
            count: self.conflicts.len(),
            ids: {
                let mut ids = self.conflicts.iter().take(5).cloned().collect::<Vec<_>>();
                if self.conflicts.len() > 5 {
                    ids.push("…".into());
                }
                ids.join(", ")
            },
        })
    }
}

/// Stores each run in `target` (one transaction each), counting what happened.
pub fn ingest_all(target: &mut Store, runs: &[RunRecord]) -> Result<Tally, StoreError> {
    let mut tally = Tally::default();
    for run in runs {
        match target.ingest(run)? {
            Ingested::Stored => tally.stored += 1,
            Ingested::AlreadyStored => tally.already_stored += 1,
            Ingested::Conflict => tally.conflicts.push(run.run_id.clone()),
        }
    }
    Ok(tally)
}

/// Ingests every run of the SQLite results file `source` into `target`. The file is only
/// read (a shard's file from an older hvlab is not migrated by merging it).
pub fn merge_file(target: &mut Store, source: &Path) -> Result<Tally, StoreError> {
    if let Location::Sqlite(t) = target.location() {
        let same = match (std::fs::canonicalize(t), std::fs::canonicalize(source)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        if same {
            return Err(StoreError::MergeIntoItself(source.display().to_string()));
        }
    }
    let runs = sqlite::read_records(source)?
        .into_iter()
        .map(|(id, json)| serde_json::from_str(&json).map_err(|e| StoreError::Corrupt(id, e)))
        .collect::<Result<Vec<RunRecord>, _>>()?;
    // Every run is checked before any is stored, as import does.
    for run in &runs {
        check_record(run).map_err(|why| StoreError::BadRun {
            path: source.to_path_buf(),
            run: run.run_id.clone(),
            why,
        })?;
    }
    ingest_all(target, &runs)
}

/// The runs named by `queries` (ids or unique parts), or every run oldest first when none.
pub fn select(store: &Store, queries: &[String]) -> Result<Vec<RunRecord>, StoreError> {
    if queries.is_empty() {
        let mut listing = store.list(usize::MAX)?;
        listing.reverse();
        listing.iter().map(|l| store.load(&l.run_id)).collect()
    } else {
        queries.iter().map(|q| store.load(q)).collect()
    }
}

/// Writes `runs` as JSON Lines.
pub fn write_jsonl(runs: &[RunRecord], out: &mut dyn Write) -> Result<(), StoreError> {
    for run in runs {
        serde_json::to_writer(&mut *out, run)
            .map_err(|e| StoreError::Output(std::io::Error::other(e)))?;
        out.write_all(b"\n").map_err(StoreError::Output)?;
    }
    out.flush().map_err(StoreError::Output)
}

/// Writes `runs` as JSON Lines to `path`. A regular file (or a new one) is written whole or
/// not at all: into a temporary file beside it, renamed over `path` once complete, so an
/// interrupted export never looks finished. Anything else is written through, as a shell
/// redirection would, and never renamed over: a device (`/dev/null`), a FIFO, or a symlink
/// (`/proc/self/fd/1` and other links: replacing a link's target by path could replace a file
/// that another process holds open as its output).
pub fn write_jsonl_file(runs: &[RunRecord], path: &Path) -> Result<(), StoreError> {
    write_file(runs, path, ExportFormat::Jsonl)
}

/// Writes `runs` in `format` to `path`, as [`write_jsonl_file`] does.
pub fn write_file(runs: &[RunRecord], path: &Path, format: ExportFormat) -> Result<(), StoreError> {
    let fail = |e| StoreError::Write(path.to_path_buf(), e);
    let link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(fail(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "it is a directory",
        ))),
        Ok(meta) if link || !meta.is_file() => {
            let descriptor = names_a_descriptor(path);
            write_through(
                runs,
                path,
                meta.is_file() && !descriptor,
                descriptor,
                format,
            )
        }
        Ok(_) => write_replacing(runs, path, format),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !link => {
            write_replacing(runs, path, format)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(fail(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "it is a symbolic link to a missing file",
        ))),
        Err(e) => Err(fail(e)),
    }
}

/// Whether `path` or a link it leads through is under `/proc` or `/dev` (`/proc/self/fd/1`,
/// `/dev/stdout`): an open descriptor of some process. Reopening it gives a new file offset,
/// so a regular file behind it is appended to, never truncated or overwritten from the start
/// (it may be a log the caller opened with `>>`).
fn names_a_descriptor(path: &Path) -> bool {
    let special = |p: &Path| p.starts_with("/proc") || p.starts_with("/dev");
    let mut at = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    for _ in 0..40 {
        if special(&at) {
            return true;
        }
        match std::fs::read_link(&at) {
            Ok(next) => at = at.parent().map_or(next.clone(), |dir| dir.join(&next)),
            Err(_) => return false,
        }
    }
    false
}

/// Writes into a special file or through a link as it is (`truncate`: the file behind it is a
/// regular file, whose old content goes; `append`: write at its end). A FIFO is opened without blocking, so one that no
/// process reads is refused at once instead of hanging the export.
fn write_through(
    runs: &[RunRecord],
    path: &Path,
    truncate: bool,
    append: bool,
    format: ExportFormat,
) -> Result<(), StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e| StoreError::Write(path.to_path_buf(), e);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(truncate)
        .append(append)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ENXIO) {
                fail(std::io::Error::other(
                    "it is a FIFO that no process is reading",
                ))
            } else {
                fail(e)
            }
        })?;
    set_blocking(&file).map_err(fail)?;
    let mut out = std::io::BufWriter::new(file);
    format.write(runs, &mut out).map_err(|e| match e {
        StoreError::Output(e) => fail(e),
        other => other,
    })
}

/// Clears `O_NONBLOCK` (set only to open a FIFO without waiting for a reader), so writes wait
/// for a slow reader instead of failing with `EAGAIN`.
fn set_blocking(file: &std::fs::File) -> std::io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(file)?;
    Ok(rustix::fs::fcntl_setfl(
        file,
        flags - rustix::fs::OFlags::NONBLOCK,
    )?)
}

/// Writes a regular file at `path` whole or not at all (temporary file, then rename).
fn write_replacing(
    runs: &[RunRecord],
    path: &Path,
    format: ExportFormat,
) -> Result<(), StoreError> {
    let fail = |e| StoreError::Write(path.to_path_buf(), e);
    let partial = partial_path(path);
    // A leftover of a killed export with this pid; create_new below never follows a link.
    let _ = std::fs::remove_file(&partial);
    let result = (|| {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&partial)
            .map_err(fail)?;
        let mut out = std::io::BufWriter::new(file);
        format.write(runs, &mut out).map_err(|e| match e {
            StoreError::Output(e) => fail(e),
            other => other,
        })?;
        out.into_inner()
            .map_err(|e| fail(e.into_error()))?
            .sync_all()
            .map_err(fail)?;
        std::fs::rename(&partial, path).map_err(fail)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".partial-{}", std::process::id()));
    path.with_file_name(name)
}

/// The longest line `import` reads: far above a run with 200,000 samples per metric in
/// several variants (a few MB), far below what would exhaust memory; a file without line breaks
/// (`/dev/zero`) is refused when it passes this.
pub const MAX_LINE_BYTES: usize = 256 << 20;

/// The largest sample magnitude a run may carry: beyond any time in ns, size in bytes or count
/// a host produces (1e18 ns is 31 years), and small enough that sums and spreads over any number
/// of samples stay finite, so statistics and charts are never fed an infinite range.
pub const MAX_SAMPLE: f64 = 1e18;

/// Reads a JSON Lines file of runs, streamed a line at a time with each line bounded
/// ([`MAX_LINE_BYTES`]); every line is parsed and checked ([`check_record`]) before any is
/// returned (so a bad file imports nothing); blank lines are skipped.
pub fn read_jsonl(path: &Path) -> Result<Vec<RunRecord>, StoreError> {
    let file = std::fs::File::open(path).map_err(|e| StoreError::Read(path.to_path_buf(), e))?;
    read_jsonl_from(path, std::io::BufReader::new(file), MAX_LINE_BYTES)
}

/// [`read_jsonl`] on any reader, lines bounded to `max_line` bytes; `path` names it in errors.
pub fn read_jsonl_from(
    path: &Path,
    mut reader: impl std::io::BufRead,
    max_line: usize,
) -> Result<Vec<RunRecord>, StoreError> {
    let bad = |line: usize, why: String| StoreError::BadLine {
        path: path.to_path_buf(),
        line,
        why,
    };
    let mut runs = Vec::new();
    let mut buf = Vec::new();
    for number in 1.. {
        buf.clear();
        let limit = u64::try_from(max_line)
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let read = std::io::Read::take(&mut reader, limit)
            .read_until(b'\n', &mut buf)
            .map_err(|e| StoreError::Read(path.to_path_buf(), e))?;
        if read == 0 {
            break;
        }
        if buf.len() > max_line {
            return Err(bad(
                number,
                format!("longer than {} MiB without a line break", max_line >> 20),
            ));
        }
        let text = std::str::from_utf8(&buf).map_err(|e| bad(number, format!("not UTF-8: {e}")))?;
        if text.trim().is_empty() {
            continue;
        }
        let run: RunRecord = serde_json::from_str(text).map_err(|e| bad(number, e.to_string()))?;
        check_record(&run).map_err(|why| bad(number, why))?;
        runs.push(run);
    }
    Ok(runs)
}

/// [`read_jsonl`] on text already read; `path` names it in errors.
pub fn parse_jsonl(path: &Path, text: &str) -> Result<Vec<RunRecord>, StoreError> {
    read_jsonl_from(path, text.as_bytes(), MAX_LINE_BYTES)
}

/// What a store could not hold, or a report could not draw, found before anything is stored:
/// two variants of one name (they collide in the store), a sample that is not finite or beyond
/// [`MAX_SAMPLE`].
pub fn check_record(run: &RunRecord) -> Result<(), String> {
    let mut names = std::collections::BTreeSet::new();
    for v in &run.variants {
        if !names.insert(v.name.as_str()) {
            return Err(format!(
                "run {} has two variants named `{}`; a run names each variant once",
                run.run_id, v.name
            ));
        }
        for (metric, m) in &v.metrics {
            let summary = [m.median, m.ci95[0], m.ci95[1], m.min, m.max];
            let all = m.samples.iter().chain(summary.iter()).enumerate();
            for (i, x) in all {
                if !x.is_finite() || x.abs() > MAX_SAMPLE {
                    let what = if i < m.samples.len() {
                        format!("sample {}", i + 1)
                    } else {
                        "summary value".to_string()
                    };
                    return Err(format!(
                        "{what} of {metric} in variant {} is {x:e}: not a finite number within ±{MAX_SAMPLE:e}, which no measurement reaches",
                        v.name
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_line_is_named_by_its_number() {
        let e = parse_jsonl(Path::new("runs.jsonl"), "\n{\"run_id\": 1}\n").unwrap_err();
        assert!(e.is_bad_input());
        let text = e.to_string();
        assert!(text.contains("runs.jsonl line 2"), "{text}");
        assert!(parse_jsonl(Path::new("x"), "\n \n").unwrap().is_empty());
    }

    #[test]
    fn conflicts_become_one_error_listing_the_ids() {
        let mut t = Tally::default();
        assert!(t.conflicts_error().is_none());
        t.conflicts = (0..7).map(|i| format!("run-{i}")).collect();
        let e = t.conflicts_error().unwrap().to_string();
        assert!(e.starts_with("7 run(s)") && e.contains("run-4, …"), "{e}");
    }
}
