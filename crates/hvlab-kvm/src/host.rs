//! The host probe's KVM half: which capabilities `/dev/kvm` offers. The rest of the host
//! description is read without KVM ([`hvlab_core::host`]).

use std::collections::BTreeMap;

pub use hvlab_core::host::{HostInfo, KvmFlavour};

use super::{KvmError, open_kvm};

/// The capabilities hvlab's scenarios depend on, by their KVM API names.
pub const CAPABILITIES: &[(&str, u32)] = &[
    ("KVM_CAP_IRQCHIP", kvm_bindings::KVM_CAP_IRQCHIP),
    ("KVM_CAP_PIT2", kvm_bindings::KVM_CAP_PIT2),
    ("KVM_CAP_IOEVENTFD", kvm_bindings::KVM_CAP_IOEVENTFD),
    ("KVM_CAP_SET_TSS_ADDR", kvm_bindings::KVM_CAP_SET_TSS_ADDR),
    ("KVM_CAP_USER_MEMORY", kvm_bindings::KVM_CAP_USER_MEMORY),
    ("KVM_CAP_USER_MEMORY2", kvm_bindings::KVM_CAP_USER_MEMORY2),
    (
        "KVM_CAP_IMMEDIATE_EXIT",
        kvm_bindings::KVM_CAP_IMMEDIATE_EXIT,
    ),
    (
        "KVM_CAP_BINARY_STATS_FD",
        kvm_bindings::KVM_CAP_BINARY_STATS_FD,
    ),
    (
        "KVM_CAP_PMU_CAPABILITY",
        kvm_bindings::KVM_CAP_PMU_CAPABILITY,
    ),
    (
        "KVM_CAP_PRE_FAULT_MEMORY",
        kvm_bindings::KVM_CAP_PRE_FAULT_MEMORY,
    ),
    ("KVM_CAP_SPLIT_IRQCHIP", kvm_bindings::KVM_CAP_SPLIT_IRQCHIP),
];

/// Probes the host, `/dev/kvm` included. Never fails: KVM access problems are recorded in
/// `kvm_access` so `hvlab host` can show everything before erroring.
pub fn probe() -> HostInfo {
    let (kvm_access, capabilities) = match open_kvm() {
        Ok(kvm) => {
            let caps = CAPABILITIES
                .iter()
                .map(|(name, nr)| {
                    (
                        (*name).to_string(),
                        kvm.check_extension_raw(libc::c_ulong::from(*nr)) > 0,
                    )
                })
                .collect();
            ("ok".to_string(), caps)
        }
        Err(e) => (e.to_string(), BTreeMap::new()),
    };
    hvlab_host::probe::probe_with(kvm_access, capabilities)
}

/// Fails with the access error when `/dev/kvm` cannot be used.
pub fn require_kvm(host: &HostInfo) -> Result<(), KvmError> {
    if host.kvm_usable() {
        return Ok(());
    }
    // The probe kept only the message; reopen for the typed error.
    open_kvm().map(drop)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::KvmError;

    #[test]
    fn missing_device_makes_the_probe_say_so_without_failing() {
        // The probe never errors; it records why KVM is unusable.
        let err = crate::open_kvm_at(Path::new("/nonexistent/kvm")).unwrap_err();
        assert!(matches!(err, KvmError::DeviceMissing(_)));
        assert!(err.to_string().contains("does not exist"));
        assert!(err.is_host_limitation());
    }
}
