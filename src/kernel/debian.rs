//! `debian:VERSION`: the newest Debian kernel of a series, fetched with apt and cached.
//!
//! apt runs with a private sources list, lists, status file and archive directory under the
//! cache (`-o Dir::Etc::SourceList=...`), so the system's apt state is never touched. apt
//! checks the suites' signed `InRelease` files against Debian's archive keyring and every
//! package against the hashes they list, as it does for any install.
//!
//! Layouts: 6.x ships `linux-image-REL-unsigned` (boot/vmlinuz-REL, boot/config-REL,
//! lib/modules/REL); 7.x ships `linux-binary-REL` (vmlinuz), `linux-modules-REL` and
//! `linux-base-REL` (config), all under usr/lib/modules/REL/.

use crate::kernel::which;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use super::cache::hold;
use super::progress::{BuildProgress, reported};
use super::{Kernel, KernelError, cache_dir, from_tree};

/// Suites searched: bookworm has 6.1 (and 6.12 in its security and backports suites),
/// trixie-backports 7.3.x, sid 7.2.x.
const SOURCES: &str = "\
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-updates main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian-security bookworm-security main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie-backports main
deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian sid main
";

/// What one unpacked kernel takes in the cache, with its packages while they unpack.
const NEED_MIB: u64 = 700;

/// Package lists older than this are refreshed before a version is resolved.
const LISTS_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

/// One kernel package version apt offers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    /// `linux-image-6.12.57+deb12-amd64-unsigned` or `linux-binary-7.3.4+deb13-amd64`.
    package: String,
    /// Debian version (`6.12.57-1~deb12u1`).
    version: String,
    /// `uname -r` (`6.12.57+deb12-amd64`).
    release: String,
}

impl Candidate {
    /// The upstream version (`6.12.57`).
    fn upstream(&self) -> &str {
        self.version.split(['-', '~', '+']).next().unwrap_or("")
    }

    fn key(&self) -> Vec<u64> {
        numbers(&self.version)
    }
}

fn numbers(s: &str) -> Vec<u64> {
    s.split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse().unwrap_or(0))
        .collect()
}

/// `6.12` matches upstream `6.12.57` and `6.12`; `7.3.4` matches `7.3.4` only.
fn series_matches(asked: &str, upstream: &str) -> bool {
    upstream == asked || upstream.starts_with(&format!("{asked}."))
}

/// The kernel's release from its package name, or `None` for flavours hvlab does not boot
/// (cloud, rt, debug).
fn release_of(package: &str) -> Option<String> {
    let release = package
        .strip_prefix("linux-image-")
        .and_then(|r| r.strip_suffix("-unsigned"))
        .or_else(|| package.strip_prefix("linux-binary-"))?;
    // `linux-binary-unsigned-REL` (7.x's unsigned twin) is the same kernel: take the signed
    // name, whose release starts with its version.
    (release.starts_with(|c: char| c.is_ascii_digit())
        && release.ends_with("-amd64")
        && !release.contains("cloud")
        && !release.contains("-rt-"))
    .then(|| release.to_string())
}

/// The private apt state in the cache, and where its tools are.
struct Apt {
    dir: PathBuf,
    /// The directory of `apt-get` and `apt-cache`; `None`: found on PATH.
    bin: Option<PathBuf>,
}

/// A `flock` on the private apt state, held while the value lives: exclusive while
/// `apt-get update` rewrites the lists, shared while they are read. Two hvlabs resolving
/// `debian:7.3` at once once got "Debian has no kernel 7.3" (4 of 16): one queried while the
/// other's update had the lists half rewritten.
struct AptLock {
    _file: std::fs::File,
}

impl Apt {
    fn new() -> Result<Apt, KernelError> {
        if which("apt-get").is_none() || which("dpkg-deb").is_none() {
            return Err(KernelError::NoApt);
        }
        Apt::at(cache_dir().join("apt"), None)
    }

    /// The apt state in `dir`, run with the tools in `bin` (PATH's when `None`).
    fn at(dir: PathBuf, bin: Option<PathBuf>) -> Result<Apt, KernelError> {
        for sub in ["lists/partial", "archives/partial", "etc/parts", "cache"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| KernelError::Io(dir.clone(), e))?;
        }
        let io = |e| KernelError::Io(dir.join("etc"), e);
        // Written only when it differs: apt takes a newer sources list for new sources and
        // rebuilds its 70 MB binary cache of the lists (about 2 s) on the next read.
        let sources = dir.join("etc/sources.list");
        if std::fs::read(&sources).ok().as_deref() != Some(SOURCES.as_bytes()) {
            std::fs::write(&sources, SOURCES).map_err(io)?;
        }
        let status = dir.join("etc/status");
        if !status.exists() {
            std::fs::write(&status, "").map_err(io)?;
        }
        Ok(Apt { dir, bin })
    }

    fn lock(&self, exclusive: bool) -> Result<AptLock, KernelError> {
        use rustix::fs::{FlockOperation, flock};
        let path = self.dir.join("lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| KernelError::Io(path.clone(), e))?;
        let op = if exclusive {
            FlockOperation::LockExclusive
        } else {
            FlockOperation::LockShared
        };
        // Blocks while another hvlab updates (or, for an update, reads) the lists.
        flock(&file, op).map_err(|e| KernelError::Io(path.clone(), e.into()))?;
        Ok(AptLock { _file: file })
    }

    /// The package lists, refreshed first when older than a day (`space` checked before),
    /// held shared until the returned lock drops: no update runs while they are read.
    fn fresh_lists(
        &self,
        space: &Path,
        progress: &dyn BuildProgress,
    ) -> Result<AptLock, KernelError> {
        let shared = self.lock(false)?;
        // Read by every resolution: its last use for `hvlab cache prune`, which would
        // otherwise take the lists as unused since their last update.
        hold::touch(&self.dir);
        if self.lists_fresh() {
            return Ok(shared);
        }
        drop(shared);
        let exclusive = self.lock(true)?;
        // Another hvlab may have refreshed them while this one waited for the lock.
        if !self.lists_fresh() {
            // The lists take about 60 MiB: check before apt fills the disk.
            need_space(space)?;
            self.update(progress)?;
        }
        drop(exclusive);
        // Fresh now: no update runs until they age, so nothing changes them in between.
        self.lock(false)
    }

    /// Options that point every piece of apt state at the private directory.
    fn options(&self) -> Vec<String> {
        let d = self.dir.display();
        [
            format!("Dir::Etc::SourceList={d}/etc/sources.list"),
            format!("Dir::Etc::SourceParts={d}/etc/parts"),
            format!("Dir::State::Lists={d}/lists"),
            format!("Dir::State::status={d}/etc/status"),
            format!("Dir::Cache={d}/cache"),
            format!("Dir::Cache::archives={d}/archives"),
            // Keep apt's binary cache of the lists (some images turn it off): without it every
            // apt-cache call re-reads 30 MB of lists.
            format!("Dir::Cache::pkgcache={d}/cache/pkgcache.bin"),
            format!("Dir::Cache::srcpkgcache={d}/cache/srcpkgcache.bin"),
            "APT::Architecture=amd64".into(),
            "Debug::NoLocking=1".into(),
            "Acquire::Languages=none".into(),
            "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false".into(),
            "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false".into(),
            "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false".into(),
        ]
        .into_iter()
        .flat_map(|o| ["-o".to_string(), o])
        .collect()
    }

    fn run(
        &self,
        tool: &str,
        args: &[&str],
        cwd: &Path,
        what: &str,
    ) -> Result<String, KernelError> {
        let program = self
            .bin
            .as_ref()
            .map_or_else(|| PathBuf::from(tool), |b| b.join(tool));
        let out = Command::new(program)
            .args(self.options())
            .args(args)
            .current_dir(cwd)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .map_err(|e| KernelError::Io(PathBuf::from(tool), e))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        // apt-cache show exits 100 when one name is purely virtual but still prints the rest.
        let partial_ok = tool == "apt-cache" && !stdout.is_empty();
        if !(out.status.success() || partial_ok) {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.lines().rev().take(3).collect();
            return Err(KernelError::Apt {
                what: what.to_string(),
                output: tail.into_iter().rev().collect::<Vec<_>>().join(" / "),
            });
        }
        Ok(stdout)
    }

    fn lists_fresh(&self) -> bool {
        let marker = self.dir.join("lists/updated");
        std::fs::metadata(marker)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| SystemTime::now().duration_since(t).ok())
            .is_some_and(|age| age < LISTS_MAX_AGE)
    }

    fn update(&self, progress: &dyn BuildProgress) -> Result<(), KernelError> {
        let what = format!(
            "refresh Debian's package lists (private apt state in {})",
            self.dir.display()
        );
        reported(progress, &what, || self.refresh_lists())?;
        Ok(())
    }

    /// `apt-get update`, its binary cache built, marked fresh.
    fn refresh_lists(&self) -> Result<(), KernelError> {
        self.run(
            "apt-get",
            &["-qq", "update"],
            &self.dir,
            "refresh the package lists",
        )?;
        // apt-cache writes its binary cache of the lists on first use: built here, under the
        // exclusive lock, not by the readers that share it.
        self.run(
            "apt-cache",
            &["gencaches"],
            &self.dir,
            "index the package lists",
        )?;
        std::fs::write(self.dir.join("lists/updated"), "")
            .map_err(|e| KernelError::Io(self.dir.clone(), e))
    }

    /// Every bootable kernel package version apt offers.
    fn candidates(&self) -> Result<Vec<Candidate>, KernelError> {
        let names = self.run(
            "apt-cache",
            &["pkgnames", "linux-"],
            &self.dir,
            "list kernel packages",
        )?;
        let names: Vec<&str> = names.lines().filter(|n| release_of(n).is_some()).collect();
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let mut args = vec!["show"];
        args.extend(names.iter().copied());
        let text = self.run(
            "apt-cache",
            &args,
            &self.dir,
            "read kernel package versions",
        )?;
        let mut out = Vec::new();
        for stanza in text.split("\n\n") {
            let field = |name: &str| {
                stanza
                    .lines()
                    .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
            };
            if let (Some(package), Some(version)) = (field("Package:"), field("Version:"))
                && let Some(release) = release_of(&package)
            {
                out.push(Candidate {
                    package,
                    version,
                    release,
                });
            }
        }
        Ok(out)
    }
}

/// The newest version per series (`6.1 (6.1.158), 6.12 (6.12.57), ...`), newest series last.
fn newest_per_series(cands: &[Candidate]) -> String {
    let mut best: std::collections::BTreeMap<Vec<u64>, &Candidate> = Default::default();
    for c in cands {
        let up = numbers(c.upstream());
        let series = up.iter().take(2).copied().collect::<Vec<_>>();
        if best.get(&series).is_none_or(|b| b.key() < c.key()) {
            best.insert(series, c);
        }
    }
    best.values()
        .map(|c| {
            let up = c.upstream();
            let series: Vec<&str> = up.split('.').take(2).collect();
            format!("{} ({up})", series.join("."))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Free space under `dir` in MiB.
fn free_mib(dir: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize) / (1024 * 1024))
}

fn need_space(dir: &Path) -> Result<(), KernelError> {
    match free_mib(dir) {
        Some(free) if free < NEED_MIB => Err(KernelError::CacheSpace {
            dir: dir.to_path_buf(),
            free_mib: free,
            need_mib: NEED_MIB,
        }),
        _ => Ok(()),
    }
}

/// A Debian kernel image in the cache, with the package version it came from: what a patched
/// build must match exactly.
#[derive(Debug, Clone)]
pub struct DebianImage {
    /// `linux-binary-7.3.4+deb13-amd64` or `linux-image-6.12.57+deb12-amd64-unsigned`.
    pub package: String,
    /// The Debian version (`7.3.4-1~bpo13+1`).
    pub version: String,
    /// `uname -r`.
    pub release: String,
    /// The unpacked kernel.
    pub kernel: Kernel,
}

impl DebianImage {
    /// The upstream version (`7.3.4`).
    pub fn upstream(&self) -> &str {
        self.version.split(['-', '~', '+']).next().unwrap_or("")
    }

    /// `linux-source-7.3`: Debian's source package of this series.
    pub fn source_package(&self) -> String {
        let series: Vec<&str> = self.upstream().split('.').take(2).collect();
        format!("linux-source-{}", series.join("."))
    }

    /// The unpacked image's directory in the cache.
    pub fn dir(&self) -> PathBuf {
        cache_dir().join("kernels").join(&self.release)
    }
}

/// The newest kernel of series `version`, unpacked in the cache (downloaded only once).
pub fn fetch(version: &str, progress: &dyn BuildProgress) -> Result<Kernel, KernelError> {
    fetch_image(version, progress).map(|d| d.kernel)
}

/// [`fetch`], with the package and version it resolved to.
pub fn fetch_image(
    version: &str,
    progress: &dyn BuildProgress,
) -> Result<DebianImage, KernelError> {
    if version.is_empty() || !version.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(KernelError::UnknownSpec(format!("debian:{version}")));
    }
    let kernels = cache_dir().join("kernels");
    std::fs::create_dir_all(&kernels).map_err(|e| KernelError::Io(kernels.clone(), e))?;
    let apt = Apt::new()?;
    // Held until the packages are downloaded: no update changes the lists under them.
    let (best, _lists) = newest_of(&apt, version, &kernels, progress)?;
    let dir = kernels.join(&best.release);
    let source = format!("{} {} (Debian)", best.package, best.version);
    let image = |kernel: Kernel| DebianImage {
        package: best.package.clone(),
        version: best.version.clone(),
        release: best.release.clone(),
        kernel,
    };
    // Held for the rest of this run, so no prune removes it under a boot.
    let held = dir.join(".complete").is_file()
        && hold::hold(&dir).map_err(|e| KernelError::Io(dir.clone(), e))?;
    if held
        && dir.join(".complete").is_file()
        && let Some(mut k) = from_tree(&dir)
    {
        k.source = source;
        return Ok(image(k));
    }
    need_space(&kernels)?;
    let packages: Vec<String> = if best.package.starts_with("linux-binary-") {
        ["binary", "modules", "base"]
            .iter()
            .map(|p| format!("linux-{p}-{}={}", best.release, best.version))
            .collect()
    } else {
        vec![format!("{}={}", best.package, best.version)]
    };
    let debs = kernels.join(format!("{}.debs", best.release));
    let _ = std::fs::remove_dir_all(&debs);
    std::fs::create_dir_all(&debs).map_err(|e| KernelError::Io(debs.clone(), e))?;
    let mut args = vec!["-qq", "download"];
    args.extend(packages.iter().map(String::as_str));
    let what = format!("download {}", packages.join(" "));
    reported(progress, &format!("fetch {}", packages.join(" ")), || {
        apt.run("apt-get", &args, &debs, &what)
    })?;
    let tmp = kernels.join(format!("{}.tmp", best.release));
    let _ = std::fs::remove_dir_all(&tmp);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&debs)
        .map_err(|e| KernelError::Io(debs.clone(), e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "deb"))
        .collect();
    files.sort();
    for deb in &files {
        let out = Command::new("dpkg-deb")
            .arg("-x")
            .arg(deb)
            .arg(&tmp)
            .output()
            .map_err(|e| KernelError::Io(deb.clone(), e))?;
        if !out.status.success() {
            return Err(KernelError::Apt {
                what: format!("unpack {}", deb.display()),
                output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    let _ = std::fs::remove_dir_all(&debs);
    std::fs::write(tmp.join(".complete"), format!("{source}\n"))
        .map_err(|e| KernelError::Io(tmp.clone(), e))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(|e| KernelError::Io(dir.clone(), e))?;
    hold::hold(&dir).map_err(|e| KernelError::Io(dir.clone(), e))?;
    let mut k = from_tree(&dir).ok_or_else(|| KernelError::Apt {
        what: format!("find the kernel image in {}", dir.display()),
        output: "neither boot/vmlinuz-REL nor usr/lib/modules/REL/vmlinuz".into(),
    })?;
    k.source = source;
    Ok(image(k))
}

/// The newest candidate of series `version`, with the lists it was read from held shared.
fn newest_of(
    apt: &Apt,
    version: &str,
    space: &Path,
    progress: &dyn BuildProgress,
) -> Result<(Candidate, AptLock), KernelError> {
    let lists = apt.fresh_lists(space, progress)?;
    let cands = apt.candidates()?;
    let Some(best) = cands
        .iter()
        .filter(|c| series_matches(version, c.upstream()))
        .max_by_key(|c| c.key())
        .cloned()
    else {
        return Err(KernelError::NoSuchVersion {
            version: version.to_string(),
            newest: newest_per_series(&cands),
        });
    };
    Ok((best, lists))
}

/// Debian's source and headers packages of exactly an image's version, downloaded.
#[derive(Debug, Clone)]
pub struct BuildInputs {
    /// `linux-source-7.3_7.3.4-1~bpo13+1_all.deb`.
    pub source_deb: PathBuf,
    /// `linux-headers-7.3.4+deb13-amd64_..._amd64.deb`: the image's `.config` and `Module.symvers`.
    pub headers_deb: PathBuf,
    /// `linux-source-7.3 7.3.4-1~bpo13+1 (Debian)`.
    pub source: String,
}

/// Downloads `image`'s source and headers packages, of its exact version, into `dir`; a
/// source of another version is refused, naming both.
pub fn download_build_inputs(
    image: &DebianImage,
    dir: &Path,
    progress: &dyn BuildProgress,
) -> Result<BuildInputs, KernelError> {
    let apt = Apt::new()?;
    let _lists = apt.fresh_lists(dir, progress)?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| KernelError::Io(dir.to_path_buf(), e))?;
    need_space(dir)?;
    let source_pkg = image.source_package();
    let headers_pkg = format!("linux-headers-{}", image.release);
    for pkg in [&source_pkg, &headers_pkg] {
        let shown = apt
            .run(
                "apt-cache",
                &["show", pkg.as_str()],
                dir,
                &format!("look up {pkg}"),
            )
            .unwrap_or_default();
        let versions: Vec<String> = shown
            .lines()
            .filter_map(|l| l.strip_prefix("Version:").map(|v| v.trim().to_string()))
            .collect();
        if !versions.contains(&image.version) {
            return Err(KernelError::SourceMismatch {
                image: format!("{} {}", image.package, image.version),
                package: pkg.clone(),
                available: if versions.is_empty() {
                    "none in the suites hvlab searches".into()
                } else {
                    versions.join(", ")
                },
            });
        }
    }
    let wanted = [
        format!("{source_pkg}={}", image.version),
        format!("{headers_pkg}={}", image.version),
    ];
    apt.run(
        "apt-get",
        &["-qq", "download", &wanted[0], &wanted[1]],
        dir,
        &format!("download {}", wanted.join(" ")),
    )?;
    let find = |prefix: &str| -> Result<PathBuf, KernelError> {
        std::fs::read_dir(dir)
            .map_err(|e| KernelError::Io(dir.to_path_buf(), e))?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(&format!("{prefix}_")))
            })
            .ok_or_else(|| KernelError::Apt {
                what: format!("download {prefix}"),
                output: format!("no {prefix}_*.deb in {}", dir.display()),
            })
    };
    Ok(BuildInputs {
        source_deb: find(&source_pkg)?,
        headers_deb: find(&headers_pkg)?,
        source: format!("{source_pkg} {} (Debian)", image.version),
    })
}

/// Runs a shell pipeline over cache paths (quoted here), failing with its stderr when any
/// stage fails (`pipefail`).
fn pipeline(script: &str, what: &str) -> Result<(), KernelError> {
    let out = Command::new("bash")
        .args(["-o", "pipefail", "-c", script])
        .output()
        .map_err(|e| KernelError::Io(PathBuf::from("bash"), e))?;
    if !out.status.success() {
        return Err(KernelError::Apt {
            what: what.to_string(),
            output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// A path in single quotes for `sh`.
fn quoted(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// Unpacks the kernel tree of a `linux-source-SERIES` package into `into` (which must exist):
/// the tarball inside is decompressed on every core (`xz -T0`, it has many blocks).
pub fn unpack_source(deb: &Path, into: &Path) -> Result<(), KernelError> {
    let script = format!(
        "dpkg-deb --fsys-tarfile {} | tar -xO --wildcards './usr/src/linux-source-*.tar.xz' | xz -T0 -dc | tar -x -C {} --strip-components=1",
        quoted(deb),
        quoted(into)
    );
    pipeline(&script, &format!("unpack {}", deb.display()))
}

/// Where [`unpack_headers`] puts Debian's `.config` (beside the source tree, not in it: a
/// tree built out of tree must hold none).
pub const DEBIAN_CONFIG: &str = "debian.config";

/// Copies the `.config` (as [`DEBIAN_CONFIG`]) and `Module.symvers` of a headers package
/// into `into`.
pub fn unpack_headers(deb: &Path, release: &str, into: &Path) -> Result<(), KernelError> {
    let tmp = into.join(".hvlab-headers");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| KernelError::Io(tmp.clone(), e))?;
    let base = format!("./usr/src/linux-headers-{release}");
    let script = format!(
        "dpkg-deb --fsys-tarfile {} | tar -x -C {} '{base}/.config' '{base}/Module.symvers'",
        quoted(deb),
        quoted(&tmp)
    );
    pipeline(&script, &format!("unpack {}", deb.display()))?;
    for (name, to) in [
        (".config", DEBIAN_CONFIG),
        ("Module.symvers", "Module.symvers"),
    ] {
        let from = tmp.join(&base).join(name);
        std::fs::copy(&from, into.join(to)).map_err(|e| KernelError::Io(from.clone(), e))?;
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// The kernel source of series `series` (Debian's `linux-source-SERIES`), unpacked once in
/// the cache: the selftests side-by-side benchmark builds the KVM selftests from it.
pub fn fetch_source(series: &str, progress: &dyn BuildProgress) -> Result<PathBuf, KernelError> {
    if series.is_empty() || !series.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(KernelError::UnknownSpec(format!("debian:{series}")));
    }
    let sources = cache_dir().join("sources");
    std::fs::create_dir_all(&sources).map_err(|e| KernelError::Io(sources.clone(), e))?;
    let tree = sources.join(format!("linux-source-{series}"));
    if tree.join(".complete").is_file() {
        return Ok(tree);
    }
    let apt = Apt::new()?;
    let _lists = apt.fresh_lists(&sources, progress)?;
    // The tarball is ~150 MiB and unpacks to ~1.5 GiB.
    need_space(&sources)?;
    let package = format!("linux-source-{series}");
    let debs = sources.join(format!("{package}.debs"));
    let _ = std::fs::remove_dir_all(&debs);
    std::fs::create_dir_all(&debs).map_err(|e| KernelError::Io(debs.clone(), e))?;
    let what = format!("download {package}");
    reported(progress, &format!("fetch {package}"), || {
        apt.run("apt-get", &["-qq", "download", &package], &debs, &what)
    })?;
    let tmp = sources.join(format!("{package}.tmp"));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| KernelError::Io(tmp.clone(), e))?;
    // The package holds usr/src/linux-source-SERIES.tar.xz: unpack the tarball's tree.
    let script = format!(
        "dpkg-deb --fsys-tarfile {package}_*.deb | tar -xO --wildcards './usr/src/{package}.tar.xz' | tar -xJ -C '{}' --strip-components=1",
        tmp.display()
    );
    let out = Command::new("sh")
        .args(["-c", &script])
        .current_dir(&debs)
        .output()
        .map_err(|e| KernelError::Io(debs.clone(), e))?;
    if !out.status.success() {
        return Err(KernelError::Apt {
            what: format!("unpack {package}"),
            output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let _ = std::fs::remove_dir_all(&debs);
    std::fs::write(tmp.join(".complete"), format!("{package} (Debian)\n"))
        .map_err(|e| KernelError::Io(tmp.clone(), e))?;
    let _ = std::fs::remove_dir_all(&tree);
    std::fs::rename(&tmp, &tree).map_err(|e| KernelError::Io(tree.clone(), e))?;
    Ok(tree)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::progress::Silent;

    #[test]
    fn releases_come_from_both_package_layouts_and_skip_other_flavours() {
        assert_eq!(
            release_of("linux-image-6.12.57+deb12-amd64-unsigned").as_deref(),
            Some("6.12.57+deb12-amd64")
        );
        assert_eq!(
            release_of("linux-binary-7.3.4+deb13-amd64").as_deref(),
            Some("7.3.4+deb13-amd64")
        );
        assert_eq!(
            release_of("linux-image-6.1.0-40-cloud-amd64-unsigned"),
            None
        );
        assert_eq!(release_of("linux-image-6.1.0-40-rt-amd64-unsigned"), None);
        assert_eq!(release_of("linux-modules-7.3.4+deb13-amd64"), None);
        assert_eq!(release_of("linux-binary-unsigned-7.3.4+deb13-amd64"), None);
    }

    #[test]
    fn a_series_matches_its_point_releases_only() {
        assert!(series_matches("6.1", "6.1.158"));
        assert!(!series_matches("6.1", "6.12.57"));
        assert!(series_matches("7.3.4", "7.3.4"));
        assert!(!series_matches("7.3", "7.30.1"));
    }

    /// Fake `apt-get` and `apt-cache` over the lists directory named in the `-o` options.
    /// The first `update` empties the lists, says so (`.started`), takes half a second, then
    /// writes them; one started meanwhile finds nothing new to fetch and returns at once, as
    /// apt's does when the archive answers "not modified".
    fn fake_apt(bin: &Path) {
        use std::os::unix::fs::PermissionsExt;
        let lists = r#"for a; do case $a in Dir::State::Lists=*) lists=${a#Dir::State::Lists=};; esac; done"#;
        let packages = r"Package: linux-binary-7.3.4+deb13-amd64\nVersion: 7.3.4-1~bpo13+1\n\nPackage: linux-image-6.12.57+deb12-amd64-unsigned\nVersion: 6.12.57-1~deb12u1\n";
        let apt_get = format!(
            r#"#!/bin/sh
{lists}
case " $* " in *" update "*)
  if mkdir "$lists/.busy" 2>/dev/null; then
    : > "$lists/Packages"; touch "$lists/.started"; sleep 0.5
    printf '{packages}' > "$lists/Packages"; rmdir "$lists/.busy"
  fi;;
esac
"#
        );
        let apt_cache = format!(
            r#"#!/bin/sh
{lists}
case " $* " in
  *" pkgnames "*) sed -n 's/^Package: //p' "$lists/Packages";;
  *" show "*) cat "$lists/Packages";;
esac
"#
        );
        for (name, text) in [("apt-get", apt_get), ("apt-cache", apt_cache)] {
            let path = bin.join(name);
            std::fs::write(&path, text).expect("write the fake");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
    }

    /// Refreshing the lists is a step reported through the progress every kernel step goes
    /// to (quiet with --json, a spinner on a terminal), never printed on its own.
    #[test]
    fn refreshing_the_package_lists_is_reported_as_a_step() {
        struct Steps(std::cell::RefCell<Vec<String>>);
        impl BuildProgress for Steps {
            fn begin(&self, step: &str) {
                self.0.borrow_mut().push(format!("begin {step}"));
            }
            fn end(&self, step: &str, _: f64) {
                self.0.borrow_mut().push(format!("end {step}"));
            }
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        fake_apt(&bin);
        let state = dir.path().join("apt");
        let apt = Apt::at(state.clone(), Some(bin)).expect("apt state");
        let steps = Steps(std::cell::RefCell::new(Vec::new()));
        let (c, _lists) = newest_of(&apt, "7.3", dir.path(), &steps).expect("resolves");
        assert_eq!(c.version, "7.3.4-1~bpo13+1");
        let what = format!(
            "refresh Debian's package lists (private apt state in {})",
            state.display()
        );
        assert_eq!(
            *steps.0.borrow(),
            [format!("begin {what}"), format!("end {what}")]
        );
    }

    /// A second use of the apt state leaves its sources list as it was: a rewrite would make
    /// apt rebuild its binary cache of the lists on every resolution.
    #[test]
    fn the_sources_list_is_not_rewritten_when_it_is_already_there() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = dir.path().join("apt");
        Apt::at(state.clone(), None).expect("apt state");
        let sources = state.join("etc/sources.list");
        let past = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
        std::fs::File::options()
            .write(true)
            .open(&sources)
            .and_then(|f| f.set_modified(past))
            .expect("age the sources list");
        Apt::at(state.clone(), None).expect("apt state again");
        let modified = std::fs::metadata(&sources).and_then(|m| m.modified());
        assert_eq!(modified.expect("mtime"), past);
        assert_eq!(std::fs::read(&sources).expect("read"), SOURCES.as_bytes());
        // Another hvlab's sources (an older release of it) are replaced.
        std::fs::write(&sources, "deb http://example.invalid/ old main\n").expect("write");
        Apt::at(state, None).expect("apt state replaced");
        assert_eq!(std::fs::read(&sources).expect("read"), SOURCES.as_bytes());
    }

    /// Two resolutions of `debian:7.3` on one cache whose lists are stale: the second starts
    /// while the first's update has the lists emptied. Both must get 7.3.4; without the lock
    /// the second said "Debian has no kernel 7.3 ... the newest it has per series: ."
    #[test]
    fn a_resolution_during_another_ones_update_gets_the_same_answer() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir_all(&bin).expect("bin");
        fake_apt(&bin);
        let state = dir.path().join("apt");
        let resolve = || -> Result<String, String> {
            let apt = Apt::at(state.clone(), Some(bin.clone())).map_err(|e| e.to_string())?;
            newest_of(&apt, "7.3", dir.path(), &Silent)
                .map(|(c, _lists)| format!("{} {}", c.package, c.version))
                .map_err(|e| e.to_string())
        };
        for round in 0..3 {
            let lists = state.join("lists");
            let _ = std::fs::remove_file(lists.join("updated"));
            let _ = std::fs::remove_file(lists.join(".started"));
            let answers: Vec<Result<String, String>> = std::thread::scope(|s| {
                let first = s.spawn(resolve);
                let second = s.spawn(|| {
                    let deadline = std::time::Instant::now() + Duration::from_secs(10);
                    while !lists.join(".started").exists() {
                        assert!(
                            std::time::Instant::now() < deadline,
                            "the update never began"
                        );
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    resolve()
                });
                [first, second]
                    .into_iter()
                    .map(|w| w.join().expect("resolver thread"))
                    .collect()
            });
            for a in &answers {
                assert_eq!(
                    a.as_deref(),
                    Ok("linux-binary-7.3.4+deb13-amd64 7.3.4-1~bpo13+1"),
                    "round {round}: {answers:?}"
                );
            }
        }
    }

    #[test]
    fn the_newest_per_series_is_listed() {
        let c = |p: &str, v: &str| Candidate {
            package: p.into(),
            version: v.into(),
            release: String::new(),
        };
        let text = newest_per_series(&[
            c("a", "6.1.150-1"),
            c("b", "6.1.158-1"),
            c("c", "6.12.57-1~deb12u1"),
            c("d", "7.2.13-1"),
        ]);
        assert_eq!(text, "6.1 (6.1.158), 6.12 (6.12.57), 7.2 (7.2.13)");
    }
}
