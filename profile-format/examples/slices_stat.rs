//! Print what a slice log (FORMAT.md §14) holds, as JSON, for bench/slices.py: each record's
//! range, bytes, resolution and samples, and what rolling all of it up into hour slices (at
//! `ROLLUP_RES` bytes, default 256: dcpid's `ROLLUP_RESOLUTION`) would take.
//!
//! `cargo run -p dcpi-profile-format --example slices_stat -- <host dir>/slices.log [ROLLUP_RES]`
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Instant;

use profile_format::{encode_record_at, KeyTable, SliceLog};

fn main() -> std::process::ExitCode {
    let Some(path) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: slices_stat <slices.log>");
        return std::process::ExitCode::from(2);
    };
    let log = match SliceLog::read(&path) {
        Ok(Some(l)) => l,
        Ok(None) => {
            eprintln!("{}: no such slice log", path.display());
            return std::process::ExitCode::from(1);
        }
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::from(1);
        }
    };
    let rollup_res: u64 = std::env::args().nth(2).and_then(|a| a.parse().ok()).unwrap_or(256);
    // Each record's bytes as the writer appended it: keys defined in file order.
    let mut keys = KeyTable::default();
    let mut recs = Vec::new();
    let t0 = Instant::now();
    for s in &log.slices {
        let mut buf = Vec::new();
        let res = log.resolution_of(s);
        encode_record_at(&mut buf, s, &mut keys, res);
        let pairs: usize = s.counts.values().map(Vec::len).sum();
        recs.push(format!(
            "{{\"start\":{},\"len\":{},\"bytes\":{},\"resolution\":{res},\"samples\":{},\"pairs\":{}}}",
            s.start,
            s.len,
            buf.len(),
            s.samples(),
            pairs
        ));
    }
    let encode_s = t0.elapsed().as_secs_f64();
    let hours = log.rollup_at(u64::MAX, 3600, rollup_res);
    let hour_bytes = hours.encode().len();
    println!(
        "{{\"file_bytes\":{},\"valid_len\":{},\"torn_tail\":{},\"samples\":{},\"encode_all_s\":{encode_s},\"rollup_hour_records\":{},\"rollup_bytes\":{hour_bytes},\"records\":[{}]}}",
        std::fs::symlink_metadata(&path).map(|m| m.len()).unwrap_or(0),
        log.valid_len,
        log.torn_tail,
        log.samples(),
        hours.slices.len(),
        recs.join(",")
    );
    std::process::ExitCode::SUCCESS
}
