//! The mmu model at scale: 6 GiB of first touches (1.5 M faults) per prefetch variant.
//! Target: under 0.5 s each.
#![allow(clippy::unwrap_used)] // bench code: a panic is the failure report

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hvlab::backend::guest::Backing;
use hvlab::backend::guest::Cpl;
use hvlab::backend::guest::GuestPage;
use hvlab::backend::memory::{Access, HostBacking, Pattern, PrefetchLoop, Touch, TouchPlan};
use hvlab::model::mmu::{self, MmuCosts};
use hvlab::model::profile::Profile;

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
        };
        group.bench_function(name, |b| b.iter(|| mmu::touch(&costs, &plan)));
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
