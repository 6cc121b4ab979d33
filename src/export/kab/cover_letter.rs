//! The paragraph a patch's cover letter can quote (`kab --markdown`): at most 25 lines of
//! Markdown with the host, both sides, a row per variant, the model's prediction and the
//! command that reproduces it.

use super::prediction::prediction_markdown;
use super::words::{
    busy_boots, calls_lines, cause_words, change_words, confinement, failure_lines, sides_word,
    small_change_words, stall_words,
};
use crate::analysis::class::VariantClass;
use crate::export::escape;
use crate::kernel::Kernel;
use crate::kernel::build::{BuildInfo, How};
use crate::kernel::vm;
use crate::lab::kab::{KabOutcome, VariantVerdict};

/// The cover-letter paragraph: at most 25 lines of Markdown.
pub fn markdown(o: &KabOutcome, command: &str) -> String {
    let mut out = vec![
        host_line(o),
        String::new(),
        format!("- A: {}", side(&o.a, o.builds[0].as_ref())),
        format!("- B: {}", side(&o.b, o.builds[1].as_ref())),
        format!(
            "- {} boot(s) × {} repetitions a side, ABBA; counts exact, jiffies rank-tested{}{}",
            o.boots_per_side,
            o.reps,
            match o.accel.clock {
                hvlab_core::host::Clock::Wall => "",
                hvlab_core::host::Clock::Icount =>
                    ", times rank-tested in guest instructions (QEMU's instruction clock)",
            },
            match o.host_busy().as_slice() {
                [] => String::new(),
                busy => format!(
                    "; **nothing judged: the host was busy** ({})",
                    busy_boots(busy)
                ),
            }
        ),
        String::new(),
        "| variant | verdict | stalls A → B | before → after | cause | cost |".into(),
        "|---|---|---|---|---|---|".into(),
    ];
    let predicted = prediction_markdown(o.prediction.as_ref(), o.memory_prediction.as_ref());
    // Header, blank, three bullets, blank, the table's two lines; after it a blank, the
    // prediction, a blank and the command.
    let budget = 25 - 8 - 3 - predicted.len();
    out.extend(o.verdicts.iter().take(budget).map(table_row));
    out.push(String::new());
    out.extend(predicted);
    out.push(String::new());
    out.push(format!(
        "Reproduce: `{command}` (hvlab {})",
        o.hvlab_version
    ));
    out.join("\n") + "\n"
}

/// What ran where: the scenarios, this host, and the accelerator.
fn host_line(o: &KabOutcome) -> String {
    format!(
        "**hvlab kab**: {} on `{}` ({}, {} cores{}), QEMU {}",
        o.scenario_names.join(", "),
        o.host.cpu,
        o.host.kernel,
        o.host.cores,
        o.host
            .hypervisor
            .as_deref()
            .map_or(String::new(), |h| format!(
                ", under {}",
                hvlab_core::host::hypervisor_name(h)
            )),
        match o.accel.accel {
            vm::Accel::Kvm => "with nested KVM".to_string(),
            _ => format!("TCG ({}; times not judged)", o.accel.cpu_model),
        }
    )
}

/// A side: the release, its patches with their hashes, and how it was made.
fn side(k: &Kernel, b: Option<&BuildInfo>) -> String {
    let patches = b.map_or(String::new(), |b| {
        b.patches
            .iter()
            .map(|p| format!(" + `{}` (sha256 `{}`)", p.file, &p.sha256[..16]))
            .collect::<String>()
    });
    let how = match b {
        Some(b) => match &b.how {
            How::Modules { modules, .. } => format!(
                "Debian's image, {} rebuilt from {} with {}, {}",
                modules.join(", "),
                b.source,
                b.compiler,
                confinement(b.sandbox)
            ),
            How::Whole => format!(
                "whole kernel from {}, minimal guest config, {}, {}",
                b.source,
                b.compiler,
                confinement(b.sandbox)
            ),
            How::AsShipped { .. } => "Debian's image as shipped".into(),
        },
        None => k.source.clone(),
    };
    format!("`{}`{patches}: {how}", k.release)
}

/// A variant's row: its verdict, the repetitions that stalled, what moved, the stalls' causes
/// and what B costs.
fn table_row(v: &VariantVerdict) -> String {
    let reps = v.stall_reps.map_or("–".to_string(), |r| {
        format!(
            "{}/{} → {}/{}",
            r[0].stalled, r[0].reps, r[1].stalled, r[1].reps
        )
    });
    let moved = v
        .improvements
        .iter()
        .filter(|c| !c.within_jiffy && c.metric != "stalls")
        .chain(&v.regressions)
        .map(change_words)
        .chain(v.changes.iter().map(small_change_words))
        .collect::<Vec<_>>()
        .join("; ");
    let cause = v
        .stalls
        .iter()
        .map(|s| {
            let sides = sides_word([s.a.is_some(), s.b.is_some()]);
            format!("{} ({sides})", stall_words(s))
        })
        .chain(failure_lines(v))
        // A fix is said by its stalls above; every other class by what the scenario
        // attributes its change to.
        .chain(
            v.causes
                .iter()
                .filter(|_| v.class != VariantClass::Fixed)
                .map(cause_words),
        )
        .chain(calls_lines(v))
        .collect::<Vec<_>>()
        .join("; ");
    let cost = v
        .costs
        .iter()
        .map(change_words)
        .collect::<Vec<_>>()
        .join("; ");
    format!(
        "| {} | **{}** | {reps} | {} | {} | {} |",
        escape::markdown_cell(&v.variant),
        v.class.word(),
        cell(moved),
        cell(cause),
        cell(cost)
    )
}

/// A table cell: a dash when empty, escaped as a cell ([`escape::markdown_cell`]).
fn cell(t: String) -> String {
    if t.is_empty() {
        "–".to_string()
    } else {
        escape::markdown_cell(&t)
    }
}
