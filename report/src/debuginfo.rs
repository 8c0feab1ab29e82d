//! Finding the exact binary a profile was taken from, and its separate debug information.
//!
//! A binary is identified by its GNU build-id; a rebuilt file at the same path has another id
//! and is never used. Search order for the binary:
//! 1. the path recorded in the profile, if the file there has the recorded build-id;
//! 2. each `--binary-path DIR` (regular files directly in DIR, matched by build-id);
//! 3. each build-id cache: `--cache-dir DIR`s, then `<db>/binaries`, laid out as
//!    `<xx>/<rest-of-hex>` (the daemon never copies binaries; users or CI fill the cache with
//!    `dcpiprof --cache-binary FILE`).
//!
//! With none of these, the report names the image from the function-symbol table dcpid stored
//! for its build-id (`<db>/binaries/<xx>/<rest>.sym`, [`SearchPaths::symbol_store`], FORMAT.md
//! §10; see `load_elf`), before falling back on `image+0xOFFSET`.
//!
//! Images without a build-id carry a fallback identity (hash of path, size, mtime, inode); the
//! file at the recorded path is used only if its current metadata hashes to the same identity.
//!
//! Separate debug files are found the way gdb does: `DIR/.build-id/xx/rest.debug` for each
//! `--debug-dir` then `/usr/lib/debug`; then `.gnu_debuglink` (CRC32 checked) in each
//! `--debug-dir`, beside the binary, in its `.debug/` subdirectory and under
//! `/usr/lib/debug/<binary dir>/`.
// Reads binaries and debug files (and /proc/self for the vDSO), never database files: the
// plain reads clippy.toml refuses elsewhere in this crate are what this module is for.
#![allow(clippy::disallowed_methods)]

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use profile_format::ImageId;

use super::symbolize::{elf_identity, elf_identity_from, ElfError, ElfIdentity};

/// Where the system keeps separate debug files.
pub const SYSTEM_DEBUG_DIR: &str = "/usr/lib/debug";

/// Files larger than this are not read when scanning `--binary-path` directories.
const MAX_SCAN_FILE: u64 = 4 << 30;

/// Search configuration.
#[derive(Clone, Debug, Default)]
pub struct SearchPaths {
    /// `--debug-dir`s, searched before the system directory.
    pub debug_dirs: Vec<PathBuf>,
    /// Usually [`SYSTEM_DEBUG_DIR`]; `None` to not look there.
    pub system_debug_dir: Option<PathBuf>,
    pub binary_paths: Vec<PathBuf>,
    /// Build-id caches (`<xx>/<rest>` layout), in search order.
    pub cache_dirs: Vec<PathBuf>,
    /// The database whose symbol store (`<db>/binaries/<xx>/<rest>.sym`, FORMAT.md §10)
    /// names an image's functions when no binary of its build is found.
    pub symbol_store: Option<PathBuf>,
}

/// Outcome of looking for the binary of an image.
#[derive(Debug)]
pub enum Located {
    /// The right binary, verified by its build-id (only its headers and notes were read).
    Found { path: PathBuf, identity: ElfIdentity },
    /// The file at the recorded path is another build; no verified copy was found elsewhere.
    Mismatch { path: PathBuf, expected: String, found: String },
    /// The file at the recorded path cannot be parsed as ELF (truncated, section headers
    /// out of bounds, not ELF at all), so which build it is is unknown; no verified copy was
    /// found elsewhere.
    Unparsable { path: PathBuf, detail: String },
    /// Nothing found (message says what was tried).
    NotFound { tried: String },
}

/// Looks binaries up; caches directory scans.
#[derive(Debug, Default)]
pub struct Locator {
    pub paths: SearchPaths,
    scanned: Option<HashMap<Vec<u8>, PathBuf>>,
}

fn hex_id(id: &[u8]) -> String {
    hex::encode(id)
}

fn read_build_id(path: &Path) -> Option<Option<Vec<u8>>> {
    Some(file_identity(path).ok()?.build_id)
}

/// Errors reading a file's ELF identity.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Elf(#[from] ElfError),
}

/// Build-id and debuglink of the ELF file at `path`, reading only the pages they are in (a
/// large binary is not read whole just to check which build it is).
pub fn file_identity(path: &Path) -> Result<ElfIdentity, IdentityError> {
    let f = std::fs::File::open(path)?;
    if !f.metadata()?.is_file() {
        return Err(
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file").into()
        );
    }
    let cache = object::ReadCache::new(f);
    Ok(elf_identity_from(&cache)?)
}

impl Locator {
    pub fn new(paths: SearchPaths) -> Self {
        Self { paths, scanned: None }
    }

    /// Find the binary for `id`, trying each recorded path of the image.
    pub fn locate(&mut self, id: &ImageId, recorded: &[Vec<u8>]) -> Located {
        match id {
            ImageId::BuildId(bid) => self.locate_build_id(bid, recorded),
            ImageId::Fallback(_) => locate_fallback(id, recorded),
        }
    }

    fn locate_build_id(&mut self, bid: &[u8], recorded: &[Vec<u8>]) -> Located {
        let mut mismatch = None;
        let mut unparsable = None;
        let mut unreadable: Vec<String> = Vec::new();
        for raw in recorded {
            let path = PathBuf::from(std::ffi::OsStr::from_bytes(raw));
            match file_identity(&path) {
                Ok(identity) if identity.build_id.as_deref() == Some(bid) => {
                    return Located::Found { path, identity };
                }
                Ok(ident) => {
                    let found = ident.build_id.map_or_else(|| "none".to_owned(), |b| hex_id(&b));
                    mismatch.get_or_insert((path, found));
                }
                Err(IdentityError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(IdentityError::Io(e)) => {
                    unreadable.push(format!("{}: {e}", path.display()));
                }
                Err(e) => {
                    unparsable.get_or_insert((path, e.to_string()));
                }
            }
        }
        if let Some(path) = self.scan_binary_paths().get(bid).cloned() {
            if let Ok(identity) = file_identity(&path) {
                return Located::Found { path, identity };
            }
        }
        let hex = hex_id(bid);
        if hex.len() > 2 {
            for dir in &self.paths.cache_dirs {
                let path = dir.join(&hex[..2]).join(&hex[2..]);
                // A cache entry is trusted only if its content agrees with its name.
                if let Ok(identity) = file_identity(&path) {
                    if identity.build_id.as_deref() == Some(bid) {
                        return Located::Found { path, identity };
                    }
                }
            }
        }
        match (mismatch, unparsable) {
            (Some((path, found)), _) => Located::Mismatch { path, expected: hex, found },
            (None, Some((path, detail))) => Located::Unparsable { path, detail },
            (None, None) => Located::NotFound {
                tried: format!(
                    "recorded path{}, {} --binary-path dir(s), {} cache dir(s)",
                    if unreadable.is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", unreadable.join("; "))
                    },
                    self.paths.binary_paths.len(),
                    self.paths.cache_dirs.len()
                ),
            },
        }
    }

    fn scan_binary_paths(&mut self) -> &HashMap<Vec<u8>, PathBuf> {
        let dirs = &self.paths.binary_paths;
        self.scanned.get_or_insert_with(|| {
            let mut map = HashMap::new();
            for dir in dirs {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    tracing::warn!("cannot read --binary-path {}", dir.display());
                    continue;
                };
                let mut files: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
                files.sort();
                for f in files {
                    let Ok(md) = std::fs::metadata(&f) else { continue };
                    if !md.is_file() || md.len() > MAX_SCAN_FILE || !has_elf_magic(&f) {
                        continue;
                    }
                    if let Some(Some(bid)) = read_build_id(&f) {
                        map.entry(bid).or_insert(f);
                    }
                }
            }
            map
        })
    }
}

fn has_elf_magic(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok()
        && &magic == b"\x7fELF"
}

fn locate_fallback(id: &ImageId, recorded: &[Vec<u8>]) -> Located {
    let mut last = None;
    for raw in recorded {
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(raw));
        let Ok(md) = std::fs::metadata(&path) else { continue };
        let mtime_ns = md.mtime().saturating_mul(1_000_000_000).saturating_add(md.mtime_nsec());
        let now = ImageId::fallback(raw, md.len(), mtime_ns, md.ino());
        if &now == id {
            if let Ok(identity) = file_identity(&path) {
                return Located::Found { path, identity };
            }
        }
        last = Some((path, now.to_text()));
    }
    match last {
        Some((path, found)) => Located::Mismatch {
            path,
            expected: format!("{id} (no build-id; identity from size, mtime and inode)"),
            found,
        },
        None => Located::NotFound { tried: "recorded path".into() },
    }
}

/// Find a separate debug file for a binary (given its identity). Returns its path.
/// Candidates with the wrong build-id or wrong debuglink CRC are skipped and reported through
/// `warn`.
pub fn find_debug_file(
    binary_path: &Path,
    ident: &ElfIdentity,
    paths: &SearchPaths,
    warn: &mut dyn FnMut(String),
) -> Option<PathBuf> {
    let roots: Vec<&Path> = paths
        .debug_dirs
        .iter()
        .map(PathBuf::as_path)
        .chain(paths.system_debug_dir.as_deref())
        .collect();
    if let Some(bid) = &ident.build_id {
        let hex = hex_id(bid);
        if hex.len() > 2 {
            for root in &roots {
                let cand =
                    root.join(".build-id").join(&hex[..2]).join(format!("{}.debug", &hex[2..]));
                match file_identity(&cand) {
                    Ok(d) if d.build_id.as_deref() == Some(bid.as_slice()) => return Some(cand),
                    Err(IdentityError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
                    _ => warn(format!(
                        "{}: ignored: not a debug file with build-id {hex}",
                        cand.display()
                    )),
                }
            }
        }
    }
    let (name, crc) = ident.debuglink.clone()?;
    let name = Path::new(std::ffi::OsStr::from_bytes(&name));
    // A debuglink is a bare file name; anything else could point outside the search dirs.
    if name.components().count() != 1 || name.file_name().is_none() {
        warn(format!("{}: ignored suspicious .gnu_debuglink {:?}", binary_path.display(), name));
        return None;
    }
    let bin_dir = binary_path.parent().unwrap_or(Path::new("/"));
    let mut cands: Vec<PathBuf> = paths.debug_dirs.iter().map(|d| d.join(name)).collect();
    cands.push(bin_dir.join(name));
    cands.push(bin_dir.join(".debug").join(name));
    if let Some(sys) = &paths.system_debug_dir {
        let rel = bin_dir.strip_prefix("/").unwrap_or(bin_dir);
        cands.push(sys.join(rel).join(name));
    }
    let self_canon = std::fs::canonicalize(binary_path).ok();
    for cand in cands {
        if self_canon.is_some() && std::fs::canonicalize(&cand).ok() == self_canon {
            continue;
        }
        let Some(got) = file_crc32(&cand) else { continue };
        if got != crc {
            warn(format!(
                "{}: ignored: CRC32 {got:#010x} does not match the .gnu_debuglink CRC {crc:#010x} of {}",
                cand.display(),
                binary_path.display()
            ));
            continue;
        }
        if let (Some(want), Ok(d)) = (&ident.build_id, file_identity(&cand)) {
            if d.build_id.as_ref().is_some_and(|b| b != want) {
                warn(format!(
                    "{}: ignored: build-id differs from {}",
                    cand.display(),
                    binary_path.display()
                ));
                continue;
            }
        }
        return Some(cand);
    }
    None
}

/// CRC32 of a whole file, streamed (debug files can be hundreds of MB).
fn file_crc32(path: &Path) -> Option<u32> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut h = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Some(h.finalize()),
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// Errors of `--cache-binary`.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not an ELF file: {detail}")]
    NotElf { path: PathBuf, detail: String },
    #[error("{path}: has no GNU build-id; only binaries with a build-id can be cached")]
    NoBuildId { path: PathBuf },
}

/// Copy `file` into the build-id cache `cache_root` (`<xx>/<rest>`); returns the destination.
pub fn cache_binary(file: &Path, cache_root: &Path) -> Result<PathBuf, CacheError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| CacheError::Io { path, source }
    };
    let data = std::fs::read(file).map_err(io(file))?;
    let ident = elf_identity(&data)
        .map_err(|e| CacheError::NotElf { path: file.to_owned(), detail: e.to_string() })?;
    let bid = ident.build_id.ok_or_else(|| CacheError::NoBuildId { path: file.to_owned() })?;
    let hex = hex_id(&bid);
    if hex.len() < 3 {
        return Err(CacheError::NoBuildId { path: file.to_owned() });
    }
    let dir = cache_root.join(&hex[..2]);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    let dest = dir.join(&hex[2..]);
    // A temporary file created O_EXCL under an unpredictable name, then renamed: a concurrent
    // reader never sees a partial binary, and a link planted in the shared database is never
    // written through.
    profile_format::write_atomic(&dest, &data).map_err(|e| match e {
        profile_format::Error::Io { path, source } => CacheError::Io { path, source },
        other => CacheError::Io {
            path: dest.clone(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidInput, other.to_string()),
        },
    })?;
    Ok(dest)
}

/// The vDSO image mapped into this process (read through `/proc/self/mem`), for symbolizing
/// vDSO samples when the profiled kernel's vDSO has the same build-id as ours.
pub fn live_vdso() -> Option<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.trim_end().ends_with("[vdso]"))?;
    let range = line.split_whitespace().next()?;
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    let len = usize::try_from(end.checked_sub(start)?).ok().filter(|&l| l > 0 && l <= 1 << 20)?;
    let mut mem = std::fs::File::open("/proc/self/mem").ok()?;
    mem.seek(SeekFrom::Start(start)).ok()?;
    let mut buf = vec![0u8; len];
    mem.read_exact(&mut buf).ok()?;
    Some(buf)
}
