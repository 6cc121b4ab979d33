//! How a kab's figures, changes and stalls are written, the same in the terminal text and in
//! the cover letter.

use crate::analysis::quantity::fixed_decimals;
use crate::kernel::sandbox::Confinement;
use crate::lab::kab::{Change, SideFailure, StallAb, StallSide, VariantVerdict};

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

/// `1 → 0`, for a pair of medians.
pub(super) fn pair(x: [f64; 2]) -> String {
    format!("{} → {}", fixed_decimals(x[0]), fixed_decimals(x[1]))
}

/// `1 min 12 s`, `13.2 s`.
pub fn duration(secs: f64) -> String {
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
        format!("{} jiffies", fixed_decimals(lo))
    } else {
        format!("{}–{} jiffies", fixed_decimals(lo), fixed_decimals(hi))
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

/// `KVM_IOEVENTFD 0.018 → 0.118 jiffies`.
pub(super) fn change_words(c: &Change) -> String {
    format!(
        "{} {} → {} {}",
        c.metric.trim_start_matches("ioctl."),
        fixed_decimals(c.a),
        fixed_decimals(c.b),
        c.unit
    )
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
