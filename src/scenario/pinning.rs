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
//! a cap on pinned bytes. Both backends run the same pin manager ([`PinCache`]): the model
//! with costed pins, the kvm backend with real ones (`mlock` or io_uring buffer registration)
//! driven by a guest that rings enable/disable doorbells around each slice and writes records
//! into its buffer.

use super::params::{ParamInfo, Settings};
use super::runner::{self, Progress, RunRequest, ScenarioOutcome};
use super::samples::{Series, per_variant};
use super::{MetricInfo, ScenarioInfo, VariantInfo};
use crate::analysis::compare::against_fastest;
use crate::backend::{Backend, BackendKind};
use crate::error::{Error, InputError};
use crate::record::{Finding, VariantRecord};

/// The catalog entry.
pub static INFO: ScenarioInfo = ScenarioInfo {
    name: "pinning",
    summary: "pinning an SPE profiling buffer on every enable/disable vs keeping, intersecting or aging pins",
    variants: &VARIANTS,
    model_variants: &[],
    params: &PARAMS,
    metrics: &METRICS,
    headline: "slice_overhead_us",
    backends: &[BackendKind::Kvm, BackendKind::Model],
    default_reps: 5,
    default_warmup: 0,
};

static VARIANTS: [VariantInfo; 4] = [
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
];

static PARAMS: [ParamInfo; 10] = [
    ParamInfo {
        name: "buffer",
        default: "4MiB",
        doc: "SPE buffer size (256MiB for the large-buffer case)",
        model_only: false,
    },
    ParamInfo {
        name: "slices",
        default: "100",
        doc: "times the profiled task is switched in",
        model_only: false,
    },
    ParamInfo {
        name: "mode",
        default: "per-task",
        doc: "per-task (disable/enable on every switch) or per-cpu (enabled throughout)",
        model_only: false,
    },
    ParamInfo {
        name: "cap",
        default: "1GiB",
        doc: "most bytes the pin manager may hold pinned",
        model_only: false,
    },
    ParamInfo {
        name: "aging_ms",
        default: "50",
        doc: "aging: release a pin unused for this long",
        model_only: false,
    },
    ParamInfo {
        name: "slice_us",
        default: "3000",
        doc: "how long the profiled task runs per slice (~ a CFS slice)",
        model_only: false,
    },
    ParamInfo {
        name: "off_us",
        default: "1000",
        doc: "how long other tasks run between its slices",
        model_only: false,
    },
    ParamInfo {
        name: "relocate_every",
        default: "0",
        doc: "the guest moves its buffer to new memory every N slices (0: never)",
        model_only: false,
    },
    ParamInfo {
        name: "pin",
        default: "mlock",
        doc: "kvm backend: mlock, or io_uring (buffer registration, which pins with pin_user_pages)",
        model_only: false,
    },
    ParamInfo {
        name: "tail_ms",
        default: "200",
        doc: "idle time after the last slice (when aging releases pins)",
        model_only: false,
    },
];

static METRICS: [MetricInfo; 6] = [
    MetricInfo {
        name: "pin_ms",
        unit: "ms",
        doc: "time spent pinning (stage-1 walk + pin) over the trace",
    },
    MetricInfo {
        name: "unpin_ms",
        unit: "ms",
        doc: "time spent unpinning over the trace",
    },
    MetricInfo {
        name: "slice_overhead_us",
        unit: "us",
        doc: "pin + unpin time per slice",
    },
    MetricInfo {
        name: "pinned_bytes_max",
        unit: "bytes",
        doc: "most bytes pinned at once",
    },
    MetricInfo {
        name: "pinned_bytes_end",
        unit: "bytes",
        doc: "bytes still pinned at the end of the idle tail",
    },
    MetricInfo {
        name: "blackout_records",
        unit: "count",
        doc: "records the buffer would have taken while enabled but unpinned",
    },
];

/// When pins are taken and released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinPolicy {
    /// Pin on enable, unpin on disable.
    Eager,
    /// Never unpin (within the cap).
    Keep,
    /// Unpin what does not intersect a newly enabled buffer.
    Intersect,
    /// Unpin what was unused for this many ns.
    Aging(u64),
}

/// One trace to run.
#[derive(Debug, Clone, PartialEq)]
pub struct PinPlan {
    /// Buffer bytes.
    pub buffer_bytes: u64,
    /// Slices.
    pub slices: u32,
    /// Per-task (true) or per-CPU.
    pub per_task: bool,
    /// Pinned-bytes cap.
    pub cap_bytes: u64,
    /// Policy.
    pub policy: PinPolicy,
    /// Slice length, ns.
    pub slice_ns: u64,
    /// Gap between slices, ns.
    pub off_ns: u64,
    /// Relocate the buffer every N slices (0: never).
    pub relocate_every: u32,
    /// Idle tail, ns.
    pub tail_ns: u64,
    /// How the kvm backend pins.
    pub method: PinMethod,
}

/// What one trace did.
#[derive(Debug, Clone, PartialEq)]
pub struct PinResult {
    /// Time pinning.
    pub pin_ns: u64,
    /// Time unpinning.
    pub unpin_ns: u64,
    /// Most bytes pinned.
    pub pinned_bytes_max: u64,
    /// Bytes pinned at the end.
    pub pinned_bytes_end: u64,
    /// Records lost to blackouts.
    pub blackout_records: u64,
    /// Slices run.
    pub slices: u32,
    /// (ns, pinned bytes) at every change, for charts.
    pub timeline: Vec<(u64, u64)>,
}

/// How the kvm backend pins host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinMethod {
    /// `mlock`/`munlock`.
    Mlock,
    /// io_uring fixed-buffer registration (`pin_user_pages` in the kernel).
    IoUring,
}

/// Records SPE writes per ms of profiling (a 4 KiB page holds 64 records of 64 bytes; at the
/// default sampling interval a busy task fills a few pages a millisecond).
pub const RECORDS_PER_MS: u64 = 100;

/// Takes and releases pins, real or modelled, and says how long each took.
pub trait Pinner {
    /// Pins `bytes` at guest address `addr`; `resident` when its pages were pinned before.
    fn pin(&mut self, addr: u64, bytes: u64, resident: bool) -> Result<u64, Error>;
    /// Releases that pin.
    fn unpin(&mut self, addr: u64, bytes: u64) -> Result<u64, Error>;
}

#[derive(Debug, Clone)]
struct Pin {
    addr: u64,
    bytes: u64,
    last_used: u64,
}

/// The pin manager under test: when to pin and unpin an enabled profiling buffer, for every
/// policy, under the cap (least recently used pins go first). Both backends run it: the model
/// with costed pins on a simulated clock, the kvm backend with real pins on the host clock.
/// Every operation takes `now` (ns) and returns the ns it spent.
#[derive(Debug)]
pub struct PinCache<P: Pinner> {
    pinner: P,
    policy: PinPolicy,
    cap_bytes: u64,
    buffer_bytes: u64,
    pins: Vec<Pin>,
    resident: Vec<u64>,
    out: PinResult,
}

impl<P: Pinner> PinCache<P> {
    /// An empty cache for `plan`.
    pub fn new(pinner: P, plan: &PinPlan) -> PinCache<P> {
        PinCache {
            pinner,
            policy: plan.policy,
            cap_bytes: plan.cap_bytes,
            buffer_bytes: plan.buffer_bytes,
            pins: Vec::new(),
            resident: Vec::new(),
            out: PinResult {
                pin_ns: 0,
                unpin_ns: 0,
                pinned_bytes_max: 0,
                pinned_bytes_end: 0,
                blackout_records: 0,
                slices: plan.slices,
                timeline: vec![(0, 0)],
            },
        }
    }

    fn pinned(&self) -> u64 {
        self.pins.iter().map(|p| p.bytes).sum()
    }

    fn record(&mut self, now: u64) {
        let pinned = self.pinned();
        self.out.pinned_bytes_max = self.out.pinned_bytes_max.max(pinned);
        self.out.timeline.push((now, pinned));
    }

    fn unpin_at(&mut self, index: usize, now: u64) -> Result<u64, Error> {
        let p = self.pins.remove(index);
        let ns = self.pinner.unpin(p.addr, p.bytes)?;
        self.out.unpin_ns += ns;
        self.record(now + ns);
        Ok(ns)
    }

    /// The aging timer: releases pins unused for the policy's age (except `keep`, in use).
    pub fn age(&mut self, now: u64, keep: Option<u64>) -> Result<u64, Error> {
        let PinPolicy::Aging(t) = self.policy else {
            return Ok(0);
        };
        let mut spent = 0;
        while let Some(i) = self
            .pins
            .iter()
            .position(|p| Some(p.addr) != keep && (now + spent).saturating_sub(p.last_used) >= t)
        {
            spent += self.unpin_at(i, now + spent)?;
        }
        Ok(spent)
    }

    /// When the next pin comes of age, for an idle aging timer.
    pub fn next_expiry(&self) -> Option<u64> {
        match self.policy {
            PinPolicy::Aging(t) => self.pins.iter().map(|p| p.last_used + t).min(),
            _ => None,
        }
    }

    /// The guest enables the buffer at `addr`: (pinned, ns spent). Not pinned means the buffer
    /// does not fit under the cap: a blackout.
    pub fn enable(&mut self, now: u64, addr: u64) -> Result<(bool, u64), Error> {
        let bytes = self.buffer_bytes;
        let mut spent = self.age(now, Some(addr))?;
        if let Some(p) = self.pins.iter_mut().find(|p| p.addr == addr) {
            p.last_used = now + spent;
            return Ok((true, spent));
        }
        if self.policy == PinPolicy::Intersect {
            // Relocated buffers never overlap the old ones.
            while let Some(i) = self
                .pins
                .iter()
                .position(|p| p.addr + p.bytes <= addr || addr + bytes <= p.addr)
            {
                spent += self.unpin_at(i, now + spent)?;
            }
        }
        while self.pinned() + bytes > self.cap_bytes && !self.pins.is_empty() {
            let lru = self
                .pins
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.last_used)
                .map_or(0, |(i, _)| i);
            spent += self.unpin_at(lru, now + spent)?;
        }
        if bytes > self.cap_bytes {
            return Ok((false, spent));
        }
        let resident = self.resident.contains(&addr);
        let ns = self.pinner.pin(addr, bytes, resident)?;
        self.out.pin_ns += ns;
        spent += ns;
        if !resident {
            self.resident.push(addr);
        }
        self.pins.push(Pin {
            addr,
            bytes,
            last_used: now + spent,
        });
        self.record(now + spent);
        Ok((true, spent))
    }

    /// The guest disables the buffer at `addr`.
    pub fn disable(&mut self, now: u64, addr: u64) -> Result<u64, Error> {
        let Some(i) = self.pins.iter().position(|p| p.addr == addr) else {
            return Ok(0);
        };
        self.pins[i].last_used = now;
        if self.policy == PinPolicy::Eager {
            return self.unpin_at(i, now);
        }
        Ok(0)
    }

    /// Counts records that fell in a blackout.
    pub fn blackout(&mut self, records: u64) {
        self.out.blackout_records += records;
    }

    /// Ends the trace at `now`, releasing nothing: what is pinned at the end is reported.
    pub fn finish(mut self, now: u64) -> (PinResult, P) {
        self.out.pinned_bytes_end = self.pinned();
        self.record(now);
        (self.out, self.pinner)
    }
}

/// The guest address of the buffer in `slice`: a new region every `relocate_every` slices.
pub fn buffer_addr(plan: &PinPlan, base: u64, slice: u32) -> u64 {
    let generation = slice.checked_div(plan.relocate_every).unwrap_or(0);
    base + u64::from(generation) * (plan.buffer_bytes + (2 << 20))
}

/// The requested variants with their plans.
pub fn plans(
    settings: &Settings,
    request: &RunRequest,
    backend: BackendKind,
) -> Result<Vec<(String, PinPlan)>, InputError> {
    let buffer_bytes = settings.bytes("buffer")?;
    if buffer_bytes < 4096 || buffer_bytes % 4096 != 0 {
        return Err(InputError::BadValue {
            key: "buffer".into(),
            value: settings.raw("buffer").into(),
            why: "the buffer is a whole number of 4 KiB pages".into(),
        });
    }
    let per_task = settings.choice("mode", &["per-task", "per-cpu"])? == "per-task";
    let aging_ns = u64::from(settings.u32_in("aging_ms", 1..=3_600_000)?) * 1_000_000;
    let base = PinPlan {
        buffer_bytes,
        slices: settings.u32_in("slices", 1..=1_000_000)?,
        per_task,
        cap_bytes: settings.bytes("cap")?,
        policy: PinPolicy::Eager,
        slice_ns: u64::from(settings.u32_in("slice_us", 1..=10_000_000)?) * 1000,
        off_ns: u64::from(settings.u32_in("off_us", 0..=10_000_000)?) * 1000,
        relocate_every: settings.u32_in("relocate_every", 0..=1_000_000)?,
        tail_ns: u64::from(settings.u32_in("tail_ms", 0..=3_600_000)?) * 1_000_000,
        method: match settings.choice("pin", &["mlock", "io_uring"])? {
            "io_uring" => PinMethod::IoUring,
            _ => PinMethod::Mlock,
        },
    };
    if backend == BackendKind::Kvm {
        check_guest_fits(&base, settings)?;
    }
    let names: Vec<String> = if request.variants.is_empty() {
        VARIANTS.iter().map(|v| v.name.to_string()).collect()
    } else {
        request.variants.clone()
    };
    names
        .into_iter()
        .map(|name| {
            let policy = match name.as_str() {
                "eager" => PinPolicy::Eager,
                "keep" => PinPolicy::Keep,
                "intersect" => PinPolicy::Intersect,
                "aging" => PinPolicy::Aging(aging_ns),
                _ => return Err(INFO.unknown_variant(&name, BackendKind::Kvm)),
            };
            Ok((
                name,
                PinPlan {
                    policy,
                    ..base.clone()
                },
            ))
        })
        .collect()
}

/// The kvm backend maps every buffer generation (one per relocation) plus 2 MiB of padding
/// into one guest data region of at most 64 GiB: refuse plans that cannot fit while parsing,
/// not after measuring.
fn check_guest_fits(plan: &PinPlan, settings: &Settings) -> Result<(), InputError> {
    let max = crate::backend::guest::DATA_MAX_BYTES;
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
    let (key, why) = if generations == 1 {
        (
            "buffer",
            format!(
                "the kvm backend maps the buffer into a guest region of at most 64 GiB: give a buffer up to {} MiB (or use --backend model)",
                (max >> 20) - 2
            ),
        )
    } else {
        (
            "relocate_every",
            format!(
                "{generations} relocations of a {} byte buffer do not fit the kvm guest's 64 GiB data region: relocate less often, use a smaller buffer, or --backend model",
                plan.buffer_bytes
            ),
        )
    };
    Err(InputError::BadValue {
        key: key.into(),
        value: settings.raw(key).into(),
        why,
    })
}

/// Runs the scenario.
pub fn run(
    backend: &mut dyn Backend,
    settings: &Settings,
    request: &RunRequest,
    progress: &dyn Progress,
) -> Result<ScenarioOutcome, Error> {
    let (names, plans): (Vec<String>, Vec<PinPlan>) = plans(settings, request, backend.kind())?
        .into_iter()
        .unzip();
    let results = runner::repeat(&names, request, progress, |vi| {
        backend.pin_trace(&plans[vi])
    });
    let variants = per_variant(&names, &results, |i, name, traces| {
        analyse_variant(name, &plans[i], traces, request.seed)
    });
    let verdicts = against_fastest(&variants, INFO.headline, "us", request.seed);
    Ok(ScenarioOutcome { variants, verdicts })
}

fn analyse_variant(name: &str, plan: &PinPlan, traces: &[PinResult], seed: u64) -> VariantRecord {
    let mut series = Series::new();
    for (rep, t) in traces.iter().enumerate() {
        series
            .at(rep)
            .push("pin_ms", "ms", t.pin_ns as f64 / 1e6)
            .push("unpin_ms", "ms", t.unpin_ns as f64 / 1e6)
            .push(
                "slice_overhead_us",
                "us",
                (t.pin_ns + t.unpin_ns) as f64 / 1e3 / f64::from(t.slices.max(1)),
            )
            .push("pinned_bytes_max", "bytes", t.pinned_bytes_max as f64)
            .push("pinned_bytes_end", "bytes", t.pinned_bytes_end as f64)
            .push("blackout_records", "count", t.blackout_records as f64);
    }
    let metrics = series.finish(traces.len(), name, seed);
    let mut findings = Vec::new();
    if let (PinPolicy::Aging(t), Some(last)) = (plan.policy, traces.first()) {
        findings.push(Finding::Note {
            topic: "aging".into(),
            message: format!(
                "aging released the pins {} ms after their last use: {} bytes pinned at the end of the {} ms idle tail",
                t / 1_000_000,
                last.pinned_bytes_end,
                plan.tail_ns / 1_000_000
            ),
        });
    }
    if let Some(b) = metrics.get("blackout_records").filter(|m| m.median > 0.0) {
        findings.push(Finding::Note {
            topic: "blackout".into(),
            message: format!(
                "{} records fell in blackouts: the buffer ({} bytes) could not be pinned under the {} byte cap",
                b.median, plan.buffer_bytes, plan.cap_bytes
            ),
        });
    }
    VariantRecord {
        name: name.to_string(),
        status: "ok".into(),
        metrics,
        findings,
        timeline: Vec::new(),
        pinned_bytes: traces
            .first()
            .map(|t| {
                t.timeline
                    .iter()
                    .map(|(ns, b)| [*ns as f64 / 1e6, *b as f64])
                    .collect()
            })
            .unwrap_or_default(),
    }
}
