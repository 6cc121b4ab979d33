//! Hostile Makefiles on Debian 7.3's source, as a patch from a mailing list brings them: one
//! `$(shell ...)` line in `arch/x86/kvm/Makefile` (a module build) or `kernel/rcu/Makefile` (a
//! whole kernel). The source is read-only to the build, so a write into it fails naming the
//! file and `hvlab cache verify` still finds the tree as unpacked; a build past its wall time is
//! ended and the limit named; nothing is kept of either. Run when `HVLAB_SVM_TCG` is set, on
//! hvlab's kernel cache (the source is shared with the kab tests).
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::path::{Path, PathBuf};

use crate::common::{assert_exit, db, hvlab, stderr};
use crate::kernel_vm::{building, cache_dir};

/// A patch adding `line` after the licence of `makefile` (whose first four lines are given).
fn hostile(dir: &Path, name: &str, makefile: &str, head: [&str; 4], line: &str) -> PathBuf {
    let path = dir.join(format!("{name}.patch"));
    let text = format!(
        "Subject: [PATCH] {name}\n\n--- a/{makefile}\n+++ b/{makefile}\n@@ -1,4 +1,5 @@\n {}\n {}\n+{line}\n {}\n {}\n",
        head[0], head[1], head[2], head[3]
    );
    std::fs::write(&path, text).unwrap();
    path
}

const KVM_MAKEFILE: [&str; 4] = [
    "# SPDX-License-Identifier: GPL-2.0",
    "",
    "ccflags-y += -I $(srctree)/arch/x86/kvm",
    "ccflags-$(CONFIG_KVM_WERROR) += -Werror",
];

/// `hvlab vm --kernel debian:7.3+PATCH EXTRA -- list`.
fn vm(db: &Path, patch: &Path, extra: &[&str]) -> std::process::Output {
    hvlab()
        .arg("--db")
        .arg(db)
        .args(["vm", "--kernel", &format!("debian:7.3+{}", patch.display())])
        .args(extra)
        .args(["--", "list"])
        .output()
        .unwrap()
}

/// What every hostile build must leave: no work directory, no half-built entry.
fn nothing_kept() {
    for source in std::fs::read_dir(cache_dir().join("kbuild"))
        .unwrap()
        .flatten()
    {
        assert!(
            !source.path().join("work").exists(),
            "a work directory was left"
        );
        for e in std::fs::read_dir(source.path().join("builds"))
            .unwrap()
            .flatten()
        {
            assert!(
                !e.file_name().to_string_lossy().ends_with(".tmp"),
                "a half-built entry was left: {}",
                e.path().display()
            );
        }
    }
}

/// A module build whose Makefile appends to `virt/kvm/kvm_main.c` of the shared source: exit
/// 2 naming the file, the tree still as unpacked; one that sleeps is ended at its wall time.
#[test]
fn a_hostile_kvm_makefile_cannot_write_the_shared_source_nor_run_past_its_time() {
    let Some(_turn) = building("a_hostile_kvm_makefile") else {
        return;
    };
    let (_dir, db) = db();
    let patches = tempfile::tempdir().unwrap();
    let poison = hostile(
        patches.path(),
        "poison-the-source",
        "arch/x86/kvm/Makefile",
        KVM_MAKEFILE,
        "X := $(shell echo '/* poisoned */' >> $(srctree)/virt/kvm/kvm_main.c)",
    );
    let out = vm(&db, &poison, &[]);
    assert_exit(
        &out,
        2,
        &[
            "tried to write ",
            "/source/virt/kvm/kvm_main.c, outside its output directory",
            "Read-only file system",
            "the source tree is read-only to a build",
        ],
    );
    nothing_kept();
    let verify = hvlab().args(["cache", "verify"]).output().unwrap();
    assert_exit(&verify, 0, &[]);
    let said = String::from_utf8_lossy(&verify.stdout);
    assert!(said.contains(": as unpacked (sha256 "), "{said}");
    assert!(!said.contains("CHANGED"), "{said}");
    let sleep = hostile(
        patches.path(),
        "sleep-forever",
        "arch/x86/kvm/Makefile",
        KVM_MAKEFILE,
        "X := $(shell sleep 3600)",
    );
    let start = std::time::Instant::now();
    let out = vm(&db, &sleep, &["--build-timeout", "5s"]);
    assert_exit(
        &out,
        2,
        &["reached its wall-time limit of 5.0 s (--build-timeout)"],
    );
    assert!(
        start.elapsed() < std::time::Duration::from_secs(120),
        "{:?}: {}",
        start.elapsed(),
        stderr(&out)
    );
    nothing_kept();
}

/// A whole kernel (a built-in directory's Makefile) built out of tree: a write into the source
/// from `kernel/rcu/Makefile` fails naming the file, and the tree verifies. Not in CI: a whole
/// kernel from a cold cache takes about 3 minutes on 2 cores.
#[test]
#[ignore = "builds a whole kernel (about 3 minutes from a cold cache on 2 cores); run with --ignored"]
fn a_hostile_built_in_makefile_cannot_write_the_shared_source_of_a_whole_kernel() {
    let Some(_turn) = building("a_hostile_built_in_makefile") else {
        return;
    };
    let (_dir, db) = db();
    let patches = tempfile::tempdir().unwrap();
    let rcu = cache_dir()
        .join("kbuild")
        .read_dir()
        .unwrap()
        .flatten()
        .map(|s| s.path().join("source/kernel/rcu/Makefile"))
        .find(|m| m.is_file());
    let head: Vec<String> = match rcu {
        Some(m) => std::fs::read_to_string(m)
            .unwrap()
            .lines()
            .take(4)
            .map(str::to_string)
            .collect(),
        None => panic!("run the module test first: it unpacks Debian 7.3's source"),
    };
    let poison = hostile(
        patches.path(),
        "poison-from-rcu",
        "kernel/rcu/Makefile",
        [&head[0], &head[1], &head[2], &head[3]],
        "X := $(shell echo '/* poisoned */' >> $(srctree)/kernel/rcu/srcutree.c)",
    );
    let out = vm(&db, &poison, &[]);
    assert_exit(
        &out,
        2,
        &[
            "make bzImage modules (poison-from-rcu.patch)",
            "/source/kernel/rcu/srcutree.c, outside its output directory",
            "Read-only file system",
        ],
    );
    nothing_kept();
    let verify = hvlab().args(["cache", "verify"]).output().unwrap();
    assert_exit(&verify, 0, &[]);
}
