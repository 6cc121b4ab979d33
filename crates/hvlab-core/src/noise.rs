//! The noise a run was measured in, as data: load and runnable tasks, CPU pressure (PSI),
//! steal time, the measuring thread's involuntary context switches and migrations, and whether
//! the clock source stayed the same. Every run stores it (`noise` in the record), and the busy
//! rule ([`Noise::busy_reasons`]) decides when results must carry a warning, when `validate`
//! cannot judge and when `calibrate` refuses to write. `hvlab-host` measures it.

use serde::{Deserialize, Serialize};

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
}
