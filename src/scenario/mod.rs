//! Scenario definitions: parameters, variants and metrics of every experiment, and the
//! catalog. Scenarios drive a [`Backend`](crate::backend::Backend); they do not know which one.

pub mod dirty;
pub mod exits;
pub mod lifecycle;
pub mod memory;
pub mod memslots;
pub mod params;
pub mod percpu;
pub mod pinning;
pub mod runner;
pub mod samples;

use serde::Serialize;

use crate::analysis::validate::{Check, Rule};
use crate::backend::host::HostInfo;
use crate::backend::{Backend, BackendKind, Capabilities, Execute};
use crate::error::{Error, InputError};
use crate::record::{RunRecord, VariantStatus};
use params::{ParamInfo, Settings};
use runner::{Progress, RunRequest, ScenarioOutcome};

/// A variant: a policy or configuration to compare.
#[derive(Debug, Clone, Serialize)]
pub struct VariantInfo {
    /// Name used with --variant.
    pub name: &'static str,
    /// What it is.
    pub doc: &'static str,
}

/// A metric a scenario reports.
#[derive(Debug, Clone, Serialize)]
pub struct MetricInfo {
    /// Name (dotted; a `*` stands for a family such as `ioctl.*_ms`).
    pub name: &'static str,
    /// Unit.
    pub unit: &'static str,
    /// What it measures and on what basis.
    pub doc: &'static str,
}

/// Everything `hvlab list` shows about a scenario.
#[derive(Debug, Clone, Serialize)]
pub struct ScenarioInfo {
    /// Name.
    pub name: &'static str,
    /// One line.
    pub summary: &'static str,
    /// Variants every backend runs, in default order.
    pub variants: &'static [VariantInfo],
    /// Variants only the model runs (hardware or policies this host lacks).
    pub model_variants: &'static [VariantInfo],
    /// Parameters settable with --set.
    pub params: &'static [ParamInfo],
    /// Metrics.
    pub metrics: &'static [MetricInfo],
    /// The metric verdicts compare variants on.
    pub headline: &'static str,
    /// Whether a backend that can do this runs it (listed as the backends that can).
    #[serde(rename = "backends", serialize_with = "serialize_backends")]
    pub runs_on: fn(Capabilities) -> bool,
    /// Repetitions when --reps is not given (a pass of `memory` takes a second; a lifecycle
    /// construction a few ms).
    pub default_reps: u32,
    /// Warm-up repetitions when --warmup is not given.
    pub default_warmup: u32,
}

/// A scenario every backend runs: its plans ask nothing a backend may lack.
pub fn any_backend(_: Capabilities) -> bool {
    true
}

/// `runs_on` as the catalog shows it: the backends whose capabilities it accepts.
fn serialize_backends<S: serde::Serializer>(
    runs_on: &fn(Capabilities) -> bool,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(
        BackendKind::ALL
            .into_iter()
            .filter(|b| runs_on(b.capabilities())),
    )
}

impl ScenarioInfo {
    /// The backends that run it, in the order runs are listed.
    pub fn backends(&self) -> Vec<BackendKind> {
        BackendKind::ALL
            .into_iter()
            .filter(|b| (self.runs_on)(b.capabilities()))
            .collect()
    }

    /// The variants `backend` runs by default.
    pub fn variants_for(
        &self,
        backend: Capabilities,
    ) -> impl Iterator<Item = &'static VariantInfo> + use<> {
        let model: &'static [VariantInfo] = if backend.modelled {
            self.model_variants
        } else {
            &[]
        };
        self.variants.iter().chain(model.iter())
    }

    /// The error for a variant `backend` cannot run, naming those it can.
    pub fn unknown_variant(&self, name: &str, backend: Capabilities) -> InputError {
        let mut known: Vec<&str> = self.variants_for(backend).map(|v| v.name).collect();
        if !backend.modelled && self.model_variants.iter().any(|v| v.name == name) {
            known.push("(it is a model variant: add --backend model)");
        }
        InputError::UnknownVariant {
            variant: name.to_string(),
            scenario: self.name.to_string(),
            known: known.join(", "),
        }
    }

    /// The variants a run on `backend` measures, in order: those the request names, each one
    /// `backend` runs (else the error naming those it does), or by default every one it runs.
    /// Every scenario's plans start from this selection.
    pub fn selected_variants(
        &self,
        request: &RunRequest,
        backend: Capabilities,
    ) -> Result<Vec<String>, InputError> {
        if request.variants.is_empty() {
            return Ok(self
                .variants_for(backend)
                .map(|v| v.name.to_string())
                .collect());
        }
        request
            .variants
            .iter()
            .map(|name| {
                if self.variants_for(backend).any(|v| v.name == name) {
                    Ok(name.clone())
                } else {
                    Err(self.unknown_variant(name, backend))
                }
            })
            .collect()
    }

    /// Refuses a backend this scenario does not run on, naming those it does.
    pub fn require_backend(&self, backend: BackendKind) -> Result<(), InputError> {
        self.require(backend, backend.capabilities())
    }

    /// Refuses a backend whose capabilities `can` this scenario does not run on (named
    /// `backend`), naming those it does: from the description, before any plan.
    pub fn require(&self, backend: BackendKind, can: Capabilities) -> Result<(), InputError> {
        if (self.runs_on)(can) {
            return Ok(());
        }
        Err(InputError::BackendCannotRun {
            backend: backend.to_string(),
            scenario: self.name.to_string(),
            supported: self
                .backends()
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

/// A chart the report draws for a run, as data: the report owns the drawing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chart {
    /// The representative ioctl timeline with stalls marked.
    Timeline,
    /// One bar per variant of a metric's median.
    Bars {
        /// The metric.
        metric: &'static str,
        /// The caption.
        title: &'static str,
    },
    /// Pinned bytes over time.
    PinnedBytes,
}

/// What a scenario tells the user about a run, as data: the renderer words it
/// (`report::words::notice`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// `--set order=` runs as variant `custom` beside the variants named with --variant.
    CustomOrderAlongside {
        /// The named variants.
        variants: Vec<String>,
    },
    /// The host's transparent huge page mode shaped the real-memory backings.
    ThpMode {
        /// The mode (`always`, `madvise`).
        mode: String,
    },
}

/// Where `hvlab validate` compares the model with the kvm backend, and how.
#[derive(Debug, Clone)]
pub struct ValidationPoint {
    /// The variants compared.
    pub variants: &'static [&'static str],
    /// The scenario's parameters on both backends: a point calibration did not use.
    pub sets: params::Sets,
    /// Its parameters for the model alone (what it must know of the kernel it is checked
    /// against).
    pub model_sets: params::Sets,
    /// The checks of one variant: (model run, kvm run, variant, how times are judged).
    pub checks: fn(&RunRecord, &RunRecord, &str, Rule) -> Vec<Check>,
}

/// A model run the suite adds to show a thread's finding where its mechanism lives (the
/// hardware profile and kernel setup the thread is about), beside the run on this host.
#[derive(Debug, Clone, Copy)]
pub struct Showcase {
    /// The built-in profile.
    pub profile: &'static str,
    /// Variants (empty: the scenario's default model variants).
    pub variants: &'static [&'static str],
    /// The scenario's parameters.
    pub sets: params::Sets,
    /// Why this setup: the thread and what it shows.
    pub why: &'static str,
}

/// What a scenario's variants produced, for its analysis.
#[derive(Debug)]
pub struct Observed<'a, P, S> {
    /// Variant names, in request order.
    pub names: &'a [String],
    /// Each variant's plan.
    pub plans: &'a [P],
    /// Each variant's samples, or why it has none.
    pub results: &'a [Result<Vec<S>, VariantStatus>],
    /// The host the samples describe (the model's modelled host).
    pub host: &'a HostInfo,
    /// The run's seed, for resampling.
    pub seed: u64,
}

/// What one execution of an experiment's plan returns.
pub type SampleOf<E> = <<E as Experiment>::Plan as Execute>::Output;

/// An experiment, as its file defines it: the catalog entry, its parameters as a type, the
/// plan of each variant (which names the backend call that executes it, [`Execute`]), and how
/// the samples are read. Selecting the variants, refusing what a backend cannot run, the run
/// itself (warm-up, interleaved repetitions, failure isolation, the record) are the same for
/// every scenario and live here. Nothing outside the file names the scenario.
pub trait Experiment: Sync {
    /// One variant's plan.
    type Plan: Execute;
    /// The parameters, parsed once from `--set` values ([`Experiment::params`]).
    type Params;
    /// Name, variants, parameters (each declared once), metrics, backends.
    const INFO: &'static ScenarioInfo;

    /// The parameters from `--set` values (defaults filled in), checked against what the
    /// backend can do; bad input is an error naming the fix.
    fn params(&self, settings: &Settings, can: Capabilities) -> Result<Self::Params, InputError>;

    /// The plan of the variant `name`, or `None` when the scenario has no such variant.
    fn plan(
        &self,
        params: &Self::Params,
        name: &str,
        request: &RunRequest,
    ) -> Result<Option<Self::Plan>, InputError>;

    /// One plan per requested variant: by default those [`ScenarioInfo::selected_variants`]
    /// picks, each planned by [`Experiment::plan`].
    fn plans(
        &self,
        params: &Self::Params,
        request: &RunRequest,
        can: Capabilities,
    ) -> Result<Vec<(String, Self::Plan)>, InputError> {
        let names = Self::INFO.selected_variants(request, can)?;
        plan_each(self, params, names, request, can)
    }

    /// Metrics, findings and verdicts from every variant's samples.
    fn analyse(&self, observed: Observed<'_, Self::Plan, SampleOf<Self>>) -> ScenarioOutcome;

    /// The charts after the headline distribution (default: the headline by variant).
    fn charts(&self, _record: &RunRecord) -> Vec<Chart> {
        let headline = Self::INFO.headline;
        vec![Chart::Bars {
            metric: headline,
            title: headline,
        }]
    }

    /// What the user should know about how a request will run, before it runs.
    fn notices(&self, _request: &RunRequest) -> Vec<Notice> {
        Vec::new()
    }

    /// For a run's header: how the host shaped what was measured.
    fn context(&self, _record: &RunRecord) -> Vec<Notice> {
        Vec::new()
    }

    /// Threads one plan keeps runnable at once (vCPUs writing in parallel), for the noise
    /// rule: a run with more of them than cores loads the host itself.
    fn runnable_threads(&self, _plan: &Self::Plan) -> u32 {
        1
    }

    /// Where `validate` checks the model against the kvm backend on `host`, if anywhere.
    fn validation(&self, _host: &HostInfo) -> Option<ValidationPoint> {
        None
    }

    /// Model runs the suite adds on the profiles where the scenario's mechanism lives.
    fn showcases(&self) -> &'static [Showcase] {
        &[]
    }
}

/// The plans of `names`, in order: each one's [`Experiment::plan`], or the error naming the
/// variants `can` runs.
pub fn plan_each<E: Experiment + ?Sized>(
    experiment: &E,
    params: &E::Params,
    names: Vec<String>,
    request: &RunRequest,
    can: Capabilities,
) -> Result<Vec<(String, E::Plan)>, InputError> {
    names
        .into_iter()
        .map(|name| match experiment.plan(params, &name, request)? {
            Some(plan) => Ok((name, plan)),
            None => Err(E::INFO.unknown_variant(&name, can)),
        })
        .collect()
}

/// The plans of a request: its parameters, refused where they are the model's and `can` is
/// not modelled, then one plan per requested variant.
pub fn planned<E: Experiment + ?Sized>(
    experiment: &E,
    settings: &Settings,
    request: &RunRequest,
    can: Capabilities,
) -> Result<Vec<(String, E::Plan)>, InputError> {
    let params = experiment.params(settings, can)?;
    settings.reject_model_only_on(can)?;
    experiment.plans(&params, request, can)
}

/// A scenario as the registry, CLI, suite, report and validate see it: every [`Experiment`]
/// is one, whatever its plan and sample types.
pub trait Scenario: Sync {
    /// The catalog entry.
    fn info(&self) -> &'static ScenarioInfo;
    /// Validates a request without running anything, so bad input is reported as such (exit 2)
    /// even on a host that could not run the scenario.
    fn check(
        &self,
        settings: &Settings,
        request: &RunRequest,
        can: Capabilities,
    ) -> Result<(), InputError>;
    /// Runs the requested variants on `backend`: warm-up, then repetitions with the variants
    /// interleaved, each variant's failure kept to itself; then the analysis.
    fn run(
        &self,
        backend: &mut dyn Backend,
        settings: &Settings,
        request: &RunRequest,
        progress: &dyn Progress,
    ) -> Result<ScenarioOutcome, Error>;
    /// The most threads any planned variant keeps runnable at once
    /// ([`Experiment::runnable_threads`]); 1 when the request does not plan.
    fn runnable_threads(&self, settings: &Settings, request: &RunRequest, can: Capabilities)
    -> u32;
    /// See [`Experiment::charts`].
    fn charts(&self, record: &RunRecord) -> Vec<Chart>;
    /// See [`Experiment::notices`].
    fn notices(&self, request: &RunRequest) -> Vec<Notice>;
    /// See [`Experiment::context`].
    fn context(&self, record: &RunRecord) -> Vec<Notice>;
    /// See [`Experiment::validation`].
    fn validation(&self, host: &HostInfo) -> Option<ValidationPoint>;
    /// See [`Experiment::showcases`].
    fn showcases(&self) -> &'static [Showcase];
}

impl<T: Experiment> Scenario for T {
    fn info(&self) -> &'static ScenarioInfo {
        T::INFO
    }

    fn check(
        &self,
        settings: &Settings,
        request: &RunRequest,
        can: Capabilities,
    ) -> Result<(), InputError> {
        planned(self, settings, request, can).map(drop)
    }

    fn run(
        &self,
        backend: &mut dyn Backend,
        settings: &Settings,
        request: &RunRequest,
        progress: &dyn Progress,
    ) -> Result<ScenarioOutcome, Error> {
        let (names, plans): (Vec<String>, Vec<T::Plan>) =
            planned(self, settings, request, backend.capabilities())?
                .into_iter()
                .unzip();
        let real_time = backend.capabilities().real_time;
        let results = runner::repeat(&names, request, real_time, progress, |vi| {
            plans[vi].execute(backend).map_err(Error::from)
        });
        Ok(self.analyse(Observed {
            names: &names,
            plans: &plans,
            results: &results,
            host: backend.host(),
            seed: request.seed,
        }))
    }

    fn runnable_threads(
        &self,
        settings: &Settings,
        request: &RunRequest,
        can: Capabilities,
    ) -> u32 {
        planned(self, settings, request, can).map_or(1, |plans| {
            plans
                .iter()
                .map(|(_, p)| Experiment::runnable_threads(self, p))
                .max()
                .unwrap_or(1)
        })
    }

    fn charts(&self, record: &RunRecord) -> Vec<Chart> {
        Experiment::charts(self, record)
    }

    fn notices(&self, request: &RunRequest) -> Vec<Notice> {
        Experiment::notices(self, request)
    }

    fn context(&self, record: &RunRecord) -> Vec<Notice> {
        Experiment::context(self, record)
    }

    fn validation(&self, host: &HostInfo) -> Option<ValidationPoint> {
        Experiment::validation(self, host)
    }

    fn showcases(&self) -> &'static [Showcase] {
        Experiment::showcases(self)
    }
}

/// Every scenario hvlab has, in catalog order.
pub static REGISTRY: [&dyn Scenario; 7] = [
    &lifecycle::Lifecycle,
    &memory::Memory,
    &exits::Exits,
    &pinning::Pinning,
    &percpu::Percpu,
    &dirty::Dirty,
    &memslots::Memslots,
];

/// Every scenario's catalog entry.
pub fn catalog() -> Vec<&'static ScenarioInfo> {
    REGISTRY.iter().map(|s| s.info()).collect()
}

/// Looks a scenario up by name.
pub fn find(name: &str) -> Result<&'static ScenarioInfo, InputError> {
    scenario(name).map(|s| s.info())
}

/// The scenario called `name`.
pub fn scenario(name: &str) -> Result<&'static dyn Scenario, InputError> {
    REGISTRY
        .iter()
        .copied()
        .find(|s| s.info().name == name)
        .ok_or_else(|| {
            InputError::UnknownScenario(
                name.to_string(),
                catalog()
                    .iter()
                    .map(|s| s.name)
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
}

/// Refuses a variant named twice: it would be measured twice and could not be stored.
pub fn reject_duplicate_variants(request: &RunRequest) -> Result<(), InputError> {
    let mut seen = std::collections::BTreeSet::new();
    match request.variants.iter().find(|v| !seen.insert(v.as_str())) {
        Some(dup) => Err(InputError::BadValue {
            key: "--variant".into(),
            value: dup.clone(),
            why: format!("`{dup}` is given more than once; give each --variant once"),
        }),
        None => Ok(()),
    }
}

/// Validates a request against a scenario without running anything, so bad input is reported
/// as such (exit 2) even on a host that could not run the scenario.
pub fn check(
    info: &ScenarioInfo,
    request: &RunRequest,
    backend: BackendKind,
) -> Result<(), InputError> {
    reject_duplicate_variants(request)?;
    let settings = Settings::parse(info, &request.sets)?;
    scenario(info.name)?.check(&settings, request, backend.capabilities())
}

/// Runs a registered scenario on a backend and returns the complete record (not yet stored).
pub fn run(
    info: &ScenarioInfo,
    backend: &mut dyn Backend,
    request: &RunRequest,
    progress: &dyn Progress,
) -> Result<RunRecord, Error> {
    run_scenario(scenario(info.name)?, backend, request, progress)
}

/// Runs any scenario on a backend: the one shape every scenario's run takes (backend check,
/// input check, the scenario's execution, the record around it).
pub fn run_scenario(
    s: &dyn Scenario,
    backend: &mut dyn Backend,
    request: &RunRequest,
    progress: &dyn Progress,
) -> Result<RunRecord, Error> {
    let info = s.info();
    info.require(backend.kind(), backend.capabilities())?;
    reject_duplicate_variants(request)?;
    let settings = Settings::parse(info, &request.sets)?;
    let started = runner::now_rfc3339();
    // The model's samples are exact: the host's noise does not touch them, so it is neither
    // watched nor said.
    let real_time = backend.capabilities().real_time;
    let _ = crate::backend::noise::take_reps();
    let own_threads = if real_time {
        s.runnable_threads(&settings, request, backend.capabilities())
    } else {
        1
    };
    let before = real_time.then(crate::backend::noise::Snapshot::take);
    let outcome = s.run(backend, &settings, request, progress)?;
    let noise = before.map(|before| {
        let after = crate::backend::noise::Snapshot::take();
        crate::backend::noise::Noise::between(
            &before,
            &after,
            &crate::backend::noise::take_reps(),
            own_threads,
        )
    });
    let mut record = runner::assemble(info, backend, &settings, request, started, outcome);
    if let Some(noise) = noise {
        record.warnings = crate::analysis::robust::warnings(&record, info.headline, Some(&noise));
        record.noise = Some(noise);
    } else {
        record.warnings = crate::analysis::robust::warnings(&record, info.headline, None);
    }
    Ok(record)
}

/// The run-level outcome of a finished run (DESIGN.md, exit codes): at least one variant
/// produced samples, or the error to exit with. Every variant unsupported here is the host's
/// limitation (exit 3); no variant producing samples while one or more failed is a
/// measurement failure (exit 4). Either way the run must not be stored.
pub fn judge(record: &RunRecord) -> Result<(), Error> {
    if record
        .variants
        .iter()
        .any(crate::record::VariantRecord::is_ok)
    {
        return Ok(());
    }
    let reasons = record
        .variants
        .iter()
        .map(|v| format!("  {}: {}", v.name, v.status))
        .collect::<Vec<_>>()
        .join("\n");
    let scenario = record.scenario.clone();
    if record
        .variants
        .iter()
        .all(|v| matches!(v.status, crate::record::VariantStatus::Unsupported(_)))
    {
        Err(Error::AllUnsupported { scenario, reasons })
    } else {
        Err(Error::AllFailed { scenario, reasons })
    }
}
