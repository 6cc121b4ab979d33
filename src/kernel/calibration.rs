//! Profiles calibrated inside a guest (`hvlab vm --kernel SPEC -- calibrate`, or the first
//! boot of a kab's base), kept per kernel and accelerator.
//!
//! A kernel under TCG runs every instruction in the emulator: its costs are the emulator's,
//! meaningless as hardware figures, yet consistent with the guest's own clock and ticks. The
//! model priced with them predicts the guest's stalls in jiffies and counts, which is what a
//! kab under TCG judges. So a profile is only ever used for the kernel build and accelerator
//! it was measured on: the key is the release, where the kernel came from (which names a
//! rebuild and its patches), the accelerator, QEMU's CPU model and the clock (on QEMU's
//! instruction clock the costs are instruction counts, never nanoseconds).

use std::path::PathBuf;

use hvlab_core::host::{Clock, UnderTest};

use super::Kernel;
use super::patch::sha256_hex;
use super::vm::AccelChoice;
use crate::model::profile::{Profile, ProfileError};

/// What `hvlab calibrate` measures, as a version: part of every key, so a profile calibrated by
/// an hvlab that measured less (before the lifecycle's between-builds and boot-thread keys, the
/// model then falls back to coarser mechanisms) is measured again rather than reused. Bump it
/// whenever calibrate writes keys the model reads.
const CALIBRATION_FORMAT: &str = "calibrate 2: between-builds teardown and setup, boot exit wake";

/// What a calibrated profile is keyed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// `uname -r` of the guest.
    pub release: String,
    /// Where the kernel came from, resolved (a rebuild names its source and patches).
    pub source: String,
    /// `kvm` or `tcg`.
    pub accel: String,
    /// QEMU's `-cpu`.
    pub cpu_model: String,
    /// The clock the guest measured on.
    pub clock: Clock,
}

impl Identity {
    /// A kernel about to boot under `choice` (its accelerator and clock).
    pub fn of(kernel: &Kernel, choice: &AccelChoice) -> Identity {
        Identity {
            release: kernel.release.clone(),
            source: kernel.source.clone(),
            accel: choice.accel.to_string(),
            cpu_model: choice.cpu_model.clone(),
            clock: choice.clock,
        }
    }

    /// The kernel a stored run was made on (on the wall clock: [`Identity::on_clock`] says
    /// another).
    pub fn of_run(under_test: &UnderTest) -> Identity {
        Identity {
            release: under_test.release.clone(),
            source: under_test.source.clone(),
            accel: under_test.accel.clone(),
            cpu_model: under_test.cpu_model.clone(),
            clock: Clock::Wall,
        }
    }

    /// The same kernel and accelerator, measured on `clock`.
    pub fn on_clock(self, clock: Clock) -> Identity {
        Identity { clock, ..self }
    }

    /// The profile's file: readable release and accelerator, then a hash of the whole key.
    pub fn path(&self) -> PathBuf {
        let mut key = [
            self.release.as_str(),
            &self.source,
            &self.accel,
            &self.cpu_model,
            CALIBRATION_FORMAT,
        ]
        .join("\n");
        // The wall clock's keys are as they were before there were two clocks, so the
        // profiles already kept are found again.
        if !self.clock.is_wall() {
            key.push('\n');
            key.push_str(self.clock.as_str());
        }
        let safe: String = self
            .release
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._-".contains(c) {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let accel = match self.clock {
            Clock::Wall => self.accel.clone(),
            Clock::Icount => format!("{}-icount", self.accel),
        };
        super::cache_dir().join("calibrations").join(format!(
            "{safe}-{accel}-{}.toml",
            &sha256_hex(key.as_bytes())[..16]
        ))
    }

    /// The name the profile goes by in model runs.
    pub fn profile_name(&self) -> String {
        match self.clock {
            Clock::Wall => format!("calibrated {} under {}", self.release, self.accel),
            Clock::Icount => format!(
                "calibrated {} under {} on the instruction clock",
                self.release, self.accel
            ),
        }
    }
}

/// Why a calibrated profile could not be kept or read.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum CalibrationError {
    /// The profile the guest's calibrate wrote does not parse ({0}): the guest's hvlab and this one differ, or calibrate failed part way; run `hvlab vm --kernel SPEC -- calibrate --force` again.
    Bad(ProfileError),
    /// Cannot keep the calibrated profile at {0}: {1}
    Io(PathBuf, std::io::Error),
}

/// Keeps the profile (TOML) calibrate wrote in a guest of `id`, named after the kernel: where,
/// and the profile as kept.
pub fn save(id: &Identity, toml: &str) -> Result<(PathBuf, Profile), CalibrationError> {
    let mut profile =
        Profile::parse("the guest's this-host.toml", toml).map_err(CalibrationError::Bad)?;
    profile.name = id.profile_name();
    profile.describes = format!(
        "{}; calibrated inside a guest of {} ({}) under {} ({})",
        profile.describes, id.release, id.source, id.accel, id.cpu_model
    );
    let path = id.path();
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| CalibrationError::Io(dir.to_path_buf(), e))?;
    }
    profile
        .write(&path)
        .map_err(|e| CalibrationError::Io(path.clone(), std::io::Error::other(e.to_string())))?;
    Ok((path, profile))
}

/// The profile calibrated on `id`, when one is kept.
pub fn load(id: &Identity) -> Result<Option<(PathBuf, Profile)>, CalibrationError> {
    let path = id.path();
    if !path.exists() {
        return Ok(None);
    }
    let profile = Profile::load(&path.display().to_string()).map_err(CalibrationError::Bad)?;
    Ok(Some((path, profile)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(source: &str, accel: &str) -> Identity {
        Identity {
            release: "7.3.4+deb13-amd64".into(),
            source: source.into(),
            accel: accel.into(),
            cpu_model: "EPYC,+svm,+npt".into(),
            clock: Clock::Wall,
        }
    }

    /// A rebuild with a patch, or another accelerator, is another kernel for calibration.
    #[test]
    fn each_kernel_build_and_accelerator_has_its_own_profile() {
        let base = id("linux-binary 7.3.4 with kvm.ko rebuilt, no patch", "tcg");
        let patched = id("linux-binary 7.3.4 with kvm.ko rebuilt, fix.patch", "tcg");
        let kvm = id("linux-binary 7.3.4 with kvm.ko rebuilt, no patch", "kvm");
        assert_ne!(base.path(), patched.path());
        assert_ne!(base.path(), kvm.path());
        assert_eq!(base.path(), base.clone().path());
        let name = base.path();
        let file = name.file_name().unwrap().to_string_lossy();
        assert!(file.starts_with("7.3.4_deb13-amd64-tcg-"), "{file}");
    }

    /// A profile calibrated on the instruction clock prices in instructions: never the one
    /// a wall-clock kab of the same kernel reads, and the other way round.
    #[test]
    fn the_instruction_clock_has_its_own_profile_and_the_wall_clock_keeps_its_old_one() {
        let wall = id("linux-binary 7.3.4", "tcg");
        let icount = wall.clone().on_clock(Clock::Icount);
        assert_ne!(wall.path(), icount.path());
        let file = icount
            .path()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(file.starts_with("7.3.4_deb13-amd64-tcg-icount-"), "{file}");
        // The wall clock's key is the one kept before there were clocks.
        let key = [
            wall.release.as_str(),
            &wall.source,
            &wall.accel,
            &wall.cpu_model,
            CALIBRATION_FORMAT,
        ]
        .join("\n");
        assert!(
            wall.path()
                .to_string_lossy()
                .ends_with(&format!("-tcg-{}.toml", &sha256_hex(key.as_bytes())[..16]))
        );
        assert!(icount.profile_name().contains("instruction clock"));
    }
}
