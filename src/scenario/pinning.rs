//! `pinning`: pinning a guest profiling buffer (Arm SPE) per enable/disable vs a pin cache.
//!
//! SPE writes samples into a memory buffer; a translation fault on it stops profiling (a
//! blackout) until handled. The proposed KVM fix pins the buffer in the host and maps it at
//! stage 2 whenever the guest enables it — walking guest stage 1 each time, since VA→IPA may
//! have changed — and unpins on disable. The guest's perf driver disables and re-enables the
//! buffer on every context switch of a profiled task (per-task mode), so a whole pin and unpin
//! happens per switch. Policies compared: `eager` (that), `keep` (keep the pin when the buffer
//! is disabled), `intersect` (unpin only when the guest enables a buffer that does not
//! intersect the pinned one), `aging` (keep, and release pins unused for `aging_ms`), all under
//! a cap on pinned bytes; and, model only, `no-pin`: nothing pinned, the buffer faulted in at
//! stage 2 as SPE writes it, each fault a blackout. Every enable walks stage 1 (model), even
//! when the pin is kept. Both backends run the same pin manager ([`PinCache`]): the model
//! with costed pins, the kvm backend with real ones (`mlock` or io_uring buffer registration)
//! driven by a guest that rings enable/disable doorbells around each slice and writes records
//! into its buffer.

use super::params::{Choice, Param, Text, Values, bytes, choice, size_text, whole};
use super::runner::{RunRequest, ScenarioOutcome};
use super::samples::{Series, per_variant};
use super::{Chart, Observed, Scenario};
use super::{IcountTolerance, MetricInfo, ScenarioInfo, VariantInfo};
use crate::analysis::Direction;
use crate::error::InputError;
use crate::record::RunRecord;
use crate::record::{Finding, VariantRecord};
use hvlab_core::Capabilities;
use hvlab_core::pinning::{PinMethod, PinPlan, PinPolicy, PinResult};

/// The catalog entry.
pub static INFO: ScenarioInfo = ScenarioInfo {
    name: "pinning",
    summary: "pinning an SPE profiling buffer on every enable/disable vs keeping, intersecting or aging pins",
    variants: &VARIANTS,
    model_variants: &MODEL_VARIANTS,
    metrics: &METRICS,
    headline: "slice_overhead_us",
    question: super::Question {
        asks: "what each pin policy costs or saves per profiled slice against pinning on every enable (eager)",
        baseline: Some("eager"),
        judged: &[],
        pairs: &[],
        within: None,
        costs: false,
    },
    runs_on: super::any_backend,
    default_reps: 5,
    default_warmup: 0,
};

static VARIANTS: [VariantInfo; 5] = [
    VariantInfo {
        name: "eager",
        doc: "pin + stage-1 walk on every enable, unpin on every disable (the proposed fix as posted)",
    },
    VariantInfo {
        name: "keep",
        doc: "keep the pin while the buffer is disabled",
    },
    VariantInfo {
        name: "intersect",
        doc: "keep, unpinning only when an enabled buffer does not intersect the pinned one",
    },
    VariantInfo {
        name: "aging",
        doc: "keep, and a timer releases pins unused for aging_ms",
    },
    VariantInfo {
        name: "gmem-prefault",
        doc: "the series' newest revision: the buffer in guest_memfd, its stage 2 mapped once with KVM_PRE_FAULT_MEMORY; no pin and no walk per enable (kvm: needs guest_memfd and KVM_PRE_FAULT_MEMORY)",
    },
];

static MODEL_VARIANTS: [VariantInfo; 1] = [VariantInfo {
    name: "no-pin",
    doc: "model: never pin; SPE writes fault the buffer in at stage 2, each fault a blackout (kvm: needs SPE hardware to see lost records)",
}];

/// `mode`: a buffer per task or per CPU.
static MODE: Choice<bool, 2> = Choice {
    names: ["per-task", "per-cpu"],
    values: [true, false],
};

/// `pin`: how the kvm backend pins.
static PIN: Choice<PinMethod, 2> = Choice {
    names: ["mlock", "io_uring"],
    values: [PinMethod::Mlock, PinMethod::IoUring],
};

/// Each parameter, declared once.
pub static PARAMS: [Param<PinningParams>; 12] = [
    Param {
        name: "buffer",
        doc: "SPE buffer size (256MiB for the large-buffer case)",
        values: Values::Described,
        model_only: false,
        read: |p, t| {
            p.buffer_bytes = buffer_bytes(t)?;
            Ok(())
        },
        spell: |p| size_text(p.buffer_bytes),
    },
    whole!(
        slices,
        "times the profiled task is switched in",
        1,
        1_000_000
    ),
    choice!("mode" => per_task, MODE, "per-task (disable/enable on every switch) or per-cpu (enabled throughout)"),
    bytes!("cap" => cap_bytes, "most bytes the pin manager may hold pinned"),
    whole!(
        aging_ms,
        "aging: release a pin unused for this long",
        1,
        3_600_000
    ),
    whole!(
        slice_us,
        "how long the profiled task runs per slice (~ a CFS slice)",
        1,
        10_000_000
    ),
    whole!(
        off_us,
        "how long other tasks run between its slices",
        0,
        10_000_000
    ),
    whole!(
        relocate_every,
        "the guest moves its buffer to new memory every N slices (0: never)",
        0,
        1_000_000
    ),
    choice!(
        pin,
        PIN,
        "kvm backend: mlock, or io_uring (buffer registration, which pins with pin_user_pages)"
    ),
    whole!(
        tail_ms,
        "idle time after the last slice (when aging releases pins)",
        0,
        3_600_000
    ),
    whole!(
        records_per_ms,
        "model: SPE records written per ms of profiling (0: a filter that records nothing)",
        0,
        1_000_000,
        model
    ),
    whole!(
        unmap_pct,
        "model, no-pin: percent of the buffer the host removes from stage 2 while the task is switched out",
        0,
        100,
        model
    ),
];

/// `buffer`: a whole number of 4 KiB pages.
fn buffer_bytes(t: &Text<'_>) -> Result<u64, InputError> {
    let bytes = t.bytes()?;
    if bytes < 4096 || bytes % 4096 != 0 {
        return Err(t.bad("the buffer is a whole number of 4 KiB pages"));
    }
    Ok(bytes)
}

static METRICS: [MetricInfo; 12] = [
    MetricInfo {
        name: "pins",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "pin operations over the trace (exact: what the policy decided, not how long it took)",
    },
    MetricInfo {
        name: "pin_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "time spent pinning and mapping at stage 2 over the trace",
    },
    MetricInfo {
        name: "walk_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "time walking guest stage 1, once per enable (model; the kvm backend's VMM knows the address)",
    },
    MetricInfo {
        name: "stage2_faults",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "stage-2 faults on the buffer (no-pin)",
    },
    MetricInfo {
        name: "prefaults",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "KVM_PRE_FAULT_MEMORY calls, one per new buffer (gmem-prefault)",
    },
    MetricInfo {
        name: "prefault_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "time in those calls, counted in the overhead (gmem-prefault)",
    },
    MetricInfo {
        name: "overhead_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "walk + pin + unpin + buffer faults over the trace",
    },
    MetricInfo {
        name: "unpin_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "time spent unpinning over the trace",
    },
    MetricInfo {
        name: "slice_overhead_us",
        unit: "us",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "walk + pin + unpin + buffer-fault time per slice",
    },
    MetricInfo {
        name: "pinned_bytes_max",
        unit: "bytes",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "most bytes pinned at once",
    },
    MetricInfo {
        name: "pinned_bytes_end",
        unit: "bytes",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "bytes still pinned at the end of the idle tail",
    },
    MetricInfo {
        name: "blackout_records",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "records lost: the buffer did not fit the cap, or (no-pin) SPE stopped on a stage-2 fault",
    },
];

/// The kvm backend maps every buffer generation (one per relocation) plus 2 MiB of padding
/// into one guest data region of at most 64 GiB: refuse plans that cannot fit while parsing,
/// not after measuring.
fn check_guest_fits(plan: &PinPlan) -> Result<(), InputError> {
    let max = hvlab_core::guest::DATA_MAX_BYTES;
    let generations = if plan.relocate_every == 0 {
        1
    } else {
        u64::from(plan.slices.div_ceil(plan.relocate_every))
    };
    let need = plan
        .buffer_bytes
        .checked_add(2 << 20)
        .and_then(|stride| stride.checked_mul(generations));
    if need.is_some_and(|n| n <= max) {
        return Ok(());
    }
    let (key, value, why) = if generations == 1 {
        (
            "buffer",
            size_text(plan.buffer_bytes),
            format!(
                "the kvm backend maps the buffer into a guest region of at most 64 GiB: give a buffer up to {} MiB (or use --backend model)",
                (max >> 20) - 2
            ),
        )
    } else {
        (
            "relocate_every",
            plan.relocate_every.to_string(),
            format!(
                "{generations} relocations of a {} byte buffer do not fit the kvm guest's 64 GiB data region: relocate less often, use a smaller buffer, or --backend model",
                plan.buffer_bytes
            ),
        )
    };
    Err(InputError::BadValue {
        key: key.into(),
        value,
        why,
    })
}

fn analyse_variant(name: &str, plan: &PinPlan, traces: &[PinResult], seed: u64) -> VariantRecord {
    let mut series = Series::new();
    for (rep, t) in traces.iter().enumerate() {
        let overhead = (t.pin_ns + t.unpin_ns + t.walk_ns + t.fault_ns + t.prefault_ns) as f64;
        series
            .at(rep)
            .push("pins", "count", t.pins as f64)
            .push("pin_ms", "ms", t.pin_ns as f64 / 1e6)
            .push("unpin_ms", "ms", t.unpin_ns as f64 / 1e6)
            .push("walk_ms", "ms", t.walk_ns as f64 / 1e6)
            .push("stage2_faults", "count", t.stage2_faults as f64)
            .push("prefaults", "count", t.prefaults as f64)
            .push("prefault_ms", "ms", t.prefault_ns as f64 / 1e6)
            .push("overhead_ms", "ms", overhead / 1e6)
            .push(
                "slice_overhead_us",
                "us",
                overhead / 1e3 / f64::from(t.slices.max(1)),
            )
            .push("pinned_bytes_max", "bytes", t.pinned_bytes_max as f64)
            .push("pinned_bytes_end", "bytes", t.pinned_bytes_end as f64)
            .push("blackout_records", "count", t.blackout_records as f64);
    }
    let metrics = series.finish(traces.len(), name, seed);
    let mut findings = Vec::new();
    if let (PinPolicy::Aging(t), Some(last)) = (plan.policy, traces.first()) {
        findings.push(Finding::PinsAged {
            after_ms: t / 1_000_000,
            pinned_bytes_end: last.pinned_bytes_end,
            tail_ms: plan.tail_ns / 1_000_000,
        });
    }
    if let Some(b) = metrics.get("blackout_records").filter(|m| m.median > 0.0) {
        findings.push(if plan.policy == PinPolicy::NoPin {
            Finding::FaultBlackouts {
                records: b.median,
                faults: metrics.get("stage2_faults").map_or(0.0, |m| m.median),
                unmap_pct: plan.unmap_pct,
            }
        } else {
            Finding::Blackouts {
                records: b.median,
                buffer_bytes: plan.buffer_bytes,
                cap_bytes: plan.cap_bytes,
            }
        });
    }
    VariantRecord {
        pinned_bytes: traces
            .first()
            .map(|t| {
                t.timeline
                    .iter()
                    .map(|(ns, b)| [*ns as f64 / 1e6, *b as f64])
                    .collect()
            })
            .unwrap_or_default(),
        ..VariantRecord::ok(name, metrics, findings)
    }
}

/// The pinning scenario.
#[derive(Debug)]
pub struct Pinning;

/// The parameters of one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PinningParams {
    /// The SPE buffer, bytes.
    pub buffer_bytes: u64,
    /// Times the profiled task is switched in.
    pub slices: u32,
    /// One buffer per task, disabled and enabled at every switch (false: per CPU).
    pub per_task: bool,
    /// Most bytes the pin manager may hold pinned.
    pub cap_bytes: u64,
    /// The `aging` policy's idle time before an unpin, ms.
    pub aging_ms: u32,
    /// How long the profiled task runs per slice, us.
    pub slice_us: u32,
    /// How long other tasks run between its slices, us.
    pub off_us: u32,
    /// The guest moves its buffer every N slices (0: never).
    pub relocate_every: u32,
    /// How the kvm backend pins.
    pub pin: PinMethod,
    /// Idle time after the last slice, ms.
    pub tail_ms: u32,
    /// SPE records written per ms of profiling (model).
    pub records_per_ms: u32,
    /// no-pin: percent of the buffer removed from stage 2 while switched out (model).
    pub unmap_pct: u32,
}

impl Default for PinningParams {
    fn default() -> PinningParams {
        PinningParams {
            buffer_bytes: 4 << 20,
            slices: 100,
            per_task: true,
            cap_bytes: 1 << 30,
            aging_ms: 50,
            slice_us: 3000,
            off_us: 1000,
            relocate_every: 0,
            pin: PinMethod::Mlock,
            tail_ms: 200,
            records_per_ms: 100,
            unmap_pct: 0,
        }
    }
}

impl PinningParams {
    /// The plan of the variant whose policy is `policy`.
    fn plan(&self, policy: PinPolicy) -> PinPlan {
        PinPlan {
            buffer_bytes: self.buffer_bytes,
            slices: self.slices,
            per_task: self.per_task,
            cap_bytes: self.cap_bytes,
            policy,
            slice_ns: u64::from(self.slice_us) * 1000,
            off_ns: u64::from(self.off_us) * 1000,
            relocate_every: self.relocate_every,
            tail_ns: u64::from(self.tail_ms) * 1_000_000,
            method: self.pin,
            records_per_ms: u64::from(self.records_per_ms),
            unmap_pct: self.unmap_pct,
        }
    }
}

impl Scenario for Pinning {
    type Plan = PinPlan;
    type Params = PinningParams;
    const INFO: &'static ScenarioInfo = &INFO;
    const PARAMS: &'static [Param<PinningParams>] = &PARAMS;

    fn check(&self, p: &PinningParams, can: Capabilities) -> Result<(), InputError> {
        if can.real_memory {
            check_guest_fits(&p.plan(PinPolicy::Eager))?;
        }
        Ok(())
    }

    fn plan(
        &self,
        name: &str,
        request: &RunRequest<PinningParams>,
    ) -> Result<Option<PinPlan>, InputError> {
        let policy = match name {
            "eager" => PinPolicy::Eager,
            "keep" => PinPolicy::Keep,
            "intersect" => PinPolicy::Intersect,
            "aging" => PinPolicy::Aging(u64::from(request.params.aging_ms) * 1_000_000),
            "no-pin" => PinPolicy::NoPin,
            "gmem-prefault" => PinPolicy::GmemPrefault,
            _ => return Ok(None),
        };
        Ok(Some(request.params.plan(policy)))
    }

    fn analyse(&self, o: Observed<'_, PinPlan, PinResult>) -> ScenarioOutcome {
        let variants = per_variant(o.names, o.results, |i, name, traces| {
            analyse_variant(name, &o.plans[i], traces, o.seed)
        });
        ScenarioOutcome { variants }
    }

    fn showcases(&self) -> Vec<super::Showcase<PinningParams>> {
        vec![super::Showcase {
            profile: "neoverse-n2-spe",
            variants: &[],
            params: PinningParams {
                buffer_bytes: 256 << 20,
                slices: 100,
                ..PinningParams::default()
            },
            why: "000 (SPE buffer pinned at stage 2): with a 256 MiB buffer in per-task mode, pinning on every enable costs ~40 ms per context switch; keeping the pin leaves the stage-1 walk on every enable; not pinning costs nothing per switch but loses records to stage-2 faults",
            headline: Some(super::Headline {
                thread: "000",
                before_run: None,
                sides: None,
                pairs: &[
                    super::HeadlinePair {
                        about: "keeping the pin, per slice",
                        before: "eager",
                        after: "keep",
                        metric: "slice_overhead_us",
                        shown: &["blackout_records"],
                    },
                    super::HeadlinePair {
                        about: "aging the pin, per slice",
                        before: "eager",
                        after: "aging",
                        metric: "slice_overhead_us",
                        shown: &["blackout_records"],
                    },
                ],
            }),
        }]
    }

    fn charts(&self, _record: &RunRecord) -> Vec<Chart> {
        vec![
            Chart::PinnedBytes,
            Chart::Bars {
                metric: "pin_ms",
                title: "time pinning",
            },
        ]
    }
}
