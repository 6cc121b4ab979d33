//! The model's prediction of the change a kab measured, in words: after the verdicts in the
//! terminal, and in at most three lines of the cover letter. Every figure here is predicted.

use super::words::{pair, sides_word};
use crate::analysis::quantity::fixed_decimals;
use crate::export::escape;
use crate::kernel::vm::Accel;
use crate::lab::fidelity::memory_patch::{MemoryPrediction, VariantPfFixed, mmu_words};
use crate::lab::kab;
use crate::lab::kab::ThisHostMissing;

/// Whether a side's prediction matched its measurement, in words.
fn agreement_words(agrees: [Option<bool>; 2]) -> String {
    match agrees {
        [Some(true), Some(true)] => "as measured on A and B".into(),
        [a, b] => {
            let miss: Vec<&str> = [(a, "A"), (b, "B")]
                .iter()
                .filter(|(x, _)| *x == Some(false))
                .map(|(_, s)| *s)
                .collect();
            if miss.is_empty() {
                "not compared with a measurement".into()
            } else {
                format!(
                    "DIFFERS from the measurement on {} (hvlab fidelity shows the rows)",
                    miss.join(" and ")
                )
            }
        }
    }
}

/// One variant's prediction on this host: the stall counts, each wait in jiffies.
fn variant_prediction(v: &kab::VariantPrediction) -> String {
    let mut parts = vec![format!("stalls {}", pair(v.stalls))];
    for w in &v.waits {
        let sides = sides_word(w.sides);
        parts.push(format!(
            "{} waits for the grace period of {} ({sides}): {} jiffies",
            w.ioctl,
            w.on,
            pair(w.jiffies)
        ));
    }
    parts.join("; ")
}

/// The reporter's host, one line: the VM's creation before and after, and the stalls.
fn reporters_line(r: &[crate::lab::fidelity::srcu::OnReportersHost; 2]) -> String {
    let saved = r[0].ready_ms.median - r[1].ready_ms.median;
    format!(
        "{} VM ready {} → {} ms ({}{} ms per VM creation); first KVM_CREATE_VCPU {} → {} ms; stalls {}",
        r[0].variant,
        fixed_decimals(r[0].ready_ms.median),
        fixed_decimals(r[1].ready_ms.median),
        if saved >= 0.0 { "−" } else { "+" },
        fixed_decimals(saved.abs()),
        fixed_decimals(r[0].first_vcpu_ms.median),
        fixed_decimals(r[1].first_vcpu_ms.median),
        pair([r[0].stalls.median, r[1].stalls.median])
    )
}

/// The model's prediction of the change, after the measured verdicts.
pub(super) fn prediction_lines(p: &kab::KabPrediction, accel: Accel, width: usize) -> Vec<String> {
    let mut out = vec!["predicted by the model (not measured):".to_string()];
    if !p.unknown.is_empty() {
        out.push(format!(
            "  nothing: the model does not know the kernels ({})",
            p.unknown.join("; ")
        ));
        return out;
    }
    let strategy = |i: usize| p.strategies[i].as_ref().map_or("?", |s| s.name);
    out.push(format!(
        "  strategies: A {} ({}), B {} ({})",
        strategy(0),
        p.strategies[0].as_ref().map_or("", |s| s.from.as_str()),
        strategy(1),
        p.strategies[1].as_ref().map_or("", |s| s.from.as_str()),
    ));
    match (&p.this_host, &p.this_host_missing) {
        (Some(h), _) => {
            out.push(format!(
                "  on this host, under {accel} (A calibrated in its guest{}: {}):",
                if h.calibrated_now {
                    " by this kab"
                } else {
                    ", cached"
                },
                h.profile_path.display()
            ));
            for v in &h.variants {
                out.push(format!(
                    "    {:<width$}  {}; {}",
                    v.variant,
                    variant_prediction(v),
                    agreement_words(v.agrees)
                ));
            }
        }
        (None, Some(why)) => out.push(format!("  on this host: none ({})", missing_words(*why))),
        (None, None) => {}
    }
    if let Some(r) = &p.reporters_host {
        out.push(format!("  on {} ({}):", r[0].profile, r[0].setup));
        out.push(format!("    {}", reporters_line(r)));
    }
    out
}

/// A count with thousands separators.
fn count(x: u64) -> String {
    fixed_decimals(x as f64)
}

/// One MMU's prediction for a variant: "pf_fixed 512 → 4,097 (legacy MMU)", and the
/// measurement beside it when the boots ran that MMU.
fn pf_fixed_words(v: &VariantPfFixed) -> String {
    let mut s = format!(
        "pf_fixed {} → {} ({})",
        count(v.pf_fixed[0]),
        count(v.pf_fixed[1]),
        mmu_words(v.mmu)
    );
    if let [Some(a), Some(b)] = v.measured {
        let exact = a == v.pf_fixed[0] as f64 && b == v.pf_fixed[1] as f64;
        s.push_str(&if exact {
            ", as measured".to_string()
        } else {
            format!(
                ", DIFFERS from the measured {} → {}",
                fixed_decimals(a),
                fixed_decimals(b)
            )
        });
    }
    s
}

/// The memory model's line beside a variant's verdict: the MMU the boots ran first.
pub(super) fn memory_beside(p: &MemoryPrediction, variant: &str) -> Option<String> {
    let mut rows: Vec<&VariantPfFixed> = p
        .this_host
        .iter()
        .filter(|v| v.variant == variant)
        .collect();
    if rows.is_empty() {
        return None;
    }
    rows.sort_by_key(|v| v.measured.iter().all(Option::is_none));
    let parts: Vec<String> = rows.into_iter().map(pf_fixed_words).collect();
    Some(format!("model: {}", parts.join("; ")))
}

/// The memory model's strategies, what is missing, and thread 004's host, after the verdicts.
pub(super) fn memory_lines(p: &MemoryPrediction) -> Vec<String> {
    let mut out = vec![
        "predicted by the memory model (not measured; counts only, no profile read):".to_string(),
    ];
    if !p.unknown.is_empty() {
        let why: Vec<String> = p.unknown.iter().map(ToString::to_string).collect();
        out.push(format!("  nothing: {}", why.join("; ")));
        return out;
    }
    let strategy = |i: usize| {
        p.strategies[i]
            .as_ref()
            .map_or_else(String::new, |s| format!("{} ({})", s.name, s.from))
    };
    out.push(format!(
        "  strategies: A {}, B {}",
        strategy(0),
        strategy(1)
    ));
    if let Some(why) = &p.this_host_missing {
        out.push(format!("  on this host: none ({why})"));
    }
    if let Some(r) = &p.reporters_host {
        let said: Vec<String> = r
            .thread
            .iter()
            .zip(["A", "B"])
            .filter_map(|(t, side)| t.map(|t| format!("{side}: the thread measured {t}")))
            .collect();
        out.push(format!(
            "  on {}: pf_fixed {} → {}{}",
            r.setup,
            count(r.pf_fixed[0]),
            count(r.pf_fixed[1]),
            if said.is_empty() {
                String::new()
            } else {
                format!(" ({})", said.join("; "))
            }
        ));
    }
    out
}

/// The memory prediction in the cover letter: at most three lines.
fn memory_markdown(p: &MemoryPrediction) -> Vec<String> {
    if !p.unknown.is_empty() {
        let why: Vec<String> = p.unknown.iter().map(ToString::to_string).collect();
        return vec![format!("Model prediction: none ({})", why.join("; "))];
    }
    let mut out =
        vec!["Model prediction (hvlab's memory model; predicted, not measured):".to_string()];
    let here: Vec<String> = p
        .this_host
        .iter()
        .filter(|v| v.measured.iter().any(Option::is_some))
        .map(|v| format!("{} {}", v.variant, pf_fixed_words(v)))
        .collect();
    if !here.is_empty() {
        out.push(format!("- here: {}", here.join(", ")));
    }
    if let Some(r) = &p.reporters_host {
        out.push(format!(
            "- {}: pf_fixed {} → {}",
            r.setup,
            count(r.pf_fixed[0]),
            count(r.pf_fixed[1])
        ));
    }
    out
}

/// The prediction in the cover letter: at most three lines.
pub(super) fn prediction_markdown(
    p: Option<&kab::KabPrediction>,
    memory: Option<&MemoryPrediction>,
) -> Vec<String> {
    let Some(p) = p else {
        return memory.map_or_else(
            || vec!["Model prediction: none (the model predicts the lifecycle and memory scenarios only)".into()],
            memory_markdown,
        );
    };
    if !p.unknown.is_empty() {
        return vec![format!(
            "Model prediction: none, the model does not know the change ({}); declare it with `--model-strategy`",
            p.unknown.join("; ")
        )];
    }
    let mut out = vec!["Model prediction (hvlab's model; predicted, not measured):".to_string()];
    match (&p.this_host, &p.this_host_missing) {
        (Some(h), _) => {
            let stalls = h
                .variants
                .iter()
                .map(|v| format!("{} {}", v.variant, pair(v.stalls)))
                .collect::<Vec<_>>()
                .join(", ");
            let rows: Vec<bool> = h.variants.iter().flat_map(|v| v.agrees).flatten().collect();
            out.push(format!(
                "- here (base calibrated in its guest): stalls A → B {stalls}; agrees with the measurement in {} of {} (variant, kernel) pairs",
                rows.iter().filter(|x| **x).count(),
                rows.len()
            ));
        }
        (None, Some(why)) => out.push(format!("- here: none ({})", missing_words(*why))),
        (None, None) => {}
    }
    if let Some(r) = &p.reporters_host {
        out.push(format!(
            "- where thread 001 saw the bug (`{}`: {}): {}",
            r[0].profile,
            r[0].setup,
            escape::markdown_cell(&reporters_line(r))
        ));
    }
    out
}

/// Why the model predicted nothing for this host, in words.
fn missing_words(why: ThisHostMissing) -> &'static str {
    match why {
        ThisHostMissing::CalibrationNotKept => {
            "the base's calibration in its guest was not kept or did not come back (the notes above say why)"
        }
        ThisHostMissing::NotCalibrated => {
            "no profile of A calibrated under this accelerator is cached, and --no-calibrate was given"
        }
        ThisHostMissing::NoLifecycleRun => "a side brought back no lifecycle run",
    }
}
