//! `hvlab sweep`: one scenario over the cartesian product of `--grid key=v1,v2,…` axes.
//!
//! The unit of work (and of sharding) is one grid point: one run of the scenario with the
//! point's `--set` values and the requested variants together, so each point keeps its
//! variants interleaved and its verdicts. `variant` may itself be an axis
//! (`--grid variant=a,b`): then each variant is its own point. Every point is validated before
//! anything runs; its seed is a pure function of its key and the base seed
//! ([`super::shard::unit_seed`]), so a point's result is the same on any shard and with any
//! number of threads. On the model, points run in parallel (one `ModelBackend` per point);
//! on kvm, one after another, so measurements do not disturb each other.
//!
//! Each point is stored as an ordinary run (`runs`, `show`, `compare` work on it) whose
//! parameters carry `sweep` (the sweep's id), `sweep_grid` (its axes, comma-joined) and
//! `sweep_point` (the point's position), so no schema change is needed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;

use crate::error::InputError;
use crate::lab::Error;
use crate::record::RunRecord;
use crate::scenario::params::parse_set;
use crate::scenario::runner::{Progress, RunRequest, Silent};
use crate::scenario::{self, Kind};
use hvlab_core::{Backend, BackendKind};

use super::shard::{Shard, unit_seed};

/// The grid key that makes variants an axis.
pub const VARIANT_AXIS: &str = "variant";

/// One `--grid` axis.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Axis {
    /// A `--set` parameter of the scenario, or `variant`.
    pub key: String,
    /// Its values, in the order given.
    pub values: Vec<String>,
}

/// Parses `key=v1,v2,…` arguments: keys once each, values non-empty and distinct.
pub fn parse_grid(args: &[String]) -> Result<Vec<Axis>, InputError> {
    let mut axes: Vec<Axis> = Vec::new();
    for arg in args {
        let bad = |why: String| InputError::BadValue {
            key: "--grid".into(),
            value: arg.clone(),
            why,
        };
        let (key, list) = parse_set(arg)
            .map_err(|_| bad("expected key=v1,v2,…, for example --grid vcpus=1,4,16".into()))?;
        if axes.iter().any(|a| a.key == key) {
            return Err(bad(format!(
                "{key} is given twice; put all its values in one --grid {key}=…"
            )));
        }
        let values: Vec<String> = list.split(',').map(|v| v.trim().to_string()).collect();
        if values.iter().any(String::is_empty) {
            return Err(bad(format!(
                "{key} has an empty value; list values separated by single commas, for example --grid {key}=1,2"
            )));
        }
        if let Some(dup) = values
            .iter()
            .enumerate()
            .find(|(i, v)| values[..*i].contains(v))
            .map(|(_, v)| v)
        {
            return Err(bad(format!("value {dup} is listed twice for {key}")));
        }
        axes.push(Axis { key, values });
    }
    if axes.is_empty() {
        return Err(InputError::BadValue {
            key: "--grid".into(),
            value: String::new(),
            why: "a sweep needs at least one --grid key=v1,v2,… (see `hvlab list` for the scenario's parameters)".into(),
        });
    }
    Ok(axes)
}

/// What the user asked to sweep.
#[derive(Clone)]
pub struct SweepSpec {
    /// The scenario.
    pub scenario: Kind,
    /// The backend.
    pub backend: BackendKind,
    /// The axes, in the order given (the first varies slowest).
    pub axes: Vec<Axis>,
    /// `--set` values every point shares.
    pub sets: Vec<String>,
    /// `--variant`s every point runs (empty: all), unless `variant` is an axis.
    pub variants: Vec<String>,
    /// Measured repetitions per variant per point.
    pub reps: u32,
    /// Warm-up repetitions per variant per point.
    pub warmup: u32,
    /// The base seed.
    pub seed: u64,
    /// The model's profile name, when given (part of the sweep's identity).
    pub profile: Option<String>,
}

/// One grid point: one unit of work.
#[derive(Debug, Clone)]
pub struct Point {
    /// Position in the job (0-based).
    pub position: usize,
    /// `SCENARIO/BACKEND/k1=v1,k2=v2`: its name and its seed's key.
    pub key: String,
    /// The axis values, in axis order.
    pub values: Vec<(String, String)>,
    /// How it runs.
    pub request: RunRequest,
}

impl Point {
    /// `k1=v1, k2=v2`.
    pub fn label(&self) -> String {
        label_of(&self.values)
    }
}

/// Axis values as `k1=v1, k2=v2`.
fn label_of(values: &[(String, String)]) -> String {
    values
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A validated sweep: its id and every point in job order.
#[derive(Clone)]
pub struct SweepPlan {
    /// `sw-` and 12 hex digits: a pure function of the sweep's definition and hvlab's
    /// revision, so every shard of one sweep tags its runs alike, and the same sweep rerun
    /// after a code change is another sweep.
    pub id: String,
    /// The scenario.
    pub scenario: Kind,
    /// The backend.
    pub backend: BackendKind,
    /// The axes.
    pub axes: Vec<Axis>,
    /// Every point, first axis slowest.
    pub points: Vec<Point>,
}

impl std::fmt::Debug for SweepSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SweepSpec")
            .field("scenario", &self.scenario.name())
            .field("backend", &self.backend)
            .field("axes", &self.axes)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for SweepPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SweepPlan")
            .field("id", &self.id)
            .field("scenario", &self.scenario.name())
            .field("points", &self.points.len())
            .finish_non_exhaustive()
    }
}

/// Most points one sweep may have: a typo such as 1..1000 in three axes would otherwise
/// queue a billion runs.
pub const MAX_POINTS: usize = 1_000_000;

/// The sweep's point count, refused above [`MAX_POINTS`]; an axis that is also a `--set` or
/// `variant` beside `--variant` is refused too.
pub fn point_count(spec: &SweepSpec) -> Result<usize, InputError> {
    for axis in &spec.axes {
        if axis.key == VARIANT_AXIS {
            if !spec.variants.is_empty() {
                return Err(InputError::BadValue {
                    key: "--variant".into(),
                    value: spec.variants.join(","),
                    why: "variant is already a --grid axis; give the variants there only".into(),
                });
            }
            continue;
        }
        if let Some(set) = spec
            .sets
            .iter()
            .find(|s| parse_set(s).is_ok_and(|(k, _)| k == axis.key))
        {
            return Err(InputError::BadValue {
                key: "--set".into(),
                value: set.clone(),
                why: format!("{} is also a --grid axis; give it in one place", axis.key),
            });
        }
    }
    spec.axes
        .iter()
        .try_fold(1usize, |n, a| n.checked_mul(a.values.len()))
        .filter(|n| *n <= MAX_POINTS)
        .ok_or_else(|| InputError::BadValue {
            key: "--grid".into(),
            value: axes_text(&spec.axes),
            why: format!("a sweep has at most {MAX_POINTS} points; split it into several"),
        })
}

/// `3 values of vcpus × 2 values of devices`, for messages.
pub fn axes_text(axes: &[Axis]) -> String {
    axes.iter()
        .map(|a| format!("{} values of {}", a.values.len(), a.key))
        .collect::<Vec<_>>()
        .join(" × ")
}

/// The point at `position` (below [`point_count`]), checked as `hvlab run` would check it.
fn point_at(spec: &SweepSpec, position: usize) -> Result<Point, InputError> {
    let info = spec.scenario.info();
    // Mixed radix, last axis fastest.
    let mut rest = position;
    let mut values = vec![(String::new(), String::new()); spec.axes.len()];
    for (slot, axis) in values.iter_mut().zip(&spec.axes).rev() {
        let n = axis.values.len();
        *slot = (axis.key.clone(), axis.values[rest % n].clone());
        rest /= n;
    }
    let mut sets = spec.sets.clone();
    let mut variants = spec.variants.clone();
    for (k, v) in &values {
        if k == VARIANT_AXIS {
            variants = vec![v.clone()];
        } else {
            sets.push(format!("{k}={v}"));
        }
    }
    let key = format!(
        "{}/{}/{}",
        info.name,
        spec.backend,
        values
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let bad_point = |e: InputError| InputError::BadValue {
        key: "--grid point".into(),
        value: label_of(&values),
        why: e.to_string(),
    };
    let params = spec
        .scenario
        .parse(&sets, spec.backend.capabilities())
        .map_err(bad_point)?;
    let request = RunRequest {
        params,
        variants,
        reps: spec.reps,
        warmup: spec.warmup,
        seed: unit_seed(&key, spec.seed),
    };
    scenario::check(&request, spec.backend).map_err(bad_point)?;
    Ok(Point {
        position,
        key,
        values,
        request,
    })
}

/// Expands and validates a sweep: every point is checked as `hvlab run` would check it, so
/// a bad key or value is refused (exit 2) before anything runs.
pub fn plan(spec: &SweepSpec) -> Result<SweepPlan, InputError> {
    let info = spec.scenario.info();
    let total = point_count(spec)?;
    let points = (0..total)
        .map(|position| point_at(spec, position))
        .collect::<Result<Vec<_>, _>>()?;
    let definition = format!(
        "{}|{}|{:?}|{:?}|{:?}|{:?}|{}|{}|{}|{}",
        info.name,
        spec.backend,
        spec.profile,
        spec.axes,
        spec.sets,
        spec.variants,
        spec.reps,
        spec.warmup,
        env!("CARGO_PKG_VERSION"),
        env!("HVLAB_GIT_REV"),
    );
    Ok(SweepPlan {
        id: format!("sw-{:012x}", unit_seed(&definition, spec.seed) >> 16),
        scenario: spec.scenario,
        backend: spec.backend,
        axes: spec.axes.clone(),
        points,
    })
}

/// What storing one shard of a sweep would take, measured before any point runs, so a sweep
/// too large for the disk is refused before it starts (a 10^6-point sweep needs about 80 GB).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StoreCost {
    /// Points this shard would store.
    pub points: usize,
    /// The positions of the points probed (the first and the last of the grid).
    pub probes: Vec<usize>,
    /// Samples one probed point stores (its variants × metrics × reps), fewest and most.
    pub samples: [usize; 2],
    /// Bytes one probed point added to an SQLite store, fewest and most.
    pub bytes_per_point: [u64; 2],
    /// Bytes all the shard's points would add, at the fewest and the most per point.
    pub bytes: [u64; 2],
    /// The backend the probes ran on (the model, also for a kvm sweep).
    pub measured_on: BackendKind,
}

/// Copies of each probe record saved into the scratch store: growth is counted in whole
/// pages (4 KiB), so one copy of a small record would read as a page or none.
const PROBE_COPIES: u32 = 8;

/// Measures what the shard's points would take in an SQLite store: the grid's first and last
/// points run on the model (a kvm sweep's points too: a guest costs seconds, and the model
/// writes the same variants and metrics, though not the host's extra counters) and each
/// record is saved [`PROBE_COPIES`] times into a scratch store, whose growth on disk is the
/// size of a point, rows, indexes and record JSON included. Nothing is assumed about the
/// size of a row.
pub fn store_cost(
    spec: &SweepSpec,
    shard: Shard,
    model: impl Fn(u64) -> Result<Box<dyn Backend>, Error>,
) -> Result<StoreCost, Error> {
    let total = point_count(spec)?;
    let points = (0..total).filter(|p| shard.selects(*p)).count();
    let mut probes = vec![0];
    if total > 1 {
        probes.push(total - 1);
    }
    let info = spec.scenario.info();
    let (mut samples, mut bytes_per_point) = ([usize::MAX, 0], [u64::MAX, 0]);
    for &position in &probes {
        let mut request = point_at(spec, position)?.request;
        request.warmup = 0;
        if !spec.backend.capabilities().modelled && request.variants.is_empty() {
            // All variants on kvm: not the model-only ones.
            request.variants = info.variants.iter().map(|v| v.name.to_string()).collect();
        }
        let mut backend = model(request.seed)?;
        let mut record = scenario::run(backend.as_mut(), &request, &Silent)?;
        // The same tags a stored point carries, with an id of the same length.
        tag(&mut record, "sw-000000000000", &spec.axes, position);
        let n: usize = record
            .variants
            .iter()
            .flat_map(|v| v.metrics.values())
            .map(|m| m.samples.len())
            .sum();
        let size = stored_size(&record)?;
        samples = [samples[0].min(n), samples[1].max(n)];
        bytes_per_point = [bytes_per_point[0].min(size), bytes_per_point[1].max(size)];
    }
    let points_u64 = u64::try_from(points).unwrap_or(u64::MAX);
    Ok(StoreCost {
        points,
        probes,
        samples,
        bytes_per_point,
        bytes: bytes_per_point.map(|b| b.saturating_mul(points_u64)),
        measured_on: BackendKind::Model,
    })
}

/// Bytes `record` adds to an SQLite store: the growth of a scratch store (closed, so its
/// write-ahead log is checkpointed into the file) over [`PROBE_COPIES`] saves.
fn stored_size(record: &RunRecord) -> Result<u64, Error> {
    let dir = tempfile::Builder::new().prefix("hvlab-probe").tempdir()?;
    let path = dir.path().join("probe.db");
    let on_disk = |path: &std::path::Path| -> Result<u64, Error> {
        // A WAL left behind (it is not, when the last connection closes) still counts.
        let wal = path.with_extension("db-wal");
        Ok(std::fs::metadata(path)?.len() + std::fs::metadata(&wal).map_or(0, |m| m.len()))
    };
    drop(crate::store::Store::open(&path)?);
    let empty = on_disk(&path)?;
    {
        let mut store = crate::store::Store::open(&path)?;
        for _ in 0..PROBE_COPIES {
            // Saving the same id again stores it under a fresh suffix of the same length.
            let mut copy = record.clone();
            store.save(&mut copy)?;
        }
    }
    Ok(on_disk(&path)?
        .saturating_sub(empty)
        .div_ceil(u64::from(PROBE_COPIES)))
}

/// Bytes free to an unprivileged writer on the filesystem that holds (or will hold) `path`.
pub fn free_bytes(path: &std::path::Path) -> Option<u64> {
    // The store's directory may not exist yet: its nearest existing ancestor is where it
    // will be made.
    let dir = path
        .ancestors()
        .skip(1)
        .map(|d| {
            if d.as_os_str().is_empty() {
                std::path::Path::new(".")
            } else {
                d
            }
        })
        .find(|d| d.is_dir())?;
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Whether this shard's points fit the free space of the SQLite store's filesystem:
/// `Err(free bytes)` when they would take more. A PostgreSQL server's free space cannot be
/// seen from here, so it always fits.
pub fn check_room(cost: &StoreCost, store: &crate::store::Location) -> Result<(), u64> {
    let crate::store::Location::Sqlite(path) = store else {
        return Ok(());
    };
    match free_bytes(path) {
        Some(free) if cost.bytes[1] > free => Err(free),
        _ => Ok(()),
    }
}

/// What the store-cost check before a sweep found (worded by `export::words`).
#[derive(Debug)]
pub enum Preflight {
    /// The points fit; `free` is what the store's filesystem has free, when known.
    Fits {
        /// What this shard's points would take.
        cost: StoreCost,
        /// Bytes free where the store is (none for PostgreSQL).
        free: Option<u64>,
    },
    /// The points would take more than the store's filesystem has free: the sweep is refused
    /// (exit 2); the remedies include `--no-store`.
    NoRoom {
        /// What this shard's points would take.
        cost: StoreCost,
        /// The store's file.
        store: std::path::PathBuf,
        /// Bytes free there.
        free: u64,
    },
    /// Not measured (a probe that cannot run on the model, a scratch store that cannot be
    /// written): only the check is lost, not the sweep.
    NotEstimated(Error),
}

/// Before a sweep's points are expanded and checked one by one (10^6 of them take seconds
/// and most of a GiB): what this shard's points would take in `store`, and whether its
/// filesystem has room for them.
pub fn preflight(
    spec: &SweepSpec,
    shard: Shard,
    store: &crate::store::Location,
    host: &hvlab_core::host::HostInfo,
    profile: &super::backends::ModelProfile<'_>,
) -> Result<Preflight, Error> {
    let measured = if spec.backend.capabilities().modelled {
        store_cost(spec, shard, |seed| {
            super::backends::make(spec.backend, host.clone(), profile, seed)
        })
    } else {
        // Only the shape of the record is wanted: the nearest built-in profile, without the
        // note about it a model sweep would print.
        crate::model::default_profile(host, None)
            .map_err(|e| Error::from(crate::model::ModelError::from(e)))
            .and_then(|(p, _)| {
                store_cost(spec, shard, |seed| -> Result<Box<dyn Backend>, Error> {
                    Ok(Box::new(crate::model::ModelBackend::new(
                        p.clone(),
                        host.clone(),
                        seed,
                    )))
                })
            })
    };
    match measured {
        Ok(cost) => Ok(match (check_room(&cost, store), store) {
            (Err(free), crate::store::Location::Sqlite(path)) => Preflight::NoRoom {
                cost,
                store: path.clone(),
                free,
            },
            _ => Preflight::Fits {
                free: match store {
                    crate::store::Location::Sqlite(path) => free_bytes(path),
                    crate::store::Location::Postgres(_) => None,
                },
                cost,
            },
        }),
        Err(
            e @ Error::Run(
                crate::error::Error::Input(_)
                | crate::error::Error::Model(crate::model::ModelError::Profile(_)),
            ),
        ) => Err(e),
        Err(e) => Ok(Preflight::NotEstimated(e)),
    }
}

/// What a sweep (or one shard of it) did.
#[derive(Debug, Clone, Default)]
pub struct SweepOutcome {
    /// The sweep's id.
    pub id: String,
    /// Points in the whole sweep.
    pub points: usize,
    /// Points this shard ran (or tried), by key, in job order.
    pub units: Vec<String>,
    /// Points that produced samples (each handed to `keep`, which stores it).
    pub ran: usize,
    /// Points this host could not run, and why.
    pub skipped: Vec<PointProblem>,
    /// Points whose measurement failed, and why.
    pub failed: Vec<PointProblem>,
}

/// A point that did not run, and why (worded by `export::words::point_problem`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PointProblem {
    /// The point's label ([`Point::label`]).
    pub point: String,
    /// The message of the error that stopped it.
    pub why: String,
}

impl PointProblem {
    fn new(point: &Point, why: &dyn std::fmt::Display) -> PointProblem {
        PointProblem {
            point: point.label(),
            why: why.to_string(),
        }
    }
}

enum PointResult {
    Ran(Box<RunRecord>),
    Skipped(PointProblem),
    Failed(PointProblem),
}

fn run_point(
    plan: &SweepPlan,
    point: &Point,
    backend: &(impl Fn(u64) -> Result<Box<dyn Backend>, Error> + Sync),
) -> PointResult {
    let outcome = backend(point.request.seed)
        .and_then(|mut b| scenario::run(b.as_mut(), &point.request, &Silent).map_err(Error::from));
    let mut record = match outcome {
        Ok(r) => r,
        Err(e) if e.is_host_limitation() => {
            return PointResult::Skipped(PointProblem::new(point, &e));
        }
        Err(e) => return PointResult::Failed(PointProblem::new(point, &e)),
    };
    match scenario::judge(&record) {
        Ok(()) => {}
        Err(e @ crate::error::Error::AllUnsupported { .. }) => {
            return PointResult::Skipped(PointProblem::new(point, &e));
        }
        Err(e) => return PointResult::Failed(PointProblem::new(point, &e)),
    }
    tag(&mut record, &plan.id, &plan.axes, point.position);
    PointResult::Ran(Box::new(record))
}

/// The parameters that make a run a point of sweep `id`.
fn tag(record: &mut RunRecord, id: &str, axes: &[Axis], position: usize) {
    record.params.insert("sweep".into(), id.into());
    record.params.insert(
        "sweep_grid".into(),
        axes.iter()
            .map(|a| a.key.as_str())
            .collect::<Vec<_>>()
            .join(",")
            .into(),
    );
    record.params.insert("sweep_point".into(), position.into());
}

/// Runs this shard's points on `threads` threads (1: in this thread, as kvm needs), each on
/// its own backend from `backend(seed)`. `keep` gets every run that produced samples, in job
/// order whatever the thread count, before the sweep goes on; an error from `keep` (storage)
/// stops the sweep.
pub fn run<E>(
    plan: &SweepPlan,
    shard: Shard,
    threads: usize,
    backend: impl Fn(u64) -> Result<Box<dyn Backend>, Error> + Sync,
    progress: &dyn Progress,
    mut keep: impl FnMut(RunRecord) -> Result<(), E>,
) -> Result<SweepOutcome, E> {
    let mine: Vec<&Point> = plan
        .points
        .iter()
        .filter(|p| shard.selects(p.position))
        .collect();
    let mut out = SweepOutcome {
        id: plan.id.clone(),
        points: plan.points.len(),
        units: mine.iter().map(|p| p.key.clone()).collect(),
        ..SweepOutcome::default()
    };
    progress.start("points", mine.len() as u64);
    let mut take = |point: &Point, result: PointResult| -> Result<(), E> {
        progress.step(&point.label());
        match result {
            PointResult::Ran(record) => {
                keep(*record)?;
                out.ran += 1;
            }
            PointResult::Skipped(why) => out.skipped.push(why),
            PointResult::Failed(why) => out.failed.push(why),
        }
        Ok(())
    };
    let threads = threads.clamp(1, mine.len().max(1));
    if threads == 1 {
        for point in &mine {
            take(point, run_point(plan, point, &backend))?;
        }
    } else {
        let next = AtomicUsize::new(0);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| -> Result<(), E> {
            let (tx, rx) = mpsc::channel::<(usize, PointResult)>();
            for _ in 0..threads {
                let tx = tx.clone();
                let (next, stop, mine, backend) = (&next, &stop, &mine, &backend);
                scope.spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(point) = mine.get(i) else { break };
                        if tx.send((i, run_point(plan, point, backend))).is_err() {
                            break;
                        }
                    }
                });
            }
            drop(tx);
            // Hand results on in job order: a point finished early waits for those before it.
            let mut pending = BTreeMap::new();
            let mut due = 0;
            for (i, result) in rx {
                pending.insert(i, result);
                while let Some(result) = pending.remove(&due) {
                    if let Err(e) = take(mine[due], result) {
                        stop.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                    due += 1;
                }
            }
            Ok(())
        })?;
    }
    progress.finish();
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::scenario::Params;

    fn grid(args: &[&str]) -> Result<Vec<Axis>, InputError> {
        parse_grid(&args.iter().map(ToString::to_string).collect::<Vec<_>>())
    }

    fn spec(axes: &[&str], sets: &[&str], variants: &[&str]) -> SweepSpec {
        SweepSpec {
            scenario: Kind::Lifecycle,
            backend: BackendKind::Model,
            axes: grid(axes).unwrap(),
            sets: sets.iter().map(ToString::to_string).collect(),
            variants: variants.iter().map(ToString::to_string).collect(),
            reps: 3,
            warmup: 0,
            seed: 7,
            profile: Some("pvm-epyc".into()),
        }
    }

    #[test]
    fn grid_syntax_errors_name_the_argument() {
        for (args, says) in [
            (&["vcpus"][..], "expected key=v1,v2"),
            (&["=1,2"][..], "expected key=v1,v2"),
            (&["vcpus=1,,2"][..], "empty value"),
            (&["vcpus=1,2,1"][..], "listed twice"),
            (&["vcpus=1", "vcpus=2"][..], "given twice"),
            (&[][..], "at least one --grid"),
        ] {
            let e = grid(args).unwrap_err().to_string();
            assert!(e.contains("--grid") && e.contains(says), "{args:?}: {e}");
        }
    }

    #[test]
    fn points_are_the_cartesian_product_first_axis_slowest() {
        let p = plan(&spec(&["vcpus=1,2", "devices=0,4,8"], &[], &[])).unwrap();
        assert_eq!(p.points.len(), 6);
        let labels: Vec<String> = p.points.iter().map(Point::label).collect();
        assert_eq!(labels[0], "vcpus=1, devices=0");
        assert_eq!(labels[2], "vcpus=1, devices=8");
        assert_eq!(labels[3], "vcpus=2, devices=0");
        let Params::Lifecycle(fifth) = &p.points[4].request.params else {
            panic!("a lifecycle sweep's points are lifecycle runs");
        };
        assert_eq!((fifth.vcpus, fifth.devices), (2, 4));
        // Every point has its own seed, fixed by its key.
        let seeds: std::collections::BTreeSet<u64> =
            p.points.iter().map(|q| q.request.seed).collect();
        assert_eq!(seeds.len(), 6);
        let again = plan(&spec(&["vcpus=1,2", "devices=0,4,8"], &[], &[])).unwrap();
        assert_eq!(again.id, p.id);
        assert_eq!(again.points[5].request.seed, p.points[5].request.seed);
        assert!(p.id.starts_with("sw-") && p.id.len() == 15, "{}", p.id);
        // Another definition is another sweep.
        let other = plan(&spec(&["vcpus=1,2", "devices=0,4"], &[], &[])).unwrap();
        assert_ne!(other.id, p.id);
    }

    #[test]
    fn variant_as_an_axis_runs_each_variant_as_its_own_point() {
        let p = plan(&spec(
            &["variant=irqchip-first,memslots-first", "hz=100,1000"],
            &[],
            &[],
        ))
        .unwrap();
        assert_eq!(p.points.len(), 4);
        assert_eq!(p.points[1].request.variants, vec!["irqchip-first"]);
        let Params::Lifecycle(second) = &p.points[1].request.params else {
            panic!("a lifecycle sweep's points are lifecycle runs");
        };
        assert_eq!(second.hz, Some(1000));
        let e = plan(&spec(&["variant=irqchip-first"], &[], &["memslots-first"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("already a --grid axis"), "{e}");
    }

    #[test]
    fn bad_points_are_refused_before_anything_runs_naming_key_and_value() {
        for (axes, sets, says) in [
            (&["vcpus=1,100000"][..], &[][..], "vcpus=100000"),
            (&["cores=1,2"][..], &[][..], "cores"),
            (&["variant=irqchip-first,nope"][..], &[][..], "nope"),
            (&["vcpus=1,2"][..], &["vcpus=4"][..], "also a --grid axis"),
            (&["hz=100,x"][..], &[][..], "hz=x"),
        ] {
            let e = plan(&spec(axes, sets, &[])).unwrap_err().to_string();
            assert!(e.contains(says), "{axes:?}: {e}");
        }
        let mut kvm = spec(&["hz=100,250"], &[], &[]);
        kvm.backend = BackendKind::Kvm;
        let e = plan(&kvm).unwrap_err().to_string();
        assert!(e.contains("model parameter"), "{e}");
    }

    #[test]
    fn results_do_not_depend_on_threads_or_shards() {
        let p = plan(&spec(
            &["vcpus=1,2,4", "devices=0,8"],
            &[],
            &["irqchip-first"],
        ))
        .unwrap();
        let host = crate::lab::host::probe();
        let profile = crate::model::profile::Profile::load("pvm-epyc").unwrap();
        let backend = |seed| -> Result<Box<dyn Backend>, Error> {
            Ok(Box::new(crate::model::ModelBackend::new(
                profile.clone(),
                host.clone(),
                seed,
            )))
        };
        let collect = |shard: Shard, threads: usize| {
            let mut got = Vec::new();
            let out = run(&p, shard, threads, backend, &Silent, |r| {
                got.push(r);
                Ok::<(), Error>(())
            })
            .unwrap();
            assert_eq!(out.ran, got.len());
            got
        };
        let one = collect(Shard::WHOLE, 1);
        let many = collect(Shard::WHOLE, 3);
        assert_eq!(one.len(), 6);
        let content = |r: &RunRecord| (r.params.clone(), r.variants.clone());
        assert_eq!(
            one.iter().map(content).collect::<Vec<_>>(),
            many.iter().map(content).collect::<Vec<_>>()
        );
        let mut sharded: Vec<RunRecord> = (0..4)
            .flat_map(|i| collect(Shard::new(i, 4).unwrap(), 2))
            .collect();
        sharded.sort_by_key(|r| r.params["sweep_point"].as_u64());
        assert_eq!(
            one.iter().map(content).collect::<Vec<_>>(),
            sharded.iter().map(content).collect::<Vec<_>>()
        );
        assert_eq!(one[3].params["sweep"], p.id.as_str());
        assert_eq!(one[3].params["sweep_grid"], "vcpus,devices");
        assert_eq!(one[3].params["vcpus"], 2);
    }

    #[test]
    fn the_store_cost_measures_a_real_record_for_this_shards_points() {
        let s = spec(&["vcpus=1,2,3,4,5"], &[], &["irqchip-first"]);
        let host = crate::lab::host::probe();
        let profile = crate::model::profile::Profile::load("pvm-epyc").unwrap();
        let backend = |seed| -> Result<Box<dyn Backend>, Error> {
            Ok(Box::new(crate::model::ModelBackend::new(
                profile.clone(),
                host.clone(),
                seed,
            )))
        };
        let whole = store_cost(&s, Shard::WHOLE, backend).unwrap();
        assert_eq!(whole.points, 5);
        assert_eq!(whole.probes, vec![0, 4]);
        // One variant's metrics, 3 repetitions each.
        assert!(
            whole.samples[0] >= 3 && whole.samples[0] % 3 == 0,
            "{whole:?}"
        );
        assert!(whole.bytes_per_point[0] > 0, "{whole:?}");
        assert_eq!(whole.bytes, whole.bytes_per_point.map(|b| b * 5));
        let second = store_cost(&s, Shard::new(1, 2).unwrap(), backend).unwrap();
        assert_eq!(second.points, 2, "points 2 and 4 of 5");
        // Measured again from a fresh scratch store: the file grows by whole pages, so the
        // two measurements agree to a page or two (or 10%), not to the byte. Two runs here
        // measured 15872 and 17920 bytes per point: 2 KiB apart.
        for (a, b) in second.bytes_per_point.iter().zip(&whole.bytes_per_point) {
            assert!(
                a.abs_diff(*b) <= (*b / 10).max(4096),
                "{second:?} vs {whole:?}"
            );
        }

        let dir = tempfile::tempdir().unwrap();
        let at = crate::store::Location::Sqlite(dir.path().join("not-yet/hvlab.db"));
        assert!(check_room(&whole, &at).is_ok());
        let mut huge = whole.clone();
        huge.bytes = [u64::MAX / 2; 2];
        let free = check_room(&huge, &at).unwrap_err();
        assert!(free > 0 && free < huge.bytes[1], "{free}");
        // A PostgreSQL server's free space is not seen from here: nothing to refuse on.
        let pg = crate::store::Location::Postgres("postgres://localhost/hvlab".into());
        assert!(check_room(&huge, &pg).is_ok());
    }

    #[test]
    fn a_storage_error_stops_the_sweep() {
        let p = plan(&spec(&["vcpus=1,2,3,4,5,6"], &[], &["memslots-first"])).unwrap();
        let host = crate::lab::host::probe();
        let profile = crate::model::profile::Profile::load("pvm-epyc").unwrap();
        let backend = |seed| -> Result<Box<dyn Backend>, Error> {
            Ok(Box::new(crate::model::ModelBackend::new(
                profile.clone(),
                host.clone(),
                seed,
            )))
        };
        let mut kept = 0;
        let e = run(&p, Shard::WHOLE, 2, backend, &Silent, |_| {
            kept += 1;
            if kept == 2 {
                Err(Error::from(std::io::Error::other("disk full")))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert!(e.to_string().contains("disk full"));
        assert_eq!(kept, 2);
    }
}
