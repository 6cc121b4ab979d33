//! `make` in the sandbox, out of tree and within its limits, and what its log says when it
//! fails.

use std::path::Path;
use std::process::Stdio;

use super::BuildError;
use crate::kernel::limits::{BuildKind, LimitHit};
use crate::kernel::overlay::Overlay;
use crate::kernel::sandbox::{self, Ended, Sandbox, View};
use crate::kernel::toolchain;

/// Why a `make` did not build.
pub(super) enum MakeError {
    /// It failed: the first compiler errors.
    Failed(String),
    /// It tried to write outside its output directory (whether or not make then failed).
    Outside(sandbox::RefusedWrite),
    /// It reached a limit and was ended, with everything it started.
    Limit(LimitHit),
    /// hvlab was asked to stop by this signal; make and what it started were ended.
    Stopped(i32),
    /// The log could not be written, or make could not be started.
    Io(std::io::Error),
}

/// One `make` of a build: the source it reads (read-only, with the patch laid over it), the
/// directories it may write, and the limits of its kind of build.
pub(super) struct Make<'a> {
    pub sandbox: &'a Sandbox,
    /// The source tree (`make -C`).
    pub source: &'a Path,
    /// The patch laid over the source, when the side is patched and built in a sandbox.
    pub overlay: Option<&'a Overlay>,
    /// What it writes: its output directories, the first its working directory.
    pub writable: Vec<&'a Path>,
    /// Its temporary directory, made before and removed after.
    pub tmp: &'a Path,
    /// What it builds, for its default limits.
    pub kind: BuildKind,
    /// The build log, appended to.
    pub log: &'a Path,
}

impl Make<'_> {
    /// `make -C SOURCE ARGS` with Kbuild's identity variables fixed, appending to the log (an
    /// fd hvlab opened). A refused write fails the build even when make went on (`$(shell
    /// ...)` failures do not stop make); so does a limit reached.
    pub(super) fn run(&self, args: &[String]) -> Result<(), MakeError> {
        let _ = std::fs::remove_dir_all(self.tmp);
        std::fs::create_dir_all(self.tmp).map_err(MakeError::Io)?;
        let result = self.run_in(args);
        let _ = std::fs::remove_dir_all(self.tmp);
        result
    }

    fn run_in(&self, args: &[String]) -> Result<(), MakeError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log)
            .map_err(MakeError::Io)?;
        // Only this make's lines are read back: the log gathers every step of a build.
        let before = file.metadata().map_err(MakeError::Io)?.len();
        let err = file.try_clone().map_err(MakeError::Io)?;
        let mut writable = self.writable.clone();
        writable.push(self.tmp);
        let view = View {
            overlays: self.overlay.map(|o| o.binds.clone()).unwrap_or_default(),
            writable: writable.iter().map(|p| p.to_path_buf()).collect(),
            tmp: Some(self.tmp.to_path_buf()),
            cwd: self.writable.first().map(|p| p.to_path_buf()),
        };
        let mut guard = self
            .sandbox
            .guard(self.sandbox.limits(self.kind), &writable);
        let mut cmd = self.sandbox.command("make", &view, &guard);
        cmd.arg("-C")
            .arg(self.source)
            .arg(format!("-j{}", toolchain::jobs()))
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
        let ended = sandbox::run_to_end(cmd, &mut guard, Some(self.log)).map_err(MakeError::Io)?;
        let bytes = std::fs::read(self.log).map_err(MakeError::Io)?;
        let own = bytes
            .get(usize::try_from(before).unwrap_or(usize::MAX)..)
            .unwrap_or_default();
        let text = String::from_utf8_lossy(own);
        let status = match ended {
            Ended::Stopped(sig) => return Err(MakeError::Stopped(sig)),
            Ended::Limit(hit) => return Err(MakeError::Limit(hit)),
            Ended::Exited(status) => status,
        };
        if let Some(refused) = sandbox::refused_write(&text, &writable) {
            return Err(MakeError::Outside(refused));
        }
        if status.success() {
            return Ok(());
        }
        Err(MakeError::Failed(first_errors(&text)))
    }
}

/// `make -C SOURCE O=OUT ARGS` as every kernel build runs it, for a tree of the caller's own
/// (tests, tools): in `sandbox`, `source` read-only, `out` (and its `.tmp` beside it) the only
/// directories it writes, within the limits of `kind`, ended with hvlab. A failure, a write
/// outside `out` or a limit reached is reported as a patched side's. Builds go through the
/// cache.
pub fn make_out_of_tree(
    sandbox: &Sandbox,
    source: &Path,
    out: &Path,
    args: &[String],
    kind: BuildKind,
    log: &Path,
) -> Result<(), BuildError> {
    let tmp = out.with_extension("tmp");
    let mut all = vec![format!("O={}", out.display())];
    all.extend(args.iter().cloned());
    Make {
        sandbox,
        source,
        overlay: None,
        writable: vec![out],
        tmp: &tmp,
        kind,
        log,
    }
    .run(&all)
    .map_err(make_error(true, "make", log))
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
                    "remove that write from the patch (a kernel build writes only in its output directory)"
                } else {
                    "the unpatched source should never do this: report it to hvlab with the log"
                },
                log,
                patched,
            },
            MakeError::Limit(limit) => BuildError::LimitReached {
                step,
                limit,
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
