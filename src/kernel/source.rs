//! What a kernel under test is made from, typed once where the command line reads it: a
//! Debian version, a git tree at a ref or over a range, a kernel build tree (or an unpacked
//! Debian package), or a bzImage. Every later layer matches on [`KernelSource`], with no
//! catch-all arm, so a new kind of source is a compile error wherever it is not yet handled
//! (`tests/kernel_source.rs` proves it with the `kernel-source-probe` feature's variant).
//! The patches a spec adds on top are [`crate::kernel::build::PatchedSpec`]'s.

use std::path::{Path, PathBuf};

use super::git::{self, GitError, Revs};

/// Where a kernel under test comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelSource {
    /// `debian:VERSION`: Debian's kernel of that version, fetched with apt ([`super::debian`]).
    Debian {
        /// The version as given (`7.3`, `7.3.4`, `6.12`).
        version: String,
    },
    /// `git:PATH@REF` (one commit) or `git:PATH@BASE..HEAD` (a range, for a series or a
    /// bisection), built in hvlab's own clone of the repository ([`super::git`]).
    Git {
        /// The repository as given, `~` expanded.
        repo: PathBuf,
        /// What follows the `@`.
        revs: Revs,
    },
    /// A kernel build tree (`arch/x86/boot/bzImage`, `.config`) or an unpacked Debian kernel
    /// package (either layout).
    Tree {
        /// The directory.
        path: PathBuf,
        /// `--modules DIR`, when given.
        modules: Option<PathBuf>,
    },
    /// A bzImage, with its modules from `--modules DIR` or KVM built in.
    BzImage {
        /// The image.
        image: PathBuf,
        /// `--modules DIR`, when given.
        modules: Option<PathBuf>,
    },
    /// A kind no layer handles: only under the `kernel-source-probe` feature, whose build
    /// must fail at every match on a source (`tests/kernel_source.rs`).
    #[cfg(feature = "kernel-source-probe")]
    Probe,
}

/// The scheme of `debian:VERSION`.
const DEBIAN: &str = "debian:";
/// The scheme of `git:PATH@REF`.
const GIT: &str = "git:";

impl KernelSource {
    /// The source `text` names by its scheme (`debian:…`, `git:…`), checked as far as the text
    /// alone allows; `None` for text with no scheme (a path, or nothing hvlab knows).
    pub fn with_scheme(text: &str) -> Option<Result<KernelSource, GitError>> {
        if let Some(version) = text.strip_prefix(DEBIAN) {
            return Some(Ok(KernelSource::Debian {
                version: version.to_string(),
            }));
        }
        if text.starts_with(GIT) {
            return Some(git::split_spec(text).and_then(|(repo, rev)| {
                Ok(KernelSource::Git {
                    revs: git::parse_revs(text, &rev)?,
                    repo,
                })
            }));
        }
        None
    }

    /// The source at `path`: a directory is a build tree or an unpacked package, a file a
    /// bzImage; `None` when nothing is there.
    pub fn at_path(path: &Path) -> Option<KernelSource> {
        if path.is_dir() {
            Some(KernelSource::Tree {
                path: path.to_path_buf(),
                modules: None,
            })
        } else if path.is_file() {
            Some(KernelSource::BzImage {
                image: path.to_path_buf(),
                modules: None,
            })
        } else {
            None
        }
    }

    /// Whether `next`, the text after a `+` that follows this source's own text, belongs to
    /// its name rather than naming a patch: `deb13`, `deb13u1`, `bpo13` after a Debian version
    /// (`7.3.4+deb13-amd64`).
    pub fn name_goes_on(&self, next: &str) -> bool {
        match self {
            KernelSource::Debian { .. } => ["deb", "bpo"].iter().any(|p| {
                next.strip_prefix(p)
                    .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
            }),
            KernelSource::Git { .. } | KernelSource::Tree { .. } | KernelSource::BzImage { .. } => {
                false
            }
        }
    }

    /// Whether hvlab can rebuild this source with patches: Debian's source of the version,
    /// or a commit of a git tree. A kernel given as built is used as it is.
    pub fn takes_patches(&self) -> bool {
        match self {
            KernelSource::Debian { .. } | KernelSource::Git { .. } => true,
            KernelSource::Tree { .. } | KernelSource::BzImage { .. } => false,
        }
    }

    /// The same source with `--modules DIR`, which a kernel given as built takes (a Debian
    /// kernel or a git build brings its own).
    #[must_use]
    pub fn with_modules(self, dir: Option<&Path>) -> KernelSource {
        let dir = dir.map(Path::to_path_buf);
        match self {
            KernelSource::Tree { path, modules } => KernelSource::Tree {
                path,
                modules: dir.or(modules),
            },
            KernelSource::BzImage { image, modules } => KernelSource::BzImage {
                image,
                modules: dir.or(modules),
            },
            s @ (KernelSource::Debian { .. } | KernelSource::Git { .. }) => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scheme_and_path_reads_as_its_kind() {
        assert_eq!(
            KernelSource::with_scheme("debian:7.3").map(Result::ok),
            Some(Some(KernelSource::Debian {
                version: "7.3".into()
            }))
        );
        let git = KernelSource::with_scheme("git:/x@v7.2..HEAD")
            .expect("a scheme")
            .expect("a git spec");
        assert_eq!(
            git,
            KernelSource::Git {
                repo: PathBuf::from("/x"),
                revs: Revs::Range {
                    base: "v7.2".into(),
                    head: "HEAD".into()
                }
            }
        );
        let e = KernelSource::with_scheme("git:/x")
            .expect("a scheme")
            .expect_err("no ref");
        assert!(e.to_string().contains("no `@REF`"), "{e}");
        assert!(KernelSource::with_scheme("/boot/vmlinuz").is_none());
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("bzImage");
        std::fs::write(&image, b"x").expect("write");
        assert!(matches!(
            KernelSource::at_path(dir.path()),
            Some(KernelSource::Tree { .. })
        ));
        let modules = dir.path().join("mods");
        assert_eq!(
            KernelSource::at_path(&image).map(|s| s.with_modules(Some(&modules))),
            Some(KernelSource::BzImage {
                image: image.clone(),
                modules: Some(modules)
            })
        );
        assert_eq!(KernelSource::at_path(&dir.path().join("nothing")), None);
        assert!(git.takes_patches());
        assert!(
            !KernelSource::at_path(&image)
                .expect("a file")
                .takes_patches()
        );
    }
}
