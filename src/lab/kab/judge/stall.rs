//! The SRCU stalls each side's runs found, matched by the ioctl that waited and the
//! registration behind it.

use serde::Serialize;

use crate::record::{Finding, RunRecord, pooled};

/// One side's share of a stall: repetitions and jiffies.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StallSide {
    /// Repetitions in which the ioctl stalled (summed over the boots where it recurred).
    pub stalled_reps: usize,
    /// Repetitions of the variant on this side.
    pub reps: usize,
    /// The lowest and highest per-boot median excess, in jiffies.
    pub jiffies: [f64; 2],
}

/// An SRCU stall (an ioctl waiting out a grace period another ioctl started), per side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StallAb {
    /// The ioctl that waited.
    pub ioctl: String,
    /// The registration whose grace period it waited for.
    pub cause: String,
    /// On A, when A's runs found it.
    pub a: Option<StallSide>,
    /// On B, when B's runs found it.
    pub b: Option<StallSide>,
}

/// The SRCU stalls one side's runs found, per (stalled ioctl, registration behind it).
fn stalls_of(
    runs: &[&RunRecord],
    variant: &str,
) -> std::collections::BTreeMap<(String, String), StallSide> {
    let reps: usize = pooled(runs, variant, "stalls").len();
    let mut seen: std::collections::BTreeMap<(String, String), StallSide> =
        std::collections::BTreeMap::new();
    for r in runs {
        let Some(v) = r.variant(variant) else {
            continue;
        };
        for f in &v.findings {
            if let Finding::SrcuStall {
                ioctl,
                caused_by,
                jiffies,
                stalled_reps,
                ..
            } = f
            {
                let cause = caused_by
                    .clone()
                    .unwrap_or_else(|| "an unknown registration".into());
                let e = seen.entry((ioctl.clone(), cause)).or_insert(StallSide {
                    stalled_reps: 0,
                    reps,
                    jiffies: [f64::MAX, f64::MIN],
                });
                e.stalled_reps += stalled_reps;
                e.jiffies = [e.jiffies[0].min(*jiffies), e.jiffies[1].max(*jiffies)];
            }
        }
    }
    seen
}

/// Both sides' stalls, matched by ioctl and cause.
pub(super) fn stalls_ab(ra: &[&RunRecord], rb: &[&RunRecord], variant: &str) -> Vec<StallAb> {
    let (mut a, mut b) = (stalls_of(ra, variant), stalls_of(rb, variant));
    let keys: std::collections::BTreeSet<(String, String)> =
        a.keys().chain(b.keys()).cloned().collect();
    keys.into_iter()
        .map(|k| StallAb {
            a: a.remove(&k),
            b: b.remove(&k),
            ioctl: k.0,
            cause: k.1,
        })
        .collect()
}
