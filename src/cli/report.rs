//! `hvlab report`: the HTML report (and Markdown summary) of stored runs, or of a sweep.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::paths::{write_report, write_report_streaming, write_report_with};
use super::{habits, print_text};
use crate::cli::Error;
use crate::error::InputError;
use crate::lab::{self, host};
use crate::scenario::runner::DEFAULT_SEED;
use crate::store::{self, Store};

#[derive(Debug, Args)]
pub(super) struct ReportArgs {
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
    output: std::path::PathBuf,
}

/// `hvlab report`: a sweep's report with `--sweep`, else the report of the runs chosen.
pub(super) fn report(db: Option<&Path>, args: ReportArgs) -> Result<ExitCode, Error> {
    let store = Store::open_read(&store::resolve_path(db)?)?;
    match &args.sweep {
        Some(id) => sweep_report(&store, id, &args.output),
        None => runs_report(&store, args),
    }
}

/// The report of sweep `id`.
fn sweep_report(store: &Store, id: &str, output: &Path) -> Result<ExitCode, Error> {
    let records = store.sweep_runs(id)?;
    let Some(view) = crate::export::SweepView::of(id, &records) else {
        return Err(InputError::NoSuchSweep {
            id: id.to_string(),
            known: lab::select::known_sweeps(store)?,
        }
        .into());
    };
    let path = write_report_with(output, "-o DIR", |dir| {
        crate::export::write_sweep(&view, dir)
    })?;
    print_text(&format!(
        "report of sweep {id} ({} runs): {}",
        records.len(),
        path.display()
    ))?;
    Ok(ExitCode::SUCCESS)
}

/// The report of a suite whole, of the runs named, or by default of the newest suite or the
/// latest run per scenario and backend.
fn runs_report(store: &Store, args: ReportArgs) -> Result<ExitCode, Error> {
    let ReportArgs {
        runs,
        suite,
        all,
        output,
        ..
    } = args;
    // The fleet page shows the latest of the user's runs of each scenario and backend
    // on every host (model profiles apart). The index shows a suite whole, the runs
    // named, or by default the newest suite or the latest run per scenario and backend.
    // The model against the threads: deterministic and a fraction of a second, so
    // every report carries it.
    let fidelity = || lab::fidelity::evaluate(&host::probe(), None, DEFAULT_SEED);
    if suite.is_none() && !runs.is_empty() {
        // Runs named (a sweep's thousands of points among them): each read, written and
        // dropped in turn, so the report's memory does not grow with the runs.
        let fidelity = fidelity()?;
        let path = write_report_streaming(&output, "-o DIR", &fidelity, |add| {
            for id in &runs {
                add(&store.load(id)?)?;
            }
            Ok(())
        })?;
        print_text(&format!(
            "report of {} runs: {}",
            runs.len(),
            path.display()
        ))?;
        return Ok(ExitCode::SUCCESS);
    }
    let (fleet, chosen) = if let Some(id) = &suite {
        lab::select::suite(store, id).map(|records| (records.clone(), records))?
    } else {
        let sel = lab::select::default_report(store, all)?;
        if let Some(id) = &sel.suite {
            habits::note(&format!(
                "reporting suite {id}, your newest (another: --suite ID, or name runs)"
            ));
        }
        (sel.fleet, sel.runs)
    };
    let records = &chosen;
    if records.is_empty() {
        return Err(InputError::NoRuns.into());
    }
    let path = write_report(records, &fidelity()?, &fleet, &output, "-o DIR")?;
    print_text(&format!(
        "report of {} runs: {}",
        records.len(),
        path.display()
    ))?;
    Ok(ExitCode::SUCCESS)
}
