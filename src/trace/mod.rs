//! `hvlab trace`: attribute an external VMM's KVM ioctl latencies.
//!
//! The command runs under `strace -f -ttt -T -e trace=ioctl -e raw=ioctl`; raw request numbers
//! are decoded with hvlab's own KVM ioctl table (strace's names vary with its version). The
//! trace is read while it grows, so the VMM can be stopped as soon as its first `KVM_RUN`
//! appears: that is the moment the VM became ready, and everything before it is construction.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::analysis::stall::{Baselines, find_stalls, kernel_effects};
use crate::backend::host::HostInfo;
use crate::backend::ioctl_table;
use crate::backend::ioctl_table::SrcuKernel;
use crate::backend::lifecycle::IoctlEvent;

/// Tracer errors.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum TraceError {
    /// strace is not installed; hvlab trace needs it (Debian/Ubuntu: apt-get install strace).
    NoStrace,
    /// strace is installed ({0}) but does not work: `strace -V` {1}. Reinstall strace (Debian/Ubuntu: apt-get install --reinstall strace) or put a working one first on $PATH.
    BrokenStrace(String, String),
    /// hvlab trace needs a command after `--`, for example: hvlab trace -- qemu-system-x86_64 -M microvm -enable-kvm
    NoCommand,
    /// Cannot trace `{0}`: {1}. Give the VMM's command line after `--`, for example: hvlab trace -- qemu-system-x86_64 -M microvm -enable-kvm
    BadCommand(String, String),
    /// `{command}` made no KVM ioctls ({ended}): is this a VMM? hvlab trace attributes the KVM ioctls of a VMM such as qemu-system-x86_64 -enable-kvm, firecracker or cloud-hypervisor.
    NoKvmIoctls {
        /// The command.
        command: String,
        /// How it ended.
        ended: String,
    },
    /// interrupted by signal {0}
    Interrupted(i32),
    /// Cannot start strace: {0}
    Spawn(std::io::Error),
    /// Cannot read the trace: {0}
    Read(std::io::Error),
    /// strace could not trace the command: {0}. If ptrace is restricted, run as root or set kernel.yama.ptrace_scope=0.
    Strace(String),
}

impl TraceError {
    /// Whether the host lacks what tracing needs (exit code 3).
    pub fn is_host_limitation(&self) -> bool {
        matches!(
            self,
            TraceError::NoStrace
                | TraceError::BrokenStrace(..)
                | TraceError::Strace(_)
                | TraceError::NoKvmIoctls { .. }
        )
    }

    /// Whether the command line was at fault (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        matches!(self, TraceError::NoCommand | TraceError::BadCommand(..))
    }
}

/// One KVM ioctl from the trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TracedIoctl {
    /// Thread id.
    pub tid: u32,
    /// Start, ns since the trace's first KVM ioctl.
    pub start_ns: u64,
    /// Duration, ns.
    pub dur_ns: u64,
    /// KVM name.
    pub name: &'static str,
    /// The raw request.
    pub request: u64,
    /// `= 0`, `= 0x9`, `= -1 EINTR`, ... as strace printed it.
    pub result: String,
}

/// Parses `0x1f` or `31`.
fn parse_int(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Parses a decimal seconds string (`1795316198.177352`, `0.006615`) into ns without going
/// through a float.
fn parse_seconds_ns(s: &str) -> Option<u64> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let whole: u64 = whole.parse().ok()?;
    let mut digits: String = frac.chars().take(9).collect();
    if !digits.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    while digits.len() < 9 {
        digits.push('0');
    }
    Some(whole.checked_mul(1_000_000_000)? + digits.parse::<u64>().ok()?)
}

#[derive(Debug)]
struct Pending {
    start_abs_ns: u64,
    request: u64,
}

/// Incremental parser of strace output: feed lines as they arrive.
#[derive(Debug, Default)]
pub struct StraceParser {
    unfinished: HashMap<u32, Pending>,
    origin_ns: Option<u64>,
    ioctls: Vec<TracedIoctl>,
}

impl StraceParser {
    /// A fresh parser.
    pub fn new() -> StraceParser {
        StraceParser::default()
    }

    /// Consumes one line; returns true when it completed a KVM ioctl or opened a `KVM_RUN`.
    pub fn feed(&mut self, line: &str) -> bool {
        let mut rest = line.trim_start();
        // With -f, lines start with the thread id; it is absent while only one task exists.
        let mut tid = 0u32;
        if let Some((first, tail)) = rest.split_once(char::is_whitespace)
            && !first.contains('.')
            && let Ok(t) = first.parse::<u32>()
        {
            tid = t;
            rest = tail.trim_start();
        }
        let Some((ts, call)) = rest.split_once(char::is_whitespace) else {
            return false;
        };
        let Some(ts_ns) = parse_seconds_ns(ts) else {
            return false;
        };
        let call = call.trim_start();
        if let Some(args) = call.strip_prefix("ioctl(") {
            let mut parts = args.splitn(3, ',');
            let (_fd, req) = (parts.next(), parts.next());
            let Some(request) =
                req.and_then(|r| parse_int(r.split_whitespace().next().unwrap_or("")))
            else {
                return false;
            };
            let Some(name) = ioctl_table::decode(request) else {
                return false;
            };
            if call.ends_with("<unfinished ...>") {
                self.unfinished.insert(
                    tid,
                    Pending {
                        start_abs_ns: ts_ns,
                        request,
                    },
                );
                return name == "KVM_RUN";
            }
            return self.complete(tid, ts_ns, request, name, call);
        }
        if call.starts_with("<... ioctl resumed>") {
            let Some(p) = self.unfinished.remove(&tid) else {
                return false;
            };
            let Some(name) = ioctl_table::decode(p.request) else {
                return false;
            };
            return self.complete(tid, p.start_abs_ns, p.request, name, call);
        }
        false
    }

    fn complete(
        &mut self,
        tid: u32,
        start_abs_ns: u64,
        request: u64,
        name: &'static str,
        call: &str,
    ) -> bool {
        // `... ) = RESULT <DURATION>`; a call cut short by the process dying ends `= ?`.
        let Some((_, after_eq)) = call.rsplit_once(") = ") else {
            return false;
        };
        let Some((result, dur)) = after_eq.rsplit_once(" <") else {
            return false;
        };
        let Some(dur_ns) = dur.strip_suffix('>').and_then(parse_seconds_ns) else {
            return false;
        };
        if result.trim() == "?" {
            return false;
        }
        let origin = *self.origin_ns.get_or_insert(start_abs_ns);
        self.ioctls.push(TracedIoctl {
            tid,
            start_ns: start_abs_ns.saturating_sub(origin),
            dur_ns,
            name,
            request,
            result: result.trim().to_string(),
        });
        true
    }

    /// Whether a `KVM_RUN` has started (finished or not).
    pub fn saw_run(&self) -> bool {
        self.ioctls.iter().any(|i| i.name == "KVM_RUN")
            || self
                .unfinished
                .values()
                .any(|p| ioctl_table::decode(p.request) == Some("KVM_RUN"))
    }

    /// The completed KVM ioctls, in start order.
    pub fn finish(mut self) -> Vec<TracedIoctl> {
        self.ioctls.sort_by_key(|i| (i.start_ns, i.tid));
        self.ioctls
    }
}

/// Parses a whole strace output.
pub fn parse_strace(text: &str) -> Vec<TracedIoctl> {
    let mut p = StraceParser::new();
    for line in text.lines() {
        p.feed(line);
    }
    p.finish()
}

/// When to stop the traced command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Until {
    /// Stop it once its first `KVM_RUN` has started.
    FirstRun,
    /// Let it run to its end.
    Exit,
}

/// Per-ioctl totals.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IoctlTotals {
    /// KVM name.
    pub name: String,
    /// Calls.
    pub count: usize,
    /// Total time, ms.
    pub total_ms: f64,
    /// Median call, ms.
    pub median_ms: f64,
    /// Slowest call, ms.
    pub max_ms: f64,
}

/// A stall in a traced VMM.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TraceStall {
    /// Index in `ioctls`.
    pub index: usize,
    /// The stalled ioctl.
    pub ioctl: String,
    /// When it started, ms into the trace.
    pub at_ms: f64,
    /// How long it took, ms.
    pub duration_ms: f64,
    /// Excess over its baseline, in jiffies.
    pub jiffies: f64,
    /// The registration that started the grace period.
    pub caused_by: Option<String>,
    /// Index of that registration in `ioctls`.
    pub caused_by_index: Option<usize>,
}

/// What `hvlab trace` reports.
#[derive(Debug, Clone, Serialize)]
pub struct TraceReport {
    /// The traced command line.
    pub command: Vec<String>,
    /// How tracing ended.
    pub ended: String,
    /// Jiffy used to judge stalls, ns.
    pub jiffy_ns: u64,
    /// Every KVM ioctl seen, in start order.
    pub ioctls: Vec<TracedIoctl>,
    /// Index of the first `KVM_RUN`, if any.
    pub first_run: Option<usize>,
    /// Time from the first KVM ioctl to the first `KVM_RUN`, ms.
    pub ready_ms: Option<f64>,
    /// Time spent inside KVM ioctls before the first `KVM_RUN`, ms.
    pub pre_run_ioctl_ms: f64,
    /// Totals per ioctl name, by total time.
    pub totals: Vec<IoctlTotals>,
    /// Stalls among the ioctls.
    pub stalls: Vec<TraceStall>,
}

/// Builds the report from parsed ioctls.
pub fn analyse(
    command: Vec<String>,
    ended: String,
    ioctls: Vec<TracedIoctl>,
    jiffy_ns: u64,
    srcu: SrcuKernel,
) -> TraceReport {
    let events: Vec<IoctlEvent> = ioctls
        .iter()
        .map(|i| IoctlEvent {
            name: i.name.to_string(),
            start_ns: i.start_ns,
            dur_ns: i.dur_ns,
            flags: None,
        })
        .collect();
    let baselines = Baselines::learn(&events);
    let stalls = find_stalls(&events, &baselines, jiffy_ns, kernel_effects(srcu))
        .into_iter()
        .map(|s| TraceStall {
            index: s.index,
            at_ms: events[s.index].start_ns as f64 / 1e6,
            duration_ms: s.dur_ns as f64 / 1e6,
            jiffies: s.jiffies,
            caused_by_index: s.caused_by.as_ref().map(|(i, _)| *i),
            caused_by: s.caused_by.map(|(_, n)| n),
            ioctl: s.name,
        })
        .collect();
    let first_run = ioctls.iter().position(|i| i.name == "KVM_RUN");
    let pre_run = &ioctls[..first_run.unwrap_or(ioctls.len())];
    let mut by_name: HashMap<&str, Vec<u64>> = HashMap::new();
    for i in &ioctls {
        by_name.entry(i.name).or_default().push(i.dur_ns);
    }
    let mut totals: Vec<IoctlTotals> = by_name
        .into_iter()
        .map(|(name, durs)| {
            let as_ms: Vec<f64> = durs.iter().map(|d| *d as f64 / 1e6).collect();
            IoctlTotals {
                name: name.to_string(),
                count: durs.len(),
                total_ms: as_ms.iter().sum(),
                median_ms: crate::analysis::statistics::median(&as_ms),
                max_ms: as_ms.iter().copied().fold(0.0, f64::max),
            }
        })
        .collect();
    totals.sort_by(|a, b| {
        b.total_ms
            .total_cmp(&a.total_ms)
            .then_with(|| a.name.cmp(&b.name))
    });
    TraceReport {
        command,
        ended,
        jiffy_ns,
        first_run,
        ready_ms: first_run.map(|i| ioctls[i].start_ns as f64 / 1e6),
        pre_run_ioctl_ms: pre_run.iter().map(|i| i.dur_ns as f64 / 1e6).sum(),
        ioctls,
        totals,
        stalls,
    }
}

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
    // SAFETY: getppid and prctl(PR_SET_PDEATHSIG) take plain integers and touch no memory.
    let parent_gone = unsafe {
        let parent = libc::getppid();
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        // strace died before the death signal was armed: do not start the command at all.
        libc::getppid() != parent
    };
    if parent_gone {
        return 137;
    }
    let (Some(fds), Some(cmd)) = (args.first(), args.get(2)) else {
        eprintln!("hvlab trace: the exec shim needs FDS -- CMD");
        return 127;
    };
    for fd in fds
        .to_string_lossy()
        .split(',')
        .filter_map(|f| f.parse::<i32>().ok())
    {
        // SAFETY: closing descriptors hvlab passed down for strace alone; nothing here uses them.
        unsafe { libc::close(fd) };
    }
    let err = Command::new(cmd).args(&args[3..]).exec();
    eprintln!("hvlab trace: cannot run `{}`: {err}", cmd.to_string_lossy());
    127
}

/// The signal that asked hvlab to stop (0: none).
static STOP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    STOP.store(sig, Ordering::SeqCst);
}

/// SIGINT, SIGTERM and SIGHUP handlers for the time of a trace: they only record the signal,
/// and the trace loop forwards it to the traced group, cleans up and returns. The previous
/// handlers come back on drop.
struct StopSignals {
    old: Vec<(libc::c_int, libc::sigaction)>,
}

impl StopSignals {
    fn install() -> StopSignals {
        STOP.store(0, Ordering::SeqCst);
        let mut old = Vec::new();
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: a zeroed sigaction is a valid "no flags, empty mask" value; the handler
            // only stores to an atomic, which is async-signal-safe.
            unsafe {
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = on_stop_signal as extern "C" fn(libc::c_int) as usize;
                libc::sigemptyset(&raw mut act.sa_mask);
                let mut prev: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, &raw const act, &raw mut prev) == 0 {
                    if prev.sa_sigaction == libc::SIG_IGN {
                        // Ignored by whoever started hvlab (nohup, a background job): keep it so.
                        libc::sigaction(sig, &raw const prev, std::ptr::null_mut());
                    } else {
                        old.push((sig, prev));
                    }
                }
            }
        }
        StopSignals { old }
    }

    fn pending() -> Option<i32> {
        match STOP.load(Ordering::SeqCst) {
            0 => None,
            sig => Some(sig),
        }
    }
}

impl Drop for StopSignals {
    fn drop(&mut self) {
        for (sig, prev) in &self.old {
            // SAFETY: restoring the sigaction that was in place before `install`.
            unsafe { libc::sigaction(*sig, prev, std::ptr::null_mut()) };
        }
    }
}

/// The name of a stop signal, for messages.
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// An anonymous in-memory file: nothing on disk to leave behind, whatever kills hvlab.
fn memfd(name: &str) -> Result<File, TraceError> {
    let c = std::ffi::CString::new(name)
        .map_err(|_| TraceError::Read(std::io::Error::other("NUL in name")))?;
    // SAFETY: `c` is a valid C string; memfd_create returns a new descriptor or -1.
    let fd = unsafe { libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(TraceError::Read(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Kills the traced process group when dropped, so no traced VMM outlives hvlab.
struct TracedGroup {
    child: Child,
}

impl TracedGroup {
    fn signal(&self, sig: libc::c_int) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: signalling our own child's process group (created with process_group(0));
            // a stale group id only makes kill fail with ESRCH.
            unsafe { libc::kill(-pid, sig) };
        }
    }

    fn kill(&mut self) {
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }

    /// Forwards `sig` to strace and the traced command, gives them a moment to exit, then
    /// kills what is left (a stopped tracee too: SIGKILL needs no SIGCONT).
    fn stop(&mut self, sig: libc::c_int) {
        self.signal(sig);
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
        }
    }
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
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls (prctl, fcntl) on values captured by copy.
    unsafe {
        cmd.pre_exec(move || {
            // strace dies with hvlab, even by SIGKILL; the shim then takes the command along.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // strace writes the trace to /proc/self/fd/N: let it inherit that descriptor.
            if libc::fcntl(out_fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    if show_output {
        cmd.stdout(Stdio::inherit()).stderr(err_file);
    } else {
        cmd.stdout(Stdio::null()).stderr(err_file);
    }
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
            return Err(TraceError::BadCommand(command.join(" "), line));
        }
        if text.contains("ptrace") || text.contains("Operation not permitted") {
            return Err(TraceError::Strace(
                text.trim().lines().last().unwrap_or("").to_string(),
            ));
        }
        return Err(TraceError::NoKvmIoctls {
            command: command.join(" "),
            ended,
        });
    }
    Ok(analyse(command.to_vec(), ended, ioctls, jiffy_ns, srcu))
}

/// Everything in a memory file, lossily as text.
fn read_all(f: &File) -> String {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut pos = 0u64;
    while let Ok(n) = f.read_at(&mut chunk, pos) {
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        pos += n as u64;
    }
    String::from_utf8_lossy(&buf).into_owned()
}

fn read_new_lines(
    f: &File,
    pos: &mut u64,
    partial: &mut String,
    parser: &mut StraceParser,
) -> Result<(), TraceError> {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = f
            .read_at(&mut chunk, *pos + buf.len() as u64)
            .map_err(TraceError::Read)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    *pos += buf.len() as u64;
    partial.push_str(&String::from_utf8_lossy(&buf));
    while let Some(nl) = partial.find('\n') {
        let line: String = partial.drain(..=nl).collect();
        parser.feed(line.trim_end());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
4908  1795316198.175000 ioctl(0x3, 0xae01, 0) = 0x8 <0.000398>
4908  1795316198.176490 ioctl(0x8, 0xae47, 0xfeffd000) = 0 <0.000012>
4908  1795316198.176500 ioctl(0x8, 0xae60, 0) = 0 <0.000074>
4908  1795316198.176600 ioctl(0x8, 0x4040ae79, 0x7ffe102c6c00) = 0 <0.000013>
4908  1795316198.176700 ioctl(0x8, 0x4040ae79, 0x7ffe102c6c00) = 0 <0.000013>
4908  1795316198.176800 ioctl(0x1, 0x5401, 0x7ffe) = -1 ENOTTY (Inappropriate ioctl for device) <0.000005>
4910  1795316198.177000 ioctl(0x8, 0xae41, 0) = 0x9 <0.000135>
4908  1795316198.177352 ioctl(0x8, 0x4020ae46, 0x7ffe102c6c00) = 0 <0.007415>
4908  1795316198.185000 ioctl(0x8, 0x4020ae46, 0x7ffe102c6c00) = 0 <0.000040>
4910  1795316198.200301 ioctl(0x9, 0xae80, 0 <unfinished ...>
4908  1795316198.200400 ioctl(0x9, 0xffffffffc008ae88, 0x7f78a32795c8) = 0x1 <0.000014>
4910  1795316198.200500 <... ioctl resumed>) = -1 EINTR (Interrupted system call) <0.000199>
4910  1795316198.200600 --- SIGUSR1 {si_signo=SIGUSR1} ---
4910  1795316198.200700 ioctl(0x9, 0xae80, 0 <unfinished ...>
4910  1795316198.300000 +++ killed by SIGKILL +++
";

    #[test]
    fn parses_pids_timestamps_durations_and_resumed_calls() {
        let ioctls = parse_strace(SAMPLE);
        let names: Vec<&str> = ioctls.iter().map(|i| i.name).collect();
        assert_eq!(
            names,
            vec![
                "KVM_CREATE_VM",
                "KVM_SET_TSS_ADDR",
                "KVM_CREATE_IRQCHIP",
                "KVM_IOEVENTFD",
                "KVM_IOEVENTFD",
                "KVM_CREATE_VCPU",
                "KVM_SET_USER_MEMORY_REGION",
                "KVM_SET_USER_MEMORY_REGION",
                "KVM_RUN",
                "KVM_GET_MSRS",
            ]
        );
        assert_eq!(ioctls[0].start_ns, 0);
        assert_eq!(ioctls[0].result, "0x8");
        assert_eq!(ioctls[6].start_ns, 2_352_000);
        assert_eq!(ioctls[6].dur_ns, 7_415_000);
        // The resumed KVM_RUN keeps its start from the unfinished line and its thread.
        assert_eq!(
            (ioctls[8].tid, ioctls[8].start_ns, ioctls[8].dur_ns),
            (4910, 25_301_000, 199_000)
        );
        assert!(ioctls[8].result.starts_with("-1 EINTR"));
    }

    #[test]
    fn an_open_kvm_run_counts_as_seen() {
        let mut p = StraceParser::new();
        assert!(!p.saw_run());
        p.feed("77 1.000000 ioctl(0x9, 0xae80, 0 <unfinished ...>");
        assert!(p.saw_run());
    }

    #[test]
    fn lines_without_a_pid_prefix_parse_too() {
        let ioctls = parse_strace("1795316198.175240 ioctl(0x3, 0xae01, 0) = 0x4 <0.000300>\n");
        assert_eq!(ioctls.len(), 1);
        assert_eq!(ioctls[0].tid, 0);
    }

    #[test]
    fn garbage_and_cut_off_calls_are_skipped() {
        let text = "not strace\n12 1.0 ioctl(0x3, 0xae01, 0) = ? <unavailable>\n12 1.5 ioctl(\n";
        assert!(parse_strace(text).is_empty());
    }

    #[test]
    fn the_report_flags_the_memslot_stall_and_blames_the_irqchip() {
        let report = analyse(
            vec!["qemu".into()],
            "test".into(),
            parse_strace(SAMPLE),
            4_000_000,
            SrcuKernel::of("6.18.0", false),
        );
        assert_eq!(report.first_run, Some(8));
        assert!((report.ready_ms.unwrap() - 25.301).abs() < 1e-9);
        assert_eq!(report.stalls.len(), 1);
        let s = &report.stalls[0];
        assert_eq!(s.ioctl, "KVM_SET_USER_MEMORY_REGION");
        assert_eq!(s.caused_by.as_deref(), Some("KVM_CREATE_IRQCHIP"));
        assert_eq!(s.caused_by_index, Some(2));
        assert_eq!(report.totals[0].name, "KVM_SET_USER_MEMORY_REGION");
        assert_eq!(report.totals[0].count, 2);
    }

    #[test]
    fn seconds_parse_exactly() {
        assert_eq!(parse_seconds_ns("0.006615"), Some(6_615_000));
        assert_eq!(
            parse_seconds_ns("1795316198.177352"),
            Some(1_795_316_198_177_352_000)
        );
        assert_eq!(parse_seconds_ns("1.5x"), None);
    }
}
