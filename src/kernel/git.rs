//! Git trees as kernel specs: `git:PATH@REF` names one commit, `git:PATH@BASE..HEAD` the
//! first-parent commits of a range, oldest first (`PATH` may start with `~`).
//!
//! The user's repository is only ever read (`rev-parse`, `rev-list`, `cat-file`). Builds use
//! hvlab's own clone of it in the cache ([`Checkout`]), which borrows its objects through
//! git's alternates, so the user's working tree, index, branches and HEAD never change and a
//! dirty tree is fine.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hvlab_core::error::Fault;
use serde::Serialize;

use super::patch::sha256_hex;

/// Why a git spec cannot be used.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum GitError {
    /// A git:PATH@REF kernel spec needs git, which this host lacks: apt-get install git.
    NoGit,
    /// Kernel spec `{spec}` is not git:PATH@REF or git:PATH@BASE..HEAD: {why}.
    BadSpec {
        /// The spec.
        spec: String,
        /// What is wrong with it.
        why: String,
    },
    /// {path} is not a git repository ({output}): give git:PATH@REF with PATH the top of a git working tree (or a bare repository).
    NotARepository {
        /// The path given, `~` expanded.
        path: PathBuf,
        /// What git said.
        output: String,
    },
    /// {path} is inside the git repository {top}, not its top: give git:{top}@REF.
    NotTop {
        /// The path given.
        path: PathBuf,
        /// The top of its working tree.
        top: PathBuf,
    },
    /// `{rev}` is not a commit in {repo} ({output}): give a branch, tag or SHA that `git -C {repo} rev-parse --verify '{rev}^{{commit}}'` accepts.
    NoSuchRef {
        /// The repository.
        repo: PathBuf,
        /// The ref as given.
        rev: String,
        /// What git said.
        output: String,
    },
    /// The range {base}..{head} in {repo} holds no commits ({head} is {base} or one of its ancestors): give git:PATH@BASE..HEAD with HEAD a descendant of BASE.
    EmptyRange {
        /// The repository.
        repo: PathBuf,
        /// The base as given.
        base: String,
        /// The head as given.
        head: String,
    },
    /// `{rev}` ({sha}) in {repo} is not a Linux kernel tree: {why}. Give the repository of a kernel source tree (a top Makefile with `VERSION =`, and arch/x86/kvm/).
    NotLinux {
        /// The repository.
        repo: PathBuf,
        /// The ref as given.
        rev: String,
        /// Its commit.
        sha: String,
        /// What is missing.
        why: String,
    },
    /// Kernel spec `{spec}` is a range of commits, and a kernel under test is one commit: give git:PATH@REF (ranges are for the per-patch and bisect commands).
    RangeNotOne {
        /// The spec.
        spec: String,
    },
    /// git failed to {what} in {dir}: {output}. Check that git works there (`git -C {dir} status`) and run again.
    Failed {
        /// What git was doing.
        what: String,
        /// Where.
        dir: PathBuf,
        /// Its last lines.
        output: String,
    },
}

impl GitError {
    /// A spec, path or ref the user can fix is bad input; a host without git cannot; a git
    /// command that fails otherwise has failed.
    pub fn fault(&self) -> Fault {
        match self {
            GitError::BadSpec { .. }
            | GitError::NotARepository { .. }
            | GitError::NotTop { .. }
            | GitError::NoSuchRef { .. }
            | GitError::EmptyRange { .. }
            | GitError::NotLinux { .. }
            | GitError::RangeNotOne { .. } => Fault::BadInput,
            GitError::NoGit => Fault::HostCannot,
            GitError::Failed { .. } => Fault::Failed,
        }
    }
}

/// `git -C dir`, deaf to the caller's `GIT_*` variables (a hook's `GIT_DIR` would point every
/// command at another repository) and never paging or prompting.
fn git(dir: &Path) -> Command {
    let mut cmd = Command::new("git");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("GIT_") {
            cmd.env_remove(k);
        }
    }
    cmd.arg("-C")
        .arg(dir)
        .env("LC_ALL", "C")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_PAGER", "cat")
        .stdin(Stdio::null());
    cmd
}

/// What a git command printed: its stdout when it succeeded, else its stderr's last lines.
fn output(mut cmd: Command) -> Result<Result<String, String>, GitError> {
    let out = match cmd.output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(GitError::NoGit),
        Err(e) => return Ok(Err(e.to_string())),
    };
    if out.status.success() {
        return Ok(Ok(String::from_utf8_lossy(&out.stdout).into_owned()));
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" ");
    Ok(Err(if tail.is_empty() {
        format!("git exited with {}", out.status)
    } else {
        tail
    }))
}

/// A git command that must succeed: its stdout, else [`GitError::Failed`] saying `what`.
fn run(dir: &Path, args: &[&str], what: &str) -> Result<String, GitError> {
    let mut cmd = git(dir);
    cmd.args(args);
    output(cmd)?.map_err(|output| GitError::Failed {
        what: what.to_string(),
        dir: dir.to_path_buf(),
        output,
    })
}

/// `~` and `~/...` as the user's home; anything else as given.
fn expand_tilde(path: &str) -> PathBuf {
    let home = || std::env::var_os("HOME").map(PathBuf::from);
    match path.strip_prefix('~') {
        Some("") => home().unwrap_or_else(|| PathBuf::from(path)),
        Some(rest) if rest.starts_with('/') => home().map_or_else(
            || PathBuf::from(path),
            |h| h.join(rest.trim_start_matches('/')),
        ),
        _ => PathBuf::from(path),
    }
}

/// `git:PATH@REV` split: the path (`~` expanded) and what follows the `@`. `PATH` may hold an
/// `@` itself: the first `@` after which the path exists wins, else the first `@`.
pub(super) fn split_spec(spec: &str) -> Result<(PathBuf, String), GitError> {
    let bad = |why: &str| GitError::BadSpec {
        spec: spec.to_string(),
        why: why.to_string(),
    };
    let rest = spec
        .strip_prefix("git:")
        .ok_or_else(|| bad("it does not start with git:"))?;
    let ats: Vec<usize> = rest.match_indices('@').map(|(i, _)| i).collect();
    let at = ats
        .iter()
        .copied()
        .find(|&i| expand_tilde(&rest[..i]).is_dir())
        .or_else(|| ats.first().copied())
        .ok_or_else(|| bad("no `@REF` after the path"))?;
    let (path, rev) = (&rest[..at], &rest[at + 1..]);
    if path.is_empty() {
        return Err(bad("no repository path before the `@`"));
    }
    if rev.is_empty() {
        return Err(bad("no ref after the `@`"));
    }
    Ok((expand_tilde(path), rev.to_string()))
}

/// What a git spec names after the `@`: one commit, or a range of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Revs {
    /// `REF`: one commit (a branch, a tag, a SHA, `HEAD~2`).
    One(String),
    /// `BASE..HEAD`: the first-parent commits after BASE up to HEAD.
    Range {
        /// BASE as given.
        base: String,
        /// HEAD as given.
        head: String,
    },
}

/// What follows the `@` of `spec`, read as one ref or a range `BASE..HEAD`.
pub(super) fn parse_revs(spec: &str, rev: &str) -> Result<Revs, GitError> {
    let bad = |why: &str| GitError::BadSpec {
        spec: spec.to_string(),
        why: why.to_string(),
    };
    if rev.contains("...") {
        return Err(bad(
            "`...` (a symmetric difference) is not a series; give BASE..HEAD",
        ));
    }
    match rev.split_once("..") {
        None => Ok(Revs::One(rev.to_string())),
        Some(("", _)) => Err(bad("the range has no BASE before `..`")),
        Some((_, "")) => Err(bad("the range has no HEAD after `..`")),
        Some((base, head)) => Ok(Revs::Range {
            base: base.to_string(),
            head: head.to_string(),
        }),
    }
}

/// A kernel version from a top Makefile (`VERSION = 7`, `PATCHLEVEL = 3`, `SUBLEVEL = 4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct KernelVersion {
    /// `VERSION`.
    pub major: u32,
    /// `PATCHLEVEL`.
    pub minor: u32,
    /// `SUBLEVEL`.
    pub sub: u32,
}

impl KernelVersion {
    /// From a top Makefile's text; `None` without `VERSION =`.
    pub fn from_makefile(text: &str) -> Option<KernelVersion> {
        let field = |name: &str| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == name).then(|| v.trim().parse::<u32>().ok())?
            })
        };
        Some(KernelVersion {
            major: field("VERSION")?,
            minor: field("PATCHLEVEL").unwrap_or(0),
            sub: field("SUBLEVEL").unwrap_or(0),
        })
    }

    /// From a release (`7.3.4+deb13-amd64`, `6.12.117`).
    pub fn from_release(release: &str) -> Option<KernelVersion> {
        let head: String = release
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '.')
            .collect();
        let mut parts = head.split('.').map(|p| p.parse::<u32>().ok());
        Some(KernelVersion {
            major: parts.next()??,
            minor: parts.next().flatten().unwrap_or(0),
            sub: parts.next().flatten().unwrap_or(0),
        })
    }

    /// How far `other` is, series first (7.2 is nearer 7.3 than 6.12 is), then sublevel.
    pub fn distance(&self, other: &KernelVersion) -> (u32, u32) {
        let series = |v: &KernelVersion| v.major * 1000 + v.minor;
        (
            series(self).abs_diff(series(other)),
            self.sub.abs_diff(other.sub),
        )
    }
}

impl std::fmt::Display for KernelVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.sub)
    }
}

/// A git repository the user named, found at its top.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Repo {
    /// Its top (the working tree, or a bare repository's directory), canonical.
    pub path: PathBuf,
}

impl Repo {
    /// The repository at `path`, which must be its top: a directory inside another
    /// repository's working tree is refused, naming that repository.
    pub fn open(path: &Path) -> Result<Repo, GitError> {
        let not_repo = |output: String| GitError::NotARepository {
            path: path.to_path_buf(),
            output,
        };
        let canonical = std::fs::canonicalize(path).map_err(|e| not_repo(e.to_string()))?;
        if !canonical.is_dir() {
            return Err(not_repo("not a directory".into()));
        }
        let mut cmd = git(&canonical);
        cmd.args(["rev-parse", "--is-bare-repository"]);
        let bare = output(cmd)?.map_err(not_repo)?;
        if bare.trim() == "true" {
            return Ok(Repo { path: canonical });
        }
        let top = run(
            &canonical,
            &["rev-parse", "--show-toplevel"],
            "find the top of the working tree",
        )?;
        let top = std::fs::canonicalize(top.trim()).map_err(|e| not_repo(e.to_string()))?;
        if top != canonical {
            return Err(GitError::NotTop {
                path: path.to_path_buf(),
                top,
            });
        }
        Ok(Repo { path: canonical })
    }

    /// The commit `rev` names (`rev-parse --verify REV^{commit}`), a full SHA.
    pub fn commit_of(&self, rev: &str) -> Result<String, GitError> {
        let mut cmd = git(&self.path);
        cmd.args(["rev-parse", "--verify", "--quiet", "--end-of-options"])
            .arg(format!("{rev}^{{commit}}"));
        match output(cmd)? {
            Ok(sha) if !sha.trim().is_empty() => Ok(sha.trim().to_string()),
            Ok(_) | Err(_) => Err(GitError::NoSuchRef {
                repo: self.path.clone(),
                rev: rev.to_string(),
                output: "git rev-parse --verify finds no such commit".into(),
            }),
        }
    }

    /// One commit's short SHA, subject and whether it is a merge.
    pub fn describe(&self, sha: &str) -> Result<Commit, GitError> {
        let text = run(
            &self.path,
            &[
                "show",
                "-s",
                "--no-show-signature",
                "--format=%H%x00%h%x00%P%x00%s",
                sha,
            ],
            "read a commit",
        )?;
        self.commit_from_line(text.trim_end_matches('\n'))
            .ok_or_else(|| GitError::Failed {
                what: format!("read commit {sha}"),
                dir: self.path.clone(),
                output: text,
            })
    }

    /// A `%H%x00%h%x00%P%x00%s` line as a commit.
    fn commit_from_line(&self, line: &str) -> Option<Commit> {
        let mut f = line.splitn(4, '\0');
        let sha = f.next()?.to_string();
        let short = f.next()?.to_string();
        let parents = f.next()?;
        let subject = f.next().unwrap_or_default().to_string();
        if sha.is_empty() {
            return None;
        }
        Some(Commit {
            repo: self.path.clone(),
            sha,
            short,
            subject,
            merge: parents.split_whitespace().count() > 1,
        })
    }

    /// The first-parent commits of `base..head`, oldest first.
    pub fn first_parent_commits(&self, base: &str, head: &str) -> Result<Vec<Commit>, GitError> {
        let text = run(
            &self.path,
            &[
                "log",
                "--first-parent",
                "--reverse",
                "--no-show-signature",
                "--format=%H%x00%h%x00%P%x00%s",
                &format!("{base}..{head}"),
                "--",
            ],
            "list the commits of a range",
        )?;
        Ok(text
            .lines()
            .filter_map(|l| self.commit_from_line(l))
            .collect())
    }

    /// The kernel version of commit `sha`, after checking it is a Linux tree: a top Makefile
    /// with `VERSION =`, and `arch/x86/kvm/`. Read from the objects, nothing checked out.
    pub fn linux_version(&self, rev: &str, sha: &str) -> Result<KernelVersion, GitError> {
        let not_linux = |why: &str| GitError::NotLinux {
            repo: self.path.clone(),
            rev: rev.to_string(),
            sha: sha.to_string(),
            why: why.to_string(),
        };
        let mut cmd = git(&self.path);
        cmd.args(["cat-file", "-p", &format!("{sha}:Makefile")]);
        let makefile = output(cmd)?.map_err(|_| not_linux("it has no top-level Makefile"))?;
        let version = KernelVersion::from_makefile(&makefile)
            .ok_or_else(|| not_linux("its top Makefile has no `VERSION =` line"))?;
        let mut cmd = git(&self.path);
        cmd.args(["cat-file", "-t", &format!("{sha}:arch/x86/kvm")]);
        match output(cmd)? {
            Ok(kind) if kind.trim() == "tree" => Ok(version),
            _ => Err(not_linux("it has no arch/x86/kvm/ directory")),
        }
    }

    /// A fingerprint of what the Kconfig step of commit `sha` reads (every `Kconfig*` file,
    /// `scripts/kconfig/` and the `configs/` fragments): equal fingerprints make equal
    /// configs from equal inputs.
    pub fn kconfig_fingerprint(&self, sha: &str) -> Result<String, GitError> {
        let text = run(
            &self.path,
            &["ls-tree", "-r", "--full-tree", sha],
            "list the files of a commit",
        )?;
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| {
                let path = l.split_once('\t').map_or("", |(_, p)| p);
                let name = path.rsplit('/').next().unwrap_or(path);
                name.starts_with("Kconfig")
                    || path.starts_with("scripts/kconfig/")
                    || (path.contains("configs/") && name.ends_with(".config"))
            })
            .collect();
        Ok(sha256_hex(lines.join("\n").as_bytes()))
    }

    /// The cache's name for this repository: its canonical path hashed.
    pub fn cache_id(&self) -> String {
        sha256_hex(self.path.as_os_str().as_encoded_bytes())[..16].to_string()
    }
}

/// One commit of a repository.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Commit {
    /// Its repository's top.
    pub repo: PathBuf,
    /// The full SHA.
    pub sha: String,
    /// The SHA as git abbreviates it.
    pub short: String,
    /// The first line of its message.
    pub subject: String,
    /// Whether it has more than one parent (a range follows the first).
    pub merge: bool,
}

impl Commit {
    /// The kernel spec of this commit, `git:PATH@SHA`, which the build resolves.
    pub fn spec(&self) -> String {
        format!("git:{}@{}", self.repo.display(), self.sha)
    }

    /// `1a2b3c4d5e6f (kvm: a fix)`.
    pub fn label(&self) -> String {
        format!("{} ({})", self.short, self.subject)
    }
}

/// `git:PATH@REF`, resolved: the repository, the ref as given, its commit and kernel version.
#[derive(Debug, Clone, Serialize)]
pub struct GitSpec {
    /// As given.
    pub given: String,
    /// The repository.
    pub repo: Repo,
    /// The ref as given (`HEAD`, `v7.3`, a SHA).
    pub rev: String,
    /// The commit it names.
    pub commit: Commit,
    /// The kernel version of its top Makefile.
    pub version: KernelVersion,
}

impl GitSpec {
    /// Resolves the commit `revs` names in the repository at `repo` (the spec `given`),
    /// reading the repository only; a range is refused (a kernel under test is one commit).
    pub fn resolve(given: &str, repo: &Path, revs: &Revs) -> Result<GitSpec, GitError> {
        let Revs::One(rev) = revs else {
            return Err(GitError::RangeNotOne {
                spec: given.to_string(),
            });
        };
        let repo = Repo::open(repo)?;
        let sha = repo.commit_of(rev)?;
        let version = repo.linux_version(rev, &sha)?;
        let commit = repo.describe(&sha)?;
        Ok(GitSpec {
            given: given.to_string(),
            repo,
            rev: rev.to_string(),
            commit,
            version,
        })
    }
}

/// `git:PATH@BASE..HEAD`, resolved: the first-parent commits from BASE (excluded) to HEAD.
#[derive(Debug, Clone, Serialize)]
pub struct GitRange {
    /// As given.
    pub given: String,
    /// The repository.
    pub repo: Repo,
    /// The base commit (the parent of the first commit on the first-parent line).
    pub base: Commit,
    /// The commits, oldest first.
    commits: Vec<Commit>,
}

impl GitRange {
    /// Resolves the range `revs` names in the repository at `repo` (the spec `given`),
    /// reading the repository only. One commit, a range with no commits, or one whose base or
    /// head is not a Linux tree, is refused.
    pub fn resolve(given: &str, repo: &Path, revs: &Revs) -> Result<GitRange, GitError> {
        let Revs::Range { base, head } = revs else {
            return Err(GitError::BadSpec {
                spec: given.to_string(),
                why: "it names one commit, not a range BASE..HEAD".into(),
            });
        };
        let repo = Repo::open(repo)?;
        let base_sha = repo.commit_of(base)?;
        let head_sha = repo.commit_of(head)?;
        repo.linux_version(base, &base_sha)?;
        repo.linux_version(head, &head_sha)?;
        let commits = repo.first_parent_commits(&base_sha, &head_sha)?;
        if commits.is_empty() {
            return Err(GitError::EmptyRange {
                repo: repo.path.clone(),
                base: base.clone(),
                head: head.clone(),
            });
        }
        let base = repo.describe(&base_sha)?;
        Ok(GitRange {
            given: given.to_string(),
            repo,
            base,
            commits,
        })
    }

    /// The commits, oldest first, each to be judged against the one before it (the first
    /// against the base).
    pub fn commits(&self) -> &[Commit] {
        &self.commits
    }

    /// The merges among the range's commits (`3f2a1b0c (Merge side)`): the range follows
    /// first parents past them, and the reader must know it.
    pub fn merges(&self) -> Vec<String> {
        self.commits
            .iter()
            .filter(|c| c.merge)
            .map(Commit::label)
            .collect()
    }
}

/// hvlab's clone of a repository, in the cache: one per repository, its objects borrowed from
/// the user's through alternates, moved between commits by `checkout --detach --force` (which
/// rewrites only the files that differ, so an incremental build stays incremental). The
/// caller holds the cache's lock.
#[derive(Debug)]
pub struct Checkout {
    /// Its working tree.
    pub dir: PathBuf,
}

impl Checkout {
    /// The clone at `dir`, made (`clone --shared --no-checkout`) when missing. A clone is
    /// written beside `dir` and renamed into place, so a half-made one is never used.
    pub fn open(repo: &Repo, dir: &Path) -> Result<Checkout, GitError> {
        if dir.join(".git").is_dir() {
            return Ok(Checkout {
                dir: dir.to_path_buf(),
            });
        }
        let parent = dir.parent().unwrap_or(Path::new("/"));
        let fail = |e: std::io::Error| GitError::Failed {
            what: "make hvlab's clone".into(),
            dir: dir.to_path_buf(),
            output: e.to_string(),
        };
        std::fs::create_dir_all(parent).map_err(fail)?;
        let tmp = dir.with_extension("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        let _ = std::fs::remove_dir_all(dir);
        let mut cmd = git(parent);
        cmd.args(["clone", "--quiet", "--shared", "--no-checkout"])
            .arg(&repo.path)
            .arg(&tmp);
        output(cmd)?.map_err(|output| GitError::Failed {
            what: format!("clone {} (shared, no checkout)", repo.path.display()),
            dir: parent.to_path_buf(),
            output,
        })?;
        std::fs::rename(&tmp, dir).map_err(fail)?;
        Ok(Checkout {
            dir: dir.to_path_buf(),
        })
    }

    /// Moves the working tree to `sha` (detached), discarding anything changed in it.
    pub fn switch_to(&self, sha: &str) -> Result<(), GitError> {
        run(
            &self.dir,
            &["checkout", "--quiet", "--detach", "--force", sha],
            &format!("check out {sha} in hvlab's clone"),
        )?;
        Ok(())
    }

    /// The commit checked out.
    pub fn head(&self) -> Result<String, GitError> {
        Ok(run(
            &self.dir,
            &["rev-parse", "HEAD"],
            "read hvlab's clone's HEAD",
        )?
        .trim()
        .to_string())
    }
}

#[cfg(test)]
/// A Linux-looking git repository for tests here and in the modules that take git specs.
pub(crate) mod test_repo {
    use super::*;

    /// Runs git in `dir` for a test, with a fixed identity and dates.
    pub(crate) fn git_ok(dir: &Path, args: &[&str]) -> String {
        let mut cmd = git(dir);
        cmd.args(args)
            .env("GIT_AUTHOR_NAME", "t")
            .env("GIT_AUTHOR_EMAIL", "t@example.org")
            .env("GIT_COMMITTER_NAME", "t")
            .env("GIT_COMMITTER_EMAIL", "t@example.org")
            .env("GIT_AUTHOR_DATE", "2026-01-01T00:00:00Z")
            .env("GIT_COMMITTER_DATE", "2026-01-01T00:00:00Z");
        match output(cmd).expect("git runs") {
            Ok(out) => out,
            Err(e) => panic!("git {args:?} in {}: {e}", dir.display()),
        }
    }

    /// A tiny Linux-looking repository: a top Makefile with its version, `arch/x86/kvm/`,
    /// one commit per `subjects` entry (each changing `arch/x86/kvm/x86.c`), on `main`.
    pub(crate) fn linux_repo(dir: &Path, subjects: &[&str]) -> Vec<String> {
        git_ok(dir, &["init", "--quiet", "--initial-branch=main"]);
        std::fs::write(
            dir.join("Makefile"),
            "# SPDX\nVERSION = 7\nPATCHLEVEL = 3\nSUBLEVEL = 4\nEXTRAVERSION =\n",
        )
        .expect("write");
        std::fs::create_dir_all(dir.join("arch/x86/kvm")).expect("mkdir");
        let mut shas = Vec::new();
        for (i, s) in subjects.iter().enumerate() {
            std::fs::write(dir.join("arch/x86/kvm/x86.c"), format!("int v = {i};\n"))
                .expect("write");
            git_ok(dir, &["add", "-A"]);
            git_ok(dir, &["commit", "--quiet", "-m", s]);
            shas.push(git_ok(dir, &["rev-parse", "HEAD"]).trim().to_string());
        }
        shas
    }
}

#[cfg(test)]
mod tests {
    use super::test_repo::{git_ok, linux_repo};
    use super::*;
    use crate::error::fault_exit_code;

    /// `git:PATH@REF` read as the command line reads it, then resolved as the build does.
    fn resolve_one(text: &str) -> Result<GitSpec, GitError> {
        let (path, rev) = split_spec(text)?;
        GitSpec::resolve(text, &path, &parse_revs(text, &rev)?)
    }

    /// `git:PATH@BASE..HEAD`, likewise.
    fn resolve_range(text: &str) -> Result<GitRange, GitError> {
        let (path, rev) = split_spec(text)?;
        GitRange::resolve(text, &path, &parse_revs(text, &rev)?)
    }

    #[test]
    fn a_spec_splits_at_the_at_after_an_existing_path_and_expands_the_home() {
        let home = std::env::var("HOME").expect("HOME");
        assert_eq!(
            split_spec("git:~/linux@v7.3").expect("splits"),
            (PathBuf::from(&home).join("linux"), "v7.3".to_string())
        );
        assert_eq!(
            split_spec("git:~@HEAD").expect("splits").0,
            PathBuf::from(&home)
        );
        // A path holding `@`: the `@` after which the path exists.
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path().join("linux@work");
        std::fs::create_dir_all(&repo).expect("mkdir");
        let spec = format!("git:{}@HEAD@{{1}}", repo.display());
        assert_eq!(
            split_spec(&spec).expect("splits"),
            (repo.clone(), "HEAD@{1}".to_string())
        );
        for (spec, why) in [
            ("git:/x", "no `@REF`"),
            ("git:@HEAD", "no repository path"),
            ("git:/x@", "no ref after"),
        ] {
            let e = split_spec(spec).expect_err(spec);
            assert!(e.to_string().contains(why), "{e}");
            assert_eq!(fault_exit_code(e.fault()), 2);
        }
        assert_eq!(
            parse_revs("s", "v7.2..HEAD").expect("range"),
            Revs::Range {
                base: "v7.2".into(),
                head: "HEAD".into()
            }
        );
        assert_eq!(
            parse_revs("s", "HEAD~2").expect("one"),
            Revs::One("HEAD~2".into())
        );
        for rev in ["a...b", "..b", "a.."] {
            let e = parse_revs("s", rev).expect_err(rev);
            assert_eq!(fault_exit_code(e.fault()), 2, "{e}");
        }
    }

    #[test]
    fn versions_come_from_a_makefile_and_a_release_and_the_nearest_series_wins() {
        let v =
            KernelVersion::from_makefile("VERSION = 7\nPATCHLEVEL = 3\nSUBLEVEL = 4\nNAME = x\n")
                .expect("version");
        assert_eq!(v.to_string(), "7.3.4");
        assert_eq!(KernelVersion::from_makefile("all:\n\ttrue\n"), None);
        let deb = KernelVersion::from_release("7.2.13+deb13-amd64").expect("release");
        let old = KernelVersion::from_release("6.12.117+deb12-amd64").expect("release");
        assert!(v.distance(&deb) < v.distance(&old));
    }

    #[test]
    fn a_ref_resolves_to_its_commit_and_a_bad_ref_or_path_exits_2_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shas = linux_repo(dir.path(), &["base", "kvm: a change"]);
        let d = dir.path().display();
        let spec = resolve_one(&format!("git:{d}@HEAD")).expect("resolves");
        assert_eq!(spec.commit.sha, shas[1]);
        assert_eq!(spec.commit.subject, "kvm: a change");
        assert_eq!(spec.version.to_string(), "7.3.4");
        assert_eq!(
            spec.commit.spec(),
            format!("git:{}@{}", spec.repo.path.display(), shas[1])
        );
        assert_eq!(
            resolve_one(&format!("git:{d}@HEAD~1"))
                .expect("resolves")
                .commit
                .sha,
            shas[0]
        );
        let e = resolve_one(&format!("git:{d}@no-such-branch")).expect_err("bad ref");
        assert_eq!(fault_exit_code(e.fault()), 2);
        assert!(
            e.to_string().contains("`no-such-branch` is not a commit"),
            "{e}"
        );
        let plain = tempfile::tempdir().expect("tempdir");
        let e = resolve_one(&format!("git:{}@HEAD", plain.path().display()))
            .expect_err("not a repository");
        assert!(matches!(e, GitError::NotARepository { .. }), "{e}");
        assert_eq!(fault_exit_code(e.fault()), 2);
        let e = resolve_one(&format!("git:{d}/arch@HEAD")).expect_err("inside");
        assert!(matches!(e, GitError::NotTop { .. }), "{e}");
        let e = resolve_one(&format!("git:{d}@HEAD~1..HEAD")).expect_err("a range");
        assert!(matches!(e, GitError::RangeNotOne { .. }), "{e}");
    }

    #[test]
    fn a_tree_without_a_kernel_makefile_or_kvm_is_refused_with_exit_2() {
        let dir = tempfile::tempdir().expect("tempdir");
        git_ok(dir.path(), &["init", "--quiet"]);
        std::fs::write(dir.path().join("Makefile"), "all:\n\ttrue\n").expect("write");
        git_ok(dir.path(), &["add", "-A"]);
        git_ok(dir.path(), &["commit", "--quiet", "-m", "not linux"]);
        let spec = format!("git:{}@HEAD", dir.path().display());
        let e = resolve_one(&spec).expect_err("not linux");
        assert_eq!(fault_exit_code(e.fault()), 2);
        assert!(
            e.to_string()
                .contains("is not a Linux kernel tree: its top Makefile has no `VERSION =` line"),
            "{e}"
        );
        std::fs::write(dir.path().join("Makefile"), "VERSION = 7\n").expect("write");
        git_ok(dir.path(), &["commit", "--quiet", "-am", "a version"]);
        let e = resolve_one(&spec).expect_err("no kvm");
        assert!(
            e.to_string().contains("it has no arch/x86/kvm/ directory"),
            "{e}"
        );
    }

    #[test]
    fn a_range_lists_first_parent_commits_oldest_first_and_says_so_of_a_merge() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let shas = linux_repo(d, &["base", "one"]);
        git_ok(d, &["checkout", "--quiet", "-b", "side", &shas[0]]);
        std::fs::write(d.join("side.c"), "x\n").expect("write");
        git_ok(d, &["add", "-A"]);
        git_ok(d, &["commit", "--quiet", "-m", "on the side"]);
        git_ok(d, &["checkout", "--quiet", "main"]);
        git_ok(
            d,
            &["merge", "--quiet", "--no-ff", "-m", "Merge side", "side"],
        );
        std::fs::write(d.join("arch/x86/kvm/x86.c"), "int v = 9;\n").expect("write");
        git_ok(d, &["commit", "--quiet", "-am", "three"]);
        let range =
            resolve_range(&format!("git:{}@{}..main", d.display(), shas[0])).expect("range");
        let subjects: Vec<&str> = range.commits().iter().map(|c| c.subject.as_str()).collect();
        assert_eq!(subjects, ["one", "Merge side", "three"]);
        assert_eq!(range.base.sha, shas[0]);
        let merges: Vec<bool> = range.commits().iter().map(|c| c.merge).collect();
        assert_eq!(merges, [false, true, false]);
        let named = range.merges();
        assert_eq!(named.len(), 1, "{named:?}");
        assert!(named[0].contains("(Merge side)"), "{named:?}");
        // No merge: nothing to say.
        let plain =
            resolve_range(&format!("git:{}@{}..{}", d.display(), shas[0], shas[1])).expect("range");
        assert_eq!(plain.commits().len(), 1);
        assert!(plain.merges().is_empty());
        // Empty: HEAD is the base, or behind it.
        for rev in ["main..main", &format!("main..{}", shas[0])] {
            let e = resolve_range(&format!("git:{}@{rev}", d.display())).expect_err(rev);
            assert!(matches!(e, GitError::EmptyRange { .. }), "{e}");
            assert_eq!(fault_exit_code(e.fault()), 2);
        }
        let e = resolve_range(&format!("git:{}@nope..main", d.display())).expect_err("ref");
        assert!(matches!(e, GitError::NoSuchRef { .. }), "{e}");
    }

    /// Everything a build does in git leaves the user's repository as it was: its status
    /// (dirty and untracked files included), branches, HEAD and index.
    #[test]
    fn resolving_and_checking_out_in_the_cache_leaves_the_users_repository_untouched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let user = dir.path().join("linux");
        std::fs::create_dir_all(&user).expect("mkdir");
        let shas = linux_repo(&user, &["base", "one", "two"]);
        // A dirty tree: a change staged, a change not, an untracked file.
        std::fs::write(
            user.join("Makefile"),
            "VERSION = 7\nPATCHLEVEL = 3\n# staged\n",
        )
        .expect("write");
        git_ok(&user, &["add", "Makefile"]);
        std::fs::write(user.join("arch/x86/kvm/x86.c"), "dirty\n").expect("write");
        std::fs::write(user.join("untracked.c"), "new\n").expect("write");
        let state = |d: &Path| {
            [
                git_ok(d, &["status", "--porcelain", "--untracked-files=all"]),
                git_ok(d, &["for-each-ref"]),
                git_ok(d, &["rev-parse", "HEAD"]),
                git_ok(d, &["symbolic-ref", "HEAD"]),
                git_ok(d, &["ls-files", "--stage"]),
                git_ok(d, &["worktree", "list", "--porcelain"]),
            ]
        };
        let before = state(&user);
        let spec = resolve_one(&format!("git:{}@HEAD~1", user.display())).expect("spec");
        let range =
            resolve_range(&format!("git:{}@{}..HEAD", user.display(), shas[0])).expect("range");
        let clone = Checkout::open(&spec.repo, &dir.path().join("cache/src")).expect("clone");
        clone.switch_to(&spec.commit.sha).expect("checkout");
        assert_eq!(clone.head().expect("head"), shas[1]);
        // The clone holds the commit's files, not the user's dirty ones.
        assert_eq!(
            std::fs::read_to_string(clone.dir.join("arch/x86/kvm/x86.c")).expect("read"),
            "int v = 1;\n"
        );
        std::fs::write(clone.dir.join("arch/x86/kvm/x86.c"), "patched\n").expect("write");
        for c in range.commits() {
            clone.switch_to(&c.sha).expect("checkout");
        }
        assert_eq!(
            std::fs::read_to_string(clone.dir.join("arch/x86/kvm/x86.c")).expect("read"),
            "int v = 2;\n"
        );
        // Opening it again reuses the clone.
        let again = Checkout::open(&spec.repo, &clone.dir).expect("reopen");
        assert_eq!(again.head().expect("head"), shas[2]);
        assert_eq!(state(&user), before);
    }
}
