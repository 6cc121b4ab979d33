//! A source tree's checksum, taken when it is unpacked and checked by `hvlab cache verify`:
//! the sha256 of its manifest, one line per path (sorted) with what is there: a file's mode
//! and the sha256 of its content, a symlink's target, a directory. The manifest is kept
//! beside the tree, so a tree changed behind hvlab's back is named file by file. hvlab's own
//! state directory in a tree (a journal, [`crate::kernel::confine::STATE_DIR`]) is not part
//! of it.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::kernel::confine::STATE_DIR;

/// What a tree holds, path by path.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Manifest {
    /// Tree-relative path → `f MODE SHA256`, `l TARGET-SHA256` or `d MODE`.
    entries: BTreeMap<String, String>,
}

/// How a path differs from its manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "path", rename_all = "snake_case")]
pub enum Change {
    /// Its content, mode or kind changed.
    Changed(String),
    /// It was not there.
    Added(String),
    /// It is gone.
    Removed(String),
}

/// A source tree's checksum as recorded when it was unpacked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceRecord {
    /// The source (`linux-source-7.3 7.3.4-1~bpo13+1 (Debian)`).
    pub what: String,
    /// The sha256 of the manifest.
    pub sha256: String,
    /// Files (and symlinks) in it.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// When it was unpacked (seconds since the epoch).
    pub unpacked_at: u64,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

impl Manifest {
    /// The manifest of `tree` now (files hashed on every core).
    pub fn of(tree: &Path) -> std::io::Result<Manifest> {
        let mut entries: BTreeMap<String, String> = BTreeMap::new();
        let mut files: Vec<(String, PathBuf, u32)> = Vec::new();
        let mut stack: Vec<PathBuf> = vec![tree.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir)? {
                let e = e?;
                let path = e.path();
                let rel = path
                    .strip_prefix(tree)
                    .map_err(std::io::Error::other)?
                    .to_string_lossy()
                    .replace('\n', "\\n");
                if rel == STATE_DIR {
                    continue;
                }
                let meta = std::fs::symlink_metadata(&path)?;
                let mode = meta.permissions().mode() & 0o7777;
                if meta.file_type().is_symlink() {
                    let target = std::fs::read_link(&path)?;
                    let sha = hex(&Sha256::digest(target.as_os_str().as_bytes()));
                    entries.insert(rel, format!("l {sha}"));
                } else if meta.is_dir() {
                    entries.insert(rel, format!("d {mode:o}"));
                    stack.push(path);
                } else {
                    files.push((rel, path, mode));
                }
            }
        }
        let hashed: Vec<(String, String)> = files
            .into_par_iter()
            .map(|(rel, path, mode)| Ok((rel, format!("f {mode:o} {}", sha256_file(&path)?))))
            .collect::<std::io::Result<_>>()?;
        entries.extend(hashed);
        Ok(Manifest { entries })
    }

    /// One line per path: `PATH\tWHAT`.
    pub fn text(&self) -> String {
        let mut out = String::new();
        for (path, what) in &self.entries {
            out.push_str(path);
            out.push('\t');
            out.push_str(what);
            out.push('\n');
        }
        out
    }

    /// Reads [`Self::text`] back.
    pub fn parse(text: &str) -> Manifest {
        Manifest {
            entries: text
                .lines()
                .filter_map(|l| l.split_once('\t'))
                .map(|(p, w)| (p.to_string(), w.to_string()))
                .collect(),
        }
    }

    /// The checksum: the sha256 of the text.
    pub fn sha256(&self) -> String {
        hex(&Sha256::digest(self.text().as_bytes()))
    }

    /// Files and symlinks.
    pub fn files(&self) -> u64 {
        let n = self
            .entries
            .values()
            .filter(|w| !w.starts_with("d "))
            .count();
        u64::try_from(n).unwrap_or(u64::MAX)
    }

    /// What differs in `now` from `self`, path by path, in order.
    pub fn changes(&self, now: &Manifest) -> Vec<Change> {
        let mut out = Vec::new();
        for (path, was) in &self.entries {
            match now.entries.get(path) {
                None => out.push(Change::Removed(path.clone())),
                Some(is) if is != was => out.push(Change::Changed(path.clone())),
                Some(_) => {}
            }
        }
        for path in now.entries.keys() {
            if !self.entries.contains_key(path) {
                out.push(Change::Added(path.clone()));
            }
        }
        out
    }
}

/// Where a tree's record and manifest are kept: beside it, `NAME.json` and `NAME.manifest`.
pub fn record_files(tree: &Path) -> (PathBuf, PathBuf) {
    let name = tree
        .file_name()
        .map_or_else(|| "source".into(), |n| n.to_string_lossy().into_owned());
    let dir = tree.parent().unwrap_or(tree);
    (
        dir.join(format!("{name}.json")),
        dir.join(format!("{name}.manifest")),
    )
}

/// Takes `tree`'s checksum and keeps it beside it (the manifest first, the record last: a
/// tree with a record is one whose manifest is whole).
pub fn record(tree: &Path, what: &str) -> std::io::Result<SourceRecord> {
    let manifest = Manifest::of(tree)?;
    let (json, text) = record_files(tree);
    std::fs::write(&text, manifest.text())?;
    let record = SourceRecord {
        what: what.to_string(),
        sha256: manifest.sha256(),
        files: manifest.files(),
        bytes: super::usage::bytes(&[tree.to_path_buf()]),
        unpacked_at: crate::kernel::now_stamp(),
    };
    let body = serde_json::to_string_pretty(&record).map_err(std::io::Error::other)?;
    let tmp = json.with_extension("json.tmp");
    std::fs::write(&tmp, body)?;
    std::fs::rename(&tmp, &json)?;
    Ok(record)
}

/// The record kept beside `tree`, if there is one.
pub fn recorded(tree: &Path) -> Option<SourceRecord> {
    let (json, _) = record_files(tree);
    serde_json::from_str(&std::fs::read_to_string(json).ok()?).ok()
}

/// What `verify` found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Verified {
    /// The tree is as unpacked.
    Same {
        /// Its checksum.
        sha256: String,
    },
    /// It changed since.
    Changed {
        /// The checksum recorded.
        recorded: String,
        /// Its checksum now.
        now: String,
        /// What differs, path by path.
        changes: Vec<Change>,
    },
    /// No checksum was recorded (an older hvlab unpacked it, or the unpack did not finish).
    Unrecorded,
}

/// Checks `tree` against the checksum recorded beside it.
pub fn verify(tree: &Path) -> std::io::Result<Verified> {
    let (json, text) = record_files(tree);
    let Some(record) = recorded(tree) else {
        return Ok(Verified::Unrecorded);
    };
    if !json.is_file() {
        return Ok(Verified::Unrecorded);
    }
    let now = Manifest::of(tree)?;
    let sha = now.sha256();
    if sha == record.sha256 {
        return Ok(Verified::Same { sha256: sha });
    }
    let was = Manifest::parse(&std::fs::read_to_string(&text).unwrap_or_default());
    Ok(Verified::Changed {
        recorded: record.sha256,
        now: sha,
        changes: was.changes(&now),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    /// A tree changed behind hvlab's back (a file appended to, one added, one removed, a mode
    /// changed) fails verification, each change named; hvlab's state directory does not count.
    #[test]
    fn a_tree_changed_behind_hvlabs_back_is_named_file_by_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = dir.path().join("source");
        write(&tree.join("virt/kvm/kvm_main.c"), "int kvm;\n");
        write(&tree.join("Makefile"), "all:\n");
        write(&tree.join("scripts/x.sh"), "#!/bin/sh\n");
        std::os::unix::fs::symlink("virt", tree.join("link")).expect("symlink");
        let r = record(&tree, "a test source").expect("record");
        assert_eq!(r.files, 4);
        assert_eq!(recorded(&tree), Some(r.clone()));
        assert_eq!(
            verify(&tree).expect("verify"),
            Verified::Same {
                sha256: r.sha256.clone()
            }
        );
        // hvlab's journal beside the tree's files is not the tree.
        write(&tree.join(".hvlab/journal"), "[]");
        assert!(matches!(
            verify(&tree).expect("verify"),
            Verified::Same { .. }
        ));
        // Behind hvlab's back.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(tree.join("virt/kvm/kvm_main.c"))
            .expect("open");
        std::io::Write::write_all(&mut f, b"/* poisoned */\n").expect("append");
        write(&tree.join("big.bin"), "x");
        std::fs::remove_file(tree.join("Makefile")).expect("rm");
        std::fs::set_permissions(
            tree.join("scripts/x.sh"),
            std::fs::Permissions::from_mode(0o755),
        )
        .expect("chmod");
        let Verified::Changed {
            recorded,
            now,
            changes,
        } = verify(&tree).expect("verify")
        else {
            panic!("a changed tree verified");
        };
        assert_eq!(recorded, r.sha256);
        assert_ne!(now, r.sha256);
        assert_eq!(
            changes,
            [
                Change::Removed("Makefile".into()),
                Change::Changed("scripts/x.sh".into()),
                Change::Changed("virt/kvm/kvm_main.c".into()),
                Change::Added("big.bin".into()),
            ]
        );
        // Without a record: nothing to check against.
        let other = dir.path().join("other");
        write(&other.join("a"), "a");
        assert_eq!(verify(&other).expect("verify"), Verified::Unrecorded);
    }
}
