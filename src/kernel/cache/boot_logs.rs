//! Boot logs (`logs/STAMP-RELEASE-PID/`: a boot's console log and what the guest sent back).
//! Each run of hvlab (one process: a `vm`, a `kab` with its boots) leaves one per boot. The
//! logs of a failed boot are kept until pruned, as evidence; those of successful boots only
//! for the last [`KEEP_RUNS`] runs: a new boot's directory is named after the older ones are
//! trimmed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::kernel::{cache_dir, now_stamp};

/// The runs whose successful boots keep their logs.
pub const KEEP_RUNS: usize = 10;

/// The directory for a boot of `release` by this hvlab (`logs/STAMP-RELEASE-PID`, made by the
/// boot), after trimming the logs of successful boots beyond the last [`KEEP_RUNS`] runs.
pub fn new_boot_log_dir(release: &str) -> PathBuf {
    let logs = cache_dir().join("logs");
    trim(&logs, KEEP_RUNS);
    logs.join(format!(
        "{}-{release}-{}",
        unique_stamp(),
        std::process::id()
    ))
}

/// The last stamp this process gave a boot log.
static LAST_STAMP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Now's stamp, or one past the last given when that is later: two boots of one release
/// started in the same second (a kab's A and B side by side) get directories of their own.
fn unique_stamp() -> u64 {
    use std::sync::atomic::Ordering::SeqCst;
    let now = now_stamp();
    // The closure never refuses: the stamp stored is the one given.
    let given = |last: u64| now.max(last + 1);
    LAST_STAMP
        .fetch_update(SeqCst, SeqCst, |last| Some(given(last)))
        .map_or(now, given)
}

/// The release in a boot log's name (`STAMP-RELEASE-PID`).
pub fn release_of(name: &str) -> Option<String> {
    let (_, rest) = name.split_once('-')?;
    let (release, _) = rest.rsplit_once('-')?;
    Some(release.to_string())
}

/// Whether `pid` is a running hvlab (this one included).
pub fn hvlab_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|comm| comm.trim().starts_with("hvlab"))
}

/// Whether the boot logged in `dir` succeeded: the guest said it sent everything, and its
/// console shows no oops.
pub fn succeeded(dir: &Path) -> bool {
    let results = std::fs::read(dir.join("results.bin")).unwrap_or_default();
    let done = results.windows(12).any(|w| w == b"@@hvlab-done");
    let console = std::fs::read(dir.join("console.log")).unwrap_or_default();
    done && crate::kernel::vm::oops_excerpt(&String::from_utf8_lossy(&console)).is_none()
}

/// Removes the logs of successful boots of every run but the last `keep` (runs told apart by
/// their pid, ordered by their first boot; a run still going is never touched). Returns what
/// it removed.
pub fn trim(logs: &Path, keep: usize) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(logs) else {
        return Vec::new();
    };
    // pid → (first stamp, its boots).
    let mut runs: BTreeMap<u32, (u64, Vec<PathBuf>)> = BTreeMap::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let stamp = name.split('-').next().and_then(|s| s.parse::<u64>().ok());
        let pid = name.rsplit('-').next().and_then(|s| s.parse::<u32>().ok());
        let (Some(stamp), Some(pid)) = (stamp, pid) else {
            continue;
        };
        let run = runs.entry(pid).or_insert((stamp, Vec::new()));
        run.0 = run.0.min(stamp);
        run.1.push(e.path());
    }
    let mut order: Vec<(u64, u32)> = runs.iter().map(|(pid, (s, _))| (*s, *pid)).collect();
    order.sort_unstable();
    let old = order.len().saturating_sub(keep);
    let mut removed = Vec::new();
    for (_, pid) in &order[..old] {
        if hvlab_alive(*pid) {
            continue;
        }
        for dir in runs.get(pid).map(|r| r.1.as_slice()).unwrap_or_default() {
            if succeeded(dir) && std::fs::remove_dir_all(dir).is_ok() {
                removed.push(dir.clone());
            }
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A boot log of `pid` at `stamp`, successful or not.
    fn boot(logs: &Path, stamp: u64, pid: u32, ok: bool) -> PathBuf {
        let dir = logs.join(format!("{stamp}-7.3.4+deb13-amd64-{pid}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let console = if ok {
            "@@hvlab-ready 1.2\n"
        } else {
            "BUG: kernel NULL pointer dereference\nKernel panic - not syncing\n"
        };
        std::fs::write(dir.join("console.log"), console).expect("write");
        std::fs::write(
            dir.join("results.bin"),
            "@@hvlab-file 1.rc 2\n0\n@@hvlab-done\n",
        )
        .expect("write");
        dir
    }

    /// Of runs by dead processes, only the last ones keep the logs of their successful boots;
    /// a failed boot's log stays, and so does every log of a run still going.
    #[test]
    fn successful_boots_keep_their_logs_for_the_last_runs_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let logs = dir.path();
        // Pids no process has (above the kernel's pid_max of 2^22).
        let dead = |n: u32| 5_000_000 + n;
        let a1 = boot(logs, 100, dead(1), true);
        let a2 = boot(logs, 101, dead(1), false);
        let b1 = boot(logs, 200, dead(2), true);
        let c1 = boot(logs, 300, dead(3), true);
        let c2 = boot(logs, 301, dead(3), true);
        let mine = boot(logs, 50, std::process::id(), true);
        assert_eq!(
            release_of("300-7.3.4+deb13-amd64-42").as_deref(),
            Some("7.3.4+deb13-amd64")
        );
        assert!(succeeded(&a1) && !succeeded(&a2));
        // Keep the last run (c): this one is older, but still going.
        let removed = trim(logs, 1);
        assert_eq!(removed.len(), 2, "{removed:?}");
        assert!(!a1.exists() && !b1.exists());
        assert!(a2.exists(), "a failed boot's log is kept");
        assert!(c1.exists() && c2.exists() && mine.exists());
        assert!(trim(logs, 1).is_empty());
    }
}
