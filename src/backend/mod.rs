//! The one interface between scenarios and backends, and the vocabulary it speaks.
//!
//! A scenario builds a plan (a construction order, a touch pattern, ...), hands it to a
//! `Backend`, and analyses what comes back; it never knows whether the numbers came from
//! `/dev/kvm` or from the model. The plan and result types live here, one module per
//! mechanism, with the host description and the KVM ioctl table: below both backends, so
//! neither imports the other or the scenarios (as cloud-hypervisor's `hypervisor` crate
//! defines the types its callers pass). Each mechanism adds one method to [`Backend`].

pub mod dirty;
pub mod error;
pub mod exits;
pub mod guest;
pub mod host;
pub mod ioctl_table;
pub mod lifecycle;
pub mod memory;
pub mod noise;
pub mod percpu;
pub mod pinning;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use dirty::{DirtyPlan, DirtyResult};
use exits::{ExitPlan, ExitResult};
use host::HostInfo;
use lifecycle::{ConstructionPlan, ConstructionTrace};
use memory::{TouchPlan, TouchResult};
use percpu::{PercpuPlan, PercpuResult};
use pinning::{PinPlan, PinResult};

/// Which backend produced a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Real guests on /dev/kvm.
    Kvm,
    /// The executable model of the kernel mechanisms.
    Model,
}

impl BackendKind {
    /// Every backend, in the order runs are listed.
    pub const ALL: [BackendKind; 2] = [BackendKind::Kvm, BackendKind::Model];
}

impl std::str::FromStr for BackendKind {
    type Err = String;

    /// Reads the written form back (a stored run's `backend`).
    fn from_str(text: &str) -> Result<BackendKind, String> {
        BackendKind::ALL
            .into_iter()
            .find(|b| b.to_string() == text)
            .ok_or_else(|| format!("unknown backend `{text}` (known: kvm, model)"))
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendKind::Kvm => "kvm",
            BackendKind::Model => "model",
        })
    }
}

/// A source of samples.
pub trait Backend {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// The host the samples describe.
    fn host(&self) -> &HostInfo;

    /// The cost profile, for the model.
    fn profile_name(&self) -> Option<String> {
        None
    }

    /// `lifecycle`: builds one VM in the plan's order and returns every ioctl's timing.
    fn construct_vm(&mut self, plan: &ConstructionPlan) -> Result<ConstructionTrace, Error>;

    /// `memory`: one pass of first touches over a freshly backed region.
    fn touch_memory(&mut self, plan: &TouchPlan) -> Result<TouchResult, Error>;

    /// `exits`: one batch of exit roundtrips of one kind.
    fn exit_roundtrips(&mut self, plan: &ExitPlan) -> Result<ExitResult, Error>;

    /// `pinning`: one context-switch trace under a pin policy.
    fn pin_trace(&mut self, plan: &PinPlan) -> Result<PinResult, Error>;

    /// `percpu`: one prediction of per-CPU access costs.
    fn percpu(&mut self, plan: &PercpuPlan) -> Result<PercpuResult, Error>;

    /// `dirty`: passes of guest writes over a logged memslot, the log collected after each.
    fn dirty_log(&mut self, plan: &DirtyPlan) -> Result<DirtyResult, Error>;
}
