//! What `dcpictl top` costs the daemon (issue 38: ≤ 1 % of one CPU at 2 refreshes per second
//! with 100 000 distinct (pid, pc) in the window).
//!
//! A request (`Shared::top`) takes the samples the watermark allows into a batch (work a flush
//! would do anyway, so not counted here), records the batch in the live view
//! (`Recent::push`: one batch per request, so half a second of samples), merges the window's
//! batches (`Recent::top`, 5 s: ten batches at two requests per second) and sends the rows as
//! JSON. A batch holds distinct (pid, pc) over 300 processes of 30 commands and 8 images each,
//! plus 5 000 kernel pcs, every pair new in every batch:
//!
//! * `request/100k_per_batch_x10`: 100 000 pairs in each of the ten batches (a million in the
//!   window): the worst case.
//! * `request/10k_per_batch_x10`: 10 000 pairs in each batch, 100 000 in the window: the
//!   target's case when every request takes a batch.
//! * `request/20k_per_batch_x5`: 20 000 pairs in each of five batches (100 000 in the
//!   window), one request per second taking a batch: the target's case since a request within
//!   1 s of the last batch taken reuses it; `repeat/…`: the other request of the second,
//!   which gets the same view back.
//! * `flush/100k`: what keeping the window costs every flush even with no client: listing
//!   the batch's table entries for the live view (one image reference each, as
//!   `Aggregator::resolve_entry` does) and `Recent::push`.
//!
//! Run: `cargo bench -p dcpi-daemon --bench top`. It prints the CPU time of the calling thread
//! per call (median of 15; not wall-clock time, so that the builds beside it on a shared
//! machine do not count) and the share of one CPU at two requests per second, or at one flush
//! per 5 s (BENCHMARKS.md, "dcpictl top").
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use dcpid::sys::time::thread_cpu_ns;
use dcpid::types::ImageInfo;
use dcpid::who::{Recent, WhoBatch};
use profile_format::{ImageId, ImageKind};

const PIDS: u32 = 300;
const KERNEL_PCS: u64 = 5_000;
/// Batches in the window at two requests per second over 5 s.
const WINDOW_BATCHES: u64 = 10;

struct Images {
    user: Vec<Arc<ImageInfo>>,
    kernel: Arc<ImageInfo>,
}

impl Images {
    fn new() -> Self {
        let user = (0..8u8)
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
        Self { user, kernel }
    }
}

/// A batch of `pairs` distinct (pid, pc), numbered from `seed * pairs` (so every batch's pairs
/// are new), without its live-view lists (`hot`, `hot_kernel`).
fn counts(im: &Images, pairs: u64, seed: u64) -> WhoBatch {
    let mut b = WhoBatch::default();
    for pid in 0..PIDS {
        b.comms.insert(1000 + pid, format!("cmd{}", pid % 30).into_bytes());
    }
    for i in seed * pairs..(seed + 1) * pairs {
        let (pid, image, n) = pair(im, i, seed);
        b.add_user(pid, Some(image), 0, n);
    }
    for pid in 0..PIDS {
        b.kernel.insert((1000 + pid, 0), 10);
    }
    b.kernel.insert((0, 0), 1000);
    b.cpus.insert((0, 0), 400_000);
    b
}

fn pair(im: &Images, i: u64, seed: u64) -> (u32, &Arc<ImageInfo>, u64) {
    let pid = 1000 + (i % u64::from(PIDS)) as u32;
    let image = &im.user[(i % im.user.len() as u64) as usize];
    (pid, image, 1 + (i.wrapping_mul(2_654_435_761).wrapping_add(seed) % 7))
}

/// Fill the live-view lists as the resolver does: one image reference per table entry.
fn list_hot(b: &mut WhoBatch, im: &Images, pairs: u64, seed: u64) {
    for i in seed * pairs..(seed + 1) * pairs {
        let (pid, image, n) = pair(im, i, seed);
        b.hot.push((pid, Arc::clone(image), 0x1000 + i * 16, 0, n));
    }
    for k in 0..KERNEL_PCS {
        b.hot_kernel.push((Arc::clone(&im.kernel), k * 32, 0, 1 + k % 3));
    }
}

fn batch(im: &Images, pairs: u64, seed: u64) -> WhoBatch {
    let mut b = counts(im, pairs, seed);
    list_hot(&mut b, im, pairs, seed);
    b
}

/// One request: record the batch, merge the window, the rows as the control socket sends them.
fn request(recent: &mut Recent, mut b: WhoBatch) -> usize {
    recent.push(&mut b);
    let v = recent.top(Duration::from_secs(5), 4000);
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
    serde_json::to_vec(&rows).map(|v| v.len()).unwrap_or(0)
}

/// CPU time of the calling thread spent in `f` (the setup around it and other processes on a
/// loaded machine are not counted, as they would be in wall-clock time).
fn cpu_time<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t0 = thread_cpu_ns();
    let r = f();
    (r, Duration::from_nanos(thread_cpu_ns().saturating_sub(t0)))
}

/// Median and minimum of `runs`.
fn summary(name: &str, mut runs: Vec<Duration>, per_second: f64) {
    runs.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let median = runs[runs.len() / 2];
    println!(
        "top/{name:<22} CPU per call: median {:8.3} ms, min {:8.3} ms, max {:8.3} ms ({} runs); \
         at {per_second} per second: {:.2} % of one CPU",
        ms(median),
        ms(runs[0]),
        ms(runs[runs.len() - 1]),
        runs.len(),
        ms(median) * per_second / 10.0,
    );
}

const RUNS: usize = 15;

fn main() {
    let im = Images::new();
    // (pairs per batch, batches in the window, requests that take a batch per second). Since
    // a request within 1 s of the last batch taken reuses it (`TOP_FRESH` in
    // daemon/src/service/control.rs), a client at 2 refreshes per second takes one batch per
    // second: five batches of 20 000 pairs hold the target's 100 000; the other request of
    // each second is `request/repeat` (the same view back, not merged again).
    for (pairs, batches, per_second) in
        [(100_000u64, WINDOW_BATCHES, 2.0), (10_000, WINDOW_BATCHES, 2.0), (20_000, 5, 1.0)]
    {
        // The earlier batches of the window; each run adds the last one to a copy. One
        // request before, as a running daemon has made: the copies start with its maps.
        let mut window = Recent::default();
        for s in 0..batches - 1 {
            window.push(&mut batch(&im, pairs, s));
        }
        black_box(window.top(Duration::from_secs(5), 4000));
        let (mut full, mut repeat) = (Vec::new(), Vec::new());
        for _ in 0..RUNS {
            let (mut recent, b) = (window.clone(), batch(&im, pairs, batches));
            let (n, t) = cpu_time(|| request(&mut recent, b));
            black_box(n);
            full.push(t);
            let (v, t) = cpu_time(|| recent.top(Duration::from_secs(5), 4000));
            black_box(v);
            repeat.push(t);
        }
        let name = format!("{}k_per_batch_x{batches}", pairs / 1000);
        summary(&format!("request/{name}"), full, per_second);
        if per_second < 2.0 {
            summary(&format!("repeat/{name}"), repeat, 2.0 - per_second);
        }
    }
    // A flush every 5 s (the default flush_interval) with no client.
    let pairs = 100_000;
    let mut full = Recent::default();
    for s in 0..WINDOW_BATCHES - 1 {
        full.push(&mut batch(&im, pairs, s));
    }
    let runs = (0..RUNS)
        .map(|_| {
            let (mut recent, mut b) = (full.clone(), counts(&im, pairs, WINDOW_BATCHES));
            let ((), t) = cpu_time(|| {
                list_hot(&mut b, &im, pairs, WINDOW_BATCHES);
                recent.push(&mut b);
            });
            t
        })
        .collect();
    summary("flush/100k", runs, 0.2);
}
