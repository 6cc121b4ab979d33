//! The mmu model at scale: 6 GiB of first touches (1.5 M faults) per prefetch variant, and
//! 1 TiB (268 M pages) sequential, reverse and stride=3 first touches.
//! Target: under 0.5 s for 6 GiB, under 1 s for 1 TiB.
#![allow(clippy::unwrap_used)] // bench code: a panic is the failure report

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hvlab::model::memory::{self, MmuCosts};
use hvlab::model::profile::Profile;
use hvlab_core::guest::Backing;
use hvlab_core::guest::Cpl;
use hvlab_core::guest::GuestPage;
use hvlab_core::memory::{Access, HostBacking, Pattern, PrefetchLoop, Touch, TouchPlan};

fn bench(c: &mut Criterion) {
    let costs = MmuCosts::from_profile(&Profile::load("pvm-epyc").unwrap()).unwrap();
    let mut group = c.benchmark_group("mmu model, 6 GiB first touch");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(10));
    for (name, lp) in [
        ("none", PrefetchLoop::None),
        ("legacy-skip-trailing", PrefetchLoop::LegacySkipTrailing),
        ("legacy", PrefetchLoop::Legacy),
    ] {
        let plan = TouchPlan {
            size_bytes: 6 << 30,
            pattern: Pattern::Seq,
            seed: 1,
            access: Access::Write,
            touch: Touch::FirstByte,
            guest_page: GuestPage::Huge,
            backing: HostBacking::Anonymous(Backing::Populated),
            cpl: Some(Cpl::Three),
            timeout: Duration::from_secs(1),
            prefetch: Some(lp),
            vcpus: 1,
        };
        group.bench_function(name, |b| b.iter(|| memory::touch(&costs, &plan).unwrap()));
    }
    group.finish();

    let mut group = c.benchmark_group("mmu model, 1 TiB first touch");
    group.sample_size(10);
    for (name, pattern, backing) in [
        (
            "seq populated",
            Pattern::Seq,
            HostBacking::Anonymous(Backing::Populated),
        ),
        (
            "reverse thp",
            Pattern::Reverse,
            HostBacking::Anonymous(Backing::Thp),
        ),
        (
            "stride=3 uffd window=511",
            Pattern::Stride(3),
            HostBacking::Uffd(511),
        ),
    ] {
        let plan = TouchPlan {
            size_bytes: 1 << 40,
            pattern,
            seed: 1,
            access: Access::Write,
            touch: Touch::FirstByte,
            guest_page: GuestPage::Small,
            backing,
            cpl: Some(Cpl::Three),
            timeout: Duration::from_secs(1),
            prefetch: Some(PrefetchLoop::Legacy),
            vcpus: 1,
        };
        group.bench_function(name, |b| b.iter(|| memory::touch(&costs, &plan).unwrap()));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
