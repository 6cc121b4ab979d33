//! The pinning scenario on real KVM with real pins.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)] // test code: a panic is the failure report

mod common;

use common::{kvm_or_skip, median, scenario_json, variant};

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
    // 30 re-pins against one first pin (which also faults the pages in): measured ~20x here.
    assert!(
        median(&r, "eager", "pin_ms") > 5.0 * median(&r, "keep", "pin_ms"),
        "eager {} ms vs keep {} ms",
        median(&r, "eager", "pin_ms"),
        median(&r, "keep", "pin_ms")
    );
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
