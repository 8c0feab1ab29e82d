//! The compact function-symbol table of one ELF build, for the database's symbol store
//! (FORMAT.md §10): what reports fall back on once the binary is rebuilt or deleted.
//!
//! Everything read here is untrusted: any file can be mapped executable. The file is read
//! through `object::ReadCache` (pread of the ranges needed, not a mapping a truncating writer
//! could turn into SIGBUS); its symbol and string tables together may be at most
//! [`MAX_TABLE_BYTES`], at most [`MAX_SYMTAB_SYMBOLS`] function symbols are kept and names are
//! cut to [`MAX_SYMTAB_NAME`] bytes. A file that breaks a bound gives an error, never a huge
//! allocation or a panic.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};
use profile_format::{
    StoredSymtab, SymtabOrigin, SymtabSegment, SymtabSymbol, MAX_SYMTAB_NAME, MAX_SYMTAB_SEGMENTS,
    MAX_SYMTAB_SYMBOLS,
};

/// Largest binary or debug file looked at (debug files of the largest programs are a few GB).
pub const MAX_FILE_BYTES: u64 = 8 << 30;
/// Largest symbol + string tables read from one file: 1 M symbols of 24 bytes plus their
/// names fit several times over.
pub const MAX_TABLE_BYTES: u64 = 256 << 20;
/// Where separate debug files live (gdb's default).
pub const SYSTEM_DEBUG_DIR: &str = "/usr/lib/debug";

/// Why no table was made.
#[derive(Debug, thiserror::Error)]
pub enum SymtabError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a readable ELF file: {detail}")]
    NotElf { path: PathBuf, detail: String },
    #[error("{path}: build-id {found} is not the profiled {want} (file replaced)")]
    OtherBuild { path: PathBuf, want: String, found: String },
    #[error("{path}: {what} exceeds {limit} (refused)")]
    TooLarge { path: PathBuf, what: &'static str, limit: u64 },
    #[error("{path}: no function symbols (stripped, and no debug file installed)")]
    NoSymbols { path: PathBuf },
}

fn open_checked(path: &Path) -> Result<File, SymtabError> {
    let io = |source| SymtabError::Io { path: path.to_owned(), source };
    // Non-blocking: a FIFO planted at the path must not hang the opener (the file type is
    // checked right after, on the descriptor).
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io)?;
    let md = f.metadata().map_err(io)?;
    if !md.is_file() {
        return Err(io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    if md.len() > MAX_FILE_BYTES {
        return Err(SymtabError::TooLarge {
            path: path.to_owned(),
            what: "file size",
            limit: MAX_FILE_BYTES,
        });
    }
    Ok(f)
}

type Cache = object::ReadCache<File>;

fn parse<'a>(path: &Path, data: &'a Cache) -> Result<object::File<'a, &'a Cache>, SymtabError> {
    let bad = |detail: String| SymtabError::NotElf { path: path.to_owned(), detail };
    let file = object::File::parse(data).map_err(|e| bad(e.to_string()))?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(bad(format!("{:?} file", file.format())));
    }
    // Symbol and string tables are read whole: bound them before any is.
    let tables: u64 = file
        .sections()
        .filter(|s| matches!(s.name(), Ok(".symtab" | ".strtab" | ".dynsym" | ".dynstr")))
        .map(|s| s.size())
        .fold(0u64, u64::saturating_add);
    if tables > MAX_TABLE_BYTES {
        return Err(SymtabError::TooLarge {
            path: path.to_owned(),
            what: "symbol and string tables",
            limit: MAX_TABLE_BYTES,
        });
    }
    Ok(file)
}

fn build_id_of<'a>(file: &object::File<'a, &'a Cache>) -> Option<Vec<u8>> {
    file.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// A name as reports show raw names: UTF-8 kept, other bytes written `\xNN`; cut at
/// [`MAX_SYMTAB_NAME`] bytes on a character boundary.
fn name_text(b: &[u8]) -> String {
    let mut s = match std::str::from_utf8(b) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            let mut out = String::new();
            for chunk in b.utf8_chunks() {
                out.push_str(chunk.valid());
                for x in chunk.invalid() {
                    out.push_str(&format!("\\x{x:02x}"));
                }
            }
            out
        }
    };
    if s.len() > MAX_SYMTAB_NAME {
        let mut cut = MAX_SYMTAB_NAME;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

/// Function symbols of `file` into `out` (at most [`MAX_SYMTAB_SYMBOLS`] in all); returns
/// whether `.symtab` had any (the file is not stripped).
fn collect<'a>(file: &object::File<'a, &'a Cache>, out: &mut Vec<SymtabSymbol>) -> bool {
    let mut full = false;
    let add = |sym: object::Symbol<'a, '_, &'a Cache>, out: &mut Vec<SymtabSymbol>| {
        if sym.is_undefined() || sym.kind() != SymbolKind::Text || out.len() >= MAX_SYMTAB_SYMBOLS {
            return false;
        }
        let Ok(name) = sym.name_bytes() else { return false };
        if name.is_empty() || name.starts_with(b"$") {
            return false;
        }
        out.push(SymtabSymbol { start: sym.address(), size: sym.size(), name: name_text(name) });
        true
    };
    for sym in file.symbols() {
        full |= add(sym, out);
    }
    for sym in file.dynamic_symbols() {
        add(sym, out);
    }
    full
}

/// Sorted by address, one symbol per address: a sized one first, then a name without a leading
/// underscore (`malloc` over `__libc_malloc`), then the shorter, then the smaller name: the
/// report's own rule for live binaries, so that both name an offset alike.
fn normalize(mut syms: Vec<SymtabSymbol>) -> Vec<SymtabSymbol> {
    syms.sort_by(|a, b| {
        a.start
            .cmp(&b.start)
            .then_with(|| (b.size > 0).cmp(&(a.size > 0)))
            .then_with(|| a.name.starts_with('_').cmp(&b.name.starts_with('_')))
            .then_with(|| a.name.len().cmp(&b.name.len()))
            .then_with(|| a.name.cmp(&b.name))
    });
    syms.dedup_by(|later, first| later.start == first.start);
    syms
}

/// Candidate separate debug files of `binary` (gdb's order): `<debug_root>/.build-id/xx/rest
/// .debug`, then the `.gnu_debuglink` name beside the binary, in its `.debug/` subdirectory and
/// under `<debug_root>/<binary's directory>/`.
fn debug_candidates(
    binary: &Path,
    build_id: &[u8],
    debuglink: Option<&[u8]>,
    debug_root: &Path,
) -> Vec<PathBuf> {
    let hex = hex::encode(build_id);
    let mut out = Vec::new();
    if hex.len() > 2 {
        out.push(debug_root.join(".build-id").join(&hex[..2]).join(format!("{}.debug", &hex[2..])));
    }
    let link = debuglink
        .and_then(|l| std::str::from_utf8(l).ok())
        .filter(|l| !l.is_empty() && !l.contains('/'));
    if let (Some(link), Some(dir)) = (link, binary.parent()) {
        out.push(dir.join(link));
        out.push(dir.join(".debug").join(link));
        let rel = dir.strip_prefix("/").unwrap_or(dir);
        out.push(debug_root.join(rel).join(link));
    }
    out
}

/// The symbol table of the build `build_id` of the ELF file at `path` (its `.symtab`, else
/// the `.symtab` of its separate debug file when one with the same build-id is installed,
/// else its `.dynsym`). `path` may have been replaced since it was profiled: a file of
/// another build is [`SymtabError::OtherBuild`].
pub fn extract(
    path: &Path,
    build_id: &[u8],
    debug_root: &Path,
) -> Result<StoredSymtab, SymtabError> {
    let cache = Cache::new(open_checked(path)?);
    let file = parse(path, &cache)?;
    let found = build_id_of(&file);
    if found.as_deref() != Some(build_id) {
        return Err(SymtabError::OtherBuild {
            path: path.to_owned(),
            want: hex::encode(build_id),
            found: found.map_or_else(|| "none".to_owned(), hex::encode),
        });
    }
    let segments: Vec<SymtabSegment> = file
        .segments()
        .take(MAX_SYMTAB_SEGMENTS)
        .map(|s| {
            let (offset, filesz) = s.file_range();
            SymtabSegment { offset, filesz, vaddr: s.address() }
        })
        .collect();
    let mut symbols = Vec::new();
    let full = collect(&file, &mut symbols);
    let mut origin = if full { SymtabOrigin::Symtab } else { SymtabOrigin::Dynsym };
    if !full {
        let link = file.gnu_debuglink().ok().flatten().map(|(n, _)| n.to_vec());
        for cand in debug_candidates(path, build_id, link.as_deref(), debug_root) {
            // A debug file counts only if it is of this very build (its notes keep the
            // build-id): cheaper and stricter than the debuglink's CRC of the whole file.
            let Ok(f) = open_checked(&cand) else { continue };
            let dcache = Cache::new(f);
            let Ok(dfile) = parse(&cand, &dcache) else { continue };
            if build_id_of(&dfile).as_deref() != Some(build_id) {
                continue;
            }
            let mut dsyms = Vec::new();
            if collect(&dfile, &mut dsyms) {
                // The binary's own dynamic symbols stay (aliases the debug file may lack).
                symbols.append(&mut dsyms);
                symbols.truncate(MAX_SYMTAB_SYMBOLS);
                origin = SymtabOrigin::DebugFile;
                break;
            }
        }
    }
    if symbols.is_empty() {
        return Err(SymtabError::NoSymbols { path: path.to_owned() });
    }
    Ok(StoredSymtab { build_id: build_id.to_vec(), origin, segments, symbols: normalize(symbols) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_escaped_and_cut_on_a_character_boundary() {
        assert_eq!(name_text(b"main"), "main");
        assert_eq!(name_text(b"a\xffb"), "a\\xffb");
        let long = "é".repeat(MAX_SYMTAB_NAME);
        let cut = name_text(long.as_bytes());
        assert!(cut.len() <= MAX_SYMTAB_NAME && cut.len() >= MAX_SYMTAB_NAME - 1, "{}", cut.len());
    }

    #[test]
    fn own_binary_gives_a_table_of_its_build() {
        let exe = std::env::current_exe().expect("exe");
        let cache = Cache::new(File::open(&exe).expect("open"));
        let Ok(file) = parse(&exe, &cache) else { return };
        let Some(id) = build_id_of(&file) else {
            dcpi_testkit::skip!("test binary has no build-id");
        };
        let t = extract(&exe, &id, Path::new("/nonexistent")).expect("table");
        assert_eq!(t.build_id, id);
        assert!(t.symbols.len() > 100, "{}", t.symbols.len());
        assert!(t.symbols.windows(2).all(|w| w[0].start < w[1].start), "sorted, one per address");
        assert!(!t.segments.is_empty());
        t.encode().expect("within the format's bounds");
        match extract(&exe, &[1, 2, 3], Path::new("/nonexistent")) {
            Err(SymtabError::OtherBuild { .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn garbage_files_are_errors() {
        let dir = tempfile::tempdir().expect("tmp");
        for (name, bytes) in [
            ("empty", b"".to_vec()),
            ("short", b"\x7fELF\x02\x01\x01".to_vec()),
            ("junk", {
                let mut j = b"\x7fELF\x02\x01\x01\0".to_vec();
                j.resize(4096, 0xff);
                j
            }),
        ] {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).expect("write");
            assert!(extract(&p, &[1], Path::new("/nonexistent")).is_err(), "{name}");
        }
        let fifo = dir.path().join("fifo");
        assert!(std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .is_ok_and(|s| s.success()));
        match extract(&fifo, &[1], Path::new("/nonexistent")) {
            Err(SymtabError::Io { .. }) => {}
            other => panic!("{other:?}"),
        }
    }
}
