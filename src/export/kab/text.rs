//! A kab's outcome as terminal text: the verdicts first, each with its mechanism, then the
//! model's prediction, how the sides were made, the build and the boots, and the details.

use super::details::details;
use super::prediction::{memory_beside, memory_lines, prediction_lines};
use super::words::{
    boots_disagree_words, busy_boots, calls_lines, cause_words, change_words, duration,
    events_lines, failure_lines, host_change_words, instruction_words, small_change_words,
    stall_side, stall_words,
};
use crate::analysis::class::VariantClass;
use crate::analysis::quantity::fixed_decimals;
use crate::kernel::Kernel;
use crate::kernel::build::{BuildInfo, How};
use crate::lab::kab::{Cause, Change, KabOutcome, StallAb, VariantVerdict};

/// The kab's outcome for the terminal: the answer first, the details last.
pub fn render(o: &KabOutcome) -> String {
    let width = o
        .verdicts
        .iter()
        .map(|v| v.variant.len())
        .max()
        .unwrap_or(0);
    let mut out = vec![headline(o)];
    out.extend(verdict_lines(o, width));
    if let Some(p) = &o.prediction {
        out.extend(prediction_lines(p, o.accel.accel, width));
    }
    if let Some(p) = &o.memory_prediction {
        out.extend(memory_lines(p));
    }
    out.push(format!("A = {}", how_built(&o.a, o.builds[0].as_ref())));
    out.push(format!("B = {}", how_built(&o.b, o.builds[1].as_ref())));
    for n in &o.notes {
        out.push(format!("  {n}"));
    }
    // A hunk placed at an offset applied to a source the patch was not written against:
    // the reader decides whether it landed where meant.
    for (side, build) in ["A", "B"].iter().zip(&o.builds) {
        for n in build.iter().flat_map(|b| &b.notes) {
            out.push(format!("  {side}: {n}"));
        }
    }
    out.extend(build_line(o));
    out.push(boots_line(o));
    out.push(o.accel.why.clone());
    out.push(String::new());
    out.push("details, per metric:".into());
    out.push(details(&o.scenarios));
    out.join("\n")
}

/// The answer: how many variants got each verdict, what was measured, and whether B regressed.
fn headline(o: &KabOutcome) -> String {
    // In the classes' display order: the changes first, worst last among them.
    let mut counts: std::collections::BTreeMap<VariantClass, usize> = Default::default();
    for v in &o.verdicts {
        *counts.entry(v.class).or_insert(0) += 1;
    }
    let tally = counts
        .iter()
        .map(|(c, n)| format!("{} {n}", c.word()))
        .collect::<Vec<_>>()
        .join(", ");
    format!(
        "kab: B against A, {tally} of {} variant(s) (measured: {}; {} boot(s) × {} repetitions a side; {}){}",
        o.verdicts.len(),
        o.scenario_names.join(", "),
        o.boots_per_side,
        o.reps,
        accel_and_clock(&o.accel),
        gate_words(o)
    )
}

/// The accelerator, and the clock when it is QEMU's instruction clock (times then judged in
/// instructions).
fn accel_and_clock(choice: &crate::kernel::vm::AccelChoice) -> String {
    match choice.clock {
        hvlab_core::host::Clock::Wall => choice.accel.to_string(),
        hvlab_core::host::Clock::Icount => format!(
            "{}, instruction clock: times in guest instructions",
            choice.accel
        ),
    }
}

/// The headline's end: whether B regressed, read from the classes as the gate reads them;
/// "no regression" only when something was decided, in code the patch changed.
fn gate_words(o: &KabOutcome) -> String {
    let exercised: Vec<&VariantVerdict> = o
        .verdicts
        .iter()
        .filter(|v| v.class != VariantClass::NotExercised)
        .collect();
    if !o.regression && !o.verdicts.is_empty() && exercised.is_empty() {
        // Calls are counted exactly, busy host or not.
        return "; the patched code never ran in any variant: nothing here could show the patch (each variant says what reaches it)".into();
    }
    // The variants a busy host left unjudged (exact counts stand whatever the load).
    let set_aside = o.verdicts.iter().filter(|v| v.host_busy.is_some()).count();
    let judged = o.verdicts.len() - set_aside;
    let decided = exercised
        .iter()
        .any(|v| v.class != VariantClass::NotDecided);
    let busy = "other work kept QEMU waiting for a CPU, and a boot slowed as a whole looks like a kernel change: rerun on a quiet host";
    match (o.regression, set_aside) {
        (true, 0) => "; REGRESSION".into(),
        (true, n) => format!("; REGRESSION; {n} variant(s) not judged: {busy}"),
        (false, n) if n > 0 && judged == 0 => format!("; nothing judged: {busy}"),
        (false, n) if n > 0 => format!(
            "; no regression in the {judged} variant(s) judged, {n} not judged: {busy}"
        ),
        (false, _) if o.verdicts.is_empty() => {
            "; nothing judged: no variant to judge (the boots below say what each guest command did)".into()
        }
        (false, _) if !decided => {
            "; nothing decided: a regression is not ruled out (each variant says why)".into()
        }
        (false, _) => "; no regression".into(),
    }
}

/// A line per variant (its verdict and the mechanism's first line), the mechanism's further
/// lines under it, and what `cost` means when a variant has one.
fn verdict_lines(o: &KabOutcome, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    for v in &o.verdicts {
        let lines = mechanism(v);
        let first = lines.first().cloned().unwrap_or_default();
        out.push(format!(
            "  {:<12} {:<width$}  {first}",
            v.class.word(),
            v.variant
        ));
        for l in lines.iter().skip(1) {
            out.push(format!("  {:<12} {:<width$}  {l}", "", ""));
        }
        let model = o.memory_prediction.as_ref();
        if let Some(l) = model.and_then(|p| memory_beside(p, &v.variant)) {
            out.push(format!("  {:<12} {:<width$}  {l}", "", ""));
        }
    }
    if o.verdicts.iter().any(|v| !v.costs.is_empty()) {
        out.push(
            "  (cost: B significantly slower by under half a jiffy, so no normal grace period gained; an expedited one takes a fraction of a jiffy)"
                .into(),
        );
    }
    out
}

/// The build's steps and wall time; when nothing was built, that both kernels came from the
/// cache.
fn build_line(o: &KabOutcome) -> Option<String> {
    let steps: Vec<String> = o
        .build_steps
        .iter()
        .map(|s| (String::new(), s))
        .chain(o.builds.iter().zip(["A: ", "B: "]).flat_map(|(b, side)| {
            b.iter()
                .flat_map(|b| &b.steps)
                .map(move |s| (side.to_string(), s))
        }))
        .map(|(side, s)| format!("{side}{} {}", s.what, duration(s.secs)))
        .collect();
    if !steps.is_empty() {
        return Some(format!(
            "build: {} ({})",
            duration(o.wall.build_s),
            steps.join("; ")
        ));
    }
    o.builds
        .iter()
        .any(|b| b.as_ref().is_some_and(|b| b.cached))
        .then(|| {
            format!(
                "build: nothing built, both kernels from the cache ({})",
                duration(o.wall.build_s)
            )
        })
}

/// The boots: how many, how long, the spread of their time to the first command.
fn boots_line(o: &KabOutcome) -> String {
    let firsts: Vec<f64> = o
        .boots
        .iter()
        .filter_map(|b| b.to_first_command_s)
        .collect();
    let lo = firsts.iter().copied().fold(f64::MAX, f64::min);
    let hi = firsts.iter().copied().fold(f64::MIN, f64::max);
    // No boot reached its first command: there is no range to give.
    let to_first = if firsts.is_empty() {
        String::new()
    } else {
        format!(" ({lo:.1}–{hi:.1} s to the first command)")
    };
    format!(
        "boots: {} in {}{to_first}; wall time {}{}",
        o.boots.len(),
        duration(o.wall.boots_s),
        duration(o.wall.total_s),
        match o.host_busy().as_slice() {
            [] => String::new(),
            busy => format!("; host busy during {}", busy_boots(busy)),
        }
    )
}

/// The mechanism of a verdict, in words: the first line and any further lines.
pub fn mechanism(v: &VariantVerdict) -> Vec<String> {
    let failures = failure_lines(v);
    if !failures.is_empty() {
        return failures;
    }
    let mut out = match v.class {
        VariantClass::Fixed => fixed(v),
        VariantClass::Regressed => regressed(v),
        VariantClass::Improved => moved(v, &v.improvements, "B better"),
        VariantClass::NotDecided => match &v.host_busy {
            Some(_) => vec!["not judged: the host was busy during the boots (below)".into()],
            None => vec![format!(
                "the samples cannot settle {} (details below)",
                v.undecided.join(", ")
            )],
        },
        VariantClass::NoChange => Vec::new(),
        // Its lines are the calls' (below).
        VariantClass::NotExercised => Vec::new(),
    };
    // The stalls that stayed, where the class does not already say what became of them.
    let stalls_stayed = match v.class {
        VariantClass::NoChange | VariantClass::NotDecided | VariantClass::Improved => true,
        VariantClass::Fixed | VariantClass::Regressed | VariantClass::NotExercised => false,
    };
    if v.host_busy.is_none() && stalls_stayed {
        out.extend(unchanged_stalls(v));
    }
    if v.host_busy.is_none() {
        out.extend(
            v.changes
                .iter()
                .map(|c| format!("change: {}", small_change_words(c))),
        );
    }
    out.extend(calls_lines(v));
    if v.host_busy.is_none() {
        out.extend(events_lines(v));
    }
    out.extend(
        v.boots_disagree
            .iter()
            .map(|d| format!("finding: {}", boots_disagree_words(&d.metric, &d.boots))),
    );
    let mut costs: Vec<&Change> = v.costs.iter().collect();
    costs.sort_by(|x, y| (y.b - y.a).total_cmp(&(x.b - x.a)));
    for c in costs {
        out.push(format!(
            "cost: {} (+{})",
            change_words(c),
            fixed_decimals(c.b - c.a)
        ));
    }
    out
}

/// The variant's stalls found on A's runs (`a`) and on B's (`b`) as asked.
fn stalls_found(v: &VariantVerdict, a: bool, b: bool) -> Vec<&StallAb> {
    v.stalls
        .iter()
        .filter(|s| s.a.is_some() == a && s.b.is_some() == b)
        .collect()
}

/// `20 of 20`: the repetitions with a stall on side `i`, when the scenario counts them.
fn stalled_reps(v: &VariantVerdict, i: usize) -> String {
    v.stall_reps.map_or(String::new(), |r| {
        format!("{} of {}", r[i].stalled, r[i].reps)
    })
}

/// FIXED: each stall gone, with the metric that carried it, and the repetitions that stalled.
fn fixed(v: &VariantVerdict) -> Vec<String> {
    let gone = stalls_found(v, true, false);
    if gone.is_empty() {
        return vec![format!(
            "repetitions with a stall {} → {}",
            stalled_reps(v, 0),
            stalled_reps(v, 1)
        )];
    }
    // The metric that carried the stall, shown beside it.
    let carried = v.improvements.iter().find(|c| {
        v.stalls
            .iter()
            .any(|s| c.metric == s.ioctl || c.metric == format!("ioctl.{}", s.ioctl))
    });
    gone.iter()
        .map(|s| {
            format!(
                "{} no longer waits for the grace period of {}: {}repetitions with a stall {} → {}",
                s.ioctl,
                s.cause,
                carried.map_or(String::new(), |c| format!("{}; ", change_words(c))),
                stalled_reps(v, 0),
                stalled_reps(v, 1)
            )
        })
        .collect()
}

/// REGRESSED: the stalls B gained, the metrics B is worse on, and any stall B lost.
fn regressed(v: &VariantVerdict) -> Vec<String> {
    let mut out = Vec::new();
    for s in stalls_found(v, false, true) {
        let side = s.b.as_ref().map_or(String::new(), stall_side);
        out.push(format!("B gained a stall: {} ({side})", stall_words(s)));
    }
    out.extend(moved(v, &v.regressions, "B worse"));
    for s in stalls_found(v, true, false) {
        out.push(format!("(and no longer: {})", stall_words(s)));
    }
    out
}

/// The cause of `c`, when the verdict has one: the grace period its ioctl waited for on each
/// side, or for a fault count the pages each fault mapped.
fn cause_of<'a>(v: &'a VariantVerdict, c: &Change) -> Option<&'a Cause> {
    v.causes.iter().find(|cause| match cause {
        Cause::GracePeriod { ioctl, .. } => {
            c.unit == "jiffies" && c.metric.trim_start_matches("ioctl.") == ioctl
        }
        Cause::PagesPerFault { .. } => c.metric == "kvm.vcpu.pf_fixed",
    })
}

/// A line per metric B moved on (`B worse: …`), each with its cause: an ioctl's jiffies are
/// said as the grace periods waited for on each side; then the causes no metric carried (a
/// stall gained or lost that moved only the stall count).
fn moved(v: &VariantVerdict, changes: &[Change], word: &str) -> Vec<String> {
    let shown: Vec<&Change> = changes.iter().filter(|c| !c.within_jiffy).collect();
    let mut out: Vec<String> = shown
        .iter()
        .map(|c| {
            // On the instruction clock the change is said in instructions, with its tolerance.
            // A lifecycle time in virtual ticks: its jiffies first, as the stall rule reads
            // them, then the instructions it was judged on.
            let in_jiffies = c.unit == "jiffies";
            if let Some(words) = instruction_change(v, c, !in_jiffies) {
                return if in_jiffies {
                    format!("{word}: {} ({words})", change_words(c))
                } else {
                    format!("{word}: {words}")
                };
            }
            if let Some(words) = host_change_words(v, c) {
                return format!("{word}: {words}");
            }
            match cause_of(v, c) {
                Some(cause @ Cause::GracePeriod { .. }) => cause_words(cause),
                Some(cause) => format!("{word}: {}: {}", change_words(c), cause_words(cause)),
                None => format!("{word}: {}", change_words(c)),
            }
        })
        .collect();
    out.extend(
        v.causes
            .iter()
            .filter(|cause| !shown.iter().any(|c| cause_of(v, c) == Some(*cause)))
            .map(cause_words),
    );
    out
}

/// A change judged on the instruction clock, in instructions, `named` with its metric or not
/// (`-8,185,373 instructions (-26.7%, …)`, for a line that already names it).
fn instruction_change(v: &VariantVerdict, c: &Change, named: bool) -> Option<String> {
    v.instruction_clock
        .iter()
        .find(|i| i.metric == c.metric)
        .map(|i| {
            let metric = if named { i.metric.as_str() } else { "" };
            instruction_words(metric, &i.judged)
                .trim_start()
                .to_string()
        })
}

/// The stalls both kernels have; with no change and no stall, that there is none.
fn unchanged_stalls(v: &VariantVerdict) -> Vec<String> {
    let mut out: Vec<String> = stalls_found(v, true, true)
        .iter()
        .map(|s| {
            format!(
                "stalls on both: {} (A: {}; B: {})",
                stall_words(s),
                s.a.as_ref().map_or(String::new(), stall_side),
                s.b.as_ref().map_or(String::new(), stall_side)
            )
        })
        .collect();
    if v.class == VariantClass::NoChange && v.stalls.is_empty() {
        if v.stall_reps.is_some() {
            out.push("no stall on either kernel".into());
        } else if v.changes.is_empty() {
            // A change under its tolerance is said on its own line instead.
            out.push("no judged change".into());
        }
    }
    out
}

/// How a side was made, in one line.
pub fn how_built(k: &Kernel, b: Option<&BuildInfo>) -> String {
    let Some(b) = b else {
        return format!("{} ({}), as given", k.release, k.source);
    };
    let patches = if b.patches.is_empty() {
        "no patch".to_string()
    } else {
        b.patches
            .iter()
            .map(|p| {
                let series = if p.subjects.len() > 1 {
                    format!(
                        "a series of {}: {}; ",
                        p.subjects.len(),
                        p.subjects.join("; ")
                    )
                } else {
                    String::new()
                };
                format!("{} ({series}sha256 {})", p.file, &p.sha256[..16])
            })
            .collect::<Vec<_>>()
            .join(" + ")
    };
    let how = match &b.how {
        How::Modules { modules, .. } => format!(
            "Debian's {} image with {} rebuilt from {}",
            k.release,
            modules.join(", "),
            b.source
        ),
        How::Whole => format!("whole kernel {} from {}", k.release, b.source),
        How::AsShipped { .. } => {
            return format!(
                "Debian's {} as shipped, {patches}: nothing a build uses changes",
                k.release
            );
        }
    };
    let reused = if b.cached && !matches!(b.how, How::AsShipped { .. }) {
        ", reused from the cache"
    } else {
        ""
    };
    format!(
        "{how}, {patches} ({}, {}{reused})",
        b.compiler,
        super::words::confinement(b.sandbox)
    )
}
