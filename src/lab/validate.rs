//! `hvlab validate`: the model against the kvm backend on this host, at the points each
//! scenario names (not those calibration used), metric by metric.

use crate::analysis::validate::{Check, Rule};
use crate::lab::Error;
use crate::record::RunRecord;
use crate::scenario::runner::{DEFAULT_SEED, Progress, RunRequest};
use crate::scenario::{self, Kind};
use hvlab_core::Backend;
use hvlab_core::host::{Clock, HostInfo};

/// The allowed error on times, percent, on the wall clock: beyond the kvm side's own spread,
/// what a model of a noisy host can promise.
pub const WALL_TOLERANCE_PCT: f64 = 15.0;

/// The allowed error on times, percent, on QEMU's instruction clock: there a time is a count
/// of guest instructions, the same from one boot to the next (every time of 100 µs or more
/// within 0.31% across boots), so a model that has the mechanism agrees within 1%.
pub const ICOUNT_TOLERANCE_PCT: f64 = 1.0;

/// The tolerance on times when none is given: the clock's own.
pub fn default_tolerance(clock: Clock) -> f64 {
    match clock {
        Clock::Wall => WALL_TOLERANCE_PCT,
        Clock::Icount => ICOUNT_TOLERANCE_PCT,
    }
}

/// How times are judged on `host`: within `tolerance` percent, except on an emulated CPU
/// timed by the wall clock, where every exit is emulated at a speed that has nothing to do
/// with the kernel's own (shown, not judged). On the instruction clock an emulated CPU's times
/// are instruction counts: judged.
pub fn time_rule(host: &HostInfo, tolerance: f64) -> Rule {
    match host.clock {
        Clock::Icount => Rule::Within(tolerance),
        Clock::Wall if host.cpu_emulated() => Rule::Unjudged,
        Clock::Wall => Rule::Within(tolerance),
    }
}

/// The checks of one point variant, judged as `host`'s clock asks, each time in the clock's
/// unit (instructions on the instruction clock).
pub fn judge_variant(
    checks: fn(&RunRecord, &RunRecord, &str, Rule) -> Vec<Check>,
    host: &HostInfo,
    tolerance: f64,
    predicted: &RunRecord,
    real: &RunRecord,
    variant: &str,
) -> Vec<Check> {
    checks(predicted, real, variant, time_rule(host, tolerance))
        .into_iter()
        .map(|mut c| {
            c.unit = host.clock.unit(&c.unit);
            c
        })
        .collect()
}

/// What validation found, and the noise it was measured in.
#[derive(Debug, Clone)]
pub struct Validation {
    /// One per metric judged.
    pub checks: Vec<Check>,
    /// The noise of each kvm run that the busy rule called busy.
    pub busy: Vec<hvlab_core::noise::Noise>,
    /// Point variants one side could not run, so none of their metrics was compared: said,
    /// never dropped in silence.
    pub unjudged: Vec<Unjudged>,
}

/// A validation point's variant that produced no check, and why.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Unjudged {
    /// Scenario.
    pub scenario: String,
    /// Variant.
    pub variant: String,
    /// The side that did not run it: `kvm` (the host's limitation) or `model` (a profile or
    /// mechanism the model lacks here).
    pub side: &'static str,
    /// Its status: `unsupported: ...` or `failed: ...`.
    pub status: String,
}

impl Validation {
    /// Checks that failed.
    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|c| !c.pass).count()
    }

    /// Whether a failure may be the host's noise: some check failed and a kvm run was busy.
    /// Then `validate` cannot judge (exit 4) rather than fail (exit 1).
    pub fn cannot_judge(&self) -> bool {
        self.failed() > 0 && !self.busy.is_empty()
    }
}

/// The noise of a kvm run whose failures may be the host's: one the busy rule called busy, on a
/// clock that load can move. On the instruction clock the guest's own probe calls an emulated
/// vCPU busy (it waits on the emulator), but load cannot move an instruction count: a failure
/// there is the model's, never the host's noise.
fn busy_noise(real: &RunRecord, clock: Clock) -> Option<&hvlab_core::noise::Noise> {
    real.noise
        .as_ref()
        .filter(|n| n.is_busy() && clock.load_moves_times())
}

/// Runs every scenario's validation point on both backends and judges each metric: times
/// within the kvm side's own spread plus `tolerance` percent (shown, not judged, where this
/// host's CPU is emulated and timed by the wall clock), counts exactly. `keep` gets every run, to store it.
pub fn validate<E: From<Error>>(
    kvm: &mut dyn Backend,
    model: &mut dyn Backend,
    host: &HostInfo,
    tolerance: f64,
    progress: &dyn Progress,
    mut keep: impl FnMut(&mut RunRecord) -> Result<(), E>,
) -> Result<Validation, E> {
    let mut checks = Vec::new();
    let mut busy = Vec::new();
    let mut unjudged = Vec::new();
    for s in Kind::ALL {
        let Some(point) = s.validation(host) else {
            continue;
        };
        let info = s.info();
        let request = RunRequest {
            params: point.params,
            variants: point.variants.iter().map(|v| v.to_string()).collect(),
            reps: info.default_reps.min(10),
            warmup: 1,
            seed: DEFAULT_SEED,
        };
        let mut real = scenario::run(kvm, &request, progress).map_err(Error::from)?;
        let model_request = RunRequest {
            params: point.model_params,
            ..request
        };
        let mut predicted = scenario::run(model, &model_request, progress).map_err(Error::from)?;
        busy.extend(busy_noise(&real, host.clock).cloned());
        // Internal: left out of the default report, `runs` and the fleet page.
        real.tag = Some(crate::record::RunTag::Validate);
        predicted.tag = Some(crate::record::RunTag::Validate);
        keep(&mut real)?;
        keep(&mut predicted)?;
        for v in point.variants {
            let not_run = [("kvm", &real), ("model", &predicted)]
                .into_iter()
                .filter_map(|(side, r)| {
                    let status = match r.variant(v) {
                        Some(x) if x.is_ok() => return None,
                        Some(x) => x.status.to_string(),
                        None => "not run".to_string(),
                    };
                    Some(Unjudged {
                        scenario: info.name.to_string(),
                        variant: (*v).to_string(),
                        side,
                        status,
                    })
                })
                .collect::<Vec<_>>();
            if not_run.is_empty() {
                checks.extend(judge_variant(
                    point.checks,
                    host,
                    tolerance,
                    &predicted,
                    &real,
                    v,
                ));
            } else {
                unjudged.extend(not_run);
            }
        }
    }
    Ok(Validation {
        checks,
        busy,
        unjudged,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{MetricRecord, VariantRecord};
    use std::collections::BTreeMap;

    /// This host as a kernel under test would see it: QEMU TCG, on `clock`.
    fn tcg_host(clock: Clock) -> HostInfo {
        let mut host = crate::lab::host::probe();
        host.hypervisor = Some("TCGTCGTCGTCG".into());
        host.clock = clock;
        host
    }

    /// An exits run of `backend` whose `variant` has these roundtrip samples, ns.
    fn exits_run(backend: hvlab_core::BackendKind, variant: &str, samples: &[f64]) -> RunRecord {
        let metric = MetricRecord::new("ns", samples.to_vec(), DEFAULT_SEED);
        let mut metrics = BTreeMap::new();
        metrics.insert("roundtrip_ns".to_string(), metric);
        RunRecord {
            run_id: format!("{backend:?}"),
            scenario: "exits".into(),
            backend,
            profile: None,
            host: tcg_host(Clock::Icount),
            params: BTreeMap::new(),
            started_at: "2026-11-29T17:00:00Z".into(),
            finished_at: "2026-11-29T17:00:01Z".into(),
            variants: vec![VariantRecord::ok(variant, metrics, Vec::new())],
            verdicts: Vec::new(),
            noise: None,
            warnings: Vec::new(),
            tag: None,
            baseline: None,
            calls: Vec::new(),
        }
    }

    /// The exits point's checks of `variant`, the model predicting `predicted` ns against
    /// kvm samples of 6,500 ns (as deterministic as the instruction clock makes them).
    fn judged(host: &HostInfo, tolerance: f64, predicted: f64) -> Check {
        let kvm = exits_run(
            hvlab_core::BackendKind::Kvm,
            "mmio-read",
            &[6_499.0, 6_500.0, 6_500.0, 6_500.0, 6_501.0],
        );
        let model = exits_run(hvlab_core::BackendKind::Model, "mmio-read", &[predicted]);
        let point = Kind::Exits
            .validation(host)
            .expect("exits has a validation point");
        let checks = judge_variant(point.checks, host, tolerance, &model, &kvm, "mmio-read");
        assert_eq!(checks.len(), 1, "{checks:?}");
        checks[0].clone()
    }

    #[test]
    fn on_the_instruction_clock_times_are_judged_within_one_percent_in_instructions() {
        let host = tcg_host(Clock::Icount);
        let tolerance = default_tolerance(host.clock);
        assert_eq!(tolerance, ICOUNT_TOLERANCE_PCT);
        let close = judged(&host, tolerance, 6_550.0);
        assert!(close.judged && close.pass, "{close:?}");
        assert_eq!(close.unit, "insn");
        assert_eq!(close.tolerance_pct, 1.0);
        // 1.5% above the kvm side's top: a miss, though 15% would pass it on the wall clock.
        let far = judged(&host, tolerance, 6_598.0);
        assert!(far.judged && !far.pass, "{far:?}");
        let below = judged(&host, tolerance, 6_430.0);
        assert!(below.judged && !below.pass, "{below:?}");
        // The model priced an MMIO read as a PIO exit: 46% below, a failure.
        assert!(!judged(&host, tolerance, 3_490.0).pass);
    }

    /// What the 6.12 guest's probe said of its run (CI, /tmp/ci55): one other runnable task
    /// on its one vCPU.
    fn guest_noise() -> hvlab_core::noise::Noise {
        hvlab_core::noise::Noise {
            cores: 1,
            load1: [1.2, 1.4],
            runnable_others: [1, 1],
            cpu_pressure_some_pct: None,
            cpu_pressure_full_pct: None,
            steal_pct: None,
            involuntary_switches: 0,
            voluntary_switches: 0,
            migrations: None,
            involuntary_per_rep: Vec::new(),
            clocksource: "tsc".into(),
            clocksource_stable: true,
            wall_s: 2.0,
            pinned_cpus: None,
            quiet_wait: None,
            own_threads: 1,
            busy: vec![hvlab_core::noise::BusyReason::Runnable {
                others: 1,
                cores: 1,
            }],
        }
    }

    #[test]
    fn a_busy_probe_makes_a_miss_unjudgeable_on_the_wall_clock_only() {
        let mut real = exits_run(hvlab_core::BackendKind::Kvm, "mmio-read", &[6_500.0]);
        real.noise = Some(guest_noise());
        assert!(busy_noise(&real, Clock::Wall).is_some());
        assert!(busy_noise(&real, Clock::Icount).is_none());
        if let Some(n) = real.noise.as_mut() {
            n.busy.clear();
        }
        assert!(busy_noise(&real, Clock::Wall).is_none());
    }

    #[test]
    fn on_the_wall_clock_an_emulated_cpu_shows_times_and_a_real_one_judges_them() {
        let wall_tcg = tcg_host(Clock::Wall);
        assert_eq!(default_tolerance(wall_tcg.clock), WALL_TOLERANCE_PCT);
        let shown = judged(&wall_tcg, WALL_TOLERANCE_PCT, 3_490.0);
        assert!(!shown.judged && shown.pass, "{shown:?}");
        assert_eq!(shown.unit, "ns");
        let mut real = tcg_host(Clock::Wall);
        real.hypervisor = None;
        assert!(matches!(time_rule(&real, 15.0), Rule::Within(t) if t == 15.0));
        assert!(judged(&real, WALL_TOLERANCE_PCT, 7_000.0).pass);
        assert!(!judged(&real, WALL_TOLERANCE_PCT, 3_490.0).pass);
    }
}
