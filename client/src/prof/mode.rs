//! What one `dcpiprof` run does, decided once from its flags.
//!
//! [`Mode::from_args`] is the one place that reads the parsed command line ([`Args`]) to choose
//! a report or an export, and the one place that checks flags against each other (clap's
//! declarative `conflicts_with`/`requires` aside): a combination that makes no sense is a usage
//! error naming the flags (exit status 2) before any file is read. Each [`Mode`] variant carries
//! only what its report needs, and the reports take those structs, never [`Args`]; a report's
//! own parameters live in its module ([`Trend`] in `by`, [`Who`] in `who`, [`Calls`] in
//! `stacks`) and are imported here, so no report module imports this one. Dispatch
//! (in [`super::run`]) and the export writer ([`ExportFormat::write`]) match exhaustively with
//! no wildcard arm, so a new report or export format does not compile until it is handled
//! everywhere (ripgrep's `LowArgs` -> `HiArgs`/`Mode` is the model).

use std::path::PathBuf;

use super::by::{Across, By, Focus, Trend};
use super::cli::Args;
use super::export::ExportFormat;
use super::health::StackHealth;
use super::output::{Format, TableFormat};
use super::stacks::{Calls, Direction};
use super::timeline::Timeline;
use super::who::{Who, WhoBy, WhoFilters};
use super::whoprof::WhoSel;
use crate::args::{Selection, SymbolSearch};
use dcpi_manpage::Generate;
use dcpi_report::error::ProfError;
use dcpi_report::report::SymbolMode;

/// One `dcpiprof` run.
#[derive(Clone, Debug)]
pub enum Mode {
    /// `--generate`: a man page or shell completions.
    Generate(Generate),
    /// `--cache-binary FILE...`: copy binaries into `<db>/binaries`.
    CacheBinaries(CacheBinaries),
    /// The per-image report (no `--image`).
    Images(Images),
    /// The per-symbol (or per-line) report of one image (`--image`).
    Symbols(Symbols),
    /// The hottest symbols of all images (`--symbols`, or `--by symbol` without `--image`).
    GlobalSymbols(GlobalSymbols),
    /// A report from the who tables (`--by command|pid|cgroup|unit|container|cpu`, or any
    /// `--by` with `--command`/`--cgroup`/`--pid`/`--cpu`).
    Who(Who),
    /// `--by epoch|host`: one row per epoch or host.
    Trend(Trend),
    /// `--by time`: one row per time bucket, from the time slices.
    Timeline(Timeline),
    /// `--callers`/`--callees`: call stacks around one function.
    Calls(Calls),
    /// `--stack-health`: per image, the share of stacks that ended early.
    StackHealth(StackHealth),
    /// `--format folded|pprof|svg|html|speedscope`.
    Export(Export),
}

/// What `--format` asks for: a report table or an export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Table(TableFormat),
    Export(ExportFormat),
}

impl Format {
    /// The report table or export format this `--format` names.
    pub fn split(self) -> Output {
        match self {
            Self::Table => Output::Table(TableFormat::Table),
            Self::Json => Output::Table(TableFormat::Json),
            Self::Csv => Output::Table(TableFormat::Csv),
            Self::Folded => Output::Export(ExportFormat::Folded),
            Self::Pprof => Output::Export(ExportFormat::Pprof),
            Self::Svg => Output::Export(ExportFormat::Svg),
            Self::Html => Output::Export(ExportFormat::Html),
            Self::Speedscope => Output::Export(ExportFormat::Speedscope),
        }
    }
}

impl From<TableFormat> for Format {
    fn from(f: TableFormat) -> Self {
        match f {
            TableFormat::Table => Self::Table,
            TableFormat::Json => Self::Json,
            TableFormat::Csv => Self::Csv,
        }
    }
}

impl From<ExportFormat> for Format {
    fn from(f: ExportFormat) -> Self {
        match f {
            ExportFormat::Folded => Self::Folded,
            ExportFormat::Pprof => Self::Pprof,
            ExportFormat::Svg => Self::Svg,
            ExportFormat::Html => Self::Html,
            ExportFormat::Speedscope => Self::Speedscope,
        }
    }
}

/// `--cache-binary`.
#[derive(Clone, Debug)]
pub struct CacheBinaries {
    pub db: PathBuf,
    pub files: Vec<PathBuf>,
}

/// The profiles a report over profiles reads.
#[derive(Clone, Debug)]
pub struct Profiles {
    pub sel: Selection,
    /// `--pid`/`--cgroup`: that process's or cgroup's profiles instead of the flat ones.
    pub who: Option<WhoSel>,
    /// `--no-idle`.
    pub no_idle: bool,
}

/// The per-image report.
#[derive(Clone, Debug)]
pub struct Images {
    pub sel: Selection,
    pub no_idle: bool,
    /// `--by image` with `--pid`/`--cgroup`: from that process's or cgroup's profiles, or,
    /// where none of their kind was recorded, from the who tables (which answer it too).
    pub who: Option<WhoImages>,
    pub limit: Option<usize>,
    pub format: TableFormat,
    pub verbose: bool,
}

/// `--by image` with `--pid`/`--cgroup`.
#[derive(Clone, Debug)]
pub struct WhoImages {
    pub who: WhoSel,
    /// The answer when the selection holds no per-process (per-cgroup) profile.
    pub tables: Who,
}

/// The per-symbol report of one image.
#[derive(Clone, Debug)]
pub struct Symbols {
    pub profiles: Profiles,
    /// `--image`.
    pub image: String,
    pub symbols: SymbolSearch,
    pub mode: SymbolMode,
    pub limit: Option<usize>,
    pub format: TableFormat,
    pub verbose: bool,
}

/// The hottest symbols of all images.
#[derive(Clone, Debug)]
pub struct GlobalSymbols {
    pub profiles: Profiles,
    pub symbols: SymbolSearch,
    pub limit: Option<usize>,
    pub format: TableFormat,
    pub verbose: bool,
}

/// An export.
#[derive(Clone, Debug)]
pub struct Export {
    pub profiles: Profiles,
    pub format: ExportFormat,
    /// `--image`: that image's samples only (and the stacks whose leaf is in it).
    pub image: Option<String>,
    pub symbols: SymbolSearch,
    pub mode: SymbolMode,
    /// `--limit` (rows of the HTML report's tables).
    pub limit: Option<usize>,
    pub verbose: bool,
    /// `--command`: the call stacks of that command only (FORMAT.md §13 keeps a command per
    /// stack); flat samples, which do not know their command, are left out.
    pub command: Option<String>,
}

fn usage(msg: impl Into<String>) -> ProfError {
    ProfError::Usage(msg.into())
}

/// The who filters given, as their flags (`--command`, ...), for messages.
fn filter_flags(a: &Args) -> Vec<&'static str> {
    [
        ("--command", a.command.is_some()),
        ("--thread", a.thread.is_some()),
        ("--cgroup", a.cgroup.is_some()),
        ("--pid", a.pid.is_some()),
        ("--cpu", a.cpu.is_some()),
    ]
    .into_iter()
    .filter_map(|(f, on)| on.then_some(f))
    .collect()
}

/// `--format NAME` as the user wrote it.
pub(crate) fn format_flag(f: ExportFormat) -> String {
    use clap::ValueEnum;
    let name = f.to_possible_value().map_or_else(String::new, |v| v.get_name().to_owned());
    format!("--format {name}")
}

impl Mode {
    /// The run `a` asks for, every flag checked against the others.
    pub fn from_args(a: &Args) -> Result<Self, ProfError> {
        if let Some(g) = a.generate {
            return Ok(Self::Generate(g));
        }
        if !a.cache_binary.is_empty() {
            return Ok(Self::CacheBinaries(CacheBinaries {
                db: a.sel.db.clone(),
                files: a.cache_binary.clone(),
            }));
        }
        let output = a.format.split();
        let calls = match (&a.callers, &a.callees) {
            (Some(s), _) => Some((s.clone(), Direction::Callers)),
            (None, Some(s)) => Some((s.clone(), Direction::Callees)),
            (None, None) => None,
        };
        let filters = filter_flags(a);
        // Stack files keep each stack's command, not its pid, cgroup or CPU (FORMAT.md §13).
        let not_per_stack = filters.iter().find(|f| **f != "--command");
        if let (Some((_, dir)), Some(f)) = (&calls, not_per_stack) {
            let flag = match dir {
                Direction::Callers => "--callers",
                Direction::Callees => "--callees",
            };
            return Err(usage(format!(
                "{flag} reads the call stacks, which keep the command that ran each stack but \
                 not its process, cgroup or CPU: it cannot be filtered by {f} (use --command)"
            )));
        }
        // --command with an export (and no other who flag): the stacks of that command.
        let stacks_of_command = a.command.is_some()
            && filters.len() == 1
            && a.by.is_none()
            && matches!(output, Output::Export(_));
        let symbol_mode = SymbolMode { inlines: a.inlines, lines: a.lines, raw_names: a.raw_names };
        if a.stack_health {
            if let Some(f) = filters.first() {
                return Err(usage(format!(
                    "--stack-health reads the call stacks of every process: it cannot be \
                     filtered by {f} (the stack files are not per process)"
                )));
            }
            let format = match output {
                Output::Table(f) => f,
                Output::Export(e) => {
                    return Err(usage(format!(
                        "--stack-health prints a table, json or csv, not {}",
                        format_flag(e)
                    )))
                }
            };
            return Ok(Self::StackHealth(StackHealth {
                sel: a.sel.clone(),
                symbols: a.symbols.clone(),
                mode: SymbolMode { lines: false, inlines: false, ..symbol_mode },
                limit: a.limit,
                format,
            }));
        }

        if a.resolution.is_some() && a.by != Some(By::Time) {
            return Err(usage("--resolution sets the buckets of --by time: add --by time"));
        }
        if a.by == Some(By::Time) {
            return timeline(a, &filters, output, symbol_mode).map(Self::Timeline);
        }
        if a.thread.is_some() || a.threads {
            return thread_report(a, output).map(Self::Who);
        }
        // --pid/--cgroup with a profile report: the per-process/per-cgroup profiles stand in
        // for the flat ones; every other who report comes from the who tables.
        let who = who_selection(a, output)?;
        let calls_or_stacks = calls.is_some() || stacks_of_command;
        if who.is_none()
            && ((!filters.is_empty() && !calls_or_stacks) || a.by.is_some_and(By::is_who))
        {
            return Ok(Self::Who(who_tables(a, a.by.unwrap_or(By::Image), output)?));
        }
        if let Some((symbol, direction)) = calls {
            let format = match output {
                Output::Table(f) => f,
                Output::Export(e) => {
                    return Err(usage(format!(
                        "--callers/--callees print a table, json or csv, not {} (for stacks in \
                         folded, pprof, svg or html drop --callers/--callees)",
                        format_flag(e)
                    )))
                }
            };
            return Ok(Self::Calls(Calls {
                sel: a.sel.clone(),
                symbol,
                direction,
                depth: usize::from(a.depth),
                symbols: a.symbols.clone(),
                mode: SymbolMode { lines: false, ..symbol_mode },
                limit: a.limit,
                format,
                image: a.image.clone(),
                command: a.command.clone(),
            }));
        }
        let across = match a.by {
            Some(By::Image) if a.image.is_some() => {
                return Err(usage(
                    "--by image reports every image: drop --image, or use --by symbol",
                ))
            }
            Some(By::Epoch) => Some(Across::Epoch),
            Some(By::Host) => Some(Across::Host),
            Some(
                By::Image
                | By::Symbol
                | By::Command
                | By::Pid
                | By::Cgroup
                | By::Unit
                | By::Container
                | By::Cpu
                | By::Time,
            )
            | None => None,
        };
        if a.symbol.is_some() && across.is_none() {
            return Err(usage(
                "--symbol makes a trend of one function: use it with --by epoch, --by host or \
                 --by time",
            ));
        }
        if let Some(across) = across {
            let format = match output {
                Output::Table(f) => f,
                Output::Export(e) => {
                    return Err(usage(format!(
                        "--by {} prints a table, json or csv: {} is an export of the samples \
                         (drop --by to export)",
                        across.name(),
                        format_flag(e)
                    )))
                }
            };
            return Ok(Self::Trend(Trend {
                sel: a.sel.clone(),
                across,
                focus: focus(a, symbol_mode, format),
            }));
        }
        let profiles = Profiles { sel: a.sel.clone(), who: who.clone(), no_idle: a.no_idle };
        // `--by symbol` without --image is --symbols.
        let global = a.all_symbols || (a.by == Some(By::Symbol) && a.image.is_none());
        Ok(match (output, &a.image) {
            (Output::Export(format), image) => Self::Export(Export {
                profiles,
                format,
                image: image.clone(),
                symbols: a.symbols.clone(),
                mode: symbol_mode,
                limit: a.limit,
                verbose: a.verbose,
                command: if stacks_of_command { a.command.clone() } else { None },
            }),
            (Output::Table(format), Some(image)) => Self::Symbols(Symbols {
                profiles,
                image: image.clone(),
                symbols: a.symbols.clone(),
                mode: symbol_mode,
                limit: a.limit,
                format,
                verbose: a.verbose,
            }),
            (Output::Table(format), None) if global => Self::GlobalSymbols(GlobalSymbols {
                profiles,
                symbols: a.symbols.clone(),
                limit: a.limit,
                format,
                verbose: a.verbose,
            }),
            (Output::Table(format), None) => {
                let who = match who {
                    Some(who) => {
                        let tables = who_tables(a, By::Image, output)?;
                        Some(WhoImages { who, tables })
                    }
                    None => None,
                };
                Self::Images(Images {
                    sel: a.sel.clone(),
                    no_idle: a.no_idle,
                    who,
                    limit: a.limit,
                    format,
                    verbose: a.verbose,
                })
            }
        })
    }
}

/// `--by time`, its flags checked. The slices count samples per image and offset, not per
/// process, cgroup or CPU: a who filter is a usage error naming it (the who tables give
/// per-epoch trends of those: `--by epoch --command NAME`).
fn timeline(
    a: &Args,
    filters: &[&'static str],
    output: Output,
    mode: SymbolMode,
) -> Result<Timeline, ProfError> {
    if let Some(f) = filters.first() {
        return Err(usage(format!(
            "--by time reads the time slices (slices.log), which count samples per image and \
             offset, not per process, cgroup or CPU: it cannot be filtered by {f} (for a trend \
             of {f} over epochs use --by epoch {f} ...)"
        )));
    }
    let format = match output {
        Output::Table(f) => f,
        Output::Export(e) => {
            return Err(usage(format!(
                "--by time prints a table, json or csv, not {} (the html export charts the \
                 timeline itself: drop --by time)",
                format_flag(e)
            )))
        }
    };
    Ok(Timeline { sel: a.sel.clone(), resolution: a.resolution, focus: focus(a, mode, format) })
}

/// The [`Focus`] of a `--by epoch|host|time` report: per-line names are not shown in a trend.
fn focus(a: &Args, mode: SymbolMode, format: TableFormat) -> Focus {
    Focus {
        image: a.image.clone(),
        symbol: a.symbol.clone(),
        symbols: a.symbols.clone(),
        mode: SymbolMode { lines: false, ..mode },
        no_idle: a.no_idle,
        format,
        verbose: a.verbose,
    }
}

/// `--pid`, `--cgroup` or `--command` (one of them, and without `--cpu`, which only the who
/// tables answer) with `--by symbol`, `--by image`, `--image`, `--symbols` or an export: the
/// profiles of that process, cgroup or command. `None`: not such a report.
fn who_selection(a: &Args, output: Output) -> Result<Option<WhoSel>, ProfError> {
    let given: Vec<WhoSel> = [
        a.pid.map(WhoSel::Pid),
        a.cgroup.clone().map(WhoSel::Cgroup),
        a.command.clone().map(WhoSel::Command),
    ]
    .into_iter()
    .flatten()
    .collect();
    let profile_report = match a.by {
        Some(By::Symbol | By::Image) => true,
        None => a.image.is_some() || a.all_symbols || matches!(output, Output::Export(_)),
        Some(
            By::Command
            | By::Pid
            | By::Cgroup
            | By::Unit
            | By::Container
            | By::Cpu
            | By::Host
            | By::Epoch
            | By::Time,
        ) => false,
    };
    let who = match given.len() {
        0 => return Ok(None),
        1 => given.into_iter().next(),
        _ if a.by == Some(By::Symbol) || (profile_report && a.command.is_some()) => {
            return Err(usage(
                "--by symbol, --image, --symbols and the exports read the per-process, the \
                 per-cgroup or the per-command profiles: give one of --pid, --cgroup and \
                 --command, not several (the who tables combine them: --by \
                 command|pid|cgroup|unit|container|image)",
            ));
        }
        // --pid with --cgroup otherwise: the who tables answer it.
        _ => return Ok(None),
    };
    if !profile_report {
        return Ok(None);
    }
    if a.cpu.is_some() {
        return Err(usage(
            "--cpu filters the who tables only (--by cpu): a per-process, per-cgroup or \
             per-command profile report takes --pid, --cgroup or --command alone",
        ));
    }
    Ok(who)
}

/// `--thread NAME` or `--threads`: a who report over the tables' thread rows, which are per
/// (cgroup, command, pid, event) only.
fn thread_report(a: &Args, output: Output) -> Result<Who, ProfError> {
    let flag = if a.thread.is_some() { "--thread" } else { "--threads" };
    let by = a.by.unwrap_or(By::Command);
    if a.threads && by != By::Command {
        return Err(usage(format!(
            "--threads shows the thread names under each command: it goes with --by command, \
             not --by {}",
            by.name()
        )));
    }
    let per_thread = matches!(
        by,
        By::Command | By::Pid | By::Cgroup | By::Unit | By::Container | By::Host | By::Epoch
    );
    if !per_thread || a.image.is_some() || a.cpu.is_some() || a.all_symbols {
        return Err(usage(format!(
            "{flag} reads the who tables' thread rows, which are per command, process and \
             cgroup, not per image, symbol, CPU or time (dcpid records no per-thread profiles): \
             use --by command|pid|cgroup|unit|container|host|epoch without --image, --cpu or \
             --symbols"
        )));
    }
    who_tables(a, by, output)
}

/// A report from the who tables, its flags checked.
fn who_tables(a: &Args, by: By, output: Output) -> Result<Who, ProfError> {
    let Some(by) = WhoBy::new(by) else {
        return Err(usage(if by == By::Time {
            "--by time reads the time slices, which have no per-process counts: it cannot \
             be filtered by --command/--cgroup/--pid/--cpu"
        } else {
            "--by symbol with --command/--cgroup/--pid/--cpu: the who table has no \
             per-process symbols; use --by command|pid|cgroup|unit|container|image|cpu|host|\
             epoch"
        }));
    };
    if a.cpu.is_some() && by != By::Cpu {
        return Err(usage(
            "--cpu filters only --by cpu: per-CPU counts are recorded per event, not per process",
        ));
    }
    if by == By::Cpu && (a.command.is_some() || a.cgroup.is_some() || a.pid.is_some()) {
        return Err(usage(
            "--by cpu cannot be filtered by --command/--cgroup/--pid: per-CPU counts are \
             recorded per event, not per process",
        ));
    }
    // What made this a who report, for messages.
    let mut what: Vec<String> = filter_flags(a).into_iter().map(String::from).collect();
    if let Some(b) = a.by {
        what.insert(0, format!("--by {}", b.name()));
    }
    let what = what.join(" with ");
    if a.symbol.is_some() {
        return Err(usage(format!(
            "--symbol needs the profiles, but {what} reads the who tables, which have no \
             per-function counts"
        )));
    }
    let format = match output {
        Output::Table(f) => f,
        Output::Export(e) => {
            return Err(usage(format!(
                "{what} reads the who tables, which hold counts, not samples: it prints a \
                 table, json or csv, not {}",
                format_flag(e)
            )));
        }
    };
    Ok(Who {
        sel: a.sel.clone(),
        by,
        filters: WhoFilters {
            command: a.command.clone(),
            thread: a.thread.clone(),
            cgroup: a.cgroup.clone(),
            pid: a.pid,
            cpu: a.cpu,
            image: a.image.clone(),
        },
        threads: a.threads,
        no_idle: a.no_idle,
        limit: a.limit,
        format,
    })
}

#[cfg(test)]
mod tests {
    use clap::builder::PossibleValue;
    use clap::Parser;

    use super::*;

    fn mode(args: &[&str]) -> Result<Mode, ProfError> {
        let mut argv = vec!["dcpiprof"];
        argv.extend_from_slice(args);
        Mode::from_args(&Args::try_parse_from(argv).expect("clap accepts these flags"))
    }

    fn ok(args: &[&str]) -> Mode {
        mode(args).unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// A usage error (exit status 2) whose message names every flag in `flags`.
    fn rejected(args: &[&str], flags: &[&str]) {
        match mode(args) {
            Err(e @ ProfError::Usage(_)) => {
                assert_eq!(e.exit_code(), 2);
                let m = e.to_string();
                for f in flags {
                    assert!(m.contains(f), "{args:?}: the error names {f}: {m}");
                }
            }
            Err(e) => panic!("{args:?}: not a usage error: {e}"),
            Ok(m) => panic!("{args:?}: accepted as {m:?}"),
        }
    }

    #[test]
    fn every_report_is_reachable() {
        assert!(matches!(ok(&["--generate", "man"]), Mode::Generate(Generate::Man)));
        match ok(&["--cache-binary", "/bin/true", "--db", "/d"]) {
            Mode::CacheBinaries(c) => {
                assert_eq!(c.files, [PathBuf::from("/bin/true")]);
                assert_eq!(c.db, PathBuf::from("/d"));
            }
            m => panic!("{m:?}"),
        }
        match ok(&["--limit", "3", "--format", "csv", "--no-idle"]) {
            Mode::Images(i) => {
                assert!(i.who.is_none() && i.no_idle && i.limit == Some(3));
                assert_eq!(i.format, TableFormat::Csv);
            }
            m => panic!("{m:?}"),
        }
        assert!(matches!(ok(&["--by", "image"]), Mode::Images(Images { who: None, .. })));
        match ok(&["--pid", "7", "--by", "image"]) {
            Mode::Images(Images { who: Some(w), .. }) => {
                assert_eq!(w.who, WhoSel::Pid(7));
                assert_eq!(w.tables.by, By::Image);
                assert_eq!(w.tables.filters.pid, Some(7));
            }
            m => panic!("{m:?}"),
        }
        match ok(&["--image", "app", "--lines", "--raw-names", "--format", "json"]) {
            Mode::Symbols(s) => {
                assert_eq!(s.image, "app");
                assert!(s.mode.lines && s.mode.raw_names && !s.mode.inlines);
                assert_eq!(s.format, TableFormat::Json);
                assert!(s.profiles.who.is_none());
            }
            m => panic!("{m:?}"),
        }
        match ok(&["--cgroup", "/a", "--by", "symbol", "--image", "app"]) {
            Mode::Symbols(s) => assert_eq!(s.profiles.who, Some(WhoSel::Cgroup("/a".into()))),
            m => panic!("{m:?}"),
        }
        assert!(matches!(ok(&["--symbols"]), Mode::GlobalSymbols(_)));
        match ok(&["--pid", "3", "--by", "symbol"]) {
            Mode::GlobalSymbols(g) => assert_eq!(g.profiles.who, Some(WhoSel::Pid(3))),
            m => panic!("{m:?}"),
        }
        for by in ["command", "pid", "cgroup", "unit", "container", "cpu"] {
            match ok(&["--by", by]) {
                Mode::Who(w) => assert_eq!(w.by.name(), by),
                m => panic!("--by {by}: {m:?}"),
            }
        }
        // --command with a profile report: the per-command profiles (dcpid's by_command).
        match ok(&["--command", "nginx", "--image", "libc"]) {
            Mode::Symbols(s) => {
                assert_eq!(s.image, "libc");
                assert_eq!(s.profiles.who, Some(WhoSel::Command("nginx".into())));
            }
            m => panic!("{m:?}"),
        }
        match ok(&["--command", "nginx", "--by", "symbol"]) {
            Mode::GlobalSymbols(g) => {
                assert_eq!(g.profiles.who, Some(WhoSel::Command("nginx".into())));
            }
            m => panic!("{m:?}"),
        }
        match ok(&["--command", "nginx", "--by", "image"]) {
            Mode::Images(Images { who: Some(w), .. }) => {
                assert_eq!(w.who, WhoSel::Command("nginx".into()));
                assert_eq!(w.tables.filters.command.as_deref(), Some("nginx"));
            }
            m => panic!("{m:?}"),
        }
        // --command alone, or with a who dimension: the who tables.
        match ok(&["--command", "nginx"]) {
            Mode::Who(w) => assert_eq!(w.filters.command.as_deref(), Some("nginx")),
            m => panic!("{m:?}"),
        }
        // --pid with a who dimension reads the who tables, not the per-process profiles.
        assert!(matches!(ok(&["--pid", "1", "--by", "epoch"]), Mode::Who(_)));
        match ok(&["--by", "epoch", "--image", "app", "--symbol", "main"]) {
            Mode::Trend(t) => {
                assert_eq!(t.across, Across::Epoch);
                assert_eq!(t.focus.symbol.as_deref(), Some("main"));
            }
            m => panic!("{m:?}"),
        }
        assert!(matches!(ok(&["--by", "host"]), Mode::Trend(Trend { across: Across::Host, .. })));
        match ok(&["--callees", "f", "--depth", "3", "--lines"]) {
            Mode::Calls(c) => {
                assert_eq!((c.symbol.as_str(), c.direction, c.depth), ("f", Direction::Callees, 3));
                assert!(!c.mode.lines, "call reports are by function");
            }
            m => panic!("{m:?}"),
        }
        assert!(matches!(ok(&["--callers", "f"]), Mode::Calls(_)));
        match ok(&["--stack-health", "--format", "csv", "--limit", "4"]) {
            Mode::StackHealth(h) => {
                assert_eq!((h.format, h.limit), (TableFormat::Csv, Some(4)));
            }
            m => panic!("{m:?}"),
        }
        // Stacks keep their command: --callers/--callees narrow by --image and --command.
        match ok(&["--callers", "hot", "--image", "a", "--command", "a"]) {
            Mode::Calls(c) => {
                assert_eq!((c.image.as_deref(), c.command.as_deref()), (Some("a"), Some("a")))
            }
            m => panic!("{m:?}"),
        }
        // An export of a command: its per-command profiles, its stacks replacing them.
        match ok(&["--command", "a", "--format", "folded"]) {
            Mode::Export(x) => {
                assert_eq!(x.command.as_deref(), Some("a"));
                assert_eq!(x.profiles.who, Some(WhoSel::Command("a".into())));
            }
            m => panic!("{m:?}"),
        }
        match ok(&["--by", "time", "--resolution", "5m", "--image", "a", "--symbol", "f"]) {
            Mode::Timeline(t) => {
                assert_eq!(t.resolution, Some(300));
                assert_eq!(
                    (t.focus.image.as_deref(), t.focus.symbol.as_deref()),
                    (Some("a"), Some("f"))
                );
            }
            m => panic!("{m:?}"),
        }
        match ok(&["--by", "time", "--format", "csv", "--no-idle"]) {
            Mode::Timeline(t) => assert!(t.resolution.is_none() && t.focus.no_idle),
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn every_export_format_is_reachable() {
        use clap::ValueEnum;
        for &f in ExportFormat::ALL {
            let name = f.to_possible_value().expect("named").get_name().to_owned();
            match ok(&["--format", &name]) {
                Mode::Export(x) => {
                    assert_eq!(x.format, f);
                    assert!(x.image.is_none() && x.profiles.who.is_none());
                }
                m => panic!("--format {name}: {m:?}"),
            }
            for extra in [&["--symbols"][..], &["--by", "image"], &["--by", "symbol"]] {
                let mut args = vec!["--format", &name];
                args.extend_from_slice(extra);
                assert!(matches!(ok(&args), Mode::Export(_)), "{args:?}");
            }
            match ok(&["--format", &name, "--image", "app", "--pid", "4"]) {
                Mode::Export(x) => {
                    assert_eq!(x.image.as_deref(), Some("app"));
                    assert_eq!(x.profiles.who, Some(WhoSel::Pid(4)));
                }
                m => panic!("{m:?}"),
            }
            match ok(&["--format", &name, "--command", "nginx"]) {
                Mode::Export(x) => {
                    assert_eq!(x.profiles.who, Some(WhoSel::Command("nginx".into())));
                    assert_eq!(x.command.as_deref(), Some("nginx"));
                }
                m => panic!("{m:?}"),
            }
        }
    }

    #[test]
    fn every_format_splits_into_a_table_or_an_export_of_the_same_name() {
        use clap::ValueEnum;
        let name = |v: Option<PossibleValue>| v.expect("named").get_name().to_owned();
        let mut exports = Vec::new();
        for f in Format::value_variants() {
            let split = match f.split() {
                Output::Table(t) => {
                    assert_eq!(Format::from(t), *f);
                    name(t.to_possible_value())
                }
                Output::Export(e) => {
                    assert_eq!(Format::from(e), *f);
                    exports.push(e);
                    name(e.to_possible_value())
                }
            };
            assert_eq!(split, name(f.to_possible_value()));
        }
        assert_eq!(exports, ExportFormat::ALL, "--format offers every export, in ALL's order");
    }

    #[test]
    fn conflicting_flags_are_usage_errors_naming_them() {
        rejected(&["--by", "image", "--image", "app"], &["--by image", "--image"]);
        rejected(&["--pid", "1", "--by", "image", "--image", "app"], &["--by image", "--image"]);
        rejected(
            &["--pid", "1", "--cgroup", "/", "--by", "symbol"],
            &["--by symbol", "--pid", "--cgroup"],
        );
        rejected(&["--pid", "1", "--command", "x", "--image", "a"], &["--command", "--pid"]);
        rejected(&["--cgroup", "/", "--cpu", "1", "--symbols"], &["--cpu", "--cgroup"]);
        rejected(&["--command", "x", "--cgroup", "/", "--symbols"], &["--command", "--cgroup"]);
        rejected(&["--cpu", "1", "--by", "command"], &["--cpu", "--by cpu"]);
        rejected(&["--cpu", "1"], &["--cpu", "--by cpu"]);
        rejected(&["--by", "cpu", "--pid", "1"], &["--by cpu", "--pid"]);
        rejected(&["--callers", "f", "--format", "svg"], &["--callers", "--format"]);
        rejected(&["--callees", "f", "--format", "pprof"], &["--callees", "--format"]);
        rejected(&["--callers", "f", "--pid", "1"], &["--callers", "--pid"]);
        rejected(&["--stack-health", "--format", "svg"], &["--stack-health", "--format svg"]);
        rejected(&["--stack-health", "--pid", "3"], &["--stack-health", "--pid"]);
        rejected(&["--callees", "f", "--cgroup", "/x"], &["--callees", "--cgroup", "--command"]);
        rejected(&["--callers", "f", "--cpu", "0"], &["--callers", "--cpu"]);
        rejected(&["--by", "epoch", "--format", "svg"], &["--by epoch", "--format svg"]);
        rejected(&["--by", "host", "--format", "html"], &["--by host", "--format html"]);
        rejected(&["--by", "command", "--format", "folded"], &["--by command", "--format folded"]);
        rejected(
            &["--command", "x", "--by", "command", "--format", "speedscope"],
            &["--by command", "--format speedscope"],
        );
        rejected(
            &["--command", "x", "--by", "epoch", "--image", "a", "--symbol", "f"],
            &["--symbol", "--command"],
        );
        rejected(
            &["--by", "symbol", "--image", "a", "--symbol", "f"],
            &["--symbol", "--by epoch", "--by host", "--by time"],
        );
        for f in ["--command", "--cgroup", "--pid", "--cpu"] {
            rejected(&["--by", "time", f, "1"], &["--by time", f]);
        }
        rejected(&["--by", "time", "--format", "html"], &["--by time", "--format html"]);
        rejected(&["--resolution", "1m"], &["--resolution", "--by time"]);
        rejected(&["--by", "epoch", "--resolution", "1m"], &["--resolution", "--by time"]);
    }
}
