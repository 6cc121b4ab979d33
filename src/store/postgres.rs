//! The PostgreSQL engine: a store shared by many hosts and shards (`--db postgres://…`).
//!
//! The sync `postgres` client without TLS: hvlab talks to a server on the same machine or a
//! trusted network (a local socket, or host:port). Each run is one transaction, as on SQLite;
//! a connection that drops midway (a killed hvlab) makes the server roll it back.

use std::cell::RefCell;
use std::str::FromStr;

use postgres::{Client, NoTls, Transaction};

use super::{Ingested, RunListing, RunRow, StoreError, renamed, same_content, schema};
use crate::record::RunRecord;

/// The advisory lock key that serializes schema migrations between hvlab processes
/// ("hvlab" in ASCII).
const MIGRATION_LOCK: i64 = 0x68_766c_6162;

/// How long connecting may take before hvlab gives up on the server.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

/// An open PostgreSQL store.
pub(super) struct PgStore {
    /// `list` and `load` take `&self` (callers share one store); the client needs `&mut`.
    client: RefCell<Client>,
    /// The URL without its password, for errors.
    shown: String,
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("location", &self.shown)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Connects to `url` and brings the schema to [`schema::LATEST`].
    pub(super) fn open(url: &str) -> Result<PgStore, StoreError> {
        let shown = super::redact(url);
        let mut config =
            postgres::Config::from_str(url).map_err(|e| StoreError::BadUrl(shown.clone(), e))?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("hvlab");
        }
        let mut client = config
            .connect(NoTls)
            .map_err(|e| StoreError::Connect(shown.clone(), e))?;
        migrate(&mut client, &shown)?;
        Ok(PgStore {
            client: RefCell::new(client),
            shown,
        })
    }

    fn pg(&self) -> impl Fn(postgres::Error) -> StoreError + '_ {
        |e| StoreError::Pg(self.shown.clone(), e)
    }

    pub(super) fn save(&mut self, run: &mut RunRecord) -> Result<(), StoreError> {
        let pg = |e| StoreError::Pg(self.shown.clone(), e);
        let mut client = self.client.borrow_mut();
        let mut tx = client.transaction().map_err(pg)?;
        // A taken id gets a fresh suffix; ON CONFLICT keeps this safe against another hvlab
        // storing the same id at the same moment.
        let mut row = RunRow::of(run)?;
        while !insert_run(&mut tx, &row).map_err(pg)? {
            run.run_id = renamed(&run.run_id);
            row = RunRow::of(run)?;
        }
        insert_children(&mut tx, &row).map_err(pg)?;
        tx.commit().map_err(pg)
    }

    pub(super) fn ingest(&mut self, run: &RunRecord) -> Result<Ingested, StoreError> {
        let pg = |e| StoreError::Pg(self.shown.clone(), e);
        let row = RunRow::of(run)?;
        let mut client = self.client.borrow_mut();
        let mut tx = client.transaction().map_err(pg)?;
        if insert_run(&mut tx, &row).map_err(pg)? {
            insert_children(&mut tx, &row).map_err(pg)?;
            tx.commit().map_err(pg)?;
            return Ok(Ingested::Stored);
        }
        let stored = stored_json(&mut tx, &row.id).map_err(pg)?;
        tx.rollback().map_err(pg)?;
        Ok(match stored {
            Some(json) if same_content(&json, run) => Ingested::AlreadyStored,
            _ => Ingested::Conflict,
        })
    }

    pub(super) fn list(&self, limit: usize) -> Result<Vec<RunListing>, StoreError> {
        let rows = self
            .client
            .borrow_mut()
            .query(
                "SELECT id, scenario, backend, started_at, kernel, kvm_flavour, cpu, hz,
                        coalesce((SELECT array_agg(name ORDER BY ordinal) FROM variants
                                  WHERE run_id = runs.id), '{}')
                 FROM runs WHERE status = 'complete'
                 ORDER BY started_at DESC, id DESC LIMIT $1",
                &[&i64::try_from(limit).unwrap_or(i64::MAX)],
            )
            .map_err(self.pg())?;
        rows.iter()
            .map(|r| {
                let run_id: String = r.try_get(0).map_err(self.pg())?;
                let backend: String = r.try_get(2).map_err(self.pg())?;
                let backend = backend.parse().map_err(|e: String| {
                    StoreError::Corrupt(run_id.clone(), serde::de::Error::custom(e))
                })?;
                let listing = (|| {
                    Ok::<_, postgres::Error>(RunListing {
                        run_id: run_id.clone(),
                        scenario: r.try_get(1)?,
                        backend,
                        started_at: r.try_get(3)?,
                        kernel: r.try_get(4)?,
                        kvm_flavour: r.try_get(5)?,
                        cpu: r.try_get(6)?,
                        hz: u32::try_from(r.try_get::<_, i64>(7)?).unwrap_or(0),
                        variants: r.try_get(8)?,
                    })
                })();
                listing.map_err(self.pg())
            })
            .collect()
    }

    pub(super) fn load_json(&self, query: &str) -> Result<String, StoreError> {
        let mut client = self.client.borrow_mut();
        if let Some(json) = stored_json(&mut *client, query).map_err(self.pg())? {
            return Ok(json);
        }
        let hits = client
            .query(
                "SELECT id, record_json FROM runs WHERE strpos(id, $1) > 0
                 ORDER BY started_at DESC",
                &[&query],
            )
            .map_err(self.pg())?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<Vec<(String, String)>, postgres::Error>>()
            .map_err(self.pg())?;
        super::one_hit(query, hits)
    }

    /// (id, record) of every run whose `sweep` parameter is `id`, oldest first.
    pub(super) fn sweep_json(&self, id: &str) -> Result<Vec<(String, String)>, StoreError> {
        self.client
            .borrow_mut()
            .query(
                "SELECT id, record_json FROM runs WHERE params_json::jsonb ->> 'sweep' = $1
                 ORDER BY started_at, id",
                &[&id],
            )
            .map_err(self.pg())?
            .iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
            .collect::<Result<Vec<(String, String)>, postgres::Error>>()
            .map_err(self.pg())
    }
}

/// The store's schema version, `None` when it has no schema yet.
fn version(client: &mut impl postgres::GenericClient) -> Result<Option<i64>, postgres::Error> {
    let has_table: bool = client
        .query_one("SELECT to_regclass('schema_version') IS NOT NULL", &[])?
        .try_get(0)?;
    if !has_table {
        return Ok(None);
    }
    client
        .query_one("SELECT max(version) FROM schema_version", &[])?
        .try_get(0)
}

/// Brings the schema to [`schema::LATEST`] in one transaction, holding an advisory lock so
/// that hvlab processes starting together migrate once (a store already there needs no write).
fn migrate(client: &mut Client, shown: &str) -> Result<(), StoreError> {
    let pg = |e| StoreError::Pg(shown.to_string(), e);
    let too_new = |found| StoreError::TooNew {
        location: shown.to_string(),
        found,
        supported: schema::LATEST,
    };
    match version(client).map_err(pg)? {
        Some(v) if v == schema::LATEST => return Ok(()),
        Some(v) if v > schema::LATEST => return Err(too_new(v)),
        _ => {}
    }
    let mut tx = client.transaction().map_err(pg)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .map_err(pg)?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_version (version BIGINT NOT NULL)")
        .map_err(pg)?;
    let current = version(&mut tx).map_err(pg)?.unwrap_or(0);
    if current > schema::LATEST {
        return Err(too_new(current));
    }
    for m in schema::pending(current) {
        tx.batch_execute(m.postgres).map_err(pg)?;
    }
    tx.batch_execute("DELETE FROM schema_version").map_err(pg)?;
    tx.execute(
        "INSERT INTO schema_version (version) VALUES ($1)",
        &[&schema::LATEST],
    )
    .map_err(pg)?;
    tx.commit().map_err(pg)
}

/// The run row; false when a run with this id is stored already (nothing written then).
fn insert_run(tx: &mut Transaction<'_>, row: &RunRow) -> Result<bool, postgres::Error> {
    let n = tx.execute(
        "INSERT INTO runs (id, scenario, backend, profile, started_at, finished_at, status,
                           kernel, kvm_flavour, hvlab_version, git_rev, cpu, hz,
                           host_json, params_json, record_json)
         VALUES ($1, $2, $3, $4, $5, $6, 'complete', $7, $8, $9, $10, $11, $12, $13, $14, $15)
         ON CONFLICT (id) DO NOTHING",
        &[
            &row.id,
            &row.scenario,
            &row.backend,
            &row.profile,
            &row.started_at,
            &row.finished_at,
            &row.kernel,
            &row.kvm_flavour,
            &row.hvlab_version,
            &row.git_rev,
            &row.cpu,
            &row.hz,
            &row.host_json,
            &row.params_json,
            &row.record_json,
        ],
    )?;
    Ok(n == 1)
}

/// The stored record of the run with exactly this id.
fn stored_json(
    client: &mut impl postgres::GenericClient,
    id: &str,
) -> Result<Option<String>, postgres::Error> {
    client
        .query_opt("SELECT record_json FROM runs WHERE id = $1", &[&id])?
        .map(|r| r.try_get(0))
        .transpose()
}

/// The variants, samples and findings of a run whose row was just inserted: one statement
/// per table (arrays unnested by the server), so a run costs a few round trips whatever its
/// size.
fn insert_children(tx: &mut Transaction<'_>, row: &RunRow) -> Result<(), postgres::Error> {
    let (ordinals, names, statuses): (Vec<i64>, Vec<&str>, Vec<&str>) = row
        .variants
        .iter()
        .map(|(o, n, s)| (*o, n.as_str(), s.as_str()))
        .collect();
    tx.execute(
        "INSERT INTO variants (run_id, ordinal, name, status)
         SELECT $1, * FROM unnest($2::bigint[], $3::text[], $4::text[])",
        &[&row.id, &ordinals, &names, &statuses],
    )?;
    let mut columns = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (v, metric, unit, rep, value) in &row.samples {
        columns.0.push(v.as_str());
        columns.1.push(metric.as_str());
        columns.2.push(unit.as_str());
        columns.3.push(*rep);
        columns.4.push(*value);
    }
    tx.execute(
        "INSERT INTO samples (run_id, variant, metric, unit, rep, value)
         SELECT $1, * FROM unnest($2::text[], $3::text[], $4::text[], $5::bigint[],
                                  $6::double precision[])",
        &[
            &row.id, &columns.0, &columns.1, &columns.2, &columns.3, &columns.4,
        ],
    )?;
    let (variants, ordinals, jsons): (Vec<&str>, Vec<i64>, Vec<&str>) = row
        .findings
        .iter()
        .map(|(v, o, j)| (v.as_str(), *o, j.as_str()))
        .collect();
    tx.execute(
        "INSERT INTO findings (run_id, variant, ordinal, json)
         SELECT $1, * FROM unnest($2::text[], $3::bigint[], $4::text[])",
        &[&row.id, &variants, &ordinals, &jsons],
    )?;
    Ok(())
}
