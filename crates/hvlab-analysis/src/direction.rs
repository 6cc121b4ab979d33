//! Which way each metric is better, declared once beside the metric in its scenario
//! (`MetricInfo::better`) and read by every judge: kab, `compare` and the suite. A count is
//! not always a cost: fewer dirty pages than pages written is a lost write, not an improvement.

use serde::{Deserialize, Serialize};

use crate::icount::IcountTolerance;

/// Which way a metric is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Direction {
    /// Fewer, shorter, smaller: a cost (times, faults, exits, stalls).
    LowerIsBetter,
    /// More: a rate (pages per ms, items per second).
    HigherIsBetter,
    /// Must equal the named metric of the same variant: either way off it is wrong
    /// (`pages_dirty` against `pages_written`: one fewer is a lost write).
    MustEqual(&'static str),
    /// Neither way is better: a setting or a description of the workload (a pool's size, a
    /// tick phase). A move is a change, never a regression or an improvement.
    Neither,
}

/// Which way a rank comparison calls B better, in the form a stored comparison keeps (a
/// [`Direction`] without the metric a must-equal one names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Better {
    /// Lower is better: B lower is FASTER.
    #[default]
    Lower,
    /// Higher is better: B higher is FASTER.
    Higher,
}

impl Better {
    /// Whether this is the default (lower), which stored comparisons leave out.
    pub fn is_lower(&self) -> bool {
        *self == Better::Lower
    }
}

/// What a metric's declaration says, as a judge reads it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Declared {
    /// Which way is better.
    pub direction: Direction,
    /// An exact count's relative change below which it is reported as a change and judged
    /// neither better nor worse (0: every change counts).
    pub count_tolerance: f64,
    /// How far a time on QEMU's instruction clock may move without being a change.
    pub icount_tolerance: IcountTolerance,
    /// Whether the scenario declares the metric; when not, it is judged lower-is-better with
    /// no tolerance, and the judgement says so.
    pub declared: bool,
}

impl Declared {
    /// What a metric no scenario declares is judged by: lower is better, every change counts.
    pub const UNDECLARED: Declared = Declared {
        direction: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        declared: false,
    };
}

impl Direction {
    /// The direction a rank comparison of this metric alone calls by. A must-equal metric
    /// compared without its partner, and one neither way better, keep the value's order
    /// (lower first): the call then reads as which side is lower, not as a judgement.
    pub fn better(self) -> Better {
        match self {
            Direction::HigherIsBetter => Better::Higher,
            Direction::LowerIsBetter | Direction::MustEqual(_) | Direction::Neither => {
                Better::Lower
            }
        }
    }
}

impl std::fmt::Display for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Direction::LowerIsBetter => f.write_str("lower is better"),
            Direction::HigherIsBetter => f.write_str("higher is better"),
            Direction::MustEqual(other) => write!(f, "must equal {other}"),
            Direction::Neither => f.write_str("neither way is better"),
        }
    }
}

/// Whether `pattern`, a declared metric name, names `metric`: the same name, or a family
/// whose one wildcard (`<NAME>`, `<stat>` or `*`) stands for a non-empty part
/// (`ioctl.<NAME>_ms` names `ioctl.KVM_CREATE_VM_ms`).
pub fn names(pattern: &str, metric: &str) -> bool {
    let wildcard = pattern
        .find('<')
        .and_then(|start| {
            let end = start + pattern[start..].find('>')?;
            Some((start, end + 1))
        })
        .or_else(|| pattern.find('*').map(|at| (at, at + 1)));
    let Some((start, end)) = wildcard else {
        return pattern == metric;
    };
    let (prefix, suffix) = (&pattern[..start], &pattern[end..]);
    metric.len() > prefix.len() + suffix.len()
        && metric.starts_with(prefix)
        && metric.ends_with(suffix)
}

/// `-12.7%`, `+0.02%`, `+0.0%`: B's change against A as LKP prints it (two significant
/// figures below 1%, one decimal above); `None` when A is zero (no ratio to give).
pub fn change_pct(a: f64, b: f64) -> Option<String> {
    if a == 0.0 {
        return None;
    }
    let pct = (b - a) / a.abs() * 100.0;
    let sign = if pct < 0.0 { '-' } else { '+' };
    let size = pct.abs();
    Some(if size != 0.0 && size < 1.0 {
        format!("{sign}{size:.2}%")
    } else {
        format!("{sign}{size:.1}%")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_family_names_its_members_and_nothing_else() {
        assert!(names("ioctl.<NAME>_ms", "ioctl.KVM_CREATE_VM_ms"));
        assert!(names("ioctl.*_ms", "ioctl.KVM_CREATE_VM_ms"));
        assert!(names("kvm.vcpu.<stat>", "kvm.vcpu.pf_fixed"));
        assert!(!names("kvm.vcpu.<stat>", "kvm.vm.pf_fixed"));
        assert!(
            !names("ioctl.<NAME>_ms", "ioctl._ms"),
            "the wildcard is not empty"
        );
        assert!(!names("ioctl.<NAME>_ms", "ioctl.KVM_RUN_us"));
        assert!(names("stalls", "stalls"));
        assert!(!names("stalls", "stalls_ms"));
    }

    #[test]
    fn changes_read_as_lkp_prints_them() {
        assert_eq!(change_pct(4096.0, 4097.0).as_deref(), Some("+0.02%"));
        assert_eq!(change_pct(512.0, 4097.0).as_deref(), Some("+700.2%"));
        assert_eq!(change_pct(1.57, 1.37).as_deref(), Some("-12.7%"));
        assert_eq!(change_pct(5.0, 5.0).as_deref(), Some("+0.0%"));
        assert_eq!(change_pct(0.0, 3.0), None);
    }
}
