//! The object-code delta of two builds of a kernel: every module either build rebuilt,
//! compared function by function ([`compare`](super::compare)).

use serde::Serialize;

use std::path::Path;

use super::{LineShift, ModuleDelta};
use crate::kernel::build::{Built, How};

/// The name a whole kernel's built-in code goes by in a delta.
pub const VMLINUX: &str = "vmlinux";

/// Why part of two builds was not compared, so "identical" cannot be said of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NotCompared {
    /// A whole kernel was built, and its cache entry keeps no vmlinux (it was built before
    /// hvlab kept one): its built-in code cannot be compared.
    WholeKernel,
    /// A kernel used as given, not built by hvlab: what changed in it is unknown.
    NotBuilt,
    /// A rebuilt module one side lacks.
    ModuleMissing {
        /// The module (`kvm`).
        module: String,
    },
    /// A module that could not be read as an object.
    Unreadable {
        /// The module.
        module: String,
        /// The reader's error.
        error: String,
    },
}

/// Two builds compared: each rebuilt module's delta, and what could not be compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BuildsDelta {
    /// Per module, in the order the builds name them.
    pub modules: Vec<ModuleDelta>,
    /// What was left out, and why.
    pub not_compared: Vec<NotCompared>,
}

impl BuildsDelta {
    /// Whether the two builds' object code is identical everywhere either rebuilt it: every
    /// module compared and every unit of each identical (line-number constants aside).
    pub fn identical(&self) -> bool {
        self.not_compared.is_empty() && self.modules.iter().all(ModuleDelta::identical)
    }
}

/// The modules a build rebuilt (`kvm.ko`: every module of a whole kernel), or why its code
/// cannot be compared.
fn rebuilt(b: &Built) -> Result<Vec<String>, NotCompared> {
    match b.build.as_ref().map(|i| &i.how) {
        Some(How::Modules { modules, .. }) => Ok(modules.clone()),
        Some(How::AsShipped { .. }) => Ok(Vec::new()),
        Some(How::Whole) => Ok(b
            .kernel
            .modules
            .as_deref()
            .map(module_files)
            .unwrap_or_default()),
        None => Err(NotCompared::NotBuilt),
    }
}

/// The `.ko` files under a kernel's module directory, by file name.
fn module_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(e.path());
            } else if name.ends_with(".ko") {
                out.push(name);
            }
        }
    }
    out.sort();
    out
}

/// Whether a build is a whole kernel, whose built-in code is its vmlinux.
fn whole(b: &Built) -> bool {
    matches!(b.build.as_ref().map(|i| &i.how), Some(How::Whole))
}

/// Compares `old` and `new`, built from one source: each module either rebuilt, with
/// `lines` the line shift line-number constants may differ by.
pub fn compare_builds(old: &Built, new: &Built, lines: &LineShift<'_>) -> BuildsDelta {
    let mut out = BuildsDelta {
        modules: Vec::new(),
        not_compared: Vec::new(),
    };
    let mut names = Vec::new();
    for side in [old, new] {
        match rebuilt(side) {
            Ok(list) => names.extend(list),
            Err(why) if !out.not_compared.contains(&why) => out.not_compared.push(why),
            Err(_) => {}
        }
    }
    // Two shipped images with nothing rebuilt are the same image only when they are one file.
    if names.is_empty() && out.not_compared.is_empty() && old.kernel.image != new.kernel.image {
        out.not_compared.push(NotCompared::NotBuilt);
    }
    // A whole kernel's built-in code: its vmlinux, kept beside its bzImage.
    if whole(old) || whole(new) {
        match (old.kernel.vmlinux(), new.kernel.vmlinux()) {
            (Some(a), Some(b)) => match super::compare_with(&a, &b, VMLINUX, lines) {
                Ok(d) => out.modules.push(d),
                Err(e) => out.not_compared.push(NotCompared::Unreadable {
                    module: VMLINUX.into(),
                    error: e.to_string(),
                }),
            },
            _ => out.not_compared.push(NotCompared::WholeKernel),
        }
    }
    let mut seen = Vec::new();
    for file in names {
        let module = file.trim_end_matches(".ko").to_string();
        if seen.contains(&module) {
            continue;
        }
        seen.push(module.clone());
        let (Some(a), Some(b)) = (
            old.kernel.module_file(&module),
            new.kernel.module_file(&module),
        ) else {
            out.not_compared.push(NotCompared::ModuleMissing { module });
            continue;
        };
        let name = module.replace('-', "_");
        match super::compare_with(&a, &b, &name, lines) {
            Ok(d) => out.modules.push(d),
            Err(e) => out.not_compared.push(NotCompared::Unreadable {
                module,
                error: e.to_string(),
            }),
        }
    }
    out
}
