//! The hugetlb pool a hugetlb-backed guest draws from: reserved for the run through
//! /sys/kernel/mm/hugepages/hugepages-<size>kB/nr_hugepages and given back afterwards.
//!
//! Hosts keep these pools empty until someone sizes them (this one does). hvlab grows the pool
//! by what the run lacks and writes the old size back when the [`PoolGuard`] drops, on error
//! paths too. Only a process killed between the two leaves the pool grown; the error and the
//! guard's message name the file and the old size to write back by hand.

use std::path::{Path, PathBuf};

use super::KvmError;
use hvlab_core::memory::HugeSize;

const SYSFS: &str = "/sys/kernel/mm/hugepages";

/// The hugetlb page sizes this host has pools for, as their directory names
/// (`hugepages-2048kB`, ...), sorted.
pub fn host_sizes(root: &Path) -> Vec<String> {
    let mut sizes: Vec<String> = std::fs::read_dir(root)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("hugepages-"))
                .collect()
        })
        .unwrap_or_default();
    sizes.sort();
    sizes
}

/// A pool grown for one run; the old size is written back on drop.
#[derive(Debug)]
pub struct PoolGuard {
    file: PathBuf,
    old: u64,
    /// Pages the pool had before, and after hvlab grew it.
    pub before_after: (u64, u64),
}

fn read_u64(path: &Path) -> Result<u64, KvmError> {
    std::fs::read_to_string(path)
        .map_err(|source| KvmError::Host {
            what: format!("reading {}", path.display()),
            source,
        })?
        .trim()
        .parse()
        .map_err(|_| KvmError::Host {
            what: format!("reading {}", path.display()),
            source: std::io::Error::other("not a number"),
        })
}

impl PoolGuard {
    /// Makes sure `bytes` of `size` pages are free in the pool, growing it if needed.
    pub fn reserve(size: HugeSize, bytes: u64) -> Result<PoolGuard, KvmError> {
        PoolGuard::reserve_in(Path::new(SYSFS), size, bytes)
    }

    /// [`PoolGuard::reserve`] under another sysfs root (tests).
    pub fn reserve_in(root: &Path, size: HugeSize, bytes: u64) -> Result<PoolGuard, KvmError> {
        let dir = root.join(size.sysfs_dir());
        if !dir.is_dir() {
            let have = host_sizes(root);
            return Err(KvmError::Lacks(format!(
                "this host has no {} hugetlb pool ({}); it has: {}",
                size.sysfs_dir(),
                dir.display(),
                if have.is_empty() {
                    "none".to_string()
                } else {
                    have.join(", ")
                }
            )));
        }
        if !bytes.is_multiple_of(size.bytes()) {
            return Err(KvmError::Lacks(format!(
                "a region of {bytes} bytes is not a whole number of {} MiB hugetlb pages: choose a size that is a multiple of {} MiB",
                size.bytes() >> 20,
                size.bytes() >> 20
            )));
        }
        let file = dir.join("nr_hugepages");
        let need = bytes / size.bytes();
        let old = read_u64(&file)?;
        let free = read_u64(&dir.join("free_hugepages"))?;
        let want = old + need.saturating_sub(free);
        let guard = PoolGuard {
            file: file.clone(),
            old,
            before_after: (old, want),
        };
        if want == old {
            return Ok(guard);
        }
        // From here the guard restores the old size, whatever happens next.
        std::fs::write(&file, want.to_string()).map_err(|source| {
            if source.kind() == std::io::ErrorKind::PermissionDenied {
                KvmError::Lacks(format!(
                    "growing the hugetlb pool needs root: run as root, or size it first (`echo {want} > {}`)",
                    file.display()
                ))
            } else {
                KvmError::Host {
                    what: format!(
                        "growing the hugetlb pool ({} from {old} to {want} pages)",
                        file.display()
                    ),
                    source,
                }
            }
        })?;
        let got = read_u64(&file)?;
        if got < want {
            // The kernel gives what it can find contiguous; less is a host limitation.
            return Err(KvmError::Lacks(format!(
                "the host could give only {got} of the {want} {} pages asked for in {} (memory too fragmented or too small); the pool is set back to {old}; {}",
                size.sysfs_dir(),
                file.display(),
                how_to_get(size, want)
            )));
        }
        let mut guard = guard;
        guard.before_after = (old, got);
        Ok(guard)
    }
}

/// What a user can do when the running kernel cannot find the pages.
fn how_to_get(size: HugeSize, pages: u64) -> String {
    match size {
        // Above the buddy allocator's largest block, a page is a whole aligned range of
        // movable or free memory (alloc_contig_pages()), rarely found once a host has run a
        // while: only the boot-time reservation is sure.
        HugeSize::Gib1 => format!(
            "1 GiB pages need a whole aligned GiB of free or movable memory, which a running host seldom has: reserve them at boot (`hugepagesz=1G hugepages={pages}` on the kernel command line)"
        ),
        HugeSize::Mib2 => format!(
            "compact memory and retry (`echo 1 > /proc/sys/vm/compact_memory`), or reserve the pages at boot (`hugepages={pages}` on the kernel command line)"
        ),
    }
}

impl Drop for PoolGuard {
    fn drop(&mut self) {
        if self.before_after.1 == self.old {
            return;
        }
        if let Err(e) = std::fs::write(&self.file, self.old.to_string()) {
            // Nothing to return to; say how to put it back by hand.
            eprintln!(
                "warning: could not restore the hugetlb pool ({e}): run `echo {} > {}`",
                self.old,
                self.file.display()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(root: &Path, dir: &str, nr: u64, free: u64) {
        let d = root.join(dir);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("nr_hugepages"), nr.to_string()).unwrap();
        std::fs::write(d.join("free_hugepages"), free.to_string()).unwrap();
    }

    #[test]
    fn the_pool_grows_by_what_is_missing_and_shrinks_back_on_drop() {
        let root = tempfile::tempdir().unwrap();
        pool(root.path(), "hugepages-2048kB", 4, 1);
        let file = root.path().join("hugepages-2048kB/nr_hugepages");
        {
            let g = PoolGuard::reserve_in(root.path(), HugeSize::Mib2, 8 << 20).unwrap();
            // 4 pages wanted, 1 free: 3 more.
            assert_eq!(g.before_after, (4, 7));
            assert_eq!(std::fs::read_to_string(&file).unwrap(), "7");
        }
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "4");
    }

    #[test]
    fn a_size_the_host_lacks_names_the_sizes_it_has() {
        let root = tempfile::tempdir().unwrap();
        pool(root.path(), "hugepages-2048kB", 0, 0);
        let e = PoolGuard::reserve_in(root.path(), HugeSize::Gib1, 1 << 30).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("no hugepages-1048576kB") && msg.contains("it has: hugepages-2048kB"),
            "{msg}"
        );
        assert!(e.is_host_limitation());
        let e = PoolGuard::reserve_in(root.path(), HugeSize::Mib2, 3 << 20).unwrap_err();
        assert!(e.to_string().contains("multiple of 2 MiB"), "{e}");
    }

    #[test]
    fn a_shortfall_says_how_to_reserve_the_pages_at_boot() {
        for (size, boot) in [
            (HugeSize::Gib1, "`hugepagesz=1G hugepages=3`"),
            (HugeSize::Mib2, "`hugepages=3`"),
        ] {
            let msg = how_to_get(size, 3);
            assert!(msg.contains(boot), "{msg}");
        }
        assert!(how_to_get(HugeSize::Mib2, 3).contains("compact_memory"));
    }
}
