//! The habits users expect of a command-line tool: `--version` with the revision, shell
//! completions and a man page generated from the one clap definition, `--quiet`, and colour
//! that follows the terminal, `NO_COLOR` and `--color`.

use std::ffi::OsString;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use anstyle::{AnsiColor, Style};
use clap::{ColorChoice, CommandFactory};

use super::Cli;
use crate::cli::Error;
use crate::export::escape::terminal as safe;

/// `hvlab --version`: the crate version and the git revision it was built from (`-dirty` when
/// the tree had uncommitted changes).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (git ",
    env!("HVLAB_GIT_REV"),
    ")"
);

/// clap's own help and errors, styled like cargo's.
pub fn styles() -> clap::builder::Styles {
    clap::builder::Styles::styled()
        .header(AnsiColor::Green.on_default().bold())
        .usage(AnsiColor::Green.on_default().bold())
        .literal(AnsiColor::Cyan.on_default().bold())
        .placeholder(AnsiColor::Cyan.on_default())
        .error(AnsiColor::Red.on_default().bold())
        .valid(AnsiColor::Green.on_default())
        .invalid(AnsiColor::Yellow.on_default())
}

static QUIET: AtomicBool = AtomicBool::new(false);

/// `--quiet`: no progress bars and no notes on stderr; results, warnings and errors only.
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether `--quiet` was given.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// A note on stderr (what hvlab did or chose), left out with `--quiet`.
pub fn note(text: &str) {
    if !quiet() {
        eprintln!("{}", safe(text));
    }
}

/// The `--color` given on the command line, read before clap parses it so that clap's own
/// help and errors follow it too; a bad value is left for clap to refuse (exit 2, naming the
/// valid ones).
pub fn color_in(args: &[OsString]) -> ColorChoice {
    let mut it = args.iter().skip(1).map(|a| a.to_string_lossy());
    let mut choice = ColorChoice::Auto;
    while let Some(a) = it.next() {
        if a == "--" {
            break;
        }
        let value = if a == "--color" {
            it.next().map(|v| v.to_string())
        } else {
            a.strip_prefix("--color=").map(str::to_string)
        };
        if let Some(v) = value {
            choice = match v.as_str() {
                "always" => ColorChoice::Always,
                "never" => ColorChoice::Never,
                _ => ColorChoice::Auto,
            };
        }
    }
    choice
}

/// Makes hvlab's own output follow `choice`: `auto` colours a terminal unless `NO_COLOR` (or
/// `CLICOLOR=0`) is set, as anstream decides; `always` and `never` override both.
pub fn apply_color(choice: ColorChoice) {
    let c = match choice {
        ColorChoice::Always => anstream::ColorChoice::Always,
        ColorChoice::Never => anstream::ColorChoice::Never,
        ColorChoice::Auto => anstream::ColorChoice::Auto,
    };
    c.write_global();
}

/// Styles of hvlab's own output.
pub mod style {
    use super::{AnsiColor, Style};

    /// A table's header row and a section's title.
    pub const HEADER: Style = Style::new().bold();
    /// Better, within the noise rules: a significant speed-up.
    pub const GOOD: Style = AnsiColor::Green.on_default();
    /// Worse: a significant slow-down or a failed check.
    pub const BAD: Style = AnsiColor::Red.on_default().bold();
    /// Something to read before trusting a number.
    pub const WARN: Style = AnsiColor::Yellow.on_default();
}

/// Prints `text` (control characters escaped) on stdout in `style`; anstream drops the
/// style where colour is off.
pub fn print_styled(text: &str, style: Style) -> Result<(), Error> {
    let mut out = anstream::stdout().lock();
    writeln!(out, "{style}{}{style:#}", safe(text))?;
    Ok(())
}

/// `hvlab completions SHELL`: the completion script on stdout.
pub fn completions(shell: clap_complete::Shell) -> Result<(), Error> {
    let mut cmd = Cli::command();
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut cmd, "hvlab", &mut out);
    out.flush()?;
    Ok(())
}
