//! The memory scenario on real /dev/kvm: stage-2 fault counts are exact, times are compared as
//! ratios with wide margins.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)] // test code: a panic is the failure report

use crate::common;

use common::kvm_or_skip;
use serde_json::Value;

const PAGES: f64 = 16384.0; // 64 MiB

fn memory(sets: &[&str], variants: &[&str]) -> Value {
    let mut all = vec!["size=64MiB"];
    all.extend(sets);
    common::scenario_json("memory", &all, variants, &["--reps", "2", "--warmup", "0"])
}

fn metric(r: &Value, variant: &str, name: &str) -> f64 {
    let v = r["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == variant)
        .unwrap();
    assert_eq!(v["status"], "ok", "{variant}: {}", v["status"]);
    v["metrics"][name]["median"]
        .as_f64()
        .unwrap_or_else(|| panic!("{variant} has no {name}: {}", v["metrics"]))
}

fn within(actual: f64, expected: f64, tolerance: f64) -> bool {
    (actual - expected).abs() <= expected * tolerance
}

#[test]
fn populated_memory_faults_once_per_prefetch_group_and_lazy_once_per_page() {
    let Some(_kvm) = kvm_or_skip("memory_prefetch") else {
        return;
    };
    let r = memory(&[], &["lazy", "populated"]);
    let lazy = metric(&r, "lazy", "kvm.vcpu.pf_fixed");
    let populated = metric(&r, "populated", "kvm.vcpu.pf_fixed");
    if r["host"]["tdp_mmu"] == true && r["host"]["tdp"] == true {
        // The TDP MMU does not prefetch: both fault once per page, plus once per page of the
        // guest's own page tables (guest memory too, with TDP), exactly.
        let tables = metric(&r, "lazy", "guest_table_pages");
        assert_eq!(populated, PAGES + tables, "TDP MMU populated pf_fixed");
        assert_eq!(lazy, PAGES + tables, "TDP MMU lazy pf_fixed");
    } else {
        assert!(
            within(populated, PAGES / 8.0, 0.02),
            "populated pf_fixed {populated}, pages {PAGES}"
        );
    }
    assert!(within(lazy, PAGES, 0.02), "lazy pf_fixed {lazy}");
    let (lazy_ns, pop_ns) = (
        metric(&r, "lazy", "ns_per_page"),
        metric(&r, "populated", "ns_per_page"),
    );
    // Measured here: ~7.5×. A host fault per page cannot be cheap.
    assert!(
        lazy_ns > 2.0 * pop_ns,
        "lazy {lazy_ns} ns/page vs populated {pop_ns}"
    );
    let finding = r["variants"][1]["findings"][0]["message"].as_str().unwrap();
    assert!(
        finding.contains("pages mapped per stage-2 fault"),
        "{finding}"
    );
}

#[test]
fn prefetch_groups_do_not_depend_on_the_touch_order() {
    let Some(_kvm) = kvm_or_skip("memory_random") else {
        return;
    };
    let r = memory(&["pattern=random"], &["populated"]);
    if r["host"]["tdp"] == true {
        return; // the order-independence claim is about the prefetching MMUs
    }
    let populated = metric(&r, "populated", "kvm.vcpu.pf_fixed");
    assert!(
        within(populated, PAGES / 8.0, 0.02),
        "random-order populated pf_fixed {populated}"
    );
}

#[test]
fn userfaultfd_serves_one_fault_per_window() {
    let Some(_kvm) = kvm_or_skip("memory_uffd") else {
        return;
    };
    let r = memory(&["window=8"], &["uffd", "uffd-prefetch"]);
    let one = metric(&r, "uffd", "uffd_faults");
    let eight = metric(&r, "uffd-prefetch", "uffd_faults");
    assert!(within(one, PAGES, 0.02), "uffd faults {one}");
    assert!(
        within(eight, PAGES / 8.0, 0.02),
        "uffd-prefetch faults {eight}"
    );
    let (slow, fast) = (
        metric(&r, "uffd", "ns_per_page"),
        metric(&r, "uffd-prefetch", "ns_per_page"),
    );
    assert!(
        slow > 2.0 * fast,
        "uffd {slow} ns/page vs uffd-prefetch {fast}"
    );
}

#[test]
fn stride_touches_every_kth_page_and_4k_guest_pages_work() {
    let Some(_kvm) = kvm_or_skip("memory_stride_4k") else {
        return;
    };
    let r = memory(&["pattern=stride=4", "guest_page=4k"], &["lazy"]);
    assert_eq!(metric(&r, "lazy", "kvm.vcpu.pf_fixed"), PAGES / 4.0);
}

#[test]
fn variants_the_host_lacks_say_what_is_missing() {
    let Some(_kvm) = kvm_or_skip("memory_unsupported") else {
        return;
    };
    // Asked alone, an unsupported variant leaves nothing to run: exit 3 with the reason on
    // stderr and no JSON; on a host with the capability it runs.
    let dir = tempfile::tempdir().unwrap();
    let out = common::run(
        &dir.path().join("hvlab.db"),
        &[
            "run",
            "memory",
            "--set",
            "size=16MiB",
            "--variant",
            "prefault",
            "--reps",
            "2",
            "--warmup",
            "0",
            "--json",
        ],
    );
    if out.status.code() == Some(3) {
        let err = common::stderr(&out);
        assert!(
            err.contains(
                "prefault: unsupported: needs KVM_CAP_PRE_FAULT_MEMORY, which this host's KVM does not offer"
            ),
            "{err}"
        );
        assert!(out.stdout.is_empty());
    } else {
        let r = common::json(&out);
        assert_eq!(r["host"]["capabilities"]["KVM_CAP_PRE_FAULT_MEMORY"], true);
        assert_eq!(r["variants"][0]["status"], "ok");
    }
}

#[test]
fn two_and_eight_vcpus_each_fault_their_own_slice_once_per_page() {
    let Some(_kvm) = kvm_or_skip("memory_vcpus") else {
        return;
    };
    for n in ["2", "8"] {
        let set = format!("vcpus={n}");
        let r = memory(&[&set], &["lazy"]);
        // Every page once, whichever vCPU touched it: the vCPUs' pf_fixed summed. Shadow
        // paging reads the guest's tables through the host mapping; TDP faults on them too.
        let tables = if r["host"]["tdp"] == true {
            metric(&r, "lazy", "guest_table_pages")
        } else {
            0.0
        };
        assert_eq!(
            metric(&r, "lazy", "kvm.vcpu.pf_fixed"),
            PAGES + tables,
            "vcpus={n}"
        );
        // The mean vCPU's rate is its slice over its own time, so the total is at least that
        // (the slowest vCPU's time bounds the pass) and at most n times it.
        let (total, each) = (
            metric(&r, "lazy", "total_pages_per_ms"),
            metric(&r, "lazy", "vcpu_pages_per_ms"),
        );
        let k: f64 = n.parse().unwrap();
        assert!(
            total <= k * each * 1.001 && total >= each * 0.999,
            "vcpus={n}: total {total} pages/ms, per vCPU {each}"
        );
    }
}

#[test]
fn more_vcpus_than_the_host_allows_is_refused_naming_the_cap() {
    let Some(_kvm) = kvm_or_skip("memory_vcpus_cap") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = common::run(
        &dir.path().join("hvlab.db"),
        &["run", "memory", "--set", "vcpus=100000", "--json"],
    );
    common::assert_exit(&out, 2, &["vcpus", "KVM_CAP_MAX_VCPUS", "choose vcpus <="]);
    assert!(out.stdout.is_empty());
}

fn hugetlb_pool(dir: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/{dir}/nr_hugepages"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
}

#[test]
fn every_backing_runs_with_exact_counts_or_says_why_not() {
    let Some(_kvm) = kvm_or_skip("memory_backings") else {
        return;
    };
    let pool_before = hugetlb_pool("hugepages-2048kB");
    let r = memory(
        &["window=8"],
        &[
            "shmem",
            "hugetlb-2m",
            "hugetlb-1g",
            "gmem",
            "uffd-minor",
            "uffd-minor-hugetlb",
        ],
    );
    let tdp = r["host"]["tdp"] == true;
    let mut ran = 0;
    for v in r["variants"].as_array().unwrap() {
        let (name, status) = (v["name"].as_str().unwrap(), v["status"].as_str().unwrap());
        if status != "ok" {
            // Unsupported with a reason, never a bare failure.
            assert!(status.starts_with("unsupported: "), "{name}: {status}");
            assert!(
                status.len() > "unsupported: ".len() + 10,
                "{name}: {status}"
            );
            continue;
        }
        ran += 1;
        let tables = if tdp {
            metric(&r, name, "guest_table_pages")
        } else {
            0.0
        };
        let fixed = metric(&r, name, "kvm.vcpu.pf_fixed");
        match name {
            // Lazy 4 KiB file pages: one fault per page (no neighbour is present).
            "shmem" | "gmem" => assert_eq!(fixed, PAGES + tables, "{name}"),
            // 2 MiB host pages under 2 MiB guest pages: one fault per huge page.
            "hugetlb-2m" => {
                assert_eq!(fixed, PAGES / 512.0 + tables, "{name}");
                // Grown by what the 32 pages lacked, no more.
                let (before, during) = (
                    metric(&r, name, "hugetlb_pool_before"),
                    metric(&r, name, "hugetlb_pool_during"),
                );
                assert!(
                    during >= before && during <= before + 32.0,
                    "{before} -> {during}"
                );
            }
            // The page cache is full: one MINOR fault per window, UFFDIO_CONTINUE maps it.
            "uffd-minor" => assert_eq!(metric(&r, name, "uffd_faults"), PAGES / 8.0),
            // On hugetlbfs the fault and the CONTINUE are a whole 2 MiB page, and stage 2
            // maps it whole; the pool is reserved and set back as for hugetlb-2m.
            "uffd-minor-hugetlb" => {
                assert_eq!(metric(&r, name, "uffd_faults"), PAGES / 512.0);
                assert_eq!(fixed, PAGES / 512.0 + tables, "{name}");
                assert!(metric(&r, name, "hugetlb_pool_during") >= 32.0);
            }
            _ => {}
        }
    }
    // shmem and uffd-minor need nothing a Linux 5.14+ host lacks.
    assert!(ran >= 2, "{}", r["variants"]);
    // 64 MiB is no whole 1 GiB page.
    let one_gib = common::variant(&r, "hugetlb-1g")["status"]
        .as_str()
        .unwrap();
    assert!(
        one_gib.contains("multiple of 1024 MiB") || one_gib.contains("it has:"),
        "{one_gib}"
    );
    // The pool is back to the size it had.
    assert_eq!(hugetlb_pool("hugepages-2048kB"), pool_before);
}
