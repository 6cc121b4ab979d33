//! The model's commands: `calibrate` (its profile for this host), `validate` (against the kvm
//! backend here) and `fidelity` (against the kernel threads' figures).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use super::paths::check_output_file;
use super::progress::TermProgress;
use super::run_store::RunStore;
use super::{InterferenceArgs, print_json, print_text, render};
use crate::error::Error;
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
}

/// `hvlab fidelity`: the table, and exit 1 when a judged figure is outside its range.
pub(super) fn fidelity(args: &FidelityArgs) -> Result<ExitCode, Error> {
    use lab::fidelity::ThreadReport;
    let reports = lab::fidelity::evaluate(&host::probe(), args.thread.as_deref(), DEFAULT_SEED)?;
    let sum = |f: fn(&ThreadReport) -> usize| reports.iter().map(f).sum::<usize>();
    let outside = sum(ThreadReport::outside);
    if args.json {
        print_json(&serde_json::json!({
            "threads": reports,
            "judged": sum(ThreadReport::judged),
            "within": sum(ThreadReport::within),
            "outside": outside,
            "fitted_rows": sum(ThreadReport::fitted_rows),
        }))?;
    } else {
        print_text(&render::fidelity(&reports))?;
    }
    Ok(if outside == 0 || args.report_only {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[derive(Debug, Args)]
pub(super) struct ValidateArgs {
    /// Cost profile [default: the calibrated one; calibrates first when there is none]
    #[arg(long, value_name = "NAME|PATH")]
    profile: Option<String>,
    /// Allowed error on times, percent, beyond the kvm side's own spread (fault counts
    /// must match exactly)
    #[arg(long, default_value_t = 15.0, value_parser = parse_tolerance, allow_hyphen_values = true)]
    tolerance: f64,
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
    tolerance: f64,
    json: bool,
) -> Result<ExitCode, Error> {
    // Opened before measuring or calibrating, so a store that cannot take the runs costs no
    // KVM work.
    let mut run_store = RunStore::open(db, json)?;
    let h = host::probe();
    let mut kvm = backends::kvm(h.clone())?;
    let progress = TermProgress::new("validate", json);
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
    let validation = lab::validate::validate(
        kvm.as_mut(),
        &mut model,
        &host,
        tolerance,
        &progress,
        |record| run_store.save(record),
    )?;
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
        print_text(&render::validation(checks, &validation.unjudged, tolerance))?;
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
