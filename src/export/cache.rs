//! `hvlab cache`'s words: what the cache holds, what a prune removed, what a verification found.

use std::fmt::Write;

use crate::kernel::cache::{Change, Entry, Inventory, Kind, Pruned, SourceCheck, Verified};

use super::terminal::{table, trimmed};
use super::words::bytes;

/// What an entry is, in a word or two.
pub fn kind(k: Kind) -> &'static str {
    match k {
        Kind::Source => "source",
        Kind::BuildTree => "build tree",
        Kind::Build => "build",
        Kind::Kernel => "kernel",
        Kind::BootLog => "boot log",
        Kind::BuildLog => "build log",
        Kind::Series => "series",
        Kind::Apt => "apt lists",
        Kind::Leftover => "leftover",
        Kind::Kept => "kept",
    }
}

/// `12 s ago`, `3 min ago`, `5 h ago`, `2 d ago`.
pub fn ago(now: u64, then: u64) -> String {
    let s = now.saturating_sub(then);
    match s {
        0..60 => format!("{s} s ago"),
        60..3600 => format!("{} min ago", s / 60),
        3600..86_400 => format!("{} h ago", s / 3600),
        _ => format!("{} d ago", s / 86_400),
    }
}

fn row(e: &Entry, now: u64) -> Vec<String> {
    let mut about = e.about.clone().unwrap_or_default();
    if e.in_use {
        about = if about.is_empty() {
            "in use".into()
        } else {
            format!("{about}; in use")
        };
    }
    vec![
        kind(e.kind).to_string(),
        bytes(e.bytes),
        ago(now, e.last_use),
        e.name.clone(),
        about,
    ]
}

/// `hvlab cache`: the total, then every entry, least recently used first within its kind;
/// the logs one line per kind unless `all`.
pub fn inventory(inv: &Inventory, now: u64, all: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "hvlab's cache {}: {} on disk in {} entries (a file hard-linked into two entries counts once)",
        inv.dir.display(),
        bytes(inv.bytes),
        inv.entries.len()
    );
    if inv.entries.is_empty() {
        s.push_str("empty");
        return s;
    }
    let mut t = table(&["kind", "size", "last use", "entry", "from / holds"]);
    let mut logs: Vec<(Kind, usize, u64, u64)> = Vec::new();
    let mut entries: Vec<&Entry> = inv.entries.iter().collect();
    entries.sort_by_key(|e| (e.kind, std::cmp::Reverse(e.last_use)));
    for e in entries {
        if !all && matches!(e.kind, Kind::BootLog | Kind::BuildLog) {
            match logs.iter_mut().find(|l| l.0 == e.kind) {
                Some(l) => {
                    l.1 += 1;
                    l.2 += e.bytes;
                    l.3 = l.3.max(e.last_use);
                }
                None => logs.push((e.kind, 1, e.bytes, e.last_use)),
            }
            continue;
        }
        t.add_row(row(e, now));
    }
    for (k, n, size, last) in logs {
        t.add_row(vec![
            kind(k).to_string(),
            bytes(size),
            ago(now, last),
            format!("{n} {}s (--all lists each)", kind(k)),
            String::new(),
        ]);
    }
    s.push_str(&trimmed(&t));
    s
}

/// `hvlab cache prune`: what went, what stayed in use, the size before and after.
pub fn pruned(p: &Pruned, now: u64) -> String {
    let mut s = String::new();
    let verb = if p.dry_run { "would remove" } else { "removed" };
    let mut asked = Vec::new();
    if let Some(age) = p.older_than_s {
        asked.push(format!(
            "last used more than {} ago",
            ago(age, 0).trim_end_matches(" ago")
        ));
    }
    if let Some(keep) = p.keep_bytes {
        asked.push(format!("least recently used until at most {}", bytes(keep)));
    }
    let _ = writeln!(
        s,
        "{verb} {} entr{} ({}): {} → {}",
        p.removed.len(),
        if p.removed.len() == 1 { "y" } else { "ies" },
        asked.join(", then "),
        bytes(p.before),
        bytes(p.after)
    );
    if !p.removed.is_empty() {
        let mut t = table(&["kind", "size", "last use", "entry", "from / holds"]);
        for e in &p.removed {
            t.add_row(row(e, now));
        }
        let _ = writeln!(s, "{}", trimmed(&t));
    }
    if !p.in_use.is_empty() {
        // Each entry by name, but the logs a build holds with its source one line per kind.
        let mut kept: Vec<String> = Vec::new();
        let mut logs: Vec<(Kind, usize, u64)> = Vec::new();
        for e in &p.in_use {
            if matches!(e.kind, Kind::BootLog | Kind::BuildLog) {
                match logs.iter_mut().find(|l| l.0 == e.kind) {
                    Some(l) => {
                        l.1 += 1;
                        l.2 += e.bytes;
                    }
                    None => logs.push((e.kind, 1, e.bytes)),
                }
            } else {
                kept.push(format!("{} ({})", e.name, bytes(e.bytes)));
            }
        }
        kept.extend(
            logs.into_iter()
                .map(|(k, n, size)| format!("{n} {}s ({})", kind(k), bytes(size))),
        );
        let _ = writeln!(s, "kept, in use by a running hvlab: {}", kept.join(", "));
    }
    if let Some(keep) = p.keep_bytes
        && p.after > keep
    {
        let _ = writeln!(
            s,
            "still above {}: what is left is in use or kept (calibrations, cover letters); run prune again when those hvlabs are done",
            bytes(keep)
        );
    }
    s.trim_end().to_string()
}

/// One change, as `git status --short` would mark it.
fn change(c: &Change) -> String {
    match c {
        Change::Changed(p) => format!("M {p}"),
        Change::Added(p) => format!("A {p}"),
        Change::Removed(p) => format!("D {p}"),
    }
}

/// `hvlab cache verify`: one line per source tree, the changes of a changed one.
pub fn verified(checks: &[SourceCheck]) -> String {
    if checks.is_empty() {
        return "no unpacked source in the cache: nothing to verify".into();
    }
    let mut s = String::new();
    for c in checks {
        let what = c.what.as_deref().unwrap_or("a source");
        match &c.result {
            Verified::Same { sha256 } => {
                let _ = writeln!(
                    s,
                    "{}: {what}: as unpacked (sha256 {})",
                    c.name,
                    &sha256[..16.min(sha256.len())]
                );
            }
            Verified::Changed {
                recorded,
                now,
                changes,
            } => {
                let _ = writeln!(
                    s,
                    "{}: {what}: CHANGED since it was unpacked (sha256 {} then, {} now), {} path(s):",
                    c.name,
                    &recorded[..16.min(recorded.len())],
                    &now[..16.min(now.len())],
                    changes.len()
                );
                for ch in changes.iter().take(20) {
                    let _ = writeln!(s, "  {}", change(ch));
                }
                if changes.len() > 20 {
                    let _ = writeln!(s, "  … and {} more", changes.len() - 20);
                }
                let _ = writeln!(
                    s,
                    "  unpack it again: hvlab marked it, and the next build of that source unpacks it afresh"
                );
            }
            Verified::Unrecorded => {
                let _ = writeln!(
                    s,
                    "{}: {what}: no checksum was taken when it was unpacked (an older hvlab's, or an unpack that did not finish): the next build of that source unpacks it again",
                    c.name
                );
            }
        }
    }
    s.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_in_the_largest_whole_unit() {
        assert_eq!(ago(100, 88), "12 s ago");
        assert_eq!(ago(3000, 100), "48 min ago");
        assert_eq!(ago(4000, 100), "1 h ago");
        assert_eq!(ago(30 * 86_400, 0), "30 d ago");
        assert_eq!(ago(0, 5), "0 s ago");
    }
}
