//! The memslots scenario on real /dev/kvm and on the model: every update of every kind runs,
//! a move costs more than an add (it waits for one more SRCU grace period and prepares the
//! same slot), and the model counts the swaps `kvm_set_memslot()` makes.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::common;

use common::{assert_exit, fastest, kvm_or_skip, median, scenario_json, variant};

fn memslots(backend: &str, sets: &[&str]) -> serde_json::Value {
    let mut extra = vec!["--reps", "4", "--warmup", "1", "--backend", backend];
    if backend == "model" {
        // The built-in profile of these hosts: a calibrated profile may predate these costs.
        extra.extend(["--profile", "pvm-epyc"]);
    }
    scenario_json("memslots", sets, &[], &extra)
}

#[test]
fn every_update_runs_and_a_move_costs_more_than_an_add() {
    let Some(_kvm) = kvm_or_skip("memslots_updates") else {
        return;
    };
    let r = memslots("kvm", &["slots=200"]);
    assert_eq!(r["backend"], "kvm");
    for v in ["add", "move", "delete"] {
        assert_eq!(variant(&r, v)["status"], "ok", "{v}");
        let m = &variant(&r, v)["metrics"];
        assert_eq!(m["op_us"]["unit"], "us", "{v}");
        assert_eq!(m["op_us"]["n"], 4, "{v}");
        assert!(fastest(&r, v, "op_us") > 0.0, "{v}");
        // The kvm backend cannot see the swaps; it does not make a count up.
        assert!(m.get("swaps_per_op").is_none(), "{v}");
    }
    // Same preparation of the slot, one more expedited grace period: a busy host only adds
    // time, so the fastest repetitions keep the order.
    let (add, mv) = (fastest(&r, "add", "op_us"), fastest(&r, "move", "op_us"));
    assert!(mv > add, "move {mv} us vs add {add} us");
}

#[test]
fn the_model_counts_one_swap_for_an_add_and_two_for_a_move_or_delete() {
    let r = memslots("model", &["slots=4096"]);
    assert_eq!(median(&r, "add", "swaps_per_op"), 1.0);
    assert_eq!(median(&r, "move", "swaps_per_op"), 2.0);
    assert_eq!(median(&r, "delete", "swaps_per_op"), 2.0);
    // The id lookup's chain (n / 128) and the trees' depth (log n) grow with the slots: at
    // 4096, a few µs on a create of ~40 µs, nothing like the O(n) copy of kernels before 5.17.
    let growth = median(&r, "add", "growth");
    assert!((1.0..1.5).contains(&growth), "{growth}");
    // A delete shrinks the VM: its first updates walk the longest chains.
    assert!(median(&r, "delete", "growth") < 1.0);
}

#[test]
fn more_slots_than_x86_kvm_takes_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let out = common::run(
        &dir.path().join("hvlab.db"),
        &[
            "run",
            "memslots",
            "--backend",
            "model",
            "--set",
            "slots=40000",
        ],
    );
    assert_exit(&out, 2, &["slots", "32764"]);
}
