//! A series' boots: the sweep order, the runs the store already holds of each kernel, and
//! booting a chain of kernels.

use std::collections::BTreeMap;

use hvlab_core::BackendKind;

use crate::kernel::vm::Accel;
use crate::lab::Error;
use crate::lab::kab::{self, GuestFailure};
use crate::record::RunRecord;
use crate::store::Store;

/// The boot order of `kernels` kernels in a chain (0 the base, i the i-th commit), each booted
/// `boots_each` times: rounds of 0, 1, …, k−1 then k−1, …, 0, so each adjacent pair sees
/// ABBA (i, i+1, i+1, i) within a round and every boot serves both pairs its kernel is in.
/// With an odd `boots_each` the last round is forward only.
pub fn sweep_order(kernels: usize, boots_each: u32) -> Vec<usize> {
    let mut out = Vec::new();
    for round in 0..boots_each {
        if round % 2 == 0 {
            out.extend(0..kernels);
        } else {
            out.extend((0..kernels).rev());
        }
    }
    out
}

/// [`sweep_order`] without the boots already stored: `stored[i]` boots of kernel `i` are
/// taken off the front of the order, so an interrupted run resumes where it stopped.
pub fn remaining_order(stored: &[u32], boots_each: u32) -> Vec<usize> {
    let mut skip: Vec<u32> = stored.to_vec();
    sweep_order(stored.len(), boots_each)
        .into_iter()
        .filter(|&k| {
            if skip[k] > 0 {
                skip[k] -= 1;
                false
            } else {
                true
            }
        })
        .collect()
}

/// What a stored run must have been made as to stand for a boot a request would make: a
/// shared store holds other commands' boots of the same kernel (kab's lifecycle boots of the
/// base with other variants, another `--set`, fewer reps), which judged together would
/// compare different experiments.
#[derive(Debug, Clone, Copy)]
pub struct RunsAsked<'a> {
    /// Scenarios, with their parameters as the guests run them.
    pub scenarios: &'a [kab::GuestScenario],
    /// Variants asked for (all the scenario's when empty).
    pub variants: &'a [String],
    /// Repetitions per variant per boot.
    pub reps: u32,
    /// The accelerator the runs were made under.
    pub accel: Accel,
}

impl<'a> RunsAsked<'a> {
    /// The runs `req`'s boots make under `accel`.
    pub fn of(req: &'a kab::KabRequest, accel: Accel) -> RunsAsked<'a> {
        RunsAsked {
            scenarios: &req.scenarios,
            variants: &req.variants,
            reps: req.reps,
            accel,
        }
    }

    /// The scenarios' names, in the order asked.
    pub fn names(&self) -> Vec<String> {
        self.scenarios
            .iter()
            .map(|s| s.kind.name().to_string())
            .collect()
    }

    /// Per asked scenario, what its runs must hold: the variants the guest runs and the
    /// parameters it records.
    fn per_scenario(&self) -> Vec<(&'static str, ScenarioRuns)> {
        self.scenarios
            .iter()
            .map(|s| (s.kind.name(), ScenarioRuns::of(s, self)))
            .collect()
    }
}

/// What one scenario's run must hold for a request: its variants (all of them, maybe more)
/// and its parameters as the run records them.
struct ScenarioRuns {
    variants: Vec<String>,
    params: BTreeMap<String, serde_json::Value>,
}

impl ScenarioRuns {
    fn of(scenario: &kab::GuestScenario, asked: &RunsAsked<'_>) -> ScenarioRuns {
        let info = scenario.kind.info();
        // The guest's `hvlab run` gets only the variants its scenario has (see
        // `kab::guest_commands`), and runs every variant when given none of its own.
        let mut variants: Vec<String> = asked
            .variants
            .iter()
            .filter(|v| info.variants.iter().any(|x| x.name == v.as_str()))
            .cloned()
            .collect();
        if variants.is_empty() {
            variants = info.variants.iter().map(|v| v.name.to_string()).collect();
        }
        let mut params = scenario.params.record(BackendKind::Kvm);
        params.insert("reps".into(), asked.reps.into());
        ScenarioRuns { variants, params }
    }

    /// `run` restricted to the variants asked, when it holds all of them and was made with
    /// these parameters and reps; `None` when it was another experiment.
    fn restrict(&self, mut run: RunRecord) -> Option<RunRecord> {
        let same_params = self
            .params
            .iter()
            .all(|(k, v)| run.params.get(k) == Some(v));
        let has_all = self
            .variants
            .iter()
            .all(|v| run.variants.iter().any(|r| &r.name == v));
        if !same_params || !has_all {
            return None;
        }
        let asked = |name: &str| self.variants.iter().any(|v| v == name);
        run.variants.retain(|v| asked(&v.name));
        run.calls.retain(|c| asked(&c.variant));
        run.verdicts
            .retain(|v| asked(&v.faster) && asked(&v.slower));
        Some(run)
    }
}

/// The runs of the kernel built from `spec` that the store holds as `asked` would make them.
pub fn stored_runs(
    store: &Store,
    spec: &str,
    asked: &RunsAsked<'_>,
) -> Result<Vec<RunRecord>, Error> {
    let all = crate::store::transfer::select(store, &[])?;
    Ok(of_kernel(all, spec, asked))
}

/// Of `runs`, those made on the kernel of `spec` as `asked` would make them, restricted to
/// the variants asked (a run of more variants serves; one of fewer, another `--set`, other
/// reps or another accelerator does not).
pub fn of_kernel(runs: Vec<RunRecord>, spec: &str, asked: &RunsAsked<'_>) -> Vec<RunRecord> {
    let accel = asked.accel.to_string();
    let wanted = asked.per_scenario();
    runs.into_iter()
        .filter(|r| {
            r.host
                .under_test
                .as_ref()
                .is_some_and(|u| u.spec == spec && u.accel == accel)
        })
        .filter_map(|r| {
            let (_, want) = wanted.iter().find(|(name, _)| *name == r.scenario)?;
            want.restrict(r)
        })
        .collect()
}

/// How many boots `runs` hold: the fewest runs of any of `scenarios` (each boot runs each once).
pub fn boots_in(runs: &[RunRecord], scenarios: &[String]) -> u32 {
    scenarios
        .iter()
        .map(|s| runs.iter().filter(|r| &r.scenario == s).count())
        .min()
        .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX))
}

/// What one kernel of the series brought back.
#[derive(Debug, Clone, Default)]
pub struct KernelRuns {
    /// Its runs.
    pub runs: Vec<RunRecord>,
    /// Guest commands that failed on it.
    pub failed_commands: Vec<GuestFailure>,
    /// Its boots the host was busy during (none when it was quiet during all).
    pub host_busy: Vec<kab::BusyBoot>,
}

/// The boots a chain made (with the label of the kernel each booted), and the boots per
/// kernel label found stored and not made again.
type ChainBoots = (Vec<(String, kab::BootSummary)>, Vec<(String, u32)>);

/// Boots `chain` (indices into `kernels`) in [`remaining_order`] until each has `boots`
/// boots stored, storing every run as it comes back; returns the boots made and those reused.
#[allow(clippy::too_many_arguments)] // one boot loop for the whole series, each shard unit, each bisect step
pub(crate) fn boot_chain(
    chain: &[usize],
    kernels: &[(String, crate::kernel::Kernel)],
    req: &kab::KabRequest,
    commands: &[Vec<String>],
    accel: Accel,
    store: &mut Store,
    progress: &dyn kab::KabProgress,
    busy: &mut [Vec<kab::BusyBoot>],
    failed: &mut [Vec<GuestFailure>],
) -> Result<ChainBoots, Error> {
    let asked = RunsAsked::of(req, accel);
    let stored: Vec<u32> = chain
        .iter()
        .map(|&k| {
            stored_runs(store, &kernels[k].1.spec, &asked)
                .map(|r| boots_in(&r, &req.scenario_names()).min(req.boots))
        })
        .collect::<Result<_, _>>()?;
    let reused: Vec<(String, u32)> = chain
        .iter()
        .zip(&stored)
        .filter(|(_, n)| **n > 0)
        .map(|(&k, &n)| (kernels[k].0.clone(), n))
        .collect();
    let order = remaining_order(&stored, req.boots);
    let mut made = Vec::new();
    let at_once = crate::kernel::vm::boots_at_once(
        crate::kernel::vm::clock_under(accel, req.vm.clock),
        &req.vm,
    );
    let mut n = 0;
    for group in order.chunks(at_once) {
        let jobs: Vec<crate::kernel::vm::BootJob<'_>> = group
            .iter()
            .map(|&pos| {
                let kernel = &kernels[chain[pos]].1;
                crate::kernel::vm::BootJob {
                    kernel,
                    commands,
                    workdir: kab::logs_dir(&kernel.release),
                }
            })
            .collect();
        let labels: Vec<&str> = group
            .iter()
            .map(|&pos| kernels[chain[pos]].0.as_str())
            .collect();
        let (results, noise) = kab::boot_group(
            &jobs,
            &req.vm,
            at_once,
            progress,
            (n + 1, order.len()),
            &labels,
        );
        for (&pos, result) in group.iter().zip(results) {
            n += 1;
            let k = chain[pos];
            let label = &kernels[k].0;
            let (boot, failure) = result?;
            let tally = crate::kernel::vm::store_runs(store, &boot.runs)?;
            let mut summary =
                kab::BootSummary::of(label, &boot, tally.stored, store.location().to_string());
            summary.host_busy = kab::busy_during_boot(&noise, boot.accel.clock);
            if let Some(reasons) = &summary.host_busy {
                busy[k].push(kab::BusyBoot {
                    boot: n,
                    side: label.clone(),
                    reasons: reasons.clone(),
                });
            }
            failed[k].extend(summary.failures.iter().cloned());
            progress.boot_end(&summary);
            made.push((label.clone(), summary));
            if let Some(f) = failure {
                return Err(f.into());
            }
        }
    }
    Ok((made, reused))
}
