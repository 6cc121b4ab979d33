//! Sentences shared by every rendering of a run (terminal, Markdown, HTML), so the three say
//! the same thing in the same words.

use crate::analysis::class::MetricClass;
use crate::analysis::compare::Verdict;
pub use crate::analysis::words::{
    busy_words, clock_words, fmt_value, jiffies_on, ratio_ci, stall_cause,
};
use crate::lab::threads::PairClass;
use crate::record::{Finding, RunRecord};

/// The verdict that answers a run: the largest decided difference, else the first not
/// decided (it says what would decide), else the first no change.
pub fn answer_of(verdicts: &[Verdict]) -> Option<&Verdict> {
    let decided = verdicts
        .iter()
        .filter(|v| v.class().called())
        .max_by(|a, b| a.ratio.total_cmp(&b.ratio));
    decided
        .or_else(|| {
            verdicts
                .iter()
                .find(|v| v.class() == MetricClass::NotDecided)
        })
        .or_else(|| verdicts.first())
}

/// A verdict in a few words: "populated against lazy: FASTER, 9.3×", "uffd against lazy: NOT
/// DECIDED (`--reps 7` can decide)".
pub fn verdict_short(v: &Verdict) -> String {
    let head = format!("{} against {}: {}", v.variant(), v.against(), v.class());
    match v.class() {
        MetricClass::NotDecided => match v.undecided.as_ref().and_then(|u| u.needed()) {
            Some(k) => format!("{head} (`--reps {k}` can decide)"),
            None => format!("{head} (more repetitions can decide)"),
        },
        MetricClass::NoChange => head,
        MetricClass::Faster | MetricClass::Slower => {
            format!("{head}, {}", crate::analysis::quantity::ratio(v.ratio))
        }
    }
}

/// A verdict's number with its interval: "1.25 µs vs 11.6 µs (95% CI of the ratio 9.1–9.5×)".
pub fn verdict_number(v: &Verdict) -> String {
    let [b, a] = v.medians_variant_baseline();
    let both = crate::analysis::quantity::format_all(&[b, a], &v.unit);
    format!("{} vs {} ({})", both[0], both[1], ratio_ci(v.ci95))
}

/// What explains a verdict: the stall the slower side waited for, else how the judged variant
/// maps pages (its faults per page) where the scenario counts them.
pub fn verdict_cause(v: &Verdict, r: &RunRecord) -> String {
    if let Some(c) = &v.cause {
        return stall_cause(c);
    }
    let Some(variant) = r.variant(v.variant()) else {
        return String::new();
    };
    variant
        .findings
        .iter()
        .find_map(|f| match f {
            Finding::FaultsPerPage {
                pages,
                pf_fixed,
                table_pages,
                ..
            } => {
                let data = pf_fixed - table_pages;
                #[allow(clippy::cast_precision_loss)] // page counts, far below 2^53
                let per = if data > 0.0 {
                    format!("{:.2} pages per stage-2 fault", *pages as f64 / data)
                } else {
                    "no stage-2 fault on the data (mapped before the guest ran)".to_string()
                };
                Some(format!("{}: {per}", v.variant()))
            }
            Finding::UserfaultfdFaults { pages, faults } => {
                #[allow(clippy::cast_precision_loss)]
                let per = *pages as f64 / faults.max(1.0);
                Some(format!(
                    "{}: {per:.2} pages per userfaultfd fault",
                    v.variant()
                ))
            }
            Finding::SrcuStall { .. } => Some(format!("{}: {f}", v.variant())),
            _ => None,
        })
        .unwrap_or_default()
}

/// A thread's fidelity in a few words: "fidelity 6 of 8 within, 2 outside".
fn thread_fidelity(t: &crate::lab::threads::ThreadLine) -> String {
    t.fidelity.map_or_else(
        || "fidelity not evaluated".to_string(),
        |f| {
            format!(
                "fidelity {} of {} within{}{}",
                f.within,
                f.judged,
                if f.outside > 0 {
                    format!(", {} outside", f.outside)
                } else {
                    String::new()
                },
                if f.fitted > 0 {
                    format!(", {} fitted apart", f.fitted)
                } else {
                    String::new()
                }
            )
        },
    )
}

/// One before/after of a thread, in its terms: "the creation stall (ready_ms), always-defer
/// 22.0 ms → lifecycle-keyed 0.500 ms: FIXED 44.0× (the stall gone: 20/20 → 0/20 repetitions)".
fn headline_pair(
    p: &crate::lab::threads::PairVerdict,
    sides: Option<(&'static str, &'static str)>,
) -> String {
    let c = &p.comparison;
    let both = crate::analysis::quantity::format_all(&c.median, &c.unit);
    let (a, b) = sides.unwrap_or((p.pair.before, p.pair.after));
    let ratio = if p.class.called() {
        let r = if c.ratio < 1.0 {
            1.0 / c.ratio
        } else {
            c.ratio
        };
        format!(" {}", crate::analysis::quantity::ratio(r))
    } else {
        String::new()
    };
    let mut facts = Vec::new();
    if let Some([sa, sb]) = p.stalled {
        let recurs = crate::lab::threads::recurs;
        let what = match (recurs(sa), recurs(sb)) {
            (true, false) => "the stall gone",
            (true, true) => "still stalls",
            (false, true) => "a new stall",
            (false, false) => "no stall",
        };
        facts.push(format!(
            "{what}: {}/{} → {}/{} repetitions",
            sa[0], sa[1], sb[0], sb[1]
        ));
    }
    for (metric, unit, x, y) in &p.shown {
        let both = crate::analysis::quantity::format_all(&[*x, *y], unit);
        facts.push(format!("{metric} {} → {}", both[0], both[1]));
    }
    if p.class == PairClass::Metric(MetricClass::NotDecided)
        && let Some(k) = c.undecided.as_ref().and_then(|u| u.needed())
    {
        facts.push(format!("about {k} samples a side would decide it"));
    }
    let facts = if facts.is_empty() {
        String::new()
    } else {
        format!(" ({})", facts.join("; "))
    };
    format!(
        "{} ({}), {a} {} → {b} {}: {}{ratio}{facts}",
        p.about, p.pair.metric, both[0], both[1], p.class
    )
}

/// A thread on one line: where its showcase ran, each before/after judged as one verdict, and
/// its fidelity beside it.
pub fn thread_line(t: &crate::lab::threads::ThreadLine) -> String {
    let fidelity = thread_fidelity(t);
    if t.headlines.is_empty() {
        return format!(
            "{} {}: no before/after run of it here (`hvlab suite` runs one) · {fidelity}",
            t.id, t.title
        );
    }
    let mut parts: Vec<String> = Vec::new();
    let mut last_host = String::new();
    for h in &t.headlines {
        let host = format!("{} at HZ={}", h.profile, h.hz);
        let pairs: Vec<String> = h.pairs.iter().map(|p| headline_pair(p, h.sides)).collect();
        if host == last_host {
            parts.push(pairs.join("; "));
        } else {
            parts.push(format!("on {host}: {}", pairs.join("; ")));
            last_host = host;
        }
    }
    format!("{} {} · {}", t.id, parts.join("; "), fidelity)
}

/// A thread's title with its fidelity, for pages that list the threads in full.
pub fn thread_title(t: &crate::lab::threads::ThreadLine) -> String {
    format!("{} {} · {}", t.id, t.title, thread_fidelity(t))
}

/// "How to read this": what a reader needs before the numbers, one line each.
pub const HOW_TO_READ: [(&str, &str); 7] = [
    (
        "question and answer",
        "each scenario asks one question (a baseline and the comparisons that matter); the answer is the verdict that settles it, the other verdicts of the run counted beside it and listed on its page.",
    ),
    (
        "verdicts",
        "FASTER or SLOWER: established (an exact rank test at p < 0.05 after Holm's correction over the comparisons judged together, at least 4 samples a side, and the whole 95% CI of the ratio beyond 5%); FIXED or REGRESSED: the same for a stall that went away or appeared; NO CHANGE: within 5% where the test could have called a change; NOT DECIDED: the samples could not settle it, with the repetitions that would.",
    ),
    (
        "median and 95% CI",
        "every time is the median of the repetitions; the CI is a bootstrap 95% confidence interval of that median (of the ratio, for a comparison).",
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
        "the backend `model` is hvlab's executable model of the kernel mechanism, with the cost profile of the host named in the host column: a prediction for that host, not a measurement here. See the fidelity page for how well it matches the kernel threads.",
    ),
    (
        "setup",
        "the parameters set away from their defaults or that differ between a row's runs; the seed and the suite's bookkeeping are on each run's page.",
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
    use crate::lab::fidelity::{Judged, ThreadReport};
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

// ---- What lab's suite and sweeps could not do, in words ----

/// A suite unit this host could not run: `scenario on backend: why`.
pub fn skipped_unit(s: &crate::lab::suite::Skipped) -> String {
    format!("{} on {}: {}", s.scenario, s.backend, s.why)
}

/// A sweep point that did not run: `k1=v1, k2=v2: why`.
pub fn point_problem(p: &crate::lab::sweep::PointProblem) -> String {
    format!("{}: {}", p.point, p.why)
}

/// Why a sweep goes on without a store-cost estimate.
pub fn sweep_cost_unknown(why: &crate::lab::Error) -> String {
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

/// The line `hvlab vm` prints before it boots: the clock the guest measures on.
pub fn clock_line(clock: hvlab_core::host::Clock) -> String {
    match clock {
        hvlab_core::host::Clock::Wall => "clock: wall (guest times are real time)".to_string(),
        hvlab_core::host::Clock::Icount => "clock: icount, QEMU's instruction clock (-icount shift=0,sleep=off,align=off): a guest time is the instructions it took, the same on a busy host; jiffies are virtual ticks".to_string(),
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
