//! From a traced VMM's ioctls to its report: what happened before the first `KVM_RUN`, per-ioctl
//! totals, and the SRCU stalls with the ioctl that caused each.

use std::collections::HashMap;

use serde::Serialize;

use crate::analysis::stall::{Baselines, find_stalls, kernel_effects};
use hvlab_core::ioctl_table::SrcuKernel;
use hvlab_core::lifecycle::IoctlEvent;

use super::strace::TracedIoctl;

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
