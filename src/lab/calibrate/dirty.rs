//! The costs the `dirty` model reads (`model::dirty::DirtyCosts`), solved from `dirty` runs
//! on this host whose event counts the model knows exactly:
//! - manual-protect `KVM_GET_DIRTY_LOG` only copies the bitmap: at two sizes it is
//!   `ioctl + words × word`, which gives both;
//! - plain `KVM_GET_DIRTY_LOG` of a pass that wrote every page also re-protects each:
//!   `ioctl + words × word + pages × protect`;
//! - a pass over protected pages takes one write-protect fault per page;
//! - the ring's harvest is per entry; its resets are `ioctls × ioctl + entries × (reset +
//!   protect)`.
//!
//! A mode this host lacks keeps the built-in values (the variant's status says why).

use super::{put_measured, run};
use crate::backend::Backend;
use crate::error::Error;
use crate::model::profile::Profile;
use crate::record::RunRecord;
use crate::scenario::dirty;
use crate::scenario::runner::Progress;

fn med(r: &RunRecord, variant: &str, metric: &str) -> Option<f64> {
    r.variant(variant)
        .filter(|v| v.is_ok())
        .and_then(|v| v.metrics.get(metric))
        .map(|m| m.median)
}

/// Measures the dirty-logging costs into `p`; `tag` writes a provenance, `small` is for an
/// emulated CPU (small regions so it finishes).
pub fn calibrate(
    backend: &mut dyn Backend,
    progress: &dyn Progress,
    p: &mut Profile,
    tag: &dyn Fn(&str) -> String,
    small: bool,
) -> Result<(), Error> {
    let (big, little) = if small {
        (8u64 << 20, 2u64 << 20)
    } else {
        (64u64 << 20, 16u64 << 20)
    };
    let set = |bytes: u64| format!("size={}MiB", bytes >> 20);
    let (big_set, little_set) = (set(big), set(little));
    let a = run(
        backend,
        &dirty::INFO,
        &["bitmap", "clear", "ring"],
        &[big_set.as_str(), "passes=3", "chunk=262144", "ring=65536"],
        5,
        progress,
    )?;
    let b = run(
        backend,
        &dirty::INFO,
        &["clear"],
        &[little_set.as_str(), "passes=3", "chunk=262144"],
        5,
        progress,
    )?;
    let (pages_a, pages_b) = ((big / 4096) as f64, (little / 4096) as f64);
    let (words_a, words_b) = (pages_a / 64.0, pages_b / 64.0);
    let what = format!(
        "dirty runs at {} and {} MiB, 3 passes each, 5 reps",
        big >> 20,
        little >> 20
    );

    // The write-protect fault: a pass's time per page, less the plain write.
    if let Some(per_page) = med(&a, "bitmap", "dirty_ns_per_page") {
        let touch = p.get("touch_page_ns", "dirty").unwrap_or(0.0);
        put_measured(
            p,
            "dirty_wp_fault_ns",
            per_page - touch,
            "ns",
            tag(&format!(
                "{what}: bitmap dirty_ns_per_page {per_page:.0} ns less touch_page_ns {touch:.1} ns (every page of the pass write-protected)"
            )),
        );
    }
    let (Some(get_a), Some(get_b)) = (med(&a, "clear", "get_ms"), med(&b, "clear", "get_ms"))
    else {
        return Ok(());
    };
    let (get_a, get_b) = (get_a * 1e6, get_b * 1e6);
    let word = (get_a - get_b) / (words_a - words_b);
    let ioctl = get_a - words_a * word;
    put_measured(
        p,
        "dirty_bitmap_word_ns",
        word,
        "ns",
        tag(&format!(
            "{what}: manual-protect KVM_GET_DIRTY_LOG {get_a:.0} ns over {words_a} words and {get_b:.0} ns over {words_b}: the slope"
        )),
    );
    put_measured(
        p,
        "dirty_ioctl_ns",
        ioctl,
        "ns",
        tag(&format!(
            "{what}: manual-protect KVM_GET_DIRTY_LOG at two sizes: the intercept"
        )),
    );
    let Some(get_full) = med(&a, "bitmap", "get_ms").map(|v| v * 1e6) else {
        return Ok(());
    };
    let protect = (get_full - ioctl - words_a * word) / pages_a;
    put_measured(
        p,
        "dirty_protect_page_ns",
        protect,
        "ns",
        tag(&format!(
            "{what}: KVM_GET_DIRTY_LOG {get_full:.0} ns with all {pages_a} pages dirty, less the manual-protect copy, per page"
        )),
    );
    if let (Some(harvest), Some(reset), Some(ioctls)) = (
        med(&a, "ring", "harvest_ms"),
        med(&a, "ring", "reset_ms"),
        med(&a, "ring", "collect_ioctls"),
    ) {
        put_measured(
            p,
            "dirty_ring_harvest_ns",
            harvest * 1e6 / pages_a,
            "ns",
            tag(&format!(
                "{what}: ring harvest_ms {harvest:.3} per pass of {pages_a} entries"
            )),
        );
        put_measured(
            p,
            "dirty_ring_reset_ns",
            (reset * 1e6 - ioctls * ioctl.max(0.0)) / pages_a - protect.max(0.0),
            "ns",
            tag(&format!(
                "{what}: ring reset_ms {reset:.3} per pass less {ioctls:.0} ioctls and the re-protection, per entry"
            )),
        );
    }
    Ok(())
}
