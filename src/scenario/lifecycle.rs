//! `lifecycle`: VM construction order against SRCU grace periods on the I/O buses.
//!
//! KVM keeps each VM's I/O buses as sorted arrays read under `kvm->srcu`. Registering a device
//! (`KVM_CREATE_IRQCHIP`'s PIC and IOAPIC, `KVM_CREATE_PIT2`, `KVM_IOEVENTFD`, ...) copies the
//! array in `kvm_io_bus_register_dev`, publishes the copy and frees the old one after a grace
//! period; Linux 6.18 defers that free with `call_srcu`, which returns at once but starts a
//! *normal* grace period lasting a few jiffies. A later memslot update swaps memslots with
//! `synchronize_srcu_expedited` (`kvm_swap_active_memslots`), which cannot complete before the
//! normal grace period already in flight — so the order in which a VMM builds a VM decides
//! whether it is ready in a tenth of a millisecond or after several jiffies.
//!
//! Each repetition builds a fresh VM in one order, timing every ioctl from `KVM_CREATE_VM` to
//! the first guest exit. The named orders:
//! - `irqchip-first`: create VM, irqchip, PIT, memslot, vCPUs, ioeventfds, run.
//! - `memslots-first`: the memslot before any device registration.
//! - `devices-after-vcpus`: memslot first, ioeventfds only once the vCPUs exist.
//! - `qemu-order`: what QEMU's `pc` machine does. `kvm_init()` in `accel/kvm/kvm-all.c`
//!   creates the VM, calls `kvm_arch_init()` (`target/i386/kvm/kvm.c`: `KVM_SET_TSS_ADDR`) and
//!   `kvm_irqchip_create()`; machine init then registers the virtio/PCI ioeventfds through the
//!   memory listener (`kvm_mem_ioeventfd_add`), the vCPU threads create their vCPUs, RAM
//!   memslots are committed, and the PIT (`hw/i386/kvm/i8254.c`, `kvm_pit_realizefn`) comes
//!   last. Confirmed with `hvlab trace` on QEMU 7.2 (`-M pc -smp 2`) on this kind of host.
//! - `firecracker-order`: Firecracker's `create_vmm_and_vcpus()` (`src/vmm/src/builder.rs`)
//!   creates the VM with `KVM_SET_TSS_ADDR` (`src/vmm/src/arch/x86_64/vm.rs`, `ArchVm::new`),
//!   sets up the irqchip and PIT in `arch_pre_create_vcpus()` → `setup_irqchip()`, creates the
//!   vCPUs, then `register_memory_regions()`, then attaches virtio-mmio devices (one
//!   `KVM_IOEVENTFD` per queue).
//!
//! `--set order=create-vm,memslot,irqchip,...` runs a custom order as variant `custom`.

use std::collections::BTreeMap;
use std::time::Duration;

use super::params::{Choice, Param, Values, choice, whole};
use super::runner::{RunRequest, ScenarioOutcome};
use super::samples::{Series, per_variant};
use super::{Chart, Headline, HeadlinePair, Notice, Observed, Scenario, Showcase, ValidationPoint};
use super::{IcountTolerance, MetricInfo, ScenarioInfo, VariantInfo};
use crate::analysis::Direction;
use crate::analysis::compare::StallCause;
use crate::analysis::stall::{Baselines, Stall, find_stalls, kernel_effects};
use crate::analysis::statistics::median;
use crate::analysis::validate::{Check, Rule, check, judge_in_band, stall_ms};
use crate::error::InputError;
use crate::record::RunRecord;
use crate::record::VariantStatus;
use crate::record::{Finding, TimelineEvent, VariantRecord};
use hvlab_core::Capabilities;
use hvlab_core::host::{Clock, HostInfo};
use hvlab_core::ioctl_table::BusRegistration;
use hvlab_core::ioctl_table::SrcuKernel;
use hvlab_core::lifecycle::{ConstructionPlan, ConstructionTrace, IoctlEvent, Step, Strategy};

/// The catalog entry.
pub static INFO: ScenarioInfo = ScenarioInfo {
    name: "lifecycle",
    summary: "VM construction order vs SRCU grace periods: which order stalls a memslot update, by how much",
    variants: &VARIANTS,
    model_variants: &MODEL_VARIANTS,
    metrics: &METRICS,
    headline: "ready_ms",
    question: super::Question {
        asks: "what each construction order costs against one that does not stall, and which grace period it waited for",
        baseline: Some("memslots-first"),
        judged: &[],
        pairs: &[],
        within: None,
        costs: false,
    },
    default_reps: 20,
    default_warmup: 2,
    runs_on: super::any_backend,
};

static VARIANTS: [VariantInfo; 6] = [
    VariantInfo {
        name: "irqchip-first",
        doc: "create VM, irqchip, PIT, memslot, vCPUs, ioeventfds, run",
    },
    VariantInfo {
        name: "memslots-first",
        doc: "create VM, memslot, irqchip, PIT, ioeventfds, vCPUs, run",
    },
    VariantInfo {
        name: "devices-after-vcpus",
        doc: "create VM, memslot, irqchip, PIT, vCPUs, ioeventfds, run",
    },
    VariantInfo {
        name: "qemu-order",
        doc: "QEMU pc: create VM, TSS, irqchip, ioeventfds, vCPUs, memslot, PIT, run",
    },
    VariantInfo {
        name: "firecracker-order",
        doc: "Firecracker: create VM, TSS, irqchip, PIT, vCPUs, memslot, ioeventfds, run",
    },
    VariantInfo {
        name: "boot-activation",
        doc: "memslot, irqchip, PIT, vCPUs, run; after boot_ms of guest execution, ioeventfds registered while vCPU 0 runs, then a memslot update",
    },
];

static MODEL_VARIANTS: [VariantInfo; 0] = [];

/// `strategy`: how registration frees the old bus array (model).
static STRATEGY: Choice<Strategy, 3> = Choice {
    names: ["always-defer", "always-sync", "lifecycle-keyed"],
    values: [
        Strategy::AlwaysDefer,
        Strategy::AlwaysSync,
        Strategy::LifecycleKeyed,
    ],
};

/// `spacing`: VMs built back to back, or independent (model).
static SPACING: Choice<bool, 2> = Choice {
    names: ["back-to-back", "independent"],
    values: [true, false],
};

/// Each parameter, declared once.
pub static PARAMS: [Param<LifecycleParams>; 10] = [
    Param {
        name: "vcpus",
        doc: "vCPUs created, at most the host's KVM_CAP_MAX_VCPUS; each runs the guest to its first exit in turn (boot orders: vCPU 0 only)",
        values: Values::Described,
        model_only: false,
        read: |p, t| {
            p.vcpus = super::memory::vcpu_count(t)?;
            Ok(())
        },
        spell: |p| p.vcpus.to_string(),
    },
    whole!(
        devices,
        "ioeventfds registered, one per virtio queue doorbell",
        0,
        256
    ),
    Param {
        name: "order",
        doc: "custom order, comma-separated steps: create-vm,tss,irqchip,pit,memslot,vcpus,ioeventfds,run",
        values: Values::Described,
        model_only: false,
        read: |p, t| {
            p.order = Some(parse_order(t.raw)?);
            Ok(())
        },
        spell: |p| {
            p.order.as_ref().map_or_else(String::new, |steps| {
                steps.iter().map(|s| s.name()).collect::<Vec<_>>().join(",")
            })
        },
    },
    whole!(mem_mib, "guest RAM in the memslot, MiB", 1, 4096),
    whole!(timeout_ms, "watchdog for the first KVM_RUN, ms", 10, 60_000),
    whole!(
        boot_ms,
        "boot orders: ms vCPU 0 runs the guest before the boot registrations",
        0,
        10_000
    ),
    choice!(
        strategy,
        STRATEGY,
        "model: always-defer (call_srcu, Linux 6.18), always-sync (synchronize_srcu_expedited, before 7d9a0273), lifecycle-keyed (sync until the first vCPU, then defer: the fix in thread 001)",
        model
    ),
    Param {
        name: "hz",
        doc: "model: timer ticks per second (default: the profile's)",
        values: Values::Range(24, 10_000),
        model_only: true,
        read: |p, t| {
            p.hz = t.optional_whole()?;
            Ok(())
        },
        spell: |p| p.hz.map_or_else(String::new, |hz| hz.to_string()),
    },
    choice!("spacing" => back_to_back, SPACING, "model: back-to-back (each VM right after the previous, as the kvm backend's repetitions: the previous stall ended on a tick) or independent (each VM at a random point of a jiffy, as separate VMM processes)", model),
    whole!(
        reader_pct,
        "model: percent of the time a running vCPU is an SRCU reader (handling exits in the kernel; hvlab's guest loop barely exits)",
        0,
        90,
        model
    ),
];

static METRICS: [MetricInfo; 19] = [
    MetricInfo {
        name: "ready_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "KVM_CREATE_VM to the first guest exit, per VM",
    },
    MetricInfo {
        name: "ioctl.<NAME>_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "total time in each KVM ioctl during construction, per VM",
    },
    MetricInfo {
        name: "stalls",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "SRCU stalls per VM: ioctls that can wait for kvm->srcu on this kernel, slower than their unstalled baseline by more than half a jiffy while a grace period was in flight",
    },
    MetricInfo {
        name: "between_builds_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "the VMM's time from the previous build's last step to this build's KVM_CREATE_VM (teardown and setup): where the timer ticks fall for this build's grace periods, per VM built back to back",
    },
    MetricInfo {
        name: "between_builds.teardown_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "the first part of between_builds_ms: the previous VM's teardown (the VMM stops its vCPU threads, closes its fds, which runs kvm_destroy_vm() and its barriers, and unmaps its memory), per VM built back to back",
    },
    MetricInfo {
        name: "between_builds.setup_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "the rest of between_builds_ms: the VMM's time from the previous VM's teardown to this build's KVM_CREATE_VM (this VM's memory and payload), per VM built back to back",
    },
    MetricInfo {
        name: "tick_phase_ms",
        unit: "ms",
        // Where the ticks fall: a condition of the run, not a cost.
        better: Direction::Neither,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "time from the last timer tick to KVM_CREATE_VM (CLOCK_MONOTONIC less CLOCK_MONOTONIC_COARSE on kvm; the model's own ticks): SRCU's delayed work fires on ticks, so this sets a stall's length, per VM",
    },
    MetricInfo {
        name: "boot.tick_phase_ms",
        unit: "ms",
        // A phase against the ticks, not a cost.
        better: Direction::Neither,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "boot orders: time from the last timer tick to the first registration while vCPU 0 runs (tick_phase_ms plus its start on the VM's clock, modulo the jiffy): where that grace period starts against the ticks, per VM",
    },
    MetricInfo {
        name: "boot.thread_wait_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "boot orders: from the VMM's spawn of its boot thread (just before vCPU 0 enters KVM_RUN) to that thread's first run; a thread left behind the vCPU thread on its CPU runs only once that CPU's tick has it pulled to an idle one, per VM",
    },
    MetricInfo {
        name: "boot.spawn_us",
        unit: "us",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "boot orders: from the VMM's spawn of its boot thread to vCPU 0's KVM_RUN: the spawner's clone3(), and, where the new thread preempts its spawner on their one CPU, that thread's run until it blocks, per VM",
    },
    MetricInfo {
        name: "boot.thread_tick_phase_ms",
        unit: "ms",
        // A phase against the ticks, not a cost.
        better: Direction::Neither,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "boot orders: time from the last timer tick to the boot thread's first run (tick_phase_ms plus its start on the VM's clock, modulo the jiffy), per VM",
    },
    MetricInfo {
        name: "boot.exit_wake_us",
        unit: "us",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "boot orders: from when the boot thread could go on (it had first run and vCPU 0 had made its first exit) to its going on, the vCPU thread's message received: on a CPU the spinning vCPU thread holds, a wake-up behind it; where the boot_ms sleep starts, per VM",
    },
    MetricInfo {
        name: "boot.sleep_late_us",
        unit: "us",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "boot orders: how much later than asked the boot thread's boot_ms sleep ended and its first registration began (timer slack, the wake-up), per VM",
    },
    MetricInfo {
        name: "vcpu.first_create_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "with vcpus > 1: the first KVM_CREATE_VCPU, the one that can add a memslot (x86's APIC-access page) and wait for SRCU, per VM",
    },
    MetricInfo {
        name: "vcpu.other_create_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "with vcpus > 1: the mean of the other KVM_CREATE_VCPU calls, per VM",
    },
    MetricInfo {
        name: "boot.ioeventfd_us",
        unit: "us",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "boot orders: mean KVM_IOEVENTFD registration while vCPU 0 runs guest code, per VM",
    },
    MetricInfo {
        name: "boot.memslot_ms",
        unit: "ms",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "boot orders: the memslot update after those registrations, vCPU 0 still running, per VM",
    },
    MetricInfo {
        name: "kvm.vm.<stat>",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "VM binary statistics accumulated from creation to the first exit, per VM",
    },
    MetricInfo {
        name: "kvm.vcpu.<stat>",
        unit: "count",
        better: Direction::LowerIsBetter,
        count_tolerance: 0.0,
        icount_tolerance: IcountTolerance::TIME,
        doc: "vCPU 0 binary statistics from creation to the first exit, per VM",
    },
];

use Step::{
    BootIoeventfds, BootMemslot, CreateVm, Ioeventfds, Irqchip, Memslot, Pit, Run, TssAddr, Vcpus,
};

/// The steps of a named variant.
pub fn order_of(variant: &str) -> Option<Vec<Step>> {
    let steps: &[Step] = match variant {
        "irqchip-first" => &[CreateVm, Irqchip, Pit, Memslot, Vcpus, Ioeventfds, Run],
        "memslots-first" => &[CreateVm, Memslot, Irqchip, Pit, Ioeventfds, Vcpus, Run],
        "devices-after-vcpus" => &[CreateVm, Memslot, Irqchip, Pit, Vcpus, Ioeventfds, Run],
        "qemu-order" => &[
            CreateVm, TssAddr, Irqchip, Ioeventfds, Vcpus, Memslot, Pit, Run,
        ],
        "firecracker-order" => &[
            CreateVm, TssAddr, Irqchip, Pit, Vcpus, Memslot, Ioeventfds, Run,
        ],
        "boot-activation" => &[
            CreateVm,
            Memslot,
            Irqchip,
            Pit,
            Vcpus,
            Run,
            BootIoeventfds,
            BootMemslot,
        ],
        _ => return None,
    };
    Some(steps.to_vec())
}

/// Parses `--set order=` into steps.
pub fn parse_order(text: &str) -> Result<Vec<Step>, InputError> {
    if text.trim().is_empty() {
        return Err(InputError::BadOrder(format!(
            "order= is empty: give the steps, for example order=create-vm,memslot,irqchip,vcpus,run (steps are {}), or drop --set order",
            Step::ALL.map(Step::name).join(", ")
        )));
    }
    text.split(',')
        .map(str::trim)
        .enumerate()
        .map(|(i, s)| {
            if s.is_empty() {
                return Err(InputError::BadOrder(format!(
                    "step {} of `{text}` is empty (two commas in a row, or a comma at an end): list each step once, separated by single commas",
                    i + 1
                )));
            }
            Step::parse(s).ok_or_else(|| {
                InputError::BadOrder(format!(
                    "unknown step `{s}`; steps are {}",
                    Step::ALL.map(Step::name).join(", ")
                ))
            })
        })
        .collect()
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// Turns the timelines of every variant into metrics, stall findings and verdicts. Baselines
/// are learned across all variants: an ioctl's unstalled cost comes from the orders in which
/// it does not stall.
pub fn analyse(
    names: &[String],
    results: &[Result<Vec<ConstructionTrace>, VariantStatus>],
    jiffy_ns: u64,
    kernel: SrcuKernel,
    seed: u64,
) -> ScenarioOutcome {
    let baselines = Baselines::learn(
        results
            .iter()
            .filter_map(|r| r.as_ref().ok())
            .flatten()
            .flat_map(|t| &t.ioctls),
    );
    let variants = per_variant(names, results, |_, name, traces| {
        analyse_variant(name, traces, &baselines, jiffy_ns, kernel, seed)
    });
    ScenarioOutcome { variants }
}

/// The slow ioctls of one timeline, judged with what each ioctl did to SRCU: as the backend
/// reported it, or by the kernel's semantics.
fn stalls_of(
    trace: &ConstructionTrace,
    baselines: &Baselines,
    jiffy_ns: u64,
    kernel: SrcuKernel,
) -> Vec<Stall> {
    if trace.srcu_effects.len() == trace.ioctls.len() {
        find_stalls(&trace.ioctls, baselines, jiffy_ns, |i, _| {
            trace.srcu_effects[i]
        })
    } else {
        find_stalls(&trace.ioctls, baselines, jiffy_ns, kernel_effects(kernel))
    }
}

/// The timeline of the repetition with the median ready time, SRCU stalls marked, for charts.
fn median_timeline(
    traces: &[ConstructionTrace],
    baselines: &Baselines,
    jiffy_ns: u64,
    kernel: SrcuKernel,
) -> Vec<TimelineEvent> {
    let mut order: Vec<usize> = (0..traces.len()).collect();
    order.sort_by_key(|i| traces[*i].ready_ns);
    let Some(trace) = order.get(order.len() / 2).map(|i| &traces[*i]) else {
        return Vec::new();
    };
    let stalled: Vec<usize> = stalls_of(trace, baselines, jiffy_ns, kernel)
        .iter()
        .filter(|s| s.caused_by.is_some())
        .map(|s| s.index)
        .collect();
    trace
        .ioctls
        .iter()
        .enumerate()
        .map(|(i, e)| TimelineEvent {
            ioctl: e.name.clone(),
            start_ms: ms(e.start_ns),
            dur_ms: ms(e.dur_ns),
            stalled: stalled.contains(&i),
        })
        .collect()
}

/// The ioctls after the first `KVM_RUN` (vCPU 0 still running guest code): the duration of
/// each `KVM_IOEVENTFD`, and of the memslot update after them. `None` for orders that end
/// with the run.
fn boot_phase(trace: &ConstructionTrace) -> Option<(Vec<u64>, Option<u64>)> {
    let run = trace.ioctls.iter().position(|e| e.name == "KVM_RUN")?;
    let after = &trace.ioctls[run + 1..];
    if after.is_empty() {
        return None;
    }
    let registrations = after
        .iter()
        .filter(|e| e.name == "KVM_IOEVENTFD")
        .map(|e| e.dur_ns)
        .collect();
    let memslot = after
        .iter()
        .find(|e| e.name == "KVM_SET_USER_MEMORY_REGION")
        .map(|e| e.dur_ns);
    Some((registrations, memslot))
}

/// The first `KVM_IOEVENTFD` after `KVM_RUN`: a boot order's first registration beside the
/// running vCPU.
fn first_boot_registration(trace: &ConstructionTrace) -> Option<&IoctlEvent> {
    let run = trace.ioctls.iter().position(|e| e.name == "KVM_RUN")?;
    trace.ioctls[run + 1..]
        .iter()
        .find(|e| e.name == "KVM_IOEVENTFD")
}

/// A stall as it recurs across repetitions: (ioctl index, ioctl, the event blamed: index, name).
type StallKey = (usize, String, Option<(usize, String)>);

/// What the repetitions in which one stall occurred measured.
#[derive(Debug, Default)]
struct StallSamples {
    durations_ns: Vec<f64>,
    jiffies: Vec<f64>,
}

/// One build's timings: ready, each ioctl's total, the tick phases, the boot phase, the
/// first vCPU against the others.
fn push_timings(series: &mut Series, trace: &ConstructionTrace, jiffy_ns: u64) {
    series.push("ready_ms", "ms", ms(trace.ready_ns));
    let mut per_ioctl: BTreeMap<&str, u64> = BTreeMap::new();
    for e in &trace.ioctls {
        *per_ioctl.entry(e.name.as_str()).or_default() += e.dur_ns;
    }
    for (ioctl, ns) in per_ioctl {
        series.push(&format!("ioctl.{ioctl}_ms"), "ms", ms(ns));
    }
    if let Some(gap) = trace.since_last_ns {
        series.push("between_builds_ms", "ms", ms(gap));
        if let Some(setup) = trace.since_teardown_ns {
            series.push(
                "between_builds.teardown_ms",
                "ms",
                ms(gap.saturating_sub(setup)),
            );
            series.push("between_builds.setup_ms", "ms", ms(setup));
        }
    }
    if let Some(phase) = trace.tick_phase_ns {
        series.push("tick_phase_ms", "ms", ms(phase));
    }
    if let (Some(phase), Some(first)) = (trace.tick_phase_ns, first_boot_registration(trace))
        && jiffy_ns > 0
    {
        series.push(
            "boot.tick_phase_ms",
            "ms",
            ms((phase + first.start_ns) % jiffy_ns),
        );
    }
    if let Some(boot) = trace.boot_thread {
        series.push(
            "boot.thread_wait_ms",
            "ms",
            ms(boot.started_ns.saturating_sub(boot.spawned_ns)),
        );
        if let Some(run) = trace.ioctls.iter().find(|e| e.name == "KVM_RUN") {
            let spawn = run.start_ns.saturating_sub(boot.spawned_ns);
            series.push("boot.spawn_us", "us", spawn as f64 / 1e3);
        }
        if let Some(phase) = trace.tick_phase_ns
            && jiffy_ns > 0
        {
            series.push(
                "boot.thread_tick_phase_ms",
                "ms",
                ms((phase + boot.started_ns) % jiffy_ns),
            );
        }
        let could_go_on = boot.started_ns.max(trace.ready_ns);
        series.push(
            "boot.exit_wake_us",
            "us",
            boot.went_on_ns.saturating_sub(could_go_on) as f64 / 1e3,
        );
        if let Some(first) = first_boot_registration(trace) {
            let late = first.start_ns.saturating_sub(boot.wake_ns);
            series.push("boot.sleep_late_us", "us", late as f64 / 1e3);
        }
    }
    if let Some((registrations, memslot)) = boot_phase(trace) {
        if !registrations.is_empty() {
            let mean = registrations.iter().sum::<u64>() as f64 / registrations.len() as f64;
            series.push("boot.ioeventfd_us", "us", mean / 1e3);
        }
        if let Some(memslot) = memslot {
            series.push("boot.memslot_ms", "ms", ms(memslot));
        }
    }
    // The first vCPU against the rest: only the first can add a memslot and so wait out
    // a grace period in flight (`kvm_arch_vcpu_create()` → `kvm_alloc_apic_access_page()`).
    let creates: Vec<u64> = trace
        .ioctls
        .iter()
        .filter(|e| e.name == "KVM_CREATE_VCPU")
        .map(|e| e.dur_ns)
        .collect();
    if let [first, rest @ ..] = creates.as_slice()
        && !rest.is_empty()
    {
        series.push("vcpu.first_create_ms", "ms", ms(*first)).push(
            "vcpu.other_create_ms",
            "ms",
            ms(rest.iter().sum::<u64>()) / rest.len() as f64,
        );
    }
}

/// The stalls that recur (in at least half the repetitions), each as a finding: an SRCU stall
/// with the grace period it waited for, or a slow ioctl of unknown cause.
fn recurring_findings(
    stalled: BTreeMap<StallKey, StallSamples>,
    reps: usize,
    baselines: &Baselines,
) -> Vec<Finding> {
    // A finding must recur: in at least half the repetitions. One slow ioctl in one
    // repetition is noise (a preempted host thread, an emulated host), not a mechanism.
    stalled
        .into_iter()
        .filter(|(_, samples)| samples.durations_ns.len() * 2 >= reps)
        .map(|((step, ioctl, caused_by), samples)| {
            let durs = samples.durations_ns;
            let median_ms = median(&durs) / 1e6;
            let jiffies = median(&samples.jiffies);
            let baseline = ms(baselines.of(&ioctl));
            let seen = durs.len();
            match caused_by {
                Some((at, cause)) => Finding::SrcuStall {
                    ioctl,
                    step,
                    caused_by: Some(cause),
                    caused_at: Some(at),
                    median_ms,
                    range_ms: Some([
                        durs.iter().copied().fold(f64::INFINITY, f64::min) / 1e6,
                        durs.iter().copied().fold(f64::NEG_INFINITY, f64::max) / 1e6,
                    ]),
                    baseline_ms: baseline,
                    jiffies,
                    stalled_reps: seen,
                    reps,
                    clock: Clock::Wall,
                },
                None => Finding::SlowIoctl {
                    ioctl,
                    step,
                    median_ms,
                    baseline_ms: baseline,
                    jiffies,
                    slow_reps: seen,
                    reps,
                    clock: Clock::Wall,
                },
            }
        })
        .collect()
}

fn analyse_variant(
    name: &str,
    traces: &[ConstructionTrace],
    baselines: &Baselines,
    jiffy_ns: u64,
    kernel: SrcuKernel,
    seed: u64,
) -> VariantRecord {
    let mut series = Series::new();
    let mut stalled: BTreeMap<StallKey, StallSamples> = BTreeMap::new();
    for (rep, trace) in traces.iter().enumerate() {
        push_timings(series.at(rep), trace, jiffy_ns);
        let stalls = stalls_of(trace, baselines, jiffy_ns, kernel);
        let srcu_stalls = stalls.iter().filter(|s| s.caused_by.is_some()).count();
        series.push("stalls", "count", srcu_stalls as f64);
        for s in stalls {
            let entry = stalled.entry((s.index, s.name, s.caused_by)).or_default();
            entry.durations_ns.push(s.dur_ns as f64);
            entry.jiffies.push(s.jiffies);
        }
        for (stat, unit, value) in &trace.kvm_stats {
            series.push(stat, unit, *value as f64);
        }
    }
    let reps = traces.len();
    let metrics = series.finish(reps, name, seed);
    let findings = recurring_findings(stalled, reps, baselines);
    VariantRecord {
        timeline: median_timeline(traces, baselines, jiffy_ns, kernel),
        ..VariantRecord::ok(name, metrics, findings)
    }
}

/// The longest SRCU stall of a variant: what made it slower than an order that does not stall.
fn stall_cause(slower: &VariantRecord) -> Option<StallCause> {
    slower
        .findings
        .iter()
        .filter_map(|f| match f {
            Finding::SrcuStall {
                ioctl,
                caused_by,
                median_ms,
                jiffies,
                ..
            } => Some(StallCause {
                ioctl: ioctl.clone(),
                caused_by: caused_by.clone(),
                median_ms: *median_ms,
                jiffies: *jiffies,
                clock: Clock::Wall,
            }),
            _ => None,
        })
        .max_by(|a, b| a.median_ms.total_cmp(&b.median_ms))
}

/// Thread 001 on its own host: Firecracker on x86 at HZ=100, separate microVMs.
fn showcases() -> Vec<Showcase<LifecycleParams>> {
    let microvms = |strategy| LifecycleParams {
        strategy,
        back_to_back: false,
        ..LifecycleParams::default()
    };
    vec![
        Showcase {
            profile: "x86-vmx-hz100",
            variants: &["firecracker-order", "boot-activation"],
            params: microvms(Strategy::AlwaysDefer),
            why: "001, Linux 6.18 (call_srcu in registration): the first KVM_CREATE_VCPU waits out the irqchip's normal grace period, 1-2 jiffies (10-20 ms at HZ=100)",
            headline: None,
        },
        Showcase {
            profile: "x86-vmx-hz100",
            variants: &["firecracker-order", "boot-activation"],
            params: microvms(Strategy::LifecycleKeyed),
            why: "001, Sean's fix (sync until the first vCPU, then defer): no creation stall; registrations during boot still defer, so the next memslot update waits",
            // The thread's regression and its fix, one verdict: the same orders under the
            // showcase before (always-defer) and this one.
            headline: Some(Headline {
                thread: "001",
                before_run: Some(0),
                sides: Some(("always-defer", "lifecycle-keyed")),
                pairs: &[
                    HeadlinePair {
                        about: "the creation stall",
                        before: "firecracker-order",
                        after: "firecracker-order",
                        metric: "ready_ms",
                        shown: &[],
                    },
                    HeadlinePair {
                        about: "boot-time registrations",
                        before: "boot-activation",
                        after: "boot-activation",
                        metric: "boot.memslot_ms",
                        shown: &[],
                    },
                ],
            }),
        },
    ]
}

/// The lifecycle scenario.
#[derive(Debug)]
pub struct Lifecycle;

/// A registration strategy as `--set strategy=` names it.
pub fn strategy_name(strategy: Strategy) -> &'static str {
    STRATEGY.name(strategy)
}

/// The parameters of one run.
#[derive(Debug, Clone)]
pub struct LifecycleParams {
    /// vCPUs per VM.
    pub vcpus: u32,
    /// Emulated devices per VM.
    pub devices: u32,
    /// Guest memory, MiB.
    pub mem_mib: u32,
    /// Watchdog of the boot activation's vCPU run, ms.
    pub timeout_ms: u32,
    /// When io-bus registration waits for its grace period (model).
    pub strategy: Strategy,
    /// The modelled kernel's HZ, when set (model).
    pub hz: Option<u32>,
    /// Share of a concurrent SRCU reader's time inside its read section, percent (model).
    pub reader_pct: u32,
    /// Guest boot time before the activation, ms (model).
    pub boot_ms: u32,
    /// VMs built back to back (false: independent, each after the last one's grace period).
    pub back_to_back: bool,
    /// The `--set order=` sequence, run as variant `custom`.
    pub order: Option<Vec<Step>>,
}

impl Default for LifecycleParams {
    fn default() -> LifecycleParams {
        LifecycleParams {
            vcpus: 1,
            devices: 8,
            mem_mib: 16,
            timeout_ms: 2000,
            strategy: Strategy::AlwaysDefer,
            hz: None,
            reader_pct: 0,
            boot_ms: 50,
            back_to_back: true,
            order: None,
        }
    }
}

impl LifecycleParams {
    /// The validated plan that builds a VM in the order `steps`.
    fn construction(&self, steps: Vec<Step>) -> Result<ConstructionPlan, InputError> {
        let plan = ConstructionPlan {
            steps,
            vcpus: self.vcpus,
            devices: self.devices,
            mem_bytes: self.mem_mib as usize * (1 << 20),
            run_timeout: Duration::from_millis(u64::from(self.timeout_ms)),
            strategy: self.strategy,
            hz: self.hz,
            boot_ms: self.boot_ms,
            back_to_back: self.back_to_back,
            reader_pct: self.reader_pct,
        };
        plan.validate().map(|()| plan).map_err(InputError::from)
    }
}

impl Scenario for Lifecycle {
    type Plan = ConstructionPlan;
    type Params = LifecycleParams;
    const INFO: &'static ScenarioInfo = &INFO;
    const PARAMS: &'static [Param<LifecycleParams>] = &PARAMS;

    fn plan(
        &self,
        name: &str,
        request: &RunRequest<LifecycleParams>,
    ) -> Result<Option<ConstructionPlan>, InputError> {
        order_of(name)
            .map(|steps| request.params.construction(steps))
            .transpose()
    }

    /// The named variants, after `custom` when `--set order=` is given.
    fn plans(
        &self,
        request: &RunRequest<LifecycleParams>,
        can: Capabilities,
    ) -> Result<Vec<(String, ConstructionPlan)>, InputError> {
        let p = &request.params;
        let mut chosen = Vec::new();
        if let Some(steps) = &p.order {
            chosen.push(("custom".to_string(), p.construction(steps.clone())?));
        }
        // `--set order` without `--variant` runs the custom order alone.
        if !request.variants.is_empty() || p.order.is_none() {
            let names = INFO.selected_variants(&request.variants, can)?;
            chosen.extend(super::plan_each(self, names, request, can)?);
        }
        Ok(chosen)
    }

    fn cause(&self, slower: &VariantRecord) -> Option<StallCause> {
        stall_cause(slower)
    }

    fn analyse(&self, o: Observed<'_, ConstructionPlan, ConstructionTrace>) -> ScenarioOutcome {
        // Stalls are judged against the jiffy and the SRCU semantics of the kernel that
        // produced the timelines: the host the backend presents (the model's modelled host,
        // with `--set hz` applied).
        analyse(
            o.names,
            o.results,
            o.host.jiffy_ns(),
            o.host.srcu_kernel(),
            o.seed,
        )
    }

    fn charts(&self, _record: &RunRecord) -> Vec<Chart> {
        vec![Chart::Timeline]
    }

    fn notices(&self, request: &RunRequest<LifecycleParams>) -> Vec<Notice> {
        if request.params.order.is_some() && !request.variants.is_empty() {
            vec![Notice::CustomOrderAlongside {
                variants: request.variants.clone(),
            }]
        } else {
            Vec::new()
        }
    }

    fn showcases(&self) -> Vec<Showcase<LifecycleParams>> {
        showcases()
    }

    fn validation(&self, host: &HostInfo) -> Option<ValidationPoint<LifecycleParams>> {
        // The model runs the SRCU scheme of the kernel it is checked against.
        let strategy = match host.srcu_kernel().registration {
            BusRegistration::Synchronizes => Strategy::AlwaysSync,
            BusRegistration::Defers => Strategy::AlwaysDefer,
        };
        Some(ValidationPoint {
            variants: &[
                "irqchip-first",
                "memslots-first",
                "devices-after-vcpus",
                "qemu-order",
                "firecracker-order",
                "boot-activation",
            ],
            params: LifecycleParams::default(),
            model_params: LifecycleParams {
                strategy,
                ..LifecycleParams::default()
            },
            checks: |model, kvm, v, time| {
                let mut out: Vec<Check> = Vec::new();
                out.extend(check(model, kvm, v, "stalls", Rule::Exact(0.0)));
                out.extend(check(model, kvm, v, "ready_ms", time));
                if let (Some((p, _)), Some((m, band))) = (stall_ms(model, v), stall_ms(kvm, v)) {
                    out.push(judge_in_band(
                        INFO.name, v, "stall_ms", "ms", p, m, band, time,
                    ));
                }
                out.extend(check(model, kvm, v, "boot.memslot_ms", time));
                out
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hvlab_core::lifecycle::IoctlEvent;

    const JIFFY: u64 = 4_000_000;

    fn plan(steps: &[Step]) -> ConstructionPlan {
        ConstructionPlan {
            steps: steps.to_vec(),
            vcpus: 1,
            devices: 8,
            mem_bytes: 1 << 24,
            run_timeout: Duration::from_secs(1),
            strategy: Strategy::AlwaysDefer,
            hz: None,
            boot_ms: 50,
            back_to_back: true,
            reader_pct: 0,
        }
    }

    #[test]
    fn every_named_order_is_valid() {
        for v in VARIANTS.iter().chain(&MODEL_VARIANTS) {
            plan(&order_of(v.name).unwrap()).validate().unwrap();
        }
    }

    #[test]
    fn orders_kvm_would_reject_are_refused_with_the_reason() {
        let cases: [(&[Step], &str); 6] = [
            (&[Memslot, CreateVm, Vcpus, Run], "start with create-vm"),
            (&[CreateVm, Memslot, Run, Vcpus], "end with run"),
            (
                &[CreateVm, Memslot, Vcpus, Irqchip, Run],
                "once a vCPU exists",
            ),
            (
                &[CreateVm, Memslot, Pit, Irqchip, Vcpus, Run],
                "irqchip before pit",
            ),
            (&[CreateVm, Vcpus, Run], "memslot"),
            (&[CreateVm, Memslot, Memslot, Vcpus, Run], "twice"),
        ];
        for (steps, why) in cases {
            let msg = plan(steps).validate().unwrap_err().to_string();
            assert!(msg.contains(why), "{steps:?}: {msg}");
        }
    }

    #[test]
    fn custom_orders_parse_and_unknown_steps_list_the_known_ones() {
        assert_eq!(
            parse_order("create-vm, memslot,vcpus,run").unwrap(),
            vec![CreateVm, Memslot, Vcpus, Run]
        );
        let msg = parse_order("create-vm,irq,run").unwrap_err().to_string();
        assert!(msg.contains("`irq`") && msg.contains("irqchip"), "{msg}");
    }

    fn trace(steps: &[(&str, u64)]) -> ConstructionTrace {
        let mut t = 0;
        let ioctls: Vec<IoctlEvent> = steps
            .iter()
            .map(|(name, dur)| {
                let e = IoctlEvent {
                    name: (*name).into(),
                    start_ns: t,
                    dur_ns: *dur,
                    flags: None,
                };
                t += dur + 2_000;
                e
            })
            .collect();
        ConstructionTrace {
            ioctls,
            ready_ns: t,
            kvm_stats: vec![("kvm.vcpu.io_exits".into(), "count".into(), 1)],
            srcu_effects: Vec::new(),
            since_last_ns: None,
            since_teardown_ns: None,
            tick_phase_ns: None,
            boot_thread: None,
        }
    }

    #[test]
    fn analysis_finds_the_irqchip_stall_and_explains_the_verdict() {
        let slow: Vec<_> = (0..10)
            .map(|i| {
                trace(&[
                    ("KVM_CREATE_VM", 200_000),
                    ("KVM_CREATE_IRQCHIP", 70_000),
                    ("KVM_CREATE_PIT2", 70_000),
                    ("KVM_SET_USER_MEMORY_REGION", 7_000_000 + i * 100_000),
                    ("KVM_CREATE_VCPU", 60_000),
                    ("KVM_RUN", 90_000),
                ])
            })
            .collect();
        let fast: Vec<_> = (0..10)
            .map(|i| {
                trace(&[
                    ("KVM_CREATE_VM", 200_000),
                    ("KVM_SET_USER_MEMORY_REGION", 40_000 + i * 1_000),
                    ("KVM_CREATE_IRQCHIP", 30_000),
                    ("KVM_CREATE_PIT2", 50_000),
                    ("KVM_CREATE_VCPU", 60_000),
                    ("KVM_RUN", 90_000),
                ])
            })
            .collect();
        let names = vec!["irqchip-first".to_string(), "memslots-first".to_string()];
        let out = analyse(
            &names,
            &[Ok(slow), Ok(fast)],
            JIFFY,
            SrcuKernel::of("6.18.0", false),
            1,
        );
        let slow = &out.variants[0];
        assert_eq!(slow.metrics["stalls"].median, 1.0);
        assert_eq!(slow.metrics["kvm.vcpu.io_exits"].samples, vec![1.0; 10]);
        match &slow.findings[..] {
            [
                Finding::SrcuStall {
                    ioctl,
                    step,
                    caused_by,
                    stalled_reps,
                    reps,
                    median_ms,
                    range_ms,
                    ..
                },
            ] => {
                // validate judges the model's stall within this range (tick phase spreads it).
                let [low, high] = range_ms.expect("a stall carries its range");
                assert!(
                    low <= *median_ms && *median_ms <= high,
                    "{low} {median_ms} {high}"
                );
                assert_eq!(ioctl, "KVM_SET_USER_MEMORY_REGION");
                assert_eq!(*step, 3);
                assert_eq!(caused_by.as_deref(), Some("KVM_CREATE_IRQCHIP"));
                assert_eq!((*stalled_reps, *reps), (10, 10));
            }
            other => panic!("unexpected findings {other:?}"),
        }
        assert!(out.variants[1].findings.is_empty());
        assert_eq!(out.variants[1].metrics["stalls"].median, 0.0);
        let verdicts = crate::scenario::judge_question(
            &Lifecycle,
            &out.variants,
            &crate::scenario::Baseline::Declared,
            1,
        );
        let v = &verdicts[0];
        assert_eq!(v.faster, "memslots-first");
        assert_eq!(v.against(), "memslots-first");
        assert_eq!(v.class(), crate::analysis::class::MetricClass::Slower);
        assert!(v.significant && v.ratio > 10.0);
        assert!(
            v.to_string().contains("cause: KVM_SET_USER_MEMORY_REGION"),
            "{}",
            v
        );
        assert!(
            v.to_string().contains("started by KVM_CREATE_IRQCHIP"),
            "{}",
            v
        );
    }

    #[test]
    fn failed_variants_keep_their_status_and_do_not_poison_the_others() {
        let ok = vec![trace(&[("KVM_CREATE_VM", 1), ("KVM_RUN", 1)])];
        let names = vec!["a".to_string(), "b".to_string()];
        let out = analyse(
            &names,
            &[Ok(ok), Err("unsupported: needs X".into())],
            JIFFY,
            SrcuKernel::of("6.18.0", false),
            1,
        );
        assert_eq!(out.variants[1].status, "unsupported: needs X");
        assert!(out.variants[1].metrics.is_empty());
        assert!(
            crate::scenario::judge_question(
                &Lifecycle,
                &out.variants,
                &crate::scenario::Baseline::Declared,
                1
            )
            .is_empty()
        );
    }
}
