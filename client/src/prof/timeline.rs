//! `dcpiprof --by time`: samples per time bucket, from the host directories' `slices.log`
//! (FORMAT.md §14), of the whole selection, of one image (`--image`) or of one of its
//! functions (`--image --symbol`), with a one-line chart in the text header.
//!
//! Slices count samples per image and offset, not per process or CPU: `--command`,
//! `--cgroup`, `--pid` and `--cpu` cannot filter them (a usage error naming the flag, in
//! [`super::mode`]).

use std::collections::{HashMap, HashSet};
use std::io::Write;

use serde_json::{json, Value};

use super::by::Focus;
use super::output::{printable, r4};
use super::subset::resolve_image_builds;
use crate::args::Selection;
use dcpi_report::error::ProfError;
use dcpi_report::image::{is_idle, ImageFilter};
use dcpi_report::render::{Column, Kind, Output, Style, Table, Value as CellValue};
use dcpi_report::report::{self, SymbolContext};
use dcpi_report::timeline::{self, Bucket, Part, Share};
use profile_format::{HostDir, ImageId, SliceKey, SliceLog, SliceTotal, SliceTotals};

use dcpi_report::escape;
use dcpi_report::render::CsvCell;
use dcpi_report::select::Loaded;
use dcpi_report::stats;
/// UTC time of Unix seconds, as the timeline names it (for `dcpiexport`'s CSV too).
pub use dcpi_report::timeline::utc;

/// Width of the header's chart, in cells.
const CHART_WIDTH: usize = 60;

/// `--by time`.
#[derive(Clone, Debug)]
pub struct Timeline {
    pub sel: Selection,
    /// `--resolution` in seconds; `None`: the stored slice length.
    pub resolution: Option<u64>,
    pub focus: Focus,
}

/// `--resolution`: a duration of whole seconds, at least one (`10s`, `1m`, `1h`).
pub fn parse_resolution(s: &str) -> Result<u64, String> {
    let d = humantime::parse_duration(s)
        .map_err(|e| format!("{s:?} is not a duration such as 10s, 1m, 15min, 1h ({e})"))?;
    if d.subsec_nanos() != 0 || d.as_secs() == 0 {
        return Err(format!("{s:?}: the resolution is whole seconds, at least 1s"));
    }
    Ok(d.as_secs())
}

/// The selection's slice logs, each with its host directory's index; directories without one
/// are returned apart.
struct Logs {
    logs: Vec<(usize, Log)>,
    without: Vec<usize>,
}

/// A slice log as a timeline reads it: whole (per offset, for a function's share) or as totals
/// per key (enough for images; a day of minutes decodes ~4x faster, BENCHMARKS.md).
enum Log {
    Full(SliceLog),
    Totals(SliceTotals),
}

impl Log {
    fn events(&self) -> Vec<&str> {
        match self {
            Self::Full(l) => {
                l.slices.iter().flat_map(|s| s.counts.keys()).map(|k| k.event.as_str()).collect()
            }
            Self::Totals(t) => t.keys.iter().map(|k| k.event.as_str()).collect(),
        }
    }
}

fn read_logs(
    dirs: &[HostDir],
    full: bool,
    keep_going: bool,
    warn: &mut dyn FnMut(String),
) -> Result<Logs, ProfError> {
    let mut out = Logs { logs: Vec::new(), without: Vec::new() };
    let read: Vec<profile_format::Result<Option<Log>>> = if full {
        timeline::read_logs(dirs).into_iter().map(|r| r.map(|o| o.map(Log::Full))).collect()
    } else {
        timeline::read_totals(dirs).into_iter().map(|r| r.map(|o| o.map(Log::Totals))).collect()
    };
    for (i, r) in read.into_iter().enumerate() {
        match r {
            Ok(Some(l)) => out.logs.push((i, l)),
            Ok(None) => out.without.push(i),
            // A planted FIFO, device or link is refused even with --keep-going (issue 34).
            Err(e) if keep_going && !e.is_hostile_file() => {
                warn(format!("skipping {e}"));
                out.without.push(i);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(out)
}

/// `EPOCH/HOST` of each of `idx`, for messages.
fn names(dirs: &[HostDir], idx: &[usize]) -> String {
    let mut v: Vec<String> =
        idx.iter().map(|&i| format!("{}/{}", dirs[i].epoch, dirs[i].host)).collect();
    if v.len() > 5 {
        let more = v.len() - 5;
        v.truncate(5);
        v.push(format!("and {more} more"));
    }
    v.join(", ")
}

/// Run `--by time`.
pub fn run(
    t: &Timeline,
    tty: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ProfError> {
    let mut warnings: Vec<String> = Vec::new();
    // The profiles' totals name the events (in the reports' order), the idle task's identity
    // and the image; the counts come from the slices.
    let mut totals = t.sel.load_totals(&mut |w| warnings.push(w))?;
    if t.focus.no_idle {
        totals.exclude_idle();
    }
    let dirs = totals.dirs.clone();
    // Only a function's timeline needs the offsets; images need each slice's totals per key.
    let full = t.focus.symbol.is_some();
    let logs = read_logs(&dirs, full, t.sel.keep_going, &mut |w| warnings.push(w))?;
    if logs.logs.is_empty() {
        flush(err, &mut warnings)?;
        return Err(ProfError::Empty(format!(
            "--by time needs time slices, and no selected host-epoch has a slices.log ({}): \
             dcpid appends one slice per slice_interval (1m unless configured) once it has \
             samples, and writes none when it runs with slice_interval = 0 or predates time \
             slices (FORMAT.md §14); --by epoch gives one row per epoch instead",
            names(&dirs, &(0..dirs.len()).collect::<Vec<_>>())
        )));
    }
    if !logs.without.is_empty() {
        warnings.push(format!(
            "{} selected host-epoch(s) have no slices.log, so their samples are not in the \
             timeline: {}",
            logs.without.len(),
            names(&dirs, &logs.without)
        ));
    }
    let event = match report::weights_of_totals(&totals, &t.sel.events) {
        Ok(w) => w.events.first().cloned(),
        Err(e @ ProfError::UnknownEvent { .. }) => return Err(e),
        Err(_) => None,
    };
    let event = match event.or_else(|| t.sel.events.first().cloned()) {
        Some(e) => e,
        None => {
            let mut seen: Vec<&str> = logs.logs.iter().flat_map(|(_, l)| l.events()).collect();
            seen.sort_unstable();
            seen.first().map(|s| (*s).to_owned()).ok_or_else(|| {
                ProfError::Empty(format!(
                    "no samples in the time slices of {}: nothing sampled yet",
                    names(&dirs, &(0..dirs.len()).collect::<Vec<_>>())
                ))
            })?
        }
    };
    let idle: HashSet<ImageId> =
        totals.headers.iter().filter(|h| is_idle(h)).map(|h| h.image_id.clone()).collect();
    // The image's identities (builds merged) and, with --symbol, its function's offsets.
    let mut image_ids: HashMap<ImageId, Option<Share>> = HashMap::new();
    let mut image_path = None;
    let mut profile_samples: Option<u64>;
    if let Some(spec) = &t.focus.image {
        let mut loaded = t.sel.load(Some(&ImageFilter::new(spec)), &mut |w| warnings.push(w))?;
        if t.focus.no_idle {
            loaded.exclude_idle();
        }
        let w = report::weights(&loaded, &t.sel.events)?;
        let im = resolve_image_builds(&loaded, &w, spec)?;
        image_path = Some(im.path.clone());
        profile_samples = Some(
            im.idx
                .iter()
                .filter(|&&i| loaded.profiles[i].profile.header.event.name == event)
                .map(|&i| loaded.profiles[i].samples)
                .sum(),
        );
        for &i in &im.idx {
            image_ids.insert(loaded.profiles[i].profile.header.image_id.clone(), None);
        }
        if let Some(sym) = &t.focus.symbol {
            let mut locator = t.focus.symbols.locator(&t.sel.db);
            let mut cache = t.focus.symbols.cache(&mut |m| warnings.push(m));
            let cx = SymbolContext {
                loaded: &loaded,
                weights: &w,
                locator: &mut locator,
                cache: &mut cache,
                mode: t.focus.mode,
                warn: &mut |m| warnings.push(m),
            };
            // The function's share of each build's offsets, as the profiles saw it: slices
            // count exact offsets or blocks of them (FORMAT.md §14.2), placed by this share.
            let mut offsets: HashMap<ImageId, Share> = HashMap::new();
            let mut n = 0u64;
            let mut found = false;
            report::symbolize_image(cx, &im.idx, &mut |hit| {
                let inside = hit.key.0 == *sym;
                found |= inside;
                let h = &loaded.profiles[hit.profile].profile.header;
                if h.event.name == event {
                    offsets
                        .entry(h.image_id.clone())
                        .or_default()
                        .add(hit.offset, hit.count, inside);
                    if inside {
                        n += hit.count;
                    }
                }
            });
            if !found {
                flush(err, &mut warnings)?;
                return Err(ProfError::Empty(format!(
                    "--symbol {}: no sample of {} is in a function of that name (give the name \
                     as `dcpiprof --image {}` lists it)",
                    printable(sym),
                    printable(&im.path),
                    printable(spec)
                )));
            }
            profile_samples = Some(n);
            for (id, set) in image_ids.iter_mut() {
                *set = Some(offsets.remove(id).unwrap_or_default());
            }
        }
    } else {
        profile_samples =
            Some(totals.rows().filter(|r| r.header.event.name == event).map(|r| r.samples).sum());
    }
    flush(err, &mut warnings)?;

    let (since, until) = (t.sel.since, t.sel.until);
    let mut slices: Vec<(&profile_format::Slice, u64)> = Vec::new();
    let mut totals_of: Vec<(&SliceTotal, &[SliceKey])> = Vec::new();
    for (_, l) in &logs.logs {
        match l {
            Log::Full(l) => slices
                .extend(l.range(since, until).slices.into_iter().map(|s| (s, l.resolution_of(s)))),
            Log::Totals(t) => {
                totals_of.extend(t.range(since, until).into_iter().map(|s| (s, &t.keys[..])))
            }
        }
    }
    let lens = slices.iter().map(|s| s.0.len).chain(totals_of.iter().map(|s| s.0.len));
    let stored = timeline::stored_resolution(lens).unwrap_or(60);
    let resolution = t.resolution.unwrap_or(stored);
    let mut part = |k: &profile_format::SliceKey| {
        if k.event != event
            || (t.focus.no_idle && k.image.as_ref().is_some_and(|i| idle.contains(i)))
        {
            return Part::Out;
        }
        if t.focus.image.is_none() {
            return Part::All;
        }
        match k.image.as_ref().and_then(|i| image_ids.get(i)) {
            Some(None) => Part::All,
            Some(Some(share)) => Part::Offsets(share),
            None => Part::Of,
        }
    };
    let buckets = if full {
        timeline::buckets(slices.iter().copied(), resolution, &mut part)
    } else {
        timeline::buckets_of_totals(totals_of.iter().copied(), resolution, &mut part)
    };
    let total: u64 = buckets.iter().map(|b| b.samples).sum();
    let all: u64 = buckets.iter().map(|b| b.of).sum();
    let covered = match (buckets.first(), buckets.iter().map(|b| b.end).max()) {
        (Some(f), Some(e)) => Some((f.start, e)),
        _ => None,
    };
    let longer = buckets.iter().filter(|b| b.seconds() > resolution).count();
    let pct = |b: &Bucket| {
        let of = if t.focus.image.is_some() { b.of } else { all };
        if of > 0 {
            r4(b.samples as f64 / of as f64 * 100.0)
        } else {
            0.0
        }
    };
    let of =
        if t.focus.image.is_some() { "all samples of the bucket" } else { "the whole selection" };
    let rate = |b: &Bucket| r4(b.samples as f64 / b.seconds().max(1) as f64);
    let form = Output::from(t.focus.format);
    let doc = if form == Output::Json {
        let rows: Vec<Value> = buckets
            .iter()
            .map(|b| {
                json!({
                    "time": timeline::utc(b.start),
                    "start": b.start,
                    "seconds": b.seconds(),
                    "samples": b.samples,
                    "per_second": rate(b),
                    "percent": pct(b),
                })
            })
            .collect();
        json!({
            "report": "by",
            "by": "time",
            "database": t.sel.db.display().to_string(),
            "event": event,
            "image": image_path,
            "symbol": t.focus.symbol,
            "resolution": resolution,
            "stored_resolution": stored,
            "since": covered.map(|c| c.0),
            "until": covered.map(|c| c.1),
            "total_samples": total,
            "profile_samples": profile_samples.filter(|_| since.is_none() && until.is_none()),
            "percent_of": of,
            "rows": rows,
        })
    } else {
        Value::Null
    };
    // A time-weighted event (off-CPU time): its counts are nanoseconds. Text shows seconds
    // (`time`) and milliseconds per second (`ms/s`: threads' waiting per second of the bucket);
    // CSV keeps nanoseconds (`ns`, `ns_per_second`), JSON too (`samples`, `per_second`).
    let timed = report::time_weighted(&event);
    let mut table = Table::new();
    table.columns([
        Column::new("time (UTC)", Kind::Text).csv("time"),
        Column::new("seconds", Kind::Count),
        if timed {
            Column::new("off CPU", Kind::Count).csv("ns")
        } else {
            Column::new("samples", Kind::Count)
        },
        if timed {
            Column::new("ms/s", Kind::Decimal(1)).csv("ns_per_second")
        } else {
            Column::new("per second", Kind::Decimal(1)).csv("per_second")
        },
        Column::new("%", Kind::Decimal(2)).csv("percent"),
    ]);
    table.head(format!("# database: {}", t.sel.db.display()));
    let mut what = format!("# event {event}");
    if timed {
        what.push_str(" (time-weighted: counts are nanoseconds; text shows seconds and ms/s)");
    }
    if let Some(i) = &image_path {
        what.push_str(&format!("; image {}", printable(i)));
    }
    if let Some(s) = &t.focus.symbol {
        what.push_str(&format!("; symbol {}", printable(s)));
    }
    table.head(format!("{what}; % of {of}"));
    match covered {
        Some((a, b)) => table.head(format!(
            "# time: {} .. {}, {} in {} bucket(s) of {}",
            timeline::utc(a),
            timeline::utc(b),
            if timed { report::seconds_text(total) } else { format!("{total} sample(s)") },
            buckets.len(),
            timeline::duration(resolution)
        )),
        None => table.head("# time: no slice in the selected range".to_owned()),
    }
    if resolution < stored {
        table.head(format!(
            "# resolution {} is finer than the stored slices ({}): a slice is never split",
            timeline::duration(resolution),
            timeline::duration(stored)
        ));
    }
    if longer > 0 {
        table.head(format!(
            "# {longer} bucket(s) longer than {}: slices rolled up by dcpid (hours after \
             slice_rollup_after) or longer than the resolution keep their length",
            timeline::duration(resolution)
        ));
    }
    if let Some(p) = profile_samples.filter(|&p| p != total && since.is_none() && until.is_none()) {
        table.head(format!(
            "# the epoch profiles hold {p} sample(s), the slices {total}: the current epoch's \
             profiles are published every publish interval, and a killed dcpid loses its last \
             slice (FORMAT.md §14.3)"
        ));
    }
    let (chart, per) = timeline::sparkline(&buckets, CHART_WIDTH);
    if !chart.is_empty() {
        table.head(format!("# chart ({} per cell): {chart}", timeline::duration(per)));
    }
    for b in &buckets {
        let (n, r): (CellValue, CellValue) = if timed {
            let both =
                |text: String, csv: String| CellValue::Both { text, csv: CsvCell::Number(csv) };
            (
                both(report::seconds_text(b.samples), b.samples.to_string()),
                both(format!("{:.1}", rate(b) / 1e6), rate(b).to_string()),
            )
        } else {
            (b.samples.into(), rate(b).into())
        };
        table.row(vec![
            timeline::utc(b.start).into(),
            b.seconds().into(),
            n.into(),
            r.into(),
            pct(b).into(),
        ]);
    }
    table.write(out, form, Style { human: tty, ..Style::default() }, &doc)?;
    out.flush()?;
    if t.focus.verbose {
        writeln!(err, "dcpiprof: stats: {}", stats::line())?;
    }
    Ok(())
}

/// The HTML report's timeline: samples of the first event of `w` per stored slice length, of
/// the images loaded (so `--no-idle` and `--image`, given as `only`, apply as to the rest of
/// the export) and of the unknown samples (not with `--image`). Empty where no selected
/// host-epoch has slices; a slice log that cannot be read is a warning here, not an error
/// (the rest of the export does not need it).
pub fn of_export(
    sel: &Selection,
    loaded: &Loaded,
    w: &report::Weights,
    only: Option<&[usize]>,
    warn: &mut dyn FnMut(String),
) -> Vec<Bucket> {
    let Some(event) = w.events.first() else { return Vec::new() };
    let ids: HashSet<&ImageId> = match only {
        Some(idx) => idx.iter().map(|&i| &loaded.profiles[i].profile.header.image_id).collect(),
        None => loaded
            .profiles
            .iter()
            .filter(|p| p.profile.header.event.name == *event)
            .map(|p| &p.profile.header.image_id)
            .collect(),
    };
    let mut logs = Vec::new();
    for r in timeline::read_logs(&loaded.dirs) {
        match r {
            Ok(Some(l)) => logs.push(l),
            Ok(None) => {}
            Err(e) => warn(format!("{e}: not in the timeline")),
        }
    }
    let ranges: Vec<_> = logs.iter().map(|l| (l, l.range(sel.since, sel.until))).collect();
    let slices = ranges.iter().flat_map(|(l, r)| r.slices.iter().map(|&s| (s, l.resolution_of(s))));
    let Some(stored) = timeline::stored_resolution(slices.clone().map(|s| s.0.len)) else {
        return Vec::new();
    };
    timeline::buckets(slices, stored, &mut |k| match &k.image {
        _ if k.event != *event => Part::Out,
        None if only.is_none() => Part::All,
        Some(i) if ids.contains(i) => Part::All,
        _ => Part::Out,
    })
}

fn flush(err: &mut dyn Write, warnings: &mut Vec<String>) -> std::io::Result<()> {
    for m in warnings.drain(..) {
        writeln!(err, "dcpiprof: warning: {}", escape::terminal(&m))?;
    }
    Ok(())
}
