//! `hvlab trace`: attribute an external VMM's KVM ioctl latencies.
//!
//! The command runs under `strace -f -ttt -T -e trace=ioctl -e raw=ioctl`; raw request numbers
//! are decoded with hvlab's own KVM ioctl table (strace's names vary with its version). The
//! trace is read while it grows, so the VMM can be stopped as soon as its first `KVM_RUN`
//! appears: that is the moment the VM became ready, and everything before it is construction.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::ioctl_table;
use crate::analysis::stall::{Baselines, IoctlEvent, find_stalls, kernel_effects};
use crate::kvm::host::HostInfo;
use crate::kvm::ioctl_table::SrcuKernel;

/// Tracer errors.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum TraceError {
    /// strace is not installed; hvlab trace needs it (Debian/Ubuntu: apt-get install strace).
    NoStrace,
    /// hvlab trace needs a command after `--`, for example: hvlab trace -- qemu-system-x86_64 -M microvm -enable-kvm
    NoCommand,
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
        matches!(self, TraceError::NoStrace | TraceError::Strace(_))
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

fn strace_available() -> bool {
    Command::new("strace")
        .arg("-V")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Kills the traced process group when dropped, so no traced VMM outlives hvlab.
struct TracedGroup {
    child: Child,
}

impl TracedGroup {
    fn kill(&mut self) {
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: signalling our own child's process group (created with process_group(0));
            // a stale group id only makes kill fail with ESRCH.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
        let _ = self.child.wait();
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
    if command.is_empty() {
        return Err(TraceError::NoCommand);
    }
    if !strace_available() {
        return Err(TraceError::NoStrace);
    }
    let dir = std::env::temp_dir().join(format!("hvlab-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(TraceError::Read)?;
    let out_path: PathBuf = dir.join("strace.out");
    let err_path: PathBuf = dir.join("strace.err");
    let result = run_traced(
        command,
        until,
        timeout,
        show_output,
        host,
        &out_path,
        &err_path,
    );
    let _ = std::fs::remove_dir_all(&dir);
    result
}

fn run_traced(
    command: &[String],
    until: Until,
    timeout: Duration,
    show_output: bool,
    host: &HostInfo,
    out_path: &std::path::Path,
    err_path: &std::path::Path,
) -> Result<TraceReport, TraceError> {
    let err_file = File::create(err_path).map_err(TraceError::Read)?;
    let mut cmd = Command::new("strace");
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
    .arg(out_path)
    .arg("--")
    .args(command)
    .stdin(Stdio::null())
    .process_group(0);
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
        let exited = group.child.try_wait().map_err(TraceError::Read)?;
        read_new_lines(out_path, &mut pos, &mut partial, &mut parser)?;
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
            read_new_lines(out_path, &mut pos, &mut partial, &mut parser)?;
            break "stopped after the first KVM_RUN".to_string();
        }
        if started.elapsed() > timeout {
            group.kill();
            read_new_lines(out_path, &mut pos, &mut partial, &mut parser)?;
            break format!("stopped at the {}s timeout", timeout.as_secs());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let ioctls = parser.finish();
    if ioctls.is_empty() {
        let mut err = String::new();
        let _ = File::open(err_path).and_then(|mut f| f.read_to_string(&mut err));
        if err.contains("ptrace") || err.contains("Operation not permitted") {
            return Err(TraceError::Strace(
                err.trim().lines().last().unwrap_or("").to_string(),
            ));
        }
    }
    Ok(analyse(
        command.to_vec(),
        ended,
        ioctls,
        host.jiffy_ns(),
        host.srcu_kernel(),
    ))
}

fn read_new_lines(
    path: &std::path::Path,
    pos: &mut u64,
    partial: &mut String,
    parser: &mut StraceParser,
) -> Result<(), TraceError> {
    let Ok(mut f) = File::open(path) else {
        return Ok(()); // strace has not created it yet
    };
    f.seek(SeekFrom::Start(*pos)).map_err(TraceError::Read)?;
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).map_err(TraceError::Read)?;
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
