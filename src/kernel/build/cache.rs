//! The build cache of one Debian source version: its lock, its unpacked source (read-only to
//! every build, its checksum taken when unpacked), the output directories its unpatched
//! builds reuse, each build's own work directory, and entries keyed by recipe, config,
//! compiler and patches, written as `KEY.tmp` and renamed when complete. The layout is
//! [`crate::kernel::cache`]'s.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::error::io;
use super::make::Make;
use super::note::{BuildConfig, BuildNote};
use super::record::{BuildInfo, How, PatchInfo, Step};
use super::{BuildError, BuildProgress, PatchedSpec};
use crate::kernel::cache::{checksum, hold, layout};
use crate::kernel::debian::{self, BuildInputs, DebianImage};
use crate::kernel::journal::{self, HunkReport};
use crate::kernel::kbuild::KConfig;
use crate::kernel::limits::BuildKind;
use crate::kernel::overlay::{self, Overlay};
use crate::kernel::patch::{PatchFile, sha256_hex};
use crate::kernel::progress::reported;
use crate::kernel::sandbox::Sandbox;
use crate::kernel::{cache_dir, toolchain};

/// Bumped when the way hvlab builds changes, so older cache entries are not reused.
// 4: built out of tree from a source read-only to the build; an entry built before may hold
// what an earlier build wrote into the shared tree.
pub(super) const RECIPE: &str = "hvlab-kbuild-4";

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
/// `builds/KEY.tmp` entry or a `work/` directory found there is what an interrupted build
/// left: removed.
pub(super) fn lock_builds(
    root: &Path,
    progress: &dyn BuildProgress,
) -> Result<DirLock, BuildError> {
    let builds = root.join(layout::BUILDS);
    std::fs::create_dir_all(&builds).map_err(io(root))?;
    std::fs::create_dir_all(root.join(layout::LOGS)).map_err(io(root))?;
    let lock = DirLock::take(&root.join(layout::LOCK), progress)?;
    for e in std::fs::read_dir(&builds).map_err(io(&builds))?.flatten() {
        if e.file_name().to_string_lossy().ends_with(".tmp") {
            let path = e.path();
            std::fs::remove_dir_all(&path).map_err(io(&path))?;
        }
    }
    let work = root.join(layout::WORK);
    if work.exists() {
        std::fs::remove_dir_all(&work).map_err(io(&work))?;
    }
    Ok(lock)
}

/// The complete entry `builds/KEY` of a cache directory, marked as from the cache, and held
/// for the rest of this run ([`hold`]).
pub(super) fn cached_entry(root: &Path, key: &str) -> Option<(PathBuf, BuildInfo)> {
    let entry = root.join(layout::BUILDS).join(key);
    // Gone (or pruned while this waited for it): not cached.
    if !hold::hold(&entry).ok()? {
        return None;
    }
    let text = std::fs::read_to_string(entry.join("build.json")).ok()?;
    let mut info: BuildInfo = serde_json::from_str(&text).ok()?;
    info.cached = true;
    info.steps.clear();
    Some((entry, info))
}

/// Records `info` in the entry `tmp` and renames it to `builds/KEY`: complete only now, and
/// held for the rest of this run (from before the rename, so no prune can take it between).
pub(super) fn finish_entry_in(
    root: &Path,
    key: &str,
    tmp: &Path,
    info: &BuildInfo,
) -> Result<PathBuf, BuildError> {
    let entry = root.join(layout::BUILDS).join(key);
    let json = serde_json::to_string_pretty(info)
        .map_err(|e| BuildError::Io(tmp.to_path_buf(), std::io::Error::other(e)))?;
    std::fs::write(tmp.join("build.json"), json).map_err(io(tmp))?;
    hold::hold(tmp).map_err(io(tmp))?;
    let _ = std::fs::remove_dir_all(&entry);
    std::fs::rename(tmp, &entry).map_err(io(&entry))?;
    Ok(entry)
}

/// How a side's patches reach its build.
#[derive(Debug)]
pub(super) enum Laid {
    /// It has none.
    Unpatched,
    /// Laid over the read-only source by the sandbox: the source is not written.
    Overlay(Overlay),
    /// Applied in the tree itself (no sandbox to lay them over it), put back from the
    /// journal afterwards ([`unlay`]).
    InPlace,
}

impl Laid {
    /// The overlay the build's sandbox lays over the source, if any.
    pub(super) fn overlay(&self) -> Option<&Overlay> {
        match self {
            Laid::Overlay(o) => Some(o),
            Laid::Unpatched | Laid::InPlace => None,
        }
    }
}

/// Applies `patches` for a build of `tree`: laid over it when the sandbox can (the patched
/// copies under `work`), else in the tree with a journal. `source` names the tree in errors.
pub(super) fn lay(
    sandbox: &Sandbox,
    tree: &Path,
    patches: &[PatchFile],
    source: &str,
    work: &Path,
) -> Result<(Laid, Vec<HunkReport>), BuildError> {
    if patches.is_empty() {
        return Ok((Laid::Unpatched, Vec::new()));
    }
    if sandbox.overlays() {
        let (o, hunks) = overlay::patched(sandbox, tree, patches, source, &work.join("overlay"))?;
        return Ok((Laid::Overlay(o), hunks));
    }
    match journal::apply(sandbox, tree, patches, source) {
        Ok(hunks) => Ok((Laid::InPlace, hunks)),
        Err(e) => {
            // What applied before the failure is put back now.
            restored(tree)?;
            Err(e.into())
        }
    }
}

/// Undoes [`lay`]: a patch applied in the tree is put back (an overlay goes with `work`).
pub(super) fn unlay(tree: &Path, laid: &Laid) -> Result<(), BuildError> {
    match laid {
        Laid::InPlace => restored(tree),
        Laid::Unpatched | Laid::Overlay(_) => Ok(()),
    }
}

/// A build's own directory (`work/NAME/`: its patch overlay, its output when it is not the
/// source's shared one, its temporary files), removed when dropped, whatever happened.
#[derive(Debug)]
pub(super) struct Work {
    pub(super) dir: PathBuf,
}

impl Work {
    pub(super) fn new(root: &Path, name: &str) -> Result<Work, BuildError> {
        let dir = root.join(layout::WORK).join(name);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        Ok(Work { dir })
    }

    /// Its temporary directory (`TMPDIR`), made and removed around each make.
    pub(super) fn tmp(&self) -> PathBuf {
        self.dir.join("tmp")
    }

    /// Its own output directory.
    pub(super) fn out(&self) -> PathBuf {
        self.dir.join("out")
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        // `work/` itself, once no build's is left in it.
        if let Some(parent) = self.dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// The output directory a patched build writes: a copy of `base` (what the unpatched builds
/// wrote, so make rebuilds only what the patch changes) at `to`, or an empty one. The copy
/// keeps modes and times (`cp -a`); nothing a patched build writes reaches `base`, which a
/// later unpatched build reuses.
pub(super) fn own_output(base: &Path, to: &Path) -> Result<(), BuildError> {
    if !base.is_dir() {
        return std::fs::create_dir_all(to).map_err(io(to));
    }
    let out = std::process::Command::new("cp")
        .args(["-a", "--reflink=auto"])
        .arg(base)
        .arg(to)
        .output()
        .map_err(io(base))?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(to);
        return Err(BuildError::Io(
            to.to_path_buf(),
            std::io::Error::other(String::from_utf8_lossy(&out.stderr).trim().to_string()),
        ));
    }
    Ok(())
}

/// Runs `build`, which writes the shared output directory `out` of unpatched builds: when it
/// fails (or reaches a limit), what it wrote goes, and the next build starts that directory
/// afresh.
pub(super) fn or_remove<T>(
    out: &Path,
    build: impl FnOnce() -> Result<T, BuildError>,
) -> Result<T, BuildError> {
    let result = build();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(out);
    }
    result
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

    /// The unpacked source every build of this image starts from, never written after it was
    /// unpacked (but by a `--no-sandbox` build's patch, put back from its journal).
    pub(super) fn source_tree(&self) -> PathBuf {
        self.root.join(layout::SOURCE)
    }

    /// The cache directory of this source version.
    pub(super) fn root(&self) -> &Path {
        &self.root
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

    /// The unpacked source, with Debian's config and `Module.symvers` beside it, its checksum
    /// taken, held for the rest of this run. A tree without a checksum record (an unpack that
    /// did not finish, an older hvlab's), one that `hvlab cache verify` found changed, or one
    /// a crashed `--no-sandbox` build left patched and that cannot be put back, is unpacked
    /// again.
    pub(super) fn source(&mut self) -> Result<PathBuf, BuildError> {
        let tree = self.source_tree();
        let damaged = self.root.join(layout::DAMAGED);
        if let Ok(why) = std::fs::read_to_string(&damaged) {
            self.notes.push(BuildNote::TreeUnpackedAgain {
                tree: layout::SOURCE.into(),
                why,
            });
        } else if tree.is_dir() && checksum::recorded(&tree).is_some() {
            match journal::recover(&tree) {
                Ok(()) => {
                    hold::hold(&tree).map_err(io(&tree))?;
                    return Ok(tree);
                }
                Err(why) => self.notes.push(BuildNote::TreeUnpackedAgain {
                    tree: layout::SOURCE.into(),
                    why,
                }),
            }
        }
        let inputs = self.inputs()?;
        let (record, manifest) = checksum::record_files(&tree);
        for f in [&record, &manifest, &damaged] {
            let _ = std::fs::remove_file(f);
        }
        let _ = std::fs::remove_dir_all(&tree);
        std::fs::create_dir_all(&tree).map_err(io(&tree))?;
        let release = self.image.release.clone();
        let root = self.root.clone();
        self.timed(
            &format!(
                "unpack {} into {}/",
                self.image.source_package(),
                layout::SOURCE
            ),
            |_| {
                debian::unpack_source(&inputs.source_deb, &tree)?;
                debian::unpack_headers(&inputs.headers_deb, &release, &root)?;
                Ok(())
            },
        )?;
        let what = self.source_name();
        self.timed(
            "checksum the unpacked source (hvlab cache verify checks it)",
            |_| checksum::record(&tree, &what).map_err(io(&tree)),
        )?;
        hold::hold(&tree).map_err(io(&tree))?;
        Ok(tree)
    }

    /// Debian's config of the image, parsed and as text.
    pub(super) fn debian_config(&self) -> Result<(KConfig, String), BuildError> {
        let path = self.root.join(debian::DEBIAN_CONFIG);
        let text = std::fs::read_to_string(&path).map_err(io(&path))?;
        Ok((KConfig::parse(&text), text))
    }

    /// A `make` of this source for a build of `kind`, writing `writable` (and `work`'s
    /// temporary directory), the patch `laid` over the source.
    pub(super) fn make<'m>(
        &'m self,
        tree: &'m Path,
        laid: &'m Laid,
        writable: Vec<&'m Path>,
        tmp: &'m Path,
        kind: BuildKind,
        log: &'m Path,
    ) -> Make<'m> {
        Make {
            sandbox: &self.sandbox,
            source: tree,
            overlay: laid.overlay(),
            writable,
            tmp,
            kind,
            log,
        }
    }
}

impl SourceCache<'_> {
    /// Applies each side's patches (to copies, or in the tree and back): a patch that does
    /// not apply fails before anything is built.
    pub(super) fn check_applies<'s>(
        &self,
        tree: &Path,
        sides: impl Iterator<Item = &'s PatchedSpec>,
    ) -> Result<(), BuildError> {
        let source = self.source_name();
        for (n, s) in sides.filter(|s| !s.patches.is_empty()).enumerate() {
            let work = Work::new(&self.root, &format!("check-{n}"))?;
            let (laid, _) = lay(&self.sandbox, tree, &s.patches, &source, &work.dir)?;
            unlay(tree, &laid)?;
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

    /// Builds one side into `builds/KEY.tmp` with `fill` (given the source, the side's
    /// patches laid over it, its work directory and the entry), in a work directory of its
    /// own that goes whatever happens; renamed to `builds/KEY` only when complete.
    pub(super) fn build_entry(
        &mut self,
        tree: &Path,
        key: &str,
        side: &PatchedSpec,
        fill: impl FnOnce(&mut Self, &Laid, &Work, &Path) -> Result<(), BuildError>,
    ) -> Result<(PathBuf, Vec<BuildNote>, Vec<Step>), BuildError> {
        let tmp = self.root.join(layout::BUILDS).join(format!("{key}.tmp"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        let work = Work::new(&self.root, key)?;
        let before = self.steps.len();
        let source = self.source_name();
        let laid = lay(&self.sandbox, tree, &side.patches, &source, &work.dir);
        let result = match &laid {
            Ok((laid, hunks)) => fill(self, laid, &work, &tmp).map(|()| hunks.clone()),
            Err(_) => Ok(Vec::new()),
        };
        let back = match &laid {
            Ok((laid, _)) => unlay(tree, laid),
            Err(_) => Ok(()),
        };
        drop(work);
        let own: Vec<Step> = self.steps.drain(before..).collect();
        let hunks = match laid.and(result) {
            Ok(h) => h,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e);
            }
        };
        back?;
        Ok((tmp, hunks.into_iter().map(BuildNote::from).collect(), own))
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
        let sandbox = Sandbox::choose(SandboxPolicy::OFF).expect("no sandbox is always possible");
        let cache = SourceCache::open_in(root.clone(), &image, &sandbox, &Silent).expect("opens");
        assert!(!root.join("builds/4be5cab6.tmp").exists());
        assert!(root.join("builds/0a1b2c3d").is_dir());
        drop(cache);
    }
}
