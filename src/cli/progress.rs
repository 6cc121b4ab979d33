//! Progress on stderr: a bar with ETA on a terminal, nothing when piped or with --json.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::scenario::runner::Progress;

/// An indicatif bar, or nothing.
#[derive(Debug)]
pub struct TermProgress {
    bar: Option<ProgressBar>,
    prefix: String,
}

impl TermProgress {
    /// A bar labelled `prefix` when stderr is a terminal and `quiet` is false.
    pub fn new(prefix: &str, quiet: bool) -> TermProgress {
        let quiet = quiet || super::habits::quiet();
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{prefix:>12} {bar:30.cyan/blue} {pos}/{len} {msg:20} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_prefix(prefix.to_string());
            bar
        });
        TermProgress {
            bar,
            prefix: prefix.to_string(),
        }
    }
}

impl Progress for TermProgress {
    fn start(&self, label: &str, total: u64) {
        if let Some(bar) = &self.bar {
            bar.set_length(total);
            bar.set_position(0);
            bar.set_prefix(format!("{} {label}", self.prefix));
        }
    }

    fn step(&self, detail: &str) {
        if let Some(bar) = &self.bar {
            bar.set_message(detail.to_string());
            bar.inc(1);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
