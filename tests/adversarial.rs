//! Bad input, interruptions and concurrency. Every case gets a clear answer and the
//! documented exit code (2 bad input, 3 the host cannot run it, 4 a measurement or storage
//! failure), nothing is lost and nothing is left behind. One test (or more) per row.
#![allow(
    clippy::unwrap_used,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap
)] // test code: a panic is the failure report

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{assert_exit, db, hvlab, kvm_or_skip, loud_skip, run, stderr, tool_or_skip};

/// How many complete runs the database holds (0 when it was never created).
fn runs_in(db: &Path) -> usize {
    if !db.exists() {
        return 0;
    }
    hvlab::store::Store::open(db)
        .unwrap()
        .list(100_000)
        .unwrap()
        .len()
}

fn host_has(cap: &str) -> bool {
    let out = hvlab().args(["host", "--json"]).output().unwrap();
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|v| v["capabilities"][cap].as_bool())
        .unwrap_or(false)
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    })
}

/// Runs `hvlab ARGS` with its working directory on a fresh read-only tmpfs (a private mount
/// namespace); `None` (a loud skip) where mounting is not allowed.
fn in_read_only_dir(test: &str, args: &[&str]) -> Option<(tempfile::TempDir, Output)> {
    let mnt = tempfile::tempdir().unwrap();
    if !tool_or_skip(test, "unshare") {
        return None;
    }
    let out = Command::new("unshare")
        .args([
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs -o ro,size=1m tmpfs \"$0\" || exit 99; cd \"$0\" && exec \"$@\"",
        ])
        .arg(mnt.path())
        .arg(env!("CARGO_BIN_EXE_hvlab"))
        .args(args)
        .output()
        .unwrap();
    if out.status.code() == Some(99) || stderr(&out).contains("unshare failed") {
        loud_skip(&format!("{test}: cannot mount a read-only tmpfs here"));
        return None;
    }
    Some((mnt, out))
}

// ---- Processes left behind, results lost ----

/// Processes (not zombies) whose command line contains `marker`.
fn processes_with(marker: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let p = entry.path();
        let Ok(cmdline) = std::fs::read(p.join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let zombie = std::fs::read_to_string(p.join("stat"))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .map(|(_, rest)| rest.trim_start().starts_with('Z'))
            })
            .unwrap_or(true);
        if cmdline.contains(marker) && !zombie {
            found.push(format!("{}: {cmdline}", p.display()));
        }
    }
    found
}

fn poll(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn trace_then_signal(sig: i32, marker_secs: &str) {
    trace_ignoring_then_signal(None, sig, marker_secs);
}

/// `hvlab trace` started with `ignored` ignored (as `nohup` starts it), sent `ignored` once the
/// trace runs (it must go on), then `sig` (it must end, and strace and the command with it).
fn trace_ignoring_then_signal(ignored: Option<i32>, sig: i32, marker_secs: &str) {
    if !tool_or_skip("trace_signals", "strace") {
        return;
    }
    let marker = format!("sleep {marker_secs}");
    let mut cmd = hvlab();
    cmd.args(["trace", "--timeout", "600", "--", "sleep", marker_secs])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // hvlab keeps a signal its parent ignores ignored (a background job's SIGINT), so the
    // test gives it the default disposition whatever the test runner inherited (`nohup`,
    // `cmd &` in a script).
    // SAFETY: between fork and exec only async-signal-safe calls: signal(2) and return.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            libc::signal(sig, libc::SIG_DFL);
            if let Some(ignored) = ignored {
                libc::signal(ignored, libc::SIG_IGN);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();
    // The sleep itself (not only strace's command line) runs once tracing has started.
    poll("the traced sleep to start", || {
        processes_with(&marker)
            .iter()
            .any(|p| !p.contains("strace") && !p.contains("hvlab"))
    });
    if let Some(ignored) = ignored {
        // SAFETY: signalling the child this test spawned.
        unsafe { libc::kill(pid as i32, ignored) };
        std::thread::sleep(Duration::from_millis(300));
        assert!(
            child.try_wait().unwrap().is_none(),
            "hvlab trace ended on signal {ignored}, which its parent ignored"
        );
    }
    // SAFETY: signalling the child this test spawned.
    unsafe { libc::kill(pid as i32, sig) };
    let status = child.wait().unwrap();
    if sig == libc::SIGKILL {
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
    } else {
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert_eq!(status.code(), Some(128 + sig), "{err}");
        assert!(err.contains("interrupted by"), "{err}");
    }
    poll("strace and the traced command to end with hvlab", || {
        processes_with(&marker).is_empty()
    });
    assert!(
        !std::env::temp_dir()
            .join(format!("hvlab-trace-{pid}"))
            .exists(),
        "a temp dir was left behind"
    );
}

#[test]
fn trace_sigint_ends_strace_and_the_command() {
    trace_then_signal(libc::SIGINT, "1001.5");
}

#[test]
fn trace_sigterm_ends_strace_and_the_command() {
    trace_then_signal(libc::SIGTERM, "1002.5");
}

#[test]
fn trace_sigkill_ends_strace_and_the_command() {
    trace_then_signal(libc::SIGKILL, "1003.5");
}

#[test]
fn trace_started_under_nohup_keeps_sighup_ignored() {
    trace_ignoring_then_signal(Some(libc::SIGHUP), libc::SIGINT, "1004.5");
}

#[test]
fn two_commands_creating_one_database_at_once_both_succeed() {
    for trial in 0..20 {
        let (_d, db) = db();
        let spawn = |seed: &str| {
            hvlab()
                .args([
                    "run",
                    "lifecycle",
                    "--backend",
                    "model",
                    "--profile",
                    "pvm-epyc",
                    "--reps",
                    "2",
                    "--warmup",
                    "0",
                    "--json",
                    "--seed",
                    seed,
                    "--db",
                ])
                .arg(&db)
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn("1"), spawn("2"));
        for child in [a, b] {
            let out = child.wait_with_output().unwrap();
            assert_eq!(
                out.status.code(),
                Some(0),
                "trial {trial}: {}",
                stderr(&out)
            );
        }
        assert_eq!(runs_in(&db), 2, "trial {trial}");
    }
}

#[test]
fn two_thousand_runs_back_to_back_are_all_kept() {
    use hvlab::model::{ModelBackend, profile::Profile};
    use hvlab::scenario::runner::{RunRequest, Silent};
    let (_d, db) = db();
    let mut store = hvlab::store::Store::open(&db).unwrap();
    let mut backend = ModelBackend::new(
        Profile::load("pvm-epyc").unwrap(),
        hvlab::lab::host::probe(),
        1,
    );
    let request = RunRequest {
        reps: 1,
        warmup: 0,
        ..RunRequest::new(hvlab::scenario::Kind::Percpu.defaults())
    };
    let mut ids = std::collections::BTreeSet::new();
    for _ in 0..2000 {
        let mut record = hvlab::scenario::run(&mut backend, &request, &Silent).unwrap();
        store.save(&mut record).unwrap();
        assert!(
            record.run_id.contains("-percpu-model-"),
            "{}",
            record.run_id
        );
        ids.insert(record.run_id);
    }
    assert_eq!(ids.len(), 2000);
    assert_eq!(runs_in(&db), 2000);
}

#[test]
fn a_variant_given_twice_is_refused_before_measuring() {
    let (_d, db) = db();
    let out = run(
        &db,
        &[
            "run",
            "lifecycle",
            "--variant",
            "irqchip-first",
            "--variant",
            "irqchip-first",
        ],
    );
    assert_exit(&out, 2, &["irqchip-first", "more than once"]);
    assert_eq!(runs_in(&db), 0);
}

#[test]
fn calibrate_checks_its_output_path_before_measuring() {
    let (d, db) = db();
    // A directory.
    let dir = d.path().to_str().unwrap();
    let out = hvlab()
        .args(["calibrate", "-o", dir])
        .env("HVLAB_KVM_DEVICE", "/nonexistent/kvm")
        .output()
        .unwrap();
    // Checked before /dev/kvm is even opened: the path is the first problem reported.
    assert_exit(&out, 2, &[dir, "-o PATH", "directory"]);
    // A read-only file system.
    if let Some((_m, out)) = in_read_only_dir(
        "calibrate_read_only",
        &[
            "calibrate",
            "-o",
            "profile.toml",
            "--db",
            db.to_str().unwrap(),
        ],
    ) {
        assert_exit(
            &out,
            2,
            &["profile.toml", "-o PATH", "Read-only file system"],
        );
    }
}

#[test]
fn warmup_is_bounded_like_reps() {
    let (_d, db) = db();
    assert_exit(
        &run(&db, &["run", "exits", "--warmup", "100000000"]),
        2,
        &["--warmup", "0..=100000"],
    );
}

// ---- Wrong exit code: bad input accepted, or failure called success ----

#[test]
fn an_impossible_pinning_buffer_is_refused_when_parsed() {
    let (_d, db) = db();
    assert_exit(
        &run(&db, &["run", "pinning", "--set", "buffer=1TiB"]),
        2,
        &["buffer", "1TiB", "64 GiB"],
    );
    assert_eq!(runs_in(&db), 0);
}

#[test]
fn only_unsupported_variants_exit_3_and_store_nothing() {
    let Some(_kvm) = kvm_or_skip("only_unsupported") else {
        return;
    };
    let mut cases: Vec<Vec<&str>> = vec![vec!["exits", "--variant", "hlt"]];
    if !host_has("KVM_CAP_PRE_FAULT_MEMORY") {
        cases.push(vec!["memory", "--variant", "prefault"]);
    } else {
        loud_skip("only_unsupported: this host has KVM_CAP_PRE_FAULT_MEMORY");
    }
    if !host_has("KVM_CAP_PMU_CAPABILITY") {
        cases.push(vec!["exits", "--variant", "pmu-on"]);
    } else {
        loud_skip("only_unsupported: this host has KVM_CAP_PMU_CAPABILITY");
    }
    for case in cases {
        let (_d, db) = db();
        let mut args = vec!["run"];
        args.extend(&case);
        args.extend(["--reps", "1", "--warmup", "0", "--json"]);
        let out = run(&db, &args);
        assert_exit(&out, 3, &["unsupported", "nothing was stored", case[2]]);
        assert!(out.stdout.is_empty(), "{case:?}");
        assert_eq!(runs_in(&db), 0, "{case:?}");
    }
}

#[test]
fn pinning_without_memlock_room_exits_3() {
    let Some(_kvm) = kvm_or_skip("memlock") else {
        return;
    };
    if !tool_or_skip("memlock", "prlimit") {
        return;
    }
    let (_d, db) = db();
    let mut cmd = Command::new("prlimit");
    cmd.arg("--memlock=65536");
    if is_root() {
        if !tool_or_skip("memlock", "setpriv") {
            return;
        }
        // Root holds CAP_IPC_LOCK: drop it, as an ordinary user would not have it.
        cmd.args([
            "setpriv",
            "--bounding-set=-ipc_lock",
            "--inh-caps=-ipc_lock",
            "--",
        ]);
    }
    let out = cmd
        .arg(env!("CARGO_BIN_EXE_hvlab"))
        .args(["run", "pinning", "--reps", "1", "--warmup", "0", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert_exit(
        &out,
        3,
        &["RLIMIT_MEMLOCK", "CAP_IPC_LOCK", "nothing was stored"],
    );
    assert_eq!(runs_in(&db), 0);
}

#[test]
fn a_run_whose_every_variant_fails_exits_4_and_is_stored_with_its_failures() {
    let Some(_kvm) = kvm_or_skip("address_space") else {
        return;
    };
    if !tool_or_skip("address_space", "prlimit") {
        return;
    }
    let (_d, db) = db();
    let out = Command::new("prlimit")
        .arg("--as=2147483648")
        .arg(env!("CARGO_BIN_EXE_hvlab"))
        .args([
            "run",
            "memory",
            "--set",
            "size=4GiB",
            "--variant",
            "lazy",
            "--variant",
            "uffd",
            "--reps",
            "1",
            "--warmup",
            "0",
            "--db",
        ])
        .arg(&db)
        .output()
        .unwrap();
    // Still exit 4, but the run is kept with each variant's failure: a kab whose patched
    // kernel fails every variant judges those failures instead of losing the variants.
    assert_exit(
        &out,
        4,
        &[
            "Cannot map",
            "stored as",
            "with each variant's failure",
            "lazy",
            "uffd",
        ],
    );
    assert_eq!(runs_in(&db), 1);
}

#[test]
fn a_device_that_is_not_kvm_exits_3() {
    let (_d, db) = db();
    for dev in ["/dev/null", "/dev/zero"] {
        let out = hvlab()
            .args(["run", "lifecycle", "--reps", "1", "--db"])
            .arg(&db)
            .env("HVLAB_KVM_DEVICE", dev)
            .output()
            .unwrap();
        assert_exit(&out, 3, &[dev, "is not a KVM device"]);
        let out = hvlab()
            .args(["host"])
            .env("HVLAB_KVM_DEVICE", dev)
            .output()
            .unwrap();
        assert_exit(&out, 3, &[dev, "is not a KVM device"]);
        assert!(!String::from_utf8_lossy(&out.stdout).contains(" ok"));
    }
    assert_eq!(runs_in(&db), 0);
}

/// The built-in pvm-epyc profile with `[costs.KEY]`'s value replaced (`None`: the table
/// removed), written to a file.
fn profile_with(dir: &Path, key: &str, value: Option<&str>) -> PathBuf {
    let text = hvlab::model::profile::BUILT_IN
        .iter()
        .find(|(n, _)| *n == "pvm-epyc")
        .unwrap()
        .1;
    let header = format!("[costs.{key}]");
    let mut out = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with('[') {
            inside = line.trim() == header;
        }
        match (inside, value) {
            (true, None) => {}
            (true, Some(v)) if line.starts_with("value") => out.push(format!("value = {v}")),
            _ => out.push(line.to_string()),
        }
    }
    let path = dir.join(format!("{key}-{}.toml", value.unwrap_or("missing")));
    std::fs::write(&path, out.join("\n")).unwrap();
    path
}

#[test]
fn profile_costs_out_of_range_or_missing_are_bad_input_naming_the_key() {
    let (d, db) = db();
    let cases = [
        ("srcu_wakeup_ns", Some("-900000"), "from 0"),
        ("srcu_wakeup_ns", Some("nan"), "from 0"),
        ("stage2_fault_ns", Some("inf"), "from 0"),
        ("hz", Some("-250"), "from 24 to 10000"),
        ("hz", Some("nan"), "from 24 to 10000"),
        ("hz", Some("0"), "from 24 to 10000"),
        ("ioctl_memslot_ns", None, "calibrate"),
    ];
    for (key, value, range) in cases {
        let path = profile_with(d.path(), key, value);
        let out = run(
            &db,
            &[
                "run",
                "lifecycle",
                "--backend",
                "model",
                "--profile",
                path.to_str().unwrap(),
                "--reps",
                "2",
            ],
        );
        assert_exit(&out, 2, &[key, range]);
        // Every path a message points to exists.
        for word in stderr(&out).split_whitespace() {
            let word = word.trim_matches(|c: char| "`'(),.:;".contains(c));
            if word.ends_with(".toml") {
                assert!(
                    Path::new(word).exists(),
                    "message names a missing file: {word}"
                );
            }
        }
    }
    assert_eq!(runs_in(&db), 0);
}

#[test]
fn validate_refuses_a_meaningless_tolerance_up_front() {
    let (_d, db) = db();
    for t in ["-5", "nan", "inf", "0"] {
        let out = hvlab()
            .args(["validate", &format!("--tolerance={t}"), "--db"])
            .arg(&db)
            // Checked before /dev/kvm: a parse error, not a missing device.
            .env("HVLAB_KVM_DEVICE", "/nonexistent/kvm")
            .output()
            .unwrap();
        assert_exit(&out, 2, &["--tolerance", "percentage"]);
    }
}

#[test]
fn trace_of_a_command_that_cannot_run_is_bad_input_and_of_a_non_vmm_exit_3() {
    if !tool_or_skip("trace_bad_command", "strace") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let not_exec = dir.path().join("script");
    std::fs::write(&not_exec, "#!/bin/sh\n").unwrap();
    for (cmd, why) in [
        ("/nonexistent", "No such file"),
        (not_exec.to_str().unwrap(), "not executable"),
        ("hvlab-no-such-command", "no program"),
    ] {
        let out = hvlab().args(["trace", "--", cmd]).output().unwrap();
        assert_exit(&out, 2, &["Cannot trace", cmd, why]);
    }
    // Found and executable, but exec fails (its interpreter is missing): still exit 2.
    let bad_interp = dir.path().join("bad-interp");
    std::fs::write(&bad_interp, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(
        &bad_interp,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let out = hvlab()
        .args(["trace", "--"])
        .arg(&bad_interp)
        .output()
        .unwrap();
    assert_exit(&out, 2, &["Cannot trace", "cannot run"]);
    let out = hvlab().args(["trace", "--", "true"]).output().unwrap();
    assert_exit(&out, 3, &["no KVM ioctls", "is this a VMM?"]);
}

// ---- Messages that do not say what to do ----

fn stored_model_run(db: &Path, scenario: &str, variants: &[&str], reps: &str) -> String {
    let mut args = vec![
        "run",
        scenario,
        "--backend",
        "model",
        "--profile",
        "pvm-epyc",
        "--reps",
        reps,
        "--json",
    ];
    for v in variants {
        args.extend(["--variant", v]);
    }
    let r = common::json(&run(db, &args));
    r["run_id"].as_str().unwrap().to_string()
}

#[test]
fn report_and_suite_output_errors_name_the_path_and_the_option() {
    let (d, db) = db();
    stored_model_run(&db, "percpu", &[], "2");
    let file = d.path().join("taken");
    std::fs::write(&file, "x").unwrap();
    let out = run(&db, &["report", "-o", file.to_str().unwrap()]);
    assert_exit(&out, 2, &[file.to_str().unwrap(), "-o DIR", "directory"]);
    let out = run(&db, &["suite", "--report", file.to_str().unwrap()]);
    assert_exit(&out, 2, &[file.to_str().unwrap(), "--report DIR"]);
    if let Some((_m, out)) = in_read_only_dir(
        "report_read_only",
        &["report", "-o", "out", "--db", db.to_str().unwrap()],
    ) {
        assert_exit(&out, 2, &["out", "-o DIR", "Read-only file system"]);
    }
    if let Some((_m, out)) =
        in_read_only_dir("suite_read_only", &["suite", "--db", db.to_str().unwrap()])
    {
        assert_exit(
            &out,
            2,
            &["hvlab-report", "--report DIR", "Read-only file system"],
        );
    }
}

#[test]
fn a_database_path_that_is_not_a_database_says_what_it_is_and_what_to_do() {
    let (d, db) = db();
    // A directory.
    let out = run(d.path(), &["runs"]);
    assert_exit(&out, 2, &["is a directory", "--db"]);
    // Random bytes.
    let junk = d.path().join("junk.db");
    let bytes: Vec<u8> = (0..8192u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&junk, &bytes).unwrap();
    let out = run(&junk, &["runs"]);
    assert_exit(
        &out,
        2,
        &["is not a results database", "move it aside", "--db"],
    );
    assert_eq!(
        std::fs::read(&junk).unwrap(),
        bytes,
        "the file was modified"
    );
    // A real database, corrupted.
    stored_model_run(&db, "percpu", &[], "2");
    let mut data = std::fs::read(&db).unwrap();
    for b in data.iter_mut().skip(100).take(3996) {
        *b = 0xa5;
    }
    std::fs::write(&db, &data).unwrap();
    let out = run(&db, &["runs"]);
    assert_exit(&out, 4, &["is corrupt", "move it aside", "--db"]);
}

#[test]
fn compare_labels_both_variants_and_names_both_scenarios() {
    let (_d, db) = db();
    let exits = stored_model_run(&db, "exits", &["cpuid", "pio-out"], "5");
    let out = run(
        &db,
        &[
            "compare",
            &format!("{exits}:cpuid"),
            &format!("{exits}:pio-out"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[A cpuid vs B pio-out]"), "{text}");
    let lifecycle = stored_model_run(&db, "lifecycle", &["irqchip-first"], "5");
    let out = run(&db, &["compare", &exits, &lifecycle]);
    assert_exit(
        &out,
        2,
        &["same scenario", "exits", "lifecycle", &exits, &lifecycle],
    );
}

#[test]
fn compare_says_when_n_is_too_small_for_a_verdict() {
    let (_d, db) = db();
    let small = stored_model_run(&db, "lifecycle", &["memslots-first", "irqchip-first"], "3");
    let (a, b) = (
        format!("{small}:memslots-first"),
        format!("{small}:irqchip-first"),
    );
    let out = run(&db, &["compare", &a, &b, "--json"]);
    let r = common::json(&out);
    let c = &r["comparisons"][0];
    assert!(c["ratio"].as_f64().unwrap() > 5.0, "{c}");
    assert_eq!(c["verdict"], "not decided", "{c}");
    assert_eq!(c["min_n"], 4);
    assert!(c["text"].as_str().unwrap().contains("at least 4"), "{c}");
    // The gate judges at p < 0.01, which the exact test reaches from 5 per side.
    let out = run(&db, &["compare", &a, &b, "--fail-on-regression"]);
    assert_exit(&out, 2, &["cannot judge", "at least 5"]);
    // At the stated minimum the same regression is a verdict.
    let enough = stored_model_run(&db, "lifecycle", &["memslots-first", "irqchip-first"], "5");
    let out = run(
        &db,
        &[
            "compare",
            &format!("{enough}:memslots-first"),
            &format!("{enough}:irqchip-first"),
            "--fail-on-regression",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

#[test]
fn a_broken_strace_is_not_called_missing() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("strace");
    std::fs::write(&fake, "#!/bin/sh\nexit 1\n").unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = hvlab()
        .args(["trace", "--", "true"])
        .env("PATH", path)
        .output()
        .unwrap();
    assert_exit(&out, 3, &["does not work", fake.to_str().unwrap()]);
    assert!(!stderr(&out).contains("not installed"));
}

#[test]
fn an_empty_kvm_device_variable_counts_as_unset() {
    let plain = hvlab().args(["host"]).output().unwrap();
    let empty = hvlab()
        .args(["host"])
        .env("HVLAB_KVM_DEVICE", "")
        .output()
        .unwrap();
    assert_eq!(plain.status.code(), empty.status.code());
    assert!(
        !stderr(&empty).contains("error:  does not exist"),
        "{}",
        stderr(&empty)
    );
}

#[test]
fn options_that_would_be_ignored_are_refused_or_reported() {
    let (_d, db) = db();
    assert_exit(
        &run(&db, &["run", "lifecycle", "--profile", "pvm-epyc"]),
        2,
        &["--profile", "--backend model"],
    );
    let out = run(
        &db,
        &[
            "run",
            "lifecycle",
            "--backend",
            "model",
            "--variant",
            "irqchip-first",
            "--set",
            "order=create-vm,memslot,irqchip,vcpus,run",
            "--reps",
            "2",
            "--no-store",
            "--json",
        ],
    );
    let r = common::json(&out);
    assert!(stderr(&out).contains("note:") && stderr(&out).contains("custom"));
    assert_eq!(r["variants"].as_array().unwrap().len(), 2);
    assert_exit(
        &run(&db, &["run", "lifecycle", "--set", "order="]),
        2,
        &["order= is empty"],
    );
    assert_exit(
        &run(
            &db,
            &[
                "run",
                "lifecycle",
                "--set",
                "order=create-vm,,memslot,vcpus,run",
            ],
        ),
        2,
        &["step 2", "is empty"],
    );
    assert_eq!(runs_in(&db), 0);
}
