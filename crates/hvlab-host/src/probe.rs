//! The host probe: what this machine is, read from /proc and sysfs (the kernel, the CPU, the
//! KVM flavour and its MMU, HZ, THP), into the [`HostInfo`] every run carries. The kvm backend
//! adds what an open `/dev/kvm` reports ([`probe_with`]'s arguments).

use std::collections::BTreeMap;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use hvlab_core::host::{Clock, HostInfo, KvmFlavour};

/// Where hvlab looks for the KVM device; `HVLAB_KVM_DEVICE` overrides it (tests use this to
/// exercise the missing-device path, and it helps on hosts with a renamed node). An empty
/// value counts as unset.
pub fn kvm_device_path() -> PathBuf {
    std::env::var_os("HVLAB_KVM_DEVICE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/dev/kvm"))
}

/// Probes the host. Never fails: what cannot be read is reported as unknown. `kvm_access` is
/// `ok` or why `/dev/kvm` cannot be used, and `capabilities` what an open KVM reported; the
/// kvm backend fills both, a build without it says so.
pub fn probe_with(kvm_access: String, capabilities: BTreeMap<String, bool>) -> HostInfo {
    let flavour = detect_flavour(&kvm_access);
    let (hz, hz_source) = detect_hz();
    HostInfo {
        kernel: read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into()),
        cpu: cpu_model().unwrap_or_else(|| "unknown".into()),
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        kvm_flavour: flavour,
        tdp: detect_tdp(flavour),
        tdp_mmu: read_bool_param("/sys/module/kvm/parameters/tdp_mmu"),
        vpmu: read_bool_param("/sys/module/kvm/parameters/enable_pmu"),
        hz,
        hz_source,
        thp: thp_mode().unwrap_or_else(|| "unknown".into()),
        hypervisor: hypervisor_signature(),
        kvm_access,
        capabilities,
        // The binary names its own version and revision (one build script computes it).
        hvlab_version: String::new(),
        git_rev: String::new(),
        under_test: None,
        clock: Clock::from_cmdline(&read_trimmed("/proc/cmdline").unwrap_or_default()),
    }
}

fn read_trimmed(path: impl AsRef<Path>) -> Option<String> {
    fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn read_bool_param(path: &str) -> Option<bool> {
    parse_bool_param(&read_trimmed(path)?)
}

/// Module parameters print booleans as `Y`/`N` and integers as `1`/`0`.
fn parse_bool_param(s: &str) -> Option<bool> {
    match s {
        "Y" | "y" | "1" => Some(true),
        "N" | "n" | "0" => Some(false),
        _ => None,
    }
}

/// The CPUID hypervisor signature (leaf 0x40000000, EBX:ECX:EDX), when CPUID.1:ECX bit 31
/// says a hypervisor is present.
#[cfg(target_arch = "x86_64")]
fn hypervisor_signature() -> Option<String> {
    use std::arch::x86_64::__cpuid;
    // CPUID is available on every x86-64 CPU and has no side effects.
    let leaf1 = __cpuid(1);
    if leaf1.ecx & (1 << 31) == 0 {
        return None;
    }
    let sig = __cpuid(0x4000_0000);
    let bytes: Vec<u8> = [sig.ebx, sig.ecx, sig.edx]
        .iter()
        .flat_map(|r| r.to_le_bytes())
        .filter(|b| *b != 0)
        .collect();
    Some(String::from_utf8_lossy(&bytes).trim().to_string())
}

#[cfg(not(target_arch = "x86_64"))]
fn hypervisor_signature() -> Option<String> {
    None
}

fn cpu_model() -> Option<String> {
    let info = fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name") || l.starts_with("CPU part"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
}

fn cpu_flags() -> Vec<String> {
    fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|l| l.starts_with("flags"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.split_whitespace().map(String::from).collect())
        })
        .unwrap_or_default()
}

/// The loaded vendor module decides the flavour; CPU flags break ties when modules are built in
/// under other names. PVM is checked first: it runs on hosts whose CPUs also advertise VMX/SVM.
/// The device's presence decides whether there is a flavour, not this process's right to
/// open it: a node is the same host to the fleet whether or not a job may use its /dev/kvm.
fn detect_flavour(kvm_access: &str) -> KvmFlavour {
    use std::os::unix::fs::FileTypeExt;
    let present = fs::metadata(kvm_device_path()).is_ok_and(|m| m.file_type().is_char_device());
    if kvm_access != "ok" && !present {
        return KvmFlavour::None;
    }
    let module = |name: &str| Path::new("/sys/module").join(name).exists();
    if module("kvm_pvm") {
        KvmFlavour::Pvm
    } else if cfg!(target_arch = "aarch64") {
        KvmFlavour::Arm64
    } else if module("kvm_intel") {
        KvmFlavour::Vmx
    } else if module("kvm_amd") {
        KvmFlavour::Svm
    } else {
        let flags = cpu_flags();
        if flags.iter().any(|f| f == "vmx") {
            KvmFlavour::Vmx
        } else if flags.iter().any(|f| f == "svm") {
            KvmFlavour::Svm
        } else {
            KvmFlavour::None
        }
    }
}

fn detect_tdp(flavour: KvmFlavour) -> Option<bool> {
    match flavour {
        KvmFlavour::Vmx => read_bool_param("/sys/module/kvm_intel/parameters/ept"),
        KvmFlavour::Svm => read_bool_param("/sys/module/kvm_amd/parameters/npt"),
        // PVM is shadow paging by construction; arm64 always has stage 2.
        KvmFlavour::Pvm => Some(false),
        KvmFlavour::Arm64 => Some(true),
        KvmFlavour::None => None,
    }
}

fn thp_mode() -> Option<String> {
    let s = read_trimmed("/sys/kernel/mm/transparent_hugepage/enabled")?;
    parse_bracketed_choice(&s)
}

/// sysfs shows the active choice in brackets: `always [madvise] never`.
fn parse_bracketed_choice(s: &str) -> Option<String> {
    let start = s.find('[')?;
    let end = s[start..].find(']')? + start;
    Some(s[start + 1..end].to_string())
}

/// HZ from the kernel config when it is readable, else measured from the resolution of the
/// coarse clock, which advances once per tick.
fn detect_hz() -> (u32, String) {
    if let Some(hz) = hz_from_proc_config() {
        return (hz, "kernel config (/proc/config.gz)".into());
    }
    let release = read_trimmed("/proc/sys/kernel/osrelease").unwrap_or_default();
    let boot_config = format!("/boot/config-{release}");
    if let Some(hz) = fs::read_to_string(&boot_config)
        .ok()
        .and_then(|c| parse_config_hz(&c))
    {
        return (hz, format!("kernel config ({boot_config})"));
    }
    match hz_from_coarse_clock() {
        Some(hz) => (hz, "measured: clock_getres(CLOCK_MONOTONIC_COARSE)".into()),
        None => (250, "assumed (no config, coarse clock unreadable)".into()),
    }
}

fn hz_from_proc_config() -> Option<u32> {
    let file = fs::File::open("/proc/config.gz").ok()?;
    // The config is gzip; decompress with the system's gzip rather than pulling in a crate for
    // one read. Absent gzip, fall through to the measured value.
    let mut child = std::process::Command::new("gzip")
        .arg("-dc")
        .stdin(file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let mut text = String::new();
    child.stdout.take()?.read_to_string(&mut text).ok()?;
    child.wait().ok()?;
    parse_config_hz(&text)
}

/// Finds `CONFIG_HZ=N` in a kernel config.
pub fn parse_config_hz(config: &str) -> Option<u32> {
    config
        .lines()
        .find_map(|l| l.strip_prefix("CONFIG_HZ="))
        .and_then(|v| v.trim().parse().ok())
        .filter(|hz| *hz > 0)
}

fn hz_from_coarse_clock() -> Option<u32> {
    let res = rustix::time::clock_getres(rustix::time::ClockId::MonotonicCoarse);
    if res.tv_sec != 0 || res.tv_nsec <= 0 {
        return None;
    }
    let ns = u64::try_from(res.tv_nsec).ok()?;
    u32::try_from((1_000_000_000 + ns / 2) / ns).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_hz_is_found_among_other_options() {
        let cfg = "# CONFIG_HZ_100 is not set\nCONFIG_HZ_250=y\nCONFIG_HZ=250\nCONFIG_KVM=y\n";
        assert_eq!(parse_config_hz(cfg), Some(250));
        assert_eq!(parse_config_hz("CONFIG_KVM=y\n"), None);
        assert_eq!(parse_config_hz("CONFIG_HZ=0\n"), None);
    }

    #[test]
    fn thp_mode_is_the_bracketed_choice() {
        assert_eq!(
            parse_bracketed_choice("always [madvise] never").as_deref(),
            Some("madvise")
        );
        assert_eq!(
            parse_bracketed_choice("[always] madvise never").as_deref(),
            Some("always")
        );
        assert_eq!(parse_bracketed_choice("always madvise never"), None);
    }

    #[test]
    fn module_parameters_parse_as_booleans() {
        assert_eq!(parse_bool_param("Y"), Some(true));
        assert_eq!(parse_bool_param("N"), Some(false));
        assert_eq!(parse_bool_param("1"), Some(true));
        assert_eq!(parse_bool_param("maybe"), None);
    }

    #[test]
    fn coarse_clock_gives_a_plausible_tick_rate() {
        // Linux ships HZ between 100 and 1000; a measurement outside that is a broken probe.
        let hz = hz_from_coarse_clock().expect("coarse clock resolution");
        assert!((90..=1100).contains(&hz), "HZ measured as {hz}");
    }
}
