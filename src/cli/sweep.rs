//! `hvlab sweep`: one scenario over a grid of parameters, one stored run per point.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::progress::TermProgress;
use super::{MeasureArgs, ShardArgs, habits, print_json, print_table, print_text, render};
use crate::cli::Error;
use crate::error::InputError;
use crate::export::words;
use crate::lab::{self, backends, host};
use crate::scenario;
use crate::store::{self, Store};
use hvlab_core::BackendKind;

#[derive(Debug, Args)]
pub(super) struct SweepArgs {
    /// Scenario (see `hvlab list`)
    scenario: String,
    /// An axis: a --set parameter (or `variant`) and its values, e.g. vcpus=1,4,16 (repeatable;
    /// the points are the cartesian product)
    #[arg(long = "grid", value_name = "KEY=V1,V2,...", required = true)]
    grid: Vec<String>,
    #[command(flatten)]
    target: super::run::Target,
    #[command(flatten)]
    measure: MeasureArgs,
    #[command(flatten)]
    shard: ShardArgs,
    /// Threads for the model [default: every core]; kvm runs one point at a time
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    jobs: Option<u32>,
}

/// `hvlab sweep`: validates every point, then runs this shard's points (in parallel on the
/// model) and stores each as a run.
pub(super) fn sweep(db: Option<&Path>, args: &SweepArgs) -> Result<ExitCode, Error> {
    let s = scenario::Kind::named(&args.scenario)?;
    let info = s.info();
    if args.target.backend == BackendKind::Kvm && args.measure.profile.is_some() {
        return Err(InputError::ProfileWithKvm.into());
    }
    info.require_backend(args.target.backend)?;
    let (shard, source) = lab::shard::resolve(
        args.shard.shard.as_deref(),
        args.shard.shard_count,
        &lab::shard::process_env(),
    )?;
    let spec = lab::sweep::SweepSpec {
        scenario: s,
        backend: args.target.backend,
        axes: lab::sweep::parse_grid(&args.grid)?,
        sets: args.target.sets.clone(),
        variants: args.target.variants.clone(),
        reps: args.measure.reps.unwrap_or(info.default_reps),
        warmup: args.measure.warmup.unwrap_or(info.default_warmup),
        seed: args.measure.seed,
        profile: args.measure.profile.clone(),
    };
    let host = host::probe();
    let say = |note: &str| habits::note(&format!("note: {note}"));
    let model_profile = backends::ModelProfile::named(args.measure.profile.as_deref()).noting(&say);
    // What the points would take in the store, refused above its free space (exit 2).
    let store_cost = if args.measure.no_store {
        None
    } else {
        preflight(
            &spec,
            shard,
            &store::resolve_path(db)?,
            &host,
            &model_profile,
        )?
    };
    let plan = lab::sweep::plan(&spec)?;
    args.measure.interference.check()?;
    // Check the database before measuring, so a bad --db does not cost a sweep.
    let mut store = args.measure.run_store(db)?;
    args.measure.interference.apply()?;
    let threads = match args.target.backend {
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
        args.target.backend,
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
        |seed| backends::make(args.target.backend, host.clone(), &model_profile, seed),
        &progress,
        |mut record| {
            if let Some(store) = &mut store {
                store.save(&mut record)?;
            } else if !json {
                super::print_run(&record, false)?;
                print_text("")?;
            }
            run_ids.push(record.run_id.clone());
            if store.is_none() && json {
                unstored.push(record);
            }
            Ok::<(), Error>(())
        },
    )?;
    if json {
        let mut doc = serde_json::json!({
            "sweep": OutcomeJson::of(&outcome), "shard": shard.to_string(), "runs": run_ids, "store_cost": store_cost
        });
        if store.is_none() {
            doc["records"] = serde_json::to_value(&unstored).map_err(std::io::Error::other)?;
        }
        print_json(&doc)?;
    } else {
        print_summary(db, &outcome, shard, store.as_ref())?;
    }
    Ok(exit_code(&outcome))
}

/// What a sweep's points did, for a person: the problems, the summary and, when stored, the
/// whole sweep's table as stored (other shards' points included).
fn print_summary(
    db: Option<&Path>,
    outcome: &lab::sweep::SweepOutcome,
    shard: lab::shard::Shard,
    store: Option<&super::run_store::RunStore>,
) -> Result<(), Error> {
    for p in &outcome.skipped {
        eprintln!("skipped {}", words::point_problem(p));
    }
    for p in &outcome.failed {
        eprintln!("failed {}", words::point_problem(p));
    }
    print_text(&render::sweep_summary(
        outcome,
        shard,
        store.map(super::run_store::RunStore::display).as_deref(),
    ))?;
    if store.is_some() && outcome.ran > 0 {
        let records = Store::open_read(&store::resolve_path(db)?)?.sweep_runs(&outcome.id)?;
        if !records.is_empty() {
            print_table(&render::sweep_table(&records))?;
        }
        print_text(&format!("report: hvlab report --sweep {}", outcome.id))?;
    }
    Ok(())
}

/// A sweep with a failed point exits 4; one whose every point was skipped (the host could
/// not run any), 3.
fn exit_code(outcome: &lab::sweep::SweepOutcome) -> ExitCode {
    if !outcome.failed.is_empty() {
        ExitCode::from(4)
    } else if outcome.ran == 0 && !outcome.skipped.is_empty() {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}

/// The store-cost check before the sweep: its estimate said as a note, a store without room
/// refused (exit 2), an estimate that could not be made said as a warning (only the check is
/// lost, not the sweep).
fn preflight(
    spec: &lab::sweep::SweepSpec,
    shard: lab::shard::Shard,
    at: &store::Location,
    host: &hvlab_core::host::HostInfo,
    model_profile: &backends::ModelProfile<'_>,
) -> Result<Option<lab::sweep::StoreCost>, Error> {
    use lab::sweep::Preflight;
    match lab::sweep::preflight(spec, shard, at, host, model_profile)? {
        Preflight::Fits { cost, free } => {
            habits::note(&words::sweep_store_cost(&cost, free));
            Ok(Some(cost))
        }
        Preflight::NoRoom { cost, store, free } => Err(InputError::BadValue {
            key: "--grid".into(),
            value: lab::sweep::axes_text(&spec.axes),
            why: words::sweep_too_big(&cost, &store.display().to_string(), free),
        }
        .into()),
        Preflight::NotEstimated(e) => {
            habits::note(&words::sweep_cost_unknown(&e));
            Ok(None)
        }
    }
}

/// The sweep's outcome in `--json`, as it has always been shown: a skipped or failed point as
/// its words.
#[derive(serde::Serialize)]
struct OutcomeJson<'a> {
    id: &'a str,
    points: usize,
    units: &'a [String],
    ran: usize,
    skipped: Vec<String>,
    failed: Vec<String>,
}

impl OutcomeJson<'_> {
    fn of(o: &lab::sweep::SweepOutcome) -> OutcomeJson<'_> {
        OutcomeJson {
            id: &o.id,
            points: o.points,
            units: &o.units,
            ran: o.ran,
            skipped: o.skipped.iter().map(words::point_problem).collect(),
            failed: o.failed.iter().map(words::point_problem).collect(),
        }
    }
}
