//! Errors of the real backend, in a module every build has: the model-only build still
//! reports, with exit code 3, that it cannot measure on `/dev/kvm`.

use std::path::PathBuf;

/// Errors of the KVM backend. The doc comment of each variant is the message the user sees.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum KvmError {
    /// {0} does not exist: this host has no KVM. Load the module (`modprobe kvm_intel` or `modprobe kvm_amd`) or run on a host with hardware virtualization; the model backend still works (`--backend model`).
    DeviceMissing(PathBuf),
    /// Permission denied opening {0}: add your user to the `kvm` group (`sudo usermod -aG kvm $USER`, then log in again) or run as root.
    PermissionDenied(PathBuf),
    /// Cannot open {path}: {source}
    Open {
        /// The device node.
        path: PathBuf,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// {0} is not a KVM device ({1}): point $HVLAB_KVM_DEVICE at the KVM device node (usually /dev/kvm), or unset it.
    NotKvm(PathBuf, String),
    /// needs {0}, which this host's KVM does not offer
    MissingCap(&'static str),
    /// {0}
    Unsupported(String),
    /// {op} failed: {source}
    Ioctl {
        /// The ioctl or step that failed, by its KVM name.
        op: &'static str,
        /// The errno.
        source: std::io::Error,
    },
    /// Cannot map {bytes} bytes of guest memory: {source}
    Mmap {
        /// Requested size.
        bytes: usize,
        /// The errno.
        source: std::io::Error,
    },
    /// Cannot read KVM binary statistics: {0}
    Stats(String),
    /// The guest did not signal as expected: {0}
    Guest(String),
    /// {what}: {source}
    Host {
        /// The host operation, and what it was for.
        what: String,
        /// What the kernel said.
        source: std::io::Error,
    },
    /// The guest's layout cannot hold this: {0}
    Layout(String),
    /// Cannot assemble the guest payload: {0}
    Assemble(String),
    /// hvlab's own machinery failed (a bug to report): {0}
    Internal(String),
    /// This hvlab was built without the kvm backend (cargo feature `kvm`, x86-64 hosts): rebuild with default features on x86-64 to measure on /dev/kvm; the model backend works (`--backend model`).
    NotBuilt,
}

impl KvmError {
    /// True when the failure is the host's inability to run the request (exit code 3), as
    /// opposed to a failure during a measurement.
    pub fn is_host_limitation(&self) -> bool {
        matches!(
            self,
            KvmError::DeviceMissing(_)
                | KvmError::PermissionDenied(_)
                | KvmError::Open { .. }
                | KvmError::NotKvm(..)
                | KvmError::MissingCap(_)
                | KvmError::Unsupported(_)
                | KvmError::NotBuilt
        )
    }
}

/// What a [`Backend`](super::Backend) fails with, beside the trait: the KVM backend's errors,
/// and the two ways any backend (the model's profile, a future one's configuration) refuses a
/// plan. The binary's error wraps it and owns the exit codes.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The KVM backend.
    #[error(transparent)]
    Kvm(#[from] KvmError),
    /// The backend cannot run this plan on this host (exit 3; the variant is unsupported).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The backend's own configuration (the model's cost profile) lacks or spoils what the
    /// plan needs: bad input (exit 2). The message is the configuration's own.
    #[error(transparent)]
    Config(Box<dyn std::error::Error + Send + Sync + 'static>),
}

// A construction order KVM cannot execute: bad input (exit 2), refused before any VM is built.
/// Bad construction order: {0}.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub struct BadOrder(pub String);
