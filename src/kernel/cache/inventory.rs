//! What the cache holds, entry by entry: its kind, what it is, its size on disk, its last use
//! and whether a running hvlab uses it, with how to lock it for removal.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::Serialize;

use super::hold;
use super::layout;
use super::usage::{self, Inode};

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// An unpacked source tree (with its checksum record), or hvlab's clone of a git tree.
    Source,
    /// The output of an unpatched build, reused by the next builds of that source.
    BuildTree,
    /// A kernel built for a side (`builds/KEY`).
    Build,
    /// A Debian kernel image, unpacked.
    Kernel,
    /// A boot's console log and results.
    BootLog,
    /// A build's log.
    BuildLog,
    /// An mbox split into one file per message.
    Series,
    /// Debian's package lists (hvlab's private apt state).
    Apt,
    /// What an interrupted build left, or an older hvlab's layout: no build reads it.
    Leftover,
    /// Calibrated profiles and copies of cover letters: kept, never pruned.
    Kept,
}

/// How an entry is locked before it is removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Guarding {
    /// A shared lock on the directory itself, held by every hvlab that uses it.
    Dir(PathBuf),
    /// The build lock of its source or repository (no build runs), and the source tree's
    /// own hold when given (nobody reads it).
    Build {
        /// `kbuild/R_V/lock`, `git/ID/lock`.
        lock: PathBuf,
        /// The tree held while read.
        dir: Option<PathBuf>,
    },
    /// The lock file of the apt state.
    LockFile(PathBuf),
    /// A boot's log, in use while the hvlab whose pid its name carries runs.
    Pid(u32),
    /// Nothing uses it once written.
    Nothing,
    /// Never removed.
    Never,
}

/// One entry of the cache.
#[derive(Debug, Clone, Serialize)]
pub struct Entry {
    /// What it is.
    pub kind: Kind,
    /// Its main path, relative to the cache.
    pub name: String,
    /// Where it comes from or what it holds, when known: a source's package and version, a
    /// build's source and patches, a kernel's release.
    pub about: Option<String>,
    /// Bytes on disk (each of its inodes once; a hard link shared with another entry counts in
    /// both).
    pub bytes: u64,
    /// Its last use (seconds since the epoch).
    pub last_use: u64,
    /// Whether a running hvlab uses it now.
    pub in_use: bool,
    /// Everything it is made of, absolute.
    #[serde(skip)]
    pub(super) paths: Vec<PathBuf>,
    #[serde(skip)]
    pub(super) guarding: Guarding,
    /// Its inodes, with how many of their links it holds.
    #[serde(skip)]
    pub(super) inodes: Vec<(Inode, u64)>,
}

/// Every entry of a cache, and its size with each inode counted once.
#[derive(Debug, Clone, Serialize)]
pub struct Inventory {
    /// The cache directory.
    pub dir: PathBuf,
    /// The entries, by kind then name.
    pub entries: Vec<Entry>,
    /// Bytes on disk, each inode once.
    pub bytes: u64,
}

/// The inventory of the cache at `cache` (empty when it does not exist).
pub fn inventory(cache: &Path) -> Inventory {
    let mut entries = Vec::new();
    let children = |dir: &Path| -> Vec<(String, PathBuf)> {
        let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .collect();
        out.sort();
        out
    };
    for (top, path) in children(cache) {
        match top.as_str() {
            "kernels" => {
                for (name, p) in children(&path) {
                    if name.ends_with(".tmp") || name.ends_with(".debs") {
                        entries.push(entry(cache, Kind::Leftover, &[p], Guarding::Nothing, None));
                        continue;
                    }
                    let about = std::fs::read_to_string(p.join(".complete"))
                        .ok()
                        .map(|s| s.trim().to_string());
                    entries.push(entry(
                        cache,
                        Kind::Kernel,
                        std::slice::from_ref(&p),
                        Guarding::Dir(p.clone()),
                        about,
                    ));
                }
            }
            "kbuild" => {
                for (_, root) in children(&path) {
                    source_entries(cache, &root, &mut entries);
                }
            }
            "git" => {
                for (_, root) in children(&path) {
                    source_entries(cache, &root, &mut entries);
                }
            }
            "logs" => {
                for (name, p) in children(&path) {
                    let pid = name.rsplit('-').next().and_then(|p| p.parse().ok());
                    let guarding = pid.map_or(Guarding::Nothing, Guarding::Pid);
                    let about = super::boot_logs::release_of(&name);
                    entries.push(entry(cache, Kind::BootLog, &[p], guarding, about));
                }
            }
            "series" => {
                for (_, p) in children(&path) {
                    entries.push(entry(cache, Kind::Series, &[p], Guarding::Nothing, None));
                }
            }
            "sources" => {
                for (name, p) in children(&path) {
                    let kind = if name.ends_with(".tmp") || name.ends_with(".debs") {
                        Kind::Leftover
                    } else {
                        Kind::Source
                    };
                    entries.push(entry(cache, kind, &[p], Guarding::Nothing, Some(name)));
                }
            }
            "apt" => {
                let lock = path.join("lock");
                entries.push(entry(
                    cache,
                    Kind::Apt,
                    &[path],
                    Guarding::LockFile(lock),
                    None,
                ));
            }
            _ => entries.push(entry(cache, Kind::Kept, &[path], Guarding::Never, None)),
        }
    }
    // Each inode once, and each entry's share of the links of its inodes.
    let mut all: HashMap<(u64, u64), u64> = HashMap::new();
    for e in &entries {
        for (i, _) in &e.inodes {
            all.insert(i.id, i.bytes);
        }
    }
    entries.sort_by(|a, b| a.kind.cmp(&b.kind).then(a.name.cmp(&b.name)));
    Inventory {
        dir: cache.to_path_buf(),
        entries,
        bytes: all.values().sum(),
    }
}

/// The entries of one Debian source version (`kbuild/R_V/`) or git repository (`git/ID/`).
fn source_entries(cache: &Path, root: &Path, out: &mut Vec<Entry>) {
    let lock = root.join(layout::LOCK);
    let build = |dir: Option<PathBuf>| Guarding::Build {
        lock: lock.clone(),
        dir,
    };
    let source = root.join(layout::SOURCE);
    let about = super::checksum::recorded(&source).map(|r| r.what);
    let mut rest: Vec<(String, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
        .collect();
    rest.sort();
    let mut source_parts: Vec<PathBuf> = Vec::new();
    for (name, path) in rest {
        match name.as_str() {
            layout::LOCK => {}
            layout::SOURCE | layout::CLONE => source_parts.insert(0, path),
            n if layout::SOURCE_FILES.contains(&n) => source_parts.push(path),
            layout::PREPARED | layout::MODULES_OUT | layout::WHOLE_OUT | layout::GIT_OUT => {
                out.push(entry(
                    cache,
                    Kind::BuildTree,
                    &[path],
                    build(None),
                    about.clone(),
                ));
            }
            layout::BUILDS => {
                for e in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                    let p = e.path();
                    let key = e.file_name().to_string_lossy().into_owned();
                    if key.ends_with(".tmp") {
                        out.push(entry(cache, Kind::Leftover, &[p], build(None), None));
                        continue;
                    }
                    let about = build_about(&p);
                    out.push(entry(
                        cache,
                        Kind::Build,
                        std::slice::from_ref(&p),
                        Guarding::Dir(p.clone()),
                        about,
                    ));
                }
            }
            layout::LOGS => {
                for e in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                    out.push(entry(cache, Kind::BuildLog, &[e.path()], build(None), None));
                }
            }
            // `work/` (an interrupted build's), and what an older hvlab's layout left (a tree
            // built in place, its downloaded packages).
            _ => out.push(entry(cache, Kind::Leftover, &[path], build(None), None)),
        }
    }
    if let Some(first) = source_parts.first().cloned() {
        let is_tree = first.is_dir();
        let guard = build(is_tree.then_some(first));
        out.push(entry(cache, Kind::Source, &source_parts, guard, about));
    }
}

/// A build's source and patches, from its `build.json`.
fn build_about(entry: &Path) -> Option<String> {
    let text = std::fs::read_to_string(entry.join("build.json")).ok()?;
    let info: crate::kernel::build::BuildInfo = serde_json::from_str(&text).ok()?;
    let patches: Vec<&str> = info.patches.iter().map(|p| p.file.as_str()).collect();
    Some(if patches.is_empty() {
        info.source
    } else {
        format!("{} + {}", info.source, patches.join(" + "))
    })
}

/// An entry made of `paths` (the first its name), measured now.
fn entry(
    cache: &Path,
    kind: Kind,
    paths: &[PathBuf],
    guarding: Guarding,
    about: Option<String>,
) -> Entry {
    let mut counts: HashMap<(u64, u64), (Inode, u64)> = HashMap::new();
    for p in paths {
        usage::walk(p, &mut |i| {
            counts.entry(i.id).or_insert((i, 0)).1 += 1;
        });
    }
    let inodes: Vec<(Inode, u64)> = counts.into_values().collect();
    let last_use = paths
        .first()
        .and_then(|p| std::fs::symlink_metadata(p).ok())
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let in_use = guarding.in_use();
    Entry {
        kind,
        name: paths
            .first()
            .and_then(|p| p.strip_prefix(cache).ok())
            .map_or_else(String::new, |p| p.to_string_lossy().into_owned()),
        about,
        bytes: inodes.iter().map(|(i, _)| i.bytes).sum(),
        last_use,
        in_use,
        paths: paths.to_vec(),
        guarding,
        inodes,
    }
}

impl Guarding {
    /// Whether a running hvlab uses the entry now.
    pub(super) fn in_use(&self) -> bool {
        match self {
            Guarding::Dir(dir) => hold::in_use(dir),
            Guarding::Build { lock, dir } => {
                hold::in_use(lock) || dir.as_ref().is_some_and(|d| hold::in_use(d))
            }
            Guarding::LockFile(lock) => hold::in_use(lock),
            Guarding::Pid(pid) => super::boot_logs::hvlab_alive(*pid),
            Guarding::Nothing | Guarding::Never => false,
        }
    }
}
