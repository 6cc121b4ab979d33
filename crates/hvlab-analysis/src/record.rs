//! The run record: what a run produced, in the shape of the output contract
//! (docs/ARCHITECTURE.md, "Output contract"). The store persists it, `--json` prints it, the
//! report reads it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize, Serializer};

use crate::statistics::{Modes, Summary};
use hvlab_core::BackendKind;
use hvlab_core::host::{Clock, HostInfo};
use hvlab_core::noise::{BusyReason, Noise};

/// The random end of a run id: 64 bits from the OS-seeded generator as 16 hex digits, so two
/// runs started in the same second do not collide (the store still renames on a collision).
pub fn run_id_suffix() -> String {
    use rand::RngExt;
    let bits: u64 = rand::rng().random();
    format!("{bits:016x}")
}

/// One run: scenario × backend × variants × repetitions on one host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// `<started_at>-<scenario>-<backend>-<4 hex>`.
    pub run_id: String,
    /// Scenario name.
    pub scenario: String,
    /// Which backend produced it (`kvm` or `model` in JSON and the store).
    pub backend: BackendKind,
    /// The model's cost profile, when the backend is the model.
    pub profile: Option<String>,
    /// Host fingerprint.
    pub host: HostInfo,
    /// Every parameter in effect, defaults included.
    pub params: BTreeMap<String, serde_json::Value>,
    /// RFC 3339, UTC.
    pub started_at: String,
    /// RFC 3339, UTC.
    pub finished_at: String,
    /// Results per variant, in the order they were asked for.
    pub variants: Vec<VariantRecord>,
    /// Comparisons of the variants on the scenario's headline metric.
    #[serde(default, serialize_with = "verdicts_with_text")]
    pub verdicts: Vec<Verdict>,
    /// The noise the run was measured in (kvm runs; absent in runs stored before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub noise: Option<Noise>,
    /// What the reader must know before trusting the numbers: a busy host, outliers, two
    /// modes; each with its remedy in its `message`.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        serialize_with = "warnings_with_messages"
    )]
    pub warnings: Vec<Warning>,
    /// Who made the run when it was not the user asking for it: internal runs are left out
    /// of the default report, `hvlab runs` and the fleet page (absent: the user's run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<RunTag>,
    /// The named baseline this run was saved as (`hvlab run … --save-baseline NAME`), which
    /// `hvlab compare --baseline NAME` compares against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// Calls of a kernel patch's functions per variant, counted in an untimed repetition
    /// after the timed ones (`hvlab run --count-calls`, asked by `hvlab kab`); empty when not
    /// asked, and in runs stored before it existed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<crate::calls::VariantCalls>,
}

/// What made an internal run. (`hvlab calibrate` stores no run: its measurements become the
/// profile.)
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RunTag {
    /// `hvlab validate`, the model against the kvm backend.
    Validate,
    /// A suite unit that shows a kernel thread's finding on the model with the thread's
    /// hardware profile.
    Showcase,
}

impl RunTag {
    /// Every tag, for messages and parsing.
    pub const ALL: [RunTag; 2] = [RunTag::Validate, RunTag::Showcase];

    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunTag::Validate => "validate",
            RunTag::Showcase => "showcase",
        }
    }

    /// Reads a stored name back (an unknown one, from a newer hvlab, is `None`).
    pub fn parse(text: &str) -> Option<RunTag> {
        RunTag::ALL.into_iter().find(|t| t.as_str() == text)
    }
}

impl std::fmt::Display for RunTag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A warning about a run's numbers, as data; the sentence is its `Display` (words.rs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Warning {
    /// Another process competed for the CPU during the run.
    BusyHost {
        /// What the busy rule saw.
        reasons: Vec<BusyReason>,
        /// Whether the measuring threads were pinned (`--cpu`).
        pinned: bool,
    },
    /// Samples far from the median of a variant's headline metric (median ± k·MAD).
    Outliers {
        /// The variant.
        variant: String,
        /// The metric.
        metric: String,
        /// How many samples are outliers.
        count: usize,
        /// Samples.
        n: usize,
        /// The rule's k (scaled MADs).
        k: f64,
        /// The clock the run measured on: on the instruction clock an outlier is work the
        /// guest itself did in that repetition, never the host's load.
        #[serde(default, skip_serializing_if = "Clock::is_wall")]
        clock: Clock,
    },
    /// A variant's headline metric has two modes: the median alone would hide one.
    Bimodal {
        /// The variant.
        variant: String,
        /// The metric.
        metric: String,
        /// Its unit.
        unit: String,
        /// Each mode's median and sample count, lower first.
        modes: Modes,
    },
    /// The clock source changed during the run: times before and after may not compare.
    ClockSourceChanged {
        /// The one at the start.
        from: String,
    },
}

/// Warnings in JSON: the data, and the sentence (`message`).
fn warnings_with_messages<S: Serializer>(w: &[Warning], s: S) -> Result<S::Ok, S::Error> {
    with_words(w, "message", s)
}

impl RunRecord {
    /// The variant called `name`.
    pub fn variant(&self, name: &str) -> Option<&VariantRecord> {
        self.variants.iter().find(|v| v.name == name)
    }

    /// Whether any variant produced samples. A run where none did is a failed run (exit 4)
    /// even when it is stored: it is kept so that each variant's failure can be named (a
    /// kernel A/B judges it), never read as a measurement.
    pub fn produced_samples(&self) -> bool {
        self.variants.iter().any(VariantRecord::is_ok)
    }

    /// The clock this run's times are on: its host's. A model run's host carries its
    /// profile's clock (the model computes on that clock wherever it runs), and such a run's
    /// times were labelled with it when it was assembled; a model run stored before profiles
    /// had clocks carries the clock of the machine that computed it, with its times in the
    /// profile's nanoseconds: the wall clock, as it was read then.
    pub fn clock(&self) -> Clock {
        if self.backend.capabilities().real_time || self.times_in_instructions() {
            self.host.clock
        } else {
            Clock::Wall
        }
    }

    /// Whether a time metric of this run is stored in instructions (`insn`, `Minsn`, ...),
    /// as [`RunRecord::label_times`] leaves a run on the instruction clock.
    fn times_in_instructions(&self) -> bool {
        self.variants
            .iter()
            .flat_map(|v| v.metrics.values())
            .any(|m| m.unit.contains("insn"))
    }

    /// The clock a run is on, told by whoever learnt it after the run was assembled (the VMM
    /// that booted the kernel it ran in, when that kernel's hvlab recorded none): a run that
    /// measured real time takes it, and its times are labelled. A model run keeps its
    /// profile's clock, whatever clock the machine that computed it was on.
    pub fn measured_on(&mut self, clock: Clock) {
        if self.backend.capabilities().real_time && self.host.clock != clock {
            self.host.clock = clock;
            self.label_times();
        }
    }

    /// Says in the record what its times are, once a run on the instruction clock is
    /// assembled: every time metric's unit (and the verdicts' and warnings' on them) becomes
    /// the instruction unit of its clock ([`Clock::unit`]: `ms` → `Minsn`, the values as
    /// measured), and the lifecycle's stall findings carry the clock, so their jiffies read as
    /// virtual ticks. A run on the wall clock is left as it is. Its clock is its host's: the
    /// measured host's, or the model's profile's.
    pub fn label_times(&mut self) {
        let clock = self.host.clock;
        if clock.is_wall() {
            return;
        }
        for v in &mut self.variants {
            for m in v.metrics.values_mut() {
                m.unit = clock.unit(&m.unit);
            }
            for f in &mut v.findings {
                f.set_clock(clock);
            }
        }
        for v in &mut self.verdicts {
            v.unit = clock.unit(&v.unit);
            if let Some(c) = &mut v.cause {
                c.clock = clock;
            }
        }
        for w in &mut self.warnings {
            if let Warning::Bimodal { unit, .. } = w {
                *unit = clock.unit(unit);
            }
        }
    }
}

/// Runs measured on two clocks, given to one comparison: the first run of each clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixedClocks {
    /// A run, and its clock.
    pub first: (String, Clock),
    /// The first run given on another clock, and that clock.
    pub other: (String, Clock),
}

/// The one clock `runs` share (the wall clock for none), or the first two runs whose clocks
/// differ: every comparison of stored runs (`compare`, the fleet, fidelity, a report's
/// comparisons) asks this before it compares a time, since an instruction count and a
/// nanosecond never compare.
pub fn one_clock<'a>(runs: impl IntoIterator<Item = &'a RunRecord>) -> Result<Clock, MixedClocks> {
    let mut first: Option<&RunRecord> = None;
    for run in runs {
        match first {
            None => first = Some(run),
            Some(f) if f.clock() != run.clock() => {
                return Err(MixedClocks {
                    first: (f.run_id.clone(), f.clock()),
                    other: (run.run_id.clone(), run.clock()),
                });
            }
            Some(_) => {}
        }
    }
    Ok(first.map_or(Clock::Wall, RunRecord::clock))
}

/// Whether a variant produced samples. Written as `ok`, `unsupported: why` (the host cannot
/// run it: exit 3 when no variant ran) or `failed: why` (a measurement failed: exit 4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VariantStatus {
    /// Samples were taken.
    Ok,
    /// This host cannot run it.
    Unsupported(String),
    /// A measurement failed.
    Failed(String),
}

impl VariantStatus {
    /// Reads the written form back.
    pub fn parse(text: &str) -> VariantStatus {
        if text == "ok" {
            VariantStatus::Ok
        } else if let Some(why) = text.strip_prefix("unsupported: ") {
            VariantStatus::Unsupported(why.to_string())
        } else {
            VariantStatus::Failed(text.strip_prefix("failed: ").unwrap_or(text).to_string())
        }
    }
}

impl std::fmt::Display for VariantStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            VariantStatus::Ok => f.write_str("ok"),
            VariantStatus::Unsupported(why) => write!(f, "unsupported: {why}"),
            VariantStatus::Failed(why) => write!(f, "failed: {why}"),
        }
    }
}

impl From<&str> for VariantStatus {
    fn from(text: &str) -> VariantStatus {
        VariantStatus::parse(text)
    }
}

impl PartialEq<&str> for VariantStatus {
    fn eq(&self, other: &&str) -> bool {
        *self == VariantStatus::parse(other)
    }
}

impl Serialize for VariantStatus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for VariantStatus {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<VariantStatus, D::Error> {
        String::deserialize(d).map(|t| VariantStatus::parse(&t))
    }
}

/// One variant's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VariantRecord {
    /// Variant name.
    pub name: String,
    /// Whether it produced samples, and why not.
    pub status: VariantStatus,
    /// Metric name → summary and samples.
    pub metrics: BTreeMap<String, MetricRecord>,
    /// What the analysis found.
    #[serde(default, serialize_with = "findings_with_messages")]
    pub findings: Vec<Finding>,
    /// One representative ioctl timeline (lifecycle: the median repetition), for charts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelineEvent>,
    /// Pinned bytes over time, [ms, bytes] (pinning: the first repetition), for charts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned_bytes: Vec<[f64; 2]>,
}

/// One ioctl on a representative timeline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TimelineEvent {
    /// KVM name.
    pub ioctl: String,
    /// Start, ms from the first ioctl.
    pub start_ms: f64,
    /// Duration, ms.
    pub dur_ms: f64,
    /// It stalled on a grace period.
    pub stalled: bool,
}

impl VariantRecord {
    /// A variant that produced samples: its metrics and findings, no timeline or pinned
    /// bytes (the scenarios that chart those set them over this).
    pub fn ok(
        name: &str,
        metrics: BTreeMap<String, MetricRecord>,
        findings: Vec<Finding>,
    ) -> VariantRecord {
        VariantRecord {
            name: name.to_string(),
            status: VariantStatus::Ok,
            metrics,
            findings,
            timeline: Vec::new(),
            pinned_bytes: Vec::new(),
        }
    }

    /// Whether the variant produced samples.
    pub fn is_ok(&self) -> bool {
        self.status == VariantStatus::Ok
    }
}

/// One metric of one variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricRecord {
    /// `ms`, `ns`, `count`, ...
    pub unit: String,
    /// Median of the samples.
    #[serde(serialize_with = "compact")]
    pub median: f64,
    /// 95% bootstrap CI of the median.
    #[serde(serialize_with = "compact_pair")]
    pub ci95: [f64; 2],
    /// Smallest sample.
    #[serde(serialize_with = "compact")]
    pub min: f64,
    /// Largest sample.
    #[serde(serialize_with = "compact")]
    pub max: f64,
    /// Sample count.
    pub n: usize,
    /// Every sample, in repetition order.
    #[serde(serialize_with = "compact_vec")]
    pub samples: Vec<f64>,
}

/// How far a stored summary value may sit from the one its samples give: the 9 decimal places a
/// record keeps of a non-integral value ([`compact`]), and a float's last bits.
fn agrees(stored: f64, from_samples: f64) -> bool {
    (stored - from_samples).abs() <= 1e-9 + 1e-12 * from_samples.abs()
}

impl MetricRecord {
    /// What in this summary its samples do not give, if anything: the count, the median, the
    /// extremes, and a 95% interval of the median that is ordered and within the extremes (a
    /// bootstrap interval of the median never leaves the samples' range). The interval's exact
    /// bounds depend on the resampling, so only its shape is checked.
    pub fn contradiction(&self) -> Option<String> {
        if self.samples.is_empty() {
            return Some(format!(
                "has no samples but a summary (n = {}, median {}): a summary needs the samples it summarises",
                self.n, self.median
            ));
        }
        if self.n != self.samples.len() {
            return Some(format!(
                "says n = {} but carries {} samples",
                self.n,
                self.samples.len()
            ));
        }
        let (min, max) = self
            .samples
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
                (lo.min(x), hi.max(x))
            });
        for (field, stored, given) in [
            (
                "median",
                self.median,
                crate::statistics::median(&self.samples),
            ),
            ("min", self.min, min),
            ("max", self.max, max),
        ] {
            if !agrees(stored, given) {
                return Some(format!(
                    "says {field} {stored} but its samples give {given}"
                ));
            }
        }
        let [lo, hi] = self.ci95;
        let slack = |x: f64| 1e-9 + 1e-12 * x.abs();
        if !(lo <= hi + slack(hi) && lo >= min - slack(min) && hi <= max + slack(max)) {
            return Some(format!(
                "says ci95 [{lo}, {hi}], which is not an interval within its samples' range [{min}, {max}]"
            ));
        }
        None
    }

    /// Summarises samples of a metric.
    pub fn new(unit: &str, samples: Vec<f64>, seed: u64) -> MetricRecord {
        let s = Summary::of(&samples, seed);
        MetricRecord {
            unit: unit.to_string(),
            median: s.median,
            ci95: s.ci95,
            min: s.min,
            max: s.max,
            n: s.n,
            samples,
        }
    }
}

/// Every sample of `metric` in `variant` over `runs` (the variants that ran), in run order:
/// one side of a kernel A/B, or a kernel's runs against the model's.
pub fn pooled(runs: &[&RunRecord], variant: &str, metric: &str) -> Vec<f64> {
    runs.iter()
        .filter_map(|r| r.variant(variant).filter(|v| v.is_ok()))
        .filter_map(|v| v.metrics.get(metric))
        .flat_map(|m| m.samples.iter().copied())
        .collect()
}

impl RunRecord {
    /// What in this record its samples do not give, naming the variant and field: every
    /// metric's summary ([`MetricRecord::contradiction`]), and the counts and medians of every
    /// verdict on a recorded metric against the samples of the variants it names. A record that came from hvlab
    /// has none; one edited or forged elsewhere is refused rather than shown.
    pub fn contradiction(&self) -> Option<String> {
        for v in &self.variants {
            for (name, m) in &v.metrics {
                if let Some(why) = m.contradiction() {
                    return Some(format!("metric {name} of variant {}: {why}", v.name));
                }
            }
        }
        for verdict in &self.verdicts {
            let side = |variant: &str| {
                self.variant(variant)
                    .and_then(|v| v.metrics.get(&verdict.metric))
            };
            // A verdict on a metric derived from the samples rather than recorded per variant
            // (percpu's sys_ns) has no stored samples to check against.
            let (Some(fast), Some(slow)) = (side(&verdict.faster), side(&verdict.slower)) else {
                continue;
            };
            let given_n = [fast.samples.len(), slow.samples.len()];
            if verdict.n != given_n
                || !agrees(verdict.medians[0], fast.median)
                || !agrees(verdict.medians[1], slow.median)
            {
                return Some(format!(
                    "the verdict on {} ({} against {}) says n = {:?} and medians {:?}, but their samples give n = {given_n:?} and medians [{}, {}]",
                    verdict.metric,
                    verdict.faster,
                    verdict.slower,
                    verdict.n,
                    verdict.medians,
                    fast.median,
                    slow.median
                ));
            }
        }
        None
    }
}

/// Something the analysis found, as data. The sentence a person reads is the finding's
/// `Display`, written beside the other analysis words in this crate (`words.rs`); JSON carries
/// both (`message`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Finding {
    /// An ioctl waited for an SRCU grace period, started by an earlier registration or (at
    /// `caused_at == step`) its own.
    SrcuStall {
        /// The stalled ioctl.
        ioctl: String,
        /// Its position in the construction order (0-based index of the ioctl).
        step: usize,
        /// The registration that started the grace period, when one was found.
        caused_by: Option<String>,
        /// That registration's position.
        #[serde(default)]
        caused_at: Option<usize>,
        /// Median duration of the stalled ioctl over the repetitions where it stalled.
        median_ms: f64,
        /// Its shortest and longest duration over those repetitions: where the grace period
        /// starts against the tick spreads a stall over one to two jiffies.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        range_ms: Option<[f64; 2]>,
        /// Its unstalled baseline.
        #[serde(default)]
        baseline_ms: f64,
        /// Median excess over its unstalled baseline, in jiffies.
        jiffies: f64,
        /// Repetitions in which this step stalled.
        stalled_reps: usize,
        /// Repetitions measured.
        reps: usize,
        /// The clock its times were measured on (on the instruction clock they are
        /// instructions, and its jiffies virtual ticks).
        #[serde(default, skip_serializing_if = "Clock::is_wall")]
        clock: Clock,
    },
    /// An ioctl repeatedly slower than its baseline by more than half a jiffy, for no reason
    /// the analysis knows: it cannot wait for SRCU on this kernel, or no grace period was in
    /// flight.
    SlowIoctl {
        /// The slow ioctl.
        ioctl: String,
        /// Its position in the construction order (0-based index of the ioctl).
        step: usize,
        /// Median duration over the repetitions where it was slow.
        median_ms: f64,
        /// Its baseline.
        #[serde(default)]
        baseline_ms: f64,
        /// Median excess over its baseline, in jiffies.
        jiffies: f64,
        /// Repetitions in which this step was slow.
        slow_reps: usize,
        /// Repetitions measured.
        reps: usize,
        /// The clock its times were measured on.
        #[serde(default, skip_serializing_if = "Clock::is_wall")]
        clock: Clock,
    },
    /// A measured value that disagrees with what the scenario expects of it.
    SelfCheck {
        /// What was checked.
        check: SelfCheck,
        /// The variant.
        #[serde(default)]
        variant: String,
        /// The metric checked.
        metric: String,
        /// What it should be.
        expected: f64,
        /// What it was (median).
        observed: f64,
    },
    /// Stage-2 faults against pages touched: how many pages each fault mapped, and why.
    FaultsPerPage {
        /// Pages the guest touched.
        pages: u64,
        /// `kvm.vcpu.pf_fixed` (median).
        pf_fixed: f64,
        /// Of those, faults on the guest's own page-table pages.
        table_pages: f64,
        /// The stage-2 MMU, when known.
        mmu: Option<hvlab_core::memory::Stage2Mmu>,
    },
    /// userfaultfd faults against pages touched.
    UserfaultfdFaults {
        /// Pages the guest touched.
        pages: u64,
        /// userfaultfd faults (median).
        faults: f64,
    },
    /// The aging policy released pins in the idle tail.
    PinsAged {
        /// Age after which a pin is released, ms.
        after_ms: u64,
        /// Bytes still pinned at the end.
        pinned_bytes_end: u64,
        /// Length of the idle tail, ms.
        tail_ms: u64,
    },
    /// Records written while the buffer could not be pinned.
    Blackouts {
        /// Records lost (median).
        records: f64,
        /// Buffer size.
        buffer_bytes: u64,
        /// The pin cap.
        cap_bytes: u64,
    },
    /// Records lost while SPE stopped on stage-2 faults on an unpinned buffer (no-pin).
    FaultBlackouts {
        /// Records lost (median).
        records: f64,
        /// Stage-2 faults on the buffer (median).
        faults: f64,
        /// Percent of the buffer the host unmapped at every switch-out.
        unmap_pct: u32,
    },
    /// How KVM switches the perf MSRs for a PMU configuration (model).
    PmuMsrLists {
        /// MSRs in the VM-entry and VM-exit MSR-load lists.
        load_list: Vec<String>,
        /// MSRs in the VMCS's dedicated fields.
        vmcs_fields: Vec<String>,
        /// MSRs dropped because host and guest values are equal.
        dropped: Vec<String>,
        /// Explicit WRMSRs before VM-entry.
        wrmsrs: u32,
    },
    /// Guest PEBS is cut while the host uses PEBS (model).
    GuestPebsDisabled,
    /// What the race explorer found for a PMU scheme.
    RaceExplored(hvlab_core::exits::RaceReport),
    /// Dirty logging: the log reported exactly the pages each pass wrote (a pass where it did
    /// not fails the variant instead), and what collecting it took per pass.
    DirtyLog {
        /// The variant (`bitmap`, `clear`, `ring`).
        variant: String,
        /// Pages written per pass.
        pages: u64,
        /// Measured passes over all repetitions.
        passes: u64,
        /// Write-protect faults per pass (median), where the backend counts them.
        wp_faults: Option<f64>,
        /// Collection ioctls per pass (median).
        ioctls: f64,
        /// `KVM_EXIT_DIRTY_RING_FULL` exits per pass (median), for the ring.
        ring_full_exits: Option<f64>,
    },
    /// Which inputs of a percpu prediction are assumptions.
    PercpuAssumptions {
        /// The workload.
        workload: String,
        /// CPUs modelled.
        cpus: u32,
    },
}

impl Finding {
    /// Marks a finding that carries times with the clock they were measured on.
    pub fn set_clock(&mut self, on: Clock) {
        if let Finding::SrcuStall { clock, .. } | Finding::SlowIoctl { clock, .. } = self {
            *clock = on;
        }
    }
}

/// The self-checks scenarios make on their own measurements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SelfCheck {
    /// `kvm.vcpu.exits` per iteration is not 1: the host's statistic misses roundtrips.
    ExitsStatistic,
    /// The exit reached the VMM a different number of times than the variant assumes.
    UserspaceExits,
}

/// The outcome of comparing a faster candidate against a slower one on one metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// The metric compared.
    pub metric: String,
    /// The side with the lower median.
    pub faster: String,
    /// The side with the higher median.
    pub slower: String,
    /// median(slower) / median(faster): how many times faster `faster` is.
    pub ratio: f64,
    /// 95% bootstrap CI of that ratio.
    pub ci95: [f64; 2],
    /// Whether the verdict rule (the verdict rule (`analysis::verdict::call`)) calls the difference: at least 4 samples
    /// per side, the exact rank test below 5% after Holm's correction over the variants
    /// compared, and the whole interval beyond the 5% minimum effect.
    pub significant: bool,
    /// Too few samples on a side for the rule to call anything.
    #[serde(default)]
    pub too_few: bool,
    /// Samples of the faster and the slower side.
    #[serde(default)]
    pub n: [usize; 2],
    /// The exact rank test's p-value, and after Holm's correction.
    #[serde(default)]
    pub p_value: f64,
    /// The p-value after Holm's correction over the comparisons made together.
    #[serde(default)]
    pub p_adjusted: f64,
    /// The unit of the medians.
    #[serde(default)]
    pub unit: String,
    /// Medians of the faster and the slower side.
    #[serde(default)]
    pub medians: [f64; 2],
    /// The stall that explains the gap, where the analysis found one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<StallCause>,
    /// Neither side has any spread (the model's exact values): judged by the ratio alone.
    #[serde(default)]
    pub exact: bool,
    /// Why the rule could not decide, and what would decide it (neither `significant` nor a
    /// "no change" that the samples could have refuted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undecided: Option<crate::verdict::Undecided>,
    /// The side this comparison is against: the scenario's baseline variant (its question's,
    /// or `--baseline-variant`). Absent in runs stored before a scenario declared one: those
    /// compared every variant against the fastest, so the faster side is the baseline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
}

/// An SRCU stall that explains why the slower side of a verdict is slower.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StallCause {
    /// The ioctl that waited.
    pub ioctl: String,
    /// The registration that started the grace period.
    pub caused_by: Option<String>,
    /// How long it took (median), ms.
    pub median_ms: f64,
    /// Its excess, in jiffies.
    pub jiffies: f64,
    /// The clock it was measured on.
    #[serde(default, skip_serializing_if = "Clock::is_wall")]
    pub clock: Clock,
}

/// Verdicts in JSON: the data, the class in the one vocabulary (`class`: "faster", "slower",
/// "no change", "not decided") and the sentence (`text`).
fn verdicts_with_text<S: Serializer>(verdicts: &[Verdict], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::Error as _;
    let mut worded = worded(verdicts, "text").map_err(S::Error::custom)?;
    for (value, v) in worded.iter_mut().zip(verdicts) {
        if let Some(map) = value.as_object_mut() {
            let class = serde_json::to_value(v.class()).map_err(S::Error::custom)?;
            map.insert("class".into(), class);
        }
    }
    worded.serialize(s)
}

/// Each item's fields and, under `key`, its sentence from the renderer (`Display`, written in
/// this crate's words.rs): the JSON form of typed findings and verdicts.
pub fn worded<T: Serialize + std::fmt::Display>(
    items: &[T],
    key: &str,
) -> Result<Vec<serde_json::Value>, serde_json::Error> {
    items
        .iter()
        .map(|item| {
            let mut value = serde_json::to_value(item)?;
            if let Some(map) = value.as_object_mut() {
                map.insert(key.into(), item.to_string().into());
            }
            Ok(value)
        })
        .collect()
}

fn with_words<T: Serialize + std::fmt::Display, S: Serializer>(
    items: &[T],
    key: &str,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::Error as _;
    worded(items, key).map_err(S::Error::custom)?.serialize(s)
}

/// Findings in JSON: the data, and the sentence (`message`) scripts and people read.
fn findings_with_messages<S: Serializer>(findings: &[Finding], s: S) -> Result<S::Ok, S::Error> {
    with_words(findings, "message", s)
}

/// Integers as integers (counts stay exact), everything else rounded to 9 significant
/// decimals so binary noise like 0.30000000000000004 does not reach the output.
fn compact<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.fract() == 0.0 && v.abs() < 9.0e15 {
        // Exactly integral and within i64's exact range.
        #[allow(clippy::cast_possible_truncation)]
        return s.serialize_i64(*v as i64);
    }
    if !v.is_finite() {
        return s.serialize_none();
    }
    let rounded = format!("{v:.9}").parse::<f64>().unwrap_or(*v);
    s.serialize_f64(rounded)
}

fn compact_pair<S: Serializer>(v: &[f64; 2], s: S) -> Result<S::Ok, S::Error> {
    compact_vec(&v.to_vec(), s)
}

fn compact_vec<S: Serializer>(v: &Vec<f64>, s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    struct Compact(f64);
    impl Serialize for Compact {
        fn serialize<S2: Serializer>(&self, s: S2) -> Result<S2::Ok, S2::Error> {
            compact(&self.0, s)
        }
    }
    let mut seq = s.serialize_seq(Some(v.len()))?;
    for x in v {
        seq.serialize_element(&Compact(*x))?;
    }
    seq.end()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_status_writes_and_reads_the_contract_strings() {
        for (status, text) in [
            (VariantStatus::Ok, "ok"),
            (
                VariantStatus::Unsupported("needs KVM_CAP_X".into()),
                "unsupported: needs KVM_CAP_X",
            ),
            (
                VariantStatus::Failed("guest shut down".into()),
                "failed: guest shut down",
            ),
        ] {
            let json = serde_json::to_string(&status).unwrap();
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(
                serde_json::from_str::<VariantStatus>(&json).unwrap(),
                status
            );
            assert_eq!(status, text);
        }
    }

    #[test]
    fn counts_serialize_as_exact_integers_and_times_without_binary_noise() {
        let m = MetricRecord::new("count", vec![65537.0, 65537.0, 65537.0], 1);
        let j = serde_json::to_string(&m).unwrap();
        assert!(j.contains("\"median\":65537,"), "{j}");
        assert!(j.contains("\"samples\":[65537,65537,65537]"), "{j}");
        let t = MetricRecord::new("ms", vec![0.1 + 0.2], 1);
        let j = serde_json::to_string(&t).unwrap();
        assert!(j.contains("0.3,") || j.contains("0.3]"), "{j}");
    }

    /// A run of `backend` on a host of `clock`, one time metric in `unit`, as assembled.
    fn run_on(backend: BackendKind, clock: Clock, unit: &str) -> RunRecord {
        let mut run: RunRecord = serde_json::from_value(serde_json::json!({
            "run_id": format!("2026-11-29T23:00:00Z-exits-{backend}-{clock}"),
            "scenario": "exits",
            "backend": backend,
            "profile": (backend == BackendKind::Model).then_some("tcg-icount-epyc"),
            "host": {
                "kernel": "7.3.4", "cpu": "AMD EPYC", "cores": 1, "kvm_flavour": "svm",
                "tdp": true, "tdp_mmu": true, "vpmu": false, "hz": 250, "hz_source": "config",
                "thp": "always", "kvm_access": "ok", "capabilities": {},
                "hvlab_version": "0", "git_rev": "x", "clock": clock,
            },
            "params": {},
            "started_at": "2026-11-29T23:00:00Z",
            "finished_at": "2026-11-29T23:00:01Z",
            "variants": [{"name": "pio-out", "status": "ok", "metrics": {}}],
        }))
        .unwrap();
        run.variants[0].metrics.insert(
            "roundtrip_ns".to_string(),
            MetricRecord::new(unit, vec![3_487.0, 3_487.0, 3_488.0], 1),
        );
        run
    }

    /// A model run is on its profile's clock, which its host carries: labelled in
    /// instructions when assembled on the instruction clock, refused beside a wall-clock run.
    /// A model run stored before profiles had clocks (its host the instruction-clock guest
    /// that computed it, its times the profile's nanoseconds) reads as before: the wall
    /// clock. A VMM's word on the clock moves a measured run, never a model run.
    #[test]
    fn a_model_run_is_on_its_profiles_clock_and_an_older_one_stays_wall() {
        let mut model = run_on(BackendKind::Model, Clock::Icount, "ns");
        model.label_times();
        assert_eq!(model.variants[0].metrics["roundtrip_ns"].unit, "insn");
        assert_eq!(model.clock(), Clock::Icount);
        let wall = run_on(BackendKind::Kvm, Clock::Wall, "ns");
        let mixed = one_clock([&model, &wall]).unwrap_err();
        assert_eq!(mixed.first, (model.run_id.clone(), Clock::Icount));
        assert_eq!(mixed.other, (wall.run_id.clone(), Clock::Wall));
        let back: RunRecord =
            serde_json::from_str(&serde_json::to_string(&model).unwrap()).unwrap();
        assert_eq!(back.clock(), Clock::Icount);

        let older = run_on(BackendKind::Model, Clock::Icount, "ns");
        assert_eq!(older.clock(), Clock::Wall);
        assert_eq!(one_clock([&older, &wall]).unwrap(), Clock::Wall);

        // A wall-clock profile's run in an instruction-clock guest: the model's host is the
        // profile's (wall); the VMM that booted the guest does not make it an icount run.
        let mut wall_model = run_on(BackendKind::Model, Clock::Wall, "ns");
        wall_model.label_times();
        wall_model.measured_on(Clock::Icount);
        assert_eq!(wall_model.host.clock, Clock::Wall);
        assert_eq!(wall_model.variants[0].metrics["roundtrip_ns"].unit, "ns");
        assert_eq!(wall_model.clock(), Clock::Wall);

        // A measured run from a guest whose hvlab recorded no clock takes the VMM's.
        let mut kvm = run_on(BackendKind::Kvm, Clock::Wall, "ns");
        kvm.measured_on(Clock::Icount);
        assert_eq!(kvm.clock(), Clock::Icount);
        assert_eq!(kvm.variants[0].metrics["roundtrip_ns"].unit, "insn");
    }

    #[test]
    fn records_round_trip_through_json() {
        let m = MetricRecord::new("ms", vec![7.5, 7.6, 7.4], 3);
        let back: MetricRecord = serde_json::from_str(&serde_json::to_string(&m).unwrap()).unwrap();
        assert_eq!(back.samples, m.samples);
        assert_eq!(back.median, m.median);
    }
}
