//! The `exits` model: VM-exit roundtrips and PMU MSR switching, and the PEBS race explorer.
//!
//! Mirrors arch/x86/events/intel/core.c `intel_guest_get_msrs()`, which builds the list of PMU
//! MSRs that `atomic_switch_perf_msrs()` (arch/x86/kvm/vmx/vmx.c) puts in the VMX MSR-load
//! lists: `PERF_GLOBAL_CTRL`, and for PEBS `PEBS_ENABLE`, `DS_AREA`, `PEBS_DATA_CFG`, each
//! written at VM-entry (guest value) and VM-exit (host value). On CPUs with PEBS isolation
//! (PEBS stops once `PERF_GLOBAL_CTRL` clears the counter) the new scheme drops `PEBS_ENABLE`
//! from the lists, switches `DS_AREA`/`PEBS_DATA_CFG` only when the guest uses PEBS, and
//! handles `PERF_GLOBAL_CTRL` through the VMCS entry/exit controls.

use stateright::{Checker, Model, Property};

use crate::backend::exits::{PmuConfig, RaceReport};

/// MSR writes per exit+entry roundtrip for a configuration.
pub fn msr_writes(cfg: PmuConfig, pebs_isolation: bool) -> u32 {
    if !cfg.guest_vpmu {
        return 0;
    }
    let pebs_involved = cfg.host_pebs || cfg.guest_pebs;
    if cfg.new_scheme && pebs_isolation {
        // PERF_GLOBAL_CTRL via the VMCS (one load at exit), DS_AREA and PEBS_DATA_CFG both
        // ways only when the guest uses PEBS.
        1 + if cfg.guest_pebs { 4 } else { 0 }
    } else if pebs_involved {
        // GLOBAL_CTRL, PEBS_ENABLE, DS_AREA, PEBS_DATA_CFG, at entry and exit.
        8
    } else {
        2
    }
}

/// Where KVM is in one entry/exit cycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Before `intel_guest_get_msrs()`.
    Host,
    /// The MSR list is built; not yet entered.
    ListBuilt,
    /// In the guest.
    Guest,
    /// Back in the host after VM-exit loaded the list's host values.
    Exited,
}

/// The state the explorer walks.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RaceState {
    /// KVM's progress.
    pub phase: Phase,
    /// The host `PEBS_ENABLE` value captured in the MSR list (old scheme).
    pub list_host_pebs: bool,
    /// The hardware `PEBS_ENABLE` enable bit.
    pub hw_pebs: bool,
    /// What perf wants (false once the NMI handler throttled the event).
    pub perf_wants: bool,
    /// Whether the throttling NMI has happened.
    pub nmi_done: bool,
}

/// The four events whose interleavings matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RaceAction {
    /// `intel_guest_get_msrs()` builds the list, capturing the host value.
    BuildList,
    /// The perf NMI handler throttles the PEBS event, clearing its enable bit.
    NmiThrottle,
    /// VM-entry loads the guest values.
    VmEntry,
    /// VM-exit loads the host values from the list.
    VmExit,
}

/// The explorer's model: one host PEBS event, one guest entry/exit cycle, one NMI that may
/// throttle the event at any point while the host runs.
#[derive(Debug, Clone, Copy)]
pub struct PebsRace {
    /// The new scheme (PEBS_ENABLE not in the lists).
    pub new_scheme: bool,
}

impl Model for PebsRace {
    type State = RaceState;
    type Action = RaceAction;

    fn init_states(&self) -> Vec<RaceState> {
        vec![RaceState {
            phase: Phase::Host,
            list_host_pebs: false,
            hw_pebs: true,
            perf_wants: true,
            nmi_done: false,
        }]
    }

    fn actions(&self, s: &RaceState, actions: &mut Vec<RaceAction>) {
        match s.phase {
            Phase::Host => actions.push(RaceAction::BuildList),
            Phase::ListBuilt => actions.push(RaceAction::VmEntry),
            Phase::Guest => actions.push(RaceAction::VmExit),
            Phase::Exited => {}
        }
        // An NMI in the guest forces an exit first; it is handled in host context.
        if !s.nmi_done && s.phase != Phase::Guest {
            actions.push(RaceAction::NmiThrottle);
        }
    }

    fn next_state(&self, s: &RaceState, a: RaceAction) -> Option<RaceState> {
        let mut n = s.clone();
        match a {
            RaceAction::BuildList => {
                n.list_host_pebs = s.perf_wants;
                n.phase = Phase::ListBuilt;
            }
            RaceAction::NmiThrottle => {
                n.perf_wants = false;
                n.hw_pebs = false;
                n.nmi_done = true;
            }
            RaceAction::VmEntry => {
                if !self.new_scheme {
                    n.hw_pebs = false; // the guest's PEBS_ENABLE (the guest uses none here)
                }
                n.phase = Phase::Guest;
            }
            RaceAction::VmExit => {
                if !self.new_scheme {
                    n.hw_pebs = s.list_host_pebs; // restored from the list built earlier
                }
                n.phase = Phase::Exited;
            }
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![Property::always(
            "no stale PEBS_ENABLE bit",
            |_: &PebsRace, s: &RaceState| !(s.phase == Phase::Exited && s.hw_pebs && !s.perf_wants),
        )]
    }
}

/// Explores every interleaving; returns the shortest counterexample (old scheme) or the
/// proof of absence, with the number of states explored.
pub fn explore(new_scheme: bool) -> RaceReport {
    let checker = PebsRace { new_scheme }.checker().spawn_bfs().join();
    let states = checker.unique_state_count();
    let interleaving: Vec<String> = checker
        .discovery("no stale PEBS_ENABLE bit")
        .map(|path| {
            path.into_actions()
                .iter()
                .map(|a| format!("{a:?}"))
                .collect()
        })
        .unwrap_or_default();
    RaceReport {
        scheme: if new_scheme { "new" } else { "old" }.into(),
        stale_bit: !interleaving.is_empty(),
        interleaving,
        states,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_old_scheme_has_the_race_and_the_new_one_does_not() {
        let old = explore(false);
        assert!(old.stale_bit, "{old:?}");
        assert_eq!(
            old.interleaving.join(" → "),
            "BuildList → NmiThrottle → VmEntry → VmExit"
        );
        let new = explore(true);
        assert!(!new.stale_bit, "{new:?}");
        assert!(new.interleaving.is_empty() && new.states > 1, "{new:?}");
    }

    #[test]
    fn isolation_saves_seven_writes_without_guest_pebs_and_three_with() {
        let cfg = |guest_pebs, new_scheme| PmuConfig {
            guest_vpmu: true,
            guest_pebs,
            host_pebs: true,
            new_scheme,
        };
        assert_eq!(
            msr_writes(cfg(false, false), true) - msr_writes(cfg(false, true), true),
            7
        );
        assert_eq!(
            msr_writes(cfg(true, false), true) - msr_writes(cfg(true, true), true),
            3
        );
        // Without isolation the new scheme cannot drop anything.
        assert_eq!(msr_writes(cfg(false, true), false), 8);
        let none = PmuConfig {
            guest_vpmu: false,
            ..cfg(false, false)
        };
        assert_eq!(msr_writes(none, true), 0);
    }
}
