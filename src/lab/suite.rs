//! `hvlab suite`: every registered scenario on every backend this build and host can run.

use crate::backend::host::HostInfo;
use crate::backend::{Backend, BackendKind};
use crate::error::Error;
use crate::record::RunRecord;
use crate::scenario::runner::{Progress, RunRequest};
use crate::scenario::{self, REGISTRY, ScenarioInfo};

/// What the suite ran and what it could not.
#[derive(Debug, Clone)]
pub struct SuiteOutcome {
    /// The runs that produced samples, in registry order.
    pub records: Vec<RunRecord>,
    /// "scenario on backend: why", for each pair this host could not run.
    pub skipped: Vec<String>,
}

/// Runs every scenario on each of its backends: `backend` opens one (a host limitation skips
/// the pair), `request` and `progress` say how each scenario runs, and `keep` gets every run
/// that produced samples (to store and show it) before the next starts.
pub fn run<P: Progress>(
    host: &HostInfo,
    backend: impl Fn(BackendKind, HostInfo) -> Result<Box<dyn Backend>, Error>,
    request: impl Fn(&ScenarioInfo) -> RunRequest,
    progress: impl Fn(&ScenarioInfo) -> P,
    mut keep: impl FnMut(&mut RunRecord) -> Result<(), Error>,
) -> Result<SuiteOutcome, Error> {
    let mut records = Vec::new();
    let mut skipped = Vec::new();
    for s in &REGISTRY {
        let info = s.info();
        for kind in info.backends {
            let mut b = match backend(*kind, host.clone()) {
                Ok(b) => b,
                Err(Error::Kvm(e)) if e.is_host_limitation() => {
                    skipped.push(format!("{} on {kind}: {e}", info.name));
                    continue;
                }
                Err(e) => return Err(e),
            };
            let mut record =
                scenario::run_scenario(*s, b.as_mut(), &request(info), &progress(info))?;
            if let Err(e) = scenario::judge(&record) {
                skipped.push(format!("{} on {kind}: {e}", info.name));
                continue;
            }
            keep(&mut record)?;
            records.push(record);
        }
    }
    Ok(SuiteOutcome { records, skipped })
}
