//! The top-level error and its exit code (DESIGN.md, "Output contract"): 2 bad input, 3 the
//! host cannot run what was asked, 4 a measurement or storage failure. (1 is reserved for a
//! failed verdict, which is not an error.)

use crate::backend::error::{BackendError, BadOrder, KvmError};
use crate::store::StoreError;
use crate::trace::TraceError;

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
    /// No run matches `{0}`; `hvlab runs` lists the stored runs.
    NoSuchRun(String),
    /// `{0}` matches several runs ({1}); give more of the run id.
    AmbiguousRun(String, String),
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

impl From<BadOrder> for InputError {
    fn from(BadOrder(why): BadOrder) -> InputError {
        InputError::BadOrder(why)
    }
}

/// Everything that can stop a command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad input.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The KVM backend.
    #[error(transparent)]
    Kvm(#[from] KvmError),
    /// A backend refused a plan (the KVM backend's own errors are [`Error::Kvm`]).
    #[error(transparent)]
    Backend(BackendError),
    /// The results store.
    #[error(transparent)]
    Store(#[from] StoreError),
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

impl From<BackendError> for Error {
    /// The KVM backend's errors keep their one variant, whichever way they came.
    fn from(e: BackendError) -> Error {
        match e {
            BackendError::Kvm(k) => Error::Kvm(k),
            other => Error::Backend(other),
        }
    }
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

    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Input(_) | Error::OutputPath { .. } => 2,
            Error::AllUnsupported { .. } | Error::ShardWithoutKvm { .. } => 3,
            Error::AllFailed { .. } => 4,
            Error::Vm(e) => e.exit_code(),
            Error::Interrupted { signal, .. } => 128 + signal,
            Error::Kvm(e) if e.is_host_limitation() => 3,
            Error::Trace(e) if e.is_host_limitation() => 3,
            Error::Trace(e) if e.is_bad_input() => 2,
            Error::Store(e) if e.is_bad_input() => 2,
            Error::Model(crate::model::ModelError::Profile(e)) if !e.is_write() => 2,
            Error::Model(crate::model::ModelError::Unsupported(_)) => 3,
            Error::Backend(BackendError::Config(_)) => 2,
            Error::Backend(BackendError::Unsupported(_)) => 3,
            _ => 4,
        }
    }
}
