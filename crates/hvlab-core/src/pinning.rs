//! The pinning vocabulary and the pin manager both backends run: a context-switch trace to
//! replay under a pin policy, what it cost, and [`PinCache`], which decides when to pin.

use crate::error::BackendError;

/// When pins are taken and released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinPolicy {
    /// Pin on enable, unpin on disable.
    Eager,
    /// Never unpin (within the cap).
    Keep,
    /// Unpin what does not intersect a newly enabled buffer.
    Intersect,
    /// Unpin what was unused for this many ns.
    Aging(u64),
    /// Never pin: the buffer is mapped at stage 2 as the guest's SPE writes fault it in,
    /// and each fault is a blackout (model only).
    NoPin,
    /// Thread 000's newest revision: the buffer lives in guest_memfd, whose pages are neither
    /// migrated nor reclaimed, and its stage 2 is mapped once ahead of use with
    /// `KVM_PRE_FAULT_MEMORY`; an enable then pins nothing and walks nothing.
    GmemPrefault,
}

/// One trace to run.
#[derive(Debug, Clone, PartialEq)]
pub struct PinPlan {
    /// Buffer bytes.
    pub buffer_bytes: u64,
    /// Slices.
    pub slices: u32,
    /// Per-task (true) or per-CPU.
    pub per_task: bool,
    /// Pinned-bytes cap.
    pub cap_bytes: u64,
    /// Policy.
    pub policy: PinPolicy,
    /// Slice length, ns.
    pub slice_ns: u64,
    /// Gap between slices, ns.
    pub off_ns: u64,
    /// Relocate the buffer every N slices (0: never).
    pub relocate_every: u32,
    /// Idle tail, ns.
    pub tail_ns: u64,
    /// How the kvm backend pins.
    pub method: PinMethod,
    /// SPE records written per ms of profiling.
    pub records_per_ms: u64,
    /// no-pin: percent of the buffer's pages the host removes from stage 2 while the task is
    /// switched out (reclaim, compaction, NUMA balancing through MMU notifiers).
    pub unmap_pct: u32,
}

/// What one trace did.
#[derive(Debug, Clone, PartialEq)]
pub struct PinResult {
    /// Pin operations (a re-enable of a buffer still pinned is not one).
    pub pins: u64,
    /// Time pinning.
    pub pin_ns: u64,
    /// Time unpinning.
    pub unpin_ns: u64,
    /// Most bytes pinned.
    pub pinned_bytes_max: u64,
    /// Bytes pinned at the end.
    pub pinned_bytes_end: u64,
    /// Records lost to blackouts.
    pub blackout_records: u64,
    /// Time walking guest stage 1 (model: every enable walks, pinned or not).
    pub walk_ns: u64,
    /// Stage-2 faults on the buffer (no-pin), and the time they took.
    pub stage2_faults: u64,
    /// See `stage2_faults`.
    pub fault_ns: u64,
    /// gmem-prefault: `KVM_PRE_FAULT_MEMORY` calls (one per new buffer) and their time.
    pub prefaults: u64,
    /// See `prefaults`.
    pub prefault_ns: u64,
    /// Slices run.
    pub slices: u32,
    /// (ns, pinned bytes) at every change, for charts.
    pub timeline: Vec<(u64, u64)>,
}

/// How the kvm backend pins host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinMethod {
    /// `mlock`/`munlock`.
    Mlock,
    /// io_uring fixed-buffer registration (`pin_user_pages` in the kernel).
    IoUring,
}

/// Records SPE writes per ms of profiling by default (a 4 KiB page holds 64 records of 64
/// bytes; at the default sampling interval a busy task fills a few pages a millisecond).
pub const RECORDS_PER_MS: u64 = 100;

/// Records of 64 bytes per 4 KiB page.
pub const RECORDS_PER_PAGE: u64 = 64;

/// Takes and releases pins, real or modelled, and says how long each took.
pub trait Pinner {
    /// Pins `bytes` at guest address `addr`; `resident` when its pages were pinned before.
    fn pin(&mut self, addr: u64, bytes: u64, resident: bool) -> Result<u64, BackendError>;
    /// Releases that pin.
    fn unpin(&mut self, addr: u64, bytes: u64) -> Result<u64, BackendError>;
    /// Maps `bytes` at guest address `addr` at stage 2 ahead of use, pinning nothing
    /// (`KVM_PRE_FAULT_MEMORY` on guest_memfd memory).
    fn prefault(&mut self, addr: u64, bytes: u64) -> Result<u64, BackendError> {
        let _ = (addr, bytes);
        Err(BackendError::Unsupported(
            "this pin method cannot pre-fault stage 2 (gmem-prefault needs guest_memfd and KVM_PRE_FAULT_MEMORY)".into(),
        ))
    }
}

#[derive(Debug, Clone)]
struct Pin {
    addr: u64,
    bytes: u64,
    last_used: u64,
}

/// The pin manager under test: when to pin and unpin an enabled profiling buffer, for every
/// policy, under the cap (least recently used pins go first). Both backends run it: the model
/// with costed pins on a simulated clock, the kvm backend with real pins on the host clock.
/// Every operation takes `now` (ns) and returns the ns it spent.
#[derive(Debug)]
pub struct PinCache<P: Pinner> {
    pinner: P,
    policy: PinPolicy,
    cap_bytes: u64,
    buffer_bytes: u64,
    pins: Vec<Pin>,
    resident: Vec<u64>,
    out: PinResult,
}

impl<P: Pinner> PinCache<P> {
    /// An empty cache for `plan`.
    pub fn new(pinner: P, plan: &PinPlan) -> PinCache<P> {
        PinCache {
            pinner,
            policy: plan.policy,
            cap_bytes: plan.cap_bytes,
            buffer_bytes: plan.buffer_bytes,
            pins: Vec::new(),
            resident: Vec::new(),
            out: PinResult {
                pins: 0,
                pin_ns: 0,
                unpin_ns: 0,
                pinned_bytes_max: 0,
                pinned_bytes_end: 0,
                blackout_records: 0,
                walk_ns: 0,
                stage2_faults: 0,
                fault_ns: 0,
                prefaults: 0,
                prefault_ns: 0,
                slices: plan.slices,
                timeline: vec![(0, 0)],
            },
        }
    }

    fn pinned(&self) -> u64 {
        self.pins.iter().map(|p| p.bytes).sum()
    }

    fn record(&mut self, now: u64) {
        let pinned = self.pinned();
        self.out.pinned_bytes_max = self.out.pinned_bytes_max.max(pinned);
        self.out.timeline.push((now, pinned));
    }

    fn unpin_at(&mut self, index: usize, now: u64) -> Result<u64, BackendError> {
        let p = self.pins.remove(index);
        let ns = self.pinner.unpin(p.addr, p.bytes)?;
        self.out.unpin_ns += ns;
        self.record(now + ns);
        Ok(ns)
    }

    /// The aging timer: releases pins unused for the policy's age (except `keep`, in use).
    pub fn age(&mut self, now: u64, keep: Option<u64>) -> Result<u64, BackendError> {
        let PinPolicy::Aging(t) = self.policy else {
            return Ok(0);
        };
        let mut spent = 0;
        while let Some(i) = self
            .pins
            .iter()
            .position(|p| Some(p.addr) != keep && (now + spent).saturating_sub(p.last_used) >= t)
        {
            spent += self.unpin_at(i, now + spent)?;
        }
        Ok(spent)
    }

    /// When the next pin comes of age, for an idle aging timer.
    pub fn next_expiry(&self) -> Option<u64> {
        match self.policy {
            PinPolicy::Aging(t) => self.pins.iter().map(|p| p.last_used + t).min(),
            _ => None,
        }
    }

    /// The guest enables the buffer at `addr`: (pinned, ns spent). Not pinned means the buffer
    /// does not fit under the cap: a blackout.
    pub fn enable(&mut self, now: u64, addr: u64) -> Result<(bool, u64), BackendError> {
        let bytes = self.buffer_bytes;
        if self.policy == PinPolicy::NoPin {
            return Ok((false, 0));
        }
        if self.policy == PinPolicy::GmemPrefault {
            // Mapped once per buffer, then every enable finds it mapped.
            if self.resident.contains(&addr) {
                return Ok((true, 0));
            }
            let ns = self.pinner.prefault(addr, bytes)?;
            self.resident.push(addr);
            self.out.prefaults += 1;
            self.out.prefault_ns += ns;
            return Ok((true, ns));
        }
        let mut spent = self.age(now, Some(addr))?;
        if let Some(p) = self.pins.iter_mut().find(|p| p.addr == addr) {
            p.last_used = now + spent;
            return Ok((true, spent));
        }
        if self.policy == PinPolicy::Intersect {
            // Relocated buffers never overlap the old ones.
            while let Some(i) = self
                .pins
                .iter()
                .position(|p| p.addr + p.bytes <= addr || addr + bytes <= p.addr)
            {
                spent += self.unpin_at(i, now + spent)?;
            }
        }
        while self.pinned() + bytes > self.cap_bytes && !self.pins.is_empty() {
            let lru = self
                .pins
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.last_used)
                .map_or(0, |(i, _)| i);
            spent += self.unpin_at(lru, now + spent)?;
        }
        if bytes > self.cap_bytes {
            return Ok((false, spent));
        }
        let resident = self.resident.contains(&addr);
        let ns = self.pinner.pin(addr, bytes, resident)?;
        self.out.pins += 1;
        self.out.pin_ns += ns;
        spent += ns;
        if !resident {
            self.resident.push(addr);
        }
        self.pins.push(Pin {
            addr,
            bytes,
            last_used: now + spent,
        });
        self.record(now + spent);
        Ok((true, spent))
    }

    /// The guest disables the buffer at `addr`.
    pub fn disable(&mut self, now: u64, addr: u64) -> Result<u64, BackendError> {
        let Some(i) = self.pins.iter().position(|p| p.addr == addr) else {
            return Ok(0);
        };
        self.pins[i].last_used = now;
        if self.policy == PinPolicy::Eager {
            return self.unpin_at(i, now);
        }
        Ok(0)
    }

    /// Counts records that fell in a blackout.
    pub fn blackout(&mut self, records: u64) {
        self.out.blackout_records += records;
    }

    /// Adds time the model spent walking guest stage 1.
    pub fn walked(&mut self, ns: u64) {
        self.out.walk_ns += ns;
    }

    /// Adds stage-2 faults on the buffer and the time they took.
    pub fn faulted(&mut self, faults: u64, ns: u64) {
        self.out.stage2_faults += faults;
        self.out.fault_ns += ns;
    }

    /// Ends the trace at `now`, releasing nothing: what is pinned at the end is reported.
    pub fn finish(mut self, now: u64) -> (PinResult, P) {
        self.out.pinned_bytes_end = self.pinned();
        self.record(now);
        (self.out, self.pinner)
    }
}

/// The guest address of the buffer in `slice`: a new region every `relocate_every` slices.
pub fn buffer_addr(plan: &PinPlan, base: u64, slice: u32) -> u64 {
    let generation = slice.checked_div(plan.relocate_every).unwrap_or(0);
    base + u64::from(generation) * (plan.buffer_bytes + (2 << 20))
}
