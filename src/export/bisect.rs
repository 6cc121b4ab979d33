//! A bisection in words: the culprit (or the commits it may be) with its verdict against its
//! parent, the change sought, the skipped commits and why, the refusal to start, and the
//! command that reproduces it. The records are `crate::lab::bisect`'s; every sentence is here.

use crate::analysis::class::VariantClass;
use crate::lab::bisect::{
    BisectError, Bisection, Call, NotNamed, Outcome, Range, Seek, SkipReason,
};

use super::series::numbers_words;

/// A call in words: the class with its metric's numbers, or the build's error.
pub fn call_words(call: &Call) -> String {
    match call {
        Call::Judged { class, numbers } => {
            let n = numbers
                .as_ref()
                .map_or_else(String::new, |n| format!(": {}", numbers_words(n, true)));
            format!("{}{n}", class.word())
        }
        Call::DoesNotBuild { error } => format!("DOES NOT BUILD: {error}"),
    }
}

/// The classes that are the change sought, as a refusal names them.
pub fn sought_classes(seek: Seek) -> String {
    let (regressed, fixed, improved) = (
        VariantClass::Regressed.word(),
        VariantClass::Fixed.word(),
        VariantClass::Improved.word(),
    );
    match seek {
        Seek::Change => format!("a change ({regressed}, {fixed} or {improved})"),
        Seek::Regression => regressed.to_string(),
        Seek::Fix => format!("{fixed} or {improved}"),
    }
}

/// The change sought, as the account names it.
fn sought(seek: Seek) -> &'static str {
    match seek {
        Seek::Change => "a change either way",
        Seek::Regression => "a regression",
        Seek::Fix => "a fix",
    }
}

/// Why a commit was skipped.
pub fn skip_words(why: &SkipReason) -> String {
    match why {
        SkipReason::NotDecided { effort } => format!(
            "{} at the most repetitions (effort {effort})",
            VariantClass::NotDecided.word()
        ),
        SkipReason::Neither { class } => {
            format!("{} against GOOD: neither GOOD nor BAD", class.word())
        }
        SkipReason::DoesNotBuild { error } => format!("does not build: {error}"),
    }
}

/// Why no single commit is named.
pub fn not_named_words(why: &NotNamed) -> String {
    match why {
        NotNamed::Skipped { lo, hi } => format!(
            "the commits between {lo} and {hi} were skipped, so the first changed commit is any of them"
        ),
        NotNamed::NotConfirmed { commit, said } => {
            let said: Vec<String> = said
                .iter()
                .map(|call| match call {
                    Call::Judged { class, .. } => class.word().to_string(),
                    Call::DoesNotBuild { error } => format!("does not build ({error})"),
                })
                .collect();
            format!(
                "the search ended at commit {commit}, but against its parent it is {}: a step was likely misjudged by noise; run again with more --boots or --reps",
                said.join(", then ")
            )
        }
    }
}

/// Why no bisection can start, naming the fix (one clause: the error's template ends it).
pub fn refusal_words(e: &BisectError) -> String {
    match e {
        BisectError::NotDifferent { class, seek } => format!(
            "GOOD and BAD do not differ as sought: BAD against GOOD is {}, not {}; check the variant (--variant), the direction (--fix seeks a fix), or add --boots/--reps when NOT DECIDED",
            class.word(),
            sought_classes(*seek)
        ),
        BisectError::BadDoesNotBuild { error } => format!(
            "BAD does not build ({error}), so there is nothing to bisect towards; give a BAD that builds"
        ),
        BisectError::Empty => {
            "GOOD and BAD are the same commit; give a range of at least one commit".into()
        }
    }
}

/// The bisection's account: the culprit (or the commits it may be), its verdict against its
/// parent, the skipped commits, and the command that reproduces it.
pub fn bisect_text(range: &Range, b: &Bisection, command: &str) -> String {
    let name = |i: usize| {
        let subject = i
            .checked_sub(1)
            .and_then(|j| range.steps.get(j))
            .map_or(String::new(), |s| format!(" {}", s.subject));
        format!("{}{subject}", range.label(i))
    };
    let mut out = Vec::new();
    match &b.outcome {
        Outcome::Found {
            commit,
            parent,
            checks,
        } => {
            out.push(format!("first changed commit: {}", name(*commit)));
            if let Some(c) = checks.last() {
                out.push(format!(
                    "  against its parent ({}): {}",
                    range.label(*parent),
                    call_words(&c.call)
                ));
            }
            out.push(format!("  kernel: {}", range.spec(*commit).given));
        }
        Outcome::Uncertain { candidates, why } => {
            out.push(format!(
                "no single commit named: it is one of {}",
                candidates
                    .iter()
                    .map(|&c| range.label(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            out.push(format!("  {}", not_named_words(why)));
        }
    }
    out.push(format!(
        "BAD against GOOD: {} (the change sought: {})",
        call_words(&b.ends.call),
        sought(b.seek)
    ));
    out.push(format!("{} step(s) judged", b.steps.len()));
    if b.skipped.is_empty() {
        out.push("skipped: none".into());
    } else {
        out.push("skipped:".into());
        out.extend(
            b.skipped
                .iter()
                .map(|s| format!("  {}: {}", name(s.commit), skip_words(&s.why))),
        );
    }
    out.push(format!("reproduce: {command}"));
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::build::PatchedSpec;
    use crate::lab::bisect::{Probe, Skipped};
    use crate::lab::series::{Numbers, SeriesStep};

    #[test]
    fn a_bisection_names_the_commit_its_subject_verdict_numbers_skips_and_command() {
        let range = Range {
            good: PatchedSpec::named("debian:7.3"),
            steps: (1..=3)
                .map(|i| SeriesStep {
                    label: format!("[PATCH {i}/3]"),
                    subject: format!("KVM: change {i}"),
                    spec: PatchedSpec::named(&format!("debian:7.3+{i}.patch")),
                })
                .collect(),
        };
        let regressed = Call::Judged {
            class: VariantClass::Regressed,
            numbers: Some(Numbers {
                metric: "ioctl.kvm_irqfd_ms".into(),
                unit: "ms".into(),
                parent: 12.0,
                commit: 15.5,
                change_pct: 29.2,
                stddev_pct: [2.5, 3.0],
            }),
        };
        let probe = |commit, against| Probe {
            commit,
            against,
            effort: 0,
            call: regressed.clone(),
        };
        let b = Bisection {
            seek: Seek::Regression,
            ends: probe(3, 0),
            steps: vec![probe(2, 0)],
            skipped: vec![Skipped {
                commit: 1,
                why: SkipReason::DoesNotBuild {
                    error: "kvm_main.c:3: error".into(),
                },
            }],
            outcome: Outcome::Found {
                commit: 2,
                parent: 1,
                checks: vec![probe(2, 1), probe(2, 1)],
            },
        };
        let text = bisect_text(
            &range,
            &b,
            "hvlab bisect debian:7.3 debian:7.3+s.mbox --variant v",
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "first changed commit: [PATCH 2/3] KVM: change 2");
        assert_eq!(
            lines[1],
            "  against its parent ([PATCH 1/3]): REGRESSED: ioctl.kvm_irqfd_ms 12.0 ±2.50% → 15.5 ±3% ms (+29.2%)"
        );
        assert!(
            text.contains(
                "skipped:\n  [PATCH 1/3] KVM: change 1: does not build: kvm_main.c:3: error"
            ),
            "{text}"
        );
        assert!(text.ends_with("reproduce: hvlab bisect debian:7.3 debian:7.3+s.mbox --variant v"));
    }

    /// A refusal names BAD's class, the classes sought (a variant's, never a metric's FASTER
    /// or SLOWER) and the fix; an unconfirmed culprit names what each check said.
    #[test]
    fn a_refusal_and_an_unnamed_culprit_say_what_was_found_and_what_to_do() {
        let e = refusal_words(&BisectError::NotDifferent {
            class: VariantClass::NoChange,
            seek: Seek::Change,
        });
        assert!(
            e.contains(
                "BAD against GOOD is NO CHANGE, not a change (REGRESSED, FIXED or IMPROVED)"
            ),
            "{e}"
        );
        assert!(e.contains("--fix"), "{e}");
        for seek in [Seek::Change, Seek::Regression, Seek::Fix] {
            let words = sought_classes(seek);
            assert!(
                !words.contains("SLOWER") && !words.contains("FASTER"),
                "{words}"
            );
        }
        assert_eq!(sought_classes(Seek::Fix), "FIXED or IMPROVED");
        let why = not_named_words(&NotNamed::NotConfirmed {
            commit: 4,
            said: vec![
                Call::Judged {
                    class: VariantClass::Regressed,
                    numbers: None,
                },
                Call::Judged {
                    class: VariantClass::NoChange,
                    numbers: None,
                },
                Call::DoesNotBuild {
                    error: "x.c:1: error".into(),
                },
            ],
        });
        assert!(
            why.contains(
                "commit 4, but against its parent it is REGRESSED, then NO CHANGE, then does not build (x.c:1: error)"
            ),
            "{why}"
        );
        assert_eq!(
            skip_words(&SkipReason::NotDecided { effort: 3 }),
            "NOT DECIDED at the most repetitions (effort 3)"
        );
    }
}
