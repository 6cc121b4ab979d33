//! The SQLite engine: one file, WAL mode, the default store.

use std::path::{Path, PathBuf};

use rusqlite::{Connection, OptionalExtension, Transaction, params};

use super::{
    Ingested, RUN_COLUMNS, RunListing, RunRow, StoreError, insert_run_sql, renamed, same_content,
    schema,
};
use crate::record::RunRecord;

/// How long a command waits for another hvlab holding the database (a suite stores a run
/// every few seconds; a schema creation takes milliseconds).
const BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// An open SQLite results database.
#[derive(Debug)]
pub(super) struct SqliteStore {
    conn: Connection,
    path: PathBuf,
}

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

/// What opening found about the schema.
enum Upgrade {
    Current,
    TooNew(i64),
    /// Tables, but no hvlab schema version: another program's database.
    Foreign,
}

/// The schema version and whether the database has any table or index of its own (SQLite's
/// internal ones aside), read in one statement: one snapshot, so another hvlab committing its
/// schema in between cannot make a new store look like another program's.
fn version_and_tables(conn: &Connection) -> rusqlite::Result<(i64, bool)> {
    conn.query_row(
        "SELECT (SELECT user_version FROM pragma_user_version),
                (SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite!_%' ESCAPE '!')",
        [],
        |r| Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)? > 0)),
    )
}

/// Another program's database: tables, but no hvlab schema version.
fn is_foreign(conn: &Connection) -> rusqlite::Result<bool> {
    version_and_tables(conn).map(|(v, tables)| v == 0 && tables)
}

/// Refuses a path that exists but is not a regular file (a directory, a FIFO, a device, a
/// socket): SQLite would block on a FIFO or fail with "disk I/O error" on the others.
fn require_regular(path: &Path) -> Result<bool, StoreError> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(false);
    };
    let t = meta.file_type();
    let what = if t.is_file() {
        return Ok(true);
    } else if t.is_dir() {
        return Err(StoreError::IsDirectory(path.to_path_buf()));
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else {
        "not a file"
    };
    Err(StoreError::NotRegular(path.to_path_buf(), what))
}

/// `path` as an SQLite `file:` URI (bytes outside the unreserved set percent-encoded), with
/// `query` appended.
fn file_uri(path: &Path, query: &str) -> String {
    use std::os::unix::ffi::OsStrExt;
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut uri = String::from("file:");
    for &b in absolute.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'/' | b'-' | b'_' | b'.' | b'~') {
            uri.push(char::from(b));
        } else {
            uri.push_str(&format!("%{b:02X}"));
        }
    }
    uri.push('?');
    uri.push_str(query);
    uri
}

/// Opens `path` to read only, creating nothing beside it: as immutable when no `-wal` file
/// exists (no writer has it open, so there is nothing to coordinate with, and it works on a
/// read-only mount), else read-only with the usual locking, so the writer's pending pages are
/// seen.
fn open_read_only(path: &Path) -> rusqlite::Result<Connection> {
    use rusqlite::OpenFlags;
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let mut wal = path.as_os_str().to_os_string();
    wal.push("-wal");
    let query = if Path::new(&wal).exists() {
        "mode=ro"
    } else {
        "mode=ro&immutable=1"
    };
    let conn = Connection::open_with_flags(file_uri(path, query), flags)?;
    conn.busy_timeout(BUSY_WAIT)?;
    Ok(conn)
}

/// Brings the schema to [`schema::LATEST`] in one write transaction (a store already there
/// needs no write, so a read-only one still opens).
fn migrate(conn: &Connection) -> rusqlite::Result<Upgrade> {
    let (version, tables) = version_and_tables(conn)?;
    if version == 0 && tables {
        return Ok(Upgrade::Foreign);
    }
    if version == schema::LATEST {
        return Ok(Upgrade::Current);
    }
    if version > schema::LATEST {
        return Ok(Upgrade::TooNew(version));
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let done = (|| {
        // Another process may have migrated it while this one waited for the lock.
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        if version > schema::LATEST {
            return Ok(Upgrade::TooNew(version));
        }
        if is_foreign(conn)? {
            return Ok(Upgrade::Foreign);
        }
        for m in schema::pending(version) {
            conn.execute_batch(m.sqlite)?;
        }
        conn.pragma_update(None, "user_version", schema::LATEST)?;
        Ok(Upgrade::Current)
    })();
    match done {
        Ok(Upgrade::Current) => conn.execute_batch("COMMIT").map(|()| Upgrade::Current),
        other => {
            if !conn.is_autocommit() {
                let _ = conn.execute_batch("ROLLBACK");
            }
            other
        }
    }
}

impl SqliteStore {
    /// Opens (creating when needed) the database at `path`. Safe against other hvlab
    /// processes opening or creating the same database at the same time: they wait for each
    /// other's locks, and the schema is migrated in one write transaction.
    pub(super) fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        require_regular(path)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| StoreError::CreateDir(dir.to_path_buf(), e))?;
        }
        let conn = Connection::open(path).map_err(|e| classify(path, e))?;
        conn.busy_timeout(BUSY_WAIT)
            .map_err(|e| classify(path, e))?;
        // Another program's database is refused before anything (even the journal mode) is
        // changed in it.
        if retry_busy(|| is_foreign(&conn)).map_err(|e| classify(path, e))? {
            return Err(StoreError::Foreign(path.to_path_buf()));
        }
        retry_busy(|| conn.pragma_update(None, "journal_mode", "WAL"))
            .map_err(|e| classify(path, e))?;
        conn.pragma_update(None, "foreign_keys", "ON")
            .map_err(|e| classify(path, e))?;
        match retry_busy(|| migrate(&conn)).map_err(|e| classify(path, e))? {
            Upgrade::Current => {}
            Upgrade::TooNew(found) => {
                return Err(StoreError::TooNew {
                    location: path.display().to_string(),
                    found,
                    supported: schema::LATEST,
                });
            }
            Upgrade::Foreign => return Err(StoreError::Foreign(path.to_path_buf())),
        }
        // Damage that the header does not show (random bytes over a page) is found before a
        // run is stored into the file, not afterwards by `runs` and `report`.
        check_integrity(&conn, path)?;
        Ok(SqliteStore {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// Opens the database at `path` to read it only: nothing is created or written, and no
    /// pragma is set on the file (see [`super::Store::open_read`]). A missing or empty file
    /// reads as an empty store; a store from an older hvlab is read into memory and migrated
    /// there.
    pub(super) fn open_read(path: &Path) -> Result<SqliteStore, StoreError> {
        if !require_regular(path)? {
            return SqliteStore::in_memory(path, &[]);
        }
        let conn = open_read_only(path).map_err(|e| classify(path, e))?;
        let (version, tables) = version_and_tables(&conn).map_err(|e| classify(path, e))?;
        if version == 0 {
            return if tables {
                Err(StoreError::Foreign(path.to_path_buf()))
            } else {
                SqliteStore::in_memory(path, &[])
            };
        }
        if version > schema::LATEST {
            return Err(StoreError::TooNew {
                location: path.display().to_string(),
                found: version,
                supported: schema::LATEST,
            });
        }
        if version < schema::LATEST {
            drop(conn);
            return SqliteStore::in_memory(path, &read_records(path)?);
        }
        conn.pragma_update(None, "query_only", "ON")
            .map_err(|e| classify(path, e))?;
        Ok(SqliteStore {
            conn,
            path: path.to_path_buf(),
        })
    }

    /// A store in memory holding `records` (id, record JSON), named `path` in messages.
    fn in_memory(path: &Path, records: &[(String, String)]) -> Result<SqliteStore, StoreError> {
        let conn = Connection::open_in_memory()?;
        match migrate(&conn)? {
            Upgrade::Current => {}
            Upgrade::TooNew(_) | Upgrade::Foreign => {
                return Err(StoreError::CorruptFile(
                    path.to_path_buf(),
                    "an empty database in memory has a schema".into(),
                ));
            }
        }
        let mut store = SqliteStore {
            conn,
            path: path.to_path_buf(),
        };
        for (id, json) in records {
            let run: RunRecord =
                serde_json::from_str(json).map_err(|e| StoreError::Corrupt(id.clone(), e))?;
            store.ingest_inner(&run)?;
        }
        Ok(store)
    }

    /// The schema version the store is at (after opening: [`schema::LATEST`]).
    #[cfg(test)]
    fn schema_version(&self) -> Result<i64, StoreError> {
        Ok(self
            .conn
            .pragma_query_value(None, "user_version", |r| r.get(0))?)
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

    pub(super) fn save(&mut self, run: &mut RunRecord) -> Result<(), StoreError> {
        self.save_inner(run).map_err(|e| self.explain(e))
    }

    fn save_inner(&mut self, run: &mut RunRecord) -> Result<(), StoreError> {
        // BEGIN IMMEDIATE waits in the busy handler for another writer.
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        while stored_json(&tx, &run.run_id)?.is_some() {
            run.run_id = renamed(&run.run_id);
        }
        insert(&tx, &RunRow::of(run)?)?;
        tx.commit()?;
        Ok(())
    }

    pub(super) fn ingest(&mut self, run: &RunRecord) -> Result<Ingested, StoreError> {
        self.ingest_inner(run).map_err(|e| self.explain(e))
    }

    fn ingest_inner(&mut self, run: &RunRecord) -> Result<Ingested, StoreError> {
        let tx = self
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let outcome = match stored_json(&tx, &run.run_id)? {
            Some(json) if same_content(&json, run) => Ingested::AlreadyStored,
            Some(_) => Ingested::Conflict,
            None => {
                insert(&tx, &RunRow::of(run)?)?;
                Ingested::Stored
            }
        };
        tx.commit()?;
        Ok(outcome)
    }

    pub(super) fn list(&self, limit: usize) -> Result<Vec<RunListing>, StoreError> {
        self.list_inner(limit).map_err(|e| self.explain(e))
    }

    fn list_inner(&self, limit: usize) -> Result<Vec<RunListing>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, scenario, backend, started_at, kernel, kvm_flavour, cpu, hz,
                    (SELECT json_group_array(name) FROM
                        (SELECT name FROM variants WHERE run_id = runs.id ORDER BY ordinal)),
                    profile, tag, suite, params_json, baseline, clock
             FROM runs WHERE status = 'complete' ORDER BY started_at DESC, id DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map(params![i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
            let variants: Option<String> = r.get(8)?;
            let hz: i64 = r.get(7)?;
            Ok(RunListing {
                run_id: r.get(0)?,
                scenario: r.get(1)?,
                backend: r.get::<_, String>(2)?.parse().map_err(|e: String| {
                    rusqlite::Error::FromSqlConversionFailure(
                        2,
                        rusqlite::types::Type::Text,
                        e.into(),
                    )
                })?,
                started_at: r.get(3)?,
                kernel: r.get(4)?,
                kvm_flavour: r.get(5)?,
                cpu: r.get(6)?,
                hz: u32::try_from(hz).unwrap_or(0),
                variants: variants
                    .and_then(|s| serde_json::from_str(&s).ok())
                    .unwrap_or_default(),
                profile: r.get(9)?,
                tag: super::tag_of(r.get(10)?),
                suite: r.get(11)?,
                params: super::params_of(&r.get::<_, String>(12)?),
                baseline: r.get(13)?,
                clock: r.get::<_, String>(14)?.parse().map_err(|e: String| {
                    rusqlite::Error::FromSqlConversionFailure(
                        14,
                        rusqlite::types::Type::Text,
                        e.into(),
                    )
                })?,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    pub(super) fn load_json(&self, query: &str) -> Result<String, StoreError> {
        self.load_inner(query).map_err(|e| self.explain(e))
    }

    fn load_inner(&self, query: &str) -> Result<String, StoreError> {
        if let Some(json) = stored_json(&self.conn, query)? {
            return Ok(json);
        }
        let mut stmt = self.conn.prepare(
            "SELECT id, record_json FROM runs WHERE instr(id, ?1) > 0 ORDER BY started_at DESC",
        )?;
        let hits: Vec<(String, String)> = stmt
            .query_map(params![query], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<Result<_, _>>()?;
        super::one_hit(query, hits)
    }

    /// (id, record) of every run whose `sweep` parameter is `id`, oldest first.
    pub(super) fn sweep_json(&self, id: &str) -> Result<Vec<(String, String)>, StoreError> {
        let mut stmt = self.conn.prepare(
            "SELECT id, record_json FROM runs WHERE json_extract(params_json, '$.sweep') = ?1
             ORDER BY started_at, id",
        )?;
        let rows = stmt.query_map(params![id], |r| Ok((r.get(0)?, r.get(1)?)))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// The samples of one metric of one variant, in repetition order, as stored.
    #[cfg(test)]
    fn samples(&self, run_id: &str, variant: &str, metric: &str) -> Result<Vec<f64>, StoreError> {
        let mut stmt = self
            .conn
            .prepare("SELECT value FROM samples WHERE run_id = ?1 AND variant = ?2 AND metric = ?3 ORDER BY rep")?;
        let rows = stmt.query_map(params![run_id, variant, metric], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

/// The stored record of the run with exactly this id.
fn stored_json(conn: &Connection, id: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT record_json FROM runs WHERE id = ?1",
        params![id],
        |r| r.get(0),
    )
    .optional()
}

/// How many of [`RUN_COLUMNS`] a schema-2 store has.
#[cfg(test)]
const V2_COLUMNS: usize = 15;

/// A run's values for [`RUN_COLUMNS`], in their order.
fn run_values(row: &RunRow) -> [&dyn rusqlite::ToSql; 19] {
    run_values!(row)
}

/// Every row of one run, inside the caller's transaction.
fn insert(tx: &Transaction<'_>, row: &RunRow) -> rusqlite::Result<()> {
    tx.execute(
        &insert_run_sql(RUN_COLUMNS.len(), '?'),
        &run_values(row)[..],
    )?;
    let mut variant =
        tx.prepare("INSERT INTO variants (run_id, ordinal, name, status) VALUES (?1, ?2, ?3, ?4)")?;
    for (ordinal, name, status) in &row.variants {
        variant.execute(params![row.id, ordinal, name, status])?;
    }
    let mut sample = tx.prepare(
        "INSERT INTO samples (run_id, variant, metric, unit, rep, value) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    )?;
    for (v, metric, unit, rep, value) in &row.samples {
        sample.execute(params![row.id, v, metric, unit, rep, value])?;
    }
    let mut finding = tx
        .prepare("INSERT INTO findings (run_id, variant, ordinal, json) VALUES (?1, ?2, ?3, ?4)")?;
    for (v, ordinal, json) in &row.findings {
        finding.execute(params![row.id, v, ordinal, json])?;
    }
    Ok(())
}

/// Every run's id and record in an SQLite results file, oldest first, read without writing
/// to it (a shard's file is not migrated by merging it); a file from a newer hvlab is refused.
pub(super) fn read_records(path: &Path) -> Result<Vec<(String, String)>, StoreError> {
    if !require_regular(path)? {
        return Err(StoreError::NoSuchFile(path.to_path_buf()));
    }
    let classify = |e: rusqlite::Error| match classify(path, e) {
        StoreError::Open(p, e) => StoreError::ReadInput(p, e),
        other => other,
    };
    let conn = open_read_only(path).map_err(classify)?;
    let (version, tables) = version_and_tables(&conn).map_err(classify)?;
    if version == 0 {
        // Not an hvlab database (or an empty file): it holds no runs to merge.
        return Err(if tables {
            StoreError::Foreign(path.to_path_buf())
        } else {
            StoreError::NotADatabase(path.to_path_buf())
        });
    }
    if version > schema::LATEST {
        return Err(StoreError::TooNew {
            location: path.display().to_string(),
            found: version,
            supported: schema::LATEST,
        });
    }
    // Every schema version has `runs (id, started_at, record_json)`.
    let mut stmt = conn
        .prepare("SELECT id, record_json FROM runs ORDER BY started_at, id")
        .map_err(classify)?;
    let rows = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(classify)?;
    rows.collect::<Result<_, _>>().map_err(classify)
}

/// `PRAGMA quick_check`: the b-trees and pages are sound (it skips only the costly index
/// cross-checks), so a damaged file is refused before anything is written into it.
fn check_integrity(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let verdict: String = retry_busy(|| conn.query_row("PRAGMA quick_check(1)", [], |r| r.get(0)))
        .map_err(|e| classify(path, e))?;
    if verdict == "ok" {
        Ok(())
    } else {
        Err(StoreError::CorruptFile(
            path.to_path_buf(),
            format!("integrity check: {verdict}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Store;
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
            backend: hvlab_core::BackendKind::Kvm,
            profile: None,
            // This machine's description, without asking /dev/kvm: the store keeps whatever
            // host a run describes.
            host: hvlab_host::probe::probe_with(
                "not asked: a store test".into(),
                std::collections::BTreeMap::new(),
            ),
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
            noise: None,
            warnings: vec![],
            tag: None,
            baseline: None,
            calls: Vec::new(),
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
        assert_eq!(list[0].cpu, run.host.cpu);
        assert_eq!(list[0].hz, run.host.hz);
        assert_eq!(store.load(&run.run_id).unwrap(), run);
        assert_eq!(store.load("3f2a").unwrap().run_id, run.run_id);
        let crate::Engine::Sqlite(engine) = &store.engine else {
            panic!("a file path opens an SQLite store");
        };
        assert_eq!(
            engine
                .samples(&run.run_id, "irqchip-first", "ready_ms")
                .unwrap(),
            vec![7.5, 7.6, 7.4]
        );
        assert_eq!(engine.schema_version().unwrap(), schema::LATEST);
    }

    #[test]
    fn a_version_2_store_takes_migration_3_and_its_showcases_and_suites_list_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let mut showcase = record("2026-11-22T10:00:00Z-lifecycle-model-0001");
        showcase.params.insert("showcase".into(), "why".into());
        showcase.params.insert("suite".into(), "su-old".into());
        let users = record("2026-11-22T10:00:01Z-lifecycle-kvm-0002");
        {
            // A store as hvlab wrote it at schema 2: no tag, suite or baseline column.
            let conn = Connection::open(&path).unwrap();
            for m in &schema::MIGRATIONS[..2] {
                conn.execute_batch(m.sqlite).unwrap();
            }
            conn.pragma_update(None, "user_version", 2).unwrap();
            for run in [&showcase, &users] {
                let row = super::super::RunRow::of(run).unwrap();
                conn.execute(
                    &insert_run_sql(V2_COLUMNS, '?'),
                    &run_values(&row)[..V2_COLUMNS],
                )
                .unwrap();
            }
        }
        let store = Store::open(&path).unwrap();
        let list = store.list(10).unwrap();
        let by_id = |id: &str| list.iter().find(|l| l.run_id == id).unwrap();
        let old_showcase = by_id(&showcase.run_id);
        assert_eq!(old_showcase.tag, Some(crate::record::RunTag::Showcase));
        assert_eq!(old_showcase.suite.as_deref(), Some("su-old"));
        assert!(!old_showcase.is_users());
        assert!(by_id(&users.run_id).is_users());
        assert_eq!(by_id(&users.run_id).suite, None);
    }

    #[test]
    fn a_version_3_store_takes_migration_4_and_its_runs_list_on_their_clocks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        let mut icount = record("2026-11-22T10:00:00Z-lifecycle-kvm-0001");
        icount.host.clock = hvlab_core::host::Clock::Icount;
        let wall = record("2026-11-22T10:00:01Z-lifecycle-kvm-0002");
        // A model run computed in an instruction-clock guest: its times are its profile's.
        let mut model = record("2026-11-22T10:00:02Z-lifecycle-model-0003");
        model.backend = hvlab_core::BackendKind::Model;
        model.host.clock = hvlab_core::host::Clock::Icount;
        {
            // A store as hvlab wrote it at schema 3: no clock column.
            let conn = Connection::open(&path).unwrap();
            for m in &schema::MIGRATIONS[..3] {
                conn.execute_batch(m.sqlite).unwrap();
            }
            conn.pragma_update(None, "user_version", 3).unwrap();
            for run in [&icount, &wall, &model] {
                let row = super::super::RunRow::of(run).unwrap();
                conn.execute(
                    &insert_run_sql(RUN_COLUMNS.len() - 1, '?'),
                    &run_values(&row)[..RUN_COLUMNS.len() - 1],
                )
                .unwrap();
            }
        }
        let mut store = Store::open(&path).unwrap();
        let clock_of = |store: &Store, id: &str| {
            store
                .list(10)
                .unwrap()
                .into_iter()
                .find(|l| l.run_id == id)
                .unwrap()
                .clock
        };
        use hvlab_core::host::Clock;
        assert_eq!(clock_of(&store, &icount.run_id), Clock::Icount);
        assert_eq!(clock_of(&store, &wall.run_id), Clock::Wall);
        assert_eq!(clock_of(&store, &model.run_id), Clock::Wall);
        // A run stored now keeps its clock, in the column and in the record.
        let mut new = record("2026-11-22T10:00:03Z-lifecycle-kvm-0004");
        new.host.clock = Clock::Icount;
        store.save(&mut new).unwrap();
        assert_eq!(clock_of(&store, &new.run_id), Clock::Icount);
        assert_eq!(store.load(&new.run_id).unwrap(), new);
        assert_eq!(store.load(&new.run_id).unwrap().clock(), Clock::Icount);
    }

    #[test]
    fn a_runs_tag_suite_and_baseline_are_stored_and_listed() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("hvlab.db")).unwrap();
        let mut validate = record("2026-11-22T10:00:00Z-lifecycle-kvm-0001");
        validate.tag = Some(crate::record::RunTag::Validate);
        let mut mine = record("2026-11-22T10:00:01Z-lifecycle-kvm-0002");
        mine.baseline = Some("main".into());
        mine.params.insert("suite".into(), "su-x".into());
        store.save(&mut validate).unwrap();
        store.save(&mut mine).unwrap();
        let list = store.list(10).unwrap();
        assert_eq!(list[0].run_id, mine.run_id);
        assert_eq!(list[0].baseline.as_deref(), Some("main"));
        assert_eq!(list[0].suite.as_deref(), Some("su-x"));
        assert!(list[0].is_users());
        assert_eq!(list[1].tag, Some(crate::record::RunTag::Validate));
        assert_eq!(store.load(&validate.run_id).unwrap(), validate);
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
        let path = dir.path().join("hvlab.db");
        let mut store = Store::open(&path).unwrap();
        let mut run = record("2026-11-22T10:00:00Z-lifecycle-kvm-dup0");
        run.variants.push(run.variants[0].clone());
        assert!(store.save(&mut run).is_err());
        assert!(store.ingest(&run).is_err());
        assert!(store.list(10).unwrap().is_empty());
        let conn = Connection::open(&path).unwrap();
        for table in ["runs", "variants", "samples"] {
            let rows: i64 = conn
                .query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
                .unwrap();
            assert_eq!(rows, 0, "{table}");
        }
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
    fn ingesting_is_idempotent_and_reports_a_changed_copy() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("hvlab.db")).unwrap();
        let run = record("2026-11-22T10:00:00Z-lifecycle-kvm-1111");
        assert_eq!(store.ingest(&run).unwrap(), Ingested::Stored);
        assert_eq!(store.ingest(&run).unwrap(), Ingested::AlreadyStored);
        let mut changed = run.clone();
        changed.variants[0]
            .metrics
            .get_mut("ready_ms")
            .unwrap()
            .samples[0] = 9.0;
        assert_eq!(store.ingest(&changed).unwrap(), Ingested::Conflict);
        assert_eq!(store.list(10).unwrap().len(), 1);
        assert_eq!(store.load(&run.run_id).unwrap(), run);
    }
}
