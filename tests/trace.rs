//! `hvlab trace` against real programs: hvlab itself, and QEMU's microvm.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)] // test code: a panic is the failure report

use crate::common;

use common::{hvlab, json, kvm_or_skip, tool_or_skip};

#[test]
fn tracing_hvlab_finds_its_irqchip_stall() {
    let Some(_kvm) = kvm_or_skip("trace_hvlab") else {
        return;
    };
    if !tool_or_skip("trace_hvlab", "strace") {
        return;
    }
    let out = hvlab()
        .args(["trace", "--until", "exit", "--json", "--"])
        .arg(env!("CARGO_BIN_EXE_hvlab"))
        .args([
            "run",
            "lifecycle",
            "--variant",
            "irqchip-first",
            "--reps",
            "3",
            "--warmup",
            "0",
            "--no-store",
        ])
        .output()
        .unwrap();
    let r = json(&out);
    let names: Vec<&str> = r["ioctls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    let pos = |n: &str| {
        names
            .iter()
            .position(|x| *x == n)
            .unwrap_or_else(|| panic!("{n} missing: {names:?}"))
    };
    assert!(pos("KVM_CREATE_VM") < pos("KVM_CREATE_IRQCHIP"));
    assert!(pos("KVM_CREATE_IRQCHIP") < pos("KVM_SET_USER_MEMORY_REGION"));
    assert_eq!(r["first_run"].as_u64().unwrap() as usize, pos("KVM_RUN"));
    // SRCU stalls name their cause; another slow ioctl (a loaded machine) is listed without one.
    // Three VMs: on a busy host the VMM can be held up between the irqchip and the memslot
    // update for as long as the grace period lasts, and one VM then does not stall.
    let stalls: Vec<&serde_json::Value> = r["stalls"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| !s["caused_by"].is_null())
        .collect();
    assert!(
        stalls
            .iter()
            .any(|s| s["ioctl"] == "KVM_SET_USER_MEMORY_REGION"
                && s["caused_by"] == "KVM_CREATE_IRQCHIP"),
        "no memslot stall behind the irqchip in 3 VMs: {}",
        r["stalls"]
    );
    // Every attribution points back at the registration it names (a later VM's ioeventfds
    // can wait out each other's grace period too).
    for s in stalls {
        let cause = s["caused_by_index"].as_u64().unwrap() as usize;
        assert_eq!(names[cause], s["caused_by"].as_str().unwrap(), "{s}");
        assert!(cause <= s["index"].as_u64().unwrap() as usize, "{s}");
    }
}

#[test]
fn tracing_qemu_microvm_lists_construction_and_flags_the_stall() {
    let Some(_kvm) = kvm_or_skip("trace_qemu") else {
        return;
    };
    if !tool_or_skip("trace_qemu", "strace") || !tool_or_skip("trace_qemu", "qemu-system-x86_64") {
        return;
    }
    let out = hvlab()
        .args(["trace", "--json", "--timeout", "60", "--"])
        .args([
            "qemu-system-x86_64",
            "-M",
            "microvm",
            "-enable-kvm",
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-m",
            "64M",
        ])
        .output()
        .unwrap();
    let r = json(&out);
    assert_eq!(r["ended"], "stopped after the first KVM_RUN", "{r}");
    let first_run = r["first_run"].as_u64().expect("QEMU reached KVM_RUN") as usize;
    let pre: Vec<&str> = r["ioctls"].as_array().unwrap()[..first_run]
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    for needed in [
        "KVM_CREATE_VM",
        "KVM_IOEVENTFD",
        "KVM_SET_USER_MEMORY_REGION",
        "KVM_CREATE_VCPU",
    ] {
        assert!(
            pre.contains(&needed),
            "{needed} not before the first KVM_RUN: {pre:?}"
        );
    }
    // QEMU registers and re-registers its ioeventfds: one of the re-registrations waits for
    // the grace period the first deferred free started (3.7–6.6 ms measured here).
    let jiffy_ms = r["jiffy_ns"].as_f64().unwrap() / 1e6;
    let stalls = r["stalls"].as_array().unwrap();
    let before_run: Vec<_> = stalls
        .iter()
        .filter(|s| (s["index"].as_u64().unwrap() as usize) < first_run)
        .collect();
    // Only SRCU stalls name a cause; any other slow ioctl is reported without one.
    let srcu: Vec<_> = before_run
        .iter()
        .filter(|s| s["caused_by"].is_string())
        .collect();
    assert!(!srcu.is_empty(), "no SRCU stall flagged: {stalls:?}");
    assert!(
        srcu.iter()
            .any(|s| s["duration_ms"].as_f64().unwrap() > jiffy_ms / 2.0)
    );
    for s in &before_run {
        let can_wait = hvlab_core::ioctl_table::srcu_effect(
            s["ioctl"].as_str().unwrap(),
            None,
            &hvlab::lab::host::probe().srcu_kernel(),
        )
        .waits;
        assert!(
            can_wait || s["caused_by"].is_null(),
            "an ioctl that cannot wait for SRCU got the label: {s}"
        );
    }
}

/// Processes whose command line holds `marker` (the tests' QEMUs carry it as their name).
fn with_marker(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let state = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let zombie = state
                .rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'));
            (!zombie && String::from_utf8_lossy(&cmdline).contains(marker)).then_some(pid)
        })
        .collect()
}

#[test]
fn a_trace_through_timeout_setsid_or_a_shell_wrapper_leaves_no_vmm_running() {
    let test = "a_trace_through_timeout_setsid_or_a_shell_wrapper_leaves_no_vmm_running";
    let Some(_kvm) = kvm_or_skip(test) else {
        return;
    };
    if !tool_or_skip(test, "strace") || !tool_or_skip(test, "qemu-system-x86_64") {
        return;
    }
    for (i, wrapper) in ["timeout 120", "setsid", "sh -c"].iter().enumerate() {
        let marker = format!("hvlab-trace-orphan-{}-{i}", std::process::id());
        let qemu = format!(
            "qemu-system-x86_64 -name {marker} -M microvm -enable-kvm -nodefaults -no-user-config -display none -m 64M"
        );
        let mut args: Vec<String> = wrapper.split(' ').map(String::from).collect();
        if *wrapper == "sh -c" {
            // A wrapper that starts the VMM in its own session and waits for it.
            args.push(format!("setsid {qemu} & wait"));
        } else {
            args.extend(qemu.split(' ').map(String::from));
        }
        let out = hvlab()
            .args(["trace", "--json", "--timeout", "60", "--"])
            .args(&args)
            .output()
            .unwrap();
        // Whatever the trace found, nothing of it may run on.
        std::thread::sleep(std::time::Duration::from_millis(300));
        let left = with_marker(&marker);
        for pid in &left {
            // SAFETY: kill(2) on a pid read from /proc; cleanup only.
            unsafe { libc::kill(*pid, libc::SIGKILL) };
        }
        assert!(left.is_empty(), "{wrapper}: QEMU left running: {left:?}");
        let r = json(&out);
        assert_eq!(
            r["ended"], "stopped after the first KVM_RUN",
            "{wrapper}: {r}"
        );
    }
}
