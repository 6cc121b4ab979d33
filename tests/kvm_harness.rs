//! The KVM harness on real /dev/kvm: timed construction, binary statistics read through their
//! descriptors, and guests that misbehave being reported instead of hanging.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)] // test code: a panic is the failure report

mod common;

use std::time::{Duration, Instant};

use hvlab::kvm::guest::{ENTRY_GPA, signal_payload};
use hvlab::kvm::memory::GuestMemory;
use hvlab::kvm::stats::{StatKind, StatsReader, StatsSnapshot, deltas};
use hvlab::kvm::vm::Vm;
use hvlab::kvm::{KvmError, open_kvm};

/// A VM with 1 MiB of RAM holding `payload` at the entry point, and one vCPU.
fn vm_with(payload: &[u8]) -> Vm {
    let kvm = open_kvm().unwrap();
    let mut mem = GuestMemory::anonymous(1 << 20).unwrap();
    mem.write(ENTRY_GPA as usize, payload).unwrap();
    let mut vm = Vm::create(&kvm).unwrap();
    vm.add_memslot(0, mem).unwrap();
    vm.create_vcpu().unwrap();
    vm
}

#[test]
fn every_step_is_timed_in_issue_order_on_one_clock() {
    if !common::kvm_or_skip("timed_steps") {
        return;
    }
    let mut vm = vm_with(&signal_payload());
    vm.run_until_signal(0, Duration::from_secs(2)).unwrap();
    let names: Vec<&str> = vm.log().iter().map(|t| t.name).collect();
    assert_eq!(
        names,
        [
            "KVM_CREATE_VM",
            "KVM_SET_USER_MEMORY_REGION",
            "KVM_CREATE_VCPU",
            "KVM_GET_SREGS",
            "KVM_SET_SREGS",
            "KVM_GET_REGS",
            "KVM_SET_REGS",
            "KVM_RUN"
        ]
    );
    for pair in vm.log().windows(2) {
        assert!(
            pair[1].start_ns >= pair[0].start_ns + pair[0].dur_ns,
            "{pair:?}"
        );
    }
}

#[test]
fn vcpu_statistics_are_read_through_their_descriptors() {
    if !common::kvm_or_skip("stats") {
        return;
    }
    let mut vm = vm_with(&signal_payload());
    let vcpu_stats = StatsReader::open(vm.vcpu(0).unwrap()).unwrap();
    let layout = vcpu_stats.layout();
    assert!(layout.id.contains("vcpu-0"), "id {}", layout.id);
    let exits = layout
        .descs
        .iter()
        .find(|d| d.name == "exits")
        .expect("x86 vCPUs have `exits`");
    assert_eq!(exits.kind, StatKind::Cumulative);
    assert_eq!(exits.size, 1);
    let before = vcpu_stats.snapshot().unwrap();
    vm.run_until_signal(0, Duration::from_secs(2)).unwrap();
    let after = vcpu_stats.snapshot().unwrap();
    let changed = deltas(layout, &before, &after);
    let exit_delta = changed
        .iter()
        .find(|d| d.name == "exits")
        .map_or(0, |d| d.delta);
    // The guest left at least once (its signal); whether KVM counts more is host-specific.
    assert!(exit_delta >= 1, "{changed:?}");
    assert!(changed.iter().all(|d| d.delta != 0));
    // VM-level statistics parse too, and a fresh VM's are all from this VM's life.
    let vm_stats = StatsReader::open(vm.fd()).unwrap();
    let zero = StatsSnapshot::from_data(vec![0; vm_stats.layout().data_len()]);
    let since = deltas(vm_stats.layout(), &zero, &vm_stats.snapshot().unwrap());
    assert!(since.iter().all(|d| !d.name.is_empty()));
}

#[test]
fn a_guest_that_spins_forever_is_stopped_by_the_watchdog() {
    if !common::kvm_or_skip("spinning_guest") {
        return;
    }
    let mut vm = vm_with(&[0xeb, 0xfe]); // jmp $
    let t = Instant::now();
    let err = vm
        .run_until_signal(0, Duration::from_millis(300))
        .unwrap_err();
    let took = t.elapsed();
    assert!(matches!(err, KvmError::Guest(_)), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("watchdog") && msg.contains("rip=0x100"),
        "{msg}"
    );
    assert!(
        took < Duration::from_millis(300) + Duration::from_secs(1),
        "took {took:?}"
    );
}

#[test]
fn a_guest_that_triple_faults_is_reported_with_its_exit() {
    if !common::kvm_or_skip("triple_fault") {
        return;
    }
    // 32-bit protected mode with a zero-limit IDT, then int3: the #BP cannot be delivered,
    // nor the #GP and #DF that follow, so the vCPU shuts down. (Real mode will not do: some
    // emulators, PVM's among them, ignore the IVT limit.)
    let mut vm = vm_with(&[0xcc]);
    let vcpu = vm.vcpu(0).unwrap();
    let mut sregs = vcpu.get_sregs().unwrap();
    sregs.cr0 |= 1; // PE
    for seg in [
        &mut sregs.ds,
        &mut sregs.es,
        &mut sregs.ss,
        &mut sregs.fs,
        &mut sregs.gs,
    ] {
        seg.base = 0;
        seg.limit = 0xffff_ffff;
        seg.g = 1;
        seg.db = 1;
        seg.s = 1;
        seg.type_ = 0x3;
        seg.present = 1;
        seg.selector = 0x10;
    }
    sregs.cs.limit = 0xffff_ffff;
    sregs.cs.g = 1;
    sregs.cs.db = 1;
    sregs.cs.s = 1;
    sregs.cs.type_ = 0xb;
    sregs.cs.present = 1;
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    vcpu.set_sregs(&sregs).unwrap();
    let t = Instant::now();
    let err = vm
        .run_until_signal_keeping_mode(0, Duration::from_secs(2))
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("Shutdown") || msg.contains("InternalError") || msg.contains("FailEntry"),
        "{msg}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "reported only by the watchdog: {msg}"
    );
}
