//! Moving runs between stores: `hvlab merge` ingests per-shard SQLite files, `hvlab export`
//! and `hvlab import` carry runs as JSON Lines (one [`RunRecord`] per line, the output
//! contract's shape). All three are idempotent: runs keep their ids (which end in 64 random
//! bits, so ids from different hosts and shards do not meet), a run already stored with the
//! same content is skipped, and one stored with the same id but different content is kept and
//! reported, never overwritten or silently dropped.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{Ingested, Location, Store, StoreError, sqlite};
use crate::record::RunRecord;

/// How runs are written for another site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One run record (JSON, the output contract's shape) per line.
    Jsonl,
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

/// Writes `runs` as JSON Lines to `path`, whole or not at all: into a temporary file beside
/// it, renamed over `path` once complete, so an interrupted export never looks finished.
pub fn write_jsonl_file(runs: &[RunRecord], path: &Path) -> Result<(), StoreError> {
    let fail = |e| StoreError::Write(path.to_path_buf(), e);
    let partial = partial_path(path);
    let result = (|| {
        let file = std::fs::File::create(&partial).map_err(fail)?;
        let mut out = std::io::BufWriter::new(file);
        write_jsonl(runs, &mut out).map_err(|e| match e {
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

/// Reads a JSON Lines file of runs, every line checked before any is returned (so a bad file
/// imports nothing); blank lines are skipped.
pub fn read_jsonl(path: &Path) -> Result<Vec<RunRecord>, StoreError> {
    let text =
        std::fs::read_to_string(path).map_err(|e| StoreError::Read(path.to_path_buf(), e))?;
    parse_jsonl(path, &text)
}

/// [`read_jsonl`] on text already read; `path` names it in errors.
pub fn parse_jsonl(path: &Path, text: &str) -> Result<Vec<RunRecord>, StoreError> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line).map_err(|e| StoreError::BadLine {
                path: path.to_path_buf(),
                line: i + 1,
                why: e.to_string(),
            })
        })
        .collect()
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
