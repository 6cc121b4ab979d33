//! Records the git revision hvlab was built from: the host description every stored run
//! carries names it, so results can be traced back to the code that produced them.
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
}

fn main() {
    let rev = git(&["rev-parse", "--short=12", "HEAD"])
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|out| !out.is_empty());
    let suffix = if dirty && rev != "unknown" {
        "-dirty"
    } else {
        ""
    };
    println!("cargo:rustc-env=HVLAB_GIT_REV={rev}{suffix}");
    // This crate sits two levels below the repository's root, and a worktree's `.git` is a
    // file: ask git where HEAD and the index are.
    for what in ["HEAD", "index"] {
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", what]) {
            println!("cargo:rerun-if-changed={}", path.trim());
        }
    }
}
