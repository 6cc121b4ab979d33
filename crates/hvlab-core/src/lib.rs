//! The one interface between scenarios and backends, and the vocabulary it speaks.
//!
//! A scenario builds a plan (a construction order, a touch pattern, ...), hands it to a
//! `Backend`, and analyses what comes back; it never knows whether the numbers came from
//! `/dev/kvm` or from the model. The plan and result types live here, one module per
//! mechanism, with the host description and the KVM ioctl table: below both backends, so
//! neither imports the other or the scenarios (as cloud-hypervisor's `hypervisor` crate
//! defines the types its callers pass). Each mechanism adds one method to [`Backend`]. What a
//! backend fails with stands beside the trait ([`error`]). Nothing here does I/O: the host
//! probe and the noise meter that fill [`host`] and [`noise`] are `hvlab-host`'s.
//!
//! A mechanism has one name in every layer (docs/ARCHITECTURE.md has the same table):
//!
//! | mechanism | scenario | core | kvm | model |
//! |---|---|---|---|---|
//! | VM construction vs SRCU | `lifecycle` | `lifecycle` | `lifecycle` | `lifecycle` |
//! | stage-2 faults, prefetch | `memory` | `memory` | `memory` | `memory` |
//! | exit roundtrips, PMU switching | `exits` | `exits` | `exits` | `exits` |
//! | SPE buffer pins | `pinning` | `pinning` | `pinning` | `pinning` |
//! | per-CPU data access | `percpu` | `percpu` | (model only) | `percpu` |
//! | dirty logging | `dirty` | `dirty` | `dirty` | `dirty` |
//! | memslot updates | `memslots` | `memslots` | `memslots` | `memslots` |

pub mod dirty;
pub mod error;
pub mod exits;
pub mod guest;
pub mod host;
pub mod ioctl_table;
pub mod lifecycle;
pub mod memory;
pub mod memslots;
pub mod noise;
pub mod percpu;
pub mod pinning;

use serde::{Deserialize, Serialize};

use dirty::{DirtyPlan, DirtyResult};
use error::BackendError;
use exits::{ExitPlan, ExitResult};
use host::HostInfo;
use lifecycle::{ConstructionPlan, ConstructionTrace};
use memory::{TouchPlan, TouchResult};
use memslots::{MemslotPlan, MemslotResult};
use percpu::{PercpuPlan, PercpuResult};
use pinning::{PinPlan, PinResult};

/// Which backend produced a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
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

    /// Its name (`--backend NAME`, a stored run's `backend`).
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Kvm => "kvm",
            BackendKind::Model => "model",
        }
    }

    /// What it is, in a few words (the command line's help lists the backends with it).
    pub fn what(self) -> &'static str {
        match self {
            BackendKind::Kvm => "Real guests on /dev/kvm",
            BackendKind::Model => "The executable model of the kernel mechanisms",
        }
    }
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
        f.write_str(self.name())
    }
}

/// What a backend can do, as data: scenarios, the lab and the renderer ask this, never which
/// backend it is, so a new backend describes itself once instead of touching every branch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Samples are timed on this host's clock and carry its noise (false: the model's exact
    /// values, which the host's load does not touch).
    pub real_time: bool,
    /// Fault and exit counts are KVM's own statistics (false: the backend counts its own).
    pub kvm_stats: bool,
    /// Guests live in this host's memory, so a plan is bounded by it (guest size, pinned
    /// buffers, transparent huge pages).
    pub real_memory: bool,
    /// It runs what this host lacks: the model-only variants and parameters.
    pub modelled: bool,
    /// It predicts per-CPU access costs (`percpu`, [`Backend::percpu`]).
    pub percpu: bool,
}

impl BackendKind {
    /// What a backend of this kind can do (a backend can say more: [`Backend::capabilities`]).
    pub fn capabilities(self) -> Capabilities {
        match self {
            BackendKind::Kvm => Capabilities {
                real_time: true,
                kvm_stats: true,
                real_memory: true,
                modelled: false,
                percpu: false,
            },
            BackendKind::Model => Capabilities {
                real_time: false,
                kvm_stats: false,
                real_memory: false,
                modelled: true,
                percpu: true,
            },
        }
    }
}

/// `percpu`: a backend that predicts per-CPU access costs. Only the model does (a real host
/// would need a guest with a CR3 per vCPU), so the trait is apart from [`Backend`], which
/// hands it out where it exists ([`Backend::percpu`]).
pub trait PercpuPredictor {
    /// One prediction of per-CPU access costs.
    fn predict_percpu(&mut self, plan: &PercpuPlan) -> Result<PercpuResult, BackendError>;
}

/// A source of samples.
pub trait Backend {
    /// Which backend this is (the name a run is stored under).
    fn kind(&self) -> BackendKind;

    /// What it can do: by default what its kind can.
    fn capabilities(&self) -> Capabilities {
        self.kind().capabilities()
    }

    /// The host the samples describe.
    fn host(&self) -> &HostInfo;

    /// The cost profile, for the model.
    fn profile_name(&self) -> Option<String> {
        None
    }

    /// `lifecycle`: builds one VM in the plan's order and returns every ioctl's timing.
    fn construct_vm(&mut self, plan: &ConstructionPlan) -> Result<ConstructionTrace, BackendError>;

    /// `memory`: one pass of first touches over a freshly backed region.
    fn touch_memory(&mut self, plan: &TouchPlan) -> Result<TouchResult, BackendError>;

    /// `exits`: one batch of exit roundtrips of one kind.
    fn exit_roundtrips(&mut self, plan: &ExitPlan) -> Result<ExitResult, BackendError>;

    /// `pinning`: one context-switch trace under a pin policy.
    fn pin_trace(&mut self, plan: &PinPlan) -> Result<PinResult, BackendError>;

    /// `percpu`: the predictor, where this backend has one (none by default).
    fn percpu(&mut self) -> Option<&mut dyn PercpuPredictor> {
        None
    }

    /// `dirty`: passes of guest writes over a logged memslot, the log collected after each.
    fn dirty_log(&mut self, plan: &DirtyPlan) -> Result<DirtyResult, BackendError>;

    /// `memslots`: one VM's memslots added, moved or deleted one by one, each update timed.
    fn update_memslots(&mut self, plan: &MemslotPlan) -> Result<MemslotResult, BackendError>;
}

/// A plan that knows which [`Backend`] call executes it, so a scenario names its plan type
/// and nothing else: one execution is one repetition.
pub trait Execute {
    /// What one execution returns.
    type Output;

    /// Executes the plan once on `backend`.
    fn execute(&self, backend: &mut dyn Backend) -> Result<Self::Output, BackendError>;
}

/// Each mechanism's plan runs through its one method of [`Backend`].
macro_rules! executes {
    ($($plan:ty => $output:ty, $method:ident;)*) => {$(
        impl Execute for $plan {
            type Output = $output;

            fn execute(&self, backend: &mut dyn Backend) -> Result<$output, BackendError> {
                backend.$method(self)
            }
        }
    )*};
}

executes! {
    ConstructionPlan => ConstructionTrace, construct_vm;
    TouchPlan => TouchResult, touch_memory;
    ExitPlan => ExitResult, exit_roundtrips;
    PinPlan => PinResult, pin_trace;
    DirtyPlan => DirtyResult, dirty_log;
    MemslotPlan => MemslotResult, update_memslots;
}

impl Execute for PercpuPlan {
    type Output = PercpuResult;

    /// The scenario is refused before it runs on a backend without the predictor
    /// ([`Capabilities::percpu`]); this error is for a caller that skipped that check.
    fn execute(&self, backend: &mut dyn Backend) -> Result<PercpuResult, BackendError> {
        match backend.percpu() {
            Some(p) => p.predict_percpu(self),
            None => Err(BackendError::Unsupported(
                "per-CPU page tables need a per-vCPU-CR3 guest; use --backend model".into(),
            )),
        }
    }
}
