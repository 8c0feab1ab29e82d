//! The host-local spool: a SQLite database holding every increment that has not yet been
//! published to the shared profile database.
//!
//! Durability: WAL mode with `synchronous=FULL`. In WAL mode NORMAL already survives a kill -9
//! (a committed transaction is in the WAL file, which the OS keeps), but on a power failure it
//! may roll back the last commits, and with them the AUTOINCREMENT counter: a sequence number
//! already written into a published profile could then be issued again and the new increment
//! would be skipped as "already published". FULL costs one fsync per flush interval (every 2 s
//! by default), which is negligible.
//!
//! Sequence numbers: `increments.seq` is AUTOINCREMENT (never reused while the file lives) and a
//! new spool starts it at the current time in microseconds, so a spool that was deleted and
//! recreated still issues numbers above everything an older spool published.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use profile_format::{EventDesc, HostSummary, ImageKind, JitSymbol};
use rusqlite::{params, Connection, OptionalExtension};

/// Errors of the spool; they name the spool file.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool {path}: {source}")]
    Sql {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error("spool {path}: {detail}")]
    Io { path: PathBuf, detail: String },
    #[error("spool {path}: corrupt row {seq}: {detail}")]
    BadRow { path: PathBuf, seq: i64, detail: String },
}

/// One profile's key in the spool: image id text (`None` = the event's unknown profile) and
/// event name.
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
}

/// One increment of one profile.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct SpoolRow {
    pub seq: u64,
    pub desc: EventDesc,
    /// Encoded counts, decoded by [`Spool::counts`] one row at a time: a publish of a busy
    /// profile (the kernel's, under exec churn) reads a publish interval's worth of rows, and
    /// decoding them all up front made each publish a multi-MB memory peak.
    data: Vec<u8>,
}

/// One profile's increment, to append.
#[derive(Clone, Debug)]
pub struct Increment<'a> {
    pub image: Option<(String, &'a SpoolImage)>,
    pub desc: &'a EventDesc,
    pub counts: &'a [(u64, u64, u64)],
}

#[derive(Debug)]
pub struct Spool {
    conn: Connection,
    path: PathBuf,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS images(
    image TEXT PRIMARY KEY,
    kind INTEGER NOT NULL,
    path BLOB NOT NULL,
    jit BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS events(
    id INTEGER PRIMARY KEY,
    desc TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS increments(
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    epoch TEXT NOT NULL,
    image TEXT NOT NULL,
    event TEXT NOT NULL,
    desc INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS increments_key ON increments(epoch, image, event, seq);
CREATE TABLE IF NOT EXISTS summaries(
    epoch TEXT PRIMARY KEY,
    json TEXT NOT NULL
);
";

impl Spool {
    /// Open or create the spool (and its parent directory).
    pub fn open(path: &Path) -> Result<Spool, SpoolError> {
        let sql = |source| SpoolError::Sql { path: path.to_path_buf(), source };
        if let Some(parent) = path.parent() {
            if !parent.as_os_str().is_empty() {
                std::fs::create_dir_all(parent).map_err(|e| SpoolError::Io {
                    path: path.to_path_buf(),
                    detail: format!("cannot create {}: {e}", parent.display()),
                })?;
            }
        }
        let conn = Connection::open(path).map_err(sql)?;
        conn.busy_timeout(std::time::Duration::from_secs(2)).map_err(sql)?;
        let mode: String =
            conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0)).map_err(sql)?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(spool = %path.display(), mode, "spool: WAL mode unavailable");
        }
        conn.pragma_update(None, "synchronous", "FULL").map_err(sql)?;
        // Rows live about one publish interval and are then deleted, so the spool's size is a
        // plateau. Without these the WAL alone grew to ~4 MB (1000 pages before the default
        // checkpoint, never truncated after it): checkpoint every 64 pages and cut the WAL
        // back after each checkpoint. The spool's statements touch few pages: a small page
        // cache is enough and keeps the daemon's memory down.
        conn.pragma_update(None, "wal_autocheckpoint", 64).map_err(sql)?;
        conn.query_row("PRAGMA journal_size_limit=262144", [], |_| Ok(())).map_err(sql)?;
        conn.pragma_update(None, "cache_size", -256).map_err(sql)?;
        conn.execute_batch(SCHEMA).map_err(sql)?;
        let seeded: Option<i64> = conn
            .query_row("SELECT seq FROM sqlite_sequence WHERE name='increments'", [], |r| r.get(0))
            .optional()
            .map_err(sql)?;
        if seeded.is_none() {
            let base =
                SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros()).unwrap_or(0);
            let base = i64::try_from(base).unwrap_or(i64::MAX / 2);
            conn.execute("INSERT INTO sqlite_sequence(name, seq) VALUES('increments', ?1)", [base])
                .map_err(sql)?;
        }
        Ok(Spool { conn, path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn sql(&self) -> impl Fn(rusqlite::Error) -> SpoolError + '_ {
        |source| SpoolError::Sql { path: self.path.clone(), source }
    }

    /// Append one flush's increments and the epoch's cumulative summary in one transaction.
    /// Returns the sequence numbers given to the rows.
    pub fn append(
        &mut self,
        epoch: &str,
        increments: &[Increment<'_>],
        summary: &HostSummary,
    ) -> Result<Vec<u64>, SpoolError> {
        let path = self.path.clone();
        let sql = |source| SpoolError::Sql { path: path.clone(), source };
        let tx = self.conn.transaction().map_err(sql)?;
        let mut seqs = Vec::with_capacity(increments.len());
        {
            let mut ins_img = tx
                .prepare_cached(
                    "INSERT INTO images(image, kind, path, jit) VALUES(?1, ?2, ?3, ?4)
                     ON CONFLICT(image) DO UPDATE SET kind=excluded.kind, path=excluded.path,
                     jit=CASE WHEN length(excluded.jit) > 0 THEN excluded.jit ELSE jit END",
                )
                .map_err(sql)?;
            let mut ins_desc =
                tx.prepare_cached("INSERT OR IGNORE INTO events(desc) VALUES(?1)").map_err(sql)?;
            let mut get_desc =
                tx.prepare_cached("SELECT id FROM events WHERE desc=?1").map_err(sql)?;
            let mut ins = tx
                .prepare_cached(
                    "INSERT INTO increments(epoch, image, event, desc, data) VALUES(?1,?2,?3,?4,?5)",
                )
                .map_err(sql)?;
            let mut desc_ids: BTreeMap<String, i64> = BTreeMap::new();
            for inc in increments {
                let image_text = match &inc.image {
                    Some((id, img)) => {
                        ins_img
                            .execute(params![id, img.kind as u8, img.path, encode_jit(&img.jit)])
                            .map_err(sql)?;
                        id.clone()
                    }
                    None => String::new(),
                };
                let desc_json = serde_json::to_string(inc.desc).map_err(|e| SpoolError::Io {
                    path: path.clone(),
                    detail: format!("cannot encode event: {e}"),
                })?;
                let desc_id = match desc_ids.get(&desc_json) {
                    Some(id) => *id,
                    None => {
                        ins_desc.execute([&desc_json]).map_err(sql)?;
                        let id: i64 =
                            get_desc.query_row([&desc_json], |r| r.get(0)).map_err(sql)?;
                        desc_ids.insert(desc_json, id);
                        id
                    }
                };
                ins.execute(params![
                    epoch,
                    image_text,
                    inc.desc.name,
                    desc_id,
                    encode_counts(inc.counts)
                ])
                .map_err(sql)?;
                seqs.push(tx.last_insert_rowid() as u64);
            }
        }
        let json = serde_json::to_string(summary)
            .map_err(|e| SpoolError::Io { path: path.clone(), detail: format!("summary: {e}") })?;
        tx.execute(
            "INSERT INTO summaries(epoch, json) VALUES(?1, ?2)
             ON CONFLICT(epoch) DO UPDATE SET json=excluded.json",
            params![epoch, json],
        )
        .map_err(sql)?;
        tx.commit().map_err(sql)?;
        Ok(seqs)
    }

    /// Every profile with rows, with its lowest sequence number.
    pub fn dirty_keys(&self) -> Result<Vec<(SpoolKey, u64)>, SpoolError> {
        let mut st = self
            .conn
            .prepare(
                "SELECT epoch, image, event, MIN(seq) FROM increments GROUP BY epoch, image, event",
            )
            .map_err(self.sql())?;
        let rows = st
            .query_map([], |r| {
                let image: String = r.get(1)?;
                Ok((
                    SpoolKey {
                        epoch: r.get(0)?,
                        image: if image.is_empty() { None } else { Some(image) },
                        event: r.get(2)?,
                    },
                    r.get::<_, i64>(3)? as u64,
                ))
            })
            .map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }

    /// The rows of one profile, in sequence order.
    pub fn rows(&self, key: &SpoolKey) -> Result<Vec<SpoolRow>, SpoolError> {
        let mut st = self
            .conn
            .prepare_cached(
                "SELECT i.seq, e.desc, i.data FROM increments i JOIN events e ON e.id = i.desc
                 WHERE i.epoch=?1 AND i.image=?2 AND i.event=?3 ORDER BY i.seq",
            )
            .map_err(self.sql())?;
        let image = key.image.clone().unwrap_or_default();
        let raw = st
            .query_map(params![key.epoch, image, key.event], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, Vec<u8>>(2)?))
            })
            .map_err(self.sql())?
            .collect::<Result<Vec<_>, _>>()
            .map_err(self.sql())?;
        let mut out = Vec::with_capacity(raw.len());
        for (seq, desc, data) in raw {
            let bad = |detail: String| SpoolError::BadRow { path: self.path.clone(), seq, detail };
            let desc: EventDesc =
                serde_json::from_str(&desc).map_err(|e| bad(format!("event: {e}")))?;
            out.push(SpoolRow { seq: seq as u64, desc, data });
        }
        Ok(out)
    }

    /// A row's (offset, count, period sum), offsets ascending.
    pub fn counts(&self, row: &SpoolRow) -> Result<Vec<(u64, u64, u64)>, SpoolError> {
        decode_counts(&row.data).ok_or_else(|| SpoolError::BadRow {
            path: self.path.clone(),
            seq: row.seq as i64,
            detail: "count data".into(),
        })
    }

    pub fn image(&self, image: &str) -> Result<Option<SpoolImage>, SpoolError> {
        let row: Option<(u8, Vec<u8>, Vec<u8>)> = self
            .conn
            .query_row("SELECT kind, path, jit FROM images WHERE image=?1", [image], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .optional()
            .map_err(self.sql())?;
        Ok(row.map(|(kind, path, jit)| SpoolImage {
            kind: kind_from_u8(kind),
            path,
            jit: decode_jit(&jit).unwrap_or_default(),
        }))
    }

    /// Delete one profile's rows up to `seq` (they are published).
    pub fn delete_upto(&mut self, key: &SpoolKey, seq: u64) -> Result<(), SpoolError> {
        let image = key.image.clone().unwrap_or_default();
        self.conn
            .execute(
                "DELETE FROM increments WHERE epoch=?1 AND image=?2 AND event=?3 AND seq<=?4",
                params![key.epoch, image, key.event, seq as i64],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    /// Forget an epoch entirely (retention removed it).
    pub fn delete_epoch(&mut self, epoch: &str) -> Result<(), SpoolError> {
        self.conn.execute("DELETE FROM increments WHERE epoch=?1", [epoch]).map_err(self.sql())?;
        self.conn.execute("DELETE FROM summaries WHERE epoch=?1", [epoch]).map_err(self.sql())?;
        Ok(())
    }

    /// Drop summaries of epochs other than `keep` that have no rows left.
    pub fn prune_summaries(&mut self, keep: &str) -> Result<(), SpoolError> {
        self.conn
            .execute(
                "DELETE FROM summaries WHERE epoch<>?1 AND epoch NOT IN (SELECT DISTINCT epoch FROM increments)",
                [keep],
            )
            .map_err(self.sql())?;
        self.conn
            .execute(
                "DELETE FROM images WHERE image NOT IN (SELECT DISTINCT image FROM increments)",
                [],
            )
            .map_err(self.sql())?;
        Ok(())
    }

    pub fn summary(&self, epoch: &str) -> Result<Option<HostSummary>, SpoolError> {
        let json: Option<String> = self
            .conn
            .query_row("SELECT json FROM summaries WHERE epoch=?1", [epoch], |r| r.get(0))
            .optional()
            .map_err(self.sql())?;
        match json {
            None => Ok(None),
            Some(j) => serde_json::from_str(&j).map(Some).map_err(|e| SpoolError::Io {
                path: self.path.clone(),
                detail: format!("summary of epoch {epoch}: {e}"),
            }),
        }
    }

    /// Epochs that have a summary (i.e. were written to) in the spool.
    pub fn summary_epochs(&self) -> Result<Vec<String>, SpoolError> {
        let mut st =
            self.conn.prepare("SELECT epoch FROM summaries ORDER BY epoch").map_err(self.sql())?;
        let rows = st.query_map([], |r| r.get(0)).map_err(self.sql())?;
        rows.collect::<Result<Vec<_>, _>>().map_err(self.sql())
    }

    /// (rows, bytes of count data) not yet published.
    pub fn backlog(&self) -> Result<(u64, u64), SpoolError> {
        self.conn
            .query_row("SELECT COUNT(*), COALESCE(SUM(length(data)), 0) FROM increments", [], |r| {
                Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
            })
            .map_err(self.sql())
    }
}

fn kind_from_u8(k: u8) -> ImageKind {
    match k {
        0 => ImageKind::Elf,
        1 => ImageKind::Kernel,
        2 => ImageKind::KernelModule,
        3 => ImageKind::Vdso,
        4 => ImageKind::Anon,
        _ => ImageKind::Unknown,
    }
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(data: &[u8], pos: &mut usize) -> Option<u64> {
    let mut v: u64 = 0;
    for shift in (0..64).step_by(7) {
        let b = *data.get(*pos)?;
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// (offset delta, count, period sum) varints; offsets ascending.
pub fn encode_counts(counts: &[(u64, u64, u64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(counts.len() * 6);
    let mut prev = 0u64;
    for &(off, c, p) in counts {
        put_varint(&mut out, off.wrapping_sub(prev));
        put_varint(&mut out, c);
        put_varint(&mut out, p);
        prev = off;
    }
    out
}

pub fn decode_counts(data: &[u8]) -> Option<Vec<(u64, u64, u64)>> {
    let mut pos = 0;
    let mut prev = 0u64;
    let mut out = Vec::new();
    while pos < data.len() {
        let off = prev.wrapping_add(get_varint(data, &mut pos)?);
        let c = get_varint(data, &mut pos)?;
        let p = get_varint(data, &mut pos)?;
        out.push((off, c, p));
        prev = off;
    }
    Some(out)
}

fn encode_jit(syms: &[JitSymbol]) -> Vec<u8> {
    let mut out = Vec::new();
    for s in syms {
        put_varint(&mut out, s.start);
        put_varint(&mut out, s.size);
        put_varint(&mut out, s.name.len() as u64);
        out.extend_from_slice(s.name.as_bytes());
    }
    out
}

fn decode_jit(data: &[u8]) -> Option<Vec<JitSymbol>> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < data.len() {
        let start = get_varint(data, &mut pos)?;
        let size = get_varint(data, &mut pos)?;
        let len = usize::try_from(get_varint(data, &mut pos)?).ok()?;
        let end = pos.checked_add(len)?;
        let name = String::from_utf8_lossy(data.get(pos..end)?).into_owned();
        pos = end;
        out.push(JitSymbol { start, size, name });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_roundtrip() {
        let c = vec![(0, 1, 100), (5, 2, 200), (u64::MAX, 3, u64::MAX)];
        assert_eq!(decode_counts(&encode_counts(&c)).unwrap(), c);
        assert!(decode_counts(&[0x80]).is_none());
        let j = vec![JitSymbol { start: 0x1000, size: 16, name: "f\nx".into() }];
        assert_eq!(decode_jit(&encode_jit(&j)).unwrap(), j);
        assert!(decode_jit(&[1, 1, 50]).is_none());
    }

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

    #[test]
    fn append_read_delete_and_seq_base() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/spool.sqlite");
        let mut s = Spool::open(&p).unwrap();
        let img = SpoolImage { kind: ImageKind::Elf, path: b"/bin/x".to_vec(), jit: vec![] };
        let d = desc();
        let counts = vec![(10, 2, 2000), (20, 1, 1000)];
        let inc = [
            Increment { image: Some(("b01".into(), &img)), desc: &d, counts: &counts },
            Increment { image: None, desc: &d, counts: &counts[..1] },
        ];
        let seqs = s.append("E1", &inc, &HostSummary::default()).unwrap();
        assert_eq!(seqs.len(), 2);
        assert!(seqs[0] > 1_000_000_000_000, "sequence starts at a time base: {}", seqs[0]);
        assert!(seqs[1] > seqs[0]);
        let keys = s.dirty_keys().unwrap();
        assert_eq!(keys.len(), 2);
        let k =
            SpoolKey { epoch: "E1".into(), image: Some("b01".into()), event: "cpu-clock".into() };
        let rows = s.rows(&k).unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(s.counts(&rows[0]).expect("decodes"), counts);
        assert_eq!(rows[0].desc, d);
        assert_eq!(s.image("b01").unwrap().unwrap(), img);
        assert_eq!(s.backlog().unwrap().0, 2);
        s.delete_upto(&k, seqs[0]).unwrap();
        assert_eq!(s.backlog().unwrap().0, 1);
        drop(s);
        let s = Spool::open(&p).unwrap();
        assert_eq!(s.dirty_keys().unwrap().len(), 1);
        assert!(s.summary("E1").unwrap().is_some());
    }
}
