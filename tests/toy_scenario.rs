//! A sixth scenario takes one file: this one. It implements `Scenario` (its parameters, each
//! declared once in its table; the plan of each variant; how to read the samples) over a plan
//! type the backends already speak (a batch of CPUID exits); the generic machinery reads its
//! `--set` text, checks its input, repeats it on the model backend with variants interleaved,
//! and assembles its record. Listing it in the CLI, suite, report and validate would take its
//! entry in the registry (`scenario::Kind` and `scenario::Params`).
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::time::Duration;

use hvlab::analysis::Direction;
use hvlab::error::InputError;
use hvlab::model::ModelBackend;
use hvlab::model::profile::Profile;
use hvlab::record::{VariantRecord, VariantStatus};
use hvlab::scenario::params::{self, Param, Values};
use hvlab::scenario::runner::{RunRequest, ScenarioOutcome, Silent};
use hvlab::scenario::samples::{Series, per_variant};
use hvlab::scenario::{
    IcountTolerance, MetricInfo, Observed, Scenario, ScenarioInfo, VariantInfo, run_scenario,
};
use hvlab_core::BackendKind;
use hvlab_core::exits::{ExitKind, ExitPlan, ExitResult};

static INFO: ScenarioInfo = ScenarioInfo {
    name: "cpuid-batch",
    summary: "a toy: CPUID roundtrips in batches of two sizes",
    variants: &[
        VariantInfo {
            name: "small",
            doc: "100 iterations",
        },
        VariantInfo {
            name: "large",
            doc: "10000 iterations",
        },
    ],
    model_variants: &[],
    metrics: &[MetricInfo {
        name: "roundtrip_ns",
        unit: "ns",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "host time per CPUID roundtrip",
    }],
    headline: "roundtrip_ns",
    // The toy asks how a large batch compares with a small one.
    question: hvlab::scenario::Question {
        asks: "what a large batch costs per roundtrip against a small one",
        baseline: Some("small"),
        judged: &[],
        pairs: &[],
        within: None,
        costs: false,
    },
    runs_on: hvlab::scenario::any_backend,
    default_reps: 3,
    default_warmup: 0,
};

/// The toy's parameters: the watchdog per batch.
#[derive(Debug, Clone)]
struct Batch {
    timeout: Duration,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch {
            timeout: Duration::from_secs(1),
        }
    }
}

static PARAMS: [Param<Batch>; 1] = [Param {
    name: "timeout_ms",
    doc: "watchdog per batch",
    values: Values::Range(10, 60_000),
    model_only: false,
    read: |p, t| {
        p.timeout = Duration::from_millis(u64::from(t.whole()?));
        Ok(())
    },
    spell: |p| p.timeout.as_millis().to_string(),
}];

struct CpuidBatch;

impl Scenario for CpuidBatch {
    type Plan = ExitPlan;
    type Params = Batch;
    const INFO: &'static ScenarioInfo = &INFO;
    const PARAMS: &'static [Param<Batch>] = &PARAMS;

    fn plan(
        &self,
        name: &str,
        request: &RunRequest<Batch>,
    ) -> Result<Option<ExitPlan>, InputError> {
        let iterations = match name {
            "small" => 100,
            "large" => 10_000,
            _ => return Ok(None),
        };
        Ok(Some(ExitPlan {
            kind: ExitKind::Cpuid,
            iterations,
            cpl: None,
            timeout: request.params.timeout,
            pmu: None,
        }))
    }

    fn analyse(&self, o: Observed<'_, ExitPlan, ExitResult>) -> ScenarioOutcome {
        let variants = per_variant(o.names, o.results, |_, name, batches| {
            let mut series = Series::new();
            for (rep, b) in batches.iter().enumerate() {
                series.at(rep).push(
                    "roundtrip_ns",
                    "ns",
                    b.elapsed_ns as f64 / b.iterations as f64,
                );
            }
            VariantRecord {
                name: name.to_string(),
                status: VariantStatus::Ok,
                metrics: series.finish(batches.len(), name, o.seed),
                findings: Vec::new(),
                timeline: Vec::new(),
                pinned_bytes: Vec::new(),
            }
        });
        ScenarioOutcome { variants }
    }
}

fn model() -> ModelBackend {
    let host = hvlab::lab::host::probe();
    ModelBackend::new(Profile::load("pvm-epyc").unwrap(), host, 7)
}

#[test]
fn a_sixth_scenario_runs_through_the_generic_machinery() {
    let request = RunRequest {
        reps: 3,
        warmup: 0,
        ..RunRequest::new(Batch::default())
    };
    let record = run_scenario(&CpuidBatch, &mut model(), &request, &Silent).unwrap();
    assert_eq!(record.scenario, "cpuid-batch");
    assert_eq!(record.backend, BackendKind::Model);
    let names: Vec<&str> = record.variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["small", "large"]);
    for v in &record.variants {
        assert_eq!(v.status, "ok", "{}", v.name);
        let m = &v.metrics["roundtrip_ns"];
        assert_eq!(m.n, 3);
        assert!(m.median > 0.0);
    }
    // The parameter declared once in its table is in the record, with its default.
    assert_eq!(record.params["timeout_ms"], 1000);
}

#[test]
fn the_generic_machinery_checks_a_new_scenarios_input() {
    let bad = RunRequest {
        variants: vec!["huge".into()],
        ..RunRequest::new(Batch::default())
    };
    let e = run_scenario(&CpuidBatch, &mut model(), &bad, &Silent).unwrap_err();
    assert!(e.to_string().contains("small, large"), "{e}");
    let twice = RunRequest {
        variants: vec!["small".into(), "small".into()],
        ..RunRequest::new(Batch::default())
    };
    assert!(run_scenario(&CpuidBatch, &mut model(), &twice, &Silent).is_err());
    let can = BackendKind::Model.capabilities();
    let e = params::parse(INFO.name, &PARAMS, &["timeout_ms=5".into()], can).unwrap_err();
    assert!(
        e.to_string().contains("timeout_ms") && e.to_string().contains("from 10 to 60000"),
        "{e}"
    );
    let read = params::parse(INFO.name, &PARAMS, &["timeout_ms=250".into()], can).unwrap();
    assert_eq!(read.timeout, Duration::from_millis(250));
    let listed = params::infos(&PARAMS);
    assert_eq!(
        (listed[0].default.as_str(), listed[0].range),
        ("1000", Some([10, 60_000]))
    );
}
