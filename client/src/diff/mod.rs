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
use crate::manpages;
use crate::notes;
use crate::prof::output::TableFormat as Format;
use crate::prof::whoprof;
use crate::prof::whoprof::WhoSel;
use dcpi_report::error::did_you_mean_hint;
use dcpi_report::error::ProfError;
use dcpi_report::image::short_labels;
use dcpi_report::report::{self, ImageFilter, SymbolMode};
use dcpi_report::select::{epochs_and_hosts, EpochSel, HostSel, Loaded, TimeCoverage};
use profile_format::HostSummary;

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

WHAT IS COMPARED (--compare)
  rate (default)    samples per second of sampled wall time of each selection: \"does this
                    take more time now\". The time is what the daemon sampled: per host and
                    epoch, the time the event's counters ran (summary.json time_running_ns,
                    summed over CPUs) divided by the number of CPUs, added over the selection's
                    host directories; a stopped daemon's gap is not in it. Wall time, not CPU
                    time: a function's samples per wall second is the number of CPUs it keeps
                    busy, which does not change when the host has more or fewer idle CPUs; per
                    CPU-second it would (an 8-CPU host would halve it), and per CPU-second of
                    the image it is the share, which moves when any other function changes.
                    Compare like with like: two windows of the same length of a steady
                    workload, or two runs of a fixed amount of work each inside its own
                    selection (then the rate is the run's samples over the window: use equal
                    windows, or --compare samples).
  samples           raw sample counts, both sides taken as equally long: for two runs of the
                    same fixed work (a benchmark, a batch job) in selections of any length.
                    Without --compare, a selection whose summaries recorded no sampled time
                    (databases not written by dcpid) is compared by share, and the header and
                    JSON test.fallback say so; --compare rate then is an error.
  share             each row's share of the image's samples (with --image) or of all samples:
                    \"does this take a larger part of the time now\". A function that did not
                    change moves when another one does.

NUMBERS
  before, after     raw samples of the row in each selection.
  before/s, after/s samples per second of sampled time (rate).
  before%, after%   share of the row in its selection: of the image's samples with --image,
                    of all samples without it. Shares use period-weighted events, as dcpiprof's
                    percent does (share; always in JSON and CSV).
  delta             after - before in the unit compared: samples/s (rate, JSON and CSV only),
                    samples, or percentage points (share). Rows are sorted by |delta|, largest
                    first.
  ratio             after/s / before/s (rate), after / before (samples), after% / before%
                    (share); `new` when absent before, `gone` when absent after.
  sig (*)           the change is significant (see below); red: more now, green: less.

SIGNIFICANCE
  rate and samples: a sampling profiler's count is Poisson, so each row is tested with the
  exact conditional binomial test of two Poisson rates: given the row's x1 + x2 samples, x2 is
  Binomial(x1 + x2, t2 / (t1 + t2)) if the rate did not change (t1, t2: the sampled seconds,
  or 1 and 1 for samples); two-sided, twice the smaller tail. share: a pooled two-proportion
  z-test on the raw counts (x1 of n1 before, x2 of n2 after; two-sided), the binomial noise
  of where samples land. The p-values of all rows compared (before --min-delta and --limit hide
  any) are corrected with Holm's step-down method, so the chance of even one false alarm in the
  whole report is at most --alpha (default 0.01). A row is marked significant when its
  Holm-adjusted p-value is below --alpha AND the change is at least --min-effect (default 1.0):
  percent of the before rate or count (rate, samples), points (share); with hundreds of
  thousands of samples a tiny change is real but rarely matters. With rate and samples the
  change must also be at least --min-impact (default 0.5) percent of the whole selection's
  before rate or count: a function with 0.1 % of the time that doubles is not what got slower. Variation of the workload
  itself between epochs or hosts is not sampling noise: measure it with dcpistats.

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
    \"test\": { \"compare\": \"rate\"|\"samples\"|\"share\", \"fallback\": str (only when
              rate was not possible and --compare was not given), \"method\": str,
              \"alpha\": num, \"min_effect\": num, \"min_impact\": num (rate and
              samples only), \"rows_compared\": int },
    \"before\": SIDE, \"after\": SIDE, \"images_differ\": bool, \"rows_hidden\": int,
    \"rows\": [ { \"symbol\": str (or \"image\": str), \"source\": \"file:line\" (--lines),
                \"before\": int, \"after\": int, \"before_events\": int, \"after_events\": int,
                \"before_share\": num, \"after_share\": num,
                \"before_rate\": num|null, \"after_rate\": num|null (samples/s, rate only),
                \"delta\": num,
                \"ratio\": num|null, \"z\": num, \"p_value\": num, \"p_adjusted\": num,
                \"significant\": bool,
                \"before_builds\": [str], \"after_builds\": [str], \"builds_differ\": bool
                (image rows only) } ] }
  SIDE = { \"epochs\": [str], \"hosts\": [str], \"total_samples\": int, \"total_events\": int,
           \"seconds\": num|null (sampled wall time; of a time range side: the range covered),
           \"image\": null | { \"path\": str, \"builds\": [str], \"binary\": str|null },
           \"time\": TIME (time range sides only) }
  TIME = { \"since\": int|null, \"until\": int|null (the request, Unix seconds),
           \"covered\": [int, int]|null (what the slices exactly cover), \"whole_epochs\": [str],
           \"left_out\": [str] (epoch/host without time slices) }
  CSV: a header line, then one line per row with the row fields above.

EXIT STATUS
  0 success; 1 output error; 2 usage or data error (bad arguments, no such epoch/host/image/
  event in one of the selections, corrupt profile without --keep-going, no sampled time
  recorded with --compare rate).";

/// Command line of `dcpidiff`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "dcpidiff",
    version,
    about = "Compare two selections of dcpi profiles (epochs, days, hosts): per symbol or image, \
             rates of samples per second with a significance test",
    long_about = "Compare two selections of dcpi profiles side by side.\n\n\
                  With --image: one row per function of that image (matched by name across \
                  rebuilds), or per source line with --lines. Without it: one row per image. \
                  Each row has the samples and the rate (samples per second of sampled wall \
                  time) before and after, their ratio, and whether the change is significant \
                  (exact test of two Poisson rates, Holm-corrected over the rows compared, at \
                  --alpha, default 0.01; see below). --compare share compares shares of the \
                  samples instead, --compare samples raw counts.",
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
    /// Compare only the samples of processes with this command name (comm, as `dcpiprof --by
    /// command` shows it) on both sides, from the per-command profiles dcpid writes by
    /// default (`by_command`). Whole epochs only: not with time ranges.
    #[arg(long, value_name = "NAME", conflicts_with = "cgroup")]
    pub command: Option<String>,
    /// Compare only the samples of this cgroup v2 path or its sub-groups, unit (`--unit` is
    /// the same selector) or container id prefix on both sides, as `dcpiprof --cgroup`
    /// selects them, from the per-cgroup profiles (dcpid's `by_cgroup`). Whole epochs only.
    #[arg(long, value_name = "PATH|UNIT", visible_alias = "unit")]
    pub cgroup: Option<String>,
    /// With --image: one row per source line (DWARF), usually with --symbol.
    #[arg(long, requires = "image")]
    pub lines: bool,
    /// With --image: attribute samples to the innermost inlined function (DWARF).
    #[arg(long, requires = "image")]
    pub inlines: bool,
    /// Hide rows whose |delta| is below P, in delta's unit (samples/s, samples or points); they
    /// still count in the test.
    #[arg(long, value_name = "P", default_value_t = 0.0)]
    pub min_delta: f64,
    /// Family-wise significance level (Holm-corrected over the rows compared).
    #[arg(long, value_name = "LEVEL", default_value_t = 0.01)]
    pub alpha: f64,
    /// Smallest change ever called significant: in percent of the before rate (or count)
    /// with `--compare rate` or `samples`, in points with `--compare share`.
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    pub min_effect: f64,
    /// Smallest change ever called significant with `--compare rate` or `samples`, in percent
    /// of the whole selection's before rate (count): a function with 0.1 % of the time that
    /// doubles changed for real, but is not what made the program slower.
    #[arg(long, value_name = "P", default_value_t = 0.5)]
    pub min_impact: f64,
    /// What is compared: `rate` (samples per second of sampled wall time, Poisson test),
    /// `samples` (raw counts, as if both sides ran equally long), `share` (of the image's or all
    /// samples, two-proportion test) [default: rate; share where no sampled time is recorded].
    #[arg(long, value_enum, value_name = "WHAT")]
    pub compare: Option<Compare>,
    #[command(flatten)]
    pub out: OutputArgs,
}

/// What `dcpidiff` compares (`--compare`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compare {
    /// Samples per second of sampled wall time (the default).
    Rate,
    /// Raw sample counts (both sides taken as equally long).
    Samples,
    /// Shares of the image's (or all) samples.
    Share,
}

/// One side of the comparison, as reported.
#[derive(Clone, Debug, Serialize)]
pub struct SideInfo {
    pub epochs: Vec<String>,
    pub hosts: Vec<String>,
    pub total_samples: u64,
    pub total_events: u64,
    /// Sampled wall time of the selection in seconds (see [`sampled_seconds`]); `None` when a
    /// host directory recorded none.
    pub seconds: Option<f64>,
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
    /// Samples per second of sampled wall time (`--compare rate` only).
    pub before_rate: Option<f64>,
    pub after_rate: Option<f64>,
    /// after − before in the unit of the comparison: samples/s, samples or share points.
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
    pub compare: Compare,
    /// Why `compare` is not the default `rate` when it was not asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
    pub method: &'static str,
    pub alpha: f64,
    pub min_effect: f64,
    /// `--min-impact` (rate and samples only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_impact: Option<f64>,
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

const METHOD_SHARE: &str =
    "pooled two-proportion z-test on sample counts, two-sided, Holm-corrected";
const METHOD_RATE: &str = "exact conditional binomial test of two Poisson rates (sample counts \
                           over sampled seconds), two-sided, Holm-corrected";
const METHOD_SAMPLES: &str = "exact conditional binomial test of two Poisson counts (equal \
                              exposure), two-sided, Holm-corrected";

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
            did_you_mean_hint(&event, &available)
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
    if let Some(g) = args.out.names.generate {
        manpages::generate(DiffArgs::command(), g, out)?;
        return Ok(());
    }
    notes::set_verbose(args.out.names.verbose);
    for (name, v) in [
        ("--min-delta", args.min_delta),
        ("--min-effect", args.min_effect),
        ("--min-impact", args.min_impact),
    ] {
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
    let who = WhoSel::of(args.command.as_deref(), args.cgroup.as_deref());
    let mut load = |e: &EpochSel, h: &HostSel| match &who {
        Some(w) => whoprof::load_with(&args.sel, e, h, w, &mut |w| warnings.push(w)),
        None => args.sel.load_with(e, h, filter.as_ref(), &mut |w| warnings.push(w)),
    };
    let before = load(&be, &bh).map_err(|e| side_err("--before", e))?;
    let after = load(&ae, &ah).map_err(|e| side_err("--after", e))?;
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
                locator: args.out.names.symbols.locator(&args.sel.db),
                cache: args.out.names.symbols.cache(&mut |w| warnings.push(w)),
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
    let (mut bside, mut aside) = (bside, aside);
    bside.seconds = sampled_seconds(&before, &event, &mut |w| warnings.push(w))
        .map_err(|e| side_err("--before", e.into()))?;
    aside.seconds = sampled_seconds(&after, &event, &mut |w| warnings.push(w))
        .map_err(|e| side_err("--after", e.into()))?;
    let mut compare = args.compare.unwrap_or(Compare::Rate);
    let mut fallback = None;
    if compare == Compare::Rate {
        for (side, s) in [("--before", &bside), ("--after", &aside)] {
            if s.seconds.is_none() && args.compare.is_none() {
                // Databases written without the counters' times (hand-made, or by another
                // writer): the comparison that needs none, said in the header and the JSON.
                compare = Compare::Share;
                fallback =
                    Some(format!("{side} selection has no sampled time recorded: shares compared"));
                break;
            }
            if s.seconds.is_none() {
                return Err(ToolError::Usage(format!(
                    "{side} selection: no sampled time recorded for event {:?} (summary.json \
                     time_running_ns and cpus) in epoch(s) {}; compare counts with --compare \
                     samples or shares with --compare share",
                    printable(&event),
                    s.epochs.join(",")
                )));
            }
        }
    }
    notes::write_warnings("dcpidiff", err, &mut warnings)?;
    let mut r = compare_sides(args, compare, rows_of, &event, tallies, bside, aside);
    r.test.fallback = fallback;
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
        seconds: None,
        image,
        time: l.time.clone(),
    }
}

/// The sampled wall time of a selection for `event`, in seconds: per host directory, the time
/// the event's counters ran (`time_running_ns` of its summary, summed over the CPUs sampled)
/// divided by the number of CPUs, added up over the directories. That is the time during which
/// the daemon could take the samples counted, so it excludes the gaps of a stopped daemon
/// (which `first_written`..`last_written` would not: a restarted daemon rewrites
/// `last_written`), and it splits at epoch boundaries where the samples split (the daemon
/// reads the counters' times at each cut). `None` when a directory has no such record; an
/// error for a planted (hostile) summary file, as every reader of it.
pub fn sampled_seconds(
    l: &Loaded,
    event: &str,
    warn: &mut dyn FnMut(String),
) -> Result<Option<f64>, profile_format::Error> {
    // A time range side: the range its slices cover, once per host (the daemons sampled the
    // whole range; a host-epoch counted whole or left out makes it approximate, and the
    // header says so).
    if let Some((a, b)) = l.time.as_ref().and_then(|t| t.covered) {
        let hosts: std::collections::BTreeSet<&str> =
            l.dirs.iter().map(|d| d.host.as_str()).collect();
        return Ok((b > a).then(|| (b - a) as f64 * hosts.len().max(1) as f64));
    }
    let mut total = 0.0;
    for (i, d) in l.dirs.iter().enumerate() {
        let read;
        let s = match l.summaries.get(i).and_then(Option::as_ref) {
            Some(s) => s,
            None => match HostSummary::read_facts(&d.summary_path()) {
                Ok(s) => {
                    read = s;
                    &read
                }
                Err(e) if e.is_hostile_file() => return Err(e),
                Err(e) => {
                    if !matches!(&e, profile_format::Error::Io { source, .. }
                        if source.kind() == std::io::ErrorKind::NotFound)
                    {
                        warn(e.to_string());
                    }
                    return Ok(None);
                }
            },
        };
        let mut running = s
            .events
            .iter()
            .find(|e| e.desc.as_ref().is_some_and(|x| x.name == event))
            .map_or(0, |e| e.time_running_ns);
        if running == 0 && report::time_weighted(event) {
            // Off-CPU time has no counter of its own: it was timed while dcpid sampled, so
            // its time is the sampled events' (the longest enabled, over the same CPUs).
            running = s.events.iter().map(|e| e.time_enabled_ns).max().unwrap_or(0);
        }
        if running == 0 || s.cpus.is_empty() {
            return Ok(None);
        }
        total += running as f64 / 1e9 / s.cpus.len() as f64;
    }
    Ok((total > 0.0).then_some(total))
}

fn share(part: f64, total: u64) -> f64 {
    if total > 0 {
        part / total as f64 * 100.0
    } else {
        0.0
    }
}

fn compare_sides(
    args: &DiffArgs,
    compare: Compare,
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
    // Exposures of the Poisson test: sampled seconds, or 1 each (counts compared as they are).
    let (t1, t2) = match compare {
        Compare::Rate => (before.seconds.unwrap_or(0.0), after.seconds.unwrap_or(0.0)),
        _ => (1.0, 1.0),
    };
    // A time-weighted event (off-CPU time): counts are nanoseconds, rates nanoseconds per
    // second of sampled wall time.
    let timed = report::time_weighted(event);
    let mut rows: Vec<DiffRow> = keys
        .into_iter()
        .map(|k| {
            let b = bt.get(&k).unwrap_or(&empty);
            let a = at.get(&k).unwrap_or(&empty);
            let bs = share(b.events, before.total_events);
            let as_ = share(a.events, after.total_events);
            let (z, p_value) = match compare {
                // Nanoseconds are no Poisson counts (nor proportions of samples): no test.
                _ if timed => (0.0, 1.0),
                Compare::Share => {
                    let z = stat::two_proportion_z(b.samples, n1, a.samples, n2);
                    (z, stat::two_sided_p(z))
                }
                Compare::Rate | Compare::Samples => {
                    stat::poisson_rate_test(b.samples, t1, a.samples, t2)
                }
            };
            let (br, ar) = (b.samples as f64 / t1, a.samples as f64 / t2);
            let (delta, ratio) = match compare {
                Compare::Share => (as_ - bs, (bs > 0.0).then(|| as_ / bs)),
                Compare::Rate => (ar - br, (b.samples > 0).then(|| ar / br)),
                Compare::Samples => (
                    a.samples as f64 - b.samples as f64,
                    (b.samples > 0).then(|| a.samples as f64 / b.samples as f64),
                ),
            };
            let rate = compare == Compare::Rate;
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
                before_rate: rate.then(|| r4(br)),
                after_rate: rate.then(|| r4(ar)),
                delta: r4(delta),
                ratio: ratio.map(r4),
                z: r4(z),
                p_value,
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
    // The whole selection's before rate (count), against which --min-impact weighs a change.
    // In the causality run of issue 39 (three functions of ~100 samples/s each, one made 1.3x
    // slower), `main` went from 5 to 21 samples (0.25 -> 1.08 /s, p_adj 0.009): flagged beside
    // the one function that got slower, at 0.27 % of the program's rate.
    let whole_before = if t1 > 0.0 { n1 as f64 / t1 } else { 0.0 };
    for (r, adj) in rows.iter_mut().zip(stat::holm_adjust(&p)) {
        r.p_adjusted = adj;
        let effect = match compare {
            Compare::Share => r.delta.abs(),
            // Percent of the before rate (count); a row absent before is any size.
            Compare::Rate | Compare::Samples => {
                r.ratio.map_or(f64::INFINITY, |x| (x - 1.0).abs() * 100.0)
            }
        };
        let impact = match compare {
            Compare::Share => f64::INFINITY,
            Compare::Rate | Compare::Samples if whole_before > 0.0 => {
                r.delta.abs() / whole_before * 100.0
            }
            Compare::Rate | Compare::Samples => f64::INFINITY,
        };
        r.significant = adj < args.alpha && effect >= args.min_effect && impact >= args.min_impact;
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
            compare,
            fallback: None,
            method: match compare {
                Compare::Rate => METHOD_RATE,
                Compare::Samples => METHOD_SAMPLES,
                Compare::Share => METHOD_SHARE,
            },
            alpha: args.alpha,
            min_effect: args.min_effect,
            min_impact: (compare != Compare::Share).then_some(args.min_impact),
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
    let ep = report::epoch_range(&s.epochs);
    let mut line = format!("epochs {ep}, hosts {}: {} samples", s.hosts.join(","), s.total_samples);
    if let Some(im) = &s.image {
        line.push_str(&format!(" of {}", printable(&im.path)));
        match im.builds.as_slice() {
            [] => {}
            [one] => line.push_str(&format!(" (build {one})")),
            many => line.push_str(&format!(" ({} builds: {})", many.len(), many.join(", "))),
        }
    }
    if let Some(t) = s.seconds {
        line.push_str(&format!("; {t:.1} s sampled"));
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

/// A row's name in the text table: its symbol, or its image's `label` (image rows).
fn row_name(r: &DiffRow, label: Option<String>) -> String {
    let mut n = label.map_or_else(
        || printable(r.symbol.as_deref().or(r.image.as_deref()).unwrap_or_default()),
        |l| printable(&l),
    );
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
        right("before/s", Kind::Decimal(1)).csv("before_rate"),
        right("after/s", Kind::Decimal(1)).csv("after_rate"),
        right("delta", Kind::Signed(if r.test.compare == Compare::Samples { 0 } else { 2 })),
        right("ratio", Kind::Decimal(2)),
        csv_only("z", Kind::Decimal(4)),
        csv_only("p_value", Kind::Scientific),
        csv_only("p_adjusted", Kind::Scientific),
        right("sig", Kind::Text).csv("significant"),
    ]);
    // Rate: the rates say the change (a delta per second would repeat them); share: the
    // shares and the change in points; samples: the counts and their difference.
    let mut shown = match r.test.compare {
        Compare::Rate => vec![2, 3, 8, 9, 11, 15],
        Compare::Samples => vec![2, 3, 10, 11, 15],
        Compare::Share => vec![2, 3, 6, 7, 10, 11, 15],
    };
    if r.rows_of == "lines" {
        shown.push(1);
    }
    shown.push(0);
    t.text_columns(shown);
    let timed = report::time_weighted(&r.event);
    // A time-weighted event: seconds and ms/s in text, nanoseconds (per second) in CSV.
    let secs = |n: u64| -> Cell {
        if timed {
            Value::Both { text: report::seconds_text(n), csv: CsvCell::Number(n.to_string()) }
                .into()
        } else {
            n.into()
        }
    };
    let per_s = |v: Option<f64>, c: Option<&'static str>| -> Cell {
        match v {
            Some(x) if timed => Cell::colored(
                Value::Both {
                    text: format!("{:.1}", x / 1e6),
                    csv: CsvCell::Number(x.to_string()),
                },
                c,
            ),
            _ => Cell::colored(v, c),
        }
    };
    // Image rows are named as every table names images (dcpi_report::image::short_labels);
    // builds of a path share one row here, so only the path tells them apart.
    let paths: Vec<(&str, Option<&str>)> =
        r.rows.iter().map(|x| (x.image.as_deref().unwrap_or_default(), None)).collect();
    let labels = short_labels(&paths);
    for (x, label) in r.rows.iter().zip(labels) {
        let c = match (color && x.significant, x.delta > 0.0) {
            (true, true) => Some(RED),
            (true, false) => Some(GREEN),
            _ => None,
        };
        let name = x.symbol.clone().or(x.image.clone()).unwrap_or_default();
        t.row(vec![
            Value::Both { text: row_name(x, images.then_some(label)), csv: CsvCell::Text(name) }
                .into(),
            x.source.as_deref().into(),
            secs(x.before),
            secs(x.after),
            x.before_events.into(),
            x.after_events.into(),
            x.before_share.into(),
            x.after_share.into(),
            per_s(x.before_rate, None),
            per_s(x.after_rate, c),
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
    let ev = printable(&r.event);
    let timed = report::time_weighted(&r.event);
    let (what, test, effect) = match r.test.compare {
        Compare::Rate if timed => (
            format!(
                "# event {ev}: time-weighted (counts are nanoseconds): before and after in \
                 seconds, before/s and after/s in ms per second of sampled wall time (ns/s in \
                 CSV and JSON); ratio = after/s / before/s"
            ),
            "none",
            String::new(),
        ),
        _ if timed => (
            format!(
                "# event {ev}: time-weighted (counts are nanoseconds, shown as seconds); \
                 delta in the unit compared (ns, or points of share)"
            ),
            "none",
            String::new(),
        ),
        Compare::Rate => (
            format!(
                "# event {ev}; rates are samples per second of sampled wall time; ratio = \
                 after/s / before/s"
            ),
            "Poisson rate test",
            format!(
                "|ratio - 1| >= {}% and |delta| >= {}% of the whole before rate",
                r.test.min_effect,
                r.test.min_impact.unwrap_or(0.0)
            ),
        ),
        Compare::Samples => (
            format!("# event {ev}; raw sample counts (both sides taken as equally long)"),
            "Poisson count test",
            format!(
                "|ratio - 1| >= {}% and |delta| >= {}% of the whole before count",
                r.test.min_effect,
                r.test.min_impact.unwrap_or(0.0)
            ),
        ),
        Compare::Share => (
            format!("# event {ev}; shares are % of {of}; delta = after% - before% in points"),
            "two-proportion z-test",
            format!("|delta| >= {}", r.test.min_effect),
        ),
    };
    t.head(what);
    if let Some(f) = &r.test.fallback {
        t.head(format!("# {}", printable(f)));
    }
    if timed {
        t.head(
            "# sig: no test for a time-weighted event: nanoseconds of waiting are not Poisson \
             sample counts (compare runs of equal load, or the waits' counts in dcpictl status)"
                .to_owned(),
        );
    } else {
        t.head(format!(
            "# sig *: {test}, Holm-corrected over {} rows, alpha {}, {effect}",
            r.test.rows_compared, r.test.alpha
        ));
    }
    let up = r.rows.iter().filter(|x| x.significant && x.delta > 0.0).count();
    let down = r.rows.iter().filter(|x| x.significant && x.delta < 0.0).count();
    t.foot(format!("# significant: {up} up, {down} down"));
    if r.rows_hidden > 0 {
        t.foot(format!("# {} row(s) not shown (--min-delta/--limit)", r.rows_hidden));
    }
}
