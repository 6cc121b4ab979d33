//! What a scenario asks of its variants: a baseline and the comparisons that matter, declared
//! once in the scenario's file ([`Question`]), and the verdicts that answer them
//! ([`verdicts`]). Fewer comparisons than "every variant against the fastest" also means each
//! has more power: Holm multiplies the smallest p by the family's size.

use serde::Serialize;

use crate::analysis::compare::{Verdict, against, against_baselines, against_fastest};
use crate::analysis::statistics::seed_for;
use crate::analysis::verdict::{self, ALPHA, Correction};
use crate::error::InputError;
use crate::record::VariantRecord;

/// A scenario's question, as data.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Question {
    /// The question in a few words, as the report's first screen asks it.
    pub asks: &'static str,
    /// The variant the others are judged against (`--baseline-variant` changes it); `None`
    /// when the question is about each variant on its own ([`Question::within`]).
    pub baseline: Option<&'static str>,
    /// The variants judged against the baseline: every other one the run has (empty), or only
    /// these.
    pub judged: &'static [&'static str],
    /// Further comparisons the question asks, each `(variant, against)`: a mechanism's
    /// before and after that both ran (the model's PMU lists before and after a series).
    pub pairs: &'static [(&'static str, &'static str)],
    /// Within each variant, metric `.0` against metric `.1` of the same repetitions (memslots:
    /// the last tenth of the updates against the first, the growth with slots).
    pub within: Option<(&'static str, &'static str)>,
    /// Whether the answer also gives each variant's headline on its own (what each exit type
    /// costs), beside the verdicts.
    pub costs: bool,
}

/// Which baseline a run's verdicts use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Baseline {
    /// The scenario's question.
    #[default]
    Declared,
    /// Every other variant against this one (`--baseline-variant V`).
    Variant(String),
    /// Every variant against the fastest (`--against-fastest`).
    Fastest,
}

impl Question {
    /// The `(variant, against)` comparisons this question makes of the variants `ran` (in run
    /// order), with `baseline` chosen by the request. A declared baseline that did not run
    /// gives way to the first variant that did.
    pub fn pairs_for(&self, ran: &[&str], baseline: &Baseline) -> Vec<(String, String)> {
        let all_against = |base: &str| -> Vec<(String, String)> {
            ran.iter()
                .filter(|v| **v != base)
                .map(|v| ((*v).to_string(), base.to_string()))
                .collect()
        };
        match baseline {
            Baseline::Fastest => Vec::new(),
            Baseline::Variant(v) if ran.contains(&v.as_str()) => all_against(v),
            Baseline::Variant(_) => Vec::new(),
            Baseline::Declared => {
                let Some(declared) = self.baseline else {
                    return Vec::new();
                };
                let Some(base) = ran
                    .iter()
                    .copied()
                    .find(|v| *v == declared)
                    .or_else(|| ran.first().copied())
                else {
                    return Vec::new();
                };
                let mut out: Vec<(String, String)> = ran
                    .iter()
                    .filter(|v| **v != base && (self.judged.is_empty() || self.judged.contains(v)))
                    .map(|v| ((*v).to_string(), base.to_string()))
                    .collect();
                for (v, a) in self.pairs {
                    let pair = ((*v).to_string(), (*a).to_string());
                    if ran.contains(v) && ran.contains(a) && !out.contains(&pair) {
                        out.push(pair);
                    }
                }
                out
            }
        }
    }

    /// How many comparisons a run of `variants` (all producing samples) judges together.
    pub fn family_size(&self, variants: &[&str], baseline: &Baseline) -> usize {
        match (self.within, baseline) {
            (Some(_), Baseline::Declared) => variants.len(),
            (_, Baseline::Fastest) => variants.len().saturating_sub(1),
            _ => self.pairs_for(variants, baseline).len(),
        }
    }

    /// Whether repetitions `reps` can decide a family of `m` comparisons, each judged by the
    /// exact rank test with Holm's correction at p < 0.05: its smallest attainable p,
    /// corrected, must be below the level.
    pub fn decidable(m: usize, reps: usize) -> bool {
        let n = vec![[reps, reps]; m];
        verdict::family(&vec![1.0; m], &n, Correction::Holm, ALPHA)
            .iter()
            .all(|f| reps >= verdict::MIN_PER_SIDE && f.attainable < ALPHA)
    }
}

/// The variants of a run that produced samples, in run order.
fn ran(variants: &[VariantRecord]) -> Vec<&str> {
    variants
        .iter()
        .filter(|v| v.is_ok())
        .map(|v| v.name.as_str())
        .collect()
}

/// The verdicts that answer `question` on `metric` (the scenario's headline), judged together.
pub fn verdicts(
    question: &Question,
    variants: &[VariantRecord],
    metric: &str,
    baseline: &Baseline,
    seed: u64,
) -> Vec<Verdict> {
    match (question.within, baseline) {
        (_, Baseline::Fastest) => against_fastest(variants, metric, seed),
        (Some((later, earlier)), Baseline::Declared) => within(variants, later, earlier, seed),
        _ => {
            let pairs = question.pairs_for(&ran(variants), baseline);
            against_baselines(variants, metric, &pairs, seed)
        }
    }
}

/// Within each variant, `later` against `earlier`, judged together.
fn within(variants: &[VariantRecord], later: &str, earlier: &str, seed: u64) -> Vec<Verdict> {
    let mut out: Vec<Verdict> = variants
        .iter()
        .filter(|v| v.is_ok())
        .filter_map(|v| {
            let (b, a) = (v.metrics.get(later)?, v.metrics.get(earlier)?);
            let (b_name, a_name) = (
                format!("{} ({later})", v.name),
                format!("{} ({earlier})", v.name),
            );
            Some(against(
                &format!("{later} against {earlier}"),
                &a.unit,
                (&a_name, &a.samples),
                (&b_name, &b.samples),
                seed_for(seed, &["within", &v.name]),
            ))
        })
        .collect();
    crate::analysis::compare::judge_variants_together(&mut out);
    out
}

/// Refuses a `--baseline-variant` the run does not have, naming those it has.
pub fn check_baseline(baseline: &Baseline, names: &[String]) -> Result<(), InputError> {
    match baseline {
        Baseline::Variant(v) if !names.contains(v) => Err(InputError::BaselineNotInRun {
            variant: v.clone(),
            known: names.join(", "),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const Q: Question = Question {
        asks: "what each backing costs",
        baseline: Some("lazy"),
        judged: &[],
        pairs: &[("legacy", "legacy-skip-trailing")],
        within: None,
        costs: false,
    };

    #[test]
    fn each_variant_is_judged_against_the_declared_baseline_and_the_declared_pairs() {
        let ran = ["lazy", "populated", "legacy-skip-trailing", "legacy"];
        let pairs = Q.pairs_for(&ran, &Baseline::Declared);
        let want: Vec<(String, String)> = [
            ("populated", "lazy"),
            ("legacy-skip-trailing", "lazy"),
            ("legacy", "lazy"),
            ("legacy", "legacy-skip-trailing"),
        ]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(pairs, want);
        // Without the baseline in the run, the first variant that ran is the baseline.
        let pairs = Q.pairs_for(&["thp", "uffd"], &Baseline::Declared);
        assert_eq!(pairs, vec![("uffd".to_string(), "thp".to_string())]);
        // --baseline-variant: every other variant against it, nothing else.
        let pairs = Q.pairs_for(&ran, &Baseline::Variant("populated".into()));
        assert_eq!(pairs.len(), 3);
        assert!(pairs.iter().all(|(_, a)| a == "populated"));
    }

    #[test]
    fn five_a_side_cannot_decide_nine_comparisons_six_can() {
        assert!(!Question::decidable(9, 5));
        assert!(Question::decidable(9, 6));
        assert!(Question::decidable(5, 5));
        assert!(!Question::decidable(1, 3));
    }

    /// Every scenario on every backend it runs on, and every showcase the suite adds: with
    /// its default repetitions, the exact rank test corrected over the comparisons its
    /// question makes of its default variants can reach p < 0.05. A scenario that gains
    /// variants (or a question that gains comparisons) without the repetitions to decide them
    /// fails here.
    #[test]
    fn default_reps_decide_every_scenarios_declared_comparisons_on_every_backend() {
        use crate::scenario::Kind;
        for kind in Kind::ALL {
            let info = kind.info();
            let q = &info.question;
            let reps = info.default_reps as usize;
            let every: Vec<&str> = info
                .variants
                .iter()
                .chain(info.model_variants)
                .map(|v| v.name)
                .collect();
            // What the question names exists.
            for name in q
                .baseline
                .iter()
                .chain(q.judged)
                .chain(q.pairs.iter().flat_map(|(a, b)| [a, b]))
            {
                assert!(every.contains(name), "{}: no variant {name}", info.name);
            }
            if let Some((later, earlier)) = q.within {
                for m in [later, earlier] {
                    assert!(
                        info.metrics.iter().any(|x| x.name == m),
                        "{}: no metric {m}",
                        info.name
                    );
                }
            }
            for backend in info.backends() {
                let names: Vec<&str> = info
                    .variants_for(backend.capabilities())
                    .map(|v| v.name)
                    .collect();
                let m = q.family_size(&names, &Baseline::Declared);
                assert!(
                    m > 0,
                    "{} on {backend}: the question compares nothing",
                    info.name
                );
                assert!(
                    Question::decidable(m, reps),
                    "{} on {backend}: {reps} repetitions cannot decide its {m} comparisons",
                    info.name
                );
            }
            for sc in kind.showcases() {
                let names: Vec<&str> = if sc.variants.is_empty() {
                    info.variants_for(hvlab_core::BackendKind::Model.capabilities())
                        .map(|v| v.name)
                        .collect()
                } else {
                    sc.variants.to_vec()
                };
                let m = q.family_size(&names, &Baseline::Declared);
                assert!(
                    Question::decidable(m.max(1), reps),
                    "{} showcase on {}: {reps} repetitions cannot decide {m} comparisons",
                    info.name,
                    sc.profile
                );
            }
        }
    }

    #[test]
    fn a_baseline_the_run_lacks_is_bad_input_naming_the_variants() {
        let names = vec!["lazy".to_string(), "thp".to_string()];
        let err = check_baseline(&Baseline::Variant("uffd".into()), &names).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("uffd") && text.contains("lazy, thp"),
            "{text}"
        );
        assert!(check_baseline(&Baseline::Variant("thp".into()), &names).is_ok());
    }
}
