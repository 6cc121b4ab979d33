//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The hvlab binary under test. Its data directory (the default store, kept profiles) is the
/// tests' own under Cargo's target directory: a test that forgets `--db` must never write the
/// user's store, nor fail on one an older or newer hvlab wrote.
pub fn hvlab() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_hvlab"));
    cmd.env("XDG_DATA_HOME", scratch_data_home())
        .env_remove("HVLAB_DB");
    cmd
}

/// `$XDG_DATA_HOME` for hvlab under test: a directory of the test build's own.
pub fn scratch_data_home() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("xdg-data")
}

/// Runs hvlab with `args` against the database `db` (a file or a `postgres://` URL).
pub fn run<D: AsRef<OsStr> + ?Sized>(db: &D, args: &[&str]) -> Output {
    hvlab()
        .args(args)
        .arg("--db")
        .arg(db)
        .output()
        .expect("spawn hvlab")
}

/// Set by `.ci/run` on machines that have everything (KVM, QEMU, PostgreSQL, Chromium): a
/// skip there means a test did not run, so it fails instead of passing silently in the count.
pub const NO_SKIP_VAR: &str = "HVLAB_TEST_NO_SKIP";

/// Prints a skip notice where it is seen: the test harness captures `eprintln!`, but not
/// writes to the stderr handle itself. Under `HVLAB_TEST_NO_SKIP=1` the skip is a failure.
pub fn loud_skip(msg: &str) {
    use std::io::Write;
    if std::env::var_os(NO_SKIP_VAR).is_some_and(|v| v == "1") {
        panic!("{NO_SKIP_VAR}=1 forbids skipping: {msg}");
    }
    let _ = writeln!(std::io::stderr(), "\n*** SKIPPED {msg} ***\n");
}

/// Holds this test binary's turn on KVM: the tests of one binary run in parallel threads,
/// and on a 2-core host a suite in one thread slows another's timed memslot update many times
/// over. Timing tests assert ratios; they need the host to themselves. Binaries already run one after another.
pub struct KvmTurn(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

/// The device when /dev/kvm can be opened, holding this binary's turn on it; when it cannot,
/// says so loudly: CI on these machines has KVM, so a skip there is a finding, not a pass.
pub fn kvm_or_skip(test: &str) -> Option<KvmTurn> {
    static KVM: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let device = hvlab_host::probe::kvm_device_path();
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&device)
    {
        // A test that failed while holding the turn poisons the lock; the next still runs.
        Ok(_) => Some(KvmTurn(
            KVM.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )),
        Err(e) => {
            loud_skip(&format!(
                "{test}: {} is not usable here ({e})",
                device.display()
            ));
            None
        }
    }
}

/// Holds this binary's turn to boot a guest under QEMU TCG: two emulated hosts on two cores
/// starve each other's watchdogs, and the first boot of a kernel fills hvlab's kernel cache.
pub fn boot_turn() -> std::sync::MutexGuard<'static, ()> {
    static BOOTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that failed while holding the turn poisons the lock; the next still runs.
    BOOTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether `program` is on PATH; loud when not.
pub fn tool_or_skip(test: &str, program: &str) -> bool {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        loud_skip(&format!(
            "{test}: `{program}` is not installed (.ci/run installs it)"
        ));
    }
    found
}

/// stdout as JSON.
pub fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "hvlab failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// stderr as text.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `hvlab run SCENARIO --set S... --variant V... EXTRA... --json --no-store` as JSON.
pub fn scenario_json(
    scenario: &str,
    sets: &[&str],
    variants: &[&str],
    extra: &[&str],
) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut args = vec!["run", scenario, "--json", "--no-store"];
    for s in sets {
        args.extend(["--set", s]);
    }
    for v in variants {
        args.extend(["--variant", v]);
    }
    args.extend(extra);
    json(&run(&dir.path().join("hvlab.db"), &args))
}

/// The variant called `name` in a run record.
pub fn variant<'a>(r: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    r["variants"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == name))
        .unwrap_or_else(|| panic!("no variant {name} in {r}"))
}

/// The median of `metric` of variant `name`.
pub fn median(r: &serde_json::Value, name: &str, metric: &str) -> f64 {
    variant(r, name)["metrics"][metric]["median"]
        .as_f64()
        .unwrap_or_else(|| panic!("{name}.{metric} missing: {}", variant(r, name)["metrics"]))
}

/// The smallest sample of `metric` of variant `name`: a busy host only adds time, so the
/// fastest repetition is the one closest to the mechanism's own cost.
pub fn fastest(r: &serde_json::Value, name: &str, metric: &str) -> f64 {
    variant(r, name)["metrics"][metric]["min"]
        .as_f64()
        .unwrap_or_else(|| panic!("{name}.{metric} missing: {}", variant(r, name)["metrics"]))
}

/// Every stored run as JSON (internal ones too), by id, read back with `hvlab runs --all` +
/// `hvlab show`.
pub fn runs_by_id<D: AsRef<OsStr> + ?Sized>(db: &D) -> BTreeMap<String, serde_json::Value> {
    let listing = json(&run(db, &["runs", "--all", "--json", "--limit", "100000"]));
    listing["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| {
            let id = r["run_id"].as_str().expect("run_id").to_string();
            let record = json(&run(db, &["show", &id, "--json"]));
            (id, record)
        })
        .collect()
}

/// Each stored run's content without its id and times, by suite unit (a scenario on a
/// backend, or one of its showcases): what sharding must not change. A unit stored twice
/// fails.
pub fn contents_by_unit<D: AsRef<OsStr> + ?Sized>(db: &D) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    for mut record in runs_by_id(db).into_values() {
        let key = record["params"]["suite_unit"]
            .as_str()
            .expect("suite_unit")
            .to_string();
        for volatile in ["run_id", "started_at", "finished_at"] {
            record.as_object_mut().expect("record").remove(volatile);
        }
        // The suite's id names the job (one process, or the shards of one array), not what
        // a unit computed.
        record["params"]
            .as_object_mut()
            .expect("params")
            .remove("suite");
        assert!(out.insert(key, record).is_none(), "a unit ran twice");
    }
    out
}

/// A database path in a fresh temporary directory (kept alive by the returned guard).
pub fn db() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("hvlab.db");
    (dir, path)
}

/// The command exited with `code`, its stderr names every needle, and nothing panicked.
pub fn assert_exit(out: &Output, code: i32, needles: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr lacks `{n}`: {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

/// Headless Chromium on the local page `page` with its own profile directory, `extra` flags
/// first (`--dump-dom`, `--screenshot=...`); the output as it ran. Callers check
/// [`tool_or_skip`] first.
pub fn chromium(page: &Path, profile: &Path, extra: &[&str]) -> Output {
    Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("spawn chromium")
}

/// Every page of a report: the index, then each run's and each row's page.
pub fn report_pages(dir: &Path) -> String {
    let mut text = std::fs::read_to_string(dir.join("index.html")).unwrap_or_default();
    for sub in ["runs", "groups"] {
        let Ok(entries) = std::fs::read_dir(dir.join(sub)) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
        paths.sort();
        for p in paths {
            text.push_str(&std::fs::read_to_string(p).unwrap_or_default());
        }
    }
    text
}

/// The page references nothing outside itself (links to the pages beside it, `allowed`, apart).
pub fn assert_self_contained(html: &str, allowed: &[&str]) {
    let mut unlinked = html.to_string();
    for link in allowed {
        unlinked = unlinked.replace(&format!("href=\"{link}\""), "");
    }
    for needle in ["src=", "href=", "url(", "@import", "<script", "<link"] {
        assert!(
            !unlinked.contains(needle),
            "the page references something external: {needle}"
        );
    }
}

/// The DOM headless Chromium rendered from `page`, after checking that it ran, kept all `svgs`
/// charts, and logged no load failure.
pub fn chromium_dom(page: &Path, profile: &Path, svgs: usize) -> String {
    let dom = chromium(page, profile, &["--dump-dom"]);
    let log = String::from_utf8_lossy(&dom.stderr);
    assert!(dom.status.success(), "chromium failed: {log}");
    let rendered = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert_eq!(
        rendered.matches("<svg").count(),
        svgs,
        "charts lost in rendering"
    );
    for failure in ["net::ERR_", "Failed to load", "Uncaught"] {
        assert!(
            !log.contains(failure),
            "the page had a load failure: {failure}\n{log}"
        );
    }
    rendered
}
