//! The `memory` model: stage-2 faults, SPTE prefetch and host backing, page by page.
//!
//! Mirrors arch/x86/kvm/mmu/mmu.c: a fault on a non-present SPTE maps it
//! (`kvm_mmu_page_fault` → `direct_page_fault` → `direct_map`), faulting the host page in first
//! when absent (`__kvm_faultin_pfn`), then `direct_pte_prefetch()` →
//! `__direct_pte_prefetch()` walks the `PTE_PREFETCH_NUM`-aligned block around the fault and
//! hands each run of not-present SPTEs to `direct_pte_prefetch_many()`, which maps the leading
//! run of host pages an atomic lookup finds (`kvm_prefetch_pages`, never a host fault). Before
//! the fix the loop only flushed a run when it met a present SPTE (or the faulting one), so the
//! run reaching the end of the block was dropped. The TDP MMU does not prefetch. With shadow
//! paging and 4 KiB guest pages prefetch comes from guest PTEs instead (`FNAME(pte_prefetch)`)
//! and `FNAME(prefetch_invalid_gpte)` skips PTEs whose Accessed bit is clear, as on every page
//! a fresh guest has not touched. A huge host page under a huge guest mapping is mapped with
//! one 2 MiB SPTE. A userfaultfd-backed region gets host pages from the VMM's server, which
//! serves the faulting page and the unserved rest of its window.

use super::profile::{MmuKind, Profile, ProfileError};
use hvlab_core::guest::Backing;
use hvlab_core::guest::GuestPage;
use hvlab_core::memory::{HostBacking, Pattern, PrefetchLoop, Touch, TouchPlan, TouchResult};

/// `PTE_PREFETCH_NUM` (arch/x86/kvm/mmu/mmu.c): the stock kernel's prefetch block.
pub const PTE_PREFETCH_NUM: usize = 8;
/// The largest block `__direct_pte_prefetch()` can walk: one page table's 512 SPTEs. The
/// kernel masks the SPTE index with `PTE_PREFETCH_NUM - 1`, so a block is a power of two.
pub const PTE_PREFETCH_NUM_MAX: usize = 512;
const HUGE_PAGES: usize = 512;

/// Event counts of one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    /// Stage-2 faults taken.
    pub faults: u64,
    /// SPTEs mapped by prefetch.
    pub prefetched: u64,
    /// 4 KiB host faults.
    pub host_faults: u64,
    /// 2 MiB host faults.
    pub host_huge_faults: u64,
    /// userfaultfd events.
    pub uffd_faults: u64,
    /// Pages copied in by the userfaultfd server.
    pub uffd_pages: u64,
    /// Faults mapped with a 2 MiB SPTE.
    pub huge_mappings: u64,
}

/// SPTE and host-page state of one memslot.
#[derive(Debug, Clone)]
pub struct Mmu {
    spte: Vec<bool>,
    host: Vec<bool>,
    uffd_served: Vec<bool>,
    prefetch: PrefetchLoop,
    host_huge: bool,
    huge_mappings: bool,
    uffd_window: Option<usize>,
    /// `PTE_PREFETCH_NUM` of the kernel mirrored.
    prefetch_num: usize,
    /// Counts so far.
    pub counts: Counts,
}

impl Mmu {
    /// A memslot of `pages` 4 KiB pages.
    pub fn new(pages: usize, host: HostBacking, prefetch: PrefetchLoop, guest_huge: bool) -> Mmu {
        let (populated, host_huge, uffd_window) = match host {
            HostBacking::Anonymous(Backing::Populated) => (true, false, None),
            HostBacking::Anonymous(Backing::Thp) => (false, true, None),
            // File backings fault their pages in as anonymous memory does: shmem and
            // guest_memfd 4 KiB at a time, hugetlb a huge page at a time.
            HostBacking::Anonymous(Backing::Lazy)
            | HostBacking::PreFault
            | HostBacking::Shmem
            | HostBacking::GuestMemfd => (false, false, None),
            HostBacking::Hugetlb(_) => (false, true, None),
            HostBacking::Uffd(w) | HostBacking::UffdMinor(w) => (false, false, Some(w.max(1))),
            // One minor fault per huge page, which maps whole.
            HostBacking::UffdMinorHugetlb => (false, true, Some(HUGE_PAGES)),
        };
        let mut mmu = Mmu {
            spte: vec![false; pages],
            host: vec![populated; pages],
            uffd_served: vec![false; if uffd_window.is_some() { pages } else { 0 }],
            prefetch,
            host_huge,
            huge_mappings: host_huge && guest_huge,
            uffd_window,
            prefetch_num: PTE_PREFETCH_NUM,
            counts: Counts::default(),
        };
        if host == HostBacking::PreFault {
            // KVM_PRE_FAULT_MEMORY: every SPTE mapped (and host page faulted) before the guest runs.
            mmu.host.fill(true);
            mmu.spte.fill(true);
        }
        mmu
    }

    /// The same memslot under a kernel whose `PTE_PREFETCH_NUM` is `n` (a power of two up to
    /// [`PTE_PREFETCH_NUM_MAX`]; anything else is clamped to the nearest such block below).
    pub fn with_prefetch_num(mut self, n: usize) -> Mmu {
        self.prefetch_num = prefetch_block(n);
        self
    }

    /// Whether the SPTE of `gfn` is present.
    pub fn mapped(&self, gfn: usize) -> bool {
        self.spte[gfn]
    }

    /// Whether the host page behind `gfn` is present.
    pub fn host_present(&self, gfn: usize) -> bool {
        self.host[gfn]
    }

    /// A guest access to `gfn`.
    pub fn access(&mut self, gfn: usize) {
        if !self.spte[gfn] {
            self.fault(gfn);
        }
    }

    fn host_fault_in(&mut self, gfn: usize) {
        if let Some(window) = self.uffd_window {
            // The VMM's userfaultfd server: the faulting page and the unserved rest of its
            // window-aligned block.
            self.counts.uffd_faults += 1;
            let end = ((gfn / window + 1) * window).min(self.host.len());
            for p in gfn..end {
                if !self.uffd_served[p] {
                    self.uffd_served[p] = true;
                    self.host[p] = true;
                    self.counts.uffd_pages += 1;
                }
            }
        } else if self.host_huge {
            let start = gfn / HUGE_PAGES * HUGE_PAGES;
            let end = (start + HUGE_PAGES).min(self.host.len());
            self.host[start..end].fill(true);
            self.counts.host_huge_faults += 1;
        } else {
            self.host[gfn] = true;
            self.counts.host_faults += 1;
        }
    }

    /// `direct_page_fault()` on `gfn`.
    fn fault(&mut self, gfn: usize) {
        self.counts.faults += 1;
        if !self.host[gfn] {
            self.host_fault_in(gfn);
        }
        if self.huge_mappings {
            let start = gfn / HUGE_PAGES * HUGE_PAGES;
            let end = (start + HUGE_PAGES).min(self.spte.len());
            self.spte[start..end].fill(true);
            self.counts.huge_mappings += 1;
            return;
        }
        self.spte[gfn] = true;
        if self.prefetch != PrefetchLoop::None {
            self.direct_pte_prefetch(gfn);
        }
    }

    /// `__direct_pte_prefetch()`: runs of not-present SPTEs in the aligned block, split by
    /// present ones and by the faulting SPTE itself.
    fn direct_pte_prefetch(&mut self, gfn: usize) {
        let base = gfn & !(self.prefetch_num - 1);
        let end = (base + self.prefetch_num).min(self.spte.len());
        let mut start: Option<usize> = None;
        for i in base..end {
            if self.spte[i] || i == gfn {
                if let Some(s) = start.take()
                    && !self.direct_pte_prefetch_many(s, i)
                {
                    return;
                }
            } else if start.is_none() {
                start = Some(i);
            }
        }
        // The fix: flush the run that reaches the end of the block.
        if self.prefetch == PrefetchLoop::Legacy
            && let Some(s) = start
        {
            self.direct_pte_prefetch_many(s, end);
        }
    }

    /// `direct_pte_prefetch_many()`: maps the leading run of present host pages of
    /// [start, end); false (stop) when the first is absent, as `kvm_prefetch_pages() <= 0`.
    fn direct_pte_prefetch_many(&mut self, start: usize, end: usize) -> bool {
        let run = (start..end).take_while(|i| self.host[*i]).count();
        for i in start..start + run {
            self.spte[i] = true;
        }
        self.counts.prefetched += run as u64;
        run > 0
    }
}

/// The largest memslot the per-page engine runs whole: a random order is a materialised
/// permutation (4 bytes a page) and the per-page state 2 bytes a page, so 64 GiB costs
/// ~100 MB. Ordered patterns have no such limit (see [`pass`]).
pub const PER_PAGE_MAX_PAGES: u64 = (64 << 30) / 4096;

/// `n` as a prefetch block the kernel's mask allows: the largest power of two not above it,
/// from 1 to [`PTE_PREFETCH_NUM_MAX`].
fn prefetch_block(n: usize) -> usize {
    let n = n.clamp(1, PTE_PREFETCH_NUM_MAX);
    1 << n.ilog2()
}

/// Least common multiple.
fn lcm(a: usize, b: usize) -> usize {
    let (mut x, mut y) = (a, b);
    while y != 0 {
        (x, y) = (y, x % y);
    }
    a / x * b
}

/// The block every access's reads and writes stay inside: the `PTE_PREFETCH_NUM`-aligned
/// prefetch block, the host's fault unit (a 2 MiB THP or the userfaultfd window, both
/// aligned) and the 2 MiB SPTE of a huge mapping all divide it.
fn independent_block(host: HostBacking, prefetch_num: usize) -> usize {
    let host_unit = match host {
        HostBacking::Anonymous(Backing::Thp)
        | HostBacking::Hugetlb(_)
        | HostBacking::UffdMinorHugetlb => HUGE_PAGES,
        HostBacking::Uffd(w) | HostBacking::UffdMinor(w) => w.max(1),
        HostBacking::Anonymous(_)
        | HostBacking::PreFault
        | HostBacking::Shmem
        | HostBacking::GuestMemfd => 1,
    };
    lcm(prefetch_block(prefetch_num), host_unit)
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, o: Counts) {
        self.faults += o.faults;
        self.prefetched += o.prefetched;
        self.host_faults += o.host_faults;
        self.host_huge_faults += o.host_huge_faults;
        self.uffd_faults += o.uffd_faults;
        self.uffd_pages += o.uffd_pages;
        self.huge_mappings += o.huge_mappings;
    }
}

impl Counts {
    fn times(self, n: u64) -> Counts {
        Counts {
            faults: self.faults * n,
            prefetched: self.prefetched * n,
            host_faults: self.host_faults * n,
            host_huge_faults: self.host_huge_faults * n,
            uffd_faults: self.uffd_faults * n,
            uffd_pages: self.uffd_pages * n,
            huge_mappings: self.huge_mappings * n,
        }
    }
}

/// One memslot's pass, as a plan describes it (without the costs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// 4 KiB pages in the memslot.
    pub pages: u64,
    /// Touch order.
    pub pattern: Pattern,
    /// Seed of a random order.
    pub seed: u64,
    /// Host backing.
    pub host: HostBacking,
    /// The prefetch loop.
    pub prefetch: PrefetchLoop,
    /// 2 MiB guest pages.
    pub guest_huge: bool,
    /// `PTE_PREFETCH_NUM` of the kernel mirrored ([`PTE_PREFETCH_NUM`] in every stock one).
    pub prefetch_num: usize,
}

/// Why a pass cannot be modelled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassError {
    /// A random order over more pages than [`PER_PAGE_MAX_PAGES`].
    RandomTooLarge(u64),
    /// Several vCPUs over more pages than [`PER_PAGE_MAX_PAGES`].
    ParallelTooLarge(u64),
}

impl std::fmt::Display for PassError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PassError::RandomTooLarge(p) => write!(
                f,
                "a random order over {p} pages is modelled page by page, up to {PER_PAGE_MAX_PAGES} pages (64GiB)"
            ),
            PassError::ParallelTooLarge(p) => write!(
                f,
                "several vCPUs over {p} pages are modelled page by page, up to {PER_PAGE_MAX_PAGES} pages (64GiB)"
            ),
        }
    }
}

/// Runs [`Mmu`] over one independent block of `len` pages (the memslot's tail block may be
/// shorter) touched at `offsets`, in order.
fn block_counts(p: &Pass, len: usize, offsets: impl Iterator<Item = usize>) -> Counts {
    let mut m = Mmu::new(len, p.host, p.prefetch, p.guest_huge).with_prefetch_num(p.prefetch_num);
    for o in offsets {
        m.access(o);
    }
    m.counts
}

/// The event counts of a pass and the pages it touched.
///
/// The memslot is run-length encoded as independent blocks (see [`independent_block`]): every
/// SPTE and host page an access reads or writes lies in the aligned block of its gfn (clamped
/// to the memslot, as the kernel clamps to the memslot), so a block's counts depend only on its
/// length and on the offsets touched in it, in order, and the pass's counts are the sum over
/// blocks. Each distinct block is run once through [`Mmu`], the per-fault mirror of
/// `__direct_pte_prefetch()` and friends, and multiplied by how many blocks share it:
/// sequential and reverse orders have one full-block shape, a stride K has at most
/// K / gcd(K, block) shapes that repeat in that cycle. A random order touches blocks
/// interleaved, so it runs page by page over the whole memslot, up to [`PER_PAGE_MAX_PAGES`].
pub fn pass(p: &Pass) -> Result<(Counts, u64), PassError> {
    let n = p.pages;
    if p.pattern == Pattern::Random {
        if n > PER_PAGE_MAX_PAGES {
            return Err(PassError::RandomTooLarge(n));
        }
        // Bounded by PER_PAGE_MAX_PAGES.
        #[allow(clippy::cast_possible_truncation)]
        let (pages, last) = (n as usize, n as u32);
        let mut m =
            Mmu::new(pages, p.host, p.prefetch, p.guest_huge).with_prefetch_num(p.prefetch_num);
        for g in hvlab_core::memory::random_order(last, p.seed) {
            m.access(g as usize);
        }
        return Ok((m.counts, n));
    }
    let block = independent_block(p.host, p.prefetch_num);
    let l = block as u64;
    let full = n / l;
    #[allow(clippy::cast_possible_truncation)] // below `block`
    let tail = (n % l) as usize;
    let mut total = Counts::default();
    let touched = match p.pattern {
        Pattern::Seq | Pattern::Reverse => {
            let rev = p.pattern == Pattern::Reverse;
            let order = |len: usize| -> Box<dyn Iterator<Item = usize>> {
                if rev {
                    Box::new((0..len).rev())
                } else {
                    Box::new(0..len)
                }
            };
            if full > 0 {
                total += block_counts(p, block, order(block)).times(full);
            }
            total += block_counts(p, tail, order(tail));
            n
        }
        Pattern::Stride(k) => {
            let k = u64::from(k.max(1));
            // The offsets a stride touches in the block starting at `start`, ascending.
            let offsets = |start: u64, len: usize| {
                let first = (k - start % k) % k;
                #[allow(clippy::cast_possible_truncation)] // below `len`
                (first..len as u64).step_by(k as usize).map(|o| o as usize)
            };
            if k >= l {
                // At most one touch per block: one shape per offset.
                let mut memo: Vec<Option<Counts>> = vec![None; block];
                let mut g = 0;
                while g < full * l {
                    #[allow(clippy::cast_possible_truncation)] // below `block`
                    let o = (g % l) as usize;
                    let c = *memo[o].get_or_insert_with(|| block_counts(p, block, [o].into_iter()));
                    total += c;
                    g += k;
                }
            } else {
                // Block b's shape is (b·block mod K): a cycle of K / gcd(K, block) blocks.
                // k < block here, so both fit a usize.
                #[allow(clippy::cast_possible_truncation)]
                let cycle = (lcm(block, k as usize) / block) as u64;
                let mut sum_cycle = Counts::default();
                let mut sum_rest = Counts::default();
                let rest = full % cycle;
                for b in 0..cycle.min(full) {
                    let c = block_counts(p, block, offsets(b * l, block));
                    sum_cycle += c;
                    if b < rest {
                        sum_rest += c;
                    }
                }
                total += sum_cycle.times(full / cycle);
                total += sum_rest;
            }
            total += block_counts(p, tail, offsets(full * l, tail));
            n.div_ceil(k)
        }
        Pattern::Random => 0,
    };
    Ok((total, touched))
}

/// The costs a pass turns into time.
#[derive(Debug, Clone, Copy)]
pub struct MmuCosts {
    pub(crate) stage2_fault: f64,
    pub(crate) host_fault: f64,
    pub(crate) host_fault_huge: f64,
    pub(crate) prefetch_page: f64,
    pub(crate) touch_page: f64,
    pub(crate) uffd_fault: f64,
    pub(crate) uffd_copy_page: f64,
    /// The host's own MMU.
    pub mmu: MmuKind,
}

impl MmuCosts {
    /// Reads the costs.
    pub fn from_profile(p: &Profile) -> Result<MmuCosts, ProfileError> {
        let g = |k| p.get(k, "mmu");
        Ok(MmuCosts {
            stage2_fault: g("stage2_fault_ns")?,
            host_fault: g("host_fault_ns")?,
            host_fault_huge: g("host_fault_huge_ns")?,
            prefetch_page: g("prefetch_page_ns")?,
            touch_page: g("touch_page_ns")?,
            uffd_fault: g("uffd_fault_ns")?,
            uffd_copy_page: g("uffd_copy_page_ns")?,
            mmu: p.mmu,
        })
    }
}

/// The prefetch loop a plan runs: the variant's, or the host MMU's own (shadow paging with
/// 4 KiB guest pages: none, since the neighbours' guest PTEs are not Accessed).
pub fn prefetch_for(plan: &TouchPlan, mmu: MmuKind) -> PrefetchLoop {
    plan.prefetch.unwrap_or(match (mmu, plan.guest_page) {
        (MmuKind::TdpMmu, _) | (MmuKind::Shadow, GuestPage::Small) => PrefetchLoop::None,
        _ => PrefetchLoop::Legacy,
    })
}

/// Runs one pass of the plan.
pub fn touch(costs: &MmuCosts, plan: &TouchPlan) -> Result<TouchResult, PassError> {
    let (c, touched) = pass(&Pass {
        pages: plan.size_bytes / 4096,
        pattern: plan.pattern,
        seed: plan.seed,
        host: plan.backing,
        prefetch: prefetch_for(plan, costs.mmu),
        guest_huge: plan.guest_page == GuestPage::Huge,
        prefetch_num: PTE_PREFETCH_NUM,
    })?;
    let per_touch = match plan.touch {
        Touch::FirstByte => costs.touch_page,
        Touch::WholePage => costs.touch_page * 64.0,
    };
    let ns = c.faults as f64 * costs.stage2_fault
        + c.host_faults as f64 * costs.host_fault
        + c.host_huge_faults as f64 * costs.host_fault_huge
        + c.prefetched as f64 * costs.prefetch_page
        + c.uffd_faults as f64 * costs.uffd_fault
        + c.uffd_pages as f64 * costs.uffd_copy_page
        + touched as f64 * per_touch;
    let uffd = matches!(
        plan.backing,
        HostBacking::Uffd(_) | HostBacking::UffdMinor(_) | HostBacking::UffdMinorHugetlb
    );
    let count = |n: u64| i128::from(n);
    Ok(TouchResult {
        pages: touched,
        // The model's time is a sum of non-negative costs.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        elapsed_ns: ns.round() as u64,
        uffd_faults: uffd.then_some(c.uffd_faults),
        // The model keeps no guest page tables: it is the data region's stage 2 alone.
        guest_table_pages: None,
        vcpu_ns: Vec::new(),
        hugetlb_pool: None,
        kvm_stats: vec![
            ("faults".into(), "count".into(), count(c.faults)),
            ("prefetched".into(), "count".into(), count(c.prefetched)),
            // The statistic KVM would report for the same pass, for `validate`.
            ("kvm.vcpu.pf_fixed".into(), "count".into(), count(c.faults)),
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pass(
        pages: usize,
        host: HostBacking,
        lp: PrefetchLoop,
        order: impl Iterator<Item = usize>,
    ) -> Counts {
        let mut m = Mmu::new(pages, host, lp, false);
        for g in order {
            m.access(g);
        }
        m.counts
    }

    const POP: HostBacking = HostBacking::Anonymous(Backing::Populated);
    const LAZY: HostBacking = HostBacking::Anonymous(Backing::Lazy);

    #[test]
    fn the_fixed_loop_prefetches_each_block_on_its_first_fault() {
        let c = pass(64, POP, PrefetchLoop::Legacy, 0..64);
        assert_eq!((c.faults, c.prefetched), (8, 56));
    }

    #[test]
    fn the_old_loop_drops_the_trailing_run_so_a_first_touch_prefetches_nothing() {
        let c = pass(64, POP, PrefetchLoop::LegacySkipTrailing, 0..64);
        assert_eq!((c.faults, c.prefetched), (64, 0));
        // In reverse the faulting SPTE ends the run before it, which the old loop did flush.
        let c = pass(64, POP, PrefetchLoop::LegacySkipTrailing, (0..64).rev());
        assert_eq!((c.faults, c.prefetched), (8, 56));
    }

    #[test]
    fn a_larger_prefetch_block_maps_more_per_fault() {
        // PTE_PREFETCH_NUM 16: a first touch of 64 populated pages faults once per 16.
        let mut m = Mmu::new(64, POP, PrefetchLoop::Legacy, false).with_prefetch_num(16);
        for g in 0..64 {
            m.access(g);
        }
        assert_eq!((m.counts.faults, m.counts.prefetched), (4, 60));
        // Not a power of two: the kernel's mask needs one, the model takes the block below.
        assert_eq!(prefetch_block(12), 8);
        assert_eq!(prefetch_block(4096), PTE_PREFETCH_NUM_MAX);
    }

    #[test]
    fn prefetch_never_faults_a_host_page_in() {
        let c = pass(64, LAZY, PrefetchLoop::Legacy, 0..64);
        assert_eq!((c.faults, c.prefetched, c.host_faults), (64, 0, 64));
    }

    #[test]
    fn userfaultfd_windows_make_neighbours_present_for_prefetch() {
        let c = pass(64, HostBacking::Uffd(8), PrefetchLoop::Legacy, 0..64);
        assert_eq!(
            (c.faults, c.uffd_faults, c.uffd_pages, c.prefetched),
            (8, 8, 64, 56)
        );
        let c = pass(64, HostBacking::Uffd(1), PrefetchLoop::Legacy, 0..64);
        assert_eq!((c.faults, c.uffd_faults), (64, 64));
    }

    #[test]
    fn a_minor_fault_on_hugetlbfs_serves_and_maps_a_whole_huge_page() {
        let mut m = Mmu::new(
            2048,
            HostBacking::UffdMinorHugetlb,
            PrefetchLoop::None,
            true,
        );
        for g in 0..2048 {
            m.access(g);
        }
        let c = m.counts;
        // 8 MiB: four huge pages, one fault, one CONTINUE and one 2 MiB SPTE each.
        assert_eq!(
            (c.faults, c.uffd_faults, c.uffd_pages, c.huge_mappings),
            (4, 4, 2048, 4)
        );
    }

    use proptest::prelude::*;

    fn loop_of(i: u8) -> PrefetchLoop {
        [
            PrefetchLoop::None,
            PrefetchLoop::LegacySkipTrailing,
            PrefetchLoop::Legacy,
        ][usize::from(i % 3)]
    }

    proptest! {
        /// Whatever the order, the host presence and the loop: every page ends up mapped by
        /// exactly one fault or one prefetch, and no SPTE points at a page the host lacks.
        #[test]
        fn faults_plus_prefetches_cover_every_page_and_prefetch_never_maps_absent_memory(
            order in Just((0..256usize).collect::<Vec<_>>()).prop_shuffle(),
            present in proptest::collection::vec(any::<bool>(), 256),
            lp in 0u8..3,
        ) {
            let mut m = Mmu::new(256, LAZY, loop_of(lp), false);
            m.host.copy_from_slice(&present);
            for g in &order {
                m.access(*g);
            }
            prop_assert_eq!(m.counts.faults + m.counts.prefetched, 256);
            for g in 0..256 {
                prop_assert!(m.mapped(g) && m.host_present(g), "gfn {} mapped without its host page", g);
            }
            // Prefetch never faulted anything in: host faults are exactly the absent pages
            // that faulted.
            prop_assert_eq!(m.counts.host_faults, present.iter().filter(|p| !**p).count() as u64);
        }

        /// The fixed loop never prefetches less than the old one on the same pass.
        #[test]
        fn the_fix_never_loses_prefetches(order in Just((0..128usize).collect::<Vec<_>>()).prop_shuffle()) {
            let old = pass(128, POP, PrefetchLoop::LegacySkipTrailing, order.iter().copied());
            let new = pass(128, POP, PrefetchLoop::Legacy, order.iter().copied());
            prop_assert!(new.faults <= old.faults);
        }
    }

    /// The per-page pass over the whole memslot, as `touch` ran it before blocks: the oracle.
    fn per_page(p: &Pass) -> (Counts, u64) {
        let plan = TouchPlan {
            size_bytes: p.pages * 4096,
            pattern: p.pattern,
            seed: p.seed,
            access: hvlab_core::memory::Access::Write,
            touch: Touch::FirstByte,
            guest_page: if p.guest_huge {
                GuestPage::Huge
            } else {
                GuestPage::Small
            },
            backing: p.host,
            cpl: None,
            timeout: std::time::Duration::from_secs(1),
            prefetch: Some(p.prefetch),
            vcpus: 1,
        };
        let order = plan.page_order();
        #[allow(clippy::cast_possible_truncation)] // test sizes are small
        let mut m = Mmu::new(p.pages as usize, p.host, p.prefetch, p.guest_huge)
            .with_prefetch_num(p.prefetch_num);
        for g in &order {
            m.access(*g as usize);
        }
        (m.counts, order.len() as u64)
    }

    fn host_of(i: u8, window: usize) -> HostBacking {
        match i % 5 {
            0 => POP,
            1 => LAZY,
            2 => HostBacking::Anonymous(Backing::Thp),
            3 => HostBacking::PreFault,
            _ => HostBacking::Uffd(window),
        }
    }

    fn pattern_of(i: u8, k: u32) -> Pattern {
        match i % 4 {
            0 => Pattern::Seq,
            1 => Pattern::Reverse,
            2 => Pattern::Random,
            _ => Pattern::Stride(k),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Blocks give the per-page counts exactly, whatever the size (tails included), order,
        /// backing, userfaultfd window, guest page and loop.
        #[test]
        fn blocks_count_exactly_what_the_per_page_pass_counts(
            pages in 1u64..6000,
            pat in 0u8..4,
            k in prop_oneof![1u32..20, 1u32..5000],
            host in 0u8..5,
            window in 1usize..=512,
            lp in 0u8..3,
            guest_huge in any::<bool>(),
            seed in any::<u64>(),
            prefetch_num in prop_oneof![Just(8usize), Just(1), Just(16), Just(512)],
        ) {
            let p = Pass {
                pages,
                pattern: pattern_of(pat, k),
                seed,
                host: host_of(host, window),
                prefetch: loop_of(lp),
                guest_huge,
                prefetch_num,
            };
            prop_assert_eq!(super::pass(&p), Ok(per_page(&p)), "{:?}", p);
        }
    }

    #[test]
    fn blocks_match_the_per_page_pass_at_gibibytes() {
        // Many full blocks and stride cycles, not just the shapes proptest's sizes reach.
        for host in [
            POP,
            LAZY,
            HostBacking::Anonymous(Backing::Thp),
            HostBacking::Uffd(7),
        ] {
            for pattern in [
                Pattern::Seq,
                Pattern::Reverse,
                Pattern::Stride(3),
                Pattern::Stride(4096),
            ] {
                for lp in 0..3 {
                    let p = Pass {
                        pages: (2 << 30) / 4096 + 13,
                        pattern,
                        seed: 1,
                        host,
                        prefetch: loop_of(lp),
                        guest_huge: true,
                        prefetch_num: PTE_PREFETCH_NUM,
                    };
                    assert_eq!(super::pass(&p), Ok(per_page(&p)), "{p:?}");
                }
            }
        }
    }

    #[test]
    fn a_tebibyte_first_touch_counts_one_fault_per_prefetch_block() {
        let p = Pass {
            pages: (1 << 40) / 4096,
            pattern: Pattern::Seq,
            seed: 1,
            host: POP,
            prefetch: PrefetchLoop::Legacy,
            guest_huge: false,
            prefetch_num: PTE_PREFETCH_NUM,
        };
        let (c, touched) = super::pass(&p).expect("ordered passes have no cap");
        assert_eq!(touched, 1 << 28);
        assert_eq!((c.faults, c.prefetched), (1 << 25, 7 << 25));
        let random = Pass {
            pattern: Pattern::Random,
            ..p
        };
        assert_eq!(
            super::pass(&random),
            Err(PassError::RandomTooLarge(1 << 28))
        );
    }

    #[test]
    fn huge_host_and_guest_pages_map_2mib_per_fault() {
        let mut m = Mmu::new(
            2048,
            HostBacking::Anonymous(Backing::Thp),
            PrefetchLoop::Legacy,
            true,
        );
        for g in 0..2048 {
            m.access(g);
        }
        assert_eq!(
            (
                m.counts.faults,
                m.counts.huge_mappings,
                m.counts.host_huge_faults
            ),
            (4, 4, 4)
        );
    }
}
