//! hvlab's cache (`$HVLAB_CACHE`, else `~/.cache/hvlab`): what it holds, its size, and keeping
//! it clean. Every entry is complete or absent (written beside and renamed into place), held
//! by each running hvlab that uses it ([`hold`]), and removed only under an exclusive lock
//! ([`prune`]), least recently used first.
//!
//! ```text
//! apt/                      Debian's package lists: hvlab's private apt state
//! kernels/RELEASE/          a Debian kernel image, unpacked (`.complete` once whole)
//! kbuild/RELEASE_VERSION/   one Debian source version, `lock`ed while a build runs:
//!   source/                 the unpacked source, read-only to every build, never written
//!   source.json .manifest   its checksum, taken when it was unpacked ([`checksum`])
//!   debian.config           Debian's config and Module.symvers (from the headers package)
//!   prepared/               Debian's config prepared for module builds (`O=`)
//!   modules-out/ whole-out/ what the unpatched builds wrote, reused by the next ones
//!   work/KEY/               one build's patch overlay, output and temporary files
//!   builds/KEY/             a kernel built for a side, with its `build.json`
//!   logs/                   the builds' logs
//! git/ID/                   one git repository: `src/` (hvlab's clone), `out/`, `builds/`,
//!                           `logs/`, `work/`, `lock`
//! logs/STAMP-RELEASE-PID/   a boot's console log and results
//! series/ID/                an mbox split into one file per message
//! sources/linux-source-X/   a source for the selftests benchmark
//! calibrations/  kab/       calibrated profiles, cover letters: kept
//! ```

pub mod boot_logs;
pub mod checksum;
pub mod hold;
mod inventory;
mod prune;
pub mod usage;

use std::path::{Path, PathBuf};

use hvlab_core::error::Fault;
use serde::Serialize;

pub use boot_logs::new_boot_log_dir;
pub use checksum::{Change, Verified};
pub use inventory::{Entry, Inventory, Kind, inventory};
pub use prune::{PruneRequest, Pruned, prune};

/// The names of a source's parts in the cache, in one place.
pub mod layout {
    /// The build lock of a source version or repository.
    pub const LOCK: &str = "lock";
    /// The unpacked source.
    pub const SOURCE: &str = "source";
    /// hvlab's clone of a git repository.
    pub const CLONE: &str = "src";
    /// The files kept beside the source: its checksum and Debian's build inputs.
    pub const SOURCE_FILES: [&str; 4] = [
        "source.json",
        "source.manifest",
        "debian.config",
        "Module.symvers",
    ];
    /// Debian's config prepared for module builds.
    pub const PREPARED: &str = "prepared";
    /// The unpatched module builds' output.
    pub const MODULES_OUT: &str = "modules-out";
    /// The unpatched whole-kernel builds' output.
    pub const WHOLE_OUT: &str = "whole-out";
    /// A repository's unpatched builds' output.
    pub const GIT_OUT: &str = "out";
    /// The builds' own directories.
    pub const WORK: &str = "work";
    /// Built kernels.
    pub const BUILDS: &str = "builds";
    /// Build logs.
    pub const LOGS: &str = "logs";
    /// A source verification found changed: unpacked again before its next build.
    pub const DAMAGED: &str = "source.damaged";
}

/// Why the cache cannot be read or cleaned.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum CacheError {
    /// Cannot use hvlab's cache at {0}: {1}. Check HVLAB_CACHE and the permissions there.
    Io(PathBuf, std::io::Error),
}

impl CacheError {
    /// I/O on hvlab's own cache failed.
    pub fn fault(&self) -> Fault {
        match self {
            CacheError::Io(..) => Fault::Failed,
        }
    }
}

/// One source tree's verification.
#[derive(Debug, Clone, Serialize)]
pub struct SourceCheck {
    /// The tree, relative to the cache.
    pub name: String,
    /// Its source (`linux-source-7.3 7.3.4-1~bpo13+1 (Debian)`), when recorded.
    pub what: Option<String>,
    /// What was found.
    pub result: Verified,
}

/// Checks every unpacked Debian source tree against the checksum taken when it was unpacked,
/// each under its build lock (waiting for a build of it to end). A changed tree is marked, so
/// the next build of that source unpacks it again.
pub fn verify(cache: &Path) -> Result<Vec<SourceCheck>, CacheError> {
    let kbuild = cache.join("kbuild");
    let mut roots: Vec<PathBuf> = match std::fs::read_dir(&kbuild) {
        Ok(rd) => rd.flatten().map(|e| e.path()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(CacheError::Io(kbuild, e)),
    };
    roots.sort();
    let mut out = Vec::new();
    for root in roots {
        let tree = root.join(layout::SOURCE);
        if !tree.is_dir() {
            continue;
        }
        let _lock = build_lock(&root.join(layout::LOCK))?;
        let result = checksum::verify(&tree).map_err(|e| CacheError::Io(tree.clone(), e))?;
        if let Verified::Changed { changes, .. } = &result {
            let marker = root.join(layout::DAMAGED);
            let why = format!("{} path(s) changed since it was unpacked", changes.len());
            std::fs::write(&marker, why).map_err(|e| CacheError::Io(marker.clone(), e))?;
        }
        out.push(SourceCheck {
            name: tree
                .strip_prefix(cache)
                .map_or_else(|_| tree.display().to_string(), |p| p.display().to_string()),
            what: checksum::recorded(&tree).map(|r| r.what),
            result,
        });
    }
    Ok(out)
}

/// The build lock of a source (`kbuild/R_V/lock`), exclusive: waits for a build to end.
fn build_lock(path: &Path) -> Result<std::fs::File, CacheError> {
    use rustix::fs::{FlockOperation, flock};
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| CacheError::Io(path.to_path_buf(), e))?;
    flock(&file, FlockOperation::LockExclusive)
        .map_err(|e| CacheError::Io(path.to_path_buf(), e.into()))?;
    Ok(file)
}
