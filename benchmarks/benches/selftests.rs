//! The KVM selftests beside hvlab on this host: builds `demand_paging_test`
//! and `dirty_log_perf_test` from Debian's `linux-source` package when asked, runs each and
//! hvlab's matching variant in alternating rounds, and writes the side-by-side table.
//!
//! ```sh
//! cargo bench -p hvlab-bench --bench selftests -- --build             # fetch, build, run 3 rounds
//! cargo bench -p hvlab-bench --bench selftests -- --rounds 5 --size-mib 256
//! ```
//!
//! Without `--build` and with no selftests built in hvlab's cache it says how and exits 0:
//! building costs a ~150 MiB download and a few minutes. Pairs:
//! - `demand_paging_test -u MISSING` against `hvlab run memory --variant uffd` (4 KiB guest
//!   pages, guest at CPL0 as the selftest's is, one UFFDIO_COPY per page);
//! - `dirty_log_perf_test` (manual protect, one clear over the slot) against
//!   `hvlab run dirty --variant clear` with the same chunk (one `KVM_CLEAR_DIRTY_LOG`).
//!
//! Where CPL0 is emulated (PVM), time follows the instructions each guest loop executes per
//! page, so the table gives those counts too: the selftest's from its disassembly
//! (`objdump`), hvlab's from its own payload (iced-x86).
#![allow(clippy::print_stdout)] // a benchmark's output is its report

use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use serde_json::Value;

#[derive(Parser, Debug)]
#[command(about = "The KVM selftests beside hvlab on this host")]
struct Args {
    /// Fetch linux-source-SERIES from Debian and build the two selftests if they are missing.
    #[arg(long)]
    build: bool,
    /// Debian's kernel source series.
    #[arg(long, default_value = "6.12")]
    series: String,
    /// Alternating rounds (selftest, then hvlab) per pair.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Guest memory per run, MiB (a multiple of 2).
    #[arg(long, default_value_t = 64)]
    size_mib: u64,
    /// Dirtying passes per dirty-log run.
    #[arg(long, default_value_t = 3)]
    passes: u32,
    /// Where the Markdown table goes [default: selftests-side-by-side.md in the workspace's
    /// target directory].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Print only the instructions per page of each guest loop, without running anything.
    #[arg(long)]
    loops_only: bool,
    /// Passed by `cargo bench`.
    #[arg(long, hide = true)]
    bench: bool,
}

/// One measured quantity per round on both sides, in microseconds.
struct Row {
    what: &'static str,
    selftest: Vec<f64>,
    hvlab: Vec<f64>,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("selftests bench: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    if args.size_mib == 0 || !args.size_mib.is_multiple_of(2) {
        return Err(format!(
            "--size-mib {} is not a positive multiple of 2",
            args.size_mib
        ));
    }
    if args.rounds == 0 {
        return Err("--rounds must be at least 1".into());
    }
    let Some(dir) = selftests_dir(args)? else {
        println!(
            "selftests bench: no KVM selftests built in {}; run `cargo bench -p hvlab-bench --bench selftests -- --build` to fetch linux-source-{} from Debian (~150 MiB) and build them (a few minutes)",
            cache_tree(&args.series).display(),
            args.series
        );
        return Ok(());
    };
    if args.loops_only {
        println!("{}", loop_sentence(&dir));
        return Ok(());
    }
    let mut rows = vec![
        Row {
            what: "uffd MISSING demand paging, µs per page",
            selftest: vec![],
            hvlab: vec![],
        },
        Row {
            what: "dirtying pass (write-protect faults), µs per page",
            selftest: vec![],
            hvlab: vec![],
        },
        Row {
            what: "KVM_GET_DIRTY_LOG per pass, µs",
            selftest: vec![],
            hvlab: vec![],
        },
        Row {
            what: "KVM_CLEAR_DIRTY_LOG per pass, µs",
            selftest: vec![],
            hvlab: vec![],
        },
    ];
    for round in 1..=args.rounds {
        eprintln!("selftests bench: round {round} of {}", args.rounds);
        demand_round(args, &dir, &mut rows[0])?;
        dirty_round(args, &dir, &mut rows[1..])?;
    }
    let loops = loop_sentence(&dir);
    let table = render(args, &rows, &loops, &host());
    println!("{table}");
    let out = match &args.out {
        Some(path) => path.clone(),
        None => hvlab_bench::target_dir()?.join("selftests-side-by-side.md"),
    };
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    std::fs::write(&out, &table).map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!("selftests bench: wrote {}", out.display());
    Ok(())
}

/// One round of demand paging: the selftest's rate beside hvlab's uffd pass, µs per page.
fn demand_round(args: &Args, dir: &Path, row: &mut Row) -> Result<(), String> {
    let size = format!("{}MiB", args.size_mib);
    let demand = tool(
        &dir.join("demand_paging_test"),
        &["-u", "MISSING", "-b", &format!("{}M", args.size_mib)],
    )?;
    let rate = field(&demand, "Overall demand paging rate:")
        .ok_or("demand_paging_test printed no overall rate")?;
    row.selftest.push(1e6 / rate);
    let memory = hvlab(&[
        "run",
        "memory",
        "--variant",
        "uffd",
        "--set",
        &format!("size={size}"),
        "--set",
        "guest_page=4k",
        "--set",
        "guest.cpl=0",
    ])?;
    row.hvlab
        .push(median(&memory, "uffd", "ns_per_page")? / 1e3);
    Ok(())
}

/// One round of dirty logging: the dirtying pass, `KVM_GET_DIRTY_LOG` and
/// `KVM_CLEAR_DIRTY_LOG`, the selftest's beside hvlab's `clear` variant (`rows`: those three).
fn dirty_round(args: &Args, dir: &Path, rows: &mut [Row]) -> Result<(), String> {
    let pages = args.size_mib * 256;
    let size = format!("{}MiB", args.size_mib);
    let dirty = tool(
        &dir.join("dirty_log_perf_test"),
        &[
            "-b",
            &format!("{}M", args.size_mib),
            "-i",
            &args.passes.to_string(),
        ],
    )?;
    let passes: Vec<f64> = (1..=args.passes)
        .filter_map(|i| field(&dirty, &format!("Iteration {i} dirty memory time:")))
        .collect();
    if passes.is_empty() {
        return Err("dirty_log_perf_test printed no dirtying pass".into());
    }
    #[allow(clippy::cast_precision_loss)] // page counts are far below 2^52
    let per_page = passes.iter().sum::<f64>() / passes.len() as f64 / pages as f64;
    rows[0].selftest.push(per_page * 1e6);
    rows[1]
        .selftest
        .push(average(&dirty, "Get dirty log over").ok_or("no get-log time")? * 1e6);
    rows[2]
        .selftest
        .push(average(&dirty, "Clear dirty log over").ok_or("no clear-log time")? * 1e6);
    let clear = hvlab(&[
        "run",
        "dirty",
        "--variant",
        "clear",
        "--set",
        &format!("size={size}"),
        "--set",
        &format!("passes={}", args.passes),
        "--set",
        &format!("chunk={pages}"),
        "--set",
        "guest.cpl=0",
    ])?;
    rows[0]
        .hvlab
        .push(median(&clear, "clear", "dirty_ns_per_page")? / 1e3);
    rows[1].hvlab.push(median(&clear, "clear", "get_ms")? * 1e3);
    rows[2]
        .hvlab
        .push(median(&clear, "clear", "clear_ms")? * 1e3);
    Ok(())
}

/// What each guest loop executes per page, as one sentence for the table.
fn loop_sentence(dir: &Path) -> String {
    let ours = hvlab_loop_instructions();
    format!(
        "Instructions per page on each guest's path (static count of the loop body and what it calls; at CPL0 on PVM each is emulated): the selftests' memstress_guest_code {} (both tests); hvlab's memory touch loop {}, its dirty pass loop {}.",
        selftest_loop_instructions(&dir.join("dirty_log_perf_test"))
            .map_or_else(|e| format!("unknown ({e})"), |n| n.to_string()),
        ours.as_ref()
            .map_or_else(|e| format!("unknown ({e})"), |(t, _)| t.to_string()),
        ours.as_ref()
            .map_or_else(|e| format!("unknown ({e})"), |(_, d)| d.to_string()),
    )
}

fn cache_tree(series: &str) -> PathBuf {
    hvlab::kernel::cache_dir()
        .join("sources")
        .join(format!("linux-source-{series}"))
}

/// The selftests' directory with both tests built, building them when asked.
fn selftests_dir(args: &Args) -> Result<Option<PathBuf>, String> {
    let tree = cache_tree(&args.series);
    let dir = tree.join("tools/testing/selftests/kvm");
    let built = |d: &Path| {
        d.join("demand_paging_test").is_file() && d.join("dirty_log_perf_test").is_file()
    };
    if built(&dir) {
        return Ok(Some(dir));
    }
    if !args.build {
        return Ok(None);
    }
    let tree =
        hvlab::kernel::debian::fetch_source(&args.series, &Steps).map_err(|e| e.to_string())?;
    if !tree.join("usr/include/linux/kvm.h").is_file() {
        eprintln!("selftests bench: make headers in {}", tree.display());
        make(&tree, &["-s", "headers"])?;
    }
    let targets: Vec<String> = ["demand_paging_test", "dirty_log_perf_test"]
        .iter()
        .map(|t| dir.join(t).display().to_string())
        .collect();
    eprintln!("selftests bench: building {}", targets.join(" "));
    let mut make_args = vec![
        "-s".to_string(),
        "-j2".to_string(),
        "-C".to_string(),
        dir.display().to_string(),
    ];
    make_args.extend(targets);
    let make_args: Vec<&str> = make_args.iter().map(String::as_str).collect();
    make(&tree, &make_args)?;
    Ok(built(&dir).then_some(dir))
}

fn make(cwd: &Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new("make")
        .args(args)
        .current_dir(cwd)
        .output()
        .map_err(|e| format!("make: {e} (install make and a C compiler)"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "make {} failed: {}",
            args.join(" "),
            tail(&String::from_utf8_lossy(&out.stderr))
        ))
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    lines.into_iter().rev().collect::<Vec<_>>().join(" / ")
}

/// Runs a selftest and returns its stdout and stderr (they print to both).
fn tool(path: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(path)
        .args(args)
        .output()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{} failed: {}", path.display(), tail(&text)))
    }
}

/// The number after `label` on its line (a trailing `s` or unit word dropped).
fn field(text: &str, label: &str) -> Option<f64> {
    let rest = text
        .lines()
        .find_map(|l| l.split_once(label).map(|(_, r)| r))?;
    let word = rest.split_whitespace().next()?;
    word.trim_end_matches('s').parse().ok()
}

/// The `(Avg Xs/iteration)` of the summary line starting with `label`.
fn average(text: &str, label: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.starts_with(label))?;
    let (_, avg) = line.split_once("(Avg ")?;
    avg.split_once("s/iteration")?.0.parse().ok()
}

/// `hvlab ARGS --backend kvm --json --no-store` as JSON.
fn hvlab(args: &[&str]) -> Result<Value, String> {
    let out = Command::new(hvlab_bench::hvlab_binary()?)
        .args(args)
        .args(["--backend", "kvm", "--json", "--no-store", "--quiet"])
        .output()
        .map_err(|e| format!("hvlab: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "hvlab {} failed: {}",
            args.join(" "),
            tail(&String::from_utf8_lossy(&out.stderr))
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("hvlab --json: {e}"))
}

fn median(record: &Value, variant: &str, metric: &str) -> Result<f64, String> {
    record["variants"]
        .as_array()
        .and_then(|vs| vs.iter().find(|v| v["name"] == variant))
        .and_then(|v| v["metrics"][metric]["median"].as_f64())
        .ok_or_else(|| format!("hvlab's record has no {variant}.{metric}"))
}

/// The instructions of one function, as (address, text), from `objdump`.
fn disassemble(binary: &Path, function: &str) -> Result<Vec<(u64, String)>, String> {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn"])
        .arg(format!("--disassemble={function}"))
        .arg(binary)
        .output()
        .map_err(|e| format!("objdump: {e} (install binutils)"))?;
    let insns: Vec<(u64, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (addr, rest) = l.trim().split_once(":\t")?;
            Some((u64::from_str_radix(addr, 16).ok()?, rest.trim().to_string()))
        })
        .collect();
    if insns.is_empty() {
        return Err(format!(
            "objdump found no {function} in {}",
            binary.display()
        ));
    }
    Ok(insns)
}

/// The per-page path of `memstress_guest_code` (static count): the innermost backward branch
/// around the guest's store of its 0x0123456789abcdef pattern (loaded into a register before
/// the loop), plus, up to its `ret`, each function that loop calls (`guest_random_u32`).
fn selftest_loop_instructions(binary: &Path) -> Result<usize, String> {
    let insns = disassemble(binary, "memstress_guest_code")?;
    let pattern_reg = insns
        .iter()
        .find_map(|(_, i)| {
            let rest = i.strip_prefix("movabs")?.trim();
            let (value, reg) = rest.split_once(',')?;
            (value == "$0x123456789abcdef").then(|| reg.trim().to_string())
        })
        .ok_or("memstress_guest_code loads no 0x0123456789abcdef pattern")?;
    let store = insns
        .iter()
        .find(|(_, i)| {
            i.starts_with("mov ")
                && i.split_once(' ')
                    .is_some_and(|(_, ops)| ops.trim().starts_with(&format!("{pattern_reg},")))
                && i.contains('(')
        })
        .map(|(a, _)| *a)
        .ok_or("memstress_guest_code never stores its pattern")?;
    let branch_target = |insn: &str| -> Option<u64> {
        let mut words = insn.split_whitespace();
        let op = words.next()?;
        let target = u64::from_str_radix(words.next()?, 16).ok()?;
        (op.starts_with('j')).then_some(target)
    };
    let (lo, hi) = insns
        .iter()
        .filter_map(|(at, i)| branch_target(i).map(|t| (t, *at)))
        .filter(|(t, at)| t < at && (*t..=*at).contains(&store))
        .min_by_key(|(t, at)| at - t)
        .ok_or("no loop around the pattern store")?;
    let mut count = 0;
    for (_, insn) in insns.iter().filter(|(a, _)| (lo..=hi).contains(a)) {
        count += 1;
        if let Some(callee) = insn
            .strip_prefix("call")
            .and_then(|r| r.split_once('<'))
            .and_then(|(_, r)| r.split_once('>'))
            .map(|(name, _)| name)
        {
            let body = disassemble(binary, callee)?;
            count += body
                .iter()
                .position(|(_, i)| i.starts_with("ret"))
                .map_or(body.len(), |p| p + 1);
        }
    }
    Ok(count)
}

/// The per-page loops of hvlab's guests (memory's touch loop, dirty's pass loop): the
/// innermost backward branch whose body holds the guest's one-byte store to the page.
fn hvlab_loop_instructions() -> Result<(usize, usize), String> {
    use hvlab::kvm::dirty::dirty_loop;
    use hvlab::kvm::guest::payload::touch_loop;
    use hvlab_core::memory::{Access, Touch};
    let touch = touch_loop(16, 64, Access::Write, Touch::FirstByte).map_err(|e| e.to_string())?;
    let dirty = dirty_loop(16, 1).map_err(|e| e.to_string())?;
    Ok((loop_around_store(&touch)?, loop_around_store(&dirty)?))
}

fn loop_around_store(code: &[u8]) -> Result<usize, String> {
    use iced_x86::{Code, Decoder, DecoderOptions, OpKind};
    let decoded: Vec<iced_x86::Instruction> = Decoder::with_ip(64, code, 0, DecoderOptions::NONE)
        .into_iter()
        .collect();
    let store = decoded
        .iter()
        .find(|i| i.code() == Code::Mov_rm8_imm8 && i.op0_kind() == OpKind::Memory)
        .map(iced_x86::Instruction::ip)
        .ok_or("the guest loop has no one-byte store")?;
    decoded
        .iter()
        .filter(|b| {
            let target = b.near_branch_target();
            matches!(b.op0_kind(), OpKind::NearBranch64) && target <= store && store <= b.ip()
        })
        .map(|b| {
            let target = b.near_branch_target();
            decoded
                .iter()
                .filter(|i| (target..=b.ip()).contains(&i.ip()))
                .count()
        })
        .min()
        .ok_or_else(|| "no loop around the store".to_string())
}

fn host() -> String {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
            })
        })
        .unwrap_or_default();
    format!("Linux {}, {cpu}", kernel.trim())
}

fn stats(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    let median = if v.len().is_multiple_of(2) && mid > 0 {
        f64::midpoint(v[mid - 1], v[mid])
    } else {
        v[mid]
    };
    (median, v[0], v[v.len() - 1])
}

fn render(args: &Args, rows: &[Row], loops: &str, host: &str) -> String {
    let mut s = format!(
        "# KVM selftests beside hvlab\n\n{host}; linux-source-{} selftests; {} MiB, 1 vCPU, 4 KiB guest pages, guest at CPL0 on both sides; {} alternating rounds; {} dirtying passes per dirty-log run.\n\n",
        args.series, args.size_mib, args.rounds, args.passes
    );
    s.push_str("| quantity | selftest, median (min–max) | hvlab, median (min–max) | selftest / hvlab per round |\n|---|---|---|---|\n");
    for r in rows {
        let (sm, slo, shi) = stats(&r.selftest);
        let (hm, hlo, hhi) = stats(&r.hvlab);
        let ratios: Vec<String> = r
            .selftest
            .iter()
            .zip(&r.hvlab)
            .map(|(a, b)| format!("{:.2}", a / b))
            .collect();
        s.push_str(&format!(
            "| {} | {sm:.2} µs ({slo:.2}–{shi:.2}) | {hm:.2} µs ({hlo:.2}–{hhi:.2}) | {} |\n",
            r.what,
            ratios.join(", ")
        ));
    }
    s.push_str(&format!("\n{loops}\n"));
    s
}

/// The kernel code's long steps (fetching the source), on stderr like this bench's own.
struct Steps;

impl hvlab::kernel::progress::BuildProgress for Steps {
    fn begin(&self, step: &str) {
        eprintln!("selftests bench: {step}");
    }
    fn end(&self, step: &str, secs: f64) {
        eprintln!("selftests bench: {step}: {secs:.0} s");
    }
}
