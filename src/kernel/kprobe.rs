//! Counting calls of kernel functions with kprobe events (tracefs `kprobe_events` and the
//! hit counts of `kprobe_profile`), for `hvlab run --count-calls` in a kab's guest. A
//! function is probed by its own symbol (`NAME`, or the clone GCC made of it,
//! `NAME.isra.0`/`NAME.constprop.N`); when the compiler inlined it everywhere it has none,
//! and its callers in the same file are probed instead (which ones is recorded).
//!
//! The probes are armed only around the one untimed repetition the caller runs: a kprobe hit
//! is a breakpoint trap, which the timed repetitions must never pay.
//!
//! In the same repetition, [`count_events`] counts the kernel's own MSR writes and TLB flushes
//! with a histogram trigger on their tracepoints (`msr:write_msr`, `tlb:tlb_flush`). Not a
//! kprobe: in Debian's 7.3 the write is `native_write_msr()`, `static inline notrace` in
//! arch/x86/include/asm/msr.h (out of line only as paravirt's `pv_ops.cpu.write_msr`), and
//! kprobe events refuse notrace functions (`CONFIG_KPROBE_EVENTS_ON_NOTRACE` is off); the
//! out-of-line `do_trace_write_msr()` it calls runs only while something is attached to the
//! tracepoint (`tracepoint_enabled(write_msr)`), which a trigger is. A trigger on an event
//! that is not enabled keeps it soft-disabled: counted, nothing written to the ring buffer,
//! and the hits are exact (a histogram drops keys, never hits, when full).

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::analysis::calls::{
    Counted, EventCount, EventCounted, FunctionCalls, HostEvent, NotProbed,
};

/// A bad `--count-calls` item.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum CallSpecError {
    /// Bad --count-calls item `{0}`: expected [MODULE:]FUNCTION[/CALLER...] of C identifiers, e.g. kvm:__direct_pte_prefetch/direct_pte_prefetch.
    Malformed(String),
}

/// One function to count: `[MODULE:]NAME[/CALLER…]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallSpec {
    /// The module it is in (`kvm`), `None` for built-in code.
    pub module: Option<String>,
    /// Its name.
    pub name: String,
    /// Its callers in its file, probed instead when it has no symbol.
    pub callers: Vec<String>,
}

fn is_identifier(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl CallSpec {
    /// Parses one item. Only C identifiers pass: the names are written into
    /// `kprobe_events`, so nothing else may reach it.
    pub fn parse(text: &str) -> Result<CallSpec, CallSpecError> {
        let bad = || CallSpecError::Malformed(text.to_string());
        let (module, rest) = match text.split_once(':') {
            Some((m, rest)) => (Some(m.to_string()), rest),
            None => (None, text),
        };
        let mut names = rest.split('/').map(str::to_string);
        let name = names.next().ok_or_else(bad)?;
        let callers: Vec<String> = names.collect();
        let all_ok = module
            .iter()
            .chain([&name])
            .chain(&callers)
            .all(|n| is_identifier(n));
        if !all_ok {
            return Err(bad());
        }
        Ok(CallSpec {
            module,
            name,
            callers,
        })
    }

    /// How the record names it: `[MODULE:]NAME`.
    pub fn function(&self) -> String {
        match &self.module {
            Some(m) => format!("{m}:{}", self.name),
            None => self.name.clone(),
        }
    }

    /// What to probe, read from `/proc/kallsyms` text: its own symbol, else its callers'
    /// (`true`: callers), else why none.
    pub fn symbols(&self, kallsyms: &str) -> Result<(Vec<String>, bool), NotProbed> {
        let module = self.module.as_deref();
        if let Some(own) = symbol_in(kallsyms, module, &self.name) {
            return Ok((vec![own], false));
        }
        let callers: Vec<String> = self
            .callers
            .iter()
            .filter_map(|c| symbol_in(kallsyms, module, c))
            .collect();
        if callers.is_empty() {
            return Err(NotProbed::NoSymbol {
                callers: self.callers.clone(),
            });
        }
        Ok((callers, true))
    }
}

/// Whether `suffix` is what GCC appends to a function it cloned with the same body
/// (`.isra.0`, `.constprop.3`, `.constprop.0.isra.0`): a probe on the clone counts its calls.
/// `.part.N` and `.cold` are pieces of a function, not the whole: not taken.
fn is_clone_suffix(suffix: &str) -> bool {
    let parts: Vec<&str> = suffix.split('.').collect();
    !suffix.is_empty()
        && parts.len().is_multiple_of(2)
        && parts.chunks(2).all(|p| {
            matches!(p[0], "isra" | "constprop") && p[1].chars().all(|c| c.is_ascii_digit())
        })
}

/// The text symbol of `name` in `module` (`None`: built-in) in `/proc/kallsyms` text, itself
/// or a clone of it ([`is_clone_suffix`]).
pub fn symbol_in(kallsyms: &str, module: Option<&str>, name: &str) -> Option<String> {
    let mut clone: Option<String> = None;
    for line in kallsyms.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_addr), Some(kind), Some(sym)) = (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if !matches!(kind, "t" | "T") {
            continue;
        }
        let owner = fields
            .next()
            .map(|m| m.trim_start_matches('[').trim_end_matches(']'));
        if owner != module {
            continue;
        }
        if sym == name {
            return Some(sym.to_string());
        }
        if clone.is_none()
            && let Some(suffix) = sym.strip_prefix(name).and_then(|s| s.strip_prefix('.'))
            && is_clone_suffix(suffix)
        {
            clone = Some(sym.to_string());
        }
    }
    clone
}

/// Hits per event in `kprobe_profile` text (`  EVENT  HITS  MISSES` per line).
pub fn profile_hits(profile: &str) -> std::collections::BTreeMap<String, u64> {
    profile
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let name = f.next()?;
            let hits = f.next()?.parse().ok()?;
            Some((name.to_string(), hits))
        })
        .collect()
}

/// The group hvlab's probes are made in, so they are found (and removed) by it.
const GROUP: &str = "hvlab";

/// The tracefs mount with kprobe events, or why there is none.
fn tracefs() -> Result<PathBuf, NotProbed> {
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        let dir = PathBuf::from(dir);
        if dir.join("kprobe_events").exists() {
            return Ok(dir);
        }
    }
    let detail = if Path::new("/sys/kernel/tracing/trace").exists() {
        "tracefs is mounted at /sys/kernel/tracing without kprobe_events"
    } else {
        "no tracefs with kprobe_events at /sys/kernel/tracing or /sys/kernel/debug/tracing"
    };
    Err(NotProbed::NoKprobeEvents {
        detail: detail.to_string(),
    })
}

/// Appends one command to `kprobe_events` (each write is one command to the kernel).
fn kprobe_command(dir: &Path, command: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("kprobe_events"))?;
    f.write_all(format!("{command}\n").as_bytes())
}

fn set_enabled(dir: &Path, on: bool) -> std::io::Result<()> {
    std::fs::write(
        dir.join("events").join(GROUP).join("enable"),
        if on { "1" } else { "0" },
    )
}

/// Removes every probe of hvlab's group (a run killed mid-count leaves them).
fn remove_ours(dir: &Path) {
    let _ = set_enabled(dir, false);
    let Ok(events) = std::fs::read_to_string(dir.join("kprobe_events")) else {
        return;
    };
    for line in events.lines() {
        if let Some(event) = line
            .split_whitespace()
            .next()
            .and_then(|e| e.split_once(':'))
            .map(|(_, e)| e)
            .filter(|e| e.starts_with(&format!("{GROUP}/")))
        {
            let _ = kprobe_command(dir, &format!("-:{event}"));
        }
    }
}

/// `/proc/kallsyms`, read once per process: formatting its 10 MB takes a guest of Debian's 7.3
/// about 550 million instructions, over a second of a TCG boot, per read.
fn kallsyms() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| std::fs::read_to_string("/proc/kallsyms").unwrap_or_default())
}

/// The probes armed for one function: (symbol, event) pairs, and whether they are its
/// callers'.
type Armed = (Vec<(String, String)>, bool);

/// Counts the calls of each of `specs` during `run` (called once, probes armed), and returns
/// them with `run`'s result. A function that cannot be probed says why; `run` runs anyway,
/// so the caller's untimed repetition is the same with or without counts.
pub fn count_calls<T>(specs: &[CallSpec], run: impl FnOnce() -> T) -> (Vec<FunctionCalls>, T) {
    let dir = match tracefs() {
        Ok(dir) => dir,
        Err(why) => {
            let out = specs.iter().map(|s| not_probed(s, why.clone())).collect();
            return (out, run());
        }
    };
    remove_ours(&dir);
    let planned = arm(&dir, specs);
    let armed = planned.iter().any(Result::is_ok);
    let enabled = if armed {
        set_enabled(&dir, true).map_err(|e| e.to_string())
    } else {
        Ok(())
    };
    let result = run();
    let _ = set_enabled(&dir, false);
    let profile = std::fs::read_to_string(dir.join("kprobe_profile"));
    remove_ours(&dir);
    let out = specs
        .iter()
        .zip(planned)
        .map(|(s, chosen)| counted(s, chosen, &enabled, &profile))
        .collect();
    (out, result)
}

/// The tracepoint an event is counted at (`group/event` under tracefs `events/`) and the
/// field its histogram is keyed on (msr-trace.h's `msr`; tlb.h's `reason`).
fn tracepoint(event: HostEvent) -> (&'static str, &'static str) {
    match event {
        HostEvent::MsrWrite => ("msr/write_msr", "msr.hex"),
        HostEvent::TlbFlush => ("tlb/tlb_flush", "reason"),
    }
}

/// The histogram trigger hvlab arms on a tracepoint keyed on `key`.
fn hist_trigger(key: &str) -> String {
    format!("hist:keys={key}:vals=hitcount:size=2048")
}

/// Appends one command to an event's `trigger` file.
fn trigger_command(file: &Path, command: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().append(true).open(file)?;
    f.write_all(format!("{command}\n").as_bytes())
}

/// Counts each of [`HostEvent::ALL`] during `run` (called once, the triggers armed), and
/// returns the counts with `run`'s result. An event that cannot be counted says why; `run`
/// runs anyway.
pub fn count_events<T>(run: impl FnOnce() -> T) -> (Vec<EventCount>, T) {
    let dir = match tracefs() {
        Ok(dir) => dir,
        Err(why) => {
            let out = HostEvent::ALL
                .iter()
                .map(|&event| EventCount {
                    event,
                    counted: EventCounted::NotCounted { why: why.clone() },
                })
                .collect();
            return (out, run());
        }
    };
    let armed: Vec<(HostEvent, Result<PathBuf, NotProbed>)> = HostEvent::ALL
        .iter()
        .map(|&event| (event, arm_trigger(&dir, event)))
        .collect();
    let result = run();
    let out = armed
        .into_iter()
        .map(|(event, armed)| {
            let (_, key) = tracepoint(event);
            let counted = match armed {
                Err(why) => EventCounted::NotCounted { why },
                Ok(events_dir) => {
                    let trigger = events_dir.join("trigger");
                    // Paused before it is read: reading it must not count what hvlab does next.
                    let _ = trigger_command(&trigger, &format!("{}:pause", hist_trigger(key)));
                    let read = std::fs::read_to_string(events_dir.join("hist"));
                    let _ = trigger_command(&trigger, &format!("!{}", hist_trigger(key)));
                    match read.map(|text| hist_hits(&text)) {
                        Ok(Some((count, by_key))) => EventCounted::Counted { count, by_key },
                        Ok(None) => EventCounted::NotCounted {
                            why: NotProbed::Unreadable {
                                error: format!(
                                    "{} has no Totals",
                                    events_dir.join("hist").display()
                                ),
                            },
                        },
                        Err(e) => EventCounted::NotCounted {
                            why: NotProbed::Unreadable {
                                error: format!("{}: {e}", events_dir.join("hist").display()),
                            },
                        },
                    }
                }
            };
            EventCount { event, counted }
        })
        .collect();
    (out, result)
}

/// Arms hvlab's histogram trigger on `event`'s tracepoint (first removing one a killed run
/// left): its directory under `events/`, or why not.
fn arm_trigger(dir: &Path, event: HostEvent) -> Result<PathBuf, NotProbed> {
    let (name, key) = tracepoint(event);
    let events_dir = dir.join("events").join(name);
    let trigger = events_dir.join("trigger");
    if !trigger.exists() {
        return Err(NotProbed::NoTracepoint {
            event: name.replace('/', ":"),
        });
    }
    let _ = trigger_command(&trigger, &format!("!{}", hist_trigger(key)));
    trigger_command(&trigger, &hist_trigger(key)).map_err(|e| NotProbed::TriggerRefused {
        event: name.replace('/', ":"),
        error: e.to_string(),
    })?;
    Ok(events_dir)
}

/// The hits of a tracepoint's `hist` text: the total (`Totals:` … `Hits: N`) and the hits per
/// key (`{ msr: 0xc0000103 } hitcount: 20002`); `None` when it has no total.
pub fn hist_hits(text: &str) -> Option<(u64, std::collections::BTreeMap<String, u64>)> {
    let mut by_key = std::collections::BTreeMap::new();
    let mut total = None;
    for line in text.lines().map(str::trim) {
        if let Some(entry) = line.strip_prefix('{') {
            let Some((key, rest)) = entry.split_once('}') else {
                continue;
            };
            let key = key.split_once(':').map_or(key, |(_, k)| k).trim();
            let hits = rest
                .trim()
                .strip_prefix("hitcount:")
                .and_then(|h| h.trim().parse::<u64>().ok());
            if let Some(hits) = hits {
                *by_key.entry(key.to_string()).or_insert(0) += hits;
            }
        } else if let Some(hits) = line.strip_prefix("Hits:") {
            total = hits.trim().parse::<u64>().ok();
        }
    }
    total.map(|t| (t, by_key))
}

/// A function that was not counted, and why.
fn not_probed(s: &CallSpec, why: NotProbed) -> FunctionCalls {
    FunctionCalls {
        function: s.function(),
        counted: Counted::NotProbed { why },
    }
}

/// Arms a probe on each symbol of each of `specs`: per spec, its probed symbols and their
/// event names, or why not.
fn arm(dir: &Path, specs: &[CallSpec]) -> Vec<Result<Armed, NotProbed>> {
    let mut planned: Vec<Result<Armed, NotProbed>> = Vec::new();
    let mut n = 0;
    for s in specs {
        // A module's function by its own name: the kernel finds it in that module's symbols
        // alone (`MODULE:NAME`), so `/proc/kallsyms` is read only for a built-in function,
        // a clone or callers.
        if let Some(m) = &s.module {
            let event = format!("hvlab_{n}");
            if kprobe_command(dir, &format!("p:{GROUP}/{event} {m}:{}", s.name)).is_ok() {
                n += 1;
                planned.push(Ok((vec![(s.name.clone(), event)], false)));
                continue;
            }
        }
        let chosen = s.symbols(kallsyms()).and_then(|(symbols, via_callers)| {
            let mut events = Vec::new();
            for sym in symbols {
                let event = format!("hvlab_{n}");
                n += 1;
                let target = match &s.module {
                    Some(m) => format!("{m}:{sym}"),
                    None => sym.clone(),
                };
                kprobe_command(dir, &format!("p:{GROUP}/{event} {target}")).map_err(|e| {
                    NotProbed::Refused {
                        symbol: sym.clone(),
                        error: e.to_string(),
                    }
                })?;
                events.push((sym, event));
            }
            Ok((events, via_callers))
        });
        planned.push(chosen);
    }
    planned
}

/// One spec's calls from the probes' profile: the sum over its events, or why they cannot be
/// read (the probes were not enabled, the profile is unreadable or lacks an event).
fn counted(
    s: &CallSpec,
    chosen: Result<Armed, NotProbed>,
    enabled: &Result<(), String>,
    profile: &std::io::Result<String>,
) -> FunctionCalls {
    let (events, via_callers) = match chosen {
        Ok(c) => c,
        Err(why) => return not_probed(s, why),
    };
    let hits = match (enabled, profile) {
        (Err(e), _) => {
            return not_probed(
                s,
                NotProbed::Unreadable {
                    error: format!("enabling the probes: {e}"),
                },
            );
        }
        (_, Err(e)) => {
            return not_probed(
                s,
                NotProbed::Unreadable {
                    error: format!("kprobe_profile: {e}"),
                },
            );
        }
        (Ok(()), Ok(text)) => profile_hits(text),
    };
    let mut calls = 0;
    for (_, event) in &events {
        match hits.get(event) {
            Some(h) => calls += h,
            None => {
                return not_probed(
                    s,
                    NotProbed::Unreadable {
                        error: format!("kprobe_profile has no line for {event}"),
                    },
                );
            }
        }
    }
    FunctionCalls {
        function: s.function(),
        counted: Counted::Probed {
            symbols: events.into_iter().map(|(sym, _)| sym).collect(),
            via_callers,
            calls,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kallsyms excerpt as a guest of 7.3 with the kvm modules loaded shows it: the revert's
    /// function inlined (no symbol), its caller there; a clone; a `.cold` piece; built-in code.
    const KALLSYMS: &str = "\
ffffffff8110a2b0 T call_srcu
ffffffff8110a300 t __call_srcu
ffffffffc0a41230 t direct_pte_prefetch_many\t[kvm]
ffffffffc0a41400 t direct_pte_prefetch\t[kvm]
ffffffffc0a45000 t kvm_mmu_prefetch_sptes.isra.0\t[kvm]
ffffffffc0a46000 t shadow_walk_next.cold\t[kvm]
ffffffffc0a47000 d direct_map_data\t[kvm]
ffffffffc0b00000 t svm_vcpu_run\t[kvm_amd]
ffffffffc0a10000 T kvm_io_bus_register_dev\t[kvm]
";

    fn spec(text: &str) -> CallSpec {
        CallSpec::parse(text).expect("parses")
    }

    /// The revert's `__direct_pte_prefetch` has no symbol: its caller is probed, and the
    /// record says so.
    #[test]
    fn an_inlined_function_falls_back_to_its_caller_with_a_symbol() {
        let s = spec("kvm:__direct_pte_prefetch/direct_pte_prefetch/nonexistent");
        assert_eq!(
            s.symbols(KALLSYMS),
            Ok((vec!["direct_pte_prefetch".to_string()], true))
        );
        assert_eq!(
            spec("kvm:kvm_io_bus_register_dev").symbols(KALLSYMS),
            Ok((vec!["kvm_io_bus_register_dev".to_string()], false))
        );
        assert_eq!(
            spec("call_srcu").symbols(KALLSYMS),
            Ok((vec!["call_srcu".to_string()], false))
        );
    }

    /// A GCC clone counts as the function; a `.cold` piece, a data symbol, another module's
    /// symbol or a built-in one of the same name do not.
    #[test]
    fn clones_are_accepted_and_pieces_and_other_owners_are_not() {
        assert_eq!(
            symbol_in(KALLSYMS, Some("kvm"), "kvm_mmu_prefetch_sptes").as_deref(),
            Some("kvm_mmu_prefetch_sptes.isra.0")
        );
        assert_eq!(symbol_in(KALLSYMS, Some("kvm"), "shadow_walk_next"), None);
        assert_eq!(symbol_in(KALLSYMS, Some("kvm"), "direct_map_data"), None);
        assert_eq!(symbol_in(KALLSYMS, Some("kvm"), "svm_vcpu_run"), None);
        assert_eq!(symbol_in(KALLSYMS, None, "direct_pte_prefetch"), None);
        assert_eq!(
            spec("kvm:shadow_walk_next/also_missing").symbols(KALLSYMS),
            Err(NotProbed::NoSymbol {
                callers: vec!["also_missing".to_string()]
            })
        );
        assert!(is_clone_suffix("constprop.0.isra.0"));
        assert!(!is_clone_suffix("part.0") && !is_clone_suffix("cold"));
    }

    /// Only identifiers reach `kprobe_events`: no second command smuggled in a name.
    #[test]
    fn specs_take_identifiers_only() {
        assert_eq!(
            spec("kvm:f/g"),
            CallSpec {
                module: Some("kvm".into()),
                name: "f".into(),
                callers: vec!["g".into()]
            }
        );
        for bad in ["kvm:f\n-:x", "kvm:", "f/", "kvm:f g", "../f", "kvm:1f"] {
            assert!(CallSpec::parse(bad).is_err(), "{bad:?}");
        }
    }

    /// A `hist` file as Debian 7.3's kernel writes it for `hist:keys=msr.hex:vals=hitcount`:
    /// the total and the hits per MSR.
    #[test]
    fn histogram_hits_are_read_with_their_keys() {
        let text = "\
# event histogram
#
# trigger info: hist:keys=msr.hex:vals=hitcount:sort=hitcount:size=2048 [active]
#

{ msr: 0x6e0 } hitcount:          3
{ msr: 0xc0000103 } hitcount:      10002

Totals:
    Hits: 10005
    Entries: 2
    Dropped: 0
";
        let (total, by_key) = hist_hits(text).expect("has totals");
        assert_eq!(total, 10005);
        assert_eq!(by_key.get("0xc0000103"), Some(&10002));
        assert_eq!(by_key.get("0x6e0"), Some(&3));
        assert_eq!(hist_hits("# event histogram\n"), None);
    }

    #[test]
    fn profile_hits_are_read_per_event() {
        let text = "  hvlab_0                                                    4097               0\n  hvlab_1  0  0\n";
        let hits = profile_hits(text);
        assert_eq!(hits.get("hvlab_0"), Some(&4097));
        assert_eq!(hits.get("hvlab_1"), Some(&0));
    }
}
