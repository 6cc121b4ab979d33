//! The commands that describe and reprint: `host`, `list`, `runs`, `sweeps`, `show`.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::{print_json, print_table, print_text, render};
use crate::cli::Error;
use crate::lab::{self, host};
use crate::scenario;
use crate::store::{self, Store};
use hvlab_core::BackendKind;

/// `hvlab host`: the host, then a plain failure when KVM is unusable.
pub(super) fn host(json: bool) -> Result<ExitCode, Error> {
    let h = host::probe();
    if json {
        print_json(&h)?;
    } else {
        print_text(&render::host(&h))?;
    }
    // Show everything first, then fail plainly when KVM is unusable.
    host::require_kvm(&h)?;
    Ok(ExitCode::SUCCESS)
}

/// `hvlab list`: the scenarios.
pub(super) fn list(json: bool) -> Result<ExitCode, Error> {
    let catalog: Vec<scenario::Listing> = scenario::Kind::ALL
        .into_iter()
        .map(scenario::Kind::listing)
        .collect();
    if json {
        print_json(&serde_json::json!({ "scenarios": catalog }))?;
    } else {
        print_text(&render::list(&catalog))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub(super) struct RunsArgs {
    /// How many
    #[arg(long, default_value_t = 20)]
    limit: usize,
    /// Only this scenario
    #[arg(long)]
    scenario: Option<String>,
    /// Only this backend
    #[arg(long, value_parser = super::backend_arg())]
    backend: Option<BackendKind>,
    /// Only hosts whose description contains this (kernel, CPU, flavour, or a model
    /// profile), ignoring case
    #[arg(long, value_name = "TEXT")]
    host: Option<String>,
    /// Only the points of this sweep (`hvlab sweeps` lists them)
    #[arg(long, value_name = "ID")]
    sweep: Option<String>,
    /// Only the runs of this suite
    #[arg(long, value_name = "ID")]
    suite: Option<String>,
    /// Only runs started since: a time (2026-11-24T10:00:00Z), a date (2026-11-24, UTC) or
    /// an age (2h, 3days)
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Internal runs too (validate, the suite's showcases)
    #[arg(long)]
    all: bool,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
}

/// `hvlab runs`: the stored runs that pass the filters, grouped by host.
pub(super) fn runs(db: Option<&Path>, args: RunsArgs) -> Result<ExitCode, Error> {
    if let Some(s) = &args.scenario {
        scenario::find(s)?;
    }
    let filter = lab::select::RunFilter {
        since: args
            .since
            .as_deref()
            .map(|t| lab::select::parse_since(t, std::time::SystemTime::now()))
            .transpose()?,
        scenario: args.scenario,
        backend: args.backend,
        host: args.host,
        sweep: args.sweep,
        suite: args.suite,
        all: args.all,
    };
    let store = Store::open_read(&store::resolve_path(db)?)?;
    let list = lab::select::runs(&store, &filter, args.limit)?;
    let mut hosts = lab::fleet::group_by_host(list.iter().collect(), |l| {
        lab::fleet::HostFingerprint::of_listing(l)
    });
    // Real hosts first, then model profiles.
    hosts.sort_by_key(|h| !h.fingerprint.is_real());
    if args.json {
        let hosts: Vec<serde_json::Value> = hosts
            .iter()
            .map(|h| serde_json::json!({ "host": h.fingerprint, "runs": h.runs.iter().map(|r| &r.run_id).collect::<Vec<_>>() }))
            .collect();
        print_json(&serde_json::json!({ "runs": list, "hosts": hosts }))?;
    } else {
        print_table(&render::runs_by_host(&hosts))?;
    }
    Ok(ExitCode::SUCCESS)
}

/// `hvlab sweeps`: the stored sweeps.
pub(super) fn sweeps(db: Option<&Path>, json: bool) -> Result<ExitCode, Error> {
    let store = Store::open_read(&store::resolve_path(db)?)?;
    let sweeps = lab::select::sweeps(&store.list(usize::MAX >> 1)?);
    if json {
        print_json(&serde_json::json!({ "sweeps": sweeps }))?;
    } else {
        print_table(&render::sweeps(&sweeps))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub(super) struct ShowArgs {
    /// Run id or a unique part of it
    run: String,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
    /// Include KVM statistics
    #[arg(short, long)]
    verbose: bool,
}

/// `hvlab show`: one stored run again.
pub(super) fn show(db: Option<&Path>, args: &ShowArgs) -> Result<ExitCode, Error> {
    let store = Store::open_read(&store::resolve_path(db)?)?;
    let record = store.load(&args.run)?;
    if args.json {
        print_json(&record)?;
    } else {
        super::print_run(&record, args.verbose)?;
    }
    Ok(ExitCode::SUCCESS)
}
