//! A wall-clock time measured in several boots a side, judged with the boot as the unit
//! (Kalibera and Jones, "Rigorous Benchmarking in Reasonable Time", ISMM 2013): each boot's
//! median is one sample of the top level, and the comparison's interval comes from the
//! variance between boots, not from the repetitions pooled across them. Pooled, thirty
//! repetitions of three boots look like thirty independent samples, and one boot's offset
//! (where its pages landed, what its host did meanwhile) reads as a change of the kernel.
//!
//! The interval is Welch's t on the logarithms of the per-boot medians (a ratio, like every
//! other time's), at the level corrected for the comparisons of the kab judged this way
//! (Bonferroni: a t-test's p is continuous, and a family of 3-boot comparisons has nothing
//! for Holm's step-down to gain). B differs when the whole interval of the ratio lies beyond
//! the threshold, the same rule as the rank-tested comparisons'. Beside it, each side's two
//! variance components and the repetitions per boot they make optimal.

use serde::Serialize;

use crate::statistics::median;
use crate::verdict::ALPHA;

/// One level's variance: the between-boot and the within-boot components, on the log scale
/// (a variance of 0.0025 is a 5% standard deviation), estimated as Kalibera and Jones do.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct VarianceComponents {
    /// The boots' own variance, net of what their repetitions' noise puts into their
    /// medians (`S₁² − S₂²/n`, at least 0).
    pub between: f64,
    /// The repetitions' variance within a boot (the mean over boots).
    pub within: f64,
    /// Boots.
    pub boots: usize,
    /// Repetitions per boot (the mean).
    pub reps: f64,
}

/// What a boot and a repetition cost, in seconds: what the optimal repetitions per boot
/// trade against each other.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Costs {
    /// Booting a kernel until its first command.
    pub boot_s: f64,
    /// One repetition.
    pub rep_s: f64,
}

/// The most repetitions per boot ever suggested: beyond it a boot's median is exact anyway.
pub const MAX_REPS_PER_BOOT: u32 = 1000;

/// The sample variance (`n − 1`); 0 for fewer than two samples.
fn variance(x: &[f64]) -> f64 {
    if x.len() < 2 {
        return 0.0;
    }
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0)
}

fn ln_all(x: &[f64]) -> Vec<f64> {
    x.iter().map(|v| v.max(f64::MIN_POSITIVE).ln()).collect()
}

/// Each boot's median.
pub fn boot_medians(boots: &[Vec<f64>]) -> Vec<f64> {
    boots
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| median(b))
        .collect()
}

/// One side's variance components, from its boots' repetitions.
pub fn components(boots: &[Vec<f64>]) -> VarianceComponents {
    let boots: Vec<&Vec<f64>> = boots.iter().filter(|b| !b.is_empty()).collect();
    let n = boots.len().max(1) as f64;
    let within = boots.iter().map(|b| variance(&ln_all(b))).sum::<f64>() / n;
    let reps = boots.iter().map(|b| b.len() as f64).sum::<f64>() / n;
    let medians: Vec<f64> = boots
        .iter()
        .map(|b| median(b).max(f64::MIN_POSITIVE).ln())
        .collect();
    let between = (variance(&medians) - within / reps.max(1.0)).max(0.0);
    VarianceComponents {
        between,
        within,
        boots: boots.len(),
        reps,
    }
}

/// The repetitions per boot that give the narrowest interval for a given time (Kalibera and
/// Jones's optimum for two levels: `√(c₁·τ₂² / (c₂·τ₁²))`, `c₁` a boot's cost, `c₂` a
/// repetition's, `τ₁²` and `τ₂²` the between- and within-boot variances), at least 1. `None`
/// when no variance between boots was seen: then more repetitions per boot always pay, up to
/// [`MAX_REPS_PER_BOOT`], and a second boot buys nothing that is measured.
pub fn reps_per_boot(v: &VarianceComponents, costs: Costs) -> Option<u32> {
    if v.between <= 0.0 || costs.rep_s <= 0.0 {
        return None;
    }
    let r = (costs.boot_s * v.within / (costs.rep_s * v.between)).sqrt();
    // Clamped to [1, MAX_REPS_PER_BOOT] first, so the conversion cannot truncate.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let r = r.ceil().clamp(1.0, f64::from(MAX_REPS_PER_BOOT)) as u32;
    Some(r)
}

/// What the per-boot comparison says of B.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootsCall {
    /// The whole interval of the ratio above `1 + threshold`.
    Higher,
    /// The whole interval below `1 − threshold`.
    Lower,
    /// The whole interval within the threshold's band.
    Same,
    /// The interval reaches across the band's edge: more boots would decide it.
    NotDecided,
}

/// A wall-clock time, B against A, with the boot as the unit ([`judge`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BootsAb {
    /// Each boot's median, A and B, in the metric's unit.
    pub boot_medians: [Vec<f64>; 2],
    /// The ratio of the boots' geometric means, B over A.
    pub ratio: f64,
    /// Its interval, at `1 − alpha / judged_together`.
    pub ci: [f64; 2],
    /// Welch's two-sided p of the log boot medians, uncorrected.
    pub p_value: f64,
    /// Welch's degrees of freedom.
    pub df: f64,
    /// The level (0.05).
    pub alpha: f64,
    /// Comparisons of the kab judged this way, the level divided among them (1: alone).
    pub judged_together: usize,
    /// The threshold a change must exceed (0.05 for 5%).
    pub threshold: f64,
    /// Each side's variance components.
    pub variance: [VarianceComponents; 2],
    /// The repetitions per boot those components make optimal, per side (`None`: no variance
    /// between boots seen).
    pub reps_per_boot: [Option<u32>; 2],
    /// The costs the suggestion weighs.
    pub costs: Costs,
    /// The call.
    pub call: BootsCall,
}

impl BootsAb {
    /// Whether B is established higher.
    pub fn b_higher(&self) -> bool {
        self.call == BootsCall::Higher
    }

    /// Whether B is established lower.
    pub fn b_lower(&self) -> bool {
        self.call == BootsCall::Lower
    }

    /// The comparison again, its level divided among `together` comparisons.
    pub fn rejudge(&mut self, together: usize) {
        self.judged_together = together.max(1);
        let (la, lb) = (ln_all(&self.boot_medians[0]), ln_all(&self.boot_medians[1]));
        let w = welch(&la, &lb);
        let q = 1.0 - self.alpha / (2.0 * self.judged_together as f64);
        let half = if w.se > 0.0 {
            t_quantile(q, w.df) * w.se
        } else {
            0.0
        };
        self.ratio = w.diff.exp();
        self.ci = [(w.diff - half).exp(), (w.diff + half).exp()];
        self.p_value = w.p;
        self.df = w.df;
        let (up, down) = (1.0 + self.threshold, 1.0 - self.threshold);
        self.call = if self.ci[0] > up {
            BootsCall::Higher
        } else if self.ci[1] < down {
            BootsCall::Lower
        } else if self.ci[0] >= down && self.ci[1] <= up {
            BootsCall::Same
        } else {
            BootsCall::NotDecided
        };
    }
}

/// Judges B against A with the boot as the unit: `a` and `b` are each side's boots'
/// repetitions (at least two boots a side for an interval; with fewer the call is
/// [`BootsCall::NotDecided`]), `threshold` the smallest change that counts, `costs` what the
/// repetitions-per-boot suggestion weighs.
pub fn judge(a: &[Vec<f64>], b: &[Vec<f64>], threshold: f64, costs: Costs) -> BootsAb {
    let variance = [components(a), components(b)];
    let mut ab = BootsAb {
        boot_medians: [boot_medians(a), boot_medians(b)],
        ratio: 1.0,
        ci: [0.0, f64::INFINITY],
        p_value: 1.0,
        df: 0.0,
        alpha: ALPHA,
        judged_together: 1,
        threshold,
        reps_per_boot: variance.map(|v| reps_per_boot(&v, costs)),
        variance,
        costs,
        call: BootsCall::NotDecided,
    };
    ab.rejudge(1);
    ab
}

/// Welch's comparison of two samples' means.
struct Welch {
    diff: f64,
    se: f64,
    df: f64,
    p: f64,
}

fn welch(a: &[f64], b: &[f64]) -> Welch {
    let mean = |x: &[f64]| x.iter().sum::<f64>() / x.len().max(1) as f64;
    let diff = mean(b) - mean(a);
    if a.len() < 2 || b.len() < 2 {
        // No variance between boots to judge by: an interval of everything.
        return Welch {
            diff,
            se: f64::INFINITY,
            df: 1.0,
            p: 1.0,
        };
    }
    let (va, vb) = (variance(a) / a.len() as f64, variance(b) / b.len() as f64);
    let se2 = va + vb;
    if se2 <= 0.0 {
        return Welch {
            diff,
            se: 0.0,
            df: f64::INFINITY,
            p: if diff == 0.0 { 1.0 } else { 0.0 },
        };
    }
    let df = se2 * se2 / (va * va / (a.len() as f64 - 1.0) + vb * vb / (b.len() as f64 - 1.0));
    let t = diff.abs() / se2.sqrt();
    Welch {
        diff,
        se: se2.sqrt(),
        df,
        p: 2.0 * (1.0 - t_cdf(t, df)),
    }
}

/// Student's t CDF for `t ≥ 0` (`1 − ½·I_{ν/(ν+t²)}(ν/2, ½)`).
fn t_cdf(t: f64, df: f64) -> f64 {
    // Beyond 1e7 degrees of freedom t is the normal to 1e-7.
    let df = df.min(1e7);
    1.0 - 0.5 * incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
}

/// Student's t quantile: the `t` with `t_cdf(t, df) = q`, for `q` in (0.5, 1), by bisection.
pub fn t_quantile(q: f64, df: f64) -> f64 {
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while t_cdf(hi, df) < q && hi < 1e12 {
        hi *= 2.0;
    }
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if t_cdf(mid, df) < q {
            lo = mid;
        } else {
            hi = mid;
        }
        if hi - lo <= 1e-10 * hi {
            break;
        }
    }
    0.5 * (lo + hi)
}

/// The log gamma function (Lanczos, g = 7, n = 9; relative error under 1e-13).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularized incomplete beta `I_x(a, b)` (its continued fraction, modified Lentz).
fn incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    // The fraction converges fast for x below the mean; above it, by symmetry.
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - incomplete_beta(b, a, 1.0 - x);
    }
    const TINY: f64 = 1e-300;
    let mut c = 1.0f64;
    let mut d = 1.0 - (a + b) * x / (a + 1.0);
    if d.abs() < TINY {
        d = TINY;
    }
    d = 1.0 / d;
    let mut f = d;
    for m in 1..500 {
        let m = f64::from(m);
        let even = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        for num in [
            even,
            -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0)),
        ] {
            d = 1.0 + num * d;
            if d.abs() < TINY {
                d = TINY;
            }
            c = 1.0 + num / c;
            if c.abs() < TINY {
                c = TINY;
            }
            d = 1.0 / d;
            f *= d * c;
        }
        if (d * c - 1.0).abs() < 1e-14 {
            break;
        }
    }
    front * f / a
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::ab;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Student's t quantiles against the tables (two-sided 95%: 12.706, 4.303, 2.776, 2.228,
    /// 1.960 in the limit).
    #[test]
    fn t_quantiles_match_the_tables() {
        for (df, t) in [
            (1.0, 12.706),
            (2.0, 4.303),
            (4.0, 2.776),
            (10.0, 2.228),
            (1e9, 1.960),
        ] {
            let q = t_quantile(0.975, df);
            assert!((q - t).abs() < 2e-3, "df {df}: {q} against {t}");
        }
        assert!((t_quantile(0.995, 3.0) - 5.841).abs() < 2e-3);
    }

    /// A boot offset of 10% and repetitions within 1%: the between component is the boots'
    /// (about 0.01 on the log scale), the within the repetitions'; a boot costing 400
    /// repetitions makes √(400 · 1e-4 / 1e-2) = 2 repetitions a boot optimal.
    #[test]
    fn variance_components_and_the_reps_they_make_optimal() {
        let boots: Vec<Vec<f64>> = [0.9, 1.0, 1.1]
            .iter()
            .map(|o| {
                (0..10)
                    .map(|i| o * (0.99 + 0.02 * f64::from(i) / 9.0))
                    .collect()
            })
            .collect();
        let v = components(&boots);
        assert_eq!(v.boots, 3);
        assert!((v.reps - 10.0).abs() < 1e-12);
        assert!(v.between > 0.008 && v.between < 0.012, "{v:?}");
        assert!(v.within > 1e-5 && v.within < 1e-4, "{v:?}");
        let costs = Costs {
            boot_s: 4.0,
            rep_s: 0.01,
        };
        let fixed = VarianceComponents {
            between: 1e-2,
            within: 1e-4,
            boots: 3,
            reps: 10.0,
        };
        assert_eq!(reps_per_boot(&fixed, costs), Some(2));
        let no_between = VarianceComponents {
            between: 0.0,
            ..fixed
        };
        assert_eq!(reps_per_boot(&no_between, costs), None);
    }

    /// `boots` boots of `reps` repetitions around `center`, each boot offset by a normal draw
    /// of sd `boot_sd`, each repetition by one of sd `rep_sd` (relative).
    fn side(rng: &mut ChaCha8Rng, center: f64, boots: usize, reps: usize) -> Vec<Vec<f64>> {
        let normal = |rng: &mut ChaCha8Rng| {
            // Box-Muller.
            let (u, v): (f64, f64) = (rng.random::<f64>().max(1e-300), rng.random::<f64>());
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        };
        (0..boots)
            .map(|_| {
                let offset = 1.0 + 0.05 * normal(rng);
                (0..reps)
                    .map(|_| center * offset * (1.0 + 0.01 * normal(rng)))
                    .collect()
            })
            .collect()
    }

    /// 1,000 simulated A/A kabs of one wall-clock time, 3 boots a side of 10 repetitions,
    /// each boot offset by 5% (sd) and each repetition by 1%: judged per boot, at most 1%
    /// flag a change; judged as the 30 pooled repetitions a side by the rank rule, far more
    /// do. And a real +20% is found in most of 1,000 simulations.
    #[test]
    fn per_boot_judging_keeps_a_boot_offset_from_flagging_an_a_a() {
        let costs = Costs {
            boot_s: 4.0,
            rep_s: 0.05,
        };
        let mut rng = ChaCha8Rng::seed_from_u64(0x6b61_6231);
        let (mut per_boot, mut pooled, mut found) = (0, 0, 0);
        let kabs = 1000usize;
        for i in 0..1000u64 {
            let a = side(&mut rng, 1000.0, 3, 10);
            let b = side(&mut rng, 1000.0, 3, 10);
            let j = judge(&a, &b, 0.05, costs);
            per_boot += usize::from(matches!(j.call, BootsCall::Higher | BootsCall::Lower));
            let flat = |s: &[Vec<f64>]| -> Vec<f64> { s.iter().flatten().copied().collect() };
            let old = ab("t", "ns", ("A", &flat(&a)), ("B", &flat(&b)), 0.05, i);
            pooled += usize::from(old.verdict.called());
            let shifted = side(&mut rng, 1200.0, 3, 10);
            found += usize::from(judge(&a, &shifted, 0.05, costs).b_higher());
        }
        let msg = format!(
            "A/A false flags: per boot {per_boot} of {kabs}, pooled repetitions {pooled} of {kabs}; +20% found {found} of {kabs}"
        );
        eprintln!("{msg}");
        assert!(per_boot * 100 <= kabs, "{msg}");
        assert!(pooled >= 5 * per_boot.max(10), "{msg}");
        assert!(found * 2 > kabs, "{msg}");
    }

    /// Divided among more comparisons, the interval widens: a difference called alone is not
    /// among 50.
    #[test]
    fn the_level_is_divided_among_the_comparisons_judged_together() {
        let a = vec![vec![100.0; 3], vec![101.0; 3], vec![99.0; 3]];
        let b = vec![vec![110.0; 3], vec![111.0; 3], vec![109.5; 3]];
        let costs = Costs {
            boot_s: 1.0,
            rep_s: 1.0,
        };
        let mut j = judge(&a, &b, 0.05, costs);
        assert_eq!(j.call, BootsCall::Higher, "{j:?}");
        let alone = j.ci;
        j.rejudge(50);
        assert!(j.ci[0] < alone[0] && j.ci[1] > alone[1], "{j:?}");
        assert_ne!(j.call, BootsCall::Higher, "{j:?}");
        // One boot a side: no interval.
        let one = judge(&a[..1], &b[..1], 0.05, costs);
        assert_eq!(one.call, BootsCall::NotDecided);
    }
}
