//! A whole kernel from a commit of a git tree (`git:PATH@REF[+PATCH...]`). Each repository
//! has one directory in the cache (`git/ID/`, locked while in use like a Debian source):
//! hvlab's clone (`src/`, see [`Checkout`]; read-only to every build), one output directory
//! (`out/`, `make O=`) and the kernels built (`builds/KEY`, per commit, config, compiler and
//! patches, complete only once renamed into place). Moving the clone between commits rewrites
//! only the files that differ, so the next build in `out/` is incremental. A side with patches
//! has them laid over the clone and builds in a copy of `out/` of its own, so what it wrote
//! (objects newer than the unpatched files) never reaches a later build.

use std::path::{Path, PathBuf};

use super::cache::{
    Laid, RECIPE, TimedSteps, Work, cached_entry, finish_entry_in, lay, lock_builds, own_output,
    unlay,
};
use super::error::io;
use super::make::{Make, make_error};
use super::note::{BaseConfig, BuildConfig, BuildNote, config_marker};
use super::record::{BuildInfo, How, PatchInfo, Step};
use super::whole::{GUEST_CONFIG_STEP, collect_kernel, entry_kernel, guest_config};
use super::{BuildError, BuildProgress, Built, PatchedSpec};
use crate::kernel::cache::layout;
use crate::kernel::git::{Checkout, GitSpec, KernelVersion};
use crate::kernel::journal;
use crate::kernel::limits::BuildKind;
use crate::kernel::patch::{PatchFile, sha256_hex};
use crate::kernel::sandbox::Sandbox;
use crate::kernel::{cache_dir, from_tree, toolchain};

/// Builds (or reuses) the kernel of one git side, at the commit `spec` resolved. `config` is
/// `--config FILE`, whose tick, preemption, RCU and KVM options the minimal guest keeps;
/// without it, those of Debian's config of the nearest version in hvlab's kernel cache.
pub(super) fn build_git_side(
    side: &PatchedSpec,
    spec: &GitSpec,
    config: Option<&Path>,
    sandbox: &Sandbox,
    progress: &dyn BuildProgress,
) -> Result<(Built, Vec<Step>), BuildError> {
    let root = cache_dir().join("git").join(spec.repo.cache_id());
    let _lock = lock_builds(&root, progress)?;
    let (base_text, origin) = base_config(config, spec.version)?;
    let compiler = toolchain::compiler();
    let key = key_of(&spec.commit.sha, &base_text, &compiler, &side.patches);
    let source = format!("git {} {}", spec.repo.path.display(), spec.commit.label());
    if let Some((entry, info)) = cached_entry(&root, &key) {
        let kernel = entry_kernel(&entry, &side.given, kernel_source(&info))?;
        return Ok((
            Built {
                kernel,
                build: Some(info),
            },
            Vec::new(),
        ));
    }
    let mut build = GitBuild {
        root,
        sandbox: sandbox.clone(),
        progress,
        steps: Vec::new(),
        notes: Vec::new(),
    };
    let (tmp, mut config, mut notes) = build.build(spec, side, &key, &base_text)?;
    notes.append(&mut build.notes);
    if let BuildConfig::MinimalGuest { base, .. } = &mut config {
        *base = Some(origin);
    }
    let info = BuildInfo {
        how: How::Whole,
        source,
        config,
        compiler,
        patches: side.patches.iter().map(PatchInfo::from).collect(),
        notes,
        steps: build.steps.clone(),
        key: key.clone(),
        cached: false,
        sandbox: sandbox.confinement(),
    };
    let entry = finish_entry_in(&build.root, &key, &tmp, &info)?;
    let kernel = entry_kernel(&entry, &side.given, kernel_source(&info))?;
    Ok((
        Built {
            kernel,
            build: Some(info),
        },
        build.steps,
    ))
}

/// The one line a run's host fingerprint carries about a kernel built from git.
fn kernel_source(info: &BuildInfo) -> String {
    let patches = if info.patches.is_empty() {
        String::new()
    } else {
        format!(
            " with {}",
            info.patches
                .iter()
                .map(|p| format!("{} (sha256 {})", p.file, &p.sha256[..12]))
                .collect::<Vec<_>>()
                .join(" + ")
        )
    };
    format!("{}, minimal guest config{patches}", info.source)
}

/// The cache key of a commit's kernel: hvlab's recipe, the commit, the base config, the
/// compiler and the patches.
fn key_of(sha: &str, base_config: &str, compiler: &str, patches: &[PatchFile]) -> String {
    let mut parts = vec![
        RECIPE.to_string(),
        "git-whole".to_string(),
        sha.to_string(),
        sha256_hex(base_config.as_bytes()),
        compiler.to_string(),
    ];
    parts.extend(patches.iter().map(|p| p.sha256.clone()));
    sha256_hex(parts.join("\n").as_bytes())[..20].to_string()
}

/// The config whose tick, preemption, RCU and KVM options the guest keeps, and where it came
/// from: `--config FILE`, else Debian's of the version in hvlab's kernel cache nearest to
/// `version`.
fn base_config(
    given: Option<&Path>,
    version: KernelVersion,
) -> Result<(String, BaseConfig), BuildError> {
    if let Some(path) = given {
        let text = std::fs::read_to_string(path)
            .map_err(|e| BuildError::ConfigUnreadable(path.to_path_buf(), e))?;
        return Ok((
            text,
            BaseConfig::Given {
                path: path.to_path_buf(),
            },
        ));
    }
    let (release, path) = nearest_debian_config(&cache_dir().join("kernels"), version)
        .ok_or(BuildError::NoBaseConfig { version })?;
    let text = std::fs::read_to_string(&path).map_err(io(&path))?;
    Ok((text, BaseConfig::NearestDebian { release }))
}

/// The release and config of the complete Debian kernel under `kernels` (hvlab's kernel
/// cache) whose version is nearest `version`: the same series first.
fn nearest_debian_config(kernels: &Path, version: KernelVersion) -> Option<(String, PathBuf)> {
    std::fs::read_dir(kernels)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join(".complete").is_file())
        .filter_map(|e| from_tree(&e.path()))
        .filter_map(|k| {
            let config = k.config.clone()?;
            let v = KernelVersion::from_release(&k.release)?;
            Some((version.distance(&v), k.release, config))
        })
        .min()
        .map(|(_, release, config)| (release, config))
}

impl<'a> TimedSteps<'a> for GitBuild<'a> {
    fn progress(&self) -> &'a dyn BuildProgress {
        self.progress
    }
    fn steps(&mut self) -> &mut Vec<Step> {
        &mut self.steps
    }
}

/// One build in a repository's cache directory, its lock held by the caller.
struct GitBuild<'a> {
    root: PathBuf,
    sandbox: Sandbox,
    progress: &'a dyn BuildProgress,
    steps: Vec<Step>,
    /// What the reader must know (a damaged clone made again).
    notes: Vec<BuildNote>,
}

impl GitBuild<'_> {
    /// hvlab's clone at the commit: a tree a crash left patched is put back first, and one
    /// that cannot be is cloned again.
    fn checkout(&mut self, spec: &GitSpec) -> Result<Checkout, BuildError> {
        let dir = self.root.join(layout::CLONE);
        if dir.is_dir()
            && let Err(why) = journal::recover(&dir)
        {
            self.notes.push(BuildNote::CloneMadeAgain {
                repo: spec.repo.path.clone(),
                why,
            });
            std::fs::remove_dir_all(&dir).map_err(io(&dir))?;
        }
        let what = format!("check out {} in hvlab's clone", spec.commit.label());
        self.timed(&what, |_| {
            let checkout = Checkout::open(&spec.repo, &dir)?;
            checkout.switch_to(&spec.commit.sha)?;
            Ok(checkout)
        })
    }

    /// Checks out, lays the patches over the clone, configures and builds into
    /// `builds/KEY.tmp`: an unpatched commit in `out/` (removed when its build fails, but for a
    /// compiler error), a patched one in a copy of its own. Returns the entry, the config's
    /// note and the patches' notes.
    fn build(
        &mut self,
        spec: &GitSpec,
        side: &PatchedSpec,
        key: &str,
        base_text: &str,
    ) -> Result<(PathBuf, BuildConfig, Vec<BuildNote>), BuildError> {
        let checkout = self.checkout(spec)?;
        let tree = checkout.dir;
        let tmp = self.root.join(layout::BUILDS).join(format!("{key}.tmp"));
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        let log = self.root.join(layout::LOGS).join(format!(
            "{}-{}-{key}.log",
            crate::kernel::now_stamp(),
            spec.commit.short
        ));
        let source = format!("{} {}", spec.repo.path.display(), spec.commit.label());
        let patched = !side.patches.is_empty();
        let work = Work::new(&self.root, key)?;
        let base = self.root.join(layout::GIT_OUT);
        let result = lay(&self.sandbox, &tree, &side.patches, &source, &work.dir).and_then(
            |(laid, hunks)| {
                let built = if patched {
                    own_output(&base, &work.out()).and_then(|()| {
                        self.make_kernel(
                            spec,
                            side,
                            &tree,
                            &laid,
                            &work.out(),
                            &work,
                            base_text,
                            &log,
                            &tmp,
                        )
                    })
                } else {
                    std::fs::create_dir_all(&base).map_err(io(&base))?;
                    let built = self.make_kernel(
                        spec, side, &tree, &laid, &base, &work, base_text, &log, &tmp,
                    );
                    // What a failed or limited build wrote goes, but a commit that does not
                    // compile keeps `out/`: make stopped at the error having written only
                    // objects that compiled, and the next commit of a bisection reuses them
                    // (removing them made each later step a cold build, 16 min on 2 cores).
                    if let Err(e) = &built
                        && !matches!(e, BuildError::BaseCompile { .. })
                    {
                        let _ = std::fs::remove_dir_all(&base);
                    }
                    built
                };
                let back = unlay(&tree, &laid);
                let config_note = built?;
                back?;
                Ok((
                    config_note,
                    hunks.into_iter().map(BuildNote::from).collect(),
                ))
            },
        );
        drop(work);
        match result {
            Ok((config_note, notes)) => Ok((tmp, config_note, notes)),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&tmp);
                Err(e)
            }
        }
    }

    /// Configures `out` and builds the kernel there (`make O=OUT bzImage modules`, the clone
    /// read-only with `laid` over it), then collects it into the entry `tmp`.
    #[allow(clippy::too_many_arguments)]
    fn make_kernel(
        &mut self,
        spec: &GitSpec,
        side: &PatchedSpec,
        tree: &Path,
        laid: &Laid,
        out: &Path,
        work: &Work,
        base_text: &str,
        log: &Path,
        tmp: &Path,
    ) -> Result<BuildConfig, BuildError> {
        let patched = !side.patches.is_empty();
        let config_note = self.configure(spec, side, tree, laid, out, work, base_text, log)?;
        let step = format!("make bzImage modules ({})", spec.commit.label());
        let args = vec![
            format!("O={}", out.display()),
            "bzImage".into(),
            "modules".into(),
        ];
        let scratch = work.tmp();
        self.timed(&step, |me| {
            me.make(tree, laid, out, &scratch, log)
                .run(&args)
                .map_err(make_error(patched, &step, log))
        })?;
        collect_kernel(out, tmp)?;
        Ok(config_note)
    }

    /// A whole-kernel `make` of the clone writing `out` alone.
    fn make<'m>(
        &'m self,
        tree: &'m Path,
        laid: &'m Laid,
        out: &'m Path,
        tmp: &'m Path,
        log: &'m Path,
    ) -> Make<'m> {
        Make {
            sandbox: &self.sandbox,
            source: tree,
            overlay: laid.overlay(),
            writable: vec![out],
            tmp,
            kind: BuildKind::Whole,
            log,
        }
    }

    /// The minimal guest config in `out`, made again only when what it is made from changed:
    /// the commit's Kconfig files, the base config, or a patch that touches Kconfig.
    #[allow(clippy::too_many_arguments)]
    fn configure(
        &mut self,
        spec: &GitSpec,
        side: &PatchedSpec,
        tree: &Path,
        laid: &Laid,
        out: &Path,
        work: &Work,
        base_text: &str,
        log: &Path,
    ) -> Result<BuildConfig, BuildError> {
        let mut inputs = vec![
            spec.repo.kconfig_fingerprint(&spec.commit.sha)?,
            sha256_hex(base_text.as_bytes()),
        ];
        inputs.extend(
            side.patches
                .iter()
                .filter(|p| p.touched().iter().any(|f| f.contains("Kconfig")))
                .map(|p| p.sha256.clone()),
        );
        let fingerprint = sha256_hex(inputs.join("\n").as_bytes());
        let marker = out.join(".hvlab-config");
        if let Ok(text) = std::fs::read_to_string(&marker)
            && let Some((made_for, note)) = text.split_once('\n')
            && made_for == fingerprint
            && out.join(".config").is_file()
            // An older hvlab's sentence lacks the facts the record needs: configured again.
            && let Ok(config) = serde_json::from_str::<BuildConfig>(note)
            && !matches!(config, BuildConfig::Said(_))
        {
            return Ok(config);
        }
        let of = format!("{} {}", spec.repo.path.display(), spec.commit.label());
        let o = format!("O={}", out.display());
        let scratch = work.tmp();
        let note = self.timed(GUEST_CONFIG_STEP, |me| {
            let mut run = |target: &str| {
                me.make(tree, laid, out, &scratch, log)
                    .run(&[o.clone(), target.into()])
                    .map_err(make_error(false, "the minimal guest config", log))
            };
            guest_config(&mut run, &out.join(".config"), base_text, &of)
        })?;
        std::fs::write(&marker, format!("{fingerprint}\n{}", config_marker(&note)))
            .map_err(io(&marker))?;
        Ok(note)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::fault_exit_code;
    use crate::kernel::git::test_repo::linux_repo;
    use crate::kernel::source::KernelSource;

    /// `git:PATH@REF+x.patch`: the commit is the base, the patch applies on it.
    #[test]
    fn a_patch_after_a_git_spec_applies_on_that_commit() {
        let dir = tempfile::tempdir().expect("tempdir");
        linux_repo(dir.path(), &["base"]);
        let patch = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/patches/doc-only.patch");
        let base = format!("git:{}@HEAD", dir.path().display());
        let side = PatchedSpec::parse(&format!("{base}+{}", patch.display())).expect("parses");
        assert_eq!(side.base, base);
        assert_eq!(side.patches.len(), 1);
        let commit = match &side.source {
            KernelSource::Git { repo, revs } => {
                GitSpec::resolve(&side.base, repo, revs)
                    .expect("resolves")
                    .commit
            }
            other @ (KernelSource::Debian { .. }
            | KernelSource::Tree { .. }
            | KernelSource::BzImage { .. }) => panic!("not a git source: {other:?}"),
        };
        assert_eq!(commit.subject, "base");
    }

    /// Debian's config of the nearest complete kernel in the cache: the same series before a
    /// nearer sublevel of another, and never a kernel still being unpacked.
    #[test]
    fn the_base_config_is_the_given_file_or_debians_of_the_nearest_cached_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kernels = dir.path();
        let seven_two = kernels.join("7.2.13+deb13-amd64/usr/lib/modules/7.2.13+deb13-amd64");
        std::fs::create_dir_all(&seven_two).expect("mkdir");
        std::fs::write(seven_two.join("vmlinuz"), "").expect("write");
        std::fs::write(seven_two.join("config"), "CONFIG_HZ=250\n").expect("write");
        std::fs::write(kernels.join("7.2.13+deb13-amd64/.complete"), "").expect("write");
        let six = kernels.join("6.12.117+deb12-amd64/boot");
        std::fs::create_dir_all(&six).expect("mkdir");
        std::fs::write(six.join("vmlinuz-6.12.117+deb12-amd64"), "").expect("write");
        std::fs::write(six.join("config-6.12.117+deb12-amd64"), "CONFIG_HZ=100\n").expect("write");
        std::fs::write(kernels.join("6.12.117+deb12-amd64/.complete"), "").expect("write");
        // 7.3 being unpacked: not complete, not taken.
        let partial = kernels.join("7.3.4+deb13-amd64/usr/lib/modules/7.3.4+deb13-amd64");
        std::fs::create_dir_all(&partial).expect("mkdir");
        std::fs::write(partial.join("vmlinuz"), "").expect("write");
        std::fs::write(partial.join("config"), "").expect("write");
        let v = |major, minor, sub| KernelVersion { major, minor, sub };
        let (release, config) = nearest_debian_config(kernels, v(7, 3, 4)).expect("found");
        assert_eq!(release, "7.2.13+deb13-amd64");
        assert_eq!(config, seven_two.join("config"));
        assert_eq!(
            nearest_debian_config(kernels, v(6, 12, 1))
                .expect("found")
                .0,
            "6.12.117+deb12-amd64"
        );
        assert_eq!(
            nearest_debian_config(&kernels.join("none"), v(7, 3, 4)),
            None
        );
        // --config FILE wins, and an unreadable one exits 2 naming it.
        let given = kernels.join("my.config");
        std::fs::write(&given, "CONFIG_HZ=1000\n").expect("write");
        let (text, origin) = base_config(Some(&given), v(7, 3, 4)).expect("read");
        assert_eq!(text, "CONFIG_HZ=1000\n");
        assert_eq!(
            origin,
            BaseConfig::Given {
                path: given.clone()
            }
        );
        let e = base_config(Some(&kernels.join("missing")), v(7, 3, 4)).expect_err("missing");
        assert_eq!(fault_exit_code(e.fault()), 2);
        assert!(e.to_string().contains("Give --config the path"), "{e}");
    }

    /// The key changes with each input that changes the kernel, and only with those.
    #[test]
    fn a_commits_kernel_is_keyed_by_commit_base_config_compiler_and_patches() {
        let k = key_of("a1", "CONFIG_HZ=250\n", "gcc 14", &[]);
        assert_eq!(k, key_of("a1", "CONFIG_HZ=250\n", "gcc 14", &[]));
        assert_eq!(k.len(), 20);
        for other in [
            key_of("b2", "CONFIG_HZ=250\n", "gcc 14", &[]),
            key_of("a1", "CONFIG_HZ=1000\n", "gcc 14", &[]),
            key_of("a1", "CONFIG_HZ=250\n", "gcc 15", &[]),
        ] {
            assert_ne!(k, other);
        }
    }
}
