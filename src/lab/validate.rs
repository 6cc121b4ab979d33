//! `hvlab validate`: the model against the kvm backend on this host, at the points each
//! scenario names (not those calibration used), metric by metric.

use crate::analysis::validate::{Check, Rule};
use crate::lab::Error;
use crate::record::RunRecord;
use crate::scenario::runner::{DEFAULT_SEED, Progress, RunRequest};
use crate::scenario::{self, Kind};
use hvlab_core::Backend;
use hvlab_core::host::HostInfo;

/// What validation found, and the noise it was measured in.
#[derive(Debug, Clone)]
pub struct Validation {
    /// One per metric judged.
    pub checks: Vec<Check>,
    /// The noise of each kvm run that the busy rule called busy.
    pub busy: Vec<hvlab_core::noise::Noise>,
    /// Point variants one side could not run, so none of their metrics was compared: said,
    /// never dropped in silence.
    pub unjudged: Vec<Unjudged>,
}

/// A validation point's variant that produced no check, and why.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Unjudged {
    /// Scenario.
    pub scenario: String,
    /// Variant.
    pub variant: String,
    /// The side that did not run it: `kvm` (the host's limitation) or `model` (a profile or
    /// mechanism the model lacks here).
    pub side: &'static str,
    /// Its status: `unsupported: ...` or `failed: ...`.
    pub status: String,
}

impl Validation {
    /// Checks that failed.
    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|c| !c.pass).count()
    }

    /// Whether a failure may be the host's noise: some check failed and a kvm run was busy.
    /// Then `validate` cannot judge (exit 4) rather than fail (exit 1).
    pub fn cannot_judge(&self) -> bool {
        self.failed() > 0 && !self.busy.is_empty()
    }
}

/// Runs every scenario's validation point on both backends and judges each metric: times
/// within the kvm side's own spread plus `tolerance` percent (shown, not judged, where this
/// host's CPU is emulated), counts exactly. `keep` gets every run, to store it.
pub fn validate<E: From<Error>>(
    kvm: &mut dyn Backend,
    model: &mut dyn Backend,
    host: &HostInfo,
    tolerance: f64,
    progress: &dyn Progress,
    mut keep: impl FnMut(&mut RunRecord) -> Result<(), E>,
) -> Result<Validation, E> {
    let time_rule = if host.cpu_emulated() {
        Rule::Unjudged
    } else {
        Rule::Within(tolerance)
    };
    let mut checks = Vec::new();
    let mut busy = Vec::new();
    let mut unjudged = Vec::new();
    for s in Kind::ALL {
        let Some(point) = s.validation(host) else {
            continue;
        };
        let info = s.info();
        let request = RunRequest {
            params: point.params,
            variants: point.variants.iter().map(|v| v.to_string()).collect(),
            reps: info.default_reps.min(10),
            warmup: 1,
            seed: DEFAULT_SEED,
        };
        let mut real = scenario::run(kvm, &request, progress).map_err(Error::from)?;
        let model_request = RunRequest {
            params: point.model_params,
            ..request
        };
        let mut predicted = scenario::run(model, &model_request, progress).map_err(Error::from)?;
        if let Some(n) = real.noise.as_ref().filter(|n| n.is_busy()) {
            busy.push(n.clone());
        }
        // Internal: left out of the default report, `runs` and the fleet page.
        real.tag = Some(crate::record::RunTag::Validate);
        predicted.tag = Some(crate::record::RunTag::Validate);
        keep(&mut real)?;
        keep(&mut predicted)?;
        for v in point.variants {
            let not_run = [("kvm", &real), ("model", &predicted)]
                .into_iter()
                .filter_map(|(side, r)| {
                    let status = match r.variant(v) {
                        Some(x) if x.is_ok() => return None,
                        Some(x) => x.status.to_string(),
                        None => "not run".to_string(),
                    };
                    Some(Unjudged {
                        scenario: info.name.to_string(),
                        variant: (*v).to_string(),
                        side,
                        status,
                    })
                })
                .collect::<Vec<_>>();
            if not_run.is_empty() {
                checks.extend((point.checks)(&predicted, &real, v, time_rule));
            } else {
                unjudged.extend(not_run);
            }
        }
    }
    Ok(Validation {
        checks,
        busy,
        unjudged,
    })
}
