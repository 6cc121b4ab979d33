//! The command line (clap) and dispatch. This is the only layer that prints.

mod progress;
mod render;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::backend::{Backend, BackendKind};
use crate::error::{Error, InputError};
use crate::kvm::host::{self, HostInfo};
use crate::kvm::trace::{self, Until};
use crate::kvm::{KvmBackend, KvmError};
use crate::record::RunRecord;
use crate::scenario::runner::{DEFAULT_SEED, RunRequest};
use crate::scenario::{self, ScenarioInfo};
use crate::store::{self, Store};
use progress::TermProgress;

/// hvlab — the hypervisor fast-path lab: where does virtualization cost time on this host, did a
/// kernel or policy change make it worse, and what would a fix buy?
#[derive(Debug, Parser)]
#[command(name = "hvlab", version, about, long_about = None)]
pub struct Cli {
    /// Results database [default: $HVLAB_DB, else $XDG_DATA_HOME/hvlab/hvlab.db]
    #[arg(long, global = true, value_name = "PATH")]
    db: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// What this host is: kernel, KVM flavour, paging, vPMU, HZ, capabilities
    Host {
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
    },
    /// Scenarios with their variants, parameters, metrics and backends
    List {
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
    },
    /// Run one scenario and store the result
    Run(RunArgs),
    /// The main job: every scenario on every backend this host supports, stored
    Suite(SuiteArgs),
    /// Stored runs, newest first
    Runs {
        /// How many
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
    },
    /// Reprint a stored run (by id, or any unique part of it)
    Show {
        /// Run id or a unique part of it
        run: String,
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
        /// Include KVM statistics
        #[arg(short, long)]
        verbose: bool,
    },
    /// Attribute an external VMM's KVM ioctl latencies: hvlab trace -- CMD ARGS...
    Trace(TraceArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Scenario (see `hvlab list`)
    scenario: String,
    /// Backend
    #[arg(long, value_enum, default_value_t = BackendKind::Kvm)]
    backend: BackendKind,
    /// Variant to run (repeatable); default: all
    #[arg(long = "variant", value_name = "V")]
    variants: Vec<String>,
    /// Scenario parameter key=value (repeatable), see `hvlab list`
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    #[command(flatten)]
    measure: MeasureArgs,
    /// Include KVM statistics in the terminal output
    #[arg(short, long)]
    verbose: bool,
}

#[derive(Debug, Args)]
struct MeasureArgs {
    /// Measured repetitions per variant [default: the scenario's, see `hvlab list`]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    reps: Option<u32>,
    /// Discarded warm-up repetitions per variant [default: the scenario's]
    #[arg(long)]
    warmup: Option<u32>,
    /// Seed for resampling (same seed, same intervals)
    #[arg(long, default_value_t = DEFAULT_SEED)]
    seed: u64,
    /// One JSON document on stdout; progress and logs on stderr
    #[arg(long)]
    json: bool,
    /// Do not store the run
    #[arg(long)]
    no_store: bool,
}

#[derive(Debug, Args)]
struct SuiteArgs {
    #[command(flatten)]
    measure: MeasureArgs,
}

#[derive(Debug, Args)]
struct TraceArgs {
    /// When to stop the command
    #[arg(long, value_enum, default_value_t = Until::FirstRun)]
    until: Until,
    /// Stop the command after this many seconds regardless
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Let the command's stdout through
    #[arg(long)]
    show_output: bool,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
    /// The command to trace
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Entry point: parses, dispatches, prints the error chain once and maps it to an exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                // thiserror's transparent wrappers repeat their inner message; print each once.
                if !e.to_string().contains(&s.to_string()) {
                    eprintln!("  caused by: {s}");
                }
                source = s.source();
            }
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(4))
        }
    }
}

fn print_json(value: &impl serde::Serialize) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, value).map_err(|e| Error::Output(e.into()))?;
    writeln!(out)?;
    Ok(())
}

fn print_text(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    Ok(())
}

fn dispatch(cli: Cli) -> Result<ExitCode, Error> {
    match cli.command {
        Command::Host { json } => {
            let h = host::probe();
            if json {
                print_json(&h)?;
            } else {
                print_text(&render::host(&h))?;
            }
            // Show everything first, then fail plainly when KVM is unusable.
            host::require_kvm(&h)?;
        }
        Command::List { json } => {
            let catalog = scenario::catalog();
            if json {
                print_json(&serde_json::json!({ "scenarios": catalog }))?;
            } else {
                print_text(&render::list(&catalog))?;
            }
        }
        Command::Run(args) => {
            let info = scenario::find(&args.scenario)?;
            let request = request_of(info, &args.measure, args.variants, args.sets);
            scenario::check(info, &request)?;
            let mut backend = make_backend(args.backend, host::probe())?;
            let record = run_one(info, backend.as_mut(), &request, args.measure.json)?;
            store_run(cli.db.as_deref(), &record, args.measure.no_store)?;
            if args.measure.json {
                print_json(&record)?;
            } else {
                print_text(&render::run(&record, args.verbose))?;
            }
        }
        Command::Suite(args) => suite(cli.db.as_deref(), &args)?,
        Command::Runs { limit, json } => {
            let store = Store::open(&store::resolve_path(cli.db.as_deref())?)?;
            let list = store.list(limit)?;
            if json {
                print_json(&serde_json::json!({ "runs": list }))?;
            } else {
                print_text(&render::runs(&list))?;
            }
        }
        Command::Show { run, json, verbose } => {
            let store = Store::open(&store::resolve_path(cli.db.as_deref())?)?;
            let record = store.load(&run)?;
            if json {
                print_json(&record)?;
            } else {
                print_text(&render::run(&record, verbose))?;
            }
        }
        Command::Trace(args) => {
            let h = host::probe();
            let report = trace::trace(
                &args.command,
                args.until,
                Duration::from_secs(args.timeout),
                args.show_output,
                h.jiffy_ns(),
            )?;
            if args.json {
                print_json(&report)?;
            } else {
                print_text(&render::trace(&report))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn request_of(
    info: &ScenarioInfo,
    m: &MeasureArgs,
    variants: Vec<String>,
    sets: Vec<String>,
) -> RunRequest {
    RunRequest {
        variants,
        sets,
        reps: m.reps.unwrap_or(info.default_reps),
        warmup: m.warmup.unwrap_or(info.default_warmup),
        seed: m.seed,
    }
}

fn make_backend(kind: BackendKind, host: HostInfo) -> Result<Box<dyn Backend>, Error> {
    match kind {
        BackendKind::Kvm => Ok(Box::new(KvmBackend::new(host)?)),
        BackendKind::Model => Err(InputError::Other(
            "the model backend is not built yet; run with --backend kvm".into(),
        )
        .into()),
    }
}

fn run_one(
    info: &ScenarioInfo,
    backend: &mut dyn Backend,
    request: &RunRequest,
    json: bool,
) -> Result<RunRecord, Error> {
    let progress = TermProgress::new(info.name, json);
    scenario::run(info, backend, request, &progress)
}

fn store_run(db: Option<&std::path::Path>, record: &RunRecord, skip: bool) -> Result<(), Error> {
    if skip {
        return Ok(());
    }
    let path = store::resolve_path(db)?;
    Store::open(&path)?.save(record)?;
    eprintln!("stored run {} in {}", record.run_id, path.display());
    Ok(())
}

fn suite(db: Option<&std::path::Path>, args: &SuiteArgs) -> Result<(), Error> {
    let h = host::probe();
    let mut records = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    for info in scenario::catalog() {
        for kind in info.backends {
            let mut backend = match make_backend(*kind, h.clone()) {
                Ok(b) => b,
                Err(Error::Kvm(e)) if e.is_host_limitation() => {
                    skipped.push(format!("{} on {kind}: {e}", info.name));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let request = request_of(info, &args.measure, Vec::new(), Vec::new());
            let record = run_one(info, backend.as_mut(), &request, args.measure.json)?;
            store_run(db, &record, args.measure.no_store)?;
            if !args.measure.json {
                print_text(&render::run(&record, false))?;
                print_text("")?;
            }
            records.push(record);
        }
    }
    if args.measure.json {
        print_json(&serde_json::json!({ "runs": records, "skipped": skipped }))?;
    } else {
        for s in &skipped {
            eprintln!("skipped {s}");
        }
        print_text(&format!(
            "suite: {} run(s) on {} ({}), {} skipped",
            records.len(),
            h.kernel,
            h.kvm_flavour,
            skipped.len()
        ))?;
    }
    if records.is_empty() {
        return Err(KvmError::DeviceMissing(crate::kvm::kvm_device_path()).into());
    }
    Ok(())
}
