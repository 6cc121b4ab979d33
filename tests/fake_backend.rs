//! Scenario logic (plans, analysis, findings, verdicts, failure statuses) on a scripted backend:
//! no `/dev/kvm` and no model, so what is checked is the scenario's own reasoning over numbers
//! the test chose.

use std::collections::BTreeMap;

use hvlab::backend::error::{BackendError, KvmError};
use hvlab::backend::exits::{ExitPlan, ExitResult};
use hvlab::backend::host::{HostInfo, probe_with};
use hvlab::backend::lifecycle::{ConstructionPlan, ConstructionTrace};
use hvlab::backend::memory::{TouchPlan, TouchResult};
use hvlab::backend::pinning::{PinPlan, PinResult};
use hvlab::backend::{Backend, BackendKind};
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
