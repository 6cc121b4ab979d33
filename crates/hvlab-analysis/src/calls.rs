//! Calls of the functions a kernel patch changes, counted in the guest in one untimed
//! repetition of each variant (`hvlab run --count-calls`, which `hvlab kab` asks for): whether
//! the run reached the patched code at all. A patched function that ran 0 times on both
//! kernels could not have shown the patch: the kab says NOT EXERCISED, never NO CHANGE.
//!
//! A count is never guessed: a function the guest could not probe says why
//! ([`NotProbed`]), and a kab then judges the variant as it would without counts.

use serde::{Deserialize, Serialize};

/// The calls counted in one variant of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VariantCalls {
    /// The variant.
    pub variant: String,
    /// Each function asked for, in the order asked.
    pub functions: Vec<FunctionCalls>,
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
}
