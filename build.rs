//! Records the git revision hvlab was built from; every stored run carries it so results can be
//! traced back to the code that produced them.
use std::process::Command;

fn main() {
    let rev = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    let dirty = Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .filter(|out| out.status.success())
        .is_some_and(|out| !out.stdout.is_empty());
    let suffix = if dirty && rev != "unknown" {
        "-dirty"
    } else {
        ""
    };
    println!("cargo:rustc-env=HVLAB_GIT_REV={rev}{suffix}");
    // The kvm backend drives x86 guests (long mode, PIT, TSS, CPUID): it is built where the
    // feature is on and the target is x86-64; elsewhere hvlab is the model-only tool.
    println!("cargo::rustc-check-cfg=cfg(hvlab_kvm)");
    let x86 = std::env::var("CARGO_CFG_TARGET_ARCH").is_ok_and(|a| a == "x86_64");
    if x86 && std::env::var_os("CARGO_FEATURE_KVM").is_some() {
        println!("cargo::rustc-cfg=hvlab_kvm");
    }
    // A worktree's `.git` is a file, and a path that does not exist makes cargo rerun this
    // script on every build: ask git where HEAD, the branch it points at and the index are.
    for path in git_paths() {
        println!("cargo:rerun-if-changed={path}");
    }
}

/// HEAD, the ref it names (a commit moves the ref, not HEAD) and the index, as absolute
/// paths.
fn git_paths() -> Vec<String> {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let mut what = vec!["HEAD".to_string(), "index".to_string()];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        what.push(branch);
    }
    what.iter()
        .filter_map(|w| git(&["rev-parse", "--path-format=absolute", "--git-path", w]))
        .filter(|p| std::path::Path::new(p).exists())
        .collect()
}
