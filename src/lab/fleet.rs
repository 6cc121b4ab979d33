//! Fleet views: stored runs grouped by the host that produced them, and selectors that pick runs
//! by host (`kernel=6.18,cpu=EPYC`) for `hvlab compare`.
//!
//! Everything here filters in Rust over the store's `list`/`load` API, so it works the same
//! over any store behind that API.
//!
//! Selector syntax: comma-separated `key=value` terms, all of which must match. Keys:
//! - `kernel`: the kernel release equals the value or starts with it followed by `.`, `-` or
//!   `+` (`kernel=6.18` matches `6.18.0-rc3`, not `6.180`);
//! - `cpu`: the CPU model name contains the value, ignoring case (`cpu=EPYC`);
//! - `flavour`: the KVM flavour, exactly (`vmx`, `svm`, `pvm`, `arm64`, `none`);
//! - `hz`: the tick rate, exactly (`hz=250`);
//! - `clock`: the clock the run's times are on, exactly (`wall`, or `icount`: QEMU's
//!   instruction clock in a kernel under test);
//! - `backend`: the backend that produced the run (`kvm` or `model`).

use std::collections::BTreeSet;
use std::fmt;

use serde::Serialize;

use crate::error::InputError;
use crate::lab::Error;
use crate::record::RunRecord;
use crate::store::Store;
use hvlab_core::BackendKind;
use hvlab_core::host::{Clock, HostInfo};

/// What identifies a host for fleet views: the properties that change what KVM does and how
/// long it takes. Derived from [`HostInfo`]; core counts, versions and capabilities are left out
/// so that one machine's runs group together.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct HostFingerprint {
    /// `uname -r`.
    pub kernel: String,
    /// CPU model name.
    pub cpu: String,
    /// KVM implementation.
    pub flavour: String,
    /// Timer ticks per second.
    pub hz: u32,
    /// The clock its times are on: one machine on two clocks is two hosts, whose times never
    /// meet on one chart or in one comparison.
    #[serde(skip_serializing_if = "Clock::is_wall")]
    pub clock: Clock,
    /// A model run's host is the modelled one: its cost profile (and the HZ it ran at, after
    /// any `--set hz`), kept apart from the machine that computed it (the fields above), so
    /// model profiles never count as real hosts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

impl HostFingerprint {
    /// The fingerprint of a host description (a real host).
    pub fn of(host: &HostInfo) -> HostFingerprint {
        HostFingerprint {
            kernel: host.kernel.clone(),
            cpu: host.cpu.clone(),
            flavour: host.kvm_flavour.to_string(),
            hz: host.hz,
            clock: host.clock,
            profile: None,
        }
    }

    /// The fingerprint of a run: its host, or for a model run the modelled host.
    pub fn of_run(run: &RunRecord) -> HostFingerprint {
        HostFingerprint {
            profile: modelled(run.backend, run.profile.as_deref()),
            clock: run.clock(),
            ..HostFingerprint::of(&run.host)
        }
    }

    /// The fingerprint of a stored run, from its listing (no need to load the run).
    pub fn of_listing(run: &crate::store::RunListing) -> HostFingerprint {
        HostFingerprint {
            kernel: run.kernel.clone(),
            cpu: run.cpu.clone(),
            flavour: run.kvm_flavour.clone(),
            hz: run.hz,
            clock: run.clock,
            profile: modelled(run.backend, run.profile.as_deref()),
        }
    }

    /// Whether this is a real host (not a model profile).
    pub fn is_real(&self) -> bool {
        self.profile.is_none()
    }

    /// The value of one fingerprint field, for matching hosts across two selectors.
    fn field(&self, key: SelectorKey) -> String {
        match key {
            SelectorKey::Kernel => self.kernel.clone(),
            SelectorKey::Cpu => self.cpu.clone(),
            SelectorKey::Flavour => self.flavour.clone(),
            SelectorKey::Hz => self.hz.to_string(),
            SelectorKey::Clock => self.clock.to_string(),
            SelectorKey::Backend => String::new(),
        }
    }
}

/// The profile a model run models (`?` for a model run stored without one).
fn modelled(backend: BackendKind, profile: Option<&str>) -> Option<String> {
    (backend == BackendKind::Model).then(|| profile.unwrap_or("?").to_string())
}

impl fmt::Display for HostFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(profile) = &self.profile {
            return write!(
                f,
                "model profile {profile} · HZ={} (computed on Linux {} · {})",
                self.hz, self.kernel, self.cpu
            );
        }
        write!(
            f,
            "Linux {} · {} · {} · HZ={}",
            self.kernel, self.cpu, self.flavour, self.hz
        )?;
        match self.clock {
            Clock::Wall => Ok(()),
            Clock::Icount => f.write_str(" · instruction clock"),
        }
    }
}

/// One host's runs (whole records, or their listings).
#[derive(Debug, Clone)]
pub struct HostGroup<T = RunRecord> {
    /// The host.
    pub fingerprint: HostFingerprint,
    /// Its runs, in the order given (newest first from the store).
    pub runs: Vec<T>,
}

/// Groups runs by host fingerprint (`host_of` tells a run's); hosts in order of their first
/// run, runs in the order given.
pub fn group_by_host<T>(
    runs: Vec<T>,
    host_of: impl Fn(&T) -> HostFingerprint,
) -> Vec<HostGroup<T>> {
    let mut groups: Vec<HostGroup<T>> = Vec::new();
    for r in runs {
        let fp = host_of(&r);
        match groups.iter_mut().find(|g| g.fingerprint == fp) {
            Some(g) => g.runs.push(r),
            None => groups.push(HostGroup {
                fingerprint: fp,
                runs: vec![r],
            }),
        }
    }
    groups
}

/// The latest run of each scenario on each backend on each host (a model profile counting as
/// its own host), hosts in order of their latest run: what the report's fleet page shows by
/// default. Internal runs (validate, showcases) only with `all`.
pub fn latest_per_host(store: &Store, all: bool) -> Result<Vec<RunRecord>, Error> {
    // Chosen from the listing, which carries the fingerprint; only the chosen runs are read.
    let mut seen = BTreeSet::new();
    store
        .list(100_000)?
        .iter()
        .filter(|l| all || l.is_users())
        .filter(|l| {
            seen.insert((
                l.scenario.clone(),
                l.backend.to_string(),
                HostFingerprint::of_listing(l),
            ))
        })
        .map(|l| store.load(&l.run_id).map_err(Error::from))
        .collect()
}

/// One host's value of a metric of a variant, over its runs.
#[derive(Debug, Clone, PartialEq)]
pub struct HostValue {
    /// The run's median, or the median of the run medians.
    pub median: f64,
    /// The run's 95% CI, or the range of the run medians.
    pub spread: [f64; 2],
    /// Runs that reported the metric.
    pub runs: usize,
    /// The metric's unit.
    pub unit: String,
}

/// `metric` of `variant` on one host's `runs`: one run speaks for itself (median and 95% CI);
/// several are summarised by their medians (median, and min–max as the spread), a run being
/// the unit of replication.
pub fn host_value(runs: &[&RunRecord], variant: &str, metric: &str) -> Option<HostValue> {
    let ms: Vec<&crate::record::MetricRecord> = runs
        .iter()
        .filter_map(|r| r.variant(variant).filter(|v| v.is_ok()))
        .filter_map(|v| v.metrics.get(metric))
        .collect();
    let first = ms.first()?;
    let (median, spread) = if let [one] = ms.as_slice() {
        (one.median, one.ci95)
    } else {
        let meds: Vec<f64> = ms.iter().map(|m| m.median).collect();
        let lo = meds.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = meds.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (crate::analysis::statistics::median(&meds), [lo, hi])
    };
    Some(HostValue {
        median,
        spread,
        runs: ms.len(),
        unit: first.unit.clone(),
    })
}

/// A selector key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SelectorKey {
    /// Kernel release, by version prefix.
    Kernel,
    /// CPU model, by substring.
    Cpu,
    /// KVM flavour.
    Flavour,
    /// Tick rate.
    Hz,
    /// The clock the run's times are on.
    Clock,
    /// Backend of the run.
    Backend,
}

/// The keys a selector takes, for error messages.
pub const SELECTOR_KEYS: &str = "kernel, cpu, flavour, hz, clock, backend";

/// The fingerprint fields, in display order.
const FINGERPRINT_KEYS: [SelectorKey; 5] = [
    SelectorKey::Kernel,
    SelectorKey::Cpu,
    SelectorKey::Flavour,
    SelectorKey::Hz,
    SelectorKey::Clock,
];

impl SelectorKey {
    fn parse(text: &str) -> Option<SelectorKey> {
        Some(match text {
            "kernel" => SelectorKey::Kernel,
            "cpu" => SelectorKey::Cpu,
            "flavour" | "flavor" => SelectorKey::Flavour,
            "hz" => SelectorKey::Hz,
            "clock" => SelectorKey::Clock,
            "backend" => SelectorKey::Backend,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            SelectorKey::Kernel => "kernel",
            SelectorKey::Cpu => "cpu",
            SelectorKey::Flavour => "flavour",
            SelectorKey::Hz => "hz",
            SelectorKey::Clock => "clock",
            SelectorKey::Backend => "backend",
        }
    }
}

/// A set of runs by host: every term must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    terms: Vec<(SelectorKey, String)>,
    text: String,
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Selector {
    /// Whether `text` is meant as a selector rather than a run reference (run ids never
    /// contain `=`).
    pub fn looks_like(text: &str) -> bool {
        text.contains('=')
    }

    /// Parses `key=value[,key=value...]`.
    pub fn parse(text: &str) -> Result<Selector, InputError> {
        let bad = |why: String| InputError::BadValue {
            key: "selector".into(),
            value: text.into(),
            why,
        };
        let mut terms = Vec::new();
        for term in text.split(',').map(str::trim) {
            let Some((k, v)) = term.split_once('=') else {
                return Err(bad(format!(
                    "`{term}` is not key=value; selectors are key=value terms joined by commas, with keys {SELECTOR_KEYS} (e.g. kernel=6.18,cpu=EPYC)"
                )));
            };
            let (k, v) = (k.trim(), v.trim());
            let Some(key) = SelectorKey::parse(k) else {
                return Err(bad(format!(
                    "unknown key `{k}`; valid keys: {SELECTOR_KEYS}"
                )));
            };
            if v.is_empty() {
                return Err(bad(format!("`{k}` needs a value, e.g. {k}=...")));
            }
            match key {
                SelectorKey::Hz if v.parse::<u32>().is_err() => {
                    return Err(bad(format!("hz is a whole number such as 250, not `{v}`")));
                }
                SelectorKey::Flavour if !["vmx", "svm", "pvm", "arm64", "none"].contains(&v) => {
                    return Err(bad(format!(
                        "flavour is one of vmx, svm, pvm, arm64, none, not `{v}`"
                    )));
                }
                SelectorKey::Backend if !["kvm", "model"].contains(&v) => {
                    return Err(bad(format!("backend is kvm or model, not `{v}`")));
                }
                SelectorKey::Clock if v.parse::<Clock>().is_err() => {
                    return Err(bad(format!("clock is wall or icount, not `{v}`")));
                }
                _ => {}
            }
            if terms.iter().any(|(prev, _)| *prev == key) {
                return Err(bad(format!("`{k}` is given twice; give each key once")));
            }
            terms.push((key, v.to_string()));
        }
        Ok(Selector {
            terms,
            text: text.to_string(),
        })
    }

    /// The keys this selector constrains.
    pub fn keys(&self) -> impl Iterator<Item = SelectorKey> + '_ {
        self.terms.iter().map(|(k, _)| *k)
    }

    /// Whether `run` is selected.
    pub fn matches(&self, run: &RunRecord) -> bool {
        let host = HostFingerprint {
            clock: run.clock(),
            ..HostFingerprint::of(&run.host)
        };
        self.matches_host(&host, run.backend)
    }

    /// Whether a run on `host` by `backend` is selected (a listing tells both, so runs are
    /// picked before they are read).
    pub fn matches_host(&self, host: &HostFingerprint, backend: BackendKind) -> bool {
        self.terms.iter().all(|(key, v)| match key {
            SelectorKey::Kernel => kernel_matches(&host.kernel, v),
            SelectorKey::Cpu => host.cpu.to_lowercase().contains(&v.to_lowercase()),
            SelectorKey::Flavour => host.flavour == *v,
            SelectorKey::Hz => host.hz.to_string() == *v,
            SelectorKey::Clock => host.clock.as_str() == v,
            SelectorKey::Backend => backend.to_string() == *v,
        })
    }
}

/// `6.18` matches `6.18`, `6.18.0`, `6.18-rc3` and `6.18+`, but not `6.180`.
fn kernel_matches(release: &str, prefix: &str) -> bool {
    release
        .strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '-', '+']))
}

/// How hosts on two sides are paired: by the fingerprint fields neither selector names (with
/// `kernel=6.18` against `kernel=6.19`, by CPU model, flavour and HZ).
#[derive(Debug, Clone)]
pub struct HostMatch {
    keys: Vec<SelectorKey>,
}

impl HostMatch {
    /// The pairing for selectors `a` and `b`.
    pub fn for_selectors(a: &Selector, b: &Selector) -> HostMatch {
        let named: BTreeSet<SelectorKey> = a.keys().chain(b.keys()).collect();
        HostMatch {
            keys: FINGERPRINT_KEYS
                .into_iter()
                .filter(|k| !named.contains(k))
                .collect(),
        }
    }

    /// The pairing key of a host, as text (`cpu=AMD EPYC 7763, flavour=svm, hz=250`); empty when
    /// the selectors name every field.
    pub fn key(&self, fp: &HostFingerprint) -> String {
        self.keys
            .iter()
            // The wall clock goes without saying: only the instruction clock is named.
            .filter(|k| !(**k == SelectorKey::Clock && fp.clock.is_wall()))
            .map(|k| format!("{}={}", k.name(), fp.field(*k)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvlab_core::BackendKind;
    use hvlab_core::host::KvmFlavour;

    fn host(kernel: &str, cpu: &str, flavour: KvmFlavour, hz: u32) -> HostInfo {
        HostInfo {
            kernel: kernel.into(),
            cpu: cpu.into(),
            cores: 8,
            kvm_flavour: flavour,
            tdp: Some(true),
            tdp_mmu: Some(true),
            vpmu: None,
            hz,
            hz_source: "test".into(),
            thp: "madvise".into(),
            hypervisor: None,
            kvm_access: "ok".into(),
            capabilities: Default::default(),
            hvlab_version: "0".into(),
            git_rev: "x".into(),
            under_test: None,
            clock: Default::default(),
        }
    }

    fn run(id: &str, h: HostInfo) -> RunRecord {
        RunRecord {
            run_id: id.into(),
            scenario: crate::scenario::Kind::Lifecycle.name().into(),
            backend: BackendKind::Kvm,
            profile: None,
            host: h,
            params: Default::default(),
            started_at: "2026-11-22T10:00:00Z".into(),
            finished_at: "2026-11-22T10:00:01Z".into(),
            variants: vec![],
            verdicts: vec![],
            noise: None,
            warnings: vec![],
            tag: None,
            baseline: None,
            calls: Vec::new(),
        }
    }

    #[test]
    fn runs_group_by_kernel_cpu_flavour_and_hz_but_not_by_core_count() {
        let epyc = host("6.18.0", "AMD EPYC 7763", KvmFlavour::Svm, 250);
        let mut epyc_more_cores = epyc.clone();
        epyc_more_cores.cores = 64;
        let mut epyc_1000 = epyc.clone();
        epyc_1000.hz = 1000;
        let groups = group_by_host(
            vec![
                run("a", epyc.clone()),
                run("b", host("6.19.0", "AMD EPYC 7763", KvmFlavour::Svm, 250)),
                run("c", epyc_more_cores),
                run("d", epyc_1000),
            ],
            |r| HostFingerprint::of(&r.host),
        );
        let ids: Vec<Vec<&str>> = groups
            .iter()
            .map(|g| g.runs.iter().map(|r| r.run_id.as_str()).collect())
            .collect();
        assert_eq!(ids, vec![vec!["a", "c"], vec!["b"], vec!["d"]]);
        assert_eq!(groups[0].fingerprint, HostFingerprint::of(&epyc));
        assert_eq!(
            groups[2].fingerprint.to_string(),
            "Linux 6.18.0 · AMD EPYC 7763 · svm · HZ=1000"
        );
    }

    #[test]
    fn selectors_parse_and_match_by_version_prefix_substring_and_exact_value() {
        let s = Selector::parse("kernel=6.18, cpu=epyc").unwrap();
        let r = |k: &str, c: &str| run("x", host(k, c, KvmFlavour::Svm, 250));
        assert!(s.matches(&r("6.18.0-rc3", "AMD EPYC 7763")));
        assert!(s.matches(&r("6.18", "AMD EPYC 9654")));
        assert!(!s.matches(&r("6.180.1", "AMD EPYC 7763")));
        assert!(!s.matches(&r("6.19.0", "AMD EPYC 7763")));
        assert!(!s.matches(&r("6.18.0", "Intel Xeon Platinum 8480")));
        let h = Selector::parse("hz=1000,flavour=svm,backend=kvm").unwrap();
        assert!(!h.matches(&r("6.18.0", "AMD EPYC 7763")));
        assert!(h.matches(&run("x", host("6.1", "c", KvmFlavour::Svm, 1000))));
        assert!(Selector::looks_like("kernel=6.18"));
        assert!(!Selector::looks_like(
            "2026-11-22T10:00:00Z-lifecycle-kvm-ab12:irqchip-first"
        ));
    }

    #[test]
    fn bad_selectors_name_the_valid_keys_or_the_valid_values() {
        for (text, needle) in [
            (
                "kern=6.18",
                "valid keys: kernel, cpu, flavour, hz, clock, backend",
            ),
            ("clock=cycles", "wall or icount"),
            ("kernel=6.18,bogus", "not key=value"),
            ("kernel=", "needs a value"),
            ("hz=fast", "whole number"),
            ("flavour=tdx", "vmx, svm, pvm, arm64, none"),
            ("backend=qemu", "kvm or model"),
            ("kernel=6.18,kernel=6.19", "given twice"),
        ] {
            let msg = Selector::parse(text).unwrap_err().to_string();
            assert!(msg.contains(needle), "{text}: {msg}");
            assert!(
                msg.contains(text),
                "{text}: the message names the selector: {msg}"
            );
        }
    }

    #[test]
    fn hosts_pair_on_the_fields_neither_selector_names() {
        let a = Selector::parse("kernel=6.18").unwrap();
        let b = Selector::parse("kernel=6.19,hz=250").unwrap();
        let m = HostMatch::for_selectors(&a, &b);
        let fp = HostFingerprint::of(&host("6.18.2", "AMD EPYC 7763", KvmFlavour::Svm, 250));
        assert_eq!(m.key(&fp), "cpu=AMD EPYC 7763, flavour=svm");
        // One kernel under test on the instruction clock pairs only with its like.
        let icount = HostFingerprint {
            clock: Clock::Icount,
            ..fp.clone()
        };
        assert_eq!(
            m.key(&icount),
            "cpu=AMD EPYC 7763, flavour=svm, clock=icount"
        );
        assert!(
            Selector::parse("clock=icount")
                .unwrap()
                .matches_host(&icount, BackendKind::Kvm)
        );
        assert!(
            !Selector::parse("clock=icount")
                .unwrap()
                .matches_host(&fp, BackendKind::Kvm)
        );
    }
}
