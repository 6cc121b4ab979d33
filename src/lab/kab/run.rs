//! Running a kab: the guest commands, both kernels resolved and checked, the boots in ABBA
//! order, the base's calibration cache, and the outcome they make.

use std::path::PathBuf;
use std::time::Instant;

use crate::kernel::build::{self, BuildInfo, Step};
use crate::kernel::vm::{self, AccelChoice, VmError};
use crate::kernel::{self, Kernel};
use crate::lab::Error;
use crate::record::RunRecord;
use crate::scenario;
use crate::store::Store;

use crate::kernel::calibration::{self, Identity};
use crate::kernel::patch::PatchFile;
use crate::lab::fidelity::memory_patch;
use crate::lab::fidelity::patch::{self, StrategyChoice};
use hvlab_core::host::{Clock, KabSide, PatchId};

use super::judge::{
    Judgement, ScenarioAb, SideRuns, busy_during_boot, changed_with_one_boot, judge, judgement,
    mark_given,
};
use super::predict::{KabPrediction, predict, predict_memory};
use super::{
    BootSummary, GuestFailure, HostSummary, KabNote, KabOutcome, KabProgress, KabRequest, WallTimes,
};
use crate::kernel::reach::{PatchedFunction, Reach, reach_exact_or_scanned};

/// Which side a boot is.
pub fn abba(boots_per_side: u32) -> Vec<usize> {
    (0..boots_per_side * 2)
        .map(|i| usize::from(matches!(i % 4, 1 | 2)))
        .collect()
}

/// `commands` with the guest's `hvlab run` asked to count calls of the patched functions
/// (unchanged when there are none).
fn with_count_calls(mut commands: Vec<Vec<String>>, reach: &Reach) -> Vec<Vec<String>> {
    if reach.functions.is_empty() {
        return commands;
    }
    let specs: Vec<String> = reach.functions.iter().map(PatchedFunction::spec).collect();
    for c in commands
        .iter_mut()
        .filter(|c| c.first().is_some_and(|a| a == "run"))
    {
        c.extend(["--count-calls".to_string(), specs.join(",")]);
    }
    commands
}

/// The hvlab command each boot runs, per scenario, with the variants and `--set`s it has
/// (read on the host: [`super::guest_scenarios`]).
pub(crate) fn guest_commands(req: &KabRequest) -> Vec<Vec<String>> {
    req.scenarios
        .iter()
        .map(|s| {
            let info = s.kind.info();
            let mut c = vec![
                "run".to_string(),
                info.name.to_string(),
                "--reps".into(),
                req.reps.to_string(),
                "--warmup".into(),
                "1".into(),
                "--json".into(),
            ];
            for v in req
                .variants
                .iter()
                .filter(|v| info.variants.iter().any(|x| x.name == v.as_str()))
            {
                c.extend(["--variant".to_string(), v.clone()]);
            }
            for kv in &s.sets {
                c.extend(["--set".to_string(), kv.clone()]);
            }
            c
        })
        .collect()
}

/// Boots `jobs` (`at_once` side by side), saying so on `progress` as boot `n` of `total`
/// under `labels`, and returns each boot's result in order with the host's noise over them
/// all (QEMU's TCG thread is each boot's one runnable thread).
pub(crate) fn boot_group(
    jobs: &[vm::BootJob<'_>],
    cfg: &vm::VmConfig,
    at_once: usize,
    progress: &dyn KabProgress,
    (n, total): (usize, usize),
    labels: &[&str],
) -> (Vec<vm::BootResult>, hvlab_core::noise::Noise) {
    if let Some(first) = jobs.first() {
        let label = match labels {
            [one] => (*one).to_string(),
            many => format!("{} side by side (instruction clock)", many.join(", ")),
        };
        progress.boot_start(n, total, &label, first.kernel);
    }
    let before = hvlab_host::noise::Snapshot::take();
    let results = vm::boot_each(jobs, cfg, at_once);
    let noise = hvlab_host::noise::between(
        &before,
        &hvlab_host::noise::Snapshot::take(),
        &[],
        u32::try_from(jobs.len()).unwrap_or(u32::MAX),
    );
    (results, noise)
}

/// Where a boot's console log goes (the cache keeps successful boots' logs for the last
/// runs only).
pub fn logs_dir(release: &str) -> PathBuf {
    kernel::cache::new_boot_log_dir(release)
}

/// The kernel A/B: resolves (and builds) both kernels, checks them before any boot, boots
/// them in ABBA order, stores every run as it comes back, and judges B against A.
pub fn run(
    req: &KabRequest,
    store: &mut Store,
    progress: &dyn KabProgress,
) -> Result<KabOutcome, Error> {
    let start = Instant::now();
    let commands = guest_commands(req);
    vm::check_clock(req.vm.accel, req.vm.clock)?;
    vm::qemu()?;
    let mut kernels = KabKernels::resolve(req, progress)?;
    let build_s = start.elapsed().as_secs_f64();
    let (reach, notes) = kernels.patched_functions();
    kernels.notes.extend(notes);
    let commands = with_count_calls(commands, &reach);
    let lifecycle = req.runs(scenario::Kind::Lifecycle);
    let strategies = kernels.model_strategies(req.model_strategy.as_deref());
    let prefetch = kernels.prefetch_strategies(req.model_strategy.as_deref());
    // The base's profile, calibrated in its own guest under this accelerator: what prices the
    // model's prediction of the change here. Kept per kernel, so only a kab's first run on a
    // base pays for it (in its first boot, after the scenarios).
    let base = Identity::of(&kernels.kernels[0], &kernels.choice);
    let cached = cached_calibration(&base, progress);
    let calibrate_now =
        req.calibrate && lifecycle && strategies.iter().all(Result::is_ok) && cached.is_none();
    let mut tags = kab_tags(
        &kernels.builds,
        lifecycle_declared(req.model_strategy.as_deref()),
    );
    for (tag, s) in tags.iter_mut().zip(&prefetch) {
        tag.memory_strategy = s.as_ref().ok().map(|c| c.name.clone());
    }
    let plan = BootPlan {
        kernels: &kernels,
        commands: &commands,
        tags: &tags,
        calibrate_now,
        base: &base,
    };
    let boots_start = Instant::now();
    let mut booted = plan.boot_abba(req, store, progress)?;
    let mut judged = judge_booted(req, &booted, kernels.choice.accel);
    // One boot a side is the instruction clock's default: a time it judges changed is booted
    // once more on each side (B then A, completing ABBA) and judged again, so a guest that is
    // not deterministic shows as boots of one kernel that disagree, not as the patch.
    let changed = changed_on_one_boot(req, kernels.choice.clock, &judged);
    let mut second_boot = None;
    if !changed.is_empty() {
        progress.note(&format!(
            "a second boot of each side: on the instruction clock {} changed with one boot a side",
            changed.join(", ")
        ));
        plan.boot_in(&[1, 0], req, store, progress, &mut booted)?;
        judged = judge_booted(req, &booted, kernels.choice.accel);
        second_boot = Some(KabNote::SecondBoot { changed });
    }
    let boots_s = boots_start.elapsed().as_secs_f64();
    let calibrated = booted.calibrated.or(cached);
    let host = crate::lab::host::probe();
    let prediction = lifecycle
        .then(|| {
            predict(
                &strategies,
                &booted.sides,
                calibrated.as_ref(),
                calibrate_now,
                req.calibrate,
                &host,
            )
        })
        .transpose()?;
    let memory_prediction = req
        .runs(scenario::Kind::Memory)
        .then(|| predict_memory(prefetch, &booted.sides));
    let wall = WallTimes {
        build_s,
        boots_s,
        total_s: start.elapsed().as_secs_f64(),
    };
    kernels.notes.extend(second_boot);
    let mut outcome = KabOutcome::new(
        req,
        kernels,
        booted.summaries,
        judged,
        host,
        prediction,
        wall,
    );
    outcome.memory_prediction = memory_prediction;
    super::predict::price_events(
        &mut outcome.verdicts,
        calibrated.as_ref(),
        outcome.accel.clock,
    );
    // A second boot of each side counts in the headline's boots a side.
    outcome.boots_per_side = u32::try_from(outcome.boots.len() / 2).unwrap_or(u32::MAX);
    Ok(outcome)
}

/// B judged against A from what the boots brought back.
fn judge_booted(req: &KabRequest, booted: &Booted, accel: vm::Accel) -> Vec<ScenarioAb> {
    let failed_commands = ["A", "B"].map(|side| {
        booted
            .summaries
            .iter()
            .filter(|b| b.side == side)
            .flat_map(|b| b.failures.iter().cloned())
            .collect::<Vec<GuestFailure>>()
    });
    judge(
        &req.scenario_names(),
        &req.variants,
        [0, 1].map(|i| SideRuns {
            runs: &booted.sides[i],
            failed_commands: &failed_commands[i],
        }),
        accel,
        req.threshold,
    )
}

/// The times judged changed with one boot a side on the instruction clock
/// ([`changed_with_one_boot`]): none on the wall clock or with more boots asked for.
fn changed_on_one_boot(req: &KabRequest, clock: Clock, judged: &[ScenarioAb]) -> Vec<String> {
    if clock != Clock::Icount || req.boots != 1 {
        return Vec::new();
    }
    changed_with_one_boot(judged)
}

/// A `--model-strategy` meant for the lifecycle model: any name that is not the memory
/// model's (which [`KabKernels::prefetch_strategies`] takes).
fn lifecycle_declared(declared: Option<&str>) -> Option<&str> {
    declared.filter(|d| memory_patch::Prefetch::named(d).is_none())
}

/// Both kernels of a kab, resolved (built when patched) and checked, and how their VMs run.
struct KabKernels {
    kernels: [Kernel; 2],
    builds: [Option<BuildInfo>; 2],
    /// Fetching, unpacking and preparing the source.
    build_steps: Vec<Step>,
    notes: Vec<KabNote>,
    choice: AccelChoice,
    /// The unpatched source the patched sides were built from.
    source_trees: Vec<PathBuf>,
}

impl KabKernels {
    /// Resolves (and builds) both kernels, picks the accelerator, and checks that both can
    /// host hvlab before either boots.
    fn resolve(req: &KabRequest, progress: &dyn KabProgress) -> Result<KabKernels, Error> {
        // The accelerator and the clock before anything is fetched or built.
        let mut choice = vm::choose_accel(req.vm.accel)?;
        choice.clock = vm::choose_clock(req.vm.clock, &choice, &vm::qemu()?)?;
        let resolved = build::resolve_with_config(
            &[req.base.clone(), req.patched.clone()],
            req.sandbox,
            req.config.as_deref(),
            progress,
        )
        .map_err(VmError::from)?;
        let [a, b]: [build::Built; 2] = resolved.sides.try_into().map_err(|_| {
            VmError::Io(
                PathBuf::from(&req.base.given),
                std::io::Error::other("two kernels expected"),
            )
        })?;
        let mut notes: Vec<KabNote> = resolved.notes.iter().cloned().map(KabNote::Build).collect();
        if a.build.is_some() && b.build.is_some() {
            let patches = req.patched.patches_over(&req.base);
            let lines = crate::kernel::objdiff::LineShift::of(&patches);
            notes.push(KabNote::ObjectCode {
                delta: crate::kernel::objdiff::compare_builds(&a, &b, &lines),
            });
        }
        let kernels = [a.kernel, b.kernel];
        for k in &kernels {
            kernel::check_kvm(k, &choice.vendor_module).map_err(VmError::from)?;
            kernel::check_guest_config(k).map_err(VmError::from)?;
        }
        progress.kernels(&kernels, &resolved.notes, &choice);
        Ok(KabKernels {
            kernels,
            builds: [a.build, b.build],
            build_steps: resolved.steps,
            notes,
            choice,
            source_trees: resolved.source_trees,
        })
    }

    /// The functions both sides' patches change, read against the unpatched source, with a
    /// note of what was counted and what could not be placed.
    fn patched_functions(&self) -> (Reach, Vec<KabNote>) {
        let mut notes = Vec::new();
        let patches: Vec<PatchFile> = self
            .builds
            .iter()
            .flatten()
            .flat_map(|b| &b.patches)
            .filter_map(|p| match PatchFile::read(&p.path) {
                Ok(file) => Some(file),
                Err(e) => {
                    notes.push(KabNote::CallsNotCounted {
                        patch: p.file.clone(),
                        why: e.to_string(),
                    });
                    None
                }
            })
            .collect();
        let Some(tree) = self.source_trees.first() else {
            return (Reach::default(), notes);
        };
        // Exact from the unpatched modules' DWARF when they carry it, else the C scanner.
        let objects = crate::kernel::reach::module_objects(&self.kernels[0]);
        let (reach, source) = reach_exact_or_scanned(&patches, &objects, tree);
        if !patches.is_empty() {
            notes.push(KabNote::ReachRead {
                reach: reach.clone(),
                source,
            });
        }
        if !reach.functions.is_empty() {
            notes.push(KabNote::CallsCounted {
                functions: reach.functions.iter().map(|f| f.name.clone()).collect(),
            });
        }
        notes.extend(
            reach
                .skipped
                .iter()
                .map(|s| KabNote::NotCounted { what: s.clone() }),
        );
        (reach, notes)
    }

    /// The model's strategy for each side: from its release and patches, and for B the
    /// strategy `declared` for a change the model does not recognise.
    fn model_strategies(&self, declared: Option<&str>) -> [Result<StrategyChoice, String>; 2] {
        [
            patch::strategy_for(
                &self.kernels[0].release,
                &patch_ids(self.builds[0].as_ref()),
                None,
            ),
            patch::strategy_for(
                &self.kernels[1].release,
                &patch_ids(self.builds[1].as_ref()),
                lifecycle_declared(declared),
            ),
        ]
    }

    /// The memory model's prefetch for each side: from its patches' hunks, and for B the
    /// strategy `declared` when it names one of the memory model's.
    fn prefetch_strategies(
        &self,
        declared: Option<&str>,
    ) -> [Result<memory_patch::PrefetchChoice, memory_patch::NoPrediction>; 2] {
        let declared = declared.filter(|d| memory_patch::Prefetch::named(d).is_some());
        [0, 1].map(|i| {
            let files = self.builds[i]
                .as_ref()
                .map_or(&[][..], |b| b.patches.as_slice())
                .iter()
                .map(|p| {
                    PatchFile::read(&p.path).map_err(|e| memory_patch::NoPrediction::Unreadable {
                        patch: p.file.clone(),
                        why: e.to_string(),
                    })
                })
                .collect::<Result<Vec<PatchFile>, _>>()?;
            memory_patch::strategy_for(&files, if i == 1 { declared } else { None })
        })
    }
}

/// The base's profile as the calibration cache keeps it, if any (an unreadable cache is said
/// and treated as none).
fn cached_calibration(
    base: &Identity,
    progress: &dyn KabProgress,
) -> Option<(PathBuf, crate::model::profile::Profile)> {
    match calibration::load(base) {
        Ok(found) => found,
        Err(e) => {
            progress.note(&format!("the cached calibration of A cannot be read: {e}"));
            None
        }
    }
}

/// What every boot of a kab shares.
struct BootPlan<'a> {
    kernels: &'a KabKernels,
    /// The hvlab commands each guest runs.
    commands: &'a [Vec<String>],
    /// What each side's runs remember of the kab.
    tags: &'a [KabSide; 2],
    /// Calibrate the base in the first boot (A's).
    calibrate_now: bool,
    base: &'a Identity,
}

/// What the boots brought back: each side's runs, the boots' summaries, and the base's
/// calibration when a boot made one and it was kept.
struct Booted {
    sides: [Vec<RunRecord>; 2],
    summaries: Vec<BootSummary>,
    calibrated: Option<(PathBuf, crate::model::profile::Profile)>,
}

impl BootPlan<'_> {
    /// Boots the kernels in ABBA order over `req.boots`, storing each boot's runs as they
    /// come back; a boot that failed ends the kab after its runs are stored.
    fn boot_abba(
        &self,
        req: &KabRequest,
        store: &mut Store,
        progress: &dyn KabProgress,
    ) -> Result<Booted, Error> {
        let mut booted = Booted {
            sides: [Vec::new(), Vec::new()],
            summaries: Vec::new(),
            calibrated: None,
        };
        self.boot_in(&abba(req.boots), req, store, progress, &mut booted)?;
        Ok(booted)
    }

    /// Boots the sides in `order` (0 A, 1 B) after what `booted` holds, adding to it.
    fn boot_in(
        &self,
        order: &[usize],
        req: &KabRequest,
        store: &mut Store,
        progress: &dyn KabProgress,
        booted: &mut Booted,
    ) -> Result<(), Error> {
        let first = booted.summaries.len();
        let total = first + order.len();
        let at_once = vm::boots_at_once(self.kernels.choice.clock, &req.vm);
        let mut next = first;
        for group in order.chunks(at_once) {
            let commands: Vec<Vec<Vec<String>>> = (next..next + group.len())
                .map(|i| {
                    let mut these = self.commands.to_vec();
                    if self.calibrate_now && i == 0 {
                        // --force: an emulated host's own readings call it busy, and its costs
                        // are the emulator's anyway (the model then predicts jiffies and
                        // counts, not times).
                        these.push(vec!["calibrate".into(), "--force".into()]);
                    }
                    these
                })
                .collect();
            let jobs: Vec<vm::BootJob<'_>> = group
                .iter()
                .zip(&commands)
                .map(|(&side, these)| {
                    let k = &self.kernels.kernels[side];
                    vm::BootJob {
                        kernel: k,
                        commands: these,
                        workdir: logs_dir(&k.release),
                    }
                })
                .collect();
            let names: Vec<&str> = group.iter().map(|&side| ["A", "B"][side]).collect();
            let (results, noise) =
                boot_group(&jobs, &req.vm, at_once, progress, (next + 1, total), &names);
            for (&side, result) in group.iter().zip(results) {
                next += 1;
                let (boot, failure) = result?;
                self.keep_boot(side, boot, &noise, store, progress, booted)?;
                if let Some(f) = failure {
                    return Err(f.into());
                }
            }
        }
        Ok(())
    }

    /// Stores one boot's runs, keeps the calibration it brought back, and adds it to `booted`.
    fn keep_boot(
        &self,
        side: usize,
        mut boot: vm::Boot,
        noise: &hvlab_core::noise::Noise,
        store: &mut Store,
        progress: &dyn KabProgress,
        booted: &mut Booted,
    ) -> Result<(), Error> {
        let name = ["A", "B"][side];
        for r in &mut boot.runs {
            if let Some(u) = r.host.under_test.as_mut() {
                u.kab = Some(self.tags[side].clone());
            }
        }
        let busy = busy_during_boot(noise, boot.accel.clock);
        if let Some(toml) = boot.calibrated.take() {
            match &busy {
                // Its costs would be a starved emulator's, priced into every prediction
                // made with this kernel's cached calibration.
                Some(why) => progress.note(&format!(
                    "calibration of A not kept: the host was busy during the boot ({}); the next kab calibrates again",
                    crate::analysis::words::busy_words(why)
                )),
                None => booted.calibrated = self.keep_calibration(&toml, progress),
            }
        }
        let tally = vm::store_runs(store, &boot.runs)?;
        let mut summary = BootSummary::of(name, &boot, tally.stored, store.location().to_string());
        summary.host_busy = busy;
        progress.boot_end(&summary);
        booted.summaries.push(summary);
        booted.sides[side].extend(boot.runs);
        Ok(())
    }

    /// Keeps the calibration a boot brought back as the base's (only the first boot
    /// calibrates, and it is A's: ABBA), saying where, or why not.
    fn keep_calibration(
        &self,
        toml: &str,
        progress: &dyn KabProgress,
    ) -> Option<(PathBuf, crate::model::profile::Profile)> {
        match calibration::save(self.base, toml) {
            Ok((path, profile)) => {
                progress.note(&format!(
                    "calibrated A in its guest: {} (kept for this kernel under {})",
                    path.display(),
                    self.kernels.choice.accel
                ));
                Some((path, profile))
            }
            Err(e) => {
                progress.note(&format!("calibration of A not kept: {e}"));
                None
            }
        }
    }
}

impl BootSummary {
    /// Side `side`'s `boot`, of whose runs `stored` were new to `store`.
    pub(crate) fn of(side: &str, boot: &vm::Boot, stored: usize, store: String) -> BootSummary {
        BootSummary {
            side: side.to_string(),
            release: boot.release.clone(),
            to_first_command_s: boot.to_first_command_s,
            wall_s: boot.wall_s,
            console: boot.console.clone(),
            runs: boot.runs.len(),
            stored,
            store,
            failures: boot
                .commands
                .iter()
                .filter(|c| c.rc != Some(0))
                .map(|c| GuestFailure {
                    args: c.args.clone(),
                    rc: c.rc,
                    stderr: c.stderr.clone(),
                })
                .collect(),
            host_busy: None,
        }
    }
}

impl KabOutcome {
    /// The outcome of a kab whose `kernels` booted as `boots` said, judged as `judged`, with
    /// the model's `prediction` when it ran lifecycle.
    fn new(
        req: &KabRequest,
        kernels: KabKernels,
        boots: Vec<BootSummary>,
        judged: Vec<ScenarioAb>,
        host: hvlab_core::host::HostInfo,
        prediction: Option<KabPrediction>,
        wall: WallTimes,
    ) -> KabOutcome {
        let Judgement {
            verdicts,
            regression,
            inconclusive,
        } = judgement(&judged, &boots);
        let mut verdicts = verdicts;
        mark_given(&mut verdicts, &req.vm.kvm_params);
        let [a, b] = kernels.kernels;
        KabOutcome {
            hvlab_version: format!("{} ({})", host.hvlab_version, host.git_rev),
            a,
            b,
            builds: kernels.builds,
            build_steps: kernels.build_steps,
            notes: kernels.notes,
            accel: kernels.choice,
            host: HostSummary {
                kernel: host.kernel,
                cpu: host.cpu,
                cores: host.cores,
                hypervisor: host.hypervisor,
            },
            scenario_names: req.scenario_names(),
            boots_per_side: req.boots,
            reps: req.reps,
            boots,
            scenarios: judged,
            verdicts,
            regression,
            inconclusive,
            wall_s: wall.total_s,
            wall,
            prediction,
            memory_prediction: None,
        }
    }
}

/// A side's patches by file name and sha256.
fn patch_ids(build: Option<&BuildInfo>) -> Vec<(String, String)> {
    build.map_or_else(Vec::new, |b| {
        b.patches
            .iter()
            .map(|p| (p.file.clone(), p.sha256.clone()))
            .collect()
    })
}

/// What each side's runs remember of this kab: its id, the side, the patches, and B's
/// declared strategy.
fn kab_tags(builds: &[Option<BuildInfo>; 2], declared: Option<&str>) -> [KabSide; 2] {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let id = format!(
        "kab-{}-{:08x}",
        crate::scenario::runner::now_rfc3339(),
        nanos ^ std::process::id()
    );
    let side = |i: usize| KabSide {
        id: id.clone(),
        side: ["A", "B"][i].to_string(),
        patches: patch_ids(builds[i].as_ref())
            .into_iter()
            .map(|(file, sha256)| PatchId { file, sha256 })
            .collect(),
        model_strategy: (i == 1).then(|| declared.map(str::to_string)).flatten(),
        memory_strategy: None,
    };
    [side(0), side(1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boots_alternate_abba() {
        assert_eq!(abba(2), vec![0, 1, 1, 0]);
        assert_eq!(abba(1), vec![0, 1]);
        assert_eq!(abba(3), vec![0, 1, 1, 0, 0, 1]);
    }

    /// Only `hvlab run` commands are asked to count, each with every patched function and its
    /// callers; with no function, the commands are left as they were.
    #[test]
    fn guest_runs_are_asked_to_count_the_patched_functions() {
        let commands = vec![
            ["run", "memory", "--reps", "2"]
                .map(str::to_string)
                .to_vec(),
            ["calibrate"].map(str::to_string).to_vec(),
        ];
        let reach = Reach {
            functions: vec![
                PatchedFunction {
                    file: "arch/x86/kvm/mmu/mmu.c".into(),
                    name: "__direct_pte_prefetch".into(),
                    module: Some("kvm".into()),
                    callers: vec!["direct_pte_prefetch".into()],
                },
                PatchedFunction {
                    file: "kernel/rcu/srcutree.c".into(),
                    name: "call_srcu".into(),
                    module: None,
                    callers: vec![],
                },
            ],
            skipped: vec![],
        };
        let asked = with_count_calls(commands.clone(), &reach);
        assert_eq!(
            asked[0][4..],
            [
                "--count-calls".to_string(),
                "kvm:__direct_pte_prefetch/direct_pte_prefetch,call_srcu".to_string()
            ]
        );
        assert_eq!(asked[1], commands[1]);
        assert_eq!(
            with_count_calls(commands.clone(), &Reach::default()),
            commands
        );
    }
}
