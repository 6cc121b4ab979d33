//! The object-code delta between two builds of a module, function by function, as kernel
//! reviewers read `scripts/bloat-o-meter`: what was added, removed, grew or shrank, with
//! bytes; and, for each function of the same size, whether its code is identical.
//!
//! Two builds of the same code differ in more than nothing: line numbers move when a comment
//! above them grows (`__LINE__` in `__bug_table` entries, in `__dyndbg` descriptors, in
//! `__might_sleep()`'s immediate), a function placed later in `.text` moves, and so do the
//! offsets of the strings and data a function names. So a function's code is compared as
//! instructions (iced-x86), not bytes: a branch or call is compared by the function (and
//! offset) it reaches, a relocated field by what it names (a symbol, or a string's text), and
//! an immediate or data field that differs by exactly the patch's own line shift
//! ([`LineShift`]) is a line number, counted apart and not a change. Debug information, notes
//! (the build ID hashes everything) and `.modinfo` are not code and are not compared.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use iced_x86::{Decoder, DecoderOptions, Instruction, OpKind, Register};
use object::{
    Object, ObjectSection, ObjectSymbol, RelocationKind, RelocationTarget, SectionIndex,
    SectionKind, SymbolKind,
};
use serde::Serialize;

use super::patch::{FileDiff, PatchFile};

/// Why two modules cannot be compared.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum ObjdiffError {
    /// Cannot read the module {0}: {1}.
    Read(PathBuf, String),
    /// {0} is not an ELF object hvlab can read: {1}.
    NotElf(PathBuf, String),
}

/// What one unit (a function, a data object, a section's unnamed bytes) became.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Delta {
    /// Only in the new build.
    Added {
        /// Its size in the new build.
        bytes: u64,
    },
    /// Only in the old build.
    Removed {
        /// Its size in the old build.
        bytes: u64,
    },
    /// Larger in the new build.
    Grown {
        /// Old size.
        from: u64,
        /// New size.
        to: u64,
    },
    /// Smaller in the new build.
    Shrunk {
        /// Old size.
        from: u64,
        /// New size.
        to: u64,
    },
    /// The same size, different code or data.
    ChangedSameSize {
        /// Its size.
        bytes: u64,
    },
    /// The same code (or data), line-number constants aside.
    Identical {
        /// Its size.
        bytes: u64,
        /// Fields that differed only by the patch's line shift (`__LINE__`).
        line_numbers: u32,
    },
}

impl Delta {
    /// The change in bytes, new minus old.
    pub fn bytes_change(&self) -> i64 {
        let s = |b: u64| i64::try_from(b).unwrap_or(i64::MAX);
        match *self {
            Delta::Added { bytes } => s(bytes),
            Delta::Removed { bytes } => -s(bytes),
            Delta::Grown { from, to } | Delta::Shrunk { from, to } => s(to) - s(from),
            Delta::ChangedSameSize { .. } | Delta::Identical { .. } => 0,
        }
    }

    /// Whether the code (or data) is the same.
    pub fn is_identical(&self) -> bool {
        matches!(self, Delta::Identical { .. })
    }
}

/// What a unit is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnitKind {
    /// A function (`STT_FUNC`).
    Function,
    /// A data object (`STT_OBJECT`).
    Data,
    /// The bytes of a section no symbol covers (`__bug_table`, strings, alternatives).
    Section,
}

/// One unit's delta.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UnitDelta {
    /// What it is.
    pub kind: UnitKind,
    /// Its name, clone numbers dropped (`__direct_pte_prefetch.isra`), a second static of the
    /// same name numbered (`init#2`); a section's name for [`UnitKind::Section`].
    pub name: String,
    /// What it became.
    pub delta: Delta,
}

/// Two builds of one module compared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ModuleDelta {
    /// The module (`kvm`).
    pub module: String,
    /// Every unit of either build, functions first, each kind by name.
    pub units: Vec<UnitDelta>,
}

impl ModuleDelta {
    /// Whether every function, data object and section is identical.
    pub fn identical(&self) -> bool {
        self.units.iter().all(|u| u.delta.is_identical())
    }

    /// The units that are not identical.
    pub fn changed(&self) -> impl Iterator<Item = &UnitDelta> {
        self.units.iter().filter(|u| !u.delta.is_identical())
    }

    /// The functions' delta of one name (clone numbers dropped).
    pub fn function(&self, name: &str) -> Option<&Delta> {
        self.units
            .iter()
            .find(|u| u.kind == UnitKind::Function && u.name == name)
            .map(|u| &u.delta)
    }

    /// bloat-o-meter's summary: (added, removed, grown, shrunk) counts and the net bytes of
    /// `kind`'s units.
    pub fn summary(&self, kind: UnitKind) -> Summary {
        let mut s = Summary::default();
        for u in self.units.iter().filter(|u| u.kind == kind) {
            match u.delta {
                Delta::Added { .. } => s.added += 1,
                Delta::Removed { .. } => s.removed += 1,
                Delta::Grown { .. } => s.grown += 1,
                Delta::Shrunk { .. } => s.shrunk += 1,
                Delta::ChangedSameSize { .. } => s.changed_same_size += 1,
                Delta::Identical { .. } => s.identical += 1,
            }
            s.net_bytes += u.delta.bytes_change();
        }
        s
    }
}

/// Counts of one kind of unit by delta.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Added.
    pub added: usize,
    /// Removed.
    pub removed: usize,
    /// Grown.
    pub grown: usize,
    /// Shrunk.
    pub shrunk: usize,
    /// The same size, changed.
    pub changed_same_size: usize,
    /// Identical.
    pub identical: usize,
    /// New minus old, in bytes.
    pub net_bytes: i64,
}

/// How the patch moved the lines that stay: an old line `a` now at `b` makes a field holding
/// `a` in the old build and `b` in the new one a line number, not a change.
pub struct LineShift<'a> {
    files: Vec<&'a FileDiff>,
}

impl<'a> LineShift<'a> {
    /// The line shifts of every file the patches change.
    pub fn of(patches: &'a [PatchFile]) -> LineShift<'a> {
        LineShift {
            files: patches
                .iter()
                .flat_map(|p| &p.patches)
                .flat_map(|m| &m.files)
                .collect(),
        }
    }

    /// No patch: any difference is a change.
    pub fn none() -> LineShift<'static> {
        LineShift { files: Vec::new() }
    }

    /// Whether some changed file keeps its old line `a` as new line `b` (`a != b`).
    pub fn moves(&self, a: u64, b: u64) -> bool {
        a != b
            && a > 0
            && usize::try_from(a).is_ok_and(|a| {
                self.files
                    .iter()
                    .any(|d| d.new_line_of(a).is_some_and(|n| n as u64 == b))
            })
    }
}

/// What a relocated field names, independent of where things were placed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Target {
    /// A symbol (clone numbers dropped) and an offset from it.
    Symbol(String, i64),
    /// A string of a merged string section, by its text.
    Str(Vec<u8>),
    /// An offset in a section no symbol covers there.
    Section(String, i64),
    /// An absolute value.
    Absolute(i64),
}

/// A relocation inside a unit: where, how, and what it names.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Reloc {
    offset: u64,
    kind: RelocationKind,
    target: Target,
}

/// One unit's bytes (relocated fields zeroed) and its relocations.
struct Body {
    kind: UnitKind,
    section: SectionIndex,
    /// The unit's first byte, as an offset in its section.
    start: u64,
    bytes: Vec<u8>,
    relocs: Vec<Reloc>,
    /// Whether the unit is machine code (decoded to compare).
    code: bool,
}

/// A module (or a linked vmlinux) read for comparison: its units by name.
struct Units {
    units: BTreeMap<(UnitKind, String), Body>,
    /// Per section, its named symbols sorted by start: (start, size, name).
    symbols: HashMap<SectionIndex, Vec<(u64, u64, String)>>,
    /// Per section, the furthest end of its symbols up to each one in `symbols`: where a
    /// backward search for the symbol covering an offset can stop.
    reach: HashMap<SectionIndex, Vec<u64>>,
    /// Each section's address: 0 in a relocatable module, where it is placed in a linked
    /// executable (vmlinux), whose symbols and branch targets are addresses.
    addresses: HashMap<SectionIndex, u64>,
    /// In a linked executable, every named symbol by address (address, size, name): a call
    /// there is a resolved address that may lead to another section (`.noinstr.text`).
    linked: Vec<(u64, u64, String)>,
}

/// `name` with GCC's and the assembler's numbers dropped (`f.isra.0` → `f.isra`, `key.12` →
/// `key`): they count clones per file and move when another function is cloned.
pub fn normalised(name: &str) -> String {
    name.split('.')
        .enumerate()
        .filter(|(i, part)| *i == 0 || part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()))
        .map(|(_, p)| p)
        .collect::<Vec<_>>()
        .join(".")
}

/// Sections that are not code or data the module runs with: debug information, notes, the
/// module's own description.
fn ignored_section(name: &str) -> bool {
    name.starts_with(".debug")
        || name.starts_with(".note")
        || name.starts_with(".BTF")
        || name == ".comment"
        || name == ".modinfo"
        || name == ".gnu.build.attributes"
}

const SHF_ALLOC: u64 = 0x2;
const SHF_EXECINSTR: u64 = 0x4;
const SHF_STRINGS: u64 = 0x20;

fn sh_flags(section: &object::Section<'_, '_>) -> u64 {
    match section.flags() {
        object::SectionFlags::Elf { sh_flags, .. } => sh_flags.0,
        _ => 0,
    }
}

impl Units {
    fn read(path: &Path, data: &[u8]) -> Result<Units, ObjdiffError> {
        let file = object::File::parse(data)
            .map_err(|e| ObjdiffError::NotElf(path.to_path_buf(), e.to_string()))?;
        let linked = file.kind() == object::ObjectKind::Executable;
        let addresses: HashMap<SectionIndex, u64> = file
            .sections()
            .map(|s| (s.index(), if linked { s.address() } else { 0 }))
            .collect();
        let mut symbols: HashMap<SectionIndex, Vec<(u64, u64, String)>> = HashMap::new();
        let mut named: Vec<(UnitKind, String, SectionIndex, u64, u64)> = Vec::new();
        for sym in file.symbols() {
            let kind = match sym.kind() {
                SymbolKind::Text => UnitKind::Function,
                SymbolKind::Data | SymbolKind::Tls => UnitKind::Data,
                _ => continue,
            };
            let (Some(section), Ok(name)) = (sym.section_index(), sym.name()) else {
                continue;
            };
            if sym.size() == 0 || name.is_empty() {
                continue;
            }
            // A symbol's place in its section: its address less the section's.
            let start = sym.address() - addresses.get(&section).copied().unwrap_or(0);
            symbols
                .entry(section)
                .or_default()
                .push((start, sym.size(), normalised(name)));
            // CFI and call-padding prefixes are the compiler's padding, not a function.
            if name.starts_with("__pfx_") || name.starts_with("__cfi_") {
                continue;
            }
            named.push((kind, normalised(name), section, start, sym.size()));
        }
        for list in symbols.values_mut() {
            list.sort();
        }
        let mut by_address: Vec<(u64, u64, String)> = Vec::new();
        if linked {
            for (section, list) in &symbols {
                let base = addresses.get(section).copied().unwrap_or(0);
                by_address.extend(list.iter().map(|(o, n, name)| (base + o, *n, name.clone())));
            }
            by_address.sort();
        }
        let reach = symbols
            .iter()
            .map(|(section, list)| {
                let ends = list
                    .iter()
                    .scan(0u64, |furthest, (start, size, _)| {
                        *furthest = (*furthest).max(start + size);
                        Some(*furthest)
                    })
                    .collect();
                (*section, ends)
            })
            .collect();
        let mut out = Units {
            units: BTreeMap::new(),
            symbols,
            reach,
            addresses,
            linked: by_address,
        };
        let mut relocs_of: HashMap<SectionIndex, Vec<(u64, object::Relocation)>> = HashMap::new();
        let mut data_of: HashMap<SectionIndex, Vec<u8>> = HashMap::new();
        for section in file.sections() {
            let flags = sh_flags(&section);
            let name = section.name().unwrap_or_default();
            if flags & SHF_ALLOC == 0 || ignored_section(name) {
                continue;
            }
            let bytes = if section.kind() == SectionKind::UninitializedData {
                vec![0; usize::try_from(section.size()).unwrap_or(0)]
            } else {
                section
                    .uncompressed_data()
                    .map_err(|e| ObjdiffError::NotElf(path.to_path_buf(), e.to_string()))?
                    .into_owned()
            };
            data_of.insert(section.index(), bytes);
            // Sorted by their place in the section, so a unit finds its own by binary search
            // (kvm.ko's .text has thousands of functions and tens of thousands of them).
            let base = out.addresses.get(&section.index()).copied().unwrap_or(0);
            let mut relocs: Vec<(u64, object::Relocation)> = section.relocations().collect();
            relocs.sort_by_key(|(offset, _)| offset.wrapping_sub(base));
            relocs_of.insert(section.index(), relocs);
        }
        let mut seen: HashMap<(UnitKind, String), u32> = HashMap::new();
        for (kind, name, section, start, size) in named {
            let Some(bytes) = data_of.get(&section) else {
                continue;
            };
            let n = seen.entry((kind, name.clone())).or_insert(0);
            *n += 1;
            let key = if *n == 1 { name } else { format!("{name}#{n}") };
            let code = file
                .section_by_index(section)
                .is_ok_and(|s| sh_flags(&s) & SHF_EXECINSTR != 0)
                && kind == UnitKind::Function;
            let body = out.body(&file, kind, section, (start, size), bytes, &relocs_of, code);
            out.units.insert((kind, key), body);
        }
        // What no symbol covers, per section, as one unit.
        for section in file.sections() {
            let Some(bytes) = data_of.get(&section.index()) else {
                continue;
            };
            let covered = out
                .symbols
                .get(&section.index())
                .cloned()
                .unwrap_or_default();
            let mut gaps = Vec::new();
            let mut at = 0u64;
            for (start, size, _) in &covered {
                if *start > at {
                    gaps.push((at, *start));
                }
                at = at.max(start + size);
            }
            if at < bytes.len() as u64 {
                gaps.push((at, bytes.len() as u64));
            }
            if gaps.is_empty() {
                continue;
            }
            let name = section.name().unwrap_or_default().to_string();
            let mut whole = Body {
                kind: UnitKind::Section,
                section: section.index(),
                start: 0,
                bytes: Vec::new(),
                relocs: Vec::new(),
                code: false,
            };
            for (from, to) in gaps {
                let part = out.body(
                    &file,
                    UnitKind::Section,
                    section.index(),
                    (from, to - from),
                    bytes,
                    &relocs_of,
                    false,
                );
                let base = whole.bytes.len() as u64;
                whole.relocs.extend(part.relocs.into_iter().map(|r| Reloc {
                    offset: r.offset + base,
                    ..r
                }));
                whole.bytes.extend(part.bytes);
            }
            out.units.insert((UnitKind::Section, name), whole);
        }
        Ok(out)
    }

    /// The unit `[start, start + size)` of `section`: its bytes with relocated fields zeroed,
    /// and its relocations by what they name.
    #[allow(clippy::too_many_arguments)]
    fn body(
        &self,
        file: &object::File<'_>,
        kind: UnitKind,
        section: SectionIndex,
        (start, size): (u64, u64),
        data: &[u8],
        relocs_of: &HashMap<SectionIndex, Vec<(u64, object::Relocation)>>,
        code: bool,
    ) -> Body {
        let from = usize::try_from(start).unwrap_or(usize::MAX).min(data.len());
        let to = usize::try_from(start + size)
            .unwrap_or(usize::MAX)
            .min(data.len());
        let mut bytes = data[from..to].to_vec();
        let mut relocs = Vec::new();
        // A linked executable's relocations (`--emit-relocs`) are at addresses.
        let base = self.addresses.get(&section).copied().unwrap_or(0);
        let all = relocs_of.get(&section).map_or(&[][..], Vec::as_slice);
        let first = all.partition_point(|(offset, _)| offset.wrapping_sub(base) < start);
        for (offset, r) in &all[first..] {
            let offset = &offset.wrapping_sub(base);
            if *offset >= start + size {
                break;
            }
            let at = offset - start;
            let width = usize::from(r.size() / 8);
            let at_usize = usize::try_from(at).unwrap_or(usize::MAX);
            if let Some(field) = bytes.get_mut(at_usize..at_usize.saturating_add(width)) {
                field.fill(0);
            }
            relocs.push(Reloc {
                offset: at,
                kind: r.kind(),
                target: self.target(file, r),
            });
        }
        Body {
            kind,
            section,
            start,
            bytes,
            relocs,
            code,
        }
    }

    /// What a relocation names: a symbol by name, a string by its text, else the symbol that
    /// covers its section offset.
    fn target(&self, file: &object::File<'_>, r: &object::Relocation) -> Target {
        match r.target() {
            RelocationTarget::Symbol(idx) => {
                let Ok(sym) = file.symbol_by_index(idx) else {
                    return Target::Absolute(r.addend());
                };
                match (sym.kind(), sym.section_index()) {
                    (SymbolKind::Section, Some(section)) => {
                        // A PC-relative field is the end of its 4 bytes short of its target.
                        let pc = matches!(
                            r.kind(),
                            RelocationKind::Relative | RelocationKind::PltRelative
                        );
                        let offset = r.addend() + if pc { 4 } else { 0 };
                        self.in_section(file, section, offset)
                    }
                    _ => Target::Symbol(normalised(sym.name().unwrap_or_default()), r.addend()),
                }
            }
            RelocationTarget::Section(section) => self.in_section(file, section, r.addend()),
            _ => Target::Absolute(r.addend()),
        }
    }

    /// What `offset` in `section` is: a string's text, the symbol covering it, or the offset.
    fn in_section(&self, file: &object::File<'_>, section: SectionIndex, offset: i64) -> Target {
        let Ok(s) = file.section_by_index(section) else {
            return Target::Absolute(offset);
        };
        if sh_flags(&s) & SHF_STRINGS != 0
            && let Ok(data) = s.data()
            && let Ok(at) = usize::try_from(offset)
            && let Some(rest) = data.get(at..)
        {
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            return Target::Str(rest[..end].to_vec());
        }
        self.symbol_at(section, offset)
            .unwrap_or_else(|| Target::Section(s.name().unwrap_or_default().to_string(), offset))
    }

    /// In a linked executable, the symbol covering `address` (or starting right at it), and
    /// the offset from its start.
    fn linked_symbol_at(&self, address: u64) -> Option<Target> {
        let after = self
            .linked
            .partition_point(|(start, _, _)| *start <= address);
        // The nearest starts only: an address no symbol covers would otherwise scan them all.
        self.linked[..after]
            .iter()
            .rev()
            .take(8)
            .find(|(start, size, _)| address < start + size || address == *start)
            .map(|(start, _, name)| {
                Target::Symbol(
                    name.clone(),
                    i64::try_from(address - start).unwrap_or(i64::MAX),
                )
            })
    }

    /// The symbol of `section` covering `offset` (or starting right at it), and the offset
    /// from its start.
    fn symbol_at(&self, section: SectionIndex, offset: i64) -> Option<Target> {
        let list = self.symbols.get(&section)?;
        let reach = self.reach.get(&section)?;
        let off = u64::try_from(offset).ok()?;
        // The last symbol (in start order) that covers `off`: among those starting at or
        // before it, walking back until no earlier one reaches past it.
        let after = list.partition_point(|(start, _, _)| *start <= off);
        (0..after)
            .rev()
            .take_while(|&i| reach[i] > off || list[i].0 == off)
            .map(|i| &list[i])
            .find(|(start, size, _)| off < start + size || off == *start)
            .map(|(start, _, name)| {
                Target::Symbol(name.clone(), offset - i64::try_from(*start).unwrap_or(0))
            })
    }
}

/// One instruction with every place-dependent operand replaced by what it names.
#[derive(Debug, PartialEq, Eq)]
struct Insn {
    code: iced_x86::Code,
    prefixes: (bool, bool, bool, bool),
    operands: Vec<Operand>,
}

#[derive(Debug, PartialEq, Eq)]
enum Operand {
    Register(Register),
    Immediate(u64),
    /// A branch target inside the function (an offset from its start) or outside it.
    Local(u64),
    Far(Option<Target>),
    Memory {
        base: Register,
        index: Register,
        scale: u32,
        displacement: u64,
        segment: Register,
    },
    /// RIP-relative: what it addresses.
    RipRelative(Option<Target>),
    Other(OpKind),
}

impl Units {
    /// A function's instructions, positions replaced by what they reach.
    fn instructions(&self, body: &Body) -> Vec<Insn> {
        // Decoded where the unit runs: in a linked executable its section's address, so a
        // branch's target is an address any section's symbol may hold.
        let base = self.addresses.get(&body.section).copied().unwrap_or(0);
        let first = base + body.start;
        let mut decoder = Decoder::with_ip(64, &body.bytes, first, DecoderOptions::NONE);
        let end = first + body.bytes.len() as u64;
        let place = |target: u64| -> Operand {
            if (first..end).contains(&target) {
                Operand::Local(target - first)
            } else if self.linked.is_empty() {
                Operand::Far(
                    i64::try_from(target)
                        .ok()
                        .and_then(|t| self.symbol_at(body.section, t)),
                )
            } else {
                Operand::Far(self.linked_symbol_at(target))
            }
        };
        let mut out = Vec::new();
        let mut insn = Instruction::default();
        while decoder.can_decode() {
            decoder.decode_out(&mut insn);
            let operands = (0..insn.op_count())
                .map(|i| match insn.op_kind(i) {
                    OpKind::Register => Operand::Register(insn.op_register(i)),
                    OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64 => {
                        place(insn.near_branch_target())
                    }
                    OpKind::Immediate8
                    | OpKind::Immediate8_2nd
                    | OpKind::Immediate16
                    | OpKind::Immediate32
                    | OpKind::Immediate64
                    | OpKind::Immediate8to16
                    | OpKind::Immediate8to32
                    | OpKind::Immediate8to64
                    | OpKind::Immediate32to64 => Operand::Immediate(insn.immediate(i)),
                    OpKind::Memory if insn.is_ip_rel_memory_operand() => {
                        match place(insn.ip_rel_memory_address()) {
                            Operand::Local(l) => Operand::Local(l),
                            Operand::Far(t) => Operand::RipRelative(t),
                            other => other,
                        }
                    }
                    OpKind::Memory => Operand::Memory {
                        base: insn.memory_base(),
                        index: insn.memory_index(),
                        scale: insn.memory_index_scale(),
                        displacement: insn.memory_displacement64(),
                        segment: insn.segment_prefix(),
                    },
                    other => Operand::Other(other),
                })
                .collect();
            out.push(Insn {
                code: insn.code(),
                prefixes: (
                    insn.has_lock_prefix(),
                    insn.has_rep_prefix(),
                    insn.has_repne_prefix(),
                    insn.has_xacquire_prefix() || insn.has_xrelease_prefix(),
                ),
                operands,
            });
        }
        out
    }
}

/// Whether two same-sized units hold the same code or data, and how many of their fields
/// differed only by a line shift; `None` when they differ.
fn same(a: &Units, x: &Body, b: &Units, y: &Body, lines: &LineShift<'_>) -> Option<u32> {
    if x.relocs.len() != y.relocs.len() {
        return None;
    }
    // Relocations in order: the same field, kind and target (a line-number field is never
    // relocated).
    if x.relocs.iter().zip(&y.relocs).any(|(r, s)| r != s) {
        return None;
    }
    if x.code && y.code {
        let (i, j) = (a.instructions(x), b.instructions(y));
        if i.len() != j.len() {
            return None;
        }
        let mut line_numbers = 0;
        for (p, q) in i.iter().zip(&j) {
            if p == q {
                continue;
            }
            if p.code != q.code || p.prefixes != q.prefixes || p.operands.len() != q.operands.len()
            {
                return None;
            }
            for (o, u) in p.operands.iter().zip(&q.operands) {
                match (o, u) {
                    (o, u) if o == u => {}
                    (Operand::Immediate(m), Operand::Immediate(n)) if lines.moves(*m, *n) => {
                        line_numbers += 1;
                    }
                    _ => return None,
                }
            }
        }
        return Some(line_numbers);
    }
    same_data(&x.bytes, &y.bytes, lines)
}

/// Whether two byte strings of one length are equal but for fields holding a line number the
/// patch moved: a 16-bit field (`bug_entry.line`) or the low 18 bits of a 32-bit word
/// (`_ddebug.lineno`), aligned.
fn same_data(x: &[u8], y: &[u8], lines: &LineShift<'_>) -> Option<u32> {
    if x == y {
        return Some(0);
    }
    let mut line_numbers = 0;
    let mut i = 0;
    while i < x.len() {
        if x[i] == y[i] {
            i += 1;
            continue;
        }
        let word = |s: &[u8], at: usize, w: usize| -> Option<u64> {
            let b = s.get(at..at + w)?;
            Some(b.iter().rev().fold(0u64, |v, &c| (v << 8) | u64::from(c)))
        };
        let at2 = i & !1;
        let at4 = i & !3;
        let (w2x, w2y) = (word(x, at2, 2), word(y, at2, 2));
        let (w4x, w4y) = (word(x, at4, 4), word(y, at4, 4));
        const LOW18: u64 = (1 << 18) - 1;
        if let (Some(m), Some(n)) = (w2x, w2y)
            && lines.moves(m, n)
        {
            line_numbers += 1;
            i = at2 + 2;
        } else if let (Some(m), Some(n)) = (w4x, w4y)
            && m & !LOW18 == n & !LOW18
            && lines.moves(m & LOW18, n & LOW18)
        {
            line_numbers += 1;
            i = at4 + 4;
        } else {
            return None;
        }
    }
    Some(line_numbers)
}

/// Compares two modules' object files (`.ko`, any compression): every function, data object
/// and section, `patches` giving the line shift that line-number fields may differ by.
pub fn compare(
    old: &Path,
    new: &Path,
    module: &str,
    patches: &[PatchFile],
) -> Result<ModuleDelta, ObjdiffError> {
    compare_with(old, new, module, &LineShift::of(patches))
}

/// [`compare`] with the line shift given.
pub fn compare_with(
    old: &Path,
    new: &Path,
    module: &str,
    lines: &LineShift<'_>,
) -> Result<ModuleDelta, ObjdiffError> {
    let read = |p: &Path| {
        super::ko::bytes(p).map_err(|e| {
            ObjdiffError::Read(
                p.to_path_buf(),
                match e {
                    super::ko::ReadError::Decompressor { tool, package } => {
                        format!("{tool} is not installed (apt-get install {package})")
                    }
                    super::ko::ReadError::Io(_, e) => e.to_string(),
                },
            )
        })
    };
    let (x, y) = (read(old)?, read(new)?);
    compare_bytes((old, &x), (new, &y), module, lines)
}

/// [`compare`] of two objects in memory.
pub fn compare_bytes(
    (old_path, old): (&Path, &[u8]),
    (new_path, new): (&Path, &[u8]),
    module: &str,
    lines: &LineShift<'_>,
) -> Result<ModuleDelta, ObjdiffError> {
    let a = Units::read(old_path, old)?;
    let b = Units::read(new_path, new)?;
    let mut keys: Vec<&(UnitKind, String)> = a.units.keys().chain(b.units.keys()).collect();
    keys.sort();
    keys.dedup();
    let units = keys
        .into_iter()
        .map(|key| {
            let size = |u: &Body| u.bytes.len() as u64;
            let delta = match (a.units.get(key), b.units.get(key)) {
                (Some(x), None) => Delta::Removed { bytes: size(x) },
                (None, Some(y)) => Delta::Added { bytes: size(y) },
                (Some(x), Some(y)) if size(x) < size(y) => Delta::Grown {
                    from: size(x),
                    to: size(y),
                },
                (Some(x), Some(y)) if size(x) > size(y) => Delta::Shrunk {
                    from: size(x),
                    to: size(y),
                },
                (Some(x), Some(y)) => match same(&a, x, &b, y, lines) {
                    Some(line_numbers) => Delta::Identical {
                        bytes: size(x),
                        line_numbers,
                    },
                    None => Delta::ChangedSameSize { bytes: size(x) },
                },
                (None, None) => Delta::Identical {
                    bytes: 0,
                    line_numbers: 0,
                },
            };
            let kind = a
                .units
                .get(key)
                .or(b.units.get(key))
                .map_or(key.0, |u| u.kind);
            UnitDelta {
                kind,
                name: key.1.clone(),
                delta,
            }
        })
        .collect();
    Ok(ModuleDelta {
        module: module.to_string(),
        units,
    })
}

mod builds;
pub use builds::{BuildsDelta, NotCompared, VMLINUX, compare_builds};

#[cfg(test)]
pub(crate) mod tests;
