//! The one build script: records the git revision hvlab was built from (every stored run and
//! `--version` carry it, so results can be traced back to the code that produced them), and
//! turns the kvm backend on where it builds.
use std::process::Command;

/// A git command's output, trimmed; `None` when git fails or says nothing.
fn git(args: &[&str]) -> Option<String> {
    Command::new("git")
        .args(args)
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn main() {
    let rev = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some();
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
    // script on every build: ask git where HEAD, the branch it points at and the index are
    // (a commit moves the ref, not HEAD).
    let mut what = vec!["HEAD".to_string(), "index".to_string()];
    what.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for path in what
        .iter()
        .filter_map(|w| git(&["rev-parse", "--path-format=absolute", "--git-path", w]))
        .filter(|p| std::path::Path::new(p).exists())
    {
        println!("cargo:rerun-if-changed={path}");
    }
}
