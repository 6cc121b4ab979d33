//! Runs on two clocks: the wall clock, and QEMU's instruction clock of a kernel under test
//! (`hvlab vm`'s default under TCG). Stored runs of Debian 7.3 (tests/fixtures/icount-7.3) keep
//! their clock through the store, show their times as instructions, and are never compared
//! with the other clock's.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::common;

use std::path::PathBuf;

use common::{assert_exit, db, json, run, stderr};
use serde_json::Value;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/icount-7.3/runs.jsonl")
}

/// The fixture's runs: (id, clock), in file order.
fn fixture_runs() -> Vec<(String, String)> {
    std::fs::read_to_string(fixture())
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            let clock = v["host"]["clock"].as_str().unwrap_or("wall").to_string();
            (v["run_id"].as_str().unwrap().to_string(), clock)
        })
        .collect()
}

/// A store with the fixture's runs imported.
fn imported() -> (tempfile::TempDir, PathBuf) {
    let (d, db) = db();
    let out = run(&db, &["import", fixture().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    (d, db)
}

fn by_clock(clock: &str) -> Vec<String> {
    fixture_runs()
        .into_iter()
        .filter(|(_, c)| c == clock)
        .map(|(id, _)| id)
        .collect()
}

#[test]
fn stored_runs_keep_their_clock_and_list_it() {
    let (_d, db) = imported();
    let listed = json(&run(&db, &["runs", "--json"]));
    let clocks: Vec<(String, String)> = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["run_id"].as_str().unwrap().to_string(),
                r["clock"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    for (id, clock) in fixture_runs() {
        assert!(
            clocks.contains(&(id.clone(), clock.clone())),
            "{id} {clock}: {listed}"
        );
    }
    assert_eq!(by_clock("icount").len(), 2);
    assert_eq!(by_clock("wall").len(), 1);
    // The fleet view keeps the two clocks as two hosts.
    let text = String::from_utf8(run(&db, &["runs"]).stdout).unwrap();
    assert!(text.contains("· instruction clock"), "{text}");
    // And an export carries them unchanged.
    let csv = String::from_utf8(run(&db, &["export", "--format", "csv"]).stdout).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let at = header.iter().position(|h| *h == "clock").unwrap();
    let unit = header.iter().position(|h| *h == "unit").unwrap();
    let metric = header.iter().position(|h| *h == "metric").unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    for (id, clock) in fixture_runs() {
        let row = rows
            .iter()
            .find(|r| r[0] == id && r[metric] == "ready_ms")
            .unwrap();
        assert_eq!(row[at], clock, "{id}");
        // A time on the instruction clock is millions of instructions, never milliseconds.
        assert_eq!(
            row[unit],
            if clock == "icount" { "Minsn" } else { "ms" },
            "{id}"
        );
    }
}

#[test]
fn times_on_the_instruction_clock_read_as_instructions() {
    let (_d, db) = imported();
    let icount = &by_clock("icount")[0];
    let shown = String::from_utf8(run(&db, &["show", icount]).stdout).unwrap();
    assert!(shown.contains("instruction clock"), "{shown}");
    assert!(
        shown.contains(" insn ") && shown.contains("Minsn"),
        "{shown}"
    );
    // Neither a metric line nor a finding or a verdict says milliseconds or nanoseconds.
    for line in shown.lines() {
        let line = line.trim_start();
        if line.starts_with("noise:") {
            continue;
        }
        for wall in [" ms ", " ms)", " ms,", " ns ", " µs "] {
            assert!(!line.contains(wall), "`{wall}` in: {line}");
        }
    }
    assert!(shown.contains("virtual jiffies"), "{shown}");
    let record = json(&run(&db, &["show", icount, "--json"]));
    assert_eq!(record["host"]["clock"], "icount");
    let ready = &record["variants"][0]["metrics"]["ready_ms"];
    assert_eq!(ready["unit"], "Minsn", "{ready}");
    // The wall-clock run of the same kernel says milliseconds, as before.
    let wall = &by_clock("wall")[0];
    let record = json(&run(&db, &["show", wall, "--json"]));
    assert!(record["host"].get("clock").is_none(), "{}", record["host"]);
    assert_eq!(record["variants"][0]["metrics"]["ready_ms"]["unit"], "ms");
}

#[test]
fn runs_of_two_clocks_are_never_compared() {
    let (_d, db) = imported();
    let (icount, wall) = (&by_clock("icount")[0], &by_clock("wall")[0]);
    for (a, b) in [(icount, wall), (wall, icount)] {
        let out = run(&db, &["compare", a, b]);
        assert_exit(
            &out,
            2,
            &[
                a.as_str(),
                b.as_str(),
                "QEMU's instruction clock",
                "the wall clock",
                "never compare",
            ],
        );
    }
    // Several runs on one side do not hide one of the other clock.
    let side = format!("{},{}", by_clock("icount")[1], wall);
    assert_exit(
        &run(&db, &["compare", icount, &side]),
        2,
        &["never compare"],
    );
    // Selectors that pick both clocks are refused too; naming one clock compares.
    assert_exit(
        &run(&db, &["compare", "kernel=7.3", "kernel=7.3"]),
        2,
        &["never compare"],
    );
    // Two boots of one kernel on the instruction clock compare, variant by variant.
    let out = run(
        &db,
        &[
            "compare",
            &format!("{icount}:irqchip-first"),
            &format!("{}:irqchip-first", by_clock("icount")[1]),
        ],
    );
    assert!(matches!(out.status.code(), Some(0 | 1)), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("instructions"), "{text}");
}

#[test]
fn a_report_keeps_the_clocks_in_rows_of_their_own() {
    let (d, db) = imported();
    let dir = d.path().join("report");
    let ids: Vec<String> = fixture_runs().into_iter().map(|(id, _)| id).collect();
    let mut args = vec!["report", "-o", dir.to_str().unwrap()];
    args.extend(ids.iter().map(String::as_str));
    let out = run(&db, &args);
    assert!(out.status.success(), "{}", stderr(&out));
    let summary = std::fs::read_to_string(dir.join("summary.md")).unwrap();
    // One row per clock (Markdown escapes the parentheses): the two boots on the instruction
    // clock in one, the wall-clock run in another.
    let rows: Vec<&str> = summary
        .lines()
        .filter(|l| l.starts_with("| lifecycle | kvm |"))
        .collect();
    assert_eq!(rows.len(), 2, "{summary}");
    assert!(
        rows.iter().any(|r| r.contains("(tcg, instruction clock"))
            && rows.iter().any(|r| r.contains("(tcg\\)")),
        "{summary}"
    );
    let on_icount = rows
        .iter()
        .find(|r| r.contains("instruction clock"))
        .unwrap();
    assert!(on_icount.contains("M instructions"), "{on_icount}");
}

/// The model on the instruction-clock profile gives guest instructions, labelled as such and
/// said to be modelled; such a run is never compared with a wall-clock one, the model's
/// on a wall-clock profile included.
#[test]
fn a_model_run_on_the_instruction_clock_profile_is_in_instructions_and_never_beside_wall() {
    let (_d, db) = db();
    let model = |profile: &str| {
        let out = run(
            &db,
            &[
                "run",
                "exits",
                "--backend",
                "model",
                "--profile",
                profile,
                "--reps",
                "3",
                "--variant",
                "pio-out",
                "--json",
            ],
        );
        json(&out)
    };
    let icount = model("tcg-icount-epyc");
    assert_eq!(icount["host"]["clock"], "icount", "{}", icount["host"]);
    let roundtrip = &icount["variants"][0]["metrics"]["roundtrip_ns"];
    assert_eq!(roundtrip["unit"], "insn", "{roundtrip}");
    let wall = model("intel-spr-vmx");
    assert!(wall["host"].get("clock").is_none(), "{}", wall["host"]);
    assert_eq!(wall["variants"][0]["metrics"]["roundtrip_ns"]["unit"], "ns");

    let (a, b) = (
        icount["run_id"].as_str().unwrap(),
        wall["run_id"].as_str().unwrap(),
    );
    let shown = String::from_utf8(run(&db, &["show", a]).stdout).unwrap();
    assert!(shown.contains("modelled, not measured"), "{shown}");
    assert!(!shown.contains("measured on"), "{shown}");
    assert!(shown.contains(" insn "), "{shown}");
    let listed = json(&run(&db, &["runs", "--json"]));
    let clock_of = |id: &str| {
        listed["runs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["run_id"] == id)
            .map(|r| r["clock"].clone())
            .unwrap()
    };
    assert_eq!(clock_of(a), "icount");
    assert_eq!(clock_of(b), "wall");
    assert_exit(
        &run(&db, &["compare", a, b]),
        2,
        &[
            a,
            b,
            "QEMU's instruction clock",
            "the wall clock",
            "never compare",
        ],
    );
}
