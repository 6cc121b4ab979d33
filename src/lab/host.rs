//! The host probe for every build: with the kvm backend it asks `/dev/kvm` for capabilities;
//! a model-only build describes the host without them and says why.

use crate::backend::host::HostInfo;

/// Probes this host.
#[cfg(hvlab_kvm)]
pub fn probe() -> HostInfo {
    crate::kvm::host::probe()
}

/// Probes this host.
#[cfg(not(hvlab_kvm))]
pub fn probe() -> HostInfo {
    crate::backend::host::probe_with(
        crate::error::Error::KvmNotBuilt.to_string(),
        std::collections::BTreeMap::new(),
    )
}

/// Fails with the access error when `/dev/kvm` cannot be used. A model-only build has nothing
/// to require: its host description already says it was built without the kvm backend.
#[cfg(hvlab_kvm)]
pub fn require_kvm(host: &HostInfo) -> Result<(), crate::error::Error> {
    Ok(crate::kvm::host::require_kvm(host)?)
}

/// Fails with the access error when `/dev/kvm` cannot be used. A model-only build has nothing
/// to require: its host description already says it was built without the kvm backend.
#[cfg(not(hvlab_kvm))]
pub fn require_kvm(_: &HostInfo) -> Result<(), crate::error::Error> {
    Ok(())
}
