//! The build cache of one Debian source version: its lock, its unpacked trees, and entries
//! keyed by recipe, config, compiler and patches, written as `KEY.tmp` and renamed when
//! complete.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::error::io;
use super::note::{BuildConfig, BuildNote};
use super::record::{BuildInfo, How, PatchInfo, Step};
use super::{BuildError, BuildProgress, PatchedSpec};
use crate::kernel::debian::{self, BuildInputs, DebianImage};
use crate::kernel::journal::{self, apply};
use crate::kernel::kbuild::KConfig;
use crate::kernel::patch::{PatchFile, sha256_hex};
use crate::kernel::progress::reported;
use crate::kernel::sandbox::Sandbox;
use crate::kernel::{cache_dir, toolchain};

/// Bumped when the way hvlab builds changes, so older cache entries are not reused.
// 3: builds run sandboxed; an entry built before may hold what an unconfined patch left.
pub(super) const RECIPE: &str = "hvlab-kbuild-3";

/// An exclusive `flock` on a file, held while the value lives.
pub(super) struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    pub(super) fn take(path: &Path, progress: &dyn BuildProgress) -> Result<DirLock, BuildError> {
        use rustix::fs::{FlockOperation, flock};
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(io(path))?;
        if flock(&file, FlockOperation::NonBlockingLockExclusive).is_err() {
            progress.begin("waiting for another hvlab's build of this source");
            let start = Instant::now();
            // Blocks until the other holder closes its file.
            flock(&file, FlockOperation::LockExclusive)
                .map_err(|e| BuildError::Io(path.to_path_buf(), e.into()))?;
            progress.end(
                "waiting for another hvlab's build of this source",
                start.elapsed().as_secs_f64(),
            );
        }
        Ok(DirLock { _file: file })
    }
}

/// A build that reports its long steps and records the ones that succeed, with their times
/// (a Debian source's, a git repository's).
pub(super) trait TimedSteps<'p> {
    /// Where its steps are reported.
    fn progress(&self) -> &'p dyn BuildProgress;
    /// The steps done so far.
    fn steps(&mut self) -> &mut Vec<Step>;

    /// Runs `f` as the step `what`: reported, and recorded when it succeeds.
    fn timed<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Self) -> Result<T, BuildError>,
    ) -> Result<T, BuildError>
    where
        Self: Sized,
    {
        let (out, secs) = reported(self.progress(), what, || f(self))?;
        self.steps().push(Step {
            what: what.to_string(),
            secs,
        });
        Ok(out)
    }
}

impl<'a> TimedSteps<'a> for SourceCache<'a> {
    fn progress(&self) -> &'a dyn BuildProgress {
        self.progress
    }
    fn steps(&mut self) -> &mut Vec<Step> {
        &mut self.steps
    }
}

/// One Debian source version in the cache: its trees and builds, locked while in use.
pub(super) struct SourceCache<'a> {
    pub(super) image: DebianImage,
    root: PathBuf,
    inputs: Option<BuildInputs>,
    compiler: String,
    pub(super) sandbox: Sandbox,
    pub(super) steps: Vec<Step>,
    /// What the reader must know about the source (a damaged tree unpacked again).
    pub(super) notes: Vec<BuildNote>,
    progress: &'a dyn BuildProgress,
    _lock: DirLock,
}

/// Puts `tree` back after a patch ([`journal::restore`]); when that fails, marks it damaged,
/// so the next run unpacks it again rather than failing on it forever.
pub(super) fn restored(tree: &Path) -> Result<(), BuildError> {
    journal::restore(tree).map_err(|e| {
        let why = e.to_string();
        journal::mark_damaged(tree, &why);
        BuildError::Damaged {
            tree: tree.to_path_buf(),
            why,
        }
    })
}

/// Takes the lock of the cache directory `root` (`root/lock`, waiting for another hvlab's
/// build), with `builds/` and `logs/` made. Under the lock no other build runs, so a
/// `builds/KEY.tmp` entry found there is what an interrupted build left: removed.
pub(super) fn lock_builds(
    root: &Path,
    progress: &dyn BuildProgress,
) -> Result<DirLock, BuildError> {
    let builds = root.join("builds");
    std::fs::create_dir_all(&builds).map_err(io(root))?;
    std::fs::create_dir_all(root.join("logs")).map_err(io(root))?;
    let lock = DirLock::take(&root.join("lock"), progress)?;
    for e in std::fs::read_dir(&builds).map_err(io(&builds))?.flatten() {
        if e.file_name().to_string_lossy().ends_with(".tmp") {
            let path = e.path();
            std::fs::remove_dir_all(&path).map_err(io(&path))?;
        }
    }
    Ok(lock)
}

/// The complete entry `builds/KEY` of a cache directory, marked as from the cache.
pub(super) fn cached_entry(root: &Path, key: &str) -> Option<(PathBuf, BuildInfo)> {
    let entry = root.join("builds").join(key);
    let text = std::fs::read_to_string(entry.join("build.json")).ok()?;
    let mut info: BuildInfo = serde_json::from_str(&text).ok()?;
    info.cached = true;
    info.steps.clear();
    Some((entry, info))
}

/// Records `info` in the entry `tmp` and renames it to `builds/KEY`: complete only now.
pub(super) fn finish_entry_in(
    root: &Path,
    key: &str,
    tmp: &Path,
    info: &BuildInfo,
) -> Result<PathBuf, BuildError> {
    let entry = root.join("builds").join(key);
    let json = serde_json::to_string_pretty(info)
        .map_err(|e| BuildError::Io(tmp.to_path_buf(), std::io::Error::other(e)))?;
    std::fs::write(tmp.join("build.json"), json).map_err(io(tmp))?;
    let _ = std::fs::remove_dir_all(&entry);
    std::fs::rename(tmp, &entry).map_err(io(&entry))?;
    Ok(entry)
}

impl<'a> SourceCache<'a> {
    pub(super) fn open(
        image: &DebianImage,
        sandbox: &Sandbox,
        progress: &'a dyn BuildProgress,
    ) -> Result<SourceCache<'a>, BuildError> {
        let root = cache_dir()
            .join("kbuild")
            .join(format!("{}_{}", image.release, image.version));
        SourceCache::open_in(root, image, sandbox, progress)
    }

    /// [`Self::open`] at `root`. Under the lock no other build runs, so a `KEY.tmp` entry
    /// found there is what an interrupted build left: removed.
    fn open_in(
        root: PathBuf,
        image: &DebianImage,
        sandbox: &Sandbox,
        progress: &'a dyn BuildProgress,
    ) -> Result<SourceCache<'a>, BuildError> {
        let lock = lock_builds(&root, progress)?;
        Ok(SourceCache {
            image: image.clone(),
            root,
            inputs: None,
            compiler: toolchain::compiler(),
            sandbox: sandbox.clone(),
            steps: Vec::new(),
            notes: Vec::new(),
            progress,
            _lock: lock,
        })
    }

    /// The unpacked source every build of this image starts from, unpatched between builds.
    pub(super) fn source_tree(&self) -> PathBuf {
        self.root.join("modules")
    }

    pub(super) fn log(&self, what: &str) -> PathBuf {
        self.root
            .join("logs")
            .join(format!("{}-{what}.log", crate::kernel::now_stamp()))
    }

    /// Debian's source and headers of the image's version, downloaded once per run.
    fn inputs(&mut self) -> Result<BuildInputs, BuildError> {
        if let Some(i) = &self.inputs {
            return Ok(i.clone());
        }
        let what = format!(
            "fetch {} and linux-headers-{} {}",
            self.image.source_package(),
            self.image.release,
            self.image.version
        );
        let dir = self.root.join("debs");
        let image = self.image.clone();
        let progress = self.progress;
        let inputs = self.timed(&what, |_| {
            Ok(debian::download_build_inputs(&image, &dir, progress)?)
        })?;
        self.inputs = Some(inputs.clone());
        Ok(inputs)
    }

    pub(super) fn source_name(&self) -> String {
        format!(
            "{} {} (Debian)",
            self.image.source_package(),
            self.image.version
        )
    }

    /// An unpacked tree with Debian's config beside it (`.hvlab/debian.config`).
    pub(super) fn unpacked(&mut self, name: &str) -> Result<PathBuf, BuildError> {
        let tree = self.root.join(name);
        if tree.join(".hvlab/unpacked").is_file() {
            // A crash mid-build leaves a journal: played back here. A tree that cannot be put
            // back is unpacked again, never left to fail every run that follows.
            match journal::recover(&tree) {
                Ok(()) => return Ok(tree),
                Err(why) => self.notes.push(BuildNote::TreeUnpackedAgain {
                    tree: name.to_string(),
                    why,
                }),
            }
        }
        let inputs = self.inputs()?;
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::create_dir_all(tree.join(".hvlab")).map_err(io(&tree))?;
        let release = self.image.release.clone();
        self.timed(
            &format!("unpack {} into {name}/", self.image.source_package()),
            |_| {
                debian::unpack_source(&inputs.source_deb, &tree)?;
                debian::unpack_headers(&inputs.headers_deb, &release, &tree)?;
                Ok(())
            },
        )?;
        let config = tree.join(".config");
        std::fs::copy(&config, tree.join(".hvlab/debian.config")).map_err(io(&config))?;
        std::fs::write(tree.join(".hvlab/unpacked"), self.source_name()).map_err(io(&tree))?;
        Ok(tree)
    }

    pub(super) fn debian_config(&self, tree: &Path) -> Result<(KConfig, String), BuildError> {
        let path = tree.join(".hvlab/debian.config");
        let text = std::fs::read_to_string(&path).map_err(io(&path))?;
        Ok((KConfig::parse(&text), text))
    }
}

impl SourceCache<'_> {
    /// Applies each side's patches to `tree` and restores it: a patch that does not apply
    /// fails before anything is built.
    pub(super) fn check_applies<'s>(
        &self,
        tree: &Path,
        sides: impl Iterator<Item = &'s PatchedSpec>,
    ) -> Result<(), BuildError> {
        let source = self.source_name();
        for s in sides.filter(|s| !s.patches.is_empty()) {
            let checked = apply(&self.sandbox, tree, &s.patches, &source).map_err(BuildError::from);
            restored(tree)?;
            checked?;
        }
        Ok(())
    }

    pub(super) fn key(&self, how: &str, config_sha: &str, patches: &[PatchFile]) -> String {
        let mut parts = vec![
            RECIPE.to_string(),
            how.to_string(),
            self.image.package.clone(),
            self.image.version.clone(),
            config_sha.to_string(),
            self.compiler.clone(),
        ];
        parts.extend(patches.iter().map(|p| p.sha256.clone()));
        sha256_hex(parts.join("\n").as_bytes())[..20].to_string()
    }

    /// A cached build entry, marked from the cache.
    pub(super) fn cached(&self, key: &str) -> Option<(PathBuf, BuildInfo)> {
        cached_entry(&self.root, key)
    }

    /// Builds one side into `builds/KEY.tmp` with `fill`, restoring the tree whatever
    /// happens; renamed to `builds/KEY` only when complete.
    pub(super) fn build_entry(
        &mut self,
        tree: &Path,
        key: &str,
        side: &PatchedSpec,
        fill: impl FnOnce(&mut Self, &Path, &Path) -> Result<(), BuildError>,
    ) -> Result<(PathBuf, Vec<BuildNote>, Vec<Step>), BuildError> {
        let entry = self.root.join("builds").join(key);
        let tmp = self.root.join("builds").join(format!("{key}.tmp"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        let before = self.steps.len();
        let source = self.source_name();
        let result = apply(&self.sandbox, tree, &side.patches, &source)
            .map_err(BuildError::from)
            .and_then(|notes| {
                fill(self, tree, &tmp)?;
                Ok(notes)
            });
        let restored = restored(tree);
        let own: Vec<Step> = self.steps.drain(before..).collect();
        let notes = match result {
            Ok(n) => n.into_iter().map(BuildNote::from).collect(),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };
        restored?;
        let _ = std::fs::remove_dir_all(&entry);
        Ok((tmp, notes, own))
    }

    /// What a fresh build records about itself.
    pub(super) fn record(
        &self,
        how: How,
        config: BuildConfig,
        side: &PatchedSpec,
        notes: Vec<BuildNote>,
        steps: Vec<Step>,
        key: &str,
    ) -> BuildInfo {
        BuildInfo {
            how,
            source: self.source_name(),
            config,
            compiler: self.compiler.clone(),
            patches: side.patches.iter().map(PatchInfo::from).collect(),
            notes,
            steps,
            key: key.to_string(),
            cached: false,
            sandbox: self.sandbox.confinement(),
        }
    }

    pub(super) fn finish_entry(
        &self,
        key: &str,
        tmp: &Path,
        info: &BuildInfo,
    ) -> Result<PathBuf, BuildError> {
        finish_entry_in(&self.root, key, tmp, info)
    }

    pub(super) fn side_label(side: &PatchedSpec) -> String {
        if side.patches.is_empty() {
            "the unpatched side".into()
        } else {
            side.patches
                .iter()
                .map(PatchFile::name)
                .collect::<Vec<_>>()
                .join(" + ")
        }
    }
}

impl Drop for SourceCache<'_> {
    /// The downloaded packages are unpacked by now; 160 MiB is not worth keeping for the
    /// next tree (a second download takes seconds).
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.root.join("debs"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Kernel;
    use crate::kernel::build::Silent;
    use crate::kernel::sandbox::SandboxPolicy;

    /// An entry an older hvlab cached, its config and notes sentences, is still reused: the
    /// sentences load as they were said.
    #[test]
    fn an_entry_cached_before_notes_were_typed_is_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let entry = dir.path().join("builds/0a1b2c3d");
        std::fs::create_dir_all(&entry).expect("entry");
        let old = r#"{"how":{"kind":"modules","dirs":["arch/x86/kvm"],"modules":["kvm.ko"]},
            "source":"linux-source-7.3 7.3.4-1 (Debian)",
            "config":"Debian's config of 7.3.4+deb13-amd64 (from linux-headers-7.3.4+deb13-amd64)",
            "compiler":"gcc 14.2.0","patches":[],
            "notes":["x.patch: virt/kvm/kvm_main.c: Hunk #1 succeeded at 6073 (offset 3 lines)"],
            "steps":[{"what":"make M=arch/x86/kvm","secs":21.0}],"key":"0a1b2c3d"}"#;
        std::fs::write(entry.join("build.json"), old).expect("write");
        let (_, info) = cached_entry(dir.path(), "0a1b2c3d").expect("the old entry loads");
        assert!(info.cached && info.steps.is_empty());
        assert_eq!(
            info.config,
            BuildConfig::Said(
                "Debian's config of 7.3.4+deb13-amd64 (from linux-headers-7.3.4+deb13-amd64)"
                    .into()
            )
        );
        assert_eq!(
            info.notes,
            [BuildNote::Said(
                "x.patch: virt/kvm/kvm_main.c: Hunk #1 succeeded at 6073 (offset 3 lines)".into()
            )]
        );
    }

    /// An interrupted build leaves `builds/KEY.tmp`; the next run that takes the source lock
    /// removes it, and keeps complete entries.
    #[test]
    fn leftover_tmp_entries_go_when_the_source_lock_is_taken() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("7.3.4+deb13-amd64_7.3.4-1");
        std::fs::create_dir_all(root.join("builds/4be5cab6.tmp/kernel")).expect("tmp entry");
        std::fs::create_dir_all(root.join("builds/0a1b2c3d")).expect("entry");
        let image = DebianImage {
            package: "linux-binary-7.3.4+deb13-amd64".into(),
            version: "7.3.4-1".into(),
            release: "7.3.4+deb13-amd64".into(),
            kernel: Kernel {
                release: "7.3.4+deb13-amd64".into(),
                spec: "debian:7.3".into(),
                source: String::new(),
                image: dir.path().join("vmlinuz"),
                config: None,
                modules: None,
            },
        };
        let sandbox = Sandbox::choose(SandboxPolicy::Off).expect("no sandbox is always possible");
        let cache = SourceCache::open_in(root.clone(), &image, &sandbox, &Silent).expect("opens");
        assert!(!root.join("builds/4be5cab6.tmp").exists());
        assert!(root.join("builds/0a1b2c3d").is_dir());
        drop(cache);
    }
}
