//! Fleet views over a store holding runs from several (fake) hosts: `runs` grouped by host,
//! `compare` with kernel and CPU selectors (per matched host and overall), and the report's
//! fleet page, rendered in headless Chromium. The runs are built as records and saved through
//! the store API: no KVM needed.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::common;

use std::collections::BTreeMap;

use common::{assert_exit, json, run, tool_or_skip};
use hvlab::record::{MetricRecord, RunRecord, VariantRecord, VariantStatus};
use hvlab::store::Store;
use hvlab_core::BackendKind;
use hvlab_core::host::{HostInfo, KvmFlavour};

const CPUS: [(&str, KvmFlavour, f64); 4] = [
    ("AMD EPYC 7763 64-Core Processor", KvmFlavour::Svm, 7.0),
    ("AMD EPYC 9654 96-Core Processor", KvmFlavour::Svm, 7.5),
    ("Intel(R) Xeon(R) Platinum 8480+", KvmFlavour::Vmx, 8.0),
    ("Intel(R) Xeon(R) Gold 6338", KvmFlavour::Vmx, 8.5),
];

fn host(kernel: &str, cpu: &str, flavour: KvmFlavour) -> HostInfo {
    HostInfo {
        kernel: kernel.into(),
        cpu: cpu.into(),
        cores: 16,
        kvm_flavour: flavour,
        tdp: Some(true),
        tdp_mmu: Some(true),
        vpmu: Some(false),
        hz: 250,
        hz_source: "config".into(),
        thp: "madvise".into(),
        hypervisor: None,
        kvm_access: "ok".into(),
        capabilities: BTreeMap::new(),
        hvlab_version: "test".into(),
        git_rev: "test".into(),
        under_test: None,
        clock: Default::default(),
    }
}

/// Eight samples around `median`, spread ±2%.
fn samples(median: f64) -> Vec<f64> {
    [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.015, 0.985]
        .iter()
        .map(|k| median * k)
        .collect()
}

fn variant(name: &str, median: f64) -> VariantRecord {
    let mut metrics = BTreeMap::new();
    metrics.insert(
        "ready_ms".into(),
        MetricRecord::new("ms", samples(median), 1),
    );
    VariantRecord {
        name: name.into(),
        status: VariantStatus::Ok,
        metrics,
        findings: vec![],
        timeline: vec![],
        pinned_bytes: vec![],
    }
}

fn record(i: usize, h: HostInfo, irqchip_first: f64, memslots_first: f64) -> RunRecord {
    let started = format!("2026-11-22T10:{:02}:00Z", i);
    RunRecord {
        run_id: format!("{started}-lifecycle-kvm-{i:04x}"),
        scenario: "lifecycle".into(),
        backend: BackendKind::Kvm,
        profile: None,
        host: h,
        params: BTreeMap::new(),
        started_at: started.clone(),
        finished_at: started,
        variants: vec![
            variant("irqchip-first", irqchip_first),
            variant("memslots-first", memslots_first),
        ],
        verdicts: vec![],
        noise: None,
        warnings: vec![],
        tag: None,
        baseline: None,
        calls: Vec::new(),
    }
}

/// Four CPU models on 6.18 and on 6.19, plus an arm64 host on 6.18 only and a second 6.18 run
/// on the EPYC 7763. On 6.19 irqchip-first is twice as fast everywhere; memslots-first is
/// unchanged except on the Xeon Gold 6338, where it is 1.5× slower.
fn fleet_db() -> (tempfile::TempDir, std::path::PathBuf) {
    let (dir, path) = common::db();
    let mut store = Store::open(&path).unwrap();
    let mut i = 0;
    let mut save = |r: RunRecord| {
        let mut r = r;
        store.save(&mut r).unwrap();
    };
    for (cpu, flavour, base) in CPUS {
        i += 1;
        save(record(
            i,
            host("6.18.0-1-amd64", cpu, flavour),
            base,
            base / 10.0,
        ));
        i += 1;
        let slower = if cpu.contains("6338") { 1.5 } else { 1.0 };
        save(record(
            i,
            host("6.19.0", cpu, flavour),
            base / 2.0,
            base / 10.0 * slower,
        ));
    }
    i += 1;
    save(record(
        i,
        host("6.18.0-1-amd64", CPUS[0].0, CPUS[0].1),
        7.1,
        0.71,
    ));
    i += 1;
    save(record(
        i,
        host("6.18.0-1-arm64", "Neoverse-N2", KvmFlavour::Arm64),
        9.0,
        0.9,
    ));
    (dir, path)
}

#[test]
fn runs_are_grouped_by_host_fingerprint() {
    let (_dir, db) = fleet_db();
    let out = json(&run(&db, &["runs", "--json"]));
    let hosts = out["hosts"].as_array().unwrap();
    assert_eq!(hosts.len(), 9, "{out}");
    assert_eq!(out["runs"].as_array().unwrap().len(), 10);
    let epyc_618: Vec<&serde_json::Value> = hosts
        .iter()
        .filter(|h| h["host"]["kernel"] == "6.18.0-1-amd64" && h["host"]["cpu"] == CPUS[0].0)
        .collect();
    assert_eq!(epyc_618.len(), 1);
    assert_eq!(epyc_618[0]["runs"].as_array().unwrap().len(), 2);
    assert_eq!(epyc_618[0]["host"]["flavour"], "svm");
    assert_eq!(epyc_618[0]["host"]["hz"], 250);

    let text = run(&db, &["runs"]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains(
            "Linux 6.18.0-1-amd64 · AMD EPYC 7763 64-Core Processor · svm · HZ=250 (2 runs)"
        ),
        "{text}"
    );
    assert_eq!(text.matches(" · HZ=250 (").count(), 9, "{text}");
}

fn per_host<'a>(c: &'a serde_json::Value, cpu: &str) -> &'a serde_json::Value {
    c["per_host"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["host"].as_str().unwrap().contains(cpu))
        .unwrap_or_else(|| panic!("no per-host comparison for {cpu}: {c}"))
}

#[test]
fn kernel_selectors_compare_per_matched_host_and_overall() {
    let (_dir, db) = fleet_db();
    let out = json(&run(
        &db,
        &[
            "compare",
            "--scenario",
            "lifecycle",
            "--variant",
            "irqchip-first",
            "kernel=6.18",
            "kernel=6.19",
            "--json",
        ],
    ));
    assert_eq!(out["runs"], serde_json::json!([6, 4]), "{out}");
    let c = &out["comparisons"][0];
    assert_eq!(c["variant"], "irqchip-first");
    // Hosts pair on CPU model, flavour and HZ: four pairs, the arm64 host on side A alone.
    assert_eq!(c["per_host"].as_array().unwrap().len(), 4, "{c}");
    for (cpu, _, _) in CPUS {
        let h = per_host(c, cpu);
        // Two per-run medians on a side are fewer than the verdict rule's 4 per side.
        let n = &h["comparison"]["n"];
        let want = if n[0].as_u64().unwrap() < 4 || n[1].as_u64().unwrap() < 4 {
            "not decided"
        } else {
            "faster"
        };
        assert_eq!(h["comparison"]["verdict"], want, "{h}");
        let ratio = h["comparison"]["ratio"].as_f64().unwrap();
        assert!((ratio - 0.5).abs() < 0.03, "{cpu}: ratio {ratio}");
    }
    // The EPYC 7763 has two 6.18 runs: that side is their two medians.
    assert_eq!(
        per_host(c, "EPYC 7763")["comparison"]["n"],
        serde_json::json!([2, 8])
    );
    assert_eq!(c["only_a"].as_array().unwrap().len(), 1);
    assert!(c["only_a"][0].as_str().unwrap().contains("Neoverse-N2"));
    // Overall: one median per host, 5 against 4.
    assert_eq!(c["overall"]["n"], serde_json::json!([5, 4]));
    assert_eq!(c["overall"]["verdict"], "faster", "{}", c["overall"]);
    assert_eq!(out["regression"], false);

    // memslots-first regressed on one CPU model only: that host says so, the pooled fleet does
    // not, and --fail-on-regression fails on the host's verdict.
    let args = [
        "compare",
        "--scenario",
        "lifecycle",
        "--variant",
        "memslots-first",
        "kernel=6.18",
        "kernel=6.19",
    ];
    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = json(&run(&db, &json_args));
    let c = &out["comparisons"][0];
    assert_eq!(per_host(c, "Gold 6338")["comparison"]["verdict"], "slower");
    for cpu in ["EPYC 9654", "8480"] {
        assert_eq!(
            per_host(c, cpu)["comparison"]["verdict"],
            "no change",
            "{cpu}"
        );
    }
    // The EPYC 7763 pair has two per-run medians on side A: fewer than the rule's 4.
    assert_eq!(
        per_host(c, "EPYC 7763")["comparison"]["verdict"],
        "not decided"
    );
    // Five hosts against four, judged with the per-host comparisons: the exact test's floor
    // (2/126), corrected over the family, cannot reach p < 0.05, so the pooled fleet is not
    // decided (never "no change"), and the text says how many hosts would decide it.
    assert_eq!(c["overall"]["verdict"], "not decided", "{}", c["overall"]);
    assert_eq!(
        c["overall"]["undecided"]["reason"], "unreachable",
        "{}",
        c["overall"]
    );
    assert_eq!(out["regression"], true);
    let mut fail_args = args.to_vec();
    fail_args.push("--fail-on-regression");
    let failed = run(&db, &fail_args);
    assert_eq!(failed.status.code(), Some(1), "{}", common::stderr(&failed));
    let text = String::from_utf8_lossy(&failed.stdout);
    assert!(
        text.contains("per host [cpu=Intel(R) Xeon(R) Gold 6338"),
        "{text}"
    );
    assert!(text.contains("SLOWER, "), "{text}");
    assert!(text.contains("(a regression)"), "{text}");
    assert!(text.contains("overall (per-host medians)"), "{text}");
}

#[test]
fn cpu_and_kernel_selectors_pool_the_named_hosts() {
    let (_dir, db) = fleet_db();
    // Both sides name the CPU, so the EPYCs pair on flavour and HZ alone: one pool per side.
    let out = json(&run(
        &db,
        &[
            "compare",
            "--variant",
            "irqchip-first",
            "kernel=6.18,cpu=EPYC",
            "kernel=6.19,cpu=epyc",
            "--json",
        ],
    ));
    assert_eq!(out["scenario"], "lifecycle");
    assert_eq!(out["runs"], serde_json::json!([3, 2]));
    let c = &out["comparisons"][0];
    let hosts = c["per_host"].as_array().unwrap();
    assert_eq!(hosts.len(), 1, "{c}");
    assert_eq!(hosts[0]["host"], "flavour=svm, hz=250");
    assert_eq!(hosts[0]["a_hosts"].as_array().unwrap().len(), 2);
    // Three runs on two hosts on side A: three run medians.
    assert_eq!(hosts[0]["comparison"]["n"], serde_json::json!([3, 2]));
    // Without --variant every variant both sides ran is compared.
    let out = json(&run(
        &db,
        &["compare", "kernel=6.18", "kernel=6.19", "--json"],
    ));
    assert_eq!(out["comparisons"].as_array().unwrap().len(), 2);
}

#[test]
fn bad_selectors_exit_2_naming_the_valid_keys() {
    let (_dir, db) = fleet_db();
    assert_exit(
        &run(&db, &["compare", "kern=6.18", "kernel=6.19"]),
        2,
        &[
            "kern=6.18",
            "valid keys: kernel, cpu, flavour, hz, clock, backend",
        ],
    );
    assert_exit(
        &run(&db, &["compare", "kernel=6.18", "kernel=7.0"]),
        2,
        &["kernel=7.0"],
    );
    assert_exit(
        &run(
            &db,
            &[
                "compare",
                "kernel=6.18",
                "kernel=6.19",
                "--scenario",
                "nosuch",
            ],
        ),
        2,
        &["nosuch"],
    );
}

#[test]
fn the_fleet_page_groups_hosts_and_renders_in_chromium() {
    let (dir, db) = fleet_db();
    let out_dir = dir.path().join("report");
    let out = run(&db, &["report", "-o", out_dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let index = std::fs::read_to_string(out_dir.join("index.html")).unwrap();
    assert!(index.contains("href=\"fleet.html\""));
    let page = out_dir.join("fleet.html");
    let html = std::fs::read_to_string(&page).unwrap();
    common::assert_self_contained(&html, &["index.html"]);
    // The latest lifecycle run of each of the nine hosts.
    assert!(html.contains("9 runs on 9 real hosts"), "{html}");
    for cpu in ["AMD EPYC 9654 96-Core Processor", "Neoverse-N2"] {
        assert!(html.contains(cpu), "{cpu} missing");
    }
    // One chart per variant, a bar per host.
    let svgs = html.matches("<svg").count();
    assert_eq!(svgs, 2, "{svgs} charts");
    // Hosts in order of their latest run: the arm64 host ran last.
    assert!(
        html.contains("H1 (Linux 6.18.0-1-arm64"),
        "host labels missing"
    );

    if !tool_or_skip("fleet_page_in_chromium", "chromium") {
        return;
    }
    let profile = dir.path().join("chromium-profile");
    let rendered = common::chromium_dom(&page, &profile, svgs);
    assert!(rendered.contains("hvlab fleet"));
}
