//! The noise a run was measured in, read from /proc and sysfs like the host description: load
//! and runnable tasks, CPU pressure (PSI), steal time, the measuring thread's involuntary
//! context switches and migrations (per repetition: one `getrusage(RUSAGE_THREAD)` and one
//! read of `/proc/thread-self/sched` around each trial, outside the timed section), and whether
//! the clock source stayed the same. Every run stores it (`noise` in the record), and the busy
//! rule ([`Noise::busy_reasons`]) decides when results must carry a warning, when `validate`
//! cannot judge and when `calibrate` refuses to write.
//!
//! Interference control lives here too: `--cpu LIST` ([`parse_cpu_list`], [`pin_to`]) and the
//! bounded `--quiet-host` wait ([`wait_for_quiet`]).

use std::fs;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

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
    /// Reads the calling thread's counters; zeros where the kernel refuses.
    pub fn read() -> ThreadCounters {
        // SAFETY: getrusage writes one `struct rusage` into the zeroed value we own; an error
        // leaves it zeroed, which reads as no switches.
        let usage = unsafe {
            let mut u: libc::rusage = std::mem::zeroed();
            libc::getrusage(libc::RUSAGE_THREAD, &raw mut u);
            u
        };
        let migrations = fs::read_to_string("/proc/thread-self/sched")
            .ok()
            .and_then(|t| field_after(&t, "se.nr_migrations"));
        ThreadCounters {
            involuntary: u64::try_from(usage.ru_nivcsw).unwrap_or(0),
            voluntary: u64::try_from(usage.ru_nvcsw).unwrap_or(0),
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

/// What one repetition's trial saw, from [`RepWatch::start`] to [`RepWatch::end`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RepNoise {
    /// The measuring thread's involuntary switches during the trial.
    pub involuntary: u64,
    /// Its migrations during the trial.
    pub migrations: u64,
    /// Runnable tasks other than this one when the trial ended (`/proc/loadavg`).
    pub runnable_others: u32,
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
        RepNoise::between(self.0, after, runnable_others)
    }
}

impl RepNoise {
    /// What happened between two readings of the measuring thread's counters.
    fn between(before: ThreadCounters, after: ThreadCounters, runnable_others: u32) -> RepNoise {
        RepNoise {
            involuntary: after.involuntary.saturating_sub(before.involuntary),
            migrations: after
                .migrations
                .zip(before.migrations)
                .map_or(0, |(a, b)| a.saturating_sub(b)),
            runnable_others,
        }
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

/// Online CPUs (not the ones this process may use: load is spread over all of them).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf reads a system constant and has no memory effects.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).ok().filter(|n| *n > 0).unwrap_or(1)
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

/// The noise of one run: stored with it (`noise` in the JSON, additive to the contract).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Noise {
    /// Online CPUs.
    pub cores: usize,
    /// 1-minute load average at the start and at the end.
    pub load1: [f64; 2],
    /// Runnable tasks other than hvlab's measuring thread after each repetition: median, max.
    pub runnable_others: [u32; 2],
    /// Share of the run's wall time in which some task waited for a CPU (PSI), %.
    pub cpu_pressure_some_pct: Option<f64>,
    /// Share in which every non-idle task waited (PSI `full`), %.
    pub cpu_pressure_full_pct: Option<f64>,
    /// Steal time (a hypervisor below ran something else), % of all CPU time.
    pub steal_pct: Option<f64>,
    /// The measuring thread's involuntary context switches over the run.
    pub involuntary_switches: u64,
    /// Its voluntary context switches.
    pub voluntary_switches: u64,
    /// Its CPU migrations, where the kernel exposes them.
    pub migrations: Option<u64>,
    /// Involuntary switches per repetition: median and max (empty when not per repetition).
    #[serde(default)]
    pub involuntary_per_rep: Vec<u64>,
    /// The clock source at the start (`tsc`, `kvm-clock`, ...).
    pub clocksource: String,
    /// Whether the clock source was the same at the end.
    pub clocksource_stable: bool,
    /// The run's wall time, s.
    pub wall_s: f64,
    /// CPUs the measuring threads were pinned to (`--cpu`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_cpus: Option<String>,
    /// How long `--quiet-host` waited before the run, s, and whether the host became quiet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quiet_wait: Option<QuietWait>,
    /// Threads the run itself keeps runnable at once (its vCPUs writing in parallel): more
    /// than the cores makes the run its own load and CPU pressure, which the busy rule then
    /// does not count against the host. Absent (1) in runs stored before it was recorded.
    #[serde(default = "one_thread", skip_serializing_if = "is_one_thread")]
    pub own_threads: u32,
    /// What made the host busy by the busy rule; empty on a quiet host.
    pub busy: Vec<BusyReason>,
}

fn one_thread() -> u32 {
    1
}

// serde's skip_serializing_if hands the field by reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_one_thread(n: &u32) -> bool {
    *n == 1
}

/// What `--quiet-host` did.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct QuietWait {
    /// Seconds waited.
    pub waited_s: f64,
    /// The bound, s.
    pub limit_s: f64,
    /// The load reached below the core count.
    pub quiet: bool,
    /// The 1-minute load when the wait ended.
    pub load1: f64,
}

/// Why the busy rule called the host busy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum BusyReason {
    /// The 1-minute load (hvlab included) reached the core count.
    Load {
        /// The higher of start and end.
        load1: f64,
        /// Online CPUs.
        cores: usize,
    },
    /// Other runnable tasks left hvlab no free CPU beside its own.
    Runnable {
        /// Median over the repetitions.
        others: u32,
        /// Online CPUs.
        cores: usize,
    },
    /// Tasks waited for a CPU for a large share of the run (PSI `some`).
    Pressure {
        /// %.
        some_pct: f64,
    },
    /// A hypervisor below took CPU time away.
    Steal {
        /// %.
        pct: f64,
    },
}

/// PSI `some` share of the run at or above which the host counts as busy, %.
pub const BUSY_PRESSURE_PCT: f64 = 20.0;
/// Steal share at or above which the host counts as busy, %.
pub const BUSY_STEAL_PCT: f64 = 10.0;

impl Noise {
    /// The noise between two snapshots, with the repetitions recorded in between, of a run
    /// that kept `own_threads` of its threads runnable at once.
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

    /// The busy rule: the 1-minute load (hvlab's own threads included) at or above the core
    /// count plus the run's threads beyond its first; or, after the median repetition (when
    /// the run's vCPU threads have stopped), other runnable tasks numbering at least
    /// max(1, cores − 1), so hvlab's threads had no free CPU beside the measuring one; or
    /// tasks waiting for a CPU in at least 20% of the run (PSI), unless the run's own threads
    /// outnumber the cores (then they wait for each other, and PSI cannot tell them from
    /// others: the runnable count and steal still can); or steal of 10% or more.
    pub fn busy_reasons(&self) -> Vec<BusyReason> {
        let mut out = Vec::new();
        let load1 = self.load1[0].max(self.load1[1]);
        let own_beyond_first = f64::from(self.own_threads.saturating_sub(1));
        if load1 >= self.cores as f64 + own_beyond_first {
            out.push(BusyReason::Load {
                load1,
                cores: self.cores,
            });
        }
        let others_limit = u32::try_from(self.cores.saturating_sub(1).max(1)).unwrap_or(u32::MAX);
        if self.runnable_others[0] >= others_limit {
            out.push(BusyReason::Runnable {
                others: self.runnable_others[0],
                cores: self.cores,
            });
        }
        if let Some(some_pct) = self.cpu_pressure_some_pct
            && some_pct >= BUSY_PRESSURE_PCT
            && !self.oversubscribed()
        {
            out.push(BusyReason::Pressure { some_pct });
        }
        if let Some(pct) = self.steal_pct
            && pct >= BUSY_STEAL_PCT
        {
            out.push(BusyReason::Steal { pct });
        }
        out
    }

    /// Whether the run's own threads outnumbered the cores, so they waited for each other.
    pub fn oversubscribed(&self) -> bool {
        self.own_threads as usize > self.cores
    }

    /// Whether the busy rule called the host busy.
    pub fn is_busy(&self) -> bool {
        !self.busy.is_empty()
    }
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
    let mut cpus = Vec::new();
    for part in text.split(',').map(str::trim) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => (part, part),
        };
        let (lo, hi): (usize, usize) = (
            lo.parse().map_err(|_| bad_syntax())?,
            hi.parse().map_err(|_| bad_syntax())?,
        );
        if lo > hi || hi - lo > 4096 {
            return Err(bad_syntax());
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    if let Some(bad) = cpus.iter().find(|c| !allowed.contains(c)) {
        return Err(format!(
            "CPU {bad} does not exist or is not allowed for this process: the allowed CPUs are {allowed_text}"
        ));
    }
    Ok(cpus)
}

/// The CPUs this process may run on (`sched_getaffinity`).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: `set` is a zeroed cpu_set_t we own, and its size is passed; the call only writes
    // into it.
    let (rc, set) = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let rc = libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw mut set);
        (rc, set)
    };
    if rc != 0 {
        return (0..online_cpus()).collect();
    }
    // SAFETY: CPU_ISSET reads the set we own; i stays below CPU_SETSIZE.
    (0..usize::try_from(libc::CPU_SETSIZE).unwrap_or(1024))
        .filter(|&i| unsafe { libc::CPU_ISSET(i, &set) })
        .collect()
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
    // SAFETY: `set` is a zeroed cpu_set_t we own; CPU_SET writes bits of it for CPUs below
    // CPU_SETSIZE (parse_cpu_list only returns allowed CPUs, all below it), and
    // sched_setaffinity reads it with its size.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw const set)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
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

    fn noise(load1: f64, others: u32, some: Option<f64>, steal: Option<f64>) -> Noise {
        let mut n = Noise {
            cores: 2,
            load1: [load1, load1],
            runnable_others: [others, others],
            cpu_pressure_some_pct: some,
            cpu_pressure_full_pct: Some(0.0),
            steal_pct: steal,
            involuntary_switches: 0,
            voluntary_switches: 0,
            migrations: Some(0),
            involuntary_per_rep: Vec::new(),
            clocksource: "tsc".into(),
            clocksource_stable: true,
            wall_s: 10.0,
            pinned_cpus: None,
            quiet_wait: None,
            own_threads: 1,
            busy: Vec::new(),
        };
        n.busy = n.busy_reasons();
        n
    }

    fn with_threads(mut n: Noise, own: u32) -> Noise {
        n.own_threads = own;
        n.busy = n.busy_reasons();
        n
    }

    #[test]
    fn a_run_with_more_threads_than_cores_is_not_busy_from_its_own_waiting() {
        // Eight vCPUs on two cores: the run's own load and pressure (as measured here: load
        // 0.9 to 2.1, PSI some 87%) are not another process.
        let own = with_threads(noise(2.1, 0, Some(87.0), Some(2.0)), 8);
        assert!(own.oversubscribed());
        assert!(!own.is_busy(), "{:?}", own.busy);
        // One more process beside them still shows, in the runnable count, the load beyond
        // the run's own threads, and steal.
        assert!(matches!(
            with_threads(noise(2.1, 1, Some(87.0), None), 8).busy[..],
            [BusyReason::Runnable { others: 1, .. }]
        ));
        assert!(matches!(
            with_threads(noise(9.5, 0, None, None), 8).busy[..],
            [BusyReason::Load { .. }]
        ));
        assert!(matches!(
            with_threads(noise(1.0, 0, None, Some(12.0)), 8).busy[..],
            [BusyReason::Steal { .. }]
        ));
        // Two threads on two cores do not wait for each other: pressure still counts.
        assert!(matches!(
            with_threads(noise(0.5, 0, Some(31.0), None), 2).busy[..],
            [BusyReason::Pressure { .. }]
        ));
    }

    #[test]
    fn a_quiet_reading_is_not_busy_and_each_busy_sign_alone_is() {
        assert!(!noise(0.9, 0, Some(2.0), Some(0.0)).is_busy());
        assert!(!noise(1.9, 0, None, None).is_busy());
        assert!(matches!(
            noise(4.2, 0, Some(2.0), Some(0.0)).busy[..],
            [BusyReason::Load { load1, cores: 2 }] if (load1 - 4.2).abs() < 1e-12
        ));
        assert!(matches!(
            noise(0.5, 1, None, None).busy[..],
            [BusyReason::Runnable {
                others: 1,
                cores: 2
            }]
        ));
        assert!(matches!(
            noise(0.5, 0, Some(31.0), None).busy[..],
            [BusyReason::Pressure { .. }]
        ));
        assert!(matches!(
            noise(0.5, 0, None, Some(12.0)).busy[..],
            [BusyReason::Steal { .. }]
        ));
    }

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
        let seen = RepNoise::between(at(10, 5, Some(3)), at(12, 90, Some(4)), 1);
        assert_eq!((seen.involuntary, seen.migrations), (2, 1));
        // Without the kernel's migration count on either side, none is claimed.
        assert_eq!(
            RepNoise::between(at(1, 0, None), at(1, 0, Some(9)), 0).migrations,
            0
        );
    }
}
