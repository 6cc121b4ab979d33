//! The kvm backend where this build has it, and a plain "not built" where it does not, so the
//! command line reads the same in both builds.

use std::sync::{Mutex, PoisonError};

use crate::lab::Error;
use crate::model::profile::Profile;
use crate::model::{self, ModelBackend, ModelError};
use crate::scenario::runner::Progress;
use hvlab_core::host::HostInfo;
use hvlab_core::{Backend, BackendKind};

/// Opens `/dev/kvm` as a backend.
#[cfg(hvlab_kvm)]
pub fn kvm(host: HostInfo) -> Result<Box<dyn Backend>, Error> {
    Ok(Box::new(crate::kvm::KvmBackend::new(host)?))
}

/// Opens `/dev/kvm` as a backend: this build has no kvm backend.
#[cfg(not(hvlab_kvm))]
pub fn kvm(_: HostInfo) -> Result<Box<dyn Backend>, Error> {
    Err(crate::error::Error::KvmNotBuilt.into())
}

/// Measures this host's cost profile with the kvm backend.
#[cfg(hvlab_kvm)]
pub fn calibrate(kvm: &mut dyn Backend, progress: &dyn Progress) -> Result<Profile, Error> {
    super::calibrate::calibrate(kvm, progress)
}

/// Measures this host's cost profile with the kvm backend: this build has none.
#[cfg(not(hvlab_kvm))]
pub fn calibrate(_: &mut dyn Backend, _: &dyn Progress) -> Result<Profile, Error> {
    Err(crate::error::Error::KvmNotBuilt.into())
}

/// The error for a command that needs `/dev/kvm` where there is none: the device missing,
/// or no kvm backend in this build.
pub fn no_kvm() -> Error {
    #[cfg(hvlab_kvm)]
    return crate::kvm::KvmError::DeviceMissing(hvlab_host::probe::kvm_device_path()).into();
    #[cfg(not(hvlab_kvm))]
    return crate::error::Error::KvmNotBuilt.into();
}

/// The backend `kind` on `host`: `/dev/kvm`, or the model with `profile`'s profile.
pub fn make(
    kind: BackendKind,
    host: HostInfo,
    profile: &ModelProfile<'_>,
    seed: u64,
) -> Result<Box<dyn Backend>, Error> {
    match kind {
        BackendKind::Kvm => kvm(host),
        BackendKind::Model => Ok(Box::new(ModelBackend::new(profile.get(&host)?, host, seed))),
    }
}

/// What to do with a note about the profile chosen (the CLI says it on stderr).
pub type Notes<'a> = &'a (dyn Fn(&str) + Sync);

/// The model's cost profile for the backends one command opens: resolved (see
/// [`model_profile`]) when the first model backend is opened, then reused, so a suite reads it
/// and says its note once, and a command that opens no model backend never reads it.
pub struct ModelProfile<'a> {
    named: Option<&'a str>,
    notes: Option<Notes<'a>>,
    resolved: Mutex<Option<Profile>>,
}

impl std::fmt::Debug for ModelProfile<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelProfile")
            .field("named", &self.named)
            .field("resolved", &self.resolved)
            .finish_non_exhaustive()
    }
}

impl<'a> ModelProfile<'a> {
    /// `named` (a built-in name or a TOML path), else this host's default: see
    /// [`model_profile`]. A note about the default goes nowhere; see [`Self::noting`].
    pub fn named(named: Option<&'a str>) -> ModelProfile<'a> {
        ModelProfile {
            named,
            notes: None,
            resolved: Mutex::new(None),
        }
    }

    /// The same, handing the note about the default profile (when it does not describe this
    /// host's flavour) to `notes` when it is resolved.
    pub fn noting(self, notes: Notes<'a>) -> ModelProfile<'a> {
        ModelProfile {
            notes: Some(notes),
            ..self
        }
    }

    /// The profile for `host`, resolved at the first call.
    pub fn get(&self, host: &HostInfo) -> Result<Profile, Error> {
        // A panic elsewhere cannot leave a half-set profile: take it as it is.
        let mut resolved = self.resolved.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(p) = &*resolved {
            return Ok(p.clone());
        }
        let (p, note) = model_profile(host, self.named)?;
        if let (Some(note), Some(notes)) = (note, self.notes) {
            notes(&note);
        }
        *resolved = Some(p.clone());
        Ok(p)
    }
}

/// The model's cost profile: `profile` (a built-in name or a TOML path), else this host's
/// calibrated profile, else the nearest built-in one, with a note when that one does not
/// describe this host's flavour.
pub fn model_profile(
    host: &HostInfo,
    profile: Option<&str>,
) -> Result<(Profile, Option<String>), Error> {
    Ok(match profile {
        Some(p) => (Profile::load(p).map_err(ModelError::from)?, None),
        None => model::default_profile(host, Some(&super::calibrated_profile_path()?))
            .map_err(ModelError::from)?,
    })
}
