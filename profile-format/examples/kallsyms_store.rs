//! Size and cost of the stored kernel symbol snapshot (FORMAT.md §8.1, BENCHMARKS.md "Kernel
//! symbols") for the running kernel: the canonical `kallsyms.snap`, the zlib form of reference
//! version 1, zstd of the interleaved records, and the `.snap.zst` columns at several levels,
//! each with the CPU time of writing and reading it (median of `RUNS`, from
//! /proc/self/schedstat, so that other load on the machine does not count).
//!
//! `cargo run --release -p dcpi-profile-format --example kallsyms_store [LEVEL...]`: the
//! levels to try on the columns with zstd's own parameters for each level (default 3 9 15 19
//! 22); `pack_kallsyms` is what the database writes. Last, the peak RSS that `pack_kallsyms`
//! adds to a process, measured in a fresh one.
//! (reads /proc/kallsyms: run as root, or with `kptr_restrict=0`, to get addresses).

// Reads /proc and files it wrote itself (clippy.toml forbids plain reads in the library).
#![allow(clippy::disallowed_methods)]
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::path::Path;

use flate2::read::ZlibDecoder;
use flate2::write::ZlibEncoder;
use profile_format::{kallsyms_to_columns, pack_kallsyms, unpack_kallsyms, KallsymsSnapshot};
use zstd::bulk;

const RUNS: usize = 5;

fn cpu_ns() -> u64 {
    let s = std::fs::read_to_string("/proc/self/schedstat").expect("/proc/self/schedstat");
    s.split_whitespace().next().and_then(|v| v.parse().ok()).expect("schedstat field 1")
}

/// Median CPU seconds of `f` over `RUNS` runs, and its last result.
fn timed<T>(mut f: impl FnMut() -> T) -> (f64, T) {
    let mut times = Vec::new();
    let mut out = None;
    for _ in 0..RUNS {
        let t = cpu_ns();
        out = Some(f());
        times.push(cpu_ns() - t);
    }
    times.sort_unstable();
    (times[RUNS / 2] as f64 / 1e9, out.expect("RUNS > 0"))
}

/// Peak resident set so far, in KiB (`VmHWM` of /proc/self/status).
fn peak_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// In a fresh process (`--rss FILE`), so that reading /proc/kallsyms does not set the peak:
/// what packing the canonical snapshot in FILE adds to the peak RSS.
fn rss_of_pack(file: &str) {
    let canonical = std::fs::read(file).expect("canonical snapshot");
    let before = peak_rss_kib();
    let packed = pack_kallsyms(&canonical, Path::new(file)).expect("pack");
    println!("peak RSS added by pack_kallsyms: {} KiB", peak_rss_kib() - before);
    drop(packed);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, file] = &args[..] {
        if flag == "--rss" {
            return rss_of_pack(file);
        }
    }
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").expect("/proc/kallsyms");
    let modules = std::fs::read_to_string("/proc/modules").unwrap_or_default();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let snap = KallsymsSnapshot::from_proc_text(
        &kallsyms,
        &modules,
        release.trim().to_owned(),
        None,
        &|_| None,
    )
    .expect("parse /proc/kallsyms");
    let p = Path::new("bench.snap");
    let canonical = snap.to_file_bytes(p).expect("encode");
    let packed = pack_kallsyms(&canonical, p).expect("pack");
    println!(
        "kernel {}: {} text symbols, {} modules",
        snap.kernel_release,
        snap.symbols.len(),
        snap.modules.len()
    );
    println!("{:<34} {:>10} {:>10} {:>10}", "form", "bytes", "write s", "read s");
    println!("{:<34} {:>10}", "canonical kallsyms.snap", canonical.len());
    let (w, z) = timed(|| {
        let mut e = ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(&canonical).expect("zlib");
        e.finish().expect("zlib")
    });
    let (r, _) = timed(|| {
        let mut out = Vec::new();
        std::io::Read::read_to_end(&mut ZlibDecoder::new(&z[..]), &mut out).expect("unzlib");
        out
    });
    println!("{:<34} {:>10} {w:>10.3} {r:>10.3}", ".snap.z (zlib 9, records)", z.len());
    let (w, zi) = timed(|| bulk::compress(&canonical, 19).expect("zstd"));
    println!("{:<34} {:>10} {w:>10.3}", "zstd 19 of the records", zi.len());
    let levels: Vec<i32> = args.iter().map(|a| a.parse().expect("level")).collect();
    let levels = if levels.is_empty() { vec![3, 9, 15, 19, 22] } else { levels };
    let cols = kallsyms_to_columns(&canonical, p).expect("columns");
    for level in levels {
        let (w, c) = timed(|| bulk::compress(&cols, level).expect("zstd"));
        println!("{:<34} {:>10} {w:>10.3}", format!("zstd {level} of the columns"), c.len() + 10);
    }
    let (w, repacked) = timed(|| pack_kallsyms(&canonical, p).expect("pack"));
    assert_eq!(repacked, packed, "deterministic");
    let (r, back) = timed(|| unpack_kallsyms(&packed, p).expect("unpack"));
    assert_eq!(back, canonical);
    println!("{:<34} {:>10} {w:>10.3} {r:>10.3}", ".snap.zst (pack_kallsyms)", packed.len());
    let tmp = std::env::temp_dir().join(format!("kallsyms-store-{}.snap", std::process::id()));
    std::fs::write(&tmp, &canonical).expect("temporary snapshot");
    let out = std::process::Command::new(std::env::current_exe().expect("own path"))
        .arg("--rss")
        .arg(&tmp)
        .output()
        .expect("run --rss");
    drop(std::fs::remove_file(&tmp));
    print!("{}", String::from_utf8_lossy(&out.stdout));
}
