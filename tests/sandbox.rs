//! The sandbox kernel builds run in (`src/kernel/sandbox.rs`): a build that writes outside its
//! tree fails naming the path and writes nothing there; the sandbox has no network, no
//! privileges and no capabilities; and nothing a build started outlives hvlab, whether hvlab
//! is stopped (SIGTERM) or killed (SIGKILL).
//!
//! Scratch trees live under Cargo's target directory, not /tmp: the sandbox gives every build
//! a private /tmp, where a write outside the tree would succeed unseen and vanish.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hvlab::error::fault_exit_code;
use hvlab::kernel::build::{self, BuildError};
use hvlab::kernel::sandbox::{Sandbox, SandboxPolicy};

use crate::common::loud_skip;

/// The sandbox, or a loud skip naming why none can be made here.
fn sandbox_or_skip(test: &str) -> Option<Sandbox> {
    match Sandbox::detect() {
        Ok(s) => Some(s),
        Err(e) => {
            loud_skip(&format!("{test}: no sandbox here ({e})"));
            None
        }
    }
}

/// A scratch tree with `makefile`, under the target directory; also a path beside it.
fn scratch(makefile: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("scratch dir");
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(&tree).expect("tree");
    std::fs::write(tree.join("Makefile"), makefile).expect("Makefile");
    (dir, tree)
}

fn expect_wrote_outside(result: Result<(), BuildError>, outside: &Path) {
    let e = result.expect_err("a build that writes outside its tree must fail");
    match &e {
        BuildError::WroteOutside { path, .. } => assert_eq!(path, outside, "{e}"),
        other => panic!("expected a write outside the tree, got: {other}"),
    }
    let text = e.to_string();
    assert!(text.contains(&outside.display().to_string()), "{text}");
    assert!(text.contains("Full log: "), "{text}");
    assert_eq!(fault_exit_code(e.fault()), 2, "the patch's doing: {text}");
    assert!(!outside.exists(), "{} was written", outside.display());
}

#[test]
fn a_recipe_that_writes_outside_its_tree_fails_naming_the_path() {
    let Some(sandbox) = sandbox_or_skip("a_recipe_that_writes_outside_its_tree") else {
        return;
    };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let outside = dir.path().join("owned-by-the-patch");
    let (_scratch, tree) = scratch(&format!("all:\n\ttouch {}\n", outside.display()));
    let log = tree.join("build.log");
    expect_wrote_outside(build::make_in_sandbox(&sandbox, &tree, &[], &log), &outside);
}

/// `$(shell ...)` failures do not stop make: the build "succeeds", and must still fail.
#[test]
fn a_shell_call_that_writes_outside_its_tree_fails_the_build_make_let_pass() {
    let Some(sandbox) = sandbox_or_skip("a_shell_call_that_writes_outside_its_tree") else {
        return;
    };
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("dir");
    let outside = dir.path().join("written-by-shell");
    let (_scratch, tree) = scratch(&format!(
        "X := $(shell touch {})\nall:\n\t@echo built > inside\n",
        outside.display()
    ));
    let log = tree.join("build.log");
    expect_wrote_outside(build::make_in_sandbox(&sandbox, &tree, &[], &log), &outside);
    // The tree itself was writable.
    assert!(tree.join("inside").is_file());
}

#[test]
fn the_sandbox_has_no_network_privileges_or_capabilities() {
    let Some(sandbox) = sandbox_or_skip("the_sandbox_has_no_network") else {
        return;
    };
    let (_scratch, tree) = scratch("");
    let out = sandbox
        .command("sh", &[&tree])
        .args([
            "-c",
            "id -u; grep -E '^(NoNewPrivs|CapEff|CapPrm):' /proc/self/status; \
             tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; pwd",
        ])
        .output()
        .expect("run the sandbox");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert_eq!(lines[0], "65534", "{text}");
    assert!(lines.contains(&"NoNewPrivs:\t1"), "{text}");
    assert!(lines.contains(&"CapEff:\t0000000000000000"), "{text}");
    assert!(lines.contains(&"CapPrm:\t0000000000000000"), "{text}");
    // Network interfaces: the loopback alone.
    let ifaces: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| !l.contains(':') && !l.starts_with('/') && *l != "65534")
        .collect();
    assert_eq!(ifaces, ["lo"], "{text}");
    assert_eq!(
        lines.last().copied(),
        Some(tree.to_str().expect("utf-8")),
        "{text}"
    );
}

const HELPER_TREE: &str = "HVLAB_SANDBOX_TEST_TREE";
const HELPER_POLICY: &str = "HVLAB_SANDBOX_TEST_POLICY";

/// Not a test: the child process the kill tests stop. It runs the tree's make as a build
/// does and exits with the error's exit code (128 + the signal when interrupted).
#[test]
#[ignore = "a helper process of the tests below, run by them"]
fn helper_builds_the_tree_it_is_given() {
    let Some(tree) = std::env::var_os(HELPER_TREE).map(PathBuf::from) else {
        return;
    };
    let policy = match std::env::var(HELPER_POLICY).as_deref() {
        Ok("off") => SandboxPolicy::Off,
        _ => SandboxPolicy::Required,
    };
    let sandbox = Sandbox::choose(policy).expect("a sandbox");
    let log = tree.join("build.log");
    match build::make_in_sandbox(&sandbox, &tree, &[], &log) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("helper: {e}");
            std::process::exit(fault_exit_code(e.fault()));
        }
    }
}

/// A process seen in /proc: its pid, session and state.
struct Proc {
    pid: i32,
    session: i32,
    zombie: bool,
}

/// Processes (not zombies' corpses only: those are flagged) whose command line is `words`.
fn procs_running(words: &[&str]) -> Vec<Proc> {
    let wanted: Vec<u8> = words.join("\0").into_bytes();
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        if cmdline.strip_suffix(b"\0").unwrap_or(&cmdline) != wanted.as_slice() {
            continue;
        }
        if let Some(p) = proc_stat(pid) {
            out.push(p);
        }
    }
    out
}

fn proc_stat(pid: i32) -> Option<Proc> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state, ppid, pgrp, session.
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(Proc {
        pid,
        zombie: rest.first()? == &"Z",
        session: rest.get(3)?.parse().ok()?,
    })
}

/// Live (not zombie) processes of `session`.
fn live_in_session(session: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter_map(proc_stat)
        .filter(|p| p.session == session && !p.zombie)
        .map(|p| p.pid)
        .collect()
}

/// Starts the helper on a tree whose make leaves two `sleep`s running in the background, waits
/// for both, sends `signal` to the helper, and checks that within 2 s nothing of the build's
/// session is left; returns the helper's exit status.
fn stop_a_build(policy: &str, signal: i32) -> Option<std::process::ExitStatus> {
    // A duration no other process on the host sleeps: the build's sleeps are found by it.
    let secs = format!(
        "{}",
        3000 + std::process::id() % 1000 + signal.unsigned_abs() * 1000
    );
    let (_scratch, tree) = scratch(&format!(
        "all:\n\tsh -c 'sleep {secs} & sleep {secs} & wait'\n"
    ));
    let mut helper = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "sandbox::helper_builds_the_tree_it_is_given",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(HELPER_TREE, &tree)
        .env(HELPER_POLICY, policy)
        .spawn()
        .expect("start the helper");
    let deadline = Instant::now() + Duration::from_secs(20);
    let sleeps = loop {
        let found = procs_running(&["sleep", &secs]);
        if found.len() == 2 && found.iter().all(|p| !p.zombie) {
            break found;
        }
        if let Ok(Some(status)) = helper.try_wait() {
            panic!("the helper ended before its build ran: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "the build's sleeps never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let session = sleeps[0].session;
    assert!(
        !live_in_session(session).is_empty(),
        "the build's session is empty before the signal"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&helper),
        rustix::process::Signal::from_named_raw(signal).expect("a signal"),
    )
    .expect("signal the helper");
    let status = helper.wait().expect("the helper ends");
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = live_in_session(session);
        let sleeping = procs_running(&["sleep", &secs])
            .into_iter()
            .filter(|p| !p.zombie)
            .count();
        if left.is_empty() && sleeping == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "2 s after the signal, the build's session still runs {left:?} ({sleeping} sleeps)"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(status)
}

#[test]
fn a_killed_hvlab_leaves_nothing_of_a_sandboxed_build_running() {
    if sandbox_or_skip("a_killed_hvlab_leaves_nothing").is_none() {
        return;
    }
    let status = stop_a_build("sandbox", libc::SIGKILL).expect("ran");
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(libc::SIGKILL)
    );
}

#[test]
fn a_stopped_hvlab_ends_its_sandboxed_build_and_exits_128_plus_the_signal() {
    if sandbox_or_skip("a_stopped_hvlab_ends_its_sandboxed_build").is_none() {
        return;
    }
    let status = stop_a_build("sandbox", libc::SIGTERM).expect("ran");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{status}");
}

/// Without a sandbox, a stop signal still ends make's whole process group.
#[test]
fn a_stopped_hvlab_ends_its_unsandboxed_build_too() {
    let status = stop_a_build("off", libc::SIGINT).expect("ran");
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{status}");
}
