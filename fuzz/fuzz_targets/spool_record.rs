//! Any bytes as the records of a spool segment (after its magic): `len u32 LE, crc u32 LE,
//! payload`, the CRC not checked here so that mutations reach the decoder. The decoder returns
//! an error or a record, never panics, and definitions carry from one record to the next as
//! when a segment is read at start.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut payloads = Vec::new();
    let mut rest = data;
    while rest.len() >= 8 {
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let body = &rest[8..];
        let take = len.min(body.len());
        payloads.push(&body[..take]);
        rest = &body[take..];
    }
    if payloads.is_empty() {
        payloads.push(data);
    }
    let n = dcpid::store::spool::decode_records(payloads.iter().copied());
    assert!(n <= payloads.len());
});
