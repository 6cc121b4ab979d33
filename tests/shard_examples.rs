//! The shipped engine examples work: the Slurm script's array tasks each store their shard in
//! their own file and together run the whole (model) suite; submitted from a login shell it
//! queues the array and a merge that depends on it; the Kubernetes manifest's shard count
//! matches its completions.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

mod common;

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

#[test]
fn the_slurm_array_tasks_store_one_shard_each() {
    let dir = tempfile::tempdir().unwrap();
    let mut scenarios = Vec::new();
    for id in ["1", "2", "3"] {
        let out = script(
            dir.path(),
            &[
                ("SLURM_JOB_ID", "100"),
                ("SLURM_ARRAY_JOB_ID", "99"),
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
        let db = dir.path().join(format!("shard-{id}.db"));
        let runs = common::json(&common::run(&db, &["runs", "--json"]));
        let here: Vec<String> = runs["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["scenario"].as_str().unwrap().to_string())
            .collect();
        assert!(!here.is_empty(), "task {id} stored nothing");
        assert!(dir.path().join(format!("report-{id}/index.html")).exists());
        scenarios.extend(here);
    }
    scenarios.sort();
    assert_eq!(
        scenarios,
        ["exits", "lifecycle", "memory", "percpu", "pinning"],
        "the three tasks ran each model scenario once"
    );
}

#[test]
fn submitted_from_a_shell_it_queues_the_array_then_a_dependent_merge() {
    let dir = tempfile::tempdir().unwrap();
    // A stand-in sbatch that logs its arguments and answers like `sbatch --parsable`.
    let bin = dir.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    let log = dir.path().join("sbatch.log");
    let stub = bin.join("sbatch");
    std::fs::write(
        &stub,
        format!(
            "#!/bin/sh\necho \"$*\" >> {}\necho '4242;cluster'\n",
            log.display()
        ),
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&stub)
        .status()
        .unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let out = script(dir.path(), &[("PATH", &path)]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let calls = std::fs::read_to_string(&log).unwrap();
    let calls: Vec<&str> = calls.lines().collect();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert!(calls[0].contains("--parsable") && calls[0].ends_with("hvlab-suite.sbatch"));
    assert!(
        calls[1].contains("--dependency=afterok:4242"),
        "{}",
        calls[1]
    );
    assert!(calls[1].contains("merge") && calls[1].contains("shard-*.db"));
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
