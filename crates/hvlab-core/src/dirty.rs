//! The dirty-logging vocabulary: passes of guest writes over a logged memslot, the way the VMM
//! collects the log after each, and what a backend observed.
//!
//! KVM offers three ways to learn which pages a guest wrote (Documentation/virt/kvm/api.rst):
//! `KVM_GET_DIRTY_LOG`, which hands over the memslot's bitmap and write-protects the dirty
//! pages again in the same call; the same call under `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`, which
//! only copies the bitmap, with `KVM_CLEAR_DIRTY_LOG` re-protecting chunk by chunk; and the
//! per-vCPU dirty ring (`KVM_CAP_DIRTY_LOG_RING`), a shared array of (slot, offset) entries the
//! VMM harvests and hands back with `KVM_RESET_DIRTY_RINGS`.

use std::time::Duration;

use super::guest::Cpl;
use super::memory::HugeSize;

/// Bytes of one dirty-ring entry (`struct kvm_dirty_gfn`: flags u32, slot u32, offset u64).
pub const RING_ENTRY_BYTES: u64 = 16;
/// Pages covered by one bitmap word: `KVM_CLEAR_DIRTY_LOG` takes chunks that start and
/// (except at the slot's end) end on a multiple of it.
pub const BITMAP_WORD_PAGES: u64 = 64;
/// Entries `kvm_dirty_ring_get_rsvd_entries()` keeps free below the ring size
/// (`KVM_DIRTY_RING_RSVD_ENTRIES`, include/linux/kvm_dirty_ring.h), plus the CPU's own dirty
/// log size (PML's 512 on VMX with PML; 0 elsewhere).
pub const RING_RSVD_ENTRIES: u64 = 64;

/// How the VMM collects the log after each pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogMode {
    /// `KVM_GET_DIRTY_LOG`: get and re-protect in one call.
    Bitmap,
    /// `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2`: `KVM_GET_DIRTY_LOG` copies, `KVM_CLEAR_DIRTY_LOG`
    /// re-protects in chunks of this many pages.
    Clear {
        /// Pages per `KVM_CLEAR_DIRTY_LOG` call (a multiple of 64).
        chunk_pages: u64,
    },
    /// `KVM_CAP_DIRTY_LOG_RING` with this many entries per vCPU (a power of two).
    Ring {
        /// Entries per vCPU ring.
        entries: u64,
    },
}

impl LogMode {
    /// The ring's size in bytes, as `KVM_ENABLE_CAP(KVM_CAP_DIRTY_LOG_RING)` takes it.
    pub fn ring_bytes(self) -> Option<u64> {
        match self {
            LogMode::Ring { entries } => Some(entries.saturating_mul(RING_ENTRY_BYTES)),
            _ => None,
        }
    }
}

/// Where the logged region's host memory comes from. Every backing is populated before the
/// guest runs, so the first (unmeasured) pass costs stage-2 faults only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirtyBacking {
    /// Anonymous 4 KiB memory (`MADV_NOHUGEPAGE`), populated.
    Anonymous,
    /// A shmem memfd mapped shared, populated.
    Shmem,
    /// A hugetlb memfd (`MFD_HUGETLB`) of this page size from a pool hvlab reserves and sets
    /// back. A logged slot is still mapped and logged in 4 KiB pages: KVM never maps a
    /// dirty-logged slot huge (`kvm_mmu_max_mapping_level()` under `kvm_slot_dirty_track_enabled()`).
    Hugetlb(HugeSize),
    /// guest_memfd: KVM refuses `KVM_MEM_LOG_DIRTY_PAGES` on a `KVM_MEM_GUEST_MEMFD` slot
    /// (`check_memory_region_flags()`), so no backend runs it.
    GuestMemfd,
}

impl DirtyBacking {
    /// Why the dirty log cannot use this backing on any kernel; `None` when it can.
    pub fn refusal(self) -> Option<&'static str> {
        match self {
            DirtyBacking::GuestMemfd => Some(
                "guest_memfd cannot be dirty-logged: KVM refuses KVM_MEM_LOG_DIRTY_PAGES on a KVM_MEM_GUEST_MEMFD slot (check_memory_region_flags() drops the flag from the valid ones); use backing=anon, shmem or hugetlb-2m",
            ),
            _ => None,
        }
    }
}

/// One run of dirty-logging passes in a fresh VM.
#[derive(Debug, Clone, PartialEq)]
pub struct DirtyPlan {
    /// Bytes of the logged data region (a multiple of 2 MiB).
    pub size_bytes: u64,
    /// Measured passes after the first (which maps every page and is collected unmeasured).
    pub passes: u32,
    /// Every `stride`-th 4 KiB page is written in each pass.
    pub stride: u32,
    /// How the log is collected.
    pub mode: LogMode,
    /// Guest privilege level; `None`: the backend's default ([`Cpl::default_for`]).
    pub cpl: Option<Cpl>,
    /// Watchdog for each pass.
    pub timeout: Duration,
    /// vCPUs writing at once, each its own contiguous slice of the region (memstress's
    /// shape); the region is a multiple of `vcpus` × 2 MiB.
    pub vcpus: u32,
    /// The region's host memory.
    pub backing: DirtyBacking,
}

impl DirtyPlan {
    /// 4 KiB pages in the region.
    pub fn pages(&self) -> u64 {
        self.size_bytes / 4096
    }

    /// Pages in each vCPU's slice.
    pub fn slice_pages(&self) -> u64 {
        self.pages() / u64::from(self.vcpus.max(1))
    }

    /// The first page of vCPU `i`'s slice.
    pub fn slice_start(&self, i: u32) -> u64 {
        u64::from(i) * self.slice_pages()
    }

    /// Pages one vCPU writes per pass: every `stride`-th of its slice, from the slice's first.
    pub fn written_per_vcpu(&self) -> u64 {
        self.slice_pages().div_ceil(u64::from(self.stride.max(1)))
    }

    /// Pages one pass writes, over every vCPU.
    pub fn written_per_pass(&self) -> u64 {
        self.written_per_vcpu() * u64::from(self.vcpus.max(1))
    }

    /// The pages vCPU `i` writes in a pass, in order.
    pub fn vcpu_pages(&self, i: u32) -> impl Iterator<Item = u64> + use<> {
        let start = self.slice_start(i);
        let stride = usize::try_from(self.stride.max(1)).unwrap_or(1);
        (start..start + self.slice_pages()).step_by(stride)
    }

    /// The ring's soft limit: a vCPU whose ring holds this many unreset entries exits with
    /// `KVM_EXIT_DIRTY_RING_FULL` (`kvm_dirty_ring_soft_full()`). `None` outside ring mode.
    pub fn ring_soft_limit(&self) -> Option<u64> {
        match self.mode {
            LogMode::Ring { entries } => Some(entries.saturating_sub(RING_RSVD_ENTRIES)),
            _ => None,
        }
    }
}

/// What one measured pass observed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DirtyPass {
    /// Pages the guest wrote.
    pub written: u64,
    /// Distinct pages the collected log reported dirty.
    pub found: u64,
    /// Host ns from the guest's Start to its End signal (ring-full stops excluded).
    pub dirty_ns: u64,
    /// `KVM_GET_DIRTY_LOG` ns (bitmap, clear); 0 for the ring.
    pub get_ns: u64,
    /// `KVM_CLEAR_DIRTY_LOG` ns over every chunk (clear); 0 otherwise.
    pub clear_ns: u64,
    /// Ring entries read and marked for reset by the VMM, ns (ring); 0 otherwise.
    pub harvest_ns: u64,
    /// `KVM_RESET_DIRTY_RINGS` ns (ring); 0 otherwise.
    pub reset_ns: u64,
    /// Collection ioctls issued (get, clear chunks, resets).
    pub ioctls: u64,
    /// `KVM_EXIT_DIRTY_RING_FULL` exits during the pass.
    pub ring_full_exits: u64,
    /// Write-protect faults during the pass, where the backend can count them.
    pub wp_faults: Option<u64>,
    /// KVM statistics that changed during the pass: (metric name, unit, delta).
    pub kvm_stats: Vec<(String, String, i128)>,
    /// With several vCPUs: each one's dirtying time from the common start to its own `End`,
    /// its ring-full stops excluded, ns, in vCPU order (`dirty_ns` is then the slowest's).
    /// Empty for one vCPU.
    pub vcpu_ns: Vec<u64>,
}

impl DirtyPass {
    /// Everything the VMM spent collecting this pass's log, ns.
    pub fn collect_ns(&self) -> u64 {
        self.get_ns + self.clear_ns + self.harvest_ns + self.reset_ns
    }
}

/// What one run of passes observed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DirtyResult {
    /// The measured passes, in order.
    pub passes: Vec<DirtyPass>,
}

/// Why a ring size cannot be used, in words naming the limit; `None` when it can.
/// `max_bytes` is what `KVM_CHECK_EXTENSION(KVM_CAP_DIRTY_LOG_RING)` returned (0: no ring).
pub fn ring_refusal(entries: u64, max_bytes: i64) -> Option<String> {
    let bytes = entries.saturating_mul(RING_ENTRY_BYTES);
    if max_bytes <= 0 {
        return Some("KVM_CAP_DIRTY_LOG_RING: this host's KVM offers no dirty ring".into());
    }
    let max = u64::try_from(max_bytes).unwrap_or(0);
    (bytes > max).then(|| {
        format!(
            "a ring of {entries} entries ({bytes} bytes) exceeds this host's KVM_CAP_DIRTY_LOG_RING maximum of {max} bytes ({} entries); choose ring <= {}",
            max / RING_ENTRY_BYTES,
            max / RING_ENTRY_BYTES
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(mode: LogMode) -> DirtyPlan {
        DirtyPlan {
            size_bytes: 8 << 20,
            passes: 2,
            stride: 3,
            mode,
            cpl: None,
            timeout: Duration::from_secs(1),
            vcpus: 1,
            backing: DirtyBacking::Anonymous,
        }
    }

    #[test]
    fn a_pass_writes_every_stride_th_page_including_page_zero() {
        let p = plan(LogMode::Bitmap);
        assert_eq!(p.pages(), 2048);
        assert_eq!(p.written_per_pass(), 683); // 0, 3, ..., 2046
        assert_eq!(p.vcpu_pages(0).count(), 683);
    }

    #[test]
    fn each_vcpu_writes_its_own_slice_and_the_slices_cover_what_one_would_write_at_stride_one() {
        let p = DirtyPlan {
            vcpus: 4,
            stride: 1,
            ..plan(LogMode::Bitmap)
        };
        assert_eq!(p.slice_pages(), 512);
        assert_eq!(p.written_per_pass(), 2048);
        let mut all: Vec<u64> = (0..4).flat_map(|i| p.vcpu_pages(i)).collect();
        assert_eq!(all.len(), 2048);
        all.dedup();
        assert_eq!(all, (0..2048).collect::<Vec<_>>());
        // A stride restarts in each slice: 512 pages at stride 3 is 171 writes each.
        let s = DirtyPlan { stride: 3, ..p };
        assert_eq!(s.written_per_vcpu(), 171);
        assert_eq!(s.vcpu_pages(1).next(), Some(512));
        assert!(s.vcpu_pages(1).all(|pg| (512..1024).contains(&pg)));
    }

    #[test]
    fn the_soft_limit_keeps_the_reserved_entries_free() {
        let p = plan(LogMode::Ring { entries: 4096 });
        assert_eq!(p.ring_soft_limit(), Some(4032));
        assert_eq!(plan(LogMode::Bitmap).ring_soft_limit(), None);
        assert_eq!(LogMode::Ring { entries: 4096 }.ring_bytes(), Some(65536));
    }

    #[test]
    fn a_ring_above_the_host_maximum_names_the_maximum() {
        assert!(ring_refusal(65536, 1 << 20).is_none());
        let why = ring_refusal(131_072, 1 << 20).unwrap();
        assert!(
            why.contains("1048576 bytes") && why.contains("65536 entries"),
            "{why}"
        );
        assert!(ring_refusal(4096, 0).unwrap().contains("no dirty ring"));
    }
}
