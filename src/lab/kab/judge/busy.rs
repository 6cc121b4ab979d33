//! A busy host: which boots it was busy during, and the verdicts that cannot stand on them.

use hvlab_core::host::Clock;
use hvlab_core::noise::BusyReason;

use crate::analysis::class::VariantClass;
use crate::analysis::metric_ab::{CountCall, MetricJudgement};
use crate::lab::kab::{BootSummary, BusyBoot};

use super::metric::MetricAb;
use super::verdict::VariantVerdict;
use super::{VariantAb, both_ran};

/// Not judged: the host was busy during the `busy` boots. Under TCG every time is
/// the emulator's, and a boot whose QEMU waited for a CPU is slowed as a whole: its
/// repetitions share the slowdown, so the rank test across them would take it for the
/// kernel's (a saturated host made qemu-order's KVM_CREATE_VM 0.20 → 0.82 jiffies, REGRESSED).
/// Stalls are found by their length, so their counts are no safer, and neither is a FIXED.
/// A variant a side has no samples of keeps its verdict: a failure (a page the dirty log lost)
/// is the kernel's answer, not a time a starved emulator stretched.
/// Neither is a NOT EXERCISED: its calls are counts of code that never ran, whatever the time.
pub(crate) fn not_judged_on_a_busy_host(v: &mut VariantVerdict, busy: &[BusyBoot]) {
    if !both_ran(&v.failures) || v.class == VariantClass::NotExercised {
        return;
    }
    v.class = VariantClass::NotDecided;
    v.host_busy = Some(busy.to_vec());
    // The judgments go with the class; the samples stay in the per-metric details.
    v.regressions.clear();
    v.improvements.clear();
    v.costs.clear();
}

/// The boots the host was busy during, none when it was quiet during all.
pub(in crate::lab::kab) fn host_busy_during(boots: &[BootSummary]) -> Vec<BusyBoot> {
    boots
        .iter()
        .enumerate()
        .filter_map(|(i, b)| {
            Some(BusyBoot {
                boot: i + 1,
                side: b.side.clone(),
                reasons: b.host_busy.clone()?,
            })
        })
        .collect()
}

/// Why a boot's times cannot be judged, when they cannot: other work kept tasks waiting for a
/// CPU (PSI) or a hypervisor below took time (steal). The load and the runnable count are not
/// asked: QEMU's single TCG thread beside one busy loop on two cores keeps a CPU of its own
/// (pressure 2% here), while two busy loops starve it (49%). On the instruction clock a
/// guest's time is the instructions it ran, whatever else the host runs: a busy host slows
/// the boot, not what it measures, so no boot on it is busy.
pub(crate) fn busy_during_boot(
    noise: &hvlab_core::noise::Noise,
    clock: Clock,
) -> Option<Vec<BusyReason>> {
    if !clock.load_moves_times() {
        return None;
    }
    let reasons: Vec<BusyReason> = noise
        .busy
        .iter()
        .copied()
        .filter(|r| matches!(r, BusyReason::Pressure { .. } | BusyReason::Steal { .. }))
        .collect();
    (!reasons.is_empty()).then_some(reasons)
}

/// Whether the variant's class rests on counts alone: every metric it judged is a count each
/// side repeated exactly (`pf_fixed` 512 on every repetition of A, 4097 on every one of B;
/// times shown but not judged, as under TCG), and no stall was seen. Such a count is the
/// kernel's arithmetic, not a time: a host busy enough to stretch every time cannot make the
/// MMU map 1 page per fault instead of 8, nor hide a change in a time nobody judged, so the
/// verdict stands. A stall count is found by a time's length and does not qualify.
pub(super) fn decided_by_exact_counts(v: &VariantAb) -> bool {
    let judged: Vec<&MetricAb> = v
        .metrics
        .iter()
        .filter(|m| !matches!(m.judgement, MetricJudgement::NotJudged { .. }))
        .collect();
    // A time on the instruction clock is a count too: of the instructions the guest ran.
    let exact = |m: &MetricAb| {
        m.metric != "stalls"
            && matches!(
                m.judgement,
                MetricJudgement::Count {
                    call: CountCall::Same | CountCall::Higher | CountCall::Lower
                } | MetricJudgement::InstructionClock { .. }
            )
    };
    !judged.is_empty() && judged.iter().all(|m| exact(m)) && v.stalls.is_empty()
}
