//! Dirty logging: the write-protect / collect / re-protect cycle of a logged memslot, as an
//! algorithm over SPTEs, the slot's dirty bitmap and a vCPU's dirty ring. Counts are exact;
//! the profile turns them into time.
//!
//! What is mirrored (virt/kvm/kvm_main.c, virt/kvm/dirty_ring.c, arch/x86/kvm/mmu/mmu.c):
//! - enabling logging on a slot write-protects every present SPTE of it
//!   (`kvm_mmu_slot_apply_flags()` → `kvm_mmu_slot_remove_write_access()`);
//! - a guest write to a write-protected SPTE faults; KVM makes the SPTE writable again and
//!   records the page (`mark_page_dirty_in_slot()`): a bit in the slot's bitmap, or an entry
//!   pushed on the vCPU's ring (`kvm_dirty_ring_push()`), which asks the vCPU to exit with
//!   `KVM_EXIT_DIRTY_RING_FULL` once the ring holds its soft limit;
//! - `KVM_GET_DIRTY_LOG` (`kvm_get_dirty_log_protect()`): without manual protect, each non-zero
//!   64-page word of the bitmap is exchanged with zero and its pages write-protected
//!   (`kvm_arch_mmu_enable_log_dirty_pt_masked()`); with manual protect the bitmap is only
//!   copied;
//! - `KVM_CLEAR_DIRTY_LOG` (`kvm_clear_dirty_log_protect()`): for each word of the chunk the
//!   VMM's mask is fetched-and-cleared from the bitmap and the pages it had set re-protected;
//! - `KVM_RESET_DIRTY_RINGS` (`kvm_dirty_ring_reset()`): harvested entries are consumed in
//!   order, runs of the same slot within 64 pages coalesced into one mask, each mask
//!   re-protected with `kvm_arch_mmu_enable_log_dirty_pt_masked()`.

use crate::backend::dirty::{
    BITMAP_WORD_PAGES, DirtyPass, DirtyPlan, DirtyResult, LogMode, RING_RSVD_ENTRIES,
};

use super::profile::{Profile, ProfileError};

/// What each step costs, from the profile.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DirtyCosts {
    /// A guest write that hits a write-protected SPTE: the fault, the SPTE made writable,
    /// the page recorded, and back (`dirty_wp_fault_ns`).
    pub wp_fault_ns: f64,
    /// A guest write that does not fault (`touch_page_ns`).
    pub touch_ns: f64,
    /// One 64-page bitmap word scanned, exchanged or copied (`dirty_bitmap_word_ns`).
    pub word_ns: f64,
    /// One SPTE write-protected again through the rmap (`dirty_protect_page_ns`).
    pub protect_ns: f64,
    /// One collection ioctl's fixed part: the call, `slots_lock`, the remote TLB flush
    /// (`dirty_ioctl_ns`).
    pub ioctl_ns: f64,
    /// The VMM reading one ring entry and marking it harvested (`dirty_ring_harvest_ns`).
    pub harvest_ns: f64,
    /// `kvm_dirty_ring_reset()` consuming one entry, before the protection
    /// (`dirty_ring_reset_ns`).
    pub reset_ns: f64,
    /// One exit to the VMM and back (`exit_userspace_ns`): a `KVM_EXIT_DIRTY_RING_FULL`.
    pub exit_ns: f64,
}

impl DirtyCosts {
    /// Reads the costs.
    pub fn from_profile(p: &Profile) -> Result<DirtyCosts, ProfileError> {
        let g = |k| p.get(k, "dirty");
        Ok(DirtyCosts {
            wp_fault_ns: g("dirty_wp_fault_ns")?,
            touch_ns: g("touch_page_ns")?,
            word_ns: g("dirty_bitmap_word_ns")?,
            protect_ns: g("dirty_protect_page_ns")?,
            ioctl_ns: g("dirty_ioctl_ns")?,
            harvest_ns: g("dirty_ring_harvest_ns")?,
            reset_ns: g("dirty_ring_reset_ns")?,
            exit_ns: g("exit_userspace_ns")?,
        })
    }
}

/// One `struct kvm_dirty_gfn` as the model keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    offset: u64,
    harvested: bool,
}

/// A vCPU's dirty ring: free-running indices, as `struct kvm_dirty_ring` keeps them.
#[derive(Debug)]
struct DirtyRing {
    entries: Vec<Option<Entry>>,
    dirty_index: u64,
    reset_index: u64,
    soft_limit: u64,
    /// Where the VMM harvests next.
    fetch_index: u64,
}

impl DirtyRing {
    fn new(size: u64) -> DirtyRing {
        DirtyRing {
            entries: vec![None; usize::try_from(size).unwrap_or(0)],
            dirty_index: 0,
            reset_index: 0,
            soft_limit: size.saturating_sub(RING_RSVD_ENTRIES),
            fetch_index: 0,
        }
    }

    fn slot(&self, index: u64) -> usize {
        usize::try_from(index % self.entries.len().max(1) as u64).unwrap_or(0)
    }

    /// `kvm_dirty_ring_push()`: publishes the page; true when the ring reached its soft limit
    /// (`kvm_dirty_ring_soft_full()`), so the vCPU exits before its next guest instruction.
    fn push(&mut self, offset: u64) -> bool {
        let at = self.slot(self.dirty_index);
        self.entries[at] = Some(Entry {
            offset,
            harvested: false,
        });
        self.dirty_index += 1;
        self.dirty_index - self.reset_index >= self.soft_limit
    }

    /// The VMM's harvest: every published entry in order, marked for reset; their pages.
    fn harvest(&mut self) -> Vec<u64> {
        let mut pages = Vec::new();
        while self.fetch_index < self.dirty_index {
            let at = self.slot(self.fetch_index);
            if let Some(e) = self.entries[at].as_mut() {
                e.harvested = true;
                pages.push(e.offset);
            }
            self.fetch_index += 1;
        }
        pages
    }

    /// `kvm_dirty_ring_reset()`: consumes harvested entries in order, coalescing a run of
    /// offsets within one 64-page window into one mask, and re-protects each mask. Returns
    /// (entries reset, SPTEs protected).
    fn reset(&mut self, spte: &mut Spte) -> (u64, u64) {
        let (mut n, mut protected) = (0, 0);
        let mut mask: Option<(u64, u64)> = None; // (base offset, bits)
        while self.reset_index < self.dirty_index {
            let at = self.slot(self.reset_index);
            let Some(e) = self.entries[at].filter(|e| e.harvested) else {
                break;
            };
            self.entries[at] = None;
            self.reset_index += 1;
            n += 1;
            mask = match mask {
                Some((base, bits)) if e.offset >= base && e.offset - base < BITMAP_WORD_PAGES => {
                    Some((base, bits | 1 << (e.offset - base)))
                }
                Some((base, bits)) if e.offset < base && base - e.offset < BITMAP_WORD_PAGES => {
                    // The kernel re-bases the mask downwards when the run goes back.
                    let shift = base - e.offset;
                    if bits.leading_zeros() as u64 >= shift {
                        Some((e.offset, (bits << shift) | 1))
                    } else {
                        protected += spte.enable_log_dirty_pt_masked(base, bits);
                        Some((e.offset, 1))
                    }
                }
                Some((base, bits)) => {
                    protected += spte.enable_log_dirty_pt_masked(base, bits);
                    Some((e.offset, 1))
                }
                None => Some((e.offset, 1)),
            };
        }
        if let Some((base, bits)) = mask {
            protected += spte.enable_log_dirty_pt_masked(base, bits);
        }
        (n, protected)
    }
}

/// The logged slot's leaf SPTEs: present, and writable.
#[derive(Debug)]
struct Spte {
    present: Vec<bool>,
    writable: Vec<bool>,
}

impl Spte {
    /// `kvm_arch_mmu_enable_log_dirty_pt_masked()` → `kvm_mmu_write_protect_pt_masked()`:
    /// write-protects the present SPTEs of the set bits of `mask` from page `base`; returns
    /// how many it changed.
    fn enable_log_dirty_pt_masked(&mut self, base: u64, mask: u64) -> u64 {
        let mut n = 0;
        for bit in 0..BITMAP_WORD_PAGES {
            if mask & (1 << bit) == 0 {
                continue;
            }
            let Ok(i) = usize::try_from(base + bit) else {
                continue;
            };
            if let (Some(true), Some(w)) = (self.present.get(i), self.writable.get_mut(i))
                && *w
            {
                *w = false;
                n += 1;
            }
        }
        n
    }
}

/// Events of one pass, counted.
#[derive(Debug, Default)]
struct Counts {
    wp_faults: u64,
    plain_writes: u64,
    ring_full_exits: u64,
    words: u64,
    protected: u64,
    ioctls: u64,
    get_words: u64,
    get_protected: u64,
    get_ioctls: u64,
    harvested: u64,
    reset_entries: u64,
    reset_protected: u64,
    reset_ioctls: u64,
}

/// The slot, its bitmap and (in ring mode) the vCPU's ring.
struct Slot {
    spte: Spte,
    bitmap: Vec<u64>,
    ring: Option<DirtyRing>,
    /// Pages the VMM learned were dirty this pass (ring mode harvests mid-pass).
    seen: Vec<bool>,
}

impl Slot {
    /// A fresh logged slot: nothing mapped, so `kvm_mmu_slot_remove_write_access()` at
    /// enable time protects nothing.
    fn new(plan: &DirtyPlan) -> Slot {
        let pages = usize::try_from(plan.pages()).unwrap_or(0);
        Slot {
            spte: Spte {
                present: vec![false; pages],
                writable: vec![false; pages],
            },
            bitmap: vec![0; pages.div_ceil(64)],
            ring: plan.ring_soft_limit().map(|_| match plan.mode {
                LogMode::Ring { entries } => DirtyRing::new(entries),
                _ => DirtyRing::new(0),
            }),
            seen: vec![false; pages],
        }
    }

    /// `mark_page_dirty_in_slot()`: the ring or the bitmap. True when the ring asks the vCPU
    /// to exit.
    fn mark_dirty(&mut self, page: u64) -> bool {
        match self.ring.as_mut() {
            Some(ring) => ring.push(page),
            None => {
                if let Some(w) = usize::try_from(page / 64)
                    .ok()
                    .and_then(|w| self.bitmap.get_mut(w))
                {
                    *w |= 1 << (page % 64);
                }
                false
            }
        }
    }

    /// A guest write to `page`.
    fn write(&mut self, page: u64, c: &mut Counts) {
        let Ok(i) = usize::try_from(page) else { return };
        if self.spte.writable.get(i) == Some(&true) {
            c.plain_writes += 1;
            return;
        }
        // A missing or write-protected SPTE: the fault maps it writable and logs the page.
        if self.spte.present.get(i) == Some(&true) {
            c.wp_faults += 1;
        }
        self.spte.present[i] = true;
        self.spte.writable[i] = true;
        if self.mark_dirty(page) {
            // KVM_EXIT_DIRTY_RING_FULL is raised on the way back into the guest, before the
            // faulting write retires (`kvm_dirty_ring_check_request()` in
            // `vcpu_enter_guest()`): the VMM harvests and resets, which write-protects this
            // page again, and the retried write faults a second time and is pushed again.
            c.ring_full_exits += 1;
            self.harvest_and_reset(c);
            c.wp_faults += 1;
            self.spte.writable[i] = true;
            self.mark_dirty(page);
        }
    }

    fn harvest_and_reset(&mut self, c: &mut Counts) {
        let Some(ring) = self.ring.as_mut() else {
            return;
        };
        for page in ring.harvest() {
            if let Some(s) = usize::try_from(page)
                .ok()
                .and_then(|p| self.seen.get_mut(p))
            {
                *s = true;
            }
            c.harvested += 1;
        }
        let (n, protected) = ring.reset(&mut self.spte);
        c.reset_entries += n;
        c.reset_protected += protected;
        c.reset_ioctls += 1;
    }

    /// `kvm_get_dirty_log_protect()`: the bitmap as the VMM receives it. Without manual
    /// protect each non-zero word is exchanged with zero and its pages re-protected; with it,
    /// the bitmap is copied as it is.
    fn get_dirty_log(&mut self, manual: bool, c: &mut Counts) -> Vec<u64> {
        c.get_ioctls += 1;
        c.get_words += self.bitmap.len() as u64;
        if manual {
            return self.bitmap.clone();
        }
        let mut out = vec![0; self.bitmap.len()];
        for (i, word) in self.bitmap.iter_mut().enumerate() {
            if *word == 0 {
                continue;
            }
            let mask = std::mem::take(word);
            out[i] = mask;
            c.get_protected += self.spte.enable_log_dirty_pt_masked(i as u64 * 64, mask);
        }
        out
    }

    /// `kvm_clear_dirty_log_protect()` over `num` pages from `first` (64-aligned) with the
    /// VMM's bitmap `user` (indexed from page 0).
    fn clear_dirty_log(&mut self, first: u64, num: u64, user: &[u64], c: &mut Counts) {
        c.ioctls += 1;
        let (lo, hi) = (first / 64, (first + num).div_ceil(64));
        for w in lo..hi {
            let Ok(i) = usize::try_from(w) else { continue };
            c.words += 1;
            let mask = user.get(i).copied().unwrap_or(0);
            if mask == 0 {
                continue;
            }
            let Some(word) = self.bitmap.get_mut(i) else {
                continue;
            };
            let had = *word & mask;
            *word &= !mask;
            if had != 0 {
                c.protected += self.spte.enable_log_dirty_pt_masked(w * 64, had);
            }
        }
    }

    /// The VMM's collection after a pass; returns the pages it found dirty.
    fn collect(&mut self, plan: &DirtyPlan, c: &mut Counts) -> u64 {
        match plan.mode {
            LogMode::Bitmap => popcount(&self.get_dirty_log(false, c)),
            LogMode::Clear { chunk_pages } => {
                let got = self.get_dirty_log(true, c);
                let mut first = 0;
                while first < plan.pages() {
                    let num = chunk_pages.max(64).min(plan.pages() - first);
                    self.clear_dirty_log(first, num, &got, c);
                    first += num;
                }
                popcount(&got)
            }
            LogMode::Ring { .. } => {
                self.harvest_and_reset(c);
                let found = self.seen.iter().filter(|s| **s).count() as u64;
                self.seen.fill(false);
                found
            }
        }
    }
}

fn popcount(bitmap: &[u64]) -> u64 {
    bitmap.iter().map(|w| u64::from(w.count_ones())).sum()
}

fn ns(v: f64) -> u64 {
    // Model times are non-negative and far below 2^64 ns.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    {
        v.max(0.0).round() as u64
    }
}

/// `KVM_DIRTY_RING_MAX_ENTRIES` (include/linux/kvm_dirty_ring.h): the largest ring any kernel
/// takes, what `KVM_CAP_DIRTY_LOG_RING` reports (× 16 bytes) where the ring exists.
pub const RING_MAX_ENTRIES: u64 = 65536;

/// Refuses what the modelled kernel would refuse, in words naming its limit.
pub fn admit(plan: &DirtyPlan) -> Result<(), String> {
    match plan.mode {
        LogMode::Ring { entries } if entries > RING_MAX_ENTRIES => Err(format!(
            "a ring of {entries} entries exceeds the kernel's KVM_DIRTY_RING_MAX_ENTRIES ({RING_MAX_ENTRIES} entries, 1 MiB); choose ring <= {RING_MAX_ENTRIES}"
        )),
        _ => Ok(()),
    }
}

/// Runs the plan: one pass that maps every written page (collected, not reported), then
/// `plan.passes` measured passes, each followed by the collection.
pub fn run(costs: &DirtyCosts, plan: &DirtyPlan) -> DirtyResult {
    let mut slot = Slot::new(plan);
    let stride = u64::from(plan.stride.max(1));
    let mut passes = Vec::with_capacity(plan.passes as usize);
    for index in 0..=plan.passes {
        let mut c = Counts::default();
        let mut written = 0;
        let mut page = 0;
        while page < plan.pages() {
            slot.write(page, &mut c);
            written += 1;
            page += stride;
        }
        // Mid-pass ring resets count as collection work, as the kvm backend times them.
        let found = slot.collect(plan, &mut c);
        if index == 0 {
            continue;
        }
        let wp = c.wp_faults;
        passes.push(DirtyPass {
            written,
            found,
            dirty_ns: ns(wp as f64 * costs.wp_fault_ns
                + c.plain_writes as f64 * costs.touch_ns
                + c.ring_full_exits as f64 * costs.exit_ns),
            get_ns: ns(c.get_ioctls as f64 * costs.ioctl_ns
                + c.get_words as f64 * costs.word_ns
                + c.get_protected as f64 * costs.protect_ns),
            clear_ns: ns(c.ioctls as f64 * costs.ioctl_ns
                + c.words as f64 * costs.word_ns
                + c.protected as f64 * costs.protect_ns),
            harvest_ns: ns(c.harvested as f64 * costs.harvest_ns),
            reset_ns: ns(c.reset_ioctls as f64 * costs.ioctl_ns
                + c.reset_entries as f64 * costs.reset_ns
                + c.reset_protected as f64 * costs.protect_ns),
            ioctls: c.get_ioctls + c.ioctls + c.reset_ioctls,
            ring_full_exits: c.ring_full_exits,
            wp_faults: Some(wp),
            kvm_stats: Vec::new(),
        });
    }
    DirtyResult { passes }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn costs() -> DirtyCosts {
        DirtyCosts {
            wp_fault_ns: 1000.0,
            touch_ns: 1.0,
            word_ns: 2.0,
            protect_ns: 30.0,
            ioctl_ns: 5000.0,
            harvest_ns: 3.0,
            reset_ns: 4.0,
            exit_ns: 10_000.0,
        }
    }

    fn plan(mode: LogMode, stride: u32) -> DirtyPlan {
        DirtyPlan {
            size_bytes: 64 << 20,
            passes: 3,
            stride,
            mode,
            cpl: None,
            timeout: Duration::from_secs(1),
        }
    }

    const MODES: [LogMode; 3] = [
        LogMode::Bitmap,
        LogMode::Clear { chunk_pages: 4096 },
        LogMode::Ring { entries: 4096 },
    ];

    #[test]
    fn every_mode_finds_exactly_the_pages_a_pass_wrote_and_faults_once_on_each_but_the_ring_filler()
    {
        for mode in MODES {
            for stride in [1, 3, 64, 1000] {
                let p = plan(mode, stride);
                let out = run(&costs(), &p);
                assert_eq!(out.passes.len(), 3);
                for pass in &out.passes {
                    assert_eq!(pass.written, p.written_per_pass(), "{mode:?} {stride}");
                    assert_eq!(pass.found, pass.written, "{mode:?} {stride}");
                    // The write that fills the ring is retried after the reset: it faults twice.
                    assert_eq!(
                        pass.wp_faults,
                        Some(pass.written + pass.ring_full_exits),
                        "{mode:?} {stride}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_ring_exits_each_time_it_reaches_its_soft_limit() {
        // 16384 pages, soft limit 4096 - 64 = 4032: four exits, the ring emptied each time.
        let out = run(&costs(), &plan(LogMode::Ring { entries: 4096 }, 1));
        assert_eq!(out.passes[0].ring_full_exits, 16384 / 4032);
        // One reset per exit and one after the pass.
        assert_eq!(out.passes[0].ioctls, 16384 / 4032 + 1);
        let big = run(&costs(), &plan(LogMode::Ring { entries: 65536 }, 1));
        assert_eq!(big.passes[0].ring_full_exits, 0);
    }

    #[test]
    fn clear_mode_issues_one_clear_per_chunk_and_copies_without_protecting() {
        let out = run(&costs(), &plan(LogMode::Clear { chunk_pages: 1024 }, 1));
        // 1 get + 16384 / 1024 clears.
        assert_eq!(out.passes[0].ioctls, 17);
        // The get scanned 256 words and protected nothing: its time is the words alone.
        assert_eq!(out.passes[0].get_ns, 5000 + 256 * 2);
        assert_eq!(out.passes[0].clear_ns, 16 * 5000 + 256 * 2 + 16384 * 30);
    }

    #[test]
    fn the_bitmap_get_protects_what_it_hands_over() {
        let out = run(&costs(), &plan(LogMode::Bitmap, 64));
        // 256 pages written, one per word: 256 protections in the get.
        assert_eq!(out.passes[0].get_ns, 5000 + 256 * 2 + 256 * 30);
        assert_eq!(out.passes[0].dirty_ns, 256 * 1000);
    }

    #[test]
    fn a_ring_reset_coalesces_runs_into_masks_and_protects_each_page_once() {
        let mut spte = Spte {
            present: vec![true; 256],
            writable: vec![true; 256],
        };
        let mut ring = DirtyRing::new(256);
        for page in [5, 6, 7, 70, 3, 200] {
            ring.push(page);
        }
        assert_eq!(ring.harvest(), vec![5, 6, 7, 70, 3, 200]);
        assert_eq!(ring.reset(&mut spte), (6, 6));
        assert!(!spte.writable[3] && !spte.writable[200] && spte.writable[4]);
        // Nothing left to reset, nothing protected twice.
        assert_eq!(ring.reset(&mut spte), (0, 0));
    }
}
