//! Where a patch's files go in a kernel build: into modules, into vmlinux, or nowhere, read
//! from the tree's Kbuild makefiles and the kernel's `.config` the way Kbuild reads them
//! (`scripts/Makefile.build`: `obj-y` is built in, `obj-m` a module, `NAME-y` the parts of
//! the composite object `NAME.o`).
//!
//! A patch confined to modules needs only `make M=DIR` against the shipped kernel; anything
//! else needs a whole kernel. The reading is conservative: a file it cannot place, a shared
//! header, a Kconfig change all mean a whole kernel.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

/// A kernel `.config`.
#[derive(Debug, Clone, Default)]
pub struct KConfig {
    values: BTreeMap<String, String>,
}

impl KConfig {
    /// Parses `.config` text (`CONFIG_X=y`, `# CONFIG_Y is not set`).
    pub fn parse(text: &str) -> KConfig {
        let values = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().trim_matches('"').to_string()))
            .collect();
        KConfig { values }
    }

    /// Reads a `.config` file.
    pub fn read(path: &Path) -> std::io::Result<KConfig> {
        Ok(KConfig::parse(&std::fs::read_to_string(path)?))
    }

    /// Every option set, with its value.
    pub fn options(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// `y`, `m`, a string or number; `None` when not set.
    pub fn get(&self, option: &str) -> Option<&str> {
        self.values.get(option).map(String::as_str)
    }

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

/// Where one touched file goes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Placement {
    /// Into a module built by `make M=dir`.
    Module {
        /// The directory whose makefile links the module (`arch/x86/kvm`).
        dir: String,
        /// The module (`kvm`).
        module: String,
    },
    /// Into vmlinux, or something only a whole build regenerates.
    BuiltIn {
        /// Why (`obj-$(CONFIG_TREE_SRCU) += srcutree.o in kernel/rcu/Makefile, CONFIG_TREE_SRCU=y`).
        why: String,
    },
    /// Nothing this configuration builds.
    NotBuilt {
        /// Why (documentation; `CONFIG_KVM_XEN` not set).
        why: String,
    },
}

/// What a set of touched files needs built.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Plan {
    /// Nothing a build uses changes: the patched kernel is the base kernel.
    Nothing,
    /// Modules only: `make M=DIR` for each directory.
    Modules {
        /// The directories, sorted.
        dirs: Vec<String>,
        /// The modules the patch changes (`kvm`).
        modules: Vec<String>,
    },
    /// A whole kernel.
    Whole {
        /// The first file that needs it, and why.
        why: String,
    },
}

/// Per touched file: where it goes. Then what that needs.
pub fn plan(
    tree: &Path,
    config: &KConfig,
    touched: &BTreeSet<String>,
) -> (Plan, Vec<(String, Placement)>) {
    let index = Makefiles::new(tree);
    let placed: Vec<(String, Placement)> = touched
        .iter()
        .map(|f| (f.clone(), place(tree, &index, config, f)))
        .collect();
    if let Some((file, Placement::BuiltIn { why })) = placed
        .iter()
        .find(|(_, p)| matches!(p, Placement::BuiltIn { .. }))
    {
        return (
            Plan::Whole {
                why: format!("{file}: {why}"),
            },
            placed,
        );
    }
    let mut dirs = BTreeSet::new();
    let mut modules = BTreeSet::new();
    for (_, p) in &placed {
        if let Placement::Module { dir, module } = p {
            dirs.insert(dir.clone());
            modules.insert(module.clone());
        }
    }
    let plan = if dirs.is_empty() {
        Plan::Nothing
    } else {
        Plan::Modules {
            dirs: dirs.into_iter().collect(),
            modules: modules.into_iter().collect(),
        }
    };
    (plan, placed)
}

/// Whether a file is documentation or otherwise outside every kernel build.
fn is_documentation(file: &str) -> bool {
    let top = file.split('/').next().unwrap_or(file);
    matches!(top, "Documentation" | "LICENSES" | "samples")
        || (!file.contains('/')
            && (matches!(file, "MAINTAINERS" | "CREDITS" | "COPYING" | ".mailmap")
                || file.starts_with("README")))
}

/// The parts of `tools/` a kernel build compiles and runs itself: objtool (run on every
/// object, modules included, on x86), resolve_btfids (with BTF) and the libraries and headers
/// they build from (`tools/objtool/Makefile`, `tools/bpf/resolve_btfids/Makefile`).
const TOOLS_THE_BUILD_RUNS: [&str; 7] = [
    "tools/objtool/",
    "tools/bpf/resolve_btfids/",
    "tools/lib/",
    "tools/include/",
    "tools/arch/",
    "tools/build/",
    "tools/scripts/",
];

/// Developer tools under `scripts/` that Kbuild never reads: style checkers, finders,
/// decoders. The rest of `scripts/` (`Makefile.build`, `mod/`, `kconfig/`, `link-vmlinux.sh`,
/// ...) is the build itself.
const SCRIPTS_NO_BUILD_READS: [&str; 16] = [
    "scripts/checkpatch.pl",
    "scripts/get_maintainer.pl",
    "scripts/spelling.txt",
    "scripts/const_structs.checkpatch",
    "scripts/coccinelle/",
    "scripts/coccicheck",
    "scripts/checkstack.pl",
    "scripts/decode_stacktrace.sh",
    "scripts/faddr2line",
    "scripts/bloat-o-meter",
    "scripts/get_abi.py",
    "scripts/checkkconfigsymbols.py",
    "scripts/cleanfile",
    "scripts/cleanpatch",
    "scripts/gdb/",
    "scripts/ver_linux",
];

/// Why a file under `tools/` or `scripts/` is read by no kernel build, when it is not.
fn outside_the_build(file: &str) -> Option<&'static str> {
    if file.starts_with("tools/") && !TOOLS_THE_BUILD_RUNS.iter().any(|t| file.starts_with(t)) {
        return Some("a user-space tool under tools/, which no kernel build compiles");
    }
    if SCRIPTS_NO_BUILD_READS.iter().any(|s| file.starts_with(s)) {
        return Some("a developer script under scripts/, which Kbuild never reads");
    }
    None
}

fn place(tree: &Path, index: &Makefiles, config: &KConfig, file: &str) -> Placement {
    if is_documentation(file) {
        return Placement::NotBuilt {
            why: "documentation, which no kernel build reads".into(),
        };
    }
    if let Some(why) = outside_the_build(file) {
        return Placement::NotBuilt { why: why.into() };
    }
    let (dir, name) = file.rsplit_once('/').unwrap_or(("", file));
    if name.starts_with("Kconfig") {
        return Placement::BuiltIn {
            why: "a Kconfig change changes the configuration, so the whole kernel".into(),
        };
    }
    if let Some(stem) = name.strip_suffix(".c").or_else(|| name.strip_suffix(".S")) {
        let object = if dir.is_empty() {
            format!("{stem}.o")
        } else {
            format!("{dir}/{stem}.o")
        };
        return index.place_object(config, &object);
    }
    let private = name.ends_with(".h")
        || matches!(name, "Makefile" | "Kbuild")
        || name.starts_with("Makefile.");
    if private && !dir.starts_with("include/") && !dir.contains("/include/") && dir != "include" {
        // A directory's own header or makefile: it goes where that directory's code goes,
        // when all of that code is in modules.
        return place_directory(tree, index, config, dir, file);
    }
    Placement::BuiltIn {
        why: if name.ends_with(".h") {
            "a shared header: code built into vmlinux may include it".into()
        } else {
            "not a source file of one module: only a whole build is sure to use it".into()
        },
    }
}

/// A header or makefile in `dir`: in modules when every C file of `dir` is.
fn place_directory(
    tree: &Path,
    index: &Makefiles,
    config: &KConfig,
    dir: &str,
    file: &str,
) -> Placement {
    let mut sources: Vec<String> = std::fs::read_dir(tree.join(dir))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.ends_with(".c") || n.ends_with(".S"))
        // Generated by a build (modpost's `kvm.mod.c`): not the directory's code.
        .filter(|n| !n.ends_with(".mod.c"))
        .collect();
    sources.sort();
    let mut module: Option<Placement> = None;
    for s in &sources {
        let stem = s.trim_end_matches(".c").trim_end_matches(".S");
        let object = format!("{dir}/{stem}.o");
        // A source no makefile links (`kvm-asm-offsets.c`, compiled only to generate a
        // header) is built by the directory's own makefile, which `make M=DIR` runs too.
        if !index.lists(&object) {
            continue;
        }
        match index.place_object(config, &object) {
            Placement::BuiltIn { why } => {
                return Placement::BuiltIn {
                    why: format!(
                        "{dir}/{s} is built in ({why}), and {file} is part of its directory"
                    ),
                };
            }
            m @ Placement::Module { .. } => {
                module.get_or_insert(m);
            }
            Placement::NotBuilt { .. } => {}
        }
    }
    module.unwrap_or_else(|| Placement::BuiltIn {
        why: format!(
            "no C file of {dir} goes into a module, so hvlab cannot tell who includes {file}"
        ),
    })
}

/// One makefile assignment that lists objects.
#[derive(Debug, Clone)]
struct Assign {
    /// The makefile's directory, tree-relative.
    dir: String,
    /// `obj`, `lib`, or a composite's name.
    target: String,
    /// `y`, `m`, `objs`, or `$(CONFIG_X)`.
    cond: String,
    /// Objects, tree-relative and normalized.
    objects: Vec<String>,
    /// `dir/Makefile` for messages.
    makefile: String,
}

/// The makefiles that can name a file's object: its directory's and its ancestors', and the
/// architecture's (which include fragments such as `virt/kvm/Makefile.kvm`).
struct Makefiles {
    tree: std::path::PathBuf,
    assigns: Vec<Assign>,
    /// Directory makefiles read so far, by tree-relative path.
    read: std::cell::RefCell<BTreeMap<String, Vec<Assign>>>,
}

impl Makefiles {
    fn new(tree: &Path) -> Makefiles {
        let mut files: BTreeSet<String> = BTreeSet::new();
        collect_makefiles(tree, "arch/x86", &mut files);
        // Every other directory's own makefile is read on demand below; reading them all
        // (thousands) would cost more than the build decision is worth.
        let mut assigns = Vec::new();
        for f in &files {
            assigns.extend(read_makefile(tree, f));
        }
        Makefiles {
            tree: tree.to_path_buf(),
            assigns,
            read: std::cell::RefCell::default(),
        }
    }

    fn assigns_for<'a>(&'a self, tree_assigns: &'a [Assign], object: &str) -> Vec<&'a Assign> {
        self.assigns
            .iter()
            .chain(tree_assigns.iter())
            .filter(|a| a.objects.iter().any(|o| o == object))
            .collect()
    }

    /// Whether a makefile hvlab reads links `object` into anything.
    fn lists(&self, object: &str) -> bool {
        let tree_assigns = self.ancestors_of(object);
        !self.assigns_for(&tree_assigns, object).is_empty()
    }

    fn place_object(&self, config: &KConfig, object: &str) -> Placement {
        // The object's own directory and its ancestors' makefiles (`kvm-y += mmu/mmu.o`).
        let tree_assigns = self.ancestors_of(object);
        let hits = self.assigns_for(&tree_assigns, object);
        if hits.is_empty() {
            return Placement::BuiltIn {
                why: format!(
                    "no makefile hvlab reads lists {object}, so only a whole build is sure to include it"
                ),
            };
        }
        let mut best: Option<Placement> = None;
        for a in hits {
            let p = self.resolve(config, a, &tree_assigns, object);
            match (&best, &p) {
                (_, Placement::BuiltIn { .. }) => return p,
                (None | Some(Placement::NotBuilt { .. }), Placement::Module { .. }) => {
                    best = Some(p)
                }
                (None, Placement::NotBuilt { .. }) => best = Some(p),
                _ => {}
            }
        }
        best.unwrap_or_else(|| Placement::NotBuilt {
            why: format!("{object} is not built with this configuration"),
        })
    }

    fn ancestors_of(&self, object: &str) -> Vec<Assign> {
        let mut out = Vec::new();
        let mut dir = object.rsplit_once('/').map_or("", |(d, _)| d).to_string();
        loop {
            for name in ["Kbuild", "Makefile"] {
                let rel = if dir.is_empty() {
                    name.to_string()
                } else {
                    format!("{dir}/{name}")
                };
                if self.tree.join(&rel).is_file() {
                    let mut read = self.read.borrow_mut();
                    let assigns = read
                        .entry(rel.clone())
                        .or_insert_with(|| read_makefile(&self.tree, &rel));
                    out.extend(assigns.iter().cloned());
                    break;
                }
            }
            match dir.rsplit_once('/') {
                Some((parent, _)) => dir = parent.to_string(),
                None if !dir.is_empty() => dir.clear(),
                None => break,
            }
        }
        out
    }

    /// Where an object listed by `a` ends up.
    fn resolve(
        &self,
        config: &KConfig,
        a: &Assign,
        tree_assigns: &[Assign],
        object: &str,
    ) -> Placement {
        let value = |cond: &str| -> String {
            match cond {
                "y" | "objs" => "y".into(),
                "m" => "m".into(),
                c => c
                    .strip_prefix("$(")
                    .and_then(|c| c.strip_suffix(')'))
                    .and_then(|c| config.get(c))
                    .unwrap_or("n")
                    .to_string(),
            }
        };
        let unset = |cond: &str| Placement::NotBuilt {
            why: format!(
                "{object} is built only with {}, which this configuration does not set",
                cond.trim_start_matches("$(").trim_end_matches(')')
            ),
        };
        let own = value(&a.cond);
        match a.target.as_str() {
            "obj" => match own.as_str() {
                "m" => Placement::Module {
                    dir: a.dir.clone(),
                    module: stem_of(object),
                },
                "y" => Placement::BuiltIn {
                    why: format!("obj-{} in {}{}", a.cond, a.makefile, shown(&a.cond, &own)),
                },
                _ => unset(&a.cond),
            },
            "lib" if own == "y" => Placement::BuiltIn {
                why: format!("lib-{} in {}: linked into vmlinux", a.cond, a.makefile),
            },
            "lib" => unset(&a.cond),
            composite => {
                if own != "y" && own != "m" {
                    return unset(&a.cond);
                }
                let whole = if a.dir.is_empty() {
                    format!("{composite}.o")
                } else {
                    format!("{}/{composite}.o", a.dir)
                };
                let linked: Vec<&Assign> = self
                    .assigns
                    .iter()
                    .chain(tree_assigns.iter())
                    .filter(|x| x.target == "obj" && x.objects.contains(&whole))
                    .collect();
                let mut out: Option<Placement> = None;
                for x in linked {
                    match value(&x.cond).as_str() {
                        "m" => {
                            out.get_or_insert(Placement::Module {
                                dir: x.dir.clone(),
                                module: composite.to_string(),
                            });
                        }
                        "y" => {
                            return Placement::BuiltIn {
                                why: format!(
                                    "part of {whole}, obj-{} in {}{}",
                                    x.cond,
                                    x.makefile,
                                    shown(&x.cond, "y")
                                ),
                            };
                        }
                        _ => {
                            out.get_or_insert(unset(&x.cond));
                        }
                    }
                }
                out.unwrap_or_else(|| Placement::BuiltIn {
                    why: format!("part of {whole}, which no makefile hvlab reads links"),
                })
            }
        }
    }
}

/// `, CONFIG_X=y` after a conditional assignment.
fn shown(cond: &str, value: &str) -> String {
    cond.strip_prefix("$(")
        .and_then(|c| c.strip_suffix(')'))
        .map_or(String::new(), |c| format!(", {c}={value}"))
}

fn stem_of(object: &str) -> String {
    let name = object.rsplit('/').next().unwrap_or(object);
    name.trim_end_matches(".o").to_string()
}

fn collect_makefiles(tree: &Path, dir: &str, out: &mut BTreeSet<String>) {
    let Ok(rd) = std::fs::read_dir(tree.join(dir)) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = format!("{dir}/{name}");
        match e.file_type() {
            Ok(t) if t.is_dir() => collect_makefiles(tree, &rel, out),
            Ok(t) if t.is_file() && (name == "Makefile" || name == "Kbuild") => {
                out.insert(rel);
            }
            _ => {}
        }
    }
}

/// `a/b/../c/./d.o` → `a/c/d.o`.
fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    parts.join("/")
}

/// Reads a makefile, its `include $(srctree)/...` fragments inline, into object assignments.
fn read_makefile(tree: &Path, rel: &str) -> Vec<Assign> {
    let dir = rel.rsplit_once('/').map_or("", |(d, _)| d).to_string();
    let mut vars: BTreeMap<String, String> = BTreeMap::new();
    let mut out = Vec::new();
    read_into(tree, rel, &dir, rel, &mut vars, &mut out, 0);
    out
}

fn read_into(
    tree: &Path,
    file: &str,
    dir: &str,
    makefile: &str,
    vars: &mut BTreeMap<String, String>,
    out: &mut Vec<Assign>,
    depth: usize,
) {
    let Ok(text) = std::fs::read_to_string(tree.join(file)) else {
        return;
    };
    // Continuation lines joined; comments dropped.
    let joined = text.replace("\\\n", " ");
    for raw in joined.lines() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if let Some(inc) = line
            .strip_prefix("include ")
            .or_else(|| line.strip_prefix("-include "))
        {
            let inc = inc.trim().replace("$(srctree)/", "");
            if depth < 4 && !inc.contains('$') {
                read_into(tree, &inc, dir, makefile, vars, out, depth + 1);
            }
            continue;
        }
        let Some((lhs, op, rhs)) = split_assign(line) else {
            continue;
        };
        let rhs = expand(rhs, vars);
        if !lhs.contains('-') {
            // A plain variable (`KVM ?= ../../../virt/kvm`).
            if !(op == "?=" && vars.contains_key(lhs)) {
                vars.insert(lhs.to_string(), rhs.trim().to_string());
            }
            continue;
        }
        let Some((target, cond)) = lhs.rsplit_once('-').filter(|(_, c)| {
            matches!(*c, "y" | "m" | "objs") || (c.starts_with("$(CONFIG_") && c.ends_with(')'))
        }) else {
            continue;
        };
        // `ccflags-y`, `subdir-y`: not objects.
        let objects: Vec<String> = rhs
            .split_whitespace()
            .filter(|o| o.ends_with(".o") || o.ends_with('/'))
            .map(|o| {
                normalize(&if dir.is_empty() {
                    o.to_string()
                } else {
                    format!("{dir}/{o}")
                })
            })
            .collect();
        if objects.is_empty()
            || target.ends_with("flags")
            || matches!(
                target,
                "subdir" | "always" | "targets" | "hostprogs" | "userprogs" | "extra"
            )
        {
            continue;
        }
        out.push(Assign {
            dir: dir.to_string(),
            target: target.to_string(),
            cond: cond.to_string(),
            objects,
            makefile: makefile.to_string(),
        });
    }
}

/// `lhs op rhs` for `+=`, `:=`, `?=`, `=`.
fn split_assign(line: &str) -> Option<(&str, &str, &str)> {
    for op in ["+=", ":=", "?=", "="] {
        if let Some((l, r)) = line.split_once(op) {
            let l = l.trim();
            if l.is_empty() || l.contains(' ') || l.contains(':') {
                return None;
            }
            return Some((l, op, r));
        }
    }
    None
}

/// `$(VAR)` replaced by known plain variables.
fn expand(text: &str, vars: &BTreeMap<String, String>) -> String {
    let mut out = text.to_string();
    for (k, v) in vars {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree shaped like Linux 7.3's where it matters: KVM's x86 makefile includes the
    /// generic fragment through `$(srctree)`, names its objects through `$(KVM)` and in
    /// subdirectories, links composites `kvm.o` and `kvm-amd.o` under `CONFIG_KVM_X86` and
    /// `CONFIG_KVM_AMD`, and has a part under an option that is not set; RCU's objects are
    /// `obj-y` and `obj-$(CONFIG_TREE_SRCU)`.
    fn fixture() -> (tempfile::TempDir, KConfig) {
        let dir = tempfile::tempdir().expect("tempdir");
        let files: &[(&str, &str)] = &[
            (
                "virt/kvm/Makefile.kvm",
                "# generic KVM objects\nKVM ?= ../../../virt/kvm\n\nkvm-y := $(KVM)/kvm_main.o $(KVM)/eventfd.o\nkvm-$(CONFIG_KVM_VFIO) += $(KVM)/vfio.o\n",
            ),
            (
                "arch/x86/kvm/Makefile",
                "ccflags-y += -I $(srctree)/arch/x86/kvm\n\ninclude $(srctree)/virt/kvm/Makefile.kvm\n\nkvm-y += x86.o \\\n\t mmu/mmu.o\nkvm-$(CONFIG_KVM_XEN) += xen.o\nkvm-amd-y += svm/svm.o\n\nifdef CONFIG_HYPERV\nkvm-y += kvm_onhyperv.o\nendif\n\nobj-$(CONFIG_KVM_X86) += kvm.o\nobj-$(CONFIG_KVM_AMD) += kvm-amd.o\n",
            ),
            ("arch/x86/Kbuild", "obj-$(CONFIG_KVM) += kvm/\n"),
            (
                "kernel/rcu/Makefile",
                "KCOV_INSTRUMENT := n\nobj-y += update.o sync.o\nobj-$(CONFIG_TREE_SRCU) += srcutree.o\nobj-$(CONFIG_TINY_SRCU) += srcutiny.o\n",
            ),
            ("virt/kvm/kvm_main.c", ""),
            ("virt/kvm/eventfd.c", ""),
            ("virt/kvm/vfio.c", ""),
            ("virt/kvm/kvm_mm.h", ""),
            ("arch/x86/kvm/x86.c", ""),
            ("arch/x86/kvm/x86.h", ""),
            // Compiled only to generate a header (`always-y`), and modpost's output of a
            // module build: neither is code of the directory's modules or of vmlinux.
            ("arch/x86/kvm/kvm-asm-offsets.c", ""),
            ("arch/x86/kvm/kvm.mod.c", ""),
            ("arch/x86/kvm/xen.c", ""),
            ("arch/x86/kvm/mmu/mmu.c", ""),
            ("arch/x86/kvm/svm/svm.c", ""),
            ("kernel/rcu/srcutree.c", ""),
            ("kernel/rcu/update.c", ""),
            ("kernel/rcu/rcu.h", ""),
        ];
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        }
        let config = KConfig::parse(
            "CONFIG_KVM=m\nCONFIG_KVM_X86=m\nCONFIG_KVM_AMD=m\nCONFIG_KVM_VFIO=y\n# CONFIG_KVM_XEN is not set\nCONFIG_TREE_SRCU=y\nCONFIG_HZ=250\n",
        );
        (dir, config)
    }

    fn plan_of(files: &[&str]) -> (Plan, Vec<(String, Placement)>) {
        let (dir, config) = fixture();
        let touched = files.iter().map(|f| (*f).to_string()).collect();
        plan(dir.path(), &config, &touched)
    }

    #[test]
    fn kvm_files_anywhere_are_module_only_in_the_directory_that_links_them() {
        let (p, _) = plan_of(&["virt/kvm/kvm_main.c"]);
        assert_eq!(
            p,
            Plan::Modules {
                dirs: vec!["arch/x86/kvm".into()],
                modules: vec!["kvm".into()],
            }
        );
        let (p, _) = plan_of(&[
            "arch/x86/kvm/mmu/mmu.c",
            "arch/x86/kvm/svm/svm.c",
            "virt/kvm/kvm_mm.h",
            "arch/x86/kvm/x86.h",
        ]);
        assert_eq!(
            p,
            Plan::Modules {
                dirs: vec!["arch/x86/kvm".into()],
                modules: vec!["kvm".into(), "kvm-amd".into()],
            }
        );
    }

    #[test]
    fn built_in_code_shared_headers_and_kconfig_need_a_whole_kernel() {
        let (p, _) = plan_of(&["kernel/rcu/srcutree.c", "virt/kvm/kvm_main.c"]);
        let Plan::Whole { why } = p else {
            panic!("{p:?}")
        };
        assert!(why.starts_with("kernel/rcu/srcutree.c: obj-$(CONFIG_TREE_SRCU) in kernel/rcu/Makefile, CONFIG_TREE_SRCU=y"), "{why}");
        let (p, _) = plan_of(&["include/linux/srcu.h"]);
        assert!(
            matches!(&p, Plan::Whole { why } if why.contains("shared header")),
            "{p:?}"
        );
        let (p, _) = plan_of(&["kernel/rcu/rcu.h"]);
        assert!(
            matches!(&p, Plan::Whole { why } if why.contains("srcutree.c is built in")),
            "{p:?}"
        );
        let (p, _) = plan_of(&["virt/kvm/Kconfig"]);
        assert!(matches!(p, Plan::Whole { .. }), "{p:?}");
        // A file no makefile lists: hvlab cannot place it, so it does not guess.
        let (p, _) = plan_of(&["mm/memory.c"]);
        assert!(
            matches!(&p, Plan::Whole { why } if why.contains("no makefile")),
            "{p:?}"
        );
    }

    #[test]
    fn documentation_and_code_this_config_does_not_build_need_nothing() {
        let (p, placed) = plan_of(&["Documentation/virt/kvm/api.rst", "arch/x86/kvm/xen.c"]);
        assert_eq!(p, Plan::Nothing);
        assert!(
            matches!(&placed[1].1, Placement::NotBuilt { why } if why.contains("CONFIG_KVM_XEN")),
            "{placed:?}"
        );
        // Documentation beside a module change: modules only.
        let (p, _) = plan_of(&["Documentation/virt/kvm/api.rst", "virt/kvm/eventfd.c"]);
        assert!(matches!(p, Plan::Modules { .. }), "{p:?}");
    }

    #[test]
    fn headers_and_makefiles_of_a_module_directory_rebuild_modules_whatever_it_generates() {
        for file in ["arch/x86/kvm/x86.h", "arch/x86/kvm/Makefile"] {
            let (p, _) = plan_of(&[file]);
            assert_eq!(
                p,
                Plan::Modules {
                    dirs: vec!["arch/x86/kvm".into()],
                    modules: vec!["kvm".into()],
                },
                "{file}"
            );
        }
    }

    #[test]
    fn user_space_tools_and_developer_scripts_need_nothing_but_build_tools_a_whole_kernel() {
        let (p, placed) = plan_of(&[
            "tools/perf/builtin-kvm.c",
            "tools/testing/selftests/kvm/x86/fix_hypercall_test.c",
            "scripts/checkpatch.pl",
            "Documentation/virt/kvm/api.rst",
        ]);
        assert_eq!(p, Plan::Nothing, "{placed:?}");
        assert!(
            placed
                .iter()
                .all(|(_, p)| matches!(p, Placement::NotBuilt { .. })),
            "{placed:?}"
        );
        for file in [
            "tools/objtool/check.c",
            "scripts/Makefile.build",
            "scripts/mod/modpost.c",
        ] {
            let (p, _) = plan_of(&[file]);
            assert!(matches!(p, Plan::Whole { .. }), "{file}: {p:?}");
        }
    }

    #[test]
    fn a_module_linked_into_vmlinux_is_built_in() {
        let (dir, _) = fixture();
        let config = KConfig::parse("CONFIG_KVM=y\nCONFIG_KVM_X86=y\nCONFIG_KVM_AMD=y\n");
        let touched = ["virt/kvm/kvm_main.c".to_string()].into_iter().collect();
        let (p, _) = plan(dir.path(), &config, &touched);
        assert!(
            matches!(&p, Plan::Whole { why } if why.contains("part of arch/x86/kvm/kvm.o")),
            "{p:?}"
        );
    }
}
