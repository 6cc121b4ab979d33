//! The sentences of the analysis's own types: a verdict, an A/B comparison, a finding, a
//! warning. Their `Display` must sit in the crate that defines them, and a record's JSON
//! carries these sentences beside the data (`text`, `message`); every other rendering is in
//! the binary's words module (`export::words`), which re-exports the helpers below so callers
//! see one place.

use std::fmt;

use crate::class::MetricClass;
use crate::compare::{AbComparison, Verdict};
use crate::record::{Finding, SelfCheck};
use hvlab_core::memory::Stage2Mmu;

/// A value with its unit and sensible precision: the one formatter (`crate::quantity`), so
/// the terminal, Markdown and HTML print `24.6 ms` and never `24630000.0 ns`.
pub fn fmt_value(v: f64, unit: &str) -> String {
    crate::quantity::format(v, unit)
}

/// Two values of one unit on one scale, for a sentence that compares them.
fn fmt_pair(a: f64, b: f64, unit: &str) -> (String, String) {
    let mut both = crate::quantity::format_all(&[a, b], unit);
    let second = both.pop().unwrap_or_default();
    (both.pop().unwrap_or_default(), second)
}

impl fmt::Display for Verdict {
    /// "populated against lazy: FASTER on ns_per_page, 5.10× (1.31 µs vs 6.68 µs; 95% CI of
    /// the ratio 2.60–6.40×)": the judged side first, its class in the one vocabulary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (variant, against, metric, ci) =
            (self.variant(), self.against(), &self.metric, self.ci95);
        let [v_m, a_m] = self.medians_variant_baseline();
        // Both sides on one scale: "0.625 ms vs 7.85 ms", never "625 µs vs 7.85 ms".
        let (v_t, a_t) = fmt_pair(v_m, a_m, &self.unit);
        let q = crate::quantity::ratio;
        let ci_text = ratio_ci(ci);
        let direction = if v_m <= a_m { "faster" } else { "slower" };
        let class = self.class();
        match class {
            MetricClass::NotDecided => write!(
                f,
                "{variant} against {against}: NOT DECIDED on {metric} ({v_t} vs {a_t}, {} {direction}, {ci_text}): {}",
                q(self.ratio),
                self.undecided
                    .as_ref()
                    .map_or_else(String::new, |why| undecided(
                        why,
                        self.n,
                        self.p_adjusted,
                        crate::verdict::ALPHA,
                        "--reps"
                    ))
            )?,
            MetricClass::NoChange => write!(
                f,
                "{variant} against {against}: NO CHANGE on {metric} ({v_t} vs {a_t}, {} {direction}, {ci_text})",
                q(self.ratio),
            )?,
            MetricClass::Faster | MetricClass::Slower => write!(
                f,
                "{variant} against {against}: {class} on {metric}, {} ({v_t} vs {a_t}; {ci_text})",
                q(self.ratio),
            )?,
        }
        if let Some(c) = &self.cause {
            write!(f, "; cause: {}", stall_cause(c))?;
        }
        Ok(())
    }
}

/// "95% CI of the ratio 2.60–6.40×": a verdict's interval, the unit said once.
pub fn ratio_ci(ci: [f64; 2]) -> String {
    let q = crate::quantity::ratio;
    format!(
        "95% CI of the ratio {}–{}",
        q(ci[0]).trim_end_matches('×'),
        q(ci[1])
    )
}

/// "KVM_SET_USER_MEMORY_REGION waited 7.00 ms (1.7 jiffies) for the SRCU grace period started
/// by KVM_CREATE_IRQCHIP": what a stalled verdict's slower side waited for.
pub fn stall_cause(c: &crate::compare::StallCause) -> String {
    let by = c
        .caused_by
        .as_deref()
        .map_or(String::new(), |c| format!(" started by {c}"));
    format!(
        "{} waited {} ({:.1} {}) for the SRCU grace period{by}",
        c.ioctl,
        fmt_value(c.median_ms, &c.clock.unit("ms")),
        c.jiffies,
        jiffies_on(c.clock)
    )
}

/// Why a comparison was not decided and what would decide it, in one clause. `how` names
/// what to raise: `--reps` for a run's variants, samples per side for a comparison.
fn undecided(
    why: &crate::verdict::Undecided,
    n: [usize; 2],
    p_adjusted: f64,
    alpha: f64,
    how: &str,
) -> String {
    use crate::verdict::{MAX_PLANNED, MIN_PER_SIDE, Undecided};
    let decide = |needed: Option<usize>, verb: &str| match (needed, how) {
        (Some(k), "--reps") => format!("`--reps {k}` {verb}"),
        (Some(k), how) => format!("{k} {how} {verb}"),
        (None, _) => format!("more than {MAX_PLANNED} would be needed"),
    };
    match *why {
        Undecided::TooFew { needed } => format!(
            "n = {} vs {} is too few (the rule needs at least {MIN_PER_SIDE} per side); {}",
            n[0],
            n[1],
            decide(Some(needed), "can decide")
        ),
        Undecided::Unreachable {
            judged_together,
            needed,
        } => format!(
            "{} vs {} samples cannot reach p < {alpha} across {judged_together} comparison{} (the exact rank test's smallest p, corrected, is {}); {}",
            n[0],
            n[1],
            if judged_together == 1 { "" } else { "s" },
            crate::quantity::p_value(p_floor_corrected(n, judged_together)),
            decide(needed, "can")
        ),
        Undecided::TooSpread { needed } => format!(
            "the medians agree, but with n = {} vs {} the 95% CI of the ratio still reaches beyond the threshold, so a difference that matters is not ruled out; {}",
            n[0],
            n[1],
            match needed {
                Some(_) => decide(needed, "likely would (an estimate from this spread)"),
                None => "more repetitions can decide".to_string(),
            }
        ),
        Undecided::NotEstablished { needed } => format!(
            "the medians differ by more than the threshold, but with n = {} vs {} the rank test ({} after correction) and the interval do not establish it; {}",
            n[0],
            n[1],
            crate::quantity::p_value(p_adjusted),
            match needed {
                Some(_) => decide(needed, "likely would (an estimate from this spread)"),
                None => "more repetitions can decide".to_string(),
            }
        ),
    }
}

/// The exact test's floor at `n` times the family size (Holm's first step): what the
/// strongest evidence would have been corrected to.
fn p_floor_corrected(n: [usize; 2], judged_together: usize) -> f64 {
    #[allow(clippy::cast_precision_loss)] // a family of comparisons, far below 2^53
    let m = judged_together as f64;
    (crate::statistics::exact_min_p(n[0], n[1]) * m).min(1.0)
}

impl fmt::Display for AbComparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ratio = self.ratio;
        let q = crate::quantity::ratio;
        let change = match self.verdict {
            // The factor of the change, whichever way is better.
            MetricClass::Faster => format!("FASTER, {}", q(ratio.max(1.0 / ratio))),
            MetricClass::Slower => format!("SLOWER, {} (a regression)", q(ratio.max(1.0 / ratio))),
            MetricClass::NotDecided => match &self.undecided {
                Some(why) => format!(
                    "NOT DECIDED: {}",
                    undecided(
                        why,
                        self.n,
                        self.p_adjusted,
                        self.alpha,
                        "samples per side (--reps, or more runs)"
                    )
                ),
                None => "NOT DECIDED".to_string(),
            },
            MetricClass::NoChange => "NO CHANGE".to_string(),
        };
        let (b, a) = fmt_pair(self.median[1], self.median[0], &self.unit);
        write!(
            f,
            "{}: B {b} vs A {a}: {change} (ratio B/A {ratio:.3}, 95% CI {:.3}–{:.3}; exact rank test {}, {} after {} over {} judged together, called at p < {}; n = {} vs {}; threshold {:.0}%)",
            self.metric,
            self.ci95[0],
            self.ci95[1],
            crate::quantity::p_equals(self.p_value),
            crate::quantity::p_value(self.p_adjusted),
            match self.correction {
                crate::verdict::Correction::Holm => "Holm",
                crate::verdict::Correction::BenjaminiHochberg => "Benjamini-Hochberg",
            },
            self.judged_together,
            self.alpha,
            self.n[1],
            self.n[0],
            self.threshold * 100.0
        )
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::SrcuStall { .. } | Finding::SlowIoctl { .. } => self.fmt_stall(f),
            Finding::FaultsPerPage { .. }
            | Finding::UserfaultfdFaults { .. }
            | Finding::DirtyLog { .. } => self.fmt_memory(f),
            Finding::SelfCheck { .. }
            | Finding::PmuMsrLists { .. }
            | Finding::GuestPebsDisabled
            | Finding::RaceExplored(_) => self.fmt_exits(f),
            Finding::PinsAged { .. }
            | Finding::Blackouts { .. }
            | Finding::FaultBlackouts { .. } => self.fmt_pinning(f),
            Finding::PercpuAssumptions { workload, cpus } => write!(
                f,
                "{workload} on {cpus} CPUs: this_cpu ops per kernel event are call-site counts (src/model/percpu.rs), instruction latencies and per-event kernel times come from the profile, the kernel share of wall time is an assumption (src/scenario/percpu.rs WORKLOADS)"
            ),
        }
    }
}

/// What a jiffy is on `clock`: a tick of real time, or of the instruction clock's virtual time.
pub fn jiffies_on(clock: hvlab_core::host::Clock) -> &'static str {
    match clock {
        hvlab_core::host::Clock::Wall => "jiffies",
        hvlab_core::host::Clock::Icount => "virtual jiffies",
    }
}

/// What a clock's times are, in a few words.
pub fn clock_words(clock: hvlab_core::host::Clock) -> &'static str {
    match clock {
        hvlab_core::host::Clock::Wall => "the wall clock (times in nanoseconds)",
        hvlab_core::host::Clock::Icount => {
            "QEMU's instruction clock (times in guest instructions, jiffies in virtual ticks)"
        }
    }
}

impl fmt::Display for crate::record::MixedClocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ((a, ca), (b, cb)) = (&self.first, &self.other);
        write!(
            f,
            "run {a} is on {} and run {b} on {}: times of two clocks never compare; compare runs of one clock (`hvlab runs` shows each run's clock)",
            clock_words(*ca),
            clock_words(*cb)
        )
    }
}

/// The sentences of each mechanism's findings (each helper words its own; [`Finding`]'s
/// `Display` picks the helper).
impl Finding {
    /// A slow ioctl, and the grace period it waited for.
    fn fmt_stall(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::SrcuStall {
                ioctl,
                step,
                caused_by,
                caused_at,
                median_ms,
                baseline_ms,
                jiffies,
                stalled_reps,
                reps,
                clock,
                ..
            } => {
                let what = match (caused_at, caused_by) {
                    (Some(at), _) if at == step => {
                        "a whole SRCU grace period of its own (synchronize_srcu() while vCPUs run)"
                            .to_string()
                    }
                    (Some(at), Some(cause)) => {
                        format!("the SRCU grace period started by {cause} (ioctl #{at})")
                    }
                    (None, Some(cause)) => format!("the SRCU grace period started by {cause}"),
                    _ => "an SRCU grace period".to_string(),
                };
                write!(
                    f,
                    "{ioctl} (ioctl #{step}) waited for {what}: {}, {jiffies:.1} {} over its {} baseline, in {stalled_reps} of {reps} reps",
                    fmt_value(*median_ms, &clock.unit("ms")),
                    jiffies_on(*clock),
                    fmt_value(*baseline_ms, &clock.unit("ms"))
                )
            }
            Finding::SlowIoctl {
                ioctl,
                step,
                median_ms,
                baseline_ms,
                jiffies,
                slow_reps,
                reps,
                clock,
            } => write!(
                f,
                "{ioctl} (ioctl #{step}) was slow, cause unknown: {}, {jiffies:.1} {} over its {} baseline, in {slow_reps} of {reps} reps (it cannot wait for SRCU on this kernel, or no grace period was in flight)",
                fmt_value(*median_ms, &clock.unit("ms")),
                jiffies_on(*clock),
                fmt_value(*baseline_ms, &clock.unit("ms"))
            ),
            _ => Ok(()),
        }
    }

    /// Faults per page, userfaultfd and the dirty log.
    fn fmt_memory(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::FaultsPerPage {
                pages,
                pf_fixed,
                table_pages,
                mmu,
            } => {
                let data_faults = pf_fixed - table_pages;
                let c = crate::quantity::count;
                #[allow(clippy::cast_precision_loss)] // page counts, far below 2^53
                let pages_t = c(*pages as f64);
                if data_faults <= 0.0 {
                    write!(
                        f,
                        "kvm.vcpu.pf_fixed = {} for {} pages touched: none on the data region, which was mapped before the guest ran; {} on the guest's own page-table pages",
                        c(*pf_fixed),
                        pages_t,
                        c(*table_pages)
                    )
                } else {
                    #[allow(clippy::cast_precision_loss)]
                    let per_fault = *pages as f64 / data_faults;
                    let split = if *table_pages > 0.0 {
                        format!(
                            " = {} on the data + {} on the guest's own page-table pages",
                            c(data_faults),
                            c(*table_pages)
                        )
                    } else {
                        String::new()
                    };
                    write!(
                        f,
                        "kvm.vcpu.pf_fixed = {}{split} for {pages_t} pages touched: {per_fault:.2} pages mapped per stage-2 fault ({})",
                        c(*pf_fixed),
                        fault_reading(per_fault, *mmu)
                    )
                }
            }
            Finding::UserfaultfdFaults { pages, faults } => {
                #[allow(clippy::cast_precision_loss)]
                let per = *pages as f64 / faults;
                write!(
                    f,
                    "{faults} userfaultfd faults for {pages} pages: {per:.2} pages served per fault"
                )
            }
            Finding::DirtyLog {
                variant,
                pages,
                passes,
                wp_faults,
                ioctls,
                ring_full_exits,
            } => {
                write!(
                    f,
                    "{variant}: the log reported exactly the {pages} pages each pass wrote, in all {passes} passes; {ioctls:.0} collection ioctls per pass"
                )?;
                if let Some(wp) = wp_faults {
                    #[allow(clippy::cast_precision_loss)]
                    let per = wp / (*pages).max(1) as f64;
                    write!(
                        f,
                        "; {wp:.0} write-protect faults per pass ({per:.4} per page written)"
                    )?;
                }
                match ring_full_exits {
                    Some(n) if *n > 0.0 => write!(
                        f,
                        "; the ring filled {n:.0} times per pass (KVM_EXIT_DIRTY_RING_FULL: the vCPU stopped until the VMM harvested it, and the write that filled it faulted again after the reset)"
                    ),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }

    /// Exit counts, the PMU's MSR lists and races.
    fn fmt_exits(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::SelfCheck {
                check,
                variant,
                observed,
                expected,
                ..
            } => match check {
                SelfCheck::ExitsStatistic => write!(
                    f,
                    "kvm.vcpu.exits counted {observed:.2} per iteration of {variant} (expected {expected:.2}): this host's exits statistic does not count every roundtrip; trust roundtrip_ns, not the statistic"
                ),
                SelfCheck::UserspaceExits => write!(
                    f,
                    "{variant} reached the VMM {observed:.2} times per iteration, expected {expected:.0}: the exit was not handled where this variant assumes"
                ),
            },
            Finding::PmuMsrLists {
                load_list,
                vmcs_fields,
                dropped,
                wrmsrs,
            } => {
                let list = |v: &[String]| {
                    if v.is_empty() {
                        "none".to_string()
                    } else {
                        v.join(", ")
                    }
                };
                write!(
                    f,
                    "MSR-load lists: {}; VMCS PERF_GLOBAL_CTRL fields: {}; dropped (host value equals guest value): {}; explicit WRMSRs before VM-entry: {wrmsrs}",
                    list(load_list),
                    list(vmcs_fields),
                    list(dropped)
                )
            }
            Finding::GuestPebsDisabled => f.write_str(
                "guest PEBS is disabled while the host uses PEBS: its counters are left out of the guest's PERF_GLOBAL_CTRL (the series keeps this restriction, with a FIXME)",
            ),
            Finding::RaceExplored(r) => {
                if r.stale_bit {
                    write!(
                        f,
                        "race explorer ({} scheme): a stale {} bit survives VM-exit: {} (perf's NMI changed the bit after the list captured the host value; {} states explored)",
                        r.scheme,
                        r.register,
                        r.interleaving.join(" → "),
                        r.states
                    )
                } else {
                    write!(
                        f,
                        "race explorer ({} scheme): no interleaving of list building, host PEBS NMI, VM-entry and VM-exit leaves a stale {} bit ({} states explored exhaustively)",
                        r.scheme, r.register, r.states
                    )
                }
            }
            _ => Ok(()),
        }
    }

    /// Pins and the records lost without them.
    fn fmt_pinning(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::PinsAged {
                after_ms,
                pinned_bytes_end,
                tail_ms,
            } => write!(
                f,
                "aging released the pins {after_ms} ms after their last use: {} pinned at the end of the {tail_ms} ms idle tail",
                crate::quantity::bytes(*pinned_bytes_end)
            ),
            Finding::Blackouts {
                records,
                buffer_bytes,
                cap_bytes,
            } => write!(
                f,
                "{} records fell in blackouts: the buffer ({}) could not be pinned under the {} cap",
                crate::quantity::count(*records),
                crate::quantity::bytes(*buffer_bytes),
                crate::quantity::bytes(*cap_bytes)
            ),
            Finding::FaultBlackouts {
                records,
                faults,
                unmap_pct,
            } => write!(
                f,
                "{} records fell in blackouts: SPE stopped at each of {} stage-2 faults on the unpinned buffer until the fault was handled ({unmap_pct}% of the buffer unmapped at every switch-out)",
                crate::quantity::count(*records),
                crate::quantity::count(*faults)
            ),
            _ => Ok(()),
        }
    }
}

/// What one stage-2 fault per `per_fault` data pages means on `mmu`.
fn fault_reading(per_fault: f64, mmu: Option<Stage2Mmu>) -> &'static str {
    let tdp = matches!(mmu, Some(Stage2Mmu::TdpMmu | Stage2Mmu::TdpLegacy));
    if per_fault >= 256.0 {
        if tdp {
            "huge mappings: the host backed the region with 2 MiB pages, and with TDP stage 2 maps a host huge page whole whatever the guest's own page size"
        } else {
            "huge mappings: the host backed the region with 2 MiB pages and the guest maps 2 MiB, so one fault maps 512 pages"
        }
    } else if per_fault > 1.5 {
        match mmu {
            Some(Stage2Mmu::TdpMmu) => {
                "part of the region is mapped huge (the TDP MMU never prefetches)"
            }
            _ => "SPTE prefetch mapped the present neighbours of each fault (PTE_PREFETCH_NUM = 8)",
        }
    } else {
        match mmu {
            Some(Stage2Mmu::TdpMmu) => {
                "one fault per 4 KiB host page: the TDP MMU never prefetches"
            }
            Some(Stage2Mmu::TdpLegacy) => {
                "no prefetch: the neighbours' host pages were not present, and direct_pte_prefetch() never faults a host page in"
            }
            Some(Stage2Mmu::Shadow) => {
                "no prefetch: the neighbours' host pages were not present, or with 4 KiB guest pages the neighbours' guest PTEs have the Accessed bit clear, which FNAME(prefetch_invalid_gpte) skips"
            }
            None => {
                "no prefetch: the neighbours' host pages were not present, or the MMU does not prefetch"
            }
        }
    }
}

/// What the busy rule saw, in a few words: "load 4.2 on 2 cores, CPU pressure 31%".
pub fn busy_words(reasons: &[hvlab_core::noise::BusyReason]) -> String {
    use hvlab_core::noise::BusyReason;
    reasons
        .iter()
        .map(|r| match r {
            BusyReason::Load { load1, cores } => format!("load {load1:.1} on {cores} cores"),
            BusyReason::Runnable { others, cores } => {
                format!("{others} other runnable task(s) on {cores} cores")
            }
            BusyReason::Pressure { some_pct } => {
                format!("tasks waited for a CPU {some_pct:.0}% of the time")
            }
            BusyReason::Steal { pct } => format!("steal {pct:.0}%"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for crate::record::Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::record::Warning;
        match self {
            Warning::BusyHost { reasons, pinned } => write!(
                f,
                "busy host: {} during this run: another process competed for the CPU; times may be inflated and spread: run on a quiet host (--quiet-host waits for one){}",
                busy_words(reasons),
                if *pinned {
                    ""
                } else {
                    " or pin hvlab with --cpu LIST to a CPU the others do not use"
                }
            ),
            Warning::Outliers {
                variant,
                metric,
                count,
                n,
                k,
                clock: hvlab_core::host::Clock::Wall,
            } => write!(
                f,
                "{variant}: {count} of {n} samples of {metric} are outliers (beyond the median ± {k}·MAD): something interrupted those repetitions; the median and the rank test are robust to them, but consider a quieter host or more repetitions"
            ),
            Warning::Outliers {
                variant,
                metric,
                count,
                n,
                k,
                clock: hvlab_core::host::Clock::Icount,
            } => write!(
                f,
                "{variant}: {count} of {n} samples of {metric} are outliers (beyond the median ± {k}·MAD and 1% of it): on the instruction clock the host's load cannot move a sample, so the guest did other work in those repetitions (a first allocation, a timer interrupt's handler); the median is robust to them"
            ),
            Warning::Bimodal {
                variant,
                metric,
                unit,
                modes,
            } => write!(
                f,
                "{variant}: {metric} has two modes: {} ({} samples) and {} ({} samples); the median describes neither alone: look for what differs between the repetitions (a grace period in flight, a timer tick, the other task)",
                fmt_value(modes.medians[0], unit),
                modes.counts[0],
                fmt_value(modes.medians[1], unit),
                modes.counts[1]
            ),
            Warning::ClockSourceChanged { from } => write!(
                f,
                "the clock source changed from {from} during the run: times before and after may not compare; the kernel marked it unstable (see dmesg), rerun"
            ),
        }
    }
}
