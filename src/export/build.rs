//! A build's words: the one place its notes and its config become sentences (the build
//! records facts, [`crate::kernel::build::BuildNote`] and [`BuildConfig`]).

use std::fmt;

use crate::kernel::build::{BaseConfig, BuildConfig, BuildNote, PreemptModel, Preemption};
use crate::kernel::limits::{LimitHit, ProcessCap};

impl fmt::Display for BuildNote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildNote::HunkMoved {
                patch,
                file,
                hunk,
                at,
                fuzz,
                offset,
            } => {
                // GNU patch's own words, so the reader can search for them.
                write!(f, "{patch}: {file}: Hunk #{hunk} succeeded at {at}")?;
                if let Some(fuzz) = fuzz {
                    write!(f, " with fuzz {fuzz}")?;
                }
                if let Some(k) = offset {
                    let lines = if k.abs() == 1 { "line" } else { "lines" };
                    write!(f, " (offset {k} {lines})")?;
                }
                Ok(())
            }
            BuildNote::TreeUnpackedAgain { tree, why } => write!(
                f,
                "the source tree {tree}/ was left damaged by an earlier run ({why}): unpacked again"
            ),
            BuildNote::CloneMadeAgain { repo, why } => write!(
                f,
                "hvlab's clone of {} was left damaged by an earlier run ({why}): cloned again",
                repo.display()
            ),
            BuildNote::ModulesAlike { release, modules } => write!(
                f,
                "every side is {release}'s image with {} rebuilt from the same source, config and compiler: they differ by the patch alone",
                modules
                    .iter()
                    .map(|m| format!("{m}.ko"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            BuildNote::WholeKernel { why } => write!(f, "a whole kernel is built: {why}"),
            BuildNote::WholeAlike => f.write_str(
                "every side is built from the same source, minimal config and compiler: they differ by the patch alone",
            ),
            BuildNote::NothingBuilt { why, release } => write!(
                f,
                "the patches touch nothing a build uses ({why}); every side is {release} as shipped, so they are the same kernel: judged anyway"
            ),
            BuildNote::GitSidesAlike => f.write_str(
                "every git side is built whole from the same minimal config and compiler: they differ by their commits (and patches) alone",
            ),
            BuildNote::GitBesideOther => f.write_str(
                "a git side is built from its tree and another side is not: they differ by more than a patch (source, config, maybe compiler)",
            ),
            BuildNote::GivenBesideRebuilt => f.write_str(
                "one side is a kernel as given and the other was rebuilt here: they differ by more than the patch (source version, compiler, config)",
            ),
            BuildNote::FirstParents { merges } => {
                let one = merges.len() == 1;
                write!(
                    f,
                    "the range follows first parents: {} {} one step each, judged against {} first parent, and the commits {} brought in are not judged one by one",
                    merges.join(", "),
                    if one { "is" } else { "are" },
                    if one { "its" } else { "their" },
                    if one { "it" } else { "they" },
                )
            }
            BuildNote::Said(text) => f.write_str(text),
        }
    }
}

impl fmt::Display for BuildConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BuildConfig::Debian { release, lost } => {
                write!(
                    f,
                    "Debian's config of {release} (from linux-headers-{release})"
                )?;
                if !lost.is_empty() {
                    write!(
                        f,
                        "; olddefconfig with this host's compiler left out {} option(s) it cannot build: {}",
                        lost.len(),
                        lost.join(", ")
                    )?;
                }
                Ok(())
            }
            BuildConfig::MinimalGuest {
                guest_options,
                kept,
                hz,
                preemption,
                lost,
                base,
            } => {
                write!(
                    f,
                    "minimal guest config (tinyconfig + {guest_options} guest options + {kept} of Debian's HZ/NO_HZ/preemption/RCU/KVM options; HZ={hz}, {preemption})"
                )?;
                if !lost.is_empty() {
                    write!(
                        f,
                        "; not kept, their dependencies being outside the guest: {}",
                        lost.join(", ")
                    )?;
                }
                match base {
                    Some(base) => write!(f, ", its HZ/preemption/RCU/KVM options from {base}"),
                    None => Ok(()),
                }
            }
            BuildConfig::AsShipped => f.write_str("Debian's, as shipped"),
            BuildConfig::Said(text) => f.write_str(text),
        }
    }
}

impl fmt::Display for BaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BaseConfig::Given { path } => write!(f, "--config {}", path.display()),
            BaseConfig::NearestDebian { release } => {
                write!(f, "Debian's {release} config (the nearest hvlab has)")
            }
        }
    }
}

impl fmt::Display for Preemption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.model {
            PreemptModel::Rt => "PREEMPT_RT",
            PreemptModel::Dynamic => "dynamic preemption",
            PreemptModel::Full => "full preemption",
            PreemptModel::Voluntary => "voluntary preemption",
            PreemptModel::None => "no forced preemption",
        })?;
        if self.lazy {
            f.write_str(", lazy")?;
        }
        Ok(())
    }
}

impl fmt::Display for LimitHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitHit::WallTime { limit } => write!(
                f,
                "its wall-time limit of {} (--build-timeout)",
                super::kab::duration(limit.as_secs_f64())
            ),
            LimitHit::Disk { limit, file } => {
                write!(
                    f,
                    "its disk limit of {} (--build-disk)",
                    super::words::bytes(*limit)
                )?;
                match file {
                    Some(file) => write!(
                        f,
                        ": writing {} failed with \"File too large\" at that size",
                        file.display()
                    ),
                    None => f.write_str(": its output and temporary files grew past it"),
                }
            }
            LimitHit::Processes { limit, cap } => write!(
                f,
                "its limit of {limit} processes (--build-procs, held by {cap}): a fork was refused"
            ),
        }
    }
}

impl fmt::Display for ProcessCap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProcessCap::PidsCgroupV1 => "a pids cgroup of its own, cgroup v1",
            ProcessCap::PidsCgroupV2 => "a pids cgroup of its own, cgroup v2",
            ProcessCap::RlimitNproc => "RLIMIT_NPROC in the sandbox's user namespace",
            ProcessCap::Unenforced => {
                "nothing: no pids cgroup can be made here, and RLIMIT_NPROC holds neither root nor a build without a sandbox"
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each typed note and config reads as the sentence hvlab printed before they were typed.
    #[test]
    fn typed_build_notes_read_as_the_sentences_they_replace() {
        let cases: [(String, &str); 6] = [
            (
                BuildNote::HunkMoved {
                    patch: "001-lifecycle-keyed.patch".into(),
                    file: "virt/kvm/kvm_main.c".into(),
                    hunk: 1,
                    at: 6073,
                    fuzz: None,
                    offset: Some(3),
                }
                .to_string(),
                "001-lifecycle-keyed.patch: virt/kvm/kvm_main.c: Hunk #1 succeeded at 6073 (offset 3 lines)",
            ),
            (
                BuildNote::ModulesAlike {
                    release: "7.3.4+deb13-amd64".into(),
                    modules: vec!["kvm".into(), "kvm-amd".into()],
                }
                .to_string(),
                "every side is 7.3.4+deb13-amd64's image with kvm.ko, kvm-amd.ko rebuilt from the same source, config and compiler: they differ by the patch alone",
            ),
            (
                BuildNote::FirstParents {
                    merges: vec!["3f2a1b0c (Merge side)".into()],
                }
                .to_string(),
                "the range follows first parents: 3f2a1b0c (Merge side) is one step each, judged against its first parent, and the commits it brought in are not judged one by one",
            ),
            (
                BuildConfig::Debian {
                    release: "7.3.4+deb13-amd64".into(),
                    lost: vec!["DEBUG_INFO_BTF".into()],
                }
                .to_string(),
                "Debian's config of 7.3.4+deb13-amd64 (from linux-headers-7.3.4+deb13-amd64); olddefconfig with this host's compiler left out 1 option(s) it cannot build: DEBUG_INFO_BTF",
            ),
            (
                BuildConfig::MinimalGuest {
                    guest_options: 41,
                    kept: 17,
                    hz: "250".into(),
                    preemption: Preemption {
                        model: PreemptModel::Dynamic,
                        lazy: true,
                    },
                    lost: vec![],
                    base: Some(BaseConfig::NearestDebian {
                        release: "7.2.13+deb13-amd64".into(),
                    }),
                }
                .to_string(),
                "minimal guest config (tinyconfig + 41 guest options + 17 of Debian's HZ/NO_HZ/preemption/RCU/KVM options; HZ=250, dynamic preemption, lazy), its HZ/preemption/RCU/KVM options from Debian's 7.2.13+deb13-amd64 config (the nearest hvlab has)",
            ),
            (
                BuildNote::Said("an older hvlab's sentence".into()).to_string(),
                "an older hvlab's sentence",
            ),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }
}
