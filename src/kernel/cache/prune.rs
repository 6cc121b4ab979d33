//! `hvlab cache prune`: the least recently used entries go first, those older than a given
//! age and then as many as it takes to bring the cache under a size; an entry a running hvlab
//! uses is never removed (each is locked for removal first, [`super::hold`]).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::inventory::{Entry, Guarding, Inventory, Kind, inventory};
use super::{CacheError, hold};

/// What to prune.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PruneRequest {
    /// Remove entries until the cache takes at most this (`--keep-size`).
    pub keep_bytes: Option<u64>,
    /// Remove every entry last used longer ago than this (`--older-than`).
    pub older_than: Option<Duration>,
    /// Say what would go, remove nothing (`--dry-run`).
    pub dry_run: bool,
}

/// What a prune did.
#[derive(Debug, Clone, Serialize)]
pub struct Pruned {
    /// The cache's size before, each inode once.
    pub before: u64,
    /// After.
    pub after: u64,
    /// The size asked for.
    pub keep_bytes: Option<u64>,
    /// The age asked for, in seconds.
    pub older_than_s: Option<u64>,
    /// Whether nothing was removed (`--dry-run`).
    pub dry_run: bool,
    /// The entries removed (or, with `--dry-run`, that would be), least recently used first.
    pub removed: Vec<Entry>,
    /// The entries that would have gone but a running hvlab uses.
    pub in_use: Vec<Entry>,
}

/// An inode's size, links, and how many of them the chosen entries hold.
struct Links {
    bytes: u64,
    nlink: u64,
    dir: bool,
    chosen: u64,
}

/// Which entries of `inv` go, in order, and which would have but are in use; `now` in seconds
/// since the epoch. Sizes follow inodes: an entry frees a file only once no other entry links
/// it (a built kernel's hard links to its image).
fn choose(inv: &Inventory, req: &PruneRequest, now: u64) -> (Vec<usize>, Vec<usize>, u64) {
    let mut links: HashMap<(u64, u64), Links> = HashMap::new();
    for e in &inv.entries {
        for (i, _) in &e.inodes {
            links.entry(i.id).or_insert(Links {
                bytes: i.bytes,
                nlink: i.nlink,
                dir: i.dir,
                chosen: 0,
            });
        }
    }
    let mut total = inv.bytes;
    let mut order: Vec<usize> = (0..inv.entries.len())
        .filter(|&i| inv.entries[i].kind != Kind::Kept)
        .collect();
    order.sort_by_key(|&i| (inv.entries[i].last_use, inv.entries[i].kind));
    let mut chosen = Vec::new();
    let mut busy = Vec::new();
    let mut take = |i: usize, total: &mut u64| {
        for (inode, count) in &inv.entries[i].inodes {
            if let Some(l) = links.get_mut(&inode.id) {
                let was_gone = l.dir && l.chosen > 0 || l.chosen >= l.nlink;
                l.chosen += count;
                let gone = l.dir || l.chosen >= l.nlink;
                if gone && !was_gone {
                    *total = total.saturating_sub(l.bytes);
                }
            }
        }
    };
    let too_old = |e: &Entry| {
        req.older_than
            .is_some_and(|age| now.saturating_sub(e.last_use) > age.as_secs())
    };
    for &i in &order {
        let e = &inv.entries[i];
        if !too_old(e) {
            continue;
        }
        if e.in_use {
            busy.push(i);
        } else {
            take(i, &mut total);
            chosen.push(i);
        }
    }
    if let Some(keep) = req.keep_bytes {
        for &i in &order {
            if total <= keep {
                break;
            }
            if chosen.contains(&i) || busy.contains(&i) {
                continue;
            }
            if inv.entries[i].in_use {
                busy.push(i);
            } else {
                take(i, &mut total);
                chosen.push(i);
            }
        }
    }
    (chosen, busy, total)
}

/// Prunes the cache at `cache` as `req` says.
pub fn prune(cache: &Path, req: &PruneRequest) -> Result<Pruned, CacheError> {
    let inv = inventory(cache);
    let now = crate::kernel::now_stamp();
    let (chosen, busy, planned) = choose(&inv, req, now);
    let mut removed = Vec::new();
    let mut in_use: Vec<Entry> = busy.iter().map(|&i| inv.entries[i].clone()).collect();
    for i in chosen {
        let e = &inv.entries[i];
        if req.dry_run {
            removed.push(e.clone());
            continue;
        }
        match remove(e)? {
            true => removed.push(e.clone()),
            // Taken into use since it was listed.
            false => in_use.push(e.clone()),
        }
    }
    let after = if req.dry_run {
        planned
    } else {
        inventory(cache).bytes
    };
    Ok(Pruned {
        before: inv.bytes,
        after,
        keep_bytes: req.keep_bytes,
        older_than_s: req.older_than.map(|d| d.as_secs()),
        dry_run: req.dry_run,
        removed,
        in_use,
    })
}

/// Removes `e` under its lock; `false` when a running hvlab uses it.
fn remove(e: &Entry) -> Result<bool, CacheError> {
    let _locks: Vec<hold::Exclusive> = match &e.guarding {
        Guarding::Never => return Ok(false),
        Guarding::Nothing => Vec::new(),
        Guarding::Pid(pid) => {
            if super::boot_logs::hvlab_alive(*pid) {
                return Ok(false);
            }
            Vec::new()
        }
        Guarding::Dir(dir) => match hold::try_exclusive(dir) {
            Some(l) => vec![l],
            None => return Ok(!dir.exists()),
        },
        Guarding::LockFile(lock) => match hold::try_exclusive(lock) {
            Some(l) => vec![l],
            None => return Ok(false),
        },
        Guarding::Build { lock, dir } => {
            let Some(build) = hold::try_exclusive(lock) else {
                return Ok(false);
            };
            let mut held = vec![build];
            if let Some(dir) = dir {
                match hold::try_exclusive(dir) {
                    Some(l) => held.push(l),
                    None => return Ok(false),
                }
            }
            held
        }
    };
    // A source's record first: a tree without one is unpacked again, never trusted half-gone.
    let mut paths = e.paths.clone();
    paths.sort_by_key(|p| !p.ends_with("source.json"));
    for p in &paths {
        let gone = match std::fs::symlink_metadata(p) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(err) => Err(err),
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(p),
            Ok(_) => std::fs::remove_file(p),
        };
        gone.map_err(|err| CacheError::Io(p.clone(), err))?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use rustix::fs::{FlockOperation, flock};

    use super::*;

    fn file(path: &Path, bytes: usize) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, vec![1u8; bytes]).expect("write");
    }

    /// Sets the last use of `path` to `secs_ago` seconds ago.
    fn aged(path: &Path, secs_ago: u64) {
        let t = std::time::SystemTime::now() - Duration::from_secs(secs_ago);
        std::fs::File::open(path)
            .and_then(|f| f.set_modified(t))
            .expect("set mtime");
    }

    /// A cache with one Debian source, three builds of it of ages 3, 2 and 1 days, and a boot
    /// log of a dead hvlab 5 days old.
    fn cache() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("kbuild/7.3.4+deb13-amd64_7.3.4-1");
        file(&root.join("lock"), 0);
        file(&root.join("source/Makefile"), 4096);
        for (key, days) in [("old", 3), ("mid", 2), ("new", 1)] {
            let b = root.join("builds").join(key);
            file(&b.join("kernel/kvm.ko"), 1024 * 1024);
            aged(&b, days * 86_400);
        }
        let log = dir.path().join("logs/100-7.3.4+deb13-amd64-5000001");
        file(&log.join("console.log"), 4096);
        aged(&log, 5 * 86_400);
        aged(&root.join("source"), 86_400 / 2);
        let builds = root.join("builds");
        (dir, builds)
    }

    /// Under a size, least recently used first; past an age, all older; never an entry held
    /// by another hvlab, nor one of a source whose build lock is taken.
    #[test]
    fn prune_takes_the_least_recently_used_and_leaves_what_another_hvlab_holds() {
        let (dir, builds) = cache();
        let inv = inventory(dir.path());
        let names: Vec<(&str, Kind)> = inv
            .entries
            .iter()
            .map(|e| (e.name.as_str(), e.kind))
            .collect();
        assert_eq!(names.len(), 5, "{names:?}");
        assert!(inv.bytes >= 3 * 1024 * 1024, "{}", inv.bytes);
        // A dry run under 2 MiB: the log (oldest) and the oldest build go.
        let req = PruneRequest {
            keep_bytes: Some(2 * 1024 * 1024 + 64 * 1024),
            older_than: None,
            dry_run: true,
        };
        let p = prune(dir.path(), &req).expect("prune");
        let gone: Vec<&str> = p.removed.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            gone,
            [
                "logs/100-7.3.4+deb13-amd64-5000001",
                "kbuild/7.3.4+deb13-amd64_7.3.4-1/builds/old"
            ]
        );
        assert!(builds.join("old").exists(), "a dry run removes nothing");
        // Another hvlab holds the oldest build (a kab booting it): the next one goes instead.
        let other = std::fs::File::open(builds.join("old")).expect("open");
        flock(&other, FlockOperation::LockShared).expect("shared");
        let p = prune(
            dir.path(),
            &PruneRequest {
                dry_run: false,
                ..req
            },
        )
        .expect("prune");
        assert!(builds.join("old").is_dir(), "the held build was removed");
        assert!(!builds.join("mid").exists());
        assert!(builds.join("new").is_dir());
        assert_eq!(p.in_use.len(), 1, "{:?}", p.in_use);
        assert!(
            p.after < p.before && p.after <= 2 * 1024 * 1024 + 64 * 1024,
            "{p:?}"
        );
        drop(other);
        // A build running on the source (its lock taken): the source stays, whatever its age.
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .open(builds.parent().expect("root").join("lock"))
            .expect("lock");
        flock(&lock, FlockOperation::LockExclusive).expect("exclusive");
        let p = prune(
            dir.path(),
            &PruneRequest {
                keep_bytes: None,
                older_than: Some(Duration::from_secs(3600)),
                dry_run: false,
            },
        )
        .expect("prune");
        let gone: Vec<&str> = p.removed.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            gone,
            [
                "kbuild/7.3.4+deb13-amd64_7.3.4-1/builds/old",
                "kbuild/7.3.4+deb13-amd64_7.3.4-1/builds/new"
            ]
        );
        assert!(
            builds
                .parent()
                .expect("root")
                .join("source/Makefile")
                .is_file()
        );
        assert_eq!(p.in_use.len(), 1, "{:?}", p.in_use);
        assert_eq!(p.in_use[0].kind, Kind::Source);
    }

    /// A built kernel's hard links to its image free nothing until both are gone.
    #[test]
    fn hard_links_shared_by_two_entries_are_freed_with_the_last() {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("kernels/7.3/vmlinuz");
        file(&image, 1024 * 1024);
        let build = dir.path().join("kbuild/x/builds/k/kernel/vmlinuz");
        std::fs::create_dir_all(build.parent().expect("parent")).expect("mkdir");
        std::fs::hard_link(&image, &build).expect("link");
        aged(&dir.path().join("kbuild/x/builds/k"), 100);
        aged(&dir.path().join("kernels/7.3"), 50);
        let inv = inventory(dir.path());
        let (chosen, _, total) = choose(
            &inv,
            &PruneRequest {
                keep_bytes: Some(512 * 1024),
                ..PruneRequest::default()
            },
            crate::kernel::now_stamp(),
        );
        // The build alone frees nothing of the image: the kernel goes too.
        assert_eq!(chosen.len(), 2);
        assert!(total < 64 * 1024, "{total}");
    }
}
