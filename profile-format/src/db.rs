use std::fs;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::atomic::{sync_dir, write_atomic, TMP_PREFIX};
use crate::error::{Error, Result};
use crate::ident::{event_file_component, validate_host_name, ImageId};
use crate::safeio;
pub use crate::safeio::CORRUPT_SUFFIX;
use crate::safeio::MAX_SMALL_FILE;
use crate::safeio::{check_dir, ensure_dir};

/// Name of the marker file in each epoch directory.
pub const EPOCH_MARKER: &str = "EPOCH";
/// Suffix of profile files.
pub const PROFILE_SUFFIX: &str = ".prof";
/// Stem of per-event unknown profiles.
const UNKNOWN_STEM: &str = "unknown";

/// Largest representable epoch start: 9999-12-31T23:59:59Z.
const MAX_EPOCH_SECS: u64 = 253_402_300_799;

/// Days since 1970-01-01 to (year, month, day) in the proleptic Gregorian calendar
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: u32) -> u32 {
    match m {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        _ if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        _ => 28,
    }
}

/// Epoch identifier: UTC start time `YYYYMMDDTHHMMSSZ`; names sort by start time.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct EpochId(String);

impl EpochId {
    /// The id for an epoch starting at `t` (second resolution). Times before 1970 or after
    /// year 9999 are clamped.
    pub fn from_time(t: SystemTime) -> Self {
        let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        Self::from_unix(secs.min(MAX_EPOCH_SECS))
    }

    fn from_unix(secs: u64) -> Self {
        let days = (secs / 86_400).cast_signed();
        let rem = secs % 86_400;
        let (y, m, d) = civil_from_days(days);
        Self(format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z", rem / 3600, (rem / 60) % 60, rem % 60))
    }

    fn unix_secs(&self) -> u64 {
        // Only constructed through `parse`/`from_unix`, so the text is well formed.
        let b = self.0.as_bytes();
        let num = |r: std::ops::Range<usize>| -> u64 {
            b[r].iter().fold(0, |acc, c| acc * 10 + u64::from(c.wrapping_sub(b'0')))
        };
        let days = days_from_civil(num(0..4).cast_signed(), num(4..6) as u32, num(6..8) as u32);
        (days.max(0) as u64) * 86_400 + num(9..11) * 3600 + num(11..13) * 60 + num(13..15)
    }

    /// Validate the text form.
    pub fn parse(s: &str) -> Result<Self> {
        let invalid = |detail: &str| Error::Invalid {
            what: "epoch id",
            value: s.chars().take(100).collect(),
            detail: format!("{detail} (expected YYYYMMDDTHHMMSSZ, UTC)"),
        };
        let b = s.as_bytes();
        if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
            return Err(invalid("wrong shape"));
        }
        let digits = b[..8].iter().chain(&b[9..15]);
        if !digits.clone().all(u8::is_ascii_digit) {
            return Err(invalid("non-digit"));
        }
        let num = |r: std::ops::Range<usize>| -> u32 {
            b[r].iter().fold(0, |acc, c| acc * 10 + u32::from(c - b'0'))
        };
        let (y, m, d) = (num(0..4), num(4..6), num(6..8));
        let (hh, mm, ss) = (num(9..11), num(11..13), num(13..15));
        if y < 1970 {
            return Err(invalid("year before 1970"));
        }
        if !(1..=12).contains(&m) || d == 0 || d > days_in_month(i64::from(y), m) {
            return Err(invalid("no such date"));
        }
        if hh > 23 || mm > 59 || ss > 59 {
            return Err(invalid("no such time of day"));
        }
        Ok(Self(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The start time this id encodes.
    pub fn start_time(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(self.unix_secs())
    }

    /// The id one second later (saturating at the largest representable id).
    fn next(&self) -> Self {
        Self::from_unix((self.unix_secs() + 1).min(MAX_EPOCH_SECS))
    }
}

impl std::fmt::Display for EpochId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How long an epoch directory may wait for its marker before a host starting the same
/// scheduled epoch writes the marker itself ([`Database::start_epoch_at`]): its creator writes
/// it right after `mkdir` (milliseconds, a few seconds on a slow NFS server), so a directory
/// this old without one was left by a creator that died in between. Measured against the
/// directory's mtime (the file server's clock), so it also absorbs clock skew between hosts.
pub const ABANDONED_EPOCH_AFTER: Duration = Duration::from_secs(60);

/// What [`Database::start_epoch_at`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EpochStart {
    /// This call created the epoch and its marker.
    Created,
    /// This call wrote the marker of an epoch directory its creator abandoned.
    Completed,
    /// Another host started the epoch already (its marker is there).
    Exists,
    /// Another host is starting it (directory without marker, younger than
    /// [`ABANDONED_EPOCH_AFTER`]): it becomes current when the marker appears.
    Pending,
}

/// See [`Database::epochs_stamp`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EpochsStamp {
    dev: u64,
    ino: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl EpochsStamp {
    /// Whether a listing made at `listed_at` under this stamp can be trusted for as long as the
    /// stamp stays the same: the directory's last change of entries (mtime) must be clearly
    /// older than the listing.
    /// On a file system with coarse timestamps (or a server whose clock is ahead), a change in
    /// the same tick as the listing would otherwise leave the stamp unchanged.
    pub fn settled_at(&self, listed_at: std::time::SystemTime) -> bool {
        const MARGIN_S: i64 = 2;
        let Ok(t) = listed_at.duration_since(std::time::UNIX_EPOCH) else { return false };
        let now = i64::try_from(t.as_secs()).unwrap_or(i64::MAX);
        self.mtime.0.saturating_add(MARGIN_S) < now
    }
}

/// A database directory (FORMAT.md "Layout").
#[derive(Clone, Debug)]
pub struct Database {
    root: PathBuf,
}

/// A profile file found in a host directory (name parsed, contents not read).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ProfileEntry {
    pub path: PathBuf,
    /// `None` for the per-event unknown profile.
    pub image_id: Option<ImageId>,
    /// The event file-name component (see [`crate::event_file_component`]).
    pub event_component: String,
}

/// A per-process or per-cgroup profile file found in a host directory (FORMAT.md §5.6; name
/// parsed, contents not read).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct WhoProfileEntry {
    pub path: PathBuf,
    pub image_id: ImageId,
    /// The event file-name component (see [`crate::event_file_component`]).
    pub event_component: String,
    /// `pid-<N>`, `cg-<16 hex>` or `cmd-<16 hex>` ([`crate::ProfileWho::file_component`]).
    pub who_component: String,
}

impl WhoProfileEntry {
    /// The process id the name says, for a per-process profile.
    pub fn pid(&self) -> Option<u32> {
        self.who_component.strip_prefix("pid-")?.parse().ok()
    }

    /// Whether the name says it is a per-cgroup profile.
    pub fn is_cgroup(&self) -> bool {
        self.who_component.starts_with("cg-")
    }

    /// Whether the name says it is a per-command profile.
    pub fn is_command(&self) -> bool {
        self.who_component.starts_with("cmd-")
    }
}

/// Names of the entries of `dir`, skipping temporary and moved-aside files.
fn list_names(dir: &Path) -> Result<Vec<String>> {
    list_names_where(dir, |_| true)
}

/// Names of the subdirectories of `dir` (not through symlinks), as [`list_names`]. The type
/// comes with the listing (`d_type`), so that listing a fleet's epoch does not stat each host
/// directory: on a cold cache that is one inode read per host, one after the other.
fn list_dir_names(dir: &Path) -> Result<Vec<String>> {
    list_names_where(dir, |e| e.file_type().is_ok_and(|t| t.is_dir()))
}

fn list_names_where(dir: &Path, keep: impl Fn(&fs::DirEntry) -> bool) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        if !keep(&entry) {
            continue;
        }
        // Names that are not UTF-8 were not written by dcpi.
        let Ok(name) = entry.file_name().into_string() else { continue };
        if name.starts_with(TMP_PREFIX) || name.ends_with(CORRUPT_SUFFIX) {
            continue;
        }
        names.push(name);
    }
    names.sort();
    Ok(names)
}

/// A profile file name (FORMAT.md §3) split into its image id (`None` for `unknown`) and
/// event component; `None` if the name does not follow the scheme.
pub(crate) fn parse_profile_name(name: &str) -> Option<(Option<ImageId>, &str)> {
    let stem = name.strip_suffix(PROFILE_SUFFIX)?;
    let (image, event) = stem.split_once('.')?;
    if event.is_empty()
        || event.len() > 64
        || !event
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
    {
        return None;
    }
    let image_id = if image == UNKNOWN_STEM { None } else { Some(ImageId::parse(image).ok()?) };
    Some((image_id, event))
}

/// A qualified profile's name (FORMAT.md §3), `<image id>.<event>.<who>.prof`, split into its
/// image id, event component and who component (`pid-<N>`: decimal, no leading zero;
/// `cg-<16 lowercase hex>`, `cmd-<16 lowercase hex>`); `None` if the name does not follow that scheme. Readers that
/// predate these files take the event component to be `<event>.<who>` and, the `.` being no
/// event character, ignore the name ([`parse_profile_name`]).
pub(crate) fn parse_who_profile_name(name: &str) -> Option<(ImageId, &str, &str)> {
    let stem = name.strip_suffix(PROFILE_SUFFIX)?;
    let (rest, who) = stem.rsplit_once('.')?;
    let ok = if let Some(n) = who.strip_prefix("pid-") {
        n.parse::<u32>().is_ok_and(|v| v.to_string() == n)
    } else if let Some(h) = who.strip_prefix("cg-").or_else(|| who.strip_prefix("cmd-")) {
        h.len() == 16 && h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    } else {
        false
    };
    if !ok {
        return None;
    }
    let full = format!("{rest}{PROFILE_SUFFIX}");
    let (image, event_len) = parse_profile_name(&full).map(|(i, e)| (i, e.len()))?;
    // The event component is the end of `rest`; borrowed from `name`, not the temporary.
    Some((image?, &rest[rest.len() - event_len..], who))
}

/// A profile continued beside a newer-format file (FORMAT.md §3.1),
/// `<profile name without .prof>.v<N>.prof`: the name it continues and `N`, the container
/// version its writer writes. `None` for every other name, including names that are valid
/// profile names as they are (`<image>.v1.prof` is the profile of an event named `v1`).
pub(crate) fn split_continuation(name: &str) -> Option<(String, u16)> {
    if parse_profile_name(name).is_some() || parse_who_profile_name(name).is_some() {
        return None;
    }
    let stem = name.strip_suffix(PROFILE_SUFFIX)?;
    let (base, v) = stem.rsplit_once(".v")?;
    let version = v.parse::<u16>().ok().filter(|n| *n > 0 && n.to_string() == v)?;
    let base = format!("{base}{PROFILE_SUFFIX}");
    (parse_profile_name(&base).is_some() || parse_who_profile_name(&base).is_some())
        .then_some((base, version))
}

/// Where a writer continues the profile at `path` when that file is of a newer container
/// version than it can read (FORMAT.md §3.1): the same name with `.v<N>` before `.prof`, `N`
/// being the version this build writes for that profile (1 flat, 2 per process or cgroup).
/// `None` if `path` is no profile name (or already a continuation).
pub fn continuation_path(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?.to_str()?;
    let version = if parse_who_profile_name(name).is_some() {
        2
    } else if parse_profile_name(name).is_some() {
        1
    } else {
        return None;
    };
    let stem = name.strip_suffix(PROFILE_SUFFIX)?;
    Some(path.with_file_name(format!("{stem}.v{version}{PROFILE_SUFFIX}")))
}

impl Database {
    /// Open an existing database (the directory must exist).
    pub fn open(root: &Path) -> Result<Self> {
        let meta = fs::metadata(root).map_err(|e| Error::io(root, e))?;
        if !meta.is_dir() {
            return Err(Error::io(
                root,
                std::io::Error::new(ErrorKind::NotADirectory, "database is not a directory"),
            ));
        }
        Ok(Self { root: root.to_path_buf() })
    }

    /// Open, creating the directory (and `epochs/`) if needed. The root is the operator's
    /// choice (it may be a link); `epochs/` below it must be a real directory (`NotDirectory`).
    pub fn create(root: &Path) -> Result<Self> {
        fs::create_dir_all(root).map_err(|e| Error::io(root, e))?;
        ensure_dir(&root.join("epochs"))?;
        Self::open(root)
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn epochs_dir(&self) -> PathBuf {
        self.root.join("epochs")
    }

    /// All epochs, sorted oldest first.
    pub fn epochs(&self) -> Result<Vec<EpochId>> {
        let dir = self.epochs_dir();
        let names = match list_dir_names(&dir) {
            Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => Vec::new(),
            r => r?,
        };
        Ok(names.iter().filter_map(|n| EpochId::parse(n).ok()).collect())
    }

    /// The current epoch: the newest epoch directory that has its `EPOCH` marker. `None` if
    /// there is none yet.
    pub fn current_epoch(&self) -> Result<Option<EpochId>> {
        Ok(self.current_epoch_settled()?.0)
    }

    /// [`Database::current_epoch`], and whether it is the newest epoch directory. When it is
    /// not, a newer directory is still waiting for its marker: a writer is starting that epoch,
    /// and the answer changes without the epochs directory changing again.
    pub fn current_epoch_settled(&self) -> Result<(Option<EpochId>, bool)> {
        for (i, id) in self.epochs()?.into_iter().rev().enumerate() {
            let marker = self.epoch_dir(&id).join(EPOCH_MARKER);
            match fs::symlink_metadata(&marker) {
                Ok(m) if m.is_file() => return Ok((Some(id), i == 0)),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(marker, e)),
            }
        }
        Ok((None, false))
    }

    /// The epochs directory's identity and change times (one `stat`), `None` if it cannot be
    /// read. Starting or removing an epoch changes them; a reader that polls the current epoch
    /// lists the directory again only when they change (see [`EpochsStamp::settled_at`]).
    pub fn epochs_stamp(&self) -> Option<EpochsStamp> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(self.epochs_dir()).ok()?;
        Some(EpochsStamp {
            dev: m.dev(),
            ino: m.ino(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// Start a new epoch at `now` (or one second after the current one if the clock is behind):
    /// `mkdir` the epoch directory (atomic on NFS too; retries on EEXIST) and write its marker.
    ///
    /// The id is also later than every existing epoch directory, with or without a marker, so
    /// a new epoch always becomes the current one.
    pub fn new_epoch(&self, now: SystemTime, initiator_host: &str) -> Result<EpochId> {
        validate_host_name(initiator_host)?;
        let dir = self.epochs_dir();
        ensure_dir(&dir)?;
        let mut id = EpochId::from_time(now);
        if let Some(last) = self.epochs()?.pop() {
            if id <= last {
                id = last.next();
            }
        }
        // Two hosts racing for the same second both mkdir; exactly one succeeds.
        for _ in 0..10_000 {
            let path = self.epoch_dir(&id);
            match fs::create_dir(&path) {
                Ok(()) => {
                    sync_dir(&dir)?;
                    let marker = format!(
                        "dcpi-epoch 1\nid {id}\ninitiator {initiator_host}\nstart {}\n",
                        id.unix_secs()
                    );
                    write_atomic(&path.join(EPOCH_MARKER), marker.as_bytes())?;
                    return Ok(id);
                }
                Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                    let next = id.next();
                    if next == id {
                        break;
                    }
                    id = next;
                }
                Err(e) => return Err(Error::io(path, e)),
            }
        }
        Err(Error::Invalid {
            what: "epoch id",
            value: id.to_string(),
            detail: "no free epoch id left".into(),
        })
    }

    /// Start the scheduled epoch `id` (FORMAT.md §1.1.1): exactly that id, never the next
    /// free one as [`Database::new_epoch`] does, so that every host reaching the same boundary
    /// starts (or finds) the same epoch without talking to the others. `mkdir` decides which
    /// host creates it; that host writes the marker (with `interval <every_s>`). A directory
    /// found without its marker is another host's start in progress, unless it is older than
    /// [`ABANDONED_EPOCH_AFTER`] by `now`: its creator died between `mkdir` and the marker, and
    /// this host writes the marker in its place (the marker's content is the same but for
    /// `initiator`; readers only test that it exists).
    pub fn start_epoch_at(
        &self,
        id: &EpochId,
        initiator_host: &str,
        every_s: u64,
        now: SystemTime,
    ) -> Result<EpochStart> {
        validate_host_name(initiator_host)?;
        let dir = self.epochs_dir();
        ensure_dir(&dir)?;
        let path = self.epoch_dir(id);
        let marker = path.join(EPOCH_MARKER);
        let text = format!(
            "dcpi-epoch 1\nid {id}\ninitiator {initiator_host}\nstart {}\ninterval {every_s}\n",
            id.unix_secs()
        );
        match fs::create_dir(&path) {
            Ok(()) => {
                sync_dir(&dir)?;
                write_atomic(&marker, text.as_bytes())?;
                Ok(EpochStart::Created)
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                // Not through a link: `check_dir` refuses one (its owner sets it aside). Gone
                // again (retention, by hand): a later attempt makes it.
                if !check_dir(&path)? {
                    return Ok(EpochStart::Pending);
                }
                match fs::symlink_metadata(&marker) {
                    Ok(m) if m.is_file() => return Ok(EpochStart::Exists),
                    Ok(_) => return Ok(EpochStart::Pending),
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(marker, e)),
                }
                let made = fs::symlink_metadata(&path)
                    .and_then(|m| m.modified())
                    .map_err(|e| Error::io(&path, e))?;
                let age = now.duration_since(made).unwrap_or(Duration::ZERO);
                if age < ABANDONED_EPOCH_AFTER {
                    return Ok(EpochStart::Pending);
                }
                write_atomic(&marker, text.as_bytes())?;
                Ok(EpochStart::Completed)
            }
            Err(e) => Err(Error::io(path, e)),
        }
    }

    /// Make sure epoch `id` exists with its marker (written as if by `initiator_host` if it
    /// is missing): for a writer that finds the epoch it was writing into gone (the database
    /// removed while it ran). Returns whether anything was created.
    pub fn ensure_epoch(&self, id: &EpochId, initiator_host: &str) -> Result<bool> {
        validate_host_name(initiator_host)?;
        let path = self.epoch_dir(id);
        let marker = path.join(EPOCH_MARKER);
        ensure_dir(&self.epochs_dir())?;
        if check_dir(&path)? && fs::symlink_metadata(&marker).is_ok_and(|m| m.is_file()) {
            return Ok(false);
        }
        ensure_dir(&path)?;
        sync_dir(&self.epochs_dir())?;
        let text = format!(
            "dcpi-epoch 1\nid {id}\ninitiator {initiator_host}\nstart {}\n",
            id.unix_secs()
        );
        write_atomic(&marker, text.as_bytes())?;
        Ok(true)
    }

    pub fn epoch_dir(&self, epoch: &EpochId) -> PathBuf {
        self.root.join("epochs").join(epoch.as_str())
    }

    /// Host names that have a directory in `epoch`, sorted.
    pub fn hosts(&self, epoch: &EpochId) -> Result<Vec<String>> {
        let dir = self.epoch_dir(epoch);
        Ok(list_dir_names(&dir)?.into_iter().filter(|n| validate_host_name(n).is_ok()).collect())
    }

    /// The directory of `host` in `epoch` (validated host name; not created).
    pub fn host_dir(&self, epoch: &EpochId, host: &str) -> Result<HostDir> {
        validate_host_name(host)?;
        Ok(HostDir {
            path: self.epoch_dir(epoch).join(host),
            host: host.to_owned(),
            epoch: epoch.clone(),
        })
    }

    /// Remove `host`'s directory from `epoch` (retention); removes the epoch directory too if it
    /// is then empty apart from its marker and was not the current epoch.
    pub fn remove_host_epoch(&self, epoch: &EpochId, host: &str) -> Result<()> {
        let hd = self.host_dir(epoch, host)?;
        // Not through a linked `epochs/` or epoch directory: that would remove a directory
        // elsewhere. A linked host directory is only the link (`remove_dir_all` does not
        // follow it).
        if !check_dir(&self.epochs_dir())? || !check_dir(&self.epoch_dir(epoch))? {
            return Ok(());
        }
        match fs::remove_dir_all(&hd.path) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&hd.path, e)),
        }
        if self.current_epoch()?.as_ref() == Some(epoch) {
            return Ok(());
        }
        let dir = self.epoch_dir(epoch);
        let entries = match fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(&dir, e)),
        };
        let mut leftovers = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(&dir, e))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name == EPOCH_MARKER || name.starts_with(TMP_PREFIX) {
                leftovers.push(entry.path());
            } else {
                // Another host still has data here.
                return Ok(());
            }
        }
        let marker = dir.join(EPOCH_MARKER);
        let saved = safeio::read_small(&marker, MAX_SMALL_FILE).ok();
        for p in &leftovers {
            match fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(p, e)),
            }
        }
        match fs::remove_dir(&dir) {
            Ok(()) => sync_dir(&self.epochs_dir()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
            Err(e) => {
                // A host created its directory meanwhile: put the marker back.
                if let Some(content) = saved {
                    write_atomic(&marker, &content)?;
                }
                if e.kind() == ErrorKind::DirectoryNotEmpty {
                    Ok(())
                } else {
                    Err(Error::io(dir, e))
                }
            }
        }
    }
}

/// One host's directory within one epoch.
#[derive(Clone, Debug)]
pub struct HostDir {
    pub path: PathBuf,
    pub host: String,
    pub epoch: EpochId,
}

impl HostDir {
    /// The directories from `epochs/` down to this one, outermost first.
    fn chain(&self) -> [&Path; 3] {
        let epoch = self.path.parent().unwrap_or(&self.path);
        [epoch.parent().unwrap_or(epoch), epoch, &self.path]
    }

    /// Create the directory (and the epoch directory) if missing. Each of `epochs/`, the
    /// epoch's and the host's directory must be a real directory, not a link to one
    /// (`NotDirectory` naming the first that is not, FORMAT.md §6.1).
    pub fn create(&self) -> Result<()> {
        // The root is the operator's (it may be a link); it is recreated if it was removed.
        let root = self.db_root();
        fs::create_dir_all(&root).map_err(|e| Error::io(&root, e))?;
        let mut created = false;
        for d in self.chain() {
            created = ensure_dir(d)?;
        }
        if created {
            if let Some(parent) = self.path.parent() {
                sync_dir(parent)?;
            }
        }
        Ok(())
    }

    /// Whether this directory exists, with `epochs/` and the epoch's directory, each a real
    /// directory (`lstat`); `NotDirectory` naming the first that is something else (a link).
    /// What a writer checks before each use of a directory it created earlier: another
    /// writer of a shared database may have replaced it since.
    pub fn check(&self) -> Result<bool> {
        for d in self.chain() {
            if !check_dir(d)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Remove temporary files (`.tmp-*`, §2) of this directory last modified more than
    /// `min_age` before `now`: left by a writer killed in the middle of a write. Only the
    /// host that owns the directory calls this (no one else writes there). Returns how many
    /// were removed; a missing directory has none.
    pub fn remove_stale_tmp(&self, now: SystemTime, min_age: Duration) -> Result<usize> {
        if !self.check()? {
            return Ok(0);
        }
        let rd = match fs::read_dir(&self.path) {
            Ok(rd) => rd,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(Error::io(&self.path, e)),
        };
        let mut n = 0;
        for entry in rd {
            let entry = entry.map_err(|e| Error::io(&self.path, e))?;
            if !entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                continue;
            }
            let Ok(meta) = entry.path().symlink_metadata() else { continue };
            let old = meta
                .modified()
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age >= min_age);
            if old && !meta.is_dir() {
                match fs::remove_file(entry.path()) {
                    Ok(()) => n += 1,
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(entry.path(), e)),
                }
            }
        }
        Ok(n)
    }

    /// Path of the profile for (image, event name).
    pub fn profile_path(&self, image: &ImageId, event_name: &str) -> PathBuf {
        self.path.join(format!(
            "{}.{}{PROFILE_SUFFIX}",
            image.to_text(),
            event_file_component(event_name)
        ))
    }

    /// Per-process and per-cgroup profile files in this directory (FORMAT.md §5.6), sorted by
    /// name; [`HostDir::profiles`] does not list them.
    pub fn who_profiles(&self) -> Result<Vec<WhoProfileEntry>> {
        let mut out = Vec::new();
        for name in list_names(&self.path)? {
            let base = split_continuation(&name).map(|(b, _)| b);
            let Some((image_id, event, who)) =
                parse_who_profile_name(base.as_deref().unwrap_or(&name))
            else {
                continue;
            };
            out.push(WhoProfileEntry {
                path: self.path.join(&name),
                image_id,
                event_component: event.to_owned(),
                who_component: who.to_owned(),
            });
        }
        Ok(out)
    }

    /// Path of the unknown profile for an event.
    pub fn unknown_path(&self, event_name: &str) -> PathBuf {
        self.path
            .join(format!("{UNKNOWN_STEM}.{}{PROFILE_SUFFIX}", event_file_component(event_name)))
    }

    pub fn summary_path(&self) -> PathBuf {
        self.path.join("summary.json")
    }

    /// The per-directory snapshot of databases before format 2 (FORMAT.md §8.1); still read.
    pub fn kallsyms_path(&self) -> PathBuf {
        self.path.join("kallsyms.snap")
    }

    /// The database root this directory belongs to (`<root>/epochs/<epoch>/<host>`).
    pub fn db_root(&self) -> PathBuf {
        self.path.ancestors().nth(3).map(Path::to_path_buf).unwrap_or_default()
    }

    /// Profile files in this directory (temporary and `*.corrupt` files skipped), sorted by name.
    /// Names that do not follow the profile naming scheme are ignored. A continuation
    /// (FORMAT.md §3.1) is listed as its own entry, of the image and event it continues:
    /// readers add it to the file it continues like any other profile of that image.
    pub fn profiles(&self) -> Result<Vec<ProfileEntry>> {
        let mut out = Vec::new();
        for name in list_names(&self.path)? {
            let base = split_continuation(&name).map(|(b, _)| b);
            let Some((image_id, event)) = parse_profile_name(base.as_deref().unwrap_or(&name))
            else {
                continue;
            };
            out.push(ProfileEntry {
                path: self.path.join(&name),
                image_id,
                event_component: event.to_owned(),
            });
        }
        Ok(out)
    }
}

impl ProfileEntry {
    /// Whether this is a continuation beside a newer-format file (FORMAT.md §3.1).
    pub fn is_continuation(&self) -> bool {
        self.path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| split_continuation(n).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuation_names() {
        let id = ImageId::from_build_id(&[0xab; 4]).unwrap().to_text();
        let flat = format!("{id}.cpu-clock.prof");
        let c = continuation_path(Path::new(&flat)).unwrap();
        assert_eq!(c.to_str().unwrap(), format!("{id}.cpu-clock.v1.prof"));
        assert_eq!(split_continuation(c.to_str().unwrap()), Some((flat.clone(), 1)));
        let who = format!("{id}.cpu-clock.pid-7.prof");
        let c = continuation_path(Path::new(&who)).unwrap();
        assert_eq!(c.to_str().unwrap(), format!("{id}.cpu-clock.pid-7.v2.prof"));
        assert_eq!(split_continuation(c.to_str().unwrap()), Some((who, 2)));
        // An event named `v1` keeps its plain name; its continuation is unambiguous.
        let v1 = format!("{id}.v1.prof");
        assert_eq!(split_continuation(&v1), None);
        assert_eq!(parse_profile_name(&v1).map(|(_, e)| e), Some("v1"));
        let c = continuation_path(Path::new(&v1)).unwrap();
        assert_eq!(split_continuation(c.to_str().unwrap()), Some((v1, 1)));
        for bad in [
            format!("{id}.cpu-clock.v0.prof"),
            format!("{id}.cpu-clock.v01.prof"),
            format!("{id}.cpu-clock.v70000.prof"),
            format!("{id}.cpu-clock.vx.prof"),
            "x.cpu-clock.v1.prof".to_string(),
        ] {
            assert_eq!(split_continuation(&bad), None, "{bad}");
        }
        assert_eq!(continuation_path(Path::new("summary.json")), None);
    }

    #[test]
    fn qualified_profile_names_parse_and_older_readers_ignore_them() {
        let id = ImageId::from_build_id(&[0xab; 4]).unwrap();
        let pid = format!("{}.cpu-clock.pid-42.prof", id.to_text());
        assert_eq!(parse_who_profile_name(&pid), Some((id.clone(), "cpu-clock", "pid-42")));
        let cg = format!("{}.raw-0x1a2_0011223344556677.cg-0123456789abcdef.prof", id.to_text());
        assert_eq!(
            parse_who_profile_name(&cg),
            Some((id.clone(), "raw-0x1a2_0011223344556677", "cg-0123456789abcdef"))
        );
        let cmd = format!("{}.cpu-clock.cmd-00112233445566ff.prof", id.to_text());
        assert_eq!(
            parse_who_profile_name(&cmd),
            Some((id.clone(), "cpu-clock", "cmd-00112233445566ff"))
        );
        // What a reader without them does with these names: not a profile.
        assert_eq!(parse_profile_name(&pid), None);
        assert_eq!(parse_profile_name(&cg), None);
        assert_eq!(parse_profile_name(&cmd), None);
        for bad in [
            format!("{}.cpu-clock.prof", id.to_text()),
            format!("{}.cpu-clock.pid-042.prof", id.to_text()),
            format!("{}.cpu-clock.pid-4294967296.prof", id.to_text()),
            format!("{}.cpu-clock.pid-.prof", id.to_text()),
            format!("{}.cpu-clock.cg-0123456789ABCDEF.prof", id.to_text()),
            format!("{}.cpu-clock.cg-0123.prof", id.to_text()),
            format!("{}.cpu-clock.cmd-0123.prof", id.to_text()),
            format!("{}.cpu-clock.cmd-pcalpha.prof", id.to_text()),
            "unknown.cpu-clock.pid-1.prof".to_string(),
            format!("{}.Cpu.pid-1.prof", id.to_text()),
        ] {
            assert_eq!(parse_who_profile_name(&bad), None, "{bad}");
        }
    }

    #[test]
    fn epoch_id_known_dates() {
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let id = EpochId::from_time(t);
        assert_eq!(id.as_str(), "20231114T221320Z");
        assert_eq!(id.start_time(), t);
        assert_eq!(EpochId::from_time(UNIX_EPOCH).as_str(), "19700101T000000Z");
        let leap = EpochId::parse("20240229T235959Z").unwrap();
        assert_eq!(leap.next().as_str(), "20240301T000000Z");
        assert_eq!(EpochId::from_time(leap.start_time()), leap);
    }

    #[test]
    fn epoch_id_rejects() {
        for bad in [
            "",
            "20230229T000000Z",
            "20231314T000000Z",
            "20231114T240000Z",
            "20231114t221320Z",
            "2023111T4221320Z",
            "20231114T22132Z",
            "../../etc/passwd",
            "19691231T235959Z",
        ] {
            assert!(EpochId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn scheduled_epoch_is_the_same_for_every_host() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path()).unwrap();
        let id = EpochId::from_time(UNIX_EPOCH + Duration::from_secs(1_764_374_400));
        let now = id.start_time() + Duration::from_millis(300);
        assert_eq!(db.start_epoch_at(&id, "web-01", 86_400, now).unwrap(), EpochStart::Created);
        // The second host finds it: the same id, never the next second as `new_epoch` gives.
        assert_eq!(db.start_epoch_at(&id, "web-02", 86_400, now).unwrap(), EpochStart::Exists);
        assert_eq!(db.epochs().unwrap(), std::slice::from_ref(&id));
        assert_eq!(db.current_epoch().unwrap(), Some(id.clone()));
        let marker = std::fs::read_to_string(db.epoch_dir(&id).join(EPOCH_MARKER)).unwrap();
        assert_eq!(
            marker,
            "dcpi-epoch 1\nid 20251129T000000Z\ninitiator web-01\nstart 1764374400\ninterval 86400\n"
        );
        // A manual epoch in between still takes the next free second after it.
        let manual = db.new_epoch(now, "web-02").unwrap();
        assert_eq!(manual.as_str(), "20251129T000001Z");
    }

    #[test]
    fn scheduled_epoch_without_marker_waits_then_is_completed() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path()).unwrap();
        let old = db.new_epoch(UNIX_EPOCH + Duration::from_secs(1_764_300_000), "a").unwrap();
        let id = EpochId::from_time(UNIX_EPOCH + Duration::from_secs(1_764_374_400));
        // Its creator died between mkdir and the marker.
        fs::create_dir(db.epoch_dir(&id)).unwrap();
        let made = fs::metadata(db.epoch_dir(&id)).unwrap().modified().unwrap();
        let soon = made + Duration::from_secs(5);
        assert_eq!(db.start_epoch_at(&id, "b", 60, soon).unwrap(), EpochStart::Pending);
        assert_eq!(db.current_epoch().unwrap(), Some(old));
        let late = made + ABANDONED_EPOCH_AFTER + Duration::from_secs(1);
        assert_eq!(db.start_epoch_at(&id, "b", 60, late).unwrap(), EpochStart::Completed);
        assert_eq!(db.current_epoch().unwrap(), Some(id.clone()));
        assert_eq!(db.start_epoch_at(&id, "c", 60, late).unwrap(), EpochStart::Exists);
        // A link in its place is refused, never written through.
        let other = dir.path().join("elsewhere");
        fs::create_dir(&other).unwrap();
        let linked = EpochId::from_time(UNIX_EPOCH + Duration::from_secs(1_764_374_460));
        std::os::unix::fs::symlink(&other, db.epoch_dir(&linked)).unwrap();
        assert!(matches!(
            db.start_epoch_at(&linked, "b", 60, late),
            Err(Error::NotDirectory { .. })
        ));
        assert!(!other.join(EPOCH_MARKER).exists());
    }

    #[test]
    fn epoch_ids_sort_like_times() {
        let mut prev = EpochId::from_time(UNIX_EPOCH);
        for secs in [59u64, 3600, 86_399, 86_400, 951_782_400, 4_102_444_800, MAX_EPOCH_SECS] {
            let id = EpochId::from_time(UNIX_EPOCH + Duration::from_secs(secs));
            assert!(prev < id, "{prev} !< {id}");
            assert_eq!(EpochId::parse(id.as_str()).unwrap(), id);
            assert_eq!(id.unix_secs(), secs);
            prev = id;
        }
        let far = EpochId::from_time(UNIX_EPOCH + Duration::from_secs(MAX_EPOCH_SECS * 2));
        assert_eq!(far.as_str(), "99991231T235959Z");
    }
}
