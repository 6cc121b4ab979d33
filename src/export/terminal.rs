//! Terminal output: what a person reads at a glance. Every number carries its unit and its
//! spread. A run's account is the [`Terminal`] exporter; the command line's other tables
//! (`hvlab list`, `runs`, `compare`, ...) are rendered here too, and printed by the command
//! line.

use std::fmt::Write;

use super::{Export, ExportError, Exporter};
use crate::export::summary::BOOKKEEPING;
use crate::export::words::fmt_value;
use crate::record::{MetricRecord, RunRecord};
use crate::scenario;
use crate::store::RunListing;
use crate::trace::TraceReport;
use hvlab_core::host::{HostInfo, KvmFlavour};

/// Runs as a person reads them: each run's account ([`run`]), one after the other.
#[derive(Debug, Clone, Copy, Default)]
pub struct Terminal {
    /// With the KVM statistics of each variant.
    pub verbose: bool,
}

impl Exporter for Terminal {
    fn serialize(&self, export: &Export<'_>) -> Result<Vec<u8>, ExportError> {
        let accounts: Vec<String> = export.runs.iter().map(|r| run(r, self.verbose)).collect();
        Ok(accounts.join("\n\n").into_bytes())
    }
}

fn yes_no(v: Option<bool>) -> &'static str {
    match v {
        Some(true) => "yes",
        Some(false) => "no",
        None => "unknown",
    }
}

/// `hvlab host`.
pub fn host(h: &HostInfo) -> String {
    let mut s = String::new();
    let flavour = match h.kvm_flavour {
        KvmFlavour::Vmx => "vmx (Intel VT-x)",
        KvmFlavour::Svm => "svm (AMD-V)",
        KvmFlavour::Pvm => {
            "pvm (pagetable-based VM: shadow paging; guest CPL0 is emulated, CPL3 runs natively)"
        }
        KvmFlavour::Arm64 => "arm64",
        KvmFlavour::None => "none",
    };
    let _ = writeln!(s, "kernel        {}", h.kernel);
    let _ = writeln!(s, "cpu           {} ({} cores)", h.cpu, h.cores);
    let _ = writeln!(s, "kvm           {flavour}");
    let _ = writeln!(s, "/dev/kvm      {}", h.kvm_access);
    let paging = match h.tdp {
        Some(true) => "yes (EPT/NPT)",
        Some(false) => "no (shadow paging)",
        None => "unknown",
    };
    let _ = writeln!(s, "tdp           {paging}; tdp_mmu {}", yes_no(h.tdp_mmu));
    let _ = writeln!(s, "vpmu          {}", yes_no(h.vpmu));
    let _ = writeln!(
        s,
        "hz            {} (jiffy {:.1} ms; from {})",
        h.hz,
        h.jiffy_ns() as f64 / 1e6,
        h.hz_source
    );
    let _ = writeln!(s, "thp           {}", h.thp);
    if h.clock != hvlab_core::host::Clock::Wall {
        let _ = writeln!(
            s,
            "clock         {}",
            crate::export::words::clock_words(h.clock)
        );
    }
    let _ = writeln!(
        s,
        "hypervisor    {}",
        match (&h.hypervisor, h.cpu_emulated()) {
            (None, _) => "none (bare metal)".to_string(),
            (Some(sig), true) if h.clock == hvlab_core::host::Clock::Icount => format!(
                "{} (CPUID signature {sig}; CPU emulated, on its instruction clock: times are guest instructions)",
                hvlab_core::host::hypervisor_name(sig)
            ),
            (Some(sig), true) => format!(
                "{} (CPUID signature {sig}; CPU emulated: times are not meaningful)",
                hvlab_core::host::hypervisor_name(sig)
            ),
            (Some(sig), false) => format!(
                "{} (CPUID signature {sig})",
                hvlab_core::host::hypervisor_name(sig)
            ),
        }
    );
    if !h.capabilities.is_empty() {
        let _ = writeln!(s, "capabilities");
        for (cap, has) in &h.capabilities {
            let _ = writeln!(s, "  {cap:<26} {}", if *has { "yes" } else { "no" });
        }
    }
    let _ = writeln!(s, "scenarios");
    for info in scenario::catalog() {
        let backends: Vec<String> = info
            .backends()
            .iter()
            .map(|b| match b {
                hvlab_core::BackendKind::Kvm if !h.kvm_usable() => {
                    "kvm (unavailable here)".to_string()
                }
                other => other.to_string(),
            })
            .collect();
        let _ = writeln!(s, "  {:<12} {}", info.name, backends.join(", "));
    }
    let _ = write!(s, "hvlab         {} ({})", h.hvlab_version, h.git_rev);
    s
}

/// `hvlab list`.
pub fn list(catalog: &[scenario::Listing]) -> String {
    let mut s = String::new();
    for listing in catalog {
        let info = listing.info;
        let backends: Vec<String> = info.backends().iter().map(ToString::to_string).collect();
        let _ = writeln!(s, "{} — {}", info.name, info.summary);
        let _ = writeln!(
            s,
            "  backends: {}; default {} repetitions after {} warm-up",
            backends.join(", "),
            info.default_reps,
            info.default_warmup
        );
        let _ = writeln!(s, "  variants:");
        for v in info.variants {
            let _ = writeln!(s, "    {:<20} {}", v.name, v.doc);
        }
        for v in info.model_variants {
            let doc = v.doc.strip_prefix("model: ").unwrap_or(v.doc);
            let _ = writeln!(s, "    {:<20} (model only) {doc}", v.name);
        }
        let _ = writeln!(s, "  parameters (--set key=value):");
        for p in &listing.params {
            let default = if p.default.is_empty() {
                "unset"
            } else {
                &p.default
            };
            let values = match (p.range, p.choices) {
                (Some([low, high]), _) => format!(" [{low}-{high}]"),
                (_, Some(choices)) => format!(" [{}]", choices.join("|")),
                _ => String::new(),
            };
            let _ = writeln!(s, "    {:<14} {:<13} {}{values}", p.name, default, p.doc);
        }
        let _ = writeln!(s, "  metrics:");
        for m in info.metrics {
            // Which way is better, when it is not the usual lower; a count's tolerance.
            let mut notes: Vec<String> = Vec::new();
            if m.better != crate::analysis::Direction::LowerIsBetter {
                notes.push(m.better.to_string());
            }
            if m.count_tolerance > 0.0 {
                notes.push(format!(
                    "a change under {}% is not a verdict",
                    m.count_tolerance * 100.0
                ));
            }
            let notes = if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", notes.join("; "))
            };
            let _ = writeln!(s, "    {:<20} {:<6} {}{notes}", m.name, m.unit, m.doc);
        }
    }
    s.trim_end().to_string()
}

/// The unit a line is shown in, chosen from its median so every number on it reads at a
/// glance: bytes as KiB/MiB/GiB, ns as µs or ms once they grow.
fn display_scale(unit: &str, median: f64) -> (f64, String) {
    let m = median.abs();
    // The instruction clock's units: whole instructions below a million, then millions.
    let instructions = match unit {
        "insn" => Some(1.0),
        "kinsn" => Some(1e3),
        "Minsn" => Some(1e6),
        "Ginsn" => Some(1e9),
        _ => None,
    };
    if let Some(f) = instructions {
        return if m * f >= 1e6 {
            (1e6 / f, "Minsn".into())
        } else {
            (1.0 / f, "insn".into())
        };
    }
    match unit {
        "bytes" if m >= f64::from(1u32 << 30) => (f64::from(1u32 << 30), "GiB".into()),
        "bytes" if m >= f64::from(1u32 << 20) => (f64::from(1u32 << 20), "MiB".into()),
        "bytes" if m >= 1024.0 => (1024.0, "KiB".into()),
        "ns" if m >= 1e6 => (1e6, "ms".into()),
        "ns" if m >= 1e4 => (1e3, "us".into()),
        "count" => (1.0, String::new()),
        other => (1.0, other.to_string()),
    }
}

fn metric_line(name: &str, m: &MetricRecord, width: usize) -> String {
    let (scale, unit) = display_scale(&m.unit, m.median);
    let f = |v: f64| {
        if m.unit == "count" {
            format!("{v}")
        } else {
            fmt_value(v / scale, "").trim_end().to_string()
        }
    };
    format!(
        "  {name:<width$}  {:>10} {unit:<5} 95% CI [{}, {}]   min {}  max {}  n={}",
        f(m.median),
        f(m.ci95[0]),
        f(m.ci95[1]),
        f(m.min),
        f(m.max),
        m.n
    )
}

/// Orders metrics for reading: the headline first, then counts of findings, per-ioctl times,
/// and KVM statistics last.
fn metric_rank(headline: &str, name: &str) -> (u8, String) {
    let rank = if name == headline {
        0
    } else if name.starts_with("ioctl.") {
        2
    } else if name.starts_with("kvm.") {
        3
    } else {
        1
    };
    (rank, name.to_string())
}

/// One run, for the terminal. `verbose` adds KVM statistics.
pub fn run(r: &RunRecord, verbose: bool) -> String {
    let headline = scenario::find(&r.scenario).map_or("", |i| i.headline);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} on {}{} — run {}",
        r.scenario,
        r.backend,
        r.profile
            .as_ref()
            .map_or(String::new(), |p| format!(" (profile {p})")),
        r.run_id
    );
    host_lines(&mut s, r);
    let reps = r
        .params
        .get("reps")
        .map_or("?".to_string(), ToString::to_string);
    let warmup = r
        .params
        .get("warmup")
        .map_or("?".to_string(), ToString::to_string);
    let _ = writeln!(
        s,
        "{reps} repetitions per variant after {warmup} warm-up, variants interleaved"
    );
    // The verdicts open the account, as in hyperfine; each variant's details follow.
    if !r.verdicts.is_empty() {
        let _ = writeln!(s, "\nverdicts ({headline}, median with 95% bootstrap CI):");
        for v in &r.verdicts {
            let _ = writeln!(s, "  {v}");
        }
    }
    if !r.verdicts.is_empty() {
        let _ = writeln!(s, "\ndetails:");
    }
    for v in &r.variants {
        variant_lines(&mut s, v, headline, verbose);
    }
    s.trim_end().to_string()
}

/// Where a run was measured: the host (or the modelled one), its noise, warnings and notes.
fn host_lines(s: &mut String, r: &RunRecord) {
    let h = &r.host;
    let paging = match h.tdp {
        Some(true) => "TDP",
        Some(false) => "shadow paging",
        None => "paging unknown",
    };
    if let (false, Some(profile)) = (r.backend.capabilities().real_time, &r.profile) {
        // The paging and HZ are the profile's: a line that read as this machine's would
        // call an Intel PVM host "TDP" under an arm64 profile.
        let _ = writeln!(
            s,
            "modelled host: profile {profile}, {paging}, HZ={} (the model ran on {}, {})",
            h.hz, h.kernel, h.cpu
        );
    } else {
        let _ = writeln!(
            s,
            "host: {}, {}, {} ({paging}), vPMU {}, HZ={}, THP {}, {} cores",
            h.kernel,
            h.cpu,
            h.kvm_flavour,
            if h.vpmu == Some(true) { "on" } else { "off" },
            h.hz,
            h.thp,
            h.cores
        );
    }
    if let Some(n) = &r.noise {
        let _ = writeln!(s, "{}", crate::export::words::noise_line(n));
    }
    for w in &r.warnings {
        let _ = writeln!(s, "warning: {w}");
    }
    if let (hvlab_core::host::Clock::Icount, false, Some(profile)) =
        (r.clock(), r.backend.capabilities().real_time, &r.profile)
    {
        // Nothing was measured: the model's times are its profile's, on that profile's clock.
        let _ = writeln!(
            s,
            "note: modelled, not measured: each time is the guest instructions profile {profile} predicts, on the instruction clock it was calibrated on (QEMU's -icount); an instruction is not a cycle"
        );
    } else if r.clock() == hvlab_core::host::Clock::Icount {
        let _ = writeln!(
            s,
            "note: measured on {}: one virtual nanosecond per guest instruction, the same whatever else the host runs; an instruction is not a cycle (a world switch or an MSR write counts once); counts are exact",
            crate::export::words::clock_words(r.clock())
        );
    } else if r.backend.capabilities().real_time && h.cpu_emulated() {
        let _ = writeln!(
            s,
            "note: this host's CPU is emulated in software ({}): every exit is emulated, so times here are not meaningful; counts are",
            h.hypervisor_name().unwrap_or_default()
        );
    }
    if let Ok(scenario) = scenario::Kind::named(&r.scenario) {
        for notice in scenario.context(r) {
            let _ = writeln!(s, "{}", crate::export::words::notice(&notice));
        }
    }
}

/// One variant's account: its metrics (KVM statistics with `verbose`), then its findings.
fn variant_lines(s: &mut String, v: &crate::record::VariantRecord, headline: &str, verbose: bool) {
    let _ = writeln!(s);
    if !v.is_ok() {
        let _ = writeln!(s, "{}: {}", v.name, v.status);
        return;
    }
    let _ = writeln!(s, "{}", v.name);
    let mut names: Vec<&String> = v.metrics.keys().collect();
    names.sort_by_key(|n| metric_rank(headline, n));
    let hidden = names.iter().filter(|n| n.starts_with("kvm.")).count();
    let shown: Vec<&String> = names
        .into_iter()
        .filter(|n| verbose || !n.starts_with("kvm."))
        .collect();
    let width = crate::export::escape::column_width(shown.iter().map(|n| n.len()));
    for name in shown {
        let _ = writeln!(s, "{}", metric_line(name, &v.metrics[name], width));
    }
    if !verbose && hidden > 0 {
        let _ = writeln!(s, "  (+{hidden} KVM statistics: -v or --json shows them)");
    }
    for f in &v.findings {
        let _ = writeln!(s, "  ! {f}");
    }
}

/// What `hvlab merge` or `import` did with one source (or all of them).
pub fn tally(what: &str, t: &crate::store::transfer::Tally) -> String {
    let mut s = format!(
        "{what}: {} run(s): {} stored, {} already stored (skipped), {} conflicting",
        t.total(),
        t.stored,
        t.already_stored,
        t.conflicts.len()
    );
    for id in &t.conflicts {
        let _ = write!(
            s,
            "\n  conflict: {id} is stored with different content; kept the stored copy"
        );
    }
    s
}

/// A table with hvlab's look: no borders, a header rule, columns padded to their content
/// (comfy-table measures display width, so long or non-ASCII names keep columns aligned).
pub fn table(header: &[&str]) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_style(
        comfy_table::TableStyle::new()
            .header_separator(comfy_table::LineStyle::none().fill('-').junction(' ')),
    )
    .set_content_arrangement(comfy_table::ContentArrangement::Disabled)
    .set_header(header.iter().map(comfy_table::Cell::new));
    t
}

/// The parameters of a listed run worth showing: those set away from the scenario's default
/// (a sweep's axes among them), without the bookkeeping every run carries.
pub fn shown_params(r: &RunListing) -> String {
    let defaults =
        scenario::Kind::named(&r.scenario).map_or_else(|_| Vec::new(), |k| k.param_infos());
    r.params
        .iter()
        // The repetitions too: every run has them, the listing has a column for them.
        .filter(|(k, _)| k.as_str() != "reps" && !BOOKKEEPING.contains(&k.as_str()))
        .filter(|(k, v)| {
            defaults
                .iter()
                .find(|p| p.name == k.as_str())
                .is_none_or(|p| p.default != super::param_value(v))
        })
        .map(|(k, v)| format!("{k}={}", super::param_value(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `hvlab runs`: the hosts (real ones, then model profiles) named H1, H2, ..., then one table
/// of the runs, newest first, with their parameters, profile and sweep or suite.
pub fn runs_by_host(hosts: &[crate::lab::fleet::HostGroup<&RunListing>]) -> String {
    if hosts.is_empty() {
        return "no runs stored yet; `hvlab run lifecycle` or `hvlab suite` makes some".into();
    }
    let mut s = String::new();
    let mut rows: Vec<(usize, &RunListing)> = Vec::new();
    for (i, h) in hosts.iter().enumerate() {
        let _ = writeln!(
            s,
            "H{} = {} ({} run{})",
            i + 1,
            h.fingerprint,
            h.runs.len(),
            if h.runs.len() == 1 { "" } else { "s" }
        );
        rows.extend(h.runs.iter().map(|r| (i, *r)));
    }
    rows.sort_by(|a, b| (&b.1.started_at, &b.1.run_id).cmp(&(&a.1.started_at, &a.1.run_id)));
    let mut t = table(&[
        "run",
        "scenario",
        "backend",
        "host",
        "params",
        "sweep/suite",
        "tag",
        "variants",
    ]);
    for (i, r) in rows {
        let group = r
            .sweep()
            .map(str::to_string)
            .or_else(|| r.suite.clone())
            .unwrap_or_default();
        let tag = match (&r.tag, &r.baseline) {
            (Some(t), _) => t.to_string(),
            (None, Some(b)) => format!("baseline {b}"),
            (None, None) => String::new(),
        };
        t.add_row(vec![
            r.run_id.clone(),
            r.scenario.clone(),
            r.backend.to_string(),
            format!("H{}", i + 1),
            shown_params(r),
            group,
            tag,
            variants_in_short(&r.variants),
        ]);
    }
    let _ = write!(s, "{}", trimmed(&t));
    s.trim_end().to_string()
}

/// A run's variants: up to four by name, then how many more.
fn variants_in_short(names: &[String]) -> String {
    const SHOWN: usize = 4;
    if names.len() <= SHOWN {
        names.join(",")
    } else {
        format!("{},… ({} in all)", names[..SHOWN].join(","), names.len())
    }
}

/// A table's text without the trailing blanks of its last column.
pub fn trimmed(t: &comfy_table::Table) -> String {
    // comfy-table measures widths in u16 and cuts what is wider: a table holding such a cell
    // (a hostile imported run id) prints unaligned, two spaces between cells, every cell whole.
    const WIDEST: usize = u16::MAX as usize / 2;
    let rows = || t.header().into_iter().chain(t.row_iter());
    let text = if rows().any(|r| r.cell_iter().any(|c| c.content().len() > WIDEST)) {
        rows()
            .map(|r| {
                r.cell_iter()
                    .map(comfy_table::Cell::content)
                    .collect::<Vec<_>>()
                    .join("  ")
            })
            .collect::<Vec<_>>()
            .join("\n")
    } else {
        t.to_string()
    };
    text.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

/// `hvlab sweeps`: one row per sweep, newest first.
pub fn sweeps(groups: &[crate::lab::select::Group]) -> String {
    if groups.is_empty() {
        return "no sweeps stored; `hvlab sweep SCENARIO --grid KEY=V1,V2` makes one".into();
    }
    let mut t = table(&["sweep", "scenario", "backend", "points", "first", "last"]);
    for g in groups {
        t.add_row(vec![
            g.id.clone(),
            g.scenarios.join(","),
            g.backends
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(","),
            g.runs.to_string(),
            g.first.clone(),
            g.last.clone(),
        ]);
    }
    trimmed(&t)
}

/// A finished sweep: one row per point (its axis values) and the headline metric of each
/// variant, median with its 95% CI and unit.
pub fn sweep_table(records: &[RunRecord]) -> String {
    // Grid order (points stored in the same second list in id order).
    let mut records: Vec<&RunRecord> = records.iter().collect();
    records.sort_by_key(|r| {
        r.params
            .get("sweep_point")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(u64::MAX)
    });
    let Some(first) = records.first() else {
        return String::new();
    };
    let Ok(info) = scenario::find(&first.scenario) else {
        return String::new();
    };
    let axes: Vec<String> = first
        .params
        .get("sweep_grid")
        .and_then(serde_json::Value::as_str)
        .map(|g| g.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let mut header: Vec<String> = axes.clone();
    header.push("variant".into());
    header.push(format!("{} (median, 95% CI)", info.headline));
    let mut t = table(&header.iter().map(String::as_str).collect::<Vec<_>>());
    let text = |v: Option<&serde_json::Value>| match v {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
        None => String::new(),
    };
    for r in &records {
        for v in &r.variants {
            let mut row: Vec<String> = axes
                .iter()
                .map(|a| {
                    if a == "variant" {
                        v.name.clone()
                    } else {
                        text(r.params.get(a))
                    }
                })
                .collect();
            row.push(v.name.clone());
            row.push(match v.metrics.get(info.headline) {
                Some(m) => format!(
                    "{} [{} – {}]",
                    fmt_value(m.median, &m.unit),
                    fmt_value(m.ci95[0], &m.unit),
                    fmt_value(m.ci95[1], &m.unit)
                ),
                None => v.status.to_string(),
            });
            t.add_row(row);
        }
    }
    trimmed(&t)
}

/// `hvlab compare SELECTOR SELECTOR`: per matched host, then overall.
pub fn fleet_compare(a: &str, b: &str, o: &crate::lab::compare::FleetOutcome) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "A = {a} ({} runs)\nB = {b} ({} runs)\n{} on {}",
        o.runs[0], o.runs[1], o.scenario, o.metric
    );
    for (side, busy) in ["A", "B"].iter().zip(&o.gate.busy) {
        if let Some(why) = busy.first() {
            let _ = writeln!(
                s,
                "warning: {} run(s) of side {side} were measured on a busy host ({why}): their times may be inflated",
                busy.len()
            );
        }
    }
    for c in &o.comparisons {
        let _ = writeln!(s, "{}:", c.variant);
        for h in &c.per_host {
            let host = if h.host.is_empty() {
                "all hosts"
            } else {
                &h.host
            };
            let _ = writeln!(
                s,
                "  per host [{host}] {} ({} vs {} hosts)",
                h.comparison,
                h.b_hosts.len(),
                h.a_hosts.len()
            );
        }
        for (side, keys) in [("A", &c.only_a), ("B", &c.only_b)] {
            for k in keys {
                let _ = writeln!(s, "  only on side {side}, not compared: [{k}]");
            }
        }
        let _ = writeln!(s, "  overall (per-host medians) {}", c.overall);
    }
    s.trim_end().to_string()
}

/// `hvlab trace`.
pub fn trace(t: &TraceReport) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "traced: {}", t.command.join(" "));
    let _ = writeln!(s, "{}; {} KVM ioctls", t.ended, t.ioctls.len());
    match (t.first_run, t.ready_ms) {
        (Some(i), Some(ready)) => {
            let _ = writeln!(
                s,
                "first KVM_RUN after {ready:.2} ms (ioctl #{i}); {:.2} ms of that inside KVM ioctls",
                t.pre_run_ioctl_ms
            );
        }
        _ => {
            let _ = writeln!(s, "no KVM_RUN seen");
        }
    }
    pre_run_ioctls(&mut s, t);
    let _ = writeln!(s, "\nper ioctl (whole trace):");
    let _ = writeln!(
        s,
        "  {:<30} {:>6} {:>11} {:>11} {:>11}",
        "ioctl", "count", "total ms", "median ms", "max ms"
    );
    for x in &t.totals {
        let _ = writeln!(
            s,
            "  {:<30} {:>6} {:>11.3} {:>11.3} {:>11.3}",
            x.name, x.count, x.total_ms, x.median_ms, x.max_ms
        );
    }
    stall_lines(&mut s, t);
    s.trim_end().to_string()
}

/// The ioctls before the first `KVM_RUN`, consecutive repeats folded, stalls marked.
fn pre_run_ioctls(s: &mut String, t: &TraceReport) {
    let stalled: std::collections::HashMap<usize, &crate::trace::TraceStall> =
        t.stalls.iter().map(|x| (x.index, x)).collect();
    let _ = writeln!(
        *s,
        "\nKVM ioctls before the first KVM_RUN (consecutive repeats folded):"
    );
    let pre = &t.ioctls[..t.first_run.unwrap_or(t.ioctls.len())];
    let mut i = 0;
    while i < pre.len() {
        let name = pre[i].name;
        let mut j = i;
        while j + 1 < pre.len()
            && pre[j + 1].name == name
            && !stalled.contains_key(&(j + 1))
            && !stalled.contains_key(&i)
        {
            j += 1;
        }
        let total: f64 = pre[i..=j].iter().map(|x| x.dur_ns as f64 / 1e6).sum();
        let count = if j > i {
            format!(" ×{}", j - i + 1)
        } else {
            String::new()
        };
        let mark = stalled.get(&i).map_or(String::new(), |st| {
            match st.caused_by.as_ref().zip(st.caused_by_index) {
                Some((c, ci)) => format!(
                    "   <-- STALL {:.1} jiffies, grace period started by {c} (#{ci})",
                    st.jiffies
                ),
                None => format!(
                    "   <-- slow: {:.1} jiffies over its baseline, cause unknown (no SRCU grace period it could wait for)",
                    st.jiffies
                ),
            }
        });
        let _ = writeln!(
            *s,
            "  #{i:<4} {:>9.3} ms  {:<30} {total:>8.3} ms{mark}",
            pre[i].start_ns as f64 / 1e6,
            format!("{name}{count}")
        );
        i = j + 1;
    }
}

/// The grace-period stalls and the slow ioctls of unknown cause.
fn stall_lines(s: &mut String, t: &TraceReport) {
    let jiffy_ms = t.jiffy_ns as f64 / 1e6;
    let (srcu, slow): (Vec<_>, Vec<_>) = t.stalls.iter().partition(|x| x.caused_by.is_some());
    if srcu.is_empty() {
        let _ = writeln!(
            s,
            "\nno grace-period stalls (no ioctl that can wait for SRCU on this kernel exceeded its baseline by half a jiffy, {:.1} ms, while a grace period was in flight)",
            jiffy_ms / 2.0
        );
    } else {
        let total: f64 = srcu.iter().map(|x| x.duration_ms).sum();
        let _ = writeln!(
            s,
            "\nstalls: {} totalling {total:.2} ms (jiffy {jiffy_ms:.1} ms)",
            srcu.len()
        );
        for x in &srcu {
            let cause = x
                .caused_by
                .as_ref()
                .zip(x.caused_by_index)
                .map_or(String::new(), |(c, i)| {
                    format!("the SRCU grace period started by {c} (#{i})")
                });
            let _ = writeln!(
                s,
                "  ! {} (#{}) at {:.2} ms took {:.2} ms ({:.1} jiffies over baseline), waiting for {cause}",
                x.ioctl, x.index, x.at_ms, x.duration_ms, x.jiffies
            );
        }
    }
    if !slow.is_empty() {
        let _ = writeln!(
            s,
            "\nslow ioctls, cause unknown (each cannot wait for SRCU on this kernel, or no grace period was in flight):"
        );
        for x in &slow {
            let _ = writeln!(
                s,
                "  {} (#{}) at {:.2} ms took {:.2} ms ({:.1} jiffies over baseline)",
                x.ioctl, x.index, x.at_ms, x.duration_ms, x.jiffies
            );
        }
    }
}

/// `hvlab calibrate`.
pub fn profile(p: &crate::model::profile::Profile) -> String {
    let mut s = format!("profile {} — {} (mmu {:?})\n", p.name, p.describes, p.mmu);
    let width = crate::export::escape::column_width(p.costs.keys().map(String::len));
    for (k, c) in &p.costs {
        let _ = writeln!(
            s,
            "  {k:<width$}  {:>14.3} {:<8} {}",
            c.value, c.unit, c.provenance
        );
    }
    s.trim_end().to_string()
}

/// `hvlab validate`.
pub fn validation(
    checks: &[crate::analysis::validate::Check],
    unjudged: &[crate::lab::validate::Unjudged],
    tolerance: f64,
    clock: hvlab_core::host::Clock,
) -> String {
    let mut s = format!(
        "{:<10} {:<20} {:<20} {:>14} {:>14} {:>9}  verdict\n",
        "scenario", "variant", "metric", "model", "kvm", "error"
    );
    for c in checks {
        let rule = if !c.judged {
            "timing not meaningful on an emulated host".to_string()
        } else if c.tolerance_pct == 0.0 {
            "exact".to_string()
        } else {
            format!(
                "kvm spread {}–{} ±{:.0}%",
                fmt_value(c.band[0], &c.unit),
                fmt_value(c.band[1], &c.unit),
                c.tolerance_pct
            )
        };
        let _ = writeln!(
            s,
            "{:<10} {:<20} {:<20} {:>14} {:>14} {:>8.1}%  {} ({rule})",
            c.scenario,
            c.variant,
            c.metric,
            fmt_value(c.predicted, &c.unit),
            fmt_value(c.measured, &c.unit),
            c.error_pct,
            match (c.judged, c.pass) {
                (false, _) => "shown",
                (true, true) => "pass",
                (true, false) => "FAIL",
            }
        );
    }
    let failed = checks.iter().filter(|c| !c.pass).count();
    let judged = checks.iter().filter(|c| c.judged).count();
    let times = match clock {
        hvlab_core::host::Clock::Wall => format!("times within {tolerance}%"),
        hvlab_core::host::Clock::Icount => {
            format!("times within {tolerance}% in guest instructions, on QEMU's instruction clock")
        }
    };
    let _ = write!(
        s,
        "\n{} of {judged} checks pass ({times}, fault counts exact with the flavour's known extras)",
        judged - failed,
    );
    if judged < checks.len() {
        let _ = write!(
            s,
            "; {} times shown but not judged: this host's CPU is emulated",
            checks.len() - judged
        );
    }
    if !unjudged.is_empty() {
        let _ = write!(
            s,
            "\n\nnot compared ({} point variant{} one side could not run):",
            unjudged.len(),
            if unjudged.len() == 1 { "" } else { "s" }
        );
        for u in unjudged {
            let _ = write!(
                s,
                "\n  {} {} on {}: {}",
                u.scenario, u.variant, u.side, u.status
            );
        }
    }
    s
}

/// `hvlab fidelity`: the headline, then per thread each published figure against the model,
/// then what was fitted.
pub fn fidelity(reports: &[crate::lab::fidelity::ThreadReport]) -> String {
    use crate::export::words;
    let mut out = words::fidelity_headline(reports);
    out.push('\n');
    let cells = words::fidelity_cells(reports);
    let mut last_thread = String::new();
    for [thread, quantity, setup, published, model, verdict] in &cells {
        if *thread != last_thread {
            out.push_str(&format!("\n{thread}\n"));
            last_thread.clone_from(thread);
        }
        out.push_str(&format!(
            "  {quantity}\n    setup:     {setup}\n    published: {published}\n    model:     {model}\n    verdict:   {verdict}\n"
        ));
    }
    out.push_str("\nfitted inputs:\n");
    for line in words::fidelity_fitted(reports) {
        out.push_str(&format!("  {line}\n"));
    }
    out
}

// ---- What the suite and a sweep did, in words (lab returns data, this words it) ----

/// What `hvlab suite` sums up at its end.
pub struct SuiteSummary<'a> {
    /// The suite's id.
    pub suite_id: &'a str,
    /// The shard this process ran.
    pub shard: crate::lab::shard::Shard,
    /// The host it ran on.
    pub host: &'a HostInfo,
    /// The runs that produced samples.
    pub records: &'a [RunRecord],
    /// How many units were skipped.
    pub skipped: usize,
    /// The model against the kernel threads.
    pub fidelity: &'a [crate::lab::fidelity::ThreadReport],
    /// The report written, when any run produced samples.
    pub report: Option<&'a std::path::Path>,
}

/// The suite's first screen: per scenario its question and a line per backend × host with
/// the answer, the number and the cause; the threads' headlines with their fidelity; the
/// warnings that change how to read it; the report's path. Per-run accounts are `-v` and
/// `hvlab show`.
pub fn suite_summary(s: &SuiteSummary<'_>) -> String {
    use crate::export::words;
    let mut lines = vec![format!(
        "suite {}{}: {} run(s) on Linux {} ({}, HZ {}, {} CPUs), {} skipped",
        s.suite_id,
        if s.shard.is_whole() {
            String::new()
        } else {
            format!(" shard {}", s.shard)
        },
        s.records.len(),
        s.host.kernel,
        s.host.kvm_flavour,
        s.host.hz,
        s.host.cores,
        s.skipped
    )];
    let mut summary = crate::export::summary::Summary::new();
    for r in s.records {
        summary.add(r, String::new());
    }
    let rows = summary.rows(crate::export::summary::group_page_name);
    let mut last = String::new();
    for row in &rows {
        if row.scenario != last {
            lines.push(format!("{}: {}", row.scenario, row.question));
            last.clone_from(&row.scenario);
        }
        let setup = if row.setup.is_empty() {
            String::new()
        } else {
            format!(" [{}]", row.setup)
        };
        let mut line = if row.backend == "model" {
            format!("  {}{setup}: {}", row.host, row.answer)
        } else {
            format!("  {} on {}{setup}: {}", row.backend, row.host, row.answer)
        };
        for part in [&row.number, &row.cause] {
            if !part.is_empty() {
                line.push_str("; ");
                line.push_str(part);
            }
        }
        if !row.others.is_empty() {
            line.push_str(&format!(" ({})", row.others));
        }
        lines.push(line);
    }
    let refs: Vec<&RunRecord> = s.records.iter().collect();
    let threads = crate::lab::threads::lines(&refs, s.fidelity);
    if !threads.is_empty() {
        lines.push("threads (the model on each thread's host, before → after):".into());
        for t in &threads {
            lines.push(format!("  {}", words::thread_line(t)));
        }
    }
    for w in crate::export::summary::warnings(&rows) {
        lines.push(format!("warning: {w}"));
    }
    lines.push(format!(
        "{} (hvlab fidelity prints the table)",
        words::fidelity_headline(s.fidelity)
    ));
    if let Some(path) = s.report {
        lines.push(format!(
            "report: {} (each run: -v, or hvlab show RUN)",
            path.display()
        ));
    }
    lines.join("\n")
}

/// The line a sweep ends with: how many of its points this shard ran, where they went, and
/// how many were skipped or failed.
pub fn sweep_summary(
    o: &crate::lab::sweep::SweepOutcome,
    shard: crate::lab::shard::Shard,
    stored_in: Option<&str>,
) -> String {
    format!(
        "sweep {}: {} of {} points in shard {shard}; {} ran ({}), {} skipped, {} failed",
        o.id,
        o.units.len(),
        o.points,
        o.ran,
        stored_in.map_or_else(
            || "not stored: --no-store".to_string(),
            |s| format!("stored in {s}")
        ),
        o.skipped.len(),
        o.failed.len()
    )
}

#[cfg(test)]
mod hostile_records {
    //! Random records, as an imported file can carry them, through every renderer: the HTML
    //! report (charts included), the Markdown summary, the fleet page and the terminal. None
    //! may panic or hang, and none may pass markup or control characters through.
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;
    use std::time::Duration;

    use proptest::prelude::*;

    use crate::record::{MetricRecord, RunRecord, TimelineEvent, VariantRecord, VariantStatus};

    /// Names: markup, terminal escapes, Markdown, very long runs of one letter, or anything.
    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("<script>alert('x')</script>".to_string()),
            Just("\u{1b}]0;title\u{7}\u{1b}[2J\u{1b}]52;c;aGk=\u{7}\u{9b}1m".to_string()),
            Just("# *a* [l](javascript:x) | `c` \r\n- b".to_string()),
            (1usize..70_000).prop_map(|n| "W".repeat(n)),
            "\\PC{0,40}",
            any::<String>(),
        ]
    }

    /// Values: ordinary, extreme, and not finite.
    fn value() -> impl Strategy<Value = f64> {
        prop_oneof![
            0.0..1e6,
            Just(1e308),
            Just(-1e308),
            Just(f64::MAX),
            Just(f64::MIN_POSITIVE),
            Just(f64::INFINITY),
            Just(f64::NEG_INFINITY),
            Just(f64::NAN),
            Just(0.0),
            any::<f64>(),
        ]
    }

    fn metric(unit: String, samples: Vec<f64>) -> MetricRecord {
        let first = samples.first().copied().unwrap_or(f64::NAN);
        let last = samples.last().copied().unwrap_or(f64::NAN);
        MetricRecord {
            unit,
            median: first,
            ci95: [first.min(last), first.max(last)],
            min: first.min(last),
            max: first.max(last),
            n: samples.len(),
            samples,
        }
    }

    prop_compose! {
        fn variant()(
            name in name(),
            other in name(),
            unit in name(),
            samples in prop::collection::vec(value(), 0..6),
            points in prop::collection::vec((value(), value()), 0..4),
        ) -> VariantRecord {
            let mut metrics = BTreeMap::new();
            // Every scenario's headline, so the distribution chart is drawn from these values.
            for headline in ["ready_ms", "ns_per_page", "roundtrip_ns", "sys_ns", "slice_overhead_us"] {
                metrics.insert(headline.to_string(), metric(unit.clone(), samples.clone()));
            }
            metrics.insert(other.clone(), metric(unit, samples));
            VariantRecord {
                name,
                status: VariantStatus::Ok,
                metrics,
                findings: Vec::new(),
                timeline: points
                    .iter()
                    .map(|(s, d)| TimelineEvent { ioctl: other.clone(), start_ms: *s, dur_ms: *d, stalled: true })
                    .collect(),
                pinned_bytes: points.iter().map(|(a, b)| [*a, *b]).collect(),
            }
        }
    }

    prop_compose! {
        fn record()(
            id in name(),
            scenario in prop::sample::select(vec!["lifecycle", "memory", "exits", "pinning", "percpu"]),
            cpu in name(),
            kernel in name(),
            variants in prop::collection::vec(variant(), 1..4),
        ) -> RunRecord {
            let mut host = crate::lab::host::probe();
            host.cpu = cpu;
            host.kernel = kernel;
            RunRecord {
                run_id: id,
                scenario: scenario.to_string(),
                backend: hvlab_core::BackendKind::Model,
                profile: Some("<b>p</b>\u{1b}[1m".into()),
                host,
                params: Default::default(),
                started_at: "2026-11-22T10:00:00Z".into(),
                finished_at: "2026-11-22T10:00:05Z".into(),
                variants,
                verdicts: vec![],
                noise: None,
                warnings: vec![],
                tag: None,
                baseline: None,
                calls: Vec::new(),
            }
        }
    }

    /// Runs `f` on another thread and fails if it takes longer than `limit` (a hang) or panics.
    fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit)
            .unwrap_or_else(|e| panic!("a renderer did not finish within {limit:?}: {e}"))
    }

    fn no_control(what: &str, text: &str) {
        let bad = text
            .chars()
            .find(|c| c.is_control() && *c != '\n' && *c != '\t');
        assert!(bad.is_none(), "{what} carries control character {bad:?}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn every_renderer_survives_hostile_records_in_bounded_time_and_escapes_them(r in record()) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().to_path_buf();
            let records = vec![r];
            let (records, pages) = bounded(Duration::from_secs(60), move || {
                crate::export::write(&records, &[], &records, &path).unwrap();
                let read = |f: &str| std::fs::read_to_string(path.join(f)).unwrap();
                let pages = (read("index.html"), read("summary.md"), read("fleet.html"));
                (records, pages)
            });
            let (index, summary, fleet) = pages;
            for (page, text) in [("index.html", &index), ("fleet.html", &fleet), ("summary.md", &summary)] {
                prop_assert!(!text.contains("<script"), "{} carries a script", page);
            }
            // In HTML a quote could close an attribute; Markdown text has none to close.
            for (page, text) in [("index.html", &index), ("fleet.html", &fleet)] {
                prop_assert!(!text.contains("'x'"), "{} carries a bare quote", page);
            }
            no_control("summary.md", &summary);
            // The only markup in summary.md is hvlab's own run anchors; a name's `<` is an entity.
            // (Looking for the raw name instead fails on a name as short as "<".)
            for (at, _) in summary.match_indices('<') {
                let rest = &summary[at..];
                prop_assert!(
                    rest.starts_with("<a id=\"") || rest.starts_with("</a>"),
                    "summary.md carries raw markup at byte {}: {:?}", at, rest.chars().take(40).collect::<String>()
                );
            }
            let terminal = bounded(Duration::from_secs(60), move || {
                let r = &records[0];
                let listing = crate::store::RunListing {
                    run_id: r.run_id.clone(),
                    scenario: r.scenario.clone(),
                    backend: r.backend,
                    started_at: r.started_at.clone(),
                    kernel: r.host.kernel.clone(),
                    kvm_flavour: r.host.kvm_flavour.to_string(),
                    cpu: r.host.cpu.clone(),
                    hz: r.host.hz,
                    variants: r.variants.iter().map(|v| v.name.clone()).collect(),
                    profile: r.profile.clone(),
                    tag: r.tag,
                    suite: None,
                    baseline: None,
                    clock: r.clock(),
                    params: r.params.clone(),
                };
                let hosts = crate::lab::fleet::group_by_host(vec![&listing], |l| {
                    crate::lab::fleet::HostFingerprint::of_listing(l)
                });
                [super::run(r, true), super::run(r, false), super::runs_by_host(&hosts)]
            });
            // What the CLI prints: every line through the terminal escape.
            for text in &terminal {
                no_control("the terminal", &crate::export::escape::terminal(text));
            }
        }
    }
}
