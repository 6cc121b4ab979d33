//! The command line (clap) and dispatch. This is the only layer that prints.

pub mod habits;
mod kernel;
mod progress;
mod render;
mod run_store;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::backend::error::KvmError;
use crate::backend::{Backend, BackendKind};
use crate::error::{Error, InputError};
use crate::lab::host;
use crate::lab::{self, backends};
use crate::model::profile::Profile;
use crate::model::{ModelBackend, ModelError};
use crate::record::RunRecord;
use crate::report::escape::terminal as safe;
use crate::scenario::runner::{DEFAULT_SEED, RunRequest};
use crate::scenario::{self, ScenarioInfo};
use crate::store::{self, Store};
use crate::trace::{self, Until};
use progress::TermProgress;
use run_store::RunStore;

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
    Run(RunArgs),
    /// The main job: every scenario on every backend this host supports, stored
    Suite(SuiteArgs),
    /// One scenario over a grid of parameters (and variants): one stored run per point
    Sweep(SweepArgs),
    /// Stored runs, newest first: your own (internal runs of validate and the suite's
    /// showcases with --all), with their parameters, profile and sweep or suite
    Runs {
        /// How many
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Only this scenario
        #[arg(long)]
        scenario: Option<String>,
        /// Only this backend
        #[arg(long, value_enum)]
        backend: Option<BackendKind>,
        /// Only hosts whose description contains this (kernel, CPU, flavour, or a model
        /// profile), ignoring case
        #[arg(long, value_name = "TEXT")]
        host: Option<String>,
        /// Only the points of this sweep (`hvlab sweeps` lists them)
        #[arg(long, value_name = "ID")]
        sweep: Option<String>,
        /// Only the runs of this suite
        #[arg(long, value_name = "ID")]
        suite: Option<String>,
        /// Only runs started since: a time (2026-11-24T10:00:00Z), a date (2026-11-24, UTC) or
        /// an age (2h, 3days)
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Internal runs too (validate, the suite's showcases)
        #[arg(long)]
        all: bool,
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
    },
    /// Stored sweeps, newest first: id, scenario, backend, points
    Sweeps {
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
    /// Boot a kernel under test in QEMU, run hvlab there, bring its runs back:
    /// hvlab vm --kernel debian:6.12 -- run lifecycle
    Vm(kernel::VmArgs),
    /// A/B of two kernels under test: boots them alternately, runs the scenarios, judges counts
    /// exactly and jiffies with the rank test (times only with kvm acceleration)
    Kab(kernel::KabArgs),
    /// A/B verdict: B against A, each a run, RUN:variant, or runs joined by commas; or each a
    /// host selector (key=value terms joined by commas over kernel, cpu, flavour, hz, backend,
    /// e.g. kernel=6.18,cpu=EPYC), compared per matched host and overall
    Compare {
        /// Side A (the baseline); with --baseline, the run to judge against it [default: the
        /// newest of your runs of a scenario the baseline has]
        #[arg(required_unless_present = "baseline")]
        a: Option<String>,
        /// Side B (the candidate)
        #[arg(required_unless_present = "baseline")]
        b: Option<String>,
        /// Compare against a named baseline (saved with `hvlab run … --save-baseline NAME`):
        /// A is the baseline's run of the same scenario and backend, B the run given
        #[arg(long, value_name = "NAME", conflicts_with = "b")]
        baseline: Option<String>,
        /// With selectors: the scenario [default: the one scenario the selected runs share]
        #[arg(long)]
        scenario: Option<String>,
        /// With selectors: the variant [default: every variant both sides ran]
        #[arg(long)]
        variant: Option<String>,
        /// Metric [default: the scenario's headline metric]
        #[arg(long)]
        metric: Option<String>,
        /// Smallest change that counts, e.g. 5% or 0.05 (0% to under 100%); the whole 95%
        /// interval of the ratio must lie beyond it
        #[arg(long, default_value = "5%")]
        threshold: String,
        /// Exit 1 when B is significantly slower (for CI): judged at p < 0.01 after the
        /// correction, instead of p < 0.05
        #[arg(long)]
        fail_on_regression: bool,
        /// The correction for the comparisons judged together
        #[arg(long, value_enum, default_value_t = crate::analysis::verdict::Correction::Holm)]
        correction: crate::analysis::verdict::Correction,
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
    },
    /// Write a self-contained HTML report (and a Markdown summary) of stored runs
    Report {
        /// Runs to include [default: your newest suite whole, else the latest of your runs
        /// of each scenario on each backend]
        runs: Vec<String>,
        /// Report a sweep instead: its points as lines or heatmaps, and a table
        #[arg(long, value_name = "ID", conflicts_with_all = ["runs", "suite"])]
        sweep: Option<String>,
        /// Report a whole suite: every unit (the latest run of each), whichever shard ran it
        #[arg(long, value_name = "ID", conflicts_with = "runs")]
        suite: Option<String>,
        /// Choose among internal runs too (validate, the suite's showcases)
        #[arg(long)]
        all: bool,
        /// Output directory
        #[arg(short, long, default_value = "hvlab-report")]
        output: PathBuf,
    },
    /// Ingest per-shard SQLite results files into the store (--db), idempotently
    Merge {
        /// SQLite results files written by hvlab (e.g. one per shard)
        #[arg(required = true, value_name = "FILE.db")]
        files: Vec<PathBuf>,
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
    },
    /// Write stored runs for another site (one run record per line)
    Export {
        /// Format: jsonl for another site (`import` reads it), csv for a spreadsheet
        #[arg(long, value_enum, default_value_t = store::transfer::ExportFormat::Jsonl)]
        format: store::transfer::ExportFormat,
        /// Runs to export (ids or unique parts) [default: every run]
        runs: Vec<String>,
        /// Output file [default: stdout]
        #[arg(short, long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Store the runs of an export (`hvlab export`), idempotently
    Import {
        /// The exported file
        #[arg(value_name = "FILE.jsonl")]
        file: PathBuf,
        /// Format
        #[arg(long, value_enum, default_value_t = store::transfer::Format::Jsonl)]
        format: store::transfer::Format,
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
    },
    /// Measure this host's cost profile for the model (with the kvm backend)
    Calibrate {
        /// Where to write it [default: the data dir's this-host.toml, which the model then uses]
        #[arg(short, long, value_name = "PATH")]
        output: Option<PathBuf>,
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
        /// Write the profile even when the host was busy while measuring it
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        interference: InterferenceArgs,
    },
    /// The model against the five kernel threads: each published setup on the model beside the
    /// figures the thread reports, each judged within or outside the thread's range (fitted
    /// rows shown apart); exit 1 when a judged figure is outside
    Fidelity {
        /// Only this thread (its seed number: 000 … 004)
        #[arg(long, value_name = "ID")]
        thread: Option<String>,
        /// Print the table and exit 0 even when figures are outside their range
        #[arg(long)]
        report_only: bool,
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script: hvlab completions bash > /etc/bash_completion.d/hvlab
    Completions {
        /// The shell
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): hvlab man | man -l -
    Man,
    /// The model against the kvm backend on this host, metric by metric; exit 1 beyond tolerance
    Validate {
        /// Cost profile [default: the calibrated one; calibrates first when there is none]
        #[arg(long, value_name = "NAME|PATH")]
        profile: Option<String>,
        /// Allowed error on times, percent, beyond the kvm side's own spread (fault counts
        /// must match exactly)
        #[arg(long, default_value_t = 15.0, value_parser = parse_tolerance, allow_hyphen_values = true)]
        tolerance: f64,
        /// One JSON document on stdout
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        interference: InterferenceArgs,
    },
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
    /// Save the run as the named baseline of its scenario and backend (criterion's habit):
    /// `hvlab compare --baseline NAME` judges later runs against it; saving again moves it
    #[arg(long, value_name = "NAME", value_parser = parse_baseline_name, conflicts_with = "no_store")]
    save_baseline: Option<String>,
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
                crate::backend::noise::parse_cpu_list(text).map_err(|why| InputError::BadValue {
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
                crate::backend::noise::parse_wait(text).map_err(|why| InputError::BadValue {
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
            crate::backend::noise::pin_to(&cpus).map_err(|e| InputError::BadValue {
                key: "--cpu".into(),
                value: self.cpu.clone().unwrap_or_default(),
                why: format!(
                    "the kernel refused the CPU set: {e}; the allowed CPUs are {}",
                    crate::backend::noise::format_cpu_list(&crate::backend::noise::allowed_cpus())
                ),
            })?;
            crate::backend::noise::note_pinned(&cpus);
            eprintln!(
                "pinned the VMM and vCPU threads to CPU {}",
                crate::backend::noise::format_cpu_list(&cpus)
            );
        }
        if let Some(limit) = wait {
            let cores = crate::backend::noise::online_cpus();
            let w = crate::backend::noise::wait_for_quiet(limit);
            crate::backend::noise::note_quiet_wait(w);
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
struct SuiteArgs {
    #[command(flatten)]
    measure: MeasureArgs,
    /// Where to write the report
    #[arg(long, default_value = "hvlab-report")]
    report: PathBuf,
    /// Only this backend's runs [default: every backend this host can run]
    #[arg(long, value_enum)]
    backend: Option<BackendKind>,
    #[command(flatten)]
    shard: ShardArgs,
    /// Print the units this shard would run, and run nothing
    #[arg(long)]
    plan: bool,
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

#[derive(Debug, Args)]
struct SweepArgs {
    /// Scenario (see `hvlab list`)
    scenario: String,
    /// An axis: a --set parameter (or `variant`) and its values, e.g. vcpus=1,4,16 (repeatable;
    /// the points are the cartesian product)
    #[arg(long = "grid", value_name = "KEY=V1,V2,...", required = true)]
    grid: Vec<String>,
    /// Backend
    #[arg(long, value_enum, default_value_t = BackendKind::Kvm)]
    backend: BackendKind,
    /// Variant every point runs (repeatable); default: all
    #[arg(long = "variant", value_name = "V")]
    variants: Vec<String>,
    /// Scenario parameter every point shares, key=value (repeatable)
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    #[command(flatten)]
    measure: MeasureArgs,
    #[command(flatten)]
    shard: ShardArgs,
    /// Threads for the model [default: every core]; kvm runs one point at a time
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    jobs: Option<u32>,
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
            if args.backend == BackendKind::Kvm && args.measure.profile.is_some() {
                return Err(InputError::ProfileWithKvm.into());
            }
            let request = request_of(info, &args.measure, args.variants, args.sets);
            scenario::check(info, &request, args.backend)?;
            for notice in scenario::scenario(info.name)?.notices(&request) {
                habits::note(&format!("note: {}", crate::report::words::notice(&notice)));
            }
            args.measure.interference.check()?;
            // Check the database before measuring, so a bad --db does not cost a run.
            let mut run_store = if args.measure.no_store {
                None
            } else {
                Some(RunStore::open(cli.db.as_deref(), args.measure.json)?)
            };
            args.measure.interference.apply()?;
            let mut backend = backends::make(
                args.backend,
                host::probe(),
                &backends::ModelProfile::named(args.measure.profile.as_deref()),
                args.measure.seed,
            )?;
            let mut record = run_one(info, backend.as_mut(), &request, args.measure.json)?;
            scenario::judge(&record)?;
            record.baseline = args.save_baseline.clone();
            if let Some(s) = &mut run_store {
                s.save(&mut record)?;
            }
            if args.measure.json {
                print_json(&record)?;
            } else {
                print_text(&render::run(&record, args.verbose))?;
            }
        }
        Command::Suite(args) => suite(cli.db.as_deref(), &args)?,
        Command::Vm(args) => return kernel::vm(cli.db.as_deref(), &args),
        Command::Kab(args) => return kernel::kab(cli.db.as_deref(), &args),
        Command::Runs {
            limit,
            scenario,
            backend,
            host,
            sweep,
            suite,
            since,
            all,
            json,
        } => {
            if let Some(s) = &scenario {
                scenario::find(s)?;
            }
            let filter = lab::select::RunFilter {
                since: since
                    .as_deref()
                    .map(|t| lab::select::parse_since(t, std::time::SystemTime::now()))
                    .transpose()?,
                scenario,
                backend,
                host,
                sweep,
                suite,
                all,
            };
            let store = Store::open_read(&store::resolve_path(cli.db.as_deref())?)?;
            let list = lab::select::runs(&store, &filter, limit)?;
            let mut hosts = lab::fleet::group_by_host(list.iter().collect(), |l| {
                lab::fleet::HostFingerprint::of_listing(l)
            });
            // Real hosts first, then model profiles.
            hosts.sort_by_key(|h| !h.fingerprint.is_real());
            if json {
                let hosts: Vec<serde_json::Value> = hosts
                    .iter()
                    .map(|h| serde_json::json!({ "host": h.fingerprint, "runs": h.runs.iter().map(|r| &r.run_id).collect::<Vec<_>>() }))
                    .collect();
                print_json(&serde_json::json!({ "runs": list, "hosts": hosts }))?;
            } else {
                print_table(&render::runs_by_host(&hosts))?;
            }
        }
        Command::Sweeps { json } => {
            let store = Store::open_read(&store::resolve_path(cli.db.as_deref())?)?;
            let sweeps = lab::select::sweeps(&store.list(usize::MAX >> 1)?);
            if json {
                print_json(&serde_json::json!({ "sweeps": sweeps }))?;
            } else {
                print_table(&render::sweeps(&sweeps))?;
            }
        }
        Command::Completions { shell } => habits::completions(shell)?,
        Command::Man => habits::man()?,
        Command::Show { run, json, verbose } => {
            let store = Store::open_read(&store::resolve_path(cli.db.as_deref())?)?;
            let record = store.load(&run)?;
            if json {
                print_json(&record)?;
            } else {
                print_text(&render::run(&record, verbose))?;
            }
        }
        Command::Sweep(args) => return sweep(cli.db.as_deref(), &args),
        Command::Report {
            runs,
            sweep: Some(id),
            output,
            ..
        } => {
            debug_assert!(runs.is_empty());
            let store = Store::open_read(&store::resolve_path(cli.db.as_deref())?)?;
            let records = store.sweep_runs(&id)?;
            let Some(view) = crate::report::SweepView::of(&id, &records) else {
                return Err(InputError::NoSuchSweep {
                    id: id.clone(),
                    known: lab::select::known_sweeps(&store)?,
                }
                .into());
            };
            let path = write_report_with(&output, "-o DIR", |dir| {
                crate::report::write_sweep(&view, dir)
            })?;
            print_text(&format!(
                "report of sweep {id} ({} runs): {}",
                records.len(),
                path.display()
            ))?;
        }
        Command::Report {
            runs,
            sweep: None,
            suite,
            all,
            output,
        } => {
            let store = Store::open_read(&store::resolve_path(cli.db.as_deref())?)?;
            // The fleet page shows the latest of the user's runs of each scenario and backend
            // on every host (model profiles apart). The index shows a suite whole, the runs
            // named, or by default the newest suite or the latest run per scenario and backend.
            let (fleet, chosen) = if let Some(id) = &suite {
                let records = lab::select::suite(&store, id)?;
                (records.clone(), records)
            } else if runs.is_empty() {
                let sel = lab::select::default_report(&store, all)?;
                if let Some(id) = &sel.suite {
                    habits::note(&format!(
                        "reporting suite {id}, your newest (another: --suite ID, or name runs)"
                    ));
                }
                (sel.fleet, sel.runs)
            } else {
                let records = runs
                    .iter()
                    .map(|r| store.load(r))
                    .collect::<Result<Vec<_>, _>>()?;
                (records.clone(), records)
            };
            let records = &chosen;
            if records.is_empty() {
                return Err(InputError::NoRuns.into());
            }
            // The model against the threads: deterministic and a fraction of a second, so
            // every report carries it.
            let fidelity = lab::fidelity::evaluate(&host::probe(), None, DEFAULT_SEED)?;
            let path = write_report(records, &fidelity, &fleet, &output, "-o DIR")?;
            print_text(&format!(
                "report of {} runs: {}",
                records.len(),
                path.display()
            ))?;
        }
        Command::Compare {
            a,
            b,
            baseline,
            scenario,
            variant,
            metric,
            threshold,
            fail_on_regression,
            correction,
            json,
        } => {
            let threshold = lab::compare::parse_threshold(&threshold)?;
            let judging = lab::compare::Judging {
                correction,
                ..lab::compare::Judging::new(threshold, fail_on_regression)
            };
            let store = Store::open_read(&store::resolve_path(cli.db.as_deref())?)?;
            let (a, b) = match &baseline {
                Some(name) => lab::select::against_baseline(&store, name, a.as_deref())?,
                None => (a.unwrap_or_default(), b.unwrap_or_default()),
            };
            if lab::fleet::Selector::looks_like(&a) || lab::fleet::Selector::looks_like(&b) {
                let (sa, sb) = (
                    lab::fleet::Selector::parse(&a)?,
                    lab::fleet::Selector::parse(&b)?,
                );
                let outcome = lab::compare::compare_fleet(
                    &store,
                    &sa,
                    &sb,
                    scenario.as_deref(),
                    variant.as_deref(),
                    metric.as_deref(),
                    judging,
                )?;
                if json {
                    print_json(&outcome)?;
                } else {
                    print_text(&render::fleet_compare(&a, &b, &outcome))?;
                }
                busy_gate(
                    fail_on_regression && outcome.regression,
                    outcome.confounded && !outcome.beyond_busy_noise,
                    &outcome.busy,
                    "B looks slower, but some runs of the fleet were measured on a busy host",
                )?;
                return regression_exit(fail_on_regression, outcome.regression, &outcome.too_few);
            }
            if scenario.is_some() || variant.is_some() {
                return Err(InputError::BadValue {
                    key: "--scenario/--variant".into(),
                    value: scenario.or(variant).unwrap_or_default(),
                    why: "they go with host selectors (kernel=6.18); with runs, name the variant as RUN:variant".into(),
                }
                .into());
            }
            let outcome = lab::compare::compare(&store, &a, &b, metric.as_deref(), judging)?;
            let (results, regressed, too_few) =
                (&outcome.comparisons, outcome.regression, &outcome.too_few);
            if json {
                print_json(
                    &serde_json::json!({ "comparisons": crate::record::worded(results, "text").map_err(|e| Error::Output(e.into()))?, "regression": regressed, "busy": {"a": outcome.busy[0], "b": outcome.busy[1]}, "confounded": outcome.confounded }),
                )?;
            } else {
                print_text(&format!("A = {a}\nB = {b}"))?;
                for (side, busy) in ["A", "B"].iter().zip(&outcome.busy) {
                    if let Some(why) = busy.first() {
                        print_text(&format!(
                            "warning: side {side} was measured on a busy host ({why}): its times may be inflated"
                        ))?;
                    }
                }
                for c in results {
                    let style = match c.verdict {
                        crate::analysis::compare::AbVerdict::Faster => habits::style::GOOD,
                        crate::analysis::compare::AbVerdict::Slower => habits::style::BAD,
                        _ => anstyle::Style::new(),
                    };
                    habits::print_styled(&format!("  [{}] {}", comparison_label(c), c), style)?;
                }
            }
            busy_gate(
                fail_on_regression && regressed,
                outcome.confounded && !outcome.beyond_busy_noise,
                &outcome.busy,
                "B looks slower, but A and B are different runs",
            )?;
            return regression_exit(fail_on_regression, regressed, too_few);
        }
        Command::Merge { files, json } => {
            let mut target = Store::open(&store::resolve_path(cli.db.as_deref())?)?;
            let mut total = store::transfer::Tally::default();
            let mut per_file = Vec::new();
            for file in &files {
                let tally = store::transfer::merge_file(&mut target, file)?;
                if !json {
                    print_text(&render::tally(&file.display().to_string(), &tally))?;
                }
                total.add(&tally);
                per_file.push(serde_json::json!({ "file": file, "tally": tally }));
            }
            if json {
                print_json(&serde_json::json!({ "files": per_file, "total": total }))?;
            } else {
                print_text(&render::tally(
                    &format!("merged into {}", target.location()),
                    &total,
                ))?;
            }
            if let Some(e) = total.conflicts_error() {
                return Err(e.into());
            }
        }
        Command::Export {
            format,
            runs,
            output,
        } => {
            let store = Store::open_read(&store::resolve_path(cli.db.as_deref())?)?;
            let records = store::transfer::select(&store, &runs)?;
            match &output {
                Some(path) => {
                    store::transfer::write_file(&records, path, format)?;
                    habits::note(&format!(
                        "exported {} run(s) to {}",
                        records.len(),
                        path.display()
                    ));
                }
                None => format.write(&records, &mut std::io::stdout().lock())?,
            }
        }
        Command::Import {
            file,
            format: store::transfer::Format::Jsonl,
            json,
        } => {
            // Every line is checked before anything is stored.
            let records = store::transfer::read_jsonl(&file)?;
            let mut target = Store::open(&store::resolve_path(cli.db.as_deref())?)?;
            let tally = store::transfer::ingest_all(&mut target, &records)?;
            if json {
                print_json(&serde_json::json!({ "file": file, "tally": tally }))?;
            } else {
                print_text(&render::tally(
                    &format!("imported {} into {}", file.display(), target.location()),
                    &tally,
                ))?;
            }
            if let Some(e) = tally.conflicts_error() {
                return Err(e.into());
            }
        }
        Command::Calibrate {
            output,
            json,
            force,
            interference,
        } => {
            interference.check()?;
            // The output path is checked before measuring: a bad -o must not cost the run.
            let (path, option) = match output {
                Some(p) => (p, "-o PATH"),
                None => (
                    lab::calibrated_profile_path()?,
                    "the default; choose another with -o PATH",
                ),
            };
            check_output_file(&path, "the profile", option)?;
            interference.apply()?;
            let mut backend = backends::kvm(host::probe())?;
            let progress = TermProgress::new("calibrate", json);
            let (profile, noise) = calibrate_measuring_noise(backend.as_mut(), &progress)?;
            if noise.is_busy() && !force {
                return Err(Error::HostBusy {
                    why: busy_why(&noise),
                    what: format!(
                        "the profile was not written to {}: costs measured on a busy host are inflated; run on a quiet host (--quiet-host waits for one), pin with --cpu, or write it anyway with --force",
                        path.display()
                    ),
                });
            }
            if noise.is_busy() {
                eprintln!(
                    "warning: writing a profile measured on a busy host ({}) because of --force",
                    busy_why(&noise)
                );
            }
            profile.write(&path).map_err(|e| Error::OutputPath {
                what: "the profile",
                path: path.clone(),
                option,
                why: e.to_string(),
            })?;
            if json {
                print_json(&serde_json::json!({ "path": path, "profile": profile }))?;
            } else {
                print_text(&render::profile(&profile))?;
                print_text(&format!("wrote {}", path.display()))?;
            }
        }
        Command::Fidelity {
            thread,
            report_only,
            json,
        } => {
            use lab::fidelity::ThreadReport;
            let reports = lab::fidelity::evaluate(&host::probe(), thread.as_deref(), DEFAULT_SEED)?;
            let sum = |f: fn(&ThreadReport) -> usize| reports.iter().map(f).sum::<usize>();
            let outside = sum(ThreadReport::outside);
            if json {
                print_json(&serde_json::json!({
                    "threads": reports,
                    "judged": sum(ThreadReport::judged),
                    "within": sum(ThreadReport::within),
                    "outside": outside,
                    "fitted_rows": sum(ThreadReport::fitted_rows),
                }))?;
            } else {
                print_text(&render::fidelity(&reports))?;
            }
            return Ok(if outside == 0 || report_only {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            });
        }
        Command::Validate {
            profile,
            tolerance,
            json,
            interference,
        } => {
            interference.apply()?;
            let code = validate(cli.db.as_deref(), profile.as_deref(), tolerance, json)?;
            return Ok(code);
        }
        Command::Trace(args) => {
            let h = host::probe();
            let report = trace::trace(
                &args.command,
                args.until,
                Duration::from_secs(args.timeout),
                args.show_output,
                &h,
            )
            .map_err(|e| match e {
                trace::TraceError::Interrupted(signal) => Error::Interrupted {
                    signal,
                    name: trace::signal_name(signal),
                    what: "the traced command and strace were stopped; nothing was left behind"
                        .into(),
                },
                e => e.into(),
            })?;
            if args.json {
                print_json(&report)?;
            } else {
                print_text(&render::trace(&report))?;
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Calibrates, recording the noise over the whole calibration in the profile (its `describes`
/// line, which the profile file keeps).
fn calibrate_measuring_noise(
    backend: &mut dyn Backend,
    progress: &TermProgress,
) -> Result<(Profile, crate::backend::noise::Noise), Error> {
    use crate::backend::noise::{Noise, Snapshot, take_reps};
    let before = Snapshot::take();
    let mut profile = backends::calibrate(backend, progress)?;
    let noise = Noise::between(&before, &Snapshot::take(), &take_reps());
    profile.describes = format!(
        "{}; measured in {}",
        profile.describes,
        crate::report::words::noise_line(&noise)
    );
    Ok((profile, noise))
}

/// What made the host busy, in words.
fn busy_why(noise: &crate::backend::noise::Noise) -> String {
    crate::report::words::busy_words(&noise.busy)
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

fn run_one(
    info: &ScenarioInfo,
    backend: &mut dyn Backend,
    request: &RunRequest,
    json: bool,
) -> Result<RunRecord, Error> {
    let progress = TermProgress::new(info.name, json);
    scenario::run(info, backend, request, &progress)
}

/// `hvlab compare`'s exit: with `--fail-on-regression`, 1 on a regression, and an error when
/// some comparison had too few samples to judge.
/// The regression gate between runs measured apart: when a busy run is on either side and
/// no slowdown exceeds what a busy host does to a run, a regression cannot be told from the
/// host getting busier: exit 4 ("cannot judge"), never 1.
fn busy_gate(
    regressed: bool,
    confounded: bool,
    busy: &[Vec<String>; 2],
    what: &str,
) -> Result<(), Error> {
    if regressed && confounded {
        return Err(Error::HostBusy {
            why: busy.iter().flatten().next().cloned().unwrap_or_default(),
            what: format!(
                "{what}, and a busy host inflates a run's times by as much as the change (up to 1.7× in A/A runs here at load 8-12; a slowdown is still called when its whole 95% interval is above {:.1}×), so the gate cannot tell a regression from the host getting busier: rerun both on a quiet host (--quiet-host waits for one) or pinned with --cpu; variants compared within one run are judged, since interleaving spreads the noise over both",
                lab::compare::BUSY_INFLATION
            ),
        });
    }
    Ok(())
}

fn regression_exit(
    fail_on_regression: bool,
    regression: bool,
    too_few: &[String],
) -> Result<ExitCode, Error> {
    if fail_on_regression && regression {
        return Ok(ExitCode::from(1));
    }
    if fail_on_regression && !too_few.is_empty() {
        return Err(InputError::TooFewToJudge(
            too_few.join(", "),
            crate::analysis::compare::min_n(crate::analysis::verdict::GATE_ALPHA),
        )
        .into());
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether the process can write `path` (an existing file, opened without truncating) or
/// create files in it (a directory: a probe file is created and removed). Trying is the only
/// answer that covers permissions, read-only mounts and root alike.
fn writable(path: &std::path::Path) -> Result<(), std::io::Error> {
    if path.is_dir() {
        let probe = path.join(format!(".hvlab-write-test-{}", std::process::id()));
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)?;
        std::fs::remove_file(&probe)
    } else {
        std::fs::OpenOptions::new().write(true).open(path).map(drop)
    }
}

/// Checks that a file can be written at `path` (creating its directory), before any work.
fn check_output_file(
    path: &std::path::Path,
    what: &'static str,
    option: &'static str,
) -> Result<(), Error> {
    let fail = |why: String| Error::OutputPath {
        what,
        path: path.to_path_buf(),
        option,
        why,
    };
    if path.is_dir() {
        return Err(fail(
            "it is a directory; give a file path such as DIR/profile.toml".into(),
        ));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| {
        fail(format!(
            "cannot create its directory {}: {e}",
            dir.display()
        ))
    })?;
    let target = if path.exists() { path } else { dir };
    writable(target).map_err(|e| {
        fail(format!(
            "{} is not writable ({e}); choose a writable path",
            target.display()
        ))
    })
}

/// Checks that `dir` is (or can become) a writable directory, before any work.
fn check_output_dir(
    dir: &std::path::Path,
    what: &'static str,
    option: &'static str,
) -> Result<(), Error> {
    let fail = |why: String| Error::OutputPath {
        what,
        path: dir.to_path_buf(),
        option,
        why,
    };
    if dir.exists() && !dir.is_dir() {
        return Err(fail(
            "a file of that name exists; the option takes a directory (hvlab writes index.html and summary.md into it): give a new or existing directory".into(),
        ));
    }
    std::fs::create_dir_all(dir).map_err(|e| {
        fail(format!(
            "cannot create the directory: {e}; choose a writable place"
        ))
    })?;
    writable(dir).map_err(|e| {
        fail(format!(
            "the directory is not writable ({e}); choose a writable place"
        ))
    })
}

/// Writes the report into `dir`, naming the path and the option on failure.
fn write_report(
    records: &[RunRecord],
    fidelity: &[lab::fidelity::ThreadReport],
    fleet: &[RunRecord],
    dir: &std::path::Path,
    option: &'static str,
) -> Result<PathBuf, Error> {
    write_report_with(dir, option, |dir| {
        crate::report::write(records, fidelity, fleet, dir)
    })
}

/// Checks the report directory `dir` (given with `option`), then writes the report into it with
/// `write`, an I/O failure becoming an error naming the directory and the option.
fn write_report_with(
    dir: &std::path::Path,
    option: &'static str,
    write: impl FnOnce(&std::path::Path) -> std::io::Result<PathBuf>,
) -> Result<PathBuf, Error> {
    check_output_dir(dir, "the report", option)?;
    write(dir).map_err(|e| Error::OutputPath {
        what: "the report",
        path: dir.to_path_buf(),
        option,
        why: format!("{e}; choose a writable place"),
    })
}

/// `--save-baseline`: a name of letters, digits, `.`, `_` and `-` (it is typed again later).
fn parse_baseline_name(text: &str) -> Result<String, String> {
    if !text.is_empty()
        && text.len() <= 64
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
    {
        Ok(text.to_string())
    } else {
        Err(format!(
            "`{text}` is not a baseline name: use 1 to 64 letters, digits, `.`, `_` or `-`, such as main or before-fix"
        ))
    }
}

/// `--tolerance`: a finite percentage above 0 (at most 100000: a huge one checks only the
/// exact counts).
fn parse_tolerance(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("`{text}` is not a number: give a percentage such as 15"))?;
    if v.is_finite() && v > 0.0 && v <= 100_000.0 {
        Ok(v)
    } else {
        Err(format!(
            "`{text}` is out of range: the tolerance is a percentage above 0 and at most 100000, such as 15"
        ))
    }
}

/// How a comparison line is labelled: the variant, or both when the sides differ.
fn comparison_label(c: &crate::analysis::compare::AbComparison) -> String {
    let (va, vb) = (
        c.a.strip_prefix("A:").unwrap_or(&c.a),
        c.b.strip_prefix("B:").unwrap_or(&c.b),
    );
    if va == vb {
        va.to_string()
    } else {
        format!("A {va} vs B {vb}")
    }
}

fn suite(db: Option<&std::path::Path>, args: &SuiteArgs) -> Result<(), Error> {
    let (shard, source) = lab::shard::resolve(
        args.shard.shard.as_deref(),
        args.shard.shard_count,
        &lab::shard::process_env(),
    )?;
    if args.plan {
        let units = lab::suite::plan(args.backend, shard);
        if args.measure.json {
            print_json(&serde_json::json!({
                "shard": shard.to_string(), "source": source.to_string(), "units": units
            }))?;
        } else {
            print_text(&format!(
                "shard {shard} ({source}): {} unit(s)",
                units.len()
            ))?;
            for u in &units {
                print_text(&format!("  {u}"))?;
            }
        }
        return Ok(());
    }
    // Refuse an unwritable report directory or database before measuring for a minute.
    check_output_dir(&args.report, "the report", "--report DIR")?;
    args.measure.interference.check()?;
    let mut run_store = if args.measure.no_store {
        None
    } else {
        Some(RunStore::open(db, args.measure.json)?)
    };
    args.measure.interference.apply()?;
    let h = host::probe();
    let model_profile = backends::ModelProfile::named(args.measure.profile.as_deref());
    let json = args.measure.json;
    let suite_id = lab::suite::suite_id(
        args.backend,
        shard,
        args.measure.seed,
        std::env::var("SLURM_ARRAY_JOB_ID").ok().as_deref(),
        &crate::scenario::runner::now_rfc3339(),
    );
    if !shard.is_whole() {
        eprintln!("suite {suite_id} shard {shard} ({source})");
    }
    let lab::suite::SuiteOutcome {
        records,
        skipped,
        units,
    } = lab::suite::run(
        &suite_id,
        &h,
        args.backend,
        shard,
        args.measure.seed,
        |kind, host, seed| backends::make(kind, host, &model_profile, seed),
        |info| request_of(info, &args.measure, Vec::new(), Vec::new()),
        |info| TermProgress::new(info.name, json),
        |record| {
            if let Some(s) = &mut run_store {
                s.save(record)?;
            }
            if !json {
                print_text(&render::run(record, false))?;
                print_text("")?;
            }
            Ok(())
        },
    )?;
    let fidelity = lab::fidelity::evaluate(&h, None, DEFAULT_SEED)?;
    let report = if records.is_empty() {
        None
    } else {
        Some(write_report(
            &records,
            &fidelity,
            &records,
            &args.report,
            "--report DIR",
        )?)
    };
    if args.measure.json {
        print_json(&serde_json::json!({
            "suite": suite_id, "shard": shard.to_string(), "units": units,
            "runs": records, "skipped": skipped, "fidelity": fidelity, "report": report
        }))?;
    } else {
        for s in &skipped {
            eprintln!("skipped {s}");
        }
        print_text(&format!(
            "suite {suite_id}{}: {} run(s) on {} ({}), {} skipped",
            if shard.is_whole() {
                String::new()
            } else {
                format!(" shard {shard}")
            },
            records.len(),
            h.kernel,
            h.kvm_flavour,
            skipped.len()
        ))?;
        for r in &records {
            print_text(&format!("  {}", crate::report::words::run_headline(r)))?;
        }
        print_text(&format!(
            "  {} (hvlab fidelity prints the table)",
            crate::report::words::fidelity_headline(&fidelity)
        ))?;
        if let Some(path) = &report {
            print_text(&format!("report: {}", path.display()))?;
        }
    }
    if units.is_empty() {
        habits::note(&format!(
            "note: shard {shard} has no units: the suite has fewer units than shards"
        ));
    } else if let Some(e) = shard_without_kvm(shard, &units, &records, &skipped) {
        return Err(e);
    } else if records.is_empty() {
        return Err(KvmError::DeviceMissing(crate::backend::host::kvm_device_path()).into());
    }
    Ok(())
}

/// A shard (not the whole suite, which runs what the host supports) that was given kvm units
/// and ran none: an error, so the array task fails instead of passing `afterok`.
fn shard_without_kvm(
    shard: lab::shard::Shard,
    units: &[String],
    records: &[RunRecord],
    skipped: &[String],
) -> Option<Error> {
    let kvm_units = units
        .iter()
        .filter(|u| u.split('/').nth(2) == Some("kvm"))
        .count();
    let kvm_ran = records.iter().any(|r| r.backend == BackendKind::Kvm);
    (!shard.is_whole() && kvm_units > 0 && !kvm_ran).then(|| Error::ShardWithoutKvm {
        shard: shard.to_string(),
        count: kvm_units,
        reasons: skipped
            .iter()
            .find(|s| s.contains(" on kvm: "))
            .cloned()
            .unwrap_or_else(|| "every kvm unit was skipped".into()),
    })
}

/// `hvlab sweep`: validates every point, then runs this shard's points (in parallel on the
/// model) and stores each as a run.
fn sweep(db: Option<&std::path::Path>, args: &SweepArgs) -> Result<ExitCode, Error> {
    let s = scenario::scenario(&args.scenario)?;
    let info = s.info();
    if args.backend == BackendKind::Kvm && args.measure.profile.is_some() {
        return Err(InputError::ProfileWithKvm.into());
    }
    info.require_backend(args.backend)?;
    let (shard, source) = lab::shard::resolve(
        args.shard.shard.as_deref(),
        args.shard.shard_count,
        &lab::shard::process_env(),
    )?;
    let spec = lab::sweep::SweepSpec {
        scenario: s,
        backend: args.backend,
        axes: lab::sweep::parse_grid(&args.grid)?,
        sets: args.sets.clone(),
        variants: args.variants.clone(),
        reps: args.measure.reps.unwrap_or(info.default_reps),
        warmup: args.measure.warmup.unwrap_or(info.default_warmup),
        seed: args.measure.seed,
        profile: args.measure.profile.clone(),
    };
    let host = host::probe();
    let model_profile = backends::ModelProfile::named(args.measure.profile.as_deref());
    // What the points would take in the store, refused above its free space (exit 2).
    let store_cost = if args.measure.no_store {
        None
    } else {
        let at = store::resolve_path(db)?;
        let (cost, line) = lab::sweep::preflight(&spec, shard, &at, &host, &model_profile)?;
        habits::note(&line);
        cost
    };
    let plan = lab::sweep::plan(&spec)?;
    args.measure.interference.check()?;
    // Check the database before measuring, so a bad --db does not cost a sweep.
    let mut store = if args.measure.no_store {
        None
    } else {
        Some(RunStore::open(db, args.measure.json)?)
    };
    args.measure.interference.apply()?;
    let threads = match args.backend {
        BackendKind::Kvm => 1,
        BackendKind::Model => {
            // Resolved before the sweep starts, so a bad --profile costs no point.
            model_profile.get(&host)?;
            args.jobs.map_or_else(
                || std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
                |j| j as usize,
            )
        }
    };
    let json = args.measure.json;
    habits::note(&format!(
        "sweep {}: {} on {}, {} points; shard {shard} ({source})",
        plan.id,
        info.name,
        args.backend,
        plan.points.len()
    ));
    let progress = TermProgress::new("sweep", json);
    let mut run_ids = Vec::new();
    // --no-store: the results are printed, as they are the only copy.
    let mut unstored = Vec::new();
    let outcome = lab::sweep::run(
        &plan,
        shard,
        threads,
        |seed| backends::make(args.backend, host.clone(), &model_profile, seed),
        &progress,
        |mut record| {
            if let Some(store) = &mut store {
                store.save(&mut record)?;
            } else if !json {
                print_text(&render::run(&record, false))?;
                print_text("")?;
            }
            run_ids.push(record.run_id.clone());
            if store.is_none() && json {
                unstored.push(record);
            }
            Ok(())
        },
    )?;
    if json {
        let mut doc = serde_json::json!({
            "sweep": outcome, "shard": shard.to_string(), "runs": run_ids, "store_cost": store_cost
        });
        if store.is_none() {
            doc["records"] = serde_json::to_value(&unstored).map_err(std::io::Error::other)?;
        }
        print_json(&doc)?;
    } else {
        for why in &outcome.skipped {
            eprintln!("skipped {why}");
        }
        for why in &outcome.failed {
            eprintln!("failed {why}");
        }
        print_text(&format!(
            "sweep {}: {} of {} points in shard {shard}; {} ran ({}), {} skipped, {} failed",
            outcome.id,
            outcome.units.len(),
            outcome.points,
            outcome.ran,
            store.as_ref().map_or_else(
                || "not stored: --no-store".to_string(),
                |s| format!("stored in {}", s.display())
            ),
            outcome.skipped.len(),
            outcome.failed.len()
        ))?;
        if store.is_some() && outcome.ran > 0 {
            // The table of the whole sweep as stored (other shards' points included).
            let records = Store::open_read(&store::resolve_path(db)?)?.sweep_runs(&outcome.id)?;
            if !records.is_empty() {
                print_table(&render::sweep_table(&records))?;
            }
            print_text(&format!("report: hvlab report --sweep {}", outcome.id))?;
        }
    }
    Ok(if !outcome.failed.is_empty() {
        ExitCode::from(4)
    } else if outcome.ran == 0 && !outcome.skipped.is_empty() {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

/// Runs both backends on the validation points and judges every metric.
fn validate(
    db: Option<&std::path::Path>,
    profile: Option<&str>,
    tolerance: f64,
    json: bool,
) -> Result<ExitCode, Error> {
    // Opened before measuring or calibrating, so a store that cannot take the runs costs no
    // KVM work.
    let mut run_store = RunStore::open(db, json)?;
    let h = host::probe();
    let mut kvm = backends::kvm(h.clone())?;
    let progress = TermProgress::new("validate", json);
    let profile = match profile {
        Some(p) => Profile::load(p).map_err(ModelError::from)?,
        None => {
            let path = lab::calibrated_profile_path()?;
            if path.exists() {
                Profile::load(&path.to_string_lossy()).map_err(ModelError::from)?
            } else {
                eprintln!(
                    "no calibrated profile at {}: calibrating first",
                    path.display()
                );
                let (p, noise) = calibrate_measuring_noise(kvm.as_mut(), &progress)?;
                if noise.is_busy() {
                    // Used for this validation only: a profile measured on a busy host is
                    // not kept (calibrate --force writes one).
                    eprintln!(
                        "the host was busy while calibrating ({}): the profile is used for this validation but not written",
                        busy_why(&noise)
                    );
                } else {
                    if let Some(dir) = path.parent() {
                        std::fs::create_dir_all(dir)?;
                    }
                    p.write(&path).map_err(ModelError::from)?;
                }
                p
            }
        }
    };
    let host = h.clone();
    let mut model = ModelBackend::new(profile, h, DEFAULT_SEED);
    let validation = lab::validate::validate(
        kvm.as_mut(),
        &mut model,
        &host,
        tolerance,
        &progress,
        |record| run_store.save(record),
    )?;
    let failed = validation.failed();
    let checks = &validation.checks;
    let busy: Vec<String> = validation
        .busy
        .iter()
        .map(|n| crate::report::words::busy_words(&n.busy))
        .collect();
    if json {
        print_json(&serde_json::json!({
            "tolerance_pct": tolerance, "checks": checks, "failed": failed,
            "busy": busy, "cannot_judge": validation.cannot_judge()
        }))?;
    } else {
        print_text(&render::validation(checks, tolerance))?;
    }
    if validation.cannot_judge() {
        return Err(Error::HostBusy {
            why: busy.first().cloned().unwrap_or_default(),
            what: format!(
                "{failed} of {} checks fell outside the kvm side's spread plus {tolerance}%, on runs measured on a busy host: rerun on a quiet host (--quiet-host waits for one) or pin with --cpu",
                checks.len()
            ),
        });
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
