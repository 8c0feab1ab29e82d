//! A host directory's slices as segment files (FORMAT.md §14.5): minute slices in one
//! append-only file per UTC hour (`slices.<hour>.log`, the hour's start in Unix seconds), hour
//! roll-ups appended to `slices.hours.log`, and a single-file `slices.log` of an older dcpid
//! (version 1 or 2, §14.2) read as it is. Each file is a slice log of §14.2 on its own (its own
//! header and key table), so a range query decodes only the files its range needs.
//!
//! Why: with one file per host-epoch the hourly roll-up rewrote the whole file (~9.6 MB an
//! hour on the busy mix), and every range query read it whole (~11 MB a host-day). A roll-up
//! now appends one record to `slices.hours.log` and then unlinks the hour's segment; a reader
//! takes a segment only while no roll-up record of its hour is visible, so a crash between the
//! append and the unlink counts the hour once (BENCHMARKS.md "Time-slice segments").

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use super::{
    Slice, SliceIndex, SliceLog, SliceTotals, SliceWriter, FRAME_LEN, MAX_RECORD, SLICES_HEADER_LEN,
};
use crate::codec;
use crate::codec::Reader;
use crate::db::HostDir;
use crate::error::{Error, Result};
use crate::safeio;
use crate::safeio::open_regular;

/// The roll-up file of a host directory: hour slices, appended (FORMAT.md §14.5).
pub const SLICE_HOURS_FILE: &str = "slices.hours.log";
/// Seconds of a segment: one UTC hour.
pub const SEGMENT_SECS: u64 = 3600;

/// The hour (Unix seconds, a multiple of [`SEGMENT_SECS`]) of a segment file name
/// `slices.<hour>.log`; `None` for any other name (the roll-up file, a set-aside file).
pub fn segment_hour(name: &str) -> Option<u64> {
    let h = name.strip_prefix("slices.")?.strip_suffix(".log")?;
    if h.is_empty() || !h.bytes().all(|b| b.is_ascii_digit()) || (h.len() > 1 && h.starts_with('0'))
    {
        return None;
    }
    h.parse::<u64>().ok().filter(|h| h % SEGMENT_SECS == 0)
}

/// The hour of Unix time `t`.
pub fn hour_of(t: u64) -> u64 {
    t - t % SEGMENT_SECS
}

fn intersects(start: u64, end: u64, since: Option<u64>, until: Option<u64>) -> bool {
    start < until.unwrap_or(u64::MAX) && end > since.unwrap_or(0)
}

fn not_found(e: &Error) -> bool {
    matches!(e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
}

/// (start, len) of the complete records of the slice log at `path`, read from the frames and
/// the first bytes of each body only (the payloads are skipped): which hours a roll-up file
/// holds. A record counts as complete when its frame and body fit in the file; checksums are
/// checked only by a full read ([`SliceLog::read`]). `Ok(None)`: no such file.
pub fn record_spans(path: &Path) -> Result<Option<Vec<(u64, u64)>>> {
    let (f, size) = match open_regular(path) {
        Ok(x) => x,
        Err(e) if not_found(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut f = std::io::BufReader::with_capacity(4096, f);
    let mut head = [0u8; SLICES_HEADER_LEN];
    if size < SLICES_HEADER_LEN as u64 {
        return Err(Error::Truncated {
            path: path.into(),
            expected: SLICES_HEADER_LEN as u64,
            actual: size,
        });
    }
    f.read_exact(&mut head).map_err(|e| Error::io(path, e))?;
    super::check_header(&head, path)?;
    let mut pos = SLICES_HEADER_LEN as u64;
    let mut out = Vec::new();
    while pos + FRAME_LEN as u64 <= size {
        let mut frame = [0u8; FRAME_LEN];
        f.read_exact(&mut frame).map_err(|e| Error::io(path, e))?;
        let len = u32::from_le_bytes([frame[0], frame[1], frame[2], frame[3]]) as u64;
        if len > MAX_RECORD as u64 {
            return Err(codec::corrupt(
                path,
                "record length",
                format!("{len} bytes at file byte {pos} (at most {MAX_RECORD})"),
            ));
        }
        if pos + FRAME_LEN as u64 + len > size {
            break;
        }
        let take = len.min(32) as usize;
        let mut body = vec![0u8; take];
        f.read_exact(&mut body).map_err(|e| Error::io(path, e))?;
        let mut r = Reader::new(&body, path);
        let start = r.varint("start")?;
        let l = r.varint("len")?;
        out.push((start, l));
        // At most 64 MiB (checked above): fits an i64.
        let skip = i64::try_from(len - take as u64).unwrap_or(i64::MAX);
        f.seek_relative(skip).map_err(|e| Error::io(path, e))?;
        pos += FRAME_LEN as u64 + len;
    }
    Ok(Some(out))
}

/// The slice files of a host directory, as listed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SliceFiles {
    /// A single-file log of an older dcpid (§14.2).
    pub legacy: bool,
    /// The roll-up file exists.
    pub hours: bool,
    /// Hours of the minute segments.
    pub segments: BTreeSet<u64>,
}

impl SliceFiles {
    pub fn is_empty(&self) -> bool {
        !self.legacy && !self.hours && self.segments.is_empty()
    }
}

/// Slices of several files combined into one log: sequences renumbered (each file numbers
/// its own), resolutions kept.
fn combine(logs: Vec<SliceLog>) -> SliceLog {
    let mut out = SliceLog::default();
    for log in logs {
        out.valid_len += log.valid_len;
        out.torn_tail += log.torn_tail;
        for mut s in log.slices {
            let res = log.resolution.get(&s.seq).copied();
            s.seq = out.slices.len() as u64 + 1;
            if let Some(r) = res {
                out.resolution.insert(s.seq, r);
            }
            out.slices.push(s);
        }
    }
    out
}

/// Totals of several files combined: keys merged into one table, sequences renumbered.
fn combine_totals(logs: Vec<SliceTotals>) -> SliceTotals {
    let mut out = SliceTotals::default();
    let mut index: BTreeMap<super::SliceKey, usize> = BTreeMap::new();
    for log in logs {
        let map: Vec<usize> = log
            .keys
            .iter()
            .map(|k| {
                *index.entry(k.clone()).or_insert_with(|| {
                    out.keys.push(k.clone());
                    out.keys.len() - 1
                })
            })
            .collect();
        for mut s in log.slices {
            let res = log.resolution.get(&s.seq).copied();
            s.seq = out.slices.len() as u64 + 1;
            for t in &mut s.totals {
                t.0 = map[t.0];
            }
            if let Some(r) = res {
                out.resolution.insert(s.seq, r);
            }
            out.slices.push(s);
        }
    }
    out
}

/// How a host directory's files are decoded: whole, or as totals.
trait Decode: Sized {
    fn read(path: &Path) -> Result<Option<Self>>;
    fn spans(&self) -> Vec<(u64, u64)>;
    fn combine(v: Vec<Self>) -> Self;
}

impl Decode for SliceLog {
    fn read(path: &Path) -> Result<Option<Self>> {
        Self::read(path)
    }
    fn spans(&self) -> Vec<(u64, u64)> {
        self.slices.iter().map(|s| (s.start, s.len)).collect()
    }
    fn combine(v: Vec<Self>) -> Self {
        combine(v)
    }
}

impl Decode for SliceTotals {
    fn read(path: &Path) -> Result<Option<Self>> {
        SliceLog::read_totals(path)
    }
    fn spans(&self) -> Vec<(u64, u64)> {
        self.slices.iter().map(|s| (s.start, s.len)).collect()
    }
    fn combine(v: Vec<Self>) -> Self {
        combine_totals(v)
    }
}

impl Decode for SliceIndex {
    fn read(path: &Path) -> Result<Option<Self>> {
        Self::read(path)
    }
    fn spans(&self) -> Vec<(u64, u64)> {
        self.totals.spans()
    }
    fn combine(v: Vec<Self>) -> Self {
        Self::combine(v)
    }
}

fn hours_of(spans: &[(u64, u64)]) -> BTreeSet<u64> {
    spans.iter().map(|s| hour_of(s.0)).collect()
}

impl HostDir {
    /// The roll-up file of this host directory (FORMAT.md §14.5).
    pub fn slice_hours_path(&self) -> PathBuf {
        self.path.join(SLICE_HOURS_FILE)
    }

    /// The minute segment of the UTC hour `hour` (Unix seconds, rounded down to the hour).
    pub fn slice_segment_path(&self, hour: u64) -> PathBuf {
        self.path.join(format!("slices.{}.log", hour_of(hour)))
    }

    /// The slice files present (a directory that is gone has none).
    pub fn slice_files(&self) -> Result<SliceFiles> {
        let mut out = SliceFiles::default();
        let rd = match std::fs::read_dir(&self.path) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(Error::io(&self.path, e)),
        };
        for e in rd {
            let e = e.map_err(|e| Error::io(&self.path, e))?;
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if name == super::SLICES_FILE {
                out.legacy = true;
            } else if name == SLICE_HOURS_FILE {
                out.hours = true;
            } else if let Some(h) = segment_hour(name) {
                out.segments.insert(h);
            }
        }
        Ok(out)
    }

    /// Whether the directory keeps a time axis (any slice file).
    pub fn has_slices(&self) -> Result<bool> {
        self.slice_files().map(|f| !f.is_empty())
    }

    /// Paths of every slice file present (what a cache of a range's answer depends on).
    pub fn slice_paths(&self) -> Result<Vec<PathBuf>> {
        let f = self.slice_files()?;
        let mut v = Vec::new();
        if f.legacy {
            v.push(self.slices_path());
        }
        if f.hours {
            v.push(self.slice_hours_path());
        }
        v.extend(f.segments.iter().map(|h| self.slice_segment_path(*h)));
        Ok(v)
    }

    /// Write `log`'s slices at once as dcpid lays them out (FORMAT.md §14.5): slices an hour
    /// long or more to the roll-up file, the others to their hour's segment, each file
    /// replaced atomically, resolutions kept. For tests and benchmarks that build a database;
    /// dcpid appends ([`SegmentWriter`]).
    pub fn write_slices(&self, log: &SliceLog) -> Result<()> {
        let mut files: BTreeMap<Option<u64>, SliceLog> = BTreeMap::new();
        for s in &log.slices {
            let k = (s.len < SEGMENT_SECS).then(|| hour_of(s.start));
            let f = files.entry(k).or_default();
            let mut s2 = s.clone();
            s2.seq = f.slices.len() as u64 + 1;
            if let Some(r) = log.resolution.get(&s.seq) {
                f.resolution.insert(s2.seq, *r);
            }
            f.slices.push(s2);
        }
        for (k, f) in files {
            let p = k.map_or_else(|| self.slice_hours_path(), |h| self.slice_segment_path(h));
            crate::write_atomic(&p, &f.encode())?;
        }
        Ok(())
    }

    /// This host directory's slices (FORMAT.md §14), read safely (§6.1) from all its slice
    /// files; `Ok(None)`: it has none (written before §14, or with slices off): no time axis.
    pub fn read_slices(&self) -> Result<Option<SliceLog>> {
        self.read_slices_in(None, None)
    }

    /// The slices of the files that may hold slices intersecting `[since, until)` (Unix
    /// seconds, `None`: unbounded): what a range query reads. The result can hold slices
    /// outside the range (whole files are decoded); select with [`SliceLog::range`].
    pub fn read_slices_in(
        &self,
        since: Option<u64>,
        until: Option<u64>,
    ) -> Result<Option<SliceLog>> {
        self.read_in::<SliceLog>(since, until)
    }

    /// [`HostDir::read_slices_in`] as totals per slice and key ([`SliceLog::read_totals`]).
    pub fn read_slice_totals_in(
        &self,
        since: Option<u64>,
        until: Option<u64>,
    ) -> Result<Option<SliceTotals>> {
        self.read_in::<SliceTotals>(since, until)
    }

    /// [`HostDir::read_slice_totals_in`], each slice's pairs decoded on demand
    /// ([`SliceIndex::pairs`]).
    pub fn read_slice_index_in(
        &self,
        since: Option<u64>,
        until: Option<u64>,
    ) -> Result<Option<SliceIndex>> {
        self.read_in::<SliceIndex>(since, until)
    }

    /// FORMAT.md §14.5, reading: the segments of the range whose hour has no roll-up record,
    /// then the roll-up file when its records meet the range (or a segment vanished: rolled
    /// up meanwhile, so its record is there now), then the older single file.
    fn read_in<D: Decode>(&self, since: Option<u64>, until: Option<u64>) -> Result<Option<D>> {
        let files = self.slice_files()?;
        if files.is_empty() {
            return Ok(None);
        }
        let hours_path = self.slice_hours_path();
        let spans =
            if files.hours { record_spans(&hours_path)?.unwrap_or_default() } else { vec![] };
        let rolled = hours_of(&spans);
        let wanted = |h: u64| intersects(h, h + SEGMENT_SECS, since, until);
        let mut segs: BTreeMap<u64, D> = BTreeMap::new();
        let mut vanished = false;
        for &h in files.segments.iter().filter(|h| wanted(**h) && !rolled.contains(h)) {
            match D::read(&self.slice_segment_path(h))? {
                Some(d) => {
                    segs.insert(h, d);
                }
                None => vanished = true,
            }
        }
        let need_hours = vanished
            || spans.iter().any(|&(s, l)| intersects(s, s.saturating_add(l), since, until));
        let mut parts = Vec::new();
        if need_hours {
            if let Some(hours) = D::read(&hours_path)? {
                // The records the full read accepted decide (a torn last record does not).
                let rolled = hours_of(&hours.spans());
                segs.retain(|h, _| !rolled.contains(h));
                for &h in files.segments.iter().filter(|h| wanted(**h)) {
                    if !rolled.contains(&h) && !segs.contains_key(&h) {
                        if let Some(d) = D::read(&self.slice_segment_path(h))? {
                            segs.insert(h, d);
                        }
                    }
                }
                parts.push(hours);
            }
        }
        if files.legacy {
            if let Some(l) = D::read(&self.slices_path())? {
                parts.insert(0, l);
            }
        }
        parts.extend(segs.into_values());
        Ok(Some(D::combine(parts)))
    }
}

/// What [`SegmentWriter::open`] found.
#[derive(Debug, Default)]
pub struct SegmentOpen {
    /// Segments whose hour was already rolled up (a crash between a roll-up's append and its
    /// unlink), removed.
    pub finished_rollups: Vec<u64>,
    /// The roll-up file's own open report (torn tail cut, set aside).
    pub hours: Option<super::OpenReport>,
    /// The newest segment's open report.
    pub newest: Option<super::OpenReport>,
}

/// The owning host's writer of its segment files (FORMAT.md §14.5): minute slices appended to
/// their hour's segment, roll-ups appended to the roll-up file.
#[derive(Debug)]
pub struct SegmentWriter {
    dir: HostDir,
    resolution: u64,
    /// The segment being appended to, and its hour.
    seg: Option<(u64, SliceWriter)>,
    /// The roll-up file's writer, opened when first needed.
    hours: Option<SliceWriter>,
    /// Hours with a roll-up record.
    rolled: BTreeSet<u64>,
    /// Hours with a segment file.
    segments: BTreeSet<u64>,
}

impl SegmentWriter {
    /// Open the writer of `dir`'s slices: segments whose hour was rolled up already are
    /// removed (finishing a roll-up a crash interrupted). The directory must exist.
    pub fn open(dir: &HostDir) -> Result<(Self, SegmentOpen)> {
        let files = dir.slice_files()?;
        let mut rep = SegmentOpen::default();
        let mut w = Self {
            dir: dir.clone(),
            resolution: 1,
            seg: None,
            hours: None,
            rolled: BTreeSet::new(),
            segments: files.segments,
        };
        if files.hours {
            let (h, r) = SliceWriter::open(&dir.slice_hours_path())?;
            w.rolled = h.ranges().iter().map(|r| hour_of(r.0)).collect();
            rep.hours = Some(r);
            w.hours = Some(h);
        }
        let done: Vec<u64> = w.segments.intersection(&w.rolled).copied().collect();
        for h in done {
            remove(&dir.slice_segment_path(h))?;
            w.segments.remove(&h);
            rep.finished_rollups.push(h);
        }
        // The newest segment is the one a crash can have torn (appends go to the newest hour):
        // opened now, so its torn tail is cut whether or not the next slice goes there.
        if let Some(&h) = w.segments.last() {
            let (s, r) = SliceWriter::open(&dir.slice_segment_path(h))?;
            rep.newest = Some(r);
            w.seg = Some((h, s));
        }
        Ok((w, rep))
    }

    /// Offset resolution of the minute slices appended ([`SliceWriter::set_resolution`]).
    pub fn set_resolution(&mut self, resolution: u64) {
        self.resolution = resolution;
        if let Some((_, s)) = &mut self.seg {
            s.set_resolution(resolution);
        }
    }

    /// The file the next append of a slice starting at `start` goes to.
    pub fn path_for(&self, start: u64) -> PathBuf {
        if self.rolled.contains(&hour_of(start)) {
            self.dir.slice_hours_path()
        } else {
            self.dir.slice_segment_path(start)
        }
    }

    /// Whether the files this writer appends to are still the ones at their paths (the
    /// directory removed by retention, a file set aside by hand): if not, it is opened again.
    pub fn is_current(&self) -> bool {
        self.seg.as_ref().is_none_or(|(_, s)| s.is_current())
            && self.hours.as_ref().is_none_or(SliceWriter::is_current)
            && self.dir.path.is_dir()
    }

    /// Hours that have a minute segment.
    pub fn segment_hours(&self) -> &BTreeSet<u64> {
        &self.segments
    }

    /// Append one slice to its hour's segment (or, if that hour was rolled up already, a
    /// clock set back, to the roll-up file), one `write` and `fdatasync` ([`SliceWriter::append`]).
    /// Returns the bytes appended, and what opening a segment found (a torn tail cut).
    pub fn append(&mut self, s: &Slice) -> Result<(u64, Option<super::OpenReport>)> {
        let h = hour_of(s.start);
        if self.rolled.contains(&h) {
            let res = self.resolution;
            let w = self.hours_writer()?;
            w.set_resolution(res);
            return Ok((w.append(s)?, None));
        }
        let mut report = None;
        if self.seg.as_ref().is_none_or(|(sh, w)| *sh != h || !w.is_current()) {
            self.seg = None;
            let (mut w, r) = SliceWriter::open(&self.dir.slice_segment_path(h))?;
            w.set_resolution(self.resolution);
            self.segments.insert(h);
            report = Some(r);
            self.seg = Some((h, w));
        }
        let Some((_, w)) = &mut self.seg else { unreachable!("opened above") };
        Ok((w.append(s)?, report))
    }

    fn hours_writer(&mut self) -> Result<&mut SliceWriter> {
        if self.hours.as_ref().is_none_or(|w| !w.is_current()) {
            let (w, _) = SliceWriter::open(&self.dir.slice_hours_path())?;
            self.rolled = w.ranges().iter().map(|r| hour_of(r.0)).collect();
            self.hours = Some(w);
        }
        match &mut self.hours {
            Some(w) => Ok(w),
            None => unreachable!("opened above"),
        }
    }

    /// Roll up the segment of `hour`: its slices merged into one hour slice at `resolution`
    /// bytes ([`SliceLog::rollup_at`]), appended to the roll-up file, and only then the
    /// segment removed (a crash in between leaves both; readers and the next
    /// [`SegmentWriter::open`] then take the roll-up). Returns the bytes appended.
    pub fn rollup(&mut self, hour: u64, resolution: u64) -> Result<u64> {
        let path = self.dir.slice_segment_path(hour);
        if self.seg.as_ref().is_some_and(|(h, _)| *h == hour) {
            self.seg = None;
        }
        let log = match SliceLog::read(&path) {
            Ok(l) => l.unwrap_or_default(),
            Err(e @ Error::Io { .. }) => return Err(e),
            // Unreadable (damaged by hand, a disk error): set aside (§1), so the next hours
            // go on; its minutes stay out of the time axis, the epoch totals keep them.
            Err(e) => {
                safeio::set_aside(&path)?;
                self.segments.remove(&hour);
                return Err(e);
            }
        };
        let rolled = log.rollup_at(u64::MAX, SEGMENT_SECS, resolution);
        let mut n = 0;
        if !rolled.slices.is_empty() {
            let w = self.hours_writer()?;
            w.set_resolution(resolution);
            for s in &rolled.slices {
                n += w.append(s)?;
            }
            self.rolled.insert(hour);
        }
        remove(&path)?;
        self.segments.remove(&hour);
        Ok(n)
    }
}

fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(path, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::EpochId;
    use crate::ident::ImageId;
    use crate::slices::SliceKey;

    const H: u64 = 490_000 * 3600;

    fn dir() -> (tempfile::TempDir, HostDir) {
        let t = tempfile::tempdir().unwrap();
        let epoch = EpochId::from_time(std::time::UNIX_EPOCH + std::time::Duration::from_secs(H));
        let hd = HostDir { path: t.path().join("h1"), host: "h1".into(), epoch };
        std::fs::create_dir_all(&hd.path).unwrap();
        (t, hd)
    }

    fn minute(start: u64, off: u64, n: u64) -> Slice {
        let key =
            SliceKey { event: "cpu-clock".into(), image: Some(ImageId::BuildId(vec![7; 20])) };
        Slice { start, len: 60, seq: 0, counts: [(key, vec![(off, n)])].into_iter().collect() }
    }

    /// Three hours of minutes, 2 samples each, in their hours' segments.
    fn three_hours(hd: &HostDir) -> SegmentWriter {
        let (mut w, _) = SegmentWriter::open(hd).unwrap();
        w.set_resolution(16);
        for m in 0..180 {
            w.append(&minute(H + m * 60, 0x40 + m % 7 * 16, 2)).unwrap();
        }
        w
    }

    #[test]
    fn minutes_go_to_one_segment_per_hour_and_read_back_whole() {
        let (_t, hd) = dir();
        three_hours(&hd);
        let f = hd.slice_files().unwrap();
        assert_eq!(f.segments, [H, H + 3600, H + 7200].into_iter().collect());
        assert!(!f.legacy && !f.hours);
        let log = hd.read_slices().unwrap().unwrap();
        assert_eq!((log.slices.len(), log.samples()), (180, 360));
        // Sequences are unique across files and keep each slice's resolution.
        let seqs: BTreeSet<u64> = log.slices.iter().map(|s| s.seq).collect();
        assert_eq!(seqs.len(), 180);
        assert!(log.slices.iter().all(|s| log.resolution_of(s) == 16));
        let tot = hd.read_slice_totals_in(None, None).unwrap().unwrap();
        assert_eq!(tot.slices.iter().flat_map(|s| &s.totals).map(|t| t.1).sum::<u64>(), 360);
        assert_eq!(tot.keys.len(), 1, "one key table across the files");
    }

    /// A roll-up appends to the roll-up file (never rewriting it) and removes the segment; a
    /// range reads only the files it needs: a damaged segment outside it is not opened.
    #[test]
    fn a_rollup_appends_and_a_range_opens_only_its_files() {
        use std::os::unix::fs::MetadataExt;
        let (_t, hd) = dir();
        let mut w = three_hours(&hd);
        let n0 = w.rollup(H, 256).unwrap();
        let ino = std::fs::metadata(hd.slice_hours_path()).unwrap().ino();
        let len0 = std::fs::metadata(hd.slice_hours_path()).unwrap().len();
        let n1 = w.rollup(H + 3600, 256).unwrap();
        let m = std::fs::metadata(hd.slice_hours_path()).unwrap();
        assert_eq!((m.ino(), m.len()), (ino, len0 + n1), "appended, not rewritten");
        assert!(n0 > 0 && n1 > 0);
        assert_eq!(hd.slice_files().unwrap().segments, [H + 7200].into_iter().collect());
        let log = hd.read_slices().unwrap().unwrap();
        assert_eq!((log.slices.len(), log.samples()), (2 + 60, 360), "every sample kept");
        // A damaged segment of another hour.
        std::fs::write(hd.slice_segment_path(H - 3600), b"garbage").unwrap();
        assert!(hd.read_slices().is_err(), "a full read opens it");
        let last = hd.read_slices_in(Some(H + 7200), Some(H + 7260)).unwrap().unwrap();
        assert_eq!(last.range(Some(H + 7200), Some(H + 7260)).samples(), 2);
        assert!(last.slices.iter().all(|s| s.start >= H + 7200), "the hours were not read");
        let old = hd.read_slice_totals_in(Some(H), Some(H + 60)).unwrap().unwrap();
        assert_eq!(old.range(Some(H), Some(H + 60)).len(), 1);
    }

    /// kill -9 between a roll-up's append and its unlink: the hour is counted once by
    /// readers, and the next writer removes the segment.
    #[test]
    fn a_rollup_cut_before_its_unlink_counts_the_hour_once() {
        let (_t, hd) = dir();
        three_hours(&hd);
        let seg = std::fs::read(hd.slice_segment_path(H)).unwrap();
        let (mut w, _) = SegmentWriter::open(&hd).unwrap();
        w.rollup(H, 256).unwrap();
        drop(w);
        // The segment as it was before the unlink.
        std::fs::write(hd.slice_segment_path(H), &seg).unwrap();
        for (since, until) in
            [(None, None), (Some(H), Some(H + 3600)), (Some(H + 60), Some(H + 120))]
        {
            let log = hd.read_slices_in(since, until).unwrap().unwrap();
            let want = if since.is_none() { 360 } else { 120 };
            assert_eq!(log.range(since, until).samples(), want, "{since:?}..{until:?}");
        }
        let (_, rep) = SegmentWriter::open(&hd).unwrap();
        assert_eq!(rep.finished_rollups, vec![H]);
        assert!(!hd.slice_segment_path(H).exists());
        assert_eq!(hd.read_slices().unwrap().unwrap().samples(), 360);
    }

    /// A slice of an hour already rolled up (the clock set back) goes to the roll-up file, so
    /// that it is not hidden behind the roll-up record; an older single-file log is read too.
    #[test]
    fn late_slices_and_an_older_single_file_are_counted() {
        let (_t, hd) = dir();
        let (mut legacy, _) = SliceWriter::open(&hd.slices_path()).unwrap();
        legacy.append(&minute(H - 600, 0x10, 5)).unwrap();
        let mut w = three_hours(&hd);
        w.rollup(H, 256).unwrap();
        assert_eq!(w.path_for(H + 30), hd.slice_hours_path());
        w.append(&minute(H + 30, 0x10, 1)).unwrap();
        assert!(!hd.slice_segment_path(H).exists());
        let log = hd.read_slices().unwrap().unwrap();
        assert_eq!(log.samples(), 5 + 360 + 1);
        assert_eq!(log.range(Some(H), Some(H + 3600)).samples(), 121);
    }

    #[test]
    fn segment_names() {
        assert_eq!(segment_hour("slices.3600.log"), Some(3600));
        for bad in [
            "slices.log",
            "slices.hours.log",
            "slices.3601.log",
            "slices.03600.log",
            "slices.3600.log.corrupt",
            "slices..log",
            "slices.-3600.log",
        ] {
            assert_eq!(segment_hour(bad), None, "{bad}");
        }
        assert_eq!(segment_hour("slices.0.log"), Some(0));
    }
}
