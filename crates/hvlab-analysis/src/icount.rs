//! A time on QEMU's instruction clock (`-icount shift=0`), judged as the exact measurement it
//! is: the guest's time is the instructions it ran, the same from one repetition and one boot
//! to the next up to what the guest itself does differently (a tick landing inside an ioctl, a
//! cache refilled). No rank test and no family correction: B differs when its median moved by
//! more than the spread either side showed and by more than the metric's declared tolerance.

use serde::Serialize;

use crate::statistics::median;

/// How far a time on the instruction clock may move without a change to the code it runs:
/// the larger of a share of A's median and a floor in instructions.
///
/// Two parts because two things move such a time. What scales with the work (timer
/// interrupts landing inside a long time, more of them the longer it is) is a share: every
/// time of 100 µs or more moved within 0.31% across two boots of one kernel, every time of
/// 10 µs or more within 1.1%. What does not scale is a fixed handful of instructions (a lock
/// taken on its slow path once, a tick's phase): a 2.4 µs ioctl moved 150 instructions (6%)
/// between the same two boots. The larger of the two, not their sum: each part covers its own
/// range of lengths (the floor below floor/relative instructions, the share above), and the
/// sum would hide a change of the floor's size on every time near the crossover.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct IcountTolerance {
    /// The share of A's median (0.01: 1%).
    pub relative: f64,
    /// The floor, in instructions.
    pub floor_insn: f64,
}

impl IcountTolerance {
    /// A time's tolerance unless its scenario declares another: 1%, and at least 200
    /// instructions (above the 150 a short ioctl moved between boots; under the 212–323 an
    /// exit path that does a little more work adds to every exit).
    pub const TIME: IcountTolerance = IcountTolerance {
        relative: 0.01,
        floor_insn: 200.0,
    };

    /// The tolerance, in instructions, of a time whose median on A is `a_insn`.
    pub fn insn(&self, a_insn: f64) -> f64 {
        (self.relative * a_insn.abs()).max(self.floor_insn)
    }
}

/// Instructions per unit of a time on the instruction clock (`insn`, `kinsn`, `Minsn`,
/// `Ginsn`), `None` for any other unit.
pub fn insn_per(unit: &str) -> Option<f64> {
    match unit {
        "insn" => Some(1.0),
        "kinsn" => Some(1e3),
        "Minsn" => Some(1e6),
        "Ginsn" => Some(1e9),
        _ => None,
    }
}

/// One side's samples of a time, one list per boot (each boot's repetitions), in
/// instructions.
pub type Boots<'a> = &'a [Vec<f64>];

/// A side's boots whose medians differ by more than the repetitions spread within any boot:
/// something in the guest is not deterministic, and the metric's tolerance is widened to the
/// difference.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BootsDisagree {
    /// The side: 0 for A, 1 for B.
    pub side: usize,
    /// The lowest and the highest boot median, in instructions.
    pub medians_insn: [f64; 2],
    /// The largest range (max − min) of the repetitions within one boot, in instructions.
    pub within_insn: f64,
}

impl BootsDisagree {
    /// How far apart the boots' medians are, in instructions.
    pub fn apart_insn(&self) -> f64 {
        self.medians_insn[1] - self.medians_insn[0]
    }
}

/// What the instruction clock says of B against A.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum IcountCall {
    /// Within the spread or the tolerance.
    Same,
    /// B ran more instructions, beyond both.
    Higher,
    /// B ran fewer, beyond both.
    Lower,
}

/// A time on the instruction clock, B against A, judged exactly ([`judge`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct IcountAb {
    /// Medians over all repetitions of all boots, A and B, in instructions.
    pub median_insn: [f64; 2],
    /// B's median minus A's, in instructions.
    pub delta_insn: f64,
    /// The same as a share of A's median, in % (`None` when A's median is 0).
    pub delta_pct: Option<f64>,
    /// Each side's range (max − min) over all its repetitions and boots, in instructions.
    pub range_insn: [f64; 2],
    /// The spread the change must exceed: the larger side's range.
    pub spread_insn: f64,
    /// The metric's declared tolerance.
    pub tolerance: IcountTolerance,
    /// The tolerance applied, in instructions: the declared one at A's median, widened to the
    /// boots' disagreement where a side's boots disagree.
    pub tolerance_insn: f64,
    /// Boots per side.
    pub boots: [usize; 2],
    /// Each side whose boots disagree.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub boots_disagree: Vec<BootsDisagree>,
    /// The call.
    pub call: IcountCall,
}

impl IcountAb {
    /// The applied tolerance as a share of A's median, in % (`None` when A's median is 0).
    pub fn tolerance_pct(&self) -> Option<f64> {
        (self.median_insn[0] != 0.0).then(|| 100.0 * self.tolerance_insn / self.median_insn[0])
    }
}

fn range(x: &[f64]) -> f64 {
    let lo = x.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if x.is_empty() { 0.0 } else { hi - lo }
}

/// Whether one side's boots disagree: more than one boot, and their medians further apart
/// than the repetitions spread within the widest boot.
pub fn boots_disagree(side: usize, boots: Boots<'_>) -> Option<BootsDisagree> {
    let medians: Vec<f64> = boots
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| median(b))
        .collect();
    if medians.len() < 2 {
        return None;
    }
    let within = boots.iter().map(|b| range(b)).fold(0.0, f64::max);
    let lo = medians.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = medians.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (hi - lo > within).then_some(BootsDisagree {
        side,
        medians_insn: [lo, hi],
        within_insn: within,
    })
}

/// Judges B against A on the instruction clock: `a` and `b` are each side's boots'
/// repetitions in instructions. B differs when `|median B − median A|` exceeds both the
/// spread (the larger of the two sides' ranges over all their repetitions and boots) and the
/// tolerance (`tolerance` at A's median, widened to a disagreement between one side's boots).
///
/// The larger range, not the sum: both sides run on one deterministic machine, so the wider
/// side's range is how far this kernel's own noise reaches, and two medians of one such noise
/// lie within it; the sum would hide a change twice as large as either side's noise.
pub fn judge(a: Boots<'_>, b: Boots<'_>, tolerance: IcountTolerance) -> IcountAb {
    let flat = |boots: Boots<'_>| -> Vec<f64> { boots.iter().flatten().copied().collect() };
    let (xa, xb) = (flat(a), flat(b));
    let median_insn = [median(&xa), median(&xb)];
    let delta_insn = median_insn[1] - median_insn[0];
    let range_insn = [range(&xa), range(&xb)];
    let spread_insn = range_insn[0].max(range_insn[1]);
    let boots_disagree: Vec<BootsDisagree> = [a, b]
        .iter()
        .enumerate()
        .filter_map(|(side, boots)| boots_disagree(side, boots))
        .collect();
    let tolerance_insn = boots_disagree
        .iter()
        .map(BootsDisagree::apart_insn)
        .fold(tolerance.insn(median_insn[0]), f64::max);
    let beyond = delta_insn.abs() > spread_insn && delta_insn.abs() > tolerance_insn;
    let call = match (beyond, delta_insn > 0.0) {
        (false, _) => IcountCall::Same,
        (true, true) => IcountCall::Higher,
        (true, false) => IcountCall::Lower,
    };
    let count = |boots: Boots<'_>| boots.iter().filter(|b| !b.is_empty()).count();
    IcountAb {
        median_insn,
        delta_insn,
        delta_pct: (median_insn[0] != 0.0).then(|| 100.0 * delta_insn / median_insn[0]),
        range_insn,
        spread_insn,
        tolerance,
        tolerance_insn,
        boots: [count(a), count(b)],
        boots_disagree,
        call,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn boot(center: f64, half: f64) -> Vec<f64> {
        (0..5)
            .map(|i| center - half + 2.0 * half * f64::from(i) / 4.0)
            .collect()
    }

    /// 323 instructions more on every exit of about 6,460 is +5.0%, beyond ±5 of spread and
    /// the 1% tolerance: higher. The same kernel twice, each side ±5: the same.
    #[test]
    fn an_exit_323_instructions_longer_is_higher_and_an_a_a_the_same() {
        let a = [boot(6461.0, 5.0)];
        let b = [boot(6784.0, 5.0)];
        let j = judge(&a, &b, IcountTolerance::TIME);
        assert_eq!(j.call, IcountCall::Higher, "{j:?}");
        assert!((j.delta_insn - 323.0).abs() < 1e-9, "{j:?}");
        assert!((j.delta_pct.unwrap() - 5.0).abs() < 0.01, "{j:?}");
        assert!((j.spread_insn - 10.0).abs() < 1e-9);
        assert!((j.tolerance_insn - 200.0).abs() < 1e-9);
        let aa = judge(&a, &[boot(6464.0, 5.0)], IcountTolerance::TIME);
        assert_eq!(aa.call, IcountCall::Same, "{aa:?}");
        let fewer = judge(&b, &a, IcountTolerance::TIME);
        assert_eq!(fewer.call, IcountCall::Lower, "{fewer:?}");
    }

    /// A change within the tolerance is the same however tight the spread; one within the
    /// spread the same however large the tolerance allows.
    #[test]
    fn a_change_must_exceed_both_the_spread_and_the_tolerance() {
        let a = [vec![100_000.0; 5]];
        let within_tolerance = judge(&a, &[vec![100_900.0; 5]], IcountTolerance::TIME);
        assert_eq!(within_tolerance.call, IcountCall::Same);
        let beyond = judge(&a, &[vec![101_100.0; 5]], IcountTolerance::TIME);
        assert_eq!(beyond.call, IcountCall::Higher);
        let tight = IcountTolerance {
            relative: 0.0,
            floor_insn: 1.0,
        };
        let within_spread = judge(&[boot(5000.0, 30.0)], &[boot(5040.0, 10.0)], tight);
        assert_eq!(within_spread.call, IcountCall::Same, "{within_spread:?}");
        assert!((within_spread.spread_insn - 60.0).abs() < 1e-9);
    }

    /// Two boots of A 150 instructions apart with ±5 within each: they disagree, and the
    /// tolerance widens to 150 even where the declared one is smaller, so B at the first
    /// boot's median plus 100 is the same.
    #[test]
    fn boots_that_disagree_widen_the_tolerance() {
        let tight = IcountTolerance {
            relative: 0.0,
            floor_insn: 20.0,
        };
        let a = [boot(2400.0, 5.0), boot(2550.0, 5.0)];
        let d = boots_disagree(0, &a).expect("disagree");
        assert_eq!(d.medians_insn, [2400.0, 2550.0]);
        assert!((d.within_insn - 10.0).abs() < 1e-9);
        let j = judge(&a, &[boot(2600.0, 5.0)], tight);
        assert_eq!(j.boots_disagree, vec![d]);
        assert!((j.tolerance_insn - 150.0).abs() < 1e-9, "{j:?}");
        assert_eq!(j.call, IcountCall::Same, "{j:?}");
        // Agreeing boots (within each other's repetitions) are no finding.
        assert_eq!(
            boots_disagree(0, &[boot(2400.0, 5.0), boot(2403.0, 5.0)]),
            None
        );
        assert_eq!(boots_disagree(0, &[boot(2400.0, 5.0)]), None);
    }

    #[test]
    fn the_tolerance_is_the_larger_of_its_share_and_its_floor() {
        let t = IcountTolerance::TIME;
        assert!((t.insn(5_000.0) - 200.0).abs() < 1e-9);
        assert!((t.insn(1_000_000.0) - 10_000.0).abs() < 1e-9);
        assert_eq!(insn_per("kinsn"), Some(1e3));
        assert_eq!(insn_per("ns"), None);
    }
}
