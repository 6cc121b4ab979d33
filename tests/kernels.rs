//! Tests that boot kernels under test in QEMU (`hvlab vm`, `hvlab kab`, the emulated SVM+NPT
//! host), in one binary: they run when `HVLAB_SVM_TCG` is set and share hvlab's kernel cache.
//! With them, the sandbox kernel builds run in (no kernel: scratch trees).

mod common;

mod kernel_vm;
mod sandbox;
mod svm_tcg;
