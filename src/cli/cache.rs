//! `hvlab cache`: what hvlab's kernel cache holds, pruning it, and verifying its sources.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::error::Error;
use super::{print_json, print_table, print_text};
use crate::export::cache as words;
use crate::kernel::cache::{self, PruneRequest, Verified};
use crate::kernel::{cache_dir, now_stamp};

/// `hvlab cache`.
#[derive(Debug, Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    action: Option<CacheAction>,
    /// One JSON document on stdout
    #[arg(long, global = true)]
    json: bool,
    /// List every log, not one line per kind of log
    #[arg(long)]
    all: bool,
}

#[derive(Debug, Subcommand)]
enum CacheAction {
    /// Remove the least recently used entries that no running hvlab uses: those older than
    /// --older-than, then as many as it takes to bring the cache under --keep-size
    Prune {
        /// The size to bring the cache under, e.g. 20G [default: 20G, unless only
        /// --older-than is given]
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        keep_size: Option<u64>,
        /// Remove every entry last used longer ago than this, e.g. 30d
        #[arg(long, value_name = "AGE", value_parser = parse_duration)]
        older_than: Option<Duration>,
        /// Say what would be removed, remove nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Check each unpacked source tree against the checksum taken when it was unpacked; a
    /// changed one is named file by file and unpacked again by its next build (exit 1)
    Verify,
}

/// What `--keep-size` is when neither it nor `--older-than` is given.
const DEFAULT_KEEP: u64 = 20 << 30;

/// `20G`, `512M`, `1.5G`, `4096` (bytes): powers of 1024.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (num, unit) = t
        .find(|c: char| c.is_ascii_alphabetic())
        .map_or((t, ""), |at| t.split_at(at));
    let mult: u64 = match unit
        .trim()
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(format!("`{text}`: give a size such as 20G, 512M or 1.5G")),
    };
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("`{text}`: give a size such as 20G, 512M or 1.5G"))?;
    if !value.is_finite() || value <= 0.0 {
        return Err(format!("`{text}`: a size must be more than 0"));
    }
    // Sizes well below 2^53 bytes: exact enough, and a larger one saturates.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let bytes = (value * mult as f64).round() as u64;
    Ok(bytes)
}

/// `30d`, `12h`, `45m`, `90s` (humantime's forms).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text.trim())
        .map_err(|e| format!("`{text}`: {e}; give a duration such as 30d, 12h, 45m or 90s"))?;
    if d.is_zero() {
        return Err(format!("`{text}`: a duration must be more than 0"));
    }
    Ok(d)
}

/// `hvlab cache [prune | verify]`.
pub(super) fn cache(args: &CacheArgs) -> Result<ExitCode, Error> {
    let dir = cache_dir();
    match &args.action {
        None => {
            let inv = cache::inventory(&dir);
            if args.json {
                print_json(&inv)?;
            } else {
                print_table(&words::inventory(&inv, now_stamp(), args.all))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(CacheAction::Prune {
            keep_size,
            older_than,
            dry_run,
        }) => {
            let req = PruneRequest {
                keep_bytes: keep_size.or(older_than.is_none().then_some(DEFAULT_KEEP)),
                older_than: *older_than,
                dry_run: *dry_run,
            };
            let pruned = cache::prune(&dir, &req)?;
            if args.json {
                print_json(&pruned)?;
            } else {
                print_table(&words::pruned(&pruned, now_stamp()))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Some(CacheAction::Verify) => {
            let checks = cache::verify(&dir)?;
            if args.json {
                print_json(&serde_json::json!({ "sources": checks }))?;
            } else {
                print_text(&words::verified(&checks))?;
            }
            let changed = checks
                .iter()
                .any(|c| matches!(c.result, Verified::Changed { .. }));
            Ok(if changed {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse_at_the_edge_and_bad_ones_name_the_forms() {
        assert_eq!(parse_size("20G"), Ok(20 << 30));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert!(parse_size("20X").expect_err("bad").contains("such as 20G"));
        assert!(parse_size("0").is_err() && parse_size("-1G").is_err());
        assert_eq!(parse_duration("30d"), Ok(Duration::from_secs(30 * 86_400)));
        assert_eq!(parse_duration("45m"), Ok(Duration::from_secs(45 * 60)));
        assert!(
            parse_duration("soon")
                .expect_err("bad")
                .contains("such as 30d")
        );
        assert!(parse_duration("0s").is_err());
    }
}
