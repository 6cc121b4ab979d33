//! The product's logic above the scenarios and backends: calibrating a profile on this host,
//! and the host probe whichever backends this build has.

pub mod backends;
#[cfg(hvlab_kvm)]
pub mod calibrate;
pub mod host;
