//! The tool end to end without timing on KVM: the command line, bad input, stores (SQLite,
//! PostgreSQL), reports in Chromium, sweeps, shards, the model, the fake backend. One binary
//! (one link of the whole crate) whose tests run in parallel; the few that start a guest
//! check exact counts or exit codes, not times, and take their turn on KVM.

mod common;

#[path = "adversarial.rs"]
mod adversarial;
#[path = "cli_errors.rs"]
mod cli_errors;
#[path = "cli_habits.rs"]
mod cli_habits;
#[path = "fake_backend.rs"]
mod fake_backend;
#[path = "fleet.rs"]
mod fleet;
#[path = "fuzz_inputs.rs"]
mod fuzz_inputs;
#[path = "hangs.rs"]
mod hangs;
#[path = "import_graph.rs"]
mod import_graph;
#[path = "model.rs"]
mod model;
#[path = "recovery.rs"]
mod recovery;
#[path = "report.rs"]
mod report;
#[path = "safe_io.rs"]
mod safe_io;
#[path = "selection.rs"]
mod selection;
#[path = "shard_env.rs"]
mod shard_env;
#[path = "shard_examples.rs"]
mod shard_examples;
#[path = "slurm_cluster.rs"]
mod slurm_cluster;
#[path = "store_postgres.rs"]
mod store_postgres;
#[path = "store_sqlite.rs"]
mod store_sqlite;
#[path = "sweep_cli.rs"]
mod sweep_cli;
#[path = "toy_scenario.rs"]
mod toy_scenario;

/// With `autotests = false`, a test file no root names would never build or run: every file
/// in tests/ is one of the three roots or included by one of them.
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
            && !included.contains(&format!("#[path = \"{name}\"]"))
        {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "tests/{missing:?} are in no test binary: add each to tests/cli.rs, kvm.rs or kernels.rs"
    );
}
