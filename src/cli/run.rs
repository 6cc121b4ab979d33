//! `hvlab run`: one scenario on one backend, stored.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::progress::TermProgress;
use super::{MeasureArgs, habits, print_json, request_of};
use crate::cli::Error;
use crate::error::InputError;
use crate::kernel::kprobe::CallSpec;
use crate::lab::{backends, host};
use crate::scenario::{self, Baseline};
use hvlab_core::BackendKind;

#[derive(Debug, Args)]
pub(super) struct RunArgs {
    /// Scenario (see `hvlab list`)
    scenario: String,
    #[command(flatten)]
    target: Target,
    #[command(flatten)]
    measure: MeasureArgs,
    /// Include KVM statistics in the terminal output
    #[arg(short, long)]
    verbose: bool,
    /// Judge every other variant against this one, instead of the scenario's question (its
    /// baseline and comparisons, see `hvlab list`)
    #[arg(long, value_name = "V")]
    baseline_variant: Option<String>,
    /// Judge every variant against the fastest one, instead of the scenario's question
    #[arg(long, conflicts_with = "baseline_variant")]
    against_fastest: bool,
    /// Save the run as the named baseline of its scenario and backend (criterion's habit):
    /// `hvlab compare --baseline NAME` judges later runs against it; saving again moves it
    #[arg(long, value_name = "NAME", value_parser = parse_baseline_name, conflicts_with = "no_store")]
    save_baseline: Option<String>,
    /// For `hvlab kab`'s guests: after the timed repetitions, count calls of these kernel
    /// functions ([MODULE:]FUNCTION[/CALLER...], comma-separated) in one untimed repetition
    /// of each variant, with kprobes
    #[arg(long, value_name = "FUNCTIONS", value_delimiter = ',', hide = true, value_parser = parse_call_spec)]
    count_calls: Vec<CallSpec>,
}

/// What a scenario runs on and with, for `run` and for every point of a `sweep`: the backend,
/// the variants and the scenario's parameters.
#[derive(Debug, Args)]
pub(super) struct Target {
    /// Backend
    #[arg(long, value_parser = super::backend_arg(), default_value_t = BackendKind::Kvm)]
    pub(super) backend: BackendKind,
    /// Variant to run (repeatable); default: all
    #[arg(long = "variant", value_name = "V")]
    pub(super) variants: Vec<String>,
    /// Scenario parameter key=value (repeatable), see `hvlab list`
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub(super) sets: Vec<String>,
}

/// `hvlab run`: checks everything it can before measuring (the request, the options, the
/// store), then runs, judges, stores and prints.
pub(super) fn run(db: Option<&Path>, args: RunArgs) -> Result<ExitCode, Error> {
    let kind = scenario::Kind::named(&args.scenario)?;
    if args.target.backend == BackendKind::Kvm && args.measure.profile.is_some() {
        return Err(InputError::ProfileWithKvm.into());
    }
    let params = kind.parse(&args.target.sets, args.target.backend.capabilities())?;
    let request = request_of(kind.info(), &args.measure, args.target.variants, params);
    scenario::check(&request, args.target.backend)?;
    let baseline = match (&args.baseline_variant, args.against_fastest) {
        (Some(v), _) => Baseline::Variant(v.clone()),
        (None, true) => Baseline::Fastest,
        (None, false) => Baseline::Declared,
    };
    scenario::check_baseline(&request, args.target.backend, &baseline)?;
    for notice in scenario::notices(&request) {
        habits::note(&format!("note: {}", crate::export::words::notice(&notice)));
    }
    args.measure.interference.check()?;
    // Check the database before measuring, so a bad --db does not cost a run.
    let mut run_store = args.measure.run_store(db)?;
    args.measure.interference.apply()?;
    let say = |note: &str| habits::note(&format!("note: {note}"));
    let mut backend = backends::make(
        args.target.backend,
        host::probe(),
        &backends::ModelProfile::named(args.measure.profile.as_deref()).noting(&say),
        args.measure.seed,
    )?;
    let progress = TermProgress::new(kind.info().name, args.measure.json);
    let mut record = scenario::run_with_baseline(backend.as_mut(), &request, &baseline, &progress)?;
    // A kernel under test on the instruction clock (QEMU's `-icount` on its command line)
    // prices an MSR write or a TLB flush at one instruction: where the scenario has
    // iterations (exits), its host events are counted per iteration even when no patched
    // function is asked for (a patch whose lines no debug information maps to a function).
    let events_here = record.host.clock == hvlab_core::host::Clock::Icount
        && record.params.contains_key("iterations");
    if !args.count_calls.is_empty() || events_here {
        record.calls = calls_counted(backend.as_mut(), &request, &record, &args.count_calls);
    }
    judged_or_failures_kept(&mut record, run_store.as_mut())?;
    record.baseline = args.save_baseline;
    if let Some(s) = &mut run_store {
        s.save(&mut record)?;
    }
    if args.measure.json {
        print_json(&record)?;
    } else {
        super::print_run(&record, args.verbose)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether the run produced samples (`Ok`), or its error; a run whose every variant failed is
/// stored with each variant's failure first, when there is a store, and the error says where.
/// A kab in a guest brings it back and judges it (the patched kernel failed a variant the base
/// ran) instead of losing the variant. It is never saved as a baseline.
fn judged_or_failures_kept(
    record: &mut crate::record::RunRecord,
    store: Option<&mut super::run_store::RunStore>,
) -> Result<(), Error> {
    match (scenario::judge(record), store) {
        (Err(crate::error::Error::AllFailed { scenario, reasons }), Some(s)) => {
            s.save(record)?;
            Err(Error::AllFailedStored {
                scenario,
                run_id: record.run_id.clone(),
                reasons,
            })
        }
        (judged, _) => Ok(judged?),
    }
}

/// `--count-calls`: per variant that produced samples, one more repetition of it alone,
/// untimed and unrecorded, with kprobes on `specs` armed only around it (so the timed
/// repetitions before it never pay for a probe), and the kernel's own MSR writes and TLB
/// flushes counted in it too ([`crate::kernel::kprobe::count_events`]), per iteration when the
/// scenario has them. A repetition that fails leaves its counts as they are: whatever ran
/// before the failure was counted.
fn calls_counted(
    backend: &mut dyn hvlab_core::Backend,
    request: &scenario::runner::RunRequest,
    record: &crate::record::RunRecord,
    specs: &[CallSpec],
) -> Vec<crate::analysis::calls::VariantCalls> {
    record
        .variants
        .iter()
        .filter(|v| v.is_ok())
        .map(|v| {
            let once = scenario::runner::RunRequest {
                variants: vec![v.name.clone()],
                reps: 1,
                warmup: 0,
                ..request.clone()
            };
            let (events, (functions, _)) = crate::kernel::kprobe::count_events(|| {
                crate::kernel::kprobe::count_calls(specs, || {
                    scenario::run(backend, &once, &crate::scenario::runner::Silent)
                })
            });
            crate::analysis::calls::VariantCalls {
                variant: v.name.clone(),
                functions,
                events,
                iterations: record
                    .params
                    .get("iterations")
                    .and_then(serde_json::Value::as_u64),
            }
        })
        .collect()
}

fn parse_call_spec(text: &str) -> Result<CallSpec, String> {
    CallSpec::parse(text).map_err(|e| e.to_string())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::kab::fixture;
    use crate::record::VariantStatus;

    /// The guest's `hvlab run dirty` whose every variant failed keeps the run, each
    /// variant's failure in it, and still fails (exit 4) naming where; without a store, and
    /// when every variant is merely unsupported here, nothing is stored.
    #[test]
    fn a_run_whose_every_variant_failed_is_stored_with_the_failures_and_exits_4() {
        let runs = fixture::runs();
        let failed = fixture::side(&runs, "B").remove(0);
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("guest.db");
        let mut store = super::super::run_store::RunStore::open(Some(&db), false).unwrap();
        let mut record = failed.clone();
        let err = judged_or_failures_kept(&mut record, Some(&mut store)).unwrap_err();
        assert_eq!(err.exit_code(), 4);
        let text = err.to_string();
        assert!(
            text.contains(&format!("stored as {}", record.run_id)) && text.contains(fixture::LOST),
            "{text}"
        );
        drop(store);
        let kept = crate::store::Store::open(&db)
            .unwrap()
            .load(&record.run_id)
            .unwrap();
        assert!(!kept.produced_samples());
        assert!(
            kept.variants
                .iter()
                .all(|v| v.status == VariantStatus::Failed(fixture::LOST.into()))
        );
        assert_eq!(kept.baseline, None);
        // No store (--no-store): the failure as before, nothing written.
        let mut record = failed.clone();
        let err = judged_or_failures_kept(&mut record, None).unwrap_err();
        assert!(
            matches!(
                err,
                Error::Lab(crate::lab::Error::Run(
                    crate::error::Error::AllFailed { .. }
                ))
            ),
            "{err}"
        );
        // Every variant unsupported here: the host's limit (exit 3), not stored.
        let db = dir.path().join("unsupported.db");
        let mut store = super::super::run_store::RunStore::open(Some(&db), false).unwrap();
        let mut record = failed;
        for v in &mut record.variants {
            v.status = VariantStatus::Unsupported("needs KVM_CAP_DIRTY_LOG_RING".into());
        }
        let err = judged_or_failures_kept(&mut record, Some(&mut store)).unwrap_err();
        assert_eq!(err.exit_code(), 3);
        assert_eq!(store.stored(), 0);
    }
}
