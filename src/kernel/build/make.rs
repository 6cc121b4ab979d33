//! `make` in the sandbox, and what its log says when it fails.

use std::path::Path;
use std::process::Stdio;

use super::BuildError;
use crate::kernel::sandbox::{self, Ended, Sandbox};
use crate::kernel::toolchain;

/// Why a `make` did not build.
pub(super) enum MakeError {
    /// It failed: the first compiler errors.
    Failed(String),
    /// It tried to write outside its tree (whether or not make then failed).
    Outside(sandbox::RefusedWrite),
    /// hvlab was asked to stop by this signal; make and what it started were ended.
    Stopped(i32),
    /// The log could not be written, or make could not be started.
    Io(std::io::Error),
}

/// `make` in `tree`, in the sandbox (writable: the tree alone), with Kbuild's identity
/// variables fixed, appending to `log` (an fd hvlab opened). A refused write outside the tree
/// fails the build even when make went on (`$(shell ...)` failures do not stop make).
pub(super) fn make(
    sandbox: &Sandbox,
    tree: &Path,
    args: &[String],
    log: &Path,
) -> Result<(), MakeError> {
    make_into(sandbox, tree, None, args, log)
}

/// [`make`] of the source `tree` into the output directory `out` (`make O=OUT`) when given:
/// both writable, a write anywhere else refused.
pub(super) fn make_into(
    sandbox: &Sandbox,
    tree: &Path,
    out: Option<&Path>,
    args: &[String],
    log: &Path,
) -> Result<(), MakeError> {
    let writable: Vec<&Path> = std::iter::once(tree).chain(out).collect();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(MakeError::Io)?;
    // Only this make's lines are read back: the log gathers every step of a build.
    let before = file.metadata().map_err(MakeError::Io)?.len();
    let err = file.try_clone().map_err(MakeError::Io)?;
    let mut cmd = sandbox.command("make", &writable);
    cmd.arg("-C").arg(tree);
    if let Some(out) = out {
        cmd.arg(format!("O={}", out.display()));
    }
    cmd.arg(format!("-j{}", toolchain::jobs()))
        .args(args)
        .env("LC_ALL", "C")
        .env("KBUILD_BUILD_USER", "hvlab")
        .env("KBUILD_BUILD_HOST", "hvlab")
        .env("KBUILD_BUILD_VERSION", "1")
        .env("KBUILD_BUILD_TIMESTAMP", "Thu Jan  1 00:00:00 UTC 2026")
        .env_remove("ARCH")
        .env_remove("CROSS_COMPILE")
        .env_remove("KBUILD_OUTPUT")
        .env_remove("KCONFIG_CONFIG")
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err);
    let status = match sandbox::run_to_end(cmd).map_err(MakeError::Io)? {
        Ended::Stopped(sig) => return Err(MakeError::Stopped(sig)),
        Ended::Exited(status) => status,
    };
    let bytes = std::fs::read(log).map_err(MakeError::Io)?;
    let own = bytes
        .get(usize::try_from(before).unwrap_or(usize::MAX)..)
        .unwrap_or_default();
    let text = String::from_utf8_lossy(own);
    if let Some(refused) = sandbox::refused_write(&text, &writable) {
        return Err(MakeError::Outside(refused));
    }
    if status.success() {
        return Ok(());
    }
    Err(MakeError::Failed(first_errors(&text)))
}

/// `make ARGS` in `tree` as every kernel build runs it: in `sandbox`, writable only there,
/// ended with hvlab; a failure or a write outside the tree is reported as a patched side's.
/// For a tree of the caller's own (tests, tools); builds go through the cache.
pub fn make_in_sandbox(
    sandbox: &Sandbox,
    tree: &Path,
    args: &[String],
    log: &Path,
) -> Result<(), BuildError> {
    make(sandbox, tree, args, log).map_err(make_error(true, "make", log))
}

/// The first compiler errors of a build log (with the source lines gcc quotes after them),
/// else its last lines; one indented line each, between newlines.
pub(super) fn first_errors(log: &str) -> String {
    format!("\n{}\n", error_lines(log))
}

fn error_lines(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    if let Some(at) = lines
        .iter()
        .position(|l| l.contains(": error:") || l.contains(": fatal error:"))
    {
        // gcc's "In function" line before the first error says where.
        let from = if at > 0 && lines[at - 1].contains("In function") {
            at - 1
        } else {
            at
        };
        return lines[from..]
            .iter()
            .take(8)
            .map(|l| format!("  {l}"))
            .collect::<Vec<_>>()
            .join("\n");
    }
    lines
        .iter()
        .rev()
        .take(8)
        .rev()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A failed make's error: a compile error or a write outside the tree is the patch's fault
/// when the side is patched, else this host's.
pub(super) fn make_error<'a>(
    patched: bool,
    step: &'a str,
    log: &'a Path,
) -> impl FnOnce(MakeError) -> BuildError + 'a {
    move |e| {
        let (step, log) = (step.to_string(), log.to_path_buf());
        match e {
            MakeError::Failed(errors) if patched => {
                BuildError::PatchedCompile { step, errors, log }
            }
            MakeError::Failed(errors) => BuildError::BaseCompile { step, errors, log },
            MakeError::Outside(refused) => BuildError::WroteOutside {
                step,
                path: refused.path,
                line: refused.line,
                fix: if patched {
                    "remove that write from the patch (a kernel build writes only in its tree)"
                } else {
                    "the unpatched source should never do this: report it to hvlab with the log"
                },
                log,
                patched,
            },
            MakeError::Stopped(signal) => BuildError::Interrupted {
                step,
                signal,
                name: crate::sys::signal_name(signal),
            },
            MakeError::Io(e) => BuildError::Io(log, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::fault_exit_code;

    #[test]
    fn a_build_log_gives_its_first_compiler_error_with_the_function() {
        let log = "  CC [M]  arch/x86/kvm/x86.o\nkvm_main.c: In function 'f':\nkvm_main.c:10:5: error: expected ';'\n   10 | x\nmake[2]: *** Error 1\n";
        let e = first_errors(log);
        assert!(
            e.starts_with("\n  kvm_main.c: In function 'f':\n  kvm_main.c:10:5: error"),
            "{e}"
        );
        // No compiler error: the log's last lines.
        assert!(first_errors("a\nb\nmake: *** [Makefile] Error 2\n").contains("make: ***"));
    }

    /// 128 + the signal, as docs/commands.md ("Output contract") says of every interrupted
    /// command.
    #[test]
    fn an_interrupted_build_exits_128_plus_the_signal() {
        let e = make_error(false, "make M=arch/x86/kvm", Path::new("x.log"))(MakeError::Stopped(
            libc::SIGINT,
        ));
        assert_eq!(fault_exit_code(e.fault()), 130);
        assert!(
            e.to_string()
                .starts_with("Interrupted by SIGINT during make M=arch/x86/kvm"),
            "{e}"
        );
    }
}
