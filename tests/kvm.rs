//! Tests that run guests on `/dev/kvm` and time them, in one binary: one test binary links
//! the whole crate, so fewer binaries build faster, and the timed tests here take turns on
//! KVM (`common::kvm_or_skip`) instead of sharing the two cores with unrelated work.
//! Each file below is one area; its own doc says what it proves.

mod common;

#[path = "compare.rs"]
mod compare;
#[path = "kvm_dirty.rs"]
mod kvm_dirty;
#[path = "kvm_exits.rs"]
mod kvm_exits;
// The harness's tests drive `hvlab-kvm` directly: only in the build that has it.
#[cfg(feature = "kvm")]
#[path = "kvm_harness.rs"]
mod kvm_harness;
#[path = "kvm_lifecycle.rs"]
mod kvm_lifecycle;
#[path = "kvm_memory.rs"]
mod kvm_memory;
#[path = "kvm_memslots.rs"]
mod kvm_memslots;
#[path = "kvm_pinning.rs"]
mod kvm_pinning;
#[path = "noise.rs"]
mod noise;
#[path = "trace.rs"]
mod trace;
