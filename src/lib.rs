//! hvlab: the hypervisor fast-path lab.
//!
//! Data flows one way: a [`scenario`] builds plans and hands them to a [`backend`] (real KVM in
//! `kvm`, behind the default cargo feature `kvm` on x86-64; the executable model in [`model`]), the
//! samples become a [`record`], the [`store`] keeps it, [`analysis`] turns samples into
//! statistics, findings and verdicts, and the [`cli`] renders. [`backend`] owns the vocabulary
//! both backends speak (plans and results per scenario, the host description, the KVM ioctl
//! table); `kvm` and `model` import it and never each other or the scenarios. [`lab`] holds
//! the logic above single runs (calibration); [`trace`] attributes another VMM's ioctls.

pub mod cli;
pub mod error;
pub mod export;
pub mod kernel;
pub mod lab;
pub mod scenario;
pub mod sys;
pub mod trace;

pub use error::{Error, InputError};
// The layers below, each its own crate, under the names the code and the tests use.
pub use hvlab_analysis as analysis;
pub use hvlab_analysis::record;
pub use hvlab_core as backend;
#[cfg(hvlab_kvm)]
pub use hvlab_kvm as kvm;
pub use hvlab_model as model;
pub use hvlab_store as store;
