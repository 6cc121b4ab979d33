//! What a kab, a per-patch table and a bisection ask for, typed once where the command line
//! reads it: both kernels as [`PatchedSpec`]s, and each scenario the guests run with its
//! `--set` parameters read by the scenario's own declarations, on the host, before anything is
//! fetched, built or booted. A value the guest would refuse is refused here (exit 2), never
//! after two builds and four boots as a NOT DECIDED.

use crate::error::InputError;
use crate::kernel::build::PatchedSpec;
use crate::kernel::sandbox::SandboxPolicy;
use crate::kernel::vm::VmConfig;
use crate::scenario::params::parse_set;
use crate::scenario::{Kind, Params};
use hvlab_core::BackendKind;

/// What `hvlab kab` compares, and how.
#[derive(Debug, Clone)]
pub struct KabRequest {
    /// A: a kernel and its patches.
    pub base: PatchedSpec,
    /// B (a series for `--per-patch`, BAD for a bisection).
    pub patched: PatchedSpec,
    /// The scenarios each guest runs, with their parameters (default `lifecycle`).
    pub scenarios: Vec<GuestScenario>,
    /// Variants to run, each of at least one scenario (all when empty).
    pub variants: Vec<String>,
    /// Boots per kernel.
    pub boots: u32,
    /// Repetitions per variant per boot.
    pub reps: u32,
    /// Smallest change that counts for judged jiffies and times (0.05 = 5%).
    pub threshold: f64,
    /// How each VM boots.
    pub vm: VmConfig,
    /// The model's strategy for B's change (`always-defer`, `always-sync`, `lifecycle-keyed`),
    /// when the patch is not one the model recognises by its hash.
    pub model_strategy: Option<String>,
    /// Calibrate the base in its first boot when no profile of it is cached, so the model
    /// can predict the change on this host (about 10 s under TCG, once per kernel).
    pub calibrate: bool,
    /// Whether kernel builds must run sandboxed (`--no-sandbox` turns it off).
    pub sandbox: SandboxPolicy,
    /// `--config FILE`: the .config whose HZ, preemption, RCU and KVM options a git side's
    /// minimal guest config keeps (else Debian's config of the nearest version cached).
    pub config: Option<std::path::PathBuf>,
}

impl KabRequest {
    /// The scenarios' names, in the order asked.
    pub fn scenario_names(&self) -> Vec<String> {
        self.scenarios
            .iter()
            .map(|s| s.kind.name().to_string())
            .collect()
    }

    /// Whether the guests run `kind`.
    pub fn runs(&self, kind: Kind) -> bool {
        self.scenarios.iter().any(|s| s.kind == kind)
    }
}

/// One scenario a kab's guests run, typed on the host.
#[derive(Debug, Clone)]
pub struct GuestScenario {
    /// The scenario.
    pub kind: Kind,
    /// Its parameters on the guest's kvm backend: its defaults with the `--set`s it declares
    /// read over them.
    pub params: Params,
    /// Those `--set`s as given, for the guest's own command line (which reads them as the host
    /// did).
    pub sets: Vec<String>,
}

/// The `--set`s a kab's guests get on the instruction clock where the command line gives no
/// value of that key. The exits batch is sized for the wall clock's noise; on the instruction
/// clock one of 2,000 reads each exit type within 0.4% of one of 10,000 (a fixed cost per
/// batch, spread over fewer exits), with a spread between repetitions (±2–18 instructions) under
/// the judge's 50-instruction floor. Debian 7.3 under TCG, an extra MSR write per entry: +28 to
/// +30 instructions per exit either way, the kab in 50.8 s instead of 2 min 17 s.
const INSTRUCTION_CLOCK_SETS: &[(Kind, &str, &str)] = &[(Kind::Exits, "iterations", "2000")];

/// `sets` with the instruction clock's own defaults ([`INSTRUCTION_CLOCK_SETS`]) for the
/// scenarios `names` asks, each where `sets` gives no value of its key.
pub fn with_instruction_clock_sets(names: &[String], sets: &[String]) -> Vec<String> {
    let mut all = sets.to_vec();
    for (kind, key, value) in INSTRUCTION_CLOCK_SETS {
        let asked = names.iter().any(|n| n == kind.name());
        let given = sets
            .iter()
            .any(|kv| parse_set(kv).is_ok_and(|(k, _)| k == *key));
        if asked && !given {
            all.push(format!("{key}={value}"));
        }
    }
    all
}

/// `--scenario`, `--variant` and `--set` read once for the guests' kvm backend: each scenario
/// by name (`lifecycle` when none is given), each `--set` by the scenarios that declare its
/// key (a key none declares, or a value one of them refuses, is bad input naming the parameter
/// and what it takes), each `--variant` a variant of at least one scenario.
pub fn guest_scenarios(
    names: &[String],
    variants: &[String],
    sets: &[String],
) -> Result<Vec<GuestScenario>, InputError> {
    let default = [Kind::Lifecycle.name().to_string()];
    let names = if names.is_empty() {
        &default[..]
    } else {
        names
    };
    let kinds = names
        .iter()
        .map(|n| Kind::named(n))
        .collect::<Result<Vec<Kind>, _>>()?;
    let unknown = |key: &str, value: &str, what: &str| InputError::BadValue {
        key: key.into(),
        value: value.to_string(),
        why: format!(
            "no scenario of {} has that {what}; `hvlab list` shows them",
            names.join(", ")
        ),
    };
    let declares = |kind: Kind, key: &str| kind.param_infos().iter().any(|p| p.name == key);
    let model_only = |kind: Kind, key: &str| {
        kind.param_infos()
            .iter()
            .any(|p| p.name == key && p.model_only)
    };
    let mut keyed: Vec<(String, &String)> = Vec::new();
    for kv in sets {
        let (key, value) = parse_set(kv)?;
        if !kinds.iter().any(|&k| declares(k, &key)) {
            return Err(unknown("--set", kv, "parameter"));
        }
        if kinds.iter().any(|&k| model_only(k, &key)) {
            return Err(InputError::BadValue {
                why: format!(
                    "{key} is a model parameter; a kab's guests run the kvm backend on the kernels under test, whose own code decides it (--model-strategy tells the model what B's change does)"
                ),
                key,
                value,
            });
        }
        keyed.push((key, kv));
    }
    if let Some(v) = variants.iter().find(|v| {
        !kinds
            .iter()
            .any(|k| k.info().variants.iter().any(|x| x.name == *v))
    }) {
        return Err(unknown("--variant", v, "variant"));
    }
    kinds
        .into_iter()
        .map(|kind| {
            let sets: Vec<String> = keyed
                .iter()
                .filter(|(key, _)| declares(kind, key))
                .map(|(_, kv)| (*kv).clone())
                .collect();
            Ok(GuestScenario {
                kind,
                params: kind.parse(&sets, BackendKind::Kvm.capabilities())?,
                sets,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(ToString::to_string).collect()
    }

    /// The instruction clock's smaller exits batch: added for exits alone, and never over a
    /// value the command line gives.
    #[test]
    fn the_instruction_clock_sizes_the_exits_batch_unless_told() {
        assert_eq!(
            with_instruction_clock_sets(&strings(&["lifecycle", "exits"]), &[]),
            strings(&["iterations=2000"])
        );
        assert_eq!(
            with_instruction_clock_sets(&strings(&["exits"]), &strings(&["iterations=500"])),
            strings(&["iterations=500"])
        );
        assert!(with_instruction_clock_sets(&strings(&["lifecycle"]), &[]).is_empty());
        let g = guest_scenarios(
            &strings(&["exits"]),
            &[],
            &with_instruction_clock_sets(&strings(&["exits"]), &[]),
        )
        .unwrap();
        assert_eq!(g[0].sets, strings(&["iterations=2000"]));
    }

    /// Each `--set` goes to the scenarios that declare it, typed; none is lost.
    #[test]
    fn each_set_goes_to_the_scenarios_that_declare_its_key() {
        let g = guest_scenarios(
            &strings(&["memory", "lifecycle"]),
            &[],
            &strings(&["size=16MiB", "devices=4", "guest.cpl=3"]),
        )
        .expect("typed");
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].kind, Kind::Memory);
        assert_eq!(g[0].sets, strings(&["size=16MiB", "guest.cpl=3"]));
        assert_eq!(g[1].sets, strings(&["devices=4"]));
        let recorded = g[0].params.record(BackendKind::Kvm);
        assert_eq!(recorded["size"], serde_json::json!("16MiB"));
        // No scenario named: lifecycle.
        let g = guest_scenarios(&[], &[], &[]).expect("typed");
        assert_eq!(g[0].kind, Kind::Lifecycle);
    }

    /// A value the guest's scenario would refuse is refused on the host, naming the parameter
    /// and the values it takes; so is a key no scenario declares (the guest key of a scenario
    /// that runs no guest code included), a model parameter, and a `--set` without `=`.
    #[test]
    fn a_bad_set_is_refused_on_the_host_naming_the_parameter_and_its_values() {
        let refused = |scenarios: &[&str], set: &str| {
            guest_scenarios(&strings(scenarios), &[], &strings(&[set]))
                .expect_err(set)
                .to_string()
        };
        let e = refused(&["memory"], "size=banana");
        assert!(
            e.contains("`banana` for size") && e.contains("256MiB, 6GiB, 512M, 4096"),
            "{e}"
        );
        let e = refused(&["memory"], "pattern=sideways");
        assert!(e.contains("pattern is seq, reverse, random"), "{e}");
        let e = refused(&["lifecycle"], "devices=300");
        assert!(e.contains("from 0 to 256"), "{e}");
        let e = refused(&["lifecycle"], "guest.cpl=0");
        assert!(
            e.contains("no scenario of lifecycle has that parameter"),
            "{e}"
        );
        let e = refused(&["lifecycle"], "strategy=always-sync");
        assert!(e.contains("model parameter"), "{e}");
        let e = refused(&["lifecycle"], "devices");
        assert!(e.contains("expected key=value"), "{e}");
        let e = guest_scenarios(&strings(&["lifecycle"]), &strings(&["populated"]), &[])
            .expect_err("a memory variant");
        assert!(e.to_string().contains("--variant"), "{e}");
        let e = guest_scenarios(&strings(&["nosuch"]), &[], &[]).expect_err("no scenario");
        assert!(e.to_string().contains("Unknown scenario `nosuch`"), "{e}");
    }
}
