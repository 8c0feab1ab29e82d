//! Every damaged file is an error of the right kind, never a panic or a silently wrong profile.

use crate::common;

use std::path::Path;

use profile_format::{Error, KallsymsSnapshot, Profile};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

const P: &str = "/db/epochs/20240521T093000Z/web-01/b00.cpu-clock.prof";

fn fix_crc(bytes: &mut [u8]) {
    let n = bytes.len();
    if n >= 24 {
        let crc = crc32fast::hash(&bytes[..n - 4]);
        bytes[n - 4..].copy_from_slice(&crc.to_le_bytes());
    }
}

#[test]
fn every_single_byte_change_is_detected_with_the_right_error() {
    let good = common::small_profile().encode();
    assert!(good.len() > 100, "test file too small to be realistic: {}", good.len());
    let mut buf = good.clone();
    for pos in 0..good.len() {
        for x in 1..=255u8 {
            buf[pos] ^= x;
            let err = Profile::decode(&buf, Path::new(P))
                .expect_err(&format!("byte {pos} xor {x:#04x} not detected"));
            let ok = match pos {
                0..=7 => matches!(err, Error::BadMagic { .. }),
                // Versions 2 to 4 exist (qualified profiles, sole-command stubs): then the
                // checksum catches it.
                8..=9 if matches!(u16::from_le_bytes([buf[8], buf[9]]), 2..=4) => {
                    matches!(err, Error::ChecksumMismatch { .. })
                }
                8..=9 => matches!(err, Error::UnknownVersion { .. }),
                12..=19 => {
                    matches!(err, Error::Truncated { .. } | Error::Corrupt { field: "length", .. })
                }
                _ => matches!(err, Error::ChecksumMismatch { .. }),
            };
            assert!(ok, "byte {pos} xor {x:#04x}: unexpected error {err}");
            assert!(err.to_string().contains(P), "error does not name the file: {err}");
            buf[pos] ^= x;
        }
    }
    assert_eq!(buf, good);
}

#[test]
fn every_truncation_is_detected_as_truncation() {
    for (name, good) in common::profile_seeds().into_iter().filter(|(n, _)| n.ends_with(".prof")) {
        for len in 0..good.len() {
            let err = Profile::decode(&good[..len], Path::new(P))
                .expect_err(&format!("{name} truncated to {len} bytes accepted"));
            assert!(matches!(err, Error::Truncated { .. }), "{name} at {len}: {err}");
        }
        let mut longer = good.clone();
        longer.push(0);
        let err = Profile::decode(&longer, Path::new(P)).expect_err("appended byte accepted");
        assert!(matches!(err, Error::Corrupt { field: "length", .. }), "{err}");
        assert!(Profile::decode(&good, Path::new(P)).is_ok(), "{name} does not decode");
    }
}

#[test]
fn kallsyms_byte_changes_and_truncations_are_detected() {
    let good = common::small_snapshot().encode();
    let mut buf = good.clone();
    for pos in 0..good.len() {
        for x in [0x01u8, 0x80, 0xff] {
            buf[pos] ^= x;
            assert!(KallsymsSnapshot::decode(&buf, Path::new("k.snap")).is_err(), "{pos} {x}");
            buf[pos] ^= x;
        }
    }
    for len in 0..good.len() {
        let err = KallsymsSnapshot::decode(&good[..len], Path::new("k.snap")).unwrap_err();
        assert!(matches!(err, Error::Truncated { .. }), "{len}: {err}");
    }
    let prof = common::small_profile().encode();
    let err = KallsymsSnapshot::decode(&prof, Path::new("k.snap")).unwrap_err();
    assert!(matches!(err, Error::BadMagic { .. }), "{err}");
}

/// Fields that pass the checksum but make no sense: what a buggy writer could produce.
#[test]
fn semantic_corruption_behind_a_valid_checksum() {
    let good = common::small_profile().encode();
    // Bump the version past what we read.
    let mut v = good.clone();
    v[8] = 5;
    assert!(matches!(
        Profile::decode(&v, Path::new(P)),
        Err(Error::UnknownVersion { version: 5, supported: 4, .. })
    ));
    // A flat payload in a version 2 container: the qualifier is missing.
    let mut v = good.clone();
    v[8] = 2;
    fix_crc(&mut v);
    assert!(Profile::decode(&v, Path::new(P)).is_err(), "a v2 container without a qualifier");
    let mut v = good.clone();
    v[8] = 3;
    fix_crc(&mut v);
    assert!(Profile::decode(&v, Path::new(P)).is_err(), "a v3 container without a qualifier");
    let mut flags = good.clone();
    flags[10] = 1;
    fix_crc(&mut flags);
    assert!(matches!(
        Profile::decode(&flags, Path::new(P)),
        Err(Error::Corrupt { field: "flags", .. })
    ));
    let mut kind = good.clone();
    kind[20] = 9;
    fix_crc(&mut kind);
    assert!(matches!(
        Profile::decode(&kind, Path::new(P)),
        Err(Error::Corrupt { field: "kind", .. })
    ));
    // A zero count: the last count of the body is the byte before the checksum (counts < 128).
    let mut p = common::small_profile();
    let (&last_off, _) = p.counts.iter().next_back().unwrap();
    let last_count = p.counts[&last_off];
    p.counts.insert(last_off, 1);
    p.header.total_samples = p.header.total_samples - last_count + 1;
    let mut zero = p.encode();
    let n = zero.len();
    assert_eq!(zero[n - 5], 1);
    zero[n - 5] = 0;
    fix_crc(&mut zero);
    let err = Profile::decode(&zero, Path::new(P)).unwrap_err();
    assert!(matches!(err, Error::Corrupt { field: "counts.count", .. }), "{err}");
    // Bad UTF-8 in the host name: find "web-01" and break it.
    let mut host = good.clone();
    let at = host.windows(6).position(|w| w == b"web-01").unwrap();
    host[at] = 0xff;
    fix_crc(&mut host);
    let err = Profile::decode(&host, Path::new(P)).unwrap_err();
    assert!(matches!(err, Error::Corrupt { field: "host", .. }), "{err}");
    // Bytes between the body and the checksum.
    let mut trailing = good[..good.len() - 4].to_vec();
    trailing.extend_from_slice(&[0, 0, 0, 0, 0]);
    let len = trailing.len() as u64 + 4;
    trailing[12..20].copy_from_slice(&len.to_le_bytes());
    trailing.extend_from_slice(&[0; 4]);
    fix_crc(&mut trailing);
    let err = Profile::decode(&trailing, Path::new(P)).unwrap_err();
    assert!(matches!(err, Error::Corrupt { field: "trailing bytes", .. }), "{err}");
}

/// Feeds seeds and random mutations (raw, and with the checksum recomputed so that the parser
/// proper is exercised) to both decoders. Nothing may panic; whatever decodes must re-encode to
/// exactly the same bytes (the encoding is canonical).
#[test]
fn random_mutations_never_panic() {
    let mut seeds: Vec<(bool, Vec<u8>)> =
        common::profile_seeds().into_iter().map(|(_, b)| (true, b)).collect();
    seeds.push((false, common::small_snapshot().encode()));
    let mut rng = StdRng::seed_from_u64(0xdc91);
    let mut accepted = 0usize;
    for round in 0..40_000 {
        let (is_profile, seed) = &seeds[round % seeds.len()];
        let mut buf = seed.clone();
        for _ in 0..rng.random_range(1..4) {
            if buf.is_empty() {
                buf.push(rng.random());
                continue;
            }
            let pos = rng.random_range(0..buf.len());
            match rng.random_range(0..4) {
                0 => buf[pos] ^= 1 << rng.random_range(0..8),
                1 => buf[pos] = rng.random(),
                2 => {
                    buf.remove(pos);
                }
                _ => buf.insert(pos, rng.random()),
            }
        }
        if rng.random_bool(0.7) && buf.len() >= 24 {
            let n = buf.len() as u64;
            buf[12..20].copy_from_slice(&n.to_le_bytes());
            fix_crc(&mut buf);
        }
        if *is_profile {
            if let Ok(p) = Profile::decode(&buf, Path::new("m.prof")) {
                assert_eq!(p.encode(), buf, "non-canonical profile accepted");
                accepted += 1;
            }
        } else if let Ok(k) = KallsymsSnapshot::decode(&buf, Path::new("m.snap")) {
            assert_eq!(k.encode(), buf, "non-canonical snapshot accepted");
            accepted += 1;
        }
    }
    // Some mutations (e.g. of a count) keep a file valid; make sure the canonical check ran.
    eprintln!("{accepted} mutated files were valid and re-encoded identically");
}
