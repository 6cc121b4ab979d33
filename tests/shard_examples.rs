//! The shipped engine examples work: the Slurm script's array tasks each store their shard in
//! their own file and together run the whole (model) suite; submitted from a login shell it
//! queues the array and a merge that depends on it; the Kubernetes manifest's shard count
//! matches its completions.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::common;

use std::path::Path;
use std::process::Command;

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/slurm/hvlab-suite.sbatch"
);
const MANIFEST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/kubernetes/hvlab-indexed-job.yaml"
);

fn script(out: &Path, vars: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new("bash");
    for k in hvlab::lab::shard::VARIABLES {
        c.env_remove(k);
    }
    c.env_remove("SLURM_JOB_ID");
    c.arg(SCRIPT)
        .env("HVLAB", env!("CARGO_BIN_EXE_hvlab"))
        .env("HVLAB_OUT", out)
        .envs(vars.iter().copied())
        .current_dir(out)
        .output()
        .unwrap()
}

/// Submits the script from a "login shell" with a stand-in sbatch that logs its arguments and
/// answers like `sbatch --parsable`; returns the two submissions and the merge job's command.
fn submit(dir: &Path) -> (Vec<String>, String) {
    let bin = dir.join("bin");
    std::fs::create_dir(&bin).unwrap();
    let log = dir.join("sbatch.log");
    let wrap = dir.join("wrap.sh");
    let stub = bin.join("sbatch");
    std::fs::write(
        &stub,
        format!(
            "#!/bin/sh\necho \"$*\" >> {log}\nfor a; do last=$a; done\ncase \"$*\" in *--wrap*) printf '%s' \"$last\" > {wrap};; esac\necho '4242;cluster'\n",
            log = log.display(),
            wrap = wrap.display()
        ),
    )
    .unwrap();
    Command::new("chmod").arg("+x").arg(&stub).status().unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let out = script(dir, &[("PATH", &path)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let calls = std::fs::read_to_string(&log).unwrap();
    (
        calls.lines().map(String::from).collect(),
        std::fs::read_to_string(&wrap).unwrap(),
    )
}

#[test]
fn the_array_tasks_store_one_shard_each_and_the_merge_job_gathers_them() {
    let dir = tempfile::tempdir().unwrap();
    let (calls, merge) = submit(dir.path());
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls[0].contains("--parsable") && calls[0].ends_with("hvlab-suite.sbatch"));
    assert!(
        calls[1].contains("--dependency=afterok:4242"),
        "{}",
        calls[1]
    );
    // A failed task cancels the merge instead of leaving it pending forever.
    assert!(
        calls[1].contains("--kill-on-invalid-dep=yes"),
        "{}",
        calls[1]
    );
    // The array's logs go to the output directory, not the submit directory.
    let out_dir = dir.path().canonicalize().unwrap();
    assert!(
        calls[0].contains(&format!(
            "--output={}/hvlab-suite-%A_%a.out",
            out_dir.display()
        )),
        "{}",
        calls[0]
    );
    let mut scenarios = Vec::new();
    for id in ["1", "2", "3"] {
        let out = script(
            dir.path(),
            &[
                ("SLURM_JOB_ID", "100"),
                ("SLURM_ARRAY_JOB_ID", "4242"),
                ("SLURM_ARRAY_TASK_ID", id),
                ("SLURM_ARRAY_TASK_MIN", "1"),
                ("SLURM_ARRAY_TASK_MAX", "3"),
                ("SLURM_ARRAY_TASK_COUNT", "3"),
                (
                    "HVLAB_SUITE_ARGS",
                    "--backend model --profile pvm-epyc --reps 3 --warmup 0",
                ),
            ],
        );
        assert!(
            out.status.success(),
            "task {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let db = dir.path().join(format!("shard-4242-{id}.db"));
        // --all: the showcases are internal runs, left out of `runs` by default.
        let runs = common::json(&common::run(&db, &["runs", "--all", "--json"]));
        let here: Vec<String> = runs["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["scenario"].as_str().unwrap().to_string())
            .collect();
        assert!(!here.is_empty(), "task {id} stored nothing");
        assert!(
            dir.path()
                .join(format!("report-4242-{id}/index.html"))
                .exists()
        );
        scenarios.extend(here);
    }
    scenarios.sort();
    // Each model unit once: every scenario, and its showcases on the threads' profiles.
    assert_eq!(scenarios.len(), 14, "{scenarios:?}");
    scenarios.dedup();
    assert_eq!(
        scenarios,
        [
            "dirty",
            "exits",
            "lifecycle",
            "memory",
            "memslots",
            "percpu",
            "pinning"
        ],
        "the three tasks ran each model scenario once"
    );
    // The merge job's own command, as Slurm would run it once the array succeeded.
    let out = Command::new("sh").arg("-c").arg(&merge).output().unwrap();
    assert!(
        out.status.success(),
        "{merge}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let suite = dir.path().join("suite-4242.db");
    let runs = common::json(&common::run(&suite, &["runs", "--all", "--json"]));
    assert_eq!(runs["runs"].as_array().unwrap().len(), 14, "{runs}");
    // Every run of the merged job carries the array's suite id, so the report is the whole
    // suite, whichever task ran each unit.
    assert!(
        runs["runs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["suite"] == "su-slurm-4242"),
        "{runs}"
    );
    assert!(dir.path().join("report-4242/index.html").exists());
}

#[test]
fn bash_inside_an_salloc_allocation_submits_rather_than_taking_the_job_for_an_array_task() {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let log = dir.path().join("sbatch.log");
    std::fs::write(
        bin.join("sbatch"),
        format!("#!/bin/sh\necho \"$*\" >> {}\necho 77\n", log.display()),
    )
    .unwrap();
    Command::new("chmod")
        .arg("+x")
        .arg(bin.join("sbatch"))
        .status()
        .unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    // What salloc sets: a job, no array.
    let out = script(
        dir.path(),
        &[
            ("PATH", &path),
            ("SLURM_JOB_ID", "555"),
            ("SLURM_JOBID", "555"),
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("submit this script as an array job"), "{err}");
    let calls = std::fs::read_to_string(&log).unwrap();
    assert_eq!(calls.lines().count(), 2, "{calls}");
}

#[test]
fn a_reused_output_directory_merges_only_this_arrays_shards() {
    let dir = tempfile::tempdir().unwrap();
    // An earlier array's shard, under both the old and the new naming.
    for stale in ["shard-1.db", "shard-4000-1.db"] {
        let out = common::run(
            &dir.path().join(stale),
            &["run", "pinning", "--backend", "model", "--reps", "3"],
        );
        assert!(out.status.success(), "{}", common::stderr(&out));
    }
    let (_, merge) = submit(dir.path());
    let out = script(
        dir.path(),
        &[
            ("SLURM_JOB_ID", "4243"),
            ("SLURM_ARRAY_JOB_ID", "4242"),
            ("SLURM_ARRAY_TASK_ID", "1"),
            ("SLURM_ARRAY_TASK_MIN", "1"),
            ("SLURM_ARRAY_TASK_MAX", "4"),
            ("SLURM_ARRAY_TASK_COUNT", "4"),
            (
                "HVLAB_SUITE_ARGS",
                "--backend model --profile pvm-epyc --reps 3 --warmup 0",
            ),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shard = common::runs_by_id(&dir.path().join("shard-4242-1.db"));
    let out = Command::new("sh").arg("-c").arg(&merge).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let merged = common::runs_by_id(&dir.path().join("suite-4242.db"));
    assert_eq!(
        merged.keys().collect::<Vec<_>>(),
        shard.keys().collect::<Vec<_>>(),
        "the merge took files of an earlier array"
    );
}

#[test]
fn the_indexed_job_passes_its_completion_count() {
    let yaml = std::fs::read_to_string(MANIFEST).unwrap();
    let field = |name: &str| -> String {
        yaml.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name}"))
            .trim()
            .to_string()
    };
    assert_eq!(field("completionMode:"), "Indexed");
    let completions = field("completions:");
    let count_line = yaml
        .lines()
        .skip_while(|l| !l.contains("name: HVLAB_SHARD_COUNT"))
        .nth(1)
        .unwrap();
    assert!(
        count_line.contains(&format!("value: \"{completions}\"")),
        "HVLAB_SHARD_COUNT must equal spec.completions ({completions}): {count_line}"
    );
    assert_eq!(field("privileged:"), "true");
    assert_eq!(field("path:"), "/dev/kvm");
    assert_eq!(field("type:"), "CharDevice");
    assert!(yaml.contains("name: HVLAB_DB"));
}
