//! Applying patches to a shared source tree and putting it back. Before `patch` runs, the
//! journal saves the state of every path a patch can touch and of every directory above it
//! in the tree (a file's content and mode, a symlink's target, a directory, or nothing) and
//! is fsynced; [`restore`] puts each one back, whatever `patch` did to it (contents, renames,
//! copies, deletions that took a directory with them, modes, new files in new directories).
//! It records tree-relative paths only, never follows a symlink and never touches a path it
//! did not record (nor the inside of a directory that was not there), and a restore stopped
//! half-way can run again. A tree whose restore fails anyway is marked damaged
//! ([`mark_damaged`]) and unpacked again by the next run that opens it.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hvlab_core::error::Fault;
use serde::{Deserialize, Serialize};

use super::confine::{self, STATE_DIR};
use super::limits::Guard;
use super::patch::{FileDiff, Patch, PatchFile};
use super::sandbox::{Sandbox, View};

/// Why a tree's journal cannot be written or played back.
/// Why a side's patches could not be applied to its tree (the build maps it to its own
/// error; this module names nothing of the build, which calls it).
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum ApplyError {
    /// {0}
    Confined(#[from] confine::ConfineError),
    /// {0}
    Journal(#[from] JournalError),
    /// {patch} does not apply to {against}: {what}. Rebase it onto that source (unpacked in {tree}).
    DoesNotApply {
        /// The patch file, and the message of a series.
        patch: String,
        /// The source it was applied to.
        against: String,
        /// Which hunk of which file, and how it failed.
        what: String,
        /// The unpacked source.
        tree: PathBuf,
    },
    /// Cannot run patch: {0}. Install it: apt-get install patch
    Run(std::io::Error),
}

#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum JournalError {
    /// Cannot {what} {path}: {err}. Free space or fix the permissions under hvlab's cache, then run again.
    Io {
        /// What was being done.
        what: &'static str,
        /// Where.
        path: PathBuf,
        /// The system's error.
        err: std::io::Error,
    },
    /// The journal {0} does not parse ({1}): the tree cannot be put back from it, so it is unpacked again.
    Corrupt(PathBuf, String),
    /// The journal of {tree} names `{path}`, {why}: it is not played back, and the tree is unpacked again.
    Unsafe {
        /// The tree.
        tree: PathBuf,
        /// The path recorded.
        path: String,
        /// Why it is not touched.
        why: String,
    },
    /// {0} holds the journal of a patch not restored yet; restore it before applying another.
    Pending(PathBuf),
}

impl JournalError {
    /// hvlab's own state (the journal of a tree in its cache) failed: never the user's input.
    pub fn fault(&self) -> Fault {
        match self {
            JournalError::Io { .. }
            | JournalError::Corrupt(..)
            | JournalError::Unsafe { .. }
            | JournalError::Pending(_) => Fault::Failed,
        }
    }
}

fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> JournalError + 'a {
    move |err| JournalError::Io {
        what,
        path: path.to_path_buf(),
        err,
    }
}

/// What was at a path before the patch ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
enum State {
    /// A regular file, its content saved as `.hvlab/saved/{saved}`.
    File { mode: u32, saved: usize },
    /// A symlink, its target as bytes (a name need not be UTF-8).
    Symlink { target: Vec<u8> },
    /// A directory.
    Dir { mode: u32 },
    /// Nothing.
    Absent,
}

/// One recorded path.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    /// Relative to the tree.
    path: String,
    #[serde(flatten)]
    state: State,
}

/// The journal file, the saved contents, and the damage marker of `tree`.
fn files(tree: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let state = tree.join(STATE_DIR);
    (
        state.join("journal"),
        state.join("saved"),
        state.join("damaged"),
    )
}

/// The `patch` that applies one message to `tree`, reading it on stdin: `-p1`, no fuzz, no
/// backup or reject files, no version-control checkout, the C locale (its output is parsed).
/// One place, so it can be run in a sandbox, where it may write `tree` and `tmp` (its
/// `TMPDIR`, where it keeps its copy of the input) alone.
pub fn patch_command(sandbox: &Sandbox, tree: &Path, tmp: &Path) -> Command {
    // In the sandbox: a patch is untrusted, and whatever GNU patch does with its names, it can
    // write nothing but the tree.
    let view = View::writing(&[tree, tmp], Some(tmp));
    let mut command = sandbox.command("patch", &view, &Guard::unlimited());
    command
        .args([
            "-p1",
            // Every context line must match, as with `git am`: a hunk placed by fuzz may land
            // in the wrong function, and A and B must differ by this patch.
            "--fuzz=0",
            "--forward",
            "--batch",
            "--no-backup-if-mismatch",
            "--reject-file=-",
            // Never check a file out of RCS or SCCS (PATCH_GET): that runs other programs.
            "--get=0",
            "-d",
        ])
        .arg(tree)
        // Only what patch needs: POSIXLY_CORRECT would make it read `Index:` lines, and
        // PATCH_GET or VERSION_CONTROL change what it writes.
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("LC_ALL", "C")
        .env("TMPDIR", tmp)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Every path the diffs of `patches` can touch, and every directory above one in the tree.
pub(crate) fn paths(patches: &[PatchFile]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for diff in patches
        .iter()
        .flat_map(|p| &p.patches)
        .flat_map(|m| &m.files)
    {
        for name in [&diff.old, &diff.new].into_iter().flatten() {
            out.extend(confine::ancestors(name).map(str::to_string));
            out.insert(name.clone());
        }
    }
    out
}

/// Opens a regular file without following a symlink.
fn open_nofollow(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Writes `path` from `from` and fsyncs it.
fn write_synced(path: &Path, from: &mut impl std::io::Read) -> Result<(), JournalError> {
    let mut out = File::create(path).map_err(io_err("write", path))?;
    std::io::copy(from, &mut out).map_err(io_err("write", path))?;
    out.sync_all().map_err(io_err("fsync", path))
}

/// Saves the state of every path `patches` can touch in `tree`, and writes the journal,
/// fsynced, so a crash from here on leaves what [`restore`] needs.
fn record(tree: &Path, patches: &[PatchFile]) -> Result<(), JournalError> {
    let (journal, saved, _) = files(tree);
    if journal.exists() {
        return Err(JournalError::Pending(journal));
    }
    // Saved contents without a journal are a crash's leftovers before its journal was written.
    if saved.exists() {
        std::fs::remove_dir_all(&saved).map_err(io_err("remove", &saved))?;
    }
    std::fs::create_dir_all(&saved).map_err(io_err("create", &saved))?;
    let mut entries = Vec::new();
    for path in paths(patches) {
        let at = tree.join(&path);
        let state = match std::fs::symlink_metadata(&at) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::Absent,
            Err(e) => return Err(io_err("read", &at)(e)),
            Ok(meta) if meta.file_type().is_symlink() => State::Symlink {
                target: std::fs::read_link(&at)
                    .map_err(io_err("read the symlink", &at))?
                    .as_os_str()
                    .as_bytes()
                    .to_vec(),
            },
            Ok(meta) if meta.is_dir() => State::Dir {
                mode: meta.permissions().mode() & 0o7777,
            },
            Ok(meta) if meta.is_file() => {
                let n = entries.len();
                let mut original = open_nofollow(&at).map_err(io_err("read", &at))?;
                write_synced(&saved.join(n.to_string()), &mut original)?;
                State::File {
                    mode: meta.permissions().mode() & 0o7777,
                    saved: n,
                }
            }
            Ok(_) => {
                return Err(JournalError::Unsafe {
                    tree: tree.to_path_buf(),
                    path,
                    why: "neither a file, a directory nor a symlink".into(),
                });
            }
        };
        entries.push(Entry { path, state });
    }
    let text = serde_json::to_string_pretty(&entries)
        .map_err(|e| io_err("write", &journal)(std::io::Error::other(e)))?;
    let tmp = journal.with_extension("tmp");
    write_synced(&tmp, &mut text.as_bytes())?;
    std::fs::rename(&tmp, &journal).map_err(io_err("write", &journal))?;
    let state_dir = tree.join(STATE_DIR);
    File::open(&state_dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync", &state_dir))
}

/// Applies each message of `patches` in order (`patch -p1`), after checking every path it
/// names ([`confine::in_tree`]) and journalling them. The hunks that landed at an offset are
/// returned. Whatever it returns, [`restore`] puts the tree back.
pub fn apply(
    sandbox: &Sandbox,
    tree: &Path,
    patches: &[PatchFile],
    source: &str,
) -> Result<Vec<HunkReport>, ApplyError> {
    confine::in_tree(tree, patches)?;
    record(tree, patches)?;
    let tmp = tree.join(STATE_DIR).join("tmp");
    std::fs::create_dir_all(&tmp).map_err(io_err("create", &tmp))?;
    let applied = run_patch(sandbox, tree, &tmp, patches, source, tree);
    let _ = std::fs::remove_dir_all(&tmp);
    applied
}

/// Runs GNU patch for each message of `patches` on `dir` (its temporary files in `tmp`); a
/// message that does not apply is named against `source`, unpacked in `tree`.
pub(crate) fn run_patch(
    sandbox: &Sandbox,
    dir: &Path,
    tmp: &Path,
    patches: &[PatchFile],
    source: &str,
    tree: &Path,
) -> Result<Vec<HunkReport>, ApplyError> {
    let mut notes = Vec::new();
    for p in patches {
        for (n, message) in p.patches.iter().enumerate() {
            let name = message.label(p, n);
            let mut child = patch_command(sandbox, dir, tmp)
                .spawn()
                .map_err(patch_failed)?;
            if let Some(mut stdin) = child.stdin.take() {
                stdin
                    .write_all(message.diff_text().as_bytes())
                    .map_err(patch_failed)?;
            }
            let out = child.wait_with_output().map_err(patch_failed)?;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            if !out.status.success() {
                return Err(ApplyError::DoesNotApply {
                    patch: name,
                    against: source.to_string(),
                    what: why_not_applied(&text, message),
                    tree: tree.to_path_buf(),
                });
            }
            notes.extend(offsets(&text, &name));
        }
    }
    Ok(notes)
}

/// `patch` could not be run.
fn patch_failed(e: std::io::Error) -> ApplyError {
    ApplyError::Run(e)
}

/// What is at `path`, without following a symlink; `None` when nothing is.
fn kind_at(path: &Path) -> Result<Option<std::fs::FileType>, JournalError> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) => Ok(Some(meta.file_type())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", path)(e)),
    }
}

/// Whether every directory above `path` in `tree` is a real directory (not a symlink).
fn real_dirs_above(tree: &Path, path: &str) -> Result<bool, JournalError> {
    for dir in confine::ancestors(path) {
        if !kind_at(&tree.join(dir))?.is_some_and(|k| k.is_dir()) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Removes whatever is at `at` (a directory with what it holds), not following a symlink.
fn remove(at: &Path, kind: std::fs::FileType) -> Result<(), JournalError> {
    if kind.is_dir() {
        // Not there before the patch: everything inside was made since (a new file, its
        // build products). std's remove_dir_all never follows a symlink.
        std::fs::remove_dir_all(at).map_err(io_err("remove", at))
    } else {
        std::fs::remove_file(at).map_err(io_err("remove", at))
    }
}

/// Reads and checks the journal of `tree`: `None` when there is none.
fn entries(tree: &Path) -> Result<Option<Vec<Entry>>, JournalError> {
    let (journal, _, _) = files(tree);
    let text = match std::fs::read_to_string(&journal) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("read", &journal)(e)),
    };
    let entries: Vec<Entry> = serde_json::from_str(&text)
        .map_err(|e| JournalError::Corrupt(journal.clone(), e.to_string()))?;
    for e in &entries {
        if let Some(why) = confine::lexical_flaw(&e.path) {
            return Err(JournalError::Unsafe {
                tree: tree.to_path_buf(),
                path: e.path.clone(),
                why,
            });
        }
    }
    Ok(Some(entries))
}

/// Puts back every path the journal of `tree` recorded, then drops the journal; nothing to
/// do without one. Restored files are written anew, so their mtime is fresh and make
/// rebuilds what they feed.
pub fn restore(tree: &Path) -> Result<(), JournalError> {
    restore_steps(tree, usize::MAX).map(|_| ())
}

/// [`restore`], stopped after `budget` steps (a crash, in tests); whether it finished.
fn restore_steps(tree: &Path, mut budget: usize) -> Result<bool, JournalError> {
    let Some(mut entries) = entries(tree)? else {
        return Ok(true);
    };
    let (journal, saved, _) = files(tree);
    let depth = |e: &Entry| e.path.matches('/').count();
    // Deepest first: what the patch left is cleared from the leaves up.
    entries.sort_by(|a, b| depth(b).cmp(&depth(a)).then(b.path.cmp(&a.path)));
    for e in &entries {
        if budget == 0 {
            return Ok(false);
        }
        budget -= 1;
        // Under a symlink or a file, nothing of the tree's own is to be touched; the path
        // above is recorded too and is cleared on its own turn.
        if !real_dirs_above(tree, &e.path)? {
            continue;
        }
        let at = tree.join(&e.path);
        let Some(kind) = kind_at(&at)? else {
            continue;
        };
        let clear = match e.state {
            State::Dir { .. } => !kind.is_dir(),
            // A file is replaced by a rename, unless a directory took its place.
            State::File { .. } => kind.is_dir(),
            State::Symlink { .. } | State::Absent => true,
        };
        if clear {
            remove(&at, kind)?;
        }
    }
    // Shallowest first: each directory is back before what it holds.
    entries.reverse();
    for e in &entries {
        if budget == 0 {
            return Ok(false);
        }
        budget -= 1;
        if e.state == State::Absent {
            continue;
        }
        if !real_dirs_above(tree, &e.path)? {
            return Err(JournalError::Unsafe {
                tree: tree.to_path_buf(),
                path: e.path.clone(),
                why: "a path a directory above which is not one after the restore".into(),
            });
        }
        let at = tree.join(&e.path);
        match &e.state {
            State::Absent => {}
            State::Dir { mode } => {
                if kind_at(&at)?.is_none() {
                    std::fs::create_dir(&at).map_err(io_err("create", &at))?;
                }
                std::fs::set_permissions(&at, std::fs::Permissions::from_mode(*mode))
                    .map_err(io_err("set the mode of", &at))?;
            }
            State::File { mode, saved: n } => {
                let from = saved.join(n.to_string());
                let tmp = tree.join(STATE_DIR).join("restoring");
                let mut original = open_nofollow(&from).map_err(io_err("read", &from))?;
                write_synced(&tmp, &mut original)?;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(*mode))
                    .map_err(io_err("set the mode of", &tmp))?;
                // A rename replaces a file or a symlink itself, never what a link leads to.
                std::fs::rename(&tmp, &at).map_err(io_err("restore", &at))?;
            }
            State::Symlink { target } => {
                if let Some(kind) = kind_at(&at)? {
                    remove(&at, kind)?;
                }
                let target = std::ffi::OsStr::from_bytes(target);
                std::os::unix::fs::symlink(target, &at).map_err(io_err("restore", &at))?;
            }
        }
    }
    std::fs::remove_file(&journal).map_err(io_err("remove", &journal))?;
    std::fs::remove_dir_all(&saved).map_err(io_err("remove", &saved))?;
    Ok(true)
}

/// Marks `tree` damaged: a restore failed (`why`), so the next run unpacks it again.
pub fn mark_damaged(tree: &Path, why: &str) {
    let (_, _, damaged) = files(tree);
    // When even this fails, the journal left in place still says the tree is not clean.
    let _ = std::fs::write(damaged, why);
}

/// Checks `tree` is clean before use: a journal a crash left is played back. `Err(why)` when
/// the tree is damaged (marked so, or its journal does not play back) and must be unpacked
/// again.
pub fn recover(tree: &Path) -> Result<(), String> {
    let (_, _, damaged) = files(tree);
    if let Ok(why) = std::fs::read_to_string(&damaged) {
        return Err(why);
    }
    restore(tree).map_err(|e| e.to_string())
}

/// From `patch`'s output: which file and hunk failed, and how.
pub(super) fn why_not_applied(output: &str, message: &Patch) -> String {
    let mut target = String::new();
    for line in output.lines() {
        if let Some(f) = line.strip_prefix("patching file ") {
            target = f.trim().trim_matches('\'').to_string();
        }
        if line.starts_with("can't find file to patch") || line.contains("No file to patch") {
            let missing = message
                .files
                .iter()
                .map(FileDiff::target)
                .find(|f| !output.contains(&format!("patching file {f}")))
                .unwrap_or("a file it names");
            return format!("its target {missing} does not exist in that source");
        }
        if line.contains("Reversed (or previously applied) patch detected") {
            return format!("{target} already has this change (the patch is applied, or reversed)");
        }
        if let Some(rest) = line.strip_prefix("Hunk #")
            && let Some((n, tail)) = rest.split_once(' ')
            && tail.starts_with("FAILED")
        {
            let header = n
                .parse::<usize>()
                .ok()
                .and_then(|n| {
                    message
                        .files
                        .iter()
                        .find(|f| f.target() == target)
                        .and_then(|f| f.hunks.get(n.saturating_sub(1)))
                })
                .map_or(String::new(), |h| format!(" `{}`", h.header));
            let at = tail
                .trim_start_matches("FAILED")
                .trim()
                .trim_end_matches('.');
            return format!(
                "hunk #{n}{header} of {target} does not match the source ({at}; every context line must match, no fuzz)"
            );
        }
    }
    let last: Vec<&str> = output.lines().rev().take(3).collect();
    format!(
        "patch failed: {}",
        last.into_iter().rev().collect::<Vec<_>>().join(" / ")
    )
}

/// A hunk `patch` applied, but not where the diff put it: its line of `patch`'s output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HunkReport {
    /// The patch (or message) it belongs to.
    pub patch: String,
    /// The file it changes.
    pub file: String,
    /// `patch`'s line, its full stop dropped (`Hunk #1 succeeded at 6073 (offset 3 lines)`).
    pub line: String,
}

/// `Hunk #1 succeeded at 6073 (offset 3 lines).`: worth saying beside the verdict.
pub(super) fn offsets(output: &str, name: &str) -> Vec<HunkReport> {
    let mut target = String::new();
    let mut out = Vec::new();
    for line in output.lines() {
        if let Some(f) = line.strip_prefix("patching file ") {
            target = f.trim().trim_matches('\'').to_string();
        }
        if line.starts_with("Hunk #") && line.contains(" succeeded at ") {
            out.push(HunkReport {
                patch: name.to_string(),
                file: target.clone(),
                line: line.trim_end_matches('.').to_string(),
            });
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;
    use std::os::unix::fs::symlink;

    use proptest::prelude::*;

    use super::*;
    use crate::kernel::build::BuildError;

    /// [`apply`] in the sandbox the tests use, its error as a build reports it.
    fn applied(tree: &Path, p: &[PatchFile], source: &str) -> Result<Vec<HunkReport>, BuildError> {
        apply(&sandbox(), tree, p, source).map_err(BuildError::from)
    }
    use crate::error::fault_exit_code;
    use crate::kernel::patch;
    use crate::kernel::sandbox::SandboxPolicy;

    /// Patches run as kab runs them: in bubblewrap where it works here (CI installs it),
    /// else unconfined, so the path rules are tested either way.
    pub(crate) fn sandbox() -> Sandbox {
        Sandbox::detect()
            .or_else(|_| Sandbox::choose(SandboxPolicy::OFF))
            .expect("no sandbox is always possible")
    }

    /// Everything of a directory a restore must put back, by path: each directory and its
    /// mode, each file's mode and content, each symlink's target (hvlab's `.hvlab/` aside).
    pub(crate) fn snapshot(root: &Path) -> BTreeMap<String, String> {
        fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
            let mut names: Vec<_> = std::fs::read_dir(dir)
                .expect("read_dir")
                .map(|e| e.expect("entry").path())
                .collect();
            names.sort();
            for path in names {
                let rel = path
                    .strip_prefix(root)
                    .expect("inside")
                    .to_string_lossy()
                    .into_owned();
                if rel == STATE_DIR {
                    continue;
                }
                let meta = std::fs::symlink_metadata(&path).expect("lstat");
                let mode = meta.permissions().mode() & 0o7777;
                let what = if meta.file_type().is_symlink() {
                    format!(
                        "link {}",
                        std::fs::read_link(&path).expect("link").display()
                    )
                } else if meta.is_dir() {
                    walk(root, &path, out);
                    format!("dir {mode:o}")
                } else {
                    let bytes = std::fs::read(&path).expect("read");
                    format!("file {mode:o} {}", patch::sha256_hex(&bytes))
                };
                out.insert(rel, what);
            }
        }
        let mut out = BTreeMap::new();
        walk(root, root, &mut out);
        out
    }

    pub(crate) fn write(path: &Path, text: &str) {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("mkdir");
        }
        std::fs::write(path, text).expect("write");
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }

    pub(crate) fn patch_file(name: &str, text: &str) -> PatchFile {
        let path = PathBuf::from(name);
        PatchFile {
            patches: patch::parse(&path, text).expect("the test's patch parses"),
            sha256: patch::sha256_hex(text.as_bytes()),
            path,
        }
    }

    /// One change a generated patch makes, each to its own directory `d{i}/` holding `f`.
    #[derive(Debug, Clone, Copy)]
    pub(crate) enum Op {
        Modify,
        /// `d{i}/f` is its directory's only file: patch removes the directory too.
        Delete,
        /// Hunk-less, into new directories.
        Rename,
        Copy,
        Mode,
        NewFileInNewDirs,
        NewSymlink,
        DeleteSymlink,
        SymlinkRetarget,
    }

    pub(crate) fn ops() -> impl Strategy<Value = Op> {
        prop_oneof![
            Just(Op::Modify),
            Just(Op::Delete),
            Just(Op::Rename),
            Just(Op::Copy),
            Just(Op::Mode),
            Just(Op::NewFileInNewDirs),
            Just(Op::NewSymlink),
            Just(Op::DeleteSymlink),
            Just(Op::SymlinkRetarget),
        ]
    }

    /// Sets up `d{i}/` for `op` in `tree` and returns the git diff that makes it.
    pub(crate) fn setup_and_diff(tree: &Path, i: usize, op: Op, lines: &[String]) -> String {
        let old: String = lines.iter().map(|l| format!("{l}\n")).collect();
        write(&tree.join(format!("d{i}/f")), &old);
        let minus: String = lines.iter().map(|l| format!("-{l}\n")).collect();
        let n = lines.len();
        let f = format!("d{i}/f");
        match op {
            Op::Modify => format!(
                "diff --git a/{f} b/{f}\n--- a/{f}\n+++ b/{f}\n@@ -1,{n} +1,1 @@\n{minus}+changed\n"
            ),
            Op::Delete => format!(
                "diff --git a/{f} b/{f}\ndeleted file mode 100644\n--- a/{f}\n+++ /dev/null\n@@ -1,{n} +0,0 @@\n{minus}"
            ),
            Op::Rename => format!(
                "diff --git a/{f} b/r{i}/deep/g\nsimilarity index 100%\nrename from {f}\nrename to r{i}/deep/g\n"
            ),
            Op::Copy => format!(
                "diff --git a/{f} b/c{i}/h\nsimilarity index 100%\ncopy from {f}\ncopy to c{i}/h\n"
            ),
            Op::Mode => format!("diff --git a/{f} b/{f}\nold mode 100644\nnew mode 100755\n"),
            Op::NewFileInNewDirs => format!(
                "diff --git a/n{i}/x/y.c b/n{i}/x/y.c\nnew file mode 100644\n--- /dev/null\n+++ b/n{i}/x/y.c\n@@ -0,0 +1,1 @@\n+new\n"
            ),
            Op::NewSymlink => format!(
                "diff --git a/d{i}/l b/d{i}/l\nnew file mode 120000\n--- /dev/null\n+++ b/d{i}/l\n@@ -0,0 +1 @@\n+f\n\\ No newline at end of file\n"
            ),
            Op::DeleteSymlink | Op::SymlinkRetarget => {
                symlink("f", tree.join(format!("d{i}/s"))).expect("symlink");
                if matches!(op, Op::DeleteSymlink) {
                    format!(
                        "diff --git a/d{i}/s b/d{i}/s\ndeleted file mode 120000\n--- a/d{i}/s\n+++ /dev/null\n@@ -1 +0,0 @@\n-f\n\\ No newline at end of file\n"
                    )
                } else {
                    write(&tree.join(format!("d{i}/g")), "g\n");
                    format!(
                        "diff --git a/d{i}/s b/d{i}/s\nindex 1111111..2222222 120000\n--- a/d{i}/s\n+++ b/d{i}/s\n@@ -1 +1 @@\n-f\n\\ No newline at end of file\n+g\n\\ No newline at end of file\n"
                    )
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever a generated series does with the real GNU patch (renames, copies,
        /// deletions that take a directory, modes, new files in new directories, symlinks),
        /// the restore puts the tree back exactly, also when it is stopped part-way and run
        /// again.
        #[test]
        fn a_restore_undoes_whatever_the_patch_did(
            changes in prop::collection::vec(
                (ops(), prop::collection::vec("[a-z]{1,6}", 1..4)), 1..7),
            split in 0usize..7,
            stop in 0usize..40,
        ) {
            let dir = tempfile::tempdir().expect("tempdir");
            let tree = dir.path();
            write(&tree.join("keep/a.c"), "kept\n");
            let diffs: Vec<String> = changes
                .iter()
                .enumerate()
                .map(|(i, (op, lines))| setup_and_diff(tree, i, *op, lines))
                .collect();
            let split = split.min(diffs.len());
            let series: Vec<PatchFile> = [&diffs[..split], &diffs[split..]]
                .into_iter()
                .filter(|part| !part.is_empty())
                .enumerate()
                .map(|(n, part)| patch_file(&format!("{n}.patch"), &part.concat()))
                .collect();
            let before = snapshot(tree);
            let applied = applied(tree, &series, "the scratch tree");
            prop_assert!(applied.is_ok(), "{:?}\n{}", applied.err().map(|e| e.to_string()), diffs.concat());
            let patched = snapshot(tree);
            prop_assert_ne!(&patched, &before, "the patch changed nothing:\n{}", diffs.concat());
            let finished = restore_steps(tree, stop).expect("the interrupted restore");
            if !finished {
                restore(tree).expect("the restore run again");
            }
            prop_assert_eq!(snapshot(tree), before, "{}", diffs.concat());
            prop_assert!(!tree.join(".hvlab/journal").exists());
            // Idempotent: nothing left to do, nothing changes.
            restore(tree).expect("a second restore");
        }
    }

    /// A scratch tree and, beside it, a victim directory the patch must never reach.
    struct Scene {
        _dir: tempfile::TempDir,
        tree: PathBuf,
        victim: PathBuf,
    }

    fn scene() -> Scene {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = dir.path().join("tree");
        let victim = dir.path().join("victim");
        write(&victim.join("v"), "secret\n");
        write(&tree.join("sub/x"), "x\n");
        write(&tree.join("d/f"), "f\n");
        Scene {
            _dir: dir,
            tree,
            victim,
        }
    }

    /// `text` is refused with exit 2, naming the patch and `path`; neither the tree nor the
    /// victim changes, and no journal is left.
    fn assert_refused(s: &Scene, text: &str, path: &str) {
        let (tree, victim) = (snapshot(&s.tree), snapshot(&s.victim));
        let p = [patch_file("hostile.patch", text)];
        let e = confine::lexical(&p)
            .map_err(BuildError::from)
            .and_then(|()| applied(&s.tree, &p, "the scratch tree"))
            .expect_err("a hostile patch is refused");
        let message = e.to_string();
        assert_eq!(fault_exit_code(e.fault()), 2, "{message}");
        assert!(matches!(e, BuildError::Confined(_)), "{message}");
        assert!(
            message.contains("hostile.patch is refused") && message.contains(&format!("`{path}`")),
            "{message}"
        );
        assert_eq!(snapshot(&s.tree), tree, "{message}");
        assert_eq!(snapshot(&s.victim), victim, "{message}");
        assert!(!s.tree.join(".hvlab/journal").exists());
    }

    #[test]
    fn an_absolute_path_is_refused_and_nothing_outside_is_touched() {
        let s = scene();
        let v = s.victim.join("v").display().to_string();
        let text = format!("--- a/{v}\n+++ b/{v}\n@@ -1 +1 @@\n-secret\n+owned\n");
        assert_refused(&s, &text, &v);
    }

    #[test]
    fn climbing_out_with_dot_dot_is_refused_also_when_quoted() {
        let s = scene();
        let text = "--- a/../victim/v\n+++ b/../victim/v\n@@ -1 +1 @@\n-secret\n+owned\n";
        assert_refused(&s, text, "../victim/v");
        // `\057` is `/`: decoded before the check.
        let text = "diff --git \"a/..\\057victim/v\" \"b/..\\057victim/v\"\n--- \"a/..\\057victim/v\"\n+++ \"b/..\\057victim/v\"\n@@ -1 +1 @@\n-secret\n+owned\n";
        assert_refused(&s, text, "../victim/v");
    }

    #[test]
    fn a_symlink_made_then_written_through_is_refused() {
        let s = scene();
        let text = "diff --git a/lnk b/lnk\nnew file mode 120000\n--- /dev/null\n+++ b/lnk\n@@ -0,0 +1 @@\n+sub\n\\ No newline at end of file\ndiff --git a/lnk/x b/lnk/x\n--- a/lnk/x\n+++ b/lnk/x\n@@ -1 +1 @@\n-x\n+owned\n";
        assert_refused(&s, text, "lnk/x");
    }

    #[test]
    fn a_symlink_whose_target_leads_out_is_refused() {
        let s = scene();
        let text = "diff --git a/d/evil b/d/evil\nnew file mode 120000\n--- /dev/null\n+++ b/d/evil\n@@ -0,0 +1 @@\n+../../victim/v\n\\ No newline at end of file\n";
        assert_refused(&s, text, "d/evil");
        let text = "diff --git a/evil b/evil\nnew file mode 120000\n--- /dev/null\n+++ b/evil\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n";
        assert_refused(&s, text, "evil");
    }

    #[test]
    fn an_existing_symlink_is_neither_gone_through_nor_written_through() {
        let s = scene();
        symlink(&s.victim, s.tree.join("out")).expect("symlink");
        symlink(s.victim.join("v"), s.tree.join("v")).expect("symlink");
        let text = "--- a/out/v\n+++ b/out/v\n@@ -1 +1 @@\n-secret\n+owned\n";
        assert_refused(&s, text, "out/v");
        let text = "--- a/v\n+++ b/v\n@@ -1 +1 @@\n-secret\n+owned\n";
        assert_refused(&s, text, "v");
    }

    #[test]
    fn hvlabs_own_state_and_odd_modes_are_refused() {
        let s = scene();
        let text = "--- /dev/null\n+++ b/.hvlab/journal\n@@ -0,0 +1 @@\n+[]\n";
        assert_refused(&s, text, ".hvlab/journal");
        let text = "diff --git a/d/f b/d/f\nold mode 100644\nnew mode 104755\n";
        assert_refused(&s, text, "d/f");
    }

    /// Was: the rename was never journalled (lost at the next `diff --git`), so never undone.
    #[test]
    fn a_rename_only_diff_followed_by_another_is_undone() {
        let s = scene();
        let before = snapshot(&s.tree);
        let text = "diff --git a/sub/x b/moved/x\nsimilarity index 100%\nrename from sub/x\nrename to moved/x\ndiff --git a/d/f b/d/f\n--- a/d/f\n+++ b/d/f\n@@ -1 +1 @@\n-f\n+g\n";
        let p = [patch_file("rename.patch", text)];
        applied(&s.tree, &p, "the scratch tree").expect("applies");
        assert!(s.tree.join("moved/x").is_file() && !s.tree.join("sub").exists());
        restore(&s.tree).expect("restores");
        assert_eq!(snapshot(&s.tree), before);
    }

    /// Was: patch removed the emptied directory and the restore failed, for good.
    #[test]
    fn deleting_a_directorys_only_file_is_undone() {
        let s = scene();
        let before = snapshot(&s.tree);
        let text = "diff --git a/d/f b/d/f\ndeleted file mode 100644\n--- a/d/f\n+++ /dev/null\n@@ -1 +0,0 @@\n-f\n";
        let p = [patch_file("delete.patch", text)];
        applied(&s.tree, &p, "the scratch tree").expect("applies");
        assert!(!s.tree.join("d").exists());
        restore(&s.tree).expect("restores");
        assert_eq!(snapshot(&s.tree), before);
    }

    /// A patch that fails half-way is undone too; a second apply before a restore is refused.
    #[test]
    fn a_patch_that_fails_half_way_is_undone() {
        let s = scene();
        let before = snapshot(&s.tree);
        let text = "--- a/d/f\n+++ b/d/f\n@@ -1 +1 @@\n-f\n+g\n--- a/sub/x\n+++ b/sub/x\n@@ -1 +1 @@\n-not there\n+y\n";
        let p = [patch_file("half.patch", text)];
        let e = applied(&s.tree, &p, "the scratch tree").expect_err("the second hunk fails");
        assert!(e.to_string().contains("hunk #1"), "{e}");
        assert_ne!(snapshot(&s.tree), before);
        let again = applied(&s.tree, &p, "the scratch tree").expect_err("a journal is pending");
        assert!(
            matches!(again, BuildError::Journal(JournalError::Pending(_))),
            "{again}"
        );
        restore(&s.tree).expect("restores");
        assert_eq!(snapshot(&s.tree), before);
    }

    /// A journal that does not play back says why, and so does a tree marked damaged:
    /// `SourceCache::unpacked` then unpacks it again.
    #[test]
    fn a_tree_that_cannot_be_put_back_is_reported_damaged() {
        let s = scene();
        assert_eq!(recover(&s.tree), Ok(()));
        std::fs::create_dir_all(s.tree.join(STATE_DIR)).expect("mkdir");
        // hvlab's earlier journal format, or a torn write.
        std::fs::write(s.tree.join(".hvlab/journal"), "saved\td/f\n").expect("write");
        let why = recover(&s.tree).expect_err("does not parse");
        assert!(why.contains("does not parse"), "{why}");
        let forged = r#"[{"path": "../victim/v", "state": "absent"}]"#;
        std::fs::write(s.tree.join(".hvlab/journal"), forged).expect("write");
        let why = recover(&s.tree).expect_err("a path outside");
        assert!(why.contains("climbs out"), "{why}");
        assert!(s.victim.join("v").is_file());
        std::fs::remove_file(s.tree.join(".hvlab/journal")).expect("rm");
        mark_damaged(&s.tree, "a restore failed");
        assert_eq!(recover(&s.tree), Err("a restore failed".to_string()));
    }

    /// Builds, from a diff's own context, the files it expects.
    fn tree_for(tree: &Path, p: &PatchFile) {
        for diff in p.patches.iter().flat_map(|m| &m.files) {
            let Some(old) = &diff.old else { continue };
            let mut lines: Vec<String> = Vec::new();
            let mut hunks = diff.hunks.iter();
            let mut inside = false;
            for line in diff.text.lines() {
                if line.starts_with("@@ ") {
                    let start = hunks.next().expect("a hunk per header").old_start;
                    while lines.len() + 1 < start {
                        lines.push(format!("filler {}", lines.len()));
                    }
                    inside = true;
                } else if inside {
                    match line.as_bytes().first() {
                        Some(b' ') | Some(b'-') => lines.push(line[1..].to_string()),
                        None => lines.push(String::new()),
                        _ => {}
                    }
                }
            }
            write(
                &tree.join(old),
                &lines.iter().map(|l| format!("{l}\n")).collect::<String>(),
            );
        }
    }

    /// The real patches parse, confine, apply to a tree made from their own context and are
    /// undone.
    #[test]
    fn the_real_patches_apply_and_are_undone() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/patches");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("tests/patches") {
            let path = entry.expect("entry").path();
            // A series: its messages apply one on another, so two of them may touch the same
            // lines, which a tree made from one blob's context cannot hold. The kernels test
            // applies it for real, message by message.
            if path.extension().is_some_and(|e| e == "mbox") {
                continue;
            }
            let p = [PatchFile::read(&path).expect("parses")];
            confine::lexical(&p).expect("confined");
            let scratch = tempfile::tempdir().expect("tempdir");
            tree_for(scratch.path(), &p[0]);
            let before = snapshot(scratch.path());
            let applied = applied(scratch.path(), &p, "its own context");
            assert!(
                applied.is_ok(),
                "{}: {:?}",
                path.display(),
                applied.err().map(|e| e.to_string())
            );
            assert_ne!(snapshot(scratch.path()), before, "{}", path.display());
            restore(scratch.path()).expect("restores");
            assert_eq!(snapshot(scratch.path()), before, "{}", path.display());
            seen += 1;
        }
        assert!(seen >= 6, "{seen} patches in {}", dir.display());
    }

    /// One hunk of `virt/kvm/kvm_main.c`, for GNU patch's words about it.
    const FAILED_HUNK_DIFF: &str = "--- a/virt/kvm/kvm_main.c\n+++ b/virt/kvm/kvm_main.c\n@@ -6070,3 +6070,3 @@ int f(void)\n \ta();\n-\tcall_srcu(x);\n+\tsynchronize_srcu_expedited(x);\n \treturn 0;\n";

    /// GNU patch's own words, turned into the file, hunk and target.
    #[test]
    fn a_failed_hunk_is_named_with_its_header_and_target() {
        let message = &patch::parse(Path::new("x.patch"), FAILED_HUNK_DIFF).expect("parses")[0];
        let out =
            "patching file virt/kvm/kvm_main.c\nHunk #1 FAILED at 6070.\n1 out of 1 hunk FAILED\n";
        assert_eq!(
            why_not_applied(out, message),
            "hunk #1 `@@ -6070,3 +6070,3 @@ int f(void)` of virt/kvm/kvm_main.c does not match the source (at 6070; every context line must match, no fuzz)"
        );
        let out = "can't find file to patch at input line 3\nNo file to patch.  Skipping patch.\n";
        assert!(
            why_not_applied(out, message).contains("its target virt/kvm/kvm_main.c does not exist")
        );
        let out = "patching file virt/kvm/kvm_main.c\nReversed (or previously applied) patch detected!  Skipping patch.\n";
        assert!(why_not_applied(out, message).contains("already has this change"));
        let ok = "patching file virt/kvm/kvm_main.c\nHunk #1 succeeded at 6073 (offset 3 lines).\n";
        assert_eq!(
            offsets(ok, "x.patch"),
            [HunkReport {
                patch: "x.patch".into(),
                file: "virt/kvm/kvm_main.c".into(),
                line: "Hunk #1 succeeded at 6073 (offset 3 lines)".into(),
            }]
        );
    }
}
