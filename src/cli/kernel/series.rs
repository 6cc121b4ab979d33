//! `hvlab kab BASE SERIES --per-patch` (a verdict per commit of a series, or one shard of
//! them, or the table of merged shards from the store) and `hvlab bisect GOOD BAD`.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::{
    BootArgs, GuestConfigArgs, KabArgs, Reporter, SandboxArgs, check_variants_exist, command_line,
    open_store, write_cover_letter,
};
use crate::error::{Error, InputError};
use crate::export::series::{markdown, numbers_words, phases_line, render};
use crate::lab::bisect::{self, Bisection, Call, KabJudge, Outcome, Range, Seek};
use crate::lab::kab::KabRequest;
use crate::lab::series::{
    self, JudgeSettings, MboxSeries, PerPatchRequest, SeriesNote, SeriesSource,
};

/// Why a commit is never judged from one boot a side: a boot carries an offset of its own in
/// the jiffies an ioctl waits, as large as a commit's, which one boot cannot tell apart.
const ONE_BOOT: &str = "one boot per kernel cannot tell a boot's own offset from a commit's (measured: the same KVM modules' memslot update waited 0.77 jiffies in one boot and 1.51 in the next, and a documentation patch came out REGRESSED); give --boots 2 or more";

/// Per-patch and bisect judge commits from two boots per kernel at least ([`ONE_BOOT`]).
fn at_least_two_boots(boots: u32) -> Result<(), Error> {
    if boots >= 2 {
        return Ok(());
    }
    Err(InputError::BadValue {
        key: "--boots".into(),
        value: boots.to_string(),
        why: ONE_BOOT.into(),
    }
    .into())
}

/// `hvlab kab BASE SERIES --per-patch`: the series' table (a shard's with `--shard`), or with
/// `--from-store` the table of what the store holds (the shards' files merged).
pub(super) fn per_patch(
    db: Option<&Path>,
    args: &KabArgs,
    req: KabRequest,
) -> Result<ExitCode, Error> {
    at_least_two_boots(req.boots)?;
    let source = series::source_of(&args.patched)?;
    if !series::is_base_of(&args.base, &args.patched, source.base()) {
        return Err(InputError::BadValue {
            key: "BASE".into(),
            value: args.base.clone(),
            why: format!(
                "the series {} is on {}; give that as BASE",
                args.patched,
                source.base()
            ),
        }
        .into());
    }
    let (shard, _) = crate::lab::shard::resolve(
        args.shard.shard.as_deref(),
        args.shard.shard_count,
        &crate::lab::shard::process_env(),
    )?;
    let mut store = open_store(db)?;
    let (table, notes, json, phases) = if args.from_store {
        let accel = crate::kernel::vm::choose_accel(req.vm.accel)?.accel;
        let table = series::table_from_store(
            &store,
            source.as_ref(),
            &JudgeSettings {
                asked: series::RunsAsked::of(&req, accel),
                threshold: req.threshold,
                metric: args.metric.as_deref(),
            },
        )?;
        let json = serde_json::to_value(&table).map_err(|e| Error::Output(e.into()))?;
        let notes: Vec<SeriesNote> = source.notes().into_iter().map(SeriesNote::Build).collect();
        (table, notes, json, None)
    } else {
        let reporter = Reporter::new(args.json);
        let outcome = series::run_per_patch(
            &PerPatchRequest {
                kab: req,
                metric: args.metric.clone(),
                shard,
            },
            source.as_ref(),
            &mut store,
            &reporter,
        )?;
        drop(reporter);
        let json = serde_json::to_value(&outcome).map_err(|e| Error::Output(e.into()))?;
        let phases = outcome.phases();
        (outcome.table, outcome.notes, json, Some(phases))
    };
    if args.json {
        super::super::print_json(&json)?;
    } else {
        let mut text = render(&table, &notes);
        if let Some(p) = &phases {
            text = format!("{text}\n{}", phases_line(p));
        }
        super::super::print_text(&text)?;
    }
    if let Some(path) = &args.markdown {
        write_cover_letter(path, &markdown(&table, &command_line()), &store)?;
    }
    Ok(ExitCode::from(u8::from(
        args.fail_on_regression && table.regression(),
    )))
}

/// `hvlab bisect`.
#[derive(Debug, Args)]
pub struct BisectArgs {
    /// The last known good kernel: the series' base (debian:7.3), or a commit (git:PATH@GOOD)
    good: String,
    /// The first known bad: the series whose commits are bisected (debian:7.3+v3.mbox, each
    /// message a commit), or a later commit of GOOD's repository (git:PATH@BAD: the
    /// first-parent commits between them)
    bad: String,
    /// The variant whose verdict is bisected
    #[arg(long, value_name = "V")]
    variant: String,
    /// The metric shown with each verdict [default: the one that moved, else the first judged]
    #[arg(long, value_name = "M")]
    metric: Option<String>,
    /// Seek the first commit that fixed it (FIXED or IMPROVED against GOOD), not the first
    /// that changed it either way
    #[arg(long, conflicts_with = "regression")]
    fix: bool,
    /// Seek the first commit that regressed it (REGRESSED or SLOWER against GOOD), not the
    /// first that changed it either way
    #[arg(long)]
    regression: bool,
    /// Scenario to run (repeatable) [default: lifecycle]
    #[arg(long = "scenario", value_name = "S")]
    scenarios: Vec<String>,
    /// Scenario parameter key=value (repeatable)
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Boots per kernel at the first try of a step, in ABBA order (at least 2: one boot
    /// cannot tell a boot's own offset from a commit's)
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=50))]
    boots: u32,
    /// Repetitions per variant in each boot at the first try
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    reps: u32,
    /// How many times a step that is NOT DECIDED gets more: each adds an ABBA pair of boots,
    /// past --boots of them at doubled repetitions
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(0..=8))]
    max_effort: u32,
    /// Smallest change that counts for judged jiffies and times
    #[arg(long, default_value = "5%")]
    threshold: String,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
    /// Under a cluster (a Slurm job, a Kubernetes pod): while a step boots, build the next
    /// step's two possible commits ahead (refused on a machine of its own, where the builds
    /// would take the CPU the timed boots measure with)
    #[arg(long)]
    speculate: bool,
    #[command(flatten)]
    config: GuestConfigArgs,
    #[command(flatten)]
    sandbox: SandboxArgs,
    #[command(flatten)]
    boot: BootArgs,
}

/// GOOD, BAD and the commits between them: BAD an mbox series on GOOD, or GOOD and BAD two
/// commits of one repository (`git:PATH@GOOD git:PATH@BAD`: the first-parent commits
/// between them).
fn range_of(good: &str, bad: &str) -> Result<Range, Error> {
    let refuse = |key: &str, value: &str, why: String| -> Error {
        InputError::BadValue {
            key: key.into(),
            value: value.into(),
            why,
        }
        .into()
    };
    if good == bad {
        return Err(refuse(
            "GOOD BAD",
            good,
            "GOOD and BAD are the same kernel; give BAD as the series on GOOD (GOOD+SERIES.mbox) or a later commit (git:PATH@BAD)".into(),
        ));
    }
    let git_rev = |spec: &str| {
        spec.strip_prefix("git:")
            .and_then(|rest| rest.rsplit_once('@'))
            .map(|(path, rev)| (path.to_string(), rev.to_string()))
    };
    if let (Some((good_path, _)), Some((bad_path, bad_rev))) = (git_rev(good), git_rev(bad)) {
        if good_path != bad_path {
            return Err(refuse(
                "BAD",
                bad,
                format!(
                    "GOOD is in {good_path} and BAD in {bad_path}; bisect within one repository"
                ),
            ));
        }
        let source = series::GitRangeSeries::parse(&format!("{good}..{bad_rev}"))?;
        return Ok(Range {
            good: source.base().to_string(),
            steps: source.steps()?,
        });
    }
    let source = MboxSeries::parse(bad)?;
    if source.base() != good {
        return Err(refuse(
            "GOOD",
            good,
            format!(
                "BAD ({bad}) is a series on {}, not on GOOD; give that as GOOD",
                source.base()
            ),
        ));
    }
    Ok(Range {
        good: good.to_string(),
        steps: source.steps()?,
    })
}

/// `hvlab bisect GOOD BAD --variant V`: checks the arguments (exit 2), then bisects with a
/// kab per step; prints the culprit and its verdict against its parent with the numbers, the
/// skipped commits and the command that reproduces it. Exit 0 with a culprit named, 1 when
/// none can be.
pub fn bisect(db: Option<&Path>, args: &BisectArgs) -> Result<ExitCode, Error> {
    let scenarios = if args.scenarios.is_empty() {
        vec!["lifecycle".to_string()]
    } else {
        args.scenarios.clone()
    };
    check_variants_exist("--variant", std::slice::from_ref(&args.variant), &scenarios)?;
    at_least_two_boots(args.boots)?;
    let config = args.config.checked()?;
    if args.speculate && bisect::cluster_of(|k| std::env::var(k).ok()).is_none() {
        return Err(InputError::BadValue {
            key: "--speculate".into(),
            value: "on this machine".into(),
            why: "no cluster is configured (neither SLURM_JOB_ID nor KUBERNETES_SERVICE_HOST is set), and on this machine's own cores a speculative build would starve the timed boots and skew their verdicts; run the bisection as a Slurm job or in a Kubernetes pod, or drop --speculate".into(),
        }
        .into());
    }
    let range = range_of(&args.good, &args.bad)?;
    let req = KabRequest {
        base: args.good.clone(),
        patched: args.bad.clone(),
        scenarios,
        variants: vec![args.variant.clone()],
        sets: args.sets.clone(),
        boots: args.boots,
        reps: args.reps,
        threshold: crate::lab::compare::parse_threshold(&args.threshold)?,
        vm: args.boot.config()?,
        model_strategy: None,
        calibrate: false,
        sandbox: args.sandbox.policy(),
        config,
    };
    let seek = if args.fix {
        Seek::Fix
    } else if args.regression {
        Seek::Regression
    } else {
        Seek::Change
    };
    let mut store = open_store(db)?;
    let reporter = Reporter::new(args.json);
    let last = range.steps.len();
    let mut judge = KabJudge::new(
        range.clone(),
        req,
        args.variant.clone(),
        args.metric.clone(),
        &mut store,
        &reporter,
    )?;
    if args.speculate {
        judge = judge.speculating();
    }
    let result = bisect::bisect(&mut judge, last, seek, args.max_effort);
    let phases = judge.phases();
    if let Some(e) = judge.failure() {
        return Err(e);
    }
    drop(reporter);
    let bisection = result.map_err(|e| InputError::BadValue {
        key: "GOOD BAD".into(),
        value: format!("{} {}", args.good, args.bad),
        why: e.to_string(),
    })?;
    if args.json {
        super::super::print_json(&serde_json::json!({
            "range": range, "bisection": bisection, "command": command_line(), "phases": phases,
        }))?;
    } else {
        let text = bisect_text(&range, &bisection, &command_line());
        super::super::print_text(&format!("{text}\n{}", phases_line(&phases)))?;
    }
    Ok(ExitCode::from(u8::from(!matches!(
        bisection.outcome,
        Outcome::Found { .. }
    ))))
}

/// A call in words: the class with its metric's numbers, or the build's error.
fn call_words(call: &Call) -> String {
    match call {
        Call::Judged { class, numbers } => {
            let n = numbers
                .as_ref()
                .map_or_else(String::new, |n| format!(": {}", numbers_words(n, true)));
            format!("{}{n}", class.word())
        }
        Call::DoesNotBuild { error } => format!("DOES NOT BUILD: {error}"),
    }
}

/// The bisection's account: the culprit (or the commits it may be), its verdict against its
/// parent, the skipped commits, and the command that reproduces it.
fn bisect_text(range: &Range, b: &Bisection, command: &str) -> String {
    let name = |i: usize| {
        let subject = i
            .checked_sub(1)
            .and_then(|j| range.steps.get(j))
            .map_or(String::new(), |s| format!(" {}", s.subject));
        format!("{}{subject}", range.label(i))
    };
    let mut out = Vec::new();
    match &b.outcome {
        Outcome::Found {
            commit,
            parent,
            checks,
        } => {
            out.push(format!("first changed commit: {}", name(*commit)));
            if let Some(c) = checks.last() {
                out.push(format!(
                    "  against its parent ({}): {}",
                    range.label(*parent),
                    call_words(&c.call)
                ));
            }
            out.push(format!("  kernel: {}", range.spec(*commit)));
        }
        Outcome::Uncertain { candidates, why } => {
            out.push(format!(
                "no single commit named: it is one of {}",
                candidates
                    .iter()
                    .map(|&c| range.label(c))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            out.push(format!("  {why}"));
        }
    }
    out.push(format!(
        "BAD against GOOD: {} (the change sought: {})",
        call_words(&b.ends.call),
        match b.seek {
            Seek::Change => "a change either way",
            Seek::Regression => "a regression",
            Seek::Fix => "a fix",
        }
    ));
    out.push(format!("{} step(s) judged", b.steps.len()));
    if b.skipped.is_empty() {
        out.push("skipped: none".into());
    } else {
        out.push("skipped:".into());
        out.extend(
            b.skipped
                .iter()
                .map(|s| format!("  {}: {}", name(s.commit), s.why)),
        );
    }
    out.push(format!("reproduce: {command}"));
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::class::VariantClass;
    use crate::lab::bisect::{Probe, Skipped};
    use crate::lab::series::{Numbers, SeriesStep};

    #[test]
    fn good_and_bad_that_are_one_kernel_or_an_unknown_variant_exit_2_naming_it() {
        let e = range_of("debian:7.3", "debian:7.3").expect_err("the same kernel");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("GOOD BAD"), "{e}");
        let e = check_variants_exist("--variant", &["no-such".into()], &["lifecycle".into()])
            .expect_err("an unknown variant");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--variant"), "{e}");
        assert!(e.to_string().contains("no-such"), "{e}");
    }

    /// A git range as SERIES (its base `git:PATH@A` accepted as BASE) and as bisect's ends:
    /// the first-parent commits after GOOD up to BAD, labelled by short hash, with subjects.
    #[test]
    fn a_git_range_is_a_series_and_two_commits_of_a_repository_a_bisection_range() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let shas = crate::kernel::git::test_repo::linux_repo(
            dir.path(),
            &["base", "KVM: one", "KVM: two", "KVM: three"],
        );
        let at = |i: usize| format!("git:{}@{}", dir.path().display(), shas[i]);
        let range = format!("{}..{}", at(0), shas[3]);
        let source = series::source_of(&range).expect("a git range");
        let steps = source.steps().expect("its steps");
        assert_eq!(
            steps.iter().map(|s| s.subject.as_str()).collect::<Vec<_>>(),
            ["KVM: one", "KVM: two", "KVM: three"]
        );
        assert!(shas[1].starts_with(&steps[0].label), "{}", steps[0].label);
        assert_eq!(steps[2].spec, at(3));
        assert!(series::is_base_of(&at(0), &range, source.base()));
        assert!(!series::is_base_of("debian:7.3", &range, source.base()));
        let r = range_of(&at(0), &at(3)).expect("a bisection range");
        assert_eq!(r.good, at(0));
        assert_eq!(r.steps, steps);
        let other = tempfile::tempdir().expect("a temporary directory");
        let e = range_of(&at(0), &format!("git:{}@HEAD", other.path().display()))
            .expect_err("two repositories");
        assert_eq!(e.exit_code(), 2);
    }

    #[test]
    fn a_bisection_names_the_commit_its_subject_verdict_numbers_skips_and_command() {
        let range = Range {
            good: "debian:7.3".into(),
            steps: (1..=3)
                .map(|i| SeriesStep {
                    label: format!("[PATCH {i}/3]"),
                    subject: format!("KVM: change {i}"),
                    spec: format!("debian:7.3+{i}.patch"),
                })
                .collect(),
        };
        let regressed = Call::Judged {
            class: VariantClass::Regressed,
            numbers: Some(Numbers {
                metric: "ioctl.kvm_irqfd_ms".into(),
                unit: "ms".into(),
                parent: 12.0,
                commit: 15.5,
                change_pct: 29.2,
                stddev_pct: [2.5, 3.0],
            }),
        };
        let probe = |commit, against| Probe {
            commit,
            against,
            effort: 0,
            call: regressed.clone(),
        };
        let b = Bisection {
            seek: Seek::Regression,
            ends: probe(3, 0),
            steps: vec![probe(2, 0)],
            skipped: vec![Skipped {
                commit: 1,
                why: "does not build: kvm_main.c:3: error".into(),
            }],
            outcome: Outcome::Found {
                commit: 2,
                parent: 1,
                checks: vec![probe(2, 1), probe(2, 1)],
            },
        };
        let text = bisect_text(
            &range,
            &b,
            "hvlab bisect debian:7.3 debian:7.3+s.mbox --variant v",
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "first changed commit: [PATCH 2/3] KVM: change 2");
        assert_eq!(
            lines[1],
            "  against its parent ([PATCH 1/3]): REGRESSED: ioctl.kvm_irqfd_ms 12.0 ±2.50% → 15.5 ±3% ms (+29.2%)"
        );
        assert!(
            text.contains(
                "skipped:\n  [PATCH 1/3] KVM: change 1: does not build: kvm_main.c:3: error"
            ),
            "{text}"
        );
        assert!(text.ends_with("reproduce: hvlab bisect debian:7.3 debian:7.3+s.mbox --variant v"));
    }
}
