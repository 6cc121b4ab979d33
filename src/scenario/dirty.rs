//! `dirty`: dirty logging, by bitmap, by manual-protect clear, and by the dirty ring.
//!
//! Live migration and snapshots ask KVM which guest pages changed. KVM write-protects a
//! logged memslot's SPTEs; a guest write faults, KVM makes the SPTE writable again and records
//! the page — a bit in the slot's bitmap or an entry on the vCPU's dirty ring. The VMM then
//! collects: `KVM_GET_DIRTY_LOG` hands over the bitmap and re-protects in the same call
//! (`kvm_get_dirty_log_protect()`); with `KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2` it only copies,
//! and `KVM_CLEAR_DIRTY_LOG` re-protects chunk by chunk (`kvm_clear_dirty_log_protect()`);
//! with `KVM_CAP_DIRTY_LOG_RING` the VMM reads the ring's entries and `KVM_RESET_DIRTY_RINGS`
//! re-protects them (`kvm_dirty_ring_reset()`), and a ring that fills stops the vCPU with
//! `KVM_EXIT_DIRTY_RING_FULL` until it is harvested.
//!
//! Each repetition builds a fresh VM whose data region (a memslot at 4 GiB with
//! `KVM_MEM_LOG_DIRTY_PAGES`, populated 4 KiB host memory) a CPL3 guest loop writes: the first
//! byte of every `stride`-th page per pass. A first pass maps the pages (its log is collected
//! and discarded); then `passes` measured passes, each followed by the variant's collection.
//! Every metric is the mean over the measured passes of one repetition; `kvm.vcpu.*` and
//! `kvm.vm.*` are statistic deltas per pass. The log must report exactly the pages the pass
//! wrote: a pass where it does not fails the variant.
//!
//! With `vcpus` > 1 the region is split into one contiguous slice per vCPU (memstress's
//! shape); every vCPU writes its own slice on its own host thread, all meeting at each pass's
//! start and end, and the VMM collects while they wait. Per-vCPU rings fill on their own. With
//! shadow paging every write-protect fault takes `kvm->mmu_lock` for write
//! (`FNAME(page_fault)`), which is what the vCPUs contend on; the model runs that lock.
//! `backing` picks the region's host memory: anonymous, shmem, or hugetlb (logged in 4 KiB
//! pages all the same: KVM never maps a logged slot huge); guest_memfd cannot be logged.

use super::memory::{GuestRun, guest_cpl, guest_timeout};
use super::params::{Choice, Param, Text, Values, bytes, choice, size_text, whole};
use super::runner::{RunRequest, ScenarioOutcome};
use super::samples::{Series, per_variant};
use super::{Chart, Observed, Scenario, ValidationPoint};
use super::{IcountTolerance, MetricInfo, ScenarioInfo, VariantInfo};
use crate::analysis::Direction;
use crate::analysis::validate::{Rule, check};
use crate::error::InputError;
use crate::record::{Finding, RunRecord, VariantRecord, VariantStatus};
use hvlab_core::Capabilities;
use hvlab_core::dirty::{BITMAP_WORD_PAGES, DirtyBacking, DirtyPlan, DirtyResult, LogMode};
use hvlab_core::guest::DATA_MAX_BYTES;
use hvlab_core::host::HostInfo;
use hvlab_core::memory::HugeSize;

/// The catalog entry.
pub static INFO: ScenarioInfo = ScenarioInfo {
    name: "dirty",
    summary: "dirty logging: write-protect faults, and collecting the log by bitmap, manual-protect clear or dirty ring",
    variants: &VARIANTS,
    model_variants: &[],
    metrics: &METRICS,
    headline: "collect_ms",
    question: super::Question {
        asks: "what collecting the dirty log costs per pass with manual-protect clears and with the dirty ring, against the bitmap",
        baseline: Some("bitmap"),
        judged: &[],
        pairs: &[],
        within: None,
        costs: false,
    },
    runs_on: super::any_backend,
    default_reps: 5,
    default_warmup: 1,
};

static VARIANTS: [VariantInfo; 3] = [
    VariantInfo {
        name: "bitmap",
        doc: "KVM_GET_DIRTY_LOG after each pass: the bitmap handed over and its pages write-protected in one call",
    },
    VariantInfo {
        name: "clear",
        doc: "KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2: KVM_GET_DIRTY_LOG copies, KVM_CLEAR_DIRTY_LOG re-protects in chunks of --set chunk pages",
    },
    VariantInfo {
        name: "ring",
        doc: "KVM_CAP_DIRTY_LOG_RING of --set ring entries: harvest the ring and KVM_RESET_DIRTY_RINGS, also whenever it fills (KVM_EXIT_DIRTY_RING_FULL)",
    },
];

/// `backing`: the region's host memory.
static BACKING: Choice<DirtyBacking, 5> = Choice {
    names: ["anon", "shmem", "hugetlb-2m", "hugetlb-1g", "gmem"],
    values: [
        DirtyBacking::Anonymous,
        DirtyBacking::Shmem,
        DirtyBacking::Hugetlb(HugeSize::Mib2),
        DirtyBacking::Hugetlb(HugeSize::Gib1),
        DirtyBacking::GuestMemfd,
    ],
};

/// Each parameter, declared once.
pub static PARAMS: [Param<DirtyParams>; 9] = [
    bytes!("size" => size_bytes, "logged data region, a multiple of 2 MiB up to 64GiB (64 MiB keeps the suite short; the collect times and costs per page in docs/scenarios.md were measured at 256MiB)"),
    whole!(
        passes,
        "measured passes per repetition, after one unmeasured pass that maps the pages",
        1,
        100
    ),
    whole!(
        stride,
        "a pass writes every stride-th 4 KiB page from the first",
        1,
        4096
    ),
    Param {
        name: "ring",
        doc: "dirty-ring entries per vCPU (16 bytes each): a power of two from 256, at most the host's KVM_CAP_DIRTY_LOG_RING",
        values: Values::Described,
        model_only: false,
        read: |p, t| {
            p.ring = parse_ring(t)?;
            Ok(())
        },
        spell: |p| p.ring.to_string(),
    },
    Param {
        name: "chunk",
        doc: "pages per KVM_CLEAR_DIRTY_LOG call (clear): a multiple of 64",
        values: Values::Described,
        model_only: false,
        read: |p, t| {
            p.chunk = parse_chunk(t)?;
            Ok(())
        },
        spell: |p| p.chunk.to_string(),
    },
    Param {
        name: "vcpus",
        doc: "vCPUs writing at once, each its own slice (size a multiple of vcpus x 2MiB); at most the host's KVM_CAP_MAX_VCPUS",
        values: Values::Described,
        model_only: false,
        read: |p, t| {
            p.vcpus = super::memory::vcpu_count(t)?;
            Ok(())
        },
        spell: |p| p.vcpus.to_string(),
    },
    choice!(
        backing,
        BACKING,
        "the region's host memory, populated: anon (4 KiB anonymous), shmem (memfd), hugetlb-2m, hugetlb-1g (MFD_HUGETLB; hvlab grows the pool and sets it back, root), gmem (guest_memfd: KVM cannot log it, said as unsupported)"
    ),
    guest_cpl(),
    guest_timeout("watchdog for one pass, ms"),
];

static METRICS: [MetricInfo; 16] = [
    MetricInfo {
        name: "collect_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "VMM time collecting one pass's log: get (bitmap); get + clears (clear); harvests + resets, mid-pass ones included (ring)",
    },
    MetricInfo {
        name: "collect_ns_per_page",
        unit: "ns",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "collect_ms per page found dirty",
    },
    MetricInfo {
        name: "dirty_ns_per_page",
        unit: "ns",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "host time from the guest's Start to End signal per page written, ring harvests excluded: a write-protect fault each",
    },
    MetricInfo {
        name: "total_pages_per_ms",
        unit: "pages/ms",
        better: Direction::HigherIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "pages written by all vCPUs per ms, from the common start to the last vCPU's End",
    },
    MetricInfo {
        name: "vcpu_pages_per_ms",
        unit: "pages/ms",
        better: Direction::HigherIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "each vCPU's own rate (its slice's writes over its own time), the mean over the vCPUs of a pass",
    },
    MetricInfo {
        name: "get_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "KVM_GET_DIRTY_LOG per pass (bitmap, clear)",
    },
    MetricInfo {
        name: "clear_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "KVM_CLEAR_DIRTY_LOG calls per pass (clear)",
    },
    MetricInfo {
        name: "harvest_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "reading the ring's entries and marking them harvested, per pass (ring)",
    },
    MetricInfo {
        name: "reset_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "KVM_RESET_DIRTY_RINGS calls per pass (ring)",
    },
    MetricInfo {
        name: "pages_written",
        unit: "count",
        // The workload's size: what the guest was asked to write.
        better: Direction::Neither,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "pages the guest wrote per pass",
    },
    MetricInfo {
        name: "pages_dirty",
        unit: "count",
        // Fewer is a write the log lost during live migration, not an improvement; more is a page
        // reported that was not written.
        better: Direction::MustEqual("pages_written"),
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "distinct pages the collected log reported per pass (equal to pages_written, or the variant fails)",
    },
    MetricInfo {
        name: "wp_faults",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "write-protect faults per pass: kvm.vcpu.pf_taken over the pass (every page is mapped by then); the model counts its own",
    },
    MetricInfo {
        name: "collect_ioctls",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "collection ioctls per pass (gets, clears, ring resets)",
    },
    MetricInfo {
        name: "ring_full_exits",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "KVM_EXIT_DIRTY_RING_FULL exits per pass (ring)",
    },
    MetricInfo {
        name: "kvm.vcpu.<stat>",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "vCPU statistics that changed during a pass, per pass",
    },
    MetricInfo {
        name: "kvm.vm.<stat>",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "VM statistics that changed during a pass, per pass",
    },
];

/// The smallest ring KVM takes: one page of 16-byte entries (`kvm_vm_ioctl_enable_dirty_log_ring()`).
const RING_MIN_ENTRIES: u64 = 256;

/// The ring size from `ring`: a power of two from [`RING_MIN_ENTRIES`]; the host's maximum is
/// the backend's to check (it needs /dev/kvm).
fn parse_ring(t: &Text<'_>) -> Result<u64, InputError> {
    t.raw
        .parse::<u64>()
        .ok()
        .filter(|n| n.is_power_of_two() && *n >= RING_MIN_ENTRIES && *n <= 1 << 24)
        .ok_or_else(|| {
            t.bad(format!(
                "ring is a number of 16-byte entries, a power of two from {RING_MIN_ENTRIES} (one page); KVM allows up to 65536 (1 MiB), `hvlab host` shows this host's KVM_CAP_DIRTY_LOG_RING"
            ))
        })
}

/// The clear chunk from `chunk`: whole bitmap words, as `KVM_CLEAR_DIRTY_LOG` requires.
fn parse_chunk(t: &Text<'_>) -> Result<u64, InputError> {
    t.raw
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0 && n % BITMAP_WORD_PAGES == 0 && *n <= 1 << 32)
        .ok_or_else(|| {
            t.bad("chunk is a number of pages that is a non-zero multiple of 64 (KVM_CLEAR_DIRTY_LOG works on whole 64-page bitmap words): 64, 4096, 262144")
        })
}

/// The first pass of a repetition whose log disagrees with what the guest wrote, in words.
fn count_mismatch(results: &[DirtyResult]) -> Option<String> {
    results.iter().enumerate().find_map(|(rep, r)| {
        r.passes.iter().enumerate().find_map(|(i, p)| {
            (p.found != p.written).then(|| {
                format!(
                    "the dirty log reported {} pages in pass {} of repetition {}, the guest wrote {}",
                    p.found,
                    i + 1,
                    rep + 1,
                    p.written
                )
            })
        })
    })
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = values.fold((0.0, 0u32), |(s, n), v| (s + v, n + 1));
    sum / f64::from(n.max(1))
}

/// A pass's mean per-vCPU rate, pages/ms: each vCPU's share of the writes over its own
/// time; one vCPU's is the pass's.
fn vcpu_rate(p: &hvlab_core::dirty::DirtyPass) -> f64 {
    if p.vcpu_ns.is_empty() {
        return p.written as f64 / (p.dirty_ns.max(1) as f64 / 1e6);
    }
    let share = p.written as f64 / p.vcpu_ns.len() as f64;
    p.vcpu_ns
        .iter()
        .map(|ns| share / ((*ns).max(1) as f64 / 1e6))
        .sum::<f64>()
        / p.vcpu_ns.len() as f64
}

/// One repetition's mean per pass of what collecting the log took in `mode` (get and clear,
/// or harvest, reset and ring-full exits), the write-protect faults, and the KVM statistics.
fn push_collection(series: &mut Series, mode: LogMode, p: &[hvlab_core::dirty::DirtyPass]) {
    let per = |f: &dyn Fn(&hvlab_core::dirty::DirtyPass) -> f64| mean(p.iter().map(f));
    match mode {
        LogMode::Bitmap => {
            series.push("get_ms", "ms", per(&|x| x.get_ns as f64 / 1e6));
        }
        LogMode::Clear { .. } => {
            series
                .push("get_ms", "ms", per(&|x| x.get_ns as f64 / 1e6))
                .push("clear_ms", "ms", per(&|x| x.clear_ns as f64 / 1e6));
        }
        LogMode::Ring { .. } => {
            series
                .push("harvest_ms", "ms", per(&|x| x.harvest_ns as f64 / 1e6))
                .push("reset_ms", "ms", per(&|x| x.reset_ns as f64 / 1e6))
                .push(
                    "ring_full_exits",
                    "count",
                    per(&|x| x.ring_full_exits as f64),
                );
        }
    }
    if p.iter().all(|x| x.wp_faults.is_some()) {
        series.push(
            "wp_faults",
            "count",
            per(&|x| x.wp_faults.unwrap_or(0) as f64),
        );
    }
    let mut stats: std::collections::BTreeMap<&str, (&str, f64)> = Default::default();
    for pass in p {
        for (stat, unit, delta) in &pass.kvm_stats {
            stats.entry(stat.as_str()).or_insert((unit.as_str(), 0.0)).1 += *delta as f64;
        }
    }
    for (stat, (unit, total)) in stats {
        series.push(stat, unit, total / p.len().max(1) as f64);
    }
}

fn analyse_variant(
    name: &str,
    plan: &DirtyPlan,
    results: &[DirtyResult],
    seed: u64,
) -> VariantRecord {
    if let Some(why) = count_mismatch(results) {
        return VariantRecord {
            name: name.to_string(),
            status: VariantStatus::Failed(why),
            metrics: Default::default(),
            findings: Vec::new(),
            timeline: Vec::new(),
            pinned_bytes: Vec::new(),
        };
    }
    let mut series = Series::new();
    for (rep, r) in results.iter().enumerate() {
        let p = &r.passes;
        let per = |f: &dyn Fn(&hvlab_core::dirty::DirtyPass) -> f64| mean(p.iter().map(f));
        series
            .at(rep)
            .push("collect_ms", "ms", per(&|x| x.collect_ns() as f64 / 1e6))
            .push(
                "collect_ns_per_page",
                "ns",
                per(&|x| x.collect_ns() as f64 / x.found.max(1) as f64),
            )
            .push(
                "dirty_ns_per_page",
                "ns",
                per(&|x| x.dirty_ns as f64 / x.written.max(1) as f64),
            )
            .push(
                "total_pages_per_ms",
                "pages/ms",
                per(&|x| x.written as f64 / (x.dirty_ns.max(1) as f64 / 1e6)),
            )
            .push("vcpu_pages_per_ms", "pages/ms", per(&vcpu_rate))
            .push("pages_written", "count", per(&|x| x.written as f64))
            .push("pages_dirty", "count", per(&|x| x.found as f64))
            .push("collect_ioctls", "count", per(&|x| x.ioctls as f64));
        push_collection(&mut series, plan.mode, p);
    }
    let metrics = series.finish(results.len(), name, seed);
    let median = |m: &str| metrics.get(m).map(|r| r.median);
    let findings = vec![Finding::DirtyLog {
        variant: name.to_string(),
        pages: results
            .first()
            .and_then(|r| r.passes.first())
            .map_or(0, |p| p.written),
        passes: u64::from(plan.passes) * results.len() as u64,
        wp_faults: median("wp_faults"),
        ioctls: median("collect_ioctls").unwrap_or(0.0),
        ring_full_exits: median("ring_full_exits"),
    }];
    VariantRecord::ok(name, metrics, findings)
}

/// Metrics and findings of every variant.
pub fn analyse(
    names: &[String],
    plans: &[DirtyPlan],
    results: &[Result<Vec<DirtyResult>, VariantStatus>],
    seed: u64,
) -> ScenarioOutcome {
    let variants = per_variant(names, results, |i, name, r| {
        analyse_variant(name, &plans[i], r, seed)
    });
    ScenarioOutcome { variants }
}

/// The dirty scenario.
#[derive(Debug)]
pub struct Dirty;

/// The parameters of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DirtyParams {
    /// Guest memory written and logged, bytes.
    pub size_bytes: u64,
    /// Passes per repetition.
    pub passes: u32,
    /// Pages between two writes.
    pub stride: u32,
    /// Dirty ring entries per vCPU.
    pub ring: u64,
    /// Pages per `KVM_CLEAR_DIRTY_LOG` call.
    pub chunk: u64,
    /// vCPUs writing their own slices at once.
    pub vcpus: u32,
    /// The region's host memory.
    pub backing: DirtyBacking,
    /// The guest's privilege level and watchdog per repetition.
    pub guest: GuestRun,
}

impl Default for DirtyParams {
    fn default() -> DirtyParams {
        DirtyParams {
            size_bytes: 64 << 20,
            passes: 4,
            stride: 1,
            ring: 4096,
            chunk: 4096,
            vcpus: 1,
            backing: DirtyBacking::Anonymous,
            guest: GuestRun::default(),
        }
    }
}

super::memory::runs_guest!(DirtyParams);

/// `size` on `can` (up to 64 GiB, and what this host can back on a real backend), and with
/// `backing`: a hugetlb region is whole huge pages.
fn check_size(p: &DirtyParams, can: Capabilities) -> Result<(), InputError> {
    let size_bytes = p.size_bytes;
    let bad = |why: String| InputError::BadValue {
        key: "size".into(),
        value: size_text(size_bytes),
        why,
    };
    if size_bytes == 0 || !size_bytes.is_multiple_of(2 << 20) || size_bytes > DATA_MAX_BYTES {
        return Err(bad(
            "size must be a non-zero multiple of 2MiB up to 64GiB".into()
        ));
    }
    // The region is populated before the guest runs: more than the host can back would bring
    // the OOM killer.
    super::memory::check_room(size_bytes, can, "populates")?;
    super::memory::check_vcpus(p.vcpus, size_bytes)?;
    if let DirtyBacking::Hugetlb(huge) = p.backing
        && !size_bytes.is_multiple_of(huge.bytes())
    {
        return Err(bad(format!(
            "backing={} takes whole {} MiB pages: make size a multiple of {} MiB",
            BACKING.name(p.backing),
            huge.bytes() >> 20,
            huge.bytes() >> 20
        )));
    }
    Ok(())
}

impl Scenario for Dirty {
    type Plan = DirtyPlan;
    type Params = DirtyParams;
    const INFO: &'static ScenarioInfo = &INFO;
    const PARAMS: &'static [Param<DirtyParams>] = &PARAMS;

    fn check(&self, p: &DirtyParams, can: Capabilities) -> Result<(), InputError> {
        check_size(p, can)
    }

    fn plan(
        &self,
        name: &str,
        request: &RunRequest<DirtyParams>,
    ) -> Result<Option<DirtyPlan>, InputError> {
        let p = &request.params;
        let mode = match name {
            "bitmap" => LogMode::Bitmap,
            "clear" => LogMode::Clear {
                chunk_pages: p.chunk,
            },
            "ring" => LogMode::Ring { entries: p.ring },
            _ => return Ok(None),
        };
        Ok(Some(DirtyPlan {
            size_bytes: p.size_bytes,
            passes: p.passes,
            stride: p.stride,
            mode,
            cpl: p.guest.cpl,
            timeout: p.guest.timeout,
            vcpus: p.vcpus,
            backing: p.backing,
        }))
    }

    fn analyse(&self, o: Observed<'_, DirtyPlan, DirtyResult>) -> ScenarioOutcome {
        analyse(o.names, o.plans, o.results, o.seed)
    }

    fn runnable_threads(&self, plan: &DirtyPlan) -> u32 {
        plan.vcpus
    }

    fn validation(&self, host: &HostInfo) -> Option<ValidationPoint<DirtyParams>> {
        // calibrate times one vCPU and two at 64 MiB (the write-protect fault and the
        // mmu_lock hold): eight vCPUs on a new size is what the model must predict from them,
        // each ring filling once a pass (4096 pages a slice against a 4096-entry ring). An
        // emulated CPU takes milliseconds per fault: a small point there, times unjudged.
        let (mib, passes, vcpus) = if host.cpu_emulated() {
            (16, 1, 2)
        } else {
            (128, 3, 8)
        };
        let params = DirtyParams {
            size_bytes: mib << 20,
            passes,
            vcpus,
            ..DirtyParams::default()
        };
        Some(ValidationPoint {
            variants: &["bitmap", "ring"],
            params,
            model_params: params,
            checks: |model, kvm, v, time| {
                [
                    check(model, kvm, v, "pages_dirty", Rule::Exact(0.0)),
                    check(model, kvm, v, "wp_faults", Rule::Exact(0.0)),
                    check(model, kvm, v, "ring_full_exits", Rule::Exact(0.0)),
                    check(model, kvm, v, "total_pages_per_ms", time),
                ]
                .into_iter()
                .flatten()
                .collect()
            },
        })
    }

    fn charts(&self, _record: &RunRecord) -> Vec<Chart> {
        vec![
            Chart::Bars {
                metric: "collect_ms",
                title: "collecting one pass's dirty log, by method",
            },
            Chart::Bars {
                metric: "dirty_ns_per_page",
                title: "guest time per page written (a write-protect fault each)",
            },
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvlab_core::BackendKind;
    use hvlab_core::dirty::DirtyPass;

    fn plan_of(sets: &[&str], variant: &str) -> Result<DirtyPlan, InputError> {
        crate::scenario::plans_of(&Dirty, sets, &[variant], BackendKind::Kvm)
            .map(|mut v| v.remove(0).1)
    }

    #[test]
    fn variants_map_to_log_modes_with_their_parameters() {
        assert_eq!(plan_of(&[], "bitmap").unwrap().mode, LogMode::Bitmap);
        assert_eq!(
            plan_of(&["chunk=128"], "clear").unwrap().mode,
            LogMode::Clear { chunk_pages: 128 }
        );
        assert_eq!(
            plan_of(&["ring=65536"], "ring").unwrap().mode,
            LogMode::Ring { entries: 65536 }
        );
        assert_eq!(plan_of(&[], "bitmap").unwrap().size_bytes, 64 << 20);
        let many = plan_of(&["vcpus=8", "backing=hugetlb-2m"], "ring").unwrap();
        assert_eq!(
            (many.vcpus, many.backing),
            (8, DirtyBacking::Hugetlb(HugeSize::Mib2))
        );
        assert_eq!(many.written_per_pass(), 16384);
    }

    #[test]
    fn bad_rings_chunks_and_sizes_say_what_is_allowed() {
        for (set, needle) in [
            ("ring=1000", "power of two"),
            ("ring=128", "from 256"),
            ("chunk=100", "multiple of 64"),
            ("chunk=0", "multiple of 64"),
            ("size=3MiB", "multiple of 2MiB"),
            ("passes=0", "from 1 to 100"),
            ("vcpus=5000", "KVM_CAP_MAX_VCPUS"),
            ("vcpus=0", "vcpus is a whole number"),
            ("vcpus=3", "multiple of 3 x 2MiB"),
            ("backing=hugetlb-1g", "multiple of 1024 MiB"),
            ("backing=ntfs", "anon, shmem, hugetlb-2m, hugetlb-1g, gmem"),
        ] {
            let msg = plan_of(&[set], "ring").unwrap_err().to_string();
            assert!(msg.contains(needle), "{set}: {msg}");
        }
        assert!(
            plan_of(&[], "ringz")
                .unwrap_err()
                .to_string()
                .contains("bitmap, clear, ring")
        );
    }

    fn result(found: u64, collect_ns: u64) -> DirtyResult {
        DirtyResult {
            passes: vec![
                DirtyPass {
                    written: 100,
                    found,
                    dirty_ns: 100_000,
                    get_ns: collect_ns,
                    ioctls: 1,
                    wp_faults: Some(100),
                    ..DirtyPass::default()
                };
                2
            ],
        }
    }

    #[test]
    fn a_log_that_misses_a_page_fails_the_variant_and_names_the_counts() {
        let plan = plan_of(&[], "bitmap").unwrap();
        let out = analyse(
            &["bitmap".into()],
            &[plan],
            &[Ok(vec![result(100, 10), result(99, 10)])],
            1,
        );
        let status = out.variants[0].status.to_string();
        assert!(status.starts_with("failed: "), "{status}");
        assert!(
            status.contains("reported 99 pages in pass 1 of repetition 2, the guest wrote 100"),
            "{status}"
        );
    }

    #[test]
    fn the_ring_is_judged_against_the_bitmap_on_collection_time() {
        let bitmap = plan_of(&[], "bitmap").unwrap();
        let ring = plan_of(&[], "ring").unwrap();
        let slow: Vec<DirtyResult> = (0..5).map(|i| result(100, 2_000_000 + i * 1000)).collect();
        let fast: Vec<DirtyResult> = (0..5).map(|i| result(100, 500_000 + i * 1000)).collect();
        let out = analyse(
            &["bitmap".into(), "ring".into()],
            &[bitmap, ring],
            &[Ok(slow), Ok(fast)],
            1,
        );
        let verdicts = crate::scenario::judge_question(
            &Dirty,
            &out.variants,
            &crate::scenario::Baseline::Declared,
            1,
        );
        assert_eq!(verdicts.len(), 1);
        let v = &verdicts[0];
        assert_eq!((v.variant(), v.against()), ("ring", "bitmap"));
        assert_eq!(v.class(), crate::analysis::class::MetricClass::Faster);
        assert!(v.significant && v.ratio > 3.9, "{v:?}");
        let f = out.variants[1].findings[0].to_string();
        assert!(f.contains("exactly the 100 pages"), "{f}");
    }
}
