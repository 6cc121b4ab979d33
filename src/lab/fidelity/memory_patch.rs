//! Predictions of memory patches: thread 004's SPTE prefetch in a patched kernel, the model's
//! `pf_fixed` against what a kab measured (docs/ARCHITECTURE.md, "Fidelity" and "Kernels
//! under test").
//!
//! A patch is recognised from its text: the revert of 004's trailing prefetch (the
//! `if (start) direct_pte_prefetch_many(...)` after the loop of `__direct_pte_prefetch()`
//! removed, or restored), and a change of `PTE_PREFETCH_NUM`. Each maps to the memory model's
//! loop ([`PrefetchLoop::Legacy`] or [`PrefetchLoop::LegacySkipTrailing`]) and block size.
//! The prediction is counts only: every input is the kernel's code (the loop, the constant),
//! the scenario's guest layout and the run's parameters; no profile value is read, so nothing
//! can have been fitted on the patched runs.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Agreement, Judged, judge_against_samples};
use crate::analysis::statistics::median;
use crate::analysis::validate::{Check, Rule};
use crate::kernel::patch::PatchFile;
use crate::model::memory::{Mmu, PTE_PREFETCH_NUM, PTE_PREFETCH_NUM_MAX, Pass, pass};
use crate::record::{RunRecord, pooled};
use crate::scenario::Kind;
use crate::scenario::memory::{Memory, PARAMS};
use hvlab_core::BackendKind;
use hvlab_core::guest::{Backing, GuestPage};
use hvlab_core::memory::{HostBacking, Pattern, PrefetchLoop, Stage2Mmu, TouchPlan};

/// The thread whose mechanism these patches change.
pub const THREAD: &str = "004";

/// The file that holds the prefetch.
const MMU_C: &str = "arch/x86/kvm/mmu/mmu.c";

/// The statistic predicted.
pub const PF_FIXED: &str = "kvm.vcpu.pf_fixed";

/// How a kernel's legacy (direct) MMU prefetches: `__direct_pte_prefetch()`'s loop and
/// `PTE_PREFETCH_NUM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefetch {
    /// Whether the run reaching the end of the block is prefetched (thread 004's fix).
    pub trailing: bool,
    /// `PTE_PREFETCH_NUM`.
    pub num: usize,
}

impl Prefetch {
    /// Every kernel hvlab boots (6.x, 7.x) postdates the 2021 fix: 7.3's mmu.c flushes the
    /// trailing run, with `#define PTE_PREFETCH_NUM 8`.
    pub const STOCK: Prefetch = Prefetch {
        trailing: true,
        num: PTE_PREFETCH_NUM,
    };

    /// Its name, as `kab --model-strategy` takes it: `legacy` or `legacy-skip-trailing`, with
    /// `:N` when `PTE_PREFETCH_NUM` is not 8.
    pub fn name(self) -> String {
        let base = if self.trailing {
            "legacy"
        } else {
            "legacy-skip-trailing"
        };
        if self.num == PTE_PREFETCH_NUM {
            base.to_string()
        } else {
            format!("{base}:{}", self.num)
        }
    }

    /// The strategy called `name`, if it is one.
    pub fn named(name: &str) -> Option<Prefetch> {
        let (base, num) = match name.split_once(':') {
            Some((b, n)) => (b, n.parse::<usize>().ok().filter(|n| valid_num(*n))?),
            None => (name, PTE_PREFETCH_NUM),
        };
        let trailing = match base {
            "legacy" => true,
            "legacy-skip-trailing" => false,
            _ => return None,
        };
        Some(Prefetch { trailing, num })
    }

    /// The model's loop.
    pub fn prefetch_loop(self) -> PrefetchLoop {
        if self.trailing {
            PrefetchLoop::Legacy
        } else {
            PrefetchLoop::LegacySkipTrailing
        }
    }
}

/// A block the kernel can walk: it masks SPTE indices with `PTE_PREFETCH_NUM - 1` within one
/// page table of 512 SPTEs.
fn valid_num(n: usize) -> bool {
    n.is_power_of_two() && n <= PTE_PREFETCH_NUM_MAX
}

/// The strategy the memory model runs for one side of a kab, and why that one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PrefetchChoice {
    /// Its name ([`Prefetch::name`]).
    pub name: String,
    /// Where it comes from: the stock kernel, the patch's hunks, the user's declaration.
    pub from: String,
}

impl PrefetchChoice {
    /// The strategy itself (the stock one for a name that is not a strategy).
    pub fn prefetch(&self) -> Prefetch {
        Prefetch::named(&self.name).unwrap_or(Prefetch::STOCK)
    }
}

/// Why the memory model predicts nothing for a side of a kab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error, displaydoc::Display)]
#[serde(tag = "reason", rename_all = "kebab-case")]
pub enum NoPrediction {
    /// {patch} changes {file}, which the memory model does not mirror; declare the change's prefetch with kab --model-strategy (legacy, legacy-skip-trailing, or either with :N for PTE_PREFETCH_NUM N)
    OtherFile {
        /// The patch.
        patch: String,
        /// The file it changes.
        file: String,
    },
    /// {patch} changes mmu.c beyond the prefetch ({hunk}); declare what it does to the prefetch with kab --model-strategy
    OtherHunk {
        /// The patch.
        patch: String,
        /// The hunk's header.
        hunk: String,
    },
    /// {patch} sets PTE_PREFETCH_NUM to {value}: the kernel masks SPTE indices with PTE_PREFETCH_NUM - 1 within a page table, so it must be a power of two from 1 to 512; fix the patch
    BadPrefetchNum {
        /// The patch.
        patch: String,
        /// The value it sets.
        value: String,
    },
    /// {patch} changes neither __direct_pte_prefetch()'s trailing run nor PTE_PREFETCH_NUM; declare its prefetch with kab --model-strategy if it changes the prefetch another way
    NoPrefetchChange {
        /// The patch.
        patch: String,
    },
    /// the declared strategy {name} is not one of the memory model's: legacy, legacy-skip-trailing, or either with :N (N a power of two up to 512)
    UnknownDeclared {
        /// The name declared.
        name: String,
    },
    /// patch {patch} cannot be read again to recognise it ({why}); keep the patch where kab was given it
    Unreadable {
        /// The patch.
        patch: String,
        /// The error.
        why: String,
    },
}

/// One hunk's changed lines, trimmed, blank ones left out.
struct HunkLines {
    header: String,
    removed: Vec<String>,
    added: Vec<String>,
}

/// The hunks of a file diff's own text.
fn hunks(text: &str) -> Vec<HunkLines> {
    let mut out: Vec<HunkLines> = Vec::new();
    for line in text.lines() {
        if line.starts_with("@@") {
            out.push(HunkLines {
                header: line.to_string(),
                removed: Vec::new(),
                added: Vec::new(),
            });
            continue;
        }
        let Some(h) = out.last_mut() else { continue };
        let (list, rest) = match line.as_bytes().first() {
            Some(b'-') => (&mut h.removed, &line[1..]),
            Some(b'+') => (&mut h.added, &line[1..]),
            _ => continue,
        };
        let rest = rest.trim();
        if !rest.is_empty() {
            list.push(rest.to_string());
        }
    }
    out
}

/// Takes the `#define PTE_PREFETCH_NUM N` out of `lines`, returning N as written.
fn take_define(lines: &mut Vec<String>) -> Option<String> {
    let i = lines.iter().position(|l| {
        l.split_whitespace().take(2).collect::<Vec<_>>() == ["#define", "PTE_PREFETCH_NUM"]
    })?;
    let value = lines
        .remove(i)
        .split_whitespace()
        .nth(2)
        .unwrap_or("")
        .to_string();
    Some(value)
}

/// Takes the trailing flush (`if (start)` then `direct_pte_prefetch_many(...)`) out of
/// `lines`; whether it was there.
fn take_trailing_flush(lines: &mut Vec<String>) -> bool {
    let at = lines.windows(2).position(|w| {
        w[0].replace(' ', "") == "if(start)" && w[1].starts_with("direct_pte_prefetch_many(")
    });
    if let Some(i) = at {
        lines.drain(i..i + 2);
    }
    at.is_some()
}

/// What `file` makes of a kernel that prefetched as `from`: each of its hunks must be 004's
/// trailing flush (removed or restored, with the loop's `return`/`break` that goes with it)
/// or `PTE_PREFETCH_NUM`'s definition.
pub fn recognise(file: &PatchFile, from: Prefetch) -> Result<Prefetch, NoPrediction> {
    let name = file.name();
    let mut now = from;
    let mut changed = false;
    for diff in file.patches.iter().flat_map(|p| &p.files) {
        if diff.target() != MMU_C {
            return Err(NoPrediction::OtherFile {
                patch: name,
                file: diff.target().to_string(),
            });
        }
        for mut h in hunks(&diff.text) {
            if let (Some(old), Some(new)) = (take_define(&mut h.removed), take_define(&mut h.added))
            {
                let n = new.parse::<usize>().ok().filter(|n| valid_num(*n));
                let Some(n) = n else {
                    return Err(NoPrediction::BadPrefetchNum {
                        patch: name,
                        value: new,
                    });
                };
                changed |= old != new;
                now.num = n;
            }
            match (
                take_trailing_flush(&mut h.removed),
                take_trailing_flush(&mut h.added),
            ) {
                (true, false) => (now.trailing, changed) = (false, true),
                (false, true) => (now.trailing, changed) = (true, true),
                _ => {}
            }
            // The fix turned the loop's `break` into `return` (nothing follows the loop
            // without the flush): that swap alone changes no prefetch.
            let swap = |l: &String| l == "return;" || l == "break;";
            if !(h.removed.iter().all(swap) && h.added.iter().all(swap)) {
                return Err(NoPrediction::OtherHunk {
                    patch: name,
                    hunk: h.header,
                });
            }
        }
    }
    if changed {
        Ok(now)
    } else {
        Err(NoPrediction::NoPrefetchChange { patch: name })
    }
}

/// The strategy of a kernel built with `patches` (in order), or the one `declared` for its
/// change.
pub fn strategy_for(
    patches: &[PatchFile],
    declared: Option<&str>,
) -> Result<PrefetchChoice, NoPrediction> {
    if let Some(name) = declared {
        let p = Prefetch::named(name).ok_or_else(|| NoPrediction::UnknownDeclared {
            name: name.to_string(),
        })?;
        return Ok(PrefetchChoice {
            name: p.name(),
            from: "declared with kab --model-strategy".into(),
        });
    }
    let mut now = Prefetch::STOCK;
    let mut how = Vec::new();
    for file in patches {
        let next = recognise(file, now)?;
        how.push(format!("{} ({})", file.name(), change_words(now, next)));
        now = next;
    }
    Ok(PrefetchChoice {
        name: now.name(),
        from: if how.is_empty() {
            "the stock kernel: __direct_pte_prefetch() flushes the trailing run (thread 004's fix), PTE_PREFETCH_NUM 8".into()
        } else {
            format!("recognised from the hunks of {}", how.join(", "))
        },
    })
}

/// A recognised change in words.
fn change_words(from: Prefetch, to: Prefetch) -> String {
    let mut parts = Vec::new();
    if from.trailing != to.trailing {
        parts.push(if to.trailing {
            "restores the trailing prefetch of thread 004"
        } else {
            "reverts the trailing prefetch of thread 004"
        });
    }
    let num = format!("PTE_PREFETCH_NUM {} → {}", from.num, to.num);
    if from.num != to.num {
        parts.push(&num);
    }
    parts.join(", ")
}

/// Why a count cannot be predicted for a setup.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, displaydoc::Display)]
pub enum SetupError {
    /// {0} vCPUs touch their slices in a layout of their own that the prediction does not mirror; predict with vcpus=1
    Vcpus(u32),
    /// the memory model cannot run this pass: {0}
    Pass(String),
    /// the run's parameters do not parse as the memory scenario's: {0}
    Params(String),
}

/// The guest-physical layout hvlab's kvm guest builds (the core's addresses, which
/// hvlab-kvm's `guest::layout` writes), in 4 KiB frames of the system memslot at GPA 0.
mod layout {
    use hvlab_core::guest::{
        CODE_GPA, DATA_PD_GPA, INDEX_GPA, PD0_GPA, PDPT_GPA, PML4_GPA, STACK_TOP,
    };

    // Every address below lies under 2 MiB, so a frame number fits any usize.
    const _: () = assert!(INDEX_GPA < 2 << 20);

    /// The frame holding `gpa`.
    #[allow(clippy::cast_possible_truncation)] // below 2 MiB: asserted above
    const fn frame(gpa: u64) -> usize {
        (gpa / 4096) as usize
    }

    /// PML4, PDPT and the PD of GiB 0: the first fetch of the code walks them, in order.
    pub const WALK: [usize; 3] = [frame(PML4_GPA), frame(PDPT_GPA), frame(PD0_GPA)];
    /// The data region's PDs, one per GiB, from here.
    pub const DATA_PD: usize = frame(DATA_PD_GPA);
    /// The code's first frame, and the stack's top frame (it grows down from `STACK_TOP`).
    pub const CODE: usize = frame(CODE_GPA);
    pub const STACK: usize = frame(STACK_TOP) - 1;
    /// The touch-order array (u32 page indices), then the data region's 4 KiB page tables.
    pub const INDEX: usize = frame(INDEX_GPA);
    /// 4 KiB pages per 2 MiB, and per GiB.
    pub const PER_PT: usize = 512;
    pub const PER_PD: usize = 512 * 512;
}

/// Stage-2 faults on the guest's own page tables during the pass: the data region's PD of
/// each GiB and, with 4 KiB guest pages, its PT of each 2 MiB, first read by the guest's page
/// walk. They lie in the system memslot, populated, so the legacy MMU's prefetch maps them
/// when a fault near them came first: the walk of the code (PML4, PDPT, PD 0), the code,
/// the stack, and the touch-order array the guest reads before the pass.
fn table_faults(plan: &TouchPlan, order: &[u32], lp: PrefetchLoop, num: usize) -> u64 {
    let pages = usize::try_from(plan.size_bytes / 4096).unwrap_or(usize::MAX);
    let index_pages = (order.len() * 4).div_ceil(4096);
    let pt = layout::INDEX + index_pages;
    let pts = if plan.guest_page == GuestPage::Small {
        pages.div_ceil(layout::PER_PT)
    } else {
        0
    };
    let slot = (pt + pts).next_multiple_of(layout::PER_PT);
    let mut m = Mmu::new(slot, HostBacking::Anonymous(Backing::Populated), lp, false)
        .with_prefetch_num(num);
    let before = layout::WALK
        .into_iter()
        .chain([layout::CODE, layout::STACK])
        .chain(layout::INDEX..pt);
    for g in before {
        m.access(g);
    }
    let start = m.counts.faults;
    for &p in order {
        let p = p as usize;
        m.access(layout::DATA_PD + p / layout::PER_PD);
        if pts > 0 {
            m.access(pt + p / layout::PER_PT);
        }
    }
    m.counts.faults - start
}

/// The loop a stage-2 MMU runs for a kernel prefetching as `prefetch`: none on the TDP MMU;
/// shadow paging with 4 KiB guest pages none either (`FNAME(prefetch_invalid_gpte)` skips
/// the neighbours' guest PTEs, which a fresh guest has not made Accessed).
fn loop_of(mmu: Stage2Mmu, prefetch: Prefetch, guest: GuestPage) -> PrefetchLoop {
    match (mmu, guest) {
        (Stage2Mmu::TdpMmu, _) | (Stage2Mmu::Shadow, GuestPage::Small) => PrefetchLoop::None,
        _ => prefetch.prefetch_loop(),
    }
}

/// `kvm.vcpu.pf_fixed` of one pass of `plan` in hvlab's kvm guest, on a kernel prefetching as
/// `prefetch` whose stage 2 is `mmu`: the data region's faults (the memory model) and, with
/// EPT/NPT, the guest's page tables' ([`table_faults`]).
pub fn pf_fixed(plan: &TouchPlan, mmu: Stage2Mmu, prefetch: Prefetch) -> Result<u64, SetupError> {
    if plan.vcpus > 1 {
        return Err(SetupError::Vcpus(plan.vcpus));
    }
    let lp = loop_of(mmu, prefetch, plan.guest_page);
    let (data, _) = pass(&Pass {
        pages: plan.size_bytes / 4096,
        pattern: plan.pattern,
        seed: plan.seed,
        host: plan.backing,
        prefetch: lp,
        guest_huge: plan.guest_page == GuestPage::Huge,
        prefetch_num: prefetch.num,
    })
    .map_err(|e| SetupError::Pass(e.to_string()))?;
    let tables = if mmu == Stage2Mmu::Shadow {
        0
    } else {
        table_faults(plan, &plan.page_order(), lp, prefetch.num)
    };
    Ok(data.faults + tables)
}

/// The plans of `variants` as a stored memory run of `params` ran them (its seed too).
pub fn plans_of_run(
    run: &RunRecord,
    variants: &[&str],
) -> Result<Vec<(String, TouchPlan)>, SetupError> {
    let sets: Vec<String> = run
        .params
        .iter()
        .filter(|(k, _)| PARAMS.iter().any(|p| p.name == k.as_str() && !p.model_only))
        .filter_map(|(k, v)| {
            let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            (!text.is_empty()).then(|| format!("{k}={text}"))
        })
        .collect();
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    let mut plans = crate::scenario::plans_of(&Memory, &sets, variants, BackendKind::Model)
        .map_err(|e| SetupError::Params(e.to_string()))?;
    if let Some(seed) = run.params.get("seed").and_then(serde_json::Value::as_u64) {
        for (_, p) in &mut plans {
            p.seed = seed;
        }
    }
    Ok(plans)
}

/// One variant's `pf_fixed` as the model predicts it on one stage-2 MMU, A and B, beside
/// what the kab measured there when that MMU is the one its boots ran.
#[derive(Debug, Clone, Serialize)]
pub struct VariantPfFixed {
    /// The variant.
    pub variant: String,
    /// The stage-2 MMU.
    pub mmu: Stage2Mmu,
    /// Predicted, A and B.
    pub pf_fixed: [u64; 2],
    /// Measured (median), A and B, on the MMU the boots ran.
    pub measured: [Option<f64>; 2],
}

/// The prediction on the host where thread 004 measured the change.
#[derive(Debug, Clone, Serialize)]
pub struct ReportersHost {
    /// Its setup.
    pub setup: &'static str,
    /// Predicted, A and B.
    pub pf_fixed: [u64; 2],
    /// What the thread measured, for each side whose strategy is one the thread ran.
    pub thread: [Option<&'static str>; 2],
}

/// The memory model's prediction of the change a kab measured. Every figure here is
/// predicted, none measured, except `measured` beside it.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryPrediction {
    /// `predicted`.
    pub label: &'static str,
    /// The strategy of A and of B.
    pub strategies: [Option<PrefetchChoice>; 2],
    /// Why a side has none (then nothing is predicted).
    pub unknown: Vec<NoPrediction>,
    /// On this host: per variant, the TDP MMU and the legacy MMU (and shadow paging when the
    /// boots ran it).
    pub this_host: Vec<VariantPfFixed>,
    /// Why there is nothing for this host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub this_host_missing: Option<String>,
    /// On thread 004's host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reporters_host: Option<ReportersHost>,
}

/// Thread 004's setup: the first byte of every 4 KiB page of 6 GiB of preallocated memory, on
/// the legacy direct MMU (Sean's numbers in the seed).
pub const REPORTERS_SETUP: &str = "thread 004's host: first byte of each 4 KiB page of 6 GiB, VM of 8 GiB preallocated, legacy MMU";

/// `pf_fixed` on thread 004's host for a kernel prefetching as `p`.
fn on_reporters_host(p: Prefetch) -> Result<u64, SetupError> {
    let (c, _) = pass(&Pass {
        pages: (6 << 30) / 4096,
        pattern: Pattern::Seq,
        seed: 1,
        host: HostBacking::Anonymous(Backing::Populated),
        prefetch: p.prefetch_loop(),
        guest_huge: false,
        prefetch_num: p.num,
    })
    .map_err(|e| SetupError::Pass(e.to_string()))?;
    Ok(c.faults)
}

/// What the thread measured for a kernel prefetching as `p`, when it ran that kernel.
fn thread_said(p: Prefetch) -> Option<&'static str> {
    match (p.trailing, p.num) {
        (true, PTE_PREFETCH_NUM) => Some("< 0.27M with the fix"),
        (false, PTE_PREFETCH_NUM) => Some("~1.75M before the fix"),
        _ => None,
    }
}

/// The stage-2 MMUs predicted: the TDP MMU (no prefetch) and the legacy one (prefetch), and
/// shadow paging when that is what `ran`.
fn mmus(ran: Option<Stage2Mmu>) -> Vec<Stage2Mmu> {
    let mut out = vec![Stage2Mmu::TdpMmu, Stage2Mmu::TdpLegacy];
    if ran == Some(Stage2Mmu::Shadow) {
        out.push(Stage2Mmu::Shadow);
    }
    out
}

/// The model's prediction of a memory kab: each side's strategy, `pf_fixed` per variant on
/// this host (the setup of the runs `sides` brought back, A's then B's) and on thread 004's.
pub fn predict(
    strategies: [Result<PrefetchChoice, NoPrediction>; 2],
    sides: [&[&RunRecord]; 2],
) -> MemoryPrediction {
    let mut out = MemoryPrediction {
        label: "predicted",
        strategies: [None, None],
        unknown: Vec::new(),
        this_host: Vec::new(),
        this_host_missing: None,
        reporters_host: None,
    };
    let [a, b] = strategies;
    for (i, s) in [a, b].into_iter().enumerate() {
        match s {
            Ok(c) => out.strategies[i] = Some(c),
            Err(why) => out.unknown.push(why),
        }
    }
    let (Some(sa), Some(sb)) = (&out.strategies[0], &out.strategies[1]) else {
        return out;
    };
    let p = [sa.prefetch(), sb.prefetch()];
    out.reporters_host = match (on_reporters_host(p[0]), on_reporters_host(p[1])) {
        (Ok(x), Ok(y)) => Some(ReportersHost {
            setup: REPORTERS_SETUP,
            pf_fixed: [x, y],
            thread: p.map(thread_said),
        }),
        _ => None,
    };
    match this_host(p, sides) {
        Ok(v) => out.this_host = v,
        Err(why) => out.this_host_missing = Some(why),
    }
    out
}

/// `pf_fixed` per variant and MMU on this host, for strategies `p`.
fn this_host(p: [Prefetch; 2], sides: [&[&RunRecord]; 2]) -> Result<Vec<VariantPfFixed>, String> {
    let Some(run) = sides[0].first().or(sides[1].first()) else {
        return Err("neither side brought back a memory run".into());
    };
    let ran: [Option<Stage2Mmu>; 2] = sides.map(|s| s.first().and_then(|r| Stage2Mmu::of(&r.host)));
    let variants: Vec<&str> = run.variants.iter().map(|v| v.name.as_str()).collect();
    let plans = plans_of_run(run, &variants).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for (name, plan) in &plans {
        for mmu in mmus(ran[0].or(ran[1])) {
            let predicted = [pf_fixed(plan, mmu, p[0]), pf_fixed(plan, mmu, p[1])];
            let [Ok(x), Ok(y)] = predicted else {
                let why = predicted.into_iter().find_map(Result::err);
                return Err(why.map_or_else(String::new, |e| e.to_string()));
            };
            let measured = [0, 1].map(|i| {
                let samples = pooled(sides[i], name, PF_FIXED);
                (ran[i] == Some(mmu) && !samples.is_empty()).then(|| median(&samples))
            });
            out.push(VariantPfFixed {
                variant: name.clone(),
                mmu,
                pf_fixed: [x, y],
                measured,
            });
        }
    }
    Ok(out)
}

/// The MMU in words, as the output names it.
pub fn mmu_words(mmu: Stage2Mmu) -> &'static str {
    match mmu {
        Stage2Mmu::TdpMmu => "TDP MMU",
        Stage2Mmu::TdpLegacy => "legacy MMU",
        Stage2Mmu::Shadow => "shadow paging",
    }
}

/// One variant of one kab side, the model's `pf_fixed` against the kernel's.
#[derive(Debug, Clone, Serialize)]
pub struct MemoryRow {
    /// The kab.
    pub kab: String,
    /// `A` or `B`.
    pub side: String,
    /// `uname -r`.
    pub release: String,
    /// The change: `none (stock)` or the patches.
    pub change: String,
    /// The strategy the model ran.
    pub strategy: String,
    /// The stage-2 MMU the boots ran.
    pub mmu: Stage2Mmu,
    /// The variant.
    pub variant: String,
    /// `pf_fixed`: exact.
    pub pf_fixed: Check,
    /// Within when the count is the kernel's exactly.
    #[serde(flatten)]
    pub agreement: Agreement,
}

/// Every memory row the stored kabs allow.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MemoryReport {
    /// Rows.
    pub rows: Vec<MemoryRow>,
    /// Kab sides left out, with the reason.
    pub skipped: Vec<super::patch::Skipped>,
}

impl Judged for MemoryReport {
    fn agreements(&self) -> impl Iterator<Item = &Agreement> {
        self.rows.iter().map(|r| &r.agreement)
    }
}

/// The kab side of a user's kvm memory run booted by a kab.
fn kab_side(run: &RunRecord) -> Option<&hvlab_core::host::KabSide> {
    (run.backend == BackendKind::Kvm
        && Kind::of_run(run) == Some(Kind::Memory)
        && run.tag.is_none())
    .then_some(())?;
    run.host.under_test.as_ref()?.kab.as_ref()
}

/// Memory rows from stored runs: each kab side's variants on the MMU its boots ran, the model
/// running the strategy the kab recorded for that side.
pub fn from_runs(runs: &[RunRecord]) -> MemoryReport {
    let mut report = MemoryReport::default();
    let mut by_side: BTreeMap<(&str, &str), Vec<&RunRecord>> = BTreeMap::new();
    for run in runs.iter().filter(|r| r.produced_samples()) {
        if let Some(k) = kab_side(run) {
            by_side.entry((&k.id, &k.side)).or_default().push(run);
        }
    }
    for ((id, side), side_runs) in by_side {
        let skip = |why: String| super::patch::Skipped::of(id, Some(side), why);
        let Some(first) = side_runs.first() else {
            continue;
        };
        let Some(u) = first.host.under_test.as_ref() else {
            continue;
        };
        let Some(kab) = u.kab.as_ref() else { continue };
        let Some(p) = kab.memory_strategy.as_deref().and_then(Prefetch::named) else {
            report.skipped.push(skip(
                "the kab recorded no memory strategy for this side (stored before hvlab recognised memory patches, or its patch is not one the model knows); run the kab again, with --model-strategy if needed".into(),
            ));
            continue;
        };
        let Some(mmu) = Stage2Mmu::of(&first.host) else {
            report.skipped.push(skip(
                "the runs do not say which stage-2 MMU the guest's KVM used".into(),
            ));
            continue;
        };
        let names: Vec<&str> = first
            .variants
            .iter()
            .filter(|v| v.is_ok())
            .map(|v| v.name.as_str())
            .collect();
        let plans = match plans_of_run(first, &names) {
            Ok(p) => p,
            Err(e) => {
                report.skipped.push(skip(e.to_string()));
                continue;
            }
        };
        let change = super::patch::change_words(&kab.patches, |p| p.file.clone());
        for (variant, plan) in &plans {
            let measured = pooled(&side_runs, variant, PF_FIXED);
            if measured.is_empty() {
                continue;
            }
            let predicted = match pf_fixed(plan, mmu, p) {
                Ok(x) => x,
                Err(e) => {
                    report.skipped.push(skip(format!("{variant}: {e}")));
                    continue;
                }
            };
            let check = judge_against_samples(
                Kind::Memory.name(),
                variant,
                PF_FIXED,
                "count",
                predicted as f64,
                &measured,
                Rule::Exact(0.0),
            );
            let agreement = if check.pass && measured.iter().all(|x| *x == predicted as f64) {
                Agreement::Within
            } else {
                Agreement::Outside
            };
            report.rows.push(MemoryRow {
                kab: id.to_string(),
                side: side.to_string(),
                release: u.release.clone(),
                change: change.clone(),
                strategy: p.name(),
                mmu,
                variant: variant.clone(),
                pf_fixed: check,
                agreement,
            });
        }
    }
    report
}

/// Memory rows from the kvm memory runs in `store` that a kab booted.
pub fn evaluate(store: &crate::store::Store) -> Result<MemoryReport, crate::lab::Error> {
    let mut runs = Vec::new();
    for l in store.list(usize::MAX)?.iter().filter(|l| {
        l.backend == BackendKind::Kvm
            && Kind::named(&l.scenario).ok() == Some(Kind::Memory)
            && l.is_users()
    }) {
        let run = store.load(&l.run_id)?;
        if kab_side(&run).is_some() {
            runs.push(run);
        }
    }
    Ok(from_runs(&runs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn patch(name: &str) -> PatchFile {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/patches")
            .join(name);
        PatchFile::read(&path).expect("a test patch")
    }

    fn text_patch(name: &str, text: &str) -> PatchFile {
        PatchFile {
            path: name.into(),
            sha256: String::new(),
            patches: crate::kernel::patch::parse(Path::new(name), text).expect("a diff"),
        }
    }

    const SKIP: Prefetch = Prefetch {
        trailing: false,
        num: 8,
    };

    #[test]
    fn the_revert_and_a_prefetch_block_change_are_recognised_from_their_hunks() {
        let revert = patch("004-revert-trailing-prefetch.patch");
        assert_eq!(recognise(&revert, Prefetch::STOCK), Ok(SKIP));
        let sixteen = patch("004-pte-prefetch-16.patch");
        assert_eq!(
            recognise(&sixteen, Prefetch::STOCK),
            Ok(Prefetch {
                trailing: true,
                num: 16
            })
        );
        // Both, in order: the name says both.
        let both = strategy_for(&[revert, sixteen], None).expect("known");
        assert_eq!(both.name, "legacy-skip-trailing:16");
        assert!(
            both.from.contains("reverts the trailing prefetch"),
            "{}",
            both.from
        );
        assert!(
            both.from.contains("PTE_PREFETCH_NUM 8 → 16"),
            "{}",
            both.from
        );
        assert_eq!(strategy_for(&[], None).map(|c| c.name), Ok("legacy".into()));
    }

    /// Thread 004's own diff (the fix, from the seed, whose blank lines the archive lost)
    /// restores the trailing flush on a kernel
    /// without it.
    #[test]
    fn the_thread_s_fix_restores_the_trailing_prefetch() {
        let fix = "--- a/arch/x86/kvm/mmu/mmu.c\n+++ b/arch/x86/kvm/mmu/mmu.c\n@@ -2818,9 +2818,11 @@ static void __direct_pte_prefetch(struct kvm_vcpu *vcpu,\n \t\t\tif (!start)\n \t\t\t\tcontinue;\n \t\t\tif (direct_pte_prefetch_many(vcpu, sp, start, spte) < 0)\n-\t\t\t\tbreak;\n+\t\t\t\treturn;\n \t\t\tstart = NULL;\n \t\t} else if (!start)\n \t\t\tstart = spte;\n \t}\n+\tif (start)\n+\t\tdirect_pte_prefetch_many(vcpu, sp, start, spte);\n }\n";
        assert_eq!(
            recognise(&text_patch("fix.patch", fix), SKIP),
            Ok(Prefetch::STOCK)
        );
    }

    #[test]
    fn anything_else_gets_no_prediction_with_the_reason() {
        for name in [
            "001-lifecycle-keyed.patch",
            "001-sync-on-register.patch",
            "srcu-call-expedited.patch",
            "doc-only.patch",
        ] {
            let why = recognise(&patch(name), Prefetch::STOCK).unwrap_err();
            assert!(
                matches!(why, NoPrediction::OtherFile { .. }),
                "{name}: {why:?}"
            );
            assert!(why.to_string().contains("--model-strategy"), "{why}");
        }
        let twelve = "--- a/arch/x86/kvm/mmu/mmu.c\n+++ b/arch/x86/kvm/mmu/mmu.c\n@@ -125 +125 @@\n-#define PTE_PREFETCH_NUM\t\t8\n+#define PTE_PREFETCH_NUM\t\t12\n";
        assert_eq!(
            recognise(&text_patch("twelve.patch", twelve), Prefetch::STOCK),
            Err(NoPrediction::BadPrefetchNum {
                patch: "twelve.patch".into(),
                value: "12".into()
            })
        );
        let other = "--- a/arch/x86/kvm/mmu/mmu.c\n+++ b/arch/x86/kvm/mmu/mmu.c\n@@ -3240 +3240 @@ static void __direct_pte_prefetch(\n-\t\t\tstart = NULL;\n+\t\t\tstart = spte;\n";
        assert!(matches!(
            recognise(&text_patch("other.patch", other), Prefetch::STOCK),
            Err(NoPrediction::OtherHunk { .. })
        ));
        assert!(matches!(
            strategy_for(&[], Some("sometimes")),
            Err(NoPrediction::UnknownDeclared { .. })
        ));
        assert_eq!(
            strategy_for(&[patch("doc-only.patch")], Some("legacy:32")).map(|c| c.name),
            Ok("legacy:32".into())
        );
    }

    fn plan(variant: &str) -> TouchPlan {
        crate::scenario::plans_of(&Memory, &["size=16MiB"], &[variant], BackendKind::Model)
            .expect("a plan")
            .remove(0)
            .1
    }

    /// 16 MiB is 4096 pages, touched once each in order, with 2 MiB guest pages (the default):
    /// the guest's only table page in the pass is the data region's PD, frame 5 of the system
    /// memslot, beside PML4, PDPT and PD 0 (frames 2-4) that the code's first fetch walked.
    /// - TDP MMU: no prefetch, so every data page faults and the PD faults once: 4097, on any
    ///   kernel.
    /// - Legacy MMU, stock: the first fault in frames 0-7 (frame 2) maps the whole populated
    ///   block, PD included, so the PD never faults. Populated data: one fault maps its 8-page
    ///   block, 4096 / 8 = 512; lazy data: prefetch never faults a host page in, 4096.
    /// - Legacy MMU, reverted: each fault is the lowest unmapped page of its block and the run
    ///   after it is dropped, so all 4096 fault; and frames 2, 3, 4 each dropped the run after
    ///   them, so the PD faults in the pass: 4097 for both backings.
    /// - Legacy MMU, PTE_PREFETCH_NUM 16: populated 4096 / 16 = 256; lazy 4096; the PD lies in
    ///   frames 0-15, mapped with the walk.
    #[test]
    fn pf_fixed_at_16mib_on_both_mmus() {
        let sixteen = Prefetch {
            trailing: true,
            num: 16,
        };
        for (variant, tdp, stock, reverted, wide) in [
            ("populated", 4097, 512, 4097, 256),
            ("lazy", 4097, 4096, 4097, 4096),
        ] {
            let p = plan(variant);
            let at = |mmu, s| pf_fixed(&p, mmu, s).expect("a count");
            for s in [Prefetch::STOCK, SKIP, sixteen] {
                assert_eq!(at(Stage2Mmu::TdpMmu, s), tdp, "{variant} TDP {}", s.name());
            }
            assert_eq!(
                at(Stage2Mmu::TdpLegacy, Prefetch::STOCK),
                stock,
                "{variant}"
            );
            assert_eq!(at(Stage2Mmu::TdpLegacy, SKIP), reverted, "{variant}");
            assert_eq!(at(Stage2Mmu::TdpLegacy, sixteen), wide, "{variant}");
        }
    }

    /// 6 GiB of 4 KiB pages is 1,572,864; the fix maps a block of 8 per fault: 196,608. The
    /// thread's "~1.75M" and "< 0.27M" include its guest kernel's own faults.
    #[test]
    fn thread_004_s_host_is_predicted_from_its_setup() {
        assert_eq!(on_reporters_host(Prefetch::STOCK), Ok(196_608));
        assert_eq!(on_reporters_host(SKIP), Ok(1_572_864));
    }

    const RUNS: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/kab-7.3-004-revert/runs.jsonl"
    ));

    fn runs() -> Vec<RunRecord> {
        RUNS.lines()
            .map(|l| serde_json::from_str(l).expect("a stored run"))
            .collect()
    }

    #[test]
    fn the_revert_s_kab_is_predicted_exactly_on_both_sides() {
        let r = from_runs(&runs());
        assert!(r.skipped.is_empty(), "{:?}", r.skipped);
        let rows: Vec<(&str, &str, f64, f64)> = r
            .rows
            .iter()
            .map(|x| {
                (
                    x.side.as_str(),
                    x.variant.as_str(),
                    x.pf_fixed.predicted,
                    x.pf_fixed.measured,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("A", "populated", 512.0, 512.0),
                ("A", "lazy", 4096.0, 4096.0),
                ("B", "populated", 4097.0, 4097.0),
                ("B", "lazy", 4097.0, 4097.0),
            ]
        );
        assert_eq!((r.within(), r.outside()), (4, 0));
    }

    /// B declared as the stock loop (a wrong mapping of the revert): the model keeps the
    /// trailing prefetch and misses B's counts.
    #[test]
    fn a_wrong_strategy_for_the_revert_falls_outside() {
        let mut runs = runs();
        for r in &mut runs {
            if let Some(k) = r.host.under_test.as_mut().and_then(|u| u.kab.as_mut())
                && k.side == "B"
            {
                k.memory_strategy = Some("legacy".into());
            }
        }
        let r = from_runs(&runs);
        let b: Vec<&MemoryRow> = r.rows.iter().filter(|x| x.side == "B").collect();
        assert_eq!(b.len(), 2);
        for row in b {
            assert_eq!(row.agreement, Agreement::Outside, "{row:#?}");
        }
        assert_eq!((r.within(), r.outside()), (2, 2));
    }

    /// The kab's own prediction from the same runs: beside each variant, both MMUs, the
    /// measurement on the legacy MMU the boots ran.
    #[test]
    fn a_kab_s_prediction_shows_both_mmus_and_the_measurement_beside_the_one_that_ran() {
        let runs = runs();
        let side = |s: &str| -> Vec<&RunRecord> {
            runs.iter()
                .filter(|r| kab_side(r).is_some_and(|k| k.side == s))
                .collect()
        };
        let (a, b) = (side("A"), side("B"));
        let p = predict(
            [
                strategy_for(&[], None),
                strategy_for(&[patch("004-revert-trailing-prefetch.patch")], None),
            ],
            [&a, &b],
        );
        assert!(p.unknown.is_empty(), "{:?}", p.unknown);
        let populated_legacy = p
            .this_host
            .iter()
            .find(|v| v.variant == "populated" && v.mmu == Stage2Mmu::TdpLegacy)
            .expect("populated on the legacy MMU");
        assert_eq!(populated_legacy.pf_fixed, [512, 4097]);
        assert_eq!(populated_legacy.measured, [Some(512.0), Some(4097.0)]);
        let populated_tdp = p
            .this_host
            .iter()
            .find(|v| v.variant == "populated" && v.mmu == Stage2Mmu::TdpMmu)
            .expect("populated on the TDP MMU");
        assert_eq!(populated_tdp.pf_fixed, [4097, 4097]);
        assert_eq!(populated_tdp.measured, [None, None]);
        assert_eq!(
            p.reporters_host.as_ref().map(|r| r.pf_fixed),
            Some([196_608, 1_572_864])
        );
    }
}
