//! The "who" table of one host in one epoch (FORMAT.md §12): samples per (cgroup, command,
//! pid, image, event) and per (CPU, event), so that reports can answer "which service, which
//! container, which process" without per-process profiles; since version 2, also per thread
//! name where a thread's name differs from its process's command (a second level of the
//! command that reports fold).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::codec::{self, put_bytes, Reader};
use crate::db::HostDir;
use crate::error::Result;
use crate::safeio;
use crate::varint;

/// Magic of a who table file.
pub const WHO_MAGIC: &[u8; 8] = b"DCPIWHO\0";
/// Newest version this build reads and writes; a reader refuses larger ones
/// (`UnknownVersion`). A table is written as version 2 exactly when it has thread rows
/// (version 2 adds them), else as version 1, so that a reader of version 1 still reads every
/// table that needs nothing newer.
pub const WHO_VERSION: u16 = 2;

/// Thread names a table keeps per (cgroup, command, pid); the samples of further names are
/// added to the row named [`OTHER_THREADS`]. Incremental rustc names its threads after its
/// codegen units' hashes (`opt 4khsxgdveaa`, `lto 51dg8lod39o`): unbounded, a machine of
/// builds had 1 635 thread names in 10 minutes, 18.7 kB of a 21 kB table (BENCHMARKS.md,
/// "Thread names").
pub const MAX_THREAD_NAMES: usize = 32;

/// The thread name of the samples of the threads beyond [`MAX_THREAD_NAMES`] names: longer
/// than any thread's name (15 bytes on Linux), so no thread has it.
pub const OTHER_THREADS: &[u8] = b"[other threads]+";

/// The pid the kernel gives a sample of a task whose pid it has already released (-1 as a
/// `u32`): a process in the last instructions of its exit, after its parent reaped it
/// (`perf_event_pid_type()` answers -1 when `!pid_alive()`; `perf report` shows `:-1`).
pub const EXITING_PID: u32 = u32::MAX;

/// The command of [`EXITING_PID`]'s samples: which process it was went with its pid, and
/// `[pid 4294967295]` would read as a process. Bracketed like `[pid N]` (a name dcpid gave,
/// not a comm it read); at most the kernel's 15 bytes, so it fits wherever a comm does.
pub const EXITING_COMMAND: &[u8] = b"[exiting]";

/// File name of the table in a host directory.
pub const WHO_FILE: &str = "who.tbl";

/// What a count of the table is per. Ordered as the file stores rows.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WhoKey {
    /// cgroup v2 path (`/system.slice/nginx.service`), `/` for the root, empty when the
    /// kernel could not say.
    pub cgroup: String,
    /// Command name (comm, at most 15 bytes on Linux; arbitrary bytes).
    pub command: Vec<u8>,
    /// Process id; 0 unless the daemon records per-pid rows (`by_pid`), and for the idle task.
    pub pid: u32,
    /// Image path as the profiles name it (`/usr/bin/python3`, `[kernel.kallsyms]`,
    /// `[idle]`, `[unknown]`).
    pub image: Vec<u8>,
    /// Event name (`cpu-clock`).
    pub event: String,
}

/// What a thread row counts (version 2): the samples of the threads of a command whose name
/// (the thread's comm) differs from the command. Not split by image: they are a second level
/// of the rows of the same (cgroup, command, pid, event), whose samples they also count.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ThreadKey {
    pub cgroup: String,
    pub command: Vec<u8>,
    /// 0 unless `by_pid`, as in [`WhoKey::pid`].
    pub pid: u32,
    /// The thread's name (comm), never equal to `command`.
    pub thread: Vec<u8>,
    pub event: String,
}

/// The who table of one host directory.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WhoTable {
    pub host: String,
    pub epoch: String,
    /// Samples per key; no zero counts.
    pub rows: BTreeMap<WhoKey, u64>,
    /// Samples per (CPU, event name); no zero counts.
    pub cpus: BTreeMap<(u32, String), u64>,
    /// Samples of threads named apart from their command (version 2); no zero counts.
    pub threads: BTreeMap<ThreadKey, u64>,
}

/// Whether two thread rows are of the same (cgroup, command, pid).
fn same_owner(a: &ThreadKey, b: &ThreadKey) -> bool {
    (&a.cgroup, &a.command, a.pid) == (&b.cgroup, &b.command, b.pid)
}

fn dict<'a, T: Ord + ?Sized + 'a>(items: impl Iterator<Item = &'a T>) -> Vec<&'a T> {
    items.collect::<BTreeSet<_>>().into_iter().collect()
}

fn index_of<T: Ord + ?Sized>(d: &[&T], x: &T) -> u64 {
    // Every value was put in the dictionary it is looked up in.
    d.binary_search(&x).unwrap_or(0) as u64
}

impl WhoTable {
    pub fn new(host: &str, epoch: &str) -> Self {
        Self { host: host.to_owned(), epoch: epoch.to_owned(), ..Default::default() }
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.cpus.is_empty() && self.threads.is_empty()
    }

    /// Add `samples` to a thread row (nothing for 0, or for a thread named as its command:
    /// those samples are the command's own). A name beyond the [`MAX_THREAD_NAMES`] that its
    /// (cgroup, command, pid) has is counted as [`OTHER_THREADS`].
    pub fn add_thread(&mut self, mut key: ThreadKey, samples: u64) {
        if samples == 0 || key.thread == key.command {
            return;
        }
        if !self.threads.contains_key(&key) && key.thread != OTHER_THREADS {
            // The names of this (cgroup, command, pid): its rows are contiguous.
            let first = ThreadKey { thread: Vec::new(), event: String::new(), ..key.clone() };
            let (mut names, mut known) = (0usize, false);
            let mut last: Option<&[u8]> = None;
            for k in self.threads.range(first..).map(|e| e.0).take_while(|k| same_owner(k, &key)) {
                known |= k.thread == key.thread;
                if last != Some(k.thread.as_slice()) && k.thread != OTHER_THREADS {
                    names += 1;
                    last = Some(k.thread.as_slice());
                }
            }
            if !known && names >= MAX_THREAD_NAMES {
                key.thread = OTHER_THREADS.to_vec();
            }
        }
        let c = self.threads.entry(key).or_insert(0);
        *c = c.saturating_add(samples);
    }

    /// Add `samples` to a row (nothing for 0).
    pub fn add(&mut self, key: WhoKey, samples: u64) {
        if samples > 0 {
            let c = self.rows.entry(key).or_insert(0);
            *c = c.saturating_add(samples);
        }
    }

    /// Add `samples` to a CPU's count of an event (nothing for 0).
    pub fn add_cpu(&mut self, cpu: u32, event: &str, samples: u64) {
        if samples > 0 {
            let c = self.cpus.entry((cpu, event.to_owned())).or_insert(0);
            *c = c.saturating_add(samples);
        }
    }

    /// Add every count of `other` (host and epoch of `self` are kept). Commutative and
    /// associative on the counts.
    pub fn merge(&mut self, other: &Self) {
        for (k, &n) in &other.rows {
            self.add(k.clone(), n);
        }
        for ((cpu, ev), &n) in &other.cpus {
            self.add_cpu(*cpu, ev, n);
        }
        for (k, &n) in &other.threads {
            self.add_thread(k.clone(), n);
        }
    }

    /// Total samples of the rows.
    pub fn samples(&self) -> u64 {
        self.rows.values().fold(0u64, |a, &n| a.saturating_add(n))
    }

    /// The file's bytes (FORMAT.md §12): dictionaries of the distinct strings, sorted, then the
    /// rows as varint indices into them, sorted by key.
    pub fn encode(&self) -> Vec<u8> {
        // Rows repeat their neighbours' indices: zlib makes them ~3x smaller.
        codec::finish_zlib(WHO_MAGIC, self.version(), &self.encode_payload())
    }

    /// The version the table is written as (see [`WHO_VERSION`]).
    pub fn version(&self) -> u16 {
        if self.threads.is_empty() {
            1
        } else {
            2
        }
    }

    /// The uncompressed payload, in the one canonical order.
    fn encode_payload(&self) -> Vec<u8> {
        let events = dict(
            self.rows
                .keys()
                .map(|k| k.event.as_str())
                .chain(self.cpus.keys().map(|k| k.1.as_str()))
                .chain(self.threads.keys().map(|k| k.event.as_str())),
        );
        let cgroups = dict(
            self.rows
                .keys()
                .map(|k| k.cgroup.as_str())
                .chain(self.threads.keys().map(|k| k.cgroup.as_str())),
        );
        let commands = dict(
            self.rows
                .keys()
                .map(|k| k.command.as_slice())
                .chain(self.threads.keys().map(|k| k.command.as_slice())),
        );
        let images = dict(self.rows.keys().map(|k| k.image.as_slice()));
        let mut out = Vec::new();
        put_bytes(&mut out, self.host.as_bytes());
        put_bytes(&mut out, self.epoch.as_bytes());
        for d in [&events, &cgroups] {
            varint::write_u64(&mut out, d.len() as u64);
            d.iter().for_each(|s| put_bytes(&mut out, s.as_bytes()));
        }
        for d in [&commands, &images] {
            varint::write_u64(&mut out, d.len() as u64);
            d.iter().for_each(|s| put_bytes(&mut out, s));
        }
        varint::write_u64(&mut out, self.rows.len() as u64);
        for (k, &n) in &self.rows {
            varint::write_u64(&mut out, index_of(&cgroups, k.cgroup.as_str()));
            varint::write_u64(&mut out, index_of(&commands, k.command.as_slice()));
            varint::write_u64(&mut out, u64::from(k.pid));
            varint::write_u64(&mut out, index_of(&images, k.image.as_slice()));
            varint::write_u64(&mut out, index_of(&events, k.event.as_str()));
            varint::write_u64(&mut out, n);
        }
        varint::write_u64(&mut out, self.cpus.len() as u64);
        for ((cpu, ev), &n) in &self.cpus {
            varint::write_u64(&mut out, u64::from(*cpu));
            varint::write_u64(&mut out, index_of(&events, ev.as_str()));
            varint::write_u64(&mut out, n);
        }
        if !self.threads.is_empty() {
            // Version 2: the thread names, then the thread rows.
            let names = dict(self.threads.keys().map(|k| k.thread.as_slice()));
            varint::write_u64(&mut out, names.len() as u64);
            names.iter().for_each(|s| put_bytes(&mut out, s));
            varint::write_u64(&mut out, self.threads.len() as u64);
            for (k, &n) in &self.threads {
                varint::write_u64(&mut out, index_of(&cgroups, k.cgroup.as_str()));
                varint::write_u64(&mut out, index_of(&commands, k.command.as_slice()));
                varint::write_u64(&mut out, u64::from(k.pid));
                varint::write_u64(&mut out, index_of(&names, k.thread.as_slice()));
                varint::write_u64(&mut out, index_of(&events, k.event.as_str()));
                varint::write_u64(&mut out, n);
            }
        }
        out
    }

    /// Parse and validate a file's bytes; `path` names it in errors. Accepts only the
    /// canonical encoding (sorted, distinct dictionaries and rows, no zero counts).
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self> {
        let payload = codec::open_zlib(bytes, path, WHO_MAGIC, "who table", WHO_VERSION)?;
        // open_zlib checked the container: magic, then the version (u16 LE), at most ours.
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        let mut r = Reader::new(&payload, path);
        let host = r.string("host")?;
        let epoch = r.string("epoch")?;
        let strings = |r: &mut Reader<'_>, field: &'static str| -> Result<Vec<String>> {
            let n = r.count(field, 1)?;
            let mut v: Vec<String> = Vec::with_capacity(n);
            for _ in 0..n {
                let s = r.string(field)?;
                if v.last().is_some_and(|p| *p >= s) {
                    return Err(r.corrupt(field, "dictionary not sorted or not distinct"));
                }
                v.push(s);
            }
            Ok(v)
        };
        let blobs = |r: &mut Reader<'_>, field: &'static str| -> Result<Vec<Vec<u8>>> {
            let n = r.count(field, 1)?;
            let mut v: Vec<Vec<u8>> = Vec::with_capacity(n);
            for _ in 0..n {
                let s = r.bytes(field)?.to_vec();
                if v.last().is_some_and(|p| *p >= s) {
                    return Err(r.corrupt(field, "dictionary not sorted or not distinct"));
                }
                v.push(s);
            }
            Ok(v)
        };
        let events = strings(&mut r, "events")?;
        let cgroups = strings(&mut r, "cgroups")?;
        let commands = blobs(&mut r, "commands")?;
        let images = blobs(&mut r, "images")?;
        fn pick<'t, T>(r: &Reader<'_>, d: &'t [T], i: u64, field: &'static str) -> Result<&'t T> {
            usize::try_from(i)
                .ok()
                .and_then(|i| d.get(i))
                .ok_or_else(|| r.corrupt(field, format!("index {i} beyond {} entries", d.len())))
        }
        let nrows = r.count("rows", 6)?;
        let mut rows = BTreeMap::new();
        let mut prev: Option<[u64; 5]> = None;
        for _ in 0..nrows {
            let idx = [
                r.varint("row cgroup")?,
                r.varint("row command")?,
                r.varint("row pid")?,
                r.varint("row image")?,
                r.varint("row event")?,
            ];
            let n = r.varint("row samples")?;
            if n == 0 {
                return Err(r.corrupt("row samples", "zero count"));
            }
            if prev.is_some_and(|p| p >= idx) {
                return Err(r.corrupt("rows", "rows not sorted or not distinct"));
            }
            prev = Some(idx);
            let pid = u32::try_from(idx[2]).map_err(|_| r.corrupt("row pid", "beyond u32"))?;
            let key = WhoKey {
                cgroup: pick(&r, &cgroups, idx[0], "row cgroup")?.clone(),
                command: pick(&r, &commands, idx[1], "row command")?.clone(),
                pid,
                image: pick(&r, &images, idx[3], "row image")?.clone(),
                event: pick(&r, &events, idx[4], "row event")?.clone(),
            };
            rows.insert(key, n);
        }
        let ncpus = r.count("cpus", 3)?;
        let mut cpus = BTreeMap::new();
        let mut prev: Option<(u64, u64)> = None;
        for _ in 0..ncpus {
            let cpu = r.varint("cpu")?;
            let ev = r.varint("cpu event")?;
            let n = r.varint("cpu samples")?;
            if n == 0 {
                return Err(r.corrupt("cpu samples", "zero count"));
            }
            if prev.is_some_and(|p| p >= (cpu, ev)) {
                return Err(r.corrupt("cpus", "not sorted or not distinct"));
            }
            prev = Some((cpu, ev));
            let cpu = u32::try_from(cpu).map_err(|_| r.corrupt("cpu", "beyond u32"))?;
            cpus.insert((cpu, pick(&r, &events, ev, "cpu event")?.clone()), n);
        }
        let mut threads = BTreeMap::new();
        if version >= 2 {
            let names = blobs(&mut r, "threads")?;
            let nthreads = r.count("thread rows", 6)?;
            let mut prev: Option<[u64; 5]> = None;
            for _ in 0..nthreads {
                let idx = [
                    r.varint("thread cgroup")?,
                    r.varint("thread command")?,
                    r.varint("thread pid")?,
                    r.varint("thread name")?,
                    r.varint("thread event")?,
                ];
                let n = r.varint("thread samples")?;
                if n == 0 {
                    return Err(r.corrupt("thread samples", "zero count"));
                }
                if prev.is_some_and(|p| p >= idx) {
                    return Err(r.corrupt("thread rows", "rows not sorted or not distinct"));
                }
                prev = Some(idx);
                let pid =
                    u32::try_from(idx[2]).map_err(|_| r.corrupt("thread pid", "beyond u32"))?;
                let key = ThreadKey {
                    cgroup: pick(&r, &cgroups, idx[0], "thread cgroup")?.clone(),
                    command: pick(&r, &commands, idx[1], "thread command")?.clone(),
                    pid,
                    thread: pick(&r, &names, idx[3], "thread name")?.clone(),
                    event: pick(&r, &events, idx[4], "thread event")?.clone(),
                };
                if key.thread == key.command {
                    return Err(r.corrupt("thread name", "the command's own name"));
                }
                threads.insert(key, n);
            }
        }
        r.finish()?;
        let t = Self { host, epoch, rows, cpus, threads };
        // A version 2 table without thread rows is version 1's.
        if t.version() != version {
            return Err(codec::corrupt(
                path,
                "version",
                format!("version {version} for a table written as version {}", t.version()),
            ));
        }
        // Unused dictionary entries would make two encodings of one table. The payload is
        // compared, not the file: zlib implementations (miniz_oxide, zlib-rs; which one a
        // binary gets depends on the crates built with it) and versions compress one payload
        // to different bytes, and a reader must accept every writer's.
        if t.encode_payload() != payload {
            return Err(codec::corrupt(path, "dictionaries", "entries no row uses"));
        }
        Ok(t)
    }

    /// Read `who.tbl` through the guarded reader (a FIFO, device, link or oversized file is
    /// refused at once, naming it).
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = safeio::read_container(path, WHO_MAGIC, "who table", WHO_VERSION)?;
        Self::decode(&bytes, path)
    }

    /// Write atomically (FORMAT.md §2). Returns the bytes written.
    pub fn write(&self, path: &Path) -> Result<u64> {
        let bytes = self.encode();
        crate::write_atomic(path, &bytes)?;
        Ok(bytes.len() as u64)
    }
}

// Here rather than in db, which must not import the modules that own the files it names (issue 34).
impl HostDir {
    /// The host directory's who table (FORMAT.md §12).
    pub fn who_path(&self) -> PathBuf {
        self.path.join(WHO_FILE)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use flate2::write::ZlibEncoder;

    fn key(cg: &str, cmd: &str, pid: u32, image: &str) -> WhoKey {
        WhoKey {
            cgroup: cg.into(),
            command: cmd.as_bytes().to_vec(),
            pid,
            image: image.as_bytes().to_vec(),
            event: "cpu-clock".into(),
        }
    }

    fn sample_table() -> WhoTable {
        let mut t = WhoTable::new("web-01", "20261125T000000Z");
        t.add(key("/system.slice/nginx.service", "nginx", 0, "/usr/sbin/nginx"), 1200);
        t.add(key("/system.slice/nginx.service", "nginx", 0, "[kernel.kallsyms]"), 300);
        t.add(key("/", "swapper", 0, "[idle]"), 5000);
        t.add(key("/user.slice", "bash\n", 42, "/usr/lib/libc.so.6"), 7);
        t.add_cpu(0, "cpu-clock", 4000);
        t.add_cpu(1, "cpu-clock", 2507);
        t
    }

    #[test]
    fn roundtrip_merge_and_canonical() {
        let t = sample_table();
        let b = t.encode();
        let p = Path::new("who.tbl");
        let back = WhoTable::decode(&b, p).expect("decode");
        assert_eq!(back, t);
        let mut m = t.clone();
        m.merge(&t);
        assert_eq!(m.samples(), 2 * t.samples());
        assert_eq!(m.cpus[&(1, "cpu-clock".to_owned())], 5014);
        // Every truncation and every single-byte change is rejected, never a panic.
        for n in 0..b.len() {
            assert!(WhoTable::decode(&b[..n], p).is_err(), "truncated at {n} accepted");
        }
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x5a;
            assert!(WhoTable::decode(&c, p).is_err(), "flip at {i} accepted");
        }
    }

    /// A writer whose zlib compresses differently (another backend or level) is read: only
    /// the payload must be canonical. dcpid built alone got `miniz_oxide` and dcpiprof zlib-rs,
    /// and dcpiprof refused every who table ("corrupt field `dictionaries`").
    #[test]
    fn other_compressors_output_is_accepted() {
        use std::io::Write;
        let t = sample_table();
        let payload = t.encode_payload();
        for level in [flate2::Compression::none(), flate2::Compression::fast()] {
            let mut z = ZlibEncoder::new(Vec::new(), level);
            z.write_all(&payload).expect("compress");
            let mut file = codec::begin(WHO_MAGIC, t.version());
            file.extend_from_slice(&z.finish().expect("compress"));
            let file = codec::finish(file);
            assert_ne!(
                file,
                t.encode(),
                "level {level:?} gave the same bytes: test proves nothing"
            );
            assert_eq!(WhoTable::decode(&file, Path::new("who.tbl")).expect("decode"), t);
        }
    }

    #[test]
    fn newer_version_is_refused_cleanly() {
        let mut b = sample_table().encode();
        b[8..10].copy_from_slice(&(WHO_VERSION + 1).to_le_bytes());
        match WhoTable::decode(&b, Path::new("x/who.tbl")) {
            Err(Error::UnknownVersion { version, supported, .. }) => {
                assert_eq!((version, supported), (WHO_VERSION + 1, WHO_VERSION))
            }
            other => panic!("{other:?}"),
        }
    }

    fn thread(cmd: &str, pid: u32, name: &str) -> ThreadKey {
        ThreadKey {
            cgroup: "/user.slice".into(),
            command: cmd.as_bytes().to_vec(),
            pid,
            thread: name.as_bytes().to_vec(),
            event: "cpu-clock".into(),
        }
    }

    /// Version 2: thread rows (FORMAT.md §12, fields 11-13) round-trip, merge, and every
    /// truncation or flipped byte is refused; a table without them is still version 1.
    #[test]
    fn thread_rows_round_trip_as_version_2() {
        let mut t = sample_table();
        assert_eq!(t.version(), 1, "no thread rows: version 1");
        assert_eq!(u16::from_le_bytes([t.encode()[8], t.encode()[9]]), 1);
        t.add(key("/user.slice", "rustc", 0, "/usr/lib/librustc_driver.so"), 100);
        t.add_thread(thread("rustc", 0, "opt cgu.00"), 60);
        t.add_thread(thread("rustc", 0, "opt cgu.01"), 30);
        // A thread named as its command is the command's own: no row.
        t.add_thread(thread("rustc", 0, "rustc"), 10);
        t.add_thread(thread("rustc", 0, "opt cgu.02"), 0);
        assert_eq!(t.threads.len(), 2);
        let b = t.encode();
        assert_eq!(u16::from_le_bytes([b[8], b[9]]), 2);
        let p = Path::new("who.tbl");
        let back = WhoTable::decode(&b, p).expect("decode");
        assert_eq!(back, t);
        let mut m = back.clone();
        m.merge(&t);
        assert_eq!(m.threads[&thread("rustc", 0, "opt cgu.00")], 120);
        for n in 0..b.len() {
            assert!(WhoTable::decode(&b[..n], p).is_err(), "truncated at {n} accepted");
        }
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x5a;
            assert!(WhoTable::decode(&c, p).is_err(), "flip at {i} accepted");
        }
        // A version 2 header on a version 1 payload is refused (it lacks the thread rows),
        // and so is one whose thread rows are empty: that table is version 1's.
        let v1 = sample_table();
        let relabelled = codec::finish_zlib(WHO_MAGIC, 2, &v1.encode_payload());
        assert!(matches!(WhoTable::decode(&relabelled, p), Err(Error::Corrupt { .. })));
        let mut empty = v1.encode_payload();
        empty.extend_from_slice(&[0, 0]);
        match WhoTable::decode(&codec::finish_zlib(WHO_MAGIC, 2, &empty), p) {
            Err(Error::Corrupt { field: "version", .. }) => {}
            other => panic!("{other:?}"),
        }
    }

    /// Unbounded thread names (incremental rustc names threads after codegen-unit hashes):
    /// past [`MAX_THREAD_NAMES`] per (cgroup, command, pid), samples go to [`OTHER_THREADS`];
    /// names already kept keep counting, other commands are not limited by this one.
    #[test]
    fn thread_names_are_bounded_per_command() {
        let mut t = WhoTable::new("h", "20261125T000000Z");
        for i in 0..MAX_THREAD_NAMES + 10 {
            t.add_thread(thread("rustc", 0, &format!("opt {i:011x}")), 2);
        }
        t.add_thread(thread("rustc", 0, "opt 00000000000"), 5);
        t.add_thread(thread("cargo", 0, "worker"), 1);
        let rustc: Vec<_> = t.threads.iter().filter(|(k, _)| k.command == b"rustc").collect();
        assert_eq!(rustc.len(), MAX_THREAD_NAMES + 1, "{rustc:?}");
        assert_eq!(t.threads[&thread("rustc", 0, "opt 00000000000")], 7);
        let other = ThreadKey { thread: OTHER_THREADS.to_vec(), ..thread("rustc", 0, "") };
        assert_eq!(t.threads[&other], 20, "10 names beyond the bound, 2 samples each");
        assert_eq!(t.threads[&thread("cargo", 0, "worker")], 1);
        // Merged into a table that has them, the bound holds.
        let mut m = t.clone();
        m.merge(&t);
        assert_eq!(m.threads.len(), t.threads.len());
        assert!(OTHER_THREADS.len() > 15, "no thread's name (comm) can be it");
    }

    /// A version 1 file, its payload built field by field as FORMAT.md §12 describes it (not
    /// by this build's encoder), reads as before: no thread rows.
    #[test]
    fn version_1_file_reads_as_before() {
        let mut pl = Vec::new();
        put_bytes(&mut pl, b"h");
        put_bytes(&mut pl, b"20261125T000000Z");
        for dict in [&[&b"cpu-clock"[..]][..], &[b"/"], &[b"app"], &[b"/bin/app"]] {
            varint::write_u64(&mut pl, dict.len() as u64);
            dict.iter().for_each(|s| put_bytes(&mut pl, s));
        }
        // One row: cgroup 0, command 0, pid 7, image 0, event 0, 42 samples; one CPU row.
        pl.extend_from_slice(&[1, 0, 0, 7, 0, 0, 42, 1, 1, 0, 42]);
        let file = codec::finish_zlib(WHO_MAGIC, 1, &pl);
        let t = WhoTable::decode(&file, Path::new("old/who.tbl")).expect("a version 1 file");
        assert_eq!(t.rows.len(), 1);
        assert_eq!(t.rows[&key("/", "app", 7, "/bin/app")], 42);
        assert_eq!(t.cpus[&(1, "cpu-clock".to_owned())], 42);
        assert!(t.threads.is_empty());
        assert_eq!(t.encode_payload(), pl, "and writes the same version 1 payload back");
        assert_eq!(t.version(), 1);
    }

    #[test]
    fn rows_cost_a_few_bytes_each() {
        // The shape of bench/who_size.sh: 300 commands in 20 cgroups, each in 4 images.
        let mut t = WhoTable::new("h", "20261125T000000Z");
        for c in 0..300u32 {
            let cg = format!("/system.slice/svc{}.service", c % 20);
            for img in ["/usr/bin/x", "/usr/lib/libc.so.6", "/usr/lib/ld.so", "[kernel.kallsyms]"] {
                t.add(key(&cg, &format!("job{c}"), 0, img), u64::from(c % 7) * 13 + 1);
            }
        }
        let b = t.encode();
        assert!(b.len() < t.rows.len() * 4, "{} bytes for {} rows", b.len(), t.rows.len());
    }
}
