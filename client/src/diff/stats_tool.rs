//! `dcpistats`: how much each function's share of one image varies over many profiles (one
//! per epoch or per host), to tell a real change from the workload's own noise, and which
//! epochs or hosts stand out.

use std::collections::BTreeMap;
use std::io::Write;

use clap::{CommandFactory, FromArgMatches, Parser};
use serde::Serialize;

use dcpi_report::render::{Cell, Column, CsvCell, Kind, Style, Table, Value, RED};

use super::common::{
    printable, r4, resolve_image_builds, symbol_rows, OutputArgs, Symbolizer, ToolError,
};
use super::stat;
use crate::args::Selection;
use crate::manpages;
use crate::notes;
use crate::prof::output::TableFormat as Format;
use dcpi_report::render;
use dcpi_report::report::{self, ImageFilter, SymbolMode};
use dcpi_report::select::HostSel;

/// Long help of `dcpistats`.
pub const STATS_HELP: &str = "\
NUMBERS (per symbol, over the groups: one per epoch with --by epoch, per host with --by host)
  share        the symbol's % of the image's (period-weighted) samples in one group; a group
               where the symbol has no samples counts as 0.
  mean         mean share, each group weighted by its number of samples of the image (so a
               profile with few samples counts little).
  stddev       weighted standard deviation of the shares.
  min, max     smallest and largest share over the groups with at least --min-samples samples.
  range/mean   DCPI's normalized range: (max - min) / mean. Rows are sorted by it, largest
               first. Symbols whose mean share is below --min-share are not shown.
  Groups with fewer than --min-samples samples of the image are flagged `low` (in the table
  header and JSON groups[].low_samples), weighted by their samples in mean and stddev, and
  never called outliers.

OUTLIERS
  For each symbol, a group is an outlier when its share is further from the median share of
  the (not low) groups than --outlier-k times sqrt(spread^2 + noise^2), where spread is the
  robust standard deviation of the shares (1.4826 * median absolute deviation) and noise the
  binomial sampling error of that group's share, and also at least --min-effect points away.
  At least 3 groups are needed.

JSON SCHEMA (--format json)
  { \"report\": \"stats\", \"by\": \"epoch\"|\"host\", \"event\": str,
    \"image\": { \"path\": str, \"builds\": [str] }, \"min_samples\": int,
    \"groups\": [ { \"name\": str, \"samples\": int, \"low_samples\": bool,
                  \"outlier_symbols\": int } ],
    \"rows_hidden\": int,
    \"rows\": [ { \"symbol\": str, \"mean\": num, \"stddev\": num, \"min\": num, \"max\": num,
                \"normalized_range\": num, \"samples\": int,
                \"outliers\": [ { \"group\": str, \"share\": num, \"median\": num,
                                \"deviation\": num } ] } ] }
  CSV: symbol,mean,stddev,min,max,normalized_range,samples,outliers (groups joined by ';').

EXIT STATUS
  0 success; 1 output error; 2 usage or data error.";

/// What one row (or the group list) is per.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum StatsBy {
    Epoch,
    Host,
}

/// Command line of `dcpistats`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "dcpistats",
    version,
    about = "Spread of one image's per-function shares over many epochs or hosts; flags \
             outliers",
    long_about = "For each function of one image: mean share, standard deviation, min, max and \
                  the normalized range (max - min) / mean over one profile per epoch (--by \
                  epoch, over all epochs by default) or per host (--by host), sorted by the \
                  normalized range; epochs or hosts that stand out are flagged per function.",
    after_long_help = STATS_HELP,
    mut_args(OutputArgs::tool_help(
        "Colour outlier counts in the table",
        "Show at most N rows; 0 means no limit"
    ))
)]
pub struct StatsArgs {
    #[command(flatten)]
    pub sel: Selection,
    /// The image (as dcpiprof --image); builds of the same path are matched by symbol name.
    #[arg(long, value_name = "IMAGE", required_unless_present = "generate")]
    pub image: Option<String>,
    /// One profile per epoch (hosts merged as --host says) or per host (epochs merged).
    #[arg(long, value_enum, default_value = "epoch")]
    pub by: StatsBy,
    /// Groups with fewer samples of the image than N are flagged and never outliers.
    #[arg(long, value_name = "N", default_value_t = 200)]
    pub min_samples: u64,
    /// Outlier threshold in robust standard deviations (see below).
    #[arg(long, value_name = "K", default_value_t = 4.0)]
    pub outlier_k: f64,
    /// Smallest deviation from the median, in points, called an outlier.
    #[arg(long, value_name = "P", default_value_t = 1.0)]
    pub min_effect: f64,
    /// Hide symbols whose mean share is below P percent.
    #[arg(long, value_name = "P", default_value_t = 0.5)]
    pub min_share: f64,
    #[command(flatten)]
    pub out: OutputArgs,
}

impl StatsArgs {
    /// The clap command, with `--epoch` defaulting to `all` (statistics need many profiles).
    pub fn command_with_defaults() -> clap::Command {
        Self::command().mut_arg("epoch", |a| a.default_value("all"))
    }

    /// Parse the process arguments (exits with the usage error as clap does).
    pub fn parse_args() -> Self {
        Self::parse_from_iter(std::env::args_os())
    }

    pub fn parse_from_iter<I, T>(it: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let m = Self::command_with_defaults().get_matches_from(it);
        Self::from_arg_matches(&m).unwrap_or_else(|e| e.exit())
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct GroupInfo {
    pub name: String,
    pub samples: u64,
    pub low_samples: bool,
    pub outlier_symbols: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct Outlier {
    pub group: String,
    pub share: f64,
    pub median: f64,
    pub deviation: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct StatsRow {
    pub symbol: String,
    pub mean: f64,
    pub stddev: f64,
    pub min: f64,
    pub max: f64,
    pub normalized_range: f64,
    pub samples: u64,
    pub outliers: Vec<Outlier>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StatsImage {
    pub path: String,
    pub builds: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct StatsReport {
    pub report: &'static str,
    pub by: StatsBy,
    pub event: String,
    pub image: StatsImage,
    pub min_samples: u64,
    pub groups: Vec<GroupInfo>,
    pub rows_hidden: usize,
    pub rows: Vec<StatsRow>,
}

/// Per group: image samples, image events, and per symbol (samples, events).
#[derive(Default)]
struct Group {
    samples: u64,
    events: f64,
    symbols: BTreeMap<String, (u64, f64)>,
}

/// Run `dcpistats`.
pub fn run_stats(
    args: &StatsArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), ToolError> {
    if let Some(g) = args.out.names.generate {
        manpages::generate(StatsArgs::command_with_defaults(), g, out)?;
        return Ok(());
    }
    notes::set_verbose(args.out.names.verbose);
    if !(args.outlier_k.is_finite() && args.outlier_k > 0.0) {
        return Err(ToolError::Usage(format!(
            "--outlier-k {}: expected a number > 0",
            args.outlier_k
        )));
    }
    for (name, v) in [("--min-effect", args.min_effect), ("--min-share", args.min_share)] {
        if !(v.is_finite() && v >= 0.0) {
            return Err(ToolError::Usage(format!("{name} {v}: expected a number >= 0")));
        }
    }
    let Some(image) = args.image.as_deref() else {
        return Err(ToolError::Usage("--image is required".into()));
    };
    let mut warnings: Vec<String> = Vec::new();
    // Comparing hosts means every host unless one is named.
    let host = match (args.by, args.sel.host.as_deref()) {
        (StatsBy::Host, None) => HostSel::All,
        _ => args.sel.host_sel(),
    };
    let filter = ImageFilter::new(image);
    let loaded = args
        .sel
        .load_with(&args.sel.epoch_sel(), &host, Some(&filter), &mut |w| warnings.push(w))?;
    if loaded.profiles.is_empty() {
        let w = report::weights(&loaded, &[])?;
        resolve_image_builds(&loaded, &w, image)?;
    }
    let event = super::common::pick_event(&loaded, &args.sel.events)?;
    let w = report::weights(&loaded, std::slice::from_ref(&event))?;
    let im = resolve_image_builds(&loaded, &w, image)?;
    let mut by_group: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for d in &loaded.dirs {
        by_group.entry(group_name(args.by, d)).or_default();
    }
    for &i in &im.idx {
        let d = &loaded.dirs[loaded.profiles[i].dir];
        by_group.entry(group_name(args.by, d)).or_default().push(i);
    }
    let mut sy = Symbolizer {
        locator: args.out.names.symbols.locator(&args.sel.db),
        cache: args.out.names.symbols.cache(&mut |w| warnings.push(w)),
    };
    let mut groups: Vec<(String, Group)> = Vec::new();
    for (name, idx) in by_group {
        let mut g = Group::default();
        if !idx.is_empty() {
            let (rows, _) =
                symbol_rows(&loaded, &w, &idx, &mut sy, SymbolMode::default(), &mut |m| {
                    warnings.push(m)
                });
            for r in rows {
                g.samples += r.samples;
                g.events += r.events as f64;
                let e = g.symbols.entry(r.symbol).or_default();
                e.0 += r.counts.samples;
                e.1 += r.counts.events as f64;
            }
        }
        groups.push((name, g));
    }
    notes::write_warnings("dcpistats", err, &mut warnings)?;
    if groups.iter().filter(|(_, g)| g.samples > 0).count() < 2 {
        return Err(ToolError::Usage(format!(
            "image {} has samples in fewer than 2 {}s of the selection; statistics need \
             several (widen --epoch or --host)",
            im.path,
            if args.by == StatsBy::Epoch { "epoch" } else { "host" }
        )));
    }
    let r = compute(args, &event, im, groups);
    write_stats(out, &r, args.out.format, args.out.color.enabled())?;
    out.flush()?;
    Ok(())
}

fn group_name(by: StatsBy, d: &profile_format::HostDir) -> String {
    match by {
        StatsBy::Epoch => d.epoch.to_string(),
        StatsBy::Host => d.host.clone(),
    }
}

fn compute(
    args: &StatsArgs,
    event: &str,
    im: super::common::ImageProfiles,
    groups: Vec<(String, Group)>,
) -> StatsReport {
    // Groups without any sample of the image say nothing about shares.
    let groups: Vec<(String, Group)> = groups.into_iter().filter(|(_, g)| g.samples > 0).collect();
    let mut names: Vec<&String> = groups.iter().flat_map(|(_, g)| g.symbols.keys()).collect();
    names.sort();
    names.dedup();
    let mut outlier_count = vec![0usize; groups.len()];
    let mut rows: Vec<StatsRow> = Vec::new();
    for name in names {
        // (share %, samples of the image in the group, low?) per group.
        let per: Vec<(f64, u64, bool)> = groups
            .iter()
            .map(|(_, g)| {
                let ev = g.symbols.get(name).map_or(0.0, |s| s.1);
                let share = if g.events > 0.0 { ev / g.events * 100.0 } else { 0.0 };
                (share, g.samples, g.samples < args.min_samples)
            })
            .collect();
        let weighted: Vec<(f64, f64)> = per.iter().map(|&(s, n, _)| (s, n as f64)).collect();
        let (mean, sd) = stat::weighted_mean_sd(&weighted);
        let good: Vec<f64> = per.iter().filter(|p| !p.2).map(|p| p.0).collect();
        let pool: Vec<f64> =
            if good.is_empty() { per.iter().map(|p| p.0).collect() } else { good.clone() };
        let min = pool.iter().copied().fold(f64::INFINITY, f64::min);
        let max = pool.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut outliers = Vec::new();
        if good.len() >= 3 {
            let med = stat::median(&good);
            let dev: Vec<f64> = good.iter().map(|s| (s - med).abs()).collect();
            let spread = 1.4826 * stat::median(&dev);
            let c = (med / 100.0).clamp(0.0, 1.0);
            for (gi, &(share, n, low)) in per.iter().enumerate() {
                if low {
                    continue;
                }
                let noise = (c * (1.0 - c) / n as f64).sqrt() * 100.0;
                let d = share - med;
                let limit = args.outlier_k * (spread * spread + noise * noise).sqrt();
                if d.abs() > limit && d.abs() >= args.min_effect {
                    outlier_count[gi] += 1;
                    outliers.push(Outlier {
                        group: groups[gi].0.clone(),
                        share: r4(share),
                        median: r4(med),
                        deviation: r4(d),
                    });
                }
            }
        }
        rows.push(StatsRow {
            symbol: name.clone(),
            mean: r4(mean),
            stddev: r4(sd),
            min: r4(min),
            max: r4(max),
            normalized_range: if mean > 0.0 { r4((max - min) / mean) } else { 0.0 },
            samples: groups.iter().map(|(_, g)| g.symbols.get(name).map_or(0, |s| s.0)).sum(),
            outliers,
        });
    }
    rows.sort_by(|a, b| {
        b.normalized_range.total_cmp(&a.normalized_range).then_with(|| a.symbol.cmp(&b.symbol))
    });
    let before = rows.len();
    rows.retain(|r| r.mean >= args.min_share);
    if let Some(n) = args.out.limit {
        rows.truncate(n);
    }
    let group_info = groups
        .iter()
        .zip(&outlier_count)
        .map(|((name, g), &k)| GroupInfo {
            name: name.clone(),
            samples: g.samples,
            low_samples: g.samples < args.min_samples,
            outlier_symbols: k,
        })
        .collect();
    StatsReport {
        report: "stats",
        by: args.by,
        event: event.to_owned(),
        image: StatsImage { path: im.path, builds: im.builds },
        min_samples: args.min_samples,
        groups: group_info,
        rows_hidden: before - rows.len(),
        rows,
    }
}

/// Render a `dcpistats` report.
pub fn write_stats(
    out: &mut dyn Write,
    r: &StatsReport,
    fmt: Format,
    color: bool,
) -> std::io::Result<()> {
    let by = match r.by {
        StatsBy::Epoch => "epoch",
        StatsBy::Host => "host",
    };
    let mut t = Table::new();
    let share = |title: &str, csv: &str| Column::new(title, Kind::Decimal(2)).csv(csv);
    t.columns([
        Column::new("symbol", Kind::Text),
        share("mean%", "mean"),
        share("stddev", "stddev"),
        share("min%", "min"),
        share("max%", "max"),
        Column::new("range/mean", Kind::Decimal(3)).csv("normalized_range"),
        Column::new("samples", Kind::Count),
        Column::new("outliers", Kind::Text).right(),
    ]);
    t.text_columns(vec![1, 2, 3, 4, 5, 6, 7, 0]);
    for x in &r.rows {
        let groups: Vec<&str> = x.outliers.iter().map(|o| o.group.as_str()).collect();
        let outliers = Value::Both {
            text: x.outliers.len().to_string(),
            csv: CsvCell::Text(groups.join(";")),
        };
        let oc = (color && !x.outliers.is_empty()).then_some(RED);
        t.row(vec![
            x.symbol.as_str().into(),
            x.mean.into(),
            x.stddev.into(),
            x.min.into(),
            x.max.into(),
            x.normalized_range.into(),
            x.samples.into(),
            Cell::colored(outliers, oc),
        ]);
    }
    if fmt == Format::Table {
        t.head(format!(
            "# image: {} ({})",
            printable(&r.image.path),
            if r.image.builds.is_empty() {
                "no build-id".into()
            } else {
                r.image.builds.join(", ")
            }
        ));
        let low = r.groups.iter().filter(|g| g.low_samples).count();
        t.head(format!(
            "# event {}; by {by}: {} {by}s with samples, {low} with fewer than {} samples \
             (low: weighted by samples, never outliers)",
            printable(&r.event),
            r.groups.len(),
            r.min_samples
        ));
        for g in &r.groups {
            let mut flags = Vec::new();
            if g.low_samples {
                flags.push("low".to_owned());
            }
            if g.outlier_symbols > 0 {
                flags.push(format!("OUTLIER for {} symbol(s)", g.outlier_symbols));
            }
            let flags =
                if flags.is_empty() { String::new() } else { format!("  [{}]", flags.join(", ")) };
            t.head(format!("#   {by} {}: {} samples{flags}", printable(&g.name), g.samples));
        }
        for x in &r.rows {
            for o in &x.outliers {
                t.foot(format!(
                    "# outlier: {} in {by} {}: {:.2}% vs median {:.2}% ({})",
                    printable(&x.symbol),
                    printable(&o.group),
                    o.share,
                    o.median,
                    render::signed(o.deviation, 2)
                ));
            }
        }
        if r.rows_hidden > 0 {
            t.foot(format!("# {} symbol(s) not shown (--min-share/--limit)", r.rows_hidden));
        }
    }
    t.write(out, fmt.into(), Style::default(), r)
}
