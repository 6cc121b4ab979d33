//! Which runs a command shows: the user's by default, internal runs (validate, the suite's
//! showcases) with `--all`, a suite whole, a model run's host as the modelled one, and the
//! filters of `hvlab runs`. Model backend only: no /dev/kvm needed.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::common;

use common::{assert_exit, db, json, run};

/// A stored run's record with its id changed and the tag set, as `hvlab validate` stores one.
fn as_validate_run(record: &serde_json::Value, id: &str) -> String {
    let mut r = record.clone();
    r["run_id"] = id.into();
    r["started_at"] = "2099-01-01T00:00:00Z".into();
    r["tag"] = "validate".into();
    r.as_object_mut().unwrap().remove("baseline");
    // Validate runs belong to no suite.
    let params = r["params"].as_object_mut().unwrap();
    params.remove("suite");
    params.remove("suite_unit");
    serde_json::to_string(&r).unwrap()
}

/// Exited with `code` (stderr checked as [`assert_exit`] does) and stdout names every needle.
fn assert_stdout(out: &std::process::Output, code: i32, needles: &[&str]) {
    assert_exit(out, code, &[]);
    let text = String::from_utf8_lossy(&out.stdout);
    for n in needles {
        assert!(text.contains(n), "stdout lacks `{n}`: {text}");
    }
}

fn ids(listing: &serde_json::Value) -> Vec<String> {
    listing["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_default_report_is_the_newest_suite_whole_and_internal_runs_stay_out() {
    let (dir, db) = db();
    let report = dir.path().join("suite-report");
    let out = run(
        &db,
        &[
            "suite",
            "--backend",
            "model",
            "--reps",
            "4",
            "--warmup",
            "0",
            "--json",
            "--report",
            report.to_str().unwrap(),
        ],
    );
    assert_exit(&out, 0, &[]);
    let suite = json(&out);
    let suite_id = suite["suite"].as_str().unwrap().to_string();
    let suite_runs = suite["runs"].as_array().unwrap();
    let showcases = suite_runs.iter().filter(|r| r["tag"] == "showcase").count();
    assert!(showcases >= 1, "the model suite has showcases");
    assert!(
        suite_runs
            .iter()
            .all(|r| r["params"]["suite"] == suite_id.as_str())
    );

    // A validate run, newer than the suite, as validate tags it.
    let validate_id = "2099-01-01T00:00:00Z-lifecycle-model-feed";
    let validate = as_validate_run(&suite_runs[0], validate_id);
    let file = dir.path().join("validate.jsonl");
    std::fs::write(&file, format!("{validate}\n")).unwrap();
    assert_exit(&run(&db, &["import", file.to_str().unwrap()]), 0, &[]);

    // runs: the user's only; --all shows the validate run and the showcases too.
    let mine = json(&run(&db, &["runs", "--json", "--limit", "1000"]));
    assert_eq!(ids(&mine).len(), suite_runs.len() - showcases);
    assert!(!ids(&mine).iter().any(|id| id == validate_id));
    let all = json(&run(&db, &["runs", "--all", "--json", "--limit", "1000"]));
    assert_eq!(ids(&all).len(), suite_runs.len() + 1);

    // report: the whole suite (showcases included: they are its units), not the validate run.
    let out = run(
        &db,
        &["report", "-o", dir.path().join("r").to_str().unwrap()],
    );
    assert_stdout(&out, 0, &[&format!("report of {} runs", suite_runs.len())]);
    assert!(
        common::stderr(&out).contains(&suite_id),
        "{}",
        common::stderr(&out)
    );
    let index = std::fs::read_to_string(dir.path().join("r/index.html")).unwrap();
    assert!(
        !index.contains(validate_id),
        "the validate run is not in the report"
    );
    let fleet = std::fs::read_to_string(dir.path().join("r/fleet.html")).unwrap();
    assert!(
        fleet.contains("0 real hosts"),
        "model runs are no real host"
    );

    // report --suite: the same suite by id; an unknown id names the stored ones.
    let out = run(
        &db,
        &[
            "report",
            "--suite",
            &suite_id,
            "-o",
            dir.path().join("s").to_str().unwrap(),
        ],
    );
    assert_stdout(&out, 0, &[&format!("report of {} runs", suite_runs.len())]);
    let out = run(
        &db,
        &[
            "report",
            "--suite",
            "su-nope",
            "-o",
            dir.path().join("n").to_str().unwrap(),
        ],
    );
    assert_exit(&out, 2, &["su-nope", &suite_id]);
}

#[test]
fn a_model_run_stores_the_modelled_host_and_its_hz_after_set() {
    let (_dir, db) = db();
    let out = run(
        &db,
        &[
            "run",
            "lifecycle",
            "--backend",
            "model",
            "--set",
            "hz=1000",
            "--reps",
            "4",
            "--warmup",
            "0",
            "--json",
        ],
    );
    assert_exit(&out, 0, &[]);
    let record = json(&out);
    assert_eq!(record["host"]["hz"], 1000);
    let listed = json(&run(&db, &["runs", "--json"]));
    assert_eq!(listed["runs"][0]["hz"], 1000);
    let host = &listed["hosts"][0]["host"];
    assert_eq!(host["hz"], 1000);
    assert_eq!(
        host["profile"], record["profile"],
        "a model run's host is its profile"
    );
}

#[test]
fn runs_filters_pick_by_scenario_backend_host_sweep_and_time() {
    let (_dir, db) = db();
    let mut profile = String::new();
    for scenario in ["lifecycle", "percpu"] {
        let out = run(
            &db,
            &[
                "run",
                scenario,
                "--backend",
                "model",
                "--reps",
                "4",
                "--warmup",
                "0",
                "--json",
            ],
        );
        assert_exit(&out, 0, &[]);
        profile = json(&out)["profile"].as_str().unwrap().to_string();
    }
    let out = run(
        &db,
        &[
            "sweep",
            "lifecycle",
            "--backend",
            "model",
            "--grid",
            "hz=100,250,1000",
            "--reps",
            "4",
            "--warmup",
            "0",
            "--json",
        ],
    );
    assert_exit(&out, 0, &[]);
    let sweep_id = json(&out)["sweep"]["id"].as_str().unwrap().to_string();
    let count = |args: &[&str]| {
        let mut a = vec!["runs", "--json", "--limit", "100"];
        a.extend_from_slice(args);
        ids(&json(&run(&db, &a))).len()
    };
    assert_eq!(count(&[]), 5);
    assert_eq!(count(&["--scenario", "percpu"]), 1);
    assert_eq!(count(&["--backend", "kvm"]), 0);
    assert_eq!(count(&["--sweep", &sweep_id]), 3);
    assert_eq!(count(&["--host", "no-such-host"]), 0);
    // A model run's host is its profile, not the machine that computed it.
    assert_eq!(count(&["--host", &profile]), 5);
    assert_eq!(count(&["--host", "linux"]), 0);
    assert_eq!(count(&["--since", "1h"]), 5);
    assert_eq!(count(&["--since", "2099-01-01"]), 0);
    // The table shows each point's axis value.
    let out = run(&db, &["runs", "--sweep", &sweep_id, "--color", "never"]);
    assert_stdout(&out, 0, &["hz=100", "hz=250", "hz=1000", &sweep_id]);
    // sweeps lists it with its points.
    let out = run(&db, &["sweeps", "--json"]);
    let sweeps = json(&out);
    assert_eq!(sweeps["sweeps"][0]["id"], sweep_id.as_str());
    assert_eq!(sweeps["sweeps"][0]["runs"], 3);
}

#[test]
fn a_finished_sweep_prints_its_table_of_axis_values_and_headline() {
    let (_dir, db) = db();
    let out = run(
        &db,
        &[
            "sweep",
            "lifecycle",
            "--backend",
            "model",
            "--grid",
            "hz=100,1000",
            "--variant",
            "irqchip-first",
            "--reps",
            "4",
            "--warmup",
            "0",
            "--color",
            "never",
        ],
    );
    assert_stdout(&out, 0, &["ready_ms (median, 95% CI)"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("irqchip-first"))
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    assert!(rows.iter().all(|r| r.contains(" ms [")), "{text}");
    // In grid order.
    assert!(rows[0].trim_start().starts_with("100 "), "{text}");
    assert!(rows[1].trim_start().starts_with("1000 "), "{text}");
}

#[test]
fn bad_since_and_unknown_sweep_are_bad_input_naming_the_value() {
    let (dir, db) = db();
    let out = run(&db, &["runs", "--since", "last tuesday"]);
    assert_exit(&out, 2, &["last tuesday", "--since", "2h"]);
    let out = run(
        &db,
        &[
            "report",
            "--sweep",
            "sw-nope",
            "-o",
            dir.path().join("r").to_str().unwrap(),
        ],
    );
    assert_exit(&out, 2, &["sw-nope", "hvlab sweeps"]);
}

#[test]
fn named_baselines_compare_later_runs_and_an_unknown_name_lists_the_saved_ones() {
    let (_dir, db) = db();
    let args = [
        "run",
        "lifecycle",
        "--backend",
        "model",
        "--variant",
        "irqchip-first",
        "--reps",
        "6",
        "--warmup",
        "0",
        "--json",
    ];
    let mut save = args.to_vec();
    save.extend(["--save-baseline", "main"]);
    let base = json(&run(&db, &save));
    assert_eq!(base["baseline"], "main");
    let later = json(&run(&db, &args));
    let out = run(&db, &["compare", "--baseline", "main", "--json"]);
    assert_exit(&out, 0, &[]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(text.contains("irqchip-first"), "{text}");
    let out = run(&db, &["compare", "--baseline", "main", "--color", "never"]);
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains(&format!("A = {}", base["run_id"].as_str().unwrap()))
            && text.contains(&format!("B = {}", later["run_id"].as_str().unwrap())),
        "{text}"
    );
    let out = run(&db, &["compare", "--baseline", "nope"]);
    assert_exit(&out, 2, &["nope", "main (lifecycle on model)"]);
    let out = run(
        &db,
        &[
            "run",
            "lifecycle",
            "--backend",
            "model",
            "--save-baseline",
            "bad name",
        ],
    );
    assert_exit(&out, 2, &["bad name"]);
}
