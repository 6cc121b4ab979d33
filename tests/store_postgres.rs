//! The shared PostgreSQL store, end to end: a throwaway cluster started by the test itself
//! (initdb + pg_ctl, unprivileged, on a Unix socket in a temporary directory, stopped on
//! drop even when a test panics). Tests skip loudly where no cluster can be started.

use crate::common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{
    assert_exit, contents_by_unit, hvlab, json, loud_skip, run, runs_by_id, scenario_json,
};

/// A PostgreSQL cluster of the test's own.
struct Cluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// Whether the server runs as `nobody` (initdb refuses root).
    as_nobody: bool,
}

const NOBODY: u32 = 65534;

impl Cluster {
    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.path().join("sock")
    }

    /// A command for a PostgreSQL tool, as the cluster's owner.
    fn tool(bin: &Path, as_nobody: bool, name: &str) -> Command {
        let program = bin.join(name);
        if as_nobody {
            let mut c = Command::new("setpriv");
            c.args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--reset-env",
            ]);
            c.arg(program);
            c
        } else {
            Command::new(program)
        }
    }

    /// Starts a cluster, or says loudly why not and returns None.
    fn start(test: &str) -> Option<Cluster> {
        let Some(bin) = find_bin() else {
            loud_skip(&format!(
                "{test}: PostgreSQL is not installed (no initdb in /usr/lib/postgresql/*/bin or on PATH; .ci/run installs `postgresql`)"
            ));
            return None;
        };
        // SAFETY: geteuid has no preconditions and cannot fail.
        let as_nobody = unsafe { libc::geteuid() } == 0;
        let dir = tempfile::Builder::new()
            .prefix("hvlab-pg-")
            .tempdir()
            .expect("temporary directory");
        let cluster = Cluster {
            dir,
            bin,
            as_nobody,
        };
        std::fs::create_dir(cluster.socket_dir()).expect("socket dir");
        if as_nobody {
            for d in [cluster.dir.path().to_path_buf(), cluster.socket_dir()] {
                if let Err(e) = std::os::unix::fs::chown(&d, Some(NOBODY), Some(NOBODY)) {
                    loud_skip(&format!(
                        "{test}: cannot hand {} to nobody: {e}",
                        d.display()
                    ));
                    return None;
                }
            }
            // nobody must reach its directory inside the temporary one.
            let _ = std::fs::set_permissions(
                cluster.dir.path(),
                std::fs::Permissions::from_mode(0o755),
            );
        }
        let initdb = Cluster::tool(&cluster.bin, as_nobody, "initdb")
            .arg("-D")
            .arg(cluster.data())
            .args([
                "-U",
                "hvlab",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ])
            .output();
        if !ok_or_skip(test, "initdb", initdb) {
            return None;
        }
        let start = Cluster::tool(&cluster.bin, as_nobody, "pg_ctl")
            .arg("-D")
            .arg(cluster.data())
            .arg("-l")
            .arg(cluster.dir.path().join("server.log"))
            .arg("-o")
            .arg(format!(
                "-k {} -h '' -c fsync=off -c full_page_writes=off",
                cluster.socket_dir().display()
            ))
            .args(["-w", "-t", "60", "start"])
            .output();
        if !ok_or_skip(test, "pg_ctl start", start) {
            let log =
                std::fs::read_to_string(cluster.dir.path().join("server.log")).unwrap_or_default();
            loud_skip(&format!("{test}: server log:\n{log}"));
            return None;
        }
        Some(cluster)
    }

    /// The URL of database `db` (created by [`Cluster::database`]).
    fn url(&self, db: &str) -> String {
        format!(
            "postgres:///{db}?host={}&user=hvlab",
            self.socket_dir().display()
        )
    }

    /// A fresh database; its URL.
    fn database(&self, name: &str) -> String {
        let mut client = postgres::Client::connect(&self.url("postgres"), postgres::NoTls)
            .expect("connect to the test cluster");
        client
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .expect("create database");
        self.url(name)
    }

    fn client(&self, url: &str) -> postgres::Client {
        postgres::Client::connect(url, postgres::NoTls).expect("connect")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Cluster::tool(&self.bin, self.as_nobody, "pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
}

fn ok_or_skip(test: &str, what: &str, out: std::io::Result<Output>) -> bool {
    match out {
        Ok(o) if o.status.success() => true,
        Ok(o) => {
            loud_skip(&format!(
                "{test}: {what} failed ({}): {}{}",
                o.status,
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ));
            false
        }
        Err(e) => {
            loud_skip(&format!("{test}: cannot run {what}: {e}"));
            false
        }
    }
}

/// The newest /usr/lib/postgresql/N/bin with initdb, else the directory of `initdb` on PATH.
fn find_bin() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .find(|d| d.join("initdb").exists() && d.join("pg_ctl").exists())
    })
}

/// Three "shards", each its own SQLite file with model runs of the suite's scenarios.
fn shard_files(dir: &Path) -> Vec<String> {
    let scenarios = [
        ["lifecycle", "memory"],
        ["exits", "lifecycle"],
        ["pinning", "percpu"],
    ];
    scenarios
        .iter()
        .enumerate()
        .map(|(i, names)| {
            let file = dir.join(format!("shard-{i}.db")).display().to_string();
            for s in names {
                let out = run(
                    &file,
                    &["run", s, "--backend", "model", "--reps", "4", "--json"],
                );
                json(&out);
            }
            file
        })
        .collect()
}

fn tally(out: &Output) -> (u64, u64, u64) {
    let v = json(out);
    let t = &v["total"];
    (
        t["stored"].as_u64().expect("stored"),
        t["already_stored"].as_u64().expect("already_stored"),
        t["conflicts"].as_array().expect("conflicts").len() as u64,
    )
}

#[test]
fn shards_merged_twice_into_postgres_are_stored_once_and_every_command_reads_them() {
    let Some(pg) = Cluster::start("shards_merged_twice_into_postgres") else {
        return;
    };
    let url = pg.database("merged");
    let dir = tempfile::tempdir().expect("temp dir");
    let files = shard_files(dir.path());
    let mut expected = BTreeMap::new();
    for f in &files {
        expected.extend(runs_by_id(f));
    }
    assert_eq!(expected.len(), 6);

    let mut merge = vec!["merge", "--json"];
    merge.extend(files.iter().map(String::as_str));
    assert_eq!(tally(&run(&url, &merge)), (6, 0, 0));
    assert_eq!(
        tally(&run(&url, &merge)),
        (0, 6, 0),
        "a second merge stores nothing"
    );
    let stored = runs_by_id(&url);
    assert_eq!(stored, expected, "the same runs, record for record");

    // The human summary names the counts.
    let text = run(&url, &["merge", &files[0]]);
    assert!(text.status.success(), "{}", common::stderr(&text));
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("2 run(s): 0 stored, 2 already stored"),
        "{text}"
    );

    // compare and report read the shared store.
    let lifecycles: Vec<&String> = expected
        .iter()
        .filter(|(_, r)| r["scenario"] == "lifecycle")
        .map(|(id, _)| id)
        .collect();
    assert_eq!(lifecycles.len(), 2);
    let cmp = json(&run(
        &url,
        &["compare", lifecycles[0], lifecycles[1], "--json"],
    ));
    assert!(
        !cmp["comparisons"]
            .as_array()
            .expect("comparisons")
            .is_empty(),
        "{cmp}"
    );
    let report_dir = dir.path().join("report");
    let out = run(
        &url,
        &["report", "-o", report_dir.to_str().expect("utf-8 path")],
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    let html = common::report_pages(&report_dir);
    for id in expected.keys().filter(|id| id.contains("-pinning-")) {
        assert!(html.contains(id.as_str()), "the report shows {id}");
    }

    // The samples rows agree with the records (the report and compare read records; the
    // per-sample table is what SQL users of a shared store query).
    let mut client = pg.client(&url);
    let rows: i64 = client
        .query_one("SELECT count(*) FROM samples", &[])
        .expect("count")
        .get(0);
    let in_records: usize = expected
        .values()
        .flat_map(|r| r["variants"].as_array().expect("variants"))
        .flat_map(|v| v["metrics"].as_object().expect("metrics").values())
        .map(|m| m["samples"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(usize::try_from(rows).expect("count"), in_records);

    // A run with a known id but changed content is reported, and the stored copy kept.
    let victim = lifecycles[0].clone();
    let shard = files
        .iter()
        .find(|f| runs_by_id(f).contains_key(&victim))
        .expect("the shard holding it");
    // Changed where its samples do not speak (a summary they contradict is refused before
    // any comparison of content, see safe_io).
    let mut changed = expected[&victim].clone();
    changed["finished_at"] = serde_json::json!("2099-01-01T00:00:00Z");
    let conn = rusqlite::Connection::open(shard).expect("open shard");
    conn.execute(
        "UPDATE runs SET record_json = ?1 WHERE id = ?2",
        rusqlite::params![changed.to_string(), victim],
    )
    .expect("tamper");
    drop(conn);
    let out = run(&url, &["merge", shard]);
    assert_exit(&out, 2, &["1 run(s) have the id of a stored run", &victim]);
    assert_eq!(runs_by_id(&url)[&victim], expected[&victim]);
}

#[test]
fn export_and_import_move_runs_between_postgres_and_sqlite_unchanged() {
    let Some(pg) = Cluster::start("export_and_import") else {
        return;
    };
    let (a, b) = (pg.database("site_a"), pg.database("site_b"));
    for s in ["lifecycle", "memory", "percpu"] {
        json(&run(
            &a,
            &["run", s, "--backend", "model", "--reps", "4", "--json"],
        ));
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let file_a = dir.path().join("a.jsonl");
    let out = run(
        &a,
        &[
            "export",
            "--format",
            "jsonl",
            "-o",
            file_a.to_str().expect("utf-8"),
        ],
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = std::fs::read_to_string(&file_a).expect("export");
    assert_eq!(text.lines().count(), 3);

    // PostgreSQL → file → PostgreSQL and → SQLite, twice each: stored once.
    let sqlite = dir.path().join("c.db").display().to_string();
    for target in [&b, &sqlite] {
        for (stored, already) in [(3, 0), (0, 3)] {
            let v = json(&run(
                target,
                &["import", file_a.to_str().expect("utf-8"), "--json"],
            ));
            assert_eq!(v["tally"]["stored"], stored, "{v}");
            assert_eq!(v["tally"]["already_stored"], already, "{v}");
        }
        assert_eq!(runs_by_id(target), runs_by_id(&a));
        // And back out: the same bytes, so a round trip loses nothing (floats included).
        let again = run(target, &["export"]);
        assert!(again.status.success(), "{}", common::stderr(&again));
        assert_eq!(String::from_utf8_lossy(&again.stdout), text);
    }

    // A single run by a unique part of its id.
    let one = runs_by_id(&a).into_keys().next().expect("a run");
    let out = run(&a, &["export", &one[one.len() - 16..]]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
}

#[test]
fn a_failed_write_leaves_nothing_in_postgres() {
    let Some(pg) = Cluster::start("a_failed_write_leaves_nothing_in_postgres") else {
        return;
    };
    let url = pg.database("failed");
    let mut record: hvlab::record::RunRecord = serde_json::from_value(scenario_json(
        "lifecycle",
        &[],
        &[],
        &["--backend", "model", "--reps", "4"],
    ))
    .expect("a run record");
    // Two variants of one name collide on the samples key after the run row and the
    // variants are written: the whole run must roll back.
    record.variants.push(record.variants[0].clone());
    let mut store = hvlab::store::Store::open(Path::new(&url)).expect("open");
    assert!(store.save(&mut record).is_err());
    assert!(store.ingest(&record).is_err());
    assert!(store.list(10).expect("list").is_empty());
    let mut client = pg.client(&url);
    for table in ["runs", "variants", "samples", "findings"] {
        let n: i64 = client
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .expect("count")
            .get(0);
        assert_eq!(n, 0, "{table} keeps rows of a failed run");
    }
    // The same store still takes a good run afterwards.
    record.variants.pop();
    store.save(&mut record).expect("save");
    assert_eq!(store.list(10).expect("list").len(), 1);
}

/// The schema of hvlab's first store (version 1), as it shipped.
const V1_POSTGRES: &str = "
CREATE TABLE runs (
    id TEXT PRIMARY KEY, scenario TEXT NOT NULL, backend TEXT NOT NULL, profile TEXT,
    started_at TEXT NOT NULL, finished_at TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status = 'complete'), kernel TEXT NOT NULL,
    kvm_flavour TEXT NOT NULL, hvlab_version TEXT NOT NULL, git_rev TEXT NOT NULL,
    host_json TEXT NOT NULL, params_json TEXT NOT NULL, record_json TEXT NOT NULL);
CREATE TABLE samples (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, variant TEXT NOT NULL,
    metric TEXT NOT NULL, unit TEXT NOT NULL, rep BIGINT NOT NULL,
    value DOUBLE PRECISION NOT NULL, PRIMARY KEY (run_id, variant, metric, rep));
CREATE TABLE variants (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, ordinal BIGINT NOT NULL,
    name TEXT NOT NULL, status TEXT NOT NULL, PRIMARY KEY (run_id, ordinal));
CREATE TABLE findings (
    run_id TEXT NOT NULL REFERENCES runs(id) ON DELETE CASCADE, variant TEXT NOT NULL,
    ordinal BIGINT NOT NULL, json TEXT NOT NULL, PRIMARY KEY (run_id, variant, ordinal));
CREATE TABLE schema_version (version BIGINT NOT NULL);
INSERT INTO schema_version VALUES (1);
";

#[test]
fn a_version_1_postgres_store_is_migrated_and_a_newer_one_refused() {
    let Some(pg) = Cluster::start("a_version_1_postgres_store_is_migrated") else {
        return;
    };
    let url = pg.database("old");
    let record = scenario_json(
        "lifecycle",
        &[],
        &[],
        &["--backend", "model", "--reps", "4"],
    );
    let id = record["run_id"].as_str().expect("id").to_string();
    let mut client = pg.client(&url);
    client.batch_execute(V1_POSTGRES).expect("v1 schema");
    client
        .execute(
            "INSERT INTO runs VALUES ($1, 'lifecycle', 'model', NULL, $2, $3, 'complete', $4,
                                     $5, '0.1.0', 'old', $6, '{}', $7)",
            &[
                &id,
                &record["started_at"].as_str(),
                &record["finished_at"].as_str(),
                &record["host"]["kernel"].as_str(),
                &record["host"]["kvm_flavour"].as_str(),
                &record["host"].to_string(),
                &record.to_string(),
            ],
        )
        .expect("v1 run");
    let listing = json(&run(&url, &["runs", "--json"]));
    let row = &listing["runs"][0];
    assert_eq!(row["run_id"], id.as_str());
    // Migration 2 copied the fingerprint out of host_json.
    assert_eq!(row["cpu"], record["host"]["cpu"]);
    assert_eq!(row["hz"], record["host"]["hz"]);
    assert_eq!(json(&run(&url, &["show", &id, "--json"])), record);
    let v: i64 = client
        .query_one("SELECT max(version) FROM schema_version", &[])
        .expect("version")
        .get(0);
    assert_eq!(v, hvlab::store::schema::LATEST);

    client
        .batch_execute("UPDATE schema_version SET version = 99")
        .expect("bump");
    let out = run(&url, &["runs"]);
    assert_exit(
        &out,
        2,
        &["schema version 99", "newer hvlab", "Upgrade hvlab"],
    );
}

#[test]
fn postgres_stores_tags_suites_and_baselines_and_an_old_showcase_is_tagged_by_the_migration() {
    let Some(pg) = Cluster::start("postgres_stores_tags_suites_and_baselines") else {
        return;
    };
    let url = pg.database("tags");
    // A showcase stored by an hvlab of schema 1, before runs had tags.
    let mut record = scenario_json(
        "lifecycle",
        &[],
        &[],
        &["--backend", "model", "--reps", "4"],
    );
    record["params"]["showcase"] = "the thread's setup".into();
    record["params"]["suite"] = "su-old".into();
    let id = record["run_id"].as_str().expect("id").to_string();
    let mut client = pg.client(&url);
    client.batch_execute(V1_POSTGRES).expect("v1 schema");
    client
        .execute(
            "INSERT INTO runs VALUES ($1, 'lifecycle', 'model', NULL, $2, $3, 'complete', $4,
                                     $5, '0.1.0', 'old', $6, $7, $8)",
            &[
                &id,
                &record["started_at"].as_str(),
                &record["finished_at"].as_str(),
                &record["host"]["kernel"].as_str(),
                &record["host"]["kvm_flavour"].as_str(),
                &record["host"].to_string(),
                &record["params"].to_string(),
                &record.to_string(),
            ],
        )
        .expect("v1 run");
    // Internal: not among the user's runs, listed with --all as a showcase of its suite.
    let mine = json(&run(&url, &["runs", "--json"]));
    assert_eq!(mine["runs"].as_array().expect("runs").len(), 0, "{mine}");
    let all = json(&run(&url, &["runs", "--all", "--json"]));
    assert_eq!(all["runs"][0]["tag"], "showcase", "{all}");
    assert_eq!(all["runs"][0]["suite"], "su-old", "{all}");

    // A baseline saved in PostgreSQL and compared against.
    let args = [
        "run",
        "lifecycle",
        "--backend",
        "model",
        "--variant",
        "irqchip-first",
        "--reps",
        "5",
        "--warmup",
        "0",
        "--json",
    ];
    let mut save = args.to_vec();
    save.extend(["--save-baseline", "main"]);
    let base = json(&run(&url, &save));
    assert_eq!(base["baseline"], "main");
    json(&run(&url, &args));
    let listed = json(&run(&url, &["runs", "--json"]));
    let saved: Vec<&serde_json::Value> = listed["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .filter(|r| r["baseline"] == "main")
        .collect();
    assert_eq!(saved.len(), 1, "{listed}");
    assert_eq!(saved[0]["run_id"], base["run_id"], "{listed}");
    assert_exit(&run(&url, &["compare", "--baseline", "main"]), 0, &[]);
    assert_exit(
        &run(&url, &["compare", "--baseline", "nope"]),
        2,
        &["main (lifecycle on model)"],
    );
}

/// The stored runs of Debian 7.3 on the instruction clock and on the wall clock.
fn clock_fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/icount-7.3/runs.jsonl")
}

#[test]
fn postgres_keeps_each_runs_clock_and_refuses_to_compare_two_clocks() {
    let Some(pg) = Cluster::start("postgres_keeps_each_runs_clock") else {
        return;
    };
    let url = pg.database("clocks");
    let fixture = clock_fixture();
    let text = std::fs::read_to_string(&fixture).expect("fixture");
    let clocks: BTreeMap<String, String> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a run");
            (
                v["run_id"].as_str().expect("id").to_string(),
                v["host"]["clock"].as_str().unwrap_or("wall").to_string(),
            )
        })
        .collect();
    let out = run(&url, &["import", fixture.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    // The column, as listed, and the record, as shown.
    let listed = json(&run(&url, &["runs", "--json"]));
    for r in listed["runs"].as_array().expect("runs") {
        let id = r["run_id"].as_str().expect("id");
        assert_eq!(
            r["clock"].as_str(),
            clocks.get(id).map(String::as_str),
            "{r}"
        );
    }
    let mut client = pg.client(&url);
    for (id, clock) in &clocks {
        let stored: String = client
            .query_one("SELECT clock FROM runs WHERE id = $1", &[id])
            .expect("a stored run")
            .get(0);
        assert_eq!(&stored, clock, "{id}");
    }
    // Out again byte for byte, and refused together in one comparison.
    let again = run(&url, &["export"]);
    assert_eq!(String::from_utf8_lossy(&again.stdout), text);
    let icount = clocks
        .iter()
        .find(|(_, c)| *c == "icount")
        .expect("an icount run")
        .0;
    let wall = clocks
        .iter()
        .find(|(_, c)| *c == "wall")
        .expect("a wall run")
        .0;
    assert_exit(
        &run(&url, &["compare", icount, wall]),
        2,
        &[icount.as_str(), wall.as_str(), "never compare"],
    );

    // A store of schema 1 holding a kvm run on the instruction clock: migration 4 reads its
    // clock from its host fingerprint.
    let old = pg.database("clocks_v1");
    let record: serde_json::Value = serde_json::from_str(
        text.lines()
            .find(|l| l.contains(r#""clock":"icount""#))
            .expect("an icount line"),
    )
    .expect("a run");
    let mut client = pg.client(&old);
    client.batch_execute(V1_POSTGRES).expect("v1 schema");
    client
        .execute(
            "INSERT INTO runs VALUES ($1, 'lifecycle', 'kvm', NULL, $2, $3, 'complete', $4,
                                     $5, '0.1.0', 'old', $6, $7, $8)",
            &[
                &record["run_id"].as_str(),
                &record["started_at"].as_str(),
                &record["finished_at"].as_str(),
                &record["host"]["kernel"].as_str(),
                &record["host"]["kvm_flavour"].as_str(),
                &record["host"].to_string(),
                &record["params"].to_string(),
                &record.to_string(),
            ],
        )
        .expect("v1 run");
    let listed = json(&run(&old, &["runs", "--json"]));
    assert_eq!(listed["runs"][0]["clock"], "icount", "{listed}");
}

#[test]
fn hvlab_db_in_the_environment_selects_postgres() {
    let Some(pg) = Cluster::start("hvlab_db_in_the_environment_selects_postgres") else {
        return;
    };
    let url = pg.database("env");
    let out = hvlab()
        .args([
            "run",
            "pinning",
            "--backend",
            "model",
            "--reps",
            "4",
            "--json",
        ])
        .env("HVLAB_DB", &url)
        .output()
        .expect("spawn hvlab");
    let id = json(&out)["run_id"].as_str().expect("id").to_string();
    assert!(
        common::stderr(&out).contains("stored run"),
        "{}",
        common::stderr(&out)
    );
    assert!(runs_by_id(&url).contains_key(&id));
    // The password never reaches the terminal, even in errors.
    let out = run(
        "postgres://hvlab:s3cret@127.0.0.1:1/none?connect_timeout=2",
        &["runs"],
    );
    assert_exit(
        &out,
        4,
        &["Cannot connect to the PostgreSQL store", "hvlab:***@"],
    );
    assert!(!common::stderr(&out).contains("s3cret"));
}

#[test]
fn a_run_killed_midway_through_its_transaction_leaves_nothing() {
    let Some(pg) = Cluster::start("a_run_killed_midway_through_its_transaction") else {
        return;
    };
    let url = pg.database("killed");
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("one.jsonl");
    let record = scenario_json("percpu", &[], &[], &["--backend", "model", "--reps", "4"]);
    std::fs::write(&file, format!("{record}\n")).expect("write");
    // Create the schema, then hold the samples table: the import writes its run row and
    // variants, then blocks on the samples, in the middle of its transaction.
    assert!(run(&url, &["runs"]).status.success());
    let mut blocker = pg.client(&url);
    let mut tx = blocker.transaction().expect("begin");
    tx.batch_execute("LOCK TABLE samples IN ACCESS EXCLUSIVE MODE")
        .expect("lock");
    let mut child = hvlab()
        .args(["import", file.to_str().expect("utf-8"), "--db", &url])
        .spawn()
        .expect("spawn hvlab import");
    let mut watcher = pg.client(&url);
    let waiting = || -> i64 {
        watcher
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE application_name = 'hvlab' AND wait_event_type = 'Lock'",
                &[],
            )
            .expect("pg_stat_activity")
            .get(0)
    };
    let mut waiting = waiting;
    let start = std::time::Instant::now();
    while waiting() == 0 {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "hvlab import never reached the samples"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().expect("kill hvlab");
    child.wait().expect("reap hvlab");
    tx.rollback().expect("release the lock");
    // The server notices the dead client once its statement can proceed, and rolls back.
    let mut check = pg.client(&url);
    let start = std::time::Instant::now();
    loop {
        let live: i64 = check
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'hvlab'",
                &[],
            )
            .expect("pg_stat_activity")
            .get(0);
        if live == 0 {
            break;
        }
        assert!(start.elapsed() < std::time::Duration::from_secs(60));
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for table in ["runs", "variants", "samples", "findings"] {
        let n: i64 = check
            .query_one(&format!("SELECT count(*) FROM {table}"), &[])
            .expect("count")
            .get(0);
        assert_eq!(n, 0, "{table} keeps rows of a killed run");
    }
    // Importing again afterwards stores it whole.
    let v = json(&run(
        &url,
        &["import", file.to_str().expect("utf-8"), "--json"],
    ));
    assert_eq!(v["tally"]["stored"], 1, "{v}");
}

#[test]
fn merges_running_at_once_into_a_new_postgres_store_store_each_run_once() {
    let Some(pg) = Cluster::start("merges_running_at_once") else {
        return;
    };
    let url = pg.database("racing");
    let dir = tempfile::tempdir().expect("temp dir");
    let files = shard_files(dir.path());
    // Four processes at once on an empty database: they race to migrate and to insert.
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (url, files) = (url.clone(), files.clone());
            std::thread::spawn(move || {
                hvlab()
                    .args(["merge", "--json", "--db", &url])
                    .args(&files)
                    .output()
                    .expect("spawn hvlab")
            })
        })
        .collect();
    let mut stored = 0;
    for h in handles {
        let (s, already, conflicts) = tally(&h.join().expect("thread"));
        assert_eq!(conflicts, 0);
        assert_eq!(s + already, 6);
        stored += s;
    }
    assert_eq!(stored, 6, "each run stored by exactly one of the merges");
    assert_eq!(runs_by_id(&url).len(), 6);
}

#[test]
fn three_suite_shards_merged_into_postgres_equal_one_unsharded_suite() {
    let Some(pg) = Cluster::start("three_suite_shards_merged_into_postgres") else {
        return;
    };
    let (sharded, whole) = (pg.database("sharded"), pg.database("whole"));
    let dir = tempfile::tempdir().expect("temp dir");
    let report = dir.path().join("report").display().to_string();
    let suite = |db: &str, shard: Option<&str>| {
        let mut args = vec![
            "suite",
            "--backend",
            "model",
            "--profile",
            "pvm-epyc",
            "--reps",
            "4",
            "--json",
            "--report",
            &report,
        ];
        if let Some(s) = shard {
            args.extend(["--shard", s]);
        }
        json(&run(db, &args));
    };
    // One after another, each into its own SQLite file, then merged.
    let mut files = Vec::new();
    for s in ["1/3", "2/3", "3/3"] {
        let file = dir.path().join(format!("shard-{}.db", &s[..1]));
        let file = file.display().to_string();
        suite(&file, Some(s));
        files.push(file);
    }
    let mut merge = vec!["merge", "--json"];
    merge.extend(files.iter().map(String::as_str));
    // Seven scenarios and seven showcases.
    assert_eq!(tally(&run(&sharded, &merge)), (14, 0, 0));
    suite(&whole, None);
    let (a, b) = (contents_by_unit(&sharded), contents_by_unit(&whole));
    assert_eq!(a.len(), 14);
    assert_eq!(a, b, "the same runs, ids and times aside");
}

#[test]
fn a_sharded_sweep_in_postgres_is_one_sweep_and_reports_from_there() {
    let Some(pg) = Cluster::start("a_sharded_sweep_in_postgres") else {
        return;
    };
    let url = pg.database("sweep");
    let mut ids = std::collections::BTreeSet::new();
    for s in ["1/2", "2/2"] {
        let out = json(&run(
            &url,
            &[
                "sweep",
                "lifecycle",
                "--backend",
                "model",
                "--profile",
                "pvm-epyc",
                "--grid",
                "vcpus=1,2,4",
                "--grid",
                "hz=100,1000",
                "--reps",
                "4",
                "--shard",
                s,
                "--json",
            ],
        ));
        ids.insert(out["sweep"]["id"].as_str().expect("id").to_string());
    }
    assert_eq!(ids.len(), 1, "both shards tag one sweep: {ids:?}");
    let id = ids.pop_first().expect("id");
    let dir = tempfile::tempdir().expect("temp dir");
    let out = run(
        &url,
        &[
            "report",
            "--sweep",
            &id,
            "-o",
            &dir.path().display().to_string(),
        ],
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    let md = std::fs::read_to_string(dir.path().join("summary.md")).expect("summary");
    // Six points, every variant of lifecycle at each.
    assert!(md.contains("6 points"), "{md}");
    assert_eq!(md.matches("| irqchip-first |").count(), 6, "{md}");
}

#[test]
fn a_select_only_postgres_role_is_refused_before_measuring_with_the_grant_to_give() {
    let Some(pg) = Cluster::start("a_select_only_postgres_role_is_refused_before_measuring") else {
        return;
    };
    let url = pg.database("selectonly");
    let out = run(
        &url,
        &["run", "pinning", "--backend", "model", "--reps", "4"],
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    pg.client(&url)
        .batch_execute(
            "CREATE ROLE reader LOGIN;
             GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader;",
        )
        .expect("a read-only role");
    let reader = url.replace("user=hvlab", "user=reader");
    let out = run(
        &reader,
        &[
            "run",
            "pinning",
            "--backend",
            "model",
            "--reps",
            "4",
            "--json",
        ],
    );
    assert_exit(
        &out,
        4,
        &[
            "cannot take a run",
            "reader may not insert into findings, runs, samples, variants",
            "GRANT INSERT",
        ],
    );
    assert!(
        out.stdout.is_empty(),
        "measured for a store that cannot take it"
    );
    // Reading is what that role may do, and it still works.
    let out = run(&reader, &["runs", "--json"]);
    assert_eq!(json(&out)["runs"].as_array().map(Vec::len), Some(1));
}

#[test]
fn postgres_errors_show_the_servers_message_not_db_error() {
    let Some(pg) = Cluster::start("postgres_errors_show_the_servers_message_not_db_error") else {
        return;
    };
    let url = pg.url("no_such_database");
    let out = run(&url, &["runs"]);
    assert_exit(&out, 4, &["database \"no_such_database\" does not exist"]);
    assert!(
        !common::stderr(&out).contains("db error"),
        "{}",
        common::stderr(&out)
    );
}

#[test]
fn a_postgres_password_with_a_slash_a_question_mark_or_an_encoded_key_is_never_printed() {
    let Some(pg) = Cluster::start("a_postgres_password_with_a_slash_is_never_printed") else {
        return;
    };
    pg.database("secrets");
    let sock = pg.socket_dir().display().to_string();
    // Trust authentication ignores the password: every URL reaches the store.
    for url in [
        format!("postgres://hvlab:pa/ss@/secrets?host={sock}"),
        format!("postgres:///secrets?host={sock}&user=hvlab&password=pa/ss?wo"),
        format!("postgres:///secrets?host={sock}&user=hvlab&passwor%64=pa55wo"),
    ] {
        let out = run(
            &url,
            &["run", "pinning", "--backend", "model", "--reps", "4"],
        );
        let err = common::stderr(&out);
        assert!(out.status.success(), "{err}");
        assert!(err.contains("stored run"), "{err}");
        assert!(
            !err.contains("pa/ss") && !err.contains("pa55"),
            "{url}: {err}"
        );
        // And in an error, on a server that is not there.
        let unreachable = url.replace(&sock, "/nonexistent");
        let out = run(&unreachable, &["runs"]);
        let err = common::stderr(&out);
        assert_eq!(out.status.code(), Some(4), "{err}");
        assert!(
            !err.contains("pa/ss") && !err.contains("pa55"),
            "{url}: {err}"
        );
    }
}

/// The recovery file the error names.
fn recovery_path(err: &str) -> PathBuf {
    let rest = err
        .split("the run is kept in ")
        .nth(1)
        .unwrap_or_else(|| panic!("no recovery file named in: {err}"));
    PathBuf::from(rest.split(": `hvlab import").next().expect("a path"))
}

#[test]
fn a_postgres_lock_held_past_the_statement_timeout_keeps_the_run_for_import() {
    let Some(pg) = Cluster::start("a_postgres_lock_held_past_the_statement_timeout") else {
        return;
    };
    let url = pg.database("locked");
    let out = run(&url, &["runs"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let mut holder = pg.client(&url);
    let mut tx = holder.transaction().expect("transaction");
    tx.batch_execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        .expect("lock");
    let data = tempfile::tempdir().expect("tempdir");
    let start = std::time::Instant::now();
    let out = hvlab()
        .args([
            "run",
            "pinning",
            "--backend",
            "model",
            "--reps",
            "4",
            "--json",
        ])
        .arg("--db")
        .arg(&url)
        .env("HVLAB_PG_TIMEOUT", "2")
        .env("XDG_DATA_HOME", data.path())
        .output()
        .expect("spawn");
    let waited = start.elapsed();
    tx.rollback().expect("unlock");
    let err = common::stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("statement timeout"), "{err}");
    assert!(waited < std::time::Duration::from_secs(60), "{waited:?}");
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the record");
    let kept = recovery_path(&err);
    // Once the lock is gone, the recovery file stores the run where it was meant to go.
    let out = run(&url, &["import", kept.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let id = printed["run_id"].as_str().expect("run_id");
    assert_eq!(runs_by_id(&url).get(id), Some(&printed));
}

#[test]
fn a_postgres_backend_stopped_mid_statement_ends_in_an_error_naming_the_server() {
    let Some(pg) = Cluster::start("a_postgres_backend_stopped_mid_statement") else {
        return;
    };
    let url = pg.database("stopped");
    let out = run(&url, &["runs"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let mut holder = pg.client(&url);
    let mut tx = holder.transaction().expect("transaction");
    tx.batch_execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        .expect("lock");
    let data = tempfile::tempdir().expect("tempdir");
    let mut child = hvlab()
        .args(["run", "pinning", "--backend", "model", "--reps", "4"])
        .arg("--db")
        .arg(&url)
        .env("HVLAB_PG_TIMEOUT", "3")
        .env("XDG_DATA_HOME", data.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    // hvlab's backend waits for the lock: stop it there, so the server cannot end the
    // statement itself; only hvlab's own deadline can.
    let mut watcher = pg.client(&url);
    let mut backend = None;
    for _ in 0..200 {
        let rows = watcher
            .query(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'hvlab'
                 AND wait_event_type = 'Lock'",
                &[],
            )
            .expect("activity");
        if let Some(r) = rows.first() {
            backend = Some(r.get::<_, i32>(0));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let backend = backend.expect("hvlab's backend waiting on the lock");
    // SAFETY: kill(2) on a pid just read from the server; no memory is involved.
    unsafe { libc::kill(backend, libc::SIGSTOP) };
    let start = std::time::Instant::now();
    let mut status = None;
    while start.elapsed() < std::time::Duration::from_secs(60) {
        if let Some(s) = child.try_wait().expect("wait") {
            status = Some(s);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // SAFETY: as above.
    unsafe { libc::kill(backend, libc::SIGCONT) };
    if status.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().expect("output");
    tx.rollback().expect("unlock");
    let err = common::stderr(&out);
    assert!(
        status.is_some(),
        "hvlab still waits on a stopped backend after 60 s"
    );
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("did not answer"), "{err}");
    assert!(err.contains(".s.PGSQL.5432"), "{err}");
    assert!(err.contains("the run is kept in"), "{err}");
}
