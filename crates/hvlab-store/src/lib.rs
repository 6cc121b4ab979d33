//! The results store: an SQLite file (bundled, WAL mode; the default) or a shared PostgreSQL
//! database (`--db postgres://…`), with one schema, versioned and migrated in both
//! ([`schema`]).
//!
//! A run is written whole, in one transaction, after it has finished: the run row with its
//! host fingerprint, every sample of every metric, and the findings. A run interrupted before
//! that (Ctrl-C, a crash, a kill, a dropped connection) leaves nothing behind, so no
//! half-written run can ever be listed as complete. The full record is also kept as JSON so
//! `hvlab show` reprints exactly what `hvlab run` printed, and so runs move between stores
//! unchanged ([`transfer`]: merge, export, import).

/// A [`RunRow`]'s values for [`RUN_COLUMNS`], in their order: an array of the engine's
/// `&dyn ToSql` (the two engines' traits differ, so the list is a macro, written once).
macro_rules! run_values {
    ($row:expr) => {
        [
            &$row.id,
            &$row.scenario,
            &$row.backend,
            &$row.profile,
            &$row.started_at,
            &$row.finished_at,
            &$row.kernel,
            &$row.kvm_flavour,
            &$row.hvlab_version,
            &$row.git_rev,
            &$row.cpu,
            &$row.hz,
            &$row.host_json,
            &$row.params_json,
            &$row.record_json,
            &$row.tag,
            &$row.suite,
            &$row.baseline,
            &$row.clock,
        ]
    };
}

mod postgres;
pub mod schema;
mod sqlite;
pub mod transfer;

use std::path::{Path, PathBuf};

use crate::record::RunRecord;
use hvlab_analysis::record;

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
    /// The store {location} is at schema version {found}, newer than this hvlab's {supported}: it was written by a newer hvlab. Upgrade hvlab (build it from a newer revision), or point --db at another store.
    TooNew {
        /// The store.
        location: String,
        /// Its schema version.
        found: i64,
        /// The newest this hvlab knows.
        supported: i64,
    },
    /// `{0}` is not a PostgreSQL URL hvlab can use ({1}): write postgres://USER@HOST:PORT/DATABASE, or postgres:///DATABASE?host=/run/postgresql for a local socket.
    BadUrl(String, String),
    /// Cannot connect to the PostgreSQL store {0}: {1}. Check that the server runs and accepts this user, or point --db at another store.
    Connect(String, String),
    /// PostgreSQL store error on {0}: {1}
    Pg(String, String),
    /// The PostgreSQL server {server} did not answer within {secs} s ({what}): check that it runs and is not stopped or overloaded; $HVLAB_PG_TIMEOUT (seconds) sets how long a statement may take.
    NoAnswer {
        /// The server(s) of the URL.
        server: String,
        /// How long hvlab waited.
        secs: u64,
        /// What hvlab was doing.
        what: &'static str,
    },
    /// $HVLAB_PG_TIMEOUT is `{0}`: give a whole number of seconds above 0, for example HVLAB_PG_TIMEOUT=300.
    BadTimeout(String),
    /// The store {0} cannot take a run ({1}), so nothing was measured: make it writable, point --db at another store, or add --no-store.
    ReadOnly(String, String),
    /// {0}: no such results database to read runs from: give an existing SQLite file written by hvlab.
    NoSuchFile(PathBuf),
    /// {0} is an SQLite database, but not hvlab's (it has tables of its own and no hvlab schema version): hvlab leaves it untouched. Point --db at an hvlab results file or a new path.
    Foreign(PathBuf),
    /// {0} is not a regular file ({1}): the results database must be a regular file. Point --db at a file path.
    NotRegular(PathBuf, &'static str),
    /// `{0}` looks like a URL, but hvlab stores only to SQLite files and PostgreSQL: write postgres://… or postgresql://… (lower case, no leading space) for PostgreSQL, or give a file path for SQLite.
    UnknownScheme(String),
    /// Cannot read the results file {0}: {1}. Merging only reads its inputs: check that the file exists and is readable (a read-only file or mount is fine).
    ReadInput(PathBuf, rusqlite::Error),
    /// {0} is the store being merged into; merge other files into it.
    MergeIntoItself(String),
    /// {path} line {line}: not a run record ({why}). Each line must be one run as `hvlab export --format jsonl` writes it; nothing was imported.
    BadLine {
        /// The file.
        path: PathBuf,
        /// The 1-based line number.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// {path}: run {run} cannot be stored ({why}); nothing was merged from this file.
    BadRun {
        /// The file.
        path: PathBuf,
        /// The run.
        run: String,
        /// What is wrong with it.
        why: String,
    },
    /// Cannot read {0}: {1}
    Read(PathBuf, std::io::Error),
    /// {count} run(s) have the id of a stored run but different content, so they were not stored (the stored copy is kept): {ids}. Run ids end in 64 random bits, so this is a copy that was changed; compare them with `hvlab show ID --json` on each store.
    Conflicts {
        /// How many.
        count: usize,
        /// The first few ids.
        ids: String,
    },
}

impl StoreError {
    /// What kind of failure it is: what the user typed, or the store failing.
    pub fn fault(&self) -> hvlab_core::error::Fault {
        if self.is_bad_input() {
            hvlab_core::error::Fault::BadInput
        } else {
            hvlab_core::error::Fault::Failed
        }
    }

    /// Errors caused by what the user typed.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            StoreError::NoSuchRun(_)
                | StoreError::AmbiguousRun(..)
                | StoreError::IsDirectory(_)
                | StoreError::NotADatabase(_)
                | StoreError::TooNew { .. }
                | StoreError::BadUrl(..)
                | StoreError::BadTimeout(_)
                | StoreError::NoSuchFile(_)
                | StoreError::Foreign(_)
                | StoreError::NotRegular(..)
                | StoreError::UnknownScheme(_)
                | StoreError::ReadInput(..)
                | StoreError::MergeIntoItself(_)
                | StoreError::BadLine { .. }
                | StoreError::BadRun { .. }
                | StoreError::Read(..)
                | StoreError::Conflicts { .. }
        )
    }
}

/// One row of `hvlab runs`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RunListing {
    /// Run id.
    pub run_id: String,
    /// Scenario.
    pub scenario: String,
    /// Backend.
    pub backend: hvlab_core::BackendKind,
    /// Start time.
    pub started_at: String,
    /// Kernel release.
    pub kernel: String,
    /// KVM flavour.
    pub kvm_flavour: String,
    /// CPU model of the host.
    pub cpu: String,
    /// Timer ticks per second on the host.
    pub hz: u32,
    /// Variant names.
    pub variants: Vec<String>,
    /// The model's cost profile (model runs).
    pub profile: Option<String>,
    /// What made an internal run (absent: the user's).
    pub tag: Option<crate::record::RunTag>,
    /// The suite the run belongs to.
    pub suite: Option<String>,
    /// The named baseline it was saved as.
    pub baseline: Option<String>,
    /// The clock its times are on (the wall clock, or QEMU's instruction clock).
    pub clock: hvlab_core::host::Clock,
    /// Every parameter in effect (a sweep's id is its `sweep`).
    pub params: std::collections::BTreeMap<String, serde_json::Value>,
}

impl RunListing {
    /// The sweep the run is a point of.
    pub fn sweep(&self) -> Option<&str> {
        self.params.get("sweep").and_then(serde_json::Value::as_str)
    }

    /// Whether the user asked for this run (not calibrate, validate or a showcase).
    pub fn is_users(&self) -> bool {
        self.tag.is_none()
    }
}

/// Reads the listing's JSON parameters, empty when unreadable (the record itself is checked
/// when loaded).
fn params_of(json: &str) -> std::collections::BTreeMap<String, serde_json::Value> {
    serde_json::from_str(json).unwrap_or_default()
}

/// A stored tag; one this hvlab does not know (a newer one's) counts as internal, so a
/// newer store's internal runs never show as the user's.
fn tag_of(text: Option<String>) -> Option<crate::record::RunTag> {
    text.map(|t| crate::record::RunTag::parse(&t).unwrap_or(crate::record::RunTag::Showcase))
}

/// Where the results are: an SQLite file or a PostgreSQL database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// An SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL connection URL (`postgres://…` or `postgresql://…`).
    Postgres(String),
}

impl Location {
    /// `postgres://…` and `postgresql://…` are PostgreSQL; anything else is an SQLite path.
    pub fn parse(text: &Path) -> Location {
        match text.to_str() {
            Some(s) if s.starts_with("postgres://") || s.starts_with("postgresql://") => {
                Location::Postgres(s.to_string())
            }
            _ => Location::Sqlite(text.to_path_buf()),
        }
    }

    /// For messages: the path, or the URL without its password.
    pub fn display(&self) -> String {
        match self {
            Location::Sqlite(p) => p.display().to_string(),
            Location::Postgres(url) => redact(url),
        }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display())
    }
}

/// What [`Store::open`] accepts: a location, or a path (read as `--db` reads it).
pub trait Locate {
    /// The location meant.
    fn location(&self) -> Location;
}

impl Locate for Location {
    fn location(&self) -> Location {
        self.clone()
    }
}

impl Locate for Path {
    fn location(&self) -> Location {
        Location::parse(self)
    }
}

impl Locate for PathBuf {
    fn location(&self) -> Location {
        Location::parse(self)
    }
}

/// A PostgreSQL URL for messages: rebuilt from its parsed configuration, so its password is
/// never shown however it was written.
fn redact(url: &str) -> String {
    postgres::shown(url)
}

/// `--db`, else `$HVLAB_DB`, else `$XDG_DATA_HOME/hvlab/hvlab.db`, else
/// `~/.local/share/hvlab/hvlab.db`. A `postgres://` URL in either names a PostgreSQL store.
pub fn resolve_path(explicit: Option<&Path>) -> Result<Location, StoreError> {
    if let Some(p) = explicit {
        return checked(p);
    }
    if let Some(p) = std::env::var_os("HVLAB_DB").filter(|v| !v.is_empty()) {
        return checked(Path::new(&p));
    }
    Ok(Location::Sqlite(local_data_dir()?.join("hvlab.db")))
}

/// [`Location::parse`], refusing a value that looks like a URL of another scheme (or of
/// PostgreSQL misspelt, capitalised or after a space), which would otherwise become an SQLite
/// file under a directory named `POSTGRES:`.
fn checked(text: &Path) -> Result<Location, StoreError> {
    let location = Location::parse(text);
    if let (Location::Sqlite(_), Some(s)) = (&location, text.to_str())
        && looks_like_url(s)
    {
        return Err(StoreError::UnknownScheme(s.to_string()));
    }
    Ok(location)
}

/// `scheme:` then `//`, the scheme a letter then letters, digits, `+`, `-` or `.` (RFC 3986),
/// after any leading white space.
fn looks_like_url(s: &str) -> bool {
    let Some((scheme, rest)) = s.trim_start().split_once(':') else {
        return false;
    };
    rest.starts_with("//")
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// hvlab's directory for local files: `$XDG_DATA_HOME/hvlab`, else `~/.local/share/hvlab`.
pub fn local_data_dir() -> Result<PathBuf, StoreError> {
    let data = std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .ok_or(StoreError::NoHome)?;
    Ok(data.join("hvlab"))
}

/// What storing a run that came from another store did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ingested {
    /// It was not there: stored.
    Stored,
    /// A run with its id and the same content was there already: nothing written.
    AlreadyStored,
    /// A run with its id but different content is stored: nothing written, the stored one
    /// kept.
    Conflict,
}

/// The runs table's columns a run fills, in the order of `run_values!`, the same for both
/// engines; a store of schema 2 has the first 15 (the tag, suite and baseline came with
/// schema 3, the clock with schema 4).
const RUN_COLUMNS: [&str; 19] = [
    "id",
    "scenario",
    "backend",
    "profile",
    "started_at",
    "finished_at",
    "kernel",
    "kvm_flavour",
    "hvlab_version",
    "git_rev",
    "cpu",
    "hz",
    "host_json",
    "params_json",
    "record_json",
    "tag",
    "suite",
    "baseline",
    "clock",
];

/// `INSERT INTO runs` of the first `n` of [`RUN_COLUMNS`], the run stored complete; `mark` is
/// the engine's placeholder sign (`?1` on SQLite, `$1` on PostgreSQL).
fn insert_run_sql(n: usize, mark: char) -> String {
    let placeholders: Vec<String> = (1..=n).map(|i| format!("{mark}{i}")).collect();
    format!(
        "INSERT INTO runs ({}, status) VALUES ({}, 'complete')",
        RUN_COLUMNS[..n].join(", "),
        placeholders.join(", ")
    )
}

/// A run as rows, the same for both engines.
struct RunRow {
    id: String,
    scenario: String,
    backend: String,
    profile: Option<String>,
    started_at: String,
    finished_at: String,
    kernel: String,
    kvm_flavour: String,
    hvlab_version: String,
    git_rev: String,
    cpu: String,
    hz: i64,
    tag: Option<String>,
    suite: Option<String>,
    baseline: Option<String>,
    /// The clock its times are on ([`RunRecord::clock`]).
    clock: String,
    host_json: String,
    params_json: String,
    record_json: String,
    /// (ordinal, name, status).
    variants: Vec<(i64, String, String)>,
    /// (variant, metric, unit, rep, value).
    samples: Vec<(String, String, String, i64, f64)>,
    /// (variant, ordinal, json).
    findings: Vec<(String, i64, String)>,
}

impl RunRow {
    fn of(run: &RunRecord) -> Result<RunRow, StoreError> {
        let json = |v: &dyn erased_json::Json| {
            v.encode()
                .map_err(|e| StoreError::Corrupt(run.run_id.clone(), e))
        };
        let mut row = RunRow {
            id: run.run_id.clone(),
            scenario: run.scenario.clone(),
            backend: run.backend.to_string(),
            profile: run.profile.clone(),
            started_at: run.started_at.clone(),
            finished_at: run.finished_at.clone(),
            kernel: run.host.kernel.clone(),
            kvm_flavour: run.host.kvm_flavour.to_string(),
            hvlab_version: run.host.hvlab_version.clone(),
            git_rev: run.host.git_rev.clone(),
            cpu: run.host.cpu.clone(),
            hz: i64::from(run.host.hz),
            tag: run.tag.map(|t| t.to_string()),
            suite: run
                .params
                .get("suite")
                .and_then(serde_json::Value::as_str)
                .map(str::to_string),
            baseline: run.baseline.clone(),
            clock: run.clock().to_string(),
            host_json: json(&run.host)?,
            params_json: json(&run.params)?,
            record_json: json(run)?,
            variants: Vec::new(),
            samples: Vec::new(),
            findings: Vec::new(),
        };
        for (ordinal, v) in run.variants.iter().enumerate() {
            row.variants
                .push((sql_int(ordinal), v.name.clone(), v.status.to_string()));
            for (metric, m) in &v.metrics {
                for (rep, value) in m.samples.iter().enumerate() {
                    row.samples.push((
                        v.name.clone(),
                        metric.clone(),
                        m.unit.clone(),
                        sql_int(rep),
                        *value,
                    ));
                }
            }
            for (i, f) in v.findings.iter().enumerate() {
                row.findings.push((v.name.clone(), sql_int(i), json(f)?));
            }
        }
        Ok(row)
    }
}

/// Whether a stored record (its JSON) is the run `incoming`: compared as JSON values, so key
/// order and formatting do not matter, and numbers compare exactly (serde_json parses floats
/// to the nearest value with `float_roundtrip`).
fn same_content(stored_json: &str, incoming: &RunRecord) -> bool {
    let stored: Result<serde_json::Value, _> = serde_json::from_str(stored_json);
    match (stored, serde_json::to_value(incoming)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// A run id with a fresh random suffix, for a run whose id is taken.
fn renamed(id: &str) -> String {
    let stem = id.rsplit_once('-').map_or(id, |(stem, _)| stem);
    format!("{stem}-{}", crate::record::run_id_suffix())
}

/// An open results store.
#[derive(Debug)]
pub struct Store {
    engine: Engine,
    location: Location,
}

#[derive(Debug)]
enum Engine {
    Sqlite(sqlite::SqliteStore),
    Postgres(postgres::PgStore),
}

impl Store {
    /// Opens the store at `location` (an SQLite path, created when needed, or a PostgreSQL
    /// URL), bringing its schema up to date. Safe against other hvlab processes opening the
    /// same store at the same time.
    pub fn open<L: Locate + ?Sized>(location: &L) -> Result<Store, StoreError> {
        let location = location.location();
        let engine = match &location {
            Location::Sqlite(path) => Engine::Sqlite(sqlite::SqliteStore::open(path)?),
            Location::Postgres(url) => Engine::Postgres(postgres::PgStore::open(url)?),
        };
        Ok(Store { engine, location })
    }

    /// Opens the store at `location` to read it only, as `runs`, `show`, `report`, `export`
    /// and `compare` do: nothing is created or changed (no file, no schema, no journal mode), a
    /// missing SQLite file reads as an empty store, and an SQLite file that is not hvlab's is
    /// refused.
    pub fn open_read<L: Locate + ?Sized>(location: &L) -> Result<Store, StoreError> {
        let location = location.location();
        let engine = match &location {
            Location::Sqlite(path) => Engine::Sqlite(sqlite::SqliteStore::open_read(path)?),
            Location::Postgres(url) => Engine::Postgres(postgres::PgStore::open(url)?),
        };
        Ok(Store { engine, location })
    }

    /// Where this store is.
    pub fn location(&self) -> &Location {
        &self.location
    }

    /// Writes a finished run in one transaction. Should another run already have `run.run_id`
    /// (ids end in 64 random bits, so this is a formality), the run gets a fresh suffix rather
    /// than being lost; `run.run_id` is updated to the id it was stored under.
    pub fn save(&mut self, run: &mut RunRecord) -> Result<(), StoreError> {
        match &mut self.engine {
            Engine::Sqlite(s) => s.save(run),
            Engine::Postgres(s) => s.save(run),
        }
    }

    /// Whether a run can be written, checked before measuring one: the SQLite file and its
    /// directory (journal files) can be written, or the PostgreSQL role may insert into every
    /// table a run goes to. Disk space and locks are only known when writing.
    pub fn check_writable(&self) -> Result<(), StoreError> {
        match &self.engine {
            Engine::Sqlite(_) => {
                let Location::Sqlite(path) = &self.location else {
                    return Ok(());
                };
                sqlite_writable(path)
                    .map_err(|e| StoreError::ReadOnly(path.display().to_string(), e.to_string()))
            }
            Engine::Postgres(s) => s.check_writable(),
        }
    }

    /// Stores a run that comes from another store under its own id, in one transaction;
    /// idempotent: a run already stored with the same content is not stored twice.
    pub fn ingest(&mut self, run: &RunRecord) -> Result<Ingested, StoreError> {
        match &mut self.engine {
            Engine::Sqlite(s) => s.ingest(run),
            Engine::Postgres(s) => s.ingest(run),
        }
    }

    /// The most recent runs first.
    pub fn list(&self, limit: usize) -> Result<Vec<RunListing>, StoreError> {
        match &self.engine {
            Engine::Sqlite(s) => s.list(limit),
            Engine::Postgres(s) => s.list(limit),
        }
    }

    /// Loads a run by its id or a unique part of it (a prefix, or any substring such as the
    /// trailing hex).
    pub fn load(&self, query: &str) -> Result<RunRecord, StoreError> {
        let json = match &self.engine {
            Engine::Sqlite(s) => s.load_json(query),
            Engine::Postgres(s) => s.load_json(query),
        }?;
        serde_json::from_str(&json).map_err(|e| StoreError::Corrupt(query.to_string(), e))
    }

    /// Every run of sweep `id` (its `sweep` parameter), oldest first.
    pub fn sweep_runs(&self, id: &str) -> Result<Vec<RunRecord>, StoreError> {
        let rows = match &self.engine {
            Engine::Sqlite(s) => s.sweep_json(id),
            Engine::Postgres(s) => s.sweep_json(id),
        }?;
        rows.into_iter()
            .map(|(run_id, json)| {
                serde_json::from_str(&json).map_err(|e| StoreError::Corrupt(run_id, e))
            })
            .collect()
    }
}

/// Trying is the only answer that covers permissions, read-only mounts and root alike: the
/// file is opened for writing (not truncated), and a probe file is created beside it unless
/// the write-ahead log is there already.
fn sqlite_writable(path: &Path) -> std::io::Result<()> {
    std::fs::OpenOptions::new().write(true).open(path)?;
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    if Path::new(&wal).exists() {
        return Ok(());
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let probe = dir.join(format!(".hvlab-write-test-{}", std::process::id()));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)?;
    std::fs::remove_file(&probe)
}

/// Both engines' integers are i64; indices never come near the limit.
fn sql_int(i: usize) -> i64 {
    i64::try_from(i).unwrap_or(i64::MAX)
}

/// Object-safe JSON encoding, so one closure serves every JSON column.
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

/// The one record among `hits` (id, record) that a partial id matched.
fn one_hit(query: &str, hits: Vec<(String, String)>) -> Result<String, StoreError> {
    let ids: Vec<String> = hits.iter().take(4).map(|(id, _)| id.clone()).collect();
    let mut hits = hits.into_iter();
    match (hits.next(), hits.next()) {
        (None, _) => Err(StoreError::NoSuchRun(query.to_string())),
        (Some((_, json)), None) => Ok(json),
        (Some(_), Some(_)) => Err(StoreError::AmbiguousRun(query.to_string(), ids.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both engines insert the one column list, each with its own placeholders, and every
    /// column it names is made by both engines' migrations.
    #[test]
    fn both_engines_insert_the_one_run_column_list() {
        let pg = insert_run_sql(RUN_COLUMNS.len(), '$');
        assert!(
            pg.starts_with("INSERT INTO runs (id, scenario, backend,"),
            "{pg}"
        );
        assert!(
            pg.contains("VALUES ($1, $2,") && pg.contains("$19, 'complete')"),
            "{pg}"
        );
        assert!(!pg.contains("$20"), "{pg}");
        let v2 = insert_run_sql(15, '?');
        assert!(
            v2.contains("record_json, status)") && v2.contains("?15, 'complete')"),
            "{v2}"
        );
        for column in RUN_COLUMNS {
            for (engine, sql) in [
                (
                    "sqlite",
                    schema::MIGRATIONS
                        .iter()
                        .map(|m| m.sqlite)
                        .collect::<String>(),
                ),
                (
                    "postgres",
                    schema::MIGRATIONS
                        .iter()
                        .map(|m| m.postgres)
                        .collect::<String>(),
                ),
            ] {
                assert!(sql.contains(column), "{engine}'s schema has no {column}");
            }
        }
    }

    #[test]
    fn db_url_with_an_unknown_or_miscased_scheme_is_refused_listing_the_supported_ones() {
        for bad in [
            "POSTGRES:///hvlab",
            "Postgresql://u@h/db",
            "postgress://u@h/db",
            "pg://u@h/db",
            "mysql://u@h/db",
            " postgres://u@h/db",
            "sqlite:///tmp/x.db",
        ] {
            let e = resolve_path(Some(Path::new(bad))).unwrap_err();
            assert!(
                matches!(e, StoreError::UnknownScheme(_)) && e.is_bad_input(),
                "{bad}"
            );
            let text = e.to_string();
            assert!(
                text.contains("postgres://") && text.contains("file path"),
                "{text}"
            );
        }
        for good in ["results/x.db", "./a:b.db", "c:/x.db", "/tmp/x:y//z.db"] {
            assert!(
                matches!(resolve_path(Some(Path::new(good))), Ok(Location::Sqlite(_))),
                "{good}"
            );
        }
    }

    #[test]
    fn the_explicit_path_wins_over_the_environment() {
        let p = resolve_path(Some(Path::new("/tmp/x.db"))).unwrap();
        assert_eq!(p, Location::Sqlite(PathBuf::from("/tmp/x.db")));
    }

    #[test]
    fn postgres_urls_are_postgres_and_their_passwords_are_never_shown() {
        let url = "postgres://lab:s3cret@db.example:5433/hvlab?password=s3cret&sslmode=disable";
        let loc = resolve_path(Some(Path::new(url))).unwrap();
        assert_eq!(loc, Location::Postgres(url.into()));
        let shown = loc.to_string();
        assert!(!shown.contains("s3cret"), "{shown}");
        assert_eq!(shown, "postgres://lab:***@db.example:5433/hvlab");
        assert_eq!(
            Location::parse(Path::new("postgresql:///hvlab?host=/run/postgresql")).to_string(),
            "postgresql:///hvlab?host=/run/postgresql"
        );
        assert!(matches!(
            Location::parse(Path::new("results/postgres.db")),
            Location::Sqlite(_)
        ));
    }
}
