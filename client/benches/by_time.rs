//! `dcpiprof --by time` on one host's 24 hours of one-minute slices (issue 36: a timeline
//! query of a day in <= 0.3 s).
//!
//! The database is synthetic, written through the profile-format crate: one epoch of one host,
//! 200 images (build-ids), 1440 one-minute slices of 120 000 samples each (2 CPUs at 1 kHz) in
//! 20 000 distinct (image, offset) pairs per minute, Zipf-distributed over the images, the
//! hot offsets moving from minute to minute (slice files about 45 MB); the epoch profiles
//! hold the same samples, with a summary index. A second database holds the same day as dcpid
//! keeps it by default (the first 18 hours rolled up into hour slices, the last 6 in minutes).
//!
//! Slices are stored as dcpid stores them: minutes at 16 bytes of offset resolution, hours
//! rolled up at 256 (FORMAT.md §14.2).
//!
//! Run: `cargo bench -p dcpi-client --bench by_time`. With `DCPI_BENCH_DROP_CACHES=1` (root)
//! it also prints one cold run of each (page cache dropped before it).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use clap::Parser;
use criterion::{criterion_group, criterion_main, Criterion};
use dcpi_client::prof::{run, Args};
use dcpi_testkit::db::base_time;
use dcpi_testkit::db::{cpu_clock, single_host, write_summaries, Image};
use profile_format::{ImageId, Slice, SliceKey, SliceLog};

const IMAGES: u64 = 200;
const MINUTES: u64 = 1440;
const PAIRS: u64 = 20_000;
const SAMPLES: u64 = 120_000;

/// xorshift64: deterministic, no dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A day of slices and the epoch's profiles in `root`; the slices rolled up before
/// `rollup_before` (Unix seconds) when given.
fn build(root: &Path, rollup_before: Option<u64>) -> u64 {
    let hd = single_host(root, "h1");
    let t0 = base_time(0).duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs();
    let t0 = t0 - t0 % 3600;
    let weights: Vec<f64> = (0..IMAGES).map(|i| 1.0 / (i + 1) as f64).collect();
    let wsum: f64 = weights.iter().sum();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut totals: Vec<BTreeMap<u64, u64>> = vec![BTreeMap::new(); IMAGES as usize];
    let mut slices = Vec::with_capacity(MINUTES as usize);
    for m in 0..MINUTES {
        let mut s = Slice { start: t0 + 60 * m, len: 60, ..Slice::default() };
        for (i, w) in weights.iter().enumerate() {
            let pairs = ((PAIRS as f64 * w / wsum) as u64).max(1);
            let per = ((SAMPLES as f64 * w / wsum) as u64 / pairs).max(1);
            // Hot code moves: each minute samples a window of the image's offsets.
            let base = (m * 7 + i as u64 * 13) % 4096 * 16;
            let mut v: Vec<(u64, u64)> = (0..pairs)
                .map(|j| (base + j * 16 + rng.next() % 16, 1 + rng.next() % (2 * per)))
                .collect();
            v.sort_unstable();
            v.dedup_by_key(|p| p.0);
            for &(o, c) in &v {
                *totals[i].entry(o).or_default() += c;
            }
            let key = SliceKey {
                event: "cpu-clock".into(),
                image: Some(ImageId::BuildId(vec![i as u8; 20])),
            };
            s.counts.insert(key, v);
        }
        slices.push(s);
    }
    for (i, s) in slices.iter_mut().enumerate() {
        s.seq = i as u64 + 1;
    }
    // Minutes at 16 bytes of offset resolution, roll-ups at 256: as dcpid stores them.
    let mut log = SliceLog { slices, ..SliceLog::default() }.rollup_at(u64::MAX, 60, 16);
    if let Some(before) = rollup_before {
        log = log.rollup_at(t0 + before, 3600, 256);
    }
    hd.write_slices(&log).expect("write the slice segments");
    let ev = cpu_clock();
    let mut total = 0;
    for (i, t) in totals.iter().enumerate() {
        let counts: Vec<(u64, u64)> = t.iter().map(|(&o, &c)| (o, c)).collect();
        total += counts.iter().map(|c| c.1).sum::<u64>();
        Image::elf(ImageId::BuildId(vec![i as u8; 20]), format!("/usr/lib/lib{i}.so"))
            .profile(&ev)
            .counts(&counts)
            .write(&hd);
    }
    write_summaries(&hd, total);
    total
}

fn args(root: &Path) -> Args {
    let db = root.display().to_string();
    Args::try_parse_from([
        "dcpiprof", "--db", &db, "--host", "h1", "--by", "time", "--format", "json",
    ])
    .expect("args")
}

/// One run; its buckets' sum must be the epoch total.
fn by_time(a: &Args, total: u64) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    run(a, &mut out, &mut err).expect("dcpiprof --by time");
    let v: serde_json::Value = serde_json::from_slice(&out).expect("json");
    assert_eq!(v["total_samples"].as_u64(), Some(total));
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let minutes = dir.path().join("minutes");
    let rolled = dir.path().join("rolled");
    let t = Instant::now();
    let total = build(&minutes, None);
    assert_eq!(build(&rolled, Some(18 * 3600)), total);
    let size = |p: &Path| {
        let db = profile_format::Database::open(p).expect("db");
        let e = db.epochs().expect("epochs").pop().expect("epoch");
        let hd = db.host_dir(&e, "h1").expect("dir");
        let files = hd.slice_paths().expect("slice files");
        files.iter().map(|f| std::fs::metadata(f).expect("slice file").len()).sum::<u64>()
    };
    eprintln!(
        "by_time: built in {:.1} s: {total} samples; slice files {:.1} MB (24 h of minutes), \
         {:.1} MB (18 h rolled up to hours + 6 h of minutes)",
        t.elapsed().as_secs_f64(),
        size(&minutes) as f64 / 1e6,
        size(&rolled) as f64 / 1e6
    );
    let (am, ar) = (args(&minutes), args(&rolled));
    if std::env::var_os("DCPI_BENCH_DROP_CACHES").is_some_and(|v| v == "1") {
        for (name, a) in [("24h of minutes", &am), ("rolled up", &ar)] {
            std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches (needs root)");
            let t = Instant::now();
            by_time(a, total);
            eprintln!("by_time: cold, {name}: {:.3} s", t.elapsed().as_secs_f64());
        }
    }
    let mut g = c.benchmark_group("by_time");
    g.sample_size(10).measurement_time(Duration::from_secs(20));
    g.bench_function("24h_of_1min_slices", |b| b.iter(|| by_time(&am, total)));
    g.bench_function("18h_hours_6h_minutes", |b| b.iter(|| by_time(&ar, total)));
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
