//! What directories take on disk: allocated blocks, each inode counted once (the kernels a
//! modules build keeps are hard links to the image's files), symlinks never followed.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// One inode seen under a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Inode {
    /// Device and inode number.
    pub id: (u64, u64),
    /// Bytes allocated on disk.
    pub bytes: u64,
    /// Its links, everywhere.
    pub nlink: u64,
    /// Whether it is a directory (never linked twice: it goes with its entry).
    pub dir: bool,
}

/// Calls `each` for every inode under `root` (`root` itself included), without following a
/// symlink; what cannot be read is skipped (it is being removed, or not ours).
pub fn walk(root: &Path, each: &mut dyn FnMut(Inode)) {
    let Ok(meta) = std::fs::symlink_metadata(root) else {
        return;
    };
    each(Inode {
        id: (meta.dev(), meta.ino()),
        bytes: meta.blocks().saturating_mul(512),
        nlink: meta.nlink(),
        dir: meta.is_dir(),
    });
    if !meta.is_dir() {
        return;
    }
    let mut stack: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let Ok(meta) = e.metadata() else {
                continue;
            };
            each(Inode {
                id: (meta.dev(), meta.ino()),
                bytes: meta.blocks().saturating_mul(512),
                nlink: meta.nlink(),
                dir: meta.is_dir(),
            });
            if meta.is_dir() {
                stack.push(e.path());
            }
        }
    }
}

/// Bytes on disk under `paths` together, each inode once.
pub fn bytes(paths: &[PathBuf]) -> u64 {
    let mut seen: HashMap<(u64, u64), u64> = HashMap::new();
    for p in paths {
        walk(p, &mut |i| {
            seen.insert(i.id, i.bytes);
        });
    }
    seen.values().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hard_links_count_once_and_symlinks_are_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a");
        std::fs::create_dir_all(&a).expect("mkdir");
        std::fs::write(a.join("f"), vec![7u8; 64 * 1024]).expect("write");
        let one = bytes(std::slice::from_ref(&a));
        assert!(one >= 64 * 1024, "{one}");
        std::fs::hard_link(a.join("f"), a.join("g")).expect("link");
        let big = dir.path().join("big");
        std::fs::write(&big, vec![1u8; 1024 * 1024]).expect("write");
        std::os::unix::fs::symlink(&big, a.join("l")).expect("symlink");
        let linked = bytes(std::slice::from_ref(&a));
        assert!(linked < one + 16 * 1024, "{one} {linked}");
        // Two roots sharing the inode: still once.
        let b = dir.path().join("b");
        std::fs::create_dir_all(&b).expect("mkdir");
        std::fs::hard_link(a.join("f"), b.join("f")).expect("link");
        assert!(bytes(&[a, b]) < one + 32 * 1024);
    }
}
