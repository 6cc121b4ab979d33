//! `hvlab fidelity`: each kernel thread's published setup run on the model, side by side with
//! the figures the thread reports (docs/ARCHITECTURE.md, "Fidelity").
//!
//! One file per thread. A thread module builds its published setup (profile, HZ, sizes,
//! orders, workloads) as ordinary model runs of a registered scenario ([`model_run`]), reads
//! the model's figure from the run, and judges it against the range the thread gives
//! ([`Row::judge`]). A figure the model misses stays missed: the row says why, it is never
//! tuned away. Which profile values were fitted, and on what, comes from the profiles
//! themselves (`fitted_on`), so the table cannot claim less fitting than the inputs carry.

pub mod memory_patch;
pub mod patch;
mod pebs;
mod percpu;
mod prefetch;
mod spe;
pub mod srcu;

use serde::Serialize;

use crate::analysis::statistics::median;
use crate::analysis::validate::{Check, Rule, judge_in_band, spread};
use crate::lab::Error;
use crate::model::ModelBackend;
use crate::model::ModelError;
use crate::model::profile::{Profile, ProfileError};
use crate::record::{MetricRecord, RunRecord};
use crate::scenario::Params;
use crate::scenario::runner::{RunRequest, Silent};
use hvlab_core::host::HostInfo;

/// How a thread's words become a range: one rule for every row (docs/ARCHITECTURE.md, "Fidelity").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Words {
    /// An exact figure (a count the mechanism fixes): that value.
    Exact,
    /// "about X", "~X", or one sample the thread shows with no spread: X ± 25%.
    About,
    /// "less than X", "at most X": up to the bound.
    Below,
    /// "greater than X", "at least X", a sample the model must reach: from the bound up.
    Above,
    /// A range the thread states ("13% - 18%"): that range.
    Range,
    /// Several samples the thread shows: their spread, smallest to largest.
    Samples,
    /// "in the order of X": within half a decade, X/√10 to X·√10.
    OrderOf,
}

/// The half-width of "about": ±25% of the figure.
pub const ABOUT: f64 = 0.25;

/// A figure a thread publishes: the range its words give by [`Words`]' rule, and where.
#[derive(Debug, Clone, Serialize)]
pub struct Published {
    /// Lower end of the range.
    pub low: f64,
    /// Upper end.
    pub high: f64,
    /// Unit of both.
    pub unit: &'static str,
    /// Who says it, where, in the thread's words (short).
    pub source: &'static str,
    /// Which rule turned the words into the range.
    pub words: Words,
}

impl Published {
    fn new(low: f64, high: f64, words: Words, unit: &'static str, source: &'static str) -> Self {
        Published {
            low: low.min(high),
            high: high.max(low),
            unit,
            source,
            words,
        }
    }

    /// An exact figure.
    pub fn exact(x: f64, unit: &'static str, source: &'static str) -> Self {
        Self::new(x, x, Words::Exact, unit, source)
    }

    /// "about X" (or one sample with no spread shown): X ± 25%.
    pub fn about(x: f64, unit: &'static str, source: &'static str) -> Self {
        Self::new(
            x * (1.0 - ABOUT),
            x * (1.0 + ABOUT),
            Words::About,
            unit,
            source,
        )
    }

    /// "less than X".
    pub fn below(x: f64, unit: &'static str, source: &'static str) -> Self {
        Self::new(0.0, x, Words::Below, unit, source)
    }

    /// "greater than X", or a sample the model's range must reach.
    pub fn above(x: f64, unit: &'static str, source: &'static str) -> Self {
        Self::new(x, f64::INFINITY, Words::Above, unit, source)
    }

    /// A range the thread states.
    pub fn range(low: f64, high: f64, unit: &'static str, source: &'static str) -> Self {
        Self::new(low, high, Words::Range, unit, source)
    }

    /// Several samples: their spread.
    pub fn samples(values: &[f64], unit: &'static str, source: &'static str) -> Self {
        let low = values.iter().copied().fold(f64::INFINITY, f64::min);
        let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        Self::new(low, high, Words::Samples, unit, source)
    }

    /// "in the order of X": half a decade either side.
    pub fn order_of(x: f64, unit: &'static str, source: &'static str) -> Self {
        let f = 10f64.sqrt();
        Self::new(x / f, x * f, Words::OrderOf, unit, source)
    }

    /// Whether `v` lies in the range.
    pub fn admits(&self, v: f64) -> bool {
        v >= self.low && v <= self.high
    }
}

/// The model's figure for one row: the median over the repetitions or seeds the row ran, and
/// the spread.
#[derive(Debug, Clone, Serialize)]
pub struct ModelFigure {
    /// Median.
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// Samples.
    pub n: usize,
    /// Unit (the published figure's).
    pub unit: &'static str,
}

impl ModelFigure {
    /// A metric of a model run, scaled into `unit` by `scale` (e.g. 1e-3 for ns → µs).
    pub fn of(metric: &MetricRecord, scale: f64, unit: &'static str) -> ModelFigure {
        ModelFigure {
            median: metric.median * scale,
            min: metric.min * scale,
            max: metric.max * scale,
            n: metric.n,
            unit,
        }
    }

    /// Figures computed directly (a ratio of two medians, a count): median, min and max of
    /// the values given.
    pub fn from_values(values: &[f64], unit: &'static str) -> ModelFigure {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        v.sort_by(f64::total_cmp);
        ModelFigure {
            median: crate::analysis::statistics::median(&v),
            min: v.first().copied().unwrap_or(f64::NAN),
            max: v.last().copied().unwrap_or(f64::NAN),
            n: v.len(),
            unit,
        }
    }

    /// Whether two figures differ (a row moved when an input did).
    fn differs(&self, other: &ModelFigure) -> bool {
        let moved = |a: f64, b: f64| {
            let scale = a.abs().max(b.abs()).max(1e-12);
            (a - b).abs() / scale > 1e-9
        };
        moved(self.median, other.median) || moved(self.min, other.min) || moved(self.max, other.max)
    }
}

/// How the model's figure stands against the published one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "agreement", rename_all = "kebab-case")]
pub enum Agreement {
    /// The model's median lies in the published range.
    Within,
    /// Outside the range: a miss, whatever the row's note says.
    Outside,
    /// The row moves with a profile value fitted on a figure of the same experiment: it
    /// re-shows the fit, so it is shown apart and not counted as a test.
    Fitted {
        /// The profile key.
        key: String,
        /// The published figure it was fitted on.
        on: String,
    },
}

/// One published figure against the model.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What is compared ("first KVM_CREATE_VCPU", "pf_fixed, 6 GiB first touch").
    pub quantity: &'static str,
    /// The thread's experiment the figure comes from (`thread/setup`): rows of one experiment
    /// share its machine and runs, so a value fitted on one of its figures re-shows in the
    /// others that move with it.
    pub experiment: &'static str,
    /// The published setup as the model ran it.
    pub setup: String,
    /// The thread's figure.
    pub published: Published,
    /// The model's.
    pub model: ModelFigure,
    /// The verdict.
    #[serde(flatten)]
    pub agreement: Agreement,
    /// Commentary: what the model leaves out, why it lands where it does. Never a verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'static str>,
    /// The profile values the row moves with (each perturbed ±10%).
    pub moves_with: Vec<String>,
}

impl Row {
    /// Judges `model` against `published`: within the range or outside it; `note` is
    /// commentary shown beside the verdict and never changes it.
    pub fn judge(
        quantity: &'static str,
        setup: impl Into<String>,
        published: Published,
        model: ModelFigure,
        note: Option<&'static str>,
    ) -> Row {
        let agreement = if published.admits(model.median) {
            Agreement::Within
        } else {
            Agreement::Outside
        };
        Row {
            quantity,
            experiment: quantity,
            setup: setup.into(),
            published,
            model,
            agreement,
            note,
            moves_with: Vec::new(),
        }
    }

    /// The experiment the figure comes from (by default each row is its own).
    #[must_use]
    pub fn of(mut self, experiment: &'static str) -> Row {
        self.experiment = experiment;
        self
    }
}

/// A profile value that was fitted rather than sourced, and on which published result.
#[derive(Debug, Clone, Serialize)]
pub struct Fitted {
    /// The profile.
    pub profile: String,
    /// The cost key.
    pub key: String,
    /// The published result it was fitted on.
    pub fitted_on: String,
    /// The experiment of that result, whose rows moving with the value are `fitted`.
    pub experiment: Option<String>,
}

/// One thread's table.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadReport {
    /// The seed file's number (`000` … `004`).
    pub id: &'static str,
    /// The mechanism and the thread's subject, short.
    pub title: &'static str,
    /// The scenario that reproduces it.
    pub scenario: &'static str,
    /// Every published figure against the model.
    pub rows: Vec<Row>,
    /// Profile values fitted on published results (from the profiles used).
    pub fitted: Vec<Fitted>,
}

/// A table of rows each with an [`Agreement`]: every fidelity table (a thread's, a patch's
/// prediction, the memory rows) counts its rows the same way.
pub trait Judged {
    /// Each row's agreement.
    fn agreements(&self) -> impl Iterator<Item = &Agreement>;

    /// Rows within.
    fn within(&self) -> usize {
        self.agreements()
            .filter(|a| **a == Agreement::Within)
            .count()
    }

    /// Rows outside: each a miss of the model.
    fn outside(&self) -> usize {
        self.agreements()
            .filter(|a| **a == Agreement::Outside)
            .count()
    }

    /// Rows that re-show a fitted value: shown apart, not tests.
    fn fitted_rows(&self) -> usize {
        self.agreements()
            .filter(|a| matches!(a, Agreement::Fitted { .. }))
            .count()
    }

    /// Rows judged (within or outside): the fitted ones are not tests.
    fn judged(&self) -> usize {
        self.agreements().count() - self.fitted_rows()
    }
}

impl Judged for ThreadReport {
    fn agreements(&self) -> impl Iterator<Item = &Agreement> {
        self.rows.iter().map(|r| &r.agreement)
    }
}

/// The model's `predicted` figure of `metric` against the kernel's samples of it: judged by
/// `rule` within their spread (10th to 90th percentile) about their median.
pub fn judge_against_samples(
    scenario: &str,
    variant: &str,
    metric: &str,
    unit: &str,
    predicted: f64,
    kernel: &[f64],
    rule: Rule,
) -> Check {
    let measured = median(kernel);
    judge_in_band(
        scenario,
        variant,
        metric,
        unit,
        predicted,
        measured,
        spread(kernel, measured),
        rule,
    )
}

/// A thread the model is judged against.
pub trait Thread: Sync {
    /// What the thread is.
    fn info(&self) -> &'static ThreadInfo;
    /// Runs the thread's published setups on `profile` and judges each figure.
    fn rows(&self, host: &HostInfo, profile: &Profile, seed: u64) -> Result<Vec<Row>, Error>;
}

/// What a thread is, and where the model reproduces it.
#[derive(Debug)]
pub struct ThreadInfo {
    /// The seed file's number.
    pub id: &'static str,
    /// The mechanism and the thread's subject, short.
    pub title: &'static str,
    /// The scenario that reproduces it.
    pub scenario: crate::scenario::Kind,
    /// The built-in profile of the thread's host: every row runs on it.
    pub profile: &'static str,
}

/// Runs one thread on its profile, loaded once, finds what each row moves with, and marks
/// the rows that re-show a fitted value.
pub fn report(thread: &dyn Thread, host: &HostInfo, seed: u64) -> Result<ThreadReport, Error> {
    let info = thread.info();
    let profile = profile(info.profile)?;
    let mut rows = thread.rows(host, &profile, seed)?;
    perturb(thread, host, &profile, seed, &mut rows)?;
    let fitted = fitted_in(&[&profile]);
    mark_fitted(&mut rows, &fitted);
    Ok(ThreadReport {
        id: info.id,
        title: info.title,
        scenario: info.scenario.name(),
        rows,
        fitted,
    })
}

/// How far each profile value is moved to see which rows follow it.
pub const PERTURBATION: f64 = 0.10;

/// Perturbs every profile value the rows read by ±[`PERTURBATION`], reruns the rows, and
/// records on each row the keys it moved with. A value of 0 cannot move and flags (unit
/// `bool`) are not quantities; both are left alone.
pub fn perturb(
    thread: &dyn Thread,
    host: &HostInfo,
    profile: &Profile,
    seed: u64,
    rows: &mut [Row],
) -> Result<(), Error> {
    let read = profile.keys_read();
    for key in &read {
        let Some(cost) = profile.costs.get(key) else {
            continue;
        };
        if cost.value == 0.0 || cost.unit == "bool" {
            continue;
        }
        for factor in [1.0 - PERTURBATION, 1.0 + PERTURBATION] {
            let mut moved = profile.clone();
            if let Some(c) = moved.costs.get_mut(key) {
                c.value = cost.value * factor;
            }
            let again = thread.rows(host, &moved, seed)?;
            for (row, other) in rows.iter_mut().zip(&again) {
                if row.model.differs(&other.model) && !row.moves_with.contains(key) {
                    row.moves_with.push(key.clone());
                }
            }
        }
    }
    Ok(())
}

/// The rule: a row that moves with a value fitted on a figure of the row's own experiment
/// re-shows the fit; it becomes `fitted` (shown apart, not counted).
pub fn mark_fitted(rows: &mut [Row], fitted: &[Fitted]) {
    for row in rows {
        if let Some(f) = fitted.iter().find(|f| {
            f.experiment.as_deref() == Some(row.experiment) && row.moves_with.contains(&f.key)
        }) {
            row.agreement = Agreement::Fitted {
                key: format!("{}.{}", f.profile, f.key),
                on: f.fitted_on.clone(),
            };
        }
    }
}

/// Every thread, in seed order.
pub static THREADS: &[&dyn Thread] = &[
    &spe::Spe,
    &srcu::Srcu,
    &percpu::Percpu,
    &pebs::Pebs,
    &prefetch::Prefetch,
];

/// Evaluates every thread (or only `only`, by id), in seed order.
pub fn evaluate(
    host: &HostInfo,
    only: Option<&str>,
    seed: u64,
) -> Result<Vec<ThreadReport>, Error> {
    if let Some(id) = only
        && !THREADS.iter().any(|t| t.info().id == id)
    {
        let known: Vec<&str> = THREADS.iter().map(|t| t.info().id).collect();
        return Err(crate::error::InputError::BadValue {
            key: "--thread".into(),
            value: id.into(),
            why: format!("no such thread; known: {}", known.join(", ")),
        }
        .into());
    }
    THREADS
        .iter()
        .filter(|t| only.is_none_or(|id| t.info().id == id))
        .map(|t| report(*t, host, seed))
        .collect()
}

/// Runs a registered scenario on the model with a built-in profile: the published setup as
/// the scenario's parameters (which say the scenario) and variants, the same path
/// `hvlab run --backend model` takes.
pub fn model_run(
    host: &HostInfo,
    params: impl Into<Params>,
    profile: &Profile,
    variants: &[&str],
    reps: u32,
    seed: u64,
) -> Result<RunRecord, Error> {
    let mut backend = ModelBackend::new(profile.clone(), host.clone(), seed);
    let request = RunRequest {
        params: params.into(),
        variants: variants.iter().map(ToString::to_string).collect(),
        reps,
        warmup: 0,
        seed,
    };
    Ok(crate::scenario::run(&mut backend, &request, &Silent)?)
}

/// Loads a built-in profile for a thread's setup.
pub fn profile(name: &str) -> Result<Profile, Error> {
    Profile::load(name).map_err(|e: ProfileError| ModelError::from(e).into())
}

/// The fitted values behind a thread's rows: those of the profiles it used that its model runs
/// read (a profile describes a whole machine; values fitted for another thread's mechanism
/// do not touch these rows).
pub fn fitted_in(profiles: &[&Profile]) -> Vec<Fitted> {
    profiles
        .iter()
        .flat_map(|p| {
            let read = p.keys_read();
            p.costs
                .iter()
                .filter(move |(key, _)| read.contains(*key))
                .filter_map(|(key, cost)| {
                    cost.fitted_on.as_ref().map(|on| Fitted {
                        profile: p.name.clone(),
                        key: key.clone(),
                        fitted_on: on.clone(),
                        experiment: cost.fitted_experiment.clone(),
                    })
                })
        })
        .collect()
}

/// A metric of a variant of a model run, or an error naming what is missing (a scenario
/// that stopped reporting it is a defect the table must show, not hide).
pub fn metric<'a>(
    run: &'a RunRecord,
    variant: &str,
    metric: &str,
) -> Result<&'a MetricRecord, Error> {
    run.variant(variant)
        .and_then(|v| v.metrics.get(metric))
        .ok_or_else(|| {
            Error::Fidelity(format!(
                "the model run of {} has no metric {metric} for variant {variant}",
                run.scenario
            ))
        })
}

/// Fails when the provenance of one of `keys` in `profile` cites one of `figures`: a row
/// must not be judged on a figure its inputs were taken from.
#[cfg(test)]
pub(crate) fn assert_no_provenance_cites<'k>(
    profile: &Profile,
    keys: impl IntoIterator<Item = &'k str>,
    figures: &[&str],
) {
    for key in keys {
        let Some(cost) = profile.costs.get(key) else {
            continue;
        };
        // A fitted value names its figure by design; the perturbation finds the rows it
        // reaches (`mark_fitted`).
        if cost.fitted_on.is_some() {
            continue;
        }
        for figure in figures {
            assert!(
                !cost.provenance.contains(figure),
                "{key} cites {figure}: {}",
                cost.provenance
            );
        }
    }
}

/// Runs `thread`'s rows on its profile and fails when the provenance of a value they read
/// cites one of `figures`; the profile comes back with the keys it read.
#[cfg(test)]
pub(crate) fn assert_read_inputs_cite_none(thread: &dyn Thread, figures: &[&str]) -> Profile {
    let host = hvlab_host::probe::probe_with("model".into(), Default::default());
    let profile = profile(thread.info().profile).expect("a built-in profile");
    thread.rows(&host, &profile, 1).expect("the thread's rows");
    // Only the values the rows' runs read: the profile also describes other mechanisms, whose
    // provenance is not an input to these rows.
    let read = profile.keys_read();
    assert!(!read.is_empty());
    assert_no_provenance_cites(&profile, read.iter().map(String::as_str), figures);
    profile
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(v: f64) -> ModelFigure {
        ModelFigure::from_values(&[v], "ms")
    }

    #[test]
    fn a_note_never_turns_a_miss_into_a_pass() {
        let p = Published::range(20.0, 30.0, "ms", "test");
        let r = Row::judge("q", "s", p.clone(), fig(25.0), Some("unused"));
        assert_eq!(r.agreement, Agreement::Within);
        let r = Row::judge("q", "s", p.clone(), fig(16.0), Some("a good reason"));
        assert_eq!(r.agreement, Agreement::Outside);
        let r = Row::judge("q", "s", p, fig(31.0), None);
        assert_eq!(r.agreement, Agreement::Outside);
    }

    #[test]
    fn the_words_rule_gives_the_ranges_design_md_states() {
        let about = Published::about(1.0, "ms", "t");
        assert_eq!((about.low, about.high), (0.75, 1.25));
        let neg = Published::about(-8.0, "%", "t");
        assert_eq!((neg.low, neg.high), (-10.0, -6.0));
        let below = Published::below(0.5, "s", "t");
        assert!(below.admits(0.0) && below.admits(0.5) && !below.admits(0.51));
        let above = Published::above(25.182, "ms", "t");
        assert!(above.admits(1e9) && !above.admits(25.0));
        let order = Published::order_of(1.0, "ms", "t");
        assert!(order.admits(3.1) && !order.admits(3.2) && order.admits(0.32));
        let samples = Published::samples(&[0.031, 0.046], "ms", "t");
        assert_eq!((samples.low, samples.high), (0.031, 0.046));
    }

    #[test]
    fn model_figures_report_the_median_and_range_of_what_they_got() {
        let f = ModelFigure::from_values(&[3.0, 1.0, 2.0, f64::NAN, 10.0], "x");
        assert_eq!((f.median, f.min, f.max, f.n), (2.5, 1.0, 10.0, 4));
    }

    /// A thread whose rows read two profile values: `a` (fitted on experiment "e/1") and `b`.
    struct Toy;

    impl Thread for Toy {
        fn info(&self) -> &'static ThreadInfo {
            &ThreadInfo {
                id: "t",
                title: "toy",
                scenario: crate::scenario::Kind::Exits,
                profile: "intel-spr-vmx",
            }
        }

        fn rows(&self, _: &HostInfo, p: &Profile, _: u64) -> Result<Vec<Row>, Error> {
            let a = p.get("wrmsr_cycles", "toy").map_err(ModelError::from)?;
            let b = p
                .get("msr_load_entry_cycles", "toy")
                .map_err(ModelError::from)?;
            let pb = || Published::below(1e9, "cycles", "t");
            let v = |x| ModelFigure::from_values(&[x], "cycles");
            Ok(vec![
                Row::judge("same experiment, moves with a", "s", pb(), v(a + b), None).of("e/1"),
                Row::judge("same experiment, only b", "s", pb(), v(b), None).of("e/1"),
                Row::judge("other experiment, moves with a", "s", pb(), v(a), None).of("e/2"),
            ])
        }
    }

    #[test]
    fn a_row_moving_with_a_value_fitted_in_its_own_experiment_is_fitted_and_no_other() {
        let host = hvlab_host::probe::probe_with("model".into(), Default::default());
        let p = profile("intel-spr-vmx").expect("built-in");
        let mut rows = Toy.rows(&host, &p, 1).expect("toy rows");
        perturb(&Toy, &host, &p, 1, &mut rows).expect("perturbation");
        assert!(rows[0].moves_with.contains(&"wrmsr_cycles".to_string()));
        assert_eq!(
            rows[1].moves_with,
            vec!["msr_load_entry_cycles".to_string()]
        );
        let fitted = [Fitted {
            profile: "p".into(),
            key: "wrmsr_cycles".into(),
            fitted_on: "F".into(),
            experiment: Some("e/1".into()),
        }];
        mark_fitted(&mut rows, &fitted);
        assert!(matches!(rows[0].agreement, Agreement::Fitted { .. }));
        assert_eq!(rows[1].agreement, Agreement::Within);
        assert_eq!(rows[2].agreement, Agreement::Within);
    }

    fn reports() -> Vec<ThreadReport> {
        let host = hvlab_host::probe::probe_with("model".into(), Default::default());
        evaluate(&host, None, 1).expect("every thread runs on the model")
    }

    fn row<'a>(reports: &'a [ThreadReport], id: &str, quantity: &str) -> &'a Row {
        reports
            .iter()
            .find(|t| t.id == id)
            .and_then(|t| t.rows.iter().find(|r| r.quantity.contains(quantity)))
            .unwrap_or_else(|| panic!("thread {id} has no row {quantity}"))
    }

    #[test]
    fn every_row_is_within_outside_or_fitted_by_its_range_alone() {
        let reports = reports();
        assert_eq!(reports.len(), THREADS.len());
        for t in &reports {
            assert!(!t.rows.is_empty(), "thread {} has no rows", t.id);
            assert_eq!(t.judged(), t.within() + t.outside());
            for r in &t.rows {
                let inside = r.published.admits(r.model.median);
                match &r.agreement {
                    Agreement::Within => assert!(inside, "{r:#?}"),
                    Agreement::Outside => assert!(!inside, "{r:#?}"),
                    Agreement::Fitted { key, .. } => {
                        assert!(
                            r.moves_with.iter().any(|k| key.ends_with(k.as_str())),
                            "{r:#?}"
                        );
                    }
                }
            }
        }
        assert!(
            evaluate(
                &hvlab_host::probe::probe_with("model".into(), Default::default()),
                Some("999"),
                1
            )
            .is_err()
        );
    }

    /// The perturbation finds the rows that re-show a fitted value: 000's 20 s
    /// and 0.2 s (fitted on the 4 s of the same runs), 003's ~900 cycles after the series
    /// (the fastpath base fitted on ~860), 002's kernel-build sys time (the forwarding stall
    /// fitted on mmapfork, a benchmark of the same cover letter).
    #[test]
    fn the_perturbation_finds_the_rows_that_reshow_a_fitted_value() {
        let reports = reports();
        for (id, quantity) in [
            ("000", "perf record ... true, kernel with lockdep"),
            ("000", "one pin + unpin of 256 MiB"),
            ("003", "fastpath roundtrip after the series, host PEBS"),
            ("002", "kernel build: sys time"),
        ] {
            let r = row(&reports, id, quantity);
            assert!(matches!(r.agreement, Agreement::Fitted { .. }), "{r:#?}");
        }
        // A row of another experiment that reads no fitted value stays a test.
        let r = row(&reports, "000", "without pinning");
        assert!(!matches!(r.agreement, Agreement::Fitted { .. }), "{r:#?}");
        let fitted: usize = reports.iter().map(ThreadReport::fitted_rows).sum();
        assert!(fitted >= 4, "{fitted}");
    }
}
