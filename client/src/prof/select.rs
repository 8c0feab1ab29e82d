//! Choosing epochs and hosts, and loading their profiles and summaries.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use profile_format::{Database, EpochId, HostDir, HostSummary, ImageId, Profile, ProfileEntry};

use super::image::{image_display, ImageFilter};
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
            "latest" => return Ok(EpochSel::Latest),
            "all" => return Ok(EpochSel::All),
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
            return Ok(EpochSel::Range(from, to));
        }
        // A day (YYYYMMDD) is every epoch that started on it.
        if s.len() == 8 && valid_epoch_prefix(s) {
            return Ok(EpochSel::Range(Some(s.to_owned()), Some(s.to_owned())));
        }
        if s.len() == 16 && valid_epoch_prefix(s) {
            Ok(EpochSel::One(s.to_owned()))
        } else {
            Err(bad("bad epoch"))
        }
    }
}

impl EpochSel {
    fn matches(&self, id: &str) -> bool {
        match self {
            EpochSel::Latest | EpochSel::All | EpochSel::Between(..) => true,
            EpochSel::One(x) => id == x,
            EpochSel::Range(from, to) => {
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
    for e in &chosen {
        for h in db.hosts(e)? {
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
    fn new(path: PathBuf, profile: Profile, dir: usize, keep_counts: bool) -> LoadedProfile {
        let mut profile = profile;
        let samples = profile.counts.values().sum();
        if !keep_counts {
            profile.counts = Default::default();
        }
        LoadedProfile { path, profile, samples, dir }
    }
}

/// Everything read for a report.
#[derive(Debug, Default)]
pub struct Loaded {
    pub dirs: Vec<HostDir>,
    /// Summary per dir (same index), when readable (and, with a filter, when needed).
    pub summaries: Vec<Option<HostSummary>>,
    pub profiles: Vec<LoadedProfile>,
    /// Files that could not be read (message names the file).
    pub corrupt: Vec<String>,
    /// With a filter: images seen but not matching (display name, samples of the file read).
    pub other_images: Vec<(String, u64)>,
}

fn read_profile(path: &Path) -> Result<Profile, profile_format::Error> {
    stats::count(&stats::PROFILES_READ);
    Profile::read(path)
}

/// Read the profiles of `dirs` (with their summaries). Unreadable files are collected in
/// [`Loaded::corrupt`] (the caller decides whether that fails the run).
///
/// With a `filter` (per-symbol report) only the files of the chosen image are read: those the
/// file name (image id) decides directly, and otherwise one file per distinct image identity to
/// learn its kind and path; the other files of a non-matching identity are never opened. Over a
/// week of epochs from many hosts that is one read per distinct image plus the image's own.
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
    let mut entries: Vec<(usize, ProfileEntry)> = Vec::new();
    for (i, listed) in par_map(&dirs, |_, d| d.profiles()).into_iter().enumerate() {
        for e in listed? {
            stats::count(&stats::PROFILES_LISTED);
            entries.push((i, e));
        }
    }
    let push = |out: &mut Loaded, dir: usize, path: PathBuf, r: Result<Profile, _>| match r {
        Ok(profile) => out.profiles.push(LoadedProfile::new(path, profile, dir, keep_counts)),
        Err(e) => out.corrupt.push(format!("{e}")),
    };
    match filter {
        None => {
            // Files are independent: read them in parallel, keep the listing's order.
            let read = par_map(&entries, |_, (_, e)| read_profile(&e.path));
            for ((dir, e), r) in entries.into_iter().zip(read) {
                push(&mut out, dir, e.path, r);
            }
        }
        Some(f) => {
            let any_by_name =
                entries.iter().any(|(_, e)| f.by_name(e.image_id.as_ref()) == Some(true));
            let fallback;
            let f = match f.as_name() {
                Some(named) if !any_by_name => {
                    fallback = named;
                    &fallback
                }
                _ => f,
            };
            let mut direct: Vec<(usize, PathBuf)> = Vec::new();
            let mut groups: BTreeMap<ImageId, Vec<(usize, PathBuf)>> = BTreeMap::new();
            for (dir, e) in entries {
                match f.by_name(e.image_id.as_ref()) {
                    Some(true) => direct.push((dir, e.path)),
                    Some(false) => {}
                    None => {
                        if let Some(id) = e.image_id {
                            groups.entry(id).or_default().push((dir, e.path));
                        }
                    }
                }
            }
            // Files are independent: read them in parallel, keep the sequential order.
            let read = par_map(&direct, |_, (_, path)| read_profile(path));
            for ((dir, path), r) in direct.into_iter().zip(read) {
                push(&mut out, dir, path, r);
            }
            // The first readable file of each identity decides whether it is the image.
            let groups: Vec<Vec<(usize, PathBuf)>> = groups.into_values().collect();
            let decided = par_map(&groups, |_, files| {
                let mut corrupt = Vec::new();
                for (k, (dir, path)) in files.iter().enumerate() {
                    match read_profile(path) {
                        Ok(profile) => {
                            let p = LoadedProfile::new(path.clone(), profile, *dir, true);
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
            let mut rest: Vec<(usize, PathBuf)> = Vec::new();
            for (files, (_, d)) in groups.iter().zip(&decided) {
                if let Some((k, _, true)) = d {
                    rest.extend(files[k + 1..].iter().cloned());
                }
            }
            let mut rest_read = par_map(&rest, |_, (_, path)| read_profile(path)).into_iter();
            let mut rest = rest.into_iter();
            for (files, (corrupt, d)) in groups.iter().zip(decided) {
                out.corrupt.extend(corrupt);
                match d {
                    Some((k, p, true)) => {
                        out.profiles.push(p);
                        for _ in k + 1..files.len() {
                            if let (Some((dir, path)), Some(r)) = (rest.next(), rest_read.next()) {
                                push(&mut out, dir, path, r);
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
        let sp = d.summary_path();
        (needed[i] && sp.exists()).then(|| HostSummary::read_facts(&sp))
    });
    for r in read {
        let summary = match r {
            Some(Ok(s)) => Some(s),
            Some(Err(e)) => {
                warn(format!("{e} (multiplexing scale unknown for this host/epoch)"));
                None
            }
            None => None,
        };
        out.summaries.push(summary);
    }
    out.dirs = dirs;
    Ok(out)
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
    let results = par_map(&dirs, |i, d| dir_totals(d, i));
    let mut out = Loaded::default();
    out.profiles.reserve(results.iter().map(|r| r.as_ref().map_or(0, |t| t.profiles.len())).sum());
    for r in results {
        let t = r?;
        out.profiles.extend(t.profiles);
        out.corrupt.extend(t.corrupt);
        out.summaries.push(t.summary);
        if let Some(w) = t.warning {
            warn(w);
        }
    }
    out.dirs = dirs;
    Ok(out)
}

/// `f` over `items` on a few threads, results in the order of `items`. The work is file reads:
/// more threads than CPUs keep several requests in flight (NFS latency, disk queue).
fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(usize, &T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get() * 2)
        .clamp(2, 16)
        .min(items.len());
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

fn dir_totals(d: &HostDir, dir: usize) -> Result<DirTotals, ProfError> {
    let mut t = DirTotals::default();
    let sp = d.summary_path();
    match HostSummary::read(&sp) {
        Ok(s) => t.summary = Some(s),
        Err(profile_format::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound => {}
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
                    let profile = Profile { header: h, counts: Default::default() };
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
        match read_profile(&e.path) {
            Ok(p) => t.profiles.push(LoadedProfile::new(e.path, p, dir, false)),
            Err(err) => t.corrupt.push(format!("{err}")),
        }
    }
    Ok(t)
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
