//! `hvlab vm`: boot a kernel under test in a throwaway QEMU VM, load KVM in it, run hvlab
//! commands there and bring their runs back.
//!
//! The guest is an initramfs (built here, uncompressed newc cpio): a static busybox, the KVM
//! modules of the kernel in load order, this hvlab binary with its shared libraries, and an
//! `/init` that loads the modules, runs the commands one by one under a time limit and sends
//! each command's output and the runs stored so far back on the second serial port as framed
//! files (`@@hvlab-file NAME SIZE\n` then SIZE bytes). A guest that oopses or panics later
//! still leaves every completed command's results behind. The console (first serial port)
//! goes to a log file; `oops=panic panic=-1` with `-no-reboot` make any oops end QEMU.
//!
//! Accelerators: `kvm` where /dev/kvm is VMX or SVM with nested virtualization; `tcg`
//! otherwise, with an AMD CPU model that has SVM and NPT (QEMU's TCG emulates SVM, not VMX).
//! TCG runs single-threaded: with `thread=multi` Linux 6.12 and 7.2 guests oopsed on an
//! `int3` in `__schedule` (a text-poke another vCPU had not yet seen).
//!
//! Clocks: under TCG the guest runs on QEMU's instruction clock by default (`-icount
//! shift=0,sleep=off,align=off`): its time advances one nanosecond per instruction it executes
//! and an idle guest jumps to its next timer, so a time measured in the guest is an instruction
//! count, the same whatever else the host runs. The guest's hvlab is told on the kernel command
//! line (`hvlab.clock=icount`) and records it in every run's host fingerprint. Under KVM the
//! guest's instructions run on the CPU, unseen by QEMU: there only the wall clock exists.

use crate::kernel::which;
use crate::sys::{StopSignals, signal_name};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use hvlab_core::error::Fault;
use hvlab_core::host::Clock;
use serde::Serialize;

use super::cpio::Cpio;
use super::ko::modinfo;
use super::{Kernel, KernelError, check_kvm};
use crate::record::RunRecord;

/// What can stop a VM.
#[derive(Debug, thiserror::Error, displaydoc::Display)]
pub enum VmError {
    /// {0}
    Kernel(#[from] KernelError),
    /// {0}
    Build(Box<super::build::BuildError>),
    /// {tool} is not installed: hvlab vm needs it ({why}). Install it: apt-get install {package}.
    MissingTool {
        /// The program.
        tool: String,
        /// What it is for.
        why: String,
        /// The Debian package.
        package: String,
    },
    /// Bad --kvm-param `{0}`: expected MODULE.PARAM=VALUE with MODULE kvm, kvm_amd or kvm_intel, e.g. --kvm-param kvm_amd.npt=1.
    BadKvmParam(String),
    /// Module {module} has no parameter {param} in kernel {release} (it has: {known}); fix --kvm-param.
    NoSuchParam {
        /// The module.
        module: String,
        /// The parameter.
        param: String,
        /// The kernel.
        release: String,
        /// Its parameters.
        known: String,
    },
    /// --accel kvm needs /dev/kvm with VMX or SVM and nested virtualization; this host's is {0}. Use --accel tcg (or auto).
    NoNestedKvm(String),
    /// --clock icount needs QEMU's emulator, but {why}: under KVM the guest's instructions run on the CPU, where QEMU cannot count them. Add --accel tcg, or use --clock wall.
    IcountNeedsTcg {
        /// How KVM came to be the accelerator.
        why: String,
    },
    /// {qemu} cannot run the guest on its instruction clock ({cause}): `-icount shift=0,sleep=off,align=off` was refused. Install a QEMU with TCG (Debian's qemu-system-x86), or use --clock wall.
    NoIcount {
        /// The QEMU asked.
        qemu: PathBuf,
        /// What QEMU said.
        cause: String,
    },
    /// The guest kernel oopsed or panicked ({runs} completed runs were kept):
    /// {excerpt}
    /// full serial log: {log}
    GuestOops {
        /// The first lines of the oops.
        excerpt: String,
        /// The console log.
        log: PathBuf,
        /// Runs brought back before it.
        runs: usize,
    },
    /// The VM ran past its time limit of {secs} s and was stopped ({runs} completed runs were kept); serial log: {log}. Raise --timeout, or run fewer repetitions.
    TimedOut {
        /// The limit.
        secs: u64,
        /// The console log.
        log: PathBuf,
        /// Runs brought back before it.
        runs: usize,
    },
    /// KVM did not load in the guest: {why}; serial log: {log}
    ModuleLoad {
        /// insmod's messages.
        why: String,
        /// The console log.
        log: PathBuf,
    },
    /// The guest ended without sending its results (QEMU {status}); serial log: {log}
    NoResults {
        /// QEMU's exit status.
        status: String,
        /// The console log.
        log: PathBuf,
    },
    /// Interrupted by {name}: QEMU was stopped; nothing is left running.
    Interrupted {
        /// The signal number.
        signal: i32,
        /// Its name.
        name: &'static str,
    },
    /// Cannot use {0}: {1}
    Io(PathBuf, std::io::Error),
}

impl From<super::build::BuildError> for VmError {
    fn from(e: super::build::BuildError) -> VmError {
        VmError::Build(Box::new(e))
    }
}

impl VmError {
    /// What kind of failure it is: a bad --kvm-param is bad input, a host without QEMU (or
    /// a decompressor) or nested KVM cannot, the guest or the measurement failed.
    pub fn fault(&self) -> Fault {
        match self {
            VmError::Kernel(e) => e.fault(),
            VmError::Build(e) => e.fault(),
            VmError::BadKvmParam(_)
            | VmError::NoSuchParam { .. }
            | VmError::IcountNeedsTcg { .. } => Fault::BadInput,
            VmError::MissingTool { .. } | VmError::NoNestedKvm(_) | VmError::NoIcount { .. } => {
                Fault::HostCannot
            }
            VmError::GuestOops { .. }
            | VmError::TimedOut { .. }
            | VmError::ModuleLoad { .. }
            | VmError::NoResults { .. }
            | VmError::Io(..) => Fault::Failed,
            VmError::Interrupted { signal, .. } => Fault::Interrupted { signal: *signal },
        }
    }
}

/// `--accel`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// kvm where nested VMX/SVM exists, else tcg.
    Auto,
    /// The host's KVM (nested virtualization).
    Kvm,
    /// QEMU's emulator.
    Tcg,
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Accel::Auto => "auto",
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        })
    }
}

/// How a VM is booted.
#[derive(Debug, Clone)]
pub struct VmConfig {
    /// Asked accelerator.
    pub accel: Accel,
    /// Asked clock; `None`: the accelerator's own (the instruction clock under TCG, the wall
    /// clock under KVM).
    pub clock: Option<Clock>,
    /// vCPUs.
    pub cpus: u32,
    /// Memory in MiB.
    pub mem_mib: u32,
    /// `MODULE.PARAM=VALUE`.
    pub kvm_params: Vec<String>,
    /// Per guest command.
    pub cmd_timeout: Duration,
}

impl Default for VmConfig {
    fn default() -> VmConfig {
        VmConfig {
            accel: Accel::Auto,
            clock: None,
            cpus: 1,
            mem_mib: 2048,
            kvm_params: Vec::new(),
            cmd_timeout: Duration::from_secs(900),
        }
    }
}

/// The accelerator chosen and the one line that says why.
#[derive(Debug, Clone, Serialize)]
pub struct AccelChoice {
    /// `kvm` or `tcg`.
    pub accel: Accel,
    /// QEMU's `-cpu`.
    pub cpu_model: String,
    /// The vendor module the guest loads.
    pub vendor_module: String,
    /// Why.
    pub why: String,
    /// The clock the guest measures on ([`choose_clock`]; the wall clock until it is chosen).
    #[serde(skip_serializing_if = "Clock::is_wall")]
    pub clock: Clock,
}

/// Picks the accelerator: nested VMX/SVM KVM when asked or available, TCG with an SVM+NPT CPU
/// model otherwise.
pub fn choose_accel(asked: Accel) -> Result<AccelChoice, VmError> {
    let (vendor, nested) = host_nested();
    let usable = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    let describe = match (&vendor, nested, usable) {
        (_, _, false) => "absent or not usable".to_string(),
        (Some(v), true, true) => format!("{v} with nesting"),
        (Some(v), false, true) => format!("{v} without nested virtualization"),
        (None, _, true) => "PVM (no VMX or SVM: a stock kernel cannot run as its guest)".into(),
    };
    let nested_ok = usable && nested && vendor.is_some();
    match asked {
        Accel::Kvm if !nested_ok => Err(VmError::NoNestedKvm(describe)),
        Accel::Kvm | Accel::Auto if nested_ok => {
            let v = vendor.unwrap_or_default();
            Ok(AccelChoice {
                accel: Accel::Kvm,
                cpu_model: "host".into(),
                vendor_module: if v == "vmx" { "kvm_intel" } else { "kvm_amd" }.into(),
                why: format!(
                    "accel: kvm (/dev/kvm is {describe}); the kernel under test runs KVM nested"
                ),
                clock: Clock::Wall,
            })
        }
        _ => Ok(AccelChoice {
            accel: Accel::Tcg,
            cpu_model: "EPYC,+svm,+npt".into(),
            vendor_module: "kvm_amd".into(),
            why: format!(
                "accel: tcg, single-threaded, AMD EPYC model with SVM+NPT (/dev/kvm here is {describe}); guest times measure the emulator"
            ),
            clock: Clock::Wall,
        }),
    }
}

/// Refuses the instruction clock with the KVM accelerator asked by name: bad input, known
/// before anything is fetched or built.
pub fn check_clock(accel: Accel, clock: Option<Clock>) -> Result<(), VmError> {
    match (accel, clock) {
        (Accel::Kvm, Some(Clock::Icount)) => Err(VmError::IcountNeedsTcg {
            why: "--accel kvm asks for KVM".into(),
        }),
        _ => Ok(()),
    }
}

/// The clock the guest runs on under `choice`: `asked`, else the accelerator's own (the
/// instruction clock under TCG, the wall clock under KVM). The instruction clock under KVM is
/// bad input; a QEMU that refuses `-icount` cannot (exit 3), with QEMU's own words.
pub fn choose_clock(
    asked: Option<Clock>,
    choice: &AccelChoice,
    qemu: &Path,
) -> Result<Clock, VmError> {
    let clock = match (choice.accel, asked) {
        (Accel::Kvm, Some(Clock::Icount)) => {
            return Err(VmError::IcountNeedsTcg {
                why: "--accel auto chose KVM on this host (nested virtualization is available)"
                    .into(),
            });
        }
        (accel, asked) => clock_under(accel, asked),
    };
    if clock == Clock::Icount {
        icount_works(qemu)?;
    }
    Ok(clock)
}

/// The clock a guest under the chosen `accel` runs on: the wall clock under KVM, else the
/// one asked, the instruction clock by default.
pub fn clock_under(accel: Accel, asked: Option<Clock>) -> Clock {
    match accel {
        Accel::Kvm => Clock::Wall,
        _ => asked.unwrap_or(Clock::Icount),
    }
}

/// QEMU's instruction clock: one virtual nanosecond per guest instruction (`shift=0`), an idle
/// guest jumping to its next timer rather than sleeping through it (`sleep=off`), and the
/// virtual clock never held back to the host's (`align=off`, QEMU's default, said so a newer
/// default cannot change what a run measures).
const ICOUNT: &str = "shift=0,sleep=off,align=off";

/// On the instruction clock, what makes two boots of one kernel execute the same instructions:
/// RDRAND from a seeded generator instead of the host's entropy (`-seed`), and the RTC starting
/// at one date ([`GUEST_RTC_BASE`]) and following virtual time (`clock=vm`): the kernel mixes
/// the RTC's time into its random pool, so a boot started a second later hashes, allocates and
/// lays out differently. Without them two boots of Debian 7.3 differed by up to 2.5% on an
/// ioctl's instructions (`KVM_CREATE_IRQCHIP`) and 1.3% on a 56 M-instruction memory pass;
/// with the RTC at the host's time still 2.3%; with both (and the guest's own randomization
/// off, [`kernel_command_line`]) every time agreed to the instruction (docs/kernels.md). The
/// guest's hvlab still stamps its runs with the host's time: its `/init` gives it the offset to
/// the host's clock ([`guest_stamp`]). Its run ids repeat from boot to boot, as its random
/// numbers do, so the host gives them random ends of their own ([`fresh_ids`]).
const DETERMINISTIC_GUEST: [&str; 4] = ["-seed", "1", "-rtc", "base=2000-01-01T00:00:00,clock=vm"];

/// The date the guest's RTC starts at on the instruction clock (as in [`DETERMINISTIC_GUEST`]).
const GUEST_RTC_BASE: &str = "2000-01-01T00:00:00Z";

/// Whether `qemu` takes `-icount` with TCG: an empty machine, paused, told to quit at once.
fn icount_works(qemu: &Path) -> Result<(), VmError> {
    let no = |cause: String| VmError::NoIcount {
        qemu: qemu.to_path_buf(),
        cause,
    };
    let mut child = Command::new(qemu)
        .args(["-machine", "none", "-accel", "tcg", "-icount", ICOUNT])
        .args(DETERMINISTIC_GUEST)
        .args(["-display", "none", "-nodefaults", "-monitor", "stdio", "-S"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| VmError::Io(qemu.to_path_buf(), e))?;
    if let Some(mut stdin) = child.stdin.take() {
        // QEMU may have exited already (a refused option): its stderr says why.
        let _ = stdin.write_all(b"quit\n");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(no("it did not quit within 20 s".into()));
            }
            Err(e) => return Err(VmError::Io(qemu.to_path_buf(), e)),
        }
    };
    let mut said = String::new();
    if let Some(mut err) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut err, &mut said);
    }
    if status.success() {
        return Ok(());
    }
    let first = said
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.contains("module ui-"))
        .unwrap_or("no message");
    Err(no(match status.code() {
        Some(code) => format!("{first}; exit {code}"),
        None => format!("{first}; {status}"),
    }))
}

/// The host CPU's virtualization extension and whether its KVM module allows nesting.
fn host_nested() -> (Option<String>, bool) {
    for (vendor, module) in [("vmx", "kvm_intel"), ("svm", "kvm_amd")] {
        let p = format!("/sys/module/{module}/parameters/nested");
        if let Ok(v) = std::fs::read_to_string(&p) {
            let on = matches!(v.trim(), "Y" | "1" | "y");
            return (Some(vendor.to_string()), on);
        }
    }
    (None, false)
}

/// What one guest command did.
#[derive(Debug, Clone, Serialize)]
pub struct GuestCommand {
    /// hvlab's arguments.
    pub args: Vec<String>,
    /// Exit code in the guest (137: killed at its time limit).
    pub rc: Option<i32>,
    /// What it printed.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

/// What a boot brought back.
#[derive(Debug, Clone, Serialize)]
pub struct Boot {
    /// `uname -r` in the guest.
    pub release: String,
    /// The accelerator and the clock.
    pub accel: AccelChoice,
    /// Per command, in order.
    pub commands: Vec<GuestCommand>,
    /// Every run the guest stored, tagged with the kernel under test.
    #[serde(skip)]
    pub runs: Vec<RunRecord>,
    /// The serial console log.
    pub console: PathBuf,
    /// Seconds from starting QEMU to the first hvlab command in the guest.
    pub to_first_command_s: Option<f64>,
    /// Seconds QEMU ran.
    pub wall_s: f64,
    /// The profile `hvlab calibrate` wrote in the guest (its default path), as TOML: this
    /// kernel's costs under this accelerator, for [`super::calibration`] to keep.
    #[serde(skip)]
    pub calibrated: Option<String>,
}

// ---- the initramfs ----

/// The static busybox the guest's userland is.
fn busybox() -> Result<PathBuf, VmError> {
    for p in ["/bin/busybox", "/usr/bin/busybox"] {
        let path = PathBuf::from(p);
        if let Ok(out) = Command::new(&path).arg("--list").output() {
            let list = String::from_utf8_lossy(&out.stdout);
            if list.lines().any(|l| l == "insmod") && list.lines().any(|l| l == "timeout") {
                return Ok(path);
            }
        }
    }
    Err(VmError::MissingTool {
        tool: "busybox (static, with insmod)".into(),
        why: "the guest's userland".into(),
        package: "busybox-static".into(),
    })
}

/// QEMU, or what to install.
pub fn qemu() -> Result<PathBuf, VmError> {
    which("qemu-system-x86_64").ok_or_else(|| VmError::MissingTool {
        tool: "qemu-system-x86_64".into(),
        why: "it boots the kernel under test".into(),
        package: "qemu-system-x86".into(),
    })
}

/// A module's bytes, decompressed.
fn module_bytes(path: &Path) -> Result<Vec<u8>, VmError> {
    super::ko::bytes(path).map_err(|e| match e {
        super::ko::ReadError::Decompressor { tool, package } => VmError::MissingTool {
            tool: tool.into(),
            why: "it decompresses the kernel's modules".into(),
            package: package.into(),
        },
        super::ko::ReadError::Io(path, e) => VmError::Io(path, e),
    })
}

/// The KVM modules in load order (dependencies first), decompressed: (file name, bytes).
fn kvm_modules(kernel: &Kernel, vendor: &str) -> Result<Vec<(String, Vec<u8>)>, VmError> {
    let mut order: Vec<(String, Vec<u8>)> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    fn add(
        kernel: &Kernel,
        name: &str,
        seen: &mut Vec<String>,
        order: &mut Vec<(String, Vec<u8>)>,
    ) -> Result<(), VmError> {
        let canon = name.replace('-', "_");
        if seen.contains(&canon) {
            return Ok(());
        }
        seen.push(canon.clone());
        let Some(file) = kernel.module_file(&canon) else {
            return Err(KernelError::NoSuchModule {
                module: canon,
                release: kernel.release.clone(),
            }
            .into());
        };
        let bytes = module_bytes(&file)?;
        for dep in modinfo(&bytes, "depends")
            .iter()
            .flat_map(|d| d.split(','))
            .filter(|d| !d.is_empty())
        {
            add(kernel, dep, seen, order)?;
        }
        order.push((format!("{canon}.ko"), bytes));
        Ok(())
    }
    if kernel.modules.is_some() && kernel.module_file(vendor).is_some() {
        add(kernel, vendor, &mut seen, &mut order)?;
    }
    Ok(order)
}

/// `--kvm-param`s checked against the modules (or the built-in KVM): module → "p=v p=v".
fn module_args(
    kernel: &Kernel,
    modules: &[(String, Vec<u8>)],
    vendor: &str,
    params: &[String],
) -> Result<BTreeMap<String, Vec<String>>, VmError> {
    let mut args: BTreeMap<String, Vec<String>> = BTreeMap::new();
    // npt=1 explicitly: an SVM host with TDP is what hvlab's users run.
    if vendor == "kvm_amd" {
        args.entry("kvm_amd".into())
            .or_default()
            .push("npt=1".into());
    }
    for p in params {
        let (lhs, value) = p
            .split_once('=')
            .ok_or_else(|| VmError::BadKvmParam(p.clone()))?;
        let (module, param) = lhs
            .split_once('.')
            .ok_or_else(|| VmError::BadKvmParam(p.clone()))?;
        let module = module.replace('-', "_");
        if module.is_empty() || param.is_empty() || value.is_empty() {
            return Err(VmError::BadKvmParam(p.clone()));
        }
        let Some((_, bytes)) = modules.iter().find(|(n, _)| n == &format!("{module}.ko")) else {
            let built_in = module == "kvm" || module == vendor;
            if built_in && kernel.kvm_built_in(vendor) {
                args.entry(module)
                    .or_default()
                    .push(format!("{param}={value}"));
                continue;
            }
            return Err(KernelError::NoSuchModule {
                module,
                release: kernel.release.clone(),
            }
            .into());
        };
        // `parmtype=NAME:TYPE` exists for every module_param; `parm=` only for described ones.
        let known: Vec<String> = modinfo(bytes, "parmtype")
            .iter()
            .chain(modinfo(bytes, "parm").iter())
            .filter_map(|d| d.split(':').next().map(str::to_string))
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        if !known.iter().any(|k| k == param) {
            return Err(VmError::NoSuchParam {
                module,
                param: param.into(),
                release: kernel.release.clone(),
                known: known.join(", "),
            });
        }
        let list = args.entry(module).or_default();
        list.retain(|a| !a.starts_with(&format!("{param}=")));
        list.push(format!("{param}={value}"));
    }
    Ok(args)
}

/// The guest's `/init`.
const INIT: &str = r#"#!/bin/sh
export PATH=/bin HOME=/var HVLAB_DB=/var/h.db
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
# kprobe events for `hvlab run --count-calls` (a kernel without tracefs keeps going; hvlab says so).
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
r=/var/r
mkdir -p $r /boot
stty -F /dev/ttyS1 raw -echo 2>/dev/null
send() { printf '@@hvlab-file %s %s\n' "$1" "$(wc -c <"$2")" >/dev/ttyS1; cat "$2" >/dev/ttyS1; }
uname -r >$r/release
[ -f /etc/kconfig ] && cp /etc/kconfig /boot/config-$(uname -r)
: >$r/modules.err
while read -r m args; do
    [ -n "$m" ] || continue
    insmod /modules/$m $args 2>>$r/modules.err || echo "insmod $m $args failed" >>$r/modules.err
done </modules/order
[ -e /dev/kvm ] || echo "no /dev/kvm after loading the modules" >>$r/modules.err
send release $r/release
send modules.err $r/modules.err
echo "@@hvlab-ready $(cut -d' ' -f1 /proc/uptime)" >/dev/console
n=0
while IFS= read -r line; do
    n=$((n + 1))
    oldifs=$IFS
    IFS=$(printf '\037')
    set -- $line
    IFS=$oldifs
    echo "@@hvlab-command $n" >/dev/console
    timeout -s KILL $CMD_TIMEOUT hvlab "$@" >$r/$n.out 2>$r/$n.err </dev/null
    echo $? >$r/$n.rc
    hvlab export -o $r/$n.jsonl >/dev/null 2>$r/export.err || : >$r/$n.jsonl
    for f in out err rc jsonl; do send $n.$f $r/$n.$f; done
done </etc/cmds
[ -f /var/this-host.toml ] && send this-host.toml /var/this-host.toml
echo "@@hvlab-done" >/dev/ttyS1
sync
poweroff -f
"#;

/// hvlab's binary without its debug information where `strip` exists: an eighth of the
/// bytes for QEMU to load and the guest to unpack, seconds of boot under TCG.
fn stripped(exe: &Path, workdir: &Path) -> Result<Vec<u8>, VmError> {
    let out = workdir.join("hvlab.stripped");
    let ok = which("strip").is_some()
        && Command::new("strip")
            .arg("-o")
            .arg(&out)
            .arg(exe)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    let path = if ok { out.as_path() } else { exe };
    let bytes = std::fs::read(path).map_err(|e| VmError::Io(path.to_path_buf(), e))?;
    let _ = std::fs::remove_file(&out);
    Ok(bytes)
}

/// hvlab as the guest runs it: its stripped binary and the shared libraries it loads (path,
/// bytes).
struct GuestHvlab {
    binary: Vec<u8>,
    libraries: Vec<(String, Vec<u8>)>,
}

/// This process's [`GuestHvlab`], made once: every boot of a kab or a series packs the same
/// binary, and stripping it and asking `ldd` take most of a second each time.
fn guest_hvlab(workdir: &Path) -> Result<std::sync::Arc<GuestHvlab>, VmError> {
    static MADE: std::sync::Mutex<Option<std::sync::Arc<GuestHvlab>>> = std::sync::Mutex::new(None);
    let mut made = MADE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(g) = made.as_ref() {
        return Ok(g.clone());
    }
    let exe = std::env::current_exe().map_err(|e| VmError::Io(PathBuf::from("hvlab"), e))?;
    let binary = stripped(&exe, workdir)?;
    let mut libraries = Vec::new();
    if let Ok(out) = Command::new("ldd").arg(&exe).output() {
        for lib in String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .filter(|w| w.starts_with('/'))
        {
            let bytes = std::fs::read(lib).map_err(|e| VmError::Io(PathBuf::from(lib), e))?;
            libraries.push((lib.to_string(), bytes));
        }
    }
    let g = std::sync::Arc::new(GuestHvlab { binary, libraries });
    *made = Some(g.clone());
    Ok(g)
}

/// Builds the initramfs for `commands`.
fn initramfs(
    kernel: &Kernel,
    choice: &AccelChoice,
    cfg: &VmConfig,
    commands: &[Vec<String>],
    workdir: &Path,
) -> Result<Vec<u8>, VmError> {
    let busybox = busybox()?;
    let modules = kvm_modules(kernel, &choice.vendor_module)?;
    let args = module_args(kernel, &modules, &choice.vendor_module, &cfg.kvm_params)?;
    let mut c = Cpio::new();
    for d in [
        "bin", "dev", "proc", "sys", "tmp", "var", "etc", "modules", "boot",
    ] {
        c.dir(d);
    }
    let bb = std::fs::read(&busybox).map_err(|e| VmError::Io(busybox.clone(), e))?;
    c.file("bin/busybox", true, &bb);
    let list = Command::new(&busybox)
        .arg("--list")
        .output()
        .map_err(|e| VmError::Io(busybox.clone(), e))?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" && !applet.is_empty() {
            c.symlink(&format!("bin/{applet}"), "busybox");
        }
    }
    let mut order = String::new();
    for (name, bytes) in &modules {
        c.file(&format!("modules/{name}"), false, bytes);
        let m = name.trim_end_matches(".ko");
        let a = args.get(m).map(|v| v.join(" ")).unwrap_or_default();
        order.push_str(&format!("{name} {a}\n"));
    }
    c.file("modules/order", false, order.as_bytes());
    if let Some(config) = &kernel.config {
        let text = std::fs::read(config).map_err(|e| VmError::Io(config.clone(), e))?;
        c.file("etc/kconfig", false, &text);
    }
    let hvlab = guest_hvlab(workdir)?;
    c.file("bin/hvlab", true, &hvlab.binary);
    // Its shared libraries, at the paths the loader looks for them.
    let mut dirs: Vec<String> = Vec::new();
    for (lib, bytes) in &hvlab.libraries {
        let mut dir = String::new();
        for part in Path::new(lib)
            .parent()
            .iter()
            .flat_map(|p| p.components())
            .skip(1)
        {
            dir.push_str(&part.as_os_str().to_string_lossy());
            if !dirs.contains(&dir) {
                c.dir(&dir);
                dirs.push(dir.clone());
            }
            dir.push('/');
        }
        c.file(lib, true, bytes);
    }
    let cmds: String = commands.iter().map(|a| a.join("\u{1f}") + "\n").collect();
    c.file("etc/cmds", false, cmds.as_bytes());
    let init = format!(
        "#!/bin/sh\nCMD_TIMEOUT={}\n{}{}",
        cfg.cmd_timeout.as_secs(),
        guest_stamp(choice.clock, SystemTime::now()),
        INIT.trim_start_matches("#!/bin/sh\n")
    );
    c.file("init", true, init.as_bytes());
    Ok(c.finish())
}

/// The `/init` line that tells a guest on the instruction clock what its fixed RTC date
/// hides: the seconds from its clock to the host's `now` (the boot's start, to the second), of
/// one length on every boot, so two boots still run the same instructions. On the wall clock
/// the guest's RTC is the host's and nothing is said.
fn guest_stamp(clock: Clock, now: SystemTime) -> String {
    if clock != Clock::Icount {
        return String::new();
    }
    let since = |t: SystemTime| {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    };
    let base = humantime::parse_rfc3339(GUEST_RTC_BASE).map_or(0, since);
    let offset = since(now).saturating_sub(base);
    format!("export {}={offset:012}\n", Clock::GUEST_OFFSET_ENV)
}

// ---- running QEMU ----

/// The framed files the guest sent, in order (a truncated last frame is dropped).
fn frames(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut i = 0;
    let tag = b"@@hvlab-file ";
    while let Some(pos) = bytes[i..].windows(tag.len()).position(|w| w == tag) {
        let start = i + pos + tag.len();
        let Some(nl) = bytes[start..].iter().position(|&b| b == b'\n') else {
            break;
        };
        let header = String::from_utf8_lossy(&bytes[start..start + nl]).into_owned();
        let mut parts = header.split_whitespace();
        let (Some(name), Some(Ok(size))) = (parts.next(), parts.next().map(str::parse::<usize>))
        else {
            i = start;
            continue;
        };
        let body = start + nl + 1;
        if body + size > bytes.len() {
            break;
        }
        out.push((name.to_string(), bytes[body..body + size].to_vec()));
        i = body + size;
    }
    out
}

/// The first lines of an oops or panic in the console log.
pub fn oops_excerpt(console: &str) -> Option<String> {
    const MARKS: [&str; 7] = [
        "Oops:",
        "BUG:",
        "Kernel panic",
        "general protection fault",
        "int3:",
        "kernel BUG at",
        "WARNING: CPU:",
    ];
    let lines: Vec<&str> = console.lines().collect();
    let at = lines
        .iter()
        .position(|l| MARKS.iter().any(|m| l.contains(m)) && !l.contains("@@hvlab"))?;
    // A lone WARNING does not end the guest; only report it when the guest then died.
    if lines[at].contains("WARNING: CPU:") && !console.contains("Kernel panic") {
        return None;
    }
    Some(
        lines[at..]
            .iter()
            .take(8)
            .map(|l| format!("  {}", l.trim_end()))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

/// Boots `kernel` and runs `commands` (hvlab argument lists) in it; `workdir` receives the
/// console log. Runs that completed are returned in `Boot::runs` even when the guest failed
/// later: the caller stores them, then reports the error ([`finish`]).
pub fn boot(
    kernel: &Kernel,
    cfg: &VmConfig,
    commands: &[Vec<String>],
    workdir: &Path,
) -> Result<(Boot, Option<VmError>), VmError> {
    let qemu = qemu()?;
    check_clock(cfg.accel, cfg.clock)?;
    let mut choice = choose_accel(cfg.accel)?;
    choice.clock = choose_clock(cfg.clock, &choice, &qemu)?;
    check_kvm(kernel, &choice.vendor_module)?;
    super::check_guest_config(kernel)?;
    std::fs::create_dir_all(workdir).map_err(|e| VmError::Io(workdir.to_path_buf(), e))?;
    let initrd = write_initramfs(kernel, &choice, cfg, commands, workdir)?;
    let serial = SerialFiles {
        console: workdir.join("console.log"),
        results: workdir.join("results.bin"),
    };
    let _ = std::fs::remove_file(&serial.results);
    // On the instruction clock the guest's own decompression is seconds of emulated work:
    // QEMU starts the unpacked kernel at its PVH entry where it has one.
    let unpacked = match choice.clock {
        Clock::Icount => super::pvh::vmlinux(&kernel.image, workdir).ok(),
        Clock::Wall => None,
    };
    let image = unpacked.as_deref().unwrap_or(&kernel.image);
    let cmd = qemu_command(&qemu, image, &choice, cfg, &initrd, &serial, workdir)?;
    let limit = Duration::from_secs(120)
        + cfg.cmd_timeout * u32::try_from(commands.len()).unwrap_or(u32::MAX).max(1);
    let run = run_qemu(&qemu, cmd, &serial.console, limit);
    let _ = std::fs::remove_file(&initrd);
    if let Some(unpacked) = &unpacked {
        let _ = std::fs::remove_file(unpacked);
    }
    let run = run?;
    let text =
        String::from_utf8_lossy(&std::fs::read(&serial.console).unwrap_or_default()).into_owned();
    let mut first_cmd = run.first_cmd;
    if first_cmd.is_none() && text.contains("@@hvlab-ready ") {
        first_cmd = Some(run.wall_s);
    }
    let sent = SentFiles::read(&serial.results);
    let release = sent
        .text("release")
        .map(|s| s.trim().to_string())
        .unwrap_or_default();
    let (out, runs) = guest_commands(commands, &sent, kernel, &choice);
    let failure = boot_failure(&text, run.failure, runs.len(), &sent, run.status, &serial);
    let boot = Boot {
        release,
        accel: choice,
        commands: out,
        runs,
        console: serial.console,
        to_first_command_s: first_cmd,
        wall_s: run.wall_s,
        calibrated: sent.text("this-host.toml"),
    };
    Ok((boot, failure))
}

/// A boot's outcome: the boot with what ended it early, if anything, or why it never ran.
pub type BootResult = Result<(Boot, Option<VmError>), VmError>;

/// One boot of [`boot_each`]: a kernel, the commands its guest runs, where its logs go.
pub struct BootJob<'a> {
    /// The kernel.
    pub kernel: &'a Kernel,
    /// The hvlab commands the guest runs.
    pub commands: &'a [Vec<String>],
    /// Its console log and what the guest sent back.
    pub workdir: PathBuf,
}

/// How many boots may run side by side on `clock`. On the instruction clock a guest's time
/// is the instructions it executed, which another QEMU on the next core cannot move (the A/A
/// kab under two CPU hogs is the evidence), so as many as the host has cores, each TCG QEMU
/// being one busy thread, and memory for; on the wall clock one, since a second guest would
/// be load on the first's times.
pub fn boots_at_once(clock: Clock, cfg: &VmConfig) -> usize {
    if clock != Clock::Icount {
        return 1;
    }
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    // A guest's RAM, plus QEMU's own and its translation cache (256 MiB here).
    let per_boot_kib = (u64::from(cfg.mem_mib) + 256) * 1024;
    let by_memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(1, |kib| {
            usize::try_from(kib / 2 / per_boot_kib).unwrap_or(1)
        });
    cores.min(by_memory).max(1)
}

/// Boots `jobs`, `at_once` of them side by side (each on its own thread, which spawns its
/// QEMU and waits on it: the death signal follows that thread), and returns each boot's
/// result in the order of `jobs`.
pub fn boot_each(jobs: &[BootJob<'_>], cfg: &VmConfig, at_once: usize) -> Vec<BootResult> {
    if at_once <= 1 || jobs.len() <= 1 {
        return jobs
            .iter()
            .map(|j| boot(j.kernel, cfg, j.commands, &j.workdir))
            .collect();
    }
    let mut results = Vec::with_capacity(jobs.len());
    for group in jobs.chunks(at_once) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = group
                .iter()
                .map(|j| scope.spawn(move || boot(j.kernel, cfg, j.commands, &j.workdir)))
                .collect();
            for h in handles {
                results.push(h.join().unwrap_or_else(|_| {
                    Err(VmError::Io(
                        PathBuf::from("qemu"),
                        std::io::Error::other("the thread that ran this boot panicked"),
                    ))
                }));
            }
        });
        if StopSignals::pending().is_some() {
            break;
        }
    }
    results
}

/// Builds the initramfs and writes it to `workdir`; returns its path.
fn write_initramfs(
    kernel: &Kernel,
    choice: &AccelChoice,
    cfg: &VmConfig,
    commands: &[Vec<String>],
    workdir: &Path,
) -> Result<PathBuf, VmError> {
    let initrd_bytes = initramfs(kernel, choice, cfg, commands, workdir)?;
    let initrd = workdir.join("initramfs.cpio");
    std::fs::write(&initrd, &initrd_bytes).map_err(|e| VmError::Io(initrd.clone(), e))?;
    Ok(initrd)
}

/// The guest's two serial ports, as files on the host.
struct SerialFiles {
    /// The first port: the kernel's console.
    console: PathBuf,
    /// The second port: the framed files the guest sends back.
    results: PathBuf,
}

/// The QEMU command line for the boot of `image` (a bzImage, or an unpacked kernel with a PVH
/// entry), with its stderr to `workdir/qemu.err`.
fn qemu_command(
    qemu: &Path,
    image: &Path,
    choice: &AccelChoice,
    cfg: &VmConfig,
    initrd: &Path,
    serial: &SerialFiles,
    workdir: &Path,
) -> Result<Command, VmError> {
    let mut cmd = Command::new(qemu);
    match choice.accel {
        Accel::Kvm => cmd.args(["-accel", "kvm"]),
        _ => cmd.args(["-accel", "tcg,thread=single"]),
    };
    if choice.clock == Clock::Icount {
        cmd.args(["-icount", ICOUNT]).args(DETERMINISTIC_GUEST);
    }
    // qboot, where QEMU ships it, skips SeaBIOS's device probing: a second or two under TCG.
    if Path::new("/usr/share/qemu/qboot.rom").is_file() {
        cmd.args(["-bios", "qboot.rom"]);
    }
    cmd.args(["-cpu", &choice.cpu_model])
        .args(["-smp", &cfg.cpus.to_string()])
        .args(["-m", &cfg.mem_mib.to_string()])
        .args([
            "-display",
            "none",
            "-no-reboot",
            "-monitor",
            "none",
            "-nodefaults",
        ])
        .arg("-serial")
        .arg(format!("file:{}", serial.console.display()))
        .arg("-serial")
        .arg(format!("file:{}", serial.results.display()))
        .arg("-kernel")
        .arg(image)
        .arg("-initrd")
        .arg(initrd)
        .arg("-append")
        .arg(kernel_command_line(choice.clock))
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    let qemu_err = workdir.join("qemu.err");
    let err_file =
        std::fs::File::create(&qemu_err).map_err(|e| VmError::Io(qemu_err.clone(), e))?;
    cmd.stderr(err_file);
    // Its own session: a terminal's Ctrl-C reaches hvlab, which stops QEMU itself; and QEMU
    // dies with hvlab even by SIGKILL. The death signal follows the spawning thread:
    // `run_qemu` spawns and waits on the same one.
    crate::sys::own_session_dying_with_parent(&mut cmd);
    Ok(cmd)
}

/// The guest kernel's command line: the console on the first serial port, an oops ends the
/// VM, and the clock the guest's hvlab measures on.
fn kernel_command_line(clock: Clock) -> String {
    let common = "console=ttyS0 quiet panic=-1 oops=panic nmi_watchdog=0";
    match clock {
        // TCG's TSC follows the host's, not the guest's virtual time: the kernel would find
        // it unstable mid-run and switch clocksources under a measurement.
        Clock::Wall => format!("{common} tsc=unstable"),
        // On the instruction clock every busy wait costs its length in emulated instructions
        // (a `pause` leaves TCG's execution loop each time), so the boot's waits are what the
        // wall time goes to; each of these drops one that nothing measured depends on:
        // - the TSC counts virtual nanoseconds exactly, so it is the clocksource (a read is one
        //   instruction, not an HPET access of ~700, and resolves one instruction, not ten);
        // - `noapictimer`: the LAPIC timer's calibration spins 100 ms of virtual time (4.7 s
        //   of a 14 s boot); the tick comes from the HPET instead;
        // - `no_timer_check`: the IO-APIC timer check waits ten ticks in `mdelay`;
        // - `cryptomgr.notests=1`: the crypto self-tests (ECDSA, RSA) at boot.
        // And the guest's own randomness is fixed, as QEMU's `-seed` fixes RDRAND
        // ([`DETERMINISTIC_GUEST`]): no KASLR (a bzImage boot), no mmap randomization, no
        // per-syscall kernel stack offset.
        Clock::Icount => format!(
            "{common} tsc=reliable noapictimer no_timer_check cryptomgr.notests=1 nokaslr norandmaps randomize_kstack_offset=off {}={clock}",
            Clock::KERNEL_PARAM
        ),
    }
}

/// How QEMU's run ended, as watched from the host.
struct QemuRun {
    /// QEMU's exit status; `None` when it was killed at the time limit.
    status: Option<std::process::ExitStatus>,
    /// Seconds from starting QEMU to the guest's first `@@hvlab-ready`, when seen while it ran.
    first_cmd: Option<f64>,
    /// The time limit, when QEMU ran past it.
    failure: Option<VmError>,
    /// Seconds QEMU ran.
    wall_s: f64,
}

/// Starts QEMU and waits for it to end, stopping it at `limit` or on a stop signal.
fn run_qemu(
    qemu: &Path,
    mut cmd: Command,
    console: &Path,
    limit: Duration,
) -> Result<QemuRun, VmError> {
    let signals = StopSignals::install();
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| VmError::Io(qemu.to_path_buf(), e))?;
    let mut first_cmd: Option<f64> = None;
    let mut failure: Option<VmError> = None;
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| VmError::Io(qemu.to_path_buf(), e))?
        {
            break Some(status);
        }
        if let Some(sig) = StopSignals::pending() {
            let _ = child.kill();
            let _ = child.wait();
            drop(signals);
            return Err(VmError::Interrupted {
                signal: sig,
                name: signal_name(sig),
            });
        }
        if first_cmd.is_none()
            && std::fs::read(console).is_ok_and(|b| b.windows(14).any(|w| w == b"@@hvlab-ready "))
        {
            first_cmd = Some(start.elapsed().as_secs_f64());
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            failure = Some(VmError::TimedOut {
                secs: limit.as_secs(),
                log: console.to_path_buf(),
                runs: 0,
            });
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(signals);
    let wall_s = start.elapsed().as_secs_f64();
    Ok(QemuRun {
        status,
        first_cmd,
        failure,
        wall_s,
    })
}

/// The framed files the guest sent on its second serial port.
struct SentFiles {
    /// The port's bytes as received.
    raw: Vec<u8>,
    /// The complete frames, by name.
    files: BTreeMap<String, Vec<u8>>,
}

impl SentFiles {
    /// Reads `results` (nothing when the guest sent nothing).
    fn read(results: &Path) -> SentFiles {
        let raw = std::fs::read(results).unwrap_or_default();
        let files = frames(&raw).into_iter().collect();
        SentFiles { raw, files }
    }

    /// The file `name` as text.
    fn text(&self, name: &str) -> Option<String> {
        self.files
            .get(name)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }

    /// Whether the guest said it had sent everything.
    fn sent_done(&self) -> bool {
        self.raw.windows(12).any(|w| w == b"@@hvlab-done")
    }
}

/// Each command's exit code and output, and the runs the guest stored (tagged with the kernel
/// under test, oldest first).
fn guest_commands(
    commands: &[Vec<String>],
    sent: &SentFiles,
    kernel: &Kernel,
    choice: &AccelChoice,
) -> (Vec<GuestCommand>, Vec<RunRecord>) {
    let mut out = Vec::new();
    let mut runs: BTreeMap<String, RunRecord> = BTreeMap::new();
    for (i, args) in commands.iter().enumerate() {
        let n = i + 1;
        let rc = sent
            .text(&format!("{n}.rc"))
            .and_then(|s| s.trim().parse().ok());
        if let Some(jsonl) = sent.text(&format!("{n}.jsonl")) {
            for line in jsonl.lines().filter(|l| !l.trim().is_empty()) {
                if let Ok(mut r) = serde_json::from_str::<RunRecord>(line) {
                    tag(&mut r, kernel, choice);
                    runs.insert(r.run_id.clone(), r);
                }
            }
        }
        out.push(GuestCommand {
            args: args.clone(),
            rc,
            stdout: sent.text(&format!("{n}.out")).unwrap_or_default(),
            stderr: sent.text(&format!("{n}.err")).unwrap_or_default(),
        });
    }
    let mut runs: Vec<RunRecord> = runs.into_values().collect();
    if choice.clock == Clock::Icount {
        fresh_ids(&mut runs, &mut out);
    }
    runs.sort_by(|a, b| a.started_at.cmp(&b.started_at));
    (out, runs)
}

/// Gives the runs of a guest on the instruction clock random ends of their own, and what the
/// commands printed of them (`run --json`, "stored run ID") the ids as stored. The guest's
/// random numbers repeat from boot to boot, so two boots started in the same second make the
/// same ids, and the store would take the second boot's runs for the first's. The guest cannot
/// be given a random salt instead: ids of different contents in its store made its memory
/// scenario's times differ between boots (0.17% on `populated`), where ids of one content
/// agree to the instruction (docs/kernels.md).
fn fresh_ids(runs: &mut [RunRecord], out: &mut [GuestCommand]) {
    let mut renamed: Vec<(String, String)> = Vec::new();
    for r in runs.iter_mut() {
        // `<started_at>-<scenario>-<backend>-<random>`.
        if let Some((stem, _)) = r.run_id.rsplit_once('-') {
            let fresh = format!("{stem}-{}", crate::record::run_id_suffix());
            renamed.push((std::mem::replace(&mut r.run_id, fresh.clone()), fresh));
        }
    }
    for c in out {
        for (was, now) in &renamed {
            c.stdout = c.stdout.replace(was.as_str(), now);
            c.stderr = c.stderr.replace(was.as_str(), now);
        }
    }
}

/// What went wrong with the boot, if anything: an oops first, then the time limit (with the
/// `kept` runs), a failed module load, or a guest that ended without sending its results.
fn boot_failure(
    console_text: &str,
    run_failure: Option<VmError>,
    kept: usize,
    sent: &SentFiles,
    status: Option<std::process::ExitStatus>,
    serial: &SerialFiles,
) -> Option<VmError> {
    let mut failure = run_failure;
    let modules_err = sent.text("modules.err").unwrap_or_default();
    if let Some(excerpt) = oops_excerpt(console_text) {
        failure = Some(VmError::GuestOops {
            excerpt,
            log: serial.console.clone(),
            runs: kept,
        });
    } else if let Some(VmError::TimedOut { secs, log, .. }) = failure {
        failure = Some(VmError::TimedOut {
            secs,
            log,
            runs: kept,
        });
    } else if !modules_err.trim().is_empty() {
        failure = Some(VmError::ModuleLoad {
            why: modules_err.trim().replace('\n', "; "),
            log: serial.console.clone(),
        });
    } else if !sent.files.contains_key("modules.err") || (!sent.sent_done() && failure.is_none()) {
        failure = Some(VmError::NoResults {
            status: status.map_or_else(|| "killed".into(), |s| s.to_string()),
            log: serial.console.clone(),
        });
    }
    failure
}

/// Marks a run as made on a kernel under test, in its host fingerprint.
fn tag(run: &mut RunRecord, kernel: &Kernel, choice: &AccelChoice) {
    // The VMM knows the clock it booted the guest on; the guest's own probe read the same from
    // its command line, and an hvlab too old to read it recorded none. A model run is on its
    // profile's clock.
    if choice.clock == Clock::Icount {
        run.measured_on(Clock::Icount);
    }
    run.host.under_test = Some(hvlab_core::host::UnderTest {
        release: run.host.kernel.clone(),
        spec: kernel.spec.clone(),
        source: kernel.source.clone(),
        accel: choice.accel.to_string(),
        cpu_model: choice.cpu_model.clone(),
        kab: None,
    });
}

/// Stores the runs in `store` idempotently.
pub fn store_runs(
    store: &mut crate::store::Store,
    runs: &[RunRecord],
) -> Result<crate::store::transfer::Tally, crate::store::StoreError> {
    crate::store::transfer::ingest_all(store, runs)
}

/// Writes `text` to stderr, ignoring a closed stream.
pub fn say(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_on_the_instruction_clock_is_told_the_hosts_time_in_one_length() {
        let at = |t: &str| humantime::parse_rfc3339(t).expect("a date");
        let one = guest_stamp(Clock::Icount, at("2026-11-29T17:00:00Z"));
        let two = guest_stamp(Clock::Icount, at("2026-11-29T17:00:07Z"));
        let offset = at("2026-11-29T17:00:00Z")
            .duration_since(at(GUEST_RTC_BASE))
            .expect("later")
            .as_secs();
        assert_eq!(one, format!("export HVLAB_CLOCK_OFFSET_S={offset:012}\n"));
        // One length, so two boots' /init run the same instructions.
        assert_eq!(one.len(), two.len());
        assert_ne!(one, two);
        assert_eq!(guest_stamp(Clock::Wall, at("2026-11-29T17:00:00Z")), "");
    }

    #[test]
    fn two_boots_identical_runs_come_home_with_ids_of_their_own_and_their_output_says_them() {
        let text = include_str!("../../tests/fixtures/kab-icount-exits/runs.jsonl");
        let run: RunRecord = serde_json::from_str(text.lines().next().unwrap_or_default())
            .expect("the fixture's first line is a run");
        let id = run.run_id.clone();
        let command = || GuestCommand {
            args: vec!["run".into()],
            rc: Some(0),
            stdout: format!("stored run {id}\n"),
            stderr: String::new(),
        };
        let (mut one, mut two) = (vec![run.clone()], vec![run]);
        let (mut out_one, mut out_two) = (vec![command()], vec![command()]);
        fresh_ids(&mut one, &mut out_one);
        fresh_ids(&mut two, &mut out_two);
        assert_ne!(one[0].run_id, two[0].run_id);
        for (r, out) in [(&one[0], &out_one[0]), (&two[0], &out_two[0])] {
            assert_ne!(r.run_id, id);
            assert_eq!(r.run_id.len(), id.len());
            let stem = id.rsplit_once('-').map(|(s, _)| s).expect("an id");
            assert!(r.run_id.starts_with(stem), "{}", r.run_id);
            assert_eq!(out.stdout, format!("stored run {}\n", r.run_id));
        }
    }

    #[test]
    fn frames_survive_a_truncated_tail() {
        let mut raw = b"noise@@hvlab-file a 3\nxyz@@hvlab-file b 2\nhi".to_vec();
        raw.extend_from_slice(b"@@hvlab-file c 10\nshort");
        let f = frames(&raw);
        assert_eq!(
            f,
            vec![
                ("a".to_string(), b"xyz".to_vec()),
                ("b".to_string(), b"hi".to_vec())
            ]
        );
    }

    #[test]
    fn an_oops_is_quoted_from_its_first_line() {
        let log =
            "booting\n[ 1.0] int3: 0000 [#1] PREEMPT SMP NOPTI\n[ 1.0] RIP: __schedule+0x1\nmore\n";
        let e = oops_excerpt(log).unwrap();
        assert!(e.starts_with("  [ 1.0] int3: 0000"), "{e}");
        assert!(e.contains("__schedule"));
        assert_eq!(oops_excerpt("clean boot\n@@hvlab-ready 3.1\n"), None);
    }
}
