//! Moving runs between stores and sites: `merge`, `export`, `import`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use super::{habits, print_json, print_text, render};
use crate::cli::Error;
use crate::export::Format;
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
    #[arg(long, value_enum, default_value_t = Format::Jsonl)]
    format: Format,
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
    let bytes = args
        .format
        .exporter()
        .serialize(&crate::export::Export::runs(&records))?;
    match &args.output {
        Some(path) => {
            crate::export::write_file(&bytes, path)?;
            habits::note(&format!(
                "exported {} run(s) to {}",
                records.len(),
                path.display()
            ));
        }
        None => {
            let mut out = std::io::stdout().lock();
            std::io::Write::write_all(&mut out, &bytes)
                .and_then(|()| std::io::Write::flush(&mut out))
                .map_err(crate::export::ExportError::Output)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `import --format`: the formats import reads back, JSON Lines alone.
fn jsonl_only() -> impl clap::builder::TypedValueParser<Value = Format> {
    use clap::ValueEnum;
    use clap::builder::{PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new(Format::Jsonl.to_possible_value()).map(|_| Format::Jsonl)
}

#[derive(Debug, Args)]
pub(super) struct ImportArgs {
    /// The exported file
    #[arg(value_name = "FILE.jsonl")]
    file: PathBuf,
    /// Format
    #[arg(long, value_parser = jsonl_only(), default_value = "jsonl")]
    format: Format,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
}

/// `hvlab import`: an export's runs into the store, every line checked first.
pub(super) fn import(db: Option<&Path>, args: &ImportArgs) -> Result<ExitCode, Error> {
    // JSON Lines is the one format import reads (jsonl_only).
    debug_assert_eq!(args.format, Format::Jsonl);
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
