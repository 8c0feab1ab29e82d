//! Storage of time slices without a live machine (issue 36, BENCHMARKS.md "Time slices"):
//! feed minute slices, synthetic or read from a recorded `slices.log`, through the slice
//! encoders and print, as JSON, the bytes per minute record, per hour record (the minutes
//! rolled up, FORMAT.md §14.1) and the projected slices.log of a day per core:
//!
//!     per core-day = (360 × minute record + 18 × hour record) / cpus
//!
//! (a day-long epoch ends with its last 6 h in minutes and the 18 h before in hours).
//!
//! Synthetic minutes model the busy mix on 2 CPUs at 1 kHz (120 000 samples a
//! minute): a compile loop (cc1, as, the gcc driver), a Python loop, an exec churn loop, and
//! the kernel under all three, each image a set of 16-byte-aligned functions of random sizes
//! whose popularity, and that of the instructions inside each, follows a Zipf law; every minute
//! draws its samples afresh from the same distribution, so hot pairs repeat from minute to
//! minute and the tail does not. `--scale` multiplies the number of functions (more distinct
//! pairs per minute: a noisier machine).
//!
//!     cargo run --release -p dcpi-profile-format --example slices_replay -- synthetic [--minutes 120] [--scale 1] [--seed 1]
//!     cargo run --release -p dcpi-profile-format --example slices_replay -- log <slices.log>
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use profile_format::{encode_record_at, ImageId, KeyTable, Slice, SliceKey, SliceLog};

/// An empty version-2 file (to decode one record back).
fn header_bytes() -> Vec<u8> {
    SliceLog::default().encode()
}

/// A small deterministic generator (PCG-like), so runs are reproducible without a crate.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let x = self.0;
        (x ^ (x >> 33)).wrapping_mul(0xff51afd7ed558ccd) ^ (x >> 29)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Cumulative Zipf weights over `n` ranks with exponent `s`.
fn zipf_cdf(n: usize, s: f64) -> Vec<f64> {
    let mut acc = 0.0;
    let mut v: Vec<f64> = (1..=n)
        .map(|r| {
            acc += 1.0 / (r as f64).powf(s);
            acc
        })
        .collect();
    for x in &mut v {
        *x /= acc;
    }
    v
}

fn pick(cdf: &[f64], u: f64) -> usize {
    cdf.partition_point(|&c| c < u).min(cdf.len() - 1)
}

struct Image {
    key: SliceKey,
    share: f64,
    /// (start, instruction boundaries) per function, in popularity order.
    funcs: Vec<(u64, Vec<u64>)>,
    func_cdf: Vec<f64>,
}

fn synthetic_images(scale: f64, fz: f64, rng: &mut Rng) -> Vec<Image> {
    // (name, functions, share of samples): cc1 dominates the compile loop; the kernel serves
    // all three loops (exec, page faults, I/O); python3.11's eval loop is few, hot functions.
    let spec: [(&str, usize, f64); 8] = [
        ("cc1", 40_000, 0.38),
        ("vmlinux", 30_000, 0.30),
        ("python3.11", 9_000, 0.16),
        ("libc.so.6", 2_500, 0.07),
        ("ld-linux-x86-64.so.2", 300, 0.04),
        ("as", 1_500, 0.02),
        ("bash", 2_000, 0.02),
        ("gcc", 1_500, 0.01),
    ];
    spec.iter()
        .enumerate()
        .map(|(i, &(_, nf, share))| {
            let nf = ((nf as f64) * scale) as usize;
            let mut off = 0x1000u64;
            let mut funcs: Vec<(u64, Vec<u64>)> = (0..nf)
                .map(|_| {
                    // Sizes: exponential, mean ~400 bytes, at least 16, 16-byte aligned.
                    let size = (16.0 - 400.0 * (1.0 - rng.unit()).ln()) as u64 & !15;
                    let mut ins = Vec::new();
                    let mut o = off;
                    while o < off + size {
                        ins.push(o);
                        o += 1 + rng.next() % 7; // x86 instructions: 1-7 bytes, ~4 on average
                    }
                    let f = (off, ins);
                    off += size.max(16);
                    f
                })
                .collect();
            // Popularity order unrelated to the address order.
            for j in (1..funcs.len()).rev() {
                let k = (rng.next() % (j as u64 + 1)) as usize;
                funcs.swap(j, k);
            }
            Image {
                key: SliceKey {
                    event: "cpu-clock".into(),
                    image: Some(ImageId::from_build_id(&[i as u8 + 1; 20]).unwrap()),
                },
                share,
                func_cdf: zipf_cdf(funcs.len(), fz),
                funcs,
            }
        })
        .collect()
}

fn synthetic_minutes(minutes: u64, scale: f64, (fz, iz): (f64, f64), seed: u64) -> Vec<Slice> {
    let mut rng = Rng(seed);
    let images = synthetic_images(scale, fz, &mut rng);
    let img_cdf: Vec<f64> = images
        .iter()
        .scan(0.0, |a, i| {
            *a += i.share;
            Some(*a)
        })
        .collect();
    let total = *img_cdf.last().unwrap();
    let mut ins_cdf: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    let unknown = SliceKey { event: "cpu-clock".into(), image: None };
    (0..minutes)
        .map(|m| {
            let mut counts: BTreeMap<SliceKey, BTreeMap<u64, u64>> = BTreeMap::new();
            for _ in 0..120_000 {
                if rng.next().is_multiple_of(1000) {
                    *counts
                        .entry(unknown.clone())
                        .or_default()
                        .entry(rng.next() % 3)
                        .or_insert(0) += 1;
                    continue;
                }
                let ii = pick(&img_cdf, rng.unit() * total);
                let img = &images[ii];
                let (_, ins) = &img.funcs[pick(&img.func_cdf, rng.unit())];
                let cdf = ins_cdf.entry(ins.len()).or_insert_with(|| zipf_cdf(ins.len(), iz));
                // Instruction popularity: Zipf over a per-function permutation (a fixed hash).
                let r = pick(cdf, rng.unit());
                let at = (r * 7919 + ins[0] as usize) % ins.len();
                *counts.entry(img.key.clone()).or_default().entry(ins[at]).or_insert(0) += 1;
            }
            Slice {
                start: 1_800_000_000 + m * 60,
                len: 60,
                seq: m + 1,
                counts: counts.into_iter().map(|(k, v)| (k, v.into_iter().collect())).collect(),
            }
        })
        .collect()
}

fn pairs(s: &Slice) -> usize {
    s.counts.values().map(Vec::len).sum()
}

/// Mean bytes of the minutes' records appended one by one at `res` (keys defined once).
fn minute_bytes(minutes: &[Slice], res: u64) -> f64 {
    let mut keys = KeyTable::default();
    let mut n = 0;
    for s in minutes {
        let mut buf = Vec::new();
        encode_record_at(&mut buf, s, &mut keys, res);
        n += buf.len();
    }
    n as f64 / minutes.len() as f64
}

/// Bytes per hour of the minutes (at `res`) rolled up into hour slices at `hour_res`: for
/// fewer than 60 minutes, scaled linearly (an upper bound: pairs repeat, so an hour holds
/// fewer than 60 minutes' worth).
fn hour_bytes(minutes: &[Slice], res: u64, hour_res: u64) -> f64 {
    let log = SliceLog {
        slices: minutes.to_vec(),
        resolution: minutes.iter().map(|s| (s.seq, res)).collect(),
        ..Default::default()
    };
    let hours = log.rollup_at(u64::MAX, 3600, hour_res);
    (hours.encode().len() - profile_format::SLICES_HEADER_LEN) as f64 * 60.0 / minutes.len() as f64
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opt = |name: &str, d: f64| -> f64 {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let cpus = opt("--cpus", 2.0);
    let (source, minutes) = match args.first().map(String::as_str) {
        Some("synthetic") => {
            let n = opt("--minutes", 120.0) as u64;
            let scale = opt("--scale", 1.0);
            let seed = opt("--seed", 1.0) as u64;
            let z = (opt("--func-zipf", 1.1), opt("--ins-zipf", 1.0));
            (
                format!("synthetic scale {scale} zipf {z:?} seed {seed}"),
                synthetic_minutes(n, scale, z, seed),
            )
        }
        Some("log") if args.len() > 1 => {
            let p = PathBuf::from(&args[1]);
            match SliceLog::read(&p) {
                Ok(Some(l)) => (
                    p.display().to_string(),
                    l.slices.into_iter().filter(|s| s.len == 60).collect(),
                ),
                Ok(None) => {
                    eprintln!("{}: no such slice log", p.display());
                    return ExitCode::from(1);
                }
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(1);
                }
            }
        }
        _ => {
            eprintln!("usage: slices_replay synthetic [--minutes N] [--scale X] [--seed S] [--cpus C] | log <slices.log> [--cpus C]");
            return ExitCode::from(2);
        }
    };
    if minutes.len() < 2 {
        eprintln!("slices_replay: fewer than 2 whole minute slices");
        return ExitCode::from(1);
    }
    let n = minutes.len() as f64;
    let mean_pairs = minutes.iter().map(pairs).sum::<usize>() as f64 / n;
    let samples = minutes.iter().map(Slice::samples).sum::<u64>() as f64 / n;
    let mut union = Slice::default();
    let mut growth = Vec::new();
    for (i, s) in minutes.iter().enumerate() {
        union.add_counts(&s.counts);
        if [0, 2, 9, 13].contains(&i) {
            growth.push(format!("[{},{}]", i + 1, pairs(&union)));
        }
    }
    // Pairs seen in the previous minute too, and pairs counted once.
    let mut repeated = 0usize;
    let mut ones = 0usize;
    for w in minutes.windows(2) {
        for (k, v) in &w[1].counts {
            let prev: std::collections::HashSet<u64> =
                w[0].counts.get(k).map(|p| p.iter().map(|x| x.0).collect()).unwrap_or_default();
            repeated += v.iter().filter(|x| prev.contains(&x.0)).count();
            ones += v.iter().filter(|x| x.1 == 1).count();
        }
    }
    let later = minutes[1..].iter().map(pairs).sum::<usize>().max(1) as f64;
    let repeated = repeated as f64 / later;
    let ones = ones as f64 / later;
    let mut rows = Vec::new();
    for (mres, hres) in
        [(1u64, 1u64), (1, 256), (16, 16), (16, 64), (16, 256), (16, 4096), (64, 64), (64, 256)]
    {
        let t = Instant::now();
        let m = minute_bytes(&minutes, mres);
        let enc_ms = t.elapsed().as_secs_f64() * 1e3 / n;
        let h = hour_bytes(&minutes, mres, hres);
        let mpairs: f64 = minutes
            .iter()
            .map(|s| {
                let mut k = KeyTable::default();
                let mut b = Vec::new();
                encode_record_at(&mut b, s, &mut k, mres);
                let log = SliceLog::decode(
                    &[&header_bytes()[..], &b[..]].concat(),
                    std::path::Path::new("x"),
                )
                .unwrap();
                pairs(&log.slices[0])
            })
            .sum::<usize>() as f64
            / n;
        rows.push(format!(
            "{{\"minute_resolution\":{mres},\"hour_resolution\":{hres},\"minute_pairs\":{mpairs:.0},\"minute_bytes\":{m:.0},\"hour_bytes\":{h:.0},\"slices_mb_per_core_day\":{:.2},\"encode_ms_per_minute\":{enc_ms:.2}}}",
            (360.0 * m + 18.0 * h) / cpus / 1e6
        ));
    }
    println!(
        "{{\"source\":\"{source}\",\"minutes\":{n},\"cpus\":{cpus},\"samples_per_minute\":{samples:.0},\"pairs_per_minute\":{mean_pairs:.0},\"repeated_from_previous_minute\":{repeated:.3},\"counted_once\":{ones:.3},\"union_pairs_after_minutes\":[{}],\"encodings\":[{}]}}",
        growth.join(","),
        rows.join(",")
    );
    ExitCode::SUCCESS
}
