//! A lifecycle sweep on the model: 100 points (all six variants, default repetitions) on every
//! core, with and without storing them in SQLite. The target is 1,000 points in under
//! a minute on 2 cores, storage included: under 6 s per 100 here.
#![allow(clippy::unwrap_used)] // bench code: a panic is the failure report

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use hvlab::lab::Error;
use hvlab::lab::shard::Shard;
use hvlab::lab::sweep::{self, SweepSpec};
use hvlab::model::ModelBackend;
use hvlab::model::profile::Profile;
use hvlab::scenario::runner::{DEFAULT_SEED, Silent};
use hvlab::store::Store;
use hvlab_core::{Backend, BackendKind};

fn bench(c: &mut Criterion) {
    let scenario = hvlab::scenario::Kind::Lifecycle;
    let spec = SweepSpec {
        scenario,
        backend: BackendKind::Model,
        axes: sweep::parse_grid(&[
            "vcpus=1,2,4,8,12,16,24,32,48,64".into(),
            "devices=0,1,2,4,8,16,32,64,128,256".into(),
        ])
        .unwrap(),
        sets: Vec::new(),
        variants: Vec::new(),
        reps: scenario.info().default_reps,
        warmup: scenario.info().default_warmup,
        seed: DEFAULT_SEED,
        profile: Some("pvm-epyc".into()),
    };
    let plan = sweep::plan(&spec).unwrap();
    assert_eq!(plan.points.len(), 100);
    let host = hvlab::lab::host::probe();
    let profile = Profile::load("pvm-epyc").unwrap();
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let backend = |seed| -> Result<Box<dyn Backend>, Error> {
        Ok(Box::new(ModelBackend::new(
            profile.clone(),
            host.clone(),
            seed,
        )))
    };
    let mut group = c.benchmark_group("lifecycle sweep, 100 model points");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(20));
    group.bench_function("run", |b| {
        b.iter(|| {
            sweep::run(&plan, Shard::WHOLE, threads, backend, &Silent, |_| {
                Ok::<(), Error>(())
            })
            .unwrap()
        })
    });
    group.bench_function("run and store", |b| {
        b.iter(|| {
            let dir = tempfile::tempdir().unwrap();
            let mut store = Store::open(&dir.path().join("sweep.db")).unwrap();
            sweep::run(&plan, Shard::WHOLE, threads, backend, &Silent, |mut r| {
                Ok::<(), Error>(store.save(&mut r)?)
            })
            .unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
