//! The HTML report: self-contained, every chart present, and it renders in headless Chromium
//! with nothing failing to load.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)] // test code: a panic is the failure report

mod common;

use common::{run, tool_or_skip};

#[test]
fn the_report_is_self_contained_and_renders_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hvlab.db");
    // Model runs (no /dev/kvm needed): one per scenario.
    for (scenario, extra) in [
        ("lifecycle", vec![]),
        ("memory", vec!["--set", "size=64MiB"]),
        ("exits", vec![]),
        ("pinning", vec!["--set", "buffer=256MiB"]),
        ("percpu", vec![]),
    ] {
        let mut args = vec![
            "run",
            scenario,
            "--backend",
            "model",
            "--profile",
            "pvm-epyc",
            "--reps",
            "5",
        ];
        if scenario == "pinning" || scenario == "percpu" {
            args[5] = if scenario == "pinning" {
                "neoverse-n2-spe"
            } else {
                "arm64-server-160"
            };
        }
        args.extend(extra);
        let out = run(&db, &args);
        assert!(out.status.success(), "{}", common::stderr(&out));
    }
    let out_dir = dir.path().join("report");
    let out = run(&db, &["report", "-o", out_dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let html = std::fs::read_to_string(out_dir.join("index.html")).unwrap();
    let md = std::fs::read_to_string(out_dir.join("summary.md")).unwrap();
    // Self-contained: nothing to fetch.
    // The one link is to the fleet page beside it.
    assert!(
        html.contains("href=\"fleet.html\""),
        "no link to the fleet page"
    );
    assert!(out_dir.join("fleet.html").exists(), "fleet.html missing");
    common::assert_self_contained(&html, &["fleet.html"]);
    // The model against the kernel threads comes before the runs, in both renderings, with
    // the same words.
    let fidelity = html
        .find("id=\"fidelity\"")
        .expect("the fidelity table is in the report");
    let first_run = html.rfind("lifecycle on model");
    assert!(
        fidelity < first_run.unwrap_or(usize::MAX),
        "fidelity after the runs"
    );
    // Markdown escapes the underscore, which renders as pf_fixed.
    assert!(html.contains("pf_fixed after the fix") && md.contains("pf\\_fixed after the fix"));
    assert!(md.contains("| thread | figure | setup | published | model | verdict |"));
    let svgs = html.matches("<svg").count();
    // Per scenario: a distribution plus its own chart; pinning has two.
    assert!(svgs >= 11, "{svgs} charts");
    for scenario in [
        "lifecycle on model",
        "memory on model",
        "exits on model",
        "pinning on model",
        "percpu on model",
    ] {
        assert!(html.contains(scenario), "{scenario} missing");
        assert!(md.contains(scenario), "{scenario} missing from the summary");
    }
    assert!(
        html.contains("construction timeline"),
        "the lifecycle timeline chart is missing"
    );
    assert!(
        html.contains("pinned memory over the trace"),
        "the pinned-bytes chart is missing"
    );
    assert!(
        html.contains("waited for the SRCU grace period"),
        "findings in words are missing"
    );

    if !tool_or_skip("report_in_chromium", "chromium") {
        return;
    }
    let profile = dir.path().join("chromium-profile");
    let page = out_dir.join("index.html");
    let shot = dir.path().join("report.png");
    let chromium = |extra: &[&str]| common::chromium(&page, &profile, extra);
    common::chromium_dom(&page, &profile, svgs);
    let shot_out = chromium(&[
        &format!("--screenshot={}", shot.display()),
        "--window-size=1000,2400",
    ]);
    assert!(
        shot_out.status.success(),
        "{}",
        String::from_utf8_lossy(&shot_out.stderr)
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "screenshot of {} bytes",
        png.len()
    );
    if let Ok(keep) = std::env::var("HVLAB_REPORT_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
}
