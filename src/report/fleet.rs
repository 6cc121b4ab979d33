//! The fleet page (`fleet.html`): runs grouped by host fingerprint, and per scenario, backend
//! and variant the headline median of each host as a chart. Self-contained like the index:
//! inline CSS and SVG, no scripts; its only link goes back to `index.html`.

use std::fmt::Write;

use super::charts;
use super::escape::html as esc;
use super::style::STYLE;
use crate::analysis::quantity::format_range as range;
use crate::lab::fleet::{HostFingerprint, HostGroup, group_by_host, host_value};
use crate::record::RunRecord;
use crate::report::words::fmt_value;

/// The page's file name, beside `index.html`.
pub const FILE: &str = "fleet.html";

/// The whole page.
pub fn page(records: &[RunRecord]) -> String {
    // Real hosts first, then model profiles (each its own "host": the modelled one).
    let mut hosts = group_by_host(records.iter().collect(), |r| HostFingerprint::of_run(r));
    hosts.sort_by_key(|h| !h.fingerprint.is_real());
    let real = hosts.iter().filter(|h| h.fingerprint.is_real()).count();
    let mut s = String::new();
    let _ = write!(
        s,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>hvlab fleet</title><style>{STYLE}</style></head><body><h1>hvlab fleet</h1><p><a href=\"index.html\">Back to the report</a></p><p>{} run{} on {} real host{} and {} model profile{}. A host is a fingerprint: kernel release, CPU model, KVM flavour and HZ; a model run's host is its profile at the HZ it ran with. A host's value is its run's median with the 95% bootstrap CI, or with several runs the median of the run medians with their min–max.</p><h2>Hosts</h2><table class=\"fleet-hosts\"><tr><th>host</th><th>kernel</th><th>CPU</th><th>KVM</th><th>HZ</th><th>runs</th><th>scenarios</th></tr>",
        records.len(),
        if records.len() == 1 { "" } else { "s" },
        real,
        if real == 1 { "" } else { "s" },
        hosts.len() - real,
        if hosts.len() - real == 1 { "" } else { "s" }
    );
    for (i, h) in hosts.iter().enumerate() {
        let mut scenarios: Vec<String> = h
            .runs
            .iter()
            .map(|r| format!("{} on {}", r.scenario, r.backend))
            .collect();
        scenarios.sort();
        scenarios.dedup();
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            label(i),
            esc(h
                .fingerprint
                .profile
                .as_ref()
                .map_or(&h.fingerprint.kernel, |_| "model")),
            esc(h.fingerprint.profile.as_ref().unwrap_or(&h.fingerprint.cpu)),
            esc(if h.fingerprint.is_real() {
                &h.fingerprint.flavour
            } else {
                "model"
            }),
            h.fingerprint.hz,
            h.runs.len(),
            esc(&scenarios.join(", "))
        );
    }
    s.push_str("</table>");
    // Scenario × backend in order of first appearance, then each variant.
    let mut sections: Vec<(String, String)> = Vec::new();
    for r in records {
        let key = (r.scenario.clone(), r.backend.to_string());
        if !sections.contains(&key) {
            sections.push(key);
        }
    }
    for (scenario, backend) in &sections {
        section(&mut s, &hosts, scenario, backend);
    }
    s.push_str("</body></html>\n");
    s
}

/// `H1`, `H2`, ...: the short names charts use for hosts.
fn label(i: usize) -> String {
    format!("H{}", i + 1)
}

fn section(s: &mut String, hosts: &[HostGroup<&RunRecord>], scenario: &str, backend: &str) {
    let Ok(info) = crate::scenario::find(scenario) else {
        return;
    };
    let metric = info.headline;
    // The runs of this section per host, keeping each host's label.
    let per_host: Vec<(usize, &HostGroup<&RunRecord>, Vec<&RunRecord>)> = hosts
        .iter()
        .enumerate()
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
    let mut variants: Vec<String> = Vec::new();
    for (_, _, runs) in &per_host {
        for r in runs {
            for v in &r.variants {
                if !variants.contains(&v.name) {
                    variants.push(v.name.clone());
                }
            }
        }
    }
    let _ = write!(
        s,
        "<h2>{} on {}</h2><p>{} per host ({} hosts).</p>",
        esc(scenario),
        esc(backend),
        esc(metric),
        per_host.len()
    );
    for v in &variants {
        let rows: Vec<(usize, &HostGroup<&RunRecord>, crate::lab::fleet::HostValue)> = per_host
            .iter()
            .filter_map(|(i, h, runs)| host_value(runs, v, metric).map(|x| (*i, *h, x)))
            .collect();
        if rows.is_empty() {
            continue;
        }
        let unit = rows[0].2.unit.clone();
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
        let _ = write!(s, "<h3>{}</h3>", esc(v));
        if let Some(svg) = charts::labelled_bars(&format!("{v}: {metric} per host"), &unit, &bars) {
            let _ = write!(
                s,
                "<figure>{svg}<figcaption>{}: median {} per host; whisker: 95% CI of one run, or min–max of several run medians</figcaption></figure>",
                esc(v),
                esc(metric)
            );
        }
        s.push_str("<table><tr><th>host</th><th>median</th><th>spread</th><th>runs</th></tr>");
        for (i, h, x) in &rows {
            let _ = write!(
                s,
                "<tr><td>{} ({})</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                label(*i),
                esc(&h.fingerprint.to_string()),
                esc(&fmt_value(x.median, &x.unit)),
                esc(&range(x.spread[0], x.spread[1], &x.unit)),
                x.runs
            );
        }
        s.push_str("</table>");
    }
}
