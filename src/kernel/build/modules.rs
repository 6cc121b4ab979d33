//! A modules-only build: `make M=DIR MO=OUT/DIR` against Debian's config prepared out of the
//! read-only source (`O=prepared`, read-only too), the rebuilt `.ko` files (their vermagic
//! checked) in place of the image's in a tree of hard links to it. The unpatched side writes
//! `modules-out/`; a patched side a copy of it of its own.

use std::path::{Path, PathBuf};

use super::cache::{Laid, SourceCache, TimedSteps, Work, or_remove, own_output};
use super::error::io;
use super::make::make_error;
use super::note::{BuildConfig, config_marker, read_config_marker};
use super::record::{BuildInfo, How, describe_source};
use super::{BuildError, Built, PatchedSpec};
use crate::kernel::cache::{hold, layout};
use crate::kernel::kbuild::KConfig;
use crate::kernel::limits::BuildKind;
use crate::kernel::{from_tree, ko};

/// Line tables and inlined call sites, no types or locals (`-g1`): what reach reads from a
/// module's DWARF (each changed line's function and where it was inlined), for about 6% more
/// compile time than none (66 s against 62 s for arch/x86/kvm of 7.3 on 2 cores) where full
/// `-g` is most of it. Part of the cache key: a build of other flags is another build.
const MODULE_DEBUG_INFO: &str = "KCFLAGS=-g1";

/// Links every file of `from` into `to` (hard links; copies across filesystems).
fn link_tree(from: &Path, to: &Path) -> Result<(), BuildError> {
    std::fs::create_dir_all(to).map_err(io(to))?;
    for e in std::fs::read_dir(from).map_err(io(from))?.flatten() {
        let src = e.path();
        let dst = to.join(e.file_name());
        let t = e.file_type().map_err(io(&src))?;
        if t.is_dir() {
            link_tree(&src, &dst)?;
        } else if t.is_symlink() {
            let target = std::fs::read_link(&src).map_err(io(&src))?;
            std::os::unix::fs::symlink(target, &dst).map_err(io(&dst))?;
        } else if std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst).map_err(io(&src))?;
        }
    }
    Ok(())
}

/// What a modules build of `dirs` is, for its cache key: the directories and the flags.
fn modules_how(dirs: &[String]) -> String {
    format!("modules:{}:{MODULE_DEBUG_INFO}", dirs.join(","))
}

/// A module's `vermagic=`.
fn vermagic(bytes: &[u8]) -> String {
    ko::modinfo(bytes, "vermagic")
        .into_iter()
        .next()
        .unwrap_or_default()
}

impl SourceCache<'_> {
    /// Builds (or reuses) the modules of `dirs` for every side; every patch of a side not in
    /// the cache applies before anything is built.
    pub(super) fn modules_group(
        &mut self,
        tree: &Path,
        sides: &[&PatchedSpec],
        dirs: &[String],
        config_sha: &str,
    ) -> Result<Vec<Built>, BuildError> {
        let how = modules_how(dirs);
        let unbuilt: Vec<&PatchedSpec> = sides
            .iter()
            .copied()
            .filter(|s| {
                self.cached(&self.key(&how, config_sha, &s.patches))
                    .is_none()
            })
            .collect();
        self.check_applies(tree, unbuilt.into_iter())?;
        let mut out = Vec::new();
        for s in sides {
            out.push(self.build_modules(s, dirs, config_sha)?);
        }
        Ok(out)
    }

    /// Debian's config prepared for module builds (`prepared/`, `O=` of every module build):
    /// olddefconfig and `modules_prepare`, once per source version. What a failed prepare
    /// wrote goes.
    pub(super) fn prepared(&mut self) -> Result<(PathBuf, BuildConfig), BuildError> {
        let tree = self.source()?;
        let prepared = self.root().join(layout::PREPARED);
        let marker = prepared.join(".hvlab-prepared");
        if let Ok(text) = std::fs::read_to_string(&marker) {
            // Its last use, for `hvlab cache prune`: every module build reads it.
            hold::touch(&prepared);
            return Ok((prepared, read_config_marker(&text)));
        }
        let _ = std::fs::remove_dir_all(&prepared);
        std::fs::create_dir_all(&prepared).map_err(io(&prepared))?;
        let (debian, debian_text) = self.debian_config()?;
        let config = prepared.join(".config");
        std::fs::write(&config, &debian_text).map_err(io(&config))?;
        let symvers = self.root().join("Module.symvers");
        std::fs::copy(&symvers, prepared.join("Module.symvers")).map_err(io(&symvers))?;
        let log = self.log("modules_prepare");
        let release = self.image.release.clone();
        let step = "olddefconfig and modules_prepare of Debian's config";
        let work = Work::new(self.root(), "prepare")?;
        let o = format!("O={}", prepared.display());
        or_remove(&prepared, || {
            for (what, target) in [
                ("olddefconfig", "olddefconfig"),
                ("modules_prepare", "modules_prepare"),
            ] {
                let args = vec![
                    o.clone(),
                    format!("KERNELRELEASE={release}"),
                    target.to_string(),
                ];
                let tmp = work.tmp();
                self.timed(what, |me| {
                    me.make(
                        &tree,
                        &Laid::Unpatched,
                        vec![&prepared],
                        &tmp,
                        BuildKind::Modules,
                        &log,
                    )
                    .run(&args)
                    .map_err(make_error(false, step, &log))
                })?;
            }
            let ours = KConfig::read(&config).map_err(io(&config))?;
            let note = BuildConfig::Debian {
                release: release.clone(),
                lost: debian.lost_in(&ours),
            };
            std::fs::write(&marker, config_marker(&note)).map_err(io(&marker))?;
            Ok((prepared.clone(), note))
        })
    }

    fn build_modules(
        &mut self,
        side: &PatchedSpec,
        dirs: &[String],
        config_sha: &str,
    ) -> Result<Built, BuildError> {
        let key = self.key(&modules_how(dirs), config_sha, &side.patches);
        let (entry, info) = match self.cached(&key) {
            Some(hit) => hit,
            None => self.fresh_modules_entry(side, dirs, &key)?,
        };
        let mut kernel = from_tree(&entry.join("kernel")).ok_or_else(|| {
            BuildError::Io(
                entry.clone(),
                std::io::Error::other("the cached build holds no kernel"),
            )
        })?;
        kernel.spec = side.given.clone();
        kernel.source = describe_source(&self.image, &info);
        Ok(Built {
            kernel,
            build: Some(info),
        })
    }

    /// Builds the modules of `dirs` for `side` into the new cache entry `key`: the image's
    /// tree with the rebuilt modules in place of the shipped ones.
    fn fresh_modules_entry(
        &mut self,
        side: &PatchedSpec,
        dirs: &[String],
        key: &str,
    ) -> Result<(PathBuf, BuildInfo), BuildError> {
        let (prepared, config_note) = self.prepared()?;
        let tree = self.source_tree();
        let job = ModulesJob {
            dirs,
            release: self.image.release.clone(),
            image_dir: self.image.dir(),
            patched: !side.patches.is_empty(),
            label: Self::side_label(side),
            log: self.log(&format!("modules-{key}")),
            prepared,
        };
        let mut built_modules: Vec<String> = Vec::new();
        let (tmp, notes, steps) =
            self.build_entry(&tree.clone(), key, side, |me, laid, work, entry| {
                let base = me.root().join(layout::MODULES_OUT);
                hold::touch(&base);
                let out = if job.patched {
                    own_output(&base, &work.out())?;
                    work.out()
                } else {
                    base
                };
                let build = |me: &mut SourceCache<'_>| {
                    me.make_module_dirs(&tree, laid, &out, work, &job)?;
                    install_rebuilt_modules(&out, entry, &job)
                };
                built_modules = if job.patched {
                    build(me)?
                } else {
                    or_remove(&out.clone(), || build(me))?
                };
                Ok(())
            })?;
        let how = How::Modules {
            dirs: dirs.to_vec(),
            modules: built_modules,
        };
        let info = self.record(how, config_note, side, notes, steps, key);
        Ok((self.finish_entry(key, &tmp, &info)?, info))
    }

    /// `make M=DIR MO=OUT/DIR modules` in each of the job's directories, one timed step each:
    /// the source and the prepared config read-only, `out` the only directory written.
    fn make_module_dirs(
        &mut self,
        tree: &Path,
        laid: &Laid,
        out: &Path,
        work: &Work,
        job: &ModulesJob,
    ) -> Result<(), BuildError> {
        for dir in job.dirs {
            let step = format!("make M={dir} ({})", job.label);
            // Kbuild puts a module's objects under MO as it does under the tree: `virt/kvm`'s
            // of `arch/x86/kvm` (`$(KVM) = ../../../virt/kvm`) land at OUT/virt/kvm.
            let mo = out.join(dir);
            std::fs::create_dir_all(&mo).map_err(io(&mo))?;
            let args = vec![
                format!("O={}", job.prepared.display()),
                format!("KERNELRELEASE={}", job.release),
                MODULE_DEBUG_INFO.to_string(),
                format!("M={dir}"),
                format!("MO={}", mo.display()),
                "modules".to_string(),
            ];
            let tmp = work.tmp();
            self.timed(&step, |me| {
                me.make(tree, laid, vec![out], &tmp, BuildKind::Modules, &job.log)
                    .run(&args)
                    .map_err(make_error(job.patched, &step, &job.log))
            })?;
        }
        Ok(())
    }
}

/// One modules build of a side: what `make M=` builds, and what its modules must match.
struct ModulesJob<'a> {
    /// The module directories (`arch/x86/kvm`).
    dirs: &'a [String],
    /// The image's `uname -r`.
    release: String,
    /// The image's unpacked tree in the cache.
    image_dir: PathBuf,
    /// Whether the side has patches (a compile error is then the patch's).
    patched: bool,
    /// The side, for the step names.
    label: String,
    /// The build log.
    log: PathBuf,
    /// Debian's config prepared (`O=`).
    prepared: PathBuf,
}

/// The image's tree, hard-linked into `tmp/kernel`, with the modules built in `out` in place
/// of the shipped (compressed) ones; returns the modules' file names.
fn install_rebuilt_modules(
    out: &Path,
    tmp: &Path,
    job: &ModulesJob,
) -> Result<Vec<String>, BuildError> {
    let kernel_dir = tmp.join("kernel");
    link_tree(&job.image_dir, &kernel_dir)?;
    let linked = from_tree(&kernel_dir)
        .and_then(|k| k.modules)
        .ok_or_else(|| {
            BuildError::Io(
                kernel_dir.clone(),
                std::io::Error::other("no modules directory in the image"),
            )
        })?;
    let mut built_modules: Vec<String> = Vec::new();
    for dir in job.dirs {
        let order = out.join(dir).join("modules.order");
        let names = std::fs::read_to_string(&order).map_err(io(&order))?;
        for obj in names.lines().filter(|l| !l.is_empty()) {
            built_modules.push(replace_module(out, dir, obj, &linked, job)?);
        }
    }
    Ok(built_modules)
}

/// Puts the module `obj` (of `modules.order` in `dir`) built in `out` in place of the image's
/// in `linked`, after checking its vermagic against the one it replaces; returns its file name.
fn replace_module(
    out: &Path,
    dir: &str,
    obj: &str,
    linked: &Path,
    job: &ModulesJob,
) -> Result<String, BuildError> {
    let rel = obj.trim_end_matches(".o");
    let built = out.join(dir).join(format!("{rel}.ko"));
    let bytes = std::fs::read(&built).map_err(io(&built))?;
    let dest_dir = linked
        .join("kernel")
        .join(dir)
        .join(Path::new(rel).parent().unwrap_or(Path::new("")));
    let stem = Path::new(rel)
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let shipped_magic = remove_shipped_module(&dest_dir, &stem)?;
    check_vermagic(&stem, &bytes, shipped_magic, job)?;
    std::fs::create_dir_all(&dest_dir).map_err(io(&dest_dir))?;
    let dest = dest_dir.join(format!("{stem}.ko"));
    std::fs::write(&dest, &bytes).map_err(io(&dest))?;
    Ok(format!("{stem}.ko"))
}

/// Removes the image's module `stem` from `dest_dir` in any of its compressions; returns the
/// vermagic of the first one found.
fn remove_shipped_module(dest_dir: &Path, stem: &str) -> Result<Option<String>, BuildError> {
    let mut expected: Option<String> = None;
    for ext in [".ko", ".ko.xz", ".ko.zst", ".ko.gz"] {
        let old = dest_dir.join(format!("{stem}{ext}"));
        if old.is_file() {
            if expected.is_none() {
                expected = ko::bytes(&old).ok().map(|b| vermagic(&b));
            }
            std::fs::remove_file(&old).map_err(io(&old))?;
        }
    }
    Ok(expected)
}

/// The rebuilt module `stem` must carry the vermagic of the one it replaces (or, without one,
/// start with the image's release).
fn check_vermagic(
    stem: &str,
    bytes: &[u8],
    shipped_magic: Option<String>,
    job: &ModulesJob,
) -> Result<(), BuildError> {
    let built_magic = vermagic(bytes);
    let expected = shipped_magic.unwrap_or_else(|| format!("{} ", job.release));
    let matches = if expected.ends_with(' ') && !expected.contains(" SMP") {
        built_magic.starts_with(&expected)
    } else {
        built_magic == expected
    };
    if !matches {
        return Err(BuildError::Vermagic {
            module: format!("{stem}.ko"),
            built: built_magic,
            expected,
            log: job.log.clone(),
        });
    }
    Ok(())
}
