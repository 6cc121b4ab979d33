//! A patched source tree without writing the source: the patch is applied to copies of the
//! files it names, and the sandbox lays what changed over the shared, unpacked tree, read-only
//! ([`crate::kernel::sandbox::View::overlays`]). So the tree every later build of that source
//! starts from is never written after it was unpacked (its checksum holds), two builds of one
//! source need not take turns with its files, and a crash leaves nothing to put back.
//!
//! What changed decides how it is laid: a file whose content or mode changed is bound over
//! the tree's file; a directory whose entries changed (a file added, deleted, renamed, a
//! symlink) gets a copy of its listing (unchanged files hard-linked, its unchanged
//! subdirectories bound back from the tree) bound over it; a new directory comes whole with
//! its parent's listing. Without a sandbox nothing can be laid over anything, and the patch is
//! applied in the tree itself ([`crate::kernel::journal`]).

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::confine;
use super::journal::{self, ApplyError, HunkReport, JournalError};
use super::patch::PatchFile;
use super::sandbox::Sandbox;

/// A patched view of a tree: the binds that lay the patch over it, and where their files
/// live (removed with the build's work directory).
#[derive(Debug, Clone, Default)]
pub struct Overlay {
    /// `(real, seen)` read-only binds, shallowest first.
    pub binds: Vec<(PathBuf, PathBuf)>,
}

/// What is at a path, and for a file its mode.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Absent,
    File { mode: u32 },
    Dir,
    Symlink { target: PathBuf },
}

fn kind_of(path: &Path) -> Result<Kind, JournalError> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Kind::Absent),
        Err(e) => Err(io_err("read", path, e)),
        Ok(m) if m.file_type().is_symlink() => Ok(Kind::Symlink {
            target: std::fs::read_link(path).map_err(|e| io_err("read", path, e))?,
        }),
        Ok(m) if m.is_dir() => Ok(Kind::Dir),
        Ok(m) => Ok(Kind::File {
            mode: m.permissions().mode() & 0o7777,
        }),
    }
}

fn io_err(what: &'static str, path: &Path, err: std::io::Error) -> JournalError {
    JournalError::Io {
        what,
        path: path.to_path_buf(),
        err,
    }
}

/// `a/b/c` → `a/b`; `c` → `` (the top of the tree).
fn parent(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(p, _)| p)
}

fn depth(seen: &Path) -> usize {
    seen.components().count()
}

/// Applies `patches` to copies, under `dir`, of the files of `tree` they name, and returns
/// the overlay that lays the result over `tree`, with the hunks that landed at an offset. The
/// paths are checked first ([`confine::in_tree`]); `source` names the tree in errors. `tree`
/// is only read.
pub fn patched(
    sandbox: &Sandbox,
    tree: &Path,
    patches: &[PatchFile],
    source: &str,
    dir: &Path,
) -> Result<(Overlay, Vec<HunkReport>), ApplyError> {
    confine::in_tree(tree, patches)?;
    let paths = journal::paths(patches);
    let copies = dir.join("patched");
    let tmp = dir.join("tmp");
    for d in [&copies, &tmp] {
        std::fs::create_dir_all(d).map_err(|e| io_err("create", d, e))?;
    }
    copy_named(tree, &copies, &paths)?;
    let hunks = journal::run_patch(sandbox, &copies, &tmp, patches, source, tree)?;
    let overlay = lay(tree, &copies, &paths, dir)?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok((overlay, hunks))
}

/// Stands, in a copied directory, for the tree's entries the patch does not name: GNU patch
/// removes a directory it emptied, which it would not do in the tree.
const OTHERS: &str = ".hvlab-overlay-others";

/// Copies what `tree` holds at each of `paths` (parents first: the set holds every directory
/// above a path) into `copies`: directories, files with their modes, symlinks as symlinks;
/// a directory holding more than the patch names holds [`OTHERS`] too.
fn copy_named(tree: &Path, copies: &Path, paths: &BTreeSet<String>) -> Result<(), JournalError> {
    for p in paths {
        let (from, to) = (tree.join(p), copies.join(p));
        match kind_of(&from)? {
            Kind::Absent => {}
            Kind::Dir => {
                std::fs::create_dir_all(&to).map_err(|e| io_err("create", &to, e))?;
                let others = std::fs::read_dir(&from)
                    .map_err(|e| io_err("read", &from, e))?
                    .flatten()
                    .any(|e| !paths.contains(&format!("{p}/{}", e.file_name().to_string_lossy())));
                if others {
                    std::fs::write(to.join(OTHERS), "").map_err(|e| io_err("create", &to, e))?;
                }
            }
            Kind::File { .. } => {
                std::fs::copy(&from, &to).map_err(|e| io_err("copy", &from, e))?;
            }
            Kind::Symlink { target } => {
                std::os::unix::fs::symlink(&target, &to).map_err(|e| io_err("copy", &from, e))?;
            }
        }
    }
    Ok(())
}

/// What the patch did to each of `paths` (`tree` before, `copies` after): the directories
/// whose listing changed, and the files whose content or mode changed.
fn changes(
    tree: &Path,
    copies: &Path,
    paths: &BTreeSet<String>,
) -> Result<(BTreeSet<String>, BTreeSet<String>), JournalError> {
    let mut listings: BTreeSet<String> = BTreeSet::new();
    let mut files: BTreeSet<String> = BTreeSet::new();
    for p in paths {
        let (before, after) = (kind_of(&tree.join(p))?, kind_of(&copies.join(p))?);
        match (&before, &after) {
            (Kind::File { mode: a }, Kind::File { mode: b }) => {
                let same = a == b
                    && std::fs::read(tree.join(p)).map_err(|e| io_err("read", &tree.join(p), e))?
                        == std::fs::read(copies.join(p))
                            .map_err(|e| io_err("read", &copies.join(p), e))?;
                if !same {
                    files.insert(p.clone());
                }
            }
            (Kind::Dir, Kind::Dir) | (Kind::Absent, Kind::Absent) => {}
            // A symlink cannot be bound over: its directory's listing is laid instead.
            _ if before == after => {}
            _ => {
                listings.insert(parent(p).to_string());
            }
        }
    }
    // Only directories there before and after are laid over; one added or removed is part
    // of its parent's listing, which is in the set already.
    let mut kept = BTreeSet::new();
    for d in listings {
        let there = |root: &Path| -> Result<bool, JournalError> {
            Ok(d.is_empty() || kind_of(&root.join(&d))? == Kind::Dir)
        };
        if there(tree)? && there(copies)? {
            kept.insert(d);
        }
    }
    Ok((kept, files))
}

/// The overlay of what the patch changed, its files under `dir` (`tree/` for listings,
/// `files/` for changed files).
fn lay(
    tree: &Path,
    copies: &Path,
    paths: &BTreeSet<String>,
    dir: &Path,
) -> Result<Overlay, JournalError> {
    let (listings, files) = changes(tree, copies, paths)?;
    let mut binds: Vec<(PathBuf, PathBuf)> = Vec::new();
    let listing_root = dir.join("tree");
    let laid = Laying {
        tree,
        copies,
        paths,
        listings: &listings,
        root: &listing_root,
    };
    // A listing is bound over the tree, unless its parent's is laid too: then it is a real
    // directory in the parent's copy.
    for d in &listings {
        if !d.is_empty() && listings.contains(parent(d)) {
            continue;
        }
        laid.listing(d, &mut binds)?;
        binds.push((listing_root.join(d), tree.join(d)));
    }
    for f in &files {
        // In a listing's copy already.
        if listings.contains(parent(f)) {
            continue;
        }
        let real = dir.join("files").join(f);
        if let Some(up) = real.parent() {
            std::fs::create_dir_all(up).map_err(|e| io_err("create", up, e))?;
        }
        copy_file(&copies.join(f), &real)?;
        binds.push((real, tree.join(f)));
    }
    // Shallowest first: a directory's bind before those laid inside it.
    binds.sort_by_key(|(_, seen)| depth(seen));
    Ok(Overlay { binds })
}

/// Copies a file with its mode.
fn copy_file(from: &Path, to: &Path) -> Result<(), JournalError> {
    std::fs::copy(from, to).map_err(|e| io_err("copy", from, e))?;
    Ok(())
}

/// The inputs of one overlay's listings.
struct Laying<'a> {
    tree: &'a Path,
    copies: &'a Path,
    paths: &'a BTreeSet<String>,
    listings: &'a BTreeSet<String>,
    root: &'a Path,
}

impl Laying<'_> {
    /// Makes `root/d`: the entries of `d` after the patch. Unchanged files are hard links to
    /// the tree's (copies across filesystems), changed ones the patched copies; a listing
    /// below is made the same way, a new directory copied whole, and an unchanged
    /// subdirectory an empty mount point with the tree's own bound over it (into `binds`).
    fn listing(&self, d: &str, binds: &mut Vec<(PathBuf, PathBuf)>) -> Result<(), JournalError> {
        let here = self.root.join(d);
        std::fs::create_dir_all(&here).map_err(|e| io_err("create", &here, e))?;
        let mut names: BTreeSet<std::ffi::OsString> = BTreeSet::new();
        for root in [self.tree, self.copies] {
            if let Ok(rd) = std::fs::read_dir(root.join(d)) {
                names.extend(rd.flatten().map(|e| e.file_name()));
            }
        }
        for name in names {
            let name = name.to_string_lossy().into_owned();
            if name == OTHERS && !self.paths.contains(&format!("{d}/{OTHERS}")) {
                continue;
            }
            let rel = if d.is_empty() {
                name.clone()
            } else {
                format!("{d}/{name}")
            };
            let touched = self.paths.contains(&rel);
            let from = if touched {
                self.copies.join(&rel)
            } else {
                self.tree.join(&rel)
            };
            let to = here.join(&name);
            match kind_of(&from)? {
                Kind::Absent => {}
                Kind::File { .. } if touched => copy_file(&from, &to)?,
                Kind::File { .. } => {
                    if std::fs::hard_link(&from, &to).is_err() {
                        copy_file(&from, &to)?;
                    }
                }
                Kind::Symlink { target } => {
                    std::os::unix::fs::symlink(&target, &to)
                        .map_err(|e| io_err("create", &to, e))?;
                }
                Kind::Dir if self.listings.contains(&rel) => self.listing(&rel, binds)?,
                Kind::Dir if kind_of(&self.tree.join(&rel))? == Kind::Dir => {
                    std::fs::create_dir(&to).map_err(|e| io_err("create", &to, e))?;
                    binds.push((self.tree.join(&rel), self.tree.join(&rel)));
                }
                Kind::Dir => copy_tree(&from, &to)?,
            }
        }
        Ok(())
    }
}

/// Copies a directory the patch made, with everything in it.
fn copy_tree(from: &Path, to: &Path) -> Result<(), JournalError> {
    std::fs::create_dir_all(to).map_err(|e| io_err("create", to, e))?;
    for e in std::fs::read_dir(from)
        .map_err(|e| io_err("read", from, e))?
        .flatten()
    {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        match kind_of(&src)? {
            Kind::Dir => copy_tree(&src, &dst)?,
            Kind::File { .. } => copy_file(&src, &dst)?,
            Kind::Symlink { target } => {
                std::os::unix::fs::symlink(&target, &dst).map_err(|e| io_err("create", &dst, e))?;
            }
            Kind::Absent => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::kernel::journal::tests::{
        ops, patch_file, sandbox, setup_and_diff, snapshot, write,
    };

    /// What a command in the sandbox sees of `tree` with `overlay` laid over it, made as a
    /// copy at `view`: the tree, then each bind in order replacing what it covers (a mount
    /// hides what is under it).
    fn materialize(tree: &Path, overlay: &Overlay, view: &Path) {
        copy_tree(tree, view).expect("copy the tree");
        for (real, seen) in &overlay.binds {
            let rel = seen.strip_prefix(tree).expect("a bind inside the tree");
            let at = view.join(rel);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&at).expect("rm"),
                Ok(_) => std::fs::remove_file(&at).expect("rm"),
                Err(_) => panic!("a bind over nothing: {}", seen.display()),
            }
            if real.is_dir() {
                copy_tree(real, &at).expect("copy the bind");
            } else {
                std::fs::copy(real, &at).expect("copy the bind");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]

        /// Whatever a generated series does with the real GNU patch (renames, copies,
        /// deletions that take a directory, modes, new files in new directories, symlinks),
        /// the overlay shows what the patch applied in place makes, and the tree under it is
        /// not written.
        #[test]
        fn the_overlay_shows_what_the_patch_makes_without_writing_the_tree(
            changes in prop::collection::vec(
                (ops(), prop::collection::vec("[a-z]{1,6}", 1..4)), 1..7),
            top_level in any::<bool>(),
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let tree = dir.path().join("tree");
            write(&tree.join("keep/a.c"), "kept\n");
            write(&tree.join("keep/deep/b.c"), "deeper\n");
            let mut diffs: Vec<String> = changes
                .iter()
                .enumerate()
                .map(|(i, (op, lines))| setup_and_diff(&tree, i, *op, lines))
                .collect();
            if top_level {
                // A file at the top of the tree: the top's own listing is laid.
                diffs.push("diff --git a/NEWS b/NEWS\nnew file mode 100644\n--- /dev/null\n+++ b/NEWS\n@@ -0,0 +1 @@\n+news\n".into());
            }
            let series = [patch_file("series.patch", &diffs.concat())];
            let before = snapshot(&tree);
            let (overlay, _) = patched(&sandbox(), &tree, &series, "the scratch tree", &dir.path().join("work"))
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(snapshot(&tree), before.clone(), "the tree was written");
            // The same series applied in place, for what it should look like.
            let expected = dir.path().join("expected");
            copy_tree(&tree, &expected).expect("copy");
            journal::apply(&sandbox(), &expected, &series, "the copy")
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            let view = dir.path().join("view");
            materialize(&tree, &overlay, &view);
            prop_assert_eq!(snapshot(&view), snapshot(&expected), "{}", diffs.concat());
            prop_assert_ne!(snapshot(&view), before);
        }
    }

    /// A patch that changes one file of a directory binds that file alone; one that adds a
    /// file lays its directory's listing, with the unchanged subdirectories bound back from
    /// the tree.
    #[test]
    fn a_changed_file_is_bound_alone_and_an_added_one_lays_its_directory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = dir.path().join("tree");
        write(&tree.join("arch/x86/kvm/Makefile"), "obj-m += kvm.o\n");
        write(&tree.join("arch/x86/kvm/svm/svm.c"), "int svm;\n");
        write(&tree.join("virt/kvm/kvm_main.c"), "int kvm;\n");
        let change = "--- a/arch/x86/kvm/Makefile\n+++ b/arch/x86/kvm/Makefile\n@@ -1 +1,2 @@\n obj-m += kvm.o\n+X := $(shell true)\n";
        let (o, _) = patched(
            &sandbox(),
            &tree,
            &[patch_file("a.patch", change)],
            "t",
            &dir.path().join("w1"),
        )
        .expect("applies");
        assert_eq!(o.binds.len(), 1, "{o:?}");
        assert_eq!(o.binds[0].1, tree.join("arch/x86/kvm/Makefile"));
        let add = "diff --git a/arch/x86/kvm/new.c b/arch/x86/kvm/new.c\nnew file mode 100644\n--- /dev/null\n+++ b/arch/x86/kvm/new.c\n@@ -0,0 +1 @@\n+int new;\n";
        let (o, _) = patched(
            &sandbox(),
            &tree,
            &[patch_file("b.patch", add)],
            "t",
            &dir.path().join("w2"),
        )
        .expect("applies");
        let seen: Vec<&Path> = o.binds.iter().map(|(_, s)| s.as_path()).collect();
        assert_eq!(
            seen,
            [tree.join("arch/x86/kvm"), tree.join("arch/x86/kvm/svm")]
        );
        assert_eq!(
            o.binds[1].0,
            tree.join("arch/x86/kvm/svm"),
            "bound back from the tree"
        );
        assert!(!tree.join("arch/x86/kvm/new.c").exists());
    }
}
