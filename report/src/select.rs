//! Choosing epochs and hosts, and loading their profiles and summaries.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use profile_format::sumidx::{self, ImageIdRef};
use profile_format::{
    Database, EpochId, EventDesc, HostDir, HostSummary, ImageId, ImageKind, Profile, ProfileEntry,
    ProfileHeader, SliceKey,
};

use super::image::{image_display, ImageFilter};
use super::timerange::{coverage, rescale, sum_parts};
pub use super::timerange::{left_out_warning, slice_key, DirRange};
pub use super::timerange::{TimeCoverage, TimeRange};
use super::{stats, ProfError};

/// `--epoch`: `latest`, `all`, one id, or an inclusive range `FROM..TO` (either end may be
/// omitted; an end may be a prefix such as `20250101` meaning "that day").
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EpochSel {
    Latest,
    All,
    One(String),
    Range(Option<String>, Option<String>),
    /// Epochs whose time span overlaps [since, until) (Unix seconds; `--since`/`--until`).
    /// An epoch lasts from its id's time to the next epoch's.
    Between(Option<u64>, Option<u64>),
}

/// Unix seconds of an epoch id (`YYYYMMDDTHHMMSSZ`) or a day (`YYYYMMDD`, its midnight UTC).
pub fn epoch_start(s: &str) -> Option<u64> {
    if !(s.len() == 8 || s.len() == 16) || !valid_epoch_prefix(s) {
        return None;
    }
    let b = s.as_bytes();
    let d = |r: std::ops::Range<usize>| std::str::from_utf8(&b[r]).ok();
    let (hh, mm, ss) =
        if s.len() == 16 { (d(9..11)?, d(11..13)?, d(13..15)?) } else { ("00", "00", "00") };
    let text = format!("{}-{}-{}T{hh}:{mm}:{ss}Z", d(0..4)?, d(4..6)?, d(6..8)?);
    let t = humantime::parse_rfc3339(&text).ok()?;
    t.duration_since(std::time::UNIX_EPOCH).ok().map(|x| x.as_secs())
}

fn valid_epoch_prefix(s: &str) -> bool {
    // YYYYMMDDTHHMMSSZ: digits, with `T` at 8 and `Z` at 15.
    s.len() <= 16
        && s.bytes().enumerate().all(|(i, b)| match i {
            8 => b == b'T',
            15 => b == b'Z',
            _ => b.is_ascii_digit(),
        })
}

impl FromStr for EpochSel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "latest" => return Ok(Self::Latest),
            "all" => return Ok(Self::All),
            _ => {}
        }
        let bad = |what: &str| {
            format!(
                "{what} {s:?}: expected `latest`, `all`, an epoch id like 20250102T030405Z, a day \
                 like 20250102, or FROM..TO (ids or prefixes of ids, either end optional)"
            )
        };
        if let Some((from, to)) = s.split_once("..") {
            let end = |e: &str| -> Result<Option<String>, String> {
                if e.is_empty() {
                    Ok(None)
                } else if valid_epoch_prefix(e) {
                    Ok(Some(e.to_owned()))
                } else {
                    Err(bad("bad epoch range end in"))
                }
            };
            let (from, to) = (end(from)?, end(to)?);
            if let (Some(f), Some(t)) = (&from, &to) {
                if f > t {
                    return Err(bad("empty epoch range (FROM after TO)"));
                }
            }
            return Ok(Self::Range(from, to));
        }
        // A day (YYYYMMDD) is every epoch that started on it.
        if s.len() == 8 && valid_epoch_prefix(s) {
            return Ok(Self::Range(Some(s.to_owned()), Some(s.to_owned())));
        }
        if s.len() == 16 && valid_epoch_prefix(s) {
            Ok(Self::One(s.to_owned()))
        } else {
            Err(bad("bad epoch"))
        }
    }
}

impl EpochSel {
    fn matches(&self, id: &str) -> bool {
        match self {
            Self::Latest | Self::All | Self::Between(..) => true,
            Self::One(x) => id == x,
            Self::Range(from, to) => {
                from.as_deref().is_none_or(|f| id >= f)
                    && to.as_deref().is_none_or(|t| &id[..t.len().min(id.len())] <= t)
            }
        }
    }
}

/// `--host`: one host or all.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostSel {
    All,
    Named(String),
}

/// This machine's host name as the daemon names its directory.
// Reads /proc and /etc, not database files.
#[allow(clippy::disallowed_methods)]
pub fn this_host() -> String {
    for p in ["/proc/sys/kernel/hostname", "/etc/hostname"] {
        if let Ok(s) = std::fs::read_to_string(p) {
            let s = s.trim();
            if !s.is_empty() {
                return s.to_owned();
            }
        }
    }
    "localhost".to_owned()
}

/// Pick the host directories to report on.
pub fn select_host_dirs(
    db: &Database,
    epoch: &EpochSel,
    host: &HostSel,
) -> Result<Vec<HostDir>, ProfError> {
    let epochs = db.epochs()?;
    if epochs.is_empty() {
        return Err(ProfError::Empty(format!(
            "database {} has no epochs yet (is dcpid running with --db pointing there?)",
            db.root().display()
        )));
    }
    let chosen: Vec<EpochId> = match epoch {
        EpochSel::Latest => epochs.last().cloned().into_iter().collect(),
        EpochSel::Between(since, until) => {
            let start = |e: &EpochId| epoch_start(e.as_str()).unwrap_or(0);
            epochs
                .iter()
                .enumerate()
                .filter(|(i, e)| {
                    let end = epochs.get(i + 1).map_or(u64::MAX, start);
                    since.is_none_or(|s| end > s) && until.is_none_or(|u| start(e) < u)
                })
                .map(|(_, e)| e.clone())
                .collect()
        }
        _ => epochs.iter().filter(|e| epoch.matches(e.as_str())).cloned().collect(),
    };
    if chosen.is_empty() {
        let first = epochs.first().map(EpochId::as_str).unwrap_or_default();
        let last = epochs.last().map(EpochId::as_str).unwrap_or_default();
        let flag =
            if matches!(epoch, EpochSel::Between(..)) { "--since/--until" } else { "--epoch" };
        return Err(ProfError::Empty(format!(
            "no epoch matches {flag} in {} (it has {} epoch(s), {first} .. {last})",
            db.root().display(),
            epochs.len()
        )));
    }
    if matches!(host, HostSel::Named(h) if h.is_empty()) {
        // `--host` without a value: the user asks which hosts there are.
        let mut present: Vec<String> = Vec::new();
        for e in &chosen {
            present.extend(db.hosts(e)?);
        }
        present.sort();
        present.dedup();
        let list = if present.is_empty() { "none".to_owned() } else { present.join(", ") };
        return Err(ProfError::Usage(format!(
            "--host needs a host name or `all`; hosts with data in the selected epoch(s) of {}: \
             {list}",
            db.root().display()
        )));
    }
    let mut dirs = Vec::new();
    // Epoch directories are independent: list them in parallel (cold cache, NFS).
    for (e, hosts) in chosen.iter().zip(par_map(&chosen, |_, e| db.hosts(e))) {
        for h in hosts? {
            if let HostSel::Named(want) = host {
                if &h != want {
                    continue;
                }
            }
            dirs.push(db.host_dir(e, &h)?);
        }
    }
    if dirs.is_empty() {
        let what = match host {
            HostSel::All => "any host".to_owned(),
            HostSel::Named(h) => format!("host {h:?}"),
        };
        let epoch_desc = match epoch {
            EpochSel::Latest => format!("the latest epoch ({})", chosen[0]),
            _ => format!("{} selected epoch(s)", chosen.len()),
        };
        let mut msg = format!("{epoch_desc} of {} has no data for {what}", db.root().display());
        if let HostSel::Named(h) = host {
            let mut others: Vec<String> = Vec::new();
            for e in &chosen {
                others.extend(db.hosts(e)?);
            }
            others.sort();
            others.dedup();
            if !others.is_empty() {
                msg.push_str(&format!("; hosts there: {}; try --host all", others.join(", ")));
            }
            // Point at the newest epoch where this host does have data.
            for e in epochs.iter().rev() {
                if db.hosts(e)?.iter().any(|x| x == h) {
                    msg.push_str(&format!("; {h} last has data in epoch {e} (--epoch {e})"));
                    break;
                }
            }
        }
        return Err(ProfError::Empty(msg));
    }
    Ok(dirs)
}

/// A profile read from disk, with where it came from.
#[derive(Debug)]
pub struct LoadedProfile {
    /// The profile file, or the summary.json whose index gave its totals.
    pub path: PathBuf,
    /// Without an image filter (the per-image report) `counts` is left empty once summed:
    /// a fleet's worth of per-offset maps would otherwise all be held at once (1.6 GB for
    /// 480 000 profiles).
    pub profile: Profile,
    /// Sum of the profile's counts, taken before they may have been dropped.
    pub samples: u64,
    /// Index into [`Loaded::dirs`].
    pub dir: usize,
}

impl LoadedProfile {
    /// A profile read whole, counts kept.
    pub fn with_counts(path: PathBuf, profile: Profile, dir: usize) -> Self {
        Self::new(path, profile, dir, true)
    }

    fn new(path: PathBuf, profile: Profile, dir: usize, keep_counts: bool) -> Self {
        let mut profile = profile;
        let samples = profile.counts.values().sum();
        if !keep_counts {
            profile.counts = Default::default();
        }
        Self { path, profile, samples, dir }
    }
}

/// What every selection read besides its profiles: the host directories, their summaries,
/// what could not be read and whether the idle task was left out. One part of [`Loaded`] and
/// of [`Totals`]; both read as it (`loaded.dirs`).
#[derive(Debug, Default)]
pub struct Scanned {
    pub dirs: Vec<HostDir>,
    /// Summary per dir (same index), when readable (with a filter, only when needed; for
    /// [`Totals`], never with its index).
    pub summaries: Vec<Option<HostSummary>>,
    /// Files that could not be read (message names the file).
    pub corrupt: Vec<String>,
    /// `--no-idle` took the idle task (`[idle]`) out ([`Loaded::exclude_idle`],
    /// [`Totals::exclude_idle`]).
    pub idle_excluded: bool,
    /// `--since`/`--until`: what the time range covered (the counts are then the slices' of
    /// the range, [`super::timerange`]); `None`: whole epochs.
    pub time: Option<super::timerange::TimeCoverage>,
}

/// Everything read for a report.
#[derive(Debug, Default)]
pub struct Loaded {
    pub scan: Scanned,
    pub profiles: Vec<LoadedProfile>,
    /// With a filter: images seen but not matching (display name, samples of the file read).
    pub other_images: Vec<(String, u64)>,
}

impl std::ops::Deref for Loaded {
    type Target = Scanned;
    fn deref(&self) -> &Scanned {
        &self.scan
    }
}

impl Loaded {
    /// Drop the idle task's profiles (`--no-idle`): every total and percentage computed from
    /// what is left is then of the time the machine was busy.
    pub fn exclude_idle(&mut self) {
        self.profiles.retain(|p| !super::image::is_idle(&p.profile.header));
        self.scan.idle_excluded = true;
    }
}

/// Read one profile of host directory `dir`: every report reads a profile's counts through
/// here, so that how a host directory stores a profile is decided in one place.
pub fn read_profile(dir: &HostDir, e: &ProfileEntry) -> Result<Profile, profile_format::Error> {
    let _ = dir;
    stats::count(&stats::PROFILES_READ);
    Profile::read(&e.path)
}

/// The header of one profile of host directory `dir` ([`Profile::read_header`]: its counts
/// are not read): what deciding whether it is the image a report asks for needs.
pub fn read_profile_header(
    dir: &HostDir,
    e: &ProfileEntry,
) -> Result<ProfileHeader, profile_format::Error> {
    let _ = dir;
    stats::count(&stats::PROFILES_READ);
    Profile::read_header(&e.path)
}

/// The entry of the profile an index entry (header) stands for, without listing `d`.
fn indexed_entry(d: &HostDir, h: &ProfileHeader) -> ProfileEntry {
    let (path, image_id) = match h.kind {
        ImageKind::Unknown => (d.unknown_path(&h.event.name), None),
        _ => (d.profile_path(&h.image_id, &h.event.name), Some(h.image_id.clone())),
    };
    let event_component = profile_format::event_file_component(&h.event.name);
    ProfileEntry { path, image_id, event_component }
}

/// Read profile files in parallel (as every load does), in the order given.
pub fn par_read(files: &[(usize, PathBuf)]) -> Vec<Result<Profile, profile_format::Error>> {
    par_map(files, |_, (_, p)| Profile::read(p))
}

/// How many files a report reads at once: reads are mostly waiting (disk queue, NFS round
/// trips), so many more than the CPUs. `DCPI_IO_THREADS` overrides it (1: one at a time).
pub fn io_threads() -> usize {
    std::env::var("DCPI_IO_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(32)
        .min(256)
}

/// Read the profiles of `dirs` (with their summaries). Unreadable files are collected in
/// [`Loaded::corrupt`] (the caller decides whether that fails the run).
///
/// With a `filter` (per-symbol report) only the files of the chosen image are read: those the
/// file name (image id) decides directly, and otherwise one file per distinct image identity to
/// learn its kind and path (its header only: [`Profile::read_header`]); the other files of a
/// non-matching identity are never opened. Over a week of epochs from many hosts that is one
/// header read per distinct image plus the image's own files.
pub fn load(
    dirs: Vec<HostDir>,
    filter: Option<&ImageFilter>,
    warn: &mut dyn FnMut(String),
) -> Result<Loaded, ProfError> {
    if filter.is_none() {
        return load_totals(dirs, warn);
    }
    load_counts(dirs, filter, true, warn)
}

/// As [`load`], reading the profiles themselves even without a filter, and keeping their
/// per-offset counts when `keep_counts` (reports across all images at offset granularity,
/// e.g. `dcpilist --top`, `dcpiprof --symbols` and the exports).
pub fn load_counts(
    dirs: Vec<HostDir>,
    filter: Option<&ImageFilter>,
    keep_counts: bool,
    warn: &mut dyn FnMut(String),
) -> Result<Loaded, ProfError> {
    let mut out = Loaded::default();
    // Host facts already read from a summary.idx, per dir.
    let mut facts: Vec<Option<HostSummary>> = Vec::new();
    facts.resize_with(dirs.len(), || None);
    let push = |out: &mut Loaded, dir: usize, path: PathBuf, r: Result<Profile, _>| match r {
        Ok(profile) => out.profiles.push(LoadedProfile::new(path, profile, dir, keep_counts)),
        Err(e) => out.scan.corrupt.push(format!("{e}")),
    };
    match filter {
        None => {
            let mut entries: Vec<(usize, ProfileEntry)> = Vec::new();
            for (i, listed) in par_map(&dirs, |_, d| d.profiles()).into_iter().enumerate() {
                for e in listed? {
                    stats::count(&stats::PROFILES_LISTED);
                    entries.push((i, e));
                }
            }
            // Files are independent: read them in parallel, keep the listing's order.
            let read = par_map(&entries, |_, (i, e)| read_profile(&dirs[*i], e));
            for ((dir, e), r) in entries.into_iter().zip(read) {
                push(&mut out, dir, e.path, r);
            }
        }
        Some(f) => {
            // Closed epochs: the files come from summary.idx, which also says what each holds,
            // so a file of another image is never opened nor its directory listed. The
            // newest epoch is listed: its index may trail the files published since (FORMAT.md
            // §7.1).
            let newest = match dirs.first() {
                Some(d) => Database::open(&d.db_root())?.epochs()?.pop(),
                None => None,
            };
            let (headers, per_dir) = par_interned(&dirs, |d, interner| {
                if Some(&d.epoch) != newest.as_ref() {
                    if let Some((facts, v)) = indexed_files(d, interner)? {
                        return Ok((Some(facts), v));
                    }
                }
                d.profiles().map(|v| {
                    let v = v
                        .into_iter()
                        .map(|e| {
                            stats::count(&stats::PROFILES_LISTED);
                            File::Listed(e)
                        })
                        .collect();
                    (None, v)
                })
            });
            let mut entries: Vec<(usize, File)> = Vec::new();
            for (i, (r, map)) in per_dir.into_iter().enumerate() {
                let (f, files) = r?;
                facts[i] = f;
                for e in files {
                    entries.push((
                        i,
                        match e {
                            File::Indexed(h, n) => File::Indexed(map[h as usize], n),
                            listed => listed,
                        },
                    ));
                }
            }
            let mut names = NameVerdicts::new(f, &headers);
            let any_by_name = entries.iter().any(|(_, e)| names.get(e) == Some(true));
            let fallback;
            let f = match f.as_name() {
                Some(named) if !any_by_name => {
                    fallback = named;
                    &fallback
                }
                _ => f,
            };
            let mut names = NameVerdicts::new(f, &headers);
            let entry_of = |dir: usize, e: &File| -> ProfileEntry {
                match e {
                    File::Listed(e) => e.clone(),
                    File::Indexed(h, _) => indexed_entry(&dirs[dir], &headers[*h as usize]),
                }
            };
            let mut direct: Vec<(usize, ProfileEntry)> = Vec::new();
            let mut group_of_header: Vec<Option<usize>> = vec![None; headers.len()];
            let mut group_of_id: BTreeMap<ImageId, usize> = BTreeMap::new();
            let mut groups: Vec<Vec<(usize, File)>> = Vec::new();
            for (dir, e) in entries {
                match names.get(&e) {
                    Some(true) => direct.push((dir, entry_of(dir, &e))),
                    Some(false) => {}
                    None => {
                        let id = match &e {
                            File::Listed(l) => l.image_id.as_ref(),
                            File::Indexed(h, _) => Some(&headers[*h as usize].image_id),
                        };
                        let Some(id) = id else { continue };
                        let g = match &e {
                            File::Indexed(h, _) => group_of_header[*h as usize],
                            File::Listed(_) => None,
                        };
                        let g = g.unwrap_or_else(|| {
                            *group_of_id.entry(id.clone()).or_insert_with(|| {
                                groups.push(Vec::new());
                                groups.len() - 1
                            })
                        });
                        if let File::Indexed(h, _) = &e {
                            group_of_header[*h as usize] = Some(g);
                        }
                        groups[g].push((dir, e));
                    }
                }
            }
            // Files are independent: read them in parallel, keep the sequential order.
            let read = par_map(&direct, |_, (dir, e)| read_profile(&dirs[*dir], e));
            for ((dir, e), r) in direct.into_iter().zip(read) {
                push(&mut out, dir, e.path, r);
            }
            // Groups in the order of their image ids, as a listing-only load has them.
            let groups: Vec<Vec<(usize, File)>> = {
                let mut slots: Vec<Option<Vec<(usize, File)>>> =
                    groups.into_iter().map(Some).collect();
                group_of_id.into_values().filter_map(|g| slots[g].take()).collect()
            };
            // The first readable file of each identity decides whether it is the image (its
            // index entry, when it has one: then no file of another image is opened).
            let decided = par_map(&groups, |_, files| {
                let mut corrupt = Vec::new();
                if let Some((dir, File::Indexed(h, samples))) = files.first() {
                    let h = &headers[*h as usize];
                    if f.rank(h).is_none() {
                        let profile = Profile {
                            header: h.clone(),
                            who: None,
                            counts: Default::default(),
                            sole: false,
                        };
                        let path = entry_of(*dir, &files[0].1).path;
                        let p = LoadedProfile { path, profile, samples: *samples, dir: *dir };
                        return (corrupt, Some((0, p, None)));
                    }
                }
                for (k, (dir, e)) in files.iter().enumerate() {
                    let e = entry_of(*dir, e);
                    // The header decides; only a file of a matching image is read whole (the
                    // current epoch's files of every other image used to be: 0.5-0.7 s of a
                    // per-symbol report on the bench's day, BENCHMARKS.md "Time-slice queries").
                    let header = match read_profile_header(&dirs[*dir], &e) {
                        Ok(h) => h,
                        Err(err) => {
                            corrupt.push(format!("{err}"));
                            continue;
                        }
                    };
                    if f.rank(&header).is_none() {
                        let samples = header.total_samples;
                        let profile =
                            Profile { header, who: None, counts: Default::default(), sole: false };
                        let p = LoadedProfile { path: e.path, profile, samples, dir: *dir };
                        return (corrupt, Some((k, p, None)));
                    }
                    // Counted once, with its header (the stats count files read).
                    match Profile::read(&e.path) {
                        Ok(profile) => {
                            let p = LoadedProfile::new(e.path, profile, *dir, true);
                            let rank = f.rank(&p.profile.header);
                            return (corrupt, Some((k, p, rank)));
                        }
                        Err(e) => corrupt.push(format!("{e}")),
                    }
                }
                (corrupt, None)
            });
            // Only the best match is the image: an exact basename beats prefixes and substrings,
            // whose files are then not read beyond the first.
            let best = decided.iter().filter_map(|(_, d)| d.as_ref().and_then(|d| d.2)).min();
            let decided: Vec<_> = decided
                .into_iter()
                .map(|(c, d)| (c, d.map(|(k, p, r)| (k, p, r.is_some() && r == best))))
                .collect();
            let mut rest: Vec<(usize, ProfileEntry)> = Vec::new();
            for (files, (_, d)) in groups.iter().zip(&decided) {
                if let Some((k, _, true)) = d {
                    rest.extend(files[k + 1..].iter().map(|(dir, e)| (*dir, entry_of(*dir, e))));
                }
            }
            let mut rest_read =
                par_map(&rest, |_, (dir, e)| read_profile(&dirs[*dir], e)).into_iter();
            let mut rest = rest.into_iter();
            for (files, (corrupt, d)) in groups.iter().zip(decided) {
                out.scan.corrupt.extend(corrupt);
                match d {
                    Some((k, p, true)) => {
                        out.profiles.push(p);
                        for _ in k + 1..files.len() {
                            if let (Some((dir, e)), Some(r)) = (rest.next(), rest_read.next()) {
                                push(&mut out, dir, e.path, r);
                            }
                        }
                    }
                    Some((_, p, false)) => {
                        out.other_images.push((image_display(&p.profile.header), p.samples))
                    }
                    None => {}
                }
            }
        }
    }
    let mut needed = vec![filter.is_none(); dirs.len()];
    for p in &out.profiles {
        needed[p.dir] = true;
    }
    let read = par_map(&dirs, |i, d| {
        if !needed[i] {
            return None;
        }
        if let Some(f) = &facts[i] {
            return Some(Ok(f.clone()));
        }
        match HostSummary::read_facts(&d.summary_path()) {
            Err(profile_format::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                None
            }
            r => Some(r),
        }
    });
    for r in read {
        let summary = match r {
            Some(Ok(s)) => Some(s),
            // A planted FIFO, device, link or oversized file: refused, not skipped (issue 34).
            Some(Err(e)) if e.is_hostile_file() => return Err(e.into()),
            Some(Err(e)) => {
                warn(format!("{e} (multiplexing scale unknown for this host/epoch)"));
                None
            }
            None => None,
        };
        out.scan.summaries.push(summary);
    }
    out.scan.dirs = dirs;
    Ok(out)
}

/// A profile file of a per-symbol load: listed, or named by the index (header number in the
/// load's interner, samples).
enum File {
    Listed(ProfileEntry),
    Indexed(u32, u64),
}

/// What the file name says of each file for a filter ([`ImageFilter::by_name`]), computed once
/// per distinct header of the indexes.
struct NameVerdicts<'a> {
    f: &'a ImageFilter,
    headers: &'a [ProfileHeader],
    cache: Vec<Option<Option<bool>>>,
}

impl<'a> NameVerdicts<'a> {
    fn new(f: &'a ImageFilter, headers: &'a [ProfileHeader]) -> Self {
        NameVerdicts { f, headers, cache: vec![None; headers.len()] }
    }
    fn get(&mut self, e: &File) -> Option<bool> {
        match e {
            File::Listed(e) => self.f.by_name(e.image_id.as_ref()),
            File::Indexed(h, _) => {
                let (f, headers) = (self.f, self.headers);
                *self.cache[*h as usize].get_or_insert_with(|| {
                    let h = &headers[*h as usize];
                    // The unknown profile's file name carries no id.
                    f.by_name((h.kind != ImageKind::Unknown).then_some(&h.image_id))
                })
            }
        }
    }
}

/// The host facts and the profile files of `d` as its `summary.idx` names them, in file-name
/// order; `None` without a usable index; an error if it is a hostile file (FIFO, device,
/// link, oversized: [`profile_format::Error::is_hostile_file`]).
fn indexed_files(
    d: &HostDir,
    interner: &mut Interner,
) -> profile_format::Result<Option<(HostSummary, Vec<File>)>> {
    let ip = d.summary_index_path();
    let bytes = match sumidx::read_bytes(&ip) {
        Ok(b) => b,
        Err(e) if e.is_hostile_file() => return Err(e),
        Err(e) => {
            tracing::debug!(index = %ip.display(), error = %e, "summary index unreadable; listing the directory");
            return Ok(None);
        }
    };
    let v = match sumidx::decode(&bytes, &ip) {
        Ok(v) => v,
        Err(e) => {
            tracing::debug!(index = %ip.display(), error = %e, "summary index unusable; listing the directory");
            return Ok(None);
        }
    };
    stats::count(&stats::SUMMARY_INDEXES_USED);
    let mut out = Vec::with_capacity(v.entries.len());
    for e in &v.entries {
        let h = interner.intern_entry(d, &v.events[e.event as usize], e);
        out.push(File::Indexed(h, e.samples));
    }
    Ok(Some((v.facts, out)))
}

/// A worker's header numbers to the merged ones (shared by the dirs that worker read).
type HeaderMap = std::sync::Arc<Vec<u32>>;

/// `f` over `dirs` on a few threads, each with its own [`Interner`]; returns the merged headers
/// and, per dir in order, `f`'s result with the map from its worker's header numbers to the
/// merged ones.
fn par_interned<'a, R: Send>(
    dirs: &'a [HostDir],
    f: impl Fn(&'a HostDir, &mut Interner) -> R + Sync,
) -> (Vec<ProfileHeader>, Vec<(R, HeaderMap)>) {
    let threads = io_threads().min(dirs.len().max(1));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers: Vec<(Interner, Vec<(usize, R)>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut interner = Interner::default();
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(d) = dirs.get(i) else { break };
                        done.push((i, f(d, &mut interner)));
                    }
                    (interner, done)
                })
            })
            .collect();
        handles
            .into_iter()
            // A worker only panics if this code has a bug; surface it rather than hide it.
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut global = Interner::default();
    let mut per_dir: Vec<Option<(R, HeaderMap)>> = Vec::new();
    per_dir.resize_with(dirs.len(), || None);
    for (interner, done) in workers {
        let map: Vec<u32> = interner.headers.iter().map(|h| global.intern_header(h)).collect();
        let map = std::sync::Arc::new(map);
        for (i, r) in done {
            per_dir[i] = Some((r, std::sync::Arc::clone(&map)));
        }
    }
    (global.headers, per_dir.into_iter().flatten().collect())
}

/// What one host directory contributes to a per-image report.
#[derive(Default)]
struct DirTotals {
    summary: Option<HostSummary>,
    profiles: Vec<LoadedProfile>,
    corrupt: Vec<String>,
    warning: Option<String>,
}

/// The per-image load: the totals of each host directory from its summary index (one small
/// file), or, where the summary has no usable index (databases written before it existed),
/// from its profiles. Either way the profiles come in file-name order with the same headers
/// and sums, so the report is identical. Directories are independent and read by a few
/// threads: on NFS the latency of one file hides behind the others.
fn load_totals(dirs: Vec<HostDir>, warn: &mut dyn FnMut(String)) -> Result<Loaded, ProfError> {
    let results = par_map(&dirs, |i, d| dir_totals(d, i, true));
    let mut out = Loaded::default();
    out.profiles.reserve(results.iter().map(|r| r.as_ref().map_or(0, |t| t.profiles.len())).sum());
    for r in results {
        let t = r?;
        out.profiles.extend(t.profiles);
        out.scan.corrupt.extend(t.corrupt);
        out.scan.summaries.push(t.summary);
        if let Some(w) = t.warning {
            warn(w);
        }
    }
    out.scan.dirs = dirs;
    Ok(out)
}

/// The per-image report's input: every profile's totals, without a header per profile.
#[derive(Debug, Default)]
pub struct Totals {
    pub scan: Scanned,
    /// Distinct (kind, image id, path, event) of the profiles; host, epoch and totals are
    /// those of one of them and mean nothing here.
    pub headers: Vec<ProfileHeader>,
    /// One per profile, dirs in order, each dir's profiles in file-name order.
    pub entries: Vec<TotalEntry>,
}

impl std::ops::Deref for Totals {
    type Target = Scanned;
    fn deref(&self) -> &Scanned {
        &self.scan
    }
}

/// One profile's totals in [`Totals`].
#[derive(Clone, Copy, Debug)]
pub struct TotalEntry {
    pub dir: u32,
    /// Index into [`Totals::headers`].
    pub header: u32,
    /// Sum of the counts.
    pub samples: u64,
    pub total_samples: u64,
    pub total_period: u64,
}

/// What weighting and the per-image report need of one profile.
#[derive(Clone, Copy, Debug)]
pub struct TotalRow<'a> {
    /// Index into the loaded dirs (and summaries).
    pub dir: usize,
    /// Kind, id, path and event of the profile (its totals are the fields below).
    pub header: &'a ProfileHeader,
    /// Rows of one group have the same kind, id, path and event: the per-image report finds a
    /// group's row once instead of hashing every profile's key.
    pub group: usize,
    /// Sum of the counts.
    pub samples: u64,
    pub total_samples: u64,
    pub total_period: u64,
}

impl Totals {
    /// Drop the idle task's entries (`--no-idle`), as [`Loaded::exclude_idle`] does.
    pub fn exclude_idle(&mut self) {
        let headers = &self.headers;
        self.entries.retain(|e| !super::image::is_idle(&headers[e.header as usize]));
        self.scan.idle_excluded = true;
    }

    pub fn rows(&self) -> impl Iterator<Item = TotalRow<'_>> + Clone {
        self.entries.iter().map(|e| TotalRow {
            dir: e.dir as usize,
            header: &self.headers[e.header as usize],
            group: e.header as usize,
            samples: e.samples,
            total_samples: e.total_samples,
            total_period: e.total_period,
        })
    }
}

/// Distinct headers by their bytes (kind, id, path, event), so that a fleet's 480,000 index
/// entries become a few hundred headers.
#[derive(Default)]
struct Interner {
    ids: HashMap<Vec<u8>, u32>,
    headers: Vec<ProfileHeader>,
    key: Vec<u8>,
}

impl Interner {
    fn key(key: &mut Vec<u8>, event: &EventDesc, kind: ImageKind, id: ImageIdRef, path: &[u8]) {
        key.clear();
        key.extend_from_slice(&(event.name.len() as u64).to_le_bytes());
        key.extend_from_slice(event.name.as_bytes());
        for v in [
            u64::from(event.perf_type),
            event.perf_config,
            event.period_mean,
            event.period_min,
            event.period_max,
        ] {
            key.extend_from_slice(&v.to_le_bytes());
        }
        let (tag, id) = id.tag_and_bytes();
        key.extend_from_slice(&[kind as u8, tag, id.len() as u8]);
        key.extend_from_slice(id);
        key.extend_from_slice(path);
    }

    /// The header's number; `make` builds it the first time.
    fn intern(
        &mut self,
        event: &EventDesc,
        kind: ImageKind,
        id: ImageIdRef,
        path: &[u8],
        make: impl FnOnce() -> ProfileHeader,
    ) -> u32 {
        Self::key(&mut self.key, event, kind, id, path);
        if let Some(&i) = self.ids.get(self.key.as_slice()) {
            return i;
        }
        let i = self.headers.len() as u32;
        self.headers.push(make());
        self.ids.insert(self.key.clone(), i);
        i
    }

    /// An index entry's header number (host, epoch and totals of the first one seen).
    fn intern_entry(&mut self, d: &HostDir, event: &EventDesc, e: &sumidx::IndexEntry) -> u32 {
        self.intern(event, e.kind, e.id, e.path, || entry_header(d, event, e))
    }

    fn intern_header(&mut self, h: &ProfileHeader) -> u32 {
        let id = match &h.image_id {
            ImageId::BuildId(b) => ImageIdRef::BuildId(b),
            ImageId::Fallback(f) => ImageIdRef::Fallback(f),
        };
        self.intern(&h.event, h.kind, id, &h.image_path, || ProfileHeader {
            jit_symbols: Vec::new(),
            ..h.clone()
        })
    }
}

/// What one host directory contributes to [`Totals`]; header numbers are the worker's own.
#[derive(Default)]
struct DirEntries {
    summary: Option<HostSummary>,
    entries: Vec<TotalEntry>,
    corrupt: Vec<String>,
    warning: Option<String>,
}

/// The per-image load: the totals of each host directory from its binary summary index
/// (`summary.idx`, one small file), else from the JSON index of `summary.json`, else from its
/// profiles (databases written before either existed). The entries and their order are the
/// same either way, so the report is identical. Directories are read by a few threads (on NFS
/// the latency of one file hides behind the others), each interning headers on its own; the
/// merge in directory order then only renumbers.
pub fn load_image_totals(
    dirs: Vec<HostDir>,
    warn: &mut dyn FnMut(String),
) -> Result<Totals, ProfError> {
    let (headers, per_dir) = par_interned(&dirs, |d, interner| {
        // Dirs are numbered by the caller below; 0 here, fixed when merged.
        dir_entries(d, 0, interner)
    });
    let mut out = Totals::default();
    for (i, (r, map)) in per_dir.into_iter().enumerate() {
        let t = r?;
        out.entries.extend(t.entries.into_iter().map(|e| TotalEntry {
            dir: i as u32,
            header: map[e.header as usize],
            ..e
        }));
        out.scan.corrupt.extend(t.corrupt);
        out.scan.summaries.push(t.summary);
        if let Some(w) = t.warning {
            warn(w);
        }
    }
    out.headers = headers;
    out.scan.dirs = dirs;
    Ok(out)
}

fn dir_entries(d: &HostDir, dir: usize, interner: &mut Interner) -> Result<DirEntries, ProfError> {
    let ip = d.summary_index_path();
    match sumidx::read_bytes(&ip) {
        Ok(bytes) => match sumidx::decode(&bytes, &ip) {
            Ok(v) => {
                stats::count(&stats::SUMMARY_INDEXES_USED);
                let mut t = DirEntries { summary: Some(v.facts), ..Default::default() };
                t.entries.reserve(v.entries.len());
                for e in &v.entries {
                    let header = interner.intern_entry(d, &v.events[e.event as usize], e);
                    t.entries.push(TotalEntry {
                        dir: dir as u32,
                        header,
                        samples: e.samples,
                        total_samples: e.samples,
                        total_period: e.period,
                    });
                }
                return Ok(t);
            }
            Err(e) => {
                tracing::debug!(index = %ip.display(), error = %e, "summary index unusable; reading summary.json");
            }
        },
        Err(profile_format::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound => {}
        // A planted FIFO, device, link or oversized file: refused, not skipped (issue 34).
        Err(e) if e.is_hostile_file() => return Err(e.into()),
        Err(e) => {
            tracing::debug!(index = %ip.display(), error = %e, "summary index unreadable; reading summary.json");
        }
    }
    let t = dir_totals(d, dir, false)?;
    Ok(DirEntries {
        summary: t.summary,
        entries: t
            .profiles
            .iter()
            .map(|p| TotalEntry {
                dir: dir as u32,
                header: interner.intern_header(&p.profile.header),
                samples: p.samples,
                total_samples: p.profile.header.total_samples,
                total_period: p.profile.header.total_period,
            })
            .collect(),
        corrupt: t.corrupt,
        warning: t.warning,
    })
}

/// `f` over `items` on a few threads, results in the order of `items`. The work is file reads:
/// more threads than CPUs keep several requests in flight (NFS latency, disk queue).
pub fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(usize, &T) -> R + Sync) -> Vec<R> {
    let threads = io_threads().min(items.len());
    if threads <= 1 {
        return items.iter().enumerate().map(|(i, t)| f(i, t)).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut results: Vec<Option<R>> = Vec::new();
    results.resize_with(items.len(), || None);
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(t) = items.get(i) else { break };
                        done.push((i, f(i, t)));
                    }
                    done
                })
            })
            .collect();
        for w in workers {
            // A worker only panics if this code has a bug; surface it rather than hide it.
            for (i, r) in w.join().unwrap_or_else(|p| std::panic::resume_unwind(p)) {
                results[i] = Some(r);
            }
        }
    });
    results.into_iter().flatten().collect()
}

/// The header of the profile a `summary.idx` entry of host directory `d` stands for (no
/// counts, no JIT symbols: the index has the totals only).
fn entry_header(d: &HostDir, event: &EventDesc, e: &sumidx::IndexEntry) -> ProfileHeader {
    ProfileHeader {
        kind: e.kind,
        image_id: e.id.to_owned_id(),
        image_path: e.path.to_vec(),
        event: event.clone(),
        host: d.host.clone(),
        epoch: d.epoch.clone(),
        total_samples: e.samples,
        total_period: e.period,
        sequence: 0,
        jit_symbols: Vec::new(),
    }
}

/// The totals of one host directory as loaded profiles without counts: from its
/// `summary.idx` when `use_idx` and it is usable, else from the JSON index of its
/// `summary.json`, else from its profiles.
fn dir_totals(d: &HostDir, dir: usize, use_idx: bool) -> Result<DirTotals, ProfError> {
    let mut t = DirTotals::default();
    if use_idx {
        let ip = d.summary_index_path();
        let read = match sumidx::read_bytes(&ip) {
            Err(e) if e.is_hostile_file() => return Err(e.into()),
            r => r.ok(),
        };
        if let Some(bytes) = read {
            match sumidx::decode(&bytes, &ip) {
                Ok(v) => {
                    stats::count(&stats::SUMMARY_INDEXES_USED);
                    t.profiles.reserve(v.entries.len());
                    for e in &v.entries {
                        let header = entry_header(d, &v.events[e.event as usize], e);
                        let profile =
                            Profile { header, who: None, counts: Default::default(), sole: false };
                        let path = ip.clone();
                        t.profiles.push(LoadedProfile { path, profile, samples: e.samples, dir });
                    }
                    t.summary = Some(v.facts);
                    return Ok(t);
                }
                Err(e) => {
                    tracing::debug!(index = %ip.display(), error = %e, "summary index unusable; reading summary.json");
                }
            }
        }
    }
    let sp = d.summary_path();
    match HostSummary::read(&sp) {
        Ok(s) => t.summary = Some(s),
        Err(profile_format::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) if e.is_hostile_file() => return Err(e.into()),
        Err(e) => t.warning = Some(format!("{e} (multiplexing scale unknown for this host/epoch)")),
    }
    if let Some(idx) = t.summary.as_mut().and_then(|s| s.index.take()) {
        let headers: Result<Vec<_>, _> =
            idx.images.iter().map(|e| e.header(&idx, &d.host, &d.epoch)).collect();
        match headers {
            Ok(headers) => {
                stats::count(&stats::SUMMARY_INDEXES_USED);
                t.profiles.reserve(headers.len());
                for h in headers {
                    // Where the numbers came from (naming each profile would cost more than
                    // reading the index).
                    let path = sp.clone();
                    let samples = h.total_samples;
                    let profile =
                        Profile { header: h, who: None, counts: Default::default(), sole: false };
                    t.profiles.push(LoadedProfile { path, profile, samples, dir });
                }
                return Ok(t);
            }
            Err(e) => {
                tracing::debug!(summary = %sp.display(), error = %e, "summary index unusable; reading the profiles");
            }
        }
    }
    for e in d.profiles()? {
        stats::count(&stats::PROFILES_LISTED);
        match read_profile(d, &e) {
            Ok(p) => t.profiles.push(LoadedProfile::new(e.path, p, dir, false)),
            Err(err) => t.corrupt.push(format!("{err}")),
        }
    }
    Ok(t)
}

/// `[start, end)` of each epoch of `dirs` (end: the next epoch's start; `u64::MAX` for the
/// newest).
fn epoch_spans(dirs: &[HostDir]) -> Result<Vec<(u64, u64)>, ProfError> {
    let Some(first) = dirs.first() else { return Ok(Vec::new()) };
    let epochs = Database::open(&first.db_root())?.epochs()?;
    Ok(dirs
        .iter()
        .map(|d| {
            let start = epoch_start(d.epoch.as_str()).unwrap_or(0);
            let next = epochs.iter().find(|e| e.as_str() > d.epoch.as_str());
            let end = next.and_then(|e| epoch_start(e.as_str())).unwrap_or(u64::MAX);
            (start, end)
        })
        .collect())
}

/// Every directory's slices of `r` ([`DirRange`]), read in parallel, and their coverage.
pub fn range_of_dirs(
    dirs: &[HostDir],
    r: TimeRange,
) -> Result<(Vec<DirRange>, TimeCoverage), ProfError> {
    range_of_dirs_as(dirs, r, false)
}

/// [`range_of_dirs`] with each key's total only (`totals`): what per-image totals need, read
/// without decoding offsets ([`profile_format::SliceLog::read_totals`]).
fn range_of_dirs_as(
    dirs: &[HostDir],
    r: TimeRange,
    totals: bool,
) -> Result<(Vec<DirRange>, TimeCoverage), ProfError> {
    let spans = epoch_spans(dirs)?;
    let read = par_map(dirs, |i, d| {
        if totals {
            DirRange::read_totals(d, r, spans[i])
        } else {
            DirRange::read(d, r, spans[i])
        }
    });
    let ranges = read.into_iter().collect::<Result<Vec<_>, _>>()?;
    let names: Vec<String> = dirs.iter().map(|d| format!("{}/{}", d.epoch, d.host)).collect();
    let cov = coverage(r, &ranges, &names);
    Ok((ranges, cov))
}

/// Restrict loaded profiles to the time range `r` (`--since`/`--until`, issue 36): each
/// profile's counts become the sum, offset by offset, of its host directory's time slices in
/// the range for its key (event, image id); profiles loaded without counts get that sum only.
/// Profiles left without samples are dropped; directories without slices are handled as
/// [`DirRange::read`] says. The coverage goes to [`Scanned::time`] (report headers).
pub fn restrict_loaded(
    loaded: &mut Loaded,
    r: TimeRange,
    warn: &mut dyn FnMut(String),
) -> Result<(), ProfError> {
    // Only the loaded profiles' keys are read (with an image filter, that image's).
    let mut keys: Vec<std::collections::HashSet<SliceKey>> =
        vec![Default::default(); loaded.scan.dirs.len()];
    for p in &loaded.profiles {
        keys[p.dir].insert(slice_key(&p.profile.header));
    }
    let spans = epoch_spans(&loaded.scan.dirs)?;
    let read = par_map(&loaded.scan.dirs, |i, d| {
        DirRange::read_keys(d, r, spans[i], &|k| keys[i].contains(k))
    });
    let ranges = read.into_iter().collect::<Result<Vec<_>, _>>()?;
    let names: Vec<String> =
        loaded.scan.dirs.iter().map(|d| format!("{}/{}", d.epoch, d.host)).collect();
    let cov = coverage(r, &ranges, &names);
    let mut per_dir = ranges;
    // Slices at a coarser offset resolution are placed on the epoch profile's offsets: a key
    // split over continuation files is placed on all of them (the first file takes the range).
    let mut n_of: HashMap<(usize, SliceKey), usize> = HashMap::new();
    for p in &loaded.profiles {
        *n_of.entry((p.dir, slice_key(&p.profile.header))).or_default() += 1;
    }
    let mut merged: HashMap<(usize, SliceKey), BTreeMap<u64, u64>> = HashMap::new();
    for p in &loaded.profiles {
        let k = (p.dir, slice_key(&p.profile.header));
        if n_of[&k] > 1 {
            let m = merged.entry(k).or_default();
            for (&o, &c) in &p.profile.counts {
                *m.entry(o).or_default() += c;
            }
        }
    }
    for p in &mut loaded.profiles {
        let key = slice_key(&p.profile.header);
        let reference = merged.get(&(p.dir, key.clone())).unwrap_or(&p.profile.counts);
        let Some(pairs) = per_dir[p.dir].take(&key, reference) else { continue };
        let samples = slice_sum(&pairs);
        if !p.profile.counts.is_empty() {
            p.profile.counts = pairs.into_iter().collect();
        }
        p.samples = samples;
        let h = &mut p.profile.header;
        (h.total_samples, h.total_period) = rescale(h.total_samples, h.total_period, samples);
    }
    loaded.profiles.retain(|p| p.samples > 0);
    if let Some(w) = left_out_warning(&cov) {
        warn(w);
    }
    loaded.scan.time = Some(cov);
    Ok(())
}

/// [`restrict_loaded`] for the per-image report's totals.
pub fn restrict_totals(
    t: &mut Totals,
    r: TimeRange,
    warn: &mut dyn FnMut(String),
) -> Result<(), ProfError> {
    let (mut per_dir, cov) = range_of_dirs_as(&t.scan.dirs, r, true)?;
    for e in &mut t.entries {
        let key = slice_key(&t.headers[e.header as usize]);
        let Some(samples) = per_dir[e.dir as usize].take_total(&key) else { continue };
        (e.total_samples, e.total_period) = rescale(e.total_samples, e.total_period, samples);
        e.samples = samples;
    }
    t.entries.retain(|e| e.samples > 0);
    if let Some(w) = left_out_warning(&cov) {
        warn(w);
    }
    t.scan.time = Some(cov);
    Ok(())
}

/// What the freshness merge (FORMAT.md §7.3) adds to one host directory of the current epoch:
/// per key, the counts of the slices after the mark its profile is stamped with (all its
/// slices when it has no profile yet), and a header for each key that has no profile.
#[derive(Default)]
struct FreshDir {
    extra: BTreeMap<SliceKey, Extra>,
    /// Keys without a profile: the header they are reported under.
    headers: BTreeMap<SliceKey, ProfileHeader>,
    /// Keys whose profile this merge read (not given by the caller): its header, whose totals
    /// are those the stamp stands for (a summary index may be older than the file).
    published: BTreeMap<SliceKey, ProfileHeader>,
    /// Coarsest offset resolution (bytes) of the slices added.
    resolution: u64,
}

/// What the freshness merge adds to one key: its samples, and (when asked for) their
/// (offset, count) pairs.
#[derive(Default)]
struct Extra {
    samples: u64,
    pairs: Vec<(u64, u64)>,
}

/// What the freshness merge added to a report ([`freshen_loaded`], [`freshen_totals`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Freshened {
    /// Samples taken from time slices.
    pub samples: u64,
    /// Coarsest offset resolution (bytes) of those slices' counts (1: exact): offsets are
    /// rounded down to it, so per-image and per-symbol counts are exact, except a block that
    /// straddles a symbol's start, while per-instruction counts are not.
    pub resolution: u64,
}

/// The freshness merge of `d` (newest epoch): `None` when it has no slices. `known` gives the
/// stamp (`sequence`) of the profiles the caller loaded; the others are read when `read_rest`,
/// else left as they are. A key with no profile file gets all its slices (nothing of it was
/// published, whatever daemon wrote the directory); a key with one gets the slices after the
/// mark its stamp names, if any; a key with two files (§3.1) nothing. Profiles are listed and
/// read before the summary and the slices: a mark is written before any profile is stamped
/// with it, so every stamp read is found.
fn fresh_dir(
    d: &HostDir,
    db: &Database,
    epochs: &[EpochId],
    known: &BTreeMap<SliceKey, u64>,
    read_rest: bool,
    pairs: bool,
) -> Result<Option<FreshDir>, ProfError> {
    // No slice log (slices off, an older daemon): nothing to merge, nothing to list. One
    // created after this look is simply not merged by this report.
    if !d.has_slices()? {
        return Ok(None);
    }
    // Profile files per (image, event file-name component).
    let mut files: BTreeMap<(Option<ImageId>, String), Vec<ProfileEntry>> = BTreeMap::new();
    for e in d.profiles()? {
        stats::count(&stats::PROFILES_LISTED);
        files.entry((e.image_id.clone(), e.event_component.clone())).or_default().push(e);
    }
    let summary = match HostSummary::read(&d.summary_path()) {
        Ok(s) => Some(s),
        Err(e) if e.is_hostile_file() => return Err(e.into()),
        Err(_) => None,
    };
    // Each slice's totals per key (version 3 reads them without the pairs, FORMAT.md §14.2);
    // pairs are decoded below only for the slices and keys the merge adds.
    let Some(ix) = d.read_slice_index_in(None, None)? else { return Ok(None) };
    let log = &ix.totals;
    let marks: HashMap<u64, u64> =
        summary.iter().flat_map(|s| s.fresh.iter()).map(|m| (m.sequence, m.slice_end)).collect();
    // Per starting point: whether a slice straddles it (a roll-up merged slices across it:
    // not exact, left out) and the coarsest resolution of the slices starting at or after it.
    let mut starts: BTreeMap<u64, Option<u64>> = BTreeMap::new();
    let mut from_point = |t: u64| -> Option<u64> {
        *starts.entry(t).or_insert_with(|| {
            if log.slices.iter().any(|s| s.start < t && s.end() > t) {
                return None;
            }
            Some(
                log.slices
                    .iter()
                    .filter(|s| s.start >= t)
                    .map(|s| log.resolution_of(s))
                    .fold(1, u64::max),
            )
        })
    };
    // Each key's counts are taken only from where it needs them (usually the newest mark:
    // the last minutes; none at all for a key whose profile no mark stamps). Decoding every
    // pair of the day first, as this did, cost 3-5 s for a per-image report of one host's day
    // of minutes (BENCHMARKS.md "Queries", issue 36) that added nothing.
    let mut used = vec![false; log.keys.len()];
    for s in &log.slices {
        for &(i, _) in &s.totals {
            used[i] = true;
        }
    }
    let mut out = FreshDir { resolution: 1, ..FreshDir::default() };
    // Per key index: the start from which its slices are added, and their resolution.
    let mut from_of: Vec<Option<(u64, u64)>> = vec![None; log.keys.len()];
    for (ki, k) in log.keys.iter().enumerate().filter(|(i, _)| used[*i]) {
        let comp = profile_format::event_file_component(&k.event);
        let from = match files.get(&(k.image.clone(), comp)).map(Vec::as_slice) {
            None | Some([]) => Some(0),
            Some([e]) => {
                let stamp = match known.get(k) {
                    Some(s) => Some(*s),
                    // Without marks no stamp can match: nothing to read.
                    None if read_rest && !marks.is_empty() => match read_profile(d, e) {
                        Ok(p) => {
                            let s = p.header.sequence;
                            out.published.insert(k.clone(), p.header);
                            Some(s)
                        }
                        // Reported by the load itself; no merge for what cannot be read.
                        Err(_) => None,
                    },
                    None => None,
                };
                stamp.and_then(|q| marks.get(&q).copied())
            }
            Some(_) => None,
        };
        let Some(from) = from else { continue };
        let Some(res) = from_point(from) else { continue };
        from_of[ki] = Some((from, res));
    }
    let takes = |ki: usize, start: u64| from_of[ki].is_some_and(|(f, _)| start >= f);
    let mut samples = vec![0u64; log.keys.len()];
    let mut parts: Vec<Vec<Vec<(u64, u64)>>> = vec![Vec::new(); log.keys.len()];
    for (j, s) in log.slices.iter().enumerate() {
        let mut any = false;
        for &(ki, n) in s.totals.iter().filter(|t| takes(t.0, s.start)) {
            samples[ki] = samples[ki].saturating_add(n);
            any = true;
        }
        if pairs && any {
            for (ki, v) in ix.pairs(j, &|ki| takes(ki, s.start))? {
                parts[ki].push(v);
            }
        }
    }
    for (ki, (n, p)) in samples.into_iter().zip(parts).enumerate() {
        let Some((_, res)) = from_of[ki] else { continue };
        if n > 0 {
            out.resolution = out.resolution.max(res);
            out.extra.insert(log.keys[ki].clone(), Extra { samples: n, pairs: sum_parts(p) });
        }
    }
    // Keys sampled but never published yet: their header from `fresh.json`, which dcpid
    // writes before it appends a slice with a new image; else from this host's previous
    // epochs (the same image id is the same image); else a placeholder.
    let mut missing: Vec<SliceKey> =
        out.extra.keys().filter(|k| !files.contains_key(&file_key(k))).cloned().collect();
    if missing.is_empty() {
        return Ok(Some(out));
    }
    let mut found: BTreeMap<SliceKey, ProfileHeader> = BTreeMap::new();
    match d.read_fresh_names() {
        Ok(Some(idx)) => {
            for t in &idx.images {
                if let Ok(h) = t.header(&idx, &d.host, &d.epoch) {
                    found.entry(slice_key(&h)).or_insert(h);
                }
            }
        }
        Err(e) if e.is_hostile_file() => return Err(e.into()),
        _ => {}
    }
    missing.retain(|k| !found.contains_key(k));
    if !missing.is_empty() {
        for e in epochs.iter().rev().filter(|e| **e < d.epoch).take(3) {
            let Ok(prev) = db.host_dir(e, &d.host) else { continue };
            let Ok(t) = dir_totals(&prev, 0, true) else { continue };
            for p in t.profiles {
                found.entry(slice_key(&p.profile.header)).or_insert(p.profile.header);
            }
        }
    }
    let keys: Vec<SliceKey> =
        out.extra.keys().filter(|k| !files.contains_key(&file_key(k))).cloned().collect();
    for k in keys {
        let h = match found.get(&k) {
            Some(h) => ProfileHeader {
                host: d.host.clone(),
                epoch: d.epoch.clone(),
                total_samples: 0,
                total_period: 0,
                sequence: 0,
                ..h.clone()
            },
            None => {
                let event = summary
                    .iter()
                    .flat_map(|s| s.events.iter())
                    .filter_map(|e| e.desc.clone())
                    .chain(found.values().map(|h| h.event.clone()))
                    .find(|e| e.name == k.event);
                let (Some(id), Some(event)) = (k.image.clone(), event) else {
                    out.extra.remove(&k);
                    continue;
                };
                ProfileHeader {
                    kind: ImageKind::Elf,
                    image_path: format!("[not yet published: {}]", id.to_text()).into_bytes(),
                    image_id: id,
                    event,
                    host: d.host.clone(),
                    epoch: d.epoch.clone(),
                    total_samples: 0,
                    total_period: 0,
                    sequence: 0,
                    jit_symbols: Vec::new(),
                }
            }
        };
        out.headers.insert(k, h);
    }
    Ok(Some(out))
}

/// The key of [`fresh_dir`]'s file listing for a slice key.
fn file_key(k: &SliceKey) -> (Option<ImageId>, String) {
    (k.image.clone(), profile_format::event_file_component(&k.event))
}

/// The host directories of the newest epoch of the database among `dirs`, with their merge;
/// `known(i)` gives the stamps of dir `i`'s profiles the caller holds.
fn fresh_dirs(
    dirs: &[HostDir],
    known: &dyn Fn(usize) -> BTreeMap<SliceKey, u64>,
    read_rest: bool,
    pairs: bool,
) -> Result<Vec<Option<FreshDir>>, ProfError> {
    let Some(first) = dirs.first() else { return Ok(Vec::new()) };
    let db = Database::open(&first.db_root())?;
    let epochs = db.epochs()?;
    let newest = epochs.last().cloned();
    let known: Vec<BTreeMap<SliceKey, u64>> = (0..dirs.len())
        .map(|i| if Some(&dirs[i].epoch) == newest.as_ref() { known(i) } else { BTreeMap::new() })
        .collect();
    par_map(dirs, |i, d| {
        if Some(&d.epoch) != newest.as_ref() {
            return Ok(None);
        }
        fresh_dir(d, &db, &epochs, &known[i], read_rest, pairs)
    })
    .into_iter()
    .collect()
}

fn add_pairs(total: &mut ProfileHeader, samples: &mut u64, extra: u64) {
    let per = if total.total_samples > 0 && total.total_period > 0 {
        total.total_period as f64 / total.total_samples as f64
    } else {
        total.event.period_mean.max(1) as f64
    };
    total.total_period = total.total_period.saturating_add((extra as f64 * per).round() as u64);
    total.total_samples = total.total_samples.saturating_add(extra);
    *samples = samples.saturating_add(extra);
}

/// The samples of (offset, count) pairs.
fn slice_sum(pairs: &[(u64, u64)]) -> u64 {
    pairs.iter().fold(0u64, |a, (_, c)| a.saturating_add(*c))
}

/// Fresh by default (issue 36 item 6, FORMAT.md §7.3): add to the profiles of the current
/// epoch what its time slices hold beyond them, exactly per image (the slices after the
/// freshness mark each profile is stamped with), and the keys sampled but not published yet
/// (with `filter`, only those of the image). The slices' offsets are at their resolution
/// ([`Freshened::resolution`]). Directories without slices are left as they are. With
/// `apply` false nothing is changed: what would be added is only counted (dcpilist, whose
/// per-instruction counts must not mix in rounded offsets, says how much it leaves out).
pub fn freshen_loaded(
    loaded: &mut Loaded,
    filter: Option<&ImageFilter>,
    apply: bool,
) -> Result<Freshened, ProfError> {
    let known = |i: usize| -> BTreeMap<SliceKey, u64> {
        let mut m = BTreeMap::new();
        for p in loaded.profiles.iter().filter(|p| p.dir == i) {
            m.insert(slice_key(&p.profile.header), p.profile.header.sequence);
        }
        m
    };
    // Without a filter every profile is loaded; with one, the other images do not matter.
    // Only what is applied needs the slices' pairs; a count needs their totals.
    let per_dir = fresh_dirs(&loaded.scan.dirs, &known, false, apply)?;
    let mut out = Freshened { samples: 0, resolution: 1 };
    for (i, f) in per_dir.into_iter().enumerate() {
        let Some(mut f) = f else { continue };
        let before = out.samples;
        for p in loaded.profiles.iter_mut().filter(|p| p.dir == i) {
            let Some(v) = f.extra.remove(&slice_key(&p.profile.header)) else { continue };
            let n = v.samples;
            out.samples += n;
            if !apply {
                continue;
            }
            if !p.profile.counts.is_empty() || p.samples == 0 {
                for (o, c) in v.pairs {
                    *p.profile.counts.entry(o).or_insert(0) += c;
                }
            }
            add_pairs(&mut p.profile.header, &mut p.samples, n);
        }
        for (k, v) in f.extra {
            let Some(mut header) = f.headers.remove(&k) else { continue };
            if filter.is_some_and(|f| f.rank(&header).is_none()) {
                continue;
            }
            let n = v.samples;
            out.samples += n;
            if !apply {
                continue;
            }
            let mut samples = 0;
            add_pairs(&mut header, &mut samples, n);
            let profile =
                Profile { header, who: None, counts: v.pairs.into_iter().collect(), sole: false };
            let path = loaded.scan.dirs[i].slices_path();
            loaded.profiles.push(LoadedProfile { path, profile, samples, dir: i });
        }
        if out.samples > before {
            out.resolution = out.resolution.max(f.resolution);
        }
    }
    Ok(out)
}

/// [`freshen_loaded`] for the per-image report's totals. The profiles of keys with newer
/// slices are read for their stamps, and their totals replace the summary index's (which
/// may be older than the files), so that the sum is exact.
pub fn freshen_totals(t: &mut Totals) -> Result<Freshened, ProfError> {
    let per_dir = fresh_dirs(&t.scan.dirs, &|_| BTreeMap::new(), true, false)?;
    let mut out = Freshened { samples: 0, resolution: 1 };
    let mut interner = Interner::default();
    for h in &t.headers {
        interner.intern_header(h);
    }
    for (i, f) in per_dir.into_iter().enumerate() {
        let Some(mut f) = f else { continue };
        for e in t.entries.iter_mut().filter(|e| e.dir as usize == i) {
            let key = slice_key(&interner.headers[e.header as usize]);
            let published = f.published.remove(&key);
            let extra = f.extra.remove(&key);
            if published.is_none() && extra.is_none() {
                continue;
            }
            let mut h = interner.headers[e.header as usize].clone();
            (h.total_samples, h.total_period) = (e.total_samples, e.total_period);
            let mut samples = e.samples;
            if let Some(p) = published {
                // The file's totals: those its stamp stands for.
                (h.total_samples, h.total_period) = (p.total_samples, p.total_period);
                samples = p.total_samples;
            }
            if let Some(v) = extra {
                add_pairs(&mut h, &mut samples, v.samples);
                out.samples += v.samples;
            }
            (e.samples, e.total_samples, e.total_period) =
                (samples, h.total_samples, h.total_period);
        }
        // Profiles the index does not list yet (published after it was written), with their
        // slices past the mark; then keys with slices only (no profile file yet).
        let mut extra = f.extra;
        let late: Vec<_> = (f.published.into_iter())
            .map(|(k, h)| (extra.remove(&k), h.total_samples, h))
            .collect();
        let mut headers = f.headers;
        let slices_only =
            (extra.into_iter()).filter_map(|(k, v)| headers.remove(&k).map(|h| (Some(v), 0, h)));
        for (v, mut samples, mut h) in late.into_iter().chain(slices_only) {
            if let Some(v) = v {
                add_pairs(&mut h, &mut samples, v.samples);
                out.samples += v.samples;
            }
            let (total_samples, total_period) = (h.total_samples, h.total_period);
            let header = interner.intern_header(&h);
            t.entries.push(TotalEntry {
                dir: i as u32,
                header,
                samples,
                total_samples,
                total_period,
            });
        }
        if out.samples > 0 {
            out.resolution = out.resolution.max(f.resolution);
        }
    }
    t.headers = interner.headers;
    Ok(out)
}

/// Open the database, naming it in the error.
pub fn open_db(root: &Path) -> Result<Database, ProfError> {
    if !root.is_dir() {
        return Err(ProfError::NoDatabase(root.to_owned()));
    }
    Ok(Database::open(root)?)
}

/// Distinct epochs and hosts of the loaded dirs, sorted.
pub fn epochs_and_hosts(dirs: &[HostDir]) -> (Vec<String>, Vec<String>) {
    let mut e: BTreeMap<String, ()> = BTreeMap::new();
    let mut h: BTreeMap<String, ()> = BTreeMap::new();
    for d in dirs {
        e.insert(d.epoch.to_string(), ());
        h.insert(d.host.clone(), ());
    }
    (e.into_keys().collect(), h.into_keys().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_selection_syntax() {
        assert_eq!("latest".parse::<EpochSel>(), Ok(EpochSel::Latest));
        assert_eq!("all".parse::<EpochSel>(), Ok(EpochSel::All));
        assert_eq!(
            "20250102T030405Z".parse::<EpochSel>(),
            Ok(EpochSel::One("20250102T030405Z".into()))
        );
        assert_eq!(
            "20250102..".parse::<EpochSel>(),
            Ok(EpochSel::Range(Some("20250102".into()), None))
        );
        for bad in
            ["", "yesterday", "2025-01-02", "20250102T030405Z..2024", "..x", "20250102T030405"]
        {
            assert!(bad.parse::<EpochSel>().is_err(), "{bad:?} accepted");
        }
        let day: EpochSel = "20250102".parse().unwrap_or(EpochSel::All);
        assert!(day.matches("20250102T235959Z") && !day.matches("20250103T000000Z"));
        assert!(!day.matches("20250101T235959Z"));
        let r: EpochSel = "20250102..20250103".parse().unwrap_or(EpochSel::All);
        assert!(r.matches("20250102T000000Z"));
        assert!(r.matches("20250103T235959Z"));
        assert!(!r.matches("20250104T000000Z"));
        assert!(!r.matches("20250101T235959Z"));
    }
}

#[cfg(test)]
mod range_tests;
