//! `dcpiprof --by epoch|host`: one row per group (samples and share) for the whole selection,
//! one image (`--image`) or one of its functions (`--image --symbol`), so a trend over time or
//! across a fleet is one command.

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::{json, Map, Value};

use super::output::TableFormat;
use super::output::{printable, r4};
use super::subset::{resolve_image_builds, symbol_rows, Symbolizer};
use crate::args::{Selection, SymbolSearch};
use crate::notes;
use dcpi_report::error::ProfError;
use dcpi_report::render;
use dcpi_report::render::CsvCell;
use dcpi_report::render::{Column, Kind, Output, Style, Table};
use dcpi_report::report::SymbolMode;
use dcpi_report::report::{self, ImageFilter};
use dcpi_report::stats;

/// `--by epoch|host`, of the selection, of `--image` or of its `--symbol`.
#[derive(Clone, Debug)]
pub struct Trend {
    pub sel: Selection,
    pub across: Across,
    pub focus: Focus,
}

/// What a `--by epoch|host|time` report is of, and how it is named and printed (the same for
/// both: [`Trend`] and `timeline::Timeline`).
#[derive(Clone, Debug)]
pub struct Focus {
    pub image: Option<String>,
    /// `--symbol` (only with `image`).
    pub symbol: Option<String>,
    pub symbols: SymbolSearch,
    pub mode: SymbolMode,
    pub no_idle: bool,
    pub format: TableFormat,
    pub verbose: bool,
}

/// What the rows of a `--by` report are per. image and symbol are the per-image and
/// per-symbol reports; command, pid, cgroup, unit, container and cpu read the who tables
/// (as every dimension does with --command/--cgroup/--pid/--cpu).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum By {
    /// One row per image (the default report; with a who filter, from the who tables).
    Image,
    /// One row per symbol: of --image, else of all images (as --symbols).
    Symbol,
    /// One row per command name (comm).
    Command,
    /// One row per process id (needs dcpid's `by_pid`).
    Pid,
    /// One row per cgroup v2 path.
    Cgroup,
    /// One row per systemd unit (the cgroup path's innermost *.service, else *.scope).
    Unit,
    /// One row per container id (a 64-hex component of the cgroup path).
    Container,
    /// One row per CPU.
    Cpu,
    /// One row per host (epochs merged as --epoch says).
    Host,
    /// One row per epoch (hosts merged as --host says).
    Epoch,
    /// One row per time bucket (--resolution), from the time slices (slices.log).
    Time,
}

impl By {
    pub fn name(self) -> &'static str {
        match self {
            Self::Image => "image",
            Self::Symbol => "symbol",
            Self::Command => "command",
            Self::Pid => "pid",
            Self::Cgroup => "cgroup",
            Self::Unit => "unit",
            Self::Container => "container",
            Self::Cpu => "cpu",
            Self::Epoch => "epoch",
            Self::Host => "host",
            Self::Time => "time",
        }
    }

    /// Dimensions only the who tables have.
    pub fn is_who(self) -> bool {
        matches!(
            self,
            Self::Command | Self::Pid | Self::Cgroup | Self::Unit | Self::Container | Self::Cpu
        )
    }
}

/// What a trend (`--by epoch|host`) has a row per.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Across {
    Epoch,
    Host,
}

impl Across {
    pub fn name(self) -> &'static str {
        match self {
            Self::Epoch => By::Epoch.name(),
            Self::Host => By::Host.name(),
        }
    }

    fn key(self, d: &profile_format::HostDir) -> String {
        match self {
            Self::Host => d.host.clone(),
            Self::Epoch => d.epoch.to_string(),
        }
    }
}

/// Samples and weighted events of a row and of what its share is taken of.
#[derive(Default, Clone, Copy)]
struct Part {
    samples: u64,
    events: f64,
    of_events: f64,
}

/// Run a `--by epoch|host` report.
pub fn run_by(tr: &Trend, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), ProfError> {
    let by = tr.across;
    let mut warnings: Vec<String> = Vec::new();
    let filter = match (&tr.focus.image, &tr.focus.symbol) {
        (Some(i), Some(_)) => Some(ImageFilter::new(i)),
        _ => None,
    };
    let mut loaded = tr.sel.load(filter.as_ref(), &mut |w| warnings.push(w))?;
    if tr.focus.no_idle {
        loaded.exclude_idle();
    }
    let w = report::weights(&loaded, &tr.sel.events)?;
    let image = match &tr.focus.image {
        Some(spec) => Some(resolve_image_builds(&loaded, &w, spec)?),
        None => None,
    };
    let event = w.events.first().cloned().ok_or_else(|| {
        ProfError::Empty("no samples in the selected epoch(s) and host(s)".to_owned())
    })?;
    let mut parts: BTreeMap<String, Part> = BTreeMap::new();
    for d in &loaded.dirs {
        parts.entry(by.key(d)).or_default();
    }
    let key_of = |i: usize| by.key(&loaded.dirs[loaded.profiles[i].dir]);
    let first_event = |i: usize| w.per_profile[i].filter(|&(ei, _)| ei == 0).map(|(_, wt)| wt);
    match (&image, &tr.focus.symbol) {
        (None, _) => {
            let mut all = 0.0;
            for (i, p) in loaded.profiles.iter().enumerate() {
                if let Some(wt) = first_event(i) {
                    let e = parts.entry(key_of(i)).or_default();
                    e.samples += p.samples;
                    e.events += p.samples as f64 * wt;
                    all += p.samples as f64 * wt;
                }
            }
            for p in parts.values_mut() {
                p.of_events = all;
            }
        }
        (Some(im), None) => {
            for (i, p) in loaded.profiles.iter().enumerate() {
                if let Some(wt) = first_event(i) {
                    let e = parts.entry(key_of(i)).or_default();
                    e.of_events += p.samples as f64 * wt;
                    if im.idx.contains(&i) {
                        e.samples += p.samples;
                        e.events += p.samples as f64 * wt;
                    }
                }
            }
        }
        (Some(im), Some(sym)) => {
            let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
            for &i in &im.idx {
                if first_event(i).is_some() {
                    groups.entry(key_of(i)).or_default().push(i);
                }
            }
            let mut sy = Symbolizer {
                locator: tr.focus.symbols.locator(&tr.sel.db),
                cache: tr.focus.symbols.cache(&mut |m| warnings.push(m)),
            };
            for (k, idx) in groups {
                let (rows, _) = symbol_rows(&loaded, &w, &idx, &mut sy, tr.focus.mode, &mut |m| {
                    warnings.push(m)
                });
                let e = parts.entry(k).or_default();
                for r in rows {
                    e.of_events += r.events as f64;
                    if r.symbol == *sym {
                        e.samples += r.samples;
                        e.events += r.events as f64;
                    }
                }
            }
        }
    }
    notes::write_warnings("dcpiprof", err, &mut warnings)?;
    let of = match (&tr.focus.image, &tr.focus.symbol) {
        (None, _) => "the whole selection".to_owned(),
        (Some(_), None) => format!("all samples of the {}", by.name()),
        (Some(_), Some(_)) => format!("the image's samples in the {}", by.name()),
    };
    let rows: Vec<(String, Part)> = parts.into_iter().collect();
    let pct = |p: &Part| if p.of_events > 0.0 { r4(p.events / p.of_events * 100.0) } else { 0.0 };
    let form = Output::from(tr.focus.format);
    // The JSON document (its schema in --help), made only when asked for.
    let v = if form == Output::Json {
        let rows: Vec<Value> = rows
            .iter()
            .map(|(k, p)| {
                let mut m = Map::new();
                m.insert(by.name().to_owned(), json!(k));
                m.insert("samples".into(), json!(p.samples));
                m.insert("events".into(), json!(p.events.round() as u64));
                m.insert("percent".into(), json!(pct(p)));
                Value::Object(m)
            })
            .collect();
        json!({
            "report": "by",
            "by": by.name(),
            "database": tr.sel.db.display().to_string(),
            "event": event,
            "image": tr.focus.image,
            "symbol": tr.focus.symbol,
            "percent_of": of,
            "rows": rows,
        })
    } else {
        Value::Null
    };
    // A time-weighted event (off-CPU time): its counts are nanoseconds, shown as seconds in
    // text (`time`), nanoseconds in CSV (`ns`) and JSON (`samples`).
    let timed = report::time_weighted(&event);
    let mut t = group_table(
        by.name(),
        [
            if timed {
                Column::new("time", Kind::Count).csv("ns")
            } else {
                Column::new("samples", Kind::Count)
            },
            Column::new("events", Kind::Count),
            Column::new("%", Kind::Decimal(2)).csv("percent"),
        ],
        &tr.sel.db,
    );
    let mut what = format!("# event {event}");
    if let Some(i) = &tr.focus.image {
        what.push_str(&format!("; image {}", printable(i)));
    }
    if let Some(s) = &tr.focus.symbol {
        what.push_str(&format!("; symbol {}", printable(s)));
    }
    t.head(format!("{}; % of {of}", printable(&what)));
    for (k, p) in &rows {
        let first = if timed {
            let csv = CsvCell::Number(p.samples.to_string());
            render::Value::Both { text: report::seconds_text(p.samples), csv }
        } else {
            p.samples.into()
        };
        t.row(vec![
            k.as_str().into(),
            first.into(),
            (p.events.round() as u64).into(),
            pct(p).into(),
        ]);
    }
    t.write(out, form, Style::default(), &v)?;
    out.flush()?;
    if tr.focus.verbose {
        writeln!(err, "dcpiprof: stats: {}", stats::line())?;
    }
    Ok(())
}

/// The table of a `--by` report: the group column (CSV first, text last) and `counts`, under a
/// `# database:` line.
pub(super) fn group_table(
    name: &str,
    counts: impl IntoIterator<Item = Column>,
    db: &std::path::Path,
) -> Table {
    let mut t = Table::new();
    t.column(Column::new(name, Kind::Text));
    t.columns(counts);
    let mut shown: Vec<usize> = (1..t.columns.len()).collect();
    shown.push(0);
    t.text_columns(shown);
    t.head(format!("# database: {}", db.display()));
    t
}
