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
//!
//! And `mmu_lock_hold_ns`, the part of a shadow-paging fault held under `kvm->mmu_lock`
//! (which [`mmu_lock_hold`] explains), from the same pass run by one vCPU and by two.

use super::{put_measured, run};
use crate::lab::Error;
use crate::model::profile::{MmuKind, Profile};
use crate::record::RunRecord;
use crate::scenario::dirty::DirtyParams;
use crate::scenario::runner::Progress;
use hvlab_core::Backend;

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
    mmu_lock_hold(backend, progress, p, tag, small)?;
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
        DirtyParams {
            size_bytes: big,
            passes: 3,
            ring: 65536,
            ..DirtyParams::default()
        },
        &["bitmap", "ring"],
        5,
        progress,
    )?;
    let copy = |size_bytes: u64, backend: &mut dyn Backend| {
        run(
            backend,
            DirtyParams {
                size_bytes,
                passes: 3,
                stride: 4096,
                chunk: 262_144,
                ..DirtyParams::default()
            },
            &["clear"],
            5,
            progress,
        )
    };
    let b = copy(copy_big, backend)?;
    let c = copy(copy_little, backend)?;
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
    let runs = CollectRuns {
        full: (&a, big),
        copies: [(&b, copy_big), (&c, copy_little)],
        what: &what,
    };
    collect_costs(p, tag, &runs);
    Ok(())
}

/// The runs collection costs are solved from: full passes (every page dirty, bitmap and ring)
/// and manual-protect copies of two region sizes, each with its size in bytes.
struct CollectRuns<'a> {
    full: (&'a RunRecord, u64),
    copies: [(&'a RunRecord, u64); 2],
    /// What they were, for the provenance.
    what: &'a str,
}

/// The log's costs: the bitmap's copy per word and ioctl (the two copies' slope and
/// intercept), the re-protection per page (the full pass less the copy), and the ring's
/// harvest and reset per entry.
fn collect_costs(p: &mut Profile, tag: &dyn Fn(&str) -> String, runs: &CollectRuns<'_>) {
    let what = runs.what;
    let (a, big) = runs.full;
    let [(b, copy_big), (c, copy_little)] = runs.copies;
    let pages_a = (big / 4096) as f64;
    let words_a = pages_a / 64.0;
    let (words_b, words_c) = (
        (copy_big / 4096 / 64) as f64,
        (copy_little / 4096 / 64) as f64,
    );
    let (Some(get_b), Some(get_c)) = (med(b, "clear", "get_ms"), med(c, "clear", "get_ms")) else {
        return;
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
    let Some(get_full) = med(a, "bitmap", "get_ms").map(|v| v * 1e6) else {
        return;
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
        med(a, "ring", "harvest_ms"),
        med(a, "ring", "reset_ms"),
        med(a, "ring", "collect_ioctls"),
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
}

/// `mmu_lock_hold_ns` from a dirtying pass run by one vCPU and by two on two host CPUs.
///
/// With shadow paging every write-protect fault is `FNAME(page_fault)` (paging_tmpl.h),
/// which makes the SPTE writable in `FNAME(fetch)` under `write_lock(&kvm->mmu_lock)`: of a
/// fault's `F` ns per page, `H` are held exclusively. Two vCPUs on two CPUs then write a page
/// every `max(F / 2, H)` ns (the lock saturates once `H > F / 2`), as the model's
/// `mmu_lock::simulate` runs them. So the two-vCPU pass's time per page is `H` whenever it is
/// above `F / 2`, and no more than `F`; at `F / 2` (a full speed-up) it only bounds `H` from
/// above, and the assumed value stays. The first-touch fault of `memory` takes the same lock
/// in the same function, which is why the model reads one value for both. With TDP the
/// write-protect fault is lock-free (`fast_page_fault()`), so there is nothing to measure.
fn mmu_lock_hold(
    backend: &mut dyn Backend,
    progress: &dyn Progress,
    p: &mut Profile,
    tag: &dyn Fn(&str) -> String,
    small: bool,
) -> Result<(), Error> {
    if p.mmu != MmuKind::Shadow || backend.host().cores < 2 {
        return Ok(());
    }
    let mib: u64 = if small { 8 } else { 64 };
    let pass = |vcpus: u32, backend: &mut dyn Backend| {
        run(
            backend,
            DirtyParams {
                size_bytes: mib << 20,
                passes: 3,
                vcpus,
                ..DirtyParams::default()
            },
            &["bitmap"],
            5,
            progress,
        )
    };
    let one = pass(1, backend)?;
    let two = pass(2, backend)?;
    let (Some(f), Some(per_page)) = (
        med(&one, "bitmap", "dirty_ns_per_page"),
        med(&two, "bitmap", "dirty_ns_per_page"),
    ) else {
        return Ok(());
    };
    let what = format!(
        "dirty bitmap at {mib} MiB, 3 passes x 5 reps, one vCPU then two on this host's 2+ CPUs: a write-protect fault {f:.0} ns per page with one, {per_page:.0} ns per page of the pass with two"
    );
    if per_page <= 0.55 * f {
        // A full speed-up: the lock is held at most half the fault, and the data say no more.
        if let Some(kept) = p.costs.get_mut("mmu_lock_hold_ns") {
            kept.provenance = format!(
                "{}; kept: {what}, a full speed-up, which bounds it only (<= {:.0} ns)",
                kept.provenance,
                f / 2.0
            );
        }
        return Ok(());
    }
    put_measured(
        p,
        "mmu_lock_hold_ns",
        per_page.min(f),
        "ns",
        tag(&format!(
            "{what}: two vCPUs write a page every max(F/2, H) ns under write_lock(&kvm->mmu_lock) in FNAME(page_fault), so H is the two-vCPU time per page (capped at F)"
        )),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::runner::Silent;

    /// The hold the calibration solves from a model that holds `hold_ns` of each fault.
    fn solved(hold_ns: f64) -> (f64, String) {
        let mut truth = Profile::load("pvm-epyc").unwrap();
        let prov = "test".to_string();
        truth.set("mmu_lock_hold_ns", hold_ns, "ns", prov.clone());
        truth.set("host_cpus", 2.0, "count", prov);
        let mut host = crate::lab::host::probe();
        host.cores = 2;
        let mut backend = crate::model::ModelBackend::new(truth, host, 1);
        let mut p = Profile::load("pvm-epyc").unwrap();
        mmu_lock_hold(&mut backend, &Silent, &mut p, &|w| w.to_string(), true).unwrap();
        let c = &p.costs["mmu_lock_hold_ns"];
        (c.value, c.provenance.clone())
    }

    #[test]
    fn the_hold_comes_back_from_a_model_that_saturates_the_lock_and_a_full_speed_up_keeps_it() {
        // pvm-epyc's write-protect fault is 23.8 us: 15 us held saturates two vCPUs.
        let (value, why) = solved(15_000.0);
        assert!((value - 15_000.0).abs() < 300.0, "{value}: {why}");
        assert!(why.contains("FNAME(page_fault)"), "{why}");
        // 2 us held: the two vCPUs halve the pass, which bounds the hold only.
        let (value, why) = solved(2_000.0);
        assert_eq!(value, 1000.0, "{why}");
        assert!(why.contains("bounds it only"), "{why}");
    }
}
