//! `dcpiprof`: reports read straight from the profile database (no daemon needed).
//!
//! * [`select`] picks epochs and host directories and loads profiles and summaries;
//! * [`report`] weights and aggregates them into per-image or per-symbol reports;
//! * [`symbolize`] and [`debuginfo`] turn stored offsets into symbols, finding the exact build
//!   of each binary and its separate debug information;
//! * [`output`] renders a table, JSON or CSV;
//! * [`export`] writes pprof, folded stacks, a flame graph SVG or an HTML report.
//!
//! # JSON schema (`--format json`)
//!
//! See [`SCHEMA`]; it is also printed by `dcpiprof --help`.

pub mod by;
pub mod cli;
pub use dcpi_report::debuginfo;
pub use dcpi_report::elfparts;
pub use dcpi_report::error;
pub mod export;
pub mod global;
pub mod health;
pub use dcpi_report::image;
pub use dcpi_report::names;
pub mod mode;
pub mod output;
pub use dcpi_report::report;
pub use dcpi_report::select;
pub mod stacks;
pub use dcpi_report::stats;
pub mod subset;
pub mod timeline;
pub use dcpi_report::symbolize;
pub use dcpi_report::symbolizer;
pub use dcpi_report::symcache;
pub mod who;
pub mod whoprof;

use std::io::{IsTerminal, Write};
use std::path::Path;

use clap::CommandFactory;

use self::mode::{Mode, Profiles};
use self::output::TableFormat;
use crate::args::Selection;
use crate::args::SymbolSearch;
use crate::manpages;
use crate::notes;
pub use cli::{Args, SCHEMA};
pub use dcpi_report::error::ProfError;
use dcpi_report::escape::terminal as esc;
use dcpi_report::image::ImageFilter;
use dcpi_report::report::SymbolContext;

pub use dcpi_manpage::Generate;
use dcpi_report::escape;

/// Run `dcpiprof` with parsed arguments, writing the report to `out` (or `--output`) and
/// warnings to `err`. Errors are returned (not printed).
pub fn run(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), ProfError> {
    notes::set_verbose(args.verbose);
    // Every flag is checked against the others before anything is read.
    let mode = Mode::from_args(args)?;
    // A person at a terminal: grouped digits, and no binary export.
    let tty = args.output.is_none() && std::io::stdout().is_terminal();
    let Some(path) = &args.output else { return run_mode(&mode, tty, out, err) };
    // Fail before a long export, not after it.
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if !dir.is_dir() || path.is_dir() {
        let what = if path.is_dir() { "is a directory" } else { "its directory does not exist" };
        return Err(ProfError::Usage(format!("cannot write --output {}: {what}", path.display())));
    }
    let mut buf = Vec::new();
    run_mode(&mode, tty, &mut buf, err)?;
    // O_EXCL under an unpredictable name, then rename: never through a link planted in a
    // shared directory (a link at PATH itself is replaced, its target never written).
    profile_format::write_atomic(path, &buf).map_err(|e| ProfError::OutputFile {
        path: path.to_owned(),
        source: match e {
            profile_format::Error::Io { source, .. } => source,
            other => std::io::Error::new(std::io::ErrorKind::InvalidInput, other.to_string()),
        },
    })?;
    if args.verbose {
        writeln!(err, "dcpiprof: wrote {} ({} bytes)", path.display(), buf.len())?;
    }
    Ok(())
}

/// Run one [`Mode`] (as [`Mode::from_args`] chose it). `tty`: `out` is a terminal.
pub fn run_mode(
    mode: &Mode,
    tty: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ProfError> {
    match mode {
        Mode::Generate(g) => Ok(manpages::generate(Args::command(), *g, out)?),
        Mode::CacheBinaries(c) => cache_binaries(c, out),
        Mode::Images(p) => run_images(p, tty, out, err),
        Mode::Symbols(p) => run_symbols(p, tty, out, err),
        Mode::GlobalSymbols(p) => run_global_symbols(p, tty, out, err),
        Mode::Who(p) => who::run(p, out, err),
        Mode::Trend(p) => by::run_by(p, out, err),
        Mode::Timeline(p) => timeline::run(p, tty, out, err),
        Mode::Calls(p) => run_calls(p, out, err),
        Mode::StackHealth(p) => run_stack_health(p, out, err),
        Mode::Export(p) => run_export(p, tty, out, err),
    }
}

/// `--cache-binary`: copy each file into `<db>/binaries`, named by its build-id.
fn cache_binaries(c: &mode::CacheBinaries, out: &mut dyn Write) -> Result<(), ProfError> {
    let root = c.db.join("binaries");
    for f in &c.files {
        let dest = debuginfo::cache_binary(f, &root)?;
        writeln!(out, "{} -> {}", f.display(), dest.display())?;
    }
    Ok(())
}

impl Profiles {
    /// Read the profiles with their weights: only `image`'s (`--image`, unless per process
    /// or cgroup), every profile's counts kept when `all_counts`.
    fn load(
        &self,
        image: Option<&str>,
        all_counts: bool,
        warnings: &mut Vec<String>,
        err: &mut dyn Write,
    ) -> Result<(select::Loaded, report::Weights), ProfError> {
        let mut loaded = if let Some(w) = &self.who {
            whoprof::load(&self.sel, w, &mut |w| warnings.push(w))?
        } else if all_counts {
            self.sel.load_all_counts(&mut |w| warnings.push(w))?
        } else {
            let filter = image.map(ImageFilter::new);
            self.sel.load(filter.as_ref(), &mut |w| warnings.push(w))?
        };
        if self.no_idle {
            loaded.exclude_idle();
        }
        if loaded.profiles.is_empty() && image.is_none() {
            flush_warnings(err, warnings)?;
            return Err(nothing_sampled(&loaded.dirs));
        }
        let weights = report::weights(&loaded, &self.sel.events).map_err(|e| match (e, image) {
            (ProfError::UnknownEvent { event, available, .. }, Some(spec)) => {
                ProfError::UnknownEvent {
                    event,
                    available,
                    scope: format!("the profiles of --image {spec:?}"),
                }
            }
            (e, _) => e,
        })?;
        Ok((loaded, weights))
    }
}

/// `--verbose`: what the report read.
fn print_stats(verbose: bool, err: &mut dyn Write) -> std::io::Result<()> {
    if verbose {
        writeln!(err, "dcpiprof: stats: {}", stats::line())?;
    }
    Ok(())
}

/// Write a report's table (styled for a terminal when `tty`), then the `--verbose` statistics.
fn finish_table(
    out: &mut dyn Write,
    err: &mut dyn Write,
    tty: bool,
    verbose: bool,
    write: impl FnOnce(&mut dyn Write, output::Style) -> std::io::Result<()>,
) -> Result<(), ProfError> {
    write(out, output::Style { human: tty, ..Default::default() })?;
    out.flush()?;
    print_stats(verbose, err)?;
    Ok(())
}

/// The error of a selection whose host directories hold no profile.
fn nothing_sampled(dirs: &[profile_format::HostDir]) -> ProfError {
    let (epochs, hosts) = select::epochs_and_hosts(dirs);
    ProfError::Empty(format!(
        "no profiles in epoch(s) {} for host(s) {}: nothing sampled yet (wait for the daemon's \
         flush interval or run `dcpictl flush`), or pick another --epoch",
        epochs.join(","),
        hosts.join(",")
    ))
}

/// The per-image report of the current epoch when nothing of it is readable yet (right after
/// `dcpictl epoch new` or a scheduled rotation): an empty report that says when data will
/// appear, exit status 0 (issue 36 item 6).
fn empty_current_epoch(
    sel: &Selection,
    format: TableFormat,
    why: &str,
    out: &mut dyn Write,
) -> Result<(), ProfError> {
    let note = format!(
        "nothing sampled in the current epoch yet{}: dcpid appends what it samples to its time \
         slices every slice_interval (1 minute by default), and reports include them without \
         `dcpictl flush`; data appear within one slice plus a flush interval",
        if why.is_empty() { String::new() } else { format!(" ({why})") }
    );
    match format {
        TableFormat::Json => {
            let v = serde_json::json!({
                "report": "images",
                "database": sel.db.display().to_string(),
                "epochs": [],
                "hosts": [],
                "events": [],
                "total_samples": 0,
                "rows_omitted": 0,
                "idle": { "included": true, "percent": 0.0 },
                "rows": [],
                "note": note,
            });
            writeln!(out, "{v}")?;
        }
        TableFormat::Csv => {}
        TableFormat::Table => {
            writeln!(out, "# database: {}", esc(&sel.db.display().to_string()))?;
            writeln!(out, "# {}", esc(&note))?;
            writeln!(out, "# total samples: 0")?;
        }
    }
    out.flush()?;
    Ok(())
}

/// The per-image report. Of the flat profiles, from the per-profile totals (summary indexes
/// where present) rather than loaded profiles: over a fleet that is a few hundred headers,
/// not one per profile.
fn run_images(
    p: &mode::Images,
    tty: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ProfError> {
    let mut warnings: Vec<String> = Vec::new();
    let db_name = p.sel.db.display().to_string();
    let r = match &p.who {
        Some(w) => {
            // The who tables answer --by image too (same samples): without the profiles,
            // use them.
            if !whoprof::recorded(&p.sel, &w.who)? {
                return who::run(&w.tables, out, err);
            }
            let profiles =
                Profiles { sel: p.sel.clone(), who: Some(w.who.clone()), no_idle: p.no_idle };
            let (loaded, weights) = profiles.load(None, false, &mut warnings, err)?;
            flush_warnings(err, &mut warnings)?;
            report::image_report(&loaded, &weights, &db_name, p.limit)
        }
        None => {
            let latest = p.sel.is_latest();
            // A host with no directory in the current epoch stays an error naming where it
            // has data (a typo, another host's rotation); its directory without data yet
            // (right after `dcpictl epoch new`) is the empty report below.
            let mut totals = p.sel.load_totals(&mut |w| warnings.push(w))?;
            if p.no_idle {
                totals.exclude_idle();
            }
            flush_warnings(err, &mut warnings)?;
            if totals.entries.is_empty() {
                if latest {
                    return empty_current_epoch(&p.sel, p.format, "", out);
                }
                return Err(nothing_sampled(&totals.dirs));
            }
            let weights = report::weights_of_totals(&totals, &p.sel.events)?;
            report::image_report_of_totals(&totals, &weights, &db_name, p.limit)
        }
    };
    finish_table(out, err, tty, p.verbose, |o, style| {
        output::write_images(o, &r, p.format.into(), style)
    })
}

/// The per-symbol report of one image.
fn run_symbols(
    p: &mode::Symbols,
    tty: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ProfError> {
    let mut warnings: Vec<String> = Vec::new();
    let (loaded, weights) = p.profiles.load(Some(&p.image), false, &mut warnings, err)?;
    let sel = &p.profiles.sel;
    let idx = report::resolve_image(&loaded, &weights, &p.image)?;
    let mut locator = p.symbols.locator(&sel.db);
    let mut cache = p.symbols.cache(&mut |w| warnings.push(w));
    let r = {
        let cx = SymbolContext {
            loaded: &loaded,
            weights: &weights,
            locator: &mut locator,
            cache: &mut cache,
            mode: p.mode,
            warn: &mut |w| warnings.push(w),
        };
        report::symbol_report(cx, &idx, &sel.db.display().to_string(), p.limit)
    };
    flush_warnings(err, &mut warnings)?;
    if r.total_samples == 0 {
        return Err(ProfError::Empty(format!(
            "image {} has no samples of the selected event(s) in the selected \
             epoch(s)/host(s); try --event, --epoch all or --host all",
            r.image.path
        )));
    }
    finish_table(out, err, tty, p.verbose, |o, style| {
        output::write_symbols(o, &r, p.format.into(), style)
    })
}

/// The hottest symbols of all images.
fn run_global_symbols(
    p: &mode::GlobalSymbols,
    tty: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ProfError> {
    let mut warnings: Vec<String> = Vec::new();
    let (loaded, weights) = p.profiles.load(None, true, &mut warnings, err)?;
    let sel = &p.profiles.sel;
    let mut locator = p.symbols.locator(&sel.db);
    let mut cache = p.symbols.cache(&mut |w| warnings.push(w));
    let r = global::global_symbol_report(
        &loaded,
        &weights,
        &mut locator,
        &mut cache,
        &mut |w| warnings.push(w),
        &sel.db.display().to_string(),
        p.limit,
    );
    flush_warnings(err, &mut warnings)?;
    finish_table(out, err, tty, p.verbose, |o, style| {
        output::write_global_symbols(o, &r, p.format.into(), style)
    })
}

fn run_export(
    p: &mode::Export,
    tty: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ProfError> {
    if p.format.is_binary() && tty {
        return Err(ProfError::Usage(format!(
            "{} writes a binary file: pass --output FILE (or redirect stdout)",
            mode::format_flag(p.format)
        )));
    }
    let mut warnings: Vec<String> = Vec::new();
    // --command: that command's profiles (dcpid's by_command, the default), its call stacks
    // replacing them where recorded. A database recorded without them (older dcpid, or
    // by_command = false) keeps the earlier answer: the command's call stacks only.
    let mut profiles = p.profiles.clone();
    if let Some(whoprof::WhoSel::Command(_)) = &profiles.who {
        if !whoprof::recorded(&profiles.sel, profiles.who.as_ref().expect("matched"))? {
            profiles.who = None;
        }
    }
    let per_command =
        profiles.who.as_ref().is_some_and(|w| matches!(w, whoprof::WhoSel::Command(_)));
    let p = &mode::Export { profiles, ..p.clone() };
    let (mut loaded, weights) =
        p.profiles.load(p.image.as_deref(), p.image.is_none(), &mut warnings, err)?;
    let loaded = &mut loaded;
    let sel = &p.profiles.sel;
    let only = match &p.image {
        Some(spec) => Some(report::resolve_image(loaded, &weights, spec)?),
        None => None,
    };
    let req = export::Request {
        db: &sel.db,
        symbols: &p.symbols,
        mode: p.mode,
        only,
        keep_going: sel.keep_going,
    };
    let mut x = export::build(loaded, &weights, &req, &mut |w| warnings.push(w))?;
    // The stack files keep each stack's command but not its process or cgroup (FORMAT.md
    // §13): with --pid/--cgroup the export is of that process's or cgroup's flat samples
    // only; with --command, of that command's samples, its stacks replacing them (without
    // per-command profiles, of its stacks only). Stacks have no time axis: the export of a
    // time range (--since/--until) is of its flat samples, one frame each.
    if sel.time_range().is_some() && p.profiles.who.is_none() {
        warnings.push(
            "--since/--until: call stacks have no time axis (they hold whole-epoch totals): \
             the export has the range's flat samples, one frame each"
                .to_owned(),
        );
    }
    // The time slices count every process's samples: no timeline of one process or cgroup.
    if p.format == export::ExportFormat::Html && p.profiles.who.is_none() {
        x.timeline = timeline::of_export(sel, loaded, &weights, req.only.as_deref(), &mut |w| {
            warnings.push(w);
        });
    }
    if (p.profiles.who.is_none() || per_command) && sel.time_range().is_none() {
        // Call stacks, where dcpid recorded them, replace the one-frame samples.
        // The same binaries are looked up again: say each warning once.
        let mut more: Vec<String> = Vec::new();
        let mut all = stacks::load(
            loaded,
            &weights,
            p.symbols.locator(&sel.db),
            p.symbols.cache(&mut |w| more.push(w)),
            req.mode,
            sel.keep_going,
            stacks::Want::All,
            p.command.as_deref(),
            &mut |w| more.push(w),
        )?;
        for w in more {
            if !warnings.contains(&w) {
                warnings.push(w);
            }
        }
        if let Some(only) = &req.only {
            // With --image, the stacks whose leaf is in the selected image, as `perf script
            // --dsos` keeps the samples taken there: they replace exactly its flat samples.
            let leaf_of: std::collections::HashSet<(
                usize,
                usize,
                profile_format::ImageKind,
                &profile_format::ImageId,
            )> = only
                .iter()
                .filter_map(|&i| {
                    let p = &loaded.profiles[i];
                    let (ev, _) = weights.per_profile[i]?;
                    Some((p.dir, ev, p.profile.header.kind, &p.profile.header.image_id))
                })
                .collect();
            all.retain(|s| {
                s.frames.first().is_some_and(|f| {
                    f.image_id
                        .as_ref()
                        .is_some_and(|id| leaf_of.contains(&(s.dir, s.event, f.kind, id)))
                })
            });
        }
        stacks::apply_to_export(&mut x, &all, loaded, p.command.is_some() && !per_command);
    }
    flush_warnings(err, &mut warnings)?;
    let stacks_only = p.command.is_some() && !per_command;
    if let (Some(c), true) = (&p.command, stacks_only && x.samples.iter().all(|s| s.samples == 0)) {
        return Err(ProfError::Empty(format!(
            "no call stacks of the command {c:?} in the selection: an export with --command \
             holds that command's call stacks (dcpid --callchains fp), which name their \
             command since stack files of version 3"
        )));
    }
    if x.samples.iter().all(|s| s.samples == 0) {
        return Err(ProfError::Empty(
            "no samples of the selected event(s) in the selection: nothing to export; try \
             --event, --epoch all or --host all"
                .into(),
        ));
    }
    p.format.write(&x, p.limit, out)?;
    out.flush()?;
    print_stats(p.verbose, err)?;
    Ok(())
}

/// The selection's call stacks, symbolized, for `what` (a report on stacks: they are kept
/// per epoch, so a time range is refused), with the profiles and weights they were read
/// with. `image`: `--image`, resolved to identities by name as the per-symbol report does
/// (returned); `calls`: only what a `--callers`/`--callees` report needs (`Want::Calls`).
fn load_stacks(
    sel: &Selection,
    symbols: &SymbolSearch,
    mode: report::SymbolMode,
    q: StackQuery<'_>,
    err: &mut dyn Write,
) -> Result<(Vec<stacks::SymStack>, report::Weights, Option<ImageIds>), ProfError> {
    let StackQuery { what, image, calls, command } = q;
    sel.no_time_axis(what)?;
    let mut warnings: Vec<String> = Vec::new();
    let loaded = sel.load(None, &mut |w| warnings.push(w))?;
    if loaded.profiles.is_empty() {
        flush_warnings(err, &mut warnings)?;
        return Err(nothing_sampled(&loaded.dirs));
    }
    let weights = report::weights(&loaded, &sel.events)?;
    let ids: Option<ImageIds> = match image {
        Some(spec) => Some(
            report::resolve_image(&loaded, &weights, spec)?
                .into_iter()
                .map(|i| loaded.profiles[i].profile.header.image_id.clone())
                .collect(),
        ),
        None => None,
    };
    let locator = symbols.locator(&sel.db);
    let cache = symbols.cache(&mut |w| warnings.push(w));
    let all = stacks::load(
        &loaded,
        &weights,
        locator,
        cache,
        mode,
        sel.keep_going,
        match calls {
            Some((symbol, dir, depth)) => {
                stacks::Want::Calls { symbol, dir, depth, image: ids.as_ref() }
            }
            None => stacks::Want::All,
        },
        command,
        &mut |w| warnings.push(w),
    )?;
    flush_warnings(err, &mut warnings)?;
    Ok((all, weights, ids))
}

/// What [`load_stacks`] reads: `what` names the report in errors.
struct StackQuery<'a> {
    what: &'a str,
    image: Option<&'a str>,
    calls: Option<(&'a str, stacks::Direction, usize)>,
    command: Option<&'a str>,
}

/// The identities of the images `--image` names.
type ImageIds = std::collections::HashSet<profile_format::ImageId>;

/// `--stack-health`: per image, the share of the selection's stacks that ended early.
fn run_stack_health(
    p: &health::StackHealth,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ProfError> {
    let (mut all, weights, _) = load_stacks(
        &p.sel,
        &p.symbols,
        p.mode,
        StackQuery {
            what: "call stacks (--stack-health)",
            image: None,
            calls: None,
            command: None,
        },
        err,
    )?;
    all.retain(|s| s.event == 0);
    if all.is_empty() {
        return Err(ProfError::Empty(
            "no call stacks in the selection: dcpid records them with --callchains fp or dwarf \
             (callchains = \"fp\" or \"dwarf\")"
                .into(),
        ));
    }
    let event = weights.infos.first().map_or("samples", |e| e.name.as_str());
    let db = p.sel.db.display().to_string();
    let r = health::health_report(&all, event, &db, p.limit);
    health::write(out, &r, p.format)?;
    out.flush()?;
    Ok(())
}

/// `--callers`/`--callees`: the selection's call stacks around one function.
fn run_calls(p: &stacks::Calls, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), ProfError> {
    let (symbol, dir, depth) = (&p.symbol, p.direction, p.depth);
    let (all, weights, image) = load_stacks(
        &p.sel,
        &p.symbols,
        p.mode,
        StackQuery {
            what: "call stacks (--callers/--callees)",
            image: p.image.as_deref(),
            calls: Some((symbol, dir, depth)),
            command: p.command.as_deref(),
        },
        err,
    )?;
    if all.is_empty() {
        if let Some(c) = &p.command {
            return Err(ProfError::Empty(format!(
                "no call stacks of the command {c:?} in the selection (stacks name their \
                 command since stack files of version 3; older ones show as \
                 {:?})",
                profile_format::UNKNOWN_COMMAND
            )));
        }
        return Err(ProfError::Empty(
            "no call stacks in the selection: dcpid records them with --callchains fp \
             (callchains = \"fp\")"
                .into(),
        ));
    }
    let event = weights.infos.first().map_or("samples", |e| e.name.as_str());
    let mut r = stacks::call_report(&all, event, symbol, dir, depth, image.as_ref());
    if r.samples == 0 {
        let of = p.image.as_ref().map_or_else(String::new, |i| format!(" of image {i:?}"));
        return Err(ProfError::Empty(format!(
            "no sampled stack contains the function {symbol:?}{of} (names are exact, as the \
             per-symbol reports show them)"
        )));
    }
    if let Some(l) = p.limit {
        r.rows.truncate(l);
    }
    stacks::write_calls(out, &r, p.format)?;
    out.flush()?;
    Ok(())
}

fn flush_warnings(err: &mut dyn Write, w: &mut Vec<String>) -> std::io::Result<()> {
    notes::write_warnings("dcpiprof", err, w)
}

/// Print an error the way `dcpiprof` does (with the candidate list for ambiguity).
pub fn print_error(err: &mut dyn Write, e: &ProfError) {
    print_error_as("dcpiprof", err, e)
}

/// [`print_error`] for another report tool (`prog: error: ...`).
pub fn print_error_as(prog: &str, err: &mut dyn Write, e: &ProfError) {
    // Messages quote names and paths from the database: escaped for the terminal.
    drop(writeln!(err, "{prog}: error: {}", escape::terminal(&e.to_string())));
    if let ProfError::Ambiguous { candidates, .. } = e {
        drop(writeln!(err, "matches (pass a path or a build-id prefix to choose):"));
        for c in candidates {
            // An image without a build-id is named by its image id (`f…`), not as a build-id.
            let id = match &c.build_id {
                Some(b) => format!("build-id {b}"),
                None => format!("id {}", c.image_id),
            };
            drop(writeln!(
                err,
                "  {}  {id}  {} samples  hosts {}  epochs {}",
                escape::terminal(&c.path),
                c.samples,
                c.hosts.join(","),
                c.epochs.join(",")
            ));
        }
    }
}
