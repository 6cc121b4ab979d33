//! The guest vocabulary both backends and the scenarios share: privilege level, page size,
//! host backing, the guest's address-space limit, and where the kvm guest puts its page
//! tables, code, stack and touch order (the model predicts the stage-2 faults they take).

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

// The system memslot at GPA 0, as the kvm guest lays it out (hvlab-kvm's `guest::layout`
// writes it; the memory prediction replays its page walks). One definition, so the two
// cannot drift apart.

/// GDT address.
pub const GDT_GPA: u64 = 0x1000;
/// PML4 address (CR3).
pub const PML4_GPA: u64 = 0x2000;
/// The PDPT.
pub const PDPT_GPA: u64 = 0x3000;
/// The PD of GiB 0: 2 MiB identity pages (the system slot, MMIO test addresses).
pub const PD0_GPA: u64 = 0x4000;
/// The data region's PDs, one page per GiB, from here.
pub const DATA_PD_GPA: u64 = 0x5000;
/// Code address (entry point).
pub const CODE_GPA: u64 = 0x5_0000;
/// Initial stack pointer (the stack grows down from it).
pub const STACK_TOP: u64 = 0x7_0000;
/// Where the touch-order array (u32 page indices) starts; the data region's 4 KiB page
/// tables follow it.
pub const INDEX_GPA: u64 = 0x10_0000;

// The data region's PDs at their most must end below the code.
const _: () = assert!(DATA_PD_GPA + (DATA_MAX_BYTES >> 30) * 4096 <= CODE_GPA);

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
