//! `hvlab vm` and `hvlab kab`: kernels under test booted in QEMU, and their A/B. The words of
//! a kab's outcome (the terminal text and the cover letter) are [`crate::export::kab`]'s.

mod judge;
#[cfg(test)]
mod kab_golden;
mod series;

pub use judge::BisectStepArgs;
pub(super) use judge::judge;
pub use series::BisectArgs;
pub(super) use series::bisect;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::analysis::class::VariantClass;
use crate::cli::Error;
use crate::error::InputError;
use crate::export::kab::{duration, how_built, markdown, render};
use crate::kernel::build::{self, BuildNote, BuildProgress, PatchedSpec};
use crate::kernel::calibration;
use crate::kernel::limits::LimitOverrides;
use crate::kernel::sandbox::SandboxPolicy;
use crate::kernel::vm::{self, Accel, Boot, VmConfig};
use crate::kernel::{self, Kernel};
use crate::lab::kab::{self, BootSummary, KabOutcome, KabProgress, KabRequest};
use crate::scenario::Kind;
use crate::store::{self, Store};
use hvlab_core::host::Clock;

/// How the VM is booted (shared by `vm` and `kab`).
#[derive(Debug, Args)]
pub struct BootArgs {
    /// Accelerator: kvm (nested VMX/SVM), tcg (emulated SVM+NPT), auto
    #[arg(long, value_enum, default_value_t = Accel::Auto)]
    accel: Accel,
    /// vCPUs of the VM (1: the steps hvlab runs need no more, and TCG stays single-threaded)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    cpus: u32,
    /// Memory of the VM, e.g. 2G or 1536M
    #[arg(long, default_value = "1G")]
    mem: String,
    /// A KVM module parameter in the guest, MODULE.PARAM=VALUE (repeatable), e.g. kvm.tdp_mmu=N
    #[arg(long = "kvm-param", value_name = "MOD.PARAM=VALUE")]
    kvm_params: Vec<String>,
    /// Time limit per hvlab command in the guest, seconds
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// The clock the guest measures on: icount (QEMU's instruction clock: a time is the guest
    /// instructions it took, the same on a busy host) or wall [default: icount under tcg, wall
    /// under kvm, where icount cannot be]
    #[arg(long, value_name = "CLOCK", value_parser = parse_clock)]
    clock: Option<Clock>,
}

impl BootArgs {
    fn config(&self) -> Result<VmConfig, Error> {
        let bad = |why: &str| InputError::BadValue {
            key: "--mem".into(),
            value: self.mem.clone(),
            why: why.into(),
        };
        let t = self.mem.trim();
        let (num, mult) = match t.chars().last() {
            Some('G' | 'g') => (&t[..t.len() - 1], 1024),
            Some('M' | 'm') => (&t[..t.len() - 1], 1),
            _ => (t, 1),
        };
        let mib: u32 = num
            .parse::<u32>()
            .ok()
            .and_then(|n| n.checked_mul(mult))
            .ok_or_else(|| bad("give a size such as 2G or 1536M"))?;
        if mib < 512 {
            return Err(bad(
                "the guest needs at least 512M (hvlab and the modules live in its initramfs)",
            )
            .into());
        }
        Ok(VmConfig {
            accel: self.accel,
            clock: self.clock,
            cpus: self.cpus,
            mem_mib: mib,
            kvm_params: self.kvm_params.clone(),
            cmd_timeout: Duration::from_secs(self.timeout.max(1)),
        })
    }
}

/// The hvlab argument lists `hvlab vm` runs in the guest: those after `--`, then
/// `--commands FILE`'s lines; none is bad input.
fn vm_commands(args: &VmArgs) -> Result<Vec<Vec<String>>, Error> {
    let mut commands: Vec<Vec<String>> = Vec::new();
    if !args.args.is_empty() {
        commands.push(args.args.clone());
    }
    if let Some(file) = &args.commands {
        let text = std::fs::read_to_string(file).map_err(|e| InputError::BadValue {
            key: "--commands".into(),
            value: file.display().to_string(),
            why: format!("cannot read it ({e}); give a file with one hvlab argument list per line"),
        })?;
        commands.extend(
            text.lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| l.split_whitespace().map(str::to_string).collect()),
        );
    }
    if commands.is_empty() {
        return Err(InputError::BadValue {
            key: "HVLAB-ARGS".into(),
            value: String::new(),
            why: "say what to run in the VM after --, e.g. hvlab vm --kernel debian:6.12 -- run lifecycle".into(),
        }
        .into());
    }
    Ok(commands)
}

/// `hvlab vm`.
#[derive(Debug, Args)]
pub struct VmArgs {
    /// The kernel: debian:VERSION, a bzImage (with --modules), a build tree, an unpacked package;
    /// debian:VERSION+PATCH[+PATCH...] rebuilds Debian's source of that version with the patches;
    /// git:PATH@REF[+PATCH...] builds that commit of a git tree (in hvlab's own clone)
    #[arg(long, value_name = "SPEC")]
    kernel: String,
    /// Modules for a bzImage: DIR/lib/modules/RELEASE (`make modules_install INSTALL_MOD_PATH=DIR`)
    #[arg(long, value_name = "DIR")]
    modules: Option<PathBuf>,
    #[command(flatten)]
    config: GuestConfigArgs,
    #[command(flatten)]
    boot: BootArgs,
    /// More hvlab commands for the same boot, one argument list per line (after the one given)
    #[arg(long, value_name = "FILE")]
    commands: Option<PathBuf>,
    /// Write each command's N.out, N.err, N.rc here
    #[arg(long, value_name = "DIR")]
    results: Option<PathBuf>,
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// The hvlab command to run in the VM
    #[arg(last = true, value_name = "HVLAB-ARGS")]
    args: Vec<String>,
}

/// Where a patched kernel builds, and its limits (shared by `vm`, `kab` and `bisect`).
#[derive(Debug, Args)]
pub struct SandboxArgs {
    /// Build a patched kernel unconfined, as yourself, where no bubblewrap sandbox can be made: the patch's Makefiles then run with your rights (the output says so)
    #[arg(long)]
    no_sandbox: bool,
    /// Wall-time limit of each make of a kernel build, e.g. 45m [default: 10m for modules, 30m for a whole kernel]
    #[arg(long, value_name = "DURATION", value_parser = super::cache::parse_duration)]
    build_timeout: Option<Duration>,
    /// Disk space each make of a kernel build may add (output and temporary files), and the largest file it may write, e.g. 8G [default: 1G for modules, 4G for a whole kernel]
    #[arg(long, value_name = "SIZE", value_parser = super::cache::parse_size)]
    build_disk: Option<u64>,
    /// Processes a kernel build may have at once, held by a pids cgroup where hvlab can make one, else RLIMIT_NPROC [default: 512]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    build_procs: Option<u32>,
}

/// `--config FILE`: the config a `git:` kernel's minimal guest config takes its options from.
#[derive(Debug, Args)]
pub struct GuestConfigArgs {
    /// For git:PATH@REF: the .config whose HZ, preemption, RCU and KVM options the minimal guest config keeps (default: Debian's config of the nearest version in hvlab's cache)
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

impl GuestConfigArgs {
    /// The file, read once now: a missing or unreadable one is bad input (exit 2) naming it,
    /// before anything is built or booted (and even when no side is a `git:` tree).
    fn checked(&self) -> Result<Option<PathBuf>, Error> {
        let Some(path) = &self.config else {
            return Ok(None);
        };
        std::fs::read_to_string(path)
            .map_err(|e| vm::VmError::from(build::BuildError::ConfigUnreadable(path.clone(), e)))?;
        Ok(Some(path.clone()))
    }
}

impl SandboxArgs {
    fn policy(&self) -> SandboxPolicy {
        let base = if self.no_sandbox {
            SandboxPolicy::OFF
        } else {
            SandboxPolicy::REQUIRED
        };
        SandboxPolicy {
            limits: LimitOverrides {
                wall: self.build_timeout,
                disk_bytes: self.build_disk,
                processes: self.build_procs,
            },
            ..base
        }
    }
}

/// What `kab`, `kab --per-patch`, `bisect` and `judge` share: the scenarios each guest runs, its
/// parameters, the boots and repetitions, the threshold, and where and how kernels build and
/// boot.
#[derive(Debug, Args)]
pub struct JudgeArgs {
    /// Scenario to run (repeatable) [default: lifecycle]
    #[arg(long = "scenario", value_name = "S")]
    scenarios: Vec<String>,
    /// Scenario parameter key=value (repeatable), for the scenarios that declare the key;
    /// checked here before anything is built
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Boots per kernel, in ABBA order [default: 1 on the instruction clock, where a boot
    /// repeats the last one's times; 2 on the wall clock, and with --per-patch, bisect and
    /// judge, which take 2 at least: one boot cannot tell a boot's own offset from a commit's]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=50))]
    boots: Option<u32>,
    /// Repetitions per variant in each boot, a bisection's at the first try [default: 5 on the
    /// instruction clock, where a repetition's times are instruction counts judged against
    /// their spread; 10 on the wall clock]
    // 10 on the wall clock, so 20 per side with the default boots: two emulator hiccups on one
    // side sink a rank test over 6 per side, and a repetition costs far less than a boot.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    reps: Option<u32>,
    /// Smallest change that counts for judged jiffies and times
    #[arg(long, default_value = "5%")]
    threshold: String,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    config: GuestConfigArgs,
    #[command(flatten)]
    sandbox: SandboxArgs,
    #[command(flatten)]
    boot: BootArgs,
}

/// What a bisection (or one step of `git bisect run`) seeks: the variant, which change of it
/// counts as bad, how hard to try, and the kab settings of every judgement.
#[derive(Debug, Args)]
pub struct SoughtArgs {
    /// The variant judged
    #[arg(long, value_name = "V")]
    pub variant: String,
    /// The metric shown with each verdict [default: the one that moved, else the first judged]
    #[arg(long, value_name = "M")]
    pub metric: Option<String>,
    /// Bad is FIXED or IMPROVED against GOOD (seeking the commit that fixed it), not any change
    #[arg(long, conflicts_with = "regression")]
    pub fix: bool,
    /// Bad is REGRESSED against GOOD only, not any change
    #[arg(long)]
    pub regression: bool,
    #[command(flatten)]
    pub judge: JudgeArgs,
    /// How many times a NOT DECIDED judgement gets more: each adds an ABBA pair of boots,
    /// past --boots of them at doubled repetitions
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(0..=8))]
    pub max_effort: u32,
}

impl SoughtArgs {
    /// Which change is bad.
    pub fn seek(&self) -> crate::lab::bisect::Seek {
        use crate::lab::bisect::Seek;
        if self.fix {
            Seek::Fix
        } else if self.regression {
            Seek::Regression
        } else {
            Seek::Change
        }
    }

    /// The scenarios asked (`lifecycle` when none), with `--variant` checked to be one of
    /// theirs, and two boots a side at least, as every step of a bisection takes.
    pub fn checked_scenarios(&self) -> Result<Vec<String>, Error> {
        let scenarios = if self.judge.scenarios.is_empty() {
            vec!["lifecycle".to_string()]
        } else {
            self.judge.scenarios.clone()
        };
        check_variants_exist("--variant", std::slice::from_ref(&self.variant), &scenarios)?;
        self.judge.check_series_boots()?;
        Ok(scenarios)
    }
}

impl JudgeArgs {
    /// The boots per kernel asked for, else the default: one on the instruction clock, where
    /// a boot repeats the last one's times, two on the wall clock.
    fn boots(&self) -> u32 {
        self.boots
            .unwrap_or(if icount_by_default(&self.boot) { 1 } else { 2 })
    }

    /// The repetitions per variant and boot asked for, else the clock's default: on the
    /// instruction clock every time (a lifecycle's jiffies too) is judged against its spread,
    /// outside the rank test's family, and 5 show a tick phase's reach; the wall clock's rank
    /// test needs 10 a boot to call anything once a kab's comparisons share the level.
    fn reps(&self) -> u32 {
        self.reps
            .unwrap_or(if icount_by_default(&self.boot) { 5 } else { 10 })
    }

    /// Per-patch and bisect judge a commit from its boots: on the wall clock two a kernel at
    /// least ([`series::at_least_two_boots`]).
    fn check_series_boots(&self) -> Result<(), Error> {
        if icount_by_default(&self.boot) {
            return Ok(());
        }
        series::at_least_two_boots(self.boots())
    }

    /// The request of `base` against `patched` running `variants`, typed once: both kernel
    /// specs read (their patches and the paths those name included), every scenario with its
    /// parameters checked by its own declarations, the boots and the build settings; any of
    /// it wrong is bad input, before anything is fetched, built or booted.
    fn request(
        &self,
        base: &str,
        patched: &str,
        variants: Vec<String>,
    ) -> Result<KabRequest, Error> {
        let threshold = crate::lab::compare::parse_threshold(&self.threshold)?;
        let vm = self.boot.config()?;
        let config = self.config.checked()?;
        let sets = if icount_by_default(&self.boot) {
            kab::with_instruction_clock_sets(&self.scenarios, &self.sets)
        } else {
            self.sets.clone()
        };
        let scenarios = kab::guest_scenarios(&self.scenarios, &variants, &sets)?;
        let spec = |text: &str| PatchedSpec::parse(text).map_err(vm::VmError::from);
        Ok(KabRequest {
            base: spec(base)?,
            patched: spec(patched)?,
            scenarios,
            variants,
            boots: self.boots(),
            reps: self.reps(),
            threshold,
            vm,
            model_strategy: None,
            calibrate: false,
            sandbox: self.sandbox.policy(),
            config,
        })
    }
}

/// `hvlab kab`.
#[derive(Debug, Args)]
pub struct KabArgs {
    /// The baseline kernel: SPEC as for `hvlab vm --kernel`, with patches as SPEC+PATCH[+PATCH...]
    base: String,
    /// The patched kernel, e.g. debian:7.3+fix.patch (rebuilt from Debian's source of that
    /// version; an unpatched debian:7.3 as A is then rebuilt the same way, without the patch)
    patched: String,
    /// Variant to run (repeatable) [default: all]
    #[arg(long = "variant", value_name = "V")]
    variants: Vec<String>,
    #[command(flatten)]
    judge: JudgeArgs,
    /// Exit 1 when any verdict is REGRESSED (a judged metric worse, a stall gained, or a variant A ran that B failed)
    #[arg(long)]
    fail_on_regression: bool,
    /// Exit 1 unless this variant's verdict is FIXED (repeatable): a patch's CI asserting its purpose
    #[arg(long = "expect-fixed", value_name = "VARIANT")]
    expect_fixed: Vec<String>,
    /// Write a paragraph for the patch's cover letter (Markdown, at most 25 lines) here, and a copy beside the stored runs
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// The model's strategy for B's change, when the model does not recognise the patch: for lifecycle always-defer (call_srcu, Linux 6.18 to 7.3), always-sync (before 7d9a0273), lifecycle-keyed (the fix in thread 001); for memory legacy (thread 004's trailing prefetch), legacy-skip-trailing (without it), either with :N for PTE_PREFETCH_NUM N (legacy:16)
    #[arg(long, value_name = "STRATEGY", value_parser = parse_model_strategy)]
    model_strategy: Option<String>,
    /// Do not calibrate the base in its first boot (once per kernel and accelerator: about 10 s more in that boot under TCG); the model's prediction for this host then needs a cached calibration
    #[arg(long)]
    no_calibrate: bool,
    /// SERIES is BASE+SERIES.mbox or a git range git:PATH@A..B (BASE git:PATH@A): judge each
    /// commit (message) against its parent and against BASE, one row per commit and variant,
    /// every comparison corrected as one family
    #[arg(long)]
    per_patch: bool,
    /// With --per-patch: the table from the store alone, nothing built or booted (after
    /// `hvlab merge` of the shards' files)
    #[arg(long, requires = "per_patch")]
    from_store: bool,
    /// With --per-patch: the metric shown in each row's numbers when none moved and it was
    /// judged (never a time under TCG) [default: the first judged, counts first]
    #[arg(long, value_name = "M", requires = "per_patch")]
    metric: Option<String>,
    #[command(flatten)]
    shard: super::ShardArgs,
}

fn open_store(db: Option<&Path>) -> Result<Store, Error> {
    Ok(Store::open(&store::resolve_path(db)?)?)
}

fn describe(k: &Kernel) -> String {
    format!("{} ({})", k.release, k.source)
}

/// Stores a boot's runs; a guest failure is reported after its completed runs are kept.
fn keep(store: &mut Store, boot: &Boot) -> Result<String, Error> {
    let tally = vm::store_runs(store, &boot.runs)?;
    Ok(format!(
        "runs: {} brought back to {} ({} new, {} already there)",
        boot.runs.len(),
        store.location(),
        tally.stored,
        tally.already_stored
    ))
}

/// `--clock`.
fn parse_clock(text: &str) -> Result<Clock, String> {
    text.parse()
}

/// `hvlab vm`.
pub fn vm(db: Option<&Path>, args: &VmArgs) -> Result<ExitCode, Error> {
    let cfg = args.boot.config()?;
    vm::check_clock(cfg.accel, cfg.clock)?;
    let config = args.config.checked()?;
    let commands = vm_commands(args)?;
    let spec = PatchedSpec::parse(&args.kernel)
        .map_err(vm::VmError::from)?
        .with_modules(args.modules.as_deref());
    let mut store = open_store(db)?;
    let qemu = vm::qemu()?;
    // The accelerator and the clock before anything is fetched or built: a QEMU that cannot
    // count instructions is said at once.
    let choice = vm::choose_accel(cfg.accel)?;
    let clock = vm::choose_clock(cfg.clock, &choice, &qemu)?;
    let reporter = Reporter::new(false);
    let resolved =
        build::resolve_with_config(&[spec], args.sandbox.policy(), config.as_deref(), &reporter)
            .map_err(vm::VmError::from)?;
    drop(reporter);
    let Some(built) = resolved.sides.into_iter().next() else {
        return Err(InputError::BadValue {
            key: "--kernel".into(),
            value: args.kernel.clone(),
            why: "it names no kernel".into(),
        }
        .into());
    };
    let kernel = built.kernel;
    eprintln!("kernel: {}", describe(&kernel));
    if let Some(b) = &built.build {
        eprintln!("built: {}", how_built(&kernel, Some(b)));
    }
    for n in &resolved.notes {
        eprintln!("note: {n}");
    }
    eprintln!("{}", choice.why);
    eprintln!("{}", crate::export::words::clock_line(clock));
    let dir = kab::logs_dir(&kernel.release);
    let (boot, failure) = vm::boot(&kernel, &cfg, &commands, &dir)?;
    if let Some(s) = boot.to_first_command_s {
        eprintln!(
            "boot: {s:.1} s to the first hvlab command (QEMU ran {:.1} s)",
            boot.wall_s
        );
    }
    for (i, c) in boot.commands.iter().enumerate() {
        if commands.len() > 1 {
            println!(
                "=== hvlab {}: exit {}",
                c.args.join(" "),
                c.rc.map_or("-".into(), |r| r.to_string())
            );
        }
        print!("{}", c.stdout);
        eprint!("{}", c.stderr);
        if let Some(out) = &args.results {
            write_result(out, i + 1, c)?;
        }
    }
    eprintln!("{}", keep(&mut store, &boot)?);
    if let Some(toml) = &boot.calibrated {
        let id = calibration::Identity::of(&kernel, &boot.accel);
        match calibration::save(&id, toml) {
            Ok((path, _)) => eprintln!(
                "calibrated profile of {} under {} kept: {} (the model's predictions of changes to this kernel read it: hvlab fidelity, hvlab kab)",
                kernel.release,
                boot.accel.accel,
                path.display()
            ),
            Err(e) => eprintln!("warning: {e}"),
        }
    }
    eprintln!("serial log: {}", boot.console.display());
    if let Some(f) = failure {
        return Err(f.into());
    }
    let rc = boot
        .commands
        .iter()
        .filter_map(|c| c.rc)
        .find(|&r| r != 0)
        .unwrap_or(0);
    Ok(ExitCode::from(u8::try_from(rc).unwrap_or(4)))
}

fn write_result(dir: &Path, n: usize, c: &vm::GuestCommand) -> Result<(), Error> {
    let fail = |e: std::io::Error| Error::OutputPath {
        what: "the command results",
        path: dir.to_path_buf(),
        option: "--results DIR",
        why: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    std::fs::write(dir.join(format!("{n}.out")), &c.stdout).map_err(fail)?;
    std::fs::write(dir.join(format!("{n}.err")), &c.stderr).map_err(fail)?;
    let rc = c.rc.map_or("none".into(), |r| r.to_string());
    std::fs::write(dir.join(format!("{n}.rc")), rc + "\n").map_err(fail)?;
    Ok(())
}

/// Progress on stderr: one line per finished step or boot (kept in CI logs), and an
/// indicatif spinner while a step runs, on a terminal and without --json.
struct Reporter {
    spinners: bool,
    active: std::cell::RefCell<Option<ProgressBar>>,
}

impl Reporter {
    fn new(json: bool) -> Reporter {
        Reporter {
            spinners: !json && !super::habits::quiet() && std::io::stderr().is_terminal(),
            active: std::cell::RefCell::new(None),
        }
    }

    /// A line on stderr (left out with --quiet), above the spinner when one runs.
    fn line(&self, text: &str) {
        match self.active.borrow().as_ref() {
            Some(bar) => bar.println(text),
            None => super::habits::note(text),
        }
    }

    fn spin(&self, what: &str) {
        self.idle();
        if self.spinners {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg} {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.set_message(what.to_string());
            bar.enable_steady_tick(std::time::Duration::from_millis(120));
            *self.active.borrow_mut() = Some(bar);
        }
    }

    fn idle(&self) {
        if let Some(bar) = self.active.borrow_mut().take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Reporter {
    fn drop(&mut self) {
        self.idle();
    }
}

impl BuildProgress for Reporter {
    fn begin(&self, step: &str) {
        self.spin(step);
    }

    fn end(&self, step: &str, secs: f64) {
        self.idle();
        self.line(&format!("build: {step}: {}", duration(secs)));
    }
}

impl KabProgress for Reporter {
    fn kernels(&self, kernels: &[Kernel; 2], notes: &[BuildNote], accel: &vm::AccelChoice) {
        self.line(&format!("A: {}", describe(&kernels[0])));
        self.line(&format!("B: {}", describe(&kernels[1])));
        for n in notes {
            self.line(&format!("note: {n}"));
        }
        self.line(&accel.why);
        self.line(&crate::export::words::clock_line(accel.clock));
    }

    fn boot_start(&self, n: usize, total: usize, side: &str, kernel: &Kernel) {
        self.spin(&format!("boot {n}/{total}: {side} {}", kernel.release));
    }

    fn note(&self, text: &str) {
        self.line(text);
    }

    fn boot_end(&self, boot: &BootSummary) {
        self.idle();
        self.line(&format!(
            "boot {}: {} s to the first command, {:.1} s in all; runs: {} brought back to {} ({} new)",
            boot.side,
            boot.to_first_command_s
                .map_or_else(|| "-".to_string(), |s| format!("{s:.1}")),
            boot.wall_s,
            boot.runs,
            boot.store,
            boot.stored
        ));
        for f in &boot.failures {
            self.line(&format!(
                "  hvlab {}: exit {:?}\n{}",
                f.args.join(" "),
                f.rc,
                f.stderr.trim_end()
            ));
        }
    }
}

/// The command line as given, quoted for a shell.
fn command_line() -> String {
    std::env::args()
        .enumerate()
        .map(|(i, a)| {
            if i == 0 {
                "hvlab".to_string()
            } else {
                super::run_store::shell_word(&a)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `hvlab kab`.
pub fn kab(db: Option<&Path>, args: &KabArgs) -> Result<ExitCode, Error> {
    if args.per_patch {
        args.judge.check_series_boots()?;
    }
    let req = kab_request(args)?;
    check_kab_args(args, &req)?;
    if args.per_patch {
        return series::per_patch(db, args, req);
    }
    if let Some(shard) = &args.shard.shard {
        return Err(InputError::BadValue {
            key: "--shard".into(),
            value: shard.clone(),
            why: "a kab of two kernels has one unit; shards split a series: add --per-patch".into(),
        }
        .into());
    }
    let mut store = open_store(db)?;
    let reporter = Reporter::new(args.judge.json);
    let outcome = kab::run(&req, &mut store, &reporter)?;
    drop(reporter);
    if args.judge.json {
        super::print_json(&outcome)?;
    } else {
        super::print_text(&render(&outcome))?;
    }
    if let Some(path) = &args.markdown {
        write_cover_letter(path, &markdown(&outcome, &command_line()), &store)?;
    }
    Ok(ExitCode::from(kab_exit_code(
        args.fail_on_regression,
        &args.expect_fixed,
        &outcome,
    )?))
}

/// 1 when `--fail-on-regression` meets a REGRESSED verdict (the outcome's `regression` is
/// read from the classes printed) or an `--expect-fixed` variant is not FIXED; else 0.
fn kab_exit_code(
    fail_on_regression: bool,
    expect_fixed: &[String],
    outcome: &KabOutcome,
) -> Result<u8, Error> {
    let regressed = fail_on_regression && outcome.regression;
    let missed_fixed = misses_expected_fixed(expect_fixed, outcome)?;
    Ok(u8::from(regressed || missed_fixed))
}

/// Whether the boots will run on the instruction clock: asked for, or TCG's default. An
/// accelerator that cannot be had is said later, by the boot itself.
fn icount_by_default(boot: &BootArgs) -> bool {
    match boot.clock {
        Some(clock) => clock == Clock::Icount,
        None => vm::choose_accel(boot.accel).is_ok_and(|c| c.accel != Accel::Kvm),
    }
}

/// What the kab compares, and how, from its arguments.
fn kab_request(args: &KabArgs) -> Result<KabRequest, Error> {
    let mut req = args
        .judge
        .request(&args.base, &args.patched, args.variants.clone())?;
    req.model_strategy = args.model_strategy.clone();
    req.calibrate = !args.no_calibrate;
    Ok(req)
}

/// `--model-strategy`: one of the lifecycle model's strategies or the memory model's.
fn parse_model_strategy(text: &str) -> Result<String, String> {
    let lifecycle = crate::lab::fidelity::patch::strategy_named(text).is_some();
    let memory = crate::lab::fidelity::memory_patch::Prefetch::named(text).is_some();
    if lifecycle || memory {
        Ok(text.to_string())
    } else {
        Err("a strategy is always-defer, always-sync, lifecycle-keyed (lifecycle), or legacy, legacy-skip-trailing, either with :N for PTE_PREFETCH_NUM N a power of two up to 512 (memory)".into())
    }
}

/// The options that must agree with what runs, checked before anything is built or booted.
fn check_kab_args(args: &KabArgs, req: &KabRequest) -> Result<(), Error> {
    let memory = args
        .model_strategy
        .as_deref()
        .is_some_and(|m| crate::lab::fidelity::memory_patch::Prefetch::named(m).is_some());
    if memory && !req.runs(Kind::Memory) {
        return Err(InputError::BadValue {
            key: "--model-strategy".into(),
            value: args.model_strategy.clone().unwrap_or_default(),
            why: "it declares the change to the memory scenario's model; add --scenario memory"
                .into(),
        }
        .into());
    }
    if !memory && args.model_strategy.is_some() && !req.runs(Kind::Lifecycle) {
        return Err(InputError::BadValue {
            key: "--model-strategy".into(),
            value: args.model_strategy.clone().unwrap_or_default(),
            why:
                "it declares the change to the lifecycle scenario's model; add --scenario lifecycle"
                    .into(),
        }
        .into());
    }
    if let Some(v) = args
        .expect_fixed
        .iter()
        .find(|v| !args.variants.is_empty() && !args.variants.contains(v))
    {
        return Err(InputError::BadValue {
            key: "--expect-fixed".into(),
            value: v.clone(),
            why: "that variant is not among the --variant ones run".into(),
        }
        .into());
    }
    check_expected_variants(&args.expect_fixed, &req.scenario_names())?;
    if let Some(path) = &args.markdown {
        check_writable(path, COVER_LETTER, MARKDOWN)?;
    }
    Ok(())
}

/// Every `--expect-fixed` variant is one a requested scenario has: a typo must not cost two
/// kernel builds and four boots before it is said.
fn check_expected_variants(expect_fixed: &[String], scenarios: &[String]) -> Result<(), Error> {
    check_variants_exist("--expect-fixed", expect_fixed, scenarios)
}

/// Every variant `option` names is one a requested scenario has (exit 2 naming the others).
fn check_variants_exist(
    option: &str,
    variants: &[String],
    scenarios: &[String],
) -> Result<(), Error> {
    let infos = scenarios
        .iter()
        .map(|s| crate::scenario::find(s))
        .collect::<Result<Vec<_>, _>>()?;
    for v in variants {
        if !infos
            .iter()
            .any(|i| i.variants.iter().any(|x| x.name == *v))
        {
            let known: Vec<&str> = infos
                .iter()
                .flat_map(|i| i.variants.iter().map(|x| x.name))
                .collect();
            return Err(InputError::BadValue {
                key: option.into(),
                value: v.clone(),
                why: format!(
                    "no scenario of {} has that variant; it has: {}",
                    scenarios.join(", "),
                    known.join(", ")
                ),
            }
            .into());
        }
    }
    Ok(())
}

/// `--markdown FILE` can be written, checked before anything is built: an existing file is
/// opened for writing without truncation, a new one created and removed again.
/// What `--markdown FILE` writes, and the option, as an unwritable path's error names them.
const COVER_LETTER: &str = "the cover-letter paragraph";
const MARKDOWN: &str = "--markdown FILE";

fn check_writable(path: &Path, what: &'static str, option: &'static str) -> Result<(), Error> {
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| Error::OutputPath {
            what,
            path: path.to_path_buf(),
            option,
            why: e.to_string(),
        })?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Writes the cover-letter paragraph to `path`, and a copy beside the stored runs.
fn write_cover_letter(path: &Path, text: &str, store: &Store) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|e| Error::OutputPath {
        what: "the cover-letter paragraph",
        path: path.to_path_buf(),
        option: "--markdown FILE",
        why: e.to_string(),
    })?;
    let beside = match store.location() {
        store::Location::Sqlite(p) => p
            .parent()
            .map_or_else(|| PathBuf::from("kab"), |d| d.join("kab")),
        store::Location::Postgres(_) => kernel::cache_dir().join("kab"),
    };
    let copy = beside.join(format!(
        "{}-{}.md",
        crate::kernel::now_stamp(),
        path.file_stem()
            .map_or_else(|| "kab".into(), |n| n.to_string_lossy().into_owned())
    ));
    std::fs::create_dir_all(&beside)
        .and_then(|()| std::fs::write(&copy, text))
        .map_err(|e| Error::OutputPath {
            what: "the copy of the cover-letter paragraph beside the stored runs",
            path: copy.clone(),
            option: "--db (the copy goes to its directory's kab/)",
            why: e.to_string(),
        })?;
    eprintln!(
        "cover-letter paragraph: {} (copy beside the stored runs: {})",
        path.display(),
        copy.display()
    );
    Ok(())
}

/// Whether a variant `--expect-fixed` named got another verdict (each said on stderr); a
/// variant no scenario ran is bad input.
fn misses_expected_fixed(expect_fixed: &[String], outcome: &KabOutcome) -> Result<bool, Error> {
    let mut missed = false;
    for v in expect_fixed {
        match outcome.verdict_of(v) {
            None => {
                return Err(InputError::BadValue {
                    key: "--expect-fixed".into(),
                    value: v.clone(),
                    why: format!(
                        "no scenario run has that variant (judged: {})",
                        outcome
                            .verdicts
                            .iter()
                            .map(|x| x.variant.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
                .into());
            }
            Some(verdict) if verdict.class != VariantClass::Fixed => {
                eprintln!(
                    "--expect-fixed {v}: its verdict is {}, not FIXED",
                    verdict.class.word()
                );
                missed = true;
            }
            Some(_) => {}
        }
    }
    Ok(missed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::kab::mechanism;
    use crate::kernel::build::{BuildInfo, How};
    use crate::lab::kab::{
        Change, HostSummary, StallAb, StallReps, StallSide, VariantVerdict, WallTimes,
    };

    fn stall(a: Option<usize>, b: Option<usize>, cause: &str) -> StallAb {
        let side = |n: usize| StallSide {
            stalled_reps: n,
            reps: 20,
            jiffies: [1.63, 1.71],
        };
        StallAb {
            ioctl: "KVM_SET_USER_MEMORY_REGION".into(),
            cause: cause.into(),
            a: a.map(side),
            b: b.map(side),
        }
    }

    fn verdict(variant: &str, class: VariantClass, stalls: Vec<StallAb>) -> VariantVerdict {
        let reps = |n| StallReps {
            stalled: n,
            reps: 20,
        };
        let a = usize::from(stalls.iter().any(|s| s.a.is_some())) * 20;
        let b = usize::from(stalls.iter().any(|s| s.b.is_some())) * 20;
        VariantVerdict {
            stall_reps: Some([reps(a), reps(b)]),
            stalls,
            improvements: vec![Change {
                metric: "ioctl.KVM_SET_USER_MEMORY_REGION".into(),
                unit: "jiffies".into(),
                a: 1.22,
                b: 0.062,
                within_jiffy: false,
                undeclared: false,
                tolerance: None,
            }],
            costs: vec![Change {
                metric: "ioctl.KVM_IOEVENTFD".into(),
                unit: "jiffies".into(),
                a: 0.018,
                b: 0.118,
                within_jiffy: true,
                undeclared: false,
                tolerance: None,
            }],
            ..VariantVerdict::of_class("lifecycle", variant, class)
        }
    }

    /// boot-activation stalls on both kernels: said so, with both sides' counts; "B only"
    /// appears nowhere.
    #[test]
    fn a_stall_on_both_kernels_is_named_on_both_sides() {
        let v = verdict(
            "boot-activation",
            VariantClass::NoChange,
            vec![stall(Some(19), Some(20), "KVM_IOEVENTFD")],
        );
        let text = mechanism(&v).join("\n");
        assert!(
            text.contains("stalls on both: KVM_SET_USER_MEMORY_REGION waits for the grace period of KVM_IOEVENTFD (A: 19 of 20 repetitions"),
            "{text}"
        );
        assert!(text.contains("B: 20 of 20"), "{text}");
        assert!(!text.contains("B only"), "{text}");
        assert!(
            text.contains("cost: KVM_IOEVENTFD 0.018 → 0.118 jiffies (+0.100)"),
            "{text}"
        );
    }

    /// A verdict left undecided because the host was busy says so, and nothing measured is
    /// told as a finding: no stalls on both, no cost.
    #[test]
    fn a_verdict_on_a_busy_host_says_not_judged_and_nothing_else() {
        let mut v = verdict(
            "boot-activation",
            VariantClass::NotDecided,
            vec![stall(Some(19), Some(20), "KVM_IOEVENTFD")],
        );
        v.costs.clear();
        v.host_busy = Some(vec![crate::lab::kab::BusyBoot {
            boot: 2,
            side: "B".into(),
            reasons: vec![hvlab_core::noise::BusyReason::Pressure { some_pct: 43.0 }],
        }]);
        assert_eq!(
            mechanism(&v),
            ["not judged: the host was busy during the boots (below)"]
        );
    }

    #[test]
    fn a_fixed_stall_names_its_cause_counts_and_jiffies_in_one_line() {
        let v = verdict(
            "irqchip-first",
            VariantClass::Fixed,
            vec![stall(Some(20), None, "KVM_CREATE_IRQCHIP")],
        );
        let lines = mechanism(&v);
        assert_eq!(
            lines[0],
            "KVM_SET_USER_MEMORY_REGION no longer waits for the grace period of KVM_CREATE_IRQCHIP: KVM_SET_USER_MEMORY_REGION 1.22 → 0.062 jiffies; repetitions with a stall 20 of 20 → 0 of 20"
        );
    }

    /// A REGRESSED stall says the ioctl, what it waited for on each side and by how much
    /// longer; the memory scenario's small change says its size as LKP would and that it
    /// is no verdict; a fault regression says the pages each fault maps.
    #[test]
    fn every_class_says_its_cause() {
        use crate::lab::kab::{Cause, GraceWait};
        let change = |metric: &str, unit: &str, a: f64, b: f64| Change {
            metric: metric.into(),
            unit: unit.into(),
            a,
            b,
            within_jiffy: false,
            undeclared: false,
            tolerance: None,
        };
        let mut v = verdict(
            "irqchip-first",
            VariantClass::Regressed,
            vec![stall(None, Some(20), "KVM_CREATE_IRQCHIP")],
        );
        v.improvements.clear();
        v.costs.clear();
        v.regressions = vec![change(
            "ioctl.KVM_SET_USER_MEMORY_REGION",
            "jiffies",
            0.02,
            2.0,
        )];
        v.causes = vec![Cause::GracePeriod {
            ioctl: "KVM_SET_USER_MEMORY_REGION".into(),
            waits: [
                GraceWait::Expedited { jiffies: 0.02 },
                GraceWait::Normal {
                    jiffies: 2.0,
                    started_by: Some("KVM_CREATE_IRQCHIP".into()),
                },
            ],
        }];
        let text = mechanism(&v).join("\n");
        assert!(
            text.contains("KVM_SET_USER_MEMORY_REGION now waits a normal grace period on B: +1.98 jiffies (A: expedited at most, 0.020 jiffies; B: a normal grace period started by KVM_CREATE_IRQCHIP, 2 jiffies)"),
            "{text}"
        );

        let mut lazy = verdict("lazy", VariantClass::NoChange, Vec::new());
        lazy.stall_reps = None;
        lazy.improvements.clear();
        lazy.costs.clear();
        lazy.changes = vec![Change {
            tolerance: Some(0.01),
            ..change("kvm.vcpu.pf_fixed", "count", 4096.0, 4097.0)
        }];
        assert_eq!(
            mechanism(&lazy),
            [
                "change: kvm.vcpu.pf_fixed +1 (+0.02%, 4096 → 4097), under the 1% it tolerates: a change, not a verdict"
            ]
        );

        let mut populated = verdict("populated", VariantClass::Regressed, Vec::new());
        populated.stall_reps = None;
        populated.improvements.clear();
        populated.costs.clear();
        populated.regressions = vec![change("kvm.vcpu.pf_fixed", "count", 512.0, 4097.0)];
        populated.causes = vec![Cause::PagesPerFault {
            pages: [4096, 4096],
            faults: [512.0, 4097.0],
        }];
        assert_eq!(
            mechanism(&populated),
            [
                "B worse: kvm.vcpu.pf_fixed 512 → 4097 (+700.2%): SPTE prefetch: pages mapped per fault 8 → 1.000 (4096 pages touched / kvm.vcpu.pf_fixed 512 → 4097)"
            ]
        );
    }

    #[test]
    fn the_cover_letter_names_the_hypervisor_not_its_cpuid_signature() {
        let text = markdown(&outcome(), "hvlab kab debian:7.3 debian:7.3+x.patch");
        assert!(text.contains(", under KVM)"), "{text}");
        assert!(!text.contains("KVMKVMKVM"), "{text}");
    }

    #[test]
    fn a_hunk_applied_at_an_offset_is_said_in_the_text_beside_its_side() {
        let mut o = outcome();
        if let Some(b) = o.builds[1].as_mut() {
            // GNU patch's line, as the build records it.
            b.notes = vec![BuildNote::from(crate::kernel::journal::HunkReport {
                patch: "001-lifecycle-keyed.patch".into(),
                file: "virt/kvm/kvm_main.c".into(),
                line: "Hunk #1 succeeded at 6073 (offset 3 lines)".into(),
            })];
        }
        let text = render(&o);
        assert!(
            text.contains("\n  B: 001-lifecycle-keyed.patch: virt/kvm/kvm_main.c: Hunk #1 succeeded at 6073 (offset 3 lines)\n"),
            "{text}"
        );
    }

    #[test]
    fn an_unknown_expected_variant_or_an_unwritable_cover_letter_is_refused_before_any_build() {
        let e = check_expected_variants(&["irqchip-frist".into()], &["lifecycle".into()])
            .expect_err("a typo");
        let text = e.to_string();
        assert!(text.contains("irqchip-frist"), "{text}");
        assert!(
            text.contains("irqchip-first"),
            "the known ones are listed: {text}"
        );
        check_expected_variants(&["irqchip-first".into()], &["lifecycle".into()])
            .expect("a lifecycle variant");
        let dir = tempfile::tempdir().expect("tempdir");
        let fresh = dir.path().join("cover.md");
        check_writable(&fresh, COVER_LETTER, MARKDOWN).expect("a new file in a writable directory");
        assert!(!fresh.exists(), "the check leaves nothing behind");
        let e = check_writable(
            &dir.path().join("no/such/dir/cover.md"),
            COVER_LETTER,
            MARKDOWN,
        )
        .expect_err("no dir");
        assert!(e.to_string().contains("--markdown"), "{e}");
    }

    /// A build made with --no-sandbox says so where its compiler is named, in the terminal
    /// and the cover letter alike.
    #[test]
    fn an_unsandboxed_build_says_so_beside_its_compiler() {
        let mut o = outcome();
        let sandboxed = how_built(&o.b, o.builds[1].as_ref());
        assert!(sandboxed.contains("(gcc 12.2.0, sandboxed)"), "{sandboxed}");
        if let Some(b) = o.builds[1].as_mut() {
            b.sandbox = crate::kernel::sandbox::Confinement::NoSandbox;
        }
        let unsandboxed = how_built(&o.b, o.builds[1].as_ref());
        assert!(
            unsandboxed.contains("gcc 12.2.0, NOT sandboxed (--no-sandbox)"),
            "{unsandboxed}"
        );
        assert!(markdown(&o, "hvlab kab").contains("NOT sandboxed (--no-sandbox)"));
    }

    fn outcome() -> KabOutcome {
        let kernel = |spec: &str| Kernel {
            release: "7.3.4+deb13-amd64".into(),
            spec: spec.into(),
            source: "linux-binary-7.3.4+deb13-amd64 7.3.4-1~bpo13+1".into(),
            image: PathBuf::from("/k/vmlinuz"),
            config: None,
            modules: None,
        };
        let build = |patches: Vec<build::PatchInfo>| BuildInfo {
            how: How::Modules {
                dirs: vec!["arch/x86/kvm".into()],
                modules: vec!["kvm.ko".into(), "kvm-amd.ko".into()],
            },
            source: "linux-source-7.3 7.3.4-1~bpo13+1 (Debian)".into(),
            config: build::BuildConfig::Debian {
                release: "7.3.4+deb13-amd64".into(),
                lost: Vec::new(),
            },
            compiler: "gcc 12.2.0".into(),
            patches,
            notes: Vec::new(),
            steps: vec![build::Step {
                what: "make M=arch/x86/kvm".into(),
                secs: 21.0,
            }],
            key: "k".into(),
            cached: false,
            sandbox: crate::kernel::sandbox::Confinement::Bubblewrap,
        };
        let patch = build::PatchInfo {
            file: "001-lifecycle-keyed.patch".into(),
            path: PathBuf::from("001-lifecycle-keyed.patch"),
            sha256: "b7e5481bf6ae2b65ea06ce6ba26fcb906c5d4d3d5eeb7267e7ac73b275434bda".into(),
            subjects: Vec::new(),
            files: vec!["virt/kvm/kvm_main.c".into()],
        };
        let verdicts = [
            "irqchip-first",
            "memslots-first",
            "devices-after-vcpus",
            "qemu-order",
            "firecracker-order",
            "boot-activation",
        ]
        .iter()
        .map(|v| {
            verdict(
                v,
                VariantClass::Fixed,
                vec![stall(Some(20), None, "KVM_CREATE_IRQCHIP")],
            )
        })
        .collect();
        KabOutcome {
            hvlab_version: "0.1.0 (abc)".into(),
            a: kernel("debian:7.3"),
            b: kernel("debian:7.3+001-lifecycle-keyed.patch"),
            builds: [Some(build(Vec::new())), Some(build(vec![patch]))],
            build_steps: Vec::new(),
            notes: Vec::new(),
            accel: vm::AccelChoice {
                accel: Accel::Tcg,
                cpu_model: "EPYC,+svm,+npt".into(),
                vendor_module: "kvm_amd".into(),
                why: "accel: tcg".into(),
                clock: Default::default(),
            },
            host: HostSummary {
                kernel: "6.18".into(),
                cpu: "AMD EPYC".into(),
                cores: 2,
                hypervisor: Some("KVMKVMKVM".into()),
            },
            scenario_names: vec!["lifecycle".into()],
            boots_per_side: 2,
            reps: 10,
            boots: Vec::new(),
            scenarios: Vec::new(),
            verdicts,
            regression: false,
            inconclusive: 0,
            wall: WallTimes {
                build_s: 60.0,
                boots_s: 30.0,
                total_s: 90.0,
            },
            wall_s: 90.0,
            prediction: Some(prediction()),
            memory_prediction: None,
        }
    }

    /// The model's prediction of the 001 fix: on this host by hand (a calibrated guest is
    /// not at hand in a unit test), on the reporter's host from the model itself.
    fn prediction() -> kab::KabPrediction {
        use crate::lab::fidelity::patch::strategy_for;
        use crate::lab::fidelity::srcu::on_reporters_host;
        let host = hvlab_host::probe::probe_with("model".into(), Default::default());
        let strategies = [
            strategy_for("7.3.4+deb13-amd64", &[], None).ok(),
            strategy_for("7.3.4+deb13-amd64", &[], Some("lifecycle-keyed")).ok(),
        ];
        let reporter = |i: usize| {
            let s = strategies[i].as_ref().map(|s| s.strategy()).unwrap();
            on_reporters_host(&host, s, 1).unwrap()
        };
        let variant = |name: &str, stalls: [f64; 2], agrees: bool| kab::VariantPrediction {
            variant: name.into(),
            stalls,
            waits: Vec::new(),
            agrees: [Some(agrees), Some(true)],
        };
        kab::KabPrediction {
            label: "predicted",
            strategies: strategies.clone(),
            unknown: Vec::new(),
            this_host: Some(kab::ThisHostPrediction {
                profile: "calibrated 7.3.4+deb13-amd64 under tcg".into(),
                profile_path: PathBuf::from("/c/7.3.4-tcg.toml"),
                calibrated_now: false,
                variants: vec![
                    variant("irqchip-first", [1.0, 0.0], false),
                    variant("boot-activation", [1.0, 1.0], true),
                ],
                rows: [Vec::new(), Vec::new()],
            }),
            this_host_missing: None,
            reporters_host: Some([reporter(0), reporter(1)]),
        }
    }

    /// What a changelog can quote: short, with the patch's hash, the host, the table, a marked
    /// place for the model's prediction and the command that reproduces it.
    #[test]
    fn the_cover_letter_paragraph_fits_25_lines_and_says_how_to_reproduce() {
        let text = markdown(
            &outcome(),
            "hvlab kab debian:7.3 debian:7.3+001-lifecycle-keyed.patch",
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.len() <= 25, "{} lines:\n{text}", lines.len());
        for needle in [
            "`001-lifecycle-keyed.patch` (sha256 `b7e5481bf6ae2b65`)",
            "AMD EPYC",
            "TCG",
            "| irqchip-first | **FIXED** | 20/20 → 0/20 |",
            "KVM_IOEVENTFD 0.018 → 0.118 jiffies",
            "Model prediction (hvlab's model; predicted, not measured):",
            "- here (base calibrated in its guest): stalls A → B irqchip-first 1 → 0, boot-activation 1 → 1; agrees with the measurement in 3 of 4",
            "- where thread 001 saw the bug (`x86-vmx-hz100`",
            "ms per VM creation)",
            "Reproduce: `hvlab kab debian:7.3 debian:7.3+001-lifecycle-keyed.patch` (hvlab 0.1.0 (abc))",
        ] {
            assert!(text.contains(needle), "no `{needle}` in:\n{text}");
        }
    }

    /// The answer comes first: the tally and a line per variant before anything else.
    #[test]
    fn the_first_lines_carry_the_verdicts() {
        let text = render(&outcome());
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines[0].starts_with("kab: B against A, FIXED 6 of 6 variant(s)"),
            "{}",
            lines[0]
        );
        assert!(lines[1].trim_start().starts_with("FIXED"), "{}", lines[1]);
        assert!(
            lines.iter().take(20).any(|l| l.contains("boot-activation")),
            "{text}"
        );
    }

    /// Beside the measured verdicts, the model's prediction of the same change, labelled
    /// predicted: here (with where it differs from the measurement) and where thread 001 saw
    /// the bug, with what the change saves per VM creation there.
    #[test]
    fn the_prediction_follows_the_measured_verdicts_labelled_as_predicted() {
        let text = render(&outcome());
        assert!(
            text.lines()
                .next()
                .unwrap()
                .contains("(measured: lifecycle"),
            "{text}"
        );
        let at = text
            .find("predicted by the model (not measured):")
            .expect(&text);
        let after = &text[at..];
        assert!(after.contains("strategies: A always-defer"), "{after}");
        assert!(
            after.contains("on this host, under tcg (A calibrated in its guest, cached"),
            "{after}"
        );
        assert!(
            after.contains("irqchip-first        stalls 1 → 0; DIFFERS from the measurement on A"),
            "{after}"
        );
        assert!(after.contains("on x86-vmx-hz100 ("), "{after}");
        // About 20 ms saved per VM creation where the regression was reported.
        let saved: f64 = after
            .split("(−")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|n| n.parse().ok())
            .expect(after);
        assert!((15.0..25.0).contains(&saved), "{saved}: {after}");
    }

    /// The 004 revert under the default TDP MMU, as a kab stored it. The
    /// text, the cover letter and the JSON say NOT EXERCISED with the calls on each side and
    /// the legacy MMU's `--kvm-param`; the headline never says "no regression", and the gate
    /// passes.
    #[test]
    fn a_patch_that_never_ran_is_said_not_exercised_with_its_calls_everywhere() {
        use crate::lab::kab::fixture;
        let runs = fixture::not_exercised_runs();
        let (a, b) = (fixture::side(&runs, "A"), fixture::side(&runs, "B"));
        let judged = kab::judge(
            &["memory".to_string()],
            &["populated".to_string()],
            [
                kab::SideRuns {
                    runs: &a,
                    failed_commands: &[],
                },
                kab::SideRuns {
                    runs: &b,
                    failed_commands: &[],
                },
            ],
            crate::kernel::vm::Accel::Tcg,
            0.05,
        );
        let o = KabOutcome {
            scenario_names: vec!["memory".into()],
            ..dirty_outcome(judged)
        };
        let text = render(&o);
        let first = text.lines().next().unwrap();
        assert!(
            first.starts_with("kab: B against A, NOT EXERCISED 1 of 1 variant(s)")
                && first.contains("the patched code never ran in any variant")
                && !first.contains("no regression"),
            "{first}"
        );
        assert!(
            text.contains("NOT EXERCISED populated  the patched code never ran on either kernel, so this variant cannot show the patch: __direct_pte_prefetch 0 → 0 calls\n"),
            "{text}"
        );
        assert!(
            text.contains("the legacy MMU reaches it: --kvm-param kvm.tdp_mmu=N"),
            "{text}"
        );
        let md = markdown(&o, "hvlab kab debian:7.3 debian:7.3+revert.patch");
        assert!(
            md.contains("| populated | **NOT EXERCISED** |")
                && md.contains("__direct_pte_prefetch 0 → 0 calls; the legacy MMU reaches it: --kvm-param kvm.tdp_mmu=N"),
            "{md}"
        );
        let json = serde_json::to_string(&o).unwrap();
        assert!(json.contains("\"class\":\"NOT EXERCISED\""), "{json}");
        assert!(json.contains("\"via_callers\":false,\"calls\":0"), "{json}");
        assert_eq!(kab_exit_code(true, &[], &o).unwrap(), 0);
    }

    /// `outcome()`'s kab, with the dirty scenario judged from `judged` and the boots quiet.
    fn dirty_outcome(judged: Vec<kab::ScenarioAb>) -> KabOutcome {
        let j = kab::judgement(&judged, &[]);
        KabOutcome {
            scenario_names: vec!["dirty".into()],
            scenarios: judged,
            verdicts: j.verdicts,
            regression: j.regression,
            inconclusive: j.inconclusive,
            prediction: None,
            memory_prediction: None,
            ..outcome()
        }
    }

    /// B's dirty log lost a page per pass, so every dirty variant failed on B. The
    /// table has every variant, REGRESSED with B's own words; the headline says REGRESSION,
    /// and `--fail-on-regression` exits 1 (it exited 0 under "of 0 variant(s) … no regression").
    #[test]
    fn a_patch_that_loses_a_dirty_page_is_regressed_and_fails_the_gate() {
        use crate::lab::kab::fixture;
        let runs = fixture::runs();
        let (a, b) = (fixture::side(&runs, "A"), fixture::side(&runs, "B"));
        let o = dirty_outcome(fixture::judged(&a, &b, [&[], &[]]));
        let text = render(&o);
        let first = text.lines().next().unwrap();
        assert!(
            first.starts_with("kab: B against A, REGRESSED 3 of 3 variant(s)")
                && first.ends_with("; REGRESSION"),
            "{first}"
        );
        for variant in ["bitmap", "clear", "ring"] {
            let line = text
                .lines()
                .find(|l| l.contains(&format!(" {variant} ")))
                .expect(&text);
            assert!(line.trim_start().starts_with("REGRESSED"), "{line}");
            assert!(
                line.ends_with(&format!("B failed: {}; A ran it", fixture::LOST)),
                "{line}"
            );
        }
        assert_eq!(kab_exit_code(true, &[], &o).unwrap(), 1);
        assert_eq!(kab_exit_code(false, &[], &o).unwrap(), 0);
        // No boot in this outcome: no range of times to the first command is made up.
        assert!(text.contains("boots: 0 in 30.0 s; wall time"), "{text}");
        let md = markdown(&o, "hvlab kab debian:7.3 debian:7.3+drop.patch");
        assert!(
            md.contains(&format!(
                "| ring | **REGRESSED** | – | – | B failed: {}; A ran it |",
                fixture::LOST
            )),
            "{md}"
        );
    }

    /// Both kernels failed the variant: NOT DECIDED with both failures, and the headline does
    /// not claim "no regression" when nothing was decided.
    #[test]
    fn a_variant_failing_on_both_kernels_says_both_failures_and_no_no_regression() {
        use crate::lab::kab::fixture;
        let runs = fixture::runs();
        let mut a = fixture::side(&runs, "A");
        for r in &mut a {
            for v in &mut r.variants {
                v.status = crate::record::VariantStatus::Failed("the guest shut down".into());
                v.metrics.clear();
            }
        }
        let b = fixture::side(&runs, "B");
        let o = dirty_outcome(fixture::judged(&a, &b, [&[], &[]]));
        let text = render(&o);
        let first = text.lines().next().unwrap();
        assert!(!first.contains("no regression"), "{first}");
        assert!(first.contains("nothing decided"), "{first}");
        assert!(
            text.contains("NOT DECIDED  bitmap  A failed: the guest shut down"),
            "{text}"
        );
        assert!(
            text.contains(&format!("B failed: {}", fixture::LOST)),
            "{text}"
        );
        assert_eq!(kab_exit_code(true, &[], &o).unwrap(), 0);
    }

    /// B's guest command produced no run at all: never "no regression". With its exit named,
    /// the variants A ran are REGRESSED; with no side bringing a run back, nothing is judged
    /// and the headline says so.
    #[test]
    fn a_side_with_no_run_never_reads_as_no_regression() {
        use crate::lab::kab::fixture;
        let runs = fixture::runs();
        let a = fixture::side(&runs, "A");
        let crashed = fixture::b_command_failed("error: the results database is locked\n");
        let o = dirty_outcome(fixture::judged(
            &a,
            &[],
            [&[], std::slice::from_ref(&crashed)],
        ));
        let text = render(&o);
        assert!(
            text.lines().next().unwrap().ends_with("; REGRESSION"),
            "{text}"
        );
        assert!(
            text.contains("B brought no run of it back (`hvlab run dirty --reps 4 --json` exited 4: error: the results database is locked); A ran it"),
            "{text}"
        );
        assert_eq!(kab_exit_code(true, &[], &o).unwrap(), 1);
        for o in [
            dirty_outcome(fixture::judged(&[], &[], [&[], &[]])),
            dirty_outcome(Vec::new()),
        ] {
            let first = render(&o).lines().next().unwrap().to_string();
            assert!(!first.contains("no regression"), "{first}");
            assert!(first.contains("nothing"), "{first}");
            assert_eq!(kab_exit_code(true, &[], &o).unwrap(), 0);
        }
    }
}
