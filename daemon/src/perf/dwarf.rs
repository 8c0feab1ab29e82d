//! DWARF CFI unwinding of copied user stacks (`callchains = "dwarf"`).
//!
//! With `callchains = "dwarf"` the kernel gives each sample its kernel chain only
//! (`PERF_SAMPLE_CALLCHAIN` with `exclude_callchain_user`), the user registers bp, sp and ip
//! (`PERF_SAMPLE_REGS_USER`) and a copy of the top of the user stack (`PERF_SAMPLE_STACK_USER`,
//! `sample_user_stack` bytes). A drain thread unwinds that copy right away with the `.eh_frame`
//! (through `.eh_frame_hdr`) or `.debug_frame` of the images mapped at the frames' addresses,
//! using [framehop] (what samply uses), and interns the merged kernel + user stack in its CPU's
//! stack table as frame-pointer stacks are: the stack copy never leaves the drain thread, and a
//! hot stack still costs one increment.
//!
//! Why on the drain thread and not later: the copy is 8 KiB a sample; to unwind later it
//! would have to be kept (8 MB/s per busy CPU at 1 kHz) until then, and stacks could not be
//! interned before. What unwinding a stack of depth 20 with warm tables costs is measured by
//! `cargo bench -p dcpi-daemon --bench unwind` (a real stack of that bench binary; issue 37's
//! target is 1 µs, against the 15-25 µs the sample itself costs here, MACHINE-FACTS.md). What is slow is loading a process's tables (reading its
//! maps and its images' sections) the first time it is sampled on a CPU: that is done once
//! per process per CPU, and the sections once per image (build-id) for every CPU and process.
//!
//! Unwind tables: the sections of an image are read once per build-id (or device and inode
//! when it has none) through `/proc/PID/map_files/START-END` (which opens the mapped file even
//! if deleted or replaced, never a path an untrusted process may have swapped), copied (not
//! mapped: a file truncated under a mapping would raise SIGBUS in the daemon), and kept in an
//! [`ImageCache`] shared by every CPU, bounded in bytes (least recently used out first).
//! Each CPU keeps, per process, a framehop unwinder with one module per executable mapping,
//! pointing at those shared sections.
//!
//! Hostile input: an image's CFI, maps and stack are untrusted. Every section is bounded in
//! size, each stack read is checked against the copy, framehop refuses a frame that does not
//! move the stack pointer up, and a stack has at most `max_stack` frames: a bad table ends
//! the stack, counted as truncated, never a crash or a loop.

use std::fs::File;
use std::ops::{Deref, Range};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use hashbrown::HashMap;
use object::elf::{FileHeader64, PF_X, PT_LOAD, SHF_COMPRESSED};
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};
use object::read::ReadCache;
use object::Endianness;

use crate::perf::records::UserRegs;
use crate::resolve::identity;
use crate::resolve::maps::parse_maps_line;
use crate::resolve::procfs;

/// Default bytes of user stack copied per sample. 8 KiB is perf's default; measured here on
/// the e2e call trees and on libc-heavy code, stacks of depth 20-30 fit; deeper ones end as
/// truncated. The kernel allows up to [`MAX_USER_STACK`].
pub const DEFAULT_USER_STACK: u32 = 8192;
/// Largest `sample_user_stack` (the kernel's limit: a record's size is a u16).
pub const MAX_USER_STACK: u32 = 65528;
/// Default bound on the unwind sections kept in memory, all images together.
pub const DEFAULT_CACHE_BYTES: usize = 32 << 20;
/// A section larger than this is not loaded (the image unwinds through frame pointers only).
const MAX_SECTION_BYTES: u64 = 32 << 20;
/// Processes whose unwinders one CPU keeps references to; past it they are looked up again.
const MAX_PROCS_PER_CPU: usize = 1024;
/// Executable mappings taken from one process's maps at most.
const MAX_MODULES: usize = 4096;
/// A process's maps are read again at most this often when a pc is outside every module
/// (a library loaded since: its MMAP2 may have gone to another CPU's ring).
const RELOAD_GAP: Duration = Duration::from_millis(500);
/// Bytes of `/proc/PID/maps` read at most.
const MAPS_LIMIT: u64 = 8 << 20;

/// Section bytes shared by every module of one image.
#[derive(Clone, Debug)]
pub struct Bytes(Arc<[u8]>);

impl Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

/// What unwinding needs of one image.
#[derive(Debug, Default)]
pub struct ImageTables {
    eh_frame: Option<(Range<u64>, Bytes)>,
    eh_frame_hdr: Option<(Range<u64>, Bytes)>,
    debug_frame: Option<Bytes>,
    text_svma: Option<Range<u64>>,
    got_svma: Option<Range<u64>>,
    /// `PT_LOAD` segments: (file offset, file size, vaddr, executable), to place the image's
    /// addresses.
    loads: Vec<(u64, u64, u64, bool)>,
    bytes: usize,
    /// The functions (svma start, end; sorted) whose CFI makes `rbp` the frame register
    /// ([`fp_scan`]): with `callchains = "auto"` a caller's frame in one of them is stepped by
    /// frame pointer, which is what its CFI says, without evaluating the CFI.
    fp_funcs: Vec<(u64, u64)>,
    /// What [`fp_scan`] counted of its `.eh_frame` (diagnostics, benches).
    fp: FpShare,
}

impl ImageTables {
    /// Parse an ELF image's unwind sections. `None` for anything that is not a 64-bit ELF.
    pub fn parse(data: &[u8]) -> Option<Self> {
        Self::from_elf(data)
    }

    /// Only the headers, the section names and the unwind sections are read: not the symbol
    /// tables (`object::File::parse` reads them all, and a loader reading `librustc_driver`'s
    /// took most of a CPU on a machine running compilers).
    fn from_elf<'d, R: object::ReadRef<'d>>(data: R) -> Option<Self> {
        let h = FileHeader64::<Endianness>::parse(data).ok()?;
        let endian = h.endian().ok()?;
        let sections = h.sections(endian, data).ok()?;
        let mut t = Self::default();
        let mut bytes = 0usize;
        let mut section = |name: &[u8]| -> Option<(Range<u64>, Bytes)> {
            let (_, sh) = sections.section_by_name(endian, name)?;
            let (addr, size) = (sh.sh_addr(endian), sh.sh_size(endian));
            // Compressed (.debug_frame of some distributions) is left out: inflating
            // untrusted data is a cost this path does not take.
            if size == 0 || size > MAX_SECTION_BYTES || sh.sh_flags(endian).contains(SHF_COMPRESSED)
            {
                return None;
            }
            let d = sh.data(endian, data).ok()?;
            if d.is_empty() {
                return None;
            }
            bytes += d.len();
            Some((addr..addr.checked_add(size)?, Bytes(Arc::from(d))))
        };
        t.eh_frame = section(b".eh_frame");
        t.eh_frame_hdr = section(b".eh_frame_hdr");
        t.debug_frame = section(b".debug_frame").map(|(_, b)| b);
        let range = |name: &[u8]| {
            let (_, sh) = sections.section_by_name(endian, name)?;
            let a = sh.sh_addr(endian);
            Some(a..a.checked_add(sh.sh_size(endian))?)
        };
        t.text_svma = range(b".text");
        t.got_svma = range(b".got");
        t.bytes = bytes;
        if let Some((r, b)) = &t.eh_frame {
            let (share, funcs) = fp_scan(b, r.start);
            t.bytes += funcs.len() * std::mem::size_of::<(u64, u64)>();
            (t.fp, t.fp_funcs) = (share, funcs);
        }
        for ph in h.program_headers(endian, data).ok()? {
            if ph.p_type(endian) == PT_LOAD {
                let exec = ph.p_flags(endian).contains(PF_X);
                t.loads.push((ph.p_offset(endian), ph.p_filesz(endian), ph.p_vaddr(endian), exec));
            }
        }
        Some(t)
    }

    /// The load bias of an executable mapping of file offset `pgoff` at `start`: what is added
    /// to the image's addresses to give the process's. `None` if no segment holds that offset.
    ///
    /// The executable segment that holds the offset, before any other: lld (rustc's default
    /// linker since 1.90) packs segments so that one file page holds the end of the read-only
    /// segment and the start of the text (file offset 0x130980 at vaddr 0x131980), and the
    /// text's mapping then starts at a page the read-only segment holds too, whose vaddr is
    /// one page off. Taking the first segment that held the page put every address of such an
    /// image a page off, so no pc found its FDE (a release Rust binary unwound through frame
    /// pointers only: the unwind bench's stack stopped at its first frame without one).
    fn bias(&self, start: u64, pgoff: u64) -> Option<u64> {
        let holds = |&&(off, size, _, _): &&(u64, u64, u64, bool)| {
            pgoff >= off & !0xfff && pgoff < off.saturating_add(size)
        };
        let &(off, _, vaddr, _) = self
            .loads
            .iter()
            .filter(|l| l.3)
            .find(holds)
            .or_else(|| self.loads.iter().find(holds))?;
        // Address of file offset pgoff = vaddr + (pgoff - off) + bias = start.
        Some(start.wrapping_sub(vaddr.wrapping_add(pgoff.wrapping_sub(off))))
    }

    /// A framehop module for a mapping `avma` whose image addresses are offset by `bias`.
    fn module(&self, name: &str, avma: Range<u64>, bias: u64) -> Module<Bytes> {
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: self.text_svma.clone(),
            got_svma: self.got_svma.clone(),
            eh_frame_svma: self.eh_frame.as_ref().map(|(r, _)| r.clone()),
            eh_frame: self.eh_frame.as_ref().map(|(_, b)| b.clone()),
            eh_frame_hdr_svma: self.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
            eh_frame_hdr: self.eh_frame_hdr.as_ref().map(|(_, b)| b.clone()),
            debug_frame: self.debug_frame.clone(),
            stubs_svma: None,
            stub_helper_svma: None,
            unwind_info: None,
            text: None,
            text_segment_svma: None,
            text_segment: None,
        };
        Module::new(name.to_string(), avma, bias, info)
    }

    /// Bytes of section data held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Tables with no CFI of an image whose code at `svma` keeps frame pointers (benches,
    /// tests): as one frame-pointer function.
    pub fn frame_pointers_only(svma: Range<u64>) -> Self {
        Self { fp_funcs: vec![(svma.start, svma.end)], ..Self::default() }
    }

    /// Its `.eh_frame` (svma, bytes), if loaded.
    pub fn eh_frame_section(&self) -> Option<(u64, &[u8])> {
        self.eh_frame.as_ref().map(|(r, b)| (r.start, &b[..]))
    }

    /// How many of its functions keep frame pointers, by their `.eh_frame` (read at load).
    pub fn fp_share(&self) -> FpShare {
        self.fp
    }

    /// Whether the function at image address `svma` keeps a frame pointer (its CFI says so).
    fn fp_func(&self, svma: u64) -> bool {
        let i = self.fp_funcs.partition_point(|&(start, _)| start <= svma);
        i > 0 && svma < self.fp_funcs[i - 1].1
    }
}

/// How many of an image's functions (FDEs of its `.eh_frame`) keep a frame pointer: their CFI
/// makes `rbp` the CFA register (`DW_CFA_def_cfa_register rbp` after `push %rbp; mov
/// %rsp,%rbp`, what gcc and clang emit with `-fno-omit-frame-pointer` and rustc with
/// `-C force-frame-pointers`). Code built without frame pointers does so only in the few
/// functions that realign the stack or call `alloca`.
///
/// Only functions with a frame count: those whose CFI moves the CFA at all (pushes, stack
/// adjustments). A frameless function (no CFA change: a leaf with no stack use, gcc's choice
/// at -O2 even with `-fno-omit-frame-pointer`) is never a caller, so never stepped by frame
/// pointer (the leaf always goes through CFI, [`walk`]), and PLT stubs (a CFA expression) only
/// jump. In a small program they are most FDEs (crt's, the PLT's, frameless leaves).
///
/// Why from the CFI and not from the code: the section is already read for unwinding, the
/// answer needs no disassembly (one pass over the FDEs' first instructions), and what the CFI
/// says of a function is what a CFI unwinder would do there anyway. The decision is per
/// function, not per image: measured (BENCHMARKS.md "callchains = auto"), builds without frame
/// pointers keep one in 5-20 % of their framed code (realigned stacks: libc 20.7 %, a release
/// dcpid 18.2 %), and a build with them still had 15 % without (Debian's perf, 84.8 %): an
/// image-wide verdict would step those functions wrongly, or miss those that do keep one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FpShare {
    /// FDEs read.
    pub fdes: u64,
    /// Of those, FDEs of functions with a frame (their CFA moves by a register rule).
    pub framed: u64,
    /// Of those, FDEs whose CFA moves to `rbp`.
    pub rbp_fdes: u64,
    /// Code bytes the framed FDEs cover, and of those the bytes of `rbp` FDEs.
    pub bytes: u64,
    pub rbp_bytes: u64,
}

/// [`FpShare`] of an `.eh_frame` at `svma`, and the functions (svma start, end; sorted) that
/// keep a frame pointer. Untrusted input: every entry is parsed by gimli with bounds checks,
/// at most [`FP_SCAN_INSNS`] instructions of each FDE are read (a prologue's CFA change is
/// among its first), and an unparsable entry ends the scan. A hostile table can only make
/// frames of its own image step by frame pointer, which is bounded like any step
/// ([`walk`]).
pub fn fp_scan(eh_frame: &[u8], svma: u64) -> (FpShare, Vec<(u64, u64)>) {
    use gimli::{CallFrameInstruction, CieOrFde, UnwindSection};
    let eh = gimli::EhFrame::new(eh_frame, gimli::LittleEndian);
    let bases = gimli::BaseAddresses::default().set_eh_frame(svma);
    let mut entries = eh.entries(&bases);
    let mut share = FpShare::default();
    let mut funcs = Vec::new();
    // The CIE of an FDE is parsed once per distinct offset (an image has one or a few).
    let mut cies: Vec<(gimli::EhFrameOffset<usize>, gimli::CommonInformationEntry<_>)> = Vec::new();
    while let Ok(Some(e)) = entries.next() {
        let CieOrFde::Fde(partial) = e else { continue };
        let fde = partial.parse(|sec, b, off| {
            if let Some((_, c)) = cies.iter().find(|(o, _)| *o == off) {
                return Ok(c.clone());
            }
            let c = sec.cie_from_offset(b, off)?;
            if cies.len() < 64 {
                cies.push((off, c.clone()));
            }
            Ok(c)
        });
        let Ok(fde) = fde else { continue };
        let len = fde.len();
        let mut insns = fde.instructions(&eh, &bases);
        let (mut framed, mut rbp) = (false, false);
        for _ in 0..FP_SCAN_INSNS {
            match insns.next() {
                Ok(Some(
                    CallFrameInstruction::DefCfa { register, .. }
                    | CallFrameInstruction::DefCfaRegister { register },
                )) if register == gimli::X86_64::RBP => {
                    (framed, rbp) = (true, true);
                    break;
                }
                Ok(Some(
                    CallFrameInstruction::DefCfa { .. }
                    | CallFrameInstruction::DefCfaRegister { .. }
                    | CallFrameInstruction::DefCfaOffset { .. }
                    | CallFrameInstruction::DefCfaSf { .. }
                    | CallFrameInstruction::DefCfaOffsetSf { .. },
                )) => framed = true,
                // A PLT's CFA expression: stubs that jump, never callers.
                Ok(Some(CallFrameInstruction::DefCfaExpression { .. })) => {
                    framed = false;
                    break;
                }
                Ok(Some(_)) => {}
                _ => break,
            }
        }
        share.fdes += 1;
        if !framed {
            continue;
        }
        share.framed += 1;
        share.bytes = share.bytes.saturating_add(len);
        if rbp {
            let start = fde.initial_address();
            funcs.push((start, start.saturating_add(len)));
            share.rbp_fdes += 1;
            share.rbp_bytes = share.rbp_bytes.saturating_add(len);
        }
    }
    funcs.sort_unstable();
    (share, funcs)
}

/// CFI instructions of an FDE read at most by [`fp_scan`].
const FP_SCAN_INSNS: usize = 16;

/// Cache key of an image: its build-id, or (device, inode) when it has none.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum ImageKey {
    BuildId(Vec<u8>),
    Inode(u32, u32, u64),
}

#[derive(Debug, Default)]
struct CacheInner {
    map: HashMap<ImageKey, (Arc<ImageTables>, u64)>,
    bytes: usize,
    tick: u64,
}

/// Unwind tables of every image, shared by every CPU, bounded in bytes (LRU).
#[derive(Debug)]
pub struct ImageCache {
    inner: Mutex<CacheInner>,
    limit: usize,
}

/// Counters of the DWARF path, for status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct UnwindCounters {
    /// Samples whose user stack was unwound with CFI.
    pub unwound: u64,
    /// Samples of a process whose unwinder was not loaded yet (frame pointers only).
    pub not_loaded: u64,
    /// Samples whose user stack did not reach a root (the copy's end, the depth bound, a
    /// frame the tables could not unwind).
    pub truncated: u64,
    /// Of those, stacks whose next frame lay beyond the copied `sample_user_stack` bytes.
    /// Measured on a loaded 2-CPU machine (rustc, LLVM, a debug dcpid): most truncated
    /// stacks end so, being deeper than 8 KiB in bytes (perf's default copy cuts them too);
    /// a small C program's reach `_start` (0.1 % ended early, `dcpiprof --stack-health`).
    pub truncated_copy_end: u64,
    /// Of those, stacks cut by the depth bound.
    pub truncated_depth: u64,
    /// Time spent unwinding and loading, in ns.
    pub unwind_ns: u64,
    /// `callchains = "auto"`: frames stepped by frame pointer (in functions whose CFI keeps
    /// one) rather than by evaluating CFI.
    pub fp_steps: u64,
}

impl ImageCache {
    pub fn new(limit: usize) -> Self {
        Self { inner: Mutex::new(CacheInner::default()), limit }
    }

    /// The tables of the image opened as `file` (dev/inode from the maps line).
    fn get_or_load(&self, file: File, dev: (u32, u32), inode: u64) -> Option<Arc<ImageTables>> {
        let key = match file.try_clone().ok().and_then(identity::read_build_id) {
            Some(id) => ImageKey::BuildId(id),
            None => ImageKey::Inode(dev.0, dev.1, inode),
        };
        {
            let mut g = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            g.tick += 1;
            let tick = g.tick;
            if let Some((t, used)) = g.map.get_mut(&key) {
                *used = tick;
                return Some(Arc::clone(t));
            }
        }
        let data = ReadCache::new(file);
        let t = Arc::new(ImageTables::from_elf(&data)?);
        self.insert(key, Arc::clone(&t));
        Some(t)
    }

    fn insert(&self, key: ImageKey, t: Arc<ImageTables>) {
        let mut g = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        g.tick += 1;
        let tick = g.tick;
        let b = t.bytes;
        if let Some((old, _)) = g.map.insert(key, (t, tick)) {
            g.bytes -= old.bytes;
        }
        g.bytes += b;
        // Evict least recently used until within the bound (the new one stays even if alone
        // it is larger: modules already built keep their sections alive anyway).
        while g.bytes > self.limit && g.map.len() > 1 {
            let Some(k) = g
                .map
                .iter()
                .filter(|(_, (_, u))| *u != tick)
                .min_by_key(|(_, (_, u))| *u)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((old, _)) = g.map.remove(&k) {
                g.bytes -= old.bytes;
            }
        }
    }

    /// Bytes held and images cached.
    pub fn usage(&self) -> (usize, usize) {
        let g = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (g.bytes, g.map.len())
    }
}

/// One process's unwinder: a module per executable mapping with unwind tables. Shared by
/// every CPU (framehop unwinds through `&self`).
pub struct ProcUnwinder {
    unwinder: UnwinderX86_64<Bytes>,
    /// Every executable mapping (with a module or not, e.g. JIT code): a pc outside all of
    /// them means the maps changed since.
    ranges: Vec<Range<u64>>,
    /// The mappings of images with frame-pointer functions ([`ImageTables::fp_func`]),
    /// sorted by address: `callchains = "auto"` steps those functions' frames by frame pointer.
    fp_maps: Vec<FpMap>,
    loaded_at: Instant,
}

impl std::fmt::Debug for ProcUnwinder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcUnwinder").field("ranges", &self.ranges.len()).finish_non_exhaustive()
    }
}

impl ProcUnwinder {
    fn empty() -> Self {
        Self {
            unwinder: UnwinderX86_64::new(),
            ranges: Vec::new(),
            fp_maps: Vec::new(),
            loaded_at: Instant::now(),
        }
    }

    fn covers(&self, pc: u64) -> bool {
        self.ranges.iter().any(|r| r.contains(&pc))
    }
}

/// A mapping of an image with frame-pointer functions.
#[derive(Clone)]
struct FpMap {
    avma: Range<u64>,
    /// Added to the image's addresses to give the process's.
    bias: u64,
    tables: Arc<ImageTables>,
}

impl ProcUnwinder {
    /// Whether the function at `pc` keeps a frame pointer (two binary searches).
    fn fp_frame(&self, pc: u64) -> bool {
        let i = self.fp_maps.partition_point(|m| m.avma.start <= pc);
        let Some(m) = i.checked_sub(1).map(|i| &self.fp_maps[i]) else { return false };
        m.avma.contains(&pc) && m.tables.fp_func(pc.wrapping_sub(m.bias))
    }

    fn add_fp_map(&mut self, avma: Range<u64>, bias: u64, tables: Arc<ImageTables>) {
        if !tables.fp_funcs.is_empty() {
            self.fp_maps.push(FpMap { avma, bias, tables });
        }
    }
}

/// Where a process's maps and mapped files are read (a test points it elsewhere).
#[derive(Clone, Debug)]
pub struct ProcRoot(pub PathBuf);

impl Default for ProcRoot {
    fn default() -> Self {
        Self(PathBuf::from("/proc"))
    }
}

#[derive(Default)]
struct Procs {
    map: HashMap<u32, Arc<ProcUnwinder>>,
    /// Asked of the loader and not yet loaded.
    pending: hashbrown::HashSet<u32>,
}

/// What every CPU's unwinder shares: the image cache, the processes' unwinders and the
/// loader thread that builds them.
pub struct DwarfShared {
    images: ImageCache,
    procs: Mutex<Procs>,
    root: ProcRoot,
    /// Requests to the loader thread (bounded: a full queue drops the request, asked again
    /// at a later sample).
    tx: Option<std::sync::mpsc::SyncSender<u32>>,
    procs_loaded: AtomicU64,
    /// The vDSO's unwind tables, read once from dcpid's own (the same kernel maps the same
    /// image into every 64-bit process); `None` inside if it cannot be read.
    vdso: std::sync::OnceLock<Option<(u64, Arc<ImageTables>)>>,
    /// Loads that panicked (a bug on some image or maps): that process unwinds through
    /// frame pointers only; the loader goes on with the next.
    load_panics: AtomicU64,
    /// The loader thread ended while the tables lived (it should not): every process not
    /// loaded by then unwinds through frame pointers only. Said in status and logged once.
    loader_dead: AtomicBool,
    /// Test-only: called by the loader before each load; it may panic (a failed load), or
    /// return true to end the loader (a thread that died).
    #[cfg(test)]
    fault: Option<fn(u32) -> bool>,
}

/// The loader's state, for status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LoaderState {
    pub procs_loaded: u64,
    /// Processes waiting for the loader.
    pub queued: u64,
    pub load_panics: u64,
    pub running: bool,
    pub cache_bytes: u64,
    pub cache_limit: u64,
    pub images: u64,
}

/// Marks the loader dead when its thread ends by any way but the tables going away.
struct LoaderGuard(std::sync::Weak<DwarfShared>);

impl Drop for LoaderGuard {
    fn drop(&mut self) {
        if let Some(sh) = self.0.upgrade() {
            sh.loader_dead.store(true, Ordering::Release);
            tracing::error!(
                thread = LOADER_THREAD,
                "the unwind-table loader ended: processes not loaded yet unwind through frame \
                 pointers only (callchains = \"dwarf\" degraded to \"fp\" for them)"
            );
        }
    }
}

impl std::fmt::Debug for DwarfShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DwarfShared").field("images", &self.images).finish_non_exhaustive()
    }
}

/// Thread name of the loader.
pub const LOADER_THREAD: &str = "dcpi-unwind-load";
/// Processes whose unwinders are kept at most; past it the one loaded longest ago goes.
const MAX_PROCS: usize = 4096;

impl DwarfShared {
    /// Shared state with a loader thread reading processes' maps and images under `root`.
    pub fn start(cache_bytes: usize, root: ProcRoot) -> std::io::Result<Arc<Self>> {
        Self::start_inner(cache_bytes, root, None)
    }

    /// [`Self::start`] with a fault called before each load (tests).
    #[cfg(test)]
    fn start_with_fault(cache_bytes: usize, fault: fn(u32) -> bool) -> std::io::Result<Arc<Self>> {
        Self::start_inner(cache_bytes, ProcRoot::default(), Some(fault))
    }

    fn start_inner(
        cache_bytes: usize,
        root: ProcRoot,
        #[allow(unused_variables)] fault: Option<fn(u32) -> bool>,
    ) -> std::io::Result<Arc<Self>> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<u32>(1024);
        let shared = Arc::new(Self {
            images: ImageCache::new(cache_bytes),
            procs: Mutex::new(Procs::default()),
            root,
            tx: Some(tx),
            procs_loaded: AtomicU64::new(0),
            vdso: std::sync::OnceLock::new(),
            load_panics: AtomicU64::new(0),
            loader_dead: AtomicBool::new(false),
            #[cfg(test)]
            fault,
        });
        let weak = Arc::downgrade(&shared);
        // The loader holds only a weak reference: when the tables go, the sender goes with
        // them and `recv` ends the thread.
        std::thread::Builder::new().name(LOADER_THREAD.into()).spawn(move || {
            let _guard = LoaderGuard(std::sync::Weak::clone(&weak));
            while let Ok(pid) = rx.recv() {
                let Some(sh) = weak.upgrade() else { break };
                // A panic on one process's maps or images (a bug: the input is bounded and
                // checked) costs that process its CFI, not every later process its tables.
                let p = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    #[cfg(test)]
                    if sh.fault.is_some_and(|f| f(pid)) {
                        return None;
                    }
                    Some(sh.load(pid))
                })) {
                    Ok(Some(p)) => Arc::new(p),
                    Ok(None) => break,
                    Err(_) => {
                        if sh.load_panics.fetch_add(1, Ordering::Relaxed) == 0 {
                            tracing::error!(
                                pid,
                                "loading a process's unwind tables panicked: it unwinds \
                                 through frame pointers only (counted in status as load_panics)"
                            );
                        }
                        Arc::new(ProcUnwinder::empty())
                    }
                };
                sh.procs_loaded.fetch_add(1, Ordering::Relaxed);
                let mut g = sh.lock();
                g.pending.remove(&pid);
                if g.map.len() >= MAX_PROCS && !g.map.contains_key(&pid) {
                    let oldest = g.map.iter().min_by_key(|(_, p)| p.loaded_at).map(|(k, _)| *k);
                    if let Some(k) = oldest {
                        g.map.remove(&k);
                    }
                }
                g.map.insert(pid, p);
            }
        })?;
        Ok(shared)
    }

    /// Shared state without a loader (tests, benches): processes only as added by hand.
    pub fn manual(cache_bytes: usize) -> Arc<Self> {
        Arc::new(Self {
            images: ImageCache::new(cache_bytes),
            procs: Mutex::new(Procs::default()),
            root: ProcRoot::default(),
            tx: None,
            procs_loaded: AtomicU64::new(0),
            vdso: std::sync::OnceLock::new(),
            load_panics: AtomicU64::new(0),
            loader_dead: AtomicBool::new(false),
            #[cfg(test)]
            fault: None,
        })
    }

    /// The loader's counters and the image cache's use, for status.
    pub fn loader_state(&self) -> LoaderState {
        let (bytes, images) = self.images.usage();
        LoaderState {
            procs_loaded: self.procs_loaded(),
            queued: self.lock().pending.len() as u64,
            load_panics: self.load_panics.load(Ordering::Relaxed),
            running: self.tx.is_some() && !self.loader_dead.load(Ordering::Acquire),
            cache_bytes: bytes as u64,
            cache_limit: self.images.limit as u64,
            images: images as u64,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Procs> {
        self.procs.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The image cache's bytes and images.
    pub fn image_usage(&self) -> (usize, usize) {
        self.images.usage()
    }

    /// Process unwinders built so far.
    pub fn procs_loaded(&self) -> u64 {
        self.procs_loaded.load(Ordering::Relaxed)
    }

    /// Add a module by hand (tests and benches): `tables` mapped at `avma` with `bias`.
    pub fn add_module(&self, pid: u32, tables: &ImageTables, avma: Range<u64>, bias: u64) {
        let mut g = self.lock();
        let old = g.map.remove(&pid);
        let mut p = ProcUnwinder::empty();
        if let Some(old) = old {
            p.unwinder = old.unwinder.clone();
            p.ranges = old.ranges.clone();
            p.fp_maps = old.fp_maps.clone();
        }
        p.unwinder.add_module(tables.module("manual", avma.clone(), bias));
        let fp = ImageTables { fp_funcs: tables.fp_funcs.clone(), ..ImageTables::default() };
        p.add_fp_map(avma.clone(), bias, Arc::new(fp));
        p.fp_maps.sort_by_key(|m| m.avma.start);
        p.ranges.push(avma);
        g.map.insert(pid, Arc::new(p));
    }

    /// Load a process's unwinder now, on the calling thread (benches, tests): what the loader
    /// thread does for a sampled process. Returns the executable mappings it found.
    pub fn load_now(&self, pid: u32) -> usize {
        let p = self.load(pid);
        let n = p.ranges.len();
        self.lock().map.insert(pid, Arc::new(p));
        n
    }

    /// The process's current unwinder; asks the loader for one (again, if `reload` and the
    /// current one is older than [`RELOAD_GAP`]) when there is none.
    fn get(&self, pid: u32, reload: bool) -> Option<Arc<ProcUnwinder>> {
        let mut g = self.lock();
        let cur = g.map.get(&pid).cloned();
        let ask = match &cur {
            None => true,
            Some(p) => reload && p.loaded_at.elapsed() >= RELOAD_GAP,
        };
        if ask && pid != 0 && !g.pending.contains(&pid) {
            if let Some(tx) = &self.tx {
                match tx.try_send(pid) {
                    Ok(()) => {
                        g.pending.insert(pid);
                    }
                    Err(std::sync::mpsc::TrySendError::Full(_)) => {}
                    // The loader is gone (its guard logged it): frame pointers from now on.
                    Err(std::sync::mpsc::TrySendError::Disconnected(_)) => {
                        self.loader_dead.store(true, Ordering::Release);
                    }
                }
            }
        }
        cur
    }

    fn forget(&self, pid: u32) {
        self.lock().map.remove(&pid);
    }

    /// Build a process's unwinder from its maps (on the loader thread).
    fn load(&self, pid: u32) -> ProcUnwinder {
        let mut p = ProcUnwinder::empty();
        let dir = self.root.0.join(pid.to_string());
        let Ok(maps) = procfs::read_bounded(&dir.join("maps"), MAPS_LIMIT) else {
            return p;
        };
        for line in maps.split(|&b| b == b'\n') {
            let Some(m) = parse_maps_line(line) else { continue };
            if !m.executable() {
                continue;
            }
            if p.ranges.len() >= MAX_MODULES {
                break;
            }
            p.ranges.push(m.start..m.end);
            if m.path == b"[vdso]" {
                // Samples in clock_gettime and friends unwind through the vDSO's own CFI
                // (it has .eh_frame; without it, a frame-pointer guess from its frame).
                let len = m.end.saturating_sub(m.start);
                if let Some((size, t)) = self.vdso.get_or_init(own_vdso) {
                    // A 32-bit process maps another vDSO: only an image of the same size.
                    if *size == len {
                        if let Some(bias) = t.bias(m.start, m.offset) {
                            p.unwinder.add_module(t.module("[vdso]", m.start..m.end, bias));
                        }
                    }
                }
                continue;
            }
            if m.inode == 0 || !m.path.starts_with(b"/") {
                continue;
            }
            let mf = dir.join("map_files").join(format!("{:x}-{:x}", m.start, m.end));
            // map_files entries are magic links: O_NOFOLLOW would refuse them. What they open
            // is the mapped file itself, whatever its path names now.
            let Ok(file) = File::open(&mf) else { continue };
            let Some(t) = self.images.get_or_load(file, m.dev, m.inode) else { continue };
            let Some(bias) = t.bias(m.start, m.offset) else { continue };
            let name = String::from_utf8_lossy(m.path_clean()).into_owned();
            p.unwinder.add_module(t.module(&name, m.start..m.end, bias));
            p.add_fp_map(m.start..m.end, bias, Arc::clone(&t));
        }
        // The maps are in address order, but a hostile or racing read need not be.
        p.fp_maps.sort_by_key(|m| m.avma.start);
        p
    }
}

/// dcpid's own vDSO image (its mapping's size, its tables), read through `/proc/self/mem`: the
/// kernel maps one image into every 64-bit process, and its text carries `.eh_frame`.
fn own_vdso() -> Option<(u64, Arc<ImageTables>)> {
    use std::os::unix::fs::FileExt;
    let maps = procfs::read_bounded(std::path::Path::new("/proc/self/maps"), MAPS_LIMIT).ok()?;
    let m =
        maps.split(|&b| b == b'\n').filter_map(parse_maps_line).find(|m| m.path == b"[vdso]")?;
    let len = m.end.checked_sub(m.start)?;
    // A vDSO is a few pages; anything larger is not one.
    if len == 0 || len > (1 << 20) {
        return None;
    }
    let mut buf = vec![0u8; usize::try_from(len).ok()?];
    File::open("/proc/self/mem").ok()?.read_exact_at(&mut buf, m.start).ok()?;
    let t = ImageTables::parse(&buf)?;
    Some((len, Arc::new(t)))
}

/// One CPU's DWARF unwinder: the processes' shared unwinders, as last looked up, and a rule
/// cache of its own.
pub struct DwarfUnwinder {
    shared: Arc<DwarfShared>,
    local: HashMap<u32, Arc<ProcUnwinder>>,
    empty: ProcUnwinder,
    cache: CacheX86_64,
    /// `callchains = "auto"`: caller frames of functions that keep a frame pointer are
    /// stepped by it instead of by evaluating their CFI.
    auto: bool,
    pub counters: UnwindCounters,
}

impl std::fmt::Debug for DwarfUnwinder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DwarfUnwinder").field("procs", &self.local.len()).finish_non_exhaustive()
    }
}

impl DwarfUnwinder {
    pub fn new(shared: Arc<DwarfShared>) -> Self {
        Self {
            shared,
            local: HashMap::new(),
            empty: ProcUnwinder::empty(),
            cache: CacheX86_64::new(),
            auto: false,
            counters: UnwindCounters::default(),
        }
    }

    /// Put `cache` in place of this unwinder's rule cache, returning the old one (benches: a
    /// cold cache, as for a process's first samples or a workload of many distinct pcs).
    pub fn swap_rule_cache(&mut self, cache: CacheX86_64) -> CacheX86_64 {
        std::mem::replace(&mut self.cache, cache)
    }

    /// A `callchains = "auto"` unwinder ([`walk`]).
    pub fn new_auto(shared: Arc<DwarfShared>) -> Self {
        Self { auto: true, ..Self::new(shared) }
    }

    /// A process exec'd or exited (side-band): its unwinder is stale.
    pub fn forget(&mut self, pid: u32) {
        self.local.remove(&pid);
        self.shared.forget(pid);
    }

    /// Unwind one sample's user stack into `out` (appended: leaf first, the first frame the
    /// exact ip, the others return address − 1), at most `max` frames. Returns whether the
    /// stack is truncated: cut by `max`, by the copy's end, or by a frame the tables could
    /// not unwind (a root reached through CFI or a zero frame pointer is not truncated).
    ///
    /// A process not loaded yet (its first samples, while the loader thread reads its maps
    /// and images) is unwound through frame pointers only, as `callchains = "fp"` would.
    pub fn unwind(
        &mut self,
        pid: u32,
        regs: UserRegs,
        stack: &[u8],
        max: usize,
        out: &mut Vec<u64>,
    ) -> bool {
        let t0 = Instant::now();
        let fresh = match self.local.get(&pid) {
            Some(p) => p.covers(regs.ip) || p.loaded_at.elapsed() < RELOAD_GAP,
            None => false,
        };
        if !fresh {
            match self.shared.get(pid, self.local.contains_key(&pid)) {
                Some(p) => {
                    if self.local.len() >= MAX_PROCS_PER_CPU && !self.local.contains_key(&pid) {
                        self.local.clear();
                    }
                    self.local.insert(pid, p);
                }
                None => self.counters.not_loaded += 1,
            }
        }
        let p = self.local.get(&pid).map_or(&self.empty, |p| &**p);
        let (ended, fp) = if self.auto {
            walk(&p.unwinder, &mut self.cache, regs, stack, max, out, |pc| p.fp_frame(pc))
        } else {
            walk(&p.unwinder, &mut self.cache, regs, stack, max, out, |_| false)
        };
        let truncated = ended != Ended::Root;
        self.counters.fp_steps += u64::from(fp);
        self.counters.unwound += 1;
        self.counters.truncated += u64::from(truncated);
        self.counters.truncated_copy_end += u64::from(ended == Ended::CopyEnd);
        self.counters.truncated_depth += u64::from(ended == Ended::Depth);
        self.counters.unwind_ns += u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        truncated
    }
}

/// Unwind with `unwinder` (the loop of [`DwarfUnwinder::unwind`]); whether truncated.
pub fn unwind_with(
    unwinder: &UnwinderX86_64<Bytes>,
    cache: &mut CacheX86_64,
    regs: UserRegs,
    stack: &[u8],
    max: usize,
    out: &mut Vec<u64>,
) -> bool {
    unwind_ended(unwinder, cache, regs, stack, max, out) != Ended::Root
}

/// How an unwind ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ended {
    /// At a root: CFI says the return address is undefined (`_start`, `clone3`'s child), or a
    /// frame-pointer walk reached bp 0 or a zero return address.
    Root,
    /// `max` frames.
    Depth,
    /// The next frame's return address (or saved register) lies beyond the stack copy.
    CopyEnd,
    /// A frame the tables (or frame pointers) could not unwind: a read below the stack
    /// pointer, a frame that did not move up, an address overflow.
    NoUnwind,
}

/// [`unwind_with`], saying how it ended.
pub fn unwind_ended(
    unwinder: &UnwinderX86_64<Bytes>,
    cache: &mut CacheX86_64,
    regs: UserRegs,
    stack: &[u8],
    max: usize,
    out: &mut Vec<u64>,
) -> Ended {
    walk(unwinder, cache, regs, stack, max, out, |_| false).0
}

/// Unwind a copied stack, leaf first into `out` (at most `max` frames): every frame through
/// the CFI of its image (framehop; a frame-pointer step where no table covers the pc), except
/// that a caller frame for whose call site `fp_frame(return address − 1)` holds (its function
/// keeps a frame pointer: `callchains = "auto"`) is stepped by frame pointer, `[bp]` the
/// caller's bp and `[bp + 8]` the return address, with no table lookup. With `|_| false`
/// that is `"dwarf"`.
///
/// The leaf is always stepped through CFI: a sample taken in a prologue or epilogue, before
/// `push %rbp; mov %rsp,%rbp` or after `pop %rbp`, would lose its caller under a frame
/// pointer walk, and CFI describes those instructions exactly. A caller's frame is stopped at
/// a call, after its prologue: there its CFI's rule is the frame-pointer rule. Returns how it
/// ended and the frames stepped by frame pointer.
pub fn walk(
    unwinder: &UnwinderX86_64<Bytes>,
    cache: &mut CacheX86_64,
    regs: UserRegs,
    stack: &[u8],
    max: usize,
    out: &mut Vec<u64>,
    fp_frame: impl Fn(u64) -> bool,
) -> (Ended, u32) {
    let base = regs.sp;
    let mut read_stack = |addr: u64| -> Result<u64, ()> {
        let off = usize::try_from(addr.checked_sub(base).ok_or(())?).map_err(|_| ())?;
        let end = off.checked_add(8).ok_or(())?;
        let w = stack.get(off..end).ok_or(())?;
        Ok(u64::from_ne_bytes(w.try_into().map_err(|_| ())?))
    };
    let end = base.saturating_add(stack.len() as u64);
    let mut r = UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp);
    let mut fp = 0u32;
    if max == 0 {
        return (Ended::Depth, fp);
    }
    out.push(regs.ip);
    let mut n = 1usize;
    let mut at = FrameAddress::InstructionPointer(regs.ip);
    loop {
        if n >= max {
            return (Ended::Depth, fp);
        }
        let step = match at {
            FrameAddress::ReturnAddress(ra) if fp_frame(ra.get() - 1) => {
                fp += 1;
                fp_step(&mut r, &mut read_stack)
            }
            _ => unwinder.unwind_frame(at, &mut r, cache, &mut read_stack),
        };
        match step {
            Ok(Some(ra)) => match FrameAddress::from_return_address(ra) {
                // Inside the call instruction, as frame-pointer stacks are (callchain.rs).
                Some(a) => {
                    out.push(ra - 1);
                    at = a;
                }
                None => return (Ended::NoUnwind, fp),
            },
            Ok(None) => return (Ended::Root, fp),
            Err(framehop::Error::CouldNotReadStack(a)) if a.saturating_add(8) > end => {
                return (Ended::CopyEnd, fp)
            }
            Err(_) => return (Ended::NoUnwind, fp),
        }
        n += 1;
    }
}

/// One frame-pointer step of a caller's frame (framehop's `UseFramePointer` rule, without a
/// table lookup): the frame's bp points at the saved bp of its caller, the return address
/// above it. `Ok(None)` at a root (bp 0 or a zero return address).
fn fp_step(
    r: &mut UnwindRegsX86_64,
    read: &mut impl FnMut(u64) -> Result<u64, ()>,
) -> Result<Option<u64>, framehop::Error> {
    let (sp, bp) = (r.sp(), r.bp());
    if bp == 0 {
        return Ok(None);
    }
    let new_sp = bp.checked_add(16).ok_or(framehop::Error::IntegerOverflow)?;
    // The caller's frame lies above this one's: a chain that does not move up is no chain.
    if new_sp <= sp {
        return Err(framehop::Error::FramepointerUnwindingMovedBackwards);
    }
    let new_bp = read(bp).map_err(|()| framehop::Error::CouldNotReadStack(bp))?;
    let ra = read(new_sp - 8).map_err(|()| framehop::Error::CouldNotReadStack(new_sp - 8))?;
    if ra == 0 {
        return Ok(None);
    }
    r.set_ip(ra);
    r.set_sp(new_sp);
    r.set_bp(new_bp);
    Ok(Some(ra))
}

/// Build the framehop unwinder for hand-placed modules (benches, tests).
pub fn unwinder_for(modules: &[(&ImageTables, Range<u64>, u64)]) -> UnwinderX86_64<Bytes> {
    let mut u = UnwinderX86_64::new();
    for (t, avma, bias) in modules {
        u.add_module(t.module("m", avma.clone(), *bias));
    }
    u
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-built `.eh_frame` (no `.eh_frame_hdr`: framehop indexes it) at svma 0x2000 for
    /// three functions: `f1` at 0x1000 is frameless (the CIE's CFA = rsp + 8), `f2` at 0x1100
    /// pushed one register (CFA = rsp + 16), `f3` at 0x1200 is a root (return address
    /// undefined, as glibc's `_start` says).
    fn synthetic_eh_frame() -> ImageTables {
        const SVMA: u64 = 0x2000;
        let mut e: Vec<u8> = Vec::new();
        // CIE: id 0, version 1, "zR", code align 1, data align -8, RA = r16, aug len 1,
        // FDE pointers pc-relative sdata4; def_cfa rsp+8; r16 at cfa-8; 2 nops.
        let cie = [
            0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 0x10, 1, 0x1b, 0x0c, 0x07, 0x08, 0x90, 0x01, 0,
            0,
        ];
        e.extend_from_slice(&(cie.len() as u32).to_le_bytes());
        e.extend_from_slice(&cie);
        for (begin, insns) in
            [(0x1000u64, &[0u8, 0][..]), (0x1100, &[0x0e, 0x10][..]), (0x1200, &[0x07, 0x10][..])]
        {
            let at = e.len() as u64;
            e.extend_from_slice(&16u32.to_le_bytes());
            e.extend_from_slice(&((at + 4) as u32).to_le_bytes()); // back to the CIE
            let field = SVMA + at + 8;
            e.extend_from_slice(&(begin.wrapping_sub(field) as i32).to_le_bytes());
            e.extend_from_slice(&0x100u32.to_le_bytes());
            e.push(0); // augmentation data length
            e.extend_from_slice(insns);
            e.push(0); // nop padding to 16
        }
        e.extend_from_slice(&[0, 0, 0, 0]);
        let len = e.len() as u64;
        ImageTables {
            eh_frame: Some((SVMA..SVMA + len, Bytes(Arc::from(&e[..])))),
            text_svma: Some(0x1000..0x1300),
            bytes: e.len(),
            ..Default::default()
        }
    }

    fn words(w: &[u64]) -> Vec<u8> {
        w.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    /// The unwinder adapter on a synthetic stack: leaf `f1` (frameless) called by `f2` called
    /// by the root `f3`, in an image mapped with a bias of `0x40_0000`.
    #[test]
    fn unwinds_a_synthetic_stack_through_cfi() {
        let t = synthetic_eh_frame();
        let u = unwinder_for(&[(&t, 0x40_1000..0x40_1300, 0x40_0000)]);
        let sp = 0x7ffd_0000_0000u64;
        // sp: return into f2; then f2's pushed register; then the return into f3.
        let stack = words(&[0x40_1150, 0xdead, 0x40_1250, 0, 0, 0]);
        let regs = UserRegs { bp: 0, sp, ip: 0x40_1010 };
        let mut cache = CacheX86_64::new();
        let mut out = Vec::new();
        let truncated = unwind_with(&u, &mut cache, regs, &stack, 64, &mut out);
        assert_eq!(out, vec![0x40_1010, 0x40_114f, 0x40_124f]);
        assert!(!truncated, "f3 is a root");
        // The copy ends before f2's return address: truncated after the leaf's caller.
        let mut short = Vec::new();
        assert!(unwind_with(&u, &mut cache, regs, &stack[..16], 64, &mut short));
        assert_eq!(short, vec![0x40_1010, 0x40_114f]);
        short.clear();
        assert_eq!(
            unwind_ended(&u, &mut cache, regs, &stack[..16], 64, &mut short),
            Ended::CopyEnd
        );
        let mut two = Vec::new();
        assert_eq!(unwind_ended(&u, &mut cache, regs, &stack, 2, &mut two), Ended::Depth);
        // A depth bound ends it too.
        let mut two = Vec::new();
        assert!(unwind_with(&u, &mut cache, regs, &stack, 2, &mut two));
        assert_eq!(two.len(), 2);
        // Through the per-CPU unwinder's own module list (as the drain thread calls it).
        let shared = DwarfShared::manual(1 << 20);
        shared.add_module(7, &t, 0x40_1000..0x40_1300, 0x40_0000);
        let mut d = DwarfUnwinder::new(shared);
        let mut again = Vec::new();
        assert!(!d.unwind(7, regs, &stack, 64, &mut again));
        assert_eq!(again, out);
        assert_eq!(d.counters.unwound, 1);
        again.clear();
        assert!(d.unwind(7, regs, &stack[..16], 64, &mut again));
        assert_eq!((d.counters.truncated, d.counters.truncated_copy_end), (1, 1));
    }

    /// `callchains = "auto"`: a caller's frame in a frame-pointer function is stepped by
    /// frame pointer (counted), the leaf through CFI; with none (`"dwarf"`) the same
    /// stack unwinds to the same frames through framehop (its frame-pointer rule where no
    /// module covers the pc).
    #[test]
    fn auto_steps_callers_in_frame_pointer_functions_by_frame_pointer() {
        let t = synthetic_eh_frame();
        let u = unwinder_for(&[(&t, 0x40_1000..0x40_1300, 0x40_0000)]);
        let sp = 0x7ffd_0000_0000u64;
        // The leaf f1 (frameless, CFI) returns into 0x50_0105; that frame's bp is sp + 16:
        // [saved bp = sp + 32][return 0x50_0205]; that one's: [0][return 0x50_0305], a root.
        let stack = words(&[0x50_0105, 0xdead, sp + 32, 0x50_0205, 0, 0x50_0305, 0, 0]);
        let regs = UserRegs { bp: sp + 16, sp, ip: 0x40_1010 };
        let want = vec![0x40_1010, 0x50_0104, 0x50_0204, 0x50_0304];
        let sound = |pc: u64| (0x50_0000..0x50_1000).contains(&pc);
        let mut cache = CacheX86_64::new();
        let mut out = Vec::new();
        let (ended, fp) = walk(&u, &mut cache, regs, &stack, 64, &mut out, sound);
        assert_eq!((&out, ended, fp), (&want, Ended::Root, 3));
        let mut dwarf = Vec::new();
        let (ended, fp) = walk(&u, &mut cache, regs, &stack, 64, &mut dwarf, |_| false);
        assert_eq!((&dwarf, ended, fp), (&want, Ended::Root, 0));
        // A leaf in a frame-pointer function is still stepped through its CFI, not by frame pointer: f1
        // is frameless, and a frame-pointer step from it would skip its caller 0x50_0104.
        let mut leaf = Vec::new();
        walk(&u, &mut cache, regs, &stack, 64, &mut leaf, |_| true);
        assert_eq!(leaf, want);
        // Through a process's unwinder: its frame-pointer functions, looked up by image.
        let shared = DwarfShared::manual(1 << 20);
        shared.add_module(7, &t, 0x40_1000..0x40_1300, 0x40_0000);
        let fp_image = ImageTables::frame_pointers_only(0x100..0x1100);
        shared.add_module(7, &fp_image, 0x50_0000..0x50_1000, 0x4f_ff00);
        let mut d = DwarfUnwinder::new_auto(shared);
        let mut via = Vec::new();
        assert!(!d.unwind(7, regs, &stack, 64, &mut via));
        assert_eq!((&via, d.counters.fp_steps), (&want, 3));
        let p = d.local.get(&7).expect("loaded");
        assert!(p.fp_frame(0x50_0000) && p.fp_frame(0x50_0fff));
        assert!(!p.fp_frame(0x40_1010) && !p.fp_frame(0x50_1000) && !p.fp_frame(0x4f_ffff));
        // A chain that does not move up ends (no unwind), bounded.
        let looped = words(&[0x50_0105, 0xdead, sp + 16, 0x50_0205, 0, 0]);
        let mut l = Vec::new();
        let (ended, _) = walk(&u, &mut cache, regs, &looped, 64, &mut l, sound);
        assert_eq!((l.len(), ended), (3, Ended::NoUnwind), "{l:x?}");
        // The copy's end is told apart.
        let mut c = Vec::new();
        let (ended, _) = walk(&u, &mut cache, regs, &stack[..32], 64, &mut c, sound);
        assert_eq!((c.len(), ended), (3, Ended::CopyEnd), "{c:x?}");
    }

    /// The functions of an image built with frame pointers that have a frame are told from its
    /// `.eh_frame` (`via_a`, `via_b`, `main`; not the frameless leaf `hot`), and none of the same code
    /// built without (gcc, what `cc` is here).
    #[test]
    fn frame_pointer_images_are_told_from_their_cfi() {
        let dir = tempfile::tempdir().expect("tempdir");
        let src = dir.path().join("callers.c");
        std::fs::write(&src, include_str!("../../../tests/e2e/dwarf_callers.c")).expect("write");
        let mut shares = Vec::new();
        for flag in ["-fno-omit-frame-pointer", "-fomit-frame-pointer"] {
            let bin = dir.path().join(flag);
            match std::process::Command::new("cc")
                .args(["-O2", flag, "-o"])
                .arg(&bin)
                .arg(&src)
                .status()
            {
                Ok(st) if st.success() => {}
                r => dcpi_testkit::skip!("no C compiler to build the test images: {r:?}"),
            }
            let t = ImageTables::parse(&std::fs::read(&bin).expect("read")).expect("ELF");
            shares.push((flag, t.fp_share(), t.fp_funcs.clone()));
        }
        eprintln!("{shares:?}");
        let [(_, fp, ref fp_funcs), (_, nofp, ref nofp_funcs)] = shares[..] else { unreachable!() };
        assert!(fp.framed >= 3 && nofp.framed >= 1, "{shares:?}");
        assert!(fp.rbp_fdes >= 3 && fp_funcs.len() as u64 == fp.rbp_fdes, "{shares:?}");
        assert!(nofp.rbp_fdes == 0 && nofp_funcs.is_empty(), "{shares:?}");
        assert!(fp_funcs.windows(2).all(|w| w[0].1 <= w[1].0), "sorted, disjoint");
        // Hostile: garbage for .eh_frame gives a bounded answer, no panic.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for len in [0usize, 3, 64, 4096] {
            let junk: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            let (s, f) = fp_scan(&junk, 0x1000);
            assert!(s.rbp_fdes <= s.fdes && s.rbp_bytes <= s.bytes, "{s:?}");
            assert_eq!(f.len() as u64, s.rbp_fdes);
        }
    }

    /// An lld-linked image (rustc's default): the page at file offset 0x130000 holds the end
    /// of the read-only segment and the start of the text (offset 0x130980, vaddr 0x131980).
    /// The text's mapping, which starts at that page, is placed by the text segment: the
    /// read-only one would put every address a page off.
    #[test]
    fn an_lld_text_mapping_is_placed_by_its_executable_segment() {
        let t = ImageTables {
            loads: vec![
                (0, 0x13_0978, 0, false),
                (0x13_0980, 0x23_3920, 0x13_1980, true),
                (0x36_42a0, 0x3_d2a0, 0x36_62a0, false),
            ],
            ..Default::default()
        };
        let base = 0x5555_0000_0000u64;
        // The dynamic loader maps file page 0x130000 of the text at base + 0x131000.
        assert_eq!(t.bias(base + 0x13_1000, 0x13_0000), Some(base));
        // GNU ld's layout (offsets and vaddrs congruent, one segment per page) is unchanged.
        let ld = ImageTables {
            loads: vec![(0, 0x1000, 0, false), (0x1000, 0x2000, 0x1000, true)],
            ..Default::default()
        };
        assert_eq!(ld.bias(base + 0x1000, 0x1000), Some(base));
        assert_eq!(ld.bias(base, 0x9000), None);
    }

    /// Wait (generously) for `cond`.
    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// A load that panics is counted and costs only that process its tables: the loader goes
    /// on (the next process loads), and the process gets an unwinder (frame pointers only)
    /// instead of being asked for again and again.
    #[test]
    fn a_panicking_load_is_counted_and_the_loader_goes_on() {
        let shared = DwarfShared::start_with_fault(1 << 20, |pid| {
            assert_ne!(pid, 1_000_001, "injected load failure");
            false
        })
        .expect("start");
        assert!(shared.get(1_000_001, false).is_none());
        wait_for("the failed load", || shared.loader_state().load_panics == 1);
        wait_for("its unwinder", || shared.get(1_000_001, false).is_some());
        let me = std::process::id();
        shared.get(me, false);
        wait_for("this process's tables", || shared.get(me, false).is_some());
        let st = shared.loader_state();
        assert!(st.running, "{st:?}");
        assert_eq!((st.procs_loaded, st.queued, st.load_panics), (2, 0, 1));
        assert!(st.images > 0 && st.cache_bytes > 0, "this test binary has CFI: {st:?}");
    }

    /// A loader thread that ended is said in the state (status), and processes asked for
    /// later get no tables: their samples unwind through frame pointers (the empty unwinder).
    #[test]
    fn a_dead_loader_is_reported_and_stacks_fall_back() {
        let shared = DwarfShared::start_with_fault(1 << 20, |_| true).expect("start");
        assert!(shared.loader_state().running);
        shared.get(1_000_002, false);
        wait_for("the loader's end", || !shared.loader_state().running);
        // Asked again, nothing is sent: still none, no panic.
        assert!(shared.get(1_000_003, false).is_none());
        let mut d = DwarfUnwinder::new(Arc::clone(&shared));
        // A frame-pointer walk: bp points at [saved bp 0][return 0x40_2000] in the copy.
        let sp = 0x7ffd_0000_0000u64;
        let stack = words(&[0, 0, 0, 0x40_2000]);
        let regs = UserRegs { bp: sp + 16, sp, ip: 0x40_1000 };
        let mut out = Vec::new();
        d.unwind(1_000_003, regs, &stack, 64, &mut out);
        assert_eq!(out, vec![0x40_1000, 0x40_1fff]);
        assert_eq!(d.counters.not_loaded, 1);
    }

    /// The vDSO's tables are read from dcpid's own, and a process's unwinder gets a module
    /// for its `[vdso]` mapping: this process's.
    #[test]
    fn the_vdso_has_unwind_tables_and_a_module() {
        let (len, t) = own_vdso().expect("this process has a vDSO with an ELF image");
        assert!(len > 0 && t.eh_frame.is_some(), "the vDSO carries .eh_frame");
        let shared = DwarfShared::manual(1 << 20);
        let me = std::process::id();
        let p = shared.load(me);
        let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
        let vdso = maps.lines().find(|l| l.ends_with("[vdso]")).expect("[vdso] mapped");
        let (a, _) = vdso.split_once('-').expect("range");
        let start = u64::from_str_radix(a, 16).expect("hex");
        assert!(p.covers(start));
        // A vDSO pc finds its module's CFI: unwinding the function at its first instruction
        // (CFA = rsp + 8) returns to the address on top of the stack.
        let sp = 0x7ffd_0000_0000u64;
        let stack = words(&[0x40_2000, 0, 0, 0]);
        let regs = UserRegs { bp: 0, sp, ip: start + t.text_svma.clone().expect("text").start };
        let mut out = Vec::new();
        let mut cache = CacheX86_64::new();
        unwind_with(&p.unwinder, &mut cache, regs, &stack, 3, &mut out);
        assert_eq!(out.get(1), Some(&0x40_1fff), "{out:x?}");
    }

    /// Garbage for a stack (a hostile copy) ends the stack bounded; never a panic or a loop.
    #[test]
    fn garbage_stack_is_bounded() {
        let t = synthetic_eh_frame();
        let u = unwinder_for(&[(&t, 0x40_1000..0x40_1300, 0x40_0000)]);
        let mut cache = CacheX86_64::new();
        for k in 0..64u64 {
            let junk: Vec<u8> =
                (0..4096u64).map(|i| ((i ^ k).wrapping_mul(2654435761) >> 13) as u8).collect();
            let regs = UserRegs { bp: 0x7ffd_0000_0100, sp: 0x7ffd_0000_0000, ip: 0x40_1010 + k };
            let mut j = Vec::new();
            unwind_with(&u, &mut cache, regs, &junk, 64, &mut j);
            assert!(!j.is_empty() && j.len() <= 64);
        }
    }

    /// Hostile unwind tables: random bytes for `.eh_frame` and `.eh_frame_hdr` never crash nor
    /// hang the unwinder, and every stack is bounded.
    #[test]
    fn garbage_cfi_is_bounded() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200 {
            let n = (rnd() % 512) as usize + 8;
            let eh: Vec<u8> = (0..n).map(|_| rnd() as u8).collect();
            let mut hdr: Vec<u8> = (0..64).map(|_| rnd() as u8).collect();
            hdr[0] = 1;
            let t = ImageTables {
                eh_frame: Some((0x2000..0x2000 + n as u64, Bytes(Arc::from(&eh[..])))),
                eh_frame_hdr: Some((0x1000..0x1040, Bytes(Arc::from(&hdr[..])))),
                text_svma: Some(0x3000..0x9000),
                ..Default::default()
            };
            let u = unwinder_for(&[(&t, 0x40_0000..0x41_0000, 0x40_0000)]);
            let stack: Vec<u8> = (0..1024).map(|_| rnd() as u8).collect();
            let regs = UserRegs { bp: 0x7ff0_0000_0100, sp: 0x7ff0_0000_0000, ip: 0x40_3100 };
            let mut out = Vec::new();
            let mut cache = CacheX86_64::new();
            unwind_with(&u, &mut cache, regs, &stack, 32, &mut out);
            assert!(!out.is_empty() && out.len() <= 32);
        }
    }
}
