//! Moving runs between stores: `hvlab merge` ingests per-shard SQLite files, `hvlab import`
//! stores the runs of a JSON Lines export (one [`RunRecord`] per line, the output contract's
//! shape; the binary's exporters write it). All three are idempotent: runs keep their ids (which end in 64 random
//! bits, so ids from different hosts and shards do not meet), a run already stored with the
//! same content is skipped, and one stored with the same id but different content is kept and
//! reported, never overwritten or silently dropped.

use std::io::BufRead;
use std::path::Path;

use super::{Ingested, Location, Store, StoreError, sqlite};
use crate::record::RunRecord;

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
    // Nothing downstream trusts a summary its samples do not give.
    if let Some(why) = run.contradiction() {
        return Err(format!(
            "run {}: {why}; its summaries and verdicts must follow from its samples (export it again from the hvlab that ran it)",
            run.run_id
        ));
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
