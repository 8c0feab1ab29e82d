//! Who used the CPU: the `[idle]` pseudo-image, and per-sample attribution (command, pid,
//! CPU, cgroup) for the who table (FORMAT.md §12).
//!
//! Samples of the idle task (pid 0, the swapper) are kernel samples like any other, but on a
//! mostly idle machine they are nearly all of them: counted as the kernel they would make the
//! kernel look like the hottest image. They are kept apart as `[idle]` (FORMAT.md §5.1.1).

// hashbrown's maps (foldhash, seeded per process) for the per-entry work of a flush: std's
// SipHash was a tenth of the flush thread's CPU, and `Equivalent` lets a lookup borrow the
// image id instead of cloning it for every table entry.
use hashbrown::{Equivalent, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hashbrown::hash_map::Entry;
use profile_format::{ImageId, ImageKind};

use crate::types::{EventIdx, ImageInfo, PerfTime};

/// Path of the idle pseudo-image, as reports show it.
pub const IDLE_PATH: &[u8] = b"[idle]";

/// The command dcpid gives a pid that no comm names: `swapper` for the idle task (pid 0),
/// `[exiting]` for the kernel's pid -1 (a task whose pid was already released: FORMAT.md §12);
/// `None` for every other pid, which is named from the resolver or `/proc/PID/comm`. One rule
/// for the who table and the stacks' commands.
pub fn reserved_command(pid: u32) -> Option<&'static [u8]> {
    match pid {
        0 => Some(b"swapper"),
        profile_format::EXITING_PID => Some(profile_format::EXITING_COMMAND),
        _ => None,
    }
}

/// The `[idle]` image of the kernel `kernel`: kind `Kernel` with the same offsets (so its
/// samples symbolize against the epoch's kallsyms snapshot, e.g. `default_idle`, and a reader
/// that predates `[idle]` shows it as one more kernel image), but its own identity.
pub fn idle_image(kernel: &ImageInfo) -> Arc<ImageInfo> {
    Arc::new(ImageInfo {
        kind: ImageKind::Kernel,
        id: ImageId::special("[idle]", kernel.id.to_text().as_bytes()),
        path: IDLE_PATH.to_vec(),
        jit_symbols: Vec::new(),
    })
}

// ---------------------------------------------------------------------------------------------
// Per-sample attribution: command, pid, CPU and cgroup of every sample.
//
// The per-CPU tables key user samples by (pid, asid, pc), so their process and image are known
// when they are resolved; kernel samples share one key across processes (that is what keeps
// kernel entries few), so their process is counted here instead, per (pid, event), as are the
// samples of each CPU and the last cgroup each pid was seen in. A process that changes cgroup
// within one flush interval is counted in the cgroup its last user-mode sample showed (kernel
// samples only name a cgroup for a process that had no user-mode one: a process's exit path
// runs after the kernel moved it to the root cgroup).

const CGROUP_SLOTS: usize = 256;
const KERNEL_SLOTS: usize = 64;
const THREAD_SLOTS: usize = 64;

/// Who counters of one CPU, updated per sample under that CPU's mutex.
#[derive(Debug)]
pub struct CpuWho {
    /// Samples per event on this CPU.
    per_event: Vec<u64>,
    /// Kernel samples per (pid, event); pid 0 is the idle task.
    kernel: HashMap<(u32, EventIdx), u64>,
    /// Samples of threads other than their process's leader per (pid, tid, event), kernel
    /// and user mode alike: named at the flush, they become the who table's thread rows.
    threads: HashMap<(u32, u32, EventIdx), u64>,
    /// Direct-mapped counters in front of `threads` (count 0 = empty), as `kslots`.
    tslots: Box<[(u32, u32, EventIdx, u64)]>,
    /// Direct-mapped counters in front of `kernel` (count 0 = empty): a run of kernel samples
    /// of one process costs an increment, not a hash-map update each.
    kslots: Box<[(u32, EventIdx, u64)]>,
    /// Last cgroup id seen per pid (only ids the kernel gave: 0 means it did not say),
    /// whether a user-mode sample showed it (see the section comment), and the time of the
    /// sample that first showed it (the newest such choice wins across CPUs).
    pid_cgroup: HashMap<u32, (u64, bool, PerfTime)>,
    /// Direct-mapped `(pid, cgroup, user mode)` of what `pid_cgroup` already holds: most
    /// samples cost one compare instead of a hash-map update. The mode is part of the key: a
    /// process first seen in a kernel sample must still be marked as seen in user mode by its
    /// next user-mode sample, or its exit path on another CPU (in the root cgroup) outranks it.
    seen: Box<[(u32, u64, bool)]>,
}

impl Default for CpuWho {
    fn default() -> Self {
        Self {
            per_event: Vec::new(),
            kernel: HashMap::new(),
            kslots: vec![(0, 0, 0); KERNEL_SLOTS].into_boxed_slice(),
            threads: HashMap::new(),
            tslots: vec![(0, 0, 0, 0); THREAD_SLOTS].into_boxed_slice(),
            pid_cgroup: HashMap::new(),
            seen: vec![(u32::MAX, 0, false); CGROUP_SLOTS].into_boxed_slice(),
        }
    }
}

impl CpuWho {
    /// Count one sample of thread `tid` of process `pid` that went into the table. `kernel`:
    /// taken in kernel mode.
    #[inline]
    pub fn count(
        &mut self,
        pid: u32,
        tid: u32,
        cgroup: u64,
        event: EventIdx,
        kernel: bool,
        time: PerfTime,
    ) {
        let e = usize::from(event);
        if e >= self.per_event.len() {
            self.per_event.resize(e + 1, 0);
        }
        self.per_event[e] += 1;
        // The leader is named by the process's command; only other threads may differ.
        if tid != pid && pid != 0 {
            let s = &mut self.tslots[(tid as usize ^ (e << 7)) % THREAD_SLOTS];
            if s.3 > 0 && (s.0, s.1, s.2) == (pid, tid, event) {
                s.3 += 1;
            } else {
                if s.3 > 0 {
                    *self.threads.entry((s.0, s.1, s.2)).or_insert(0) += s.3;
                }
                *s = (pid, tid, event, 1);
            }
        }
        if kernel {
            let s = &mut self.kslots[(pid as usize ^ (e << 7)) % KERNEL_SLOTS];
            if s.2 > 0 && (s.0, s.1) == (pid, event) {
                s.2 += 1;
            } else {
                if s.2 > 0 {
                    *self.kernel.entry((s.0, s.1)).or_insert(0) += s.2;
                }
                *s = (pid, event, 1);
            }
        }
        if cgroup != 0 {
            let slot = &mut self.seen[pid as usize % CGROUP_SLOTS];
            if *slot != (pid, cgroup, !kernel) {
                *slot = (pid, cgroup, !kernel);
                if kernel {
                    // A process's last samples, in its exit path, are taken after the kernel
                    // moved it out of its cgroup (to the root): a kernel sample does not
                    // override what a user-mode one said.
                    self.pid_cgroup.entry(pid).or_insert((cgroup, false, time));
                } else if self.pid_cgroup.get(&pid).is_none_or(|c| c.0 != cgroup || !c.1) {
                    self.pid_cgroup.insert(pid, (cgroup, true, time));
                }
            }
        }
    }

    /// Move the counts into `out` (CPU `cpu`) and start afresh.
    pub fn take_into(&mut self, cpu: u32, out: &mut WhoBatch) {
        for (e, n) in self.per_event.iter_mut().enumerate() {
            if *n > 0 {
                *out.cpus.entry((cpu, e as EventIdx)).or_insert(0) += *n;
                *n = 0;
            }
        }
        for s in self.kslots.iter_mut().filter(|s| s.2 > 0) {
            *self.kernel.entry((s.0, s.1)).or_insert(0) += s.2;
            *s = (0, 0, 0);
        }
        for (k, n) in self.kernel.drain() {
            *out.kernel.entry(k).or_insert(0) += n;
        }
        for s in self.tslots.iter_mut().filter(|s| s.3 > 0) {
            *self.threads.entry((s.0, s.1, s.2)).or_insert(0) += s.3;
            *s = (0, 0, 0, 0);
        }
        for (k, n) in self.threads.drain() {
            *out.threads.entry(k).or_insert(0) += n;
        }
        // The same rule across CPUs: what a user-mode sample showed wins, and of those the
        // newest. A process moved into its group just before exec (`echo $$ >
        // cgroup.procs; exec`, as systemd and container runtimes do) ran in the old group on
        // one CPU and in the new one on another within one interval: the CPUs' order must
        // not decide.
        for (pid, (cgroup, user, since)) in self.pid_cgroup.drain() {
            out.note_cgroup(pid, cgroup, (user, since));
        }
        self.seen.fill((u32::MAX, 0, false));
    }
}

/// What a resolved batch says about who used the CPU (see the section comment above).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WhoBatch {
    /// User-mode samples per (pid, image, event); `None` = not attributable (`[unknown]`).
    pub user: HashMap<(u32, Option<ImageId>, EventIdx), u64>,
    /// The images `user` names.
    pub images: HashMap<ImageId, Arc<ImageInfo>>,
    /// Kernel-mode samples per (pid, event); pid 0 is the idle task (`[idle]`).
    pub kernel: HashMap<(u32, EventIdx), u64>,
    /// Command name per pid (as of the batch).
    pub comms: HashMap<u32, Vec<u8>>,
    /// cgroup id per pid (the last one seen in the batch).
    pub cgroups: HashMap<u32, u64>,
    /// Path per cgroup id of `cgroups` (relative to the v2 root, starting with `/`).
    pub cgroup_paths: HashMap<u64, String>,
    /// Samples per (CPU, event).
    pub cpus: HashMap<(u32, EventIdx), u64>,
    /// Samples of non-leader threads per (pid, tid, event) (user and kernel mode).
    pub threads: HashMap<(u32, u32, EventIdx), u64>,
    /// Name (comm) per (pid, tid) of `threads`, as of the batch; a thread not named here is
    /// counted as its command only.
    pub thread_names: HashMap<(u32, u32), Vec<u8>>,
    /// User-mode samples per (pid, image, offset, event), for the live view ([`Recent`]);
    /// taken out of the batch when it is recorded there.
    pub hot: Vec<(u32, Arc<ImageInfo>, u64, EventIdx, u64)>,
    /// Kernel-mode samples of processes other than the idle task per (kernel or module image,
    /// offset, event), for the live view's kernel functions; taken with `hot`.
    pub hot_kernel: Vec<(Arc<ImageInfo>, u64, EventIdx, u64)>,
    /// Why `cgroups` holds each pid's id: (shown by a user-mode sample, since when).
    cgroup_rank: HashMap<u32, (bool, PerfTime)>,
}

/// A borrowed `WhoBatch::user` key: hashes and compares as the owned tuple.
#[derive(Hash)]
struct UserKeyRef<'a>(u32, Option<&'a ImageId>, EventIdx);

impl Equivalent<(u32, Option<ImageId>, EventIdx)> for UserKeyRef<'_> {
    fn equivalent(&self, k: &(u32, Option<ImageId>, EventIdx)) -> bool {
        self.0 == k.0 && self.1 == k.1.as_ref() && self.2 == k.2
    }
}

impl WhoBatch {
    /// Count resolved user-mode samples.
    pub fn add_user(&mut self, pid: u32, image: Option<&Arc<ImageInfo>>, event: EventIdx, n: u64) {
        if let Some(i) = image {
            if !self.images.contains_key(&i.id) {
                self.images.insert(i.id.clone(), Arc::clone(i));
            }
        }
        let key = UserKeyRef(pid, image.map(|i| &i.id), event);
        match self.user.get_mut(&key) {
            Some(c) => *c += n,
            None => {
                self.user.insert((pid, key.1.cloned(), event), n);
            }
        }
    }

    /// `pid`'s cgroup is `cgroup`, unless one shown with a better rank (user-mode first, then
    /// newest) is already there; on a tie the later call wins.
    fn note_cgroup(&mut self, pid: u32, cgroup: u64, rank: (bool, PerfTime)) {
        if self.cgroup_rank.get(&pid).is_none_or(|r| rank >= *r) {
            self.cgroup_rank.insert(pid, rank);
            self.cgroups.insert(pid, cgroup);
        }
    }

    /// Add another batch (an early drain's) into this one.
    pub fn merge(&mut self, o: Self) {
        for (k, n) in o.user {
            *self.user.entry(k).or_insert(0) += n;
        }
        for (k, v) in o.images {
            self.images.entry(k).or_insert(v);
        }
        for (k, n) in o.kernel {
            *self.kernel.entry(k).or_insert(0) += n;
        }
        for (k, n) in o.cpus {
            *self.cpus.entry(k).or_insert(0) += n;
        }
        for (k, n) in o.threads {
            *self.threads.entry(k).or_insert(0) += n;
        }
        self.thread_names.extend(o.thread_names);
        self.comms.extend(o.comms);
        self.hot.extend(o.hot);
        self.hot_kernel.extend(o.hot_kernel);
        for (pid, cgroup) in o.cgroups {
            let rank = o.cgroup_rank.get(&pid).copied().unwrap_or_default();
            self.note_cgroup(pid, cgroup, rank);
        }
        self.cgroup_paths.extend(o.cgroup_paths);
    }

    /// Every pid the batch counts.
    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.user.keys().map(|k| k.0).chain(self.kernel.keys().map(|k| k.0))
    }

    /// Samples per (pid, image display name, event), for `dcpictl top` and the who table.
    pub fn rows(&self) -> Vec<(u32, Vec<u8>, EventIdx, u64)> {
        let mut out = Vec::with_capacity(self.user.len() + self.kernel.len());
        for ((pid, id, ev), &n) in &self.user {
            let image = match id.as_ref().and_then(|i| self.images.get(i)) {
                Some(i) => i.path.clone(),
                None => b"[unknown]".to_vec(),
            };
            out.push((*pid, image, *ev, n));
        }
        for ((pid, ev), &n) in &self.kernel {
            let image = if *pid == 0 { IDLE_PATH } else { b"[kernel.kallsyms]" };
            out.push((*pid, image.to_vec(), *ev, n));
        }
        out
    }

    /// Samples per (pid, thread name, event) of the threads named otherwise than their
    /// process's command (the who table's thread rows); several threads of one name add up.
    pub fn thread_rows(&self) -> Vec<(u32, Vec<u8>, EventIdx, u64)> {
        let mut out: HashMap<(u32, &[u8], EventIdx), u64> = HashMap::new();
        for (&(pid, tid, ev), &n) in &self.threads {
            let Some(name) = self.thread_names.get(&(pid, tid)) else { continue };
            if self.comms.get(&pid).is_some_and(|c| c == name) {
                continue;
            }
            *out.entry((pid, name.as_slice(), ev)).or_insert(0) += n;
        }
        out.into_iter().map(|((pid, name, ev), n)| (pid, name.to_vec(), ev, n)).collect()
    }

    /// Command of `pid` as the table shows it.
    pub fn command(&self, pid: u32) -> Vec<u8> {
        match (self.comms.get(&pid), reserved_command(pid)) {
            (Some(c), _) => c.clone(),
            (None, Some(r)) => r.to_vec(),
            (None, None) => format!("[pid {pid}]").into_bytes(),
        }
    }

    /// cgroup path of `pid` ("" when unknown).
    pub fn cgroup(&self, pid: u32) -> String {
        if pid == 0 {
            return "/".to_owned();
        }
        self.cgroups
            .get(&pid)
            .map(|id| self.cgroup_paths.get(id).cloned().unwrap_or_else(|| format!("cgroup:{id}")))
            .unwrap_or_default()
    }

    /// Fill in `comms` for pids the resolver did not name (kernel threads: it has no maps for
    /// them) from `/proc/PID/comm`.
    pub fn read_missing_comms(&mut self, proc_root: &Path) {
        let missing: Vec<u32> = self
            .pids()
            .filter(|p| reserved_command(*p).is_none() && !self.comms.contains_key(p))
            .collect();
        for pid in missing {
            if let Ok(s) = std::fs::read(proc_root.join(pid.to_string()).join("comm")) {
                let s = s.strip_suffix(b"\n").unwrap_or(&s).to_vec();
                self.comms.insert(pid, s);
            }
        }
    }
}

/// Thread names read from `/proc/PID/task/TID/comm`, for threads no COMM record named
/// (named before dcpid started, or never renamed): read once per thread, failures
/// included (an exited thread), so that a thread costs one read, not one per flush.
#[derive(Debug, Default)]
pub struct ThreadNames {
    read: HashMap<(u32, u32), Option<Vec<u8>>>,
}

impl ThreadNames {
    /// Threads remembered; all are forgotten past this (a read again costs one file each).
    pub const MAX: usize = 16_384;

    /// The name of thread `tid` of `pid` (`None`: it could not be read).
    pub fn name(&mut self, proc_root: &Path, pid: u32, tid: u32) -> Option<Vec<u8>> {
        if let Some(n) = self.read.get(&(pid, tid)) {
            return n.clone();
        }
        if self.read.len() >= Self::MAX {
            self.read.clear();
        }
        let path = proc_root.join(pid.to_string()).join("task").join(tid.to_string()).join("comm");
        let n = std::fs::read(path).ok().map(|s| s.strip_suffix(b"\n").unwrap_or(&s).to_vec());
        self.read.insert((pid, tid), n.clone());
        n
    }
}

/// One code row of the live view: samples of one event per (command, image, offset), merged
/// over the command's processes. Kernel code has no command (`command` empty): kernel entries
/// are shared by every process in the per-CPU tables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HotRow {
    pub command: Vec<u8>,
    /// One process that ran it (the first seen); 0 for kernel code and idle.
    pub pid: u32,
    pub image: Vec<u8>,
    pub kind: ImageKind,
    pub build_id: Option<Vec<u8>>,
    /// Offset as FORMAT.md §5.1 defines it for the kind; None for the idle row.
    pub offset: Option<u64>,
    pub event: EventIdx,
    pub samples: u64,
}

/// Samples of one process in one image (`[kernel.kallsyms]`: its kernel-mode samples).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HotProcess {
    pub pid: u32,
    pub command: Vec<u8>,
    pub image: Vec<u8>,
    pub event: EventIdx,
    pub samples: u64,
}

/// What `top` returns: per-event totals and idle samples of the window, and its hottest rows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HotView {
    pub totals: Vec<u64>,
    pub idle: Vec<u64>,
    pub rows: Vec<HotRow>,
    pub processes: Vec<HotProcess>,
}

/// The last batches' hottest rows, for `dcpictl top` (memory only, no disk I/O).
#[derive(Clone, Debug, Default)]
pub struct Recent {
    batches: std::collections::VecDeque<Batch>,
    /// Batches recorded so far: `batches.back()` is number `pushed - 1`.
    pushed: u64,
    /// The last answer and what it was made from: a request over the same batches (none
    /// recorded, none aged out of the window) returns it without merging anything.
    last: Option<LastView>,
    /// The merge's maps and lists, cleared rather than dropped between requests: allocated
    /// afresh at every request, their page faults were ~22 % of the control thread with a
    /// client watching at 2 refreshes per second (perf, issue 38).
    scratch: Scratch,
}

#[derive(Clone, Debug)]
struct LastView {
    /// Number of the window's first batch, and of batches recorded (the first one after the
    /// window), when it was made; and its `limit`.
    first: u64,
    last: u64,
    limit: usize,
    view: Arc<HotView>,
    /// When it was asked for.
    at: Instant,
}

type MergeKey = (u32, u32, Option<u64>, EventIdx);

#[derive(Clone, Debug, Default)]
struct Scratch {
    merged: HashMap<MergeKey, (u32, u64)>,
    procs: HashMap<(u32, u32, EventIdx), (u32, u64)>,
    rows: Vec<(MergeKey, (u32, u64))>,
    processes: Vec<((u32, u32, EventIdx), (u32, u64))>,
    image_map: Vec<(u32, u32)>,
}

/// One batch's rows. Each path, build-id and command is kept once per batch, not per row: up
/// to 4 096 rows a batch for 30 s, as [`HotRow`]s with their own copies, were ~5 MiB of
/// dcpid's steady RSS on a busy machine (issue 13); a row is 32 bytes here. Only the images
/// that the kept rows name are copied, and each command once.
#[derive(Clone, Debug)]
struct Batch {
    at: Instant,
    /// Samples per event index, and the idle task's.
    totals: Vec<u64>,
    idle: Vec<u64>,
    /// (path, build-id, kind) of the images the rows name.
    images: Vec<(Vec<u8>, Option<Vec<u8>>, ImageKind)>,
    /// Commands the rows name; [`NO_COMMAND`] is kernel code.
    commands: Vec<Vec<u8>>,
    rows: Vec<PackedRow>,
    processes: Vec<PackedProcess>,
}

/// Command index of kernel code rows.
const NO_COMMAND: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct PackedRow {
    command: u32,
    pid: u32,
    /// Index into [`Batch::images`].
    image: u32,
    offset: u64,
    event: EventIdx,
    samples: u64,
}

/// Samples of one process in one image (`[kernel.kallsyms]`, `[unknown]`: pseudo-images
/// with no build-id in [`Batch::images`]).
#[derive(Debug, Clone, Copy)]
struct PackedProcess {
    pid: u32,
    command: u32,
    image: u32,
    event: EventIdx,
    samples: u64,
}

fn add_at(v: &mut Vec<u64>, i: usize, n: u64) {
    if v.len() <= i {
        v.resize(i + 1, 0);
    }
    v[i] += n;
}

/// An image of a batch being recorded: a resolved one, or a pseudo-image of the process rows.
enum Source {
    Image(Arc<ImageInfo>),
    Named(&'static [u8], ImageKind),
}

/// Values interned once per batch or per request, so rows can be keyed by small integers
/// instead of hashing and cloning a path or a command per row.
struct Interner<K> {
    index: HashMap<K, u32>,
    list: Vec<K>,
}

impl<K: std::hash::Hash + Eq + Copy> Interner<K> {
    fn new() -> Self {
        Self { index: HashMap::new(), list: Vec::new() }
    }

    /// Index of `k`, and whether it is new.
    fn get(&mut self, k: K) -> (u32, bool) {
        let n = self.list.len() as u32;
        match self.index.entry(k) {
            Entry::Occupied(e) => (*e.get(), false),
            Entry::Vacant(v) => {
                v.insert(n);
                self.list.push(k);
                (n, true)
            }
        }
    }
}

impl Recent {
    /// Batches older than this are dropped.
    pub const KEEP: Duration = Duration::from_secs(30);
    /// Code rows kept per batch (the hottest), and process rows.
    pub const ROWS_PER_BATCH: usize = 4096;

    /// Record a batch's rows (its `hot` and `hot_kernel` lists are taken).
    ///
    /// This runs at every flush, with or without a client, and once per `dcpictl top`
    /// request. Rows are keyed by integers (command index, image index by allocation, offset,
    /// event) and cut to [`Self::ROWS_PER_BATCH`] before any path or command is copied; only
    /// what the kept rows name is copied, once (see BENCHMARKS.md, "dcpictl top").
    pub fn push(&mut self, who: &mut WhoBatch) {
        let now = Instant::now();
        while self.batches.front().is_some_and(|b| now.duration_since(b.at) > Self::KEEP) {
            self.batches.pop_front();
        }
        // No client asked for a while: give back the merge's maps and lists (~10 MB for ten
        // batches of 4 096 code and process rows) and the last answer.
        if self.last.as_ref().is_some_and(|l| now.duration_since(l.at) > Self::KEEP) {
            self.last = None;
            self.scratch = Scratch::default();
        }
        // The batch's images, by allocation (one per table entry's image: the hot lists hold
        // a reference each), and by id for the process rows.
        let mut sources: Vec<Source> = Vec::new();
        let mut by_alloc: Interner<usize> = Interner::new();
        let mut image = |sources: &mut Vec<Source>, i: &Arc<ImageInfo>| -> u32 {
            let (k, new) = by_alloc.get(Arc::as_ptr(i) as usize);
            if new {
                sources.push(Source::Image(Arc::clone(i)));
            }
            k
        };
        // Commands by pid: one lookup per pid, not per row.
        let mut command_of: HashMap<u32, u32> = HashMap::new();
        let mut commands: Vec<Vec<u8>> = Vec::new();
        let mut by_name: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut command = |pid: u32, who: &WhoBatch| -> u32 {
            *command_of.entry(pid).or_insert_with(|| {
                // Copied once per command, not per pid.
                let c = match who.comms.get(&pid) {
                    Some(c) => std::borrow::Cow::Borrowed(c.as_slice()),
                    None => std::borrow::Cow::Owned(who.command(pid)),
                };
                if let Some(&k) = by_name.get(c.as_ref()) {
                    return k;
                }
                commands.push(c.to_vec());
                let k = (commands.len() - 1) as u32;
                by_name.insert(c.into_owned(), k);
                k
            })
        };
        // Sized up front: grown from empty, rehashing was a third of this function.
        let hot = std::mem::take(&mut who.hot);
        let hot_kernel = std::mem::take(&mut who.hot_kernel);
        let mut rows: HashMap<(u32, u32, u64, EventIdx), (u32, u64)> =
            HashMap::with_capacity(hot.len() + hot_kernel.len());
        for (pid, img, offset, ev, n) in &hot {
            let key = (command(*pid, who), image(&mut sources, img), *offset, *ev);
            rows.entry(key).or_insert((*pid, 0)).1 += n;
        }
        for (img, offset, ev, n) in &hot_kernel {
            let key = (NO_COMMAND, image(&mut sources, img), *offset, *ev);
            rows.entry(key).or_insert((0, 0)).1 += n;
        }
        // One image reference per entry, released here.
        drop((hot, hot_kernel));
        let mut totals = Vec::new();
        for (&(_, ev), &n) in &who.cpus {
            add_at(&mut totals, usize::from(ev), n);
        }
        let mut idle = Vec::new();
        for (&(pid, ev), &n) in &who.kernel {
            if pid == 0 {
                add_at(&mut idle, usize::from(ev), n);
            }
        }
        let mut rows: Vec<_> = rows.into_iter().collect();
        if rows.len() > Self::ROWS_PER_BATCH {
            rows.select_nth_unstable_by(Self::ROWS_PER_BATCH, |a, b| b.1 .1.cmp(&a.1 .1));
            rows.truncate(Self::ROWS_PER_BATCH);
        }
        // Process rows: per (pid, image, event) from the batch's user and kernel counts,
        // keyed by image index and cut before anything is copied.
        let unknown = sources.len() as u32;
        sources.push(Source::Named(b"[unknown]", ImageKind::Unknown));
        let kernel = sources.len() as u32;
        sources.push(Source::Named(b"[kernel.kallsyms]", ImageKind::Kernel));
        let mut processes: Vec<(u32, u32, EventIdx, u64)> =
            Vec::with_capacity(who.user.len() + who.kernel.len());
        for ((pid, id, ev), &n) in &who.user {
            let img = match id.as_ref().and_then(|i| who.images.get(i)) {
                Some(i) => image(&mut sources, i),
                None => unknown,
            };
            processes.push((*pid, img, *ev, n));
        }
        for (&(pid, ev), &n) in &who.kernel {
            if pid != 0 {
                processes.push((pid, kernel, ev, n));
            }
        }
        if processes.len() > Self::ROWS_PER_BATCH {
            processes.select_nth_unstable_by(Self::ROWS_PER_BATCH, |a, b| b.3.cmp(&a.3));
            processes.truncate(Self::ROWS_PER_BATCH);
        }
        // Copy the images the kept rows name, once each.
        let mut kept: Vec<u32> = vec![u32::MAX; sources.len()];
        let mut images = Vec::new();
        let mut keep = |i: u32| -> u32 {
            let k = &mut kept[i as usize];
            if *k == u32::MAX {
                images.push(match &sources[i as usize] {
                    Source::Image(img) => {
                        let build_id = match &img.id {
                            ImageId::BuildId(b) => Some(b.clone()),
                            _ => None,
                        };
                        (img.path.clone(), build_id, img.kind)
                    }
                    Source::Named(path, kind) => (path.to_vec(), None, *kind),
                });
                *k = (images.len() - 1) as u32;
            }
            *k
        };
        let packed: Vec<PackedRow> = rows
            .into_iter()
            .map(|((command, image, offset, event), (pid, samples))| PackedRow {
                command,
                pid,
                image: keep(image),
                offset,
                event,
                samples,
            })
            .collect();
        let processes: Vec<PackedProcess> = processes
            .into_iter()
            .map(|(pid, image, event, samples)| PackedProcess {
                pid,
                command: command(pid, who),
                image: keep(image),
                event,
                samples,
            })
            .collect();
        self.pushed += 1;
        self.batches.push_back(Batch {
            at: now,
            totals,
            idle,
            images,
            commands,
            rows: packed,
            processes,
        });
    }

    /// When the newest batch was recorded (None: none is kept).
    pub fn last_recorded(&self) -> Option<Instant> {
        self.batches.back().map(|b| b.at)
    }

    /// Rows of the batches taken within `window`, merged and sorted hottest first (at most
    /// `limit` code rows and `limit` process rows), and the window's totals.
    ///
    /// Rows merge by (command, image path, build-id, offset, event) and process rows by (pid,
    /// image path, event) across batches; each batch's images and commands are interned once
    /// per request, so the per-row work is integer hashing, and only the `limit` rows returned
    /// are copied out.
    ///
    /// The answer is shared, and kept: a request over the same batches as the last one (no
    /// batch recorded or aged out of the window since, same `limit`) returns it again without
    /// merging anything. The merge's maps and lists are kept between requests.
    pub fn top(&mut self, window: Duration, limit: usize) -> Arc<HotView> {
        let now = Instant::now();
        let in_window = |b: &&Batch| now.duration_since(b.at) <= window;
        // Batches are recorded in time order, so the window is the newest few: it is named
        // by the number of its first batch and the number recorded.
        let first = self.pushed - self.batches.len() as u64
            + self.batches.iter().position(|b| in_window(&b)).unwrap_or(self.batches.len()) as u64;
        if let Some(l) = &mut self.last {
            if (l.first, l.last, l.limit) == (first, self.pushed, limit) {
                l.at = now;
                return Arc::clone(&l.view);
            }
        }
        let Self { batches, scratch, .. } = self;
        let mut view = HotView::default();
        // Across the window: image (path, build-id) with the first kind seen, path, command.
        let mut images: Interner<(&[u8], Option<&[u8]>)> = Interner::new();
        let mut kinds: Vec<ImageKind> = Vec::new();
        let mut paths: Interner<&[u8]> = Interner::new();
        let mut commands: Interner<&[u8]> = Interner::new();
        type Key = MergeKey;
        // Sized up front for every row read: grown from empty, rehashing the merged rows was
        // ~40 % of this function (perf, 4 000 rows at 2 requests/s).
        let (n_rows, n_procs) = batches
            .iter()
            .filter(in_window)
            .fold((0, 0), |(r, p), b| (r + b.rows.len(), p + b.processes.len()));
        let Scratch { merged, procs, rows, processes, image_map } = scratch;
        merged.clear();
        procs.clear();
        merged.reserve(n_rows);
        procs.reserve(n_procs);
        for b in batches.iter().filter(in_window) {
            for (i, n) in b.totals.iter().enumerate() {
                add_at(&mut view.totals, i, *n);
            }
            for (i, n) in b.idle.iter().enumerate() {
                add_at(&mut view.idle, i, *n);
            }
            image_map.clear();
            image_map.extend(b.images.iter().map(|(path, build_id, kind)| {
                let (i, new) = images.get((path, build_id.as_deref()));
                if new {
                    kinds.push(*kind);
                }
                (i, paths.get(path).0)
            }));
            let command_map: Vec<u32> = b.commands.iter().map(|c| commands.get(c).0).collect();
            let cmd = |c: u32| command_map.get(c as usize).copied().unwrap_or(NO_COMMAND);
            for r in &b.rows {
                let key = (cmd(r.command), image_map[r.image as usize].0, Some(r.offset), r.event);
                merged.entry(key).or_insert((r.pid, 0)).1 += r.samples;
            }
            for p in &b.processes {
                let key = (p.pid, image_map[p.image as usize].1, p.event);
                procs.entry(key).or_insert((cmd(p.command), 0)).1 += p.samples;
            }
        }
        rows.clear();
        rows.extend(merged.drain());
        if view.idle.iter().any(|&n| n > 0) {
            let swapper = commands.get(b"swapper").0;
            let (idle, new) = images.get((IDLE_PATH, None));
            if new {
                kinds.push(ImageKind::Kernel);
            }
            for (ev, &n) in view.idle.iter().enumerate() {
                if n > 0 {
                    rows.push(((swapper, idle, None, ev as EventIdx), (0, n)));
                }
            }
        }
        let name = |c: u32| commands.list.get(c as usize).copied().unwrap_or_default();
        let order = |a: &(Key, (u32, u64)), b: &(Key, (u32, u64))| {
            b.1 .1.cmp(&a.1 .1).then_with(|| {
                (name(a.0 .0), images.list[a.0 .1 as usize].0)
                    .cmp(&(name(b.0 .0), images.list[b.0 .1 as usize].0))
            })
        };
        if rows.len() > limit {
            rows.select_nth_unstable_by(limit, order);
            rows.truncate(limit);
        }
        rows.sort_by(order);
        view.rows = rows
            .drain(..)
            .map(|((c, i, offset, event), (pid, samples))| {
                let (image, build_id) = images.list[i as usize];
                HotRow {
                    command: name(c).to_vec(),
                    pid,
                    image: image.to_vec(),
                    kind: kinds[i as usize],
                    build_id: build_id.map(<[u8]>::to_vec),
                    offset,
                    event,
                    samples,
                }
            })
            .collect();
        processes.clear();
        processes.extend(procs.drain());
        let order = |a: &((u32, u32, EventIdx), (u32, u64)),
                     b: &((u32, u32, EventIdx), (u32, u64))| {
            b.1 .1.cmp(&a.1 .1).then_with(|| a.0 .0.cmp(&b.0 .0))
        };
        if processes.len() > limit {
            processes.select_nth_unstable_by(limit, order);
            processes.truncate(limit);
        }
        processes.sort_by(order);
        view.processes = processes
            .drain(..)
            .map(|((pid, path, event), (c, samples))| HotProcess {
                pid,
                command: name(c).to_vec(),
                image: paths.list[path as usize].to_vec(),
                event,
                samples,
            })
            .collect();
        let view = Arc::new(view);
        self.last =
            Some(LastView { first, last: self.pushed, limit, view: Arc::clone(&view), at: now });
        view
    }
}

/// cgroup v2 id → path. Ids come with samples; paths from `PERF_RECORD_CGROUP` (cgroups created
/// while the daemon runs) and from walking the v2 hierarchy (a cgroup's id is the inode number
/// of its directory), at most once per [`CgroupNames::RESCAN`] when an id is missing.
#[derive(Debug)]
pub struct CgroupNames {
    root: Option<PathBuf>,
    names: HashMap<u64, String>,
    last_scan: Option<Instant>,
}

impl CgroupNames {
    pub const RESCAN: Duration = Duration::from_secs(2);
    /// Bound on the cgroups remembered (a walk of a huge hierarchy stops there).
    pub const MAX: usize = 100_000;

    /// Find the v2 hierarchy in `/proc/self/mountinfo` (pure v2 at /sys/fs/cgroup, or hybrid
    /// at /sys/fs/cgroup/unified); say when there is none.
    pub fn discover() -> Self {
        let root =
            std::fs::read_to_string("/proc/self/mountinfo").ok().and_then(|m| cgroup2_mount(&m));
        match &root {
            Some(r) => tracing::info!(root = %r.display(), "who: cgroup v2 hierarchy found"),
            None => tracing::warn!(
                "who: no cgroup v2 hierarchy mounted (cgroup v1 only): samples are not \
                 attributed to cgroups, services or containers"
            ),
        }
        Self::at(root)
    }

    /// Names under `root` (None: none known).
    pub fn at(root: Option<PathBuf>) -> Self {
        Self { root, names: HashMap::new(), last_scan: None }
    }

    /// A path from `PERF_RECORD_CGROUP`.
    pub fn note(&mut self, id: u64, path: &[u8]) {
        if self.names.len() < Self::MAX {
            self.names.insert(id, String::from_utf8_lossy(path).into_owned());
        }
    }

    /// The path of `id`, walking the hierarchy again if it is not known (rate-limited).
    pub fn path(&mut self, id: u64) -> Option<String> {
        if let Some(p) = self.names.get(&id) {
            return Some(p.clone());
        }
        let due = self.last_scan.is_none_or(|t| t.elapsed() >= Self::RESCAN);
        if due {
            self.scan();
        }
        self.names.get(&id).cloned()
    }

    fn scan(&mut self) {
        use std::os::unix::fs::MetadataExt;
        self.last_scan = Some(Instant::now());
        let Some(root) = self.root.clone() else { return };
        let mut stack = vec![(root, String::from("/"))];
        while let Some((dir, rel)) = stack.pop() {
            if let Ok(md) = std::fs::metadata(&dir) {
                self.names.insert(md.ino(), rel.clone());
            }
            let Ok(rd) = std::fs::read_dir(&dir) else { continue };
            for e in rd.flatten() {
                if self.names.len() >= Self::MAX {
                    return;
                }
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let child =
                        if rel == "/" { format!("/{name}") } else { format!("{rel}/{name}") };
                    stack.push((e.path(), child));
                }
            }
        }
    }
}

/// Mount point of the cgroup2 file system in a mountinfo text.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(PathBuf::from))
            .flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What CPU 0 (`cpu0`) and CPU 1 (`cpu1`) counted, taken into one batch in `order`.
    fn take_in_order(cpu0: &mut CpuWho, cpu1: &mut CpuWho, order: [u32; 2]) -> WhoBatch {
        let mut b = WhoBatch::default();
        for i in order {
            let w = if i == 0 { &mut *cpu0 } else { &mut *cpu1 };
            w.take_into(i, &mut b);
        }
        b
    }

    #[test]
    fn finds_the_v2_mount_of_hybrid_and_pure_systems() {
        let hybrid = "25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n\
                      26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n\
                      27 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(cgroup2_mount(hybrid), Some(PathBuf::from("/sys/fs/cgroup/unified")));
        let pure = "30 1 0:26 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw\n";
        assert_eq!(cgroup2_mount(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(cgroup2_mount("27 25 0:24 / /x rw - cgroup cgroup rw,cpu\n"), None);
    }

    #[test]
    fn cgroup_ids_are_directory_inodes() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("system.slice/a.service")).expect("mkdir");
        let ino = std::fs::metadata(dir.path().join("system.slice/a.service")).expect("md").ino();
        let mut n = CgroupNames::at(Some(dir.path().to_path_buf()));
        assert_eq!(n.path(ino).as_deref(), Some("/system.slice/a.service"));
        n.note(7, b"/made/later");
        assert_eq!(n.path(7).as_deref(), Some("/made/later"));
    }

    #[test]
    fn counts_kernel_time_per_pid_and_the_last_cgroup() {
        let mut w = CpuWho::default();
        w.count(10, 10, 5, 0, true, 10);
        w.count(10, 10, 6, 0, false, 20);
        w.count(0, 0, 1, 0, true, 30);
        // Pids that share a counter slot are both counted.
        w.count(10 + KERNEL_SLOTS as u32, 10 + KERNEL_SLOTS as u32, 5, 0, true, 40);
        w.count(10, 10, 5, 0, true, 50);
        // Its exit path, in the root cgroup: kernel samples do not override a user one.
        w.count(10, 10, 1, 0, true, 60);
        // A kernel thread has only kernel samples: the first one names its cgroup.
        w.count(2, 2, 1, 0, true, 70);
        let mut b = WhoBatch::default();
        w.take_into(3, &mut b);
        assert_eq!(b.cpus[&(3, 0)], 7);
        assert_eq!(b.kernel[&(10, 0)], 3);
        assert_eq!(b.kernel[&(10 + KERNEL_SLOTS as u32, 0)], 1);
        assert_eq!(b.kernel[&(0, 0)], 1);
        assert_eq!(b.cgroups[&10], 6, "the last cgroup a user-mode sample showed");
        assert_eq!(b.cgroups[&2], 1, "a kernel thread's");
        // Taken: the next interval starts empty, and a pid seen before is recorded again.
        w.count(10, 10, 6, 0, false, 80);
        let mut b2 = WhoBatch::default();
        w.take_into(3, &mut b2);
        assert_eq!((b2.cpus[&(3, 0)], b2.cgroups[&10]), (1, 6));
        // Across CPUs too: one CPU saw only the exit path (root), another the process run.
        let (mut exit, mut run) = (CpuWho::default(), CpuWho::default());
        for order in [[0, 1], [1, 0]] {
            let mut b = WhoBatch::default();
            for i in order {
                let w = if i == 0 { &mut exit } else { &mut run };
                w.count(10, 10, if i == 0 { 1 } else { 6 }, 0, i == 0, 90);
                w.take_into(i, &mut b);
            }
            assert_eq!(b.cgroups[&10], 6, "{order:?}");
        }
        // A process moved into its group before exec ran in the old group on one CPU and in
        // the new one on another, both in user mode: the newest wins, whatever the CPUs'
        // order.
        for order in [[0, 1], [1, 0]] {
            let (mut before, mut after) = (CpuWho::default(), CpuWho::default());
            before.count(20, 20, 1, 0, false, 1_000);
            after.count(20, 20, 9, 0, false, 2_000);
            after.count(20, 20, 9, 0, false, 3_000);
            let b = take_in_order(&mut before, &mut after, order);
            assert_eq!(b.cgroups[&20], 9, "{order:?}");
            // And when an early batch is merged into a later one.
            let mut early = WhoBatch::default();
            before.count(20, 20, 1, 0, false, 1_000);
            before.take_into(0, &mut early);
            let mut late = WhoBatch::default();
            after.count(20, 20, 9, 0, false, 2_000);
            after.take_into(1, &mut late);
            late.merge(early);
            assert_eq!(late.cgroups[&20], 9, "merge {order:?}");
        }
        // A process's first sample of the interval is a kernel one (an interrupt), its next
        // ones user-mode in the same group; its exit path then runs on another CPU in the root
        // group, later. The user-mode samples must still count: its group wins.
        for order in [[0, 1], [1, 0]] {
            let (mut run, mut exit) = (CpuWho::default(), CpuWho::default());
            run.count(30, 30, 9, 0, true, 1_000);
            run.count(30, 30, 9, 0, false, 1_100);
            run.count(30, 30, 9, 0, false, 1_200);
            exit.count(30, 30, 1, 0, true, 5_000);
            let b = take_in_order(&mut run, &mut exit, order);
            assert_eq!(b.cgroups[&30], 9, "kernel first, then user: {order:?}");
        }
    }

    #[test]
    fn recent_rows_merge_across_batches_and_processes_with_their_names() {
        let image = |path: &[u8], id: ImageId, kind| {
            Arc::new(ImageInfo { kind, id, path: path.to_vec(), jit_symbols: Vec::new() })
        };
        let libc = image(b"/lib/libc.so", ImageId::BuildId(vec![7; 20]), ImageKind::Elf);
        // Another mapping of the same file: rows merge by path in `top`.
        let libc2 = image(b"/lib/libc.so", ImageId::BuildId(vec![7; 20]), ImageKind::Elf);
        let app = image(b"/bin/app", ImageId::Fallback([1; 16]), ImageKind::Elf);
        let kernel = image(b"[kernel.kallsyms]", ImageId::BuildId(vec![9; 20]), ImageKind::Kernel);
        let mut recent = Recent::default();
        let mut b1 = WhoBatch::default();
        b1.comms.insert(10, b"app".to_vec());
        b1.comms.insert(12, b"app".to_vec());
        b1.hot = vec![
            (10, Arc::clone(&libc), 0x100, 0, 5),
            (10, Arc::clone(&libc2), 0x100, 0, 2),
            (10, Arc::clone(&app), 0x40, 0, 3),
            (10, Arc::clone(&app), 0x40, 1, 50), // another event: its own row
            (12, Arc::clone(&app), 0x40, 0, 6),  // another process of the same command
            (11, Arc::clone(&libc), 0x100, 0, 1),
        ];
        b1.hot_kernel = vec![(Arc::clone(&kernel), 0x1234, 0, 4)];
        b1.kernel.insert((0, 0), 20);
        b1.kernel.insert((10, 0), 4);
        b1.cpus.insert((0, 0), 41);
        b1.cpus.insert((0, 1), 50);
        recent.push(&mut b1);
        assert!(b1.hot.is_empty() && b1.hot_kernel.is_empty(), "the batch's rows are taken");
        let mut b2 = WhoBatch::default();
        b2.comms.insert(10, b"app".to_vec());
        b2.hot = vec![(10, Arc::clone(&app), 0x40, 0, 30)];
        b2.cpus.insert((1, 0), 30);
        recent.push(&mut b2);

        let v = recent.top(Duration::from_secs(60), 10);
        assert_eq!(v.totals, [71, 50]);
        assert_eq!(v.idle, [20]);
        let got: Vec<_> = v
            .rows
            .iter()
            .map(|r| {
                (
                    r.command.as_slice(),
                    r.image.as_slice(),
                    r.build_id.clone(),
                    r.offset,
                    r.event,
                    r.samples,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (&b"app"[..], &b"/bin/app"[..], None, Some(0x40), 1, 50),
                (&b"app"[..], &b"/bin/app"[..], None, Some(0x40), 0, 39),
                (&b"swapper"[..], IDLE_PATH, None, None, 0, 20),
                (&b"app"[..], &b"/lib/libc.so"[..], Some(vec![7; 20]), Some(0x100), 0, 7),
                (&b""[..], &b"[kernel.kallsyms]"[..], Some(vec![9; 20]), Some(0x1234), 0, 4),
                (&b"[pid 11]"[..], &b"/lib/libc.so"[..], Some(vec![7; 20]), Some(0x100), 0, 1),
            ]
        );
        let procs: Vec<_> =
            v.processes.iter().map(|p| (p.pid, p.image.as_slice(), p.event, p.samples)).collect();
        assert!(procs.contains(&(10, &b"[kernel.kallsyms]"[..], 0, 4)), "{procs:?}");
        assert!(!procs.iter().any(|p| p.0 == 0), "idle is not a process row: {procs:?}");
        assert_eq!(recent.top(Duration::from_secs(60), 2).rows.len(), 2);
    }
}
