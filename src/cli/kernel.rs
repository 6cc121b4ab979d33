//! `hvlab vm` and `hvlab kab`: kernels under test booted in QEMU, and their A/B.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::analysis::compare::AbVerdict;
use crate::error::{Error, InputError};
use crate::kernel::vm::{self, Accel, Boot, VmConfig, VmError};
use crate::kernel::{self, Kernel};
use crate::lab::kab::{self, MetricAb, ScenarioAb, Trust};
use crate::record::RunRecord;
use crate::scenario;
use crate::store::{self, Store};

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
            cpus: self.cpus,
            mem_mib: mib,
            kvm_params: self.kvm_params.clone(),
            cmd_timeout: Duration::from_secs(self.timeout.max(1)),
        })
    }
}

/// `hvlab vm`.
#[derive(Debug, Args)]
pub struct VmArgs {
    /// The kernel: debian:VERSION, a bzImage (with --modules), a build tree, an unpacked package
    #[arg(long, value_name = "SPEC")]
    kernel: String,
    /// Modules for a bzImage: DIR/lib/modules/RELEASE (`make modules_install INSTALL_MOD_PATH=DIR`)
    #[arg(long, value_name = "DIR")]
    modules: Option<PathBuf>,
    #[command(flatten)]
    boot: BootArgs,
    /// More hvlab commands for the same boot, one argument list per line (after the one given)
    #[arg(long, value_name = "FILE")]
    commands: Option<PathBuf>,
    /// Write each command's N.out, N.err, N.rc here
    #[arg(long, value_name = "DIR")]
    results: Option<PathBuf>,
    /// The hvlab command to run in the VM
    #[arg(last = true, value_name = "HVLAB-ARGS")]
    args: Vec<String>,
}

/// `hvlab kab`.
#[derive(Debug, Args)]
pub struct KabArgs {
    /// The baseline kernel (SPEC as for `hvlab vm --kernel`)
    base: String,
    /// The patched kernel
    patched: String,
    /// Scenario to run (repeatable) [default: lifecycle]
    #[arg(long = "scenario", value_name = "S")]
    scenarios: Vec<String>,
    /// Variant to run (repeatable) [default: all]
    #[arg(long = "variant", value_name = "V")]
    variants: Vec<String>,
    /// Scenario parameter key=value (repeatable)
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Boots per kernel, in ABBA order
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=50))]
    boots: u32,
    /// Repetitions per variant in each boot
    // 10, so 20 per side with the default boots: two emulator hiccups on one side sink a rank
    // test over 6 per side, and a repetition costs far less than a boot.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    reps: u32,
    /// Smallest change that counts for judged jiffies and times
    #[arg(long, default_value = "5%")]
    threshold: String,
    /// Exit 1 when B regressed on a judged metric
    #[arg(long)]
    fail_on_regression: bool,
    /// One JSON document on stdout
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    boot: BootArgs,
}

fn logs_dir(release: &str) -> PathBuf {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    kernel::cache_dir()
        .join("logs")
        .join(format!("{stamp}-{release}-{}", std::process::id()))
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

/// `hvlab vm`.
pub fn vm(db: Option<&Path>, args: &VmArgs) -> Result<ExitCode, Error> {
    let cfg = args.boot.config()?;
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
    let mut store = open_store(db)?;
    vm::qemu()?;
    let kernel = kernel::resolve(&args.kernel, args.modules.as_deref()).map_err(VmError::from)?;
    eprintln!("kernel: {}", describe(&kernel));
    eprintln!("{}", vm::choose_accel(cfg.accel)?.why);
    let dir = logs_dir(&kernel.release);
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

/// `hvlab kab`.
pub fn kab(db: Option<&Path>, args: &KabArgs) -> Result<ExitCode, Error> {
    let cfg = args.boot.config()?;
    let threshold = crate::lab::compare::parse_threshold(&args.threshold)?;
    let scenarios = if args.scenarios.is_empty() {
        vec!["lifecycle".to_string()]
    } else {
        args.scenarios.clone()
    };
    let mut store = open_store(db)?;
    vm::qemu()?;
    let kernels = [
        kernel::resolve(&args.base, None).map_err(VmError::from)?,
        kernel::resolve(&args.patched, None).map_err(VmError::from)?,
    ];
    let choice = vm::choose_accel(cfg.accel)?;
    eprintln!(
        "A: {}\nB: {}\n{}",
        describe(&kernels[0]),
        describe(&kernels[1]),
        choice.why
    );
    // --variant and --set go to the scenarios that have them; each must fit at least one.
    let infos = scenarios
        .iter()
        .map(|s| scenario::find(s))
        .collect::<Result<Vec<_>, _>>()?;
    let key_of = |kv: &str| kv.split_once('=').map_or(kv, |(k, _)| k).to_string();
    let has_param = |info: &scenario::ScenarioInfo, kv: &str| {
        let key = key_of(kv);
        key.starts_with("guest.") || info.has_param(&key)
    };
    let has_variant =
        |info: &scenario::ScenarioInfo, v: &str| info.variants.iter().any(|x| x.name == v);
    for kv in &args.sets {
        if !infos.iter().any(|i| has_param(i, kv)) {
            return Err(InputError::BadValue {
                key: "--set".into(),
                value: kv.clone(),
                why: format!(
                    "no scenario of {} has that parameter; `hvlab list` shows them",
                    scenarios.join(", ")
                ),
            }
            .into());
        }
    }
    for v in &args.variants {
        if !infos.iter().any(|i| has_variant(i, v)) {
            return Err(InputError::BadValue {
                key: "--variant".into(),
                value: v.clone(),
                why: format!(
                    "no scenario of {} has that variant; `hvlab list` shows them",
                    scenarios.join(", ")
                ),
            }
            .into());
        }
    }
    let commands: Vec<Vec<String>> = infos
        .iter()
        .map(|info| {
            let mut c = vec![
                "run".to_string(),
                info.name.to_string(),
                "--reps".into(),
                args.reps.to_string(),
                "--warmup".into(),
                "1".into(),
                "--json".into(),
            ];
            for v in args.variants.iter().filter(|v| has_variant(info, v)) {
                c.extend(["--variant".to_string(), v.clone()]);
            }
            for kv in args.sets.iter().filter(|kv| has_param(info, kv)) {
                c.extend(["--set".to_string(), kv.clone()]);
            }
            c
        })
        .collect();
    let mut sides: [Vec<RunRecord>; 2] = [Vec::new(), Vec::new()];
    let mut boots = Vec::new();
    let order = kab::abba(args.boots);
    let start = std::time::Instant::now();
    for (i, &side) in order.iter().enumerate() {
        let k = &kernels[side];
        let name = ["A", "B"][side];
        eprintln!("boot {}/{}: {name} {}", i + 1, order.len(), k.release);
        let (boot, failure) = vm::boot(k, &cfg, &commands, &logs_dir(&k.release))?;
        eprintln!(
            "  {:.1} s to the first command, {:.1} s in all; {}",
            boot.to_first_command_s.unwrap_or(f64::NAN),
            boot.wall_s,
            keep(&mut store, &boot)?
        );
        for c in &boot.commands {
            if c.rc != Some(0) {
                eprintln!(
                    "  hvlab {}: exit {:?}\n{}",
                    c.args.join(" "),
                    c.rc,
                    c.stderr.trim_end()
                );
            }
        }
        sides[side].extend(boot.runs.iter().cloned());
        boots.push(serde_json::json!({
            "side": name, "release": boot.release, "to_first_command_s": boot.to_first_command_s,
            "wall_s": boot.wall_s, "console": boot.console,
        }));
        if let Some(f) = failure {
            return Err(f.into());
        }
    }
    let judged = kab::judge(&scenarios, &sides[0], &sides[1], choice.accel, threshold);
    let regression = judged
        .iter()
        .flat_map(|s| &s.variants)
        .flat_map(|v| &v.metrics)
        .any(|m| m.regression);
    let inconclusive = judged
        .iter()
        .flat_map(|s| &s.variants)
        .flat_map(|v| &v.metrics)
        .filter(|m| m.inconclusive.is_some())
        .count();
    if args.json {
        crate::cli::print_json(&serde_json::json!({
            "a": kernels[0], "b": kernels[1], "accel": choice, "boots": boots,
            "wall_s": start.elapsed().as_secs_f64(), "scenarios": judged, "regression": regression,
            "inconclusive": inconclusive,
        }))?;
    } else {
        println!(
            "{}",
            render(&kernels, &choice, &judged, start.elapsed().as_secs_f64())
        );
    }
    Ok(if args.fail_on_regression && regression {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn verdict_word(v: AbVerdict) -> &'static str {
    match v {
        AbVerdict::Faster => "B shorter",
        AbVerdict::Slower => "B longer",
        AbVerdict::NoChange => "no significant change",
        AbVerdict::TooFew => "too few samples for the rank test",
    }
}

fn spread(x: &[f64]) -> String {
    let lo = x.iter().copied().fold(f64::MAX, f64::min);
    let hi = x.iter().copied().fold(f64::MIN, f64::max);
    format!("{}–{}", num(lo), num(hi))
}

fn num(v: f64) -> String {
    if v.abs() >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn side_text(m: &MetricAb, i: usize) -> String {
    format!(
        "{} {} (range {}, n = {})",
        num(m.median[i]),
        m.unit,
        spread(&m.samples[i]),
        m.samples[i].len()
    )
}

fn render(
    kernels: &[Kernel; 2],
    choice: &vm::AccelChoice,
    judged: &[ScenarioAb],
    wall: f64,
) -> String {
    let mut out = vec![
        format!("A = {}", describe(&kernels[0])),
        format!("B = {}", describe(&kernels[1])),
        choice.why.clone(),
    ];
    for s in judged {
        out.push(format!(
            "\n{}: {} run(s) on A, {} on B",
            s.scenario,
            s.runs[0].len(),
            s.runs[1].len()
        ));
        let mut same = 0;
        let mut quiet = 0;
        let mut varying = 0;
        let mut timing_counts = 0;
        let mut why_not: Option<String> = None;
        for v in &s.variants {
            let mut lines = Vec::new();
            let mut same_here: Vec<String> = Vec::new();
            for m in &v.metrics {
                match m.trust {
                    Trust::Count => {
                        let word = m.exact.as_deref().unwrap_or("");
                        if m.not_judged.is_some() {
                            timing_counts += 1;
                        } else if word == "same" {
                            same += 1;
                            same_here.push(format!("{} {}", m.metric, num(m.median[0])));
                        } else if word.starts_with("varies") && m.inconclusive.is_none() {
                            varying += 1;
                        } else {
                            let tag = if m.regression {
                                format!("REGRESSION: {word}")
                            } else if m.inconclusive.is_some() {
                                format!("INCONCLUSIVE: {word}")
                            } else {
                                word.to_string()
                            };
                            lines.push(format!(
                                "    [count: {tag}] {}: A {} → B {}",
                                m.metric,
                                side_text(m, 0),
                                side_text(m, 1)
                            ));
                        }
                    }
                    Trust::Jiffies => {
                        let c = m.comparison.as_ref();
                        let verdict = match c {
                            Some(_) if m.inconclusive.is_some() => "B higher, not established",
                            Some(c) => verdict_word(c.verdict),
                            None => "not judged",
                        };
                        let p = c.map_or(String::new(), |c| {
                            format!(
                                ", rank test p = {:.3}, 95% CI of the ratio {:.2}–{:.2}",
                                c.p_value, c.ci95[0], c.ci95[1]
                            )
                        });
                        let significant = c.is_some_and(|c| {
                            c.verdict != AbVerdict::NoChange && c.verdict != AbVerdict::TooFew
                        });
                        if m.median[0].max(m.median[1]) < 0.5 && !significant {
                            quiet += 1;
                            continue;
                        }
                        let tag = if m.regression {
                            "REGRESSION, jiffies"
                        } else if m.inconclusive.is_some() {
                            "INCONCLUSIVE, jiffies"
                        } else {
                            "jiffies"
                        };
                        let note = m
                            .not_judged
                            .as_ref()
                            .map_or(String::new(), |n| format!("; {n}"));
                        lines.push(format!(
                            "    [{tag}: {verdict}{p}{note}] {}: A {} → B {}",
                            m.metric,
                            side_text(m, 0),
                            side_text(m, 1)
                        ));
                    }
                    Trust::Time => {
                        let headline = scenario::find(&s.scenario)
                            .map(|i| i.headline)
                            .unwrap_or("");
                        if let Some(why) = &m.not_judged {
                            why_not = Some(why.clone());
                            if m.metric == headline {
                                lines.push(format!(
                                    "    [time, shown, not judged] {}: A {} → B {}",
                                    m.metric,
                                    side_text(m, 0),
                                    side_text(m, 1)
                                ));
                            }
                        } else if let Some(c) = &m.comparison
                            && (m.metric == headline || m.regression)
                        {
                            lines.push(format!(
                                "    [time: {}{}] {}: A {} → B {}",
                                verdict_word(c.verdict),
                                format_args!(", p = {:.3}", c.p_value),
                                m.metric,
                                side_text(m, 0),
                                side_text(m, 1)
                            ));
                        }
                    }
                }
            }
            for c in &v.causes {
                lines.push(format!("    cause (B only): {c}"));
            }
            if !same_here.is_empty() {
                // Fault counts first: they are what a paging change moves.
                same_here.sort_by_key(|t| !(t.contains("pf_") || t.contains("fault")));
                let shown: Vec<&str> = same_here.iter().take(6).map(String::as_str).collect();
                let more = same_here.len().saturating_sub(shown.len());
                let tail = if more > 0 {
                    format!(" (+{more} more)")
                } else {
                    String::new()
                };
                lines.push(format!(
                    "    [count, exact: same on both, every repetition] {}{tail}",
                    shown.join(", ")
                ));
            }
            if !lines.is_empty() {
                out.push(format!("  {}:", v.variant));
                out.extend(lines);
            }
        }
        out.push(format!(
            "  counts: {same} exactly the same on both kernels, {varying} varying between repetitions with no significant change; {timing_counts} timing-driven counters (timer interrupts, preemptions) shown in --json, not judged under TCG"
        ));
        out.push(format!(
            "  jiffies: {quiet} ioctl time(s) under half a jiffy on both kernels with no significant change"
        ));
        if let Some(why) = why_not {
            out.push(format!("  times are shown, not judged: {why}"));
        }
    }
    let regressions: Vec<String> = judged
        .iter()
        .flat_map(|s| {
            s.variants.iter().flat_map(move |v| {
                v.metrics.iter().filter(|m| m.regression).map(move |m| {
                    let unit = if m.trust == Trust::Jiffies {
                        "jiffies"
                    } else {
                        m.unit.as_str()
                    };
                    format!("{} {} {} ({unit})", s.scenario, v.variant, m.metric)
                })
            })
        })
        .collect();
    let undecided: Vec<String> = judged
        .iter()
        .flat_map(|s| {
            s.variants.iter().flat_map(move |v| {
                v.metrics.iter().filter_map(move |m| {
                    m.inconclusive
                        .as_ref()
                        .map(|why| format!("{} {} {}: {why}", s.scenario, v.variant, m.metric))
                })
            })
        })
        .collect();
    out.push(String::new());
    if regressions.is_empty() {
        out.push(if undecided.is_empty() {
            "verdict: no regression of a judged metric (counts exact, jiffies rank-tested)".into()
        } else {
            // Not "no regression": B looked worse and the samples could not say whether it is.
            format!(
                "verdict: INCONCLUSIVE, no regression shown, but {} judged metric(s) higher on B than the samples can separate from noise:",
                undecided.len()
            )
        });
    } else {
        out.push(format!(
            "verdict: REGRESSION in B on {} judged metric(s):",
            regressions.len()
        ));
        for r in regressions.iter().take(12) {
            out.push(format!("  {r}"));
        }
        if !undecided.is_empty() {
            out.push(format!(
                "and {} judged metric(s) higher on B, inconclusive with these samples:",
                undecided.len()
            ));
        }
    }
    for u in undecided.iter().take(12) {
        out.push(format!("  {u}"));
    }
    out.push(format!("A/B wall time: {wall:.0} s"));
    out.join("\n")
}
