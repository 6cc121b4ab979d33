//! `hvlab kab A B`: a kernel A/B. Boots A and B alternately (ABBA over `--boots`), runs the
//! scenarios in each, and judges each metric as far as the accelerator lets it be trusted:
//!
//! - counts (KVM statistics, stalls, faults, exits): exact when each side repeats one value
//!   (a regression when B's is higher); rank-tested when they vary between repetitions;
//! - jiffies (the lifecycle ioctls' time in jiffies of the guest's HZ: a grace-period wait is
//!   a whole number of ticks, which an emulator stretches but does not invent): the rank test
//!   of [`crate::analysis::compare::ab`];
//! - times: judged with that test only under `kvm` acceleration; under TCG every guest
//!   instruction is emulated, so they are shown and not judged.
//!
//! Every rank test of one kab (jiffies, times, varying counts, across all its scenarios and
//! variants) is corrected together with Holm before anything is called, as the suite and
//! `compare` correct theirs: dozens of comparisons each at p < 0.05 alone call a change in
//! most A/A kabs. A stall B gained regresses it only as its stall count does.
//!
//! [`run`] is the whole A/B as a library function (after Firecracker's `git_ab_test`): it
//! resolves and builds both kernels, boots them in ABBA order, stores their runs and returns
//! a [`KabOutcome`]; the command line only renders it.
//!
//! Here: the outcome and its parts. The request, typed where the command line reads it, is in
//! `request`, judging in `judge`, the boots in `run`, the model's prediction in `predict`.

mod judge;
mod predict;
mod request;
mod run;

use judge::host_busy_during;

pub use judge::{
    Cause, Change, CorrectedP, GraceWait, Inconclusive, Judgement, MetricAb, MetricOutcome,
    ScenarioAb, SideFailure, SideRuns, StallAb, StallReps, StallSide, Trust, Unsettled, VariantAb,
    VariantVerdict, WorseWay, correct_family, judge, judge_pair, judgement, verdict, verdicts,
};
pub use judge::{EventsBeside, HostEventAb, KeyMoved, KvmCountAb, MSR_WRITES_METRIC};
pub(crate) use judge::{busy_during_boot, not_judged_on_a_busy_host};
pub use predict::{
    EventEstimate, HostRole, KabPrediction, PredictedWait, PricedOn, ThisHostMissing,
    ThisHostPrediction, VariantPrediction, price,
};
pub use request::{GuestScenario, KabRequest, guest_scenarios, with_instruction_clock_sets};
pub use run::{abba, logs_dir, run};
pub(crate) use run::{boot_group, guest_commands};

use std::path::PathBuf;

use serde::Serialize;

use hvlab_core::noise::BusyReason;

use crate::kernel::Kernel;
use crate::kernel::build::{BuildInfo, BuildNote, BuildProgress, Step};
use crate::kernel::vm::AccelChoice;
use crate::lab::fidelity::memory_patch::MemoryPrediction;

/// Where a kab's progress goes (building is reported through [`BuildProgress`]).
pub trait KabProgress: BuildProgress {
    /// Both kernels are ready: what they are and how the VMs run.
    fn kernels(&self, kernels: &[Kernel; 2], notes: &[BuildNote], accel: &AccelChoice);
    /// Boot `n` of `total` starts.
    fn boot_start(&self, n: usize, total: usize, side: &str, kernel: &Kernel);
    /// It ended.
    fn boot_end(&self, boot: &BootSummary);
    /// Something the user should know as it happens (a calibration kept, or not).
    fn note(&self, text: &str);
}

/// Something the reader of a kab must know about its kernels: how they were built, and what
/// of the patched code is counted. Words in `src/export/kab/words.rs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum KabNote {
    /// A patch file could not be read, so its functions' calls are not counted.
    CallsNotCounted {
        /// The patch file.
        patch: String,
        /// Why it could not be read.
        why: String,
    },
    /// The patched functions whose calls each guest counts.
    CallsCounted {
        /// Their names.
        functions: Vec<String>,
    },
    /// A changed place whose calls cannot be counted.
    NotCounted {
        /// The place and why (`arch/x86/kvm/x86.c: a macro`).
        what: String,
    },
    /// B's object code against A's, function by function (line-number constants aside),
    /// when both were built by hvlab.
    ObjectCode {
        /// The delta.
        delta: crate::kernel::objdiff::BuildsDelta,
    },
    /// Where the patched functions were read: the unpatched build's DWARF (exact, inlined
    /// call sites included) or the C scanner (the build has no debug information).
    ReachRead {
        /// The functions and inlined sites, as read.
        reach: crate::kernel::reach::Reach,
        /// Where.
        source: crate::kernel::reach::ReachSource,
    },
    /// On the instruction clock, times judged changed with one boot a side: each side was
    /// booted once more, and the kab judged from both boots.
    SecondBoot {
        /// The metrics (`variant: metric`) that changed with one boot a side.
        changed: Vec<String>,
    },
    /// About how the kernels were built (serialized with the build note's own `kind`).
    #[serde(untagged)]
    Build(BuildNote),
}

/// A guest command that did not exit 0.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GuestFailure {
    /// hvlab's arguments in the guest.
    pub args: Vec<String>,
    /// Its exit code.
    pub rc: Option<i32>,
    /// What it printed on stderr.
    pub stderr: String,
}

/// One boot.
#[derive(Debug, Clone, Serialize)]
pub struct BootSummary {
    /// `A` or `B`.
    pub side: String,
    /// `uname -r` in the guest.
    pub release: String,
    /// Seconds to the first hvlab command.
    pub to_first_command_s: Option<f64>,
    /// Seconds QEMU ran.
    pub wall_s: f64,
    /// The serial log.
    pub console: PathBuf,
    /// Runs brought back.
    pub runs: usize,
    /// Of those, new to the store.
    pub stored: usize,
    /// Where they were stored.
    pub store: String,
    /// Guest commands that failed.
    pub failures: Vec<GuestFailure>,
    /// What kept this boot's QEMU waiting for a CPU (pressure or steal), when anything did.
    pub host_busy: Option<Vec<BusyReason>>,
}

/// A boot the host was busy during, and what kept its QEMU waiting for a CPU.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BusyBoot {
    /// The boot, from 1 in boot order.
    pub boot: usize,
    /// Its side (`A` or `B`).
    pub side: String,
    /// What kept its QEMU waiting: CPU pressure or steal.
    pub reasons: Vec<BusyReason>,
}

/// This host, as the cover letter names it.
#[derive(Debug, Clone, Serialize)]
pub struct HostSummary {
    /// `uname -r`.
    pub kernel: String,
    /// CPU model.
    pub cpu: String,
    /// Online CPUs.
    pub cores: usize,
    /// The hypervisor this host runs under, when any.
    pub hypervisor: Option<String>,
}

/// Wall times of a kab.
#[derive(Debug, Clone, Serialize)]
pub struct WallTimes {
    /// Resolving, fetching and building the kernels.
    pub build_s: f64,
    /// The boots.
    pub boots_s: f64,
    /// All of it.
    pub total_s: f64,
}

/// Everything a kab found: both kernels and how they were made, the boots, the per-metric
/// comparison and the per-variant verdicts. `--json` prints it as is.
#[derive(Debug, Clone, Serialize)]
pub struct KabOutcome {
    /// hvlab's version and git revision.
    pub hvlab_version: String,
    /// Kernel A.
    pub a: Kernel,
    /// Kernel B.
    pub b: Kernel,
    /// How A and B were built (`None`: used as given).
    pub builds: [Option<BuildInfo>; 2],
    /// Steps the builds shared (fetching, unpacking and preparing the source).
    pub build_steps: Vec<Step>,
    /// What the reader must know about the pair (they differ by the patch alone).
    pub notes: Vec<KabNote>,
    /// The accelerator.
    pub accel: AccelChoice,
    /// This host.
    pub host: HostSummary,
    /// Scenarios run.
    pub scenario_names: Vec<String>,
    /// Boots per kernel and repetitions per boot.
    pub boots_per_side: u32,
    /// Repetitions per variant per boot.
    pub reps: u32,
    /// The boots, in order.
    pub boots: Vec<BootSummary>,
    /// The per-metric comparison.
    pub scenarios: Vec<ScenarioAb>,
    /// The per-variant verdicts.
    pub verdicts: Vec<VariantVerdict>,
    /// Whether any verdict is REGRESSED (a judged metric worse, a stall gained, or a
    /// variant A ran that B failed): what `--fail-on-regression` reads.
    pub regression: bool,
    /// Judged metrics the samples could not settle.
    pub inconclusive: usize,
    /// Wall times.
    pub wall: WallTimes,
    /// Seconds in all (kept for older readers of the JSON).
    pub wall_s: f64,
    /// The model's prediction of the same change (lifecycle only): predicted, never measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction: Option<KabPrediction>,
    /// The memory model's `pf_fixed` for the change (memory only): predicted, never measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_prediction: Option<MemoryPrediction>,
}

impl KabOutcome {
    /// The verdict of `variant` (in any scenario).
    pub fn verdict_of(&self, variant: &str) -> Option<&VariantVerdict> {
        self.verdicts.iter().find(|v| v.variant == variant)
    }

    /// The boots the host was busy during (when any, nothing was judged).
    pub fn host_busy(&self) -> Vec<BusyBoot> {
        host_busy_during(&self.boots)
    }
}

/// A kab of a patch that makes dirty logging lose one page per pass, as stored:
/// A ran every dirty variant, B failed each (`tests/fixtures/kab-dirty-lost-page/`).
#[cfg(test)]
pub(crate) mod fixture {
    use super::*;
    use crate::kernel::vm::Accel;
    use crate::record::{Finding, RunRecord, VariantRecord, VariantStatus};
    use crate::store::Store;

    const RUNS: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kab-dirty-lost-page/runs.jsonl"
    ));

    /// What B's dirty log said in every variant.
    pub const LOST: &str =
        "the dirty log reported 4095 pages in pass 1 of repetition 1, the guest wrote 4096";

    /// The four runs, through a store and back: a run whose every variant failed is stored
    /// like any other.
    pub fn runs() -> Vec<RunRecord> {
        through_a_store(RUNS)
    }

    /// The revert of 004's trailing prefetch under the default TDP MMU, as a kab stored it:
    /// `__direct_pte_prefetch` called 0 times in every boot (`tests/fixtures/kab-not-exercised/`).
    pub fn not_exercised_runs() -> Vec<RunRecord> {
        through_a_store(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/kab-not-exercised/runs.jsonl"
        )))
    }

    /// The runs of `jsonl`, stored and loaded back.
    fn through_a_store(jsonl: &str) -> Vec<RunRecord> {
        let parsed: Vec<RunRecord> = jsonl
            .lines()
            .map(|l| serde_json::from_str(l).expect("a stored run"))
            .collect();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut store = Store::open(&dir.path().join("kab.db")).expect("a store");
        let tally = crate::store::transfer::ingest_all(&mut store, &parsed).expect("ingested");
        assert_eq!(tally.stored, 4);
        parsed
            .iter()
            .map(|r| store.load(&r.run_id).expect("stored"))
            .collect()
    }

    /// Side `side`'s runs (`A` or `B`).
    pub fn side(runs: &[RunRecord], side: &str) -> Vec<RunRecord> {
        runs.iter()
            .filter(|r| {
                r.host
                    .under_test
                    .as_ref()
                    .and_then(|u| u.kab.as_ref())
                    .is_some_and(|k| k.side == side)
            })
            .cloned()
            .collect()
    }

    /// The kab judged as `hvlab kab --scenario dirty` judges it, with each side's failed
    /// guest commands.
    pub fn judged(
        a: &[RunRecord],
        b: &[RunRecord],
        failed_commands: [&[GuestFailure]; 2],
    ) -> Vec<ScenarioAb> {
        judge(
            &["dirty".to_string()],
            &[],
            [
                SideRuns {
                    runs: a,
                    failed_commands: failed_commands[0],
                },
                SideRuns {
                    runs: b,
                    failed_commands: failed_commands[1],
                },
            ],
            Accel::Tcg,
            0.05,
        )
    }

    /// The 004 revert's memory kab under the legacy MMU, as its stored runs would be (one run
    /// a side, relabelled from the dirty fixture's): populated 512 → 4097 faults per 16 MiB
    /// pass of 4096 pages, lazy 4096 → 4097.
    pub fn memory_revert() -> [Vec<RunRecord>; 2] {
        let runs = runs();
        let side = |side: &str, faults: [f64; 2]| -> Vec<RunRecord> {
            let mut r = fixture::side(&runs, side)[0].clone();
            r.scenario = "memory".into();
            let variant = |name: &str, pf: f64| {
                let samples = vec![pf; 4];
                let mut metrics = std::collections::BTreeMap::new();
                metrics.insert(
                    "kvm.vcpu.pf_fixed".to_string(),
                    crate::record::MetricRecord {
                        unit: "count".into(),
                        median: pf,
                        ci95: [pf, pf],
                        min: pf,
                        max: pf,
                        n: samples.len(),
                        samples,
                    },
                );
                VariantRecord {
                    name: name.into(),
                    status: VariantStatus::Ok,
                    metrics,
                    findings: vec![Finding::FaultsPerPage {
                        pages: 4096,
                        pf_fixed: pf,
                        table_pages: 0.0,
                        mmu: None,
                    }],
                    timeline: Vec::new(),
                    pinned_bytes: Vec::new(),
                }
            };
            r.variants = vec![variant("populated", faults[0]), variant("lazy", faults[1])];
            vec![r]
        };
        [side("A", [512.0, 4096.0]), side("B", [4097.0, 4097.0])]
    }

    /// B's guest command for the dirty scenario, exiting 4 as `hvlab run` does when every
    /// variant failed.
    pub fn b_command_failed(stderr: &str) -> GuestFailure {
        GuestFailure {
            args: ["run", "dirty", "--reps", "4", "--json"]
                .map(str::to_string)
                .to_vec(),
            rc: Some(4),
            stderr: stderr.to_string(),
        }
    }
}
