//! Tests that boot kernels under test in QEMU (`hvlab vm`, `hvlab kab`, the emulated SVM+NPT
//! host), in one binary: they run when `HVLAB_SVM_TCG` is set and share hvlab's kernel cache.
//! With them, the sandbox kernel builds run in and its limits (no kernel: scratch trees),
//! hostile Makefiles on Debian 7.3's source, and `hvlab cache` (a scratch cache).

mod common;

mod cache;
mod hostile_builds;
mod kernel_vm;
mod sandbox;
mod svm_tcg;
