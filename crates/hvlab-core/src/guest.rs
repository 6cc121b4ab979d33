//! The guest vocabulary both backends and the scenarios share: privilege level, page size,
//! host backing, and the guest's address-space limit.

/// The privilege level guest code runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Cpl {
    /// Kernel mode.
    Zero,
    /// User mode (with IOPL=3 so port I/O does not fault).
    Three,
}

impl Cpl {
    /// Where measurement loops run when a plan does not say: CPL3 on PVM, where guest CPL0 is
    /// instruction-emulated (about a million instructions a second); CPL0 elsewhere.
    pub fn default_for(flavour: super::host::KvmFlavour) -> Cpl {
        match flavour {
            super::host::KvmFlavour::Pvm => Cpl::Three,
            _ => Cpl::Zero,
        }
    }

    /// 0 or 3.
    pub fn level(self) -> u8 {
        match self {
            Cpl::Zero => 0,
            Cpl::Three => 3,
        }
    }
}

/// The guest's page size for the data region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum GuestPage {
    /// 4 KiB pages (a PT level under each PD entry).
    Small,
    /// 2 MiB pages (PS set in the PD entry).
    Huge,
}

/// Largest data region a guest maps (one PD page per GiB fits below its code).
pub const DATA_MAX_BYTES: u64 = 64 << 30;

/// How host memory behind a memslot is provided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Backing {
    /// Plain anonymous 4 KiB memory: every first touch is a host page fault.
    Lazy,
    /// 4 KiB memory made present and writable before the guest runs (`MADV_POPULATE_WRITE`),
    /// so KVM's prefetch can map neighbours of a faulting page without faulting them in.
    Populated,
    /// 2 MiB-aligned with `MADV_HUGEPAGE`: the host backs it with transparent huge pages when
    /// its THP mode allows.
    Thp,
}
