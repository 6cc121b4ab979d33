//! `hvlab calibrate`: measure this host's cost profile with the kvm backend.
//!
//! Each value is solved from scenario runs whose event counts the model knows exactly, and its
//! provenance says which run and which formula. Values calibrate does not measure are copied
//! from the built-in profile closest to this host, and say so.

use crate::kvm::pinning::pins as pin;
use crate::lab::Error;
use crate::model::profile::{MmuKind, Profile};
use crate::record::{MetricRecord, RunRecord};
use crate::scenario::runner::{Progress, RunRequest};
use crate::scenario::{self, Params, exits, lifecycle, memory};
use hvlab_core::Backend;
use hvlab_core::host::{HostInfo, KvmFlavour};
use hvlab_core::ioctl_table::BusRegistration;

mod dirty;

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

/// The quartiles (25th, 50th, 75th percentile, nearest sample) of finite values; NaN when
/// there are none.
fn quartiles(values: &[f64]) -> [f64; 3] {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return [f64::NAN; 3];
    }
    let at = |q: usize| v[(v.len() - 1) * q / 4];
    [at(1), at(2), at(3)]
}

/// "median M (p25 A - p75 B) UNIT over N": how a calibrated value states its spread.
fn spread(q: [f64; 3], scale: f64, unit: &str, n: usize) -> String {
    format!(
        "median {:.1} {unit} (p25 {:.1} - p75 {:.1}) over {n}",
        q[1] * scale,
        q[0] * scale,
        q[2] * scale
    )
}

fn run(
    backend: &mut dyn Backend,
    params: impl Into<Params>,
    variants: &[&str],
    reps: u32,
    progress: &dyn Progress,
) -> Result<RunRecord, Error> {
    let request = RunRequest {
        variants: variants.iter().map(|s| s.to_string()).collect(),
        reps,
        warmup: 1,
        ..RunRequest::new(params.into())
    };
    Ok(scenario::run(backend, &request, progress)?)
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

/// The same ping-pong with both threads on one CPU (the grace-period work `rcu_gp_wq` runs on
/// the CPU that queued it: a wake-up without crossing CPUs). Run on a thread of its own, pinned
/// to the CPU it started on, so the caller keeps its affinity; empty if pinning fails.
fn local_wakeups_ns(round_trips: u32) -> Vec<f64> {
    std::thread::spawn(
        move || match hvlab_host::noise::pin_to(&[rustix::thread::sched_getcpu()]) {
            Ok(()) => thread_wakeups_ns(round_trips),
            Err(_) => Vec::new(),
        },
    )
    .join()
    .unwrap_or_default()
}

/// Times for one thread to wake another that sleeps on a channel: half of each ping-pong
/// round trip, over `round_trips`.
fn thread_wakeups_ns(round_trips: u32) -> Vec<f64> {
    let (to_peer, peer_in) = std::sync::mpsc::sync_channel::<u32>(0);
    let (to_us, our_in) = std::sync::mpsc::sync_channel::<u32>(0);
    let peer = std::thread::spawn(move || {
        while let Ok(v) = peer_in.recv() {
            if to_us.send(v).is_err() {
                break;
            }
        }
    });
    let mut out = Vec::with_capacity(round_trips as usize);
    for i in 0..round_trips {
        let start = std::time::Instant::now();
        if to_peer.send(i).is_err() || our_in.recv().is_err() {
            break;
        }
        out.push(start.elapsed().as_nanos() as f64 / 2.0);
    }
    drop(to_peer);
    // The peer ends when the channel closes; a panic there only loses this measurement.
    let _ = peer.join();
    out
}

/// The share of `n` 1 ms sleeps that woke more than `late_ns` after their deadline, and each
/// sleep's overshoot (ns). A task whose wake-up finds its CPU running another task waits
/// for that task: the same wait the kworker of a grace-period timer has.
fn busy_cpu_fraction(n: u32, late_ns: f64) -> (f64, Vec<f64>) {
    let asked = std::time::Duration::from_millis(1);
    let overshoot: Vec<f64> = (0..n)
        .map(|_| {
            let start = std::time::Instant::now();
            std::thread::sleep(asked);
            start.elapsed().saturating_sub(asked).as_nanos() as f64
        })
        .collect();
    let late = overshoot.iter().filter(|o| **o > late_ns).count();
    (late as f64 / f64::from(n.max(1)), overshoot)
}

/// Quartiles of times on a circle of `period` ns (phases against a tick): unwrapped around
/// their circular mean, so a cluster that straddles the tick is not split in two.
fn circular_quartiles(values: &[f64], period: f64) -> [f64; 3] {
    let turn = std::f64::consts::TAU / period;
    let (sin, cos) = values.iter().fold((0.0, 0.0), |(s, c), v| {
        (s + (v * turn).sin(), c + (v * turn).cos())
    });
    let centre = sin.atan2(cos).rem_euclid(std::f64::consts::TAU) / turn;
    let unwrapped: Vec<f64> = values
        .iter()
        .map(|v| centre + (v - centre + period / 2.0).rem_euclid(period) - period / 2.0)
        .collect();
    quartiles(&unwrapped)
}

/// Sets `<key>_ns` and `<key>_iqr_ns`: where on the tick `phases` (ns since the last tick)
/// cluster, by quartiles on the circle, with `what` and the spread as provenance.
fn put_tick_phase(p: &mut Profile, key: &str, phases: &[f64], jiffy_ns: f64, what: &str) {
    let q = circular_quartiles(phases, jiffy_ns);
    let from = format!(
        "{what}, modulo the {:.0} us jiffy: {}",
        jiffy_ns / 1e3,
        spread(q, 1.0, "ns", phases.len())
    );
    p.set(
        &format!("{key}_ns"),
        q[1].rem_euclid(jiffy_ns),
        "ns",
        from.clone(),
    );
    p.set(&format!("{key}_iqr_ns"), q[2] - q[0], "ns", from);
}

/// Sets a measured fraction, 0 included (an idle host is a measurement too).
fn put_measured_fraction(p: &mut Profile, key: &str, value: f64, provenance: String) {
    if value.is_finite() && (0.0..=1.0).contains(&value) {
        p.set(key, value, "fraction", provenance);
    }
}

/// Measures a profile named `this-host` with the kvm backend.
pub fn calibrate(backend: &mut dyn Backend, progress: &dyn Progress) -> Result<Profile, Error> {
    let host = backend.host().clone();
    let when = crate::scenario::runner::now_rfc3339();
    let mut p = base_profile(&host, &when)?;
    // On an emulated CPU (QEMU TCG) every fault and exit costs milliseconds and the times mean
    // nothing: calibrate there at small points so it finishes, and the profile still gets
    // every value through the same formulas.
    let small = host.cpu_emulated();
    let (size, pin_bytes, iterations) = if small {
        (8u64 << 20, 8usize << 20, 200)
    } else {
        (64u64 << 20, 64usize << 20, 5000)
    };
    let tag = |what: &str| format!("hvlab calibrate {when}: {what}");
    host_facts(&mut p, &host, &tag);
    lifecycle_costs(backend, progress, &mut p, &tag)?;
    srcu_costs(&mut p, &host, &tag);
    memory_costs(backend, progress, &mut p, &tag, size)?;
    exit_costs(backend, progress, &mut p, &tag, iterations)?;
    pin_costs(&mut p, &tag, pin_bytes)?;
    dirty::calibrate(backend, progress, &mut p, &tag, small)?;
    Ok(p)
}

/// The built-in profile closest to this host, renamed `this-host`, every value saying it was
/// not measured until a step below measures it; the MMU and what the profile describes are
/// this host's.
fn base_profile(host: &HostInfo, when: &str) -> Result<Profile, Error> {
    let (base_name, base_match) = crate::model::builtin_for(host.kvm_flavour);
    let mut p = Profile::load(base_name).map_err(crate::model::ModelError::from)?;
    for cost in p.costs.values_mut() {
        cost.provenance = format!(
            "not measured by calibrate; from built-in profile {base_name} ({base_match}): {}",
            cost.provenance
        );
    }
    p.name = "this-host".into();
    // Every time measured below is on this host's clock: instructions on QEMU's.
    p.clock = host.clock;
    p.mmu = match (host.tdp, host.tdp_mmu) {
        (Some(false), _) => MmuKind::Shadow,
        (_, Some(true)) => MmuKind::TdpMmu,
        _ => MmuKind::Tdp,
    };
    p.flavour = Some(host.kvm_flavour);
    p.cpus = u32::try_from(host.cores).ok();
    p.describes = format!(
        "{} ({}), {} KVM, Linux {}, HZ={}, calibrated {when}",
        host.cpu, host.cores, host.kvm_flavour, host.kernel, host.hz
    );
    Ok(p)
}

/// What this host is rather than what it costs: its HZ, whether creating the first vCPU adds a
/// memslot on its flavour, and whether its kernel's bus registrations synchronize.
fn host_facts(p: &mut Profile, host: &HostInfo, tag: &dyn Fn(&str) -> String) {
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
    // Whether the registering ioctls measured below hold a grace period each: a property of the
    // kernel's kvm_io_bus_register_dev(), so the model counts that wait once.
    let (synchronizes, why) = match host.srcu_kernel().registration {
        BusRegistration::Synchronizes => (
            1.0,
            "kvm_io_bus_register_dev() frees the old bus after synchronize_srcu_expedited() \
             (before 6.18): KVM_CREATE_IRQCHIP, KVM_CREATE_PIT2 and KVM_IOEVENTFD wait for a \
             grace period per registration inside their measured costs",
        ),
        BusRegistration::Defers => (
            0.0,
            "kvm_io_bus_register_dev() frees the old bus with call_srcu() (7d9a0273, 6.18): \
             the registering ioctls wait for no grace period",
        ),
    };
    p.set(
        "registration_synchronizes",
        synchronizes,
        "bool",
        tag(&format!("Linux {}: {why}", host.kernel)),
    );
    // How dirty pages are logged is the module's setting, not a cost: with Intel PML the CPU
    // logs writes itself and nothing is write-protected, a mechanism the model does not run.
    let pml_file = "/sys/module/kvm_intel/parameters/pml";
    let (pml, why) = match std::fs::read_to_string(pml_file) {
        Ok(v) if v.trim() == "Y" => (1.0, format!("{pml_file} is Y")),
        Ok(v) => (0.0, format!("{pml_file} is {}", v.trim())),
        Err(_) => (
            0.0,
            format!("no {pml_file}: dirty pages are logged by write-protection"),
        ),
    };
    p.set("dirty_log_pml", pml, "bool", tag(&why));
}

/// Lifecycle: ioctl costs from the unstalled order, and the VMM's own time between them.
fn lifecycle_costs(
    backend: &mut dyn Backend,
    progress: &dyn Progress,
    p: &mut Profile,
    tag: &dyn Fn(&str) -> String,
) -> Result<(), Error> {
    let lc = run(
        backend,
        lifecycle::LifecycleParams::default(),
        &["memslots-first", "irqchip-first"],
        10,
        progress,
    )?;
    // The unstalled order's ioctls and the VMM's gaps from the run of every order
    // interleaved, the run validate, `hvlab run lifecycle` and a kab's boots make: what ran
    // before a build changes its KVM_CREATE_VM (Debian 7.3 under TCG, in instructions:
    // 235,115 interleaved with irqchip-first builds only, 220,778 with every order).
    let every = boot_start_costs(backend, progress, p, tag)?;
    let builds = metric(&every, "memslots-first", "ready_ms")?.samples.len();
    ioctl_costs(&every, builds, p, tag)?;
    vmm_gap(&every, p, tag)?;
    // Between back-to-back builds that do not boot: where each VM's teardown ended against the
    // tick, and the VMM's setup of the next. Each build of either variant follows one of the
    // other's.
    let jiffy_ns = 1e9 / f64::from(backend.host().hz.max(1));
    let plain = ["memslots-first", "irqchip-first"];
    let builds = tag("lifecycle memslots-first and irqchip-first, interleaved");
    put_between_builds(
        p,
        "",
        &teardown_ends(&lc, &plain, jiffy_ns)?,
        &setups(&lc, &plain)?,
        jiffy_ns,
        [&builds, &builds],
    );
    Ok(())
}

/// ioeventfds a default lifecycle build registers.
const LIFECYCLE_DEVICES: f64 = 8.0;

/// Each construction ioctl's unstalled cost in `lc`'s `lc_builds` memslots-first builds (every
/// order interleaved), and the register ioctls' before the first run.
fn ioctl_costs(
    lc: &RunRecord,
    lc_builds: usize,
    p: &mut Profile,
    tag: &dyn Fn(&str) -> String,
) -> Result<(), Error> {
    // Unstalled costs, as medians: validate compares the model's medians with the kvm
    // side's, and the gap below is solved build by build against the same builds' ioctls, so
    // every part of a build is the same statistic of one set of builds. (Lower quartiles of
    // the ioctls against the median of the ready time put a drifting host's slow half into
    // the gap alone.)
    let per_q = |ioctl: &str, n: f64| -> Result<[f64; 3], Error> {
        let m = metric(lc, "memslots-first", &format!("ioctl.{ioctl}_ms"))?;
        Ok(quartiles(&m.samples).map(|v| v * 1e6 / n))
    };
    let per = |ioctl: &str, n: f64| -> Result<f64, Error> { Ok(per_q(ioctl, n)?[1]) };
    for (key, ioctl, n) in [
        ("ioctl_create_vm_ns", "KVM_CREATE_VM", 1.0),
        ("ioctl_irqchip_ns", "KVM_CREATE_IRQCHIP", 1.0),
        ("ioctl_pit_ns", "KVM_CREATE_PIT2", 1.0),
        ("ioctl_memslot_ns", "KVM_SET_USER_MEMORY_REGION", 1.0),
        ("ioctl_vcpu_ns", "KVM_CREATE_VCPU", 1.0),
        ("ioctl_cpuid_ns", "KVM_SET_CPUID2", 1.0),
        ("ioctl_ioeventfd_ns", "KVM_IOEVENTFD", LIFECYCLE_DEVICES),
        ("first_run_ns", "KVM_RUN", 1.0),
    ] {
        let q = per_q(ioctl, n)?;
        put_measured(
            p,
            key,
            q[1],
            "ns",
            tag(&format!(
                "lifecycle memslots-first (every order interleaved), ioctl.{ioctl}_ms / {n}: {}",
                spread(q, 1.0, "ns", lc_builds)
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
        p,
        "ioctl_regs_ns",
        regs,
        "ns",
        tag(
            "lifecycle memslots-first (every order interleaved), mean of the GET/SET SREGS/REGS medians",
        ),
    );
    Ok(())
}

/// The VMM's own time between ioctls, build by build: that build's ready time less that
/// build's ioctls, over the ioctls it issued; the median over `lc`'s memslots-first builds,
/// with its spread.
fn vmm_gap(lc: &RunRecord, p: &mut Profile, tag: &dyn Fn(&str) -> String) -> Result<(), Error> {
    // create-vm, memslot, irqchip, pit, the ioeventfds, one vCPU and its CPUID, four register
    // ioctls, run.
    let count = 1.0 + 1.0 + 1.0 + 1.0 + LIFECYCLE_DEVICES + 2.0 + 4.0 + 1.0;
    let ready = metric(lc, "memslots-first", "ready_ms")?;
    let ioctl_samples: Vec<&Vec<f64>> = lc
        .variant("memslots-first")
        .map(|v| {
            v.metrics
                .iter()
                .filter(|(k, _)| k.starts_with("ioctl."))
                .map(|(_, m)| &m.samples)
                .collect()
        })
        .unwrap_or_default();
    let gaps: Vec<f64> = (0..ready.samples.len())
        .map(|i| {
            let ioctls: f64 = ioctl_samples
                .iter()
                .map(|s| s.get(i).copied().unwrap_or(f64::NAN))
                .sum();
            (ready.samples[i] - ioctls) * 1e6 / count
        })
        .collect();
    let q = quartiles(&gaps);
    put_measured(
        p,
        "vmm_gap_ns",
        q[1],
        "ns",
        tag(&format!(
            "lifecycle memslots-first (every order interleaved), per build (ready - its ioctls) / {count} ioctls: {}",
            spread(q, 1.0, "ns", gaps.len())
        )),
    );
    Ok(())
}

/// Where the teardown of the VM before each build of `variants` in `r` ended: the time since
/// the last tick, ns (that build's start against the tick less the VMM's setup before it, on
/// the jiffy).
fn teardown_ends(r: &RunRecord, variants: &[&str], jiffy_ns: f64) -> Result<Vec<f64>, Error> {
    let mut ends = Vec::new();
    for v in variants {
        let starts = &metric(r, v, "tick_phase_ms")?.samples;
        let setups = &metric(r, v, "between_builds.setup_ms")?.samples;
        // Both are per build; the process's very first build has no setup to report, and a
        // warm-up build is never it.
        if starts.len() != setups.len() {
            return Err(Error::Calibration {
                scenario: r.scenario.clone(),
                metric: "between_builds.setup_ms".into(),
                variant: v.to_string(),
                status: format!(
                    "{} setups for {} builds: not one per build",
                    setups.len(),
                    starts.len()
                ),
            });
        }
        ends.extend(
            starts
                .iter()
                .zip(setups)
                .map(|(start, setup)| ((start - setup) * 1e6).rem_euclid(jiffy_ns)),
        );
    }
    Ok(ends)
}

/// The VMM's setup before each build of `variants` in `r`, ns.
fn setups(r: &RunRecord, variants: &[&str]) -> Result<Vec<f64>, Error> {
    let mut all = Vec::new();
    for v in variants {
        all.extend(
            metric(r, v, "between_builds.setup_ms")?
                .samples
                .iter()
                .map(|ms| ms * 1e6),
        );
    }
    Ok(all)
}

/// Sets what the model places back-to-back builds with ([`hvlab_model::lifecycle`]'s
/// `BetweenBuilds`), for the builds `prefix` names (`""`: that do not boot, `"boot_"`: that
/// boot): where their teardowns end against the tick (`<prefix>teardown_tick_phase_ns`, its
/// IQR) and the setup of one (`<prefix>vmm_setup_ns`, its IQR); `builds` says which were
/// measured, `[teardowns, setups]`.
fn put_between_builds(
    p: &mut Profile,
    prefix: &str,
    teardown_ends: &[f64],
    setups: &[f64],
    jiffy_ns: f64,
    [torn_down, set_up]: [&str; 2],
) {
    if !teardown_ends.is_empty() {
        put_tick_phase(
            p,
            &format!("{prefix}teardown_tick_phase"),
            teardown_ends,
            jiffy_ns,
            &format!(
                "{torn_down}: where each VM's teardown (its fds closed: kvm_destroy_vm() and its barriers; its memory unmapped) ended, the next build's tick_phase_ms less its between_builds.setup_ms"
            ),
        );
    }
    let q = quartiles(setups);
    let from = format!(
        "{set_up}: between_builds.setup_ms, from the last VM's teardown to this one's KVM_CREATE_VM: {}",
        spread(q, 1.0, "ns", setups.len())
    );
    put_measured(
        p,
        &format!("{prefix}vmm_setup_ns"),
        q[1],
        "ns",
        from.clone(),
    );
    if q[2] >= q[0] {
        p.set(
            &format!("{prefix}vmm_setup_iqr_ns"),
            q[2] - q[0],
            "ns",
            from,
        );
    }
}

/// An order that boots: the first `KVM_RUN` of its 64-bit guest (boot-activation's run ioctl),
/// the VMM's setup of its VM and where its teardown ends against the tick, how the VMM's boot
/// thread gets a CPU and wakes, and the VMM's start of that thread (a `dup()` of an fd and a
/// thread spawn, timed here).
///
/// Measured in a run of every lifecycle variant, interleaved build by build, as `hvlab run
/// lifecycle`, the suite, validate and a kab's boots run them: a boot thread's first run
/// depends on what ran just before. After other orders' builds the new thread is often left
/// behind the vCPU thread until a tick; boot builds run back to back (here, 0 of 20 such
/// threads waited for a tick) would describe another VMM. On an emulated CPU too: run alone
/// under TCG (Debian 7.3), boot-activation's first run took 1.34 ms against 1.45 ms
/// interleaved and its boot thread never waited for a tick (0 of 10, against 5 of 10), which
/// put the model's boot registrations just before the tick the kab's fell just after.
fn boot_start_costs(
    backend: &mut dyn Backend,
    progress: &dyn Progress,
    p: &mut Profile,
    tag: &dyn Fn(&str) -> String,
) -> Result<RunRecord, Error> {
    const BOOT: &str = "boot-activation";
    // Interleaved everywhere, as the kab's boots run them too; on an emulated CPU, as few
    // repetitions as before keeps calibrate's time there.
    let reps = if backend.host().cpu_emulated() {
        10
    } else {
        20
    };
    let variants: Vec<&str> = lifecycle::INFO.variants.iter().map(|v| v.name).collect();
    let builds = "lifecycle boot-activation builds interleaved with every other order";
    let boot = run(
        backend,
        lifecycle::LifecycleParams::default(),
        &variants,
        reps,
        progress,
    )?;
    let runs = &metric(&boot, BOOT, "ioctl.KVM_RUN_ms")?.samples;
    let q = quartiles(runs).map(|ms| ms * 1e6);
    put_measured(
        p,
        "first_run_long_mode_ns",
        q[1],
        "ns",
        tag(&format!(
            "lifecycle boot-activation, ioctl.KVM_RUN_ms (a 64-bit CPL3 guest to its first exit): {}",
            spread(q, 1.0, "ns", runs.len())
        )),
    );
    let jiffy_ns = 1e9 / f64::from(backend.host().hz.max(1));
    // The boot variant's samples of `name`, in ns (`per_ns`: ns per unit of the metric).
    let ns_of = |name: &str, per_ns: f64| -> Result<Vec<f64>, Error> {
        Ok(metric(&boot, BOOT, name)?
            .samples
            .iter()
            .map(|x| x * per_ns)
            .collect())
    };
    // The boot memslot update, vCPU 0 running, where no build's waited for a grace period (a
    // kernel whose registrations synchronize, so none is in flight when it swaps): its own
    // cost, which a VM's first memslot, before any vCPU, does not show. Where it stalls, the
    // wait is the model's to predict and the update is priced as a first memslot.
    if metric(&boot, BOOT, "stalls")?
        .samples
        .iter()
        .all(|s| *s == 0.0)
    {
        let updates = ns_of("boot.memslot_ms", 1e6)?;
        let q = quartiles(&updates);
        put_measured(
            p,
            "boot_memslot_ns",
            q[1],
            "ns",
            tag(&format!(
                "{builds}, none stalled: boot.memslot_ms (a second memslot, vCPU 0 running): {}",
                spread(q, 1.0, "ns", updates.len())
            )),
        );
    }
    // A boot build's setup, and where its teardown ends: measured on the builds that follow
    // it (in the variants' order, wrapping round).
    let after_boot = variants
        .iter()
        .position(|v| *v == BOOT)
        .map_or(BOOT, |i| variants[(i + 1) % variants.len()]);
    put_between_builds(
        p,
        "boot_",
        &teardown_ends(&boot, &[after_boot], jiffy_ns)?,
        &setups(&boot, &[BOOT])?,
        jiffy_ns,
        [
            &tag(&format!(
                "{builds}, their teardowns seen from the {after_boot} builds after them"
            )),
            &tag(builds),
        ],
    );
    boot_thread_costs(
        p,
        &ns_of("boot.thread_wait_ms", 1e6)?,
        &ns_of("boot.thread_tick_phase_ms", 1e6)?,
        &ns_of("boot.sleep_late_us", 1e3)?,
        &ns_of("boot.exit_wake_us", 1e3)?,
        &|what: &str| tag(&format!("{builds}: {what}")),
    );
    boot_spawner_costs(
        p,
        &ns_of("boot.spawn_us", 1e3)?,
        &ns_of("boot.thread_wait_ms", 1e6)?,
        &ns_of("boot.thread_tick_phase_ms", 1e6)?,
        &|what: &str| tag(&format!("{builds}: {what}")),
    );
    let starts = boot_thread_starts_ns(200);
    let q = quartiles(&starts);
    put_measured(
        p,
        "boot_thread_start_ns",
        q[1],
        "ns",
        tag(&format!(
            "dup() of an fd and a thread spawn, until spawn() returns and the spawner goes on (the new thread not yet run): {}",
            spread(q, 1.0, "ns", starts.len())
        )),
    );
    Ok(boot)
}

/// How the boot thread got a CPU and woke, build by build: `waits` from its spawn to its first
/// run, `starts` the time since the last tick at that first run, `lates` how late its sleep's
/// end was, to its first registration, `exit_wakes` its wake-up after the guest's first exit
/// (ns); `tag` says which builds. A thread that waited
/// longer than its start lies after a tick waited for that tick (the spawn was before it).
fn boot_thread_costs(
    p: &mut Profile,
    waits: &[f64],
    starts: &[f64],
    lates: &[f64],
    exit_wakes: &[f64],
    tag: &dyn Fn(&str) -> String,
) {
    let pulls: Vec<f64> = waits
        .iter()
        .zip(starts)
        .filter(|(wait, start)| wait > start)
        .map(|(_, start)| *start)
        .collect();
    let n = waits.len().min(starts.len());
    if n == 0 {
        return;
    }
    put_measured_fraction(
        p,
        "boot_thread_tick_bound",
        pulls.len() as f64 / n as f64,
        tag(&format!(
            "share of boot threads that first ran only after a tick, having waited longer (boot.thread_wait_ms) than that run lies after the last tick (boot.thread_tick_phase_ms): {} of {n}",
            pulls.len()
        )),
    );
    let pull = quartiles(&pulls);
    let (value, from) = if pulls.is_empty() {
        (0.0, "no boot thread waited for a tick".to_string())
    } else {
        (pull[1], spread(pull, 1.0, "ns", pulls.len()))
    };
    p.set(
        "boot_thread_pull_ns",
        value,
        "ns",
        tag(&format!(
            "boot.thread_tick_phase_ms of the threads that waited for a tick (from the tick to their first run): {from}"
        )),
    );
    // The threads no tick held back: how long after their spawn they first ran. With an idle
    // CPU to take it, a new thread runs at once; with none (one CPU, the vCPU thread spinning
    // in the guest on it) it waits for the scheduler to preempt the vCPU thread.
    let waits_untied: Vec<f64> = waits
        .iter()
        .zip(starts)
        .filter(|(wait, start)| wait <= start)
        .map(|(wait, _)| *wait)
        .collect();
    if !waits_untied.is_empty() {
        let w = quartiles(&waits_untied);
        put_measured(
            p,
            "boot_thread_wait_ns",
            w[1],
            "ns",
            tag(&format!(
                "boot.thread_wait_ms of the threads that did not wait for a tick (from their spawn to their first run): {}",
                spread(w, 1.0, "ns", waits_untied.len())
            )),
        );
    }
    let late = quartiles(lates);
    put_measured(
        p,
        "boot_sleep_late_ns",
        late[1],
        "ns",
        tag(&format!(
            "boot.sleep_late_us, from the end the boot thread's boot_ms sleep asked for to its first KVM_IOEVENTFD: {}",
            spread(late, 1.0, "ns", lates.len())
        )),
    );
    let wake = quartiles(exit_wakes);
    put_measured(
        p,
        "boot_exit_wake_ns",
        wake[1],
        "ns",
        tag(&format!(
            "boot.exit_wake_us, from when the boot thread could go on (it had run, vCPU 0 had made its first exit) to its going on: {}",
            spread(wake, 1.0, "ns", exit_wakes.len())
        )),
    );
}

/// Whether the boot thread first ran before its spawner went on to `KVM_RUN`, build by build,
/// among the threads no tick held back (as [`boot_thread_costs`] tells them, from `starts`):
/// `spawns` from the spawn to the spawner's `KVM_RUN`, `waits` from the spawn to the thread's
/// first run (ns). On one CPU such a thread preempted its spawner, which went on once the
/// thread blocked: from that first run to the spawner's `KVM_RUN`.
fn boot_spawner_costs(
    p: &mut Profile,
    spawns: &[f64],
    waits: &[f64],
    starts: &[f64],
    tag: &dyn Fn(&str) -> String,
) {
    let untied: Vec<(f64, f64)> = spawns
        .iter()
        .zip(waits)
        .zip(starts)
        .filter(|((_, wait), start)| wait <= start)
        .map(|((spawn, wait), _)| (*spawn, *wait))
        .collect();
    let n = untied.len();
    if n == 0 {
        return;
    }
    let resumes: Vec<f64> = untied
        .iter()
        .filter(|(spawn, wait)| wait < spawn)
        .map(|(spawn, wait)| spawn - wait)
        .collect();
    put_measured_fraction(
        p,
        "boot_thread_first_share",
        resumes.len() as f64 / n as f64,
        tag(&format!(
            "share of the boot threads no tick held back that first ran (boot.thread_wait_ms) before their spawner went on to KVM_RUN (boot.spawn_us): {} of {n}",
            resumes.len()
        )),
    );
    let q = quartiles(&resumes);
    let (value, from) = if resumes.is_empty() {
        (
            0.0,
            "no boot thread ran before its spawner went on".to_string(),
        )
    } else {
        (q[1], spread(q, 1.0, "ns", resumes.len()))
    };
    p.set(
        "boot_spawner_resume_ns",
        value,
        "ns",
        tag(&format!(
            "boot.spawn_us less boot.thread_wait_ms of the threads that ran first (from their first run to the spawner's KVM_RUN): {from}"
        )),
    );
}

/// What the kvm backend does before a booting guest's first run, timed `n` times: duplicate an
/// fd for the boot thread and spawn it.
fn boot_thread_starts_ns(n: u32) -> Vec<f64> {
    (0..n)
        .map(|_| {
            // The spawner's own cost, as the kvm backend's vCPU thread pays it: it goes on to
            // KVM_RUN once spawn() returns (clone3() and wake_up_new_task()), not once the new
            // thread has run; the scope's join after the timing is no part of it.
            let start = std::time::Instant::now();
            let fd = rustix::io::dup(std::io::stdin()).ok();
            let elapsed = std::thread::scope(|s| {
                s.spawn(|| std::hint::black_box(&fd));
                start.elapsed().as_nanos() as f64
            });
            drop(fd);
            elapsed
        })
        .collect()
}

/// SRCU: the wake-up of a sleeping task, and how often a timer's kworker finds its CPU busy.
fn srcu_costs(p: &mut Profile, host: &HostInfo, tag: &dyn Fn(&str) -> String) {
    // SRCU hands each step of a grace period to a sleeping task (the grace-period work, the
    // callback invocation, the synchronizer): measured directly as a thread wake-up, not
    // solved from a stall, so the lifecycle stalls validate compares stay predictions.
    let wakeups = thread_wakeups_ns(2_000);
    let q = quartiles(&wakeups);
    put_measured(
        p,
        "srcu_wakeup_ns",
        q[1],
        "ns",
        tag(&format!(
            "half of each round trip of a two-thread channel ping-pong: one wake-up of a sleeping task, {}",
            spread(q, 1.0, "ns", wakeups.len())
        )),
    );
    let local = local_wakeups_ns(2_000);
    if !local.is_empty() {
        let q = quartiles(&local);
        put_measured(
            p,
            "srcu_local_handoff_ns",
            q[1],
            "ns",
            tag(&format!(
                "half of each round trip of the same ping-pong with both threads pinned to one CPU: a wake-up that does not cross CPUs, {}",
                spread(q, 1.0, "ns", local.len())
            )),
        );
    }
    // What else a stall depends on: whether the kworker a grace-period timer wakes finds its
    // CPU busy. Measured as the share of short sleeps that overshoot by more than a quarter
    // jiffy: a woken task that waited for the CPU's running task.
    let jiffy_ns = 1e9 / f64::from(host.hz.max(1));
    let (busy, overshoot) = busy_cpu_fraction(400, jiffy_ns / 4.0);
    let q = quartiles(&overshoot);
    put_measured_fraction(
        p,
        "srcu_timer_cpu_busy",
        busy,
        tag(&format!(
            "share of 400 sleeps of 1 ms that woke more than a quarter jiffy ({:.0} us) late: {busy:.3}; overshoot {}",
            jiffy_ns / 4e3,
            spread(q, 1e-3, "us", overshoot.len())
        )),
    );
}

/// Memory: fault costs from passes whose fault and prefetch counts are known.
fn memory_costs(
    backend: &mut dyn Backend,
    progress: &dyn Progress,
    p: &mut Profile,
    tag: &dyn Fn(&str) -> String,
    size_bytes: u64,
) -> Result<(), Error> {
    let at_size = memory::MemoryParams {
        size_bytes,
        ..memory::MemoryParams::default()
    };
    let m2 = run(
        backend,
        at_size,
        &["lazy", "populated", "thp", "uffd", "uffd-prefetch"],
        3,
        progress,
    )?;
    let m4 = run(
        backend,
        memory::MemoryParams {
            guest_page: hvlab_core::guest::GuestPage::Small,
            ..at_size
        },
        &["populated"],
        3,
        progress,
    )?;
    let touch = p
        .get("touch_page_ns", "calibrate")
        .map_err(crate::model::ModelError::from)?;
    let fault = med(&m4, "populated", "ns_per_page")? - touch;
    put_measured(
        p,
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
            p,
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
        p,
        "host_fault_ns",
        t_lazy - fault,
        "ns",
        tag("memory lazy: ns_per_page - stage2_fault_ns"),
    );
    if let Ok(t_thp) = med(&m2, "thp", "ns_per_page") {
        put_measured(
            p,
            "host_fault_huge_ns",
            t_thp * 512.0 - fault,
            "ns",
            tag("memory thp: 512 x ns_per_page - stage2_fault_ns"),
        );
    }
    // Per page, a userfaultfd pass costs its stage-2 faults, its prefetched SPTEs, its
    // userfaultfd faults and one UFFDIO_COPY of the page: T = s·φ + p·(1 - φ) + u·a + c, with
    // φ the stage-2 faults per page (the TDP MMU faults every page, whatever the window
    // copied; a prefetching MMU maps the window's other pages from the first fault) and a the
    // userfaultfd faults per page, both counted by the runs. Window 1 and window 8 give u and c.
    let pages = (size_bytes / 4096).max(1) as f64;
    let pf_populated = metric(&m4, "populated", "kvm.vcpu.pf_fixed")
        .ok()
        .map(|m| m.median)
        .filter(|n| *n > 0.0);
    let tdp_mmu = p.mmu == MmuKind::TdpMmu;
    let window = |variant: &str, w: f64| -> Result<UffdPass, Error> {
        let faulted = match (metric(&m2, variant, "kvm.vcpu.pf_fixed"), pf_populated) {
            (Ok(f), Some(all)) => (f.median / all).min(1.0),
            // Without KVM's counters: the TDP MMU faults every page, a prefetching MMU the
            // first of each window.
            _ if tdp_mmu => 1.0,
            _ => 1.0 / w,
        };
        let uffd = metric(&m2, variant, "uffd_faults").map_or(1.0 / w, |m| m.median / pages);
        Ok(UffdPass {
            ns_per_page: med(&m2, variant, "ns_per_page")?,
            faulted,
            uffd,
        })
    };
    let (w1, w8) = (window("uffd", 1.0)?, window("uffd-prefetch", 8.0)?);
    let known = |w: &UffdPass| w.ns_per_page - fault * w.faulted - prefetch * (1.0 - w.faulted);
    let uffd_fault = if w1.uffd > w8.uffd {
        (known(&w1) - known(&w8)) / (w1.uffd - w8.uffd)
    } else {
        f64::NAN
    };
    let copy = known(&w1) - uffd_fault * w1.uffd;
    let counted = format!(
        "stage-2 faults per page {:.3} and {:.3}, userfaultfd faults per page {:.3} and {:.3}",
        w1.faulted, w8.faulted, w1.uffd, w8.uffd
    );
    put_measured(
        p,
        "uffd_copy_page_ns",
        copy,
        "ns",
        tag(&format!(
            "memory uffd (window 1, T1) and uffd-prefetch (window 8, T8), sequential: per page T = stage2_fault_ns x stage-2 faults + prefetch_page_ns x prefetched + uffd_fault_ns x userfaultfd faults + uffd_copy_page_ns, solved on both ({counted}, counted by the runs)"
        )),
    );
    put_measured(
        p,
        "uffd_fault_ns",
        uffd_fault,
        "ns",
        tag(&format!(
            "memory uffd (window 1, T1) and uffd-prefetch (window 8, T8), sequential: (T1 - T8 less their stage-2 faults and prefetches) / the difference of their userfaultfd faults per page ({counted})"
        )),
    );

    Ok(())
}

/// One userfaultfd pass of the calibration, per page touched.
struct UffdPass {
    ns_per_page: f64,
    /// Stage-2 faults (the rest of the pages are prefetched).
    faulted: f64,
    /// userfaultfd faults.
    uffd: f64,
}

/// Exits: the roundtrip to userspace (PIO) and in the kernel (CPUID), and the TSC rate.
fn exit_costs(
    backend: &mut dyn Backend,
    progress: &dyn Progress,
    p: &mut Profile,
    tag: &dyn Fn(&str) -> String,
    iterations: u64,
) -> Result<(), Error> {
    let ex = run(
        backend,
        exits::ExitParams {
            iterations,
            ..exits::ExitParams::default()
        },
        &["pio-out", "cpuid"],
        5,
        progress,
    )?;
    let pio = med(&ex, "pio-out", "roundtrip_ns")?;
    // An MMIO exit is a PIO exit plus the instruction's emulation: the write's exit and
    // return to userspace are a PIO write's, and what it adds is KVM's decoding and emulating
    // the store (npf_interception() / handle_ept_misconfig() -> kvm_mmu_page_fault() ->
    // x86_emulate_instruction()), where a PIO write's exit info gives port, size and value.
    // A read adds a second pass on re-entry: complete_emulated_mmio() copies the data
    // userspace gave and complete_emulated_io() emulates the load again
    // (kvm_emulate_instruction(EMULTYPE_NO_DECODE)) to put it in its register, where a
    // write's completion returns at once. Their own run, beside a PIO write of the same run,
    // so the PIO and CPUID exits above are measured as before. A host whose MMIO exits fail
    // leaves the costs out (priced as PIO).
    let mmio = run(
        backend,
        exits::ExitParams {
            iterations,
            ..exits::ExitParams::default()
        },
        &["pio-out", "mmio-write", "mmio-read"],
        5,
        progress,
    );
    if let Ok((write, pio, read)) = mmio.and_then(|m| {
        Ok((
            med(&m, "mmio-write", "roundtrip_ns")?,
            med(&m, "pio-out", "roundtrip_ns")?,
            med(&m, "mmio-read", "roundtrip_ns").ok(),
        ))
    }) {
        put_measured(
            p,
            "mmio_emulate_ns",
            write - pio,
            "ns",
            tag(
                "exits mmio-write roundtrip_ns - pio-out roundtrip_ns, the three exits interleaved in one run",
            ),
        );
        if let Some(read) = read {
            put_measured(
                p,
                "mmio_read_complete_ns",
                read - write,
                "ns",
                tag(
                    "exits mmio-read roundtrip_ns - mmio-write roundtrip_ns, the three exits interleaved in one run (complete_emulated_mmio() -> complete_emulated_io(): the load emulated again on re-entry)",
                ),
            );
        }
    }
    put_measured(
        p,
        "exit_userspace_ns",
        pio,
        "ns",
        tag("exits pio-out roundtrip_ns"),
    );
    put_measured(
        p,
        "exit_kernel_ns",
        med(&ex, "cpuid", "roundtrip_ns")?,
        "ns",
        tag("exits cpuid roundtrip_ns"),
    );
    put_measured(
        p,
        "cpu_ghz",
        med(&ex, "pio-out", "tsc_per_iter")? / pio,
        "GHz",
        tag("exits pio-out tsc_per_iter / roundtrip_ns (TSC rate)"),
    );

    Ok(())
}

/// Pinning with mlock: first pin, re-pin and unpin per page.
fn pin_costs(p: &mut Profile, tag: &dyn Fn(&str) -> String, pin_bytes: usize) -> Result<(), Error> {
    let m = pin::mlock_costs(pin_bytes)?;
    put_measured(
        p,
        "pin_page_ns",
        m.pin_page_ns,
        "ns",
        tag(&format!(
            "mlock of a fresh {} MiB buffer, per 4 KiB page",
            pin_bytes >> 20
        )),
    );
    put_measured(
        p,
        "repin_page_ns",
        m.repin_page_ns,
        "ns",
        tag("mlock of the same, resident, buffer, per page"),
    );
    put_measured(
        p,
        "unpin_page_ns",
        m.unpin_page_ns,
        "ns",
        tag(&format!(
            "munlock of the {} MiB buffer, per page",
            pin_bytes >> 20
        )),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{boot_spawner_costs, circular_quartiles};
    use crate::model::profile::Profile;

    /// Threads that first ran before their spawner went on give the share and the resume;
    /// a thread a tick held back is no part of either; none that ran first gives a share of 0.
    #[test]
    fn a_boot_thread_that_ran_before_its_spawner_gives_the_share_and_the_resume() {
        let mut p = Profile::load("pvm-epyc").unwrap();
        // Three untied builds (waits within their start after the tick), two of which ran
        // first: spawn 45.6 us against a 35.3 us wait; one tick-bound build (wait 900 us,
        // 50 us after its tick).
        let spawns = [45_600.0, 45_700.0, 18_000.0, 18_000.0];
        let waits = [35_300.0, 35_300.0, 554_000.0, 900_000.0];
        let starts = [3_000_000.0, 3_100_000.0, 2_900_000.0, 50_000.0];
        boot_spawner_costs(&mut p, &spawns, &waits, &starts, &|w: &str| w.to_string());
        let share = p.get("boot_thread_first_share", "test").unwrap();
        assert!((share - 2.0 / 3.0).abs() < 1e-9, "{share}");
        let resume = p.get("boot_spawner_resume_ns", "test").unwrap();
        assert!((10_300.0..=10_400.0).contains(&resume), "{resume}");
        boot_spawner_costs(
            &mut p,
            &[18_000.0],
            &[554_000.0],
            &[2_900_000.0],
            &|w: &str| w.to_string(),
        );
        assert_eq!(p.get("boot_thread_first_share", "test").unwrap(), 0.0);
        assert_eq!(p.get("boot_spawner_resume_ns", "test").unwrap(), 0.0);
    }

    #[test]
    fn phases_that_straddle_the_tick_stay_one_cluster() {
        // 3.9, 3.95, 0.05 and 0.1 ms after a tick of 4 ms: one cluster 0.2 ms wide around the
        // tick, not two at the ends of the jiffy.
        let q = circular_quartiles(&[3.9e6, 3.95e6, 0.05e6, 0.1e6, 4.0e6], 4e6);
        assert!(q[2] - q[0] < 0.3e6, "{q:?}");
        let median = q[1].rem_euclid(4e6);
        assert!(!(0.2e6..3.8e6).contains(&median), "{q:?}");
        // A cluster in the middle of the jiffy is left as it is.
        let q = circular_quartiles(&[1.9e6, 2.0e6, 2.1e6], 4e6);
        assert!((q[1] - 2.0e6).abs() < 1.0, "{q:?}");
    }
}
