//! The object-code delta of two builds of a kernel: every module either build rebuilt,
//! compared function by function ([`compare`](super::compare)).

use serde::Serialize;

use super::{LineShift, ModuleDelta};
use crate::kernel::build::{Built, How};

/// Why part of two builds was not compared, so "identical" cannot be said of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum NotCompared {
    /// A whole kernel was built: its vmlinux is not kept in the cache, only its bzImage.
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

/// The modules a build rebuilt (`kvm.ko`), or why its code cannot be compared.
fn rebuilt(b: &Built) -> Result<Vec<String>, NotCompared> {
    match b.build.as_ref().map(|i| &i.how) {
        Some(How::Modules { modules, .. }) => Ok(modules.clone()),
        Some(How::AsShipped { .. }) => Ok(Vec::new()),
        Some(How::Whole) => Err(NotCompared::WholeKernel),
        None => Err(NotCompared::NotBuilt),
    }
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
