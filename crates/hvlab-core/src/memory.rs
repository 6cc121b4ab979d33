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
    /// A memfd (shmem) mapped shared: every first touch is a shmem fault.
    Shmem,
    /// A hugetlb memfd (`MFD_HUGETLB`) of this page size, from a pool hvlab reserves.
    Hugetlb(HugeSize),
    /// guest_memfd (`KVM_CREATE_GUEST_MEMFD`, mmap-able and shared) as the slot's memory,
    /// through `KVM_SET_USER_MEMORY_REGION2`.
    GuestMemfd,
    /// A shmem memfd whose page cache is filled through the fd first, mapped lazily:
    /// userfaultfd MINOR faults answered with `UFFDIO_CONTINUE` over this window (pages).
    UffdMinor(usize),
    /// A hugetlb memfd of 2 MiB pages whose page cache is filled through the fd first,
    /// mapped lazily: userfaultfd MINOR faults (`UFFD_FEATURE_MINOR_HUGETLBFS`), one
    /// `UFFDIO_CONTINUE` per huge page, from a pool hvlab reserves as for [`HostBacking::Hugetlb`].
    UffdMinorHugetlb,
}

/// A hugetlb page size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HugeSize {
    /// 2 MiB pages.
    Mib2,
    /// 1 GiB pages.
    Gib1,
}

impl HugeSize {
    /// Bytes per page.
    pub fn bytes(self) -> u64 {
        match self {
            HugeSize::Mib2 => 2 << 20,
            HugeSize::Gib1 => 1 << 30,
        }
    }

    /// The name of the size's pool under /sys/kernel/mm/hugepages.
    pub fn sysfs_dir(self) -> String {
        format!("hugepages-{}kB", self.bytes() / 1024)
    }
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
    /// vCPUs touching the region at once, each its own contiguous slice (memstress's shape);
    /// the region is a multiple of `vcpus` × 2 MiB, so no huge page is shared.
    pub vcpus: u32,
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

    /// Each vCPU's page indices, in order: vCPU `i` owns the `i`-th of `vcpus` equal
    /// contiguous slices and runs the pattern inside it (a random order seeded with
    /// `seed + i`). One vCPU's order is [`TouchPlan::page_order`].
    pub fn vcpu_orders(&self) -> Vec<Vec<u32>> {
        let n = self.vcpus.max(1);
        if n == 1 {
            return vec![self.page_order()];
        }
        let pages = u32::try_from(self.size_bytes / PAGE).unwrap_or(u32::MAX);
        let slice = pages / n;
        (0..n)
            .map(|i| {
                let base = i * slice;
                let local = TouchPlan {
                    size_bytes: u64::from(slice) * PAGE,
                    seed: self.seed.wrapping_add(u64::from(i)),
                    vcpus: 1,
                    ..self.clone()
                };
                local.page_order().into_iter().map(|p| p + base).collect()
            })
            .collect()
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
    /// With several vCPUs: each one's time from the common start to its own `End`, ns, in
    /// vCPU order (`elapsed_ns` is then the slowest's). Empty for one vCPU.
    pub vcpu_ns: Vec<u64>,
    /// For a hugetlb backing: the pool's pages before the pass and while it ran (hvlab grew
    /// it by what was missing and set it back afterwards).
    pub hugetlb_pool: Option<(u64, u64)>,
}

/// KVM's own bound on vCPUs per VM when the host cannot be asked (`KVM_MAX_VCPUS`,
/// arch/x86/include/asm/kvm_host.h, 1024 since Linux 5.15): the model's limit.
pub const MODEL_MAX_VCPUS: u32 = 1024;

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

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(pattern: Pattern, vcpus: u32) -> TouchPlan {
        TouchPlan {
            size_bytes: 16 << 20,
            pattern,
            seed: 7,
            access: Access::Write,
            touch: Touch::FirstByte,
            guest_page: GuestPage::Huge,
            backing: HostBacking::Anonymous(Backing::Lazy),
            cpl: None,
            timeout: Duration::from_secs(1),
            prefetch: None,
            vcpus,
        }
    }

    #[test]
    fn each_vcpu_owns_one_contiguous_slice_and_together_they_cover_the_region_once() {
        for pattern in [
            Pattern::Seq,
            Pattern::Reverse,
            Pattern::Random,
            Pattern::Stride(3),
        ] {
            let one = plan(pattern, 1);
            assert_eq!(one.vcpu_orders(), vec![one.page_order()]);
            let orders = plan(pattern, 4).vcpu_orders();
            assert_eq!(orders.len(), 4);
            for (i, o) in orders.iter().enumerate() {
                let lo = u32::try_from(i).unwrap() * 1024;
                assert!(
                    o.iter().all(|p| (lo..lo + 1024).contains(p)),
                    "{pattern:?} vCPU {i}"
                );
            }
            let mut all: Vec<u32> = orders.concat();
            all.sort_unstable();
            all.dedup();
            let expect = if pattern == Pattern::Stride(3) {
                4 * 342
            } else {
                4096
            };
            assert_eq!(all.len(), expect, "{pattern:?}");
        }
        let seq = plan(Pattern::Seq, 2).vcpu_orders();
        assert_eq!(&seq[1][..2], &[2048, 2049]);
    }
}
