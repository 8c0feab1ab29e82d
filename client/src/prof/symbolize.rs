//! ELF symbolization: stored file offsets -> virtual addresses -> function symbols, and DWARF
//! (inlined frames, source lines) when asked.
//!
//! Everything here works on untrusted bytes: truncated files, files without sections, symbols
//! whose size overflows the address space. Failures degrade to "no symbol", never a panic.

use std::borrow::Cow;
use std::rc::Rc;

use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SymbolKind};

/// Errors while reading an ELF file.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("not a readable ELF file: {0}")]
    Parse(#[from] object::Error),
    #[error("not an ELF file (format {0:?})")]
    NotElf(object::BinaryFormat),
}

/// A `PT_LOAD` program header: file range and where it is mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    pub offset: u64,
    pub filesz: u64,
    pub vaddr: u64,
}

/// A function symbol (raw, mangled name).
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
    let file = parse(data)?;
    // A broken note section is treated as "no build-id" rather than an unreadable file.
    let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
    let debuglink = file.gnu_debuglink().ok().flatten().map(|(n, c)| (n.to_vec(), c));
    Ok(ElfIdentity { build_id, debuglink })
}

fn parse(data: &[u8]) -> Result<object::File<'_>, ElfError> {
    let file = object::File::parse(data)?;
    if file.format() != object::BinaryFormat::Elf {
        return Err(ElfError::NotElf(file.format()));
    }
    Ok(file)
}

/// One frame from DWARF, innermost first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// Demangled function name, if DWARF names it.
    pub function: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
}

type Reader = gimli::EndianRcSlice<gimli::RunTimeEndian>;

/// Symbol tables, segments and (optionally) DWARF of one image, owned.
pub struct ElfSymbolizer {
    segments: Vec<Segment>,
    /// Sorted by start; duplicates at one address reduced to the best name.
    symbols: Vec<Sym>,
    sections: Vec<Sect>,
    dwarf: Option<addr2line::Context<Reader>>,
}

impl std::fmt::Debug for ElfSymbolizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ElfSymbolizer")
            .field("segments", &self.segments)
            .field("symbols", &self.symbols.len())
            .field("dwarf", &self.dwarf.is_some())
            .finish()
    }
}

impl ElfSymbolizer {
    /// Build from the binary's bytes (segments come from it) and optionally a separate debug
    /// file's bytes (its `.symtab` and DWARF are used too; a stripped binary has neither).
    /// `want_dwarf` loads DWARF (costly) only when lines or inlines are asked for.
    pub fn new(binary: &[u8], debug: Option<&[u8]>, want_dwarf: bool) -> Result<Self, ElfError> {
        let file = parse(binary)?;
        let segments = file
            .segments()
            .map(|s| {
                let (offset, filesz) = s.file_range();
                Segment { offset, filesz, vaddr: s.address() }
            })
            .collect();
        let mut symbols = Vec::new();
        let mut sections = Vec::new();
        collect_symbols(&file, &mut symbols);
        collect_sections(&file, &mut sections);
        let debug_file = debug.and_then(|d| parse(d).ok());
        if let Some(df) = &debug_file {
            collect_symbols(df, &mut symbols);
            if sections.is_empty() {
                collect_sections(df, &mut sections);
            }
        }
        let symbols = normalize_symbols(symbols);
        sections.sort_by_key(|s| s.start);
        let mut dwarf = None;
        if want_dwarf {
            // Prefer the debug file's DWARF; fall back to the binary's own.
            if let Some(df) = &debug_file {
                dwarf = load_dwarf(df);
            }
            if dwarf.is_none() {
                dwarf = load_dwarf(&file);
            }
        }
        Ok(ElfSymbolizer { segments, symbols, sections, dwarf })
    }

    pub fn has_dwarf(&self) -> bool {
        self.dwarf.is_some()
    }

    pub fn symbol_count(&self) -> usize {
        self.symbols.len()
    }

    /// Map a file offset to a virtual address through the `PT_LOAD` segment containing it.
    pub fn offset_to_vaddr(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| offset >= s.offset && offset - s.offset < s.filesz)
            .and_then(|s| (offset - s.offset).checked_add(s.vaddr))
    }

    /// The function symbol covering `vaddr`: a sized symbol containing it, or the nearest
    /// preceding symbol when that one has no size (and lies in the same section).
    pub fn symbol(&self, vaddr: u64) -> Option<&Sym> {
        let idx = self.symbols.partition_point(|s| s.start <= vaddr);
        if idx == 0 {
            return None;
        }
        // Look back a little for an enclosing symbol in case of nested/overlapping entries.
        for back in 1..=idx.min(8) {
            let s = &self.symbols[idx - back];
            if s.size > 0 && vaddr - s.start < s.size {
                return Some(s);
            }
        }
        let s = &self.symbols[idx - 1];
        if s.size == 0 && self.same_section(s.start, vaddr) {
            return Some(s);
        }
        None
    }

    fn same_section(&self, a: u64, b: u64) -> bool {
        match (self.section_of(a), self.section_of(b)) {
            (Some(x), Some(y)) => std::ptr::eq(x, y),
            // Without section headers there is nothing better than the nearest symbol.
            _ => self.sections.is_empty(),
        }
    }

    fn section_of(&self, vaddr: u64) -> Option<&Sect> {
        let idx = self.sections.partition_point(|s| s.start <= vaddr);
        let s = self.sections.get(idx.checked_sub(1)?)?;
        (vaddr - s.start < s.size).then_some(s)
    }

    /// Name of the section containing `vaddr` (e.g. `.plt`), for samples outside any symbol.
    pub fn section_name(&self, vaddr: u64) -> Option<&str> {
        self.section_of(vaddr).map(|s| s.name.as_str())
    }

    /// DWARF frames at `vaddr`, innermost (most deeply inlined) first. Empty without DWARF.
    pub fn frames(&self, vaddr: u64) -> Vec<Frame> {
        let Some(ctx) = &self.dwarf else { return Vec::new() };
        let mut out = Vec::new();
        let Ok(mut iter) = ctx.find_frames(vaddr).skip_all_loads() else { return out };
        while let Ok(Some(frame)) = iter.next() {
            let function =
                frame.function.as_ref().and_then(|f| f.raw_name().ok()).map(|raw| demangle(&raw));
            let (file, line) = match &frame.location {
                Some(loc) => (loc.file.map(str::to_owned), loc.line),
                None => (None, None),
            };
            out.push(Frame { function, file, line });
            if out.len() > 256 {
                break;
            }
        }
        if out.is_empty() {
            // No function DIE (e.g. assembly) but maybe a line-table row.
            if let Ok(Some(loc)) = ctx.find_location(vaddr) {
                out.push(Frame {
                    function: None,
                    file: loc.file.map(str::to_owned),
                    line: loc.line,
                });
            }
        }
        out
    }
}

fn collect_symbols(file: &object::File<'_>, out: &mut Vec<Sym>) {
    let mut add = |sym: object::Symbol<'_, '_>| {
        if sym.is_undefined() || sym.kind() != SymbolKind::Text {
            return;
        }
        let Ok(name) = sym.name() else { return };
        if name.is_empty() || name.starts_with('$') {
            return;
        }
        out.push(Sym { start: sym.address(), size: sym.size(), name: name.to_owned() });
    };
    for sym in file.symbols() {
        add(sym);
    }
    for sym in file.dynamic_symbols() {
        add(sym);
    }
}

fn collect_sections(file: &object::File<'_>, out: &mut Vec<Sect>) {
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
    syms.sort_by(|a, b| {
        a.start
            .cmp(&b.start)
            .then((b.size > 0).cmp(&(a.size > 0)))
            .then(a.name.starts_with('_').cmp(&b.name.starts_with('_')))
            .then(a.name.len().cmp(&b.name.len()))
            .then(a.name.cmp(&b.name))
    });
    syms.dedup_by(|later, first| later.start == first.start);
    syms
}

fn load_dwarf(file: &object::File<'_>) -> Option<addr2line::Context<Reader>> {
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
        let data: Cow<'_, [u8]> = match file.section_by_name(id.name()) {
            Some(s) => s.uncompressed_data().unwrap_or(Cow::Borrowed(&[])),
            None => Cow::Borrowed(&[]),
        };
        Ok(gimli::EndianRcSlice::new(Rc::from(&*data), endian))
    };
    // No info section: nothing addr2line could answer.
    if file.section_by_name(".debug_info").is_none_or(|s| s.size() == 0) {
        return None;
    }
    let dwarf = gimli::Dwarf::load(load).ok()?;
    addr2line::Context::from_dwarf(dwarf).ok()
}

/// Demangle a Rust (legacy or v0) or C++ symbol; other names are returned unchanged.
/// Rust hashes (`::h0123...`) are dropped.
pub fn demangle(raw: &str) -> String {
    if raw.starts_with("_R") || is_legacy_rust(raw) {
        if let Ok(d) = rustc_demangle::try_demangle(raw) {
            return format!("{d:#}");
        }
    }
    if raw.starts_with("_Z") {
        if let Ok(sym) = cpp_demangle::Symbol::new(raw) {
            let opts = cpp_demangle::DemangleOptions::new().recursion_limit(256);
            if let Ok(s) = sym.demangle(&opts) {
                return s;
            }
        }
    }
    raw.to_owned()
}

/// Legacy Rust mangling is Itanium-shaped but ends in a `17h<16 hex>E` hash segment.
fn is_legacy_rust(raw: &str) -> bool {
    let Some(body) = raw.strip_prefix("_ZN") else { return false };
    let body = body.split(['.', '$']).next().unwrap_or(body);
    let Some(body) = body.strip_suffix('E') else { return false };
    body.len() > 19 && {
        let tail = &body[body.len() - 19..];
        tail.starts_with("17h") && tail[3..].bytes().all(|b| b.is_ascii_hexdigit())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demangles_rust_and_cpp_and_leaves_c_alone() {
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(demangle("_ZN3foo3bazEi"), "foo::baz(int)");
        assert_eq!(demangle("main"), "main");
        assert_eq!(demangle("_Zgarbage!!"), "_Zgarbage!!");
    }

    #[test]
    fn garbage_and_truncated_input_is_an_error_not_a_panic() {
        assert!(ElfSymbolizer::new(b"", None, true).is_err());
        assert!(ElfSymbolizer::new(b"\x7fELF\x02\x01\x01", None, true).is_err());
        assert!(elf_identity(&[0u8; 4096]).is_err());
        let mut junk = b"\x7fELF\x02\x01\x01\0".to_vec();
        junk.resize(200, 0xff);
        assert!(ElfSymbolizer::new(&junk, Some(&junk), true).is_err());
    }

    #[test]
    fn nearest_symbol_rules() {
        let s = ElfSymbolizer {
            segments: vec![Segment { offset: 0x1000, filesz: 0x1000, vaddr: 0x401000 }],
            symbols: normalize_symbols(vec![
                Sym { start: 0x401000, size: 0x10, name: "a".into() },
                Sym { start: 0x401100, size: 0, name: "b".into() },
                Sym { start: 0x401200, size: u64::MAX, name: "huge".into() },
                Sym { start: 0x401000, size: 0x10, name: "_a_alias".into() },
            ]),
            sections: Vec::new(),
            dwarf: None,
        };
        assert_eq!(s.offset_to_vaddr(0x1008), Some(0x401008));
        assert_eq!(s.offset_to_vaddr(0x2000), None);
        assert_eq!(s.offset_to_vaddr(0xfff), None);
        assert_eq!(s.symbol(0x401008).map(|s| s.name.as_str()), Some("a"));
        assert_eq!(s.symbol(0x401010), None, "past a sized symbol's end");
        assert_eq!(s.symbol(0x401150).map(|s| s.name.as_str()), Some("b"));
        assert_eq!(s.symbol(u64::MAX).map(|s| s.name.as_str()), Some("huge"));
        assert_eq!(s.symbol(0x400000), None);
    }
}
