//! How a kab's figures, changes and stalls are written, the same in the terminal text and in
//! the cover letter.

use crate::kernel::sandbox::Confinement;
use crate::lab::kab::{Change, StallAb, StallSide};

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

/// `KVM_IOEVENTFD 0.018 → 0.118 jiffies`.
pub(super) fn change_words(c: &Change) -> String {
    format!(
        "{} {} → {} {}",
        c.metric.trim_start_matches("ioctl."),
        num(c.a),
        num(c.b),
        c.unit
    )
}
