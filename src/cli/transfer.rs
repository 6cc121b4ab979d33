//! Moving runs between stores and sites: `merge`, `export`, `import`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use super::{habits, print_json, print_text, render};
use crate::error::Error;
use crate::store::transfer::Tally;
use crate::store::{self, Store};

#[derive(Debug, Args)]
pub(super) struct MergeArgs {
    /// SQLite results files written by hvlab (e.g. one per shard)
    #[arg(required = true, value_name = "FILE.db")]
    files: Vec<PathBuf>,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
}

/// `hvlab merge`: every file into the store, a tally per file and in total.
pub(super) fn merge(db: Option<&Path>, args: &MergeArgs) -> Result<ExitCode, Error> {
    let mut target = Store::open(&store::resolve_path(db)?)?;
    let mut total = Tally::default();
    let mut per_file = Vec::new();
    for file in &args.files {
        let tally = store::transfer::merge_file(&mut target, file)?;
        if !args.json {
            print_text(&render::tally(&file.display().to_string(), &tally))?;
        }
        total.add(&tally);
        per_file.push(serde_json::json!({ "file": file, "tally": tally }));
    }
    finish(
        args.json,
        &serde_json::json!({ "files": per_file, "total": total }),
        &format!("merged into {}", target.location()),
        &total,
    )
}

#[derive(Debug, Args)]
pub(super) struct ExportArgs {
    /// Format: jsonl for another site (`import` reads it), csv for a spreadsheet
    #[arg(long, value_enum, default_value_t = store::transfer::ExportFormat::Jsonl)]
    format: store::transfer::ExportFormat,
    /// Runs to export (ids or unique parts) [default: every run]
    runs: Vec<String>,
    /// Output file [default: stdout]
    #[arg(short, long, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// `hvlab export`: the runs chosen, to a file or stdout.
pub(super) fn export(db: Option<&Path>, args: &ExportArgs) -> Result<ExitCode, Error> {
    let store = Store::open_read(&store::resolve_path(db)?)?;
    let records = store::transfer::select(&store, &args.runs)?;
    match &args.output {
        Some(path) => {
            store::transfer::write_file(&records, path, args.format)?;
            habits::note(&format!(
                "exported {} run(s) to {}",
                records.len(),
                path.display()
            ));
        }
        None => args.format.write(&records, &mut std::io::stdout().lock())?,
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Args)]
pub(super) struct ImportArgs {
    /// The exported file
    #[arg(value_name = "FILE.jsonl")]
    file: PathBuf,
    /// Format
    #[arg(long, value_enum, default_value_t = store::transfer::Format::Jsonl)]
    format: store::transfer::Format,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
}

/// `hvlab import`: an export's runs into the store, every line checked first.
pub(super) fn import(db: Option<&Path>, args: &ImportArgs) -> Result<ExitCode, Error> {
    // JSON Lines is the one format; a second would be read here.
    let store::transfer::Format::Jsonl = args.format;
    // Every line is checked before anything is stored.
    let records = store::transfer::read_jsonl(&args.file)?;
    let mut target = Store::open(&store::resolve_path(db)?)?;
    let tally = store::transfer::ingest_all(&mut target, &records)?;
    finish(
        args.json,
        &serde_json::json!({ "file": args.file, "tally": tally }),
        &format!(
            "imported {} into {}",
            args.file.display(),
            target.location()
        ),
        &tally,
    )
}

/// How `merge` and `import` end: the JSON document or the tally under `summary`, then an
/// error when a run conflicted with the one stored under its id.
fn finish(
    json: bool,
    doc: &serde_json::Value,
    summary: &str,
    tally: &Tally,
) -> Result<ExitCode, Error> {
    if json {
        print_json(doc)?;
    } else {
        print_text(&render::tally(summary, tally))?;
    }
    match tally.conflicts_error() {
        Some(e) => Err(e.into()),
        None => Ok(ExitCode::SUCCESS),
    }
}
