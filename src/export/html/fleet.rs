//! The fleet page (`fleet.html`): runs grouped by host fingerprint, and per scenario, backend
//! and variant the headline median of each host as a chart. Self-contained like the index:
//! inline CSS and SVG, no scripts; its only link goes back to `index.html`.

use askama::Template;

use super::charts;
use crate::analysis::quantity::format_range as range;
use crate::export::words::fmt_value;
use crate::lab::fleet::{HostFingerprint, HostGroup, group_by_host, host_value};
use crate::record::RunRecord;
use hvlab_core::host::Clock;

/// The page's file name, beside `index.html`.
pub const FILE: &str = "fleet.html";

#[derive(Template)]
#[template(path = "fleet.html")]
struct Fleet {
    intro: String,
    hosts: Vec<HostRow>,
    sections: Vec<Section>,
}

struct HostRow {
    label: String,
    kernel: String,
    cpu: String,
    kvm: String,
    hz: u32,
    runs: usize,
    scenarios: String,
}

/// A scenario on a backend: per variant, the headline of each host.
struct Section {
    title: String,
    metric: String,
    hosts: usize,
    variants: Vec<VariantView>,
}

struct VariantView {
    name: String,
    chart: Option<String>,
    rows: Vec<ValueRow>,
}

struct ValueRow {
    host: String,
    median: String,
    spread: String,
    runs: usize,
}

/// The whole page.
pub fn page(records: &[RunRecord]) -> askama::Result<String> {
    // Real hosts first, then model profiles (each its own "host": the modelled one).
    let mut hosts = group_by_host(records.iter().collect(), |r| HostFingerprint::of_run(r));
    hosts.sort_by_key(|h| !h.fingerprint.is_real());
    let real = hosts.iter().filter(|h| h.fingerprint.is_real()).count();
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let intro = format!(
        "{} run{} on {} real host{} and {} model profile{}. A host is a fingerprint: kernel release, CPU model, KVM flavour and HZ; a model run's host is its profile at the HZ it ran with. A host's value is its run's median with the 95% bootstrap CI, or with several runs the median of the run medians with their min–max.",
        records.len(),
        plural(records.len()),
        real,
        plural(real),
        hosts.len() - real,
        plural(hosts.len() - real)
    );
    let host_rows = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let mut scenarios: Vec<String> = h
                .runs
                .iter()
                .map(|r| format!("{} on {}", r.scenario, r.backend))
                .collect();
            scenarios.sort();
            scenarios.dedup();
            let f = &h.fingerprint;
            HostRow {
                label: label(i),
                kernel: f
                    .profile
                    .as_ref()
                    .map_or(f.kernel.clone(), |_| "model".into()),
                cpu: f.profile.as_ref().unwrap_or(&f.cpu).clone(),
                kvm: match (f.is_real(), f.clock) {
                    (false, _) => "model".into(),
                    (true, Clock::Wall) => f.flavour.to_string(),
                    (true, Clock::Icount) => format!("{} (instruction clock)", f.flavour),
                },
                hz: f.hz,
                runs: h.runs.len(),
                scenarios: scenarios.join(", "),
            }
        })
        .collect();
    // Scenario × backend × clock in order of first appearance, then each variant: the hosts
    // of one clock share a chart, as an instruction count and a nanosecond never compare.
    let mut keys: Vec<(String, String, Clock)> = Vec::new();
    for r in records {
        let key = (r.scenario.clone(), r.backend.to_string(), r.clock());
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    let fleet = Fleet {
        intro,
        hosts: host_rows,
        sections: keys
            .iter()
            .filter_map(|(scenario, backend, clock)| section(&hosts, scenario, backend, *clock))
            .collect(),
    };
    Ok(fleet.render()? + "\n")
}

/// `H1`, `H2`, ...: the short names charts use for hosts.
fn label(i: usize) -> String {
    format!("H{}", i + 1)
}

fn section(
    hosts: &[HostGroup<&RunRecord>],
    scenario: &str,
    backend: &str,
    clock: Clock,
) -> Option<Section> {
    let info = crate::scenario::find(scenario).ok()?;
    let metric = info.headline;
    // The runs of this section per host, keeping each host's label.
    let per_host: Vec<(usize, &HostGroup<&RunRecord>, Vec<&RunRecord>)> = hosts
        .iter()
        .enumerate()
        .filter(|(_, h)| h.fingerprint.clock == clock)
        .map(|(i, h)| {
            let runs = h
                .runs
                .iter()
                .filter(|r| r.scenario == scenario && r.backend.to_string() == backend)
                .copied()
                .collect::<Vec<_>>();
            (i, h, runs)
        })
        .filter(|(_, _, runs)| !runs.is_empty())
        .collect();
    let mut names: Vec<String> = Vec::new();
    for (_, _, runs) in &per_host {
        for r in runs {
            for v in &r.variants {
                if !names.contains(&v.name) {
                    names.push(v.name.clone());
                }
            }
        }
    }
    let mut variants = Vec::new();
    for v in &names {
        let rows: Vec<(usize, &HostGroup<&RunRecord>, crate::lab::fleet::HostValue)> = per_host
            .iter()
            .filter_map(|(i, h, runs)| host_value(runs, v, metric).map(|x| (*i, *h, x)))
            .collect();
        let Some(unit) = rows.first().map(|r| r.2.unit.clone()) else {
            continue;
        };
        let bars: Vec<(String, f64, [f64; 2])> = rows
            .iter()
            .map(|(i, h, x)| {
                (
                    format!("{} {}", label(*i), h.fingerprint.kernel),
                    x.median,
                    x.spread,
                )
            })
            .collect();
        variants.push(VariantView {
            name: v.clone(),
            chart: charts::labelled_bars(&format!("{v}: {metric} per host"), &unit, &bars),
            rows: rows
                .iter()
                .map(|(i, h, x)| ValueRow {
                    host: format!("{} ({})", label(*i), h.fingerprint),
                    median: fmt_value(x.median, &x.unit),
                    spread: range(x.spread[0], x.spread[1], &x.unit),
                    runs: x.runs,
                })
                .collect(),
        });
    }
    Some(Section {
        title: match clock {
            Clock::Wall => format!("{scenario} on {backend}"),
            Clock::Icount => format!("{scenario} on {backend}, on QEMU's instruction clock"),
        },
        metric: metric.to_string(),
        hosts: per_host.len(),
        variants,
    })
}
