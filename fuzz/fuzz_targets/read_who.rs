//! Any input: `WhoTable::decode` returns an error or a table, never panics, and whatever it
//! accepts re-encodes to the same bytes.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use profile_format::WhoTable;

/// The input with its length field and CRC made consistent, so that mutations reach the
/// decompressor and the payload parser instead of stopping at the checksum.
fn with_valid_crc(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < 24 {
        return None;
    }
    let mut v = data.to_vec();
    let n = v.len();
    v[12..20].copy_from_slice(&(n as u64).to_le_bytes());
    let crc = crc32fast::hash(&v[..n - 4]);
    v[n - 4..].copy_from_slice(&crc.to_le_bytes());
    Some(v)
}

fn check(data: &[u8]) {
    if let Ok(t) = WhoTable::decode(data, Path::new("who.tbl")) {
        assert_eq!(t.encode(), data, "accepted a non-canonical encoding");
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if let Some(fixed) = with_valid_crc(data) {
        check(&fixed);
    }
});
