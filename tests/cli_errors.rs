//! Bad input and unusable hosts get a clear message and the documented exit code, never a
//! panic: 2 for bad input, 3 when the host cannot run what was asked.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)] // test code: a panic is the failure report

use crate::common;

use common::{assert_exit, db, hvlab, run, stderr};

#[test]
fn unknown_scenario_is_bad_input_naming_the_known_ones() {
    let (_d, db) = db();
    assert_exit(
        &run(&db, &["run", "lifecycel"]),
        2,
        &["Unknown scenario `lifecycel`", "lifecycle"],
    );
}

#[test]
fn unknown_variant_is_bad_input_naming_the_choices() {
    let (_d, db) = db();
    assert_exit(
        &run(&db, &["run", "lifecycle", "--variant", "irqchip-last"]),
        2,
        &[
            "Unknown variant `irqchip-last`",
            "memslots-first",
            "qemu-order",
        ],
    );
}

#[test]
fn malformed_set_is_bad_input_with_an_example() {
    let (_d, db) = db();
    assert_exit(
        &run(&db, &["run", "lifecycle", "--set", "devices"]),
        2,
        &["key=value", "--set devices=8"],
    );
    assert_exit(
        &run(&db, &["run", "lifecycle", "--set", "devcies=8"]),
        2,
        &["devcies", "devices"],
    );
    assert_exit(
        &run(&db, &["run", "lifecycle", "--set", "vcpus=lots"]),
        2,
        &["vcpus", "whole number"],
    );
}

#[test]
fn orders_kvm_rejects_are_refused_before_touching_kvm() {
    let (_d, db) = db();
    assert_exit(
        &run(
            &db,
            &[
                "run",
                "lifecycle",
                "--set",
                "order=create-vm,memslot,vcpus,irqchip,run",
            ],
        ),
        2,
        &["irqchip before vcpus"],
    );
    assert_exit(
        &run(
            &db,
            &[
                "run",
                "lifecycle",
                "--set",
                "order=create-vm,memslot,irq,run",
            ],
        ),
        2,
        &["unknown step `irq`"],
    );
}

#[test]
fn zero_reps_is_rejected_by_the_parser() {
    let (_d, db) = db();
    let out = run(&db, &["run", "lifecycle", "--reps", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn missing_kvm_device_exits_3_with_what_to_do() {
    let (_d, db) = db();
    let out = hvlab()
        .args(["host"])
        .env("HVLAB_KVM_DEVICE", "/nonexistent/kvm")
        .output()
        .unwrap();
    assert_exit(&out, 3, &["/nonexistent/kvm does not exist", "modprobe"]);
    // `host` still describes the machine before failing.
    assert!(String::from_utf8_lossy(&out.stdout).contains("kernel"));
    let out = hvlab()
        .args(["run", "lifecycle", "--db"])
        .arg(&db)
        .env("HVLAB_KVM_DEVICE", "/nonexistent/kvm")
        .output()
        .unwrap();
    assert_exit(&out, 3, &["does not exist"]);
}

#[test]
fn bad_input_wins_over_a_missing_device() {
    let (_d, db) = db();
    let out = hvlab()
        .args(["run", "lifecycle", "--variant", "nope", "--db"])
        .arg(&db)
        .env("HVLAB_KVM_DEVICE", "/nonexistent/kvm")
        .output()
        .unwrap();
    assert_exit(&out, 2, &["Unknown variant"]);
}

#[test]
fn permission_denied_on_dev_kvm_says_how_to_get_access() {
    // Root bypasses file permissions, so drop to `nobody` for the real EACCES path.
    let is_root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
    });
    let kvm_mode_private = std::fs::metadata("/dev/kvm")
        .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o006 == 0)
        .unwrap_or(false);
    if !is_root || !kvm_mode_private || !common::tool_or_skip("permission_denied", "setpriv") {
        common::loud_skip(
            "permission_denied: needs root, setpriv, and a /dev/kvm closed to others",
        );
        return;
    }
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_hvlab"))
        .arg("host")
        .output()
        .unwrap();
    assert_exit(
        &out,
        3,
        &["Permission denied opening /dev/kvm", "kvm` group"],
    );
}

#[test]
fn unknown_run_id_is_bad_input() {
    let (_d, db) = db();
    assert_exit(
        &run(&db, &["show", "no-such-run"]),
        2,
        &["No run matches `no-such-run`", "hvlab runs"],
    );
}

#[test]
fn trace_without_a_command_is_bad_input() {
    let out = hvlab().args(["trace"]).output().unwrap();
    assert_exit(&out, 2, &["needs a command"]);
}

#[test]
fn list_json_is_one_document_describing_every_scenario() {
    let out = hvlab().args(["list", "--json"]).output().unwrap();
    let v = common::json(&out);
    let lifecycle = &v["scenarios"][0];
    assert_eq!(lifecycle["name"], "lifecycle");
    // Five construction orders and boot-time activation.
    assert_eq!(lifecycle["variants"].as_array().unwrap().len(), 6);
    assert_eq!(lifecycle["headline"], "ready_ms");
}

/// `--config FILE` for kab, kab --per-patch and bisect: a file that is not there is bad input
/// naming it, before anything is built or booted (no kernel is fetched by this test).
#[test]
fn a_missing_config_file_is_bad_input_naming_it() {
    let (d, db) = db();
    let missing = d.path().join("no-such.config");
    let missing = missing.to_str().unwrap();
    let commands: [&[&str]; 3] = [
        &["kab", "debian:7.3", "git:/nowhere@HEAD"],
        &["kab", "debian:7.3", "debian:7.3+v3.mbox", "--per-patch"],
        &[
            "bisect",
            "git:/nowhere@v7.2",
            "git:/nowhere@v7.3",
            "--variant",
            "irqchip-first",
        ],
    ];
    for command in commands {
        let mut args = command.to_vec();
        args.extend(["--config", missing]);
        assert_exit(
            &run(&db, &args),
            2,
            &["Cannot read the config", missing, "Give --config the path"],
        );
    }
}

/// One boot per kernel on the wall clock is refused by per-patch and bisect, saying why,
/// before anything is built: a boot's own offset in jiffies is as large as a commit's. On the
/// instruction clock one boot is the default, and `--boots 1` goes on to the next check (here
/// the missing series).
#[test]
fn one_boot_per_kernel_is_refused_by_per_patch_and_bisect_on_the_wall_clock() {
    let (_d, db) = db();
    let per_patch = |clock: &str| {
        run(
            &db,
            &[
                "kab",
                "debian:7.3",
                "debian:7.3+v3.mbox",
                "--per-patch",
                "--boots",
                "1",
                "--accel",
                "tcg",
                "--clock",
                clock,
            ],
        )
    };
    assert_exit(
        &per_patch("wall"),
        2,
        &[
            "--boots",
            "a boot's own offset",
            "--boots 2",
            "--clock icount",
        ],
    );
    let on_icount = per_patch("icount");
    assert_exit(&on_icount, 2, &["v3.mbox"]);
    assert!(
        !String::from_utf8_lossy(&on_icount.stderr).contains("a boot's own offset"),
        "{}",
        String::from_utf8_lossy(&on_icount.stderr)
    );
    let bisect = run(
        &db,
        &[
            "bisect",
            "git:/nowhere@v7.2",
            "git:/nowhere@v7.3",
            "--variant",
            "irqchip-first",
            "--boots",
            "1",
            "--accel",
            "tcg",
            "--clock",
            "wall",
        ],
    );
    assert_exit(&bisect, 2, &["--boots", "1"]);
}

/// `bisect --speculate` on a machine of its own (no Slurm job, no Kubernetes pod): refused,
/// saying why, before anything is built.
#[test]
fn speculation_without_a_cluster_is_refused_saying_why() {
    let (_d, db) = db();
    let out = hvlab()
        .args([
            "bisect",
            "git:/nowhere@v7.2",
            "git:/nowhere@v7.3",
            "--variant",
            "irqchip-first",
            "--speculate",
        ])
        .arg("--db")
        .arg(&db)
        .env_remove("SLURM_JOB_ID")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap();
    assert_exit(
        &out,
        2,
        &["--speculate", "no cluster", "starve the timed boots"],
    );
}

/// `hvlab judge` is a `git bisect run` step: its own errors exit 128 plus the usual code, so
/// git stops the bisection instead of marking the commit bad (any code 1–127 but 125).
#[test]
fn judge_errors_stop_a_git_bisect_run_instead_of_marking_the_commit_bad() {
    let (_d, db) = db();
    assert_exit(
        &run(
            &db,
            &["judge", "debian:7.3", "debian:7.3", "--variant", "no-such"],
        ),
        130,
        &["--variant", "no-such"],
    );
    // No CANDIDATE and no git tree around the working directory.
    let dir = tempfile::tempdir().unwrap();
    let out = hvlab()
        .current_dir(dir.path())
        .env("GIT_CEILING_DIRECTORIES", dir.path().parent().unwrap())
        .args(["judge", "debian:7.3", "--variant", "qemu-order", "--db"])
        .arg(&db)
        .output()
        .unwrap();
    assert_exit(&out, 130, &["not in a git tree", "name the candidate"]);
}

/// A `--set` value the guest's scenario would refuse is refused on the host by kab, kab
/// --per-patch, bisect and judge alike, naming the parameter and what it takes, before anything
/// is fetched or built: the kernel cache stays empty (it once built and booted both kernels, and
/// every guest's refusal read as NOT DECIDED, exit 0). So is a key no asked scenario declares.
#[test]
fn a_bad_set_is_refused_on_the_host_before_any_kernel_is_fetched() {
    let (d, db) = db();
    let cache = d.path().join("cache");
    std::fs::create_dir_all(&cache).unwrap();
    let patches = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/patches");
    let fix = format!(
        "debian:7.3+{}",
        patches.join("001-lifecycle-keyed.patch").display()
    );
    let series = format!("debian:7.3+{}", patches.join("series-v1.mbox").display());
    let bisect =
        |variant: &'static str| vec!["bisect", "debian:7.3", &series, "--variant", variant];
    let refused = |args: Vec<&str>, needles: &[&str]| {
        let out = hvlab()
            .args(&args)
            .arg("--db")
            .arg(&db)
            .env("HVLAB_CACHE", &cache)
            .output()
            .unwrap();
        assert_exit(&out, 2, needles);
    };
    for command in [
        vec!["kab", "debian:7.3", &fix],
        vec!["kab", "debian:7.3", &series, "--per-patch"],
        bisect("populated"),
    ] {
        let mut args = command.clone();
        args.extend(["--scenario", "memory", "--set", "size=banana"]);
        refused(args, &["`banana` for size", "256MiB, 6GiB, 512M, 4096"]);
    }
    for command in [
        vec!["kab", "debian:7.3", &fix],
        vec!["kab", "debian:7.3", &series, "--per-patch"],
        bisect("irqchip-first"),
    ] {
        let mut args = command.clone();
        args.extend(["--set", "guest.cpl=0"]);
        refused(
            args,
            &["guest.cpl=0", "no scenario of lifecycle has that parameter"],
        );
    }
    // judge, a `git bisect run` step, refuses it the same way, exiting 128 + 2 so that git
    // stops instead of marking the commit bad.
    let out = hvlab()
        .args([
            "judge",
            "debian:7.3",
            fix.as_str(),
            "--variant",
            "populated",
        ])
        .args(["--scenario", "memory", "--set", "size=banana", "--db"])
        .arg(&db)
        .env("HVLAB_CACHE", &cache)
        .output()
        .unwrap();
    assert_exit(
        &out,
        130,
        &["`banana` for size", "256MiB, 6GiB, 512M, 4096"],
    );
    let left: Vec<_> = std::fs::read_dir(&cache).unwrap().collect();
    assert!(left.is_empty(), "the kernel cache was written: {left:?}");
}
