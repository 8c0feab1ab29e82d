//! `dcpiprof --pid N` / `--cgroup PATH` / `--command NAME` with a profile report (`--by
//! symbol`, `--by image`, `--image`, `--symbols`, the exports; `dcpilist --command`): the
//! per-process, per-cgroup and per-command profiles dcpid writes with `by_pid` / `by_cgroup` /
//! `by_command` (FORMAT.md §5.6; `by_command` is on by default) stand in for the flat
//! profiles, so every report reads them exactly as it reads those.

use std::path::PathBuf;

use profile_format::{command_file_component, HostDir, Profile, ProfileWho, WhoProfileEntry};

use crate::args::Selection;
use dcpi_report::error::ProfError;
use dcpi_report::select::{self, Loaded, LoadedProfile};
use dcpi_report::select::{EpochSel, HostSel};
use dcpi_report::stats;

/// Whose profiles a report reads (chosen by [`super::mode::Mode::from_args`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WhoSel {
    /// One process id (`--pid`).
    Pid(u32),
    /// A cgroup v2 path or prefix, a unit or a container id prefix (`--cgroup`, as the who
    /// reports match it).
    Cgroup(String),
    /// One command, exactly as the who table names it (`--command`).
    Command(String),
}

impl WhoSel {
    /// The selection of `--command` or `--cgroup`/`--unit` (the tools' flags refuse both).
    pub fn of(command: Option<&str>, cgroup: Option<&str>) -> Option<Self> {
        match (command, cgroup) {
            (Some(c), _) => Some(Self::Command(c.to_owned())),
            (None, Some(g)) => Some(Self::Cgroup(g.to_owned())),
            (None, None) => None,
        }
    }

    /// Whether a profile of this kind (per process, cgroup or command) is named `e`.
    fn kind_of(&self, e: &WhoProfileEntry) -> bool {
        match self {
            Self::Pid(_) => e.pid().is_some(),
            Self::Cgroup(_) => e.is_cgroup(),
            Self::Command(_) => e.is_command(),
        }
    }

    fn wants(&self, e: &WhoProfileEntry) -> bool {
        match self {
            Self::Pid(p) => e.pid() == Some(*p),
            Self::Cgroup(_) => e.is_cgroup(),
            // The name holds a hash of the command: only that command's files are read.
            Self::Command(c) => e.who_component == command_file_component(c.as_bytes()),
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
            (Self::Command(c), Some(ProfileWho::Command { command })) => command == c.as_bytes(),
            _ => false,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Pid(p) => format!("process {p}"),
            Self::Cgroup(c) => format!("cgroup {c:?}"),
            Self::Command(c) => format!("command {c:?}"),
        }
    }

    /// The dcpid setting that writes this kind of profile, its flag, and what it splits by.
    fn setting(&self) -> (&'static str, &'static str, &'static str) {
        match self {
            Self::Pid(_) => ("by_pid", "--by-pid", "process"),
            Self::Cgroup(_) => ("by_cgroup", "--by-cgroup", "cgroup"),
            Self::Command(_) => ("by_command", "--by-command", "command"),
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
        if d.who_profiles()?.iter().any(|e| who.kind_of(e)) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The selected host directories' profiles of `who`, read whole (counts kept), with their
/// summaries. Errors when no selected directory holds any profile of that kind (the daemon
/// ran without `by_pid` / `by_cgroup` / `by_command`), or none of `who`.
pub fn load(
    sel: &Selection,
    who: &WhoSel,
    warn: &mut dyn FnMut(String),
) -> Result<Loaded, ProfError> {
    load_with(sel, &sel.epoch_sel(), &sel.host_sel(), who, warn)
}

/// [`load`] of the given epochs and hosts (`dcpidiff`'s two sides).
pub fn load_with(
    sel: &Selection,
    epoch: &EpochSel,
    host: &HostSel,
    who: &WhoSel,
    warn: &mut dyn FnMut(String),
) -> Result<Loaded, ProfError> {
    // The time slices (slices.log) count samples per image and offset, not per process,
    // cgroup or command: these profiles are whole-epoch totals.
    if matches!(epoch, EpochSel::Between(..)) {
        return Err(ProfError::Usage(
            "--since/--until select time slices, and the per-process, per-cgroup and \
             per-command profiles (--pid, --cgroup, --command) have no time axis (they hold \
             whole-epoch totals; the slices count samples per image and offset only): select \
             epochs with --epoch instead"
                .into(),
        ));
    }
    let db = select::open_db(&sel.db)?;
    let dirs = select::select_host_dirs(&db, epoch, host)?;
    let mut any_kind = false;
    let mut entries: Vec<(usize, PathBuf)> = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        for e in d.who_profiles()? {
            stats::count(&stats::PROFILES_LISTED);
            any_kind |= who.kind_of(&e);
            if who.wants(&e) {
                entries.push((i, e.path));
            }
        }
    }
    if !any_kind {
        let (key, flag, per) = who.setting();
        let (epochs, hosts) = select::epochs_and_hosts(&dirs);
        return Err(ProfError::Empty(format!(
            "epoch(s) {} of host(s) {} were recorded without {key}: they hold no per-{per} \
             profiles, so the code {} ran cannot be told apart. Start dcpid with `{key} = \
             true` (or `{flag} true`{}) to record them; meanwhile --by image with \
             --pid/--cgroup/--command answers from the who tables",
            epochs.join(","),
            hosts.join(","),
            who.describe(),
            if key == "by_command" { "; the default since profile version 3" } else { "" },
        )));
    }
    let read = select::par_read(&entries);
    let mut out = Loaded::default();
    for ((dir, path), r) in entries.into_iter().zip(read) {
        stats::count(&stats::PROFILES_READ);
        match r.and_then(|p| if p.sole { sole_command(&dirs[dir], &path, p) } else { Ok(Some(p)) })
        {
            Ok(Some(p)) if who.keeps(&p) => {
                out.profiles.push(LoadedProfile::with_counts(path, p, dir));
            }
            Ok(_) => {}
            Err(e) => out.scan.corrupt.push(e.to_string()),
        }
    }
    if out.profiles.is_empty() && out.scan.corrupt.is_empty() {
        return Err(ProfError::Empty(format!(
            "no samples of {} in the selected epoch(s)/host(s) (a process is recorded under \
             the host it ran on; try --epoch all or --host all, or `dcpiprof --by pid` / `--by \
             cgroup` / `--by command` to list who was sampled)",
            who.describe()
        )));
    }
    out.scan.summaries = dirs.iter().map(summary_of).collect::<Result<_, _>>()?;
    out.scan.dirs = dirs;
    sel.check_loaded(out, warn)
}

/// The per-command profile at `path` in `d` as readers take it: a sole-command stub
/// (FORMAT.md §5.6.1) read as the flat profile it stands for. `None`: a stub without a flat
/// profile (no samples).
pub fn read_command_profile(
    d: &HostDir,
    path: &std::path::Path,
) -> Result<Option<Profile>, profile_format::Error> {
    let p = Profile::read(path)?;
    if p.sole {
        sole_command(d, path, p)
    } else {
        Ok(Some(p))
    }
}

/// What the sole-command stub `stub` at `path` stands for (FORMAT.md §5.6.1): the flat
/// profile of its image and event in `d`, as its command's. The stub is checked again after
/// the flat profile was read: dcpid replaces a stub by a copy before the flat profile takes
/// another command's samples, so a stub still there means the flat profile read was all
/// this command's; a stub gone means the copy is read instead. `None`: no flat profile.
fn sole_command(
    d: &HostDir,
    path: &std::path::Path,
    stub: Profile,
) -> Result<Option<Profile>, profile_format::Error> {
    let Some(ProfileWho::Command { command }) = stub.who else { return Ok(None) };
    let flat = match Profile::read(&d.profile_path(&stub.header.image_id, &stub.header.event.name))
    {
        Ok(f) => Some(f),
        Err(profile_format::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            None
        }
        Err(e) => return Err(e),
    };
    if !Profile::is_sole_stub(path) {
        return match Profile::read(path) {
            Ok(p) if !p.sole => Ok(Some(p)),
            Ok(_) => Ok(None),
            Err(e) => Err(e),
        };
    }
    Ok(flat.map(|f| Profile::as_sole_command(f, command)))
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
