//! `memslots` in the model: `kvm_set_memslot()`'s steps for each update, the grace periods
//! its `kvm_swap_active_memslots()` calls wait for run on the SRCU model ([`Srcu`]).
//!
//! What an update costs (virt/kvm/kvm_main.c, Linux 5.17 and later):
//! - `kvm_set_memslot()` on a delete or move first calls `kvm_invalidate_memslot()`: the
//!   inactive set gets an invalid copy of the slot (`kvm_replace_memslot()`), the sets are
//!   swapped (`kvm_swap_active_memslots()`: `synchronize_srcu_expedited()`), the old slot is
//!   replaced in the now-inactive set too, and its mappings are zapped
//!   (`kvm_arch_flush_shadow_memslot()`);
//! - then `kvm_create_memslot()` / `kvm_delete_memslot()` / `kvm_move_memslot()` edit the
//!   inactive set and `kvm_activate_memslot()` swaps again and repeats the edit.
//! - Each `kvm_replace_memslot()` walks the set's interval tree and its gfn rb-tree
//!   (`interval_tree_insert()`/`_remove()`, `kvm_insert_gfn_node()`): O(log n) in the slots.
//! - Before all that, `__kvm_set_memory_region()` looks the slot up by id (`id_to_memslot()`)
//!   in a hash table of 128 buckets (`DECLARE_HASHTABLE(id_hash, 7)` in `struct kvm_memslots`,
//!   sized for 512 slots): the bucket's chain holds n/128 slots, all walked when the id is
//!   absent (a create), half of them on average when it is present. O(n), with a small slope.
//!
//! Inputs: the profile's memslot ioctl (`ioctl_memslot_ns`, a create on a VM with one or two
//! slots, its one swap's grace period included), the SRCU hand-offs (`srcu_wakeup_ns` across CPUs, `srcu_local_handoff_ns` on the caller's CPU), and the
//! cost of visiting one slot in a chain or a tree (`memslot_node_ns`: a dependent load). The create's own work (its set edits and
//! `kvm_prepare_memory_region()`: the slot's arch metadata, x86's `kvm_alloc_memslot_metadata()`)
//! is the ioctl less the grace period the SRCU model gives it. A move prepares the new slot
//! the same way; a delete prepares nothing (`kvm_prepare_memory_region()` allocates only for a
//! create or a move) and frees, which the model does not price beyond its lookups and set edits.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::lifecycle::Srcu;
use crate::profile::{Profile, ProfileError};
use hvlab_core::memslots::{MemslotPlan, MemslotResult, SlotOp};

/// Tree walks per swap: `kvm_replace_memslot()` on each of the two sets, each through the
/// interval tree and the gfn rb-tree.
const WALKS_PER_SWAP: u64 = 4;

/// Buckets of a memslot set's id hash (`DECLARE_HASHTABLE(id_hash, 7)`).
const ID_HASH_BUCKETS: u64 = 1 << 7;

/// What the model reads from a profile.
#[derive(Debug, Clone)]
pub struct MemslotCosts {
    hz: u64,
    wakeup_ns: u64,
    /// A hand-off on the caller's CPU (the grace-period work's queue is per CPU).
    local_handoff_ns: u64,
    /// The create ioctl on a one- or two-slot VM, its grace period included.
    create_ns: u64,
    node_ns: u64,
}

impl MemslotCosts {
    /// Reads the costs; a profile without them cannot run the scenario.
    pub fn from_profile(p: &Profile) -> Result<MemslotCosts, ProfileError> {
        Ok(MemslotCosts {
            hz: p.ns("hz", "memslots")?.max(1),
            wakeup_ns: p.ns("srcu_wakeup_ns", "memslots")?,
            // A profile without it prices the hand-off as a wake-up across CPUs, as before.
            local_handoff_ns: match p.costs.contains_key("srcu_local_handoff_ns") {
                true => p.ns("srcu_local_handoff_ns", "memslots")?,
                false => p.ns("srcu_wakeup_ns", "memslots")?,
            },
            create_ns: p.ns("ioctl_memslot_ns", "memslots")?,
            node_ns: p.ns("memslot_node_ns", "memslots")?,
        })
    }
}

/// Levels of a balanced tree of `n` nodes (at least 1).
fn depth(n: u64) -> u64 {
    u64::from(u64::BITS - n.max(1).leading_zeros())
}

/// Slots `id_to_memslot()` visits in a set of `present` slots: the id's bucket chain, whole
/// when the id is absent, half on average when present (ids spread evenly over the buckets).
fn id_lookup_nodes(present: u64, found: bool) -> u64 {
    let chain = present / ID_HASH_BUCKETS;
    if found { chain.div_ceil(2) } else { chain }
}

/// Runs the plan's updates on a fresh VM: each update's `kvm_set_memslot()` work and its
/// swaps' grace periods, in order, on one SRCU.
pub fn run(costs: &MemslotCosts, plan: &MemslotPlan, seed: u64) -> MemslotResult {
    let jiffy = 1_000_000_000 / costs.hz;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let phase = rng.random_range(0..jiffy);
    let mut srcu = Srcu::new(jiffy, phase, costs.wakeup_ns, seed);
    srcu.set_local_handoff(costs.local_handoff_ns);
    // The create's own work besides its grace period and its set edits at one slot.
    let prepare_work = costs
        .create_ns
        .saturating_sub(srcu.idle_expedited_ns() + WALKS_PER_SWAP * costs.node_ns * depth(1));
    let swaps = plan.op.swaps();
    let n = u64::from(plan.slots);
    let mut now = 0u64;
    let mut op_ns = Vec::with_capacity(plan.slots as usize);
    for i in 0..n {
        // Slots present while this update edits the sets: an add grows the VM; a move or
        // delete starts from all of them (a delete shrinks it).
        let present = match plan.op {
            SlotOp::Add => i + 1,
            SlotOp::Move => n,
            SlotOp::Delete => n - i,
        };
        let start = now;
        // __kvm_set_memory_region(): the slot by id, among those there before this update.
        let before = if plan.op == SlotOp::Add { i } else { present };
        now += costs.node_ns * id_lookup_nodes(before, plan.op != SlotOp::Add);
        // kvm_prepare_memory_region(): what a create measured, on a create or a move.
        if plan.op != SlotOp::Delete {
            now += prepare_work;
        }
        for _ in 0..swaps {
            // kvm_replace_memslot() on both sets around kvm_swap_active_memslots().
            now += WALKS_PER_SWAP * costs.node_ns * depth(present);
            now += srcu.synchronize_expedited(now);
        }
        op_ns.push(now - start);
    }
    MemslotResult {
        op_ns,
        swaps_per_op: Some(swaps),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs() -> MemslotCosts {
        MemslotCosts {
            hz: 250,
            wakeup_ns: 12_000,
            local_handoff_ns: 3_000,
            create_ns: 38_000,
            node_ns: 5,
        }
    }

    fn plan(slots: u32, op: SlotOp) -> MemslotPlan {
        MemslotPlan {
            slots,
            slot_bytes: 2 << 20,
            op,
        }
    }

    #[test]
    fn a_create_on_a_small_vm_costs_what_the_profile_measured() {
        let r = run(&costs(), &plan(1, SlotOp::Add), 1);
        assert_eq!(r.op_ns, vec![38_000]);
        assert_eq!(r.swaps_per_op, Some(1));
    }

    #[test]
    fn a_move_prepares_like_a_create_and_waits_for_a_second_grace_period() {
        let c = costs();
        // One hand-off on the caller's CPU, two across CPUs.
        let gp = c.local_handoff_ns + 2 * c.wakeup_ns;
        let m = run(&c, &plan(1, SlotOp::Move), 1);
        assert_eq!(
            m.op_ns,
            vec![38_000 + gp + 4 * 5],
            "one more swap's edits and wait"
        );
        assert_eq!(m.swaps_per_op, Some(2));
        // A delete prepares nothing: two swaps' edits and waits only.
        let d = run(&c, &plan(1, SlotOp::Delete), 1);
        assert_eq!(d.op_ns, vec![2 * (gp + 4 * 5)]);
    }

    #[test]
    fn updates_grow_with_the_id_chain_and_the_tree_depth() {
        // 32k slots: a create walks the id's whole chain (32767 / 128 = 255 slots) and trees
        // 15 levels deeper than at one slot, 4 walks a swap, 5 ns a slot visited.
        let r = run(&costs(), &plan(32_768, SlotOp::Add), 1);
        assert_eq!(r.op_ns[0], 38_000);
        assert_eq!(*r.op_ns.last().unwrap(), 38_000 + 5 * 255 + 4 * 5 * 15);
        // A delete finds its id half way down a chain of 256, and swaps twice.
        let c = costs();
        let gp = c.local_handoff_ns + 2 * c.wakeup_ns;
        let d = run(&c, &plan(32_768, SlotOp::Delete), 1);
        assert_eq!(d.op_ns[0], 5 * 128 + 2 * (gp + 4 * 5 * 16));
        assert_eq!(*d.op_ns.last().unwrap(), 2 * (gp + 4 * 5));
    }
}
