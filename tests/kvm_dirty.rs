//! The dirty scenario: exact dirty-page counts on real /dev/kvm for every way of collecting
//! the log, the model counting the same, and bad input refused before any VM is built.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)] // test code: a panic is the failure report; counts are checked whole and non-negative

use crate::common;

use common::{assert_exit, kvm_or_skip};
use serde_json::Value;

/// 32 MiB: 8192 pages.
const PAGES: u64 = 8192;

fn dirty(backend: &str, sets: &[&str], variants: &[&str]) -> Value {
    let mut all = vec!["size=32MiB", "passes=2"];
    all.extend(sets);
    let mut extra = vec!["--reps", "2", "--warmup", "0", "--backend", backend];
    if backend == "model" {
        // The built-in profile of these hosts: a calibrated profile may predate the dirty costs.
        extra.extend(["--profile", "pvm-epyc"]);
    }
    common::scenario_json("dirty", &all, variants, &extra)
}

fn metric(r: &Value, variant: &str, name: &str) -> f64 {
    let v = common::variant(r, variant);
    assert_eq!(v["status"], "ok", "{variant}: {}", v["status"]);
    v["metrics"][name]["median"]
        .as_f64()
        .unwrap_or_else(|| panic!("{variant} has no {name}: {}", v["metrics"]))
}

/// Every sample of a count metric, which must all be the same exact count.
fn exact(r: &Value, variant: &str, name: &str) -> u64 {
    let v = common::variant(r, variant);
    let samples: Vec<f64> = v["metrics"][name]["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("{variant} has no {name}"))
        .iter()
        .map(|s| s.as_f64().unwrap())
        .collect();
    assert!(
        samples.iter().all(|s| *s == samples[0] && s.fract() == 0.0),
        "{variant}.{name}: not one exact count: {samples:?}"
    );
    samples[0] as u64
}

#[test]
fn every_variant_finds_exactly_the_pages_each_pass_wrote() {
    let Some(_kvm) = kvm_or_skip("dirty_exact_counts") else {
        return;
    };
    // Every third page, and a ring of 1024 entries (soft limit 960) so it fills mid-pass.
    let r = dirty("kvm", &["stride=3", "ring=1024", "chunk=512"], &[]);
    let written = PAGES.div_ceil(3);
    for v in ["bitmap", "clear", "ring"] {
        assert_eq!(exact(&r, v, "pages_written"), written, "{v}");
        assert_eq!(exact(&r, v, "pages_dirty"), written, "{v}");
    }
    // Every written page was write-protected by the previous collection: one fault each.
    assert_eq!(exact(&r, "bitmap", "wp_faults"), written);
    assert_eq!(exact(&r, "clear", "wp_faults"), written);
    // The ring fills twice a pass; the write that filled it is retried after the reset (which
    // protected its page again) and faults a second time.
    let full = written / 960;
    assert_eq!(exact(&r, "ring", "ring_full_exits"), full);
    assert_eq!(exact(&r, "ring", "wp_faults"), written + full);
    assert_eq!(exact(&r, "bitmap", "collect_ioctls"), 1);
    assert_eq!(exact(&r, "clear", "collect_ioctls"), 1 + PAGES / 512);
    assert_eq!(exact(&r, "ring", "collect_ioctls"), full + 1);
}

#[test]
fn a_pass_that_writes_n_pages_finds_n_dirty() {
    let Some(_kvm) = kvm_or_skip("dirty_n_pages") else {
        return;
    };
    // One page of 8192, one per 64-page word, and a prime stride that crosses words.
    for (stride, n) in [("stride=4096", 2), ("stride=64", 128), ("stride=7", 1171)] {
        let r = dirty("kvm", &[stride], &["bitmap", "ring"]);
        for v in ["bitmap", "ring"] {
            assert_eq!(exact(&r, v, "pages_dirty"), n, "{v} {stride}");
        }
    }
}

#[test]
fn the_model_counts_what_kvm_counts() {
    let Some(_kvm) = kvm_or_skip("dirty_model_counts") else {
        return;
    };
    let sets = ["stride=5", "ring=512", "chunk=1024"];
    let kvm = dirty("kvm", &sets, &[]);
    let model = dirty("model", &sets, &[]);
    for v in ["bitmap", "clear", "ring"] {
        for m in [
            "pages_written",
            "pages_dirty",
            "wp_faults",
            "collect_ioctls",
        ] {
            assert_eq!(exact(&model, v, m), exact(&kvm, v, m), "{v}.{m}");
        }
    }
    assert_eq!(
        exact(&model, "ring", "ring_full_exits"),
        exact(&kvm, "ring", "ring_full_exits")
    );
    // Times are not compared here: the built-in profile's write-protect fault (pvm-epyc, 23.8 µs,
    // measured on a busy PVM host) and this host's (2.3 µs on a quiet AMD EPYC PVM host,
    // 10.5 µs on an Intel Xeon one) differ tenfold between machines of the same kind. The
    // model's times against this host's are `validate`'s dirty point, on a calibrated profile.
}

#[test]
fn bad_rings_and_chunks_exit_2_naming_the_rule() {
    let (_dir, db) = common::db();
    let run = |sets: &[&str]| {
        let mut args = vec!["run", "dirty", "--no-store", "--backend", "model"];
        for s in sets {
            args.extend(["--set", s]);
        }
        common::run(&db, &args)
    };
    assert_exit(&run(&["ring=1000"]), 2, &["ring", "power of two"]);
    assert_exit(&run(&["ring=128"]), 2, &["ring", "from 256"]);
    assert_exit(&run(&["chunk=100"]), 2, &["chunk", "multiple of 64"]);
    assert_exit(&run(&["size=3MiB"]), 2, &["size", "2MiB"]);
}

#[test]
fn a_ring_above_the_kernels_maximum_exits_3_naming_the_limit() {
    let (_dir, db) = common::db();
    let out = common::run(
        &db,
        &[
            "run",
            "dirty",
            "--no-store",
            "--backend",
            "model",
            "--profile",
            "pvm-epyc",
            "--variant",
            "ring",
            "--set",
            "ring=131072",
        ],
    );
    assert_exit(&out, 3, &["KVM_DIRTY_RING_MAX_ENTRIES", "65536"]);
    let Some(_kvm) = kvm_or_skip("dirty_ring_cap") else {
        return;
    };
    let out = common::run(
        &db,
        &[
            "run",
            "dirty",
            "--no-store",
            "--variant",
            "ring",
            "--set",
            "ring=131072",
        ],
    );
    // The host's own limit, from KVM_CAP_DIRTY_LOG_RING, before any VM is built.
    assert_exit(&out, 3, &["KVM_CAP_DIRTY_LOG_RING", "131072 entries"]);
}

#[test]
fn many_vcpus_each_dirty_their_own_slice_and_the_log_still_counts_exactly() {
    let Some(_kvm) = kvm_or_skip("dirty_vcpus") else {
        return;
    };
    // 8 vCPUs of 1024 pages each against a soft limit of 960: each ring fills once a pass.
    for n in [2u64, 8] {
        let r = dirty("kvm", &[&format!("vcpus={n}"), "ring=1024"], &[]);
        let model = dirty("model", &[&format!("vcpus={n}"), "ring=1024"], &[]);
        for v in ["bitmap", "clear", "ring"] {
            assert_eq!(exact(&r, v, "pages_written"), PAGES, "{n} {v}");
            assert_eq!(exact(&r, v, "pages_dirty"), PAGES, "{n} {v}");
            for m in ["pages_dirty", "wp_faults", "collect_ioctls"] {
                assert_eq!(exact(&model, v, m), exact(&r, v, m), "{n} {v}.{m}");
            }
            // Each vCPU's own rate is its share of the total's: with n of them, at most the
            // total, and the total at least the slowest vCPU's share.
            let (total, each) = (
                metric(&r, v, "total_pages_per_ms"),
                metric(&r, v, "vcpu_pages_per_ms"),
            );
            assert!(
                each <= total * 1.001 && each * n as f64 >= total * 0.999,
                "{n} {v}: {each} of {total}"
            );
        }
        let per_vcpu = PAGES / n;
        let full = per_vcpu / 960;
        assert_eq!(exact(&r, "ring", "ring_full_exits"), full * n, "{n}");
        assert_eq!(exact(&r, "ring", "wp_faults"), PAGES + full * n, "{n}");
        assert_eq!(exact(&r, "bitmap", "wp_faults"), PAGES, "{n}");
        // The run's own vCPU threads are in its noise record: on a host with fewer cores
        // they wait for each other, which must not read as another process (the busy rule
        // would then refuse every many-vCPU verdict and validation).
        let noise = &r["noise"];
        let own = noise["own_threads"].as_u64().unwrap_or(1);
        assert_eq!(own, n, "{noise}");
        let cores = noise["cores"].as_u64().unwrap();
        if n > cores {
            let reasons = noise["busy"].as_array().unwrap();
            assert!(
                reasons.iter().all(|b| b["kind"] != "pressure"),
                "{n} vCPUs on {cores} cores: their own waiting called busy: {noise}"
            );
        }
    }
}

#[test]
fn more_vcpus_than_the_host_allows_exit_2_before_any_vm() {
    let Some(_kvm) = kvm_or_skip("dirty_vcpus_cap") else {
        return;
    };
    let (_dir, db) = common::db();
    let out = common::run(
        &db,
        &["run", "dirty", "--no-store", "--set", "vcpus=100000"],
    );
    assert_exit(&out, 2, &["vcpus", "KVM_CAP_MAX_VCPUS", "choose vcpus <="]);
    assert!(out.stdout.is_empty());
}

fn hugetlb_pool(dir: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/{dir}/nr_hugepages"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

#[test]
fn the_log_counts_exactly_on_shmem_and_hugetlb_and_refuses_guest_memfd() {
    let Some(_kvm) = kvm_or_skip("dirty_backings") else {
        return;
    };
    let pool_before = hugetlb_pool("hugepages-2048kB");
    for backing in ["shmem", "hugetlb-2m"] {
        let r = dirty("kvm", &[&format!("backing={backing}")], &["bitmap", "ring"]);
        for v in ["bitmap", "ring"] {
            let status = common::variant(&r, v)["status"]
                .as_str()
                .unwrap()
                .to_string();
            if backing == "hugetlb-2m" && status.starts_with("unsupported: ") {
                // A host whose memory cannot give 16 huge pages says so; nothing else may.
                assert!(status.contains("hugepages-2048kB"), "{status}");
                continue;
            }
            // Logged in 4 KiB pages whatever backs them: one fault and one dirty page each.
            assert_eq!(exact(&r, v, "pages_dirty"), PAGES, "{backing} {v}");
            assert_eq!(exact(&r, "bitmap", "wp_faults"), PAGES, "{backing}");
        }
    }
    assert_eq!(hugetlb_pool("hugepages-2048kB"), pool_before);
    // guest_memfd cannot be logged: asked alone, every variant is unsupported, exit 3.
    let (_dir, db) = common::db();
    let out = common::run(
        &db,
        &["run", "dirty", "--no-store", "--set", "backing=gmem"],
    );
    assert_exit(&out, 3, &["guest_memfd", "KVM_MEM_LOG_DIRTY_PAGES"]);
}
