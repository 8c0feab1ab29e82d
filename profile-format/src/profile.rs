use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::atomic;
use crate::codec::{self, put_bytes, Reader};
use crate::db;
use crate::db::EpochId;
use crate::db::{HostDir, PROFILE_SUFFIX};
use crate::error::{Error, Result};
use crate::ident;
use crate::ident::event_file_component;
use crate::ident::ImageId;
pub use crate::ident::ImageKind;
use crate::pairs;
use crate::safeio;
use crate::varint::write_u64;

/// First bytes of every profile file.
pub const PROFILE_MAGIC: &[u8; 8] = b"DCPIPROF";
/// Newest version this build reads. A profile is written as version 1 unless it is qualified
/// by a process or cgroup ([`ProfileWho`]; version 2 adds that field) or by a command
/// (version 3: the same field with one more tag), so that readers of version 1 still read
/// every flat profile, and refuse (`UnknownVersion`) a qualified one, and readers of version 2
/// refuse a per-command one rather than call its tag corrupt. Version 4 is only the
/// sole-command stub ([`Profile::sole`], FORMAT.md §5.6.1): a version 3 reader refuses it
/// rather than read it as a command with no samples.
pub const PROFILE_VERSION: u16 = 4;

/// Why a sample could not be attributed; the offset of a count in an `Unknown` profile.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
#[repr(u8)]
pub enum UnknownReason {
    /// The process was known but no mapping covered the pc.
    NoMap = 0,
    /// The process had exited (or was never seen) by the time the sample was resolved.
    ProcessGone = 1,
    /// The process's /proc entries could not be read (e.g. EACCES on PID 1).
    Unreadable = 2,
    /// A kernel-space pc outside the kernel and every known module.
    KernelUnknown = 3,
}

impl UnknownReason {
    pub const ALL: [Self; 4] =
        [Self::NoMap, Self::ProcessGone, Self::Unreadable, Self::KernelUnknown];
    pub fn from_code(code: u64) -> Option<Self> {
        Self::ALL.into_iter().find(|r| *r as u64 == code)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoMap => "no-map",
            Self::ProcessGone => "process-gone",
            Self::Unreadable => "unreadable",
            Self::KernelUnknown => "kernel-unknown",
        }
    }
}

/// A sampling event as configured on the daemon.
#[derive(Clone, PartialEq, Eq, Hash, Debug, serde::Serialize, serde::Deserialize)]
pub struct EventDesc {
    /// User-facing name: `cycles`, `cpu-clock`, `raw:0x1a2`, ...
    pub name: String,
    /// `perf_event_attr.type`.
    pub perf_type: u32,
    /// `perf_event_attr.config`.
    pub perf_config: u64,
    /// Mean of the randomization window of the overflow period (events per sample).
    pub period_mean: u64,
    /// Lower bound of the window.
    pub period_min: u64,
    /// Upper bound of the window.
    pub period_max: u64,
}

/// A symbol published by a JIT in `/tmp/perf-PID.map`; stored with `Anon` profiles.
#[derive(Clone, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct JitSymbol {
    pub start: u64,
    pub size: u64,
    pub name: String,
}

/// A JIT symbol list as profile headers (§5) and stack files (§13) store it: count, then
/// start, size and name of each.
pub(crate) fn write_jit_symbols<'a>(
    out: &mut Vec<u8>,
    syms: impl ExactSizeIterator<Item = &'a JitSymbol>,
) {
    write_u64(out, syms.len() as u64);
    for s in syms {
        write_u64(out, s.start);
        write_u64(out, s.size);
        put_bytes(out, s.name.as_bytes());
    }
}

/// Read what [`write_jit_symbols`] wrote.
pub(crate) fn read_jit_symbols(r: &mut Reader<'_>) -> Result<Vec<JitSymbol>> {
    let n = r.count("jit_symbols", 3)?;
    let mut syms = Vec::with_capacity(n);
    for _ in 0..n {
        let start = r.varint("jit_symbols.start")?;
        let size = r.varint("jit_symbols.size")?;
        let name = r.string("jit_symbols.name")?;
        syms.push(JitSymbol { start, size, name });
    }
    Ok(syms)
}

/// Everything in a profile file except the counts.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ProfileHeader {
    pub kind: ImageKind,
    pub image_id: ImageId,
    /// The image path as the kernel or /proc showed it; arbitrary bytes (may hold newlines).
    pub image_path: Vec<u8>,
    pub event: EventDesc,
    pub host: String,
    pub epoch: EpochId,
    /// Sum of the counts in the body; checked on read.
    pub total_samples: u64,
    /// Sum of the periods in force for every sample counted (events represented). A report
    /// weights a count `c` as `c * total_period / total_samples`.
    pub total_period: u64,
    /// Monotonic sequence number of the last daemon spool increment merged into this file;
    /// lets the daemon publish each increment exactly once across crashes. 0 if unused.
    pub sequence: u64,
    /// JIT symbols (only for `Anon` profiles; empty otherwise).
    pub jit_symbols: Vec<JitSymbol>,
}

/// Whose samples a qualified profile holds (FORMAT.md §5.6): one process's or one cgroup's
/// share of an (image, event), written only when dcpid runs with `by_pid` / `by_cgroup`.
#[derive(Clone, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub enum ProfileWho {
    /// One process id (pids are not reused within an epoch often enough to matter; a reused
    /// pid adds to the same profile) and its command as first published.
    Pid { pid: u32, command: Vec<u8> },
    /// One cgroup v2 path, relative to the v2 root and starting with `/`.
    Cgroup { path: String },
    /// One command (the process's comm, as the who table names it, FORMAT.md §12): every
    /// process that ran under that name, added up. Written by default (`by_command`).
    Command { command: Vec<u8> },
}

const WHO_TAG_PID: u8 = 1;
const WHO_TAG_CGROUP: u8 = 2;
const WHO_TAG_COMMAND: u8 = 3;
/// A command whose samples are the flat profile's (version 4 only, [`Profile::sole`]).
const WHO_TAG_SOLE_COMMAND: u8 = 4;

impl ProfileWho {
    /// The file-name component (FORMAT.md §3): `pid-<decimal>` or `cg-<16 hex>`, the first 8
    /// bytes of SHA-256 of the path (a path can be anything; a name must stay short and safe).
    pub fn file_component(&self) -> String {
        match self {
            Self::Pid { pid, .. } => format!("pid-{pid}"),
            Self::Cgroup { path } => cgroup_file_component(path),
            Self::Command { command } => command_file_component(command),
        }
    }

    /// The profile container version that holds this qualifier (FORMAT.md §5).
    fn version(&self) -> u16 {
        match self {
            Self::Pid { .. } | Self::Cgroup { .. } => 2,
            Self::Command { .. } => 3,
        }
    }

    fn validate(&self) -> std::result::Result<(), String> {
        match self {
            Self::Pid { .. } => Ok(()),
            Self::Command { command } if command.is_empty() => Err("empty command".into()),
            Self::Command { command } if command.len() > 255 => {
                Err(format!("command of {} bytes (at most 255)", command.len()))
            }
            Self::Command { .. } => Ok(()),
            Self::Cgroup { path } if path.starts_with('/') => Ok(()),
            Self::Cgroup { path } => Err(format!("cgroup path {path:?} does not start with '/'")),
        }
    }
}

/// `cg-` and the first 8 bytes of SHA-256 of a cgroup path, in lowercase hex.
pub fn cgroup_file_component(path: &str) -> String {
    use sha2::{Digest, Sha256};
    format!("cg-{}", hex::encode(&Sha256::digest(path.as_bytes())[..8]))
}

/// `cmd-` and the first 8 bytes of SHA-256 of a command, in lowercase hex (a comm may hold
/// `/`, `.` or spaces: `kworker/1:1H-kblockd`, `opt cgu.00`).
pub fn command_file_component(command: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    format!("cmd-{}", hex::encode(&Sha256::digest(command)[..8]))
}

/// One profile: the samples of one (image, event) in one epoch on one host.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Profile {
    pub header: ProfileHeader,
    /// `Some` for a qualified profile: only this process's or cgroup's samples (version 2).
    pub who: Option<ProfileWho>,
    /// Count per offset (see [`ImageKind`] for what an offset means). No zero counts.
    pub counts: BTreeMap<u64, u64>,
    /// A per-command profile that stands for the flat profile of its (image, event) in its
    /// host directory (FORMAT.md §5.6.1): that command ran the image alone so far this epoch,
    /// so dcpid writes this stub (no counts, totals 0, container version 4) instead of a
    /// copy of the flat profile. Readers take the flat profile's counts for it.
    pub sole: bool,
}

impl ProfileHeader {
    /// Check what a reader would reject, so that a buggy writer fails at write time, naming
    /// the value, instead of producing a file nobody can read.
    fn validate(&self) -> std::result::Result<(), (&'static str, String)> {
        if !self.image_id.is_valid() {
            return Err(("image_id", "build-id must have 1..=64 bytes".into()));
        }
        let e = &self.event;
        if !(e.period_min <= e.period_mean && e.period_mean <= e.period_max) {
            return Err((
                "event.period",
                format!(
                    "period window not ordered: min {} mean {} max {}",
                    e.period_min, e.period_mean, e.period_max
                ),
            ));
        }
        if self.kind != ImageKind::Anon && !self.jit_symbols.is_empty() {
            return Err(("jit_symbols", format!("{:?} profile with JIT symbols", self.kind)));
        }
        Ok(())
    }
}

impl ProfileHeader {
    /// Whether a reader would accept this header (`Invalid` naming the field otherwise): lets
    /// a writer refuse bad input it was given before merging it into good data.
    pub fn check(&self) -> Result<()> {
        self.validate().map_err(|(field, detail)| Error::Invalid {
            what: "profile header",
            value: field.to_owned(),
            detail,
        })
    }
}

impl Profile {
    /// An empty profile.
    pub fn new(header: ProfileHeader) -> Self {
        Self { header, who: None, counts: BTreeMap::new(), sole: false }
    }

    /// An empty profile of `who`'s samples only.
    pub fn new_qualified(header: ProfileHeader, who: ProfileWho) -> Self {
        Self { header, who: Some(who), counts: BTreeMap::new(), sole: false }
    }

    /// The stub of `command`'s profile of the (image, event) `flat` describes, standing for
    /// `flat` (FORMAT.md §5.6.1): `flat`'s header without totals, `sequence` as given.
    pub fn sole_command_stub(flat: &ProfileHeader, command: Vec<u8>, sequence: u64) -> Self {
        let mut header = flat.clone();
        header.total_samples = 0;
        header.total_period = 0;
        header.sequence = sequence;
        Self {
            header,
            who: Some(ProfileWho::Command { command }),
            counts: BTreeMap::new(),
            sole: true,
        }
    }

    /// `flat`'s samples as `command`'s profile: what a sole-command stub stands for.
    pub fn as_sole_command(mut flat: Self, command: Vec<u8>) -> Self {
        flat.who = Some(ProfileWho::Command { command });
        flat.sole = false;
        flat
    }

    /// Whether the profile at `path` is a sole-command stub (container version 4, FORMAT.md
    /// §5.6.1), judged by its fixed header only (no decoding): `false` for anything else,
    /// including a file that cannot be opened safely.
    pub fn is_sole_stub(path: &Path) -> bool {
        safeio::container_version(path, PROFILE_MAGIC) == Some(4)
    }

    /// Add `count` samples at `offset`, together with the sum of their periods. A zero count is
    /// ignored (profiles hold no zero counts). Sums saturate instead of wrapping.
    pub fn add(&mut self, offset: u64, count: u64, period_sum: u64) {
        if count == 0 {
            return;
        }
        let c = self.counts.entry(offset).or_insert(0);
        *c = c.saturating_add(count);
        self.header.total_samples = self.header.total_samples.saturating_add(count);
        self.header.total_period = self.header.total_period.saturating_add(period_sum);
    }

    /// Serialize to the on-disk format (FORMAT.md), checksum included.
    pub fn encode(&self) -> Vec<u8> {
        let h = &self.header;
        let version = if self.sole { 4 } else { self.who.as_ref().map_or(1, ProfileWho::version) };
        let mut out = codec::begin(PROFILE_MAGIC, version);
        out.push(h.kind as u8);
        codec::put_image_id(&mut out, &h.image_id);
        put_bytes(&mut out, &h.image_path);
        put_bytes(&mut out, h.event.name.as_bytes());
        write_u64(&mut out, u64::from(h.event.perf_type));
        write_u64(&mut out, h.event.perf_config);
        write_u64(&mut out, h.event.period_mean);
        write_u64(&mut out, h.event.period_min);
        write_u64(&mut out, h.event.period_max);
        put_bytes(&mut out, h.host.as_bytes());
        put_bytes(&mut out, h.epoch.as_str().as_bytes());
        write_u64(&mut out, h.total_samples);
        write_u64(&mut out, h.total_period);
        write_u64(&mut out, h.sequence);
        write_jit_symbols(&mut out, h.jit_symbols.iter());
        match &self.who {
            None => {}
            Some(ProfileWho::Pid { pid, command }) => {
                out.push(WHO_TAG_PID);
                write_u64(&mut out, u64::from(*pid));
                put_bytes(&mut out, command);
            }
            Some(ProfileWho::Cgroup { path }) => {
                out.push(WHO_TAG_CGROUP);
                put_bytes(&mut out, path.as_bytes());
            }
            Some(ProfileWho::Command { command }) => {
                out.push(if self.sole { WHO_TAG_SOLE_COMMAND } else { WHO_TAG_COMMAND });
                put_bytes(&mut out, command);
            }
        }
        pairs::write(&mut out, self.counts.len(), self.counts.iter().map(|(o, c)| (*o, *c)));
        codec::finish(out)
    }

    /// The header fields of a payload of container `version` (§5, fields 1-17), validated;
    /// `r` is left at the counts.
    fn decode_header(
        r: &mut Reader<'_>,
        version: u16,
    ) -> Result<(ProfileHeader, Option<ProfileWho>, bool)> {
        let kind = r.image_kind("kind")?;
        let image_id = r.image_id("image_id")?.to_owned_id();
        let image_path = r.bytes("image_path")?.to_vec();
        let name = r.string("event.name")?;
        let perf_type = r.varint("event.perf_type")?;
        let perf_type = u32::try_from(perf_type)
            .map_err(|_| r.corrupt("event.perf_type", format!("{perf_type} exceeds 32 bits")))?;
        let event = EventDesc {
            name,
            perf_type,
            perf_config: r.varint("event.perf_config")?,
            period_mean: r.varint("event.period_mean")?,
            period_min: r.varint("event.period_min")?,
            period_max: r.varint("event.period_max")?,
        };
        let host = r.string("host")?;
        let epoch_text = r.string("epoch")?;
        let epoch = EpochId::parse(&epoch_text).map_err(|e| r.corrupt("epoch", e.to_string()))?;
        let total_samples = r.varint("total_samples")?;
        let total_period = r.varint("total_period")?;
        let sequence = r.varint("sequence")?;
        let jit_symbols = read_jit_symbols(r)?;
        let mut sole = false;
        let who = if version >= 2 {
            let tag = r.u8("who")?;
            // Tag 4 in version 4 only, and version 4 holds nothing else.
            if (tag == WHO_TAG_SOLE_COMMAND) != (version == 4) {
                return Err(r.corrupt("who", format!("tag {tag} in a version {version} profile")));
            }
            let who = match tag {
                WHO_TAG_PID => {
                    let pid = r.varint("who.pid")?;
                    let pid = u32::try_from(pid)
                        .map_err(|_| r.corrupt("who.pid", format!("{pid} exceeds 32 bits")))?;
                    ProfileWho::Pid { pid, command: r.bytes("who.command")?.to_vec() }
                }
                WHO_TAG_CGROUP => ProfileWho::Cgroup { path: r.string("who.cgroup")? },
                WHO_TAG_COMMAND => {
                    ProfileWho::Command { command: r.bytes("who.command")?.to_vec() }
                }
                WHO_TAG_SOLE_COMMAND => {
                    sole = true;
                    ProfileWho::Command { command: r.bytes("who.command")?.to_vec() }
                }
                t => return Err(r.corrupt("who", format!("unknown qualifier tag {t}"))),
            };
            who.validate().map_err(|d| r.corrupt("who", d))?;
            // One encoding per profile: a command in version 3 (4: a stub) only, the others
            // in version 2.
            if who.version() != version && !sole {
                return Err(r.corrupt(
                    "who",
                    format!("{who:?} in a version {version} profile (expected {})", who.version()),
                ));
            }
            Some(who)
        } else {
            None
        };
        let header = ProfileHeader {
            kind,
            image_id,
            image_path,
            event,
            host,
            epoch,
            total_samples,
            total_period,
            sequence,
            jit_symbols,
        };
        if let Err((field, detail)) = header.validate() {
            return Err(r.corrupt(field, detail));
        }
        Ok((header, who, sole))
    }

    /// The header of the profile file at `path` (image, event, totals), read from its first
    /// bytes: the counts are neither read nor decoded, and the checksum of a file longer than
    /// that prefix is not checked (a reader of the counts reads it with [`Profile::read`]).
    /// What deciding whether a file is the image a report asks for needs: a per-symbol report
    /// of the current epoch read every profile whole to learn its image (BENCHMARKS.md
    /// "Time-slice queries"). A header that does not parse from the prefix (thousands of JIT
    /// symbols) or a damaged one is left to [`Profile::read`], which decides and names it.
    pub fn read_header(path: &Path) -> Result<ProfileHeader> {
        use std::io::Read;
        const PREFIX: u64 = 16 << 10;
        let (f, size) = safeio::open_regular(path)?;
        let mut bytes = Vec::with_capacity(size.min(PREFIX) as usize);
        f.take(PREFIX + 1).read_to_end(&mut bytes).map_err(|e| Error::io(path, e))?;
        if bytes.len() as u64 <= PREFIX {
            // The whole file: every check.
            let p = Self::decode(&bytes, path)?;
            p.check_name(path)?;
            return Ok(p.header);
        }
        codec::check_prefix(&bytes, path, PROFILE_MAGIC, "profile", PROFILE_VERSION)?;
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        let flags = u16::from_le_bytes([bytes[10], bytes[11]]);
        let mut r = Reader::new(&bytes[codec::FIXED_HEADER_LEN..], path);
        match Self::decode_header(&mut r, version) {
            Ok((header, who, sole)) if flags == 0 => {
                let p = Self { header, who, counts: BTreeMap::new(), sole };
                p.check_name(path)?;
                Ok(p.header)
            }
            _ => Self::read(path).map(|p| p.header),
        }
    }

    /// Parse and validate; `path` is only used to name the file in errors.
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self> {
        let payload = codec::open(bytes, path, PROFILE_MAGIC, "profile", PROFILE_VERSION)?;
        let mut r = Reader::new(payload, path);
        // `open` checked the container: magic, then the version (u16 LE), 1 to 4.
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        let (header, who, sole) = Self::decode_header(&mut r, version)?;
        // Collected first: building a BTreeMap from sorted pairs in bulk is several times
        // faster than inserting them one by one.
        let mut pairs = Vec::new();
        let sum = r.pairs(|off, count| pairs.push((off, count)))?;
        r.finish()?;
        let counts = BTreeMap::from_iter(pairs);
        if sum != header.total_samples {
            return Err(r.corrupt(
                "total_samples",
                format!("header says {} but the counts add up to {sum}", header.total_samples),
            ));
        }
        if sole && (sum != 0 || header.total_period != 0) {
            return Err(r.corrupt("total_samples", "a sole-command stub with samples of its own"));
        }
        Ok(Self { header, who, counts, sole })
    }

    /// Whether `path` holds a profile of a newer container version than this build reads,
    /// whole (its stored length is its size): a newer writer's file, to be left alone
    /// (FORMAT.md §3.1), not a corrupt one.
    pub fn is_newer_version(path: &Path) -> bool {
        safeio::is_newer_container(path, PROFILE_MAGIC, PROFILE_VERSION)
    }

    /// Read and validate a profile file. The file is opened safely and read only up to the
    /// length its header announces (FORMAT.md §6.1); when its name follows the profile naming
    /// scheme (§3), the header must describe the image and event the name says.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = safeio::read_container(path, PROFILE_MAGIC, "profile", PROFILE_VERSION)?;
        let p = Self::decode(&bytes, path)?;
        p.check_name(path)?;
        Ok(p)
    }

    /// The header against the file name: a file renamed (or copied) over another profile's
    /// name would otherwise be merged into, and reported as, the wrong image.
    fn check_name(&self, path: &Path) -> Result<()> {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return Ok(()) };
        // A continuation (FORMAT.md §3.1) holds what the name it continues would.
        let base = db::split_continuation(name).map(|(b, _)| b);
        let name = base.as_deref().unwrap_or(name);
        if let Some((image, event, who)) = db::parse_who_profile_name(name) {
            let h = &self.header;
            let mine = self.who.as_ref().map(ProfileWho::file_component);
            if mine.as_deref() != Some(who) {
                return Err(Error::Corrupt {
                    path: path.into(),
                    field: "who",
                    detail: match &self.who {
                        None => "a flat profile under a per-process/per-cgroup name".into(),
                        Some(w) => format!("the header describes {w:?}, the name says {who}"),
                    },
                });
            }
            if image != h.image_id || ident::event_file_component(&h.event.name) != event {
                return Err(Error::Corrupt {
                    path: path.into(),
                    field: "file name",
                    detail: format!(
                        "the header describes image {} ({:?}), event {:?}",
                        h.image_id, h.kind, h.event.name
                    ),
                });
            }
            return Ok(());
        }
        let Some((image, event)) = db::parse_profile_name(name) else { return Ok(()) };
        if self.who.is_some() {
            return Err(Error::Corrupt {
                path: path.into(),
                field: "who",
                detail: "a per-process/per-cgroup profile under a flat profile's name".into(),
            });
        }
        let h = &self.header;
        let image_ok = match &image {
            Some(id) => *id == h.image_id,
            None => h.kind == ImageKind::Unknown,
        };
        if !image_ok || ident::event_file_component(&h.event.name) != event {
            return Err(Error::Corrupt {
                path: path.into(),
                field: "file name",
                detail: format!(
                    "the header describes image {} ({:?}), event {:?}",
                    h.image_id, h.kind, h.event.name
                ),
            });
        }
        Ok(())
    }

    /// Write atomically (temp file in the same directory, fsync, rename, fsync directory);
    /// returns the file's size. A header that a reader would reject is refused (`Invalid`)
    /// before anything is written.
    pub fn write(&self, path: &Path) -> Result<u64> {
        if let Err((field, detail)) = self.header.validate() {
            return Err(Error::Invalid {
                what: "profile header",
                value: format!("{} ({field})", path.display()),
                detail,
            });
        }
        if let Some(Err(detail)) = self.who.as_ref().map(ProfileWho::validate) {
            return Err(Error::Invalid {
                what: "profile header",
                value: format!("{} (who)", path.display()),
                detail,
            });
        }
        if self.sole
            && (!matches!(self.who, Some(ProfileWho::Command { .. }))
                || !self.counts.is_empty()
                || self.header.total_period != 0)
        {
            return Err(Error::Invalid {
                what: "profile",
                value: path.display().to_string(),
                detail: "a sole-command stub must be a command's, without samples".into(),
            });
        }
        let sum = self.counts.values().fold(0u64, |a, &c| a.saturating_add(c));
        if sum != self.header.total_samples || self.counts.values().any(|&c| c == 0) {
            return Err(Error::Invalid {
                what: "profile counts",
                value: path.display().to_string(),
                detail: format!(
                    "total_samples {} but counts add up to {sum} (or hold a zero)",
                    self.header.total_samples
                ),
            });
        }
        let bytes = self.encode();
        atomic::write_atomic(path, &bytes)?;
        Ok(bytes.len() as u64)
    }

    /// Add `other`'s counts and totals to `self`. Both must describe the same image and event
    /// name (otherwise [`crate::Error::MergeMismatch`]); the period window widens to cover both,
    /// `sequence` becomes the max, JIT symbols are unioned. Host and epoch of `self` are kept.
    ///
    /// When the two period means differ, the merged mean is the observed mean
    /// `total_period / total_samples`, clamped into the widened window.
    pub fn merge(&mut self, other: &Self) -> Result<()> {
        if self.sole || other.sole {
            // A stub stands for another file's counts: merging into it would lose them.
            return Err(Error::MergeMismatch(
                "a sole-command stub holds no counts to merge".into(),
            ));
        }
        let (a, b) = (&mut self.header, &other.header);
        if a.image_id != b.image_id || a.kind != b.kind {
            return Err(Error::MergeMismatch(format!(
                "different images: {} ({:?}) and {} ({:?})",
                a.image_id, a.kind, b.image_id, b.kind
            )));
        }
        if a.event.name != b.event.name {
            return Err(Error::MergeMismatch(format!(
                "different events: {:?} and {:?}",
                a.event.name, b.event.name
            )));
        }
        // Same process or cgroup (a pid's command may differ: the receiver's is kept).
        let key = |w: &Option<ProfileWho>| w.as_ref().map(ProfileWho::file_component);
        let (wa, wb) = (&self.who, &other.who);
        let same_who = match (wa, wb) {
            (Some(ProfileWho::Cgroup { path: x }), Some(ProfileWho::Cgroup { path: y })) => x == y,
            (
                Some(ProfileWho::Command { command: x }),
                Some(ProfileWho::Command { command: y }),
            ) => x == y,
            _ => key(wa) == key(wb),
        };
        if !same_who {
            return Err(Error::MergeMismatch(format!("different qualifiers: {wa:?} and {wb:?}")));
        }
        for (&off, &c) in &other.counts {
            let e = self.counts.entry(off).or_insert(0);
            *e = e.saturating_add(c);
        }
        a.total_samples = a.total_samples.saturating_add(b.total_samples);
        a.total_period = a.total_period.saturating_add(b.total_period);
        a.sequence = a.sequence.max(b.sequence);
        a.event.period_min = a.event.period_min.min(b.event.period_min);
        a.event.period_max = a.event.period_max.max(b.event.period_max);
        if a.event.period_mean != b.event.period_mean {
            let observed =
                a.total_period.checked_div(a.total_samples).unwrap_or(a.event.period_mean);
            a.event.period_mean = observed.clamp(a.event.period_min, a.event.period_max);
        }
        if a.image_path.is_empty() {
            a.image_path = b.image_path.clone();
        }
        if !b.jit_symbols.is_empty() {
            a.jit_symbols.extend(b.jit_symbols.iter().cloned());
            a.jit_symbols.sort();
            a.jit_symbols.dedup();
        }
        Ok(())
    }
}

// Here rather than in db, which must not import the modules that own the files it names (issue 34).
impl HostDir {
    /// Path of `who`'s share of the profile of (image, event name) (FORMAT.md §5.6).
    pub fn who_profile_path(&self, image: &ImageId, event_name: &str, who: &ProfileWho) -> PathBuf {
        self.path.join(format!(
            "{}.{}.{}{PROFILE_SUFFIX}",
            image.to_text(),
            event_file_component(event_name),
            who.file_component()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(kind: ImageKind) -> ProfileHeader {
        ProfileHeader {
            kind,
            image_id: ImageId::from_build_id(&[0xab; 20]).unwrap(),
            image_path: b"/usr/bin/x".to_vec(),
            event: EventDesc {
                name: "cpu-clock".into(),
                perf_type: 1,
                perf_config: 0,
                period_mean: 1_000_000,
                period_min: 900_000,
                period_max: 1_100_000,
            },
            host: "h1".into(),
            epoch: EpochId::parse("20240101T000000Z").unwrap(),
            total_samples: 0,
            total_period: 0,
            sequence: 3,
            jit_symbols: vec![],
        }
    }

    #[test]
    fn round_trip_and_totals() {
        let mut p = Profile::new(header(ImageKind::Elf));
        p.add(0x1000, 3, 3_000_000);
        p.add(0x1000, 1, 1_000_000);
        p.add(0, 2, 2_000_000);
        p.add(u64::MAX, 1, 1);
        p.add(5, 0, 0);
        assert_eq!(p.header.total_samples, 7);
        let bytes = p.encode();
        let q = Profile::decode(&bytes, Path::new("x.prof")).unwrap();
        assert_eq!(p, q);
        assert_eq!(q.counts.get(&0x1000), Some(&4));
    }

    /// The header alone from a large file's first bytes, equal to the full read's; damage in
    /// the counts beyond them is only the full read's business, damage in a small file (read
    /// whole) or in the header is the same error as a full read.
    #[test]
    fn a_header_reads_from_the_first_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Profile::new(header(ImageKind::Elf));
        for i in 0..20_000u64 {
            p.add(i * 4, 1 + i % 3, 1);
        }
        let path = dir.path().join("big.prof");
        p.write(&path).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() > 32 << 10);
        assert_eq!(Profile::read_header(&path).unwrap(), p.header);
        let mut bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 100] ^= 0x40;
        std::fs::write(&path, &bytes).unwrap();
        assert!(Profile::read(&path).is_err());
        assert_eq!(Profile::read_header(&path).unwrap(), p.header, "counts not read");
        // Damage in the header: the full read names it.
        bytes[codec::FIXED_HEADER_LEN] = 0xee;
        std::fs::write(&path, &bytes).unwrap();
        let e = Profile::read_header(&path).unwrap_err().to_string();
        assert!(e.contains("big.prof"), "{e}");
        // A small file is read whole: its checksum decides.
        let mut small = Profile::new(header(ImageKind::Elf));
        small.add(0x40, 1, 1);
        let sp = dir.path().join("small.prof");
        small.write(&sp).unwrap();
        assert_eq!(Profile::read_header(&sp).unwrap(), small.header);
        let mut b = std::fs::read(&sp).unwrap();
        let m = b.len();
        b[m - 6] ^= 1;
        std::fs::write(&sp, &b).unwrap();
        assert!(matches!(Profile::read_header(&sp), Err(Error::ChecksumMismatch { .. })));
    }

    fn qualified(who: ProfileWho) -> Profile {
        let mut p = Profile::new_qualified(header(ImageKind::Elf), who);
        p.add(0x40, 5, 5_000_000);
        p.add(0x80, 2, 2_000_000);
        p
    }

    #[test]
    fn qualified_profiles_are_version_2_and_flat_ones_stay_version_1() {
        let mut flat = Profile::new(header(ImageKind::Elf));
        flat.add(1, 1, 1);
        assert_eq!(u16::from_le_bytes([flat.encode()[8], flat.encode()[9]]), 1);
        for who in [
            ProfileWho::Pid { pid: 4242, command: b"busy loop".to_vec() },
            ProfileWho::Cgroup { path: "/system.slice/a.service".into() },
        ] {
            let p = qualified(who);
            let bytes = p.encode();
            assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 2);
            assert_eq!(Profile::decode(&bytes, Path::new("q.prof")).unwrap(), p);
            // A reader of version 1 refuses it cleanly instead of misreading it.
            let e =
                codec::open(&bytes, Path::new("q.prof"), PROFILE_MAGIC, "profile", 1).unwrap_err();
            assert!(matches!(e, Error::UnknownVersion { version: 2, .. }), "{e}");
        }
    }

    /// A sole-command stub (FORMAT.md §5.6.1) is version 4 under the command's name, holds no
    /// samples, is refused by a version 3 reader (never read as an empty profile), and its
    /// tag is corrupt in any other version; it cannot be merged into.
    #[test]
    fn sole_command_stubs_are_version_4_without_samples() {
        let mut flat = Profile::new(header(ImageKind::Elf));
        flat.add(0x40, 3, 3_000_000);
        let stub = Profile::sole_command_stub(&flat.header, b"web".to_vec(), 17);
        let bytes = stub.encode();
        assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 4);
        let back = Profile::decode(&bytes, Path::new("q.prof")).unwrap();
        assert_eq!(back, stub);
        assert!(back.sole && back.counts.is_empty() && back.header.sequence == 17);
        let e = codec::open(&bytes, Path::new("q.prof"), PROFILE_MAGIC, "profile", 3).unwrap_err();
        assert!(matches!(e, Error::UnknownVersion { version: 4, .. }), "{e}");
        let mut bad = bytes.clone();
        bad[8] = 3;
        let e = Profile::decode(&reseal(bad), Path::new("q.prof")).unwrap_err();
        assert!(matches!(e, Error::Corrupt { field: "who", .. }), "{e}");
        let mut bad = qualified(ProfileWho::Command { command: b"web".to_vec() }).encode();
        bad[8] = 4;
        let e = Profile::decode(&reseal(bad), Path::new("q.prof")).unwrap_err();
        assert!(matches!(e, Error::Corrupt { .. }), "{e}");
        // Written and read under the command's name; found by its fixed header alone.
        let dir = tempfile::tempdir().unwrap();
        let id = header(ImageKind::Elf).image_id.to_text();
        let path =
            dir.path().join(format!("{id}.cpu-clock.{}.prof", command_file_component(b"web")));
        stub.write(&path).unwrap();
        assert_eq!(Profile::read(&path).unwrap(), stub);
        assert!(Profile::is_sole_stub(&path));
        let real = Profile::as_sole_command(flat.clone(), b"web".to_vec());
        real.write(&path).unwrap();
        assert!(!Profile::is_sole_stub(&path));
        assert_eq!(Profile::read(&path).unwrap().counts, flat.counts);
        // A stub with samples is refused at write time; nothing merges into or from one.
        let mut with = stub.clone();
        with.add(1, 1, 1);
        assert!(matches!(with.write(&path), Err(Error::Invalid { .. })));
        let mut s = stub.clone();
        assert!(matches!(s.merge(&real), Err(Error::MergeMismatch(_))));
        let mut r = real.clone();
        assert!(matches!(r.merge(&stub), Err(Error::MergeMismatch(_))));
    }

    /// Per-command profiles (`by_command`) are version 3: a version 2 reader refuses them,
    /// a command tag in a version 2 container (or a pid tag in version 3) is corrupt, and the
    /// name carries a hash of the command, checked against the header.
    #[test]
    fn per_command_profiles_are_version_3_and_named_by_their_command() {
        let who = ProfileWho::Command { command: b"kworker/1:1H-kb".to_vec() };
        let p = qualified(who.clone());
        let bytes = p.encode();
        assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 3);
        assert_eq!(Profile::decode(&bytes, Path::new("q.prof")).unwrap(), p);
        let e = codec::open(&bytes, Path::new("q.prof"), PROFILE_MAGIC, "profile", 2).unwrap_err();
        assert!(matches!(e, Error::UnknownVersion { version: 3, .. }), "{e}");
        let mut bad = bytes.clone();
        bad[8] = 2;
        let e = Profile::decode(&reseal(bad), Path::new("q.prof")).unwrap_err();
        assert!(matches!(e, Error::Corrupt { field: "who", .. }), "{e}");
        let pid = qualified(ProfileWho::Pid { pid: 1, command: b"x".to_vec() }).encode();
        let mut bad = pid;
        bad[8] = 3;
        let e = Profile::decode(&reseal(bad), Path::new("q.prof")).unwrap_err();
        assert!(matches!(e, Error::Corrupt { field: "who", .. }), "{e}");
        // Empty and over-long commands are refused at write time.
        let dir = tempfile::tempdir().unwrap();
        for bad in [vec![], vec![b'x'; 256]] {
            let q = qualified(ProfileWho::Command { command: bad });
            assert!(matches!(q.write(&dir.path().join("x.prof")), Err(Error::Invalid { .. })));
        }
        // The name: `cmd-` and 16 hex digits of the command's hash.
        let id = header(ImageKind::Elf).image_id.to_text();
        let comp = command_file_component(b"kworker/1:1H-kb");
        assert!(comp.starts_with("cmd-") && comp.len() == 20, "{comp}");
        let good = dir.path().join(format!("{id}.cpu-clock.{comp}.prof"));
        p.write(&good).unwrap();
        assert_eq!(Profile::read(&good).unwrap(), p);
        let other = command_file_component(b"other");
        let path = dir.path().join(format!("{id}.cpu-clock.{other}.prof"));
        std::fs::copy(&good, &path).unwrap();
        let e = Profile::read(&path).unwrap_err();
        assert!(matches!(e, Error::Corrupt { field: "who", .. }), "{e}");
        // Merging: the same command only.
        let mut a = p.clone();
        a.merge(&p).unwrap();
        assert_eq!(a.header.total_samples, 14);
        let b = qualified(ProfileWho::Command { command: b"other".to_vec() });
        assert!(matches!(a.merge(&b), Err(Error::MergeMismatch(_))));
    }

    /// Re-checksum a container whose bytes were edited.
    fn reseal(mut b: Vec<u8>) -> Vec<u8> {
        let n = b.len() - 4;
        let crc = crc32fast::hash(&b[..n]);
        b[n..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    #[test]
    fn a_corrupt_qualifier_is_a_named_error() {
        let p = qualified(ProfileWho::Cgroup { path: "/a".into() });
        let bytes = p.encode();
        // The qualifier tag is the byte before the path's length and "/a".
        let at = bytes.windows(4).position(|w| w == [2, 2, b'/', b'a']).unwrap();
        let mut bad = bytes.clone();
        bad[at] = 9;
        let e = Profile::decode(&reseal(bad), Path::new("q.prof")).unwrap_err();
        assert!(matches!(e, Error::Corrupt { field: "who", .. }), "{e}");
        assert!(e.to_string().contains("q.prof"), "{e}");
        // A cgroup path that is not one.
        let mut bad = bytes.clone();
        bad[at + 2] = b'x';
        let e = Profile::decode(&reseal(bad), Path::new("q.prof")).unwrap_err();
        assert!(matches!(e, Error::Corrupt { field: "who", .. }), "{e}");
        // A version 1 container around a qualified payload: the qualifier is taken for the
        // pairs, which then do not parse or add up.
        let mut bad = bytes;
        bad[8] = 1;
        assert!(Profile::decode(&reseal(bad), Path::new("q.prof")).is_err());
    }

    #[test]
    fn names_and_qualifiers_must_agree() {
        let dir = tempfile::tempdir().unwrap();
        let id = header(ImageKind::Elf).image_id.to_text();
        let pid = qualified(ProfileWho::Pid { pid: 7, command: b"x".to_vec() });
        let good = dir.path().join(format!("{id}.cpu-clock.pid-7.prof"));
        pid.write(&good).unwrap();
        assert_eq!(Profile::read(&good).unwrap(), pid);
        for (name, field) in [
            (format!("{id}.cpu-clock.pid-8.prof"), "who"),
            (format!("{id}.cpu-clock.prof"), "who"),
            (format!("{id}.cpu-clock.cg-0123456789abcdef.prof"), "who"),
            ("b00.cpu-clock.pid-7.prof".to_string(), "file name"),
        ] {
            let path = dir.path().join(&name);
            std::fs::copy(&good, &path).unwrap();
            let e = Profile::read(&path).unwrap_err();
            assert!(matches!(e, Error::Corrupt { field: f, .. } if f == field), "{name}: {e}");
        }
        // A flat profile under a qualified name.
        let mut flat = Profile::new(header(ImageKind::Elf));
        flat.add(1, 1, 1);
        let path = dir.path().join(format!("{id}.cpu-clock.pid-7.prof"));
        std::fs::write(&path, flat.encode()).unwrap();
        let e = Profile::read(&path).unwrap_err();
        assert!(matches!(e, Error::Corrupt { field: "who", .. }), "{e}");
    }

    #[test]
    fn qualified_profiles_merge_only_with_the_same_process_or_cgroup() {
        let mut a = qualified(ProfileWho::Pid { pid: 7, command: b"a".to_vec() });
        let renamed = qualified(ProfileWho::Pid { pid: 7, command: b"b".to_vec() });
        a.merge(&renamed).unwrap();
        assert_eq!(a.header.total_samples, 14);
        assert_eq!(a.who, Some(ProfileWho::Pid { pid: 7, command: b"a".to_vec() }));
        for other in [
            qualified(ProfileWho::Pid { pid: 8, command: b"a".to_vec() }),
            qualified(ProfileWho::Cgroup { path: "/a".into() }),
            Profile::new(header(ImageKind::Elf)),
        ] {
            assert!(matches!(a.merge(&other), Err(Error::MergeMismatch(_))), "{:?}", other.who);
        }
    }

    #[test]
    fn inconsistent_totals_are_corrupt() {
        let mut p = Profile::new(header(ImageKind::Elf));
        p.add(1, 1, 1);
        p.header.total_samples = 2;
        let e = Profile::decode(&p.encode(), Path::new("a.prof")).unwrap_err();
        assert!(matches!(e, Error::Corrupt { field: "total_samples", .. }), "{e}");
        assert!(e.to_string().contains("a.prof"));
    }

    #[test]
    fn merge_rules() {
        let mut a = Profile::new(header(ImageKind::Anon));
        a.add(1, 1, 10);
        a.header.jit_symbols = vec![JitSymbol { start: 5, size: 1, name: "f".into() }];
        let mut b = a.clone();
        b.header.event.period_min = 10;
        b.header.event.period_mean = 20;
        b.header.event.period_max = 2_000_000;
        b.header.sequence = 9;
        b.header.jit_symbols.push(JitSymbol { start: 1, size: 1, name: "g".into() });
        a.merge(&b).unwrap();
        assert_eq!(a.counts[&1], 2);
        assert_eq!(a.header.total_samples, 2);
        assert_eq!((a.header.event.period_min, a.header.event.period_max), (10, 2_000_000));
        assert_eq!(a.header.event.period_mean, 10);
        assert_eq!(a.header.sequence, 9);
        assert_eq!(a.header.jit_symbols.len(), 2);
        let mut other = Profile::new(header(ImageKind::Anon));
        other.header.event.name = "cycles".into();
        assert!(matches!(a.merge(&other), Err(Error::MergeMismatch(_))));
        other = Profile::new(header(ImageKind::Anon));
        other.header.image_id = ImageId::special("[anon]", b"1");
        assert!(matches!(a.merge(&other), Err(Error::MergeMismatch(_))));
    }

    #[test]
    fn write_refuses_invalid_headers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.prof");
        let mut p = Profile::new(header(ImageKind::Elf));
        p.header.image_id = ImageId::BuildId(vec![1; 65]);
        assert!(matches!(p.write(&path), Err(Error::Invalid { .. })));
        let mut p = Profile::new(header(ImageKind::Elf));
        p.header.jit_symbols.push(JitSymbol { start: 0, size: 0, name: String::new() });
        assert!(p.write(&path).is_err());
        let mut p = Profile::new(header(ImageKind::Elf));
        p.header.total_samples = 1;
        assert!(p.write(&path).is_err());
        assert!(!path.exists());
    }
}
