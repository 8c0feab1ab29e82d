//! ELF symbolization: stored file offsets -> virtual addresses -> function symbols, and DWARF
//! (inlined frames, source lines) when asked. DWARF is read by `blazesym` (BSD-3-Clause), which
//! maps the file and parses only the units an address needs.
//!
//! Everything here works on untrusted bytes: truncated files, files without sections, symbols
//! whose size overflows the address space. Failures degrade to "no symbol", never a panic.

use std::cell::{OnceCell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

pub use super::elfparts::ElfError;
use super::elfparts::ElfParts;
pub use super::names::demangle;
use super::names::text_from_bytes;

/// A `PT_LOAD` program header: file range and where it is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub offset: u64,
    pub filesz: u64,
    pub vaddr: u64,
}

/// A function symbol (raw, mangled name; bytes that are not UTF-8 written `\\xNN`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sym {
    pub start: u64,
    /// 0 when the symbol table gives no size.
    pub size: u64,
    pub name: String,
}

/// A section with an address (for naming samples that hit no symbol, e.g. `.plt`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Sect {
    start: u64,
    size: u64,
    name: String,
}

/// Identity facts of an ELF file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ElfIdentity {
    pub build_id: Option<Vec<u8>>,
    /// `.gnu_debuglink`: file name and CRC32 of the debug file.
    pub debuglink: Option<(Vec<u8>, u32)>,
}

/// Read the build-id and debuglink of an ELF file.
pub fn elf_identity(data: &[u8]) -> Result<ElfIdentity, ElfError> {
    elf_identity_from(data)
}

/// [`elf_identity`] over any reader (e.g. `object::ReadCache` reading only the pages needed).
pub fn elf_identity_from<'d, R: object::ReadRef<'d>>(data: R) -> Result<ElfIdentity, ElfError> {
    let file = object::File::parse(data)?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(ElfError::NotElf(file.format()));
    }
    // A broken note section is treated as "no build-id" rather than an unreadable file.
    let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
    let debuglink = file.gnu_debuglink().ok().flatten().map(|(n, c)| (n.to_vec(), c));
    Ok(ElfIdentity { build_id, debuglink })
}

fn parse<'d, R: object::ReadRef<'d>>(data: R) -> Result<object::File<'d, R>, ElfError> {
    let file = object::File::parse(data)?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(ElfError::NotElf(file.format()));
    }
    Ok(file)
}

/// One frame from DWARF, innermost first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// Function name as DWARF gives it (the mangled linkage name when there is one; reports
    /// demangle it with [`super::names::display_name`]).
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// What symbolization needs from an image without DWARF: segments, function symbols and
/// sections. This is what the symbol cache stores per build-id (see [`super::symcache`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SymbolTable {
    pub segments: Vec<Segment>,
    /// Sorted by start; duplicates at one address reduced to the best name.
    pub symbols: Vec<Sym>,
    sections: Vec<Sect>,
    /// Whether the binary or its debug file has a non-empty `.debug_info`.
    pub has_dwarf: bool,
    /// Whether the only symbols were the dynamic ones (`.dynsym`: exported functions) because
    /// the binary is stripped and no debug file was found: internal functions have no name.
    pub dynsym_only: bool,
}

impl SymbolTable {
    /// Build from the binary's bytes (segments come from it) and optionally a separate debug
    /// file's bytes (its `.symtab` is used too; a stripped binary has none).
    pub fn build(binary: &[u8], debug: Option<&[u8]>) -> Result<Self, ElfError> {
        Self::build_from(binary, debug)
    }

    /// Build from files, reading only their headers and symbol tables (see
    /// [`super::elfparts`]), not their DWARF. A debug file that cannot be read is left out.
    pub fn from_files(binary: &Path, debug: Option<&Path>) -> Result<Self, ElfError> {
        let binary = ElfParts::read(binary)?;
        let debug = debug.and_then(|d| ElfParts::read(d).ok());
        Self::build_from(&binary, debug.as_ref())
    }

    /// [`SymbolTable::build`] over any reader, e.g. [`super::elfparts::ElfParts`], which holds
    /// only the headers and symbol tables of a file instead of all of it.
    pub fn build_from<'a, 'b, B: object::ReadRef<'a>, D: object::ReadRef<'b>>(
        binary: B,
        debug: Option<D>,
    ) -> Result<Self, ElfError> {
        let file = parse(binary)?;
        super::stats::count(&super::stats::ELF_TABLES_BUILT);
        let segments = file
            .segments()
            .map(|s| {
                let (offset, filesz) = s.file_range();
                Segment { offset, filesz, vaddr: s.address() }
            })
            .collect();
        let mut symbols = Vec::new();
        let mut sections = Vec::new();
        let mut full = collect_symbols(&file, &mut symbols);
        collect_sections(&file, &mut sections);
        let debug_file = debug.and_then(|d| parse(d).ok());
        let mut has_dwarf = has_debug_info(&file);
        if let Some(df) = &debug_file {
            full |= collect_symbols(df, &mut symbols);
            if sections.is_empty() {
                collect_sections(df, &mut sections);
            }
            has_dwarf |= has_debug_info(df);
        }
        let dynsym_only = !full && !symbols.is_empty();
        let symbols = normalize_symbols(symbols);
        sections.sort_by_key(|s| s.start);
        Ok(Self { segments, symbols, sections, has_dwarf, dynsym_only })
    }

    /// The table of a database's stored symbol table (FORMAT.md §10), normalized as a live
    /// binary's: symbols and segments, no sections, no DWARF.
    pub fn from_stored(t: &profile_format::StoredSymtab) -> Self {
        let segments = t
            .segments
            .iter()
            .map(|s| Segment { offset: s.offset, filesz: s.filesz, vaddr: s.vaddr })
            .collect();
        let symbols = t
            .symbols
            .iter()
            .map(|s| Sym { start: s.start, size: s.size, name: s.name.clone() })
            .collect();
        Self {
            segments,
            symbols: normalize_symbols(symbols),
            sections: Vec::new(),
            has_dwarf: false,
            dynsym_only: t.origin == profile_format::SymtabOrigin::Dynsym,
        }
    }

    /// Compact binary encoding for the cache (see [`SymbolTable::decode`]).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.symbols.len() * 40);
        out.extend_from_slice(TABLE_MAGIC);
        out.push(u8::from(self.has_dwarf) | (u8::from(self.dynsym_only) << 1));
        put_u64(&mut out, self.segments.len() as u64);
        for s in &self.segments {
            put_u64(&mut out, s.offset);
            put_u64(&mut out, s.filesz);
            put_u64(&mut out, s.vaddr);
        }
        for list in [&self.symbols, &self.sections_as_syms()] {
            put_u64(&mut out, list.len() as u64);
            for s in list.iter() {
                put_u64(&mut out, s.start);
                put_u64(&mut out, s.size);
                put_u64(&mut out, s.name.len() as u64);
                out.extend_from_slice(s.name.as_bytes());
            }
        }
        out
    }

    fn sections_as_syms(&self) -> Vec<Sym> {
        self.sections
            .iter()
            .map(|s| Sym { start: s.start, size: s.size, name: s.name.clone() })
            .collect()
    }

    /// Decode [`SymbolTable::encode`]'s output; `None` for anything malformed (a damaged cache
    /// entry is rebuilt, never trusted).
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut r = bytes.strip_prefix(TABLE_MAGIC)?;
        let (&dw, rest) = r.split_first()?;
        r = rest;
        let nseg = take_len(&mut r, 24)?;
        let mut segments = Vec::with_capacity(nseg);
        for _ in 0..nseg {
            segments.push(Segment {
                offset: take_u64(&mut r)?,
                filesz: take_u64(&mut r)?,
                vaddr: take_u64(&mut r)?,
            });
        }
        let mut lists: Vec<Vec<Sym>> = Vec::with_capacity(2);
        for _ in 0..2 {
            let n = take_len(&mut r, 24)?;
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                let start = take_u64(&mut r)?;
                let size = take_u64(&mut r)?;
                let len = take_len(&mut r, 1)?;
                let (name, rest) = r.split_at_checked(len)?;
                r = rest;
                v.push(Sym { start, size, name: String::from_utf8(name.to_vec()).ok()? });
            }
            lists.push(v);
        }
        if !r.is_empty() || dw > 3 {
            return None;
        }
        let sections: Vec<Sect> = lists
            .pop()?
            .into_iter()
            .map(|s| Sect { start: s.start, size: s.size, name: s.name })
            .collect();
        let symbols = lists.pop()?;
        // Lookups binary-search these: refuse anything not sorted.
        if !symbols.is_sorted_by_key(|s| s.start) || !sections.is_sorted_by_key(|s| s.start) {
            return None;
        }
        Some(Self { segments, symbols, sections, has_dwarf: dw & 1 == 1, dynsym_only: dw & 2 == 2 })
    }
}

const TABLE_MAGIC: &[u8] = b"dcpisym1";

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn take_u64(r: &mut &[u8]) -> Option<u64> {
    let (head, rest) = r.split_first_chunk::<8>()?;
    *r = rest;
    Some(u64::from_le_bytes(*head))
}

/// A length that must fit in what is left (each element at least `min_elem` bytes).
fn take_len(r: &mut &[u8], min_elem: usize) -> Option<usize> {
    let n = usize::try_from(take_u64(r)?).ok()?;
    (n.checked_mul(min_elem)? <= r.len()).then_some(n)
}

/// Where to load DWARF from when a frame is first asked for.
#[derive(Debug)]
enum DwarfSource {
    None,
    Files { binary: PathBuf, debug: Option<PathBuf> },
}

/// A blazesym symbolizer over one file with DWARF (the separate debug file when there is one:
/// dcpi's own search already found it, so blazesym is told not to look for another).
struct Dwarf {
    symbolizer: Symbolizer,
    source: Source<'static>,
}

/// Symbol table and, on demand, DWARF of one image. DWARF is opened at most once and only when
/// a frame is asked for that the caller (the symbol cache) did not already know.
pub struct ElfSymbolizer {
    table: SymbolTable,
    source: DwarfSource,
    dwarf: OnceCell<Option<Dwarf>>,
    /// Innermost frame per address: preloaded from the cache, then memoized.
    memo: RefCell<HashMap<u64, Option<Frame>>>,
    /// Frames computed from DWARF in this run (to be written to the cache).
    fresh: RefCell<Vec<(u64, Option<Frame>)>>,
}

impl std::fmt::Debug for ElfSymbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElfSymbolizer")
            .field("segments", &self.table.segments)
            .field("symbols", &self.table.symbols.len())
            .field("source", &self.source)
            .finish()
    }
}

impl ElfSymbolizer {
    /// Build from bytes (an image with no file, such as this machine's vDSO): symbols only;
    /// DWARF is read from files (see [`ElfSymbolizer::from_table`]).
    pub fn new(binary: &[u8], debug: Option<&[u8]>) -> Result<Self, ElfError> {
        let table = SymbolTable::build(binary, debug)?;
        Ok(Self::from_table(table, None, None))
    }

    /// From a (possibly cached) table; DWARF, if needed later, is read from these files.
    pub fn from_table(table: SymbolTable, binary: Option<PathBuf>, debug: Option<PathBuf>) -> Self {
        let source = match binary {
            Some(binary) => DwarfSource::Files { binary, debug },
            None => DwarfSource::None,
        };
        Self {
            table,
            source,
            dwarf: OnceCell::new(),
            memo: RefCell::new(HashMap::new()),
            fresh: RefCell::new(Vec::new()),
        }
    }

    pub fn has_dwarf(&self) -> bool {
        self.table.has_dwarf
    }

    /// Only `.dynsym` was available (see [`SymbolTable::dynsym_only`]).
    pub fn dynsym_only(&self) -> bool {
        self.table.dynsym_only
    }

    pub fn symbol_count(&self) -> usize {
        self.table.symbols.len()
    }

    pub fn table(&self) -> &SymbolTable {
        &self.table
    }

    /// The binary file symbols and DWARF come from, when known.
    pub fn binary_path(&self) -> Option<&std::path::Path> {
        match &self.source {
            DwarfSource::Files { binary, .. } => Some(binary),
            DwarfSource::None => None,
        }
    }

    /// Frames already known for some addresses (from the symbol cache).
    pub fn preload_frames(&self, frames: impl IntoIterator<Item = (u64, Option<Frame>)>) {
        self.memo.borrow_mut().extend(frames);
    }

    /// Frames computed from DWARF since the last call (for the symbol cache).
    pub fn take_fresh_frames(&self) -> Vec<(u64, Option<Frame>)> {
        std::mem::take(&mut *self.fresh.borrow_mut())
    }

    /// Map a file offset to a virtual address through the `PT_LOAD` segment containing it.
    pub fn offset_to_vaddr(&self, offset: u64) -> Option<u64> {
        self.table
            .segments
            .iter()
            .find(|s| offset >= s.offset && offset - s.offset < s.filesz)
            .and_then(|s| (offset - s.offset).checked_add(s.vaddr))
    }

    /// The function symbol covering `vaddr`: a sized symbol containing it, or the nearest
    /// preceding symbol when that one has no size (and lies in the same section).
    pub fn symbol(&self, vaddr: u64) -> Option<&Sym> {
        let syms = &self.table.symbols;
        let idx = syms.partition_point(|s| s.start <= vaddr);
        if idx == 0 {
            return None;
        }
        // Look back a little for an enclosing symbol in case of nested/overlapping entries.
        for back in 1..=idx.min(8) {
            let s = &syms[idx - back];
            if s.size > 0 && vaddr - s.start < s.size {
                return Some(s);
            }
        }
        let s = &syms[idx - 1];
        if s.size == 0 && self.same_section(s.start, vaddr) {
            return Some(s);
        }
        None
    }

    fn same_section(&self, a: u64, b: u64) -> bool {
        match (self.section_of(a), self.section_of(b)) {
            (Some(x), Some(y)) => std::ptr::eq(x, y),
            // Without section headers there is nothing better than the nearest symbol.
            _ => self.table.sections.is_empty(),
        }
    }

    fn section_of(&self, vaddr: u64) -> Option<&Sect> {
        let secs = &self.table.sections;
        let idx = secs.partition_point(|s| s.start <= vaddr);
        let s = secs.get(idx.checked_sub(1)?)?;
        (vaddr - s.start < s.size).then_some(s)
    }

    /// Name of the section containing `vaddr` (e.g. `.plt`), for samples outside any symbol.
    pub fn section_name(&self, vaddr: u64) -> Option<&str> {
        self.section_of(vaddr).map(|s| s.name.as_str())
    }

    /// File offset of `vaddr` through the `PT_LOAD` segment mapping it (inverse of
    /// [`ElfSymbolizer::offset_to_vaddr`]).
    pub fn vaddr_to_offset(&self, vaddr: u64) -> Option<u64> {
        self.table
            .segments
            .iter()
            .find(|s| vaddr >= s.vaddr && vaddr - s.vaddr < s.filesz)
            .and_then(|s| (vaddr - s.vaddr).checked_add(s.offset))
    }

    /// End address (exclusive) of a symbol: its size, or for a symbol without one the next
    /// symbol's start, bounded by the end of its section.
    pub fn symbol_end(&self, sym: &Sym) -> u64 {
        if sym.size > 0 {
            return sym.start.saturating_add(sym.size);
        }
        let syms = &self.table.symbols;
        let next = syms.get(syms.partition_point(|s| s.start <= sym.start)).map(|s| s.start);
        let sect_end = self.section_of(sym.start).map(|s| s.start.saturating_add(s.size));
        match (next, sect_end) {
            (Some(n), Some(e)) => n.min(e),
            (Some(x), None) | (None, Some(x)) => x,
            (None, None) => sym.start,
        }
    }

    /// The innermost (most deeply inlined) DWARF frame at `vaddr`; `None` without DWARF.
    pub fn frame(&self, vaddr: u64) -> Option<Frame> {
        if let Some(f) = self.memo.borrow().get(&vaddr) {
            return f.clone();
        }
        let f = self.dwarf().and_then(|d| innermost_frame(d, vaddr));
        self.memo.borrow_mut().insert(vaddr, f.clone());
        // Without DWARF nothing is worth remembering: the table says so already.
        if self.table.has_dwarf {
            self.fresh.borrow_mut().push((vaddr, f.clone()));
        }
        f
    }

    fn dwarf(&self) -> Option<&Dwarf> {
        self.dwarf
            .get_or_init(|| {
                if !self.table.has_dwarf {
                    return None;
                }
                let DwarfSource::Files { binary, debug } = &self.source else { return None };
                Some(open_dwarf(debug.as_deref().unwrap_or(binary)))
            })
            .as_ref()
    }
}

fn open_dwarf(path: &Path) -> Dwarf {
    super::stats::count(&super::stats::DWARF_LOADS);
    let symbolizer = Symbolizer::builder()
        // Names stay raw: reports demangle them (names.rs), and --raw-names shows them as is.
        .enable_demangling(false)
        .enable_inlined_fns(true)
        .enable_code_info(true)
        .set_debug_dirs(Option::<&[&Path]>::None)
        .build();
    let mut elf = Elf::new(path);
    elf.debug_syms = true;
    Dwarf { symbolizer, source: Source::Elf(elf) }
}

/// The innermost (most deeply inlined) function at `vaddr` and the source line of `vaddr`.
fn innermost_frame(d: &Dwarf, vaddr: u64) -> Option<Frame> {
    let Ok(Symbolized::Sym(sym)) =
        d.symbolizer.symbolize_single(&d.source, Input::VirtOffset(vaddr))
    else {
        return None;
    };
    // blazesym lists inlined calls outermost first, and gives the address's own location to the
    // innermost one.
    let (function, code) = match sym.inlined.last() {
        Some(f) => (f.name.to_string(), f.code_info.as_ref()),
        None => (sym.name.to_string(), sym.code_info.as_deref()),
    };
    let (file, line) = match code {
        Some(c) => (Some(c.to_path().to_string_lossy().into_owned()), c.line),
        None => (None, None),
    };
    Some(Frame { function: Some(function), file, line })
}

fn has_debug_info<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>) -> bool {
    file.section_by_name(".debug_info").is_some_and(|s| s.size() > 0)
}

/// Add the function symbols of `file` to `out`; returns whether it has a static symbol table
/// (`.symtab`) with any, as opposed to only the exported `.dynsym` ones.
fn collect_symbols<'d, R: object::ReadRef<'d>>(
    file: &object::File<'d, R>,
    out: &mut Vec<Sym>,
) -> bool {
    let mut add = |sym: object::Symbol<'d, '_, R>| {
        if sym.is_undefined() || sym.kind() != SymbolKind::Text {
            return;
        }
        // A name that is not UTF-8 still names the function (escaped), rather than leaving its
        // samples to the previous symbol.
        let Ok(name) = sym.name_bytes() else { return };
        if name.is_empty() || name.starts_with(b"$") {
            return;
        }
        let name = text_from_bytes(name).into_owned();
        out.push(Sym { start: sym.address(), size: sym.size(), name });
    };
    let mut full = false;
    for sym in file.symbols() {
        full |= !sym.is_undefined() && sym.kind() == SymbolKind::Text;
        add(sym);
    }
    for sym in file.dynamic_symbols() {
        add(sym);
    }
    full
}

fn collect_sections<'d, R: object::ReadRef<'d>>(file: &object::File<'d, R>, out: &mut Vec<Sect>) {
    for s in file.sections() {
        if s.address() == 0 || s.size() == 0 {
            continue;
        }
        let name = s.name().unwrap_or("?").to_owned();
        out.push(Sect { start: s.address(), size: s.size(), name });
    }
}

/// Sort by address; at one address keep one symbol, preferring a sized one, then a name without
/// a leading underscore (aliases like `__libc_malloc`/`malloc`), then the shorter name.
fn normalize_symbols(mut syms: Vec<Sym>) -> Vec<Sym> {
    // Lazily: addresses nearly always differ, and comparing names was most of the sort.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_and_truncated_input_is_an_error_not_a_panic() {
        assert!(ElfSymbolizer::new(b"", None).is_err());
        assert!(ElfSymbolizer::new(b"\x7fELF\x02\x01\x01", None).is_err());
        assert!(elf_identity(&[0u8; 4096]).is_err());
        let mut junk = b"\x7fELF\x02\x01\x01\0".to_vec();
        junk.resize(200, 0xff);
        assert!(ElfSymbolizer::new(&junk, Some(&junk)).is_err());
    }

    #[test]
    fn nearest_symbol_rules() {
        let table = SymbolTable {
            segments: vec![Segment { offset: 0x1000, filesz: 0x1000, vaddr: 0x401000 }],
            symbols: normalize_symbols(vec![
                Sym { start: 0x401000, size: 0x10, name: "a".into() },
                Sym { start: 0x401100, size: 0, name: "b".into() },
                Sym { start: 0x401200, size: u64::MAX, name: "huge".into() },
                Sym { start: 0x401000, size: 0x10, name: "_a_alias".into() },
            ]),
            sections: Vec::new(),
            has_dwarf: false,
            dynsym_only: true,
        };
        let enc = table.encode();
        assert_eq!(SymbolTable::decode(&enc).as_ref(), Some(&table), "cache round trip");
        for cut in [0, 5, 9, enc.len() / 2, enc.len() - 1] {
            assert_eq!(SymbolTable::decode(&enc[..cut]), None, "truncated at {cut}");
        }
        let mut bad = enc.clone();
        bad[16] = 0xff; // segment count far beyond the data
        assert_eq!(SymbolTable::decode(&bad), None);
        let s = ElfSymbolizer::from_table(table, None, None);
        assert_eq!(s.frame(0x401008), None, "no DWARF source");
        assert_eq!(s.offset_to_vaddr(0x1008), Some(0x401008));
        assert_eq!(s.offset_to_vaddr(0x2000), None);
        assert_eq!(s.offset_to_vaddr(0xfff), None);
        assert_eq!(s.symbol(0x401008).map(|s| s.name.as_str()), Some("a"));
        assert_eq!(s.symbol(0x401010), None, "past a sized symbol's end");
        assert_eq!(s.symbol(0x401150).map(|s| s.name.as_str()), Some("b"));
        assert_eq!(s.symbol(u64::MAX).map(|s| s.name.as_str()), Some("huge"));
        assert_eq!(s.symbol(0x400000), None);
    }

    #[test]
    // Reads and writes ELF files (its own executable and damaged copies), never database files.
    #[allow(clippy::disallowed_methods)]
    fn same_table_as_from_the_whole_file_and_errors_for_bad_files() {
        // (Here rather than in elfparts, which must not import symbolize: issue 34.)
        // This test's own executable: a debug build with .symtab, .dynsym and DWARF.
        let exe = std::env::current_exe().expect("current exe");
        let whole = std::fs::read(&exe).expect("read exe");
        let want = SymbolTable::build(&whole, None).expect("table from the whole file");
        assert!(want.symbols.len() > 100 && want.has_dwarf, "{} symbols", want.symbols.len());
        let got = SymbolTable::from_files(&exe, None).expect("table from the parts");
        assert_eq!(got, want);
        let with_debug = SymbolTable::from_files(&exe, Some(&exe)).expect("with a debug file");
        assert_eq!(with_debug, SymbolTable::build(&whole, Some(&whole)).expect("whole, twice"));

        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).expect("write");
            p
        };
        for (name, bytes) in [
            ("empty", &b""[..]),
            ("garbage", &[0xab; 4096][..]),
            ("header-only", &whole[..64]),
            ("truncated", &whole[..whole.len() / 2]),
        ] {
            let p = write(name, bytes);
            let parts = ElfParts::read(&p);
            let table = SymbolTable::from_files(&p, None);
            assert!(parts.is_err() || table.is_err(), "{name}: {table:?}");
        }
        assert!(matches!(ElfParts::read(dir.path()), Err(ElfError::Io(_))), "a directory");
        let missing = dir.path().join("missing");
        assert!(matches!(SymbolTable::from_files(&missing, None), Err(ElfError::Io(_))));
        // A debug file that cannot be read is left out, as before.
        let garbage = dir.path().join("garbage");
        assert_eq!(SymbolTable::from_files(&exe, Some(&garbage)).expect("binary alone"), want);
    }
}
