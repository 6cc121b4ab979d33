//! `hvlab kab BASE SERIES --per-patch` (a verdict per commit of a series, or one shard of
//! them, or the table of merged shards from the store) and `hvlab bisect GOOD BAD`.

use std::path::Path;
use std::process::ExitCode;

use clap::Args;

use super::{KabArgs, Reporter, SoughtArgs, command_line, open_store, write_cover_letter};
use crate::cli::Error;
use crate::error::InputError;
use crate::export::bisect::{bisect_text, refusal_words};
use crate::export::series::{markdown, phases_line, render};
use crate::kernel::build::PatchedSpec;
use crate::kernel::git::Revs;
use crate::kernel::source::KernelSource;
use crate::lab::bisect::{self, KabJudge, Outcome, Range};
use crate::lab::kab::KabRequest;
use crate::lab::series::{
    self, JudgeSettings, MboxSeries, PerPatchRequest, SeriesNote, SeriesSource,
};

/// Why a commit is never judged from one boot a side on the wall clock: a boot carries an
/// offset of its own in the jiffies an ioctl waits, as large as a commit's, which one boot
/// cannot tell apart. On the instruction clock a boot repeats the last one's ticks.
const ONE_BOOT: &str = "on the wall clock one boot per kernel cannot tell a boot's own offset from a commit's (measured: the same KVM modules' memslot update waited 0.77 jiffies in one boot and 1.51 in the next, and a documentation patch came out REGRESSED); give --boots 2 or more, or --clock icount under TCG";

/// Per-patch and bisect on the wall clock judge commits from two boots per kernel at least
/// ([`ONE_BOOT`]).
pub(super) fn at_least_two_boots(boots: u32) -> Result<(), Error> {
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
    let source = series::source_of(&req.patched)?;
    if !series::is_base_of(&req.base, &req.patched, source.base()) {
        return Err(InputError::BadValue {
            key: "BASE".into(),
            value: req.base.given.clone(),
            why: format!(
                "the series {} is on {}; give that as BASE",
                req.patched.given,
                source.base().given
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
        let reporter = Reporter::new(args.judge.json);
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
    if args.judge.json {
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
    #[command(flatten)]
    sought: SoughtArgs,
    /// Under a cluster (a Slurm job, a Kubernetes pod): while a step boots, build the next
    /// step's two possible commits ahead (refused on a machine of its own, where the builds
    /// would take the CPU the timed boots measure with)
    #[arg(long)]
    speculate: bool,
}

/// GOOD, BAD and the commits between them: BAD an mbox series on GOOD, or GOOD and BAD two
/// commits of one repository (`git:PATH@GOOD git:PATH@BAD`: the first-parent commits
/// between them).
fn range_of(good: &PatchedSpec, bad: &PatchedSpec) -> Result<Range, Error> {
    let refuse = |key: &str, value: &str, why: String| -> Error {
        InputError::BadValue {
            key: key.into(),
            value: value.into(),
            why,
        }
        .into()
    };
    if good.given == bad.given {
        return Err(refuse(
            "GOOD BAD",
            &good.given,
            "GOOD and BAD are the same kernel; give BAD as the series on GOOD (GOOD+SERIES.mbox) or a later commit (git:PATH@BAD)".into(),
        ));
    }
    let commits = match (&good.source, &bad.source) {
        (
            KernelSource::Git {
                repo: good_repo,
                revs: Revs::One(from),
            },
            KernelSource::Git {
                repo: bad_repo,
                revs: Revs::One(to),
            },
        ) if good.patches.is_empty() && bad.patches.is_empty() => {
            Some((good_repo, bad_repo, from, to))
        }
        (
            KernelSource::Git { .. }
            | KernelSource::Debian { .. }
            | KernelSource::Tree { .. }
            | KernelSource::BzImage { .. },
            KernelSource::Git { .. }
            | KernelSource::Debian { .. }
            | KernelSource::Tree { .. }
            | KernelSource::BzImage { .. },
        ) => None,
    };
    if let Some((good_repo, bad_repo, from, to)) = commits {
        if good_repo != bad_repo {
            return Err(refuse(
                "BAD",
                &bad.given,
                format!(
                    "GOOD is in {} and BAD in {}; bisect within one repository",
                    good_repo.display(),
                    bad_repo.display()
                ),
            ));
        }
        let revs = Revs::Range {
            base: from.clone(),
            head: to.clone(),
        };
        let source =
            series::GitRangeSeries::of(&format!("{}..{to}", good.given), good_repo, &revs)?;
        return Ok(Range {
            good: source.base().clone(),
            steps: source.steps()?,
        });
    }
    let source = MboxSeries::of(bad)?;
    if source.base().given != good.given {
        return Err(refuse(
            "GOOD",
            &good.given,
            format!(
                "BAD ({}) is a series on {}, not on GOOD; give that as GOOD",
                bad.given,
                source.base().given
            ),
        ));
    }
    Ok(Range {
        good: good.clone(),
        steps: source.steps()?,
    })
}

/// `hvlab bisect GOOD BAD --variant V`: checks the arguments (exit 2), then bisects with a
/// kab per step; prints the culprit and its verdict against its parent with the numbers, the
/// skipped commits and the command that reproduces it. Exit 0 with a culprit named, 1 when
/// none can be.
pub fn bisect(db: Option<&Path>, args: &BisectArgs) -> Result<ExitCode, Error> {
    let sought = &args.sought;
    sought.checked_scenarios()?;
    sought.judge.config.checked()?;
    if args.speculate && bisect::cluster_of(|k| std::env::var(k).ok()).is_none() {
        return Err(InputError::BadValue {
            key: "--speculate".into(),
            value: "on this machine".into(),
            why: "no cluster is configured (neither SLURM_JOB_ID nor KUBERNETES_SERVICE_HOST is set), and on this machine's own cores a speculative build would starve the timed boots and skew their verdicts; run the bisection as a Slurm job or in a Kubernetes pod, or drop --speculate".into(),
        }
        .into());
    }
    let req = sought
        .judge
        .request(&args.good, &args.bad, vec![sought.variant.clone()])?;
    let range = range_of(&req.base, &req.patched)?;
    let seek = sought.seek();
    let mut store = open_store(db)?;
    let reporter = Reporter::new(sought.judge.json);
    let last = range.steps.len();
    let mut judge = KabJudge::new(
        range.clone(),
        req,
        sought.variant.clone(),
        sought.metric.clone(),
        &mut store,
        &reporter,
    )?;
    if args.speculate {
        judge = judge.speculating();
    }
    let result = bisect::bisect(&mut judge, last, seek, sought.max_effort);
    let phases = judge.phases();
    if let Some(e) = judge.failure() {
        return Err(e.into());
    }
    drop(reporter);
    let bisection = result.map_err(|e| InputError::BadValue {
        key: "GOOD BAD".into(),
        value: format!("{} {}", args.good, args.bad),
        why: refusal_words(&e),
    })?;
    if sought.judge.json {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_and_bad_that_are_one_kernel_or_an_unknown_variant_exit_2_naming_it() {
        let debian = PatchedSpec::parse("debian:7.3").expect("a spec");
        let e = range_of(&debian, &debian).expect_err("the same kernel");
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("GOOD BAD"), "{e}");
        let e = super::super::check_variants_exist(
            "--variant",
            &["no-such".into()],
            &["lifecycle".into()],
        )
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
        let spec = |text: &str| PatchedSpec::parse(text).expect("a spec");
        let range = spec(&format!("{}..{}", at(0), shas[3]));
        let source = series::source_of(&range).expect("a git range");
        let steps = source.steps().expect("its steps");
        assert_eq!(
            steps.iter().map(|s| s.subject.as_str()).collect::<Vec<_>>(),
            ["KVM: one", "KVM: two", "KVM: three"]
        );
        assert!(shas[1].starts_with(&steps[0].label), "{}", steps[0].label);
        assert_eq!(steps[2].spec.given, at(3));
        assert!(series::is_base_of(&spec(&at(0)), &range, source.base()));
        assert!(!series::is_base_of(
            &spec("debian:7.3"),
            &range,
            source.base()
        ));
        let r = range_of(&spec(&at(0)), &spec(&at(3))).expect("a bisection range");
        assert_eq!(r.good.given, at(0));
        assert_eq!(r.steps, steps);
        let other = tempfile::tempdir().expect("a temporary directory");
        let e = range_of(
            &spec(&at(0)),
            &spec(&format!("git:{}@HEAD", other.path().display())),
        )
        .expect_err("two repositories");
        assert_eq!(e.exit_code(), 2);
    }
}
