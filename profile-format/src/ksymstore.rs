//! Kernel symbol snapshots stored once per database (FORMAT.md §8.1): content-addressed,
//! compressed files under `<db>/kallsyms/`, referenced from each host directory by a small
//! `kallsyms.ref`. Hosts running the same kernel (same build, same module set and bases) share
//! one file, and so do all epochs of one boot.

use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use flate2::read::ZlibDecoder;
use sha2::{Digest, Sha256};

use crate::atomic::{write_atomic, TMP_PREFIX};
use crate::codec::{self, put_bytes, Reader};
use crate::db::{Database, HostDir};
use crate::error::{Error, Result};
use crate::kallsyms::KallsymsSnapshot;
use crate::safeio;
use crate::safeio::MAX_SMALL_FILE;
use crate::safeio::{open_regular, MAX_CONTAINER_FILE};
use crate::varint;

/// Directory of the shared snapshots, under the database root.
pub const KALLSYMS_DIR: &str = "kallsyms";
/// Name of the reference file in a host directory.
pub const KALLSYMS_REF: &str = "kallsyms.ref";
/// Version of the reference file written by this build: 2 names a snapshot stored in the
/// `.snap.zst` form, which a version 1 reader cannot read (it would report it missing).
pub const KALLSYMS_REF_VERSION: u32 = 2;
const REF_MAGIC: &str = "dcpi-kallsyms-ref";
/// The stored form written since reference version 2: header + zstd frame of the columns.
const SUFFIX: &str = ".snap.zst";
/// The form of reference version 1 (one zlib stream of the canonical bytes): still read.
const SUFFIX_ZLIB: &str = ".snap.z";
/// First bytes of a `.snap.zst` file, then its version (u16 little-endian).
pub const KALLSYMS_ZST_MAGIC: &[u8; 8] = b"DCPIKSZC";
/// Version of the `.snap.zst` form written by this build (and the newest it reads).
pub const KALLSYMS_ZST_VERSION: u16 = 1;
const ZST_HEADER_LEN: usize = 10;
/// Ends each name suffix in the suffix column.
const SUFFIX_END: u8 = b'\n';
/// Precedes a [`SUFFIX_END`] or [`SUFFIX_ESCAPE`] byte inside a suffix.
const SUFFIX_ESCAPE: u8 = 0;
/// zstd level of the stored form. A snapshot is written once per boot and module change, so
/// a slow level is affordable: ~0.2 s of CPU for a 1.3 MB snapshot (BENCHMARKS.md "Kernel
/// symbols").
const ZSTD_LEVEL: i32 = 19;
/// Level 19's own tables (2^22 entries each for a 1.3 MB input) add 34 MiB to the writer's
/// peak RSS, most of dcpid's 20 MiB budget again; 2^18 add 3.5 MiB and cost 2.5 % of size.
const ZSTD_TABLE_LOG: u32 = 18;
/// A 2 MiB window covers the whole column stream of a typical kernel (1.3 MB).
const ZSTD_WINDOW_LOG: u32 = 21;
/// Readers accept windows up to 16 MiB: room for larger kernels, a bound on hostile frames.
const MAX_WINDOW_LOG: u32 = 24;
/// Bound on a decompressed snapshot (the largest kernels give a few MB): a corrupt or hostile
/// file cannot make a reader allocate more.
const MAX_SNAPSHOT: u64 = 256 << 20;

/// The content id of a snapshot: the first 16 bytes of SHA-256 of its canonical file bytes
/// (`KallsymsSnapshot::to_file_bytes`), in lowercase hex.
pub fn kallsyms_id(file_bytes: &[u8]) -> String {
    hex::encode(&Sha256::digest(file_bytes)[..16])
}

fn valid_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

fn corrupt(path: &Path, field: &'static str, detail: impl Into<String>) -> Error {
    Error::Corrupt { path: path.into(), field, detail: detail.into() }
}

/// The symbol records of a canonical snapshot as four column streams (FORMAT.md §8.1): tags,
/// address deltas, `shared` lengths, and the name suffixes, each ended by 0x0a instead of led
/// by its length (0x00 escapes a 0x0a or 0x00 inside a suffix; kallsyms names have neither).
/// Each column holds similar values, which zstd 19 packs 22 % better than the interleaved
/// records (terminators rather than length prefixes, which the text predicts poorly, are 11 %
/// of that). Every other byte of the file (container header, fields 1-6, CRC) is kept as is,
/// so the transposition is exact.
///
/// `canonical` must be a valid `kallsyms.snap` (its container is checked; `path` names it in
/// errors).
pub fn kallsyms_to_columns(canonical: &[u8], path: &Path) -> Result<Vec<u8>> {
    use crate::kallsyms::{KALLSYMS_MAGIC, KALLSYMS_VERSION};
    let payload =
        codec::open(canonical, path, KALLSYMS_MAGIC, "kallsyms snapshot", KALLSYMS_VERSION)?;
    let payload_start = codec::FIXED_HEADER_LEN;
    let mut r = Reader::new(payload, path);
    r.bytes("kernel_release")?;
    r.bytes("kernel_build_id")?;
    r.varint("text_base")?;
    for _ in 0..r.count("modules", 4)? {
        r.bytes("modules.name")?;
        r.varint("modules.base")?;
        r.varint("modules.size")?;
        r.bytes("modules.build_id")?;
    }
    let nsym = r.count("symbols", 2)?;
    let head_end = payload_start + payload.len() - r.remaining();
    let mut cols = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    let mut pos = head_end - payload_start;
    for _ in 0..nsym {
        let tag = copy_varint(payload, &mut pos, &mut cols[0], path, "symbols.kind")?;
        copy_varint(payload, &mut pos, &mut cols[1], path, "symbols.addr")?;
        if tag & 4 == 0 {
            copy_varint(payload, &mut pos, &mut cols[2], path, "symbols.name")?;
            let n = varint::read_u64(payload, &mut pos)
                .map_err(|e| corrupt(path, "symbols.name", e.to_string()))?;
            let left = payload.len() - pos;
            if n > left as u64 {
                return Err(corrupt(path, "symbols.name", format!("{n} bytes with {left} left")));
            }
            for &b in &payload[pos..pos + n as usize] {
                if b == SUFFIX_END || b == SUFFIX_ESCAPE {
                    cols[3].push(SUFFIX_ESCAPE);
                }
                cols[3].push(b);
            }
            cols[3].push(SUFFIX_END);
            pos += n as usize;
        }
    }
    if pos != payload.len() {
        return Err(corrupt(path, "symbols", "bytes after the last symbol"));
    }
    let mut out = Vec::with_capacity(canonical.len());
    put_bytes(&mut out, &canonical[..head_end]);
    for c in &cols {
        put_bytes(&mut out, c);
    }
    put_bytes(&mut out, &canonical[payload_start + payload.len()..]);
    Ok(out)
}

/// The inverse of [`kallsyms_to_columns`]: the canonical bytes, record by record. Any input
/// gives bytes or a `Corrupt` error naming `path` and the column; the output is at most twice
/// as long as the input. (Whether the result is a valid snapshot is for the content id and
/// `KallsymsSnapshot::decode` to say.)
pub fn kallsyms_from_columns(columns: &[u8], path: &Path) -> Result<Vec<u8>> {
    let mut r = Reader::new(columns, path);
    let head = r.bytes("columns.head")?;
    let tags = r.bytes("columns.tags")?;
    let addrs = r.bytes("columns.addrs")?;
    let shared = r.bytes("columns.shared")?;
    let suffixes = r.bytes("columns.suffixes")?;
    let tail = r.bytes("columns.tail")?;
    if r.remaining() > 0 {
        return Err(corrupt(path, "columns", format!("{} bytes after the tail", r.remaining())));
    }
    let mut out = Vec::with_capacity(columns.len());
    out.extend_from_slice(head);
    let (mut t, mut a, mut s, mut x) = (0, 0, 0, 0);
    let mut suffix = Vec::new();
    while t < tags.len() {
        let tag = copy_varint(tags, &mut t, &mut out, path, "columns.tags")?;
        copy_varint(addrs, &mut a, &mut out, path, "columns.addrs")?;
        if tag & 4 == 0 {
            copy_varint(shared, &mut s, &mut out, path, "columns.shared")?;
            suffix.clear();
            loop {
                let b = match suffixes.get(x..) {
                    Some([SUFFIX_END, ..]) => break,
                    Some([SUFFIX_ESCAPE, b @ (SUFFIX_END | SUFFIX_ESCAPE), ..]) => {
                        x += 1;
                        *b
                    }
                    Some([SUFFIX_ESCAPE, ..]) => {
                        return Err(corrupt(
                            path,
                            "columns.suffixes",
                            format!("escape byte not before 0x00 or 0x0a at byte {x}"),
                        ))
                    }
                    Some([b, ..]) => *b,
                    _ => {
                        return Err(corrupt(path, "columns.suffixes", "unterminated suffix"));
                    }
                };
                suffix.push(b);
                x += 1;
            }
            x += 1;
            put_bytes(&mut out, &suffix);
        }
    }
    for (col, pos, field) in [
        (addrs, a, "columns.addrs"),
        (shared, s, "columns.shared"),
        (suffixes, x, "columns.suffixes"),
    ] {
        if pos != col.len() {
            return Err(corrupt(path, field, format!("{} bytes left over", col.len() - pos)));
        }
    }
    out.extend_from_slice(tail);
    Ok(out)
}

/// Copy one varint of `buf` at `*pos` to `out` byte for byte; returns its value.
fn copy_varint(
    buf: &[u8],
    pos: &mut usize,
    out: &mut Vec<u8>,
    path: &Path,
    field: &'static str,
) -> Result<u64> {
    let start = *pos;
    let v = varint::read_u64(buf, pos)
        .map_err(|e| corrupt(path, field, format!("{e} at byte {start}")))?;
    out.extend_from_slice(&buf[start..*pos]);
    Ok(v)
}

fn compress(columns: &[u8]) -> std::io::Result<Vec<u8>> {
    use zstd::zstd_safe::CParameter;
    let mut z = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
    z.set_parameter(CParameter::WindowLog(ZSTD_WINDOW_LOG))?;
    z.set_parameter(CParameter::HashLog(ZSTD_TABLE_LOG))?;
    z.set_parameter(CParameter::ChainLog(ZSTD_TABLE_LOG))?;
    z.compress(columns)
}

/// A `.snap.zst` file's bytes for the canonical snapshot `canonical` (FORMAT.md §8.1).
pub fn pack_kallsyms(canonical: &[u8], path: &Path) -> Result<Vec<u8>> {
    let columns = kallsyms_to_columns(canonical, path)?;
    // One-shot: the frame records the content size (the streaming encoder's does not).
    let frame = compress(&columns).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::with_capacity(ZST_HEADER_LEN + frame.len());
    out.extend_from_slice(KALLSYMS_ZST_MAGIC);
    out.extend_from_slice(&KALLSYMS_ZST_VERSION.to_le_bytes());
    out.extend_from_slice(&frame);
    Ok(out)
}

/// The canonical snapshot bytes of a `.snap.zst` file: header checked, at most 256 MiB
/// decompressed, columns put back in record order. Not checked against a content id.
pub fn unpack_kallsyms(packed: &[u8], path: &Path) -> Result<Vec<u8>> {
    codec::check_prefix(
        packed,
        path,
        KALLSYMS_ZST_MAGIC,
        "kallsyms snapshot (zstd)",
        KALLSYMS_ZST_VERSION,
    )?;
    if packed.len() < ZST_HEADER_LEN {
        return Err(Error::Truncated {
            path: path.into(),
            expected: ZST_HEADER_LEN as u64,
            actual: packed.len() as u64,
        });
    }
    let bad = |e: std::io::Error| corrupt(path, "compressed data", e.to_string());
    let mut decoder =
        zstd::stream::read::Decoder::with_buffer(&packed[ZST_HEADER_LEN..]).map_err(bad)?;
    // A frame asking for a larger window (memory) than any writer uses is refused.
    decoder.window_log_max(MAX_WINDOW_LOG).map_err(bad)?;
    let columns = codec::inflate_bounded(decoder, path, "compressed data", TOO_LARGE)?;
    kallsyms_from_columns(&columns, path)
}

const TOO_LARGE: &str = "decompresses to more than 256 MiB";

fn unpack_zlib(packed: &[u8], path: &Path) -> Result<Vec<u8>> {
    codec::inflate_bounded(ZlibDecoder::new(packed), path, "compressed data", TOO_LARGE)
}

impl Database {
    /// Path of the shared snapshot with content id `id`, in the form this build writes.
    pub fn kallsyms_store_path(&self, id: &str) -> PathBuf {
        self.root().join(KALLSYMS_DIR).join(format!("{id}{SUFFIX}"))
    }

    /// Path of the shared snapshot `id` in the zlib form of reference version 1 (read only).
    pub fn kallsyms_store_path_zlib(&self, id: &str) -> PathBuf {
        self.root().join(KALLSYMS_DIR).join(format!("{id}{SUFFIX_ZLIB}"))
    }

    /// Store a snapshot (its canonical file bytes) unless the database has it already in the
    /// form this build writes. Returns its id and the bytes written (0 if it was there). Two
    /// hosts storing the same snapshot at once write equivalent files; the atomic rename makes
    /// either one win.
    pub fn put_kallsyms(&self, file_bytes: &[u8]) -> Result<(String, u64)> {
        let id = kallsyms_id(file_bytes);
        let path = self.kallsyms_store_path(&id);
        // Only a regular file counts as stored: anything else put there is replaced.
        if fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() > 0) {
            return Ok((id, 0));
        }
        let dir = self.root().join(KALLSYMS_DIR);
        // A real directory, not a link planted by another writer (FORMAT.md §6.1).
        safeio::ensure_dir(&dir)?;
        let packed = pack_kallsyms(file_bytes, &path)?;
        write_atomic(&path, &packed)?;
        Ok((id, packed.len() as u64))
    }

    /// Read and verify the shared snapshot `id`: its `.snap.zst` form, else its `.snap.z`
    /// form; decompressed, its content id must match its name, then it is decoded like a
    /// `kallsyms.snap`. With neither form, an `Io` `NotFound` error naming the `.snap.zst` path.
    pub fn read_kallsyms(&self, id: &str) -> Result<KallsymsSnapshot> {
        let path = self.kallsyms_store_path(id);
        let (path, bytes) = match safeio::read_small(&path, MAX_SNAPSHOT) {
            Ok(packed) => {
                let bytes = unpack_kallsyms(&packed, &path)?;
                (path, bytes)
            }
            Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {
                let old = self.kallsyms_store_path_zlib(id);
                match safeio::read_small(&old, MAX_SNAPSHOT) {
                    Ok(packed) => {
                        let bytes = unpack_zlib(&packed, &old)?;
                        (old, bytes)
                    }
                    // Name the form this build writes: that is the one a reader looks for.
                    Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {
                        return Err(Error::io(path, source))
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        let got = kallsyms_id(&bytes);
        if got != id {
            return Err(corrupt(&path, "content id", format!("content hashes to {got}")));
        }
        KallsymsSnapshot::decode(&bytes, &path)
    }

    /// Remove shared snapshots that no host directory references any more and that are older
    /// than `min_age` (a host writes the snapshot before its reference: a young unreferenced
    /// one may be about to be referenced). Returns the ids removed.
    pub fn gc_kallsyms(&self, now: SystemTime, min_age: Duration) -> Result<Vec<String>> {
        let dir = self.root().join(KALLSYMS_DIR);
        // Never remove files through a link: they would be another directory's.
        if !safeio::check_dir(&dir)? {
            return Ok(Vec::new());
        }
        let entries = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(&dir, e)),
        };
        let mut candidates = Vec::new();
        for e in entries {
            let e = e.map_err(|e| Error::io(&dir, e))?;
            let Ok(name) = e.file_name().into_string() else { continue };
            if name.starts_with(TMP_PREFIX) {
                continue;
            }
            // Both stored forms; an id stored in both has two candidates, each aged on its own.
            let Some(id) = name
                .strip_suffix(SUFFIX)
                .or_else(|| name.strip_suffix(SUFFIX_ZLIB))
                .filter(|id| valid_id(id))
            else {
                continue;
            };
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age >= min_age);
            if old {
                candidates.push((id.to_owned(), e.path()));
            }
        }
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let mut referenced = std::collections::HashSet::new();
        for epoch in self.epochs()? {
            for host in self.hosts(&epoch)? {
                match self.host_dir(&epoch, &host)?.kallsyms_ref() {
                    Ok(Some(id)) => {
                        referenced.insert(id);
                    }
                    Ok(None) => {}
                    // An unreadable reference may name any snapshot: keep them all this time.
                    Err(_) => return Ok(Vec::new()),
                }
            }
        }
        let mut removed = Vec::new();
        for (id, p) in candidates.into_iter().filter(|(id, _)| !referenced.contains(id)) {
            match fs::remove_file(&p) {
                Ok(()) if removed.contains(&id) => {}
                Ok(()) => removed.push(id),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(p, e)),
            }
        }
        Ok(removed)
    }
}

impl HostDir {
    /// The content id this directory references, `None` if it has no `kallsyms.ref`.
    pub fn kallsyms_ref(&self) -> Result<Option<String>> {
        let path = self.kallsyms_ref_path();
        let text = match safeio::read_small_string(&path, MAX_SMALL_FILE) {
            Ok(t) => t,
            Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        };
        let mut lines = text.lines();
        let version = lines
            .next()
            .and_then(|l| l.strip_prefix(REF_MAGIC))
            .and_then(|v| v.trim().parse::<u32>().ok())
            .ok_or_else(|| corrupt(&path, "magic", format!("first line is not `{REF_MAGIC} N`")))?;
        if version == 0 || version > KALLSYMS_REF_VERSION {
            return Err(Error::UnknownVersion {
                path,
                version: u16::try_from(version).unwrap_or(u16::MAX),
                supported: KALLSYMS_REF_VERSION as u16,
            });
        }
        for l in lines {
            if let Some(id) = l.strip_prefix("snapshot ") {
                let id = id.trim();
                if !valid_id(id) {
                    return Err(corrupt(&path, "snapshot", format!("{id:?} is not 32 hex digits")));
                }
                return Ok(Some(id.to_owned()));
            }
        }
        Err(corrupt(&path, "snapshot", "no `snapshot` line"))
    }

    /// Point this directory at the shared snapshot `id` (atomically). Returns the bytes written.
    pub fn write_kallsyms_ref(&self, id: &str) -> Result<u64> {
        let text = format!("{REF_MAGIC} {KALLSYMS_REF_VERSION}\nsnapshot {id}\n");
        write_atomic(&self.kallsyms_ref_path(), text.as_bytes())?;
        Ok(text.len() as u64)
    }

    /// This directory's kernel symbols: the shared snapshot its `kallsyms.ref` names, else the
    /// `kallsyms.snap` of older databases. A directory with neither is an `Io` `NotFound` error
    /// naming `kallsyms.ref`.
    pub fn read_kallsyms(&self) -> Result<KallsymsSnapshot> {
        match self.kallsyms_ref()? {
            Some(id) => Database::open(&self.db_root())?.read_kallsyms(&id),
            None => {
                let legacy = self.kallsyms_path();
                if legacy.symlink_metadata().is_ok() {
                    KallsymsSnapshot::read(&legacy)
                } else {
                    Err(Error::io(
                        self.kallsyms_ref_path(),
                        std::io::Error::new(ErrorKind::NotFound, "no kernel symbol snapshot"),
                    ))
                }
            }
        }
    }

    /// The reference to this host's snapshot in the database's shared store (FORMAT.md §8.1).
    pub fn kallsyms_ref_path(&self) -> PathBuf {
        self.path.join(KALLSYMS_REF)
    }

    /// Open, without reading it, the kernel symbol snapshot that
    /// [`HostDir::read_kallsyms`](crate::HostDir::read_kallsyms) would read: an error if it
    /// (or `kallsyms.ref`) is a FIFO, a device, a symbolic link or larger than any snapshot
    /// ([`Error::is_hostile_file`]); `Ok` otherwise, also when it is missing or damaged (that
    /// is for the reader to report). A few system calls: report tools call it before they
    /// symbolize kernel samples, so that a planted file stops the report with an error naming
    /// it instead of a warning in its middle.
    pub fn check_kallsyms_file(&self) -> Result<()> {
        let hostile = |r: Result<()>| match r {
            Err(e) if e.is_hostile_file() => Err(e),
            _ => Ok(()),
        };
        let path = match self.kallsyms_ref() {
            Ok(Some(id)) => {
                let db = match Database::open(&self.db_root()) {
                    Ok(db) => db,
                    Err(_) => return Ok(()),
                };
                let packed = db.kallsyms_store_path(&id);
                if packed.symlink_metadata().is_ok() {
                    packed
                } else {
                    db.kallsyms_store_path_zlib(&id)
                }
            }
            Ok(None) => self.kallsyms_path(),
            Err(e) => return hostile(Err(e)),
        };
        hostile(open_regular(&path).and_then(|(_, size)| {
            if size > MAX_CONTAINER_FILE {
                return Err(Error::TooLarge { path: path.clone(), limit: MAX_CONTAINER_FILE });
            }
            Ok(())
        }))
    }
}
