//! One function's listing: find it in the image, read its code, spread the samples over its
//! instructions and source lines.

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::rc::Rc;

use profile_format::ImageKind;
use serde::Serialize;

use super::cli::{Args, ListError, Mode, SKID_NOTE};
use super::disasm::{self, Insn};
use dcpi_report::debuginfo::live_vdso;
use dcpi_report::escape::controls;
use dcpi_report::image::{build_id_hex, display_path, image_display, kind_name};
use dcpi_report::names::display_name;
use dcpi_report::report::{
    self, ElfRequest, ElfState, EventCount, EventInfo, ImageFilter, ImageInfo, Scope, SymbolMode,
    Weights,
};
use dcpi_report::select::Loaded;
use dcpi_report::symbolize::{demangle, Frame};
use dcpi_report::symbolizer::{JitTable, Kallsyms, Source};

/// Functions larger than this are refused (a corrupt symbol size would read the whole file).
const MAX_FUNCTION_BYTES: u64 = 16 << 20;

/// An instruction row.
#[derive(Clone, Debug, Serialize)]
pub struct AsmRow {
    pub offset: u64,
    pub address: Option<u64>,
    pub bytes: Option<String>,
    pub instruction: String,
    pub source: Option<String>,
    pub block_start: bool,
    pub label: Option<String>,
    pub branch_target: Option<u64>,
    pub target_label: Option<String>,
    pub call_target: Option<String>,
    pub samples: u64,
    pub percent: f64,
    pub cpi: Option<f64>,
    pub events: Vec<EventCount>,
}

/// A source line row.
#[derive(Clone, Debug, Serialize)]
pub struct SourceRow {
    pub source: Option<String>,
    pub file: Option<String>,
    pub line: Option<u32>,
    pub text: Option<String>,
    pub samples: u64,
    pub percent: f64,
    pub cpi: Option<f64>,
    pub events: Vec<EventCount>,
}

/// Rows left out by `--min-percent` (cold code between hot spots).
#[derive(Clone, Debug, Serialize)]
pub struct GapRow {
    pub skipped: usize,
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Row {
    Asm(AsmRow),
    Source(SourceRow),
    Gap(GapRow),
}

impl Row {
    fn percent(&self) -> f64 {
        match self {
            Self::Asm(a) => a.percent,
            Self::Source(s) => s.percent,
            Self::Gap(_) => 0.0,
        }
    }
}

/// `--min-percent`: the rows at or above `min` percent of the function, with `context` rows
/// before and after each (as `perf annotate` shows the hot part of a big function, and `grep
/// -C` its matches); each run of rows left out becomes one [`GapRow`]. A 17 000-instruction
/// function is then a screen, not 19 000 lines.
pub(crate) fn hot_only(rows: Vec<Row>, min: f64, context: usize) -> Vec<Row> {
    let n = rows.len();
    let mut keep = vec![false; n];
    for (i, r) in rows.iter().enumerate() {
        if r.percent() >= min && r.percent() > 0.0 {
            for k in keep.iter_mut().take((i + context + 1).min(n)).skip(i.saturating_sub(context))
            {
                *k = true;
            }
        }
    }
    let mut out = Vec::new();
    let mut skipped = 0;
    for (r, k) in rows.into_iter().zip(keep) {
        if k {
            if skipped > 0 {
                out.push(Row::Gap(GapRow { skipped }));
                skipped = 0;
            }
            out.push(r);
        } else {
            skipped += 1;
        }
    }
    if skipped > 0 {
        out.push(Row::Gap(GapRow { skipped }));
    }
    out
}

/// A whole listing (`--format json` writes it as it is).
#[derive(Clone, Debug, Serialize)]
pub struct Listing {
    pub report: &'static str,
    #[serde(flatten)]
    pub scope: Scope,
    pub image: String,
    pub kind: &'static str,
    pub build_id: Option<String>,
    pub binary: Option<String>,
    pub symbol: String,
    pub mode: &'static str,
    pub start_offset: u64,
    pub size: u64,
    pub instructions: usize,
    pub code: bool,
    pub skid_note: &'static str,
    pub events: Vec<EventInfo>,
    pub total_samples: u64,
    pub image_samples: u64,
    pub rows: Vec<Row>,
    /// Whether a CPI column is shown (cycles and instructions both present).
    #[serde(skip)]
    pub cpi: bool,
    /// Why there is no code, for the table header.
    #[serde(skip)]
    pub no_code_reason: Option<String>,
}

/// Per-event samples and weighted events.
#[derive(Clone, Debug)]
pub(crate) struct Counts {
    pub samples: Vec<u64>,
    pub events: Vec<f64>,
}

impl Counts {
    pub(crate) fn new(n: usize) -> Self {
        Self { samples: vec![0; n], events: vec![0.0; n] }
    }
    pub(crate) fn add(&mut self, ei: usize, c: u64, w: f64) {
        self.samples[ei] += c;
        self.events[ei] += c as f64 * w;
    }
    pub(crate) fn merge(&mut self, o: &Self) {
        for (a, b) in self.samples.iter_mut().zip(&o.samples) {
            *a += b;
        }
        for (a, b) in self.events.iter_mut().zip(&o.events) {
            *a += b;
        }
    }
    pub(crate) fn is_zero(&self) -> bool {
        self.samples.iter().all(|&s| s == 0)
    }
}

pub(crate) fn pct(part: f64, total: f64) -> f64 {
    if total > 0.0 {
        (part / total * 1e6).round() / 1e4
    } else {
        0.0
    }
}

/// Per-event numbers of a row, percents of `totals`.
pub(crate) fn event_counts(c: &Counts, names: &[String], totals: &[f64]) -> Vec<EventCount> {
    names
        .iter()
        .enumerate()
        .map(|(i, n)| EventCount {
            event: n.clone(),
            samples: c.samples[i],
            events: c.events[i].round() as u64,
            percent: pct(c.events[i], totals[i]),
        })
        .collect()
}

/// Column indices of the cycles and instructions events, when both are selected.
pub(crate) fn cpi_events(names: &[String]) -> Option<(usize, usize)> {
    let cyc = names.iter().position(|n| n == "cycles" || n == "cpu-cycles")?;
    let ins = names.iter().position(|n| n == "instructions")?;
    Some((cyc, ins))
}

fn cpi_of(c: &Counts, ci: Option<(usize, usize)>) -> Option<f64> {
    let (cyc, ins) = ci?;
    (c.events[ins] > 0.0).then(|| (c.events[cyc] / c.events[ins] * 100.0).round() / 100.0)
}

/// The function being listed, wherever its code comes from.
struct Func {
    name: String,
    /// Profile offset of its first byte.
    start_off: u64,
    size: u64,
    /// Virtual address of its first byte, when it has one (for disassembly and DWARF).
    addr: Option<u64>,
    code: Result<Vec<u8>, String>,
    binary: Option<String>,
}

/// Build the listing `args` asks for.
pub fn run(args: &Args, warnings: &mut Vec<String>) -> Result<Listing, ListError> {
    let spec = args.image.as_deref().unwrap_or_default();
    let sym_spec = args.symbol.as_deref().unwrap_or_default();
    let filter = ImageFilter::new(spec);
    let loaded = super::load::load_for(args, Some(&filter), warnings)?;
    let weights = report::weights(&loaded, &args.sel.events)?;
    let idx = report::resolve_image(&loaded, &weights, spec)?;
    let first = &loaded.profiles[idx[0]];
    let kind = first.profile.header.kind;
    let mut info = ImageInfo {
        build_id: build_id_hex(&first.profile.header.image_id),
        ..ImageInfo::new(image_display(&first.profile.header), kind_name(kind))
    };
    let mode = args.mode();
    let mut frames: Option<Source> = None;
    let mut cache_entry = None;
    let mut locator = args.names.symbols.locator(&args.sel.db);
    let mut cache = args.names.symbols.cache(&mut |w| warnings.push(w));
    let func = match kind {
        ImageKind::Elf | ImageKind::Vdso => {
            let id = first.profile.header.image_id.clone();
            let mut recorded: Vec<Vec<u8>> = Vec::new();
            for &i in &idx {
                let p = &loaded.profiles[i].profile.header.image_path;
                if !recorded.contains(p) {
                    recorded.push(p.clone());
                }
            }
            let want = SymbolMode { lines: true, inlines: false, raw_names: false };
            let r = ElfRequest { id: &id, recorded: &recorded, mode: want };
            let src = report::elf_source(kind, &mut locator, &mut cache, &r, &mut info, &mut |w| {
                warnings.push(w)
            });
            match &src {
                Source::Elf(ElfState::Ready(_, e)) | Source::Vdso(ElfState::Ready(_, e)) => {
                    cache_entry = *e;
                }
                Source::Elf(ElfState::Mismatch) => {
                    return Err(ListError::Data(format!(
                        "{}: only another build of this binary was found (build-id mismatch); \
                         supply the profiled build with --binary-path DIR or --cache-dir DIR",
                        info.path
                    )))
                }
                _ => {
                    return Err(ListError::Data(format!(
                        "{}: binary not found or without symbols; supply it with --binary-path \
                         DIR or --cache-dir DIR (or its debug file with --debug-dir DIR)",
                        info.path
                    )))
                }
            };
            let f = elf_func(&src, &loaded, &weights, &idx, sym_spec, &info, mode)?;
            frames = Some(src);
            f
        }
        ImageKind::Anon => jit_func(&loaded, &weights, &idx, sym_spec, &info.path)?,
        ImageKind::Kernel | ImageKind::KernelModule => {
            kernel_func(args, &loaded, &weights, &idx, sym_spec, &info.path, warnings)?
        }
        ImageKind::Unknown => {
            return Err(ListError::Data(
                "samples of [unknown] have no code to list; pick an image with --image".into(),
            ))
        }
    };
    if let Some(b) = &func.binary {
        info.binary = Some(b.clone());
    }
    // Samples of the function (and the image total for the header).
    let n = weights.events.len();
    let end_off = func.start_off.saturating_add(func.size);
    let mut per_off: BTreeMap<u64, Counts> = BTreeMap::new();
    let mut image_samples = 0u64;
    for &i in &idx {
        let Some((ei, w)) = weights.per_profile[i] else { continue };
        let p = &loaded.profiles[i];
        if ei == 0 {
            image_samples += p.samples;
        }
        for (&off, &c) in p.profile.counts.range(func.start_off..end_off) {
            per_off.entry(off).or_insert_with(|| Counts::new(n)).add(ei, c, w);
        }
    }
    // Instructions: decoded, or (no code bytes) one pseudo-instruction per sampled offset.
    let (insns, no_code_reason) = match (&func.code, func.addr) {
        (Ok(code), Some(addr)) => (disasm::decode(code, addr, args.syntax), None),
        (Err(why), _) => (Vec::new(), Some(why.clone())),
        (Ok(_), None) => (Vec::new(), Some("no address to decode at".to_owned())),
    };
    let has_code = no_code_reason.is_none();
    if !has_code && mode != Mode::Asm && kind != ImageKind::Anon {
        if let Some(why) = &no_code_reason {
            warnings.push(format!("{why}; listing samples by offset"));
        }
    }
    struct Item {
        off: u64,
        insn: Option<Insn>,
        counts: Counts,
        frame: Option<Frame>,
    }
    let mut items: Vec<Item> = if has_code {
        let base = func.addr.unwrap_or(0);
        insns
            .into_iter()
            .map(|x| Item {
                off: func.start_off + (x.addr - base),
                insn: Some(x),
                counts: Counts::new(n),
                frame: None,
            })
            .collect()
    } else {
        per_off
            .keys()
            .map(|&off| Item { off, insn: None, counts: Counts::new(n), frame: None })
            .collect()
    };
    for (off, c) in &per_off {
        let at = items.partition_point(|it| it.off <= *off);
        if let Some(it) = at.checked_sub(1).and_then(|i| items.get_mut(i)) {
            it.counts.merge(c);
        }
    }
    if let (Some(s), Some(base)) = (frames.as_ref().and_then(Source::elf), func.addr) {
        for it in &mut items {
            it.frame = s.frame(base + (it.off - func.start_off));
        }
        if let Some(e) = cache_entry {
            cache.put_frames(e, &s.take_fresh_frames(), &mut |w| warnings.push(w));
        }
    }
    let mut totals_c = Counts::new(n);
    for it in &items {
        totals_c.merge(&it.counts);
    }
    let totals = totals_c.events.clone();
    let ci = cpi_events(&weights.events);
    let source_of = |f: &Option<Frame>| {
        f.as_ref().and_then(|f| {
            f.file
                .as_ref()
                .map(|file| format!("{}:{}", controls(file).into_owned(), f.line.unwrap_or(0)))
        })
    };
    let labels = disasm::labels(&items.iter().filter_map(|i| i.insn.clone()).collect::<Vec<_>>());
    let base = func.addr.unwrap_or(0);
    let demangled: std::cell::RefCell<HashMap<u64, String>> = Default::default();
    let name_at = |a: u64| -> Option<String> {
        let s = frames.as_ref()?.elf()?;
        let sym = s.symbol(a)?;
        let name = demangled
            .borrow_mut()
            .entry(sym.start)
            .or_insert_with(|| controls(&demangle(&sym.name)).into_owned())
            .clone();
        Some(if a == sym.start { name } else { format!("{name}+{:#x}", a - sym.start) })
    };
    let asm_row = |it: &Item| -> AsmRow {
        let ev = event_counts(&it.counts, &weights.events, &totals);
        let (text, addr, bytes, block, target, is_call) = match &it.insn {
            Some(x) => {
                let o = (x.addr - base) as usize;
                let b = func.code.as_ref().ok().and_then(|c| c.get(o..o + x.len)).map(hex::encode);
                (x.text.clone(), Some(x.addr), b, x.block_start, x.target, x.is_call)
            }
            None => ("(no code bytes)".to_owned(), None, None, false, None, false),
        };
        let inside = |t: u64| t >= base && t < base + func.size;
        AsmRow {
            offset: it.off,
            address: addr,
            bytes,
            instruction: text,
            source: source_of(&it.frame),
            block_start: block,
            label: addr.and_then(|a| labels.get(&a).cloned()),
            branch_target: target
                .filter(|&t| !is_call && inside(t))
                .map(|t| func.start_off + (t - base)),
            target_label: target.filter(|_| !is_call).and_then(|t| labels.get(&t).cloned()),
            call_target: target.filter(|&t| is_call || !inside(t)).and_then(name_at),
            samples: it.counts.samples[0],
            percent: ev[0].percent,
            cpi: cpi_of(&it.counts, ci),
            events: ev,
        }
    };
    // Source lines: key (file, line), in file and line order.
    type LineKey = (Option<String>, Option<u32>);
    let key_of = |f: &Option<Frame>| -> LineKey {
        match f {
            Some(f) => (f.file.clone(), f.line),
            None => (None, None),
        }
    };
    let mut lines: BTreeMap<LineKey, Counts> = BTreeMap::new();
    if mode != Mode::Asm {
        for it in &items {
            lines.entry(key_of(&it.frame)).or_insert_with(|| Counts::new(n)).merge(&it.counts);
        }
    }
    let mut texts = SourceTexts::default();
    let mut source_row = |k: &LineKey, c: &Counts| -> SourceRow {
        let ev = event_counts(c, &weights.events, &totals);
        SourceRow {
            source: k
                .0
                .as_ref()
                .map(|f| format!("{}:{}", controls(f).into_owned(), k.1.unwrap_or(0))),
            file: k.0.as_deref().map(|f| controls(f).into_owned()),
            line: k.1,
            text: match k {
                (Some(f), Some(l)) => texts.line(f, *l),
                _ => None,
            },
            samples: c.samples[0],
            percent: ev[0].percent,
            cpi: cpi_of(c, ci),
            events: ev,
        }
    };
    let rows: Vec<Row> = match mode {
        Mode::Asm => items.iter().map(|it| Row::Asm(asm_row(it))).collect(),
        Mode::Source => lines.iter().map(|(k, c)| Row::Source(source_row(k, c))).collect(),
        Mode::Both => {
            let mut v = Vec::with_capacity(items.len() * 2);
            let mut prev: Option<LineKey> = None;
            for it in &items {
                let k = key_of(&it.frame);
                if prev.as_ref() != Some(&k) {
                    if let Some(c) = lines.get(&k) {
                        v.push(Row::Source(source_row(&k, c)));
                    }
                    prev = Some(k);
                }
                v.push(Row::Asm(asm_row(it)));
            }
            v
        }
    };
    let rows = match args.min_percent {
        Some(min) => hot_only(rows, min, args.context),
        None => rows,
    };
    let mut events = weights.infos.clone();
    for (i, e) in events.iter_mut().enumerate() {
        e.samples = totals_c.samples[i];
        e.events = totals_c.events[i].round() as u64;
    }
    Ok(Listing {
        report: "listing",
        scope: report::scope(&loaded, &args.sel.db.display().to_string()),
        image: info.path,
        kind: info.kind,
        build_id: info.build_id,
        binary: info.binary,
        symbol: controls(&func.name).into_owned(),
        mode: mode.name(),
        start_offset: func.start_off,
        size: func.size,
        instructions: if has_code { items.len() } else { 0 },
        code: has_code,
        skid_note: SKID_NOTE,
        total_samples: totals_c.samples[0],
        image_samples,
        events,
        rows,
        cpi: ci.is_some(),
        no_code_reason,
    })
}

/// Source files read for their text, each once.
#[derive(Default)]
struct SourceTexts {
    files: HashMap<String, Option<Vec<String>>>,
}

impl SourceTexts {
    fn line(&mut self, file: &str, line: u32) -> Option<String> {
        let lines = self.files.entry(file.to_owned()).or_insert_with(|| {
            let bytes = std::fs::read(file).ok()?;
            Some(String::from_utf8_lossy(&bytes).lines().map(expand_tabs).collect())
        });
        let l = lines.as_ref()?.get((line as usize).checked_sub(1)?)?;
        Some(controls(l.trim_end()).into_owned())
    }
}

fn expand_tabs(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\t' {
            let pad = 8 - out.chars().count() % 8;
            out.extend(std::iter::repeat_n(' ', pad));
        } else {
            out.push(c);
        }
    }
    out
}

/// Does a symbol's raw name match `--symbol`? Mangled, demangled, or demangled without the
/// parameter list.
pub(crate) fn name_matches(raw: &str, spec: &str) -> bool {
    if raw == spec {
        return true;
    }
    let d = demangle(raw);
    d == spec || d.split_once('(').is_some_and(|(head, _)| head == spec)
}

/// The last identifier of a (demangled) name: `b` of `a::b(int)`; it appears verbatim in any
/// Itanium or Rust mangling of the name.
fn last_identifier(spec: &str) -> String {
    let head = spec.split_once('(').map_or(spec, |(h, _)| h);
    // Drop template arguments (which may contain `::` themselves).
    let mut plain = String::with_capacity(head.len());
    let mut depth = 0usize;
    for c in head.chars() {
        match c {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            _ if depth == 0 => plain.push(c),
            _ => {}
        }
    }
    let last = plain.rsplit("::").next().unwrap_or(&plain).trim();
    if last.is_empty() {
        spec.to_owned()
    } else {
        last.to_owned()
    }
}

fn parse_offset(spec: &str) -> Option<u64> {
    u64::from_str_radix(spec.strip_prefix("0x")?, 16).ok()
}

fn elf_func(
    src: &Source,
    loaded: &Loaded,
    w: &Weights,
    idx: &[usize],
    spec: &str,
    info: &ImageInfo,
    mode: Mode,
) -> Result<Func, ListError> {
    let Some(s) = src.elf() else {
        return Err(ListError::Data(format!("{}: no symbols were loaded", info.path)));
    };
    let syms = &s.table().symbols;
    let chosen = match parse_offset(spec) {
        Some(off) => s.offset_to_vaddr(off).and_then(|a| s.symbol(a)).cloned(),
        None => {
            // Demangling every symbol of a large C++ binary costs more than the listing
            // itself: an exact (mangled or C) name decides alone, and a demangled name is
            // only tried on symbols whose mangled form contains its last identifier.
            let exact: Vec<_> = syms.iter().filter(|x| x.name == spec).collect();
            let m: Vec<_> = if exact.is_empty() {
                let ident = last_identifier(spec);
                let m: Vec<_> = syms
                    .iter()
                    .filter(|x| x.name.contains(ident.as_str()) && name_matches(&x.name, spec))
                    .collect();
                if m.is_empty() {
                    // Operators and other names whose mangling spells no identifier.
                    syms.iter().filter(|x| name_matches(&x.name, spec)).collect()
                } else {
                    m
                }
            } else {
                exact
            };
            if m.len() > 1 {
                return Err(ListError::Ambiguous {
                    spec: spec.to_owned(),
                    image: info.path.clone(),
                    candidates: m
                        .iter()
                        .map(|x| {
                            let off = s.vaddr_to_offset(x.start).unwrap_or(0);
                            format!(
                                "{} ({}) at offset {off:#x}: --symbol {off:#x}",
                                controls(&demangle(&x.name)).into_owned(),
                                controls(&x.name).into_owned()
                            )
                        })
                        .collect(),
                });
            }
            m.first().map(|x| (*x).clone())
        }
    };
    let Some(sym) = chosen else {
        return Err(not_found(spec, &info.path, hottest(src, loaded, w, idx)));
    };
    let end = s.symbol_end(&sym);
    let size = end.saturating_sub(sym.start);
    let start_off = s.vaddr_to_offset(sym.start).ok_or_else(|| {
        ListError::Data(format!(
            "{}: symbol {} at {:#x} is not in a loaded segment of the file",
            info.path,
            controls(&sym.name).into_owned(),
            sym.start
        ))
    })?;
    if size > MAX_FUNCTION_BYTES {
        return Err(ListError::Data(format!(
            "{}: symbol {} claims {size} bytes (more than {MAX_FUNCTION_BYTES}); not listing",
            info.path,
            controls(&sym.name).into_owned()
        )));
    }
    let binary = s.binary_path().map(Path::to_owned);
    let code = match &binary {
        Some(p) => match read_code(p, start_off, size) {
            Ok(c) => Ok(c),
            Err(CodeError::Arch(m)) if mode != Mode::Source => return Err(ListError::Data(m)),
            Err(CodeError::Arch(m) | CodeError::Read(m)) => Err(m),
        },
        // The vDSO: the copy load_vdso accepted is this machine's when no file was found.
        None => live_vdso()
            .and_then(|d| {
                d.get(start_off as usize..(start_off + size) as usize).map(<[u8]>::to_vec)
            })
            .ok_or_else(|| "no copy of the vDSO's code".to_owned()),
    };
    Ok(Func {
        name: demangle(&sym.name),
        start_off,
        size,
        addr: Some(sym.start),
        code,
        binary: binary.map(|p| p.display().to_string()),
    })
}

/// Why an ELF function's code cannot be shown.
enum CodeError {
    /// Not x86-64: an error for --asm/--both (exit 2); --source still lists.
    Arch(String),
    Read(String),
}

/// Read `size` bytes at `off` of an x86-64 ELF file.
fn read_code(path: &Path, off: u64, size: u64) -> Result<Vec<u8>, CodeError> {
    read_code_inner(path, off, size).map_err(|(arch, m)| {
        if arch {
            CodeError::Arch(m)
        } else {
            CodeError::Read(m)
        }
    })
}

fn read_code_inner(path: &Path, off: u64, size: u64) -> Result<Vec<u8>, (bool, String)> {
    let mut f =
        std::fs::File::open(path).map_err(|e| (false, format!("{}: {e}", path.display())))?;
    {
        use object::Object;
        let cache = object::ReadCache::new(&mut f);
        let arch = object::File::parse(&cache)
            .map_err(|e| (false, format!("{}: {e}", path.display())))?
            .architecture();
        if arch != object::Architecture::X86_64 {
            return Err((
                true,
                format!(
                    "{}: disassembly of {arch:?} code is not supported (x86-64 only); --source \
                 lists the samples per source line",
                    path.display()
                ),
            ));
        }
    }
    let mut buf = vec![0u8; size as usize];
    f.seek(SeekFrom::Start(off)).and_then(|_| f.read_exact(&mut buf)).map_err(|e| {
        (false, format!("{}: reading {size} bytes at offset {off:#x}: {e}", path.display()))
    })?;
    Ok(buf)
}

fn not_found(spec: &str, image: &str, hot: Vec<String>) -> ListError {
    let hint = if hot.is_empty() {
        "no sampled symbol either".to_owned()
    } else {
        format!("hottest symbols: {}", hot.join(", "))
    };
    ListError::Data(format!("no function {spec:?} in {image}; {hint} (see dcpiprof --image)"))
}

/// Add the samples of profile `i` (first event only) to `by`, per function as the one
/// symbolizer names it (for "not found": the hottest functions).
fn count_hot(by: &mut HashMap<String, u64>, src: &Source, loaded: &Loaded, w: &Weights, i: usize) {
    if !matches!(w.per_profile[i], Some((0, _))) {
        return;
    }
    for (&off, &c) in &loaded.profiles[i].profile.counts {
        if let Some(f) = src.function(off) {
            *by.entry(display_name(f.raw, false)).or_default() += c;
        }
    }
}

/// The most sampled function names of an image (for "not found").
fn hottest(src: &Source, loaded: &Loaded, w: &Weights, idx: &[usize]) -> Vec<String> {
    let mut by: HashMap<String, u64> = HashMap::new();
    for &i in idx {
        count_hot(&mut by, src, loaded, w, i);
    }
    top_names(by)
}

fn top_names(by: HashMap<String, u64>) -> Vec<String> {
    let mut v: Vec<(u64, String)> = by.into_iter().map(|(k, c)| (c, k)).collect();
    v.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    v.into_iter().take(8).map(|(_, n)| n).collect()
}

/// A JIT function from the perf map stored with the profile: offsets are addresses.
fn jit_func(
    loaded: &Loaded,
    w: &Weights,
    idx: &[usize],
    spec: &str,
    image: &str,
) -> Result<Func, ListError> {
    let mut hot: HashMap<String, u64> = HashMap::new();
    for &i in idx {
        let h = &loaded.profiles[i].profile.header;
        if let Some(s) = h.jit_symbols.iter().find(|s| name_matches(&s.name, spec)) {
            return Ok(Func {
                name: demangle(&s.name),
                start_off: s.start,
                size: s.size.max(1),
                addr: None,
                code: Err("JIT code: the perf map names the function but no code bytes are kept"
                    .to_owned()),
                binary: None,
            });
        }
        let src = Source::Jit(JitTable::new(h.jit_symbols.clone()));
        count_hot(&mut hot, &src, loaded, w, i);
    }
    Err(not_found(spec, image, top_names(hot)))
}

/// A kernel or module function from the epoch's kallsyms snapshot; code from --vmlinux or
/// /proc/kcore.
fn kernel_func(
    args: &Args,
    loaded: &Loaded,
    w: &Weights,
    idx: &[usize],
    spec: &str,
    image: &str,
    warnings: &mut Vec<String>,
) -> Result<Func, ListError> {
    let first = &loaded.profiles[idx[0]];
    let snap = loaded.dirs[first.dir].read_kallsyms().map_err(|e| {
        ListError::Data(format!("{e}: kernel functions need the epoch's kallsyms snapshot"))
    })?;
    let module = if first.profile.header.kind == ImageKind::KernelModule {
        let name = display_path(&first.profile.header.image_path);
        let name = name.trim_start_matches('[').trim_end_matches(']').to_owned();
        let mi = snap.modules.iter().position(|m| m.name == name).ok_or_else(|| {
            ListError::Data(format!(
                "module {name} is not in the kallsyms snapshot of {}",
                loaded.dirs[first.dir].path.display()
            ))
        })?;
        Some((mi as u32, snap.modules[mi].base))
    } else {
        None
    };
    let module_idx = module.map(|m| m.0);
    let base = module.map_or(snap.text_base, |m| m.1);
    let in_scope: Vec<&profile_format::KernelSymbol> =
        snap.symbols.iter().filter(|s| s.module == module_idx).collect();
    let Some(pos) = in_scope.iter().position(|s| name_matches(&s.name, spec)) else {
        let h = &first.profile.header;
        let name = module.is_some().then(|| display_path(&h.image_path));
        let snap = Some(Rc::new(snap.clone()));
        let dir = &loaded.dirs[first.dir].path;
        let k = Kallsyms::new(snap, name.as_deref(), &h.image_id, image, dir, &mut |_| {});
        let src = if module.is_some() { Source::Module(k) } else { Source::Kernel(k) };
        return Err(not_found(spec, image, hottest(&src, loaded, w, idx)));
    };
    let sym = in_scope[pos];
    let end = in_scope[pos + 1..]
        .iter()
        .map(|s| s.addr)
        .find(|&a| a > sym.addr)
        .or_else(|| module.and_then(|(mi, b)| Some(b + snap.modules.get(mi as usize)?.size)))
        .unwrap_or(sym.addr + 1);
    let size = (end - sym.addr).min(MAX_FUNCTION_BYTES);
    let start_off = sym.addr - base;
    let code = if module.is_some() {
        Err("kernel module code is not read (no module file); listing samples by offset".into())
    } else {
        super::kernel::read_kernel_code(args.vmlinux.as_deref(), &snap, sym.addr, size, warnings)
    };
    Ok(Func {
        name: sym.name.clone(),
        start_off,
        size,
        addr: Some(sym.addr),
        code,
        binary: args.vmlinux.as_ref().map(|p| p.display().to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbol_names_match_mangled_demangled_and_without_parameters() {
        assert!(name_matches("_ZN3foo3barEi", "_ZN3foo3barEi"));
        assert!(name_matches("_ZN3foo3barEi", "foo::bar(int)"));
        assert!(name_matches("_ZN3foo3barEi", "foo::bar"));
        assert!(!name_matches("_ZN3foo3barEi", "foo::ba"));
        assert!(name_matches("work", "work"));
        assert!(!name_matches("worker", "work"));
        for spec in ["foo::bar(int)", "foo::bar", "bar", "ns::tmpl<int>::bar(long)"] {
            assert_eq!(last_identifier(spec), "bar", "{spec}");
        }
        // The prefilter never drops a symbol the full match would accept.
        assert!("_ZN3foo3barEi".contains(&last_identifier("foo::bar(int)")));
        assert_eq!(parse_offset("0x1a2b"), Some(0x1a2b));
        assert_eq!(parse_offset("work"), None);
    }

    fn asm(offset: u64, percent: f64) -> Row {
        Row::Asm(AsmRow {
            offset,
            address: None,
            bytes: None,
            instruction: "nop".into(),
            source: None,
            block_start: false,
            label: None,
            branch_target: None,
            target_label: None,
            call_target: None,
            samples: 0,
            percent,
            cpi: None,
            events: Vec::new(),
        })
    }

    /// Hot rows with their context; every run of cold rows is one gap with its length, and
    /// the rows shown plus the gaps add up to the function.
    #[test]
    fn hot_only_keeps_hot_rows_with_context_and_counts_the_gaps() {
        let mut pct = vec![0.0; 100];
        pct[10] = 40.0;
        pct[11] = 0.5;
        pct[60] = 30.0;
        pct[99] = 2.0;
        let rows: Vec<Row> = pct.iter().enumerate().map(|(i, &p)| asm(i as u64, p)).collect();
        let out = hot_only(rows, 1.0, 2);
        let shape: Vec<String> = out
            .iter()
            .map(|r| match r {
                Row::Asm(a) => a.offset.to_string(),
                Row::Gap(g) => format!("gap{}", g.skipped),
                Row::Source(_) => "src".into(),
            })
            .collect();
        assert_eq!(
            shape,
            [
                "gap8", "8", "9", "10", "11", "12", "gap45", "58", "59", "60", "61", "62", "gap34",
                "97", "98", "99"
            ]
        );
        let total: usize =
            out.iter().map(|r| if let Row::Gap(g) = r { g.skipped } else { 1 }).sum();
        assert_eq!(total, 100);
        // Nothing hot enough: one gap for the whole function.
        let rows: Vec<Row> = (0..5).map(|i| asm(i, 0.5)).collect();
        assert!(matches!(hot_only(rows, 1.0, 3).as_slice(), [Row::Gap(GapRow { skipped: 5 })]));
    }

    #[test]
    fn tabs_expand_to_eight_columns() {
        assert_eq!(expand_tabs("\tx"), "        x");
        assert_eq!(expand_tabs("ab\tc"), "ab      c");
    }
}
