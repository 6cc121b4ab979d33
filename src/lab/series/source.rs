//! Where a series comes from: its steps, from an mbox's messages on a Debian base or from a
//! git range.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::InputError;
use crate::kernel::build::{BuildError, BuildNote, PatchedSpec};
use crate::kernel::git::Revs;
use crate::kernel::patch::PatchFile;
use crate::kernel::source::KernelSource;
use crate::kernel::vm::VmError;
use crate::lab::Error;

/// One commit of a series: how output names it and the kernel that builds it (the base with
/// every commit up to and including this one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SeriesStep {
    /// `[PATCH 2/4]`, or a commit's short hash.
    pub label: String,
    /// The subject, without the label.
    pub subject: String,
    /// Its kernel (`debian:7.3+0001.patch+0002.patch`, `git:~/linux@3f2a…`): written as its
    /// text, which names the runs its boots store.
    pub spec: PatchedSpec,
}

/// Where a series' steps come from: an mbox on a Debian base, a git range.
pub trait SeriesSource {
    /// The kernel every step is judged against (the series' base).
    fn base(&self) -> &PatchedSpec;
    /// The steps, oldest first.
    fn steps(&self) -> Result<Vec<SeriesStep>, Error>;
    /// What the reader must know about the series (a range that follows first parents past
    /// a merge).
    fn notes(&self) -> Vec<BuildNote> {
        Vec::new()
    }
}

/// `debian:7.3+v3.mbox`: each message of the mbox a step, written to a file of its own under
/// hvlab's cache (named by the mbox's hash, so the same series finds its builds and runs
/// again), the step's kernel the base with the files up to it.
#[derive(Debug, Clone)]
pub struct MboxSeries {
    base: PatchedSpec,
    spec: PatchedSpec,
    dir: PathBuf,
}

impl MboxSeries {
    /// The series `spec` (`BASE+SERIES.mbox[+MORE]`) names: every message of every patch
    /// file is a step.
    pub fn of(spec: &PatchedSpec) -> Result<MboxSeries, Error> {
        if spec.patches.is_empty() {
            return Err(not_a_series(&spec.given, "it has no patch file"));
        }
        let hashes: String = spec.patches.iter().map(|p| p.sha256.as_str()).collect();
        let id = crate::kernel::patch::sha256_hex(hashes.as_bytes());
        let dir = crate::kernel::cache_dir()
            .join("series")
            .join(&id[..16.min(id.len())]);
        Ok(MboxSeries {
            base: spec.with_patches(spec.base.clone(), Vec::new()),
            spec: spec.clone(),
            dir,
        })
    }

    /// The same, its per-message files under `dir` (tests).
    pub fn in_dir(spec: &PatchedSpec, dir: &Path) -> Result<MboxSeries, Error> {
        let mut s = MboxSeries::of(spec)?;
        s.dir = dir.to_path_buf();
        Ok(s)
    }
}

pub(super) fn not_a_series(spec: &str, why: &str) -> Error {
    InputError::BadValue {
        key: "SERIES".into(),
        value: spec.to_string(),
        why: format!(
            "{why}; --per-patch takes BASE+SERIES.mbox (debian:7.3+v3.mbox) or a git range (git:PATH@A..B)"
        ),
    }
    .into()
}

/// `[PATCH 2/4] kvm: x` → (`[PATCH 2/4]`, `kvm: x`); a subject without a bracket gets
/// `patch i/N`.
fn label_of(subject: Option<&str>, n: usize, total: usize) -> (String, String) {
    let fallback = format!("patch {n}/{total}");
    let Some(s) = subject.map(str::trim) else {
        return (fallback, String::new());
    };
    if let Some(rest) = s.strip_prefix('[')
        && let Some((tag, after)) = rest.split_once(']')
    {
        return (format!("[{tag}]"), after.trim().to_string());
    }
    (fallback, s.to_string())
}

impl SeriesSource for MboxSeries {
    fn base(&self) -> &PatchedSpec {
        &self.base
    }

    fn steps(&self) -> Result<Vec<SeriesStep>, Error> {
        let messages: Vec<&crate::kernel::patch::Patch> = self
            .spec
            .patches
            .iter()
            .flat_map(|f| f.patches.iter())
            .collect();
        if messages.is_empty() {
            return Err(not_a_series(&self.spec.given, "its files carry no diff"));
        }
        std::fs::create_dir_all(&self.dir).map_err(|e| VmError::Io(self.dir.clone(), e))?;
        let total = messages.len();
        let mut given = self.base.given.clone();
        let mut patches = Vec::new();
        let mut out = Vec::new();
        for (i, m) in messages.iter().enumerate() {
            let path = self.dir.join(format!("{:04}.patch", i + 1));
            write_if_changed(&path, &m.text)?;
            // A `+` in the path would read as a patch separator.
            if path.to_string_lossy().contains('+') {
                return Err(not_a_series(
                    &self.spec.given,
                    &format!(
                        "hvlab's cache path {} holds a `+`, which a spec reads as a patch separator; set XDG_CACHE_HOME to a path without one",
                        path.display()
                    ),
                ));
            }
            given = format!("{given}+{}", path.display());
            patches.push(PatchFile::read(&path).map_err(|e| VmError::from(BuildError::from(e)))?);
            let (label, subject) = label_of(m.subject.as_deref(), i + 1, total);
            out.push(SeriesStep {
                label,
                subject,
                spec: self.base.with_patches(given.clone(), patches.clone()),
            });
        }
        Ok(out)
    }
}

/// `git:PATH@A..B`: each first-parent commit of the range a step, labelled by its short
/// hash, from the build layer's [`crate::kernel::build::range_steps`] (which reads the
/// repository only); the base is A's commit.
#[derive(Debug, Clone)]
pub struct GitRangeSeries {
    base: PatchedSpec,
    steps: Vec<SeriesStep>,
    /// What the reader must know (a range that follows first parents past a merge).
    pub notes: Vec<BuildNote>,
}

impl GitRangeSeries {
    /// Resolves the range `revs` of `repo`, which the spec `given` names.
    pub fn of(given: &str, repo: &Path, revs: &Revs) -> Result<GitRangeSeries, Error> {
        let series = crate::kernel::build::range_steps(given, repo, revs).map_err(VmError::from)?;
        let steps = series
            .steps
            .into_iter()
            .map(|st| SeriesStep {
                label: st.commit.short,
                subject: st.subject,
                spec: st.spec,
            })
            .collect();
        Ok(GitRangeSeries {
            base: series.base,
            steps,
            notes: series.notes,
        })
    }
}

impl SeriesSource for GitRangeSeries {
    fn base(&self) -> &PatchedSpec {
        &self.base
    }

    fn steps(&self) -> Result<Vec<SeriesStep>, Error> {
        Ok(self.steps.clone())
    }

    fn notes(&self) -> Vec<BuildNote> {
        self.notes.clone()
    }
}

/// The series `spec` names: a git range (`git:PATH@A..B`), else the messages of the patch
/// files on a base (`debian:7.3+v3.mbox`).
pub fn source_of(spec: &PatchedSpec) -> Result<Box<dyn SeriesSource>, Error> {
    match &spec.source {
        KernelSource::Git {
            repo,
            revs: revs @ Revs::Range { .. },
        } => Ok(Box::new(GitRangeSeries::of(&spec.given, repo, revs)?)),
        KernelSource::Git {
            revs: Revs::One(_), ..
        }
        | KernelSource::Debian { .. }
        | KernelSource::Tree { .. }
        | KernelSource::BzImage { .. } => Ok(Box::new(MboxSeries::of(spec)?)),
    }
}

/// Whether `base` is the base of the series `spec`, resolved to `resolved`: the same kernel,
/// or for a range `git:PATH@A..B` the commit `git:PATH@A` of the same repository.
pub fn is_base_of(base: &PatchedSpec, spec: &PatchedSpec, resolved: &PatchedSpec) -> bool {
    if base.given == resolved.given {
        return true;
    }
    let range_from = match &spec.source {
        KernelSource::Git {
            repo,
            revs: Revs::Range { base: from, .. },
        } => Some((repo, from)),
        KernelSource::Git {
            revs: Revs::One(_), ..
        }
        | KernelSource::Debian { .. }
        | KernelSource::Tree { .. }
        | KernelSource::BzImage { .. } => None,
    };
    let commit = match &base.source {
        KernelSource::Git {
            repo,
            revs: Revs::One(rev),
        } if base.patches.is_empty() => Some((repo, rev)),
        KernelSource::Git { .. }
        | KernelSource::Debian { .. }
        | KernelSource::Tree { .. }
        | KernelSource::BzImage { .. } => None,
    };
    range_from.is_some() && range_from == commit
}

/// Writes `text` to `path` unless it already holds it, through a temporary file renamed into
/// place, so a reader never sees half a patch.
fn write_if_changed(path: &Path, text: &str) -> Result<(), Error> {
    if std::fs::read_to_string(path).is_ok_and(|t| t == text) {
        return Ok(());
    }
    let tmp = path.with_extension("patch.tmp");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| VmError::Io(path.to_path_buf(), e).into())
}
