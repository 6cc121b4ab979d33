//! `SPEC+PATCH[+PATCH...]`: the kernel's source ([`KernelSource`]), where it ends and each
//! patch file begins. Read once, where the command line takes the spec.

use std::collections::BTreeSet;
use std::path::Path;

use super::BuildError;
use crate::kernel::KernelError;
use crate::kernel::confine;
use crate::kernel::git::{GitError, Revs};
use crate::kernel::patch::PatchFile;
use crate::kernel::source::KernelSource;

/// A kernel spec, typed: its source and the patches on it (`debian:7.3+a.patch+b.patch`).
#[derive(Debug, Clone)]
pub struct PatchedSpec {
    /// As given: what names the kernel in output and in the runs it stores.
    pub given: String,
    /// The spec before the first patch, as given (`debian:7.3`).
    pub base: String,
    /// What the kernel is made from.
    pub source: KernelSource,
    /// The patches, in the order they apply.
    pub patches: Vec<PatchFile>,
}

impl PatchedSpec {
    /// Splits at `+`. A `+` inside a file name works when the whole name exists; a spec that
    /// reads two ways (`amb+x.patch` beside both `amb` and `amb+x.patch`) is refused, naming
    /// both readings. `+debNN` after a Debian version is the start of Debian's own version
    /// string, not a patch. Patches go on a source hvlab rebuilds (Debian's, a git tree's);
    /// what the patches name is checked before anything is fetched.
    pub fn parse(spec: &str) -> Result<PatchedSpec, BuildError> {
        let tokens: Vec<&str> = spec.split('+').collect();
        let first = tokens.first().copied().unwrap_or_default();
        let scheme = KernelSource::with_scheme(first);
        let (base, first_patch) = match &scheme {
            Some(source) => Self::after_scheme(spec, source, &tokens)?,
            None => Self::path_base(&tokens),
        };
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
        let not_rebuilt = || BuildError::NotDebian {
            spec: spec.to_string(),
        };
        let source = match scheme {
            Some(source) => source?,
            None => match KernelSource::at_path(Path::new(&base)) {
                Some(source) => source,
                None if patches.is_empty() => {
                    return Err(KernelError::UnknownSpec(spec.to_string()).into());
                }
                None => return Err(not_rebuilt()),
            },
        };
        if !patches.is_empty() && !source.takes_patches() {
            return Err(not_rebuilt());
        }
        Ok(PatchedSpec {
            given: spec.to_string(),
            base,
            source,
            patches,
        })
    }

    /// The same spec with `--modules DIR` for a kernel given as built.
    #[must_use]
    pub fn with_modules(mut self, dir: Option<&Path>) -> PatchedSpec {
        self.source = self.source.with_modules(dir);
        self
    }

    /// The spec of this source with `patches` on it (a step of a series): `given` names it.
    pub fn with_patches(&self, given: String, patches: Vec<PatchFile>) -> PatchedSpec {
        PatchedSpec {
            given,
            base: self.base.clone(),
            source: self.source.clone(),
            patches,
        }
    }

    /// The spec of one source with no patches: `given` names it (`git:PATH@SHA`).
    pub fn unpatched(given: String, source: KernelSource) -> PatchedSpec {
        PatchedSpec {
            base: given.clone(),
            given,
            source,
            patches: Vec::new(),
        }
    }

    /// A spec named `given` on Debian 7.3, its patches not read: tests that judge runs stored
    /// under a kernel's name.
    #[cfg(test)]
    pub(crate) fn named(given: &str) -> PatchedSpec {
        PatchedSpec {
            given: given.to_string(),
            base: "debian:7.3".into(),
            source: KernelSource::Debian {
                version: "7.3".into(),
            },
            patches: Vec::new(),
        }
    }

    /// The base and the index of the first patch token after a scheme's first token, whose
    /// own text has no `+` (`+deb13` after a Debian version, which is the version's own text,
    /// is refused, naming it).
    fn after_scheme(
        spec: &str,
        source: &Result<KernelSource, GitError>,
        tokens: &[&str],
    ) -> Result<(String, usize), BuildError> {
        let first = tokens.first().copied().unwrap_or_default().to_string();
        if let Ok(source) = source
            && let Some(next) = tokens.get(1)
            && source.name_goes_on(next)
            && !Path::new(next).exists()
        {
            return Err(BuildError::DebianVersionSuffix {
                spec: spec.to_string(),
                suffix: (*next).to_string(),
            });
        }
        Ok((first, 1))
    }

    /// A path base keeps every `+` until the path exists (a build tree named `linux+rt`);
    /// text that is no path is the first token (which the source's reading then names).
    fn path_base(tokens: &[&str]) -> (String, usize) {
        let first = tokens.first().copied().unwrap_or_default().to_string();
        let mut base = first.clone();
        let mut i = 1;
        while !Path::new(&base).exists() && i < tokens.len() {
            base = format!("{base}+{}", tokens[i]);
            i += 1;
        }
        if Path::new(&base).exists() {
            (base, i)
        } else {
            (first, 1)
        }
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

/// Two specs are one kernel when they read the same.
impl PartialEq for PatchedSpec {
    fn eq(&self, other: &PatchedSpec) -> bool {
        self.given == other.given && self.source == other.source
    }
}

impl Eq for PatchedSpec {}

/// A spec is written as given (runs, tables and bisections name kernels by it).
impl serde::Serialize for PatchedSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.given)
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

impl PatchedSpec {
    /// The patches this spec has over `good`: what moved the lines of the files it changes
    /// (the line shift the object-code delta allows). A Debian spec's patches past GOOD's own;
    /// for two commits of one repository, their diff (and this spec's own patches past GOOD's
    /// on top).
    pub fn patches_over(&self, good: &PatchedSpec) -> Vec<PatchFile> {
        let own = self
            .patches
            .iter()
            .filter(|p| !good.patches.iter().any(|q| q.sha256 == p.sha256))
            .cloned();
        match (git_rev(&good.source), git_rev(&self.source)) {
            (Some((gp, grev)), Some((cp, crev))) if gp == cp => {
                git_diff(gp, grev, crev).into_iter().chain(own).collect()
            }
            // Two repositories: no diff says what moved, so any moved line number counts.
            (Some(_), Some(_)) => Vec::new(),
            _ => own.collect(),
        }
    }
}

/// A `git:PATH@REV` source's repository and commit.
fn git_rev(source: &KernelSource) -> Option<(&std::path::Path, &str)> {
    match source {
        KernelSource::Git {
            repo,
            revs: Revs::One(rev),
        } => Some((repo.as_path(), rev.as_str())),
        KernelSource::Git {
            revs: Revs::Range { .. },
            ..
        }
        | KernelSource::Debian { .. }
        | KernelSource::Tree { .. }
        | KernelSource::BzImage { .. } => None,
    }
}

/// The diff between two commits of `repo`, parsed; `None` when git cannot give it, and then
/// any moved line number counts as a change.
fn git_diff(repo: &std::path::Path, from: &str, to: &str) -> Option<PatchFile> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(repo)
        .args(["diff", "--no-color", "--no-ext-diff", from, to])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let path = std::path::PathBuf::from(format!("{from}..{to}.diff"));
    let patches = crate::kernel::patch::parse(&path, &text).ok()?;
    Some(PatchFile {
        path,
        sha256: crate::kernel::patch::sha256_hex(&out.stdout),
        patches,
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::error::fault_exit_code;

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
        assert_eq!(fault_exit_code(e.fault()), 2);
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
        assert_eq!(fault_exit_code(e.fault()), 2);
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
        assert_eq!(fault_exit_code(e.fault()), 2);
        // Debian's own version string is not a patch.
        let e = PatchedSpec::parse("debian:7.3+deb13u1").expect_err("suffix");
        assert!(
            e.to_string()
                .contains("`+deb13u1` is part of Debian's own version"),
            "{e}"
        );
        assert_eq!(fault_exit_code(e.fault()), 2);
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
        assert_eq!(fault_exit_code(e.fault()), 2, "{e}");
        assert_eq!(
            e.to_string(),
            "evil.patch ([PATCH] kvm: a fix) is refused: it names `../../etc/passwd`, a path that climbs out with `..`. A patch may change files inside the kernel source tree only, never through a symlink, and nothing was applied: fix its paths (`--- a/DIR/FILE`, relative to the top of the tree)."
        );
    }
}
