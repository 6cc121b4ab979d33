//! The sandbox a patched kernel's build runs in. A patch comes from a mailing list and its
//! Makefiles run during the build (`$(shell ...)`, recipes, scripts), so every `make` of a
//! kernel tree runs under bubblewrap: the whole filesystem read-only (the source it builds
//! too, with the patch laid over it, and `/tmp`) but the build's own output directory and
//! temporary directory, no network, a new user namespace with every capability dropped and
//! `no_new_privs`, its own pid namespace (when bwrap ends, the kernel ends everything inside),
//! and `--die-with-parent`. A write anywhere else fails, and the log names the path.
//!
//! [`run_to_end`] runs such a command so that nothing outlives hvlab and nothing runs past its
//! limits ([`super::limits`]): in a session and process group of its own, ended on
//! SIGINT/SIGTERM/SIGHUP or a limit reached (SIGTERM first, so make deletes the target it was
//! writing, then SIGKILL), and on SIGKILL of hvlab through the death signal.

use crate::kernel::which;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hvlab_core::error::Fault;
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use serde::{Deserialize, Serialize};

use super::limits::{BuildKind, BuildLimits, Guard, LimitHit, LimitOverrides};
use crate::sys::{StopSignals, own_session_dying_with_parent};

/// Why no sandbox can be made here.
#[derive(Debug, Clone, thiserror::Error, displaydoc::Display)]
pub enum SandboxError {
    /// A patched kernel's build runs the patch's Makefiles, so hvlab builds it in a bubblewrap sandbox, and bwrap is not installed here: apt-get install bubblewrap (or pass --no-sandbox to build unconfined, as your own user, trusting the patch).
    NotInstalled,
    /// A patched kernel's build runs in a bubblewrap sandbox, which needs user namespaces, and this host refuses them ({output}): allow them (sysctl -w kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0; on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0), or pass --no-sandbox to build unconfined, trusting the patch.
    UserNamespaces {
        /// bwrap's words.
        output: String,
    },
    /// A patched kernel's build runs in a bubblewrap sandbox, and a trial run of {bwrap} failed ({output}): fix bubblewrap on this host (`bwrap --ro-bind / / true` must work), or pass --no-sandbox to build unconfined, trusting the patch.
    TrialFailed {
        /// The bwrap tried.
        bwrap: PathBuf,
        /// What it said.
        output: String,
    },
}

impl SandboxError {
    /// No sandbox here: this host cannot do what was asked.
    pub fn fault(&self) -> Fault {
        Fault::HostCannot
    }
}

/// Whether builds must be sandboxed (`--no-sandbox` turns it off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Confine {
    /// Sandboxed, or not at all.
    #[default]
    Required,
    /// `--no-sandbox`: unconfined, as the caller.
    Off,
}

/// How builds run: confined or not, and the limits given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SandboxPolicy {
    /// Sandboxed, or (`--no-sandbox`) not.
    pub confine: Confine,
    /// `--build-timeout`, `--build-disk`, `--build-procs`.
    pub limits: LimitOverrides,
}

impl SandboxPolicy {
    /// Sandboxed, with the default limits.
    pub const REQUIRED: SandboxPolicy = SandboxPolicy {
        confine: Confine::Required,
        limits: LimitOverrides {
            wall: None,
            disk_bytes: None,
            processes: None,
        },
    };
    /// Unconfined (`--no-sandbox`), with the default limits.
    pub const OFF: SandboxPolicy = SandboxPolicy {
        confine: Confine::Off,
        limits: SandboxPolicy::REQUIRED.limits,
    };
}

/// How a build ran, as its record keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Confinement {
    /// In bubblewrap: read-only but its tree, no network, no privileges.
    Bubblewrap,
    /// Unconfined, as the caller, because `--no-sandbox` asked so.
    NoSandbox,
    /// Nothing was built (the image as shipped).
    NothingBuilt,
    /// A record from before hvlab said how its builds ran.
    #[default]
    NotRecorded,
}

/// Where commands of a build run: bubblewrap, or (with `--no-sandbox`) nothing; and the
/// limits they run under.
#[derive(Debug, Clone)]
pub struct Sandbox {
    bwrap: Option<PathBuf>,
    limits: LimitOverrides,
}

/// What a command in the sandbox sees and may write: the whole filesystem read-only, with
/// `overlays` laid over it (read-only too: a patched file over the source's), and `writable`
/// the only directories it can change. Its temporary files go to `tmp` (`TMPDIR`, inside a
/// writable one): `/tmp` itself stays the host's, read-only like the rest, so a write there
/// is refused and named like any other.
#[derive(Debug, Clone, Default)]
pub struct View {
    /// Read-only binds over the filesystem, `(real, seen)`, in the order they are laid.
    pub overlays: Vec<(PathBuf, PathBuf)>,
    /// The directories it may write.
    pub writable: Vec<PathBuf>,
    /// Its `TMPDIR`.
    pub tmp: Option<PathBuf>,
    /// Its working directory (else the first writable one).
    pub cwd: Option<PathBuf>,
}

impl View {
    /// A command that may write `writable` alone, its temporary files in `tmp`.
    pub fn writing(writable: &[&Path], tmp: Option<&Path>) -> View {
        View {
            overlays: Vec::new(),
            writable: writable.iter().map(|p| p.to_path_buf()).collect(),
            tmp: tmp.map(Path::to_path_buf),
            cwd: None,
        }
    }
}

impl Sandbox {
    /// The sandbox `policy` asks for: bubblewrap when it works here (found out once per
    /// process), else the reason none can be made; no sandbox when `--no-sandbox` was given.
    pub fn choose(policy: SandboxPolicy) -> Result<Sandbox, SandboxError> {
        let mut sandbox = match policy.confine {
            Confine::Off => Sandbox {
                bwrap: None,
                limits: LimitOverrides::default(),
            },
            Confine::Required => Sandbox::detect()?,
        };
        sandbox.limits = policy.limits;
        Ok(sandbox)
    }

    /// Bubblewrap, when it is installed and a trial run with the options builds use works.
    pub fn detect() -> Result<Sandbox, SandboxError> {
        static DETECTED: OnceLock<Result<PathBuf, SandboxError>> = OnceLock::new();
        DETECTED
            .get_or_init(|| try_bwrap(which("bwrap")))
            .clone()
            .map(|bwrap| Sandbox {
                bwrap: Some(bwrap),
                limits: LimitOverrides::default(),
            })
    }

    /// The same sandbox with these limits.
    pub fn with_limits(mut self, limits: LimitOverrides) -> Sandbox {
        self.limits = limits;
        self
    }

    /// How commands made by this sandbox run, for a build's record.
    pub fn confinement(&self) -> Confinement {
        match self.bwrap {
            Some(_) => Confinement::Bubblewrap,
            None => Confinement::NoSandbox,
        }
    }

    /// Whether a patched file can be laid over a source tree for the commands it makes (a
    /// mount namespace of their own): else a patch is applied in the tree itself.
    pub fn overlays(&self) -> bool {
        self.bwrap.is_some()
    }

    /// The limits of a build of `kind`: those given, else the kind's defaults.
    pub fn limits(&self, kind: BuildKind) -> BuildLimits {
        self.limits.of(kind)
    }

    /// A guard holding a command to `limits`, its writes landing in `watched`.
    pub fn guard(&self, limits: BuildLimits, watched: &[&Path]) -> Guard {
        Guard::new(limits, watched, self.bwrap.is_some())
    }

    /// `program` to run as `view` says (without a sandbox: itself, in the view's working
    /// directory, with its `TMPDIR`), under `guard`'s limits. Give it to [`run_to_end`] with
    /// the same guard.
    pub fn command(&self, program: impl AsRef<OsStr>, view: &View, guard: &Guard) -> Command {
        let mut cmd = match &self.bwrap {
            Some(bwrap) => {
                let mut cmd = Command::new(bwrap);
                cmd.args(bwrap_args(view))
                    .args(guard.wrapper())
                    .arg(program);
                cmd
            }
            None => Command::new(program),
        };
        if let Some(dir) = view.cwd.as_ref().or(view.writable.first()) {
            cmd.current_dir(dir);
        }
        if let Some(tmp) = &view.tmp {
            cmd.env("TMPDIR", tmp);
        }
        guard.prepare(&mut cmd);
        cmd
    }
}

/// bwrap's options before the program: the whole filesystem read-only (`/dev` too, but its
/// devices), the view's overlays laid over it, its writable directories bound writable, every
/// namespace new, nobody inside, no capability.
fn bwrap_args(view: &View) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = [
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        // bwrap's /dev is a writable tmpfs: read-only, so a build cannot fill memory there.
        "--remount-ro",
        "/dev",
        "--proc",
        "/proc",
    ]
    .iter()
    .map(Into::into)
    .collect();
    for (real, seen) in &view.overlays {
        args.extend([
            "--ro-bind".into(),
            real.as_os_str().into(),
            seen.as_os_str().into(),
        ]);
    }
    for w in &view.writable {
        args.extend(["--bind".into(), w.as_os_str().into(), w.as_os_str().into()]);
    }
    if let Some(dir) = view.cwd.as_ref().or(view.writable.first()) {
        args.extend(["--chdir".into(), dir.as_os_str().into()]);
    }
    args.extend(
        [
            // Network, IPC, pid, UTS, cgroup and user namespaces: no network, and the kernel
            // ends every process inside when bwrap's own ends.
            "--unshare-all",
            "--unshare-user",
            "--uid",
            "65534",
            "--gid",
            "65534",
            "--cap-drop",
            "ALL",
            "--die-with-parent",
            "--",
        ]
        .iter()
        .map(Into::into),
    );
    args
}

/// `bwrap`, when found, checked by a trial run with the options every build uses.
fn try_bwrap(bwrap: Option<PathBuf>) -> Result<PathBuf, SandboxError> {
    let Some(bwrap) = bwrap else {
        return Err(SandboxError::NotInstalled);
    };
    let scratch = std::env::temp_dir();
    let out = Command::new(&bwrap)
        .args(bwrap_args(&View::writing(&[&scratch], None)))
        .arg("true")
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(out) if out.status.success() => Ok(bwrap),
        Ok(out) => Err(trial_failure(
            &bwrap,
            String::from_utf8_lossy(&out.stderr).trim(),
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(SandboxError::NotInstalled),
        Err(e) => Err(trial_failure(&bwrap, &e.to_string())),
    }
}

/// What a failed trial run means: user namespaces refused, or something else, in bwrap's words.
fn trial_failure(bwrap: &Path, output: &str) -> SandboxError {
    let lower = output.to_lowercase();
    let namespaces = [
        "namespace",
        "uid map",
        "setting up uid",
        "no permissions to creat",
    ];
    if namespaces.iter().any(|w| lower.contains(w)) {
        SandboxError::UserNamespaces {
            output: output.to_string(),
        }
    } else {
        SandboxError::TrialFailed {
            bwrap: bwrap.to_path_buf(),
            output: output.to_string(),
        }
    }
}

/// How a command given to [`run_to_end`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// It exited by itself.
    Exited(ExitStatus),
    /// hvlab was asked to stop by this signal: the command and everything it started were
    /// ended.
    Stopped(i32),
    /// It reached a limit: it and everything it started were ended.
    Limit(LimitHit),
}

/// How long make gets, after SIGTERM, to delete the target it was writing.
const GRACE: Duration = Duration::from_secs(2);

/// Runs `cmd` to its end in a session of its own, dying with hvlab, held to `guard`'s
/// limits; on SIGINT, SIGTERM or SIGHUP, or a limit reached, ends its whole process group
/// (SIGTERM, then SIGKILL after [`GRACE`]). Any process of the group still alive when the
/// command ends is killed too, and every process of its cgroup. `log` is read for what the
/// guard looks for (a file grown too large) once it ended.
pub fn run_to_end(
    mut cmd: Command,
    guard: &mut Guard,
    log: Option<&Path>,
) -> std::io::Result<Ended> {
    own_session_dying_with_parent(&mut cmd);
    let signals = StopSignals::install();
    let mut child = cmd.spawn()?;
    let group = Pid::from_child(&child);
    guard.started(group.as_raw_nonzero().get());
    let ended = loop {
        if exited(group)? {
            break None;
        }
        let stop = match StopSignals::pending() {
            Some(sig) => Some(Ended::Stopped(sig)),
            None => guard.check().map(Ended::Limit),
        };
        if let Some(why) = stop {
            let _ = rustix::process::kill_process_group(group, Signal::TERM);
            let deadline = Instant::now() + GRACE;
            while Instant::now() < deadline && !exited(group)? {
                std::thread::sleep(Duration::from_millis(20));
            }
            break Some(why);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The leader is not reaped yet, so the group's id cannot have been reused: whatever is
    // left in it (a `sleep &` of a recipe, a make still deleting) goes now.
    let _ = rustix::process::kill_process_group(group, Signal::KILL);
    let status = child.wait()?;
    drop(signals);
    let text = log
        .and_then(|l| std::fs::read(l).ok())
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    // Ends whatever of it left the session (a daemon), and says what limit it reached.
    let too_large = text
        .lines()
        .find(|l| l.contains("File too large"))
        .map(last_path);
    let last = guard.finish(too_large);
    Ok(match ended {
        Some(why) => why,
        None => match last {
            Some(hit) => Ended::Limit(hit),
            None => Ended::Exited(status),
        },
    })
}

/// Whether the child `pid` has exited, leaving it to be reaped.
fn exited(pid: Pid) -> std::io::Result<bool> {
    let status = rustix::process::waitid(
        WaitId::Pid(pid),
        WaitIdOptions::EXITED | WaitIdOptions::NOHANG | WaitIdOptions::NOWAIT,
    )?;
    Ok(status.is_some())
}

/// A write the sandbox refused, found in a build's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedWrite {
    /// The path outside the writable directories.
    pub path: PathBuf,
    /// The log's line.
    pub line: String,
}

/// The first line of `log` saying a path outside `writable` could not be written (read-only
/// file system, permission denied, operation not permitted), with that path.
pub fn refused_write(log: &str, writable: &[&Path]) -> Option<RefusedWrite> {
    const REFUSALS: [&str; 3] = [
        "Read-only file system",
        "Permission denied",
        "Operation not permitted",
    ];
    log.lines().find_map(|line| {
        let at = REFUSALS.iter().find_map(|r| line.find(r))?;
        let path = last_absolute_path(&line[..at])?;
        if writable.iter().any(|w| path.starts_with(w)) {
            return None;
        }
        Some(RefusedWrite {
            path,
            line: line.trim().to_string(),
        })
    })
}

/// The last path in `text`: the last absolute one ([`last_absolute_path`]), else the last
/// quoted one, as the writer named it (`dd: error writing 'big.bin': File too large`).
pub(crate) fn last_path(text: &str) -> Option<PathBuf> {
    last_absolute_path(text).or_else(|| {
        let mut last: Option<(usize, &str)> = None;
        for (open, close) in [('\'', '\''), ('‘', '’'), ('"', '"')] {
            let mut at = 0;
            while let Some(start) = text[at..].find(open) {
                let inner_at = at + start + open.len_utf8();
                let Some(end) = text[inner_at..].find(close) else {
                    break;
                };
                let inner = &text[inner_at..inner_at + end];
                if !inner.is_empty() && last.is_none_or(|(p, _)| p < inner_at) {
                    last = Some((inner_at, inner));
                }
                at = inner_at + end + close.len_utf8();
            }
        }
        last.map(|(_, p)| PathBuf::from(p))
    })
}

/// The last absolute path in `text`: quoted ('/a b', ‘/a’, "/a", `/a') or a bare word
/// (`/bin/sh: 1: cannot create /x/y:`).
pub(crate) fn last_absolute_path(text: &str) -> Option<PathBuf> {
    let mut found: Option<String> = None;
    let quotes: [(char, char); 4] = [('\'', '\''), ('‘', '’'), ('"', '"'), ('`', '\'')];
    for (open, close) in quotes {
        let mut rest = text;
        while let Some(start) = rest.find(open) {
            let after = &rest[start + open.len_utf8()..];
            let Some(end) = after.find(close) else {
                break;
            };
            if after[..end].starts_with('/') {
                found = Some(after[..end].to_string());
            }
            rest = &after[end + close.len_utf8()..];
        }
    }
    if found.is_none() {
        found = text
            .split_whitespace()
            .map(|w| w.trim_end_matches(':'))
            .rfind(|w| w.starts_with('/') && w.len() > 1)
            .map(str::to_string);
    }
    found.map(PathBuf::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::fault_exit_code;

    #[test]
    fn a_refused_write_outside_the_tree_is_found_with_its_path() {
        let tree = Path::new("/cache/kbuild/x/modules");
        let log = "  CC [M]  arch/x86/kvm/x86.o\n\
                   touch: cannot touch '/root/.hvlab-owned': Read-only file system\n";
        let r = refused_write(log, &[tree]).expect("found");
        assert_eq!(r.path, Path::new("/root/.hvlab-owned"));
        assert!(r.line.starts_with("touch: cannot touch"), "{}", r.line);
        // dash's words, unquoted.
        let r = refused_write(
            "/bin/sh: 1: cannot create /etc/cron.d/x: Read-only file system\n",
            &[tree],
        )
        .expect("found");
        assert_eq!(r.path, Path::new("/etc/cron.d/x"));
        // GNU's curly quotes, and EACCES.
        let r = refused_write(
            "mkdir: cannot create directory ‘/usr/lib/evil’: Permission denied\n",
            &[tree],
        )
        .expect("found");
        assert_eq!(r.path, Path::new("/usr/lib/evil"));
        // Inside the tree, or without an absolute path: not a write outside.
        assert_eq!(
            refused_write(
                "cp: cannot create regular file '/cache/kbuild/x/modules/a.o': Permission denied\n",
                &[tree]
            ),
            None
        );
        assert_eq!(
            refused_write("scripts/foo.sh: Permission denied\n", &[tree]),
            None
        );
        assert_eq!(refused_write("  LD [M]  kvm.ko\n", &[tree]), None);
    }

    /// A writer stopped at the disk limit names its file, relative or not.
    #[test]
    fn a_file_too_large_is_named_as_its_writer_named_it() {
        assert_eq!(
            last_path("dd: error writing 'big.bin': File too large"),
            Some(PathBuf::from("big.bin"))
        );
        assert_eq!(
            last_path("cp: error writing ‘/x/out/f’: File too large"),
            Some(PathBuf::from("/x/out/f"))
        );
        assert_eq!(last_path("File too large"), None);
    }

    #[test]
    fn a_failed_trial_run_names_user_namespaces_or_quotes_bwrap() {
        let bwrap = Path::new("/usr/bin/bwrap");
        let e = trial_failure(
            bwrap,
            "bwrap: No permissions to creating new namespace, likely because the kernel does not allow non-privileged user namespaces.",
        );
        assert!(matches!(e, SandboxError::UserNamespaces { .. }), "{e:?}");
        assert!(
            e.to_string().contains("kernel.unprivileged_userns_clone=1"),
            "{e}"
        );
        let e = trial_failure(bwrap, "bwrap: setting up uid map: Permission denied");
        assert!(matches!(e, SandboxError::UserNamespaces { .. }), "{e:?}");
        let e = trial_failure(
            bwrap,
            "bwrap: Can't mount proc on /newroot/proc: Operation not permitted",
        );
        assert!(matches!(e, SandboxError::TrialFailed { .. }), "{e:?}");
        assert!(e.to_string().contains("Can't mount proc"), "{e}");
        assert_eq!(fault_exit_code(e.fault()), 3);
        let e = try_bwrap(None).expect_err("no bwrap");
        assert!(e.to_string().contains("apt-get install bubblewrap"), "{e}");
        assert!(e.to_string().contains("--no-sandbox"), "{e}");
        let e = try_bwrap(Some(PathBuf::from("/nonexistent/bwrap"))).expect_err("no bwrap");
        assert!(matches!(e, SandboxError::NotInstalled), "{e:?}");
    }

    /// Without a sandbox the program runs as itself, in the first writable directory.
    #[test]
    fn no_sandbox_runs_the_program_itself() {
        let s = Sandbox::choose(SandboxPolicy::OFF).expect("always");
        assert_eq!(s.confinement(), Confinement::NoSandbox);
        let dir = tempfile::tempdir().expect("tempdir");
        let mut guard = Guard::unlimited();
        let cmd = s.command("pwd", &View::writing(&[dir.path()], None), &guard);
        assert_eq!(cmd.get_program(), "pwd");
        let out = run_to_end(cmd, &mut guard, None);
        assert!(
            matches!(out, Ok(Ended::Exited(s)) if s.success()),
            "{out:?}"
        );
    }
}
