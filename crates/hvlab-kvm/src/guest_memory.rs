//! Guest memory: anonymous host mappings that back memslots, unmapped on drop, with the host
//! backings the memory scenario compares.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

pub use hvlab_core::guest::Backing;
pub use hvlab_core::memory::HugeSize;

use super::KvmError;

const HUGE: usize = 2 << 20;
const PAGE: usize = 4096;

/// One anonymous host mapping used as guest RAM.
#[derive(Debug)]
pub struct GuestMemory {
    /// What mmap returned (munmap needs it back).
    map: NonNull<u8>,
    map_len: usize,
    /// The usable, possibly 2 MiB-aligned, part.
    ptr: NonNull<u8>,
    len: usize,
    /// The file behind a shared mapping (memfd, hugetlb memfd, guest_memfd); closed after the
    /// unmap.
    file: Option<OwnedFd>,
}

// SAFETY: the mapping is plain memory owned by this value; moving it to another thread moves
// ownership, and access goes through `&self`/`&mut self` like any buffer.
unsafe impl Send for GuestMemory {}

fn mmap_anonymous(len: usize, extra_flags: libc::c_int) -> Result<NonNull<u8>, KvmError> {
    // SAFETY: a fresh private anonymous mapping at an address of the kernel's choosing aliases
    // nothing; the result is checked before use.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(KvmError::Mmap {
            bytes: len,
            source: std::io::Error::last_os_error(),
        });
    }
    NonNull::new(addr.cast::<u8>()).ok_or_else(|| KvmError::Mmap {
        bytes: len,
        source: std::io::Error::other("mmap returned NULL"),
    })
}

impl GuestMemory {
    /// `len` bytes of lazily allocated memory; `MAP_NORESERVE` because untouched guest RAM
    /// should cost nothing.
    pub fn anonymous(len: usize) -> Result<GuestMemory, KvmError> {
        let map = mmap_anonymous(len, libc::MAP_NORESERVE)?;
        Ok(GuestMemory {
            map,
            map_len: len,
            ptr: map,
            len,
            file: None,
        })
    }

    /// `len` bytes of a new memfd (shmem, or hugetlb of `huge` pages), mapped shared and
    /// lazily: nothing is allocated until touched. A hugetlb mapping reserves its pages from
    /// the pool at mmap time, so a short pool fails here, not in the guest.
    pub fn memfd(len: usize, huge: Option<HugeSize>) -> Result<GuestMemory, KvmError> {
        let mut flags = rustix::fs::MemfdFlags::CLOEXEC;
        if let Some(h) = huge {
            flags |= rustix::fs::MemfdFlags::HUGETLB
                | match h {
                    HugeSize::Mib2 => rustix::fs::MemfdFlags::HUGE_2MB,
                    HugeSize::Gib1 => rustix::fs::MemfdFlags::HUGE_1GB,
                };
        }
        let fd = rustix::fs::memfd_create("hvlab-guest", flags).map_err(|e| KvmError::Host {
            what: "memfd_create for guest memory".into(),
            source: e.into(),
        })?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(|e| KvmError::Host {
            what: format!("sizing the guest memfd to {len} bytes"),
            source: e.into(),
        })?;
        GuestMemory::shared(fd, len)
    }

    /// Maps `len` bytes of `file` shared (a memfd or an mmap-able guest_memfd).
    pub fn shared(file: OwnedFd, len: usize) -> Result<GuestMemory, KvmError> {
        // SAFETY: a fresh shared mapping of a file we own, at an address of the kernel's
        // choosing; it aliases only the file, which nothing else maps. Checked before use.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(KvmError::Mmap {
                bytes: len,
                source: std::io::Error::last_os_error(),
            });
        }
        let map = NonNull::new(addr.cast::<u8>()).ok_or_else(|| KvmError::Mmap {
            bytes: len,
            source: std::io::Error::other("mmap returned NULL"),
        })?;
        Ok(GuestMemory {
            map,
            map_len: len,
            ptr: map,
            len,
            file: Some(file),
        })
    }

    /// The file behind a shared mapping.
    pub fn file(&self) -> Option<BorrowedFd<'_>> {
        self.file.as_ref().map(AsFd::as_fd)
    }

    /// Allocates every page of the file (its page cache, for shmem) without mapping any in
    /// this process: what a userfaultfd MINOR fault then finds.
    pub fn fill_file(&self) -> Result<(), KvmError> {
        let file = self
            .file
            .as_ref()
            .ok_or_else(|| KvmError::Internal("fill_file on anonymous memory".into()))?;
        rustix::fs::fallocate(
            file,
            rustix::fs::FallocateFlags::empty(),
            0,
            self.len as u64,
        )
        .map_err(|e| KvmError::Host {
            what: format!("fallocate of {} bytes of guest memfd", self.len),
            source: e.into(),
        })
    }

    /// `len` bytes with the given backing. `len` must be a multiple of 4 KiB.
    ///
    /// The 4 KiB backings are `MADV_NOHUGEPAGE`: with THP mode `always` (Debian's default) the
    /// host would otherwise back them with huge pages too, and every backing would measure the
    /// same thing.
    pub fn backed(len: usize, backing: Backing) -> Result<GuestMemory, KvmError> {
        match backing {
            Backing::Lazy => {
                let mem = GuestMemory::anonymous(len)?;
                mem.advise(libc::MADV_NOHUGEPAGE)?;
                Ok(mem)
            }
            Backing::Populated => {
                let mem = GuestMemory::anonymous(len)?;
                mem.advise(libc::MADV_NOHUGEPAGE)?;
                mem.populate()?;
                Ok(mem)
            }
            Backing::Thp => {
                // Over-allocate so a 2 MiB-aligned run of `len` bytes exists inside.
                let map_len = len + HUGE;
                let map = mmap_anonymous(map_len, libc::MAP_NORESERVE)?;
                let skew = (HUGE - (map.as_ptr() as usize % HUGE)) % HUGE;
                // SAFETY: skew < HUGE, and map_len = len + HUGE, so [skew, skew + len) is in the
                // mapping.
                let ptr = unsafe { NonNull::new_unchecked(map.as_ptr().add(skew)) };
                let mem = GuestMemory {
                    map,
                    map_len,
                    ptr,
                    len,
                    file: None,
                };
                mem.advise(libc::MADV_HUGEPAGE)?;
                Ok(mem)
            }
        }
    }

    /// `madvise(advice)` over the usable part.
    fn advise(&self, advice: libc::c_int) -> Result<(), KvmError> {
        // SAFETY: advising our own mapping; the advice used here (huge-page policy) changes
        // no contents.
        if unsafe { libc::madvise(self.ptr.as_ptr().cast(), self.len, advice) } != 0 {
            // Kernels built without THP reject the huge-page advice; then pages are 4 KiB
            // anyway, which is what NOHUGEPAGE asks for.
            let err = std::io::Error::last_os_error();
            if advice == libc::MADV_NOHUGEPAGE && err.raw_os_error() == Some(libc::EINVAL) {
                return Ok(());
            }
            return Err(KvmError::Mmap {
                bytes: self.len,
                source: err,
            });
        }
        Ok(())
    }

    /// Makes every page present and writable in the host (anonymous, shmem or hugetlb).
    pub fn populate(&self) -> Result<(), KvmError> {
        // SAFETY: advising our own mapping; MADV_POPULATE_WRITE only faults pages in.
        let rc = unsafe {
            libc::madvise(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINVAL) {
            return Err(KvmError::Mmap {
                bytes: self.len,
                source: err,
            });
        }
        // Kernels before 5.14 lack MADV_POPULATE_WRITE: write one byte per page instead.
        for off in (0..self.len).step_by(PAGE) {
            // SAFETY: off < len, inside our mapping; volatile so the write is not elided.
            unsafe { self.ptr.as_ptr().add(off).write_volatile(0) };
        }
        Ok(())
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The start of the usable mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The host virtual address, for `kvm_userspace_memory_region::userspace_addr`.
    pub fn host_addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    fn range(&self, offset: usize, n: usize) -> Result<usize, KvmError> {
        offset
            .checked_add(n)
            .filter(|end| *end <= self.len)
            .ok_or_else(|| {
                KvmError::Layout(format!(
                    "access of {n} bytes at {offset:#x} exceeds guest memory of {} bytes",
                    self.len
                ))
            })
    }

    /// Copies `bytes` to `offset`.
    pub fn write(&mut self, offset: usize, bytes: &[u8]) -> Result<(), KvmError> {
        self.range(offset, bytes.len())?;
        // SAFETY: the range is inside the mapping (checked) and `&mut self` makes this the only
        // access from Rust.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), bytes.len()) };
        dst.copy_from_slice(bytes);
        Ok(())
    }

    /// Copies from `offset` into `buf`.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<(), KvmError> {
        self.range(offset, buf.len())?;
        // SAFETY: the range is inside the mapping (checked); a shared read of plain memory.
        let src = unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), buf.len()) };
        buf.copy_from_slice(src);
        Ok(())
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        // SAFETY: map/map_len are exactly what mmap returned; memslots using this memory
        // belong to VMs that are dropped first (see `vm::Vm` field order).
        unsafe {
            libc::munmap(self.map.as_ptr().cast(), self.map_len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resident_pages(mem: &GuestMemory) -> usize {
        let pages = mem.len() / PAGE;
        let mut vec = vec![0u8; pages];
        // SAFETY: mincore on our own mapping with a vector of one byte per page.
        let rc = unsafe { libc::mincore(mem.ptr.as_ptr().cast(), mem.len(), vec.as_mut_ptr()) };
        assert_eq!(rc, 0);
        vec.iter().filter(|b| **b & 1 != 0).count()
    }

    #[test]
    fn lazy_memory_is_absent_and_populated_memory_present() {
        let lazy = GuestMemory::backed(4 << 20, Backing::Lazy).unwrap();
        assert_eq!(resident_pages(&lazy), 0);
        let populated = GuestMemory::backed(4 << 20, Backing::Populated).unwrap();
        assert_eq!(resident_pages(&populated), 1024);
    }

    /// The `VmFlags` of the mapping that contains `addr`, from /proc/self/smaps.
    fn vm_flags(addr: u64) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            let range = line.split_whitespace().next().unwrap_or("");
            if let Some((lo, hi)) = range.split_once('-')
                && let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
            } else if inside && let Some(flags) = line.strip_prefix("VmFlags:") {
                return flags.to_string();
            }
        }
        panic!("no mapping contains {addr:#x}");
    }

    #[test]
    fn four_kib_backings_opt_out_of_thp_and_thp_opts_in() {
        let lazy = GuestMemory::backed(4 << 20, Backing::Lazy).unwrap();
        assert!(vm_flags(lazy.host_addr()).contains(" nh"));
        let populated = GuestMemory::backed(4 << 20, Backing::Populated).unwrap();
        assert!(vm_flags(populated.host_addr()).contains(" nh"));
        let thp = GuestMemory::backed(4 << 20, Backing::Thp).unwrap();
        assert!(vm_flags(thp.host_addr()).contains(" hg"));
    }

    #[test]
    fn thp_memory_is_2mib_aligned() {
        let thp = GuestMemory::backed(4 << 20, Backing::Thp).unwrap();
        assert_eq!(thp.host_addr() % (2 << 20), 0);
        assert_eq!(thp.len(), 4 << 20);
    }

    #[test]
    fn out_of_range_access_is_an_error() {
        let mut m = GuestMemory::anonymous(8192).unwrap();
        assert!(m.write(8190, &[0; 4]).is_err());
        let mut b = [0u8; 4];
        assert!(m.read(usize::MAX - 1, &mut b).is_err());
        m.write(100, &[1, 2, 3, 4]).unwrap();
        m.read(100, &mut b).unwrap();
        assert_eq!(b, [1, 2, 3, 4]);
    }
}
