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
