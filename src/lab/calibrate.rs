//! `hvlab calibrate`: measure this host's cost profile with the kvm backend.
//!
//! Each value is solved from scenario runs whose event counts the model knows exactly, and its
//! provenance says which run and which formula. Values calibrate does not measure are copied
//! from the built-in profile closest to this host, and say so.

use crate::backend::Backend;
use crate::backend::host::KvmFlavour;
use crate::error::Error;
use crate::kvm::pin;
use crate::model::profile::{MmuKind, Profile};
use crate::record::{MetricRecord, RunRecord};
use crate::scenario::runner::{Progress, RunRequest};
use crate::scenario::{self, exits, lifecycle, memory};

/// A metric of a variant that ran, or the calibration error naming what is missing.
fn metric<'a>(r: &'a RunRecord, variant: &str, metric: &str) -> Result<&'a MetricRecord, Error> {
    r.variant(variant)
        .filter(|v| v.is_ok())
        .and_then(|v| v.metrics.get(metric))
        .ok_or_else(|| Error::Calibration {
            scenario: r.scenario.clone(),
            metric: metric.to_string(),
            variant: variant.to_string(),
            status: r
                .variant(variant)
                .map_or("variant missing".to_string(), |v| v.status.to_string()),
        })
}

fn med(r: &RunRecord, variant: &str, name: &str) -> Result<f64, Error> {
    metric(r, variant, name).map(|m| m.median)
}

/// The lower quartile of a metric's samples (the sample a quarter up, not interpolated; its
/// median when no samples were kept).
fn low(m: &MetricRecord) -> f64 {
    let mut v: Vec<f64> = m
        .samples
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 4).copied().unwrap_or(m.median)
}

/// [`low`] of a metric of a variant that ran.
fn lower_quartile(r: &RunRecord, variant: &str, name: &str) -> Result<f64, Error> {
    metric(r, variant, name).map(low)
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

/// Sets a measured cost, unless the measurement did not yield a positive finite number (a
/// noisy or emulated host, a mechanism this host lacks): then the built-in value stays, and
/// its provenance says what calibrate solved and why it was not used. A profile never gets a
/// zero or negative cost from calibrate.
fn put_measured(p: &mut Profile, key: &str, value: f64, unit: &str, provenance: String) {
    if value.is_finite() && value > 0.0 {
        p.set(key, value, unit, provenance);
    } else if let Some(kept) = p.costs.get_mut(key) {
        kept.provenance = format!(
            "calibrate solved {value:.1} {unit} ({provenance}), not a positive cost, so it was not used; {}",
            kept.provenance
        );
    }
}

/// Mean time for one thread to wake another that sleeps on a channel: half a ping-pong round
/// trip, over `round_trips`.
fn thread_wakeup_ns(round_trips: u32) -> f64 {
    let (to_peer, peer_in) = std::sync::mpsc::sync_channel::<u32>(0);
    let (to_us, our_in) = std::sync::mpsc::sync_channel::<u32>(0);
    let peer = std::thread::spawn(move || {
        while let Ok(v) = peer_in.recv() {
            if to_us.send(v).is_err() {
                break;
            }
        }
    });
    let start = std::time::Instant::now();
    let mut done = 0u32;
    for i in 0..round_trips {
        if to_peer.send(i).is_err() || our_in.recv().is_err() {
            break;
        }
        done += 1;
    }
    let elapsed = start.elapsed().as_nanos() as f64;
    drop(to_peer);
    // The peer ends when the channel closes; a panic there only loses this measurement.
    let _ = peer.join();
    if done == 0 {
        return f64::NAN;
    }
    elapsed / f64::from(done) / 2.0
}

/// Measures a profile named `this-host` with the kvm backend.
pub fn calibrate(backend: &mut dyn Backend, progress: &dyn Progress) -> Result<Profile, Error> {
    let host = backend.host().clone();
    let (base_name, base_match) = crate::model::builtin_for(host.kvm_flavour);
    let mut p = Profile::load(base_name).map_err(crate::model::ModelError::from)?;
    for cost in p.costs.values_mut() {
        cost.provenance = format!(
            "not measured by calibrate; from built-in profile {base_name} ({base_match}): {}",
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
    // On an emulated CPU (QEMU TCG) every fault and exit costs milliseconds and the times mean
    // nothing: calibrate there at small points so it finishes, and the profile still gets
    // every value through the same formulas.
    let small = host.cpu_emulated();
    let (size, pin_bytes, iterations) = if small {
        ("size=8MiB", 8usize << 20, "iterations=200")
    } else {
        ("size=64MiB", 64usize << 20, "iterations=5000")
    };
    let tag = |what: &str| format!("hvlab calibrate {when}: {what}");
    p.set("hz", f64::from(host.hz), "Hz", tag(&host.hz_source));
    // Which vCPU creation swaps memslots is a property of the flavour's code, not a cost.
    let (adds, why) = match host.kvm_flavour {
        KvmFlavour::Vmx => (
            1.0,
            "vmx_vcpu_create() adds the APIC-access page memslot (kvm_alloc_apic_access_page())",
        ),
        KvmFlavour::Svm => (
            0.0,
            "SVM adds the APIC-access memslot only with AVIC (avic_init_vcpu()), off by default",
        ),
        _ => (
            0.0,
            "no private memslot appears at vCPU creation on this flavour",
        ),
    };
    p.set(
        "first_vcpu_adds_memslot",
        adds,
        "bool",
        tag(&format!("{} KVM: {why}", host.kvm_flavour)),
    );

    // Lifecycle: ioctl costs from the unstalled order, the wake-up latency from the stall.
    let lc = run(
        backend,
        &lifecycle::INFO,
        &["memslots-first", "irqchip-first"],
        &[],
        10,
        progress,
    )?;
    // Unstalled costs: a busy host only ever adds to an ioctl (a kworker or the VMM thread
    // waiting for a CPU), so the lower quartile estimates the cost better than the median.
    let per = |ioctl: &str, n: f64| -> Result<f64, Error> {
        Ok(lower_quartile(&lc, "memslots-first", &format!("ioctl.{ioctl}_ms"))? * 1e6 / n)
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
        put_measured(
            &mut p,
            key,
            per(ioctl, n)?,
            "ns",
            tag(&format!(
                "lifecycle memslots-first, lower quartile of ioctl.{ioctl}_ms / {n}"
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
    put_measured(
        &mut p,
        "ioctl_regs_ns",
        regs,
        "ns",
        tag("lifecycle memslots-first, mean of the GET/SET SREGS/REGS lower quartiles"),
    );
    // The ready time's median, not its lower quartile: what validate compares is medians, and
    // the gaps between ioctls (VMM work, scheduling) are where a shared machine's wait lands.
    let ready = med(&lc, "memslots-first", "ready_ms")? * 1e6;
    let ioctls: f64 = lc
        .variant("memslots-first")
        .map(|v| {
            v.metrics
                .iter()
                .filter(|(k, _)| k.starts_with("ioctl."))
                .map(|(_, m)| low(m) * 1e6)
                .sum()
        })
        .unwrap_or(0.0);
    // create-vm, memslot, irqchip, pit, the ioeventfds, one vCPU, four register ioctls, run.
    let count = 1.0 + 1.0 + 1.0 + 1.0 + devices + 1.0 + 4.0 + 1.0;
    put_measured(
        &mut p,
        "vmm_gap_ns",
        (ready - ioctls) / count,
        "ns",
        tag(&format!(
            "lifecycle memslots-first, (median ready - sum of ioctl lower quartiles) / {count} ioctls"
        )),
    );
    // SRCU hands each step of a grace period to a sleeping task (the grace-period work, the
    // callback invocation, the synchronizer): measured directly as a thread wake-up, not
    // solved from a stall, so the lifecycle stalls validate compares stay predictions.
    let wakeup = thread_wakeup_ns(2_000);
    put_measured(
        &mut p,
        "srcu_wakeup_ns",
        wakeup,
        "ns",
        tag(
            "half the round trip of a two-thread channel ping-pong (2000 round trips): one wake-up of a sleeping task",
        ),
    );

    // Memory: fault costs from passes whose fault and prefetch counts are known.
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
        .map_err(crate::model::ModelError::from)?;
    let fault = med(&m4, "populated", "ns_per_page")? - touch;
    put_measured(
        &mut p,
        "stage2_fault_ns",
        fault,
        "ns",
        tag("memory populated, 4 KiB guest pages (no prefetch): ns_per_page - touch_page_ns"),
    );
    let t_pop = med(&m2, "populated", "ns_per_page")?;
    // The TDP MMU never prefetches: there is nothing to measure, and nothing the model charges.
    let prefetch = if p.mmu == MmuKind::TdpMmu {
        0.0
    } else {
        let solved = (8.0 * t_pop - fault) / 7.0;
        put_measured(
            &mut p,
            "prefetch_page_ns",
            solved,
            "ns",
            tag(
                "memory populated, 2 MiB guest pages: (8 x ns_per_page - stage2_fault_ns) / 7 prefetched",
            ),
        );
        solved.max(0.0)
    };
    let t_lazy = med(&m2, "lazy", "ns_per_page")?;
    put_measured(
        &mut p,
        "host_fault_ns",
        t_lazy - fault,
        "ns",
        tag("memory lazy: ns_per_page - stage2_fault_ns"),
    );
    if let Ok(t_thp) = med(&m2, "thp", "ns_per_page") {
        put_measured(
            &mut p,
            "host_fault_huge_ns",
            t_thp * 512.0 - fault,
            "ns",
            tag("memory thp: 512 x ns_per_page - stage2_fault_ns"),
        );
    }
    let t1 = med(&m2, "uffd", "ns_per_page")?;
    let t8 = med(&m2, "uffd-prefetch", "ns_per_page")?;
    let copy = (8.0 * t8 - t1) / 7.0 - prefetch;
    put_measured(
        &mut p,
        "uffd_copy_page_ns",
        copy,
        "ns",
        tag("memory uffd and uffd-prefetch (window 8): (8 x T8 - T1) / 7 - prefetch_page_ns"),
    );
    put_measured(
        &mut p,
        "uffd_fault_ns",
        t1 - fault - copy.max(0.0),
        "ns",
        tag("memory uffd: T1 - stage2_fault_ns - uffd_copy_page_ns"),
    );

    // Exits.
    let ex = run(
        backend,
        &exits::INFO,
        &["pio-out", "cpuid"],
        &[iterations],
        5,
        progress,
    )?;
    let pio = med(&ex, "pio-out", "roundtrip_ns")?;
    put_measured(
        &mut p,
        "exit_userspace_ns",
        pio,
        "ns",
        tag("exits pio-out roundtrip_ns"),
    );
    put_measured(
        &mut p,
        "exit_kernel_ns",
        med(&ex, "cpuid", "roundtrip_ns")?,
        "ns",
        tag("exits cpuid roundtrip_ns"),
    );
    put_measured(
        &mut p,
        "cpu_ghz",
        med(&ex, "pio-out", "tsc_per_iter")? / pio,
        "GHz",
        tag("exits pio-out tsc_per_iter / roundtrip_ns (TSC rate)"),
    );

    // Pinning with mlock.
    let m = pin::mlock_costs(pin_bytes)?;
    put_measured(
        &mut p,
        "pin_page_ns",
        m.pin_page_ns,
        "ns",
        tag(&format!(
            "mlock of a fresh {} MiB buffer, per 4 KiB page",
            pin_bytes >> 20
        )),
    );
    put_measured(
        &mut p,
        "repin_page_ns",
        m.repin_page_ns,
        "ns",
        tag("mlock of the same, resident, buffer, per page"),
    );
    put_measured(
        &mut p,
        "unpin_page_ns",
        m.unpin_page_ns,
        "ns",
        tag(&format!(
            "munlock of the {} MiB buffer, per page",
            pin_bytes >> 20
        )),
    );
    Ok(p)
}
