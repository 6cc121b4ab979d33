//! The steps of a git range (`git:PATH@BASE..HEAD`): its first-parent commits, each a kernel
//! of its own, oldest first. Per-patch verdicts and bisection judge these; the messages of an
//! mbox are steps the series layer writes itself ([`crate::lab::series::MboxSeries`]).

use std::path::Path;

use serde::Serialize;

use super::note::BuildNote;
use super::{BuildError, PatchedSpec};
use crate::kernel::git::{Commit, GitRange, Revs};
use crate::kernel::source::KernelSource;

/// A series: its base, and its steps in order.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    /// The kernel before the first step (`git:PATH@BASE-SHA`).
    pub base: PatchedSpec,
    /// The steps, oldest first.
    pub steps: Vec<SeriesStep>,
    /// What the reader must know (a range that follows first parents past a merge).
    pub notes: Vec<BuildNote>,
}

/// One step of a series: a commit.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesStep {
    /// The commit's subject.
    pub subject: String,
    /// Its kernel (`git:PATH@SHA`).
    pub spec: PatchedSpec,
    /// The commit.
    pub commit: Commit,
}

/// Each first-parent commit of the range `revs` in `repo` (the spec `given`), against the
/// range's base; the repository is only read.
pub fn range_steps(given: &str, repo: &Path, revs: &Revs) -> Result<Series, BuildError> {
    let range = GitRange::resolve(given, repo, revs)?;
    let commit_spec = |c: &Commit| {
        PatchedSpec::unpatched(
            c.spec(),
            KernelSource::Git {
                repo: c.repo.clone(),
                revs: Revs::One(c.sha.clone()),
            },
        )
    };
    Ok(Series {
        base: commit_spec(&range.base),
        steps: range
            .commits()
            .iter()
            .map(|c| SeriesStep {
                subject: c.subject.clone(),
                spec: commit_spec(c),
                commit: c.clone(),
            })
            .collect(),
        notes: Some(range.merges())
            .filter(|m| !m.is_empty())
            .map(|merges| BuildNote::FirstParents { merges })
            .into_iter()
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::git::test_repo::linux_repo;

    #[test]
    fn a_git_range_gives_one_step_per_commit_against_its_base() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shas = linux_repo(dir.path(), &["base", "kvm: one", "kvm: two"]);
        let given = format!("git:{}@{}..HEAD", dir.path().display(), &shas[0][..12]);
        let revs = Revs::Range {
            base: shas[0][..12].to_string(),
            head: "HEAD".into(),
        };
        let series = range_steps(&given, dir.path(), &revs).expect("series");
        let top = std::fs::canonicalize(dir.path()).expect("canonical");
        assert_eq!(
            series.base.given,
            format!("git:{}@{}", top.display(), shas[0])
        );
        let steps: Vec<(&str, &str)> = series
            .steps
            .iter()
            .map(|s| (s.subject.as_str(), s.spec.given.as_str()))
            .collect();
        let want: Vec<String> = shas[1..]
            .iter()
            .map(|s| format!("git:{}@{s}", top.display()))
            .collect();
        assert_eq!(
            steps,
            [
                ("kvm: one", want[0].as_str()),
                ("kvm: two", want[1].as_str())
            ]
        );
        assert!(series.notes.is_empty());
    }
}
