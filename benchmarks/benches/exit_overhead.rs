//! Harness overhead per exit: hvlab's run loop (typed exits, handler closure, watchdog) against
//! a bare `KVM_RUN` loop doing the same ioctls, on identical VMs running the `pio-out` payload.
//! Both are timed from the guest's Start signal to its End signal, in alternating batches in
//! one process (ABBA), so the host's drift hits both; the answer is the ratio with its 95%
//! interval, and the median of the per-batch paired ratios. Target: within 1%.
//!
//! `cargo bench -p hvlab-bench --bench exit_overhead` (needs /dev/kvm; `HVLAB_BENCH_EXITS` sets the batch).
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)] // bench code: a panic is the failure report

use std::time::{Duration, Instant};

use hvlab::analysis::statistics;
use hvlab::kvm::guest::layout::{GuestPage, Layout};
use hvlab::kvm::guest::payload::{self, Vendor};
use hvlab::kvm::guest::runner::{Flow, GuestExit};
use hvlab::kvm::guest::{Cpl, SIGNAL_PORT, Signal, TEST_PORT};
use hvlab::kvm::guest_memory::{Backing, GuestMemory};
use hvlab::kvm::measure;
use hvlab::kvm::vm::Vm;
use hvlab::kvm::{host, open_kvm};
use hvlab_core::exits::ExitKind;
use kvm_ioctls::{Kvm, VcpuExit};

fn pio_out_vm(kvm: &Kvm, iterations: u64, cpl: Cpl) -> Vm {
    let layout = Layout::new(2 << 20, GuestPage::Huge, 0).unwrap();
    let code = payload::exit_loop(ExitKind::PioOut, iterations, Vendor::of_host()).unwrap();
    let mut system = GuestMemory::backed(layout.system_bytes as usize, Backing::Populated).unwrap();
    layout.write_system(&mut system, &code).unwrap();
    let mut vm = Vm::create(kvm).unwrap();
    vm.add_memslot(0, system).unwrap();
    vm.create_vcpu().unwrap();
    vm.setup_long_mode(0, cpl).unwrap();
    vm
}

fn hvlab_loop(kvm: &Kvm, iterations: u64, cpl: Cpl) -> Duration {
    let mut vm = pio_out_vm(kvm, iterations, cpl);
    let m = measure::section(&mut vm, Duration::from_secs(600), |exit| match exit {
        GuestExit::PioOut { port } if port == TEST_PORT => Ok(Flow::Continue),
        other => Err(measure::unexpected(&other)),
    })
    .unwrap();
    Duration::from_nanos(m.elapsed_ns)
}

fn raw_loop(kvm: &Kvm, iterations: u64, cpl: Cpl) -> Duration {
    let mut vm = pio_out_vm(kvm, iterations, cpl);
    let vcpu = vm.vcpu_mut(0).unwrap();
    let mut start = Instant::now();
    loop {
        match vcpu.run().unwrap() {
            VcpuExit::IoOut(port, _) if port == TEST_PORT => {}
            VcpuExit::IoOut(port, data) if port == SIGNAL_PORT => match Signal::from_al(data[0]) {
                Signal::Start => start = Instant::now(),
                Signal::End => return start.elapsed(),
                other => panic!("signal {other:?}"),
            },
            other => panic!("exit {other:?}"),
        }
    }
}

/// Batches per loop, alternating ABBA so drift on a shared host hits both loops alike.
const ROUNDS: usize = 24;

fn main() {
    let Ok(kvm) = open_kvm() else {
        eprintln!("\n*** SKIPPED exit_overhead: /dev/kvm is not usable ***\n");
        return;
    };
    let cpl = match host::probe().kvm_flavour {
        host::KvmFlavour::Pvm => Cpl::Three,
        _ => Cpl::Zero,
    };
    let iterations: u64 = std::env::var("HVLAB_BENCH_EXITS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4000);
    let per_exit = |d: Duration| d.as_nanos() as f64 / iterations as f64;
    // Warm both paths (page cache, the kernel's shadow pages) before measuring.
    raw_loop(&kvm, iterations, cpl);
    hvlab_loop(&kvm, iterations, cpl);
    let (mut raw, mut harness, mut paired) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        let (r, h) = if round % 2 == 0 {
            let r = raw_loop(&kvm, iterations, cpl);
            (r, hvlab_loop(&kvm, iterations, cpl))
        } else {
            let h = hvlab_loop(&kvm, iterations, cpl);
            (raw_loop(&kvm, iterations, cpl), h)
        };
        raw.push(per_exit(r));
        harness.push(per_exit(h));
        paired.push(per_exit(h) / per_exit(r));
    }
    let seed = statistics::seed_for(statistics::FNV1A_OFFSET, &["exit_overhead"]);
    let ratio = statistics::median(&harness) / statistics::median(&raw);
    let ci = statistics::bootstrap_ratio_ci(&harness, &raw, seed);
    let paired_ci = statistics::bootstrap_median_ci(&paired, seed);
    println!(
        "pio-out exit roundtrip, {ROUNDS} alternating batches of {iterations} exits each:\n  raw KVM_RUN loop  {:.2} µs/exit (median; 95% CI {:.2}–{:.2})\n  hvlab harness     {:.2} µs/exit (median; 95% CI {:.2}–{:.2})\n  harness / raw     {ratio:.4} (95% CI {:.4}–{:.4}); paired per batch {:.4} (95% CI {:.4}–{:.4})",
        statistics::median(&raw) / 1e3,
        statistics::bootstrap_median_ci(&raw, seed)[0] / 1e3,
        statistics::bootstrap_median_ci(&raw, seed)[1] / 1e3,
        statistics::median(&harness) / 1e3,
        statistics::bootstrap_median_ci(&harness, seed)[0] / 1e3,
        statistics::bootstrap_median_ci(&harness, seed)[1] / 1e3,
        ci[0],
        ci[1],
        statistics::median(&paired),
        paired_ci[0],
        paired_ci[1],
    );
}
