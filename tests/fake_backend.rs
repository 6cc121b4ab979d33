//! Scenario logic (plans, analysis, findings, verdicts, failure statuses, what a backend's
//! capabilities let it run, typed parameters and notices) on a scripted backend:
//! no `/dev/kvm` and no model, so what is checked is the scenario's own reasoning over numbers
//! the test chose.

use std::collections::BTreeMap;

use hvlab::backend::dirty::{DirtyPlan, DirtyResult};
use hvlab::backend::error::{BackendError, KvmError};
use hvlab::backend::exits::{ExitPlan, ExitResult};
use hvlab::backend::host::{HostInfo, probe_with};
use hvlab::backend::lifecycle::{ConstructionPlan, ConstructionTrace};
use hvlab::backend::memory::{TouchPlan, TouchResult};
use hvlab::backend::memslots::{MemslotPlan, MemslotResult, SlotOp};
use hvlab::backend::pinning::{PinPlan, PinResult};
use hvlab::backend::{Backend, BackendKind, Capabilities};
use hvlab::record::{Finding, RunRecord, SelfCheck, VariantStatus};
use hvlab::scenario::runner::{RunRequest, Silent};

/// A backend that answers exit batches from a script: a cost per exit kind, the userspace
/// exits and `kvm.vcpu.exits` it reports per roundtrip, and kinds it refuses.
struct FakeBackend {
    host: HostInfo,
    /// ns per roundtrip by kind.
    cost_ns: BTreeMap<&'static str, u64>,
    /// Kinds whose userspace exits it reports as 0 although they exit to userspace.
    drops_userspace: Vec<&'static str>,
    /// Kinds for which `kvm.vcpu.exits` counts two exits per roundtrip.
    double_counts: Vec<&'static str>,
    /// Kinds it refuses as the host's limitation (a missing KVM capability).
    missing_cap: Vec<&'static str>,
    /// Kinds it refuses as a backend that cannot run the plan.
    unsupported: Vec<&'static str>,
    /// Batches answered, for a small deterministic jitter.
    calls: u64,
}

impl FakeBackend {
    fn new() -> FakeBackend {
        FakeBackend {
            host: probe_with("not asked: a fake backend".into(), BTreeMap::new()),
            cost_ns: [
                ("pio-out", 6_000),
                ("pio-in", 6_100),
                ("mmio-write", 7_000),
                ("mmio-read", 7_200),
                ("cpuid", 1_000),
                ("hypercall", 1_200),
                ("hlt", 9_000),
                ("ioeventfd", 2_500),
            ]
            .into_iter()
            .collect(),
            drops_userspace: Vec::new(),
            double_counts: Vec::new(),
            missing_cap: Vec::new(),
            unsupported: Vec::new(),
            calls: 0,
        }
    }
}

fn not_scripted(what: &str) -> BackendError {
    BackendError::Unsupported(format!("the fake backend scripts exits only, not {what}"))
}

impl Backend for FakeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Kvm
    }

    fn host(&self) -> &HostInfo {
        &self.host
    }

    fn construct_vm(&mut self, _: &ConstructionPlan) -> Result<ConstructionTrace, BackendError> {
        Err(not_scripted("VM construction"))
    }

    fn touch_memory(&mut self, _: &TouchPlan) -> Result<TouchResult, BackendError> {
        Err(not_scripted("memory"))
    }

    fn exit_roundtrips(&mut self, plan: &ExitPlan) -> Result<ExitResult, BackendError> {
        let name = plan.kind.name();
        if self.missing_cap.contains(&name) {
            return Err(KvmError::MissingCap("KVM_CAP_FAKE").into());
        }
        if self.unsupported.contains(&name) {
            return Err(BackendError::Unsupported(format!("{name} is not scripted")));
        }
        self.calls += 1;
        let n = plan.iterations;
        // Up to 4% of jitter, so the sides have spread and the rank test decides.
        let per = self.cost_ns[name] * (100 + self.calls % 5) / 100;
        let userspace = if plan.kind.exits_to_userspace() && !self.drops_userspace.contains(&name) {
            n
        } else {
            0
        };
        let exits = if self.double_counts.contains(&name) {
            2 * n
        } else {
            n
        };
        Ok(ExitResult {
            iterations: n,
            elapsed_ns: per * n,
            tsc_ticks: 3 * per * n,
            userspace_exits: userspace,
            kvm_stats: vec![(
                "kvm.vcpu.exits".into(),
                "cumulative".into(),
                i128::from(exits),
            )],
            pmu: None,
        })
    }

    fn pin_trace(&mut self, _: &PinPlan) -> Result<PinResult, BackendError> {
        Err(not_scripted("pinning"))
    }

    fn dirty_log(
        &mut self,
        _: &hvlab::backend::dirty::DirtyPlan,
    ) -> Result<hvlab::backend::dirty::DirtyResult, BackendError> {
        Err(not_scripted("dirty logging"))
    }

    fn update_memslots(
        &mut self,
        _: &hvlab::backend::memslots::MemslotPlan,
    ) -> Result<hvlab::backend::memslots::MemslotResult, BackendError> {
        Err(not_scripted("memslot updates"))
    }
}

fn run_exits(backend: &mut FakeBackend, variants: &[&str]) -> RunRecord {
    let request = RunRequest {
        variants: variants.iter().map(ToString::to_string).collect(),
        sets: vec!["iterations=1000".into()],
        reps: 8,
        warmup: 0,
        ..RunRequest::default()
    };
    let info = hvlab::scenario::find("exits").expect("exits is registered");
    hvlab::scenario::run(info, backend, &request, &Silent).expect("the exits run completes")
}

fn variant<'a>(r: &'a RunRecord, name: &str) -> &'a hvlab::record::VariantRecord {
    r.variants
        .iter()
        .find(|v| v.name == name)
        .unwrap_or_else(|| panic!("no variant {name} in {:?}", r.variants))
}

#[test]
fn exits_on_a_fake_backend_reports_its_scripted_costs_and_calls_the_cheapest_kind_faster() {
    let mut fake = FakeBackend::new();
    let r = run_exits(&mut fake, &["cpuid", "pio-out", "hlt"]);
    let median = |v: &str| variant(&r, v).metrics["roundtrip_ns"].median;
    // The script's costs come back per roundtrip, within its 4% jitter.
    for (v, ns) in [("cpuid", 1_000.0), ("pio-out", 6_000.0), ("hlt", 9_000.0)] {
        let m = median(v);
        assert!((ns..=ns * 1.04).contains(&m), "{v}: {m} ns, scripted {ns}");
    }
    // Every other variant is judged against the cheapest, and both differences are called.
    assert_eq!(r.verdicts.len(), 2, "{:#?}", r.verdicts);
    for v in &r.verdicts {
        assert_eq!(v.faster, "cpuid", "{v:#?}");
        assert!(v.significant, "{v:#?}");
    }
    let hlt = r
        .verdicts
        .iter()
        .find(|v| v.slower == "hlt")
        .expect("hlt judged");
    assert!((8.0..10.0).contains(&hlt.ratio), "{hlt:#?}");
    // Honest counts raise no self-check.
    assert!(r.variants.iter().all(|v| v.findings.is_empty()), "{r:#?}");
}

#[test]
fn exits_self_checks_flag_a_backend_that_miscounts_userspace_or_kvm_exits() {
    let mut fake = FakeBackend::new();
    fake.drops_userspace = vec!["pio-in"];
    fake.double_counts = vec!["mmio-read"];
    let r = run_exits(&mut fake, &["pio-in", "mmio-read", "cpuid"]);
    let checks = |v: &str| -> Vec<(SelfCheck, f64, f64)> {
        variant(&r, v)
            .findings
            .iter()
            .filter_map(|f| match f {
                Finding::SelfCheck {
                    check,
                    expected,
                    observed,
                    ..
                } => Some((*check, *expected, *observed)),
                _ => None,
            })
            .collect()
    };
    assert_eq!(
        checks("pio-in"),
        vec![(SelfCheck::UserspaceExits, 1.0, 0.0)]
    );
    assert_eq!(
        checks("mmio-read"),
        vec![(SelfCheck::ExitsStatistic, 1.0, 2.0)]
    );
    assert_eq!(checks("cpuid"), vec![]);
}

#[test]
fn a_variant_the_backend_refuses_is_unsupported_and_the_others_still_run() {
    let mut fake = FakeBackend::new();
    fake.missing_cap = vec!["hypercall"];
    fake.unsupported = vec!["hlt"];
    let r = run_exits(&mut fake, &["cpuid", "hypercall", "hlt", "pio-out"]);
    match &variant(&r, "hypercall").status {
        VariantStatus::Unsupported(why) => assert!(why.contains("KVM_CAP_FAKE"), "{why}"),
        other => panic!("a missing capability is the host's limitation: {other:?}"),
    }
    match &variant(&r, "hlt").status {
        VariantStatus::Unsupported(why) => assert_eq!(why, "hlt is not scripted"),
        other => panic!("a plan the backend cannot run is unsupported: {other:?}"),
    }
    assert!(variant(&r, "cpuid").is_ok() && variant(&r, "pio-out").is_ok());
    // Only the variants that ran are judged.
    assert_eq!(r.verdicts.len(), 1, "{:#?}", r.verdicts);
    assert_eq!(
        (r.verdicts[0].faster.as_str(), r.verdicts[0].slower.as_str()),
        ("cpuid", "pio-out")
    );
}

#[test]
fn exits_plans_follow_the_request_and_refuse_a_model_variant_on_a_real_backend() {
    let info = hvlab::scenario::find("exits").expect("exits is registered");
    let mut request = RunRequest {
        variants: vec!["vpmu-old".into()],
        ..RunRequest::default()
    };
    let err = hvlab::scenario::check(info, &request, BackendKind::Kvm).unwrap_err();
    assert!(
        err.to_string().contains("add --backend model"),
        "a model variant on a real backend says how to run it: {err}"
    );
    request.variants = vec!["cpuid".into(), "cpuid".into()];
    let err = hvlab::scenario::check(info, &request, BackendKind::Kvm).unwrap_err();
    assert!(err.to_string().contains("more than once"), "{err}");
}

#[test]
fn a_backend_without_a_percpu_predictor_is_refused_before_the_percpu_scenario_runs() {
    let mut fake = FakeBackend::new();
    // The fake describes itself as a real backend: it has no predictor to hand out.
    assert!(!fake.capabilities().percpu && fake.percpu().is_none());
    let info = hvlab::scenario::find("percpu").expect("percpu is registered");
    let err = hvlab::scenario::run(info, &mut fake, &RunRequest::default(), &Silent).unwrap_err();
    assert_eq!(
        err.to_string(),
        "The kvm backend cannot run scenario percpu yet; it runs on: model."
    );
    assert_eq!(err.exit_code(), 2);
}

/// A backend that updates memslots at a scripted cost per kind, flat or growing with the
/// slots already there, and describes itself with the capabilities the test gives it.
struct FakeSlots {
    host: HostInfo,
    can: Capabilities,
    /// ns per update: (add, move, delete).
    cost_ns: (u64, u64, u64),
    /// Extra ns per slot already present (0: flat).
    per_slot_ns: u64,
}

impl FakeSlots {
    fn new(can: Capabilities) -> FakeSlots {
        FakeSlots {
            host: probe_with("not asked: a fake backend".into(), BTreeMap::new()),
            can,
            cost_ns: (10_000, 20_000, 30_000),
            per_slot_ns: 0,
        }
    }
}

impl Backend for FakeSlots {
    fn kind(&self) -> BackendKind {
        BackendKind::Kvm
    }

    fn capabilities(&self) -> Capabilities {
        self.can
    }

    fn host(&self) -> &HostInfo {
        &self.host
    }

    fn construct_vm(&mut self, _: &ConstructionPlan) -> Result<ConstructionTrace, BackendError> {
        Err(not_scripted("VM construction"))
    }

    fn touch_memory(&mut self, _: &TouchPlan) -> Result<TouchResult, BackendError> {
        Err(not_scripted("memory touches"))
    }

    fn exit_roundtrips(&mut self, plan: &ExitPlan) -> Result<ExitResult, BackendError> {
        // What a modelled PMU variant would cost: enough to show it was planned and run.
        Ok(ExitResult {
            iterations: plan.iterations,
            elapsed_ns: plan.iterations * 1_000,
            tsc_ticks: 0,
            userspace_exits: 0,
            kvm_stats: Vec::new(),
            pmu: None,
        })
    }

    fn pin_trace(&mut self, _: &PinPlan) -> Result<PinResult, BackendError> {
        Err(not_scripted("pinning"))
    }

    fn dirty_log(&mut self, _: &DirtyPlan) -> Result<DirtyResult, BackendError> {
        Err(not_scripted("dirty logging"))
    }

    fn update_memslots(&mut self, plan: &MemslotPlan) -> Result<MemslotResult, BackendError> {
        let base = match plan.op {
            SlotOp::Add => self.cost_ns.0,
            SlotOp::Move => self.cost_ns.1,
            SlotOp::Delete => self.cost_ns.2,
        };
        Ok(MemslotResult {
            op_ns: (0..u64::from(plan.slots))
                .map(|i| base + i * self.per_slot_ns)
                .collect(),
            swaps_per_op: None,
        })
    }
}

fn run_memslots(backend: &mut FakeSlots, sets: &[&str]) -> RunRecord {
    let request = RunRequest {
        sets: sets.iter().map(ToString::to_string).collect(),
        reps: 5,
        warmup: 0,
        ..RunRequest::default()
    };
    let info = hvlab::scenario::find("memslots").expect("memslots is registered");
    hvlab::scenario::run(info, backend, &request, &Silent).expect("the memslots run completes")
}

#[test]
fn memslots_on_a_fake_backend_reports_each_kind_per_update_and_calls_add_the_fastest() {
    let mut fake = FakeSlots::new(BackendKind::Kvm.capabilities());
    let r = run_memslots(&mut fake, &["slots=100"]);
    let median = |v: &str, m: &str| variant(&r, v).metrics[m].median;
    for (v, us) in [("add", 10.0), ("move", 20.0), ("delete", 30.0)] {
        assert!((median(v, "op_us") - us).abs() < 1e-9, "{v}: {r:#?}");
        // A flat cost: the last tenth of the updates costs what the first did.
        assert!((median(v, "growth") - 1.0).abs() < 1e-9, "{v}");
    }
    assert_eq!(r.verdicts.len(), 2, "{:#?}", r.verdicts);
    assert!(
        r.verdicts.iter().all(|v| v.faster == "add"),
        "{:#?}",
        r.verdicts
    );
}

#[test]
fn memslots_growth_shows_a_cost_that_rises_with_the_slots_present() {
    let mut fake = FakeSlots::new(BackendKind::Kvm.capabilities());
    fake.per_slot_ns = 1_000;
    let r = run_memslots(&mut fake, &["slots=100"]);
    // add: 10 µs + 1 µs per slot present; first tenth ~14.5 µs, last tenth ~104.5 µs.
    let growth = variant(&r, "add").metrics["growth"].median;
    assert!((growth - 104.5 / 14.5).abs() < 1e-6, "{growth}");
}

#[test]
fn a_scenario_asks_the_backend_what_it_can_do_not_which_kind_it_is() {
    // A backend stored as `kvm` that describes itself as modelled runs a model-only variant:
    // the plans follow its capabilities.
    let mut can = BackendKind::Kvm.capabilities();
    can.modelled = true;
    let mut fake = FakeSlots::new(can);
    let info = hvlab::scenario::find("exits").expect("exits is registered");
    let request = RunRequest {
        variants: vec!["vpmu-old".into()],
        sets: vec!["iterations=10".into()],
        reps: 2,
        warmup: 0,
        ..RunRequest::default()
    };
    let r = hvlab::scenario::run(info, &mut fake, &request, &Silent).expect("runs");
    assert!(variant(&r, "vpmu-old").is_ok(), "{r:#?}");
    // The same backend describing itself as real is refused the variant, naming the fix.
    let mut fake = FakeSlots::new(BackendKind::Kvm.capabilities());
    let err = hvlab::scenario::run(info, &mut fake, &request, &Silent).unwrap_err();
    assert!(err.to_string().contains("add --backend model"), "{err}");
    // And one that says it predicts per-CPU costs is let into percpu (then finds no
    // predictor to run: each variant is unsupported, not refused up front).
    let mut can = BackendKind::Kvm.capabilities();
    can.percpu = true;
    can.modelled = true;
    let percpu = hvlab::scenario::find("percpu").expect("percpu is registered");
    assert!(percpu.require(BackendKind::Kvm, can).is_ok());
    assert!(
        percpu
            .require(BackendKind::Kvm, BackendKind::Kvm.capabilities())
            .is_err()
    );
}

#[test]
fn the_lab_s_typed_parameters_are_spelled_as_each_scenario_s_parser_reads_them() {
    use hvlab::backend::lifecycle::Strategy;
    use hvlab::scenario::params::{Settings, sets_of};
    use hvlab::scenario::{dirty, exits, lifecycle, percpu, pinning};
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "lifecycle",
            sets_of(&[
                lifecycle::Set::Strategy(Strategy::LifecycleKeyed),
                lifecycle::Set::Vcpus(2),
                lifecycle::Set::Hz(1000),
                lifecycle::Set::BackToBack(false),
            ]),
        ),
        (
            "pinning",
            sets_of(&[
                pinning::Set::BufferMib(256),
                pinning::Set::Slices(71),
                pinning::Set::PerTask(true),
                pinning::Set::RecordsPerMs(0),
            ]),
        ),
        (
            "exits",
            sets_of(&[
                exits::Set::Iterations(1000),
                exits::Set::HostPebs(true),
                exits::Set::HostPebsDataCfg(false),
            ]),
        ),
        (
            "percpu",
            sets_of(&[
                percpu::Set::Cpus(160),
                percpu::Set::Workload("stress-ng-fork"),
            ]),
        ),
        (
            "dirty",
            sets_of(&[
                dirty::Set::SizeMib(64),
                dirty::Set::Passes(3),
                dirty::Set::Stride(4096),
                dirty::Set::Ring(65536),
                dirty::Set::Chunk(262_144),
            ]),
        ),
    ];
    for (name, sets) in cases {
        let info = hvlab::scenario::find(name).expect("registered");
        let request = RunRequest {
            sets: sets.clone(),
            ..RunRequest::default()
        };
        hvlab::scenario::check(info, &request, BackendKind::Model)
            .unwrap_or_else(|e| panic!("{name} {sets:?}: {e}"));
        let settings = Settings::parse(info, &sets).expect("known keys");
        assert!(sets.iter().all(|s| {
            let (k, v) = s.split_once('=').expect("key=value");
            settings.is_set(k) && settings.raw(k) == v
        }));
    }
    assert_eq!(
        sets_of(&[
            lifecycle::Set::Strategy(Strategy::AlwaysSync),
            lifecycle::Set::BackToBack(true)
        ]),
        vec!["strategy=always-sync", "spacing=back-to-back"]
    );
    assert_eq!(sets_of(&[dirty::Set::SizeMib(512)]), vec!["size=512MiB"]);
}

#[test]
fn notices_are_data_the_renderer_words() {
    use hvlab::scenario::Notice;
    let lifecycle = hvlab::scenario::scenario("lifecycle").expect("registered");
    let request = RunRequest {
        variants: vec!["qemu-order".into()],
        sets: vec!["order=create-vm,memslot,irqchip,vcpus,run".into()],
        ..RunRequest::default()
    };
    let notices = lifecycle.notices(&request);
    assert_eq!(
        notices,
        vec![Notice::CustomOrderAlongside {
            variants: vec!["qemu-order".into()]
        }]
    );
    assert_eq!(
        hvlab::report::words::notice(&notices[0]),
        "running the --set order= sequence as variant `custom` alongside --variant qemu-order"
    );
    // Without --variant the custom order runs alone: nothing to say.
    let alone = RunRequest {
        sets: request.sets.clone(),
        ..RunRequest::default()
    };
    assert!(lifecycle.notices(&alone).is_empty());
}
