//! The guest-physical layout and the structures written into guest memory before entry: the
//! GDT and identity-mapped 4-level page tables.
//!
//! ```text
//! 0x0000_1000  GDT: null, code64 DPL0, data DPL0, code64 DPL3, data DPL3
//! 0x0000_2000  PML4
//! 0x0000_3000  PDPT
//! 0x0000_4000  PD for GiB 0: 2 MiB pages, identity (the system slot, MMIO test addresses)
//! 0x0000_5000  PDs for the data region, one per GiB
//! 0x0005_0000  code (64 KiB)
//! 0x0007_0000  stack top (grows down)
//! 0x0010_0000  the touch-order array (u32 page indices), then 4 KiB page tables
//! 0x3000_0000  unbacked: MMIO test address; +0x1000 the ioeventfd doorbell
//! 0x1_0000_0000  the data region (its own memslot), 4 KiB or 2 MiB guest pages
//! ```
//! Every entry has the user bit set: CPL3 code touches everything directly.

// The system slot's addresses are the core's, shared with the model's prediction of the
// faults the guest's own page walks take.
pub use hvlab_core::guest::{
    CODE_GPA, DATA_MAX_BYTES, GDT_GPA, GuestPage, INDEX_GPA, PML4_GPA, STACK_TOP,
};
use hvlab_core::guest::{DATA_PD_GPA, PD0_GPA, PDPT_GPA};

use super::super::KvmError;
use super::super::guest_memory::GuestMemory;

/// Largest payload.
pub const CODE_MAX: usize = 0x1_0000;
/// An address with no memslot: accesses exit as MMIO.
pub const MMIO_TEST_GPA: u64 = 0x3000_0000;
/// The ioeventfd doorbell (also unbacked; KVM completes the write in the kernel).
pub const IOEVENTFD_GPA: u64 = 0x3000_1000;
/// The profiling-buffer doorbells: +0 enable (the store carries the buffer's address), +8
/// disable.
pub const PIN_DOORBELL_GPA: u64 = 0x3000_2000;
/// Where the data region starts.
pub const DATA_GPA: u64 = 0x1_0000_0000;

const PAGE_4K: u64 = 4096;
const PAGE_2M: u64 = 2 << 20;
const GIB: u64 = 1 << 30;
/// Present, writable, user.
const PTE_PWU: u64 = 0x7;
/// Page size (in a PDE: a 2 MiB page).
const PTE_PS: u64 = 0x80;

/// The GDT descriptors, in selector order (selector = index × 8).
pub const GDT: [u64; 5] = [
    0,
    0x00af_9b00_0000_ffff, // 0x08 code64, DPL0
    0x00cf_9300_0000_ffff, // 0x10 data, DPL0
    0x00af_fb00_0000_ffff, // 0x18 code64, DPL3
    0x00cf_f300_0000_ffff, // 0x20 data, DPL3
];

/// Where everything goes for one guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Data region bytes (a multiple of 2 MiB).
    pub data_bytes: u64,
    /// Data region page size.
    pub guest_page: GuestPage,
    /// Bytes of the touch-order array.
    pub index_bytes: u64,
    /// First 4 KiB page table.
    pub pt_gpa: u64,
    /// Size of the system memslot at GPA 0.
    pub system_bytes: u64,
}

impl Layout {
    /// Plans a guest with `data_bytes` of data and room for `index_entries` u32 indices.
    pub fn new(
        data_bytes: u64,
        guest_page: GuestPage,
        index_entries: u64,
    ) -> Result<Layout, KvmError> {
        if data_bytes == 0 || !data_bytes.is_multiple_of(PAGE_2M) || data_bytes > DATA_MAX_BYTES {
            return Err(KvmError::Layout(format!(
                "data region of {data_bytes} bytes: must be a non-zero multiple of 2 MiB up to 64 GiB"
            )));
        }
        let index_bytes = (index_entries * 4).next_multiple_of(PAGE_4K);
        let pt_gpa = INDEX_GPA + index_bytes;
        let pt_bytes = match guest_page {
            GuestPage::Small => data_bytes / PAGE_4K * 8,
            GuestPage::Huge => 0,
        };
        let system_bytes = (pt_gpa + pt_bytes).next_multiple_of(PAGE_2M);
        if system_bytes > MMIO_TEST_GPA {
            return Err(KvmError::Layout(
                "page tables and index would overlap the MMIO test range".into(),
            ));
        }
        Ok(Layout {
            data_bytes,
            guest_page,
            index_bytes,
            pt_gpa,
            system_bytes,
        })
    }

    /// Writes the GDT, the page tables and `code` into the system slot's memory (which must be
    /// `system_bytes` long and map GPA 0).
    pub fn write_system(&self, system: &mut GuestMemory, code: &[u8]) -> Result<(), KvmError> {
        if code.len() > CODE_MAX {
            return Err(KvmError::Layout(format!(
                "payload of {} bytes exceeds {CODE_MAX}",
                code.len()
            )));
        }
        let put = |m: &mut GuestMemory, gpa: u64, v: u64| m.write(to_usize(gpa)?, &v.to_le_bytes());
        for (i, d) in GDT.iter().enumerate() {
            put(system, GDT_GPA + 8 * i as u64, *d)?;
        }
        put(system, PML4_GPA, PDPT_GPA | PTE_PWU)?;
        // GiB 0: identity 2 MiB pages.
        put(system, PDPT_GPA, PD0_GPA | PTE_PWU)?;
        for i in 0..512u64 {
            put(system, PD0_GPA + 8 * i, (i * PAGE_2M) | PTE_PWU | PTE_PS)?;
        }
        let gibs = self.data_bytes.div_ceil(GIB);
        for g in 0..gibs {
            let pd = DATA_PD_GPA + g * PAGE_4K;
            put(system, PDPT_GPA + 8 * (DATA_GPA / GIB + g), pd | PTE_PWU)?;
        }
        let huge_pages = self.data_bytes / PAGE_2M;
        for p in 0..huge_pages {
            let pde_gpa = DATA_PD_GPA + p * 8; // PDs are contiguous, so entries run on
            let entry = match self.guest_page {
                GuestPage::Huge => (DATA_GPA + p * PAGE_2M) | PTE_PWU | PTE_PS,
                GuestPage::Small => (self.pt_gpa + p * PAGE_4K) | PTE_PWU,
            };
            put(system, pde_gpa, entry)?;
        }
        if self.guest_page == GuestPage::Small {
            let ptes: Vec<u8> = (0..self.data_bytes / PAGE_4K)
                .flat_map(|i| ((DATA_GPA + i * PAGE_4K) | PTE_PWU).to_le_bytes())
                .collect();
            system.write(to_usize(self.pt_gpa)?, &ptes)?;
        }
        system.write(to_usize(CODE_GPA)?, code)
    }

    /// Writes the touch-order array.
    pub fn write_index(&self, system: &mut GuestMemory, indices: &[u32]) -> Result<(), KvmError> {
        if indices.len() as u64 * 4 > self.index_bytes {
            return Err(KvmError::Layout(
                "touch order does not fit its array".into(),
            ));
        }
        let bytes: Vec<u8> = indices.iter().flat_map(|i| i.to_le_bytes()).collect();
        system.write(to_usize(INDEX_GPA)?, &bytes)
    }
}

fn to_usize(v: u64) -> Result<usize, KvmError> {
    usize::try_from(v)
        .map_err(|_| KvmError::Layout(format!("address {v:#x} does not fit this host")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_u64(m: &GuestMemory, gpa: u64) -> u64 {
        let mut b = [0u8; 8];
        m.read(usize::try_from(gpa).unwrap(), &mut b).unwrap();
        u64::from_le_bytes(b)
    }

    /// Walks the guest page tables the way the MMU does and returns the physical address.
    fn walk(m: &GuestMemory, va: u64) -> Option<u64> {
        let pml4e = read_u64(m, PML4_GPA + 8 * ((va >> 39) & 511));
        let pdpte = read_u64(m, (pml4e & !0xfff) + 8 * ((va >> 30) & 511));
        if pdpte & 1 == 0 {
            return None;
        }
        let pde = read_u64(m, (pdpte & !0xfff) + 8 * ((va >> 21) & 511));
        if pde & 1 == 0 {
            return None;
        }
        if pde & PTE_PS != 0 {
            return Some((pde & !0x1f_ffff & !(1 << 63)) | (va & 0x1f_ffff));
        }
        let pte = read_u64(m, (pde & !0xfff) + 8 * ((va >> 12) & 511));
        (pte & 1 != 0).then_some((pte & !0xfff) | (va & 0xfff))
    }

    #[test]
    fn page_tables_map_the_data_region_identically_in_both_page_sizes() {
        for page in [GuestPage::Small, GuestPage::Huge] {
            let layout = Layout::new(3 << 30, page, 1000).unwrap();
            let mut sys =
                GuestMemory::anonymous(usize::try_from(layout.system_bytes).unwrap()).unwrap();
            layout.write_system(&mut sys, &[0x90]).unwrap();
            for va in [
                DATA_GPA,
                DATA_GPA + 0x1234_5678,
                DATA_GPA + (3 << 30) - 1,
                CODE_GPA,
                MMIO_TEST_GPA + 4,
            ] {
                assert_eq!(walk(&sys, va), Some(va), "{page:?} {va:#x}");
            }
            assert_eq!(
                walk(&sys, DATA_GPA + (3 << 30)),
                None,
                "{page:?}: past the end is unmapped"
            );
        }
    }

    #[test]
    fn sizes_that_are_not_2mib_multiples_are_refused() {
        assert!(Layout::new(3 << 20, GuestPage::Huge, 0).is_err());
        assert!(Layout::new(0, GuestPage::Huge, 0).is_err());
        assert!(Layout::new(65 << 30, GuestPage::Huge, 0).is_err());
    }

    #[test]
    fn the_system_slot_grows_with_4k_page_tables() {
        let small = Layout::new(1 << 30, GuestPage::Small, 0).unwrap();
        let huge = Layout::new(1 << 30, GuestPage::Huge, 0).unwrap();
        assert_eq!(small.system_bytes - huge.system_bytes, 2 << 20); // 262144 PTEs × 8 bytes
    }
}
