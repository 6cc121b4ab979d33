//! The memslot-scaling vocabulary: many memslots added, moved or deleted one by one, and the
//! time each update took.
//!
//! Every `KVM_SET_USER_MEMORY_REGION` goes through `kvm_set_memslot()` (virt/kvm/kvm_main.c).
//! Since the memslot rework of Linux 5.17 a VM keeps two sets of slots, active and inactive,
//! each indexed by an interval tree and a gfn-ordered rb-tree: an update edits the inactive
//! set, makes it active with `kvm_swap_active_memslots()` (which waits for an expedited SRCU
//! grace period so no reader still sees the old set), then repeats the edit on the set that
//! just became inactive. Creating a slot swaps once; deleting or moving one first publishes an
//! invalid copy of the slot (`kvm_invalidate_memslot()`, a swap of its own) so no vCPU can
//! fault on it while its mappings are zapped, then swaps again. The KVM selftests'
//! `memslot_perf_test` and `memslot_modification_stress_test` exercise the same path.

/// The update applied to every slot in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotOp {
    /// `KVM_MR_CREATE`: add slot after slot.
    Add,
    /// `KVM_MR_MOVE`: move every slot (already present) to a free guest-physical range.
    Move,
    /// `KVM_MR_DELETE`: delete every slot (already present).
    Delete,
}

impl SlotOp {
    /// `kvm_swap_active_memslots()` calls one update of this kind makes (`kvm_set_memslot()`):
    /// one to publish the new set, and for a delete or move one more before it, to publish the
    /// invalid copy of the old slot (`kvm_invalidate_memslot()`).
    pub fn swaps(self) -> u32 {
        match self {
            SlotOp::Add => 1,
            SlotOp::Move | SlotOp::Delete => 2,
        }
    }

    /// The operation's name, as its variant is called.
    pub fn name(self) -> &'static str {
        match self {
            SlotOp::Add => "add",
            SlotOp::Move => "move",
            SlotOp::Delete => "delete",
        }
    }
}

/// One VM whose memslots are updated one by one.
#[derive(Debug, Clone, PartialEq)]
pub struct MemslotPlan {
    /// Memslots in the VM at the end of `Add`, or present before `Move`/`Delete`.
    pub slots: u32,
    /// Bytes of each slot (a multiple of 4 KiB); the memory is reserved, never touched.
    pub slot_bytes: u64,
    /// The update timed.
    pub op: SlotOp,
}

impl MemslotPlan {
    /// Guest-physical address of slot `i` (slots sit side by side from 4 GiB, out of the way
    /// of anything a VMM maps low), or where a move puts it (just above all of them).
    pub fn gpa(&self, i: u32, moved: bool) -> u64 {
        let base = 1u64 << 32;
        let shift = if moved { u64::from(self.slots) } else { 0 };
        base + (u64::from(i) + shift) * self.slot_bytes
    }

    /// Bytes of guest-physical space the plan spans, moves included.
    pub fn span_bytes(&self) -> u64 {
        2 * u64::from(self.slots) * self.slot_bytes
    }
}

/// What one VM's updates took.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MemslotResult {
    /// Host time of each update, in the order applied (ns).
    pub op_ns: Vec<u64>,
    /// `kvm_swap_active_memslots()` calls per update, where the backend counts them (the
    /// model; the kvm backend cannot see them and leaves this `None`).
    pub swaps_per_op: Option<u32>,
}
