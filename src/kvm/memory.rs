//! Guest memory: anonymous host mappings that back memslots, unmapped on drop.

use std::ptr::NonNull;

use super::KvmError;

/// One anonymous host mapping used as guest RAM.
#[derive(Debug)]
pub struct GuestMemory {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; moving it to another thread moves
// ownership, and shared access goes through `&self`/`&mut self` like any buffer.
unsafe impl Send for GuestMemory {}

impl GuestMemory {
    /// Maps `len` bytes of private anonymous memory. `MAP_NORESERVE`: guest RAM is touched
    /// lazily, so untouched pages cost nothing.
    pub fn anonymous(len: usize) -> Result<GuestMemory, KvmError> {
        // SAFETY: a fresh anonymous mapping at an address of the kernel's choosing aliases
        // nothing; the result is checked before use.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
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
        let ptr = NonNull::new(addr.cast::<u8>()).ok_or_else(|| KvmError::Mmap {
            bytes: len,
            source: std::io::Error::other("mmap returned NULL"),
        })?;
        Ok(GuestMemory { ptr, len })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The host virtual address, for `kvm_userspace_memory_region::userspace_addr`.
    pub fn host_addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Copies `bytes` to `offset`.
    pub fn write(&mut self, offset: usize, bytes: &[u8]) -> Result<(), KvmError> {
        let end = offset
            .checked_add(bytes.len())
            .filter(|end| *end <= self.len)
            .ok_or_else(|| {
                KvmError::Guest(format!(
                    "write of {} bytes at {offset:#x} exceeds guest memory of {} bytes",
                    bytes.len(),
                    self.len
                ))
            })?;
        // SAFETY: [offset, end) lies inside the mapping (checked above) and `&mut self` makes
        // this the only access.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(offset), end - offset) };
        dst.copy_from_slice(bytes);
        Ok(())
    }
}

impl Drop for GuestMemory {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; nothing refers to the mapping after
        // drop (memslots using it belong to VMs that are dropped first, see `vm::Vm`).
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}
