//! The sandbox kernel builds run in (`src/kernel/sandbox.rs`) and their limits
//! (`src/kernel/limits.rs`): a build reads its source read-only and writes its output
//! directory alone, so one that writes into its source or anywhere else fails naming the path
//! and writes nothing there; it has no network, no privileges and no capabilities; it is ended
//! at its wall-time, disk and process limits, each named; and nothing it started outlives it or
//! hvlab, whether hvlab is stopped (SIGTERM) or killed (SIGKILL), nor a daemon that left its
//! session.
//!
//! The scratch trees live under Cargo's target directory, wherever the clone is: under /tmp
//! too, which the sandbox shows read-only like the rest of the filesystem. `.ci/run` runs this
//! binary again from clones under /tmp and under the home directory, their scratch trees where
//! Cargo would put them there ([`scratch_root`]).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hvlab::error::fault_exit_code;
use hvlab::kernel::build::{self, BuildError};
use hvlab::kernel::limits::{BuildKind, LimitHit, LimitOverrides, ProcessCap, process_cap_here};
use hvlab::kernel::sandbox::{Sandbox, SandboxPolicy, View};

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

/// Where scratch trees go: Cargo's target directory for the tests, or `HVLAB_TEST_SCRATCH`
/// (`.ci/run` sets it to a clone's, so this binary runs there without a second build).
pub(crate) fn scratch_root() -> PathBuf {
    std::env::var_os("HVLAB_TEST_SCRATCH")
        .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from)
}

/// A scratch source tree with `makefile`, under the target directory, and its output
/// directory beside it.
struct Scratch {
    dir: tempfile::TempDir,
    source: PathBuf,
    out: PathBuf,
    log: PathBuf,
}

fn scratch(makefile: &str) -> Scratch {
    let dir = tempfile::tempdir_in(scratch_root()).expect("scratch dir");
    let source = dir.path().join("source");
    let out = dir.path().join("out");
    std::fs::create_dir_all(&source).expect("source");
    std::fs::create_dir_all(&out).expect("out");
    std::fs::write(source.join("Makefile"), makefile).expect("Makefile");
    let log = dir.path().join("build.log");
    Scratch {
        dir,
        source,
        out,
        log,
    }
}

impl Scratch {
    /// `make -C SOURCE O=OUT` as builds run it, with these limits.
    #[allow(clippy::result_large_err)] // the library's error, as its builds return it
    fn make(&self, sandbox: &Sandbox, limits: LimitOverrides) -> Result<(), BuildError> {
        build::make_out_of_tree(
            &sandbox.clone().with_limits(limits),
            &self.source,
            &self.out,
            &[],
            BuildKind::Modules,
            &self.log,
        )
    }
}

fn expect_wrote_outside(result: Result<(), BuildError>, outside: &Path) {
    let e = result.expect_err("a build that writes outside its output directory must fail");
    match &e {
        BuildError::WroteOutside { path, .. } => assert_eq!(path, outside, "{e}"),
        other => panic!("expected a refused write, got: {other}"),
    }
    let text = e.to_string();
    assert!(text.contains(&outside.display().to_string()), "{text}");
    assert!(text.contains("Full log: "), "{text}");
    assert_eq!(fault_exit_code(e.fault()), 2, "the patch's doing: {text}");
}

#[test]
fn a_recipe_that_writes_outside_its_output_fails_naming_the_path() {
    let Some(sandbox) = sandbox_or_skip("a_recipe_that_writes_outside_its_output") else {
        return;
    };
    let victim = tempfile::tempdir_in(scratch_root()).expect("dir");
    let outside = victim.path().join("owned-by-the-patch");
    let s = scratch(&format!("all:\n\ttouch {}\n", outside.display()));
    expect_wrote_outside(s.make(&sandbox, LimitOverrides::default()), &outside);
    assert!(!outside.exists(), "{} was written", outside.display());
}

/// `$(shell ...)` failures do not stop make: the build "succeeds", and must still fail.
#[test]
fn a_shell_call_that_writes_outside_its_output_fails_the_build_make_let_pass() {
    let Some(sandbox) = sandbox_or_skip("a_shell_call_that_writes_outside_its_output") else {
        return;
    };
    let victim = tempfile::tempdir_in(scratch_root()).expect("dir");
    let outside = victim.path().join("written-by-shell");
    let s = scratch(&format!(
        "X := $(shell touch {})\nall:\n\t@echo built > $(O)/inside\n",
        outside.display()
    ));
    expect_wrote_outside(s.make(&sandbox, LimitOverrides::default()), &outside);
    assert!(!outside.exists());
    // The output directory itself was writable.
    assert!(s.out.join("inside").is_file());
}

/// The source is read-only to its own build: a Makefile that appends to a source file (what
/// a hostile patch's `$(shell ...)` did to the tree every later build shared) fails naming
/// it, and the file is as it was.
#[test]
fn a_build_that_writes_into_its_source_fails_naming_the_file_and_leaves_it_as_it_was() {
    let Some(sandbox) = sandbox_or_skip("a_build_that_writes_into_its_source") else {
        return;
    };
    let s = scratch(
        "X := $(shell echo '/* poisoned */' >> $(CURDIR)/main.c)\nall:\n\t@cp $(CURDIR)/main.c $(O)/main.o\n",
    );
    let main = s.source.join("main.c");
    std::fs::write(&main, "int main;\n").expect("main.c");
    expect_wrote_outside(s.make(&sandbox, LimitOverrides::default()), &main);
    assert_eq!(
        std::fs::read_to_string(&main).expect("main.c"),
        "int main;\n"
    );
    // So does a recipe that writes its object beside its source, as an in-tree build would.
    let s = scratch("all:\n\t@echo obj > $(CURDIR)/main.o\n");
    let obj = s.source.join("main.o");
    expect_wrote_outside(s.make(&sandbox, LimitOverrides::default()), &obj);
    assert!(!obj.exists());
}

/// `/tmp` is the host's, read-only: a write there is refused and named like any other (a
/// victim under /tmp stays untouched), and the build's own temporary files go to its `TMPDIR`.
#[test]
fn a_write_under_tmp_is_refused_and_named_and_mktemp_still_works() {
    let Some(sandbox) = sandbox_or_skip("a_write_under_tmp_is_refused") else {
        return;
    };
    let victim = tempfile::tempdir_in("/tmp").expect("a directory under /tmp");
    let outside = victim.path().join("written-by-the-build");
    let s = scratch(&format!(
        "all:\n\t@t=$$(mktemp) && echo ok > $$t && cp $$t $(O)/tmpfile\n\ttouch {}\n",
        outside.display()
    ));
    expect_wrote_outside(s.make(&sandbox, LimitOverrides::default()), &outside);
    assert!(!outside.exists());
    assert_eq!(
        std::fs::read_to_string(s.out.join("tmpfile")).expect("the build's own tmp file"),
        "ok\n"
    );
}

#[test]
fn the_sandbox_has_no_network_privileges_or_capabilities() {
    let Some(sandbox) = sandbox_or_skip("the_sandbox_has_no_network") else {
        return;
    };
    let s = scratch("");
    let guard = hvlab::kernel::limits::Guard::unlimited();
    let out = sandbox
        .command("sh", &View::writing(&[&s.out], None), &guard)
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
        Some(s.out.to_str().expect("utf-8")),
        "{text}"
    );
    drop(s.dir);
}

/// The limit error of `result`, its words checked.
fn limit_of(result: Result<(), BuildError>, words: &str) -> LimitHit {
    let e = result.expect_err("a build past its limit must fail");
    let text = e.to_string();
    assert!(text.contains(words), "{text}");
    assert!(text.contains("Full log: "), "{text}");
    assert_eq!(fault_exit_code(e.fault()), 2, "the patch's doing: {text}");
    match e {
        BuildError::LimitReached { limit, .. } => limit,
        other => panic!("expected a limit, got: {other}"),
    }
}

/// Live processes whose command line is `words`.
fn running(words: &[&str]) -> usize {
    let wanted: Vec<u8> = words.join("\0").into_bytes();
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter(|e| {
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let zombie = stat
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
            cmdline.strip_suffix(b"\0").unwrap_or(&cmdline) == wanted.as_slice() && !zombie
        })
        .count()
}

/// A sleep length no other process on the host uses, so the build's are found by it.
fn unique_secs(salt: u32) -> String {
    format!("{}", 10_000 + (std::process::id() % 1000) * 10 + salt)
}

/// `$(shell sleep ...)` in a Makefile: ended at its wall-time limit (here 1 s), named, and
/// nothing of it left running.
#[test]
fn a_build_past_its_wall_time_is_ended_and_the_limit_named() {
    let Some(sandbox) = sandbox_or_skip("a_build_past_its_wall_time") else {
        return;
    };
    let secs = unique_secs(1);
    let s = scratch(&format!("X := $(shell sleep {secs})\nall:\n\t@true\n"));
    let start = Instant::now();
    let limit = limit_of(
        s.make(
            &sandbox,
            LimitOverrides {
                wall: Some(Duration::from_secs(1)),
                ..LimitOverrides::default()
            },
        ),
        "wall-time limit of 1.0 s (--build-timeout)",
    );
    assert_eq!(
        limit,
        LimitHit::WallTime {
            limit: Duration::from_secs(1)
        }
    );
    // Ended within the limit, its grace period for make and a poll or two.
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(running(&["sleep", &secs]), 0);
}

/// One file past the disk limit: the write fails at the limit (`RLIMIT_FSIZE`, `SIGXFSZ`
/// ignored), the error names the file, and the file is no larger than the limit.
#[test]
fn a_file_past_the_disk_limit_fails_at_the_limit_and_is_named() {
    let Some(sandbox) = sandbox_or_skip("a_file_past_the_disk_limit") else {
        return;
    };
    let s = scratch("X := $(shell dd if=/dev/zero of=$(O)/big bs=1M count=20)\nall:\n\t@true\n");
    let limit = limit_of(
        s.make(
            &sandbox,
            LimitOverrides {
                disk_bytes: Some(4 << 20),
                ..LimitOverrides::default()
            },
        ),
        "disk limit of 4.00 MiB (--build-disk)",
    );
    let big = s.out.join("big");
    assert_eq!(
        limit,
        LimitHit::Disk {
            limit: 4 << 20,
            file: Some(big.clone())
        }
    );
    let len = std::fs::metadata(&big).map_or(0, |m| m.len());
    assert!(len <= 4 << 20, "{len} bytes written past the limit");
}

/// Many files, none past the limit alone: the output directory measured while the build runs
/// is, and the build is ended.
#[test]
fn many_files_past_the_disk_limit_together_end_the_build() {
    let Some(sandbox) = sandbox_or_skip("many_files_past_the_disk_limit") else {
        return;
    };
    let secs = unique_secs(2);
    let s = scratch(&format!(
        "X := $(shell for i in 1 2 3 4 5 6; do dd if=/dev/zero of=$(O)/f$$i bs=1M count=1 2>/dev/null; done; sleep {secs})\nall:\n\t@true\n"
    ));
    let start = Instant::now();
    let limit = limit_of(
        s.make(
            &sandbox,
            LimitOverrides {
                disk_bytes: Some(4 << 20),
                ..LimitOverrides::default()
            },
        ),
        "its output and temporary files grew past it",
    );
    assert_eq!(
        limit,
        LimitHit::Disk {
            limit: 4 << 20,
            file: None
        }
    );
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(running(&["sleep", &secs]), 0);
}

/// A fork bomb of sleeps: refused past the process limit (a pids cgroup here, or
/// RLIMIT_NPROC), the build ended, the limit and how it is held named, nothing left running.
#[test]
fn a_build_past_its_process_limit_is_ended_and_the_limit_named() {
    let Some(sandbox) = sandbox_or_skip("a_build_past_its_process_limit") else {
        return;
    };
    let cap = process_cap_here(true);
    if cap == ProcessCap::Unenforced {
        loud_skip(
            "a_build_past_its_process_limit: no pids cgroup nor RLIMIT_NPROC holds a build here",
        );
        return;
    }
    let secs = unique_secs(3);
    let s = scratch(&format!(
        "X := $(shell for i in $$(seq 100); do sleep {secs} & done; wait)\nall:\n\t@true\n"
    ));
    let limit = limit_of(
        s.make(
            &sandbox,
            LimitOverrides {
                processes: Some(20),
                ..LimitOverrides::default()
            },
        ),
        "its limit of 20 processes (--build-procs, held by ",
    );
    assert_eq!(limit, LimitHit::Processes { limit: 20, cap });
    let deadline = Instant::now() + Duration::from_secs(5);
    while running(&["sleep", &secs]) > 0 {
        assert!(Instant::now() < deadline, "the build's sleeps outlived it");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A daemon that leaves make's session (`setsid`) and outlives make is ended with the build,
/// in the sandbox (its pid namespace) and without one (its cgroup, where hvlab can make one).
#[test]
fn a_daemon_that_outlives_make_is_ended_with_the_build() {
    for (policy, salt) in [(SandboxPolicy::REQUIRED, 4), (SandboxPolicy::OFF, 5)] {
        let sandbox = match Sandbox::choose(policy) {
            Ok(s) => s,
            Err(e) => {
                loud_skip(&format!("a_daemon_that_outlives_make: no sandbox ({e})"));
                continue;
            }
        };
        if policy == SandboxPolicy::OFF && process_cap_here(false) == ProcessCap::Unenforced {
            loud_skip("a_daemon_that_outlives_make without a sandbox: no pids cgroup here");
            continue;
        }
        let secs = unique_secs(salt);
        let s = scratch(&format!(
            "X := $(shell setsid sh -c 'echo started > $(O)/daemon; exec sleep {secs}' >/dev/null 2>&1 < /dev/null &)\nall:\n\t@sleep 0.5\n"
        ));
        s.make(&sandbox, LimitOverrides::default())
            .expect("the build itself succeeds");
        assert!(
            s.out.join("daemon").is_file(),
            "{policy:?}: the daemon never started"
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while running(&["sleep", &secs]) > 0 {
            assert!(
                Instant::now() < deadline,
                "{policy:?}: the daemon outlived the build"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
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
        Ok("off") => SandboxPolicy::OFF,
        _ => SandboxPolicy::REQUIRED,
    };
    let sandbox = Sandbox::choose(policy).expect("a sandbox");
    let out = tree.with_extension("out");
    std::fs::create_dir_all(&out).expect("out");
    let log = tree.with_extension("log");
    match build::make_out_of_tree(&sandbox, &tree, &out, &[], BuildKind::Modules, &log) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("helper: {e}");
            std::process::exit(fault_exit_code(e.fault()));
        }
    }
}

/// A process seen in /proc: its pid, session and state.
struct Proc {
    session: i32,
    zombie: bool,
}

/// Processes (not zombies' corpses only: those are flagged) whose command line is `words`.
fn procs_running(words: &[&str]) -> Vec<(i32, Proc)> {
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

fn proc_stat(pid: i32) -> Option<(i32, Proc)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state, ppid, pgrp, session.
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((
        pid,
        Proc {
            zombie: rest.first()? == &"Z",
            session: rest.get(3)?.parse().ok()?,
        },
    ))
}

/// Live (not zombie) processes of `session`.
fn live_in_session(session: i32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter_map(proc_stat)
        .filter(|(_, p)| p.session == session && !p.zombie)
        .map(|(pid, _)| pid)
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
    let s = scratch(&format!(
        "all:\n\tsh -c 'sleep {secs} & sleep {secs} & wait'\n"
    ));
    let mut helper = Command::new(std::env::current_exe().expect("the test binary"));
    // hvlab keeps a stop signal ignored when whoever started it ignores it (nohup; a shell's
    // `&` ignores SIGINT and SIGQUIT), so a CI started in the background would see SIGINT
    // ignored: the helper gets the default, as from an interactive shell.
    // SAFETY: signal() with SIG_DFL is async-signal-safe and touches only the child.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut helper, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let mut helper = helper
        .args([
            "sandbox::helper_builds_the_tree_it_is_given",
            "--exact",
            "--ignored",
            "--nocapture",
        ])
        .env(HELPER_TREE, &s.source)
        .env(HELPER_POLICY, policy)
        .spawn()
        .expect("start the helper");
    let deadline = Instant::now() + Duration::from_secs(20);
    let sleeps = loop {
        let found = procs_running(&["sleep", &secs]);
        if found.len() == 2 && found.iter().all(|(_, p)| !p.zombie) {
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
    let session = sleeps[0].1.session;
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
            .filter(|(_, p)| !p.zombie)
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
