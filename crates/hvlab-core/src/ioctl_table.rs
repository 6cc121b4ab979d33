//! KVM ioctl numbers and what they do to the I/O-bus SRCU, for decoding traces.
//!
//! Numbers are the `_IO*(KVMIO, nr, type)` encodings of `include/uapi/linux/kvm.h` (x86-64
//! sizes where two requests share a direction and number). Decoding keys on type `0xAE`,
//! direction, number, and size only where the number is shared, so a request whose struct grew
//! in a later kernel still decodes.

/// The `_IOC` direction bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// `_IO`: no argument copied.
    None_,
    /// `_IOW`: userspace writes to the kernel.
    Write,
    /// `_IOR`: the kernel writes to userspace.
    Read,
    /// `_IOWR`.
    ReadWrite,
}

impl Dir {
    fn from_bits(bits: u32) -> Dir {
        match bits & 3 {
            0 => Dir::None_,
            1 => Dir::Write,
            2 => Dir::Read,
            _ => Dir::ReadWrite,
        }
    }
}

/// One KVM ioctl request.
#[derive(Debug, Clone, Copy)]
pub struct KvmIoctl {
    /// The `nr` byte.
    pub nr: u8,
    /// The direction bits.
    pub dir: Dir,
    /// The argument size, where needed to tell two requests apart.
    pub size: Option<u16>,
    /// The name in the KVM API.
    pub name: &'static str,
}

impl KvmIoctl {
    const fn new(nr: u8, dir: Dir, size: Option<u16>, name: &'static str) -> KvmIoctl {
        KvmIoctl {
            nr,
            dir,
            size,
            name,
        }
    }
}

/// The ioctl type byte of every KVM request.
pub const KVMIO: u32 = 0xAE;

/// The ioctls hvlab can name.
pub const KVM_IOCTLS: &[KvmIoctl] = &[
    KvmIoctl::new(0x00, Dir::None_, None, "KVM_GET_API_VERSION"),
    KvmIoctl::new(0x01, Dir::None_, None, "KVM_CREATE_VM"),
    KvmIoctl::new(0x02, Dir::ReadWrite, None, "KVM_GET_MSR_INDEX_LIST"),
    KvmIoctl::new(0x03, Dir::None_, None, "KVM_CHECK_EXTENSION"),
    KvmIoctl::new(0x04, Dir::None_, None, "KVM_GET_VCPU_MMAP_SIZE"),
    KvmIoctl::new(0x05, Dir::ReadWrite, None, "KVM_GET_SUPPORTED_CPUID"),
    KvmIoctl::new(0x09, Dir::ReadWrite, None, "KVM_GET_EMULATED_CPUID"),
    KvmIoctl::new(0x0a, Dir::ReadWrite, None, "KVM_GET_MSR_FEATURE_INDEX_LIST"),
    KvmIoctl::new(0x41, Dir::None_, None, "KVM_CREATE_VCPU"),
    KvmIoctl::new(0x42, Dir::Write, None, "KVM_GET_DIRTY_LOG"),
    KvmIoctl::new(0x46, Dir::Write, None, "KVM_SET_USER_MEMORY_REGION"),
    KvmIoctl::new(0x47, Dir::None_, None, "KVM_SET_TSS_ADDR"),
    KvmIoctl::new(0x48, Dir::Write, None, "KVM_SET_IDENTITY_MAP_ADDR"),
    KvmIoctl::new(0x49, Dir::Write, None, "KVM_SET_USER_MEMORY_REGION2"),
    KvmIoctl::new(0x60, Dir::None_, None, "KVM_CREATE_IRQCHIP"),
    KvmIoctl::new(0x61, Dir::Write, None, "KVM_IRQ_LINE"),
    KvmIoctl::new(0x62, Dir::ReadWrite, None, "KVM_GET_IRQCHIP"),
    KvmIoctl::new(0x63, Dir::Read, None, "KVM_SET_IRQCHIP"),
    KvmIoctl::new(0x67, Dir::Write, None, "KVM_REGISTER_COALESCED_MMIO"),
    KvmIoctl::new(0x67, Dir::ReadWrite, None, "KVM_IRQ_LINE_STATUS"),
    KvmIoctl::new(0x68, Dir::Write, None, "KVM_UNREGISTER_COALESCED_MMIO"),
    KvmIoctl::new(0x6a, Dir::Write, None, "KVM_SET_GSI_ROUTING"),
    KvmIoctl::new(0x71, Dir::None_, None, "KVM_REINJECT_CONTROL"),
    KvmIoctl::new(0x76, Dir::Write, None, "KVM_IRQFD"),
    KvmIoctl::new(0x77, Dir::Write, None, "KVM_CREATE_PIT2"),
    KvmIoctl::new(0x78, Dir::None_, None, "KVM_SET_BOOT_CPU_ID"),
    KvmIoctl::new(0x79, Dir::Write, None, "KVM_IOEVENTFD"),
    KvmIoctl::new(0x7b, Dir::Write, None, "KVM_SET_CLOCK"),
    KvmIoctl::new(0x7c, Dir::Read, None, "KVM_GET_CLOCK"),
    KvmIoctl::new(0x80, Dir::None_, None, "KVM_RUN"),
    KvmIoctl::new(0x81, Dir::Read, None, "KVM_GET_REGS"),
    KvmIoctl::new(0x82, Dir::Write, None, "KVM_SET_REGS"),
    KvmIoctl::new(0x83, Dir::Read, None, "KVM_GET_SREGS"),
    KvmIoctl::new(0x84, Dir::Write, None, "KVM_SET_SREGS"),
    KvmIoctl::new(0x85, Dir::ReadWrite, None, "KVM_TRANSLATE"),
    KvmIoctl::new(0x88, Dir::ReadWrite, None, "KVM_GET_MSRS"),
    KvmIoctl::new(0x89, Dir::Write, None, "KVM_SET_MSRS"),
    KvmIoctl::new(0x8a, Dir::Write, None, "KVM_SET_CPUID"),
    KvmIoctl::new(0x8b, Dir::Write, None, "KVM_SET_SIGNAL_MASK"),
    KvmIoctl::new(0x8c, Dir::Read, None, "KVM_GET_FPU"),
    KvmIoctl::new(0x8d, Dir::Write, None, "KVM_SET_FPU"),
    KvmIoctl::new(0x8e, Dir::Read, None, "KVM_GET_LAPIC"),
    KvmIoctl::new(0x8f, Dir::Write, None, "KVM_SET_LAPIC"),
    KvmIoctl::new(0x90, Dir::Write, None, "KVM_SET_CPUID2"),
    KvmIoctl::new(0x91, Dir::ReadWrite, None, "KVM_GET_CPUID2"),
    KvmIoctl::new(0x92, Dir::ReadWrite, None, "KVM_TPR_ACCESS_REPORTING"),
    KvmIoctl::new(0x93, Dir::Write, None, "KVM_SET_VAPIC_ADDR"),
    KvmIoctl::new(0x98, Dir::Read, None, "KVM_GET_MP_STATE"),
    KvmIoctl::new(0x99, Dir::Write, None, "KVM_SET_MP_STATE"),
    KvmIoctl::new(0x9a, Dir::None_, None, "KVM_NMI"),
    KvmIoctl::new(0x9b, Dir::Write, None, "KVM_SET_GUEST_DEBUG"),
    KvmIoctl::new(0x9c, Dir::Write, None, "KVM_X86_SETUP_MCE"),
    KvmIoctl::new(0x9d, Dir::Read, None, "KVM_X86_GET_MCE_CAP_SUPPORTED"),
    KvmIoctl::new(0x9e, Dir::Write, None, "KVM_X86_SET_MCE"),
    KvmIoctl::new(0x9f, Dir::Read, Some(0x70), "KVM_GET_PIT2"),
    KvmIoctl::new(0x9f, Dir::Read, Some(0x40), "KVM_GET_VCPU_EVENTS"),
    KvmIoctl::new(0xa0, Dir::Write, Some(0x70), "KVM_SET_PIT2"),
    KvmIoctl::new(0xa0, Dir::Write, Some(0x40), "KVM_SET_VCPU_EVENTS"),
    KvmIoctl::new(0xa1, Dir::Read, None, "KVM_GET_DEBUGREGS"),
    KvmIoctl::new(0xa2, Dir::None_, None, "KVM_SET_TSC_KHZ"),
    KvmIoctl::new(0xa2, Dir::Write, None, "KVM_SET_DEBUGREGS"),
    KvmIoctl::new(0xa3, Dir::None_, None, "KVM_GET_TSC_KHZ"),
    KvmIoctl::new(0xa3, Dir::Write, None, "KVM_ENABLE_CAP"),
    KvmIoctl::new(0xa4, Dir::Read, None, "KVM_GET_XSAVE"),
    KvmIoctl::new(0xa5, Dir::Write, Some(0x1000), "KVM_SET_XSAVE"),
    KvmIoctl::new(0xa5, Dir::Write, Some(0x20), "KVM_SIGNAL_MSI"),
    KvmIoctl::new(0xa6, Dir::Read, None, "KVM_GET_XCRS"),
    KvmIoctl::new(0xa7, Dir::Write, None, "KVM_SET_XCRS"),
    KvmIoctl::new(0xab, Dir::Write, None, "KVM_GET_ONE_REG"),
    KvmIoctl::new(0xac, Dir::Write, None, "KVM_SET_ONE_REG"),
    KvmIoctl::new(0xad, Dir::None_, None, "KVM_KVMCLOCK_CTRL"),
    KvmIoctl::new(0xb0, Dir::ReadWrite, None, "KVM_GET_REG_LIST"),
    KvmIoctl::new(0xb2, Dir::Write, None, "KVM_SET_PMU_EVENT_FILTER"),
    KvmIoctl::new(0xb7, Dir::None_, None, "KVM_SMI"),
    KvmIoctl::new(0xba, Dir::ReadWrite, None, "KVM_MEMORY_ENCRYPT_OP"),
    KvmIoctl::new(0xbb, Dir::Read, None, "KVM_MEMORY_ENCRYPT_REG_REGION"),
    KvmIoctl::new(0xbc, Dir::Read, None, "KVM_MEMORY_ENCRYPT_UNREG_REGION"),
    KvmIoctl::new(0xbe, Dir::ReadWrite, None, "KVM_GET_NESTED_STATE"),
    KvmIoctl::new(0xbf, Dir::Write, None, "KVM_SET_NESTED_STATE"),
    KvmIoctl::new(0xc0, Dir::ReadWrite, None, "KVM_CLEAR_DIRTY_LOG"),
    KvmIoctl::new(0xc1, Dir::ReadWrite, None, "KVM_GET_SUPPORTED_HV_CPUID"),
    KvmIoctl::new(0xc6, Dir::Write, None, "KVM_SET_MSR_FILTER"),
    KvmIoctl::new(0xc7, Dir::None_, None, "KVM_RESET_DIRTY_RINGS"),
    KvmIoctl::new(0xcc, Dir::Read, None, "KVM_GET_SREGS2"),
    KvmIoctl::new(0xcd, Dir::Write, None, "KVM_SET_SREGS2"),
    KvmIoctl::new(0xce, Dir::None_, None, "KVM_GET_STATS_FD"),
    KvmIoctl::new(0xcf, Dir::Read, None, "KVM_GET_XSAVE2"),
    KvmIoctl::new(0xd2, Dir::Write, None, "KVM_SET_MEMORY_ATTRIBUTES"),
    KvmIoctl::new(0xd4, Dir::ReadWrite, None, "KVM_CREATE_GUEST_MEMFD"),
    KvmIoctl::new(0xd5, Dir::ReadWrite, None, "KVM_PRE_FAULT_MEMORY"),
    KvmIoctl::new(0xe0, Dir::ReadWrite, None, "KVM_CREATE_DEVICE"),
    KvmIoctl::new(0xe1, Dir::Write, None, "KVM_SET_DEVICE_ATTR"),
    KvmIoctl::new(0xe2, Dir::Write, None, "KVM_GET_DEVICE_ATTR"),
    KvmIoctl::new(0xe3, Dir::Write, None, "KVM_HAS_DEVICE_ATTR"),
];

/// Decodes a raw request number (as strace prints it with `-e raw=ioctl`, possibly
/// sign-extended to 64 bits) into its KVM name; `None` when it is not a KVM request.
pub fn decode(request: u64) -> Option<&'static str> {
    // Requests are 32-bit; strace sign-extends those with the top (read) bit set.
    let req = u32::try_from(request & 0xffff_ffff).ok()?;
    if (req >> 8) & 0xff != KVMIO {
        return None;
    }
    let nr = u8::try_from(req & 0xff).ok()?;
    let dir = Dir::from_bits(req >> 30);
    let size = u16::try_from((req >> 16) & 0x3fff).ok()?;
    let mut candidates = KVM_IOCTLS.iter().filter(|i| i.nr == nr && i.dir == dir);
    let first = candidates.clone().next()?;
    Some(
        candidates
            .find(|i| i.size == Some(size))
            .unwrap_or(first)
            .name,
    )
}

/// `KVM_IOEVENTFD` flag: remove the ioeventfd (`kvm_deassign_ioeventfd`).
pub const KVM_IOEVENTFD_FLAG_DEASSIGN: u32 = 1 << 2;
/// `KVM_IOEVENTFD` flag: match the written value (how virtio doorbells are registered).
pub const KVM_IOEVENTFD_FLAG_DATAMATCH: u32 = 1;

/// What `kvm_io_bus_register_dev()` does with the bus array it replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusRegistration {
    /// `synchronize_srcu_expedited()` then `kfree()`: the registration itself can wait for a
    /// grace period in flight, and starts none (every kernel before 6.18).
    Synchronizes,
    /// `call_srcu()` (commit 7d9a0273, "KVM: Avoid synchronize_srcu() in
    /// kvm_io_bus_register_dev()", first in 6.18): returns at once and starts a normal grace
    /// period that a later expedited synchronization must wait out.
    Defers,
}

/// How the kernel that produced a timeline uses `kvm->srcu` in the ioctls a VMM issues while
/// building a VM: which can wait for a grace period, which start one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrcuKernel {
    /// The I/O-bus registration scheme.
    pub registration: BusRegistration,
    /// The first `KVM_CREATE_VCPU` adds a private memslot, and so synchronizes: VMX allocates
    /// the APIC-access page (`kvm_alloc_apic_access_page()` from `vmx_vcpu_create()`); SVM
    /// only with AVIC (off by default), PVM not at all (measured: no memslot appears).
    pub vcpu_creation_adds_memslot: bool,
}

impl SrcuKernel {
    /// The semantics of a kernel by its release string (`uname -r`) and KVM flavour. A release
    /// that does not parse is taken as the newest scheme.
    pub fn of(release: &str, vmx: bool) -> SrcuKernel {
        let registration = match parse_release(release) {
            Some(version) if version < (6, 18) => BusRegistration::Synchronizes,
            _ => BusRegistration::Defers,
        };
        SrcuKernel {
            registration,
            vcpu_creation_adds_memslot: vmx,
        }
    }
}

/// `(major, minor)` of a kernel release such as `6.12.117+deb12-amd64`.
pub fn parse_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// What one ioctl does to `kvm->srcu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SrcuEffect {
    /// It can block in `synchronize_srcu{,_expedited}()` on `kvm->srcu`, directly or through a
    /// memslot swap (`kvm_swap_active_memslots()`), and so wait out a grace period in flight.
    pub waits: bool,
    /// It starts a normal grace period (`call_srcu()`) that later waiters must wait out.
    pub starts_gp: bool,
    /// It starts a grace period and waits it out itself: `synchronize_srcu()` while vCPUs run
    /// (SRCU readers), with no grace period already in flight. Only a backend that knows
    /// (the model) says so; a timeline from a real kernel cannot tell.
    pub own_gp: bool,
}

const WAITS: SrcuEffect = SrcuEffect {
    waits: true,
    starts_gp: false,
    own_gp: false,
};
const NONE: SrcuEffect = SrcuEffect {
    waits: false,
    starts_gp: false,
    own_gp: false,
};

/// What a KVM ioctl does to `kvm->srcu` on `kernel`. `flags` is the ioctl's flags field where
/// the caller knows it; strace shows only a pointer, so for a traced `KVM_IOEVENTFD` it is
/// `None` and both assign and deassign are possible.
///
/// The paths, from the kernel sources of 6.1, 6.12 and 6.18: `KVM_IOEVENTFD` assign,
/// `KVM_REGISTER_COALESCED_MMIO`, `KVM_CREATE_IRQCHIP` (`kvm_pic_init()`, `kvm_ioapic_init()`)
/// and `KVM_CREATE_PIT2` (`kvm_create_pit()`) register I/O-bus devices; `KVM_IOEVENTFD`
/// deassign and `KVM_UNREGISTER_COALESCED_MMIO` call `kvm_io_bus_unregister_dev()`, which
/// always synchronizes; memslot updates swap memslots. Waits on `kvm->irq_srcu`
/// (`KVM_SET_GSI_ROUTING`, `KVM_IRQFD`) are not here: nothing a VMM does while building a VM
/// starts a normal grace period on it, so no stall can be attributed there.
pub fn srcu_effect(name: &str, flags: Option<u32>, kernel: &SrcuKernel) -> SrcuEffect {
    let registration = match kernel.registration {
        BusRegistration::Synchronizes => WAITS,
        BusRegistration::Defers => SrcuEffect {
            waits: false,
            starts_gp: true,
            own_gp: false,
        },
    };
    match name {
        "KVM_IOEVENTFD" => match flags {
            Some(f) if f & KVM_IOEVENTFD_FLAG_DEASSIGN != 0 => WAITS,
            Some(_) => registration,
            // Either, as far as the trace shows.
            None => SrcuEffect {
                waits: true,
                starts_gp: registration.starts_gp,
                own_gp: false,
            },
        },
        "KVM_CREATE_IRQCHIP"
        | "KVM_CREATE_PIT2"
        | "KVM_CREATE_PIT"
        | "KVM_REGISTER_COALESCED_MMIO" => registration,
        "KVM_UNREGISTER_COALESCED_MMIO"
        | "KVM_SET_USER_MEMORY_REGION"
        | "KVM_SET_USER_MEMORY_REGION2"
        | "KVM_SET_PMU_EVENT_FILTER"
        | "KVM_X86_SET_MSR_FILTER" => WAITS,
        "KVM_CREATE_VCPU" if kernel.vcpu_creation_adds_memslot => WAITS,
        _ => NONE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_the_requests_a_vmm_issues_before_its_first_run() {
        assert_eq!(decode(0xae01), Some("KVM_CREATE_VM"));
        assert_eq!(decode(0xae60), Some("KVM_CREATE_IRQCHIP"));
        assert_eq!(decode(0x4020_ae46), Some("KVM_SET_USER_MEMORY_REGION"));
        assert_eq!(decode(0x4040_ae79), Some("KVM_IOEVENTFD"));
        assert_eq!(decode(0x4040_ae77), Some("KVM_CREATE_PIT2"));
        assert_eq!(decode(0xae41), Some("KVM_CREATE_VCPU"));
        assert_eq!(decode(0xae80), Some("KVM_RUN"));
    }

    #[test]
    fn sign_extended_read_requests_decode() {
        // strace prints _IOR/_IOWR requests sign-extended: 0xc008ae88 is KVM_GET_MSRS.
        assert_eq!(decode(0xffff_ffff_c008_ae88), Some("KVM_GET_MSRS"));
        assert_eq!(decode(0xffff_ffff_8030_ae7c), Some("KVM_GET_CLOCK"));
    }

    #[test]
    fn shared_numbers_are_told_apart_by_direction_and_size() {
        assert_eq!(decode(0x4068_aea3), Some("KVM_ENABLE_CAP"));
        assert_eq!(decode(0xaea3), Some("KVM_GET_TSC_KHZ"));
        assert_eq!(decode(0x8070_ae9f), Some("KVM_GET_PIT2"));
        assert_eq!(decode(0x8040_ae9f), Some("KVM_GET_VCPU_EVENTS"));
        assert_eq!(decode(0x4020_aea5), Some("KVM_SIGNAL_MSI"));
    }

    #[test]
    fn non_kvm_requests_are_not_named() {
        assert_eq!(decode(0x5401), None); // TCGETS
        assert_eq!(decode(0x4008_ae00 & 0xffff_00ff | 0x0000_5400), None);
    }

    const K6_12: SrcuKernel = SrcuKernel {
        registration: BusRegistration::Synchronizes,
        vcpu_creation_adds_memslot: false,
    };
    const K6_18: SrcuKernel = SrcuKernel {
        registration: BusRegistration::Defers,
        vcpu_creation_adds_memslot: false,
    };

    #[test]
    fn registration_defers_from_6_18_on() {
        assert_eq!(
            SrcuKernel::of("6.12.117+deb12-amd64", false).registration,
            BusRegistration::Synchronizes
        );
        assert_eq!(
            SrcuKernel::of("6.1.0-41-amd64", false).registration,
            BusRegistration::Synchronizes
        );
        assert_eq!(
            SrcuKernel::of("6.18.0-pvm", false).registration,
            BusRegistration::Defers
        );
        assert_eq!(
            SrcuKernel::of("7.2.13", false).registration,
            BusRegistration::Defers
        );
        assert!(SrcuKernel::of("6.12.1", true).vcpu_creation_adds_memslot);
    }

    #[test]
    fn srcu_effects_follow_the_kernel_paths() {
        let assign = Some(KVM_IOEVENTFD_FLAG_DATAMATCH);
        let deassign = Some(KVM_IOEVENTFD_FLAG_DEASSIGN);
        // 6.18: registration starts a grace period and cannot wait; deassign waits.
        assert!(srcu_effect("KVM_IOEVENTFD", assign, &K6_18).starts_gp);
        assert!(!srcu_effect("KVM_IOEVENTFD", assign, &K6_18).waits);
        assert!(srcu_effect("KVM_IOEVENTFD", deassign, &K6_18).waits);
        assert!(srcu_effect("KVM_IOEVENTFD", None, &K6_18).waits);
        assert!(srcu_effect("KVM_CREATE_IRQCHIP", None, &K6_18).starts_gp);
        // 6.12: registration synchronizes, so it can wait and starts nothing.
        let pit = srcu_effect("KVM_CREATE_PIT2", None, &K6_12);
        assert!(pit.waits && !pit.starts_gp);
        assert!(srcu_effect("KVM_SET_USER_MEMORY_REGION", None, &K6_12).waits);
        for never in [
            "KVM_CREATE_VM",
            "KVM_SET_SREGS",
            "KVM_SET_CPUID2",
            "KVM_RUN",
        ] {
            assert_eq!(srcu_effect(never, None, &K6_18), SrcuEffect::default());
            assert_eq!(srcu_effect(never, None, &K6_12), SrcuEffect::default());
        }
        assert!(!srcu_effect("KVM_CREATE_VCPU", None, &K6_18).waits);
        let vmx = SrcuKernel::of("6.12.1", true);
        assert!(srcu_effect("KVM_CREATE_VCPU", None, &vmx).waits);
    }
}
