//! The import graph of every crate's `src/`: which module names which through
//! `crate::…` and `super::…` paths. The crate graph keeps crates from naming one above them;
//! inside a crate nothing does, so this test refuses an import cycle between the files of a
//! crate and between its top-level modules. Test modules are left out (a test may reach
//! anywhere), and so is a module naming its own ancestors (`super::` up to its parent, which
//! declares it).
//!
//! Run with `--nocapture` to see each crate's top-level edges.

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside one crate: `["lab", "sweep"]`; the crate root is empty.
type ModPath = Vec<String>;

/// Every `.rs` file under `dir`, but a test module in a file of its own (`tests.rs` that its
/// `mod.rs` declares under `#[cfg(test)]`): tests may read the renderers of a higher layer, as
/// an inline test module may.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let declared_test_module = std::fs::read_to_string(dir.join("mod.rs"))
        .is_ok_and(|text| text.contains("#[cfg(test)]\nmod tests;"));
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if declared_test_module && path.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module a file defines: `lab/sweep.rs` and `lab/sweep/mod.rs` are `lab::sweep`.
fn module_of(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: ModPath = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts
        .last()
        .is_some_and(|l| l == "mod" || l == "lib" || l == "main")
    {
        parts.pop();
    }
    parts
}

/// The text that counts: without the test modules (from the first `#[cfg(test)]` before a
/// `mod`) and without line comments (doc comments name paths in prose).
fn code_of(text: &str) -> String {
    let end = text.find("#[cfg(test)]\nmod ").unwrap_or(text.len());
    text[..end]
        .lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths a `use` tree or an inline path names from `rest` (the text after `crate::` or
/// `super::`): `a::b::c`, or `a::{b, c::{d, e}}` expanded into one path per leaf.
fn paths_from(rest: &str) -> Vec<ModPath> {
    let mut prefix: ModPath = Vec::new();
    let mut i = 0;
    let bytes: Vec<char> = rest.chars().collect();
    loop {
        let start = i;
        while i < bytes.len() && is_ident(bytes[i]) {
            i += 1;
        }
        if i > start {
            prefix.push(bytes[start..i].iter().collect());
        }
        let rest_here: String = bytes[i..].iter().take(3).collect();
        // A group, right after `crate::` or after a segment: split its top level on commas,
        // recurse into each part.
        let group = if i == 0 && rest_here.starts_with('{') {
            Some(0)
        } else if rest_here.starts_with("::{") {
            Some(i + 2)
        } else {
            None
        };
        if let Some(open) = group {
            let mut depth = 0;
            let mut close = open;
            for (k, c) in bytes.iter().enumerate().skip(open) {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            close = k;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let inner: String = bytes[open + 1..close].iter().collect();
            let mut parts = Vec::new();
            let (mut depth, mut from) = (0, 0);
            for (k, c) in inner.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        parts.push(inner[from..k].to_string());
                        from = k + 1;
                    }
                    _ => {}
                }
            }
            parts.push(inner[from..].to_string());
            return parts
                .iter()
                .map(|p| p.trim())
                .filter(|p| !p.is_empty() && *p != "self")
                .flat_map(|p| {
                    paths_from(p).into_iter().map(|tail| {
                        let mut full = prefix.clone();
                        full.extend(tail);
                        full
                    })
                })
                .collect();
        }
        if rest_here.starts_with("::") && bytes.get(i + 2).is_some_and(|c| is_ident(*c)) {
            i += 2;
            continue;
        }
        return vec![prefix];
    }
}

/// The import graph of the crate whose sources are in `src`: file module → the file modules
/// it names (its ancestors left out).
fn graph(src: &Path) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeMap<ModPath, PathBuf> = files
        .iter()
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    // The longest prefix of `path` that is a file module.
    let resolve = |path: &[String]| -> Option<ModPath> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| modules.contains_key(p))
    };
    let mut edges = BTreeMap::new();
    for (me, file) in &modules {
        let code = code_of(&std::fs::read_to_string(file).unwrap());
        // `super` of module `a::b` (`a/b.rs` or `a/b/mod.rs`) is `a`.
        let parent = me[..me.len().saturating_sub(1)].to_vec();
        let mut out = BTreeSet::new();
        for (word, base) in [("crate::", Vec::new()), ("super::", parent)] {
            let mut from = 0;
            while let Some(at) = code[from..].find(word) {
                let start = from + at;
                from = start + word.len();
                // A whole word: not `hvlab_crate::` or `self::super::`.
                if code[..start].chars().last().is_some_and(is_ident) {
                    continue;
                }
                for tail in paths_from(&code[from..]) {
                    let mut full = base.clone();
                    full.extend(tail);
                    if let Some(target) = resolve(&full) {
                        let ancestor = me.len() >= target.len() && me[..target.len()] == target[..];
                        if !ancestor {
                            out.insert(target);
                        }
                    }
                }
            }
        }
        edges.insert(me.clone(), out);
    }
    edges
}

/// The cycles of a graph: its strongly connected components of more than one node.
fn cycles<N: Ord + Clone>(edges: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    // Kosaraju: finish order on the graph, then components on the reversed graph.
    fn visit<N: Ord + Clone>(
        n: &N,
        edges: &BTreeMap<N, BTreeSet<N>>,
        seen: &mut BTreeSet<N>,
        order: &mut Vec<N>,
    ) {
        if !seen.insert(n.clone()) {
            return;
        }
        for m in edges.get(n).into_iter().flatten() {
            visit(m, edges, seen, order);
        }
        order.push(n.clone());
    }
    let mut nodes: BTreeSet<N> = edges.keys().cloned().collect();
    nodes.extend(edges.values().flatten().cloned());
    let (mut seen, mut order) = (BTreeSet::new(), Vec::new());
    for n in &nodes {
        visit(n, edges, &mut seen, &mut order);
    }
    let mut reversed: BTreeMap<N, BTreeSet<N>> = BTreeMap::new();
    for (from, tos) in edges {
        for to in tos {
            reversed.entry(to.clone()).or_default().insert(from.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for n in order.iter().rev() {
        let mut component = Vec::new();
        visit(n, &reversed, &mut assigned, &mut component);
        if component.len() > 1 {
            out.push(component);
        }
    }
    out
}

/// Every crate of the workspace with files to cycle between: the root package and `crates/*`
/// (the benchmarks in `benchmarks/` stand above the application and may name any of it).
fn crate_sources() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = vec![root.join("src")];
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let src = entry.unwrap().path().join("src");
        if src.is_dir() && std::fs::read_dir(&src).unwrap().count() > 1 {
            out.push(src);
        }
    }
    out
}

fn show(m: &ModPath) -> String {
    if m.is_empty() {
        "<crate root>".into()
    } else {
        m.join("/")
    }
}

#[test]
fn no_crate_has_an_import_cycle_between_files_or_top_level_modules() {
    let mut found = Vec::new();
    for src in crate_sources() {
        let edges = graph(&src);
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let modules: BTreeSet<ModPath> = files.iter().map(|f| module_of(&src, f)).collect();
        assert_eq!(
            edges.len(),
            modules.len(),
            "{}: every module is read (main.rs and lib.rs are both the root)",
            src.display()
        );
        for c in cycles(&edges) {
            found.push(format!(
                "{}: files {}",
                src.display(),
                c.iter().map(show).collect::<Vec<_>>().join(" ↔ ")
            ));
        }
        let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, tos) in &edges {
            for to in tos {
                if let (Some(a), Some(b)) = (from.first(), to.first())
                    && a != b
                {
                    top.entry(a.clone()).or_default().insert(b.clone());
                }
            }
        }
        println!("{}:", src.display());
        for (from, tos) in &top {
            println!(
                "  {from} -> {}",
                tos.iter().cloned().collect::<Vec<_>>().join(", ")
            );
        }
        for c in cycles(&top) {
            found.push(format!("{}: modules {}", src.display(), c.join(" ↔ ")));
        }
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

/// The application's top-level modules, from the top layer down: the command line, the
/// exporters, the product's logic, tracing, kernels under test, the scenarios, the error and
/// the system calls.
const LAYERS: [&str; 8] = [
    "cli", "export", "lab", "trace", "kernel", "scenario", "error", "sys",
];

/// No import runs back up the application's layers [`LAYERS`]: no module names one above it.
/// Each layer has its own error (the lab's wraps the kernels' and the scenarios'; the command
/// line's wraps the lab's and the tracer's), so the low `error` names nothing above it. Each
/// arrow found is printed.
#[test]
fn no_arrow_runs_back_up_the_application_s_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layer = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut up = BTreeSet::new();
    for (from, tos) in graph(&src) {
        for to in tos {
            if let (Some(a), Some(b)) = (from.first(), to.first()) {
                let (la, lb) = (layer(a), layer(b));
                assert!(
                    a == b || (la.is_some() && lb.is_some()),
                    "{a} -> {b}: a top-level module not in LAYERS"
                );
                if lb < la {
                    up.insert(format!("{} -> {}", show(&from), show(&to)));
                }
            }
        }
    }
    println!("arrows back up ({}):", up.len());
    for arrow in &up {
        println!("  {arrow}");
    }
    assert!(
        up.is_empty(),
        "{} arrows run back up the layers: {up:?}",
        up.len()
    );
}

/// The reader itself: a cycle planted in a scratch crate is found, through a grouped `use`,
/// an inline path and `super::`.
#[test]
fn the_graph_reader_finds_a_planted_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("lab")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod lab;\npub mod report;\n").unwrap();
    std::fs::write(src.join("lab/mod.rs"), "pub mod sweep;\npub mod suite;\n").unwrap();
    std::fs::write(
        src.join("lab/sweep.rs"),
        "use crate::{error::Error, report::words::{self, sweep_words}};\n",
    )
    .unwrap();
    std::fs::write(
        src.join("lab/suite.rs"),
        "fn f() { super::sweep::run(); }\n",
    )
    .unwrap();
    std::fs::write(
        src.join("report.rs"),
        "// crate::lab is named only in this comment\npub fn w() { crate::lab::suite::x(); }\n#[cfg(test)]\nmod tests { use crate::lab::sweep; }\n",
    )
    .unwrap();
    let edges = graph(src);
    let key = |s: &str| -> ModPath { s.split('/').map(String::from).collect() };
    assert_eq!(edges[&key("lab/sweep")], BTreeSet::from([key("report")]));
    assert_eq!(edges[&key("lab/suite")], BTreeSet::from([key("lab/sweep")]));
    assert_eq!(edges[&key("report")], BTreeSet::from([key("lab/suite")]));
    let found = cycles(&edges);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].len(), 3, "{found:?}");
}

/// The core is the types every crate shares and the backend seam: no command line (clap), no
/// system calls (libc), no formatting of durations (humantime); the host probe and the noise
/// meter are hvlab-host's.
#[test]
fn the_core_crate_names_no_command_line_or_system_crate() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/hvlab-core/Cargo.toml");
    let text = std::fs::read_to_string(manifest).unwrap();
    let deps: Vec<&str> = text
        .split("\n[dependencies]\n")
        .nth(1)
        .unwrap()
        .lines()
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.split(['.', ' ', '=']).next())
        .filter(|name| !name.is_empty() && !name.starts_with('#'))
        .collect();
    assert!(deps.contains(&"serde"), "the [dependencies] read: {deps:?}");
    for refused in ["clap", "libc", "humantime", "rustix"] {
        assert!(!deps.contains(&refused), "hvlab-core depends on {refused}");
    }
}
