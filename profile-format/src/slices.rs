//! `slices.log`: a host-epoch's sample counts per time slice (FORMAT.md §14).
//!
//! One append-only file per host directory: a 16-byte header, then framed records, each
//! `len u32 | crc32 u32 | body`. A record is visible only when complete (its length fits in
//! the file and its checksum matches), so a torn tail, left by a crash or still being written
//! by the owning host, is ignored by readers and truncated by the writer before its next
//! append. Each record holds one slice `[start, start + len)` (Unix seconds) and the counts of
//! that slice's samples per (image, event) key and offset; keys are defined once per file, in
//! the record that first uses them, and referred to by index afterwards. Old slices are rolled
//! up into coarser ones by rewriting the file atomically ([`SliceLog::rollup`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::codec::{corrupt, inflate_bounded, put_bytes, Reader};
use crate::db::HostDir;
use crate::error::{Error, Result};
use crate::ident::ImageId;
use crate::safeio;
use crate::safeio::{open_regular, MAX_CONTAINER_FILE};
use crate::varint;

/// File name of the slice log in a host directory.
pub const SLICES_FILE: &str = "slices.log";
/// First 8 bytes of a slice log.
pub const SLICES_MAGIC: &[u8; 8] = b"DCPISLC\0";
/// The format version this build writes and the newest it reads (it reads versions 1 and 2
/// too). Version 3 keeps each record's keys and per-key totals in a head apart from its
/// offsets and counts (FORMAT.md §14.2), so that totals are read without the pairs.
pub const SLICES_VERSION: u16 = 3;
/// magic (8) + version (u16) + flags (u16) + CRC-32 of the first 12 bytes (u32).
pub const SLICES_HEADER_LEN: usize = 16;
/// len (u32) + crc (u32) before each record body.
const FRAME_LEN: usize = 8;
/// Largest record body (a minute of a busy 64-core host is a few MB).
pub const MAX_RECORD: usize = 64 << 20;
/// Largest decompressed record payload.
const MAX_PAYLOAD: u64 = 256 << 20;
/// Payload codes.
const CODEC_RAW: u8 = 0;
const CODEC_ZSTD: u8 = 1;
/// Largest offset resolution (log2 of bytes) a version 2 record may state: 4 KiB, a page.
pub const MAX_RESOLUTION_SHIFT: u8 = 12;
/// zstd level of record payloads: level 3 costs ~1 ms per 40 KB slice here and halves it.
const ZSTD_LEVEL: i32 = 3;
/// Payloads smaller than this are stored raw (zstd's frame costs more than it saves).
const COMPRESS_FROM: usize = 128;

/// What a count is attributed to: an image's profile of an event, or (`image: None`) the
/// event's unknown samples (offsets are then `UnknownReason` codes, as in `unknown.*.prof`).
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SliceKey {
    pub event: String,
    pub image: Option<ImageId>,
}

/// One slice: `[start, start + len)` in Unix seconds, and its counts per key and offset.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Slice {
    pub start: u64,
    pub len: u64,
    /// The writer's record sequence (strictly increasing in a file; FORMAT.md §14.3).
    pub seq: u64,
    /// Per key: (offset, count) with offsets strictly increasing and counts ≥ 1.
    pub counts: BTreeMap<SliceKey, Vec<(u64, u64)>>,
}

impl Slice {
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.len)
    }

    /// Samples in the slice.
    pub fn samples(&self) -> u64 {
        self.counts.values().flatten().fold(0u64, |a, (_, c)| a.saturating_add(*c))
    }

    /// Add `other`'s counts into this slice's (the range is the caller's business).
    pub fn add_counts(&mut self, other: &BTreeMap<SliceKey, Vec<(u64, u64)>>) {
        for (k, v) in other {
            let mine = self.counts.entry(k.clone()).or_default();
            *mine = merge_pairs(mine, v);
        }
    }
}

/// Sum two sorted (offset, count) lists.
pub fn merge_pairs(a: &[(u64, u64)], b: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::with_capacity(a.len().max(b.len()));
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x.0 == y.0 => {
                out.push((x.0, x.1.saturating_add(y.1)));
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if x.0 < y.0 => {
                out.push(*x);
                i += 1;
            }
            (Some(x), None) => {
                out.push(*x);
                i += 1;
            }
            (_, Some(y)) => {
                out.push(*y);
                j += 1;
            }
            (None, None) => break,
        }
    }
    out
}

/// A slice log as read: its slices in file order, and what was ignored at its end.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct SliceLog {
    pub slices: Vec<Slice>,
    /// Bytes of complete records (header included): where the writer appends next.
    pub valid_len: u64,
    /// Bytes after them: an incomplete record (torn by a crash, or being appended).
    pub torn_tail: u64,
    /// Offset resolution in bytes (a power of two) by `seq`, of the slices not exact
    /// (FORMAT.md §14.2, version 2); read it with [`SliceLog::resolution_of`].
    pub resolution: BTreeMap<u64, u64>,
}

/// The slices of a time range, and the range they exactly cover.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct SliceRange<'a> {
    /// Slices intersecting the requested range, in order of start.
    pub slices: Vec<&'a Slice>,
    /// `[min start, max end)` of those slices: the request rounded outwards to the stored
    /// resolution. `None`: no slice intersects the range.
    pub covered: Option<(u64, u64)>,
}

impl SliceRange<'_> {
    /// Per key, the summed (offset, count) of the selected slices.
    pub fn sum(&self) -> BTreeMap<SliceKey, Vec<(u64, u64)>> {
        let mut acc = Slice::default();
        for s in &self.slices {
            acc.add_counts(&s.counts);
        }
        acc.counts
    }

    pub fn samples(&self) -> u64 {
        self.slices.iter().map(|s| s.samples()).sum()
    }
}

/// A slice log read as totals ([`SliceLog::read_totals`]): per slice, the samples of each key.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct SliceTotals {
    /// The keys the slices refer to by index.
    pub keys: Vec<SliceKey>,
    /// Slices in file order.
    pub slices: Vec<SliceTotal>,
    /// Offset resolution by `seq` of the slices not exact, as [`SliceLog::resolution`].
    pub resolution: BTreeMap<u64, u64>,
}

/// One slice's totals: `[start, start + len)` and (key index, samples) with samples ≥ 1.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct SliceTotal {
    pub start: u64,
    pub len: u64,
    pub seq: u64,
    pub totals: Vec<(usize, u64)>,
}

impl SliceTotal {
    pub fn end(&self) -> u64 {
        self.start.saturating_add(self.len)
    }
}

impl SliceTotals {
    /// Decode a whole file's bytes as totals; `path` names it in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self> {
        decode_totals(bytes, path, &mut |_| ())
    }

    /// The offset resolution of `s`, one of these slices, in bytes ([`SliceLog::resolution_of`]).
    pub fn resolution_of(&self, s: &SliceTotal) -> u64 {
        self.resolution.get(&s.seq).copied().unwrap_or(1)
    }

    /// Slices intersecting `[since, until)` (Unix seconds; `None`: unbounded), as
    /// [`SliceLog::range`] chooses them.
    pub fn range(&self, since: Option<u64>, until: Option<u64>) -> Vec<&SliceTotal> {
        let since = since.unwrap_or(0);
        let until = until.unwrap_or(u64::MAX);
        let mut v: Vec<&SliceTotal> =
            self.slices.iter().filter(|s| s.start < until && s.end() > since).collect();
        v.sort_by_key(|s| (s.start, s.seq));
        v
    }
}

/// A file's bytes as totals; `record(body range)` is called for each record, in file order.
fn decode_totals(
    bytes: &[u8],
    path: &Path,
    record: &mut dyn FnMut(std::ops::Range<usize>),
) -> Result<SliceTotals> {
    let mut keys: Vec<SliceKey> = Vec::new();
    let mut index: BTreeMap<SliceKey, usize> = BTreeMap::new();
    let mut slices = Vec::new();
    let mut resolution = BTreeMap::new();
    walk_records(bytes, path, |body, at, version| {
        let (head, totals) = record_totals(body, path, at, version, &mut keys, &mut index)?;
        if head.shift > 0 {
            resolution.insert(head.seq, 1u64 << head.shift);
        }
        slices.push(SliceTotal { start: head.start, len: head.len, seq: head.seq, totals });
        record(at + FRAME_LEN..at + FRAME_LEN + body.len());
        Ok(head.seq)
    })?;
    Ok(SliceTotals { keys, slices, resolution })
}

/// Slice logs read as totals ([`SliceTotals`]) whose pairs can then be decoded record by
/// record ([`SliceIndex::pairs`]): what the freshness merge reads (FORMAT.md §7.3), which
/// needs every key and range but the pairs of only a few recent slices, if any. In version 3
/// the totals come from the records' heads without decompressing their columns.
#[derive(Default)]
pub struct SliceIndex {
    pub totals: SliceTotals,
    files: Vec<IndexFile>,
    /// Per slice of `totals` (same order): its file in `files` and its record body's bytes.
    records: Vec<(usize, std::ops::Range<usize>)>,
}

/// A file of a [`SliceIndex`]: its bytes, and its key indexes in the index's key table.
struct IndexFile {
    path: PathBuf,
    bytes: Vec<u8>,
    version: u16,
    keys: Vec<usize>,
}

impl std::fmt::Debug for SliceIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SliceIndex")
            .field("totals", &self.totals)
            .field("files", &self.files.iter().map(|x| &x.path).collect::<Vec<_>>())
            .finish()
    }
}

impl SliceIndex {
    /// Read `path` as [`SliceLog::read`] does (the same checks on framing, checksums, keys
    /// and totals; the columns are checked when [`SliceIndex::pairs`] decodes them).
    /// `Ok(None)`: no such file.
    pub fn read(path: &Path) -> Result<Option<Self>> {
        match read_bytes(path)? {
            Some(bytes) => Self::decode(bytes, path).map(Some),
            None => Ok(None),
        }
    }

    /// Decode a whole file's bytes (kept, for [`SliceIndex::pairs`]).
    pub fn decode(bytes: Vec<u8>, path: &Path) -> Result<Self> {
        let mut records = Vec::new();
        let totals = decode_totals(&bytes, path, &mut |r| records.push((0, r)))?;
        let version = check_header(&bytes, path)?;
        let keys = (0..totals.keys.len()).collect();
        let files = vec![IndexFile { path: path.into(), bytes, version, keys }];
        Ok(Self { totals, files, records })
    }

    /// The (offset, count) pairs of slice `i` of [`SliceIndex::totals`] for the keys (indexes
    /// into its `keys`) that `want` selects, in key order; a selected key the slice does not
    /// have is not listed. Offsets are at the slice's resolution ([`SliceTotals::resolution_of`]).
    pub fn pairs(
        &self,
        i: usize,
        want: &dyn Fn(usize) -> bool,
    ) -> Result<Vec<(usize, Vec<(u64, u64)>)>> {
        let (f, range) = &self.records[i];
        let file = &self.files[*f];
        let path = file.path.as_path();
        let at = range.start - FRAME_LEN;
        let parts = record_parts(&file.bytes[range.clone()], path, at, file.version)?;
        let mut p = Reader::new(&parts.entries, path);
        skip_new_keys(&mut p)?;
        let v3 = parts.columns.is_some();
        let (entries, total) = read_entries(&mut p, file.keys.len(), v3)?;
        let key = |e: &Entry| file.keys[e.key];
        let shift = |e: &Entry| {
            if self.totals.keys[key(e)].image.is_some() {
                u32::from(parts.head.shift)
            } else {
                0
            }
        };
        let pairs = with_columns(p, parts.columns, path, at, |c| {
            read_columns(c, &entries, total, &shift, &|e| want(key(e)), v3)
        })?;
        Ok(entries.iter().zip(pairs).filter_map(|(e, v)| v.map(|v| (key(e), v))).collect())
    }

    /// Several files' indexes as one: keys merged into one table, sequences renumbered.
    pub(crate) fn combine(parts: Vec<Self>) -> Self {
        let mut out = Self::default();
        let mut index: BTreeMap<SliceKey, usize> = BTreeMap::new();
        for part in parts {
            let map: Vec<usize> = part
                .totals
                .keys
                .iter()
                .map(|k| {
                    *index.entry(k.clone()).or_insert_with(|| {
                        out.totals.keys.push(k.clone());
                        out.totals.keys.len() - 1
                    })
                })
                .collect();
            let first_file = out.files.len();
            for mut f in part.files {
                for k in &mut f.keys {
                    *k = map[*k];
                }
                out.files.push(f);
            }
            for (mut s, (f, r)) in part.totals.slices.into_iter().zip(part.records) {
                let res = part.totals.resolution.get(&s.seq).copied();
                s.seq = out.totals.slices.len() as u64 + 1;
                for t in &mut s.totals {
                    t.0 = map[t.0];
                }
                if let Some(r) = res {
                    out.totals.resolution.insert(s.seq, r);
                }
                out.totals.slices.push(s);
                out.records.push((first_file + f, r));
            }
        }
        out
    }
}

impl SliceLog {
    /// Read `path` ([`SLICES_FILE`] of a host directory) the way every database file is read
    /// (FORMAT.md §6.1): `O_NOFOLLOW|O_NONBLOCK`, a regular file only, at most
    /// [`MAX_CONTAINER_FILE`] bytes. `Ok(None)`: there is no such file (a database written
    /// before §14, or slices off): no time axis. Errors name the file.
    pub fn read(path: &Path) -> Result<Option<Self>> {
        match read_bytes(path)? {
            Some(bytes) => Self::decode(&bytes, path).map(Some),
            None => Ok(None),
        }
    }

    /// Decode a whole file's bytes; `path` names it in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self> {
        Self::decode_full(bytes, path).map(|d| d.log)
    }

    /// [`SliceLog::decode`], with what a writer continuing the file needs.
    fn decode_full(bytes: &[u8], path: &Path) -> Result<Decoded> {
        let mut resolution = BTreeMap::new();
        let mut keys: Vec<SliceKey> = Vec::new();
        let mut index: BTreeMap<SliceKey, usize> = BTreeMap::new();
        let mut slices = Vec::new();
        let (pos, version) = walk_records(bytes, path, |body, at, version| {
            let (head, entries) = decode_record(body, path, at, version, &mut keys, &mut index)?;
            let out = entries.into_iter().map(|(i, v)| (keys[i].clone(), v)).collect();
            if head.shift > 0 {
                resolution.insert(head.seq, 1u64 << head.shift);
            }
            slices.push(Slice { start: head.start, len: head.len, seq: head.seq, counts: out });
            Ok(head.seq)
        })?;
        let log = Self {
            slices,
            valid_len: pos as u64,
            torn_tail: (bytes.len() - pos) as u64,
            resolution,
        };
        Ok(Decoded { log, version })
    }

    /// Read only each slice's total per key (what a timeline of images needs): the same
    /// checks as [`SliceLog::read`], without building the per-offset lists (measured: most of
    /// a day's `--by time`, BENCHMARKS.md). `Ok(None)`: no such file.
    pub fn read_totals(path: &Path) -> Result<Option<SliceTotals>> {
        match read_bytes(path)? {
            Some(bytes) => SliceTotals::decode(&bytes, path).map(Some),
            None => Ok(None),
        }
    }

    /// Slices intersecting `[since, until)` (Unix seconds; `None`: unbounded), ordered by
    /// start, and the exact range they cover.
    pub fn range(&self, since: Option<u64>, until: Option<u64>) -> SliceRange<'_> {
        let since = since.unwrap_or(0);
        let until = until.unwrap_or(u64::MAX);
        let mut slices: Vec<&Slice> =
            self.slices.iter().filter(|s| s.start < until && s.end() > since).collect();
        slices.sort_by_key(|s| (s.start, s.seq));
        let covered = slices.iter().fold(None, |acc: Option<(u64, u64)>, s| {
            Some(acc.map_or((s.start, s.end()), |(a, b)| (a.min(s.start), b.max(s.end()))))
        });
        SliceRange { slices, covered }
    }

    /// Samples of every slice.
    pub fn samples(&self) -> u64 {
        self.slices.iter().map(Slice::samples).sum()
    }

    /// The next record sequence a writer uses.
    pub fn next_seq(&self) -> u64 {
        self.slices.iter().map(|s| s.seq).max().unwrap_or(0) + 1
    }

    /// Roll up: slices that end at or before `before` are merged, per `coarse`-second bucket
    /// of their start (aligned to Unix time, so hosts agree), into one slice each covering
    /// exactly its members' hull; later slices stay as they are. Every sample is kept. The
    /// result is ordered by start, sequences renumbered from 1. A merged slice has the
    /// coarsest offset resolution of its members.
    pub fn rollup(&self, before: u64, coarse: u64) -> Self {
        self.rollup_at(before, coarse, 1)
    }

    /// [`SliceLog::rollup`], the merged slices' offsets at a resolution of at least
    /// `resolution` bytes (rounded down to a power of two, at most 2^[`MAX_RESOLUTION_SHIFT`]):
    /// what falls in one bucket is added up (per-key totals stay exact).
    pub fn rollup_at(&self, before: u64, coarse: u64, resolution: u64) -> Self {
        let coarse = coarse.max(1);
        let resolution = 1u64 << shift_of(resolution);
        // Per bucket: the merged slice and its resolution.
        let mut buckets: BTreeMap<u64, (Slice, u64)> = BTreeMap::new();
        let mut keep: Vec<(Slice, u64)> = Vec::new();
        for s in &self.slices {
            if s.end() <= before {
                let b = s.start - s.start % coarse;
                let (e, res) = buckets.entry(b).or_insert_with(|| {
                    (
                        Slice { start: s.start, len: s.len, seq: 0, counts: BTreeMap::new() },
                        resolution,
                    )
                });
                let end = e.end().max(s.end());
                e.start = e.start.min(s.start);
                e.len = end - e.start;
                e.add_counts(&s.counts);
                *res = (*res).max(self.resolution_of(s));
            } else {
                keep.push((s.clone(), self.resolution_of(s)));
            }
        }
        // Bucketed here as the file will store them, so that the result reads back equal.
        let mut slices: Vec<(Slice, u64)> = buckets
            .into_values()
            .chain(keep)
            .map(|(s, res)| (if res > 1 { bucket(&s, res) } else { s }, res))
            .collect();
        slices.sort_by_key(|s| (s.0.start, s.0.seq));
        let mut res_by_seq = BTreeMap::new();
        for (i, (s, res)) in slices.iter_mut().enumerate() {
            s.seq = i as u64 + 1;
            if *res > 1 {
                res_by_seq.insert(s.seq, *res);
            }
        }
        Self {
            slices: slices.into_iter().map(|x| x.0).collect(),
            valid_len: 0,
            torn_tail: 0,
            resolution: res_by_seq,
        }
    }

    /// The whole file for these slices (what a roll-up writes atomically), in the current
    /// version, each slice at its [`SliceLog::resolution_of`].
    pub fn encode(&self) -> Vec<u8> {
        let mut out = header();
        let mut keys = KeyTable::default();
        for s in &self.slices {
            encode_record_at(&mut out, s, &mut keys, self.resolution_of(s));
        }
        out
    }

    /// The offset resolution of `s`, one of this log's slices, in bytes: its image keys'
    /// offsets are multiples of it, each standing for the samples of
    /// `[offset, offset + resolution)` (FORMAT.md §14.2); 1: exact. Unknown-sample keys
    /// (no image) are always exact.
    pub fn resolution_of(&self, s: &Slice) -> u64 {
        self.resolution.get(&s.seq).copied().unwrap_or(1)
    }

    /// The coarsest resolution among a range's slices (what a report over it states).
    pub fn range_resolution(&self, r: &SliceRange<'_>) -> u64 {
        r.slices.iter().map(|s| self.resolution_of(s)).max().unwrap_or(1)
    }

    /// A range's counts summed per offset resolution (finest first): offsets of different
    /// resolutions must not be added up as if they were the same offsets (a 256-byte block at
    /// 0x100 is not the 16-byte block at 0x100), so a reader combining them with exact profile
    /// offsets places each group at its own resolution first (FORMAT.md §14.2).
    pub fn range_sums(
        &self,
        r: &SliceRange<'_>,
    ) -> Vec<(u64, BTreeMap<SliceKey, Vec<(u64, u64)>>)> {
        let mut by_res: BTreeMap<u64, Slice> = BTreeMap::new();
        for s in &r.slices {
            by_res.entry(self.resolution_of(s)).or_default().add_counts(&s.counts);
        }
        by_res.into_iter().map(|(res, s)| (res, s.counts)).collect()
    }
}

/// A decoded file and its version.
struct Decoded {
    log: SliceLog,
    version: u16,
}

/// The bytes of the slice log at `path`, read safely (FORMAT.md §6.1); `None`: no such file.
fn read_bytes(path: &Path) -> Result<Option<Vec<u8>>> {
    let (f, size) = match open_regular(path) {
        Ok(x) => x,
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    if size > MAX_CONTAINER_FILE {
        return Err(Error::TooLarge { path: path.into(), limit: MAX_CONTAINER_FILE });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    let n =
        f.take(MAX_CONTAINER_FILE + 1).read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
    if n as u64 > MAX_CONTAINER_FILE {
        return Err(Error::TooLarge { path: path.into(), limit: MAX_CONTAINER_FILE });
    }
    Ok(Some(bytes))
}

fn header() -> Vec<u8> {
    let mut out = Vec::with_capacity(SLICES_HEADER_LEN);
    out.extend_from_slice(SLICES_MAGIC);
    out.extend_from_slice(&SLICES_VERSION.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Check the header; the file's version.
fn check_header(bytes: &[u8], path: &Path) -> Result<u16> {
    let prefix = bytes.len().min(8);
    if bytes[..prefix] != SLICES_MAGIC[..prefix] {
        return Err(Error::BadMagic { path: path.into(), what: "slice log" });
    }
    if bytes.len() >= 10 {
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version == 0 || version > SLICES_VERSION {
            return Err(Error::UnknownVersion {
                path: path.into(),
                version,
                supported: SLICES_VERSION,
            });
        }
    }
    if bytes.len() < SLICES_HEADER_LEN {
        return Err(Error::Truncated {
            path: path.into(),
            expected: SLICES_HEADER_LEN as u64,
            actual: bytes.len() as u64,
        });
    }
    let stored = u32::from_le_bytes(bytes[12..16].try_into().unwrap_or_default());
    let computed = crc32fast::hash(&bytes[..12]);
    if stored != computed {
        return Err(Error::ChecksumMismatch { path: path.into(), stored, computed });
    }
    let version = u16::from_le_bytes([bytes[8], bytes[9]]);
    if bytes[10..12] != [0, 0] {
        return Err(corrupt(path, "flags", format!("must be 0 in version {version}")));
    }
    Ok(version)
}

/// CRC-32 of the record's length field and body.
fn record_crc(len: u32, body: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&len.to_le_bytes());
    h.update(body);
    h.finalize()
}

/// The keys a file has defined so far, in index order.
#[derive(Default, Clone, Debug)]
pub struct KeyTable {
    index: BTreeMap<SliceKey, u64>,
}

impl KeyTable {
    /// Keys defined by the slices of `log` (a writer continuing a file).
    pub fn of(log: &SliceLog) -> Self {
        let mut t = Self::default();
        for s in &log.slices {
            for k in s.counts.keys() {
                let n = t.index.len() as u64;
                t.index.entry(k.clone()).or_insert(n);
            }
        }
        t
    }

    pub fn len(&self) -> usize {
        self.index.len()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

/// A slice's keys numbered through `keys`: the keys first defined here (in the slice's key
/// order, sorted), and per non-empty key (key index, pairs, shift of its offsets: image keys
/// only), by key index. Every record version numbers its keys so.
fn index_keys<'s>(
    s: &'s Slice,
    keys: &mut KeyTable,
    shift: u8,
) -> (Vec<&'s SliceKey>, Vec<(u64, &'s Vec<(u64, u64)>, u8)>) {
    let mut new: Vec<&SliceKey> = Vec::new();
    let mut idx: Vec<(u64, &Vec<(u64, u64)>, u8)> = Vec::with_capacity(s.counts.len());
    for (k, v) in &s.counts {
        if v.is_empty() {
            continue;
        }
        let i = match keys.index.get(k) {
            Some(i) => *i,
            None => {
                let i = keys.index.len() as u64;
                keys.index.insert(k.clone(), i);
                new.push(k);
                i
            }
        };
        idx.push((i, v, if k.image.is_some() { shift } else { 0 }));
    }
    idx.sort_unstable_by_key(|e| e.0);
    (new, idx)
}

/// Append one framed record (of the current version) for `s` to `out` at exact resolution,
/// defining the keys `keys` does not have yet.
pub fn encode_record(out: &mut Vec<u8>, s: &Slice, keys: &mut KeyTable) {
    encode_record_at(out, s, keys, 1);
}

/// [`encode_record`] at offset resolution `resolution` bytes (rounded down to a power of two,
/// at most 2^[`MAX_RESOLUTION_SHIFT`]): the offsets of image keys are rounded down to it and
/// the counts of offsets that fall together added.
pub fn encode_record_at(out: &mut Vec<u8>, s: &Slice, keys: &mut KeyTable, resolution: u64) {
    let shift = shift_of(resolution);
    let bucketed;
    let s = if shift == 0 {
        s
    } else {
        bucketed = bucket(s, 1 << shift);
        &bucketed
    };
    let (new, idx) = index_keys(s, keys, shift);
    // Head: the keys first defined here, then per entry its key, pairs and samples (what a
    // reader of totals needs, without the columns below).
    let mut head = Vec::with_capacity(16 + 8 * idx.len());
    varint::write_u64(&mut head, new.len() as u64);
    for k in new {
        put_bytes(&mut head, k.event.as_bytes());
        let img = k.image.as_ref().map(super::ident::ImageId::to_text).unwrap_or_default();
        put_bytes(&mut head, img.as_bytes());
    }
    varint::write_u64(&mut head, idx.len() as u64);
    let mut prev: Option<u64> = None;
    for (i, pairs, _) in &idx {
        varint::write_u64(&mut head, prev.map_or(*i, |p| i - p - 1));
        prev = Some(*i);
        varint::write_u64(&mut head, pairs.len() as u64);
        // Samples − pairs: the sum of the counts column's values (each count − 1).
        let extra = pairs.iter().fold(0u64, |a, &(_, c)| a.saturating_add(c.saturating_sub(1)));
        varint::write_u64(&mut head, extra);
    }
    // Columns: every offset, then every count − 1. Counts are mostly small and alike,
    // offsets are not: apart, zstd packs the counts to almost nothing.
    let mut payload = Vec::with_capacity(idx.iter().map(|e| e.1.len() * 3).sum::<usize>());
    for (_, pairs, sh) in &idx {
        let mut last: Option<u64> = None;
        for &(off, _) in pairs.iter() {
            let off = off >> sh;
            varint::write_u64(&mut payload, last.map_or(off, |l| off - l - 1));
            last = Some(off);
        }
    }
    for (_, pairs, _) in &idx {
        for &(_, c) in pairs.iter() {
            varint::write_u64(&mut payload, c.saturating_sub(1));
        }
    }
    let mut body = Vec::with_capacity(head.len() + payload.len() / 2 + 32);
    varint::write_u64(&mut body, s.start);
    varint::write_u64(&mut body, s.len);
    varint::write_u64(&mut body, s.seq);
    body.push(shift);
    let (codec, packed) = pack(&head);
    body.push(codec);
    varint::write_u64(&mut body, packed.len() as u64);
    body.extend_from_slice(&packed);
    let (codec, packed) = pack(&payload);
    body.push(codec);
    body.extend_from_slice(&packed);
    let len = body.len() as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&record_crc(len, &body).to_le_bytes());
    out.extend_from_slice(&body);
}

/// `bytes` as a record stores them: (codec, stored bytes), zstd when that is smaller.
fn pack(bytes: &[u8]) -> (u8, std::borrow::Cow<'_, [u8]>) {
    if bytes.len() >= COMPRESS_FROM {
        if let Some(z) = bulk::compress(bytes, ZSTD_LEVEL).ok().filter(|z| z.len() < bytes.len()) {
            return (CODEC_ZSTD, z.into());
        }
    }
    (CODEC_RAW, bytes.into())
}

/// log2 of `resolution` rounded down to a power of two, at most [`MAX_RESOLUTION_SHIFT`].
fn shift_of(resolution: u64) -> u8 {
    (resolution.max(1).ilog2() as u8).min(MAX_RESOLUTION_SHIFT)
}

/// `s` with its image keys' offsets rounded down to multiples of `res` (a power of two) and
/// the counts of offsets that fall together added.
fn bucket(s: &Slice, res: u64) -> Slice {
    let mask = !(res - 1);
    let mut out = Slice { counts: BTreeMap::new(), ..*s };
    for (k, v) in &s.counts {
        if k.image.is_none() {
            out.counts.insert(k.clone(), v.clone());
            continue;
        }
        let mut w: Vec<(u64, u64)> = Vec::with_capacity(v.len());
        for &(o, c) in v {
            let o = o & mask;
            match w.last_mut() {
                Some(l) if l.0 == o => l.1 = l.1.saturating_add(c),
                _ => w.push((o, c)),
            }
        }
        out.counts.insert(k.clone(), w);
    }
    out
}

/// The fields of a record before its keys and counts.
struct RecordHead {
    start: u64,
    len: u64,
    seq: u64,
    shift: u8,
}

/// Walk the complete records of a file (FORMAT.md §14.3): `f(body, file byte, version)` decodes
/// one and returns its seq, which must increase. Returns where the complete records end and
/// the file's version.
fn walk_records(
    bytes: &[u8],
    path: &Path,
    mut f: impl FnMut(&[u8], usize, u16) -> Result<u64>,
) -> Result<(usize, u16)> {
    let version = check_header(bytes, path)?;
    let mut pos = SLICES_HEADER_LEN;
    let mut last_seq = 0u64;
    while pos < bytes.len() {
        let rest = &bytes[pos..];
        if rest.len() < FRAME_LEN {
            break;
        }
        let len = u32::from_le_bytes(rest[0..4].try_into().unwrap_or_default()) as usize;
        let stored = u32::from_le_bytes(rest[4..8].try_into().unwrap_or_default());
        if len > MAX_RECORD {
            return Err(corrupt(
                path,
                "record length",
                format!("{len} bytes at file byte {pos} (at most {MAX_RECORD})"),
            ));
        }
        if rest.len() < FRAME_LEN + len {
            break;
        }
        let body = &rest[FRAME_LEN..FRAME_LEN + len];
        let computed = record_crc(len as u32, body);
        if computed != stored {
            if FRAME_LEN + len == rest.len() {
                // The last record: possibly still being written (§14.3).
                break;
            }
            return Err(Error::ChecksumMismatch { path: path.into(), stored, computed });
        }
        let seq = f(body, pos, version)?;
        if seq <= last_seq {
            return Err(corrupt(
                path,
                "seq",
                format!("record at file byte {pos}: {seq} after {last_seq}"),
            ));
        }
        last_seq = seq;
        pos += FRAME_LEN + len;
    }
    Ok((pos, version))
}

/// A record split into its parts (FORMAT.md §14.2).
struct Parts<'b> {
    head: RecordHead,
    /// What the new keys and entries are read from: the head (version 3), or the payload,
    /// whose columns follow them (versions 1 and 2); decompressed.
    entries: Cow<'b, [u8]>,
    /// Version 3: the columns' codec and stored bytes, not decompressed yet.
    columns: Option<(u8, &'b [u8])>,
}

/// `rest` as stored with `codec`, decompressed (at most 256 MiB). `field` names it in errors.
fn unpack<'b>(
    codec: u8,
    rest: &'b [u8],
    path: &Path,
    at: usize,
    field: &'static str,
) -> Result<Cow<'b, [u8]>> {
    match codec {
        CODEC_RAW => Ok(Cow::Borrowed(rest)),
        CODEC_ZSTD => {
            let d = zstd::stream::read::Decoder::with_buffer(rest)
                .map_err(|e| corrupt(path, field, e.to_string()))?;
            let too_large = "decompresses to more than 256 MiB";
            Ok(Cow::Owned(inflate_bounded(d.take(MAX_PAYLOAD + 1), path, field, too_large)?))
        }
        c => Err(corrupt(path, "codec", format!("record at file byte {at}: unknown {c}"))),
    }
}

/// `f` on a record's columns, which follow its entries: in the same reader `p` (versions 1
/// and 2), or stored apart after the head (version 3: `p` must be used up, and the columns are
/// decompressed here). One function, so that every reader of pairs checks the same bounds.
fn with_columns<T>(
    mut p: Reader<'_>,
    columns: Option<(u8, &[u8])>,
    path: &Path,
    at: usize,
    f: impl FnOnce(&mut Reader<'_>) -> Result<T>,
) -> Result<T> {
    match columns {
        None => f(&mut p),
        Some((codec, rest)) => {
            p.finish()?;
            let cols = unpack(codec, rest, path, at, "payload")?;
            f(&mut Reader::new(&cols, path))
        }
    }
}

/// A record's head fields and its parts, the head (version 3) or the payload (versions 1 and
/// 2) decompressed; version 3's columns are left as stored.
fn record_parts<'b>(body: &'b [u8], path: &Path, at: usize, version: u16) -> Result<Parts<'b>> {
    let mut r = Reader::new(body, path);
    let start = r.varint("start")?;
    let len = r.varint("len")?;
    let seq = r.varint("seq")?;
    if len == 0 || start.checked_add(len).is_none() {
        return Err(r.corrupt("len", format!("record at file byte {at}: {start}+{len}")));
    }
    if seq == 0 {
        return Err(r.corrupt("seq", format!("record at file byte {at}: 0")));
    }
    let shift = if version >= 2 { r.u8("resolution")? } else { 0 };
    if shift > MAX_RESOLUTION_SHIFT {
        return Err(r.corrupt(
            "resolution",
            format!("record at file byte {at}: 2^{shift} bytes (at most 2^{MAX_RESOLUTION_SHIFT})"),
        ));
    }
    let head = RecordHead { start, len, seq, shift };
    let codec = r.u8("codec")?;
    if version < 3 {
        let rest = &body[body.len() - r.remaining()..];
        return Ok(Parts {
            head,
            entries: unpack(codec, rest, path, at, "payload")?,
            columns: None,
        });
    }
    let stored = r.bytes("head")?;
    let columns = r.u8("codec")?;
    if columns != CODEC_RAW && columns != CODEC_ZSTD {
        return Err(r.corrupt("codec", format!("record at file byte {at}: unknown {columns}")));
    }
    let rest = &body[body.len() - r.remaining()..];
    let entries = unpack(codec, stored, path, at, "head")?;
    Ok(Parts { head, entries, columns: Some((columns, rest)) })
}

/// One entry of a record: the file's key index, its pairs and (version 3) its samples.
struct Entry {
    key: usize,
    pairs: usize,
    samples: u64,
}

/// Read a record's new keys into the file's `keys` (and their `index`).
fn read_new_keys(
    p: &mut Reader<'_>,
    keys: &mut Vec<SliceKey>,
    index: &mut BTreeMap<SliceKey, usize>,
) -> Result<()> {
    let n_new = p.count("new keys", 2)?;
    for _ in 0..n_new {
        let event = p.string("key event")?;
        if event.is_empty() {
            return Err(p.corrupt("key event", "empty"));
        }
        let img = p.string("key image")?;
        let image = if img.is_empty() {
            None
        } else {
            Some(ImageId::parse(&img).map_err(|e| p.corrupt("key image", e.to_string()))?)
        };
        let k = SliceKey { event, image };
        if index.insert(k.clone(), keys.len()).is_some() {
            return Err(p.corrupt("new keys", format!("{k:?} defined twice")));
        }
        keys.push(k);
    }
    Ok(())
}

/// Skip a record's new keys (a record read again: the file's keys are known).
fn skip_new_keys(p: &mut Reader<'_>) -> Result<()> {
    let n_new = p.count("new keys", 2)?;
    for _ in 0..n_new {
        p.bytes("key event")?;
        p.bytes("key image")?;
    }
    Ok(())
}

/// A record's entries, keys below `n_keys`, with their samples when `with_samples` (version
/// 3); and their pairs in all.
fn read_entries(
    p: &mut Reader<'_>,
    n_keys: usize,
    with_samples: bool,
) -> Result<(Vec<Entry>, usize)> {
    let n = p.count("entries", if with_samples { 3 } else { 4 })?;
    let mut out: Vec<Entry> = Vec::with_capacity(n);
    let mut prev: Option<u64> = None;
    let mut total = 0usize;
    for _ in 0..n {
        let d = p.varint("key index")?;
        let i = match prev {
            None => Some(d),
            Some(pv) => pv.checked_add(d).and_then(|x| x.checked_add(1)),
        }
        .filter(|i| *i < n_keys as u64)
        .ok_or_else(|| p.corrupt("key index", format!("beyond the {n_keys} keys defined")))?;
        prev = Some(i);
        // Versions 1 and 2: the columns follow in the same bytes, which bound the pairs.
        let m = if with_samples { p.varint("pairs")? } else { p.count("pairs", 2)? as u64 };
        if m == 0 {
            return Err(p.corrupt("pairs", "an entry without counts"));
        }
        let m = usize::try_from(m).map_err(|_| p.corrupt("pairs", format!("{m}")))?;
        let samples = if with_samples {
            let extra = p.varint("samples")?;
            (m as u64).checked_add(extra).ok_or_else(|| p.corrupt("samples", "beyond 2^64-1"))?
        } else {
            0
        };
        total = total.checked_add(m).ok_or_else(|| p.corrupt("pairs", "too many"))?;
        out.push(Entry { key: i as usize, pairs: m, samples });
    }
    Ok((out, total))
}

/// The columns of a record's `entries` (`total` pairs) from `c`: per entry, its (offset,
/// count) pairs when `want` says so (else `None`, skipped); `shift(entry)` is the shift of its
/// offsets. With `check_samples` (version 3) each decoded entry's counts must add up to its
/// samples. The columns must end the bytes.
fn read_columns(
    c: &mut Reader<'_>,
    entries: &[Entry],
    total: usize,
    shift: &dyn Fn(&Entry) -> u32,
    want: &dyn Fn(&Entry) -> bool,
    check_samples: bool,
) -> Result<Vec<Option<Vec<(u64, u64)>>>> {
    // Each pair takes at least one byte in each of the two columns.
    if total.saturating_mul(2) > c.remaining() {
        return Err(
            c.corrupt("pairs", format!("{total} pairs cannot fit in {} bytes", c.remaining()))
        );
    }
    let mut out: Vec<Option<Vec<(u64, u64)>>> = Vec::with_capacity(entries.len());
    for e in entries {
        if !want(e) {
            c.skip_varints("offset", e.pairs)?;
            out.push(None);
            continue;
        }
        // Image keys' offsets are stored in units of the record's resolution.
        let sh = shift(e);
        let mut v = Vec::with_capacity(e.pairs);
        let mut last: Option<u64> = None;
        for _ in 0..e.pairs {
            let d = c.varint("offset")?;
            let off = match last {
                None => Some(d),
                Some(l) => l.checked_add(d).and_then(|x| x.checked_add(1)),
            }
            .filter(|o| sh == 0 || o >> (64 - sh) == 0)
            .ok_or_else(|| c.corrupt("offset", "beyond 2^64-1"))?;
            last = Some(off);
            v.push((off << sh, 0));
        }
        out.push(Some(v));
    }
    for (e, v) in entries.iter().zip(out.iter_mut()) {
        let Some(v) = v else {
            c.skip_varints("count", e.pairs)?;
            continue;
        };
        let mut extra = 0u64;
        for p in v.iter_mut() {
            let x = c.varint("count")?;
            p.1 = x.checked_add(1).ok_or_else(|| c.corrupt("count", "beyond 2^64-1"))?;
            extra = extra.saturating_add(x);
        }
        if check_samples && (e.pairs as u64).checked_add(extra) != Some(e.samples) {
            return Err(c.corrupt(
                "samples",
                format!("{} stated, the counts add up to {}", e.samples, e.pairs as u64 + extra),
            ));
        }
    }
    c.finish()?;
    Ok(out)
}

/// Decode one record fully: its head, and per key index of the file its pairs, in key order
/// (new keys added to `keys`/`index`).
#[allow(clippy::type_complexity)]
fn decode_record(
    body: &[u8],
    path: &Path,
    at: usize,
    version: u16,
    keys: &mut Vec<SliceKey>,
    index: &mut BTreeMap<SliceKey, usize>,
) -> Result<(RecordHead, Vec<(usize, Vec<(u64, u64)>)>)> {
    let parts = record_parts(body, path, at, version)?;
    let mut p = Reader::new(&parts.entries, path);
    read_new_keys(&mut p, keys, index)?;
    let v3 = parts.columns.is_some();
    let (entries, total) = read_entries(&mut p, keys.len(), v3)?;
    let shift =
        |e: &Entry| if keys[e.key].image.is_some() { u32::from(parts.head.shift) } else { 0 };
    let pairs = with_columns(p, parts.columns, path, at, |c| {
        read_columns(c, &entries, total, &shift, &|_| true, v3)
    })?;
    let out = entries.iter().zip(pairs).map(|(e, v)| (e.key, v.unwrap_or_default())).collect();
    Ok((parts.head, out))
}

/// One record's samples per key index of the file, new keys added to `keys`/`index`: from
/// the head in version 3 (the columns are not read), else by adding up the counts column
/// (the offsets column is only skipped: its varints are not checked against overflow as a
/// full decode does; a total does not depend on them).
fn record_totals(
    body: &[u8],
    path: &Path,
    at: usize,
    version: u16,
    keys: &mut Vec<SliceKey>,
    index: &mut BTreeMap<SliceKey, usize>,
) -> Result<(RecordHead, Vec<(usize, u64)>)> {
    let parts = record_parts(body, path, at, version)?;
    let mut p = Reader::new(&parts.entries, path);
    read_new_keys(&mut p, keys, index)?;
    let v3 = parts.columns.is_some();
    let (entries, total) = read_entries(&mut p, keys.len(), v3)?;
    if v3 {
        p.finish()?;
        return Ok((parts.head, entries.iter().map(|e| (e.key, e.samples)).collect()));
    }
    if total.saturating_mul(2) > p.remaining() {
        return Err(
            p.corrupt("pairs", format!("{total} pairs cannot fit in {} bytes", p.remaining()))
        );
    }
    p.skip_varints("offset", total)?;
    let mut out = Vec::with_capacity(entries.len());
    for e in entries {
        let mut sum = 0u64;
        for _ in 0..e.pairs {
            let c = p.varint("count")?;
            let c = c.checked_add(1).ok_or_else(|| p.corrupt("count", "beyond 2^64-1"))?;
            sum = sum.saturating_add(c);
        }
        out.push((e.key, sum));
    }
    p.finish()?;
    Ok((parts.head, out))
}

/// The owning host's appender of its slice log (FORMAT.md §14.3). Only the daemon of the host
/// directory's host uses it (§2).
#[derive(Debug)]
pub struct SliceWriter {
    path: PathBuf,
    file: File,
    keys: KeyTable,
    /// Offset resolution (bytes) of the slices appended: [`SliceWriter::set_resolution`].
    resolution: u64,
    next_seq: u64,
    len: u64,
    /// (start, len) of the slices in the file, for roll-up decisions.
    ranges: Vec<(u64, u64)>,
    /// (device, inode) of the open file: [`SliceWriter::is_current`].
    id: (u64, u64),
}

/// What opening a writer found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Bytes of a torn tail truncated.
    pub truncated: u64,
    /// The unreadable file that was set aside (it names the error), if any.
    pub set_aside: Option<(PathBuf, String)>,
    /// The version of an older file that was rewritten in [`SLICES_VERSION`].
    pub upgraded_from: Option<u16>,
}

impl SliceWriter {
    /// Open (creating it if missing) the slice log at `path` for appending: a torn tail is
    /// truncated; an unreadable file (corrupt, not a regular file, a newer version) is set
    /// aside (`<name>.corrupt`) and a fresh one started.
    pub fn open(path: &Path) -> Result<(Self, OpenReport)> {
        let mut report = OpenReport::default();
        let fresh = || -> Result<Decoded> {
            crate::write_atomic(path, &header())?;
            Ok(Decoded {
                log: SliceLog { valid_len: SLICES_HEADER_LEN as u64, ..Default::default() },
                version: SLICES_VERSION,
            })
        };
        let read = read_bytes(path).and_then(|b| match b {
            Some(b) => SliceLog::decode_full(&b, path).map(Some),
            None => Ok(None),
        });
        let mut d = match read {
            Ok(Some(d)) => d,
            Ok(None) => fresh()?,
            // A newer dcpid of this host wrote it (a rolling downgrade): left alone (§14.4).
            Err(e @ Error::UnknownVersion { .. }) if is_newer_log(path) => return Err(e),
            Err(e) if !matches!(e, Error::Io { .. }) => {
                let to = safeio::set_aside(path)?;
                report.set_aside = Some((to, e.to_string()));
                fresh()?
            }
            Err(e) => return Err(e),
        };
        if d.version < SLICES_VERSION {
            // An older dcpid's file (an upgrade within an epoch): rewritten once in this
            // version, every slice kept (a torn tail dropped), so that records of one
            // version only follow its header.
            let bytes = d.log.encode();
            crate::write_atomic(path, &bytes)?;
            report.upgraded_from = Some(d.version);
            report.truncated = d.log.torn_tail;
            d = Decoded {
                log: SliceLog { valid_len: bytes.len() as u64, torn_tail: 0, ..d.log },
                version: SLICES_VERSION,
            };
        }
        let log = d.log;
        let file = open_append(path)?;
        let id = file_id(&file, path)?;
        if log.torn_tail > 0 {
            file.set_len(log.valid_len).map_err(|e| Error::io(path, e))?;
            report.truncated = log.torn_tail;
        }
        Ok((
            Self {
                path: path.into(),
                keys: KeyTable::of(&log),
                resolution: 1,
                next_seq: log.next_seq(),
                len: log.valid_len,
                ranges: log.slices.iter().map(|s| (s.start, s.len)).collect(),
                file,
                id,
            },
            report,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file this writer appends to is still the one at its path (`lstat`): the
    /// directory may have been removed (retention, by hand) or the file set aside or replaced
    /// since; a writer that is not current is dropped and opened again.
    pub fn is_current(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(&self.path)
            .is_ok_and(|m| m.file_type().is_file() && (m.dev(), m.ino()) == self.id)
    }

    /// Bytes of the file.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// (start, len) of the slices in the file, in file order.
    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    /// The sequence the next appended slice gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Append one slice (its `seq` is set here) as one `write` and `fdatasync` it. Returns
    /// the bytes appended. On an error the file is cut back to where it was, so that the
    /// record either is whole or is not there (and if even that fails, the next
    /// [`SliceWriter::open`] truncates it: a record is never visible half written).
    pub fn append(&mut self, s: &Slice) -> Result<u64> {
        let mut s2;
        let s = if s.seq == self.next_seq {
            s
        } else {
            s2 = s.clone();
            s2.seq = self.next_seq;
            &s2
        };
        let mut keys = self.keys.clone();
        let mut buf = Vec::new();
        encode_record_at(&mut buf, s, &mut keys, self.resolution);
        if buf.len() - FRAME_LEN > MAX_RECORD {
            return Err(corrupt(&self.path, "record length", "slice too large to store"));
        }
        let r = self.file.write_all(&buf).and_then(|()| self.file.sync_data());
        if let Err(e) = r {
            drop(self.file.set_len(self.len));
            return Err(Error::io(&self.path, e));
        }
        self.keys = keys;
        self.len += buf.len() as u64;
        self.next_seq += 1;
        self.ranges.push((s.start, s.len));
        Ok(buf.len() as u64)
    }

    /// Store the slices appended from now on with their image keys' offsets at `resolution`
    /// bytes (rounded down to a power of two, at most 2^[`MAX_RESOLUTION_SHIFT`]; 1: exact;
    /// FORMAT.md §14.2).
    pub fn set_resolution(&mut self, resolution: u64) {
        self.resolution = 1 << shift_of(resolution);
    }

    /// Roll up slices ending at or before `before` into `coarse`-second ones
    /// ([`SliceLog::rollup`]) by rewriting the file atomically (§2), then continue appending
    /// to the new file. Returns the new size.
    pub fn rollup(&mut self, before: u64, coarse: u64) -> Result<u64> {
        self.rollup_at(before, coarse, 1)
    }

    /// [`SliceWriter::rollup`] with the merged slices at `resolution` ([`SliceLog::rollup_at`]).
    pub fn rollup_at(&mut self, before: u64, coarse: u64, resolution: u64) -> Result<u64> {
        let log = SliceLog::read(&self.path)?.unwrap_or_default();
        let rolled = log.rollup_at(before, coarse, resolution);
        let bytes = rolled.encode();
        crate::write_atomic(&self.path, &bytes)?;
        self.file = open_append(&self.path)?;
        self.id = file_id(&self.file, &self.path)?;
        self.keys = KeyTable::of(&rolled);
        self.next_seq = rolled.next_seq();
        self.len = bytes.len() as u64;
        self.ranges = rolled.slices.iter().map(|s| (s.start, s.len)).collect();
        Ok(self.len)
    }
}

/// Whether `path` is a slice log of a newer version than this build's: a regular file whose
/// header has the magic, a version above [`SLICES_VERSION`] and a valid header checksum.
fn is_newer_log(path: &Path) -> bool {
    let Ok((f, _)) = open_regular(path) else { return false };
    let mut head = Vec::with_capacity(SLICES_HEADER_LEN);
    if f.take(SLICES_HEADER_LEN as u64).read_to_end(&mut head).is_err()
        || head.len() < SLICES_HEADER_LEN
        || &head[..8] != SLICES_MAGIC
    {
        return false;
    }
    let version = u16::from_le_bytes([head[8], head[9]]);
    let crc = u32::from_le_bytes([head[12], head[13], head[14], head[15]]);
    version > SLICES_VERSION && crc == crc32fast::hash(&head[..12])
}

fn file_id(f: &File, path: &Path) -> Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let m = f.metadata().map_err(|e| Error::io(path, e))?;
    Ok((m.dev(), m.ino()))
}

fn open_append(path: &Path) -> Result<File> {
    let f = OpenOptions::new()
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => {
                Error::NotRegularFile { path: path.into(), kind: "a symbolic link" }
            }
            _ => Error::io(path, e),
        })?;
    let meta = f.metadata().map_err(|e| Error::io(path, e))?;
    if !meta.is_file() {
        return Err(Error::NotRegularFile {
            path: path.into(),
            kind: safeio::file_kind(meta.file_type()),
        });
    }
    Ok(f)
}

// Here rather than in db, which must not import the modules that own the files it names (issue 34).
impl HostDir {
    /// The host directory's single-file slice log of an older dcpid (FORMAT.md §14.2; dcpid
    /// now writes segments, §14.5, [`HostDir::read_slices`] reads both).
    pub fn slices_path(&self) -> PathBuf {
        self.path.join(SLICES_FILE)
    }
}

mod store;
pub use store::{
    hour_of, record_spans, segment_hour, SegmentOpen, SegmentWriter, SliceFiles, SEGMENT_SECS,
    SLICE_HOURS_FILE,
};
use zstd::bulk;

#[cfg(test)]
mod tests;
