//! `hvlab compare`: B against A, where each side is a run, a run's variant (`RUN:variant`) or
//! several runs (`A1,A2`, compared by per-run medians), and what a regression means for the
//! exit code. Fleet comparisons take host selectors instead ([`compare_fleet`]).

use std::collections::BTreeMap;

use crate::analysis::class::MetricClass;
use crate::analysis::compare::{AbComparison, judge_together};
use crate::analysis::direction::Better;
use crate::analysis::statistics::{median, seed_for};
use crate::analysis::verdict::Correction;
use crate::error::InputError;
use crate::lab::Error;
use crate::lab::fleet::{HostFingerprint, HostMatch, Selector};
use crate::record::RunRecord;
use crate::scenario;
use crate::scenario::runner::DEFAULT_SEED;
use crate::store::{Store, StoreError};

/// What a comparison found.
#[derive(Debug, Clone)]
pub struct CompareOutcome {
    /// One comparison per variant pair.
    pub comparisons: Vec<AbComparison>,
    /// What the gate reads of them.
    pub gate: Gate,
}

/// What a comparison's gate reads, of runs ([`CompareOutcome`]) or of fleets
/// ([`FleetOutcome`]): whether B regressed, what was too thin to judge, and the busy hosts
/// that may confound it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Gate {
    /// Whether any B is significantly slower than its A (for a fleet: overall or on any
    /// matched host).
    pub regression: bool,
    /// The comparisons with too few samples for a verdict: "name (n = b vs a)" (for a fleet,
    /// too few hosts overall: "variant overall (n = b vs a hosts)").
    pub too_few: Vec<String>,
    /// Samples (for a fleet, hosts) per side with which every one of them could be judged,
    /// the correction for the comparisons judged together included.
    pub needed: usize,
    /// What made a side's host busy, per side (A, B): empty where every run was quiet or
    /// recorded no noise (for a fleet, one entry per busy run).
    pub busy: [Vec<String>; 2],
    /// The sides are different runs and one was measured on a busy host: the noise did not
    /// hit both alike (as it does for variants interleaved in one run), so a regression
    /// between them cannot be told from the host getting busier. A fleet's runs on different
    /// hosts or at different times are never interleaved: any busy run confounds it.
    pub confounded: bool,
    /// Some regression is larger than a busy host makes a run slower ([`BUSY_INFLATION`]):
    /// called even when the sides are confounded.
    pub beyond_busy_noise: bool,
}

/// How much slower a busy host made the same run: A/A pairs of different runs on this 2-core
/// machine at load 8-12 (a CPU hog per core beside four builds) differed by up to 1.72× (95%
/// CI upper end 2.24×, in an A/A experiment). A slowdown whose whole 95% interval lies
/// above this is not the host getting busier, so the gate still calls it.
pub const BUSY_INFLATION: f64 = 2.5;

/// Whether some comparison is a slowdown beyond what a busy host explains.
fn beyond_busy_noise<'a>(slowdowns: impl IntoIterator<Item = (&'a MetricClass, f64)>) -> bool {
    slowdowns
        .into_iter()
        .any(|(v, ci_low)| *v == MetricClass::Slower && ci_low >= BUSY_INFLATION)
}

/// The low end of the 95% interval of B's slowdown as a factor: of the ratio B/A when lower
/// is better, of A/B when higher is (a rate halved is a slowdown of 2).
fn least_slowdown(c: &AbComparison) -> f64 {
    match c.better {
        Better::Lower => c.ci95[0],
        Better::Higher => 1.0 / c.ci95[1],
    }
}

/// A side's run ids, sorted.
fn run_ids(side: &Side) -> Vec<&str> {
    let mut v: Vec<&str> = side.runs.iter().map(|r| r.run_id.as_str()).collect();
    v.sort_unstable();
    v
}

/// What the busy rule saw in each busy run of a side.
fn busy_of(side: &Side) -> Vec<String> {
    busy_runs(side.runs.iter())
}

/// What the busy rule saw in each of `runs` that was measured on a busy host.
fn busy_runs<'a>(runs: impl Iterator<Item = &'a RunRecord>) -> Vec<String> {
    runs.filter_map(|r| r.noise.as_ref().filter(|n| n.is_busy()))
        .map(|n| crate::analysis::words::busy_words(&n.busy))
        .collect()
}

/// How comparisons made together are judged: the level, the correction, the minimum effect.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judging {
    /// A fraction: 0.05 for 5%.
    pub threshold: f64,
    /// The level (0.05; 0.01 for `--fail-on-regression`).
    pub alpha: f64,
    /// The correction for the comparisons judged together.
    pub correction: Correction,
}

impl Judging {
    /// The verdict rule's defaults: level 0.05, or 0.01 when a regression fails the command.
    pub fn new(threshold: f64, gate: bool) -> Judging {
        Judging {
            threshold,
            alpha: if gate {
                crate::analysis::verdict::GATE_ALPHA
            } else {
                crate::analysis::verdict::ALPHA
            },
            correction: Correction::Holm,
        }
    }
}

/// Compares side `b` against side `a` on `metric` (default: the scenario's headline); every
/// variant pair is judged together (one correction over all of them).
pub fn compare(
    store: &Store,
    a: &str,
    b: &str,
    metric: Option<&str>,
    judging: Judging,
) -> Result<CompareOutcome, Error> {
    let (sa, sb) = (load_side(store, a)?, load_side(store, b)?);
    crate::record::one_clock(sa.runs.iter().chain(&sb.runs)).map_err(InputError::from)?;
    let busy = [busy_of(&sa), busy_of(&sb)];
    let confounded = run_ids(&sa) != run_ids(&sb) && busy.iter().any(|b| !b.is_empty());
    let mut comparisons = compare_sides(sa, sb, metric, judging.threshold)?;
    judge_together(
        &mut comparisons.iter_mut().collect::<Vec<_>>(),
        judging.alpha,
        judging.correction,
    );
    let regression = comparisons.iter().any(|c| c.verdict == MetricClass::Slower);
    let too_few = comparisons
        .iter()
        .filter(|c| !c.enough_samples)
        .map(|c| format!("{} (n = {} vs {})", c.b, c.n[1], c.n[0]))
        .collect();
    let needed = needed_to_judge(comparisons.iter());
    let beyond_busy_noise =
        beyond_busy_noise(comparisons.iter().map(|c| (&c.verdict, least_slowdown(c))));
    Ok(CompareOutcome {
        comparisons,
        gate: Gate {
            regression,
            too_few,
            needed,
            busy,
            confounded,
            beyond_busy_noise,
        },
    })
}

/// `5%`, `0.05` or `5` (percent when above 1).
pub fn parse_threshold(text: &str) -> Result<f64, Error> {
    let t = text.trim().trim_end_matches('%');
    let v: f64 = t.parse().map_err(|_| InputError::BadValue {
        key: "--threshold".into(),
        value: text.into(),
        why: "give a percentage such as 5% or a fraction such as 0.05".into(),
    })?;
    let fraction = if text.contains('%') || v > 1.0 {
        v / 100.0
    } else {
        v
    };
    if !(0.0..1.0).contains(&fraction) {
        return Err(InputError::BadValue {
            key: "--threshold".into(),
            value: text.into(),
            why: "out of range: the valid range is 0% to under 100% (a fraction 0 to under 1), such as 5%".into(),
        }
        .into());
    }
    Ok(fraction)
}

/// One side: runs and, optionally, the variant to take from them.
struct Side {
    runs: Vec<RunRecord>,
    variant: Option<String>,
}

fn load_side(store: &Store, spec: &str) -> Result<Side, Error> {
    let mut runs = Vec::new();
    let mut variant: Option<String> = None;
    for part in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        // Run ids contain colons (their timestamps): try the whole reference first.
        let (run, v) = match store.load(part) {
            Ok(r) => (r, None),
            Err(first) => match part.rsplit_once(':') {
                Some((id, v)) => (store.load(id).map_err(|_| first)?, Some(v.to_string())),
                None => return Err(first.into()),
            },
        };
        if let (Some(v), Some(prev)) = (&v, &variant)
            && v != prev
        {
            return Err(InputError::TwoVariantsOnOneSide(prev.clone(), v.clone()).into());
        }
        variant = variant.or(v);
        runs.push(run);
    }
    if runs.is_empty() {
        return Err(StoreError::NoSuchRun(spec.into()).into());
    }
    Ok(Side { runs, variant })
}

/// The samples of `metric` of `variant` on one side: the samples of its one run, or one
/// median per run when there are several (a run is the unit of replication then).
fn side_samples(side: &Side, variant: &str, metric: &str) -> Option<Vec<f64>> {
    pooled_samples(side.runs.iter(), variant, metric)
}

/// [`side_samples`] over any runs.
fn pooled_samples<'a>(
    runs: impl Iterator<Item = &'a RunRecord>,
    variant: &str,
    metric: &str,
) -> Option<Vec<f64>> {
    let per_run: Vec<&crate::record::MetricRecord> = runs
        .filter_map(|r| {
            r.variant(variant)
                .filter(|v| v.is_ok())
                .and_then(|v| v.metrics.get(metric))
        })
        .collect();
    match per_run.as_slice() {
        [] => None,
        [one] => Some(one.samples.clone()),
        many => Some(many.iter().map(|m| m.median).collect()),
    }
}

fn compare_sides(
    sa: Side,
    sb: Side,
    metric: Option<&str>,
    threshold: f64,
) -> Result<Vec<AbComparison>, Error> {
    let scenario_name = &sa.runs[0].scenario;
    if let Some(other) = sa
        .runs
        .iter()
        .chain(&sb.runs)
        .find(|r| &r.scenario != scenario_name)
    {
        return Err(InputError::ScenarioMismatch(
            sa.runs[0].run_id.clone(),
            scenario_name.clone(),
            other.run_id.clone(),
            other.scenario.clone(),
        )
        .into());
    }
    let info = scenario::find(scenario_name)?;
    let metric = metric.unwrap_or(info.headline);
    // A higher-is-better metric (pages per ms) that went up is FASTER, not SLOWER.
    let better = info.declared(metric).direction.better();
    let pairs: Vec<(String, String)> = match (&sa.variant, &sb.variant) {
        (Some(va), Some(vb)) => vec![(va.clone(), vb.clone())],
        (Some(v), None) | (None, Some(v)) => vec![(v.clone(), v.clone())],
        (None, None) => sa.runs[0]
            .variants
            .iter()
            .filter(|v| {
                v.is_ok()
                    && sb
                        .runs
                        .iter()
                        .any(|r| r.variant(&v.name).is_some_and(|x| x.is_ok()))
            })
            .map(|v| (v.name.clone(), v.name.clone()))
            .collect(),
    };
    if pairs.is_empty() {
        return Err(InputError::NoSharedVariant.into());
    }
    let mut out = Vec::new();
    for (va, vb) in pairs {
        let xa = side_samples(&sa, &va, metric).ok_or_else(|| InputError::MissingMetric {
            side: 'A',
            metric: metric.to_string(),
            variant: va.clone(),
        })?;
        let xb = side_samples(&sb, &vb, metric).ok_or_else(|| InputError::MissingMetric {
            side: 'B',
            metric: metric.to_string(),
            variant: vb.clone(),
        })?;
        let unit = sa.runs[0]
            .variant(&va)
            .and_then(|v| v.metrics.get(metric))
            .map_or("", |m| m.unit.as_str());
        let seed = seed_for(DEFAULT_SEED, &["compare", &va, &vb]);
        out.push(
            crate::analysis::compare::ab(
                metric,
                unit,
                (&format!("A:{va}"), &xa),
                (&format!("B:{vb}"), &xb),
                threshold,
                seed,
            )
            .judged_by(better),
        );
    }
    Ok(out)
}

/// One pair of matched hosts compared.
#[derive(Debug, Clone, serde::Serialize)]
pub struct HostComparison {
    /// What the hosts share: the fingerprint fields neither selector names.
    pub host: String,
    /// The hosts on side A.
    pub a_hosts: Vec<HostFingerprint>,
    /// The hosts on side B.
    pub b_hosts: Vec<HostFingerprint>,
    /// B against A on these hosts.
    pub comparison: AbComparison,
}

/// One variant compared across the fleet.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FleetComparison {
    /// The variant.
    pub variant: String,
    /// Per matched host, in key order.
    pub per_host: Vec<HostComparison>,
    /// Match keys with runs on side A only.
    pub only_a: Vec<String>,
    /// Match keys with runs on side B only.
    pub only_b: Vec<String>,
    /// Every host of each side pooled: one median per host.
    pub overall: AbComparison,
}

/// What a fleet comparison found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FleetOutcome {
    /// The scenario compared.
    pub scenario: String,
    /// The metric compared.
    pub metric: String,
    /// Runs selected per side.
    pub runs: [usize; 2],
    /// One per variant.
    pub comparisons: Vec<FleetComparison>,
    /// What the gate reads of them (its fields at the top level of the JSON).
    #[serde(flatten)]
    pub gate: Gate,
}

/// Compares the runs selector `b` picks against those `a` picks, per matched host (hosts
/// pair on the fingerprint fields neither selector names, see [`HostMatch`]; a host's samples
/// are its one run's, or one median per run) and overall (one median per host per side).
pub fn compare_fleet(
    store: &Store,
    a: &Selector,
    b: &Selector,
    scenario: Option<&str>,
    variant: Option<&str>,
    metric: Option<&str>,
    judging: Judging,
) -> Result<FleetOutcome, Error> {
    if let Some(name) = scenario {
        scenario::find(name)?;
    }
    let picked = pick(store, [a, b], scenario)?;
    let side = |i: usize| -> Vec<&RunRecord> {
        picked
            .iter()
            .filter(|(on, _)| on[i])
            .map(|(_, r)| r)
            .collect()
    };
    let sides = [side(0), side(1)];
    crate::record::one_clock(sides.iter().flatten().copied()).map_err(InputError::from)?;
    let scenario_name = one_scenario_on_one_backend(&sides, [a, b], scenario)?;
    let info = scenario::find(&scenario_name)?;
    let metric = metric.unwrap_or(info.headline).to_string();
    let better = info.declared(&metric).direction.better();
    let variants = fleet_variants(&sides, variant, &metric)?;
    let pairing = HostMatch::for_selectors(a, b);
    let mut comparisons = variants
        .iter()
        .map(|v| compare_variant(&sides, v, &metric, better, &pairing, judging.threshold))
        .collect::<Result<Vec<_>, _>>()?;
    // Every per-host and overall comparison of every variant is judged together.
    judge_together(
        &mut comparisons
            .iter_mut()
            .flat_map(|c| {
                std::iter::once(&mut c.overall)
                    .chain(c.per_host.iter_mut().map(|h| &mut h.comparison))
            })
            .collect::<Vec<_>>(),
        judging.alpha,
        judging.correction,
    );
    Ok(fleet_outcome(scenario_name, metric, &sides, comparisons))
}

/// The runs either selector picks, with which sides pick each. Picked from the listing, which
/// carries the host and backend; only picked runs are read, each once even when both
/// selectors pick it.
fn pick(
    store: &Store,
    selectors: [&Selector; 2],
    scenario: Option<&str>,
) -> Result<Vec<([bool; 2], RunRecord)>, Error> {
    let mut picked = Vec::new();
    for l in store.list(usize::MAX)? {
        if scenario.is_some_and(|s| s != l.scenario) {
            continue;
        }
        let host = HostFingerprint::of_listing(&l);
        let on = selectors.map(|sel| sel.matches_host(&host, l.backend));
        if on.contains(&true) {
            picked.push((on, store.load(&l.run_id)?));
        }
    }
    Ok(picked)
}

/// The one scenario both sides' runs share, refusing an empty side, several scenarios or
/// both backends.
fn one_scenario_on_one_backend(
    sides: &[Vec<&RunRecord>; 2],
    [a, b]: [&Selector; 2],
    scenario: Option<&str>,
) -> Result<String, Error> {
    for (side, sel) in sides.iter().zip([a, b]) {
        if side.is_empty() {
            return Err(StoreError::NoSuchRun(match scenario {
                Some(s) => format!("{sel} (scenario {s})"),
                None => sel.to_string(),
            })
            .into());
        }
    }
    let all = || sides.iter().flatten();
    let names: std::collections::BTreeSet<&str> = all().map(|r| r.scenario.as_str()).collect();
    if names.len() > 1 {
        return Err(InputError::BadValue {
            key: "--scenario".into(),
            value: String::new(),
            why: format!(
                "the selectors match runs of several scenarios ({}): name one with --scenario",
                names.into_iter().collect::<Vec<_>>().join(", ")
            ),
        }
        .into());
    }
    let backends: std::collections::BTreeSet<String> =
        all().map(|r| r.backend.to_string()).collect();
    if backends.len() > 1 {
        return Err(InputError::BadValue {
            key: "selector".into(),
            value: format!("{a} / {b}"),
            why: "they match both kvm and model runs: add backend=kvm or backend=model".into(),
        }
        .into());
    }
    Ok(sides[0][0].scenario.clone())
}

/// Whether some run of `runs` has `metric` for variant `v`.
fn has_metric(runs: &[&RunRecord], v: &str, metric: &str) -> bool {
    runs.iter().any(|r| {
        r.variant(v)
            .is_some_and(|x| x.is_ok() && x.metrics.contains_key(metric))
    })
}

/// The variants to compare: the one asked for, else every variant both sides ran with the
/// metric, in side A's order.
fn fleet_variants(
    sides: &[Vec<&RunRecord>; 2],
    variant: Option<&str>,
    metric: &str,
) -> Result<Vec<String>, Error> {
    let variants: Vec<String> = match variant {
        Some(v) => vec![v.to_string()],
        None => {
            let mut vs: Vec<String> = Vec::new();
            for r in &sides[0] {
                for v in &r.variants {
                    if !vs.contains(&v.name)
                        && has_metric(&sides[0], &v.name, metric)
                        && has_metric(&sides[1], &v.name, metric)
                    {
                        vs.push(v.name.clone());
                    }
                }
            }
            vs
        }
    };
    if variants.is_empty() {
        return Err(InputError::NoSharedVariant.into());
    }
    Ok(variants)
}

/// Variant `v` across the fleet: per matched host, and overall (not judged yet).
fn compare_variant(
    sides: &[Vec<&RunRecord>; 2],
    v: &str,
    metric: &str,
    better: Better,
    pairing: &HostMatch,
    threshold: f64,
) -> Result<FleetComparison, Error> {
    for (side, name) in sides.iter().zip(['A', 'B']) {
        if !has_metric(side, v, metric) {
            return Err(InputError::MissingMetric {
                side: name,
                metric: metric.to_string(),
                variant: v.to_string(),
            }
            .into());
        }
    }
    let unit = sides[0]
        .iter()
        .find_map(|r| r.variant(v).and_then(|x| x.metrics.get(metric)))
        .map_or(String::new(), |m| m.unit.clone());
    let with_metric = |i: usize| -> Vec<&RunRecord> {
        sides[i]
            .iter()
            .copied()
            .filter(|r| {
                r.variant(v)
                    .is_some_and(|x| x.is_ok() && x.metrics.contains_key(metric))
            })
            .collect()
    };
    let (ra, rb) = (with_metric(0), with_metric(1));
    let (ka, kb) = (by_key(pairing, &ra), by_key(pairing, &rb));
    let only = |x: &BTreeMap<String, Vec<&RunRecord>>, y: &BTreeMap<String, Vec<&RunRecord>>| {
        x.keys()
            .filter(|k| !y.contains_key(*k))
            .cloned()
            .collect::<Vec<_>>()
    };
    Ok(FleetComparison {
        variant: v.to_string(),
        only_a: only(&ka, &kb),
        only_b: only(&kb, &ka),
        per_host: per_host(&ka, &kb, v, (metric, better), &unit, threshold),
        overall: overall(&ra, &rb, v, (metric, better), &unit, threshold),
    })
}

/// Variant `v` on each host key both sides have.
fn per_host(
    ka: &BTreeMap<String, Vec<&RunRecord>>,
    kb: &BTreeMap<String, Vec<&RunRecord>>,
    v: &str,
    (metric, better): (&str, Better),
    unit: &str,
    threshold: f64,
) -> Vec<HostComparison> {
    let hosts_of = |runs: &[&RunRecord]| {
        let mut h: Vec<HostFingerprint> =
            runs.iter().map(|r| HostFingerprint::of(&r.host)).collect();
        h.sort();
        h.dedup();
        h
    };
    let mut out = Vec::new();
    for (key, runs_a) in ka {
        let Some(runs_b) = kb.get(key) else { continue };
        let (Some(xa), Some(xb)) = (
            pooled_samples(runs_a.iter().copied(), v, metric),
            pooled_samples(runs_b.iter().copied(), v, metric),
        ) else {
            continue;
        };
        let label = if key.is_empty() {
            "all hosts"
        } else {
            key.as_str()
        };
        out.push(HostComparison {
            host: key.clone(),
            a_hosts: hosts_of(runs_a),
            b_hosts: hosts_of(runs_b),
            comparison: crate::analysis::compare::ab(
                metric,
                unit,
                (&format!("A:{v} on {label}"), &xa),
                (&format!("B:{v} on {label}"), &xb),
                threshold,
                seed_for(DEFAULT_SEED, &["fleet", v, key]),
            )
            .judged_by(better),
        });
    }
    out
}

/// Variant `v` over every host of each side: one value per host (its median of per-run
/// medians), so a host with many runs weighs no more than one with a single run.
fn overall(
    ra: &[&RunRecord],
    rb: &[&RunRecord],
    v: &str,
    (metric, better): (&str, Better),
    unit: &str,
    threshold: f64,
) -> AbComparison {
    let host_medians = |runs: &[&RunRecord]| -> Vec<f64> {
        let mut per: BTreeMap<HostFingerprint, Vec<f64>> = BTreeMap::new();
        for r in runs {
            if let Some(m) = r.variant(v).and_then(|x| x.metrics.get(metric)) {
                per.entry(HostFingerprint::of(&r.host))
                    .or_default()
                    .push(m.median);
            }
        }
        per.values().map(|ms| median(ms)).collect()
    };
    let (ma, mb) = (host_medians(ra), host_medians(rb));
    crate::analysis::compare::ab(
        metric,
        unit,
        (&format!("A:{v} ({} hosts)", ma.len()), &ma),
        (&format!("B:{v} ({} hosts)", mb.len()), &mb),
        threshold,
        seed_for(DEFAULT_SEED, &["fleet", v, "overall"]),
    )
    .judged_by(better)
}

/// The outcome of judged comparisons: regressions, the comparisons too small to judge, and
/// the busy hosts that confound them.
fn fleet_outcome(
    scenario: String,
    metric: String,
    sides: &[Vec<&RunRecord>; 2],
    comparisons: Vec<FleetComparison>,
) -> FleetOutcome {
    let regression = comparisons.iter().any(|c| {
        c.overall.verdict == MetricClass::Slower
            || c.per_host
                .iter()
                .any(|h| h.comparison.verdict == MetricClass::Slower)
    });
    let too_few = comparisons
        .iter()
        .filter(|c| !c.overall.enough_samples)
        .map(|c| {
            format!(
                "{} overall (n = {} vs {} hosts)",
                c.variant, c.overall.n[1], c.overall.n[0]
            )
        })
        .collect();
    let needed = needed_to_judge(comparisons.iter().map(|c| &c.overall));
    let busy = sides.each_ref().map(|runs| busy_runs(runs.iter().copied()));
    let confounded = busy.iter().any(|b| !b.is_empty());
    let beyond_busy_noise = beyond_busy_noise(comparisons.iter().flat_map(|c| {
        std::iter::once(&c.overall)
            .chain(c.per_host.iter().map(|h| &h.comparison))
            .map(|x| (&x.verdict, least_slowdown(x)))
    }));
    FleetOutcome {
        scenario,
        metric,
        runs: [sides[0].len(), sides[1].len()],
        comparisons,
        gate: Gate {
            regression,
            too_few,
            needed,
            busy,
            confounded,
            beyond_busy_noise,
        },
    }
}

/// Samples per side with which every comparison too thin to judge could be judged: what each
/// one's verdict said would decide it (its family's correction included), and never fewer
/// than the rule's minimum at its level.
fn needed_to_judge<'a>(comparisons: impl Iterator<Item = &'a AbComparison>) -> usize {
    comparisons
        .filter(|c| !c.enough_samples)
        .map(|c| {
            let floor = crate::analysis::compare::min_n(c.alpha);
            c.undecided
                .and_then(|u| u.needed())
                .map_or(floor, |n| n.max(floor))
        })
        .max()
        .unwrap_or(0)
}

/// Runs by their host's pairing key.
fn by_key<'a>(pairing: &HostMatch, runs: &[&'a RunRecord]) -> BTreeMap<String, Vec<&'a RunRecord>> {
    let mut m: BTreeMap<String, Vec<&RunRecord>> = BTreeMap::new();
    for &r in runs {
        m.entry(pairing.key(&HostFingerprint::of(&r.host)))
            .or_default()
            .push(r);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The A/A memory pair on this host: 10 backings of 6 against 6, judged together at the
    /// gate's level. Six a side is above the rule's minimum, yet 10 · 2/924 > 0.01: the gate
    /// must ask for the 7 that can judge, not the minimum of one comparison alone.
    #[test]
    fn the_gate_asks_for_the_samples_the_family_needs() {
        let a = [4.30, 4.33, 4.35, 4.28, 4.40, 4.31];
        let b = [4.27, 4.26, 4.33, 4.29, 4.25, 4.30];
        let mut family: Vec<AbComparison> = (0..10)
            .map(|i| {
                crate::analysis::compare::ab("ns_per_page", "us", ("A", &a), ("B", &b), 0.05, i)
            })
            .collect();
        judge_together(
            &mut family.iter_mut().collect::<Vec<_>>(),
            crate::analysis::verdict::GATE_ALPHA,
            crate::analysis::verdict::Correction::Holm,
        );
        assert!(family.iter().all(|c| !c.enough_samples), "{family:?}");
        assert_eq!(needed_to_judge(family.iter()), 7);
        assert_eq!(needed_to_judge(std::iter::empty()), 0);
    }

    #[test]
    fn a_slowdown_beyond_what_a_busy_host_does_is_still_called() {
        let slower = MetricClass::Slower;
        // 1.7x was an A/A pair on a busy host: not enough, whatever its interval.
        assert!(!beyond_busy_noise([(&slower, 1.7)]));
        assert!(!beyond_busy_noise([(&slower, BUSY_INFLATION - 0.01)]));
        assert!(beyond_busy_noise([(&slower, BUSY_INFLATION)]));
        // Only slowdowns count: a large speed-up is never a regression.
        assert!(!beyond_busy_noise([(&MetricClass::Faster, 10.0)]));
        assert!(beyond_busy_noise([
            (&MetricClass::Faster, 10.0),
            (&slower, 1.2),
            (&slower, 9.0)
        ]));
    }

    #[test]
    fn thresholds_read_as_percent_or_fraction_and_stay_in_range() {
        assert!((parse_threshold("5%").unwrap() - 0.05).abs() < 1e-12);
        assert!((parse_threshold("0.05").unwrap() - 0.05).abs() < 1e-12);
        assert!((parse_threshold("5").unwrap() - 0.05).abs() < 1e-12);
        assert!(parse_threshold("150%").is_err());
        assert!(parse_threshold("five").is_err());
    }
}
