//! Resolution of samples `(pid, pc)` to `(image, offset)`.
//!
//! # Address-space versions (asid)
//! Every exec, every executable mmap and every new process takes a fresh number from one
//! monotonic counter (never reused, so a reused pid can never reuse an asid). A process keeps
//! the history `(from_time, asid)` of its versions; the aggregator keys samples by the asid in
//! force at the sample's time ([`Resolver::asid_at`]). A mapping remembers the asid range it is
//! valid for (`asid_from..asid_to`): an exec ends every mapping, a new mmap ends the mappings it
//! overlays (the parts it does not cover live on with the new asid), FORK copies the parent's
//! live mappings into a new version for the child (thread creation, pid == ppid, changes
//! nothing). Old versions, ended mappings and exited processes are dropped by [`Resolver::gc`]
//! once every sample that could name them has been resolved.
//!
//! # Offsets and identities (FORMAT.md `ImageKind`)
//! - file (`Elf`): offset = pc - `map_start` + pgoff, i.e. the *file offset* of the instruction
//!   (works alike for PIE, non-PIE and shared objects; a report maps it back to a virtual
//!   address through the `PT_LOAD` headers). Identity: the GNU build-id from the MMAP2 record;
//!   otherwise read from the ELF notes through `/proc/PID/map_files/START-END` (see
//!   [`identity`]); otherwise `ImageId::fallback(path, size, mtime_ns, inode)`; the path is
//!   the one the kernel showed, ` (deleted)` removed.
//! - `[vdso]` (`Vdso`): offset = pc - map start; id = build-id of the daemon's own vDSO (same
//!   kernel, same vDSO), else `ImageId::special("[vdso]", kernel release)`.
//! - anonymous executable memory (`Anon`: MMAP2 with an empty, `//anon` or `[anon:...]` name,
//!   any other `[...]` pseudo-file, or an executable mapping without a file in /proc maps):
//!   one image per process, id = `ImageId::special("[anon]", pid (u32 LE) ++ start (u64 LE))`
//!   where start is the process start time in clock ticks since boot (`/proc/PID/stat`
//!   field 22, or the FORK time converted to ticks at `USER_HZ=100`), path `[anon:PID:comm]`,
//!   offset = absolute pc; symbols from `/tmp/perf-PID.map` go in `jit_symbols`.
//! - kernel and modules: see [`kernel`].
//!
//! # Side-band records and the /proc scan
//! [`Resolver::scan_proc`] reads every `/proc/PID/maps` once at start (time T0). Records older
//! than T0 for a pid the scan saw are ignored (the scan already reflects them). Run it through
//! `Aggregator::with_resolver` (drain threads wait for the scan instead of aggregating samples
//! of not-yet-scanned processes); samples that were aggregated before their process was known
//! (asid 0) are still attributed to a process the scan found.
//!
//! Applying a record reads files in two cases: an exec (the owner of `/proc/PID`) and a file
//! mapping whose MMAP2 record has no build-id (its identity). [`RecordIo::prepare`] does those
//! reads without the resolver, and [`Resolver::apply_prepared`] takes their results, so that
//! the aggregator's resolver thread holds the resolver's write lock only for the bookkeeping.

pub mod identity;
pub mod jit;
pub mod kernel;
pub mod maps;
pub(crate) mod procfs;
pub mod symtab;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::sync::Arc;

use profile_format::{ImageId, ImageKind, KallsymsSnapshot, UnknownReason};

use crate::sys;
use crate::types::ImageInfo;
use crate::types::{PerfTime, SideBand, TimedSideBand};

use identity::IdentityCache;
use jit::JitMapState;
use kernel::KernelState;

/// Lowest kernel-space address on x86-64 / arm64 (48-bit VA): any pc above is kernel.
pub const KERNEL_START: u64 = 0xffff_8000_0000_0000;
/// Identity cache capacity (per generation).
const IDENTITY_CACHE_CAP: usize = 4096;
/// Bound on the bytes read from one `/proc/PID/maps`.
const MAX_MAPS_BYTES: u64 = 64 << 20;
/// Versions kept per process even before gc (a process mmapping in a loop between flushes).
const MAX_VERSIONS: usize = 4096;
const PROT_EXEC: u32 = 4;

/// Where the resolver reads the host's state (tests point these at fake trees).
#[derive(Clone, Debug)]
pub struct ResolverConfig {
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
    pub jit_map_dir: PathBuf,
}

impl Default for ResolverConfig {
    fn default() -> Self {
        Self { proc_root: "/proc".into(), sys_root: "/sys".into(), jit_map_dir: "/tmp".into() }
    }
}

/// Errors of the resolver that are reported (most failures just make samples unknown).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Format(#[from] profile_format::Error),
}

/// What [`Resolver::scan_proc`] met.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, serde::Serialize)]
pub struct ScanStats {
    /// Processes whose maps were read.
    pub processes: u64,
    /// Executable mappings recorded.
    pub mappings: u64,
    /// Processes whose maps could not be read (EACCES/EPERM, e.g. PID 1 here).
    pub unreadable: u64,
    /// Processes that exited between the directory listing and the read.
    pub vanished: u64,
    /// Malformed lines in maps files (skipped).
    pub garbage_lines: u64,
    /// File mappings whose identity could not be read (fallback id used).
    pub identity_errors: u64,
    /// Other errors (listing /proc, unexpected errno).
    pub errors: u64,
}

/// Counters for `dcpictl status`.
#[derive(Clone, PartialEq, Debug, Default, serde::Serialize)]
pub struct ResolverStats {
    pub processes: u64,
    /// Earlier incarnations of reused pids kept until their samples are resolved.
    pub retired_processes: u64,
    /// Live and ended mappings held.
    pub mappings: u64,
    pub identity_cache_entries: u64,
    pub identity_cache_hits: u64,
    pub identity_cache_misses: u64,
    pub identity_errors: u64,
    /// Samples left unknown, by reason.
    pub unknown_no_map: u64,
    pub unknown_process_gone: u64,
    pub unknown_unreadable: u64,
    pub unknown_kernel: u64,
    /// Side-band records ignored because the /proc scan already reflected them.
    pub ignored_before_scan: u64,
    pub jit_maps_read: u64,
    /// Perf map reads cut short by the bounds (bytes or entries).
    pub jit_maps_truncated: u64,
    /// Last asid handed out.
    pub last_asid: u64,
    pub scan: ScanStats,
}

/// The answer of [`Resolver::asid_at`] for a pid and the time interval `[from, until)` over
/// which it stays the same, given the records applied so far (for a per-CPU cache).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AsidSpan {
    /// `None`: the process is unknown.
    pub asid: Option<u64>,
    pub from: PerfTime,
    pub until: PerfTime,
}

/// Result of resolving one key.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Resolution {
    Image { image: Arc<ImageInfo>, offset: u64 },
    Unknown(UnknownReason),
}

#[derive(Clone, Debug)]
enum MapImage {
    File(Arc<ImageInfo>),
    Vdso,
    Anon,
}

#[derive(Clone, Debug)]
struct Mapping {
    start: u64,
    end: u64,
    pgoff: u64,
    asid_from: u64,
    image: MapImage,
}

#[derive(Clone, Debug)]
struct DeadMapping {
    m: Mapping,
    asid_to: u64,
    died: PerfTime,
}

#[derive(Debug)]
struct Process {
    pid: u32,
    comm: Vec<u8>,
    /// Start time in clock ticks since boot (for the `[anon]` identity).
    start_ticks: u64,
    /// Samples at or after this time belong to this incarnation (0 for scanned processes).
    born: PerfTime,
    /// `(from_time, asid)`, ascending.
    versions: Vec<(PerfTime, u64)>,
    first_asid: u64,
    live: BTreeMap<u64, Mapping>,
    dead: Vec<DeadMapping>,
    exited: Option<PerfTime>,
    /// /proc/PID/maps was not readable at scan time (until the next exec).
    unreadable: bool,
    /// Threads other than the leader known to be alive; the process exits when the leader
    /// and all of them have (a leader may `pthread_exit` before the others).
    threads: u32,
    leader_gone: bool,
    uid: Option<u32>,
    jit: JitMapState,
    jit_checked_gen: u64,
    anon_image: Option<Arc<ImageInfo>>,
    /// Names of threads other than the leader, from COMM records (a thread that called
    /// `prctl(PR_SET_NAME)` or was named by `pthread_setname_np`) and inherited at thread creation
    /// from a named creator; at most [`MAX_THREAD_NAMES`]. Kept after a thread exits: its
    /// last samples are resolved after its exit record. Others are read from /proc when
    /// needed (`Aggregator`'s `name_who`).
    thread_names: HashMap<u32, Vec<u8>>,
}

/// Bound on the thread names kept per process.
const MAX_THREAD_NAMES: usize = 4096;

impl Process {
    fn new(pid: u32, born: PerfTime, asid: u64) -> Self {
        Self {
            pid,
            comm: Vec::new(),
            start_ticks: born / 10_000_000,
            born,
            versions: vec![(born, asid)],
            first_asid: asid,
            live: BTreeMap::new(),
            dead: Vec::new(),
            exited: None,
            unreadable: false,
            threads: 0,
            leader_gone: false,
            uid: None,
            jit: JitMapState::default(),
            jit_checked_gen: 0,
            anon_image: None,
            thread_names: HashMap::new(),
        }
    }

    fn current_asid(&self) -> u64 {
        self.versions.last().map_or(self.first_asid, |v| v.1)
    }

    fn last_asid(&self) -> u64 {
        self.current_asid()
    }

    fn push_version(&mut self, time: PerfTime, asid: u64) {
        if self.versions.len() >= MAX_VERSIONS {
            self.versions.remove(0);
        }
        self.versions.push((time, asid));
    }

    fn asid_at(&self, time: PerfTime) -> u64 {
        let i = self.versions.partition_point(|v| v.0 <= time);
        // A sample older than every version kept (pruned by gc, or late) gets the oldest.
        self.versions[i.saturating_sub(1)].1
    }

    /// End every live mapping overlapping [start, end), keeping the uncovered parts alive
    /// under `asid`.
    fn overlay(&mut self, start: u64, end: u64, asid: u64, time: PerfTime) {
        let hits: Vec<u64> = self
            .live
            .range(..end)
            .rev()
            .take_while(|(_, m)| m.end > start)
            .map(|(k, _)| *k)
            .collect();
        for k in hits {
            let Some(m) = self.live.remove(&k) else { continue };
            if m.start < start {
                let mut left = m.clone();
                left.end = start;
                left.asid_from = asid;
                self.live.insert(left.start, left);
            }
            if m.end > end {
                let mut right = m.clone();
                right.pgoff = m.pgoff.wrapping_add(end - m.start);
                right.start = end;
                right.asid_from = asid;
                self.live.insert(right.start, right);
            }
            self.dead.push(DeadMapping { m, asid_to: asid, died: time });
        }
    }

    fn kill_all(&mut self, asid: u64, time: PerfTime) {
        for (_, m) in std::mem::take(&mut self.live) {
            self.dead.push(DeadMapping { m, asid_to: asid, died: time });
        }
    }

    fn find(&self, asid: u64, pc: u64) -> Option<&Mapping> {
        if let Some((_, m)) = self.live.range(..=pc).next_back() {
            if pc < m.end && m.asid_from <= asid {
                return Some(m);
            }
        }
        self.dead
            .iter()
            .rev()
            .find(|d| d.m.asid_from <= asid && asid < d.asid_to && d.m.start <= pc && pc < d.m.end)
            .map(|d| &d.m)
    }

    fn mapping_count(&self) -> usize {
        self.live.len() + self.dead.len()
    }
}

/// Processes, address-space versions, image identities and kernel images.
#[derive(Debug)]
pub struct Resolver {
    cfg: ResolverConfig,
    next_asid: u64,
    /// Boxed: under exec churn thousands of processes wait here for their samples to be
    /// resolved, and an inline ~250-byte value made each doubling of the table a multi-MB
    /// transient (old and new table both live).
    procs: HashMap<u32, Box<Process>>,
    /// Earlier incarnations of reused pids (newest last).
    retired: HashMap<u32, Vec<Process>>,
    /// Shared with [`RecordIo`]: identities read before the resolver is locked land here.
    identities: Arc<IdentityCache>,
    /// One shared `ImageInfo` per (identity, path) of a file mapping: under exec churn every
    /// process maps the same few files, and a copy per mapping was most of the resolver's
    /// memory. Entries nobody else holds are dropped by `gc`.
    images: HashMap<(ImageId, Vec<u8>), Arc<ImageInfo>>,
    kernel: KernelState,
    vdso: Option<Arc<ImageInfo>>,
    t0: Option<PerfTime>,
    scanned: HashSet<u32>,
    generation: u64,
    stats: ResolverStats,
    jit_limits: jit::JitLimits,
}

impl Resolver {
    pub fn new(cfg: ResolverConfig) -> Self {
        Self {
            cfg,
            next_asid: 1,
            procs: HashMap::new(),
            retired: HashMap::new(),
            identities: Arc::new(IdentityCache::new(IDENTITY_CACHE_CAP)),
            images: HashMap::new(),
            kernel: KernelState::default(),
            vdso: None,
            t0: None,
            scanned: HashSet::new(),
            generation: 1,
            stats: ResolverStats::default(),
            jit_limits: jit::JitLimits::default(),
        }
    }

    pub fn config(&self) -> &ResolverConfig {
        &self.cfg
    }

    /// How much of each perf map is read from now on (settings `perf_map_max_bytes`,
    /// `perf_map_max_entries`; changed on reload).
    pub fn set_jit_limits(&mut self, limits: jit::JitLimits) {
        self.jit_limits = limits;
    }

    fn fresh_asid(&mut self) -> u64 {
        let a = self.next_asid;
        self.next_asid += 1;
        a
    }

    /// Read every `/proc/PID/maps`. `t0` is the perf clock taken before the scan started.
    pub fn scan_proc(&mut self, t0: PerfTime) -> ScanStats {
        let mut st = ScanStats::default();
        self.t0 = Some(t0);
        let root = self.cfg.proc_root.clone();
        let rd = match std::fs::read_dir(&root) {
            Ok(rd) => rd,
            Err(e) => {
                tracing::warn!("{}: cannot list processes: {e}", root.display());
                st.errors += 1;
                self.stats.scan = st;
                return st;
            }
        };
        let mut pids: Vec<u32> =
            rd.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok()).collect();
        pids.sort_unstable();
        for pid in pids {
            self.scan_one(pid, &mut st);
        }
        self.stats.scan = st;
        st
    }

    fn scan_one(&mut self, pid: u32, st: &mut ScanStats) {
        let dir = self.cfg.proc_root.join(pid.to_string());
        let maps = match procfs::read_bounded(&dir.join("maps"), MAX_MAPS_BYTES) {
            Ok(m) => Some(m),
            Err(e) if procfs::is_gone(&e) => {
                st.vanished += 1;
                return;
            }
            Err(e) if procfs::is_denied(&e) => {
                st.unreadable += 1;
                None
            }
            Err(e) => {
                tracing::debug!("{}: {e}", dir.join("maps").display());
                st.errors += 1;
                None
            }
        };
        let stat = procfs::read_bounded(&dir.join("stat"), 4096).ok();
        let parsed = stat.as_deref().and_then(procfs::parse_stat);
        let uid = std::fs::symlink_metadata(&dir).ok().map(|m| m.uid());
        self.scanned.insert(pid);
        let asid = match self.procs.get(&pid) {
            Some(p) => p.current_asid(),
            None => {
                let a = self.fresh_asid();
                let mut p = Process::new(pid, 0, a);
                p.versions[0].0 = 0;
                self.procs.insert(pid, Box::new(p));
                a
            }
        };
        let mut new_maps = Vec::new();
        if let Some(text) = &maps {
            for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                let Some(l) = maps::parse_maps_line(line) else {
                    st.garbage_lines += 1;
                    continue;
                };
                if !l.executable() || l.start >= KERNEL_START {
                    continue;
                }
                let image = if l.path == b"[vdso]" {
                    MapImage::Vdso
                } else if l.inode == 0 || l.path.is_empty() || l.path.starts_with(b"[") {
                    MapImage::Anon
                } else {
                    let mf = dir.join(format!("map_files/{:x}-{:x}", l.start, l.end));
                    let path = l.path_clean();
                    let id = match self.identities.identify(&mf, path, Some(l.inode)) {
                        Ok(id) => id,
                        Err(e) => {
                            tracing::debug!("{}: {e}", mf.display());
                            st.identity_errors += 1;
                            identify_gone(&self.identities, &e, path, l.inode)
                        }
                    };
                    MapImage::File(Arc::new(ImageInfo {
                        kind: ImageKind::Elf,
                        id,
                        path: path.to_vec(),
                        jit_symbols: Vec::new(),
                    }))
                };
                new_maps.push(Mapping {
                    start: l.start,
                    end: l.end,
                    pgoff: l.offset,
                    asid_from: asid,
                    image,
                });
            }
        }
        let Some(p) = self.procs.get_mut(&pid) else { return };
        if let Some((comm, start, threads)) = parsed {
            p.comm = comm;
            p.start_ticks = start;
            p.threads = threads.saturating_sub(1);
        }
        p.uid = uid;
        p.unreadable = maps.is_none();
        // Records applied before the scan reached this pid are newer: keep what they said.
        for m in new_maps {
            let overlaps = p.live.range(..m.end).next_back().is_some_and(|(_, o)| o.end > m.start);
            if !overlaps {
                st.mappings += 1;
                p.live.insert(m.start, m);
            }
        }
        if maps.is_some() {
            st.processes += 1;
        }
    }

    fn ignored(&mut self, pid: u32, time: PerfTime) -> bool {
        let skip = self.t0.is_some_and(|t0| time < t0) && self.scanned.contains(&pid);
        if skip {
            self.stats.ignored_before_scan += 1;
        }
        skip
    }

    /// The process `pid` as of `time`, created if unknown; an exited one is replaced by a new
    /// incarnation (its FORK was missed).
    fn proc_for_update(&mut self, pid: u32, time: PerfTime) -> &mut Process {
        let replace = self.procs.get(&pid).is_some_and(|p| p.exited.is_some_and(|e| e <= time));
        if replace {
            let asid = self.fresh_asid();
            self.replace_process(Process::new(pid, time, asid));
        } else if !self.procs.contains_key(&pid) {
            let asid = self.fresh_asid();
            let mut p = Process::new(pid, 0, asid);
            p.start_ticks = time / 10_000_000;
            self.procs.insert(pid, Box::new(p));
        }
        self.procs.get_mut(&pid).expect("inserted above")
    }

    fn replace_process(&mut self, p: Process) {
        let born = p.born;
        if let Some(mut old) = self.procs.insert(p.pid, Box::new(p)) {
            old.exited.get_or_insert(born);
            self.retired.entry(old.pid).or_default().push(*old);
        }
    }

    /// Apply one side-band record (the aggregator calls this in time order), reading the files
    /// it needs now.
    pub fn apply(&mut self, rec: &TimedSideBand) {
        self.apply_prepared(rec, &Prepared::default());
    }

    /// The file I/O of applying records, usable without the resolver ([`RecordIo`]).
    pub fn record_io(&self) -> RecordIo {
        RecordIo { proc_root: self.cfg.proc_root.clone(), identities: Arc::clone(&self.identities) }
    }

    /// [`Resolver::apply`], taking what `prepared` read beforehand ([`RecordIo::prepare`]);
    /// what it lacks is read now.
    pub fn apply_prepared(&mut self, rec: &TimedSideBand, prepared: &Prepared) {
        let t = rec.time;
        match &rec.record {
            // cgroup names are the aggregator's (`crate::who`), not the resolver's.
            SideBand::Cgroup { .. } => {}
            SideBand::Mmap2 { kernel: true, .. } => self.kernel.modules_stale = true,
            SideBand::Mmap2 { pid, .. } if *pid == u32::MAX => self.kernel.modules_stale = true,
            SideBand::Mmap2 { pid, addr, len, pgoff, ino, prot, build_id, filename, .. } => {
                if prot & PROT_EXEC == 0 || *len == 0 || self.ignored(*pid, t) {
                    return;
                }
                let end = addr.saturating_add(*len);
                let ready = prepared.identity.get(&(*pid, *addr, end, t)).cloned();
                let image =
                    self.mmap_image(*pid, *addr..end, *ino, build_id.as_deref(), filename, ready);
                self.proc_for_update(*pid, t);
                let asid = self.fresh_asid();
                let Some(p) = self.procs.get_mut(pid) else { return };
                p.overlay(*addr, end, asid, t);
                p.live.insert(
                    *addr,
                    Mapping { start: *addr, end, pgoff: *pgoff, asid_from: asid, image },
                );
                p.push_version(t, asid);
            }
            SideBand::Comm { pid, tid, comm, exec } => {
                if self.ignored(*pid, t) {
                    return;
                }
                if *exec {
                    self.proc_for_update(*pid, t);
                    let asid = self.fresh_asid();
                    // The uid after exec (a stat, cheap under exec churn): a process forked by
                    // root that called setuid before exec (runuser, setpriv) writes its perf
                    // map as the new user, and may be gone before its map is read.
                    let uid = match prepared.exec_uid.get(&(*pid, t)) {
                        Some(u) => *u,
                        None => proc_uid(&self.cfg.proc_root, *pid),
                    };
                    let Some(p) = self.procs.get_mut(pid) else { return };
                    if uid.is_some() {
                        p.uid = uid;
                    }
                    p.kill_all(asid, t);
                    p.push_version(t, asid);
                    // exec leaves one thread, which is now the leader.
                    p.threads = 0;
                    p.leader_gone = false;
                    p.unreadable = false;
                    p.anon_image = None;
                    p.comm.clone_from(comm);
                    p.thread_names.clear();
                } else if pid == tid {
                    let p = self.proc_for_update(*pid, t);
                    if p.comm != *comm {
                        p.comm.clone_from(comm);
                        p.anon_image = None;
                    }
                } else {
                    // A thread named itself (or was named): the who table's thread rows.
                    let p = self.proc_for_update(*pid, t);
                    if p.thread_names.len() < MAX_THREAD_NAMES || p.thread_names.contains_key(tid) {
                        p.thread_names.insert(*tid, comm.clone());
                    }
                }
            }
            SideBand::Fork { pid, ppid, tid, ptid } => {
                if self.ignored(*pid, t) {
                    return;
                }
                if pid == ppid {
                    // A new thread: same address space, and its creator's name (a thread id
                    // reused within the process forgets the old thread's).
                    if let Some(p) = self.procs.get_mut(pid) {
                        p.threads = p.threads.saturating_add(1);
                        match p.thread_names.get(ptid).cloned() {
                            Some(n) if p.thread_names.len() < MAX_THREAD_NAMES => {
                                p.thread_names.insert(*tid, n);
                            }
                            _ => {
                                p.thread_names.remove(tid);
                            }
                        }
                    }
                    return;
                }
                let asid = self.fresh_asid();
                let mut child = Process::new(*pid, t, asid);
                if let Some(parent) = self.procs.get(ppid) {
                    child.comm.clone_from(&parent.comm);
                    child.unreadable = parent.unreadable;
                    child.uid = parent.uid;
                    for (k, m) in &parent.live {
                        let mut m = m.clone();
                        m.asid_from = asid;
                        child.live.insert(*k, m);
                    }
                }
                self.replace_process(child);
            }
            SideBand::Exit { pid, tid, .. } => {
                if self.ignored(*pid, t) {
                    return;
                }
                let Some(p) = self.procs.get_mut(pid) else { return };
                if p.exited.is_some() || t < p.born {
                    return;
                }
                if pid == tid {
                    p.leader_gone = true;
                } else {
                    p.threads = p.threads.saturating_sub(1);
                }
                if p.leader_gone && p.threads == 0 {
                    p.exited = Some(t);
                }
            }
        }
    }

    fn mmap_image(
        &mut self,
        pid: u32,
        range: std::ops::Range<u64>,
        ino: Option<u64>,
        build_id: Option<&[u8]>,
        filename: &[u8],
        ready: Option<ImageId>,
    ) -> MapImage {
        if filename == b"[vdso]" {
            return MapImage::Vdso;
        }
        let Some(path) = mapped_file_path(filename) else { return MapImage::Anon };
        let id = match (build_id.and_then(procfs::valid_build_id), ready) {
            (Some(b), _) => ImageId::BuildId(b),
            (None, Some(id)) => id,
            (None, None) => {
                let (start, end) = (range.start, range.end);
                identify_mapping(&self.cfg.proc_root, &self.identities, pid, start, end, path, ino)
            }
        };
        let info =
            Arc::clone(self.images.entry((id, path.to_vec())).or_insert_with_key(|(id, path)| {
                Arc::new(ImageInfo {
                    kind: ImageKind::Elf,
                    id: id.clone(),
                    path: path.clone(),
                    jit_symbols: Vec::new(),
                })
            }));
        MapImage::File(info)
    }

    /// The address-space version of `pid` in force at `time`; `None` if the process is
    /// unknown at that time.
    pub fn asid_at(&self, pid: u32, time: PerfTime) -> Option<u64> {
        let p = self.procs.get(&pid)?;
        if time >= p.born {
            return Some(p.asid_at(time));
        }
        let old = self.retired.get(&pid)?;
        old.iter().rev().find(|o| time >= o.born).or(old.first()).map(|o| o.asid_at(time))
    }

    /// [`Resolver::asid_at`] with the interval over which its answer holds. The interval may
    /// be narrower than the truth, never wider.
    /// The command name (comm) of `pid` in the incarnation that `asid` names (0: the current
    /// one), if the process is known and has one.
    pub fn comm(&self, pid: u32, asid: u64) -> Option<&[u8]> {
        let p = match self.procs.get(&pid) {
            Some(p) if asid == 0 || asid >= p.first_asid => &**p,
            _ => self
                .retired
                .get(&pid)?
                .iter()
                .find(|o| o.first_asid <= asid && asid <= o.last_asid())?,
        };
        (!p.comm.is_empty()).then_some(p.comm.as_slice())
    }

    /// The name of thread `tid` of the current `pid` as COMM and FORK records told it, if
    /// they did (`None`: read /proc, or the thread is named as its process).
    pub fn thread_name(&self, pid: u32, tid: u32) -> Option<&[u8]> {
        self.procs.get(&pid)?.thread_names.get(&tid).map(Vec::as_slice)
    }

    /// Where `/proc` is (tests point it elsewhere).
    pub fn proc_root(&self) -> &std::path::Path {
        &self.cfg.proc_root
    }

    pub fn asid_span(&self, pid: u32, time: PerfTime) -> AsidSpan {
        let unknown = AsidSpan { asid: None, from: 0, until: PerfTime::MAX };
        let Some(p) = self.procs.get(&pid) else { return unknown };
        let (o, from, until) = if time >= p.born {
            (&**p, p.born, PerfTime::MAX)
        } else {
            let Some(old) = self.retired.get(&pid) else { return unknown };
            match old.iter().rposition(|o| time >= o.born) {
                Some(i) => (&old[i], old[i].born, old.get(i + 1).map_or(p.born, |n| n.born)),
                None => match old.first() {
                    // Older than every incarnation kept: the oldest answers, up to the next.
                    Some(o) => (o, 0, old.get(1).map_or(p.born, |n| n.born)),
                    None => return unknown,
                },
            }
        };
        let i = o.versions.partition_point(|v| v.0 <= time);
        let v_from = if i == 0 { 0 } else { o.versions[i - 1].0 };
        let v_until = o.versions.get(i.max(1)).map_or(PerfTime::MAX, |v| v.0);
        AsidSpan { asid: Some(o.asid_at(time)), from: from.max(v_from), until: until.min(v_until) }
    }

    /// Called once before resolving a batch (JIT maps are re-read at most once per batch).
    pub fn begin_batch(&mut self) {
        self.generation += 1;
    }

    /// Resolve one aggregation key. `asid` 0 means "process unknown at the sample's time".
    pub fn resolve(&mut self, pid: u32, asid: u64, pc: u64, kernel: bool) -> Resolution {
        if kernel || pc >= KERNEL_START {
            return match self.kernel.resolve(pc, &self.cfg.proc_root, &self.cfg.sys_root) {
                Some((image, offset)) => Resolution::Image { image, offset },
                None => Resolution::Unknown(UnknownReason::KernelUnknown),
            };
        }
        let asid = match asid {
            // The sample was aggregated before its process was known: if the process turned
            // out to be one the /proc scan (or a record without FORK) introduced, it existed
            // all along; use its first version. Otherwise the process is gone.
            0 => match self.procs.get(&pid) {
                Some(p) if p.born == 0 => p.first_asid,
                _ => return Resolution::Unknown(UnknownReason::ProcessGone),
            },
            a => a,
        };
        let generation = self.generation;
        let limits = self.jit_limits;
        // Field by field (not `incarnation_mut(&mut self)`): the paths are borrowed, not cloned
        // for every entry a flush resolves.
        let Some(p) = incarnation_mut(&mut self.procs, &mut self.retired, pid, asid) else {
            return Resolution::Unknown(UnknownReason::ProcessGone);
        };
        let Some(m) = p.find(asid, pc) else {
            return Resolution::Unknown(if p.unreadable {
                UnknownReason::Unreadable
            } else {
                UnknownReason::NoMap
            });
        };
        match &m.image {
            MapImage::File(img) => {
                let offset = pc.wrapping_sub(m.start).wrapping_add(m.pgoff);
                Resolution::Image { image: Arc::clone(img), offset }
            }
            MapImage::Vdso => {
                let offset = pc - m.start;
                Resolution::Image { image: self.vdso_image(), offset }
            }
            MapImage::Anon => {
                let read =
                    anon_refresh(p, generation, &self.cfg.jit_map_dir, &self.cfg.proc_root, limits);
                let image = anon_image(p);
                if read.changed {
                    self.stats.jit_maps_read += 1;
                }
                if read.truncated {
                    self.stats.jit_maps_truncated += 1;
                }
                Resolution::Image { image, offset: pc }
            }
        }
    }

    fn vdso_image(&mut self) -> Arc<ImageInfo> {
        if let Some(v) = &self.vdso {
            return Arc::clone(v);
        }
        let id = match sys::process::vdso_image().and_then(|b| vdso_build_id(&b)) {
            Some(b) => ImageId::BuildId(b),
            None => {
                let rel = kernel::kernel_release(&self.cfg.proc_root);
                ImageId::special("[vdso]", rel.as_bytes())
            }
        };
        let v = Arc::new(ImageInfo {
            kind: ImageKind::Vdso,
            id,
            path: b"[vdso]".to_vec(),
            jit_symbols: Vec::new(),
        });
        self.vdso = Some(Arc::clone(&v));
        v
    }

    /// Count unknown samples (for status).
    pub fn note_unknown(&mut self, reason: UnknownReason, samples: u64) {
        let s = &mut self.stats;
        match reason {
            UnknownReason::NoMap => s.unknown_no_map += samples,
            UnknownReason::ProcessGone => s.unknown_process_gone += samples,
            UnknownReason::Unreadable => s.unknown_unreadable += samples,
            UnknownReason::KernelUnknown => s.unknown_kernel += samples,
        }
    }

    /// The processes whose stacks may resolve differently after the next [`Resolver::gc`]:
    /// those that exited, have more than one address-space version, an ended mapping, or an
    /// earlier incarnation (a gc drops each of these). A stack counted for any other process,
    /// in its one version, resolves later as it does now, and may stay counted across takes;
    /// the idle task (pid 0) and kernel threads have kernel frames only. Usually empty: a gc
    /// leaves each live process one version and no ended mapping.
    pub fn unsettled_pids(&self) -> HashSet<u32> {
        let mut out: HashSet<u32> = self.retired.keys().copied().collect();
        out.extend(self.procs.iter().filter_map(|(&pid, p)| {
            (p.exited.is_some() || p.versions.len() > 1 || !p.dead.is_empty()).then_some(pid)
        }));
        out
    }

    /// Drop what no future sample can need: processes that exited, earlier incarnations,
    /// ended mappings and old versions, all at or before `horizon` (the watermark up to which
    /// every sample has been aggregated *and* resolved).
    pub fn gc(&mut self, horizon: PerfTime) {
        self.procs.retain(|_, p| p.exited.is_none_or(|e| e > horizon));
        self.retired.retain(|_, v| {
            v.retain(|o| o.exited.is_none_or(|e| e > horizon));
            !v.is_empty()
        });
        for p in self.procs.values_mut() {
            p.dead.retain(|d| d.died > horizon);
            let keep_from = p.versions.partition_point(|v| v.0 <= horizon).saturating_sub(1);
            if keep_from > 0 {
                p.versions.drain(..keep_from);
            }
        }
        if self.t0.is_some_and(|t0| horizon > t0) && !self.scanned.is_empty() {
            self.scanned = HashSet::new();
        }
        self.images.retain(|_, i| Arc::strong_count(i) > 1);
        // A burst of processes (a build, a crash loop) leaves a table sized for it; give the
        // memory back once it is mostly empty.
        if self.procs.capacity() > 64 && self.procs.len() * 4 < self.procs.capacity() {
            self.procs.shrink_to(self.procs.len() * 2);
        }
    }

    pub fn stats(&self) -> ResolverStats {
        let mut s = self.stats.clone();
        s.processes = self.procs.len() as u64;
        s.retired_processes = self.retired.values().map(|v| v.len() as u64).sum();
        s.mappings = self
            .procs
            .values()
            .map(|p| &**p)
            .chain(self.retired.values().flatten())
            .map(|p| p.mapping_count() as u64)
            .sum();
        s.identity_cache_entries = self.identities.len() as u64;
        (s.identity_cache_hits, s.identity_cache_misses, s.identity_errors) =
            self.identities.counters();
        s.last_asid = self.next_asid - 1;
        s
    }

    /// Snapshot of kernel symbols, modules and build-ids for the epoch's `kallsyms.snap`.
    pub fn kallsyms_snapshot(&self) -> Result<KallsymsSnapshot, ResolveError> {
        kallsyms_snapshot(&self.cfg)
    }
}

/// [`Resolver::kallsyms_snapshot`] without the resolver: the store refreshes the snapshot
/// while the drain threads keep using the resolver.
pub fn kallsyms_snapshot(cfg: &ResolverConfig) -> Result<KallsymsSnapshot, ResolveError> {
    read_kallsyms(cfg, |lines, modules, release, build_id, module_ids| {
        KallsymsSnapshot::from_proc_lines(lines, modules, release, build_id, module_ids)
    })
}

/// The `kallsyms.snap` bytes of [`kallsyms_snapshot`], built without the decoded snapshot,
/// which was most of the daemon's peak RSS (issue 13): the store keeps only these bytes.
pub fn kallsyms_file_bytes(cfg: &ResolverConfig) -> Result<Vec<u8>, ResolveError> {
    read_kallsyms(cfg, |lines, modules, release, build_id, module_ids| {
        KallsymsSnapshot::file_bytes_from_proc_lines(lines, modules, release, build_id, module_ids)
    })
}

/// /proc/kallsyms (streamed), /proc/modules and the build-ids, given to `build`.
fn read_kallsyms<T, F>(cfg: &ResolverConfig, build: F) -> Result<T, ResolveError>
where
    F: FnOnce(
        &mut dyn Iterator<Item = String>,
        &str,
        String,
        Option<Vec<u8>>,
        &dyn Fn(&str) -> Option<Vec<u8>>,
    ) -> profile_format::Result<T>,
{
    let proc_root = &cfg.proc_root;
    let rd = |name: &str, limit: u64| {
        let path = proc_root.join(name);
        procfs::read_bounded(&path, limit)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|source| ResolveError::Io { path, source })
    };
    // Streamed: the file is several MB, more than the snapshot's encoding.
    let kpath = proc_root.join("kallsyms");
    let mut read_error = None;
    let mut lines = procfs::lines_bounded(&kpath, kernel::MAX_KALLSYMS)
        .map_err(|source| ResolveError::Io { path: kpath.clone(), source })?
        .map_while(|l| l.map_err(|e| read_error = Some(e)).ok());
    // No /proc/modules (CONFIG_MODULES=n) is a kernel without modules.
    let modules = rd("modules", 16 << 20).unwrap_or_default();
    let sys = cfg.sys_root.clone();
    let built = build(
        &mut lines,
        &modules,
        kernel::kernel_release(proc_root),
        kernel::kernel_build_id(&sys),
        &|name| kernel::module_build_id(&sys, name),
    )?;
    drop(lines);
    if let Some(source) = read_error {
        return Err(ResolveError::Io { path: kpath, source });
    }
    Ok(built)
}

/// The path of the file an MMAP2 record's `filename` names, ` (deleted)` removed; `None` for
/// `[vdso]`, anonymous memory and other pseudo-files.
fn mapped_file_path(filename: &[u8]) -> Option<&[u8]> {
    if filename.is_empty()
        || filename == b"//anon"
        || filename.starts_with(b"[")
        || filename.starts_with(b"/dev/zero")
    {
        return None;
    }
    Some(filename.strip_suffix(b" (deleted)").unwrap_or(filename))
}

/// The owner of `/proc/PID` (the uid after an exec).
fn proc_uid(proc_root: &std::path::Path, pid: u32) -> Option<u32> {
    let dir = proc_root.join(pid.to_string());
    #[cfg(test)]
    identity::io_probe::note(&dir);
    std::fs::symlink_metadata(dir).ok().map(|m| m.uid())
}

/// Identity of the file a mapping without build-id holds (see [`identity`]).
fn identify_mapping(
    proc_root: &std::path::Path,
    identities: &IdentityCache,
    pid: u32,
    start: u64,
    end: u64,
    path: &[u8],
    ino: Option<u64>,
) -> ImageId {
    let mf = proc_root.join(format!("{pid}/map_files/{start:x}-{end:x}"));
    match identities.identify(&mf, path, ino) {
        Ok(id) => id,
        Err(e) => {
            tracing::debug!("{}: {e}", mf.display());
            identify_gone(identities, &e, path, ino.unwrap_or(0))
        }
    }
}

/// What [`RecordIo::prepare`] read for a run of side-band records, for
/// [`Resolver::apply_prepared`].
#[derive(Debug, Default)]
pub struct Prepared {
    /// Exec `(pid, time)` → owner of `/proc/PID` after it.
    exec_uid: HashMap<(u32, PerfTime), Option<u32>>,
    /// File mapping without build-id `(pid, start, end, time)` → identity.
    identity: HashMap<(u32, u64, u64, PerfTime), ImageId>,
}

impl Prepared {
    /// Facts read.
    pub fn len(&self) -> usize {
        self.exec_uid.len() + self.identity.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The file I/O of applying side-band records ([`Resolver::apply_prepared`]), done without
/// the resolver: the stat of `/proc/PID` at an exec, and the identity of a file mapping whose
/// MMAP2 record has no build-id (its `map_files` entry, or its path once the process is gone).
/// The identity cache is the resolver's own (shared).
#[derive(Clone, Debug)]
pub struct RecordIo {
    proc_root: PathBuf,
    identities: Arc<IdentityCache>,
}

impl RecordIo {
    /// Whether applying `rec` reads a file.
    pub fn needs_io(rec: &TimedSideBand) -> bool {
        match &rec.record {
            SideBand::Comm { exec, .. } => *exec,
            SideBand::Mmap2 { kernel: false, pid, len, prot, build_id, filename, .. } => {
                *pid != u32::MAX
                    && prot & PROT_EXEC != 0
                    && *len != 0
                    && filename != b"[vdso]"
                    && mapped_file_path(filename).is_some()
                    && build_id.as_deref().and_then(procfs::valid_build_id).is_none()
            }
            _ => false,
        }
    }

    /// Read what applying `recs` needs (records that need nothing are skipped).
    pub fn prepare<'a>(&self, recs: impl IntoIterator<Item = &'a TimedSideBand>) -> Prepared {
        let mut out = Prepared::default();
        for rec in recs {
            if !Self::needs_io(rec) {
                continue;
            }
            let t = rec.time;
            match &rec.record {
                SideBand::Comm { pid, .. } => {
                    out.exec_uid.insert((*pid, t), proc_uid(&self.proc_root, *pid));
                }
                SideBand::Mmap2 { pid, addr, len, ino, filename, .. } => {
                    let end = addr.saturating_add(*len);
                    let Some(path) = mapped_file_path(filename) else { continue };
                    let id = identify_mapping(
                        &self.proc_root,
                        &self.identities,
                        *pid,
                        *addr,
                        end,
                        path,
                        *ino,
                    );
                    out.identity.insert((*pid, *addr, end, t), id);
                }
                _ => {}
            }
        }
        out
    }
}

/// Re-read the process's perf map once per batch.
/// The incarnation of `pid` that `asid` names: the live process or a retired one.
fn incarnation_mut<'a>(
    procs: &'a mut HashMap<u32, Box<Process>>,
    retired: &'a mut HashMap<u32, Vec<Process>>,
    pid: u32,
    asid: u64,
) -> Option<&'a mut Process> {
    match procs.get_mut(&pid) {
        Some(p) if asid >= p.first_asid => Some(&mut **p),
        _ => retired
            .get_mut(&pid)?
            .iter_mut()
            .find(|o| o.first_asid <= asid && asid <= o.last_asid()),
    }
}

fn anon_refresh(
    p: &mut Process,
    generation: u64,
    jit_dir: &std::path::Path,
    proc_root: &std::path::Path,
    limits: jit::JitLimits,
) -> jit::Refreshed {
    if p.jit_checked_gen == generation {
        return jit::Refreshed::default();
    }
    p.jit_checked_gen = generation;
    if p.exited.is_none() {
        // The owner check uses the process's uid now: the one inherited at fork (or seen by
        // the scan) is stale once it called setuid (runuser, setpriv, a JIT dropping root)
        // before writing its map. Once it exited, the last uid seen stays.
        let dir = proc_root.join(p.pid.to_string());
        let now = procfs::read_bounded(&dir.join("status"), 16 << 10)
            .ok()
            .as_deref()
            .and_then(procfs::parse_status_euid)
            .or_else(|| std::fs::symlink_metadata(&dir).ok().map(|m| m.uid()));
        if now.is_some() {
            p.uid = now;
        }
    }
    let path = jit_dir.join(format!("perf-{}.map", p.pid));
    let r = jit::refresh(&path, p.uid, limits, &mut p.jit);
    if r.changed {
        p.anon_image = None;
    }
    r
}

fn anon_image(p: &mut Process) -> Arc<ImageInfo> {
    if let Some(a) = &p.anon_image {
        return Arc::clone(a);
    }
    let mut disc = Vec::with_capacity(12);
    disc.extend_from_slice(&p.pid.to_le_bytes());
    disc.extend_from_slice(&p.start_ticks.to_le_bytes());
    let mut path = format!("[anon:{}:", p.pid).into_bytes();
    path.extend_from_slice(&p.comm);
    path.push(b']');
    let a = Arc::new(ImageInfo {
        kind: ImageKind::Anon,
        id: ImageId::special("[anon]", &disc),
        path,
        jit_symbols: p.jit.symbols.clone(),
    });
    p.anon_image = Some(Arc::clone(&a));
    a
}

/// The build-id of an in-memory ELF image (the vDSO).
fn vdso_build_id(image: &[u8]) -> Option<Vec<u8>> {
    use object::Object;
    // object's build_id() reads every note section with its note iterator.
    let obj = object::File::parse(image).ok()?;
    procfs::valid_build_id(obj.build_id().ok()??)
}

/// Identity of a mapped file whose `map_files` entry could not be read: the file is found
/// again by path (inode-checked), unless the error was a permission error, which means the
/// daemon lacks `CAP_SYS_PTRACE`, and the path must not stand in for what that capability
/// guards. Otherwise, a degraded fallback id.
///
/// Any other error qualifies, not only `NotFound`: the lookup of an exiting process's entry can
/// fail otherwise too (a killable lock interrupted, ESRCH), and a degraded id splits one
/// library into two images. Seen once: rustc's `librustc_driver` (no build-id) under two ids
/// after an hour of builds; which error it met there was not pinned down.
pub(crate) fn identify_gone(
    identities: &identity::IdentityCache,
    err: &std::io::Error,
    path: &[u8],
    ino: u64,
) -> ImageId {
    if err.kind() != std::io::ErrorKind::PermissionDenied {
        if let Ok(id) = identities.identify_by_path(path, ino) {
            return id;
        }
    }
    ImageId::fallback(path, 0, 0, ino)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gone_mapping_keeps_its_identity_whatever_the_error_except_permission() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("lib-without-build-id.so");
        std::fs::write(&p, "no ELF notes here").expect("write");
        let ino = std::fs::metadata(&p).expect("stat").ino();
        let path = p.as_os_str().as_bytes();
        let live = identity::IdentityCache::new(8).identify(&p, path, Some(ino)).expect("live");
        let degraded = ImageId::fallback(path, 0, 0, ino);
        for errno in [libc::ENOENT, libc::ESRCH] {
            let c = identity::IdentityCache::new(8);
            let err = std::io::Error::from_raw_os_error(errno);
            assert_eq!(identify_gone(&c, &err, path, ino), live, "errno {errno}");
        }
        let c = identity::IdentityCache::new(8);
        let denied = std::io::Error::from_raw_os_error(libc::EACCES);
        assert_eq!(identify_gone(&c, &denied, path, ino), degraded);
    }

    fn rec(time: PerfTime, record: SideBand) -> TimedSideBand {
        TimedSideBand { time, cpu: 0, record }
    }

    fn exec_mmap(pid: u32, name: &[u8], id: u8) -> SideBand {
        SideBand::Mmap2 {
            pid,
            tid: pid,
            addr: 0x40_0000,
            len: 0x1000,
            pgoff: 0,
            dev: None,
            ino: None,
            ino_generation: None,
            prot: PROT_EXEC,
            flags: 0,
            build_id: Some(vec![id; 20]),
            filename: name.to_vec(),
            kernel: false,
        }
    }

    /// The aggregator caches `asid_span` answers for the whole span: every time inside it
    /// must get the same asid from `asid_at`, across forks, execs, mmaps, exits, a reused
    /// pid and gc.
    #[test]
    fn asid_span_agrees_with_asid_at_over_its_whole_interval() {
        let mut r = Resolver::new(ResolverConfig {
            proc_root: "/nonexistent-proc".into(),
            sys_root: "/nonexistent-sys".into(),
            jit_map_dir: "/nonexistent-tmp".into(),
        });
        let (parent, pid) = (100, 200);
        let comm = |pid, exec| SideBand::Comm { pid, tid: pid, comm: b"x".to_vec(), exec };
        let fork = |pid, ppid| SideBand::Fork { pid, ppid, tid: pid, ptid: ppid };
        let exit = |pid, ppid| SideBand::Exit { pid, ppid, tid: pid, ptid: ppid };
        for r0 in [
            rec(10, fork(pid, parent)),
            rec(20, comm(pid, true)),
            rec(21, exec_mmap(pid, b"/bin/a", 1)),
            rec(30, fork(pid, pid)),
            rec(40, exec_mmap(pid, b"/lib/x.so", 2)),
            rec(50, exit(pid, parent)),
            // The pid is reused by another program.
            rec(60, fork(pid, parent)),
            rec(61, comm(pid, true)),
            rec(62, exec_mmap(pid, b"/bin/b", 3)),
            rec(80, exit(pid, parent)),
        ] {
            r.apply(&r0);
        }
        let check = |r: &Resolver| {
            for who in [pid, parent, 999] {
                for t in 0..100 {
                    let s = r.asid_span(who, t);
                    assert_eq!(s.asid, r.asid_at(who, t), "pid {who} time {t}");
                    assert!(s.from <= t && t < s.until, "pid {who} time {t}: {s:?}");
                    for u in s.from..s.until.min(100) {
                        assert_eq!(r.asid_at(who, u), s.asid, "pid {who}: {t} vs {u} in {s:?}");
                    }
                }
            }
        };
        check(&r);
        // The two incarnations never share an asid.
        assert_ne!(r.asid_at(pid, 45), r.asid_at(pid, 70));
        r.gc(55);
        check(&r);
        r.gc(100);
        check(&r);
    }

    #[test]
    fn own_vdso_is_readable_and_identified() {
        let Some(image) = sys::process::vdso_image() else {
            eprintln!("SKIPPED: no vDSO in this process");
            return;
        };
        assert_eq!(&image[..4], b"\x7fELF");
        let mut r = Resolver::new(ResolverConfig::default());
        let v = r.vdso_image();
        assert_eq!(v.kind, ImageKind::Vdso);
        // Kernels build the vDSO with a build-id; when they do, it is the identity.
        if let Some(b) = vdso_build_id(&image) {
            assert_eq!(v.id, ImageId::BuildId(b));
        }
    }
}
