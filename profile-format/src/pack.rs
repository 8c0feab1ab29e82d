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

use crate::db::{HostDir, WhoProfileEntry};
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
        let id = [
            m.dev().cast_signed(),
            m.ino().cast_signed(),
            size.cast_signed(),
            m.mtime(),
            m.mtime_nsec(),
        ];
        if let Ok(last) = LAST.lock() {
            if let Some((p, i, pack)) = last.as_ref() {
                if p == path && *i == id {
                    return Ok(Arc::clone(pack));
                }
            }
        }
        let pack = Arc::new(Self::read_from(f, size, path)?);
        if let Ok(mut last) = LAST.lock() {
            *last = Some((path.to_path_buf(), id, Arc::clone(&pack)));
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
                    format!(
                        "record at offset {pos}: a {name_len}-byte name in a {len}-byte record"
                    ),
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
            detail: format!(
                "{}: not a per-process, per-cgroup or per-command profile name",
                path.display()
            ),
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

// Here rather than in db, which must not import the modules that own the files it names (issue 34).
impl HostDir {
    /// Per-process and per-cgroup profile files in this directory (FORMAT.md §5.6), sorted by
    /// name; [`HostDir::profiles`] does not list them.
    ///
    /// The members of the host directory's profile pack (FORMAT.md §15) are listed under
    /// their member paths (`<host dir>/who-profiles.pack/<name>`, which
    /// [`crate::Profile::read`] reads); a member stands for, and hides, a file of the same
    /// name (written before the pack, by an older dcpid or as a sole-command stub's copy).
    /// A damaged or planted pack is an error naming it.
    pub fn who_profiles(&self) -> Result<Vec<WhoProfileEntry>> {
        let mut out = Vec::new();
        let names = crate::db::list_names(&self.path)?;
        let pack = if names.iter().any(|n| n == crate::pack::PACK_FILE) {
            Some(crate::pack::Pack::read_shared(&self.path.join(crate::pack::PACK_FILE))?)
        } else {
            None
        };
        if let Some(pack) = &pack {
            for name in pack.names() {
                let Some((image_id, event, who)) = crate::db::parse_who_profile_name(name) else {
                    continue;
                };
                out.push(WhoProfileEntry {
                    path: pack.member_path(name),
                    image_id,
                    event_component: event.to_owned(),
                    who_component: who.to_owned(),
                });
            }
        }
        for name in names {
            if pack.as_ref().is_some_and(|p| p.member(&name).is_some()) {
                continue;
            }
            let base = crate::db::split_continuation(&name).map(|(b, _)| b);
            let Some((image_id, event, who)) =
                crate::db::parse_who_profile_name(base.as_deref().unwrap_or(&name))
            else {
                continue;
            };
            out.push(WhoProfileEntry {
                path: self.path.join(&name),
                image_id,
                event_component: event.to_owned(),
                who_component: who.to_owned(),
            });
        }
        out.sort_by(|a, b| a.path.file_name().cmp(&b.path.file_name()));
        Ok(out)
    }
}

impl WhoProfileEntry {
    /// Whether it is a member of the host directory's profile pack (FORMAT.md §15), not a
    /// file of its own.
    pub fn is_packed(&self) -> bool {
        split_member_path(&self.path).is_some()
    }
}
