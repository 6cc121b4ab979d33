//! The steps of a series, each a kernel spec with every step up to it: the messages of the
//! patch files after a spec (`debian:7.3+v3.mbox`), or the first-parent commits of a git range
//! (`git:PATH@BASE..HEAD`). Per-patch verdicts and bisection judge these.

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::error::io;
use super::note::BuildNote;
use super::{BuildError, PatchedSpec};
use crate::kernel::cache_dir;
use crate::kernel::git::{self, Commit, GitRange};
use crate::kernel::patch::PatchFile;

/// A series: its base, and its steps in order.
#[derive(Debug, Clone, Serialize)]
pub struct Series {
    /// The spec of the kernel before the first step (`debian:7.3`, `git:PATH@BASE-SHA`).
    pub base: String,
    /// The steps, oldest first.
    pub steps: Vec<SeriesStep>,
    /// What the reader must know (a range that follows first parents past a merge).
    pub notes: Vec<BuildNote>,
}

/// One step of a series.
#[derive(Debug, Clone, Serialize)]
pub struct SeriesStep {
    /// What it adds: the message's subject (`[PATCH 2/4] kvm: ...`), the patch file's name
    /// when it has none, or the commit's subject.
    pub subject: String,
    /// The kernel with every step up to this one (`debian:7.3+DIR/0001.patch+DIR/0002.patch`,
    /// `git:PATH@SHA`).
    pub spec: String,
    /// The commit, for a step of a git range.
    pub commit: Option<Commit>,
}

/// The steps of the series `spec` names: each first-parent commit of a git range, else each
/// message of its patch files in order (a cover letter left out), a file holding several
/// messages split into one file per message in hvlab's cache (`series/SHA/0001.patch`).
pub fn series_prefixes(spec: &str) -> Result<Series, BuildError> {
    series_prefixes_in(spec, &cache_dir())
}

fn series_prefixes_in(spec: &str, cache: &Path) -> Result<Series, BuildError> {
    if git::names_range(spec) {
        let range = GitRange::parse(spec)?;
        return Ok(Series {
            base: range.base.spec(),
            steps: range
                .commits()
                .iter()
                .map(|c| SeriesStep {
                    subject: c.subject.clone(),
                    spec: c.spec(),
                    commit: Some(c.clone()),
                })
                .collect(),
            notes: Some(range.merges())
                .filter(|m| !m.is_empty())
                .map(|merges| BuildNote::FirstParents { merges })
                .into_iter()
                .collect(),
        });
    }
    let parsed = PatchedSpec::parse(spec)?;
    if parsed.patches.is_empty() {
        return Err(BuildError::NoSeries {
            spec: spec.to_string(),
        });
    }
    let mut units: Vec<(String, PathBuf)> = Vec::new();
    for file in &parsed.patches {
        if let [one] = file.patches.as_slice() {
            let subject = one.subject.clone().unwrap_or_else(|| file.name());
            units.push((subject, file.path.clone()));
            continue;
        }
        for (n, (subject, path)) in split_messages(file, cache)?.into_iter().enumerate() {
            units.push((
                subject.unwrap_or_else(|| file.patches[n].label(file, n)),
                path,
            ));
        }
    }
    let mut steps = Vec::new();
    let mut spec_so_far = parsed.base.clone();
    for (subject, path) in units {
        spec_so_far = format!("{spec_so_far}+{}", path.display());
        steps.push(SeriesStep {
            subject,
            spec: spec_so_far.clone(),
            commit: None,
        });
    }
    Ok(Series {
        base: parsed.base,
        steps,
        notes: Vec::new(),
    })
}

/// Each message of `file` as its own file under `cache/series/SHA/` (`0001.patch`, ...),
/// written once (beside, then renamed), with its subject.
fn split_messages(
    file: &PatchFile,
    cache: &Path,
) -> Result<Vec<(Option<String>, PathBuf)>, BuildError> {
    let dir = cache.join("series").join(&file.sha256[..16]);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let mut out = Vec::new();
    for (n, message) in file.patches.iter().enumerate() {
        let path = dir.join(format!("{:04}.patch", n + 1));
        let same = std::fs::read_to_string(&path).is_ok_and(|t| t == message.text);
        if !same {
            let tmp = path.with_extension("patch.tmp");
            std::fs::write(&tmp, &message.text).map_err(io(&tmp))?;
            std::fs::rename(&tmp, &path).map_err(io(&path))?;
        }
        out.push((message.subject.clone(), path));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::fault_exit_code;
    use crate::kernel::git::test_repo::linux_repo;

    const MBOX: &str = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001
From: A <a@example.org>
Subject: [PATCH 0/2] kvm: two changes

The cover letter.

From 1111111111111111111111111111111111111111 Mon Sep 17 00:00:00 2001
From: A <a@example.org>
Subject: [PATCH 1/2] kvm: first

---
 virt/kvm/kvm_main.c | 1 +
--- a/virt/kvm/kvm_main.c
+++ b/virt/kvm/kvm_main.c
@@ -1,1 +1,2 @@
 int a;
+int b;

From 2222222222222222222222222222222222222222 Mon Sep 17 00:00:00 2001
From: A <a@example.org>
Subject: [PATCH 2/2] kvm: second
 folded

--- a/arch/x86/kvm/x86.c
+++ b/arch/x86/kvm/x86.c
@@ -1,1 +1,2 @@
 int c;
+int d;
";

    #[test]
    fn an_mbox_series_gives_one_prefix_per_message_with_its_subject() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mbox = dir.path().join("v3.mbox");
        std::fs::write(&mbox, MBOX).expect("write");
        let cache = dir.path().join("cache");
        let series =
            series_prefixes_in(&format!("debian:7.3+{}", mbox.display()), &cache).expect("series");
        assert_eq!(series.base, "debian:7.3");
        let subjects: Vec<&str> = series.steps.iter().map(|s| s.subject.as_str()).collect();
        assert_eq!(
            subjects,
            ["[PATCH 1/2] kvm: first", "[PATCH 2/2] kvm: second folded"]
        );
        let sha = PatchFile::read(&mbox).expect("reads").sha256;
        let split = cache.join("series").join(&sha[..16]);
        let (one, two) = (split.join("0001.patch"), split.join("0002.patch"));
        assert_eq!(
            series.steps[0].spec,
            format!("debian:7.3+{}", one.display())
        );
        assert_eq!(
            series.steps[1].spec,
            format!("debian:7.3+{}+{}", one.display(), two.display())
        );
        // Each prefix is a spec the build reads: its files hold one message each, which
        // together change what the mbox changes.
        let last = PatchedSpec::parse(&series.steps[1].spec).expect("parses");
        assert_eq!(last.patches.len(), 2);
        assert!(last.patches.iter().all(|p| p.patches.len() == 1));
        assert_eq!(
            last.touched(),
            PatchedSpec::parse(&format!("debian:7.3+{}", mbox.display()))
                .expect("parses")
                .touched()
        );
        assert_eq!(
            last.patches[1].patches[0].subject.as_deref(),
            Some("[PATCH 2/2] kvm: second folded")
        );
        // Asked again, the same files (written once).
        let again =
            series_prefixes_in(&format!("debian:7.3+{}", mbox.display()), &cache).expect("again");
        assert_eq!(again.steps[1].spec, series.steps[1].spec);
    }

    #[test]
    fn separate_patch_files_are_steps_as_given_and_a_spec_without_one_is_no_series() {
        let dir = tempfile::tempdir().expect("tempdir");
        let patches = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/patches");
        let a = patches.join("001-sync-on-register.patch");
        let b = patches.join("doc-only.patch");
        let spec = format!("debian:7.3+{}+{}", a.display(), b.display());
        let series = series_prefixes_in(&spec, dir.path()).expect("series");
        let specs: Vec<&str> = series.steps.iter().map(|s| s.spec.as_str()).collect();
        assert_eq!(specs, [format!("debian:7.3+{}", a.display()), spec.clone()]);
        let e = series_prefixes_in("debian:7.3", dir.path()).expect_err("no series");
        assert!(matches!(e, BuildError::NoSeries { .. }), "{e}");
        assert_eq!(fault_exit_code(e.fault()), 2);
    }

    #[test]
    fn a_git_range_gives_one_step_per_commit_against_its_base() {
        let dir = tempfile::tempdir().expect("tempdir");
        let shas = linux_repo(dir.path(), &["base", "kvm: one", "kvm: two"]);
        let spec = format!("git:{}@{}..HEAD", dir.path().display(), &shas[0][..12]);
        let series = series_prefixes_in(&spec, dir.path()).expect("series");
        let top = std::fs::canonicalize(dir.path()).expect("canonical");
        assert_eq!(series.base, format!("git:{}@{}", top.display(), shas[0]));
        let steps: Vec<(&str, &str)> = series
            .steps
            .iter()
            .map(|s| (s.subject.as_str(), s.spec.as_str()))
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
