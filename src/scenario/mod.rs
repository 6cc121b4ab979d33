//! Scenario definitions: parameters, variants and metrics of every experiment, the one
//! [`Scenario`] trait each implements, the run every scenario takes ([`run_scenario`]), and the
//! registry ([`Kind`], [`Params`]). Scenarios drive a [`Backend`](hvlab_core::Backend); they
//! do not know which one.

pub mod dirty;
pub mod exits;
pub mod lifecycle;
pub mod memory;
pub mod memslots;
pub mod params;
pub mod percpu;
pub mod pinning;
pub mod question;
pub mod runner;
pub mod samples;

use serde::Serialize;

use crate::analysis::compare::StallCause;
use crate::analysis::direction::{self, Declared, Direction};
pub use crate::analysis::icount::IcountTolerance;
use crate::analysis::validate::{Check, Rule};
use crate::error::{Error, InputError};
use crate::record::{RunRecord, VariantRecord, VariantStatus};
use hvlab_core::host::HostInfo;
use hvlab_core::{Backend, BackendKind, Capabilities, Execute};
use params::{Param, ParamInfo};
pub use question::{Baseline, Question};
use runner::{Progress, RunRequest, ScenarioOutcome};

/// Kernel code a scenario's runs reach only with a KVM module parameter: `hvlab kab` names
/// it beside a NOT EXERCISED verdict whose patched functions are among `functions`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Reaches {
    /// The source file of the functions.
    pub file: &'static str,
    /// The functions only it reaches.
    pub functions: &'static [&'static str],
    /// What reaches them, in words (`the legacy MMU`).
    pub by: &'static str,
    /// The `--kvm-param` that selects it (`kvm.tdp_mmu=N`).
    pub kvm_param: &'static str,
}

/// What reaches the kernel code `scenario`'s default runs do not ([`Reaches`]).
pub fn reaches(scenario: &str) -> &'static [Reaches] {
    if scenario == Kind::Memory.name() {
        &memory::REACHES
    } else {
        &[]
    }
}

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
    /// Which way is better: kab, `compare` and the suite judge the metric by it.
    pub better: Direction,
    /// An exact count's relative change (0.01: 1% of the count) below which kab reports it
    /// as a change, neither a regression nor an improvement; 0 where every change counts.
    pub count_tolerance: f64,
    /// For a time: how far it may move on QEMU's instruction clock without being a change
    /// (a share of A's median and a floor in instructions, the larger;
    /// [`IcountTolerance::TIME`] unless the metric is known to move more, or less, between
    /// boots of one kernel).
    pub icount_tolerance: IcountTolerance,
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
    /// Metrics.
    pub metrics: &'static [MetricInfo],
    /// The metric verdicts compare variants on.
    pub headline: &'static str,
    /// What the verdicts answer: the baseline and the comparisons that matter.
    pub question: Question,
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

    /// The declaration of `metric`: its own entry, else the family that names it
    /// (`ioctl.<NAME>_ms` for `ioctl.KVM_CREATE_VM_ms`).
    pub fn metric(&self, metric: &str) -> Option<&'static MetricInfo> {
        let metrics: &'static [MetricInfo] = self.metrics;
        metrics
            .iter()
            .find(|m| m.name == metric)
            .or_else(|| metrics.iter().find(|m| direction::names(m.name, metric)))
    }

    /// Which way `metric` is better and its count tolerance, as a judge reads them; a metric
    /// the scenario does not declare is lower-is-better and says so ([`Declared::UNDECLARED`]).
    pub fn declared(&self, metric: &str) -> Declared {
        self.metric(metric)
            .map_or(Declared::UNDECLARED, |m| Declared {
                direction: m.better,
                count_tolerance: m.count_tolerance,
                icount_tolerance: m.icount_tolerance,
                declared: true,
            })
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
        variants: &[String],
        backend: Capabilities,
    ) -> Result<Vec<String>, InputError> {
        if variants.is_empty() {
            return Ok(self
                .variants_for(backend)
                .map(|v| v.name.to_string())
                .collect());
        }
        variants
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

    /// Whether it has a parameter `key` (`--set key=...`).
    pub fn has_param(&self, key: &str) -> bool {
        Kind::named(self.name).is_ok_and(|k| k.param_infos().iter().any(|p| p.name == key))
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
/// (`export::words::notice`).
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
pub struct ValidationPoint<P> {
    /// The variants compared.
    pub variants: &'static [&'static str],
    /// The scenario's parameters on the kvm backend: a point calibration did not use.
    pub params: P,
    /// The same point for the model, with what it must know of the kernel it is checked
    /// against (model parameters).
    pub model_params: P,
    /// The checks of one variant: (model run, kvm run, variant, how times are judged).
    pub checks: fn(&RunRecord, &RunRecord, &str, Rule) -> Vec<Check>,
}

impl<P: Into<Params>> ValidationPoint<P> {
    /// The point with its parameters as the registry holds them.
    pub fn erase(self) -> ValidationPoint<Params> {
        ValidationPoint {
            variants: self.variants,
            params: self.params.into(),
            model_params: self.model_params.into(),
            checks: self.checks,
        }
    }
}

/// A model run the suite adds to show a thread's finding where its mechanism lives (the
/// hardware profile and kernel setup the thread is about), beside the run on this host.
#[derive(Debug, Clone)]
pub struct Showcase<P> {
    /// The built-in profile.
    pub profile: &'static str,
    /// Variants (empty: the scenario's default model variants).
    pub variants: &'static [&'static str],
    /// The scenario's parameters.
    pub params: P,
    /// Why this setup: the thread and what it shows.
    pub why: &'static str,
    /// The thread's headline this run answers, when it is a before/after.
    pub headline: Option<Headline>,
}

impl<P: Into<Params>> Showcase<P> {
    /// The showcase with its parameters as the registry holds them.
    pub fn erase(self) -> Showcase<Params> {
        Showcase {
            profile: self.profile,
            variants: self.variants,
            params: self.params.into(),
            why: self.why,
            headline: self.headline,
        }
    }
}

/// A kernel thread's headline as a verdict: the before/after its showcase shows, judged as one
/// comparison in the thread's terms (`lab::threads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headline {
    /// The thread (its seed number, `001`).
    pub thread: &'static str,
    /// Where "before" was measured: this showcase's own run (`None`), or the run of the
    /// scenario's showcase at this index (the same variants under the old kernel code).
    pub before_run: Option<usize>,
    /// The two sides' names in the thread's terms, when the runs (not variants) differ:
    /// `("always-defer", "lifecycle-keyed")`.
    pub sides: Option<(&'static str, &'static str)>,
    /// The comparisons, judged together.
    pub pairs: &'static [HeadlinePair],
}

/// One before/after comparison of a headline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadlinePair {
    /// What it is about, in the thread's terms ("the creation stall").
    pub about: &'static str,
    /// The variant before.
    pub before: &'static str,
    /// The variant after.
    pub after: &'static str,
    /// The metric judged (lower is better).
    pub metric: &'static str,
    /// Further metrics shown before → after, not judged (a fault count beside a time).
    pub shown: &'static [&'static str],
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

/// What one execution of a scenario's plan returns.
pub type SampleOf<S> = <<S as Scenario>::Plan as Execute>::Output;

/// A scenario, as its file defines it: the catalog entry, its parameters (a type, and the
/// table that declares each one), the plan of each variant (which names the backend call that
/// executes it, [`Execute`]), and how the samples are read. Selecting the variants, refusing
/// what a backend cannot run, and the run itself (warm-up, interleaved repetitions, failure
/// isolation, the record) are the same for every scenario and live here ([`run_scenario`]).
/// Nothing outside the file names the scenario but the registry ([`Kind`], [`Params`]).
pub trait Scenario: Sync + 'static {
    /// One variant's plan.
    type Plan: Execute;
    /// The parameters: `Default` is the scenario's defaults, the table reads `--set` text
    /// into it, and code builds it directly.
    type Params: Clone + Default + std::fmt::Debug + Send + Sync + 'static;
    /// Name, variants, metrics, backends.
    const INFO: &'static ScenarioInfo;
    /// Each parameter, declared once.
    const PARAMS: &'static [Param<Self::Params>];

    /// What the parameters together or this backend refuse, after each was read: limits that
    /// are the host's or that join two parameters. Bad input is an error naming the fix.
    fn check(&self, _params: &Self::Params, _can: Capabilities) -> Result<(), InputError> {
        Ok(())
    }

    /// The plan of the variant `name`, or `None` when the scenario has no such variant.
    fn plan(
        &self,
        name: &str,
        request: &RunRequest<Self::Params>,
    ) -> Result<Option<Self::Plan>, InputError>;

    /// One plan per requested variant: by default those [`ScenarioInfo::selected_variants`]
    /// picks, each planned by [`Scenario::plan`].
    fn plans(
        &self,
        request: &RunRequest<Self::Params>,
        can: Capabilities,
    ) -> Result<Vec<(String, Self::Plan)>, InputError> {
        let names = Self::INFO.selected_variants(&request.variants, can)?;
        plan_each(self, names, request, can)
    }

    /// Metrics and findings from every variant's samples (the verdicts that answer the
    /// scenario's [`Question`] are made from them by [`run_scenario`]).
    fn analyse(&self, observed: Observed<'_, Self::Plan, SampleOf<Self>>) -> ScenarioOutcome;

    /// What made `slower` slower, where the scenario knows (lifecycle: the SRCU stall it
    /// waited for): said beside a verdict that calls the difference.
    fn cause(&self, _slower: &VariantRecord) -> Option<StallCause> {
        None
    }

    /// The charts after the headline distribution (default: the headline by variant).
    fn charts(&self, _record: &RunRecord) -> Vec<Chart> {
        let headline = Self::INFO.headline;
        vec![Chart::Bars {
            metric: headline,
            title: headline,
        }]
    }

    /// What the user should know about how a request will run, before it runs.
    fn notices(&self, _request: &RunRequest<Self::Params>) -> Vec<Notice> {
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
    fn validation(&self, _host: &HostInfo) -> Option<ValidationPoint<Self::Params>> {
        None
    }

    /// Model runs the suite adds on the profiles where the scenario's mechanism lives.
    fn showcases(&self) -> Vec<Showcase<Self::Params>> {
        Vec::new()
    }
}

/// The plans of `names`, in order: each one's [`Scenario::plan`], or the error naming the
/// variants `can` runs.
pub fn plan_each<S: Scenario + ?Sized>(
    scenario: &S,
    names: Vec<String>,
    request: &RunRequest<S::Params>,
    can: Capabilities,
) -> Result<Vec<(String, S::Plan)>, InputError> {
    names
        .into_iter()
        .map(|name| match scenario.plan(&name, request)? {
            Some(plan) => Ok((name, plan)),
            None => Err(S::INFO.unknown_variant(&name, can)),
        })
        .collect()
}

/// The plans of a request: its parameters checked together and against `can`, then one plan
/// per requested variant.
pub fn planned<S: Scenario + ?Sized>(
    scenario: &S,
    request: &RunRequest<S::Params>,
    can: Capabilities,
) -> Result<Vec<(String, S::Plan)>, InputError> {
    scenario.check(&request.params, can)?;
    scenario.plans(request, can)
}

/// Validates a request without running anything, so bad input is reported as such (exit 2)
/// even on a host that could not run the scenario.
pub fn check_request<S: Scenario>(
    scenario: &S,
    request: &RunRequest<S::Params>,
    backend: BackendKind,
) -> Result<(), InputError> {
    reject_duplicate_variants(&request.variants)?;
    planned(scenario, request, backend.capabilities()).map(drop)
}

/// Runs any scenario on a backend: the one shape every scenario's run takes (backend check,
/// input check, warm-up and interleaved repetitions with each variant's failure kept to
/// itself, the analysis, the record around it with the noise it was measured in).
pub fn run_scenario<S: Scenario>(
    scenario: &S,
    backend: &mut dyn Backend,
    request: &RunRequest<S::Params>,
    progress: &dyn Progress,
) -> Result<RunRecord, Error> {
    run_against(scenario, backend, request, &Baseline::Declared, progress)
}

/// [`run_scenario`] with the verdicts made against `baseline` (`--baseline-variant`,
/// `--against-fastest`) instead of the scenario's declared question.
pub fn run_against<S: Scenario>(
    scenario: &S,
    backend: &mut dyn Backend,
    request: &RunRequest<S::Params>,
    baseline: &Baseline,
    progress: &dyn Progress,
) -> Result<RunRecord, Error> {
    let info = S::INFO;
    let can = backend.capabilities();
    info.require(backend.kind(), can)?;
    reject_duplicate_variants(&request.variants)?;
    let (names, plans): (Vec<String>, Vec<S::Plan>) =
        planned(scenario, request, can)?.into_iter().unzip();
    question::check_baseline(baseline, &names)?;
    let started = runner::now_rfc3339();
    // The model's samples are exact: the host's noise does not touch them, so it is neither
    // watched nor said.
    let own_threads = plans
        .iter()
        .map(|p| scenario.runnable_threads(p))
        .max()
        .unwrap_or(1);
    let before = can.real_time.then(hvlab_host::noise::Snapshot::take);
    let repeated = runner::repeat(&names, request, can.real_time, progress, |vi| {
        plans[vi].execute(backend).map_err(Error::from)
    });
    let noise = before.map(|before| {
        hvlab_host::noise::between(
            &before,
            &hvlab_host::noise::Snapshot::take(),
            &repeated.reps,
            own_threads,
        )
    });
    let outcome = scenario.analyse(Observed {
        names: &names,
        plans: &plans,
        results: &repeated.results,
        host: backend.host(),
        seed: request.seed,
    });
    let verdicts = judge_question(scenario, &outcome.variants, baseline, request.seed);
    let params = params::record(S::PARAMS, &request.params, backend.kind());
    let mut record = runner::assemble(info, backend, params, request, started, outcome);
    record.verdicts = verdicts;
    record.label_times();
    record.warnings = crate::analysis::robust::warnings(&record, info.headline, noise.as_ref());
    record.noise = noise;
    Ok(record)
}

/// The verdicts that answer a scenario's question on its headline (against `baseline`), each
/// that calls a difference with what made the slower side slower, where the scenario knows.
/// The lower median is the faster side: every headline is declared lower-is-better (the
/// direction table's test holds each scenario to it).
pub fn judge_question<S: Scenario + ?Sized>(
    scenario: &S,
    variants: &[VariantRecord],
    baseline: &Baseline,
    seed: u64,
) -> Vec<crate::analysis::compare::Verdict> {
    let info = S::INFO;
    let mut verdicts = question::verdicts(&info.question, variants, info.headline, baseline, seed);
    for v in verdicts.iter_mut().filter(|v| v.significant) {
        v.cause = variants
            .iter()
            .find(|x| x.name == v.slower)
            .and_then(|slower| scenario.cause(slower));
    }
    verdicts
}

/// Refuses a variant named twice: it would be measured twice and could not be stored.
pub fn reject_duplicate_variants(variants: &[String]) -> Result<(), InputError> {
    let mut seen = std::collections::BTreeSet::new();
    match variants.iter().find(|v| !seen.insert(v.as_str())) {
        Some(dup) => Err(InputError::BadValue {
            key: "--variant".into(),
            value: dup.clone(),
            why: format!("`{dup}` is given more than once; give each --variant once"),
        }),
        None => Ok(()),
    }
}

/// The registry: every scenario once, in catalog order, as its kind, the scenario (a value of
/// its module) and its parameters' type. `$then!` is called with its own arguments, `;`, then
/// the list: [`Kind`], [`Params`], their conversions and [`with_params`]'s match are all made
/// from it, so a new scenario is one line here.
macro_rules! scenarios {
    ($then:ident! ($($args:tt)*)) => {
        $then! { $($args)* ;
            Lifecycle => lifecycle::Lifecycle(lifecycle::LifecycleParams),
            Memory => memory::Memory(memory::MemoryParams),
            Exits => exits::Exits(exits::ExitParams),
            Pinning => pinning::Pinning(pinning::PinningParams),
            Percpu => percpu::Percpu(percpu::PercpuParams),
            Dirty => dirty::Dirty(dirty::DirtyParams),
            Memslots => memslots::Memslots(memslots::MemslotsParams),
        }
    };
}

/// The registry's types: the kinds, the typed parameters, and the conversions between them.
macro_rules! registry {
    (; $($kind:ident => $module:ident::$scenario:ident($params:ty),)*) => {
        /// Every scenario hvlab has, in catalog order: the registry. A scenario is named by
        /// text only at the edge ([`Kind::named`]); a run's [`Params`] say which scenario it is.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Kind {
            $(
                #[doc = concat!("[`", stringify!($module), "`].")]
                $kind,
            )*
        }

        /// A scenario's parameters, typed: the variant is the scenario they are for.
        #[derive(Debug, Clone)]
        pub enum Params {
            $(
                #[doc = concat!("[`", stringify!($module), "`].")]
                $kind($params),
            )*
        }

        $(
            impl From<$params> for Params {
                fn from(p: $params) -> Params {
                    Params::$kind(p)
                }
            }
        )*

        impl Kind {
            /// Every scenario, in catalog order.
            pub const ALL: [Kind; [$(stringify!($kind)),*].len()] = [$(Kind::$kind),*];

            /// Its defaults: the registry's one match on the kind, which the other
            /// dispatches go through ([`with_params`]).
            pub fn defaults(self) -> Params {
                match self {
                    $(Kind::$kind => Params::$kind(Default::default()),)*
                }
            }
        }

        impl Params {
            /// The scenario they are for.
            pub fn kind(&self) -> Kind {
                match self {
                    $(Params::$kind(_) => Kind::$kind,)*
                }
            }
        }
    };
}

scenarios!(registry!());

/// `$body` with `$s` bound to the scenario `$params` are for and `$p` to them, typed.
macro_rules! with_params {
    ($params:expr, $s:ident, $p:ident => $body:expr) => {
        scenarios!(match_params!($params, $s, $p => $body))
    };
}

/// [`with_params`]'s match, one arm per scenario of the registry.
macro_rules! match_params {
    ($params:expr, $s:ident, $p:ident => $body:expr ;
     $($kind:ident => $module:ident::$scenario:ident($ty:ty),)*) => {
        match $params {
            $(
                Params::$kind($p) => {
                    let $s = &$module::$scenario;
                    $body
                }
            )*
        }
    };
}

/// A scenario's catalog entry, for generic code that has the scenario as a value.
fn info_of<S: Scenario>(_: &S) -> &'static ScenarioInfo {
    S::INFO
}

/// A scenario's parameter table, likewise.
fn table_of<S: Scenario>(_: &S) -> &'static [Param<S::Params>] {
    S::PARAMS
}

/// Everything `hvlab list` shows about a scenario.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    /// The catalog entry.
    #[serde(flatten)]
    pub info: &'static ScenarioInfo,
    /// Its parameters, settable with --set.
    pub params: Vec<ParamInfo>,
}

impl Kind {
    /// The catalog entry.
    pub fn info(self) -> &'static ScenarioInfo {
        with_params!(&self.defaults(), s, _p => info_of(s))
    }

    /// The name (`hvlab run NAME`).
    pub fn name(self) -> &'static str {
        self.info().name
    }

    /// The scenario called `name` (text at the edge: the command line, a stored record).
    pub fn named(name: &str) -> Result<Kind, InputError> {
        Kind::ALL
            .into_iter()
            .find(|k| k.name() == name)
            .ok_or_else(|| {
                InputError::UnknownScenario(name.to_string(), Kind::ALL.map(Kind::name).join(", "))
            })
    }

    /// The scenario a stored run is of (`None` for one this hvlab does not know).
    pub fn of_run(run: &RunRecord) -> Option<Kind> {
        Kind::named(&run.scenario).ok()
    }

    /// Its parameters as `hvlab list` shows them.
    pub fn param_infos(self) -> Vec<ParamInfo> {
        with_params!(&self.defaults(), s, _p => params::infos(table_of(s)))
    }

    /// What `hvlab list` shows.
    pub fn listing(self) -> Listing {
        Listing {
            info: self.info(),
            params: self.param_infos(),
        }
    }

    /// `--set key=value` text read once into its parameters, for a backend that can `can`.
    pub fn parse(self, sets: &[String], can: Capabilities) -> Result<Params, InputError> {
        with_params!(&self.defaults(), s, _p => {
            params::parse(info_of(s).name, table_of(s), sets, can).map(Params::from)
        })
    }

    /// See [`Scenario::charts`].
    pub fn charts(self, record: &RunRecord) -> Vec<Chart> {
        with_params!(&self.defaults(), s, _p => s.charts(record))
    }

    /// See [`Scenario::context`].
    pub fn context(self, record: &RunRecord) -> Vec<Notice> {
        with_params!(&self.defaults(), s, _p => s.context(record))
    }

    /// See [`Scenario::validation`].
    pub fn validation(self, host: &HostInfo) -> Option<ValidationPoint<Params>> {
        with_params!(&self.defaults(), s, _p => s.validation(host).map(ValidationPoint::erase))
    }

    /// See [`Scenario::showcases`].
    pub fn showcases(self) -> Vec<Showcase<Params>> {
        with_params!(&self.defaults(), s, _p => s.showcases().into_iter().map(Showcase::erase).collect())
    }
}

impl Params {
    /// Their parameters in effect on `backend` as a run record keeps them (see
    /// [`params::record`]).
    pub fn record(
        &self,
        backend: BackendKind,
    ) -> std::collections::BTreeMap<String, serde_json::Value> {
        with_params!(self, s, p => params::record(table_of(s), p, backend))
    }
}

impl RunRequest {
    /// The same request with its parameters typed for their scenario.
    fn typed<P: Clone>(&self, params: &P) -> RunRequest<P> {
        RunRequest {
            params: params.clone(),
            variants: self.variants.clone(),
            reps: self.reps,
            warmup: self.warmup,
            seed: self.seed,
        }
    }
}

/// Every scenario's catalog entry.
pub fn catalog() -> Vec<&'static ScenarioInfo> {
    Kind::ALL.into_iter().map(Kind::info).collect()
}

/// Looks a scenario's catalog entry up by name.
pub fn find(name: &str) -> Result<&'static ScenarioInfo, InputError> {
    Kind::named(name).map(Kind::info)
}

/// Validates a request against its scenario without running anything, so bad input is
/// reported as such (exit 2) even on a host that could not run the scenario.
pub fn check(request: &RunRequest, backend: BackendKind) -> Result<(), InputError> {
    with_params!(&request.params, s, p => check_request(s, &request.typed(p), backend))
}

/// What the user should know about how `request` will run, before it runs.
pub fn notices(request: &RunRequest) -> Vec<Notice> {
    with_params!(&request.params, s, p => s.notices(&request.typed(p)))
}

/// Runs a request's scenario (its parameters say which) on a backend and returns the complete
/// record (not yet stored), its verdicts answering the scenario's question.
pub fn run(
    backend: &mut dyn Backend,
    request: &RunRequest,
    progress: &dyn Progress,
) -> Result<RunRecord, Error> {
    run_with_baseline(backend, request, &Baseline::Declared, progress)
}

/// [`run`], its verdicts made against `baseline`.
pub fn run_with_baseline(
    backend: &mut dyn Backend,
    request: &RunRequest,
    baseline: &Baseline,
    progress: &dyn Progress,
) -> Result<RunRecord, Error> {
    with_params!(&request.params, s, p => run_against(s, backend, &request.typed(p), baseline, progress))
}

/// Refuses a `--baseline-variant` that the request's run would not have (exit 2, listing
/// its variants), before anything runs.
pub fn check_baseline(
    request: &RunRequest,
    backend: BackendKind,
    baseline: &Baseline,
) -> Result<(), InputError> {
    if !matches!(baseline, Baseline::Variant(_)) {
        return Ok(());
    }
    with_params!(&request.params, s, p => {
        let names: Vec<String> = planned(s, &request.typed(p), backend.capabilities())?
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        question::check_baseline(baseline, &names)
    })
}

/// The run-level outcome of a finished run (docs/ARCHITECTURE.md, "Errors and exit codes"): at
/// least one variant produced samples, or the error to exit with. Every variant unsupported
/// here is the host's limitation (exit 3); no variant producing samples while one or more
/// failed is a measurement failure (exit 4). A suite or sweep stores neither; `hvlab run`
/// stores the failed one with each variant's failure (exit 4 all the same), so that a kernel
/// A/B whose patched side broke a variant names the failure instead of losing the variant.
pub fn judge(record: &RunRecord) -> Result<(), Error> {
    if record.produced_samples() {
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

/// `--set` text and variants planned for `backend` as the command line would (tests, and the
/// memory model's prediction of a kab's runs).
pub(crate) fn plans_of<S: Scenario>(
    scenario: &S,
    sets: &[&str],
    variants: &[&str],
    backend: BackendKind,
) -> Result<Vec<(String, S::Plan)>, InputError> {
    let can = backend.capabilities();
    let sets: Vec<String> = sets.iter().map(ToString::to_string).collect();
    let request = RunRequest {
        variants: variants.iter().map(ToString::to_string).collect(),
        ..RunRequest::new(params::parse(S::INFO.name, S::PARAMS, &sets, can)?)
    };
    planned(scenario, &request, can)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::direction::names;

    /// Every metric of every scenario declares a direction the judges can use (the field is
    /// not optional, so the compiler sees that each has one): a must-equal metric names a
    /// metric of its own scenario, a tolerance is a fraction below 1, and each family's
    /// wildcard resolves a member to the family. The suite judges headlines by which side is
    /// lower, so each headline must be lower-is-better.
    #[test]
    fn every_metric_declares_which_way_is_better() {
        for info in catalog() {
            for m in info.metrics {
                if let Direction::MustEqual(other) = m.better {
                    let partner = info.metric(other);
                    assert!(
                        partner.is_some_and(|p| p.name == other),
                        "{}: {} must equal {other}, which the scenario does not declare",
                        info.name,
                        m.name
                    );
                }
                assert!(
                    (0.0..1.0).contains(&m.count_tolerance),
                    "{}: {}'s tolerance {}",
                    info.name,
                    m.name,
                    m.count_tolerance
                );
                let member = m
                    .name
                    .replace("<NAME>", "KVM_CREATE_VM")
                    .replace("<stat>", "pf_fixed")
                    .replace('*', "KVM_CREATE_VM");
                assert!(
                    member == m.name || names(m.name, &member),
                    "{}: the family {} does not name {member}",
                    info.name,
                    m.name
                );
                let declared = info.declared(&member);
                assert!(
                    declared.declared,
                    "{}: {member} resolves to nothing",
                    info.name
                );
                assert_eq!(declared.direction, m.better, "{}: {member}", info.name);
            }
            assert_eq!(
                info.declared(info.headline).direction,
                Direction::LowerIsBetter,
                "{}'s headline {}",
                info.name,
                info.headline
            );
            assert!(!info.declared("no.such.metric").declared);
        }
        // The cases the judges depend on.
        let dirty = Kind::Dirty.info();
        assert_eq!(
            dirty.declared("pages_dirty").direction,
            Direction::MustEqual("pages_written")
        );
        assert_eq!(
            dirty.declared("total_pages_per_ms").direction,
            Direction::HigherIsBetter
        );
        let memory = Kind::Memory.info();
        let pf = memory.declared("kvm.vcpu.pf_fixed");
        assert_eq!(pf.direction, Direction::LowerIsBetter);
        assert!(
            pf.count_tolerance > 1.0 / 4096.0,
            "4096 → 4097 is within it"
        );
        let lifecycle = Kind::Lifecycle.info();
        assert_eq!(
            lifecycle
                .metric("ioctl.KVM_SET_USER_MEMORY_REGION_ms")
                .map(|m| m.name),
            Some("ioctl.<NAME>_ms")
        );
    }

    /// Every metric stored kab runs carry (a lifecycle kab, a dirty kab, a booted memory kab)
    /// is declared by its scenario, families included: none falls back to lower-is-better
    /// unsaid.
    #[test]
    fn every_stored_metric_resolves_to_a_declaration() {
        let fixtures = [
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/kab-7.3-001/runs.jsonl"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/kab-dirty-lost-page/runs.jsonl"
            )),
            include_str!(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/tests/fixtures/kab-not-exercised/runs.jsonl"
            )),
        ];
        let mut seen = 0;
        for line in fixtures.iter().flat_map(|f| f.lines()) {
            let run: RunRecord = serde_json::from_str(line).expect("a stored run");
            let info = find(&run.scenario).expect("a known scenario");
            for v in &run.variants {
                for metric in v.metrics.keys() {
                    assert!(
                        info.declared(metric).declared,
                        "{}: {metric} is not declared",
                        run.scenario
                    );
                    seen += 1;
                }
            }
        }
        assert!(seen > 100, "{seen} metrics");
    }
}
