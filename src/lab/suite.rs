//! `hvlab suite`: every registered scenario on every backend this build and host can run.
//!
//! The unit of work (and of sharding) is one scenario on one backend: one run record, as the
//! store, `compare` and the verdicts know it. Finer units (one variant each) would break a run
//! into records whose verdicts compare nothing, and lose the interleaving of variants that
//! spreads a shared machine's drift over all of them.

use crate::backend::host::HostInfo;
use crate::backend::{Backend, BackendKind};
use crate::error::Error;
use crate::record::RunRecord;
use crate::scenario::runner::{Progress, RunRequest};
use crate::scenario::{self, REGISTRY, Scenario, ScenarioInfo, Showcase};

use super::shard::{Shard, unit_seed};

/// What the suite ran and what it could not.
#[derive(Debug, Clone)]
pub struct SuiteOutcome {
    /// The runs that produced samples, in registry order.
    pub records: Vec<RunRecord>,
    /// "scenario on backend: why", for each pair this host could not run.
    pub skipped: Vec<String>,
    /// The keys of the units this shard ran (or tried), in job order.
    pub units: Vec<String>,
}

/// One unit of the suite: a scenario on a backend, or on the model with the profile of the
/// hardware its kernel thread is about (a showcase: where the thread's finding shows, which
/// this host's profile may not).
#[derive(Clone, Copy)]
pub struct Unit {
    /// The scenario.
    pub scenario: &'static dyn Scenario,
    /// The backend.
    pub backend: BackendKind,
    /// The showcase, and its position among the scenario's.
    pub showcase: Option<(usize, &'static Showcase)>,
}

impl Unit {
    /// `suite/SCENARIO/BACKEND` (a showcase: `suite/SCENARIO/model/PROFILE/N`): the unit's
    /// name in the job and its seed's key.
    pub fn key(&self) -> String {
        match self.showcase {
            None => format!("suite/{}/{}", self.scenario.info().name, self.backend),
            Some((i, s)) => format!(
                "suite/{}/{}/{}/{i}",
                self.scenario.info().name,
                self.backend,
                s.profile
            ),
        }
    }
}

/// Every unit of the suite in job order (registry order, then each scenario's backends), or
/// only those on `only`. Every shard of one job must enumerate the same list: the same build
/// and the same `only`.
pub fn units(only: Option<BackendKind>) -> Vec<Unit> {
    REGISTRY
        .iter()
        .flat_map(|s| {
            let plain = s.info().backends.iter().map(|b| Unit {
                scenario: *s,
                backend: *b,
                showcase: None,
            });
            let showcases = s
                .showcases()
                .iter()
                .enumerate()
                .filter(|_| s.info().backends.contains(&BackendKind::Model))
                .map(|(i, sc)| Unit {
                    scenario: *s,
                    backend: BackendKind::Model,
                    showcase: Some((i, sc)),
                });
            plain.chain(showcases).collect::<Vec<_>>()
        })
        .filter(|u| only.is_none_or(|b| u.backend == b))
        .collect()
}

/// The keys of the units `shard` runs.
pub fn plan(only: Option<BackendKind>, shard: Shard) -> Vec<String> {
    units(only)
        .iter()
        .enumerate()
        .filter(|(k, _)| shard.selects(*k))
        .map(|(_, u)| u.key())
        .collect()
}

/// Runs this shard's units: `backend` opens one with the unit's seed (a host limitation skips
/// the unit), `request` and `progress` say how each scenario runs (its seed is replaced by the
/// unit's, a pure function of the unit and `base_seed`, so a unit's result does not depend on
/// which shard ran it), and `keep` gets every run that produced samples (to store and show
/// it) before the next starts.
#[allow(clippy::too_many_arguments)]
pub fn run<P: Progress>(
    host: &HostInfo,
    only: Option<BackendKind>,
    shard: Shard,
    base_seed: u64,
    backend: impl Fn(BackendKind, HostInfo, u64) -> Result<Box<dyn Backend>, Error>,
    request: impl Fn(&ScenarioInfo) -> RunRequest,
    progress: impl Fn(&ScenarioInfo) -> P,
    mut keep: impl FnMut(&mut RunRecord) -> Result<(), Error>,
) -> Result<SuiteOutcome, Error> {
    let mut records = Vec::new();
    let mut skipped = Vec::new();
    let mut keys = Vec::new();
    for (position, unit) in units(only).into_iter().enumerate() {
        if !shard.selects(position) {
            continue;
        }
        let (info, kind) = (unit.scenario.info(), unit.backend);
        let key = unit.key();
        let seed = unit_seed(&key, base_seed);
        keys.push(key.clone());
        let opened = match unit.showcase {
            None => backend(kind, host.clone(), seed),
            Some((_, sc)) => super::backends::make(
                kind,
                host.clone(),
                &super::backends::ModelProfile::named(Some(sc.profile)),
                seed,
            ),
        };
        let mut b = match opened {
            Ok(b) => b,
            Err(Error::Kvm(e)) if e.is_host_limitation() => {
                skipped.push(format!("{} on {kind}: {e}", info.name));
                continue;
            }
            Err(e) => return Err(e),
        };
        let base = request(info);
        let request = match unit.showcase {
            None => RunRequest { seed, ..base },
            Some((_, sc)) => RunRequest {
                seed,
                variants: sc.variants.iter().map(ToString::to_string).collect(),
                sets: sc.sets.iter().map(ToString::to_string).collect(),
                ..base
            },
        };
        let mut record =
            scenario::run_scenario(unit.scenario, b.as_mut(), &request, &progress(info))?;
        // Which unit of the job this run is: the key its seed comes from, and what tells
        // two runs of one scenario on one backend (a showcase) apart after a merge.
        record
            .params
            .insert("suite_unit".into(), key.clone().into());
        if let Some((_, sc)) = unit.showcase {
            record.params.insert("showcase".into(), sc.why.into());
        }
        if let Err(e) = scenario::judge(&record) {
            skipped.push(format!("{} on {kind}: {e}", info.name));
            continue;
        }
        keep(&mut record)?;
        records.push(record);
    }
    Ok(SuiteOutcome {
        records,
        skipped,
        units: keys,
    })
}
