//! Why a patched kernel cannot be built.

use std::path::{Path, PathBuf};

use hvlab_core::error::Fault;

use crate::kernel::KernelError;
use crate::kernel::confine::ConfineError;
use crate::kernel::git::{GitError, KernelVersion};
use crate::kernel::journal::{self, JournalError};
use crate::kernel::limits::LimitHit;
use crate::kernel::patch::PatchError;
use crate::kernel::sandbox::SandboxError;

/// Why a patched kernel cannot be built.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum BuildError {
    /// Building a patched kernel needs {names}, which this host lacks; nothing was fetched. Install them and run again: apt-get install {packages}
    MissingTools {
        /// The programs and headers.
        names: String,
        /// Their Debian packages.
        packages: String,
    },
    /// {0}
    Patch(#[from] PatchError),
    /// {0}
    Kernel(#[from] KernelError),
    /// Kernel spec `{spec}`: patch file {path} does not exist. Give SPEC+PATCH[+PATCH...], each PATCH a readable file.
    NoPatchFile {
        /// The spec.
        spec: String,
        /// The missing file.
        path: String,
    },
    /// Kernel spec `{spec}` reads two ways: `{first}` or `{second}`. Rename the patch, or the file it collides with, so that only one reading names existing files.
    AmbiguousSpec {
        /// The spec.
        spec: String,
        /// One reading, its files joined by " + ".
        first: String,
        /// Another.
        second: String,
    },
    /// Kernel spec `{spec}`: {path} is a directory, not a patch file. Give SPEC+PATCH[+PATCH...], each PATCH a unified diff, a git format-patch file or an mbox.
    PatchIsDirectory {
        /// The spec.
        spec: String,
        /// The directory.
        path: String,
    },
    /// Kernel spec `{spec}`: `+{suffix}` is part of Debian's own version string, not a patch. Give the upstream version (debian:7.3 or debian:7.3.4), then +PATCH.
    DebianVersionSuffix {
        /// The spec.
        spec: String,
        /// The token after the version.
        suffix: String,
    },
    /// Kernel spec `{spec}`: hvlab builds patched kernels from Debian's source or a git tree only; give debian:VERSION+PATCH (e.g. debian:7.3+fix.patch) or git:PATH@REF+PATCH.
    NotDebian {
        /// The spec.
        spec: String,
    },
    /// {patch} does not apply to {against}: {what}. Rebase it onto that source (unpacked in {tree}).
    DoesNotApply {
        /// The patch file, and the message of a series.
        patch: String,
        /// The source it was applied to.
        against: String,
        /// Which hunk of which file, and how it failed.
        what: String,
        /// The unpacked source.
        tree: PathBuf,
    },
    /// The patched kernel does not compile ({step}); the first errors:{errors}full log: {log}
    PatchedCompile {
        /// What was being built.
        step: String,
        /// The first compiler errors.
        errors: String,
        /// The whole log.
        log: PathBuf,
    },
    /// The unpatched source does not build on this host ({step}), so no patch can be judged here; the first errors:{errors}full log: {log}
    BaseCompile {
        /// What was being built.
        step: String,
        /// The first errors.
        errors: String,
        /// The whole log.
        log: PathBuf,
    },
    /// {module} was built for `{built}` but the kernel under test loads only `{expected}`, so it would not load; the build was discarded. Report this to hvlab with the log: {log}
    Vermagic {
        /// The module.
        module: String,
        /// Its vermagic.
        built: String,
        /// The image's.
        expected: String,
        /// The build log.
        log: PathBuf,
    },
    /// The minimal guest config of {of} cannot set {option}={wanted} (olddefconfig left it `{got}`), which hvlab in the guest needs; config: {config}
    GuestConfig {
        /// The source.
        of: String,
        /// The option.
        option: String,
        /// What hvlab asked.
        wanted: String,
        /// What olddefconfig left.
        got: String,
        /// The config.
        config: PathBuf,
    },
    /// {0}
    Git(#[from] GitError),
    /// No Debian kernel config is in hvlab's cache to take the tick, preemption, RCU and KVM options of a {version} guest from: give --config FILE (a kernel .config), or fetch Debian's kernel once (hvlab vm --kernel debian:VERSION -- list).
    NoBaseConfig {
        /// The git tree's version.
        version: KernelVersion,
    },
    /// Cannot read the config {0}: {1}. Give --config the path of a kernel .config.
    ConfigUnreadable(PathBuf, std::io::Error),
    /// {0}
    Confined(#[from] ConfineError),
    /// {0}
    Journal(#[from] JournalError),
    /// Putting the source tree {tree} back after a patch failed ({why}); it is marked damaged, and the next run unpacks it again: run again.
    Damaged {
        /// The tree.
        tree: PathBuf,
        /// Why the restore failed.
        why: String,
    },
    /// {0}
    Sandbox(#[from] SandboxError),
    /// The build ({step}) tried to write {path}, outside its output directory, and the sandbox refused: `{line}`. Nothing outside its output directory was written (the source tree is read-only to a build); {fix}. Full log: {log}
    WroteOutside {
        /// What was being built.
        step: String,
        /// The path outside the tree.
        path: PathBuf,
        /// The log's line.
        line: String,
        /// What to do: remove that write from the patch, or report the unpatched source's.
        fix: &'static str,
        /// The whole log.
        log: PathBuf,
        /// Whether the side is patched (then it is the patch's doing).
        patched: bool,
    },
    /// The build ({step}) reached {limit}: it was ended with everything it started, and what it wrote was removed; a patch that does this is refused, and a genuine build that needs more can be given it with that option. Full log: {log}
    LimitReached {
        /// What was being built.
        step: String,
        /// The limit, and what reached it.
        limit: LimitHit,
        /// The whole log.
        log: PathBuf,
        /// Whether the side is patched (then it is the patch's doing).
        patched: bool,
    },
    /// Interrupted by {name} during {step}: make and everything it started were ended, and nothing half-built is kept.
    Interrupted {
        /// What was being built.
        step: String,
        /// The signal number.
        signal: i32,
        /// Its name.
        name: &'static str,
    },
    /// Cannot use {0}: {1}
    Io(PathBuf, std::io::Error),
}

impl BuildError {
    /// What kind of failure it is: a patch or spec the user can fix is bad input; what this
    /// host cannot build (its tools, its sandbox, the unpatched source) is the host's; I/O
    /// and hvlab's own state are failures. No catch-all arm, so a new variant is classified.
    pub fn fault(&self) -> Fault {
        match self {
            BuildError::Patch(e) => e.fault(),
            BuildError::Kernel(e) => e.fault(),
            BuildError::Confined(e) => e.fault(),
            BuildError::Journal(e) => e.fault(),
            BuildError::Sandbox(e) => e.fault(),
            BuildError::Git(e) => e.fault(),
            BuildError::NoPatchFile { .. }
            | BuildError::AmbiguousSpec { .. }
            | BuildError::PatchIsDirectory { .. }
            | BuildError::DebianVersionSuffix { .. }
            | BuildError::NotDebian { .. }
            | BuildError::NoBaseConfig { .. }
            | BuildError::ConfigUnreadable(..)
            | BuildError::DoesNotApply { .. }
            | BuildError::PatchedCompile { .. }
            // A patched side's write outside the tree is the patch's doing.
            | BuildError::WroteOutside { patched: true, .. }
            | BuildError::LimitReached { patched: true, .. } => Fault::BadInput,
            BuildError::MissingTools { .. }
            | BuildError::BaseCompile { .. }
            | BuildError::Vermagic { .. }
            | BuildError::GuestConfig { .. }
            | BuildError::WroteOutside { patched: false, .. }
            | BuildError::LimitReached { patched: false, .. } => Fault::HostCannot,
            BuildError::Damaged { .. } | BuildError::Io(..) => Fault::Failed,
            BuildError::Interrupted { signal, .. } => Fault::Interrupted { signal: *signal },
        }
    }

    /// Whether this error, from building a candidate beside a base that builds on its own,
    /// is the candidate's: bad input, or a compile error. A git commit has no patch, so a
    /// commit of a range that does not compile fails as "the unpatched source": which side
    /// it was is known only by building the base alone, which the caller does.
    pub fn may_be_candidates(&self) -> bool {
        self.fault() == Fault::BadInput
            || matches!(
                self,
                BuildError::BaseCompile { .. } | BuildError::PatchedCompile { .. }
            )
    }
}

pub(super) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |e| BuildError::Io(path.to_path_buf(), e)
}

impl From<journal::ApplyError> for BuildError {
    fn from(e: journal::ApplyError) -> BuildError {
        match e {
            journal::ApplyError::Confined(e) => BuildError::Confined(e),
            journal::ApplyError::Journal(e) => BuildError::Journal(e),
            journal::ApplyError::DoesNotApply {
                patch,
                against,
                what,
                tree,
            } => BuildError::DoesNotApply {
                patch,
                against,
                what,
                tree,
            },
            journal::ApplyError::Run(e) => BuildError::Io(PathBuf::from("patch"), e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit of a git range that does not compile fails as the unpatched source does: it
    /// may be the candidate's (the caller builds the base alone to know); a host that lacks
    /// its tools never is.
    #[test]
    fn a_compile_error_may_be_the_candidates_and_a_missing_tool_never_is() {
        let compile = |patched: bool| {
            let (step, errors, log) = ("make".to_string(), "error: x".to_string(), PathBuf::new());
            if patched {
                BuildError::PatchedCompile { step, errors, log }
            } else {
                BuildError::BaseCompile { step, errors, log }
            }
        };
        assert!(compile(true).may_be_candidates());
        assert!(compile(false).may_be_candidates());
        let missing = BuildError::NoPatchFile {
            spec: "debian:7.3+x.patch".into(),
            path: "x.patch".into(),
        };
        assert!(missing.may_be_candidates());
        let tools = BuildError::MissingTools {
            names: "make".into(),
            packages: "make".into(),
        };
        assert!(!tools.may_be_candidates());
    }
}
