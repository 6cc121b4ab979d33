//! The pinning scenario on real KVM with real pins.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)] // test code: a panic is the failure report

use crate::common;

use common::{fastest, kvm_or_skip, median, scenario_json, variant};

fn pinning(sets: &[&str], variants: &[&str]) -> serde_json::Value {
    scenario_json("pinning", sets, variants, &["--reps", "2", "--warmup", "0"])
}

#[test]
fn eager_pins_on_every_switch_and_keep_once_with_no_blackouts() {
    let Some(_kvm) = kvm_or_skip("pinning_policies") else {
        return;
    };
    let r = pinning(
        &["buffer=64MiB", "slices=30", "tail_ms=100"],
        &["eager", "keep", "aging"],
    );
    assert_eq!(r["backend"], "kvm");
    // What each policy decided is exact: eager pins on every one of the 30 enables, keep and
    // aging once (the trace has no idle gap long enough to age the pin before its tail).
    assert_eq!(median(&r, "eager", "pins"), 30.0);
    assert_eq!(median(&r, "keep", "pins"), 1.0);
    assert_eq!(median(&r, "aging", "pins"), 1.0);
    // Eager repeats keep's single pin and adds 29 re-pins of resident pages, so it costs more.
    // How much more depends on the first pin's faults: far more on a warm host than on a fresh
    // machine, whose first touch of the buffer also faults in the outer host.
    let (eager, keep) = (
        fastest(&r, "eager", "pin_ms"),
        fastest(&r, "keep", "pin_ms"),
    );
    assert!(eager > 1.5 * keep, "eager {eager} ms vs keep {keep} ms");
    for v in ["eager", "keep", "aging"] {
        assert_eq!(median(&r, v, "blackout_records"), 0.0, "{v}");
        assert_eq!(
            median(&r, v, "pinned_bytes_max"),
            64.0 * 1024.0 * 1024.0,
            "{v}"
        );
    }
    assert_eq!(
        median(&r, "keep", "pinned_bytes_end"),
        64.0 * 1024.0 * 1024.0
    );
    assert_eq!(median(&r, "eager", "pinned_bytes_end"), 0.0);
    // Aging released the pin in the idle tail, and the timeline shows it.
    assert_eq!(median(&r, "aging", "pinned_bytes_end"), 0.0);
    let timeline = variant(&r, "aging")["pinned_bytes"].as_array().unwrap();
    assert!(timeline.iter().any(|p| p[1].as_f64().unwrap() > 0.0));
    assert_eq!(timeline.last().unwrap()[1].as_f64().unwrap(), 0.0);
}

#[test]
fn a_buffer_over_the_cap_is_never_pinned_and_its_records_are_blackouts() {
    let Some(_kvm) = kvm_or_skip("pinning_cap") else {
        return;
    };
    let r = pinning(&["buffer=8MiB", "cap=4MiB", "slices=10"], &["keep"]);
    assert_eq!(median(&r, "keep", "pin_ms"), 0.0);
    assert_eq!(median(&r, "keep", "pinned_bytes_max"), 0.0);
    // 10 slices of 3 ms at 100 records per ms.
    assert_eq!(median(&r, "keep", "blackout_records"), 3000.0);
}

#[test]
fn io_uring_registration_pins_too() {
    let Some(_kvm) = kvm_or_skip("pinning_io_uring") else {
        return;
    };
    let r = pinning(&["pin=io_uring", "slices=10"], &["keep"]);
    let v = variant(&r, "keep");
    if v["status"]
        .as_str()
        .unwrap_or("")
        .starts_with("unsupported")
    {
        common::loud_skip(&format!("io_uring pinning: {}", v["status"]));
        return;
    }
    assert!(median(&r, "keep", "pin_ms") > 0.0);
    assert_eq!(
        median(&r, "keep", "pinned_bytes_end"),
        4.0 * 1024.0 * 1024.0
    );
}

#[test]
fn gmem_prefault_runs_where_the_host_can_and_otherwise_names_the_missing_capability() {
    let Some(_kvm) = kvm_or_skip("pinning_gmem_prefault") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = common::run(
        &dir.path().join("hvlab.db"),
        &[
            "run",
            "pinning",
            "--variant",
            "gmem-prefault",
            "--set",
            "slices=10",
            "--reps",
            "2",
            "--warmup",
            "0",
            "--json",
        ],
    );
    if out.status.code() == Some(3) {
        // This PVM host: guest_memfd yes, KVM_PRE_FAULT_MEMORY no.
        let err = common::stderr(&out);
        assert!(
            err.contains("gmem-prefault: unsupported: gmem-prefault needs guest_memfd and KVM_PRE_FAULT_MEMORY")
                || err.contains("guest_memfd here is private-only"),
            "{err}"
        );
        assert!(out.stdout.is_empty());
        return;
    }
    let r = common::json(&out);
    assert_eq!(common::median(&r, "gmem-prefault", "pins"), 0.0);
    assert_eq!(common::median(&r, "gmem-prefault", "prefaults"), 1.0);
    assert_eq!(common::median(&r, "gmem-prefault", "blackout_records"), 0.0);
}
