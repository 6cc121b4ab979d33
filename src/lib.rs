//! hvlab: the hypervisor fast-path lab.
//!
//! Data flows one way: a [`scenario`] builds plans and hands them to a [`backend`] (real KVM in
//! [`kvm`]), the samples become a [`record`], the [`store`] keeps it, [`analysis`] turns samples
//! into statistics, findings and verdicts, and the [`cli`] renders. Backends never print;
//! scenarios never touch SQLite; the store knows nothing of KVM.

pub mod analysis;
pub mod backend;
pub mod cli;
pub mod error;
pub mod kvm;
pub mod model;
pub mod record;
pub mod report;
pub mod scenario;
pub mod store;

pub use error::{Error, InputError};
