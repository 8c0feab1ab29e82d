//! DWARF CFI unwinding of copied user stacks (`callchains = "dwarf"`).
//!
//! With `callchains = "dwarf"` the kernel gives each sample its kernel chain only
//! (PERF_SAMPLE_CALLCHAIN with `exclude_callchain_user`), the user registers bp, sp and ip
//! (PERF_SAMPLE_REGS_USER) and a copy of the top of the user stack (PERF_SAMPLE_STACK_USER,
//! `sample_user_stack` bytes). A drain thread unwinds that copy right away with the `.eh_frame`
//! (through `.eh_frame_hdr`) or `.debug_frame` of the images mapped at the frames' addresses,
//! using [framehop] (what samply uses), and interns the merged kernel + user stack in its CPU's
//! stack table as frame-pointer stacks are: the stack copy never leaves the drain thread, and a
//! hot stack still costs one increment.
//!
//! Why on the drain thread and not later: the copy is 8 KiB a sample; to unwind later it
//! would have to be kept (8 MB/s per busy CPU at 1 kHz) until then, and stacks could not be
//! interned before. Unwinding with warm tables costs about a microsecond per stack
//! (`cargo bench -p dcpi-daemon --bench unwind`), far below the 15-25 µs the sample itself
//! costs here (MACHINE-FACTS.md). What is slow is loading a process's tables (reading its
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
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, Unwinder};
use hashbrown::HashMap;
use object::{Object, ObjectSection, ObjectSegment};

use crate::perf::records::UserRegs;
use crate::resolve::maps::parse_maps_line;

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
/// Processes whose unwinders one CPU keeps; past it the least recently used goes.
const MAX_PROCS_PER_CPU: usize = 512;
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
    /// PT_LOAD segments: (file offset, file size, vaddr), to place the image's addresses.
    loads: Vec<(u64, u64, u64)>,
    bytes: usize,
}

impl ImageTables {
    /// Parse an ELF image's unwind sections. `None` for anything that is not an ELF file.
    pub fn parse(data: &[u8]) -> Option<Self> {
        Self::from_object(&object::File::parse(data).ok()?)
    }

    fn from_object<'d, R: object::ReadRef<'d>>(f: &object::File<'d, R>) -> Option<Self> {
        if f.format() != object::BinaryFormat::Elf {
            return None;
        }
        let mut t = ImageTables::default();
        let mut bytes = 0usize;
        let mut section = |name: &str| -> Option<(Range<u64>, Bytes)> {
            let s = f.section_by_name(name)?;
            let (addr, size) = (s.address(), s.size());
            if size == 0 || size > MAX_SECTION_BYTES {
                return None;
            }
            // Compressed .debug_frame: refuse to inflate beyond the bound.
            let cr = s.compressed_file_range().ok()?;
            if cr.uncompressed_size > MAX_SECTION_BYTES {
                return None;
            }
            let data = s.uncompressed_data().ok()?;
            bytes += data.len();
            Some((addr..addr.checked_add(size)?, Bytes(Arc::from(&*data))))
        };
        t.eh_frame = section(".eh_frame");
        t.eh_frame_hdr = section(".eh_frame_hdr");
        t.debug_frame = section(".debug_frame").map(|(_, b)| b);
        let range = |name: &str| {
            let s = f.section_by_name(name)?;
            Some(s.address()..s.address().checked_add(s.size())?)
        };
        t.text_svma = range(".text");
        t.got_svma = range(".got");
        t.bytes = bytes;
        for seg in f.segments() {
            let (off, size) = seg.file_range();
            t.loads.push((off, size, seg.address()));
        }
        Some(t)
    }

    /// The load bias of a mapping of file offset `pgoff` at `start`: what is added to the
    /// image's addresses to give the process's. `None` if no segment holds that offset.
    fn bias(&self, start: u64, pgoff: u64) -> Option<u64> {
        let &(off, _, vaddr) = self
            .loads
            .iter()
            .find(|&&(off, size, _)| pgoff >= off & !0xfff && pgoff < off.saturating_add(size))?;
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
}

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
    /// Process unwinders built (a process's maps read).
    pub procs_loaded: u64,
    /// Time spent unwinding and loading, in ns.
    pub unwind_ns: u64,
}

impl ImageCache {
    pub fn new(limit: usize) -> Self {
        Self { inner: Mutex::new(CacheInner::default()), limit }
    }

    /// The tables of the image opened as `file` (dev/inode from the maps line).
    fn get_or_load(&self, file: File, dev: (u32, u32), inode: u64) -> Option<Arc<ImageTables>> {
        let data = object::read::ReadCache::new(file);
        let obj = object::File::parse(&data).ok()?;
        let key = match obj.build_id() {
            Ok(Some(id)) if !id.is_empty() => ImageKey::BuildId(id.to_vec()),
            _ => ImageKey::Inode(dev.0, dev.1, inode),
        };
        {
            let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            g.tick += 1;
            let tick = g.tick;
            if let Some((t, used)) = g.map.get_mut(&key) {
                *used = tick;
                return Some(Arc::clone(t));
            }
        }
        let t = Arc::new(ImageTables::from_object(&obj)?);
        self.insert(key, Arc::clone(&t));
        Some(t)
    }

    fn insert(&self, key: ImageKey, t: Arc<ImageTables>) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
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
            let Some(k) = g.map.iter().filter(|(_, (_, u))| *u != tick).min_by_key(|(_, (_, u))| *u).map(|(k, _)| k.clone())
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
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (g.bytes, g.map.len())
    }
}

/// One process's unwinder on one CPU.
struct Proc {
    unwinder: UnwinderX86_64<Bytes>,
    /// Executable mappings with a module.
    ranges: Vec<Range<u64>>,
    loaded_at: Instant,
    used: u64,
}

/// Where a process's maps and mapped files are read (a test points it elsewhere).
#[derive(Clone, Debug)]
pub struct ProcRoot(pub PathBuf);

impl Default for ProcRoot {
    fn default() -> Self {
        Self(PathBuf::from("/proc"))
    }
}

/// One CPU's DWARF unwinder: per-process module lists over the shared [`ImageCache`].
pub struct DwarfUnwinder {
    images: Arc<ImageCache>,
    procs: HashMap<u32, Proc>,
    cache: CacheX86_64,
    tick: u64,
    root: ProcRoot,
    pub counters: UnwindCounters,
}

impl std::fmt::Debug for DwarfUnwinder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DwarfUnwinder").field("procs", &self.procs.len()).finish_non_exhaustive()
    }
}

impl DwarfUnwinder {
    pub fn new(images: Arc<ImageCache>) -> Self {
        Self::with_root(images, ProcRoot::default())
    }

    pub fn with_root(images: Arc<ImageCache>, root: ProcRoot) -> Self {
        Self {
            images,
            procs: HashMap::new(),
            cache: CacheX86_64::new(),
            tick: 0,
            root,
            counters: UnwindCounters::default(),
        }
    }

    /// A process exec'd or exited (side-band): its unwinder is stale.
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }

    /// Add a module by hand (tests and benches): `tables` mapped at `avma` with `bias`.
    pub fn add_module(&mut self, pid: u32, tables: &ImageTables, avma: Range<u64>, bias: u64) {
        let p = self.procs.entry(pid).or_insert_with(|| Proc {
            unwinder: UnwinderX86_64::new(),
            ranges: Vec::new(),
            loaded_at: Instant::now(),
            used: 0,
        });
        p.unwinder.add_module(tables.module("test", avma.clone(), bias));
        p.ranges.push(avma);
    }

    fn load(&mut self, pid: u32) -> Proc {
        self.counters.procs_loaded += 1;
        let mut p = Proc {
            unwinder: UnwinderX86_64::new(),
            ranges: Vec::new(),
            loaded_at: Instant::now(),
            used: 0,
        };
        let dir = self.root.0.join(pid.to_string());
        let Ok(maps) = crate::resolve::procfs::read_bounded(&dir.join("maps"), MAPS_LIMIT) else {
            return p;
        };
        for line in maps.split(|&b| b == b'\n') {
            let Some(m) = parse_maps_line(line) else { continue };
            if !m.executable() || m.inode == 0 || !m.path.starts_with(b"/") {
                continue;
            }
            if p.ranges.len() >= MAX_MODULES {
                break;
            }
            let mf = dir.join("map_files").join(format!("{:x}-{:x}", m.start, m.end));
            // map_files entries are magic links: O_NOFOLLOW would refuse them. What they open
            // is the mapped file itself, whatever its path names now.
            let Ok(file) = File::open(&mf) else { continue };
            let Some(t) = self.images.get_or_load(file, m.dev, m.inode) else { continue };
            let Some(bias) = t.bias(m.start, m.offset) else { continue };
            let name = String::from_utf8_lossy(m.path_clean()).into_owned();
            p.unwinder.add_module(t.module(&name, m.start..m.end, bias));
            p.ranges.push(m.start..m.end);
        }
        p
    }

    /// Unwind one sample's user stack into `out` (appended: leaf first, the first frame the
    /// exact ip, the others return address − 1), at most `max` frames. Returns whether the
    /// stack is truncated: cut by `max`, by the copy's end, or by a frame the tables could
    /// not unwind (a root reached through CFI or a zero frame pointer is not truncated).
    pub fn unwind(
        &mut self,
        pid: u32,
        regs: UserRegs,
        stack: &[u8],
        max: usize,
        out: &mut Vec<u64>,
    ) -> bool {
        let t0 = Instant::now();
        self.tick += 1;
        let stale = match self.procs.get(&pid) {
            None => true,
            Some(p) => {
                !p.ranges.iter().any(|r| r.contains(&regs.ip))
                    && p.loaded_at.elapsed() >= RELOAD_GAP
            }
        };
        if stale && pid != 0 {
            if self.procs.len() >= MAX_PROCS_PER_CPU && !self.procs.contains_key(&pid) {
                if let Some(&old) = self.procs.iter().min_by_key(|(_, p)| p.used).map(|(k, _)| k)
                {
                    self.procs.remove(&old);
                }
            }
            let p = self.load(pid);
            self.procs.insert(pid, p);
        }
        let truncated = match self.procs.get_mut(&pid) {
            Some(p) => {
                p.used = self.tick;
                unwind_with(&p.unwinder, &mut self.cache, regs, stack, max, out)
            }
            None => {
                let empty = UnwinderX86_64::new();
                unwind_with(&empty, &mut self.cache, regs, stack, max, out)
            }
        };
        self.counters.unwound += 1;
        self.counters.unwind_ns += u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        truncated
    }
}

/// Unwind with `unwinder` (the loop of [`DwarfUnwinder::unwind`]).
pub fn unwind_with(
    unwinder: &UnwinderX86_64<Bytes>,
    cache: &mut CacheX86_64,
    regs: UserRegs,
    stack: &[u8],
    max: usize,
    out: &mut Vec<u64>,
) -> bool {
    let base = regs.sp;
    let mut read_stack = |addr: u64| -> Result<u64, ()> {
        let off = usize::try_from(addr.checked_sub(base).ok_or(())?).map_err(|_| ())?;
        let end = off.checked_add(8).ok_or(())?;
        let w = stack.get(off..end).ok_or(())?;
        Ok(u64::from_ne_bytes(w.try_into().map_err(|_| ())?))
    };
    let mut it = unwinder.iter_frames(
        regs.ip,
        UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp),
        cache,
        &mut read_stack,
    );
    let mut n = 0usize;
    loop {
        if n >= max {
            return true;
        }
        match it.next() {
            Ok(Some(FrameAddress::InstructionPointer(pc))) => out.push(pc),
            // Inside the call instruction, as frame-pointer stacks are (callchain.rs).
            Ok(Some(FrameAddress::ReturnAddress(ra))) => out.push(ra.get().saturating_sub(1)),
            Ok(None) => return false,
            Err(_) => return true,
        }
        n += 1;
    }
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
            0, 0, 0, 0, 1, b'z', b'R', 0, 1, 0x78, 0x10, 1, 0x1b, 0x0c, 0x07, 0x08, 0x90, 0x01,
            0, 0,
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
    /// by the root `f3`, in an image mapped with a bias of 0x40_0000.
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
        // A depth bound ends it too.
        let mut two = Vec::new();
        assert!(unwind_with(&u, &mut cache, regs, &stack, 2, &mut two));
        assert_eq!(two.len(), 2);
        // Through the per-CPU unwinder's own module list (as the drain thread calls it).
        let mut d = DwarfUnwinder::new(Arc::new(ImageCache::new(1 << 20)));
        d.add_module(7, &t, 0x40_1000..0x40_1300, 0x40_0000);
        let mut again = Vec::new();
        assert!(!d.unwind(7, regs, &stack, 64, &mut again));
        assert_eq!(again, out);
        assert_eq!(d.counters.unwound, 1);
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
