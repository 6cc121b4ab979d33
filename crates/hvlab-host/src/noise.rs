//! The noise meter: how busy this host was while a run was measured, read from /proc and
//! sysfs like the host description (load and runnable tasks, CPU pressure (PSI), steal time),
//! and the measuring thread's involuntary context switches and migrations per repetition (two
//! reads of `/proc/thread-self` around each trial, outside the timed section). What it
//! measures is a [`Noise`], which every run stores and the busy rule reads.
//!
//! Interference control lives here too: `--cpu LIST` ([`parse_cpu_list`], [`pin_to`]) and the
//! bounded `--quiet-host` wait ([`wait_for_quiet`]).

use std::fs;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hvlab_core::noise::{Noise, QuietWait, RepNoise};
use rustix::thread::CpuSet;

/// Counters of the calling thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadCounters {
    /// Involuntary context switches (preempted: another task wanted this CPU).
    pub involuntary: u64,
    /// Voluntary context switches (the thread slept, e.g. in `KVM_RUN`'s halt or an ioctl).
    pub voluntary: u64,
    /// Migrations to another CPU (`se.nr_migrations`), where the kernel exposes it.
    pub migrations: Option<u64>,
}

impl ThreadCounters {
    /// Reads the calling thread's counters; zeros where the kernel refuses. The switches are
    /// the ones `getrusage(RUSAGE_THREAD)` reports (`nvcsw`, `nivcsw` of the task), as
    /// `/proc/thread-self/status` prints them; migrations need `/proc/thread-self/sched`
    /// (`CONFIG_SCHED_DEBUG`).
    pub fn read() -> ThreadCounters {
        let status = fs::read_to_string("/proc/thread-self/status").unwrap_or_default();
        let migrations = fs::read_to_string("/proc/thread-self/sched")
            .ok()
            .and_then(|t| field_after(&t, "se.nr_migrations"));
        ThreadCounters {
            involuntary: field_after(&status, "nonvoluntary_ctxt_switches").unwrap_or(0),
            voluntary: field_after(&status, "voluntary_ctxt_switches").unwrap_or(0),
            migrations,
        }
    }
}

/// The number after `name` and a colon in `/proc/*/sched`'s `name : value` lines.
fn field_after(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.trim_start().starts_with(name))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
}

/// A repetition's trial being watched on the measuring thread: the counters at its start.
#[derive(Debug, Clone, Copy)]
pub struct RepWatch(ThreadCounters);

impl RepWatch {
    /// Reads the calling thread's counters before the trial.
    pub fn start() -> RepWatch {
        RepWatch(ThreadCounters::read())
    }

    /// What the trial saw, read on the same thread after it.
    pub fn end(self) -> RepNoise {
        let after = ThreadCounters::read();
        let runnable_others = read_loadavg().map_or(0, |l| l.running.saturating_sub(1));
        rep_between(self.0, after, runnable_others)
    }
}

/// What happened between two readings of the measuring thread's counters.
fn rep_between(before: ThreadCounters, after: ThreadCounters, runnable_others: u32) -> RepNoise {
    RepNoise {
        involuntary: after.involuntary.saturating_sub(before.involuntary),
        migrations: after
            .migrations
            .zip(before.migrations)
            .map_or(0, |(a, b)| a.saturating_sub(b)),
        runnable_others,
    }
}

/// What the command line did to control interference (`--cpu`, `--quiet-host`), recorded
/// with every run's noise in this process.
static CONTROL: Mutex<(Option<String>, Option<QuietWait>)> = Mutex::new((None, None));

/// Records that the measuring threads are pinned to `cpus`.
pub fn note_pinned(cpus: &[usize]) {
    if let Ok(mut c) = CONTROL.lock() {
        c.0 = Some(format_cpu_list(cpus));
    }
}

/// Records what `--quiet-host` waited.
pub fn note_quiet_wait(wait: QuietWait) {
    if let Ok(mut c) = CONTROL.lock() {
        c.1 = Some(wait);
    }
}

/// `/proc/loadavg`: the 1-minute load and the tasks runnable now.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoadAvg {
    /// 1-minute load average.
    pub load1: f64,
    /// Runnable tasks now, this one included.
    pub running: u32,
}

/// Reads `/proc/loadavg`.
pub fn read_loadavg() -> Option<LoadAvg> {
    parse_loadavg(&fs::read_to_string("/proc/loadavg").ok()?)
}

fn parse_loadavg(text: &str) -> Option<LoadAvg> {
    let mut f = text.split_whitespace();
    let load1 = f.next()?.parse().ok()?;
    let running = f.nth(2)?.split('/').next()?.parse().ok()?;
    Some(LoadAvg { load1, running })
}

/// Online CPUs (not the ones this process may use: load is spread over all of them), as
/// `sysconf(_SC_NPROCESSORS_ONLN)` counts them: `/sys/devices/system/cpu/online`.
pub fn online_cpus() -> usize {
    fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|t| cpu_ranges(t.trim()))
        .map(|cpus| cpus.len())
        .filter(|n| *n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// The system-wide state at one instant.
#[derive(Debug, Clone)]
pub struct Snapshot {
    at: Instant,
    load: Option<LoadAvg>,
    /// PSI cpu `some` and `full` totals, µs.
    psi: Option<(u64, u64)>,
    /// /proc/stat's aggregate cpu line: (steal, all) ticks.
    stat: Option<(u64, u64)>,
    clocksource: String,
    thread: ThreadCounters,
}

impl Snapshot {
    /// Reads everything now.
    pub fn take() -> Snapshot {
        Snapshot {
            at: Instant::now(),
            load: read_loadavg(),
            psi: fs::read_to_string("/proc/pressure/cpu")
                .ok()
                .and_then(|t| parse_psi(&t)),
            stat: fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|t| parse_stat(&t)),
            clocksource: fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            )
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
            thread: ThreadCounters::read(),
        }
    }
}

/// `some total=` and `full total=` of `/proc/pressure/cpu` (`full` is 0 on kernels that only
/// report `some` for the CPU).
fn parse_psi(text: &str) -> Option<(u64, u64)> {
    let total = |kind: &str| -> Option<u64> {
        text.lines()
            .find(|l| l.starts_with(kind))?
            .split_whitespace()
            .find_map(|f| f.strip_prefix("total="))?
            .parse()
            .ok()
    };
    Some((total("some")?, total("full").unwrap_or(0)))
}

/// (steal, sum of all fields) of the aggregate `cpu` line of `/proc/stat`.
fn parse_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal guest guest_nice: guest time is already
    // counted in user and nice.
    let all: u64 = v.iter().take(8).sum();
    Some((v.get(7).copied().unwrap_or(0), all))
}

/// The noise between two snapshots, with the repetitions watched in between, of a run that
/// kept `own_threads` of its threads runnable at once.
pub fn between(start: &Snapshot, end: &Snapshot, reps: &[RepNoise], own_threads: u32) -> Noise {
    let cores = online_cpus();
    let wall_us = end.at.duration_since(start.at).as_secs_f64() * 1e6;
    let pct = |d: u64, of: f64| (of > 0.0).then(|| (d as f64 / of * 100.0).min(100.0));
    let psi = start.psi.zip(end.psi);
    let mut others: Vec<u32> = reps.iter().map(|r| r.runnable_others).collect();
    others.sort_unstable();
    let mut inv: Vec<u64> = reps.iter().map(|r| r.involuntary).collect();
    inv.sort_unstable();
    let mut noise = Noise {
        cores,
        load1: [
            start.load.map_or(0.0, |l| l.load1),
            end.load.map_or(0.0, |l| l.load1),
        ],
        runnable_others: [
            others
                .get(others.len() / 2)
                .copied()
                .unwrap_or_else(|| end.load.map_or(0, |l| l.running.saturating_sub(1))),
            others
                .last()
                .copied()
                .unwrap_or_else(|| end.load.map_or(0, |l| l.running.saturating_sub(1))),
        ],
        cpu_pressure_some_pct: psi.and_then(|(a, b)| pct(b.0.saturating_sub(a.0), wall_us)),
        cpu_pressure_full_pct: psi.and_then(|(a, b)| pct(b.1.saturating_sub(a.1), wall_us)),
        steal_pct: start
            .stat
            .zip(end.stat)
            .and_then(|(a, b)| pct(b.0.saturating_sub(a.0), b.1.saturating_sub(a.1) as f64)),
        involuntary_switches: end
            .thread
            .involuntary
            .saturating_sub(start.thread.involuntary),
        voluntary_switches: end.thread.voluntary.saturating_sub(start.thread.voluntary),
        migrations: end
            .thread
            .migrations
            .zip(start.thread.migrations)
            .map(|(b, a)| b.saturating_sub(a)),
        involuntary_per_rep: if inv.is_empty() {
            Vec::new()
        } else {
            vec![inv[inv.len() / 2], inv[inv.len() - 1]]
        },
        clocksource: start.clocksource.clone(),
        clocksource_stable: start.clocksource == end.clocksource,
        wall_s: wall_us / 1e6,
        pinned_cpus: None,
        quiet_wait: None,
        own_threads: own_threads.max(1),
        busy: Vec::new(),
    };
    if let Ok(c) = CONTROL.lock() {
        noise.pinned_cpus.clone_from(&c.0);
        noise.quiet_wait = c.1;
    }
    noise.busy = noise.busy_reasons();
    noise
}

/// Parses `--cpu LIST` (`0`, `0,2`, `0-3`, `0-1,3`) against the CPUs this process may use.
/// The error names the option, the bad CPU and the allowed ones.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    let allowed = allowed_cpus();
    let allowed_text = format_cpu_list(&allowed);
    let bad_syntax = || {
        format!(
            "`{text}` is not a CPU list: give CPU numbers and ranges such as 1 or 0,2 or 0-1; the allowed CPUs are {allowed_text}"
        )
    };
    let cpus = cpu_ranges(text).ok_or_else(bad_syntax)?;
    if let Some(bad) = cpus.iter().find(|c| !allowed.contains(c)) {
        return Err(format!(
            "CPU {bad} does not exist or is not allowed for this process: the allowed CPUs are {allowed_text}"
        ));
    }
    Ok(cpus)
}

/// `0-3`, `0,2`, `0-1,3` as sorted CPU numbers, or `None` when it is not such a list.
fn cpu_ranges(text: &str) -> Option<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let (lo, hi): (usize, usize) = (lo.parse().ok()?, hi.parse().ok()?);
        if lo > hi || hi - lo > 4096 {
            return None;
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

/// The CPUs this process may run on (`sched_getaffinity`).
pub fn allowed_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..CpuSet::MAX_CPU).filter(|&i| set.is_set(i)).collect(),
        Err(_) => (0..online_cpus()).collect(),
    }
}

/// `0-1,3` from a sorted list.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Pins the calling thread to `cpus` (`sched_setaffinity`). Threads it creates afterwards (the
/// vCPU threads, the userfaultfd server) inherit the mask, so calling it before the backend is
/// built pins the VMM and every vCPU thread.
pub fn pin_to(cpus: &[usize]) -> std::io::Result<()> {
    let mut set = CpuSet::new();
    // parse_cpu_list only returns allowed CPUs, all below the set's size.
    for &c in cpus.iter().filter(|c| **c < CpuSet::MAX_CPU) {
        set.set(c);
    }
    Ok(rustix::thread::sched_setaffinity(None, &set)?)
}

/// Parses `--quiet-host[=WAIT]`'s bound: `30s`, `2m`, `90` (seconds); 1 s to 1 h.
pub fn parse_wait(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let d = if t.chars().all(|c| c.is_ascii_digit()) && !t.is_empty() {
        t.parse::<u64>().ok().map(Duration::from_secs)
    } else {
        humantime::parse_duration(t).ok()
    };
    match d {
        Some(d) if d >= Duration::from_secs(1) && d <= Duration::from_secs(3600) => Ok(d),
        _ => Err(format!(
            "`{text}` is not a wait between 1s and 1h: give a duration such as 30s, 2m or 90"
        )),
    }
}

/// Waits until the 1-minute load is below the core count, at most `limit`, checking every
/// second; says what happened.
pub fn wait_for_quiet(limit: Duration) -> QuietWait {
    let cores = online_cpus() as f64;
    let start = Instant::now();
    loop {
        let load1 = read_loadavg().map_or(0.0, |l| l.load1);
        let waited = start.elapsed();
        if load1 < cores || waited >= limit {
            return QuietWait {
                waited_s: waited.as_secs_f64(),
                limit_s: limit.as_secs_f64(),
                quiet: load1 < cores,
                load1,
            };
        }
        std::thread::sleep(Duration::from_secs(1).min(limit.saturating_sub(waited)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse() {
        assert_eq!(
            parse_loadavg("3.56 2.45 1.45 3/104 12659\n"),
            Some(LoadAvg {
                load1: 3.56,
                running: 3
            })
        );
        let psi = "some avg10=31.34 avg60=63.71 avg300=40.95 total=211938460\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_psi(psi), Some((211_938_460, 0)));
        assert_eq!(
            parse_stat("cpu  132605 0 7160 117382 1705 0 134 8508 0 0\ncpu0 1 2 3\n"),
            Some((8508, 132_605 + 7160 + 117_382 + 1705 + 134 + 8508))
        );
        assert_eq!(
            field_after(
                "se.nr_migrations      :     17\nnr_switches : 2\n",
                "se.nr_migrations"
            ),
            Some(17)
        );
    }

    #[test]
    fn cpu_lists_round_trip_and_bad_ones_name_the_allowed_cpus() {
        assert_eq!(format_cpu_list(&[0, 1, 2, 5, 7, 8]), "0-2,5,7-8");
        let allowed = allowed_cpus();
        let first = allowed[0];
        assert_eq!(parse_cpu_list(&first.to_string()), Ok(vec![first]));
        let err = parse_cpu_list("4095").unwrap_err();
        assert!(
            err.contains("CPU 4095 does not exist or is not allowed"),
            "{err}"
        );
        assert!(err.contains(&format_cpu_list(&allowed)), "{err}");
        assert!(parse_cpu_list("1-0").is_err());
        assert!(parse_cpu_list("x").unwrap_err().contains("not a CPU list"));
    }

    #[test]
    fn quiet_host_waits_parse_within_bounds() {
        assert_eq!(parse_wait("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_wait("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_wait("2m"), Ok(Duration::from_secs(120)));
        for bad in ["0", "2h", "soon", "-1", ""] {
            assert!(
                parse_wait(bad).unwrap_err().contains("between 1s and 1h"),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_trial_counts_only_what_happened_during_it() {
        let at = |involuntary, voluntary, migrations| ThreadCounters {
            involuntary,
            voluntary,
            migrations,
        };
        let seen = rep_between(at(10, 5, Some(3)), at(12, 90, Some(4)), 1);
        assert_eq!((seen.involuntary, seen.migrations), (2, 1));
        // Without the kernel's migration count on either side, none is claimed.
        assert_eq!(
            rep_between(at(1, 0, None), at(1, 0, Some(9)), 0).migrations,
            0
        );
    }
}
