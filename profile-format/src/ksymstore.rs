//! Kernel symbol snapshots stored once per database (FORMAT.md §8.1): content-addressed,
//! compressed files under `<db>/kallsyms/`, referenced from each host directory by a small
//! `kallsyms.ref`. Hosts running the same kernel (same build, same module set and bases) share
//! one file, and so do all epochs of one boot.

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::atomic::{write_atomic, TMP_PREFIX};
use crate::db::{Database, HostDir};
use crate::error::{Error, Result};
use crate::kallsyms::KallsymsSnapshot;

/// Directory of the shared snapshots, under the database root.
pub const KALLSYMS_DIR: &str = "kallsyms";
/// Name of the reference file in a host directory.
pub const KALLSYMS_REF: &str = "kallsyms.ref";
/// Version of the reference file written by this build.
pub const KALLSYMS_REF_VERSION: u32 = 1;
const REF_MAGIC: &str = "dcpi-kallsyms-ref";
const SUFFIX: &str = ".snap.z";
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

impl Database {
    /// Path of the shared snapshot with content id `id`.
    pub fn kallsyms_store_path(&self, id: &str) -> PathBuf {
        self.root().join(KALLSYMS_DIR).join(format!("{id}{SUFFIX}"))
    }

    /// Store a snapshot (its canonical file bytes) unless the database has it already.
    /// Returns its id and the bytes written (0 if it was there). Two hosts storing the same
    /// snapshot at once write identical files; the atomic rename makes either one win.
    pub fn put_kallsyms(&self, file_bytes: &[u8]) -> Result<(String, u64)> {
        let id = kallsyms_id(file_bytes);
        let path = self.kallsyms_store_path(&id);
        // Only a regular file counts as stored: anything else put there is replaced.
        if fs::symlink_metadata(&path).is_ok_and(|m| m.is_file() && m.len() > 0) {
            return Ok((id, 0));
        }
        let dir = self.root().join(KALLSYMS_DIR);
        fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
        z.write_all(file_bytes).map_err(|e| Error::io(&path, e))?;
        let packed = z.finish().map_err(|e| Error::io(&path, e))?;
        write_atomic(&path, &packed)?;
        Ok((id, packed.len() as u64))
    }

    /// Read and verify the shared snapshot `id`: decompressed, its content id must match its
    /// name, then it is decoded like a `kallsyms.snap`.
    pub fn read_kallsyms(&self, id: &str) -> Result<KallsymsSnapshot> {
        let path = self.kallsyms_store_path(id);
        let packed = crate::safeio::read_small(&path, MAX_SNAPSHOT)?;
        let mut bytes = Vec::new();
        flate2::read::ZlibDecoder::new(&packed[..])
            .take(MAX_SNAPSHOT + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| corrupt(&path, "compressed data", e.to_string()))?;
        if bytes.len() as u64 > MAX_SNAPSHOT {
            return Err(corrupt(&path, "compressed data", "decompresses to more than 256 MiB"));
        }
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
            let Some(id) = name.strip_suffix(SUFFIX).filter(|id| valid_id(id)) else { continue };
            let old = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age >= min_age);
            if old {
                candidates.push(id.to_owned());
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
        for id in candidates.into_iter().filter(|id| !referenced.contains(id)) {
            let p = self.kallsyms_store_path(&id);
            match fs::remove_file(&p) {
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
        let text = match crate::safeio::read_small_string(&path, crate::safeio::MAX_SMALL_FILE) {
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
    /// `kallsyms.snap` of older databases. A directory with neither is an `Io` NotFound error
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
}
