//! Guest payloads: hvlab's guests are its own code, not an OS.
//!
//! A payload is a few hundred bytes assembled with iced-x86, entered directly in 64-bit mode
//! at CPL3 or CPL0 (everything set through `KVM_SET_SREGS`, no boot code), with identity page
//! tables of 4 KiB or 2 MiB pages. On PVM hosts guest CPL0 is instruction-emulated at about a
//! million instructions a second while CPL3 runs natively, so measurement loops run at CPL3
//! with IOPL=3 for port I/O. The guest talks to the host through [`SIGNAL_PORT`]: `AL` says
//! what happened, other registers carry values.

pub mod layout;
pub mod long_mode;
pub mod payload;
pub mod runner;
pub mod watchdog;

pub use hvlab_core::guest::Cpl;
pub use watchdog::Watchdog;

/// The port a guest writes to signal the host.
pub const SIGNAL_PORT: u16 = 0x4b0;
/// The port measurement loops exit on (`out`/`in`).
pub const TEST_PORT: u16 = 0x4b1;
/// The byte the real-mode lifecycle payload writes.
pub const SIGNAL_MAGIC: u8 = 0x5a;
/// Guest-physical address of the real-mode lifecycle payload.
pub const ENTRY_GPA: u64 = 0x1000;

/// `mov dx, SIGNAL_PORT; mov al, SIGNAL_MAGIC; out dx, al; hlt` in 16-bit real mode: the
/// lifecycle scenario only needs the first `KVM_RUN` to reach guest code and come back.
pub fn signal_payload() -> Vec<u8> {
    let [lo, hi] = SIGNAL_PORT.to_le_bytes();
    vec![0xba, lo, hi, 0xb0, SIGNAL_MAGIC, 0xee, 0xf4]
}

/// What a long-mode payload says through `AL` on [`SIGNAL_PORT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The measured section begins.
    Start,
    /// The measured section ended; `RBX` holds the TSC ticks it took.
    End,
    /// The real-mode lifecycle payload reached guest code.
    Ready,
    /// A value the protocol does not define.
    Unknown(u8),
}

impl Signal {
    /// Decodes `AL`.
    pub fn from_al(al: u8) -> Signal {
        match al {
            1 => Signal::Start,
            2 => Signal::End,
            SIGNAL_MAGIC => Signal::Ready,
            other => Signal::Unknown(other),
        }
    }

    /// The `AL` value.
    pub fn al(self) -> u8 {
        match self {
            Signal::Start => 1,
            Signal::End => 2,
            Signal::Ready => SIGNAL_MAGIC,
            Signal::Unknown(v) => v,
        }
    }
}
