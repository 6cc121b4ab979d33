//! Long-mode payloads, assembled with iced-x86 at [`CODE_GPA`].
//!
//! Every payload has the same shape: setup, signal `Start`, read the TSC, the measured loop,
//! read the TSC, signal `End` with the tick count in `RBX` (repeating the `End` signal if
//! re-entered). Pages the guest needs before `Start` (the code, the touch-order array) are
//! touched before it, so the section between the signals contains only what is measured.

use iced_x86::IcedError;
use iced_x86::code_asm::*;

use super::layout::{
    CODE_GPA, DATA_GPA, INDEX_GPA, IOEVENTFD_GPA, MMIO_TEST_GPA, PIN_DOORBELL_GPA,
};
use super::{SIGNAL_PORT, Signal, TEST_PORT};
use crate::KvmError;
use hvlab_core::exits::ExitKind;
use hvlab_core::memory::{Access, Touch};

fn asm_err(e: IcedError) -> KvmError {
    KvmError::Assemble(e.to_string())
}

/// The CPU vendor decides the hypercall opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    /// `vmcall`.
    Intel,
    /// `vmmcall`.
    Amd,
}

impl Vendor {
    /// The host CPU's vendor (the guest sees the same one).
    pub fn of_host() -> Vendor {
        #[cfg(target_arch = "x86_64")]
        {
            let r = std::arch::x86_64::__cpuid(0);
            let mut v = Vec::with_capacity(12);
            for reg in [r.ebx, r.edx, r.ecx] {
                v.extend_from_slice(&reg.to_le_bytes());
            }
            if v.as_slice() == b"AuthenticAMD" || v.as_slice() == b"HygonGenuine" {
                return Vendor::Amd;
            }
        }
        Vendor::Intel
    }
}

fn signal(a: &mut CodeAssembler, s: Signal) -> Result<(), IcedError> {
    a.mov(dx, u32::from(SIGNAL_PORT))?;
    a.mov(al, u32::from(s.al()))?;
    a.out(dx, al)
}

/// `reg = TSC`.
fn read_tsc(a: &mut CodeAssembler, reg: AsmRegister64) -> Result<(), IcedError> {
    a.rdtsc()?;
    a.shl(rdx, 32u32)?;
    a.or(rax, rdx)?;
    a.mov(reg, rax)
}

/// `RBX = TSC - R12`, then signal `End` forever.
fn finish(a: &mut CodeAssembler) -> Result<(), IcedError> {
    read_tsc(a, rbx)?;
    a.sub(rbx, r12)?;
    let mut end = a.create_label();
    a.set_label(&mut end)?;
    signal(a, Signal::End)?;
    a.jmp(end)
}

/// Touches `pages` pages of the data region in the order of the u32 page indices at
/// [`INDEX_GPA`] (`index_bytes` long, pre-touched before `Start`).
pub fn touch_loop(
    pages: u64,
    index_bytes: u64,
    access: Access,
    touch: Touch,
) -> Result<Vec<u8>, KvmError> {
    touch_loop_with(Some((pages, index_bytes)), access, touch)
}

/// [`touch_loop`] for one of several vCPUs: the VMM sets `RSI` to the start of this vCPU's
/// (page-aligned) slice of the touch-order array and `R13` to its length, so every vCPU runs
/// the same code on its own slice.
pub fn touch_slice_loop(access: Access, touch: Touch) -> Result<Vec<u8>, KvmError> {
    touch_loop_with(None, access, touch)
}

/// `fixed`: (pages, index bytes) at [`INDEX_GPA`]; `None`: from `RSI`/`R13`.
fn touch_loop_with(
    fixed: Option<(u64, u64)>,
    access: Access,
    touch: Touch,
) -> Result<Vec<u8>, KvmError> {
    let build = || -> Result<Vec<u8>, IcedError> {
        let mut a = CodeAssembler::new(64)?;
        // Pre-touch the index array so its faults land before Start.
        match fixed {
            Some((pages, index_bytes)) => {
                a.mov(rsi, INDEX_GPA)?;
                a.mov(r9, INDEX_GPA + index_bytes.max(4096))?;
                a.mov(r13, pages)?;
            }
            None => {
                a.lea(r9, qword_ptr(rsi + r13 * 4))?;
            }
        }
        a.mov(r8, rsi)?;
        let mut pre = a.create_label();
        a.set_label(&mut pre)?;
        a.mov(eax, dword_ptr(r8))?;
        a.add(r8, 4096i32)?;
        a.cmp(r8, r9)?;
        a.jb(pre)?;

        signal(&mut a, Signal::Start)?;
        read_tsc(&mut a, r12)?;
        a.mov(rbx, DATA_GPA)?;
        a.xor(r10, r10)?;
        let mut next = a.create_label();
        a.set_label(&mut next)?;
        a.mov(eax, dword_ptr(rsi + r10 * 4))?; // zero-extends into rax
        a.shl(rax, 12u32)?;
        a.add(rax, rbx)?;
        match (touch, access) {
            (Touch::FirstByte, Access::Write) => a.mov(byte_ptr(rax), 1u32)?,
            (Touch::FirstByte, Access::Read) => a.mov(r11b, byte_ptr(rax))?,
            (Touch::WholePage, Access::Write) => {
                a.mov(rdi, rax)?;
                a.mov(ecx, 512u32)?;
                a.xor(eax, eax)?;
                a.rep().stosq()?;
            }
            (Touch::WholePage, Access::Read) => {
                // One load per cache line reads every line of the page.
                a.xor(r14, r14)?;
                let mut line = a.create_label();
                a.set_label(&mut line)?;
                a.mov(r11, qword_ptr(rax + r14))?;
                a.add(r14, 64i32)?;
                a.cmp(r14, 4096i32)?;
                a.jb(line)?;
            }
        }
        a.inc(r10)?;
        a.cmp(r10, r13)?;
        a.jb(next)?;
        finish(&mut a)?;
        a.assemble(CODE_GPA)
    };
    build().map_err(asm_err)
}

/// Runs the exit-causing instruction of `kind` `iterations` times.
pub fn exit_loop(kind: ExitKind, iterations: u64, vendor: Vendor) -> Result<Vec<u8>, KvmError> {
    let build = || -> Result<Vec<u8>, IcedError> {
        let mut a = CodeAssembler::new(64)?;
        let target = match kind {
            ExitKind::Ioeventfd => IOEVENTFD_GPA,
            _ => MMIO_TEST_GPA,
        };
        a.mov(r14, target)?;
        signal(&mut a, Signal::Start)?;
        read_tsc(&mut a, r12)?;
        a.mov(r13, iterations.max(1))?;
        let mut next = a.create_label();
        a.set_label(&mut next)?;
        match kind {
            ExitKind::PioOut | ExitKind::PmuOn | ExitKind::PmuOff => {
                a.mov(dx, u32::from(TEST_PORT))?;
                a.out(dx, al)?;
            }
            ExitKind::PioIn => {
                a.mov(dx, u32::from(TEST_PORT))?;
                a.in_(al, dx)?;
            }
            ExitKind::MmioWrite => a.mov(dword_ptr(r14), eax)?,
            ExitKind::MmioRead => a.mov(eax, dword_ptr(r14))?,
            ExitKind::Cpuid => {
                a.xor(eax, eax)?;
                a.cpuid()?;
            }
            ExitKind::Hypercall => {
                // KVM_HC_VAPIC_POLL_IRQ: a no-op hypercall (at CPL3 KVM refuses it with
                // -KVM_EPERM, after the same roundtrip).
                a.mov(eax, 1u32)?;
                match vendor {
                    Vendor::Amd => a.vmmcall()?,
                    Vendor::Intel => a.vmcall()?,
                }
            }
            ExitKind::Hlt => a.hlt()?,
            // Refused by `kvm::exits::roundtrips` before any VM is built: the fastpath WRMSR
            // needs an in-kernel LAPIC in TSC-deadline mode, which this guest does not arm.
            ExitKind::Fastpath => {}
            ExitKind::Ioeventfd => a.mov(dword_ptr(r14), 0u32)?,
        }
        a.dec(r13)?;
        a.jnz(next)?;
        finish(&mut a)?;
        a.assemble(CODE_GPA)
    };
    build().map_err(asm_err)
}

/// Iterations of the spinning guest's counting loop between two `pause`s.
const SPINS_PER_PAUSE: u32 = 4096;

/// A guest that keeps running without exits: signal `Start`, then spin forever, counting down
/// [`SPINS_PER_PAUSE`] iterations between two `pause`s. The lifecycle scenario's boot orders
/// keep vCPU 0 in it while the VMM registers devices.
///
/// A `pause` every iteration would exit: hardware's pause-loop exiting (Intel PLE, AMD's pause
/// filter) traps `pause`s that come within ~128 cycles of each other, and QEMU's TCG leaves its
/// execution loop on every `pause`, which on its instruction clock made the 50 ms a boot order
/// spins take about 9 s of wall time per VM. Thousands of cycles apart they do neither.
pub fn spin_loop() -> Result<Vec<u8>, KvmError> {
    let build = || -> Result<Vec<u8>, IcedError> {
        let mut a = CodeAssembler::new(64)?;
        signal(&mut a, Signal::Start)?;
        let mut spin = a.create_label();
        let mut count = a.create_label();
        a.set_label(&mut spin)?;
        a.mov(ecx, SPINS_PER_PAUSE)?;
        a.set_label(&mut count)?;
        a.dec(ecx)?;
        a.jnz(count)?;
        a.pause()?;
        a.jmp(spin)?;
        a.assemble(CODE_GPA)
    };
    build().map_err(asm_err)
}

/// The profiled task: `slices` times, enable the buffer (a store of its address to the
/// enable doorbell), write `records` 64-byte records into it, disable it. In per-CPU mode the
/// buffer is enabled once (and again when it moves) and disabled at the end. Every
/// `relocate_every` slices it moves `stride` bytes up.
pub struct PinLoop {
    /// Slices.
    pub slices: u64,
    /// Records written per slice.
    pub records: u64,
    /// Buffer bytes.
    pub buffer_bytes: u64,
    /// Distance between buffer generations.
    pub stride: u64,
    /// Move the buffer every N slices (0: never).
    pub relocate_every: u64,
    /// Disable/enable around every slice.
    pub per_task: bool,
}

/// Assembles the profiled-task payload.
pub fn pin_loop(p: &PinLoop) -> Result<Vec<u8>, KvmError> {
    let build = || -> Result<Vec<u8>, IcedError> {
        let mut a = CodeAssembler::new(64)?;
        a.mov(r15, PIN_DOORBELL_GPA)?;
        signal(&mut a, Signal::Start)?;
        read_tsc(&mut a, r12)?;
        a.xor(r13, r13)?; // slice
        a.mov(rbx, u64::MAX)?; // the enabled buffer (none yet)
        let mut slice = a.create_label();
        let mut write = a.create_label();
        a.set_label(&mut slice)?;
        // rsi = the buffer of this slice.
        if p.relocate_every == 0 {
            a.mov(rsi, DATA_GPA)?;
        } else {
            a.mov(rax, r13)?;
            a.xor(edx, edx)?;
            a.mov(rcx, p.relocate_every)?;
            a.div(rcx)?;
            a.mov(rcx, p.stride)?;
            a.imul_2(rax, rcx)?;
            a.mov(rsi, DATA_GPA)?;
            a.add(rsi, rax)?;
        }
        if p.per_task {
            a.mov(qword_ptr(r15), rsi)?;
        } else {
            // Enable only when the buffer changed (the first slice, a relocation).
            a.cmp(rsi, rbx)?;
            a.je(write)?;
            let mut first = a.create_label();
            a.cmp(rbx, -1i32)?;
            a.je(first)?;
            a.mov(qword_ptr(r15 + 8), rbx)?;
            a.set_label(&mut first)?;
            a.mov(qword_ptr(r15), rsi)?;
            a.mov(rbx, rsi)?;
        }
        a.set_label(&mut write)?;
        a.xor(r14, r14)?;
        let mut record = a.create_label();
        a.set_label(&mut record)?;
        a.mov(rax, r14)?;
        a.shl(rax, 6u32)?;
        a.xor(edx, edx)?;
        a.mov(rcx, p.buffer_bytes.max(64))?;
        a.div(rcx)?; // rdx = offset of this record in the ring buffer
        a.add(rdx, rsi)?;
        a.mov(qword_ptr(rdx), r14)?;
        a.inc(r14)?;
        a.cmp(r14, i32::try_from(p.records.max(1)).unwrap_or(i32::MAX))?;
        a.jb(record)?;
        if p.per_task {
            a.mov(qword_ptr(r15 + 8), rsi)?;
        }
        a.inc(r13)?;
        a.mov(rax, p.slices.max(1))?;
        a.cmp(r13, rax)?;
        a.jb(slice)?;
        if !p.per_task {
            a.mov(qword_ptr(r15 + 8), rbx)?;
        }
        finish(&mut a)?;
        a.assemble(CODE_GPA)
    };
    build().map_err(asm_err)
}

#[cfg(test)]
mod tests {
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    use super::*;

    fn mnemonics(code: &[u8]) -> Vec<Mnemonic> {
        let mut d = Decoder::with_ip(64, code, CODE_GPA, DecoderOptions::NONE);
        let mut out = Vec::new();
        while d.can_decode() {
            out.push(d.decode().mnemonic());
        }
        out
    }

    #[test]
    fn every_payload_assembles_and_signals_start_before_end() {
        let mut programs = vec![];
        for access in [Access::Read, Access::Write] {
            for touch in [Touch::FirstByte, Touch::WholePage] {
                programs.push(touch_loop(65536, 262_144, access, touch).unwrap());
            }
        }
        for kind in ExitKind::ALL {
            programs.push(exit_loop(kind, 20_000, Vendor::Amd).unwrap());
        }
        for code in programs {
            let m = mnemonics(&code);
            let outs: Vec<usize> = m
                .iter()
                .enumerate()
                .filter(|(_, x)| **x == Mnemonic::Out)
                .map(|(i, _)| i)
                .collect();
            assert!(outs.len() >= 2, "{m:?}");
            assert_eq!(m.iter().filter(|x| **x == Mnemonic::Rdtsc).count(), 2);
        }
    }

    #[test]
    fn the_hypercall_opcode_follows_the_vendor() {
        let amd = mnemonics(&exit_loop(ExitKind::Hypercall, 1, Vendor::Amd).unwrap());
        let intel = mnemonics(&exit_loop(ExitKind::Hypercall, 1, Vendor::Intel).unwrap());
        assert!(amd.contains(&Mnemonic::Vmmcall) && !amd.contains(&Mnemonic::Vmcall));
        assert!(intel.contains(&Mnemonic::Vmcall));
    }

    #[test]
    fn whole_page_writes_use_rep_stosq() {
        let m = mnemonics(&touch_loop(1, 4096, Access::Write, Touch::WholePage).unwrap());
        assert!(m.contains(&Mnemonic::Stosq));
    }
}
