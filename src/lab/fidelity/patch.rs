//! Predictions of patches: the model against a patched kernel (docs/ARCHITECTURE.md, "Fidelity"
//! and "Kernels under test").
//!
//! A stored kab (`hvlab kab A B`) of a change the model knows (one of its registration
//! strategies: declared with `kab --model-strategy`, or recognised from the patch's sha256)
//! gives runs of the same kernel version with and without the change. The model runs each
//! side's setup with the side's strategy, priced by a profile calibrated inside a guest of
//! the *base* kernel under the same accelerator, and is compared with what the kernel did,
//! variant by variant: the stall count exactly, the stalled ioctl's length in jiffies within
//! the kernel side's own spread plus the tolerance, and which ioctl waited for whose grace
//! period. Nothing is fitted on the patched runs: the base's calibration reads no lifecycle
//! stall, and the patched kernel is never calibrated (calibrate's formulas take the stock
//! kernel's registration as the ioctl's own work; on a patched kernel they would price the
//! patch's own grace periods into the costs the prediction is made from).
//!
//! Under TCG only jiffies and counts are judged: a grace period is whole ticks of the guest's
//! clock, which the emulator stretches but does not invent; a sub-jiffy time is the
//! emulator's.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::Serialize;

use super::{Agreement, Fitted, Judged, judge_against_samples};
use crate::analysis::statistics::median;
use crate::analysis::validate::{Check, Rule};
use crate::kernel::calibration::{self, Identity};
use crate::lab::Error;
use crate::model::profile::Profile;
use crate::record::pooled;
use crate::record::{Finding, RunRecord};
use crate::scenario::lifecycle::strategy_name;
use crate::scenario::{Kind, Params};
use crate::store::Store;
use hvlab_core::BackendKind;
use hvlab_core::host::{PatchId, UnderTest};
use hvlab_core::ioctl_table::{BusRegistration, SrcuKernel};
use hvlab_core::lifecycle::Strategy;

/// What the rows are, beside the threads' `within` / `outside` / `fitted`.
pub const KIND: &str = "prediction of a patch";

/// The tolerance on a stall's length, percent beyond the kernel side's own spread: that of
/// `hvlab validate`.
pub const TOLERANCE_PCT: f64 = 15.0;

/// The thread whose mechanism every registration strategy belongs to.
pub const THREAD: &str = "001";

/// Every strategy, for reading a name back.
const STRATEGIES: [Strategy; 3] = [
    Strategy::AlwaysDefer,
    Strategy::AlwaysSync,
    Strategy::LifecycleKeyed,
];

/// The strategy `--set strategy=` and `kab --model-strategy` call `name`.
pub fn strategy_named(name: &str) -> Option<Strategy> {
    STRATEGIES.into_iter().find(|s| strategy_name(*s) == name)
}

/// A real kernel change the model knows as one of its strategies, by the patch's content.
#[derive(Debug)]
pub struct KnownChange {
    /// The sha256 of the patch file.
    pub sha256: &'static str,
    /// Its file name (as in `tests/patches/`).
    pub file: &'static str,
    /// The strategy it makes `kvm_io_bus_register_dev()` follow.
    pub strategy: Strategy,
    /// What it is.
    pub what: &'static str,
}

/// The changes recognised from their hash.
pub static KNOWN_CHANGES: [KnownChange; 2] = [
    KnownChange {
        sha256: "b7e5481bf6ae2b65ea06ce6ba26fcb906c5d4d3d5eeb7267e7ac73b275434bda",
        file: "001-lifecycle-keyed.patch",
        strategy: Strategy::LifecycleKeyed,
        what: "Sean Christopherson's fix in thread 001: synchronize_srcu_expedited() while kvm->created_vcpus is 0, call_srcu() afterwards",
    },
    KnownChange {
        sha256: "b1d7fbe231fbf3eabd16e01ec7ba4f7f842d9d5d14243f36e2405169c6d87fa8",
        file: "001-sync-on-register.patch",
        strategy: Strategy::AlwaysSync,
        what: "kvm_io_bus_register_dev() as before 7d9a0273: always synchronize_srcu_expedited(), never defer",
    },
];

/// The strategy the model runs for one side of a kab, and why that one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StrategyChoice {
    /// Its name (`always-defer`, `always-sync`, `lifecycle-keyed`).
    pub name: &'static str,
    /// Where it comes from: the kernel's version, the user's declaration, the patch's hash.
    pub from: String,
}

impl StrategyChoice {
    /// The strategy itself.
    pub fn strategy(&self) -> Strategy {
        strategy_named(self.name).unwrap_or(Strategy::AlwaysDefer)
    }
}

/// The strategy of a kernel built from `release` with `patches` (file, sha256), and the one
/// the user declared for its change, or why the model does not know the kernel.
pub fn strategy_for(
    release: &str,
    patches: &[(String, String)],
    declared: Option<&str>,
) -> Result<StrategyChoice, String> {
    if let Some(name) = declared {
        let strategy = strategy_named(name).ok_or_else(|| {
            format!("the declared strategy {name} is not one of the model's (always-defer, always-sync, lifecycle-keyed)")
        })?;
        return Ok(StrategyChoice {
            name: strategy_name(strategy),
            from: "declared with kab --model-strategy".into(),
        });
    }
    match patches {
        [] => {
            // The kernel's own registration scheme, from its version (hvlab's kernel table).
            let strategy = match SrcuKernel::of(release, false).registration {
                BusRegistration::Defers => Strategy::AlwaysDefer,
                BusRegistration::Synchronizes => Strategy::AlwaysSync,
            };
            let code = match strategy {
                Strategy::AlwaysSync => "synchronize_srcu_expedited() in kvm_io_bus_register_dev(), before 6.18",
                _ => "call_srcu() in kvm_io_bus_register_dev(), Linux 6.18 to 7.3",
            };
            Ok(StrategyChoice {
                name: strategy_name(strategy),
                from: format!("the stock kernel {release}: {code}"),
            })
        }
        [(file, sha256)] => KNOWN_CHANGES
            .iter()
            .find(|k| k.sha256 == sha256)
            .map(|k| StrategyChoice {
                name: strategy_name(k.strategy),
                from: format!("recognised from the sha256 of {file} ({}): {}", k.file, k.what),
            })
            .ok_or_else(|| {
                format!(
                    "{file} (sha256 {}) is not a change the model knows; declare its strategy with kab --model-strategy",
                    &sha256[..sha256.len().min(16)]
                )
            }),
        more => Err(format!(
            "{} patches together are not a change the model knows; declare their strategy with kab --model-strategy",
            more.len()
        )),
    }
}

/// The strategy of a stored run's kernel under test.
fn strategy_of_run(under_test: &UnderTest) -> Result<StrategyChoice, String> {
    let kab = under_test.kab.as_ref();
    let patches: Vec<(String, String)> = kab
        .map(|k| {
            k.patches
                .iter()
                .map(|p| (p.file.clone(), p.sha256.clone()))
                .collect()
        })
        .unwrap_or_default();
    strategy_for(
        &under_test.release,
        &patches,
        kab.and_then(|k| k.model_strategy.as_deref()),
    )
}

/// A kab side's change in words: `none (stock)`, or its patches, each as `name` words it,
/// joined by ` + `.
pub(crate) fn change_words(patches: &[PatchId], name: impl Fn(&PatchId) -> String) -> String {
    if patches.is_empty() {
        return "none (stock)".to_string();
    }
    patches.iter().map(name).collect::<Vec<_>>().join(" + ")
}

/// An ioctl that waited for the grace period another one started.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Wait {
    /// The ioctl that waited.
    pub ioctl: String,
    /// The registration whose grace period it waited for.
    pub on: String,
}

/// One variant, the model against the kernel.
#[derive(Debug, Clone, Serialize)]
pub struct PatchRow {
    /// The variant (construction order).
    pub variant: String,
    /// Stalls per VM built, median over the repetitions: exact.
    pub stalls: Check,
    /// Repetitions with a stall: the model's and the kernel's (stalled, of).
    pub stalled_reps: [[usize; 2]; 2],
    /// Each stalled ioctl's time in jiffies (where either side stalled): the model's median
    /// within the kernel's spread (10th to 90th percentile) widened by the tolerance.
    pub jiffies: Vec<Check>,
    /// Where the builds started against the tick, ms after it (medians), the model's and the
    /// kernel's: what places a registration before or after a tick, shown beside a length
    /// that misses (commentary, never a verdict).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tick_phase_ms: Option<[f64; 2]>,
    /// Which ioctl waited for whose grace period: the model's.
    pub model_waits: Vec<Wait>,
    /// The kernel's (in any of its runs).
    pub kernel_waits: Vec<Wait>,
    /// The verdict: within when the count, every length and the waits agree.
    #[serde(flatten)]
    pub agreement: Agreement,
}

/// One kernel of a kab (stock or patched) against the model running its strategy.
#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    /// [`KIND`].
    pub kind: &'static str,
    /// The thread the mechanism comes from.
    pub thread: &'static str,
    /// `uname -r`.
    pub release: String,
    /// The spec as given to kab.
    pub spec: String,
    /// The change: `none (stock)` or the patches.
    pub change: String,
    /// The strategy the model ran, and why.
    pub strategy: StrategyChoice,
    /// `tcg` or `kvm`.
    pub accel: String,
    /// The calibrated profile's name.
    pub profile: String,
    /// Its file.
    pub profile_path: PathBuf,
    /// The kab(s) whose runs these are.
    pub kabs: Vec<String>,
    /// The kernel's runs compared.
    pub runs: Vec<String>,
    /// Repetitions per variant: the model's, the kernel's.
    pub reps: [usize; 2],
    /// Profile values read that were fitted on a published figure: none expected; when there
    /// is one, every row shows it as fitted.
    pub fitted: Vec<Fitted>,
    /// Variant by variant.
    pub rows: Vec<PatchRow>,
}

impl Judged for Prediction {
    fn agreements(&self) -> impl Iterator<Item = &Agreement> {
        self.rows.iter().map(|r| &r.agreement)
    }
}

/// A stored kab (or one side of it) no prediction was made for, and why.
#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// The kab's id.
    pub kab: String,
    /// Which side, when only one.
    pub side: Option<String>,
    /// Why.
    pub why: String,
}

/// Every prediction of a patch the store allows.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PatchReport {
    /// One per kernel (stock or patched) and strategy.
    pub predictions: Vec<Prediction>,
    /// The stored kabs left out, with the reason.
    pub skipped: Vec<Skipped>,
}

/// Over every prediction.
impl Judged for PatchReport {
    fn agreements(&self) -> impl Iterator<Item = &Agreement> {
        self.predictions.iter().flat_map(Judged::agreements)
    }
}

/// The SRCU waits `runs` found in `variant`.
pub fn waits(runs: &[&RunRecord], variant: &str) -> BTreeSet<Wait> {
    runs.iter()
        .filter_map(|r| r.variant(variant))
        .flat_map(|v| &v.findings)
        .filter_map(|f| match f {
            Finding::SrcuStall {
                ioctl,
                caused_by: Some(on),
                ..
            } => Some(Wait {
                ioctl: ioctl.clone(),
                on: on.clone(),
            }),
            _ => None,
        })
        .collect()
}

/// A jiffy of the kernel `runs` ran on, ms.
pub fn jiffy_ms(runs: &[&RunRecord]) -> f64 {
    1e3 / f64::from(runs.first().map_or(250, |r| r.host.hz.max(1)))
}

/// One variant's row, or `None` when the kernel's runs lack its stall count.
fn row(
    variant: &str,
    model: &RunRecord,
    kernel: &[&RunRecord],
    tolerance: f64,
) -> Option<PatchRow> {
    let model_runs = [model];
    let (ks, ms) = (
        pooled(kernel, variant, "stalls"),
        pooled(&model_runs, variant, "stalls"),
    );
    if ks.is_empty() || ms.is_empty() {
        return None;
    }
    let scenario = Kind::Lifecycle.name();
    let stalls = judge_against_samples(
        scenario,
        variant,
        "stalls",
        "count",
        median(&ms),
        &ks,
        Rule::Exact(0.0),
    );
    let stalled = |x: &[f64]| [x.iter().filter(|v| **v > 0.0).count(), x.len()];
    let (model_waits, kernel_waits) = (waits(&model_runs, variant), waits(kernel, variant));
    // The ioctls either side stalled on: their length is a number of ticks, judged in jiffies.
    let stalled_ioctls: BTreeSet<&str> = model_waits
        .iter()
        .chain(&kernel_waits)
        .map(|w| w.ioctl.as_str())
        .collect();
    let (kj, mj) = (jiffy_ms(kernel), jiffy_ms(&model_runs));
    let jiffies: Vec<Check> = stalled_ioctls
        .iter()
        .filter_map(|ioctl| {
            let metric = format!("ioctl.{ioctl}_ms");
            let k: Vec<f64> = pooled(kernel, variant, &metric)
                .iter()
                .map(|x| x / kj)
                .collect();
            let m: Vec<f64> = pooled(&model_runs, variant, &metric)
                .iter()
                .map(|x| x / mj)
                .collect();
            if k.is_empty() || m.is_empty() {
                return None;
            }
            Some(judge_against_samples(
                scenario,
                variant,
                &format!("ioctl.{ioctl}"),
                "jiffies",
                median(&m),
                &k,
                Rule::Within(tolerance),
            ))
        })
        .collect();
    let agree = stalls.pass && jiffies.iter().all(|c| c.pass) && model_waits == kernel_waits;
    let phase = |runs: &[&RunRecord]| {
        let x = pooled(runs, variant, "tick_phase_ms");
        (!x.is_empty()).then(|| median(&x))
    };
    Some(PatchRow {
        variant: variant.to_string(),
        stalled_reps: [stalled(&ms), stalled(&ks)],
        stalls,
        jiffies,
        tick_phase_ms: phase(&model_runs).zip(phase(kernel)).map(|(m, k)| [m, k]),
        model_waits: model_waits.into_iter().collect(),
        kernel_waits: kernel_waits.into_iter().collect(),
        agreement: if agree {
            Agreement::Within
        } else {
            Agreement::Outside
        },
    })
}

/// The model's run of the kernel runs' setup (their parameters and variants, as many
/// repetitions as the kernel side pooled) with `strategy`, on the kernel's host (its HZ and
/// flavour), priced by `profile`.
pub fn model_of(
    kernel: &[&RunRecord],
    strategy: Strategy,
    profile: &Profile,
    seed: u64,
) -> Result<RunRecord, Error> {
    let first = kernel
        .first()
        .ok_or_else(|| Error::Fidelity("a prediction of a patch needs the kernel's runs".into()))?;
    // The scenario's own parameters (the record also keeps the run's: reps, warm-up, seed).
    let known = Kind::Lifecycle.param_infos();
    let sets: Vec<String> = first
        .params
        .iter()
        .filter(|(k, _)| known.iter().any(|p| p.name == k.as_str()))
        .filter_map(|(k, v)| {
            let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            (!text.is_empty()).then(|| format!("{k}={text}"))
        })
        .collect();
    let Params::Lifecycle(mut params) =
        Kind::Lifecycle.parse(&sets, BackendKind::Model.capabilities())?
    else {
        return Err(Error::Fidelity(
            "the lifecycle scenario's parameters are not its own".into(),
        ));
    };
    params.strategy = strategy;
    let variants: Vec<&str> = first
        .variants
        .iter()
        .filter(|v| v.is_ok())
        .map(|v| v.name.as_str())
        .collect();
    let reps = variants
        .iter()
        .map(|v| pooled(kernel, v, "stalls").len())
        .max()
        .unwrap_or(0)
        .max(1);
    super::model_run(
        &first.host,
        params,
        profile,
        &variants,
        u32::try_from(reps).unwrap_or(u32::MAX),
        seed,
    )
}

/// The model with `strategy` against the kernel's runs, variant by variant, and the model's
/// run.
pub fn compare(
    kernel: &[&RunRecord],
    strategy: Strategy,
    profile: &Profile,
    tolerance: f64,
    seed: u64,
) -> Result<(RunRecord, Vec<PatchRow>), Error> {
    let model = model_of(kernel, strategy, profile, seed)?;
    let rows = model
        .variants
        .iter()
        .filter_map(|v| row(&v.name, &model, kernel, tolerance))
        .collect();
    Ok((model, rows))
}

/// A kernel's runs that a prediction can judge: the user's kvm runs of `lifecycle` booted by
/// a kab.
fn kab_side(run: &RunRecord) -> Option<&hvlab_core::host::KabSide> {
    (run.backend == BackendKind::Kvm
        && Kind::of_run(run) == Some(Kind::Lifecycle)
        && run.tag.is_none())
    .then_some(())?;
    run.host.under_test.as_ref()?.kab.as_ref()
}

/// How the calibrated profile of a kernel is found.
pub type Calibrations<'a> = dyn Fn(&Identity) -> Result<Option<(PathBuf, Profile)>, String> + 'a;

/// One kernel and strategy, with the runs of every kab that booted it.
struct Set<'a> {
    under_test: &'a UnderTest,
    strategy: StrategyChoice,
    profile: (PathBuf, Profile),
    kabs: Vec<String>,
    runs: Vec<&'a RunRecord>,
}

/// Every prediction of a patch `runs` (a store's) allow: each stored kab's sides grouped by
/// kernel and strategy, the model priced by the calibration of the kab's base kernel.
pub fn from_runs(
    runs: &[RunRecord],
    calibrations: &Calibrations<'_>,
    tolerance: f64,
    seed: u64,
) -> Result<PatchReport, Error> {
    let mut report = PatchReport::default();
    let mut sets: Vec<Set<'_>> = Vec::new();
    for (id, sides) in &kab_sides(runs) {
        let profile = match base_profile(sides, calibrations) {
            Ok(Some(profile)) => profile,
            Ok(None) => continue,
            Err(why) => {
                report.skipped.push(Skipped::of(id, None, why));
                continue;
            }
        };
        for (side, name) in sides.iter().zip(["A", "B"]) {
            let Some(under_test) = side.first().and_then(|r| r.host.under_test.as_ref()) else {
                continue;
            };
            match strategy_of_run(under_test) {
                Ok(strategy) => Set::add(&mut sets, id, under_test, strategy, &profile, side),
                Err(why) => report.skipped.push(Skipped::of(id, Some(name), why)),
            }
        }
    }
    for set in sets {
        report.predictions.push(predict(&set, tolerance, seed)?);
    }
    Ok(report)
}

/// The runs of each stored kab, by its id: side A's, then side B's. A run kept only for its
/// variants' failures (every variant failed in that guest) has nothing to predict against.
fn kab_sides(runs: &[RunRecord]) -> BTreeMap<&str, [Vec<&RunRecord>; 2]> {
    let mut kabs: BTreeMap<&str, [Vec<&RunRecord>; 2]> = BTreeMap::new();
    for run in runs.iter().filter(|r| r.produced_samples()) {
        if let Some(k) = kab_side(run) {
            let side = usize::from(k.side == "B");
            kabs.entry(k.id.as_str()).or_default()[side].push(run);
        }
    }
    kabs
}

/// The profile that prices a kab's prediction: its base's calibration. `Ok(None)` when its
/// runs do not say which kernels they booted; `Err` why the kab cannot be predicted.
fn base_profile(
    sides: &[Vec<&RunRecord>; 2],
    calibrations: &Calibrations<'_>,
) -> Result<Option<(PathBuf, Profile)>, String> {
    let (Some(a), Some(b)) = (sides[0].first(), sides[1].first()) else {
        let have = if sides[0].is_empty() { "B" } else { "A" };
        return Err(format!(
            "only side {have}'s runs are stored; a prediction of a patch needs both"
        ));
    };
    let (Some(ua), Some(ub)) = (a.host.under_test.as_ref(), b.host.under_test.as_ref()) else {
        return Ok(None);
    };
    // Both sides' measurements against one profile: on one clock, or not at all.
    let clock = crate::record::one_clock(sides.iter().flatten().copied())
        .map_err(|mixed| mixed.to_string())?;
    if ua.release != ub.release {
        return Err(format!(
            "A is {} and B is {}: a prediction of a patch compares one version with itself patched",
            ua.release, ub.release
        ));
    }
    let base = Identity::of_run(ua).on_clock(clock);
    match calibrations(&base)? {
        Some(profile) => Ok(Some(profile)),
        None => Err(format!(
            "no profile calibrated on the base {} ({}) under {} at {}: a kab calibrates its base once, in its first boot (it failed there, or the cache was cleared); run the kab again",
            ua.release,
            ua.source,
            ua.accel,
            base.path().display()
        )),
    }
}

impl Skipped {
    /// Kab `id` (its `side`, when only one) skipped, and why.
    pub(crate) fn of(id: &str, side: Option<&str>, why: String) -> Skipped {
        Skipped {
            kab: id.to_string(),
            side: side.map(str::to_string),
            why,
        }
    }
}

impl<'a> Set<'a> {
    /// Adds kab `id`'s `side`, which booted `under_test` and runs with `strategy`, to the set
    /// of the same kernel, strategy, profile and parameters, or as a set of its own.
    fn add(
        sets: &mut Vec<Set<'a>>,
        id: &str,
        under_test: &'a UnderTest,
        strategy: StrategyChoice,
        profile: &(PathBuf, Profile),
        side: &[&'a RunRecord],
    ) {
        let params = |r: &RunRecord| serde_json::to_string(&r.params).unwrap_or_default();
        let same = |s: &Set<'_>| {
            Identity::of_run(s.under_test) == Identity::of_run(under_test)
                && crate::record::one_clock(s.runs.iter().chain(side).copied()).is_ok()
                && s.strategy.name == strategy.name
                && s.profile.0 == profile.0
                && s.runs.first().map(|r| params(r)) == side.first().map(|r| params(r))
        };
        match sets.iter_mut().find(|s| same(s)) {
            Some(set) => {
                set.kabs.push(id.to_string());
                set.runs.extend(side.iter().copied());
            }
            None => sets.push(Set {
                under_test,
                strategy,
                profile: profile.clone(),
                kabs: vec![id.to_string()],
                runs: side.to_vec(),
            }),
        }
    }
}

/// One kernel's prediction.
fn predict(set: &Set<'_>, tolerance: f64, seed: u64) -> Result<Prediction, Error> {
    let (path, profile) = &set.profile;
    let (model, mut rows) = compare(&set.runs, set.strategy.strategy(), profile, tolerance, seed)?;
    // The values the model read that were fitted on a published figure: their rows re-show
    // the fit rather than test a prediction.
    let fitted = super::fitted_in(&[profile]);
    if let Some(f) = fitted.first() {
        for r in &mut rows {
            r.agreement = Agreement::Fitted {
                key: format!("{}.{}", f.profile, f.key),
                on: f.fitted_on.clone(),
            };
        }
    }
    let u = set.under_test;
    let change = change_words(u.kab.as_ref().map_or(&[], |k| k.patches.as_slice()), |p| {
        format!(
            "{} (sha256 {})",
            p.file,
            &p.sha256[..p.sha256.len().min(16)]
        )
    });
    let kernel_reps = set
        .runs
        .iter()
        .flat_map(|r| r.variants.first())
        .filter_map(|v| v.metrics.get("stalls"))
        .map(|m| m.samples.len())
        .sum();
    let model_reps = model
        .variants
        .first()
        .and_then(|v| v.metrics.get("stalls"))
        .map_or(0, |m| m.samples.len());
    Ok(Prediction {
        kind: KIND,
        thread: THREAD,
        release: u.release.clone(),
        spec: u.spec.clone(),
        change,
        strategy: set.strategy.clone(),
        accel: u.accel.clone(),
        profile: profile.name.clone(),
        profile_path: path.clone(),
        kabs: set.kabs.clone(),
        runs: set.runs.iter().map(|r| r.run_id.clone()).collect(),
        reps: [model_reps, kernel_reps],
        fitted,
        rows,
    })
}

/// Every prediction of a patch the runs in `store` allow, each priced by the cached
/// calibration of its kab's base kernel.
pub fn evaluate(store: &Store, tolerance: f64, seed: u64) -> Result<PatchReport, Error> {
    let listed = store.list(usize::MAX)?;
    let mut runs = Vec::new();
    for l in listed.iter().filter(|l| {
        l.backend == BackendKind::Kvm
            && Kind::named(&l.scenario).ok() == Some(Kind::Lifecycle)
            && l.is_users()
    }) {
        let run = store.load(&l.run_id)?;
        if kab_side(&run).is_some() {
            runs.push(run);
        }
    }
    let calibrations = |id: &Identity| calibration::load(id).map_err(|e| e.to_string());
    from_runs(&runs, &calibrations, tolerance, seed)
}

/// The stored runs of two real kabs (the 001 fix and sync-on-register against stock 7.3.4
/// under TCG), trimmed, and the profile the first calibrated in its base's guest.
#[cfg(test)]
pub(crate) mod fixture {
    use super::*;

    const RUNS: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kab-7.3-001/runs.jsonl"
    ));
    const PROFILE: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kab-7.3-001/base-calibrated-tcg.toml"
    ));

    /// The eight runs.
    pub fn runs() -> Vec<RunRecord> {
        RUNS.lines()
            .map(|l| serde_json::from_str(l).expect("a stored run"))
            .collect()
    }

    /// The base's calibrated profile.
    pub fn profile() -> Profile {
        Profile::parse("fixture", PROFILE).expect("the calibrated profile")
    }

    /// The runs of one side of the kab whose B carries `patch`.
    pub fn side<'a>(runs: &'a [RunRecord], patch: &str, side: &str) -> Vec<&'a RunRecord> {
        let id = runs
            .iter()
            .filter_map(|r| r.host.under_test.as_ref()?.kab.as_ref())
            .find(|k| k.patches.iter().any(|p| p.file == patch))
            .map(|k| k.id.clone())
            .expect("the kab");
        runs.iter()
            .filter(|r| {
                r.host
                    .under_test
                    .as_ref()
                    .and_then(|u| u.kab.as_ref())
                    .is_some_and(|k| k.id == id && k.side == side)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::runner::DEFAULT_SEED;

    fn report(runs: &[RunRecord]) -> PatchReport {
        let profile = fixture::profile();
        let calibrations =
            |_: &Identity| Ok(Some((PathBuf::from("fixture.toml"), profile.clone())));
        from_runs(runs, &calibrations, TOLERANCE_PCT, DEFAULT_SEED).expect("the predictions")
    }

    fn row<'a>(p: &'a Prediction, variant: &str) -> &'a PatchRow {
        p.rows
            .iter()
            .find(|r| r.variant == variant)
            .unwrap_or_else(|| panic!("no row {variant}: {p:#?}"))
    }

    /// The lifecycle's orders, as the kernel ran them: irqchip-first, memslots-first,
    /// devices-after-vcpus, qemu-order, firecracker-order, boot-activation.
    fn orders() -> Vec<&'static str> {
        crate::scenario::lifecycle::INFO
            .variants
            .iter()
            .map(|v| v.name)
            .collect()
    }

    /// Stock 7.3 (its two kabs' A sides pooled), the 001 fix and sync-on-register, each
    /// against the model running its strategy: the stall counts and waits the kernels showed,
    /// every stalled length within the kernel's spread. Stock irqchip-first follows
    /// boot-activation in the kab's interleave: the model places it after that VM's teardown
    /// (which ends later in the jiffy than a VM that did not boot) and its own setup, where
    /// the kernel's builds start, so its irqchip registers after the tick as the kernel's does
    /// and waits nearly two jiffies, not one.
    #[test]
    fn the_three_kernels_of_the_stored_kabs_are_predicted_with_known_answers() {
        let r = report(&fixture::runs());
        assert!(r.skipped.is_empty(), "{:?}", r.skipped);
        let strategies: Vec<&str> = r.predictions.iter().map(|p| p.strategy.name).collect();
        assert_eq!(
            strategies,
            ["always-defer", "lifecycle-keyed", "always-sync"]
        );
        let [stock, fix, sync] = [0, 1, 2].map(|i| &r.predictions[i]);
        assert_eq!(stock.change, "none (stock)");
        assert_eq!(stock.kabs.len(), 2, "both kabs' bases are one kernel");
        assert_eq!(stock.reps, [40, 40]);
        assert!(fix.change.starts_with("001-lifecycle-keyed.patch"));
        assert!(fix.strategy.from.contains("recognised from the sha256"));
        // Stall counts per VM, model and kernel alike, in the orders' order.
        let counts = |p: &Prediction| -> Vec<f64> {
            orders().iter().map(|v| row(p, v).stalls.measured).collect()
        };
        assert_eq!(orders()[0], "irqchip-first");
        assert_eq!(counts(stock), [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
        assert_eq!(counts(fix), [0.0, 0.0, 0.0, 0.0, 0.0, 1.0]);
        assert_eq!(counts(sync), [0.0; 6]);
        for p in [stock, fix, sync] {
            assert!(p.fitted.is_empty(), "{:?}", p.fitted);
            for r in &p.rows {
                assert!(r.stalls.pass, "{r:#?}");
                assert_eq!(r.model_waits, r.kernel_waits, "{r:#?}");
            }
        }
        // The fix leaves boot-activation's wait: the boot memslot on the ioeventfds' period.
        let boot = row(fix, "boot-activation");
        assert_eq!(
            boot.kernel_waits,
            [Wait {
                ioctl: "KVM_SET_USER_MEMORY_REGION".into(),
                on: "KVM_IOEVENTFD".into()
            }]
        );
        assert_eq!(boot.jiffies.len(), 1);
        assert!(boot.jiffies[0].pass, "{boot:#?}");
        assert_eq!((fix.within(), fix.outside()), (6, 0));
        assert_eq!((sync.within(), sync.outside()), (6, 0));
        assert_eq!((stock.within(), stock.outside()), (6, 0));
        let after_boot = row(stock, "irqchip-first");
        assert_eq!(after_boot.agreement, Agreement::Within);
        assert!(after_boot.jiffies[0].predicted > 1.5, "{after_boot:#?}");
        let [model_phase, kernel_phase] = after_boot.tick_phase_ms.expect("tick phases");
        assert!((kernel_phase - model_phase).abs() < 0.5, "{after_boot:#?}");
    }

    /// A deliberately wrong mapping: the 001 fix's kernel declared as always-sync. The model
    /// then has boot-activation's memslot update wait for nothing, the kernel still has it
    /// wait out the ioeventfds' grace period: the row falls outside, on the count and the
    /// waits.
    #[test]
    fn a_wrong_strategy_for_the_fix_falls_outside() {
        let mut runs = fixture::runs();
        let fix_b: Vec<String> = fixture::side(&runs, "001-lifecycle-keyed.patch", "B")
            .iter()
            .map(|r| r.run_id.clone())
            .collect();
        for r in runs.iter_mut().filter(|r| fix_b.contains(&r.run_id)) {
            if let Some(k) = r.host.under_test.as_mut().and_then(|u| u.kab.as_mut()) {
                k.model_strategy = Some("always-sync".into());
            }
        }
        let r = report(&runs);
        let wrong = r
            .predictions
            .iter()
            .find(|p| {
                p.change.starts_with("001-lifecycle-keyed") && p.strategy.name == "always-sync"
            })
            .expect("the fix's kernel run as always-sync");
        assert!(wrong.strategy.from.contains("--model-strategy"));
        let boot = row(wrong, "boot-activation");
        assert_eq!(boot.agreement, Agreement::Outside, "{boot:#?}");
        assert!(!boot.stalls.pass);
        assert_ne!(boot.model_waits, boot.kernel_waits);
        // The orders before the first vCPU cannot tell the two apart: both synchronize there.
        assert_eq!(row(wrong, "qemu-order").agreement, Agreement::Within);
    }

    #[test]
    fn a_change_is_known_by_its_hash_by_declaration_or_by_the_kernels_version() {
        let known = |file: &str, sha: &str| {
            strategy_for("7.3.4+deb13-amd64", &[(file.into(), sha.into())], None)
        };
        assert_eq!(
            known("fix.patch", KNOWN_CHANGES[0].sha256).map(|s| s.name),
            Ok("lifecycle-keyed")
        );
        assert_eq!(
            known("renamed.patch", KNOWN_CHANGES[1].sha256).map(|s| s.name),
            Ok("always-sync")
        );
        let unknown = known("doc-only.patch", "00ff").unwrap_err();
        assert!(unknown.contains("--model-strategy"), "{unknown}");
        assert_eq!(
            strategy_for("7.3.4+deb13-amd64", &[], None).map(|s| s.name),
            Ok("always-defer")
        );
        assert_eq!(
            strategy_for("6.12.57+deb12-amd64", &[], None).map(|s| s.name),
            Ok("always-sync")
        );
        let declared = strategy_for(
            "7.3.4",
            &[("x.patch".into(), "00".into())],
            Some("lifecycle-keyed"),
        );
        assert_eq!(declared.map(|s| s.name), Ok("lifecycle-keyed"));
        assert!(strategy_for("7.3.4", &[], Some("sometimes")).is_err());
    }

    /// A kab of which one side is stored, or whose sides are two versions, or whose base was
    /// never calibrated, is skipped with the reason; nothing is predicted from it.
    #[test]
    fn a_kab_that_cannot_be_judged_is_skipped_with_the_reason() {
        let runs = fixture::runs();
        let only_a: Vec<RunRecord> = fixture::side(&runs, "001-lifecycle-keyed.patch", "A")
            .into_iter()
            .cloned()
            .collect();
        let r = report(&only_a);
        assert!(r.predictions.is_empty());
        assert!(r.skipped[0].why.contains("only side A"), "{:?}", r.skipped);
        // B's runs stored only for their failures (every variant failed in its guest): as if
        // B had none, never a model run of no variant.
        let mut failed_b = only_a.clone();
        for run in fixture::side(&runs, "001-lifecycle-keyed.patch", "B") {
            let mut run = run.clone();
            for v in &mut run.variants {
                v.status = crate::record::VariantStatus::Failed("the guest shut down".into());
                v.metrics.clear();
            }
            failed_b.push(run);
        }
        let r = report(&failed_b);
        assert!(r.predictions.is_empty());
        assert!(r.skipped[0].why.contains("only side A"), "{:?}", r.skipped);
        let mut other = runs.clone();
        for run in other.iter_mut() {
            if let Some(u) = run.host.under_test.as_mut()
                && u.kab.as_ref().is_some_and(|k| k.side == "B")
            {
                u.release = "7.2.13+deb13-amd64".into();
            }
        }
        let r = report(&other);
        assert!(r.predictions.is_empty());
        assert!(
            r.skipped.iter().all(|s| s.why.contains("one version")),
            "{:?}",
            r.skipped
        );
        let none = |_: &Identity| Ok(None);
        let r = from_runs(&runs, &none, TOLERANCE_PCT, DEFAULT_SEED).expect("a report");
        assert!(r.predictions.is_empty());
        assert!(
            r.skipped[0].why.contains("run the kab again"),
            "{:?}",
            r.skipped
        );
    }
}
