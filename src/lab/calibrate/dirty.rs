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
use crate::scenario::dirty::{self, Set};
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
    // Full passes at one size; the manual-protect copy at two far-apart sizes with one page
    // written per 4096 (a copy's cost does not depend on what is dirty, and sparse passes
    // are quick), so its per-word slope stands out of the ioctl's noise.
    let (big, copy_big, copy_little) = if small {
        (8u64 << 20, 64u64 << 20, 2u64 << 20)
    } else {
        (64u64 << 20, 512u64 << 20, 16u64 << 20)
    };
    let a = run(
        backend,
        &dirty::INFO,
        &["bitmap", "ring"],
        &[&Set::SizeMib(big >> 20), &Set::Passes(3), &Set::Ring(65536)],
        5,
        progress,
    )?;
    let copy = |bytes: u64, backend: &mut dyn Backend| {
        run(
            backend,
            &dirty::INFO,
            &["clear"],
            &[
                &Set::SizeMib(bytes >> 20),
                &Set::Passes(3),
                &Set::Stride(4096),
                &Set::Chunk(262_144),
            ],
            5,
            progress,
        )
    };
    let b = copy(copy_big, backend)?;
    let c = copy(copy_little, backend)?;
    let pages_a = (big / 4096) as f64;
    let words_a = pages_a / 64.0;
    let (words_b, words_c) = (
        (copy_big / 4096 / 64) as f64,
        (copy_little / 4096 / 64) as f64,
    );
    let what = format!(
        "dirty runs at {} MiB (every page) and {} and {} MiB (every 4096th page), 3 passes each, 5 reps",
        big >> 20,
        copy_big >> 20,
        copy_little >> 20
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
    let (Some(get_b), Some(get_c)) = (med(&b, "clear", "get_ms"), med(&c, "clear", "get_ms"))
    else {
        return Ok(());
    };
    let (get_b, get_c) = (get_b * 1e6, get_c * 1e6);
    let word = (get_b - get_c) / (words_b - words_c);
    let ioctl = get_b - words_b * word;
    put_measured(
        p,
        "dirty_bitmap_word_ns",
        word,
        "ns",
        tag(&format!(
            "{what}: manual-protect KVM_GET_DIRTY_LOG {get_b:.0} ns over {words_b} words and {get_c:.0} ns over {words_c}: the slope"
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
