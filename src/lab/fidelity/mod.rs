//! `hvlab fidelity`: each kernel thread's published setup run on the model, side by side with
//! the figures the thread reports (DESIGN.md, "Fidelity").
//!
//! One file per thread. A thread module builds its published setup (profile, HZ, sizes,
//! orders, workloads) as ordinary model runs of a registered scenario ([`model_run`]), reads
//! the model's figure from the run, and judges it against the range the thread gives
//! ([`Row::judge`]). A figure the model misses stays missed: the row says why, it is never
//! tuned away. Which profile values were fitted, and on what, comes from the profiles
//! themselves (`fitted_on`), so the table cannot claim less fitting than the inputs carry.

mod pebs;
mod percpu;
mod prefetch;
mod spe;
mod srcu;

use serde::Serialize;

use crate::backend::host::HostInfo;
use crate::error::Error;
use crate::model::ModelBackend;
use crate::model::ModelError;
use crate::model::profile::{Profile, ProfileError};
use crate::record::{MetricRecord, RunRecord};
use crate::scenario::runner::{RunRequest, Silent};

/// A figure a thread publishes: the range it gives (a single value is `low == high`; "about
/// N" is read as the rounding the author used), and where.
#[derive(Debug, Clone, Serialize)]
pub struct Published {
    /// Lower end of the range the thread gives.
    pub low: f64,
    /// Upper end.
    pub high: f64,
    /// Unit of both.
    pub unit: &'static str,
    /// Who says it, where, in the thread's words (short).
    pub source: &'static str,
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
}

/// How the model's figure stands against the published one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "agreement", rename_all = "kebab-case")]
pub enum Agreement {
    /// The model's median lies in the published range.
    Within,
    /// Outside the range, for the reason given (from the thread, the kernel source or what
    /// the model leaves out).
    Outside {
        /// Why.
        why: &'static str,
    },
    /// Outside the range and nobody has said why: a defect in the model or its inputs.
    Unexplained,
}

/// One published figure against the model.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// What is compared ("first KVM_CREATE_VCPU", "pf_fixed, 6 GiB first touch").
    pub quantity: &'static str,
    /// The published setup as the model ran it.
    pub setup: String,
    /// The thread's figure.
    pub published: Published,
    /// The model's.
    pub model: ModelFigure,
    /// The verdict.
    #[serde(flatten)]
    pub agreement: Agreement,
}

impl Row {
    /// Judges `model` against `published`: within the range, or outside with `why_outside`
    /// (known in advance from the mechanism or the thread), or unexplained.
    pub fn judge(
        quantity: &'static str,
        setup: impl Into<String>,
        published: Published,
        model: ModelFigure,
        why_outside: Option<&'static str>,
    ) -> Row {
        let within = model.median >= published.low && model.median <= published.high;
        let agreement = match (within, why_outside) {
            (true, _) => Agreement::Within,
            (false, Some(why)) => Agreement::Outside { why },
            (false, None) => Agreement::Unexplained,
        };
        Row {
            quantity,
            setup: setup.into(),
            published,
            model,
            agreement,
        }
    }
}

/// A profile value that was fitted rather than sourced, and on which published result.
#[derive(Debug, Clone, Serialize)]
pub struct Fitted {
    /// The profile.
    pub profile: String,
    /// The cost key.
    pub key: String,
    /// The published result it was fitted on (no row may judge the model on that result).
    pub fitted_on: String,
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

impl ThreadReport {
    /// Rows outside their range with no reason: each is a defect to fix.
    pub fn unexplained(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| r.agreement == Agreement::Unexplained)
            .count()
    }
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
    pub scenario: &'static str,
    /// The built-in profile of the thread's host: every row runs on it.
    pub profile: &'static str,
}

/// Runs one thread on its profile, loaded once, and lists the fitted values its runs read.
pub fn report(thread: &dyn Thread, host: &HostInfo, seed: u64) -> Result<ThreadReport, Error> {
    let info = thread.info();
    let profile = profile(info.profile)?;
    let rows = thread.rows(host, &profile, seed)?;
    Ok(ThreadReport {
        id: info.id,
        title: info.title,
        scenario: info.scenario,
        rows,
        fitted: fitted_in(&[&profile]),
    })
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
/// `--set` parameters and variants, the same path `hvlab run --backend model` takes.
pub fn model_run(
    host: &HostInfo,
    scenario: &str,
    profile: &Profile,
    variants: &[&str],
    sets: &[String],
    reps: u32,
    seed: u64,
) -> Result<RunRecord, Error> {
    let mut backend = ModelBackend::new(profile.clone(), host.clone(), seed);
    let request = RunRequest {
        variants: variants.iter().map(ToString::to_string).collect(),
        sets: sets.to_vec(),
        reps,
        warmup: 0,
        seed,
    };
    let s = crate::scenario::scenario(scenario)?;
    crate::scenario::run_scenario(s, &mut backend, &request, &Silent)
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
    let host = crate::backend::host::probe_with("model".into(), Default::default());
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

    fn published(low: f64, high: f64) -> Published {
        Published {
            low,
            high,
            unit: "ms",
            source: "test",
        }
    }

    #[test]
    fn a_figure_inside_the_range_matches_and_outside_needs_a_reason() {
        let fig = |v| ModelFigure::from_values(&[v], "ms");
        let r = Row::judge("q", "s", published(20.0, 30.0), fig(25.0), Some("unused"));
        assert_eq!(r.agreement, Agreement::Within);
        let r = Row::judge("q", "s", published(20.0, 30.0), fig(16.0), Some("why"));
        assert_eq!(r.agreement, Agreement::Outside { why: "why" });
        let r = Row::judge("q", "s", published(20.0, 30.0), fig(31.0), None);
        assert_eq!(r.agreement, Agreement::Unexplained);
    }

    #[test]
    fn model_figures_report_the_median_and_range_of_what_they_got() {
        let f = ModelFigure::from_values(&[3.0, 1.0, 2.0, f64::NAN, 10.0], "x");
        assert_eq!((f.median, f.min, f.max, f.n), (2.5, 1.0, 10.0, 4));
    }

    #[test]
    fn every_thread_evaluates_and_explains_every_miss() {
        let host = crate::backend::host::probe_with("model".into(), Default::default());
        let reports = evaluate(&host, None, 1).expect("every thread runs on the model");
        assert_eq!(reports.len(), THREADS.len());
        for t in &reports {
            assert!(!t.rows.is_empty(), "thread {} has no rows", t.id);
            assert_eq!(t.unexplained(), 0, "thread {}: {:?}", t.id, t.rows);
        }
        assert!(evaluate(&host, Some("999"), 1).is_err());
    }
}
