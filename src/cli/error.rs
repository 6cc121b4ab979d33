//! Everything that can stop a command, and its exit code: the lab's error (which wraps the
//! kernels under test, the scenarios' runs and the store), the tracer's, and what only a
//! command meets (a path it was told to write, stdout, a run measured but not stored, a
//! shard without the device it was given work for, a busy host, a signal). Each says what
//! kind of failure it is; [`crate::error::fault_exit_code`] turns the kind into the code.

use hvlab_core::error::{BackendError, Fault};

use crate::error::{ExportError, InputError, fault_exit_code};
use crate::kernel::vm::VmError;
use crate::store::StoreError;
use crate::trace::TraceError;

/// Everything that can stop a command.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The lab: its own causes, a kernel under test, a scenario's run, the store, bad input.
    #[error(transparent)]
    Lab(#[from] crate::lab::Error),
    /// The tracer.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// hvlab's kernel cache (`hvlab cache`).
    #[error(transparent)]
    Cache(#[from] crate::kernel::cache::CacheError),
    /// Writing to stdout.
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
    /// The host was too busy to judge or measure what was asked: exit 4, never a failed verdict.
    #[error("cannot judge: host busy, {why}; {what}")]
    HostBusy {
        /// What the busy rule saw.
        why: String,
        /// What was not done, and the remedy.
        what: String,
    },
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
    /// What kind of failure it is: the lab's and the tracer's own kind; a path the user gave
    /// is bad input; a shard without the device it was given work for cannot.
    pub fn fault(&self) -> Fault {
        match self {
            Error::Lab(e) => e.fault(),
            Error::Trace(e) => e.fault(),
            Error::Cache(e) => e.fault(),
            Error::OutputPath { .. } => Fault::BadInput,
            Error::ShardWithoutKvm { .. } => Fault::HostCannot,
            Error::Output(_)
            | Error::AllFailedStored { .. }
            | Error::HostBusy { .. }
            | Error::NotStored { .. } => Fault::Failed,
            Error::Interrupted { signal, .. } => Fault::Interrupted { signal: *signal },
        }
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> i32 {
        fault_exit_code(self.fault())
    }

    /// It and each cause below it that adds something, outermost first.
    pub fn chain(&self) -> Vec<String> {
        crate::error::chain(self)
    }
}

/// A command's errors from the layers below, through the lab's.
macro_rules! through_the_lab {
    ($($from:ty),* $(,)?) => {
        $(
            impl From<$from> for Error {
                fn from(e: $from) -> Error {
                    Error::Lab(e.into())
                }
            }
        )*
    };
}

through_the_lab!(
    crate::error::Error,
    InputError,
    StoreError,
    BackendError,
    ExportError,
    crate::model::ModelError,
    VmError,
    crate::kernel::build::BuildError,
    crate::kernel::KernelError,
);

#[cfg(hvlab_kvm)]
through_the_lab!(crate::kvm::KvmError);
