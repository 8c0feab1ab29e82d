//! The profile pack (FORMAT.md §15): round trip, torn tails, hostile records.

use profile_format::pack::{
    append, encode_record, write_whole, Pack, PACK_FILE, PACK_HEADER_LEN, PACK_MAGIC, PACK_VERSION,
};
use profile_format::{
    EpochId, Error, EventDesc, ImageId, ImageKind, Profile, ProfileHeader, ProfileWho,
};

/// body length (u32) + CRC-32 (u32).
const RECORD_HEAD: usize = 8;

fn header() -> Vec<u8> {
    let mut out = PACK_MAGIC.to_vec();
    out.extend_from_slice(&PACK_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

fn profile(build: u8, command: &str, n: u64) -> (String, Vec<u8>) {
    let id = ImageId::from_build_id(&[build; 8]).unwrap();
    let header = ProfileHeader {
        kind: ImageKind::Elf,
        image_id: id.clone(),
        image_path: b"/bin/x".to_vec(),
        event: EventDesc {
            name: "cpu-clock".into(),
            perf_type: 1,
            perf_config: 0,
            period_mean: 1_000_000,
            period_min: 1_000_000,
            period_max: 1_000_000,
        },
        host: "h".into(),
        epoch: EpochId::parse("20240101T000000Z").unwrap(),
        total_samples: 0,
        total_period: 0,
        sequence: 1,
        jit_symbols: vec![],
    };
    let mut p = Profile::new(header);
    p.who = Some(ProfileWho::Command { command: command.as_bytes().to_vec() });
    p.add(0x40, n, n * 1_000_000);
    let name = format!(
        "{}.cpu-clock.{}.prof",
        id.to_text(),
        profile_format::command_file_component(command.as_bytes())
    );
    (name, p.encode())
}

#[test]
fn round_trip_last_record_of_a_name_wins() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(PACK_FILE);
    let (a, a1) = profile(1, "sh", 3);
    let (b, b1) = profile(2, "cc", 5);
    let len = write_whole(&path, [(a.as_str(), &a1[..]), (b.as_str(), &b1[..])]).unwrap();
    let (_, a2) = profile(1, "sh", 9);
    let len2 = append(&path, len, [(a.as_str(), &a2[..])]).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len2);
    let p = Pack::read(&path).unwrap();
    assert!(!p.torn());
    assert_eq!(p.valid_len(), len2);
    assert_eq!(p.names().collect::<Vec<_>>(), {
        let mut v = vec![a.as_str(), b.as_str()];
        v.sort();
        v
    });
    assert_eq!(p.member(&a), Some(&a2[..]));
    assert_eq!(p.member(&b), Some(&b1[..]));
    // Profile::read takes a member's path as it takes a file's.
    let got = Profile::read(&p.member_path(&a)).unwrap();
    assert_eq!(got.header.total_samples, 9);
    let missing = Profile::read(&p.member_path(&a.replace("b01", "b03")));
    assert!(
        matches!(&missing, Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound),
        "{missing:?}"
    );
    // An append to a pack of another length is refused, nothing written.
    assert!(matches!(append(&path, len, [(a.as_str(), &a2[..])]), Err(Error::Invalid { .. })));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len2);
}

#[test]
fn a_torn_tail_is_ignored_at_every_cut() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(PACK_FILE);
    let (a, a1) = profile(1, "sh", 3);
    let len = write_whole(&path, [(a.as_str(), &a1[..])]).unwrap();
    let (_, a2) = profile(1, "sh", 4);
    let full = append(&path, len, [(a.as_str(), &a2[..])]).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    for cut in len as usize..full as usize {
        let p = Pack::decode(bytes[..cut].to_vec(), &path).unwrap();
        assert_eq!(p.member(&a), Some(&a1[..]), "cut at {cut}");
        assert_eq!(p.valid_len(), len);
        assert_eq!(p.torn(), cut > len as usize);
    }
    // A tail the file system allocated but never wrote (zeros) is torn too.
    let mut zeros = bytes.clone();
    zeros.extend_from_slice(&[0; 4096]);
    let p = Pack::decode(zeros, &path).unwrap();
    assert_eq!(p.member(&a), Some(&a2[..]));
    assert!(p.torn());
    // The last record with a flipped byte: torn, the one before it stands.
    let mut flipped = bytes.clone();
    *flipped.last_mut().unwrap() ^= 0x40;
    assert_eq!(Pack::decode(flipped, &path).unwrap().member(&a), Some(&a1[..]));
}

#[test]
fn hostile_records_are_errors_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(PACK_FILE);
    let (a, a1) = profile(1, "sh", 3);
    write_whole(&path, [(a.as_str(), &a1[..]), (a.as_str(), &a1[..])]).unwrap();
    let good = std::fs::read(&path).unwrap();
    let check = |bytes: Vec<u8>, field: &str| {
        let e = Pack::decode(bytes, &path).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(PACK_FILE), "{msg}");
        assert!(msg.contains(field), "{msg}");
    };
    // A length beyond any pack.
    let mut b = good.clone();
    b[PACK_HEADER_LEN..PACK_HEADER_LEN + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    check(b, "record length");
    // A length too short to hold a name.
    let mut b = good.clone();
    b[PACK_HEADER_LEN..PACK_HEADER_LEN + 4].copy_from_slice(&1u32.to_le_bytes());
    check(b, "record length");
    // A damaged record followed by another: not a torn tail.
    let mut b = good.clone();
    b[PACK_HEADER_LEN + RECORD_HEAD + 5] ^= 1;
    check(b, "record checksum");
    // A name longer than its record (checksum made right).
    let rec = {
        let mut body = vec![0xff, 0xff];
        body.extend_from_slice(b"x");
        let mut r = (body.len() as u32).to_le_bytes().to_vec();
        r.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        r.extend_from_slice(&body);
        r
    };
    let mut b = header();
    b.extend_from_slice(&rec);
    check(b, "member name");
    // A name that is no qualified profile's (it could name any file).
    let mut b = header();
    b.extend_from_slice(&encode_record("../../summary.json", &a1));
    check(b, "member name");
    // Foreign magic, newer version, flags.
    let mut b = good.clone();
    b[0] = b'X';
    assert!(matches!(Pack::decode(b, &path), Err(Error::BadMagic { .. })));
    let mut b = good.clone();
    b[8] = 9;
    assert!(matches!(Pack::decode(b, &path), Err(Error::UnknownVersion { .. })));
    let mut b = good;
    b[10] = 1;
    check(b, "flags");
    // A member that is no valid profile: its own container checks name it.
    let mut b = header();
    b.extend_from_slice(&encode_record(&a, b"DCPIPROF garbage"));
    let p = Pack::decode(b.clone(), &path).unwrap();
    std::fs::write(&path, &b).unwrap();
    let e = Profile::read(&p.member_path(&a)).unwrap_err().to_string();
    assert!(e.contains(PACK_FILE) && e.contains(&a), "{e}");
    // A FIFO in its place is refused, not opened for reading.
    std::fs::remove_file(&path).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(&path).status().unwrap().success());
    assert!(matches!(Pack::read(&path), Err(Error::NotRegularFile { .. })));
}
