//! A whole kernel from the minimal guest config: tinyconfig, the guest's options, and
//! Debian's tick, preemption, RCU and KVM options; built out of the read-only source into
//! `whole-out/` (the unpatched side) or a copy of it of a patched side's own.

use std::path::{Path, PathBuf};

use super::cache::{Laid, SourceCache, TimedSteps, Work, or_remove, own_output};
use super::error::io;
use super::make::make_error;
use super::note::{BuildConfig, PreemptModel, Preemption, config_marker, read_config_marker};
use super::record::{How, describe_source};
use super::{BuildError, Built, PatchedSpec};
use crate::kernel::Kernel;
use crate::kernel::cache::{hold, layout};
use crate::kernel::kbuild::KConfig;
use crate::kernel::limits::BuildKind;
use crate::kernel::patch::sha256_hex;

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
/// The step that makes the minimal guest config, as progress names it.
pub(super) const GUEST_CONFIG_STEP: &str =
    "minimal guest config (tinyconfig + guest + Debian's HZ/preemption/RCU/KVM)";

/// Makes the minimal guest config at `config` (the `.config` that `make_target` reads and
/// writes): `tinyconfig`, the guest's options, the tick, preemption, RCU and KVM options of
/// `debian_config`, `olddefconfig`; then checks every guest option took. Returns what the
/// build records about the config; `of` names the source in an error.
pub(super) fn guest_config(
    make_target: &mut dyn FnMut(&str) -> Result<(), BuildError>,
    config: &Path,
    debian_config: &str,
    of: &str,
) -> Result<BuildConfig, BuildError> {
    let part = debian_part(debian_config);
    make_target("tinyconfig")?;
    let mut text = std::fs::read_to_string(config).map_err(io(config))?;
    for (k, v) in GUEST_CONFIG {
        text.push_str(&format!("{k}={v}\n"));
    }
    text.push_str("# CONFIG_LOCALVERSION_AUTO is not set\n");
    for l in &part {
        text.push_str(l);
        text.push('\n');
    }
    std::fs::write(config, text).map_err(io(config))?;
    make_target("olddefconfig")?;
    let ours = KConfig::read(config).map_err(io(config))?;
    for (k, v) in GUEST_CONFIG {
        let got = ours.get(k).unwrap_or("n");
        if got != *v {
            return Err(BuildError::GuestConfig {
                of: of.to_string(),
                option: (*k).to_string(),
                wanted: (*v).to_string(),
                got: got.to_string(),
                config: config.to_path_buf(),
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
    Ok(BuildConfig::MinimalGuest {
        guest_options: GUEST_CONFIG.len(),
        kept: kept.len() - lost.len(),
        hz: ours.get("CONFIG_HZ").unwrap_or("?").to_string(),
        preemption: preemption(&ours),
        lost,
        base: None,
    })
}

/// Copies what a whole build left in `out` (the tree, or its `O=` directory) into the cache
/// entry `tmp`: the bzImage, the vmlinux, and `lib/modules/RELEASE` with the config and every module of
/// `modules.order`.
pub(super) fn collect_kernel(out: &Path, tmp: &Path) -> Result<(), BuildError> {
    let rel_file = out.join("include/config/kernel.release");
    let release = std::fs::read_to_string(&rel_file)
        .map_err(io(&rel_file))?
        .trim()
        .to_string();
    let image = out.join("arch/x86/boot/bzImage");
    std::fs::copy(&image, tmp.join("bzImage")).map_err(io(&image))?;
    // The linked kernel, for the object-code delta of its built-in code (the minimal guest
    // config has no debug information: about 12 MB).
    let vmlinux = out.join("vmlinux");
    std::fs::copy(&vmlinux, tmp.join("vmlinux")).map_err(io(&vmlinux))?;
    let mods = tmp.join("lib/modules").join(&release);
    std::fs::create_dir_all(&mods).map_err(io(&mods))?;
    std::fs::copy(out.join(".config"), mods.join("config")).map_err(io(out))?;
    let order = out.join("modules.order");
    for obj in std::fs::read_to_string(&order)
        .map_err(io(&order))?
        .lines()
        .filter(|l| !l.is_empty())
    {
        let rel = obj.trim_end_matches(".o");
        let from = out.join(format!("{rel}.ko"));
        let to = mods.join("kernel").join(format!("{rel}.ko"));
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::copy(&from, &to).map_err(io(&from))?;
    }
    Ok(())
}

/// The kernel a complete whole-kernel cache entry holds ([`collect_kernel`]).
pub(super) fn entry_kernel(entry: &Path, spec: &str, source: String) -> Result<Kernel, BuildError> {
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
    Ok(Kernel {
        release,
        spec: spec.to_string(),
        source,
        image,
        config: Some(moddir.join("config")),
        modules: Some(moddir),
    })
}

impl SourceCache<'_> {
    /// Builds (or reuses) a whole kernel for every side; every patch applies before anything
    /// is built.
    pub(super) fn whole_group(
        &mut self,
        tree: &Path,
        sides: &[&PatchedSpec],
        config_sha: &str,
    ) -> Result<Vec<Built>, BuildError> {
        self.check_applies(tree, sides.iter().copied())?;
        // The side with the fewest patches first: the others build incrementally on it.
        let mut order: Vec<usize> = (0..sides.len()).collect();
        order.sort_by_key(|&i| sides[i].patches.len());
        let mut out: Vec<Option<Built>> = vec![None; sides.len()];
        for i in order {
            out[i] = Some(self.build_whole(sides[i], config_sha)?);
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// The minimal guest config in `whole-out/` (`O=` of the unpatched side's build): made
    /// once per source version, every guest option checked. What a failed config wrote goes.
    pub(super) fn configured(&mut self) -> Result<(PathBuf, PathBuf, BuildConfig), BuildError> {
        let tree = self.source()?;
        let out = self.root().join(layout::WHOLE_OUT);
        let marker = out.join(".hvlab-configured");
        if let Ok(text) = std::fs::read_to_string(&marker) {
            // Its last use, for `hvlab cache prune`: every whole-kernel build starts from it.
            hold::touch(&out);
            return Ok((tree, out, read_config_marker(&text)));
        }
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out).map_err(io(&out))?;
        let log = self.log("config");
        let (_, debian_text) = self.debian_config()?;
        let of = self.source_name();
        let work = Work::new(self.root(), "config")?;
        let o = format!("O={}", out.display());
        let config = or_remove(&out, || {
            self.timed(GUEST_CONFIG_STEP, |me| {
                let tmp = work.tmp();
                let mut run = |target: &str| {
                    me.make(
                        &tree,
                        &Laid::Unpatched,
                        vec![&out],
                        &tmp,
                        BuildKind::Whole,
                        &log,
                    )
                    .run(&[o.clone(), target.into()])
                    .map_err(make_error(
                        false,
                        "the minimal guest config",
                        &log,
                    ))
                };
                guest_config(&mut run, &out.join(".config"), &debian_text, &of)
            })
        })?;
        std::fs::write(&marker, config_marker(&config)).map_err(io(&marker))?;
        Ok((tree, out, config))
    }

    fn build_whole(&mut self, side: &PatchedSpec, debian_sha: &str) -> Result<Built, BuildError> {
        let (tree, base, config_note) = self.configured()?;
        let config_sha = std::fs::read(base.join(".config"))
            .map(|b| sha256_hex(&b))
            .map_err(io(&base))?;
        let key = self.key(&format!("whole:{config_sha}"), debian_sha, &side.patches);
        let (entry, info) = match self.cached(&key) {
            Some(hit) => hit,
            None => {
                let patched = !side.patches.is_empty();
                let label = Self::side_label(side);
                let log = self.log(&format!("whole-{key}"));
                let (tmp, notes, steps) =
                    self.build_entry(&tree, &key, side, |me, laid, work, entry| {
                        let out = if patched {
                            own_output(&base, &work.out())?;
                            work.out()
                        } else {
                            base.clone()
                        };
                        let step = format!("make bzImage modules ({label})");
                        let build = |me: &mut SourceCache<'_>| {
                            let tmp = work.tmp();
                            let args = vec![
                                format!("O={}", out.display()),
                                "bzImage".into(),
                                "modules".into(),
                            ];
                            me.timed(&step, |me| {
                                me.make(&tree, laid, vec![&out], &tmp, BuildKind::Whole, &log)
                                    .run(&args)
                                    .map_err(make_error(patched, &step, &log))
                            })?;
                            collect_kernel(&out, entry)
                        };
                        if patched {
                            build(me)
                        } else {
                            or_remove(&out.clone(), || build(me))
                        }
                    })?;
                let info = self.record(How::Whole, config_note, side, notes, steps, &key);
                (self.finish_entry(&key, &tmp, &info)?, info)
            }
        };
        let source = describe_source(&self.image, &info);
        let kernel = entry_kernel(&entry, &side.given, source)?;
        Ok(Built {
            kernel,
            build: Some(info),
        })
    }
}

/// The preemption model of a config.
fn preemption(c: &KConfig) -> Preemption {
    let on = |k: &str| c.get(k) == Some("y");
    let model = if on("CONFIG_PREEMPT_RT") {
        PreemptModel::Rt
    } else if on("CONFIG_PREEMPT_DYNAMIC") {
        PreemptModel::Dynamic
    } else if on("CONFIG_PREEMPT") || on("CONFIG_PREEMPT_LAZY") {
        PreemptModel::Full
    } else if on("CONFIG_PREEMPT_VOLUNTARY") {
        PreemptModel::Voluntary
    } else {
        PreemptModel::None
    };
    Preemption {
        model,
        lazy: on("CONFIG_PREEMPT_LAZY"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        for (option, _) in crate::kernel::GUEST_NEEDS {
            assert!(GUEST_CONFIG.iter().any(|(k, _)| *k == option), "{option}");
        }
    }
}
