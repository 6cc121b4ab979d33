//! 001: "KVM: Avoid synchronize_srcu() in kvm_io_bus_register_dev()" (Keir Fraser, 7d9a0273),
//! the regression Nikita Kalyazin reported on it, and Sean Christopherson's lifecycle-keyed
//! fix. The published setup: Firecracker on x86 (VMX), CONFIG_HZ=100 (and 1000), the first
//! `KVM_CREATE_VCPU` of each microVM timed with strace, before and after 7d9a0273.
//!
//! The model runs the `lifecycle` scenario's `firecracker-order` on `x86-vmx-hz100` with each
//! registration strategy: the waits come from the SRCU machinery (`model::srcu`), the
//! per-ioctl work from assumed costs that no row's figure went into.

use super::{ModelFigure, Published, Row, Thread, ThreadInfo};
use crate::backend::host::HostInfo;
use crate::error::Error;
use crate::model::profile::Profile;
use crate::record::RunRecord;

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
    strategy: &str,
    hz: Option<u32>,
    seed: u64,
) -> Result<RunRecord, Error> {
    let mut sets = vec![
        format!("strategy={strategy}"),
        "vcpus=1".to_string(),
        "spacing=independent".to_string(),
    ];
    // The profile's own HZ (100) unless the row needs another.
    sets.extend(hz.map(|hz| format!("hz={hz}")));
    super::model_run(
        host,
        "lifecycle",
        profile,
        &["firecracker-order"],
        &sets,
        VMS,
        seed,
    )
}

/// The first `KVM_CREATE_VCPU` of each VM, ms (the setup creates one vCPU).
fn first_vcpu(run: &RunRecord) -> Result<&crate::record::MetricRecord, Error> {
    super::metric(run, "firecracker-order", "ioctl.KVM_CREATE_VCPU_ms")
}

impl Thread for Srcu {
    fn info(&self) -> &'static ThreadInfo {
        &ThreadInfo {
            id: "001",
            title: "call_srcu() in I/O-bus registration stalls the first KVM_CREATE_VCPU (x86, HZ=100)",
            scenario: "lifecycle",
            profile: PROFILE,
        }
    }

    fn rows(&self, host: &HostInfo, profile: &Profile, seed: u64) -> Result<Vec<Row>, Error> {
        let after = run(host, profile, "always-defer", None, seed)?;
        let before = run(host, profile, "always-sync", None, seed)?;
        let keyed = run(host, profile, "lifecycle-keyed", None, seed)?;
        let after_1000 = run(host, profile, "always-defer", Some(1000), seed)?;
        let before_1000 = run(host, profile, "always-sync", Some(1000), seed)?;
        let (a, b, k) = (
            first_vcpu(&after)?,
            first_vcpu(&before)?,
            first_vcpu(&keyed)?,
        );
        let (a1000, b1000) = (first_vcpu(&after_1000)?, first_vcpu(&before_1000)?);
        let setup = |what: &str, hz: u32| {
            format!("Firecracker order on x86 VMX, HZ={hz}, {what}; {VMS} microVMs")
        };
        let shortest_jiffies = a.min / 10.0;
        let registration = super::metric(&before, "firecracker-order", "ioctl.KVM_IOEVENTFD_ms")?;
        let devices = 8.0;
        let rows = vec![
            Row::judge(
                "first KVM_CREATE_VCPU after 7d9a0273",
                setup("call_srcu() in registration", 100),
                Published {
                    low: 10.0,
                    high: 25.182,
                    unit: "ms",
                    source: "Nikita: \"consistently greater than 1 GP\" (10 ms at HZ=100); strace <0.025182>",
                },
                ModelFigure::of(a, 1.0, "ms"),
                None,
            ),
            Row::judge(
                "shortest first KVM_CREATE_VCPU after 7d9a0273, in grace periods",
                setup(
                    "call_srcu() in registration; why more than one GP: the irqchip's normal \
                     grace period queues its work with a one-jiffy delay, which the timer wheel \
                     files one bucket late (calc_index()), so it runs on the second tick, 1-2 \
                     jiffies on; the vCPU's expedited sync needs the grace period after it",
                    100,
                ),
                Published {
                    low: 1.0,
                    high: 2.52,
                    unit: "jiffies",
                    source: "Nikita: \"the delay is consistently greater than 1 GP\"; the strace sample is 2.5",
                },
                ModelFigure::from_values(&[shortest_jiffies], "jiffies"),
                Some(
                    "the grace period never ends sooner than one jiffy after the irqchip's \
                     registration started it, but KVM_CREATE_VCPU starts ~0.1 ms later (the PIT \
                     and the VMM in between), so its own duration can fall a hair under a jiffy",
                ),
            ),
            Row::judge(
                "regression of the first KVM_CREATE_VCPU, HZ=100",
                setup("after minus before 7d9a0273", 100),
                Published {
                    low: 15.0,
                    high: 25.0,
                    unit: "ms",
                    source: "Nikita: \"a regression of ~20 ms to the first KVM_CREATE_VCPU call\"",
                },
                ModelFigure::from_values(&[a.median - b.median], "ms"),
                Some(
                    "the wait runs to the second tick after the irqchip's registration \
                     (timer-wheel round-up of the one-jiffy delay), so it is uniform over 1-2 \
                     jiffies when the microVM starts at a random point of a jiffy: median 15 ms. \
                     Where Firecracker's KVM_CREATE_IRQCHIP falls within a jiffy is not in the \
                     thread, and the model does not make it up",
                ),
            ),
            Row::judge(
                "regression of the first KVM_CREATE_VCPU, HZ=1000",
                setup("after minus before 7d9a0273", 1000),
                Published {
                    // "in the order of 1 ms": within half a decade of 1 ms.
                    low: 0.316,
                    high: 3.16,
                    unit: "ms",
                    source: "Nikita: \"with HZ=1000 ... the regression is in the order of 1 ms\"",
                },
                ModelFigure::from_values(&[a1000.median - b1000.median], "ms"),
                None,
            ),
            Row::judge(
                "first KVM_CREATE_VCPU before 7d9a0273",
                setup("synchronize_srcu_expedited() in registration", 100),
                Published {
                    low: 0.137,
                    high: 0.137,
                    unit: "ms",
                    source: "Nikita, before the patch: strace <0.000137>",
                },
                ModelFigure::of(b, 1.0, "ms"),
                Some(
                    "no grace period is waited for: the time is vCPU and memslot creation work \
                     (each memslot swap with an expedited grace period on idle SRCU), whose \
                     costs are assumed (intel-spr-vmx), not measured on the thread's host",
                ),
            ),
            Row::judge(
                "first KVM_CREATE_VCPU with the lifecycle-keyed fix",
                setup("Sean's patch: sync while created_vcpus == 0", 100),
                Published {
                    low: 0.137,
                    high: 0.137,
                    unit: "ms",
                    source: "Sean: before vCPUs exist \"simply synchronize and free\": the pre-7d9a0273 path, 0.137 ms in Nikita's strace",
                },
                ModelFigure::of(k, 1.0, "ms"),
                Some(
                    "the fix takes the pre-7d9a0273 path before the first vCPU, so it shows the \
                     same assumed per-ioctl work as the row above; no grace period is waited for",
                ),
            ),
            Row::judge(
                "one device registration before 7d9a0273",
                setup(
                    "KVM_IOEVENTFD with synchronize_srcu_expedited(), no vCPU running",
                    100,
                ),
                Published {
                    low: 6.0,
                    high: 16.0,
                    unit: "us",
                    source: "Nikita: \"each takes at most 16 us, but most commonly ~6 us\"",
                },
                ModelFigure::of(registration, 1e3 / devices, "us"),
                Some(
                    "an expedited grace period on idle SRCU is three hand-offs to sleeping tasks \
                     (grace-period work, callback invocation, the caller); the profile assumes 5 \
                     us per hand-off on a bare-metal server, not measured on the thread's host",
                ),
            ),
        ];
        Ok(rows)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures the rows judge: none may appear in the provenance of the profile the rows
    /// run on.
    const JUDGED: &[&str] = &[
        "25.182", "0.025182", "0.137", "137", "~20", "20 ms", "16 us", "6 us", "1 ms", "10 ms",
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

    #[test]
    fn every_row_matches_or_says_why() {
        let host = crate::backend::host::probe_with(String::new(), Default::default());
        let report = super::super::report(&Srcu, &host, 1).unwrap();
        assert_eq!(report.rows.len(), 7);
        assert_eq!(report.unexplained(), 0, "{:#?}", report.rows);
        // The mechanism rows are predictions that land inside the thread's ranges.
        for quantity in [
            "first KVM_CREATE_VCPU after 7d9a0273",
            "regression of the first KVM_CREATE_VCPU, HZ=1000",
        ] {
            let row = report.rows.iter().find(|r| r.quantity == quantity).unwrap();
            assert_eq!(row.agreement, super::super::Agreement::Within, "{row:#?}");
        }
    }
}
