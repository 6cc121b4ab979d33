//! The PostgreSQL engine: a store shared by many hosts and shards (`--db postgres://…`).
//!
//! tokio-postgres without TLS, driven on a one-thread runtime of its own: hvlab talks to a
//! server on the same machine or a trusted network (a local socket, or host:port). Each run is
//! one transaction, as on SQLite; a connection that drops midway (a killed hvlab) makes the
//! server roll it back.
//!
//! Nothing waits forever: the handshake and every exchange have a client-side deadline (a
//! server that accepts and never answers, or a stopped backend, ends in an error naming the
//! server), and statements have a server-side `statement_timeout` below it. Errors carry the
//! server's own message ("permission denied for table runs"), and a URL is only ever shown
//! rebuilt from its parsed configuration, without the password.

use std::cell::RefCell;
use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::binary_copy::BinaryCopyInWriter;
use tokio_postgres::config::Host;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Config, GenericClient, NoTls, Transaction};

use super::{
    Ingested, RUN_COLUMNS, RunListing, RunRow, StoreError, insert_run_sql, renamed, same_content,
    schema,
};
use crate::record::RunRecord;

/// The advisory lock key that serializes schema migrations between hvlab processes
/// ("hvlab" in ASCII).
const MIGRATION_LOCK: i64 = 0x68_766c_6162;

/// How long connecting (TCP, startup, authentication, schema check) may take when the URL
/// sets no `connect_timeout`.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// How long one statement may run on the server, unless `$HVLAB_PG_TIMEOUT` (seconds) says
/// otherwise. A run is a few statements whatever its size (COPY for the samples), so a minute
/// is generous; a merge stores run by run.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(120);

/// Extra time the client gives the server beyond its own statement timeout, so a slow
/// statement ends with the server's message rather than hvlab's.
const GRACE: Duration = Duration::from_secs(5);

/// An open PostgreSQL store.
pub(super) struct PgStore {
    /// Drives the connection; every call blocks on it under a deadline.
    runtime: tokio::runtime::Runtime,
    /// `list` and `load` take `&self` (callers share one store); the client needs `&mut`.
    client: RefCell<Client>,
    /// The URL without its password, for errors.
    shown: String,
    /// The server(s), for "did not answer".
    server: String,
    /// The client-side limit on one exchange.
    deadline: Duration,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("location", &self.shown)
            .finish_non_exhaustive()
    }
}

/// `url` for messages: rebuilt from its parsed configuration (user, hosts, ports, database),
/// so a password is never shown however it was written (in the userinfo, as `password=` or a
/// percent-encoded key, with `/` or `?` in it). A URL that does not parse shows its scheme only.
pub(super) fn shown(url: &str) -> String {
    let scheme = url.split_once("://").map_or("postgres", |(s, _)| s);
    match Config::from_str(url) {
        Ok(config) => shown_config(scheme, &config),
        Err(_) => format!("{scheme}://… (not shown: it does not parse)"),
    }
}

fn shown_config(scheme: &str, config: &Config) -> String {
    let mut tcp = Vec::new();
    let mut sockets = Vec::new();
    for (i, host) in config.get_hosts().iter().enumerate() {
        let port = config
            .get_ports()
            .get(i)
            .or_else(|| config.get_ports().first());
        match host {
            Host::Tcp(name) => tcp.push(match port {
                Some(p) => format!("{name}:{p}"),
                None => name.clone(),
            }),
            Host::Unix(dir) => sockets.push(dir.display().to_string()),
        }
    }
    let user = match (config.get_user(), config.get_password()) {
        (Some(u), Some(_)) => format!("{u}:***@"),
        (Some(u), None) => format!("{u}@"),
        (None, Some(_)) => ":***@".to_string(),
        (None, None) => String::new(),
    };
    let db = config.get_dbname().unwrap_or("");
    let mut text = format!("{scheme}://{user}{}/{db}", tcp.join(","));
    if !sockets.is_empty() {
        text.push_str(&format!("?host={}", sockets.join(",")));
    }
    text
}

/// The servers a configuration names, for "did not answer".
fn servers(config: &Config) -> String {
    let names: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let port = config
                .get_ports()
                .get(i)
                .or_else(|| config.get_ports().first())
                .copied()
                .unwrap_or(5432);
            match h {
                Host::Tcp(name) => format!("{name}:{port}"),
                Host::Unix(dir) => format!("{}/.s.PGSQL.{port}", dir.display()),
            }
        })
        .collect();
    if names.is_empty() {
        "localhost:5432".to_string()
    } else {
        names.join(", ")
    }
}

/// A client error with what the server said: its severity, message, detail and hint rather
/// than the bare "db error".
fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut text = format!("{}: {}", db.severity(), db.message());
        if let Some(detail) = db.detail() {
            text.push_str(&format!(" ({detail})"));
        }
        if let Some(hint) = db.hint() {
            text.push_str(&format!("; hint: {hint}"));
        }
        return text;
    }
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// `$HVLAB_PG_TIMEOUT` in seconds, else [`STATEMENT_TIMEOUT`].
fn statement_timeout() -> Result<Duration, StoreError> {
    match std::env::var("HVLAB_PG_TIMEOUT") {
        Err(_) => Ok(STATEMENT_TIMEOUT),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(s) if s > 0 => Ok(Duration::from_secs(s)),
            _ => Err(StoreError::BadTimeout(v)),
        },
    }
}

impl PgStore {
    /// Connects to `url` and brings the schema to [`schema::LATEST`].
    pub(super) fn open(url: &str) -> Result<PgStore, StoreError> {
        let shown_url = shown(url);
        let mut config = Config::from_str(url)
            .map_err(|e| StoreError::BadUrl(shown_url.clone(), describe(&e)))?;
        let connect_deadline = config
            .get_connect_timeout()
            .copied()
            .unwrap_or(CONNECT_TIMEOUT);
        config.connect_timeout(connect_deadline);
        if config.get_application_name().is_none() {
            config.application_name("hvlab");
        }
        let statement = statement_timeout()?;
        // The server ends a statement that takes too long (a lock held, a huge import) with
        // its own message; the client deadline above it catches a server that cannot.
        let options = format!(
            "{} -c statement_timeout={}",
            config.get_options().unwrap_or(""),
            statement.as_millis()
        );
        config.options(options.trim());
        let server = servers(&config);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StoreError::Connect(shown_url.clone(), e.to_string()))?;
        let no_answer = |what| StoreError::NoAnswer {
            server: server.clone(),
            secs: connect_deadline.as_secs(),
            what,
        };
        let (client, connection) = runtime
            .block_on(async { tokio::time::timeout(connect_deadline, config.connect(NoTls)).await })
            .map_err(|_| no_answer("connecting"))?
            .map_err(|e| StoreError::Connect(shown_url.clone(), describe(&e)))?;
        runtime.spawn(connection);
        let mut client = client;
        runtime
            .block_on(async {
                tokio::time::timeout(
                    connect_deadline.max(statement + GRACE),
                    migrate(&mut client, &shown_url),
                )
                .await
            })
            .map_err(|_| no_answer("checking the schema"))??;
        Ok(PgStore {
            runtime,
            client: RefCell::new(client),
            shown: shown_url,
            server,
            deadline: statement + GRACE,
        })
    }

    /// Runs `work` under the client deadline.
    fn block<T>(
        &self,
        what: &'static str,
        work: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.runtime
            // The timer must be made inside the runtime, which owns the clock.
            .block_on(async { tokio::time::timeout(self.deadline, work).await })
            .map_err(|_| StoreError::NoAnswer {
                server: self.server.clone(),
                secs: self.deadline.as_secs(),
                what,
            })?
    }

    fn pg(&self) -> impl Fn(tokio_postgres::Error) -> StoreError + '_ {
        |e| StoreError::Pg(self.shown.clone(), describe(&e))
    }

    /// Whether this role may store a run: INSERT on every table a run goes to (a role with
    /// SELECT only is refused here, before anything is measured).
    pub(super) fn check_writable(&self) -> Result<(), StoreError> {
        let mut client = self.client.borrow_mut();
        let pg = self.pg();
        let missing: Vec<String> = self.block("checking privileges", async {
            let row = client
                .query_one(
                    "SELECT array_agg(t ORDER BY t) FILTER (WHERE NOT has_table_privilege(t, 'INSERT'))
                     FROM unnest(ARRAY['runs', 'variants', 'samples', 'findings']) AS t",
                    &[],
                )
                .await
                .map_err(&pg)?;
            row.try_get::<_, Option<Vec<String>>>(0)
                .map(Option::unwrap_or_default)
                .map_err(&pg)
        })?;
        if missing.is_empty() {
            return Ok(());
        }
        let user = client_user(&mut client, self).unwrap_or_else(|_| "this role".to_string());
        Err(StoreError::ReadOnly(
            self.shown.clone(),
            format!(
                "{user} may not insert into {}; GRANT INSERT ON runs, variants, samples, findings TO {user}",
                missing.join(", ")
            ),
        ))
    }

    pub(super) fn save(&mut self, run: &mut RunRecord) -> Result<(), StoreError> {
        let pg = self.pg();
        let mut client = self.client.borrow_mut();
        self.block("storing a run", async {
            let mut tx = client.transaction().await.map_err(&pg)?;
            // A taken id gets a fresh suffix; ON CONFLICT keeps this safe against another
            // hvlab storing the same id at the same moment.
            let mut row = RunRow::of(run)?;
            while !insert_run(&mut tx, &row).await.map_err(&pg)? {
                run.run_id = renamed(&run.run_id);
                row = RunRow::of(run)?;
            }
            insert_children(&mut tx, &row).await.map_err(&pg)?;
            tx.commit().await.map_err(&pg)
        })
    }

    pub(super) fn ingest(&mut self, run: &RunRecord) -> Result<Ingested, StoreError> {
        let pg = self.pg();
        let row = RunRow::of(run)?;
        let mut client = self.client.borrow_mut();
        self.block("storing a run", async {
            let mut tx = client.transaction().await.map_err(&pg)?;
            if insert_run(&mut tx, &row).await.map_err(&pg)? {
                insert_children(&mut tx, &row).await.map_err(&pg)?;
                tx.commit().await.map_err(&pg)?;
                return Ok(Ingested::Stored);
            }
            let stored = stored_json(&tx, &row.id).await.map_err(&pg)?;
            tx.rollback().await.map_err(&pg)?;
            Ok(match stored {
                Some(json) if same_content(&json, run) => Ingested::AlreadyStored,
                _ => Ingested::Conflict,
            })
        })
    }

    pub(super) fn list(&self, limit: usize) -> Result<Vec<RunListing>, StoreError> {
        let pg = self.pg();
        let client = self.client.borrow_mut();
        let rows = self.block("listing runs", async {
            client
                .query(
                    "SELECT id, scenario, backend, started_at, kernel, kvm_flavour, cpu, hz,
                            coalesce((SELECT array_agg(name ORDER BY ordinal) FROM variants
                                      WHERE run_id = runs.id), '{}'),
                            profile, tag, suite, params_json, baseline, clock
                     FROM runs WHERE status = 'complete'
                     ORDER BY started_at DESC, id DESC LIMIT $1",
                    &[&i64::try_from(limit).unwrap_or(i64::MAX)],
                )
                .await
                .map_err(&pg)
        })?;
        rows.iter()
            .map(|r| {
                let run_id: String = r.try_get(0).map_err(&pg)?;
                let backend: String = r.try_get(2).map_err(&pg)?;
                let backend = backend.parse().map_err(|e: String| {
                    StoreError::Corrupt(run_id.clone(), serde::de::Error::custom(e))
                })?;
                let clock: String = r.try_get(14).map_err(&pg)?;
                let clock = clock.parse().map_err(|e: String| {
                    StoreError::Corrupt(run_id.clone(), serde::de::Error::custom(e))
                })?;
                let listing = (|| {
                    Ok::<_, tokio_postgres::Error>(RunListing {
                        run_id: run_id.clone(),
                        scenario: r.try_get(1)?,
                        backend,
                        started_at: r.try_get(3)?,
                        kernel: r.try_get(4)?,
                        kvm_flavour: r.try_get(5)?,
                        cpu: r.try_get(6)?,
                        hz: u32::try_from(r.try_get::<_, i64>(7)?).unwrap_or(0),
                        variants: r.try_get(8)?,
                        profile: r.try_get(9)?,
                        tag: super::tag_of(r.try_get(10)?),
                        suite: r.try_get(11)?,
                        params: super::params_of(r.try_get::<_, &str>(12)?),
                        baseline: r.try_get(13)?,
                        clock,
                    })
                })();
                listing.map_err(&pg)
            })
            .collect()
    }

    pub(super) fn load_json(&self, query: &str) -> Result<String, StoreError> {
        let pg = self.pg();
        let client = self.client.borrow_mut();
        let hits = self.block("loading a run", async {
            if let Some(json) = stored_json(&*client, query).await.map_err(&pg)? {
                return Ok(Err(json));
            }
            client
                .query(
                    "SELECT id, record_json FROM runs WHERE strpos(id, $1) > 0
                     ORDER BY started_at DESC",
                    &[&query],
                )
                .await
                .map_err(&pg)?
                .iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect::<Result<Vec<(String, String)>, tokio_postgres::Error>>()
                .map(Ok)
                .map_err(&pg)
        })?;
        match hits {
            Err(exact) => Ok(exact),
            Ok(hits) => super::one_hit(query, hits),
        }
    }

    /// (id, record) of every run whose `sweep` parameter is `id`, oldest first.
    pub(super) fn sweep_json(&self, id: &str) -> Result<Vec<(String, String)>, StoreError> {
        let pg = self.pg();
        let client = self.client.borrow_mut();
        self.block("loading a sweep", async {
            client
                .query(
                    "SELECT id, record_json FROM runs WHERE params_json::jsonb ->> 'sweep' = $1
                     ORDER BY started_at, id",
                    &[&id],
                )
                .await
                .map_err(&pg)?
                .iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect::<Result<Vec<(String, String)>, tokio_postgres::Error>>()
                .map_err(&pg)
        })
    }
}

/// The role connected, for the GRANT advice.
fn client_user(client: &mut Client, store: &PgStore) -> Result<String, StoreError> {
    let pg = store.pg();
    store.block("checking privileges", async {
        client
            .query_one("SELECT current_user::text", &[])
            .await
            .and_then(|r| r.try_get(0))
            .map_err(&pg)
    })
}

/// The store's schema version, `None` when it has no schema yet.
async fn version(client: &impl GenericClient) -> Result<Option<i64>, tokio_postgres::Error> {
    let has_table: bool = client
        .query_one("SELECT to_regclass('schema_version') IS NOT NULL", &[])
        .await?
        .try_get(0)?;
    if !has_table {
        return Ok(None);
    }
    client
        .query_one("SELECT max(version) FROM schema_version", &[])
        .await?
        .try_get(0)
}

/// Brings the schema to [`schema::LATEST`] in one transaction, holding an advisory lock so
/// that hvlab processes starting together migrate once (a store already there needs no write).
async fn migrate(client: &mut Client, shown: &str) -> Result<(), StoreError> {
    let pg = |e: tokio_postgres::Error| StoreError::Pg(shown.to_string(), describe(&e));
    let too_new = |found| StoreError::TooNew {
        location: shown.to_string(),
        found,
        supported: schema::LATEST,
    };
    match version(client).await.map_err(pg)? {
        Some(v) if v == schema::LATEST => return Ok(()),
        Some(v) if v > schema::LATEST => return Err(too_new(v)),
        _ => {}
    }
    let tx = client.transaction().await.map_err(pg)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(pg)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
        .await
        .map_err(pg)?;
    let current = version(&tx).await.map_err(pg)?.unwrap_or(0);
    if current > schema::LATEST {
        return Err(too_new(current));
    }
    for m in schema::pending(current) {
        tx.batch_execute(m.postgres).await.map_err(pg)?;
    }
    tx.batch_execute("DELETE FROM schema_version")
        .await
        .map_err(pg)?;
    tx.execute(
        "INSERT INTO schema_version (version) VALUES ($1)",
        &[&schema::LATEST],
    )
    .await
    .map_err(pg)?;
    tx.commit().await.map_err(pg)
}

/// The run row; false when a run with this id is stored already (nothing written then).
async fn insert_run(tx: &mut Transaction<'_>, row: &RunRow) -> Result<bool, tokio_postgres::Error> {
    let sql = format!(
        "{} ON CONFLICT (id) DO NOTHING",
        insert_run_sql(RUN_COLUMNS.len(), '$')
    );
    let values: [&(dyn tokio_postgres::types::ToSql + Sync); 19] = run_values!(row);
    let n = tx.execute(&sql, &values).await?;
    Ok(n == 1)
}

/// The stored record of the run with exactly this id.
async fn stored_json(
    client: &impl GenericClient,
    id: &str,
) -> Result<Option<String>, tokio_postgres::Error> {
    client
        .query_opt("SELECT record_json FROM runs WHERE id = $1", &[&id])
        .await?
        .map(|r| r.try_get(0))
        .transpose()
}

/// The variants, samples and findings of a run whose row was just inserted: variants and
/// findings as one statement each (arrays unnested by the server), the samples (the bulk: a
/// run may carry hundreds of thousands) as one binary COPY, so a run costs a few round trips
/// and no per-row parsing whatever its size.
async fn insert_children(
    tx: &mut Transaction<'_>,
    row: &RunRow,
) -> Result<(), tokio_postgres::Error> {
    let (ordinals, names, statuses): (Vec<i64>, Vec<&str>, Vec<&str>) = row
        .variants
        .iter()
        .map(|(o, n, s)| (*o, n.as_str(), s.as_str()))
        .collect();
    tx.execute(
        "INSERT INTO variants (run_id, ordinal, name, status)
         SELECT $1, * FROM unnest($2::bigint[], $3::text[], $4::text[])",
        &[&row.id, &ordinals, &names, &statuses],
    )
    .await?;
    if !row.samples.is_empty() {
        let sink = tx
            .copy_in("COPY samples (run_id, variant, metric, unit, rep, value) FROM STDIN BINARY")
            .await?;
        let writer = BinaryCopyInWriter::new(
            sink,
            &[
                Type::TEXT,
                Type::TEXT,
                Type::TEXT,
                Type::TEXT,
                Type::INT8,
                Type::FLOAT8,
            ],
        );
        let mut writer = std::pin::pin!(writer);
        for (v, metric, unit, rep, value) in &row.samples {
            writer
                .as_mut()
                .write(&[&row.id, v, metric, unit, rep, value])
                .await?;
        }
        writer.finish().await?;
    }
    let (variants, ordinals, jsons): (Vec<&str>, Vec<i64>, Vec<&str>) = row
        .findings
        .iter()
        .map(|(v, o, j)| (v.as_str(), *o, j.as_str()))
        .collect();
    tx.execute(
        "INSERT INTO findings (run_id, variant, ordinal, json)
         SELECT $1, * FROM unnest($2::text[], $3::bigint[], $4::text[])",
        &[&row.id, &variants, &ordinals, &jsons],
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_postgres_url_password_is_never_shown_however_it_is_written() {
        for url in [
            "postgres://lab:s3/cr?et@db.example:5433/hvlab",
            "postgres://lab@db.example:5433/hvlab?password=s3/cr?et",
            "postgres://lab@db.example:5433/hvlab?passwor%64=s3cret",
            "postgresql://lab:s3cret@db.example/hvlab?host=/run/postgresql&password=s3cret",
            "postgres://lab:s3%2Fcret@db.example:5433/hvlab",
        ] {
            let text = shown(url);
            assert!(!text.contains("s3"), "{url} shown as {text}");
            assert!(text.contains("lab"), "{url} shown as {text}");
        }
        assert_eq!(
            shown("postgres://lab:s3/cr?et@db.example:5433/hvlab"),
            "postgres://lab:***@db.example:5433/hvlab"
        );
        assert_eq!(
            shown("postgresql:///hvlab?host=/run/postgresql"),
            "postgresql:///hvlab?host=/run/postgresql"
        );
        assert!(!shown("postgres://lab:s3cret@[bad").contains("s3cret"));
    }
}
