//! Patched kernels: `SPEC+PATCH[+PATCH...]` (`debian:7.3+fix.patch`), rebuilt from Debian's
//! source of exactly the image's version, so a patch is judged without a kernel build of the
//! user's own.
//!
//! Where the patch goes decides the build ([`super::kbuild::plan`]):
//! - modules only (KVM's `virt/kvm/`, `arch/x86/kvm/`, any `obj-m`): Debian's `.config` and
//!   `Module.symvers` from the headers package, `make olddefconfig`, `modules_prepare` once
//!   per source version (`O=prepared`), then `make M=DIR MO=OUT/DIR` with `KERNELRELEASE` of
//!   the image; the rebuilt `.ko` files replace the image's (after a `vermagic` check) in a
//!   tree of hard links to it;
//! - built-in code: a whole kernel from a minimal guest config ([`GUEST_CONFIG`] plus the HZ,
//!   preemption, RCU and KVM options of Debian's config), `make O=OUT`, the patched side
//!   incrementally from the unpatched one's output;
//! - nothing a build uses (documentation): the image as shipped, on both sides.
//!
//! A commit of a git tree (`git:PATH@REF[+PATCH...]`, see [`crate::kernel::git`]) is built
//! whole from the same minimal guest config, in hvlab's own clone of the repository and one
//! output directory per repository, so moving between commits rebuilds incrementally.
//! [`range_steps`] gives the steps of a git range (its commits).
//!
//! The unpatched side is rebuilt the same way from the same tree with the same compiler, so
//! A and B differ by the patch alone. Every build is cached under hvlab's cache by source
//! version, config, compiler and patch hashes; an entry is written in a temporary directory
//! and renamed into place when complete, and the tree is restored after each patched build
//! (a journal of the originals survives a crash), so nothing half-built is ever reused.

mod cache;
mod error;
mod git;
mod make;
mod modules;
mod note;
mod prefixes;
mod record;
mod spec;
mod whole;

pub use super::progress::{BuildProgress, Silent};
pub use error::BuildError;
pub use make::make_out_of_tree;
pub use note::{BaseConfig, BuildConfig, BuildNote, PreemptModel, Preemption};
pub use prefixes::{Series, SeriesStep, range_steps};
pub use record::{BuildInfo, How, PatchInfo, Step};
pub use spec::PatchedSpec;
pub use whole::GUEST_CONFIG;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::debian::{self, DebianImage};
use super::git::{GitSpec, Revs};
use super::kbuild::{self, Placement, Plan};
use super::patch::sha256_hex;
use super::sandbox::{Confinement, Sandbox, SandboxPolicy};
use super::source::KernelSource;
use super::{Kernel, KernelError, toolchain};
use cache::SourceCache;

/// A kernel under test, with how it was made when hvlab made it.
#[derive(Debug, Clone, Serialize)]
pub struct Built {
    /// The kernel.
    pub kernel: Kernel,
    /// How it was built; `None` for a kernel used as given.
    pub build: Option<BuildInfo>,
}

/// Kernels resolved together: each side, the steps they shared, and what the reader must know.
#[derive(Debug, Clone, Serialize)]
pub struct Resolved {
    /// Per spec, in order.
    pub sides: Vec<Built>,
    /// Fetching, unpacking and preparing the source (shared by the sides).
    pub steps: Vec<Step>,
    /// What the reader must know about the comparison (A and B differ by the patch alone).
    pub notes: Vec<BuildNote>,
    /// The unpacked source trees the patched sides were built from, unpatched between
    /// builds: where a patch's functions are read ([`crate::kernel::reach`]).
    pub source_trees: Vec<PathBuf>,
}

/// Resolves kernel specs, building the patched ones: sides on the same Debian image share its
/// source, and an unpatched side beside a patched one is rebuilt from it too. A git side is
/// built from its commit; `config` is `--config FILE`, the config whose tick, preemption, RCU
/// and KVM options its minimal guest config keeps (else Debian's of the nearest version
/// cached).
pub fn resolve_with_config(
    specs: &[PatchedSpec],
    policy: SandboxPolicy,
    config: Option<&Path>,
    progress: &dyn BuildProgress,
) -> Result<Resolved, BuildError> {
    let mut git: Vec<(usize, &Path, &Revs)> = Vec::new();
    let mut other: Vec<usize> = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        match &spec.source {
            KernelSource::Git { repo, revs } => git.push((i, repo, revs)),
            KernelSource::Debian { .. }
            | KernelSource::Tree { .. }
            | KernelSource::BzImage { .. } => other.push(i),
        }
    }
    if git.is_empty() {
        return resolve_debian(specs, policy, progress);
    }
    check_toolchain()?;
    let sandbox = Sandbox::choose(policy)?;
    let mut sides: Vec<Option<Built>> = vec![None; specs.len()];
    let mut steps = Vec::new();
    let mut notes = Vec::new();
    let mut source_trees = Vec::new();
    for &(i, repo, revs) in &git {
        let commit = GitSpec::resolve(&specs[i].base, repo, revs)?;
        let (built, mut own) = git::build_git_side(&specs[i], &commit, config, &sandbox, progress)?;
        if let Some(b) = &built.build {
            notes.extend(b.notes.iter().cloned());
        }
        sides[i] = Some(built);
        steps.append(&mut own);
    }
    if git.len() > 1 {
        notes.push(BuildNote::GitSidesAlike);
    }
    if !other.is_empty() {
        let rest: Vec<PatchedSpec> = other.iter().map(|&i| specs[i].clone()).collect();
        let mut resolved = resolve_debian(&rest, policy, progress)?;
        for (&i, b) in other.iter().zip(resolved.sides) {
            sides[i] = Some(b);
        }
        steps.append(&mut resolved.steps);
        notes.append(&mut resolved.notes);
        source_trees.append(&mut resolved.source_trees);
        notes.push(BuildNote::GitBesideOther);
    }
    Ok(Resolved {
        sides: sides.into_iter().flatten().collect(),
        steps,
        notes,
        source_trees,
    })
}

/// [`resolve_with_config`] of specs none of which is a git tree (the spec's reading refused
/// patches on a kernel given as built).
fn resolve_debian(
    parsed: &[PatchedSpec],
    policy: SandboxPolicy,
    progress: &dyn BuildProgress,
) -> Result<Resolved, BuildError> {
    if parsed.iter().all(|p| p.patches.is_empty()) {
        return resolve_as_given(parsed, progress);
    }
    // Before anything is fetched.
    check_toolchain()?;
    let sandbox = Sandbox::choose(policy)?;
    let images = fetch_images(parsed, progress)?;
    let mut steps = Vec::new();
    let mut notes = Vec::new();
    let mut source_trees = Vec::new();
    let sides = build_image_groups(
        parsed,
        &images,
        &sandbox,
        progress,
        &mut steps,
        &mut notes,
        &mut source_trees,
    )?;
    let out = complete_sides(sides, parsed, &images, progress)?;
    if out.len() == 2 && (out[0].build.is_some() != out[1].build.is_some()) {
        notes.push(BuildNote::GivenBesideRebuilt);
    }
    Ok(Resolved {
        sides: out,
        steps,
        notes,
        source_trees,
    })
}

/// Specs without patches: each kernel as given, nothing built.
fn resolve_as_given(
    parsed: &[PatchedSpec],
    progress: &dyn BuildProgress,
) -> Result<Resolved, BuildError> {
    let sides = parsed
        .iter()
        .map(|p| {
            Ok(Built {
                kernel: super::resolve(&p.given, &p.source, progress)?,
                build: None,
            })
        })
        .collect::<Result<Vec<_>, KernelError>>()?;
    Ok(Resolved {
        sides,
        steps: Vec::new(),
        notes: Vec::new(),
        source_trees: Vec::new(),
    })
}

/// Fails, naming the packages to install, when this host lacks a tool a kernel build needs.
fn check_toolchain() -> Result<(), BuildError> {
    let missing = toolchain::missing();
    if !missing.is_empty() {
        let names: Vec<String> = missing.iter().map(toolchain::Requirement::name).collect();
        let mut packages: Vec<&str> = missing.iter().map(|r| r.package).collect();
        packages.dedup();
        return Err(BuildError::MissingTools {
            names: names.join(", "),
            packages: packages.join(" "),
        });
    }
    Ok(())
}

/// The Debian image of each spec (`None` for a spec not on Debian), one lookup per version
/// named: sides on the same version share it.
fn fetch_images(
    parsed: &[PatchedSpec],
    progress: &dyn BuildProgress,
) -> Result<Vec<Option<DebianImage>>, BuildError> {
    let mut fetched: BTreeMap<&str, DebianImage> = BTreeMap::new();
    let mut images: Vec<Option<DebianImage>> = Vec::new();
    for p in parsed {
        images.push(match &p.source {
            KernelSource::Debian { version } => Some(match fetched.get(version.as_str()) {
                Some(image) => image.clone(),
                None => {
                    let image = debian::fetch_image(version, progress)?;
                    fetched.insert(version, image.clone());
                    image
                }
            }),
            KernelSource::Git { .. } | KernelSource::Tree { .. } | KernelSource::BzImage { .. } => {
                None
            }
        });
    }
    Ok(images)
}

/// Builds every side on an image that has a patched side, one source per image; the sides
/// left `None` are taken as they are ([`complete_sides`]).
fn build_image_groups(
    parsed: &[PatchedSpec],
    images: &[Option<DebianImage>],
    sandbox: &Sandbox,
    progress: &dyn BuildProgress,
    steps: &mut Vec<Step>,
    notes: &mut Vec<BuildNote>,
    source_trees: &mut Vec<PathBuf>,
) -> Result<Vec<Option<Built>>, BuildError> {
    let mut sides: Vec<Option<Built>> = vec![None; parsed.len()];
    // One group per image that has a patched side: every side on that image builds from it.
    let mut done: BTreeSet<usize> = BTreeSet::new();
    for (i, p) in parsed.iter().enumerate() {
        if p.patches.is_empty() || done.contains(&i) {
            continue;
        }
        let Some(image) = images[i].clone() else {
            continue;
        };
        let group: Vec<usize> = (0..parsed.len())
            .filter(|&j| {
                images[j]
                    .as_ref()
                    .is_some_and(|m| m.package == image.package && m.version == image.version)
            })
            .collect();
        let members: Vec<&PatchedSpec> = group.iter().map(|&j| &parsed[j]).collect();
        let mut source = SourceCache::open(&image, sandbox, progress)?;
        let built = source.build_group(&members, notes);
        notes.append(&mut source.notes);
        let built = built?;
        steps.append(&mut source.steps);
        source_trees.push(source.source_tree());
        for (&j, b) in group.iter().zip(built) {
            sides[j] = Some(b);
            done.insert(j);
        }
    }
    Ok(sides)
}

/// The sides not built: the Debian image as shipped, or the kernel the spec names.
fn complete_sides(
    sides: Vec<Option<Built>>,
    parsed: &[PatchedSpec],
    images: &[Option<DebianImage>],
    progress: &dyn BuildProgress,
) -> Result<Vec<Built>, BuildError> {
    let mut out = Vec::new();
    for (i, side) in sides.into_iter().enumerate() {
        out.push(match side {
            Some(b) => b,
            None => Built {
                kernel: match &images[i] {
                    Some(image) => {
                        let mut k = image.kernel.clone();
                        k.spec = parsed[i].given.clone();
                        k
                    }
                    None => super::resolve(&parsed[i].given, &parsed[i].source, progress)?,
                },
                build: None,
            },
        });
    }
    Ok(out)
}

impl SourceCache<'_> {
    /// Builds (or reuses) every side of a group on this image, as [`kbuild::plan`] says.
    fn build_group(
        &mut self,
        sides: &[&PatchedSpec],
        notes: &mut Vec<BuildNote>,
    ) -> Result<Vec<Built>, BuildError> {
        let tree = self.source()?;
        let (debian, debian_text) = self.debian_config()?;
        let touched: BTreeSet<String> = sides.iter().flat_map(|s| s.touched()).collect();
        let (plan, placed) = kbuild::plan(&tree, &debian, &touched);
        let config_sha = sha256_hex(debian_text.as_bytes());
        match plan {
            Plan::Nothing => self.as_shipped(&tree, sides, &placed, notes),
            Plan::Modules { dirs, modules } => {
                if sides.len() > 1 {
                    notes.push(BuildNote::ModulesAlike {
                        release: self.image.release.clone(),
                        modules: modules.clone(),
                    });
                }
                self.modules_group(&tree, sides, &dirs, &config_sha)
            }
            Plan::Whole { why } => {
                notes.push(BuildNote::WholeKernel { why });
                if sides.len() > 1 {
                    notes.push(BuildNote::WholeAlike);
                }
                self.whole_group(&tree, sides, &config_sha)
            }
        }
    }

    /// Every side as the image ships it, when the patches touch nothing a build uses.
    fn as_shipped(
        &self,
        tree: &Path,
        sides: &[&PatchedSpec],
        placed: &[(String, Placement)],
        notes: &mut Vec<BuildNote>,
    ) -> Result<Vec<Built>, BuildError> {
        let why = placed
            .iter()
            .map(|(f, p)| match p {
                Placement::NotBuilt { why } => format!("{f}: {why}"),
                _ => f.clone(),
            })
            .collect::<Vec<_>>()
            .join(", ");
        // Still refuse a patch that does not apply.
        self.check_applies(tree, sides.iter().copied())?;
        notes.push(BuildNote::NothingBuilt {
            why: why.clone(),
            release: self.image.release.clone(),
        });
        Ok(sides
            .iter()
            .map(|s| {
                let mut kernel = self.image.kernel.clone();
                kernel.spec = s.given.clone();
                Built {
                    kernel,
                    build: Some(BuildInfo {
                        how: How::AsShipped { why: why.clone() },
                        source: self.image.kernel.source.clone(),
                        config: BuildConfig::AsShipped,
                        compiler: "Debian's".into(),
                        patches: s.patches.iter().map(PatchInfo::from).collect(),
                        notes: Vec::new(),
                        steps: Vec::new(),
                        key: String::new(),
                        cached: true,
                        sandbox: Confinement::NothingBuilt,
                    }),
                }
            })
            .collect())
    }
}
