//! Which stored runs a command shows: the user's own runs by default (internal runs, made by
//! `validate` and the suite's showcases, only with `--all`), a whole suite, the runs a filter
//! picks, and the sweeps and suites a store holds.
//!
//! Like the fleet views, everything filters the store's listing in Rust, so both engines
//! select alike; only the chosen runs are read whole.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::error::InputError;
use crate::lab::Error;
use crate::record::RunRecord;
use crate::store::{RunListing, Store};
use hvlab_core::BackendKind;

use super::fleet::HostFingerprint;

/// Every run of a store is listed (newest first) before selecting: a store of a sweep of
/// thousands of points is still a few MB of listing.
const ALL_RUNS: usize = 10_000_000;

/// What the default report shows.
#[derive(Debug, Clone)]
pub struct ReportSelection {
    /// The runs of the index page.
    pub runs: Vec<RunRecord>,
    /// The runs of the fleet page (the latest of each scenario and backend on each host).
    pub fleet: Vec<RunRecord>,
    /// The suite the index shows whole, when the newest of the user's runs is a suite's.
    pub suite: Option<String>,
}

/// The default report: when the newest of the user's runs belongs to a suite, that whole
/// suite (every unit, showcases included: they are the suite's); otherwise the latest run of
/// each scenario on each backend. Internal runs count only with `all`.
pub fn default_report(store: &Store, all: bool) -> Result<ReportSelection, Error> {
    let listing = store.list(ALL_RUNS)?;
    let fleet = super::fleet::latest_per_host(store, all)?;
    let newest = listing.iter().find(|l| all || l.is_users());
    if let Some(id) = newest.and_then(|l| l.suite.clone()) {
        return Ok(ReportSelection {
            runs: suite_of(store, &listing, &id)?,
            fleet,
            suite: Some(id),
        });
    }
    Ok(ReportSelection {
        runs: super::latest_runs(&fleet),
        fleet,
        suite: None,
    })
}

/// Every unit of suite `id`: the latest run of each unit (a rerun of a shard replaces its
/// runs), in the suite's unit order. An unknown id is bad input naming the stored suites.
pub fn suite(store: &Store, id: &str) -> Result<Vec<RunRecord>, Error> {
    let listing = store.list(ALL_RUNS)?;
    suite_of(store, &listing, id)
}

fn suite_of(store: &Store, listing: &[RunListing], id: &str) -> Result<Vec<RunRecord>, Error> {
    let mut latest: BTreeMap<String, &RunListing> = BTreeMap::new();
    for l in listing.iter().filter(|l| l.suite.as_deref() == Some(id)) {
        let unit = l
            .params
            .get("suite_unit")
            .and_then(serde_json::Value::as_str)
            .unwrap_or(&l.run_id)
            .to_string();
        // Newest first: the first seen of a unit is its latest.
        latest.entry(unit).or_insert(l);
    }
    if latest.is_empty() {
        return Err(InputError::NoSuchSuite {
            id: id.to_string(),
            known: known(suites(listing).iter().map(|s| s.id.as_str())),
        }
        .into());
    }
    let order: Vec<String> = super::suite::units(None)
        .iter()
        .map(super::suite::Unit::key)
        .collect();
    let mut chosen: Vec<(usize, &RunListing)> = latest
        .into_iter()
        .map(|(unit, l)| {
            (
                order.iter().position(|k| *k == unit).unwrap_or(usize::MAX),
                l,
            )
        })
        .collect();
    chosen.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.started_at.cmp(&b.1.started_at)));
    chosen
        .into_iter()
        .map(|(_, l)| store.load(&l.run_id).map_err(Error::from))
        .collect()
}

/// The ids a message lists as the valid choices (the newest few).
fn known<'a>(ids: impl Iterator<Item = &'a str>) -> String {
    let ids: Vec<&str> = ids.take(8).collect();
    if ids.is_empty() {
        "none".into()
    } else {
        ids.join(", ")
    }
}

/// The valid sweep ids of a store, for the message of an unknown one.
pub fn known_sweeps(store: &Store) -> Result<String, Error> {
    let listing = store.list(ALL_RUNS)?;
    Ok(known(sweeps(&listing).iter().map(|s| s.id.as_str())))
}

/// One sweep or suite of a store, from its runs' listings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Group {
    /// The sweep's or suite's id.
    pub id: String,
    /// Its scenarios, in order of first appearance.
    pub scenarios: Vec<String>,
    /// Its backends.
    pub backends: Vec<BackendKind>,
    /// Runs stored.
    pub runs: usize,
    /// Its first run's start.
    pub first: String,
    /// Its last run's start.
    pub last: String,
}

/// The sweeps of a listing (newest first).
pub fn sweeps(listing: &[RunListing]) -> Vec<Group> {
    groups(listing, |l| l.sweep().map(str::to_string))
}

/// The suites of a listing (newest first).
pub fn suites(listing: &[RunListing]) -> Vec<Group> {
    groups(listing, |l| l.suite.clone())
}

fn groups(listing: &[RunListing], id_of: impl Fn(&RunListing) -> Option<String>) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for l in listing {
        let Some(id) = id_of(l) else { continue };
        let g = match out.iter_mut().position(|g| g.id == id) {
            Some(i) => &mut out[i],
            None => {
                out.push(Group {
                    id,
                    scenarios: Vec::new(),
                    backends: Vec::new(),
                    runs: 0,
                    first: l.started_at.clone(),
                    last: l.started_at.clone(),
                });
                let last = out.len() - 1;
                &mut out[last]
            }
        };
        g.runs += 1;
        if !g.scenarios.contains(&l.scenario) {
            g.scenarios.push(l.scenario.clone());
        }
        if !g.backends.contains(&l.backend) {
            g.backends.push(l.backend);
        }
        // Newest first: each later listing is older.
        g.first.clone_from(&l.started_at);
    }
    out
}

/// `hvlab compare --baseline NAME [RUN]`: the two sides as full run ids, A the baseline's run
/// of RUN's scenario and backend (and profile), B the run given, or by default the newest of
/// the user's runs (not saved as this baseline) of a scenario and backend the baseline has.
/// A name no run was saved as, or a baseline without the run's scenario, is bad input naming
/// the saved ones.
pub fn against_baseline(
    store: &Store,
    name: &str,
    run: Option<&str>,
) -> Result<(String, String), Error> {
    let listing = store.list(ALL_RUNS)?;
    let saved: Vec<&RunListing> = listing
        .iter()
        .filter(|l| l.baseline.as_deref() == Some(name))
        .collect();
    let side = |l: &RunListing| (l.scenario.clone(), l.backend, l.profile.clone());
    let missing = |what: String| -> Error {
        let mut names: Vec<String> = Vec::new();
        for l in &listing {
            if let Some(b) = &l.baseline {
                let entry = format!("{b} ({} on {})", l.scenario, l.backend);
                if !names.contains(&entry) {
                    names.push(entry);
                }
            }
        }
        InputError::NoSuchBaseline {
            name: what,
            known: if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            },
        }
        .into()
    };
    if saved.is_empty() {
        return Err(missing(name.to_string()));
    }
    let b = match run {
        Some(r) => {
            let record = store.load(r)?;
            listing
                .iter()
                .find(|l| l.run_id == record.run_id)
                .ok_or_else(|| Error::from(crate::store::StoreError::NoSuchRun(r.to_string())))?
        }
        None => listing
            .iter()
            .filter(|l| l.is_users() && l.baseline.as_deref() != Some(name))
            .find(|l| saved.iter().any(|s| side(s) == side(l)))
            .ok_or_else(|| {
                Error::from(InputError::BadValue {
                    key: "--baseline".into(),
                    value: name.to_string(),
                    why: "no run of yours since matches its scenario and backend: run one, or name the run (hvlab compare --baseline NAME RUN)".into(),
                })
            })?,
    };
    // Newest first: the first saved under the name is the baseline now.
    let a = saved
        .iter()
        .find(|s| side(s) == side(b))
        .ok_or_else(|| missing(format!("{name} for {} on {}", b.scenario, b.backend)))?;
    Ok((a.run_id.clone(), b.run_id.clone()))
}

/// `hvlab runs`'s filters; every one given must hold.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// The scenario, exactly.
    pub scenario: Option<String>,
    /// The backend.
    pub backend: Option<BackendKind>,
    /// A host: its fingerprint's words (kernel, CPU, flavour, profile) contain this, ignoring
    /// case.
    pub host: Option<String>,
    /// The sweep id.
    pub sweep: Option<String>,
    /// The suite id.
    pub suite: Option<String>,
    /// Runs started at or after this instant (RFC 3339, UTC).
    pub since: Option<String>,
    /// Internal runs too.
    pub all: bool,
}

impl RunFilter {
    /// Whether `l` passes. A sweep or suite asked for by id shows every one of its runs,
    /// internal or not: it was named.
    pub fn accepts(&self, l: &RunListing) -> bool {
        let named = self.sweep.is_some() || self.suite.is_some();
        (self.all || named || l.is_users())
            && self.scenario.as_ref().is_none_or(|s| l.scenario == *s)
            && self.backend.is_none_or(|b| l.backend == b)
            && self.sweep.as_deref().is_none_or(|s| l.sweep() == Some(s))
            && self
                .suite
                .as_deref()
                .is_none_or(|s| l.suite.as_deref() == Some(s))
            && self
                .since
                .as_deref()
                .is_none_or(|t| l.started_at.as_str() >= t)
            && self.host.as_ref().is_none_or(|h| {
                host_words(&HostFingerprint::of_listing(l)).contains(&h.to_lowercase())
            })
    }
}

/// What `--host` matches: a real host's fingerprint, or a model run's profile and HZ (never
/// the machine that computed it, which is not its host).
fn host_words(host: &HostFingerprint) -> String {
    match &host.profile {
        Some(p) => format!("model profile {p} · HZ={}", host.hz),
        None => host.to_string(),
    }
    .to_lowercase()
}

/// The runs of a listing that `filter` accepts, newest first, at most `limit`.
pub fn filter_runs(listing: Vec<RunListing>, filter: &RunFilter, limit: usize) -> Vec<RunListing> {
    listing
        .into_iter()
        .filter(|l| filter.accepts(l))
        .take(limit)
        .collect()
}

/// Every run of the store that `filter` accepts, newest first, at most `limit`.
pub fn runs(store: &Store, filter: &RunFilter, limit: usize) -> Result<Vec<RunListing>, Error> {
    Ok(filter_runs(store.list(ALL_RUNS)?, filter, limit))
}

/// `--since`: an RFC 3339 time (`2026-11-24T10:00:00Z`, or a date `2026-11-24`), or an age
/// (`2h`, `3days`, `1week`) before `now`; as the RFC 3339 UTC instant (seconds) runs are
/// stored with, so it compares as text.
pub fn parse_since(text: &str, now: SystemTime) -> Result<String, InputError> {
    let t = text.trim();
    let at = if let Ok(age) = humantime::parse_duration(t) {
        now.checked_sub(age).unwrap_or(SystemTime::UNIX_EPOCH)
    } else if let Ok(at) = humantime::parse_rfc3339_weak(t) {
        at
    } else if let Ok(at) = humantime::parse_rfc3339_weak(&format!("{t} 00:00:00")) {
        at
    } else {
        return Err(InputError::BadValue {
            key: "--since".into(),
            value: text.to_string(),
            why: "it is neither a time nor an age: give an RFC 3339 time such as 2026-11-24T10:00:00Z, a date such as 2026-11-24 (UTC), or an age such as 2h, 3days or 1week".into(),
        });
    };
    Ok(
        humantime::format_rfc3339_seconds(at.max(SystemTime::UNIX_EPOCH + Duration::ZERO))
            .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_a_time_a_date_or_an_age_and_refuses_anything_else() {
        let now = humantime::parse_rfc3339("2026-11-24T12:00:00Z").unwrap();
        assert_eq!(parse_since("2h", now).unwrap(), "2026-11-24T10:00:00Z");
        assert_eq!(parse_since("1day", now).unwrap(), "2026-11-23T12:00:00Z");
        assert_eq!(
            parse_since("2026-11-20T08:30:00Z", now).unwrap(),
            "2026-11-20T08:30:00Z"
        );
        assert_eq!(
            parse_since("2026-11-20", now).unwrap(),
            "2026-11-20T00:00:00Z"
        );
        for bad in ["yesterday", "", "2026-13-40", "5 parsecs"] {
            let e = parse_since(bad, now).unwrap_err();
            assert!(e.to_string().contains("--since"), "{e}");
            assert!(e.to_string().contains("2h"), "{e}");
        }
    }
}
