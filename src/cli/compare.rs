//! `hvlab compare`: B against A, runs or host selectors, with the regression gate.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::{habits, print_json, print_text, render};
use crate::analysis::class::MetricClass;
use crate::cli::Error;
use crate::error::InputError;
use crate::lab;
use crate::store::{self, Store};

#[derive(Debug, Args)]
pub(super) struct CompareArgs {
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
}

/// `hvlab compare`: resolves the sides (a named baseline, runs, or host selectors), then
/// compares hosts or runs.
pub(super) fn compare(db: Option<&Path>, args: &CompareArgs) -> Result<ExitCode, Error> {
    let threshold = lab::compare::parse_threshold(&args.threshold)?;
    let judging = lab::compare::Judging {
        correction: args.correction,
        ..lab::compare::Judging::new(threshold, args.fail_on_regression)
    };
    let store = Store::open_read(&store::resolve_path(db)?)?;
    let (a, b) = match &args.baseline {
        Some(name) => lab::select::against_baseline(&store, name, args.a.as_deref())?,
        None => (
            args.a.clone().unwrap_or_default(),
            args.b.clone().unwrap_or_default(),
        ),
    };
    if lab::fleet::Selector::looks_like(&a) || lab::fleet::Selector::looks_like(&b) {
        compare_hosts(&store, [&a, &b], args, judging)
    } else {
        compare_runs(&store, [&a, &b], args, judging)
    }
}

/// B's hosts against A's, per matched host and overall, then the gate.
fn compare_hosts(
    store: &Store,
    [a, b]: [&str; 2],
    args: &CompareArgs,
    judging: lab::compare::Judging,
) -> Result<ExitCode, Error> {
    let (sa, sb) = (
        lab::fleet::Selector::parse(a)?,
        lab::fleet::Selector::parse(b)?,
    );
    let outcome = lab::compare::compare_fleet(
        store,
        &sa,
        &sb,
        args.scenario.as_deref(),
        args.variant.as_deref(),
        args.metric.as_deref(),
        judging,
    )?;
    if args.json {
        print_json(&outcome)?;
    } else {
        print_text(&render::fleet_compare(a, b, &outcome))?;
    }
    gate(
        args.fail_on_regression,
        &outcome.gate,
        "B looks slower, but some runs of the fleet were measured on a busy host",
    )
}

/// Run B (or its variant, or runs) against A, every variant pair judged together, then the
/// gate.
fn compare_runs(
    store: &Store,
    [a, b]: [&str; 2],
    args: &CompareArgs,
    judging: lab::compare::Judging,
) -> Result<ExitCode, Error> {
    if args.scenario.is_some() || args.variant.is_some() {
        return Err(InputError::BadValue {
            key: "--scenario/--variant".into(),
            value: args
                .scenario
                .clone()
                .or_else(|| args.variant.clone())
                .unwrap_or_default(),
            why: "they go with host selectors (kernel=6.18); with runs, name the variant as RUN:variant".into(),
        }
        .into());
    }
    let outcome = lab::compare::compare(store, a, b, args.metric.as_deref(), judging)?;
    let (results, g) = (&outcome.comparisons, &outcome.gate);
    if args.json {
        print_json(
            &serde_json::json!({ "comparisons": crate::record::worded(results, "text").map_err(|e| Error::Output(e.into()))?, "regression": g.regression, "busy": {"a": g.busy[0], "b": g.busy[1]}, "confounded": g.confounded }),
        )?;
    } else {
        print_text(&format!("A = {a}\nB = {b}"))?;
        for (side, busy) in ["A", "B"].iter().zip(&g.busy) {
            if let Some(why) = busy.first() {
                print_text(&format!(
                    "warning: side {side} was measured on a busy host ({why}): its times may be inflated"
                ))?;
            }
        }
        for c in results {
            let style = match c.verdict {
                MetricClass::Faster => habits::style::GOOD,
                MetricClass::Slower => habits::style::BAD,
                MetricClass::NoChange | MetricClass::NotDecided => anstyle::Style::new(),
            };
            habits::print_styled(&format!("  [{}] {}", comparison_label(c), c), style)?;
        }
    }
    gate(
        args.fail_on_regression,
        g,
        "B looks slower, but A and B are different runs",
    )
}

/// The gate of a comparison: refused when a regression it would fail on is confounded by a
/// busy host (`confounded` says how), else exit 1 on a regression when `fail_on_regression`.
fn gate(
    fail_on_regression: bool,
    g: &lab::compare::Gate,
    confounded: &str,
) -> Result<ExitCode, Error> {
    busy_gate(
        fail_on_regression && g.regression,
        g.confounded && !g.beyond_busy_noise,
        &g.busy,
        confounded,
    )?;
    regression_exit(fail_on_regression, g.regression, &g.too_few, g.needed)
}

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

/// `hvlab compare`'s exit: with `--fail-on-regression`, 1 on a regression, and an error when
/// some comparison had too few samples to judge (`needed` per side would).
fn regression_exit(
    fail_on_regression: bool,
    regression: bool,
    too_few: &[String],
    needed: usize,
) -> Result<ExitCode, Error> {
    if fail_on_regression && regression {
        return Ok(ExitCode::from(1));
    }
    if fail_on_regression && !too_few.is_empty() {
        return Err(InputError::TooFewToJudge(too_few.join(", "), needed).into());
    }
    Ok(ExitCode::SUCCESS)
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
