//! The kvm backend's errors, beside its code: opening `/dev/kvm`, the ioctls, guest memory,
//! the guest. Through the [`Backend`](hvlab_core::Backend) trait they become a
//! [`BackendError`]; the binary wraps [`KvmError`] itself where it opens `/dev/kvm`.

use std::path::PathBuf;

use hvlab_core::error::{BackendError, Fault};

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
    // What this host lacks for the plan (a THP mode, hugetlb pages, a feature of its KVM), in
    // words that name it: becomes the one `BackendError::Unsupported` at the seam.
    /// {0}
    Lacks(String),
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
                | KvmError::Lacks(_)
        )
    }

    /// What kind of failure it is: the host's limitation, or a failure while measuring.
    pub fn fault(&self) -> Fault {
        if self.is_host_limitation() {
            Fault::HostCannot
        } else {
            Fault::Failed
        }
    }
}

impl From<KvmError> for BackendError {
    /// Through the [`Backend`](hvlab_core::Backend) trait: what this host lacks is the one
    /// `Unsupported` every backend says, anything else a failure keeping its causes.
    fn from(e: KvmError) -> BackendError {
        if e.is_host_limitation() {
            BackendError::Unsupported(e.to_string())
        } else {
            BackendError::Failed(Box::new(e))
        }
    }
}
