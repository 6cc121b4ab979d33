//! Harness overhead per exit: hvlab's run loop (typed exits, handler closure, watchdog) against
//! a bare `KVM_RUN` loop doing the same ioctls, on identical VMs running the `pio-out` payload.
//! Both are timed from the guest's Start signal to its End signal. Target: within 5%.
//!
//! `cargo bench --bench exit_overhead` (needs /dev/kvm).
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)] // bench code: a panic is the failure report

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use hvlab::backend::exits::ExitKind;
use hvlab::kvm::guest::layout::{GuestPage, Layout};
use hvlab::kvm::guest::payload::{self, Vendor};
use hvlab::kvm::guest::runner::{Flow, GuestExit};
use hvlab::kvm::guest::{Cpl, SIGNAL_PORT, Signal, TEST_PORT};
use hvlab::kvm::measure;
use hvlab::kvm::memory::{Backing, GuestMemory};
use hvlab::kvm::vm::Vm;
use hvlab::kvm::{host, open_kvm};
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

fn bench(c: &mut Criterion) {
    let Ok(kvm) = open_kvm() else {
        eprintln!("\n*** SKIPPED exit_overhead: /dev/kvm is not usable ***\n");
        return;
    };
    let cpl = match host::probe().kvm_flavour {
        host::KvmFlavour::Pvm => Cpl::Three,
        _ => Cpl::Zero,
    };
    let mut group = c.benchmark_group("pio-out exit roundtrip");
    group
        .sample_size(20)
        .measurement_time(Duration::from_secs(8));
    group.bench_function("raw KVM_RUN loop", |b| {
        b.iter_custom(|iters| raw_loop(&kvm, iters, cpl))
    });
    group.bench_function("hvlab harness", |b| {
        b.iter_custom(|iters| hvlab_loop(&kvm, iters, cpl))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
