//! hvlab writes only what it was asked to write and only regular files, reads
//! without writing, keeps terminals and Markdown safe from imported names, refuses bad input
//! with exit 2 before any work, and never hangs on extreme values. One test (or more) per case.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{assert_exit, db, hvlab, loud_skip, run, stderr, tool_or_skip};

/// A stored model run (a few milliseconds); its id.
fn stored_run(db: &Path) -> String {
    let out = run(
        db,
        &[
            "run",
            "percpu",
            "--backend",
            "model",
            "--profile",
            "pvm-epyc",
            "--reps",
            "3",
            "--json",
        ],
    );
    common::json(&out)["run_id"].as_str().unwrap().to_string()
}

/// The first stored run as a JSON value, to derive hostile records from.
fn exported(db: &Path) -> serde_json::Value {
    let out = run(db, &["export"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().next().unwrap()).unwrap()
}

/// Every file name in `dir`, sorted.
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Runs `cmd`, killing it after `limit`: its output, or `None` when it had to be killed.
fn within(mut cmd: Command, limit: Duration) -> Option<Output> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the shell `script` in a private mount namespace (`$0` is a fresh empty directory,
/// `$1` the hvlab binary); `None` (a loud skip) where mounting is not allowed.
fn in_mount_namespace(test: &str, script: &str) -> Option<(tempfile::TempDir, Output)> {
    if !tool_or_skip(test, "unshare") {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new("unshare")
        .args(["-m", "sh", "-c", script])
        .arg(dir.path())
        .arg(env!("CARGO_BIN_EXE_hvlab"))
        .output()
        .unwrap();
    if out.status.code() == Some(99) || stderr(&out).contains("unshare failed") {
        loud_skip(&format!("{test}: cannot mount here ({})", stderr(&out)));
        return None;
    }
    Some((dir, out))
}

// ---- Rule 1: writes only what it was asked to write, and only regular files ----

#[test]
fn export_onto_dev_null_writes_through_and_leaves_the_device_node() {
    let (_d, db) = db();
    stored_run(&db);
    let out = run(&db, &["export", "-o", "/dev/null"]);
    assert_exit(&out, 0, &["exported 1 run"]);
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::symlink_metadata("/dev/null").unwrap();
    assert!(meta.file_type().is_char_device(), "/dev/null was replaced");
}

#[test]
fn export_onto_a_fifo_writes_into_it_and_one_without_a_reader_is_refused_not_hung() {
    let (d, db) = db();
    stored_run(&db);
    let fifo = d.path().join("pipe");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    // Without a reader: refused at once (exit 2), never blocked.
    let mut cmd = hvlab();
    cmd.args([
        "export",
        "-o",
        fifo.to_str().unwrap(),
        "--db",
        db.to_str().unwrap(),
    ]);
    let out = within(cmd, Duration::from_secs(20)).expect("export onto a FIFO hung");
    assert_exit(&out, 2, &["FIFO", "no process is reading"]);
    // With a reader: the runs go through the FIFO, which stays a FIFO.
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || {
            let mut text = String::new();
            std::fs::File::open(&fifo)
                .unwrap()
                .read_to_string(&mut text)
                .unwrap();
            text
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let out = run(&db, &["export", "-o", fifo.to_str().unwrap()]);
    assert_exit(&out, 0, &["exported 1 run"]);
    let text = reader.join().unwrap();
    assert_eq!(text.lines().count(), 1, "{text}");
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo()
    );
}

#[test]
fn export_onto_a_symlink_to_proc_self_fd_1_writes_to_stdout_and_keeps_the_link() {
    let (d, db) = db();
    stored_run(&db);
    let link = d.path().join("stdout-link");
    std::os::unix::fs::symlink("/proc/self/fd/1", &link).unwrap();
    // stdout is a regular file opened for appending: the export lands after what is there.
    let log = d.path().join("out.log");
    std::fs::write(&log, "before\n").unwrap();
    let status = hvlab()
        .args([
            "export",
            "-o",
            link.to_str().unwrap(),
            "--db",
            db.to_str().unwrap(),
        ])
        .stdout(std::fs::OpenOptions::new().append(true).open(&log).unwrap())
        .status()
        .unwrap();
    assert!(status.success());
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.starts_with("before\n{\"run_id\""), "{text}");
    assert_eq!(names(d.path()), ["hvlab.db", "out.log", "stdout-link"]);
}

#[test]
fn report_does_not_follow_a_symlink_planted_at_index_html() {
    let (d, db) = db();
    stored_run(&db);
    let victim = d.path().join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    let out_dir = d.path().join("rep");
    std::fs::create_dir(&out_dir).unwrap();
    let index = out_dir.join("index.html");
    std::os::unix::fs::symlink(&victim, &index).unwrap();
    let out = run(&db, &["report", "-o", out_dir.to_str().unwrap()]);
    assert_exit(
        &out,
        2,
        &[index.to_str().unwrap(), "symbolic link", "-o DIR"],
    );
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert!(
        std::fs::symlink_metadata(&index)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    assert_eq!(names(&out_dir), ["index.html"], "nothing else was written");
    // A FIFO there is refused the same way, without blocking on it.
    std::fs::remove_file(&index).unwrap();
    assert!(
        Command::new("mkfifo")
            .arg(&index)
            .status()
            .unwrap()
            .success()
    );
    let mut cmd = hvlab();
    cmd.args([
        "report",
        "-o",
        out_dir.to_str().unwrap(),
        "--db",
        db.to_str().unwrap(),
    ]);
    let out = within(cmd, Duration::from_secs(120)).expect("report blocked on a FIFO");
    assert_exit(&out, 2, &[index.to_str().unwrap(), "not a regular file"]);
    // Its own regular files are replaced.
    std::fs::remove_file(&index).unwrap();
    assert_exit(
        &run(&db, &["report", "-o", out_dir.to_str().unwrap()]),
        0,
        &[],
    );
    assert_exit(
        &run(&db, &["report", "-o", out_dir.to_str().unwrap()]),
        0,
        &[],
    );
    assert_eq!(
        names(&out_dir),
        [
            "fidelity.html",
            "fleet.html",
            "groups",
            "index.html",
            "runs",
            "summary.md"
        ]
    );
}

#[test]
fn report_over_an_old_one_on_a_full_disk_keeps_the_old_report_whole() {
    let (_d, db) = db();
    stored_run(&db);
    let script = format!(
        "mount -t tmpfs -o size=1m tmpfs \"$0\" || exit 99
         \"$1\" --db '{db}' report -o \"$0/rep\" >/dev/null || exit 98
         cp \"$0/rep/index.html\" \"$0/rep/summary.md\" /dev/shm/ 2>/dev/null
         dd if=/dev/zero of=\"$0/fill\" bs=4k >/dev/null 2>&1
         \"$1\" --db '{db}' report -o \"$0/rep\"
         echo \"rc=$?\"
         cmp \"$0/rep/index.html\" /dev/shm/index.html && echo SAME-INDEX
         cmp \"$0/rep/summary.md\" /dev/shm/summary.md && echo SAME-SUMMARY
         rm -f /dev/shm/index.html /dev/shm/summary.md
         ls -a \"$0/rep\"",
        db = db.display()
    );
    let Some((_m, out)) = in_mount_namespace("report_full_disk", &script) else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let err = stderr(&out);
    assert!(text.contains("rc=2"), "{text}\n{err}");
    assert!(err.contains("No space left"), "{err}");
    assert!(
        text.contains("SAME-INDEX") && text.contains("SAME-SUMMARY"),
        "{text}"
    );
    assert!(
        !text.contains(".hvlab-report-"),
        "staging left behind: {text}"
    );
}

/// A database of another program with a `runs` table of its own.
fn foreign_db(dir: &Path) -> PathBuf {
    let path = dir.join("other.sqlite");
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE runs (x TEXT); INSERT INTO runs VALUES ('mine');")
        .unwrap();
    drop(conn);
    path
}

#[test]
fn read_only_commands_on_a_foreign_sqlite_file_change_nothing_and_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let foreign = foreign_db(d.path());
    let before = std::fs::read(&foreign).unwrap();
    let report = d.path().join("rep");
    for args in [
        vec!["runs"],
        vec!["show", "x"],
        vec!["report", "-o", report.to_str().unwrap()],
        vec!["export"],
        vec!["compare", "a", "b"],
        // Writing commands refuse it too, before changing anything.
        vec![
            "run",
            "percpu",
            "--backend",
            "model",
            "--profile",
            "pvm-epyc",
            "--reps",
            "2",
        ],
        vec!["import", "/dev/null"],
    ] {
        let out = run(&foreign, &args);
        assert_exit(&out, 2, &[foreign.to_str().unwrap(), "not hvlab's"]);
        assert_eq!(
            std::fs::read(&foreign).unwrap(),
            before,
            "{args:?} changed it"
        );
        assert_eq!(names(d.path()), ["other.sqlite"], "{args:?}");
    }
    let conn = rusqlite::Connection::open(&foreign).unwrap();
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |r| r.get(0))
        .unwrap();
    let mode: String = conn
        .pragma_query_value(None, "journal_mode", |r| r.get(0))
        .unwrap();
    assert_eq!((version, mode.as_str()), (0, "delete"));
}

#[test]
fn read_only_commands_on_a_missing_database_create_nothing() {
    let d = tempfile::tempdir().unwrap();
    let db = d.path().join("sub/none.db");
    let out = run(&db, &["runs"]);
    assert_exit(&out, 0, &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("no runs stored yet"));
    assert_exit(&run(&db, &["show", "x"]), 2, &["No run matches"]);
    assert_exit(&run(&db, &["export"]), 0, &[]);
    assert!(names(d.path()).is_empty(), "{:?}", names(d.path()));
}

#[test]
fn read_only_commands_leave_an_hvlab_store_byte_for_byte_and_make_no_journal_files() {
    let (d, db) = db();
    let id = stored_run(&db);
    let before = std::fs::read(&db).unwrap();
    let listing = names(d.path());
    let report = d.path().join("rep");
    for args in [
        vec!["runs"],
        vec!["show", id.as_str()],
        vec!["export"],
        vec!["report", "-o", report.to_str().unwrap()],
    ] {
        assert_exit(&run(&db, &args), 0, &[]);
    }
    assert_eq!(std::fs::read(&db).unwrap(), before);
    let mut now = names(d.path());
    now.retain(|n| n != "rep");
    assert_eq!(now, listing);
}

#[test]
fn merge_reads_its_inputs_without_creating_files_beside_them() {
    let (d, target) = db();
    let shards = d.path().join("shards");
    std::fs::create_dir(&shards).unwrap();
    let shard = shards.join("shard-1.db");
    stored_run(&shard);
    let before = std::fs::read(&shard).unwrap();
    let out = run(&target, &["merge", shard.to_str().unwrap()]);
    assert_exit(&out, 0, &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 stored"));
    assert_eq!(names(&shards), ["shard-1.db"]);
    assert_eq!(std::fs::read(&shard).unwrap(), before);
}

#[test]
fn merge_from_a_read_only_mount_works_and_blames_nothing() {
    let (d, target) = db();
    let src = d.path().join("src");
    std::fs::create_dir(&src).unwrap();
    stored_run(&src.join("shard.db"));
    let script = format!(
        "mount --bind '{src}' \"$0\" && mount -o remount,ro,bind \"$0\" || exit 99
         touch \"$0/probe\" 2>/dev/null && exit 99
         \"$1\" --db '{target}' merge \"$0/shard.db\"",
        src = src.display(),
        target = target.display()
    );
    let Some((_m, out)) = in_mount_namespace("merge_read_only_mount", &script) else {
        return;
    };
    assert_exit(&out, 0, &[]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 stored"));
    assert_eq!(names(&src), ["shard.db"]);
}

#[test]
fn merge_of_a_foreign_file_names_it_and_does_not_blame_the_target() {
    let d = tempfile::tempdir().unwrap();
    let foreign = foreign_db(d.path());
    let target = d.path().join("t.db");
    let out = run(&target, &["merge", foreign.to_str().unwrap()]);
    assert_exit(&out, 2, &[foreign.to_str().unwrap(), "not hvlab's"]);
    assert!(!stderr(&out).contains("writable path"), "{}", stderr(&out));
}

// ---- Rule 4: terminals and Markdown ----

/// A store holding one run whose id, variant and metric names carry terminal escapes and
/// markup, and are 65,536 characters long; the run's id.
fn hostile_store(db: &Path) -> String {
    stored_run(db);
    let mut r = exported(db);
    let id = format!(
        "\u{1b}]0;pwned\u{7}\u{1b}[2J\u{9b}31m{}",
        "A".repeat(65_536)
    );
    r["run_id"] = id.clone().into();
    r["variants"][0]["name"] = "<script>alert(1)</script>\u{1b}]52;c;aGk=\u{7}".into();
    let metrics = r["variants"][0]["metrics"].as_object_mut().unwrap();
    let first = metrics.values().next().unwrap().clone();
    metrics.insert("M".repeat(65_536), first);
    let file = db.with_file_name("hostile.jsonl");
    std::fs::write(&file, format!("{r}\n")).unwrap();
    assert_exit(&run(db, &["import", file.to_str().unwrap()]), 0, &[]);
    id
}

fn assert_no_control(what: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let bad: Vec<char> = text
        .chars()
        .filter(|c| c.is_control() && *c != '\n' && *c != '\t')
        .take(3)
        .collect();
    assert!(bad.is_empty(), "{what} printed control characters {bad:?}");
}

#[test]
fn imported_esc_and_osc_sequences_are_escaped_by_runs_show_and_errors() {
    let (_d, db) = db();
    hostile_store(&db);
    for args in [
        vec!["runs"],
        vec!["show", "pwned"],
        vec!["show", "pwned", "-v"],
    ] {
        let out = run(&db, &args);
        assert_exit(&out, 0, &[]);
        assert_no_control(&format!("{args:?}"), &out.stdout);
        assert!(String::from_utf8_lossy(&out.stdout).contains("\\u{1b}]0;pwned"));
    }
    // A query typed with an escape in it comes back escaped in the error.
    let out = run(&db, &["show", "\u{1b}[2Jnone"]);
    assert_exit(&out, 2, &["\\u{1b}[2Jnone"]);
    assert_no_control("the error", &out.stderr);
}

#[test]
fn a_65536_character_run_id_or_metric_name_prints_without_panicking() {
    let (_d, db) = db();
    hostile_store(&db);
    for args in [vec!["runs"], vec!["show", "pwned"], vec!["runs", "--json"]] {
        let out = run(&db, &args);
        assert_exit(&out, 0, &[]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&"M".repeat(1000)) || args[0] == "runs",
            "{args:?}"
        );
        assert!(
            text.contains(&"A".repeat(65_536)),
            "{args:?}: the id is printed whole"
        );
    }
}

#[test]
fn summary_md_and_the_html_escape_imported_markup() {
    let (d, db) = db();
    let id = hostile_store(&db);
    let rep = d.path().join("rep");
    let out = run(&db, &["report", &id, "-o", rep.to_str().unwrap()]);
    assert_exit(&out, 0, &[]);
    for page in ["summary.md", "index.html", "run pages"] {
        let text = if page == "run pages" {
            common::report_pages(&rep)
        } else {
            std::fs::read_to_string(rep.join(page)).unwrap()
        };
        assert!(
            !text.contains("<script"),
            "{page} carries the script verbatim"
        );
        assert!(!text.contains('\u{1b}') || page != "summary.md", "{page}");
        // Markdown writes named entities, askama numeric ones: both are text to a browser.
        // (The first screen names variants only in verdicts, which name the originals.)
        assert!(
            page == "index.html"
                || text.contains("&lt;script&gt;")
                || text.contains("&#60;script&#62;"),
            "{page}"
        );
    }
}

// ---- Rule 5: bad input, exit 2, before any work ----

#[test]
fn db_urls_with_an_unknown_or_miscased_scheme_are_exit_2_listing_the_supported_ones() {
    let d = tempfile::tempdir().unwrap();
    for url in [
        "POSTGRES:///hvlab",
        "Postgresql://lab@localhost/hvlab",
        "postgress://lab@localhost/hvlab",
        "pg://lab@localhost/hvlab",
        "mysql://lab@localhost/hvlab",
        " postgres://lab@localhost/hvlab",
    ] {
        for args in [
            vec!["runs"],
            vec![
                "run",
                "percpu",
                "--backend",
                "model",
                "--profile",
                "pvm-epyc",
                "--reps",
                "2",
            ],
        ] {
            let out = hvlab()
                .args(&args)
                .args(["--db", url])
                .current_dir(d.path())
                .output()
                .unwrap();
            assert_exit(&out, 2, &[url, "postgres://", "postgresql://", "file path"]);
        }
        assert!(
            names(d.path()).is_empty(),
            "{url}: created {:?}",
            names(d.path())
        );
    }
}

#[test]
fn db_at_a_fifo_or_a_device_is_exit_2_not_a_disk_io_error() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    for db in [fifo.to_str().unwrap(), "/dev/null", "/dev/zero"] {
        for args in [
            vec!["runs"],
            vec![
                "run",
                "percpu",
                "--backend",
                "model",
                "--profile",
                "pvm-epyc",
                "--reps",
                "2",
            ],
        ] {
            let mut cmd = hvlab();
            cmd.args(&args).args(["--db", db]);
            let out = within(cmd, Duration::from_secs(30)).expect("--db at a FIFO hung");
            assert_exit(&out, 2, &[db, "not a regular file"]);
        }
    }
}

#[test]
fn import_of_dev_zero_is_refused_after_one_bounded_line() {
    let (_d, db) = db();
    let mut cmd = hvlab();
    cmd.args(["import", "/dev/zero", "--db", db.to_str().unwrap()]);
    let out = within(cmd, Duration::from_secs(120)).expect("import /dev/zero did not end");
    assert_exit(
        &out,
        2,
        &[
            "/dev/zero line 1",
            "without a line break",
            "nothing was imported",
        ],
    );
}

#[test]
fn a_jsonl_file_whose_line_6_has_duplicate_variant_names_imports_nothing() {
    let (d, db) = db();
    stored_run(&db);
    let r = exported(&db);
    let target = d.path().join("target.db");
    let mut lines = Vec::new();
    for i in 0..8 {
        let mut x = r.clone();
        x["run_id"] = format!("2026-01-01T00:00:0{i}Z-percpu-model-{i:016x}").into();
        if i == 5 {
            let first = x["variants"][0].clone();
            x["variants"].as_array_mut().unwrap().push(first);
        }
        lines.push(x.to_string());
    }
    let file = d.path().join("runs.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let out = run(&target, &["import", file.to_str().unwrap()]);
    assert_exit(
        &out,
        2,
        &["line 6", "two variants named", "nothing was imported"],
    );
    let out = run(&target, &["runs", "--json"]);
    assert_eq!(common::json(&out)["runs"].as_array().unwrap().len(), 0);
}

#[test]
fn import_refuses_huge_or_non_finite_samples_naming_the_line() {
    let (d, db) = db();
    stored_run(&db);
    let r = exported(&db);
    let mut x = r.clone();
    x["run_id"] = "2026-01-01T00:00:00Z-percpu-model-00000000000000ff".into();
    let metrics = x["variants"][0]["metrics"].as_object_mut().unwrap();
    let m = metrics.values_mut().next().unwrap();
    m["samples"] = serde_json::json!([1e308, -1e308, 0]);
    let file = d.path().join("huge.jsonl");
    std::fs::write(&file, format!("\n{x}\n")).unwrap();
    let out = run(&db, &["import", file.to_str().unwrap()]);
    assert_exit(&out, 2, &["line 2", "1e308", "nothing was imported"]);
    // A non-finite sample cannot be written in JSON: `null` or 1e999 is refused the same way.
    m_set(&mut x, serde_json::json!([1.0, null]));
    std::fs::write(&file, format!("{x}\n")).unwrap();
    assert_exit(
        &run(&db, &["import", file.to_str().unwrap()]),
        2,
        &["line 1"],
    );
    std::fs::write(&file, format!("{x}\n").replace("null", "1e999")).unwrap();
    assert_exit(
        &run(&db, &["import", file.to_str().unwrap()]),
        2,
        &["line 1"],
    );
    assert_eq!(
        common::json(&run(&db, &["runs", "--json"]))["runs"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// Records whose summary its samples do not give (a sample count, a range, a median without
/// samples, an interval backwards; and a verdict that is not its samples'): each refused
/// naming the line and the field, nothing imported, never shown.
#[test]
fn import_refuses_summaries_and_verdicts_their_samples_do_not_give() {
    let (d, db) = db();
    stored_run(&db);
    let r = exported(&db);
    let target = d.path().join("target.db");
    let first_metric = |x: &mut serde_json::Value| -> serde_json::Value {
        let metrics = x["variants"][0]["metrics"].as_object_mut().unwrap();
        metrics.values_mut().next().unwrap().clone()
    };
    let set_first = |x: &mut serde_json::Value, m: serde_json::Value| {
        let metrics = x["variants"][0]["metrics"].as_object_mut().unwrap();
        *metrics.values_mut().next().unwrap() = m;
    };
    type Edit<'a> = &'a dyn Fn(&mut serde_json::Value);
    let cases: [(&str, Edit); 4] = [
        ("says n = 1000000 but carries 4 samples", &|x| {
            let mut m = first_metric(x);
            m["samples"] = serde_json::json!([2.0, 3.0, 4.0, 5.0]);
            m["n"] = 1_000_000.into();
            m["median"] = 3.5.into();
            m["min"] = 2.into();
            m["max"] = 5.into();
            m["ci95"] = serde_json::json!([2.0, 5.0]);
            set_first(x, m);
        }),
        ("says min 9 but its samples give", &|x| {
            let mut m = first_metric(x);
            m["samples"] = serde_json::json!([2.0, 3.0, 4.0, 5.0]);
            m["n"] = 4.into();
            m["median"] = 3.5.into();
            m["ci95"] = serde_json::json!([5, 1]);
            m["min"] = 9.into();
            m["max"] = (-9).into();
            set_first(x, m);
        }),
        ("has no samples but a summary (n = 0, median 1)", &|x| {
            let mut m = first_metric(x);
            m["samples"] = serde_json::json!([]);
            m["n"] = 0.into();
            m["median"] = 1.into();
            set_first(x, m);
        }),
        ("says ci95 [5, 1]", &|x| {
            let mut m = first_metric(x);
            m["samples"] = serde_json::json!([2.0, 3.0, 4.0, 5.0]);
            m["n"] = 4.into();
            m["median"] = 3.5.into();
            m["min"] = 2.into();
            m["max"] = 5.into();
            m["ci95"] = serde_json::json!([5, 1]);
            set_first(x, m);
        }),
    ];
    for (i, (words, edit)) in cases.iter().enumerate() {
        let mut x = r.clone();
        x["run_id"] = format!("2026-01-01T00:00:0{i}Z-percpu-model-{i:016x}").into();
        edit(&mut x);
        let file = d.path().join(format!("contradicts-{i}.jsonl"));
        std::fs::write(&file, format!("{r}\n{x}\n")).unwrap();
        let out = run(&target, &["import", file.to_str().unwrap()]);
        assert_exit(&out, 2, &["line 2", words, "nothing was imported"]);
    }
    // A verdict whose numbers are not its variants' samples.
    let mut x = r.clone();
    x["run_id"] = "2026-01-01T00:00:09Z-percpu-model-0000000000000009".into();
    let v = x["verdicts"]
        .as_array_mut()
        .expect("the percpu run has verdicts");
    assert!(!v.is_empty(), "{r}");
    v[0]["medians"] = serde_json::json!([1.0, 512.0]);
    let file = d.path().join("verdict.jsonl");
    std::fs::write(&file, format!("{x}\n")).unwrap();
    assert_exit(
        &run(&target, &["import", file.to_str().unwrap()]),
        2,
        &["line 1", "the verdict on", "their samples give"],
    );
    let out = run(&target, &["runs", "--json", "--all"]);
    assert_eq!(common::json(&out)["runs"].as_array().unwrap().len(), 0);
    // The honest export imports as it is.
    let file = d.path().join("honest.jsonl");
    std::fs::write(&file, format!("{r}\n")).unwrap();
    assert_exit(&run(&target, &["import", file.to_str().unwrap()]), 0, &[]);
}

fn m_set(x: &mut serde_json::Value, samples: serde_json::Value) {
    let metrics = x["variants"][0]["metrics"].as_object_mut().unwrap();
    metrics.values_mut().next().unwrap()["samples"] = samples;
}

#[test]
fn random_bytes_in_the_middle_of_the_database_stop_a_run_before_it_is_stored() {
    let (_d, db) = db();
    for _ in 0..6 {
        stored_run(&db);
    }
    // Everything is in the main file once the last writer closed; overwrite pages in the
    // middle (the header, and with it the journal mode, stays).
    assert!(!db.with_file_name("hvlab.db-wal").exists());
    let mut data = std::fs::read(&db).unwrap();
    let pages = data.len() / 4096;
    assert!(pages >= 6, "{pages} pages");
    let (from, to) = (pages / 3 * 4096, pages * 2 / 3 * 4096);
    for (i, b) in data[from..to].iter_mut().enumerate() {
        *b = u8::try_from((i * 7919 + 13) % 251).unwrap();
    }
    std::fs::write(&db, &data).unwrap();
    let out = run(
        &db,
        &[
            "run",
            "percpu",
            "--backend",
            "model",
            "--profile",
            "pvm-epyc",
            "--reps",
            "2",
        ],
    );
    assert_exit(&out, 4, &["is corrupt", "move it aside"]);
    assert!(!stderr(&out).contains("stored run"), "{}", stderr(&out));
    assert_eq!(
        std::fs::read(&db).unwrap(),
        data,
        "the corrupt file was written to"
    );
}

// ---- Rule 3: no hang ----

#[test]
fn a_report_of_a_run_with_samples_1e308_and_minus_1e308_ends() {
    let (d, db) = db();
    stored_run(&db);
    let mut x = exported(&db);
    x["run_id"] = "2026-01-01T00:00:00Z-percpu-model-000000000000e308".into();
    for v in x["variants"].as_array_mut().unwrap() {
        for m in v["metrics"].as_object_mut().unwrap().values_mut() {
            m["samples"] = serde_json::json!([1e308, -1e308, 0]);
            m["median"] = 0.into();
            m["min"] = serde_json::json!(-1e308);
            m["max"] = serde_json::json!(1e308);
            m["ci95"] = serde_json::json!([-1e308, 1e308]);
        }
    }
    // Import refuses it, so it is stored the way an older hvlab would have.
    let record: hvlab::record::RunRecord = serde_json::from_value(x).unwrap();
    hvlab::store::Store::open(&db)
        .unwrap()
        .ingest(&record)
        .unwrap();
    let rep = d.path().join("rep");
    let mut cmd = hvlab();
    cmd.args([
        "report",
        "e308",
        "-o",
        rep.to_str().unwrap(),
        "--db",
        db.to_str().unwrap(),
    ]);
    let out = within(cmd, Duration::from_secs(120)).expect("report spun on an infinite range");
    assert_exit(&out, 0, &[]);
    let mut cmd = hvlab();
    cmd.args([
        "report",
        "-o",
        rep.to_str().unwrap(),
        "--db",
        db.to_str().unwrap(),
    ]);
    let out = within(cmd, Duration::from_secs(120)).expect("report spun on an infinite range");
    assert_exit(&out, 0, &[]);
}

#[test]
fn a_guest_memory_size_the_host_cannot_back_is_refused_with_the_numbers_before_any_work() {
    let (_d, db) = db();
    let start = Instant::now();
    let out = run(&db, &["run", "memory", "--set", "size=64GiB"]);
    assert_exit(
        &out,
        2,
        &["`64GiB`", "can back at most", "GiB", "--backend model"],
    );
    let err = stderr(&out);
    assert!(
        err.contains("MemAvailable") || err.contains("cgroup"),
        "{err}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "it did work first"
    );
    assert!(!db.exists(), "a refused run opened the store");
}
