//! The limits a kernel build runs under: wall time, the disk space it adds, and its processes.
//! A patch's Makefiles run during the build (`$(shell ...)`), so a hostile one could sleep
//! forever, fill the disk or fork without end. Each limit has a default per kind of build (a
//! generous multiple of what the build measured here), a flag, and is named when hit; the
//! build is then ended with everything it started.
//!
//! How each is held:
//! - wall time: the loop that waits for the build ([`super::sandbox::run_to_end`]) ends it;
//! - disk: `RLIMIT_FSIZE` caps every file it writes at the limit (with `SIGXFSZ` ignored, so an
//!   over-long write fails with "File too large" and the log names the file), and the loop
//!   measures its writable directories every second and ends it once they grew past the limit;
//! - processes: a pids cgroup of its own where hvlab can make one (cgroup v2, or v1's pids
//!   hierarchy), else `RLIMIT_NPROC` set inside the sandbox's user namespace (`prlimit`), so
//!   only the build's own processes count; root is exempt from `RLIMIT_NPROC`, so as root
//!   without a writable pids cgroup the limit is not enforced, and the build's record says so.
//!   A cgroup also lets hvlab end every process of the build, even one that left its session.

use std::ffi::OsString;
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::which;

/// What a build is, for its default limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildKind {
    /// Preparing Debian's config and `make M=DIR` of its modules.
    Modules,
    /// A whole kernel (its config and `make bzImage modules`).
    Whole,
}

/// What one `make` of a build may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BuildLimits {
    /// Wall time.
    pub wall: Duration,
    /// Bytes its output and temporary directories may grow by (and the size of any one file).
    pub disk_bytes: u64,
    /// Processes (and threads) alive at once.
    pub processes: u32,
}

const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;

impl BuildKind {
    /// The defaults: about ten times what each build took here (2 cores).
    pub fn defaults(self) -> BuildLimits {
        match self {
            // Debian 7.3's KVM modules: 45–75 s from cold, modules_prepare about 90 s; the
            // prepared tree takes 31 MB, the modules' output 19 MB.
            BuildKind::Modules => BuildLimits {
                wall: Duration::from_secs(10 * 60),
                disk_bytes: GIB,
                processes: 512,
            },
            // The minimal guest kernel: 2 min 47 s from cold, about 200 MB of output.
            BuildKind::Whole => BuildLimits {
                wall: Duration::from_secs(30 * 60),
                disk_bytes: 4 * GIB,
                processes: 512,
            },
        }
    }
}

/// The limits given on the command line (`--build-timeout`, `--build-disk`,
/// `--build-procs`); each one not given is the build kind's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimitOverrides {
    /// `--build-timeout`.
    pub wall: Option<Duration>,
    /// `--build-disk`.
    pub disk_bytes: Option<u64>,
    /// `--build-procs`.
    pub processes: Option<u32>,
}

impl LimitOverrides {
    /// The limits of a build of `kind`.
    pub fn of(&self, kind: BuildKind) -> BuildLimits {
        let d = kind.defaults();
        BuildLimits {
            wall: self.wall.unwrap_or(d.wall),
            disk_bytes: self.disk_bytes.unwrap_or(d.disk_bytes),
            processes: self.processes.unwrap_or(d.processes),
        }
    }
}

/// How a build's processes are counted and capped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProcessCap {
    /// A pids cgroup of its own (cgroup v1's pids hierarchy).
    PidsCgroupV1,
    /// A pids cgroup of its own (cgroup v2).
    PidsCgroupV2,
    /// `RLIMIT_NPROC`, set inside the sandbox's user namespace.
    RlimitNproc,
    /// Not capped: no pids cgroup can be made here, and `RLIMIT_NPROC` does not hold root (or
    /// there is no sandbox to set it in).
    Unenforced,
}

/// A limit a build reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitHit {
    /// It ran longer than this.
    WallTime {
        /// The limit.
        limit: Duration,
    },
    /// It wrote more than this: in one file (named when its log says which), or in all.
    Disk {
        /// The limit in bytes.
        limit: u64,
        /// The file a write into failed with "File too large".
        file: Option<PathBuf>,
    },
    /// It tried to have more processes than this alive at once.
    Processes {
        /// The limit.
        limit: u32,
        /// How it was held.
        cap: ProcessCap,
    },
}

/// Watches one command of a build against its limits: set up before it starts
/// ([`Self::prepare`]), checked while it runs ([`Self::check`]), and closed when it ends
/// ([`Self::finish`]), which ends whatever of it is left.
#[derive(Debug)]
pub struct Guard {
    limits: Option<BuildLimits>,
    watched: Vec<PathBuf>,
    baseline: u64,
    start: Instant,
    last_disk: Instant,
    cgroup: Option<Cgroup>,
    cap: ProcessCap,
}

/// How often the writable directories are measured.
const DISK_EVERY: Duration = Duration::from_secs(1);

impl Guard {
    /// No limits: tools and tests that run a command the way builds do.
    pub fn unlimited() -> Guard {
        Guard {
            limits: None,
            watched: Vec::new(),
            baseline: 0,
            start: Instant::now(),
            last_disk: Instant::now(),
            cgroup: None,
            cap: ProcessCap::Unenforced,
        }
    }

    /// A guard for a command held to `limits`, whose writes land in `watched` (their size
    /// now is the baseline it may grow from). `sandboxed`: it runs in bubblewrap, where
    /// `RLIMIT_NPROC` can be set inside its own user namespace.
    pub fn new(limits: BuildLimits, watched: &[&Path], sandboxed: bool) -> Guard {
        let watched: Vec<PathBuf> = watched.iter().map(|p| p.to_path_buf()).collect();
        let baseline = super::cache::usage::bytes(&watched);
        let (cgroup, cap) = match Cgroup::create(limits.processes) {
            Some(cg) => {
                let cap = cg.cap();
                (Some(cg), cap)
            }
            None if sandboxed && !is_root() && which("prlimit").is_some() => {
                (None, ProcessCap::RlimitNproc)
            }
            None => (None, ProcessCap::Unenforced),
        };
        Guard {
            limits: Some(limits),
            watched,
            baseline,
            start: Instant::now(),
            last_disk: Instant::now(),
            cgroup,
            cap,
        }
    }

    /// How the process limit is held.
    pub fn cap(&self) -> ProcessCap {
        self.cap
    }

    /// The words to run the program through inside the sandbox, when the process limit is
    /// `RLIMIT_NPROC` (`prlimit --nproc=N:N --`): set there, in the sandbox's user namespace,
    /// it counts the build's processes alone, not every process of the user.
    pub fn wrapper(&self) -> Vec<OsString> {
        match (self.cap, self.limits) {
            (ProcessCap::RlimitNproc, Some(l)) => vec![
                "prlimit".into(),
                format!("--nproc={0}:{0}", l.processes).into(),
                "--".into(),
            ],
            _ => Vec::new(),
        }
    }

    /// Sets the file size limit and the cgroup of `cmd`'s child, between fork and exec.
    pub fn prepare(&self, cmd: &mut Command) {
        if let Some(l) = self.limits {
            crate::sys::limit_child(
                cmd,
                l.disk_bytes,
                self.cgroup.as_ref().map(|c| c.procs.as_raw_fd()),
            );
        }
    }

    /// After the spawn: a child the cgroup did not take (hvlab may not move processes into
    /// it) runs without that cap, and the guard says so.
    pub fn started(&mut self, pid: i32) {
        if let Some(cg) = &self.cgroup
            && !cg.pids().contains(&pid)
        {
            self.cgroup = None;
            self.cap = ProcessCap::Unenforced;
        }
    }

    /// A limit reached so far: the wall time, the process limit (a fork refused), or the
    /// disk (measured at most every second).
    pub fn check(&mut self) -> Option<LimitHit> {
        let limits = self.limits?;
        if self.start.elapsed() > limits.wall {
            return Some(LimitHit::WallTime { limit: limits.wall });
        }
        if let Some(hit) = self.process_hit() {
            return Some(hit);
        }
        if self.last_disk.elapsed() >= DISK_EVERY {
            self.last_disk = Instant::now();
            return self.disk_hit(None);
        }
        None
    }

    /// After the command ended: every process of it still alive is killed, and the limit it
    /// reached, if any: a refused fork, a file that grew too large (`too_large`: the log said
    /// so, naming the file when it could), or the directories grown past the limit.
    pub fn finish(&mut self, too_large: Option<Option<PathBuf>>) -> Option<LimitHit> {
        let limits = self.limits?;
        if let Some(cg) = &self.cgroup {
            cg.kill_all();
        }
        if let Some(hit) = self.process_hit() {
            return Some(hit);
        }
        if let Some(file) = too_large {
            return Some(LimitHit::Disk {
                limit: limits.disk_bytes,
                file,
            });
        }
        self.disk_hit(None)
    }

    fn process_hit(&self) -> Option<LimitHit> {
        let limits = self.limits?;
        let cg = self.cgroup.as_ref()?;
        cg.refused_forks().then_some(LimitHit::Processes {
            limit: limits.processes,
            cap: self.cap,
        })
    }

    fn disk_hit(&self, file: Option<PathBuf>) -> Option<LimitHit> {
        let limits = self.limits?;
        let now = super::cache::usage::bytes(&self.watched);
        (now.saturating_sub(self.baseline) >= limits.disk_bytes).then_some(LimitHit::Disk {
            limit: limits.disk_bytes,
            file,
        })
    }
}

/// How a build's processes are capped on this host (a cgroup is made and removed to find
/// out); `sandboxed`: the build runs in bubblewrap.
pub fn process_cap_here(sandboxed: bool) -> ProcessCap {
    Guard::new(BuildKind::Modules.defaults(), &[], sandboxed).cap()
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A pids cgroup of one command of a build: made before it starts, every process of it
/// ended and the group removed when dropped.
#[derive(Debug)]
struct Cgroup {
    dir: PathBuf,
    version: u8,
    /// Its `cgroup.procs`, open for the child to write itself into before exec.
    procs: File,
}

/// Names the cgroups of one hvlab apart.
static NEXT_CGROUP: AtomicU32 = AtomicU32::new(0);

/// The prefix of a build cgroup's name, before hvlab's pid.
const CGROUP_PREFIX: &str = "hvlab-build-";

impl Cgroup {
    /// A pids cgroup capped at `max`, beside or below this process's own: `None` when none can
    /// be made here (no pids controller, or no right to make one).
    fn create(max: u32) -> Option<Cgroup> {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
        let n = NEXT_CGROUP.fetch_add(1, Ordering::Relaxed);
        let name = format!("{CGROUP_PREFIX}{}-{n}", std::process::id());
        for (version, parent) in pids_parents(&mounts, &own) {
            sweep_stale(&parent);
            let dir = parent.join(&name);
            if std::fs::create_dir(&dir).is_err() {
                continue;
            }
            let made = std::fs::write(dir.join("pids.max"), max.to_string())
                .and_then(|()| {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(dir.join("cgroup.procs"))
                })
                .map(|procs| Cgroup {
                    dir: dir.clone(),
                    version,
                    procs,
                });
            match made {
                Ok(cg) => return Some(cg),
                Err(_) => {
                    let _ = std::fs::remove_dir(&dir);
                }
            }
        }
        None
    }

    fn cap(&self) -> ProcessCap {
        if self.version == 1 {
            ProcessCap::PidsCgroupV1
        } else {
            ProcessCap::PidsCgroupV2
        }
    }

    fn pids(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Whether a fork was refused for the cap (`pids.events`: `max N`).
    fn refused_forks(&self) -> bool {
        std::fs::read_to_string(self.dir.join("pids.events"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.strip_prefix("max "))
            .any(|n| n.trim().parse::<u64>().is_ok_and(|n| n > 0))
    }

    /// Kills every process in the group until none is left (a fork in flight can add one).
    fn kill_all(&self) {
        if self.version == 2 {
            let _ = std::fs::write(self.dir.join("cgroup.kill"), "1");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let pids = self.pids();
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            for pid in pids {
                if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                    let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.kill_all();
        // A killed process leaves the group once reaped by its parent: a few tries.
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Removes the empty build cgroups of hvlabs that died (killed before they could).
fn sweep_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(CGROUP_PREFIX)
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            // Fails while a process is still in it: then it stays.
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

/// Where a build cgroup can be made, best first: below this process's v2 cgroup's nearest
/// ancestor that enables the pids controller for its children (the root, or a delegated
/// one), then in v1's pids hierarchy beside this process. From `/proc/self/mountinfo` and
/// `/proc/self/cgroup`.
fn pids_parents(mountinfo: &str, own: &str) -> Vec<(u8, PathBuf)> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split_whitespace().collect();
        let rfields: Vec<&str> = right.split_whitespace().collect();
        let (Some(root), Some(point), Some(fstype), Some(opts)) = (
            fields.get(3),
            fields.get(4),
            rfields.first(),
            rfields.get(2),
        ) else {
            continue;
        };
        let within = |path: &str| -> Option<PathBuf> {
            let rel = path.strip_prefix(root.trim_end_matches('/'))?;
            Some(Path::new(point).join(rel.trim_start_matches('/')))
        };
        match *fstype {
            "cgroup2" => {
                let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
                    continue;
                };
                let Some(mine) = within(path.trim()) else {
                    continue;
                };
                let mut dir = if path.trim() == "/" {
                    Some(mine)
                } else {
                    mine.parent().map(Path::to_path_buf)
                };
                let top = PathBuf::from(point);
                while let Some(d) = dir {
                    if !d.starts_with(&top) {
                        break;
                    }
                    if enables_pids(&d, d == top) {
                        out.insert(0, (2, d));
                        break;
                    }
                    dir = d.parent().map(Path::to_path_buf);
                }
            }
            "cgroup" if opts.split(',').any(|o| o == "pids") => {
                let path = own.lines().find_map(|l| {
                    let mut parts = l.splitn(3, ':');
                    let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
                    controllers.split(',').any(|c| c == "pids").then_some(path)
                });
                if let Some(dir) = path.and_then(|p| within(p.trim())) {
                    out.push((1, dir));
                }
            }
            _ => {}
        }
    }
    out
}

/// Whether the v2 cgroup `dir` gives its children the pids controller; the root is asked to
/// (it may have processes and children with controllers at once).
fn enables_pids(dir: &Path, is_root: bool) -> bool {
    let has = |file: &str| {
        std::fs::read_to_string(dir.join(file))
            .unwrap_or_default()
            .split_whitespace()
            .any(|c| c == "pids")
    };
    if has("cgroup.subtree_control") {
        return true;
    }
    is_root
        && has("cgroup.controllers")
        && std::fs::OpenOptions::new()
            .write(true)
            .open(dir.join("cgroup.subtree_control"))
            .and_then(|mut f| f.write_all(b"+pids"))
            .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_limits_win_and_the_rest_are_the_kinds_defaults() {
        let o = LimitOverrides {
            wall: Some(Duration::from_secs(5)),
            ..LimitOverrides::default()
        };
        let l = o.of(BuildKind::Whole);
        assert_eq!(l.wall, Duration::from_secs(5));
        assert_eq!(l.disk_bytes, BuildKind::Whole.defaults().disk_bytes);
        assert!(BuildKind::Whole.defaults().wall > BuildKind::Modules.defaults().wall);
        assert_eq!(
            LimitOverrides::default().of(BuildKind::Modules),
            BuildKind::Modules.defaults()
        );
    }

    /// A v1 pids hierarchy beside the process's own, and v2's root: the v2 root first when it
    /// already gives children the controller.
    #[test]
    fn the_pids_hierarchies_are_found_from_mountinfo_and_the_own_cgroup() {
        let mountinfo = "\
31 25 0:26 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
40 31 0:35 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:36 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
";
        let own = "8:pids:/user.slice\n4:memory:/x\n0::/\n";
        assert_eq!(
            pids_parents(mountinfo, own),
            [(1, PathBuf::from("/sys/fs/cgroup/pids/user.slice"))]
        );
        // A v2 mount whose root cannot be asked here (no such directory): not offered.
        let v2 = "50 25 0:40 / /nonexistent/cgroup rw - cgroup2 cgroup2 rw\n";
        assert!(pids_parents(v2, "0::/a/b\n").is_empty());
        // A v2 hierarchy whose ancestor delegates pids.
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("user/app")).expect("mkdir");
        std::fs::write(root.join("user/cgroup.subtree_control"), "cpu pids\n").expect("write");
        let v2 = format!("50 25 0:40 / {} rw - cgroup2 cgroup2 rw\n", root.display());
        assert_eq!(
            pids_parents(&v2, "0::/user/app\n"),
            [(2, root.join("user"))]
        );
    }
}
