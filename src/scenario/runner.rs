//! The measurement loop shared by every scenario: warm-up, repetitions with the variants
//! interleaved, per-variant failure isolation, and assembly of the run record.

use std::time::SystemTime;

use std::collections::BTreeMap;

use super::{Params, ScenarioInfo};
use crate::error::Error;
use crate::record::{RunRecord, VariantRecord, VariantStatus};
use hvlab_core::Backend;
use hvlab_core::error::BackendError;

/// What the user asked for: the scenario's parameters, typed (the registry's [`Params`] say
/// which scenario; a scenario's own code sees its own type), and how to repeat.
#[derive(Debug, Clone)]
pub struct RunRequest<P = Params> {
    /// The parameters.
    pub params: P,
    /// Variants to run; empty means all.
    pub variants: Vec<String>,
    /// Measured repetitions per variant.
    pub reps: u32,
    /// Discarded repetitions per variant before measuring.
    pub warmup: u32,
    /// Seed for every resampling and random choice in the run.
    pub seed: u64,
}

/// "hvlab" in ASCII: the default seed, so runs are reproducible unless asked otherwise.
pub const DEFAULT_SEED: u64 = 0x68_766c_6162;

impl<P> RunRequest<P> {
    /// `params` on every variant, 20 repetitions after 2 warm-up, with the default seed.
    pub fn new(params: P) -> RunRequest<P> {
        RunRequest {
            params,
            variants: Vec::new(),
            reps: 20,
            warmup: 2,
            seed: DEFAULT_SEED,
        }
    }
}

/// Progress reporting; the CLI shows a bar on a terminal and nothing otherwise.
pub trait Progress {
    /// A phase of `total` steps begins.
    fn start(&self, label: &str, total: u64);
    /// One step done.
    fn step(&self, detail: &str);
    /// The phase is over.
    fn finish(&self);
}

/// No progress output.
#[derive(Debug, Default)]
pub struct Silent;

impl Progress for Silent {
    fn start(&self, _: &str, _: u64) {}
    fn step(&self, _: &str) {}
    fn finish(&self) {}
}

/// What a scenario's analysis hands back: per-variant results (the verdicts that answer its
/// question are made from them, [`super::judge_question`]).
#[derive(Debug, Clone)]
pub struct ScenarioOutcome {
    /// Per-variant results.
    pub variants: Vec<VariantRecord>,
}

/// The status of a variant that could not produce samples: unsupported (the host's
/// limitation) or failed, with the whole cause chain (the ioctl and its errno, the syscall
/// under a guest-memory failure), not only the outermost message.
pub fn failure_status(err: &Error) -> VariantStatus {
    let why = err.chain().join(": ");
    match err {
        Error::Input(_) => VariantStatus::Unsupported(why),
        Error::Backend(BackendError::Unsupported(why)) => VariantStatus::Unsupported(why.clone()),
        _ => VariantStatus::Failed(why),
    }
}

/// What [`repeat`] measured: each variant's samples or why it has none, and what each
/// watched repetition's trial saw of the host's noise.
#[derive(Debug)]
pub struct Repeated<T> {
    /// Per variant, in order.
    pub results: Vec<Result<Vec<T>, VariantStatus>>,
    /// One per trial, when the trials were watched (`real_time`).
    pub reps: Vec<hvlab_core::noise::RepNoise>,
}

/// Runs `trial(variant index)` `warmup + reps` times per variant. Variants are interleaved
/// round-robin so slow drift on a shared machine spreads over all of them instead of biasing
/// whichever ran last. A variant whose trial fails stops there and keeps its error; the
/// others go on. `real_time`: the trials are timed on this host, so each one's noise is
/// watched (the model's exact samples skip the two /proc reads and two syscalls a trial).
pub fn repeat<T, P>(
    variants: &[String],
    request: &RunRequest<P>,
    real_time: bool,
    progress: &dyn Progress,
    mut trial: impl FnMut(usize) -> Result<T, Error>,
) -> Repeated<T> {
    let mut out: Vec<Result<Vec<T>, VariantStatus>> = variants
        .iter()
        .map(|_| Ok(Vec::with_capacity(request.reps as usize)))
        .collect();
    let mut reps = Vec::new();
    let rounds = request.warmup + request.reps;
    progress.start("measuring", u64::from(rounds) * variants.len() as u64);
    for round in 0..rounds {
        for (vi, name) in variants.iter().enumerate() {
            progress.step(name);
            let Ok(samples) = &mut out[vi] else { continue };
            // The measuring thread's switches and the runnable tasks, around (not inside) the
            // timed trial.
            let watch = real_time.then(hvlab_host::noise::RepWatch::start);
            let result = trial(vi);
            reps.extend(watch.map(hvlab_host::noise::RepWatch::end));
            match result {
                Ok(sample) if round >= request.warmup => samples.push(sample),
                Ok(_) => {}
                Err(e) => out[vi] = Err(failure_status(&e)),
            }
        }
    }
    progress.finish();
    Repeated { results: out, reps }
}

/// Now, as RFC 3339 UTC with second precision, by the host's clock: in a kernel under test on
/// the instruction clock, whose RTC starts at one date on every boot, the guest's clock moved
/// by the offset its `/init` gives ([`host_time`]).
pub fn now_rfc3339() -> String {
    let offset = std::env::var(hvlab_core::host::Clock::GUEST_OFFSET_ENV).ok();
    humantime::format_rfc3339_seconds(host_time(SystemTime::now(), offset.as_deref())).to_string()
}

/// `now` moved by `offset` seconds (as [`hvlab_core::host::Clock::GUEST_OFFSET_ENV`] gives
/// them; `now` itself without one, or with one that does not read as seconds).
fn host_time(now: SystemTime, offset: Option<&str>) -> SystemTime {
    let Some(secs) = offset.and_then(|o| o.trim().parse::<i64>().ok()) else {
        return now;
    };
    let by = std::time::Duration::from_secs(secs.unsigned_abs());
    let moved = if secs >= 0 {
        now.checked_add(by)
    } else {
        now.checked_sub(by)
    };
    moved.unwrap_or(now)
}

pub use crate::record::run_id_suffix;

/// Builds the run record around a scenario's outcome.
pub fn assemble<P>(
    info: &ScenarioInfo,
    backend: &dyn Backend,
    mut params: BTreeMap<String, serde_json::Value>,
    request: &RunRequest<P>,
    started_at: String,
    outcome: ScenarioOutcome,
) -> RunRecord {
    let suffix = run_id_suffix();
    params.insert("reps".into(), request.reps.into());
    params.insert("warmup".into(), request.warmup.into());
    params.insert("seed".into(), request.seed.into());
    RunRecord {
        run_id: format!("{started_at}-{}-{}-{suffix}", info.name, backend.kind()),
        scenario: info.name.to_string(),
        backend: backend.kind(),
        profile: backend.profile_name(),
        host: backend.host().clone(),
        params,
        started_at,
        finished_at: now_rfc3339(),
        variants: outcome.variants,
        verdicts: Vec::new(),
        noise: None,
        warnings: Vec::new(),
        tag: None,
        baseline: None,
        calls: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_clock_moves_by_the_offset_its_init_gives() {
        let guest = humantime::parse_rfc3339("2000-01-01T00:00:05Z").expect("a date");
        let host = humantime::parse_rfc3339("2026-11-29T17:00:05Z").expect("a date");
        let offset = host.duration_since(guest).expect("later").as_secs();
        assert_eq!(host_time(guest, Some(&offset.to_string())), host);
        assert_eq!(host_time(host, Some(&format!("-{offset}"))), guest);
        // None, or one that is not seconds: the clock as it reads.
        assert_eq!(host_time(guest, None), guest);
        assert_eq!(host_time(guest, Some("soon")), guest);
    }

    #[test]
    fn warmup_is_discarded_and_variants_interleave() {
        let names = vec!["a".to_string(), "b".to_string()];
        let req = RunRequest {
            reps: 3,
            warmup: 2,
            ..RunRequest::new(())
        };
        let mut calls = Vec::new();
        let out = repeat(&names, &req, true, &Silent, |vi| {
            calls.push(vi);
            Ok(calls.len())
        });
        assert_eq!(out.reps.len(), 10, "every watched trial says its noise");
        let out = out.results;
        assert_eq!(calls, vec![0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
        assert_eq!(out[0].as_ref().unwrap(), &vec![5, 7, 9]);
        assert_eq!(out[1].as_ref().unwrap(), &vec![6, 8, 10]);
    }

    #[test]
    fn a_failing_variant_is_isolated_and_says_why() {
        let names = vec!["good".to_string(), "pmu".to_string(), "broken".to_string()];
        let req = RunRequest {
            reps: 4,
            warmup: 0,
            ..RunRequest::new(())
        };
        let failed = || std::io::Error::other("The guest did not signal as expected: triple fault");
        let out = repeat(&names, &req, false, &Silent, |vi| match vi {
            1 => Err(BackendError::Unsupported(
                "needs KVM_CAP_PMU_CAPABILITY, which this host's KVM does not offer".into(),
            )
            .into()),
            2 => Err(BackendError::Failed(Box::new(failed())).into()),
            _ => Ok(()),
        });
        assert!(out.reps.is_empty(), "unwatched trials say nothing");
        let out = out.results;
        assert_eq!(out[0].as_ref().unwrap().len(), 4);
        assert!(matches!(
            out[1].as_ref().unwrap_err(),
            VariantStatus::Unsupported(why) if why.contains("KVM_CAP_PMU_CAPABILITY")
        ));
        assert!(matches!(
            out[2].as_ref().unwrap_err(),
            VariantStatus::Failed(_)
        ));
    }

    #[test]
    fn a_failure_keeps_its_cause_chain() {
        /// A backend's failure with a cause below it, as the kvm backend's are.
        #[derive(Debug, thiserror::Error)]
        #[error("munlock the pinned buffer: {0}")]
        struct Munlock(#[source] std::io::Error);
        let io = std::io::Error::from_raw_os_error(libc::ENOMEM);
        let err: Error = BackendError::Failed(Box::new(Munlock(io))).into();
        let VariantStatus::Failed(why) = failure_status(&err) else {
            panic!("a host operation failing is a failure");
        };
        assert!(why.contains("munlock the pinned buffer"), "{why}");
        assert!(why.contains("Cannot allocate memory"), "{why}");
    }
}
