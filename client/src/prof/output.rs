//! Rendering reports as a table, JSON or CSV.

use std::io::{self, Write};

use dcpi_report::render::{Cell, Column, Kind, Output, Show, Table, Value};
use dcpi_report::report::{
    seconds_text, time_weighted, EventCount, EventInfo, IdleShare, ImageReport, Scope,
    SymbolReport, SymbolRow,
};

use dcpi_report::escape::terminal as esc;

/// `--format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned text table with a header.
    Table,
    /// JSON (schema below).
    Json,
    /// CSV with a header line.
    Csv,
    /// Folded stacks for flame graph tools: `image;symbol count` per line.
    Folded,
    /// Gzipped pprof profile.proto (go tool pprof, Parca, Pyroscope).
    Pprof,
    /// Flame graph SVG (searchable, zoomable).
    Svg,
    /// Self-contained HTML report (tables, flame graph, trend).
    Html,
    /// speedscope JSON (speedscope.app, also read by Firefox Profiler's importer).
    Speedscope,
}

/// `--format` of tools that print tables only (dcpilist, dcpidiff, dcpistats).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum TableFormat {
    /// Aligned text table with a header.
    Table,
    /// JSON (schema in --help).
    Json,
    /// CSV with a header line.
    Csv,
}

impl Format {
    /// Formats written from symbolized samples by [`super::export`].
    pub fn is_export(self) -> bool {
        matches!(self, Self::Folded | Self::Pprof | Self::Svg | Self::Html | Self::Speedscope)
    }
}

pub(crate) fn not_a_report(fmt: Format) -> io::Error {
    io::Error::other(format!("{fmt:?} is an export format, not a report table"))
}

use dcpi_report::render::CsvCell;
/// How a table is drawn ([`dcpi_report::render::Style`]).
pub use dcpi_report::render::{number, Style};
use dcpi_report::report::epoch_range;

/// The renderer's form of a report `--format`; an export format is not a table.
pub(crate) fn form(fmt: Format) -> io::Result<Output> {
    match fmt {
        Format::Table => Ok(Output::Text),
        Format::Csv => Ok(Output::Csv),
        Format::Json => Ok(Output::Json),
        Format::Folded | Format::Pprof | Format::Svg | Format::Html | Format::Speedscope => {
            Err(not_a_report(fmt))
        }
    }
}

impl From<TableFormat> for Output {
    fn from(f: TableFormat) -> Self {
        match f {
            TableFormat::Table => Self::Text,
            TableFormat::Csv => Self::Csv,
            TableFormat::Json => Self::Json,
        }
    }
}

/// `12 s`, `5 min`, `3 h`, `2 days`.
fn age(secs: u64) -> String {
    match secs {
        0..120 => format!("{secs} s"),
        120..7200 => format!("{} min", secs / 60),
        7200..172_800 => format!("{} h", secs / 3600),
        _ => format!("{} days", secs / 86_400),
    }
}

/// The freshness line: a report of the current epoch lags the machine by up to the daemon's
/// flush interval, and a user comparing it with `perf` or `top` should know by how much.
fn freshness(newest: u64) -> Option<String> {
    if newest == 0 {
        return None;
    }
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(newest);
    let now = std::time::SystemTime::now();
    let old = now.duration_since(t).map_or(0, |d| d.as_secs());
    let hint = if old < 86_400 { "; run `dcpictl flush` for the last seconds" } else { "" };
    Some(format!(
        "# newest data: {} old (written {}){hint}",
        age(old),
        humantime::format_rfc3339_seconds(t)
    ))
}

/// The comment lines above a report table: database, epochs, hosts, events, freshness, total.
fn header(scope: &Scope, events: &[EventInfo], total: u64, style: Style) -> Vec<String> {
    let mut h = scope_lines(scope, events, "", style);
    h.extend(freshness(scope.newest_data));
    h.extend(wall_note(events));
    match events.first() {
        // `total` is the first event's: nanoseconds for a time-weighted one.
        Some(e) if time_weighted(&e.name) => {
            h.push(format!("# total {}: {}", esc(&e.name), seconds_text(total)));
        }
        _ => h.push(format!("# total samples: {}", number(total, style))),
    }
    h
}

/// The database, epochs, hosts and events of a report (`samples {what}` per event: dcpilist
/// says `in the function` or `in total`).
pub(crate) fn scope_lines(
    scope: &Scope,
    events: &[EventInfo],
    what: &str,
    style: Style,
) -> Vec<String> {
    let mut h = vec![
        format!("# database: {}", esc(&scope.database)),
        format!("# epochs: {}", epoch_range(&scope.epochs)),
        format!("# hosts: {}", scope.hosts.join(", ")),
    ];
    if let Some(t) = &scope.time {
        h.extend(t.lines().into_iter().map(|l| format!("# {}", esc(&l))));
    }
    let what = if what.is_empty() { String::new() } else { format!(" {what}") };
    for e in events {
        if time_weighted(&e.name) {
            // Counts are nanoseconds (period 1): no mean period, no estimate to state.
            h.push(format!(
                "# event {}: {}{what} of time-weighted counts (each wait adds its length in \
                 nanoseconds; text shows seconds, JSON and CSV nanoseconds)",
                esc(&e.name),
                seconds_text(e.samples),
            ));
            continue;
        }
        let mux = if e.multiplex_scale > 1.0 {
            format!(", scaled for multiplexing (up to x{:.2})", e.multiplex_scale)
        } else {
            String::new()
        };
        h.push(format!(
            "# event {}: {} samples{what}, mean period {} (nominal {}), ~{} events{mux}",
            esc(&e.name),
            number(e.samples, style),
            if style.human {
                number(e.mean_period.round() as u64, style)
            } else {
                format!("{:.0}", e.mean_period)
            },
            number(e.nominal_period, style),
            number(e.events, style)
        ));
    }
    h
}

/// How the per-event count columns are titled in a text table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CountTitles {
    /// dcpiprof: `samples events %`, or `E E:events E:%` per event.
    Prof,
    /// dcpilist: `samples %`, or `E E%` per event (the events column in CSV only).
    List,
}

/// Add the per-event count columns (samples, events, percent of each event; CSV titles
/// `E.samples E.events E.percent`); the indices of the columns the text table shows.
pub(crate) fn count_columns(
    t: &mut Table,
    events: &[EventInfo],
    titles: CountTitles,
) -> Vec<usize> {
    let one = events.len() == 1;
    let mut shown = Vec::new();
    for e in events {
        let n = esc(&e.name);
        if time_weighted(&e.name) {
            // Time, not samples: seconds in the text table (`time`, or `E:s` beside other
            // events), nanoseconds in CSV (`E.ns`); `events` equals it (period 1), CSV only.
            let name = &e.name;
            let (s, p) = if one {
                ("time".to_owned(), "%".to_owned())
            } else {
                (format!("{n}:s"), format!("{n}:%"))
            };
            let s = t.column(Column::new(s, Kind::Count).csv(format!("{name}.ns")));
            t.column(Column::new("", Kind::Count).csv(format!("{name}.events")));
            let p = t.column(Column::new(p, Kind::Decimal(2)).csv(format!("{name}.percent")));
            shown.push(s);
            shown.push(p);
            continue;
        }
        let (s, ev, p) = match (titles, one) {
            (CountTitles::Prof, true) => {
                ("samples".to_owned(), "events".to_owned(), "%".to_owned())
            }
            (CountTitles::Prof, false) => (n.to_string(), format!("{n}:events"), format!("{n}:%")),
            (CountTitles::List, true) => ("samples".to_owned(), String::new(), "%".to_owned()),
            (CountTitles::List, false) => (n.to_string(), String::new(), format!("{n}%")),
        };
        let name = &e.name;
        let s = t.column(Column::new(s, Kind::Count).csv(format!("{name}.samples")));
        let ev = t.column(Column::new(ev, Kind::Count).csv(format!("{name}.events")));
        let p = t.column(Column::new(p, Kind::Decimal(2)).csv(format!("{name}.percent")));
        shown.push(s);
        if titles == CountTitles::Prof {
            shown.push(ev);
        }
        shown.push(p);
    }
    shown
}

/// The cells of [`count_columns`].
pub(crate) fn count_cells(counts: &[EventCount]) -> impl Iterator<Item = Cell> + '_ {
    counts.iter().flat_map(|c| {
        let first = if time_weighted(&c.event) {
            let csv = CsvCell::Number(c.samples.to_string());
            Value::Both { text: seconds_text(c.samples), csv }
        } else {
            c.samples.into()
        };
        [first.into(), c.events.into(), c.percent.into()]
    })
}

/// An on-CPU clock event (its period is nanoseconds of CPU time per sample).
fn clock_event(name: &str) -> bool {
    matches!(name, "cpu-clock" | "task-clock")
}

/// The events of a wall view, by their index: an on-CPU clock event and a time-weighted one
/// (off-CPU time), both in the report (`--event cpu-clock --event off-cpu`).
fn wall_pair<'a>(names: impl Iterator<Item = &'a str> + Clone) -> Option<(usize, usize)> {
    let on = names.clone().position(clock_event)?;
    let off = names.clone().position(time_weighted)?;
    Some((on, off))
}

/// The header line of a wall view: how on-CPU samples became time.
fn wall_note(events: &[EventInfo]) -> Option<String> {
    let (on, off) = wall_pair(events.iter().map(|e| e.name.as_str()))?;
    let (on, off) = (&events[on], &events[off]);
    Some(format!(
        "# wall = on-CPU time + off-CPU time: {} samples converted to time by their sampling \
         period (each sample stands for its period, mean {:.0} ns, of CPU time: {} on CPU), \
         plus {}'s {} off CPU; wall.ns in CSV",
        esc(&on.name),
        on.mean_period,
        seconds_text(on.events),
        esc(&off.name),
        seconds_text(off.events),
    ))
}

/// The wall cell of a row of a wall view (see [`wall_pair`]): the on-CPU event's weighted
/// estimate (nanoseconds) plus the off-CPU nanoseconds.
fn wall_cell(counts: &[EventCount]) -> Option<Cell> {
    let (on, off) = wall_pair(counts.iter().map(|c| c.event.as_str()))?;
    let ns = counts[on].events.saturating_add(counts[off].events);
    let csv = CsvCell::Number(ns.to_string());
    Some(Value::Both { text: seconds_text(ns), csv }.into())
}

/// Whether the percentages include the idle task, and what that says about the machine.
fn idle_note(idle: &IdleShare) -> Vec<String> {
    if !idle.included {
        return vec!["# % of busy time: the idle task ([idle]) is left out (--no-idle)".into()];
    }
    let mut h = Vec::new();
    if idle.percent <= 0.0 {
        return h;
    }
    if idle.mostly_idle() {
        h.push(format!(
            "# the machine was mostly idle: {:.1}% of the samples are the idle task ([idle]); \
             --no-idle shows the busy time alone",
            idle.percent
        ));
    }
    h.push(format!(
        "# % include the idle task ([idle], {:.1}%); [kernel.kallsyms] is kernel work for \
         processes",
        idle.percent
    ));
    h
}

/// A table of rows with per-event counts and a running total: the key columns (CSV first,
/// the last of them shown last in text), the counts, `cum%`.
fn ranked_table(events: &[EventInfo], keys: Vec<Column>, text_keys: &[usize]) -> Table {
    let mut t = Table::new();
    t.columns(keys);
    let mut shown = count_columns(&mut t, events, CountTitles::Prof);
    if wall_pair(events.iter().map(|e| e.name.as_str())).is_some() {
        shown.push(t.column(Column::new("wall", Kind::Count).csv("wall.ns")));
    }
    shown.push(t.column(Column::new("cum%", Kind::Decimal(2)).csv("cumulative_percent")));
    shown.extend(text_keys);
    t.text_columns(shown);
    t
}

/// The key cells of an image row: image, kind, build-id and `last` (image id or symbol).
fn image_keys(image: &str, kind: &str, build_id: &Option<String>, last: Option<&str>) -> Vec<Cell> {
    vec![
        Value::image(image, build_id.as_deref()).into(),
        kind.into(),
        build_id.as_deref().into(),
        last.into(),
    ]
}

/// A row of a [`ranked_table`]: its key cells, counts and running total.
fn ranked_row(t: &mut Table, keys: Vec<Cell>, counts: &[EventCount], cum: Value, show: Show) {
    let mut c = keys;
    c.extend(count_cells(counts));
    c.extend(wall_cell(counts));
    c.push(cum.into());
    t.push(c, show);
}

pub fn write_images(
    out: &mut dyn Write,
    r: &ImageReport,
    fmt: Format,
    style: Style,
) -> io::Result<()> {
    let form = form(fmt)?;
    let text = |s: &str| Column::new(s, Kind::Text);
    let mut t = ranked_table(
        &r.head.events,
        vec![text("image"), text("kind"), text("build_id"), text("image_id")],
        &[0],
    );
    t.head = header(&r.head.scope, &r.head.events, r.head.total_samples, style);
    t.head.extend(idle_note(&r.idle));
    for row in &r.rows {
        let keys = image_keys(&row.image, row.kind, &row.build_id, row.image_id.as_deref());
        ranked_row(&mut t, keys, &row.counts.per_event, row.cumulative_percent.into(), Show::Both);
    }
    if r.head.rows_omitted > 0 {
        t.foot(format!("# {} more image(s) not shown (--limit)", r.head.rows_omitted));
    }
    t.write(out, form, style, r)
}

pub fn write_symbols(
    out: &mut dyn Write,
    r: &SymbolReport,
    fmt: Format,
    style: Style,
) -> io::Result<()> {
    let form = form(fmt)?;
    let with_source = r.rows.iter().any(|x| x.source.is_some());
    let title = if with_source { "symbol / source line" } else { "symbol" };
    let keys =
        vec![Column::new(title, Kind::Text).csv("symbol"), Column::new("source", Kind::Text)];
    let mut t = ranked_table(&r.events, keys, &[0]);
    t.head = header(&r.scope, &r.events, r.total_samples, style);
    let mut id = r.image.build_id.as_ref().map_or_else(
        || r.image.image_id.clone().map(|i| format!(" (id {i})")).unwrap_or_default(),
        |b| format!(" (build-id {b})"),
    );
    if let Some(b) = &r.image.binary {
        id.push_str(&format!("\n# symbols from: {}", esc(b)));
    }
    if let Some(d) = &r.image.debug_file {
        id.push_str(&format!("\n# debug info from: {}", esc(d)));
    }
    if let Some(n) = &r.image.symbols_note {
        id.push_str(&format!("\n# symbols: {}", esc(n)));
    }
    t.head(format!("# image: {}{id}", esc(&r.image.path)));
    // With source lines the text table has each line under its symbol (line_rows); CSV has
    // one line per (symbol, line).
    let show = if with_source { Show::Csv } else { Show::Both };
    for row in &r.rows {
        let keys = vec![row.symbol.as_str().into(), row.source.as_deref().into()];
        ranked_row(&mut t, keys, &row.counts.per_event, row.cumulative_percent.into(), show);
    }
    if with_source {
        line_rows(r, &mut t);
    }
    if r.rows_omitted > 0 {
        t.foot(format!("# {} more row(s) not shown (--limit)", r.rows_omitted));
    }
    t.write(out, form, style, r)
}

/// `--lines` text rows: one row per symbol (its lines summed, symbols in order of their
/// hottest line, as the report ranks rows), then its lines indented beneath it.
fn line_rows(r: &SymbolReport, t: &mut Table) {
    let mut order: Vec<&str> = Vec::new();
    let mut groups: std::collections::HashMap<&str, Vec<&SymbolRow>> =
        std::collections::HashMap::new();
    for row in &r.rows {
        let g = groups.entry(row.symbol.as_str()).or_default();
        if g.is_empty() {
            order.push(row.symbol.as_str());
        }
        g.push(row);
    }
    let mut cum = 0.0;
    for sym in order {
        let lines = &groups[sym];
        let mut sum: Vec<EventCount> = lines[0].counts.per_event.clone();
        for l in &lines[1..] {
            for (a, b) in sum.iter_mut().zip(&l.counts.per_event) {
                a.samples += b.samples;
                a.events += b.events;
                a.percent += b.percent;
            }
        }
        cum += sum.first().map_or(0.0, |c| c.percent);
        ranked_row(
            t,
            vec![sym.into(), Value::Empty.into()],
            &sum,
            cum.min(100.0).into(),
            Show::Text,
        );
        for l in lines {
            let text = format!("    {}", l.source.as_deref().unwrap_or("??:0"));
            ranked_row(
                t,
                vec![text.into(), Value::Empty.into()],
                &l.counts.per_event,
                Value::Empty,
                Show::Text,
            );
        }
    }
}

/// `dcpiprof --symbols` without `--image`: symbols of every image, ranked together.
pub fn write_global_symbols(
    out: &mut dyn Write,
    r: &super::global::GlobalReport,
    fmt: Format,
    style: Style,
) -> io::Result<()> {
    let form = form(fmt)?;
    let text = |s: &str| Column::new(s, Kind::Text);
    // The image column is text but not last: left-aligned to its widest cell.
    let keys = vec![text("image"), text("kind"), text("build_id"), text("symbol")];
    let mut t = ranked_table(&r.head.events, keys, &[0, 3]);
    t.head = header(&r.head.scope, &r.head.events, r.head.total_samples, style);
    t.head("# percent: of the machine's total (every image, [unknown] included)");
    for row in &r.rows {
        let keys = image_keys(&row.image, row.kind, &row.build_id, Some(&row.symbol));
        ranked_row(&mut t, keys, &row.counts.per_event, row.cumulative_percent.into(), Show::Both);
    }
    if r.head.rows_omitted > 0 {
        t.foot(format!("# {} more row(s) not shown (--limit)", r.head.rows_omitted));
    }
    t.write(out, form, style, r)
}

/// A text field made safe for a terminal: control, format and separator characters escaped
/// ([`dcpi_report::escape::terminal`]).
pub fn printable(s: &str) -> String {
    esc(s).into_owned()
}

/// Round to 4 decimals for JSON.
pub fn r4(x: f64) -> f64 {
    (x * 1e4).round() / 1e4
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scope of a report of the database `db`, no epoch or host named.
    fn db_scope() -> Scope {
        Scope { database: "db".into(), epochs: vec![], hosts: vec![], newest_data: 0, time: None }
    }
    use dcpi_report::report::{Counts, EventInfo, ImageInfo, SymbolRow};

    fn row(symbol: &str, line: &str, samples: u64) -> SymbolRow {
        let c = EventCount {
            event: "cpu-clock".into(),
            samples,
            events: samples * 1000,
            percent: samples as f64,
        };
        SymbolRow {
            symbol: symbol.into(),
            source: Some(line.into()),
            counts: Counts::new(vec![c], 0.0),
        }
    }

    #[test]
    fn a_time_weighted_event_shows_seconds_in_text_and_nanoseconds_in_csv() {
        let count = |ns: u64| EventCount {
            event: "off-cpu".into(),
            samples: ns,
            events: ns,
            percent: 100.0 * ns as f64 / 4_000_000_000.0,
        };
        let row = |symbol: &str, ns: u64, cum: f64| SymbolRow {
            symbol: symbol.into(),
            source: None,
            counts: Counts::new(vec![count(ns)], cum),
        };
        let r = SymbolReport {
            report: "symbols",
            scope: db_scope(),
            image: ImageInfo::new("/lib/libc.so.6".into(), "elf"),
            events: vec![EventInfo {
                name: "off-cpu".into(),
                samples: 4_000_000_000,
                events: 4_000_000_000,
                mean_period: 1.0,
                nominal_period: 1,
                multiplex_scale: 1.0,
            }],
            total_samples: 4_000_000_000,
            rows_omitted: 0,
            rows: vec![
                row("read", 2_500_000_000, 62.5),
                row("clock_nanosleep", 1_500_000_000, 100.0),
            ],
        };
        let render = |fmt: Format| {
            let mut out = Vec::new();
            write_symbols(&mut out, &r, fmt, Style::default()).expect("render");
            String::from_utf8(out).expect("utf8")
        };
        let text = render(Format::Table);
        // Seconds, never "samples": the header, the column title and every row.
        assert!(!text.contains("samples"), "{text}");
        assert!(text.contains("# total off-cpu: 4.000 s"), "{text}");
        assert!(text.contains("# event off-cpu: 4.000 s of time-weighted counts"), "{text}");
        let body: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(words(body[0]), ["time", "%", "cum%", "symbol"], "{text}");
        assert_eq!(words(body[1]), ["2.500", "s", "62.50", "62.50", "read"], "{text}");
        assert_eq!(words(body[2]), ["1.500", "s", "37.50", "100.00", "clock_nanosleep"], "{text}");
        // CSV keeps the nanoseconds, under a title that says so.
        let csv = render(Format::Csv);
        let head = csv.lines().find(|l| !l.starts_with('#')).expect("csv header");
        assert!(head.contains("off-cpu.ns") && !head.contains("samples"), "{csv}");
        assert!(csv.lines().any(|l| l.starts_with("read,") && l.contains(",2500000000,")), "{csv}");
    }

    #[test]
    fn a_wall_view_adds_on_cpu_samples_as_time_to_off_cpu_time_and_says_how() {
        let ev = |name: &str, samples: u64, events: u64| EventCount {
            event: name.into(),
            samples,
            events,
            percent: 50.0,
        };
        let info = |name: &str, samples: u64, events: u64, period: u64| EventInfo {
            name: name.into(),
            samples,
            events,
            mean_period: period as f64,
            nominal_period: period,
            multiplex_scale: 1.0,
        };
        // `spin` ran 1.5 s (1500 samples of 1 ms) and never waited; `wait` ran 10 ms and
        // waited 2.5 s.
        let row = |symbol: &str, on: u64, off: u64, cum: f64| SymbolRow {
            symbol: symbol.into(),
            source: None,
            counts: Counts::new(
                vec![ev("cpu-clock", on, on * 1_000_000), ev("off-cpu", off, off)],
                cum,
            ),
        };
        let r = SymbolReport {
            report: "symbols",
            scope: db_scope(),
            image: ImageInfo::new("/bin/app".into(), "elf"),
            events: vec![
                info("cpu-clock", 1510, 1_510_000_000, 1_000_000),
                info("off-cpu", 2_500_000_000, 2_500_000_000, 1),
            ],
            total_samples: 1510,
            rows_omitted: 0,
            rows: vec![row("spin", 1500, 0, 50.0), row("wait", 10, 2_500_000_000, 100.0)],
        };
        let render = |fmt: Format| {
            let mut out = Vec::new();
            write_symbols(&mut out, &r, fmt, Style::default()).expect("render");
            String::from_utf8(out).expect("utf8")
        };
        let text = render(Format::Table);
        assert!(text.contains("# wall = on-CPU time + off-CPU time: cpu-clock samples"), "{text}");
        assert!(text.contains("mean 1000000 ns"), "{text}");
        let body: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        let title = words(body[0]);
        assert_eq!(title[title.len() - 3..], ["wall", "cum%", "symbol"], "{text}");
        // spin: 1.5 s on CPU; wait: 0.01 s on CPU + 2.5 s off.
        let wall = |l: &str| words(l)[words(l).len() - 4..words(l).len() - 2].join(" ");
        assert_eq!(wall(body[1]), "1.500 s", "{text}");
        assert_eq!(wall(body[2]), "2.510 s", "{text}");
        let csv = render(Format::Csv);
        assert!(csv.contains("wall.ns"), "{csv}");
        assert!(csv.lines().any(|l| l.starts_with("wait,") && l.contains(",2510000000,")), "{csv}");
    }

    #[test]
    fn lines_are_listed_under_their_symbol() {
        let r = SymbolReport {
            report: "symbols",
            scope: db_scope(),
            image: ImageInfo::new("/bin/x".into(), "elf"),
            events: vec![EventInfo {
                name: "cpu-clock".into(),
                samples: 100,
                events: 100_000,
                mean_period: 1000.0,
                nominal_period: 1000,
                multiplex_scale: 1.0,
            }],
            total_samples: 100,
            rows_omitted: 0,
            rows: vec![
                row("hot", "x.c:10", 40),
                row("warm", "y.c:5", 30),
                row("hot", "x.c:12", 20),
                row("warm", "y.c:7", 10),
            ],
        };
        let mut out = Vec::new();
        write_symbols(&mut out, &r, Format::Table, Style::default()).expect("render");
        let text = String::from_utf8(out).expect("utf8");
        let body: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).skip(1).collect();
        let names: Vec<&str> = body.iter().map(|l| l.split("  ").last().unwrap_or("")).collect();
        assert_eq!(names, ["hot", "x.c:10", "x.c:12", "warm", "y.c:5", "y.c:7"], "{text}");
        // Lines are indented under the symbol and have no running total of their own.
        assert!(body[1].ends_with("     x.c:10") && body[1].matches('.').count() == 2, "{text}");
        // The symbol's row is the sum of its lines, with the running total.
        let words = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(words(body[0]), ["60", "60000", "60.00", "60.00", "hot"], "{text}");
        assert_eq!(words(body[3]), ["40", "40000", "40.00", "100.00", "warm"], "{text}");
    }
}
