//! Property test: random `--set` values and random profile TOML fed to the parsers
//! in-process. Nothing panics; every rejection is bad input (exit 2) and names the key.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::sync::atomic::{AtomicUsize, Ordering};

use hvlab::Error;
use hvlab::model::ModelError;
use hvlab::model::profile::{BUILT_IN, Profile};
use hvlab::scenario::runner::RunRequest;
use hvlab_core::BackendKind;
use proptest::prelude::*;

const SET_CASES: u32 = 60_000;
const PROFILE_CASES: u32 = 60_000;

static SET_TRIED: AtomicUsize = AtomicUsize::new(0);
static SET_RIGHT: AtomicUsize = AtomicUsize::new(0);
static PROFILE_TRIED: AtomicUsize = AtomicUsize::new(0);
static PROFILE_RIGHT: AtomicUsize = AtomicUsize::new(0);

/// Values a user might type: numbers of every shape, sizes, words, lists, junk.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        (0u64..5000).prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| v.to_string()),
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("-inf".to_string()),
        Just(String::new()),
        (
            0u64..100_000,
            prop::sample::select(vec![
                "", "k", "KiB", "M", "MiB", "G", "GiB", "T", "TiB", "B", "XB"
            ])
        )
            .prop_map(|(n, u)| format!("{n}{u}")),
        prop::sample::select(vec![
            "seq",
            "reverse",
            "random",
            "stride=3",
            "stride=0",
            "read",
            "write",
            "first-byte",
            "whole-page",
            "4k",
            "2m",
            "mlock",
            "io_uring",
            "per-task",
            "per-cpu",
            "always-defer",
            "always-sync",
            "lifecycle-keyed",
            "lazy",
            "0",
            "3",
            "-1",
        ])
        .prop_map(String::from),
        prop::collection::vec(
            prop::sample::select(vec![
                "create-vm",
                "tss",
                "irqchip",
                "pit",
                "memslot",
                "vcpus",
                "ioeventfds",
                "run",
                "",
                "irq",
                " run ",
            ]),
            0..10
        )
        .prop_map(|steps| steps.join(",")),
        "\\PC{0,12}",
    ]
}

fn scenario() -> impl Strategy<Value = &'static hvlab::scenario::ScenarioInfo> {
    prop::sample::select(hvlab::scenario::catalog())
}

/// A key: mostly the scenario's own, sometimes another scenario's or junk.
fn key(info: &'static hvlab::scenario::ScenarioInfo) -> impl Strategy<Value = String> {
    let own: Vec<String> = hvlab::scenario::Kind::named(info.name)
        .map(|k| k.param_infos())
        .unwrap_or_default()
        .iter()
        .map(|p| p.name.to_string())
        .collect();
    prop_oneof![
        4 => prop::sample::select(own),
        1 => "[a-z_.]{1,10}",
    ]
}

fn sets() -> impl Strategy<
    Value = (
        &'static hvlab::scenario::ScenarioInfo,
        Vec<(String, String)>,
    ),
> {
    scenario().prop_flat_map(|info| {
        (
            Just(info),
            prop::collection::vec((key(info), value()), 1..4),
        )
    })
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn report(what: &str, tried: &AtomicUsize, right: &AtomicUsize) {
    use std::io::Write;
    let _ = writeln!(
        std::io::stderr(),
        "\n*** {what}: {} cases tried, {} right ***\n",
        tried.load(Ordering::Relaxed),
        right.load(Ordering::Relaxed)
    );
}

#[test]
fn random_set_values_are_accepted_or_refused_as_bad_input_naming_the_key() {
    let mut runner = proptest::test_runner::TestRunner::new(config(SET_CASES));
    let result = runner.run(
        &(sets(), any::<bool>(), any::<bool>()),
        |((info, pairs), model, raw_syntax)| {
            SET_TRIED.fetch_add(1, Ordering::Relaxed);
            let mut sets: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            if raw_syntax {
                // Sometimes no `=` at all.
                sets.push(pairs[0].1.replace('=', ""));
            }
            let backend = if model {
                BackendKind::Model
            } else {
                BackendKind::Kvm
            };
            // Read at the edge as `hvlab run` reads it, then checked as it checks it.
            let checked = hvlab::scenario::Kind::named(info.name)
                .and_then(|k| k.parse(&sets, backend.capabilities()))
                .and_then(|p| hvlab::scenario::check(&RunRequest::new(p), backend));
            if let Err(e) = checked {
                let msg = e.to_string();
                let code = Error::from(e).exit_code();
                prop_assert_eq!(code, 2, "{}", msg);
                let named = pairs.iter().any(|(k, _)| msg.contains(k.as_str()))
                    || sets.iter().any(|s| msg.contains(s.as_str()));
                prop_assert!(named, "rejection names no key of {:?}: {}", sets, msg);
            }
            SET_RIGHT.fetch_add(1, Ordering::Relaxed);
            Ok(())
        },
    );
    report("--set fuzz", &SET_TRIED, &SET_RIGHT);
    result.unwrap();
}

const KEYS: &[&str] = &[
    "hz",
    "srcu_wakeup_ns",
    "first_vcpu_adds_memslot",
    "ioctl_create_vm_ns",
    "ioctl_memslot_ns",
    "stage2_fault_ns",
    "host_fault_huge_ns",
    "uffd_fault_ns",
    "exit_userspace_ns",
    "msr_load_entry_cycles",
    "pin_fixed_ns",
    "pebs_isolation",
    "pin_page_ns",
    "cpu_ghz",
    "store_forward_stall_cycles",
    "kernel_pgd_bytes",
    "ctx_switch_ns",
];

/// How to damage one cost table.
#[derive(Debug, Clone)]
enum Mutation {
    Value(String),
    RemoveTable,
    RemoveValueLine,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        6 => prop_oneof![
            any::<f64>().prop_map(|v| format!("{v:?}")),
            any::<i64>().prop_map(|v| v.to_string()),
            (-300i64..20_000).prop_map(|v| v.to_string()),
            (-2.0f64..12.0).prop_map(|v| format!("{v:?}")),
            prop::sample::select(vec![
                "nan", "inf", "-inf", "+nan", "0", "1", "2", "-0.0", "1e308", "\"250\"", "true",
                "[]", "{}", "250.5",
            ])
            .prop_map(String::from),
        ]
        .prop_map(Mutation::Value),
        1 => Just(Mutation::RemoveTable),
        1 => Just(Mutation::RemoveValueLine),
    ]
}

fn mutate(text: &str, key: &str, m: &Mutation) -> String {
    let header = format!("[costs.{key}]");
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with('[') {
            inside = line.trim() == header;
        }
        match (inside, m) {
            (true, Mutation::RemoveTable) => {}
            (true, Mutation::RemoveValueLine) if line.starts_with("value") => {}
            (true, Mutation::Value(v)) if line.starts_with("value") => {
                out.push(format!("value = {v}"));
            }
            _ => out.push(line.to_string()),
        }
    }
    out.join("\n")
}

#[test]
fn random_profile_toml_is_accepted_in_range_or_refused_naming_the_key() {
    let mut runner = proptest::test_runner::TestRunner::new(config(PROFILE_CASES));
    let result = runner.run(
        &(
            prop::sample::select(BUILT_IN.to_vec()),
            prop::sample::select(KEYS.to_vec()),
            mutation(),
            prop::option::weighted(0.02, 0usize..6000),
        ),
        |(base, key, m, cut)| {
            PROFILE_TRIED.fetch_add(1, Ordering::Relaxed);
            let mut text = mutate(base.1, key, &m);
            if let Some(at) = cut {
                // A truncated file (at a char boundary).
                let mut at = at.min(text.len());
                while !text.is_char_boundary(at) {
                    at -= 1;
                }
                text.truncate(at);
            }
            match Profile::parse("fuzz.toml", &text) {
                Ok(p) => {
                    // Accepted: every cost is finite and HZ is a real tick rate.
                    for c in p.costs.values() {
                        prop_assert!(c.value.is_finite());
                    }
                    let hz = p.get("hz", "test").unwrap();
                    prop_assert!((24.0..=10_000.0).contains(&hz), "hz {}", hz);
                }
                Err(e) => {
                    let msg = e.to_string();
                    let code = Error::from(ModelError::Profile(e)).exit_code();
                    prop_assert_eq!(code, 2, "{}", msg);
                    if cut.is_none() {
                        prop_assert!(
                            msg.contains(key),
                            "rejection does not name {}: {}",
                            key,
                            msg
                        );
                    }
                }
            }
            PROFILE_RIGHT.fetch_add(1, Ordering::Relaxed);
            Ok(())
        },
    );
    report("profile TOML fuzz", &PROFILE_TRIED, &PROFILE_RIGHT);
    result.unwrap();
}
