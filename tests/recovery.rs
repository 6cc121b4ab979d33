//! A measured run is never thrown away: a store that cannot take a run is
//! refused before anything is measured; a save that fails after measuring prints the run (the
//! full JSON with `--json`) and keeps it in a recovery file that `hvlab import` takes, named
//! by the error.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{hvlab, json, loud_skip, stderr};

/// The recovery file the error names (`the run is kept in PATH: ...`).
fn recovery_path(err: &str) -> PathBuf {
    let rest = err
        .split("the run is kept in ")
        .nth(1)
        .unwrap_or_else(|| panic!("no recovery file named in: {err}"));
    PathBuf::from(rest.split(": `hvlab import").next().expect("a path"))
}

/// hvlab as `nobody`, as a user without root's way past file permissions.
fn hvlab_as_nobody() -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--reset-env",
    ]);
    c.arg(env!("CARGO_BIN_EXE_hvlab"));
    c
}

#[test]
fn a_read_only_store_as_a_non_root_user_fails_before_anything_is_measured() {
    if !common::tool_or_skip(
        "a_read_only_store_as_a_non_root_user_fails_before_anything_is_measured",
        "setpriv",
    ) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // A directory anyone may write (so SQLite opens the file, read-only), a file nobody but
    // root may write: the store opens, and only writing a run would fail.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let db = dir.path().join("ro.db");
    let out = common::run(
        &db,
        &["run", "lifecycle", "--backend", "model", "--reps", "4"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o444)).expect("chmod");
    let out = hvlab_as_nobody()
        .args([
            "run",
            "lifecycle",
            "--backend",
            "model",
            "--reps",
            "4",
            "--json",
        ])
        .arg("--db")
        .arg(&db)
        .env("XDG_DATA_HOME", dir.path())
        .output()
        .expect("spawn");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("cannot take a run"), "{err}");
    assert!(err.contains("nothing was measured"), "{err}");
    assert!(err.contains("--no-store"), "{err}");
    assert!(
        out.stdout.is_empty(),
        "a run was measured for a store that could not take it"
    );
    // The store still reads for that user, and holds only the first run.
    let out = hvlab_as_nobody()
        .args(["runs", "--json", "--db"])
        .arg(&db)
        .output()
        .expect("spawn");
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["runs"].as_array().map(Vec::len), Some(1));
}

/// A tmpfs of `size` mounted on `dir`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(test: &str, dir: &Path, size: &str) -> Option<Tmpfs> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs(dir.to_path_buf())),
            Ok(o) => {
                loud_skip(&format!(
                    "{test}: cannot mount a small tmpfs to fill (needs root): {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                ));
                None
            }
            Err(e) => {
                loud_skip(&format!("{test}: no mount(8): {e}"));
                None
            }
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Fills the file system holding `dir` but for 64 KiB: room for SQLite to open the store
/// (its 32 KiB shared-memory index), not for a run of a few hundred repetitions.
fn fill(dir: &Path) {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).expect("filler");
    let block = vec![0u8; 4096];
    while f.write_all(&block).is_ok() {}
    let _ = f.sync_all();
    let len = f.metadata().expect("filler size").len();
    f.set_len(len.saturating_sub(64 * 1024))
        .expect("free 64 KiB");
}

#[test]
fn a_full_disk_after_measuring_prints_the_run_and_keeps_it_for_import() {
    let test = "a_full_disk_after_measuring_prints_the_run_and_keeps_it_for_import";
    let dir = tempfile::tempdir().expect("tempdir");
    let small = dir.path().join("small");
    std::fs::create_dir(&small).expect("mkdir");
    let Some(_mounted) = Tmpfs::mount(test, &small, "1m") else {
        return;
    };
    let db = small.join("full.db");
    let data = dir.path().join("data");
    let first = common::run(
        &db,
        &["run", "lifecycle", "--backend", "model", "--reps", "4"],
    );
    assert!(first.status.success(), "{}", stderr(&first));
    fill(&small);
    let out = hvlab()
        .args([
            "run",
            "lifecycle",
            "--backend",
            "model",
            "--reps",
            "300",
            "--json",
        ])
        .arg("--db")
        .arg(&db)
        .env("XDG_DATA_HOME", &data)
        .output()
        .expect("spawn");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("was measured but not stored"), "{err}");
    // The full record on stdout, before the failure.
    let printed: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("the record as JSON on stdout");
    let run_id = printed["run_id"].as_str().expect("run_id").to_string();
    assert!(err.contains(&run_id), "{err}");
    let kept = recovery_path(&err);
    assert!(kept.starts_with(&data), "{}", kept.display());
    // The recovery file is what `hvlab import` takes, and holds exactly the printed run.
    let elsewhere = dir.path().join("elsewhere.db");
    let out = common::run(&elsewhere, &["import", kept.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = common::run(&elsewhere, &["show", &run_id, "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out), printed);
}

#[test]
fn a_failed_save_in_a_suite_sweep_keeps_the_run_in_a_recovery_file() {
    use std::io::{BufRead, Read};
    let test = "a_failed_save_in_a_suite_sweep_keeps_the_run_in_a_recovery_file";
    let dir = tempfile::tempdir().expect("tempdir");
    let small = dir.path().join("small");
    std::fs::create_dir(&small).expect("mkdir");
    let Some(_mounted) = Tmpfs::mount(test, &small, "16m") else {
        return;
    };
    let db = small.join("full.db");
    let data = dir.path().join("data");
    // A sweep that fits the free space when it starts (a full disk is refused before any
    // point runs, tests/sweep_cli.rs), on a disk that another writer fills once its first
    // point is stored: 60 points of 110–170 KiB (about 10 MiB of 16), one at a time.
    let mut child = hvlab()
        .args([
            "sweep",
            "lifecycle",
            "--backend",
            "model",
            "--grid",
            &format!(
                "devices={}",
                (0..60).map(|d| d.to_string()).collect::<Vec<_>>().join(",")
            ),
            "--reps",
            "5",
            "--jobs",
            "1",
        ])
        .arg("--db")
        .arg(&db)
        .env("XDG_DATA_HOME", &data)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut lines = std::io::BufReader::new(child.stderr.take().expect("stderr"));
    let mut err = String::new();
    loop {
        let mut line = String::new();
        if lines.read_line(&mut line).expect("stderr") == 0 {
            break;
        }
        err.push_str(&line);
        if line.starts_with("stored run") {
            fill(&small);
            break;
        }
    }
    lines.read_to_string(&mut err).expect("stderr");
    let status = child.wait().expect("wait");
    assert_eq!(status.code(), Some(4), "{err}");
    assert!(err.contains("was measured but not stored"), "{err}");
    let kept = recovery_path(&err);
    let lines = std::fs::read_to_string(&kept).expect("recovery file");
    assert!(!lines.trim().is_empty());
    let elsewhere = dir.path().join("elsewhere.db");
    let out = common::run(&elsewhere, &["import", kept.to_str().expect("utf-8")]);
    assert!(out.status.success(), "{}", stderr(&out));
}
