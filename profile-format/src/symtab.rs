//! The symbol store (FORMAT.md §10): one compact function-symbol table per ELF build-id, under
//! `<db>/binaries/<xx>/<rest>.sym`, so that reports can name the functions of an image whose
//! binary was rebuilt, upgraded or deleted since it was profiled. Written by dcpid the first
//! time it profiles an image; stored once per database (the build-id names the content, so a
//! fleet of hosts running the same binaries shares one file each); removed by retention once
//! no profile of any host and epoch names its build-id.

use std::collections::HashSet;
use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::atomic::{write_atomic, TMP_PREFIX};
use crate::codec::{self, put_bytes, Reader};
use crate::db::Database;
use crate::error::{Error, Result};
use crate::ident::{ImageId, MAX_BUILD_ID_LEN};
use crate::safeio;
use crate::varint;

/// Directory of the store under the database root (FORMAT.md §10).
pub const BINARIES_DIR: &str = "binaries";
/// Suffix of a symbol table file (`<rest>` of the build-id, then this).
pub const SYMTAB_SUFFIX: &str = ".sym";
/// Container magic of a symbol table file.
pub const SYMTAB_MAGIC: &[u8; 8] = b"DCPIBSYM";
/// Version written by this build (and the newest it reads).
pub const SYMTAB_VERSION: u16 = 1;
/// Most symbols a table may hold. The largest common binaries have a few hundred thousand
/// function symbols (libxul, chromium: ~300-600 k); a table claiming more is refused by the
/// writer and the reader, so that a hostile binary cannot make dcpid or a report hold more.
pub const MAX_SYMTAB_SYMBOLS: usize = 1 << 20;
/// Longest name kept, in bytes; longer ones (hostile, or extreme C++ templates) are cut at a
/// character boundary by the writer's caller and refused by the reader.
pub const MAX_SYMTAB_NAME: usize = 4096;
/// Most `PT_LOAD` segments a table may hold (real binaries have 2-6).
pub const MAX_SYMTAB_SEGMENTS: usize = 256;
/// Largest file a reader accepts, and largest a writer writes (compressed).
pub const MAX_SYMTAB_FILE: u64 = 64 << 20;

/// Where the symbols of a table came from: what a report can say about names it lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SymtabOrigin {
    /// The binary's own `.symtab` (not stripped): every function.
    Symtab = 0,
    /// Only the binary's `.dynsym` (stripped, no debug file installed): exported functions.
    Dynsym = 1,
    /// A separate debug file (`/usr/lib/debug/.build-id/…` or `.gnu_debuglink`).
    DebugFile = 2,
}

impl SymtabOrigin {
    fn from_code(c: u8) -> Option<Self> {
        match c {
            0 => Some(Self::Symtab),
            1 => Some(Self::Dynsym),
            2 => Some(Self::DebugFile),
            _ => None,
        }
    }

    /// Lowercase name for reports (`symtab`, `dynsym`, `debug-file`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Symtab => "symtab",
            Self::Dynsym => "dynsym",
            Self::DebugFile => "debug-file",
        }
    }
}

/// A `PT_LOAD` segment: file range and virtual address (maps stored file offsets to symbol
/// addresses).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SymtabSegment {
    pub offset: u64,
    pub filesz: u64,
    pub vaddr: u64,
}

/// A function symbol: start (virtual address), size (0: unknown) and raw (mangled) name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SymtabSymbol {
    pub start: u64,
    pub size: u64,
    pub name: String,
}

/// The one rule that turns a binary's symbols into a table a lookup can trust, used for live
/// binaries (the report's symbolizer) and stored tables (dcpid's symbol store) alike, so that
/// both name an offset the same way: sorted by address, one symbol per address, preferring a
/// sized one, then a name without a leading underscore (`malloc` over `__libc_malloc`), then
/// the shorter name, then the smaller. `key` gives a symbol's (start, size, name).
pub fn normalize_symbols<T>(syms: &mut Vec<T>, key: impl Fn(&T) -> (u64, u64, &str)) {
    // Lazily: addresses nearly always differ, and comparing names was most of the sort.
    syms.sort_by(|a, b| {
        let ((sa, za, na), (sb, zb, nb)) = (key(a), key(b));
        sa.cmp(&sb)
            .then_with(|| (zb > 0).cmp(&(za > 0)))
            .then_with(|| na.starts_with('_').cmp(&nb.starts_with('_')))
            .then_with(|| na.len().cmp(&nb.len()))
            .then_with(|| na.cmp(nb))
    });
    syms.dedup_by(|later, first| key(later).0 == key(first).0);
}

/// The stored symbol table of one build.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSymtab {
    pub build_id: Vec<u8>,
    pub origin: SymtabOrigin,
    pub segments: Vec<SymtabSegment>,
    /// Sorted by start (ties allowed); names at most [`MAX_SYMTAB_NAME`] bytes.
    pub symbols: Vec<SymtabSymbol>,
}

fn corrupt(path: &Path, field: &'static str, detail: impl Into<String>) -> Error {
    Error::Corrupt { path: path.into(), field, detail: detail.into() }
}

fn invalid(what: &'static str, value: impl Into<String>, detail: impl Into<String>) -> Error {
    Error::Invalid { what, value: value.into(), detail: detail.into() }
}

impl StoredSymtab {
    /// The file's bytes (FORMAT.md §10.1): a zlib container of the payload. Refuses a table
    /// that breaks a bound (`Invalid`) rather than writing one no reader accepts.
    pub fn encode(&self) -> Result<Vec<u8>> {
        if self.build_id.is_empty() || self.build_id.len() > MAX_BUILD_ID_LEN {
            return Err(invalid("symbol table", "build_id", "build-id of 1 to 64 bytes"));
        }
        if self.segments.len() > MAX_SYMTAB_SEGMENTS {
            return Err(invalid(
                "symbol table",
                "segments",
                format!("{} segments, at most {MAX_SYMTAB_SEGMENTS}", self.segments.len()),
            ));
        }
        if self.symbols.len() > MAX_SYMTAB_SYMBOLS {
            return Err(invalid(
                "symbol table",
                "symbols",
                format!("{} symbols, at most {MAX_SYMTAB_SYMBOLS}", self.symbols.len()),
            ));
        }
        let mut p = Vec::with_capacity(64 + self.symbols.len() * 16);
        put_bytes(&mut p, &self.build_id);
        p.push(self.origin as u8);
        varint::write_u64(&mut p, self.segments.len() as u64);
        for s in &self.segments {
            varint::write_u64(&mut p, s.offset);
            varint::write_u64(&mut p, s.filesz);
            varint::write_u64(&mut p, s.vaddr);
        }
        varint::write_u64(&mut p, self.symbols.len() as u64);
        let mut prev_start = 0u64;
        let mut prev_name: &[u8] = b"";
        for s in &self.symbols {
            let Some(delta) = s.start.checked_sub(prev_start) else {
                return Err(invalid("symbol table", s.name.clone(), "symbols not sorted by start"));
            };
            let name = s.name.as_bytes();
            if name.len() > MAX_SYMTAB_NAME {
                return Err(invalid(
                    "symbol table",
                    s.name.chars().take(64).collect::<String>(),
                    format!("name of {} bytes, at most {MAX_SYMTAB_NAME}", name.len()),
                ));
            }
            // The shared prefix ends at a character boundary, so that each suffix is UTF-8.
            let mut shared = name.iter().zip(prev_name).take_while(|(a, b)| a == b).count();
            while !s.name.is_char_boundary(shared) {
                shared -= 1;
            }
            varint::write_u64(&mut p, delta);
            varint::write_u64(&mut p, s.size);
            varint::write_u64(&mut p, shared as u64);
            put_bytes(&mut p, &name[shared..]);
            prev_start = s.start;
            prev_name = name;
        }
        let file = codec::finish_zlib(SYMTAB_MAGIC, SYMTAB_VERSION, &p);
        if file.len() as u64 > MAX_SYMTAB_FILE {
            return Err(invalid(
                "symbol table",
                hex::encode(&self.build_id),
                format!("{} bytes compressed, at most {MAX_SYMTAB_FILE}", file.len()),
            ));
        }
        Ok(file)
    }

    /// Decode a file's bytes (`path` names it in errors): container checks (§4), then every
    /// payload rule of FORMAT.md §10.1, each broken one a `Corrupt` error naming its field.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self> {
        let payload = codec::open_zlib(bytes, path, SYMTAB_MAGIC, "symbol table", SYMTAB_VERSION)?;
        let mut r = Reader::new(&payload, path);
        let build_id = r.bytes("build_id")?.to_vec();
        if build_id.is_empty() || build_id.len() > MAX_BUILD_ID_LEN {
            return Err(r.corrupt("build_id", format!("build-id of {} bytes", build_id.len())));
        }
        let code = r.u8("origin")?;
        let origin = SymtabOrigin::from_code(code)
            .ok_or_else(|| r.corrupt("origin", format!("unknown origin {code}")))?;
        let nseg = r.count("segments", 3)?;
        if nseg > MAX_SYMTAB_SEGMENTS {
            return Err(r.corrupt("segments", format!("{nseg} segments")));
        }
        let mut segments = Vec::with_capacity(nseg);
        for _ in 0..nseg {
            segments.push(SymtabSegment {
                offset: r.varint("segments.offset")?,
                filesz: r.varint("segments.filesz")?,
                vaddr: r.varint("segments.vaddr")?,
            });
        }
        let nsym = r.count("symbols", 4)?;
        if nsym > MAX_SYMTAB_SYMBOLS {
            return Err(
                r.corrupt("symbols", format!("{nsym} symbols, at most {MAX_SYMTAB_SYMBOLS}"))
            );
        }
        let mut symbols: Vec<SymtabSymbol> = Vec::with_capacity(nsym);
        let mut start = 0u64;
        let mut name = String::new();
        for _ in 0..nsym {
            let delta = r.varint("symbols.start")?;
            start = start
                .checked_add(delta)
                .ok_or_else(|| r.corrupt("symbols.start", "address beyond 2^64"))?;
            let size = r.varint("symbols.size")?;
            let shared = r.varint("symbols.shared")?;
            let suffix = r.bytes("symbols.name")?;
            let shared = usize::try_from(shared).unwrap_or(usize::MAX);
            if shared > name.len() || !name.is_char_boundary(shared) {
                return Err(r.corrupt(
                    "symbols.shared",
                    format!("{shared} shared bytes of a {}-byte previous name", name.len()),
                ));
            }
            if shared + suffix.len() > MAX_SYMTAB_NAME {
                return Err(r.corrupt(
                    "symbols.name",
                    format!("name of {} bytes, at most {MAX_SYMTAB_NAME}", shared + suffix.len()),
                ));
            }
            let suffix = std::str::from_utf8(suffix)
                .map_err(|e| r.corrupt("symbols.name", format!("not UTF-8: {e}")))?;
            name.truncate(shared);
            name.push_str(suffix);
            symbols.push(SymtabSymbol { start, size, name: name.clone() });
        }
        r.finish()?;
        Ok(Self { build_id, origin, segments, symbols })
    }
}

fn valid_hex_id(s: &str) -> bool {
    (2..=2 * MAX_BUILD_ID_LEN).contains(&s.len())
        && s.len().is_multiple_of(2)
        && s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

impl Database {
    /// Path of the symbol table of `build_id`: `<db>/binaries/<xx>/<rest>.sym`.
    pub fn symtab_path(&self, build_id: &[u8]) -> PathBuf {
        let hex = hex::encode(build_id);
        let (head, rest) = hex.split_at(2.min(hex.len()));
        self.root().join(BINARIES_DIR).join(head).join(format!("{rest}{SYMTAB_SUFFIX}"))
    }

    /// Whether the store holds a table for `build_id` (a regular, non-empty file; a `stat`).
    pub fn has_symtab(&self, build_id: &[u8]) -> bool {
        fs::symlink_metadata(self.symtab_path(build_id)).is_ok_and(|m| m.is_file() && m.len() > 0)
    }

    /// Store `table` unless the database has a table for its build-id already. Returns the
    /// bytes written (0 if it was there). Two hosts storing one build at once write equivalent
    /// files; the atomic rename makes either win.
    pub fn put_symtab(&self, table: &StoredSymtab) -> Result<u64> {
        if self.has_symtab(&table.build_id) {
            return Ok(0);
        }
        let path = self.symtab_path(&table.build_id);
        let bytes = table.encode()?;
        // Real directories, not links planted by another writer (FORMAT.md §6.1).
        safeio::ensure_dir(&self.root().join(BINARIES_DIR))?;
        if let Some(dir) = path.parent() {
            safeio::ensure_dir(dir)?;
        }
        write_atomic(&path, &bytes)?;
        Ok(bytes.len() as u64)
    }

    /// Read the stored table of `build_id` through the guarded reader (a FIFO, device, link or
    /// oversized file is refused), checked against its name. No table: an `Io` `NotFound`
    /// error naming the path.
    pub fn read_symtab(&self, build_id: &[u8]) -> Result<StoredSymtab> {
        let path = self.symtab_path(build_id);
        let bytes = safeio::read_small(&path, MAX_SYMTAB_FILE)?;
        let t = StoredSymtab::decode(&bytes, &path)?;
        if t.build_id != build_id {
            return Err(corrupt(
                &path,
                "build_id",
                format!("table of build-id {}, stored under another", hex::encode(&t.build_id)),
            ));
        }
        Ok(t)
    }

    /// Remove stored tables whose build-id no profile of any epoch and host names (profile
    /// file names carry the image id, FORMAT.md §3: a directory listing, no file is read) and
    /// whose file is older than `min_age` (a host stores a table shortly after its first
    /// samples, possibly before the profile that names it is published). If a host directory
    /// cannot be listed, nothing is removed that time. Returns the hex build-ids removed.
    pub fn gc_symtabs(&self, now: SystemTime, min_age: Duration) -> Result<Vec<String>> {
        let dir = self.root().join(BINARIES_DIR);
        // Never remove files through a link: they would be another directory's.
        if !safeio::check_dir(&dir)? {
            return Ok(Vec::new());
        }
        let mut candidates = Vec::new();
        for sub in read_dir_names(&dir)? {
            if sub.len() != 2 || !valid_hex_id(&sub) {
                continue;
            }
            let subdir = dir.join(&sub);
            if !safeio::check_dir(&subdir)? {
                continue;
            }
            let rd = match fs::read_dir(&subdir) {
                Ok(rd) => rd,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(Error::io(&subdir, e)),
            };
            for e in rd {
                let e = e.map_err(|e| Error::io(&subdir, e))?;
                let Ok(name) = e.file_name().into_string() else { continue };
                if name.starts_with(TMP_PREFIX) {
                    continue;
                }
                let Some(rest) = name.strip_suffix(SYMTAB_SUFFIX) else { continue };
                let hex = format!("{sub}{rest}");
                if !valid_hex_id(&hex) {
                    continue;
                }
                let old = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| now.duration_since(t).ok())
                    .is_some_and(|age| age >= min_age);
                if old {
                    candidates.push((hex, e.path()));
                }
            }
        }
        if candidates.is_empty() {
            return Ok(Vec::new());
        }
        let mut referenced: HashSet<String> = HashSet::new();
        for epoch in self.epochs()? {
            for host in self.hosts(&epoch)? {
                let hd = self.host_dir(&epoch, &host)?;
                let ids = hd
                    .profiles()?
                    .into_iter()
                    .filter_map(|p| p.image_id)
                    .chain(hd.who_profiles()?.into_iter().map(|p| p.image_id));
                for id in ids {
                    if let ImageId::BuildId(b) = id {
                        referenced.insert(hex::encode(b));
                    }
                }
            }
        }
        let mut removed = Vec::new();
        for (hex, p) in candidates.into_iter().filter(|(h, _)| !referenced.contains(h)) {
            match fs::remove_file(&p) {
                Ok(()) => removed.push(hex),
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(p, e)),
            }
        }
        Ok(removed)
    }
}

fn read_dir_names(dir: &Path) -> Result<Vec<String>> {
    match fs::read_dir(dir) {
        Ok(rd) => {
            let mut out = Vec::new();
            for e in rd {
                let e = e.map_err(|e| Error::io(dir, e))?;
                if let Ok(n) = e.file_name().into_string() {
                    out.push(n);
                }
            }
            Ok(out)
        }
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(Error::io(dir, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One symbol per address, by the rule both the live symbolizer and the store use.
    #[test]
    fn normalize_keeps_one_symbol_per_address_by_the_rule() {
        let sym = |start, size, name: &str| SymtabSymbol { start, size, name: name.into() };
        let mut v = vec![
            sym(0x30, 0, "zeta"),
            sym(0x10, 0, "unsized"),
            sym(0x10, 8, "__libc_malloc"),
            sym(0x10, 8, "malloc"),
            sym(0x20, 4, "longer"),
            sym(0x20, 4, "short"),
            sym(0x20, 4, "shore"),
        ];
        normalize_symbols(&mut v, |s| (s.start, s.size, s.name.as_str()));
        let got: Vec<(u64, &str)> = v.iter().map(|s| (s.start, s.name.as_str())).collect();
        assert_eq!(got, [(0x10, "malloc"), (0x20, "shore"), (0x30, "zeta")]);
    }

    fn table() -> StoredSymtab {
        StoredSymtab {
            build_id: vec![0xab, 0xcd, 0x01, 0x02],
            origin: SymtabOrigin::Symtab,
            segments: vec![
                SymtabSegment { offset: 0, filesz: 0x1000, vaddr: 0 },
                SymtabSegment { offset: 0x1000, filesz: 0x2345, vaddr: 0x401000 },
            ],
            symbols: vec![
                SymtabSymbol { start: 0x401000, size: 0x10, name: "_ZN3foo3barEv".into() },
                SymtabSymbol { start: 0x401010, size: 0x20, name: "_ZN3foo3bazEv".into() },
                SymtabSymbol { start: 0x401010, size: 0, name: "ünïcode→名前".into() },
                SymtabSymbol { start: 0x402000, size: u64::MAX, name: "ünïcodé".into() },
                SymtabSymbol { start: u64::MAX, size: 1, name: "top".into() },
            ],
        }
    }

    #[test]
    fn round_trip_keeps_every_field() {
        let t = table();
        let bytes = t.encode().expect("encode");
        assert_eq!(&bytes[..8], SYMTAB_MAGIC);
        let back = StoredSymtab::decode(&bytes, Path::new("t.sym")).expect("decode");
        assert_eq!(back, t);
        let empty = StoredSymtab { symbols: Vec::new(), segments: Vec::new(), ..t };
        let back = StoredSymtab::decode(&empty.encode().unwrap(), Path::new("e")).unwrap();
        assert_eq!(back, empty);
    }

    #[test]
    fn writer_refuses_what_a_reader_would_refuse() {
        let mut t = table();
        t.symbols.swap(0, 1);
        assert!(t.encode().unwrap_err().to_string().contains("not sorted"));
        let mut t = table();
        t.symbols[0].name = "x".repeat(MAX_SYMTAB_NAME + 1);
        assert!(t.encode().unwrap_err().to_string().contains("at most 4096"));
        let mut t = table();
        t.build_id.clear();
        assert!(t.encode().is_err());
        let mut t = table();
        t.segments =
            vec![SymtabSegment { offset: 0, filesz: 0, vaddr: 0 }; MAX_SYMTAB_SEGMENTS + 1];
        assert!(t.encode().is_err());
    }

    /// Every truncation and every single-byte change of a real file is an error (the
    /// container's CRC), never a panic or a wrong table.
    #[test]
    fn truncated_and_flipped_files_are_errors() {
        let bytes = table().encode().unwrap();
        for n in 0..bytes.len() {
            assert!(StoredSymtab::decode(&bytes[..n], Path::new("t")).is_err(), "cut at {n}");
        }
        for i in 0..bytes.len() {
            for x in [0x01u8, 0x80, 0xff] {
                let mut b = bytes.clone();
                b[i] ^= x;
                assert!(StoredSymtab::decode(&b, Path::new("t")).is_err(), "byte {i} ^ {x:#x}");
            }
        }
    }

    fn file_of(payload: &[u8]) -> Vec<u8> {
        codec::finish_zlib(SYMTAB_MAGIC, SYMTAB_VERSION, payload)
    }

    fn head(symbols: u64) -> Vec<u8> {
        let mut p = Vec::new();
        put_bytes(&mut p, &[1, 2, 3, 4]);
        p.push(0);
        varint::write_u64(&mut p, 0);
        varint::write_u64(&mut p, symbols);
        p
    }

    /// Payloads with valid checksums that break each rule: the error names the field.
    #[test]
    fn hostile_payloads_name_the_broken_field() {
        let field = |payload: &[u8]| match StoredSymtab::decode(&file_of(payload), Path::new("h")) {
            Err(Error::Corrupt { field, .. }) => field,
            other => panic!("expected Corrupt, got {other:?}"),
        };
        // A symbol count far beyond the bytes present: refused before any allocation.
        assert_eq!(field(&head(u64::MAX >> 1)), "symbols");
        // A shared prefix longer than the previous name.
        let mut p = head(1);
        p.extend_from_slice(&[0, 0, 5, 1, b'a']);
        assert_eq!(field(&p), "symbols.shared");
        // A shared prefix that splits a character of the previous name.
        let mut p = head(2);
        p.extend_from_slice(&[0, 0, 0, 2, 0xc3, 0xa9, 1, 0, 1, 0]);
        assert_eq!(field(&p), "symbols.shared");
        // Not UTF-8.
        let mut p = head(1);
        p.extend_from_slice(&[0, 0, 0, 1, 0xff]);
        assert_eq!(field(&p), "symbols.name");
        // Addresses that pass 2^64.
        let mut q = head(2);
        varint::write_u64(&mut q, 1);
        q.extend_from_slice(&[0, 0, 1, b'a']);
        varint::write_u64(&mut q, u64::MAX);
        q.extend_from_slice(&[0, 0, 1, b'b']);
        assert_eq!(field(&q), "symbols.start");
        // A name grown past the cap by shared prefixes (each suffix small).
        let mut p = head(2);
        p.extend_from_slice(&[0, 0, 0]);
        put_bytes(&mut p, &[b'a'; MAX_SYMTAB_NAME]);
        p.extend_from_slice(&[0, 0]);
        varint::write_u64(&mut p, MAX_SYMTAB_NAME as u64);
        put_bytes(&mut p, b"b");
        assert_eq!(field(&p), "symbols.name");
        // Unknown origin, bad build-id, trailing bytes.
        let mut p = Vec::new();
        put_bytes(&mut p, &[1]);
        p.push(9);
        assert_eq!(field(&p), "origin");
        let mut p = Vec::new();
        put_bytes(&mut p, &[]);
        assert_eq!(field(&p), "build_id");
        let mut p = head(0);
        p.push(0);
        assert_eq!(field(&p), "trailing bytes");
    }

    /// A small file that inflates beyond the bound is refused, not inflated without end.
    #[test]
    fn decompression_bomb_is_refused() {
        let mut p = head(0);
        p.resize(codec::MAX_ZLIB_PAYLOAD as usize + 10, 0);
        let f = file_of(&p);
        assert!(f.len() < 1 << 20, "{}", f.len());
        match StoredSymtab::decode(&f, Path::new("bomb")) {
            Err(Error::Corrupt { field, .. }) => assert_eq!(field, "compressed payload"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn store_put_read_and_name_checks() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path()).unwrap();
        let t = table();
        let n = db.put_symtab(&t).unwrap();
        assert!(n > 0);
        assert_eq!(db.put_symtab(&t).unwrap(), 0, "stored once");
        assert!(db.symtab_path(&t.build_id).ends_with("binaries/ab/cd0102.sym"));
        assert_eq!(db.read_symtab(&t.build_id).unwrap(), t);
        match db.read_symtab(&[9, 9]) {
            Err(Error::Io { source, .. }) => assert_eq!(source.kind(), ErrorKind::NotFound),
            other => panic!("{other:?}"),
        }
        // A table filed under another build-id is refused.
        let other = db.symtab_path(&[7, 7]);
        fs::create_dir_all(other.parent().unwrap()).unwrap();
        fs::copy(db.symtab_path(&t.build_id), &other).unwrap();
        match db.read_symtab(&[7, 7]) {
            Err(Error::Corrupt { field, .. }) => assert_eq!(field, "build_id"),
            r => panic!("{r:?}"),
        }
        // A planted link is refused by the guarded reader.
        let link = db.symtab_path(&[5, 5]);
        fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(db.symtab_path(&t.build_id), &link).unwrap();
        assert!(db.read_symtab(&[5, 5]).unwrap_err().is_hostile_file());
    }

    #[test]
    fn gc_removes_only_old_unreferenced_tables() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path()).unwrap();
        let now = SystemTime::now();
        let epoch = db.new_epoch(now, "h").unwrap();
        let hd = db.host_dir(&epoch, "h").unwrap();
        hd.create().unwrap();
        let kept = StoredSymtab { build_id: vec![1; 20], ..table() };
        let gone = StoredSymtab { build_id: vec![2; 20], ..table() };
        db.put_symtab(&kept).unwrap();
        db.put_symtab(&gone).unwrap();
        let id = ImageId::from_build_id(&kept.build_id).unwrap();
        fs::write(hd.profile_path(&id, "cpu-clock"), b"x").unwrap();
        let hour = Duration::from_secs(3600);
        assert!(db.gc_symtabs(now, hour).unwrap().is_empty(), "young tables stay");
        let later = now + 2 * hour;
        assert_eq!(db.gc_symtabs(later, hour).unwrap(), vec![hex::encode(&gone.build_id)]);
        assert!(db.has_symtab(&kept.build_id));
        assert!(!db.has_symtab(&gone.build_id));
    }
}
