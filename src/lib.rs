//! hvlab: the hypervisor fast-path lab.
//!
//! Data flows one way: a [`scenario`] builds plans and hands them to a backend through
//! `hvlab_core::Backend` (real KVM in `kvm`, behind the default cargo feature `kvm` on x86-64;
//! the executable model in [`model`]), the samples become a [`record`], the [`store`] keeps it,
//! [`analysis`] turns samples into statistics, findings and verdicts, the [`export`]ers write
//! them in each format, and the [`cli`] prints. `hvlab_core` owns the vocabulary both backends
//! speak (plans and results per mechanism, the host description, the KVM ioctl table); `kvm`
//! and `model` import it and never each other or the scenarios. [`lab`] holds the logic above
//! single runs (suite, sweep, calibration, validation, fidelity); [`trace`] attributes another
//! VMM's ioctls; [`sys`] holds the few system calls without a safe wrapper.
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

pub mod cli;
pub mod error;
pub mod export;
pub mod kernel;
pub mod lab;
pub mod scenario;
pub mod sys;
pub mod trace;

// What can stop a command (each layer's error wrapped in it), and what bad input says.
pub use cli::Error;
pub use error::InputError;
// The layers below, each its own crate, under the names the code and the tests use.
pub use hvlab_analysis as analysis;
pub use hvlab_analysis::record;
#[cfg(hvlab_kvm)]
pub use hvlab_kvm as kvm;
pub use hvlab_model as model;
pub use hvlab_store as store;
