//! The product's logic above the scenarios and backends: calibrating a profile on this host,
//! the suite and sweeps and their shards, and the host probe whichever backends this build has.

pub mod backends;
pub mod bisect;
#[cfg(hvlab_kvm)]
pub mod calibrate;
pub mod compare;
mod error;
pub mod fidelity;
pub mod fleet;
pub mod host;
pub mod judge;
pub mod kab;
pub mod select;
pub mod series;
pub mod shard;
pub mod suite;
pub mod sweep;
pub mod threads;
pub mod validate;

pub use error::Error;

use std::path::PathBuf;

use crate::record::RunRecord;
use crate::scenario;
use crate::store;
use hvlab_core::BackendKind;

/// Where `hvlab calibrate` puts this host's profile by default: beside the results database,
/// or in hvlab's local data directory when the results are in PostgreSQL (a profile belongs
/// to one host, a shared store to many).
pub fn calibrated_profile_path() -> Result<PathBuf, Error> {
    let dir = match store::resolve_path(None)? {
        store::Location::Sqlite(db) => db.parent().map(PathBuf::from),
        store::Location::Postgres(_) => Some(store::local_data_dir()?),
    };
    Ok(dir.map_or_else(
        || PathBuf::from("this-host.toml"),
        |d| d.join("this-host.toml"),
    ))
}

/// The latest run of each scenario on each backend, in catalog order, out of runs listed newest
/// first (such as [`fleet::latest_per_host`]'s, which holds the latest of every host).
pub fn latest_runs(newest_first: &[RunRecord]) -> Vec<RunRecord> {
    let mut out = Vec::new();
    for info in scenario::catalog() {
        for backend in BackendKind::ALL {
            if let Some(r) = newest_first
                .iter()
                .find(|r| r.scenario == info.name && r.backend == backend)
            {
                out.push(r.clone());
            }
        }
    }
    out
}
