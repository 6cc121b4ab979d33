//! Which kernel functions a patch changes, so a kab can count whether they ran at all (NOT
//! EXERCISED when they never did): each hunk's `@@ … @@ context` function, and the function
//! enclosing each line it changes in the unpatched source, found by a small C scanner
//! ([`functions_of`]). For each function, its callers in the same file: where to count when the
//! compiler inlined it everywhere and left no symbol to probe.
//!
//! The scanner is not a C parser. It drops comments, strings, character literals and
//! preprocessor lines, and takes a top-level `{` that follows `name(…)` (with no `;` or `=`
//! since the declaration began) as the body of the function `name`, spanning from its
//! declaration's first line to its closing brace. It skips: braces that `#if` branches leave
//! unbalanced (both branches are scanned), functions whose name a macro pastes together (a
//! `SYSCALL_DEFINE3(name, …) {` is named by its macro, which has no symbol), and functions
//! declared through typedef'd function types or returning function pointers.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Serialize;

use super::patch::{FileDiff, PatchFile};

/// A function definition the scanner found in a C file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CFunction {
    /// Its name.
    pub name: String,
    /// The first line of its declaration (1-based): the return type's line.
    pub first_line: usize,
    /// The line of its closing brace.
    pub last_line: usize,
}

impl CFunction {
    /// Whether the old-file change `[from, to)` ([`super::patch::Hunk::changes`]) falls in
    /// it: a removed line inside it, or an insertion between two of its lines.
    fn holds(&self, (from, to): (usize, usize)) -> bool {
        if from == to {
            self.first_line < from && from <= self.last_line
        } else {
            from <= self.last_line && self.first_line < to
        }
    }
}

/// A function a patch changes, and where to count it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PatchedFunction {
    /// The file it is in (`arch/x86/kvm/mmu/mmu.c`).
    pub file: String,
    /// Its name.
    pub name: String,
    /// The module it is built into (`kvm`, `kvm_amd`, `kvm_intel`), `None` for built-in code.
    pub module: Option<String>,
    /// The functions of the same file that call it, in file order: counted instead when it
    /// has no symbol of its own.
    pub callers: Vec<String>,
}

impl PatchedFunction {
    /// The guest's `--count-calls` form: `[MODULE:]NAME[/CALLER…]`.
    pub fn spec(&self) -> String {
        let mut s = match &self.module {
            Some(m) => format!("{m}:{}", self.name),
            None => self.name.clone(),
        };
        for c in &self.callers {
            s.push('/');
            s.push_str(c);
        }
        s
    }
}

/// What a patch reaches: its functions, and what of it the scanner could not place.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Reach {
    /// The functions it changes, in patch order, each once.
    pub functions: Vec<PatchedFunction>,
    /// What was left out and why (`Documentation/x.rst: not C source`).
    pub skipped: Vec<String>,
}

/// The function a hunk header's context names (`@@ -1,2 +1,3 @@ static void f(int x)` → `f`):
/// the last identifier before its first `(`.
pub fn context_function(header: &str) -> Option<String> {
    let rest = header.strip_prefix("@@ ")?;
    let (_, context) = rest.split_once(" @@")?;
    let before = &context[..context.find('(')?];
    let name = before
        .trim_end()
        .rsplit(|c: char| !is_ident(c))
        .next()
        .filter(|n| n.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))?;
    Some(name.to_string())
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Attribute macros that take arguments and may stand between a function's parameters and
/// its body (`void f(void) __acquires(lock) {`): never the function's name.
const ATTRIBUTES: &[&str] = &[
    "__attribute__",
    "__acquires",
    "__releases",
    "__must_hold",
    "__cond_acquires",
    "__cond_releases",
    "__printf",
    "__scanf",
    "__section",
    "__aligned",
    "__alloc_size",
    "__diagnose_as",
    "__no_sanitize_or_inline",
    "__counted_by",
    "__malloc",
    "__weak",
];

/// `source` with comments, string and character literals and preprocessor lines blanked
/// (newlines kept, so line numbers stay).
fn code_only(source: &str) -> Vec<u8> {
    let b = source.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let mut line_start = true;
    while i < b.len() {
        let c = b[i];
        if line_start && c == b'#' {
            // A preprocessor line, with its backslash continuations.
            while i < b.len() && !(b[i] == b'\n' && (i == 0 || b[i - 1] != b'\\')) {
                out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                i += 1;
            }
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let end = source[i + 2..]
                .find("*/")
                .map_or(b.len(), |e| i + 2 + e + 2);
            out.extend(
                b[i..end]
                    .iter()
                    .map(|&x| if x == b'\n' { b'\n' } else { b' ' }),
            );
            i = end;
            continue;
        }
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
            continue;
        }
        if c == b'"' || c == b'\'' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != c && b[i] != b'\n' {
                if b[i] == b'\\' {
                    out.push(b' ');
                    i += 1;
                }
                out.push(b' ');
                i += 1;
            }
            out.push(b' ');
            i += 1;
            continue;
        }
        if c == b'\n' {
            line_start = true;
        } else if !c.is_ascii_whitespace() {
            line_start = false;
        }
        out.push(c);
        i += 1;
    }
    out.truncate(b.len());
    out
}

/// Every function definition in a C `source`, in order (see the module's doc for what it
/// skips).
pub fn functions_of(source: &str) -> Vec<CFunction> {
    let code = code_only(source);
    let mut found = Vec::new();
    let mut line = 1;
    let mut depth = 0usize;
    let mut parens = 0usize;
    // The declaration being read at depth 0: its first line, and the last `name(` in it.
    let mut decl_start: Option<usize> = None;
    let mut candidate: Option<String> = None;
    let mut open: Option<(String, usize)> = None;
    let mut i = 0;
    while i < code.len() {
        let c = code[i];
        if c == b'\n' {
            line += 1;
            i += 1;
            continue;
        }
        if depth > 0 {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        if let Some((name, first_line)) = open.take() {
                            found.push(CFunction {
                                name,
                                first_line,
                                last_line: line,
                            });
                        }
                        decl_start = None;
                        candidate = None;
                    }
                }
                _ => {}
            }
            i += 1;
            continue;
        }
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        decl_start.get_or_insert(line);
        if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < code.len() && is_ident(char::from(code[i])) {
                i += 1;
            }
            let ident = String::from_utf8_lossy(&code[start..i]).into_owned();
            let mut j = i;
            while j < code.len() && code[j].is_ascii_whitespace() {
                j += 1;
            }
            if parens == 0 && code.get(j) == Some(&b'(') && !ATTRIBUTES.contains(&ident.as_str()) {
                candidate = Some(ident);
            }
            continue;
        }
        match c {
            b'(' => parens += 1,
            b')' => parens = parens.saturating_sub(1),
            b';' | b'=' if parens == 0 => {
                decl_start = None;
                candidate = None;
            }
            b'{' if parens == 0 => {
                depth = 1;
                open = candidate.take().zip(decl_start);
            }
            b'}' => {
                // An unbalanced close at the top level (an `#if` branch): start afresh.
                decl_start = None;
                candidate = None;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// The functions of `functions` (found in `source`) whose bodies call `name`, in file order.
fn callers_of(source: &str, functions: &[CFunction], name: &str) -> Vec<String> {
    let code = code_only(source);
    let text = String::from_utf8_lossy(&code);
    let lines: Vec<&str> = text.split('\n').collect();
    functions
        .iter()
        .filter(|f| f.name != name)
        .filter(|f| {
            let body = lines
                .get(f.first_line.saturating_sub(1)..f.last_line.min(lines.len()))
                .unwrap_or_default()
                .join("\n");
            calls(&body, name)
        })
        .map(|f| f.name.clone())
        .collect()
}

/// Whether `code` has `name` as a whole identifier followed by `(` (a call, or the
/// function's own declaration, which callers never hold).
fn calls(code: &str, name: &str) -> bool {
    let mut from = 0;
    while let Some(at) = code[from..].find(name) {
        let start = from + at;
        let end = start + name.len();
        let before = code[..start].chars().next_back().is_some_and(is_ident);
        let after = code[end..].trim_start();
        if !before && after.starts_with('(') {
            return true;
        }
        from = end;
    }
    false
}

/// The module a source file of the tree is built into, `None` for built-in code. Only KVM's
/// modules are known; a kab loads no other.
pub fn module_of(file: &str) -> Option<String> {
    let module = if file.starts_with("arch/x86/kvm/svm/") {
        "kvm_amd"
    } else if file.starts_with("arch/x86/kvm/vmx/") {
        "kvm_intel"
    } else if file.starts_with("arch/x86/kvm/") || file.starts_with("virt/kvm/") {
        "kvm"
    } else {
        return None;
    };
    Some(module.to_string())
}

/// The functions one file's diff changes, read against that file's unpatched `source`.
pub fn functions_changed(diff: &FileDiff, source: &str) -> Vec<String> {
    let functions = functions_of(source);
    let mut names: Vec<String> = Vec::new();
    let mut add = |n: &str| {
        if !names.iter().any(|x| x == n) {
            names.push(n.to_string());
        }
    };
    for hunk in &diff.hunks {
        let enclosing: Vec<&CFunction> = hunk
            .changes
            .iter()
            .flat_map(|&change| functions.iter().filter(move |f| f.holds(change)))
            .collect();
        // The context names where the hunk starts; a hunk whose changes all lie outside any
        // function (a `#define`, a struct) is not that function's change.
        if let Some(context) = context_function(&hunk.header)
            && enclosing.iter().any(|f| f.name == context)
        {
            add(&context);
        }
        for f in enclosing {
            add(&f.name);
        }
    }
    names
}

/// The functions `patch` changes, read against the unpatched `tree`.
pub fn reach(patch: &PatchFile, tree: &Path) -> Reach {
    let mut out = Reach::default();
    for diff in patch.patches.iter().flat_map(|p| &p.files) {
        let Some(file) = diff.old.as_deref() else {
            out.skipped.push(format!(
                "{}: a new file, absent from the base",
                diff.target()
            ));
            continue;
        };
        if !(file.ends_with(".c") || file.ends_with(".h")) {
            out.skipped.push(format!("{file}: not C source"));
            continue;
        }
        let source = match std::fs::read(tree.join(file)) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(e) => {
                out.skipped
                    .push(format!("{file}: cannot be read in the source tree ({e})"));
                continue;
            }
        };
        let names = functions_changed(diff, &source);
        if names.is_empty() {
            out.skipped.push(format!(
                "{file}: its hunks change no function body (definitions, declarations or macros)"
            ));
        }
        let functions = functions_of(&source);
        for name in names {
            if out
                .functions
                .iter()
                .any(|f| f.file == file && f.name == name)
            {
                continue;
            }
            out.functions.push(PatchedFunction {
                file: file.to_string(),
                callers: callers_of(&source, &functions, &name),
                module: module_of(file),
                name,
            });
        }
    }
    out
}

/// The functions every patch of `patches` changes, each once, read against `tree`.
pub fn reach_all<'a>(patches: impl IntoIterator<Item = &'a PatchFile>, tree: &Path) -> Reach {
    let mut out = Reach::default();
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    for p in patches {
        let r = reach(p, tree);
        for f in r.functions {
            if seen.insert((f.file.clone(), f.name.clone())) {
                out.functions.push(f);
            }
        }
        out.skipped.extend(r.skipped);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: &str = r#"// SPDX
#include <linux/kvm.h>
#define PTE_PREFETCH_NUM 8 /* { */

static struct kvm_x86_ops ops = {
	.f = f,
};

static const char *s = "a { brace";

static inline int
knr_style(struct kvm *kvm,
	  int x)
{
	if (x) {
		return 1;
	}
	return helper(x);
}

void locked(void) __acquires(lock)
{
	knr_style(NULL, 0);
}

DEFINE_STATIC_KEY_FALSE(key);

static int helper(int x)
{
	char c = '{';
	return knr_style(NULL, x) + c;
}
"#;

    /// Functions are found across multi-line signatures, after attribute macros, and not in
    /// initialisers, strings, character literals or comments.
    #[test]
    fn the_scanner_finds_each_function_and_its_span() {
        let found = functions_of(C);
        let spans: Vec<(&str, usize, usize)> = found
            .iter()
            .map(|f| (f.name.as_str(), f.first_line, f.last_line))
            .collect();
        assert_eq!(
            spans,
            vec![
                ("knr_style", 11, 19),
                ("locked", 21, 24),
                ("helper", 28, 32)
            ]
        );
        assert_eq!(
            callers_of(C, &found, "knr_style"),
            vec!["locked".to_string(), "helper".to_string()]
        );
        assert_eq!(callers_of(C, &found, "locked"), Vec::<String>::new());
    }

    #[test]
    fn a_hunk_context_names_its_function() {
        assert_eq!(
            context_function(
                "@@ -2818,11 +2818,13 @@ static void __direct_pte_prefetch(struct kvm_vcpu *vcpu,"
            )
            .as_deref(),
            Some("__direct_pte_prefetch")
        );
        assert_eq!(context_function("@@ -1,2 +1,3 @@ struct kvm {"), None);
        assert_eq!(context_function("@@ -1,2 +1,3 @@"), None);
    }

    const MANIFEST: &str = env!("CARGO_MANIFEST_DIR");

    fn patch(name: &str) -> PatchFile {
        PatchFile::read(&Path::new(MANIFEST).join("tests/patches").join(name)).expect("parses")
    }

    /// A fixture excerpt of real source (its first line a comment saying where it starts),
    /// placed at its own line numbers, so a real patch's hunks land where they do in the tree.
    fn at_its_lines(fixture: &str, first: usize) -> String {
        let text = std::fs::read_to_string(
            Path::new(MANIFEST)
                .join("tests/fixtures/reach")
                .join(fixture),
        )
        .expect("fixture");
        "\n".repeat(first - 2) + &text
    }

    /// The functions a real patch changes, read against one excerpt at its real lines.
    fn changed(patch_name: &str, fixture: &str, first: usize) -> Vec<String> {
        let p = patch(patch_name);
        let source = at_its_lines(fixture, first);
        p.patches
            .iter()
            .flat_map(|m| &m.files)
            .flat_map(|d| functions_changed(d, &source))
            .collect()
    }

    /// The three real patches of tests/patches (no `@@` context: the scanner alone places
    /// them) and the revert of 004's trailing prefetch (`diff -p` context).
    #[test]
    fn real_patches_name_the_functions_they_change() {
        for p in ["001-lifecycle-keyed.patch", "001-sync-on-register.patch"] {
            assert_eq!(
                changed(p, "kvm_main-6008.c", 6008),
                vec!["kvm_io_bus_register_dev".to_string()],
                "{p}"
            );
        }
        assert_eq!(
            changed("srcu-call-expedited.patch", "srcutree-1414.c", 1414),
            vec!["call_srcu".to_string()]
        );
        assert_eq!(
            changed("004-revert-trailing-prefetch.patch", "mmu-3177.c", 3177),
            vec!["__direct_pte_prefetch".to_string()]
        );
    }

    /// `__direct_pte_prefetch` is static and may be inlined: its caller in mmu.c is where to
    /// count it then; `kvm.ko` holds it.
    #[test]
    fn the_revert_reaches_its_function_and_its_caller_in_kvm() {
        let source = at_its_lines("mmu-3177.c", 3177);
        let functions = functions_of(&source);
        assert_eq!(
            functions
                .iter()
                .map(|f| f.name.as_str())
                .collect::<Vec<_>>(),
            vec![
                "kvm_mmu_prefetch_sptes",
                "direct_pte_prefetch_many",
                "__direct_pte_prefetch",
                "direct_pte_prefetch"
            ]
        );
        assert_eq!(
            callers_of(&source, &functions, "__direct_pte_prefetch"),
            vec!["direct_pte_prefetch".to_string()]
        );
        let f = PatchedFunction {
            file: "arch/x86/kvm/mmu/mmu.c".into(),
            name: "__direct_pte_prefetch".into(),
            module: module_of("arch/x86/kvm/mmu/mmu.c"),
            callers: vec!["direct_pte_prefetch".into()],
        };
        assert_eq!(f.spec(), "kvm:__direct_pte_prefetch/direct_pte_prefetch");
        assert_eq!(
            module_of("arch/x86/kvm/svm/svm.c").as_deref(),
            Some("kvm_amd")
        );
        assert_eq!(module_of("kernel/rcu/srcutree.c"), None);
    }

    /// A documentation patch and a file the tree lacks are said, not guessed at.
    #[test]
    fn what_cannot_be_placed_is_said() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = reach(&patch("doc-only.patch"), dir.path());
        assert!(r.functions.is_empty());
        assert_eq!(r.skipped.len(), 1, "{:?}", r.skipped);
        let r = reach(&patch("001-sync-on-register.patch"), dir.path());
        assert!(r.skipped[0].contains("cannot be read"), "{:?}", r.skipped);
    }

    /// The whole files of linux-source-7.3, as `hvlab kab` unpacks them: the scanner keeps its
    /// brace count through thousands of lines of real kernel C.
    #[test]
    #[ignore = "reads linux-source-7.3 unpacked in the hvlab cache (HVLAB_LINUX_SOURCE, or ~/.cache/hvlab/kbuild/7.3.4+deb13-amd64_7.3.4-1~bpo13+1/modules)"]
    fn real_patches_against_the_whole_7_3_tree() {
        let tree = std::env::var_os("HVLAB_LINUX_SOURCE").map_or_else(
            || crate::kernel::cache_dir().join("kbuild/7.3.4+deb13-amd64_7.3.4-1~bpo13+1/modules"),
            std::path::PathBuf::from,
        );
        let names = |p: &str| -> Vec<(String, Vec<String>)> {
            let r = reach(&patch(p), &tree);
            assert!(r.skipped.is_empty(), "{p}: {:?}", r.skipped);
            r.functions
                .into_iter()
                .map(|f| (f.name, f.callers))
                .collect()
        };
        assert_eq!(
            names("001-lifecycle-keyed.patch"),
            vec![("kvm_io_bus_register_dev".to_string(), vec![])]
        );
        assert_eq!(
            names("srcu-call-expedited.patch"),
            vec![("call_srcu".to_string(), vec![])]
        );
        assert_eq!(
            names("004-revert-trailing-prefetch.patch"),
            vec![(
                "__direct_pte_prefetch".to_string(),
                vec!["direct_pte_prefetch".to_string()]
            )]
        );
    }
}
