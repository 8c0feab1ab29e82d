//! `dcpidiff` (two selections of profiles side by side: what changed, and is it more than
//! sampling noise) and `dcpistats` (the spread of one image's profile over many epochs or
//! hosts). Both read the database through the shared selection model ([`crate::args`]) and
//! symbolize through the report code of `dcpiprof` ([`dcpi_report::report`]).

pub mod common;
pub mod stat;
pub mod stats_tool;

use std::collections::BTreeMap;
use std::io::Write;

use clap::{CommandFactory, Parser};
use serde::Serialize;

use dcpi_report::render::{Cell, Column, CsvCell, Kind, Style, Table, Value, BOLD, GREEN, RED};

use self::common::{
    printable, r4, resolve_image_builds, symbol_rows, OutputArgs, Symbolizer, ToolError,
};
use crate::args::{parse_when, Selection};
use crate::prof::output::TableFormat as Format;
use dcpi_report::error::ProfError;
use dcpi_report::report::{self, ImageFilter, SymbolMode};
use dcpi_report::select::{epochs_and_hosts, EpochSel, HostSel, Loaded, TimeCoverage};

/// Long help of `dcpidiff`: the numbers, the test and the JSON schema.
pub const DIFF_HELP: &str = "\
SELECTIONS
  --before and --after each take what --epoch takes (an epoch id such as 20261124T101500Z, a
  day such as 20261124, FROM..TO, `latest`, `all`); either defaults to --epoch. --before-host
  and --after-host default to --host (default: this host; `all` merges every host). So
  `--before 20261123 --after 20261124` compares two days of this host, and
  `--epoch all --before-host web-1 --after-host web-2` two hosts.
  --before-since/--before-until and --after-since/--after-until select a time range instead
  (as --since/--until: a duration back from now, a UTC time, 14:00, a day): only the samples
  of the time slices in that range, of the epochs overlapping it. So `--before-since 10:00
  --before-until 10:15 --after-since 15m` compares 10:00-10:15 UTC with the last quarter of an
  hour, on this host or, with --host all, on the fleet. Each side's header line (and JSON
  `time`) names the range its slices exactly cover.

NUMBERS
  before, after     raw samples of the row in each selection.
  before%, after%   share of the row in its selection: of the image's samples with --image,
                    of all samples without it. Shares use period-weighted events, as dcpiprof's
                    percent does.
  delta             after% - before%, in percentage points (positive: the row takes more of
                    the time now, shown red on a terminal).
  ratio             after% / before% (`new` when absent before, `gone` when absent after).
  sig (*)           the change is significant (see below).
  Rows are sorted by |delta|, largest first.

SIGNIFICANCE
  Each row is tested with a pooled two-proportion z-test on its raw sample counts (x1 of n1
  before, x2 of n2 after; two-sided), which models the binomial noise of sampling. The p-values
  of all rows compared (before --min-delta and --limit hide any) are corrected with Holm's
  step-down method, so the chance of even one false alarm in the whole report is at most
  --alpha (default 0.01). A row is marked significant when its Holm-adjusted p-value is below
  --alpha AND |delta| >= --min-effect points (default 1.0): with hundreds of thousands of
  samples a 0.1-point change is real but rarely matters. Variation of the workload itself
  between epochs or hosts is not sampling noise: measure it with dcpistats.

REBUILT BINARIES
  With --image PATH, each selection's profiles of that path are taken whatever their build-id,
  and symbols are matched by name, so a binary rebuilt between the selections still compares
  function by function; the header (and JSON images_differ) says so. Each build's symbols come
  from that build only (its binary found by build-id: keep old builds with
  `dcpiprof --cache-binary` or point --binary-path at them); samples of a build whose binary is
  gone show as [build-id mismatch] or NAME+0xOFFSET. Without --image, rows are images matched
  by path; builds_differ marks a path whose build changed.

JSON SCHEMA (--format json)
  { \"report\": \"diff\", \"rows_of\": \"images\"|\"symbols\"|\"lines\", \"event\": str,
    \"test\": { \"method\": str, \"alpha\": num, \"min_effect\": num, \"rows_compared\": int },
    \"before\": SIDE, \"after\": SIDE, \"images_differ\": bool, \"rows_hidden\": int,
    \"rows\": [ { \"symbol\": str (or \"image\": str), \"source\": \"file:line\" (--lines),
                \"before\": int, \"after\": int, \"before_events\": int, \"after_events\": int,
                \"before_share\": num, \"after_share\": num, \"delta\": num,
                \"ratio\": num|null, \"z\": num, \"p_value\": num, \"p_adjusted\": num,
                \"significant\": bool,
                \"before_builds\": [str], \"after_builds\": [str], \"builds_differ\": bool
                (image rows only) } ] }
  SIDE = { \"epochs\": [str], \"hosts\": [str], \"total_samples\": int, \"total_events\": int,
           \"image\": null | { \"path\": str, \"builds\": [str], \"binary\": str|null },
           \"time\": TIME (time range sides only) }
  TIME = { \"since\": int|null, \"until\": int|null (the request, Unix seconds),
           \"covered\": [int, int]|null (what the slices exactly cover), \"whole_epochs\": [str],
           \"left_out\": [str] (epoch/host without time slices) }
  CSV: a header line, then one line per row with the row fields above.

EXIT STATUS
  0 success; 1 output error; 2 usage or data error (bad arguments, no such epoch/host/image/
  event in one of the selections, corrupt profile without --keep-going).";

/// Command line of `dcpidiff`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "dcpidiff",
    version,
    about = "Compare two selections of dcpi profiles (epochs, days, hosts): per symbol or image, \
             with a significance test",
    long_about = "Compare two selections of dcpi profiles side by side.\n\n\
                  With --image: one row per function of that image (matched by name across \
                  rebuilds), or per source line with --lines. Without it: one row per image. \
                  Each row has the samples and share before and after, the change in percentage \
                  points, the ratio, and whether the change is significant (two-proportion \
                  z-test on sample counts, Holm-corrected over the rows compared, at --alpha, \
                  default 0.01; see below).",
    after_long_help = DIFF_HELP,
    mut_args(OutputArgs::tool_help(
        "Colour in the table (red: a larger share now, green: smaller; significant rows only)",
        "Show at most N rows (after sorting); 0 means no limit"
    ))
)]
pub struct DiffArgs {
    #[command(flatten)]
    pub sel: Selection,
    /// The baseline: epoch id, day (YYYYMMDD), FROM..TO, `latest` or `all` [default: --epoch].
    #[arg(long, value_name = "SEL")]
    pub before: Option<EpochSel>,
    /// The selection compared with the baseline [default: --epoch].
    #[arg(long, value_name = "SEL")]
    pub after: Option<EpochSel>,
    /// The baseline is the time range from WHEN on (as --since: `15m`, `14:00`,
    /// `2026-11-29T14:00:00Z`, a day); replaces --before.
    #[arg(long, value_name = "WHEN", value_parser = parse_when, conflicts_with = "before")]
    pub before_since: Option<u64>,
    /// The baseline's range ends at WHEN (as --until); replaces --before.
    #[arg(long, value_name = "WHEN", value_parser = parse_when, conflicts_with = "before")]
    pub before_until: Option<u64>,
    /// The compared selection is the time range from WHEN on; replaces --after.
    #[arg(long, value_name = "WHEN", value_parser = parse_when, conflicts_with = "after")]
    pub after_since: Option<u64>,
    /// The compared selection's range ends at WHEN; replaces --after.
    #[arg(long, value_name = "WHEN", value_parser = parse_when, conflicts_with = "after")]
    pub after_until: Option<u64>,
    /// Host of the baseline (`all` merges every host) [default: --host].
    #[arg(long, value_name = "NAME|all")]
    pub before_host: Option<String>,
    /// Host of the compared selection [default: --host].
    #[arg(long, value_name = "NAME|all")]
    pub after_host: Option<String>,
    /// Compare the functions of one image (as dcpiprof --image: a path, a basename, a build-id
    /// prefix, `kernel` ...); builds of the same path are matched by symbol name.
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// With --image: only this function (exact name as reported); with --lines its lines.
    #[arg(long, value_name = "NAME", requires = "image")]
    pub symbol: Option<String>,
    /// With --image: one row per source line (DWARF), usually with --symbol.
    #[arg(long, requires = "image")]
    pub lines: bool,
    /// With --image: attribute samples to the innermost inlined function (DWARF).
    #[arg(long, requires = "image")]
    pub inlines: bool,
    /// Hide rows whose |delta| is below P percentage points (they still count in the test).
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub min_delta: f64,
    /// Family-wise significance level (Holm-corrected over the rows compared).
    #[arg(long, value_name = "LEVEL", default_value_t = 0.01)]
    pub alpha: f64,
    /// Smallest |delta| in points ever called significant.
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    pub min_effect: f64,
    #[command(flatten)]
    pub out: OutputArgs,
}

/// One side of the comparison, as reported.
#[derive(Clone, Debug, Serialize)]
pub struct SideInfo {
    pub epochs: Vec<String>,
    pub hosts: Vec<String>,
    pub total_samples: u64,
    pub total_events: u64,
    pub image: Option<SideImage>,
    /// A time range side (`--before-since` ...): what its slices covered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time: Option<TimeCoverage>,
}

#[derive(Clone, Debug, Serialize)]
pub struct SideImage {
    pub path: String,
    pub builds: Vec<String>,
    pub binary: Option<String>,
}

/// One compared row.
#[derive(Clone, Debug, Serialize)]
pub struct DiffRow {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symbol: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    pub before: u64,
    pub after: u64,
    pub before_events: u64,
    pub after_events: u64,
    pub before_share: f64,
    pub after_share: f64,
    pub delta: f64,
    pub ratio: Option<f64>,
    pub z: f64,
    pub p_value: f64,
    pub p_adjusted: f64,
    pub significant: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before_builds: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after_builds: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub builds_differ: Option<bool>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TestInfo {
    pub method: &'static str,
    pub alpha: f64,
    pub min_effect: f64,
    pub rows_compared: usize,
}

/// The whole `dcpidiff` result.
#[derive(Clone, Debug, Serialize)]
pub struct DiffReport {
    pub report: &'static str,
    pub rows_of: &'static str,
    pub event: String,
    pub test: TestInfo,
    pub before: SideInfo,
    pub after: SideInfo,
    pub images_differ: bool,
    pub rows_hidden: usize,
    pub rows: Vec<DiffRow>,
}

const METHOD: &str = "pooled two-proportion z-test on sample counts, two-sided, Holm-corrected";

/// Per-row totals of one side: samples, weighted events, builds (image rows).
#[derive(Clone, Debug, Default)]
struct Tally {
    samples: u64,
    events: f64,
    builds: Vec<String>,
}

type Key = (String, Option<String>);

fn host_sel(h: Option<&str>, default: &HostSel) -> HostSel {
    match h {
        Some("all") => HostSel::All,
        Some(h) => HostSel::Named(h.to_owned()),
        None => default.clone(),
    }
}

/// Name the side in a data error.
fn side_err(side: &str, e: ProfError) -> ToolError {
    match e {
        ProfError::Empty(m) => ToolError::Usage(format!("{side} selection: {m}")),
        ProfError::NoSuchImage { spec, known } => ToolError::Usage(format!(
            "{side} selection: no image with samples matches --image {spec:?}; images with \
             samples there: {known}"
        )),
        ProfError::UnknownEvent { event, available, .. } => ToolError::Usage(format!(
            "{side} selection has no samples of event {event:?}{}; events there: {available} \
             (choose with --event)",
            dcpi_report::error::did_you_mean_hint(&event, &available)
        )),
        e => ToolError::Prof(e),
    }
}

/// Run `dcpidiff`, writing the report to `out` and warnings to `err`.
pub fn run_diff(
    args: &DiffArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ToolError> {
    if let Some(g) = args.out.generate {
        crate::manpages::generate(DiffArgs::command(), g, out)?;
        return Ok(());
    }
    for (name, v) in [("--min-delta", args.min_delta), ("--min-effect", args.min_effect)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(ToolError::Usage(format!("{name} {v}: expected a number of points >= 0")));
        }
    }
    if !(args.alpha > 0.0 && args.alpha < 1.0) {
        return Err(ToolError::Usage(format!(
            "--alpha {}: expected a level between 0 and 1 (e.g. 0.01)",
            args.alpha
        )));
    }
    let default_host = args.sel.host_sel();
    let range = |since: Option<u64>, until: Option<u64>| {
        (since.is_some() || until.is_some()).then_some(EpochSel::Between(since, until))
    };
    let be = range(args.before_since, args.before_until)
        .or_else(|| args.before.clone())
        .unwrap_or_else(|| args.sel.epoch_sel());
    let ae = range(args.after_since, args.after_until)
        .or_else(|| args.after.clone())
        .unwrap_or_else(|| args.sel.epoch_sel());
    let bh = host_sel(args.before_host.as_deref(), &default_host);
    let ah = host_sel(args.after_host.as_deref(), &default_host);
    if be == ae && bh == ah {
        return Err(ToolError::Usage(
            "--before and --after select the same profiles; give --before/--after (epochs), \
             --before-since/--after-since (time ranges) or --before-host/--after-host"
                .into(),
        ));
    }
    let mut warnings: Vec<String> = Vec::new();
    let filter = args.image.as_deref().map(ImageFilter::new);
    let before = args
        .sel
        .load_with(&be, &bh, filter.as_ref(), &mut |w| warnings.push(w))
        .map_err(|e| side_err("--before", e))?;
    let after = args
        .sel
        .load_with(&ae, &ah, filter.as_ref(), &mut |w| warnings.push(w))
        .map_err(|e| side_err("--after", e))?;
    for (side, l) in [("--before", &before), ("--after", &after)] {
        if l.profiles.is_empty() && args.image.is_none() {
            let (e, h) = epochs_and_hosts(&l.dirs);
            return Err(ToolError::Usage(format!(
                "{side} selection: no profiles in epoch(s) {} for host(s) {}",
                e.join(","),
                h.join(",")
            )));
        }
    }
    if let Some(spec) = &args.image {
        // Nothing of the image loaded: let resolution name the images that are there.
        for (side, l) in [("--before", &before), ("--after", &after)] {
            if l.profiles.is_empty() {
                let w = report::weights(l, &[]).map_err(|e| side_err(side, e))?;
                resolve_image_builds(l, &w, spec).map_err(|e| side_err(side, e))?;
            }
        }
    }
    let event = match common::pick_event(&before, &args.sel.events) {
        Ok(e) => e,
        Err(ToolError::Prof(e)) => return Err(side_err("--before", e)),
        Err(e) => return Err(e),
    };
    let ev = std::slice::from_ref(&event);
    let bw = report::weights(&before, ev).map_err(|e| side_err("--before", e))?;
    let aw = report::weights(&after, ev).map_err(|e| side_err("--after", e))?;

    let (rows_of, tallies, bside, aside) = match &args.image {
        None => {
            let (bt, bs) = image_tallies(&before, &bw);
            let (at, as_) = image_tallies(&after, &aw);
            ("images", (bt, at), bs, as_)
        }
        Some(spec) => {
            let bi =
                resolve_image_builds(&before, &bw, spec).map_err(|e| side_err("--before", e))?;
            let ai = resolve_image_builds(&after, &aw, spec).map_err(|e| side_err("--after", e))?;
            let mut sy = Symbolizer {
                locator: args.out.symbols.locator(&args.sel.db),
                cache: args.out.symbols.cache(&mut |w| warnings.push(w)),
            };
            let mode = SymbolMode { lines: args.lines, inlines: args.inlines, raw_names: false };
            let mut side = |l: &Loaded, w: &report::Weights, im: &common::ImageProfiles| {
                let (rows, info) =
                    symbol_rows(l, w, &im.idx, &mut sy, mode, &mut |m| warnings.push(m));
                let mut t: BTreeMap<Key, Tally> = BTreeMap::new();
                let mut total = Tally::default();
                for r in rows {
                    total.samples += r.samples;
                    total.events += r.events as f64;
                    if args.symbol.as_ref().is_some_and(|s| *s != r.symbol) {
                        continue;
                    }
                    let e = t.entry((r.symbol, r.source)).or_default();
                    e.samples += r.counts.samples;
                    e.events += r.counts.events as f64;
                }
                let image = SideImage {
                    path: im.path.clone(),
                    builds: im.builds.clone(),
                    binary: info.binary,
                };
                (t, side_info(l, &total, Some(image)))
            };
            let (bt, bs) = side(&before, &bw, &bi);
            let (at, as_) = side(&after, &aw, &ai);
            if let Some(sym) = &args.symbol {
                if bt.is_empty() && at.is_empty() {
                    return Err(ToolError::Usage(format!(
                        "no samples of symbol {:?} in image {} in either selection (names are \
                         matched exactly as dcpiprof --image prints them)",
                        printable(sym),
                        bi.path
                    )));
                }
            }
            (if args.lines { "lines" } else { "symbols" }, (bt, at), bs, as_)
        }
    };
    for w in warnings.drain(..) {
        writeln!(err, "dcpidiff: warning: {}", dcpi_report::escape::terminal(&w))?;
    }
    let r = compare(args, rows_of, &event, tallies, bside, aside);
    write_report(out, &r, args.out.format, args.out.color.enabled())?;
    out.flush()?;
    Ok(())
}

/// Per-image tallies (matched by display path, builds merged) of one side.
fn image_tallies(l: &Loaded, w: &report::Weights) -> (BTreeMap<Key, Tally>, SideInfo) {
    let r = report::image_report(l, w, "", None);
    let mut t: BTreeMap<Key, Tally> = BTreeMap::new();
    let mut total = Tally::default();
    for row in r.rows {
        total.samples += row.samples;
        total.events += row.events as f64;
        let e = t.entry((row.image, None)).or_default();
        e.samples += row.counts.samples;
        e.events += row.counts.events as f64;
        if let Some(b) = row.build_id.or(row.image_id) {
            if !e.builds.contains(&b) {
                e.builds.push(b);
            }
        }
    }
    for v in t.values_mut() {
        v.builds.sort();
    }
    (t, side_info(l, &total, None))
}

/// How one side is reported: its epochs and hosts, and the totals its shares are taken of.
fn side_info(l: &Loaded, total: &Tally, image: Option<SideImage>) -> SideInfo {
    let (epochs, hosts) = epochs_and_hosts(&l.dirs);
    SideInfo {
        epochs,
        hosts,
        total_samples: total.samples,
        total_events: total.events.round() as u64,
        image,
        time: l.time.clone(),
    }
}

fn share(part: f64, total: u64) -> f64 {
    if total > 0 {
        part / total as f64 * 100.0
    } else {
        0.0
    }
}

fn compare(
    args: &DiffArgs,
    rows_of: &'static str,
    event: &str,
    (bt, at): (BTreeMap<Key, Tally>, BTreeMap<Key, Tally>),
    before: SideInfo,
    after: SideInfo,
) -> DiffReport {
    let mut keys: Vec<Key> = bt.keys().chain(at.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    let empty = Tally::default();
    let (n1, n2) = (before.total_samples, after.total_samples);
    let mut rows: Vec<DiffRow> = keys
        .into_iter()
        .map(|k| {
            let b = bt.get(&k).unwrap_or(&empty);
            let a = at.get(&k).unwrap_or(&empty);
            let bs = share(b.events, before.total_events);
            let as_ = share(a.events, after.total_events);
            let z = stat::two_proportion_z(b.samples, n1, a.samples, n2);
            let image_rows = rows_of == "images";
            DiffRow {
                symbol: (!image_rows).then(|| k.0.clone()),
                image: image_rows.then(|| k.0.clone()),
                source: k.1.clone(),
                before: b.samples,
                after: a.samples,
                before_events: b.events.round() as u64,
                after_events: a.events.round() as u64,
                before_share: r4(bs),
                after_share: r4(as_),
                delta: r4(as_ - bs),
                ratio: (bs > 0.0).then(|| r4(as_ / bs)),
                z: r4(z),
                p_value: stat::two_sided_p(z),
                p_adjusted: 1.0,
                significant: false,
                before_builds: image_rows.then(|| b.builds.clone()),
                after_builds: image_rows.then(|| a.builds.clone()),
                builds_differ: image_rows
                    .then(|| !b.builds.is_empty() && !a.builds.is_empty() && b.builds != a.builds),
            }
        })
        .collect();
    let p: Vec<f64> = rows.iter().map(|r| r.p_value).collect();
    for (r, adj) in rows.iter_mut().zip(stat::holm_adjust(&p)) {
        r.p_adjusted = adj;
        r.significant = adj < args.alpha && r.delta.abs() >= args.min_effect;
    }
    let compared = rows.len();
    rows.sort_by(|x, y| {
        y.delta
            .abs()
            .total_cmp(&x.delta.abs())
            .then(y.significant.cmp(&x.significant))
            .then_with(|| x.symbol.cmp(&y.symbol))
            .then_with(|| x.image.cmp(&y.image))
            .then_with(|| x.source.cmp(&y.source))
    });
    let before_len = rows.len();
    rows.retain(|r| r.delta.abs() >= args.min_delta);
    if let Some(n) = args.out.limit {
        rows.truncate(n);
    }
    let images_differ = match (&before.image, &after.image) {
        (Some(b), Some(a)) => b.builds != a.builds,
        _ => rows.iter().any(|r| r.builds_differ == Some(true)),
    };
    DiffReport {
        report: "diff",
        rows_of,
        event: event.to_owned(),
        test: TestInfo {
            method: METHOD,
            alpha: args.alpha,
            min_effect: args.min_effect,
            rows_compared: compared,
        },
        rows_hidden: before_len - rows.len(),
        before,
        after,
        images_differ,
        rows,
    }
}

fn side_line(s: &SideInfo) -> String {
    let ep = dcpi_report::report::epoch_range(&s.epochs);
    let mut line = format!("epochs {ep}, hosts {}: {} samples", s.hosts.join(","), s.total_samples);
    if let Some(im) = &s.image {
        line.push_str(&format!(" of {}", printable(&im.path)));
        match im.builds.as_slice() {
            [] => {}
            [one] => line.push_str(&format!(" (build {one})")),
            many => line.push_str(&format!(" ({} builds: {})", many.len(), many.join(", "))),
        }
    }
    if let Some(t) = &s.time {
        for l in t.lines() {
            line.push_str(&format!("; {l}"));
        }
    }
    line
}

fn ratio_text(r: &DiffRow) -> String {
    match r.ratio {
        _ if r.before == 0 && r.after == 0 => "-".into(),
        None => "new".into(),
        Some(_) if r.after == 0 => "gone".into(),
        Some(x) => format!("{x:.2}x"),
    }
}

fn row_name(r: &DiffRow) -> String {
    let mut n = printable(r.symbol.as_deref().or(r.image.as_deref()).unwrap_or_default());
    if r.builds_differ == Some(true) {
        n.push_str("  (rebuilt)");
    }
    n
}

/// Render a diff report.
pub fn write_report(
    out: &mut dyn Write,
    r: &DiffReport,
    fmt: Format,
    color: bool,
) -> std::io::Result<()> {
    let images = r.rows_of == "images";
    let key = if images { "image" } else { "symbol" };
    let mut t = Table::new();
    let right = |s: &str, k: Kind| Column::new(s, k).right();
    let csv_only = |s: &str, k: Kind| Column::new(s, k);
    t.columns([
        Column::new(key, Kind::Text),
        right("source", Kind::Text),
        right("before", Kind::Count),
        right("after", Kind::Count),
        csv_only("before_events", Kind::Count),
        csv_only("after_events", Kind::Count),
        right("before%", Kind::Decimal(2)).csv("before_share"),
        right("after%", Kind::Decimal(2)).csv("after_share"),
        right("delta", Kind::Signed(2)),
        right("ratio", Kind::Decimal(2)),
        csv_only("z", Kind::Decimal(4)),
        csv_only("p_value", Kind::Scientific),
        csv_only("p_adjusted", Kind::Scientific),
        right("sig", Kind::Text).csv("significant"),
    ]);
    let mut shown = vec![2, 3, 6, 7, 8, 9, 13];
    if r.rows_of == "lines" {
        shown.push(1);
    }
    shown.push(0);
    t.text_columns(shown);
    for x in &r.rows {
        let c = match (color && x.significant, x.delta > 0.0) {
            (true, true) => Some(RED),
            (true, false) => Some(GREEN),
            _ => None,
        };
        let name = x.symbol.clone().or(x.image.clone()).unwrap_or_default();
        t.row(vec![
            Value::Both { text: row_name(x), csv: CsvCell::Text(name) }.into(),
            x.source.as_deref().into(),
            x.before.into(),
            x.after.into(),
            x.before_events.into(),
            x.after_events.into(),
            x.before_share.into(),
            x.after_share.into(),
            Cell::colored(x.delta, c),
            Value::Both {
                text: ratio_text(x),
                csv: CsvCell::Number(x.ratio.map(|v| v.to_string()).unwrap_or_default()),
            }
            .into(),
            x.z.into(),
            x.p_value.into(),
            x.p_adjusted.into(),
            Cell::colored(
                Value::Both {
                    text: if x.significant { "*" } else { "" }.into(),
                    csv: CsvCell::Text(x.significant.to_string()),
                },
                c,
            ),
        ]);
    }
    if fmt == Format::Table {
        diff_text(&mut t, r, color);
    }
    t.write(out, fmt.into(), Style::default(), r)
}

/// The text table's comment lines.
fn diff_text(t: &mut Table, r: &DiffReport, color: bool) {
    t.head(format!("# before: {}", side_line(&r.before)));
    t.head(format!("# after:  {}", side_line(&r.after)));
    if r.images_differ {
        let msg = match (&r.before.image, &r.after.image) {
            (Some(b), Some(a)) => format!(
                "# images differ: build {} before, {} after; symbols matched by path and name",
                b.builds.join(","),
                a.builds.join(",")
            ),
            _ => "# images differ: some paths were rebuilt (marked `rebuilt`); matched by path"
                .to_owned(),
        };
        t.head(if color { format!("{BOLD}{msg}\x1b[0m") } else { msg });
    }
    let of = if r.rows_of == "images" { "all samples" } else { "the image's samples" };
    t.head(format!(
        "# event {}; shares are % of {of}; delta = after% - before% in points",
        printable(&r.event)
    ));
    t.head(format!(
        "# sig *: two-proportion z-test, Holm-corrected over {} rows, alpha {}, |delta| >= {}",
        r.test.rows_compared, r.test.alpha, r.test.min_effect
    ));
    let up = r.rows.iter().filter(|x| x.significant && x.delta > 0.0).count();
    let down = r.rows.iter().filter(|x| x.significant && x.delta < 0.0).count();
    t.foot(format!("# significant: {up} up, {down} down"));
    if r.rows_hidden > 0 {
        t.foot(format!("# {} row(s) not shown (--min-delta/--limit)", r.rows_hidden));
    }
}
