//! Shards through the built binary: `--shard`, Slurm array variables and Kubernetes Indexed Job
//! variables select the right units; shards together run the whole job once, with the same
//! results as one unsharded run.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use common::{assert_exit, json};
use serde_json::Value;

/// hvlab with only `vars` of the engines' variables set (none inherited from the caller).
fn hvlab_env(vars: &[(&str, &str)], args: &[&str], db: &Path) -> Output {
    let mut c: Command = common::hvlab();
    for k in hvlab::lab::shard::VARIABLES {
        c.env_remove(k);
    }
    c.envs(vars.iter().copied())
        .args(args)
        .arg("--db")
        .arg(db)
        .output()
        .unwrap()
}

fn plan(vars: &[(&str, &str)], extra: &[&str]) -> Value {
    let (_dir, db) = common::db();
    let mut args = vec!["suite", "--plan", "--json"];
    args.extend(extra);
    json(&hvlab_env(vars, &args, &db))
}

fn units(v: &Value) -> Vec<String> {
    v["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn slurm_tasks_starting_at_one_partition_the_suite() {
    let whole = units(&plan(&[], &[]));
    assert!(whole.len() >= 9, "{whole:?}");
    let mut seen = Vec::new();
    for id in ["1", "2", "3"] {
        let p = plan(
            &[
                ("SLURM_ARRAY_TASK_ID", id),
                ("SLURM_ARRAY_TASK_MIN", "1"),
                ("SLURM_ARRAY_TASK_MAX", "3"),
                ("SLURM_ARRAY_TASK_COUNT", "3"),
            ],
            &[],
        );
        assert_eq!(p["source"], format!("Slurm array task {id}"));
        let mine = units(&p);
        // Task k (from 1) runs units k-1, k+2, ... of the job.
        let k: usize = id.parse::<usize>().unwrap() - 1;
        let expected: Vec<String> = whole.iter().skip(k).step_by(3).cloned().collect();
        assert_eq!(mine, expected, "task {id}");
        seen.extend(mine);
    }
    seen.sort();
    let mut all = whole.clone();
    all.sort();
    assert_eq!(seen, all, "three tasks run every unit exactly once");
}

#[test]
fn kubernetes_indexes_and_the_flag_select_the_same_shards() {
    for index in 0..4 {
        let i = index.to_string();
        let k8s = plan(
            &[("JOB_COMPLETION_INDEX", &i), ("HVLAB_SHARD_COUNT", "4")],
            &["--backend", "model"],
        );
        let flag = plan(
            &[],
            &["--backend", "model", "--shard", &format!("{}/4", index + 1)],
        );
        assert_eq!(units(&k8s), units(&flag), "index {index}");
        assert_eq!(k8s["shard"], format!("{}/4", index + 1));
        // --shard-count stands in for the variable.
        let counted = plan(
            &[("JOB_COMPLETION_INDEX", &i)],
            &["--backend", "model", "--shard-count", "4"],
        );
        assert_eq!(units(&counted), units(&flag));
    }
    // Fourteen model units (seven scenarios, seven showcases: lifecycle 2, memory 1, exits 1,
    // pinning 1, percpu 2) over 4 shards: the first shard gets units 0, 4, 8 and 12.
    let first = units(&plan(&[], &["--backend", "model", "--shard", "1/4"]));
    assert_eq!(
        first,
        vec![
            "suite/lifecycle/model",
            "suite/memory/model/intel-spr-vmx/0",
            "suite/pinning/model/neoverse-n2-spe/0",
            "suite/dirty/model"
        ]
    );
}

#[test]
fn bad_shards_and_inconsistent_variables_exit_2_naming_the_problem() {
    let (_dir, db) = common::db();
    type Vars<'a> = &'a [(&'a str, &'a str)];
    let cases: &[(Vars<'_>, &[&str], &[&str])] = &[
        (&[], &["--shard", "0/3"], &["--shard", "count from 1"]),
        (&[], &["--shard", "4/3"], &["no shard 4 of 3"]),
        (&[], &["--shard", "1/0"], &["at least 1"]),
        (&[], &["--shard", "two/3"], &["not a whole number"]),
        (
            &[
                ("SLURM_ARRAY_TASK_ID", "3"),
                ("SLURM_ARRAY_TASK_COUNT", "3"),
            ],
            &[],
            &["SLURM_ARRAY_TASK_MIN"],
        ),
        (
            &[
                ("SLURM_ARRAY_TASK_ID", "2"),
                ("SLURM_ARRAY_TASK_MIN", "1"),
                ("SLURM_ARRAY_TASK_MAX", "7"),
                ("SLURM_ARRAY_TASK_COUNT", "3"),
            ],
            &[],
            &["uniform array", "--shard i/N"],
        ),
        (
            &[("JOB_COMPLETION_INDEX", "1")],
            &[],
            &["HVLAB_SHARD_COUNT", "spec.completions"],
        ),
        (
            &[("JOB_COMPLETION_INDEX", "5"), ("HVLAB_SHARD_COUNT", "5")],
            &[],
            &["JOB_COMPLETION_INDEX", "0 to 4"],
        ),
        (
            &[("JOB_COMPLETION_INDEX", "0"), ("SLURM_ARRAY_TASK_ID", "0")],
            &[],
            &["both"],
        ),
    ];
    for (vars, extra, needles) in cases {
        for command in [
            &["suite", "--plan"][..],
            &[
                "sweep",
                "lifecycle",
                "--backend",
                "model",
                "--grid",
                "vcpus=1,2",
            ][..],
        ] {
            let mut args = command.to_vec();
            args.extend(*extra);
            let out = hvlab_env(vars, &args, &db);
            assert_exit(&out, 2, needles);
        }
    }
    // Nothing was stored by a refused sweep.
    assert!(
        !db.exists() || {
            let out = common::run(&db, &["runs", "--json"]);
            json(&out)["runs"].as_array().is_none_or(Vec::is_empty)
        }
    );
}

#[test]
fn three_slurm_shards_of_the_model_suite_store_what_one_unsharded_suite_stores() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report");
    let args = |extra: &'static [&'static str]| {
        let mut a = vec![
            "suite",
            "--backend",
            "model",
            "--profile",
            "pvm-epyc",
            "--reps",
            "4",
            "--warmup",
            "0",
            "--json",
            "--report",
            report.to_str().unwrap(),
        ];
        a.extend(extra);
        a
    };
    let whole_db = dir.path().join("whole.db");
    let whole = json(&hvlab_env(&[], &args(&[]), &whole_db));
    assert_eq!(whole["shard"], "1/1");
    let mut sharded = BTreeMap::new();
    for id in ["5", "6", "7"] {
        // --array=5-7: ids need not start at 0 or 1.
        let db = dir.path().join(format!("shard-{id}.db"));
        let out = json(&hvlab_env(
            &[
                ("SLURM_ARRAY_TASK_ID", id),
                ("SLURM_ARRAY_TASK_MIN", "5"),
                ("SLURM_ARRAY_TASK_MAX", "7"),
                ("SLURM_ARRAY_TASK_COUNT", "3"),
            ],
            &args(&[]),
            &db,
        ));
        let ran: Vec<&str> = out["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["scenario"].as_str().unwrap())
            .collect();
        assert_eq!(out["units"].as_array().unwrap().len(), ran.len(), "{out}");
        for (k, v) in common::contents_by_unit(&db) {
            assert!(
                sharded.insert(k.clone(), v).is_none(),
                "{k} ran in two shards"
            );
        }
    }
    let whole = common::contents_by_unit(&whole_db);
    assert_eq!(
        whole.len(),
        14,
        "every model scenario and showcase: {:?}",
        whole.keys()
    );
    assert_eq!(
        sharded.keys().collect::<Vec<_>>(),
        whole.keys().collect::<Vec<_>>()
    );
    for (k, w) in &whole {
        assert_eq!(
            &sharded[k], w,
            "{k} differs between the sharded and the whole suite"
        );
    }
}

#[test]
fn a_kubernetes_pod_runs_its_slice_of_a_sweep() {
    let (_dir, db) = common::db();
    let grid = [
        "sweep",
        "lifecycle",
        "--backend",
        "model",
        "--profile",
        "pvm-epyc",
        "--grid",
        "vcpus=1,2,3,4,5,6,7",
        "--variant",
        "memslots-first",
        "--reps",
        "3",
        "--warmup",
        "0",
        "--json",
    ];
    let mut stored = Vec::new();
    for index in ["0", "1", "2"] {
        let out = json(&hvlab_env(
            &[("JOB_COMPLETION_INDEX", index), ("HVLAB_SHARD_COUNT", "3")],
            &grid,
            &db,
        ));
        let units: Vec<&str> = out["sweep"]["units"]
            .as_array()
            .unwrap()
            .iter()
            .map(|u| u.as_str().unwrap())
            .collect();
        let expected: Vec<String> = match index {
            "0" => vec![1, 4, 7],
            "1" => vec![2, 5],
            _ => vec![3, 6],
        }
        .into_iter()
        .map(|v| format!("lifecycle/model/vcpus={v}"))
        .collect();
        assert_eq!(units, expected, "pod {index}");
        assert_eq!(out["sweep"]["ran"], expected.len());
        stored.extend(
            out["runs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap().to_string()),
        );
    }
    // The pods' runs are one sweep: the same id, every point once.
    let mut points = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for run in &stored {
        let rec = json(&common::run(&db, &["show", run, "--json"]));
        ids.insert(rec["params"]["sweep"].as_str().unwrap().to_string());
        points.push(rec["params"]["vcpus"].as_u64().unwrap());
    }
    points.sort_unstable();
    assert_eq!(points, vec![1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(ids.len(), 1, "{ids:?}");
}

#[test]
fn slurm_array_task_max_of_u64_max_is_refused_naming_that_variable() {
    let (_dir, db) = common::db();
    let out = hvlab_env(
        &[
            ("SLURM_ARRAY_TASK_ID", "0"),
            ("SLURM_ARRAY_TASK_MIN", "0"),
            ("SLURM_ARRAY_TASK_MAX", "18446744073709551615"),
        ],
        &["suite", "--plan"],
        &db,
    );
    assert_exit(
        &out,
        2,
        &["SLURM_ARRAY_TASK_MAX", "18446744073709551616 tasks"],
    );
    assert!(!common::stderr(&out).contains("SLURM_ARRAY_TASK_COUNT"));
}

#[test]
fn a_suite_shard_without_access_to_dev_kvm_fails_with_exit_3_and_keeps_the_hosts_flavour() {
    let test = "a_suite_shard_without_access_to_dev_kvm_fails_with_exit_3";
    if !common::tool_or_skip(test, "setpriv") {
        return;
    }
    let Some(_turn) = common::kvm_or_skip(test) else {
        return;
    };
    let device = hvlab_host::probe::kvm_device_path();
    let nobody_can_open = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "test",
            "-r",
        ])
        .arg(&device)
        .arg("-a")
        .arg("-w")
        .arg(&device)
        .status()
        .is_ok_and(|s| s.success());
    if nobody_can_open {
        common::loud_skip(&format!(
            "{test}: nobody may open {} here, so no shard lacks access",
            device.display()
        ));
        return;
    }
    let as_nobody = |args: &[&str], dir: &Path| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_hvlab"))
            .args(args)
            .env("XDG_DATA_HOME", dir)
            .env("HOME", dir)
            .current_dir(dir)
            .output()
            .unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    // Shard 1 of 4 has kvm and model units (the plan says which).
    let planned = plan(&[], &["--shard", "1/4"]);
    let kvm_units = units(&planned)
        .iter()
        .filter(|u| u.split('/').nth(2) == Some("kvm"))
        .count();
    assert!(kvm_units > 0, "{planned}");
    let db = dir.path().join("shard.db");
    let report = dir.path().join("report");
    let out = as_nobody(
        &[
            "suite",
            "--shard",
            "1/4",
            "--reps",
            "3",
            "--warmup",
            "0",
            "--db",
            db.to_str().unwrap(),
            "--report",
            report.to_str().unwrap(),
        ],
        dir.path(),
    );
    assert_exit(&out, 3, &["kvm unit(s) and could run none"]);
    // The fingerprint is the node's, whoever asks: root and nobody see one flavour.
    let root = json(&common::hvlab().args(["host", "--json"]).output().unwrap());
    let nobody = as_nobody(&["host", "--json"], dir.path());
    let nobody: Value = serde_json::from_slice(&nobody.stdout).unwrap();
    assert_eq!(nobody["kvm_flavour"], root["kvm_flavour"]);
    assert_ne!(nobody["kvm_flavour"], "none");
}
