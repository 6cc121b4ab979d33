//! `hvlab suite`: every registered scenario on every backend this build and host can run.
//!
//! The unit of work (and of sharding) is one scenario on one backend: one run record, as the
//! store, `compare` and the verdicts know it. Finer units (one variant each) would break a run
//! into records whose verdicts compare nothing, and lose the interleaving of variants that
//! spreads a shared machine's drift over all of them.

use crate::lab::Error;
use crate::record::RunRecord;
use crate::scenario::runner::{Progress, RunRequest};
use crate::scenario::{self, Kind, Params, ScenarioInfo, Showcase};
use hvlab_core::host::HostInfo;
use hvlab_core::{Backend, BackendKind};

use super::shard::{Shard, unit_seed};

/// What the suite ran and what it could not.
#[derive(Debug, Clone)]
pub struct SuiteOutcome {
    /// The runs that produced samples, in registry order.
    pub records: Vec<RunRecord>,
    /// Each unit this host could not run, and why.
    pub skipped: Vec<Skipped>,
    /// The keys of the units this shard ran (or tried), in job order.
    pub units: Vec<String>,
}

/// A unit the suite could not run on this host (worded by `export::words::skipped_unit`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// The scenario.
    pub scenario: &'static str,
    /// The backend.
    pub backend: BackendKind,
    /// Why: the message of the error that stopped it.
    pub why: String,
}

impl Skipped {
    fn new(info: &ScenarioInfo, backend: BackendKind, why: &dyn std::fmt::Display) -> Skipped {
        Skipped {
            scenario: info.name,
            backend,
            why: why.to_string(),
        }
    }
}

/// One unit of the suite: a scenario on a backend, or on the model with the profile of the
/// hardware its kernel thread is about (a showcase: where the thread's finding shows, which
/// this host's profile may not).
#[derive(Debug, Clone)]
pub struct Unit {
    /// The scenario.
    pub scenario: Kind,
    /// The backend.
    pub backend: BackendKind,
    /// The showcase, and its position among the scenario's.
    pub showcase: Option<(usize, Showcase<Params>)>,
}

impl Unit {
    /// `suite/SCENARIO/BACKEND` (a showcase: `suite/SCENARIO/model/PROFILE/N`): the unit's
    /// name in the job and its seed's key.
    pub fn key(&self) -> String {
        match &self.showcase {
            None => format!("suite/{}/{}", self.scenario.name(), self.backend),
            Some((i, s)) => format!(
                "suite/{}/{}/{}/{i}",
                self.scenario.name(),
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
    Kind::ALL
        .into_iter()
        .flat_map(|s| {
            let plain = s.info().backends().into_iter().map(move |b| Unit {
                scenario: s,
                backend: b,
                showcase: None,
            });
            let showcases = s
                .showcases()
                .into_iter()
                .enumerate()
                .filter(|_| s.info().backends().contains(&BackendKind::Model))
                .map(move |(i, sc)| Unit {
                    scenario: s,
                    backend: BackendKind::Model,
                    showcase: Some((i, sc)),
                });
            plain.chain(showcases).collect::<Vec<_>>()
        })
        .filter(|u| only.is_none_or(|b| u.backend == b))
        .collect()
}

/// The id every run of one suite job carries (its `suite` parameter). Shards of one job must
/// agree on it without talking to each other: a Slurm array's job id names the job; other
/// shards (Kubernetes, `--shard i/N` by hand) hash what makes the job (its units, base seed,
/// revision and shard count), so a rerun of the same job on the same revision shares the id
/// and a report keeps the latest run of each unit. A whole suite in one process is named by
/// its start and a random part.
pub fn suite_id(
    only: Option<BackendKind>,
    shard: Shard,
    base_seed: u64,
    slurm_job: Option<&str>,
    started_at: &str,
) -> String {
    if let Some(job) =
        slurm_job.filter(|j| !j.is_empty() && j.chars().all(|c| c.is_ascii_alphanumeric()))
    {
        return format!("su-slurm-{job}");
    }
    if shard.is_whole() {
        let stamp: String = started_at
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .collect();
        let random = crate::record::run_id_suffix();
        return format!("su-{stamp}-{}", &random[..4]);
    }
    let keys: Vec<String> = units(only).iter().map(Unit::key).collect();
    let definition = format!(
        "{}|{}|{}|{}",
        keys.join(","),
        shard.count(),
        env!("CARGO_PKG_VERSION"),
        env!("HVLAB_GIT_REV")
    );
    format!("su-{:012x}", unit_seed(&definition, base_seed) >> 16)
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
/// it) before the next starts. Every run carries `suite_id` (its `suite` parameter), so a
/// report shows the whole suite, whichever shards ran its units.
#[allow(clippy::too_many_arguments)]
pub fn run<P: Progress, E: From<Error>>(
    suite_id: &str,
    host: &HostInfo,
    only: Option<BackendKind>,
    shard: Shard,
    base_seed: u64,
    backend: impl Fn(BackendKind, HostInfo, u64) -> Result<Box<dyn Backend>, Error>,
    request: impl Fn(Kind) -> RunRequest,
    progress: impl Fn(&ScenarioInfo) -> P,
    mut keep: impl FnMut(&mut RunRecord) -> Result<(), E>,
) -> Result<SuiteOutcome, E> {
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
        let opened = match &unit.showcase {
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
            Err(e) if e.is_host_limitation() => {
                skipped.push(Skipped::new(info, kind, &e));
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let base = request(unit.scenario);
        let request = match &unit.showcase {
            None => RunRequest { seed, ..base },
            Some((_, sc)) => RunRequest {
                seed,
                variants: sc.variants.iter().map(ToString::to_string).collect(),
                params: sc.params.clone(),
                ..base
            },
        };
        let mut record =
            scenario::run(b.as_mut(), &request, &progress(info)).map_err(Error::from)?;
        // Which unit of the job this run is: the key its seed comes from, and what tells
        // two runs of one scenario on one backend (a showcase) apart after a merge.
        record
            .params
            .insert("suite_unit".into(), key.clone().into());
        record.params.insert("suite".into(), suite_id.into());
        if let Some((_, sc)) = &unit.showcase {
            record.params.insert("showcase".into(), sc.why.into());
            record.tag = Some(crate::record::RunTag::Showcase);
        }
        if let Err(e) = scenario::judge(&record) {
            skipped.push(Skipped::new(info, kind, &e));
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
