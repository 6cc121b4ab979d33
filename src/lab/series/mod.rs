//! `hvlab kab BASE SERIES --per-patch`: a verdict per commit of a series, each commit against
//! its parent and against the base, LKP-style (parent | commit | %change, with the spread).
//!
//! - A series is an ordered list of steps ([`SeriesStep`]: a label, a subject and a kernel
//!   spec `resolve` accepts), from a [`SeriesSource`]: the messages of an mbox on a Debian
//!   base ([`MboxSeries`]), or a git range (the git spec's own source, when it is given one).
//! - Boots follow [`sweep_order`]: base, 1, 2, …, N, N, …, 2, 1, base per round, so every
//!   adjacent pair (parent, commit) sees ABBA and each kernel's boot serves both pairs it is in.
//! - Runs are stored as they come back and found again by kernel and by what was asked
//!   ([`stored_runs`], [`RunsAsked`]: scenario, variants, `--set`, reps, accelerator): an
//!   interrupted run, a shard's or a bisection's boots count toward the next, and a kernel with
//!   enough stored boots is not booted again; another command's boots of the same kernel
//!   (other variants, another `--set`) are not taken for this one's.
//! - Every comparison of the table (N commits × 2 × variants × metrics) is corrected together
//!   ([`judge_series`]): a table of 576 comparisons each at p < 0.05 alone would flag a change
//!   in nearly every A/A series.
//! - A commit that does not build keeps its row with the compiler's first error, and the next
//!   commit is judged against the last one that built.

mod boots;
mod source;
mod table;

use serde::Serialize;

use crate::error::InputError;
use crate::kernel::build::{BuildError, BuildNote, Built, PatchedSpec};
use crate::kernel::objdiff::{self, BuildsDelta};
use crate::kernel::vm::VmError;
use crate::lab::Error;
use crate::lab::kab::{self};
use crate::lab::shard::Shard;
use crate::store::Store;

use source::not_a_series;

pub(crate) use boots::boot_chain;
pub use boots::{
    KernelRuns, RunsAsked, boots_in, of_kernel, remaining_order, stored_runs, sweep_order,
};
pub use source::{GitRangeSeries, MboxSeries, SeriesSource, SeriesStep, is_base_of, source_of};
pub use table::{
    CommitRow, JudgeSettings, Numbers, SeriesTable, StepState, VariantRow, first_error,
    judge_commit, judge_series,
};

/// The kernels a shard boots: unit `k` (0-based position in the series) is commit `k` booted
/// against its parent, so a shard on its own node judges each of its commits against a parent
/// booted on the same host. Returns, per selected commit, its index and its parent's (None for
/// the base). A parent is booted by its child's shard too: its own shard may run on another
/// node, and a comparison across hosts would measure the hosts.
pub fn shard_units(steps: usize, shard: &Shard) -> Vec<(usize, Option<usize>)> {
    (0..steps)
        .filter(|&k| shard.selects(k))
        .map(|k| (k, k.checked_sub(1)))
        .collect()
}

/// What `hvlab kab BASE SERIES --per-patch` runs.
#[derive(Debug, Clone)]
pub struct PerPatchRequest {
    /// The kab's settings: `base` is BASE, `patched` the SERIES spec; boots and reps per
    /// kernel.
    pub kab: kab::KabRequest,
    /// The metric shown in each row's numbers when none moved and it was judged.
    pub metric: Option<String>,
    /// The slice of the series this process runs (the whole series without `--shard`).
    pub shard: Shard,
}

/// A per-patch run: the table, the boots it made, and its phases' times.
#[derive(Debug, Clone, Serialize)]
pub struct PerPatchOutcome {
    /// The table (a shard's: its commits only).
    pub table: SeriesTable,
    /// The shard (`1/1` for the whole series).
    pub shard: String,
    /// Each boot made now, with the commit it booted (`base` for the base).
    pub boots: Vec<(String, kab::BootSummary)>,
    /// Boots found in the store and not made again, per kernel label.
    pub reused_boots: Vec<(String, u32)>,
    /// What the reader must know (builds, reuse, pooling across shards).
    pub notes: Vec<SeriesNote>,
    /// The accelerator.
    pub accel: crate::kernel::vm::AccelChoice,
    /// Wall times: building, booting, judging.
    pub wall: kab::WallTimes,
    /// Seconds judging.
    pub judge_s: f64,
}

/// Where a per-patch run or a bisection spent its wall time: building, booting, judging.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PhaseTimes {
    /// Resolving and building the kernels, in seconds.
    pub build_s: f64,
    /// The boots made (not those found in the store).
    pub boots: usize,
    /// Booting them and running the scenarios, in seconds.
    pub boots_s: f64,
    /// Judging the stored runs, in seconds.
    pub judge_s: f64,
    /// All of it, in seconds.
    pub total_s: f64,
}

impl PerPatchOutcome {
    /// Its phases' wall times.
    pub fn phases(&self) -> PhaseTimes {
        PhaseTimes {
            build_s: self.wall.build_s,
            boots: self.boots.len(),
            boots_s: self.wall.boots_s,
            judge_s: self.judge_s,
            total_s: self.wall.total_s,
        }
    }
}

/// Something the reader of a per-patch table must know. Words in `src/export/series.rs`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SeriesNote {
    /// This process ran one shard of the series.
    Shard {
        /// The shard.
        shard: Shard,
    },
    /// Boots found in the store and not made again.
    ReusedBoots {
        /// Per kernel label, how many.
        boots: Vec<(String, u32)>,
    },
    /// About the series or how its kernels were built (serialized with the build note's own
    /// `kind`).
    #[serde(untagged)]
    Build(BuildNote),
}

/// One kernel of the series as resolved: its label, spec, and the kernel or why it has none.
struct Resolved {
    label: String,
    spec: PatchedSpec,
    built: Result<Built, String>,
}

/// Builds `specs` (the base first): together when all build, each beside the base when one
/// does not, so a commit that does not compile costs its own row and not the series.
fn build_all(
    specs: &[(String, PatchedSpec)],
    req: &kab::KabRequest,
    progress: &dyn kab::KabProgress,
    notes: &mut Vec<SeriesNote>,
) -> Result<Vec<Resolved>, Error> {
    use crate::kernel::build;
    let refs: Vec<PatchedSpec> = specs.iter().map(|(_, s)| s.clone()).collect();
    let together = build::resolve_with_config(&refs, req.sandbox, req.config.as_deref(), progress);
    let kernels: Vec<Result<Built, String>> = match together {
        Ok(r) => {
            notes.extend(r.notes.into_iter().map(SeriesNote::Build));
            r.sides.into_iter().map(Ok).collect()
        }
        // Which commit is at fault (a git range's commit fails as the unpatched source),
        // or whether the base is: each beside the base, the base first.
        Err(
            e @ (BuildError::PatchedCompile { .. }
            | BuildError::DoesNotApply { .. }
            | BuildError::BaseCompile { .. }),
        ) => {
            progress.note(&format!(
                "the series does not build as a whole ({}); building each commit beside the base to find which",
                first_error(&e)
            ));
            let mut out = Vec::new();
            for (i, spec) in refs.iter().enumerate() {
                out.push(build_beside_base(
                    &refs[0],
                    (i > 0).then_some(spec),
                    req,
                    progress,
                )?);
            }
            out
        }
        Err(e) => return Err(VmError::from(e).into()),
    };
    Ok(specs
        .iter()
        .zip(kernels)
        .map(|((label, spec), built)| Resolved {
            label: label.clone(),
            spec: spec.clone(),
            built,
        })
        .collect())
}

/// Builds `spec` beside the base (the base alone when `None`), as kab builds a pair, so the
/// two differ by the commit alone: its build, or the compiler's first error when the commit
/// is at fault (it does not build, its patch does not apply). A fault of the base or of the
/// host is the run's error: a compile error is the commit's only once the base alone builds
/// (a git commit has no patch, so its compiler error reads as the unpatched source's).
pub(crate) fn build_beside_base(
    base: &PatchedSpec,
    spec: Option<&PatchedSpec>,
    req: &kab::KabRequest,
    progress: &dyn kab::KabProgress,
) -> Result<Result<Built, String>, Error> {
    let specs: Vec<PatchedSpec> = std::iter::once(base).chain(spec).cloned().collect();
    let config = req.config.as_deref();
    match crate::kernel::build::resolve_with_config(&specs, req.sandbox, config, progress) {
        Ok(r) => Ok(r
            .sides
            .into_iter()
            .last()
            .ok_or_else(|| "the build returned no kernel".to_string())),
        Err(e) if spec.is_some() && e.may_be_candidates() => {
            if e.fault() != hvlab_core::error::Fault::BadInput {
                // Cached by now in a bisection, which boots GOOD first: a second or so.
                crate::kernel::build::resolve_with_config(
                    std::slice::from_ref(base),
                    req.sandbox,
                    config,
                    progress,
                )
                .map_err(VmError::from)?;
            }
            Ok(Err(first_error(&e)))
        }
        Err(e) => Err(VmError::from(e).into()),
    }
}

/// A kernel of the series as checked: built and able to run the guests, or why not.
type KernelState = Option<Result<Built, String>>;

/// The kernels to boot with their labels, the base first.
type Labelled = Vec<(String, crate::kernel::Kernel)>;

/// `hvlab kab BASE SERIES --per-patch`: builds each commit of the series (its shard's, and
/// their parents), boots them so each adjacent pair is ABBA, stores every run, and judges
/// every commit against its parent and the base as one family.
pub fn run_per_patch(
    req: &PerPatchRequest,
    source: &dyn SeriesSource,
    store: &mut Store,
    progress: &dyn kab::KabProgress,
) -> Result<PerPatchOutcome, Error> {
    let start = std::time::Instant::now();
    let k = &req.kab;
    let commands = kab::guest_commands(k);
    let qemu = crate::kernel::vm::qemu()?;
    let steps = source.steps()?;
    // The accelerator and the clock the table says it was measured on, as kab's.
    let mut choice = crate::kernel::vm::choose_accel(k.vm.accel)?;
    choice.clock = crate::kernel::vm::choose_clock(k.vm.clock, &choice, &qemu)?;
    let units = shard_units(steps.len(), &req.shard);
    let wanted = kernels_needed(steps.len(), &req.shard, &units);
    let mut specs = vec![("base".to_string(), source.base().clone())];
    specs.extend(
        wanted
            .iter()
            .map(|&i| (steps[i].label.clone(), steps[i].spec.clone())),
    );
    let mut notes: Vec<SeriesNote> = source.notes().into_iter().map(SeriesNote::Build).collect();
    let resolved = build_all(&specs, k, progress, &mut notes)?;
    let build_s = start.elapsed().as_secs_f64();
    let states = checked_states(resolved, &wanted, steps.len(), &choice, progress);
    let objects = object_deltas(&states, &steps, source.base());
    let (labelled, slot) = bootable(&states, &objects, &steps, source.base(), &k.patched)?;
    let chains = chains_to_boot(&req.shard, &units, &slot);
    let boots_start = std::time::Instant::now();
    let booted = boot_chains(
        &chains,
        &labelled,
        k,
        &commands,
        choice.accel,
        store,
        progress,
    )?;
    let boots_s = boots_start.elapsed().as_secs_f64();
    let judge_start = std::time::Instant::now();
    let all = crate::store::transfer::select(store, &[])?;
    let asked = RunsAsked::of(k, choice.accel);
    let runs_of = |slot_i: usize| KernelRuns {
        runs: of_kernel(all.clone(), &labelled[slot_i].1.spec, &asked),
        failed_commands: booted.failed[slot_i].clone(),
        host_busy: booted.busy[slot_i].clone(),
    };
    let base_runs = runs_of(0);
    let step_states = step_states(&states, &slot, runs_of);
    let mut table = judge_series(
        &source.base().given,
        &base_runs,
        &steps,
        &step_states,
        &JudgeSettings {
            asked,
            threshold: k.threshold,
            metric: req.metric.as_deref(),
        },
    );
    for row in &mut table.commits {
        row.object = objects.get(row.position - 1).cloned().flatten();
    }
    if !req.shard.is_whole() {
        table
            .commits
            .retain(|c| units.iter().any(|&(u, _)| u + 1 == c.position));
        notes.push(SeriesNote::Shard { shard: req.shard });
    }
    if !booted.reused.is_empty() {
        notes.push(SeriesNote::ReusedBoots {
            boots: booted.reused.clone(),
        });
    }
    let judge_s = judge_start.elapsed().as_secs_f64();
    Ok(PerPatchOutcome {
        table,
        shard: req.shard.to_string(),
        boots: booted.boots,
        reused_boots: booted.reused,
        notes,
        accel: choice,
        wall: kab::WallTimes {
            build_s,
            boots_s,
            total_s: start.elapsed().as_secs_f64(),
        },
        judge_s,
    })
}

/// The commits (0-based) this process needs built: every one for the whole series; a shard's
/// commits and each one's parent.
fn kernels_needed(steps: usize, shard: &Shard, units: &[(usize, Option<usize>)]) -> Vec<usize> {
    (0..steps)
        .filter(|&i| shard.is_whole() || units.iter().any(|&(c, _)| c == i || c == i + 1))
        .collect()
}

/// Each kernel's state, index 0 the base and i + 1 commit i (`None`: not built here): a
/// commit's kernel must also have the accelerator's KVM module and the guest's config.
fn checked_states(
    resolved: Vec<Resolved>,
    wanted: &[usize],
    steps: usize,
    choice: &crate::kernel::vm::AccelChoice,
    progress: &dyn kab::KabProgress,
) -> Vec<KernelState> {
    let mut states: Vec<KernelState> = vec![None; steps + 1];
    let mut it = resolved.into_iter();
    if let Some(b) = it.next() {
        states[0] = Some(
            b.built
                .map_err(|e| format!("the base {}: {e}", b.spec.given)),
        );
    }
    for (&i, r) in wanted.iter().zip(it) {
        let checked = r.built.and_then(|built| {
            crate::kernel::check_kvm(&built.kernel, &choice.vendor_module)
                .and_then(|()| crate::kernel::check_guest_config(&built.kernel))
                .map(|()| built)
                .map_err(|e| e.to_string())
        });
        if let Err(e) = &checked {
            progress.note(&format!("{} does not build: {e}", r.label));
        }
        states[i + 1] = Some(checked);
    }
    states
}

/// Each commit's object code against its parent's (the last kernel before it that built),
/// by commit (0-based); `None` where either did not build here.
fn object_deltas(
    states: &[KernelState],
    steps: &[SeriesStep],
    base: &PatchedSpec,
) -> Vec<Option<BuildsDelta>> {
    (1..states.len())
        .map(|i| {
            let Some(Ok(me)) = &states[i] else {
                return None;
            };
            let p = (0..i).rev().find(|&j| matches!(states[j], Some(Ok(_))))?;
            let Some(Ok(parent)) = &states[p] else {
                return None;
            };
            let parent_spec = if p == 0 { base } else { &steps[p - 1].spec };
            let patches = steps[i - 1].spec.patches_over(parent_spec);
            Some(objdiff::compare_builds(
                parent,
                me,
                &objdiff::LineShift::of(&patches),
            ))
        })
        .collect()
}

/// The kernels to boot, labelled (the base first), and each state's slot among them (`None`
/// for a commit that did not build or is not built here). A commit whose object code is its
/// parent's, line-number constants aside, is not booted: its slot is its parent's, whose runs
/// are its own (an exact NO CHANGE against it). Fails when the base did not build.
fn bootable(
    states: &[KernelState],
    objects: &[Option<BuildsDelta>],
    steps: &[SeriesStep],
    base: &PatchedSpec,
    patched: &PatchedSpec,
) -> Result<(Labelled, Vec<Option<usize>>), Error> {
    let base_kernel = match states[0].clone() {
        Some(Ok(b)) => b.kernel,
        Some(Err(e)) => {
            return Err(InputError::BadValue {
                key: "BASE".into(),
                value: base.given.clone(),
                why: e,
            }
            .into());
        }
        None => return Err(not_a_series(&patched.given, "it has no base")),
    };
    let mut labelled: Labelled = vec![("base".into(), base_kernel)];
    let mut slot: Vec<Option<usize>> = vec![Some(0); 1];
    for (i, st) in states.iter().enumerate().skip(1) {
        let identical = objects
            .get(i - 1)
            .and_then(Option::as_ref)
            .is_some_and(BuildsDelta::identical);
        let parent_slot = (0..i).rev().find_map(|j| slot[j]);
        match st {
            Some(Ok(_)) if identical && parent_slot.is_some() => slot.push(parent_slot),
            Some(Ok(built)) => {
                slot.push(Some(labelled.len()));
                labelled.push((steps[i - 1].label.clone(), built.kernel.clone()));
            }
            _ => slot.push(None),
        }
    }
    Ok((labelled, slot))
}

/// The chains to boot (slots of the labelled kernels): the whole series as one, or each shard
/// unit with its parent (the last kernel before it that built).
fn chains_to_boot(
    shard: &Shard,
    units: &[(usize, Option<usize>)],
    slot: &[Option<usize>],
) -> Vec<Vec<usize>> {
    let built_before = |i: usize| (0..=i).rev().find_map(|j| slot[j]);
    // A commit not booted shares its parent's slot: each kernel once in a chain.
    let once = |mut chain: Vec<usize>| {
        chain.dedup();
        chain
    };
    if shard.is_whole() {
        vec![once(slot.iter().flatten().copied().collect())]
    } else {
        units
            .iter()
            .filter_map(|&(c, _)| {
                let me = slot[c + 1]?;
                Some(once(vec![built_before(c).unwrap_or(0), me]))
            })
            .collect()
    }
}

/// What booting a series' chains brought back, per labelled kernel where it is per kernel.
struct Booted {
    /// Each boot made now, with its kernel's label.
    boots: Vec<(String, kab::BootSummary)>,
    /// Boots found in the store and not made again, per kernel label.
    reused: Vec<(String, u32)>,
    /// Per kernel, its boots the host was busy during.
    busy: Vec<Vec<kab::BusyBoot>>,
    /// Per kernel, the guest commands that failed on it.
    failed: Vec<Vec<kab::GuestFailure>>,
}

/// Boots each of `chains` (slots of `labelled`) with [`boot_chain`].
fn boot_chains(
    chains: &[Vec<usize>],
    labelled: &[(String, crate::kernel::Kernel)],
    k: &kab::KabRequest,
    commands: &[Vec<String>],
    accel: crate::kernel::vm::Accel,
    store: &mut Store,
    progress: &dyn kab::KabProgress,
) -> Result<Booted, Error> {
    let mut booted = Booted {
        boots: Vec::new(),
        reused: Vec::new(),
        busy: vec![Vec::new(); labelled.len()],
        failed: vec![Vec::new(); labelled.len()],
    };
    for chain in chains {
        let (made, re) = boot_chain(
            chain,
            labelled,
            k,
            commands,
            accel,
            store,
            progress,
            &mut booted.busy,
            &mut booted.failed,
        )?;
        booted.boots.extend(made);
        booted.reused.extend(re);
    }
    Ok(booted)
}

/// Each commit's state for the table (`states` without the base): its runs, the compiler's
/// first error, or no runs when another shard builds it.
fn step_states(
    states: &[KernelState],
    slot: &[Option<usize>],
    runs_of: impl Fn(usize) -> KernelRuns,
) -> Vec<StepState> {
    (1..states.len())
        .map(|i| match (&states[i], slot[i]) {
            (Some(Ok(_)), Some(s)) => StepState::Built(runs_of(s)),
            (Some(Err(e)), _) => StepState::DoesNotBuild { error: e.clone() },
            // Another shard's commit: no runs here, judged where it ran and after `merge`.
            _ => StepState::Built(KernelRuns::default()),
        })
        .collect()
}

/// The table of a series from the store alone (after `hvlab merge`): each commit's runs found
/// by its spec; a commit with none is NOT DECIDED on every row, its runs missing (it did not
/// build, or its shard did not run).
pub fn table_from_store(
    store: &Store,
    source: &dyn SeriesSource,
    settings: &JudgeSettings<'_>,
) -> Result<SeriesTable, Error> {
    let steps = source.steps()?;
    let all = crate::store::transfer::select(store, &[])?;
    let runs = |spec: &PatchedSpec| KernelRuns {
        runs: of_kernel(all.clone(), &spec.given, &settings.asked),
        ..KernelRuns::default()
    };
    let base = runs(source.base());
    let states: Vec<StepState> = steps
        .iter()
        .map(|s| {
            let r = runs(&s.spec);
            if r.runs.is_empty() {
                StepState::DoesNotBuild {
                    error:
                        "no runs stored: it did not build, or its shard's file has not been merged"
                            .into(),
                }
            } else {
                StepState::Built(r)
            }
        })
        .collect();
    Ok(judge_series(
        &source.base().given,
        &base,
        &steps,
        &states,
        settings,
    ))
}

#[cfg(test)]
mod tests;
