//! Kernels under test (`hvlab vm --kernel SPEC`, `hvlab kab A B`): what a spec names, where
//! its image, config and KVM modules are, and the cache that keeps fetched kernels.
//!
//! A spec is `debian:VERSION` (fetched with apt, see [`debian`]), a bzImage (with
//! `--modules DIR` as `make modules_install INSTALL_MOD_PATH=DIR` leaves it, or KVM built in),
//! a kernel build tree (`arch/x86/boot/bzImage`, `.config`), or an unpacked Debian package tree
//! (both layouts: 6.x `boot/vmlinuz-REL` + `lib/modules/REL`, 7.x `usr/lib/modules/REL/`),
//! or a commit of a git tree (`git:PATH@REF`, built by [`build`], see [`git`]): a
//! [`source::KernelSource`], read once from the command line.

pub mod build;
pub mod cache;
pub mod calibration;
pub mod confine;
mod cpio;
pub mod debian;
pub mod git;
pub mod journal;
pub mod kbuild;
pub mod ko;
pub mod kprobe;
pub mod limits;
pub mod mail;
pub mod objdiff;
pub mod overlay;
pub mod patch;
pub mod progress;
pub mod pvh;
pub mod reach;
pub mod sandbox;
pub mod source;
pub mod toolchain;
pub mod vm;

use std::path::{Path, PathBuf};

use hvlab_core::error::Fault;
use progress::BuildProgress;
use serde::Serialize;
use source::KernelSource;

/// Why a kernel spec cannot be used.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum KernelError {
    /// Unknown kernel spec `{0}`: give debian:VERSION (debian:6.1, debian:6.12, debian:7.2, debian:7.3.4), a bzImage path (with --modules DIR), a kernel build tree, or an unpacked Debian kernel package.
    UnknownSpec(String),
    /// Debian has no kernel {version} for amd64 in bookworm, bookworm-updates, bookworm-security, bookworm-backports, trixie-backports or sid; the newest it has per series: {newest}. Choose one of those (debian:SERIES or debian:X.Y.Z).
    NoSuchVersion {
        /// What was asked for.
        version: String,
        /// `6.1 (6.1.158), 6.12 (6.12.117), ...`.
        newest: String,
    },
    /// {image} comes without modules and without KVM built in ({why}): pass --modules DIR holding lib/modules/RELEASE (`make modules_install INSTALL_MOD_PATH=DIR`), or build with CONFIG_KVM=y and CONFIG_KVM_AMD=y.
    NoKvm {
        /// The image.
        image: PathBuf,
        /// What was checked.
        why: String,
    },
    /// --modules {0} holds no lib/modules/RELEASE directory: give the INSTALL_MOD_PATH of `make modules_install` (DIR/lib/modules/RELEASE/kernel/...).
    BadModulesDir(PathBuf),
    /// Module {module} is not among the modules of kernel {release}: --kvm-param names kvm, kvm_amd or kvm_intel, and the kernel must ship that module.
    NoSuchModule {
        /// The module.
        module: String,
        /// The kernel.
        release: String,
    },
    /// debian:VERSION needs apt-get and dpkg-deb, which this host lacks: give a bzImage path instead (--kernel PATH --modules DIR).
    NoApt,
    /// No space for the kernel cache in {dir}: {free_mib} MiB free, {need_mib} MiB needed. Free some space there, or point HVLAB_CACHE at a directory with room.
    CacheSpace {
        /// The cache directory.
        dir: PathBuf,
        /// Free space.
        free_mib: u64,
        /// What a kernel needs.
        need_mib: u64,
    },
    /// apt failed to {what}: {output}. Check the network to deb.debian.org (only the Debian archive is needed) and retry.
    Apt {
        /// What apt was doing.
        what: String,
        /// Its last lines.
        output: String,
    },
    /// Kernel {release} is built without {option} ({config}), which hvlab in the guest needs for {why}: rebuild it with {option} set.
    GuestNeeds {
        /// The kernel.
        release: String,
        /// The option.
        option: String,
        /// Its config file.
        config: String,
        /// What hvlab uses it for.
        why: &'static str,
    },
    /// Debian has no {package} of the image's version ({image}; it has: {available}); hvlab rebuilds a patched kernel only from the source of the image's exact version. Choose the version Debian ships the source for (debian:X.Y.Z).
    SourceMismatch {
        /// The image package and version.
        image: String,
        /// The source or headers package.
        package: String,
        /// The versions Debian has of it.
        available: String,
    },
    /// Kernel spec `{0}` names a git tree, which hvlab builds before it boots; it reached the code that takes kernels as they are (a bug to report).
    GitUnbuilt(String),
    /// Cannot use {0}: {1}
    Io(PathBuf, std::io::Error),
}

impl KernelError {
    /// What kind of failure it is: a spec or kernel the user can fix is bad input, a host
    /// without apt or cache space cannot do what was asked, a failed fetch or I/O failed.
    pub fn fault(&self) -> Fault {
        match self {
            KernelError::UnknownSpec(_)
            | KernelError::NoSuchVersion { .. }
            | KernelError::NoKvm { .. }
            | KernelError::BadModulesDir(_)
            | KernelError::NoSuchModule { .. }
            | KernelError::GuestNeeds { .. }
            | KernelError::SourceMismatch { .. } => Fault::BadInput,
            KernelError::NoApt | KernelError::CacheSpace { .. } => Fault::HostCannot,
            KernelError::Apt { .. } | KernelError::GitUnbuilt(_) | KernelError::Io(..) => {
                Fault::Failed
            }
        }
    }
}

/// A tool on PATH (QEMU, apt, bwrap): where it is, if anywhere.
pub(crate) fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(tool))
            .find(|p| p.is_file())
    })
}

/// A kernel ready to boot.
#[derive(Debug, Clone, Serialize)]
pub struct Kernel {
    /// `uname -r` of the kernel.
    pub release: String,
    /// The spec it came from, as given (`debian:6.12`, a path).
    pub spec: String,
    /// Where it came from, resolved (`linux-image-6.12.57+deb12-amd64-unsigned 6.12.57-1`, a path).
    pub source: String,
    /// The bzImage.
    pub image: PathBuf,
    /// Its config, when known.
    pub config: Option<PathBuf>,
    /// `lib/modules/RELEASE`, when it has modules.
    pub modules: Option<PathBuf>,
}

impl Kernel {
    /// A config option's value (`y`, `m`, ...), when the config is known and sets it.
    pub fn config_value(&self, option: &str) -> Option<String> {
        let text = std::fs::read_to_string(self.config.as_ref()?).ok()?;
        let prefix = format!("{option}=");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix).map(str::to_string))
    }

    /// The file of module `name` (`kvm_amd` also finds `kvm-amd.ko.xz`).
    pub fn module_file(&self, name: &str) -> Option<PathBuf> {
        let dir = self.modules.as_ref()?;
        let wanted = [name.to_string(), name.replace('_', "-")];
        find_file(dir, &|f: &str| {
            let stem = f
                .strip_suffix(".ko")
                .or_else(|| f.strip_suffix(".ko.xz"))
                .or_else(|| f.strip_suffix(".ko.zst"))
                .or_else(|| f.strip_suffix(".ko.gz"));
            stem.is_some_and(|s| wanted.iter().any(|w| w == s))
        })
    }

    /// The linked kernel kept beside the image (`vmlinux`), when it was built and kept: what
    /// a whole kernel's built-in code is compared by.
    pub fn vmlinux(&self) -> Option<PathBuf> {
        let file = self.image.parent()?.join("vmlinux");
        file.is_file().then_some(file)
    }

    /// Whether KVM for `vendor_module` (`kvm_amd`) is built into the image (per its config).
    pub fn kvm_built_in(&self, vendor_module: &str) -> bool {
        let vendor = if vendor_module == "kvm_intel" {
            "CONFIG_KVM_INTEL"
        } else {
            "CONFIG_KVM_AMD"
        };
        self.config_value("CONFIG_KVM").as_deref() == Some("y")
            && self.config_value(vendor).as_deref() == Some("y")
    }
}

/// Depth-first search for a file whose name satisfies `pred`.
fn find_file(dir: &Path, pred: &dyn Fn(&str) -> bool) -> Option<PathBuf> {
    let mut entries: Vec<_> = std::fs::read_dir(dir).ok()?.flatten().collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for e in &entries {
        let path = e.path();
        if path.is_dir() {
            if let Some(found) = find_file(&path, pred) {
                return Some(found);
            }
        } else if e.file_name().to_str().is_some_and(pred) {
            return Some(path);
        }
    }
    None
}

/// Seconds since the epoch: names logs and copies so the newest sorts last.
pub fn now_stamp() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// hvlab's cache: `$HVLAB_CACHE`, else `$XDG_CACHE_HOME/hvlab`, else `~/.cache/hvlab`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("HVLAB_CACHE").filter(|v| !v.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(d).join("hvlab");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache/hvlab")
}

/// The kernel a source names as it is (nothing built): a Debian kernel, fetched and cached;
/// a build tree or an unpacked package; a bzImage; each with its `--modules DIR`. `given`
/// names it.
pub fn resolve(
    given: &str,
    source: &KernelSource,
    progress: &dyn BuildProgress,
) -> Result<Kernel, KernelError> {
    let (mut kernel, modules) = match source {
        KernelSource::Debian { version } => (debian::fetch(version, progress)?, None),
        KernelSource::Tree { path, modules } => (
            from_tree(path).ok_or_else(|| KernelError::UnknownSpec(given.to_string()))?,
            modules.as_deref(),
        ),
        KernelSource::BzImage { image, modules } => (from_bzimage(image)?, modules.as_deref()),
        KernelSource::Git { .. } => return Err(KernelError::GitUnbuilt(given.to_string())),
    };
    kernel.spec = given.to_string();
    if let Some(dir) = modules {
        let (release, moddir) = modules_in(dir)?;
        if kernel.release.is_empty() {
            kernel.release = release;
        }
        if kernel.config.is_none() {
            let c = moddir.join("config");
            kernel.config = c.is_file().then_some(c);
        }
        kernel.modules = Some(moddir);
    }
    Ok(kernel)
}

/// `DIR/lib/modules/REL` (or `DIR/usr/lib/modules/REL`, or DIR itself when it is `.../REL`).
fn modules_in(dir: &Path) -> Result<(String, PathBuf), KernelError> {
    for base in [dir.join("lib/modules"), dir.join("usr/lib/modules")] {
        let Ok(rd) = std::fs::read_dir(&base) else {
            continue;
        };
        let mut rels: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        rels.sort();
        if let Some(p) = rels.pop() {
            let rel = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Ok((rel, p));
        }
    }
    if dir.join("kernel").is_dir() {
        let rel = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        return Ok((rel, dir.to_path_buf()));
    }
    Err(KernelError::BadModulesDir(dir.to_path_buf()))
}

/// A kernel build tree, or an unpacked Debian kernel package in either layout.
pub fn from_tree(root: &Path) -> Option<Kernel> {
    let bz = root.join("arch/x86/boot/bzImage");
    if bz.is_file() {
        let release = std::fs::read_to_string(root.join("include/config/kernel.release"))
            .map(|s| s.trim().to_string())
            .ok()
            .or_else(|| bzimage_release(&bz))
            .unwrap_or_default();
        let config = root.join(".config");
        return Some(Kernel {
            release,
            spec: String::new(),
            source: format!("build tree {}", root.display()),
            image: bz,
            config: config.is_file().then_some(config),
            modules: None,
        });
    }
    // 6.x: boot/vmlinuz-REL, boot/config-REL, lib/modules/REL.
    if let Ok(rd) = std::fs::read_dir(root.join("boot")) {
        let mut images: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
            .collect();
        images.sort();
        if let Some(image) = images.pop() {
            let name = image.file_name()?.to_string_lossy().into_owned();
            let release = name.strip_prefix("vmlinuz-")?.to_string();
            let config = root.join("boot").join(format!("config-{release}"));
            let moddir = root.join("lib/modules").join(&release);
            return Some(Kernel {
                source: format!("unpacked kernel {}", root.display()),
                spec: String::new(),
                config: config.is_file().then_some(config),
                modules: moddir.is_dir().then_some(moddir),
                release,
                image,
            });
        }
    }
    // 7.x: usr/lib/modules/REL/{vmlinuz,config,kernel/}.
    let base = root.join("usr/lib/modules");
    let mut rels: Vec<PathBuf> = std::fs::read_dir(&base)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("vmlinuz").is_file())
        .collect();
    rels.sort();
    let dir = rels.pop()?;
    let release = dir.file_name()?.to_string_lossy().into_owned();
    let config = dir.join("config");
    Some(Kernel {
        source: format!("unpacked kernel {}", root.display()),
        spec: String::new(),
        image: dir.join("vmlinuz"),
        config: config.is_file().then_some(config),
        modules: dir.join("kernel").is_dir().then(|| dir.clone()),
        release,
    })
}

fn from_bzimage(path: &Path) -> Result<Kernel, KernelError> {
    let release = bzimage_release(path).unwrap_or_default();
    // A config beside the image: Debian's boot/config-REL, or a build tree's .config.
    let config = path.parent().and_then(|d| {
        [
            d.join(format!("config-{release}")),
            d.join("config"),
            d.join("../../../.config"),
        ]
        .into_iter()
        .find(|c| c.is_file())
    });
    Ok(Kernel {
        release,
        spec: String::new(),
        source: format!("bzImage {}", path.display()),
        image: path.to_path_buf(),
        config,
        modules: None,
    })
}

/// The release in a bzImage's header: the x86 boot protocol's `kernel_version` field (offset
/// 0x20e) points, less 0x200, at the version string ("6.12.57+deb12-amd64 (...) #1 ...").
pub fn bzimage_release(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.get(0x202..0x206)? != b"HdrS" {
        return None;
    }
    let ptr = usize::from(u16::from_le_bytes([*bytes.get(0x20e)?, *bytes.get(0x20f)?]));
    let start = ptr + 0x200;
    let text = bytes.get(start..start + 256)?;
    let end = text.iter().position(|&b| b == 0 || b == b' ')?;
    Some(String::from_utf8_lossy(&text[..end]).into_owned())
}

/// The options hvlab in the guest needs, and what for. A kernel without `FILE_LOCKING` once
/// made hvlab report "the results database stayed locked by another hvlab" after 30 s.
pub const GUEST_NEEDS: [(&str, &str); 7] = [
    (
        "CONFIG_FILE_LOCKING",
        "the results database's file locks (SQLite)",
    ),
    ("CONFIG_IO_URING", "the io_uring scenarios"),
    ("CONFIG_USERFAULTFD", "the userfaultfd scenarios"),
    ("CONFIG_HUGETLBFS", "hugetlbfs-backed guest memory"),
    ("CONFIG_TRANSPARENT_HUGEPAGE", "THP-backed guest memory"),
    ("CONFIG_MEMFD_CREATE", "memfd-backed guest memory"),
    ("CONFIG_KVM", "the KVM under test"),
];

/// Checks a kernel's config (when known) for what hvlab in the guest needs, naming the first
/// option it lacks, before anything boots.
pub fn check_guest_config(kernel: &Kernel) -> Result<(), KernelError> {
    let Some(config) = &kernel.config else {
        return Ok(());
    };
    let Ok(text) = std::fs::read_to_string(config) else {
        return Ok(());
    };
    let config_text = kbuild::KConfig::parse(&text);
    for (option, why) in GUEST_NEEDS {
        let value = config_text.get(option);
        let ok = match option {
            "CONFIG_KVM" => matches!(value, Some("y" | "m")),
            _ => value == Some("y"),
        };
        if !ok {
            return Err(KernelError::GuestNeeds {
                release: kernel.release.clone(),
                option: option.to_string(),
                config: config.display().to_string(),
                why,
            });
        }
    }
    Ok(())
}

/// Checks that the kernel can give a KVM host with `vendor_module` (kvm_amd or kvm_intel).
pub fn check_kvm(kernel: &Kernel, vendor_module: &str) -> Result<(), KernelError> {
    if kernel.module_file(vendor_module).is_some() || kernel.kvm_built_in(vendor_module) {
        return Ok(());
    }
    let why = match (&kernel.modules, &kernel.config) {
        (Some(m), _) => format!("{} has no {vendor_module} module", m.display()),
        (None, Some(c)) => format!(
            "no modules, and {} does not set CONFIG_KVM=y with {}=y",
            c.display(),
            if vendor_module == "kvm_intel" {
                "CONFIG_KVM_INTEL"
            } else {
                "CONFIG_KVM_AMD"
            }
        ),
        (None, None) => "no modules and no config beside it to show KVM is built in".into(),
    };
    Err(KernelError::NoKvm {
        image: kernel.image.clone(),
        why,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::fault_exit_code;

    /// A kernel given as built, read as the command line reads it.
    fn given(spec: &str) -> Result<Kernel, build::BuildError> {
        let parsed = build::PatchedSpec::parse(spec)?;
        Ok(resolve(&parsed.given, &parsed.source, &progress::Silent)?)
    }

    #[test]
    fn an_unknown_spec_is_named_with_the_shapes_that_work() {
        let e = given("not-a-kernel-anywhere").unwrap_err();
        assert_eq!(fault_exit_code(e.fault()), 2);
        assert!(e.to_string().contains("debian:VERSION"), "{e}");
    }

    #[test]
    fn a_bzimage_without_modules_or_config_has_no_kvm() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("bzImage");
        std::fs::write(&image, b"not really a kernel").unwrap();
        let k = given(image.to_str().unwrap()).unwrap();
        let e = check_kvm(&k, "kvm_amd").unwrap_err();
        assert_eq!(fault_exit_code(e.fault()), 2);
        assert!(e.to_string().contains("--modules DIR"), "{e}");
        // With KVM built in per its config, it is usable.
        std::fs::write(
            dir.path().join("config"),
            "CONFIG_KVM=y\nCONFIG_KVM_AMD=y\n",
        )
        .unwrap();
        let k = given(image.to_str().unwrap()).unwrap();
        check_kvm(&k, "kvm_amd").unwrap();
    }

    #[test]
    fn a_kernel_without_an_option_hvlab_needs_is_named_before_it_boots() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config");
        let all = "CONFIG_FILE_LOCKING=y\nCONFIG_IO_URING=y\nCONFIG_USERFAULTFD=y\nCONFIG_HUGETLBFS=y\nCONFIG_TRANSPARENT_HUGEPAGE=y\nCONFIG_MEMFD_CREATE=y\nCONFIG_KVM=m\n";
        std::fs::write(&config, all).unwrap();
        let mut k = Kernel {
            release: "7.3.4".into(),
            spec: String::new(),
            source: String::new(),
            image: dir.path().join("bzImage"),
            config: Some(config.clone()),
            modules: None,
        };
        check_guest_config(&k).unwrap();
        std::fs::write(
            &config,
            all.replace(
                "CONFIG_FILE_LOCKING=y\n",
                "# CONFIG_FILE_LOCKING is not set\n",
            ),
        )
        .unwrap();
        let e = check_guest_config(&k).unwrap_err();
        assert_eq!(fault_exit_code(e.fault()), 2);
        let text = e.to_string();
        assert!(
            text.contains("without CONFIG_FILE_LOCKING") && text.contains("SQLite"),
            "{text}"
        );
        // No config: nothing to check.
        k.config = None;
        check_guest_config(&k).unwrap();
    }
}
