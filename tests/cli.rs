//! The tool end to end without timing on KVM: the command line, bad input, stores (SQLite,
//! PostgreSQL), reports in Chromium, sweeps, shards, the model, the fake backend. One binary
//! (one link of the whole crate) whose tests run in parallel; the few that start a guest
//! check exact counts or exit codes, not times, and take their turn on KVM.

mod common;

mod adversarial;
mod cli_errors;
mod cli_habits;
mod clocks;
mod fake_backend;
mod fleet;
mod fuzz_inputs;
mod hangs;
mod import_graph;
mod kernel_source;
mod model;
mod recovery;
mod report;
mod safe_io;
mod selection;
mod shard_env;
mod shard_examples;
mod slurm_cluster;
mod store_postgres;
mod store_sqlite;
mod sweep_cli;
mod toy_scenario;

/// With `autotests = false`, a test file no root names would never build or run: every file
/// in tests/ is one of the three roots or a module one of them declares (`mod name;`, which
/// resolves to tests/name.rs beside the root).
#[test]
fn every_test_file_is_in_a_test_binary() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let roots = ["cli.rs", "kvm.rs", "kernels.rs"];
    let included: String = roots
        .iter()
        .map(|r| std::fs::read_to_string(dir.join(r)).expect("read a test root"))
        .collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("read tests/") {
        let name = entry.expect("a tests/ entry").file_name();
        let name = name.to_string_lossy().into_owned();
        if name.ends_with(".rs")
            && !roots.contains(&name.as_str())
            && !included.contains(&format!("mod {};", name.trim_end_matches(".rs")))
        {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "tests/{missing:?} are in no test binary: add each to tests/cli.rs, kvm.rs or kernels.rs"
    );
}
