//! The errors of the layers below the lab (bad input, a scenario's run, the store, an export),
//! and the one mapping of a kind of failure to its exit code ([`fault_exit_code`];
//! docs/ARCHITECTURE.md, "Errors and exit codes"): 2 bad input, 3 the host cannot run what was
//! asked, 4 a measurement or storage failure, 128 + the signal when interrupted. (1 is reserved
//! for a failed verdict, which is not an error.) Each layer above has its own error, wrapping
//! these: the lab's (`crate::lab::Error`) and the command line's (`crate::cli::Error`); nothing
//! here names a layer above.

use crate::store::StoreError;
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

/// What stops a scenario's run, the store or an export: the layers below the lab.
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
    /// The model backend.
    #[error(transparent)]
    Model(#[from] crate::model::ModelError),
    /// Writing output.
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
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
}

impl Error {
    /// What kind of failure it is: each crate's error says ([`Fault`]); bad input is bad
    /// input, a host without what was asked cannot, anything else failed.
    pub fn fault(&self) -> Fault {
        match self {
            Error::Input(_) => Fault::BadInput,
            Error::AllUnsupported { .. } | Error::KvmNotBuilt => Fault::HostCannot,
            #[cfg(hvlab_kvm)]
            Error::Kvm(e) => e.fault(),
            Error::Store(e) => e.fault(),
            Error::Export(e) => e.fault(),
            Error::Model(e) => e.fault(),
            Error::Backend(e) => e.fault(),
            Error::Output(_) | Error::AllFailed { .. } => Fault::Failed,
        }
    }

    /// Whether the host cannot do what was asked (exit 3): a unit or point that needs it is
    /// skipped, not failed.
    pub fn is_host_limitation(&self) -> bool {
        self.fault() == Fault::HostCannot
    }

    /// It and each cause below it that adds something, outermost first ([`chain`]).
    pub fn chain(&self) -> Vec<String> {
        chain(self)
    }
}

/// An error and each cause below it that adds something (thiserror's transparent wrappers
/// repeat their inner message), outermost first.
pub fn chain(e: &dyn std::error::Error) -> Vec<String> {
    let mut out = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.iter().any(|o| o.contains(&text)) {
            out.push(text);
        }
        source = s.source();
    }
    out
}

/// The exit code of a kind of failure (docs/ARCHITECTURE.md, "Errors and exit codes"); 128 + the
/// signal for an interrupted command, as a shell reports it. The one place a failure becomes a
/// code.
pub fn fault_exit_code(fault: Fault) -> i32 {
    match fault {
        Fault::BadInput => 2,
        Fault::HostCannot => 3,
        Fault::Failed => 4,
        Fault::Interrupted { signal } => 128 + signal,
    }
}
