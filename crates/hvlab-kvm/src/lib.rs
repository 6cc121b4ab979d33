//! The real backend: everything that talks to `/dev/kvm`.
//!
//! One file per KVM object or concern, in the manner of Firecracker's `vstate/`: the host probe
//! (`host`), the timed VM builder (`vm`), guest memory (`guest_memory`), the binary statistics
//! reader (`stats`), the guest payload (`guest/`), and one executor per mechanism. Its errors
//! stand beside it (`error`).
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

#![cfg(all(feature = "backend", target_arch = "x86_64"))]

pub mod dirty;
pub mod error;
pub mod exits;
pub mod guest;
pub mod guest_memory;
pub mod host;
pub mod hugetlb;
pub mod lifecycle;
pub mod measure;
pub mod memory;
pub mod memslots;
pub mod pinning;
pub mod stats;

pub mod uffd;
pub mod vm;

use std::path::Path;

use kvm_ioctls::Kvm;

pub use error::KvmError;
pub use hvlab_host::probe::kvm_device_path;

/// Wraps an ioctl error with the KVM name of the operation.
pub fn ioctl_error(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> KvmError {
    move |e| KvmError::Ioctl {
        op,
        source: std::io::Error::from_raw_os_error(e.errno()),
    }
}

/// Opens the KVM device, turning the two common failures into messages that say what to do.
pub fn open_kvm() -> Result<Kvm, KvmError> {
    let path = kvm_device_path();
    open_kvm_at(&path)
}

/// Opens the KVM device at `path`.
pub fn open_kvm_at(path: &Path) -> Result<Kvm, KvmError> {
    // Check existence and access ourselves first: the ioctl crate's error loses the path.
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(KvmError::DeviceMissing(path.to_path_buf()));
        }
        Err(source) => {
            return Err(KvmError::Open {
                path: path.to_path_buf(),
                source,
            });
        }
        Ok(_) => {}
    }
    let c_path = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str()))
        .map_err(|_| KvmError::Open {
        path: path.to_path_buf(),
        source: std::io::Error::other("the path contains a NUL byte"),
    })?;
    let kvm = Kvm::new_with_path(&c_path).map_err(|e| {
        if e.errno() == libc::EACCES || e.errno() == libc::EPERM {
            KvmError::PermissionDenied(path.to_path_buf())
        } else {
            KvmError::Open {
                path: path.to_path_buf(),
                source: std::io::Error::from_raw_os_error(e.errno()),
            }
        }
    })?;
    // Opening proves nothing (/dev/null opens too): KVM answers KVM_GET_API_VERSION with 12.
    let version = kvm.get_api_version();
    if version != KVM_API_VERSION {
        let why = if version < 0 {
            format!(
                "KVM_GET_API_VERSION failed: {}",
                std::io::Error::last_os_error()
            )
        } else {
            format!("KVM_GET_API_VERSION returned {version}, not {KVM_API_VERSION}")
        };
        return Err(KvmError::NotKvm(path.to_path_buf(), why));
    }
    Ok(kvm)
}

/// The only KVM API version there has ever been.
const KVM_API_VERSION: i32 = 12;

/// The real backend.
#[derive(Debug)]
pub struct KvmBackend {
    kvm: Kvm,
    host: host::HostInfo,
    /// When the last VM this backend built finished its last step (the next build's
    /// `since_last_ns` is measured from it).
    last_build_end: Option<std::time::Instant>,
    /// When that VM was torn down (the next build's `since_teardown_ns`).
    last_teardown_end: Option<std::time::Instant>,
}

impl KvmBackend {
    /// Opens `/dev/kvm`; fails with a message that says what to do when it cannot.
    pub fn new(host: host::HostInfo) -> Result<KvmBackend, KvmError> {
        Ok(KvmBackend {
            kvm: open_kvm()?,
            host,
            last_build_end: None,
            last_teardown_end: None,
        })
    }
}

impl hvlab_core::Backend for KvmBackend {
    fn kind(&self) -> hvlab_core::BackendKind {
        hvlab_core::BackendKind::Kvm
    }

    fn host(&self) -> &host::HostInfo {
        &self.host
    }

    fn construct_vm(
        &mut self,
        plan: &hvlab_core::lifecycle::ConstructionPlan,
    ) -> Result<hvlab_core::lifecycle::ConstructionTrace, hvlab_core::error::BackendError> {
        let (mut trace, clock, torn_down) = lifecycle::construct(&self.kvm, plan)?;
        trace.since_last_ns = self.last_build_end.map(|end| vm::ns_since(end, clock));
        trace.since_teardown_ns = self.last_teardown_end.map(|end| vm::ns_since(end, clock));
        self.last_build_end = clock.checked_add(std::time::Duration::from_nanos(trace.end_ns()));
        self.last_teardown_end = Some(torn_down);
        Ok(trace)
    }

    fn touch_memory(
        &mut self,
        plan: &hvlab_core::memory::TouchPlan,
    ) -> Result<hvlab_core::memory::TouchResult, hvlab_core::error::BackendError> {
        Ok(memory::touch(&self.kvm, &self.host, plan)?)
    }

    fn exit_roundtrips(
        &mut self,
        plan: &hvlab_core::exits::ExitPlan,
    ) -> Result<hvlab_core::exits::ExitResult, hvlab_core::error::BackendError> {
        Ok(exits::roundtrips(&self.kvm, &self.host, plan)?)
    }

    fn pin_trace(
        &mut self,
        plan: &hvlab_core::pinning::PinPlan,
    ) -> Result<hvlab_core::pinning::PinResult, hvlab_core::error::BackendError> {
        pinning::pin_trace(&self.kvm, &self.host, plan)
    }

    fn dirty_log(
        &mut self,
        plan: &hvlab_core::dirty::DirtyPlan,
    ) -> Result<hvlab_core::dirty::DirtyResult, hvlab_core::error::BackendError> {
        Ok(dirty::dirty_log(&self.kvm, &self.host, plan)?)
    }

    fn update_memslots(
        &mut self,
        plan: &hvlab_core::memslots::MemslotPlan,
    ) -> Result<hvlab_core::memslots::MemslotResult, hvlab_core::error::BackendError> {
        Ok(memslots::update_memslots(&self.kvm, plan)?)
    }
}
