//! `who-profiles.pack`: a host-epoch's per-command, per-process and per-cgroup profiles
//! (FORMAT.md §5.6) in one append-only file (FORMAT.md §15).
//!
//! Why one file: on the busy mix a host-epoch held ~500 per-command profiles of ~200 bytes
//! each, and every rewrite of one through `write_atomic` cost a data page, ~3 ext4 metadata
//! blocks (inode, directory, bitmaps) and two fsyncs: the number of files, not their bytes,
//! made dcpid's writes (BENCHMARKS.md "Where dcpid's writes go"). Appending the new versions
//! of the profiles of one publish turn to one file costs the appended bytes and one
//! `fdatasync`.
//!
//! A member is exactly the profile file its name would be (FORMAT.md §4, §5), so readers
//! decode it with the same checks ([`crate::Profile::read`] takes a member's path,
//! `<host dir>/who-profiles.pack/<member name>`, as it takes a file's). The last complete
//! record of a name is that member; a torn tail (a record cut by a crash) is ignored.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::ops::Range;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

/// The pack's file name in a host directory.
pub const PACK_FILE: &str = "who-profiles.pack";
/// First 8 bytes of a pack.
pub const PACK_MAGIC: &[u8; 8] = b"DCPIPACK";
/// The version this build reads and writes.
pub const PACK_VERSION: u16 = 1;
/// magic (8) + version (u16) + flags (u16).
pub const PACK_HEADER_LEN: usize = 12;
/// A pack larger than this is refused (`TooLarge`), as a container file is (FORMAT.md §6.1).
pub const MAX_PACK_FILE: u64 = 256 << 20;
/// body length (u32) + CRC-32 of the body (u32).
const RECORD_HEAD: usize = 8;

/// A pack as read: its bytes and, per member name, where its last complete record's profile
/// bytes are.
#[derive(Debug, Clone)]
pub struct Pack {
    path: PathBuf,
    bytes: Vec<u8>,
    members: BTreeMap<String, Range<usize>>,
    /// Bytes up to the end of the last complete record: where the next append goes.
    valid_len: u64,
}

impl Pack {
    /// Read and check the pack at `path` (opened safely, FORMAT.md §6.1). A torn tail is
    /// ignored ([`Pack::torn`] says so); anything else that is wrong is an error naming the file.
    pub fn read(path: &Path) -> Result<Self> {
        let (f, size) = crate::safeio::open_regular(path)?;
        Self::read_from(f, size, path)
    }

    /// [`Pack::read`], or the pack this process read last if the file is still the same
    /// (device, inode, size, mtime): a report that reads many members of one pack (every
    /// per-cgroup profile of a host, say) reads and checks the pack once, not once per member.
    pub fn read_shared(path: &Path) -> Result<Arc<Self>> {
        use std::os::unix::fs::MetadataExt;
        static LAST: Mutex<Option<(PathBuf, [i64; 5], Arc<Pack>)>> = Mutex::new(None);
        let (f, size) = crate::safeio::open_regular(path)?;
        let m = f.metadata().map_err(|e| Error::io(path, e))?;
        let id = [m.dev() as i64, m.ino() as i64, size as i64, m.mtime(), m.mtime_nsec()];
        if let Ok(last) = LAST.lock() {
            if let Some((p, i, pack)) = last.as_ref() {
                if p == path && *i == id {
                    return Ok(pack.clone());
                }
            }
        }
        let pack = Arc::new(Self::read_from(f, size, path)?);
        if let Ok(mut last) = LAST.lock() {
            *last = Some((path.to_path_buf(), id, pack.clone()));
        }
        Ok(pack)
    }

    fn read_from(mut f: std::fs::File, size: u64, path: &Path) -> Result<Self> {
        if size > MAX_PACK_FILE {
            return Err(Error::TooLarge { path: path.into(), limit: MAX_PACK_FILE });
        }
        let mut bytes = Vec::with_capacity(size as usize);
        let n = (&mut f)
            .take(MAX_PACK_FILE + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| Error::io(path, e))?;
        if n as u64 > MAX_PACK_FILE {
            return Err(Error::TooLarge { path: path.into(), limit: MAX_PACK_FILE });
        }
        Self::decode(bytes, path)
    }

    /// Parse `bytes` as the pack at `path` (used to name it in errors).
    pub fn decode(bytes: Vec<u8>, path: &Path) -> Result<Self> {
        let corrupt = |field: &'static str, detail: String| Error::Corrupt {
            path: path.into(),
            field,
            detail,
        };
        crate::codec::check_prefix(&bytes, path, PACK_MAGIC, "profile pack", PACK_VERSION)?;
        if bytes.len() < PACK_HEADER_LEN {
            return Err(Error::Truncated {
                path: path.into(),
                expected: PACK_HEADER_LEN as u64,
                actual: bytes.len() as u64,
            });
        }
        let flags = u16::from_le_bytes([bytes[10], bytes[11]]);
        if flags != 0 {
            return Err(corrupt("flags", format!("{flags:#06x}, must be 0")));
        }
        let mut members = BTreeMap::new();
        let mut pos = PACK_HEADER_LEN;
        while pos < bytes.len() {
            let left = bytes.len() - pos;
            if left < RECORD_HEAD {
                break; // torn: the record's head was cut
            }
            let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap_or_default());
            let crc = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap_or_default());
            if len == 0 && bytes[pos..].iter().all(|&b| b == 0) {
                break; // torn: blocks allocated by the append, never written
            }
            if (len as u64) > MAX_PACK_FILE || (len as usize) < 2 {
                return Err(corrupt(
                    "record length",
                    format!("record at offset {pos} announces {len} bytes"),
                ));
            }
            let end = pos + RECORD_HEAD + len as usize;
            if end > bytes.len() {
                break; // torn: the record's body was cut
            }
            let body = &bytes[pos + RECORD_HEAD..end];
            let computed = crc32fast::hash(body);
            if computed != crc {
                if end == bytes.len() {
                    break; // torn: the last record was not written whole
                }
                return Err(corrupt(
                    "record checksum",
                    format!(
                        "record at offset {pos}: stored {crc:#010x}, computed {computed:#010x}"
                    ),
                ));
            }
            let name_len = u16::from_le_bytes([body[0], body[1]]) as usize;
            if 2 + name_len > body.len() {
                return Err(corrupt(
                    "member name",
                    format!("record at offset {pos}: a {name_len}-byte name in a {len}-byte record"),
                ));
            }
            let name = std::str::from_utf8(&body[2..2 + name_len])
                .ok()
                .filter(|n| crate::db::parse_who_profile_name(n).is_some())
                .ok_or_else(|| {
                    corrupt(
                        "member name",
                        format!(
                            "record at offset {pos}: {:?} is no per-process, per-cgroup or \
                             per-command profile name",
                            String::from_utf8_lossy(&body[2..2 + name_len])
                        ),
                    )
                })?;
            let start = pos + RECORD_HEAD + 2 + name_len;
            members.insert(name.to_owned(), start..end);
            pos = end;
        }
        Ok(Self { path: path.into(), valid_len: pos as u64, bytes, members })
    }

    /// The pack's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Member names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.members.keys().map(String::as_str)
    }

    /// A member's profile bytes (its last complete record).
    pub fn member(&self, name: &str) -> Option<&[u8]> {
        self.members.get(name).map(|r| &self.bytes[r.clone()])
    }

    /// Every member, sorted by name.
    pub fn members(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.members.iter().map(|(n, r)| (n.as_str(), &self.bytes[r.clone()]))
    }

    /// Bytes up to the end of the last complete record.
    pub fn valid_len(&self) -> u64 {
        self.valid_len
    }

    /// Whether bytes follow the last complete record (a torn append).
    pub fn torn(&self) -> bool {
        self.valid_len < self.bytes.len() as u64
    }

    /// The path under which readers name member `name` (and [`crate::Profile::read`] reads
    /// it): `<pack>/<name>`.
    pub fn member_path(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

/// One record: body length, CRC-32 of the body, body = name length (u16), name, profile.
pub fn encode_record(name: &str, profile: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(2 + name.len() + profile.len());
    body.extend_from_slice(&(name.len() as u16).to_le_bytes());
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(profile);
    let mut out = Vec::with_capacity(RECORD_HEAD + body.len());
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn header() -> Vec<u8> {
    let mut out = Vec::with_capacity(PACK_HEADER_LEN);
    out.extend_from_slice(PACK_MAGIC);
    out.extend_from_slice(&PACK_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

fn check_name(name: &str, path: &Path) -> Result<()> {
    if crate::db::parse_who_profile_name(name).is_none() || name.len() > u16::MAX as usize {
        return Err(Error::Invalid {
            what: "pack member name",
            value: name.to_owned(),
            detail: format!("{}: not a per-process, per-cgroup or per-command profile name", path.display()),
        });
    }
    Ok(())
}

/// Write a whole pack of `members` (name, profile bytes) at `path` atomically
/// ([`crate::write_atomic`]: a new file under an unpredictable name, fsynced, renamed).
/// Returns its length.
pub fn write_whole<'a>(
    path: &Path,
    members: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<u64> {
    let mut out = header();
    for (name, bytes) in members {
        check_name(name, path)?;
        out.extend_from_slice(&encode_record(name, bytes));
    }
    crate::atomic::write_atomic(path, &out)?;
    Ok(out.len() as u64)
}

/// Append `records` (name, profile bytes) to the pack at `path`, which the caller knows to be
/// `expected_len` bytes long, and `fdatasync` it. Returns the new length. A pack of another
/// length (a torn append of a crashed writer, a file replaced behind its back) is refused
/// (`Invalid`) without writing: appending after a torn tail would hide the records behind it,
/// so the caller rewrites the pack whole instead ([`write_whole`]).
pub fn append<'a>(
    path: &Path,
    expected_len: u64,
    records: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<u64> {
    let mut out = Vec::new();
    for (name, bytes) in records {
        check_name(name, path)?;
        out.extend_from_slice(&encode_record(name, bytes));
    }
    let mut f = OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let meta = f.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::NotRegularFile {
            path: path.into(),
            kind: crate::safeio::file_kind(meta.file_type()),
        });
    }
    if meta.len() != expected_len {
        return Err(Error::Invalid {
            what: "profile pack",
            value: path.display().to_string(),
            detail: format!("{} bytes, expected {expected_len}: rewrite it whole", meta.len()),
        });
    }
    f.write_all(&out).map_err(|e| Error::io(path, e))?;
    f.sync_data().map_err(|e| Error::io(path, e))?;
    Ok(expected_len + out.len() as u64)
}

/// `path` split into (pack path, member name) when it names a member of a pack
/// (`<host dir>/who-profiles.pack/<profile name>`).
pub(crate) fn split_member_path(path: &Path) -> Option<(&Path, &str)> {
    let pack = path.parent()?;
    if pack.file_name()? != PACK_FILE {
        return None;
    }
    let name = path.file_name()?.to_str()?;
    crate::db::parse_who_profile_name(name).map(|_| (pack, name))
}

/// The bytes of member `name` of the pack at `pack`: `NotFound` (an `Io` error) when the pack
/// has no such member, as for a missing file.
pub(crate) fn read_member(pack: &Path, name: &str) -> Result<Vec<u8>> {
    let p = Pack::read_shared(pack)?;
    p.member(name).map(<[u8]>::to_vec).ok_or_else(|| {
        Error::io(
            pack.join(name),
            std::io::Error::new(std::io::ErrorKind::NotFound, "no such member in the pack"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EpochId, EventDesc, ImageId, ImageKind, Profile, ProfileHeader, ProfileWho};

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
            crate::command_file_component(command.as_bytes())
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
}
