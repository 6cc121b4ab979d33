//! The product's logic above the scenarios and backends: calibrating a profile on this host,
//! and the host probe whichever backends this build has.

pub mod backends;
#[cfg(hvlab_kvm)]
pub mod calibrate;
pub mod compare;
pub mod host;
pub mod suite;
pub mod validate;

use std::path::PathBuf;

use crate::error::Error;
use crate::store;

/// Where `hvlab calibrate` puts this host's profile by default: beside the results database.
pub fn calibrated_profile_path() -> Result<PathBuf, Error> {
    let db = store::resolve_path(None)?;
    Ok(db.parent().map_or_else(
        || PathBuf::from("this-host.toml"),
        |d| d.join("this-host.toml"),
    ))
}
