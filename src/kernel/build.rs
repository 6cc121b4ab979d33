//! Patched kernels: `SPEC+PATCH[+PATCH...]` (`debian:7.3+fix.patch`), rebuilt from Debian's
//! source of exactly the image's version, so a patch is judged without a kernel build of the
//! user's own.
//!
//! Where the patch goes decides the build ([`super::kbuild::plan`]):
//! - modules only (KVM's `virt/kvm/`, `arch/x86/kvm/`, any `obj-m`): Debian's `.config` and
//!   `Module.symvers` from the headers package, `make olddefconfig`, `modules_prepare` once
//!   per source version, then `make M=DIR` with `KERNELRELEASE` of the image; the rebuilt
//!   `.ko` files replace the image's (after a `vermagic` check) in a tree of hard links to it;
//! - built-in code: a whole kernel from a minimal guest config ([`GUEST_CONFIG`] plus the HZ,
//!   preemption, RCU and KVM options of Debian's config), the patched tree incrementally;
//! - nothing a build uses (documentation): the image as shipped, on both sides.
//!
//! The unpatched side is rebuilt the same way from the same tree with the same compiler, so
//! A and B differ by the patch alone. Every build is cached under hvlab's cache by source
//! version, config, compiler and patch hashes; an entry is written in a temporary directory
//! and renamed into place when complete, and the tree is restored after each patched build
//! (a journal of the originals survives a crash), so nothing half-built is ever reused.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::confine::{self, ConfineError};
use super::debian::{self, BuildInputs, DebianImage};
use super::journal::{self, JournalError, apply};
use super::kbuild::{self, KConfig, Placement, Plan};
use super::patch::{PatchError, PatchFile, sha256_hex};
use super::sandbox::{self, Confinement, Ended, Sandbox, SandboxError, SandboxPolicy};
use super::{Kernel, KernelError, cache_dir, from_tree, toolchain};

/// Bumped when the way hvlab builds changes, so older cache entries are not reused.
// 3: builds run sandboxed; an entry built before may hold what an unconfined patch left.
const RECIPE: &str = "hvlab-kbuild-3";

/// Why a patched kernel cannot be built.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum BuildError {
    /// Building a patched kernel needs {names}, which this host lacks; nothing was fetched. Install them and run again: apt-get install {packages}
    MissingTools {
        /// The programs and headers.
        names: String,
        /// Their Debian packages.
        packages: String,
    },
    /// {0}
    Patch(#[from] PatchError),
    /// {0}
    Kernel(#[from] KernelError),
    /// Kernel spec `{spec}`: patch file {path} does not exist. Give SPEC+PATCH[+PATCH...], each PATCH a readable file.
    NoPatchFile {
        /// The spec.
        spec: String,
        /// The missing file.
        path: String,
    },
    /// Kernel spec `{spec}` reads two ways: `{first}` or `{second}`. Rename the patch, or the file it collides with, so that only one reading names existing files.
    AmbiguousSpec {
        /// The spec.
        spec: String,
        /// One reading, its files joined by " + ".
        first: String,
        /// Another.
        second: String,
    },
    /// Kernel spec `{spec}`: {path} is a directory, not a patch file. Give SPEC+PATCH[+PATCH...], each PATCH a unified diff, a git format-patch file or an mbox.
    PatchIsDirectory {
        /// The spec.
        spec: String,
        /// The directory.
        path: String,
    },
    /// Kernel spec `{spec}`: `+{suffix}` is part of Debian's own version string, not a patch. Give the upstream version (debian:7.3 or debian:7.3.4), then +PATCH.
    DebianVersionSuffix {
        /// The spec.
        spec: String,
        /// The token after the version.
        suffix: String,
    },
    /// Kernel spec `{spec}`: hvlab rebuilds patched kernels from Debian's source only; give debian:VERSION+PATCH (e.g. debian:7.3+fix.patch).
    NotDebian {
        /// The spec.
        spec: String,
    },
    /// {patch} does not apply to {against}: {what}. Rebase it onto that source (unpacked in {tree}).
    DoesNotApply {
        /// The patch file, and the message of a series.
        patch: String,
        /// The source it was applied to.
        against: String,
        /// Which hunk of which file, and how it failed.
        what: String,
        /// The unpacked source.
        tree: PathBuf,
    },
    /// The patched kernel does not compile ({step}); the first errors:{errors}full log: {log}
    PatchedCompile {
        /// What was being built.
        step: String,
        /// The first compiler errors.
        errors: String,
        /// The whole log.
        log: PathBuf,
    },
    /// The unpatched source does not build on this host ({step}), so no patch can be judged here; the first errors:{errors}full log: {log}
    BaseCompile {
        /// What was being built.
        step: String,
        /// The first errors.
        errors: String,
        /// The whole log.
        log: PathBuf,
    },
    /// {module} was built for `{built}` but the kernel under test loads only `{expected}`, so it would not load; the build was discarded. Report this to hvlab with the log: {log}
    Vermagic {
        /// The module.
        module: String,
        /// Its vermagic.
        built: String,
        /// The image's.
        expected: String,
        /// The build log.
        log: PathBuf,
    },
    /// The minimal guest config of {of} cannot set {option}={wanted} (olddefconfig left it `{got}`), which hvlab in the guest needs; config: {config}
    GuestConfig {
        /// The source.
        of: String,
        /// The option.
        option: String,
        /// What hvlab asked.
        wanted: String,
        /// What olddefconfig left.
        got: String,
        /// The config.
        config: PathBuf,
    },
    /// {0}
    Confined(#[from] ConfineError),
    /// {0}
    Journal(#[from] JournalError),
    /// Putting the source tree {tree} back after a patch failed ({why}); it is marked damaged, and the next run unpacks it again: run again.
    Damaged {
        /// The tree.
        tree: PathBuf,
        /// Why the restore failed.
        why: String,
    },
    /// {0}
    Sandbox(#[from] SandboxError),
    /// The build ({step}) tried to write {path}, outside its tree, and the sandbox refused: `{line}`. Nothing outside the tree was written; {fix}. Full log: {log}
    WroteOutside {
        /// What was being built.
        step: String,
        /// The path outside the tree.
        path: PathBuf,
        /// The log's line.
        line: String,
        /// What to do: remove that write from the patch, or report the unpatched source's.
        fix: &'static str,
        /// The whole log.
        log: PathBuf,
        /// Whether the side is patched (then it is the patch's doing).
        patched: bool,
    },
    /// Interrupted by {name} during {step}: make and everything it started were ended, and nothing half-built is kept.
    Interrupted {
        /// What was being built.
        step: String,
        /// The signal number.
        signal: i32,
        /// Its name.
        name: &'static str,
    },
    /// Cannot use {0}: {1}
    Io(PathBuf, std::io::Error),
}

impl BuildError {
    /// 2 for a patch or spec the user can fix, 3 for what this host cannot do, 4 for I/O,
    /// 128 + the signal for an interrupted build.
    pub fn exit_code(&self) -> i32 {
        match self {
            BuildError::Interrupted { signal, .. } => 128 + signal,
            BuildError::Sandbox(e) => e.exit_code(),
            BuildError::WroteOutside { patched: false, .. } => 3,
            BuildError::MissingTools { .. }
            | BuildError::BaseCompile { .. }
            | BuildError::Vermagic { .. }
            | BuildError::GuestConfig { .. } => 3,
            BuildError::Kernel(e) => e.exit_code(),
            BuildError::Io(..) | BuildError::Journal(_) | BuildError::Damaged { .. } => 4,
            // A patch naming a path outside the tree, or through a symlink: the patch's fault.
            BuildError::Confined(_) => 2,
            _ => 2,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |e| BuildError::Io(path.to_path_buf(), e)
}

/// A kernel spec with its patches: `debian:7.3+a.patch+b.patch`.
#[derive(Debug, Clone)]
pub struct PatchedSpec {
    /// As given.
    pub given: String,
    /// The spec before the first patch (`debian:7.3`).
    pub base: String,
    /// The patches, in the order they apply.
    pub patches: Vec<PatchFile>,
}

impl PatchedSpec {
    /// Splits at `+`. A `+` inside a file name works when the whole name exists; a spec that
    /// reads two ways (`amb+x.patch` beside both `amb` and `amb+x.patch`) is refused, naming
    /// both readings. `+debNN` after a Debian version is the start of Debian's own version
    /// string, not a patch.
    pub fn parse(spec: &str) -> Result<PatchedSpec, BuildError> {
        let tokens: Vec<&str> = spec.split('+').collect();
        let (base, first_patch) = Self::base_of(spec, &tokens)?;
        let rest = &tokens[first_patch..];
        let readings = patch_readings(rest);
        let paths = match readings.as_slice() {
            [one] => one.clone(),
            [] => return Err(Self::first_missing(spec, rest)),
            [a, b, ..] => {
                return Err(BuildError::AmbiguousSpec {
                    spec: spec.to_string(),
                    first: a.join(" + "),
                    second: b.join(" + "),
                });
            }
        };
        let patches = paths
            .iter()
            .map(|p| PatchFile::read(Path::new(p)))
            .collect::<Result<Vec<_>, _>>()?;
        // Before anything is fetched: what the patch text alone says about its paths.
        confine::lexical(&patches)?;
        Ok(PatchedSpec {
            given: spec.to_string(),
            base,
            patches,
        })
    }

    /// The base spec and the index of the first patch token. A path base keeps every `+`
    /// until the path exists (a build tree named `linux+rt`).
    fn base_of(spec: &str, tokens: &[&str]) -> Result<(String, usize), BuildError> {
        let mut base = tokens.first().copied().unwrap_or_default().to_string();
        let mut i = 1;
        if base.starts_with("debian:") {
            if let Some(next) = tokens.get(1)
                && is_debian_version_suffix(next)
                && !Path::new(next).exists()
            {
                return Err(BuildError::DebianVersionSuffix {
                    spec: spec.to_string(),
                    suffix: (*next).to_string(),
                });
            }
            return Ok((base, i));
        }
        while !Path::new(&base).exists() && i < tokens.len() {
            base = format!("{base}+{}", tokens[i]);
            i += 1;
        }
        if !Path::new(&base).exists() {
            // Not a path: the base is the first token (its own resolver names it).
            return Ok((tokens.first().copied().unwrap_or_default().to_string(), 1));
        }
        Ok((base, i))
    }

    /// The error for patch tokens no reading turns into files: the first name that is not a
    /// readable regular file, shortest first.
    fn first_missing(spec: &str, rest: &[&str]) -> BuildError {
        let name = rest.first().copied().unwrap_or_default();
        for n in 1..=rest.len() {
            let joined = rest[..n].join("+");
            if Path::new(&joined).is_dir() {
                return BuildError::PatchIsDirectory {
                    spec: spec.to_string(),
                    path: joined,
                };
            }
        }
        BuildError::NoPatchFile {
            spec: spec.to_string(),
            path: name.to_string(),
        }
    }
    /// Every file the patches change.
    pub fn touched(&self) -> BTreeSet<String> {
        self.patches.iter().flat_map(PatchFile::touched).collect()
    }
}

/// Every way to read `tokens` (a spec split at `+`) as a list of existing regular files.
fn patch_readings(tokens: &[&str]) -> Vec<Vec<String>> {
    if tokens.is_empty() {
        return vec![Vec::new()];
    }
    let mut out = Vec::new();
    for n in 1..=tokens.len() {
        let path = tokens[..n].join("+");
        if path.is_empty() || !Path::new(&path).is_file() {
            continue;
        }
        for mut tail in patch_readings(&tokens[n..]) {
            tail.insert(0, path.clone());
            out.push(tail);
            if out.len() > 1 {
                // Two readings are enough to refuse the spec.
                return out;
            }
        }
    }
    out
}

/// `deb13`, `deb13u1`, `bpo13`: the tail of a Debian version (`7.3.4+deb13-amd64`).
fn is_debian_version_suffix(token: &str) -> bool {
    ["deb", "bpo"].iter().any(|p| {
        token
            .strip_prefix(p)
            .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// A patch as the output names it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PatchInfo {
    /// The file name.
    pub file: String,
    /// The path given.
    pub path: PathBuf,
    /// Its sha256.
    pub sha256: String,
    /// The subjects of its messages (a series), when mail.
    pub subjects: Vec<String>,
    /// The files it changes.
    pub files: Vec<String>,
}

impl From<&PatchFile> for PatchInfo {
    fn from(p: &PatchFile) -> PatchInfo {
        PatchInfo {
            file: p.name(),
            path: p.path.clone(),
            sha256: p.sha256.clone(),
            subjects: p.patches.iter().filter_map(|m| m.subject.clone()).collect(),
            files: p.touched().into_iter().collect(),
        }
    }
}

/// How a kernel under test was made.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum How {
    /// The image as shipped with the modules of `dirs` rebuilt.
    Modules {
        /// `make M=` directories.
        dirs: Vec<String>,
        /// The modules rebuilt (`kvm.ko`).
        modules: Vec<String>,
    },
    /// A whole kernel from the minimal guest config.
    Whole,
    /// The image as shipped: the patches touch nothing a build uses.
    AsShipped {
        /// Why.
        why: String,
    },
}

/// A timed step.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Step {
    /// What ran.
    pub what: String,
    /// Its wall time.
    pub secs: f64,
}

/// What hvlab built, or reused, for one kernel under test.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildInfo {
    /// How.
    pub how: How,
    /// The source (`linux-source-7.3 7.3.4-1~bpo13+1 (Debian)`).
    pub source: String,
    /// The config, and what olddefconfig on this host changed in it.
    pub config: String,
    /// The compiler.
    pub compiler: String,
    /// The patches applied, in order.
    pub patches: Vec<PatchInfo>,
    /// Hunks applied at an offset or with fuzz.
    pub notes: Vec<String>,
    /// The build's own steps (none when reused).
    pub steps: Vec<Step>,
    /// The cache key.
    pub key: String,
    /// Whether this build came from the cache.
    #[serde(default)]
    pub cached: bool,
    /// How its commands ran: sandboxed, or not (`--no-sandbox`).
    #[serde(default)]
    pub sandbox: Confinement,
}

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
    /// Sentences about the comparison (`A and B differ by the patch alone`).
    pub notes: Vec<String>,
}

/// Where long steps are reported.
pub trait BuildProgress {
    /// A step starts.
    fn begin(&self, step: &str);
    /// It ended after `secs`.
    fn end(&self, step: &str, secs: f64);
}

/// No progress.
pub struct Silent;

impl BuildProgress for Silent {
    fn begin(&self, _: &str) {}
    fn end(&self, _: &str, _: f64) {}
}

/// Resolves kernel specs, building the patched ones: sides on the same Debian image share its
/// source, and an unpatched side beside a patched one is rebuilt from it too.
pub fn resolve(
    specs: &[&str],
    modules: Option<&Path>,
    policy: SandboxPolicy,
    progress: &dyn BuildProgress,
) -> Result<Resolved, BuildError> {
    let parsed = specs
        .iter()
        .map(|s| PatchedSpec::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    if parsed.iter().all(|p| p.patches.is_empty()) {
        return resolve_as_given(specs, modules);
    }
    for p in parsed.iter().filter(|p| !p.patches.is_empty()) {
        if !p.base.starts_with("debian:") {
            return Err(BuildError::NotDebian {
                spec: p.given.clone(),
            });
        }
    }
    // Before anything is fetched.
    check_toolchain()?;
    let sandbox = Sandbox::choose(policy)?;
    let images = fetch_images(&parsed)?;
    let mut steps = Vec::new();
    let mut notes = Vec::new();
    let sides = build_image_groups(&parsed, &images, &sandbox, progress, &mut steps, &mut notes)?;
    let out = complete_sides(sides, &parsed, &images, modules)?;
    if out.len() == 2 && (out[0].build.is_some() != out[1].build.is_some()) {
        notes.push(
            "one side is a kernel as given and the other was rebuilt here: they differ by more than the patch (source version, compiler, config)".into(),
        );
    }
    Ok(Resolved {
        sides: out,
        steps,
        notes,
    })
}

/// Specs without patches: each kernel as given, nothing built.
fn resolve_as_given(specs: &[&str], modules: Option<&Path>) -> Result<Resolved, BuildError> {
    let sides = specs
        .iter()
        .map(|s| {
            Ok(Built {
                kernel: super::resolve(s, modules)?,
                build: None,
            })
        })
        .collect::<Result<Vec<_>, KernelError>>()?;
    Ok(Resolved {
        sides,
        steps: Vec::new(),
        notes: Vec::new(),
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
fn fetch_images(parsed: &[PatchedSpec]) -> Result<Vec<Option<DebianImage>>, BuildError> {
    let mut fetched: BTreeMap<&str, DebianImage> = BTreeMap::new();
    let mut images: Vec<Option<DebianImage>> = Vec::new();
    for p in parsed {
        images.push(match p.base.strip_prefix("debian:") {
            Some(v) => Some(match fetched.get(v) {
                Some(image) => image.clone(),
                None => {
                    let image = debian::fetch_image(v)?;
                    fetched.insert(v, image.clone());
                    image
                }
            }),
            None => None,
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
    notes: &mut Vec<String>,
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
    modules: Option<&Path>,
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
                    None => super::resolve(&parsed[i].given, modules)?,
                },
                build: None,
            },
        });
    }
    Ok(out)
}

/// An exclusive `flock` on a file, held while the value lives.
struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    fn take(path: &Path, progress: &dyn BuildProgress) -> Result<DirLock, BuildError> {
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

/// One Debian source version in the cache: its trees and builds, locked while in use.
struct SourceCache<'a> {
    image: DebianImage,
    root: PathBuf,
    inputs: Option<BuildInputs>,
    compiler: String,
    sandbox: Sandbox,
    steps: Vec<Step>,
    /// What the reader must know about the source (a damaged tree unpacked again).
    notes: Vec<String>,
    progress: &'a dyn BuildProgress,
    _lock: DirLock,
}

/// The minimal guest: what hvlab's initramfs and scenarios need (64-bit SMP, serial console,
/// initramfs, devtmpfs, ACPI power-off, the syscalls hvlab uses, KVM with both vendor
/// modules). The options hvlab checks in every kernel under test are among them.
pub const GUEST_CONFIG: &[(&str, &str)] = &[
    ("CONFIG_64BIT", "y"),
    ("CONFIG_SMP", "y"),
    ("CONFIG_PRINTK", "y"),
    ("CONFIG_TTY", "y"),
    ("CONFIG_SERIAL_8250", "y"),
    ("CONFIG_SERIAL_8250_CONSOLE", "y"),
    ("CONFIG_BLK_DEV_INITRD", "y"),
    ("CONFIG_DEVTMPFS", "y"),
    ("CONFIG_PROC_FS", "y"),
    ("CONFIG_SYSFS", "y"),
    ("CONFIG_TMPFS", "y"),
    ("CONFIG_SHMEM", "y"),
    ("CONFIG_BINFMT_ELF", "y"),
    ("CONFIG_BINFMT_SCRIPT", "y"),
    ("CONFIG_MODULES", "y"),
    ("CONFIG_MODULE_UNLOAD", "y"),
    ("CONFIG_MULTIUSER", "y"),
    ("CONFIG_FUTEX", "y"),
    ("CONFIG_EPOLL", "y"),
    ("CONFIG_EVENTFD", "y"),
    ("CONFIG_SIGNALFD", "y"),
    ("CONFIG_TIMERFD", "y"),
    ("CONFIG_AIO", "y"),
    ("CONFIG_ADVISE_SYSCALLS", "y"),
    ("CONFIG_POSIX_TIMERS", "y"),
    ("CONFIG_FILE_LOCKING", "y"),
    ("CONFIG_IO_URING", "y"),
    ("CONFIG_USERFAULTFD", "y"),
    ("CONFIG_HUGETLBFS", "y"),
    ("CONFIG_TRANSPARENT_HUGEPAGE", "y"),
    ("CONFIG_MEMFD_CREATE", "y"),
    ("CONFIG_HIGH_RES_TIMERS", "y"),
    ("CONFIG_PERF_EVENTS", "y"),
    ("CONFIG_PCI", "y"),
    ("CONFIG_ACPI", "y"),
    ("CONFIG_HYPERVISOR_GUEST", "y"),
    ("CONFIG_PARAVIRT", "y"),
    ("CONFIG_KVM_GUEST", "y"),
    ("CONFIG_CPU_SUP_AMD", "y"),
    ("CONFIG_CPU_SUP_INTEL", "y"),
    ("CONFIG_VIRTUALIZATION", "y"),
    ("CONFIG_KVM", "m"),
    ("CONFIG_KVM_AMD", "m"),
    ("CONFIG_KVM_INTEL", "m"),
];

/// The options of Debian's config kept in the minimal guest: the tick (HZ, NO_HZ), the
/// preemption model, RCU and SRCU, and KVM's own, so the kernel under test waits for grace
/// periods the way the one users run does.
fn debian_part(debian_config: &str) -> Vec<String> {
    const PREFIXES: [&str; 8] = [
        "HZ",
        "NO_HZ",
        "PREEMPT",
        "RCU_",
        "TREE_RCU",
        "TREE_SRCU",
        "TASKS_",
        "KVM",
    ];
    debian_config
        .lines()
        .filter(|l| {
            let name = l
                .strip_prefix("CONFIG_")
                .or_else(|| l.strip_prefix("# CONFIG_"))
                .unwrap_or("");
            PREFIXES.iter().any(|p| name.starts_with(p)) && !name.starts_with("KVM_GUEST")
        })
        .map(str::to_string)
        .collect()
}

/// Why a `make` did not build.
enum MakeError {
    /// It failed: the first compiler errors.
    Failed(String),
    /// It tried to write outside its tree (whether or not make then failed).
    Outside(sandbox::RefusedWrite),
    /// hvlab was asked to stop by this signal; make and what it started were ended.
    Stopped(i32),
    /// The log could not be written, or make could not be started.
    Io(std::io::Error),
}

/// `make` in `tree`, in the sandbox (writable: the tree alone), with Kbuild's identity
/// variables fixed, appending to `log` (an fd hvlab opened). A refused write outside the tree
/// fails the build even when make went on (`$(shell ...)` failures do not stop make).
fn make(sandbox: &Sandbox, tree: &Path, args: &[String], log: &Path) -> Result<(), MakeError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(MakeError::Io)?;
    // Only this make's lines are read back: the log gathers every step of a build.
    let before = file.metadata().map_err(MakeError::Io)?.len();
    let err = file.try_clone().map_err(MakeError::Io)?;
    let mut cmd = sandbox.command("make", &[tree]);
    cmd.arg("-C")
        .arg(tree)
        .arg(format!("-j{}", toolchain::jobs()))
        .args(args)
        .env("LC_ALL", "C")
        .env("KBUILD_BUILD_USER", "hvlab")
        .env("KBUILD_BUILD_HOST", "hvlab")
        .env("KBUILD_BUILD_VERSION", "1")
        .env("KBUILD_BUILD_TIMESTAMP", "Thu Jan  1 00:00:00 UTC 2026")
        .env_remove("ARCH")
        .env_remove("CROSS_COMPILE")
        .env_remove("KBUILD_OUTPUT")
        .env_remove("KCONFIG_CONFIG")
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err);
    let status = match sandbox::run_to_end(cmd).map_err(MakeError::Io)? {
        Ended::Stopped(sig) => return Err(MakeError::Stopped(sig)),
        Ended::Exited(status) => status,
    };
    let bytes = std::fs::read(log).map_err(MakeError::Io)?;
    let own = bytes
        .get(usize::try_from(before).unwrap_or(usize::MAX)..)
        .unwrap_or_default();
    let text = String::from_utf8_lossy(own);
    if let Some(refused) = sandbox::refused_write(&text, &[tree]) {
        return Err(MakeError::Outside(refused));
    }
    if status.success() {
        return Ok(());
    }
    Err(MakeError::Failed(first_errors(&text)))
}

/// `make ARGS` in `tree` as every kernel build runs it: in `sandbox`, writable only there,
/// ended with hvlab; a failure or a write outside the tree is reported as a patched side's.
/// For a tree of the caller's own (tests, tools); builds go through the cache.
pub fn make_in_sandbox(
    sandbox: &Sandbox,
    tree: &Path,
    args: &[String],
    log: &Path,
) -> Result<(), BuildError> {
    make(sandbox, tree, args, log).map_err(make_error(true, "make", log))
}

/// The first compiler errors of a build log (with the source lines gcc quotes after them),
/// else its last lines; one indented line each, between newlines.
fn first_errors(log: &str) -> String {
    format!("\n{}\n", error_lines(log))
}

fn error_lines(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    if let Some(at) = lines
        .iter()
        .position(|l| l.contains(": error:") || l.contains(": fatal error:"))
    {
        // gcc's "In function" line before the first error says where.
        let from = if at > 0 && lines[at - 1].contains("In function") {
            at - 1
        } else {
            at
        };
        return lines[from..]
            .iter()
            .take(8)
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n");
    }
    lines
        .iter()
        .rev()
        .take(8)
        .rev()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A failed make's error: a compile error or a write outside the tree is the patch's fault
/// when the side is patched, else this host's.
fn make_error<'a>(
    patched: bool,
    step: &'a str,
    log: &'a Path,
) -> impl FnOnce(MakeError) -> BuildError + 'a {
    move |e| {
        let (step, log) = (step.to_string(), log.to_path_buf());
        match e {
            MakeError::Failed(errors) if patched => {
                BuildError::PatchedCompile { step, errors, log }
            }
            MakeError::Failed(errors) => BuildError::BaseCompile { step, errors, log },
            MakeError::Outside(refused) => BuildError::WroteOutside {
                step,
                path: refused.path,
                line: refused.line,
                fix: if patched {
                    "remove that write from the patch (a kernel build writes only in its tree)"
                } else {
                    "the unpatched source should never do this: report it to hvlab with the log"
                },
                log,
                patched,
            },
            MakeError::Stopped(signal) => BuildError::Interrupted {
                step,
                signal,
                name: crate::sys::signal_name(signal),
            },
            MakeError::Io(e) => BuildError::Io(log, e),
        }
    }
}

/// Puts `tree` back after a patch ([`journal::restore`]); when that fails, marks it damaged,
/// so the next run unpacks it again rather than failing on it forever.
fn restored(tree: &Path) -> Result<(), BuildError> {
    journal::restore(tree).map_err(|e| {
        let why = e.to_string();
        journal::mark_damaged(tree, &why);
        BuildError::Damaged {
            tree: tree.to_path_buf(),
            why,
        }
    })
}

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

/// A module's `vermagic=`.
fn vermagic(bytes: &[u8]) -> String {
    super::ko::modinfo(bytes, "vermagic")
        .into_iter()
        .next()
        .unwrap_or_default()
}

impl<'a> SourceCache<'a> {
    fn open(
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
        let builds = root.join("builds");
        std::fs::create_dir_all(&builds).map_err(io(&root))?;
        std::fs::create_dir_all(root.join("logs")).map_err(io(&root))?;
        let lock = DirLock::take(&root.join("lock"), progress)?;
        for e in std::fs::read_dir(&builds).map_err(io(&builds))?.flatten() {
            if e.file_name().to_string_lossy().ends_with(".tmp") {
                let path = e.path();
                std::fs::remove_dir_all(&path).map_err(io(&path))?;
            }
        }
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

    fn timed<T>(
        &mut self,
        what: &str,
        f: impl FnOnce(&mut Self) -> Result<T, BuildError>,
    ) -> Result<T, BuildError> {
        self.progress.begin(what);
        let start = Instant::now();
        let out = f(self);
        let secs = start.elapsed().as_secs_f64();
        if out.is_ok() {
            self.progress.end(what, secs);
        } else {
            self.progress.end(&format!("{what} failed"), secs);
        }
        if out.is_ok() {
            self.steps.push(Step {
                what: what.to_string(),
                secs,
            });
        }
        out
    }

    fn log(&self, what: &str) -> PathBuf {
        self.root
            .join("logs")
            .join(format!("{}-{what}.log", super::now_stamp()))
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
        let inputs = self.timed(&what, |_| Ok(debian::download_build_inputs(&image, &dir)?))?;
        self.inputs = Some(inputs.clone());
        Ok(inputs)
    }

    fn source_name(&self) -> String {
        format!(
            "{} {} (Debian)",
            self.image.source_package(),
            self.image.version
        )
    }

    /// An unpacked tree with Debian's config beside it (`.hvlab/debian.config`).
    fn unpacked(&mut self, name: &str) -> Result<PathBuf, BuildError> {
        let tree = self.root.join(name);
        if tree.join(".hvlab/unpacked").is_file() {
            // A crash mid-build leaves a journal: played back here. A tree that cannot be put
            // back is unpacked again, never left to fail every run that follows.
            match journal::recover(&tree) {
                Ok(()) => return Ok(tree),
                Err(why) => self.notes.push(format!(
                    "the source tree {name}/ was left damaged by an earlier run ({why}): unpacked again"
                )),
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

    fn debian_config(&self, tree: &Path) -> Result<(KConfig, String), BuildError> {
        let path = tree.join(".hvlab/debian.config");
        let text = std::fs::read_to_string(&path).map_err(io(&path))?;
        Ok((KConfig::parse(&text), text))
    }

    /// The module tree: Debian's config through olddefconfig, `modules_prepare` done.
    fn prepared(&mut self) -> Result<(PathBuf, String), BuildError> {
        let tree = self.unpacked("modules")?;
        let marker = tree.join(".hvlab/prepared");
        if let Ok(note) = std::fs::read_to_string(&marker) {
            return Ok((tree, note));
        }
        let log = self.log("modules_prepare");
        let release = self.image.release.clone();
        let step = "olddefconfig and modules_prepare of Debian's config";
        self.timed("olddefconfig", |me| {
            make(&me.sandbox, &tree, &["olddefconfig".into()], &log)
                .map_err(make_error(false, step, &log))
        })?;
        self.timed("modules_prepare", |me| {
            make(
                &me.sandbox,
                &tree,
                &[format!("KERNELRELEASE={release}"), "modules_prepare".into()],
                &log,
            )
            .map_err(make_error(false, step, &log))
        })?;
        let (debian, _) = self.debian_config(&tree)?;
        let ours = KConfig::read(&tree.join(".config")).map_err(io(&tree))?;
        let lost = debian.lost_in(&ours);
        let note = format!(
            "Debian's config of {} (from linux-headers-{}){}",
            release,
            release,
            if lost.is_empty() {
                String::new()
            } else {
                format!(
                    "; olddefconfig with this host's compiler left out {} option(s) it cannot build: {}",
                    lost.len(),
                    lost.join(", ")
                )
            }
        );
        std::fs::write(&marker, &note).map_err(io(&marker))?;
        Ok((tree, note))
    }

    /// The whole-kernel tree: tinyconfig, the guest's options and Debian's tick, preemption,
    /// RCU and KVM options, olddefconfig; every guest option checked.
    fn configured(&mut self) -> Result<(PathBuf, String), BuildError> {
        let tree = self.unpacked("whole")?;
        let marker = tree.join(".hvlab/configured");
        if let Ok(note) = std::fs::read_to_string(&marker) {
            return Ok((tree, note));
        }
        let log = self.log("config");
        let (_, debian_text) = self.debian_config(&tree)?;
        let step = "the minimal guest config";
        let part = debian_part(&debian_text);
        self.timed(
            "minimal guest config (tinyconfig + guest + Debian's HZ/preemption/RCU/KVM)",
            |me| {
                make(&me.sandbox, &tree, &["tinyconfig".into()], &log)
                    .map_err(make_error(false, step, &log))?;
                let config = tree.join(".config");
                let mut text = std::fs::read_to_string(&config).map_err(io(&config))?;
                for (k, v) in GUEST_CONFIG {
                    text.push_str(&format!("{k}={v}\n"));
                }
                text.push_str("# CONFIG_LOCALVERSION_AUTO is not set\n");
                for l in &part {
                    text.push_str(l);
                    text.push('\n');
                }
                std::fs::write(&config, text).map_err(io(&config))?;
                make(&me.sandbox, &tree, &["olddefconfig".into()], &log)
                    .map_err(make_error(false, step, &log))
            },
        )?;
        let ours = KConfig::read(&tree.join(".config")).map_err(io(&tree))?;
        for (k, v) in GUEST_CONFIG {
            let got = ours.get(k).unwrap_or("n");
            if got != *v {
                return Err(BuildError::GuestConfig {
                    of: self.source_name(),
                    option: (*k).to_string(),
                    wanted: (*v).to_string(),
                    got: got.to_string(),
                    config: tree.join(".config"),
                });
            }
        }
        let kept: Vec<&String> = part.iter().filter(|l| !l.starts_with('#')).collect();
        let lost: Vec<String> = kept
            .iter()
            .filter_map(|l| l.split_once('='))
            .filter(|(k, v)| ours.get(k) != Some(v.trim_matches('"')))
            .map(|(k, _)| k.trim_start_matches("CONFIG_").to_string())
            .collect();
        let note = format!(
            "minimal guest config (tinyconfig + {} guest options + {} of Debian's HZ/NO_HZ/preemption/RCU/KVM options; HZ={}, {}){}",
            GUEST_CONFIG.len(),
            kept.len() - lost.len(),
            ours.get("CONFIG_HZ").unwrap_or("?"),
            preemption(&ours),
            if lost.is_empty() {
                String::new()
            } else {
                format!(
                    "; not kept, their dependencies being outside the guest: {}",
                    lost.join(", ")
                )
            }
        );
        std::fs::write(&marker, &note).map_err(io(&marker))?;
        Ok((tree, note))
    }

    /// Builds (or reuses) every side of a group on this image.
    fn build_group(
        &mut self,
        sides: &[&PatchedSpec],
        notes: &mut Vec<String>,
    ) -> Result<Vec<Built>, BuildError> {
        let tree = self.unpacked("modules")?;
        let (debian, debian_text) = self.debian_config(&tree)?;
        let touched: BTreeSet<String> = sides.iter().flat_map(|s| s.touched()).collect();
        let (plan, placed) = kbuild::plan(&tree, &debian, &touched);
        let config_sha = sha256_hex(debian_text.as_bytes());
        match plan {
            Plan::Nothing => {
                let why = placed
                    .iter()
                    .map(|(f, p)| match p {
                        Placement::NotBuilt { why } => format!("{f}: {why}"),
                        _ => f.clone(),
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                // Still refuse a patch that does not apply.
                self.check_applies(&tree, sides.iter().copied())?;
                notes.push(format!(
                    "the patches touch nothing a build uses ({why}); every side is {} as shipped, so they are the same kernel: judged anyway",
                    self.image.release
                ));
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
                                config: "Debian's, as shipped".into(),
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
            Plan::Modules { dirs, modules } => {
                if sides.len() > 1 {
                    notes.push(format!(
                        "every side is {}'s image with {} rebuilt from the same source, config and compiler: they differ by the patch alone",
                        self.image.release,
                        modules.iter().map(|m| format!("{m}.ko")).collect::<Vec<_>>().join(", ")
                    ));
                }
                // Every patch applies before anything is built.
                let how = format!("modules:{}", dirs.join(","));
                let unbuilt: Vec<&PatchedSpec> = sides
                    .iter()
                    .copied()
                    .filter(|s| {
                        self.cached(&self.key(&how, &config_sha, &s.patches))
                            .is_none()
                    })
                    .collect();
                self.check_applies(&tree, unbuilt.into_iter())?;
                let mut out = Vec::new();
                for s in sides {
                    out.push(self.build_modules(s, &dirs, &config_sha)?);
                }
                Ok(out)
            }
            Plan::Whole { why } => {
                notes.push(format!("a whole kernel is built: {why}"));
                if sides.len() > 1 {
                    notes.push(
                        "every side is built from the same source, minimal config and compiler: they differ by the patch alone".into(),
                    );
                }
                self.check_applies(&tree, sides.iter().copied())?;
                // The side with the fewest patches first: the others build incrementally on it.
                let mut order: Vec<usize> = (0..sides.len()).collect();
                order.sort_by_key(|&i| sides[i].patches.len());
                let mut out: Vec<Option<Built>> = vec![None; sides.len()];
                for i in order {
                    out[i] = Some(self.build_whole(sides[i], &config_sha)?);
                }
                Ok(out.into_iter().flatten().collect())
            }
        }
    }

    /// Applies each side's patches to `tree` and restores it: a patch that does not apply
    /// fails before anything is built.
    fn check_applies<'s>(
        &self,
        tree: &Path,
        sides: impl Iterator<Item = &'s PatchedSpec>,
    ) -> Result<(), BuildError> {
        let source = self.source_name();
        for s in sides.filter(|s| !s.patches.is_empty()) {
            let checked = apply(&self.sandbox, tree, &s.patches, &source);
            restored(tree)?;
            checked?;
        }
        Ok(())
    }

    fn key(&self, how: &str, config_sha: &str, patches: &[PatchFile]) -> String {
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
    fn cached(&self, key: &str) -> Option<(PathBuf, BuildInfo)> {
        let entry = self.root.join("builds").join(key);
        let text = std::fs::read_to_string(entry.join("build.json")).ok()?;
        let mut info: BuildInfo = serde_json::from_str(&text).ok()?;
        info.cached = true;
        info.steps.clear();
        Some((entry, info))
    }

    /// Builds one side into `builds/KEY.tmp` with `fill`, restoring the tree whatever
    /// happens; renamed to `builds/KEY` only when complete.
    fn build_entry(
        &mut self,
        tree: &Path,
        key: &str,
        side: &PatchedSpec,
        fill: impl FnOnce(&mut Self, &Path, &Path) -> Result<(), BuildError>,
    ) -> Result<(PathBuf, Vec<String>, Vec<Step>), BuildError> {
        let entry = self.root.join("builds").join(key);
        let tmp = self.root.join("builds").join(format!("{key}.tmp"));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
        let before = self.steps.len();
        let source = self.source_name();
        let result = apply(&self.sandbox, tree, &side.patches, &source).and_then(|notes| {
            fill(self, tree, &tmp)?;
            Ok(notes)
        });
        let restored = restored(tree);
        let own: Vec<Step> = self.steps.drain(before..).collect();
        let notes = match result {
            Ok(n) => n,
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
    fn record(
        &self,
        how: How,
        config: String,
        side: &PatchedSpec,
        notes: Vec<String>,
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

    fn finish_entry(&self, key: &str, tmp: &Path, info: &BuildInfo) -> Result<PathBuf, BuildError> {
        let entry = self.root.join("builds").join(key);
        let json = serde_json::to_string_pretty(info)
            .map_err(|e| BuildError::Io(tmp.to_path_buf(), std::io::Error::other(e)))?;
        std::fs::write(tmp.join("build.json"), json).map_err(io(tmp))?;
        std::fs::rename(tmp, &entry).map_err(io(&entry))?;
        Ok(entry)
    }

    fn side_label(side: &PatchedSpec) -> String {
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

    fn build_modules(
        &mut self,
        side: &PatchedSpec,
        dirs: &[String],
        config_sha: &str,
    ) -> Result<Built, BuildError> {
        let key = self.key(
            &format!("modules:{}", dirs.join(",")),
            config_sha,
            &side.patches,
        );
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
        let (tree, config_note) = self.prepared()?;
        let job = ModulesJob {
            dirs,
            release: self.image.release.clone(),
            image_dir: self.image.dir(),
            patched: !side.patches.is_empty(),
            label: Self::side_label(side),
            log: self.log(&format!("modules-{key}")),
        };
        let mut built_modules: Vec<String> = Vec::new();
        let (tmp, notes, steps) = self.build_entry(&tree.clone(), key, side, |me, tree, tmp| {
            me.make_module_dirs(tree, &job)?;
            built_modules = install_rebuilt_modules(tree, tmp, &job)?;
            Ok(())
        })?;
        let how = How::Modules {
            dirs: dirs.to_vec(),
            modules: built_modules,
        };
        let info = self.record(how, config_note, side, notes, steps, key);
        Ok((self.finish_entry(key, &tmp, &info)?, info))
    }

    /// `make M=DIR modules` in each of the job's directories, one timed step each.
    fn make_module_dirs(&mut self, tree: &Path, job: &ModulesJob) -> Result<(), BuildError> {
        for dir in job.dirs {
            let step = format!("make M={dir} ({})", job.label);
            let args = vec![
                format!("KERNELRELEASE={}", job.release),
                // No DWARF: Debian ships its modules stripped, and it is most of
                // the compile time.
                "KCFLAGS=-g0".to_string(),
                format!("M={dir}"),
                "modules".to_string(),
            ];
            self.timed(&step, |me| {
                make(&me.sandbox, tree, &args, &job.log).map_err(make_error(
                    job.patched,
                    &step,
                    &job.log,
                ))
            })?;
        }
        Ok(())
    }

    fn build_whole(&mut self, side: &PatchedSpec, debian_sha: &str) -> Result<Built, BuildError> {
        let (tree, config_note) = self.configured()?;
        let config_sha = std::fs::read(tree.join(".config"))
            .map(|b| sha256_hex(&b))
            .map_err(io(&tree))?;
        let key = self.key(&format!("whole:{config_sha}"), debian_sha, &side.patches);
        let (entry, info) = match self.cached(&key) {
            Some(hit) => hit,
            None => {
                let patched = !side.patches.is_empty();
                let label = Self::side_label(side);
                let log = self.log(&format!("whole-{key}"));
                let (tmp, notes, steps) =
                    self.build_entry(&tree.clone(), &key, side, |me, tree, tmp| {
                        let step = format!("make bzImage modules ({label})");
                        me.timed(&step, |me| {
                            make(
                                &me.sandbox,
                                tree,
                                &["bzImage".into(), "modules".into()],
                                &log,
                            )
                            .map_err(make_error(patched, &step, &log))
                        })?;
                        let rel_file = tree.join("include/config/kernel.release");
                        let release = std::fs::read_to_string(&rel_file)
                            .map_err(io(&rel_file))?
                            .trim()
                            .to_string();
                        let image = tree.join("arch/x86/boot/bzImage");
                        std::fs::copy(&image, tmp.join("bzImage")).map_err(io(&image))?;
                        let mods = tmp.join("lib/modules").join(&release);
                        std::fs::create_dir_all(&mods).map_err(io(&mods))?;
                        std::fs::copy(tree.join(".config"), mods.join("config"))
                            .map_err(io(tree))?;
                        let order = tree.join("modules.order");
                        for obj in std::fs::read_to_string(&order)
                            .map_err(io(&order))?
                            .lines()
                            .filter(|l| !l.is_empty())
                        {
                            let rel = obj.trim_end_matches(".o");
                            let from = tree.join(format!("{rel}.ko"));
                            let to = mods.join("kernel").join(format!("{rel}.ko"));
                            if let Some(parent) = to.parent() {
                                std::fs::create_dir_all(parent).map_err(io(parent))?;
                            }
                            std::fs::copy(&from, &to).map_err(io(&from))?;
                        }
                        Ok(())
                    })?;
                let info = self.record(How::Whole, config_note, side, notes, steps, &key);
                (self.finish_entry(&key, &tmp, &info)?, info)
            }
        };
        let image = entry.join("bzImage");
        let mods_root = entry.join("lib/modules");
        let (release, moddir) = std::fs::read_dir(&mods_root)
            .map_err(io(&mods_root))?
            .flatten()
            .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
            .next()
            .ok_or_else(|| {
                BuildError::Io(
                    mods_root.clone(),
                    std::io::Error::other("no modules in the cached build"),
                )
            })?;
        let kernel = Kernel {
            release,
            spec: side.given.clone(),
            source: describe_source(&self.image, &info),
            image,
            config: Some(moddir.join("config")),
            modules: Some(moddir),
        };
        Ok(Built {
            kernel,
            build: Some(info),
        })
    }
}

impl Drop for SourceCache<'_> {
    /// The downloaded packages are unpacked by now; 160 MiB is not worth keeping for the
    /// next tree (a second download takes seconds).
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.root.join("debs"));
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
}

/// The image's tree, hard-linked into `tmp/kernel`, with the modules built in `tree` in place
/// of the shipped (compressed) ones; returns the modules' file names.
fn install_rebuilt_modules(
    tree: &Path,
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
        let order = tree.join(dir).join("modules.order");
        let names = std::fs::read_to_string(&order).map_err(io(&order))?;
        for obj in names.lines().filter(|l| !l.is_empty()) {
            built_modules.push(replace_module(tree, dir, obj, &linked, job)?);
        }
    }
    Ok(built_modules)
}

/// Puts the module `obj` (of `modules.order` in `dir`) built in `tree` in place of the image's
/// in `linked`, after checking its vermagic against the one it replaces; returns its file name.
fn replace_module(
    tree: &Path,
    dir: &str,
    obj: &str,
    linked: &Path,
    job: &ModulesJob,
) -> Result<String, BuildError> {
    let rel = obj.trim_end_matches(".o");
    let built = tree.join(dir).join(format!("{rel}.ko"));
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
                expected = super::ko::bytes(&old).ok().map(|b| vermagic(&b));
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

/// `PREEMPT_DYNAMIC (lazy)`, `PREEMPT`, `voluntary`, `none`.
fn preemption(c: &KConfig) -> String {
    let on = |k: &str| c.get(k) == Some("y");
    let model = if on("CONFIG_PREEMPT_RT") {
        "PREEMPT_RT"
    } else if on("CONFIG_PREEMPT_DYNAMIC") {
        "dynamic preemption"
    } else if on("CONFIG_PREEMPT") || on("CONFIG_PREEMPT_LAZY") {
        "full preemption"
    } else if on("CONFIG_PREEMPT_VOLUNTARY") {
        "voluntary preemption"
    } else {
        "no forced preemption"
    };
    format!(
        "{model}{}",
        if on("CONFIG_PREEMPT_LAZY") {
            ", lazy"
        } else {
            ""
        }
    )
}

/// The one line a run's host fingerprint carries about a built kernel.
fn describe_source(image: &DebianImage, info: &BuildInfo) -> String {
    let patches = if info.patches.is_empty() {
        "no patch".to_string()
    } else {
        info.patches
            .iter()
            .map(|p| format!("{} (sha256 {})", p.file, &p.sha256[..12]))
            .collect::<Vec<_>>()
            .join(" + ")
    };
    match &info.how {
        How::Modules { modules, .. } => format!(
            "{} {} with {} rebuilt from {} with {patches}",
            image.package,
            image.version,
            modules.join(", "),
            info.source
        ),
        How::Whole => format!("{} minimal guest config with {patches}", info.source),
        How::AsShipped { .. } => format!(
            "{} {} as shipped ({patches} changes nothing built)",
            image.package, image.version
        ),
    }
}

impl KConfig {
    /// Options set in `self` (y, m or a value) that `other` does not set alike, named without
    /// `CONFIG_`; versions and compiler identities left out.
    pub fn lost_in(&self, other: &KConfig) -> Vec<String> {
        self.options()
            .filter(|(k, v)| other.get(k) != Some(v))
            .map(|(k, _)| k.trim_start_matches("CONFIG_").to_string())
            .filter(|k| {
                !k.ends_with("_VERSION")
                    && !k.ends_with("_VERSION_TEXT")
                    && !k.starts_with("CC_VERSION")
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DIFF: &str = "--- a/virt/kvm/kvm_main.c\n+++ b/virt/kvm/kvm_main.c\n@@ -6070,3 +6070,3 @@ int f(void)\n \ta();\n-\tcall_srcu(x);\n+\tsynchronize_srcu_expedited(x);\n \treturn 0;\n";

    #[test]
    fn a_spec_splits_at_plus_signs_that_are_not_inside_a_file_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.patch");
        let b = dir.path().join("fix+more.patch");
        std::fs::write(&a, DIFF).expect("write");
        std::fs::write(&b, DIFF).expect("write");
        let spec = format!("debian:7.3+{}+{}", a.display(), b.display());
        let p = PatchedSpec::parse(&spec).expect("parses");
        assert_eq!(p.base, "debian:7.3");
        assert_eq!(p.patches.len(), 2);
        assert_eq!(p.patches[1].name(), "fix+more.patch");
        assert_eq!(
            p.touched().into_iter().collect::<Vec<_>>(),
            ["virt/kvm/kvm_main.c"]
        );
        let plain = PatchedSpec::parse("debian:7.3").expect("parses");
        assert!(plain.patches.is_empty());
        let e = PatchedSpec::parse(&format!(
            "debian:7.3+{}/missing.patch",
            dir.path().display()
        ))
        .expect_err("no such file");
        assert_eq!(e.exit_code(), 2);
        assert!(
            e.to_string().contains("missing.patch does not exist"),
            "{e}"
        );
    }

    #[test]
    fn a_spec_that_reads_two_ways_or_names_a_directory_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path().display().to_string();
        // Only the whole name exists: a `+` inside it works.
        std::fs::write(dir.path().join("only+one.patch"), DIFF).expect("write");
        let p = PatchedSpec::parse(&format!("debian:7.3+{d}/only+one.patch")).expect("parses");
        assert_eq!(p.patches.len(), 1);
        assert_eq!(p.patches[0].name(), "only+one.patch");
        // `{d}/p` + `{d}/q`, and also the one file `{d}/p+{d}/q` (a directory `p+` holding
        // the same absolute path again): the spec reads two ways and is refused with both.
        std::fs::write(dir.path().join("p"), DIFF).expect("write");
        std::fs::write(dir.path().join("q"), DIFF).expect("write");
        let spec = format!("debian:7.3+{d}/p+{d}/q");
        assert_eq!(PatchedSpec::parse(&spec).expect("parses").patches.len(), 2);
        let whole = PathBuf::from(format!("{d}/p+{d}/q"));
        std::fs::create_dir_all(whole.parent().expect("parent")).expect("mkdir");
        std::fs::write(&whole, DIFF).expect("write");
        let e = PatchedSpec::parse(&spec).expect_err("two readings");
        assert_eq!(e.exit_code(), 2);
        let text = e.to_string();
        assert!(text.contains("reads two ways"), "{text}");
        assert!(text.contains(&format!("`{d}/p + {d}/q`")), "{text}");
        assert!(text.contains(&format!("`{}`", whole.display())), "{text}");
        // A directory is named as one, not as missing.
        let e = PatchedSpec::parse(&format!("debian:7.3+{d}")).expect_err("a directory");
        assert!(
            e.to_string().contains("is a directory, not a patch file"),
            "{e}"
        );
        assert_eq!(e.exit_code(), 2);
        // Debian's own version string is not a patch.
        let e = PatchedSpec::parse("debian:7.3+deb13u1").expect_err("suffix");
        assert!(
            e.to_string()
                .contains("`+deb13u1` is part of Debian's own version"),
            "{e}"
        );
        assert_eq!(e.exit_code(), 2);
    }

    /// A path outside the tree is refused when the spec is read, before any download.
    #[test]
    fn a_patch_naming_a_path_outside_the_tree_is_refused_with_exit_2() {
        let dir = tempfile::tempdir().expect("tempdir");
        let evil = dir.path().join("evil.patch");
        std::fs::write(
            &evil,
            "Subject: [PATCH] kvm: a fix\n\n--- a/../../etc/passwd\n+++ b/../../etc/passwd\n@@ -1 +1 @@\n-root\n+owned\n",
        )
        .expect("write");
        let e = PatchedSpec::parse(&format!("debian:7.3+{}", evil.display())).expect_err("refused");
        assert_eq!(e.exit_code(), 2, "{e}");
        assert_eq!(
            e.to_string(),
            "evil.patch ([PATCH] kvm: a fix) is refused: it names `../../etc/passwd`, a path that climbs out with `..`. A patch may change files inside the kernel source tree only, never through a symlink, and nothing was applied: fix its paths (`--- a/DIR/FILE`, relative to the top of the tree)."
        );
    }

    /// GNU patch's own words, turned into the file, hunk and target.
    #[test]
    fn a_failed_hunk_is_named_with_its_header_and_target() {
        use journal::{offsets, why_not_applied};
        let message = &super::super::patch::parse(Path::new("x.patch"), DIFF).expect("parses")[0];
        let out =
            "patching file virt/kvm/kvm_main.c\nHunk #1 FAILED at 6070.\n1 out of 1 hunk FAILED\n";
        assert_eq!(
            why_not_applied(out, message),
            "hunk #1 `@@ -6070,3 +6070,3 @@ int f(void)` of virt/kvm/kvm_main.c does not match the source (at 6070; every context line must match, no fuzz)"
        );
        let out = "can't find file to patch at input line 3\nNo file to patch.  Skipping patch.\n";
        assert!(
            why_not_applied(out, message).contains("its target virt/kvm/kvm_main.c does not exist")
        );
        let out = "patching file virt/kvm/kvm_main.c\nReversed (or previously applied) patch detected!  Skipping patch.\n";
        assert!(why_not_applied(out, message).contains("already has this change"));
        let ok = "patching file virt/kvm/kvm_main.c\nHunk #1 succeeded at 6073 (offset 3 lines).\n";
        assert_eq!(
            offsets(ok, "x.patch"),
            ["x.patch: virt/kvm/kvm_main.c: Hunk #1 succeeded at 6073 (offset 3 lines)"]
        );
    }

    #[test]
    fn a_build_log_gives_its_first_compiler_error_with_the_function() {
        let log = "  CC [M]  arch/x86/kvm/x86.o\nkvm_main.c: In function 'f':\nkvm_main.c:10:5: error: expected ';'\n   10 | x\nmake[2]: *** Error 1\n";
        let e = first_errors(log);
        assert!(
            e.starts_with("\n  kvm_main.c: In function 'f':\n  kvm_main.c:10:5: error"),
            "{e}"
        );
        // No compiler error: the log's last lines.
        assert!(first_errors("a\nb\nmake: *** [Makefile] Error 2\n").contains("make: ***"));
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

    /// 128 + the signal, as the README says of every interrupted command.
    #[test]
    fn an_interrupted_build_exits_128_plus_the_signal() {
        let e = make_error(false, "make M=arch/x86/kvm", Path::new("x.log"))(MakeError::Stopped(
            libc::SIGINT,
        ));
        assert_eq!(e.exit_code(), 130);
        assert!(
            e.to_string()
                .starts_with("Interrupted by SIGINT during make M=arch/x86/kvm"),
            "{e}"
        );
    }

    /// The minimal guest keeps Debian's tick, preemption, RCU and KVM choices, set or not.
    #[test]
    fn the_guest_config_keeps_debians_tick_preemption_rcu_and_kvm_options() {
        let debian = "CONFIG_HZ_250=y\nCONFIG_HZ=250\n# CONFIG_HZ_1000 is not set\nCONFIG_PREEMPT_DYNAMIC=y\nCONFIG_TREE_SRCU=y\nCONFIG_KVM=m\nCONFIG_KVM_GUEST=y\nCONFIG_DRM=m\n";
        assert_eq!(
            debian_part(debian),
            [
                "CONFIG_HZ_250=y",
                "CONFIG_HZ=250",
                "# CONFIG_HZ_1000 is not set",
                "CONFIG_PREEMPT_DYNAMIC=y",
                "CONFIG_TREE_SRCU=y",
                "CONFIG_KVM=m",
            ]
        );
        // Every option hvlab checks in a kernel under test is in the guest config.
        for (option, _) in super::super::GUEST_NEEDS {
            assert!(GUEST_CONFIG.iter().any(|(k, _)| *k == option), "{option}");
        }
    }
}
