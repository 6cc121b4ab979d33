//! SRCU's grace-period machinery (kernel/rcu/srcutree.c), step by step in time: the callbacks,
//! the scans, the delays and the timer wheel's rounding.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// `SRCU_MAX_INTERVAL`: the longest re-queue delay slow readers cause, jiffies.
const SRCU_MAX_INTERVAL: u64 = 10;

/// `srcu_retry_check_delay` (`SRCU_DEFAULT_RETRY_CHECK_DELAY`): µs between reader checks.
const RETRY_CHECK_DELAY_NS: u64 = 5_000;

/// `USEC_PER_SEC`, for `SRCU_DEFAULT_MAX_NODELAY_PHASE`.
const USEC_PER_SEC: u64 = 1_000_000;

/// Where an SRCU grace period is (`rcu_seq_state()` of `srcu_gp_seq`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GpState {
    Idle,
    Scan1,
    Scan2,
}

/// A queued callback: the grace period it needs (a count of completed grace periods), and the
/// synchronizer it wakes, if any.
#[derive(Debug, Clone, Copy)]
struct Callback {
    gp: u64,
    waiter: Option<u64>,
}

/// Grace periods completed so far, by kind: what the tests check the machinery against.
#[cfg(test)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpCounts {
    /// Ended while an expedited grace period was wanted.
    pub expedited: u64,
    /// Ended as normal grace periods.
    pub normal: u64,
}

/// One VM's `kvm->srcu`, with the single `srcu_data` of an `SRCU_SIZE_SMALL` srcu_struct.
#[derive(Debug, Clone)]
pub struct Srcu {
    jiffy_ns: u64,
    /// Ticks fall at `phase_ns + k × jiffy_ns`.
    phase_ns: u64,
    /// A hand-off to a sleeping task on another CPU: a workqueue item starting there, a
    /// synchronizer woken from there.
    wakeup_ns: u64,
    /// A hand-off on the CPU that queues the work (see [`Srcu::queue_work`]).
    local_handoff_ns: u64,
    /// How often the CPU a grace-period timer fires on is running another task.
    timer_cpu_busy: f64,
    completed: u64,
    state: GpState,
    gp_start_jiffies: u64,
    needed: u64,
    needed_exp: u64,
    n_exp_nodelay: u64,
    max_nodelay_phase: u64,
    max_nodelay: u64,
    reschedule_jiffies: u64,
    reschedule_count: u64,
    /// When `process_srcu()` runs next.
    work_at: Option<u64>,
    /// When the per-CPU delay timer fires (it then queues callback invocation).
    cb_timer: Option<u64>,
    /// When `srcu_invoke_callbacks()` runs next.
    cb_at: Option<u64>,
    cbs: Vec<Callback>,
    woken: Vec<(u64, u64)>,
    next_waiter: u64,
    readers: u32,
    occupancy: f64,
    rng: ChaCha8Rng,
    #[cfg(test)]
    counts: GpCounts,
}

impl Srcu {
    /// An idle SRCU: ticks every `jiffy_ns` from `phase_ns`, hand-offs costing `wakeup_ns`,
    /// `hz` for the kernel's HZ-derived limits; `seed` draws reader presence.
    pub fn new(jiffy_ns: u64, phase_ns: u64, wakeup_ns: u64, seed: u64) -> Srcu {
        let jiffy_ns = jiffy_ns.max(1);
        let hz = (1_000_000_000 / jiffy_ns).max(1);
        // SRCU_DEFAULT_MAX_NODELAY_PHASE: 2 × USEC_PER_SEC / HZ / retry delay, clamped to
        // [3, 1000]; SRCU_DEFAULT_MAX_NODELAY: at least 100.
        let phase = (2 * USEC_PER_SEC / hz / (RETRY_CHECK_DELAY_NS / 1000)).clamp(3, 1000);
        Srcu {
            jiffy_ns,
            phase_ns: phase_ns % jiffy_ns,
            wakeup_ns,
            local_handoff_ns: wakeup_ns,
            timer_cpu_busy: 0.0,
            completed: 0,
            state: GpState::Idle,
            gp_start_jiffies: 0,
            needed: 0,
            needed_exp: 0,
            n_exp_nodelay: 0,
            max_nodelay_phase: phase,
            max_nodelay: phase.max(100),
            reschedule_jiffies: u64::MAX,
            reschedule_count: 0,
            work_at: None,
            cb_timer: None,
            cb_at: None,
            cbs: Vec::new(),
            woken: Vec::new(),
            next_waiter: 0,
            readers: 0,
            occupancy: 0.0,
            rng: ChaCha8Rng::seed_from_u64(seed),
            #[cfg(test)]
            counts: GpCounts::default(),
        }
    }

    /// The fraction of timer expiries that find their CPU running another task (a busy
    /// host): the kworker the timer wakes then waits for that task (see [`Srcu::work_runs`]).
    pub fn set_timer_cpu_busy(&mut self, fraction: f64) {
        self.timer_cpu_busy = fraction.clamp(0.0, 1.0);
    }

    /// The price of a hand-off on the queuing CPU (see [`Srcu::queue_work`]); until set, the
    /// same as a hand-off to another CPU.
    pub fn set_local_handoff(&mut self, ns: u64) {
        self.local_handoff_ns = ns;
    }

    /// `n` vCPUs in `KVM_RUN`, each inside an SRCU read-side section a fraction `occupancy` of
    /// the time (handling exits in the kernel).
    pub fn set_readers(&mut self, n: u32, occupancy: f64) {
        self.readers = n;
        self.occupancy = occupancy.clamp(0.0, 0.99);
    }

    /// Grace periods completed so far.
    #[cfg(test)]
    pub fn counts(&self) -> GpCounts {
        self.counts
    }

    /// `jiffies` at `t`: the number of ticks so far.
    fn jiffies(&self, t: u64) -> u64 {
        if t < self.phase_ns {
            0
        } else {
            (t - self.phase_ns) / self.jiffy_ns + 1
        }
    }

    /// The time of the tick that makes `jiffies` equal `j` (j ≥ 1).
    fn tick_time(&self, j: u64) -> u64 {
        self.phase_ns + j.saturating_sub(1) * self.jiffy_ns
    }

    /// When a timer armed at `t` for `delay` jiffies fires: the timer wheel files it one
    /// bucket later than `jiffies + delay` (`calc_index()`), so it fires on that tick's
    /// successor.
    fn timer_fires(&self, t: u64, delay: u64) -> u64 {
        self.tick_time(self.jiffies(t) + delay + 1)
    }

    /// When work queued at `t` with `delay` jiffies starts running. Work queued with no
    /// delay is queued by a task that then sleeps (the synchronizer in
    /// `wait_for_completion()`, or the kworker itself): its CPU is free, one wake-up. Delayed
    /// work is queued by `delayed_work_timer_fn()` from the timer softirq of a tick, on the
    /// CPU that armed it; when that CPU is running another task, the woken kworker does not
    /// preempt it (`check_preempt_wakeup_fair()` leaves the current task its slice under
    /// `RUN_TO_PARITY`) and runs once that task blocks or the tick finds its slice used up
    /// (`task_tick_fair()` → `update_deadline()` → `resched_curr()`): somewhere in the next
    /// jiffy, drawn uniformly.
    fn work_runs(&mut self, t: u64, delay: u64) -> u64 {
        if delay == 0 {
            t + self.wakeup_ns
        } else {
            let fires = self.timer_fires(t, delay);
            fires + self.busy_cpu_wait() + self.wakeup_ns
        }
    }

    /// The wait of a kworker woken by a timer on a CPU that may be running another task.
    fn busy_cpu_wait(&mut self) -> u64 {
        if self.timer_cpu_busy <= 0.0 || self.rng.random::<f64>() >= self.timer_cpu_busy {
            return 0;
        }
        self.rng.random_range(0..self.jiffy_ns)
    }

    /// `rcu_seq_snap()`: the grace period a request made now needs.
    fn snap(&self) -> u64 {
        if self.state == GpState::Idle {
            self.completed + 1
        } else {
            self.completed + 2
        }
    }

    /// `srcu_gp_is_expedited()`: an expedited grace period is wanted beyond those done.
    fn expedited(&self) -> bool {
        self.needed_exp > self.completed
    }

    /// `srcu_get_delay()`.
    fn get_delay(&mut self, t: u64) -> u64 {
        let mut jbase = u64::from(!self.expedited());
        if self.state != GpState::Idle {
            let j = self.jiffies(t).saturating_sub(1);
            if j > self.gp_start_jiffies {
                jbase += j - self.gp_start_jiffies;
            }
            if jbase == 0 {
                self.n_exp_nodelay += 1;
                if self.n_exp_nodelay > self.max_nodelay_phase {
                    jbase = 1;
                }
            }
        }
        jbase.min(SRCU_MAX_INTERVAL)
    }

    /// `srcu_gp_start()`.
    fn gp_start(&mut self, t: u64) {
        self.state = GpState::Scan1;
        self.gp_start_jiffies = self.jiffies(t);
        self.n_exp_nodelay = 0;
    }

    /// `queue_delayed_work()` of the grace-period work: a no-op while it is pending.
    ///
    /// With no delay the work goes to the queuing CPU's own pool: `rcu_gp_wq` is a per-CPU
    /// workqueue (`WQ_MEM_RECLAIM`, not `WQ_UNBOUND`), so `__queue_work()` given
    /// `WORK_CPU_UNBOUND` picks `raw_smp_processor_id()`. The queuer is the synchronizer
    /// (`srcu_funnel_gp_start()`, then it sleeps in `wait_for_completion()`) or the kworker
    /// itself (`srcu_reschedule()` from `process_srcu()`): the kworker runs next on that same
    /// CPU, a local hand-off with no idle exit and no IPI. Delayed work goes through the timer
    /// ([`Srcu::work_runs`]).
    fn queue_work(&mut self, t: u64, delay: u64) {
        if self.work_at.is_none() {
            self.work_at = Some(if delay == 0 {
                t + self.local_handoff_ns
            } else {
                self.work_runs(t, delay)
            });
        }
    }

    /// `srcu_gp_start_if_needed()` with `srcu_funnel_gp_start()` / `srcu_funnel_exp_start()`.
    fn start_if_needed(&mut self, t: u64, do_norm: bool, waiter: Option<u64>) {
        let s = self.snap();
        self.cbs.push(Callback { gp: s, waiter });
        let needgp = self.needed < s;
        if needgp {
            self.needed = s;
        }
        if !do_norm && self.needed_exp < s {
            self.needed_exp = s;
        }
        if needgp && self.state == GpState::Idle {
            self.gp_start(t);
            let delay = self.get_delay(t).min(1);
            self.queue_work(t, delay);
        }
    }

    /// Whether any vCPU ever sits in a read-side section.
    pub(super) fn has_readers(&self) -> bool {
        self.readers > 0 && self.occupancy > 0.0
    }

    /// Whether a reader holds the index being checked now.
    fn reader_present(&mut self) -> bool {
        if !self.has_readers() {
            return false;
        }
        let clear = (1.0 - self.occupancy).powi(i32::try_from(self.readers).unwrap_or(i32::MAX));
        self.rng.random::<f64>() >= clear
    }

    /// `try_check_zero()`: whether the readers drained, and the time after its retries.
    fn try_check_zero(&mut self, mut t: u64, trycount: u64) -> (bool, u64) {
        let extra = u64::from(self.get_delay(t) == 0);
        let mut left = trycount + extra;
        loop {
            if !self.reader_present() {
                return (true, t);
            }
            left -= 1;
            if left == 0 {
                return (false, t);
            }
            t += RETRY_CHECK_DELAY_NS;
        }
    }

    /// `srcu_advance_state()`; returns the time it finished.
    fn advance_state(&mut self, mut t: u64) -> u64 {
        if self.state == GpState::Idle {
            if self.completed >= self.needed {
                return t;
            }
            self.gp_start(t);
        }
        if self.state == GpState::Scan1 {
            let (drained, after) = self.try_check_zero(t, 1);
            t = after;
            if !drained {
                return t;
            }
            // srcu_flip()
            self.state = GpState::Scan2;
            self.n_exp_nodelay = 0;
        }
        let (drained, after) = self.try_check_zero(t, 2);
        t = after;
        if drained {
            self.n_exp_nodelay = 0;
            self.gp_end(t);
        }
        t
    }

    /// `srcu_gp_end()`.
    fn gp_end(&mut self, t: u64) {
        let cbdelay = u64::from(!self.expedited());
        #[cfg(test)]
        if cbdelay == 0 {
            self.counts.expedited += 1;
        } else {
            self.counts.normal += 1;
        }
        self.completed += 1;
        self.state = GpState::Idle;
        self.needed_exp = self.needed_exp.max(self.completed);
        // srcu_schedule_cbs_sdp(): at once, or by timer_reduce() on the delay timer.
        if cbdelay == 0 {
            if self.cb_at.is_none() {
                self.cb_at = Some(t + self.wakeup_ns);
            }
        } else {
            let fire = self.timer_fires(t, cbdelay);
            self.cb_timer = Some(self.cb_timer.map_or(fire, |old| old.min(fire)));
        }
        if self.completed < self.needed {
            self.gp_start(t);
            self.reschedule(t, 0);
        }
    }

    /// `srcu_reschedule()`.
    fn reschedule(&mut self, t: u64, delay: u64) {
        if self.completed >= self.needed {
            if self.state == GpState::Idle {
                return;
            }
        } else if self.state == GpState::Idle {
            self.gp_start(t);
        }
        self.queue_work(t, delay);
    }

    /// `process_srcu()`, the grace-period work.
    fn process(&mut self, t: u64) {
        let t = self.advance_state(t);
        let mut delay = self.get_delay(t);
        if delay == 0 {
            let j = self.jiffies(t);
            if self.reschedule_jiffies == j {
                self.reschedule_count += 1;
                if self.reschedule_count > self.max_nodelay {
                    delay = 1;
                }
            } else {
                self.reschedule_count = 1;
                self.reschedule_jiffies = j;
            }
        } else {
            self.reschedule_count = 0;
        }
        self.reschedule(t, delay);
    }

    /// `srcu_invoke_callbacks()`: every callback whose grace period has ended; each
    /// synchronizer wakes one hand-off later.
    fn invoke_callbacks(&mut self, t: u64) {
        let done = self.completed;
        let wake = t + self.wakeup_ns;
        let mut woken = Vec::new();
        self.cbs.retain(|cb| {
            if cb.gp > done {
                return true;
            }
            if let Some(w) = cb.waiter {
                woken.push((w, wake));
            }
            false
        });
        self.woken.extend(woken);
    }

    fn next_event(&self) -> Option<u64> {
        [self.cb_timer, self.work_at, self.cb_at]
            .into_iter()
            .flatten()
            .min()
    }

    /// Runs the one event due at `t`.
    fn step(&mut self, t: u64) {
        if self.cb_timer == Some(t) {
            self.cb_timer = None;
            if self.cb_at.is_none() {
                let wait = self.busy_cpu_wait();
                self.cb_at = Some(t + wait + self.wakeup_ns);
            }
        } else if self.work_at == Some(t) {
            self.work_at = None;
            self.process(t);
        } else if self.cb_at == Some(t) {
            self.cb_at = None;
            self.invoke_callbacks(t);
        }
    }

    /// Runs everything due by `t`.
    fn run_until(&mut self, t: u64) {
        while let Some(e) = self.next_event().filter(|e| *e <= t) {
            self.step(e);
        }
    }

    /// Whether a grace period is in flight or wanted at `now`.
    pub fn busy(&mut self, now: u64) -> bool {
        self.run_until(now);
        self.state != GpState::Idle || self.completed < self.needed
    }

    /// `call_srcu()` at `now`: returns at once.
    pub fn call_srcu(&mut self, now: u64) {
        self.run_until(now);
        self.start_if_needed(now, true, None);
    }

    /// `synchronize_srcu_expedited()` at `now`: how long the caller sleeps.
    pub fn synchronize_expedited(&mut self, now: u64) -> u64 {
        self.run_until(now);
        let id = self.next_waiter;
        self.next_waiter += 1;
        self.start_if_needed(now, false, Some(id));
        // Readers are bounded below certainty (set_readers), so every grace period ends; the
        // bound only guards against a defect turning into a hang.
        for _ in 0..10_000_000 {
            if let Some(i) = self.woken.iter().position(|(w, _)| *w == id) {
                let (_, at) = self.woken.swap_remove(i);
                return at.saturating_sub(now);
            }
            match self.next_event() {
                Some(e) => self.step(e),
                None => break,
            }
        }
        debug_assert!(false, "a synchronizer was never woken");
        0
    }

    /// How long an expedited synchronization takes on an idle SRCU with no readers: the
    /// grace-period work on the caller's CPU (a local hand-off, [`Srcu::queue_work`]), then
    /// two hand-offs across CPUs: `srcu_gp_end()` queues callback invocation on the boot
    /// CPU's `srcu_data` (an `SRCU_SIZE_SMALL` srcu_struct keeps every callback there;
    /// `srcu_schedule_cbs_sdp()` → `queue_work_on(sdp->cpu)`), and `srcu_invoke_callbacks()`
    /// → `wakeme_after_rcu()` → `complete()` wakes the caller back on its own CPU.
    pub fn idle_expedited_ns(&self) -> u64 {
        self.local_handoff_ns + 2 * self.wakeup_ns
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::LifecycleCosts;
    use crate::profile::Profile;

    const JIFFY: u64 = 4_000_000;
    const WAKE: u64 = 10_000;

    #[test]
    fn a_one_jiffy_delay_fires_on_the_second_tick() {
        // Ticks at 1, 5, 9 ms: armed at 2 ms (jiffies 1) for one jiffy, the timer is filed for
        // jiffies 3 and fires at 9 ms, 7 ms later.
        let s = Srcu::new(JIFFY, 1_000_000, WAKE, 0);
        assert_eq!(s.timer_fires(2_000_000, 1), 9_000_000);
        assert_eq!(s.timer_fires(4_999_999, 1), 9_000_000);
        assert_eq!(s.timer_fires(5_000_000, 1), 13_000_000);
    }

    #[test]
    fn an_expedited_sync_on_idle_srcu_takes_three_hand_offs_and_no_tick() {
        let mut s = Srcu::new(JIFFY, 1_000_000, WAKE, 0);
        assert_eq!(s.synchronize_expedited(2_000_000), s.idle_expedited_ns());
        assert_eq!(
            s.counts(),
            GpCounts {
                expedited: 1,
                normal: 0
            }
        );
    }

    /// The grace-period work runs on the synchronizer's CPU; callback invocation and the
    /// synchronizer's wake-up cross CPUs (the boot CPU's `srcu_data`).
    #[test]
    fn an_idle_expedited_sync_pays_one_local_hand_off_and_two_across_cpus() {
        let local = 1_000;
        let mut s = Srcu::new(JIFFY, 1_000_000, WAKE, 0);
        s.set_local_handoff(local);
        assert_eq!(s.synchronize_expedited(2_000_000), local + 2 * WAKE);
        assert_eq!(s.idle_expedited_ns(), local + 2 * WAKE);
        // A profile that gives the local hand-off prices lifecycle's swaps with it; one that
        // does not keeps three remote hand-offs.
        let vmx =
            LifecycleCosts::from_profile(&Profile::load("intel-spr-vmx").unwrap(), None).unwrap();
        assert!(vmx.local_handoff_ns < vmx.wakeup_ns);
        let mut p = Profile::load("intel-spr-vmx").unwrap();
        p.costs.remove("srcu_local_handoff_ns");
        let old = LifecycleCosts::from_profile(&p, None).unwrap();
        assert_eq!(old.local_handoff_ns, old.wakeup_ns);
    }

    #[test]
    fn an_expedited_sync_behind_a_normal_grace_period_waits_for_it_then_one_more() {
        let mut s = Srcu::new(JIFFY, 1_000_000, WAKE, 0);
        s.call_srcu(2_000_000); // GP1, work at the tick of 9 ms
        s.call_srcu(2_050_000); // needs GP2
        let wait = s.synchronize_expedited(2_100_000);
        // GP1's work (9 ms + hand-off) ends it and queues callback invocation; GP2's work runs
        // at once (hand-off) and ends it before the invocation runs, which then takes both
        // grace periods' callbacks; the caller wakes one hand-off later.
        assert_eq!(wait, 9_000_000 + 3 * WAKE - 2_100_000);
        assert_eq!(s.counts().expedited, 2, "the in-flight GP ends expedited");
        assert!(!s.busy(wait + 2_100_000 + JIFFY));
    }

    #[test]
    fn a_lone_normal_grace_period_hands_its_callbacks_over_a_jiffy_later() {
        let mut s = Srcu::new(JIFFY, 0, WAKE, 0);
        s.call_srcu(100);
        // Nothing wants it expedited: GP ends at the 8 ms tick, the callback timer is armed
        // for one jiffy and fires on the second tick after.
        s.run_until(8_000_000 + WAKE);
        assert_eq!(s.counts().normal, 1);
        assert_eq!(s.cb_timer, Some(16_000_000));
    }

    #[test]
    fn a_reader_delays_the_scan_and_the_wait_grows() {
        let wait = |occupancy: f64| {
            let mut waits = Vec::new();
            for seed in 0..50 {
                let mut s = Srcu::new(JIFFY, 0, WAKE, seed);
                s.set_readers(1, occupancy);
                s.call_srcu(100);
                waits.push(s.synchronize_expedited(200));
            }
            waits.iter().sum::<u64>() / 50
        };
        assert!(wait(0.9) > wait(0.0), "{} vs {}", wait(0.9), wait(0.0));
    }
}
