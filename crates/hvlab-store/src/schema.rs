//! The store's schema as an ordered list of migrations, one SQL text per engine.
//!
//! A store records the version it is at (SQLite: `PRAGMA user_version`; PostgreSQL: the
//! `schema_version` table). Opening a store applies, in one transaction, every migration above
//! its version; a store at a version above [`LATEST`] was written by a newer hvlab and is
//! refused, since this hvlab cannot know what the newer columns mean.
//!
//! Append migrations; never edit one that has shipped: stores in the field are at its version.

/// One step of the schema.
#[derive(Debug)]
pub struct Migration {
    /// The version a store is at after this step.
    pub version: i64,
    /// What the step does, for errors and the log.
    pub what: &'static str,
    /// The step on SQLite.
    pub sqlite: &'static str,
    /// The step on PostgreSQL.
    pub postgres: &'static str,
}

/// The version this hvlab writes.
pub const LATEST: i64 = 4;

/// Migration 1's tables, written once for both engines: they differ only in the names of the
/// 64-bit integer and float types.
macro_rules! v1_tables {
    ($int:literal, $real:literal) => {
        concat!(
            "
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
    rep     ",
            $int,
            " NOT NULL,
    value   ",
            $real,
            " NOT NULL,
    PRIMARY KEY (run_id, variant, metric, rep)
);
CREATE TABLE IF NOT EXISTS variants (
    run_id  TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    ordinal ",
            $int,
            " NOT NULL,
    name    TEXT NOT NULL,
    status  TEXT NOT NULL,
    PRIMARY KEY (run_id, ordinal)
);
CREATE TABLE IF NOT EXISTS findings (
    run_id  TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    variant TEXT NOT NULL,
    ordinal ",
            $int,
            " NOT NULL,
    json    TEXT NOT NULL,
    PRIMARY KEY (run_id, variant, ordinal)
);
CREATE INDEX IF NOT EXISTS runs_by_scenario ON runs (scenario, started_at);
"
        )
    };
}

/// Every step, in order; `MIGRATIONS[i].version == i + 1`.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        what: "runs, variants, samples and findings",
        sqlite: v1_tables!("INTEGER", "REAL"),
        postgres: v1_tables!("BIGINT", "DOUBLE PRECISION"),
    },
    Migration {
        version: 2,
        what: "the host fingerprint's CPU model and HZ as columns, for fleet views",
        // Runs stored before have them in host_json only: copy them out.
        sqlite: "
ALTER TABLE runs ADD COLUMN cpu TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN hz INTEGER NOT NULL DEFAULT 0;
UPDATE runs SET cpu = coalesce(json_extract(host_json, '$.cpu'), ''),
                hz = coalesce(json_extract(host_json, '$.hz'), 0);
CREATE INDEX IF NOT EXISTS runs_by_host ON runs (kernel, cpu, kvm_flavour, hz);
",
        postgres: "
ALTER TABLE runs ADD COLUMN cpu TEXT NOT NULL DEFAULT '';
ALTER TABLE runs ADD COLUMN hz BIGINT NOT NULL DEFAULT 0;
UPDATE runs SET cpu = coalesce(host_json::jsonb ->> 'cpu', ''),
                hz = coalesce((host_json::jsonb ->> 'hz')::bigint, 0);
CREATE INDEX IF NOT EXISTS runs_by_host ON runs (kernel, cpu, kvm_flavour, hz);
",
    },
    Migration {
        version: 3,
        what: "a run's tag (internal runs: validate, showcase), suite id and baseline name as columns, for selecting runs",
        // Runs stored before: a tag in the record (none yet), a suite showcase by its
        // `showcase` parameter, the suite id by its `suite` parameter.
        sqlite: "
ALTER TABLE runs ADD COLUMN tag TEXT;
ALTER TABLE runs ADD COLUMN suite TEXT;
ALTER TABLE runs ADD COLUMN baseline TEXT;
UPDATE runs SET tag = coalesce(json_extract(record_json, '$.tag'),
                               CASE WHEN json_extract(params_json, '$.showcase') IS NOT NULL
                                    THEN 'showcase' END),
                suite = json_extract(params_json, '$.suite'),
                baseline = json_extract(record_json, '$.baseline');
CREATE INDEX IF NOT EXISTS runs_by_suite ON runs (suite);
",
        postgres: "
ALTER TABLE runs ADD COLUMN tag TEXT;
ALTER TABLE runs ADD COLUMN suite TEXT;
ALTER TABLE runs ADD COLUMN baseline TEXT;
UPDATE runs SET tag = coalesce(record_json::jsonb ->> 'tag',
                               CASE WHEN params_json::jsonb ? 'showcase' THEN 'showcase' END),
                suite = params_json::jsonb ->> 'suite',
                baseline = record_json::jsonb ->> 'baseline';
CREATE INDEX IF NOT EXISTS runs_by_suite ON runs (suite);
",
    },
    Migration {
        version: 4,
        what: "the clock a run's times are on (wall, or QEMU's instruction clock) as a column, so runs of two clocks are never compared",
        // Runs stored before: a kvm run's clock from its host fingerprint (none there: the
        // wall clock), a model run's the wall clock (its times are its profile's).
        sqlite: "
ALTER TABLE runs ADD COLUMN clock TEXT NOT NULL DEFAULT 'wall';
UPDATE runs SET clock = coalesce(json_extract(host_json, '$.clock'), 'wall')
    WHERE backend = 'kvm';
CREATE INDEX IF NOT EXISTS runs_by_clock ON runs (clock);
",
        postgres: "
ALTER TABLE runs ADD COLUMN clock TEXT NOT NULL DEFAULT 'wall';
UPDATE runs SET clock = coalesce(host_json::jsonb ->> 'clock', 'wall')
    WHERE backend = 'kvm';
CREATE INDEX IF NOT EXISTS runs_by_clock ON runs (clock);
",
    },
];

/// The steps that take a store from `version` to [`LATEST`].
pub fn pending(version: i64) -> impl Iterator<Item = &'static Migration> {
    MIGRATIONS.iter().filter(move |m| m.version > version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order_up_to_latest() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version, i64::try_from(i).unwrap() + 1, "{}", m.what);
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(LATEST));
        assert_eq!(pending(0).count(), MIGRATIONS.len());
        assert_eq!(pending(LATEST).count(), 0);
    }
}
