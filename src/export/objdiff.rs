//! The object-code delta in words, as kernel reviewers read `scripts/bloat-o-meter`: per
//! module its summary line (`add/remove: 0/0 grow/shrink: 1/0 up/down: 16/0 (16)`) and a row
//! per changed function with its old and new size in bytes; or "object code identical", with
//! the line-number constants the patch moved; and what was not compared, and why.

use crate::kernel::objdiff::{BuildsDelta, Delta, ModuleDelta, NotCompared, UnitKind, VMLINUX};
use crate::kernel::reach::{Reach, ReachSource};

/// A unit's kind as a column heading.
fn kind_word(kind: UnitKind) -> &'static str {
    match kind {
        UnitKind::Function => "Function",
        UnitKind::Data => "Data",
        UnitKind::Section => "Section",
    }
}

/// Old and new size in bytes (`-` where absent), and what changed beyond the size.
fn sizes(d: &Delta) -> (String, String, &'static str) {
    let n = |b: u64| b.to_string();
    match *d {
        Delta::Added { bytes } => ("-".into(), n(bytes), ""),
        Delta::Removed { bytes } => (n(bytes), "-".into(), ""),
        Delta::Grown { from, to } | Delta::Shrunk { from, to } => (n(from), n(to), ""),
        Delta::ChangedSameSize { bytes } => (n(bytes), n(bytes), "  (same size, code changed)"),
        Delta::Identical { bytes, .. } => (n(bytes), n(bytes), ""),
    }
}

/// A delta's file: `kvm.ko`, or `vmlinux` for a whole kernel's built-in code.
fn file_name(m: &ModuleDelta) -> String {
    if m.module == VMLINUX {
        VMLINUX.to_string()
    } else {
        format!("{}.ko", m.module)
    }
}

/// The line-number constants that differed only by the patch's line shift, over a module.
pub fn line_numbers(m: &ModuleDelta) -> u32 {
    m.units
        .iter()
        .map(|u| match u.delta {
            Delta::Identical { line_numbers, .. } => line_numbers,
            _ => 0,
        })
        .sum()
}

/// bloat-o-meter's summary line of a module's functions, in bytes.
pub fn summary_line(m: &ModuleDelta) -> String {
    let s = m.summary(UnitKind::Function);
    let (mut up, mut down) = (0i64, 0i64);
    for u in m.units.iter().filter(|u| u.kind == UnitKind::Function) {
        let c = u.delta.bytes_change();
        if c > 0 {
            up += c;
        } else {
            down += c;
        }
    }
    // A linked image's same-size differences are mostly moved addresses ([`MOVED_ONLY`]).
    let same_size = if m.module == VMLINUX {
        String::new()
    } else {
        format!(" same size changed: {}", s.changed_same_size)
    };
    format!(
        "add/remove: {}/{} grow/shrink: {}/{}{same_size} up/down: {up}/{down} ({} bytes)",
        s.added, s.removed, s.grown, s.shrunk, s.net_bytes
    )
}

/// What the rows of a linked image leave out: its units of the same size whose bytes differ.
/// A vmlinux has no relocations, so a function that grows moves every address after it, and
/// the code and data naming those addresses differ though they do what they did; its changes
/// are read by size, as `scripts/bloat-o-meter` reads them (identical is still exact).
const MOVED_ONLY: &str = "units of the same size differ and are not listed: in a linked image (no relocations) a size change moves the addresses after it, which code and data name";

/// Whether a changed unit gets a row: in a linked image only a change of size (or an added or
/// removed unit), see [`MOVED_ONLY`].
fn listed(m: &ModuleDelta, u: &crate::kernel::objdiff::UnitDelta) -> bool {
    m.module != VMLINUX || !matches!(u.delta, Delta::ChangedSameSize { .. })
}

/// One module's delta: identical in one line, else the summary and a row per changed unit.
pub fn module(m: &ModuleDelta) -> String {
    let functions = m.summary(UnitKind::Function);
    let total = functions.identical
        + functions.changed_same_size
        + functions.grown
        + functions.shrunk
        + functions.added
        + functions.removed;
    if m.identical() {
        return format!(
            "{}: object code identical ({total} functions; {} line-number constants moved by the patch)",
            file_name(m),
            line_numbers(m)
        );
    }
    let mut out = format!("{}: {}\n", file_name(m), summary_line(m));
    let changed: Vec<_> = m.changed().filter(|u| listed(m, u)).collect();
    let unlisted = m.changed().count() - changed.len();
    if unlisted > 0 {
        out.push_str(&format!("  {unlisted} {MOVED_ONLY}\n"));
    }
    let width = changed
        .iter()
        .map(|u| u.name.len())
        .max()
        .unwrap_or(0)
        .max(8);
    let mut kind = None;
    for u in changed {
        if kind != Some(u.kind) {
            kind = Some(u.kind);
            out.push_str(&format!(
                "  {:<width$} {:>8} {:>8} {:>8}\n",
                kind_word(u.kind),
                "old",
                "new",
                "delta"
            ));
        }
        let (old, new, note) = sizes(&u.delta);
        out.push_str(&format!(
            "  {:<width$} {old:>8} {new:>8} {:>+8}{note}\n",
            u.name,
            u.delta.bytes_change()
        ));
    }
    out.trim_end().to_string()
}

/// Why part of the builds was not compared.
pub fn not_compared(n: &NotCompared) -> String {
    match n {
        NotCompared::WholeKernel => {
            "a whole kernel whose cache entry keeps no vmlinux (built before hvlab kept one): its built-in code is not compared".into()
        }
        NotCompared::NotBuilt => {
            "a kernel used as given (not built by hvlab): its object code is not known".into()
        }
        NotCompared::ModuleMissing { module } => {
            format!("{module}.ko is in one build only")
        }
        NotCompared::Unreadable { module, error } if module == VMLINUX => {
            format!("{module}: {error}")
        }
        NotCompared::Unreadable { module, error } => format!("{module}.ko: {error}"),
    }
}

/// The whole delta: each module, then what was not compared.
pub fn builds(d: &BuildsDelta) -> String {
    let mut parts: Vec<String> = d.modules.iter().map(module).collect();
    parts.extend(
        d.not_compared
            .iter()
            .map(|n| format!("not compared: {}", not_compared(n))),
    );
    if parts.is_empty() {
        parts.push("no module rebuilt: the patch changes nothing a build uses".into());
    }
    parts.join("\n")
}

/// The delta in one line, for a table's row: per changed module its changed functions, the
/// first few by name and size (`kvm.ko: kvm_io_bus_register_dev 589 → 619 (+30)`), then the
/// identical ones (`identical: kvm.ko (9 line-number constants moved), kvm_amd.ko`), and what
/// was not compared.
pub fn brief(d: &BuildsDelta) -> String {
    const NAMED: usize = 3;
    let mut parts: Vec<String> = d
        .modules
        .iter()
        .filter(|m| !m.identical())
        .map(|m| {
            let changed: Vec<_> = m
                .changed()
                .filter(|u| u.kind == UnitKind::Function && listed(m, u))
                .collect();
            let mut named: Vec<String> = changed
                .iter()
                .take(NAMED)
                .map(|u| {
                    let (old, new, note) = sizes(&u.delta);
                    format!(
                        "{} {old} → {new} ({:+}){note}",
                        u.name,
                        u.delta.bytes_change()
                    )
                })
                .collect();
            if changed.len() > NAMED {
                named.push(format!("{} more", changed.len() - NAMED));
            }
            if named.is_empty() {
                named.push(if m.module == VMLINUX {
                    "no function changed size (same-size differences: addresses that moved)".into()
                } else {
                    "data or sections changed, no function".into()
                });
            }
            format!("{}: {}", file_name(m), named.join(", "))
        })
        .collect();
    let identical: Vec<String> = d
        .modules
        .iter()
        .filter(|m| m.identical())
        .map(|m| match line_numbers(m) {
            0 => file_name(m),
            n => format!("{} ({n} line-number constants moved)", file_name(m)),
        })
        .collect();
    if !identical.is_empty() {
        parts.push(format!("identical: {}", identical.join(", ")));
    }
    parts.extend(
        d.not_compared
            .iter()
            .map(|n| format!("not compared: {}", not_compared(n))),
    );
    if parts.is_empty() {
        parts.push("no module rebuilt".into());
    }
    parts.join("; ")
}

/// The functions a patch reaches, and where that was read: `f (inlined into g, h)`.
pub fn reach(r: &Reach, source: &ReachSource) -> String {
    let (from, callers) = match source {
        ReachSource::Dwarf { .. } => ("from DWARF", "inlined into"),
        ReachSource::ScannerNoDebugInfo => (
            "from the C scanner (the build has no debug information)",
            "callers in its file",
        ),
    };
    let functions: Vec<String> = r
        .functions
        .iter()
        .map(|f| {
            if f.callers.is_empty() {
                f.name.clone()
            } else {
                format!("{} ({callers} {})", f.name, f.callers.join(", "))
            }
        })
        .collect();
    let list = if functions.is_empty() {
        "none".to_string()
    } else {
        functions.join(", ")
    };
    format!("reach {from}: {list}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::objdiff::UnitDelta;

    fn unit(kind: UnitKind, name: &str, delta: Delta) -> UnitDelta {
        UnitDelta {
            kind,
            name: name.into(),
            delta,
        }
    }

    /// A table's one line: changed modules first with their functions (the first three named),
    /// then the identical ones with the line numbers each moved, a vmlinux by its own name,
    /// then what was not compared.
    #[test]
    fn the_brief_delta_names_what_changed_first() {
        let grown = |name: &str| unit(UnitKind::Function, name, Delta::Grown { from: 10, to: 14 });
        let d = BuildsDelta {
            modules: vec![
                ModuleDelta {
                    module: "kvm_amd".into(),
                    units: vec![unit(
                        UnitKind::Function,
                        "svm_vcpu_run",
                        Delta::Identical {
                            bytes: 8,
                            line_numbers: 3,
                        },
                    )],
                },
                ModuleDelta {
                    module: "kvm".into(),
                    units: ["a", "b", "c", "d"].map(grown).to_vec(),
                },
                ModuleDelta {
                    module: VMLINUX.into(),
                    units: vec![unit(
                        UnitKind::Data,
                        "x",
                        Delta::Identical {
                            bytes: 4,
                            line_numbers: 0,
                        },
                    )],
                },
            ],
            not_compared: vec![NotCompared::ModuleMissing {
                module: "kvm_intel".into(),
            }],
        };
        assert_eq!(
            brief(&d),
            "kvm.ko: a 10 → 14 (+4), b 10 → 14 (+4), c 10 → 14 (+4), 1 more; identical: kvm_amd.ko (3 line-number constants moved), vmlinux; not compared: kvm_intel.ko is in one build only"
        );
    }

    /// A linked image is read by size: its same-size differences (moved addresses) are counted
    /// in one line, not listed, and not in the summary.
    #[test]
    fn a_vmlinux_delta_lists_size_changes_only() {
        let m = ModuleDelta {
            module: VMLINUX.into(),
            units: vec![
                unit(
                    UnitKind::Function,
                    "srcu_should_expedite",
                    Delta::Grown { from: 120, to: 137 },
                ),
                unit(
                    UnitKind::Function,
                    "copy_process",
                    Delta::ChangedSameSize { bytes: 5563 },
                ),
                unit(
                    UnitKind::Data,
                    "rcu_state",
                    Delta::ChangedSameSize { bytes: 1280 },
                ),
            ],
        };
        let text = module(&m);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "vmlinux: add/remove: 0/0 grow/shrink: 1/0 up/down: 17/0 (17 bytes)"
        );
        assert_eq!(lines[1], format!("  2 {MOVED_ONLY}"));
        assert!(
            !text.contains("copy_process") && !text.contains("rcu_state"),
            "{text}"
        );
        assert!(text.contains("srcu_should_expedite"), "{text}");
        let d = BuildsDelta {
            modules: vec![m],
            not_compared: Vec::new(),
        };
        assert_eq!(brief(&d), "vmlinux: srcu_should_expedite 120 → 137 (+17)");
    }

    /// bloat-o-meter's summary counts and bytes, a row per changed unit with both sizes;
    /// identical modules in one line with the line numbers moved.
    #[test]
    fn a_module_delta_reads_as_bloat_o_meter() {
        let m = ModuleDelta {
            module: "kvm".into(),
            units: vec![
                unit(
                    UnitKind::Function,
                    "grown",
                    Delta::Grown { from: 589, to: 619 },
                ),
                unit(UnitKind::Function, "gone", Delta::Removed { bytes: 40 }),
                unit(
                    UnitKind::Function,
                    "same",
                    Delta::ChangedSameSize { bytes: 12 },
                ),
                unit(
                    UnitKind::Function,
                    "kept",
                    Delta::Identical {
                        bytes: 8,
                        line_numbers: 2,
                    },
                ),
                unit(
                    UnitKind::Section,
                    ".text",
                    Delta::Grown { from: 10, to: 12 },
                ),
            ],
        };
        let text = module(&m);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "kvm.ko: add/remove: 0/1 grow/shrink: 1/0 same size changed: 1 up/down: 30/-40 (-10 bytes)"
        );
        assert!(lines.iter().any(|l| l.split_whitespace().collect::<Vec<_>>() == ["grown", "589", "619", "+30"]));
        assert!(
            lines
                .iter()
                .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["gone", "40", "-", "-40"])
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("same") && l.contains("code changed"))
        );
        assert!(
            !text.contains("kept"),
            "identical units are not listed: {text}"
        );
        assert!(lines.iter().any(|l| l.trim_start().starts_with("Section")));
        let same = ModuleDelta {
            module: "kvm_amd".into(),
            units: vec![m.units[3].clone()],
        };
        assert_eq!(
            module(&same),
            "kvm_amd.ko: object code identical (1 functions; 2 line-number constants moved by the patch)"
        );
    }
}
