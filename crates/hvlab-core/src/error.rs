//! What a [`Backend`](super::Backend) fails with, beside the trait (as cloud-hypervisor's
//! `HypervisorVmError` stands beside `trait Vm`), and the kinds of failure every crate's error
//! names for the binary, which owns the exit codes.

/// What kind of failure an error is. Each crate's error says which of these it is
/// (`fault()`); the binary turns it into its exit code (2, 3, 4, or 128 + the signal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The request or a file named in it is wrong: the message names the fix.
    BadInput,
    /// This host cannot do what was asked (a device, a capability, a feature it lacks).
    HostCannot,
    /// A measurement, the store or hvlab's own machinery failed.
    Failed,
    /// hvlab was asked to stop by a signal, and stopped what it had started.
    Interrupted {
        /// The signal number.
        signal: i32,
    },
}

/// What a backend fails with: the one way any backend says it cannot run a plan on this host,
/// its own configuration lacking what a plan needs, or a failure while running it. A backend
/// turns its own errors into these (the kvm backend's `KvmError`, the model's profile errors).
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The backend cannot run this plan on this host (exit 3; the variant is unsupported).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The backend's own configuration (the model's cost profile) lacks or spoils what the
    /// plan needs: bad input (exit 2). The message is the configuration's own.
    #[error(transparent)]
    Config(Box<dyn std::error::Error + Send + Sync + 'static>),
    /// Running the plan failed (an ioctl, the guest, the host): exit 4. The message and its
    /// causes are the backend's own.
    #[error(transparent)]
    Failed(Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl BackendError {
    /// What kind of failure it is.
    pub fn fault(&self) -> Fault {
        match self {
            BackendError::Unsupported(_) => Fault::HostCannot,
            BackendError::Config(_) => Fault::BadInput,
            BackendError::Failed(_) => Fault::Failed,
        }
    }
}

// A construction order KVM cannot execute: bad input (exit 2), refused before any VM is built.
/// Bad construction order: {0}.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub struct BadOrder(pub String);
