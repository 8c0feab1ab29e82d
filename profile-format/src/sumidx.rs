//! `summary.idx`: the host summary and its per-(image, event) totals in the binary container
//! (FORMAT.md §7.2). A per-image report over a fleet reads one of these per host and epoch;
//! unlike the JSON index it decodes without building a string per field, and its entries
//! borrow from the file's bytes.

use std::path::{Path, PathBuf};

use crate::atomic;
use crate::codec::{self, put_bytes, Reader};
use crate::db::HostDir;
use crate::error::{Error, Result};
pub use crate::ident::ImageIdRef;
use crate::ident::{ImageId, ImageKind};
use crate::profile::EventDesc;
use crate::safeio;
use crate::summary::{HostSummary, ImageTotal, SummaryIndex};
use crate::varint::write_u64;

/// Magic of `summary.idx`.
pub const SUMMARY_INDEX_MAGIC: &[u8; 8] = b"DCPISIDX";
/// Container version of `summary.idx` written and read by this build.
pub const SUMMARY_INDEX_VERSION: u16 = 1;
/// File name of the binary summary index in a host directory.
pub const SUMMARY_INDEX_FILE: &str = "summary.idx";

/// One profile file's totals, borrowed from the index file's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexEntry<'a> {
    pub kind: ImageKind,
    pub id: ImageIdRef<'a>,
    pub path: &'a [u8],
    /// Index into [`IndexView::events`] (checked when decoding).
    pub event: u32,
    pub samples: u64,
    pub period: u64,
}

/// A decoded `summary.idx`: the host facts (with `index: None`), the events and one entry per
/// profile file, in the order of the file names.
#[derive(Debug)]
pub struct IndexView<'a> {
    pub facts: HostSummary,
    pub events: Vec<EventDesc>,
    pub entries: Vec<IndexEntry<'a>>,
}

fn invalid(field: &str, detail: String) -> Error {
    Error::Invalid { what: "summary index", value: field.to_owned(), detail }
}

/// Encode `s` (whose `index` must be present) as a `summary.idx` file.
pub fn encode(s: &HostSummary) -> Result<Vec<u8>> {
    let idx = s.index.as_ref().ok_or_else(|| invalid("index", "no index to write".into()))?;
    let facts = HostSummary { index: None, ..s.clone() };
    let facts = serde_json::to_vec(&facts)
        .map_err(|e| invalid("facts", format!("cannot serialize: {e}")))?;
    let mut out = codec::begin(SUMMARY_INDEX_MAGIC, SUMMARY_INDEX_VERSION);
    put_bytes(&mut out, &facts);
    write_u64(&mut out, idx.events.len() as u64);
    for e in &idx.events {
        put_bytes(&mut out, e.name.as_bytes());
        write_u64(&mut out, u64::from(e.perf_type));
        write_u64(&mut out, e.perf_config);
        write_u64(&mut out, e.period_mean);
        write_u64(&mut out, e.period_min);
        write_u64(&mut out, e.period_max);
    }
    write_u64(&mut out, idx.images.len() as u64);
    for t in &idx.images {
        if ImageKind::from_code(t.kind).is_none() {
            return Err(invalid("kind", format!("unknown image kind {}", t.kind)));
        }
        if t.event as usize >= idx.events.len() {
            return Err(invalid("event", format!("no event #{}", t.event)));
        }
        out.push(t.kind);
        let id = ImageId::parse(&t.id).map_err(|e| invalid("id", e.to_string()))?;
        codec::put_image_id(&mut out, &id);
        match &t.path_hex {
            Some(h) => put_bytes(
                &mut out,
                &hex::decode(h).map_err(|e| invalid("path_hex", e.to_string()))?,
            ),
            None => put_bytes(&mut out, t.path.as_bytes()),
        }
        write_u64(&mut out, u64::from(t.event));
        write_u64(&mut out, t.samples);
        write_u64(&mut out, t.period);
    }
    Ok(codec::finish(out))
}

/// Decode and validate; `path` only names the file in errors. Never panics on any input.
pub fn decode<'a>(bytes: &'a [u8], path: &Path) -> Result<IndexView<'a>> {
    let payload =
        codec::open(bytes, path, SUMMARY_INDEX_MAGIC, "summary index", SUMMARY_INDEX_VERSION)?;
    let mut r = Reader::new(payload, path);
    let facts = r.bytes("facts")?;
    let mut facts: HostSummary = serde_json::from_slice(facts)
        .map_err(|e| r.corrupt("facts", format!("invalid JSON: {e}")))?;
    facts.index = None;
    // An event is at least a 1-byte name length and five 1-byte varints.
    let nev = r.count("events", 6)?;
    let mut events = Vec::with_capacity(nev);
    for _ in 0..nev {
        let name = r.string("events.name")?;
        let perf_type = r.varint("events.perf_type")?;
        let perf_type = u32::try_from(perf_type)
            .map_err(|_| r.corrupt("events.perf_type", format!("{perf_type} exceeds 32 bits")))?;
        events.push(EventDesc {
            name,
            perf_type,
            perf_config: r.varint("events.perf_config")?,
            period_mean: r.varint("events.period_mean")?,
            period_min: r.varint("events.period_min")?,
            period_max: r.varint("events.period_max")?,
        });
    }
    // kind, tag, id length + >= 1 byte, path length, event, samples, period.
    let n = r.count("entries", 8)?;
    let mut entries = Vec::with_capacity(n);
    for _ in 0..n {
        let kind = r.image_kind("entries.kind")?;
        let id = r.image_id("entries.id")?;
        let path_bytes = r.bytes("entries.path")?;
        let event = r.varint("entries.event")?;
        if event >= events.len() as u64 {
            return Err(r.corrupt("entries.event", format!("no event #{event}")));
        }
        entries.push(IndexEntry {
            kind,
            id,
            path: path_bytes,
            event: event as u32,
            samples: r.varint("entries.samples")?,
            period: r.varint("entries.period")?,
        });
    }
    r.finish()?;
    Ok(IndexView { facts, events, entries })
}

impl IndexView<'_> {
    /// The whole summary, with its index in the JSON form (§7.1).
    pub fn to_summary(&self) -> HostSummary {
        let mut s = self.facts.clone();
        let mut idx = SummaryIndex { events: self.events.clone(), images: Vec::new() };
        for e in &self.entries {
            let (path, path_hex) = match std::str::from_utf8(e.path) {
                Ok(p) => (p.to_owned(), None),
                Err(_) => (String::new(), Some(hex::encode(e.path))),
            };
            idx.images.push(ImageTotal {
                id: e.id.to_owned_id().to_text(),
                kind: e.kind as u8,
                path,
                path_hex,
                event: e.event,
                samples: e.samples,
                period: e.period,
            });
        }
        s.index = Some(idx);
        s
    }
}

/// Write `s` (with its index) atomically as `summary.idx` at `path`; returns the bytes written.
pub fn write(s: &HostSummary, path: &Path) -> Result<u64> {
    let bytes = encode(s)?;
    atomic::write_atomic(path, &bytes)?;
    Ok(bytes.len() as u64)
}

/// The bytes of `summary.idx`, through the guarded reader (FORMAT.md §6.1): a FIFO, device,
/// symbolic link or oversized file is refused at once, naming it. Decode them with [`decode`].
pub fn read_bytes(path: &Path) -> Result<Vec<u8>> {
    safeio::read_container(path, SUMMARY_INDEX_MAGIC, "summary index", SUMMARY_INDEX_VERSION)
}

/// Read `summary.idx` into a [`HostSummary`] with its index; errors name the file.
pub fn read(path: &Path) -> Result<HostSummary> {
    let bytes = read_bytes(path)?;
    Ok(decode(&bytes, path)?.to_summary())
}

// Here rather than in db, which must not import the modules that own the files it names (issue 34).
impl HostDir {
    /// The binary summary with its per-(image, event) totals (FORMAT.md §7.2).
    pub fn summary_index_path(&self) -> PathBuf {
        self.path.join(SUMMARY_INDEX_FILE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Database, EpochId, Profile, ProfileHeader};

    fn sample() -> HostSummary {
        let event = EventDesc {
            name: "cpu-clock".into(),
            perf_type: 1,
            perf_config: 0,
            period_mean: 1000,
            period_min: 900,
            period_max: 1100,
        };
        let epoch = EpochId::parse("20240101T000000Z").unwrap();
        let mut idx = SummaryIndex::default();
        for (i, (kind, path)) in [
            (ImageKind::Elf, b"/usr/bin/a".to_vec()),
            (ImageKind::Elf, b"/tmp/\xff\nodd".to_vec()),
            (ImageKind::Unknown, Vec::new()),
        ]
        .into_iter()
        .enumerate()
        {
            let image_id = match kind {
                ImageKind::Unknown => ImageId::special("[unknown]", b""),
                _ => ImageId::from_build_id(&[i as u8 + 1; 20]).unwrap(),
            };
            idx.push(&ProfileHeader {
                kind,
                image_id,
                image_path: path,
                event: event.clone(),
                host: "h1".into(),
                epoch: epoch.clone(),
                total_samples: 10 + i as u64,
                total_period: 10_000 + i as u64,
                sequence: 0,
                jit_symbols: Vec::new(),
            });
        }
        HostSummary {
            format_version: 1,
            host: "h1".into(),
            epoch: epoch.to_string(),
            samples: 33,
            spool_sequence: 9,
            index: Some(idx),
            ..Default::default()
        }
    }

    #[test]
    fn round_trip_borrowed_entries_and_errors() {
        let s = sample();
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(SUMMARY_INDEX_FILE);
        let n = write(&s, &p).unwrap();
        assert_eq!(n, std::fs::metadata(&p).unwrap().len());
        assert_eq!(read(&p).unwrap(), s);
        let bytes = std::fs::read(&p).unwrap();
        let v = decode(&bytes, &p).unwrap();
        assert_eq!(v.facts, HostSummary { index: None, ..s.clone() });
        assert_eq!(v.entries.len(), 3);
        assert_eq!(v.entries[1].path, b"/tmp/\xff\nodd");
        assert_eq!(v.entries[2].kind, ImageKind::Unknown);
        // Smaller than the pretty-printed JSON index it replaces.
        let json = serde_json::to_vec_pretty(&s).unwrap();
        assert!(bytes.len() * 2 < json.len(), "{} vs {}", bytes.len(), json.len());
        // Every truncation and every single-byte change is an error naming the file, never a
        // panic or a silently different summary.
        for len in 0..bytes.len() {
            let e = decode(&bytes[..len], &p).unwrap_err();
            assert!(e.to_string().contains(SUMMARY_INDEX_FILE), "{e}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x41;
            assert!(decode(&b, &p).is_err(), "byte {i} flipped and accepted");
        }
        // A summary without an index cannot be written as an index file.
        let e = encode(&HostSummary::default()).unwrap_err();
        assert!(e.to_string().contains("index"), "{e}");
        // A bad entry is refused at write time, naming the field.
        let mut bad = s.clone();
        bad.index.as_mut().unwrap().images[0].event = 7;
        assert!(encode(&bad).unwrap_err().to_string().contains("event"));
    }

    #[test]
    fn written_index_matches_profiles() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path()).unwrap();
        let epoch = EpochId::parse("20240101T000000Z").unwrap();
        let hd = db.host_dir(&epoch, "h1").unwrap();
        hd.create().unwrap();
        let header = sample();
        let idx = header.index.as_ref().unwrap();
        for t in &idx.images {
            let mut h = t.header(idx, "h1", &epoch).unwrap();
            h.total_samples = 0;
            h.total_period = 0;
            let mut p = Profile::new(h);
            p.add(0x40, t.samples, t.period);
            let path = match p.header.kind {
                ImageKind::Unknown => hd.unknown_path("cpu-clock"),
                _ => hd.profile_path(&p.header.image_id, "cpu-clock"),
            };
            p.write(&path).unwrap();
        }
        let of_files = SummaryIndex::of_host_dir(&hd).unwrap();
        let s = HostSummary { index: Some(of_files.clone()), ..Default::default() };
        write(&s, &hd.summary_index_path()).unwrap();
        assert_eq!(read(&hd.summary_index_path()).unwrap().index, Some(of_files));
    }
}
