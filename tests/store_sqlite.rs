//! merge, export and import on SQLite stores (no server needed), schema migration of a
//! version-1 file, and the errors of bad input.

use crate::common;

use std::path::Path;

use common::{assert_exit, json, run, scenario_json};

fn model_run(db: &Path, scenario: &str) -> serde_json::Value {
    json(&run(
        db,
        &[
            "run",
            scenario,
            "--backend",
            "model",
            "--reps",
            "4",
            "--json",
        ],
    ))
}

fn ids(db: &Path) -> Vec<String> {
    let mut ids: Vec<String> = json(&run(db, &["runs", "--json"]))["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| r["run_id"].as_str().expect("id").to_string())
        .collect();
    ids.sort();
    ids
}

#[test]
fn merging_sqlite_shards_into_sqlite_is_idempotent() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (s1, s2, target) = (
        dir.path().join("s1.db"),
        dir.path().join("s2.db"),
        dir.path().join("all.db"),
    );
    let a = model_run(&s1, "lifecycle");
    let b = model_run(&s2, "percpu");
    let files = [s1.to_str().expect("utf-8"), s2.to_str().expect("utf-8")];
    for (stored, already) in [(2, 0), (0, 2)] {
        let v = json(&run(&target, &["merge", "--json", files[0], files[1]]));
        assert_eq!(v["total"]["stored"], stored, "{v}");
        assert_eq!(v["total"]["already_stored"], already, "{v}");
        assert_eq!(v["files"].as_array().map(Vec::len), Some(2));
    }
    let mut expected = vec![
        a["run_id"].as_str().expect("id").to_string(),
        b["run_id"].as_str().expect("id").to_string(),
    ];
    expected.sort();
    assert_eq!(ids(&target), expected);
    let shown = json(&run(&target, &["show", &expected[0], "--json"]));
    assert!(shown == a || shown == b);

    // Merging a store into itself, or a file that is not there, is refused.
    assert_exit(
        &run(&target, &["merge", target.to_str().expect("utf-8")]),
        2,
        &["is the store being merged into"],
    );
    assert_exit(
        &run(&target, &["merge", "/nonexistent/shard.db"]),
        2,
        &["/nonexistent/shard.db", "no such results database"],
    );
    let junk = dir.path().join("junk.db");
    std::fs::write(
        &junk,
        "not sqlite at all, just text that is long enough to be a header",
    )
    .expect("write");
    assert_exit(
        &run(&target, &["merge", junk.to_str().expect("utf-8")]),
        2,
        &["is not a results database"],
    );
}

#[test]
fn export_then_import_round_trips_and_bad_input_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (from, to) = (dir.path().join("from.db"), dir.path().join("to.db"));
    model_run(&from, "lifecycle");
    model_run(&from, "exits");
    let file = dir.path().join("runs.jsonl");
    let out = run(&from, &["export", "-o", file.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(common::stderr(&out).contains("exported 2 run(s)"));
    for _ in 0..2 {
        let out = run(&to, &["import", file.to_str().expect("utf-8")]);
        assert!(out.status.success(), "{}", common::stderr(&out));
    }
    assert_eq!(ids(&to), ids(&from));
    for id in ids(&from) {
        assert_eq!(
            json(&run(&to, &["show", &id, "--json"])),
            json(&run(&from, &["show", &id, "--json"]))
        );
    }
    let out = run(&to, &["export"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        std::fs::read_to_string(&file).expect("read")
    );

    // A malformed third line: named, exit 2, nothing imported (not even the good lines).
    let text = std::fs::read_to_string(&file).expect("read");
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, format!("{text}{{\"run_id\": \"x\"\n")).expect("write");
    let fresh = dir.path().join("fresh.db");
    assert_exit(
        &run(&fresh, &["import", bad.to_str().expect("utf-8")]),
        2,
        &[
            "bad.jsonl line 3",
            "not a run record",
            "nothing was imported",
        ],
    );
    assert!(ids(&fresh).is_empty());
    assert_exit(
        &run(&fresh, &["export", "--format", "xml"]),
        2,
        &["invalid value 'xml'", "jsonl", "csv"],
    );
    assert_exit(
        &run(&fresh, &["import", "/nonexistent/runs.jsonl"]),
        2,
        &["/nonexistent/runs.jsonl"],
    );
    assert_exit(
        &run(&from, &["export", "zzzz-no-such-run"]),
        2,
        &["No run matches"],
    );
}

/// hvlab's first SQLite schema (version 1), as it shipped.
const V1_SQLITE: &str = "
CREATE TABLE runs (
    id TEXT PRIMARY KEY, scenario TEXT NOT NULL, backend TEXT NOT NULL, profile TEXT,
    started_at TEXT NOT NULL, finished_at TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status = 'complete'), kernel TEXT NOT NULL,
    kvm_flavour TEXT NOT NULL, hvlab_version TEXT NOT NULL, git_rev TEXT NOT NULL,
    host_json TEXT NOT NULL, params_json TEXT NOT NULL, record_json TEXT NOT NULL);
CREATE TABLE samples (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, variant TEXT NOT NULL,
    metric TEXT NOT NULL, unit TEXT NOT NULL, rep INTEGER NOT NULL, value REAL NOT NULL,
    PRIMARY KEY (run_id, variant, metric, rep));
CREATE TABLE variants (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, ordinal INTEGER NOT NULL,
    name TEXT NOT NULL, status TEXT NOT NULL, PRIMARY KEY (run_id, ordinal));
CREATE TABLE findings (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, variant TEXT NOT NULL,
    ordinal INTEGER NOT NULL, json TEXT NOT NULL, PRIMARY KEY (run_id, variant, ordinal));
CREATE INDEX runs_by_scenario ON runs (scenario, started_at);
PRAGMA user_version = 1;
";

/// A version-1 file holding one run (a fresh model run's record).
fn v1_store(path: &Path) -> serde_json::Value {
    let record = scenario_json("memory", &[], &[], &["--backend", "model", "--reps", "4"]);
    let conn = rusqlite::Connection::open(path).expect("create");
    conn.execute_batch(V1_SQLITE).expect("v1 schema");
    let h = &record["host"];
    conn.execute(
        "INSERT INTO runs VALUES (?1, 'memory', 'model', NULL, ?2, ?3, 'complete', ?4, ?5,
                                  '0.1.0', 'old', ?6, '{}', ?7)",
        rusqlite::params![
            record["run_id"].as_str(),
            record["started_at"].as_str(),
            record["finished_at"].as_str(),
            h["kernel"].as_str(),
            h["kvm_flavour"].as_str(),
            h.to_string(),
            record.to_string()
        ],
    )
    .expect("v1 run");
    record
}

fn user_version(path: &Path) -> i64 {
    rusqlite::Connection::open(path)
        .expect("open")
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .expect("user_version")
}

#[test]
fn a_version_1_file_is_migrated_on_open_and_a_newer_one_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    let old = dir.path().join("old.db");
    let record = v1_store(&old);
    let id = record["run_id"].as_str().expect("id");

    // Merging reads a v1 shard as it is: the shard is not rewritten.
    let target = dir.path().join("target.db");
    let v = json(&run(
        &target,
        &["merge", "--json", old.to_str().expect("utf-8")],
    ));
    assert_eq!(v["total"]["stored"], 1, "{v}");
    assert_eq!(user_version(&old), 1);

    // Reading it (`runs`, `show`) reads it in memory and leaves the file at version 1.
    let listing = json(&run(&old, &["runs", "--json"]));
    assert_eq!(user_version(&old), 1);
    let row = &listing["runs"][0];
    assert_eq!(row["run_id"], id);
    assert_eq!(row["cpu"], record["host"]["cpu"]);
    assert_eq!(row["hz"], record["host"]["hz"]);
    assert_eq!(json(&run(&old, &["show", id, "--json"])), record);
    // Opening it to write migrates it, and it takes new runs.
    model_run(&old, "percpu");
    assert_eq!(user_version(&old), hvlab::store::schema::LATEST);
    assert_eq!(ids(&old).len(), 2);

    rusqlite::Connection::open(&old)
        .expect("open")
        .pragma_update(None, "user_version", 7)
        .expect("bump");
    assert_exit(
        &run(&old, &["runs"]),
        2,
        &["schema version 7", "newer hvlab", "Upgrade hvlab"],
    );
    assert_exit(
        &run(&target, &["merge", old.to_str().expect("utf-8")]),
        2,
        &["schema version 7"],
    );
}
