//! The host-local spool: an append-only log of every increment not yet published to the shared
//! profile database.
//!
//! Layout: the spool is a directory of segment files `seg-<first seq, 16 hex>.log`. A segment
//! is `DCPISPL1` (8 bytes) then records; a record is `length` (u32 LE), `crc32` of the payload
//! (u32 LE) and the payload. One flush appends **one record** holding that flush's increments,
//! encoded with the profile format's pair codec (`profile_format::pairs`, ~2 bytes per
//! (offset, count)), so the spool's write volume is about the size of what changed, never a
//! rewrite of pages (on the busy mix of bench/disk.py the `SQLite` spool this replaces made dcpid
//! write 9.5 MiB in 90 s; the log's share is now ~280 KiB a minute). Payload, all integers
//! varints:
//!
//! ```text
//! kind 1 (a flush):
//! seq, epoch (bytes),
//! defs: n, each: tag (1 event | 2 image | 3 qualified image), id, then
//!       event: name, perf_type, perf_config, period_mean, period_min, period_max
//!       image: id text, kind, path, n jit, (start, size, name)*
//!       qualified image (a per-process, per-cgroup or per-command profile, `by_pid`/
//!       `by_cgroup`/`by_command`): as an image, whose id text is
//!       `<image id text>.<pid-N | cg-HASH | cmd-HASH>`, then who: 1 (pid), pid, command |
//!       2 (cgroup), path | 3 (command), command. `by_command` is on by default; a dcpid
//!       that predates who tag 3 quarantines the records holding one (as below). A dcpid that predates tag 3 cannot tell where such a definition ends: after a
//!       downgrade it quarantines (and counts) the records that hold one, flat increments
//!       included, so empty the spool (`dcpictl flush`) before downgrading.
//! summary delta: samples, unknown, lost, throttled, n, (event id, samples, total_period,
//!       time_enabled_ns, time_running_ns)*
//! increments: n, each: image id (0 = the event's unknown profile), event id, total_period,
//!       pair list (offsets ascending; unknown profiles use the reason code as offset)
//! kind 2 (published marks, appended after publishing):
//! n, each: epoch, image id text (empty = unknown profile), event name, seq
//! kind 3 (a flush's call stacks, `callchains = "fp"`): see `spool_stacks.rs`
//! ```
//!
//! A mark says that a profile's increments up to `seq` are in the database: a restart does
//! not offer them again (the published file's `sequence` would skip them too, but not if the
//! file was set aside as corrupt or removed by retention meanwhile). Segments are deleted
//! oldest first only, so the marks about a live segment's increments are always still there.
//!
//! Event and image ids are defined once per segment (an image again when its JIT symbols
//! change), so a steady flush carries ids, not paths.
//!
//! Durability: a record is in the file once `write` returns, so a kill -9 loses nothing that
//! was appended. Segments are `fdatasync`ed every [`SYNC_INTERVAL`], on rotation and by
//! [`Spool::sync`] (shutdown): a power failure loses at most that much when the spool is on a
//! disk. The default spool is on tmpfs (the unit's `/run/dcpid`), where none of this costs a
//! disk write and a reboot loses what was not yet published. Sequence numbers are
//! `max(last + 1, unix time in µs)`, so a spool that lost its tail, or was deleted, never issues
//! a number an earlier run already published.
//!
//! Segments are never rewritten: a new one starts every `rotate_after` (the publish interval)
//! or [`MAX_SEGMENT_BYTES`], and a whole segment is deleted once every increment and summary
//! delta in it, and in every older segment, is published. A record that fails its checksum or does not parse is skipped
//! and counted (`quarantined`); its segment is renamed `*.corrupt` instead of deleted, for
//! inspection. A torn last record (kill -9 in the middle of a `write`) ends its segment. A
//! segment that cannot be read at all (a FIFO or directory under its name, an I/O error) is
//! renamed `*.corrupt` at once; an increment whose bytes can no longer be read, or that
//! passes its checksum but describes a profile no reader accepts, is quarantined when it is
//! published. Each counts in `quarantined` (status `spool_quarantined`), and publishing goes
//! on with the rest: one bad record never holds up the others.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[path = "spool_stacks.rs"]
mod stacks;
pub use stacks::STACKS_KEY_IMAGE;

use profile_format::varint::{self, VarintError};
use profile_format::{pairs, EventDesc, ImageKind, JitSymbol, ProfileWho};

/// First bytes of every segment.
pub const SEGMENT_MAGIC: &[u8; 8] = b"DCPISPL1";
/// A segment is closed when it reaches this size even if its time is not up.
pub const MAX_SEGMENT_BYTES: u64 = 8 << 20;
/// Longest time appended data stays un-`fdatasync`ed.
pub const SYNC_INTERVAL: Duration = Duration::from_secs(30);
/// A record larger than this is corrupt (a flush of the largest tables is a few MB).
const MAX_RECORD: u32 = 256 << 20;
const RECORD_HEADER: u64 = 8;
/// A segment file larger than this is not one this spool wrote (segments close at
/// [`MAX_SEGMENT_BYTES`], plus at most one record).
const MAX_SEGMENT_FILE: u64 = MAX_SEGMENT_BYTES + MAX_RECORD as u64 + RECORD_HEADER + 8;

/// Errors of the spool; they name the spool file.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("spool {path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
}

/// One profile's key in the spool: epoch, image id text (`None` = the event's unknown
/// profile) and event name.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct SpoolKey {
    pub epoch: String,
    pub image: Option<String>,
    pub event: String,
}

/// What the spool remembers about an image.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SpoolImage {
    pub kind: ImageKind,
    pub path: Vec<u8>,
    pub jit: Vec<JitSymbol>,
    /// The process or cgroup of a qualified profile (its id text says which, too).
    pub who: Option<ProfileWho>,
}

/// One profile's increment, to append: counts as (offset, count), offsets strictly ascending,
/// no zero count; `total_period` is the sum of the periods of those samples.
#[derive(Clone, Debug)]
pub struct Increment<'a> {
    pub image: Option<(&'a str, &'a SpoolImage)>,
    pub desc: &'a EventDesc,
    pub total_period: u64,
    pub counts: &'a [(u64, u64)],
}

/// Per-event part of a [`SummaryDelta`].
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct EventDelta {
    pub desc: EventDesc,
    pub samples: u64,
    pub total_period: u64,
    pub time_enabled_ns: u64,
    pub time_running_ns: u64,
}

/// What one record adds to its epoch's `summary.json`.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct SummaryDelta {
    pub samples: u64,
    pub unknown: u64,
    pub lost: u64,
    pub throttled: u64,
    pub events: Vec<EventDelta>,
}

/// An unpublished increment of one profile; its counts are read by [`Spool::counts`].
#[derive(Clone, Debug)]
pub struct SpooledIncrement {
    pub seq: u64,
    pub desc: Arc<EventDesc>,
    /// `None` for unknown profiles.
    pub image: Option<Arc<SpoolImage>>,
    loc: Loc,
}

/// Where an increment lies: its bytes (image id onwards) in a segment.
#[derive(Clone, Debug)]
struct Loc {
    seq: u64,
    segment: u64,
    offset: u64,
    len: u32,
    desc: Arc<EventDesc>,
    image: Option<Arc<SpoolImage>>,
}

struct Segment {
    path: PathBuf,
    file: File,
    len: u64,
    /// Increments and summary deltas in it not yet published.
    refs: u64,
    corrupt: bool,
}

/// Definitions of the segment being written (ids as written into it).
#[derive(Default)]
struct Defs {
    events: HashMap<EventDesc, u64>,
    images: HashMap<String, (u64, Arc<SpoolImage>)>,
    next_id: u64,
}

impl Defs {
    fn take_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The event's id, defining it into `out` if new to the segment.
    fn event(&mut self, d: &EventDesc, out: &mut Vec<u8>, n: &mut u64) -> u64 {
        if let Some(id) = self.events.get(d) {
            return *id;
        }
        let id = self.take_id();
        varint::write_u64(out, 1);
        varint::write_u64(out, id);
        encode_event(out, d);
        *n += 1;
        self.events.insert(d.clone(), id);
        id
    }

    /// The image's id, defining it if new to the segment or if its JIT symbols changed.
    fn image(&mut self, text: &str, img: &SpoolImage, out: &mut Vec<u8>, n: &mut u64) -> u64 {
        if let Some((id, known)) = self.images.get(text) {
            if **known == *img || img.jit.is_empty() {
                return *id;
            }
        }
        let id = self.take_id();
        varint::write_u64(out, if img.who.is_some() { 3 } else { 2 });
        varint::write_u64(out, id);
        encode_image(out, text, img);
        match &img.who {
            None => {}
            Some(ProfileWho::Pid { pid, command }) => {
                varint::write_u64(out, 1);
                varint::write_u64(out, u64::from(*pid));
                put_bytes(out, command);
            }
            Some(ProfileWho::Cgroup { path }) => {
                varint::write_u64(out, 2);
                put_bytes(out, path.as_bytes());
            }
            Some(ProfileWho::Command { command }) => {
                varint::write_u64(out, 3);
                put_bytes(out, command);
            }
        }
        *n += 1;
        self.images.insert(text.to_owned(), (id, Arc::new(img.clone())));
        id
    }
}

struct Writer {
    segment: u64,
    opened: Instant,
    last_sync: Instant,
    unsynced: bool,
    defs: Defs,
}

/// What a spool directory held when it was opened.
#[derive(Debug, Default)]
pub struct Recovered {
    /// Profiles with unpublished increments.
    pub keys: Vec<SpoolKey>,
    /// Records skipped because they failed their checksum or did not parse.
    pub quarantined: u64,
}

/// The spool (see the module documentation).
pub struct Spool {
    dir: PathBuf,
    rotate_after: Duration,
    segments: BTreeMap<u64, Segment>,
    writer: Option<Writer>,
    keys: BTreeMap<SpoolKey, Vec<Loc>>,
    /// Per epoch: summary deltas not yet in a written `summary.json`, (seq, segment, delta).
    deltas: BTreeMap<String, Vec<(u64, u64, SummaryDelta)>>,
    last_seq: u64,
    quarantined: u64,
    bytes_appended: u64,
    /// Published marks not yet appended.
    marks: Vec<(SpoolKey, u64)>,
}

impl std::fmt::Debug for Spool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spool").field("dir", &self.dir).field("last_seq", &self.last_seq).finish()
    }
}

fn now_micros() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

fn kind_from_u8(k: u64) -> ImageKind {
    ImageKind::from_code(u8::try_from(k).unwrap_or(u8::MAX)).unwrap_or(ImageKind::Unknown)
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    varint::write_u64(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Bounds-checked reader of a record payload.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn u(&mut self) -> Result<u64, String> {
        varint::read_u64(self.buf, &mut self.pos).map_err(|e: VarintError| e.to_string())
    }
    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = self.u()?;
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|e| *e <= self.buf.len())
            .ok_or_else(|| format!("{n} bytes run past the record"))?;
        let b = &self.buf[self.pos..end];
        self.pos = end;
        Ok(b)
    }
    fn string(&mut self) -> Result<String, String> {
        Ok(String::from_utf8_lossy(self.bytes()?).into_owned())
    }
}

fn encode_event(out: &mut Vec<u8>, d: &EventDesc) {
    put_bytes(out, d.name.as_bytes());
    varint::write_u64(out, u64::from(d.perf_type));
    varint::write_u64(out, d.perf_config);
    varint::write_u64(out, d.period_mean);
    varint::write_u64(out, d.period_min);
    varint::write_u64(out, d.period_max);
}

fn decode_event(c: &mut Cursor<'_>) -> Result<EventDesc, String> {
    Ok(EventDesc {
        name: c.string()?,
        perf_type: u32::try_from(c.u()?).map_err(|_| "perf_type exceeds 32 bits".to_string())?,
        perf_config: c.u()?,
        period_mean: c.u()?,
        period_min: c.u()?,
        period_max: c.u()?,
    })
}

fn encode_image(out: &mut Vec<u8>, text: &str, img: &SpoolImage) {
    put_bytes(out, text.as_bytes());
    varint::write_u64(out, img.kind as u64);
    put_bytes(out, &img.path);
    varint::write_u64(out, img.jit.len() as u64);
    for s in &img.jit {
        varint::write_u64(out, s.start);
        varint::write_u64(out, s.size);
        put_bytes(out, s.name.as_bytes());
    }
}

fn decode_image(c: &mut Cursor<'_>) -> Result<(String, SpoolImage), String> {
    let text = c.string()?;
    let kind = kind_from_u8(c.u()?);
    let path = c.bytes()?.to_vec();
    let n = c.u()?;
    let mut jit = Vec::new();
    for _ in 0..n {
        let start = c.u()?;
        let size = c.u()?;
        jit.push(JitSymbol { start, size, name: c.string()? });
    }
    Ok((text, SpoolImage { kind, path, jit, who: None }))
}

/// The qualifier of a tag 3 definition (after its image).
fn decode_who(c: &mut Cursor<'_>) -> Result<ProfileWho, String> {
    match c.u()? {
        1 => {
            let pid = u32::try_from(c.u()?).map_err(|_| "pid exceeds 32 bits".to_string())?;
            Ok(ProfileWho::Pid { pid, command: c.bytes()?.to_vec() })
        }
        2 => Ok(ProfileWho::Cgroup { path: c.string()? }),
        3 => Ok(ProfileWho::Command { command: c.bytes()?.to_vec() }),
        t => Err(format!("unknown qualifier tag {t}")),
    }
}

/// An increment of a parsed record: image id text, offset of the entry in the payload, its
/// length, event, image.
type ParsedEntry = (Option<String>, u64, u32, Arc<EventDesc>, Option<Arc<SpoolImage>>);

/// An increment's total period and (offset, count) pairs.
pub type Counts = (u64, Vec<(u64, u64)>);

/// A record decoded far enough to index it.
struct Parsed {
    seq: u64,
    epoch: String,
    delta: SummaryDelta,
    /// (image text, event name, offset of the entry in the payload, its length, desc, image).
    entries: Vec<ParsedEntry>,
}

type SegDefs = (HashMap<u64, Arc<EventDesc>>, HashMap<u64, (String, Arc<SpoolImage>)>);

enum Record {
    Flush(Parsed),
    Marks(Vec<(SpoolKey, u64)>),
    /// Kind 3: increments only, no summary delta.
    Stacks(Parsed),
}

fn parse_record(payload: &[u8], defs: &mut SegDefs) -> Result<Record, String> {
    let mut c = Cursor { buf: payload, pos: 0 };
    match c.u()? {
        KIND_FLUSH => parse_flush(c, defs).map(Record::Flush),
        KIND_MARKS => {
            let n = c.u()?;
            let mut marks = Vec::new();
            for _ in 0..n {
                let epoch = c.string()?;
                let image = c.string()?;
                let event = c.string()?;
                let seq = c.u()?;
                let image = (!image.is_empty()).then_some(image);
                marks.push((SpoolKey { epoch, image, event }, seq));
            }
            if c.pos != payload.len() {
                return Err(format!("{} bytes after the marks", payload.len() - c.pos));
            }
            Ok(Record::Marks(marks))
        }
        stacks::KIND_STACKS => stacks::parse_stacks(c).map(Record::Stacks),
        k => Err(format!("unknown record kind {k}")),
    }
}

const KIND_FLUSH: u64 = 1;
const KIND_MARKS: u64 = 2;

/// Decode record payloads (each as it follows its length and CRC in a segment) in order, the
/// definitions of one available to the next, as a segment is read at start; returns how many
/// decoded. For the fuzz target (`fuzz/fuzz_targets/spool_record.rs`): any bytes give an error
/// or a record, never a panic.
pub fn decode_records<'a>(payloads: impl IntoIterator<Item = &'a [u8]>) -> usize {
    let mut defs = SegDefs::default();
    payloads.into_iter().filter(|p| parse_record(p, &mut defs).is_ok()).count()
}

fn parse_flush(mut c: Cursor<'_>, defs: &mut SegDefs) -> Result<Parsed, String> {
    let payload = c.buf;
    let seq = c.u()?;
    let epoch = c.string()?;
    let ndefs = c.u()?;
    for _ in 0..ndefs {
        let tag = c.u()?;
        let id = c.u()?;
        match tag {
            1 => {
                let d = decode_event(&mut c)?;
                defs.0.insert(id, Arc::new(d));
            }
            2 => {
                let (text, img) = decode_image(&mut c)?;
                defs.1.insert(id, (text, Arc::new(img)));
            }
            3 => {
                let (text, mut img) = decode_image(&mut c)?;
                img.who = Some(decode_who(&mut c)?);
                defs.1.insert(id, (text, Arc::new(img)));
            }
            t => return Err(format!("unknown definition tag {t}")),
        }
    }
    let event = |defs: &SegDefs, id: u64| {
        defs.0.get(&id).cloned().ok_or_else(|| format!("undefined event id {id}"))
    };
    let mut delta = SummaryDelta {
        samples: c.u()?,
        unknown: c.u()?,
        lost: c.u()?,
        throttled: c.u()?,
        events: Vec::new(),
    };
    let nev = c.u()?;
    for _ in 0..nev {
        let desc = event(defs, c.u()?)?;
        delta.events.push(EventDelta {
            desc: (*desc).clone(),
            samples: c.u()?,
            total_period: c.u()?,
            time_enabled_ns: c.u()?,
            time_running_ns: c.u()?,
        });
    }
    let ninc = c.u()?;
    let mut entries = Vec::new();
    for _ in 0..ninc {
        let start = c.pos;
        let image_id = c.u()?;
        let desc = event(defs, c.u()?)?;
        let _period = c.u()?;
        pairs::read(payload, &mut c.pos, |_, _| {}).map_err(|e| e.to_string())?;
        let image = match image_id {
            0 => None,
            id => Some(defs.1.get(&id).cloned().ok_or_else(|| format!("undefined image {id}"))?),
        };
        let (text, img) = match image {
            Some((t, i)) => (Some(t), Some(i)),
            None => (None, None),
        };
        entries.push((text, start as u64, (c.pos - start) as u32, desc, img));
    }
    if c.pos != payload.len() {
        return Err(format!("{} bytes after the increments", payload.len() - c.pos));
    }
    Ok(Parsed { seq, epoch, delta, entries })
}

/// Rename a segment that held something unusable to `*.corrupt` (kept for inspection; never
/// read again, since only `seg-*.log` names are).
fn set_segment_aside(path: &Path) {
    let mut aside = path.as_os_str().to_owned();
    aside.push(".corrupt");
    if let Err(e) = std::fs::rename(path, &aside) {
        tracing::warn!(file = %path.display(), error = %e, "spool: cannot set a bad segment aside");
    }
}

/// Create the spool directory (and missing parents) mode 0700, and take group and other
/// access away from an existing one: the spool holds the symbol names of every user's
/// processes, and only dcpid reads it (readers use the database). An older dcpid made it 0755.
fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other("not a directory"));
    }
    if meta.permissions().mode() & 0o077 != 0 {
        // Not ours to change (another owner): say so, and use it as it is.
        if let Err(e) = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)) {
            tracing::warn!(dir = %dir.display(), error = %e,
                "spool: cannot make the spool directory private (0700)");
        }
    }
    Ok(())
}

impl Spool {
    /// Open (creating the directory, mode 0700) and index every segment left by earlier runs.
    pub fn open(dir: &Path, rotate_after: Duration) -> Result<(Self, Recovered), SpoolError> {
        let io = |source| SpoolError::Io { path: dir.to_path_buf(), source };
        make_private_dir(dir).map_err(io)?;
        let mut names: Vec<(u64, PathBuf)> = Vec::new();
        for e in std::fs::read_dir(dir).map_err(io)? {
            let e = e.map_err(io)?;
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(hex) = name.strip_prefix("seg-").and_then(|n| n.strip_suffix(".log")) else {
                continue;
            };
            if let Ok(n) = u64::from_str_radix(hex, 16) {
                names.push((n, e.path()));
            }
        }
        names.sort();
        let mut sp = Self {
            dir: dir.to_path_buf(),
            rotate_after,
            segments: BTreeMap::new(),
            writer: None,
            keys: BTreeMap::new(),
            deltas: BTreeMap::new(),
            last_seq: 0,
            quarantined: 0,
            bytes_appended: 0,
            marks: Vec::new(),
        };
        for (id, path) in names {
            if let Err(e) = sp.load_segment(id, path.clone()) {
                // One unreadable segment (a FIFO or directory under its name, an I/O error)
                // must not keep the spool closed, and every later record with it.
                tracing::error!(file = %path.display(), error = %e,
                    "spool: segment unreadable; set aside, the others are published");
                sp.quarantined += 1;
                set_segment_aside(&path);
            }
        }
        sp.gc();
        let rec =
            Recovered { keys: sp.keys.keys().cloned().collect(), quarantined: sp.quarantined };
        Ok((sp, rec))
    }

    fn load_segment(&mut self, id: u64, path: PathBuf) -> Result<(), SpoolError> {
        let io = |source| SpoolError::Io { path: path.clone(), source };
        // Not a plain open: a FIFO under a segment's name would block it, a link to a device
        // would feed it without end.
        let mut file = OpenOptions::new()
            .read(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(&path)
            .map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(SpoolError::Invalid {
                path: path.clone(),
                detail: "not a regular file".into(),
            });
        }
        if meta.len() > MAX_SEGMENT_FILE {
            return Err(SpoolError::Invalid {
                path: path.clone(),
                detail: format!("{} bytes, more than a segment may have", meta.len()),
            });
        }
        let mut bytes = Vec::with_capacity(meta.len() as usize);
        (&mut file).take(MAX_SEGMENT_FILE).read_to_end(&mut bytes).map_err(io)?;
        let mut seg =
            Segment { path: path.clone(), file, len: bytes.len() as u64, refs: 0, corrupt: false };
        if SEGMENT_MAGIC.starts_with(&bytes) {
            // Empty, or cut within its magic: a segment whose creation was interrupted (a
            // kill -9, a full disk under an older dcpid). It holds nothing.
            tracing::info!(file = %path.display(), "spool: empty segment removed");
            if let Err(e) = std::fs::remove_file(&path) {
                tracing::warn!(file = %path.display(), error = %e, "spool: cannot remove an empty segment");
            }
            return Ok(());
        }
        if bytes.len() < SEGMENT_MAGIC.len() || &bytes[..8] != SEGMENT_MAGIC {
            tracing::error!(file = %path.display(), "spool: not a spool segment; set aside");
            seg.corrupt = true;
            self.quarantined += 1;
            self.segments.insert(id, seg);
            return Ok(());
        }
        let mut defs: SegDefs = Default::default();
        let mut pos = SEGMENT_MAGIC.len();
        while pos < bytes.len() {
            let Some(h) = bytes.get(pos..pos + RECORD_HEADER as usize) else {
                tracing::warn!(file = %path.display(), offset = pos, "spool: torn record at the end (ignored)");
                break;
            };
            let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
            let crc = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
            let start = pos + RECORD_HEADER as usize;
            let end = start.saturating_add(len as usize);
            if len > MAX_RECORD || end > bytes.len() {
                if end > bytes.len() && len <= MAX_RECORD {
                    tracing::warn!(file = %path.display(), offset = pos, "spool: torn record at the end (ignored)");
                } else {
                    tracing::error!(file = %path.display(), offset = pos, len,
                        "spool: corrupt record length; rest of the segment quarantined");
                    self.quarantined += 1;
                    seg.corrupt = true;
                }
                break;
            }
            let payload = &bytes[start..end];
            pos = end;
            let parsed = if crc32fast::hash(payload) != crc {
                Err("checksum mismatch".to_string())
            } else {
                parse_record(payload, &mut defs)
            };
            let (rec, has_delta) = match parsed {
                Ok(Record::Flush(r)) => (r, true),
                Ok(Record::Stacks(r)) => (r, false),
                Ok(Record::Marks(marks)) => {
                    for (key, seq) in marks {
                        for s in self.drop_locs(&key, seq) {
                            match self.segments.get_mut(&s) {
                                Some(other) => other.refs = other.refs.saturating_sub(1),
                                None if s == id => seg.refs = seg.refs.saturating_sub(1),
                                None => {}
                            }
                        }
                    }
                    continue;
                }
                Err(detail) => {
                    tracing::error!(file = %path.display(), offset = start - 8, error = %detail,
                        "spool: corrupt record quarantined; publishing goes on without it");
                    self.quarantined += 1;
                    seg.corrupt = true;
                    continue;
                }
            };
            self.last_seq = self.last_seq.max(rec.seq);
            for (image, off, len, desc, img) in rec.entries {
                let key = SpoolKey { epoch: rec.epoch.clone(), image, event: desc.name.clone() };
                self.keys.entry(key).or_default().push(Loc {
                    seq: rec.seq,
                    segment: id,
                    offset: start as u64 + off,
                    len,
                    desc,
                    image: img,
                });
                seg.refs += 1;
            }
            if has_delta {
                self.deltas.entry(rec.epoch).or_default().push((rec.seq, id, rec.delta));
                seg.refs += 1;
            }
        }
        self.segments.insert(id, seg);
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn set_rotate_after(&mut self, d: Duration) {
        self.rotate_after = d;
    }

    fn next_seq(&mut self) -> u64 {
        self.last_seq = (self.last_seq + 1).max(now_micros());
        self.last_seq
    }

    /// Start a new segment if there is none, or the current one is old or large enough.
    fn writer(&mut self, now: Instant) -> Result<&mut Writer, SpoolError> {
        let rotate = match &self.writer {
            None => true,
            Some(w) => {
                let len = self.segments.get(&w.segment).map_or(0, |s| s.len);
                now.saturating_duration_since(w.opened) >= self.rotate_after
                    || len >= MAX_SEGMENT_BYTES
            }
        };
        if rotate {
            if let Some(w) = self.writer.take() {
                if let Some(seg) = self.segments.get(&w.segment) {
                    if w.unsynced {
                        seg.file
                            .sync_data()
                            .map_err(|source| SpoolError::Io { path: seg.path.clone(), source })?;
                    }
                }
                self.writer = None;
                self.gc();
            }
            let id = (self.last_seq + 1).max(now_micros());
            let path = self.dir.join(format!("seg-{id:016x}.log"));
            let io = |source| SpoolError::Io { path: path.clone(), source };
            let mut file = OpenOptions::new()
                .read(true)
                .append(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(io)?;
            if let Err(e) = file.write_all(SEGMENT_MAGIC) {
                // A full disk: the file is empty, and every retry would leave another one
                // (which the next start met as a bad segment). Take it away again.
                drop(file);
                drop(std::fs::remove_file(&path));
                return Err(io(e));
            }
            // The new name must survive a power failure with the data synced into it.
            if let Ok(d) = File::open(&self.dir) {
                drop(d.sync_all());
            }
            self.bytes_appended += SEGMENT_MAGIC.len() as u64;
            self.segments.insert(
                id,
                Segment { path, file, len: SEGMENT_MAGIC.len() as u64, refs: 0, corrupt: false },
            );
            self.writer = Some(Writer {
                segment: id,
                opened: now,
                last_sync: now,
                unsynced: true,
                defs: Defs::default(),
            });
        }
        Ok(self.writer.as_mut().expect("writer set above"))
    }

    /// Append one record: a flush's increments of `epoch` and its summary delta. Returns its
    /// sequence number (also the sequence of every increment in it).
    pub fn append(
        &mut self,
        epoch: &str,
        increments: &[Increment<'_>],
        delta: &SummaryDelta,
        now: Instant,
    ) -> Result<u64, SpoolError> {
        self.writer(now)?;
        let seq = self.next_seq();
        let w = self.writer.as_mut().expect("writer opened");
        // Definitions first: ids new to this segment (or images whose symbols changed).
        let defs = &mut w.defs;
        let defined_before = defs.next_id;
        let mut defs_out = Vec::new();
        let mut ndefs = 0u64;
        let inc_ids: Vec<u64> =
            increments.iter().map(|i| defs.event(i.desc, &mut defs_out, &mut ndefs)).collect();
        let ev_ids: Vec<u64> =
            delta.events.iter().map(|e| defs.event(&e.desc, &mut defs_out, &mut ndefs)).collect();
        let img_ids: Vec<u64> = increments
            .iter()
            .map(|i| i.image.map_or(0, |(t, img)| defs.image(t, img, &mut defs_out, &mut ndefs)))
            .collect();
        let mut p = Vec::with_capacity(64 + defs_out.len() + increments.len() * 16);
        varint::write_u64(&mut p, KIND_FLUSH);
        varint::write_u64(&mut p, seq);
        put_bytes(&mut p, epoch.as_bytes());
        varint::write_u64(&mut p, ndefs);
        p.extend_from_slice(&defs_out);
        for v in [delta.samples, delta.unknown, delta.lost, delta.throttled] {
            varint::write_u64(&mut p, v);
        }
        varint::write_u64(&mut p, delta.events.len() as u64);
        for (e, id) in delta.events.iter().zip(&ev_ids) {
            for v in [*id, e.samples, e.total_period, e.time_enabled_ns, e.time_running_ns] {
                varint::write_u64(&mut p, v);
            }
        }
        varint::write_u64(&mut p, increments.len() as u64);
        let mut spans = Vec::with_capacity(increments.len());
        for ((inc, ev), img) in increments.iter().zip(&inc_ids).zip(&img_ids) {
            let start = p.len();
            varint::write_u64(&mut p, *img);
            varint::write_u64(&mut p, *ev);
            varint::write_u64(&mut p, inc.total_period);
            pairs::write(&mut p, inc.counts.len(), inc.counts.iter().copied());
            spans.push((start, p.len() - start));
        }
        let segment = w.segment;
        let start = match self.write_record(segment, &p) {
            Ok(s) => s,
            Err(e) => {
                // The record (and the definitions in it) is not in the segment: forget them,
                // or the next record would use ids that no reader can resolve after a
                // restart, and be quarantined.
                if let Some(w) = self.writer.as_mut() {
                    w.defs.events.retain(|_, id| *id <= defined_before);
                    w.defs.images.retain(|_, (id, _)| *id <= defined_before);
                }
                return Err(e);
            }
        };
        let payload_at = start + RECORD_HEADER;
        let seg = self.segments.get_mut(&segment).expect("writer's segment is open");
        for (inc, (off, l)) in increments.iter().zip(spans) {
            let image = inc.image.map(|(text, _)| {
                self.writer
                    .as_ref()
                    .and_then(|w| w.defs.images.get(text))
                    .map(|(_, a)| Arc::clone(a))
            });
            let key = SpoolKey {
                epoch: epoch.to_owned(),
                image: inc.image.map(|(t, _)| t.to_owned()),
                event: inc.desc.name.clone(),
            };
            self.keys.entry(key).or_default().push(Loc {
                seq,
                segment,
                offset: payload_at + off as u64,
                len: l as u32,
                desc: Arc::new(inc.desc.clone()),
                image: image.flatten(),
            });
            seg.refs += 1;
        }
        self.deltas.entry(epoch.to_owned()).or_default().push((seq, segment, delta.clone()));
        seg.refs += 1;
        let w = self.writer.as_mut().expect("writer opened");
        w.unsynced = true;
        if now.saturating_duration_since(w.last_sync) >= SYNC_INTERVAL {
            self.sync_at(now)?;
        }
        Ok(seq)
    }

    fn sync_at(&mut self, now: Instant) -> Result<(), SpoolError> {
        if let Some(w) = self.writer.as_mut() {
            if w.unsynced {
                if let Some(seg) = self.segments.get(&w.segment) {
                    seg.file
                        .sync_data()
                        .map_err(|source| SpoolError::Io { path: seg.path.clone(), source })?;
                }
                w.unsynced = false;
                w.last_sync = now;
            }
        }
        Ok(())
    }

    /// `fdatasync` what was appended (shutdown; power-failure safety).
    pub fn sync(&mut self) -> Result<(), SpoolError> {
        self.sync_at(Instant::now())
    }

    /// Every profile with unpublished increments.
    pub fn dirty_keys(&self) -> Vec<SpoolKey> {
        self.keys.keys().cloned().collect()
    }

    /// The unpublished increments of one profile, in sequence order, without their counts
    /// (read them one at a time with [`Spool::counts`]: a publish of a busy profile covers a
    /// publish interval of flushes, and decoding them all at once made a multi-MB peak).
    pub fn increments(&self, key: &SpoolKey) -> Vec<SpooledIncrement> {
        self.keys
            .get(key)
            .map(|locs| {
                locs.iter()
                    .map(|l| SpooledIncrement {
                        seq: l.seq,
                        desc: Arc::clone(&l.desc),
                        image: l.image.clone(),
                        loc: l.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// An increment's (total period, (offset, count) pairs). `None` if it can no longer be
    /// decoded: it is then counted as quarantined and the caller goes on without it.
    pub fn counts(&mut self, inc: &SpooledIncrement) -> Result<Option<Counts>, SpoolError> {
        let loc = &inc.loc;
        let Some(seg) = self.segments.get(&loc.segment) else { return Ok(None) };
        let mut buf = vec![0u8; loc.len as usize];
        // A read error here (the segment was truncated or damaged after it was indexed) would
        // recur on every retry and hold up every profile after this one: quarantine it.
        let read = seg.file.read_exact_at(&mut buf, loc.offset).map_err(|e| e.to_string());
        let mut c = Cursor { buf: &buf, pos: 0 };
        let decoded = read.and_then(|()| -> Result<(u64, Vec<(u64, u64)>), String> {
            c.u()?;
            c.u()?;
            let period = c.u()?;
            let mut counts = Vec::new();
            pairs::read(&buf, &mut c.pos, |o, n| counts.push((o, n))).map_err(|e| e.to_string())?;
            Ok((period, counts))
        });
        match decoded {
            Ok(v) => Ok(Some(v)),
            Err(e) => {
                tracing::error!(file = %seg.path.display(), offset = loc.offset, error = %e,
                    "spool: increment unreadable; quarantined");
                self.quarantine_increment(loc.segment);
                Ok(None)
            }
        }
    }

    /// An increment cannot be used: count it, and keep its segment for inspection (renamed
    /// `*.corrupt` instead of deleted once nothing else in it is pending). The caller still
    /// marks it published, so that it is not offered again.
    pub fn quarantine(&mut self, inc: &SpooledIncrement) {
        self.quarantine_increment(inc.loc.segment);
    }

    fn quarantine_increment(&mut self, segment: u64) {
        self.quarantined += 1;
        if let Some(seg) = self.segments.get_mut(&segment) {
            seg.corrupt = true;
        }
    }

    /// Frame and append one record to `segment`; returns where it starts.
    fn write_record(&mut self, segment: u64, payload: &[u8]) -> Result<u64, SpoolError> {
        let len =
            u32::try_from(payload.len()).ok().filter(|l| *l <= MAX_RECORD).ok_or_else(|| {
                SpoolError::Invalid {
                    path: self.dir.clone(),
                    detail: format!("a record of {} bytes is too large", payload.len()),
                }
            })?;
        let mut rec = Vec::with_capacity(payload.len() + 8);
        rec.extend_from_slice(&len.to_le_bytes());
        rec.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
        rec.extend_from_slice(payload);
        let seg = self.segments.get_mut(&segment).expect("writer's segment is open");
        let start = seg.len;
        if let Err(source) = seg.file.write_all(&rec) {
            // Cut a partial record off so that later records stay readable.
            drop(seg.file.set_len(start));
            return Err(SpoolError::Io { path: seg.path.clone(), source });
        }
        seg.len += rec.len() as u64;
        self.bytes_appended += rec.len() as u64;
        if let Some(w) = self.writer.as_mut() {
            w.unsynced = true;
        }
        Ok(start)
    }

    /// Remove `key`'s locations up to `seq`; returns the segments they were in.
    fn drop_locs(&mut self, key: &SpoolKey, seq: u64) -> Vec<u64> {
        let Some(locs) = self.keys.get_mut(key) else { return Vec::new() };
        let mut freed = Vec::new();
        locs.retain(|l| {
            let keep = l.seq > seq;
            if !keep {
                freed.push(l.segment);
            }
            keep
        });
        if locs.is_empty() {
            self.keys.remove(key);
        }
        freed
    }

    /// The increments of `key` up to `seq` are published: forget them (a mark is appended by
    /// the next [`Spool::write_marks`]) and delete the segments nothing refers to any more.
    pub fn published(&mut self, key: &SpoolKey, seq: u64) {
        let freed = self.drop_locs(key, seq);
        if freed.is_empty() {
            return;
        }
        for s in freed {
            if let Some(seg) = self.segments.get_mut(&s) {
                seg.refs = seg.refs.saturating_sub(1);
            }
        }
        self.marks.push((key.clone(), seq));
        self.gc();
    }

    /// Append the marks of the profiles published since the last call, as one record.
    pub fn write_marks(&mut self, now: Instant) -> Result<(), SpoolError> {
        if self.marks.is_empty() {
            return Ok(());
        }
        let mut p = Vec::with_capacity(self.marks.len() * 48);
        varint::write_u64(&mut p, KIND_MARKS);
        varint::write_u64(&mut p, self.marks.len() as u64);
        for (k, seq) in &self.marks {
            put_bytes(&mut p, k.epoch.as_bytes());
            put_bytes(&mut p, k.image.as_deref().unwrap_or("").as_bytes());
            put_bytes(&mut p, k.event.as_bytes());
            varint::write_u64(&mut p, *seq);
        }
        let segment = self.writer(now)?.segment;
        self.write_record(segment, &p)?;
        self.marks.clear();
        Ok(())
    }

    /// Summary deltas of `epoch` with a sequence above `after` (to rebuild a summary after a
    /// restart on top of the `summary.json` that included everything up to `after`).
    pub fn summary_deltas(&self, epoch: &str, after: u64) -> Vec<SummaryDelta> {
        self.deltas
            .get(epoch)
            .map(|v| v.iter().filter(|d| d.0 > after).map(|d| d.2.clone()).collect())
            .unwrap_or_default()
    }

    /// The highest sequence of a summary delta of `epoch` held (0 if none).
    pub fn summary_seq(&self, epoch: &str) -> u64 {
        self.deltas.get(epoch).and_then(|v| v.last()).map_or(0, |d| d.0)
    }

    /// `summary.json` of `epoch` now includes every delta up to `seq`.
    pub fn summary_published(&mut self, epoch: &str, seq: u64) {
        let Some(v) = self.deltas.get_mut(epoch) else { return };
        let mut freed = Vec::new();
        v.retain(|d| {
            let keep = d.0 > seq;
            if !keep {
                freed.push(d.1);
            }
            keep
        });
        if v.is_empty() {
            self.deltas.remove(epoch);
        }
        for s in freed {
            if let Some(seg) = self.segments.get_mut(&s) {
                seg.refs = seg.refs.saturating_sub(1);
            }
        }
        self.gc();
    }

    /// Forget an epoch entirely (retention removed it).
    pub fn forget_epoch(&mut self, epoch: &str) {
        let keys: Vec<SpoolKey> = self.keys.keys().filter(|k| k.epoch == epoch).cloned().collect();
        for k in keys {
            self.published(&k, u64::MAX);
        }
        self.summary_published(epoch, u64::MAX);
    }

    /// Epochs that have summary deltas not yet in a `summary.json`.
    pub fn summary_epochs(&self) -> Vec<String> {
        self.deltas.keys().cloned().collect()
    }

    /// Delete the oldest segments while nothing in them is pending (never the one being
    /// written). Oldest first only: marks in a later segment must outlive the increments
    /// they are about.
    fn gc(&mut self) {
        let current = self.writer.as_ref().map(|w| w.segment);
        while let Some((&id, seg)) = self.segments.first_key_value() {
            if seg.refs > 0 || current == Some(id) {
                break;
            }
            let seg = self.segments.remove(&id).expect("present");
            if seg.corrupt {
                set_segment_aside(&seg.path);
            } else if let Err(e) = std::fs::remove_file(&seg.path) {
                tracing::warn!(file = %seg.path.display(), error = %e, "spool: cannot remove a published segment");
            }
        }
    }

    /// (increments not yet published, their bytes, live segments).
    pub fn backlog(&self) -> (u64, u64) {
        let (mut n, mut bytes) = (0u64, 0u64);
        for locs in self.keys.values() {
            n += locs.len() as u64;
            bytes += locs.iter().map(|l| u64::from(l.len)).sum::<u64>();
        }
        (n, bytes)
    }

    /// Records and increments quarantined since the spool was opened.
    pub fn quarantined(&self) -> u64 {
        self.quarantined
    }

    /// Bytes this process appended to segments (headers included).
    pub fn bytes_appended(&self) -> u64 {
        self.bytes_appended
    }

    /// Segment files currently live.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc() -> EventDesc {
        EventDesc {
            name: "cpu-clock".into(),
            perf_type: 1,
            perf_config: 0,
            period_mean: 1000,
            period_min: 900,
            period_max: 1000,
        }
    }

    fn key(img: Option<&str>) -> SpoolKey {
        SpoolKey { epoch: "E1".into(), image: img.map(String::from), event: "cpu-clock".into() }
    }

    #[test]
    fn qualified_images_survive_a_reopen_beside_the_flat_one() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _) = Spool::open(dir.path(), Duration::from_secs(60)).unwrap();
        let flat =
            SpoolImage { kind: ImageKind::Elf, path: b"/bin/x".to_vec(), jit: vec![], who: None };
        let pid = SpoolImage {
            who: Some(ProfileWho::Pid { pid: 42, command: b"busy".to_vec() }),
            ..flat.clone()
        };
        let cg =
            SpoolImage { who: Some(ProfileWho::Cgroup { path: "/a/b".into() }), ..flat.clone() };
        let d = desc();
        let (c1, c2) = (vec![(10, 3)], vec![(10, 2)]);
        let inc = [
            Increment { image: Some(("b01", &flat)), desc: &d, total_period: 3, counts: &c1 },
            Increment { image: Some(("b01.pid-42", &pid)), desc: &d, total_period: 2, counts: &c2 },
            Increment { image: Some(("b01.cg-00", &cg)), desc: &d, total_period: 2, counts: &c2 },
        ];
        s.append("E1", &inc, &SummaryDelta::default(), Instant::now()).unwrap();
        drop(s);
        let (mut s, rec) = Spool::open(dir.path(), Duration::from_secs(60)).unwrap();
        assert_eq!(rec.quarantined, 0);
        assert_eq!(
            rec.keys,
            vec![key(Some("b01")), key(Some("b01.cg-00")), key(Some("b01.pid-42"))]
        );
        for (k, img, c) in [("b01", &flat, &c1), ("b01.pid-42", &pid, &c2), ("b01.cg-00", &cg, &c2)]
        {
            let incs = s.increments(&key(Some(k)));
            assert_eq!(**incs[0].image.as_ref().unwrap(), *img, "{k}");
            assert_eq!(s.counts(&incs[0]).unwrap().unwrap().1, *c, "{k}");
        }
    }

    #[test]
    fn append_reopen_publish_and_delete() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/spool");
        let (mut s, rec) = Spool::open(&p, Duration::from_secs(60)).unwrap();
        assert!(rec.keys.is_empty());
        let img =
            SpoolImage { kind: ImageKind::Elf, path: b"/bin/x".to_vec(), jit: vec![], who: None };
        let d = desc();
        let counts = vec![(10, 2), (20, 1)];
        let inc = [
            Increment { image: Some(("b01", &img)), desc: &d, total_period: 3000, counts: &counts },
            Increment { image: None, desc: &d, total_period: 1000, counts: &counts[..1] },
        ];
        let delta = SummaryDelta { samples: 5, ..Default::default() };
        let now = Instant::now();
        let s1 = s.append("E1", &inc, &delta, now).unwrap();
        assert!(s1 > 1_000_000_000_000, "sequence starts at a time base: {s1}");
        let first = s.bytes_appended();
        let s2 = s.append("E1", &inc[..1], &SummaryDelta::default(), now).unwrap();
        assert!(s2 > s1);
        // The second record defines nothing again: ids only, ~2 bytes per pair.
        assert!(s.bytes_appended() - first < 40, "{}", s.bytes_appended() - first);
        assert_eq!(s.backlog().0, 3);
        drop(s);
        let (mut s, rec) = Spool::open(&p, Duration::from_secs(60)).unwrap();
        assert_eq!(rec.keys, vec![key(None), key(Some("b01"))]);
        let incs = s.increments(&key(Some("b01")));
        assert_eq!(incs.len(), 2);
        assert_eq!(s.counts(&incs[0]).unwrap(), Some((3000, counts.clone())));
        assert_eq!(incs[0].seq, s1);
        assert_eq!(**incs[0].image.as_ref().unwrap(), img);
        assert_eq!(*incs[0].desc, d);
        assert_eq!(s.summary_deltas("E1", 0).len(), 2);
        assert_eq!(s.summary_deltas("E1", s1).len(), 1);
        // Everything published: the old segment goes.
        s.published(&key(Some("b01")), s2);
        s.published(&key(None), s2);
        s.summary_published("E1", s2);
        assert_eq!(s.segment_count(), 0);
        assert_eq!(std::fs::read_dir(&p).unwrap().count(), 0);
        // A new sequence is above everything issued, even with the old files gone.
        let s3 = s.append("E1", &inc, &delta, Instant::now()).unwrap();
        assert!(s3 > s2);
    }

    #[test]
    fn corrupt_record_is_quarantined_and_torn_tail_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("spool");
        let img =
            SpoolImage { kind: ImageKind::Elf, path: b"/bin/x".to_vec(), jit: vec![], who: None };
        let d = desc();
        let c1 = vec![(10, 2)];
        let c2 = vec![(30, 4)];
        let c3 = vec![(50, 1)];
        let seg;
        {
            let (mut s, _) = Spool::open(&p, Duration::from_secs(60)).unwrap();
            let now = Instant::now();
            for c in [&c1, &c2, &c3] {
                let inc = [Increment {
                    image: Some(("b01", &img)),
                    desc: &d,
                    total_period: 1,
                    counts: c,
                }];
                s.append("E1", &inc, &SummaryDelta::default(), now).unwrap();
            }
            seg = s.segments.values().next().unwrap().path.clone();
        }
        let mut bytes = std::fs::read(&seg).unwrap();
        // Flip the last byte (a count) of the middle record; the first record (which defines
        // the image) and the last stay good.
        let n = bytes.len();
        let mut pos = 8;
        let mut starts = Vec::new();
        while pos < n {
            starts.push(pos);
            let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
            pos += 8 + len;
        }
        assert_eq!(starts.len(), 3);
        bytes[starts[2] - 1] ^= 0x40;
        // And a torn fourth record.
        bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2]);
        std::fs::write(&seg, &bytes).unwrap();
        let (mut s, rec) = Spool::open(&p, Duration::from_secs(60)).unwrap();
        assert_eq!(rec.quarantined, 1);
        let got: Vec<_> = s
            .increments(&key(Some("b01")))
            .iter()
            .map(|i| s.counts(i).unwrap().unwrap().1)
            .collect();
        assert_eq!(got, vec![c1.clone(), c3.clone()]);
        // Once published, the segment with the bad record is set aside, not deleted.
        s.published(&key(Some("b01")), u64::MAX);
        s.summary_published("E1", u64::MAX);
        let mut aside = seg.into_os_string();
        aside.push(".corrupt");
        assert!(Path::new(&aside).exists());
    }
}
