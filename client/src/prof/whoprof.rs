//! `dcpiprof --pid N` / `--cgroup PATH` with a profile report (`--by symbol`, `--by image`,
//! `--image`, `--symbols`, the exports): the per-process and per-cgroup profiles dcpid writes
//! with `by_pid` / `by_cgroup` (FORMAT.md §5.6) stand in for the flat profiles, so every
//! report reads them exactly as it reads those.

use std::path::PathBuf;

use profile_format::{HostDir, Profile, ProfileWho, WhoProfileEntry};

use crate::args::Selection;
use dcpi_report::error::ProfError;
use dcpi_report::select::{self, Loaded, LoadedProfile};
use dcpi_report::stats;

/// Whose profiles a report reads (chosen by [`super::mode::Mode::from_args`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WhoSel {
    /// One process id (`--pid`).
    Pid(u32),
    /// A cgroup v2 path or prefix, a unit or a container id prefix (`--cgroup`, as the who
    /// reports match it).
    Cgroup(String),
}

impl WhoSel {
    fn wants(&self, e: &WhoProfileEntry) -> bool {
        match self {
            Self::Pid(p) => e.pid() == Some(*p),
            Self::Cgroup(_) => e.is_cgroup(),
        }
    }

    /// For a cgroup selection, whether a profile's cgroup is selected (the name only says
    /// it is a cgroup's).
    fn keeps(&self, p: &Profile) -> bool {
        match (self, &p.who) {
            (Self::Pid(n), Some(ProfileWho::Pid { pid, .. })) => pid == n,
            (Self::Cgroup(spec), Some(ProfileWho::Cgroup { path })) => {
                super::who::cgroup_matches(spec, path)
            }
            _ => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Pid(p) => format!("process {p}"),
            Self::Cgroup(c) => format!("cgroup {c:?}"),
        }
    }
}

/// Whether any selected host directory holds profiles of `who`'s kind (per-process for
/// `--pid`, per-cgroup for `--cgroup`): `--by image` falls back to the who tables, which
/// answer it too, when none does.
pub fn recorded(sel: &Selection, who: &WhoSel) -> Result<bool, ProfError> {
    let db = select::open_db(&sel.db)?;
    let dirs = select::select_host_dirs(&db, &sel.epoch_sel(), &sel.host_sel())?;
    for d in &dirs {
        if d.who_profiles()?.iter().any(|e| match who {
            WhoSel::Pid(_) => e.pid().is_some(),
            WhoSel::Cgroup(_) => e.is_cgroup(),
        }) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The selected host directories' profiles of `who`, read whole (counts kept), with their
/// summaries. Errors when no selected directory holds any profile of that kind (the daemon
/// ran without `by_pid` / `by_cgroup`), or none of `who`.
pub fn load(
    sel: &Selection,
    who: &WhoSel,
    warn: &mut dyn FnMut(String),
) -> Result<Loaded, ProfError> {
    sel.no_time_axis("per-process and per-cgroup profiles (--pid, --cgroup)")?;
    let db = select::open_db(&sel.db)?;
    let dirs = select::select_host_dirs(&db, &sel.epoch_sel(), &sel.host_sel())?;
    let mut any_kind = false;
    let mut entries: Vec<(usize, PathBuf)> = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        for e in d.who_profiles()? {
            stats::count(&stats::PROFILES_LISTED);
            let kind = match who {
                WhoSel::Pid(_) => e.pid().is_some(),
                WhoSel::Cgroup(_) => e.is_cgroup(),
            };
            any_kind |= kind;
            if who.wants(&e) {
                entries.push((i, e.path));
            }
        }
    }
    if !any_kind {
        let (key, flag) = match who {
            WhoSel::Pid(_) => ("by_pid", "--by-pid"),
            WhoSel::Cgroup(_) => ("by_cgroup", "--by-cgroup"),
        };
        let (epochs, hosts) = select::epochs_and_hosts(&dirs);
        return Err(ProfError::Empty(format!(
            "epoch(s) {} of host(s) {} were recorded without {key}: they hold no per-{} \
             profiles, so the code {} ran cannot be told apart. Start dcpid with `{key} = \
             true` (or `{flag} true`) to record them; meanwhile --by image with --pid/--cgroup \
             answers from the who tables",
            epochs.join(","),
            hosts.join(","),
            if key == "by_pid" { "process" } else { "cgroup" },
            who.describe(),
        )));
    }
    let read = select::par_read(&entries);
    let mut out = Loaded::default();
    for ((dir, path), r) in entries.into_iter().zip(read) {
        stats::count(&stats::PROFILES_READ);
        match r {
            Ok(p) if who.keeps(&p) => {
                out.profiles.push(LoadedProfile::with_counts(path, p, dir));
            }
            Ok(_) => {}
            Err(e) => out.scan.corrupt.push(e.to_string()),
        }
    }
    if out.profiles.is_empty() && out.scan.corrupt.is_empty() {
        return Err(ProfError::Empty(format!(
            "no samples of {} in the selected epoch(s)/host(s) (a pid is recorded under the \
             host it ran on; try --epoch all or --host all, or `dcpiprof --by pid` / `--by \
             cgroup` to list who was sampled)",
            who.describe()
        )));
    }
    out.scan.summaries = dirs.iter().map(summary_of).collect::<Result<_, _>>()?;
    out.scan.dirs = dirs;
    sel.check_loaded(out, warn)
}

/// The facts of `d`'s `summary.json`; `None` if it is missing or damaged, an error if it is a
/// planted FIFO, device, link or oversized file (issue 34).
fn summary_of(d: &HostDir) -> Result<Option<profile_format::HostSummary>, ProfError> {
    match profile_format::HostSummary::read_facts(&d.summary_path()) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.is_hostile_file() => Err(e.into()),
        Err(_) => Ok(None),
    }
}
