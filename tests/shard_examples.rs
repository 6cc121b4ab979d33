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
    // Each model unit once: every scenario, and its showcases on the threads' profiles.
    assert_eq!(scenarios.len(), 11, "{scenarios:?}");
    scenarios.dedup();
    assert_eq!(
        scenarios,
        ["exits", "lifecycle", "memory", "percpu", "pinning"],
        "the three tasks ran each model scenario once"
    );
    // The merge job's own command, as Slurm would run it once the array succeeded.
    let out = Command::new("sh").arg("-c").arg(&merge).output().unwrap();
    assert!(
        out.status.success(),
        "{merge}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let suite = dir.path().join("suite.db");
    let runs = common::json(&common::run(&suite, &["runs", "--json"]));
    assert_eq!(runs["runs"].as_array().unwrap().len(), 11, "{runs}");
    assert!(dir.path().join("report/index.html").exists());
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
