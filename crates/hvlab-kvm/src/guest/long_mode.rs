//! Entering 64-bit mode directly: segment, control and flag registers for CPL0 or CPL3, so the
//! guest runs its first instruction in long mode with no boot code (which on PVM would be
//! emulated).

use kvm_bindings::{kvm_regs, kvm_segment, kvm_sregs};

use super::Cpl;
use super::layout::{CODE_GPA, GDT, GDT_GPA, PML4_GPA, STACK_TOP};

const CR0_PE: u64 = 1;
const CR0_MP: u64 = 1 << 1;
const CR0_ET: u64 = 1 << 4;
const CR0_NE: u64 = 1 << 5;
const CR0_WP: u64 = 1 << 16;
const CR0_PG: u64 = 1 << 31;
const CR4_PAE: u64 = 1 << 5;
const CR4_OSFXSR: u64 = 1 << 9;
const CR4_OSXMMEXCPT: u64 = 1 << 10;
const EFER_LME: u64 = 1 << 8;
const EFER_LMA: u64 = 1 << 10;
/// IOPL=3: `in`/`out` at CPL3 without a TSS I/O bitmap.
const RFLAGS_IOPL3: u64 = 3 << 12;
const RFLAGS_RESERVED: u64 = 1 << 1;

fn segment(selector: u16, code: bool, dpl: u8) -> kvm_segment {
    kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector,
        type_: if code { 0xb } else { 0x3 },
        present: 1,
        dpl,
        db: u8::from(!code),
        s: 1,
        l: u8::from(code),
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    }
}

/// Sets `sregs` for 64-bit mode at `cpl` with hvlab's GDT and page tables. The IDT is empty on
/// purpose: any exception becomes a triple fault, which the runner reports as a shutdown with
/// the registers, instead of a handler hiding it.
pub fn set_long_mode(sregs: &mut kvm_sregs, cpl: Cpl) {
    let dpl = cpl.level();
    let rpl = u16::from(dpl);
    let (cs, ds) = match cpl {
        Cpl::Zero => (0x08, 0x10),
        Cpl::Three => (0x18 | rpl, 0x20 | rpl),
    };
    sregs.cs = segment(cs, true, dpl);
    let data = segment(ds, false, dpl);
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.gdt.base = GDT_GPA;
    sregs.gdt.limit = u16::try_from(GDT.len() * 8 - 1).unwrap_or(u16::MAX);
    sregs.idt.base = 0;
    sregs.idt.limit = 0;
    sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
    sregs.cr3 = PML4_GPA;
    sregs.cr4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT;
    sregs.efer = EFER_LME | EFER_LMA;
}

/// Registers at entry: the payload's first instruction, the stack, IOPL=3, interrupts off.
pub fn entry_regs() -> kvm_regs {
    kvm_regs {
        rip: CODE_GPA,
        rsp: STACK_TOP,
        rflags: RFLAGS_RESERVED | RFLAGS_IOPL3,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpl3_segments_carry_rpl_and_dpl_3() {
        let mut s = kvm_sregs::default();
        set_long_mode(&mut s, Cpl::Three);
        assert_eq!((s.cs.selector, s.cs.dpl, s.cs.l), (0x1b, 3, 1));
        assert_eq!((s.ss.selector, s.ss.dpl, s.ss.db), (0x23, 3, 1));
        // The GDT entry the selector names has DPL 3 (bits 45-46).
        assert_eq!((GDT[usize::from(s.cs.selector >> 3)] >> 45) & 3, 3);
        assert_eq!((GDT[usize::from(s.ss.selector >> 3)] >> 45) & 3, 3);
        assert_ne!(s.efer & EFER_LMA, 0);
    }

    #[test]
    fn cpl0_segments_are_kernel_segments() {
        let mut s = kvm_sregs::default();
        set_long_mode(&mut s, Cpl::Zero);
        assert_eq!((s.cs.selector, s.cs.dpl), (0x08, 0));
        assert_eq!((GDT[1] >> 45) & 3, 0);
    }
}
