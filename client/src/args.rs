//! Options shared by every report tool (`dcpiprof`, `dcpilist`, `dcpidiff`, `dcpistats`,
//! `dcpiexport`): one selection model and one way to find symbols.
//!
//! Each tool flattens [`Selection`] (which database, epochs, hosts and events) and, when it
//! symbolizes, [`SymbolSearch`] (where binaries, debug files and the symbol cache are) into its
//! own clap parser, so `--db`, `--epoch`, `--host`, `--event`, `--keep-going`, `--debug-dir`,
//! `--binary-path`, `--symbol-cache` … mean the same thing everywhere.
// The doc comments of the clap types here are the --help text and man pages, printed as
// written: backticks around names would show up there.
#![allow(clippy::doc_markdown)]

use std::path::PathBuf;

use dcpi_report::debuginfo::{Locator, SearchPaths, SYSTEM_DEBUG_DIR};
use dcpi_report::error::ProfError;
pub use dcpi_report::error::{did_you_mean, did_you_mean_hint};
use dcpi_report::image::ImageFilter;
use dcpi_report::select::{
    epoch_start, freshen_loaded, freshen_totals, load, load_counts, load_image_totals, open_db,
    restrict_loaded, restrict_totals, select_host_dirs, this_host, EpochSel, Freshened, HostSel,
    Loaded, TimeRange, Totals,
};
use dcpi_report::symcache::{default_path as default_cache_path, SymbolCache};

/// Which profiles a report reads.
#[derive(clap::Args, Debug, Clone)]
pub struct Selection {
    /// Profile database directory.
    #[arg(long, value_name = "DIR", default_value = profile_format::DEFAULT_DB, env = "DCPI_DB")]
    pub db: PathBuf,
    /// Epochs: `latest`, `all`, an epoch id, a day (YYYYMMDD: every epoch started that day), or
    /// FROM..TO (inclusive; ids or prefixes such as 20250101; either end may be omitted).
    #[arg(long, value_name = "ID|latest|all|FROM..TO", default_value = "latest")]
    pub epoch: EpochSel,
    /// Only the samples taken from WHEN on, to the resolution of the stored time slices
    /// (slice_interval, 1 minute by default; 1 hour for slices older than slice_rollup_after):
    /// WHEN is a duration back from now (`15m`, `2h`, `3days`), a UTC time
    /// (`2026-11-24T10:00:00Z`, `2026-11-24 10:00`, `14:00` today), a day (`2026-11-24`,
    /// `20261124`: its midnight UTC) or an epoch id. Replaces --epoch: the epochs overlapping
    /// the range are read, and of each only its slices in the range. The header names the
    /// range the slices exactly cover and by how much the request was rounded. A host-epoch
    /// without slices (older database, slice_interval = 0) is counted whole when its epoch lies
    /// inside the range and left out, with a warning, when the range cuts it. Call stacks and
    /// who tables have no time axis: with --since/--until they are an error.
    #[arg(long, value_name = "WHEN", value_parser = parse_when, conflicts_with = "epoch")]
    pub since: Option<u64>,
    /// Only the samples taken before WHEN (as --since; a day means its midnight UTC).
    #[arg(long, value_name = "WHEN", value_parser = parse_when, conflicts_with = "epoch")]
    pub until: Option<u64>,
    /// Host to report (default: this host); `all` merges every host. Without a value, or with
    /// a host that has no data, the error lists the hosts present.
    #[arg(long, value_name = "NAME|all", num_args = 0..=1, default_missing_value = "")]
    pub host: Option<String>,
    /// Events to report, in column order (repeatable or comma-separated; default: all).
    #[arg(long = "event", value_name = "NAME", value_delimiter = ',')]
    pub events: Vec<String>,
    /// Skip corrupt or foreign-version profile files (each named in a warning) and exit 0.
    /// Without it such a file is an error (exit 2).
    #[arg(long, alias = "ignore-corrupt")]
    pub keep_going: bool,
}

impl Selection {
    /// The epochs chosen: `--since`/`--until` when given, else `--epoch`.
    pub fn epoch_sel(&self) -> EpochSel {
        if self.since.is_some() || self.until.is_some() {
            EpochSel::Between(self.since, self.until)
        } else {
            self.epoch.clone()
        }
    }

    /// Whether the selection is the current epoch (the default `--epoch latest`, no range).
    pub fn is_latest(&self) -> bool {
        self.time_range().is_none() && self.epoch == EpochSel::Latest
    }

    /// `--since`/`--until` as a time range, when either is given.
    pub fn time_range(&self) -> Option<TimeRange> {
        (self.since.is_some() || self.until.is_some())
            .then(|| TimeRange::new(self.since, self.until))
    }

    /// Refuse `--since`/`--until` for a report that has no time axis (`what`: call stacks,
    /// who tables, per-process profiles hold epoch totals only).
    pub fn no_time_axis(&self, what: &str) -> Result<(), ProfError> {
        match self.time_range() {
            None => Ok(()),
            Some(_) => Err(ProfError::Usage(format!(
                "--since/--until select time slices, and {what} have no time axis (they hold \
                 whole-epoch totals): select epochs with --epoch instead"
            ))),
        }
    }

    /// The `--host` choice (default: this host).
    pub fn host_sel(&self) -> HostSel {
        match self.host.as_deref() {
            Some("all") => HostSel::All,
            Some(h) => HostSel::Named(h.to_owned()),
            None => HostSel::Named(this_host()),
        }
    }

    /// Open the database, pick the host directories and read their profiles (only those of
    /// the image `filter` names, when given). Corrupt files fail the run unless
    /// `--keep-going`, when each becomes a warning.
    pub fn load(
        &self,
        filter: Option<&ImageFilter>,
        warn: &mut dyn FnMut(String),
    ) -> Result<Loaded, ProfError> {
        self.load_with(&self.epoch_sel(), &self.host_sel(), filter, warn)
    }

    /// As [`Selection::load`] with another epoch and host choice (e.g. `dcpidiff`'s
    /// `--before`/`--after`), keeping this selection's database and corrupt-file policy.
    pub fn load_with(
        &self,
        epoch: &EpochSel,
        host: &HostSel,
        filter: Option<&ImageFilter>,
        warn: &mut dyn FnMut(String),
    ) -> Result<Loaded, ProfError> {
        self.load_fresh(epoch, host, filter, true, warn).map(|(l, _)| l)
    }

    /// As [`Selection::load`] for per-instruction counts (dcpilist): the current epoch's
    /// newest samples, in time slices at a coarser offset resolution, are not merged in
    /// (FORMAT.md §7.3); how many were left out is returned.
    pub fn load_published(
        &self,
        filter: Option<&ImageFilter>,
        warn: &mut dyn FnMut(String),
    ) -> Result<(Loaded, Freshened), ProfError> {
        self.load_fresh(&self.epoch_sel(), &self.host_sel(), filter, false, warn)
    }

    fn load_fresh(
        &self,
        epoch: &EpochSel,
        host: &HostSel,
        filter: Option<&ImageFilter>,
        apply: bool,
        warn: &mut dyn FnMut(String),
    ) -> Result<(Loaded, Freshened), ProfError> {
        let db = open_db(&self.db)?;
        let dirs = select_host_dirs(&db, epoch, host)?;
        let mut loaded = load(dirs, filter, warn)?;
        let mut fresh = Freshened::default();
        if let EpochSel::Between(since, until) = epoch {
            restrict_loaded(&mut loaded, TimeRange::new(*since, *until), warn)?;
        } else {
            fresh = freshen_loaded(&mut loaded, filter, apply)?;
        }
        Ok((self.check_corrupt(loaded, warn)?, fresh))
    }

    /// As [`Selection::load`] without an image filter, keeping every profile's per-offset
    /// counts (reports across all images at instruction or symbol granularity).
    pub fn load_all_counts(&self, warn: &mut dyn FnMut(String)) -> Result<Loaded, ProfError> {
        self.all_counts(true, warn).map(|(l, _)| l)
    }

    /// [`Selection::load_all_counts`] for per-instruction counts (`dcpilist --top`), as
    /// [`Selection::load_published`].
    pub fn load_all_counts_published(
        &self,
        warn: &mut dyn FnMut(String),
    ) -> Result<(Loaded, Freshened), ProfError> {
        self.all_counts(false, warn)
    }

    fn all_counts(
        &self,
        apply: bool,
        warn: &mut dyn FnMut(String),
    ) -> Result<(Loaded, Freshened), ProfError> {
        let db = open_db(&self.db)?;
        let dirs = select_host_dirs(&db, &self.epoch_sel(), &self.host_sel())?;
        let mut loaded = load_counts(dirs, None, true, warn)?;
        let mut fresh = Freshened::default();
        if let Some(r) = self.time_range() {
            restrict_loaded(&mut loaded, r, warn)?;
        } else {
            fresh = freshen_loaded(&mut loaded, None, apply)?;
        }
        Ok((self.check_corrupt(loaded, warn)?, fresh))
    }

    /// The per-image totals of the selection (summary indexes where present, else profiles),
    /// with the same corrupt-file policy as [`Selection::load`].
    pub fn load_totals(&self, warn: &mut dyn FnMut(String)) -> Result<Totals, ProfError> {
        let db = open_db(&self.db)?;
        let dirs = select_host_dirs(&db, &self.epoch_sel(), &self.host_sel())?;
        let mut totals = load_image_totals(dirs, warn)?;
        if let Some(r) = self.time_range() {
            restrict_totals(&mut totals, r, warn)?;
        } else {
            freshen_totals(&mut totals)?;
        }
        self.check_corrupt_files(&totals.corrupt, warn)?;
        Ok(totals)
    }

    /// What every load does with the files it could not read: fail unless `--keep-going`,
    /// which warns about each.
    pub fn check_loaded(
        &self,
        loaded: Loaded,
        warn: &mut dyn FnMut(String),
    ) -> Result<Loaded, ProfError> {
        self.check_corrupt(loaded, warn)
    }

    fn check_corrupt(
        &self,
        loaded: Loaded,
        warn: &mut dyn FnMut(String),
    ) -> Result<Loaded, ProfError> {
        self.check_corrupt_files(&loaded.corrupt, warn)?;
        check_kernel_snapshots(&loaded)?;
        Ok(loaded)
    }

    fn check_corrupt_files(
        &self,
        corrupt: &[String],
        warn: &mut dyn FnMut(String),
    ) -> Result<(), ProfError> {
        if !corrupt.is_empty() {
            if !self.keep_going {
                return Err(ProfError::Corrupt {
                    first: corrupt[0].clone(),
                    more: corrupt.len() - 1,
                });
            }
            for c in corrupt {
                warn(format!("skipping corrupt profile: {c}"));
            }
        }
        Ok(())
    }
}

/// The flags that end the command line of `dcpilist`, `dcpidiff` and `dcpistats`: where
/// names come from, how much is said of missing ones, and `--generate`.
#[derive(clap::Args, Debug, Clone)]
pub struct NamesArgs {
    #[command(flatten)]
    pub symbols: SymbolSearch,
    /// List each image whose names are missing (stripped, no debug file, binary gone,
    /// unreadable) with how to get its symbols, one warning line each; without it they are
    /// counted in one line.
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Write a man page or shell completions to stdout and exit.
    #[arg(long, hide = true, value_enum, value_name = "WHAT")]
    pub generate: Option<dcpi_manpage::Generate>,
}

/// Where binaries, debug files and cached symbol tables are found.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct SymbolSearch {
    /// Directory searched first for separate debug files (repeatable).
    #[arg(long = "debug-dir", value_name = "DIR")]
    pub debug_dirs: Vec<PathBuf>,
    /// Directory whose files are matched by build-id to find binaries (repeatable).
    #[arg(long = "binary-path", value_name = "DIR")]
    pub binary_paths: Vec<PathBuf>,
    /// Extra build-id cache directory (<xx>/<rest> layout), searched before <db>/binaries.
    #[arg(long = "cache-dir", value_name = "DIR")]
    pub cache_dirs: Vec<PathBuf>,
    /// Symbol cache file (SQLite) [default: $XDG_CACHE_HOME/dcpi/symbols.sqlite or
    /// ~/.cache/dcpi/symbols.sqlite].
    #[arg(
        long,
        value_name = "FILE",
        env = "DCPI_SYMBOL_CACHE",
        conflicts_with = "no_symbol_cache"
    )]
    pub symbol_cache: Option<PathBuf>,
    /// Do not read or write the symbol cache.
    #[arg(long)]
    pub no_symbol_cache: bool,
    /// Do not look in /usr/lib/debug.
    #[arg(long, hide = true)]
    pub no_system_debug: bool,
}

impl SymbolSearch {
    /// The binary/debug-file locator for the database at `db` (its `binaries/` cache last).
    pub fn locator(&self, db: &std::path::Path) -> Locator {
        let mut paths = SearchPaths {
            debug_dirs: self.debug_dirs.clone(),
            system_debug_dir: (!self.no_system_debug).then(|| PathBuf::from(SYSTEM_DEBUG_DIR)),
            binary_paths: self.binary_paths.clone(),
            cache_dirs: self.cache_dirs.clone(),
            symbol_store: None,
        };
        paths.cache_dirs.push(db.join("binaries"));
        paths.symbol_store = Some(db.to_owned());
        Locator::new(paths)
    }

    /// The symbol cache these options ask for (disabled on any error, with a warning).
    pub fn cache(&self, warn: &mut dyn FnMut(String)) -> SymbolCache {
        match (&self.symbol_cache, self.no_symbol_cache) {
            (_, true) => SymbolCache::disabled(),
            (Some(p), false) => SymbolCache::open(p, warn),
            (None, false) => match default_cache_path() {
                Some(p) => SymbolCache::open(&p, warn),
                None => SymbolCache::disabled(),
            },
        }
    }
}

/// `--limit N`: at most N rows; `0` means no limit (as `head -n 0` would be useless, and as
/// other tools read it), kept as `usize::MAX` so every caller's `Option<usize>` handling holds.
pub fn parse_limit(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Ok(usize::MAX),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a row count (a whole number; 0 means no limit)")),
    }
}

/// `--since`/`--until`: a duration back from now, a UTC time, a day or an epoch id, as Unix
/// seconds.
pub fn parse_when(s: &str) -> Result<u64, String> {
    parse_when_at(s, std::time::SystemTime::now())
}

fn parse_when_at(s: &str, now: std::time::SystemTime) -> Result<u64, String> {
    let unix = |t: std::time::SystemTime| {
        t.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
    };
    if let Ok(d) = humantime::parse_duration(s) {
        return Ok(unix(now).saturating_sub(d.as_secs()));
    }
    if let Some(t) = epoch_start(s) {
        return Ok(t);
    }
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return Ok(unix(t));
    }
    // A day (`2026-11-24`: its midnight UTC) or a minute (`2026-11-24T10:00`, with `Z` or not).
    let minute = s.strip_suffix('Z').unwrap_or(s);
    for t in [format!("{s}T00:00:00Z"), format!("{minute}:00Z")] {
        if let Ok(t) = humantime::parse_rfc3339_weak(&t) {
            return Ok(unix(t));
        }
    }
    // A time of day (`14:00`, `14:00:30`, `14:00Z`): today, UTC.
    let hms: Vec<&str> = minute.split(':').collect();
    if (2..=3).contains(&hms.len()) && hms.iter().all(|p| p.len() == 2) {
        let n: Vec<Option<u64>> = hms.iter().map(|p| p.parse::<u64>().ok()).collect();
        if let [Some(h), Some(m), rest @ ..] = n.as_slice() {
            let sec = rest.first().copied().unwrap_or(Some(0));
            if let (true, Some(sec)) = (*h < 24 && *m < 60, sec.filter(|x| *x < 60)) {
                let today = unix(now) - unix(now) % 86_400;
                return Ok(today + h * 3600 + m * 60 + sec);
            }
        }
    }
    Err(format!(
        "{s:?} is neither a duration (15m, 2h, 3days) nor a UTC time (2026-11-24T10:00:00Z, \
         2026-11-24 10:00, 14:00 today, a day 2026-11-24 or 20261124, an epoch id \
         20261124T101500Z)"
    ))
}

/// Before kernel samples are symbolized: the kernel symbol snapshot of every host directory
/// whose kernel counts were loaded must not be a planted FIFO, device, link or oversized file
/// (an error naming it, exit status 2; issue 34). A missing or damaged snapshot stays a
/// warning of the symbolizer (the samples are shown unsymbolized).
fn check_kernel_snapshots(loaded: &Loaded) -> Result<(), ProfError> {
    let mut checked = vec![false; loaded.dirs.len()];
    for p in &loaded.profiles {
        let kernel = matches!(
            p.profile.header.kind,
            profile_format::ImageKind::Kernel | profile_format::ImageKind::KernelModule
        );
        if kernel && !p.profile.counts.is_empty() && !checked[p.dir] {
            checked[p.dir] = true;
            loaded.dirs[p.dir].check_kallsyms_file()?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_when_at;
    use std::time::{Duration, UNIX_EPOCH};

    /// Issue 36: every form `--since`/`--until` take, against a fixed "now"
    /// (2026-11-29T14:37:05Z).
    #[test]
    fn when_takes_durations_times_days_and_times_of_day() {
        let now_s = 1_795_963_025; // 2026-11-29T14:37:05Z
        let now = UNIX_EPOCH + Duration::from_secs(now_s);
        let midnight = now_s - now_s % 86_400;
        let at = |s: &str| parse_when_at(s, now);
        assert_eq!(at("15m"), Ok(now_s - 900));
        assert_eq!(at("2026-11-29T14:00:00Z"), Ok(midnight + 14 * 3600));
        assert_eq!(at("2026-11-29 14:00"), Ok(midnight + 14 * 3600));
        assert_eq!(at("2026-11-29T14:00Z"), Ok(midnight + 14 * 3600));
        assert_eq!(at("14:00"), Ok(midnight + 14 * 3600));
        assert_eq!(at("14:00:30"), Ok(midnight + 14 * 3600 + 30));
        assert_eq!(at("2026-11-29"), Ok(midnight));
        assert_eq!(at("20261129"), Ok(midnight));
        assert_eq!(at("20261129T140000Z"), Ok(midnight + 14 * 3600));
        for bad in ["", "yesterday", "25:00", "14:60", "1400", "2026-13-01", "14:0"] {
            let e = at(bad).expect_err(bad);
            assert!(e.contains(&format!("{bad:?}")), "{bad:?}: {e}");
        }
    }
}
