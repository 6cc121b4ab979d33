//! `hvlab suite`: every scenario on every backend this host can run (or one shard of it),
//! stored, then a report.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use super::paths::{check_output_dir, write_report};
use super::progress::TermProgress;
use super::run_store::RunStore;
use super::{MeasureArgs, ShardArgs, habits, print_json, print_text, render, request_of};
use crate::cli::Error;
use crate::export::words;
use crate::lab::{self, backends, host};
use crate::record::RunRecord;
use crate::scenario::runner::DEFAULT_SEED;
use hvlab_core::BackendKind;
use hvlab_core::host::HostInfo;

#[derive(Debug, Args)]
pub(super) struct SuiteArgs {
    #[command(flatten)]
    measure: MeasureArgs,
    /// Where to write the report
    #[arg(long, default_value = "hvlab-report")]
    report: PathBuf,
    /// Only this backend's runs [default: every backend this host can run]
    #[arg(long, value_parser = super::backend_arg())]
    backend: Option<BackendKind>,
    #[command(flatten)]
    shard: ShardArgs,
    /// Print the units this shard would run, and run nothing
    #[arg(long)]
    plan: bool,
    /// Print each run's account as it finishes (the summary alone otherwise; `hvlab show RUN`
    /// prints one later)
    #[arg(short, long)]
    verbose: bool,
}

/// `hvlab suite`: `--plan` lists this shard's units; otherwise checks the report directory
/// and the store, runs the shard's units, stores each run, writes the report and sums up.
pub(super) fn suite(db: Option<&Path>, args: &SuiteArgs) -> Result<ExitCode, Error> {
    let (shard, source) = lab::shard::resolve(
        args.shard.shard.as_deref(),
        args.shard.shard_count,
        &lab::shard::process_env(),
    )?;
    if args.plan {
        print_plan(args, shard, &source)?;
        return Ok(ExitCode::SUCCESS);
    }
    // Refuse an unwritable report directory or database before measuring for a minute.
    check_output_dir(&args.report, "the report", "--report DIR")?;
    args.measure.interference.check()?;
    // On a terminal the summary is the first screen: a note per stored run only with -v.
    let mut run_store = args
        .measure
        .run_store(db)?
        .map(|s| if args.verbose { s } else { s.quietly() });
    args.measure.interference.apply()?;
    let h = host::probe();
    let say = |note: &str| habits::note(&format!("note: {note}"));
    let model_profile = backends::ModelProfile::named(args.measure.profile.as_deref()).noting(&say);
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
    let outcome = run_units(
        args,
        &SuiteRun {
            suite_id: &suite_id,
            host: &h,
            shard,
            model_profile: &model_profile,
        },
        &mut run_store,
    )?;
    let fidelity = lab::fidelity::evaluate(&h, None, DEFAULT_SEED)?;
    let report = report_of(&outcome.records, &fidelity, &args.report)?;
    let summary = render::SuiteSummary {
        suite_id: &suite_id,
        shard,
        host: &h,
        records: &outcome.records,
        skipped: outcome.skipped.len(),
        fidelity: &fidelity,
        report: report.as_deref(),
    };
    print_outcome(args.measure.json, &summary, &outcome)?;
    if let Some(s) = run_store
        .as_ref()
        .filter(|s| !args.verbose && s.stored() > 0)
    {
        habits::note(&format!("stored {} run(s) in {}", s.stored(), s.display()));
    }
    shard_outcome(shard, &outcome)?;
    Ok(ExitCode::SUCCESS)
}

/// What every unit of this run of the suite shares.
struct SuiteRun<'a> {
    suite_id: &'a str,
    host: &'a HostInfo,
    shard: lab::shard::Shard,
    model_profile: &'a backends::ModelProfile<'a>,
}

/// Runs the shard's units, storing each run as it finishes (and printing its account with -v).
fn run_units(
    args: &SuiteArgs,
    run: &SuiteRun<'_>,
    run_store: &mut Option<RunStore>,
) -> Result<lab::suite::SuiteOutcome, Error> {
    let json = args.measure.json;
    lab::suite::run(
        run.suite_id,
        run.host,
        args.backend,
        run.shard,
        args.measure.seed,
        |kind, host, seed| backends::make(kind, host, run.model_profile, seed),
        |kind| request_of(kind.info(), &args.measure, Vec::new(), kind.defaults()),
        |info| TermProgress::new(info.name, json),
        |record| {
            if let Some(s) = run_store.as_mut() {
                s.save(record)?;
            }
            if !json && args.verbose {
                super::print_run(record, false)?;
                print_text("")?;
            }
            Ok(())
        },
    )
}

/// The report of the runs, when any run produced samples.
fn report_of(
    records: &[RunRecord],
    fidelity: &[lab::fidelity::ThreadReport],
    dir: &Path,
) -> Result<Option<PathBuf>, Error> {
    if records.is_empty() {
        return Ok(None);
    }
    write_report(records, fidelity, records, dir, "--report DIR").map(Some)
}

/// The suite's result: one JSON document, or the skipped units on stderr and the summary.
fn print_outcome(
    json: bool,
    summary: &render::SuiteSummary<'_>,
    outcome: &lab::suite::SuiteOutcome,
) -> Result<(), Error> {
    let skipped_words: Vec<String> = outcome.skipped.iter().map(words::skipped_unit).collect();
    if json {
        print_json(&serde_json::json!({
            "suite": summary.suite_id, "shard": summary.shard.to_string(), "units": outcome.units,
            "runs": summary.records, "skipped": skipped_words, "fidelity": summary.fidelity,
            "report": summary.report
        }))
    } else {
        for s in &skipped_words {
            eprintln!("skipped {s}");
        }
        print_text(&render::suite_summary(summary))
    }
}

/// A shard with no units is said so; one that ran nothing it was given is an error.
fn shard_outcome(
    shard: lab::shard::Shard,
    outcome: &lab::suite::SuiteOutcome,
) -> Result<(), Error> {
    let lab::suite::SuiteOutcome {
        records,
        skipped,
        units,
    } = outcome;
    if units.is_empty() {
        habits::note(&format!(
            "note: shard {shard} has no units: the suite has fewer units than shards"
        ));
    } else if let Some(e) = shard_without_kvm(shard, units, records, skipped) {
        return Err(e);
    } else if records.is_empty() {
        return Err(backends::no_kvm().into());
    }
    Ok(())
}

/// `--plan`: the units this shard would run, and nothing run.
fn print_plan(
    args: &SuiteArgs,
    shard: lab::shard::Shard,
    source: &impl std::fmt::Display,
) -> Result<(), Error> {
    let units = lab::suite::plan(args.backend, shard);
    if args.measure.json {
        print_json(&serde_json::json!({
            "shard": shard.to_string(), "source": source.to_string(), "units": units
        }))
    } else {
        print_text(&format!(
            "shard {shard} ({source}): {} unit(s)",
            units.len()
        ))?;
        for u in &units {
            print_text(&format!("  {u}"))?;
        }
        Ok(())
    }
}

/// A shard (not the whole suite, which runs what the host supports) that was given kvm units
/// and ran none: an error, so the array task fails instead of passing `afterok`.
fn shard_without_kvm(
    shard: lab::shard::Shard,
    units: &[String],
    records: &[RunRecord],
    skipped: &[lab::suite::Skipped],
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
            .find(|s| s.backend == BackendKind::Kvm)
            .map_or_else(|| "every kvm unit was skipped".into(), words::skipped_unit),
    })
}
