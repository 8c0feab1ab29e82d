//! Per-symbol report on a large binary (>= 50 MB of debug info), cold (empty symbol cache)
//! and warm (populated cache), with and without `--lines`.
//!
//! The binary is `DCPI_BENCH_BINARY` (e.g. GCC's stripped cc1: its `.dynsym` functions are
//! sampled), else the workspace's own debug build of `dcpid`
//! (`<target>/debug/dcpid`, ~80 MB, nearly all DWARF; `cargo build -p dcpi-daemon` first).
//! The profile is synthetic: samples at 4000 function entries spread over the whole binary
//! (so symbol lookup and DWARF are exercised across all compilation units).
//!
//! Run: `cargo bench -p dcpi-client --bench symbol_report`
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use dcpi_client::prof::stats;
use dcpi_client::prof::{run, Args};
use dcpi_testkit::db::{cpu_clock, single_host, Image};
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use profile_format::ImageId;

fn bench_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DCPI_BENCH_BINARY") {
        return Some(PathBuf::from(p));
    }
    // <target>/release/deps/symbol_report-HASH -> <target>/debug/dcpid
    let exe = std::env::current_exe().ok()?;
    let target = exe.parent()?.parent()?.parent()?;
    let p = target.join("debug").join("dcpid");
    p.is_file().then_some(p)
}

/// Build-id and file offsets of every `step`-th function.
fn sample_offsets(data: &[u8], want: usize) -> (Vec<u8>, Vec<u64>, u64) {
    let f = object::File::parse(data).expect("parse bench binary");
    let bid = f.build_id().ok().flatten().expect("bench binary needs a build-id").to_vec();
    let debug_bytes: u64 = f
        .sections()
        .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug")))
        .map(|s| s.size())
        .sum();
    let functions = |syms: object::SymbolIterator<'_, '_>| -> Vec<u64> {
        syms.filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
            .map(|s| s.address())
            .collect()
    };
    let mut addrs = functions(f.symbols());
    if addrs.is_empty() {
        // A stripped binary (GCC's cc1): its exported functions.
        addrs = functions(f.dynamic_symbols());
    }
    addrs.sort_unstable();
    addrs.dedup();
    let step = (addrs.len() / want).max(1);
    let offsets = addrs
        .iter()
        .step_by(step)
        .filter_map(|&a| {
            f.segments().find_map(|seg| {
                let (off, size) = seg.file_range();
                (a >= seg.address() && a - seg.address() < size).then(|| a - seg.address() + off)
            })
        })
        .collect();
    (bid, offsets, debug_bytes)
}

fn make_db(root: &Path, bin: &Path) -> String {
    let data = std::fs::read(bin).expect("read bench binary");
    let (bid, offsets, debug_bytes) = sample_offsets(&data, 4000);
    eprintln!(
        "bench binary {}: {:.1} MB, {:.1} MB of .debug_* sections, {} sampled offsets",
        bin.display(),
        data.len() as f64 / 1e6,
        debug_bytes as f64 / 1e6,
        offsets.len()
    );
    let hd = single_host(root, "bench");
    let counts: Vec<(u64, u64)> =
        offsets.into_iter().enumerate().map(|(i, off)| (off, 1 + (i as u64 % 7))).collect();
    let image = Image::elf(ImageId::BuildId(bid.clone()), bin.display().to_string());
    image.profile(&cpu_clock()).counts(&counts).write(&hd);
    hex::encode(bid)
}

fn report(db: &Path, image: &str, cache: &Path, lines: bool) {
    let mut argv = vec![
        "dcpiprof".to_owned(),
        "--db".into(),
        db.display().to_string(),
        "--host".into(),
        "bench".into(),
        "--no-system-debug".into(),
        "--image".into(),
        image.into(),
        "--format".into(),
        "json".into(),
        "--symbol-cache".into(),
        cache.display().to_string(),
    ];
    if lines {
        argv.push("--lines".into());
    }
    let args = Args::parse_from(argv);
    let mut out = Vec::new();
    let mut err = Vec::new();
    run(&args, &mut out, &mut err).expect("report");
    assert!(out.len() > 1000, "empty report: {}", String::from_utf8_lossy(&err));
}

fn bench(c: &mut Criterion) {
    let Some(bin) = bench_binary() else {
        eprintln!(
            "SKIPPED: no large binary; build one with `cargo build -p dcpi-daemon` or set DCPI_BENCH_BINARY"
        );
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let image = make_db(&db, &bin);
    let mut n = 0u64;
    let mut fresh = || {
        n += 1;
        dir.path().join(format!("cold-{n}.sqlite"))
    };
    let mut g = c.benchmark_group("per_symbol_report_large_binary");
    g.sample_size(10)
        .measurement_time(Duration::from_secs(20))
        .warm_up_time(Duration::from_secs(1));
    for lines in [false, true] {
        let mode = if lines { "lines" } else { "symbols" };
        g.bench_function(format!("{mode}_cold_cache"), |b| {
            b.iter_batched(
                &mut fresh,
                |cache| report(&db, &image, &cache, lines),
                BatchSize::PerIteration,
            )
        });
        let warm = dir.path().join(format!("warm-{mode}.sqlite"));
        report(&db, &image, &warm, lines);
        g.bench_function(format!("{mode}_warm_cache"), |b| {
            b.iter(|| report(&db, &image, &warm, lines))
        });
    }
    g.finish();
    eprintln!("dcpiprof stats over the whole bench: {}", stats::line());
}

criterion_group!(benches, bench);
criterion_main!(benches);
