//! The model's prediction of the change a kab measured, in words: after the verdicts in the
//! terminal, and in at most three lines of the cover letter. Every figure here is predicted.

use super::words::{pair, sides_word};
use crate::analysis::quantity::fixed_decimals;
use crate::export::escape;
use crate::kernel::vm::Accel;
use crate::lab::kab;

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
        (None, Some(why)) => out.push(format!("  on this host: none ({why})")),
        (None, None) => {}
    }
    if let Some(r) = &p.reporters_host {
        out.push(format!("  on {} ({}):", r[0].profile, r[0].setup));
        out.push(format!("    {}", reporters_line(r)));
    }
    out
}

/// The prediction in the cover letter: at most three lines.
pub(super) fn prediction_markdown(p: Option<&kab::KabPrediction>) -> Vec<String> {
    let Some(p) = p else {
        return vec![
            "Model prediction: none (the model predicts the lifecycle scenario only)".into(),
        ];
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
        (None, Some(why)) => out.push(format!("- here: none ({why})")),
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
