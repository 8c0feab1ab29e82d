//! `dcpilist` on a function of about 10 000 instructions, warm (symbol table from the symbol
//! cache), per instruction (`--asm`) and interleaved with source lines (`--both`).
//!
//! The binary is `DCPI_BENCH_BINARY`, else GCC's cc1 (`cc -print-prog-name=cc1`, as the
//! accuracy benchmark in bench/ uses): the chosen function is the smallest exported one with at
//! least 10 000 instructions. The profile is synthetic: a sample on every third instruction.
//!
//! Run: `cargo bench -p dcpi-client --bench dcpilist`
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use clap::Parser;
use criterion::{criterion_group, criterion_main, Criterion};
use dcpi_client::list::{run, Args};
use dcpi_testkit::db::{cpu_clock, single_host, Image};
use iced_x86::{Decoder, DecoderOptions};
use object::{Object, ObjectSegment, ObjectSymbol};
use profile_format::ImageId;

fn bench_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DCPI_BENCH_BINARY") {
        return Some(PathBuf::from(p));
    }
    let out = Command::new("cc").arg("-print-prog-name=cc1").output().ok()?;
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    p.is_file().then_some(p)
}

/// The function: (name, build-id, file offsets of its instructions).
fn pick_function(data: &[u8]) -> Option<(String, Vec<u8>, Vec<u64>)> {
    let f = object::File::parse(data).ok()?;
    let bid = f.build_id().ok().flatten()?.to_vec();
    let mut cands: Vec<(u64, u64, String)> = f
        .symbols()
        .chain(f.dynamic_symbols())
        .filter(|s| s.kind() == object::SymbolKind::Text && s.size() >= 20_000)
        .filter_map(|s| Some((s.size(), s.address(), s.name().ok()?.to_owned())))
        .collect();
    cands.sort();
    cands.dedup_by_key(|c| c.1);
    for (size, addr, name) in cands {
        let seg = f.segments().find(|s| addr >= s.address() && addr - s.address() < s.size())?;
        let off = addr - seg.address() + seg.file_range().0;
        let code = data.get(off as usize..(off + size) as usize)?;
        let insns: Vec<u64> =
            Decoder::with_ip(64, code, off, DecoderOptions::NONE).iter().map(|i| i.ip()).collect();
        if insns.len() >= 10_000 {
            return Some((name, bid, insns));
        }
    }
    None
}

fn make_db(root: &Path, bin: &Path) -> Option<String> {
    let data = std::fs::read(bin).ok()?;
    let (name, bid, insns) = pick_function(&data)?;
    eprintln!("bench function {name} of {}: {} instructions", bin.display(), insns.len());
    let hd = single_host(root, "bench");
    let counts: Vec<(u64, u64)> =
        insns.iter().enumerate().step_by(3).map(|(i, &off)| (off, 1 + (i as u64 % 5))).collect();
    let image = Image::elf(ImageId::BuildId(bid), bin.display().to_string());
    image.profile(&cpu_clock()).counts(&counts).write(&hd);
    Some(name)
}

fn listing(db: &Path, image: &str, symbol: &str, cache: &Path, mode: &str) -> usize {
    let argv = [
        "dcpilist",
        "--db",
        &db.display().to_string(),
        "--host",
        "bench",
        "--no-system-debug",
        "--image",
        image,
        "--symbol",
        symbol,
        mode,
        "--symbol-cache",
        &cache.display().to_string(),
    ]
    .map(str::to_owned);
    let args = Args::parse_from(argv);
    let mut out = Vec::new();
    let mut err = Vec::new();
    run(&args, &mut out, &mut err).expect("listing");
    assert!(out.len() > 100_000, "short listing: {}", String::from_utf8_lossy(&err));
    out.len()
}

fn bench(c: &mut Criterion) {
    let Some(bin) = bench_binary() else {
        eprintln!("SKIPPED: no cc1 (install gcc) and no DCPI_BENCH_BINARY");
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("db");
    let Some(symbol) = make_db(&db, &bin) else {
        eprintln!("SKIPPED: {} has no function of >= 10 000 instructions", bin.display());
        return;
    };
    let image = bin.display().to_string();
    let cache = dir.path().join("symbols.sqlite");
    let mut g = c.benchmark_group("dcpilist_10k_instructions");
    g.sample_size(20)
        .measurement_time(Duration::from_secs(10))
        .warm_up_time(Duration::from_secs(1));
    for mode in ["--asm", "--both"] {
        // The first run fills the symbol cache (and the page cache): "warm" from then on.
        listing(&db, &image, &symbol, &cache, mode);
        g.bench_function(format!("{}_warm", &mode[2..]), |b| {
            b.iter(|| listing(&db, &image, &symbol, &cache, mode))
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
