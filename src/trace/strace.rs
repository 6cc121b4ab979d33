//! Parsing strace's output: raw KVM ioctls with their timing, as they arrive.

use std::collections::HashMap;

use serde::Serialize;

use hvlab_core::ioctl_table;

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
pub(super) fn parse_seconds_ns(s: &str) -> Option<u64> {
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
    /// A `KVM_RUN` has started (finished or not): sticky, so a poll need not rescan.
    run_seen: bool,
}

impl StraceParser {
    /// A fresh parser.
    pub fn new() -> StraceParser {
        StraceParser::default()
    }

    /// Consumes one line.
    pub fn feed(&mut self, line: &str) {
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
            return;
        };
        let Some(ts_ns) = parse_seconds_ns(ts) else {
            return;
        };
        let call = call.trim_start();
        if let Some(args) = call.strip_prefix("ioctl(") {
            let mut parts = args.splitn(3, ',');
            let (_fd, req) = (parts.next(), parts.next());
            let Some(request) =
                req.and_then(|r| parse_int(r.split_whitespace().next().unwrap_or("")))
            else {
                return;
            };
            let Some(name) = ioctl_table::decode(request) else {
                return;
            };
            if call.ends_with("<unfinished ...>") {
                self.unfinished.insert(
                    tid,
                    Pending {
                        start_abs_ns: ts_ns,
                        request,
                    },
                );
                self.run_seen |= name == "KVM_RUN";
                return;
            }
            self.complete(tid, ts_ns, request, name, call);
            return;
        }
        if call.starts_with("<... ioctl resumed>") {
            let Some(p) = self.unfinished.remove(&tid) else {
                return;
            };
            if let Some(name) = ioctl_table::decode(p.request) {
                self.complete(tid, p.start_abs_ns, p.request, name, call);
            }
        }
    }

    fn complete(
        &mut self,
        tid: u32,
        start_abs_ns: u64,
        request: u64,
        name: &'static str,
        call: &str,
    ) {
        // `... ) = RESULT <DURATION>`; a call cut short by the process dying ends `= ?`.
        let Some((_, after_eq)) = call.rsplit_once(") = ") else {
            return;
        };
        let Some((result, dur)) = after_eq.rsplit_once(" <") else {
            return;
        };
        let Some(dur_ns) = dur.strip_suffix('>').and_then(parse_seconds_ns) else {
            return;
        };
        if result.trim() == "?" {
            return;
        }
        self.run_seen |= name == "KVM_RUN";
        let origin = *self.origin_ns.get_or_insert(start_abs_ns);
        self.ioctls.push(TracedIoctl {
            tid,
            start_ns: start_abs_ns.saturating_sub(origin),
            dur_ns,
            name,
            request,
            result: result.trim().to_string(),
        });
    }

    /// Whether a `KVM_RUN` has started (finished or not).
    pub fn saw_run(&self) -> bool {
        self.run_seen
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
