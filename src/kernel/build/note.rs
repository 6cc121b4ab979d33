//! What a build tells its reader, as facts: the notes about a comparison's kernels and the
//! config a kernel was built with. The words are made in `src/export/build.rs`.
//!
//! Both serialize with a `kind` tag. What hvlab wrote before they were typed (a sentence, in a
//! cached `build.json` or a config marker) still loads, as [`BuildNote::Said`] and
//! [`BuildConfig::Said`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::kernel::journal::HunkReport;

/// Something the reader must know about the kernels compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BuildNote {
    /// A hunk applied somewhere other than where the patch put it (at an offset, with fuzz):
    /// the source is not the one the patch was written against.
    HunkMoved {
        /// The patch (or message) it belongs to.
        patch: String,
        /// The file it changes.
        file: String,
        /// The hunk's number in that file's diff.
        hunk: u32,
        /// The line it landed at.
        at: u64,
        /// The fuzz `patch` needed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        fuzz: Option<u32>,
        /// How many lines from where the patch put it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        offset: Option<i64>,
    },
    /// A cached source tree an earlier run left damaged, unpacked again.
    TreeUnpackedAgain {
        /// The tree's directory in the cache (`modules`, `whole`).
        tree: String,
        /// Why it could not be put back.
        why: String,
    },
    /// hvlab's clone of a repository an earlier run left damaged, cloned again.
    CloneMadeAgain {
        /// The user's repository.
        repo: PathBuf,
        /// Why it could not be put back.
        why: String,
    },
    /// Every side is the image with the same modules rebuilt the same way.
    ModulesAlike {
        /// The image's release.
        release: String,
        /// The modules rebuilt (`kvm`, `kvm-amd`).
        modules: Vec<String>,
    },
    /// The patches change built-in code, so a whole kernel is built.
    WholeKernel {
        /// What made it whole (a built-in file).
        why: String,
    },
    /// Every side is a whole kernel built the same way.
    WholeAlike,
    /// The patches touch nothing a build uses: every side is the image as shipped.
    NothingBuilt {
        /// The files and why no build uses them.
        why: String,
        /// The image's release.
        release: String,
    },
    /// Every side is a git commit built whole the same way.
    GitSidesAlike,
    /// A git side beside one that is not from git.
    GitBesideOther,
    /// One side used as given beside one rebuilt here.
    GivenBesideRebuilt,
    /// A range that follows first parents past merges.
    FirstParents {
        /// The merges (`3f2a1b0c (Merge branch ...)`).
        merges: Vec<String>,
    },
    /// A note as an older hvlab wrote it: a sentence.
    #[serde(untagged)]
    Said(String),
}

/// The config a kernel was built with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BuildConfig {
    /// Debian's config of the image, through `olddefconfig` on this host.
    Debian {
        /// The image's release (`7.3.4+deb13-amd64`).
        release: String,
        /// The options `olddefconfig` with this host's compiler left out.
        lost: Vec<String>,
    },
    /// The minimal guest config: tinyconfig, the guest's options, and the tick, preemption,
    /// RCU and KVM options of a base config.
    MinimalGuest {
        /// How many guest options.
        guest_options: usize,
        /// How many of the base config's options were kept.
        kept: usize,
        /// `CONFIG_HZ` (`?` when unset).
        hz: String,
        /// The preemption model.
        preemption: Preemption,
        /// The base config's options not kept, their dependencies being outside the guest.
        lost: Vec<String>,
        /// Where the base config came from, for a git side (a Debian build's is the image's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        base: Option<BaseConfig>,
    },
    /// Debian's, as shipped: nothing was built.
    AsShipped,
    /// A config as an older hvlab described it: a sentence.
    #[serde(untagged)]
    Said(String),
}

/// Where a git side's base config came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum BaseConfig {
    /// `--config FILE`.
    Given {
        /// The file.
        path: PathBuf,
    },
    /// Debian's config of the nearest version in hvlab's kernel cache.
    NearestDebian {
        /// Its release.
        release: String,
    },
}

/// A kernel config's preemption model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preemption {
    /// The model.
    pub model: PreemptModel,
    /// Whether `CONFIG_PREEMPT_LAZY` is on.
    pub lazy: bool,
}

/// The preemption models, the strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreemptModel {
    /// `CONFIG_PREEMPT_RT`.
    Rt,
    /// `CONFIG_PREEMPT_DYNAMIC`.
    Dynamic,
    /// `CONFIG_PREEMPT` (or lazy).
    Full,
    /// `CONFIG_PREEMPT_VOLUNTARY`.
    Voluntary,
    /// None of them.
    None,
}

impl From<HunkReport> for BuildNote {
    /// The facts of `patch`'s line; a line of another shape is kept as it was said.
    fn from(h: HunkReport) -> BuildNote {
        match parse_hunk_line(&h.line) {
            Some((hunk, at, fuzz, offset)) => BuildNote::HunkMoved {
                patch: h.patch,
                file: h.file,
                hunk,
                at,
                fuzz,
                offset,
            },
            None => BuildNote::Said(format!("{}: {}: {}", h.patch, h.file, h.line)),
        }
    }
}

/// `Hunk #N succeeded at L[ with fuzz F][ (offset K line[s])]`, as GNU patch says it: the
/// hunk, line, fuzz and offset; `None` for anything else, so that the words made back from
/// the facts are always patch's own.
fn parse_hunk_line(line: &str) -> Option<(u32, u64, Option<u32>, Option<i64>)> {
    let rest = line.strip_prefix("Hunk #")?;
    let (hunk, rest) = rest.split_once(" succeeded at ")?;
    let (at, mut rest) = rest.split_once(' ').unwrap_or((rest, ""));
    let mut fuzz = None;
    if let Some(after) = rest.strip_prefix("with fuzz ") {
        let (f, tail) = after.split_once(' ').unwrap_or((after, ""));
        fuzz = Some(f.parse().ok()?);
        rest = tail;
    }
    let mut offset = None;
    if let Some(inner) = rest.strip_prefix("(offset ") {
        let (k, unit) = inner.split_once(' ')?;
        let k: i64 = k.parse().ok()?;
        let expected = if k.abs() == 1 { "line)" } else { "lines)" };
        if unit != expected {
            return None;
        }
        offset = Some(k);
    } else if !rest.is_empty() {
        return None;
    }
    Some((hunk.parse().ok()?, at.parse().ok()?, fuzz, offset))
}

/// Reads a config marker: the JSON hvlab writes now, or an older hvlab's sentence.
pub(super) fn read_config_marker(text: &str) -> BuildConfig {
    serde_json::from_str(text).unwrap_or_else(|_| BuildConfig::Said(text.to_string()))
}

/// What a config marker holds.
pub(super) fn config_marker(config: &BuildConfig) -> String {
    // A plain enum of strings and numbers: serializing it cannot fail, and a marker that
    // did would only make the next run configure again.
    serde_json::to_string(config).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An older hvlab's `build.json` holds sentences: they load as `Said`, and a typed note
    /// goes through JSON with its `kind`.
    #[test]
    fn old_sentences_load_and_typed_notes_round_trip() {
        let old: Vec<BuildNote> =
            serde_json::from_str(r#"["x.patch: a.c: Hunk #1 succeeded at 3 (offset 1 line)"]"#)
                .expect("old notes load");
        assert_eq!(
            old,
            vec![BuildNote::Said(
                "x.patch: a.c: Hunk #1 succeeded at 3 (offset 1 line)".into()
            )]
        );
        let config: BuildConfig =
            serde_json::from_str(r#""Debian's, as shipped""#).expect("old config loads");
        assert_eq!(config, BuildConfig::Said("Debian's, as shipped".into()));
        let note = BuildNote::ModulesAlike {
            release: "7.3.4+deb13-amd64".into(),
            modules: vec!["kvm".into()],
        };
        let json = serde_json::to_string(&note).expect("serializes");
        assert_eq!(
            json,
            r#"{"kind":"modules_alike","release":"7.3.4+deb13-amd64","modules":["kvm"]}"#
        );
        assert_eq!(
            serde_json::from_str::<BuildNote>(&json).expect("loads"),
            note
        );
        // A git side's guest config, its base config tagged inside it.
        let guest: BuildConfig = serde_json::from_str(
            r#"{"kind":"minimal_guest","guest_options":40,"kept":12,"hz":"250",
                "preemption":{"model":"dynamic","lazy":true},"lost":[],
                "base":{"kind":"nearest_debian","release":"7.2.13+deb13-amd64"}}"#,
        )
        .expect("a typed config loads");
        assert!(
            matches!(
                &guest,
                BuildConfig::MinimalGuest {
                    preemption: Preemption {
                        model: PreemptModel::Dynamic,
                        lazy: true
                    },
                    base: Some(BaseConfig::NearestDebian { .. }),
                    ..
                }
            ),
            "{guest:?}"
        );
        assert_eq!(read_config_marker(&config_marker(&guest)), guest);
        for line in [
            "Hunk #1 succeeded at 6073 (offset 3 lines)",
            "Hunk #2 succeeded at 10 with fuzz 2 (offset -1 line)",
            "Hunk #3 succeeded at 7 with fuzz 1",
        ] {
            let note = BuildNote::from(HunkReport {
                patch: "x.patch".into(),
                file: "a.c".into(),
                line: line.into(),
            });
            assert!(
                matches!(note, BuildNote::HunkMoved { .. }),
                "{line}: {note:?}"
            );
        }
        let odd = BuildNote::from(HunkReport {
            patch: "x.patch".into(),
            file: "a.c".into(),
            line: "Hunk #1 succeeded at 9 (offset 1 lines)".into(),
        });
        assert_eq!(
            odd,
            BuildNote::Said("x.patch: a.c: Hunk #1 succeeded at 9 (offset 1 lines)".into())
        );
        assert_eq!(
            read_config_marker("Debian's config of 7.3 (from linux-headers-7.3)"),
            BuildConfig::Said("Debian's config of 7.3 (from linux-headers-7.3)".into())
        );
    }
}
