//! Symbol cache: per build-id symbol tables, and the DWARF answers (innermost frame per
//! address) that `--lines`/`--inlines` needed, in a `SQLite` file (default
//! `$XDG_CACHE_HOME/dcpi/symbols.sqlite`, else `~/.cache/dcpi/symbols.sqlite`).
//!
//! A second report on a large binary then neither reads the binary nor parses its DWARF: the
//! binary is only checked for its build-id (a few pages read), the table comes from the cache,
//! and DWARF is loaded only if an address was never asked before.
//!
//! * Only images with a GNU build-id are cached: a fallback identity (path, size, mtime, inode)
//!   is not a content hash. The key is the build-id plus the separate debug file used (path,
//!   size, mtime), so installing debug info later gives a new entry instead of a stale one.
//! * Concurrent `dcpiprof` runs: WAL mode, a busy timeout, `INSERT OR IGNORE`.
//! * The cache is an accelerator, never a source of failure: a corrupt file is deleted and
//!   rebuilt (with a warning); any other error disables the cache for this run (one warning).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use super::stats;
use super::symbolize::{Frame, SymbolTable};

/// Bump when the stored encoding changes: older files are rebuilt.
// 2: frames hold the function's raw (mangled) name; symbol names that are not UTF-8 are kept
// (escaped) instead of dropped.
const SCHEMA_VERSION: i64 = 3;

/// Default location, from the environment (`None` when neither variable is set).
pub fn default_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("dcpi").join("symbols.sqlite"))
}

/// What a cached symbol table depends on besides the binary (named by its build-id).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheKey {
    pub build_id: Vec<u8>,
    /// Separate debug file used: path, size, mtime (ns); `None` when there was none.
    pub debug: Option<(PathBuf, u64, i64)>,
}

/// An open cache. Every method degrades to "not cached" on error.
#[derive(Debug)]
pub struct SymbolCache {
    conn: Option<Connection>,
    path: PathBuf,
}

fn open_conn(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(Duration::from_secs(10))?;
    // journal_mode answers with a row; query it rather than execute.
    let _unused: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
    conn.execute_batch(
        "PRAGMA synchronous=NORMAL;
         PRAGMA foreign_keys=ON;
         CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value INTEGER NOT NULL);
         CREATE TABLE IF NOT EXISTS images(
             id INTEGER PRIMARY KEY,
             build_id BLOB NOT NULL,
             debug_path BLOB NOT NULL,
             debug_size INTEGER NOT NULL,
             debug_mtime_ns INTEGER NOT NULL,
             symtab BLOB NOT NULL,
             UNIQUE(build_id, debug_path, debug_size, debug_mtime_ns));
         CREATE TABLE IF NOT EXISTS frames(
             image INTEGER NOT NULL REFERENCES images(id) ON DELETE CASCADE,
             vaddr INTEGER NOT NULL,
             found INTEGER NOT NULL,
             function TEXT, file TEXT, line INTEGER,
             PRIMARY KEY(image, vaddr)) WITHOUT ROWID;",
    )?;
    let v: Option<i64> =
        conn.query_row("SELECT value FROM meta WHERE key='schema'", [], |r| r.get(0)).optional()?;
    match v {
        Some(SCHEMA_VERSION) => {}
        Some(_) => {
            // Another version's encoding: start over (it is only a cache).
            // (Recording this version, not a fixed one, so that the next open keeps the cache.)
            conn.execute_batch(&format!(
                "BEGIN IMMEDIATE; DELETE FROM frames; DELETE FROM images;
                 INSERT OR REPLACE INTO meta VALUES('schema', {SCHEMA_VERSION}); COMMIT;"
            ))?;
        }
        None => {
            conn.execute("INSERT OR IGNORE INTO meta VALUES('schema', ?1)", [SCHEMA_VERSION])?;
        }
    }
    // No integrity scan here (it reads the whole file): a file that is not SQLite already
    // failed above, and a damaged page fails its query, which drops the cache (see `fail`).
    Ok(conn)
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// `open_conn`, retried while another process holds the file. `SQLite` reports `SQLITE_BUSY`
/// without calling the busy handler in some of what `open_conn` does on a fresh file (the
/// switch to WAL, and lock upgrades it refuses to wait for to avoid deadlock), so several
/// `dcpiprof` runs started together would otherwise lose the cache for the run.
fn open_conn_retrying(path: &Path) -> rusqlite::Result<Connection> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut pause = Duration::from_millis(2);
    loop {
        match open_conn(path) {
            Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                // Jitter so that the contenders do not retry in lock step.
                let nanos = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.subsec_nanos());
                std::thread::sleep(pause + Duration::from_nanos(u64::from(nanos) % 5_000_000));
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            r => return r,
        }
    }
}

fn is_corruption(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
    )
}

fn remove_db_files(path: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        drop(std::fs::remove_file(PathBuf::from(p)));
    }
}

impl SymbolCache {
    /// Open (creating directories and the file); a corrupt file is replaced. Problems are
    /// reported through `warn` and give a disabled cache.
    pub fn open(path: &Path, warn: &mut dyn FnMut(String)) -> Self {
        let disabled = |e: String, warn: &mut dyn FnMut(String)| {
            warn(format!(
                "symbol cache {}: {e}; continuing without it (--no-symbol-cache to silence)",
                path.display()
            ));
            Self { conn: None, path: path.to_owned() }
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Err(e) = std::fs::create_dir_all(dir) {
                return disabled(format!("cannot create {}: {e}", dir.display()), warn);
            }
        }
        match open_conn_retrying(path) {
            Ok(c) => Self { conn: Some(c), path: path.to_owned() },
            Err(e) if is_corruption(&e) => {
                warn(format!("symbol cache {} is corrupt ({e}); rebuilding it", path.display()));
                remove_db_files(path);
                match open_conn_retrying(path) {
                    Ok(c) => Self { conn: Some(c), path: path.to_owned() },
                    Err(e) => disabled(e.to_string(), warn),
                }
            }
            Err(e) => disabled(e.to_string(), warn),
        }
    }

    /// A cache that stores nothing (`--no-symbol-cache`).
    pub fn disabled() -> Self {
        Self { conn: None, path: PathBuf::new() }
    }

    pub fn is_enabled(&self) -> bool {
        self.conn.is_some()
    }

    fn fail(&mut self, e: rusqlite::Error, warn: &mut dyn FnMut(String)) {
        warn(format!(
            "symbol cache {}: {e}; continuing without it{}",
            self.path.display(),
            if is_corruption(&e) { " (it will be rebuilt next time)" } else { "" }
        ));
        self.conn = None;
        if is_corruption(&e) {
            remove_db_files(&self.path);
        }
    }

    fn key_params(key: &CacheKey) -> (Vec<u8>, Vec<u8>, i64, i64) {
        use std::os::unix::ffi::OsStrExt;
        match &key.debug {
            Some((p, size, mtime)) => (
                key.build_id.clone(),
                p.as_os_str().as_bytes().to_vec(),
                (*size).cast_signed(),
                *mtime,
            ),
            None => (key.build_id.clone(), Vec::new(), -1, -1),
        }
    }

    /// The cached table and its entry id, if present and intact.
    pub fn get(
        &mut self,
        key: &CacheKey,
        warn: &mut dyn FnMut(String),
    ) -> Option<(i64, SymbolTable)> {
        let conn = self.conn.as_ref()?;
        let (b, d, s, m) = Self::key_params(key);
        let res = conn
            .query_row(
                "SELECT id, symtab FROM images WHERE build_id=?1 AND debug_path=?2
                 AND debug_size=?3 AND debug_mtime_ns=?4",
                params![b, d, s, m],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)),
            )
            .optional();
        match res {
            Ok(Some((id, blob))) => match SymbolTable::decode(&blob) {
                Some(t) => {
                    stats::count(&stats::CACHE_HITS);
                    Some((id, t))
                }
                None => {
                    // Damaged entry: drop it so it is rebuilt below.
                    drop(conn.execute("DELETE FROM images WHERE id=?1", [id]));
                    stats::count(&stats::CACHE_MISSES);
                    None
                }
            },
            Ok(None) => {
                stats::count(&stats::CACHE_MISSES);
                None
            }
            Err(e) => {
                self.fail(e, warn);
                None
            }
        }
    }

    /// Store a table; returns its entry id (also when another process stored it first).
    pub fn put(
        &mut self,
        key: &CacheKey,
        table: &SymbolTable,
        warn: &mut dyn FnMut(String),
    ) -> Option<i64> {
        let conn = self.conn.as_ref()?;
        let (b, d, s, m) = Self::key_params(key);
        let res = conn
            .execute(
                "INSERT OR IGNORE INTO images(build_id, debug_path, debug_size, debug_mtime_ns,
                 symtab) VALUES(?1, ?2, ?3, ?4, ?5)",
                params![b, d, s, m, table.encode()],
            )
            .and_then(|_| {
                conn.query_row(
                    "SELECT id FROM images WHERE build_id=?1 AND debug_path=?2
                     AND debug_size=?3 AND debug_mtime_ns=?4",
                    params![b, d, s, m],
                    |r| r.get::<_, i64>(0),
                )
            });
        match res {
            Ok(id) => Some(id),
            Err(e) => {
                self.fail(e, warn);
                None
            }
        }
    }

    /// Every frame cached for an entry (addresses are few: only those that had samples).
    pub fn frames(
        &mut self,
        entry: i64,
        warn: &mut dyn FnMut(String),
    ) -> HashMap<u64, Option<Frame>> {
        let Some(conn) = self.conn.as_ref() else { return HashMap::new() };
        let res = (|| {
            let mut st = conn
                .prepare("SELECT vaddr, found, function, file, line FROM frames WHERE image=?1")?;
            let rows = st.query_map([entry], |r| {
                let vaddr = r.get::<_, i64>(0)? as u64;
                let found: bool = r.get(1)?;
                let f = found.then(|| -> rusqlite::Result<Frame> {
                    Ok(Frame {
                        function: r.get(2)?,
                        file: r.get(3)?,
                        line: r.get::<_, Option<i64>>(4)?.and_then(|l| u32::try_from(l).ok()),
                    })
                });
                Ok((vaddr, f.transpose()?))
            })?;
            rows.collect::<rusqlite::Result<HashMap<_, _>>>()
        })();
        match res {
            Ok(m) => m,
            Err(e) => {
                self.fail(e, warn);
                HashMap::new()
            }
        }
    }

    /// Remember frames computed from DWARF.
    pub fn put_frames(
        &mut self,
        entry: i64,
        frames: &[(u64, Option<Frame>)],
        warn: &mut dyn FnMut(String),
    ) {
        if frames.is_empty() {
            return;
        }
        let Some(conn) = self.conn.as_mut() else { return };
        let res = (|| {
            let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            {
                let mut st = tx.prepare(
                    "INSERT OR IGNORE INTO frames(image, vaddr, found, function, file, line)
                     VALUES(?1, ?2, ?3, ?4, ?5, ?6)",
                )?;
                for (vaddr, f) in frames {
                    let (func, file, line) = match f {
                        Some(f) => (f.function.as_deref(), f.file.as_deref(), f.line),
                        None => (None, None, None),
                    };
                    st.execute(params![
                        entry,
                        (*vaddr).cast_signed(),
                        f.is_some(),
                        func,
                        file,
                        line
                    ])?;
                }
            }
            tx.commit()
        })();
        if let Err(e) = res {
            self.fail(e, warn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_file_is_rebuilt_and_entries_round_trip() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub").join("symbols.sqlite");
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(&path, vec![0xabu8; 8192]).expect("write garbage");
        let mut warnings = Vec::new();
        let mut c = SymbolCache::open(&path, &mut |w| warnings.push(w));
        assert!(c.is_enabled(), "{warnings:?}");
        assert!(warnings.iter().any(|w| w.contains("corrupt")), "{warnings:?}");

        let key = CacheKey { build_id: vec![1, 2, 3], debug: None };
        let mut w = |m: String| panic!("unexpected warning {m}");
        assert!(c.get(&key, &mut w).is_none());
        let table = SymbolTable::default();
        let id = c.put(&key, &table, &mut w).expect("stored");
        assert_eq!(c.put(&key, &table, &mut w), Some(id), "second store finds the same entry");
        let f = Frame { function: Some("f".into()), file: Some("a.c".into()), line: Some(3) };
        c.put_frames(id, &[(u64::MAX, Some(f.clone())), (0x10, None)], &mut w);
        let got = c.frames(id, &mut w);
        assert_eq!(got.get(&u64::MAX), Some(&Some(f)));
        assert_eq!(got.get(&0x10), Some(&None));
        let other = CacheKey { build_id: vec![1, 2, 3], debug: Some(("/x".into(), 1, 2)) };
        assert!(c.get(&other, &mut w).is_none(), "debug file is part of the key");
        drop(c);
        let mut c = SymbolCache::open(&path, &mut w);
        assert_eq!(c.get(&key, &mut w), Some((id, table)));
    }
}
