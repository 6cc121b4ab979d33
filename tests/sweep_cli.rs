//! `hvlab sweep` through the built binary: points validated up front, stored as ordinary runs
//! tagged with the sweep, the same results with any thread count, and the sweep report.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::common;

use std::path::Path;

use common::{assert_exit, json, run};
use serde_json::Value;

const BASE: [&str; 10] = [
    "sweep",
    "lifecycle",
    "--backend",
    "model",
    "--profile",
    "pvm-epyc",
    "--reps",
    "5",
    "--warmup",
    "0",
];

fn sweep(db: &Path, extra: &[&str]) -> Value {
    let mut args = BASE.to_vec();
    args.extend(extra);
    args.push("--json");
    json(&run(db, &args))
}

fn stored(db: &Path, out: &Value) -> Vec<Value> {
    out["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| json(&run(db, &["show", id.as_str().unwrap(), "--json"])))
        .collect()
}

#[test]
fn bad_grids_exit_2_before_anything_is_stored() {
    let (_dir, db) = common::db();
    for (extra, needles) in [
        (&["--grid", "cores=1,2"][..], &["cores", "vcpus"][..]),
        (
            &["--grid", "vcpus=1,100000"][..],
            &["vcpus=100000", "choose vcpus <="][..],
        ),
        (
            &["--grid", "vcpus=1,,2"][..],
            &["--grid", "empty value"][..],
        ),
        (&["--grid", "vcpus"][..], &["--grid", "key=v1,v2"][..]),
        (
            &["--grid", "vcpus=1,2", "--set", "vcpus=3"][..],
            &["also a --grid axis"][..],
        ),
        (
            &["--grid", "variant=irqchip-first,bogus"][..],
            &["bogus"][..],
        ),
        (&["--grid", "hz=100,fast"][..], &["hz=fast"][..]),
        (
            &["--grid", "vcpus=1,2", "--shard", "1/x"][..],
            &["--shard"][..],
        ),
    ] {
        let mut args = BASE.to_vec();
        args.extend(extra);
        assert_exit(&run(&db, &args), 2, needles);
    }
    // A model parameter on kvm is refused before /dev/kvm is touched.
    let out = run(&db, &["sweep", "lifecycle", "--grid", "hz=100,250"]);
    assert_exit(&out, 2, &["model parameter"]);
    let out = run(&db, &["sweep", "lifecycle", "--backend", "model"]);
    assert_exit(&out, 2, &["--grid"]);
    let listing = json(&run(&db, &["runs", "--json"]));
    assert!(listing["runs"].as_array().unwrap().is_empty());
}

#[test]
fn points_are_ordinary_runs_tagged_with_the_sweep() {
    let (_dir, db) = common::db();
    let out = sweep(
        &db,
        &[
            "--grid",
            "hz=100,1000",
            "--grid",
            "devices=0,8",
            "--variant",
            "irqchip-first",
            "--variant",
            "memslots-first",
        ],
    );
    let id = out["sweep"]["id"].as_str().unwrap().to_string();
    assert_eq!(out["sweep"]["points"], 4);
    assert_eq!(out["sweep"]["ran"], 4);
    let runs = stored(&db, &out);
    for (i, r) in runs.iter().enumerate() {
        assert_eq!(r["params"]["sweep"], id.as_str());
        assert_eq!(r["params"]["sweep_grid"], "hz,devices");
        assert_eq!(r["params"]["sweep_point"], i);
        assert_eq!(r["variants"].as_array().unwrap().len(), 2);
        // Each point keeps its variants' verdict.
        assert!(!r["verdicts"].as_array().unwrap().is_empty(), "{r}");
    }
    assert_eq!(runs[0]["params"]["hz"], 100);
    assert_eq!(runs[3]["params"]["hz"], 1000);
    assert_eq!(runs[3]["params"]["devices"], 8);
    // The stall lasts a jiffy or two: ten times longer at HZ=100 than at HZ=1000.
    let stall = |r: &Value| {
        r["variants"][0]["metrics"]["ready_ms"]["median"]
            .as_f64()
            .unwrap()
    };
    assert!(
        stall(&runs[0]) > 4.0 * stall(&runs[2]),
        "{} vs {}",
        stall(&runs[0]),
        stall(&runs[2])
    );
    // compare works across two points of the sweep.
    let (a, b) = (
        runs[2]["run_id"].as_str().unwrap(),
        runs[0]["run_id"].as_str().unwrap(),
    );
    let cmp = json(&run(
        &db,
        &[
            "compare",
            &format!("{a}:irqchip-first"),
            &format!("{b}:irqchip-first"),
            "--json",
        ],
    ));
    assert_eq!(cmp["regression"], true, "{cmp}");
}

#[test]
fn the_thread_count_does_not_change_a_point() {
    let (_dir, db) = common::db();
    let grid = ["--grid", "vcpus=1,2,4,8,16", "--variant", "irqchip-first"];
    let content = |jobs: &str| -> Vec<Value> {
        let mut extra = grid.to_vec();
        extra.extend(["--jobs", jobs]);
        let out = sweep(&db, &extra);
        stored(&db, &out)
            .into_iter()
            .map(|r| serde_json::json!([r["params"], r["variants"]]))
            .collect()
    };
    let one = content("1");
    assert_eq!(one.len(), 5);
    assert_eq!(one, content("3"));
}

#[test]
fn the_sweep_report_draws_a_heatmap_and_a_table() {
    let (dir, db) = common::db();
    let out = sweep(
        &db,
        &[
            "--grid",
            "vcpus=1,4",
            "--grid",
            "devices=0,8,64",
            "--variant",
            "memslots-first",
        ],
    );
    let id = out["sweep"]["id"].as_str().unwrap();
    let report = dir.path().join("report");
    let text = run(
        &db,
        &["report", "--sweep", id, "-o", report.to_str().unwrap()],
    );
    assert!(text.status.success(), "{}", common::stderr(&text));
    let html = std::fs::read_to_string(report.join("index.html")).unwrap();
    assert_eq!(
        html.matches("<svg").count(),
        2,
        "one heatmap for one variant, and the page's colour bar"
    );
    assert!(html.contains("ready_ms median, memslots-first"));
    // Six cells, six table rows.
    assert_eq!(html.matches("<td>memslots-first</td>").count(), 6);
    assert!(!html.contains("<script"), "self-contained, no scripts");
    let md = std::fs::read_to_string(report.join("summary.md")).unwrap();
    assert_eq!(md.matches("| memslots-first |").count(), 6);
    let out = run(
        &db,
        &[
            "report",
            "--sweep",
            "sw-000000000000",
            "-o",
            report.to_str().unwrap(),
        ],
    );
    assert_exit(&out, 2, &["sw-000000000000", "hvlab merge"]);
}

/// A tmpfs of `size` mounted on `dir`, unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(test: &str, dir: &Path, size: &str) -> Option<Tmpfs> {
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(dir.to_path_buf())),
            Ok(o) => {
                common::loud_skip(&format!(
                    "{test}: cannot mount a small tmpfs (needs root): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
                None
            }
            Err(e) => {
                common::loud_skip(&format!("{test}: no mount(8): {e}"));
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// `--grid key=FROM,...,TO` for integers.
fn axis(key: &str, from: u32, to: u32) -> String {
    let values: Vec<String> = (from..=to).map(|v| v.to_string()).collect();
    format!("{key}={}", values.join(","))
}

/// Bytes of an SQLite store on disk (its write-ahead log too, should one be left).
fn on_disk(db: &Path) -> u64 {
    let wal = db.with_extension("db-wal");
    std::fs::metadata(db).map_or(0, |m| m.len()) + std::fs::metadata(wal).map_or(0, |m| m.len())
}

#[test]
fn a_million_point_sweep_is_refused_above_the_stores_free_space_naming_both_sizes() {
    let test = "a_million_point_sweep_is_refused_above_the_stores_free_space";
    let dir = tempfile::tempdir().unwrap();
    let Some(_fs) = Tmpfs::mount(test, dir.path(), "16m") else {
        return;
    };
    let db = dir.path().join("hvlab.db");
    // 100 × 100 × 100 points.
    let (a, b, c) = (
        axis("devices", 0, 99),
        axis("boot_ms", 0, 99),
        axis("mem_mib", 1, 100),
    );
    let mut args = BASE.to_vec();
    args.extend(["--grid", &a, "--grid", &b, "--grid", &c]);
    let out = run(&db, &args);
    assert_exit(
        &out,
        2,
        &[
            "--grid",
            "1,000,000 points",
            "would take about",
            "GiB in the store",
            "per point of",
            "measured by storing points 1 and 1,000,000",
            "but its filesystem has",
            "MiB free",
            "--no-store",
        ],
    );
    // Refused before anything was written where the store would be.
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "the refused sweep left files in the store's directory"
    );
}

#[test]
fn the_store_estimate_is_what_the_sweep_then_stores() {
    let (_dir, db) = common::db();
    // A first sweep makes the store; the second's growth is compared with its estimate.
    let first = sweep(&db, &["--grid", "vcpus=1,2"]);
    assert_eq!(first["sweep"]["ran"], 2);
    let before = on_disk(&db);
    let out = sweep(&db, &["--grid", &axis("devices", 0, 23)]);
    assert_eq!(out["sweep"]["ran"], 24);
    let cost = &out["store_cost"];
    assert_eq!(cost["points"], 24, "{cost}");
    let [lo, hi] = [0, 1].map(|i| cost["bytes"][i].as_u64().unwrap());
    let grew = on_disk(&db) - before;
    // Within a fifth of the estimate: the scratch store counts the same rows, indexes and
    // JSON; the rest is page granularity and b-tree interior pages.
    #[allow(clippy::cast_precision_loss)]
    let (grew_f, lo_f, hi_f) = (grew as f64, lo as f64, hi as f64);
    assert!(
        grew_f >= 0.8 * lo_f && grew_f <= 1.2 * hi_f,
        "the store grew by {grew} bytes; the estimate was {lo}–{hi}: {cost}"
    );
    // Samples per point as stored: every variant's metrics × 5 reps.
    let stored_runs = stored(&db, &out);
    let samples: u64 = stored_runs[0]["variants"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|v| v["metrics"].as_object().unwrap().values())
        .map(|m| m["samples"].as_array().unwrap().len() as u64)
        .sum();
    assert_eq!(cost["samples"][0].as_u64().unwrap(), samples, "{cost}");
}

#[test]
fn with_no_store_a_sweep_too_big_for_the_store_runs_and_prints_every_point() {
    let test = "with_no_store_a_sweep_too_big_for_the_store_runs";
    let dir = tempfile::tempdir().unwrap();
    let Some(_fs) = Tmpfs::mount(test, dir.path(), "1m") else {
        return;
    };
    let db = dir.path().join("hvlab.db");
    // About 2.2–2.5 MiB on this machine (20 points of 112–129 KiB): twice the 1 MiB there.
    let grid = axis("devices", 0, 19);
    let mut args = BASE.to_vec();
    args.extend(["--grid", &grid]);
    assert_exit(
        &run(&db, &args),
        2,
        &["20 points", "MiB free", "--no-store"],
    );
    args.push("--no-store");
    let out = run(&db, &args);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.matches("lifecycle on model (profile").count(),
        20,
        "one account per point: {text}"
    );
    assert!(text.contains("not stored: --no-store"), "{text}");
    args.push("--json");
    let doc = json(&run(&db, &args));
    assert_eq!(doc["records"].as_array().unwrap().len(), 20);
    assert!(doc["store_cost"].is_null(), "{}", doc["store_cost"]);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
