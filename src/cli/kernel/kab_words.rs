//! How a kab's figures, changes and stalls are written, the same in the terminal text and in
//! the cover letter.

use crate::analysis::direction::change_pct;
use crate::kernel::sandbox::Confinement;
use crate::lab::kab::{Cause, Change, GraceWait, SideFailure, StallAb, StallSide, VariantVerdict};

/// How a build ran, beside its compiler: an unconfined one is said loudly.
pub(super) fn confinement(c: Confinement) -> &'static str {
    match c {
        Confinement::Bubblewrap => "sandboxed",
        Confinement::NoSandbox => {
            "NOT sandboxed (--no-sandbox): the patch's Makefiles ran with your rights"
        }
        Confinement::NothingBuilt => "nothing built",
        Confinement::NotRecorded => "sandbox not recorded",
    }
}

/// `1.22`, `0.062`, `20`.
pub(super) fn num(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// `1 → 0`, for a pair of medians.
pub(super) fn pair(x: [f64; 2]) -> String {
    format!("{} → {}", num(x[0]), num(x[1]))
}

/// `1 min 12 s`, `13.2 s`.
pub(super) fn duration(secs: f64) -> String {
    if secs >= 60.0 {
        let whole = secs.round();
        format!("{:.0} min {:02.0} s", (whole / 60.0).floor(), whole % 60.0)
    } else {
        format!("{secs:.1} s")
    }
}

/// `KVM_SET_USER_MEMORY_REGION waits for the grace period of KVM_CREATE_IRQCHIP`.
pub(super) fn stall_words(s: &StallAb) -> String {
    format!(
        "{} waits for the grace period of {}",
        s.ioctl.trim_start_matches("ioctl."),
        s.cause
    )
}

/// `20 of 20 repetitions, 1.63–1.71 jiffies`.
pub(super) fn stall_side(side: &StallSide) -> String {
    let [lo, hi] = side.jiffies;
    let j = if (hi - lo).abs() < 0.05 {
        format!("{} jiffies", num(lo))
    } else {
        format!("{}–{} jiffies", num(lo), num(hi))
    };
    format!("{} of {} repetitions, {j}", side.stalled_reps, side.reps)
}

/// Which kernels something was found on (A's, then B's): `both`, `A only`, `B only`.
pub(super) fn sides_word(sides: [bool; 2]) -> &'static str {
    match sides {
        [true, true] => "both",
        [true, false] => "A only",
        _ => "B only",
    }
}

/// `KVM_IOEVENTFD 0.018 → 0.118 jiffies`; a count with its change as LKP prints it
/// (`kvm.vcpu.pf_fixed 512 → 4097 (+700.2%)`); a metric the scenario does not declare, with
/// how it was judged.
pub(super) fn change_words(c: &Change) -> String {
    let name = c.metric.trim_start_matches("ioctl.");
    let mut out = if c.unit == "count" {
        match change_pct(c.a, c.b) {
            Some(pct) => format!("{name} {} → {} ({pct})", num(c.a), num(c.b)),
            None => format!("{name} {} → {}", num(c.a), num(c.b)),
        }
    } else {
        format!("{name} {} → {} {}", num(c.a), num(c.b), c.unit)
    };
    if c.undeclared {
        out.push_str(" (not declared by its scenario: judged lower-is-better)");
    }
    out
}

/// A count that moved by less than its declared tolerance: `kvm.vcpu.pf_fixed +1 (+0.02%,
/// 4096 → 4097), under the 1% it tolerates`.
pub(super) fn small_change_words(c: &Change) -> String {
    let delta = c.b - c.a;
    let sign = if delta < 0.0 { "-" } else { "+" };
    format!(
        "{} {sign}{} ({}, {} → {}), under the {}% it tolerates: a change, not a verdict",
        c.metric,
        num(delta.abs()),
        change_pct(c.a, c.b).unwrap_or_default(),
        num(c.a),
        num(c.b),
        num(c.tolerance.unwrap_or(0.0) * 100.0)
    )
}

/// What one side waited for: `expedited at most, 0.020 jiffies`, `a normal grace period started by
/// KVM_CREATE_IRQCHIP, 2.00 jiffies`.
fn wait_words(w: &GraceWait) -> String {
    match w {
        GraceWait::Expedited { jiffies } => {
            format!("expedited at most, {} jiffies", num(*jiffies))
        }
        GraceWait::Normal {
            jiffies,
            started_by,
        } => format!(
            "a normal grace period{}, {} jiffies",
            started_by
                .as_ref()
                .map_or(String::new(), |r| format!(" started by {r}")),
            num(*jiffies)
        ),
    }
}

/// A cause in words: `KVM_SET_USER_MEMORY_REGION now waits a normal grace period on B: +1.98
/// jiffies (A: expedited at most, 0.020 jiffies; B: a normal grace
/// period started by KVM_CREATE_IRQCHIP, 2.00 jiffies)`; `SPTE prefetch: pages mapped per
/// fault 8 → 1.00 (4096 pages touched / kvm.vcpu.pf_fixed 512 → 4097)`.
pub(super) fn cause_words(c: &Cause) -> String {
    match c {
        Cause::GracePeriod { ioctl, waits } => {
            let [a, b] = waits;
            let delta = b.jiffies() - a.jiffies();
            let sign = if delta < 0.0 { "-" } else { "+" };
            let what = match (a, b) {
                (GraceWait::Expedited { .. }, GraceWait::Normal { .. }) => {
                    "now waits a normal grace period on B"
                }
                (GraceWait::Normal { .. }, GraceWait::Expedited { .. }) => {
                    "no longer waits a normal grace period on B"
                }
                _ if delta > 0.0 => "waits longer on B",
                _ => "waits less on B",
            };
            format!(
                "{ioctl} {what}: {sign}{} jiffies (A: {}; B: {})",
                num(delta.abs()),
                wait_words(a),
                wait_words(b)
            )
        }
        Cause::PagesPerFault { pages, faults } => {
            #[allow(clippy::cast_precision_loss)] // page counts, far below 2^53
            let per = |i: usize| pages[i] as f64 / faults[i];
            let touched = if pages[0] == pages[1] {
                format!("{} pages touched", pages[0])
            } else {
                format!("{} → {} pages touched", pages[0], pages[1])
            };
            format!(
                "SPTE prefetch: pages mapped per fault {} → {} ({touched} / kvm.vcpu.pf_fixed {} → {})",
                num(per(0)),
                num(per(1)),
                num(faults[0]),
                num(faults[1])
            )
        }
    }
}

/// What a side did instead of producing samples: `failed: the dirty log reported 4095 pages in
/// pass 1 of repetition 1, the guest wrote 4096`.
pub(super) fn side_failure_words(f: &SideFailure) -> String {
    match f {
        SideFailure::Failed { why, failed, runs } if failed == runs => format!("failed: {why}"),
        SideFailure::Failed { why, failed, runs } => {
            format!("failed in {failed} of {runs} runs: {why}")
        }
        SideFailure::Unsupported { why } => format!("cannot run it: {why}"),
        SideFailure::NoRun { command: Some(c) } => {
            let said = c
                .stderr
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map_or(String::new(), |l| format!(": {}", l.trim()));
            format!(
                "brought no run of it back (`hvlab {}` exited {}{said})",
                c.args.join(" "),
                c.rc.map_or_else(|| "without a code".to_string(), |r| r.to_string())
            )
        }
        SideFailure::NoRun { command: None } => "brought no run of it back".to_string(),
    }
}

/// A line per side that has no samples of the variant (`B failed: …; A ran it`); none when
/// both sides have samples.
pub(super) fn failure_lines(v: &VariantVerdict) -> Vec<String> {
    let sides = ["A", "B"];
    let failed = v.failures.iter().filter(|f| f.is_some()).count();
    v.failures
        .iter()
        .zip(sides)
        .zip(sides.iter().rev())
        .filter_map(|((f, side), other)| {
            let f = f.as_ref()?;
            let ran = if failed == 1 {
                format!("; {other} ran it")
            } else {
                String::new()
            };
            Some(format!("{side} {}{ran}", side_failure_words(f)))
        })
        .collect()
}
