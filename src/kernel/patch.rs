//! Kernel patches as users have them: a unified diff (`diff -u`, `git diff`), one `git
//! format-patch` file, or an mbox holding a series (`b4 am`, a list archive's thread). Each
//! message is kept whole, so it can be applied on its own (`patch -p1`, in order) and a
//! failure can be named by the message, the file, the hunk and the target.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Why a patch file cannot be used.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum PatchError {
    /// Cannot read patch {0}: {1}. Give the path of a unified diff, a git format-patch file or an mbox.
    Unreadable(PathBuf, std::io::Error),
    /// {0} holds no diff (no `--- a/FILE` / `+++ b/FILE` / `@@` lines): give a unified diff, a git format-patch file or an mbox of patches.
    NoDiff(PathBuf),
    /// {path}, line {line}: {why}. Is the patch complete (not re-wrapped by a mail client)?
    Malformed {
        /// The patch file.
        path: PathBuf,
        /// 1-based line.
        line: usize,
        /// What is wrong there.
        why: String,
    },
    /// {path} changes the binary file {file}: hvlab applies text diffs only (`patch -p1`).
    Binary {
        /// The patch file.
        path: PathBuf,
        /// The binary file.
        file: String,
    },
}

/// One hunk's header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hunk {
    /// The `@@ -a,b +c,d @@ context` line.
    pub header: String,
    /// First line in the old file.
    pub old_start: usize,
}

/// The change to one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileDiff {
    /// The path before, `-p1` stripped; `None` for a new file.
    pub old: Option<String>,
    /// The path after, `-p1` stripped; `None` for a deleted file.
    pub new: Option<String>,
    /// Its hunks, in order.
    pub hunks: Vec<Hunk>,
}

impl FileDiff {
    /// The file in the tree this diff changes (the old path of a deletion).
    pub fn target(&self) -> &str {
        self.new.as_deref().or(self.old.as_deref()).unwrap_or("")
    }
}

/// One patch: a message of a series, or the whole of a plain diff.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Patch {
    /// The mail's subject (`[PATCH 2/3] srcu: ...`), when it is one.
    pub subject: Option<String>,
    /// The files it changes.
    pub files: Vec<FileDiff>,
    /// The message as given, what `patch -p1` reads.
    #[serde(skip)]
    pub text: String,
}

/// A patch file: one diff, or a series.
#[derive(Debug, Clone, Serialize)]
pub struct PatchFile {
    /// Where it was read from.
    pub path: PathBuf,
    /// The sha256 of its bytes, hex.
    pub sha256: String,
    /// Its patches in order; a cover letter (no diff) is left out.
    pub patches: Vec<Patch>,
}

impl PatchFile {
    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<PatchFile, PatchError> {
        let bytes =
            std::fs::read(path).map_err(|e| PatchError::Unreadable(path.to_path_buf(), e))?;
        let text = String::from_utf8_lossy(&bytes);
        Ok(PatchFile {
            path: path.to_path_buf(),
            sha256: sha256_hex(&bytes),
            patches: parse(path, &text)?,
        })
    }

    /// The file's name, for output.
    pub fn name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }

    /// Every file its patches change, `-p1` stripped: both names of a rename.
    pub fn touched(&self) -> BTreeSet<String> {
        self.patches
            .iter()
            .flat_map(|p| &p.files)
            .flat_map(|f| [f.old.clone(), f.new.clone()])
            .flatten()
            .collect()
    }
}

/// Hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// An mbox separator: `From <address or hash> <weekday> <month> <day> <HH:MM:SS> <year>` at
/// the start of a line (a header is `From:`; a body line rarely ends in a time and a year).
fn is_mbox_separator(line: &str) -> bool {
    let Some(rest) = line.strip_prefix("From ") else {
        return false;
    };
    let words: Vec<&str> = rest.split_whitespace().collect();
    let is_time = |w: &&str| w.len() == 8 && w.matches(':').count() == 2;
    let is_year = |w: &&str| w.len() == 4 && w.chars().all(|c| c.is_ascii_digit());
    words.len() >= 3 && words.iter().any(is_time) && words.last().is_some_and(is_year)
}

/// Splits `text` into messages (one for a plain diff) and parses each.
pub fn parse(path: &Path, text: &str) -> Result<Vec<Patch>, PatchError> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    // Message starts: mbox separators at the top of a file or after a blank line.
    let mut starts: Vec<usize> = (0..lines.len())
        .filter(|&i| {
            is_mbox_separator(lines[i].trim_end()) && (i == 0 || lines[i - 1].trim().is_empty())
        })
        .collect();
    if starts.first() != Some(&0) {
        starts.insert(0, 0);
    }
    let mut patches = Vec::new();
    for (n, &start) in starts.iter().enumerate() {
        let end = starts.get(n + 1).copied().unwrap_or(lines.len());
        let message = &lines[start..end];
        let subject = subject_of(message);
        let files = diffs_of(path, message, start)?;
        if files.is_empty() {
            // A cover letter, or text before the first patch.
            continue;
        }
        patches.push(Patch {
            subject,
            files,
            text: message.concat(),
        });
    }
    if patches.is_empty() {
        return Err(PatchError::NoDiff(path.to_path_buf()));
    }
    Ok(patches)
}

/// The `Subject:` of a mail's headers (folded lines joined), when the message has headers.
fn subject_of(message: &[&str]) -> Option<String> {
    let mut subject: Option<String> = None;
    for line in message {
        let l = line.trim_end_matches(['\n', '\r']);
        if l.is_empty() {
            break;
        }
        if let Some(s) = subject.as_mut()
            && (l.starts_with(' ') || l.starts_with('\t'))
        {
            s.push(' ');
            s.push_str(l.trim());
            continue;
        }
        if subject.is_some() {
            break;
        }
        if let Some(s) = l.strip_prefix("Subject:") {
            subject = Some(s.trim().to_string());
        }
    }
    subject
}

/// Strips the first path component (`patch -p1`); `/dev/null` is no file.
fn strip_p1(raw: &str) -> Option<String> {
    // `+++ b/path\tdate`: the path ends at a tab.
    let path = raw.split('\t').next().unwrap_or(raw).trim_end();
    if path == "/dev/null" {
        return None;
    }
    let path = path.trim_matches('"');
    Some(
        path.split_once('/')
            .map_or(path, |(_, rest)| rest)
            .to_string(),
    )
}

/// `@@ -a[,b] +c[,d] @@`: (a, b, c, d).
fn hunk_ranges(line: &str) -> Option<(usize, usize, usize, usize)> {
    let body = line.strip_prefix("@@ -")?;
    let (ranges, _) = body.split_once(" @@")?;
    let (old, new) = ranges.split_once(" +")?;
    let range = |r: &str| -> Option<(usize, usize)> {
        match r.split_once(',') {
            Some((s, l)) => Some((s.parse().ok()?, l.parse().ok()?)),
            None => Some((r.parse().ok()?, 1)),
        }
    };
    let (a, b) = range(old)?;
    let (c, d) = range(new)?;
    Some((a, b, c, d))
}

/// The file diffs of one message. `first` is the message's first line in the file.
fn diffs_of(path: &Path, message: &[&str], first: usize) -> Result<Vec<FileDiff>, PatchError> {
    let lines = MessageLines {
        path,
        lines: message,
        first,
    };
    let mut files: Vec<FileDiff> = Vec::new();
    // Paths from a `diff --git a/X b/Y` line, until its `---`/`+++` (or a binary marker).
    let mut git_paths: Option<(Option<String>, Option<String>)> = None;
    let mut i = 0;
    while i < message.len() {
        let line = message[i].trim_end_matches(['\n', '\r']);
        if let Some(rest) = line.strip_prefix("diff --git ") {
            let (a, b) = rest.split_once(" b/").map_or((rest, rest), |(a, b)| (a, b));
            git_paths = Some((strip_p1(a), Some(b.to_string())));
            i += 1;
            continue;
        }
        if let Some((old, new)) = &git_paths
            && is_binary_marker(line)
        {
            return Err(PatchError::Binary {
                path: path.to_path_buf(),
                file: new.clone().or_else(|| old.clone()).unwrap_or_default(),
            });
        }
        let next = lines.line(i + 1);
        if let (Some(old), Some(new)) = (
            line.strip_prefix("--- "),
            next.and_then(|n| n.strip_prefix("+++ ")),
        ) {
            git_paths = None;
            let (diff, after) = lines.file_diff(old, new, i + 2)?;
            files.push(diff);
            i = after;
            continue;
        }
        i += 1;
    }
    // A git diff with only a mode change or a rename has no hunk: still a change to a file.
    if let Some((old, new)) = git_paths {
        files.push(FileDiff {
            old,
            new,
            hunks: Vec::new(),
        });
    }
    Ok(files)
}

/// A git diff's line saying the file is binary.
fn is_binary_marker(line: &str) -> bool {
    line.starts_with("GIT binary patch")
        || (line.starts_with("Binary files ") && line.ends_with(" differ"))
}

/// The lines of one message of a patch file, for parsing its file diffs.
struct MessageLines<'a> {
    /// The patch file.
    path: &'a Path,
    /// The message's lines, each with its line ending.
    lines: &'a [&'a str],
    /// The message's first line in the file (0-based).
    first: usize,
}

impl<'a> MessageLines<'a> {
    /// Line `i` of the message without its line ending.
    fn line(&self, i: usize) -> Option<&'a str> {
        self.lines.get(i).map(|l| l.trim_end_matches(['\n', '\r']))
    }

    /// Line `i` of the message is not what a diff has there.
    fn malformed(&self, i: usize, why: String) -> PatchError {
        PatchError::Malformed {
            path: self.path.to_path_buf(),
            line: self.first + i + 1,
            why,
        }
    }

    /// The diff of one file, `old` and `new` from its `---`/`+++` header, its hunks from line
    /// `i`; returns it and the line after its last hunk.
    fn file_diff(
        &self,
        old: &str,
        new: &str,
        mut i: usize,
    ) -> Result<(FileDiff, usize), PatchError> {
        let mut diff = FileDiff {
            old: strip_p1(old),
            new: strip_p1(new),
            hunks: Vec::new(),
        };
        // Hunks, each consumed by its line counts, so a removed line that begins with
        // "-- " is never taken for the next file's header.
        while let Some(h) = self.line(i) {
            if !h.starts_with("@@ ") {
                break;
            }
            let (a, old_left, _, new_left) = hunk_ranges(h).ok_or_else(|| {
                self.malformed(i, format!("a hunk header that does not parse: {h}"))
            })?;
            diff.hunks.push(Hunk {
                header: h.to_string(),
                old_start: a,
            });
            i = self.hunk_body(h, i + 1, old_left, new_left)?;
        }
        if diff.hunks.is_empty() {
            return Err(self.malformed(i, format!("`{}` has a header but no hunk", diff.target())));
        }
        Ok((diff, i))
    }

    /// Consumes the body of hunk `h` from line `i`, `old_left` old and `new_left` new lines,
    /// and a "\ No newline at end of file" after it; returns the line after it.
    fn hunk_body(
        &self,
        h: &str,
        mut i: usize,
        mut old_left: usize,
        mut new_left: usize,
    ) -> Result<usize, PatchError> {
        while old_left > 0 || new_left > 0 {
            let Some(body) = self.lines.get(i) else {
                return Err(self.malformed(
                    i,
                    format!(
                        "the patch ends inside the hunk `{h}` ({old_left} old and {new_left} new lines missing)"
                    ),
                ));
            };
            match body.as_bytes().first() {
                Some(b' ') | Some(b'\n') | Some(b'\r') => {
                    // Context (mailers strip a lone space, leaving an empty line).
                    old_left = old_left.saturating_sub(1);
                    new_left = new_left.saturating_sub(1);
                }
                Some(b'-') => old_left = old_left.saturating_sub(1),
                Some(b'+') => new_left = new_left.saturating_sub(1),
                Some(b'\\') => {}
                _ => {
                    return Err(self.malformed(
                        i,
                        format!(
                            "the hunk `{h}` ends early ({old_left} old and {new_left} new lines missing)"
                        ),
                    ));
                }
            }
            i += 1;
        }
        // "\ No newline at end of file" after the last line.
        while self.lines.get(i).is_some_and(|l| l.starts_with('\\')) {
            i += 1;
        }
        Ok(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: &str = "\
--- a/virt/kvm/kvm_main.c
+++ b/virt/kvm/kvm_main.c
@@ -10,3 +10,3 @@ int f(void)
 \ta();
-\tcall_srcu(x);
+\tsynchronize_srcu_expedited(x);
 \treturn 0;
";

    fn parsed(text: &str) -> Vec<Patch> {
        parse(Path::new("t.patch"), text).expect("parses")
    }

    #[test]
    fn a_plain_diff_is_one_patch_touching_its_file() {
        let p = parsed(PLAIN);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].subject, None);
        assert_eq!(p[0].files[0].target(), "virt/kvm/kvm_main.c");
        assert_eq!(p[0].files[0].hunks[0].old_start, 10);
        assert_eq!(p[0].text, PLAIN);
    }

    /// A git format-patch file: headers, a message whose removed line begins with "-- ",
    /// a diffstat, two files, the signature.
    #[test]
    fn a_format_patch_file_gives_its_subject_and_every_file() {
        let text = "\
From 0123456789abcdef0123456789abcdef01234567 Mon Sep 17 00:00:00 2001
From: A Developer <dev@example.org>
Date: Mon, 9 Mar 2026 12:30:56 -0700
Subject: [PATCH] srcu: Add a helper
 that wraps

Body text.

---
 include/linux/srcu.h  | 1 +
 kernel/rcu/srcutree.c | 2 +-
 2 files changed

diff --git a/include/linux/srcu.h b/include/linux/srcu.h
index 1111111..2222222 100644
--- a/include/linux/srcu.h
+++ b/include/linux/srcu.h
@@ -1,2 +1,3 @@
 a
+b
 c
diff --git a/kernel/rcu/srcutree.c b/kernel/rcu/srcutree.c
index 3333333..4444444 100644
--- a/kernel/rcu/srcutree.c
+++ b/kernel/rcu/srcutree.c
@@ -5,2 +5,2 @@ void f(void)
--- a comment line that begins with two dashes
+-- and its replacement
 x
-- 
2.53.0
";
        let p = parsed(text);
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].subject.as_deref(),
            Some("[PATCH] srcu: Add a helper that wraps")
        );
        let targets: Vec<&str> = p[0].files.iter().map(FileDiff::target).collect();
        assert_eq!(targets, ["include/linux/srcu.h", "kernel/rcu/srcutree.c"]);
    }

    #[test]
    fn an_mbox_series_is_split_per_message_and_the_cover_letter_left_out() {
        let msg = |n: usize, file: &str| {
            format!(
                "From dev@example.org Mon Mar  9 12:30:5{n} 2026\nFrom: Dev <dev@example.org>\nSubject: [RFC PATCH {n}/2] part {n}\n\nWhy.\n---\ndiff --git a/{file} b/{file}\n--- a/{file}\n+++ b/{file}\n@@ -1 +1 @@\n-old\n+new\n\n"
            )
        };
        let cover = "From dev@example.org Mon Mar  9 12:30:50 2026\nSubject: [RFC PATCH 0/2] the series\n\nCover text.\n\n";
        let text = format!(
            "{cover}{}{}",
            msg(1, "include/linux/srcu.h"),
            msg(2, "virt/kvm/kvm_main.c")
        );
        let p = parsed(&text);
        assert_eq!(p.len(), 2, "{p:?}");
        assert_eq!(p[0].subject.as_deref(), Some("[RFC PATCH 1/2] part 1"));
        assert_eq!(p[1].files[0].target(), "virt/kvm/kvm_main.c");
        // Each message is applied alone: its text holds its own diff only.
        assert!(p[0].text.contains("srcu.h") && !p[0].text.contains("kvm_main.c"));
    }

    #[test]
    fn new_and_deleted_files_are_named_by_the_path_that_exists() {
        let text = "\
--- /dev/null
+++ b/virt/kvm/new.c
@@ -0,0 +1 @@
+int x;
--- a/virt/kvm/old.c
+++ /dev/null
@@ -1 +0,0 @@
-int y;
";
        let p = parsed(text);
        let t: Vec<&str> = p[0].files.iter().map(FileDiff::target).collect();
        assert_eq!(t, ["virt/kvm/new.c", "virt/kvm/old.c"]);
        assert_eq!(p[0].files[0].old, None);
        assert_eq!(p[0].files[1].new, None);
    }

    #[test]
    fn bad_patches_are_named_with_the_line_and_what_is_wrong() {
        let e = parse(Path::new("notes.txt"), "just some words\n").unwrap_err();
        assert!(matches!(e, PatchError::NoDiff(_)), "{e}");
        let truncated = "--- a/x.c\n+++ b/x.c\n@@ -1,3 +1,3 @@\n a\n-b\n";
        let e = parse(Path::new("cut.patch"), truncated).unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("cut.patch, line 6") && text.contains("ends inside the hunk"),
            "{text}"
        );
        let binary =
            "diff --git a/fw.bin b/fw.bin\nindex 1..2 100644\nGIT binary patch\nliteral 1\n";
        let e = parse(Path::new("bin.patch"), binary).unwrap_err();
        assert!(e.to_string().contains("binary file fw.bin"), "{e}");
    }

    #[test]
    fn sha256_is_the_usual_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
