//! The first screen of a report and of `hvlab suite`, as data: one row per scenario × backend
//! × host with the scenario's question, the answer (a verdict in the one vocabulary), the
//! number with its interval and the cause. Built one run at a time ([`Summary::add`]), so a
//! report of thousands of runs keeps a line per run, never the runs.

use std::collections::{BTreeMap, BTreeSet};

use crate::analysis::class::MetricClass;
use crate::export::words::{answer_of, verdict_cause, verdict_number, verdict_short};
use crate::record::{RunRecord, RunTag, Warning};
use hvlab_core::BackendKind;

/// Parameters a run carries that never set it apart for a reader: bookkeeping (`show` and
/// `--json` keep them).
pub const BOOKKEEPING: [&str; 8] = [
    "seed",
    "suite",
    "suite_unit",
    "showcase",
    "sweep",
    "sweep_grid",
    "sweep_point",
    "warmup",
];

/// The directory of the runs' pages, beside `index.html`.
pub const RUNS_DIR: &str = "runs";
/// The directory of the pages of rows with several runs.
pub const GROUPS_DIR: &str = "groups";

/// A run id as a file name or an anchor: only characters that need no escaping anywhere.
pub fn anchor(run_id: &str) -> String {
    run_id
        .chars()
        .take(120)
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// A run's heading: scenario, backend, profile, and the parameters set away from their
/// defaults, which tell apart the runs of one profile (the 001 showcase's two strategies).
pub fn run_title(r: &RunRecord) -> String {
    let mut title = format!("{} on {}", r.scenario, r.backend);
    if let Some(p) = &r.profile {
        title.push_str(&format!(" (profile {p})"));
    }
    let setup: Vec<String> = shown_params(r)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    if !setup.is_empty() {
        title.push_str(&format!(", {}", setup.join(", ")));
    }
    title
}

/// The page of the `i`-th run of a report, relative to the index (a sweep point has none).
pub fn run_page_name(i: usize, r: &RunRecord) -> String {
    if r.params.contains_key("sweep") {
        String::new()
    } else {
        format!("{RUNS_DIR}/{i}-{}.html", anchor(&r.run_id))
    }
}

/// The page of the `i`-th row, relative to the index.
pub fn group_page_name(i: usize) -> String {
    format!("{GROUPS_DIR}/{i}.html")
}

/// The warnings that change how to read the first screen, a line per kind and row: the
/// outliers of every variant of a metric together ("irqchip-first 5 of 20, qemu-order 2 of
/// 20"), the others as each run says them; a busy host once per host, naming the scenarios
/// it was busy for (the first run's words).
pub fn warnings(rows: &[SummaryRow]) -> Vec<String> {
    let mut out = Vec::new();
    // Per backend and host: the scenarios run while it was busy, and the first run's words.
    let mut busy_hosts: Vec<(String, Vec<String>, String)> = Vec::new();
    for row in rows {
        let at = format!("{} on {} ({})", row.scenario, row.backend, row.host);
        let host = format!("{} ({})", row.backend, row.host);
        let mut busy = false;
        // Per metric and rule (k): each variant's outlier count, in the order seen.
        let mut outliers: Vec<(String, String, Vec<String>)> = Vec::new();
        let mut others = BTreeSet::new();
        for w in row.lines.iter().flat_map(|l| &l.warnings) {
            match w {
                Warning::BusyHost { .. } if busy => {}
                Warning::BusyHost { .. } => {
                    busy = true;
                    match busy_hosts.iter_mut().find(|b| b.0 == host) {
                        Some(b) => b.1.push(row.scenario.clone()),
                        None => busy_hosts.push((
                            host.clone(),
                            vec![row.scenario.clone()],
                            w.to_string(),
                        )),
                    }
                }
                Warning::Outliers {
                    variant,
                    metric,
                    count,
                    n,
                    k,
                    ..
                } => {
                    let seen = format!("{variant} {count} of {n}");
                    let rule = format!("{k}");
                    match outliers.iter_mut().find(|o| o.0 == *metric && o.1 == rule) {
                        Some(o) if !o.2.contains(&seen) => o.2.push(seen),
                        Some(_) => {}
                        None => outliers.push((metric.clone(), rule, vec![seen])),
                    }
                }
                _ => {
                    if others.insert(w.to_string()) {
                        out.push(format!("{at}: {w}"));
                    }
                }
            }
        }
        for (metric, k, variants) in outliers {
            out.push(format!(
                "{at}: outliers in {metric} (beyond the median ± {k}·MAD): {}; something \
                 interrupted those repetitions, the median and the rank test are robust to them",
                variants.join(", ")
            ));
        }
    }
    for (host, scenarios, words) in busy_hosts {
        out.push(format!("{} on {host}: {words}", scenarios.join(", ")));
    }
    out
}

/// What one run answers, in a line.
#[derive(Debug, Clone, PartialEq)]
pub struct RunLine {
    /// The run.
    pub run_id: String,
    /// Where its page is, relative to the report's index.
    pub page: String,
    /// Its internal tag (a showcase).
    pub tag: Option<RunTag>,
    /// The verdict that answers its scenario's question (the largest decided difference,
    /// else the first not decided, else the first no change).
    pub answer: Option<Answered>,
    /// How many of its verdicts fell in each class.
    pub tally: BTreeMap<MetricClass, usize>,
    /// The headline metric's lowest and highest variant median, with those variants and the
    /// unit.
    pub range: Option<Range>,
    /// Its parameters as a reader reads them: those set away from their default (no
    /// bookkeeping, no empty value).
    pub params: BTreeMap<String, String>,
    /// Every parameter but the bookkeeping, defaults included: what a row's setup reads the
    /// values of the others' parameters from.
    pub all_params: BTreeMap<String, String>,
    /// Its warnings.
    pub warnings: Vec<Warning>,
}

/// A verdict, in the words of the first screen.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    /// Its class.
    pub class: MetricClass,
    /// "populated against lazy: FASTER, 9.3×".
    pub short: String,
    /// "1.25 µs vs 11.6 µs (95% CI of the ratio 9.1–9.5×)".
    pub number: String,
    /// What made the slower side slower, or how the judged variant maps pages.
    pub cause: String,
}

/// A headline's spread over variants (or runs).
#[derive(Debug, Clone, PartialEq)]
pub struct Range {
    /// The metric.
    pub metric: String,
    /// Its unit.
    pub unit: String,
    /// Lowest median and whose.
    pub low: (f64, String),
    /// Highest median and whose.
    pub high: (f64, String),
}

/// One row of the first screen.
#[derive(Debug, Clone, PartialEq)]
pub struct SummaryRow {
    /// The link target: the run's page, or the group's when several runs share the row.
    pub page: String,
    /// Scenario.
    pub scenario: String,
    /// Its question.
    pub question: String,
    /// `kvm` or `model`.
    pub backend: String,
    /// The machine measured, or for a model run the modelled host (from its profile).
    pub host: String,
    /// Parameters a user set or that differ between the row's runs.
    pub setup: String,
    /// Runs in the row.
    pub runs: usize,
    /// The answer in the one vocabulary (or the tally of the runs' answers).
    pub answer: String,
    /// Its class, when the row has one answer.
    pub class: Option<MetricClass>,
    /// The number with its interval (or the headline's spread across runs).
    pub number: String,
    /// The cause.
    pub cause: String,
    /// The other verdicts of the row, counted.
    pub others: String,
    /// The runs (their lines), for the group's page.
    pub lines: Vec<RunLine>,
}

/// Rows in the making: runs grouped by scenario, backend and host, in the order first seen.
/// The suite's showcases are not rows: each answers a thread's question, in the threads'
/// block; their pages are kept here by run id for its links.
#[derive(Debug, Default)]
pub struct Summary {
    groups: Vec<Group>,
    showcase_pages: BTreeMap<String, String>,
}

#[derive(Debug)]
struct Group {
    scenario: String,
    backend: BackendKind,
    host: String,
    lines: Vec<RunLine>,
}

impl Summary {
    /// An empty summary.
    pub fn new() -> Summary {
        Summary::default()
    }

    /// Adds a run (its page at `page`).
    pub fn add(&mut self, r: &RunRecord, page: String) {
        if r.tag == Some(RunTag::Showcase) && r.params.contains_key("suite_unit") {
            self.showcase_pages.insert(r.run_id.clone(), page);
            return;
        }
        let host = host(r);
        let line = run_line(r, page);
        match self
            .groups
            .iter_mut()
            .find(|g| g.scenario == r.scenario && g.backend == r.backend && g.host == host)
        {
            Some(g) => g.lines.push(line),
            None => self.groups.push(Group {
                scenario: r.scenario.clone(),
                backend: r.backend,
                host,
                lines: vec![line],
            }),
        }
    }

    /// The pages of the showcase runs by run id (for the threads' links).
    pub fn showcase_pages(&self) -> &BTreeMap<String, String> {
        &self.showcase_pages
    }

    /// The rows, in catalog order of the scenarios, kvm before the model, then as first seen.
    pub fn rows(&mut self, group_page: impl Fn(usize) -> String) -> Vec<SummaryRow> {
        let order = |s: &str| {
            crate::scenario::Kind::ALL
                .iter()
                .position(|k| k.name() == s)
                .unwrap_or(usize::MAX)
        };
        let mut groups: Vec<(usize, Group)> = std::mem::take(&mut self.groups)
            .into_iter()
            .enumerate()
            .collect();
        groups.sort_by_key(|(i, g)| (order(&g.scenario), g.backend != BackendKind::Kvm, *i));
        groups
            .into_iter()
            .enumerate()
            .map(|(i, (_, g))| row(g, &group_page(i)))
            .collect()
    }
}

/// The host a run's numbers describe: the machine measured (or the kernel under test), or the
/// modelled host from the run's built-in profile. A model run never names this machine.
pub fn host(r: &RunRecord) -> String {
    let h = &r.host;
    if r.backend == BackendKind::Model {
        let profile = r.profile.as_deref().unwrap_or("default");
        let described = crate::model::profile::BUILT_IN
            .iter()
            .find(|(name, _)| *name == profile)
            .and_then(|(name, text)| crate::model::profile::Profile::parse(name, text).ok());
        let mut parts = vec![];
        if let Some(f) = described.as_ref().and_then(|p| p.flavour) {
            parts.push(f.to_string());
        }
        parts.push(format!("HZ {}", h.hz));
        if let Some(n) = described.as_ref().and_then(|p| p.cpus) {
            parts.push(format!("{n} CPUs"));
        }
        return format!("model of {profile} ({})", parts.join(", "));
    }
    match &h.under_test {
        // A kernel on the instruction clock is a host of its own: its rows never share
        // numbers with the same kernel's wall-clock runs.
        Some(u) if r.clock() == hvlab_core::host::Clock::Icount => format!(
            "Linux {} under test ({}, instruction clock), HZ {}, {} CPUs",
            u.release, u.accel, h.hz, h.cores
        ),
        Some(u) => format!(
            "Linux {} under test ({}), HZ {}, {} CPUs",
            u.release, u.accel, h.hz, h.cores
        ),
        None => format!(
            "Linux {}, {}, HZ {}, {} CPUs",
            h.kernel, h.kvm_flavour, h.hz, h.cores
        ),
    }
}

/// A run's parameters a reader reads: set away from the scenario's default (the repetitions
/// against the scenario's), none of the bookkeeping, none empty.
fn readable_params(r: &RunRecord) -> BTreeMap<String, String> {
    r.params
        .iter()
        .filter(|(k, _)| !BOOKKEEPING.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), super::param_value(v)))
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

fn shown_params(r: &RunRecord) -> BTreeMap<String, String> {
    let kind = crate::scenario::Kind::named(&r.scenario).ok();
    let defaults = kind.map(|k| k.param_infos()).unwrap_or_default();
    readable_params(r)
        .into_iter()
        .filter(|(k, v)| match k.as_str() {
            "reps" => kind.is_none_or(|k| v != &k.info().default_reps.to_string()),
            _ => defaults
                .iter()
                .find(|p| p.name == k.as_str())
                .is_none_or(|p| p.default != *v),
        })
        .collect()
}

fn run_line(r: &RunRecord, page: String) -> RunLine {
    let headline = crate::scenario::find(&r.scenario)
        .map(|i| i.headline)
        .unwrap_or_default();
    let answer = answer_of(&r.verdicts).map(|v| Answered {
        class: v.class(),
        short: verdict_short(v),
        number: verdict_number(v),
        cause: verdict_cause(v, r),
    });
    let mut tally = BTreeMap::new();
    for v in &r.verdicts {
        *tally.entry(v.class()).or_insert(0) += 1;
    }
    let medians: Vec<(f64, &str, &str)> = r
        .variants
        .iter()
        .filter(|v| v.is_ok())
        .filter_map(|v| {
            let m = v.metrics.get(headline)?;
            m.median
                .is_finite()
                .then_some((m.median, v.name.as_str(), m.unit.as_str()))
        })
        .collect();
    let low = medians.iter().min_by(|a, b| a.0.total_cmp(&b.0));
    let high = medians.iter().max_by(|a, b| a.0.total_cmp(&b.0));
    let range = low.zip(high).map(|(l, h)| Range {
        metric: headline.to_string(),
        unit: l.2.to_string(),
        low: (l.0, l.1.to_string()),
        high: (h.0, h.1.to_string()),
    });
    RunLine {
        run_id: r.run_id.clone(),
        page,
        tag: r.tag,
        answer,
        tally,
        range,
        params: shown_params(r),
        all_params: readable_params(r),
        warnings: r.warnings.clone(),
    }
}

/// "9 FASTER, 1 SLOWER, 2 NO CHANGE".
pub fn tally_words(tally: &BTreeMap<MetricClass, usize>) -> String {
    tally
        .iter()
        .map(|(c, n)| format!("{} {c}", crate::analysis::quantity::count(*n as f64)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The setup of a row: each parameter set away from its default in any run, or that differs
/// between the runs (`key=value` when all agree, `key: N values (a–b)` when they do not).
fn setup(lines: &[RunLine]) -> String {
    let keys: BTreeSet<&String> = lines.iter().flat_map(|l| l.params.keys()).collect();
    keys.into_iter()
        .map(|k| {
            let values: BTreeSet<&str> = lines
                .iter()
                .map(|l| l.all_params.get(k).map_or("unset", String::as_str))
                .collect();
            if values.len() == 1 {
                format!("{k}={}", values.into_iter().next().unwrap_or_default())
            } else {
                let mut v: Vec<&str> = values.into_iter().collect();
                // Numbers in numeric order, so the ends read as a range.
                v.sort_by(|a, b| match (a.parse::<f64>(), b.parse::<f64>()) {
                    (Ok(x), Ok(y)) => x.total_cmp(&y),
                    _ => a.cmp(b),
                });
                if v.len() <= 3 {
                    format!("{k}={}", v.join("|"))
                } else {
                    format!("{k}: {} values ({}…{})", v.len(), v[0], v[v.len() - 1])
                }
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What a row says: the answer, its class, number and cause, the others, and its page.
struct Told {
    page: String,
    answer: String,
    class: Option<MetricClass>,
    number: String,
    cause: String,
    others: String,
}

fn row(g: Group, group_page: &str) -> SummaryRow {
    let info = crate::scenario::find(&g.scenario).ok();
    let question = info
        .map(|i| i.question.asks.to_string())
        .unwrap_or_default();
    let told = match g.lines.as_slice() {
        [line] => told_by_one(line, info.is_some_and(|i| i.question.costs)),
        lines => told_by_many(lines, group_page),
    };
    SummaryRow {
        page: told.page,
        scenario: g.scenario,
        question,
        backend: g.backend.to_string(),
        host: g.host,
        setup: setup(&g.lines),
        runs: g.lines.len(),
        answer: told.answer,
        class: told.class,
        number: told.number,
        cause: told.cause,
        others: told.others,
        lines: g.lines,
    }
}

/// One run: its answer, and the tally of its other verdicts (`costs`: the headline's range
/// too, the question being what each variant costs).
fn told_by_one(line: &RunLine, costs: bool) -> Told {
    let mut tally = line.tally.clone();
    let (answer, class, number, cause) = match &line.answer {
        Some(a) => {
            if let Some(n) = tally.get_mut(&a.class) {
                *n -= 1;
            }
            (
                a.short.clone(),
                Some(a.class),
                a.number.clone(),
                a.cause.clone(),
            )
        }
        None => (
            "nothing compared".to_string(),
            None,
            line.range.as_ref().map(range_words).unwrap_or_default(),
            String::new(),
        ),
    };
    tally.retain(|_, n| *n > 0);
    let mut others = Vec::new();
    if costs && line.answer.is_some() {
        others.extend(line.range.as_ref().map(range_words));
    }
    if !tally.is_empty() {
        others.push(format!(
            "{} more: {}",
            tally.values().sum::<usize>(),
            tally_words(&tally)
        ));
    }
    Told {
        page: line.page.clone(),
        answer,
        class,
        number,
        cause,
        others: others.join("; "),
    }
}

/// Several runs: the tally of their answers, and the headline's spread across them.
fn told_by_many(lines: &[RunLine], group_page: &str) -> Told {
    let runs = lines.len();
    let mut answers = BTreeMap::new();
    for l in lines {
        if let Some(a) = &l.answer {
            *answers.entry(a.class).or_insert(0) += 1;
        }
    }
    let answer = if answers.is_empty() {
        format!("{runs} runs, nothing compared")
    } else {
        format!(
            "{} runs: {}",
            crate::analysis::quantity::count(runs as f64),
            tally_words(&answers)
        )
    };
    let class = (answers.len() == 1)
        .then(|| answers.keys().next().copied())
        .flatten();
    let low = lines
        .iter()
        .filter_map(|l| l.range.as_ref())
        .min_by(|a, b| a.low.0.total_cmp(&b.low.0));
    let high = lines
        .iter()
        .filter_map(|l| l.range.as_ref())
        .max_by(|a, b| a.high.0.total_cmp(&b.high.0));
    let number = low
        .zip(high)
        .map(|(l, h)| {
            range_words(&Range {
                metric: l.metric.clone(),
                unit: l.unit.clone(),
                low: l.low.clone(),
                high: h.high.clone(),
            }) + " across the runs"
        })
        .unwrap_or_default();
    let mut causes: BTreeMap<&str, usize> = BTreeMap::new();
    for l in lines {
        if let Some(a) = l.answer.as_ref().filter(|a| !a.cause.is_empty()) {
            *causes.entry(a.cause.as_str()).or_insert(0) += 1;
        }
    }
    let cause = causes
        .into_iter()
        .max_by_key(|(_, n)| *n)
        .map(|(c, n)| {
            if n == runs {
                c.to_string()
            } else {
                format!("in {n} of {runs} runs: {c}")
            }
        })
        .unwrap_or_default();
    Told {
        page: group_page.to_string(),
        answer,
        class,
        number,
        cause,
        others: String::new(),
    }
}

/// "ns_per_page from 0.681 µs (uffd-minor-hugetlb) to 40.3 µs (uffd)".
fn range_words(r: &Range) -> String {
    let both = crate::analysis::quantity::format_all(&[r.low.0, r.high.0], &r.unit);
    format!(
        "{} from {} ({}) to {} ({})",
        r.metric, both[0], r.low.1, both[1], r.high.1
    )
}

/// The headline's median of one run's variants, as the group page lists them.
pub fn line_number(l: &RunLine) -> String {
    match (&l.answer, &l.range) {
        (Some(a), _) => a.number.clone(),
        (None, Some(r)) => range_words(r),
        (None, None) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(warnings: Vec<Warning>) -> RunLine {
        RunLine {
            run_id: String::new(),
            page: String::new(),
            tag: None,
            answer: None,
            tally: BTreeMap::new(),
            range: None,
            params: BTreeMap::new(),
            all_params: BTreeMap::new(),
            warnings,
        }
    }

    fn outliers(variant: &str, count: usize) -> Warning {
        Warning::Outliers {
            variant: variant.into(),
            metric: "ready_ms".into(),
            count,
            n: 20,
            k: 3.0,
            clock: Default::default(),
        }
    }

    /// The first screen fits one screen: a busy host once, naming the rows it was busy for,
    /// every variant's outliers of a metric in one line, whichever run of the row had them.
    #[test]
    fn warnings_are_one_line_per_kind_and_a_busy_host_one_line() {
        let busy = Warning::BusyHost {
            reasons: Vec::new(),
            pinned: false,
        };
        let clock = Warning::ClockSourceChanged { from: "tsc".into() };
        let lines = vec![
            line(vec![
                busy.clone(),
                outliers("irqchip-first", 5),
                clock.clone(),
            ]),
            line(vec![
                busy,
                outliers("qemu-order", 2),
                outliers("irqchip-first", 5),
            ]),
        ];
        let row = SummaryRow {
            page: String::new(),
            scenario: "lifecycle".into(),
            question: String::new(),
            backend: "kvm".into(),
            host: "Linux 6.18".into(),
            setup: String::new(),
            runs: 2,
            answer: String::new(),
            class: None,
            number: String::new(),
            cause: String::new(),
            others: String::new(),
            lines,
        };
        let mut memory = row.clone();
        memory.scenario = "memory".into();
        memory.lines = vec![line(vec![Warning::BusyHost {
            reasons: Vec::new(),
            pinned: false,
        }])];
        let out = warnings(&[row, memory]);
        assert_eq!(out.len(), 3, "{out:#?}");
        let busy: Vec<&String> = out.iter().filter(|w| w.contains("busy host")).collect();
        assert_eq!(busy.len(), 1, "{out:#?}");
        assert!(busy[0].starts_with("lifecycle, memory on kvm (Linux 6.18): busy host"));
        assert!(
            out.iter()
                .filter(|w| !w.contains("busy host"))
                .all(|w| w.starts_with("lifecycle on kvm (Linux 6.18): "))
        );
        assert!(
            out.iter().any(|w| w.contains(&clock.to_string())),
            "{out:#?}"
        );
        let outliers: Vec<&String> = out.iter().filter(|w| w.contains("outliers")).collect();
        assert_eq!(outliers.len(), 1, "{out:#?}");
        assert!(
            outliers[0].contains(
                "ready_ms (beyond the median ± 3·MAD): irqchip-first 5 of 20, qemu-order 2 of 20;"
            ),
            "{}",
            outliers[0]
        );
    }
}
