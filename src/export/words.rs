//! Sentences shared by every rendering of a run (terminal, Markdown, HTML), so the three say
//! the same thing in the same words.

pub use crate::analysis::words::{busy_words, fmt_value};
use crate::record::RunRecord;

/// One line that opens a run's account, as hyperfine opens with its summary: the scenario and
/// backend, then the strongest significant verdict (or that there was none), how many
/// variants ran and how many findings there are.
pub fn run_headline(r: &RunRecord) -> String {
    let ran = r.variants.iter().filter(|v| v.is_ok()).count();
    let findings: usize = r.variants.iter().map(|v| v.findings.len()).sum();
    let verdict = r
        .verdicts
        .iter()
        .filter(|v| v.significant)
        .max_by(|a, b| a.ratio.total_cmp(&b.ratio))
        .map_or_else(
            || {
                if r.verdicts.is_empty() {
                    "no comparison".to_string()
                } else if r.verdicts.iter().any(|v| v.undecided.is_some()) {
                    "NOT DECIDED between variants (see the verdicts)".to_string()
                } else {
                    "NO CHANGE between variants".to_string()
                }
            },
            ToString::to_string,
        );
    let profile = r
        .profile
        .as_ref()
        .map_or(String::new(), |p| format!(" ({p})"));
    format!(
        "{} on {}{profile}: {verdict} ({ran} of {} variants ran, {findings} finding{})",
        r.scenario,
        r.backend,
        r.variants.len(),
        if findings == 1 { "" } else { "s" }
    )
}

/// One row of the report's opening table: a run, its verdict in a few words, the number that
/// matters with its CI, what the faster variant buys, and the parameters that set this run
/// apart from the other runs of its scenario (without them two rows can seem to contradict).
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    /// The run's id: the anchor of its section.
    pub run_id: String,
    /// Scenario.
    pub scenario: String,
    /// `kvm`, or `model (profile)`.
    pub backend: String,
    /// The host the numbers describe, short: kernel (or kernel under test), flavour, HZ.
    pub host: String,
    /// `key=value` for each parameter that differs between runs of this scenario.
    pub setup: String,
    /// The headline verdict, a few words.
    pub verdict: String,
    /// The headline metric of the variant the verdict favours, with its unit and 95% CI.
    pub number: String,
    /// What choosing the faster variant saves: "memslots-first saves 7.2 ms of 7.85 ms".
    pub buys: String,
}

/// Parameters that never set a run apart for a reader (bookkeeping of sweeps).
const BOOKKEEPING: [&str; 3] = ["sweep", "sweep_point", "sweep_grid"];

/// Per record, the `key=value` pairs of parameters whose values differ between the records of
/// the same scenario.
pub fn distinguishing_params(records: &[RunRecord]) -> Vec<String> {
    records
        .iter()
        .map(|r| {
            let peers: Vec<&RunRecord> = records
                .iter()
                .filter(|o| o.scenario == r.scenario)
                .collect();
            r.params
                .iter()
                .filter(|(k, _)| !BOOKKEEPING.contains(&k.as_str()))
                .filter(|(k, v)| peers.iter().any(|o| o.params.get(*k) != Some(v)))
                .map(|(k, v)| {
                    format!(
                        "{k}={}",
                        v.as_str().map_or_else(|| v.to_string(), String::from)
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        })
        .collect()
}

/// The host a run's numbers describe, in a few words.
pub fn short_host(r: &RunRecord) -> String {
    let h = &r.host;
    match &h.under_test {
        Some(u) => format!("Linux {} under test ({}), HZ {}", u.release, u.accel, h.hz),
        None => format!("Linux {}, {}, HZ {}", h.kernel, h.kvm_flavour, h.hz),
    }
}

/// The opening table of a report: one row per run.
pub fn summary_rows(records: &[RunRecord]) -> Vec<SummaryRow> {
    let setups = distinguishing_params(records);
    records
        .iter()
        .zip(setups)
        .map(|(r, setup)| summary_row(r, setup))
        .collect()
}

fn summary_row(r: &RunRecord, setup: String) -> SummaryRow {
    let q = crate::analysis::quantity::ratio;
    let headline = crate::scenario::find(&r.scenario)
        .map(|i| i.headline.to_string())
        .unwrap_or_default();
    let strongest = r
        .verdicts
        .iter()
        .filter(|v| v.significant)
        .max_by(|a, b| a.ratio.total_cmp(&b.ratio));
    let ran = r.variants.iter().filter(|v| v.is_ok()).count();
    let verdict = match strongest {
        Some(v) => format!("{} {} faster than {}", v.faster, q(v.ratio), v.slower),
        None if r.verdicts.iter().any(|v| v.undecided.is_some()) => "NOT DECIDED".to_string(),
        None if !r.verdicts.is_empty() => "NO CHANGE".to_string(),
        None if ran == 0 => "no variant ran".to_string(),
        None => format!(
            "{ran} of {} variants ran; nothing compared",
            r.variants.len()
        ),
    };
    // The number that matters: the favoured variant's headline, else the first that has it.
    let variant = strongest
        .and_then(|v| r.variants.iter().find(|x| x.name == v.faster))
        .or_else(|| {
            r.variants
                .iter()
                .find(|x| x.is_ok() && x.metrics.contains_key(&headline))
        });
    let number = variant
        .and_then(|v| v.metrics.get(&headline).map(|m| (v, m)))
        .map_or_else(String::new, |(v, m)| {
            format!(
                "{}: {headline} {} (95% CI {})",
                v.name,
                fmt_value(m.median, &m.unit),
                crate::analysis::quantity::format_range(m.ci95[0], m.ci95[1], &m.unit)
            )
        });
    let buys = strongest.map_or_else(String::new, |v| {
        let [fast, slow] = v.medians;
        let both = crate::analysis::quantity::format_all(&[slow - fast, slow], &v.unit);
        format!("{} saves {} of {}", v.faster, both[0], both[1])
    });
    SummaryRow {
        run_id: r.run_id.clone(),
        scenario: r.scenario.clone(),
        backend: r
            .profile
            .as_ref()
            .map_or_else(|| r.backend.to_string(), |p| format!("{} ({p})", r.backend)),
        host: short_host(r),
        setup,
        verdict,
        number,
        buys,
    }
}

/// "How to read this": what a reader needs before the numbers, one line each.
pub const HOW_TO_READ: [(&str, &str); 5] = [
    (
        "median and 95% CI",
        "every time is the median of the repetitions; the CI is a bootstrap 95% confidence interval of that median (of the ratio, for a comparison). Non-overlapping CIs are a real difference; a verdict also needs an exact rank test at p < 0.05 and at least 4 samples per side.",
    ),
    (
        "stall",
        "an ioctl that waited for an SRCU grace period started by an earlier ioctl: about a jiffy or more (4 ms at HZ=250), named with its cause.",
    ),
    (
        "count",
        "an exact number of events (faults, exits, pins), shown without a unit; a median of identical counts is that count.",
    ),
    (
        "model row",
        "the backend `model` is hvlab's executable model of the kernel mechanism with a cost profile (in parentheses): a prediction for that host, not a measurement here. See the fidelity page for how well it matches the kernel threads.",
    ),
    (
        "setup",
        "the parameters that differ between runs of the same scenario; compare rows only with the setup in mind.",
    ),
];

/// A figure with its unit, at a precision a person reads at a glance (counts exact): the one
/// formatter, [`crate::analysis::quantity`].
pub fn figure(value: f64, unit: &str) -> String {
    fmt_value(value, unit)
}

fn group_thousands(value: f64) -> String {
    crate::analysis::quantity::count(value)
}

/// A published range: one value, or low–high, or "< high" when the thread gives a bound.
pub fn published_range(p: &crate::lab::fidelity::Published) -> String {
    if p.low == p.high {
        figure(p.low, p.unit)
    } else if p.low == 0.0 {
        format!("< {}", figure(p.high, p.unit))
    } else if p.high.is_infinite() {
        format!("> {}", figure(p.low, p.unit))
    } else {
        crate::analysis::quantity::format_range(p.low, p.high, p.unit)
    }
}

/// The model's figure: the median, and the spread when there is one.
pub fn model_figure(m: &crate::lab::fidelity::ModelFigure) -> String {
    if m.n <= 1 || m.min == m.max {
        figure(m.median, m.unit)
    } else {
        format!(
            "{} ({}, n={})",
            figure(m.median, m.unit),
            crate::analysis::quantity::format_range(m.min, m.max, m.unit),
            m.n
        )
    }
}

/// The verdict of a fidelity row, and its note (commentary, never a verdict).
pub fn agreement(row: &crate::lab::fidelity::Row) -> String {
    use crate::lab::fidelity::Agreement;
    let verdict = match &row.agreement {
        Agreement::Within => "within the published range".to_string(),
        Agreement::Outside => "OUTSIDE the published range (a miss)".to_string(),
        Agreement::Fitted { key, on } => {
            format!("fitted, not counted: moves with {key}, fitted on {on}")
        }
    };
    match row.note {
        Some(note) => format!("{verdict}; note: {note}"),
        None => verdict,
    }
}

/// The cells of the fidelity table, one row per published figure: thread, quantity, setup,
/// published, model, verdict. Terminal, Markdown and HTML lay these out; none rewords them.
pub fn fidelity_cells(reports: &[crate::lab::fidelity::ThreadReport]) -> Vec<[String; 6]> {
    reports
        .iter()
        .flat_map(|t| {
            t.rows.iter().map(move |r| {
                [
                    format!("{} {}", t.id, t.scenario),
                    r.quantity.to_string(),
                    r.setup.clone(),
                    format!("{} ({})", published_range(&r.published), r.published.source),
                    model_figure(&r.model),
                    agreement(r),
                ]
            })
        })
        .collect()
}

/// One line per thread on what was fitted, and on what.
pub fn fidelity_fitted(reports: &[crate::lab::fidelity::ThreadReport]) -> Vec<String> {
    reports
        .iter()
        .map(|t| {
            if t.fitted.is_empty() {
                format!(
                    "{} {}: nothing fitted; every input has an independent source",
                    t.id, t.title
                )
            } else {
                let list = t
                    .fitted
                    .iter()
                    .map(|f| format!("{}.{} on {}", f.profile, f.key, f.fitted_on))
                    .collect::<Vec<_>>()
                    .join("; ");
                format!("{} {}: fitted {list}", t.id, t.title)
            }
        })
        .collect()
}

/// The line that opens the fidelity table, verdicts first: only judged rows count.
pub fn fidelity_headline(reports: &[crate::lab::fidelity::ThreadReport]) -> String {
    use crate::lab::fidelity::ThreadReport;
    let sum = |f: fn(&ThreadReport) -> usize| reports.iter().map(f).sum::<usize>();
    format!(
        "fidelity: {} threads, {} judged figures: {} within the published range, {} outside; {} fitted rows shown apart (not counted)",
        reports.len(),
        sum(ThreadReport::judged),
        sum(ThreadReport::within),
        sum(ThreadReport::outside),
        sum(ThreadReport::fitted_rows),
    )
}

/// The noise a run was measured in, in one line (under the host line).
pub fn noise_line(n: &hvlab_core::noise::Noise) -> String {
    let mut parts = vec![format!(
        "load {:.1}→{:.1} on {} cores, {} other runnable (median; max {})",
        n.load1[0], n.load1[1], n.cores, n.runnable_others[0], n.runnable_others[1]
    )];
    if n.oversubscribed() {
        parts.push(format!(
            "{} threads of this run on {} cores (their own waiting is not counted as busy)",
            n.own_threads, n.cores
        ));
    }
    if let Some(some) = n.cpu_pressure_some_pct {
        parts.push(format!(
            "CPU pressure {some:.0}% some / {:.0}% full",
            n.cpu_pressure_full_pct.unwrap_or(0.0)
        ));
    }
    if let Some(steal) = n.steal_pct {
        parts.push(format!("steal {steal:.1}%"));
    }
    let per_rep = match n.involuntary_per_rep.as_slice() {
        [median, max] => format!(" ({median} per repetition, max {max})"),
        _ => String::new(),
    };
    parts.push(format!(
        "measuring thread: {} involuntary switches{per_rep}, {} migrations",
        n.involuntary_switches,
        n.migrations.map_or("?".to_string(), |m| m.to_string())
    ));
    parts.push(format!(
        "clock {} ({})",
        n.clocksource,
        if n.clocksource_stable {
            "stable"
        } else {
            "changed"
        }
    ));
    if let Some(cpus) = &n.pinned_cpus {
        parts.push(format!("pinned to CPU {cpus}"));
    }
    if let Some(w) = &n.quiet_wait {
        parts.push(if w.quiet {
            format!("waited {:.0} s for a quiet host", w.waited_s)
        } else {
            format!(
                "waited {:.0} s for a quiet host, still load {:.1}",
                w.waited_s, w.load1
            )
        });
    }
    format!(
        "noise: {}{}",
        parts.join(", "),
        if n.is_busy() {
            " — busy"
        } else {
            " — quiet"
        }
    )
}

/// Sizes in bytes read as the one formatter writes them (`80.3 GiB`, `412 KiB`).
pub use crate::analysis::quantity::bytes;

/// `412 KiB`, or `400–412 KiB` when the two ends differ.
#[allow(clippy::cast_precision_loss)] // sizes: precision beyond 2^53 bytes is not shown
fn byte_range([lo, hi]: [u64; 2]) -> String {
    crate::analysis::quantity::format_range(lo as f64, hi as f64, "B")
}

/// How a sweep's store cost was found, for the estimate line and the refusal.
fn store_cost_basis(c: &crate::lab::sweep::StoreCost) -> String {
    let samples = if c.samples[0] == c.samples[1] {
        group_thousands_usize(c.samples[0])
    } else {
        format!(
            "{}–{}",
            group_thousands_usize(c.samples[0]),
            group_thousands_usize(c.samples[1])
        )
    };
    format!(
        "{} per point of {samples} samples (variants × metrics × reps), measured by storing point{} {} of the grid, run on the {}, in a scratch store",
        byte_range(c.bytes_per_point),
        if c.probes.len() == 1 { "" } else { "s" },
        c.probes
            .iter()
            .map(|p| group_thousands_usize(p + 1))
            .collect::<Vec<_>>()
            .join(" and "),
        c.measured_on,
    )
}

fn group_thousands_usize(n: usize) -> String {
    #[allow(clippy::cast_precision_loss)] // counts of points and samples, far below 2^53
    group_thousands(n as f64)
}

/// The line a sweep prints before it runs: what its points will take in the store.
pub fn sweep_store_cost(c: &crate::lab::sweep::StoreCost, free: Option<u64>) -> String {
    format!(
        "store: the {} point{} of this shard will take about {} ({}){}",
        group_thousands_usize(c.points),
        if c.points == 1 { "" } else { "s" },
        byte_range(c.bytes),
        store_cost_basis(c),
        free.map_or_else(String::new, |f| format!("; {} free there", bytes(f)))
    )
}

/// Why a sweep is refused: its points would take more than the store's filesystem has free.
pub fn sweep_too_big(c: &crate::lab::sweep::StoreCost, store: &str, free: u64) -> String {
    format!(
        "its {} point{} would take about {} in the store {store} ({}), but its filesystem has {} free. Shrink the grid or --reps, split the sweep with --shard i/N into stores on several filesystems (then `hvlab merge`), point --db at a filesystem with room, or run it with --no-store, which prints every point's results and stores nothing",
        group_thousands_usize(c.points),
        if c.points == 1 { "" } else { "s" },
        byte_range(c.bytes),
        store_cost_basis(c),
        bytes(free)
    )
}

// ---- What lab's suite and sweeps could not do, in words (issue 18, "cli2" block) ----

/// A suite unit this host could not run: `scenario on backend: why`.
pub fn skipped_unit(s: &crate::lab::suite::Skipped) -> String {
    format!("{} on {}: {}", s.scenario, s.backend, s.why)
}

/// A sweep point that did not run: `k1=v1, k2=v2: why`.
pub fn point_problem(p: &crate::lab::sweep::PointProblem) -> String {
    format!("{}: {}", p.point, p.why)
}

/// Why a sweep goes on without a store-cost estimate.
pub fn sweep_cost_unknown(why: &crate::error::Error) -> String {
    format!("warning: the store size of this sweep was not estimated: {why}")
}

// Scenario notices (typed in `scenario::Notice`).

/// A scenario's notice, in words.
pub fn notice(n: &crate::scenario::Notice) -> String {
    use crate::scenario::Notice;
    match n {
        Notice::CustomOrderAlongside { variants } => format!(
            "running the --set order= sequence as variant `custom` alongside --variant {}",
            variants.join(", ")
        ),
        Notice::ThpMode { mode } => format!(
            "THP {mode}: lazy, populated, uffd and the system memory opt out per mapping (MADV_NOHUGEPAGE); thp opts in (MADV_HUGEPAGE)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units_with_three_digits() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1,023 B");
        assert_eq!(bytes(1024), "1.00 KiB");
        assert_eq!(bytes(115_000), "112 KiB");
        assert_eq!(bytes(80 << 30), "80.0 GiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
        assert_eq!(byte_range([112 << 10, 168 << 10]), "112–168 KiB");
        assert_eq!(byte_range([900 << 10, 2 << 20]), "0.879–2.00 MiB");
        assert_eq!(byte_range([5, 5]), "5 B");
    }

    #[test]
    fn a_sweep_too_big_for_its_store_names_the_free_space_and_the_remedies() {
        let cost = crate::lab::sweep::StoreCost {
            points: 1_000_000,
            probes: vec![0, 999_999],
            samples: [60, 60],
            bytes_per_point: [80 << 10, 84 << 10],
            bytes: [80 << 30, 84 << 30],
            measured_on: hvlab_core::BackendKind::Model,
        };
        let why = sweep_too_big(&cost, "/data/hvlab.db", 5 << 30);
        for says in [
            "1,000,000 points",
            "/data/hvlab.db",
            "5.00 GiB free",
            "--shard",
            "--no-store",
        ] {
            assert!(why.contains(says), "{says}: {why}");
        }
    }
}
