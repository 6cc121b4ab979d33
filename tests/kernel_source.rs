//! A kernel source is an enum every layer matches with no catch-all arm: a new kind of source
//! does not compile until each layer handles it. Proven here by building the library with the
//! `kernel-source-probe` feature, whose `KernelSource::Probe` no match handles: the build must
//! fail with E0004 (non-exhaustive patterns) at exactly the matches on a kernel source that a
//! reading of the code finds, and nowhere else. A wildcard arm (`_ =>`) in any of them is
//! refused by the same reading.
//!
//! The build is `cargo check --release` of the library into the test's own target directory
//! (`target/kernel-source-probe`, kept between runs: after the first, only hvlab is checked
//! again).

#![allow(clippy::unwrap_used)] // test code: a panic is the failure report

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Every production `.rs` file under `dir`: test modules in files of their own left out.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_none_or(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// A file's code without its test module (from a `#[cfg(test)]` before a `mod`) and without
/// comments, each line kept where it was (so line numbers hold).
fn production_lines(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.trim() == "#[cfg(test)]"
            && lines
                .get(i + 1)
                .is_some_and(|n| n.trim_start().starts_with("mod ") || n.contains(" mod "))
        {
            break;
        }
        out.push(l.find("//").map_or(*l, |c| &l[..c]).to_string());
    }
    out
}

/// A match on a kernel source: where its scrutinee is (file, 1-based line) and whether one of
/// its arms is a catch-all.
#[derive(Debug)]
struct Site {
    file: String,
    line: usize,
    wildcard: bool,
}

/// The patterns of a match's arms, from the text between its braces: each arm's text before
/// its `=>`, its expression skipped to the `,` that ends it or the end of its block. String
/// literals are skipped whole.
fn arm_patterns(body: &str) -> Vec<String> {
    let chars: Vec<char> = body.chars().collect();
    let (mut patterns, mut pattern) = (Vec::new(), String::new());
    let (mut in_pattern, mut nest, mut i) = (true, 0i32, 0);
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            // A string literal: to its closing quote, escapes skipped.
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            continue;
        }
        match c {
            '(' | '[' | '{' => nest += 1,
            ')' | ']' | '}' => nest -= 1,
            _ => {}
        }
        if in_pattern {
            if c == '=' && chars.get(i + 1) == Some(&'>') && nest == 0 {
                patterns.push(std::mem::take(&mut pattern));
                in_pattern = false;
                i += 2;
                continue;
            }
            pattern.push(c);
        } else if nest == 0 && c == ',' {
            in_pattern = true;
        } else if nest == 0 && c == '}' {
            // A block arm ended, unless a method chain goes on after it.
            let next = chars[i + 1..].iter().find(|c| !c.is_whitespace());
            if !matches!(next, Some('.' | '?')) {
                in_pattern = true;
            }
        }
        i += 1;
    }
    patterns
}

/// The matches one of whose arms' patterns names `KernelSource::`, found from each `match`
/// keyword by bracket depth.
fn match_sites(root: &Path) -> Vec<Site> {
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut sites = Vec::new();
    for file in files {
        let lines = production_lines(&std::fs::read_to_string(&file).unwrap());
        let text = lines.join("\n");
        let starts: Vec<usize> = text
            .match_indices("match ")
            .map(|(i, _)| i)
            .filter(|&i| {
                i == 0
                    || !text[..i]
                        .chars()
                        .last()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '!')
            })
            .collect();
        for start in starts {
            // The body opens at the first `{` outside parentheses after the scrutinee.
            let mut paren = 0i32;
            let mut open = None;
            for (k, c) in text[start..].char_indices() {
                match c {
                    '(' | '[' => paren += 1,
                    ')' | ']' => paren -= 1,
                    '{' if paren == 0 => {
                        open = Some(start + k);
                        break;
                    }
                    ';' if paren == 0 => break,
                    _ => {}
                }
            }
            let Some(open) = open else { continue };
            let mut depth = 0i32;
            let mut close = text.len();
            for (k, c) in text[open..].char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            close = open + k;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let patterns = arm_patterns(&text[open + 1..close]);
            if !patterns.iter().any(|p| p.contains("KernelSource::")) {
                continue;
            }
            let wildcard = patterns.iter().any(|p| {
                let t = p.trim();
                t == "_" || t.starts_with("_ if ")
            });
            sites.push(Site {
                file: file
                    .strip_prefix(root)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned(),
                line: text[..start].matches('\n').count() + 1,
                wildcard,
            });
        }
    }
    sites
}

/// Where `cargo check` with the probe variant reports E0004: (file, line) of each error's
/// primary span, and the messages of any other error.
fn probe_errors(root: &Path) -> (BTreeSet<(String, usize)>, Vec<String>) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .current_dir(root)
        .args([
            "check",
            "--release",
            "--lib",
            "--quiet",
            "--features",
            "kernel-source-probe",
            "--message-format=json",
        ])
        .output()
        .expect("cargo runs");
    assert!(
        !out.status.success(),
        "the library built with a KernelSource variant no layer handles"
    );
    let mut e0004 = BTreeSet::new();
    let mut other = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-message" || msg["message"]["level"] != "error" {
            continue;
        }
        let m = &msg["message"];
        let code = m["code"]["code"].as_str().unwrap_or("");
        let primary = m["spans"]
            .as_array()
            .and_then(|s| s.iter().find(|s| s["is_primary"] == true));
        match (code, primary) {
            ("E0004", Some(span)) => {
                assert!(
                    m["message"].as_str().unwrap_or("").contains("Probe"),
                    "{}",
                    m["rendered"]
                );
                e0004.insert((
                    span["file_name"].as_str().unwrap().to_string(),
                    usize::try_from(span["line_start"].as_u64().unwrap()).unwrap(),
                ));
            }
            _ => other.push(m["rendered"].as_str().unwrap_or("").to_string()),
        }
    }
    (e0004, other)
}

#[test]
fn a_kernel_source_no_layer_handles_fails_to_compile_at_every_match_on_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sites = match_sites(root);
    let wild: Vec<&Site> = sites.iter().filter(|s| s.wildcard).collect();
    assert!(
        wild.is_empty(),
        "a catch-all arm on a kernel source: {wild:?}"
    );
    // The layers that decide by the kind of source: its reading, the kernel as given, the
    // build's dispatch, the series and the bisection's range.
    let files: BTreeSet<&str> = sites.iter().map(|s| s.file.as_str()).collect();
    for layer in [
        "src/kernel/source.rs",
        "src/kernel/mod.rs",
        "src/kernel/build/mod.rs",
        "src/lab/series/source.rs",
        "src/cli/kernel/series.rs",
    ] {
        assert!(
            files.contains(layer),
            "no match on a kernel source in {layer}: {files:?}"
        );
    }
    // The reader itself: a match with a catch-all arm is seen as one, and a match that only
    // calls a kernel source's function in an arm is not a match on one.
    let planted = arm_patterns(
        " Some(KernelSource::Git { repo, .. }) => f(\"{a}\"),\n _ => { g() }\n None => KernelSource::at_path(p), ",
    );
    assert_eq!(planted.len(), 3, "{planted:?}");
    assert_eq!(planted[1].trim(), "_");
    assert!(!planted[2].contains("KernelSource::"), "{planted:?}");
    let (e0004, other) = probe_errors(root);
    assert!(
        other.is_empty(),
        "errors other than E0004:\n{}",
        other.join("\n")
    );
    let found: BTreeSet<(String, usize)> = sites.iter().map(|s| (s.file.clone(), s.line)).collect();
    assert_eq!(
        e0004, found,
        "E0004 where the compiler reports it (left) against the matches on a kernel source (right)"
    );
    println!(
        "{} matches on a kernel source, each refused without the probe's arm:",
        found.len()
    );
    for (file, line) in &found {
        println!("  {file}:{line}");
    }
}
