//! Tests that run guests on `/dev/kvm` and time them, in one binary: one test binary links
//! the whole crate, so fewer binaries build faster, and the timed tests here take turns on
//! KVM (`common::kvm_or_skip`) instead of sharing the two cores with unrelated work.
//! Each file below is one area; its own doc says what it proves.

mod common;

mod compare;
mod kvm_dirty;
mod kvm_exits;
// The harness's tests drive `hvlab-kvm` directly: only in the build that has it.
#[cfg(feature = "kvm")]
mod kvm_harness;
mod kvm_lifecycle;
mod kvm_memory;
mod kvm_memslots;
mod kvm_pinning;
mod noise;
mod trace;
