//! The model's prediction of the change a kab measured, on this host and on the reporter's.

use std::path::PathBuf;

use serde::Serialize;

use crate::analysis::statistics::median;
use crate::lab::Error;
use crate::record::RunRecord;
use crate::scenario;
use crate::scenario::runner::DEFAULT_SEED;

use crate::lab::fidelity::memory_patch::{self, MemoryPrediction, NoPrediction, PrefetchChoice};
use crate::lab::fidelity::patch::{self, PatchRow, StrategyChoice, Wait};
use crate::lab::fidelity::srcu::{OnReportersHost, on_reporters_host};
use crate::record::pooled;

use super::judge::of_scenario;

/// The model's prediction of the change a kab measured: on this host under the same
/// accelerator (priced by the base kernel calibrated in its own guest), and on the host where
/// the thread behind the strategy saw the bug. Every figure here is predicted, none measured.
#[derive(Debug, Clone, Serialize)]
pub struct KabPrediction {
    /// `predicted`.
    pub label: &'static str,
    /// The model's strategy for A and for B, when the model knows the kernel.
    pub strategies: [Option<StrategyChoice>; 2],
    /// Why a side's kernel is not one the model knows (then nothing is predicted).
    pub unknown: Vec<String>,
    /// On this host, under this accelerator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub this_host: Option<ThisHostPrediction>,
    /// Why there is no prediction for this host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub this_host_missing: Option<ThisHostMissing>,
    /// On the reporter's host: A's strategy, then B's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reporters_host: Option<[OnReportersHost; 2]>,
}

/// Why the model has no prediction for this host (the renderer words it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ThisHostMissing {
    /// The base's calibration in its guest was not kept or did not come back.
    CalibrationNotKept,
    /// No profile of A is cached for this accelerator, and `--no-calibrate` was given.
    NotCalibrated,
    /// A side brought back no lifecycle run.
    NoLifecycleRun,
}

/// The prediction on this host.
#[derive(Debug, Clone, Serialize)]
pub struct ThisHostPrediction {
    /// The calibrated profile's name.
    pub profile: String,
    /// Its file.
    pub profile_path: PathBuf,
    /// Calibrated in this kab's first boot (else taken from the cache).
    pub calibrated_now: bool,
    /// Variant by variant, A's strategy against B's.
    pub variants: Vec<VariantPrediction>,
    /// Each side's prediction against its measurement (`hvlab fidelity`'s rows for this kab).
    pub rows: [Vec<PatchRow>; 2],
}

/// One variant as the model predicts it on both kernels.
#[derive(Debug, Clone, Serialize)]
pub struct VariantPrediction {
    /// The variant.
    pub variant: String,
    /// Stalls per VM built (medians), A and B.
    pub stalls: [f64; 2],
    /// The waits the model predicts on either kernel, with the waiting ioctl in jiffies.
    pub waits: Vec<PredictedWait>,
    /// Whether each side's prediction agrees with what was measured (its row within).
    pub agrees: [Option<bool>; 2],
}

/// An ioctl the model has waiting for another's grace period on A, B or both.
#[derive(Debug, Clone, Serialize)]
pub struct PredictedWait {
    /// The ioctl that waits.
    pub ioctl: String,
    /// The registration it waits for.
    pub on: String,
    /// On which side the model has it wait.
    pub sides: [bool; 2],
    /// The waiting ioctl's median time in jiffies, A and B.
    pub jiffies: [f64; 2],
}

/// The runs of `scenario` that produced samples: a run kept only for its variants' failures
/// has nothing to predict against.
fn measured<'a>(side: &'a [RunRecord], scenario: &str) -> Vec<&'a RunRecord> {
    of_scenario(side, scenario)
        .into_iter()
        .filter(|r| r.produced_samples())
        .collect()
}

/// The memory model's `pf_fixed` for the change, from each side's `prefetch` against the
/// memory runs both sides measured.
pub(super) fn predict_memory(
    prefetch: [Result<PrefetchChoice, NoPrediction>; 2],
    sides: &[Vec<RunRecord>; 2],
) -> MemoryPrediction {
    let memory = scenario::Kind::Memory.name();
    let measured = [0, 1].map(|i| measured(&sides[i], memory));
    memory_patch::predict(prefetch, [&measured[0], &measured[1]])
}

/// The model's prediction of the change: on this host from the base's calibration, against
/// what both sides measured, and on the reporter's host from its built-in profile.
pub(super) fn predict(
    strategies: &[Result<StrategyChoice, String>; 2],
    sides: &[Vec<RunRecord>; 2],
    calibrated: Option<&(PathBuf, crate::model::profile::Profile)>,
    calibrated_now: bool,
    may_calibrate: bool,
    host: &hvlab_core::host::HostInfo,
) -> Result<KabPrediction, Error> {
    let unknown: Vec<String> = strategies
        .iter()
        .zip(["A", "B"])
        .filter_map(|(s, side)| s.as_ref().err().map(|why| format!("{side}: {why}")))
        .collect();
    let known = [strategies[0].clone().ok(), strategies[1].clone().ok()];
    let mut out = KabPrediction {
        label: "predicted",
        strategies: known.clone(),
        unknown,
        this_host: None,
        this_host_missing: None,
        reporters_host: None,
    };
    let [Some(sa), Some(sb)] = known else {
        return Ok(out);
    };
    out.reporters_host = Some([
        on_reporters_host(host, sa.strategy(), DEFAULT_SEED)?,
        on_reporters_host(host, sb.strategy(), DEFAULT_SEED)?,
    ]);
    let lifecycle = scenario::Kind::Lifecycle.name();
    let (ra, rb) = (
        measured(&sides[0], lifecycle),
        measured(&sides[1], lifecycle),
    );
    let Some((path, profile)) = calibrated else {
        out.this_host_missing = Some(if may_calibrate {
            ThisHostMissing::CalibrationNotKept
        } else {
            ThisHostMissing::NotCalibrated
        });
        return Ok(out);
    };
    if ra.is_empty() || rb.is_empty() {
        out.this_host_missing = Some(ThisHostMissing::NoLifecycleRun);
        return Ok(out);
    }
    let tolerance = patch::TOLERANCE_PCT;
    let (ma, rows_a) = patch::compare(&ra, sa.strategy(), profile, tolerance, DEFAULT_SEED)?;
    let (mb, rows_b) = patch::compare(&rb, sb.strategy(), profile, tolerance, DEFAULT_SEED)?;
    let agrees = |rows: &[PatchRow], v: &str| {
        rows.iter()
            .find(|r| r.variant == v)
            .map(|r| r.agreement == crate::lab::fidelity::Agreement::Within)
    };
    let variants = ma
        .variants
        .iter()
        .filter(|v| v.is_ok() && mb.variant(&v.name).is_some_and(|x| x.is_ok()))
        .map(|v| {
            let models = [&ma, &mb];
            let stalls = models.map(|m| median(&pooled(&[m], &v.name, "stalls")));
            let sets = models.map(|m| patch::waits(&[m], &v.name));
            let waits = sets[0]
                .union(&sets[1])
                .map(|w: &Wait| PredictedWait {
                    ioctl: w.ioctl.clone(),
                    on: w.on.clone(),
                    sides: [sets[0].contains(w), sets[1].contains(w)],
                    jiffies: models.map(|m| {
                        median(&pooled(&[m], &v.name, &format!("ioctl.{}_ms", w.ioctl)))
                            / patch::jiffy_ms(&[m])
                    }),
                })
                .collect();
            VariantPrediction {
                variant: v.name.clone(),
                stalls,
                waits,
                agrees: [agrees(&rows_a, &v.name), agrees(&rows_b, &v.name)],
            }
        })
        .collect();
    out.this_host = Some(ThisHostPrediction {
        profile: profile.name.clone(),
        profile_path: path.clone(),
        calibrated_now,
        variants,
        rows: [rows_a, rows_b],
    });
    Ok(out)
}

/// The model's estimate of an instruction delta in wall time, on real hosts: what the
/// instruction clock cannot say (on it an MSR write costs one instruction). Estimated, never
/// measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventEstimate {
    /// `estimate`.
    pub label: &'static str,
    /// The metric whose delta is priced (`roundtrip_ns`).
    pub metric: String,
    /// Its instruction delta (B − A, medians), per exit.
    pub delta_insn: f64,
    /// The MSR writes per exit B adds (moved ones only; 0 when unmoved or not counted).
    pub delta_msr_writes: f64,
    /// Whether the MSR writes were counted on both sides (else every instruction is priced
    /// as a plain one).
    pub msr_writes_counted: bool,
    /// The delta priced on each host: this host's kind first, then the thread's.
    pub on: Vec<PricedOn>,
}

/// Whose host a profile describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostRole {
    /// This host's kind.
    ThisHost,
    /// The host of the thread behind the scenario (its showcase's profile).
    ThreadHost,
}

/// The delta priced on one profile.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PricedOn {
    /// Whose host.
    pub role: HostRole,
    /// The profile.
    pub profile: String,
    /// The thread whose host it is (`003`), for [`HostRole::ThreadHost`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thread: Option<String>,
    /// The estimate, in ns per exit.
    pub ns: f64,
    /// The inputs, as the profile gives them: cycles per plain instruction (`alu_cycles`),
    /// cycles per MSR write (`msr_write_cycles`), the clock (`cpu_ghz`).
    pub insn_cycles: f64,
    /// See `insn_cycles`.
    pub msr_write_cycles: f64,
    /// See `insn_cycles`.
    pub ghz: f64,
}

/// What the estimate reads from a profile.
const PRICED_BY: &str = "the instruction-delta estimate";

/// The instruction delta of `delta_insn` per exit, `delta_msr` of them MSR writes, priced
/// on `profile`: the plain instructions at `alu_cycles` each (a dependent chain of
/// single-cycle ALU operations, the cheapest code retires no faster than one a cycle when it
/// is a chain; a patch's added C is priced as such, the lower bound of what it costs with
/// a cache miss), each MSR write at `msr_write_cycles` (serializing), over `cpu_ghz`. Mirrors
/// what `native_write_msr()` adds to `svm_vcpu_run()`/`vmx_vcpu_run()` on the host: the
/// WRMSR instruction, which the instruction clock counts as one.
pub fn price(
    profile: &crate::model::profile::Profile,
    delta_insn: f64,
    delta_msr: f64,
) -> Result<(f64, [f64; 3]), crate::model::profile::ProfileError> {
    let insn_cycles = profile.get("alu_cycles", PRICED_BY)?;
    let msr_write_cycles = profile.get("msr_write_cycles", PRICED_BY)?;
    let ghz = profile.get("cpu_ghz", PRICED_BY)?;
    let plain = delta_insn - delta_msr;
    let ns = (plain * insn_cycles + delta_msr * msr_write_cycles) / ghz;
    Ok((ns, [insn_cycles, msr_write_cycles, ghz]))
}

/// The profile of this host's kind the estimate prices on: the base's calibration when the
/// kab has one made on the wall clock (the kab's and the profile's own); else the built-in
/// `pvm-epyc`. A calibration made on the instruction clock is not used: its `cpu_ghz` is the
/// guest's TSC against instructions (one instruction a nanosecond), read from the very exits
/// whose delta is priced, so it would give the delta back as nanoseconds, not a wall time.
fn this_host_profile(
    calibrated: Option<&(PathBuf, crate::model::profile::Profile)>,
    clock: hvlab_core::host::Clock,
) -> Option<crate::model::profile::Profile> {
    match calibrated {
        Some((_, p)) if clock.is_wall() && p.clock.is_wall() => Some(p.clone()),
        _ => crate::model::profile::Profile::load("pvm-epyc").ok(),
    }
}

/// The thread behind `scenario` and its host's profile: the first showcase with a headline.
fn thread_host(scenario: &str) -> Option<(&'static str, &'static str)> {
    let kind = scenario::Kind::named(scenario).ok()?;
    kind.showcases()
        .into_iter()
        .find_map(|s| s.headline.map(|h| (h.thread, s.profile)))
}

/// Prices, beside every verdict whose exit roundtrip moved on the instruction clock, the
/// instruction delta in wall time on this host's kind and on the scenario's thread's host
/// (the model's estimate, labelled so). A profile that lacks a key is left out of the
/// estimate rather than guessed.
pub(super) fn price_events(
    verdicts: &mut [super::VariantVerdict],
    calibrated: Option<&(PathBuf, crate::model::profile::Profile)>,
    clock: hvlab_core::host::Clock,
) {
    let here = this_host_profile(calibrated, clock);
    for v in verdicts.iter_mut() {
        let Some(events) = v.events.as_ref().filter(|e| e.per_iteration) else {
            continue;
        };
        // Beside a roundtrip judged changed, or one whose events moved.
        let Some((metric, judged)) = events
            .instructions
            .as_ref()
            .filter(|(m, _)| m == "roundtrip_ns")
            .filter(|_| !v.instruction_clock.is_empty() || events.any_moved())
        else {
            continue;
        };
        let msr = events
            .host
            .iter()
            .find(|e| e.event == crate::analysis::calls::HostEvent::MsrWrite);
        let msr_writes_counted = msr.is_some_and(|e| e.per_unit.iter().all(Option::is_some));
        let delta_msr = events
            .delta(crate::analysis::calls::HostEvent::MsrWrite)
            .unwrap_or(0.0);
        let delta_insn = judged.delta_insn;
        let mut on = Vec::new();
        let thread = thread_host(&v.scenario);
        let profiles = [
            here.clone().map(|p| (HostRole::ThisHost, None, p)),
            thread.and_then(|(t, name)| {
                crate::model::profile::Profile::load(name)
                    .ok()
                    .map(|p| (HostRole::ThreadHost, Some(t.to_string()), p))
            }),
        ];
        for (role, thread, profile) in profiles.into_iter().flatten() {
            if let Ok((ns, [insn_cycles, msr_write_cycles, ghz])) =
                price(&profile, delta_insn, delta_msr)
            {
                on.push(PricedOn {
                    role,
                    profile: profile.name.clone(),
                    thread,
                    ns,
                    insn_cycles,
                    msr_write_cycles,
                    ghz,
                });
            }
        }
        if on.is_empty() {
            continue;
        }
        v.estimate = Some(EventEstimate {
            label: "estimate",
            metric: metric.clone(),
            delta_insn,
            delta_msr_writes: delta_msr,
            msr_writes_counted,
            on,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model's prediction of the 001 fix beside a real kab of it (the stored runs of
    /// one, trimmed): here, from the base calibrated in its guest, every order's stall count
    /// as measured, boot-activation still waiting on both kernels; on thread 001's host,
    /// about the 20 ms per VM creation the thread reported. A change the model does not know
    /// gets no prediction, and the reason says how to declare one.
    #[test]
    fn the_fix_is_predicted_here_and_where_it_was_reported() {
        use crate::lab::fidelity::patch::fixture;
        let runs = fixture::runs();
        let side = |s: &str| -> Vec<RunRecord> {
            fixture::side(&runs, "001-lifecycle-keyed.patch", s)
                .into_iter()
                .cloned()
                .collect()
        };
        let sides = [side("A"), side("B")];
        let release = "7.3.4+deb13-amd64";
        let fix = patch::KNOWN_CHANGES[0].sha256;
        let strategies = [
            patch::strategy_for(release, &[], None),
            patch::strategy_for(release, &[("fix.patch".into(), fix.into())], None),
        ];
        let profile = (PathBuf::from("fixture.toml"), fixture::profile());
        let host = hvlab_host::probe::probe_with("model".into(), Default::default());
        let p = predict(&strategies, &sides, Some(&profile), false, true, &host).unwrap();
        let here = p.this_host.as_ref().expect("a prediction here");
        let v = |name: &str| here.variants.iter().find(|v| v.variant == name).unwrap();
        for (name, stalls) in [
            ("irqchip-first", [1.0, 0.0]),
            ("memslots-first", [0.0, 0.0]),
            ("qemu-order", [1.0, 0.0]),
            ("firecracker-order", [1.0, 0.0]),
            ("boot-activation", [1.0, 1.0]),
        ] {
            assert_eq!(v(name).stalls, stalls, "{name}");
            assert_eq!(v(name).agrees[1], Some(true), "{name}: B as measured");
        }
        let boot = &v("boot-activation").waits[0];
        assert_eq!(
            (boot.on.as_str(), boot.sides),
            ("KVM_IOEVENTFD", [true, true])
        );
        // Stock irqchip-first after boot-activation's teardown, as the kernel ran it (see
        // fidelity::patch's tests).
        assert_eq!(v("irqchip-first").agrees[0], Some(true));
        let [a, b] = p.reporters_host.as_ref().expect("the reporter's host");
        let saved = a.ready_ms.median - b.ready_ms.median;
        assert!((15.0..25.0).contains(&saved), "{saved} ms");
        assert_eq!((a.stalls.median, b.stalls.median), (1.0, 0.0));
        let unknown = [
            strategies[0].clone(),
            patch::strategy_for(release, &[("doc.patch".into(), "00".into())], None),
        ];
        let p = predict(&unknown, &sides, Some(&profile), false, true, &host).unwrap();
        assert!(p.this_host.is_none() && p.reporters_host.is_none());
        assert!(
            p.unknown[0].starts_with("B: doc.patch") && p.unknown[0].contains("--model-strategy")
        );
    }
}
