//! 001: "KVM: Avoid synchronize_srcu() in kvm_io_bus_register_dev()" (Keir Fraser, 7d9a0273),
//! the regression Nikita Kalyazin reported on it, and Sean Christopherson's lifecycle-keyed
//! fix. The published setup: Firecracker on x86 (VMX), CONFIG_HZ=100 (and 1000), the first
//! `KVM_CREATE_VCPU` of each microVM timed with strace, before and after 7d9a0273.
//!
//! The model runs the `lifecycle` scenario's `firecracker-order` on `x86-vmx-hz100` with each
//! registration strategy: the waits come from the SRCU machinery (`model::lifecycle`), the
//! per-ioctl work from assumed costs that no row's figure went into.

use super::{ModelFigure, Published, Row, Thread, ThreadInfo};
use crate::lab::Error;
use crate::model::profile::Profile;
use crate::record::RunRecord;
use crate::scenario::Kind;
use crate::scenario::lifecycle::LifecycleParams;
use hvlab_core::host::HostInfo;
use hvlab_core::lifecycle::Strategy;

/// The thread.
pub struct Srcu;

/// The profile of the thread's host.
const PROFILE: &str = "x86-vmx-hz100";
/// Independent microVMs per setup: each a fresh process, so the first registration falls
/// anywhere in a jiffy.
const VMS: u32 = 200;

fn run(
    host: &HostInfo,
    profile: &Profile,
    strategy: Strategy,
    hz: Option<u32>,
    seed: u64,
) -> Result<RunRecord, Error> {
    run_with(host, profile, strategy, hz, 1, seed)
}

/// The setup with `vcpus` vCPUs at the profile's HZ.
fn run_vcpus(
    host: &HostInfo,
    profile: &Profile,
    strategy: Strategy,
    vcpus: u32,
    seed: u64,
) -> Result<RunRecord, Error> {
    run_with(host, profile, strategy, None, vcpus, seed)
}

fn run_with(
    host: &HostInfo,
    profile: &Profile,
    strategy: Strategy,
    hz: Option<u32>,
    vcpus: u32,
    seed: u64,
) -> Result<RunRecord, Error> {
    let params = LifecycleParams {
        strategy,
        vcpus,
        back_to_back: false,
        // The profile's own HZ (100) unless the row needs another.
        hz,
        ..LifecycleParams::default()
    };
    super::model_run(host, params, profile, &["firecracker-order"], VMS, seed)
}

/// The experiments: Nikita's strace runs at HZ=100, and what he states besides.
const STRACE_100: &str = "001/firecracker-strace-hz100";

/// Why the first vCPU waits more than one grace period, and as long as 2.5 jiffies.
const WHY_OVER_ONE_GP: &str = "the irqchip's call_srcu() starts a normal grace period whose \
     work is queued with one jiffy of delay, which the timer wheel files one bucket late \
     (calc_index()): it fires on the second tick, 1-2 jiffies on; on a busy host the kworker \
     that timer wakes waits for the CPU's running task (up to the next tick), so the wait \
     spans 1-3 jiffies and its shortest over the microVMs stays above one";

/// Why an idle expedited grace period costs what the model says.
const WHY_REGISTRATION: &str = "an expedited grace period on idle SRCU is the grace-period \
     work on the caller's own CPU (rcu_gp_wq is per-CPU: srcu_funnel_gp_start() → \
     queue_delayed_work() with no delay picks the queuing CPU; a local hand-off, ~1.1 us from \
     a bare-metal pinned ping-pong), then two hand-offs across CPUs: srcu_gp_end() queues \
     callback invocation on the boot CPU's srcu_data (SRCU_SIZE_SMALL), and \
     srcu_invoke_callbacks() → complete() wakes the caller back, each priced at the profile's \
     assumed 5 us wake-up of an idle core (not measured on the thread's host). ~6 us for the \
     whole registration needs the VMM thread on the boot CPU (every hand-off local, ~3.4 us in \
     all) or cross-CPU wake-ups near 2 us: the thread says neither, so the model keeps the \
     general case";

/// The second `KVM_CREATE_VCPU` of each VM, ms: the run reports both vCPUs' time as one
/// metric, so the second is that less the first of the one-vCPU run of the same seed (the
/// same microVMs, built alike up to the second vCPU).
fn second_vcpu(two: &RunRecord, one: &RunRecord) -> Result<ModelFigure, Error> {
    let both = &first_vcpu(two)?.samples;
    let first = &first_vcpu(one)?.samples;
    let second: Vec<f64> = both.iter().zip(first).map(|(b, f)| b - f).collect();
    Ok(ModelFigure::from_values(&second, "ms"))
}

/// The first `KVM_CREATE_VCPU` of each VM, ms (the setup creates one vCPU).
fn first_vcpu(run: &RunRecord) -> Result<&crate::record::MetricRecord, Error> {
    super::metric(run, "firecracker-order", "ioctl.KVM_CREATE_VCPU_ms")
}

/// The thread's setup on its reporter's host (Firecracker order, separate microVMs, x86 VMX
/// at HZ=100) with one registration strategy: what a change to the strategy does where the
/// regression was reported.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OnReportersHost {
    /// The profile of the reporter's host.
    pub profile: &'static str,
    /// The setup, in words.
    pub setup: String,
    /// The variant run.
    pub variant: &'static str,
    /// The strategy.
    pub strategy: &'static str,
    /// The VM's time to its first `KVM_RUN` exit, ms.
    pub ready_ms: ModelFigure,
    /// The first `KVM_CREATE_VCPU`, ms (the thread's figure).
    pub first_vcpu_ms: ModelFigure,
    /// SRCU stalls per VM.
    pub stalls: ModelFigure,
}

/// The thread's published setup with `strategy`, on its host's profile.
pub fn on_reporters_host(
    host: &HostInfo,
    strategy: Strategy,
    seed: u64,
) -> Result<OnReportersHost, Error> {
    let profile = super::profile(PROFILE)?;
    let r = run(host, &profile, strategy, None, seed)?;
    let variant = "firecracker-order";
    Ok(OnReportersHost {
        profile: PROFILE,
        setup: format!(
            "Firecracker order on x86 VMX, HZ=100, one vCPU, {VMS} separate microVMs (thread 001's host)"
        ),
        variant,
        strategy: crate::scenario::lifecycle::strategy_name(strategy),
        ready_ms: ModelFigure::of(super::metric(&r, variant, "ready_ms")?, 1.0, "ms"),
        first_vcpu_ms: ModelFigure::of(first_vcpu(&r)?, 1.0, "ms"),
        stalls: ModelFigure::of(super::metric(&r, variant, "stalls")?, 1.0, "count"),
    })
}

impl Thread for Srcu {
    fn info(&self) -> &'static ThreadInfo {
        &ThreadInfo {
            id: "001",
            title: "call_srcu() in I/O-bus registration stalls the first KVM_CREATE_VCPU (x86, HZ=100)",
            scenario: Kind::Lifecycle,
            profile: PROFILE,
        }
    }

    fn rows(&self, host: &HostInfo, profile: &Profile, seed: u64) -> Result<Vec<Row>, Error> {
        let figures = Figures::measure(host, profile, seed)?;
        let mut rows = grace_period_rows(&figures);
        rows.extend(vcpu_creation_rows(&figures));
        rows.extend(registration_rows(&figures));
        Ok(rows)
    }
}

/// What the model's runs of the setup give the rows (ms).
struct Figures {
    /// The first `KVM_CREATE_VCPU` after 7d9a0273 (`call_srcu()`), HZ=100.
    after: ModelFigure,
    /// The first `KVM_CREATE_VCPU` before it (`synchronize_srcu_expedited()`), HZ=100.
    before: ModelFigure,
    /// The first `KVM_CREATE_VCPU` after 7d9a0273, HZ=1000.
    after_1000: ModelFigure,
    /// The first `KVM_CREATE_VCPU` before it, HZ=1000.
    before_1000: ModelFigure,
    /// The second `KVM_CREATE_VCPU` of two, before 7d9a0273.
    second_before: ModelFigure,
    /// The second `KVM_CREATE_VCPU` of two, after it.
    second_after: ModelFigure,
    /// A VM's `KVM_IOEVENTFD` registrations before 7d9a0273, all of them.
    registrations: ModelFigure,
}

impl Figures {
    /// The setup on the model before and after 7d9a0273: one vCPU at HZ=100 and 1000, and two
    /// vCPUs at HZ=100.
    fn measure(host: &HostInfo, profile: &Profile, seed: u64) -> Result<Figures, Error> {
        let ms = |m: &crate::record::MetricRecord| ModelFigure::of(m, 1.0, "ms");
        let after = run(host, profile, Strategy::AlwaysDefer, None, seed)?;
        let before = run(host, profile, Strategy::AlwaysSync, None, seed)?;
        let after_1000 = run(host, profile, Strategy::AlwaysDefer, Some(1000), seed)?;
        let before_1000 = run(host, profile, Strategy::AlwaysSync, Some(1000), seed)?;
        let (a, b) = (ms(first_vcpu(&after)?), ms(first_vcpu(&before)?));
        let (a1000, b1000) = (ms(first_vcpu(&after_1000)?), ms(first_vcpu(&before_1000)?));
        let before2 = run_vcpus(host, profile, Strategy::AlwaysSync, 2, seed)?;
        let after2 = run_vcpus(host, profile, Strategy::AlwaysDefer, 2, seed)?;
        let registrations = ms(super::metric(
            &before,
            "firecracker-order",
            "ioctl.KVM_IOEVENTFD_ms",
        )?);
        Ok(Figures {
            second_before: second_vcpu(&before2, &before)?,
            second_after: second_vcpu(&after2, &after)?,
            after: a,
            before: b,
            after_1000: a1000,
            before_1000: b1000,
            registrations,
        })
    }
}

/// The setup in words, for a row.
fn setup(what: &str, hz: u32) -> String {
    format!("Firecracker order on x86 VMX, HZ={hz}, {what}; {VMS} microVMs")
}

/// The first vCPU's wait after 7d9a0273, in grace periods and at its longest, and the
/// regression it makes at HZ=100 and 1000.
fn grace_period_rows(f: &Figures) -> Vec<Row> {
    let jiffy_ms = 1e3 / 100.0;
    let shortest_jiffies = f.after.min / jiffy_ms;
    vec![
        Row::judge(
            "shortest first KVM_CREATE_VCPU after 7d9a0273, in grace periods",
            setup(
                "call_srcu() in registration; the shortest of the microVMs",
                100,
            ),
            Published::above(
                1.0,
                "jiffies",
                "Nikita: \"the delay is consistently greater than 1 GP\"",
            ),
            ModelFigure::from_values(&[shortest_jiffies], "jiffies"),
            Some(WHY_OVER_ONE_GP),
        )
        .of(STRACE_100),
        Row::judge(
            "longest first KVM_CREATE_VCPU after 7d9a0273 (the strace sample must be reachable)",
            setup(
                "call_srcu() in registration; the longest of the microVMs",
                100,
            ),
            Published::above(
                25.182,
                "ms",
                "Nikita, after the patch: strace KVM_CREATE_VCPU <0.025182>",
            ),
            ModelFigure::from_values(&[f.after.max], "ms"),
            None,
        )
        .of(STRACE_100),
        Row::judge(
            "regression of the first KVM_CREATE_VCPU, HZ=100",
            setup("after minus before 7d9a0273 (medians)", 100),
            Published::about(
                20.0,
                "ms",
                "Nikita: \"a regression of ~20 ms to the first KVM_CREATE_VCPU call\"",
            ),
            ModelFigure::from_values(&[f.after.median - f.before.median], "ms"),
            None,
        )
        .of(STRACE_100),
        Row::judge(
            "regression of the first KVM_CREATE_VCPU, HZ=1000",
            setup("after minus before 7d9a0273 (medians)", 1000),
            Published::order_of(
                1.0,
                "ms",
                "Nikita: \"with HZ=1000 ... the regression is in the order of 1 ms\"",
            ),
            ModelFigure::from_values(&[f.after_1000.median - f.before_1000.median], "ms"),
            None,
        )
        .of("001/hz1000"),
    ]
}

/// vCPU creation that waits for no grace period: the first before 7d9a0273, the second in
/// either kernel.
fn vcpu_creation_rows(f: &Figures) -> Vec<Row> {
    vec![
        Row::judge(
            "first KVM_CREATE_VCPU before 7d9a0273",
            setup("synchronize_srcu_expedited() in registration", 100),
            Published::about(
                0.137,
                "ms",
                "Nikita, before the patch: strace KVM_CREATE_VCPU 0 <0.000137> (one sample)",
            ),
            f.before.clone(),
            Some(
                "no grace period is waited for: the time is vCPU and memslot creation work \
                 (each memslot swap with an expedited grace period on idle SRCU), whose \
                 costs are assumed (intel-spr-vmx), not measured on the thread's host",
            ),
        )
        .of(STRACE_100),
        Row::judge(
            "second KVM_CREATE_VCPU, before and after 7d9a0273",
            setup("two vCPUs; the second adds no memslot", 100),
            Published::samples(
                &[0.046, 0.031],
                "ms",
                "Nikita: strace KVM_CREATE_VCPU 1 <0.000046> before, <0.000031> after",
            ),
            ModelFigure::from_values(&[f.second_before.median, f.second_after.median], "ms"),
            Some(
                "the second vCPU waits for nothing in either kernel; its time is \
                 kvm_vm_ioctl_create_vcpu() → kvm_arch_vcpu_create() (the vCPU, its VMCS, \
                 MMU and LAPIC pages, the guest FPU state, the vCPU fd), priced at the \
                 profile's assumed 80 us (intel-spr-vmx, a bare-metal estimate); no \
                 independent VMX figure is at hand: on this PVM host, loaded, the second \
                 vCPU of firecracker-order measured ~55 us (medians of 10 VMs with 2 and \
                 1 vCPUs, 0.142 and 0.087 ms), nested and not the thread's machine",
            ),
        )
        .of(STRACE_100),
    ]
}

/// One device registration before 7d9a0273, no vCPU running: most commonly and at longest.
fn registration_rows(f: &Figures) -> Vec<Row> {
    let devices = 8.0;
    vec![
        Row::judge(
            "one device registration before 7d9a0273, most common",
            setup(
                "KVM_IOEVENTFD with synchronize_srcu_expedited(), no vCPU running (median)",
                100,
            ),
            Published::about(
                6.0,
                "us",
                "Nikita: \"each takes at most 16 us, but most commonly ~6 us\"",
            ),
            ModelFigure::from_values(&[f.registrations.median * 1e3 / devices], "us"),
            Some(WHY_REGISTRATION),
        )
        .of("001/registrations"),
        Row::judge(
            "one device registration before 7d9a0273, longest",
            setup(
                "KVM_IOEVENTFD with synchronize_srcu_expedited(), no vCPU running (longest)",
                100,
            ),
            Published::below(
                16.0,
                "us",
                "Nikita: \"each takes at most 16 us, but most commonly ~6 us\"",
            ),
            ModelFigure::from_values(&[f.registrations.max * 1e3 / devices], "us"),
            Some(WHY_REGISTRATION),
        )
        .of("001/registrations"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures the rows judge: none may appear in the provenance of the profile the rows
    /// run on.
    const JUDGED: &[&str] = &[
        "25.182",
        "0.025182",
        "0.137",
        "137",
        "~20",
        "20 ms",
        "16 us",
        "6 us",
        "1 ms",
        "10 ms",
        "0.046",
        "0.031",
        "2.5 jiffies",
    ];

    #[test]
    fn no_profile_value_cites_a_figure_a_row_judges() {
        let p = super::super::assert_read_inputs_cite_none(&Srcu, JUDGED);
        let read = p.keys_read();
        assert!(read.contains("srcu_wakeup_ns"), "{read:?}");
        // Values fitted for other threads' mechanisms share the profile; none is read here.
        let fitted = super::super::fitted_in(&[&p]);
        assert!(fitted.is_empty(), "{fitted:?}");
        // The check can fail: the fitted values of the base are in the profile.
        assert!(p.costs.values().any(|c| c.fitted_on.is_some()));
    }

    /// The grace-period mechanism (the timer wheel's round-up, a busy host's kworker
    /// wait) gives Nikita's figures: every first vCPU waits more than one grace period, the
    /// 25.18 ms sample is reachable, the regressions land in their ranges.
    #[test]
    fn the_grace_period_rows_are_within_the_threads_words() {
        let host = hvlab_host::probe::probe_with(String::new(), Default::default());
        let report = super::super::report(&Srcu, &host, 1).unwrap();
        assert_eq!(report.rows.len(), 8);
        for quantity in [
            "shortest first KVM_CREATE_VCPU",
            "longest first KVM_CREATE_VCPU",
            "regression of the first KVM_CREATE_VCPU, HZ=100",
            "regression of the first KVM_CREATE_VCPU, HZ=1000",
        ] {
            let row = report
                .rows
                .iter()
                .find(|r| r.quantity.starts_with(quantity))
                .unwrap();
            assert_eq!(row.agreement, super::super::Agreement::Within, "{row:#?}");
        }
    }

    /// An idle registration before 7d9a0273 is the ioctl's own work and an expedited grace
    /// period on idle SRCU: one hand-off on the caller's CPU (the grace-period work) and two
    /// across CPUs (callback invocation on the boot CPU's srcu_data, the caller's wake-up).
    #[test]
    fn an_idle_registration_pays_one_local_hand_off_and_two_across_cpus() {
        let host = hvlab_host::probe::probe_with(String::new(), Default::default());
        let p = super::super::profile(PROFILE).unwrap();
        let rows = Srcu.rows(&host, &p, 1).unwrap();
        let us = |k: &str| p.get(k, "test").unwrap() / 1e3;
        let expected =
            us("ioctl_ioeventfd_ns") + us("srcu_local_handoff_ns") + 2.0 * us("srcu_wakeup_ns");
        for quantity in [
            "registration before 7d9a0273, most common",
            "registration before 7d9a0273, longest",
        ] {
            let row = rows.iter().find(|r| r.quantity.contains(quantity)).unwrap();
            assert!(
                (row.model.median - expected).abs() < 0.01,
                "{row:#?} vs {expected}"
            );
        }
        // Cheaper than three hand-offs across CPUs, the price before the local one was told
        // apart.
        assert!(expected < us("ioctl_ioeventfd_ns") + 3.0 * us("srcu_wakeup_ns"));
    }

    /// On an idle host (no busy CPU) the wait is the timer alone: 1-2 jiffies after the
    /// irqchip, so the vCPU, starting a little later, can wait a hair under one grace period
    /// and never reaches 2.5 jiffies. The busy host is what the thread's figures need.
    #[test]
    fn an_idle_host_cannot_give_the_threads_longest_sample() {
        let host = hvlab_host::probe::probe_with(String::new(), Default::default());
        let mut p = super::super::profile(PROFILE).unwrap();
        p.costs.get_mut("srcu_timer_cpu_busy").unwrap().value = 0.0;
        let after = run(&host, &p, Strategy::AlwaysDefer, None, 1).unwrap();
        let a = first_vcpu(&after).unwrap();
        assert!(a.max < 25.182, "{}", a.max);
        assert!(a.min < 10.0, "{}", a.min);
    }
}
