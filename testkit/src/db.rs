//! Database fixtures: epochs, host directories, profiles, who tables, stack files, summaries
//! and kernel symbol snapshots, every file written through profile-format's own writers (the
//! ones dcpid publishes with), so a fixture is byte for byte what the daemon would write.
//!
//! ```text
//! let t = TestDb::new();                                   // a database in a temp dir
//! let hd = t.host(&t.epoch(0), "h1");                      // epoch at base_time(0), host h1
//! let img = Image::elf(build_id(1, 20), "/bin/app");
//! img.profile(&cpu_clock()).counts(&[(0x10, 7)]).write(&hd);   // period: the event's mean
//! Image::kernel("6.1").profile(&ev).count(0x40, 9).period(1000).write(&hd);
//! write_who(&hd, &[(who_key("app", "/bin/app", "cpu-clock"), 7)]);
//! Stacks::new(&hd, "cpu-clock").add(&[(&img, 0x10)], 7).write(&hd);
//! write_summaries(&hd, 12);                                // summary.json and summary.idx
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use profile_format::sumidx;
use profile_format::{
    Database, EpochId, EventDesc, HostDir, HostSummary, ImageId, ImageKind, JitSymbol,
    KallsymsSnapshot, KernelSymbol, Profile, ProfileHeader, ProfileWho, StackImage, StackProfile,
    SummaryIndex, WhoKey, WhoTable, SUMMARY_FORMAT_VERSION,
};

/// The fixtures' fixed base time (2025-06-15, `1_750_000_000` s after the Unix epoch) plus
/// `secs`.
pub fn base_time(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000 + secs)
}

/// A database in a temporary directory (the database is its `db`), removed when dropped.
#[derive(Debug)]
pub struct TestDb {
    dir: tempfile::TempDir,
    pub db: Database,
}

impl Default for TestDb {
    fn default() -> Self {
        Self::new()
    }
}

impl TestDb {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = create_db(&dir.path().join("db"));
        Self { dir, db }
    }
    /// The database's root.
    pub fn root(&self) -> PathBuf {
        self.db.root().to_owned()
    }
    /// The temporary directory (the database is its `db`).
    pub fn tmp(&self) -> &Path {
        self.dir.path()
    }
    /// A new epoch begun by host `h1`, `secs` after the base time.
    pub fn epoch(&self, secs: u64) -> EpochId {
        self.epoch_by(base_time(secs), "h1")
    }
    /// A new epoch begun by `initiator` at `t`.
    pub fn epoch_by(&self, t: SystemTime, initiator: &str) -> EpochId {
        self.db.new_epoch(t, initiator).expect("new epoch")
    }
    /// The directory of `host` in epoch `e`, created.
    pub fn host(&self, e: &EpochId, host: &str) -> HostDir {
        host_dir(&self.db, e, host)
    }
}

/// A new database at `root`.
pub fn create_db(root: &Path) -> Database {
    Database::create(root).expect("create db")
}

/// The directory of `host` in epoch `e` of `db`, created.
pub fn host_dir(db: &Database, e: &EpochId, host: &str) -> HostDir {
    let hd = db.host_dir(e, host).expect("host dir");
    hd.create().expect("create host dir");
    hd
}

/// A new database at `root` with one epoch begun by `host` at the base time, and that host's
/// directory in it, created.
pub fn single_host(root: &Path, host: &str) -> HostDir {
    let db = create_db(root);
    let e = db.new_epoch(base_time(0), host).expect("new epoch");
    host_dir(&db, &e, host)
}

/// A software event (`perf_type` 1) with mean period `period` and the minimum 1/16 lower, as
/// the daemon's frequency mode gives.
pub fn event(name: &str, period: u64) -> EventDesc {
    EventDesc { period_min: period - period / 16, ..fixed_event(name, period) }
}

/// A software event (`perf_type` 1) with a fixed period (minimum = mean = maximum).
pub fn fixed_event(name: &str, period: u64) -> EventDesc {
    EventDesc {
        name: name.into(),
        perf_type: 1,
        perf_config: 0,
        period_mean: period,
        period_min: period,
        period_max: period,
    }
}

/// The default event: cpu-clock at 1 ms ([`event`]).
pub fn cpu_clock() -> EventDesc {
    event("cpu-clock", 1_000_000)
}

/// A build-id of `len` bytes, each `byte`.
pub fn build_id(byte: u8, len: usize) -> ImageId {
    ImageId::BuildId(vec![byte; len])
}

/// An image as profiles and stack frames name it: kind, identity and path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Image {
    pub kind: ImageKind,
    pub id: ImageId,
    /// The path as the kernel showed it (arbitrary bytes).
    pub path: Vec<u8>,
}

impl Image {
    pub fn new(kind: ImageKind, id: ImageId, path: impl AsRef<[u8]>) -> Self {
        Self { kind, id, path: path.as_ref().to_vec() }
    }
    /// An ELF image.
    pub fn elf(id: ImageId, path: impl AsRef<[u8]>) -> Self {
        Self::new(ImageKind::Elf, id, path)
    }
    /// The kernel of release `release` (`[kernel.kallsyms]`, identified as dcpid does).
    pub fn kernel(release: &str) -> Self {
        let name = "[kernel.kallsyms]";
        Self::new(ImageKind::Kernel, ImageId::special(name, release.as_bytes()), name)
    }
    /// A profile of this image for `event`, empty until counts are added.
    pub fn profile(&self, event: &EventDesc) -> ProfileBuilder {
        ProfileBuilder {
            image: self.clone(),
            event: event.clone(),
            period: None,
            counts: Vec::new(),
            jit_symbols: Vec::new(),
            who: None,
        }
    }
    /// This image as a stack frame names it.
    pub fn stack_image(&self) -> StackImage {
        StackImage { kind: self.kind, id: self.id.clone(), path: self.path.clone() }
    }
}

/// One profile file: offsets with counts, the period of every sample, JIT symbols, whose
/// samples. Written where the daemon writes it ([`ProfileBuilder::write`]).
#[derive(Clone, Debug)]
pub struct ProfileBuilder {
    image: Image,
    event: EventDesc,
    period: Option<u64>,
    counts: Vec<(u64, u64)>,
    jit_symbols: Vec<JitSymbol>,
    who: Option<ProfileWho>,
}

impl ProfileBuilder {
    /// The period of every sample (default: the event's mean period).
    pub fn period(mut self, period: u64) -> Self {
        self.period = Some(period);
        self
    }
    /// `count` samples at `offset`.
    pub fn count(mut self, offset: u64, count: u64) -> Self {
        self.counts.push((offset, count));
        self
    }
    /// (offset, count) pairs.
    pub fn counts(mut self, counts: &[(u64, u64)]) -> Self {
        self.counts.extend_from_slice(counts);
        self
    }
    /// JIT symbols (for `Anon` images).
    pub fn jit_symbols(mut self, syms: Vec<JitSymbol>) -> Self {
        self.jit_symbols = syms;
        self
    }
    /// A qualified profile: only `who`'s samples (FORMAT.md §5.6).
    pub fn who(mut self, who: ProfileWho) -> Self {
        self.who = Some(who);
        self
    }
    /// The profile as `host` would publish it in `epoch`.
    pub fn build(&self, host: &str, epoch: &EpochId) -> Profile {
        let header = ProfileHeader {
            kind: self.image.kind,
            image_id: self.image.id.clone(),
            image_path: self.image.path.clone(),
            event: self.event.clone(),
            host: host.into(),
            epoch: epoch.clone(),
            total_samples: 0,
            total_period: 0,
            sequence: 0,
            jit_symbols: self.jit_symbols.clone(),
        };
        let mut p = match &self.who {
            Some(w) => Profile::new_qualified(header, w.clone()),
            None => Profile::new(header),
        };
        let period = self.period.unwrap_or(self.event.period_mean);
        for &(off, c) in &self.counts {
            p.add(off, c, c * period);
        }
        p
    }
    /// The file the daemon writes this profile to in `hd`.
    pub fn path_in(&self, hd: &HostDir) -> PathBuf {
        match &self.who {
            Some(w) => hd.who_profile_path(&self.image.id, &self.event.name, w),
            None if self.image.kind == ImageKind::Unknown => hd.unknown_path(&self.event.name),
            None => hd.profile_path(&self.image.id, &self.event.name),
        }
    }
    /// Write it into `hd` (through `Profile::write`); the file's path.
    pub fn write(&self, hd: &HostDir) -> PathBuf {
        let path = self.path_in(hd);
        self.build(&hd.host, &hd.epoch).write(&path).expect("write profile");
        path
    }
}

/// A who-table key of a process with pid 0 in the root cgroup.
pub fn who_key(command: &str, image: &str, event: &str) -> WhoKey {
    WhoKey {
        cgroup: "/".into(),
        command: command.into(),
        pid: 0,
        image: image.into(),
        event: event.into(),
    }
}

/// Write `hd`'s who table with these rows (key, samples); its path.
pub fn write_who(hd: &HostDir, rows: &[(WhoKey, u64)]) -> PathBuf {
    let mut who = WhoTable::new(&hd.host, hd.epoch.as_str());
    for (key, samples) in rows {
        who.add(key.clone(), *samples);
    }
    let path = hd.who_path();
    who.write(&path).expect("write who table");
    path
}

/// A stack file of one event, built stack by stack.
#[derive(Debug)]
pub struct Stacks(StackProfile);

impl Stacks {
    pub fn new(hd: &HostDir, event: &str) -> Self {
        Self(StackProfile::new(&hd.host, hd.epoch.as_str(), event))
    }
    /// A stack, leaf first: (image, offset) per frame, seen `samples` times.
    pub fn add(&mut self, frames: &[(&Image, u64)], samples: u64) -> &mut Self {
        let frames: Vec<_> = frames
            .iter()
            .map(|(img, off)| (self.0.image_index(&img.stack_image()), *off))
            .collect();
        self.0.add(&frames, false, samples);
        self
    }
    /// Write it into `hd` (through `StackProfile::write`); its path.
    pub fn write(&self, hd: &HostDir) -> PathBuf {
        let path = hd.stacks_path(&self.0.event);
        self.0.write(&path).expect("write stacks");
        path
    }
}

/// Write `hd`'s `summary.json` (saying `samples`) and its `summary.idx` (with the index of the
/// profiles written so far), as a publishing daemon does; the summary.
pub fn write_summaries(hd: &HostDir, samples: u64) -> HostSummary {
    let mut s = HostSummary {
        format_version: SUMMARY_FORMAT_VERSION,
        host: hd.host.clone(),
        epoch: hd.epoch.to_string(),
        samples,
        ..HostSummary::default()
    };
    s.write(&hd.summary_path()).expect("write summary.json");
    s.index = Some(SummaryIndex::of_host_dir(hd).expect("summary index"));
    sumidx::write(&s, &hd.summary_index_path()).expect("write summary.idx");
    s
}

/// Write `hd`'s kernel symbol snapshot: kernel `release`, `_text` at `text_base`, text
/// symbols at (offset from `text_base`, name); its path.
pub fn write_kallsyms(
    hd: &HostDir,
    release: &str,
    text_base: u64,
    syms: &[(u64, &str)],
) -> PathBuf {
    let snap = KallsymsSnapshot {
        kernel_release: release.into(),
        kernel_build_id: None,
        text_base,
        modules: Vec::new(),
        symbols: syms
            .iter()
            .map(|&(off, name)| KernelSymbol {
                addr: text_base + off,
                kind: b't',
                name: name.into(),
                module: None,
            })
            .collect(),
    };
    let path = hd.kallsyms_path();
    snap.write(&path).expect("write kernel symbol snapshot");
    path
}

/// The kinds of database file a report tool may meet: what [`every_kind_of_file`] writes,
/// plus the lease ([`write_lease`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DbFile {
    Profile,
    SummaryIdx,
    SummaryJson,
    Who,
    Stacks,
    Kallsyms,
    Lease,
}

impl DbFile {
    pub const ALL: [Self; 7] = [
        Self::Profile,
        Self::SummaryIdx,
        Self::SummaryJson,
        Self::Who,
        Self::Stacks,
        Self::Kallsyms,
        Self::Lease,
    ];

    /// The file of this kind of `hd`'s host in `db` (for [`DbFile::Profile`], the profile of
    /// `/bin/img1` that [`every_kind_of_file`] writes).
    pub fn path(self, db: &Database, hd: &HostDir) -> PathBuf {
        match self {
            Self::Profile => hd.profile_path(&every_file_image(), "cpu-clock"),
            Self::SummaryIdx => hd.summary_index_path(),
            Self::SummaryJson => hd.summary_path(),
            Self::Who => hd.who_path(),
            Self::Stacks => hd.stacks_path("cpu-clock"),
            Self::Kallsyms => hd.kallsyms_path(),
            Self::Lease => db.lease_path(&hd.host).expect("lease path"),
        }
    }
}

/// The image of the user profile [`every_kind_of_file`] writes.
fn every_file_image() -> ImageId {
    build_id(1, 8)
}

/// Address of `_text` in the snapshot [`every_kind_of_file`] writes.
pub const KTEXT: u64 = 0xffff_ffff_8100_0000;

/// Fill `hd` with one file of every kind a host publishes: a cpu-clock profile (period 1000)
/// of `/bin/img1` (build-id 8 × `01`, 7 samples at 0x10), a kernel profile (release
/// `9.9.9-test`, 5 samples at 0x10) with its symbol snapshot (`kwork` at [`KTEXT`], `kafter`
/// 0x100 above), a who table (img1, 7), a stack file (one frame of img1 at 0x10, 7),
/// `summary.json` (12 samples) and `summary.idx`.
pub fn every_kind_of_file(hd: &HostDir) {
    let ev = event("cpu-clock", 1000);
    let img = Image::elf(every_file_image(), "/bin/img1");
    img.profile(&ev).count(0x10, 7).period(1000).write(hd);
    Image::kernel("9.9.9-test").profile(&ev).count(0x10, 5).period(1000).write(hd);
    write_kallsyms(hd, "9.9.9-test", KTEXT, &[(0, "kwork"), (0x100, "kafter")]);
    write_who(hd, &[(who_key("img1", "/bin/img1", "cpu-clock"), 7)]);
    Stacks::new(hd, "cpu-clock").add(&[(&img, 0x10)], 7).write(hd);
    write_summaries(hd, 12);
}

/// Write a lease of `host` in `db` (interval 1 s), as a running dcpid holds.
pub fn write_lease(db: &Database, host: &str) {
    let lease = profile_format::Lease {
        host: host.into(),
        hostname: host.into(),
        interval_ms: 1000,
        ..profile_format::Lease::default()
    };
    db.write_lease(&lease).expect("write lease");
}
