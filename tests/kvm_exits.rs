//! The exits scenario on real /dev/kvm.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)] // test code: a panic is the failure report

use crate::common;

use common::{kvm_or_skip, median, variant};
use serde_json::Value;

fn exits(sets: &[&str], variants: &[&str]) -> Value {
    let mut all = vec!["iterations=2000"];
    all.extend(sets);
    common::scenario_json("exits", &all, variants, &["--reps", "3", "--warmup", "0"])
}

#[test]
fn userspace_exits_come_back_once_per_iteration_and_in_kernel_ones_never() {
    let Some(_kvm) = kvm_or_skip("exits_counts") else {
        return;
    };
    let r = exits(
        &[],
        &[
            "pio-out",
            "pio-in",
            "mmio-write",
            "mmio-read",
            "cpuid",
            "ioeventfd",
        ],
    );
    for name in ["pio-out", "pio-in", "mmio-write", "mmio-read"] {
        assert_eq!(median(&r, name, "userspace_exits_per_iter"), 1.0, "{name}");
        // The self-check holds for exits that go to userspace: KVM counted each one (plus the
        // End signal's exit and the odd host interrupt).
        let counted = median(&r, name, "kvm.vcpu.exits");
        assert!(
            (counted - 1.0).abs() < 0.01,
            "{name}: kvm.vcpu.exits {counted} per iteration"
        );
    }
    assert_eq!(median(&r, "cpuid", "userspace_exits_per_iter"), 0.0);
    assert_eq!(median(&r, "ioeventfd", "userspace_exits_per_iter"), 0.0);
    // A userspace roundtrip costs more than one KVM completes itself: about 2× on the nested
    // PVM hosts, where every exit already pays the switch to the outer host (29 µs against
    // 14 µs), so the margin leaves room for a busy host.
    let (pio, cpuid) = (
        median(&r, "pio-out", "roundtrip_ns"),
        median(&r, "cpuid", "roundtrip_ns"),
    );
    assert!(
        pio > 1.3 * cpuid,
        "pio-out {pio} ns against cpuid {cpuid} ns"
    );
    assert!(median(&r, "pio-out", "roundtrip_ns") > median(&r, "ioeventfd", "roundtrip_ns"));
    assert!(median(&r, "pio-out", "tsc_per_iter") > 0.0);
    // Every variant printed with median and CI.
    for v in r["variants"].as_array().unwrap() {
        let m = &v["metrics"]["roundtrip_ns"];
        assert!(m["ci95"][0].as_f64().unwrap() <= m["median"].as_f64().unwrap());
    }
}

#[test]
fn a_host_that_miscounts_exits_gets_a_self_check_finding() {
    let Some(_kvm) = kvm_or_skip("exits_self_check") else {
        return;
    };
    let r = exits(&[], &["cpuid"]);
    let counted = median(&r, "cpuid", "kvm.vcpu.exits");
    let findings = variant(&r, "cpuid")["findings"].as_array().unwrap();
    let flagged = findings
        .iter()
        .any(|f| f["kind"] == "self-check" && f["metric"] == "kvm.vcpu.exits");
    assert_eq!(
        flagged,
        (counted - 1.0).abs() > 0.05,
        "exits {counted}, findings {findings:?}"
    );
}

#[test]
fn modes_and_capabilities_decide_what_runs() {
    let Some(_kvm) = kvm_or_skip("exits_unsupported") else {
        return;
    };
    // With both unsupported (no KVM_CAP_PMU_CAPABILITY here) the run has nothing to show:
    // exit 3, each variant's reason on stderr, nothing stored.
    let dir = tempfile::tempdir().unwrap();
    let out = common::run(
        &dir.path().join("hvlab.db"),
        &[
            "run",
            "exits",
            "--set",
            "guest.cpl=3",
            "--variant",
            "hlt",
            "--variant",
            "pmu-off",
            "--reps",
            "3",
            "--warmup",
            "0",
            "--json",
        ],
    );
    let hlt = "unsupported: hlt needs guest CPL0 (--set guest.cpl=0): at CPL3 it raises #GP";
    if out.status.code() == Some(3) {
        let err = common::stderr(&out);
        assert!(err.contains(hlt), "{err}");
        assert!(
            err.contains(
                "unsupported: needs KVM_CAP_PMU_CAPABILITY, which this host's KVM does not offer"
            ),
            "{err}"
        );
        assert!(out.stdout.is_empty());
    } else {
        let r = common::json(&out);
        assert_eq!(r["host"]["capabilities"]["KVM_CAP_PMU_CAPABILITY"], true);
        assert_eq!(variant(&r, "hlt")["status"], hlt);
    }
    let r = exits(&["guest.cpl=0", "iterations=200"], &["hlt"]);
    assert_eq!(variant(&r, "hlt")["status"], "ok");
    assert_eq!(median(&r, "hlt", "userspace_exits_per_iter"), 1.0);
}
