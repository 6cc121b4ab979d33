//! The command line (clap) and dispatch: one module per command (or group of commands), each
//! a function of its parsed arguments; `dispatch` only routes. This is the only layer that
//! prints.

mod cache;
mod compare;
mod error;
pub mod habits;
mod inspect;
mod kernel;
mod man;
mod model;
mod paths;
mod progress;
// The terminal exporter renders; the command line prints what it renders.
use crate::export::terminal as render;
mod report;
mod run;
mod run_store;
mod suite;
mod sweep;
mod tracer;
mod transfer;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::error::InputError;
use crate::export::escape::terminal as safe;
use crate::scenario::runner::{DEFAULT_SEED, RunRequest};
use crate::scenario::{Params, ScenarioInfo};
use crate::trace;
pub use error::Error;
use hvlab_core::BackendKind;

/// hvlab — the hypervisor fast-path lab: where does virtualization cost time on this host, did a
/// kernel or policy change make it worse, and what would a fix buy?
#[derive(Debug, Parser)]
#[command(name = "hvlab", version = habits::VERSION, about, long_about = None, styles = habits::styles())]
pub struct Cli {
    /// Results store: an SQLite file, or a postgres://… URL for a shared PostgreSQL store
    /// [default: $HVLAB_DB, else $XDG_DATA_HOME/hvlab/hvlab.db]
    #[arg(long, global = true, value_name = "PATH|URL")]
    db: Option<PathBuf>,
    /// No progress bars or notes on stderr: results, warnings and errors only
    #[arg(short, long, global = true)]
    quiet: bool,
    /// Colour: auto (on a terminal, unless NO_COLOR is set), always, or never
    #[arg(long, global = true, value_enum, value_name = "WHEN", default_value_t = clap::ColorChoice::Auto)]
    color: clap::ColorChoice,
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
    Run(run::RunArgs),
    /// The main job: every scenario on every backend this host supports, stored
    Suite(suite::SuiteArgs),
    /// One scenario over a grid of parameters (and variants): one stored run per point
    Sweep(sweep::SweepArgs),
    /// Stored runs, newest first: your own (internal runs of validate and the suite's
    /// showcases with --all), with their parameters, profile and sweep or suite
    Runs(inspect::RunsArgs),
    /// Stored sweeps, newest first: id, scenario, backend, points
    Sweeps {
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
    },
    /// Reprint a stored run (by id, or any unique part of it)
    Show(inspect::ShowArgs),
    /// Attribute an external VMM's KVM ioctl latencies: hvlab trace -- CMD ARGS...
    Trace(tracer::TraceArgs),
    /// Boot a kernel under test in QEMU, run hvlab there, bring its runs back:
    /// hvlab vm --kernel debian:6.12 -- run lifecycle
    Vm(kernel::VmArgs),
    /// A/B of two kernels under test: boots them alternately, runs the scenarios, judges counts
    /// exactly and jiffies with the rank test (times only with kvm acceleration)
    Kab(kernel::KabArgs),
    /// What hvlab's kernel cache holds (sources, builds, kernels, logs: size and last use);
    /// `prune` the least recently used, `verify` the sources against their checksums
    Cache(cache::CacheArgs),
    /// The first commit of a series whose verdict for a variant differs from GOOD's (git
    /// bisect on a noisy host): hvlab bisect debian:7.3 debian:7.3+v3.mbox --variant V
    Bisect(kernel::BisectArgs),
    /// One commit against GOOD as a `git bisect run` step: exit 0 like GOOD, 1 changed as
    /// sought, 125 does not build or not decided; NO CHANGE without booting when the object
    /// code is identical: git bisect run hvlab judge git:$PWD@v7.3 --variant V
    Judge(kernel::BisectStepArgs),
    /// A/B verdict: B against A, each a run, RUN:variant, or runs joined by commas; or each a
    /// host selector (key=value terms joined by commas over kernel, cpu, flavour, hz, backend,
    /// e.g. kernel=6.18,cpu=EPYC), compared per matched host and overall
    Compare(compare::CompareArgs),
    /// Write a self-contained HTML report (and a Markdown summary) of stored runs
    Report(report::ReportArgs),
    /// Ingest per-shard SQLite results files into the store (--db), idempotently
    Merge(transfer::MergeArgs),
    /// Write stored runs for another site (one run record per line)
    Export(transfer::ExportArgs),
    /// Store the runs of an export (`hvlab export`), idempotently
    Import(transfer::ImportArgs),
    /// Measure this host's cost profile for the model (with the kvm backend)
    Calibrate(model::CalibrateArgs),
    /// The model against the five kernel threads: each published setup on the model beside the
    /// figures the thread reports, each judged within or outside the thread's range (fitted
    /// rows shown apart), and the model's predictions of the patches stored kabs measured;
    /// exit 1 when a judged figure is outside
    Fidelity(model::FidelityArgs),
    /// Print a shell completion script: hvlab completions bash > /etc/bash_completion.d/hvlab
    Completions {
        /// The shell
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print a man page (roff): hvlab man | man -l -, hvlab man run; or write them all: --dir DIR
    Man(man::ManArgs),
    /// The model against the kvm backend on this host, metric by metric; exit 1 beyond tolerance
    Validate(model::ValidateArgs),
}

#[derive(Debug, Args)]
struct MeasureArgs {
    /// Measured repetitions per variant [default: the scenario's, see `hvlab list`]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    reps: Option<u32>,
    /// Discarded warm-up repetitions per variant [default: the scenario's]
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=100_000))]
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
    /// Cost profile for --backend model: a built-in name or a TOML path [default: the
    /// calibrated this-host profile, else the built-in closest to this host]
    #[arg(long, value_name = "NAME|PATH")]
    profile: Option<String>,
    #[command(flatten)]
    interference: InterferenceArgs,
}

impl MeasureArgs {
    /// The store the runs go to (none with `--no-store`), opened and checked for writing
    /// before anything is measured, so a bad `--db` costs no run.
    fn run_store(
        &self,
        db: Option<&std::path::Path>,
    ) -> Result<Option<run_store::RunStore>, Error> {
        if self.no_store {
            Ok(None)
        } else {
            run_store::RunStore::open(db, self.json).map(Some)
        }
    }
}

/// Interference control: where the measuring threads run and whether to wait for a quiet host.
#[derive(Debug, Args, Default)]
struct InterferenceArgs {
    /// Pin the VMM and vCPU threads to these CPUs (sched_setaffinity), e.g. 1 or 0,2 or 0-1
    #[arg(long, value_name = "LIST")]
    cpu: Option<String>,
    /// Before measuring, wait until the 1-minute load is below the core count, at most WAIT
    /// (1s to 1h, e.g. 30s, 2m) [default when given without a value: 60s]
    #[arg(long, value_name = "WAIT", num_args = 0..=1, default_missing_value = "60s", require_equals = true)]
    quiet_host: Option<String>,
}

impl InterferenceArgs {
    /// Checks both options (bad input: exit 2), before anything is measured.
    fn check(&self) -> Result<(Option<Vec<usize>>, Option<Duration>), Error> {
        let cpus = self
            .cpu
            .as_deref()
            .map(|text| {
                hvlab_host::noise::parse_cpu_list(text).map_err(|why| InputError::BadValue {
                    key: "--cpu".into(),
                    value: text.into(),
                    why,
                })
            })
            .transpose()?;
        let wait = self
            .quiet_host
            .as_deref()
            .map(|text| {
                hvlab_host::noise::parse_wait(text).map_err(|why| InputError::BadValue {
                    key: "--quiet-host".into(),
                    value: text.into(),
                    why,
                })
            })
            .transpose()?;
        Ok((cpus, wait))
    }

    /// Pins this thread (and so every thread the backend starts) and waits for a quiet host,
    /// saying what it did on stderr; both are recorded in every run's noise.
    fn apply(&self) -> Result<(), Error> {
        let (cpus, wait) = self.check()?;
        if let Some(cpus) = cpus {
            hvlab_host::noise::pin_to(&cpus).map_err(|e| InputError::BadValue {
                key: "--cpu".into(),
                value: self.cpu.clone().unwrap_or_default(),
                why: format!(
                    "the kernel refused the CPU set: {e}; the allowed CPUs are {}",
                    hvlab_host::noise::format_cpu_list(&hvlab_host::noise::allowed_cpus())
                ),
            })?;
            hvlab_host::noise::note_pinned(&cpus);
            eprintln!(
                "pinned the VMM and vCPU threads to CPU {}",
                hvlab_host::noise::format_cpu_list(&cpus)
            );
        }
        if let Some(limit) = wait {
            let cores = hvlab_host::noise::online_cpus();
            let w = hvlab_host::noise::wait_for_quiet(limit);
            hvlab_host::noise::note_quiet_wait(w);
            if w.quiet {
                eprintln!(
                    "quiet host: load {:.1} below {cores} cores after waiting {:.0} s",
                    w.load1, w.waited_s
                );
            } else {
                eprintln!(
                    "host still busy after waiting {:.0} s (load {:.1} on {cores} cores): measuring anyway; the run carries the busy-host warning",
                    w.waited_s, w.load1
                );
            }
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
struct ShardArgs {
    /// Run shard i of N, counting from 1 (e.g. 2/3) [default: the Slurm array task or
    /// Kubernetes completion index in the environment, else the whole job]
    #[arg(long, value_name = "i/N")]
    shard: Option<String>,
    /// Number of shards of a Kubernetes Indexed Job (its spec.completions), with
    /// JOB_COMPLETION_INDEX [default: $HVLAB_SHARD_COUNT]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    shard_count: Option<u32>,
}

/// Entry point: parses, dispatches, prints the error chain once and maps it to an exit code.
pub fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == trace::SHIM_ARG) {
        return ExitCode::from(u8::try_from(trace::shim(&args[2..])).unwrap_or(127));
    }
    // clap's own help and errors follow --color too, so it is read before parsing.
    let color = habits::color_in(&args);
    habits::apply_color(color);
    let matches = <Cli as clap::CommandFactory>::command()
        .color(color)
        .get_matches_from(args);
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    habits::set_quiet(cli.quiet);
    match dispatch(cli) {
        Ok(code) => code,
        // A reader that stopped early (`| head`) is not an error worth a message, as for
        // any Unix filter.
        Err(Error::Output(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            let chain = e.chain();
            eprintln!("error: {}", safe(&chain[0]));
            for cause in &chain[1..] {
                eprintln!("  caused by: {}", safe(cause));
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

/// Every line of text output goes through here: control characters in it (imported names may
/// carry ESC/OSC sequences) are shown escaped, never sent to the terminal.
fn print_text(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", safe(text))?;
    Ok(())
}

/// A run's account, as the terminal exporter renders it.
fn print_run(record: &crate::record::RunRecord, verbose: bool) -> Result<(), Error> {
    use crate::export::{Export, Exporter, terminal::Terminal};
    let text = Terminal { verbose }.serialize(&Export::runs(std::slice::from_ref(record)))?;
    print_text(&String::from_utf8_lossy(&text))
}

/// A table from `render`: its header line (the one above the rule of dashes) in bold where
/// colour is on, the rest as [`print_text`] prints it.
fn print_table(text: &str) -> Result<(), Error> {
    let lines: Vec<&str> = text.lines().collect();
    let rule = lines
        .iter()
        .position(|l| !l.is_empty() && l.chars().all(|c| c == '-' || c == ' '));
    for (i, line) in lines.iter().enumerate() {
        if rule == Some(i + 1) {
            habits::print_styled(line, habits::style::HEADER)?;
        } else {
            print_text(line)?;
        }
    }
    Ok(())
}

/// Routes a parsed command line to its command: each takes its own arguments (and the store
/// every command shares, `--db`) and says how the process exits.
fn dispatch(cli: Cli) -> Result<ExitCode, Error> {
    let db = cli.db.as_deref();
    match cli.command {
        Command::Host { json } => inspect::host(json),
        Command::List { json } => inspect::list(json),
        Command::Run(args) => run::run(db, args),
        Command::Suite(args) => suite::suite(db, &args),
        Command::Sweep(args) => sweep::sweep(db, &args),
        Command::Runs(args) => inspect::runs(db, args),
        Command::Sweeps { json } => inspect::sweeps(db, json),
        Command::Show(args) => inspect::show(db, &args),
        Command::Trace(args) => tracer::trace(&args),
        Command::Vm(args) => kernel::vm(db, &args),
        Command::Kab(args) => kernel::kab(db, &args),
        Command::Bisect(args) => kernel::bisect(db, &args),
        Command::Judge(args) => kernel::judge(db, &args),
        Command::Cache(args) => cache::cache(&args),
        Command::Compare(args) => compare::compare(db, &args),
        Command::Report(args) => report::report(db, args),
        Command::Merge(args) => transfer::merge(db, &args),
        Command::Export(args) => transfer::export(db, &args),
        Command::Import(args) => transfer::import(db, &args),
        Command::Calibrate(args) => model::calibrate(args),
        Command::Fidelity(args) => model::fidelity(db, &args),
        Command::Completions { shell } => done(habits::completions(shell)),
        Command::Man(args) => done(man::run(&args)),
        Command::Validate(args) => model::validate(db, &args),
    }
}

/// A command that either succeeds (exit 0) or fails with an error.
fn done(result: Result<(), Error>) -> Result<ExitCode, Error> {
    result.map(|()| ExitCode::SUCCESS)
}

/// `--backend`: the backends, each with what it is, as the help lists them.
fn backend_arg() -> impl clap::builder::TypedValueParser<Value = BackendKind> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(BackendKind::ALL.map(|b| PossibleValue::new(b.name()).help(b.what())))
        .map(|name| name.parse().unwrap_or(BackendKind::Kvm))
}

fn request_of(
    info: &ScenarioInfo,
    m: &MeasureArgs,
    variants: Vec<String>,
    params: Params,
) -> RunRequest {
    RunRequest {
        params,
        variants,
        reps: m.reps.unwrap_or(info.default_reps),
        warmup: m.warmup.unwrap_or(info.default_warmup),
        seed: m.seed,
    }
}
