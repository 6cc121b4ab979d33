//! The results store: SQLite (bundled), WAL mode.
//!
//! A run is written whole, in one transaction, after it has finished: the run row with its
//! host fingerprint, every sample of every metric, and the findings. A run interrupted before
//! that (Ctrl-C, a crash, a kill) leaves nothing behind, so no half-written run can ever be
//! listed as complete. The full record is also kept as JSON so `hvlab show` reprints exactly
//! what `hvlab run` printed.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, params};

use crate::record::RunRecord;

/// Store errors.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum StoreError {
    /// Cannot create the directory {0} for the results database: {1}
    CreateDir(PathBuf, std::io::Error),
    /// Cannot open the results database {0}: {1}. Point --db or $HVLAB_DB at a writable path.
    Open(PathBuf, rusqlite::Error),
    /// Results database error: {0}
    Sql(#[from] rusqlite::Error),
    /// Stored run {0} is unreadable: {1}
    Corrupt(String, serde_json::Error),
    /// No run matches `{0}`; `hvlab runs` lists the stored runs.
    NoSuchRun(String),
    /// `{0}` matches several runs ({1}); give more of the run id.
    AmbiguousRun(String, String),
    /// No home directory to put the results database in; use --db PATH or set $HVLAB_DB.
    NoHome,
    /// The results database path {0} is a directory: give a file path with --db PATH (for example {0}/hvlab.db), or move the directory aside.
    IsDirectory(PathBuf),
    /// {0} is not a results database (it is not an SQLite file at all): move it aside (`mv {0} {0}.bak`) and hvlab starts a new one there, or point --db at another file.
    NotADatabase(PathBuf),
    /// The results database {0} is corrupt ({1}): move it aside (`mv {0} {0}.bak`; `sqlite3 {0}.bak .recover` may save its runs) and hvlab starts a new one, or point --db at another file.
    CorruptFile(PathBuf, String),
    /// The results database {0} stayed locked by another hvlab for {1} s: {2}. Wait for it to finish, or use another --db.
    Locked(PathBuf, u64, rusqlite::Error),
}

impl StoreError {
    /// Errors caused by what the user typed.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            StoreError::NoSuchRun(_)
                | StoreError::AmbiguousRun(..)
                | StoreError::IsDirectory(_)
                | StoreError::NotADatabase(_)
        )
    }
}

const SCHEMA_VERSION: i64 = 1;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
    id            TEXT PRIMARY KEY,
    scenario      TEXT NOT NULL,
    backend       TEXT NOT NULL,
    profile       TEXT,
    started_at    TEXT NOT NULL,
    finished_at   TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status = 'complete'),
    kernel        TEXT NOT NULL,
    kvm_flavour   TEXT NOT NULL,
    hvlab_version TEXT NOT NULL,
    git_rev       TEXT NOT NULL,
    host_json     TEXT NOT NULL,
    params_json   TEXT NOT NULL,
    record_json   TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS samples (
    run_id  TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    variant TEXT NOT NULL,
    metric  TEXT NOT NULL,
    unit    TEXT NOT NULL,
    rep     INTEGER NOT NULL,
    value   REAL NOT NULL,
    PRIMARY KEY (run_id, variant, metric, rep)
);
CREATE TABLE IF NOT EXISTS variants (
    run_id  TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    ordinal INTEGER NOT NULL,
    name    TEXT NOT NULL,
    status  TEXT NOT NULL,
    PRIMARY KEY (run_id, ordinal)
);
CREATE TABLE IF NOT EXISTS findings (
    run_id  TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    variant TEXT NOT NULL,
    ordinal INTEGER NOT NULL,
    json    TEXT NOT NULL,
    PRIMARY KEY (run_id, variant, ordinal)
);
CREATE INDEX IF NOT EXISTS runs_by_scenario ON runs (scenario, started_at);
";

/// One row of `hvlab runs`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunListing {
    /// Run id.
    pub run_id: String,
    /// Scenario.
    pub scenario: String,
    /// Backend.
    pub backend: String,
    /// Start time.
    pub started_at: String,
    /// Kernel release.
    pub kernel: String,
    /// KVM flavour.
    pub kvm_flavour: String,
    /// Variant names.
    pub variants: Vec<String>,
}

/// An open results database.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

/// `--db`, else `$HVLAB_DB`, else `$XDG_DATA_HOME/hvlab/hvlab.db`, else
/// `~/.local/share/hvlab/hvlab.db`.
pub fn resolve_path(explicit: Option<&Path>) -> Result<PathBuf, StoreError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("HVLAB_DB").filter(|v| !v.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .ok_or(StoreError::NoHome)?;
    Ok(data.join("hvlab").join("hvlab.db"))
}

/// How long a command waits for another hvlab holding the database (a suite stores a run
/// every few seconds; a schema creation takes milliseconds).
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Whether an SQLite error is another connection holding a lock.
fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Turns an error met while opening `path` into one that says what the file is and what to do.
fn classify(path: &Path, e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::NotADatabase) => StoreError::NotADatabase(path.to_path_buf()),
        Some(rusqlite::ErrorCode::DatabaseCorrupt) => {
            StoreError::CorruptFile(path.to_path_buf(), e.to_string())
        }
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => {
            StoreError::Locked(path.to_path_buf(), BUSY_WAIT.as_secs(), e)
        }
        _ => StoreError::Open(path.to_path_buf(), e),
    }
}

/// Runs `step` until it stops failing with a lock held by another connection (the busy
/// handler covers most waits; a few lock upgrades, such as switching to WAL, bypass it).
fn retry_busy<T>(mut step: impl FnMut() -> rusqlite::Result<T>) -> rusqlite::Result<T> {
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(2);
    loop {
        match step() {
            Err(e) if is_busy(&e) && start.elapsed() < BUSY_WAIT => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

impl Store {
    /// Opens (creating when needed) the database at `path`. Safe against other hvlab
    /// processes opening or creating the same database at the same time: they wait for each
    /// other's locks, and the schema is created in one write transaction.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if path.is_dir() {
            return Err(StoreError::IsDirectory(path.to_path_buf()));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::CreateDir(dir.to_path_buf(), e))?;
        }
        let conn = Connection::open(path).map_err(|e| classify(path, e))?;
        conn.busy_timeout(BUSY_WAIT)
            .map_err(|e| classify(path, e))?;
        retry_busy(|| conn.pragma_update(None, "journal_mode", "WAL"))
            .map_err(|e| classify(path, e))?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(|e| classify(path, e))?;
        retry_busy(|| {
            // A database with its schema needs no write (it may be read-only).
            let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
            if version != 0 {
                return Ok(());
            }
            let done = conn
                .execute_batch(&format!("BEGIN IMMEDIATE;{SCHEMA}"))
                .and_then(|()| {
                    let version: i64 =
                        conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
                    if version == 0 {
                        conn.pragma_update(None, "user_version", SCHEMA_VERSION)?;
                    }
                    conn.execute_batch("COMMIT")
                });
            if done.is_err() && !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            done
        })
        .map_err(|e| classify(path, e))?;
        Ok(Store {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// Writes a finished run in one transaction. Should another run already have `run.run_id`
    /// (ids end in 64 random bits, so this is a formality), the run gets a fresh suffix rather
    /// than being lost; `run.run_id` is updated to the id it was stored under.
    pub fn save(&mut self, run: &mut RunRecord) -> Result<(), StoreError> {
        self.save_inner(run).map_err(|e| self.explain(e))
    }

    /// Turns a damaged-file error met after opening into one that says what to do.
    fn explain(&self, e: StoreError) -> StoreError {
        match e {
            StoreError::Sql(e)
                if matches!(
                    e.sqlite_error_code(),
                    Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
                ) =>
            {
                classify(&self.path, e)
            }
            other => other,
        }
    }

    fn save_inner(&mut self, run: &mut RunRecord) -> Result<(), StoreError> {
        // BEGIN IMMEDIATE waits in the busy handler for another writer.
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        while tx
            .query_row(
                "SELECT 1 FROM runs WHERE id = ?1",
                params![run.run_id],
                |_| Ok(()),
            )
            .optional()?
            .is_some()
        {
            let stem = run
                .run_id
                .rsplit_once('-')
                .map_or(run.run_id.as_str(), |(stem, _)| stem)
                .to_string();
            run.run_id = format!("{stem}-{}", crate::scenario::runner::run_id_suffix());
        }
        let run: &RunRecord = run;
        let json = |v: &dyn erased_json::Json| {
            v.encode()
                .map_err(|e| StoreError::Corrupt(run.run_id.clone(), e))
        };
        let host_json = json(&run.host)?;
        let params_json = json(&run.params)?;
        let record_json = json(run)?;
        tx.execute(
            "INSERT INTO runs (id, scenario, backend, profile, started_at, finished_at, status,
                               kernel, kvm_flavour, hvlab_version, git_rev,
                               host_json, params_json, record_json)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'complete', ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
            params![
                run.run_id,
                run.scenario,
                run.backend.to_string(),
                run.profile,
                run.started_at,
                run.finished_at,
                run.host.kernel,
                run.host.kvm_flavour.to_string(),
                run.host.hvlab_version,
                run.host.git_rev,
                host_json,
                params_json,
                record_json,
            ],
        )?;
        {
            let mut variant = tx.prepare(
                "INSERT INTO variants (run_id, ordinal, name, status) VALUES (?1, ?2, ?3, ?4)",
            )?;
            let mut sample = tx.prepare(
                "INSERT INTO samples (run_id, variant, metric, unit, rep, value) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            let mut finding = tx.prepare(
                "INSERT INTO findings (run_id, variant, ordinal, json) VALUES (?1, ?2, ?3, ?4)",
            )?;
            for (ordinal, v) in run.variants.iter().enumerate() {
                variant.execute(params![
                    run.run_id,
                    sql_int(ordinal),
                    v.name,
                    v.status.to_string()
                ])?;
                for (metric, m) in &v.metrics {
                    for (rep, value) in m.samples.iter().enumerate() {
                        sample.execute(params![
                            run.run_id,
                            v.name,
                            metric,
                            m.unit,
                            sql_int(rep),
                            value
                        ])?;
                    }
                }
                for (i, f) in v.findings.iter().enumerate() {
                    finding.execute(params![run.run_id, v.name, sql_int(i), json(f)?])?;
                }
            }
        }
        tx.commit()?;
        Ok(())
    }

    /// The most recent runs first.
    pub fn list(&self, limit: usize) -> Result<Vec<RunListing>, StoreError> {
        self.list_inner(limit).map_err(|e| self.explain(e))
    }

    fn list_inner(&self, limit: usize) -> Result<Vec<RunListing>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, scenario, backend, started_at, kernel, kvm_flavour,
                    (SELECT group_concat(name, ',') FROM
                        (SELECT name FROM variants WHERE run_id = runs.id ORDER BY ordinal))
             FROM runs WHERE status = 'complete' ORDER BY started_at DESC, id DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map(params![i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
            let variants: Option<String> = r.get(6)?;
            Ok(RunListing {
                run_id: r.get(0)?,
                scenario: r.get(1)?,
                backend: r.get(2)?,
                started_at: r.get(3)?,
                kernel: r.get(4)?,
                kvm_flavour: r.get(5)?,
                variants: variants
                    .map(|s| s.split(',').map(String::from).collect())
                    .unwrap_or_default(),
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Loads a run by its id or a unique part of it (a prefix, or any substring such as the
    /// trailing hex).
    pub fn load(&self, query: &str) -> Result<RunRecord, StoreError> {
        self.load_inner(query).map_err(|e| self.explain(e))
    }

    fn load_inner(&self, query: &str) -> Result<RunRecord, StoreError> {
        let exact: Option<String> = self
            .conn
            .query_row(
                "SELECT record_json FROM runs WHERE id = ?1",
                params![query],
                |r| r.get(0),
            )
            .optional()?;
        let json = match exact {
            Some(j) => j,
            None => {
                let mut stmt = self
                    .conn
                    .prepare("SELECT id, record_json FROM runs WHERE instr(id, ?1) > 0 ORDER BY started_at DESC")?;
                let hits: Vec<(String, String)> = stmt
                    .query_map(params![query], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                match hits.len() {
                    0 => return Err(StoreError::NoSuchRun(query.to_string())),
                    1 => hits.into_iter().next().map(|(_, j)| j).unwrap_or_default(),
                    _ => {
                        let ids: Vec<String> = hits.into_iter().take(4).map(|(id, _)| id).collect();
                        return Err(StoreError::AmbiguousRun(query.to_string(), ids.join(", ")));
                    }
                }
            }
        };
        serde_json::from_str(&json).map_err(|e| StoreError::Corrupt(query.to_string(), e))
    }

    /// The samples of one metric of one variant, in repetition order, as stored.
    pub fn samples(
        &self,
        run_id: &str,
        variant: &str,
        metric: &str,
    ) -> Result<Vec<f64>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT value FROM samples WHERE run_id = ?1 AND variant = ?2 AND metric = ?3 ORDER BY rep")?;
        let rows = stmt.query_map(params![run_id, variant, metric], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// SQLite integers are i64; indices never come near the limit.
fn sql_int(i: usize) -> i64 {
    i64::try_from(i).unwrap_or(i64::MAX)
}

/// Object-safe JSON encoding, so one closure in `save` serves every JSON column.
mod erased_json {
    pub trait Json {
        fn encode(&self) -> Result<String, serde_json::Error>;
    }
    impl<T: serde::Serialize> Json for T {
        fn encode(&self) -> Result<String, serde_json::Error> {
            serde_json::to_string(self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::host::probe;
    use crate::record::{MetricRecord, VariantRecord};

    fn record(id: &str) -> RunRecord {
        let mut metrics = std::collections::BTreeMap::new();
        metrics.insert(
            "ready_ms".to_string(),
            MetricRecord::new("ms", vec![7.5, 7.6, 7.4], 1),
        );
        RunRecord {
            run_id: id.to_string(),
            scenario: "lifecycle".into(),
            backend: crate::backend::BackendKind::Kvm,
            profile: None,
            host: probe(),
            params: Default::default(),
            started_at: "2026-11-22T10:00:00Z".into(),
            finished_at: "2026-11-22T10:00:05Z".into(),
            variants: vec![VariantRecord {
                name: "irqchip-first".into(),
                status: crate::record::VariantStatus::Ok,
                metrics,
                findings: vec![],
                timeline: Vec::new(),
                pinned_bytes: Vec::new(),
            }],
            verdicts: vec![],
        }
    }

    #[test]
    fn a_saved_run_lists_loads_and_keeps_its_samples() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("sub/hvlab.db")).unwrap();
        let mut run = record("2026-11-22T10:00:00Z-lifecycle-kvm-3f2a");
        store.save(&mut run).unwrap();
        let list = store.list(10).unwrap();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].variants, vec!["irqchip-first".to_string()]);
        assert_eq!(store.load(&run.run_id).unwrap(), run);
        assert_eq!(store.load("3f2a").unwrap().run_id, run.run_id);
        assert_eq!(
            store
                .samples(&run.run_id, "irqchip-first", "ready_ms")
                .unwrap(),
            vec![7.5, 7.6, 7.4]
        );
    }

    #[test]
    fn unknown_and_ambiguous_ids_are_input_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("hvlab.db")).unwrap();
        store
            .save(&mut record("2026-11-22T10:00:00Z-lifecycle-kvm-aaaa"))
            .unwrap();
        store
            .save(&mut record("2026-11-22T10:00:01Z-lifecycle-kvm-aaab"))
            .unwrap();
        let e = store.load("zzzz").unwrap_err();
        assert!(matches!(e, StoreError::NoSuchRun(_)) && e.is_bad_input());
        assert!(matches!(
            store.load("lifecycle").unwrap_err(),
            StoreError::AmbiguousRun(..)
        ));
    }

    #[test]
    fn a_failed_write_leaves_nothing_behind() {
        // Two variants with the same name collide on the samples primary key midway through
        // the transaction: the run row written before the failure must roll back with it.
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("hvlab.db")).unwrap();
        let mut run = record("2026-11-22T10:00:00Z-lifecycle-kvm-dup0");
        run.variants.push(run.variants[0].clone());
        assert!(store.save(&mut run).is_err());
        assert!(store.list(10).unwrap().is_empty());
        let rows: i64 = store
            .conn
            .query_row("SELECT count(*) FROM samples", [], |r| r.get(0))
            .unwrap();
        assert_eq!(rows, 0);
    }

    #[test]
    fn a_colliding_run_id_is_renamed_never_lost() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("hvlab.db")).unwrap();
        let id = "2026-11-22T10:00:00Z-lifecycle-kvm-0000";
        let (mut first, mut second) = (record(id), record(id));
        store.save(&mut first).unwrap();
        store.save(&mut second).unwrap();
        assert_eq!(first.run_id, id);
        assert_ne!(second.run_id, id);
        assert!(
            second
                .run_id
                .starts_with("2026-11-22T10:00:00Z-lifecycle-kvm-")
        );
        assert_eq!(store.list(10).unwrap().len(), 2);
        assert_eq!(store.load(&second.run_id).unwrap(), second);
    }

    #[test]
    fn the_explicit_path_wins_over_the_environment() {
        let p = resolve_path(Some(Path::new("/tmp/x.db"))).unwrap();
        assert_eq!(p, PathBuf::from("/tmp/x.db"));
    }
}
