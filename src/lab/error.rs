//! The lab's error: what stops a suite, a sweep, a calibration, a validation, a fidelity
//! table, a kab, a series or a bisection. It wraps the errors of the layers it stands on (a
//! scenario's run and the store: [`crate::error::Error`]; a kernel under test:
//! [`VmError`]) and carries its own causes typed; each says what kind of failure it is
//! ([`Error::fault`]), which the command line turns into the exit code.

use hvlab_core::error::{BackendError, Fault};

use crate::error::{ExportError, InputError};
use crate::kernel::build::BuildError;
use crate::kernel::vm::VmError;
use crate::store::StoreError;

/// What stops the lab's work.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A scenario's run, the store, an export, or bad input.
    #[error(transparent)]
    Run(#[from] crate::error::Error),
    /// A kernel under test: its spec, its build, its VM.
    #[error(transparent)]
    Kernel(#[from] VmError),
    /// A calibration run did not give what a cost is solved from: exit 4.
    #[error(
        "calibration cannot solve its costs: run {scenario} has no {metric} for {variant} ({status})"
    )]
    Calibration {
        /// The scenario run.
        scenario: String,
        /// The metric needed.
        metric: String,
        /// The variant.
        variant: String,
        /// The variant's status.
        status: String,
    },
    /// A thread's published setup did not give the figure it is judged on: exit 4.
    #[error("fidelity: {0}")]
    Fidelity(String),
}

impl Error {
    /// What kind of failure it is: the wrapped layer's own kind, and a calibration or a
    /// fidelity figure that could not be made is a failure.
    pub fn fault(&self) -> Fault {
        match self {
            Error::Run(e) => e.fault(),
            Error::Kernel(e) => e.fault(),
            Error::Calibration { .. } | Error::Fidelity(_) => Fault::Failed,
        }
    }

    /// Whether the host cannot do what was asked (exit 3): a unit or point that needs it is
    /// skipped, not failed.
    pub fn is_host_limitation(&self) -> bool {
        self.fault() == Fault::HostCannot
    }
}

/// The lab's errors from the layers below, through the one they belong to.
macro_rules! through {
    ($($from:ty => $variant:ident),* $(,)?) => {
        $(
            impl From<$from> for Error {
                fn from(e: $from) -> Error {
                    Error::$variant(e.into())
                }
            }
        )*
    };
}

through! {
    InputError => Run,
    StoreError => Run,
    BackendError => Run,
    ExportError => Run,
    crate::model::ModelError => Run,
    std::io::Error => Run,
    BuildError => Kernel,
    crate::kernel::KernelError => Kernel,
}

#[cfg(hvlab_kvm)]
through! {
    crate::kvm::KvmError => Run,
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::error::fault_exit_code;
    use crate::kernel::KernelError;
    use crate::kernel::build::BuildError;
    use crate::kernel::confine::ConfineError;
    use crate::kernel::git::{GitError, KernelVersion};
    use crate::kernel::journal::JournalError;
    use crate::kernel::patch::PatchError;
    use crate::kernel::sandbox::SandboxError;
    use crate::kernel::vm::VmError;

    /// The kernel errors' exit codes, one kind per code: 2 bad input (a patch, a spec, a
    /// refused path, a patch that does not apply or compile), 3 the environment is missing
    /// (QEMU, build tools, apt, the sandbox, nested KVM), 4 I/O and measurement, 128 + the
    /// signal when interrupted. Each variant once, as `hvlab` exits with it (through the lab's
    /// error).
    #[test]
    fn each_kernel_error_exits_with_the_code_of_its_kind() {
        let p = || PathBuf::from("x");
        let io = || std::io::Error::other("disk");
        let s = String::new;
        let patch = |e: PatchError| BuildError::Patch(e);
        let confine = ConfineError {
            patch: s(),
            path: s(),
            why: s(),
        };
        let kernel = [
            (KernelError::UnknownSpec(s()), 2),
            (
                KernelError::NoSuchVersion {
                    version: s(),
                    newest: s(),
                },
                2,
            ),
            (
                KernelError::NoKvm {
                    image: p(),
                    why: s(),
                },
                2,
            ),
            (KernelError::BadModulesDir(p()), 2),
            (
                KernelError::NoSuchModule {
                    module: s(),
                    release: s(),
                },
                2,
            ),
            (KernelError::NoApt, 3),
            (
                KernelError::CacheSpace {
                    dir: p(),
                    free_mib: 1,
                    need_mib: 2,
                },
                3,
            ),
            (
                KernelError::Apt {
                    what: s(),
                    output: s(),
                },
                4,
            ),
            (
                KernelError::GuestNeeds {
                    release: s(),
                    option: s(),
                    config: s(),
                    why: "",
                },
                2,
            ),
            (
                KernelError::SourceMismatch {
                    image: s(),
                    package: s(),
                    available: s(),
                },
                2,
            ),
            (KernelError::GitUnbuilt(s()), 4),
            (KernelError::Io(p(), io()), 4),
        ];
        let journal = [
            (
                JournalError::Io {
                    what: "write",
                    path: p(),
                    err: io(),
                },
                4,
            ),
            (JournalError::Corrupt(p(), s()), 4),
            (
                JournalError::Unsafe {
                    tree: p(),
                    path: s(),
                    why: s(),
                },
                4,
            ),
            (JournalError::Pending(p()), 4),
        ];
        let sandbox = [
            (SandboxError::NotInstalled, 3),
            (SandboxError::UserNamespaces { output: s() }, 3),
            (
                SandboxError::TrialFailed {
                    bwrap: p(),
                    output: s(),
                },
                3,
            ),
        ];
        let wrote_outside = |patched| BuildError::WroteOutside {
            step: s(),
            path: p(),
            line: s(),
            fix: "",
            log: p(),
            patched,
        };
        let mut build = vec![
            (
                BuildError::MissingTools {
                    names: s(),
                    packages: s(),
                },
                3,
            ),
            (patch(PatchError::Unreadable(p(), io())), 2),
            (patch(PatchError::NoDiff(p())), 2),
            (
                patch(PatchError::Malformed {
                    path: p(),
                    line: 1,
                    why: s(),
                }),
                2,
            ),
            (
                patch(PatchError::Binary {
                    path: p(),
                    file: s(),
                }),
                2,
            ),
            (
                BuildError::NoPatchFile {
                    spec: s(),
                    path: s(),
                },
                2,
            ),
            (
                BuildError::AmbiguousSpec {
                    spec: s(),
                    first: s(),
                    second: s(),
                },
                2,
            ),
            (
                BuildError::PatchIsDirectory {
                    spec: s(),
                    path: s(),
                },
                2,
            ),
            (
                BuildError::DebianVersionSuffix {
                    spec: s(),
                    suffix: s(),
                },
                2,
            ),
            (BuildError::NotDebian { spec: s() }, 2),
            (
                BuildError::DoesNotApply {
                    patch: s(),
                    against: s(),
                    what: s(),
                    tree: p(),
                },
                2,
            ),
            (
                BuildError::PatchedCompile {
                    step: s(),
                    errors: s(),
                    log: p(),
                },
                2,
            ),
            (
                BuildError::BaseCompile {
                    step: s(),
                    errors: s(),
                    log: p(),
                },
                3,
            ),
            (
                BuildError::Vermagic {
                    module: s(),
                    built: s(),
                    expected: s(),
                    log: p(),
                },
                3,
            ),
            (
                BuildError::GuestConfig {
                    of: s(),
                    option: s(),
                    wanted: s(),
                    got: s(),
                    config: p(),
                },
                3,
            ),
            (BuildError::Confined(confine), 2),
            (
                BuildError::Damaged {
                    tree: p(),
                    why: s(),
                },
                4,
            ),
            (wrote_outside(true), 2),
            (wrote_outside(false), 3),
            (
                BuildError::Interrupted {
                    step: s(),
                    signal: 15,
                    name: "SIGTERM",
                },
                143,
            ),
            (BuildError::Io(p(), io()), 4),
            (
                BuildError::NoBaseConfig {
                    version: KernelVersion {
                        major: 7,
                        minor: 3,
                        sub: 0,
                    },
                },
                2,
            ),
            (BuildError::ConfigUnreadable(p(), io()), 2),
        ];
        let git = [
            (GitError::NoGit, 3),
            (
                GitError::BadSpec {
                    spec: s(),
                    why: s(),
                },
                2,
            ),
            (
                GitError::NotARepository {
                    path: p(),
                    output: s(),
                },
                2,
            ),
            (
                GitError::NotTop {
                    path: p(),
                    top: p(),
                },
                2,
            ),
            (
                GitError::NoSuchRef {
                    repo: p(),
                    rev: s(),
                    output: s(),
                },
                2,
            ),
            (
                GitError::EmptyRange {
                    repo: p(),
                    base: s(),
                    head: s(),
                },
                2,
            ),
            (
                GitError::NotLinux {
                    repo: p(),
                    rev: s(),
                    sha: s(),
                    why: s(),
                },
                2,
            ),
            (GitError::RangeNotOne { spec: s() }, 2),
            (
                GitError::Failed {
                    what: s(),
                    dir: p(),
                    output: s(),
                },
                4,
            ),
        ];
        build.extend(git.into_iter().map(|(e, c)| (BuildError::Git(e), c)));
        build.extend(kernel.into_iter().map(|(e, c)| (BuildError::Kernel(e), c)));
        build.extend(
            journal
                .into_iter()
                .map(|(e, c)| (BuildError::Journal(e), c)),
        );
        build.extend(
            sandbox
                .into_iter()
                .map(|(e, c)| (BuildError::Sandbox(e), c)),
        );
        let mut vm = vec![
            (VmError::Kernel(KernelError::NoApt), 3),
            (
                VmError::MissingTool {
                    tool: s(),
                    why: s(),
                    package: s(),
                },
                3,
            ),
            (VmError::BadKvmParam(s()), 2),
            (
                VmError::NoSuchParam {
                    module: s(),
                    param: s(),
                    release: s(),
                    known: s(),
                },
                2,
            ),
            (VmError::NoNestedKvm(s()), 3),
            (
                VmError::GuestOops {
                    excerpt: s(),
                    log: p(),
                    runs: 0,
                },
                4,
            ),
            (
                VmError::TimedOut {
                    secs: 1,
                    log: p(),
                    runs: 0,
                },
                4,
            ),
            (VmError::ModuleLoad { why: s(), log: p() }, 4),
            (
                VmError::NoResults {
                    status: s(),
                    log: p(),
                },
                4,
            ),
            (
                VmError::Interrupted {
                    signal: 2,
                    name: "SIGINT",
                },
                130,
            ),
            (VmError::Io(p(), io()), 4),
        ];
        vm.extend(build.into_iter().map(|(e, c)| (VmError::from(e), c)));
        for (e, code) in vm {
            let shown = format!("{e:?}");
            assert_eq!(fault_exit_code(Error::Kernel(e).fault()), code, "{shown}");
        }
    }
}
