//! Any input: `KallsymsSnapshot::decode` returns an error or a snapshot, never panics, and
//! whatever it accepts re-encodes to the same bytes; the same for the input read as a stored
//! `.snap.zst` file (`unpack_kallsyms`) and as its decompressed column stream
//! (`kallsyms_from_columns`, which mutations reach far more often than through zstd), and the
//! columns of every accepted snapshot transpose back to it exactly.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use profile_format::{
    kallsyms_from_columns, kallsyms_to_columns, unpack_kallsyms, KallsymsSnapshot,
};

/// The input with its length field and CRC made consistent, so that mutations reach the
/// payload parser instead of stopping at the checksum.
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
    let p = Path::new("fuzz.snap");
    if let Ok(s) = KallsymsSnapshot::decode(data, p) {
        assert_eq!(s.encode(), data, "accepted a non-canonical encoding");
        if let Some(first) = s.symbols.first() {
            let _ = s.lookup(first.addr);
        }
        let cols = kallsyms_to_columns(data, p).expect("columns of a valid snapshot");
        let back = kallsyms_from_columns(&cols, p).expect("columns read back");
        assert_eq!(back, data, "columns do not transpose back");
    }
}

fn check_with_crc(data: &[u8]) {
    check(data);
    if let Some(fixed) = with_valid_crc(data) {
        check(&fixed);
    }
}

fuzz_target!(|data: &[u8]| {
    check_with_crc(data);
    let p = Path::new("fuzz.snap.zst");
    if let Ok(canonical) = unpack_kallsyms(data, p) {
        check_with_crc(&canonical);
    }
    if let Ok(canonical) = kallsyms_from_columns(data, p) {
        assert!(canonical.len() <= 2 * data.len(), "columns grew more than twofold");
        check_with_crc(&canonical);
    }
});
