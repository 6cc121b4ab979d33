//! Running strace and the traced command so that neither outlives hvlab: signals are
//! forwarded, strace and the command die with hvlab (`PR_SET_PDEATHSIG`), and the trace lives
//! in memory files.

use std::ffi::OsString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

use crate::sys::{self, StopSignals};
use hvlab_core::host::HostInfo;
use hvlab_core::ioctl_table::SrcuKernel;

use super::analysis::{TraceReport, analyse};
use super::strace::StraceParser;
use super::{TraceError, Until};

/// Finds `program` the way execvp does: a path when it has a slash, else the first
/// executable file of that name on $PATH.
fn find_program(program: &str) -> Result<PathBuf, String> {
    let executable = |p: &Path| -> Result<(), String> {
        let meta = std::fs::metadata(p).map_err(|e| e.to_string())?;
        if meta.is_dir() {
            return Err("it is a directory".into());
        }
        if meta.permissions().mode() & 0o111 == 0 {
            return Err("it is not executable (chmod +x it)".into());
        }
        Ok(())
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return executable(&p)
            .map(|()| p)
            .map_err(|e| format!("{program}: {e}"));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/bin:/bin"));
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| executable(p).is_ok())
        .ok_or_else(|| format!("no program `{program}` on $PATH"))
}

fn check_strace() -> Result<PathBuf, TraceError> {
    let path = find_program("strace").map_err(|_| TraceError::NoStrace)?;
    let shown = path.display().to_string();
    match Command::new(&path)
        .arg("-V")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(s) if s.success() => Ok(path),
        Ok(s) => Err(TraceError::BrokenStrace(shown, format!("exited with {s}"))),
        Err(e) => Err(TraceError::BrokenStrace(
            shown,
            format!("could not run: {e}"),
        )),
    }
}

/// The first argument that makes `hvlab` the exec shim between strace and the traced command.
pub const SHIM_ARG: &str = "__hvlab-trace-exec";

/// The exec shim: strace starts it as the traced command; it asks the kernel to kill it when
/// strace dies (`PR_SET_PDEATHSIG`, which survives exec but not fork, so strace's child must
/// set it itself), closes hvlab's descriptors and execs the real command. `args` are
/// `FD,FD... -- CMD ARGS...`. Returns only on failure, with the exit code.
pub fn shim(args: &[OsString]) -> i32 {
    let parent = rustix::process::getppid();
    let armed = rustix::process::set_parent_process_death_signal(Some(Signal::KILL));
    // strace died before the death signal was armed: do not start the command at all.
    if armed.is_err() || rustix::process::getppid() != parent {
        return 137;
    }
    let (Some(fds), Some(cmd)) = (args.first(), args.get(2)) else {
        eprintln!("hvlab trace: the exec shim needs FDS -- CMD");
        return 127;
    };
    // The descriptors hvlab passed down for strace alone.
    sys::close_inherited(
        fds.to_string_lossy()
            .split(',')
            .filter_map(|f| f.parse::<i32>().ok()),
    );
    let err = Command::new(cmd).args(&args[3..]).exec();
    eprintln!("hvlab trace: cannot run `{}`: {err}", cmd.to_string_lossy());
    127
}

/// An anonymous in-memory file: nothing on disk to leave behind, whatever kills hvlab.
fn memfd(name: &str) -> Result<File, TraceError> {
    let fd = rustix::fs::memfd_create(name, rustix::fs::MemfdFlags::CLOEXEC)
        .map_err(|e| TraceError::Read(e.into()))?;
    Ok(File::from(fd))
}

/// Kills the traced process group when dropped, so no traced VMM outlives hvlab.
struct TracedGroup {
    child: Child,
}

impl TracedGroup {
    fn signal(&self, sig: Signal) {
        // Our own child's process group (created with process_group(0)); a stale group id
        // only makes kill fail with ESRCH.
        let _ = rustix::process::kill_process_group(Pid::from_child(&self.child), sig);
    }

    /// Kills strace, the traced command and every process it started, wherever they went:
    /// `timeout`, `setsid` and daemonising VMMs leave the process group, but hvlab is their
    /// subreaper ([`Subreaper`]), so they stay its descendants.
    fn kill(&mut self) {
        self.signal(Signal::KILL);
        let _ = self.child.wait();
        kill_descendants();
    }

    /// Forwards `sig` to strace and the traced command, gives them a moment to exit, then
    /// kills what is left (a stopped tracee too: SIGKILL needs no SIGCONT).
    fn stop(&mut self, sig: i32) {
        self.signal(sys::signal(sig));
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
    }
}

impl Drop for TracedGroup {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            self.kill();
        } else {
            kill_descendants();
        }
    }
}

/// Makes hvlab the subreaper of what it traces for the time of a trace (`prctl(2)`
/// `PR_SET_CHILD_SUBREAPER`): an orphan of the traced command (the VMM under `timeout` or
/// `setsid`, a daemon that double-forks) is reparented to hvlab, not to init, so hvlab can
/// still find and end it.
struct Subreaper {
    was: bool,
}

impl Subreaper {
    fn become_one() -> Subreaper {
        let was = rustix::process::child_subreaper().is_ok_and(|p| p.is_some());
        let _ = rustix::process::set_child_subreaper(Pid::from_raw(1));
        Subreaper { was }
    }
}

impl Drop for Subreaper {
    fn drop(&mut self) {
        if !self.was {
            let _ = rustix::process::set_child_subreaper(None);
        }
    }
}

/// The live descendants of process `root`, from the parent links in /proc.
fn descendants(root: u32) -> Vec<Pid> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut parent_of = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses; it ends at the
        // last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("");
        let Some(ppid) = fields.next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if state != "Z" && state != "X" {
            parent_of.push((pid, ppid));
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found
        .into_iter()
        .skip(1)
        .filter_map(|p| i32::try_from(p).ok().and_then(Pid::from_raw))
        .collect()
}

/// SIGKILLs every descendant of hvlab and reaps them, until none is left (a process may fork
/// between the scan and the kill: the next round takes the child), for at most two seconds.
fn kill_descendants() {
    let me = std::process::id();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = descendants(me);
        for &pid in &left {
            // A pid that just exited makes it fail with ESRCH.
            let _ = rustix::process::kill_process(pid, Signal::KILL);
        }
        reap_orphans();
        if left.is_empty() || Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reaps exited processes that were reparented to hvlab as subreaper (hvlab starts no other
/// children while tracing).
fn reap_orphans() {
    while let Ok(Some(_)) = rustix::process::waitpid(None, rustix::process::WaitOptions::NOHANG) {}
}

/// Traces `command` and reports its KVM ioctls.
pub fn trace(
    command: &[String],
    until: Until,
    timeout: Duration,
    show_output: bool,
    host: &HostInfo,
) -> Result<TraceReport, TraceError> {
    let Some(program) = command.first() else {
        return Err(TraceError::NoCommand);
    };
    let strace = check_strace()?;
    find_program(program).map_err(|why| TraceError::BadCommand(program.clone(), why))?;
    // The trace and strace's messages live in memory files: nothing on disk to clean up.
    let out = memfd("hvlab-trace-out")?;
    let err = memfd("hvlab-trace-err")?;
    let _signals = StopSignals::install();
    let _subreaper = Subreaper::become_one();
    run_traced(
        &strace,
        command,
        Traced {
            until,
            timeout,
            show_output,
            jiffy_ns: host.jiffy_ns(),
            srcu: host.srcu_kernel(),
        },
        (&out, &err),
    )
}

/// How to trace.
#[derive(Debug, Clone, Copy)]
struct Traced {
    until: Until,
    timeout: Duration,
    show_output: bool,
    jiffy_ns: u64,
    srcu: SrcuKernel,
}

fn run_traced(
    strace: &Path,
    command: &[String],
    how: Traced,
    (out, err): (&File, &File),
) -> Result<TraceReport, TraceError> {
    let Traced {
        until,
        timeout,
        show_output,
        jiffy_ns,
        srcu,
    } = how;
    let mut cmd = strace_command(strace, command, out, err, show_output)?;
    let mut group = TracedGroup {
        child: cmd.spawn().map_err(TraceError::Spawn)?,
    };
    let started = Instant::now();
    let mut parser = StraceParser::new();
    let mut pos = 0u64;
    let mut partial = String::new();
    let ended = loop {
        if let Some(sig) = StopSignals::pending() {
            group.stop(sig);
            return Err(TraceError::Interrupted(sig));
        }
        let exited = group.child.try_wait().map_err(TraceError::Read)?;
        read_new_lines(out, &mut pos, &mut partial, &mut parser)?;
        if let Some(status) = exited {
            if !partial.is_empty() {
                parser.feed(&std::mem::take(&mut partial));
            }
            // What it left running (a daemonised VMM) ends with the trace.
            kill_descendants();
            break format!("the command exited ({status})");
        }
        if until == Until::FirstRun && parser.saw_run() {
            // Let the KVM_RUN line that is in flight land, then stop the VMM.
            std::thread::sleep(Duration::from_millis(20));
            group.kill();
            read_new_lines(out, &mut pos, &mut partial, &mut parser)?;
            break "stopped after the first KVM_RUN".to_string();
        }
        if started.elapsed() > timeout {
            group.kill();
            read_new_lines(out, &mut pos, &mut partial, &mut parser)?;
            break format!("stopped at the {}s timeout", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let ioctls = parser.finish();
    if ioctls.is_empty() {
        return Err(nothing_traced(err, command, ended));
    }
    Ok(analyse(command.to_vec(), ended, ioctls, jiffy_ns, srcu))
}

/// strace running hvlab's exec shim and `command`: the trace into `out` (through
/// `/proc/self/fd/N`), strace's own messages into `err`, the command's output shown or not.
fn strace_command(
    strace: &Path,
    command: &[String],
    out: &File,
    err: &File,
    show_output: bool,
) -> Result<Command, TraceError> {
    let err_file = err.try_clone().map_err(TraceError::Read)?;
    let out_fd = out.as_raw_fd();
    let out_path = PathBuf::from(format!("/proc/self/fd/{out_fd}"));
    // strace runs hvlab's exec shim, which arranges for the command to die with strace.
    let shim: Vec<OsString> = match std::env::current_exe() {
        Ok(exe) => vec![
            exe.into_os_string(),
            SHIM_ARG.into(),
            out_fd.to_string().into(),
            "--".into(),
        ],
        Err(_) => Vec::new(),
    };
    let mut cmd = Command::new(strace);
    cmd.args([
        "-f",
        "-qq",
        "-ttt",
        "-T",
        "-e",
        "trace=ioctl",
        "-e",
        "raw=ioctl",
        "-o",
    ])
    .arg(&out_path)
    .arg("--")
    .args(&shim)
    .args(command)
    .stdin(Stdio::null())
    .process_group(0);
    // strace dies with hvlab, even by SIGKILL (the shim then takes the command along), and
    // writes the trace to /proc/self/fd/N: it inherits that descriptor.
    sys::die_with_parent_keeping(&mut cmd, out_fd);
    if show_output {
        cmd.stdout(Stdio::inherit()).stderr(err_file);
    } else {
        cmd.stdout(Stdio::null()).stderr(err_file);
    }
    Ok(cmd)
}

/// Why a trace found no KVM ioctl, from strace's messages: the command could not run,
/// ptrace is refused, or it ran and made none.
fn nothing_traced(err: &File, command: &[String], ended: String) -> TraceError {
    let text = read_all(err);
    let last = |needle: &str| {
        text.lines()
            .rev()
            .find(|l| l.contains(needle))
            .map(|l| l.trim().to_string())
    };
    if let Some(line) = last("hvlab trace: cannot run")
        .or_else(|| last("Can't stat"))
        .or_else(|| last("strace: exec"))
    {
        return TraceError::BadCommand(command.join(" "), line);
    }
    if text.contains("ptrace") || text.contains("Operation not permitted") {
        return TraceError::Strace(text.trim().lines().last().unwrap_or("").to_string());
    }
    TraceError::NoKvmIoctls {
        command: command.join(" "),
        ended,
    }
}

/// Everything in a memory file, lossily as text (what a failed read left out is left out: this
/// is for diagnostics).
fn read_all(f: &File) -> String {
    let mut buf = Vec::new();
    let _ = read_from(f, 0, &mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// Appends everything in `f` from byte `start` to `buf`.
fn read_from(f: &File, start: u64, buf: &mut Vec<u8>) -> std::io::Result<()> {
    let mut chunk = vec![0u8; 64 * 1024];
    let first = buf.len();
    loop {
        let n = f.read_at(&mut chunk, start + (buf.len() - first) as u64)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn read_new_lines(
    f: &File,
    pos: &mut u64,
    partial: &mut String,
    parser: &mut StraceParser,
) -> Result<(), TraceError> {
    let mut buf = Vec::new();
    read_from(f, *pos, &mut buf).map_err(TraceError::Read)?;
    *pos += buf.len() as u64;
    partial.push_str(&String::from_utf8_lossy(&buf));
    while let Some(nl) = partial.find('\n') {
        let line: String = partial.drain(..=nl).collect();
        parser.feed(line.trim_end());
    }
    Ok(())
}
