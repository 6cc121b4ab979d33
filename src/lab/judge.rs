//! `hvlab judge GOOD [CANDIDATE] --variant V`: one commit judged against GOOD, answered as a
//! `git bisect run` step expects: good (exit 0), bad (1) or skip (125).
//!
//! The object code comes first: both kernels are built (cached), and when every module the
//! builds rebuilt compiled to identical code, line-number constants aside
//! ([`crate::kernel::objdiff`]), the candidate is NO CHANGE exactly, without a boot. Otherwise
//! the candidate and GOOD are booted ABBA and judged as a bisection's step is ([`KabJudge`]),
//! with rising effort while NOT DECIDED, up to the cap.

use serde::Serialize;

use crate::analysis::class::VariantClass;
use crate::kernel::build;
use crate::kernel::objdiff::{self, BuildsDelta, LineShift};
use crate::kernel::reach::{self, Reach, ReachSource};
use crate::lab::Error;
use crate::lab::bisect::{Call, Judge, KabJudge, Range, Seek};
use crate::lab::kab::{KabProgress, KabRequest};
use crate::lab::series::{Numbers, SeriesStep, first_error};
use crate::store::Store;

/// What `git bisect run` is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Answer {
    /// Like GOOD: exit 0.
    Good,
    /// Changed as sought: exit 1.
    Bad,
    /// Cannot be told (does not build, not decided): exit 125.
    Skip,
}

impl Answer {
    /// The exit status `git bisect run` reads.
    pub fn exit_code(self) -> u8 {
        match self {
            Answer::Good => 0,
            Answer::Bad => 1,
            Answer::Skip => 125,
        }
    }
}

/// Why the answer is what it is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// Every rebuilt module's object code is identical: NO CHANGE, exactly, without a boot.
    ObjectIdentical,
    /// The candidate does not build: the compiler's first error.
    DoesNotBuild {
        /// The error.
        error: String,
    },
    /// The object code changed and booting was not asked for (`--no-boot`).
    NotBooted,
    /// Booted and judged.
    Judged {
        /// The variant's class against GOOD.
        class: VariantClass,
        /// The metric behind it.
        numbers: Option<Numbers>,
        /// The effort that decided it (or the cap).
        effort: u32,
    },
}

/// One candidate judged.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judgement {
    /// GOOD's spec.
    pub good: String,
    /// The candidate's spec.
    pub candidate: String,
    /// The variant.
    pub variant: String,
    /// The change sought.
    pub seek: Seek,
    /// The object-code delta, when both built.
    pub object: Option<BuildsDelta>,
    /// The functions the candidate's patches over GOOD change, and where that was read.
    pub reach: Option<(Reach, ReachSource)>,
    /// Why.
    pub reason: Reason,
    /// What git is told.
    pub answer: Answer,
    /// Wall time of the whole judgement, in seconds.
    pub wall_s: f64,
}

/// What to judge, and how.
pub struct JudgeRequest {
    /// Boots, repetitions, scenarios and the sandbox, as a kab's; its `base` is GOOD and its
    /// `patched` the candidate.
    pub kab: KabRequest,
    /// The variant.
    pub variant: String,
    /// The metric shown, when given.
    pub metric: Option<String>,
    /// The change sought.
    pub seek: Seek,
    /// How many times a NOT DECIDED judgement gets more boots.
    pub max_effort: u32,
    /// Whether to boot when the object code changed.
    pub boot: bool,
}

/// The answer to give for `class`: the change sought is bad; NO CHANGE, or a decided change
/// the other way, is still GOOD's side; NOT DECIDED and NOT EXERCISED cannot be told.
pub fn answer_of(seek: Seek, class: VariantClass) -> Answer {
    match class {
        c if seek.is(c) => Answer::Bad,
        VariantClass::NoChange
        | VariantClass::Regressed
        | VariantClass::Fixed
        | VariantClass::Improved => Answer::Good,
        VariantClass::NotDecided | VariantClass::NotExercised => Answer::Skip,
    }
}

/// Judges `req.kab.patched` against `req.kab.base`.
pub fn judge(
    req: &JudgeRequest,
    store: &mut Store,
    progress: &dyn KabProgress,
) -> Result<Judgement, Error> {
    let start = std::time::Instant::now();
    let (good, candidate) = (&req.kab.base, &req.kab.patched);
    let patches = candidate.patches_over(good);
    let done = |object: Option<BuildsDelta>,
                reach: Option<(Reach, ReachSource)>,
                reason: Reason,
                answer: Answer| Judgement {
        good: good.given.clone(),
        candidate: candidate.given.clone(),
        variant: req.variant.clone(),
        seek: req.seek,
        object,
        reach,
        reason,
        answer,
        wall_s: start.elapsed().as_secs_f64(),
    };
    // GOOD first, alone (cached after a bisection's first step): a failure there is judge's
    // own, and one in the pair after it is the candidate's.
    build::resolve_with_config(
        std::slice::from_ref(good),
        req.kab.sandbox,
        req.kab.config.as_deref(),
        progress,
    )?;
    let built = build::resolve_with_config(
        &[good.clone(), candidate.clone()],
        req.kab.sandbox,
        req.kab.config.as_deref(),
        progress,
    );
    let (sides, trees) = match built {
        Ok(r) => (r.sides, r.source_trees),
        // As a bisection's step: the input's error, or a commit of the candidate's that does
        // not compile (git:PATH@REF has no patch, so its compiler error is a BaseCompile).
        Err(e) if e.may_be_candidates() => {
            let error = first_error(&e);
            return Ok(done(
                None,
                None,
                Reason::DoesNotBuild { error },
                Answer::Skip,
            ));
        }
        Err(e) => return Err(e.into()),
    };
    let [a, b] = sides.as_slice() else {
        let error = "the build returned no kernel".to_string();
        return Ok(done(
            None,
            None,
            Reason::DoesNotBuild { error },
            Answer::Skip,
        ));
    };
    let delta = objdiff::compare_builds(a, b, &LineShift::of(&patches));
    let shown = trees.first().map(|tree| {
        let objects = reach::module_objects(&a.kernel);
        reach::reach_exact_or_scanned(&patches, &objects, tree)
    });
    if delta.identical() {
        return Ok(done(
            Some(delta),
            shown,
            Reason::ObjectIdentical,
            Answer::Good,
        ));
    }
    if !req.boot {
        return Ok(done(Some(delta), shown, Reason::NotBooted, Answer::Skip));
    }
    let range = Range {
        good: good.clone(),
        steps: vec![SeriesStep {
            label: "CANDIDATE".into(),
            subject: String::new(),
            spec: candidate.clone(),
        }],
    };
    let mut kab = KabJudge::new(
        range,
        req.kab.clone(),
        req.variant.clone(),
        req.metric.clone(),
        store,
        progress,
    )?;
    let mut effort = 0;
    let call = loop {
        let call = kab.judge(0, 1, effort);
        let undecided = matches!(
            call,
            Call::Judged {
                class: VariantClass::NotDecided,
                ..
            }
        );
        if !undecided || effort >= req.max_effort {
            break call;
        }
        effort += 1;
    };
    if let Some(e) = kab.failure() {
        return Err(e);
    }
    Ok(match call {
        Call::DoesNotBuild { error } => done(
            Some(delta),
            shown,
            Reason::DoesNotBuild { error },
            Answer::Skip,
        ),
        Call::Judged { class, numbers } => done(
            Some(delta),
            shown,
            Reason::Judged {
                class,
                numbers,
                effort,
            },
            answer_of(req.seek, class),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What git is told follows the change sought: a regression is bad when regressions are
    /// sought, good (not yet regressed) when fixes are; undecided is always skipped.
    #[test]
    fn answers_follow_the_change_sought() {
        use VariantClass::*;
        let row = |seek| {
            [
                Regressed,
                Fixed,
                Improved,
                NoChange,
                NotDecided,
                NotExercised,
            ]
            .map(|c| answer_of(seek, c).exit_code())
        };
        assert_eq!(row(Seek::Regression), [1, 0, 0, 0, 125, 125]);
        assert_eq!(row(Seek::Fix), [0, 1, 1, 0, 125, 125]);
        assert_eq!(row(Seek::Change), [1, 1, 1, 0, 125, 125]);
    }
}
