//! The top-level error and its exit code (docs/ARCHITECTURE.md, "Errors and exit codes"): 2 bad
//! input, 3 the host cannot run what was asked, 4 a measurement or storage failure. (1 is
//! reserved for a failed verdict, which is not an error.)

use crate::store::StoreError;
use crate::trace::TraceError;
use hvlab_core::error::{BackendError, BadOrder, Fault};

/// Bad input: the message names the problem and the fix.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum InputError {
    /// Unknown scenario `{0}`; known scenarios: {1}. `hvlab list` describes them.
    UnknownScenario(String, String),
    /// Unknown variant `{variant}` for scenario {scenario}; choose from: {known}.
    UnknownVariant {
        /// What was asked for.
        variant: String,
        /// The scenario.
        scenario: String,
        /// Its variants.
        known: String,
    },
    /// --baseline-variant `{variant}` is not a variant of this run; its variants are: {known}. Name one of them, or add it with --variant.
    BaselineNotInRun {
        /// What was asked for.
        variant: String,
        /// The run's variants.
        known: String,
    },
    /// Bad --set `{0}`: expected key=value, for example --set devices=8.
    SetSyntax(String),
    /// Unknown parameter `{key}` for scenario {scenario}; its parameters are: {known}.
    UnknownParam {
        /// What was given.
        key: String,
        /// The scenario.
        scenario: String,
        /// Its parameters.
        known: String,
    },
    /// Bad value `{value}` for {key}: {why}.
    BadValue {
        /// The parameter.
        key: String,
        /// What was given.
        value: String,
        /// What is wrong and what would be right.
        why: String,
    },
    /// Bad construction order: {0}.
    BadOrder(String),
    /// The {backend} backend cannot run scenario {scenario} yet; it runs on: {supported}.
    BackendCannotRun {
        /// The backend asked for.
        backend: String,
        /// The scenario.
        scenario: String,
        /// The backends that can.
        supported: String,
    },
    /// --profile chooses the model's cost profile; the kvm backend measures this host. Add --backend model, or drop --profile.
    ProfileWithKvm,
    /// No runs stored yet: run `hvlab suite` (or `hvlab run SCENARIO`) first.
    NoRuns,
    /// No run of sweep `{id}` is stored here; the stored sweeps are: {known} (`hvlab sweeps` lists them; shards stored elsewhere must be merged first with `hvlab merge`).
    NoSuchSweep {
        /// What was given.
        id: String,
        /// The sweeps stored.
        known: String,
    },
    /// No run of suite `{id}` is stored here; the stored suites are: {known} (`hvlab runs --all` shows each run's suite; shards stored elsewhere must be merged first with `hvlab merge`).
    NoSuchSuite {
        /// What was given.
        id: String,
        /// The suites stored.
        known: String,
    },
    /// No baseline `{name}` is saved in this store; the saved baselines are: {known}. Save one with `hvlab run SCENARIO --save-baseline NAME`.
    NoSuchBaseline {
        /// What was given.
        name: String,
        /// The baselines saved.
        known: String,
    },
    /// One side of the comparison names two variants, {0} and {1}: name one variant per side.
    TwoVariantsOnOneSide(String, String),
    /// Both sides must be runs of the same scenario, but run {0} is {1} and run {2} is {3}: compare runs of one scenario.
    ScenarioMismatch(String, String, String, String),
    /// {0}
    MixedClocks(crate::record::MixedClocks),
    /// The two sides share no variant that produced samples: name the variants (`RUN:variant`).
    NoSharedVariant,
    /// Side {side} has no {metric} for {variant}: choose a metric the variant reports (`hvlab show RUN`).
    MissingMetric {
        /// A or B.
        side: char,
        /// The metric asked for.
        metric: String,
        /// The variant.
        variant: String,
    },
    /// --fail-on-regression cannot judge {0}: the verdict rule needs at least {1} samples per side to reach its level (p < 0.01 after the correction for the comparisons judged together); store runs with more --reps, or compare several runs per side (A1,A2,...).
    TooFewToJudge(String, usize),
}

impl From<crate::record::MixedClocks> for InputError {
    fn from(mixed: crate::record::MixedClocks) -> InputError {
        InputError::MixedClocks(mixed)
    }
}

impl From<BadOrder> for InputError {
    fn from(BadOrder(why): BadOrder) -> InputError {
        InputError::BadOrder(why)
    }
}

/// What writing an export fails with (`crate::export`).
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum ExportError {
    /// Cannot write {0}: {1}. Choose a writable path with -o FILE.
    Write(std::path::PathBuf, std::io::Error),
    /// Cannot write the export: {0}
    Output(std::io::Error),
    /// cannot render the report page: {0}
    Render(#[from] askama::Error),
}

impl ExportError {
    /// What kind of failure it is: a path the user chose that cannot be written is bad input.
    pub fn fault(&self) -> Fault {
        match self {
            ExportError::Write(..) => Fault::BadInput,
            _ => Fault::Failed,
        }
    }
}

/// Everything that can stop a command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The KVM backend, opening `/dev/kvm` (its failures while running a plan come through
    /// the backend seam, [`Error::Backend`]).
    #[cfg(hvlab_kvm)]
    #[error(transparent)]
    Kvm(#[from] crate::kvm::KvmError),
    /// This build has no kvm backend: exit 3.
    #[error(
        "This hvlab was built without the kvm backend (cargo feature `kvm`, x86-64 hosts): rebuild with default features on x86-64 to measure on /dev/kvm; the model backend works (`--backend model`)."
    )]
    KvmNotBuilt,
    /// A backend running a plan.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The results store.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Writing an export.
    #[error(transparent)]
    Export(#[from] ExportError),
    /// The tracer.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The model backend.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// A kernel under test in a VM (`hvlab vm`, `hvlab kab`).
    #[error(transparent)]
    Vm(#[from] crate::kernel::vm::VmError),
    /// Writing output.
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
    /// A path given for output (`-o`, `--report`) cannot be written: bad input, exit 2.
    #[error("cannot write {what} to {path} ({option}): {why}")]
    OutputPath {
        /// What was to be written.
        what: &'static str,
        /// Where.
        path: std::path::PathBuf,
        /// The option that chose it, with its shape (`-o DIR`).
        option: &'static str,
        /// What is wrong and what to do.
        why: String,
    },
    /// Every requested variant is unsupported on this host: exit 3, nothing stored.
    #[error(
        "nothing to run: every requested variant of {scenario} is unsupported on this host; nothing was stored\n{reasons}"
    )]
    AllUnsupported {
        /// The scenario.
        scenario: String,
        /// One line per variant: its name and why.
        reasons: String,
    },
    /// Every variant that ran failed: exit 4, nothing stored.
    #[error(
        "the {scenario} run failed: no variant produced samples, so nothing was stored\n{reasons}"
    )]
    AllFailed {
        /// The scenario.
        scenario: String,
        /// One line per variant: its name and why.
        reasons: String,
    },
    /// Every variant that ran failed, and the run is stored with each variant's failure (so a
    /// kernel A/B can name it): exit 4 all the same.
    #[error(
        "the {scenario} run failed: no variant produced samples; stored as {run_id} with each variant's failure (`hvlab show {run_id}`), not as a measurement\n{reasons}"
    )]
    AllFailedStored {
        /// The scenario.
        scenario: String,
        /// The stored run.
        run_id: String,
        /// One line per variant: its name and why.
        reasons: String,
    },
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
    /// The host was too busy to judge or measure what was asked: exit 4, never a failed verdict.
    #[error("cannot judge: host busy, {why}; {what}")]
    HostBusy {
        /// What the busy rule saw.
        why: String,
        /// What was not done, and the remedy.
        what: String,
    },
    /// A thread's published setup did not give the figure it is judged on: exit 4.
    #[error("fidelity: {0}")]
    Fidelity(String),
    /// A run was measured but could not be stored: exit 4, after the record was printed and
    /// kept in a recovery file (`kept` says where, or why not).
    #[error("run {run_id} was measured but not stored in {store}: {cause}\n{kept}")]
    NotStored {
        /// The run.
        run_id: String,
        /// The store (a PostgreSQL password never shown).
        store: String,
        /// Why saving failed (boxed: a large error would make every `Result` large).
        cause: Box<StoreError>,
        /// Where the run is kept, or why it could not be.
        kept: String,
    },
    /// A suite shard was given kvm units and could run none: exit 3, so a scheduler's
    /// `afterok` does not merge a suite that silently lacks them.
    #[error(
        "suite shard {shard} was given {count} kvm unit(s) and could run none of them (its other runs were stored): {reasons}. Give this node's job access to /dev/kvm, or run every shard with --backend model"
    )]
    ShardWithoutKvm {
        /// The shard.
        shard: String,
        /// How many kvm units it had.
        count: usize,
        /// Why the first could not run.
        reasons: String,
    },
    /// Interrupted by a signal (exit 128 + the signal number, as a shell reports it).
    #[error("interrupted by {name}: {what}")]
    Interrupted {
        /// The signal number.
        signal: i32,
        /// Its name.
        name: &'static str,
        /// What was cleaned up.
        what: String,
    },
}

impl Error {
    /// The error and each cause below it that adds something (thiserror's transparent
    /// wrappers repeat their inner message), outermost first.
    pub fn chain(&self) -> Vec<String> {
        let mut out = vec![self.to_string()];
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            let text = s.to_string();
            if !out.iter().any(|o| o.contains(&text)) {
                out.push(text);
            }
            source = s.source();
        }
        out
    }

    /// The process exit code for this error: each crate's error says what kind of failure it
    /// is ([`Fault`]); the kinds and the errors of this crate map to codes here.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Input(_) | Error::OutputPath { .. } => 2,
            Error::AllUnsupported { .. } | Error::ShardWithoutKvm { .. } | Error::KvmNotBuilt => 3,
            Error::Vm(e) => fault_exit_code(e.fault()),
            Error::Interrupted { signal, .. } => {
                fault_exit_code(Fault::Interrupted { signal: *signal })
            }
            #[cfg(hvlab_kvm)]
            Error::Kvm(e) => fault_exit_code(e.fault()),
            Error::Trace(e) => fault_exit_code(e.fault()),
            Error::Store(e) => fault_exit_code(e.fault()),
            Error::Export(e) => fault_exit_code(e.fault()),
            Error::Model(e) => fault_exit_code(e.fault()),
            Error::Backend(e) => fault_exit_code(e.fault()),
            _ => 4,
        }
    }

    /// Whether the host cannot do what was asked (exit 3): a unit or point that needs it is
    /// skipped, not failed.
    pub fn is_host_limitation(&self) -> bool {
        self.exit_code() == 3
    }
}

/// The exit code of a kind of failure (docs/ARCHITECTURE.md, "Errors and exit codes"); 128 + the
/// signal for an interrupted command, as a shell reports it.
pub fn fault_exit_code(fault: Fault) -> i32 {
    match fault {
        Fault::BadInput => 2,
        Fault::HostCannot => 3,
        Fault::Failed => 4,
        Fault::Interrupted { signal } => 128 + signal,
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
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
    /// signal when interrupted. Each variant once, as `hvlab` exits with it (through `Error`).
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
            (BuildError::NoSeries { spec: s() }, 2),
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
            assert_eq!(Error::Vm(e).exit_code(), code, "{shown}");
        }
    }
}
