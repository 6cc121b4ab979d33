//! Scenario definitions: parameters, variants and metrics of every experiment, and the
//! catalog. Scenarios drive a [`Backend`](crate::backend::Backend); they do not know which one.

pub mod exits;
pub mod lifecycle;
pub mod memory;
pub mod params;
pub mod percpu;
pub mod pinning;
pub mod runner;
pub mod samples;

use serde::Serialize;

use crate::backend::{Backend, BackendKind};
use crate::error::{Error, InputError};
use crate::record::RunRecord;
use params::{ParamInfo, Settings};
use runner::{Progress, RunRequest};

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
    /// Backends that can run it.
    pub backends: &'static [BackendKind],
    /// Repetitions when --reps is not given (a pass of `memory` takes a second; a lifecycle
    /// construction a few ms).
    pub default_reps: u32,
    /// Warm-up repetitions when --warmup is not given.
    pub default_warmup: u32,
}

impl ScenarioInfo {
    /// The variants `backend` runs by default.
    pub fn variants_for(
        &self,
        backend: BackendKind,
    ) -> impl Iterator<Item = &'static VariantInfo> + use<> {
        let model: &'static [VariantInfo] = if backend == BackendKind::Model {
            self.model_variants
        } else {
            &[]
        };
        self.variants.iter().chain(model.iter())
    }

    /// The error for a variant `backend` cannot run, naming those it can.
    pub fn unknown_variant(&self, name: &str, backend: BackendKind) -> InputError {
        let mut known: Vec<&str> = self.variants_for(backend).map(|v| v.name).collect();
        if backend == BackendKind::Kvm && self.model_variants.iter().any(|v| v.name == name) {
            known.push("(it is a model variant: add --backend model)");
        }
        InputError::UnknownVariant {
            variant: name.to_string(),
            scenario: self.name.to_string(),
            known: known.join(", "),
        }
    }
}

/// Every scenario hvlab has.
pub fn catalog() -> Vec<&'static ScenarioInfo> {
    vec![
        &lifecycle::INFO,
        &memory::INFO,
        &exits::INFO,
        &pinning::INFO,
        &percpu::INFO,
    ]
}

/// Looks a scenario up by name.
pub fn find(name: &str) -> Result<&'static ScenarioInfo, InputError> {
    catalog()
        .into_iter()
        .find(|s| s.name == name)
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
    match info.name {
        "lifecycle" => lifecycle::plans(&settings, request, backend).map(drop),
        // The CPL default depends on the host; any value validates the rest.
        "memory" => {
            memory::plans(&settings, request, crate::backend::guest::Cpl::Three, backend).map(drop)
        }
        "exits" => {
            exits::plans(&settings, request, crate::backend::guest::Cpl::Three, backend).map(drop)
        }
        "pinning" => pinning::plans(&settings, request, backend).map(drop),
        "percpu" => percpu::plans(&settings, request).map(drop),
        other => Err(InputError::Other(format!("scenario {other} has no runner"))),
    }
}

/// Runs a scenario on a backend and returns the complete record (not yet stored).
pub fn run(
    info: &ScenarioInfo,
    backend: &mut dyn Backend,
    request: &RunRequest,
    progress: &dyn Progress,
) -> Result<RunRecord, Error> {
    if !info.backends.contains(&backend.kind()) {
        return Err(InputError::BackendCannotRun {
            backend: backend.kind().to_string(),
            scenario: info.name.to_string(),
            supported: info
                .backends
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        }
        .into());
    }
    reject_duplicate_variants(request)?;
    let settings = Settings::parse(info, &request.sets)?;
    let started = runner::now_rfc3339();
    let outcome = match info.name {
        "lifecycle" => lifecycle::run(backend, &settings, request, progress)?,
        "memory" => memory::run(backend, &settings, request, progress)?,
        "exits" => exits::run(backend, &settings, request, progress)?,
        "pinning" => pinning::run(backend, &settings, request, progress)?,
        "percpu" => percpu::run(backend, &settings, request, progress)?,
        other => return Err(InputError::Other(format!("scenario {other} has no runner")).into()),
    };
    Ok(runner::assemble(
        info, backend, &settings, request, started, outcome,
    ))
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
        .all(|v| v.status.starts_with("unsupported"))
    {
        Err(Error::AllUnsupported { scenario, reasons })
    } else {
        Err(Error::AllFailed { scenario, reasons })
    }
}
