//! Parse + aggregate throughput of one drain thread, on synthetic ring-buffer records.
//!
//! Each timed iteration is one drain pass over a ring holding `PASSES` records laid out exactly
//! as the kernel writes them with our `SAMPLE_TYPE` (IDENTIFIER|IP|TID|TIME|CPU), plus
//! a few side-band records (MMAP2 with build-id, FORK, COMM exec, EXIT) that create new
//! address-space versions. The pass runs the drain thread's own code: `perf::sampler::read_pass`
//! (read the records out of the ring, parse them, map the identifier to an event and stamp the
//! period), then `Aggregator::on_drain` (queue, watermark,
//! side-band application, per-CPU asid cache with the resolver read lock on a miss, the
//! set-associative table, early drains of the overflow buffer).
//!
//! Key distribution: 300 processes with 8 libraries each; user pcs Zipf(s = 1) over 50 000
//! distinct (pid, pc) addresses, 10% kernel samples Zipf over 5 000 kernel pcs; two events.
//! Two CPUs: before each pass the other CPU reports (untimed) so the watermark trails by one
//! pass, as in a running daemon: each pass aggregates the previous pass's samples. Every
//! 2 M samples the flusher takes the tables (untimed). Side-band records come every 4096
//! records whatever the pass length.
//!
//! `flush/take_resolved` times the flush thread's part instead: taking and resolving the
//! tables that one flush interval filled.
//!
//! Run: `cargo bench -p dcpi-daemon --bench aggregate` (the `thrpt` line is samples/s).
#![forbid(unsafe_code)]

use std::cell::{Cell, RefCell};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use dcpid::aggregate::Aggregator;
use dcpid::perf::ring::{RingBuffer, RingReader};
use dcpid::perf::sampler::read_pass;
use dcpid::resolve::{Resolver, ResolverConfig};
use dcpid::sys::perf as sp;
use dcpid::types::{Sample, SampleSink, SideBand, TimedSideBand};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const PIDS: u32 = 300;
const FIRST_PID: u32 = 1000;
const LIBS: u64 = 8;
const USER_ADDRS: usize = 50_000;
const KERNEL_ADDRS: usize = 5_000;
/// Records per pass: what a drain thread finds at its once-a-second wake-up at 1 kHz, and at a
/// half-ring wake-up (128 pages: 4 681 sample records).
const PASSES: [usize; 2] = [1000, 4681];
const SIDEBAND_EVERY: usize = 4096;
const BASE: u64 = 0x40_0000;
const IDS: [u64; 2] = [101, 102];
const PERIODS: [u64; 2] = [1_000_000, 250_000];
/// Samples between flushes (untimed).
const FLUSH_EVERY: usize = 1 << 21;
const RING: usize = 1 << 20;

/// A ring over plain memory (the real one is an mmap; records are read in place in both).
struct BenchRing {
    data: RefCell<Vec<u8>>,
    head: Cell<u64>,
    tail: Cell<u64>,
}

impl RingBuffer for BenchRing {
    fn data_size(&self) -> usize {
        RING
    }
    fn head(&self) -> u64 {
        self.head.get()
    }
    fn tail(&self) -> u64 {
        self.tail.get()
    }
    fn set_tail(&self, tail: u64) {
        self.tail.set(tail)
    }
    fn read_at(&self, off: usize, dst: &mut [u8]) {
        dst.copy_from_slice(&self.data.borrow()[off..off + dst.len()]);
    }
    fn with_bytes<T>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> T) -> T {
        f(&self.data.borrow()[off..off + len])
    }
}

#[derive(Clone, Copy)]
struct Key {
    pid: u32,
    pc: u64,
    kernel: bool,
    event: usize,
}

/// Zipf(1) over `n` ranks by inverse CDF.
fn zipf_cdf(n: usize) -> Vec<f64> {
    let mut acc = 0.0;
    let mut cdf: Vec<f64> = (1..=n)
        .map(|k| {
            acc += 1.0 / k as f64;
            acc
        })
        .collect();
    cdf.iter_mut().for_each(|c| *c /= acc);
    cdf
}

fn keys(n: usize) -> Vec<Key> {
    let mut rng = StdRng::seed_from_u64(7);
    let (ucdf, kcdf) = (zipf_cdf(USER_ADDRS), zipf_cdf(KERNEL_ADDRS));
    // Rank → address, scattered so that hot addresses are not neighbours.
    let user: Vec<(u32, u64)> = (0..USER_ADDRS)
        .map(|_| {
            let pid = FIRST_PID + rng.random_range(0..PIDS);
            let pc =
                BASE + rng.random_range(0..LIBS) * 0x10_0000 + rng.random_range(0..0x4_0000u64);
            (pid, pc)
        })
        .collect();
    let kern: Vec<u64> = (0..KERNEL_ADDRS)
        .map(|_| 0xffff_ffff_8100_0000 + rng.random_range(0..0x80_0000u64))
        .collect();
    (0..n)
        .map(|_| {
            let event = usize::from(rng.random_range(0..10) == 0);
            if rng.random_range(0..10) == 0 {
                let r = kcdf.partition_point(|&c| c < rng.random::<f64>()).min(KERNEL_ADDRS - 1);
                Key { pid: FIRST_PID + rng.random_range(0..PIDS), pc: kern[r], kernel: true, event }
            } else {
                let r = ucdf.partition_point(|&c| c < rng.random::<f64>()).min(USER_ADDRS - 1);
                let (pid, pc) = user[r];
                Key { pid, pc, kernel: false, event }
            }
        })
        .collect()
}

fn push(buf: &mut Vec<u8>, kind: u32, misc: u16, body: &[u8]) {
    let size = 8 + body.len().div_ceil(8) * 8;
    buf.extend_from_slice(&kind.to_ne_bytes());
    buf.extend_from_slice(&misc.to_ne_bytes());
    buf.extend_from_slice(&(size as u16).to_ne_bytes());
    buf.extend_from_slice(body);
    buf.resize(buf.len() + (size - 8 - body.len()), 0);
}

fn trailer(b: &mut Vec<u8>, pid: u32, time: u64) {
    for x in [u64::from(pid) | u64::from(pid) << 32, time, 0, IDS[0]] {
        b.extend_from_slice(&x.to_ne_bytes());
    }
}

fn mmap2(buf: &mut Vec<u8>, pid: u32, time: u64, lib: u64) {
    let mut b = Vec::new();
    b.extend_from_slice(&pid.to_ne_bytes());
    b.extend_from_slice(&pid.to_ne_bytes());
    for x in [BASE + lib * 0x10_0000, 0x10_0000, 0] {
        b.extend_from_slice(&x.to_ne_bytes());
    }
    b.extend_from_slice(&[20, 0, 0, 0]);
    b.extend_from_slice(&[lib as u8 + 1; 20]);
    b.extend_from_slice(&5u32.to_ne_bytes());
    b.extend_from_slice(&2u32.to_ne_bytes());
    b.extend_from_slice(format!("/usr/lib/lib{lib}.so\0").as_bytes());
    b.resize(b.len().div_ceil(8) * 8, 0);
    trailer(&mut b, pid, time);
    push(buf, sp::PERF_RECORD_MMAP2, sp::PERF_RECORD_MISC_MMAP_BUILD_ID as u16, &b);
}

fn task(buf: &mut Vec<u8>, kind: u32, pid: u32, time: u64) {
    let mut b = Vec::new();
    for x in [pid, 1, pid, 1] {
        b.extend_from_slice(&x.to_ne_bytes());
    }
    trailer(&mut b, pid, time);
    push(buf, kind, 0, &b);
}

fn comm_exec(buf: &mut Vec<u8>, pid: u32, time: u64) {
    let mut b = Vec::new();
    b.extend_from_slice(&pid.to_ne_bytes());
    b.extend_from_slice(&pid.to_ne_bytes());
    b.extend_from_slice(b"worker\0\0");
    trailer(&mut b, pid, time);
    push(buf, sp::PERF_RECORD_COMM, sp::PERF_RECORD_MISC_COMM_EXEC as u16, &b);
}

/// Lay out pass `n` of `len` records (times `t0 + 10 * i`) into the ring, starting where the
/// last one ended. Returns the number of samples.
fn fill(ring: &BenchRing, keys: &[Key], n: u64, len: usize, t0: u64, rng: &mut StdRng) -> usize {
    let mut buf = Vec::with_capacity(len * sp::SAMPLE_RECORD_SIZE + 4096);
    let mut nsamples = 0;
    for i in 0..len {
        let time = t0 + 10 * i as u64;
        let global = n as usize * len + i;
        // Side-band records among the samples: an mmap in a running process every 4096
        // records, and every 16384 a short-lived process (fork, exec, mmap, exit).
        if global % SIDEBAND_EVERY == SIDEBAND_EVERY / 3 {
            mmap2(&mut buf, FIRST_PID + rng.random_range(0..PIDS), time, rng.random_range(0..LIBS));
            continue;
        }
        if global % (4 * SIDEBAND_EVERY) == 2 * SIDEBAND_EVERY / 3 {
            let pid = FIRST_PID + PIDS + rng.random_range(0..50);
            task(&mut buf, sp::PERF_RECORD_FORK, pid, time);
            comm_exec(&mut buf, pid, time + 1);
            mmap2(&mut buf, pid, time + 2, 0);
            task(&mut buf, sp::PERF_RECORD_EXIT, pid, time + 3);
            continue;
        }
        let k = keys[global % keys.len()];
        let mut b = [0u8; sp::SAMPLE_RECORD_SIZE - 8];
        b[0..8].copy_from_slice(&IDS[k.event].to_ne_bytes());
        b[8..16].copy_from_slice(&k.pc.to_ne_bytes());
        b[16..20].copy_from_slice(&k.pid.to_ne_bytes());
        b[20..24].copy_from_slice(&k.pid.to_ne_bytes());
        b[24..32].copy_from_slice(&time.to_ne_bytes());
        let misc = if k.kernel { sp::MISC_KERNEL } else { 2 };
        push(&mut buf, sp::PERF_RECORD_SAMPLE, misc, &b);
        nsamples += 1;
    }
    let mut data = ring.data.borrow_mut();
    let mut pos = ring.head.get();
    for &byte in &buf {
        data[(pos as usize) & (RING - 1)] = byte;
        pos += 1;
    }
    ring.head.set(pos);
    nsamples
}

fn setup(dir: &std::path::Path) -> Arc<Aggregator> {
    let cfg = ResolverConfig {
        proc_root: dir.join("proc"),
        sys_root: dir.join("sys"),
        jit_map_dir: dir.join("tmp"),
    };
    let agg = Aggregator::new(Resolver::new(cfg), 2);
    let mut sb = Vec::new();
    for pid in FIRST_PID..FIRST_PID + PIDS {
        for lib in 0..LIBS {
            sb.push(TimedSideBand {
                time: 10 + lib,
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
    agg.on_drain(0, 1000, &mut Vec::new(), &mut sb);
    agg.on_drain(1, 1000, &mut Vec::new(), &mut Vec::new());
    agg
}

/// One drain pass: the sampler's own parsing ([`read_pass`]), then the aggregator as sink;
/// without an aggregator, parse only.
fn drain_pass(
    reader: &mut RingReader,
    ring: &BenchRing,
    agg: Option<&Aggregator>,
    until: u64,
    samples: &mut Vec<Sample>,
    sideband: &mut Vec<TimedSideBand>,
) {
    let mut per_event = [0u64; 2];
    read_pass(reader, ring, &IDS, |idx, _| PERIODS[idx], &mut per_event, samples, sideband);
    match agg {
        Some(agg) => agg.on_drain(0, until, samples, sideband),
        None => {
            black_box(&samples);
        }
    }
    samples.clear();
    sideband.clear();
}

/// One benchmark configuration: its own aggregator, ring and clock.
struct Run {
    _dir: tempfile::TempDir,
    agg: Arc<Aggregator>,
    ring: BenchRing,
    rng: StdRng,
    reader: RingReader,
    samples: Vec<Sample>,
    sideband: Vec<TimedSideBand>,
    pass: u64,
    len: usize,
}

impl Run {
    fn new(len: usize) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        Self {
            agg: setup(dir.path()),
            _dir: dir,
            ring: BenchRing {
                data: RefCell::new(vec![0; RING]),
                head: Cell::new(0),
                tail: Cell::new(0),
            },
            rng: StdRng::seed_from_u64(11),
            reader: RingReader::new(),
            samples: Vec::with_capacity(len),
            sideband: Vec::new(),
            pass: 0,
            len,
        }
    }

    /// `iters` passes; returns the time spent draining (parse, and aggregate if `aggregate`).
    fn passes(&mut self, keys: &[Key], iters: u64, aggregate: bool) -> Duration {
        let span = 10 * self.len as u64;
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let t0 = 10_000 + self.pass * span;
            fill(&self.ring, keys, self.pass, self.len, t0, &mut self.rng);
            // CPU 1 is one pass behind: this pass aggregates the previous one's samples.
            self.agg.on_drain(1, t0, &mut Vec::new(), &mut Vec::new());
            let before = self.pass as usize * self.len;
            if before / FLUSH_EVERY != (before + self.len) / FLUSH_EVERY {
                black_box(self.agg.take_resolved(true));
            }
            let agg = aggregate.then_some(&*self.agg);
            let start = Instant::now();
            drain_pass(
                &mut self.reader,
                &self.ring,
                agg,
                t0 + span,
                &mut self.samples,
                &mut self.sideband,
            );
            total += start.elapsed();
            self.pass += 1;
        }
        total
    }
}

fn bench(c: &mut Criterion) {
    let keys = keys(1 << 20);
    let mut g = c.benchmark_group("aggregate");
    g.measurement_time(Duration::from_secs(10));
    for len in PASSES {
        // Samples per pass (side-band records are not counted).
        let per_pass = (0..64)
            .map(|n| {
                let r = Run::new(len);
                let mut rng = StdRng::seed_from_u64(1);
                fill(&r.ring, &keys, n, len, 0, &mut rng) as u64
            })
            .min()
            .unwrap_or(len as u64);
        g.throughput(Throughput::Elements(per_pass));
        let mut run = Run::new(len);
        g.bench_function(format!("parse_and_aggregate/pass_{len}"), |b| {
            b.iter_custom(|iters| run.passes(&keys, iters, true))
        });
        let st = run.agg.stats();
        eprintln!(
            "pass_{len}: {} samples aggregated, {} entries (factor {:.1}), {} evictions, {} \
             early drains, {} asid cache misses, {} table bytes",
            st.samples_aggregated,
            st.entries_created,
            st.samples_aggregated as f64 / st.entries_created.max(1) as f64,
            st.overflow_evictions,
            st.early_drains,
            st.asid_cache_misses,
            st.table_bytes,
        );
        // The parser alone, for comparison (same records, no aggregator).
        let mut run = Run::new(len);
        g.bench_function(format!("parse_only/pass_{len}"), |b| {
            b.iter_custom(|iters| run.passes(&keys, iters, false))
        });
    }
    g.finish();
}

/// The flush thread's share: `Aggregator::take_resolved` (swap out the per-CPU tables, resolve
/// every entry to (image, offset), build the who batch and the `dcpictl top` rows) over what
/// one flush interval leaves in the tables: `FLUSH_SAMPLES` samples, as 5 s at 5 kHz on two
/// CPUs. Only `take_resolved` is timed.
fn bench_flush(c: &mut Criterion) {
    const FLUSH_SAMPLES: usize = 50_000;
    const LEN: usize = 4681;
    let keys = keys(1 << 20);
    let mut g = c.benchmark_group("flush");
    g.measurement_time(Duration::from_secs(10));
    g.throughput(Throughput::Elements(FLUSH_SAMPLES as u64));
    let mut run = Run::new(LEN);
    g.bench_function("take_resolved/50k_samples", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                run.passes(&keys, FLUSH_SAMPLES.div_ceil(LEN) as u64, true);
                let start = Instant::now();
                black_box(run.agg.take_resolved(true));
                total += start.elapsed();
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, bench, bench_flush);
criterion_main!(benches);
