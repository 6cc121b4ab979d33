//! Which functions a patch's lines compiled into, from the built module's DWARF (gimli): each
//! changed line's addresses in the line table, and at each address the innermost function
//! there — an out-of-line function, or one inlined into another (an inlined call site, named
//! with the function holding it). A line that compiled to no code (a comment, a blank line, a
//! declaration) reaches nothing.
//!
//! A module is a relocatable object: its DWARF's addresses and its references into
//! `.debug_str` and `.debug_line` are relocations, applied here. Each code section's addresses
//! are put in a range of their own (the section index in the high bits), since every section
//! of an object starts at 0.

use std::collections::{BTreeSet, HashMap};

use gimli::{AttributeValue, EndianSlice, Reader, RelocateReader, RunTimeEndian, SectionId};
use object::{Object, ObjectSection, ObjectSymbol, RelocationTarget};
use serde::Serialize;

/// Where a changed line's code is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct LineSite {
    /// The line (1-based) in the file as this build compiled it.
    pub line: u64,
    /// The innermost function whose code holds it.
    pub function: String,
    /// When that function was inlined there: the out-of-line function holding the call site.
    pub inlined_into: Option<String>,
}

/// Relocated values of one section, by offset.
#[derive(Debug, Default)]
struct Relocations(HashMap<u64, u64>);

impl gimli::read::Relocate for &'_ Relocations {
    fn relocate_address(&self, offset: usize, value: u64) -> gimli::Result<u64> {
        Ok(self.0.get(&(offset as u64)).copied().unwrap_or(value))
    }

    fn relocate_offset(&self, offset: usize, value: usize) -> gimli::Result<usize> {
        Ok(self
            .0
            .get(&(offset as u64))
            .and_then(|v| usize::try_from(*v).ok())
            .unwrap_or(value))
    }
}

type R<'a> = RelocateReader<EndianSlice<'a, RunTimeEndian>, &'a Relocations>;

/// Code sections' addresses start at `index << SECTION_SHIFT`, so two sections never overlap.
const SECTION_SHIFT: u32 = 40;

fn relocations_of(file: &object::File<'_>, section: &object::Section<'_, '_>) -> Relocations {
    let mut map = HashMap::new();
    for (offset, r) in section.relocations() {
        let base = match r.target() {
            RelocationTarget::Symbol(i) => match file.symbol_by_index(i) {
                Ok(sym) => {
                    let placed = sym.section_index().and_then(|s| {
                        let target = file.section_by_index(s).ok()?;
                        let debug = target.name().is_ok_and(|n| n.starts_with(".debug"));
                        Some(if debug {
                            0
                        } else {
                            (s.0 as u64) << SECTION_SHIFT
                        })
                    });
                    placed.unwrap_or(0) + sym.address()
                }
                Err(_) => 0,
            },
            RelocationTarget::Section(s) => (s.0 as u64) << SECTION_SHIFT,
            _ => 0,
        };
        map.insert(offset, base.wrapping_add_signed(r.addend()));
    }
    Relocations(map)
}

/// A function's code: its address ranges, name, and the out-of-line function around it when
/// it is an inlined instance.
struct Instance {
    ranges: Vec<(u64, u64)>,
    depth: isize,
    name: String,
    outer: Option<String>,
}

/// A DIE's name, following `DW_AT_abstract_origin` and `DW_AT_specification` in its unit.
fn name_of(
    dwarf: &gimli::Dwarf<R<'_>>,
    unit: &gimli::Unit<R<'_>>,
    entry: &gimli::DebuggingInformationEntry<R<'_>>,
    hops: u32,
) -> Option<String> {
    if let Some(v) = entry.attr_value(gimli::DW_AT_name) {
        let s = dwarf.attr_string(unit, v).ok()?;
        return Some(s.to_string_lossy().ok()?.into_owned());
    }
    if hops > 4 {
        return None;
    }
    for at in [gimli::DW_AT_abstract_origin, gimli::DW_AT_specification] {
        if let Some(AttributeValue::UnitRef(off)) = entry.attr_value(at) {
            let origin = unit.entry(off).ok()?;
            return name_of(dwarf, unit, &origin, hops + 1);
        }
    }
    None
}

/// Whether a line table's file (`../../../virt/kvm/kvm_main.c`) is the diff's `path`.
fn same_file(dwarf_path: &str, path: &str) -> bool {
    let clean: Vec<&str> = dwarf_path
        .split('/')
        .filter(|c| !c.is_empty() && *c != "." && *c != "..")
        .collect();
    let want: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    !want.is_empty() && clean.ends_with(&want)
}

/// The functions `lines` of source file `path` compiled into, per the DWARF of `bytes` (an
/// object or module); `Ok(None)` when it carries no debug information about `path`: none at
/// all, or none naming that file (Debian's kvm-amd.ko carries the DWARF of its assembly
/// alone, kvm.ko none, and kvm_main.c's lines must then go to the scanner, not read "none").
pub fn sites(
    bytes: &[u8],
    path: &str,
    lines: &BTreeSet<u64>,
) -> Result<Option<Vec<LineSite>>, String> {
    let file = object::File::parse(bytes).map_err(|e| e.to_string())?;
    if file.section_by_name(".debug_info").is_none() {
        return Ok(None);
    }
    let endian = if file.is_little_endian() {
        RunTimeEndian::Little
    } else {
        RunTimeEndian::Big
    };
    let mut data: HashMap<SectionId, (std::borrow::Cow<'_, [u8]>, Relocations)> = HashMap::new();
    for id in [
        SectionId::DebugAbbrev,
        SectionId::DebugAddr,
        SectionId::DebugInfo,
        SectionId::DebugLine,
        SectionId::DebugLineStr,
        SectionId::DebugRanges,
        SectionId::DebugRngLists,
        SectionId::DebugStr,
        SectionId::DebugStrOffsets,
    ] {
        if let Some(s) = file.section_by_name(id.name()) {
            let bytes = s.uncompressed_data().map_err(|e| e.to_string())?;
            data.insert(id, (bytes, relocations_of(&file, &s)));
        }
    }
    let empty = Relocations::default();
    let dwarf = gimli::Dwarf::load(|id| {
        Ok::<_, gimli::Error>(match data.get(&id) {
            Some((b, r)) => RelocateReader::new(EndianSlice::new(b, endian), r),
            None => RelocateReader::new(EndianSlice::new(&[], endian), &empty),
        })
    })
    .map_err(|e| e.to_string())?;
    let err = |e: gimli::Error| e.to_string();
    let mut out = BTreeSet::new();
    let mut names_path = false;
    let mut units = dwarf.units();
    while let Some(header) = units.next().map_err(err)? {
        let unit = dwarf.unit(header).map_err(err)?;
        // A line table's file entry as a path (its directory, then its name).
        let file_path = |header: &gimli::LineProgramHeader<_>,
                         entry: &gimli::FileEntry<_>|
         -> Result<String, String> {
            let mut name = String::new();
            if let Some(dir) = entry.directory(header)
                && let Ok(d) = dwarf.attr_string(&unit, dir)
            {
                name.push_str(&d.to_string_lossy().map_err(err)?);
                name.push('/');
            }
            let n = dwarf.attr_string(&unit, entry.path_name()).map_err(err)?;
            name.push_str(&n.to_string_lossy().map_err(err)?);
            Ok(name)
        };
        // The changed lines' code in this unit, as (line, address range).
        let mut spans: Vec<(u64, u64, u64)> = Vec::new();
        if let Some(program) = unit.line_program.clone() {
            for entry in program.header().file_names() {
                names_path |= same_file(&file_path(program.header(), entry)?, path);
            }
            let mut rows = program.rows();
            let mut open: Option<(u64, u64)> = None;
            while let Some((header, row)) = rows.next_row().map_err(err)? {
                if let Some((line, start)) = open.take()
                    && row.address() > start
                {
                    spans.push((line, start, row.address()));
                }
                if row.end_sequence() {
                    continue;
                }
                let Some(line) = row.line().map(u64::from) else {
                    continue;
                };
                if !lines.contains(&line) {
                    continue;
                }
                let Some(entry) = row.file(header) else {
                    continue;
                };
                if same_file(&file_path(header, entry)?, path) {
                    open = Some((line, row.address()));
                }
            }
        }
        if spans.is_empty() {
            continue;
        }
        // Every function instance of the unit with code, innermost last at each address.
        let mut instances = Vec::new();
        let mut outer: Vec<(isize, String)> = Vec::new();
        let mut cursor = unit.entries();
        while let Some(entry) = cursor.next_dfs().map_err(err)? {
            let depth = entry.depth();
            while outer.last().is_some_and(|(d, _)| *d >= depth) {
                outer.pop();
            }
            let tag = entry.tag();
            if tag != gimli::DW_TAG_subprogram && tag != gimli::DW_TAG_inlined_subroutine {
                continue;
            }
            let mut ranges = Vec::new();
            let mut it = dwarf.die_ranges(&unit, entry).map_err(err)?;
            while let Some(r) = it.next().map_err(err)? {
                ranges.push((r.begin, r.end));
            }
            let Some(name) = name_of(&dwarf, &unit, entry, 0) else {
                continue;
            };
            if ranges.is_empty() {
                continue;
            }
            let holder = outer.first().map(|(_, n)| n.clone());
            if tag == gimli::DW_TAG_subprogram {
                outer.push((depth, name.clone()));
            }
            instances.push(Instance {
                ranges,
                depth,
                name,
                outer: if tag == gimli::DW_TAG_inlined_subroutine {
                    holder
                } else {
                    None
                },
            });
        }
        for (line, start, end) in spans {
            let innermost = instances
                .iter()
                .filter(|i| i.ranges.iter().any(|&(b, e)| b < end && start < e))
                .max_by_key(|i| i.depth);
            if let Some(i) = innermost {
                out.insert(LineSite {
                    line,
                    function: i.name.clone(),
                    inlined_into: i.outer.clone(),
                });
            }
        }
    }
    Ok(names_path.then(|| out.into_iter().collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::objdiff::tests::compiled;

    // `twice` calls out, so its line keeps code of its own at -O2: without the call, gcc 12
    // folds it into `outer`'s one instruction, attributed to `outer`'s line, and the inlined
    // instance's range is empty.
    const SOURCE: &str = r#"extern int sink, note(int);
static inline __attribute__((always_inline)) int twice(int x)
{
	/* a comment */
	return note(x) * 2 + sink;
}

int outer(int x)
{
	int y = twice(x);
	return y + 1;
}

int other(int x)
{
	return x - sink;
}
"#;

    /// A line of an inlined function is found in the function it was inlined into, a line
    /// of an out-of-line one in itself, a comment in nothing; without debug information there
    /// is no answer (the scanner's turn).
    #[test]
    fn lines_map_to_functions_and_inlined_sites() {
        let dir = tempfile::tempdir().expect("tempdir");
        let o = compiled(dir.path(), "m", SOURCE, &["-g"]);
        let lines: BTreeSet<u64> = [4, 5, 11, 16].into_iter().collect();
        let found = sites(&o, "m.c", &lines).expect("reads").expect("has DWARF");
        let at = |l: u64| -> Vec<(&str, Option<&str>)> {
            found
                .iter()
                .filter(|s| s.line == l)
                .map(|s| (s.function.as_str(), s.inlined_into.as_deref()))
                .collect()
        };
        assert_eq!(at(5), [("twice", Some("outer"))], "{found:?}");
        assert_eq!(at(11), [("outer", None)], "{found:?}");
        assert_eq!(at(16), [("other", None)], "{found:?}");
        assert!(at(4).is_empty(), "{found:?}");
        let bare = compiled(dir.path(), "n", SOURCE, &["-g0"]);
        assert_eq!(sites(&bare, "m.c", &lines), Ok(None));
        // Debug information about other files only (kvm-amd.ko's, asked for kvm_main.c's
        // lines) is no answer either: the scanner's turn, not "compiled to no code".
        assert_eq!(sites(&o, "virt/kvm/kvm_main.c", &lines), Ok(None));
    }

    /// A patch's reach comes from the build's DWARF when it has some (the inlined function
    /// with the function it was inlined into), else from the C scanner, which says so.
    #[test]
    fn a_patch_reaches_from_dwarf_or_from_the_scanner_without_it() {
        use crate::kernel::objdiff::tests::diff_of;
        use crate::kernel::reach::{ReachSource, reach_exact_or_scanned};
        let dir = tempfile::tempdir().expect("tempdir");
        let new = SOURCE.replace("return note(x) * 2 + sink;", "return note(x) * 3 + sink;");
        let patch = diff_of(dir.path(), SOURCE, &new);
        let g = compiled(dir.path(), "m", SOURCE, &["-g"]);
        let patches = [patch];
        let (r, source) = reach_exact_or_scanned(&patches, &[("kvm".into(), g)], dir.path());
        assert!(matches!(source, ReachSource::Dwarf { .. }), "{source:?}");
        let names: Vec<(&str, &[String])> = r
            .functions
            .iter()
            .map(|f| (f.name.as_str(), f.callers.as_slice()))
            .collect();
        assert_eq!(names, [("twice", &["outer".to_string()][..])], "{r:?}");
        let bare = compiled(dir.path(), "m", SOURCE, &["-g0"]);
        let (r, source) = reach_exact_or_scanned(&patches, &[("kvm".into(), bare)], dir.path());
        assert_eq!(source, ReachSource::ScannerNoDebugInfo);
        assert!(r.functions.iter().any(|f| f.name == "twice"), "{r:?}");
    }

    #[test]
    fn file_names_match_by_their_trailing_components() {
        assert!(same_file(
            "../../../virt/kvm/kvm_main.c",
            "virt/kvm/kvm_main.c"
        ));
        assert!(same_file(
            "/src/linux/./virt/kvm/kvm_main.c",
            "virt/kvm/kvm_main.c"
        ));
        assert!(!same_file("../virt/kvm/xkvm_main.c", "virt/kvm/kvm_main.c"));
    }
}
