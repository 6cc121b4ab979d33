//! `hvlab trace`: attribute an external VMM's KVM ioctl latencies.
//!
//! The command runs under `strace -f -ttt -T -e trace=ioctl -e raw=ioctl`; raw request numbers
//! are decoded with hvlab's own KVM ioctl table (strace's names vary with its version). The
//! trace is read while it grows, so the VMM can be stopped as soon as its first `KVM_RUN`
//! appears: that is the moment the VM became ready, and everything before it is construction.
//!
//! Three parts: [`supervise`] runs strace and the traced command and never leaves either
//! behind, [`strace`] parses what strace writes, [`analysis`] attributes the stalls.

pub mod analysis;
pub mod strace;
pub mod supervise;

pub use analysis::{IoctlTotals, TraceReport, TraceStall, analyse};
pub use strace::{StraceParser, TracedIoctl, parse_strace};
pub use supervise::{SHIM_ARG, shim, trace};

use serde::Serialize;

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

    /// What kind of failure it is.
    pub fn fault(&self) -> hvlab_core::error::Fault {
        use hvlab_core::error::Fault;
        if self.is_host_limitation() {
            Fault::HostCannot
        } else if self.is_bad_input() {
            Fault::BadInput
        } else {
            Fault::Failed
        }
    }
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

#[cfg(test)]
mod tests {
    use super::strace::parse_seconds_ns;
    use super::*;
    use hvlab_core::ioctl_table::SrcuKernel;

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
