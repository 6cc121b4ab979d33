//! `hvlab bisect GOOD BAD --variant V`: the first commit whose verdict for V differs from
//! GOOD's, as `git bisect` finds it, on a host whose every judgement is noisy.
//!
//! - GOOD and BAD are judged first: BAD against GOOD must be the change sought (REGRESSED, or
//!   with `--fix` FIXED or IMPROVED), else there is nothing to bisect.
//! - Each step judges the commit nearest the middle against GOOD, adding repetitions (more
//!   boots, then more reps: [`Judge::judge`]'s `effort`) until the verdict is decided, up to a
//!   cap. A step that stays NOT DECIDED, changes the other way, or does not build is skipped
//!   and named, and the next untested commit nearest the middle is tried, as `git bisect skip`
//!   does: never guessed.
//! - The culprit is judged against its parent directly, three times at rising effort, and
//!   named only when most say it is the change: a step the noise decided wrongly sends the
//!   search to a commit that changes nothing against its parent, which this check catches.
//!   Otherwise the outcome is uncertain, and says between which commits.
//!
//! The logic runs against the [`Judge`] trait: the real one is a kab between two commits'
//! kernels ([`KabJudge`]), judged by the pair judge kab and `--per-patch` judge by
//! ([`series::judge_commit`]), whose runs are stored by kernel, so an interrupted bisection's
//! boots are found and reused; the tests' judges are fakes. The records are typed (a skip's
//! reason, why no commit is named, why none can start); their words are in
//! `src/export/bisect.rs`.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::analysis::class::VariantClass;
use crate::kernel::Kernel;
use crate::lab::Error;

use crate::kernel::build::{self, PatchedSpec};
use crate::kernel::vm::Accel;
use crate::lab::kab::{self, KabProgress, KabRequest};
use crate::lab::series::{self, JudgeSettings, KernelRuns, Numbers, RunsAsked, SeriesStep};
use crate::store::Store;

/// What a judge says of one commit against another.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Call {
    /// Both built and booted: the variant's verdict.
    Judged {
        /// The class.
        class: VariantClass,
        /// The metric behind it.
        numbers: Option<Numbers>,
    },
    /// The candidate does not build: the compiler's first error.
    DoesNotBuild {
        /// The error.
        error: String,
    },
}

/// Judges commits of the range (0 is GOOD, the last BAD) against each other.
pub trait Judge {
    /// `candidate` against `against`, for the bisected variant, at `effort` (0 the first try;
    /// each step up adds boots, then repetitions, to what is already stored).
    fn judge(&mut self, against: usize, candidate: usize, effort: u32) -> Call;

    /// The commits the step after the one about to be judged will take, one per outcome (see
    /// [`next_midpoints`]): a judge may build them ahead while this step boots. Nothing by
    /// default.
    fn ahead(&mut self, _commits: &[usize]) {}
}

/// Which change is sought.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Seek {
    /// The first commit whose verdict against GOOD differs from GOOD's own (any decided class
    /// but NO CHANGE), as `git bisect` seeks the first "new" commit: the default.
    Change,
    /// The first commit that regressed (REGRESSED): `--regression`.
    Regression,
    /// The first commit that fixed it (FIXED, IMPROVED): `--fix`.
    Fix,
}

impl Seek {
    /// Whether `class` is the change sought.
    pub fn is(self, class: VariantClass) -> bool {
        let (worse, better) = match class {
            VariantClass::Regressed => (true, false),
            VariantClass::Fixed | VariantClass::Improved => (false, true),
            VariantClass::NoChange | VariantClass::NotDecided | VariantClass::NotExercised => {
                (false, false)
            }
        };
        match self {
            Seek::Change => worse || better,
            Seek::Regression => worse,
            Seek::Fix => better,
        }
    }

    /// Whether a commit judged `class` against GOOD is still on GOOD's side of the change
    /// sought: NO CHANGE, and a change the other way (a commit that made it worse has not yet
    /// fixed it; one that made it better has not regressed it).
    fn before(self, class: VariantClass) -> bool {
        class == VariantClass::NoChange
            || match self {
                Seek::Change => false,
                Seek::Regression => Seek::Fix.is(class),
                Seek::Fix => Seek::Regression.is(class),
            }
    }
}

/// One judged step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Probe {
    /// The commit's index (0 GOOD).
    pub commit: usize,
    /// Judged against.
    pub against: usize,
    /// The effort that decided it (or the cap).
    pub effort: u32,
    /// What was said.
    pub call: Call,
}

/// A commit left out of the search, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Skipped {
    /// The commit's index.
    pub commit: usize,
    /// Why: not decided at the cap, changed the other way, or does not build.
    pub why: SkipReason,
}

/// Why a commit was left out of the search. Words in `src/export/bisect.rs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum SkipReason {
    /// Still NOT DECIDED at the most effort a step gets.
    NotDecided {
        /// That effort (`--max-effort`).
        effort: u32,
    },
    /// Decided against GOOD, but neither as GOOD nor as the change sought.
    Neither {
        /// Its class against GOOD.
        class: VariantClass,
    },
    /// It does not build.
    DoesNotBuild {
        /// The compiler's first error.
        error: String,
    },
}

/// Why no single commit is named. Words in `src/export/bisect.rs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum NotNamed {
    /// The commits between `lo` and `hi` were skipped, so the first changed commit is any of
    /// the commits after `lo` up to `hi`.
    Skipped {
        /// The last commit on GOOD's side.
        lo: usize,
        /// The first on the change's side.
        hi: usize,
    },
    /// The search ended at `commit`, but its checks against its parent did not say it is the
    /// change: a step was likely misjudged by noise.
    NotConfirmed {
        /// The commit the search ended at.
        commit: usize,
        /// What each check against its parent said, in order.
        said: Vec<Call>,
    },
}

/// How a bisection ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Outcome {
    /// The culprit, confirmed against its parent by most of the checks.
    Found {
        /// Its index.
        commit: usize,
        /// Its parent's.
        parent: usize,
        /// The checks against the parent, in order.
        checks: Vec<Probe>,
    },
    /// No single commit can be named: the first changed commit is one of `candidates`.
    Uncertain {
        /// The commits it may be, in order.
        candidates: Vec<usize>,
        /// Why no one of them is named.
        why: NotNamed,
    },
}

/// The bisection: what was judged, what skipped, and the outcome.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bisection {
    /// The change sought.
    pub seek: Seek,
    /// BAD against GOOD.
    pub ends: Probe,
    /// Every step, in order.
    pub steps: Vec<Probe>,
    /// The commits left out.
    pub skipped: Vec<Skipped>,
    /// How it ended.
    pub outcome: Outcome,
}

/// Why no bisection can start. Words in `src/export/bisect.rs`.
#[derive(Debug, Clone, PartialEq)]
pub enum BisectError {
    /// GOOD and BAD do not differ as sought.
    NotDifferent {
        /// The class BAD got against GOOD.
        class: VariantClass,
        /// What was sought.
        seek: Seek,
    },
    /// BAD does not build, so there is nothing to bisect towards.
    BadDoesNotBuild {
        /// The compiler's first error.
        error: String,
    },
    /// GOOD and BAD are the same commit.
    Empty,
}

/// The decided call of `candidate` against `against`: rising effort until the class is not
/// NOT DECIDED, or the cap.
fn decide(judge: &mut dyn Judge, against: usize, candidate: usize, cap: u32) -> Probe {
    let mut effort = 0;
    loop {
        let call = judge.judge(against, candidate, effort);
        let undecided = matches!(
            call,
            Call::Judged {
                class: VariantClass::NotDecided,
                ..
            }
        );
        if !undecided || effort >= cap {
            return Probe {
                commit: candidate,
                against,
                effort,
                call,
            };
        }
        effort += 1;
    }
}

/// The untested commit strictly between `lo` and `hi` nearest their middle (the lower of two
/// as near), leaving out the skipped.
fn nearest_middle(lo: usize, hi: usize, skipped: &[Skipped]) -> Option<usize> {
    let mid = lo.midpoint(hi);
    (lo + 1..hi)
        .filter(|c| !skipped.iter().any(|s| s.commit == *c))
        .min_by_key(|&c| (c.abs_diff(mid), c))
}

/// The commits the search judges after judging `m` between `lo` and `hi`: the middle of the
/// lower half (when `m` is the change) and of the upper half (when it is not); none for a
/// half with no untested commit left.
pub fn next_midpoints(lo: usize, hi: usize, m: usize, skipped: &[Skipped]) -> Vec<usize> {
    let mut out: Vec<usize> = [
        nearest_middle(lo, m, skipped),
        nearest_middle(m, hi, skipped),
    ]
    .into_iter()
    .flatten()
    .collect();
    out.dedup();
    out
}

/// Bisects commits `0..=last` (0 GOOD, `last` BAD) for `seek`, adding effort up to `cap` per
/// step.
pub fn bisect(
    judge: &mut dyn Judge,
    last: usize,
    seek: Seek,
    cap: u32,
) -> Result<Bisection, BisectError> {
    if last == 0 {
        return Err(BisectError::Empty);
    }
    let ends = decide(judge, 0, last, cap);
    match &ends.call {
        Call::DoesNotBuild { error } => {
            return Err(BisectError::BadDoesNotBuild {
                error: error.clone(),
            });
        }
        Call::Judged { class, .. } if !seek.is(*class) => {
            return Err(BisectError::NotDifferent {
                class: *class,
                seek,
            });
        }
        Call::Judged { .. } => {}
    }
    let mut steps = Vec::new();
    let (mut skipped, mut outcome) = search(judge, last, seek, cap, false, &mut steps);
    // A culprit its parent check did not confirm: a step was misjudged. Once more, each step
    // decided by most of up to three judgements, as the check is.
    if matches!(&outcome, Outcome::Uncertain { candidates, .. } if candidates.len() == 1) {
        (skipped, outcome) = search(judge, last, seek, cap, true, &mut steps);
    }
    skipped.retain(|s| s.commit > 0);
    Ok(Bisection {
        seek,
        ends,
        steps,
        skipped,
        outcome,
    })
}

/// Most of up to three decided judgements of `candidate` against `against` at rising effort:
/// the first that two agree on (the third only when the first two disagree).
fn majority(
    judge: &mut dyn Judge,
    against: usize,
    candidate: usize,
    cap: u32,
    same: impl Fn(&Call, &Call) -> bool,
) -> Probe {
    let mut seen: Vec<Probe> = Vec::new();
    for round in 0..3u32 {
        let mut p = decide(judge, against, candidate, cap + round);
        p.effort = p.effort.max(round);
        if let Some(agreed) = seen.iter().find(|q| same(&q.call, &p.call)) {
            let mut out = agreed.clone();
            out.effort = p.effort;
            return out;
        }
        seen.push(p);
    }
    // Three different answers: nothing agreed, which is as good as not decided.
    let mut last = seen.pop().unwrap_or(Probe {
        commit: candidate,
        against,
        effort: cap,
        call: Call::Judged {
            class: VariantClass::NotDecided,
            numbers: None,
        },
    });
    last.call = Call::Judged {
        class: VariantClass::NotDecided,
        numbers: None,
    };
    last
}

/// One pass of the search from GOOD and BAD; `careful` decides each step by [`majority`].
fn search(
    judge: &mut dyn Judge,
    last: usize,
    seek: Seek,
    cap: u32,
    careful: bool,
    steps: &mut Vec<Probe>,
) -> (Vec<Skipped>, Outcome) {
    let (mut lo, mut hi) = (0, last);
    let mut skipped: Vec<Skipped> = Vec::new();
    let kind = |c: &Call| match c {
        Call::Judged { class, .. } if seek.is(*class) => 0,
        Call::Judged { class, .. } => match class {
            VariantClass::NoChange => 1,
            VariantClass::NotDecided => 2,
            VariantClass::Fixed
            | VariantClass::Improved
            | VariantClass::Regressed
            | VariantClass::NotExercised => 3,
        },
        Call::DoesNotBuild { .. } => 4,
    };
    while let Some(m) = nearest_middle(lo, hi, &skipped) {
        judge.ahead(&next_midpoints(lo, hi, m, &skipped));
        let probe = if careful {
            majority(judge, 0, m, cap, |a, b| kind(a) == kind(b))
        } else {
            decide(judge, 0, m, cap)
        };
        match &probe.call {
            Call::Judged { class, .. } if seek.is(*class) => hi = m,
            Call::Judged { class, .. } if seek.before(*class) => lo = m,
            Call::Judged { class, .. } => skipped.push(Skipped {
                commit: m,
                why: if *class == VariantClass::NotDecided {
                    SkipReason::NotDecided { effort: cap }
                } else {
                    SkipReason::Neither { class: *class }
                },
            }),
            Call::DoesNotBuild { error } => skipped.push(Skipped {
                commit: m,
                why: SkipReason::DoesNotBuild {
                    error: error.clone(),
                },
            }),
        }
        steps.push(probe);
    }
    let between: Vec<usize> = (lo + 1..=hi).collect();
    let outcome = if between.len() > 1 {
        Outcome::Uncertain {
            why: NotNamed::Skipped { lo, hi },
            candidates: between,
        }
    } else {
        confirm(judge, lo, hi, seek, cap)
    };
    (skipped, outcome)
}

/// The culprit `commit` against its `parent`, judged up to three times at rising effort (the
/// third only when the first two disagree): named when most say it is the change.
fn confirm(judge: &mut dyn Judge, parent: usize, commit: usize, seek: Seek, cap: u32) -> Outcome {
    let mut checks: Vec<Probe> = Vec::new();
    let is_change = |p: &Probe| matches!(&p.call, Call::Judged { class, .. } if seek.is(*class));
    for round in 0..3u32 {
        let mut probe = decide(judge, parent, commit, cap + round);
        probe.effort = probe.effort.max(round);
        checks.push(probe);
        let yes = checks.iter().filter(|p| is_change(p)).count();
        let no = checks.len() - yes;
        if yes >= 2 {
            return Outcome::Found {
                commit,
                parent,
                checks,
            };
        }
        if no >= 2 {
            break;
        }
    }
    Outcome::Uncertain {
        candidates: vec![commit],
        why: NotNamed::NotConfirmed {
            commit,
            said: checks.into_iter().map(|p| p.call).collect(),
        },
    }
}

/// The cluster this process runs in, from its environment (`get`): a Slurm job
/// (`SLURM_JOB_ID`) or a Kubernetes pod (`KUBERNETES_SERVICE_HOST`), whose node is the job's
/// own; `None` on a machine of its own.
pub fn cluster_of(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    let set = |k: &str| get(k).filter(|v| !v.trim().is_empty());
    set("SLURM_JOB_ID")
        .map(|j| format!("Slurm job {j}"))
        .or_else(|| set("KUBERNETES_SERVICE_HOST").map(|_| "a Kubernetes pod".to_string()))
}

/// A bisection's commits: GOOD, then each step up to BAD.
#[derive(Debug, Clone, Serialize)]
pub struct Range {
    /// GOOD's kernel.
    pub good: PatchedSpec,
    /// The commits after GOOD, the last BAD.
    pub steps: Vec<SeriesStep>,
}

impl Range {
    /// Commit `i`'s kernel (0 GOOD).
    pub fn spec(&self, i: usize) -> &PatchedSpec {
        match i.checked_sub(1).and_then(|j| self.steps.get(j)) {
            Some(s) => &s.spec,
            None => &self.good,
        }
    }

    /// Commit `i`'s label (0 `GOOD`).
    pub fn label(&self, i: usize) -> String {
        match i.checked_sub(1).and_then(|j| self.steps.get(j)) {
            Some(s) => s.label.clone(),
            None => "GOOD".into(),
        }
    }
}

/// The real [`Judge`]: a kab between two commits' kernels, built as `kab` builds a pair
/// (each commit beside GOOD) and booted ABBA, every run stored and found again by kernel, so
/// a kernel booted by an earlier step (or an interrupted bisection) is not booted again.
///
/// Effort adds boots first (two, an ABBA pair, per step, up to three times the request's),
/// then doubles the repetitions: a boot is what varies most between runs. Runs are found by
/// what was asked ([`RunsAsked`]), reps included, so boots at fewer reps are not pooled with
/// those at more: a step that doubles them boots its kernels again at the new count.
/// The trait cannot fail, so an error that is not the commit's (QEMU missing, a boot that
/// fails) is kept, every later call answers NOT DECIDED without booting, and the caller reads
/// it with [`KabJudge::failure`].
pub struct KabJudge<'a> {
    range: Range,
    req: KabRequest,
    variant: String,
    metric: Option<String>,
    store: &'a mut Store,
    progress: &'a dyn KabProgress,
    accel: Accel,
    kernels: BTreeMap<usize, Result<Kernel, String>>,
    failure: Option<Error>,
    /// `--speculate`: build the next step's candidates ahead, in the background.
    speculate: bool,
    /// The commits a speculative build has been started for.
    started_ahead: Vec<usize>,
    /// Where the steps' time went.
    phases: series::PhaseTimes,
    /// When judging began.
    started: std::time::Instant,
}

impl<'a> KabJudge<'a> {
    /// A judge of `variant` over `range`, booting as `req` asks (its `base` and `patched` are
    /// not read: each call names its pair).
    pub fn new(
        range: Range,
        req: KabRequest,
        variant: String,
        metric: Option<String>,
        store: &'a mut Store,
        progress: &'a dyn KabProgress,
    ) -> Result<KabJudge<'a>, Error> {
        crate::kernel::vm::qemu()?;
        let accel = crate::kernel::vm::choose_accel(req.vm.accel)?.accel;
        Ok(KabJudge {
            range,
            req,
            variant,
            metric,
            store,
            progress,
            accel,
            kernels: BTreeMap::new(),
            failure: None,
            speculate: false,
            started_ahead: Vec::new(),
            phases: series::PhaseTimes::default(),
            started: std::time::Instant::now(),
        })
    }

    /// The same judge building each next step's two candidates ahead, in a thread of its own
    /// while this step boots (`--speculate`, under a cluster only: see [`cluster_of`]). The
    /// builds land in the kernel cache, where the step that needs one finds it; the cache's
    /// lock on a source keeps a speculative build and the step's own from sharing a tree.
    pub fn speculating(mut self) -> KabJudge<'a> {
        self.speculate = true;
        self
    }

    /// The error that stopped judging, when one did.
    pub fn failure(self) -> Option<Error> {
        self.failure
    }

    /// Where the time went so far: building, booting, judging, and all of it.
    pub fn phases(&self) -> series::PhaseTimes {
        series::PhaseTimes {
            total_s: self.started.elapsed().as_secs_f64(),
            ..self.phases
        }
    }

    /// Boots per kernel and repetitions per boot at `effort`.
    pub fn plan(boots: u32, reps: u32, effort: u32) -> (u32, u32) {
        // Each step boots one more ABBA pair; past `boots` such steps, at doubled reps.
        let rep_steps = effort.saturating_sub(boots.max(1));
        (
            boots + 2 * effort,
            reps.saturating_mul(1u32 << rep_steps.min(8)),
        )
    }

    /// Commit `i`'s kernel, built beside GOOD (once per bisection).
    fn kernel(&mut self, i: usize) -> Result<Result<Kernel, String>, Error> {
        if let Some(k) = self.kernels.get(&i) {
            return Ok(k.clone());
        }
        let start = std::time::Instant::now();
        let built = series::build_beside_base(
            self.range.spec(0),
            (i > 0).then(|| self.range.spec(i)),
            &self.req,
            self.progress,
        );
        self.phases.build_s += start.elapsed().as_secs_f64();
        let built = built?.map(|b| b.kernel);
        self.kernels.insert(i, built.clone());
        Ok(built)
    }

    fn try_judge(&mut self, against: usize, candidate: usize, effort: u32) -> Result<Call, Error> {
        let a = match self.kernel(against)? {
            Ok(k) => k,
            Err(error) => return Ok(Call::DoesNotBuild { error }),
        };
        let b = match self.kernel(candidate)? {
            Ok(k) => k,
            Err(error) => return Ok(Call::DoesNotBuild { error }),
        };
        let (boots, reps) = KabJudge::plan(self.req.boots, self.req.reps, effort);
        let mut req = self.req.clone();
        req.boots = boots;
        req.reps = reps;
        req.variants = vec![self.variant.clone()];
        let commands = kab::guest_commands(&req);
        let labelled = vec![
            (self.range.label(against), a),
            (self.range.label(candidate), b),
        ];
        let mut busy = vec![Vec::new(), Vec::new()];
        let mut failed = vec![Vec::new(), Vec::new()];
        let boots_start = std::time::Instant::now();
        let booted = series::boot_chain(
            &[0, 1],
            &labelled,
            &req,
            &commands,
            self.accel,
            self.store,
            self.progress,
            &mut busy,
            &mut failed,
        )?;
        self.phases.boots += booted.0.len();
        self.phases.boots_s += boots_start.elapsed().as_secs_f64();
        let judge_start = std::time::Instant::now();
        let asked = RunsAsked::of(&req, self.accel);
        let runs = |k: usize| -> Result<KernelRuns, Error> {
            Ok(KernelRuns {
                runs: series::stored_runs(self.store, &labelled[k].1.spec, &asked)?,
                failed_commands: failed[k].clone(),
                host_busy: busy[k].clone(),
            })
        };
        let (ra, rb) = (runs(0)?, runs(1)?);
        let row = series::judge_commit(
            &ra,
            &rb,
            &JudgeSettings {
                asked,
                threshold: req.threshold,
                metric: self.metric.as_deref(),
            },
        )
        .into_iter()
        .find(|v| v.variant == self.variant);
        self.phases.judge_s += judge_start.elapsed().as_secs_f64();
        Ok(match row {
            Some(v) => Call::Judged {
                class: v.vs_parent.class,
                numbers: v.numbers,
            },
            None => Call::Judged {
                class: VariantClass::NotDecided,
                numbers: None,
            },
        })
    }
}

impl Judge for KabJudge<'_> {
    fn ahead(&mut self, commits: &[usize]) {
        if !self.speculate || self.failure.is_some() {
            return;
        }
        let fresh: Vec<usize> = commits
            .iter()
            .copied()
            .filter(|c| !self.kernels.contains_key(c) && !self.started_ahead.contains(c))
            .collect();
        if fresh.is_empty() {
            return;
        }
        self.started_ahead.extend(&fresh);
        let good = self.range.spec(0).clone();
        let specs: Vec<PatchedSpec> = fresh.iter().map(|&c| self.range.spec(c).clone()).collect();
        let (sandbox, config) = (self.req.sandbox, self.req.config.clone());
        // Detached: a build nobody needs in the end only fills the cache, and one cut off
        // when the bisection ends is not marked complete there.
        std::thread::spawn(move || {
            for spec in specs {
                // Its error, if any, is the step's to report when it builds the commit.
                let _ = build::resolve_with_config(
                    &[good.clone(), spec],
                    sandbox,
                    config.as_deref(),
                    &build::Silent,
                );
            }
        });
    }

    fn judge(&mut self, against: usize, candidate: usize, effort: u32) -> Call {
        let undecided = Call::Judged {
            class: VariantClass::NotDecided,
            numbers: None,
        };
        if self.failure.is_some() {
            return undecided;
        }
        match self.try_judge(against, candidate, effort) {
            Ok(call) => call,
            Err(e) => {
                self.failure = Some(e);
                undecided
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range whose commit `culprit` regressed; `broken` do not build; `undecided` stay NOT
    /// DECIDED below `decides_at` effort (forever when it is above the cap).
    struct Fake {
        culprit: usize,
        broken: Vec<usize>,
        undecided: Vec<usize>,
        decides_at: u32,
        /// Every `lie_every`-th call (from `lie_phase`) says the opposite.
        lie_every: Option<(usize, usize)>,
        calls: usize,
        /// What each step announced for the next, in order.
        announced: Vec<Vec<usize>>,
    }

    impl Fake {
        fn new(culprit: usize) -> Fake {
            Fake {
                culprit,
                broken: Vec::new(),
                undecided: Vec::new(),
                decides_at: 0,
                lie_every: None,
                calls: 0,
                announced: Vec::new(),
            }
        }
    }

    impl Judge for Fake {
        fn ahead(&mut self, commits: &[usize]) {
            self.announced.push(commits.to_vec());
        }

        fn judge(&mut self, against: usize, candidate: usize, effort: u32) -> Call {
            self.calls += 1;
            if self.broken.contains(&candidate) {
                return Call::DoesNotBuild {
                    error: format!("arch/x86/kvm/x86.c:{candidate}: error: expected ';'"),
                };
            }
            if self.undecided.contains(&candidate) && effort < self.decides_at {
                return Call::Judged {
                    class: VariantClass::NotDecided,
                    numbers: None,
                };
            }
            let changed = against < self.culprit && candidate >= self.culprit;
            let lie = self
                .lie_every
                .is_some_and(|(every, phase)| self.calls % every == phase);
            let class = if changed != lie {
                VariantClass::Regressed
            } else {
                VariantClass::NoChange
            };
            Call::Judged {
                class,
                numbers: None,
            }
        }
    }

    fn found(b: &Bisection) -> Option<usize> {
        match b.outcome {
            Outcome::Found { commit, .. } => Some(commit),
            Outcome::Uncertain { .. } => None,
        }
    }

    /// Effort adds an ABBA pair of boots per step; past `boots` such steps, each new pair runs
    /// at doubled repetitions.
    #[test]
    fn the_real_judges_effort_adds_boots_then_repetitions() {
        let plans: Vec<(u32, u32)> = (0..5).map(|e| KabJudge::plan(2, 10, e)).collect();
        assert_eq!(plans, [(2, 10), (4, 10), (6, 10), (8, 20), (10, 40)]);
    }

    #[test]
    fn finds_every_culprit_of_a_clean_range() {
        for last in 1..=9 {
            for culprit in 1..=last {
                let mut j = Fake::new(culprit);
                let b = bisect(&mut j, last, Seek::Regression, 3).expect("bisects");
                assert_eq!(found(&b), Some(culprit), "last {last}, culprit {culprit}");
                assert!(b.skipped.is_empty());
            }
        }
    }

    #[test]
    fn good_and_bad_that_do_not_differ_are_refused() {
        let mut j = Fake::new(99);
        let e = bisect(&mut j, 4, Seek::Regression, 2).expect_err("no difference");
        assert_eq!(
            e,
            BisectError::NotDifferent {
                class: VariantClass::NoChange,
                seek: Seek::Regression
            }
        );
        // A regression sought as a fix is not there either.
        let mut j = Fake::new(2);
        assert!(matches!(
            bisect(&mut j, 4, Seek::Fix, 2),
            Err(BisectError::NotDifferent { .. })
        ));
    }

    #[test]
    fn an_unbuildable_commit_is_skipped_and_named() {
        // Commit 4 is the middle of 0..8 and does not build: skipped, the search goes on.
        let mut j = Fake::new(6);
        j.broken = vec![4];
        let b = bisect(&mut j, 8, Seek::Regression, 2).expect("bisects");
        assert_eq!(found(&b), Some(6));
        assert_eq!(b.skipped.len(), 1);
        assert_eq!(b.skipped[0].commit, 4);
        assert_eq!(
            b.skipped[0].why,
            SkipReason::DoesNotBuild {
                error: "arch/x86/kvm/x86.c:4: error: expected ';'".into()
            }
        );
    }

    #[test]
    fn a_skipped_culprit_is_named_as_uncertain_never_guessed() {
        // The culprit itself does not build: the first bad is it or the next, never a guess.
        let mut j = Fake::new(4);
        j.broken = vec![4];
        let b = bisect(&mut j, 8, Seek::Regression, 2).expect("bisects");
        match &b.outcome {
            Outcome::Uncertain { candidates, why } => {
                assert_eq!(candidates, &vec![4, 5]);
                assert_eq!(why, &NotNamed::Skipped { lo: 3, hi: 5 });
            }
            Outcome::Found { .. } => panic!("named a commit the search could not test"),
        }
    }

    #[test]
    fn not_decided_steps_get_more_effort_then_are_skipped() {
        // Decided at effort 2, under a cap of 3: no skip, more effort spent.
        let mut j = Fake::new(3);
        j.undecided = vec![4];
        j.decides_at = 2;
        let b = bisect(&mut j, 8, Seek::Regression, 3).expect("bisects");
        assert_eq!(found(&b), Some(3));
        assert!(b.skipped.is_empty());
        assert!(b.steps.iter().any(|p| p.commit == 4 && p.effort == 2));
        // Never decided under the cap: skipped and named, and the search still ends right.
        let mut j = Fake::new(3);
        j.undecided = vec![4];
        j.decides_at = 99;
        let b = bisect(&mut j, 8, Seek::Regression, 3).expect("bisects");
        assert_eq!(found(&b), Some(3));
        assert_eq!(b.skipped[0].commit, 4);
        assert_eq!(b.skipped[0].why, SkipReason::NotDecided { effort: 3 });
    }

    #[test]
    fn a_judge_wrong_once_in_five_never_names_a_wrong_commit() {
        let (mut right, mut uncertain) = (0, 0);
        for last in 2..=12 {
            for culprit in 1..=last {
                for phase in 0..5 {
                    let mut j = Fake::new(culprit);
                    j.lie_every = Some((5, phase));
                    let Ok(b) = bisect(&mut j, last, Seek::Regression, 2) else {
                        // A lie on GOOD vs BAD refuses to start: said, not wrong.
                        continue;
                    };
                    match b.outcome {
                        Outcome::Found { commit, .. } => {
                            assert_eq!(
                                commit, culprit,
                                "last {last}, culprit {culprit}, phase {phase}: {b:?}"
                            );
                            right += 1;
                        }
                        Outcome::Uncertain { .. } => uncertain += 1,
                    }
                }
            }
        }
        println!(
            "a judge wrong once in five: {right} named the culprit, {uncertain} uncertain, 0 wrong"
        );
        // The checks do their work: most runs still name the culprit.
        assert!(
            right > 3 * uncertain,
            "right {right}, uncertain {uncertain}"
        );
    }

    /// Speculation builds the two commits the next step may take: whichever way a decided
    /// step goes, the next step judges one of them; after a skipped step the search moves
    /// within the same halves, so no promise holds and none is checked.
    #[test]
    fn each_step_announces_both_possible_next_midpoints() {
        assert_eq!(next_midpoints(0, 8, 4, &[]), [2, 6]);
        assert_eq!(next_midpoints(0, 2, 1, &[]), Vec::<usize>::new());
        assert_eq!(next_midpoints(3, 5, 4, &[]), Vec::<usize>::new());
        let skip = |commit| Skipped {
            commit,
            why: SkipReason::NotDecided { effort: 0 },
        };
        assert_eq!(next_midpoints(0, 8, 4, &[skip(2)]), [1, 6]);
        let mut checked = 0;
        for (last, broken) in (2..=12).flat_map(|l| [(l, None), (l, Some(l / 2))]) {
            for culprit in 1..=last {
                let mut j = Fake::new(culprit);
                j.broken = broken.into_iter().collect();
                let b = bisect(&mut j, last, Seek::Regression, 2).expect("bisects");
                assert_eq!(j.announced.len(), b.steps.len(), "one announcement a step");
                for (k, step) in b.steps.iter().enumerate().skip(1) {
                    if b.skipped.iter().any(|s| s.commit == b.steps[k - 1].commit) {
                        continue;
                    }
                    assert!(
                        j.announced[k - 1].contains(&step.commit),
                        "last {last}, culprit {culprit}: step {k} judged {}, announced {:?}",
                        step.commit,
                        j.announced[k - 1]
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 100, "{checked} steps checked");
    }

    #[test]
    fn only_a_slurm_job_or_a_kubernetes_pod_is_a_cluster() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_string())
            }
        };
        assert_eq!(cluster_of(env(&[])), None);
        assert_eq!(cluster_of(env(&[("SLURM_JOB_ID", " ")])), None);
        assert_eq!(
            cluster_of(env(&[("SLURM_JOB_ID", "4242")])).as_deref(),
            Some("Slurm job 4242")
        );
        assert_eq!(
            cluster_of(env(&[("KUBERNETES_SERVICE_HOST", "10.0.0.1")])).as_deref(),
            Some("a Kubernetes pod")
        );
    }

    #[test]
    fn seeks_a_fix() {
        struct Fixes(usize);
        impl Judge for Fixes {
            fn judge(&mut self, against: usize, candidate: usize, _: u32) -> Call {
                let class = if against < self.0 && candidate >= self.0 {
                    VariantClass::Fixed
                } else {
                    VariantClass::NoChange
                };
                Call::Judged {
                    class,
                    numbers: None,
                }
            }
        }
        let b = bisect(&mut Fixes(4), 4, Seek::Fix, 2).expect("bisects");
        assert_eq!(found(&b), Some(4));
    }

    /// A series where commit 2 makes it worse and commit 4 fixes it (better than GOOD). The
    /// first commit that differs from GOOD is 2; the first fix is 4, past the two commits that
    /// are worse than GOOD (not yet fixed, so on GOOD's side); a regression is not what BAD
    /// is against GOOD, so seeking one is refused naming BAD's class.
    #[test]
    fn the_first_change_and_the_first_fix_of_a_series_that_regresses_then_fixes() {
        /// Each commit's state: 0 as GOOD, 1 worse (commits 2 and 3), 2 better (4 on).
        struct WorseThenFixed;
        impl Judge for WorseThenFixed {
            fn judge(&mut self, against: usize, candidate: usize, _: u32) -> Call {
                let state = |c: usize| match c {
                    0 | 1 => 0,
                    2 | 3 => 1,
                    _ => 2,
                };
                let class = match (state(against), state(candidate)) {
                    (a, b) if a == b => VariantClass::NoChange,
                    (_, 2) => VariantClass::Fixed,
                    (0, 1) => VariantClass::Regressed,
                    _ => VariantClass::Improved,
                };
                Call::Judged {
                    class,
                    numbers: None,
                }
            }
        }
        let b = bisect(&mut WorseThenFixed, 4, Seek::Change, 2).expect("bisects");
        assert_eq!(found(&b), Some(2));
        assert!(b.skipped.is_empty(), "{:?}", b.skipped);
        let b = bisect(&mut WorseThenFixed, 4, Seek::Fix, 2).expect("bisects");
        assert_eq!(found(&b), Some(4));
        assert!(b.skipped.is_empty(), "{:?}", b.skipped);
        let e = bisect(&mut WorseThenFixed, 4, Seek::Regression, 2).expect_err("BAD is fixed");
        assert_eq!(
            e,
            BisectError::NotDifferent {
                class: VariantClass::Fixed,
                seek: Seek::Regression
            }
        );
    }
}
