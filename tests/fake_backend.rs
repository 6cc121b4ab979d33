//! Scenario logic (plans, analysis, findings, verdicts, failure statuses, what a backend's
//! capabilities let it run, typed parameters and notices) on a scripted backend:
//! no `/dev/kvm` and no model, so what is checked is the scenario's own reasoning over numbers
//! the test chose.

use std::collections::BTreeMap;

use hvlab::analysis::class::MetricClass;
use hvlab::error::fault_exit_code;
use hvlab::record::{Finding, RunRecord, SelfCheck, VariantStatus};
use hvlab::scenario::runner::{RunRequest, Silent};
use hvlab::scenario::{Baseline, Kind, Params};
use hvlab_core::dirty::{DirtyPlan, DirtyResult};
use hvlab_core::error::BackendError;
use hvlab_core::exits::{ExitPlan, ExitResult};
use hvlab_core::host::HostInfo;
use hvlab_core::lifecycle::{ConstructionPlan, ConstructionTrace};
use hvlab_core::memory::{TouchPlan, TouchResult};
use hvlab_core::memslots::{MemslotPlan, MemslotResult, SlotOp};
use hvlab_core::pinning::{PinPlan, PinResult};
use hvlab_core::{Backend, BackendKind, Capabilities};
use hvlab_host::probe::probe_with;

/// `--set` text read into `scenario`'s parameters for a backend that can `can`, as the
/// command line reads it.
fn params(scenario: &str, sets: &[&str], can: Capabilities) -> Result<Params, hvlab::InputError> {
    let sets: Vec<String> = sets.iter().map(ToString::to_string).collect();
    Kind::named(scenario)?.parse(&sets, can)
}

/// The same, for sets the test knows are good.
fn good(scenario: &str, sets: &[&str]) -> Params {
    params(scenario, sets, BackendKind::Model.capabilities()).expect("good parameters")
}

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
            return Err(BackendError::Unsupported(
                "needs KVM_CAP_FAKE, which this host's KVM does not offer".into(),
            ));
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
        _: &hvlab_core::dirty::DirtyPlan,
    ) -> Result<hvlab_core::dirty::DirtyResult, BackendError> {
        Err(not_scripted("dirty logging"))
    }

    fn update_memslots(
        &mut self,
        _: &hvlab_core::memslots::MemslotPlan,
    ) -> Result<hvlab_core::memslots::MemslotResult, BackendError> {
        Err(not_scripted("memslot updates"))
    }
}

fn run_exits(backend: &mut FakeBackend, variants: &[&str]) -> RunRecord {
    run_exits_against(backend, variants, &Baseline::Declared)
}

fn run_exits_against(
    backend: &mut FakeBackend,
    variants: &[&str],
    baseline: &Baseline,
) -> RunRecord {
    let request = RunRequest {
        variants: variants.iter().map(ToString::to_string).collect(),
        reps: 8,
        warmup: 0,
        ..RunRequest::new(good("exits", &["iterations=1000"]))
    };
    hvlab::scenario::run_with_baseline(backend, &request, baseline, &Silent)
        .expect("the exits run completes")
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
    // Exit types are answered by what each costs: the question judges only the vPMU.
    let r = run_exits(&mut fake, &["cpuid", "pio-out", "hlt"]);
    assert!(r.verdicts.is_empty(), "{:#?}", r.verdicts);
    let r = run_exits_against(&mut fake, &["cpuid", "pio-out", "hlt"], &Baseline::Fastest);
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
        assert_eq!(v.against(), "cpuid", "{v:#?}");
        assert_eq!(v.class(), MetricClass::Slower, "{v:#?}");
        assert!(v.significant, "{v:#?}");
    }
    // --baseline-variant: every other variant against the one named.
    let r = run_exits_against(
        &mut fake,
        &["cpuid", "pio-out", "hlt"],
        &Baseline::Variant("pio-out".into()),
    );
    let classes: Vec<(&str, MetricClass)> = r
        .verdicts
        .iter()
        .map(|v| (v.variant(), v.class()))
        .collect();
    assert_eq!(
        classes,
        [("cpuid", MetricClass::Faster), ("hlt", MetricClass::Slower)]
    );
    let r = run_exits_against(&mut fake, &["cpuid", "pio-out", "hlt"], &Baseline::Fastest);
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
    let r = run_exits_against(
        &mut fake,
        &["cpuid", "hypercall", "hlt", "pio-out"],
        &Baseline::Fastest,
    );
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
    let mut request = RunRequest {
        variants: vec!["vpmu-old".into()],
        ..RunRequest::new(Kind::Exits.defaults())
    };
    let err = hvlab::scenario::check(&request, BackendKind::Kvm).unwrap_err();
    assert!(
        err.to_string().contains("add --backend model"),
        "a model variant on a real backend says how to run it: {err}"
    );
    request.variants = vec!["cpuid".into(), "cpuid".into()];
    let err = hvlab::scenario::check(&request, BackendKind::Kvm).unwrap_err();
    assert!(err.to_string().contains("more than once"), "{err}");
}

#[test]
fn a_backend_without_a_percpu_predictor_is_refused_before_the_percpu_scenario_runs() {
    let mut fake = FakeBackend::new();
    // The fake describes itself as a real backend: it has no predictor to hand out.
    assert!(!fake.capabilities().percpu && fake.percpu().is_none());
    let request = RunRequest::new(Kind::Percpu.defaults());
    let err = hvlab::scenario::run(&mut fake, &request, &Silent).unwrap_err();
    assert_eq!(
        err.to_string(),
        "The kvm backend cannot run scenario percpu yet; it runs on: model."
    );
    assert_eq!(fault_exit_code(err.fault()), 2);
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
        reps: 5,
        warmup: 0,
        ..RunRequest::new(good("memslots", sets))
    };
    hvlab::scenario::run(backend, &request, &Silent).expect("the memslots run completes")
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
    // The question is the growth with slots: within each kind, the last tenth of the updates
    // against the first. A flat cost is no change, for every kind.
    assert_eq!(r.verdicts.len(), 3, "{:#?}", r.verdicts);
    assert!(
        r.verdicts
            .iter()
            .all(|v| v.class() == MetricClass::NoChange),
        "{:#?}",
        r.verdicts
    );
    assert_eq!(r.verdicts[0].variant(), "add (last_us)");
    assert_eq!(r.verdicts[0].against(), "add (first_us)");
}

#[test]
fn memslots_growth_shows_a_cost_that_rises_with_the_slots_present() {
    let mut fake = FakeSlots::new(BackendKind::Kvm.capabilities());
    fake.per_slot_ns = 1_000;
    let r = run_memslots(&mut fake, &["slots=100"]);
    // add: 10 µs + 1 µs per slot present; first tenth ~14.5 µs, last tenth ~104.5 µs.
    let growth = variant(&r, "add").metrics["growth"].median;
    assert!((growth - 104.5 / 14.5).abs() < 1e-6, "{growth}");
    // And the question's answer: the last tenth is SLOWER than the first, for every kind.
    assert!(
        r.verdicts.iter().all(|v| v.class() == MetricClass::Slower),
        "{:#?}",
        r.verdicts
    );
}

#[test]
fn a_scenario_asks_the_backend_what_it_can_do_not_which_kind_it_is() {
    // A backend stored as `kvm` that describes itself as modelled runs a model-only variant:
    // the plans follow its capabilities.
    let mut can = BackendKind::Kvm.capabilities();
    can.modelled = true;
    let mut fake = FakeSlots::new(can);
    let request = RunRequest {
        variants: vec!["vpmu-old".into()],
        reps: 2,
        warmup: 0,
        ..RunRequest::new(good("exits", &["iterations=10"]))
    };
    let r = hvlab::scenario::run(&mut fake, &request, &Silent).expect("runs");
    assert!(variant(&r, "vpmu-old").is_ok(), "{r:#?}");
    // The same backend describing itself as real is refused the variant, naming the fix.
    let mut fake = FakeSlots::new(BackendKind::Kvm.capabilities());
    let err = hvlab::scenario::run(&mut fake, &request, &Silent).unwrap_err();
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
    use hvlab::scenario::{Params, dirty, exits, lifecycle, memory, percpu, pinning};
    use hvlab_core::guest::{Backing, GuestPage};
    use hvlab_core::lifecycle::Strategy;
    use hvlab_core::memory::{Pattern, Touch};
    let cases: Vec<Params> = vec![
        Params::Memory(memory::MemoryParams {
            size_bytes: 6 << 30,
            pattern: Pattern::Stride(4),
            touch: Touch::WholePage,
            guest_page: GuestPage::Small,
            model_backing: Backing::Thp,
            ..Default::default()
        }),
        Params::Memory(memory::MemoryParams {
            pattern: Pattern::Random,
            touch: Touch::FirstByte,
            guest_page: GuestPage::Huge,
            model_backing: Backing::Lazy,
            ..Default::default()
        }),
        Params::Memory(memory::MemoryParams {
            pattern: Pattern::Reverse,
            model_backing: Backing::Populated,
            ..Default::default()
        }),
        Params::Lifecycle(lifecycle::LifecycleParams {
            strategy: Strategy::LifecycleKeyed,
            vcpus: 2,
            hz: Some(1000),
            back_to_back: false,
            ..Default::default()
        }),
        Params::Pinning(pinning::PinningParams {
            buffer_bytes: 256 << 20,
            slices: 71,
            per_task: true,
            records_per_ms: 0,
            ..Default::default()
        }),
        Params::Exits(exits::ExitParams {
            iterations: 1000,
            host_pebs: true,
            host_pebs_data_cfg: false,
            ..Default::default()
        }),
        Params::Percpu(percpu::PercpuParams {
            cpus: 160,
            workload: percpu::workload("stress-ng-fork").expect("a workload"),
            ..Default::default()
        }),
        Params::Dirty(dirty::DirtyParams {
            size_bytes: 64 << 20,
            passes: 3,
            stride: 4096,
            ring: 65536,
            chunk: 262_144,
            ..Default::default()
        }),
    ];
    for params in cases {
        // What a record keeps, as `--set` text: it reads back to the same value.
        let sets: Vec<String> = params
            .record(BackendKind::Model)
            .iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => format!("{k}={s}"),
                other => format!("{k}={other}"),
            })
            .filter(|kv| !kv.ends_with('='))
            .collect();
        let read = params
            .kind()
            .parse(&sets, BackendKind::Model.capabilities())
            .unwrap_or_else(|e| panic!("{sets:?}: {e}"));
        assert_eq!(format!("{read:?}"), format!("{params:?}"), "{sets:?}");
        let request = RunRequest::new(params);
        hvlab::scenario::check(&request, BackendKind::Model)
            .unwrap_or_else(|e| panic!("{sets:?}: {e}"));
    }
    let spelled = |p: Params| -> Vec<String> {
        p.record(BackendKind::Model)
            .into_iter()
            .filter(|(k, _)| ["strategy", "spacing", "size", "pattern"].contains(&k.as_str()))
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
            .collect()
    };
    assert_eq!(
        spelled(Params::Lifecycle(lifecycle::LifecycleParams {
            strategy: Strategy::AlwaysSync,
            back_to_back: true,
            ..Default::default()
        })),
        vec!["spacing=back-to-back", "strategy=always-sync"]
    );
    assert_eq!(
        spelled(Params::Dirty(dirty::DirtyParams {
            size_bytes: 512 << 20,
            ..Default::default()
        })),
        vec!["size=512MiB"]
    );
    assert_eq!(
        spelled(Params::Memory(memory::MemoryParams {
            size_bytes: 6 << 30,
            pattern: Pattern::Seq,
            ..Default::default()
        })),
        vec!["pattern=seq", "size=6GiB"]
    );
}

#[test]
fn notices_are_data_the_renderer_words() {
    use hvlab::scenario::Notice;
    let request = RunRequest {
        variants: vec!["qemu-order".into()],
        ..RunRequest::new(good(
            "lifecycle",
            &["order=create-vm,memslot,irqchip,vcpus,run"],
        ))
    };
    let notices = hvlab::scenario::notices(&request);
    assert_eq!(
        notices,
        vec![Notice::CustomOrderAlongside {
            variants: vec!["qemu-order".into()]
        }]
    );
    assert_eq!(
        hvlab::export::words::notice(&notices[0]),
        "running the --set order= sequence as variant `custom` alongside --variant qemu-order"
    );
    // Without --variant the custom order runs alone: nothing to say.
    let alone = RunRequest::new(request.params.clone());
    assert!(hvlab::scenario::notices(&alone).is_empty());
}

/// The answer a test scripts for one kind of plan.
type Script<P, R> = Box<dyn FnMut(&P) -> R>;

/// A backend whose answers are closures the test writes, and which keeps every plan it was
/// handed: a test checks what the scenario asked for as well as what it made of the answers.
/// A call the test did not script is refused as unsupported.
struct Scripted {
    host: HostInfo,
    can: Capabilities,
    build: Option<Script<ConstructionPlan, ConstructionTrace>>,
    touch: Option<Script<TouchPlan, TouchResult>>,
    pin: Option<Script<PinPlan, PinResult>>,
    log: Option<Script<DirtyPlan, DirtyResult>>,
    built: Vec<ConstructionPlan>,
    touched: Vec<TouchPlan>,
    pinned: Vec<PinPlan>,
    logged: Vec<DirtyPlan>,
}

impl Scripted {
    /// A real (not modelled) backend of `kvm` kind, on a host at HZ=250 with shadow paging.
    fn new() -> Scripted {
        let mut host = probe_with("not asked: a fake backend".into(), BTreeMap::new());
        host.hz = 250;
        host.tdp = Some(false);
        host.tdp_mmu = None;
        Scripted {
            host,
            can: BackendKind::Kvm.capabilities(),
            build: None,
            touch: None,
            pin: None,
            log: None,
            built: Vec::new(),
            touched: Vec::new(),
            pinned: Vec::new(),
            logged: Vec::new(),
        }
    }

    fn modelled(mut self) -> Scripted {
        self.can.modelled = true;
        self
    }
}

impl Backend for Scripted {
    fn kind(&self) -> BackendKind {
        BackendKind::Kvm
    }

    fn capabilities(&self) -> Capabilities {
        self.can
    }

    fn host(&self) -> &HostInfo {
        &self.host
    }

    fn construct_vm(&mut self, plan: &ConstructionPlan) -> Result<ConstructionTrace, BackendError> {
        self.built.push(plan.clone());
        let script = self
            .build
            .as_mut()
            .ok_or_else(|| not_scripted("VM construction"))?;
        Ok(script(plan))
    }

    fn touch_memory(&mut self, plan: &TouchPlan) -> Result<TouchResult, BackendError> {
        self.touched.push(plan.clone());
        let script = self
            .touch
            .as_mut()
            .ok_or_else(|| not_scripted("memory touches"))?;
        Ok(script(plan))
    }

    fn exit_roundtrips(&mut self, _: &ExitPlan) -> Result<ExitResult, BackendError> {
        Err(not_scripted("exits"))
    }

    fn pin_trace(&mut self, plan: &PinPlan) -> Result<PinResult, BackendError> {
        self.pinned.push(plan.clone());
        let script = self.pin.as_mut().ok_or_else(|| not_scripted("pinning"))?;
        Ok(script(plan))
    }

    fn dirty_log(&mut self, plan: &DirtyPlan) -> Result<DirtyResult, BackendError> {
        self.logged.push(plan.clone());
        let script = self
            .log
            .as_mut()
            .ok_or_else(|| not_scripted("dirty logging"))?;
        Ok(script(plan))
    }

    fn update_memslots(&mut self, _: &MemslotPlan) -> Result<MemslotResult, BackendError> {
        Err(not_scripted("memslot updates"))
    }
}

fn request_of(params: Params, variants: &[&str], reps: u32) -> RunRequest {
    RunRequest {
        variants: variants.iter().map(ToString::to_string).collect(),
        reps,
        warmup: 0,
        ..RunRequest::new(params)
    }
}

fn run_on(
    backend: &mut Scripted,
    scenario: &str,
    variants: &[&str],
    sets: &[&str],
    reps: u32,
) -> Result<RunRecord, hvlab::error::Error> {
    let params = params(scenario, sets, backend.capabilities())?;
    hvlab::scenario::run(backend, &request_of(params, variants, reps), &Silent)
}

/// Refused before anything runs, naming `--backend model`.
fn refused_as_model_only(backend: &mut Scripted, scenario: &str, variants: &[&str], sets: &[&str]) {
    let err = run_on(backend, scenario, variants, sets, 2).expect_err("refused");
    assert!(
        err.to_string().contains("--backend model"),
        "{scenario} {variants:?} {sets:?}: {err}"
    );
    assert_eq!(fault_exit_code(err.fault()), 2, "{err}");
}

// ---- lifecycle ----

/// The fake kernel: every ioctl costs 20 µs (plus up to 4 µs of jitter); `KVM_CREATE_IRQCHIP`
/// and `KVM_IOEVENTFD` start a grace period unless the plan synchronizes, and the next
/// `KVM_SET_USER_MEMORY_REGION` waits `stall_ns` for it. Each ioctl's SRCU effect is reported,
/// as the model reports its own.
fn srcu_kernel_script(stall_ns: u64) -> Box<dyn FnMut(&ConstructionPlan) -> ConstructionTrace> {
    use hvlab_core::ioctl_table::SrcuEffect;
    use hvlab_core::lifecycle::{IoctlEvent, Step, Strategy};
    let mut calls = 0u64;
    Box::new(move |plan: &ConstructionPlan| {
        let defers = plan.strategy != Strategy::AlwaysSync;
        let mut ioctls = Vec::new();
        let mut effects = Vec::new();
        let (mut now, mut pending) = (0u64, false);
        for step in &plan.steps {
            let (name, times) = match step {
                Step::CreateVm => ("KVM_CREATE_VM", 1),
                Step::TssAddr => ("KVM_SET_TSS_ADDR", 1),
                Step::Irqchip => ("KVM_CREATE_IRQCHIP", 1),
                Step::Pit => ("KVM_CREATE_PIT2", 1),
                Step::Memslot | Step::BootMemslot => ("KVM_SET_USER_MEMORY_REGION", 1),
                Step::Vcpus => ("KVM_CREATE_VCPU", plan.vcpus),
                Step::Ioeventfds | Step::BootIoeventfds => ("KVM_IOEVENTFD", plan.devices),
                Step::Run => ("KVM_RUN", 1),
            };
            for _ in 0..times {
                calls += 1;
                let waits = name == "KVM_SET_USER_MEMORY_REGION";
                let starts_gp = defers && matches!(name, "KVM_CREATE_IRQCHIP" | "KVM_IOEVENTFD");
                let mut dur = 20_000 + (calls % 5) * 1_000;
                if waits && pending {
                    dur += stall_ns;
                    pending = false;
                }
                pending |= starts_gp;
                ioctls.push(IoctlEvent {
                    name: name.into(),
                    start_ns: now,
                    dur_ns: dur,
                    flags: None,
                });
                effects.push(SrcuEffect {
                    waits,
                    starts_gp,
                    own_gp: false,
                });
                now += dur + 1_000;
            }
        }
        ConstructionTrace {
            ioctls,
            ready_ns: now,
            kvm_stats: Vec::new(),
            srcu_effects: effects,
            since_last_ns: None,
            since_teardown_ns: None,
            tick_phase_ns: None,
            boot_thread: None,
        }
    })
}

fn srcu_stalls(r: &RunRecord, v: &str) -> Vec<(String, Option<String>, f64, usize, usize)> {
    variant(r, v)
        .findings
        .iter()
        .filter_map(|f| match f {
            Finding::SrcuStall {
                ioctl,
                caused_by,
                jiffies,
                stalled_reps,
                reps,
                ..
            } => Some((
                ioctl.clone(),
                caused_by.clone(),
                *jiffies,
                *stalled_reps,
                *reps,
            )),
            _ => None,
        })
        .collect()
}

#[test]
fn lifecycle_on_a_fake_kernel_finds_the_scripted_srcu_stall_and_blames_the_registration() {
    let mut fake = Scripted::new();
    fake.build = Some(srcu_kernel_script(8_000_000));
    let r = run_on(
        &mut fake,
        "lifecycle",
        &["irqchip-first", "memslots-first"],
        &[],
        6,
    )
    .expect("runs");
    // irqchip-first registers the irqchip's bus (a grace period), then its memslot waits
    // 8 ms: two jiffies at the fake host's HZ=250, in every repetition.
    let stalls = srcu_stalls(&r, "irqchip-first");
    assert_eq!(stalls.len(), 1, "{stalls:?}");
    let (ioctl, cause, jiffies, seen, reps) = &stalls[0];
    assert_eq!(ioctl, "KVM_SET_USER_MEMORY_REGION");
    assert_eq!(cause.as_deref(), Some("KVM_CREATE_IRQCHIP"));
    assert!((jiffies - 2.0).abs() < 0.01, "{jiffies}");
    assert_eq!((*seen, *reps), (6, 6));
    assert_eq!(variant(&r, "irqchip-first").metrics["stalls"].median, 1.0);
    // memslots-first puts its memslot before any registration: no stall.
    assert!(srcu_stalls(&r, "memslots-first").is_empty(), "{r:#?}");
    assert_eq!(variant(&r, "memslots-first").metrics["stalls"].median, 0.0);
    // The verdict calls irqchip-first slower and names the stall as the cause.
    assert_eq!(r.verdicts.len(), 1, "{:#?}", r.verdicts);
    let v = &r.verdicts[0];
    assert_eq!(
        (v.faster.as_str(), v.slower.as_str()),
        ("memslots-first", "irqchip-first")
    );
    assert!(v.significant && v.ratio > 10.0, "{v:#?}");
    let cause = v.cause.as_ref().expect("the stall explains the gap");
    assert_eq!(cause.ioctl, "KVM_SET_USER_MEMORY_REGION");
    assert_eq!(cause.caused_by.as_deref(), Some("KVM_CREATE_IRQCHIP"));
}

#[test]
fn lifecycle_judges_stalls_in_the_jiffies_of_the_host_the_backend_presents() {
    // The same 8 ms wait is two jiffies at HZ=250 and eight at HZ=1000.
    for (hz, want) in [(250u32, 2.0), (1000, 8.0)] {
        let mut fake = Scripted::new();
        fake.host.hz = hz;
        fake.build = Some(srcu_kernel_script(8_000_000));
        let r = run_on(
            &mut fake,
            "lifecycle",
            &["irqchip-first", "memslots-first"],
            &[],
            4,
        )
        .expect("runs");
        let stalls = srcu_stalls(&r, "irqchip-first");
        assert_eq!(stalls.len(), 1, "HZ={hz}: {stalls:?}");
        assert!((stalls[0].2 - want).abs() < 0.05, "HZ={hz}: {stalls:?}");
    }
    // At HZ=100 half a jiffy is 5 ms: a 4 ms wait is not called a stall.
    let mut fake = Scripted::new();
    fake.host.hz = 100;
    fake.build = Some(srcu_kernel_script(4_000_000));
    let r = run_on(
        &mut fake,
        "lifecycle",
        &["irqchip-first", "memslots-first"],
        &[],
        4,
    )
    .expect("runs");
    assert!(srcu_stalls(&r, "irqchip-first").is_empty(), "{r:#?}");
}

#[test]
fn lifecycle_plans_follow_the_request_and_model_parameters_need_a_modelled_backend() {
    use hvlab_core::lifecycle::Strategy;
    let mut fake = Scripted::new();
    fake.build = Some(srcu_kernel_script(8_000_000));
    let r = run_on(
        &mut fake,
        "lifecycle",
        &["qemu-order", "boot-activation"],
        &["vcpus=3", "devices=5"],
        2,
    )
    .expect("runs");
    let steps = |v: &str| hvlab::scenario::lifecycle::order_of(v).expect("a named order");
    assert_eq!(fake.built.len(), 4, "2 variants x 2 repetitions");
    // The runner takes the variants in turns; each was built once per repetition.
    for v in ["qemu-order", "boot-activation"] {
        let built = fake.built.iter().filter(|p| p.steps == steps(v)).count();
        assert_eq!(built, 2, "{v}: {:?}", fake.built);
    }
    for plan in &fake.built {
        assert_eq!((plan.vcpus, plan.devices), (3, 5), "{plan:?}");
        assert_eq!(plan.strategy, Strategy::AlwaysDefer, "the default strategy");
    }
    // What the fake built is what the record measured: 3 vCPUs created per build.
    assert!(
        variant(&r, "qemu-order")
            .metrics
            .contains_key("ioctl.KVM_CREATE_VCPU_ms")
    );
    // boot-activation's registrations after the run are measured as the boot phase.
    assert!(
        variant(&r, "boot-activation")
            .metrics
            .contains_key("boot.ioeventfd_us")
    );
    assert!(
        variant(&r, "boot-activation")
            .metrics
            .contains_key("boot.memslot_ms")
    );
    // The kernel's strategy and HZ are the model's to choose, not a real backend's.
    let mut real = Scripted::new();
    refused_as_model_only(
        &mut real,
        "lifecycle",
        &["irqchip-first"],
        &["strategy=always-sync"],
    );
    refused_as_model_only(&mut real, "lifecycle", &["irqchip-first"], &["hz=1000"]);
    assert!(real.built.is_empty(), "refused before any VM was built");
    // A modelled backend gets the strategy in its plans, and a synchronizing kernel stalls
    // no memslot.
    let mut modelled = Scripted::new().modelled();
    modelled.build = Some(srcu_kernel_script(8_000_000));
    let r = run_on(
        &mut modelled,
        "lifecycle",
        &["irqchip-first", "memslots-first"],
        &["strategy=always-sync"],
        4,
    )
    .expect("runs");
    assert!(
        modelled
            .built
            .iter()
            .all(|p| p.strategy == Strategy::AlwaysSync)
    );
    assert!(srcu_stalls(&r, "irqchip-first").is_empty(), "{r:#?}");
}

// ---- memory ----

/// The fake memory: per 4 KiB page, populated memory costs 100 ns and one stage-2 fault per
/// 2 MiB; lazy memory 1 µs and a fault per page; userfaultfd 3 µs a page, one uffd fault per
/// window. Up to 4% jitter. The guest's page tables take `table_pages` pages.
fn memory_script(table_pages: u64) -> Box<dyn FnMut(&TouchPlan) -> TouchResult> {
    use hvlab_core::guest::Backing;
    use hvlab_core::memory::HostBacking;
    let mut calls = 0u64;
    Box::new(move |plan: &TouchPlan| {
        calls += 1;
        let pages = plan.size_bytes / 4096;
        let (ns, pf_fixed, uffd) = match plan.backing {
            HostBacking::Anonymous(Backing::Populated) => (100, pages / 512, None),
            HostBacking::Uffd(window) => (3_000, pages, Some(pages / window as u64)),
            _ => (1_000, pages, None),
        };
        TouchResult {
            pages,
            elapsed_ns: pages * ns * (100 + calls % 5) / 100,
            uffd_faults: uffd,
            kvm_stats: vec![(
                "kvm.vcpu.pf_fixed".into(),
                "count".into(),
                i128::from(pf_fixed),
            )],
            guest_table_pages: Some(table_pages),
            vcpu_ns: Vec::new(),
            hugetlb_pool: None,
        }
    })
}

fn faults_per_page(r: &RunRecord, v: &str) -> Option<(u64, f64, f64)> {
    variant(r, v).findings.iter().find_map(|f| match f {
        Finding::FaultsPerPage {
            pages,
            pf_fixed,
            table_pages,
            ..
        } => Some((*pages, *pf_fixed, *table_pages)),
        _ => None,
    })
}

#[test]
fn memory_on_a_fake_backend_reports_scripted_costs_and_faults_and_calls_populated_faster() {
    let mut fake = Scripted::new();
    fake.touch = Some(memory_script(3));
    let r = run_on(
        &mut fake,
        "memory",
        &["lazy", "populated", "uffd-prefetch"],
        &["size=8MiB", "window=64"],
        6,
    )
    .expect("runs");
    let median = |v: &str, m: &str| variant(&r, v).metrics[m].median;
    for (v, ns) in [
        ("lazy", 1_000.0),
        ("populated", 100.0),
        ("uffd-prefetch", 3_000.0),
    ] {
        let m = median(v, "ns_per_page");
        assert!(
            (ns..=ns * 1.04).contains(&m),
            "{v}: {m} ns/page, scripted {ns}"
        );
    }
    // 2048 pages: lazy faults each, populated once per 2 MiB; a shadow-paging host's guest
    // page tables fault at no stage 2, so the table pages the fake reported are not counted.
    assert_eq!(faults_per_page(&r, "lazy"), Some((2048, 2048.0, 0.0)));
    assert_eq!(faults_per_page(&r, "populated"), Some((2048, 4.0, 0.0)));
    // uffd-prefetch resolves 64 pages per userfault, as --set window=64 asked.
    let uffd = variant(&r, "uffd-prefetch")
        .findings
        .iter()
        .find_map(|f| match f {
            Finding::UserfaultfdFaults { pages, faults } => Some((*pages, *faults)),
            _ => None,
        });
    assert_eq!(uffd, Some((2048, 32.0)));
    assert!(
        variant(&r, "lazy")
            .findings
            .iter()
            .all(|f| !matches!(f, Finding::UserfaultfdFaults { .. }))
    );
    // Each backing is judged against lazy: populated faster, uffd-prefetch slower.
    assert_eq!(r.verdicts.len(), 2, "{:#?}", r.verdicts);
    assert!(
        r.verdicts.iter().all(|v| v.against() == "lazy"),
        "{:#?}",
        r.verdicts
    );
    let classes: Vec<(&str, MetricClass)> = r
        .verdicts
        .iter()
        .map(|v| (v.variant(), v.class()))
        .collect();
    assert_eq!(
        classes,
        [
            ("populated", MetricClass::Faster),
            ("uffd-prefetch", MetricClass::Slower)
        ]
    );
    let populated = &r.verdicts[0];
    assert!((9.0..11.0).contains(&populated.ratio), "{populated:#?}");
}

#[test]
fn memory_counts_the_guest_s_page_table_faults_only_where_tdp_makes_them_stage_2_faults() {
    let mut fake = Scripted::new();
    fake.host.tdp = Some(true);
    fake.host.tdp_mmu = Some(true);
    fake.touch = Some(memory_script(3));
    let r = run_on(&mut fake, "memory", &["lazy"], &["size=8MiB"], 3).expect("runs");
    assert_eq!(faults_per_page(&r, "lazy"), Some((2048, 2048.0, 3.0)));
    assert_eq!(variant(&r, "lazy").metrics["guest_table_pages"].median, 3.0);
}

#[test]
fn memory_plans_follow_the_request_and_model_variants_need_a_modelled_backend() {
    use hvlab_core::guest::{Backing, GuestPage};
    use hvlab_core::memory::{Access, HostBacking, Pattern, PrefetchLoop, Touch};
    let mut fake = Scripted::new();
    fake.touch = Some(memory_script(0));
    let sets = [
        "size=4MiB",
        "pattern=reverse",
        "access=read",
        "touch=whole-page",
        "guest_page=4k",
        "window=16",
    ];
    run_on(&mut fake, "memory", &["uffd-prefetch", "lazy"], &sets, 1).expect("runs");
    let backings: Vec<HostBacking> = fake.touched.iter().map(|p| p.backing).collect();
    assert_eq!(
        backings,
        vec![HostBacking::Uffd(16), HostBacking::Anonymous(Backing::Lazy)]
    );
    for p in &fake.touched {
        assert_eq!(p.size_bytes, 4 << 20);
        assert_eq!(p.pattern, Pattern::Reverse);
        assert_eq!(p.access, Access::Read);
        assert_eq!(p.touch, Touch::WholePage);
        assert_eq!(p.guest_page, GuestPage::Small);
        assert_eq!(
            p.prefetch, None,
            "a real backend runs its kernel's prefetch"
        );
        assert_eq!(p.seed, hvlab::scenario::runner::DEFAULT_SEED);
    }
    // The model's prefetch loops and its host backing are the model's alone.
    let mut real = Scripted::new();
    refused_as_model_only(&mut real, "memory", &["legacy"], &[]);
    refused_as_model_only(&mut real, "memory", &["lazy"], &["backing=thp"]);
    assert!(real.touched.is_empty(), "refused before any pass ran");
    let mut modelled = Scripted::new().modelled();
    modelled.touch = Some(memory_script(0));
    run_on(
        &mut modelled,
        "memory",
        &["legacy-skip-trailing", "legacy"],
        &["size=4MiB", "backing=thp"],
        1,
    )
    .expect("runs");
    let loops: Vec<(HostBacking, Option<PrefetchLoop>)> = modelled
        .touched
        .iter()
        .map(|p| (p.backing, p.prefetch))
        .collect();
    assert_eq!(
        loops,
        vec![
            (
                HostBacking::Anonymous(Backing::Thp),
                Some(PrefetchLoop::LegacySkipTrailing)
            ),
            (
                HostBacking::Anonymous(Backing::Thp),
                Some(PrefetchLoop::Legacy)
            ),
        ]
    );
}

// ---- pinning ----

/// The fake pin manager: a pin costs 50 µs, an unpin 20 µs, a stage-1 walk 10 µs per slice.
/// `eager` pins and unpins every slice, `keep` and `intersect` pin once (`intersect` once
/// more when the buffer moves), `aging` pins and unpins once and ends with nothing pinned. A buffer
/// larger than the cap loses 7 records. Up to 4% jitter.
fn pin_script() -> Box<dyn FnMut(&PinPlan) -> PinResult> {
    use hvlab_core::pinning::PinPolicy;
    let mut calls = 0u64;
    Box::new(move |plan: &PinPlan| {
        calls += 1;
        let slices = u64::from(plan.slices);
        let (pins, unpins) = match plan.policy {
            PinPolicy::Eager => (slices, slices),
            PinPolicy::Intersect => (2, 1),
            PinPolicy::Aging(_) => (1, 1),
            _ => (1, 0),
        };
        let jitter = |ns: u64| ns * (100 + calls % 5) / 100;
        let end = match plan.policy {
            PinPolicy::Aging(_) => 0,
            _ => plan.buffer_bytes,
        };
        PinResult {
            pins,
            pin_ns: jitter(pins * 50_000),
            unpin_ns: jitter(unpins * 20_000),
            pinned_bytes_max: plan.buffer_bytes,
            pinned_bytes_end: end,
            blackout_records: if plan.buffer_bytes > plan.cap_bytes {
                7
            } else {
                0
            },
            walk_ns: jitter(slices * 10_000),
            stage2_faults: 0,
            fault_ns: 0,
            prefaults: 0,
            prefault_ns: 0,
            slices: plan.slices,
            timeline: vec![(0, plan.buffer_bytes), (1_000, end)],
        }
    })
}

#[test]
fn pinning_on_a_fake_backend_calls_keeping_the_pin_faster_and_words_aging_and_blackouts() {
    let mut fake = Scripted::new();
    fake.pin = Some(pin_script());
    let r = run_on(
        &mut fake,
        "pinning",
        &["eager", "keep", "intersect", "aging"],
        &[
            "buffer=8MiB",
            "cap=4MiB",
            "slices=20",
            "aging_ms=7",
            "tail_ms=30",
        ],
        6,
    )
    .expect("runs");
    let median = |v: &str, m: &str| variant(&r, v).metrics[m].median;
    // eager: 20 x (50 + 20 + 10) µs over 20 slices; keep: (50 + 20 x 10) µs over 20.
    assert!((80.0..=80.0 * 1.04).contains(&median("eager", "slice_overhead_us")));
    assert!((12.5..=12.5 * 1.04).contains(&median("keep", "slice_overhead_us")));
    assert_eq!(median("eager", "pins"), 20.0);
    assert_eq!(median("keep", "pins"), 1.0);
    // Each policy against eager: keep FASTER by the scripted 6.4x.
    assert_eq!(r.verdicts.len(), 3, "{:#?}", r.verdicts);
    assert!(
        r.verdicts.iter().all(|v| v.against() == "eager"),
        "{:#?}",
        r.verdicts
    );
    let keep = r
        .verdicts
        .iter()
        .find(|v| v.variant() == "keep")
        .expect("keep judged");
    assert!(
        keep.class() == MetricClass::Faster && (6.0..7.0).contains(&keep.ratio),
        "{keep:#?}"
    );
    // The buffer exceeds the cap: every policy that pins loses the scripted records, said
    // with the request's sizes.
    for v in ["eager", "keep"] {
        let blackouts = variant(&r, v).findings.iter().find_map(|f| match f {
            Finding::Blackouts {
                records,
                buffer_bytes,
                cap_bytes,
            } => Some((*records, *buffer_bytes, *cap_bytes)),
            _ => None,
        });
        assert_eq!(blackouts, Some((7.0, 8 << 20, 4 << 20)), "{v}");
    }
    // Aging is reported with its threshold and tail as asked, and what it left pinned.
    let aged = variant(&r, "aging").findings.iter().find_map(|f| match f {
        Finding::PinsAged {
            after_ms,
            pinned_bytes_end,
            tail_ms,
        } => Some((*after_ms, *pinned_bytes_end, *tail_ms)),
        _ => None,
    });
    assert_eq!(aged, Some((7, 0, 30)));
    assert!(
        variant(&r, "keep")
            .findings
            .iter()
            .all(|f| !matches!(f, Finding::PinsAged { .. }))
    );
}

#[test]
fn pinning_plans_follow_the_request_and_no_pin_needs_a_modelled_backend() {
    use hvlab_core::pinning::PinPolicy;
    let mut fake = Scripted::new();
    fake.pin = Some(pin_script());
    run_on(
        &mut fake,
        "pinning",
        &["aging", "intersect"],
        &[
            "buffer=2MiB",
            "slices=9",
            "mode=per-cpu",
            "aging_ms=3",
            "relocate_every=4",
        ],
        1,
    )
    .expect("runs");
    let policies: Vec<PinPolicy> = fake.pinned.iter().map(|p| p.policy).collect();
    assert_eq!(
        policies,
        vec![PinPolicy::Aging(3_000_000), PinPolicy::Intersect]
    );
    for p in &fake.pinned {
        assert_eq!(
            (p.buffer_bytes, p.slices, p.per_task, p.relocate_every),
            (2 << 20, 9, false, 4)
        );
    }
    let mut real = Scripted::new();
    refused_as_model_only(&mut real, "pinning", &["no-pin"], &[]);
    assert!(real.pinned.is_empty());
    let mut modelled = Scripted::new().modelled();
    modelled.pin = Some(pin_script());
    run_on(&mut modelled, "pinning", &["no-pin"], &[], 1).expect("runs");
    assert_eq!(modelled.pinned[0].policy, PinPolicy::NoPin);
}

// ---- dirty ----

/// The fake dirty log: every pass writes every `stride`-th page at 500 ns a page, and the log
/// reports them all, except that the `short`-th call in clear mode (1-based; 0: never) reports
/// one page fewer in its second pass. Collection: bitmap 2 ms a get; clear 0.5 ms a get and
/// 0.25 ms a chunk; ring 3 ms of harvest and 1 ms of reset, and a ring-full exit each time
/// the soft limit fills. Up to 4% jitter.
fn dirty_script(short: u64) -> Box<dyn FnMut(&DirtyPlan) -> DirtyResult> {
    use hvlab_core::dirty::{DirtyPass, LogMode};
    let (mut calls, mut clears) = (0u64, 0u64);
    Box::new(move |plan: &DirtyPlan| {
        calls += 1;
        let jitter = |ns: u64| ns * (100 + calls % 5) / 100;
        let written = plan.written_per_pass();
        if matches!(plan.mode, LogMode::Clear { .. }) {
            clears += 1;
        }
        let passes = (1..=plan.passes)
            .map(|pass| {
                let found =
                    if clears == short && pass == 2 && matches!(plan.mode, LogMode::Clear { .. }) {
                        written - 1
                    } else {
                        written
                    };
                let mut p = DirtyPass {
                    written,
                    found,
                    dirty_ns: jitter(written * 500),
                    wp_faults: Some(written),
                    ..DirtyPass::default()
                };
                match plan.mode {
                    LogMode::Bitmap => {
                        p.get_ns = jitter(2_000_000);
                        p.ioctls = 1;
                    }
                    LogMode::Clear { chunk_pages } => {
                        let chunks = plan.pages().div_ceil(chunk_pages);
                        p.get_ns = jitter(500_000);
                        p.clear_ns = jitter(chunks * 250_000);
                        p.ioctls = 1 + chunks;
                    }
                    LogMode::Ring { .. } => {
                        let full = written / plan.ring_soft_limit().unwrap_or(u64::MAX);
                        p.harvest_ns = jitter(3_000_000);
                        p.reset_ns = jitter(1_000_000);
                        p.ring_full_exits = full;
                        p.ioctls = 1 + full;
                    }
                }
                p
            })
            .collect();
        DirtyResult { passes }
    })
}

/// A `DirtyLog` finding's numbers: pages, passes, wp_faults, ioctls, ring_full_exits.
type DirtyLogCounts = (u64, u64, Option<f64>, f64, Option<f64>);

fn dirty_log_finding(r: &RunRecord, v: &str) -> Option<DirtyLogCounts> {
    variant(r, v).findings.iter().find_map(|f| match f {
        Finding::DirtyLog {
            pages,
            passes,
            wp_faults,
            ioctls,
            ring_full_exits,
            ..
        } => Some((*pages, *passes, *wp_faults, *ioctls, *ring_full_exits)),
        _ => None,
    })
}

const DIRTY_SETS: [&str; 5] = ["size=8MiB", "passes=3", "stride=2", "chunk=256", "ring=512"];

#[test]
fn dirty_on_a_fake_backend_calls_the_scripted_slower_ring_slower_and_reports_its_counts() {
    let mut fake = Scripted::new();
    fake.log = Some(dirty_script(0));
    let r = run_on(
        &mut fake,
        "dirty",
        &["bitmap", "clear", "ring"],
        &DIRTY_SETS,
        5,
    )
    .expect("runs");
    let median = |v: &str, m: &str| variant(&r, v).metrics[m].median;
    // 2048 pages, every second one written: 1024 per pass, all found.
    for v in ["bitmap", "clear", "ring"] {
        assert_eq!(median(v, "pages_written"), 1024.0, "{v}");
        assert_eq!(median(v, "pages_dirty"), 1024.0, "{v}");
        assert_eq!(median(v, "wp_faults"), 1024.0, "{v}");
    }
    for (v, ms) in [("bitmap", 2.0), ("clear", 2.5), ("ring", 4.0)] {
        let m = median(v, "collect_ms");
        assert!((ms..=ms * 1.04).contains(&m), "{v}: {m} ms, scripted {ms}");
    }
    // The ring's soft limit is 512 - 64 entries: two ring-full exits per 1024 pages.
    assert_eq!(
        dirty_log_finding(&r, "ring"),
        Some((1024, 15, Some(1024.0), 3.0, Some(2.0)))
    );
    // Eight 256-page chunks cleared after the get.
    assert_eq!(
        dirty_log_finding(&r, "clear"),
        Some((1024, 15, Some(1024.0), 9.0, None))
    );
    // Each mode against the bitmap: the clears and the ring both SLOWER.
    let classes: Vec<(&str, &str, MetricClass)> = r
        .verdicts
        .iter()
        .map(|v| (v.variant(), v.against(), v.class()))
        .collect();
    assert_eq!(
        classes,
        [
            ("clear", "bitmap", MetricClass::Slower),
            ("ring", "bitmap", MetricClass::Slower)
        ]
    );
}

#[test]
fn dirty_fails_a_variant_whose_log_misses_a_page_the_guest_wrote() {
    let mut fake = Scripted::new();
    // The first clear repetition's second pass reports 1023 of 1024 pages.
    fake.log = Some(dirty_script(1));
    let r = run_on(
        &mut fake,
        "dirty",
        &["bitmap", "clear", "ring"],
        &DIRTY_SETS,
        3,
    )
    .expect("runs");
    match &variant(&r, "clear").status {
        VariantStatus::Failed(why) => assert_eq!(
            why,
            "the dirty log reported 1023 pages in pass 2 of repetition 1, the guest wrote 1024"
        ),
        other => panic!("a log that misses a written page fails the variant: {other:?}"),
    }
    assert!(variant(&r, "bitmap").is_ok() && variant(&r, "ring").is_ok());
    // Only the ring against bitmap is judged: a failed variant has no collection time.
    assert_eq!(r.verdicts.len(), 1, "{:#?}", r.verdicts);
    assert_eq!(
        (r.verdicts[0].variant(), r.verdicts[0].against()),
        ("ring", "bitmap")
    );
}

#[test]
fn dirty_plans_follow_the_request() {
    use hvlab_core::dirty::LogMode;
    let mut fake = Scripted::new();
    fake.log = Some(dirty_script(0));
    run_on(
        &mut fake,
        "dirty",
        &["ring", "clear", "bitmap"],
        &DIRTY_SETS,
        1,
    )
    .expect("runs");
    let modes: Vec<LogMode> = fake.logged.iter().map(|p| p.mode).collect();
    assert_eq!(
        modes,
        vec![
            LogMode::Ring { entries: 512 },
            LogMode::Clear { chunk_pages: 256 },
            LogMode::Bitmap
        ]
    );
    for p in &fake.logged {
        assert_eq!((p.size_bytes, p.passes, p.stride), (8 << 20, 3, 2));
    }
}

#[test]
fn showcases_and_validation_points_ask_for_the_parameters_they_asked_for_as_text() {
    // What each showcase and validation point asked before they were typed: the runs they
    // make (and the parameters stored with them) stay the same.
    let as_text = |kind: Kind, sets: &[&str]| format!("{:?}", good(kind.name(), sets));
    let showcases: Vec<(&str, String)> = Kind::ALL
        .into_iter()
        .flat_map(|k| {
            k.showcases()
                .into_iter()
                .map(move |c| (k.name(), format!("{:?}", c.params)))
        })
        .collect();
    assert_eq!(
        showcases,
        vec![
            (
                "lifecycle",
                as_text(
                    Kind::Lifecycle,
                    &["strategy=always-defer", "spacing=independent"]
                )
            ),
            (
                "lifecycle",
                as_text(
                    Kind::Lifecycle,
                    &["strategy=lifecycle-keyed", "spacing=independent"]
                )
            ),
            (
                "memory",
                as_text(
                    Kind::Memory,
                    &[
                        "size=6GiB",
                        "pattern=seq",
                        "touch=first-byte",
                        "guest_page=4k",
                        "backing=populated"
                    ]
                )
            ),
            (
                "exits",
                as_text(Kind::Exits, &["host_pebs=1", "iterations=1000"])
            ),
            (
                "pinning",
                as_text(Kind::Pinning, &["buffer=256MiB", "slices=100"])
            ),
            (
                "percpu",
                as_text(Kind::Percpu, &["workload=kernel-build", "cpus=160"])
            ),
            (
                "percpu",
                as_text(Kind::Percpu, &["workload=stress-ng-fork", "cpus=4096"])
            ),
        ]
    );
    let mut host = probe_with("not asked: a fake backend".into(), BTreeMap::new());
    for (emulated, kernel) in [(false, "6.18.0"), (true, "6.12.0")] {
        host.hypervisor = Some(
            if emulated {
                "TCGTCGTCGTCG"
            } else {
                "KVMKVMKVM"
            }
            .into(),
        );
        host.kernel = kernel.into();
        let points: BTreeMap<&str, (String, String)> = Kind::ALL
            .into_iter()
            .filter_map(|k| {
                let p = k.validation(&host)?;
                let show = |p: &Params| format!("{p:?}");
                Some((k.name(), (show(&p.params), show(&p.model_params))))
            })
            .collect();
        let (size, iterations, strategy) = if emulated {
            ("size=16MiB", "iterations=200", "strategy=always-sync")
        } else {
            ("size=128MiB", "iterations=5000", "strategy=always-defer")
        };
        let dirty: &[&str] = if emulated {
            &["size=16MiB", "passes=1", "vcpus=2"]
        } else {
            &["size=128MiB", "passes=3", "vcpus=8"]
        };
        let both = |kind: Kind, sets: &[&str]| (as_text(kind, sets), as_text(kind, sets));
        let want: BTreeMap<&str, (String, String)> = [
            ("dirty", both(Kind::Dirty, dirty)),
            ("memory", both(Kind::Memory, &[size, "pattern=random"])),
            ("exits", both(Kind::Exits, &[iterations])),
            (
                "lifecycle",
                (
                    as_text(Kind::Lifecycle, &[]),
                    as_text(Kind::Lifecycle, &[strategy]),
                ),
            ),
        ]
        .into_iter()
        .collect();
        assert_eq!(points, want, "emulated: {emulated}");
    }
}
