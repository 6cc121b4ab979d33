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
//!
//! With several vCPUs (`plan.vcpus`), each writes its own slice and pushes on its own ring;
//! their write-protect faults meet at `kvm->mmu_lock`. With shadow paging the fault is
//! `FNAME(page_fault)` (paging_tmpl.h), which makes the SPTE writable in `FNAME(fetch)` under
//! `write_lock(&vcpu->kvm->mmu_lock)`: the lock is held `mmu_lock_hold_ns` of the fault,
//! exclusively, as in [`crate::mmu_lock`] for a first touch. With EPT/NPT the direct paths
//! try `fast_page_fault()` first, which makes an MMU-writable SPTE writable with a cmpxchg
//! and no lock (`fast_pf_fix_direct_spte()`), so their faults never wait for each other. A
//! ring reset re-protects under the lock too (`kvm_reset_dirty_gfn()` takes
//! `KVM_MMU_LOCK()` around each mask). The vCPU threads share the host's CPUs as
//! [`crate::mmu_lock::simulate`] schedules them.

use hvlab_core::dirty::{
    BITMAP_WORD_PAGES, DirtyPass, DirtyPlan, DirtyResult, LogMode, RING_RSVD_ENTRIES,
};

use super::mmu_lock::{Machine, ParallelCosts, Segment, simulate};
use super::profile::{MmuKind, Profile, ProfileError};

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
    /// ns of a write-protect fault spent holding `mmu_lock` exclusively: `mmu_lock_hold_ns`
    /// with shadow paging, 0 where `fast_page_fault()` fixes the SPTE without the lock (TDP).
    /// Read only for several vCPUs.
    pub lock_hold_ns: f64,
    /// The host CPUs the vCPU threads share (`host_cpus`); one for a single vCPU.
    pub machine: Machine,
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
            lock_hold_ns: 0.0,
            machine: Machine::with_cpus(1),
        })
    }

    /// The same costs with the contention inputs a many-vCPU pass reads (`mmu_lock_hold_ns`,
    /// `host_cpus`), for the profile's MMU.
    pub fn with_vcpus(self, p: &Profile) -> Result<DirtyCosts, ProfileError> {
        let par = ParallelCosts::from_profile(p)?;
        let hold = match p.mmu {
            MmuKind::Shadow => par.lock_hold.min(self.wp_fault_ns),
            MmuKind::Tdp | MmuKind::TdpMmu => 0.0,
        };
        Ok(DirtyCosts {
            lock_hold_ns: hold,
            machine: par.machine,
            ..self
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
#[derive(Debug, Default, Clone)]
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

/// The slot, its bitmap and (in ring mode) each vCPU's ring.
struct Slot {
    spte: Spte,
    bitmap: Vec<u64>,
    rings: Vec<DirtyRing>,
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
            rings: match plan.mode {
                LogMode::Ring { entries } => (0..plan.vcpus.max(1))
                    .map(|_| DirtyRing::new(entries))
                    .collect(),
                _ => Vec::new(),
            },
            seen: vec![false; pages],
        }
    }

    /// `mark_page_dirty_in_slot()`: the writing vCPU's ring, or the bitmap. True when the ring
    /// asks the vCPU to exit.
    fn mark_dirty(&mut self, vcpu: usize, page: u64) -> bool {
        match self.rings.get_mut(vcpu) {
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

    /// A guest write to `page` by `vcpu`.
    fn write(&mut self, vcpu: usize, page: u64, c: &mut Counts) {
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
        if self.mark_dirty(vcpu, page) {
            // KVM_EXIT_DIRTY_RING_FULL is raised on the way back into the guest, before the
            // faulting write retires (`kvm_dirty_ring_check_request()` in
            // `vcpu_enter_guest()`): the VMM harvests and resets, which write-protects this
            // page again, and the retried write faults a second time and is pushed again.
            c.ring_full_exits += 1;
            self.harvest_and_reset(Some(vcpu), c);
            c.wp_faults += 1;
            self.spte.writable[i] = true;
            self.mark_dirty(vcpu, page);
        }
    }

    /// The VMM harvests one vCPU's ring (a ring-full stop) or every ring (after the pass),
    /// then one `KVM_RESET_DIRTY_RINGS` resets the harvested entries of each.
    fn harvest_and_reset(&mut self, vcpu: Option<usize>, c: &mut Counts) {
        if self.rings.is_empty() {
            return;
        }
        for (i, ring) in self.rings.iter_mut().enumerate() {
            if vcpu.is_some_and(|v| v != i) {
                continue;
            }
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
        }
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
                self.harvest_and_reset(None, c);
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

/// Whether the profile's host logs dirty pages the way this model does: by write-protection.
/// With Intel PML (`dirty_log_pml`) `kvm_arch_mmu_enable_log_dirty_pt_masked()` clears dirty
/// bits instead (`kvm_mmu_clear_dirty_pt_masked()`, since `cpu_dirty_log_size` is set) and
/// the CPU records each first write in a 512-entry buffer, flushed on a PML-full exit or any
/// exit (`vmx_flush_pml_buffer()`): no write-protect fault at all, which this model does not
/// run.
pub fn admit_profile(p: &Profile) -> Result<(), String> {
    // Read through `get` when present, so the profile records the read as for any cost.
    let pml = p
        .costs
        .contains_key("dirty_log_pml")
        .then(|| p.get("dirty_log_pml", "dirty"))
        .transpose()
        .map_err(|e| e.to_string())?;
    match pml {
        Some(flag) if flag >= 0.5 => Err(format!(
            "profile {} describes a host that logs dirty pages with Intel PML (dirty_log_pml = 1: the CPU logs each first write, nothing is write-protected); the model mirrors write-protection (shadow paging, AMD NPT, arm64 stage 2), not PML: on this host run dirty with --backend kvm",
            p.name
        )),
        _ => Ok(()),
    }
}

/// Refuses what the modelled kernel would refuse, in words naming its limit.
pub fn admit(plan: &DirtyPlan) -> Result<(), String> {
    if let Some(why) = plan.backing.refusal() {
        return Err(why.to_string());
    }
    match plan.mode {
        LogMode::Ring { entries } if entries > RING_MAX_ENTRIES => Err(format!(
            "a ring of {entries} entries exceeds the kernel's KVM_DIRTY_RING_MAX_ENTRIES ({RING_MAX_ENTRIES} entries, 1 MiB); choose ring <= {RING_MAX_ENTRIES}"
        )),
        _ => Ok(()),
    }
}

/// One vCPU's pass as work on its thread: segments outside and inside `mmu_lock`, and the
/// ring-full stops' own time (excluded from its dirtying time, as the kvm backend does).
#[derive(Debug, Default)]
struct Lane {
    segments: Vec<Segment>,
    pending: f64,
    paused: f64,
}

impl Lane {
    fn push(&mut self, free: f64, locked: f64) {
        self.pending += free;
        if locked > 0.0 {
            self.segments.push(Segment {
                work_ns: self.pending,
                locked: false,
            });
            self.segments.push(Segment {
                work_ns: locked,
                locked: true,
            });
            self.pending = 0.0;
        }
    }

    fn finish(mut self) -> (Vec<Segment>, f64) {
        if self.pending > 0.0 {
            self.segments.push(Segment {
                work_ns: self.pending,
                locked: false,
            });
        }
        (self.segments, self.paused)
    }
}

/// The work of one write, from what it did to the counts (`d`: after less before): the
/// plain write, or the fault (its locked part held exclusively), and a ring-full stop with
/// its harvest and reset (the reset's re-protection under the lock).
fn lane_write(costs: &DirtyCosts, lane: &mut Lane, d: &Counts) {
    let hold = costs.lock_hold_ns;
    lane.push(d.plain_writes as f64 * costs.touch_ns, 0.0);
    if d.ring_full_exits == 0 {
        let f = d.wp_faults as f64;
        lane.push(f * (costs.wp_fault_ns - hold), f * hold);
        return;
    }
    // The fault, the exit, the VMM's harvest and reset, and the retried fault.
    lane.push(costs.wp_fault_ns - hold, hold);
    lane.push(d.ring_full_exits as f64 * costs.exit_ns, 0.0);
    let stop_free = d.harvested as f64 * costs.harvest_ns
        + d.reset_ioctls as f64 * costs.ioctl_ns
        + d.reset_entries as f64 * costs.reset_ns;
    let stop_locked = d.reset_protected as f64 * costs.protect_ns;
    lane.paused += stop_free + stop_locked;
    let stop_hold = if hold > 0.0 { stop_locked } else { 0.0 };
    lane.push(stop_free + stop_locked - stop_hold, stop_hold);
    let retried = d.wp_faults.saturating_sub(1) as f64;
    lane.push(retried * (costs.wp_fault_ns - hold), retried * hold);
}

fn minus(a: &Counts, b: &Counts) -> Counts {
    Counts {
        wp_faults: a.wp_faults - b.wp_faults,
        plain_writes: a.plain_writes - b.plain_writes,
        ring_full_exits: a.ring_full_exits - b.ring_full_exits,
        words: a.words - b.words,
        protected: a.protected - b.protected,
        ioctls: a.ioctls - b.ioctls,
        get_words: a.get_words - b.get_words,
        get_protected: a.get_protected - b.get_protected,
        get_ioctls: a.get_ioctls - b.get_ioctls,
        harvested: a.harvested - b.harvested,
        reset_entries: a.reset_entries - b.reset_entries,
        reset_protected: a.reset_protected - b.reset_protected,
        reset_ioctls: a.reset_ioctls - b.reset_ioctls,
    }
}

/// Runs the plan: one pass that maps every written page (collected, not reported), then
/// `plan.passes` measured passes, each followed by the collection. Each vCPU writes its
/// slice; with several, their passes run at once on the host's CPUs (`simulate`), and a
/// pass lasts until the slowest ends.
pub fn run(costs: &DirtyCosts, plan: &DirtyPlan) -> DirtyResult {
    let mut slot = Slot::new(plan);
    let vcpus = plan.vcpus.max(1);
    let mut passes = Vec::with_capacity(plan.passes as usize);
    for index in 0..=plan.passes {
        let mut c = Counts::default();
        let mut written = 0;
        let mut lanes: Vec<Lane> = Vec::with_capacity(vcpus as usize);
        // The slices are disjoint and each vCPU pushes on its own ring, so the counts do not
        // depend on how the vCPUs interleave: each runs its slice in turn here, and the
        // simulation puts them side by side in time.
        for v in 0..vcpus {
            let mut lane = Lane::default();
            for page in plan.vcpu_pages(v) {
                let before = c.clone();
                slot.write(v as usize, page, &mut c);
                lane_write(costs, &mut lane, &minus(&c, &before));
                written += 1;
            }
            lanes.push(lane);
        }
        let (work, paused): (Vec<Vec<Segment>>, Vec<f64>) =
            lanes.into_iter().map(Lane::finish).unzip();
        // Mid-pass ring resets count as collection work, as the kvm backend times them.
        let found = slot.collect(plan, &mut c);
        if index == 0 {
            continue;
        }
        let finish = simulate(&work, costs.machine);
        let vcpu_ns: Vec<u64> = finish.iter().zip(&paused).map(|(f, p)| ns(f - p)).collect();
        let wp = c.wp_faults;
        passes.push(DirtyPass {
            written,
            found,
            dirty_ns: vcpu_ns.iter().copied().max().unwrap_or(0),
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
            vcpu_ns: if vcpus > 1 { vcpu_ns } else { Vec::new() },
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
            lock_hold_ns: 0.0,
            machine: Machine::with_cpus(1),
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
            vcpus: 1,
            backing: hvlab_core::dirty::DirtyBacking::Anonymous,
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
    fn a_profile_of_a_pml_host_is_refused_and_the_others_admitted() {
        let pml = Profile::load("intel-spr-vmx").unwrap();
        let why = admit_profile(&pml).unwrap_err();
        assert!(
            why.contains("PML") && why.contains("--backend kvm"),
            "{why}"
        );
        // Inherited: the HZ=100 profile is intel-spr-vmx's host.
        assert!(admit_profile(&Profile::load("x86-vmx-hz100").unwrap()).is_err());
        for name in ["pvm-epyc", "neoverse-n2-spe", "arm64-server-160"] {
            assert_eq!(
                admit_profile(&Profile::load(name).unwrap()),
                Ok(()),
                "{name}"
            );
        }
        let mut off = pml;
        off.set("dirty_log_pml", 0.0, "bool", "kvm_intel.pml=N");
        assert_eq!(admit_profile(&off), Ok(()));
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

    fn with(vcpus: u32, mode: LogMode) -> DirtyPlan {
        DirtyPlan {
            vcpus,
            ..plan(mode, 1)
        }
    }

    fn contended(hold: f64, cpus: usize) -> DirtyCosts {
        DirtyCosts {
            lock_hold_ns: hold,
            machine: Machine::with_cpus(cpus),
            ..costs()
        }
    }

    #[test]
    fn with_many_vcpus_the_log_still_finds_exactly_the_pages_written_and_each_ring_fills_on_its_own()
     {
        for vcpus in [2, 8] {
            for mode in MODES {
                let p = with(vcpus, mode);
                let out = run(&contended(300.0, 2), &p);
                for pass in &out.passes {
                    assert_eq!(pass.written, 16384, "{vcpus} {mode:?}");
                    assert_eq!(pass.found, pass.written, "{vcpus} {mode:?}");
                    assert_eq!(
                        pass.wp_faults,
                        Some(pass.written + pass.ring_full_exits),
                        "{vcpus} {mode:?}"
                    );
                    assert_eq!(pass.vcpu_ns.len(), vcpus as usize);
                }
            }
        }
        // 16384 pages over 2 vCPUs: 8192 each against a soft limit of 4032, two exits each;
        // over 8, 2048 each: none.
        let two = run(&costs(), &with(2, LogMode::Ring { entries: 4096 }));
        assert_eq!(two.passes[0].ring_full_exits, 4);
        let eight = run(&costs(), &with(8, LogMode::Ring { entries: 4096 }));
        assert_eq!(eight.passes[0].ring_full_exits, 0);
    }

    #[test]
    fn an_exclusive_mmu_lock_bounds_what_more_vcpus_buy_and_the_cpus_bound_the_rest() {
        let dirty =
            |c: &DirtyCosts, vcpus| run(c, &with(vcpus, LogMode::Bitmap)).passes[0].dirty_ns as f64;
        // No lock held (TDP's fast_page_fault): two vCPUs on two CPUs halve the pass; eight
        // on two do no better.
        let free = contended(0.0, 2);
        let one = dirty(&free, 1);
        assert_eq!(one, 16384.0 * 1000.0);
        assert!(
            (dirty(&free, 2) / one - 0.5).abs() < 0.01,
            "{}",
            dirty(&free, 2)
        );
        assert!(dirty(&free, 8) >= dirty(&free, 2) * 0.999);
        // Shadow paging, 400 of the fault's 1000 ns under the lock: 2 vCPUs are bounded by
        // the lock's 400 ns per page, at least (but the fault's 600 free ns run beside it).
        let shadow = contended(400.0, 2);
        assert_eq!(dirty(&shadow, 1), one, "one vCPU never waits");
        let two = dirty(&shadow, 2);
        assert!(two >= 16384.0 * 400.0 && two < one, "{two}");
        // The whole fault under the lock: no gain at all from a second vCPU.
        let all = contended(1000.0, 2);
        assert!(dirty(&all, 2) >= one * 0.999, "{}", dirty(&all, 2));
    }
}
