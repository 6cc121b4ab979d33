//! The Slurm example on a real single-node Slurm (Debian's slurm-wlm and munge, started here
//! in a private configuration and always stopped): submitted as its header says, the array's
//! shards merged into one store hold the same units as one unsharded suite, a second merge
//! stores nothing, every log is in the output directory, and an array whose tasks fail
//! (hvlab not on PATH) gets its merge job cancelled instead of pending forever.
#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use crate::common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/slurm/hvlab-suite.sbatch"
);

/// The per-patch example: a series' commits as the array's units.
const PER_PATCH_SCRIPT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/examples/slurm/hvlab-per-patch.sbatch"
);

/// The suite the array runs: the model, few repetitions, so the whole test takes about a
/// minute.
const SUITE_ARGS: &str = "--backend model --profile pvm-epyc --reps 3 --warmup 0";

/// What a program of the cluster needs to find it: its configuration (and through it munge's
/// socket), and no Slurm job of the caller's.
fn slurm_env<'a>(c: &'a mut Command, conf: &Path) -> &'a mut Command {
    for k in hvlab::lab::shard::VARIABLES {
        c.env_remove(k);
    }
    for k in ["SLURM_JOB_ID", "SLURM_JOBID", "SBATCH_ARRAY_INX"] {
        c.env_remove(k);
    }
    c.env("SLURM_CONF", conf)
}

/// A one-node Slurm cluster whose daemons are this test's children. Dropping it (also when
/// the test fails) cancels its jobs, stops slurmd, slurmctld and munged, ends any job process
/// left over (found by this cluster's own `SLURM_CONF` in its environment) and removes its
/// state, spool, key and logs with the temporary directory.
struct Cluster {
    conf: PathBuf,
    daemons: Vec<(&'static str, Child)>,
    dir: tempfile::TempDir,
}

impl Cluster {
    fn start() -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("hvlab-slurm")
            .tempdir()
            .unwrap();
        let root = dir.path().to_path_buf();
        // munged refuses a socket under a directory that others cannot enter, and a key
        // that others can read.
        chmod(&root, 0o755);
        for d in ["key", "sock", "state", "spool", "log"] {
            std::fs::create_dir(root.join(d)).unwrap();
        }
        chmod(&root.join("key"), 0o700);
        let conf = root.join("slurm.conf");
        let mut cluster = Cluster {
            conf: conf.clone(),
            daemons: Vec::new(),
            dir,
        };
        let key = root.join("key/munge.key");
        let made = Command::new("mungekey")
            .args(["--create", "--keyfile"])
            .arg(&key)
            .output()
            .unwrap();
        assert!(made.status.success(), "mungekey: {made:?}");
        let socket = root.join("sock/munge.socket");
        let munged = Command::new("munged")
            .arg("--foreground")
            .arg(format!("--key-file={}", key.display()))
            .arg(format!("--socket={}", socket.display()))
            .arg(format!(
                "--pid-file={}",
                root.join("sock/munged.pid").display()
            ))
            .arg(format!(
                "--seed-file={}",
                root.join("key/munged.seed").display()
            ))
            .arg(format!(
                "--log-file={}",
                root.join("log/munged.log").display()
            ))
            .stdout(log(&root, "munged.out"))
            .stderr(log(&root, "munged.out"))
            .spawn()
            .unwrap();
        cluster.daemons.push(("munged", munged));
        cluster.wait_for("munged's socket", Duration::from_secs(15), || {
            socket.exists()
        });

        let (cpus, memory) = this_node();
        let [ctld_port, node_port] = free_ports();
        let r = root.display();
        std::fs::write(
            &conf,
            format!(
                "# hvlab's tests/slurm_cluster.rs: one node, everything under {r}
ClusterName=hvlabtest
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmdPort={node_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket}
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/state/slurmctld.pid
SlurmdPidFile={r}/spool/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
",
                socket = socket.display()
            ),
        )
        .unwrap();
        let ctld = Command::new("slurmctld")
            .arg("-D")
            .arg("-f")
            .arg(&conf)
            .env("SLURM_CONF", &conf)
            .stdout(log(&root, "slurmctld.out"))
            .stderr(log(&root, "slurmctld.out"))
            .spawn()
            .unwrap();
        cluster.daemons.push(("slurmctld", ctld));
        let conf2 = conf.clone();
        cluster.wait_for("slurmctld to answer", Duration::from_secs(30), || {
            slurm(&conf2, "scontrol", &["ping"]).is_ok_and(|out| out.contains("is UP"))
        });
        let slurmd = Command::new("slurmd")
            .args(["-D", "-N", "localhost", "-f"])
            .arg(&conf)
            .env("SLURM_CONF", &conf)
            .stdout(log(&root, "slurmd.out"))
            .stderr(log(&root, "slurmd.out"))
            .spawn()
            .unwrap();
        cluster.daemons.push(("slurmd", slurmd));
        cluster.wait_for("the node to be idle", Duration::from_secs(30), || {
            slurm(&conf2, "sinfo", &["-h", "-N", "-o", "%T"]).is_ok_and(|s| s.trim() == "idle")
        });
        cluster
    }

    /// Polls `ready` every 200 ms until `deadline`; on time out, fails with the daemons'
    /// logs (the guard still stops them).
    fn wait_for(&mut self, what: &str, deadline: Duration, mut ready: impl FnMut() -> bool) {
        let start = Instant::now();
        while !ready() {
            if let Some(gone) = self.exited() {
                panic!("{gone} while waiting for {what}:\n{}", self.logs());
            }
            assert!(
                start.elapsed() < deadline,
                "no {what} within {deadline:?}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// `NAME exited (STATUS)` for a daemon that is gone.
    fn exited(&mut self) -> Option<String> {
        self.daemons
            .iter_mut()
            .find_map(|(name, child)| match child.try_wait() {
                Ok(Some(status)) => Some(format!("{name} exited ({status})")),
                _ => None,
            })
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["munged.out", "slurmctld.out", "slurmd.out"] {
            let text =
                std::fs::read_to_string(self.dir.path().join("log").join(name)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            out.push_str(&format!("--- {name} (last lines)\n"));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    /// `bash SCRIPT` from `submit_dir`, as the script's header says; returns the array job's
    /// and the merge job's ids.
    fn submit(&self, script: &str, submit_dir: &Path, vars: &[(&str, &str)]) -> (String, String) {
        let mut c = Command::new("bash");
        slurm_env(&mut c, &self.conf)
            .arg(script)
            .envs(vars.iter().copied())
            .current_dir(submit_dir);
        let out = c.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "submitting: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        // "array job N, merge job M; results in ..."
        let id_after = |label: &str| -> String {
            text.split(label)
                .nth(1)
                .and_then(|rest| rest.split([',', ';']).next())
                .map(|id| id.trim().to_string())
                .unwrap_or_else(|| panic!("no `{label}` in: {text}"))
        };
        (id_after("array job "), id_after("merge job "))
    }

    /// The state of every job of `id` (each task of an array), with its reason.
    fn states(&self, id: &str) -> Vec<(String, String)> {
        let text = slurm(&self.conf, "scontrol", &["-o", "show", "job", id]).unwrap();
        text.lines()
            .map(|line| {
                let field = |name: &str| {
                    line.split_whitespace()
                        .find_map(|w| w.strip_prefix(name))
                        .unwrap_or("")
                        .to_string()
                };
                (field("JobState="), field("Reason="))
            })
            .collect()
    }

    /// Waits until every job of `ids` has ended, for at most `deadline`; fails naming the
    /// jobs still pending or running, with the queue.
    fn wait_ended(&mut self, ids: &[&str], deadline: Duration) {
        let conf = self.conf.clone();
        let ended = |id: &str| {
            let text = slurm(&conf, "scontrol", &["-o", "show", "job", id]).unwrap_or_default();
            !text.is_empty()
                && text.lines().all(|l| {
                    [
                        "COMPLETED",
                        "FAILED",
                        "CANCELLED",
                        "TIMEOUT",
                        "OUT_OF_MEMORY",
                        "NODE_FAIL",
                    ]
                    .iter()
                    .any(|s| l.contains(&format!("JobState={s} ")))
                })
        };
        let what = format!("end of jobs {ids:?}");
        let start = Instant::now();
        while !ids.iter().all(|id| ended(id)) {
            assert!(
                start.elapsed() < deadline,
                "{what}: not within {deadline:?}; queue:\n{}\n{}",
                slurm(&conf, "squeue", &["-t", "all"]).unwrap_or_default(),
                self.logs()
            );
            if let Some(gone) = self.exited() {
                panic!("{gone} during the jobs:\n{}", self.logs());
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Jobs first, so no slurmstepd is left to run them without a slurmd.
        if let Ok(queue) = slurm(&self.conf, "squeue", &["-h", "-o", "%A"]) {
            let ids: Vec<&str> = queue.split_whitespace().collect();
            if !ids.is_empty() {
                let _ = slurm(&self.conf, "scancel", &ids);
                let start = Instant::now();
                while start.elapsed() < Duration::from_secs(10)
                    && slurm(&self.conf, "squeue", &["-h"]).is_ok_and(|q| !q.trim().is_empty())
                {
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        // Then the daemons, the node before its controller, munge last; each gets SIGTERM
        // and 10 s before SIGKILL.
        for (_, child) in self.daemons.iter_mut().rev() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let start = Instant::now();
            while matches!(child.try_wait(), Ok(None)) && start.elapsed() < Duration::from_secs(10)
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        // A job step that outlived slurmd (slurmstepd and what it ran) still carries this
        // cluster's configuration path in its environment: end exactly those.
        for pid in processes_with_env(&format!("SLURM_CONF={}", self.conf.display())) {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
        }
        // The temporary directory (state, spool, key, socket, logs) goes with `self.dir`.
    }
}

/// Pids of processes whose environment holds exactly `entry`.
fn processes_with_env(entry: &str) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let own = std::process::id().to_string();
    dir.filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|p| p.bytes().all(|b| b.is_ascii_digit()) && *p != own)
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|e| e == entry.as_bytes()))
        })
        .collect()
}

/// A Slurm client command against the cluster of `conf`: its stdout, or its stderr as the
/// error.
fn slurm(conf: &Path, program: &str, args: &[&str]) -> Result<String, String> {
    let mut c = Command::new(program);
    let out = slurm_env(&mut c, conf)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn log(root: &Path, name: &str) -> std::fs::File {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(root.join("log").join(name))
        .unwrap()
}

/// This machine's CPUs and memory (MB) as slurmd itself counts them (`slurmd -C`), so the
/// node registers as configured.
fn this_node() -> (u32, u64) {
    let out = Command::new("slurmd").arg("-C").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> String {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .unwrap_or_else(|| panic!("slurmd -C says no {name}: {text}"))
            .to_string()
    };
    (
        field("CPUs=").parse().unwrap(),
        field("RealMemory=").parse().unwrap(),
    )
}

/// Two TCP ports free on this machine now, so the cluster does not take the standard ones
/// (6817, 6818) of a real Slurm here.
fn free_ports() -> [u16; 2] {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    [
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    ]
}

/// Names of the regular files directly in `dir`.
fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn slurm_or_skip(test: &str) -> bool {
    for program in ["slurmctld", "slurmd", "sbatch", "munged", "mungekey"] {
        if !common::tool_or_skip(test, program) {
            return false;
        }
    }
    // The daemons run jobs as their user and slurmd needs root to start them.
    let uid = Command::new("id").arg("-u").output().unwrap();
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        common::loud_skip(&format!("{test}: slurmd needs root to run jobs"));
        return false;
    }
    true
}

fn assert_success(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_slurm_example_on_a_real_cluster_merges_the_whole_suite_and_cancels_a_failed_arrays_merge() {
    let test = "the_slurm_example_on_a_real_cluster";
    if !slurm_or_skip(test) {
        return;
    }
    let started = Instant::now();
    let mut cluster = Cluster::start();
    let work = tempfile::tempdir().unwrap();
    let (submit_dir, out, failed_out) = (
        work.path().join("submit"),
        work.path().join("out"),
        work.path().join("failed"),
    );
    for d in [&submit_dir, &out, &failed_out] {
        std::fs::create_dir(d).unwrap();
    }

    // The array and its merge, submitted from a login shell as docs/commands.md ("Sweeps and
    // shards") says.
    let hvlab = env!("CARGO_BIN_EXE_hvlab");
    let (array, merge) = cluster.submit(
        SCRIPT,
        &submit_dir,
        &[
            ("HVLAB", hvlab),
            ("HVLAB_OUT", out.to_str().unwrap()),
            ("HVLAB_SUITE_ARGS", SUITE_ARGS),
        ],
    );
    // Meanwhile, the same suite unsharded: what the merged store must equal.
    let whole_db = work.path().join("whole.db");
    let mut args: Vec<&str> = vec!["suite"];
    args.extend(SUITE_ARGS.split_whitespace());
    let mut whole = common::hvlab();
    for k in hvlab::lab::shard::VARIABLES {
        whole.env_remove(k);
    }
    let whole = whole
        .args(&args)
        .arg("--db")
        .arg(&whole_db)
        .arg("--report")
        .arg(work.path().join("whole-report"))
        .output()
        .unwrap();
    assert_success(&whole, "the unsharded suite");
    cluster.wait_ended(&[&array, &merge], Duration::from_secs(100));
    let tasks = cluster.states(&array);
    assert_eq!(tasks.len(), 4, "the example's --array=1-4: {tasks:?}");
    for (state, reason) in &tasks {
        assert_eq!(state, "COMPLETED", "an array task: {reason}: {tasks:?}");
    }
    assert_eq!(cluster.states(&merge)[0].0, "COMPLETED");

    // Every log in the output directory, none in the submit directory.
    let logs = files(&out);
    for task in 1..=4 {
        let name = format!("hvlab-suite-{array}_{task}.out");
        assert!(logs.contains(&name), "no {name} in {logs:?}");
    }
    let merge_log = format!("merge-{merge}.out");
    assert!(logs.contains(&merge_log), "no {merge_log} in {logs:?}");
    assert!(
        files(&submit_dir).is_empty(),
        "logs left in the submit directory: {:?}",
        files(&submit_dir)
    );
    let merge_text = std::fs::read_to_string(out.join(&merge_log)).unwrap();
    assert!(merge_text.contains("merged into"), "{merge_text}");

    // The merged store holds exactly the unsharded suite's units, with the same content.
    let suite_db = out.join(format!("suite-{array}.db"));
    let merged = common::contents_by_unit(&suite_db);
    let reference = common::contents_by_unit(&whole_db);
    assert_eq!(
        merged.keys().collect::<Vec<_>>(),
        reference.keys().collect::<Vec<_>>(),
        "the merged units are not the unsharded suite's"
    );
    for (unit, content) in &reference {
        assert_eq!(&merged[unit], content, "{unit} differs after sharding");
    }
    assert!(
        out.join(format!("report-{array}/index.html")).exists(),
        "the merge job wrote no report"
    );

    // A second merge of the same shards stores nothing.
    let before = common::runs_by_id(&suite_db);
    let mut again = common::hvlab();
    again.arg("merge");
    let mut shards: Vec<PathBuf> = files(&out)
        .into_iter()
        .filter(|f| f.starts_with(&format!("shard-{array}-")) && f.ends_with(".db"))
        .map(|f| out.join(f))
        .collect();
    shards.sort();
    assert_eq!(shards.len(), 4, "one shard file per task: {shards:?}");
    let again = again
        .args(&shards)
        .arg("--db")
        .arg(&suite_db)
        .output()
        .unwrap();
    assert_success(&again, "the second merge");
    let said = String::from_utf8_lossy(&again.stdout);
    let total = said
        .lines()
        .find(|l| l.starts_with("merged into"))
        .unwrap_or_else(|| panic!("{said}"));
    assert!(total.contains(": 0 stored,"), "{total}");
    assert_eq!(common::runs_by_id(&suite_db), before);

    // An array whose tasks cannot find hvlab: the merge job is cancelled, not left pending.
    let (array, merge) = cluster.submit(
        SCRIPT,
        &submit_dir,
        &[
            ("HVLAB_OUT", failed_out.to_str().unwrap()),
            ("HVLAB_SUITE_ARGS", SUITE_ARGS),
            ("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        ],
    );
    cluster.wait_ended(&[&array, &merge], Duration::from_secs(60));
    let tasks: BTreeMap<String, usize> =
        cluster
            .states(&array)
            .into_iter()
            .fold(BTreeMap::new(), |mut m, (state, _)| {
                *m.entry(state).or_default() += 1;
                m
            });
    assert_eq!(tasks.get("FAILED"), Some(&4), "{tasks:?}");
    let merge_state = cluster.states(&merge);
    assert_eq!(
        merge_state[0],
        (
            "CANCELLED".to_string(),
            "DependencyNeverSatisfied".to_string()
        ),
        "the merge of a failed array"
    );
    let task_log =
        std::fs::read_to_string(failed_out.join(format!("hvlab-suite-{array}_1.out"))).unwrap();
    assert!(task_log.contains("hvlab: command not found"), "{task_log}");
    assert!(
        !failed_out.join(format!("suite-{array}.db")).exists(),
        "a merge ran"
    );
    drop(cluster);
    eprintln!(
        "{test}: {:.1} s including the cluster's start and stop",
        started.elapsed().as_secs_f64()
    );
}

/// The per-patch example on the same real cluster: a four-patch mbox series on Debian's 7.3,
/// two array tasks of two commits each, merged and judged from the store as one table that
/// names the regressing and the fixing patch. Each task boots its two commits and their parents
/// twice under QEMU TCG, one task after the other (--exclusive on the one node).
#[test]
#[ignore = "builds Debian 7.3's KVM modules and boots the base and four prefixes twice each under QEMU TCG (about 4 minutes warm); run with --ignored on a quiet host, HVLAB_SVM_TCG set"]
fn a_series_per_patch_sharded_over_a_slurm_array_merges_into_one_table() {
    let test = "a_series_per_patch_sharded_over_a_slurm_array";
    if !slurm_or_skip(test) || !common::tool_or_skip(test, "qemu-system-x86_64") {
        return;
    }
    let started = Instant::now();
    let mut cluster = Cluster::start();
    let work = tempfile::tempdir().unwrap();
    let (submit_dir, out) = (work.path().join("submit"), work.path().join("out"));
    for d in [&submit_dir, &out] {
        std::fs::create_dir(d).unwrap();
    }
    let series = format!(
        "debian:7.3+{}/tests/patches/series-v1.mbox",
        env!("CARGO_MANIFEST_DIR")
    );
    let (array, merge) = cluster.submit(
        PER_PATCH_SCRIPT,
        &submit_dir,
        &[
            ("HVLAB", env!("CARGO_BIN_EXE_hvlab")),
            ("HVLAB_OUT", out.to_str().unwrap()),
            ("HVLAB_BASE", "debian:7.3"),
            ("HVLAB_SERIES", &series),
            (
                "HVLAB_KAB_ARGS",
                "--scenario lifecycle --variant irqchip-first",
            ),
        ],
    );
    cluster.wait_ended(&[&array, &merge], Duration::from_secs(1200));
    let tasks = cluster.states(&array);
    assert_eq!(tasks.len(), 2, "the example's --array=1-2: {tasks:?}");
    let logs = |name: &str| std::fs::read_to_string(out.join(name)).unwrap_or_default();
    for (task, (state, reason)) in tasks.iter().enumerate() {
        let log = logs(&format!("hvlab-per-patch-{array}_{}.out", task + 1));
        assert_eq!(
            state,
            "COMPLETED",
            "array task {}: {reason}: {log}",
            task + 1
        );
        assert!(log.contains(&format!("shard {}/2", task + 1)), "{log}");
    }
    assert_eq!(
        cluster.states(&merge)[0].0,
        "COMPLETED",
        "{}",
        logs(&format!("merge-{merge}.out"))
    );
    let text = logs(&format!("series-{array}.txt"));
    let v: serde_json::Value =
        serde_json::from_str(&logs(&format!("series-{array}.json"))).unwrap();
    // The merged table has every commit, each judged against its parent booted by the same task.
    let commits = v["commits"].as_array().unwrap();
    assert_eq!(commits.len(), 4, "{text}");
    let class = |i: usize| commits[i]["variants"][0]["vs_parent"]["class"].clone();
    let mut busy = false;
    for i in 0..4 {
        busy |= class(i) == "NOT DECIDED";
    }
    if busy {
        common::loud_skip(&format!(
            "{test}: a commit was NOT DECIDED (the host was busy during its boots): {text}"
        ));
        return;
    }
    assert_eq!(class(0), "NO CHANGE", "{text}");
    assert_eq!(class(1), "REGRESSED", "{text}");
    assert_eq!(class(2), "NO CHANGE", "{text}");
    // The fix does not undo patch 2's normal grace period on the instruction clock (TCG's
    // default, which the tasks use): see kernel_vm's per-patch test.
    assert_eq!(class(3), "NO CHANGE", "{text}");
    assert!(
        text.starts_with("[PATCH 2/4] REGRESSED irqchip-first"),
        "{text}"
    );
    assert!(out.join(format!("series-{array}.md")).exists());
    drop(cluster);
    eprintln!(
        "{test}: {:.1} s including the cluster's start and stop\n{text}",
        started.elapsed().as_secs_f64()
    );
}
