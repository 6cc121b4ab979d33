//! The sandbox a patched kernel's build runs in. A patch comes from a mailing list and its
//! Makefiles run during the build (`$(shell ...)`, recipes, scripts), so every `make` of a
//! kernel tree runs under bubblewrap: the filesystem read-only but the tree it builds (and
//! any directory the caller names), a private `/tmp`, no network, a new user namespace with
//! every capability dropped and `no_new_privs`, its own pid namespace (when bwrap ends, the
//! kernel ends everything inside), and `--die-with-parent`.
//!
//! [`run_to_end`] runs such a command so that nothing outlives hvlab: in a session and process
//! group of its own, ended on SIGINT/SIGTERM/SIGHUP (SIGTERM first, so make deletes the target
//! it was writing, then SIGKILL), and on SIGKILL of hvlab through the death signal.

use crate::kernel::which;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use hvlab_core::error::Fault;
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions};
use serde::{Deserialize, Serialize};

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
pub enum SandboxPolicy {
    /// Sandboxed, or not at all.
    #[default]
    Required,
    /// `--no-sandbox`: unconfined, as the caller.
    Off,
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

/// Where commands of a build run: bubblewrap, or (with `--no-sandbox`) nothing.
#[derive(Debug, Clone)]
pub struct Sandbox {
    bwrap: Option<PathBuf>,
}

impl Sandbox {
    /// The sandbox `policy` asks for: bubblewrap when it works here (found out once per
    /// process), else the reason none can be made; no sandbox when `--no-sandbox` was given.
    pub fn choose(policy: SandboxPolicy) -> Result<Sandbox, SandboxError> {
        match policy {
            SandboxPolicy::Off => Ok(Sandbox { bwrap: None }),
            SandboxPolicy::Required => Sandbox::detect(),
        }
    }

    /// Bubblewrap, when it is installed and a trial run with the options builds use works.
    pub fn detect() -> Result<Sandbox, SandboxError> {
        static DETECTED: OnceLock<Result<PathBuf, SandboxError>> = OnceLock::new();
        DETECTED
            .get_or_init(|| try_bwrap(which("bwrap")))
            .clone()
            .map(|bwrap| Sandbox { bwrap: Some(bwrap) })
    }

    /// How commands made by this sandbox run, for a build's record.
    pub fn confinement(&self) -> Confinement {
        match self.bwrap {
            Some(_) => Confinement::Bubblewrap,
            None => Confinement::NoSandbox,
        }
    }

    /// `program` to run in the sandbox, able to write only under `writable` (and a private
    /// `/tmp` that vanishes with it); working directory the first writable one. Without a
    /// sandbox, `program` itself. Either way, give it to [`run_to_end`].
    pub fn command(&self, program: impl AsRef<OsStr>, writable: &[&Path]) -> Command {
        let mut cmd = match &self.bwrap {
            Some(bwrap) => {
                let mut cmd = Command::new(bwrap);
                cmd.args(bwrap_args(writable)).arg(program);
                cmd
            }
            None => Command::new(program),
        };
        if let Some(dir) = writable.first() {
            cmd.current_dir(dir);
        }
        cmd
    }
}

/// bwrap's options before the program: the whole filesystem read-only, `writable` bound
/// writable over it (after the private `/tmp`, so a tree under `/tmp` stays the real one),
/// every namespace new, nobody inside, no capability.
fn bwrap_args(writable: &[&Path]) -> Vec<std::ffi::OsString> {
    let mut args: Vec<std::ffi::OsString> = [
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
    ]
    .iter()
    .map(Into::into)
    .collect();
    for w in writable {
        args.extend(["--bind".into(), w.as_os_str().into(), w.as_os_str().into()]);
    }
    if let Some(dir) = writable.first() {
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
        .args(bwrap_args(&[&scratch]))
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited by itself.
    Exited(ExitStatus),
    /// hvlab was asked to stop by this signal: the command and everything it started were
    /// ended.
    Stopped(i32),
}

/// How long make gets, after SIGTERM, to delete the target it was writing.
const GRACE: Duration = Duration::from_secs(2);

/// Runs `cmd` to its end in a session of its own, dying with hvlab, and on SIGINT, SIGTERM
/// or SIGHUP ends its whole process group (SIGTERM, then SIGKILL after [`GRACE`]). Any
/// process of the group still alive when the command ends is killed too.
pub fn run_to_end(mut cmd: Command) -> std::io::Result<Ended> {
    own_session_dying_with_parent(&mut cmd);
    let signals = StopSignals::install();
    let mut child = cmd.spawn()?;
    let group = Pid::from_child(&child);
    let ended = loop {
        if exited(group)? {
            break None;
        }
        if let Some(sig) = StopSignals::pending() {
            let _ = rustix::process::kill_process_group(group, Signal::TERM);
            let deadline = Instant::now() + GRACE;
            while Instant::now() < deadline && !exited(group)? {
                std::thread::sleep(Duration::from_millis(20));
            }
            break Some(sig);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // The leader is not reaped yet, so the group's id cannot have been reused: whatever is
    // left in it (a `sleep &` of a recipe, a make still deleting) goes now.
    let _ = rustix::process::kill_process_group(group, Signal::KILL);
    let status = child.wait()?;
    drop(signals);
    Ok(match ended {
        Some(sig) => Ended::Stopped(sig),
        None => Ended::Exited(status),
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

/// The last absolute path in `text`: quoted ('/a b', ‘/a’, "/a", `/a') or a bare word
/// (`/bin/sh: 1: cannot create /x/y:`).
fn last_absolute_path(text: &str) -> Option<PathBuf> {
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
        let s = Sandbox::choose(SandboxPolicy::Off).expect("always");
        assert_eq!(s.confinement(), Confinement::NoSandbox);
        let dir = tempfile::tempdir().expect("tempdir");
        let cmd = s.command("pwd", &[dir.path()]);
        assert_eq!(cmd.get_program(), "pwd");
        let out = run_to_end(cmd);
        assert!(
            matches!(out, Ok(Ended::Exited(s)) if s.success()),
            "{out:?}"
        );
    }
}
