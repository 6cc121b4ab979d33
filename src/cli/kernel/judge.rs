//! `hvlab judge GOOD [CANDIDATE] --variant V`: one step of `git bisect run`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use super::{Reporter, SoughtArgs, check_writable, command_line, open_store};
use crate::cli::Error;
use crate::error::InputError;
use crate::export::email::ReplyContext;
use crate::kernel::build::PatchedSpec;
use crate::kernel::mail::Thread;
use crate::lab::judge::{self, JudgeRequest};

/// `hvlab judge`: one step of `git bisect run`.
#[derive(Debug, Args)]
pub struct BisectStepArgs {
    /// The known good kernel (debian:7.3, git:PATH@v7.3)
    good: String,
    /// The kernel judged [default: the commit checked out in the git tree here,
    /// git:TOPLEVEL@HEAD, as `git bisect run` leaves it at each step]
    candidate: Option<String>,
    #[command(flatten)]
    sought: SoughtArgs,
    /// Never boot: answer from the object code alone (identical: good; changed: skip)
    #[arg(long)]
    no_boot: bool,
    /// Also write the verdict as a reply on the patch's thread (RFC 5322, In-Reply-To and
    /// References from the candidate's last patch's Message-ID), to FILE
    #[arg(long, value_name = "FILE")]
    email: Option<PathBuf>,
}

/// The commit checked out in the git tree around the working directory, as a spec.
fn head_of_cwd() -> Result<String, Error> {
    let git = |args: &[&str]| -> Option<String> {
        let out = std::process::Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    match (
        git(&["rev-parse", "--show-toplevel"]),
        git(&["rev-parse", "HEAD"]),
    ) {
        (Some(top), Some(head)) => Ok(format!("git:{top}@{head}")),
        _ => Err(InputError::BadValue {
            key: "CANDIDATE".into(),
            value: "(not given)".into(),
            why: "no CANDIDATE was given and the working directory is not in a git tree; run judge from the kernel tree being bisected, or name the candidate".into(),
        }
        .into()),
    }
}

/// The thread of the candidate's last patch over GOOD, for `--email FILE`, with FILE checked
/// writable.
fn thread_of(good: &PatchedSpec, candidate: &PatchedSpec, path: &Path) -> Result<Thread, Error> {
    let patches = candidate.patches_over(good);
    let thread = patches
        .last()
        .and_then(|p| p.patches.last())
        .and_then(|m| Thread::of(&m.text));
    let Some(thread) = thread else {
        return Err(InputError::BadValue {
            key: "--email".into(),
            value: path.display().to_string(),
            why: "the candidate's last patch over GOOD is not a mail with a Message-ID, so a reply has no thread to go on; give the patch as its mail (an mbox, or git format-patch output as sent)".into(),
        }
        .into());
    };
    check_writable(path, "the reply", "--email FILE")?;
    Ok(thread)
}

/// This host's name, for the reply's sender and Message-ID.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Writes the reply whole, then renames it into place.
fn write_reply(path: &Path, j: &judge::Judgement, thread: &Thread) -> Result<(), Error> {
    let host = crate::lab::host::probe();
    let clock =
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .map(|c| c.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
    let now = std::time::SystemTime::now();
    let nanos = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = hostname();
    let text = crate::export::email::reply(
        j,
        &ReplyContext {
            thread,
            from: &format!("hvlab <hvlab@{name}>"),
            message_id: &format!("hvlab.{nanos}@{name}"),
            date: now,
            reproduce: &command_line(),
            hardware: &format!(
                "{}, {} cores, Linux {}, HZ={}",
                host.cpu, host.cores, host.kernel, host.hz
            ),
            clock: &format!("host clocksource {clock}"),
        },
    );
    let fail = |e: std::io::Error| Error::OutputPath {
        what: "the reply",
        path: path.to_path_buf(),
        option: "--email FILE",
        why: e.to_string(),
    };
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(fail)?;
    std::io::Write::write_all(&mut tmp, text.as_bytes()).map_err(fail)?;
    tmp.persist(path).map_err(|e| fail(e.error))?;
    Ok(())
}

fn run(db: Option<&Path>, args: &BisectStepArgs) -> Result<ExitCode, Error> {
    let sought = &args.sought;
    sought.checked_scenarios()?;
    let candidate = match &args.candidate {
        Some(c) => c.clone(),
        None => head_of_cwd()?,
    };
    let req = JudgeRequest {
        kab: sought
            .judge
            .request(&args.good, &candidate, vec![sought.variant.clone()])?,
        variant: sought.variant.clone(),
        metric: sought.metric.clone(),
        seek: sought.seek(),
        max_effort: sought.max_effort,
        boot: !args.no_boot,
    };
    // The thread is read, and the file checked, before anything is built.
    let thread = match &args.email {
        Some(path) => Some((path, thread_of(&req.kab.base, &req.kab.patched, path)?)),
        None => None,
    };
    let mut store = open_store(db)?;
    let reporter = Reporter::new(sought.judge.json);
    let j = judge::judge(&req, &mut store, &reporter)?;
    drop(reporter);
    if sought.judge.json {
        super::super::print_json(&j)?;
    } else {
        super::super::print_text(&crate::export::judge::judgement(&j))?;
    }
    if let Some((path, thread)) = thread {
        write_reply(path, &j, &thread)?;
    }
    Ok(ExitCode::from(j.answer.exit_code()))
}

/// `hvlab judge`: exit 0 (good), 1 (bad) or 125 (skip) with an answer; any error of its own
/// (bad input, a host that cannot boot, a store that fails) exits 128 plus its usual code, which
/// stops `git bisect run` instead of marking the commit bad.
pub fn judge(db: Option<&Path>, args: &BisectStepArgs) -> Result<ExitCode, Error> {
    match run(db, args) {
        Ok(code) => Ok(code),
        Err(Error::Output(e)) => Err(Error::Output(e)),
        Err(e) => {
            let chain = e.chain();
            for (i, line) in chain.iter().enumerate() {
                let lead = if i == 0 { "error: " } else { "  caused by: " };
                eprintln!("{lead}{}", super::super::safe(line));
            }
            Ok(ExitCode::from(
                128u8.saturating_add(u8::try_from(e.exit_code()).unwrap_or(4)),
            ))
        }
    }
}
