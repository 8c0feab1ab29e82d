//! Encode/decode throughput of profile files, and their size per (offset, count) pair on a
//! realistic distribution (see FORMAT.md "Compactness").

// Reads /proc and files it wrote itself (clippy.toml forbids plain reads in the library).
#![allow(clippy::disallowed_methods)]
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use profile_format::Profile;

#[path = "../tests/it/common/mod.rs"]
mod common;

fn codec(c: &mut Criterion) {
    // 100k distinct offsets over a 4 MB text section, Zipf counts, ~1M samples.
    let profile = common::zipf_profile(100_000, 4 << 20, 1_000_000, 42);
    let bytes = profile.encode();
    let pairs = profile.counts.len();
    println!(
        "zipf profile: {pairs} pairs, {} samples, {} bytes, {:.3} bytes/pair",
        profile.header.total_samples,
        bytes.len(),
        bytes.len() as f64 / pairs as f64
    );

    let mut group = c.benchmark_group("profile");
    group.throughput(Throughput::Elements(pairs as u64));
    group.bench_function("encode_100k_pairs", |b| b.iter(|| black_box(&profile).encode()));
    group.bench_function("decode_100k_pairs", |b| {
        b.iter(|| {
            Profile::decode(black_box(&bytes), Path::new("bench.prof")).map(|p| p.counts.len())
        })
    });
    group.bench_function("merge_100k_pairs", |b| {
        b.iter(|| {
            let mut a = profile.clone();
            a.merge(black_box(&profile)).map(|()| a.counts.len())
        })
    });
    group.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
