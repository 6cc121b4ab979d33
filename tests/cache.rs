//! `hvlab cache` on a scratch cache (`HVLAB_CACHE`): the list with sizes, last use and what is
//! in use; a prune that takes the least recently used entries and leaves those another process
//! holds (a build entry a kab boots, a source whose build lock is taken); and a verification
//! that names a source tree changed behind hvlab's back and has it unpacked again.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::common::{assert_exit, hvlab};

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const SOURCE: &str = "kbuild/7.3.4+deb13-amd64_7.3.4-1~bpo13+1";

fn file(path: &Path, bytes: usize) {
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, vec![b'x'; bytes]).expect("write");
}

/// Marks `path` last used `days` ago.
fn aged(path: &Path, days: u64) {
    let t = SystemTime::now() - Duration::from_secs(days * 86_400);
    std::fs::File::open(path)
        .and_then(|f| f.set_modified(t))
        .expect("set mtime");
}

/// A cache as a series leaves it: a source tree with its checksum, three builds of it (4, 3
/// and 2 days old), a kernel image, a boot log of an hvlab long gone, a calibration.
fn scratch_cache() -> tempfile::TempDir {
    let dir = tempfile::tempdir_in(crate::sandbox::scratch_root()).expect("cache");
    let root = dir.path().join(SOURCE);
    file(&root.join("lock"), 0);
    file(&root.join("source/virt/kvm/kvm_main.c"), 64 * 1024);
    file(&root.join("source/Makefile"), 4096);
    hvlab::kernel::cache::checksum::record(
        &root.join("source"),
        "linux-source-7.3 7.3.4-1~bpo13+1 (Debian)",
    )
    .expect("record");
    for (key, days) in [("k-old", 4), ("k-mid", 3), ("k-new", 2)] {
        let b = root.join("builds").join(key);
        file(&b.join("kernel/usr/lib/modules/x/kvm.ko"), 1 << 20);
        aged(&b, days);
    }
    file(&root.join("logs/1-modules-k-old.log"), 1024);
    let kernel = dir.path().join("kernels/7.3.4+deb13-amd64");
    file(&kernel.join(".complete"), 16);
    aged(&kernel, 1);
    // A pid above the kernel's pid_max: an hvlab long gone.
    let log = dir.path().join("logs/100-7.3.4+deb13-amd64-5000001");
    file(&log.join("console.log"), 4096);
    aged(&log, 9);
    file(&dir.path().join("calibrations/x.toml"), 100);
    aged(&dir.path().join("calibrations"), 99);
    dir
}

/// `hvlab cache ARGS --json` with `cache` as `HVLAB_CACHE`.
fn cache_cmd(cache: &Path, args: &[&str]) -> Output {
    hvlab()
        .env("HVLAB_CACHE", cache)
        .arg("cache")
        .args(args)
        .output()
        .expect("run hvlab cache")
}

fn json(out: &Output) -> Value {
    serde_json::from_str(&stdout(out)).expect("one JSON document")
}

/// Another process holding `path` with `flock` (shared or exclusive) until killed.
struct Holder(Child);

impl Holder {
    fn new(path: &Path, shared: bool) -> Holder {
        let mut cmd = Command::new("flock");
        // -o: the lock stays with flock, not the sleep it runs, so killing flock releases it.
        cmd.arg("-o");
        if shared {
            cmd.arg("-s");
        }
        // A group of its own: flock and its sleep end together.
        let child = std::os::unix::process::CommandExt::process_group(&mut cmd, 0)
            .arg(path)
            .args(["sleep", "60"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("flock (util-linux)");
        // Owned at once, so a failure below still ends it.
        let holder = Holder(child);
        // Until it holds: a non-blocking exclusive attempt fails.
        for _ in 0..200 {
            let probe = Command::new("flock")
                .args(["-n", "-x"])
                .arg(path)
                .arg("true")
                .status()
                .expect("flock");
            if !probe.success() {
                return holder;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("{} was never held", path.display());
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = rustix::process::kill_process_group(
            rustix::process::Pid::from_child(&self.0),
            rustix::process::Signal::KILL,
        );
        let _ = self.0.wait();
    }
}

fn names(entries: &Value) -> Vec<String> {
    entries
        .as_array()
        .expect("entries")
        .iter()
        .map(|e| e["name"].as_str().expect("name").to_string())
        .collect()
}

#[test]
fn hvlab_cache_lists_every_entry_with_its_size_last_use_and_use() {
    let dir = scratch_cache();
    let root = dir.path().join(SOURCE);
    let _boot = Holder::new(&root.join("builds/k-mid"), true);
    let out = cache_cmd(dir.path(), &["--json"]);
    assert_exit(&out, 0, &[]);
    let inv = json(&out);
    let entries = inv["entries"].as_array().expect("entries");
    let kind_of = |name: &str| {
        entries
            .iter()
            .find(|e| e["name"] == name)
            .unwrap_or_else(|| panic!("{name} not listed: {inv}"))
    };
    assert_eq!(kind_of(&format!("{SOURCE}/source"))["kind"], "source");
    assert_eq!(
        kind_of(&format!("{SOURCE}/source"))["about"],
        "linux-source-7.3 7.3.4-1~bpo13+1 (Debian)"
    );
    let mid = kind_of(&format!("{SOURCE}/builds/k-mid"));
    assert_eq!(mid["kind"], "build");
    assert_eq!(mid["in_use"], true);
    assert!(mid["bytes"].as_u64().expect("bytes") >= 1 << 20, "{mid}");
    assert_eq!(kind_of(&format!("{SOURCE}/builds/k-new"))["in_use"], false);
    assert_eq!(kind_of("kernels/7.3.4+deb13-amd64")["kind"], "kernel");
    assert_eq!(
        kind_of("logs/100-7.3.4+deb13-amd64-5000001")["kind"],
        "boot_log"
    );
    assert_eq!(kind_of("calibrations")["kind"], "kept");
    let now = hvlab::kernel::now_stamp();
    let age = now
        - kind_of(&format!("{SOURCE}/builds/k-old"))["last_use"]
            .as_u64()
            .expect("last use");
    assert!((4 * 86_400 - 60..4 * 86_400 + 60).contains(&age), "{age}");
    assert!(inv["bytes"].as_u64().expect("bytes") >= 3 << 20, "{inv}");
    // The words: sizes with their units, the last use, what is in use; logs one line a kind.
    let text = stdout(&cache_cmd(dir.path(), &[]));
    for words in [
        "hvlab's cache ",
        " on disk in ",
        "MiB",
        "4 d ago",
        "in use",
        "1 boot logs (--all lists each)",
    ] {
        assert!(text.contains(words), "{words:?} in:\n{text}");
    }
}

#[test]
fn prune_takes_the_least_recently_used_and_never_what_another_hvlab_holds() {
    let dir = scratch_cache();
    let root = dir.path().join(SOURCE);
    // Another hvlab boots the oldest build; another builds on the source (its lock taken).
    let booting = Holder::new(&root.join("builds/k-old"), true);
    let building = Holder::new(&root.join("lock"), false);
    let dry = cache_cmd(
        dir.path(),
        &["prune", "--keep-size", "1M", "--dry-run", "--json"],
    );
    assert_exit(&dry, 0, &[]);
    let d = json(&dry);
    assert!(root.join("builds/k-mid").is_dir(), "a dry run removed it");
    assert_eq!(d["dry_run"], true);
    let out = cache_cmd(dir.path(), &["prune", "--keep-size", "1M", "--json"]);
    assert_exit(&out, 0, &[]);
    let p = json(&out);
    assert_eq!(
        names(&p["removed"]),
        names(&d["removed"]),
        "the dry run said otherwise"
    );
    let removed = names(&p["removed"]);
    // Least recently used first: the boot log (9 days), then what is not in use of the rest.
    assert_eq!(removed[0], "logs/100-7.3.4+deb13-amd64-5000001", "{p}");
    assert!(removed.contains(&format!("{SOURCE}/builds/k-mid")), "{p}");
    assert!(!root.join("builds/k-mid").exists());
    for kept in ["builds/k-old", "source", "logs/1-modules-k-old.log"] {
        assert!(root.join(kept).exists(), "{kept} was removed while in use");
    }
    let in_use = names(&p["in_use"]);
    assert!(in_use.contains(&format!("{SOURCE}/builds/k-old")), "{p}");
    assert!(in_use.contains(&format!("{SOURCE}/source")), "{p}");
    assert!(
        dir.path().join("calibrations/x.toml").is_file(),
        "a calibration was pruned"
    );
    assert!(p["after"].as_u64() < p["before"].as_u64(), "{p}");
    // Once those hvlabs are done, the rest goes too, and the cache is under the size.
    drop((booting, building));
    let out = cache_cmd(dir.path(), &["prune", "--keep-size", "1M", "--json"]);
    assert_exit(&out, 0, &[]);
    let p = json(&out);
    assert!(p["after"].as_u64().expect("after") <= 1 << 20, "{p}");
    assert!(!root.join("builds/k-old").exists());
    // Past an age alone: nothing younger goes.
    let text = stdout(&cache_cmd(dir.path(), &["prune", "--older-than", "30d"]));
    assert!(
        text.starts_with("removed 0 entries (last used more than 30 d ago)"),
        "{text}"
    );
}

#[test]
fn verify_names_a_source_changed_behind_hvlabs_back_and_has_it_unpacked_again() {
    let dir = scratch_cache();
    let root = dir.path().join(SOURCE);
    let out = cache_cmd(dir.path(), &["verify"]);
    assert_exit(&out, 0, &[]);
    assert!(
        stdout(&out)
            .contains("source: linux-source-7.3 7.3.4-1~bpo13+1 (Debian): as unpacked (sha256 "),
        "{}",
        stdout(&out)
    );
    // Behind hvlab's back: a line appended, a file added.
    let main: PathBuf = root.join("source/virt/kvm/kvm_main.c");
    let mut text = std::fs::read(&main).expect("read");
    text.extend_from_slice(b"\n/* poisoned */\n");
    std::fs::write(&main, text).expect("write");
    file(&root.join("source/big.bin"), 10);
    let out = cache_cmd(dir.path(), &["verify"]);
    assert_exit(&out, 1, &[]);
    let said = stdout(&out);
    for words in [
        "CHANGED since it was unpacked",
        "2 path(s):",
        "  M virt/kvm/kvm_main.c",
        "  A big.bin",
        "the next build of that source unpacks it afresh",
    ] {
        assert!(said.contains(words), "{words:?} in:\n{said}");
    }
    assert!(
        root.join("source.damaged").is_file(),
        "not marked for unpacking again"
    );
    let j = json(&cache_cmd(dir.path(), &["verify", "--json"]));
    assert_eq!(j["sources"][0]["result"]["state"], "changed", "{j}");
    assert_eq!(
        j["sources"][0]["result"]["changes"],
        serde_json::json!([
            {"kind": "changed", "path": "virt/kvm/kvm_main.c"},
            {"kind": "added", "path": "big.bin"}
        ])
    );
}
