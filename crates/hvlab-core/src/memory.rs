//! The memory vocabulary: a first-touch pass over a freshly backed region, and what a backend
//! observed during it.

use std::time::Duration;

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use super::guest::{Backing, Cpl, GuestPage};
use super::host::HostInfo;

/// The order pages are touched in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Ascending.
    Seq,
    /// Descending.
    Reverse,
    /// A seeded permutation.
    Random,
    /// Every K-th page, ascending.
    Stride(u32),
}

/// Load or store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Access {
    /// Loads.
    Read,
    /// Stores.
    Write,
}

/// How much of each page.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Touch {
    /// One access at the start of the page.
    FirstByte,
    /// Every cache line of the page.
    WholePage,
}

/// Where the data region's host memory comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostBacking {
    /// Anonymous memory with this backing.
    Anonymous(Backing),
    /// Lazy memory served by a userfaultfd thread with this window (pages).
    Uffd(usize),
    /// Lazy memory pre-faulted into stage 2 with `KVM_PRE_FAULT_MEMORY`.
    PreFault,
}

/// The SPTE prefetch loop a model variant runs (the kvm backend runs its kernel's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetchLoop {
    /// No prefetch (the TDP MMU).
    None,
    /// `__direct_pte_prefetch()` before the fix: runs reaching the block end are dropped.
    LegacySkipTrailing,
    /// `__direct_pte_prefetch()` after the fix.
    Legacy,
}

/// One pass to run.
#[derive(Debug, Clone, PartialEq)]
pub struct TouchPlan {
    /// Data region bytes.
    pub size_bytes: u64,
    /// Touch order.
    pub pattern: Pattern,
    /// Seed for `Random`.
    pub seed: u64,
    /// Load or store.
    pub access: Access,
    /// How much of each page.
    pub touch: Touch,
    /// Guest page size.
    pub guest_page: GuestPage,
    /// Host backing.
    pub backing: HostBacking,
    /// Guest privilege level; `None`: the backend's default for its host ([`Cpl::default_for`]).
    pub cpl: Option<Cpl>,
    /// Watchdog.
    pub timeout: Duration,
    /// The prefetch loop to model (`None`: the MMU's own, from the profile).
    pub prefetch: Option<PrefetchLoop>,
}

const PAGE: u64 = 4096;

impl TouchPlan {
    /// The 4 KiB page indices to touch, in order.
    pub fn page_order(&self) -> Vec<u32> {
        let pages = u32::try_from(self.size_bytes / PAGE).unwrap_or(u32::MAX);
        match self.pattern {
            Pattern::Seq => (0..pages).collect(),
            Pattern::Reverse => (0..pages).rev().collect(),
            Pattern::Random => random_order(pages, self.seed),
            Pattern::Stride(k) => (0..pages).step_by(k.max(1) as usize).collect(),
        }
    }
}

/// Pages `0..pages` in the random order `seed` draws: the same on both backends, so a model
/// pass touches what a guest touched.
pub fn random_order(pages: u32, seed: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..pages).collect();
    v.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
    v
}

/// What one pass measured.
#[derive(Debug, Clone, PartialEq)]
pub struct TouchResult {
    /// Pages touched.
    pub pages: u64,
    /// Host time from Start to End, ns.
    pub elapsed_ns: u64,
    /// userfaultfd faults served, for the uffd variants.
    pub uffd_faults: Option<u64>,
    /// Statistics that changed during the pass: (metric name, unit, delta).
    pub kvm_stats: Vec<(String, String, i128)>,
    /// 4 KiB pages of the guest's own page tables (data-region PDs, and PTs with 4 KiB guest
    /// pages) first read in the measured section. With TDP these are guest memory like any
    /// other, so each costs one stage-2 fault on top of the data's; shadow paging reads them
    /// through the host mapping instead. `None` where the backend has no guest page tables.
    pub guest_table_pages: Option<u64>,
}

/// How stage 2 is built, which decides how many faults a first touch costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stage2Mmu {
    /// Shadow paging (no EPT/NPT, or PVM): SPTEs follow the guest's PTEs; prefetch
    /// (`FNAME(pte_prefetch)`) skips guest PTEs whose Accessed bit is clear.
    Shadow,
    /// EPT/NPT with the legacy MMU: direct maps, `direct_pte_prefetch()` maps present
    /// neighbours.
    TdpLegacy,
    /// EPT/NPT with the TDP MMU: one fault per host page, never a prefetch.
    TdpMmu,
}

impl Stage2Mmu {
    /// The MMU a host (or a model profile's host) uses; `None` when the host does not say.
    pub fn of(host: &HostInfo) -> Option<Stage2Mmu> {
        match (host.tdp?, host.tdp_mmu) {
            (false, _) => Some(Stage2Mmu::Shadow),
            (true, Some(true)) => Some(Stage2Mmu::TdpMmu),
            (true, Some(false)) => Some(Stage2Mmu::TdpLegacy),
            (true, None) => None,
        }
    }
}
