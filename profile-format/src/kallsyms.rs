use std::collections::HashMap;
use std::path::Path;

use crate::atomic;
use crate::codec::{self, put_bytes, Reader};
use crate::error::{Error, Result};
use crate::ident::MAX_BUILD_ID_LEN;
use crate::safeio;
use crate::varint::write_u64;

/// First bytes of every kallsyms snapshot.
pub const KALLSYMS_MAGIC: &[u8; 8] = b"DCPIKSYM";
/// Version written by this build (and the newest it reads).
pub const KALLSYMS_VERSION: u16 = 1;

/// kallsyms type letters kept in a snapshot: code symbols (local/global, weak).
fn is_text_kind(kind: u8) -> bool {
    matches!(kind, b't' | b'T' | b'w' | b'W')
}

/// kallsyms caps names at 512 bytes (`KSYM_NAME_LEN`); the cap bounds the memory a corrupt
/// snapshot's prefix sharing could make the reader allocate.
pub(crate) const MAX_SYMBOL_LEN: usize = 1024;

/// Function-padding symbols (`__pfx_foo` before `foo`, kernels with `CONFIG_CALL_PADDING`) make
/// up about half of kallsyms; their names are stored as a flag on the symbol.
const PFX: &str = "__pfx_";

/// Type letters in code order (2 bits in the encoded tag).
const KIND_LETTERS: [u8; 4] = [b't', b'T', b'w', b'W'];

fn kind_code(kind: u8) -> u64 {
    KIND_LETTERS.iter().position(|k| *k == kind).unwrap_or(0) as u64
}

/// Whether `s`'s name is `__pfx_` + the next symbol's name (and that one is not a `__pfx_`).
fn is_pfx_twin(s: &KernelSymbol, next: Option<&KernelSymbol>) -> bool {
    next.is_some_and(|n| !n.name.starts_with(PFX) && s.name.strip_prefix(PFX) == Some(&n.name))
}

/// A symbol as the encoder sees it, from a [`KernelSymbol`] or a [`Packed`] one: its name is
/// `__pfx_` (if `pfx`) followed by `rest`.
#[derive(Clone, Copy)]
struct SymbolView<'a> {
    addr: u64,
    /// 0 for the core kernel, else module index + 1.
    module_tag: u64,
    kind_code: u64,
    pfx: bool,
    rest: &'a [u8],
}

impl<'a> SymbolView<'a> {
    fn of(s: &'a KernelSymbol) -> Self {
        let (pfx, rest) = match s.name.strip_prefix(PFX) {
            Some(r) => (true, r),
            None => (false, s.name.as_str()),
        };
        SymbolView {
            addr: s.addr,
            module_tag: s.module.map_or(0, |m| u64::from(m) + 1),
            kind_code: kind_code(s.kind),
            pfx,
            rest: rest.as_bytes(),
        }
    }

    /// [`is_pfx_twin`].
    fn is_pfx_twin_of(&self, next: Option<&SymbolView<'_>>) -> bool {
        self.pfx && next.is_some_and(|n| !n.pfx && n.rest == self.rest)
    }

    fn full_name(&self, out: &mut Vec<u8>) {
        out.clear();
        if self.pfx {
            out.extend_from_slice(PFX.as_bytes());
        }
        out.extend_from_slice(self.rest);
    }

    /// The bytes of the name in order, for comparing names without building them.
    fn name_bytes(&self) -> impl Iterator<Item = &u8> {
        PFX.as_bytes()[..if self.pfx { PFX.len() } else { 0 }].iter().chain(self.rest)
    }

    /// [`sort_key`]'s order.
    fn cmp_canonical(&self, other: &SymbolView<'_>) -> std::cmp::Ordering {
        let names = || {
            if self.pfx == other.pfx {
                self.rest.cmp(other.rest)
            } else {
                self.name_bytes().cmp(other.name_bytes())
            }
        };
        (self.addr, self.module_tag)
            .cmp(&(other.addr, other.module_tag))
            .then_with(names)
            .then_with(|| {
                KIND_LETTERS[self.kind_code as usize].cmp(&KIND_LETTERS[other.kind_code as usize])
            })
    }
}

/// A symbol in 16 bytes: its name is in [`PackedSymbols::names`].
#[derive(Clone, Copy)]
struct Packed {
    addr: u64,
    /// Where the name (without its `__pfx_`, if any) starts in `names`.
    name_at: u32,
    /// module tag << 14 | pfx << 13 | kind code << 11 | name length (at most 1024 here).
    meta: u32,
}

const PACKED_LEN_BITS: u32 = 11;
const PACKED_MODULE_SHIFT: u32 = 14;

/// Symbols while [`KallsymsSnapshot::file_bytes_from_proc_lines`] sorts them.
#[derive(Default)]
struct PackedSymbols {
    symbols: Vec<Packed>,
    names: Vec<u8>,
    /// The last name added to `names` (offset, length): the next symbol often has it too
    /// (`__pfx_foo` is followed by `foo`).
    last_name: Option<(u32, u32)>,
}

impl PackedSymbols {
    fn push(&mut self, addr: u64, kind: u8, name: &str, module: Option<u32>) -> Result<()> {
        let module_tag = module.map_or(0, |m| u64::from(m) + 1);
        if module_tag >= 1 << (32 - PACKED_MODULE_SHIFT) {
            return Err(Error::Invalid {
                what: "/proc/kallsyms",
                value: format!("{module_tag} modules"),
                detail: format!("more than {} modules", (1u32 << (32 - PACKED_MODULE_SHIFT)) - 2),
            });
        }
        let (pfx, rest) = match name.strip_prefix(PFX) {
            Some(r) => (true, r.as_bytes()),
            None => (false, name.as_bytes()),
        };
        debug_assert!(rest.len() <= MAX_SYMBOL_LEN);
        let name_at = match self.last_name {
            Some((at, len)) if self.names[at as usize..(at + len) as usize] == *rest => at,
            _ => {
                let at = u32::try_from(self.names.len()).map_err(|_| Error::Invalid {
                    what: "/proc/kallsyms",
                    value: format!("{} bytes of names", self.names.len()),
                    detail: "more than 4 GiB of symbol names".into(),
                })?;
                self.names.extend_from_slice(rest);
                at
            }
        };
        self.last_name = Some((name_at, rest.len() as u32));
        let meta = (module_tag as u32) << PACKED_MODULE_SHIFT
            | u32::from(pfx) << 13
            | (kind_code(kind) as u32) << PACKED_LEN_BITS
            | rest.len() as u32;
        self.symbols.push(Packed { addr, name_at, meta });
        Ok(())
    }

    fn view(&self, p: &Packed) -> SymbolView<'_> {
        let len = (p.meta & ((1 << PACKED_LEN_BITS) - 1)) as usize;
        SymbolView {
            addr: p.addr,
            module_tag: u64::from(p.meta >> PACKED_MODULE_SHIFT),
            kind_code: u64::from((p.meta >> PACKED_LEN_BITS) & 3),
            pfx: p.meta & (1 << 13) != 0,
            rest: &self.names[p.name_at as usize..p.name_at as usize + len],
        }
    }

    /// Into canonical order; unstable, as [`KallsymsSnapshot::sort`], and for the same reason.
    fn sort(&mut self) {
        let mut symbols = std::mem::take(&mut self.symbols);
        symbols.sort_unstable_by(|a, b| self.view(a).cmp_canonical(&self.view(b)));
        self.symbols = symbols;
    }
}

/// The canonical order of symbols: address, core kernel before modules, name, type.
fn sort_key(s: &KernelSymbol) -> (u64, u64, &str, u8) {
    (s.addr, s.module.map_or(0, |m| u64::from(m) + 1), &s.name, s.kind)
}

fn put_opt_build_id(out: &mut Vec<u8>, b: &Option<Vec<u8>>) {
    match b {
        Some(b) => put_bytes(out, &b[..b.len().min(MAX_BUILD_ID_LEN)]),
        None => write_u64(out, 0),
    }
}

fn parse_hex(s: &str) -> Option<u64> {
    let s = s.strip_prefix("0x").unwrap_or(s);
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    u64::from_str_radix(s, 16).ok()
}

/// One kernel symbol. `addr` is absolute, as /proc/kallsyms showed it when the snapshot was taken.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct KernelSymbol {
    pub addr: u64,
    /// kallsyms type letter (`t`, `T`, `w`, ...).
    pub kind: u8,
    pub name: String,
    /// Index into [`KallsymsSnapshot::modules`], or `None` for the core kernel.
    pub module: Option<u32>,
}

/// A loaded module, from /proc/modules and /sys/module/NAME/notes.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct KernelModule {
    pub name: String,
    pub base: u64,
    pub size: u64,
    pub build_id: Option<Vec<u8>>,
}

/// `kallsyms.snap` in each host directory: enough to symbolize kernel samples on another
/// machine. Only text symbols are kept. Binary, checksummed like profiles (FORMAT.md).
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct KallsymsSnapshot {
    pub kernel_release: String,
    pub kernel_build_id: Option<Vec<u8>>,
    /// Address of `_text`; kernel profile offsets are relative to it.
    pub text_base: u64,
    pub modules: Vec<KernelModule>,
    /// Sorted by address.
    pub symbols: Vec<KernelSymbol>,
}

impl KallsymsSnapshot {
    /// Build from the text of /proc/kallsyms and /proc/modules (plus build-ids already read).
    ///
    /// Keeps text symbols (`t T w W`) of the kernel and of modules; drops symbols shown at
    /// address 0 (`kptr_restrict` hides addresses: such a snapshot is empty rather than wrong).
    /// A module named in kallsyms but missing from /proc/modules (`[bpf]`,
    /// `[__builtin__kprobes]`) gets an entry with base and size 0. `text_base` is the address
    /// of `_text`. Lines that do not parse are an `Invalid` error naming the line.
    pub fn from_proc_text(
        kallsyms: &str,
        modules: &str,
        kernel_release: String,
        kernel_build_id: Option<Vec<u8>>,
        module_build_ids: &dyn Fn(&str) -> Option<Vec<u8>>,
    ) -> Result<Self> {
        Self::from_proc_lines(
            kallsyms.lines(),
            modules,
            kernel_release,
            kernel_build_id,
            module_build_ids,
        )
    }

    /// [`Self::from_proc_text`] with /proc/kallsyms given as lines, so that a reader can
    /// stream the file (several MB) instead of holding all of it next to the snapshot.
    pub fn from_proc_lines<S: AsRef<str>>(
        kallsyms: impl Iterator<Item = S>,
        modules: &str,
        kernel_release: String,
        kernel_build_id: Option<Vec<u8>>,
        module_build_ids: &dyn Fn(&str) -> Option<Vec<u8>>,
    ) -> Result<Self> {
        let mut symbols = Vec::new();
        let mut snap = Self::parse_proc(
            kallsyms,
            modules,
            kernel_release,
            kernel_build_id,
            module_build_ids,
            |addr, kind, name, module| {
                symbols.push(KernelSymbol { addr, kind, name: name.to_owned(), module });
                Ok(())
            },
        )?;
        snap.symbols = symbols;
        snap.sort();
        Ok(snap)
    }

    /// The bytes [`Self::to_file_bytes`] gives for [`Self::from_proc_lines`]'s snapshot,
    /// without building that snapshot.
    ///
    /// A decoded snapshot costs ~48 bytes and a name allocation per symbol: on a kernel with
    /// 122 000 text symbols, ~10 MB, most of the daemon's peak RSS (issue 13). Here a symbol
    /// takes 16 bytes while it is sorted, and its name is kept once in one buffer (the name of
    /// a `__pfx_` symbol is shared with its twin's).
    pub fn file_bytes_from_proc_lines<S: AsRef<str>>(
        kallsyms: impl Iterator<Item = S>,
        modules: &str,
        kernel_release: String,
        kernel_build_id: Option<Vec<u8>>,
        module_build_ids: &dyn Fn(&str) -> Option<Vec<u8>>,
    ) -> Result<Vec<u8>> {
        let mut packed = PackedSymbols::default();
        let head = Self::parse_proc(
            kallsyms,
            modules,
            kernel_release,
            kernel_build_id,
            module_build_ids,
            |addr, kind, name, module| packed.push(addr, kind, name, module),
        )?;
        packed.sort();
        let n = packed.symbols.len();
        Ok(head.encode_with(n, packed.symbols.iter().map(|p| packed.view(p))))
    }

    /// The header fields of a snapshot (symbols empty); each text symbol goes to `sym`
    /// (address, type letter, name, module index) in file order.
    fn parse_proc<S: AsRef<str>>(
        kallsyms: impl Iterator<Item = S>,
        modules: &str,
        kernel_release: String,
        kernel_build_id: Option<Vec<u8>>,
        module_build_ids: &dyn Fn(&str) -> Option<Vec<u8>>,
        mut sym: impl FnMut(u64, u8, &str, Option<u32>) -> Result<()>,
    ) -> Result<Self> {
        let mut snap = Self {
            kernel_release,
            kernel_build_id: kernel_build_id
                .filter(|b| !b.is_empty() && b.len() <= MAX_BUILD_ID_LEN),
            ..Default::default()
        };
        let mut index: HashMap<String, u32> = HashMap::new();
        for (lineno, line) in modules.lines().enumerate() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.is_empty() {
                continue;
            }
            let bad = |detail: &str| Error::Invalid {
                what: "/proc/modules line",
                value: format!("{}: {line}", lineno + 1),
                detail: detail.into(),
            };
            if f.len() < 6 {
                return Err(bad("expected `name size refcount deps state address`"));
            }
            let size: u64 = f[1].parse().map_err(|_| bad("size is not a number"))?;
            let base = parse_hex(f[5]).ok_or_else(|| bad("address is not hex"))?;
            let name = f[0].to_owned();
            if index.contains_key(&name) {
                continue;
            }
            index.insert(name.clone(), snap.modules.len() as u32);
            let build_id =
                module_build_ids(&name).filter(|b| !b.is_empty() && b.len() <= MAX_BUILD_ID_LEN);
            snap.modules.push(KernelModule { name, base, size, build_id });
        }
        for (lineno, line) in kallsyms.enumerate() {
            let line = line.as_ref();
            if line.trim().is_empty() {
                continue;
            }
            let bad = |detail: &str| Error::Invalid {
                what: "/proc/kallsyms line",
                value: format!("{}: {}", lineno + 1, line.chars().take(200).collect::<String>()),
                detail: detail.into(),
            };
            let mut it = line.split_whitespace();
            let (Some(addr), Some(kind), Some(name)) = (it.next(), it.next(), it.next()) else {
                return Err(bad("expected `address type name [module]`"));
            };
            let addr = parse_hex(addr).ok_or_else(|| bad("address is not hex"))?;
            let kind = match kind.as_bytes() {
                [k] => *k,
                _ => return Err(bad("type is not one letter")),
            };
            if name == "_text" && kind.eq_ignore_ascii_case(&b't') {
                snap.text_base = addr;
            }
            if !is_text_kind(kind) || addr == 0 {
                continue;
            }
            if name.len() > MAX_SYMBOL_LEN {
                return Err(bad("symbol name longer than 1024 bytes"));
            }
            let module = match it.next() {
                None => None,
                Some(m) => {
                    let m = m
                        .strip_prefix('[')
                        .and_then(|m| m.strip_suffix(']'))
                        .ok_or_else(|| bad("module is not `[name]`"))?;
                    let next = snap.modules.len() as u32;
                    let i = *index.entry(m.to_owned()).or_insert_with(|| {
                        snap.modules.push(KernelModule {
                            name: m.to_owned(),
                            base: 0,
                            size: 0,
                            build_id: None,
                        });
                        next
                    });
                    Some(i)
                }
            };
            sym(addr, kind, name, module)?;
        }
        Ok(snap)
    }

    /// Sort symbols into the canonical order: address, then core kernel before modules, then
    /// name, then type letter. `encode` requires this order; `decode` checks it.
    pub fn sort(&mut self) {
        // The key covers every field, so equal keys are equal symbols and an unstable sort
        // gives the same order; it also needs no scratch buffer (a stable sort of ~120 000
        // symbols allocated ~3 MB, the daemon's largest start-up peak).
        self.symbols.sort_unstable_by(|a, b| sort_key(a).cmp(&sort_key(b)));
    }

    /// Serialize (FORMAT.md "kallsyms.snap"). Symbols must be sorted (see [`Self::sort`]); an
    /// out-of-order symbol is encoded as a delta from 0, which `decode` then rejects.
    pub fn encode(&self) -> Vec<u8> {
        self.encode_with(self.symbols.len(), self.symbols.iter().map(SymbolView::of))
    }

    /// [`Self::encode`] with the symbols given apart (`n` of them, in canonical order).
    fn encode_with<'a>(&self, n: usize, symbols: impl Iterator<Item = SymbolView<'a>>) -> Vec<u8> {
        let mut out = codec::begin(KALLSYMS_MAGIC, KALLSYMS_VERSION);
        put_bytes(&mut out, self.kernel_release.as_bytes());
        put_opt_build_id(&mut out, &self.kernel_build_id);
        write_u64(&mut out, self.text_base);
        write_u64(&mut out, self.modules.len() as u64);
        for m in &self.modules {
            put_bytes(&mut out, m.name.as_bytes());
            write_u64(&mut out, m.base);
            write_u64(&mut out, m.size);
            put_opt_build_id(&mut out, &m.build_id);
        }
        write_u64(&mut out, n as u64);
        let mut prev_addr = 0u64;
        let (mut name, mut prev_name) = (Vec::new(), Vec::new());
        let mut symbols = symbols.peekable();
        while let Some(s) = symbols.next() {
            let derived = s.is_pfx_twin_of(symbols.peek());
            write_u64(&mut out, (s.module_tag << 3) | (u64::from(derived) << 2) | s.kind_code);
            write_u64(&mut out, s.addr.wrapping_sub(prev_addr));
            prev_addr = s.addr;
            if derived {
                continue;
            }
            s.full_name(&mut name);
            let shared = name.iter().zip(&prev_name).take_while(|(a, b)| a == b).count();
            write_u64(&mut out, shared as u64);
            put_bytes(&mut out, &name[shared..]);
            std::mem::swap(&mut name, &mut prev_name);
        }
        codec::finish(out)
    }

    /// Parse and validate; `path` is only used to name the file in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self> {
        let payload =
            codec::open(bytes, path, KALLSYMS_MAGIC, "kallsyms snapshot", KALLSYMS_VERSION)?;
        let mut r = Reader::new(payload, path);
        let kernel_release = r.string("kernel_release")?;
        let kernel_build_id = r.opt_build_id("kernel_build_id")?;
        let text_base = r.varint("text_base")?;
        let nmod = r.count("modules", 4)?;
        let mut modules = Vec::with_capacity(nmod);
        for _ in 0..nmod {
            let name = r.string("modules.name")?;
            let base = r.varint("modules.base")?;
            let size = r.varint("modules.size")?;
            let build_id = r.opt_build_id("modules.build_id")?;
            modules.push(KernelModule { name, base, size, build_id });
        }
        let nsym = r.count("symbols", 2)?;
        let mut symbols: Vec<KernelSymbol> = Vec::with_capacity(nsym);
        let mut derived_flags = Vec::with_capacity(nsym);
        let mut addr = 0u64;
        let mut name: Vec<u8> = Vec::new();
        for i in 0..nsym {
            let tag = r.varint("symbols.kind")?;
            let kind = KIND_LETTERS[(tag & 3) as usize];
            let derived = tag & 4 != 0;
            let module = match tag >> 3 {
                0 => None,
                m if m <= modules.len() as u64 => Some((m - 1) as u32),
                m => {
                    return Err(
                        r.corrupt("symbols.module", format!("module {m} of {}", modules.len()))
                    )
                }
            };
            let delta = r.varint("symbols.addr")?;
            addr = addr
                .checked_add(delta)
                .ok_or_else(|| r.corrupt("symbols.addr", "address exceeds 64 bits"))?;
            derived_flags.push(derived);
            if derived {
                if i > 0 && derived_flags[i - 1] {
                    return Err(r.corrupt("symbols.name", "two derived `__pfx_` names in a row"));
                }
                symbols.push(KernelSymbol { addr, kind, name: String::new(), module });
                continue;
            }
            let shared = r.varint("symbols.name")?;
            if shared > name.len() as u64 {
                return Err(r.corrupt(
                    "symbols.name",
                    format!("shares {shared} bytes with a {}-byte name", name.len()),
                ));
            }
            let suffix = r.bytes("symbols.name")?;
            // The encoder shares the longest common prefix; anything else is not canonical.
            if let (Some(a), Some(b)) = (name.get(shared as usize), suffix.first()) {
                if a == b {
                    return Err(r.corrupt("symbols.name", "prefix sharing is not maximal"));
                }
            }
            if shared as usize + suffix.len() > MAX_SYMBOL_LEN {
                return Err(r.corrupt("symbols.name", format!("name longer than {MAX_SYMBOL_LEN}")));
            }
            name.truncate(shared as usize);
            name.extend_from_slice(suffix);
            let text = std::str::from_utf8(&name)
                .map_err(|e| r.corrupt("symbols.name", format!("not UTF-8: {e}")))?;
            if i > 0 && derived_flags[i - 1] {
                if text.starts_with(PFX) {
                    return Err(r.corrupt("symbols.name", "derived name of a `__pfx_` name"));
                }
                symbols[i - 1].name = format!("{PFX}{text}");
            }
            symbols.push(KernelSymbol { addr, kind, name: text.to_owned(), module });
        }
        if derived_flags.last() == Some(&true) {
            return Err(r.corrupt("symbols.name", "last symbol has a derived name"));
        }
        for i in 0..symbols.len() {
            let next = symbols.get(i + 1);
            if !derived_flags[i] && is_pfx_twin(&symbols[i], next) {
                return Err(r.corrupt("symbols.name", format!("symbol {i}: name not derived")));
            }
            if let Some(next) = next {
                if sort_key(&symbols[i]) > sort_key(next) {
                    return Err(r.corrupt("symbols", format!("symbol {} out of order", i + 1)));
                }
            }
        }
        r.finish()?;
        Ok(Self { kernel_release, kernel_build_id, text_base, modules, symbols })
    }

    pub fn read(path: &Path) -> Result<Self> {
        let bytes = safeio::read_container(path, KALLSYMS_MAGIC, "kallsyms", KALLSYMS_VERSION)?;
        Self::decode(&bytes, path)
    }

    /// Write atomically, symbols in canonical order.
    pub fn write(&self, path: &Path) -> Result<()> {
        atomic::write_atomic(path, &self.to_file_bytes(path)?)
    }

    /// The file's bytes as [`Self::write`] would write them, after the same checks (`path` is
    /// only named in the error). A writer that keeps a snapshot for long can keep these bytes
    /// instead of the snapshot: they are several times smaller.
    pub fn to_file_bytes(&self, path: &Path) -> Result<Vec<u8>> {
        let sorted = self.symbols.windows(2).all(|w| sort_key(&w[0]) <= sort_key(&w[1]));
        let bad_module =
            self.symbols.iter().any(|s| s.module.is_some_and(|m| m as usize >= self.modules.len()));
        let bad_kind =
            self.symbols.iter().any(|s| !is_text_kind(s.kind) || s.name.len() > MAX_SYMBOL_LEN);
        if bad_module || bad_kind {
            return Err(Error::Invalid {
                what: "kallsyms snapshot",
                value: path.display().to_string(),
                detail: "a symbol has a non-text type, a name over 1024 bytes, or names a missing module"
                    .into(),
            });
        }
        if sorted {
            Ok(self.encode())
        } else {
            let mut copy = self.clone();
            copy.sort();
            Ok(copy.encode())
        }
    }

    /// The module whose [base, base+size) holds `addr`.
    pub fn module_containing(&self, addr: u64) -> Option<u32> {
        self.modules
            .iter()
            .position(|m| m.size > 0 && addr >= m.base && addr - m.base < m.size)
            .map(|i| i as u32)
    }

    /// The symbol containing `addr` (greatest symbol address <= addr, same module).
    ///
    /// An address inside a module's range only matches that module's symbols; an address
    /// outside every module only matches core-kernel symbols (or symbols of size-less
    /// pseudo-modules such as `[bpf]`).
    pub fn lookup(&self, addr: u64) -> Option<&KernelSymbol> {
        let end = self.symbols.partition_point(|s| s.addr <= addr);
        let candidate = self.symbols[..end].last()?;
        let owner = self.module_containing(addr);
        let ok = match (owner, candidate.module) {
            (Some(o), Some(m)) => o == m,
            (Some(_), None) => false,
            (None, None) => true,
            (None, Some(m)) => self.modules.get(m as usize).is_some_and(|m| m.size == 0),
        };
        if ok {
            // Several symbols can share an address; prefer the first in canonical order.
            let first = self.symbols[..end].partition_point(|s| s.addr < candidate.addr);
            self.symbols[first..end].iter().find(|s| s.module == candidate.module)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KALLSYMS: &str = "\
0000000000000000 A fixed_percpu_data
ffffffff81000000 T _text
ffffffff81000000 T startup_64
ffffffff81000070 T secondary_startup_64
ffffffff81001000 t early_idt_handler
ffffffff82000000 D some_data
ffffffff81002000 W weak_fn
ffffffffc0a00000 t nft_do_chain\t[nf_tables]
ffffffffc0a00100 T nft_register\t[nf_tables]
ffffffffc0b00000 t bpf_prog_1\t[bpf]
";
    const MODULES: &str = "nf_tables 364544 0 - Live 0xffffffffc0a00000\n";

    fn snap() -> KallsymsSnapshot {
        KallsymsSnapshot::from_proc_text(
            KALLSYMS,
            MODULES,
            "6.18.0".into(),
            Some(vec![1, 2, 3]),
            &|m| (m == "nf_tables").then(|| vec![9; 20]),
        )
        .unwrap()
    }

    #[test]
    fn parses_keeps_text_only() {
        let s = snap();
        assert_eq!(s.text_base, 0xffffffff81000000);
        let names: Vec<&str> = s.symbols.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "_text",
                "startup_64",
                "secondary_startup_64",
                "early_idt_handler",
                "weak_fn",
                "nft_do_chain",
                "nft_register",
                "bpf_prog_1"
            ]
        );
        assert_eq!(s.modules.len(), 2);
        assert_eq!(s.modules[0].build_id, Some(vec![9; 20]));
        assert_eq!(s.modules[1].name, "bpf");
        let back = KallsymsSnapshot::decode(&s.encode(), Path::new("k")).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn lookup_respects_modules() {
        let s = snap();
        assert_eq!(s.lookup(0xffffffff81000080).unwrap().name, "secondary_startup_64");
        assert_eq!(s.lookup(0xffffffff81000000).unwrap().name, "_text");
        assert_eq!(s.lookup(0xffffffffc0a00150).unwrap().name, "nft_register");
        assert!(s.lookup(0xffffffff80000000).is_none());
        // Inside nf_tables' range but before its first symbol.
        let mut s2 = s.clone();
        s2.modules[0].base = 0xffffffffc09ff000;
        assert!(s2.lookup(0xffffffffc09ff010).is_none());
        assert_eq!(s.lookup(0xffffffffc0b00004).unwrap().name, "bpf_prog_1");
    }

    #[test]
    fn bad_lines_are_errors() {
        let e = KallsymsSnapshot::from_proc_text("zzz T x\n", "", String::new(), None, &|_| None);
        assert!(e.unwrap_err().to_string().contains("1: zzz"));
        let e = KallsymsSnapshot::from_proc_text("", "m 1 2\n", String::new(), None, &|_| None);
        assert!(e.is_err());
    }
}

#[cfg(test)]
mod packed_tests {
    use super::*;
    use proptest::prelude::*;

    fn both(kallsyms: &str, modules: &str) -> (Vec<u8>, Vec<u8>) {
        let ids = |m: &str| (m == "m1").then(|| vec![4; 20]);
        let slow =
            KallsymsSnapshot::from_proc_text(kallsyms, modules, "r".into(), Some(vec![1]), &ids)
                .unwrap()
                .to_file_bytes(Path::new("k"))
                .unwrap();
        let fast = KallsymsSnapshot::file_bytes_from_proc_lines(
            kallsyms.lines(),
            modules,
            "r".into(),
            Some(vec![1]),
            &ids,
        )
        .unwrap();
        (slow, fast)
    }

    #[test]
    fn same_bytes_as_the_decoded_snapshot() {
        // Out of order, ties on address with every key field differing, `__pfx_` twins (and
        // one without its twin, one whose twin is at another address), a name repeated.
        let text = "\
ffffffffc0a00010 t __pfx_mod_fn\t[m1]
ffffffffc0a00020 t mod_fn\t[m1]
ffffffff81000000 T _text
ffffffff81000010 t __pfx_foo
ffffffff81000020 t foo
ffffffff81000020 T foo
ffffffff81000020 W foo
ffffffff81000020 t foo\t[bpf]
ffffffff81000020 t bar
ffffffff81000030 t __pfx_lonely
ffffffff81000040 t __pfx_split
ffffffff81000050 t split
ffffffff81000060 t __pfx___pfx_x
ffffffff81000070 t __pfx_x
ffffffff81000008 w early
ffffffff81000008 d data
ffffffffc0a00000 t mod_fn\t[m1]
";
        let (slow, fast) = both(text, "m1 4096 0 - Live 0xffffffffc0a00000\n");
        assert_eq!(slow, fast);
        let back = KallsymsSnapshot::decode(&fast, Path::new("k")).unwrap();
        assert_eq!(back.symbols.len(), 16);
    }

    #[test]
    fn same_errors_as_the_decoded_snapshot() {
        for bad in ["zzz T x\n", "ffff t\n", "ffff tt x\n", "ffff t x m1\n"] {
            let slow = KallsymsSnapshot::from_proc_text(bad, "", "r".into(), None, &|_| None)
                .unwrap_err()
                .to_string();
            let fast = KallsymsSnapshot::file_bytes_from_proc_lines(
                bad.lines(),
                "",
                "r".into(),
                None,
                &|_| None,
            )
            .unwrap_err()
            .to_string();
            assert_eq!(slow, fast);
        }
    }

    fn line() -> impl Strategy<Value = String> {
        let addr = prop_oneof![Just(0u64), 0xffffffff81000000u64..0xffffffff81000010];
        let kind = prop::sample::select(vec!['t', 'T', 'w', 'W', 'd', 'A']);
        let name = prop::sample::select(vec!["a", "ab", "b", "__pfx_a", "__pfx_ab", "__pfx_", "_"]);
        let module = prop::sample::select(vec!["", "\t[m1]", "\t[m2]", "\t[bpf]"]);
        (addr, kind, name, module).prop_map(|(a, k, n, m)| format!("{a:016x} {k} {n}{m}"))
    }

    proptest! {
        #[test]
        fn same_bytes_for_any_order_and_ties(lines in prop::collection::vec(line(), 0..40)) {
            let text = lines.join("\n");
            let (slow, fast) = both(&text, "m1 16 0 - Live 0xffffffff81000004\n");
            prop_assert_eq!(slow, fast);
        }
    }
}
