//! The host probe for every build: with the kvm backend it asks `/dev/kvm` for capabilities;
//! a model-only build describes the host without them and says why.

use hvlab_core::host::HostInfo;

/// Probes this host, naming the hvlab that describes it (its version and git revision).
pub fn probe() -> HostInfo {
    #[cfg(hvlab_kvm)]
    let host = crate::kvm::host::probe();
    #[cfg(not(hvlab_kvm))]
    let host = hvlab_host::probe::probe_with(
        crate::error::Error::KvmNotBuilt.to_string(),
        std::collections::BTreeMap::new(),
    );
    HostInfo {
        hvlab_version: env!("CARGO_PKG_VERSION").to_string(),
        git_rev: env!("HVLAB_GIT_REV").to_string(),
        ..host
    }
}

/// Fails with the access error when `/dev/kvm` cannot be used. A model-only build has nothing
/// to require: its host description already says it was built without the kvm backend.
#[cfg(hvlab_kvm)]
pub fn require_kvm(host: &HostInfo) -> Result<(), crate::lab::Error> {
    Ok(crate::kvm::host::require_kvm(host)?)
}

/// Fails with the access error when `/dev/kvm` cannot be used. A model-only build has nothing
/// to require: its host description already says it was built without the kvm backend.
#[cfg(not(hvlab_kvm))]
pub fn require_kvm(_: &HostInfo) -> Result<(), crate::lab::Error> {
    Ok(())
}
