//! Noise on the command line: every kvm run records it, a run under CPU hogs warns that the
//! host is busy, and the interference options refuse bad input naming the valid range.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::common;

use std::process::{Child, Command, Stdio};

use common::{assert_exit, json, kvm_or_skip, run};

/// Busy loops, one per online CPU, stopped (killed and reaped) when dropped, whatever the test
/// does: a failed assertion unwinds through the drop.
struct Hogs(Vec<Child>);

impl Hogs {
    fn start() -> Hogs {
        let cpus = std::thread::available_parallelism().map_or(1, usize::from);
        Hogs(
            (0..cpus)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdin(Stdio::null())
                        .spawn()
                        .expect("spawn a busy loop")
                })
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn a_run_under_cpu_hogs_records_its_noise_and_warns_that_the_host_is_busy() {
    let Some(_kvm) = kvm_or_skip("busy_host_warning") else {
        return;
    };
    let (_dir, db) = common::db();
    let hogs = Hogs::start();
    // Let the hogs reach the run queue before the run starts.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let out = run(
        &db,
        &[
            "run",
            "exits",
            "--variant",
            "cpuid",
            "--variant",
            "hypercall",
            "--reps",
            "4",
            "--warmup",
            "0",
            "--set",
            "iterations=2000",
            "--json",
        ],
    );
    drop(hogs);
    assert_exit(&out, 0, &[]);
    let r = json(&out);
    let noise = &r["noise"];
    for field in [
        "cores",
        "load1",
        "runnable_others",
        "cpu_pressure_some_pct",
        "steal_pct",
        "involuntary_switches",
        "migrations",
        "clocksource",
        "clocksource_stable",
        "busy",
    ] {
        assert!(noise.get(field).is_some(), "noise lacks {field}: {noise}");
    }
    assert_eq!(noise["involuntary_per_rep"].as_array().unwrap().len(), 2);
    assert!(!noise["busy"].as_array().unwrap().is_empty(), "{noise}");
    let warnings = r["warnings"].as_array().unwrap();
    let busy = warnings
        .iter()
        .find(|w| w["kind"] == "busy-host")
        .unwrap_or_else(|| panic!("no busy-host warning: {warnings:?}"));
    let message = busy["message"].as_str().unwrap();
    assert!(
        message.contains("another process competed for the CPU"),
        "{message}"
    );
    assert!(message.contains("--cpu"), "the remedy is named: {message}");

    // The stored run shows the same noise, and the terminal shows it under the host line.
    let id = r["run_id"].as_str().unwrap();
    let shown = json(&run(&db, &["show", id, "--json"]));
    assert_eq!(shown["noise"], *noise);
    let text = run(&db, &["show", id]);
    let text = String::from_utf8_lossy(&text.stdout);
    let lines: Vec<&str> = text.lines().collect();
    let host = lines.iter().position(|l| l.starts_with("host: ")).unwrap();
    assert!(lines[host + 1].starts_with("noise: load "), "{text}");
    assert!(lines[host + 1].ends_with("— busy"), "{text}");
    assert!(text.contains("warning: busy host: "), "{text}");

    // The report says it too, on the run's page, before its numbers, and on the first screen.
    let dir = tempfile::tempdir().unwrap();
    let out = run(&db, &["report", id, "-o", dir.path().to_str().unwrap()]);
    assert_exit(&out, 0, &[]);
    let index = std::fs::read_to_string(dir.path().join("index.html")).unwrap();
    assert!(index.contains("busy host: "), "{index}");
    let page = std::fs::read_dir(dir.path().join("runs"))
        .unwrap()
        .next()
        .expect("the run's page")
        .unwrap()
        .path();
    let html = std::fs::read_to_string(page).unwrap();
    let md = std::fs::read_to_string(dir.path().join("summary.md")).unwrap();
    let section = html.find("<h1 id=\"").expect("the run's heading");
    let noise_at = html[section..]
        .find("<p class=\"noise\">noise: load ")
        .expect(&html);
    let warning_at = html[section..]
        .find("<p class=\"warning\">warning: busy host: ")
        .expect(&html);
    let table_at = html[section..].find("<table>").expect(&html);
    assert!(noise_at < table_at && warning_at < table_at, "{html}");
    assert!(md.contains("\nnoise: load "), "{md}");
    assert!(md.contains("**warning**: busy host: "), "{md}");
}

#[test]
fn interference_options_and_the_threshold_refuse_bad_values_naming_the_valid_range() {
    let (_dir, db) = common::db();
    let out = run(&db, &["run", "exits", "--cpu", "4095", "--no-store"]);
    assert_exit(
        &out,
        2,
        &[
            "--cpu",
            "CPU 4095 does not exist or is not allowed",
            "allowed CPUs are",
        ],
    );
    let out = run(&db, &["run", "exits", "--cpu", "one", "--no-store"]);
    assert_exit(&out, 2, &["--cpu", "not a CPU list"]);
    let out = run(&db, &["run", "exits", "--quiet-host=soon", "--no-store"]);
    assert_exit(&out, 2, &["--quiet-host", "between 1s and 1h"]);
    let out = run(&db, &["calibrate", "--quiet-host=2h"]);
    assert_exit(&out, 2, &["--quiet-host", "between 1s and 1h"]);
    for bad in ["150%", "100", "1.5%x"] {
        let out = run(&db, &["compare", "a", "b", "--threshold", bad]);
        assert_exit(&out, 2, &["--threshold"]);
    }
    let out = run(&db, &["compare", "a", "b", "--threshold", "150%"]);
    assert_exit(&out, 2, &["--threshold", "valid range is 0% to under 100%"]);
}
