//! Which cache entries a running hvlab uses: it holds a shared `flock` on each entry's
//! directory (a kernel image, a built kernel, a source tree) from when it finds or makes it
//! until it exits, so `hvlab cache prune`, which removes an entry only under an exclusive
//! lock it can take at once, never removes one in use. The locks go with the process, even
//! when it is killed.

use std::fs::File;
use std::path::Path;
use std::sync::Mutex;

use rustix::fs::{FlockOperation, flock};

/// The entries this process holds, kept open until it exits.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

/// Holds `dir` (shared) for the rest of this process, and marks it used now (its mtime, which
/// `hvlab cache` shows as its last use and prune orders by): waits while a prune removes it.
/// Returns whether `dir` is still there once held (a prune may have removed it meanwhile).
pub fn hold(dir: &Path) -> std::io::Result<bool> {
    let file = match File::open(dir) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    flock(&file, FlockOperation::LockShared)?;
    if !dir.is_dir() {
        return Ok(false);
    }
    mark_used(&file);
    HELD.lock()
        .map_err(|_| std::io::Error::other("the cache's hold list was poisoned"))?
        .push(file);
    Ok(true)
}

/// Marks the entry `dir` used now (its mtime), for an entry held by a lock file of its own
/// rather than [`hold`] (the apt state, whose lists every resolution reads).
pub fn touch(dir: &Path) {
    if let Ok(file) = File::open(dir) {
        mark_used(&file);
    }
}

fn mark_used(dir: &File) {
    // Not ours to touch (another user's shared cache): its last use stays as it was.
    let _ = dir.set_modified(std::time::SystemTime::now());
}

/// An entry locked for removal: no hvlab holds it, and none can until this is dropped.
#[derive(Debug)]
pub struct Exclusive {
    _file: File,
}

/// Locks `path` (a directory, or a lock file) for removal, if no hvlab holds it now: `None`
/// when one does (or it is gone).
pub fn try_exclusive(path: &Path) -> Option<Exclusive> {
    let file = File::open(path).ok()?;
    flock(&file, FlockOperation::NonBlockingLockExclusive).ok()?;
    Some(Exclusive { _file: file })
}

/// Whether some hvlab holds `path` now (shared or exclusive).
pub fn in_use(path: &Path) -> bool {
    path.exists() && try_exclusive(path).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_entry_cannot_be_locked_for_removal_until_released() {
        let dir = tempfile::tempdir().expect("tempdir");
        let entry = dir.path().join("builds/abc");
        std::fs::create_dir_all(&entry).expect("mkdir");
        assert!(!in_use(&entry));
        // Another holder: a separate open file, as another process has.
        let other = File::open(&entry).expect("open");
        flock(&other, FlockOperation::LockShared).expect("shared");
        assert!(in_use(&entry));
        assert!(try_exclusive(&entry).is_none());
        drop(other);
        let removal = try_exclusive(&entry).expect("free now");
        // While it is locked for removal, a holder would wait: it is in use.
        assert!(in_use(&entry));
        drop(removal);
        assert!(hold(&entry).expect("hold"));
        assert!(in_use(&entry));
        assert!(!hold(&dir.path().join("gone")).expect("hold"));
    }

    /// An entry read under a lock of its own (the apt lists) is marked used, not held.
    #[test]
    fn a_touched_entry_is_used_now_and_not_held() {
        let dir = tempfile::tempdir().expect("tempdir");
        let apt = dir.path().join("apt");
        std::fs::create_dir_all(&apt).expect("mkdir");
        let day_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(86_400);
        File::open(&apt)
            .and_then(|f| f.set_modified(day_ago))
            .expect("age it");
        touch(&apt);
        let age = std::fs::metadata(&apt)
            .and_then(|m| m.modified())
            .expect("mtime")
            .elapsed()
            .unwrap_or_default();
        assert!(age < std::time::Duration::from_secs(3600), "{age:?}");
        assert!(!in_use(&apt));
    }
}
