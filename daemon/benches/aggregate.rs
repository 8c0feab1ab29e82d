//! Aggregate + resolve path on synthetic samples: `on_drain` (per-sample cost: asid lookup and
//! table upsert) and `take_resolved` (per-key resolution).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use dcpid::aggregate::Aggregator;
use dcpid::resolve::{Resolver, ResolverConfig};
use dcpid::types::{Sample, SampleSink, SideBand, TimedSideBand};

const PIDS: u32 = 64;
const BATCH: usize = 4096;
const BASE: u64 = 0x40_0000;

fn setup(dir: &std::path::Path) -> Arc<Aggregator> {
    let cfg = ResolverConfig {
        proc_root: dir.join("proc"),
        sys_root: dir.join("sys"),
        jit_map_dir: dir.join("tmp"),
    };
    let agg = Aggregator::new(Resolver::new(cfg), 1);
    let mut sb = Vec::new();
    for pid in 1..=PIDS {
        for lib in 0..8u64 {
            sb.push(TimedSideBand {
                time: 10 + u64::from(pid) * 10 + lib,
                cpu: 0,
                record: SideBand::Mmap2 {
                    pid,
                    tid: pid,
                    addr: BASE + lib * 0x10_0000,
                    len: 0x10_0000,
                    pgoff: 0,
                    dev: None,
                    ino: None,
                    ino_generation: None,
                    prot: 5,
                    flags: 2,
                    build_id: Some(vec![lib as u8 + 1; 20]),
                    filename: format!("/usr/lib/lib{lib}.so").into_bytes(),
                    kernel: false,
                },
            });
        }
    }
    agg.on_drain(0, 10_000, &mut Vec::new(), &mut sb);
    agg
}

fn samples(t0: u64) -> Vec<Sample> {
    (0..BATCH as u64)
        .map(|i| Sample {
            time: t0 + i,
            pid: 1 + (i % u64::from(PIDS)) as u32,
            tid: 1,
            // ~2k distinct pcs per pid over 8 libraries.
            pc: BASE + (i * 7919 % 8) * 0x10_0000 + (i * 104729 % 2048) * 4,
            cpu: 0,
            event: 0,
            period: 1_000_000,
            kernel: false,
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let agg = setup(dir.path());
    let mut t = 100_000u64;
    let mut g = c.benchmark_group("aggregate");
    g.throughput(Throughput::Elements(BATCH as u64));
    g.bench_function("on_drain_4096_samples", |b| {
        b.iter_batched(
            || {
                t += BATCH as u64;
                (samples(t), t + BATCH as u64)
            },
            |(mut s, until)| agg.on_drain(0, until, black_box(&mut s), &mut Vec::new()),
            BatchSize::SmallInput,
        )
    });
    g.bench_function("on_drain_then_take_resolved", |b| {
        b.iter_batched(
            || {
                t += BATCH as u64;
                (samples(t), t + BATCH as u64)
            },
            |(mut s, until)| {
                agg.on_drain(0, until, &mut s, &mut Vec::new());
                black_box(agg.take_resolved())
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
