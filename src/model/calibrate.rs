//! `hvlab calibrate`: measure this host's cost profile with the kvm backend.
//!
//! Each value is solved from scenario runs whose event counts the model knows exactly, and its
//! provenance says which run and which formula. Values calibrate does not measure are copied
//! from the built-in profile closest to this host, and say so.

use super::profile::{MmuKind, Profile};
use crate::backend::Backend;
use crate::error::Error;
use crate::kvm::host::KvmFlavour;
use crate::kvm::pin;
use crate::record::RunRecord;
use crate::scenario::runner::{Progress, RunRequest};
use crate::scenario::{self, exits, lifecycle, memory};

fn med(r: &RunRecord, variant: &str, metric: &str) -> Result<f64, Error> {
    r.variant(variant)
        .filter(|v| v.is_ok())
        .and_then(|v| v.metrics.get(metric))
        .map(|m| m.median)
        .ok_or_else(|| {
            crate::error::InputError::Other(format!(
                "calibration run {} has no {metric} for {variant}: {}",
                r.scenario,
                r.variant(variant)
                    .map_or("variant missing", |v| v.status.as_str())
            ))
            .into()
        })
}

fn run(
    backend: &mut dyn Backend,
    info: &'static scenario::ScenarioInfo,
    variants: &[&str],
    sets: &[&str],
    reps: u32,
    progress: &dyn Progress,
) -> Result<RunRecord, Error> {
    let request = RunRequest {
        variants: variants.iter().map(|s| s.to_string()).collect(),
        sets: sets.iter().map(|s| s.to_string()).collect(),
        reps,
        warmup: 1,
        ..RunRequest::default()
    };
    scenario::run(info, backend, &request, progress)
}

/// Measures a profile named `this-host` with the kvm backend.
pub fn calibrate(backend: &mut dyn Backend, progress: &dyn Progress) -> Result<Profile, Error> {
    let host = backend.host().clone();
    let base_name = match host.kvm_flavour {
        KvmFlavour::Vmx | KvmFlavour::Svm => "intel-spr-vmx",
        KvmFlavour::Arm64 => "neoverse-n2-spe",
        _ => "pvm-epyc",
    };
    let mut p = Profile::load(base_name).map_err(super::ModelError::from)?;
    for cost in p.costs.values_mut() {
        cost.provenance = format!(
            "not measured by calibrate; from built-in profile {base_name}: {}",
            cost.provenance
        );
    }
    p.name = "this-host".into();
    p.mmu = match (host.tdp, host.tdp_mmu) {
        (Some(false), _) => MmuKind::Shadow,
        (_, Some(true)) => MmuKind::TdpMmu,
        _ => MmuKind::Tdp,
    };
    let when = crate::scenario::runner::now_rfc3339();
    p.describes = format!(
        "{} ({}), {} KVM, Linux {}, HZ={}, calibrated {when}",
        host.cpu, host.cores, host.kvm_flavour, host.kernel, host.hz
    );
    let tag = |what: &str| format!("hvlab calibrate {when}: {what}");
    p.set("hz", f64::from(host.hz), "Hz", tag(&host.hz_source));

    // Lifecycle: ioctl costs from the unstalled order, the wake-up latency from the stall.
    let lc = run(
        backend,
        &lifecycle::INFO,
        &["memslots-first", "irqchip-first"],
        &[],
        10,
        progress,
    )?;
    let per = |ioctl: &str, n: f64| -> Result<f64, Error> {
        Ok(med(&lc, "memslots-first", &format!("ioctl.{ioctl}_ms"))? * 1e6 / n)
    };
    let devices = 8.0;
    for (key, ioctl, n) in [
        ("ioctl_create_vm_ns", "KVM_CREATE_VM", 1.0),
        ("ioctl_irqchip_ns", "KVM_CREATE_IRQCHIP", 1.0),
        ("ioctl_pit_ns", "KVM_CREATE_PIT2", 1.0),
        ("ioctl_memslot_ns", "KVM_SET_USER_MEMORY_REGION", 1.0),
        ("ioctl_vcpu_ns", "KVM_CREATE_VCPU", 1.0),
        ("ioctl_ioeventfd_ns", "KVM_IOEVENTFD", devices),
        ("first_run_ns", "KVM_RUN", 1.0),
    ] {
        p.set(
            key,
            per(ioctl, n)?,
            "ns",
            tag(&format!(
                "lifecycle memslots-first, median ioctl.{ioctl}_ms / {n}"
            )),
        );
    }
    // The model charges the four register ioctls before the first run alike: their mean.
    let mut regs = 0.0;
    for ioctl in [
        "KVM_GET_SREGS",
        "KVM_SET_SREGS",
        "KVM_GET_REGS",
        "KVM_SET_REGS",
    ] {
        regs += per(ioctl, 4.0)?;
    }
    p.set(
        "ioctl_regs_ns",
        regs,
        "ns",
        tag("lifecycle memslots-first, mean of the GET/SET SREGS/REGS medians"),
    );
    let ready = med(&lc, "memslots-first", "ready_ms")? * 1e6;
    let ioctls: f64 = lc
        .variant("memslots-first")
        .map(|v| {
            v.metrics
                .iter()
                .filter(|(k, _)| k.starts_with("ioctl."))
                .map(|(_, m)| m.median * 1e6)
                .sum()
        })
        .unwrap_or(0.0);
    // create-vm, memslot, irqchip, pit, the ioeventfds, one vCPU, four register ioctls, run.
    let count = 1.0 + 1.0 + 1.0 + 1.0 + devices + 1.0 + 4.0 + 1.0;
    p.set(
        "vmm_gap_ns",
        ((ready - ioctls) / count).max(0.0),
        "ns",
        tag(&format!(
            "lifecycle memslots-first, (ready - sum of ioctl medians) / {count} ioctls"
        )),
    );
    let jiffy = 1e9 / f64::from(host.hz.max(1));
    let stalled = med(&lc, "irqchip-first", "ioctl.KVM_SET_USER_MEMORY_REGION_ms")? * 1e6;
    let phases = p
        .get("srcu_gp_phases", "calibrate")
        .map_err(super::ModelError::from)?;
    // The grace period starts at the irqchip, one PIT earlier; its first tick is half a jiffy
    // away on average.
    let since_start = per("KVM_CREATE_PIT2", 1.0)?;
    let wakeup = stalled - (jiffy / 2.0 + (phases - 1.0) * jiffy) + since_start;
    p.set(
        "srcu_wakeup_ns",
        wakeup.max(0.0),
        "ns",
        tag(&format!(
            "lifecycle irqchip-first memslot {:.2} ms = tick wait (jiffy/2 + {} jiffies) + this",
            stalled / 1e6,
            phases - 1.0
        )),
    );

    // Memory: fault costs from passes whose fault and prefetch counts are known.
    let size = "size=64MiB";
    let m2 = run(
        backend,
        &memory::INFO,
        &["lazy", "populated", "thp", "uffd", "uffd-prefetch"],
        &[size],
        3,
        progress,
    )?;
    let m4 = run(
        backend,
        &memory::INFO,
        &["populated"],
        &[size, "guest_page=4k"],
        3,
        progress,
    )?;
    let touch = p
        .get("touch_page_ns", "calibrate")
        .map_err(super::ModelError::from)?;
    let fault = med(&m4, "populated", "ns_per_page")? - touch;
    p.set(
        "stage2_fault_ns",
        fault,
        "ns",
        tag("memory populated, 4 KiB guest pages (no prefetch): ns_per_page - touch_page_ns"),
    );
    let t_pop = med(&m2, "populated", "ns_per_page")?;
    let prefetching = p.mmu != MmuKind::TdpMmu;
    let prefetch = if prefetching {
        ((8.0 * t_pop - fault) / 7.0).max(0.0)
    } else {
        0.0
    };
    p.set("prefetch_page_ns", prefetch, "ns", tag("memory populated, 2 MiB guest pages: (8 x ns_per_page - stage2_fault_ns) / 7 prefetched"));
    let t_lazy = med(&m2, "lazy", "ns_per_page")?;
    p.set(
        "host_fault_ns",
        (t_lazy - fault).max(0.0),
        "ns",
        tag("memory lazy: ns_per_page - stage2_fault_ns"),
    );
    if let Ok(t_thp) = med(&m2, "thp", "ns_per_page") {
        p.set(
            "host_fault_huge_ns",
            (t_thp * 512.0 - fault).max(0.0),
            "ns",
            tag("memory thp: 512 x ns_per_page - stage2_fault_ns"),
        );
    }
    let t1 = med(&m2, "uffd", "ns_per_page")?;
    let t8 = med(&m2, "uffd-prefetch", "ns_per_page")?;
    let copy = ((8.0 * t8 - t1) / 7.0 - prefetch).max(0.0);
    p.set(
        "uffd_copy_page_ns",
        copy,
        "ns",
        tag("memory uffd and uffd-prefetch (window 8): (8 x T8 - T1) / 7 - prefetch_page_ns"),
    );
    p.set(
        "uffd_fault_ns",
        (t1 - fault - copy).max(0.0),
        "ns",
        tag("memory uffd: T1 - stage2_fault_ns - uffd_copy_page_ns"),
    );

    // Exits.
    let ex = run(
        backend,
        &exits::INFO,
        &["pio-out", "cpuid"],
        &["iterations=5000"],
        5,
        progress,
    )?;
    let pio = med(&ex, "pio-out", "roundtrip_ns")?;
    p.set(
        "exit_userspace_ns",
        pio,
        "ns",
        tag("exits pio-out roundtrip_ns"),
    );
    p.set(
        "exit_kernel_ns",
        med(&ex, "cpuid", "roundtrip_ns")?,
        "ns",
        tag("exits cpuid roundtrip_ns"),
    );
    p.set(
        "cpu_ghz",
        med(&ex, "pio-out", "tsc_per_iter")? / pio,
        "GHz",
        tag("exits pio-out tsc_per_iter / roundtrip_ns (TSC rate)"),
    );

    // Pinning with mlock.
    let m = pin::mlock_costs(64 << 20)?;
    p.set(
        "pin_page_ns",
        m.pin_page_ns,
        "ns",
        tag("mlock of a fresh 64 MiB buffer, per 4 KiB page"),
    );
    p.set(
        "repin_page_ns",
        m.repin_page_ns,
        "ns",
        tag("mlock of the same, resident, buffer, per page"),
    );
    p.set(
        "unpin_page_ns",
        m.unpin_page_ns,
        "ns",
        tag("munlock of the 64 MiB buffer, per page"),
    );
    Ok(p)
}
