//! What a build records about itself: how the kernel was made, from what, and its steps.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::note::{BuildConfig, BuildNote};
use crate::kernel::debian::DebianImage;
use crate::kernel::patch::PatchFile;
use crate::kernel::sandbox::Confinement;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PatchInfo {
    /// The file name.
    pub file: String,
    /// The path given.
    pub path: PathBuf,
    /// Its sha256.
    pub sha256: String,
    /// The subjects of its messages (a series), when mail.
    pub subjects: Vec<String>,
    /// The files it changes.
    pub files: Vec<String>,
}

impl From<&PatchFile> for PatchInfo {
    fn from(p: &PatchFile) -> PatchInfo {
        PatchInfo {
            file: p.name(),
            path: p.path.clone(),
            sha256: p.sha256.clone(),
            subjects: p.patches.iter().filter_map(|m| m.subject.clone()).collect(),
            files: p.touched().into_iter().collect(),
        }
    }
}

/// How a kernel under test was made.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum How {
    /// The image as shipped with the modules of `dirs` rebuilt.
    Modules {
        /// `make M=` directories.
        dirs: Vec<String>,
        /// The modules rebuilt (`kvm.ko`).
        modules: Vec<String>,
    },
    /// A whole kernel from the minimal guest config.
    Whole,
    /// The image as shipped: the patches touch nothing a build uses.
    AsShipped {
        /// Why.
        why: String,
    },
}

/// A timed step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    /// What ran.
    pub what: String,
    /// Its wall time.
    pub secs: f64,
}

/// What hvlab built, or reused, for one kernel under test.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildInfo {
    /// How.
    pub how: How,
    /// The source (`linux-source-7.3 7.3.4-1~bpo13+1 (Debian)`).
    pub source: String,
    /// The config, and what olddefconfig on this host changed in it.
    pub config: BuildConfig,
    /// The compiler.
    pub compiler: String,
    /// The patches applied, in order.
    pub patches: Vec<PatchInfo>,
    /// Hunks applied at an offset or with fuzz, a damaged tree made again.
    pub notes: Vec<BuildNote>,
    /// The build's own steps (none when reused).
    pub steps: Vec<Step>,
    /// The cache key.
    pub key: String,
    /// Whether this build came from the cache.
    #[serde(default)]
    pub cached: bool,
    /// How its commands ran: sandboxed, or not (`--no-sandbox`).
    #[serde(default)]
    pub sandbox: Confinement,
}

/// The one line a run's host fingerprint carries about a built kernel.
pub(super) fn describe_source(image: &DebianImage, info: &BuildInfo) -> String {
    let patches = if info.patches.is_empty() {
        "no patch".to_string()
    } else {
        info.patches
            .iter()
            .map(|p| format!("{} (sha256 {})", p.file, &p.sha256[..12]))
            .collect::<Vec<_>>()
            .join(" + ")
    };
    match &info.how {
        How::Modules { modules, .. } => format!(
            "{} {} with {} rebuilt from {} with {patches}",
            image.package,
            image.version,
            modules.join(", "),
            info.source
        ),
        How::Whole => format!("{} minimal guest config with {patches}", info.source),
        How::AsShipped { .. } => format!(
            "{} {} as shipped ({patches} changes nothing built)",
            image.package, image.version
        ),
    }
}
