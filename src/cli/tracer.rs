//! `hvlab trace`: another VMM's KVM ioctls, attributed.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use super::{print_json, print_text, render};
use crate::cli::Error;
use crate::lab::host;
use crate::trace::{self, Until};

#[derive(Debug, Args)]
pub(super) struct TraceArgs {
    /// When to stop the command
    #[arg(long, value_enum, default_value_t = Until::FirstRun)]
    until: Until,
    /// Stop the command after this many seconds regardless
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Let the command's stdout through
    #[arg(long)]
    show_output: bool,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
    /// The command to trace
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// `hvlab trace`: runs the command under strace until it is told to stop, and prints the
/// account (an interruption reported as what it left behind: nothing).
pub(super) fn trace(args: &TraceArgs) -> Result<ExitCode, Error> {
    let h = host::probe();
    let report = trace::trace(
        &args.command,
        args.until,
        Duration::from_secs(args.timeout),
        args.show_output,
        &h,
    )
    .map_err(|e| match e {
        trace::TraceError::Interrupted(signal) => Error::Interrupted {
            signal,
            name: crate::sys::signal_name(signal),
            what: "the traced command and strace were stopped; nothing was left behind".into(),
        },
        e => e.into(),
    })?;
    if args.json {
        print_json(&report)?;
    } else {
        print_text(&render::trace(&report))?;
    }
    Ok(ExitCode::SUCCESS)
}
