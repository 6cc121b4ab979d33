//! What the instruction clock does not see, said beside a verdict: on it a world switch, an
//! MSR write, a TLB flush and a cache miss each cost one instruction, so beside a time judged
//! in instructions the kab says which events moved between A and B: the host kernel's MSR
//! writes and TLB flushes the guest counted (`crate::analysis::calls::SideEvents`) and KVM's
//! own statistics (already judged as counts).

use serde::Serialize;

use crate::analysis::calls::{HostEvent, NotProbed, SideEvents};
use crate::analysis::icount::IcountAb;
use crate::analysis::metric_ab::MetricJudgement;

use super::VariantAb;
use super::metric::{MetricOutcome, Trust};

/// A host event counted per iteration moved when A and B differ by at least one event in this
/// many iterations: an event on the exit path moves by one (or more) per exit, while what the
/// counted repetition does besides its exits (building its VM, the timer ticks its extra
/// instructions span) moves the per-exit figure by hundredths. The counts come from one
/// untimed repetition a boot, so there is no spread to judge them by: this is the rule.
pub const MOVED_PER_ITERATION: f64 = 0.05;

/// A host event counted per repetition (a scenario without iterations) moved when A and B
/// differ by at least this share of the larger, and by at least [`MOVED_PER_REPETITION_MIN`].
pub const MOVED_PER_REPETITION_SHARE: f64 = 0.10;

/// See [`MOVED_PER_REPETITION_SHARE`].
pub const MOVED_PER_REPETITION_MIN: f64 = 2.0;

/// KVM statistics a reader looks for beside an exit's cost, said unchanged by name when they
/// did not move: (metric, words).
pub const KVM_NAMED: &[(&str, &str)] = &[
    ("kvm.vcpu.exits", "exits"),
    ("kvm.vcpu.tlb_flush", "KVM TLB flushes"),
    ("kvm.vcpu.pf_taken", "page faults"),
];

/// One host event on A and on B.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostEventAb {
    /// The event.
    pub event: HostEvent,
    /// Per iteration (else per repetition), A and B, when counted.
    pub per_unit: [Option<f64>; 2],
    /// Why a side did not count it.
    #[serde(skip_serializing_if = "not_missing")]
    pub not_counted: [Option<NotProbed>; 2],
    /// Whether it moved, by [`MOVED_PER_ITERATION`] (or the per-repetition rule).
    pub moved: bool,
    /// The keys (MSRs, flush reasons) that moved, with their per-unit counts on A and B.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub keys_moved: Vec<KeyMoved>,
}

fn not_missing(n: &[Option<NotProbed>; 2]) -> bool {
    n.iter().all(Option::is_none)
}

/// One key of a host event's histogram that moved.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeyMoved {
    /// The key as the kernel printed it (`c0000103`, the MSR in hex; a flush reason).
    pub key: String,
    /// Per unit, A and B.
    pub per_unit: [f64; 2],
}

/// A KVM statistic (a count the scenario records per repetition, or per exit) on A and B.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KvmCountAb {
    /// The metric (`kvm.vcpu.io_exits`).
    pub metric: String,
    /// Its medians, A and B.
    pub median: [f64; 2],
}

/// The events beside a verdict judged on the instruction clock.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventsBeside {
    /// Counted per iteration (the exits scenario: per exit), else per repetition.
    pub per_iteration: bool,
    /// The host kernel's events, when the guest counted them.
    pub host: Vec<HostEventAb>,
    /// KVM statistics judged moved (changed beyond their rule, or undecided).
    pub kvm_moved: Vec<KvmCountAb>,
    /// The [`KVM_NAMED`] statistics the variant has that did not move.
    pub kvm_unchanged: Vec<String>,
    /// The time judged on the instruction clock the events are said beside (an exit's
    /// roundtrip, else the first such time), whatever its outcome: a change within its
    /// tolerance is still the instructions the events came with.
    pub instructions: Option<(String, IcountAb)>,
}

impl EventsBeside {
    /// Whether any event moved.
    pub fn any_moved(&self) -> bool {
        !self.kvm_moved.is_empty() || self.host.iter().any(|e| e.moved)
    }

    /// The per-unit change of `event` (B − A), when it moved and both sides counted it.
    pub fn delta(&self, event: HostEvent) -> Option<f64> {
        self.host
            .iter()
            .find(|e| e.event == event && e.moved)
            .and_then(|e| Some(e.per_unit[1]? - e.per_unit[0]?))
    }
}

/// The metric a host event's judged change is named by (a count per exit, judged as KVM's
/// statistics are: B higher is worse).
pub const MSR_WRITES_METRIC: &str = "host.msr_writes";

/// The host's MSR writes, when they moved: judged as a count (higher is worse, as the
/// scenario's KVM statistics), since an instruction clock prices each at one instruction
/// though a real core serializes on it (hundreds of cycles, more under a hypervisor). The
/// counts are exact (one untimed repetition a boot, deterministic on the instruction
/// clock); TLB flushes are said, not judged: a task switch's flush follows the scheduler,
/// not the patched path. Per side, per unit: (A, B).
pub fn msr_writes_moved(e: &EventsBeside) -> Option<[f64; 2]> {
    let m = e
        .host
        .iter()
        .find(|h| h.event == HostEvent::MsrWrite && h.moved)?;
    Some([m.per_unit[0]?, m.per_unit[1]?])
}

/// Whether `a` and `b` differ by the rule of their unit.
fn moved(a: f64, b: f64, per_iteration: bool) -> bool {
    let delta = (b - a).abs();
    if per_iteration {
        delta >= MOVED_PER_ITERATION
    } else {
        delta >= MOVED_PER_REPETITION_MIN && delta >= MOVED_PER_REPETITION_SHARE * a.max(b)
    }
}

/// One host event on both sides.
#[allow(clippy::cast_precision_loss)] // counts far below 2^53
fn host_event(
    event: HostEvent,
    sides: [Option<&SideEvents>; 2],
    per_iteration: bool,
) -> HostEventAb {
    let per_unit = sides.map(|s| s.and_then(|s| s.per_unit(event)));
    let not_counted = sides.map(|s| {
        s.and_then(|s| s.events.iter().find(|e| e.event == event))
            .and_then(|e| e.counted.clone().err())
    });
    let is_moved = match per_unit {
        [Some(a), Some(b)] => moved(a, b, per_iteration),
        _ => false,
    };
    let mut keys_moved = Vec::new();
    if let [Some(a), Some(b)] = sides
        && is_moved
    {
        let unit = |s: &SideEvents| s.iterations.unwrap_or(s.repetitions).max(1) as f64;
        let key_of = |s: &SideEvents, key: &str| {
            s.events
                .iter()
                .find(|e| e.event == event)
                .and_then(|e| e.by_key.get(key))
                .map_or(0.0, |n| *n as f64 / unit(s))
        };
        let mut keys: Vec<&String> = [a, b]
            .iter()
            .flat_map(|s| s.events.iter().filter(|e| e.event == event))
            .flat_map(|e| e.by_key.keys())
            .collect();
        keys.sort();
        keys.dedup();
        for key in keys {
            let (ka, kb) = (key_of(a, key), key_of(b, key));
            if moved(ka, kb, per_iteration) {
                keys_moved.push(KeyMoved {
                    key: key.clone(),
                    per_unit: [ka, kb],
                });
            }
        }
    }
    HostEventAb {
        event,
        per_unit,
        not_counted,
        moved: is_moved,
        keys_moved,
    }
}

/// The events beside `v`'s verdict (of `scenario`), when a time of it was judged on the
/// instruction clock and there is anything to say: `None` otherwise.
pub fn events_beside(scenario: &str, v: &VariantAb) -> Option<EventsBeside> {
    let on_icount = v
        .metrics
        .iter()
        .any(|m| matches!(m.judgement, MetricJudgement::InstructionClock { .. }));
    if !on_icount {
        return None;
    }
    let sides = [v.events[0].as_ref(), v.events[1].as_ref()];
    // The host events' unit is their counted repetition's; KVM's statistics are recorded per
    // iteration by the exits scenario (its `ratio`s).
    let per_iteration = if sides.iter().any(Option::is_some) {
        sides.iter().flatten().all(|s| s.iterations.is_some())
    } else {
        scenario == crate::scenario::Kind::Exits.name()
    };
    let host: Vec<HostEventAb> = HostEvent::ALL
        .iter()
        .filter(|e| {
            sides
                .iter()
                .flatten()
                .any(|s| s.events.iter().any(|x| x.event == **e))
        })
        .map(|&e| host_event(e, sides, per_iteration))
        .collect();
    let kvm = || {
        v.metrics
            .iter()
            .filter(|m| m.trust == Trust::Count && m.metric.starts_with("kvm."))
    };
    let kvm_moved: Vec<KvmCountAb> = kvm()
        .filter(|m| m.outcome != MetricOutcome::Unmoved)
        .map(|m| KvmCountAb {
            metric: m.metric.clone(),
            median: m.median,
        })
        .collect();
    let kvm_unchanged: Vec<String> = KVM_NAMED
        .iter()
        .filter(|(metric, _)| {
            kvm().any(|m| m.metric == *metric && m.outcome == MetricOutcome::Unmoved)
        })
        .map(|(_, words)| (*words).to_string())
        .collect();
    if host.is_empty() && kvm_moved.is_empty() && kvm_unchanged.is_empty() {
        return None;
    }
    let icount = |m: &super::MetricAb| match &m.judgement {
        MetricJudgement::InstructionClock { judged } => Some((m.metric.clone(), judged.clone())),
        _ => None,
    };
    let instructions = v
        .metrics
        .iter()
        .filter(|m| m.metric == "roundtrip_ns")
        .chain(&v.metrics)
        .find_map(icount);
    Some(EventsBeside {
        per_iteration,
        host,
        kvm_moved,
        kvm_unchanged,
        instructions,
    })
}
