//! Print what a slice log (FORMAT.md §14) holds, as JSON, for bench/slices.py: each record's
//! range, bytes (as this build encodes it, and as stored in the file, which an older dcpid may
//! have written in an older version), the bytes of its head (version 3: keys and per-key
//! totals), resolution and samples, and what rolling all of it up into hour slices (at
//! `ROLLUP_RES` bytes, default 256: dcpid's `ROLLUP_RESOLUTION`) would take.
//!
//! `cargo run -p dcpi-profile-format --example slices_stat -- <host dir>/slices.log [ROLLUP_RES]`
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::Instant;

use profile_format::{
    encode_record_at, safeio, KeyTable, SliceLog, SLICES_HEADER_LEN, SLICES_VERSION,
};

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
    let file = safeio::read_small(&path, 256 << 20).unwrap_or_default();
    let stored = stored_sizes(&file);
    let version = file.get(8..10).map(|v| u16::from_le_bytes([v[0], v[1]]));
    // Each record's bytes as the writer appended it: keys defined in file order.
    let mut keys = KeyTable::default();
    let mut recs = Vec::new();
    let t0 = Instant::now();
    for (i, s) in log.slices.iter().enumerate() {
        let mut buf = Vec::new();
        let res = log.resolution_of(s);
        encode_record_at(&mut buf, s, &mut keys, res);
        let pairs: usize = s.counts.values().map(Vec::len).sum();
        let stored = stored.get(i).map_or("null".to_owned(), ToString::to_string);
        recs.push(format!(
            "{{\"start\":{},\"len\":{},\"bytes\":{},\"head_bytes\":{},\"stored_bytes\":{stored},\"resolution\":{res},\"samples\":{},\"pairs\":{},\"keys\":{}}}",
            s.start,
            s.len,
            buf.len(),
            head_bytes(&buf),
            s.samples(),
            pairs,
            s.counts.len()
        ));
    }
    let encode_s = t0.elapsed().as_secs_f64();
    let hours = log.rollup_at(u64::MAX, 3600, rollup_res);
    let hour_bytes = hours.encode().len();
    println!(
        "{{\"file_version\":{},\"encoded_version\":{SLICES_VERSION},\"file_bytes\":{},\"valid_len\":{},\"torn_tail\":{},\"samples\":{},\"encode_all_s\":{encode_s},\"rollup_hour_records\":{},\"rollup_bytes\":{hour_bytes},\"records\":[{}]}}",
        version.map_or("null".to_owned(), |v| v.to_string()),
        std::fs::symlink_metadata(&path).map(|m| m.len()).unwrap_or(0),
        log.valid_len,
        log.torn_tail,
        log.samples(),
        hours.slices.len(),
        recs.join(",")
    );
    std::process::ExitCode::SUCCESS
}

/// Bytes of each complete record of the file as stored (frame included), in file order.
fn stored_sizes(b: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut pos = SLICES_HEADER_LEN;
    while pos + 8 <= b.len() {
        let len = u32::from_le_bytes([b[pos], b[pos + 1], b[pos + 2], b[pos + 3]]) as usize;
        if pos + 8 + len > b.len() {
            break;
        }
        out.push(8 + len);
        pos += 8 + len;
    }
    out
}

/// The stored head of a framed version 3 record (FORMAT.md §14.2: after start, len, seq, the
/// resolution and the head codec, a varint length and the head), its length varint included.
fn head_bytes(rec: &[u8]) -> usize {
    let body = &rec[8..];
    let mut pos = 0;
    let varint = |pos: &mut usize| {
        let (mut v, mut shift) = (0u64, 0);
        while let Some(&b) = body.get(*pos) {
            *pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b < 0x80 {
                break;
            }
        }
        v
    };
    for _ in 0..3 {
        varint(&mut pos);
    }
    pos += 2;
    let at = pos;
    let n = varint(&mut pos) as usize;
    pos - at + n
}
