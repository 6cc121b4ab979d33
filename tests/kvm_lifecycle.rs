//! The lifecycle scenario on real /dev/kvm: the construction order decides the stall.
//! Timing assertions are ratios with wide margins; counts and attributions are exact.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)] // test code: a panic is the failure report

use crate::common;

use common::{fastest, json, kvm_or_skip, run, scenario_json, variant};

#[test]
fn irqchip_first_stalls_on_the_memslot_and_memslots_first_does_not() {
    let Some(_kvm) = kvm_or_skip("irqchip_first_stalls") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hvlab.db");
    let out = run(
        &db,
        &[
            "run",
            "lifecycle",
            "--variant",
            "irqchip-first",
            "--variant",
            "memslots-first",
            "--reps",
            // 16: on a host whose two cores are saturated by other work, 8 repetitions a side
            // left the rank test undecided once in three runs (p = 0.02 at best).
            "16",
            "--json",
        ],
    );
    let r = json(&out);
    assert_eq!(r["scenario"], "lifecycle");
    assert_eq!(r["backend"], "kvm");
    let variant = |name: &str| {
        r["variants"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .cloned()
            .unwrap()
    };
    let (slow, fast) = (variant("irqchip-first"), variant("memslots-first"));
    assert_eq!(slow["status"], "ok");
    // The fastest repetition of each: a busy host (load, steal) only adds time, and it added
    // up to 3.8 ms to memslots-first's median here; the stall is in every repetition of
    // irqchip-first, so even its fastest one waits it out.
    let ready = |v: &serde_json::Value| v["metrics"]["ready_ms"]["min"].as_f64().unwrap();
    // Measured here: ~8 ms vs ~0.5 ms at HZ=250. The stall is a normal SRCU grace period, over
    // a jiffy. The gap, not the ratio: with both cores saturated by other work every
    // repetition of memslots-first was preempted once (3.5 ms at best, the ratio 2.1×), while
    // the grace period still stood between them.
    let jiffy_ms = 1000.0 / r["host"]["hz"].as_f64().unwrap();
    assert!(
        ready(&slow) - ready(&fast) > 0.5 * jiffy_ms,
        "irqchip-first {} ms vs memslots-first {} ms",
        ready(&slow),
        ready(&fast)
    );
    assert_eq!(slow["metrics"]["ready_ms"]["n"], 16);
    assert_eq!(
        slow["metrics"]["ready_ms"]["samples"]
            .as_array()
            .unwrap()
            .len(),
        16
    );
    assert_eq!(fast["metrics"]["stalls"]["max"], 0);
    // Exactly one stall is blamed on SRCU. A preempted ioctl on a busy host may be reported
    // too, as slow with its cause unknown, never as a grace period.
    let srcu: Vec<&serde_json::Value> = slow["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "srcu-stall")
        .collect();
    assert_eq!(srcu.len(), 1, "{}", slow["findings"]);
    let finding = srcu[0];
    assert_eq!(finding["ioctl"], "KVM_SET_USER_MEMORY_REGION");
    assert_eq!(finding["caused_by"], "KVM_CREATE_IRQCHIP");
    assert!(finding["stalled_reps"].as_u64().unwrap() >= 12, "{finding}");
    assert!(finding["jiffies"].as_f64().unwrap() > 0.5);
    let verdict = &r["verdicts"][0];
    assert_eq!(verdict["faster"], "memslots-first");
    assert_eq!(verdict["significant"], true);
    assert!(verdict["ci95"][0].as_f64().unwrap() > 1.0);
    // The host fingerprint travels with the run.
    assert!(r["host"]["hz"].as_u64().unwrap() >= 100);
    assert_ne!(r["host"]["kvm_flavour"], "none");

    // Stored whole: listed, and reprinted identically by `show`.
    let runs = json(&run(&db, &["runs", "--json"]));
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1);
    assert_eq!(runs["runs"][0]["run_id"], r["run_id"]);
    let shown = json(&run(
        &db,
        &["show", r["run_id"].as_str().unwrap(), "--json"],
    ));
    assert_eq!(shown, r);
}

#[test]
fn a_custom_order_runs_as_the_custom_variant() {
    let Some(_kvm) = kvm_or_skip("custom_order") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &dir.path().join("db"),
        &[
            "run",
            "lifecycle",
            "--set",
            "order=create-vm,memslot,vcpus,run",
            "--set",
            "devices=0",
            "--reps",
            "3",
            "--warmup",
            "0",
            "--json",
            "--no-store",
        ],
    );
    let r = json(&out);
    assert_eq!(r["variants"].as_array().unwrap().len(), 1);
    let v = &r["variants"][0];
    assert_eq!(v["name"], "custom");
    assert_eq!(v["status"], "ok");
    assert!(v["metrics"].get("ioctl.KVM_CREATE_IRQCHIP_ms").is_none());
    assert_eq!(v["metrics"]["stalls"]["max"], 0);
    assert_eq!(r["params"]["devices"], 0);
}

#[test]
fn an_interrupted_run_leaves_nothing_marked_complete() {
    let Some(_kvm) = kvm_or_skip("interrupted_run") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hvlab.db");
    // One complete run first, so the database exists and has something to protect.
    json(&run(
        &db,
        &[
            "run",
            "lifecycle",
            "--variant",
            "memslots-first",
            "--reps",
            "2",
            "--json",
        ],
    ));
    let mut child = common::hvlab()
        .args(["run", "lifecycle", "--reps", "100000", "--json", "--db"])
        .arg(&db)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the long run ended early"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let runs = json(&run(&db, &["runs", "--json"]));
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "{runs}");
}

#[test]
fn the_suite_runs_every_scenario_and_stores_it() {
    let Some(_kvm) = kvm_or_skip("suite") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hvlab.db");
    let r = json(&run(
        &db,
        &["suite", "--reps", "3", "--warmup", "1", "--json"],
    ));
    let runs = r["runs"].as_array().unwrap();
    assert!(runs.iter().any(|x| x["scenario"] == "lifecycle"));
    let stored = json(&run(&db, &["runs", "--all", "--json"]));
    assert_eq!(stored["runs"].as_array().unwrap().len(), runs.len());
}

#[test]
fn registrations_beside_a_running_vcpu_stall_the_next_memslot_update() {
    let Some(_kvm) = kvm_or_skip("boot_activation") else {
        return;
    };
    let boot = |devices: &str| {
        scenario_json(
            "lifecycle",
            &[devices, "boot_ms=100"],
            &["boot-activation"],
            &["--reps", "8", "--warmup", "1"],
        )
    };
    let (runs_with, runs_without) = (boot("devices=8"), boot("devices=0"));
    let (with, without) = (
        variant(&runs_with, "boot-activation"),
        variant(&runs_without, "boot-activation"),
    );
    assert_eq!(with["status"], "ok", "{with}");
    assert_eq!(without["status"], "ok", "{without}");
    // Fastest repetitions: a busy host only adds time (see fastest()).
    let memslot = |r: &serde_json::Value| fastest(r, "boot-activation", "boot.memslot_ms");
    // Measured here: ~7 ms after 8 deferred registrations against ~0.05 ms without: the
    // update waits out the grace period the first registration started (> 1 jiffy). The gap,
    // not the ratio: on a saturated host a preempted update without registrations takes a
    // scheduler slice (~3 ms).
    let jiffy_ms = 1000.0 / runs_with["host"]["hz"].as_f64().unwrap();
    assert!(
        memslot(&runs_with) - memslot(&runs_without) > 0.5 * jiffy_ms,
        "memslot after registrations {} ms, without {} ms",
        memslot(&runs_with),
        memslot(&runs_without)
    );
    assert_eq!(with["metrics"]["boot.ioeventfd_us"]["n"], 8);
    assert!(without["metrics"].get("boot.ioeventfd_us").is_none());
    // The boot thread, spawned as vCPU 0 starts, runs at once or once the vCPU's CPU ticks:
    // it never waits two jiffies (measured here: 0.06-0.25 ms or the rest of the jiffy).
    for m in [
        "boot.thread_wait_ms",
        "boot.thread_tick_phase_ms",
        "boot.sleep_late_us",
    ] {
        assert_eq!(with["metrics"][m]["n"], 8, "{m}: {with}");
    }
    let wait = with["metrics"]["boot.thread_wait_ms"]["median"]
        .as_f64()
        .unwrap();
    assert!(wait < 2.0 * jiffy_ms, "boot thread waited {wait} ms");
    // A loaded host can slow one update without registrations; the typical one never waits.
    assert_eq!(without["metrics"]["stalls"]["median"], 0.0);
    // The finding at the memslot update after KVM_RUN. On a busy host another ioctl (a
    // preempted KVM_CREATE_PIT2, or the construction's own memslot update) can be slow often
    // enough to be a finding of its own, with its cause unknown.
    let timeline = with["timeline"].as_array().unwrap();
    let run_at = timeline
        .iter()
        .position(|e| e["ioctl"] == "KVM_RUN")
        .unwrap();
    let update_at = run_at
        + timeline[run_at..]
            .iter()
            .position(|e| e["ioctl"] == "KVM_SET_USER_MEMORY_REGION")
            .unwrap();
    let finding = with["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["step"] == update_at)
        .unwrap_or_else(|| panic!("no stall at ioctl #{update_at}: {}", with["findings"]));
    assert_eq!(finding["ioctl"], "KVM_SET_USER_MEMORY_REGION");
    assert_eq!(finding["kind"], "srcu-stall");
    assert_eq!(finding["caused_by"], "KVM_IOEVENTFD");
    assert!(finding["stalled_reps"].as_u64().unwrap() >= 6, "{finding}");
}

/// The ioctls named `name` on a variant's representative timeline.
fn on_timeline(v: &serde_json::Value, name: &str) -> usize {
    v["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ioctl"] == name)
        .count()
}

/// Whether a variant has an SRCU-stall finding on `ioctl`.
fn stalls_on(v: &serde_json::Value, ioctl: &str) -> bool {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["kind"] == "srcu-stall" && f["ioctl"] == ioctl)
}

#[test]
fn with_many_vcpus_each_runs_and_kvm_and_the_model_count_the_same_stalls() {
    // On the model first, where the first vCPU adds the APIC-access memslot (VMX): it waits
    // out the irqchip's grace period and the other three do not.
    let vmx = scenario_json(
        "lifecycle",
        &["vcpus=4"],
        &["firecracker-order"],
        &["--backend", "model", "--profile", "x86-vmx-hz100"],
    );
    let v = variant(&vmx, "firecracker-order");
    let (first, other) = (
        v["metrics"]["vcpu.first_create_ms"]["median"]
            .as_f64()
            .unwrap(),
        v["metrics"]["vcpu.other_create_ms"]["median"]
            .as_f64()
            .unwrap(),
    );
    assert!(first > 20.0 * other, "first {first} ms, others {other} ms");
    assert!(stalls_on(v, "KVM_CREATE_VCPU"), "{}", v["findings"]);
    let Some(_kvm) = kvm_or_skip("lifecycle_vcpus") else {
        return;
    };
    let names = ["irqchip-first", "memslots-first"];
    let kvm = scenario_json("lifecycle", &["vcpus=4"], &names, &["--reps", "6"]);
    let model = scenario_json(
        "lifecycle",
        &["vcpus=4"],
        &names,
        &["--reps", "6", "--backend", "model", "--profile", "pvm-epyc"],
    );
    for name in names {
        let (k, m) = (variant(&kvm, name), variant(&model, name));
        assert_eq!(k["status"], "ok", "{k}");
        // Every vCPU was created and ran the guest to its signal.
        assert_eq!(on_timeline(k, "KVM_CREATE_VCPU"), 4, "{name}");
        assert_eq!(on_timeline(k, "KVM_RUN"), 4, "{name}");
        assert!(k["metrics"]["vcpu.other_create_ms"]["n"].as_u64() == Some(6));
        // The same stalls: irqchip-first's memslot, nothing in memslots-first; PVM adds no
        // APIC-access memslot, so no vCPU creation waits, on either backend. On a loaded host
        // the grace period can end while KVM_CREATE_PIT2 is itself preempted for a tick, so
        // kvm may see fewer SRCU stalls than the model, never more.
        let (ks, ms) = (
            k["metrics"]["stalls"]["median"].as_f64().unwrap(),
            m["metrics"]["stalls"]["median"].as_f64().unwrap(),
        );
        assert!(
            ks <= ms,
            "{name}: kvm {ks} model {ms}: {} / {}",
            k["findings"],
            m["findings"]
        );
        assert!(
            !stalls_on(k, "KVM_CREATE_VCPU"),
            "{name}: {}",
            k["findings"]
        );
        assert!(
            !stalls_on(m, "KVM_CREATE_VCPU"),
            "{name}: {}",
            m["findings"]
        );
    }
    assert_eq!(
        variant(&model, "irqchip-first")["metrics"]["stalls"]["median"],
        1.0
    );
    assert_eq!(
        variant(&kvm, "memslots-first")["metrics"]["stalls"]["median"],
        0.0
    );
}

#[test]
fn more_vcpus_than_the_host_allows_exit_2_naming_the_cap() {
    let Some(_kvm) = kvm_or_skip("lifecycle_vcpus_cap") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        &dir.path().join("hvlab.db"),
        &["run", "lifecycle", "--no-store", "--set", "vcpus=5000"],
    );
    common::assert_exit(&out, 2, &["vcpus", "KVM_CAP_MAX_VCPUS", "choose vcpus <="]);
}
