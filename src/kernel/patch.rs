//! Kernel patches as users have them: a unified diff (`diff -u`, `git diff`), one `git
//! format-patch` file, or an mbox holding a series (`b4 am`, a list archive's thread). Each
//! message is kept whole, so it can be applied on its own (`patch -p1`, in order) and a
//! failure can be named by the message, the file, the hunk and the target.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use hvlab_core::error::Fault;
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

impl PatchError {
    /// A patch file the user named that cannot be read or used: bad input.
    pub fn fault(&self) -> Fault {
        match self {
            PatchError::Unreadable(..)
            | PatchError::NoDiff(_)
            | PatchError::Malformed { .. }
            | PatchError::Binary { .. } => Fault::BadInput,
        }
    }
}

/// One hunk's header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hunk {
    /// The `@@ -a,b +c,d @@ context` line.
    pub header: String,
    /// First line in the old file.
    pub old_start: usize,
    /// What it changes in the old file, as half-open line ranges `[from, to)`: the lines it
    /// removes, or an empty range `[n, n)` where it inserts before old line `n`.
    pub changes: Vec<(usize, usize)>,
    /// Lines it spans in the old file (`b` of `-a,b`).
    pub old_len: usize,
    /// First line in the new file (`c` of `+c,d`).
    pub new_start: usize,
    /// Lines it spans in the new file (`d` of `+c,d`).
    pub new_len: usize,
    /// The old file's lines it removes (1-based).
    pub removed: Vec<usize>,
    /// The new file's lines it adds (1-based).
    pub added: Vec<usize>,
    /// Its context lines, each as (old line, new line).
    pub kept: Vec<(usize, usize)>,
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
    /// A git rename: `old` becomes `new`.
    pub renamed: bool,
    /// A git copy: `new` is made from `old`, which stays.
    pub copied: bool,
    /// The file's mode before, from a git header (`0o100644`, `0o100755`, `0o120000` a symlink).
    pub old_mode: Option<u32>,
    /// The file's mode after, from a git header.
    pub new_mode: Option<u32>,
    /// The target of the symlink the diff leaves (new mode `120000`): its added line.
    pub symlink: Option<String>,
    /// The diff's own lines (its git header, `---`/`+++` and hunks): all `patch` is given, so
    /// it changes nothing hvlab did not parse and confine.
    #[serde(skip)]
    pub text: String,
}

/// A symlink's mode in a git header.
pub const SYMLINK_MODE: u32 = 0o120000;

impl FileDiff {
    /// The file in the tree this diff changes (the old path of a deletion).
    pub fn target(&self) -> &str {
        self.new.as_deref().or(self.old.as_deref()).unwrap_or("")
    }

    /// Where the old file's line `old` is in the new file, when the diff keeps it (a context
    /// line, or one no hunk spans); `None` for a line it removes.
    pub fn new_line_of(&self, old: usize) -> Option<usize> {
        let mut shift: isize = 0;
        for h in &self.hunks {
            // `-a,0` inserts after old line `a`.
            let first = if h.old_len == 0 {
                h.old_start + 1
            } else {
                h.old_start
            };
            if old < first {
                break;
            }
            if old >= first + h.old_len {
                shift += isize::try_from(h.new_len).ok()? - isize::try_from(h.old_len).ok()?;
                continue;
            }
            return h.kept.iter().find(|(o, _)| *o == old).map(|&(_, n)| n);
        }
        old.checked_add_signed(shift)
    }

    /// Whether the diff is of a symlink, before or after (git mode `120000`).
    pub fn is_symlink(&self) -> bool {
        self.old_mode == Some(SYMLINK_MODE) || self.new_mode == Some(SYMLINK_MODE)
    }

    /// A diff with no git header: its names from `---`/`+++`, its hunks from the caller.
    fn plain(old: Option<String>, new: Option<String>) -> FileDiff {
        FileDiff {
            old,
            new,
            hunks: Vec::new(),
            renamed: false,
            copied: false,
            old_mode: None,
            new_mode: None,
            symlink: None,
            text: String::new(),
        }
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

impl Patch {
    /// What `patch -p1` reads: the file diffs hvlab parsed, nothing else of the message (a
    /// context diff or an ed script hidden in its prose is never applied).
    pub fn diff_text(&self) -> String {
        self.files.iter().map(|f| f.text.as_str()).collect()
    }

    /// The patch as output names it: the file, and the message of a series.
    pub fn label(&self, file: &PatchFile, n: usize) -> String {
        match (&self.subject, file.patches.len()) {
            (Some(s), _) => format!("{} ({s})", file.name()),
            (None, 1) => file.name(),
            (None, _) => format!(
                "{} (patch {} of {})",
                file.name(),
                n + 1,
                file.patches.len()
            ),
        }
    }
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

/// Strips the first path component (`patch -p1`).
fn strip_p1(path: &str) -> String {
    path.split_once('/')
        .map_or(path, |(_, rest)| rest)
        .to_string()
}

/// Decodes a name git C-quoted (`"a/caf\303\251\tx.c"`) from the start of `s`; returns it
/// and what follows the closing quote.
fn c_unquote(s: &str) -> Result<(String, &str), String> {
    let body = s
        .strip_prefix('"')
        .ok_or_else(|| format!("`{s}` is not a quoted name"))?;
    let mut bytes = Vec::new();
    let mut chars = body.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => {
                let name = String::from_utf8(bytes).map_err(|_| {
                    format!("the quoted name {s} is not UTF-8; hvlab takes UTF-8 file names only")
                })?;
                return Ok((name, &body[at + 1..]));
            }
            '\\' => {
                let (_, e) = chars
                    .next()
                    .ok_or_else(|| format!("the quoted name {s} ends inside an escape"))?;
                let byte =
                    match e {
                        'a' => 7,
                        'b' => 8,
                        't' => b'\t',
                        'n' => b'\n',
                        'v' => 11,
                        'f' => 12,
                        'r' => b'\r',
                        '"' => b'"',
                        '\\' => b'\\',
                        '0'..='3' => {
                            let mut value = u32::from(e) - u32::from('0');
                            for _ in 0..2 {
                                let digit =
                                    chars.next().and_then(|(_, d)| d.to_digit(8)).ok_or_else(
                                        || format!("the quoted name {s} has a short octal escape"),
                                    )?;
                                value = value * 8 + digit;
                            }
                            u8::try_from(value).map_err(|_| {
                                format!("the quoted name {s} has an octal escape above \\377")
                            })?
                        }
                        other => {
                            return Err(format!(
                                "the quoted name {s} has the unknown escape \\{other}"
                            ));
                        }
                    };
                bytes.push(byte);
            }
            c => {
                let mut buf = [0; 4];
                bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    Err(format!("the quoted name {s} has no closing quote"))
}

/// A name as a header line gives it: quoted, or up to a tab. An unquoted name with a space
/// is refused: GNU patch ends such a name at the space unless a tab follows it, and hvlab must
/// journal the file patch changes, not a guess.
fn unquoted_or_quoted(raw: &str) -> Result<String, String> {
    if raw.starts_with('"') {
        let (name, rest) = c_unquote(raw)?;
        if !(rest.is_empty() || rest.starts_with(['\t', ' '])) {
            return Err(format!("text after the quoted name {raw}"));
        }
        return Ok(name);
    }
    let name = raw.split('\t').next().unwrap_or(raw).trim_end();
    if name.contains(char::is_whitespace) {
        return Err(format!(
            "the name `{name}` holds a space; hvlab cannot tell where GNU patch ends it (write it quoted, as git does for special names, or rename the file)"
        ));
    }
    Ok(name.to_string())
}

/// A `---`/`+++` name, `-p1` stripped; `None` for `/dev/null`.
fn header_name(raw: &str) -> Result<Option<String>, String> {
    let name = unquoted_or_quoted(raw)?;
    Ok((name != "/dev/null").then(|| strip_p1(&name)))
}

/// The two names of a `diff --git a/X b/Y` line, `-p1` stripped.
fn git_line_names(rest: &str) -> Result<(String, String), String> {
    let (a, b) = if rest.starts_with('"') {
        let (a, after) = c_unquote(rest)?;
        let b = after
            .strip_prefix(' ')
            .ok_or_else(|| format!("no second name after the first in `diff --git {rest}`"))?;
        (a, b.to_string())
    } else {
        let (a, b) = rest
            .split_once(' ')
            .ok_or_else(|| format!("one name only in `diff --git {rest}`"))?;
        (a.to_string(), b.to_string())
    };
    let b = unquoted_or_quoted(&b)?;
    Ok((strip_p1(&a), strip_p1(&b)))
}

/// A git mode (`100644`), octal.
fn git_mode(text: &str) -> Result<u32, String> {
    u32::from_str_radix(text.trim(), 8).map_err(|_| format!("the mode `{text}` is not octal"))
}

/// What a git diff's extended header says, line by line until its `---` or its end.
#[derive(Default)]
struct GitHeader {
    /// The `diff --git` line's names, `-p1` stripped.
    a: String,
    b: String,
    rename: (Option<String>, Option<String>),
    copy: (Option<String>, Option<String>),
    old_mode: Option<u32>,
    new_mode: Option<u32>,
    new_file: bool,
    deleted: bool,
}

impl GitHeader {
    /// Takes `line` when it is an extended header line; `false` when it is not one.
    fn take(&mut self, line: &str) -> Result<bool, String> {
        let named = |s: &str| unquoted_or_quoted(s).map(Some);
        if let Some(m) = line.strip_prefix("old mode ") {
            self.old_mode = Some(git_mode(m)?);
        } else if let Some(m) = line.strip_prefix("new mode ") {
            self.new_mode = Some(git_mode(m)?);
        } else if let Some(m) = line.strip_prefix("new file mode ") {
            self.new_file = true;
            self.new_mode = Some(git_mode(m)?);
        } else if let Some(m) = line.strip_prefix("deleted file mode ") {
            self.deleted = true;
            self.old_mode = Some(git_mode(m)?);
        } else if let Some(n) = line.strip_prefix("rename from ") {
            self.rename.0 = named(n)?;
        } else if let Some(n) = line.strip_prefix("rename to ") {
            self.rename.1 = named(n)?;
        } else if let Some(n) = line.strip_prefix("copy from ") {
            self.copy.0 = named(n)?;
        } else if let Some(n) = line.strip_prefix("copy to ") {
            self.copy.1 = named(n)?;
        } else if let Some(index) = line.strip_prefix("index ") {
            // `index 1a2b..3c4d 100644`: the mode of a file that keeps it.
            if let Some((_, mode)) = index.split_once(' ') {
                let mode = git_mode(mode)?;
                self.old_mode.get_or_insert(mode);
                self.new_mode.get_or_insert(mode);
            }
        } else if !(line.starts_with("similarity index ")
            || line.starts_with("dissimilarity index "))
        {
            return Ok(false);
        }
        Ok(true)
    }

    /// The file diff it describes, with `hunks` parsed after it (named by `---`/`+++` as
    /// `old`/`new`) or none; every name it gives must agree, so the file hvlab journals is the
    /// one GNU patch changes whichever name it takes.
    fn into_diff(self, hunked: Option<FileDiff>) -> Result<FileDiff, String> {
        let renamed = self.rename.0.is_some() || self.rename.1.is_some();
        let copied = self.copy.0.is_some() || self.copy.1.is_some();
        for (what, name, line_name) in [
            ("rename from", &self.rename.0, &self.a),
            ("rename to", &self.rename.1, &self.b),
            ("copy from", &self.copy.0, &self.a),
            ("copy to", &self.copy.1, &self.b),
        ] {
            if let Some(n) = name
                && n != line_name
            {
                return Err(format!(
                    "`{what} {n}` disagrees with the `diff --git` line's {line_name}"
                ));
            }
        }
        if renamed && (self.rename.0.is_none() || self.rename.1.is_none())
            || copied && (self.copy.0.is_none() || self.copy.1.is_none())
        {
            return Err(format!("a rename or copy of {} without both names", self.a));
        }
        let old = (!self.new_file).then(|| self.a.clone());
        let new = (!self.deleted).then(|| self.b.clone());
        let mut diff = match hunked {
            Some(d) => {
                for (side, given, expected) in [("---", &d.old, &old), ("+++", &d.new, &new)] {
                    if given.is_some() && given != expected {
                        return Err(format!(
                            "the `{side}` line names {} but the `diff --git` line {}",
                            given.as_deref().unwrap_or("/dev/null"),
                            expected
                                .as_deref()
                                .unwrap_or("/dev/null (a new or deleted file)")
                        ));
                    }
                }
                FileDiff { old, new, ..d }
            }
            None => FileDiff::plain(old, new),
        };
        diff.renamed = renamed;
        diff.copied = copied;
        diff.old_mode = if diff.old.is_some() {
            self.old_mode
        } else {
            None
        };
        diff.new_mode = if diff.new.is_some() {
            self.new_mode
        } else {
            None
        };
        Ok(diff)
    }
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
    let mut i = 0;
    while i < message.len() {
        let line = message[i].trim_end_matches(['\n', '\r']);
        let start = i;
        if let Some(rest) = line.strip_prefix("diff --git ") {
            let (a, b) = git_line_names(rest).map_err(|why| lines.malformed(i, why))?;
            let mut header = GitHeader {
                a,
                b,
                ..GitHeader::default()
            };
            i += 1;
            while let Some(l) = lines.line(i) {
                if !header.take(l).map_err(|why| lines.malformed(i, why))? {
                    break;
                }
                i += 1;
            }
            if let Some(l) = lines.line(i)
                && is_binary_marker(l)
            {
                return Err(PatchError::Binary {
                    path: path.to_path_buf(),
                    file: header.b,
                });
            }
            // Its `---`/`+++` and hunks, or none: a rename, a copy, a mode change, an empty
            // file made or deleted.
            let hunked = match lines.file_header(i) {
                Some((old, new)) => {
                    let (diff, after) = lines.file_diff(old, new, i + 2)?;
                    i = after;
                    Some(diff)
                }
                None => None,
            };
            let mut diff = header
                .into_diff(hunked)
                .map_err(|why| lines.malformed(start, why))?;
            diff.symlink = lines.symlink_target(&diff, start, i)?;
            diff.text = message[start..i].concat();
            files.push(diff);
            continue;
        }
        if let Some((old, new)) = lines.file_header(i) {
            let (mut diff, after) = lines.file_diff(old, new, i + 2)?;
            diff.text = message[start..after].concat();
            files.push(diff);
            i = after;
            continue;
        }
        i += 1;
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

    /// The names of a `---`/`+++` pair starting at line `i`.
    fn file_header(&self, i: usize) -> Option<(&'a str, &'a str)> {
        let old = self.line(i)?.strip_prefix("--- ")?;
        let new = self.line(i + 1)?.strip_prefix("+++ ")?;
        Some((old, new))
    }

    /// The target of the symlink a git diff (lines `from..to`) leaves: its one added line.
    fn symlink_target(
        &self,
        diff: &FileDiff,
        from: usize,
        to: usize,
    ) -> Result<Option<String>, PatchError> {
        if diff.new_mode != Some(SYMLINK_MODE) || diff.hunks.is_empty() {
            return Ok(None);
        }
        let added: Vec<&str> = (from..to)
            .filter_map(|i| self.line(i))
            .skip_while(|l| !l.starts_with("@@ "))
            .filter_map(|l| l.strip_prefix('+'))
            .collect();
        match added.as_slice() {
            [target] => Ok(Some((*target).to_string())),
            _ => Err(self.malformed(
                from,
                format!(
                    "the symlink {} is given {} target lines; a symlink has one",
                    diff.target(),
                    added.len()
                ),
            )),
        }
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
        let name = |raw: &str, at: usize| header_name(raw).map_err(|why| self.malformed(at, why));
        let mut diff = FileDiff::plain(name(old, i - 2)?, name(new, i - 1)?);
        // Hunks, each consumed by its line counts, so a removed line that begins with
        // "-- " is never taken for the next file's header.
        while let Some(h) = self.line(i) {
            if !h.starts_with("@@ ") {
                break;
            }
            let (a, old_left, c, new_left) = hunk_ranges(h).ok_or_else(|| {
                self.malformed(i, format!("a hunk header that does not parse: {h}"))
            })?;
            let (after, body) = self.hunk_body(h, i + 1, (a, c), old_left, new_left)?;
            diff.hunks.push(Hunk {
                header: h.to_string(),
                old_start: a,
                changes: body.changes,
                old_len: old_left,
                new_start: c,
                new_len: new_left,
                removed: body.removed,
                added: body.added,
                kept: body.kept,
            });
            i = after;
        }
        if diff.hunks.is_empty() {
            return Err(self.malformed(i, format!("`{}` has a header but no hunk", diff.target())));
        }
        Ok((diff, i))
    }

    /// Consumes the body of hunk `h` from line `i`, `old_left` old and `new_left` new lines
    /// (the first old one is `old_line`), and a "\ No newline at end of file" after it;
    /// returns the line after it and the old lines it changes ([`Hunk::changes`]).
    fn hunk_body(
        &self,
        h: &str,
        mut i: usize,
        (mut old_line, mut new_line): (usize, usize),
        mut old_left: usize,
        mut new_left: usize,
    ) -> Result<(usize, HunkBody), PatchError> {
        let mut changes: Vec<(usize, usize)> = Vec::new();
        let mut removed = Vec::new();
        let mut added = Vec::new();
        let mut kept = Vec::new();
        // A run of removed and added lines is one change: it starts at the old line where
        // the run began and ends after its last removed line.
        let mut run: Option<(usize, usize)> = None;
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
                    changes.extend(run.take());
                    kept.push((old_line, new_line));
                    old_line += 1;
                    new_line += 1;
                }
                Some(b'-') => {
                    old_left = old_left.saturating_sub(1);
                    removed.push(old_line);
                    let r = run.get_or_insert((old_line, old_line));
                    old_line += 1;
                    r.1 = old_line;
                }
                Some(b'+') => {
                    new_left = new_left.saturating_sub(1);
                    added.push(new_line);
                    new_line += 1;
                    run.get_or_insert((old_line, old_line));
                }
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
        changes.extend(run.take());
        // "\ No newline at end of file" after the last line.
        while self.lines.get(i).is_some_and(|l| l.starts_with('\\')) {
            i += 1;
        }
        Ok((
            i,
            HunkBody {
                changes,
                removed,
                added,
                kept,
            },
        ))
    }
}

/// What a hunk's lines change: [`Hunk::changes`], [`Hunk::removed`], [`Hunk::added`].
struct HunkBody {
    changes: Vec<(usize, usize)>,
    removed: Vec<usize>,
    added: Vec<usize>,
    kept: Vec<(usize, usize)>,
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

    /// Each hunk names the old lines it removes, the new lines it adds, and where a kept line
    /// moved: what DWARF's line tables and line-number constants are read against.
    #[test]
    fn hunks_give_removed_added_and_moved_lines() {
        let text = "--- a/f.c\n+++ b/f.c\n@@ -3,4 +3,5 @@ int f(void)\n a\n-b\n+B\n+B2\n c\n d\n@@ -20,2 +21,0 @@\n-x\n-y\n@@ -30,0 +30,1 @@\n+z\n";
        let p = parsed(text);
        let d = &p[0].files[0];
        let h = &d.hunks[0];
        assert_eq!((h.removed.clone(), h.added.clone()), (vec![4], vec![4, 5]));
        assert_eq!(h.kept, vec![(3, 3), (5, 6), (6, 7)]);
        assert_eq!(
            (d.hunks[1].removed.clone(), d.hunks[1].added.clone()),
            (vec![20, 21], vec![])
        );
        assert_eq!(d.hunks[2].added, vec![30]);
        // Before the first hunk, inside it, between hunks, after a deletion, after an insertion.
        let map: Vec<Option<usize>> = [2, 4, 5, 10, 20, 25, 30, 31]
            .iter()
            .map(|&l| d.new_line_of(l))
            .collect();
        assert_eq!(
            map,
            vec![
                Some(2),
                None,
                Some(6),
                Some(11),
                None,
                Some(24),
                Some(29),
                Some(31)
            ]
        );
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

    /// Was: a hunk-less rename was lost at the next `diff --git`, so never journalled.
    #[test]
    fn git_headers_give_renames_copies_modes_and_symlinks() {
        let text = "\
diff --git a/d/old.c b/e/new.c
similarity index 100%
rename from d/old.c
rename to e/new.c
diff --git a/f.c b/f2.c
similarity index 100%
copy from f.c
copy to f2.c
diff --git a/run.sh b/run.sh
old mode 100644
new mode 100755
diff --git a/lnk b/lnk
new file mode 120000
index 0000000..1111111
--- /dev/null
+++ b/lnk
@@ -0,0 +1 @@
+f.c
\\ No newline at end of file
diff --git a/gone.c b/gone.c
deleted file mode 100644
index 2222222..0000000
diff --git a/x.c b/x.c
index 3333333..4444444 100644
--- a/x.c
+++ b/x.c
@@ -1 +1 @@
-a
+b
";
        let p = parsed(text);
        let f = &p[0].files;
        assert_eq!(f.len(), 6, "{f:?}");
        assert!(f[0].renamed && f[0].hunks.is_empty());
        assert_eq!(
            (f[0].old.as_deref(), f[0].new.as_deref()),
            (Some("d/old.c"), Some("e/new.c"))
        );
        assert!(f[1].copied && !f[1].renamed);
        assert_eq!(
            (f[2].old_mode, f[2].new_mode),
            (Some(0o100644), Some(0o100755))
        );
        assert_eq!(
            (f[3].old.as_deref(), f[3].symlink.as_deref()),
            (None, Some("f.c"))
        );
        assert!(f[3].is_symlink());
        assert_eq!(
            (f[4].old.as_deref(), f[4].new.as_deref()),
            (Some("gone.c"), None)
        );
        assert_eq!(f[5].new_mode, Some(0o100644));
        // patch reads exactly the diffs, their headers included.
        assert_eq!(p[0].diff_text(), text);
        let touched: Vec<String> = PatchFile {
            path: "t.patch".into(),
            sha256: String::new(),
            patches: p,
        }
        .touched()
        .into_iter()
        .collect();
        assert_eq!(
            touched,
            [
                "d/old.c", "e/new.c", "f.c", "f2.c", "gone.c", "lnk", "run.sh", "x.c"
            ]
        );
    }

    #[test]
    fn quoted_names_are_decoded_and_prose_is_not_given_to_patch() {
        let text = "Prose before.\n*** not/a/diff\ndiff --git \"a/caf\\303\\251\\tx.c\" \"b/caf\\303\\251\\tx.c\"\n--- \"a/caf\\303\\251\\tx.c\"\n+++ \"b/caf\\303\\251\\tx.c\"\n@@ -1 +1 @@\n-a\n+b\n-- \n2.53.0\n";
        let p = parsed(text);
        assert_eq!(p[0].files[0].target(), "caf\u{e9}\tx.c");
        assert!(p[0].diff_text().starts_with("diff --git") && p[0].diff_text().ends_with("+b\n"));
    }

    /// Names GNU patch would read otherwise than hvlab are refused, not guessed.
    #[test]
    fn names_patch_would_read_differently_are_refused() {
        let bad = |text: &str| parse(Path::new("odd.patch"), text).unwrap_err().to_string();
        let spaced = bad("--- a/x y.c\n+++ b/x y.c\n@@ -1 +1 @@\n-a\n+b\n");
        assert!(spaced.contains("holds a space"), "{spaced}");
        let disagree = bad(
            "diff --git a/r1 b/r2\nnew file mode 100644\n--- /dev/null\n+++ b/r3\n@@ -0,0 +1 @@\n+x\n",
        );
        assert!(
            disagree.contains("names r3 but the `diff --git` line r2"),
            "{disagree}"
        );
        let renamed = bad("diff --git a/a.c b/b.c\nrename from a.c\nrename to c.c\n");
        assert!(renamed.contains("`rename to c.c` disagrees"), "{renamed}");
        let quoted = bad("--- \"a/x\\q\"\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n");
        assert!(quoted.contains("unknown escape"), "{quoted}");
        // Spaces after a tab are a date, not the name.
        let dated = parsed(
            "--- a/x.c\t2026-03-09 12:00:00\n+++ b/x.c\t2026-03-09 12:00:01\n@@ -1 +1 @@\n-a\n+b\n",
        );
        assert_eq!(dated[0].files[0].target(), "x.c");
    }

    #[test]
    fn sha256_is_the_usual_hex() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
