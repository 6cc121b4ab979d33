//! Calls of the functions a kernel patch changes, counted in the guest in one untimed
//! repetition of each variant (`hvlab run --count-calls`, which `hvlab kab` asks for): whether
//! the run reached the patched code at all. A patched function that ran 0 times on both
//! kernels could not have shown the patch: the kab says NOT EXERCISED, never NO CHANGE.
//!
//! A count is never guessed: a function the guest could not probe says why
//! ([`NotProbed`]), and a kab then judges the variant as it would without counts.
//!
//! In the same repetition the guest counts what its kernel, the host of the VM it runs, did
//! that an instruction clock prices at one instruction each ([`HostEvent`]: MSR writes, TLB
//! flushes): a kab says them beside an instruction delta.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The calls counted in one variant of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariantCalls {
    /// The variant.
    pub variant: String,
    /// Each function asked for, in the order asked.
    pub functions: Vec<FunctionCalls>,
    /// The host kernel's events in the same repetition (empty in runs stored before they were
    /// counted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<EventCount>,
    /// The iterations of the scenario in that repetition (the exits scenario's exits), which
    /// the events are counted per; `None`: a scenario without iterations, counted per
    /// repetition. The repetition also builds and tears down its VM: what that costs is
    /// spread over the iterations (a few dozen events over 10,000 exits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterations: Option<u64>,
}

/// An event of the host kernel (the guest's, where a kab runs) that the instruction clock
/// prices at one instruction, whatever it costs on a real CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostEvent {
    /// A write of a model-specific register by the kernel's `wrmsr()` family (the
    /// `msr:write_msr` tracepoint): serializing, 100s of cycles on a real core.
    MsrWrite,
    /// A TLB flush of the kernel's own address spaces (the `tlb:tlb_flush` tracepoint).
    TlbFlush,
}

impl HostEvent {
    /// Every event counted, in the order shown.
    pub const ALL: [HostEvent; 2] = [HostEvent::MsrWrite, HostEvent::TlbFlush];
}

/// One host event's count in the counted repetition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventCount {
    /// The event.
    pub event: HostEvent,
    /// What was counted.
    pub counted: EventCounted,
}

/// What was counted of one host event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum EventCounted {
    /// Counted: every hit of its tracepoint, and the hits per key (the MSR written, the
    /// flush's reason) as the tracepoint's histogram kept them.
    Counted {
        /// Hits in the repetition.
        count: u64,
        /// Hits per key (`0xc0000103` for MSR_TSC_AUX), as the kernel prints the key.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        by_key: BTreeMap<String, u64>,
    },
    /// Not counted, and why: the count is unknown.
    NotCounted {
        /// Why.
        why: NotProbed,
    },
}

impl EventCounted {
    /// The count, when counted.
    pub fn count(&self) -> Option<u64> {
        match self {
            EventCounted::Counted { count, .. } => Some(*count),
            EventCounted::NotCounted { .. } => None,
        }
    }
}

/// One patched function's calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCalls {
    /// The function as asked: `[MODULE:]NAME` (`kvm:__direct_pte_prefetch`).
    pub function: String,
    /// What was counted.
    pub counted: Counted,
}

/// What was counted of one function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Counted {
    /// Probed: the function's own symbol, or when the compiler inlined it everywhere, the
    /// symbols of its callers in the same file (their calls summed: an upper bound on its own,
    /// and zero exactly when it had no chance to run from them).
    Probed {
        /// The symbols probed, as `/proc/kallsyms` names them (`direct_pte_prefetch`,
        /// `__direct_pte_prefetch.isra.0`).
        symbols: Vec<String>,
        /// Whether `symbols` are its callers, not itself.
        via_callers: bool,
        /// Calls (kprobe hits) in the untimed repetition.
        calls: u64,
    },
    /// Not probed, and why: its calls are unknown.
    NotProbed {
        /// Why.
        why: NotProbed,
    },
}

/// Why a function could not be probed in the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum NotProbed {
    /// The guest kernel has no kprobe events (`CONFIG_KPROBE_EVENTS`): no tracefs, or no
    /// `kprobe_events` in it.
    NoKprobeEvents {
        /// What was missing.
        detail: String,
    },
    /// Neither the function nor any caller in its file has a symbol in `/proc/kallsyms`.
    NoSymbol {
        /// The callers looked for.
        callers: Vec<String>,
    },
    /// The kernel refused a probe on a symbol (a `notrace` or blacklisted function, a name
    /// several static functions share).
    Refused {
        /// The symbol.
        symbol: String,
        /// The kernel's error.
        error: String,
    },
    /// The probe's hits could not be read back.
    Unreadable {
        /// The error.
        error: String,
    },
    /// The guest kernel has no such tracepoint in tracefs (not x86, or built without it).
    NoTracepoint {
        /// The tracepoint (`msr/write_msr`).
        event: String,
    },
    /// The kernel refused a histogram trigger on a tracepoint (`CONFIG_HIST_TRIGGERS` off).
    TriggerRefused {
        /// The tracepoint.
        event: String,
        /// The kernel's error.
        error: String,
    },
}

impl std::fmt::Display for NotProbed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotProbed::NoKprobeEvents { detail } => write!(
                f,
                "the guest kernel has no kprobe events ({detail}): build it with CONFIG_KPROBE_EVENTS=y to count calls"
            ),
            NotProbed::NoSymbol { callers } if callers.is_empty() => f.write_str(
                "inlined: no symbol in /proc/kallsyms, and no caller in its file to count instead",
            ),
            NotProbed::NoSymbol { callers } => write!(
                f,
                "inlined: neither it nor its callers in its file ({}) have a symbol in /proc/kallsyms",
                callers.join(", ")
            ),
            NotProbed::Refused { symbol, error } => {
                write!(f, "the kernel refused a kprobe on {symbol}: {error}")
            }
            NotProbed::Unreadable { error } => {
                write!(f, "its kprobe hits could not be read: {error}")
            }
            NotProbed::NoTracepoint { event } => {
                write!(f, "the guest kernel has no tracepoint {event} in tracefs")
            }
            NotProbed::TriggerRefused { event, error } => write!(
                f,
                "the kernel refused a histogram trigger on {event} ({error}): build it with CONFIG_HIST_TRIGGERS=y to count it"
            ),
        }
    }
}

impl Counted {
    /// The calls, when counted.
    pub fn calls(&self) -> Option<u64> {
        match self {
            Counted::Probed { calls, .. } => Some(*calls),
            Counted::NotProbed { .. } => None,
        }
    }
}

/// One side's calls of `variant`, summed over its runs (each run's `calls`), per function:
/// `None` when no run counted calls. A function some run could not probe keeps that run's
/// reason: a count missing from one boot is not a zero. The runs come as their calls, not as
/// records, so the record (which embeds these types) stays above this module.
pub fn side_calls<'a>(
    runs: impl IntoIterator<Item = &'a [VariantCalls]>,
    variant: &str,
) -> Option<Vec<FunctionCalls>> {
    let mut out: Vec<FunctionCalls> = Vec::new();
    let mut any = false;
    for v in runs.into_iter().flatten().filter(|c| c.variant == variant) {
        any = true;
        for f in &v.functions {
            let Some(seen) = out.iter_mut().find(|s| s.function == f.function) else {
                out.push(f.clone());
                continue;
            };
            match (&mut seen.counted, &f.counted) {
                (
                    Counted::Probed { calls, symbols, .. },
                    Counted::Probed {
                        calls: more,
                        symbols: also,
                        ..
                    },
                ) => {
                    *calls += more;
                    for s in also {
                        if !symbols.contains(s) {
                            symbols.push(s.clone());
                        }
                    }
                }
                (Counted::Probed { .. }, Counted::NotProbed { .. }) => {
                    seen.counted = f.counted.clone()
                }
                (Counted::NotProbed { .. }, _) => {}
            }
        }
    }
    any.then_some(out)
}

/// One side's count of a host event over its runs of a variant: the sum, or why some run did
/// not count it (a count missing from one boot is not a zero).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SideEvent {
    /// The event.
    pub event: HostEvent,
    /// The count summed over the side's counted repetitions, or why not.
    pub counted: Result<u64, NotProbed>,
    /// Hits per key, summed.
    pub by_key: BTreeMap<String, u64>,
}

/// One side's host events of a variant, over its runs, and what they are per.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SideEvents {
    /// The iterations of the counted repetitions, summed (`None`: counted per repetition).
    pub iterations: Option<u64>,
    /// The counted repetitions (one a run).
    pub repetitions: u64,
    /// Each event, in [`HostEvent::ALL`]'s order.
    pub events: Vec<SideEvent>,
}

impl SideEvents {
    /// An event's count per iteration (else per repetition), when counted.
    #[allow(clippy::cast_precision_loss)] // counts far below 2^53
    pub fn per_unit(&self, event: HostEvent) -> Option<f64> {
        let e = self.events.iter().find(|e| e.event == event)?;
        let n = e.counted.as_ref().ok()?;
        let per = self.iterations.unwrap_or(self.repetitions).max(1);
        Some(*n as f64 / per as f64)
    }
}

/// One side's host events of `variant`, summed over its runs' counted repetitions: `None`
/// when no run counted any. Runs that counted with iterations and runs without are never
/// mixed: the per-repetition reading is kept only when no run had iterations.
pub fn side_events<'a>(
    runs: impl IntoIterator<Item = &'a [VariantCalls]>,
    variant: &str,
) -> Option<SideEvents> {
    let counted: Vec<&VariantCalls> = runs
        .into_iter()
        .flatten()
        .filter(|c| c.variant == variant && !c.events.is_empty())
        .collect();
    if counted.is_empty() {
        return None;
    }
    let iterations = if counted.iter().all(|c| c.iterations.is_some()) {
        Some(counted.iter().filter_map(|c| c.iterations).sum())
    } else {
        None
    };
    let events = HostEvent::ALL
        .iter()
        .filter(|e| {
            counted
                .iter()
                .any(|c| c.events.iter().any(|x| x.event == **e))
        })
        .map(|&event| {
            let mut total: Result<u64, NotProbed> = Ok(0);
            let mut by_key: BTreeMap<String, u64> = BTreeMap::new();
            for c in &counted {
                let this = c.events.iter().find(|x| x.event == event);
                match (this.map(|x| &x.counted), &mut total) {
                    (
                        Some(EventCounted::Counted {
                            count,
                            by_key: keys,
                        }),
                        Ok(sum),
                    ) => {
                        *sum += count;
                        for (k, n) in keys {
                            *by_key.entry(k.clone()).or_insert(0) += n;
                        }
                    }
                    (Some(EventCounted::NotCounted { why }), Ok(_)) => total = Err(why.clone()),
                    (None, Ok(_)) => {
                        total = Err(NotProbed::Unreadable {
                            error: "a run of this side did not count it".into(),
                        })
                    }
                    (_, Err(_)) => {}
                }
            }
            SideEvent {
                event,
                counted: total,
                by_key,
            }
        })
        .collect();
    Some(SideEvents {
        iterations,
        repetitions: counted.len() as u64,
        events,
    })
}

/// Whether the patched functions never ran: both sides counted every one of them, each
/// 0 times. A function not probed on a side, or no counts at all, is never "not exercised".
pub fn never_ran(sides: [Option<&[FunctionCalls]>; 2]) -> bool {
    sides.iter().all(|side| {
        side.is_some_and(|fs| !fs.is_empty() && fs.iter().all(|f| f.counted.calls() == Some(0)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probed(function: &str, calls: u64) -> FunctionCalls {
        FunctionCalls {
            function: function.into(),
            counted: Counted::Probed {
                symbols: vec![function.trim_start_matches("kvm:").into()],
                via_callers: false,
                calls,
            },
        }
    }

    #[test]
    fn never_ran_needs_every_function_counted_zero_on_both_sides() {
        let zero = [probed("kvm:f", 0), probed("kvm:g", 0)];
        let one = [probed("kvm:f", 0), probed("kvm:g", 1)];
        let unknown = [
            probed("kvm:f", 0),
            FunctionCalls {
                function: "kvm:g".into(),
                counted: Counted::NotProbed {
                    why: NotProbed::NoSymbol { callers: vec![] },
                },
            },
        ];
        assert!(never_ran([Some(&zero), Some(&zero)]));
        assert!(!never_ran([Some(&zero), Some(&one)]));
        assert!(!never_ran([Some(&zero), Some(&unknown)]));
        assert!(!never_ran([Some(&zero), None]));
        assert!(!never_ran([Some(&[]), Some(&[])]));
    }

    /// A run stored before events were counted still loads (no events, no iterations); a
    /// side's events are summed over its boots and read per iteration; a boot that could not
    /// count one keeps its reason, never a zero.
    #[test]
    fn host_events_load_from_old_runs_and_sum_over_boots() {
        let old = r#"{"variant":"pio-out","functions":[]}"#;
        let v: VariantCalls = serde_json::from_str(old).unwrap();
        assert!(v.events.is_empty() && v.iterations.is_none());
        assert_eq!(side_events([std::slice::from_ref(&v)], "pio-out"), None);
        let boot = |msr: EventCounted| VariantCalls {
            variant: "pio-out".into(),
            functions: Vec::new(),
            events: vec![EventCount {
                event: HostEvent::MsrWrite,
                counted: msr,
            }],
            iterations: Some(1000),
        };
        let counted = |n: u64| EventCounted::Counted {
            count: n,
            by_key: [("c0000103".to_string(), n)].into_iter().collect(),
        };
        let (one, two) = (vec![boot(counted(1008))], vec![boot(counted(1010))]);
        let side = side_events([one.as_slice(), two.as_slice()], "pio-out").unwrap();
        assert_eq!(side.iterations, Some(2000));
        assert_eq!(side.per_unit(HostEvent::MsrWrite), Some(1.009));
        assert_eq!(side.events[0].by_key["c0000103"], 2018);
        let missing = vec![boot(EventCounted::NotCounted {
            why: NotProbed::NoTracepoint {
                event: "msr:write_msr".into(),
            },
        })];
        let side = side_events([one.as_slice(), missing.as_slice()], "pio-out").unwrap();
        assert_eq!(side.per_unit(HostEvent::MsrWrite), None);
        assert!(side.events[0].counted.is_err());
        let json = serde_json::to_string(&one[0]).unwrap();
        assert_eq!(serde_json::from_str::<VariantCalls>(&json).unwrap(), one[0]);
    }
}
