//! Call stacks (dcpid `callchains = "fp"`; FORMAT.md §13): the `stacks.<event>.stk` files of
//! the selected host directories, symbolized frame by frame with the same symbolizer as the
//! per-symbol reports, for `--callers`, `--callees` and the stacks of the export formats.

use std::collections::{HashMap, HashSet};

use profile_format::{
    ImageId, ImageKind, JitSymbol, Profile, StackImage, StackProfile, UNKNOWN_COMMAND,
};
use serde::Serialize;

use super::output::TableFormat;
use crate::args::{Selection, SymbolSearch};
use dcpi_report::debuginfo::Locator;
use dcpi_report::error::ProfError;
use dcpi_report::escape;
use dcpi_report::image::display_path;
use dcpi_report::names::display_name;
use dcpi_report::render::CsvCell;
use dcpi_report::report::{self, SymbolMode, Weights};
use dcpi_report::select::Loaded;
use dcpi_report::symbolizer::{JitTable, Kallsyms, Snapshots, Source};
use dcpi_report::symcache::SymbolCache;

/// `--callers`/`--callees`.
#[derive(Clone, Debug)]
pub struct Calls {
    pub sel: Selection,
    pub symbol: String,
    pub direction: Direction,
    pub depth: usize,
    pub symbols: SymbolSearch,
    pub mode: SymbolMode,
    pub limit: Option<usize>,
    pub format: TableFormat,
    /// `--image`: only the function of that image (the others' functions of the same name
    /// are not it).
    pub image: Option<String>,
    /// `--command`: only the stacks of processes with that command.
    pub command: Option<String>,
}

/// One symbolized frame.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Frame {
    /// Image as reports name it (`/usr/bin/x`, `[kernel.kallsyms]`, `[unknown]`).
    pub image: String,
    pub kind: ImageKind,
    /// Identity of the image (none for `[unknown]`).
    pub image_id: Option<ImageId>,
    pub offset: u64,
    pub function: String,
}

/// One stack of one host directory and event, symbolized.
#[derive(Clone, Debug)]
pub struct SymStack {
    /// Index into [`Loaded::dirs`].
    pub dir: usize,
    /// Index into the report's events ([`Weights::infos`]).
    pub event: usize,
    /// The command (comm) that ran it, as reports show commands; [`UNKNOWN_COMMAND`] for
    /// files written before version 3 of FORMAT.md §13.
    pub command: String,
    /// Leaf first.
    pub frames: Vec<Frame>,
    /// The daemon saw it cut (depth limit) or unwinding stop after the first user frame.
    pub truncated: bool,
    pub samples: u64,
}

/// Outermost functions that a complete stack ends in: process and thread entry points, the
/// kernel's task start and its idle loop's boot path. A stack ending elsewhere is broken (the
/// frame-pointer walk lost the chain, e.g. in code built without frame pointers).
const ROOTS: &[&str] = &[
    "_start",
    "__libc_start_main",
    "__libc_start_call_main",
    "__libc_start_main_impl",
    "start_thread",
    "clone",
    "clone3",
    "__clone",
    "__clone3",
    "thread_start",
    "ret_from_fork",
    "ret_from_fork_asm",
    "secondary_startup_64",
    "secondary_startup_64_no_verify",
    "common_startup_64",
    "start_kernel",
    "x86_64_start_kernel",
    "x86_64_start_reservations",
    "rest_init",
];

impl SymStack {
    /// Not flagged truncated, but its outermost frame is no known entry point.
    pub fn broken(&self) -> bool {
        !self.truncated
            && self.frames.last().is_some_and(|f| {
                let name = f.function.split_once(' ').map_or(f.function.as_str(), |x| x.0);
                !ROOTS.contains(&name)
            })
    }
}

/// Names frames with the one symbolizer ([`Source`]), caching each image's source.
struct Namer<'a> {
    loaded: &'a Loaded,
    locator: Locator,
    cache: SymbolCache,
    mode: SymbolMode,
    /// ELF and vDSO sources, by identity.
    elf: HashMap<ImageId, Source>,
    /// Kernel, module and JIT sources, per (dir, image).
    per_dir: HashMap<(usize, ImageId), Source>,
    snaps: Snapshots,
    /// Names of (image index, offset) of the file being read.
    names: HashMap<(u32, u64), String>,
    /// JIT symbols the file being read carries itself (FORMAT.md §13, version 2), by image.
    file_jit: HashMap<ImageId, Source>,
    unknown: Source,
}

fn label(img: &StackImage) -> String {
    let base = img.path.rsplit(|&b| b == b'/').next().unwrap_or(&img.path);
    let b = if base.is_empty() { &img.path[..] } else { base };
    display_path(b)
}

impl Namer<'_> {
    fn name(
        &mut self,
        dir: usize,
        img: &StackImage,
        off: u64,
        warn: &mut dyn FnMut(String),
    ) -> String {
        let (label, mode) = (label(img), self.mode);
        self.source(dir, img, warn).symbolize(off, mode, &label).name
    }

    /// The source of an image's names, chosen once by its kind: ELF and vDSO symbols found as
    /// the flat report finds them, the host's kallsyms snapshot, or the JIT symbols (perf map)
    /// of an anonymous image: those the stack file carries (a region sampled only as a caller
    /// has no flat profile), else its flat profile's in the same host directory (files written
    /// before version 2 of §13 carry none).
    fn source(&mut self, dir: usize, img: &StackImage, warn: &mut dyn FnMut(String)) -> &Source {
        let (locator, cache, loaded) = (&mut self.locator, &mut self.cache, self.loaded);
        match img.kind {
            ImageKind::Elf | ImageKind::Vdso => {
                &*self.elf.entry(img.id.clone()).or_insert_with(|| {
                    let mut info = report::ImageInfo::default();
                    let recorded = std::slice::from_ref(&img.path);
                    let r =
                        report::ElfRequest { id: &img.id, recorded, mode: SymbolMode::default() };
                    report::elf_source(img.kind, locator, cache, &r, &mut info, warn)
                })
            }
            ImageKind::Anon if self.file_jit.contains_key(&img.id) => &self.file_jit[&img.id],
            ImageKind::Kernel | ImageKind::KernelModule | ImageKind::Anon => {
                let snaps = &mut self.snaps;
                &*self.per_dir.entry((dir, img.id.clone())).or_insert_with(|| match img.kind {
                    ImageKind::Anon => Source::Jit(JitTable::new(jit_of(loaded, dir, img))),
                    _ => {
                        let snap = snaps.get(loaded, dir, "frames", warn);
                        let module = (img.kind == ImageKind::KernelModule).then(|| label(img));
                        let k = Kallsyms::new(
                            snap,
                            module.as_deref(),
                            &img.id,
                            &display_path(&img.path),
                            &loaded.dirs[dir].path,
                            warn,
                        );
                        if module.is_some() {
                            Source::Module(k)
                        } else {
                            Source::Kernel(k)
                        }
                    }
                })
            }
            ImageKind::Unknown => &self.unknown,
        }
    }
}

/// The JIT symbols of an anonymous image in the flat profiles of host directory `dir`.
fn jit_of(loaded: &Loaded, dir: usize, img: &StackImage) -> Vec<JitSymbol> {
    for p in loaded.profiles.iter().filter(|p| p.dir == dir) {
        if p.profile.header.image_id != img.id {
            continue;
        }
        if !p.profile.header.jit_symbols.is_empty() {
            return p.profile.header.jit_symbols.clone();
        }
        // Totals from the summary index carry no symbols: read the file itself.
        if p.path.extension().is_some_and(|e| e == "json" || e == "idx") {
            continue;
        }
        if let Ok(f) = Profile::read(&p.path) {
            if !f.header.jit_symbols.is_empty() {
                return f.header.jit_symbols;
            }
        }
    }
    Vec::new()
}

/// What [`load`] names.
#[derive(Clone, Copy, Debug)]
pub enum Want<'a> {
    /// Every frame of every event's stacks (exports).
    All,
    /// Only what the `--callers`/`--callees` report of `symbol` prints (first event only):
    /// see [`load`]. `image`: only that image's function of the name (`--image`).
    Calls { symbol: &'a str, dir: Direction, depth: usize, image: Option<&'a HashSet<ImageId>> },
}

/// Name of a frame [`load`] did not need to name (`Want::Calls`).
pub const UNNAMED: &str = "";

/// A cheap test for whether the raw (mangled) symbol `raw` can show as `want`, before the
/// exact one (demangling every symbol of every image costs more than the whole report).
struct NameMatch<'a> {
    want: &'a str,
    raw_names: bool,
    /// An identifier of `want` that any mangled name showing as `want` contains verbatim
    /// (Itanium and Rust manglings keep source identifiers as they are).
    needle: Option<&'a str>,
}

/// Words a demangler produces without their letters in the mangled name (builtin types,
/// `std::` abbreviations, closures and shims).
const GENERATED: &[&str] = &[
    "std",
    "core",
    "alloc",
    "closure",
    "shim",
    "vtable",
    "impl",
    "const",
    "operator",
    "unsigned",
    "signed",
    "char",
    "int",
    "long",
    "short",
    "void",
    "bool",
    "float",
    "double",
    "wchar_t",
    "allocator",
    "basic_string",
    "string",
    "char_traits",
    "basic_istream",
    "basic_ostream",
    "basic_iostream",
    "istream",
    "ostream",
    "iostream",
    "anonymous",
    "namespace",
    "lambda",
];

impl<'a> NameMatch<'a> {
    fn new(want: &'a str, raw_names: bool) -> Self {
        let needle = want
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .filter(|w| !w.is_empty() && !w.bytes().all(|b| b.is_ascii_digit()))
            .filter(|w| !GENERATED.contains(w))
            .max_by_key(|w| w.len());
        NameMatch { want, raw_names, needle }
    }

    fn matches(&self, raw: &str) -> bool {
        if self.raw_names {
            return escape::controls(raw) == self.want;
        }
        // Only names starting so are demangled (names::demangle); others show as they are.
        if !raw.starts_with(['_', 'Z', 'R']) {
            return escape::controls(raw) == self.want;
        }
        if self.needle.is_some_and(|n| !raw.contains(n)) {
            return false;
        }
        display_name(raw, false) == self.want
    }
}

impl Namer<'_> {
    /// File offset ranges (as stack frames store them) of the image's functions named
    /// `symbol`, from its symbol table (kernel: kallsyms, up to the next symbol).
    fn ranges(
        &mut self,
        dir: usize,
        img: &StackImage,
        symbol: &str,
        warn: &mut dyn FnMut(String),
    ) -> Vec<(u64, u64)> {
        let m = NameMatch::new(symbol, self.mode.raw_names);
        let mut out = Vec::new();
        match img.kind {
            ImageKind::Elf | ImageKind::Vdso => {
                let Some(s) = self.source(dir, img, warn).elf() else { return out };
                for sym in &s.table().symbols {
                    if !m.matches(&sym.name) {
                        continue;
                    }
                    let (Some(start), end) = (s.vaddr_to_offset(sym.start), s.symbol_end(sym))
                    else {
                        continue;
                    };
                    out.push((start, start.saturating_add(end.saturating_sub(sym.start).max(1))));
                }
            }
            ImageKind::Kernel | ImageKind::KernelModule => {
                let (Source::Kernel(k) | Source::Module(k)) = self.source(dir, img, warn) else {
                    return out;
                };
                let Some(s) = k.snapshot() else { return out };
                let (module, base) = match k.module() {
                    Some((mi, base)) => (Some(mi), base),
                    None if img.kind == ImageKind::Kernel => (None, s.text_base),
                    None => return out,
                };
                for (i, k) in s.symbols.iter().enumerate() {
                    if k.module != module || !m.matches(&k.name) {
                        continue;
                    }
                    // Up to the next symbol at a higher address (kallsyms has no sizes).
                    let end = s.symbols[i..]
                        .iter()
                        .find(|n| n.addr > k.addr)
                        .map_or(u64::MAX, |n| n.addr);
                    if let Some(start) = k.addr.checked_sub(base) {
                        out.push((start, end.saturating_sub(base)));
                    }
                }
            }
            ImageKind::Unknown | ImageKind::Anon => {}
        }
        out
    }

    /// Name of frame `(ii, off)` of the file being read, memoized.
    fn memo(
        &mut self,
        dir: usize,
        images: &[(String, StackImage)],
        (ii, off): (u32, u64),
        warn: &mut dyn FnMut(String),
    ) -> String {
        if let Some(n) = self.names.get(&(ii, off)) {
            return n.clone();
        }
        let n = self.name(dir, &images[ii as usize].1, off, warn);
        self.names.insert((ii, off), n.clone());
        n
    }

    /// Name every distinct frame of the file being read: per image, its offsets sorted, in
    /// one pass (the symbol table's lookups then walk it in order).
    fn name_all(
        &mut self,
        dir: usize,
        images: &[(String, StackImage)],
        p: &StackProfile,
        warn: &mut dyn FnMut(String),
    ) {
        let mut per: Vec<Vec<u64>> = vec![Vec::new(); images.len()];
        for s in p.stacks() {
            for &(ii, off) in s.frames {
                if let Some(v) = per.get_mut(ii as usize) {
                    v.push(off);
                }
            }
        }
        for (ii, mut offs) in per.into_iter().enumerate() {
            offs.sort_unstable();
            offs.dedup();
            for off in offs {
                let n = self.name(dir, &images[ii].1, off, warn);
                self.names.insert((ii as u32, off), n);
            }
        }
    }
}

/// The stacks of every selected host directory and event; empty when the daemon sampled none
/// (no stack file). Unreadable files are errors, or warnings with `keep_going`.
///
/// With [`Want::Calls`] only the first event is read and frames are named lazily: the
/// symbol's (image, offset range)s are looked up by name in the symbol tables of the images
/// the file references, a stack is examined only if a frame falls in one, and only the frames
/// the report prints (the chain of `depth` callers or callees) are named, plus each stack's
/// outermost frame (whether it is an entry point decides the truncated share). Other frames
/// are [`UNNAMED`]. Names no symbol table holds (`[.plt]`, `image+0x...`) and `--inlines`
/// (names from DWARF) fall back to naming every frame.
///
/// `command`: only the stacks of that command (as reports show it; `[unknown command]` those
/// of files written before commands were kept).
#[allow(clippy::too_many_arguments)]
pub fn load(
    loaded: &Loaded,
    w: &Weights,
    locator: Locator,
    cache: SymbolCache,
    mode: SymbolMode,
    keep_going: bool,
    want: Want<'_>,
    command: Option<&str>,
    warn: &mut dyn FnMut(String),
) -> Result<Vec<SymStack>, ProfError> {
    let mut namer = Namer {
        loaded,
        locator,
        cache,
        mode,
        elf: HashMap::new(),
        per_dir: HashMap::new(),
        snaps: Snapshots::default(),
        names: HashMap::new(),
        file_jit: HashMap::new(),
        unknown: Source::Unknown,
    };
    let mut out = Vec::new();
    for (di, d) in loaded.dirs.iter().enumerate() {
        for (ei, info) in w.infos.iter().enumerate() {
            if ei > 0 && matches!(want, Want::Calls { .. }) {
                break;
            }
            let path = d.stacks_path(&info.name);
            let p = match StackProfile::read(&path) {
                Ok(p) => p,
                Err(profile_format::Error::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    continue
                }
                Err(e) if keep_going => {
                    warn(format!("skipping unreadable stack file: {e}"));
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let p = match command {
                Some(c) => only_command(p, c),
                None => p,
            };
            // Image indexes are the file's own: the memo is per file.
            namer.names.clear();
            namer.file_jit = p
                .images()
                .iter()
                .enumerate()
                .filter_map(|(i, img)| {
                    let syms: Vec<JitSymbol> = p.jit_symbols(i as u32).cloned().collect();
                    (!syms.is_empty()).then(|| (img.id.clone(), Source::Jit(JitTable::new(syms))))
                })
                .collect();
            let images: Vec<(String, StackImage)> = p
                .images()
                .iter()
                .map(|i| {
                    let name = match i.kind {
                        ImageKind::Unknown => "[unknown]".to_owned(),
                        _ => display_path(&i.path),
                    };
                    (name, i.clone())
                })
                .collect();
            // The one place a file's stack becomes a SymStack, whichever frames were named.
            let sym_stack = |s: &profile_format::StackRef<'_>,
                             names: &mut dyn FnMut(usize) -> String| {
                let frames = s
                    .frames
                    .iter()
                    .enumerate()
                    .map(|(i, &(ii, off))| {
                        let img = &images[ii as usize];
                        Frame {
                            image: img.0.clone(),
                            kind: img.1.kind,
                            image_id: (img.1.kind != ImageKind::Unknown).then(|| img.1.id.clone()),
                            offset: off,
                            function: names(i),
                        }
                    })
                    .collect();
                SymStack {
                    dir: di,
                    event: ei,
                    command: command_name(s.command),
                    frames,
                    truncated: s.truncated,
                    samples: s.samples,
                }
            };
            // `IMAGE+0xSTART-0xEND`: the frames of that image in that offset range are the
            // function (a stripped image has no symbol to name it by).
            let by_range = match want {
                Want::Calls { symbol, image, .. } => parse_offset_range(symbol).map(|r| {
                    images
                        .iter()
                        .map(|(_, img)| {
                            let chosen = image.map_or(label(img) == r.label, |only| {
                                only.contains(&img.id)
                                    && (r.label.is_empty() || label(img) == r.label)
                            });
                            if chosen && img.kind != ImageKind::Unknown {
                                vec![(r.start, r.end)]
                            } else {
                                Vec::new()
                            }
                        })
                        .collect::<Vec<Vec<(u64, u64)>>>()
                }),
                Want::All => None,
            };
            let calls = match (want, by_range) {
                (Want::Calls { symbol, dir, depth, .. }, Some(ranges)) => {
                    Some((symbol, dir, depth, ranges))
                }
                (Want::Calls { symbol, dir, depth, image }, None) if !mode.inlines => {
                    let ranges: Vec<Vec<(u64, u64)>> = images
                        .iter()
                        .map(|(_, img)| {
                            if image.is_some_and(|only| !only.contains(&img.id)) {
                                return Vec::new();
                            }
                            namer.ranges(di, img, symbol, warn)
                        })
                        .collect();
                    ranges.iter().any(|r| !r.is_empty()).then_some((symbol, dir, depth, ranges))
                }
                _ => None,
            };
            let Some((symbol, dir, depth, ranges)) = calls else {
                namer.name_all(di, &images, &p, warn);
                for s in p.stacks() {
                    out.push(sym_stack(&s, &mut |i| namer.names[&s.frames[i]].clone()));
                }
                continue;
            };
            let is_range = by_range_symbol(want);
            let in_target = |&(ii, off): &(u32, u64)| {
                ranges.get(ii as usize).is_some_and(|r| r.iter().any(|&(a, b)| off >= a && off < b))
            };
            for s in p.stacks() {
                let n = s.frames.len();
                let mut names: Vec<Option<String>> = vec![None; n];
                // The symbol's occurrence the report counts: innermost for callers,
                // outermost for callees; confirmed by its name (the range is a prefilter).
                let mut order: Box<dyn Iterator<Item = usize>> = match dir {
                    Direction::Callers => Box::new(0..n),
                    Direction::Callees => Box::new((0..n).rev()),
                };
                let pos = order.find(|&i| {
                    in_target(&s.frames[i]) && {
                        if is_range {
                            // The range is the function: its frames take the name asked for.
                            names[i] = Some(symbol.to_owned());
                            return true;
                        }
                        let nm = namer.memo(di, &images, s.frames[i], warn);
                        let hit = nm == symbol;
                        names[i] = Some(nm);
                        hit
                    }
                });
                if let Some(pos) = pos {
                    let window = match dir {
                        Direction::Callers => pos + 1..(pos + 1 + depth).min(n),
                        Direction::Callees => pos.saturating_sub(depth)..pos,
                    };
                    for i in window {
                        names[i] = Some(namer.memo(di, &images, s.frames[i], warn));
                    }
                }
                if let Some(last) = n.checked_sub(1) {
                    if names[last].is_none() {
                        names[last] = Some(namer.memo(di, &images, s.frames[last], warn));
                    }
                }
                out.push(sym_stack(&s, &mut |i| {
                    names[i].take().unwrap_or_else(|| UNNAMED.to_owned())
                }));
            }
        }
    }
    Ok(out)
}

/// `IMAGE+0xSTART-0xEND` (or `..`): the frames of image IMAGE (its base name as reports show
/// it, e.g. `postgres`; empty with `--image`: `+0x10-0x20`) at offsets START (inclusive) to
/// END (exclusive), as `--callers`/`--callees` accept them for functions of stripped images.
#[derive(Clone, Debug, PartialEq, Eq)]
struct OffsetRange {
    label: String,
    start: u64,
    end: u64,
}

fn parse_offset_range(sym: &str) -> Option<OffsetRange> {
    let (label, range) = sym.rsplit_once('+')?;
    let (a, b) = range.split_once("..").or_else(|| range.split_once('-'))?;
    let hex = |t: &str| u64::from_str_radix(t.strip_prefix("0x")?, 16).ok();
    let (start, end) = (hex(a)?, hex(b)?);
    (end > start).then(|| OffsetRange { label: label.to_owned(), start, end })
}

fn by_range_symbol(want: Want<'_>) -> bool {
    matches!(want, Want::Calls { symbol, .. } if parse_offset_range(symbol).is_some())
}

/// A stack's command as reports show it (escaped as commands are in the who reports).
fn command_name(c: Option<&[u8]>) -> String {
    match c {
        Some(c) => display_path(c),
        None => UNKNOWN_COMMAND.to_owned(),
    }
}

/// The stacks of `p` run by command `command` (as [`command_name`] shows it).
fn only_command(p: StackProfile, command: &str) -> StackProfile {
    if p.stacks().all(|s| command_name(s.command) == command) {
        return p;
    }
    let mut q = StackProfile::new(&p.host, &p.epoch, &p.event);
    let images: Vec<u32> = p.images().iter().map(|i| q.image_index(i)).collect();
    for (i, img) in p.images().iter().enumerate() {
        if img.kind == ImageKind::Anon {
            q.add_jit_symbols(images[i], p.jit_symbols(i as u32));
        }
    }
    let mut buf = Vec::new();
    for s in p.stacks().filter(|s| command_name(s.command) == command) {
        let c = s.command.map(|c| q.command_index(c));
        buf.clear();
        buf.extend(s.frames.iter().map(|&(i, o)| (images[i as usize], o)));
        q.add_command(c, &buf, s.truncated, s.samples);
    }
    q
}

/// Which way `--callers`/`--callees` look from the symbol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Callers,
    Callees,
}

/// One row of a callers/callees report.
#[derive(Clone, Debug, Serialize)]
pub struct CallRow {
    /// The caller (or callee); with `--depth N` > 1 the chain of N, nearest first, joined by
    /// ` <- ` (callers) or ` -> ` (callees).
    pub symbol: String,
    pub samples: u64,
    /// Share of the samples whose stack contains the symbol.
    pub percent: f64,
}

/// The `--callers`/`--callees` report.
#[derive(Clone, Debug, Serialize)]
pub struct CallReport {
    pub symbol: String,
    pub direction: &'static str,
    pub depth: usize,
    pub event: String,
    /// Samples (of the first event) whose stack contains the symbol.
    pub samples: u64,
    /// Samples of the first event that have a stack.
    pub stack_samples: u64,
    /// Share of `stack_samples` in stacks that do not reach a root (truncated by the daemon,
    /// or ending in a frame that is no entry point).
    pub truncated_percent: f64,
    pub rows: Vec<CallRow>,
}

/// Callers or callees of `symbol` (an exact function name as reports show it) over the first
/// event's stacks. A stack counts once, at the symbol's innermost occurrence for callers and
/// outermost for callees; `[self]` is the symbol sampled itself, `[no caller]` a stack that
/// ends in it. With `image`, only frames of those images are the symbol (`--image`).
pub fn call_report(
    stacks: &[SymStack],
    event: &str,
    symbol: &str,
    dir: Direction,
    depth: usize,
    image: Option<&HashSet<ImageId>>,
) -> CallReport {
    let depth = depth.max(1);
    let mut rows: HashMap<String, u64> = HashMap::new();
    let (mut total, mut with, mut cut) = (0u64, 0u64, 0u64);
    for s in stacks.iter().filter(|s| s.event == 0) {
        total += s.samples;
        if s.truncated || s.broken() {
            cut += s.samples;
        }
        let names: Vec<&str> = s.frames.iter().map(|f| f.function.as_str()).collect();
        let is_it = |f: &Frame| {
            f.function == symbol
                && image.is_none_or(|only| f.image_id.as_ref().is_some_and(|id| only.contains(id)))
        };
        let pos = match dir {
            Direction::Callers => s.frames.iter().position(is_it),
            Direction::Callees => s.frames.iter().rposition(is_it),
        };
        let Some(pos) = pos else { continue };
        with += s.samples;
        let key = match dir {
            Direction::Callers => {
                let chain: Vec<&str> = names[pos + 1..].iter().take(depth).copied().collect();
                if chain.is_empty() {
                    "[no caller]".to_owned()
                } else {
                    chain.join(" <- ")
                }
            }
            Direction::Callees => {
                let chain: Vec<&str> = names[..pos].iter().rev().take(depth).copied().collect();
                if chain.is_empty() {
                    "[self]".to_owned()
                } else {
                    chain.join(" -> ")
                }
            }
        };
        *rows.entry(key).or_default() += s.samples;
    }
    let pct = |n: u64, d: u64| if d == 0 { 0.0 } else { 100.0 * n as f64 / d as f64 };
    let mut rows: Vec<CallRow> = rows
        .into_iter()
        .map(|(symbol, samples)| CallRow { symbol, samples, percent: pct(samples, with) })
        .collect();
    rows.sort_by(|a, b| b.samples.cmp(&a.samples).then_with(|| a.symbol.cmp(&b.symbol)));
    CallReport {
        symbol: symbol.to_owned(),
        direction: match dir {
            Direction::Callers => "callers",
            Direction::Callees => "callees",
        },
        depth,
        event: event.to_owned(),
        samples: with,
        stack_samples: total,
        truncated_percent: pct(cut, total),
        rows,
    }
}

/// Replace the export's one-frame samples by the call stacks, for every (host, epoch, event)
/// that has them: folded stacks, flame graphs, pprof and speedscope then show full stacks
/// rooted at their command (root first). Samples keep the weight per sample of the flat
/// profiles they replace. `only_stacks` (`--command`): every flat sample goes, also of
/// (host, epoch, event)s without stacks (the flat profiles do not know the command).
pub fn apply_to_export(
    x: &mut super::export::Export,
    stacks: &[SymStack],
    loaded: &Loaded,
    only_stacks: bool,
) {
    use super::export::{Function, Image, Location, Sample};
    if stacks.is_empty() && !only_stacks {
        return;
    }
    let host_of =
        |di: usize| x.hosts.iter().position(|h| *h == loaded.dirs[di].host).unwrap_or(0) as u32;
    let epoch_of = |di: usize| {
        x.epochs.iter().position(|e| e == loaded.dirs[di].epoch.as_str()).unwrap_or(0) as u32
    };
    let keys: std::collections::HashSet<(u32, u32, u32)> =
        stacks.iter().map(|s| (host_of(s.dir), epoch_of(s.dir), s.event as u32)).collect();
    // Weight of one sample per key, from the flat samples it replaces.
    let mut wt: HashMap<(u32, u32, u32), (u64, f64)> = HashMap::new();
    for s in &x.samples {
        let e = wt.entry((s.host, s.epoch, s.event)).or_default();
        e.0 += s.samples;
        e.1 += s.events;
    }
    x.samples.retain(|s| !only_stacks && !keys.contains(&(s.host, s.epoch, s.event)));
    let mut cmd_ix: HashMap<String, u32> =
        x.commands.iter().enumerate().map(|(i, c)| (c.clone(), i as u32)).collect();
    let mut img_ix: HashMap<String, usize> =
        x.images.iter().enumerate().map(|(i, m)| (m.name.clone(), i)).collect();
    let mut fn_ix: HashMap<Function, usize> =
        x.functions.iter().enumerate().map(|(i, f)| (f.clone(), i)).collect();
    let mut loc_ix: HashMap<(usize, u64, usize), usize> = HashMap::new();
    let mut stack_ix: HashMap<(Vec<usize>, u32), u32> = HashMap::new();
    let mut sample_ix: HashMap<(u32, u32, u32, u32), usize> = HashMap::new();
    for s in stacks {
        let mut locs = Vec::with_capacity(s.frames.len());
        for f in &s.frames {
            let image = *img_ix.entry(f.image.clone()).or_insert_with(|| {
                x.images.push(Image {
                    name: f.image.clone(),
                    kind: report::kind_name(f.kind),
                    build_id: match &f.image_id {
                        Some(ImageId::BuildId(b)) => Some(hex::encode(b)),
                        _ => None,
                    },
                    symbolized: false,
                    max_offset: 0,
                });
                x.images.len() - 1
            });
            let m = &mut x.images[image];
            m.max_offset = m.max_offset.max(f.offset);
            m.symbolized |= !f.function.contains("+0x");
            let func = Function {
                name: escape::controls(&f.function).into_owned(),
                system_name: None,
                file: None,
            };
            let function = *fn_ix.entry(func.clone()).or_insert_with(|| {
                x.functions.push(func);
                x.functions.len() - 1
            });
            let loc = *loc_ix.entry((image, f.offset, function)).or_insert_with(|| {
                x.locations.push(Location { image, offset: f.offset, function, line: None });
                x.locations.len() - 1
            });
            locs.push(loc);
        }
        let command = *cmd_ix.entry(s.command.clone()).or_insert_with(|| {
            x.commands.push(s.command.clone());
            (x.commands.len() - 1) as u32
        });
        let stack = *stack_ix.entry((locs.clone(), command)).or_insert_with(|| {
            x.stacks.push(locs);
            let i = (x.stacks.len() - 1) as u32;
            x.stack_commands.insert(i, command);
            i
        });
        let (host, epoch, event) = (host_of(s.dir), epoch_of(s.dir), s.event as u32);
        let per =
            wt.get(&(host, epoch, event)).map_or(
                1.0,
                |&(n, e)| {
                    if n == 0 {
                        1.0
                    } else {
                        e / n as f64
                    }
                },
            );
        let i = *sample_ix.entry((stack, host, epoch, event)).or_insert_with(|| {
            x.samples.push(Sample { stack, host, epoch, event, samples: 0, events: 0.0 });
            x.samples.len() - 1
        });
        x.samples[i].samples += s.samples;
        x.samples[i].events += s.samples as f64 * per;
    }
}

/// Write a `--callers`/`--callees` report through the one renderer: a text table under its
/// summary line, CSV (`symbol,samples,percent`) or the report's JSON.
pub fn write_calls(
    out: &mut dyn std::io::Write,
    r: &CallReport,
    format: TableFormat,
) -> std::io::Result<()> {
    use dcpi_report::render::{Column, Kind, Output, Style, Table, Value};
    // A time-weighted event (off-CPU time): its counts are nanoseconds (JSON and CSV keep
    // them), shown as seconds in the text table.
    let timed = report::time_weighted(&r.event);
    let mut t = Table::new();
    t.columns([
        Column::new("symbol", Kind::Text),
        if timed {
            Column::new("time", Kind::Count).csv("samples").min_width(12).right()
        } else {
            Column::new("samples", Kind::Count).min_width(10)
        },
        Column::new("%", Kind::Decimal(2)).csv("percent").min_width(6),
    ]);
    t.text_columns(vec![1, 2, 0]);
    if timed {
        let s = report::seconds_text;
        t.head(format!(
            "{} of {}: {} of {} in stacks through it ({} with a stack, {:.1}% truncated; counts \
             are nanoseconds, shown as seconds)",
            r.direction,
            r.symbol,
            s(r.samples),
            r.event,
            s(r.stack_samples),
            r.truncated_percent
        ));
    } else {
        t.head(format!(
            "{} of {}: {} samples of {} in stacks through it ({} stack samples, {:.1}% truncated)",
            r.direction, r.symbol, r.samples, r.event, r.stack_samples, r.truncated_percent
        ));
    }
    for row in &r.rows {
        let n: Value = if timed {
            Value::Both {
                text: report::seconds_text(row.samples),
                csv: CsvCell::Number(row.samples.to_string()),
            }
        } else {
            row.samples.into()
        };
        t.row(vec![row.symbol.as_str().into(), n.into(), row.percent.into()]);
    }
    t.write(out, Output::from(format), Style::default(), r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--callers` tables come from the one renderer: CSV through the one quoter (a name with
    /// a quote and a formula prefix is quoted and neutralised), text with the summary line.
    #[test]
    fn call_report_renders_through_the_one_table() {
        let r = CallReport {
            symbol: "hot".into(),
            direction: "callers",
            depth: 1,
            event: "cpu-clock".into(),
            samples: 10,
            stack_samples: 12,
            truncated_percent: 0.0,
            rows: vec![
                CallRow { symbol: "via_a".into(), samples: 6, percent: 60.0 },
                CallRow { symbol: "=cmd\"x".into(), samples: 4, percent: 40.0 },
            ],
        };
        let mut csv = Vec::new();
        write_calls(&mut csv, &r, TableFormat::Csv).unwrap();
        let csv = String::from_utf8(csv).unwrap();
        let mut lines = csv.lines();
        assert_eq!(lines.next(), Some("symbol,samples,percent"));
        assert_eq!(lines.next(), Some("via_a,6,60"));
        let l = lines.next().unwrap();
        assert!(l.starts_with("\"'=cmd\"\"x\",4,40"), "{l}");
        let mut text = Vec::new();
        write_calls(&mut text, &r, TableFormat::Table).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.starts_with("callers of hot: 10 samples of cpu-clock"), "{text}");
        let row = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert!(text.lines().any(|l| row(l) == ["6", "60.00", "via_a"]), "{text}");
        assert!(text.lines().any(|l| row(l) == ["samples", "%", "symbol"]), "{text}");
    }

    fn st(names: &[&str], truncated: bool, samples: u64) -> SymStack {
        SymStack {
            dir: 0,
            event: 0,
            command: "app".into(),
            frames: names
                .iter()
                .enumerate()
                .map(|(i, n)| Frame {
                    image: "/bin/app".into(),
                    kind: ImageKind::Elf,
                    image_id: None,
                    offset: i as u64,
                    function: n.to_string(),
                })
                .collect(),
            truncated,
            samples,
        }
    }

    #[test]
    fn name_prefilter_agrees_with_the_demangled_name() {
        let cases = [
            ("hot", "hot", true),
            ("hot", "hotter", false),
            ("_ZN4core3fmt5write17h0123456789abcdefE", "core::fmt::write", true),
            ("_ZN4core3fmt5write17h0123456789abcdefE", "core::fmt::read", false),
            (
                "_ZNSt6vectorIiSaIiEE9push_backERKi",
                "std::vector<int, std::allocator<int> >::push_back(int const&)",
                true,
            ),
            ("_ZNKSs4sizeEv", "std::string::size() const", true),
            ("_RNvCs1234_7mycrate4main", "mycrate::main", true),
            ("__libc_start_call_main", "__libc_start_call_main", true),
        ];
        for (raw, want, expect) in cases {
            let exact = display_name(raw, false) == want;
            assert_eq!(NameMatch::new(want, false).matches(raw), exact, "{raw} vs {want}");
            if expect {
                assert!(
                    exact,
                    "test case {raw} should demangle to {want}: {}",
                    display_name(raw, false)
                );
            }
        }
        assert!(NameMatch::new("_ZN3fooE", true).matches("_ZN3fooE"));
    }

    #[test]
    fn callers_and_callees_split_by_path() {
        let stacks = vec![
            st(&["hot", "via_a", "main", "__libc_start_call_main"], false, 60),
            st(&["hot", "via_b", "main", "__libc_start_call_main"], false, 40),
            st(&["hot", "via_b"], false, 5),
            st(&["other", "main", "__libc_start_call_main"], true, 10),
        ];
        let r = call_report(&stacks, "cpu-clock", "hot", Direction::Callers, 1, None);
        let got: Vec<(&str, u64)> = r.rows.iter().map(|r| (r.symbol.as_str(), r.samples)).collect();
        assert_eq!(got, [("via_a", 60), ("via_b", 45)]);
        assert_eq!((r.samples, r.stack_samples), (105, 115));
        // The 5 broken (ends in via_b) and 10 truncated of 115.
        assert!((r.truncated_percent - 100.0 * 15.0 / 115.0).abs() < 1e-9);
        let r = call_report(&stacks, "cpu-clock", "hot", Direction::Callers, 2, None);
        assert_eq!(r.rows[0].symbol, "via_a <- main");
        let r = call_report(&stacks, "cpu-clock", "main", Direction::Callees, 2, None);
        let got: Vec<(&str, u64)> = r.rows.iter().map(|r| (r.symbol.as_str(), r.samples)).collect();
        assert_eq!(got, [("via_a -> hot", 60), ("via_b -> hot", 40), ("other", 10)]);
        let r = call_report(&stacks, "cpu-clock", "hot", Direction::Callees, 1, None);
        assert_eq!(r.rows[0].symbol, "[self]");
    }

    #[test]
    fn offset_ranges_parse_and_names_do_not() {
        let r = |label: &str, start, end| Some(OffsetRange { label: label.into(), start, end });
        assert_eq!(
            parse_offset_range("postgres+0x472a10-0x472b80"),
            r("postgres", 0x472a10, 0x472b80)
        );
        assert_eq!(parse_offset_range("libc.so.6+0x10..0x20"), r("libc.so.6", 0x10, 0x20));
        assert_eq!(parse_offset_range("+0x10-0x20"), r("", 0x10, 0x20));
        for not in ["hot", "app+0x1000", "a+0x20-0x10", "a+0x10-0x10", "a+10-20", "operator+"] {
            assert_eq!(parse_offset_range(not), None, "{not}");
        }
    }

    #[test]
    fn image_narrows_the_symbol_to_that_images_function() {
        // Two programs, each with its own `hot`: --image picks one program's function.
        let in_image = |mut s: SymStack, path: &str, id: u8| {
            s.command = path.rsplit('/').next().unwrap().to_owned();
            for f in &mut s.frames {
                f.image = path.to_owned();
                f.image_id = Some(ImageId::from_build_id(&[id; 20]).unwrap());
            }
            s
        };
        let stacks = vec![
            in_image(st(&["hot", "via_a", "main", "_start"], false, 60), "/bin/a", 1),
            in_image(st(&["hot", "via_b", "main", "_start"], false, 40), "/bin/a", 1),
            in_image(st(&["hot", "from_b", "main", "_start"], false, 70), "/bin/b", 2),
        ];
        let all = call_report(&stacks, "cpu-clock", "hot", Direction::Callers, 1, None);
        assert_eq!(all.samples, 170);
        let a: HashSet<ImageId> = [ImageId::from_build_id(&[1; 20]).unwrap()].into();
        let r = call_report(&stacks, "cpu-clock", "hot", Direction::Callers, 1, Some(&a));
        let got: Vec<(&str, u64)> = r.rows.iter().map(|r| (r.symbol.as_str(), r.samples)).collect();
        assert_eq!(got, [("via_a", 60), ("via_b", 40)]);
        assert_eq!((r.samples, r.stack_samples), (100, 170));
        let r = call_report(&stacks, "cpu-clock", "main", Direction::Callees, 1, Some(&a));
        assert_eq!(r.samples, 100);
    }
}
