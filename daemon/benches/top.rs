//! What `dcpictl top` costs the daemon per request, with 100 000 distinct (pid, pc) in the
//! window (issue 38: ≤ 1 % of one CPU at 2 refreshes per second).
//!
//! A request (`Shared::top`) takes the samples the watermark allows into a batch (work a flush
//! would do anyway, so not counted here), records the batch in the live view
//! (`Recent::push`: one batch per request, so half a second of samples), merges the window's
//! batches (`Recent::top`, 5 s: ten batches at two requests per second) and sends the rows as
//! JSON. Each batch here holds 100 000 distinct (pid, pc) over 300 processes of 30 commands
//! and 8 images each, plus 5 000 kernel pcs: the worst case, every pair new in every batch.
//!
//! Run: `cargo bench -p dcpi-daemon --bench top`; the per-request time × 2 is the share of one
//! CPU at two refreshes per second.
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use dcpid::types::ImageInfo;
use dcpid::who::{Recent, WhoBatch};
use profile_format::{ImageId, ImageKind};

const PIDS: u32 = 300;
const PAIRS: u64 = 100_000;
const KERNEL_PCS: u64 = 5_000;

fn batch(images: &[Arc<ImageInfo>], kernel: &Arc<ImageInfo>, seed: u64) -> WhoBatch {
    let mut b = WhoBatch::default();
    for pid in 0..PIDS {
        b.comms.insert(1000 + pid, format!("cmd{}", pid % 30).into_bytes());
    }
    for i in 0..PAIRS {
        let pid = 1000 + (i % u64::from(PIDS)) as u32;
        let image = &images[(i % images.len() as u64) as usize];
        let n = 1 + (i.wrapping_mul(2_654_435_761).wrapping_add(seed) % 7);
        b.hot.push((pid, Arc::clone(image), 0x1000 + i * 16, 0, n));
        b.add_user(pid, Some(image), 0, n);
    }
    for k in 0..KERNEL_PCS {
        b.hot_kernel.push((Arc::clone(kernel), k * 32, 0, 1 + k % 3));
    }
    for pid in 0..PIDS {
        b.kernel.insert((1000 + pid, 0), 10);
    }
    b.kernel.insert((0, 0), 1000);
    b.cpus.insert((0, 0), 400_000);
    b
}

fn bench(c: &mut Criterion) {
    let images: Vec<Arc<ImageInfo>> = (0..8u8)
        .map(|i| {
            Arc::new(ImageInfo {
                kind: ImageKind::Elf,
                id: ImageId::BuildId(vec![i; 20]),
                path: format!("/usr/lib/x86_64-linux-gnu/libbench{i}.so.1").into_bytes(),
                jit_symbols: Vec::new(),
            })
        })
        .collect();
    let kernel = Arc::new(ImageInfo {
        kind: ImageKind::Kernel,
        id: ImageId::BuildId(vec![0xee; 20]),
        path: b"[kernel.kallsyms]".to_vec(),
        jit_symbols: Vec::new(),
    });
    let mut recent = Recent::default();
    for s in 0..9 {
        recent.push(&mut batch(&images, &kernel, s));
    }
    let mut g = c.benchmark_group("top");
    g.sample_size(20).measurement_time(Duration::from_secs(10));
    g.bench_function("request_100k_pairs", |bch| {
        bch.iter_batched(
            || batch(&images, &kernel, 42),
            |mut b| {
                recent.push(&mut b);
                let v = recent.top(Duration::from_secs(5), 4000);
                // The rows as the control socket sends them.
                let rows: Vec<(String, u32, String, Option<u64>, u64)> = v
                    .rows
                    .iter()
                    .map(|r| {
                        (
                            String::from_utf8_lossy(&r.command).into_owned(),
                            r.pid,
                            String::from_utf8_lossy(&r.image).into_owned(),
                            r.offset,
                            r.samples,
                        )
                    })
                    .collect();
                black_box(serde_json::to_vec(&rows).map(|v| v.len()).unwrap_or(0))
            },
            criterion::BatchSize::LargeInput,
        );
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
