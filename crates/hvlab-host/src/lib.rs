//! The I/O that describes this host: the probe (what the machine is, [`probe`]) and the noise
//! meter (how busy it was while a run was measured, [`noise`]). Below the backends and the
//! binary, beside the core whose types it fills: `hvlab-core` holds the description and the
//! noise as data, this crate reads them from /proc, sysfs and the scheduler.

pub mod noise;
pub mod probe;
