//! How a kab's figures, changes and stalls are written, the same in the terminal text and in
//! the cover letter.

use crate::analysis::calls::{Counted, FunctionCalls, HostEvent};
use crate::analysis::class::VariantClass;
use crate::analysis::direction::change_pct;
use crate::analysis::icount::{BootsDisagree, IcountAb};
use crate::analysis::quantity::fixed_decimals;
use crate::kernel::sandbox::Confinement;
use crate::lab::kab::{
    BusyBoot, Cause, Change, CorrectedP, EventEstimate, EventsBeside, GraceWait, HostEventAb,
    HostRole, Inconclusive, KabNote, MSR_WRITES_METRIC, SideFailure, StallAb, StallSide, Unsettled,
    VariantVerdict, WorseWay,
};

impl std::fmt::Display for KabNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KabNote::CallsNotCounted { patch, why } => {
                write!(f, "calls not counted for {patch}: {why}")
            }
            KabNote::CallsCounted { functions } => write!(
                f,
                "calls of the patched functions are counted in each guest, in one untimed repetition per variant after the timed ones: {}",
                functions.join(", ")
            ),
            KabNote::NotCounted { what } => write!(f, "not counted: {what}"),
            KabNote::ObjectCode { delta } => write!(
                f,
                "object code of B against A (line-number constants aside): {}",
                crate::export::objdiff::brief(delta)
            ),
            KabNote::SecondBoot { changed } => write!(
                f,
                "each side was booted a second time: with one boot a side on the instruction clock, {} changed; the verdicts are judged from both boots",
                changed.join(", ")
            ),
            KabNote::ReachRead { reach, source } => {
                f.write_str(&crate::export::objdiff::reach(reach, source))
            }
            KabNote::Build(note) => note.fmt(f),
        }
    }
}

impl std::fmt::Display for Inconclusive {
    /// What was seen, with how many samples, what is unsettled, and what would decide it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [na, nb] = self.n;
        let (seen, unsettled) = match self.unsettled {
            Unsettled::SizeNotEstablished {
                ratio,
                p,
                ci95,
                threshold,
            } => (
                format!(
                    "B's median is {ratio:.2}× A's and the rank test separates them ({}), but the 95% CI of the ratio ({:.2}–{:.2}) reaches below the +{:.0}% threshold, so",
                    p_words(p),
                    ci95[0],
                    ci95[1],
                    threshold * 100.0,
                ),
                "the change's size is not established".to_string(),
            ),
            Unsettled::Noise { worse, p } => (
                format!(
                    "B's median is {}, but",
                    match worse {
                        WorseWay::Higher => "higher",
                        WorseWay::Lower => "lower",
                    }
                ),
                format!("the rank test cannot tell it from noise ({})", p_words(p)),
            ),
            Unsettled::BootsNotEstablished {
                ratio,
                ci,
                boots,
                together,
            } => (
                format!(
                    "judged with the boot as the unit ({} vs {} boots), B's boots are {ratio:.2}× A's, but the interval of the ratio ({:.2}–{:.2}{}) reaches across the threshold, so",
                    boots[1],
                    boots[0],
                    ci[0],
                    ci[1],
                    if together > 1 {
                        format!(", the level divided among {together} such comparisons")
                    } else {
                        String::new()
                    }
                ),
                "the change is not established".to_string(),
            ),
            Unsettled::OutOfReach {
                ratio,
                alpha,
                together,
            } => (
                format!("B's median is {ratio:.2}× A's, but"),
                format!(
                    "no difference can reach p < {alpha} once corrected over the {together} comparisons judged together"
                ),
            ),
        };
        write!(
            f,
            "{seen} with n = {nb} vs {na} {unsettled}; more repetitions (--reps) or boots (--boots) can decide"
        )
    }
}

/// `p = 0.012`, and when judged with others what the correction made of it.
fn p_words(p: CorrectedP) -> String {
    if p.together > 1 {
        format!(
            "p = {:.3}, {:.3} corrected over the {} comparisons judged together",
            p.p, p.adjusted, p.together
        )
    } else {
        format!("p = {:.3}", p.p)
    }
}

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

/// The boots a host was busy during: `boot 2 (B): tasks waited for a CPU 49% of the time`.
pub(super) fn busy_boots(busy: &[BusyBoot]) -> String {
    busy.iter()
        .map(|b| {
            format!(
                "boot {} ({}): {}",
                b.boot,
                b.side,
                crate::analysis::words::busy_words(&b.reasons)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
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
    let name = c.metric.trim_start_matches("ioctl.");
    let (a, b) = (fixed_decimals(c.a), fixed_decimals(c.b));
    let mut out = if c.unit == "count" {
        match change_pct(c.a, c.b) {
            Some(pct) => format!("{name} {a} → {b} ({pct})"),
            None => format!("{name} {a} → {b}"),
        }
    } else {
        format!("{name} {a} → {b} {}", c.unit)
    };
    if c.undeclared {
        out.push_str(" (not declared by its scenario: judged lower-is-better)");
    }
    out
}

/// What a time judged on the instruction clock is counted per, from its metric: an exit's
/// roundtrip per exit, a per-page time per page.
fn per_what(metric: &str) -> &'static str {
    if metric == "roundtrip_ns" {
        " per exit"
    } else if metric.contains("per_page") {
        " per page"
    } else {
        ""
    }
}

/// Instructions, rounded to the instruction, with thousands separated (`6,461`).
fn insn_words(x: f64) -> String {
    crate::analysis::quantity::count(x.round())
}

/// A time judged on the instruction clock: `roundtrip_ns +323 instructions per exit (+5.0%,
/// 6,461 → 6,784 insn; tolerance ±3.1% (200 insn), spread ±5 insn)`. The spread is half the
/// wider side's range: the medians must differ by more than the whole range.
pub(super) fn instruction_words(metric: &str, j: &IcountAb) -> String {
    let sign = if j.delta_insn < 0.0 { "-" } else { "+" };
    let pct = j
        .delta_pct
        .map_or(String::new(), |p| format!("{sign}{:.1}%, ", p.abs()));
    let tolerance = match j.tolerance_pct() {
        Some(p) => format!("±{p:.1}% ({} insn)", insn_words(j.tolerance_insn)),
        None => format!("±{} insn", insn_words(j.tolerance_insn)),
    };
    format!(
        "{metric} {sign}{} instructions{} ({pct}{} → {} insn; tolerance {tolerance}, spread ±{} insn)",
        insn_words(j.delta_insn.abs()),
        per_what(metric),
        insn_words(j.median_insn[0]),
        insn_words(j.median_insn[1]),
        fixed_decimals(j.spread_insn / 2.0),
    )
}

/// A finding: `boots of A disagree on roundtrip_ns: 2,400 vs 2,550 insn, ±5 within a boot
/// (something in the guest is not deterministic); its tolerance widened to 150 insn`.
pub(super) fn boots_disagree_words(metric: &str, d: &BootsDisagree) -> String {
    format!(
        "boots of {} disagree on {metric}: {} vs {} insn, ±{} within a boot (something in the guest is not deterministic); its tolerance widened to {} insn",
        if d.side == 0 { "A" } else { "B" },
        insn_words(d.medians_insn[0]),
        insn_words(d.medians_insn[1]),
        fixed_decimals(d.within_insn / 2.0),
        insn_words(d.apart_insn()),
    )
}

/// A count that moved by less than its declared tolerance: `kvm.vcpu.pf_fixed +1 (+0.02%,
/// 4096 → 4097), under the 1% it tolerates`.
pub(super) fn small_change_words(c: &Change) -> String {
    let delta = c.b - c.a;
    let sign = if delta < 0.0 { "-" } else { "+" };
    format!(
        "{} {sign}{} ({}, {} → {}), under the {}% it tolerates: a change, not a verdict",
        c.metric,
        fixed_decimals(delta.abs()),
        change_pct(c.a, c.b).unwrap_or_default(),
        fixed_decimals(c.a),
        fixed_decimals(c.b),
        fixed_decimals(c.tolerance.unwrap_or(0.0) * 100.0)
    )
}

/// What one side waited for: `expedited at most, 0.020 jiffies`, `a normal grace period
/// started by KVM_CREATE_IRQCHIP, 2 jiffies`.
fn wait_words(w: &GraceWait) -> String {
    match w {
        GraceWait::Expedited { jiffies } => {
            format!("expedited at most, {} jiffies", fixed_decimals(*jiffies))
        }
        GraceWait::Normal {
            jiffies,
            started_by,
        } => format!(
            "a normal grace period{}, {} jiffies",
            started_by
                .as_ref()
                .map_or(String::new(), |r| format!(" started by {r}")),
            fixed_decimals(*jiffies)
        ),
    }
}

/// A cause in words: `KVM_SET_USER_MEMORY_REGION now waits a normal grace period on B: +1.98
/// jiffies (A: expedited at most, 0.020 jiffies; B: a normal grace period started by
/// KVM_CREATE_IRQCHIP, 2 jiffies)`; `SPTE prefetch: pages mapped per fault 8 → 1.000 (4096
/// pages touched / kvm.vcpu.pf_fixed 512 → 4097)`.
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
                fixed_decimals(delta.abs()),
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
                fixed_decimals(per(0)),
                fixed_decimals(per(1)),
                fixed_decimals(faults[0]),
                fixed_decimals(faults[1])
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

/// One function's calls on each side, A → B (`0 → 0`, `4097 → not counted`).
fn function_calls_words(name: &str, sides: [Option<&FunctionCalls>; 2]) -> String {
    let count = |f: Option<&FunctionCalls>| {
        f.and_then(|f| f.counted.calls())
            .map_or_else(|| "not counted".to_string(), |n| n.to_string())
    };
    let mut notes: Vec<String> = Vec::new();
    for (f, side) in sides.iter().zip(["A", "B"]) {
        match f.map(|f| &f.counted) {
            Some(Counted::Probed {
                symbols,
                via_callers: true,
                ..
            }) => {
                let note = format!("inlined: counted at its caller {}", symbols.join(" + "));
                if !notes.contains(&note) {
                    notes.push(note);
                }
            }
            Some(Counted::NotProbed { why }) => notes.push(format!("{side}: {why}")),
            Some(Counted::Probed { .. }) => {}
            None => notes.push(format!("{side}: not asked")),
        }
    }
    let short = name.rsplit(':').next().unwrap_or(name);
    let notes = if notes.is_empty() {
        String::new()
    } else {
        format!(" ({})", notes.join("; "))
    };
    format!("{short} {} → {}{notes}", count(sides[0]), count(sides[1]))
}

/// The calls of each patched function, A → B, when either side counted them.
fn calls_words(v: &VariantVerdict) -> Option<String> {
    let mut names: Vec<&str> = Vec::new();
    for f in v.calls.iter().flatten().flatten() {
        if !names.contains(&f.function.as_str()) {
            names.push(&f.function);
        }
    }
    let on = |i: usize, name: &str| {
        v.calls[i]
            .as_ref()
            .and_then(|fs| fs.iter().find(|f| f.function == name))
    };
    let words: Vec<String> = names
        .iter()
        .map(|n| function_calls_words(n, [on(0, n), on(1, n)]))
        .collect();
    (!words.is_empty()).then(|| format!("{} calls", words.join("; ")))
}

/// What the patched functions' calls say beside the verdict: for NOT EXERCISED, that they
/// never ran and what would reach them; otherwise the calls per side, when counted.
pub(super) fn calls_lines(v: &VariantVerdict) -> Vec<String> {
    let Some(calls) = calls_words(v) else {
        return Vec::new();
    };
    if v.class != VariantClass::NotExercised {
        return vec![format!("patched code ran: {calls}")];
    }
    let mut out = vec![format!(
        "the patched code never ran on either kernel, so this variant cannot show the patch: {calls}"
    )];
    out.extend(v.reach.as_ref().map(|r| {
        if r.given {
            format!(
                "not reached even by {} (--kvm-param {}, given)",
                r.by, r.kvm_param
            )
        } else {
            format!("{} reaches it: --kvm-param {}", r.by, r.kvm_param)
        }
    }));
    out
}

/// A host event in words.
fn host_event_name(e: HostEvent) -> &'static str {
    match e {
        HostEvent::MsrWrite => "MSR writes",
        HostEvent::TlbFlush => "host TLB flushes",
    }
}

/// A key of a host event's histogram in words: an MSR by its number (`MSR 0xc0000103`), a
/// flush by its reason's number (`reason 0`).
fn event_key_words(e: HostEvent, key: &str) -> String {
    match e {
        HostEvent::MsrWrite => format!("MSR 0x{}", key.trim_start_matches("0x")),
        HostEvent::TlbFlush => format!("reason {key}"),
    }
}

/// `+1.00`, `-0.16`: a per-unit change.
fn signed(x: f64) -> String {
    let sign = if x < 0.0 { "-" } else { "+" };
    format!("{sign}{:.2}", x.abs())
}

/// One host event that moved, or was not counted on a side: `MSR writes 0.00 → 1.00 (+1.00:
/// MSR 0xc0000103 0.00 → 1.00)`; `None` when it was counted on both sides and did not move.
fn host_event_words(e: &HostEventAb) -> Option<String> {
    let name = host_event_name(e.event);
    if let [Some(a), Some(b)] = e.per_unit {
        if !e.moved {
            return None;
        }
        let keys: Vec<String> = e
            .keys_moved
            .iter()
            .map(|k| {
                format!(
                    "{} {:.2} → {:.2}",
                    event_key_words(e.event, &k.key),
                    k.per_unit[0],
                    k.per_unit[1]
                )
            })
            .collect();
        let keys = if keys.is_empty() {
            String::new()
        } else {
            format!(": {}", keys.join(", "))
        };
        return Some(format!("{name} {a:.2} → {b:.2} ({}{keys})", signed(b - a)));
    }
    let why: Vec<String> = e
        .not_counted
        .iter()
        .zip(["A", "B"])
        .filter_map(|(w, side)| w.as_ref().map(|w| format!("{side}: {w}")))
        .collect();
    Some(if why.is_empty() {
        format!("{name} not counted on both kernels")
    } else {
        format!("{name} not counted ({})", why.join("; "))
    })
}

/// What the events are counted per, in words.
fn per_words(v: &VariantVerdict, e: &EventsBeside) -> &'static str {
    match (
        e.per_iteration,
        v.scenario == crate::scenario::Kind::Exits.name(),
    ) {
        (true, true) => "per exit",
        (true, false) => "per iteration",
        (false, _) => "per repetition",
    }
}

/// Whether the verdict judged the host's MSR writes (then its change line says them).
fn msr_writes_judged(v: &VariantVerdict) -> bool {
    v.regressions
        .iter()
        .chain(&v.improvements)
        .any(|c| c.metric == MSR_WRITES_METRIC)
}

/// A judged change of the host's MSR writes: `MSR writes per exit 0.00 → 1.00 (+1.00: MSR
/// 0xc0000103 0.00 → 1.00), each one instruction on the instruction clock`.
pub(super) fn host_change_words(v: &VariantVerdict, c: &Change) -> Option<String> {
    if c.metric != MSR_WRITES_METRIC {
        return None;
    }
    let e = v.events.as_ref()?;
    let msr = e.host.iter().find(|h| h.event == HostEvent::MsrWrite)?;
    let said = host_event_words(msr)?;
    let said = said.replacen("MSR writes", &format!("MSR writes {}", per_words(v, e)), 1);
    Some(format!(
        "{said}, each one instruction on the instruction clock"
    ))
}

/// The events beside an instruction-clock verdict: `events per exit: MSR writes 0.00 → 1.00
/// (+1.00: MSR 0xc0000103 0.00 → 1.00); exits, host TLB flushes unchanged`; and, when the
/// time they came with was not judged changed, its instructions.
pub(super) fn events_line(v: &VariantVerdict) -> Option<String> {
    let e = v.events.as_ref()?;
    // Said where the instruction clock judged a time changed, or where an event moved that
    // the clock prices at one instruction.
    if v.instruction_clock.is_empty() && !e.any_moved() {
        return None;
    }
    let judged = msr_writes_judged(v);
    let mut parts: Vec<String> = e
        .host
        .iter()
        .filter(|h| !(judged && h.event == HostEvent::MsrWrite))
        .filter_map(host_event_words)
        .collect();
    parts.extend(e.kvm_moved.iter().map(|k| {
        format!(
            "{} {:.2} → {:.2} ({})",
            k.metric,
            k.median[0],
            k.median[1],
            signed(k.median[1] - k.median[0])
        )
    }));
    let mut unchanged: Vec<&str> = e.kvm_unchanged.iter().map(String::as_str).collect();
    unchanged.extend(
        e.host
            .iter()
            .filter(|h| !h.moved && h.per_unit.iter().all(Option::is_some))
            .map(|h| host_event_name(h.event)),
    );
    if !unchanged.is_empty() {
        parts.push(format!("{} unchanged", unchanged.join(", ")));
    }
    let mut out =
        (!parts.is_empty()).then(|| format!("events {}: {}", per_words(v, e), parts.join("; ")));
    if v.instruction_clock.is_empty()
        && let Some((metric, j)) = &e.instructions
    {
        let within = format!(
            "instructions: {}, within its tolerance",
            instruction_words(metric, j)
        );
        out = Some(match out {
            Some(line) => format!("{within}\n{line}"),
            None => within,
        });
    }
    out
}

/// `+≈2,500 ns`, `-≈81 ns`: an estimate, rounded to what it can say.
fn estimate_ns(ns: f64) -> String {
    let sign = if ns < 0.0 { "-" } else { "+" };
    let x = ns.abs();
    let rounded = if x >= 100.0 {
        (x / 10.0).round() * 10.0
    } else {
        x.round()
    };
    format!("{sign}≈{} ns", crate::analysis::quantity::count(rounded))
}

/// The model's estimate beside an instruction delta, and how it was priced: `estimate (model,
/// not measured): +≈2,650 ns per exit on this host (pvm-epyc), +≈175 ns on intel-spr-vmx
/// (thread 003's host)`.
pub(super) fn estimate_lines(e: &EventEstimate) -> Vec<String> {
    let hosts: Vec<String> =
        e.on.iter()
            .map(|p| match (p.role, &p.thread) {
                (HostRole::ThisHost, _) => {
                    format!(
                        "{} per exit on this host ({})",
                        estimate_ns(p.ns),
                        p.profile
                    )
                }
                (HostRole::ThreadHost, Some(t)) => {
                    format!("{} on {} (thread {t}'s host)", estimate_ns(p.ns), p.profile)
                }
                (HostRole::ThreadHost, None) => format!("{} on {}", estimate_ns(p.ns), p.profile),
            })
            .collect();
    let count = crate::analysis::quantity::count;
    let fixed = crate::analysis::quantity::fixed_decimals;
    // Each profile's inputs: `pvm-epyc 1 and 2,450 cycles at 2.45 GHz`.
    let inputs: Vec<String> =
        e.on.iter()
            .map(|p| {
                let cycles = if e.msr_writes_counted {
                    format!("{} and {}", count(p.insn_cycles), count(p.msr_write_cycles))
                } else {
                    count(p.insn_cycles)
                };
                format!("{} {cycles} cycles at {} GHz", p.profile, fixed(p.ghz))
            })
            .collect();
    let plain = e.delta_insn - e.delta_msr_writes;
    let priced = if e.msr_writes_counted {
        format!(
            "{} plain instructions at alu_cycles, {} MSR write(s) at msr_write_cycles, over cpu_ghz: {}",
            insn_words(plain),
            signed(e.delta_msr_writes),
            inputs.join("; ")
        )
    } else {
        format!(
            "{} plain instructions at alu_cycles over cpu_ghz: {}; MSR writes not counted, so every instruction is priced as a plain one",
            insn_words(plain),
            inputs.join("; ")
        )
    };
    vec![
        format!("estimate (model, not measured): {}", hosts.join(", ")),
        format!("  priced: {priced}"),
    ]
}

/// What the instruction clock does not see, beside the verdict: the events that moved and the
/// model's estimate of the delta in wall time.
pub(super) fn events_lines(v: &VariantVerdict) -> Vec<String> {
    let mut out: Vec<String> = events_line(v)
        .iter()
        .flat_map(|l| l.lines().map(str::to_string))
        .collect();
    if let Some(e) = &v.estimate {
        out.extend(estimate_lines(e));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvlab_core::noise::BusyReason;

    /// The busy boots as the headline and the cover letter name them, from the reasons as
    /// data.
    #[test]
    fn busy_boots_are_named_with_their_reasons() {
        let boot = |boot: usize, side: &str, reasons: Vec<BusyReason>| BusyBoot {
            boot,
            side: side.into(),
            reasons,
        };
        let busy = [
            boot(2, "B", vec![BusyReason::Pressure { some_pct: 49.4 }]),
            boot(
                3,
                "B",
                vec![
                    BusyReason::Pressure { some_pct: 20.0 },
                    BusyReason::Steal { pct: 12.0 },
                ],
            ),
        ];
        assert_eq!(
            busy_boots(&busy),
            "boot 2 (B): tasks waited for a CPU 49% of the time; \
             boot 3 (B): tasks waited for a CPU 20% of the time, steal 12%"
        );
    }
}
