//! Image identity of mapped files: GNU build-id, else a fallback digest of (path, size, mtime,
//! inode); cached per file version.
//!
//! The file is always reached through `/proc/PID/map_files/START-END`, never by the path the
//! kernel recorded: that path may since have been deleted, replaced by another binary, or turned
//! into a symlink by an untrusted process. `map_files` entries are kernel "magic links" that
//! open the very file object the mapping holds (no path lookup happens), so opening them must
//! follow the link (`O_NOFOLLOW` would fail with ELOOP); they are readable by root only.
//! The notes are read through the program headers (`PT_NOTE`), like the kernel's own build-id
//! parser, so stripped binaries work and big symbol tables are never read.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use object::elf::{FileHeader32, FileHeader64, PT_NOTE};
use object::read::elf::{FileHeader, ProgramHeader};
use object::read::ReadCache;
use object::Endianness;
use profile_format::ImageId;

use super::procfs::gnu_build_id;

/// What identifies one version of one file on this host.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(crate) struct FileKey {
    pub dev: u64,
    pub ino: u64,
    pub mtime_ns: i64,
    pub size: u64,
}

/// The two generations of [`IdentityCache`].
#[derive(Debug, Default)]
struct Generations {
    young: HashMap<FileKey, ImageId>,
    old: HashMap<FileKey, ImageId>,
}

/// Two-generation cache (an approximate LRU): lookups hit `young`, then `old` (and promote);
/// when `young` reaches the capacity, `old` is dropped and `young` becomes `old`.
///
/// Shared (`&self`, an `Arc` between the resolver and the aggregator's resolver thread): the
/// file is stat'ed, opened and read with no lock held, its mutex is only taken for the lookup
/// and the insertion, so an identity read on a slow file system never blocks another one, nor
/// whoever holds the resolver.
#[derive(Debug)]
pub(crate) struct IdentityCache {
    gens: Mutex<Generations>,
    cap: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    errors: AtomicU64,
}

impl IdentityCache {
    pub(crate) fn new(cap: usize) -> Self {
        Self {
            gens: Mutex::new(Generations::default()),
            cap: cap.max(1),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            errors: AtomicU64::new(0),
        }
    }

    fn gens(&self) -> std::sync::MutexGuard<'_, Generations> {
        // Every update is a whole map insertion: a panic elsewhere leaves it consistent.
        self.gens.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn len(&self) -> usize {
        let g = self.gens();
        g.young.len() + g.old.len()
    }

    /// (hits, misses, errors) since creation.
    pub(crate) fn counters(&self) -> (u64, u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
            self.errors.load(Ordering::Relaxed),
        )
    }

    fn get(&self, k: &FileKey) -> Option<ImageId> {
        let mut g = self.gens();
        if let Some(v) = g.young.get(k) {
            return Some(v.clone());
        }
        let v = g.old.remove(k)?;
        self.insert_locked(&mut g, *k, v.clone());
        Some(v)
    }

    fn insert_locked(&self, g: &mut Generations, k: FileKey, v: ImageId) {
        if g.young.len() >= self.cap {
            g.old = std::mem::take(&mut g.young);
        }
        g.young.insert(k, v);
    }

    /// Identity of the file behind a `map_files` entry. `path` is the path as recorded (only
    /// used for the fallback digest); `expect_ino`, when known from the MMAP2 record, guards
    /// against the address range having been re-mapped to another file since.
    pub(crate) fn identify(
        &self,
        map_file: &Path,
        path: &[u8],
        expect_ino: Option<u64>,
    ) -> io::Result<ImageId> {
        #[cfg(test)]
        io_probe::note(map_file);
        let r = self.identify_inner(map_file, path, expect_ino);
        if r.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn identify_inner(
        &self,
        map_file: &Path,
        path: &[u8],
        expect_ino: Option<u64>,
    ) -> io::Result<ImageId> {
        let md = std::fs::metadata(map_file)?;
        if let Some(ino) = expect_ino {
            if ino != 0 && ino != md.ino() {
                return Err(io::Error::other(format!(
                    "{}: inode {} is not the recorded inode {ino} (re-mapped)",
                    map_file.display(),
                    md.ino()
                )));
            }
        }
        self.identify_opened(&md, path, || File::open(map_file))
    }

    /// Identity of a mapped file whose process is already gone (its `map_files` entry with it),
    /// found again by the path the kernel recorded. Without this, a short-lived process's
    /// libraries got a degraded fallback id (no size, no mtime) that differs from the id the
    /// same file gets from a live process, and reports showed one library as two images.
    ///
    /// The path is only trusted for the file it names right now: it is opened without following
    /// a final symlink and without blocking, and must be a regular file with the inode the
    /// MMAP2 record (or maps line) gave; anything else is an error and the caller falls back.
    pub(crate) fn identify_by_path(&self, path: &[u8], expect_ino: u64) -> io::Result<ImageId> {
        let r = self.identify_by_path_inner(path, expect_ino);
        if r.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    fn identify_by_path_inner(&self, path: &[u8], expect_ino: u64) -> io::Result<ImageId> {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::OpenOptionsExt;
        if expect_ino == 0 {
            return Err(io::Error::other("no recorded inode to check the path against"));
        }
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open(Path::new(std::ffi::OsStr::from_bytes(path)))?;
        let md = file.metadata()?;
        if !md.is_file() || md.ino() != expect_ino {
            return Err(io::Error::other(format!(
                "{}: inode {} is not the recorded inode {expect_ino} (replaced)",
                String::from_utf8_lossy(path),
                md.ino()
            )));
        }
        self.identify_opened(&md, path, || Ok(file))
    }

    /// Cache lookup by file version, else the build-id (or fallback digest) of the file `open`
    /// gives (read with the cache unlocked: two threads missing on one file both read it).
    fn identify_opened(
        &self,
        md: &std::fs::Metadata,
        path: &[u8],
        open: impl FnOnce() -> io::Result<File>,
    ) -> io::Result<ImageId> {
        let key = FileKey {
            dev: md.dev(),
            ino: md.ino(),
            mtime_ns: md.mtime().saturating_mul(1_000_000_000).saturating_add(md.mtime_nsec()),
            size: md.size(),
        };
        if let Some(id) = self.get(&key) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(id);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let build_id = if md.is_file() { read_build_id(open()?) } else { None };
        let id = match build_id {
            Some(b) => ImageId::BuildId(b),
            None => ImageId::fallback(path, key.size, key.mtime_ns, key.ino),
        };
        self.insert_locked(&mut self.gens(), key, id.clone());
        Ok(id)
    }
}

/// Test-only record of which threads read identities (and did the resolver's other file
/// I/O for side-band records), by the `/proc` root they read under (tests run in parallel,
/// each with its own fake root).
#[cfg(test)]
pub(crate) mod io_probe {
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;

    static SEEN: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());

    pub(crate) fn note(path: &Path) {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        SEEN.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push((path.to_path_buf(), name));
    }

    /// Names of the threads that did I/O under `root`, in order.
    pub(crate) fn threads_under(root: &Path) -> Vec<String> {
        let seen = SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.iter().filter(|(p, _)| p.starts_with(root)).map(|(_, t)| t.clone()).collect()
    }
}

/// Upper bound on the bytes of notes read from one file.
const MAX_NOTE_BYTES: u64 = 1 << 20;

/// The GNU build-id of an ELF file, from its `PT_NOTE` segments. `None` for non-ELF files, files
/// without a build-id and malformed files.
pub fn read_build_id(file: File) -> Option<Vec<u8>> {
    let data = ReadCache::new(file);
    if let Ok(h) = FileHeader64::<Endianness>::parse(&data) {
        return build_id_from::<FileHeader64<Endianness>>(h, &data);
    }
    let h = FileHeader32::<Endianness>::parse(&data).ok()?;
    build_id_from::<FileHeader32<Endianness>>(h, &data)
}

fn build_id_from<H: FileHeader<Endian = Endianness>>(
    h: &H,
    data: &ReadCache<File>,
) -> Option<Vec<u8>> {
    let endian = h.endian().ok()?;
    let phdrs = h.program_headers(endian, data).ok()?;
    let mut budget = MAX_NOTE_BYTES;
    for ph in phdrs {
        if ph.p_type(endian) != PT_NOTE {
            continue;
        }
        let size: u64 = ph.p_filesz(endian).into();
        if size > budget {
            break;
        }
        budget -= size;
        let Ok(Some(notes)) = ph.notes(endian, data) else { continue };
        if let Some(id) = gnu_build_id(notes, endian) {
            return Some(id);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_is_bounded_and_hits_on_same_file_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        let c = IdentityCache::new(2);
        for i in 0..5 {
            let p = dir.path().join(format!("f{i}"));
            std::fs::write(&p, format!("not an elf {i}")).expect("write");
            let id = c.identify(&p, b"/x", None).expect("identify");
            assert!(matches!(id, ImageId::Fallback(_)));
            assert!(c.len() <= 4, "two generations of at most 2");
        }
        assert_eq!(c.counters(), (0, 5, 0));
        let p = dir.path().join("f4");
        let a = c.identify(&p, b"/x", None).expect("identify");
        assert_eq!(c.counters().0, 1);
        // Another version of the file (size and mtime change) is another identity.
        std::fs::write(&p, "a longer text, not an elf either").expect("write");
        let b = c.identify(&p, b"/x", None).expect("identify");
        assert_ne!(a, b);
        // A wrong expected inode (address re-mapped to another file) is refused.
        assert!(c.identify(&p, b"/x", Some(1)).is_err());
        assert_eq!(c.counters().2, 1);
    }

    #[test]
    fn a_file_found_again_by_path_has_the_identity_it_had_through_map_files() {
        use std::os::unix::ffi::OsStrExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("lib-without-build-id.so");
        std::fs::write(&p, "no ELF notes here").expect("write");
        let ino = std::fs::metadata(&p).expect("stat").ino();
        let path = p.as_os_str().as_bytes();
        // A live process: the id comes through its map_files entry (here: the file itself).
        let live = IdentityCache::new(8).identify(&p, path, Some(ino)).expect("identify");
        // The process exited before its mapping was resolved: same id, from a cold cache too.
        let c = IdentityCache::new(8);
        assert_eq!(c.identify_by_path(path, ino).expect("by path"), live);
        assert_ne!(live, ImageId::fallback(path, 0, 0, ino), "not the degraded id");
        // Replaced at the path (another inode), a symlink, or no inode to check: refused.
        assert!(c.identify_by_path(path, ino + 1).is_err());
        assert!(c.identify_by_path(path, 0).is_err());
        let link = dir.path().join("link.so");
        std::os::unix::fs::symlink(&p, &link).expect("symlink");
        assert!(c.identify_by_path(link.as_os_str().as_bytes(), ino).is_err());
        assert_eq!(c.counters().2, 3, "every refusal is counted");
    }

    #[test]
    fn build_id_of_real_elf() {
        let exe = std::env::current_exe().expect("exe");
        let data = std::fs::read(&exe).expect("read");
        let expected = {
            use object::Object;
            object::File::parse(&*data)
                .expect("parse")
                .build_id()
                .expect("notes")
                .map(<[u8]>::to_vec)
        };
        let got = read_build_id(File::open(&exe).expect("open"));
        assert_eq!(got, expected);
        let dir = tempfile::tempdir().expect("tempdir");
        let junk = dir.path().join("junk");
        let mut bytes = b"\x7fELF\x02\x01\x01".to_vec();
        bytes.resize(200, 0xff);
        std::fs::write(&junk, &bytes).expect("write");
        assert_eq!(read_build_id(File::open(&junk).expect("open")), None);
    }
}
