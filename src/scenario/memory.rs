//! `memory`: stage-2 (EPT/NPT/shadow) fault handling, SPTE prefetch, and host backing.
//!
//! The first guest access to a page faults into KVM, which finds the host page (faulting it in
//! on the host if needed) and installs a leaf stage-2 entry. The legacy and shadow MMUs then
//! prefetch (`direct_pte_prefetch`, `__direct_pte_prefetch`, `direct_pte_prefetch_many`): they
//! also map the not-present SPTEs of the 8-aligned group (`PTE_PREFETCH_NUM`) around the fault,
//! but only for host pages already present — an atomic lookup, never a host fault. The TDP MMU
//! does not prefetch. So host backing decides how many stage-2 faults a first touch costs:
//! lazy memory faults once per page, populated memory once per 8 pages. A VMM restoring memory
//! lazily with userfaultfd faces the same choice one level up, and can prefetch itself.
//!
//! Each repetition builds a fresh VM whose data region (its own memslot at 4 GiB) has the
//! variant's backing, then runs a guest loop that touches the region in the chosen order,
//! timed between the guest's `Start` and `End` signals with KVM statistics read at both.
//! Metrics are per pass over the region; `kvm.vcpu.*`/`kvm.vm.*` are the statistics' deltas
//! over that pass (exact counts).

use std::time::Duration;

use super::params::{Choice, Param, Text, Values, bytes, choice, size_text};
use super::runner::{RunRequest, ScenarioOutcome};
use super::samples::{Series, per_variant};
use super::{Chart, Notice, Observed, Scenario, ValidationPoint};
use super::{IcountTolerance, MetricInfo, ScenarioInfo, VariantInfo};
use crate::analysis::Direction;
use crate::analysis::validate::{Rule, check, check_count};
use crate::error::InputError;
use crate::record::RunRecord;
use crate::record::VariantStatus;
use crate::record::{Finding, VariantRecord};
use hvlab_core::Capabilities;
use hvlab_core::guest::Backing;
use hvlab_core::guest::Cpl;
use hvlab_core::guest::GuestPage;
use hvlab_core::host::HostInfo;
use hvlab_core::memory::{
    Access, HostBacking, HugeSize, Pattern, PrefetchLoop, Stage2Mmu, Touch, TouchPlan, TouchResult,
};

/// The catalog entry.
pub static INFO: ScenarioInfo = ScenarioInfo {
    name: "memory",
    summary: "first-touch stage-2 faults and SPTE prefetch under each host backing, userfaultfd with prefetch",
    variants: &VARIANTS,
    model_variants: &MODEL_VARIANTS,
    metrics: &METRICS,
    headline: "ns_per_page",
    question: super::Question {
        asks: "what each host backing costs or saves per page against plain lazy memory, and how many pages each stage-2 fault maps (SPTE prefetch)",
        baseline: Some("lazy"),
        // The host backings; the model's MMU variants are judged in their own pairs.
        judged: &[
            "populated",
            "thp",
            "uffd",
            "uffd-prefetch",
            "shmem",
            "hugetlb-2m",
            "hugetlb-1g",
            "gmem",
            "uffd-minor",
            "uffd-minor-hugetlb",
            "prefault",
        ],
        // Thread 004's fix (the trailing run prefetched), and what prefetch buys at all.
        pairs: &[("legacy", "legacy-skip-trailing"), ("legacy", "none")],
        within: None,
        costs: false,
    },
    runs_on: super::any_backend,
    // 6 a side: the 11 backings against lazy (13 comparisons on the model) are decidable
    // under Holm (13 · 2/924 = 0.028 < 0.05); 5 a side could call nothing (11 · 2/252 > 0.05).
    default_reps: 6,
    default_warmup: 1,
};

static VARIANTS: [VariantInfo; 12] = [
    VariantInfo {
        name: "lazy",
        doc: "plain anonymous 4 KiB memory (MADV_NOHUGEPAGE): every first touch is also a host fault",
    },
    VariantInfo {
        name: "populated",
        doc: "4 KiB memory (MADV_NOHUGEPAGE), MADV_POPULATE_WRITE before the guest runs: prefetch can map neighbours",
    },
    VariantInfo {
        name: "thp",
        doc: "2 MiB-aligned MADV_HUGEPAGE (needs THP mode madvise or always)",
    },
    VariantInfo {
        name: "uffd",
        doc: "userfaultfd missing mode, one UFFDIO_COPY per faulting page",
    },
    VariantInfo {
        name: "uffd-prefetch",
        doc: "userfaultfd serving the faulting page and the unserved rest of its window",
    },
    VariantInfo {
        name: "shmem",
        doc: "a memfd (shmem) mapped shared: every first touch is a shmem fault",
    },
    VariantInfo {
        name: "hugetlb-2m",
        doc: "a hugetlb memfd of 2 MiB pages (MFD_HUGETLB); hvlab grows /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages by what it lacks and sets it back afterwards (root)",
    },
    VariantInfo {
        name: "hugetlb-1g",
        doc: "a hugetlb memfd of 1 GiB pages (size a multiple of 1GiB); the hugepages-1048576kB pool reserved and set back the same way",
    },
    VariantInfo {
        name: "gmem",
        doc: "guest_memfd (KVM_CREATE_GUEST_MEMFD, mmap-able, shared) as the slot through KVM_SET_USER_MEMORY_REGION2: KVM faults from the file",
    },
    VariantInfo {
        name: "uffd-minor",
        doc: "a shmem memfd whose page cache is full, mapped lazily: userfaultfd MINOR faults, UFFDIO_CONTINUE over --set window pages",
    },
    VariantInfo {
        name: "uffd-minor-hugetlb",
        doc: "a hugetlb memfd of 2 MiB pages whose page cache is full, mapped lazily: userfaultfd MINOR faults (UFFD_FEATURE_MINOR_HUGETLBFS), one UFFDIO_CONTINUE per huge page; the pool reserved and set back as for hugetlb-2m",
    },
    VariantInfo {
        name: "prefault",
        doc: "host memory populated writable, then KVM_PRE_FAULT_MEMORY maps all of stage 2 before the guest runs (TDP hosts)",
    },
];

/// The legacy MMU's direct-map fault path (and its SPTE prefetch, thread 004's fix) runs
/// only with the TDP MMU off: the default TDP MMU maps through `kvm_tdp_mmu_map()` and does not
/// prefetch.
pub static REACHES: [super::Reaches; 1] = [super::Reaches {
    file: "arch/x86/kvm/mmu/mmu.c",
    functions: &[
        "__direct_pte_prefetch",
        "direct_pte_prefetch",
        "direct_pte_prefetch_many",
        "direct_map",
        "direct_page_fault",
    ],
    by: "the legacy MMU",
    kvm_param: "kvm.tdp_mmu=N",
}];

static MODEL_VARIANTS: [VariantInfo; 3] = [
    VariantInfo {
        name: "none",
        doc: "model: no prefetch (the TDP MMU), host memory per --set backing",
    },
    VariantInfo {
        name: "legacy-skip-trailing",
        doc: "model: the old __direct_pte_prefetch loop that never flushed the run reaching the block end",
    },
    VariantInfo {
        name: "legacy",
        doc: "model: the fixed loop that prefetches the trailing run too",
    },
];

/// `access`.
static ACCESS: Choice<Access, 2> = Choice {
    names: ["read", "write"],
    values: [Access::Read, Access::Write],
};

/// `touch`.
static TOUCH: Choice<Touch, 2> = Choice {
    names: ["first-byte", "whole-page"],
    values: [Touch::FirstByte, Touch::WholePage],
};

/// `guest_page`.
static GUEST_PAGE: Choice<GuestPage, 2> = Choice {
    names: ["4k", "2m"],
    values: [GuestPage::Small, GuestPage::Huge],
};

/// `backing` of the model's prefetch variants.
static BACKING: Choice<Backing, 3> = Choice {
    names: ["lazy", "populated", "thp"],
    values: [Backing::Lazy, Backing::Populated, Backing::Thp],
};

/// Each parameter, declared once.
pub static PARAMS: [Param<MemoryParams>; 10] = [
    bytes!("size" => size_bytes, "data region, a multiple of 2 MiB (up to 64GiB; the model: 16TiB, random 64GiB)"),
    Param {
        name: "pattern",
        doc: "seq, reverse, random (seeded by --seed), or stride=K (every K-th page)",
        values: Values::Described,
        model_only: false,
        read: |p, t| {
            p.pattern = parse_pattern(t)?;
            Ok(())
        },
        spell: |p| pattern_text(p.pattern),
    },
    choice!(access, ACCESS, "read or write"),
    choice!(
        touch,
        TOUCH,
        "first-byte (one access per page) or whole-page (every cache line)"
    ),
    choice!(
        guest_page,
        GUEST_PAGE,
        "guest page size for the data region: 4k or 2m"
    ),
    Param {
        name: "window",
        doc: "uffd-prefetch window in pages",
        values: Values::Range(1, 512),
        model_only: false,
        read: |p, t| {
            p.window = t.whole()? as usize;
            Ok(())
        },
        spell: |p| p.window.to_string(),
    },
    guest_cpl(),
    guest_timeout("watchdog for one pass, ms"),
    Param {
        name: "vcpus",
        doc: "vCPUs touching the region at once, each its own slice (size a multiple of vcpus x 2MiB); at most the host's KVM_CAP_MAX_VCPUS",
        values: Values::Described,
        model_only: false,
        read: |p, t| {
            p.vcpus = vcpu_count(t)?;
            Ok(())
        },
        spell: |p| p.vcpus.to_string(),
    },
    choice!("backing" => model_backing, BACKING, "model prefetch variants: host memory lazy, populated or thp", model),
];

static METRICS: [MetricInfo; 10] = [
    MetricInfo {
        name: "ns_per_page",
        unit: "ns",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "host time from the guest's Start to End signal per page touched",
    },
    MetricInfo {
        name: "total_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "host time of the pass",
    },
    MetricInfo {
        name: "total_pages_per_ms",
        unit: "pages/ms",
        better: Direction::HigherIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "pages touched by all vCPUs per ms from the common start to the last vCPU's End",
    },
    MetricInfo {
        name: "vcpu_pages_per_ms",
        unit: "pages/ms",
        better: Direction::HigherIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "each vCPU's own rate (its slice over its own time), the mean over the vCPUs of a pass",
    },
    MetricInfo {
        name: "hugetlb_pool_before",
        unit: "pages",
        // The host's setting before the pass, not the kernel's doing.
        better: Direction::Neither,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "hugetlb variants: the pool's size before hvlab grew it (it is set back to this after each pass)",
    },
    MetricInfo {
        name: "hugetlb_pool_during",
        unit: "pages",
        // What hvlab set the pool to for the pass.
        better: Direction::Neither,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "hugetlb variants: the pool's size while the pass ran",
    },
    MetricInfo {
        name: "uffd_faults",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "userfaultfd page faults served (uffd variants), per pass",
    },
    MetricInfo {
        name: "guest_table_pages",
        unit: "count",
        // The guest's own page-table pages: what its layout needs, subtracted from the faults.
        better: Direction::Neither,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "with TDP: the guest page-table pages the pass faulted on (counted in kvm.vcpu.pf_fixed, subtracted from the data faults)",
    },
    MetricInfo {
        name: "kvm.vcpu.<stat>",
        unit: "count",
        // The guest's own kernel touches a page or two more or less per pass (a lazy pass of 4096
        // pages: 4096 → 4097 faults), so a change under 1% of the count is a change, not a
        // regression.
        better: Direction::LowerIsBetter,
        count_tolerance: 0.01,
        icount_tolerance: IcountTolerance::TIME,
        doc: "vCPU statistics that changed during the pass (pf_fixed, pf_taken, exits, ...)",
    },
    MetricInfo {
        name: "kvm.vm.<stat>",
        unit: "count",
        // As the vCPU statistics: a page or two of the guest kernel's own is noise.
        better: Direction::LowerIsBetter,
        count_tolerance: 0.01,
        icount_tolerance: IcountTolerance::TIME,
        doc: "VM statistics that changed during the pass",
    },
];

fn parse_pattern(t: &Text<'_>) -> Result<Pattern, InputError> {
    let bad = || t.bad("pattern is seq, reverse, random or stride=K with K from 1 to 4096");
    match t.raw {
        "seq" => Ok(Pattern::Seq),
        "reverse" => Ok(Pattern::Reverse),
        "random" => Ok(Pattern::Random),
        other => other
            .strip_prefix("stride=")
            .and_then(|k| k.parse::<u32>().ok())
            .filter(|k| (1..=4096).contains(k))
            .map(Pattern::Stride)
            .ok_or_else(bad),
    }
}

/// A pattern as `--set pattern=` spells it.
fn pattern_text(pattern: Pattern) -> String {
    match pattern {
        Pattern::Seq => "seq".into(),
        Pattern::Reverse => "reverse".into(),
        Pattern::Random => "random".into(),
        Pattern::Stride(k) => format!("stride={k}"),
    }
}

/// Parameters of a scenario that runs guest code: they hold a [`GuestRun`], whose two
/// parameters ([`guest_cpl`], [`guest_timeout`]) every such scenario declares alike.
pub trait RunsGuest {
    /// The guest's run settings.
    fn guest(&self) -> &GuestRun;
    /// The same, to read `--set` text into.
    fn guest_mut(&mut self) -> &mut GuestRun;
}

/// The `guest.cpl` parameter of a scenario that runs guest code.
pub const fn guest_cpl<P: RunsGuest>() -> Param<P> {
    Param {
        name: "guest.cpl",
        doc: "0 or 3; default 3 on PVM (CPL0 is emulated there), 0 elsewhere",
        values: Values::Described,
        model_only: false,
        read: read_cpl::<P>,
        spell: spell_cpl::<P>,
    }
}

/// The `timeout_ms` parameter (the guest's watchdog, from 100 ms to an hour) of a scenario
/// that runs guest code, with what one watched run is there.
pub const fn guest_timeout<P: RunsGuest>(doc: &'static str) -> Param<P> {
    Param {
        name: "timeout_ms",
        doc,
        values: Values::Range(100, 3_600_000),
        model_only: false,
        read: read_timeout::<P>,
        spell: spell_timeout::<P>,
    }
}

fn read_cpl<P: RunsGuest>(p: &mut P, t: &Text<'_>) -> Result<(), InputError> {
    p.guest_mut().cpl = parse_cpl(t)?;
    Ok(())
}

fn spell_cpl<P: RunsGuest>(p: &P) -> String {
    match p.guest().cpl {
        None => String::new(),
        Some(Cpl::Zero) => "0".into(),
        Some(Cpl::Three) => "3".into(),
    }
}

fn read_timeout<P: RunsGuest>(p: &mut P, t: &Text<'_>) -> Result<(), InputError> {
    p.guest_mut().timeout = Duration::from_millis(u64::from(t.whole()?));
    Ok(())
}

fn spell_timeout<P: RunsGuest>(p: &P) -> String {
    p.guest().timeout.as_millis().to_string()
}

/// The guest CPL from `guest.cpl`; `None` when unset (the backend picks for its host).
fn parse_cpl(t: &Text<'_>) -> Result<Option<Cpl>, InputError> {
    match t.raw {
        "" => Ok(None),
        "0" => Ok(Some(Cpl::Zero)),
        "3" => Ok(Some(Cpl::Three)),
        _ => Err(t.bad("guest.cpl is 0 or 3")),
    }
}

/// How a scenario's guest runs: its privilege level and its watchdog (`guest.cpl`,
/// `timeout_ms`), the two parameters every scenario that runs guest code shares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuestRun {
    /// The guest's privilege level (None: this host's default).
    pub cpl: Option<Cpl>,
    /// Watchdog per repetition.
    pub timeout: Duration,
}

impl Default for GuestRun {
    /// This host's CPL, and a minute's watchdog.
    fn default() -> GuestRun {
        GuestRun {
            cpl: None,
            timeout: Duration::from_secs(60),
        }
    }
}

/// `vcpus`: the region must split into whole 2 MiB pages per vCPU (read with
/// [`vcpu_count`]).
pub fn check_vcpus(vcpus: u32, size_bytes: u64) -> Result<(), InputError> {
    if size_bytes.is_multiple_of(u64::from(vcpus) * (2 << 20)) {
        return Ok(());
    }
    Err(InputError::BadValue {
        key: "vcpus".into(),
        value: vcpus.to_string(),
        why: format!(
            "each vCPU touches its own slice of whole 2MiB pages: make size a multiple of {vcpus} x 2MiB = {}MiB, or change vcpus",
            2 * vcpus
        ),
    })
}

/// `vcpus` alone: from 1 to the host's `KVM_CAP_MAX_VCPUS` on the kvm backend (asked before
/// any VM is built), or KVM's own `KVM_MAX_VCPUS` on the model.
pub fn vcpu_count(t: &Text<'_>) -> Result<u32, InputError> {
    let (cap, source) = host_max_vcpus(t.can);
    let n = t
        .raw
        .parse::<u32>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| {
            t.bad(format!(
                "vcpus is a whole number from 1 to {cap} ({source})"
            ))
        })?;
    if n > cap {
        return Err(t.bad(format!(
            "{n} vCPUs exceed {source}, {cap}: choose vcpus <= {cap}"
        )));
    }
    Ok(n)
}

/// The most vCPUs a VM may have on `backend`, and where that figure comes from.
fn host_max_vcpus(backend: Capabilities) -> (u32, &'static str) {
    #[cfg(hvlab_kvm)]
    if backend.real_memory
        && let Some(cap) = crate::kvm::vm::max_vcpus()
    {
        return (cap, "this host's KVM_CAP_MAX_VCPUS");
    }
    let _ = backend;
    (hvlab_core::memory::MODEL_MAX_VCPUS, "KVM_MAX_VCPUS on x86")
}

/// Metrics and prefetch findings from every variant's passes.
pub fn analyse(
    names: &[String],
    results: &[Result<Vec<TouchResult>, VariantStatus>],
    mmu: Option<Stage2Mmu>,
    seed: u64,
) -> ScenarioOutcome {
    let variants = per_variant(names, results, |_, name, passes| {
        analyse_variant(name, passes, mmu, seed)
    });
    ScenarioOutcome { variants }
}

fn analyse_variant(
    name: &str,
    passes: &[TouchResult],
    mmu: Option<Stage2Mmu>,
    seed: u64,
) -> VariantRecord {
    // Only with TDP do the guest's own page tables fault at stage 2.
    let tdp = matches!(mmu, Some(Stage2Mmu::TdpMmu | Stage2Mmu::TdpLegacy));
    let mut series = Series::new();
    for (rep, p) in passes.iter().enumerate() {
        series
            .at(rep)
            .push(
                "ns_per_page",
                "ns",
                p.elapsed_ns as f64 / p.pages.max(1) as f64,
            )
            .push("total_ms", "ms", p.elapsed_ns as f64 / 1e6);
        let wall_ms = p.elapsed_ns.max(1) as f64 / 1e6;
        series.push("total_pages_per_ms", "pages/ms", p.pages as f64 / wall_ms);
        let vcpu_rate = if p.vcpu_ns.is_empty() {
            p.pages as f64 / wall_ms
        } else {
            let slice = p.pages as f64 / p.vcpu_ns.len() as f64;
            p.vcpu_ns
                .iter()
                .map(|ns| slice / (*ns).max(1) as f64 * 1e6)
                .sum::<f64>()
                / p.vcpu_ns.len() as f64
        };
        series.push("vcpu_pages_per_ms", "pages/ms", vcpu_rate);
        if let Some((before, during)) = p.hugetlb_pool {
            series
                .push("hugetlb_pool_before", "pages", before as f64)
                .push("hugetlb_pool_during", "pages", during as f64);
        }
        if let Some(f) = p.uffd_faults {
            series.push("uffd_faults", "count", f as f64);
        }
        if let Some(t) = p.guest_table_pages.filter(|_| tdp) {
            series.push("guest_table_pages", "count", t as f64);
        }
        for (stat, unit, delta) in &p.kvm_stats {
            series.push(stat, unit, *delta as f64);
        }
    }
    let metrics = series.finish(passes.len(), name, seed);
    let pages = passes.first().map_or(0, |p| p.pages);
    let mut findings = Vec::new();
    if let Some(fixed) = metrics.get("kvm.vcpu.pf_fixed").filter(|m| m.median > 0.0) {
        findings.push(Finding::FaultsPerPage {
            pages,
            pf_fixed: fixed.median,
            table_pages: metrics.get("guest_table_pages").map_or(0.0, |m| m.median),
            mmu,
        });
    }
    if let Some(uffd) = metrics.get("uffd_faults").filter(|m| m.median > 0.0) {
        findings.push(Finding::UserfaultfdFaults {
            pages,
            faults: uffd.median,
        });
    }
    VariantRecord::ok(name, metrics, findings)
}

/// The memory scenario.
#[derive(Debug)]
pub struct Memory;

/// The parameters of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MemoryParams {
    /// The anonymous backing of the model's prefetch variants.
    pub model_backing: Backing,
    /// Guest memory touched, bytes.
    pub size_bytes: u64,
    /// Order of the first touches.
    pub pattern: Pattern,
    /// Read or write touches.
    pub access: Access,
    /// One byte or the whole page per touch.
    pub touch: Touch,
    /// The guest's page size.
    pub guest_page: GuestPage,
    /// Pages resolved per userfault by the prefetching variants.
    pub window: usize,
    /// vCPUs touching their own slices.
    pub vcpus: u32,
    /// The guest's privilege level and watchdog per pass.
    pub guest: GuestRun,
}

impl MemoryParams {
    /// Thread 004's setup: the first byte of every 4 KiB page of 6 GiB, preallocated, on the
    /// legacy direct MMU (its showcase and its fidelity rows run the same).
    pub fn trailing_prefetch() -> MemoryParams {
        MemoryParams {
            size_bytes: 6 << 30,
            pattern: Pattern::Seq,
            touch: Touch::FirstByte,
            guest_page: GuestPage::Small,
            model_backing: Backing::Populated,
            ..MemoryParams::default()
        }
    }
}

impl Default for MemoryParams {
    fn default() -> MemoryParams {
        MemoryParams {
            model_backing: Backing::Populated,
            size_bytes: 256 << 20,
            pattern: Pattern::Seq,
            access: Access::Write,
            touch: Touch::FirstByte,
            guest_page: GuestPage::Huge,
            window: 8,
            vcpus: 1,
            guest: GuestRun::default(),
        }
    }
}

/// [`RunsGuest`] for parameters that keep their [`GuestRun`] in a field `guest`.
macro_rules! runs_guest {
    ($params:ty) => {
        impl $crate::scenario::memory::RunsGuest for $params {
            fn guest(&self) -> &$crate::scenario::memory::GuestRun {
                &self.guest
            }

            fn guest_mut(&mut self) -> &mut $crate::scenario::memory::GuestRun {
                &mut self.guest
            }
        }
    };
}
pub(crate) use runs_guest;

runs_guest!(MemoryParams);

/// `size` on `can`: a multiple of 2 MiB that this host can back on a real backend; the
/// model keeps ordered passes as runs of identical blocks (up to 16TiB: page indices are
/// u32, and users model VMs of 1-12TiB) but a random order page by page
/// (model::memory::PER_PAGE_MAX_PAGES).
fn check_size(p: &MemoryParams, can: Capabilities) -> Result<(), InputError> {
    let size_bytes = p.size_bytes;
    let (cap, cap_why) = if can.real_memory || p.pattern == Pattern::Random {
        (
            64u64 << 30,
            "up to 64GiB (on the model: random orders; seq, reverse and stride up to 16TiB)",
        )
    } else {
        (16u64 << 40, "up to 16TiB")
    };
    let bad = |why: String| InputError::BadValue {
        key: "size".into(),
        value: size_text(size_bytes),
        why,
    };
    if size_bytes == 0 || !size_bytes.is_multiple_of(2 << 20) || size_bytes > cap {
        return Err(bad(format!(
            "size must be a non-zero multiple of 2MiB {cap_why}"
        )));
    }
    // A guest whose memory the host cannot back is OOM-killed part way (with the whole
    // machine under pressure).
    check_room(size_bytes, can, "needs")
}

/// On a real backend, refuses a guest region of `size_bytes` that this host cannot back now,
/// before any work, with the numbers (`use_`: what the kvm backend does with the region).
pub(crate) fn check_room(size_bytes: u64, can: Capabilities, use_: &str) -> Result<(), InputError> {
    if !can.real_memory {
        return Ok(());
    }
    match memory_room() {
        Some((room, source)) if size_bytes > room => Err(InputError::BadValue {
            key: "size".into(),
            value: size_text(size_bytes),
            why: format!(
                "this host can back at most {:.1} GiB now ({source}); the kvm backend {use_} the whole {:.1} GiB: choose a smaller size, or --backend model",
                room as f64 / f64::from(1u32 << 30),
                size_bytes as f64 / f64::from(1u32 << 30),
            ),
        }),
        _ => Ok(()),
    }
}

impl Scenario for Memory {
    type Plan = TouchPlan;
    type Params = MemoryParams;
    const INFO: &'static ScenarioInfo = &INFO;
    const PARAMS: &'static [Param<MemoryParams>] = &PARAMS;

    fn check(&self, p: &MemoryParams, can: Capabilities) -> Result<(), InputError> {
        check_size(p, can)?;
        check_vcpus(p.vcpus, p.size_bytes)
    }

    fn plan(
        &self,
        name: &str,
        request: &RunRequest<MemoryParams>,
    ) -> Result<Option<TouchPlan>, InputError> {
        let p = &request.params;
        let (backing, prefetch) = match name {
            "lazy" => (HostBacking::Anonymous(Backing::Lazy), None),
            "populated" => (HostBacking::Anonymous(Backing::Populated), None),
            "thp" => (HostBacking::Anonymous(Backing::Thp), None),
            "uffd" => (HostBacking::Uffd(1), None),
            "uffd-prefetch" => (HostBacking::Uffd(p.window), None),
            "prefault" => (HostBacking::PreFault, None),
            "shmem" => (HostBacking::Shmem, None),
            "hugetlb-2m" => (HostBacking::Hugetlb(HugeSize::Mib2), None),
            "hugetlb-1g" => (HostBacking::Hugetlb(HugeSize::Gib1), None),
            "gmem" => (HostBacking::GuestMemfd, None),
            "uffd-minor" => (HostBacking::UffdMinor(p.window), None),
            "uffd-minor-hugetlb" => (HostBacking::UffdMinorHugetlb, None),
            "none" => (
                HostBacking::Anonymous(p.model_backing),
                Some(PrefetchLoop::None),
            ),
            "legacy-skip-trailing" => (
                HostBacking::Anonymous(p.model_backing),
                Some(PrefetchLoop::LegacySkipTrailing),
            ),
            _ => (
                HostBacking::Anonymous(p.model_backing),
                Some(PrefetchLoop::Legacy),
            ),
        };
        Ok(Some(TouchPlan {
            size_bytes: p.size_bytes,
            pattern: p.pattern,
            seed: request.seed,
            access: p.access,
            touch: p.touch,
            guest_page: p.guest_page,
            backing,
            cpl: p.guest.cpl,
            timeout: p.guest.timeout,
            prefetch,
            vcpus: p.vcpus,
        }))
    }

    fn analyse(&self, o: Observed<'_, TouchPlan, TouchResult>) -> ScenarioOutcome {
        analyse(o.names, o.results, Stage2Mmu::of(o.host), o.seed)
    }

    fn charts(&self, record: &RunRecord) -> Vec<Chart> {
        // The model counts its own faults; the kvm backend reports KVM's statistic.
        let metric = if record.backend.capabilities().kvm_stats {
            "kvm.vcpu.pf_fixed"
        } else {
            "faults"
        };
        vec![Chart::Bars {
            metric,
            title: "stage-2 faults per pass by host backing",
        }]
    }

    fn context(&self, record: &RunRecord) -> Vec<Notice> {
        let thp = &record.host.thp;
        if record.backend.capabilities().real_memory && thp != "never" {
            vec![Notice::ThpMode { mode: thp.clone() }]
        } else {
            Vec::new()
        }
    }

    fn runnable_threads(&self, plan: &TouchPlan) -> u32 {
        plan.vcpus
    }

    fn showcases(&self) -> Vec<super::Showcase<MemoryParams>> {
        vec![super::Showcase {
            profile: "intel-spr-vmx",
            variants: &["legacy-skip-trailing", "legacy"],
            params: MemoryParams::trailing_prefetch(),
            why: "004 (prefetch of the trailing SPTEs): the first byte of every 4 KiB page of 6 GiB of preallocated memory on the legacy direct MMU; the old __direct_pte_prefetch() loop never flushed the run reaching the block's end, the fix prefetches it",
            headline: Some(super::Headline {
                thread: "004",
                before_run: None,
                sides: None,
                pairs: &[super::HeadlinePair {
                    about: "first touch of 6 GiB, per page",
                    before: "legacy-skip-trailing",
                    after: "legacy",
                    metric: "ns_per_page",
                    shown: &["kvm.vcpu.pf_fixed"],
                }],
            }),
        }]
    }

    fn validation(&self, host: &HostInfo) -> Option<ValidationPoint<MemoryParams>> {
        // Not the calibration point (64 MiB, sequential): a new size and order. An emulated
        // CPU takes milliseconds per fault: a small one there.
        let params = MemoryParams {
            size_bytes: if host.cpu_emulated() {
                16 << 20
            } else {
                128 << 20
            },
            pattern: Pattern::Random,
            ..MemoryParams::default()
        };
        Some(ValidationPoint {
            variants: &["lazy", "populated", "uffd-prefetch"],
            params,
            model_params: params,
            checks: |model, kvm, v, time| {
                // The guest's own page tables fault too with TDP (a known extra the kvm run
                // counts); beyond that a stray fault or two (the guest's stack) is allowed,
                // prefetch errors are not.
                [
                    check_count(model, kvm, v, "kvm.vcpu.pf_fixed", "guest_table_pages", 2.0),
                    check(model, kvm, v, "uffd_faults", Rule::Exact(2.0)),
                    check(model, kvm, v, "ns_per_page", time),
                ]
                .into_iter()
                .flatten()
                .collect()
            },
        })
    }
}

/// How much memory a guest can have now: the smaller of `MemAvailable` and the room left under
/// every memory cgroup limit on the way to the root (v2 `memory.max` minus `memory.current`,
/// v1 `memory.limit_in_bytes` minus `memory.usage_in_bytes`),
/// with where the figure comes from; `None` when neither can be read.
pub(crate) fn memory_room() -> Option<(u64, String)> {
    let mut best: Option<(u64, String)> = None;
    let mut consider = |bytes: u64, what: String| {
        if best.as_ref().is_none_or(|(b, _)| bytes < *b) {
            best = Some((bytes, what));
        }
    };
    if let Ok(info) = std::fs::read_to_string("/proc/meminfo")
        && let Some(kib) = info
            .lines()
            .find_map(|l| l.strip_prefix("MemAvailable:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    {
        consider(
            kib.saturating_mul(1024),
            "MemAvailable in /proc/meminfo".into(),
        );
    }
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (root, max_file, current_file) = match controllers {
            "" => ("/sys/fs/cgroup", "memory.max", "memory.current"),
            c if c.split(',').any(|c| c == "memory") => (
                "/sys/fs/cgroup/memory",
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            ),
            _ => continue,
        };
        let mut dir = std::path::Path::new(root).join(path.trim_start_matches('/'));
        loop {
            let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
            if let (Some(max), Some(current)) = (read(max_file), read(current_file))
                && let (Ok(max), Ok(current)) =
                    (max.trim().parse::<u64>(), current.trim().parse::<u64>())
            {
                consider(
                    max.saturating_sub(current),
                    format!("the memory cgroup limit in {}", dir.display()),
                );
            }
            if !dir.pop() || !dir.starts_with(root) {
                break;
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvlab_core::BackendKind;

    fn plans(sets: &[&str], backend: BackendKind) -> Result<Vec<(String, TouchPlan)>, InputError> {
        crate::scenario::plans_of(&Memory, sets, &[], backend)
    }

    fn plan_of(sets: &[&str], variant: &str) -> TouchPlan {
        crate::scenario::plans_of(&Memory, sets, &[variant], BackendKind::Model)
            .unwrap()
            .remove(0)
            .1
    }

    #[test]
    fn patterns_cover_the_pages_they_should() {
        let seq = plan_of(&["size=8MiB"], "lazy").page_order();
        assert_eq!(seq.len(), 2048);
        assert_eq!(&seq[..3], &[0, 1, 2]);
        let rev = plan_of(&["size=8MiB", "pattern=reverse"], "lazy").page_order();
        assert_eq!(rev[0], 2047);
        let stride = plan_of(&["size=8MiB", "pattern=stride=4"], "lazy").page_order();
        assert_eq!(stride.len(), 512);
        assert_eq!(&stride[..3], &[0, 4, 8]);
        let mut random = plan_of(&["size=8MiB", "pattern=random"], "lazy").page_order();
        assert_ne!(random, seq, "a permutation, not the identity");
        random.sort_unstable();
        assert_eq!(random, seq, "every page exactly once");
    }

    #[test]
    fn random_order_is_reproducible_from_the_seed() {
        let a = plan_of(&["size=4MiB", "pattern=random"], "lazy").page_order();
        let b = plan_of(&["size=4MiB", "pattern=random"], "lazy").page_order();
        assert_eq!(a, b);
    }

    #[test]
    fn variants_map_to_backings() {
        assert_eq!(
            plan_of(&[], "populated").backing,
            HostBacking::Anonymous(Backing::Populated)
        );
        assert_eq!(plan_of(&[], "uffd").backing, HostBacking::Uffd(1));
        assert_eq!(
            plan_of(&["window=64"], "uffd-prefetch").backing,
            HostBacking::Uffd(64)
        );
        assert_eq!(plan_of(&["guest.cpl=0"], "lazy").cpl, Some(Cpl::Zero));
        assert_eq!(plan_of(&[], "lazy").guest_page, GuestPage::Huge);
    }

    #[test]
    fn the_model_runs_ordered_passes_up_to_16tib_and_random_ones_up_to_64gib() {
        let ok = |sets: &[&str], b| plans(sets, b).is_ok();
        assert!(ok(&["size=12TiB"], BackendKind::Model));
        assert!(ok(&["size=16TiB", "pattern=stride=7"], BackendKind::Model));
        assert!(!ok(&["size=17TiB"], BackendKind::Model));
        assert!(ok(&["size=64GiB", "pattern=random"], BackendKind::Model));
        assert!(!ok(&["size=66GiB", "pattern=random"], BackendKind::Model));
        assert!(!ok(&["size=66GiB"], BackendKind::Kvm));
    }

    #[test]
    fn bad_values_say_what_is_allowed() {
        for (set, needle) in [
            ("size=3MiB", "multiple of 2MiB"),
            ("pattern=zigzag", "stride=K"),
            ("access=poke", "read, write"),
            ("guest_page=1g", "4k, 2m"),
            ("guest.cpl=1", "0 or 3"),
            ("window=0", "from 1 to 512"),
        ] {
            let msg = plans(&[set], BackendKind::Kvm).unwrap_err().to_string();
            assert!(msg.contains(needle), "{set}: {msg}");
        }
        assert!(
            crate::scenario::plans_of(&Memory, &[], &["hugetlb"], BackendKind::Kvm)
                .unwrap_err()
                .to_string()
                .contains("uffd-prefetch")
        );
    }

    #[test]
    fn analysis_reports_pages_per_fault() {
        let pass = |fixed: i128, ns: u64| TouchResult {
            pages: 65536,
            elapsed_ns: ns,
            uffd_faults: None,
            kvm_stats: vec![("kvm.vcpu.pf_fixed".into(), "count".into(), fixed)],
            guest_table_pages: Some(1),
            vcpu_ns: Vec::new(),
            hugetlb_pool: None,
        };
        let out = analyse(
            &["lazy".into(), "populated".into()],
            &[
                Ok(vec![pass(65537, 900_000_000); 3]),
                Ok(vec![
                    pass(8193, 80_000_000),
                    pass(8193, 81_000_000),
                    pass(8193, 79_000_000),
                ]),
            ],
            Some(Stage2Mmu::Shadow),
            1,
        );
        assert_eq!(out.variants[1].metrics["kvm.vcpu.pf_fixed"].median, 8193.0);
        let msg = out.variants[1].findings[0].to_string();
        assert!(msg.contains("8.00 pages mapped per stage-2 fault"), "{msg}");
        assert!(
            out.variants[0].findings[0]
                .to_string()
                .contains("no prefetch")
        );
        let verdicts = crate::scenario::judge_question(
            &Memory,
            &out.variants,
            &crate::scenario::Baseline::Declared,
            1,
        );
        assert_eq!(
            (verdicts[0].variant(), verdicts[0].against()),
            ("populated", "lazy")
        );
        // Three passes a side are too few for the rule: not decided, never "no change".
        assert_eq!(
            verdicts[0].class(),
            crate::analysis::class::MetricClass::NotDecided
        );
        assert!(!out.variants[0].metrics.contains_key("guest_table_pages"));
    }

    #[test]
    fn on_tdp_the_guest_page_tables_are_counted_apart() {
        let pass = TouchResult {
            pages: 2048,
            elapsed_ns: 1_000_000,
            uffd_faults: None,
            kvm_stats: vec![("kvm.vcpu.pf_fixed".into(), "count".into(), 2053)],
            guest_table_pages: Some(5),
            vcpu_ns: Vec::new(),
            hugetlb_pool: None,
        };
        let out = analyse(
            &["lazy".into()],
            &[Ok(vec![pass.clone(); 2])],
            Some(Stage2Mmu::TdpMmu),
            1,
        );
        let v = &out.variants[0];
        assert_eq!(v.metrics["guest_table_pages"].median, 5.0);
        let msg = v.findings[0].to_string();
        assert!(
            msg.contains("= 2,048 on the data + 5 on the guest's own page-table pages"),
            "{msg}"
        );
        assert!(msg.contains("1.00 pages mapped per stage-2 fault"), "{msg}");
        assert!(msg.contains("TDP MMU never prefetches"), "{msg}");
        let huge = TouchResult {
            kvm_stats: vec![("kvm.vcpu.pf_fixed".into(), "count".into(), 9)],
            ..pass
        };
        let out = analyse(
            &["thp".into()],
            &[Ok(vec![huge])],
            Some(Stage2Mmu::TdpMmu),
            1,
        );
        let msg = out.variants[0].findings[0].to_string();
        assert!(msg.contains("whatever the guest's own page size"), "{msg}");
    }
}
