//! The one symbolizer: what names an offset of an image, for every report tool (flat reports,
//! call stacks, `dcpilist`, `dcpiprof --symbols`, `dcpictl top`, `dcpiexport`).
//!
//! As blazesym's `Source`, a [`Source`] is chosen once per image by its kind (ELF with DWARF
//! through [`ElfSymbolizer`], the kernel or a module from the host's kallsyms snapshot, the
//! vDSO, a JIT region's perf map, or nothing for `[unknown]`), and every offset is then named
//! by [`Source::symbolize`] into one result type, [`Symbolized`]. Before this module each tool
//! dispatched on the kind itself, and the copies disagreed: a JIT offset no perf-map entry
//! covers was `[anon]+0x1000` in a flat report but `[anon]+0x1234` in a stack, a kernel frame
//! was named from a snapshot of another build in stacks while the flat report refused it, and
//! JIT symbols were found by a linear scan of the perf map per offset in three places.

use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;

use profile_format::{ImageId, JitSymbol, KallsymsSnapshot, KernelSymbol, UnknownReason};

use crate::names::display_name;
use crate::select::Loaded;
use crate::symbolize::ElfSymbolizer;

/// How per-symbol rows are keyed.
#[derive(Clone, Copy, Debug, Default)]
pub struct SymbolMode {
    /// Attribute to the innermost inlined function (DWARF).
    pub inlines: bool,
    /// One row per source line (DWARF).
    pub lines: bool,
    /// Show symbol names as stored (mangled), not demangled.
    pub raw_names: bool,
}

/// Symbol source of one ELF identity.
#[derive(Debug)]
pub enum ElfState {
    /// With the symbol cache entry id, when cached.
    Ready(Box<ElfSymbolizer>, Option<i64>),
    /// Only another build of the binary was found: its symbols must not be used.
    Mismatch,
    Missing,
}

/// Where the names of one image come from, chosen once by the image's kind.
#[derive(Debug)]
pub enum Source {
    /// An ELF file: its symbol tables, and DWARF (lines, inlined functions) when asked; or why
    /// there is none (another build found, or nothing).
    Elf(ElfState),
    /// The vDSO (no file): a copy found by build-id, or this machine's own of the same build.
    Vdso(ElfState),
    /// The core kernel, from the host directory's kallsyms snapshot.
    Kernel(Kallsyms),
    /// A kernel module, from the same snapshot.
    Module(Kallsyms),
    /// An anonymous (JIT) region with the perf map the daemon stored for it.
    Jit(JitTable),
    /// `[unknown]`: the offset is an [`UnknownReason`] code.
    Unknown,
}

/// The kernel's or one module's symbols in a kallsyms snapshot.
#[derive(Debug)]
pub struct Kallsyms {
    snap: Option<Rc<KallsymsSnapshot>>,
    /// The module's index and base address (`None` for the core kernel or a module the
    /// snapshot does not list, see `known`).
    module: Option<(u32, u64)>,
    /// False for a module the snapshot does not list: nothing is named.
    known: bool,
    /// The snapshot describes another build than the profile: nothing is named.
    mismatch: bool,
}

/// The function covering an offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Function<'a> {
    /// The name as stored (mangled; arbitrary text from an untrusted file, not escaped).
    pub raw: &'a str,
    /// How far into the function the offset is (bytes).
    pub offset: u64,
}

/// What an offset is named: one result for every kind of image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Symbolized {
    /// As reports show it: the function (demangled unless `raw_names`, control characters
    /// escaped), with `inlines` the innermost inlined function, a section outside `.text`
    /// (`[.plt]`), `[build-id mismatch]`, `[unknown: REASON]`, or, with no symbol, the
    /// unsymbolized `image+0xOFFSET` label.
    pub name: String,
    /// The covering symbol as stored (mangled), when there is one.
    pub raw: Option<String>,
    /// How far into that symbol the offset is.
    pub offset_in_function: Option<u64>,
    /// `file:line` (DWARF) when `lines` is asked, `??:0` when unknown.
    pub source: Option<String>,
}

impl Symbolized {
    fn plain(name: String) -> Self {
        Self { name, ..Self::default() }
    }

    /// The function name with its offset, as `dcpilist --top` shows it (`f` or `f+0x12`);
    /// `None` when no symbol covers the offset.
    pub fn with_offset(&self) -> Option<String> {
        self.raw.as_ref()?;
        Some(match self.offset_in_function {
            Some(o) if o > 0 => format!("{}+{o:#x}", self.name),
            _ => self.name.clone(),
        })
    }
}

/// `image+0xOFFSET` row name for samples no symbol covers. The offset is the file offset
/// (kernel: from the start of the text/module), rounded down to its 4 KiB page so that one
/// unsymbolized region gives one row rather than one per instruction.
pub fn unsymbolized(label: &str, off: u64) -> String {
    format!("{label}+{:#x}", off & !0xfff)
}

/// `[unknown: REASON]` of an `[unknown]` image's offset (a reason code).
pub fn unknown_name(code: u64) -> String {
    UnknownReason::from_code(code)
        .map_or_else(|| format!("[unknown: code {code}]"), |r| format!("[unknown: {}]", r.as_str()))
}

/// Symbol containing `addr` by the snapshot's own lookup (FORMAT.md, section 8), kept only
/// when it belongs to the module the profile is about (`None` = core kernel).
pub fn kernel_lookup(
    s: &KallsymsSnapshot,
    module: Option<u32>,
    addr: Option<u64>,
) -> Option<&KernelSymbol> {
    let sym = s.lookup(addr?)?;
    match module {
        Some(mi) => (sym.module == Some(mi)).then_some(sym),
        None => Some(sym),
    }
}

impl Kallsyms {
    /// The core kernel (`module` = `None`) or the module named `module` (as images name it,
    /// with or without brackets) in `snap`, checked against the profile's identity `id`.
    /// `image` (the image as reports name it) and `dir` (the host directory) are for the
    /// warnings.
    pub fn new(
        snap: Option<Rc<KallsymsSnapshot>>,
        module: Option<&str>,
        id: &ImageId,
        image: &str,
        dir: &std::path::Path,
        warn: &mut dyn FnMut(String),
    ) -> Self {
        let mut known = true;
        let module = match (module, &snap) {
            (Some(name), Some(s)) => {
                let name = name.trim_start_matches('[').trim_end_matches(']');
                let m = s
                    .modules
                    .iter()
                    .position(|m| m.name == name)
                    .map(|i| (i as u32, s.modules[i].base));
                if m.is_none() {
                    known = false;
                    warn(format!(
                        "module {name} not in the kallsyms snapshot of {}",
                        dir.display()
                    ));
                }
                m
            }
            (Some(_), None) => {
                known = false;
                None
            }
            (None, _) => None,
        };
        // The snapshot must describe the same kernel/module build as the profile.
        let have = match (&snap, module) {
            (Some(s), None) if known => s.kernel_build_id.as_ref(),
            (Some(s), Some((mi, _))) => {
                s.modules.get(mi as usize).and_then(|m| m.build_id.as_ref())
            }
            _ => None,
        };
        let mismatch = match (id, have) {
            (ImageId::BuildId(want), Some(have)) if want != have => {
                warn(format!(
                    "{image}: kallsyms snapshot of {} has build-id {}, the profile {}; not symbolizing",
                    dir.display(),
                    hex::encode(have),
                    hex::encode(want)
                ));
                true
            }
            _ => false,
        };
        Self { snap, module, known, mismatch }
    }

    /// The snapshot, when there is one.
    pub fn snapshot(&self) -> Option<&KallsymsSnapshot> {
        self.snap.as_deref()
    }

    /// The module's index and base address; `None` for the core kernel.
    pub fn module(&self) -> Option<(u32, u64)> {
        self.module
    }

    /// Address of offset `off` (from `_text`, or from the module's base).
    pub fn address(&self, off: u64) -> Option<u64> {
        let s = self.snap.as_deref()?;
        match self.module {
            Some((_, base)) => base.checked_add(off),
            None if self.known => s.text_base.checked_add(off),
            None => None,
        }
    }

    fn function(&self, off: u64) -> Option<Function<'_>> {
        if self.mismatch {
            return None;
        }
        let addr = self.address(off)?;
        let sym = kernel_lookup(self.snap.as_deref()?, self.module.map(|m| m.0), Some(addr))?;
        Some(Function { raw: &sym.name, offset: addr - sym.addr })
    }
}

/// The kallsyms snapshots of the selected host directories, each read once.
#[derive(Debug, Default)]
pub struct Snapshots(HashMap<usize, Option<Rc<KallsymsSnapshot>>>);

impl Snapshots {
    /// The snapshot of host directory `dir`; `None`, after a warning saying that the kernel
    /// `what` (samples, frames) stay unsymbolized, when it cannot be read.
    pub fn get(
        &mut self,
        loaded: &Loaded,
        dir: usize,
        what: &str,
        warn: &mut dyn FnMut(String),
    ) -> Option<Rc<KallsymsSnapshot>> {
        self.0
            .entry(dir)
            .or_insert_with(|| match loaded.dirs[dir].read_kallsyms() {
                Ok(s) => Some(Rc::new(s)),
                Err(e) => {
                    warn(format!("{e}: kernel {what} of this host/epoch stay unsymbolized"));
                    None
                }
            })
            .clone()
    }
}

/// A perf map sorted for binary search, with the answers of a linear scan in file order: where
/// entries overlap, the first listed wins (perf maps may list a recompiled function again).
#[derive(Clone, Debug, Default)]
pub struct JitTable {
    symbols: Vec<JitSymbol>,
    /// Disjoint, sorted (first, last inclusive, symbol index) ranges.
    ranges: Vec<(u64, u64, u32)>,
}

impl JitTable {
    /// Build from a perf map in its stored order. An entry of size 0 covers its start.
    pub fn new(symbols: Vec<JitSymbol>) -> Self {
        // Inclusive ends: an entry reaching the top of the address space cannot overflow.
        let last = |s: &JitSymbol| s.start.saturating_add(s.size.max(1) - 1);
        let mut starts: Vec<(u64, u32)> =
            symbols.iter().enumerate().map(|(i, s)| (s.start, i as u32)).collect();
        let mut ends: Vec<(u64, u32)> = symbols
            .iter()
            .enumerate()
            .filter_map(|(i, s)| last(s).checked_add(1).map(|e| (e, i as u32)))
            .collect();
        starts.sort_unstable();
        ends.sort_unstable();
        let mut points: Vec<u64> = starts.iter().chain(&ends).map(|p| p.0).collect();
        points.sort_unstable();
        points.dedup();
        // Sweep the boundaries: between two of them the covering entries do not change, and
        // the one listed first (lowest index) is the answer.
        let mut active: BTreeSet<u32> = BTreeSet::new();
        let (mut si, mut ei) = (0, 0);
        let mut ranges: Vec<(u64, u64, u32)> = Vec::new();
        for (k, &p) in points.iter().enumerate() {
            while ei < ends.len() && ends[ei].0 == p {
                active.remove(&ends[ei].1);
                ei += 1;
            }
            while si < starts.len() && starts[si].0 == p {
                active.insert(starts[si].1);
                si += 1;
            }
            let Some(&owner) = active.first() else { continue };
            let hi = points.get(k + 1).map_or(u64::MAX, |n| n - 1);
            match ranges.last_mut() {
                Some(r) if r.2 == owner && r.1.checked_add(1) == Some(p) => r.1 = hi,
                _ => ranges.push((p, hi, owner)),
            }
        }
        Self { symbols, ranges }
    }

    pub fn is_empty(&self) -> bool {
        self.symbols.is_empty()
    }

    /// The entries in their stored order.
    pub fn symbols(&self) -> &[JitSymbol] {
        &self.symbols
    }

    /// The entry covering `off` (`start <= off < start + max(size, 1)`), the first listed
    /// where entries overlap.
    pub fn lookup(&self, off: u64) -> Option<&JitSymbol> {
        let i = self.ranges.partition_point(|r| r.0 <= off).checked_sub(1)?;
        let (_, last, owner) = self.ranges[i];
        (off <= last).then(|| &self.symbols[owner as usize])
    }
}

impl Source {
    /// The ELF symbolizer, when symbols were found (ELF or vDSO).
    pub fn elf(&self) -> Option<&ElfSymbolizer> {
        match self {
            Self::Elf(ElfState::Ready(s, _)) | Self::Vdso(ElfState::Ready(s, _)) => Some(s),
            _ => None,
        }
    }

    /// The function covering `off`, by symbol table (no DWARF).
    pub fn function(&self, off: u64) -> Option<Function<'_>> {
        match self {
            Self::Elf(_) | Self::Vdso(_) => {
                let s = self.elf()?;
                let vaddr = s.offset_to_vaddr(off)?;
                let sym = s.symbol(vaddr)?;
                Some(Function { raw: &sym.name, offset: vaddr - sym.start })
            }
            Self::Kernel(k) | Self::Module(k) => k.function(off),
            Self::Jit(t) => t.lookup(off).map(|s| Function { raw: &s.name, offset: off - s.start }),
            Self::Unknown => None,
        }
    }

    /// Name offset `off` of the image as every report names it; `label` is the image's name in
    /// unsymbolized names (`libc.so.6+0x1000`).
    pub fn symbolize(&self, off: u64, mode: SymbolMode, label: &str) -> Symbolized {
        let named = |f: Function<'_>| Symbolized {
            name: display_name(f.raw, mode.raw_names),
            raw: Some(f.raw.to_owned()),
            offset_in_function: Some(f.offset),
            source: None,
        };
        match self {
            Self::Elf(ElfState::Ready(s, _)) | Self::Vdso(ElfState::Ready(s, _)) => {
                elf_symbolize(s, off, mode, label)
            }
            Self::Elf(ElfState::Mismatch) => Symbolized::plain("[build-id mismatch]".to_owned()),
            Self::Elf(ElfState::Missing) => Symbolized::plain(unsymbolized(label, off)),
            // No copy of the vDSO: the exact offset, which is what `dcpilist` can be asked for.
            Self::Vdso(_) => Symbolized::plain(format!("{label}+{off:#x}")),
            Self::Kernel(k) | Self::Module(k) if k.mismatch => {
                Symbolized::plain("[build-id mismatch]".to_owned())
            }
            Self::Kernel(_) | Self::Module(_) | Self::Jit(_) => self
                .function(off)
                .map_or_else(|| Symbolized::plain(unsymbolized(label, off)), named),
            Self::Unknown => Symbolized::plain(unknown_name(off)),
        }
    }
}

/// A file-offset range in which every offset has the same function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FunctionRange<'a> {
    /// First offset (file offset; kernel: from `_text` or the module's base).
    pub start: u64,
    /// End (exclusive).
    pub end: u64,
    /// The function's name as stored (mangled).
    pub raw: &'a str,
}

impl Source {
    /// Non-overlapping ranges covering every offset [`Source::function`] names, in order, each
    /// with the function it names there (adjacent ranges of one function merged): a symbol
    /// table to take elsewhere (`dcpiexport`'s symbols table). `None` when the source names no
    /// function (no binary, another build, a module missing from the snapshot); JIT and vDSO
    /// regions have no stable file to name ranges of.
    pub fn ranges(&self) -> Option<Vec<FunctionRange<'_>>> {
        match self {
            Self::Elf(ElfState::Ready(s, _)) => Some(elf_ranges(s)),
            Self::Kernel(k) | Self::Module(k) if !k.mismatch && k.known => {
                let snap = k.snap.as_deref()?;
                Some(kernel_ranges(snap, k.module))
            }
            _ => None,
        }
    }
}

fn elf_ranges(s: &ElfSymbolizer) -> Vec<FunctionRange<'_>> {
    let t = s.table();
    // Every symbol start and end is a boundary; between two boundaries the answer of
    // `symbol()` cannot change.
    let mut bounds: BTreeSet<u64> = BTreeSet::new();
    for sym in &t.symbols {
        bounds.insert(sym.start);
        if sym.size > 0 {
            bounds.insert(sym.start.saturating_add(sym.size));
        }
    }
    let bounds: Vec<u64> = bounds.into_iter().collect();
    let mut out: Vec<FunctionRange<'_>> = Vec::new();
    for w in bounds.windows(2) {
        let (a, b) = (w[0], w[1]);
        let Some(sym) = s.symbol(a) else { continue };
        // Map the virtual range back to file offsets through its segment.
        let Some(seg) = t.segments.iter().find(|g| a >= g.vaddr && a - g.vaddr < g.filesz) else {
            continue;
        };
        let start = a - seg.vaddr + seg.offset;
        let end = b.min(seg.vaddr + seg.filesz) - seg.vaddr + seg.offset;
        match out.last_mut() {
            Some(last) if last.end == start && last.raw == sym.name => last.end = end,
            _ => out.push(FunctionRange { start, end, raw: &sym.name }),
        }
    }
    out
}

/// Ranges of the kernel (offsets from `_text`) or of one module (offsets from its base).
fn kernel_ranges(snap: &KallsymsSnapshot, module: Option<(u32, u64)>) -> Vec<FunctionRange<'_>> {
    let base = module.map_or(snap.text_base, |m| m.1);
    let module = module.map(|m| m.0);
    let limit = module.and_then(|m| snap.modules.get(m as usize)).map(|m| m.base + m.size);
    let syms: Vec<_> =
        snap.symbols.iter().filter(|s| s.module == module && s.addr >= base).collect();
    let mut out: Vec<FunctionRange<'_>> = Vec::new();
    for (i, s) in syms.iter().enumerate() {
        // Several symbols at one address: the first (canonical order) names it, as in lookup.
        if i > 0 && syms[i - 1].addr == s.addr {
            continue;
        }
        let next = syms[i + 1..].iter().find(|n| n.addr > s.addr).map(|n| n.addr);
        let end = next.or(limit).unwrap_or(u64::MAX);
        out.push(FunctionRange {
            start: s.addr - base,
            end: end.saturating_sub(base),
            raw: &s.name,
        });
    }
    out
}

/// An ELF offset's name: its symbol, with `inlines` the innermost inlined function, with
/// `lines` its `file:line`; a section outside `.text` (`[.plt]`) or the unsymbolized label
/// when no symbol covers it.
fn elf_symbolize(s: &ElfSymbolizer, off: u64, mode: SymbolMode, label: &str) -> Symbolized {
    let Some(vaddr) = s.offset_to_vaddr(off) else {
        return Symbolized::plain(unsymbolized(label, off));
    };
    let sym = s.symbol(vaddr);
    let frame = if mode.lines || mode.inlines { s.frame(vaddr) } else { None };
    // A section name says something only outside .text (e.g. [.plt]); inside .text, or in a
    // stripped binary, the offset is what the user can take to objdump or addr2line.
    let mut name = match sym {
        Some(x) => display_name(&x.name, mode.raw_names),
        None => match s.section_name(vaddr) {
            Some(sec) if sec != ".text" && s.symbol_count() > 0 => format!("[{sec}]"),
            _ => unsymbolized(label, off),
        },
    };
    if mode.inlines {
        if let Some(f) = frame.as_ref().and_then(|f| f.function.as_deref()) {
            name = display_name(f, mode.raw_names);
        }
    }
    let source = mode.lines.then(|| match &frame {
        Some(f) => format!("{}:{}", f.file.as_deref().unwrap_or("??"), f.line.unwrap_or(0)),
        None => "??:0".to_owned(),
    });
    Symbolized {
        name,
        raw: sym.map(|x| x.name.clone()),
        offset_in_function: sym.map(|x| vaddr - x.start),
        source,
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::symbolize::{Segment, Sym, SymbolTable};

    fn jit(entries: &[(u64, u64, &str)]) -> JitTable {
        JitTable::new(
            entries
                .iter()
                .map(|&(start, size, name)| JitSymbol { start, size, name: name.into() })
                .collect(),
        )
    }

    /// The scan the three copies did before: the first entry in stored order that covers it.
    fn linear(t: &JitTable, off: u64) -> Option<&str> {
        t.symbols()
            .iter()
            .find(|s| off >= s.start && off - s.start < s.size.max(1))
            .map(|s| s.name.as_str())
    }

    fn name_at(t: &JitTable, off: u64) -> Option<&str> {
        t.lookup(off).map(|s| s.name.as_str())
    }

    #[test]
    fn jit_binary_search_at_first_last_symbol_and_in_gaps() {
        let t = jit(&[(0x3000, 0x100, "c"), (0x1000, 0x100, "a"), (0x2000, 0x10, "b")]);
        assert_eq!(name_at(&t, 0x1000), Some("a"), "first byte of the first symbol");
        assert_eq!(name_at(&t, 0x10ff), Some("a"), "last byte of the first symbol");
        assert_eq!(name_at(&t, 0x0fff), None, "before the first symbol");
        assert_eq!(name_at(&t, 0x1100), None, "gap after a symbol");
        assert_eq!(name_at(&t, 0x1fff), None, "gap before a symbol");
        assert_eq!(name_at(&t, 0x200f), Some("b"));
        assert_eq!(name_at(&t, 0x2010), None);
        assert_eq!(name_at(&t, 0x3000), Some("c"), "first byte of the last symbol");
        assert_eq!(name_at(&t, 0x30ff), Some("c"), "last byte of the last symbol");
        assert_eq!(name_at(&t, 0x3100), None, "after the last symbol");
        assert_eq!(name_at(&t, u64::MAX), None);
    }

    #[test]
    fn jit_overlapping_entries_answer_as_the_first_listed_and_edges_hold() {
        // A recompiled function listed again over an older one, a zero-sized entry (covers its
        // start) and one reaching the top of the address space.
        let t = jit(&[
            (0x1000, 0x100, "old"),
            (0x1080, 0x100, "new"),
            (0x0f00, 0x400, "outer"),
            (0x5000, 0, "zero"),
            (u64::MAX - 0xf, 0x100, "top"),
        ]);
        assert_eq!(name_at(&t, 0x0f00), Some("outer"));
        assert_eq!(name_at(&t, 0x1000), Some("old"));
        assert_eq!(name_at(&t, 0x1090), Some("old"), "both cover it: the first listed");
        assert_eq!(name_at(&t, 0x1100), Some("new"));
        assert_eq!(name_at(&t, 0x1180), Some("outer"));
        assert_eq!(name_at(&t, 0x1300), None);
        assert_eq!(name_at(&t, 0x5000), Some("zero"));
        assert_eq!(name_at(&t, 0x5001), None);
        assert_eq!(name_at(&t, u64::MAX), Some("top"));
        assert!(jit(&[]).is_empty());
        assert_eq!(name_at(&jit(&[]), 0), None, "empty table");
        assert_eq!(name_at(&jit(&[]), u64::MAX), None, "empty table");
    }

    #[test]
    fn jit_binary_search_agrees_with_the_linear_scan() {
        // A deterministic generator: many small overlapping tables, every offset around them.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for _ in 0..300 {
            let n = next(8) as usize;
            let entries: Vec<(u64, u64, String)> =
                (0..n).map(|i| (next(64), next(24), format!("f{i}"))).collect();
            let refs: Vec<(u64, u64, &str)> =
                entries.iter().map(|(a, b, c)| (*a, *b, c.as_str())).collect();
            let t = jit(&refs);
            for off in 0..100 {
                assert_eq!(name_at(&t, off), linear(&t, off), "{refs:?} at {off}");
            }
        }
    }

    fn elf_source(kind: fn(ElfState) -> Source) -> Source {
        let mut t = SymbolTable::default();
        t.segments = vec![Segment { offset: 0x1000, filesz: 0x1000, vaddr: 0x401000 }];
        t.symbols = vec![
            Sym { start: 0x401000, size: 0x10, name: "_ZN3foo3barEv".into() },
            Sym { start: 0x401100, size: 0x20, name: "plain\u{1b}".into() },
        ];
        kind(ElfState::Ready(Box::new(ElfSymbolizer::from_table(t, None, None)), None))
    }

    #[test]
    fn elf_and_vdso_offsets_are_named_by_symbol_and_otherwise_by_label() {
        let mode = SymbolMode::default();
        for src in [elf_source(Source::Elf), elf_source(Source::Vdso)] {
            let n = src.symbolize(0x1004, mode, "app");
            assert_eq!(n.name, "foo::bar()");
            assert_eq!(n.raw.as_deref(), Some("_ZN3foo3barEv"));
            assert_eq!(n.offset_in_function, Some(4));
            assert_eq!(n.with_offset().as_deref(), Some("foo::bar()+0x4"));
            let raw = SymbolMode { raw_names: true, ..mode };
            assert_eq!(src.symbolize(0x1000, raw, "app").name, "_ZN3foo3barEv");
            assert_eq!(src.symbolize(0x1100, mode, "app").name, "plain\\u{1b}", "escaped");
            // No symbol (no sections either): the offset's page; outside every segment too.
            assert_eq!(src.symbolize(0x1234, mode, "app").name, "app+0x1000");
            assert_eq!(src.symbolize(0x1234, mode, "app").with_offset(), None);
            assert_eq!(src.symbolize(0x9234, mode, "app").name, "app+0x9000");
            let lines = SymbolMode { lines: true, ..mode };
            assert_eq!(src.symbolize(0x1004, lines, "app").source.as_deref(), Some("??:0"));
            assert_eq!(src.function(0x1008).map(|f| (f.raw, f.offset)), Some(("_ZN3foo3barEv", 8)));
        }
        let mode = SymbolMode::default();
        assert_eq!(
            Source::Elf(ElfState::Mismatch).symbolize(5, mode, "a").name,
            "[build-id mismatch]"
        );
        assert_eq!(Source::Elf(ElfState::Missing).symbolize(0x1234, mode, "a").name, "a+0x1000");
        assert_eq!(
            Source::Vdso(ElfState::Missing).symbolize(0x1234, mode, "[vdso]").name,
            "[vdso]+0x1234"
        );
        assert_eq!(Source::Elf(ElfState::Missing).function(0), None);
    }

    fn snapshot() -> Rc<KallsymsSnapshot> {
        let kallsyms = "\
ffffffff81000000 T _text
ffffffff81000100 T do_work
ffffffff81000200 T _RNvCs1234_7mycrate4main
ffffffffc0000000 t mod_fn\t[mymod]
";
        let modules = "mymod 4096 0 - Live 0xffffffffc0000000\n";
        let ids = |m: &str| (m == "mymod").then(|| vec![7u8]);
        Rc::new(
            KallsymsSnapshot::from_proc_text(kallsyms, modules, "r".into(), Some(vec![1]), &ids)
                .expect("snapshot"),
        )
    }

    #[test]
    fn kernel_and_module_offsets_are_named_from_the_snapshot_of_the_same_build() {
        let mode = SymbolMode::default();
        let dir = Path::new("/db/h/e");
        let mut warnings = Vec::new();
        let id = ImageId::BuildId(vec![1]);
        let k = Source::Kernel(Kallsyms::new(Some(snapshot()), None, &id, "[k]", dir, &mut |w| {
            warnings.push(w)
        }));
        let n = k.symbolize(0x108, mode, "[kernel.kallsyms]");
        assert_eq!((n.name.as_str(), n.offset_in_function), ("do_work", Some(8)));
        assert_eq!(k.symbolize(0x200, mode, "[k]").name, "mycrate::main", "demangled");
        let mid = ImageId::BuildId(vec![7]);
        let m = Source::Module(Kallsyms::new(
            Some(snapshot()),
            Some("[mymod]"),
            &mid,
            "[mymod]",
            dir,
            &mut |w| warnings.push(w),
        ));
        assert_eq!(m.symbolize(0x10, mode, "[mymod]").name, "mod_fn");
        assert!(warnings.is_empty(), "{warnings:?}");
        // Another build: nothing is named, and the warning says why.
        let other = ImageId::BuildId(vec![2]);
        let k =
            Source::Kernel(Kallsyms::new(Some(snapshot()), None, &other, "[k]", dir, &mut |w| {
                warnings.push(w)
            }));
        assert_eq!(k.symbolize(0x108, mode, "[k]").name, "[build-id mismatch]");
        assert_eq!(k.function(0x108), None);
        let m = Source::Module(Kallsyms::new(
            Some(snapshot()),
            Some("gone"),
            &mid,
            "[gone]",
            dir,
            &mut |w| warnings.push(w),
        ));
        assert_eq!(m.symbolize(0x1010, mode, "[gone]").name, "[gone]+0x1000");
        let none =
            Source::Kernel(Kallsyms::new(None, None, &id, "[k]", dir, &mut |w| warnings.push(w)));
        assert_eq!(none.symbolize(0x108, mode, "[k]").name, "[k]+0x0");
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("has build-id 01, the profile 02"), "{}", warnings[0]);
        assert!(
            warnings[1].contains("module gone not in the kallsyms snapshot"),
            "{}",
            warnings[1]
        );
    }

    #[test]
    fn ranges_cover_what_function_names() {
        let elf = elf_source(Source::Elf);
        let r: Vec<(u64, u64, &str)> =
            elf.ranges().expect("elf").iter().map(|r| (r.start, r.end, r.raw)).collect();
        assert_eq!(r, [(0x1000, 0x1010, "_ZN3foo3barEv"), (0x1100, 0x1120, "plain\u{1b}")]);
        for (start, end, raw) in r {
            assert_eq!(elf.function(start).map(|f| f.raw), Some(raw));
            assert_eq!(elf.function(end - 1).map(|f| f.raw), Some(raw));
        }
        assert_eq!(Source::Elf(ElfState::Missing).ranges(), None);
        let dir = Path::new("/db/h/e");
        let id = ImageId::BuildId(vec![1]);
        let k = Source::Kernel(Kallsyms::new(Some(snapshot()), None, &id, "[k]", dir, &mut |_| {}));
        let r: Vec<(u64, u64, &str)> =
            k.ranges().expect("kernel").iter().map(|r| (r.start, r.end, r.raw)).collect();
        assert_eq!(r[1], (0x100, 0x200, "do_work"), "{r:?}");
        assert_eq!((r[2].0, r[2].2), (0x200, "_RNvCs1234_7mycrate4main"), "{r:?}");
        assert_eq!(k.function(0x1ff).map(|f| f.raw), Some("do_work"));
        assert_eq!(k.function(0x200).map(|f| f.raw), Some(r[2].2));
        let other = ImageId::BuildId(vec![2]);
        let k =
            Source::Kernel(Kallsyms::new(Some(snapshot()), None, &other, "[k]", dir, &mut |_| {}));
        assert_eq!(k.ranges(), None, "another build names nothing");
    }

    #[test]
    fn jit_and_unknown_offsets() {
        let mode = SymbolMode::default();
        let j = Source::Jit(jit(&[(0x1000, 0x100, "_ZN3foo3barEv")]));
        let n = j.symbolize(0x1010, mode, "[anon]");
        assert_eq!((n.name.as_str(), n.offset_in_function), ("foo::bar()", Some(0x10)));
        assert_eq!(j.symbolize(0x2345, mode, "[anon]").name, "[anon]+0x2000");
        let code = UnknownReason::ProcessGone as u64;
        assert_eq!(Source::Unknown.symbolize(code, mode, "x").name, "[unknown: process-gone]");
        assert_eq!(
            Source::Unknown.symbolize(u64::MAX, mode, "x").name,
            format!("[unknown: code {}]", u64::MAX)
        );
        assert_eq!(Source::Unknown.function(0), None);
    }
}
