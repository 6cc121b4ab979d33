//! The habits of a command-line tool: `--version` with the revision, completions a shell
//! accepts, a man page, `--quiet`, colour that follows `--color` and `NO_COLOR`, CSV export,
//! and bad values refused with exit 2 naming the valid ones.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::common;

use common::{assert_exit, db, hvlab, run, tool_or_skip};

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn version_names_the_git_revision_it_was_built_from() {
    let out = hvlab().arg("--version").output().unwrap();
    assert_exit(&out, 0, &[]);
    let text = stdout(&out);
    let rev = env!("HVLAB_GIT_REV");
    assert!(text.contains(&format!("(git {rev})")), "{text}");
    assert!(
        text.starts_with(&format!("hvlab {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
}

#[test]
fn bash_accepts_the_bash_completion_script_and_it_completes_subcommands() {
    let out = hvlab().args(["completions", "bash"]).output().unwrap();
    assert_exit(&out, 0, &[]);
    let script = stdout(&out);
    assert!(
        script.contains("sweeps") && script.contains("--save-baseline"),
        "{script}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hvlab.bash");
    std::fs::write(&file, &script).unwrap();
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn zsh_and_fish_scripts_parse_where_those_shells_exist() {
    for (shell, flag) in [("zsh", "-n"), ("fish", "--no-execute")] {
        let out = hvlab().args(["completions", shell]).output().unwrap();
        assert_exit(&out, 0, &[]);
        assert!(stdout(&out).contains("hvlab"), "{shell}");
        if !tool_or_skip(&format!("completions_{shell}"), shell) {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(format!("hvlab.{shell}"));
        std::fs::write(&file, stdout(&out)).unwrap();
        let check = std::process::Command::new(shell)
            .arg(flag)
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "{shell}: {}",
            String::from_utf8_lossy(&check.stderr)
        );
    }
}

#[test]
fn an_unknown_shell_is_bad_input_listing_the_shells() {
    let out = hvlab().args(["completions", "tcsh"]).output().unwrap();
    assert_exit(&out, 2, &["tcsh", "bash", "zsh", "fish"]);
}

#[test]
fn man_prints_a_roff_page_with_the_commands() {
    let out = hvlab().arg("man").output().unwrap();
    assert_exit(&out, 0, &[]);
    let page = stdout(&out);
    assert!(page.contains(".TH hvlab 1"), "{page}");
    assert!(
        page.contains(".SH SUBCOMMANDS") || page.contains(".SH COMMANDS"),
        "{page}"
    );
    assert!(page.contains("completions"), "{page}");
}

/// The subcommands as `hvlab --help` lists them (clap's own `help` aside).
fn subcommands() -> Vec<String> {
    let out = hvlab().arg("--help").output().unwrap();
    let help = stdout(&out);
    let list = help.split("Commands:").nth(1).expect("a Commands: section");
    let names: Vec<String> = list
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "help")
        .map(String::from)
        .collect();
    assert!(names.len() > 10, "{help}");
    names
}

#[test]
fn man_subcommand_prints_that_subcommands_page() {
    let out = hvlab().args(["man", "run"]).output().unwrap();
    assert_exit(&out, 0, &[]);
    let page = stdout(&out);
    assert!(page.contains(".TH hvlab-run 1"), "{page}");
    assert!(page.contains("hvlab\\-run \\- "), "the NAME line: {page}");
    assert!(page.contains("\\fBhvlab run\\fR"), "the synopsis: {page}");
    assert!(
        page.contains("save\\-baseline"),
        "run's own options: {page}"
    );
    assert!(
        page.contains("hvlab 0.1.0 (git "),
        "the version footer: {page}"
    );
}

#[test]
fn man_dir_writes_a_roff_page_for_hvlab_and_every_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let pages = dir.path().join("man1");
    let out = hvlab()
        .args(["man", "--dir", pages.to_str().unwrap()])
        .output()
        .unwrap();
    assert_exit(&out, 0, &[]);
    let top = std::fs::read_to_string(pages.join("hvlab.1")).unwrap();
    assert!(top.contains(".TH hvlab 1"), "{top}");
    let subs = subcommands();
    for sub in &subs {
        let page = std::fs::read_to_string(pages.join(format!("hvlab-{sub}.1")))
            .unwrap_or_else(|e| panic!("hvlab-{sub}.1: {e}"));
        assert!(
            page.contains(&format!(".TH hvlab-{sub} 1")),
            "hvlab-{sub}.1: {page}"
        );
        assert!(page.contains(".SH SYNOPSIS"), "hvlab-{sub}.1");
        assert!(
            top.contains(&format!("hvlab\\-{sub}(1)")),
            "hvlab.1 lists {sub}"
        );
    }
    // hvlab.1, and a page for each subcommand and each nested one (hvlab-cache-prune.1).
    for entry in std::fs::read_dir(&pages).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        assert!(
            name == "hvlab.1"
                || subs.iter().any(|s| {
                    name == format!("hvlab-{s}.1") || name.starts_with(&format!("hvlab-{s}-"))
                }),
            "a page of no subcommand: {name}"
        );
    }
}

#[test]
fn man_of_an_unknown_subcommand_is_bad_input_naming_the_valid_ones() {
    let out = hvlab().args(["man", "rnu"]).output().unwrap();
    assert_exit(&out, 2, &["rnu", "run", "report", "sweeps", "completions"]);
    assert!(out.stdout.is_empty(), "no page printed");
}

#[test]
fn a_bad_color_value_is_bad_input_naming_the_choices() {
    let out = hvlab()
        .args(["--color", "purple", "list"])
        .output()
        .unwrap();
    assert_exit(&out, 2, &["purple", "auto", "always", "never"]);
}

/// A model run with a significant difference, then a compare that calls it: the verdict line
/// is coloured with `--color always`, plain with `never`, and plain when NO_COLOR is set and
/// the choice is left to auto (stdout is a pipe here, so auto is plain either way; `always`
/// overrides NO_COLOR as the convention says).
#[test]
fn colour_follows_the_color_option_and_no_color() {
    let (_dir, db) = db();
    let out = run(
        &db,
        &[
            "run",
            "lifecycle",
            "--backend",
            "model",
            "--variant",
            "irqchip-first",
            "--variant",
            "memslots-first",
            "--reps",
            "6",
            "--warmup",
            "0",
            "--json",
        ],
    );
    assert_exit(&out, 0, &[]);
    let id = common::json(&out)["run_id"].as_str().unwrap().to_string();
    let (a, b) = (
        format!("{id}:irqchip-first"),
        format!("{id}:memslots-first"),
    );
    let compare = |extra: &[&str], no_color: bool| {
        let mut c = hvlab();
        c.args(["compare", &a, &b]).args(extra).arg("--db").arg(&db);
        if no_color {
            c.env("NO_COLOR", "1");
        } else {
            c.env_remove("NO_COLOR");
        }
        let out = c.output().unwrap();
        assert_exit(&out, 0, &[]);
        stdout(&out)
    };
    let coloured = compare(&["--color", "always"], true);
    assert!(coloured.contains("\u{1b}["), "{coloured}");
    assert!(coloured.contains("FASTER"), "{coloured}");
    for plain in [compare(&["--color", "never"], false), compare(&[], true)] {
        assert!(!plain.contains('\u{1b}'), "{plain:?}");
        assert!(plain.contains("FASTER"), "{plain}");
    }
}

#[test]
fn quiet_leaves_results_and_drops_the_notes() {
    let (_dir, db) = db();
    let args = [
        "run",
        "lifecycle",
        "--backend",
        "model",
        "--reps",
        "4",
        "--warmup",
        "0",
    ];
    let loud = run(&db, &args);
    assert_exit(&loud, 0, &["stored run"]);
    let mut q = args.to_vec();
    q.push("--quiet");
    let quiet = run(&db, &q);
    assert_exit(&quiet, 0, &[]);
    assert_eq!(
        common::stderr(&quiet).trim(),
        "",
        "nothing but errors on stderr"
    );
    assert!(stdout(&quiet).contains("ready_ms"), "the results stay");
}

#[test]
fn csv_export_has_one_row_per_run_variant_and_metric() {
    let (_dir, db) = db();
    let out = run(
        &db,
        &[
            "run",
            "lifecycle",
            "--backend",
            "model",
            "--reps",
            "4",
            "--warmup",
            "0",
            "--json",
        ],
    );
    assert_exit(&out, 0, &[]);
    let record = common::json(&out);
    let out = run(&db, &["export", "--format", "csv"]);
    assert_exit(&out, 0, &[]);
    let mut reader = csv::Reader::from_reader(out.stdout.as_slice());
    let header: Vec<String> = reader
        .headers()
        .unwrap()
        .iter()
        .map(str::to_string)
        .collect();
    assert_eq!(header, hvlab::export::csv::CSV_HEADER.to_vec());
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    let expected: usize = record["variants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["metrics"].as_object().unwrap().len().max(1))
        .sum();
    assert_eq!(rows.len(), expected);
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let ready = rows
        .iter()
        .find(|r| &r[col("variant")] == "irqchip-first" && &r[col("metric")] == "ready_ms")
        .unwrap();
    let median = record["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "irqchip-first")
        .unwrap()["metrics"]["ready_ms"]["median"]
        .as_f64()
        .unwrap();
    assert_eq!(ready[col("median")].parse::<f64>().unwrap(), median);
    assert_eq!(&ready[col("unit")], "ms");
    assert_eq!(&ready[col("run_id")], record["run_id"].as_str().unwrap());
}
