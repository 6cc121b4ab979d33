//! `hvlab sweep` through the built binary: points validated up front, stored as ordinary runs
//! tagged with the sweep, the same results with any thread count, and the sweep report.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod common;

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
        (&["--grid", "vcpus=1,65"][..], &["vcpus=65", "1 to 64"][..]),
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
        1,
        "one heatmap for one variant"
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
