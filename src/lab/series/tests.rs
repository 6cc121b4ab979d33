//! The series' tests: the boot order, shards, the table's judging and the sources.

use super::*;
use crate::analysis::class::VariantClass;
use crate::kernel::build::PatchedSpec;
use crate::kernel::vm::Accel;
use crate::record::RunRecord;
use crate::record::{MetricRecord, VariantRecord, VariantStatus};
use std::collections::BTreeMap;

/// splitmix64: a seeded stream for simulated samples.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        #[allow(clippy::cast_precision_loss)]
        let u = (z >> 11) as f64 / (1u64 << 53) as f64;
        u
    }
    /// Normal(mean, sd), Box–Muller.
    fn normal(&mut self, mean: f64, sd: f64) -> f64 {
        let (u1, u2) = (self.next().max(1e-12), self.next());
        mean + sd * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

const SCENARIO: &str = "memory";

/// One boot's run of the kernel `spec`: `variants` × `metrics` times in µs around 100
/// with a relative spread `cv`, `reps` repetitions each; `shift(variant, metric)` scales
/// the mean (a change the commit made).
#[allow(clippy::too_many_arguments)]
fn run(
    id: &str,
    spec: &str,
    variants: usize,
    metrics: usize,
    reps: usize,
    cv: f64,
    rng: &mut Rng,
    shift: &dyn Fn(usize, usize) -> f64,
) -> RunRecord {
    // One template for every simulated run: the fixture goes through a store to load.
    static TEMPLATE: std::sync::OnceLock<RunRecord> = std::sync::OnceLock::new();
    let mut r = TEMPLATE
        .get_or_init(|| kab::fixture::runs()[0].clone())
        .clone();
    r.run_id = id.to_string();
    r.scenario = SCENARIO.into();
    r.verdicts.clear();
    r.warnings.clear();
    r.noise = None;
    if let Some(u) = r.host.under_test.as_mut() {
        u.spec = spec.to_string();
        u.accel = "kvm".into();
        u.kab = None;
    }
    r.params = memory_params(u32::try_from(reps).unwrap_or(u32::MAX), &[]);
    let names = crate::scenario::find(SCENARIO)
        .expect("the memory scenario")
        .variants;
    r.variants = (0..variants)
        .map(|v| VariantRecord {
            name: names[v].name.to_string(),
            status: VariantStatus::Ok,
            metrics: (0..metrics)
                .map(|m| {
                    let mean = 100.0 * shift(v, m);
                    let samples: Vec<f64> =
                        (0..reps).map(|_| rng.normal(mean, mean * cv)).collect();
                    (format!("m{m:02}"), metric(samples, "us"))
                })
                .chain(std::iter::once((
                    "kvm.vm.exits".to_string(),
                    metric(vec![7.0; reps], "count"),
                )))
                .collect::<BTreeMap<_, _>>(),
            findings: Vec::new(),
            timeline: Vec::new(),
            pinned_bytes: Vec::new(),
        })
        .collect();
    r
}

/// The parameters a kvm run of the memory scenario records with `sets` at `reps`.
fn memory_params(reps: u32, sets: &[String]) -> BTreeMap<String, serde_json::Value> {
    let kvm = hvlab_core::BackendKind::Kvm;
    let mut p = crate::scenario::Kind::named(SCENARIO)
        .expect("the memory scenario")
        .parse(sets, kvm.capabilities())
        .expect("its parameters")
        .record(kvm);
    p.insert("reps".into(), reps.into());
    p
}

fn metric(samples: Vec<f64>, unit: &str) -> MetricRecord {
    let min = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let max = samples.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    MetricRecord {
        unit: unit.into(),
        median: crate::analysis::statistics::median(&samples),
        ci95: [min, max],
        min,
        max,
        n: samples.len(),
        samples,
    }
}

/// A kernel's runs: `boots` boots.
#[allow(clippy::too_many_arguments)]
fn kernel(
    spec: &str,
    boots: usize,
    variants: usize,
    metrics: usize,
    reps: usize,
    cv: f64,
    rng: &mut Rng,
    shift: &dyn Fn(usize, usize) -> f64,
) -> KernelRuns {
    KernelRuns {
        runs: (0..boots)
            .map(|b| {
                run(
                    &format!("{spec}-boot{b}"),
                    spec,
                    variants,
                    metrics,
                    reps,
                    cv,
                    rng,
                    shift,
                )
            })
            .collect(),
        ..KernelRuns::default()
    }
}

fn steps(n: usize) -> Vec<SeriesStep> {
    (1..=n)
        .map(|i| SeriesStep {
            label: format!("[PATCH {i}/{n}]"),
            subject: format!("change {i}"),
            spec: PatchedSpec::named(&format!("debian:7.3+{i}")),
        })
        .collect()
}

/// `names` with `sets`, typed as the command line types them.
fn typed(names: &[&str], sets: &[String]) -> Vec<kab::GuestScenario> {
    let names: Vec<String> = names.iter().map(ToString::to_string).collect();
    kab::guest_scenarios(&names, &[], sets).expect("scenarios")
}

fn settings(scenarios: &[kab::GuestScenario]) -> JudgeSettings<'_> {
    JudgeSettings {
        asked: RunsAsked {
            scenarios,
            variants: &[],
            reps: 10,
            accel: Accel::Kvm,
        },
        threshold: 0.05,
        metric: None,
    }
}

fn flagged(t: &SeriesTable) -> bool {
    t.commits.iter().flat_map(|c| &c.variants).any(|v| {
        [v.vs_parent.class, v.vs_base.class].iter().any(|c| {
            matches!(
                c,
                VariantClass::Regressed | VariantClass::Improved | VariantClass::Fixed
            )
        })
    })
}

#[test]
fn sweep_order_gives_every_adjacent_pair_abba_and_boots_each_kernel_once_a_turn() {
    assert_eq!(sweep_order(4, 2), vec![0, 1, 2, 3, 3, 2, 1, 0]);
    for kernels in 2..6 {
        for boots in 1..5u32 {
            let order = sweep_order(kernels, boots);
            for k in 0..kernels {
                let n = order.iter().filter(|&&x| x == k).count();
                assert_eq!(n, boots as usize);
            }
            if boots % 2 == 0 {
                for i in 0..kernels - 1 {
                    let pair: Vec<usize> = order
                        .iter()
                        .filter(|&&x| x == i || x == i + 1)
                        .map(|&x| usize::from(x == i + 1))
                        .collect();
                    assert_eq!(pair, kab::abba(boots), "pair {i} of {kernels}");
                }
            }
        }
    }
}

#[test]
fn an_interrupted_run_boots_only_what_is_missing() {
    // base and commit 1 fully stored, commit 2 once: commit 2's second boot, commit 3's two.
    assert_eq!(remaining_order(&[2, 2, 1, 0], 2), vec![3, 3, 2]);
    assert!(remaining_order(&[2, 2], 2).is_empty());
}

#[test]
fn every_commit_is_one_shards_unit_with_its_parent() {
    for n in 1..6 {
        let mut seen = Vec::new();
        for i in 0..n {
            let shard = Shard::new(i, n).expect("a shard");
            for (c, p) in shard_units(7, &shard) {
                assert_eq!(p, c.checked_sub(1));
                seen.push(c);
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..7).collect::<Vec<_>>(), "{n} shards");
    }
}

/// A built kernel of the given spec, as a series state holds it.
fn built(spec: &str) -> KernelState {
    Some(Ok(Built {
        kernel: crate::kernel::Kernel {
            release: "7.3.4+deb13-amd64".into(),
            spec: spec.into(),
            source: "test".into(),
            image: std::path::PathBuf::from("/nonexistent/bzImage"),
            config: None,
            modules: None,
        },
        build: None,
    }))
}

/// kvm.ko's delta: one function identical but for 9 line numbers, or grown.
fn kvm_delta(identical: bool) -> BuildsDelta {
    use crate::kernel::objdiff::Delta;
    crate::kernel::objdiff::tests::kvm_delta(if identical {
        Delta::Identical {
            bytes: 589,
            line_numbers: 9,
        }
    } else {
        Delta::Grown { from: 589, to: 619 }
    })
}

/// A commit whose object code is its parent's is not booted: it takes its parent's slot (and
/// runs), the chain boots each kernel once, and a commit after it is judged against the
/// kernel that was booted. A commit whose code changed, or whose delta is unknown, boots.
#[test]
fn a_commit_with_its_parents_object_code_is_not_booted() {
    let states = vec![
        built("debian:7.3"),
        built("debian:7.3+1"),
        built("debian:7.3+2"),
        Some(Err("does not build".into())),
        built("debian:7.3+4"),
        built("debian:7.3+5"),
    ];
    // 1 changed, 2 identical to 1, 3 does not build, 4 identical to 2 (its last built
    // parent), 5 not compared (a whole kernel).
    let mut whole = kvm_delta(true);
    whole
        .not_compared
        .push(crate::kernel::objdiff::NotCompared::WholeKernel);
    let objects = vec![
        Some(kvm_delta(false)),
        Some(kvm_delta(true)),
        None,
        Some(kvm_delta(true)),
        Some(whole),
    ];
    let steps = steps(5);
    let base = PatchedSpec::named("debian:7.3");
    let patched = PatchedSpec::named("debian:7.3+series");
    let (labelled, slot) = bootable(&states, &objects, &steps, &base, &patched).expect("bootable");
    let labels: Vec<&str> = labelled.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(labels, ["base", "[PATCH 1/5]", "[PATCH 5/5]"]);
    assert_eq!(slot, [Some(0), Some(1), Some(1), None, Some(1), Some(2)]);
    let chains = chains_to_boot(&Shard::WHOLE, &[], &slot);
    assert_eq!(chains, vec![vec![0, 1, 2]]);
    // A shard of commit 2 alone boots its parent once.
    let units = [(1, Some(0))];
    let shard = chains_to_boot(&Shard::new(1, 5).expect("a shard"), &units, &slot);
    assert_eq!(shard, vec![vec![1]]);
}

/// One simulated table of N = 4 commits × 6 variants × 12 metrics, every kernel booted
/// twice with `reps` repetitions at a 5% spread; commit 3 scales lazy's m00 by `shift`.
fn aa_table(seed: u64, reps: usize, shift: f64) -> SeriesTable {
    let scenarios = typed(&[SCENARIO], &[]);
    let mut rng = Rng(seed);
    let same = |_: usize, _: usize| 1.0;
    let changed = |v: usize, m: usize| if v == 0 && m == 0 { shift } else { 1.0 };
    let base = kernel("debian:7.3", 2, 6, 12, reps, 0.05, &mut rng, &same);
    let st = steps(4);
    let states: Vec<StepState> = st
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let f: &dyn Fn(usize, usize) -> f64 = if i == 2 { &changed } else { &same };
            StepState::Built(kernel(&s.spec.given, 2, 6, 12, reps, 0.05, &mut rng, f))
        })
        .collect();
    let t = judge_series("debian:7.3", &base, &st, &states, &settings(&scenarios));
    assert_eq!(
        t.commits.iter().map(|c| c.variants.len()).sum::<usize>(),
        24
    );
    // 4 commits against their parents and 3 against the base (the first's parent is it).
    assert_eq!(t.judged_together, 7 * 6 * 12);
    t
}

/// A/A: every kernel's runs drawn from one distribution, judged as one family: at most 5%
/// of tables flag anything (1 of 20). The cost is the statistics (a bootstrap and an exact
/// rank test per comparison, 504 a table): 5 repetitions a boot (10 samples a side, the
/// fewest whose exact test can still reach Holm's 0.05/504) take ~0.8 s a table on a
/// loaded host where 10 took 2.5 s. The same tables with a real 30% change must flag it,
/// so a correction too strict to call anything cannot pass as "no false flags".
#[test]
fn an_aa_series_flags_a_change_in_at_most_five_percent_of_tables() {
    let (trials, reps) = (20u32, 5);
    let flagged_tables = (0..trials)
        .filter(|&trial| flagged(&aa_table(0x5eed_0000 + u64::from(trial), reps, 1.0)))
        .count();
    let share = f64::from(u32::try_from(flagged_tables).unwrap_or(u32::MAX)) / f64::from(trials);
    println!(
        "A/A: {flagged_tables} of {trials} tables ({:.1}%) flagged a change, 504 comparisons each",
        100.0 * share
    );
    assert!(
        share <= 0.05,
        "{flagged_tables} of {trials} A/A tables flagged a change"
    );
    let found = (0..2u32)
        .filter(|&trial| {
            let t = aa_table(0xc0de_0000 + u64::from(trial), reps, 1.3);
            t.commits[2].variants[0].vs_parent.class == VariantClass::Regressed
        })
        .count();
    println!("the same tables with commit 3 30% slower on lazy's m00: {found} of 2 flag it");
    assert_eq!(found, 2, "{found} of 2 tables found a 30% regression");
}

/// Documentation-only commits: every kernel's runs from one distribution (1% spread);
/// every row against its parent and against the base is NO CHANGE.
#[test]
fn a_documentation_only_series_is_no_change_on_every_row() {
    let scenarios = typed(&[SCENARIO], &[]);
    let mut rng = Rng(38);
    let same = |_: usize, _: usize| 1.0;
    let base = kernel("debian:7.3", 2, 6, 12, 10, 0.01, &mut rng, &same);
    let st = steps(4);
    let states: Vec<StepState> = st
        .iter()
        .map(|s| StepState::Built(kernel(&s.spec.given, 2, 6, 12, 10, 0.01, &mut rng, &same)))
        .collect();
    let t = judge_series("debian:7.3", &base, &st, &states, &settings(&scenarios));
    for c in &t.commits {
        assert_eq!(c.variants.len(), 6);
        for v in &c.variants {
            assert_eq!(
                v.vs_parent.class,
                VariantClass::NoChange,
                "{} {}",
                c.step.label,
                v.variant
            );
            assert_eq!(
                v.vs_base.class,
                VariantClass::NoChange,
                "{} {}",
                c.step.label,
                v.variant
            );
        }
    }
    assert!(
        crate::export::series::answer(&t)[0].starts_with("no commit changed anything"),
        "{:?}",
        crate::export::series::answer(&t)
    );
    assert!(!t.regression());
}

/// Under TCG a time is shown, never judged: a row that moved nothing shows a metric the
/// verdict judged (the exact count), not the first time of the variant; a row that regressed
/// shows the metric that made it REGRESSED.
#[test]
fn the_tables_metric_is_one_the_verdict_judged() {
    let scenarios = typed(&[SCENARIO], &[]);
    let mut rng = Rng(7);
    let same = |_: usize, _: usize| 1.0;
    // A time that sorts before every other metric, as lifecycle's `between_builds.setup_ms`.
    let with_setup_time = |mut k: KernelRuns, rng: &mut Rng| {
        for v in k.runs.iter_mut().flat_map(|r| &mut r.variants) {
            let samples = (0..10).map(|_| rng.normal(3.0, 0.3)).collect();
            v.metrics
                .insert("between_builds.setup_ms".into(), metric(samples, "ms"));
        }
        k
    };
    let base = kernel("debian:7.3", 2, 2, 3, 10, 0.01, &mut rng, &same);
    let base = with_setup_time(base, &mut rng);
    let st = steps(1);
    let commit = kernel(&st[0].spec.given, 2, 2, 3, 10, 0.01, &mut rng, &same);
    let states = vec![StepState::Built(with_setup_time(commit, &mut rng))];
    let mut tcg = settings(&scenarios);
    tcg.asked.accel = Accel::Tcg;
    let t = judge_series("debian:7.3", &base, &st, &states, &tcg);
    for v in &t.commits[0].variants {
        assert_eq!(v.vs_parent.class, VariantClass::NoChange, "{}", v.variant);
        let n = v.numbers.as_ref().expect("numbers");
        assert_eq!(
            (n.metric.as_str(), n.unit.as_str()),
            ("kvm.vm.exits", "count")
        );
    }
    // Asked for a time under TCG: not judged, so not shown as the row's metric.
    tcg.metric = Some("m01");
    let t = judge_series("debian:7.3", &base, &st, &states, &tcg);
    let n = t.commits[0].variants[0].numbers.as_ref().expect("numbers");
    assert_eq!(n.metric, "kvm.vm.exits");
    let text = crate::export::series::render(&t, &[]);
    assert!(text.contains("kvm.vm.exits (count)"), "{text}");
    assert!(!text.contains("(us)") && !text.contains("(ms)"), "{text}");
    // Under KVM the times are judged: the one asked for is shown; and a regression shows
    // the metric that regressed, whatever was asked.
    let mut kvm = settings(&scenarios);
    kvm.metric = Some("m01");
    let t = judge_series("debian:7.3", &base, &st, &states, &kvm);
    let n = t.commits[0].variants[0].numbers.as_ref().expect("numbers");
    assert_eq!(n.metric, "m01");
    let slower = |v: usize, m: usize| if v == 0 && m == 2 { 1.3 } else { 1.0 };
    let states = vec![StepState::Built(kernel(
        &st[0].spec.given,
        2,
        2,
        3,
        10,
        0.01,
        &mut rng,
        &slower,
    ))];
    let t = judge_series("debian:7.3", &base, &st, &states, &kvm);
    let row = &t.commits[0].variants[0];
    assert_eq!(row.vs_parent.class, VariantClass::Regressed);
    assert_eq!(row.numbers.as_ref().map(|n| n.metric.as_str()), Some("m02"));
}

/// Commit 2 does not build; commit 3 regresses lazy's m00 by 30%: its row is REGRESSED
/// against commit 1 (the last that built), the answer leads with it, and commit 2's row
/// carries the compiler's error.
#[test]
fn a_commit_that_does_not_build_keeps_its_row_and_the_next_is_judged_past_it() {
    let scenarios = typed(&[SCENARIO], &[]);
    let mut rng = Rng(7);
    let same = |_: usize, _: usize| 1.0;
    let slower = |v: usize, m: usize| if v == 0 && m == 0 { 1.3 } else { 1.0 };
    let st = steps(3);
    let base = kernel("debian:7.3", 2, 2, 3, 10, 0.01, &mut rng, &same);
    let states = vec![
        StepState::Built(kernel(
            &st[0].spec.given,
            2,
            2,
            3,
            10,
            0.01,
            &mut rng,
            &same,
        )),
        StepState::DoesNotBuild {
            error: "virt/kvm/kvm_main.c:1702:9: error: implicit declaration".into(),
        },
        StepState::Built(kernel(
            &st[2].spec.given,
            2,
            2,
            3,
            10,
            0.01,
            &mut rng,
            &slower,
        )),
    ];
    let t = judge_series("debian:7.3", &base, &st, &states, &settings(&scenarios));
    assert_eq!(
        t.commits[1].does_not_build.as_deref(),
        Some("virt/kvm/kvm_main.c:1702:9: error: implicit declaration")
    );
    assert!(t.commits[1].variants.is_empty());
    let third = &t.commits[2];
    assert_eq!(third.parent, "[PATCH 1/3]");
    let lazy = &third.variants[0];
    assert_eq!(lazy.vs_parent.class, VariantClass::Regressed);
    assert_eq!(lazy.vs_base.class, VariantClass::Regressed);
    let n = lazy.numbers.as_ref().expect("numbers");
    assert_eq!(n.metric, "m00");
    assert!((n.change_pct - 30.0).abs() < 3.0, "{n:?}");
    assert_eq!(third.variants[1].vs_parent.class, VariantClass::NoChange);
    let answer = crate::export::series::answer(&t);
    assert!(
        answer[0].starts_with("[PATCH 2/3] DOES NOT BUILD: virt/kvm"),
        "{answer:?}"
    );
    assert!(
        answer[1].starts_with("[PATCH 3/3] REGRESSED lazy: m00 "),
        "{answer:?}"
    );
    assert!(t.regression());
}

/// A shared store's runs of one kernel: only those made as asked stand for this request's
/// boots. Each stored run differs from what is asked in one thing; a run of more variants
/// serves, restricted to those asked.
#[test]
fn stored_runs_are_reused_only_when_made_as_asked() {
    let mut rng = Rng(5);
    let same = |_: usize, _: usize| 1.0;
    let spec = "debian:7.3";
    let variants = ["lazy".to_string(), "populated".to_string()];
    let sets = ["window=16".to_string()];
    let scenarios = typed(&[SCENARIO], &sets);
    let mut made = |id: &str, variants: usize, reps: u32, sets: &[String]| {
        let mut r = run(id, spec, variants, 1, 10, 0.01, &mut rng, &same);
        r.params = memory_params(reps, sets);
        r
    };
    let superset = made("superset", 3, 10, &sets);
    let exact = made("exact", 2, 10, &sets);
    let fewer_variants = made("fewer-variants", 1, 10, &sets);
    let default_set = made("default-set", 2, 10, &[]);
    let other_set = made("other-set", 2, 10, &["window=32".to_string()]);
    let other_reps = made("other-reps", 2, 20, &sets);
    let mut other_accel = made("other-accel", 2, 10, &sets);
    if let Some(u) = other_accel.host.under_test.as_mut() {
        u.accel = "tcg".into();
    }
    let mut other_scenario = made("other-scenario", 2, 10, &sets);
    other_scenario.scenario = "lifecycle".into();
    let mut other_kernel = made("other-kernel", 2, 10, &sets);
    if let Some(u) = other_kernel.host.under_test.as_mut() {
        u.spec = "debian:7.2".into();
    }
    let all = vec![
        superset,
        exact,
        fewer_variants,
        default_set,
        other_set,
        other_reps,
        other_accel,
        other_scenario,
        other_kernel,
    ];
    let asked = RunsAsked {
        scenarios: &scenarios,
        variants: &variants,
        reps: 10,
        accel: Accel::Kvm,
    };
    let kept = of_kernel(all.clone(), spec, &asked);
    let ids: Vec<&str> = kept.iter().map(|r| r.run_id.as_str()).collect();
    assert_eq!(ids, ["superset", "exact"]);
    let names: Vec<&str> = kept[0].variants.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names,
        ["lazy", "populated"],
        "restricted to the variants asked"
    );
    assert_eq!(boots_in(&kept, &[SCENARIO.to_string()]), 2);
    // The same kernel asked at 20 reps, or under TCG: only the run made so.
    let at = |reps: u32, accel: Accel| {
        let asked = RunsAsked {
            reps,
            accel,
            ..asked
        };
        of_kernel(all.clone(), spec, &asked)
            .into_iter()
            .map(|r| r.run_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(at(20, Accel::Kvm), ["other-reps"]);
    assert_eq!(at(10, Accel::Tcg), ["other-accel"]);
    // Every variant asked (none named): a run of two or three of them does not serve.
    let every = RunsAsked {
        variants: &[],
        ..asked
    };
    assert!(of_kernel(all, spec, &every).is_empty());
}

/// The base's runs of a real kab (Debian 7.3, every lifecycle variant, 10 reps, TCG), as
/// stored: a request made the same way reuses all four, one for a variant restricted to it;
/// another `--set` or more reps reuses none. Guards the match against a parameter whose
/// default the host and the guest would spell differently (then nothing would be reused).
#[test]
fn a_real_kabs_stored_runs_are_reused_by_the_same_request() {
    let runs: Vec<RunRecord> = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kab-7.3-001/runs.jsonl"
    ))
    .lines()
    .map(|l| serde_json::from_str(l).expect("a stored run"))
    .collect();
    let scenarios = typed(&["lifecycle"], &[]);
    let asked = RunsAsked {
        scenarios: &scenarios,
        variants: &[],
        reps: 10,
        accel: Accel::Tcg,
    };
    let count = |asked: &RunsAsked<'_>| of_kernel(runs.clone(), "debian:7.3", asked).len();
    assert_eq!(count(&asked), 4);
    let one = ["irqchip-first".to_string()];
    let kept = of_kernel(
        runs.clone(),
        "debian:7.3",
        &RunsAsked {
            variants: &one,
            ..asked
        },
    );
    assert_eq!(kept.len(), 4);
    assert!(kept.iter().all(|r| r.variants.len() == 1));
    let devices = typed(&["lifecycle"], &["devices=16".to_string()]);
    assert_eq!(
        count(&RunsAsked {
            scenarios: &devices,
            ..asked
        }),
        0
    );
    assert_eq!(count(&RunsAsked { reps: 20, ..asked }), 0);
}

struct Fixed(PatchedSpec, Vec<SeriesStep>);
impl SeriesSource for Fixed {
    fn base(&self) -> &PatchedSpec {
        &self.0
    }
    fn steps(&self) -> Result<Vec<SeriesStep>, Error> {
        Ok(self.1.clone())
    }
}

/// Shards' runs stored in their own files, merged as `hvlab merge` merges them, and the
/// table made from the merged store: commit 2's regression found across shards.
#[test]
fn shards_merged_give_the_whole_table_from_the_store() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let scenarios = typed(&[SCENARIO], &[]);
    let st = steps(3);
    let mut rng = Rng(11);
    let same = |_: usize, _: usize| 1.0;
    let slower = |v: usize, m: usize| if v == 1 && m == 2 { 1.25 } else { 1.0 };
    let mut files = Vec::new();
    for i in 0..2u32 {
        let shard = Shard::new(i, 2).expect("a shard");
        let path = dir.path().join(format!("shard{i}.db"));
        let mut store = Store::open(&path).expect("a store");
        for (c, parent) in shard_units(st.len(), &shard) {
            let parent_spec = parent.map_or("debian:7.3", |p| st[p].spec.given.as_str());
            // Commit 2 (index 1) made the change; every commit after it keeps it.
            let shift: &dyn Fn(usize, usize) -> f64 = if c >= 1 { &slower } else { &same };
            let parent_shift: &dyn Fn(usize, usize) -> f64 = if parent.is_some_and(|p| p >= 1) {
                &slower
            } else {
                &same
            };
            let mut runs = kernel(parent_spec, 2, 2, 3, 10, 0.01, &mut rng, parent_shift).runs;
            runs.extend(kernel(&st[c].spec.given, 2, 2, 3, 10, 0.01, &mut rng, shift).runs);
            for r in &mut runs {
                r.run_id = format!("{}-shard{i}", r.run_id);
            }
            crate::store::transfer::ingest_all(&mut store, &runs).expect("stored");
        }
        files.push(path);
    }
    let mut merged = Store::open(&dir.path().join("merged.db")).expect("a store");
    for f in &files {
        crate::store::transfer::merge_file(&mut merged, f).expect("merged");
    }
    // The runs hold two of memory's variants: those are what was asked.
    let variants = ["lazy".to_string(), "populated".to_string()];
    let mut asked = settings(&scenarios);
    asked.asked.variants = &variants;
    let t = table_from_store(
        &merged,
        &Fixed(PatchedSpec::named("debian:7.3"), st),
        &asked,
    )
    .expect("a table");
    assert_eq!(t.commits.len(), 3);
    let classes: Vec<Vec<VariantClass>> = t
        .commits
        .iter()
        .map(|c| c.variants.iter().map(|v| v.vs_parent.class).collect())
        .collect();
    assert_eq!(
        classes,
        vec![
            vec![VariantClass::NoChange, VariantClass::NoChange],
            vec![VariantClass::NoChange, VariantClass::Regressed],
            vec![VariantClass::NoChange, VariantClass::NoChange],
        ]
    );
    // Commit 3 against the base keeps commit 2's regression.
    assert_eq!(
        t.commits[2].variants[1].vs_base.class,
        VariantClass::Regressed
    );
}

#[test]
fn an_mbox_series_becomes_one_step_per_message() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let msg = |n: usize, file: &str| {
        format!(
            "From dev@example.org Mon Mar  9 12:30:5{n} 2026\nFrom: Dev <dev@example.org>\nSubject: [PATCH {n}/2] kvm: part {n}\n\nWhy.\n---\ndiff --git a/{file} b/{file}\n--- a/{file}\n+++ b/{file}\n@@ -1 +1 @@\n-old\n+new\n\n"
        )
    };
    let mbox = dir.path().join("v3.mbox");
    std::fs::write(
        &mbox,
        format!(
            "{}{}",
            msg(1, "Documentation/x.rst"),
            msg(2, "virt/kvm/kvm_main.c")
        ),
    )
    .expect("written");
    let spec = PatchedSpec::parse(&format!("debian:7.3+{}", mbox.display())).expect("a spec");
    let s = MboxSeries::in_dir(&spec, &dir.path().join("steps")).expect("a series");
    assert_eq!(s.base().given, "debian:7.3");
    let st = s.steps().expect("steps");
    assert_eq!(st.len(), 2);
    assert_eq!(st[0].label, "[PATCH 1/2]");
    assert_eq!(st[1].subject, "kvm: part 2");
    // Each step's spec is the base with every message up to it, each its own file, and its
    // text reads back as the same kernel.
    let parsed = PatchedSpec::parse(&st[1].spec.given).expect("a spec resolve accepts");
    assert_eq!(parsed, st[1].spec);
    assert_eq!(parsed.base, "debian:7.3");
    assert_eq!(parsed.patches.len(), 2);
    assert!(parsed.touched().contains("virt/kvm/kvm_main.c"));
    assert_eq!(
        PatchedSpec::parse(&st[0].spec.given)
            .expect("a spec")
            .patches
            .len(),
        1
    );
    // The same series again: the same files, the same specs (its builds and runs found).
    assert_eq!(s.steps().expect("steps"), st);
}
