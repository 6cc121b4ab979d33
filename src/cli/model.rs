//! The model's commands: `calibrate` (its profile for this host), `validate` (against the kvm
//! backend here) and `fidelity` (against the kernel threads' figures).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use super::paths::check_output_file;
use super::progress::TermProgress;
use super::run_store::RunStore;
use super::{InterferenceArgs, print_json, print_text, render};
use crate::cli::Error;
use crate::lab::fidelity::patch::{PatchReport, PatchRow, Prediction, Wait};
use crate::lab::fidelity::{Agreement, Judged};
use crate::lab::{self, backends, host};
use crate::model::profile::Profile;
use crate::model::{ModelBackend, ModelError};
use crate::scenario::runner::DEFAULT_SEED;
use hvlab_core::Backend;

#[derive(Debug, Args)]
pub(super) struct CalibrateArgs {
    /// Where to write it [default: the data dir's this-host.toml, which the model then uses]
    #[arg(short, long, value_name = "PATH")]
    output: Option<PathBuf>,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
    /// Write the profile even when the host was busy while measuring it
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    interference: InterferenceArgs,
}

/// `hvlab calibrate`: measures the profile (refusing to write one measured on a busy host
/// unless forced) and writes it.
pub(super) fn calibrate(args: CalibrateArgs) -> Result<ExitCode, Error> {
    let CalibrateArgs {
        output,
        json,
        force,
        interference,
    } = args;
    interference.check()?;
    // The output path is checked before measuring: a bad -o must not cost the run.
    let (path, option) = match output {
        Some(p) => (p, "-o PATH"),
        None => (
            lab::calibrated_profile_path()?,
            "the default; choose another with -o PATH",
        ),
    };
    check_output_file(&path, "the profile", option)?;
    interference.apply()?;
    let mut backend = backends::kvm(host::probe())?;
    let progress = TermProgress::new("calibrate", json);
    let (profile, noise) = calibrate_measuring_noise(backend.as_mut(), &progress)?;
    if noise.is_busy() && !force {
        return Err(Error::HostBusy {
            why: busy_why(&noise),
            what: format!(
                "the profile was not written to {}: costs measured on a busy host are inflated; run on a quiet host (--quiet-host waits for one), pin with --cpu, or write it anyway with --force",
                path.display()
            ),
        });
    }
    if noise.is_busy() {
        eprintln!(
            "warning: writing a profile measured on a busy host ({}) because of --force",
            busy_why(&noise)
        );
    }
    profile.write(&path).map_err(|e| Error::OutputPath {
        what: "the profile",
        path: path.clone(),
        option,
        why: e.to_string(),
    })?;
    if json {
        print_json(&serde_json::json!({ "path": path, "profile": profile }))?;
    } else {
        print_text(&render::profile(&profile))?;
        print_text(&format!("wrote {}", path.display()))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub(super) struct FidelityArgs {
    /// Only this thread (its seed number: 000 … 004)
    #[arg(long, value_name = "ID")]
    thread: Option<String>,
    /// Print the table and exit 0 even when figures are outside their range
    #[arg(long)]
    report_only: bool,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
    /// Predictions of patches: allowed error on a stall's length in jiffies, percent beyond
    /// the patched kernel's own spread (stall counts must match exactly)
    #[arg(long, default_value_t = lab::fidelity::patch::TOLERANCE_PCT, value_parser = parse_tolerance, allow_hyphen_values = true)]
    tolerance: f64,
}

/// `hvlab fidelity`: the threads' table, the predictions of the patches stored kabs
/// measured, and exit 1 when a judged figure or prediction is outside its range.
pub(super) fn fidelity(db: Option<&Path>, args: &FidelityArgs) -> Result<ExitCode, Error> {
    use lab::fidelity::ThreadReport;
    use lab::fidelity::patch;
    let reports = lab::fidelity::evaluate(&host::probe(), args.thread.as_deref(), DEFAULT_SEED)?;
    // The patches are predictions of thread 001's mechanism, from the runs in the store.
    let patches = if args.thread.as_deref().is_none_or(|t| t == patch::THREAD) {
        let store = crate::store::Store::open_read(&crate::store::resolve_path(db)?)?;
        patch::evaluate(&store, args.tolerance, DEFAULT_SEED)?
    } else {
        PatchReport::default()
    };
    // Memory patches are predictions of thread 004's prefetch.
    let memory = if args
        .thread
        .as_deref()
        .is_none_or(|t| t == lab::fidelity::memory_patch::THREAD)
    {
        let store = crate::store::Store::open_read(&crate::store::resolve_path(db)?)?;
        lab::fidelity::memory_patch::evaluate(&store)?
    } else {
        lab::fidelity::memory_patch::MemoryReport::default()
    };
    let sum = |f: fn(&ThreadReport) -> usize| reports.iter().map(f).sum::<usize>();
    let outside = sum(ThreadReport::outside) + patches.outside() + memory.outside();
    if args.json {
        print_json(&serde_json::json!({
            "threads": reports,
            "judged": sum(ThreadReport::judged),
            "within": sum(ThreadReport::within),
            "outside": sum(ThreadReport::outside),
            "fitted_rows": sum(ThreadReport::fitted_rows),
            "patches": patches,
            "patch_rows_within": patches.within(),
            "patch_rows_outside": patches.outside(),
            "memory_patches": memory,
            "memory_rows_within": memory.within(),
            "memory_rows_outside": memory.outside(),
        }))?;
    } else {
        print_text(&render::fidelity(&reports))?;
        print_text(&patch_predictions(&patches, args.tolerance))?;
        print_text(&memory_predictions(&memory))?;
    }
    Ok(if outside == 0 || args.report_only {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// The predictions of patches, after the threads' table.
fn patch_predictions(report: &PatchReport, tolerance: f64) -> String {
    let mut out = vec![format!(
        "\npredictions of patches (thread 001): {} row(s), {} within, {} outside, over {} kernel(s) of the stored kabs",
        report
            .predictions
            .iter()
            .map(|p| p.rows.len())
            .sum::<usize>(),
        report.within(),
        report.outside(),
        report.predictions.len()
    )];
    out.push(format!(
        "  the model, priced by the base kernel calibrated in its own guest under the same accelerator, against each kernel a kab measured; never fitted on the patched runs. Per variant: stalls per VM exactly, each stalled ioctl in jiffies within the kernel's spread (10th-90th percentile) ±{tolerance}%, the same waits; times are not judged"
    ));
    for p in &report.predictions {
        out.extend(kernel_prediction(p));
    }
    out.extend(report.skipped.iter().map(skipped_line));
    if report.predictions.is_empty() && report.skipped.is_empty() {
        out.push("  none: no stored kab of a change the model knows (hvlab kab debian:7.3 debian:7.3+001-lifecycle-keyed.patch stores one)".into());
    }
    out.join("\n")
}

/// A stored kab (or one side of it) a fidelity table left out, and why.
fn skipped_line(s: &lab::fidelity::patch::Skipped) -> String {
    let side = s
        .side
        .as_ref()
        .map_or(String::new(), |x| format!(" side {x}"));
    format!("  skipped {}{side}: {}", s.kab, s.why)
}

/// The predictions of memory patches (thread 004's prefetch): a row per kab side and variant.
fn memory_predictions(report: &lab::fidelity::memory_patch::MemoryReport) -> String {
    use lab::fidelity::memory_patch::mmu_words;
    let mut out = vec![format!(
        "\npredictions of memory patches (thread 004): {} row(s), {} within, {} outside",
        report.rows.len(),
        report.within(),
        report.outside()
    )];
    out.push("  the memory model running each side's prefetch (recognised from its patch or declared) on the MMU its boots ran, against kvm.vcpu.pf_fixed exactly; counts only, no profile read, so nothing is fitted on the patched runs".into());
    let width = report
        .rows
        .iter()
        .map(|r| r.variant.len())
        .max()
        .unwrap_or(0);
    for r in &report.rows {
        let verdict = match &r.agreement {
            Agreement::Within => "within",
            Agreement::Outside => "OUTSIDE",
            Agreement::Fitted { .. } => "fitted",
        };
        out.push(format!(
            "  {} {} {} ({}, change: {}; model {}): {:<width$}  {verdict:<7}  pf_fixed model {} kernel {} ({}–{})",
            r.kab,
            r.side,
            r.release,
            mmu_words(r.mmu),
            r.change,
            r.strategy,
            r.variant,
            figure(r.pf_fixed.predicted),
            figure(r.pf_fixed.measured),
            figure(r.pf_fixed.band[0]),
            figure(r.pf_fixed.band[1]),
        ));
    }
    out.extend(report.skipped.iter().map(skipped_line));
    if report.rows.is_empty() && report.skipped.is_empty() {
        out.push("  none: no stored kab of the memory scenario (hvlab kab debian:7.3 debian:7.3+revert.patch --scenario memory --kvm-param kvm.tdp_mmu=N stores one)".into());
    }
    out.join("\n")
}

/// One kernel of a kab against the model: what it is, the profile that priced it, any fitted
/// input read, and a line per variant.
fn kernel_prediction(p: &Prediction) -> Vec<String> {
    let mut out = vec![
        format!(
            "\n  {} {}, change: {}; model strategy {} ({})",
            p.release, p.accel, p.change, p.strategy.name, p.strategy.from
        ),
        format!(
            "    profile {} ({}); repetitions per variant: model {}, kernel {}; kab(s) {}",
            p.profile,
            p.profile_path.display(),
            p.reps[0],
            p.reps[1],
            p.kabs.join(", ")
        ),
    ];
    for f in &p.fitted {
        out.push(format!(
            "    fitted input read: {}.{} (on {})",
            f.profile, f.key, f.fitted_on
        ));
    }
    let width = p.rows.iter().map(|r| r.variant.len()).max().unwrap_or(0);
    for r in &p.rows {
        let verdict = match &r.agreement {
            Agreement::Within => "within",
            Agreement::Outside => "OUTSIDE",
            Agreement::Fitted { .. } => "fitted",
        };
        out.push(format!(
            "    {:<width$}  {verdict:<7}  {}",
            r.variant,
            row_findings(r).join("; ")
        ));
    }
    out
}

/// One variant's row, model against kernel: the stalls, each stalled ioctl's jiffies, where
/// the builds started against the tick when a length missed, and the waits.
fn row_findings(r: &PatchRow) -> Vec<String> {
    let mut parts = vec![format!(
        "stalls model {} kernel {}{} ({} of {} / {} of {} repetitions)",
        figure(r.stalls.predicted),
        figure(r.stalls.measured),
        if r.stalls.pass { "" } else { " (differ)" },
        r.stalled_reps[0][0],
        r.stalled_reps[0][1],
        r.stalled_reps[1][0],
        r.stalled_reps[1][1]
    )];
    for c in &r.jiffies {
        parts.push(format!(
            "{} model {} jiffies, kernel {} ({}–{}){}",
            c.metric.trim_start_matches("ioctl."),
            figure(c.predicted),
            figure(c.measured),
            figure(c.band[0]),
            figure(c.band[1]),
            if c.pass { "" } else { " (outside)" }
        ));
    }
    if let Some([m, k]) = r.tick_phase_ms
        && r.jiffies.iter().any(|c| !c.pass)
    {
        parts.push(format!(
            "builds start {} ms after a tick in the model, {} ms in the kernel",
            figure(m),
            figure(k)
        ));
    }
    parts.push(if r.model_waits == r.kernel_waits {
        format!("waits: {}", waits_words(&r.kernel_waits))
    } else {
        format!(
            "waits differ: model {}, kernel {}",
            waits_words(&r.model_waits),
            waits_words(&r.kernel_waits)
        )
    });
    parts
}

/// A prediction's figure: a whole number bare, else two decimals from 1 up and three below.
fn figure(v: f64) -> String {
    if v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// `KVM_SET_USER_MEMORY_REGION on KVM_CREATE_IRQCHIP's grace period, ...`, or `none`.
fn waits_words(waits: &[Wait]) -> String {
    if waits.is_empty() {
        "none".to_string()
    } else {
        waits
            .iter()
            .map(|w| format!("{} on {}'s grace period", w.ioctl, w.on))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[derive(Debug, Args)]
pub(super) struct ValidateArgs {
    /// Cost profile [default: the calibrated one; calibrates first when there is none]
    #[arg(long, value_name = "NAME|PATH")]
    profile: Option<String>,
    /// Allowed error on times, percent, beyond the kvm side's own spread (fault counts
    /// must match exactly) [default: 15, or 1 on QEMU's instruction clock, where a time is an
    /// instruction count]
    #[arg(long, value_parser = parse_tolerance, allow_hyphen_values = true)]
    tolerance: Option<f64>,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    interference: InterferenceArgs,
}

/// `hvlab validate`: pins and waits as asked, then validates.
pub(super) fn validate(db: Option<&Path>, args: &ValidateArgs) -> Result<ExitCode, Error> {
    args.interference.apply()?;
    validate_with(db, args.profile.as_deref(), args.tolerance, args.json)
}

/// Calibrates, recording the noise over the whole calibration in the profile (its `describes`
/// line, which the profile file keeps).
fn calibrate_measuring_noise(
    backend: &mut dyn Backend,
    progress: &TermProgress,
) -> Result<(Profile, hvlab_core::noise::Noise), Error> {
    use hvlab_host::noise::{Snapshot, between};
    let before = Snapshot::take();
    let mut profile = backends::calibrate(backend, progress)?;
    // The host over the whole calibration: its runs' own repetitions are in their records.
    // Calibration's widest step runs two vCPUs: no more threads than cores.
    let noise = between(&before, &Snapshot::take(), &[], 1);
    profile.describes = format!(
        "{}; measured in {}",
        profile.describes,
        crate::export::words::noise_line(&noise)
    );
    Ok((profile, noise))
}

/// What made the host busy, in words.
fn busy_why(noise: &hvlab_core::noise::Noise) -> String {
    crate::export::words::busy_words(&noise.busy)
}

/// `--tolerance`: a finite percentage above 0 (at most 100000: a huge one checks only the
/// exact counts).
fn parse_tolerance(text: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("`{text}` is not a number: give a percentage such as 15"))?;
    if v.is_finite() && v > 0.0 && v <= 100_000.0 {
        Ok(v)
    } else {
        Err(format!(
            "`{text}` is out of range: the tolerance is a percentage above 0 and at most 100000, such as 15"
        ))
    }
}

/// Runs both backends on the validation points and judges every metric.
fn validate_with(
    db: Option<&Path>,
    profile: Option<&str>,
    tolerance: Option<f64>,
    json: bool,
) -> Result<ExitCode, Error> {
    // Opened before measuring or calibrating, so a store that cannot take the runs costs no
    // KVM work.
    let mut run_store = RunStore::open(db, json)?;
    let h = host::probe();
    let tolerance = tolerance.unwrap_or_else(|| lab::validate::default_tolerance(h.clock));
    let mut kvm = backends::kvm(h.clone())?;
    let progress = TermProgress::new("validate", json);
    // A busy calibration inflates the costs the model runs on: its failures cannot be judged.
    let mut busy_calibration = None;
    let profile = match profile {
        Some(p) => Profile::load(p).map_err(ModelError::from)?,
        None => {
            let path = lab::calibrated_profile_path()?;
            if path.exists() {
                Profile::load(&path.to_string_lossy()).map_err(ModelError::from)?
            } else {
                eprintln!(
                    "no calibrated profile at {}: calibrating first",
                    path.display()
                );
                let (p, noise) = calibrate_measuring_noise(kvm.as_mut(), &progress)?;
                if noise.is_busy() {
                    // Used for this validation only: a profile measured on a busy host is
                    // not kept (calibrate --force writes one).
                    eprintln!(
                        "the host was busy while calibrating ({}): the profile is used for this validation but not written",
                        busy_why(&noise)
                    );
                    busy_calibration = Some(noise);
                } else {
                    if let Some(dir) = path.parent() {
                        std::fs::create_dir_all(dir)?;
                    }
                    p.write(&path).map_err(ModelError::from)?;
                }
                p
            }
        }
    };
    let host = h.clone();
    let mut model = ModelBackend::new(profile, h, DEFAULT_SEED);
    let mut validation = lab::validate::validate(
        kvm.as_mut(),
        &mut model,
        &host,
        tolerance,
        &progress,
        |record| run_store.save(record),
    )?;
    // A busy calibration inflates wall-clock costs only: instruction counts stay as they are.
    validation
        .busy
        .extend(busy_calibration.filter(|_| host.clock.load_moves_times()));
    let failed = validation.failed();
    let checks = &validation.checks;
    let busy: Vec<String> = validation
        .busy
        .iter()
        .map(|n| crate::export::words::busy_words(&n.busy))
        .collect();
    if json {
        print_json(&serde_json::json!({
            "tolerance_pct": tolerance, "checks": checks, "failed": failed,
            "busy": busy, "cannot_judge": validation.cannot_judge(),
            "unjudged": validation.unjudged
        }))?;
    } else {
        print_text(&render::validation(
            checks,
            &validation.unjudged,
            tolerance,
            host.clock,
        ))?;
    }
    if validation.cannot_judge() {
        return Err(Error::HostBusy {
            why: busy.first().cloned().unwrap_or_default(),
            what: format!(
                "{failed} of {} checks fell outside the kvm side's spread plus {tolerance}%, on runs measured on a busy host: rerun on a quiet host (--quiet-host waits for one) or pin with --cpu",
                checks.len()
            ),
        });
    }
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
