//! Where a patch may write: inside the source tree, never through a symlink. A patch comes
//! from a mailing list, and hvlab journals every path it names before `patch` runs, so a path
//! GNU patch would refuse still reached the journal's restore; every path is checked here
//! first. The lexical rules ([`lexical`]) hold for the patch text alone and run when the spec
//! is parsed, before any download; the tree's own symlinks ([`in_tree`]) are checked right
//! before applying.

use std::collections::BTreeSet;
use std::path::Path;

use hvlab_core::error::Fault;

use super::patch::{FileDiff, PatchFile, SYMLINK_MODE};

/// The directory of hvlab's own state in a source tree (the journal, its markers).
pub const STATE_DIR: &str = ".hvlab";

/// The file modes hvlab lets a patch give: a file, an executable, a symlink.
const MODES: [u32; 3] = [0o100644, 0o100755, SYMLINK_MODE];

// A patch names a path it may not touch; the doc comment is the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, displaydoc::Display)]
/// {patch} is refused: it names `{path}`, {why}. A patch may change files inside the kernel source tree only, never through a symlink, and nothing was applied: fix its paths (`--- a/DIR/FILE`, relative to the top of the tree).
pub struct ConfineError {
    /// The patch file, and the message of a series.
    pub patch: String,
    /// The path as the patch gives it (`-p1` stripped).
    pub path: String,
    /// What is wrong with it.
    pub why: String,
}

impl ConfineError {
    /// The patch names a path it may not touch: the patch's fault, bad input.
    pub fn fault(&self) -> Fault {
        Fault::BadInput
    }
}

/// One diff's names and symlink target, with the label of its patch, for the checks.
struct Named<'a> {
    label: String,
    diff: &'a FileDiff,
}

impl Named<'_> {
    fn refuse(&self, path: &str, why: impl Into<String>) -> ConfineError {
        ConfineError {
            patch: self.label.clone(),
            path: path.to_string(),
            why: why.into(),
        }
    }

    /// The names the diff gives: old and new (both names of a rename or a copy).
    fn names(&self) -> impl Iterator<Item = &str> {
        [self.diff.old.as_deref(), self.diff.new.as_deref()]
            .into_iter()
            .flatten()
    }

    /// The tree path its symlink leads to, resolved against the link's directory.
    fn symlink_target(&self) -> Result<Option<String>, ConfineError> {
        let (Some(link), Some(target)) = (self.diff.new.as_deref(), self.diff.symlink.as_deref())
        else {
            return Ok(None);
        };
        let refuse = |why: String| self.refuse(link, why);
        if target.is_empty() {
            return Err(refuse("a symlink with an empty target".into()));
        }
        if target.starts_with('/') {
            return Err(refuse(format!(
                "a symlink to the absolute path {target}, outside the tree"
            )));
        }
        let mut resolved: Vec<&str> = link.split('/').collect();
        resolved.pop();
        for part in target.split('/') {
            match part {
                "" | "." => {}
                ".." => {
                    if resolved.pop().is_none() {
                        return Err(refuse(format!(
                            "a symlink to {target}, which leads out of the tree"
                        )));
                    }
                }
                name => resolved.push(name),
            }
        }
        let resolved = resolved.join("/");
        if resolved.is_empty() {
            return Err(refuse(format!(
                "a symlink to {target}, the top of the tree itself"
            )));
        }
        if is_state(&resolved) {
            return Err(refuse(format!(
                "a symlink to {target}, into hvlab's own state directory {STATE_DIR}/"
            )));
        }
        Ok(Some(resolved))
    }
}

/// Every diff of `patches`, in the order `patch` applies them.
fn diffs(patches: &[PatchFile]) -> impl Iterator<Item = Named<'_>> {
    patches.iter().flat_map(|file| {
        file.patches
            .iter()
            .enumerate()
            .flat_map(move |(n, message)| {
                message.files.iter().map(move |diff| Named {
                    label: message.label(file, n),
                    diff,
                })
            })
    })
}

/// Whether `path` is in hvlab's own state directory.
fn is_state(path: &str) -> bool {
    path.split('/').next() == Some(STATE_DIR)
}

/// The directories above `path` in the tree, outermost first (`a`, `a/b` for `a/b/c`).
pub fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    path.match_indices('/').map(move |(at, _)| &path[..at])
}

/// Why `path` is not a plain tree-relative path, if it is not one.
pub fn lexical_flaw(path: &str) -> Option<String> {
    if path.is_empty() {
        return Some("an empty path".into());
    }
    if path.starts_with('/') {
        return Some("an absolute path, outside the tree".into());
    }
    if path.chars().any(char::is_control) {
        return Some("a path holding a control character".into());
    }
    for part in path.split('/') {
        match part {
            "" => return Some("a path with an empty component (`//`)".into()),
            "." => return Some("a path with a `.` component".into()),
            ".." => return Some("a path that climbs out with `..`".into()),
            _ => {}
        }
    }
    if is_state(path) {
        return Some(format!(
            "a path in hvlab's own state directory {STATE_DIR}/ (its journal)"
        ));
    }
    None
}

/// Checks what the patch text alone decides, for every patch of a side in order: each
/// path relative, non-empty, without `..`, outside `.hvlab/`; each mode a file's or a
/// symlink's; each symlink's target inside the tree; no path through, and no content diff of,
/// a symlink an earlier diff of the series makes.
pub fn lexical(patches: &[PatchFile]) -> Result<(), ConfineError> {
    let mut made: BTreeSet<String> = BTreeSet::new();
    for named in diffs(patches) {
        for path in named.names() {
            if let Some(why) = lexical_flaw(path) {
                return Err(named.refuse(path, why));
            }
            if let Some(link) = ancestors(path).find(|a| made.contains(*a)) {
                return Err(named.refuse(
                    path,
                    format!(
                        "a path through the symlink {link} an earlier diff of the series makes"
                    ),
                ));
            }
            if made.contains(path) && !named.diff.is_symlink() {
                return Err(named.refuse(
                    path,
                    "the symlink an earlier diff of the series makes: a content diff would write through it",
                ));
            }
        }
        for mode in [named.diff.old_mode, named.diff.new_mode]
            .into_iter()
            .flatten()
        {
            if !MODES.contains(&mode) {
                return Err(named.refuse(
                    named.diff.target(),
                    format!(
                        "the mode {mode:o}; hvlab applies 100644, 100755 and symlinks (120000) only"
                    ),
                ));
            }
        }
        if let Some(resolved) = named.symlink_target()?
            && let Some(link) = ancestors(&resolved)
                .chain([resolved.as_str()])
                .find(|a| made.contains(*a))
        {
            return Err(named.refuse(
                named.diff.target(),
                format!(
                    "a symlink whose target leads through the symlink {link} an earlier diff makes"
                ),
            ));
        }
        if named.diff.new_mode == Some(SYMLINK_MODE)
            && let Some(new) = &named.diff.new
        {
            made.insert(new.clone());
        }
    }
    Ok(())
}

/// What is at `path` in `tree`, without following a symlink: `Some(target)` for a symlink.
fn symlink_at(tree: &Path, path: &str) -> Option<std::path::PathBuf> {
    let meta = std::fs::symlink_metadata(tree.join(path)).ok()?;
    if meta.file_type().is_symlink() {
        std::fs::read_link(tree.join(path)).ok()
    } else {
        None
    }
}

/// Checks `patches` against the symlinks `tree` holds, right before they are applied: no
/// path through one, no content diff of one, no symlink target through one; and the
/// lexical rules ([`lexical`]).
pub fn in_tree(tree: &Path, patches: &[PatchFile]) -> Result<(), ConfineError> {
    lexical(patches)?;
    for named in diffs(patches) {
        for path in named.names() {
            if let Some(link) = ancestors(path).find(|a| symlink_at(tree, a).is_some()) {
                return Err(named.refuse(
                    path,
                    format!("a path through the symlink {link} in the tree"),
                ));
            }
            if let Some(to) = symlink_at(tree, path)
                && !named.diff.is_symlink()
            {
                return Err(named.refuse(
                    path,
                    format!(
                        "a symlink in the tree (to {}), and the diff is not one of a symlink (mode 120000): patch would write through it",
                        to.display()
                    ),
                ));
            }
        }
        if let Some(resolved) = named.symlink_target()?
            && let Some(link) = ancestors(&resolved)
                .chain([resolved.as_str()])
                .find(|a| symlink_at(tree, a).is_some())
        {
            return Err(named.refuse(
                named.diff.target(),
                format!("a symlink whose target leads through the symlink {link} in the tree"),
            ));
        }
    }
    Ok(())
}
