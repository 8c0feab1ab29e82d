//! Rendering reports as a table, JSON or CSV.

use std::io::{self, Write};

use super::report::{EventCount, EventInfo, IdleShare, ImageReport, Scope, SymbolReport};
pub use crate::escape::csv_line;
use crate::escape::{csv_titles, num, terminal as esc, CsvCell};

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

/// How a table is drawn: `human` groups digits (`172,000`) for a person at a terminal; files
/// and pipes get the plain numbers, as JSON and CSV always do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Style {
    pub human: bool,
}

/// `n` with thousands separators when `style.human`.
pub fn number(n: u64, style: Style) -> String {
    let raw = n.to_string();
    if !style.human || raw.len() <= 3 {
        return raw;
    }
    let mut s = String::with_capacity(raw.len() + raw.len() / 3);
    for (i, c) in raw.chars().enumerate() {
        if i > 0 && (raw.len() - i).is_multiple_of(3) {
            s.push(',');
        }
        s.push(c);
    }
    s
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

fn header(
    out: &mut dyn Write,
    scope: &Scope,
    events: &[EventInfo],
    total: u64,
    style: Style,
) -> io::Result<()> {
    writeln!(out, "# database: {}", esc(&scope.database))?;
    writeln!(out, "# epochs: {}", super::report::epoch_range(&scope.epochs))?;
    writeln!(out, "# hosts: {}", scope.hosts.join(", "))?;
    for e in events {
        let mux = if e.multiplex_scale > 1.0 {
            format!(", scaled for multiplexing (up to x{:.2})", e.multiplex_scale)
        } else {
            String::new()
        };
        writeln!(
            out,
            "# event {}: {} samples, mean period {} (nominal {}), ~{} events{mux}",
            esc(&e.name),
            number(e.samples, style),
            if style.human {
                number(e.mean_period.round() as u64, style)
            } else {
                format!("{:.0}", e.mean_period)
            },
            number(e.nominal_period, style),
            number(e.events, style)
        )?;
    }
    if let Some(f) = freshness(scope.newest_data) {
        writeln!(out, "{f}")?;
    }
    writeln!(out, "# total samples: {}", number(total, style))
}

fn count_titles(events: &[EventInfo]) -> Vec<String> {
    if events.len() == 1 {
        return vec!["samples".into(), "events".into(), "%".into()];
    }
    events
        .iter()
        .flat_map(|e| {
            let n = esc(&e.name);
            [n.to_string(), format!("{n}:events"), format!("{n}:%")]
        })
        .collect()
}

fn count_cells(counts: &[EventCount], style: Style) -> Vec<String> {
    counts
        .iter()
        .flat_map(|c| {
            [number(c.samples, style), number(c.events, style), format!("{:.2}", c.percent)]
        })
        .collect()
}

/// Right-aligned numeric columns, then a free-width text column (image or symbol). Every cell
/// is escaped for the terminal first (names keep only their controls escaped until here), so
/// widths are those of what is printed.
fn table(out: &mut dyn Write, titles: Vec<String>, rows: Vec<Vec<String>>) -> io::Result<()> {
    let cells =
        |r: Vec<String>| -> Vec<String> { r.into_iter().map(|c| esc(&c).into_owned()).collect() };
    let titles = cells(titles);
    let rows: Vec<Vec<String>> = rows.into_iter().map(cells).collect();
    let ncol = titles.len();
    let mut width: Vec<usize> = titles.iter().map(String::len).collect();
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |out: &mut dyn Write, cells: &[String]| -> io::Result<()> {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == ncol {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:>w$}  ", w = width[i]));
            }
        }
        writeln!(out, "{}", s.trim_end())
    };
    line(out, &titles)?;
    for r in &rows {
        line(out, r)?;
    }
    Ok(())
}

pub(crate) fn csv_count_titles(events: &[EventInfo]) -> Vec<String> {
    events
        .iter()
        .flat_map(|e| {
            let n = &e.name;
            [format!("{n}.samples"), format!("{n}.events"), format!("{n}.percent")]
        })
        .collect()
}

pub(crate) fn csv_count_cells(counts: &[EventCount]) -> Vec<CsvCell> {
    counts.iter().flat_map(|c| [num(c.samples), num(c.events), num(c.percent)]).collect()
}

/// Whether the percentages include the idle task, and what that says about the machine.
fn idle_note(out: &mut dyn Write, idle: &IdleShare) -> io::Result<()> {
    if !idle.included {
        return writeln!(out, "# % of busy time: the idle task ([idle]) is left out (--no-idle)");
    }
    if idle.percent <= 0.0 {
        return Ok(());
    }
    if idle.mostly_idle() {
        writeln!(
            out,
            "# the machine was mostly idle: {:.1}% of the samples are the idle task ([idle]); \
             --no-idle shows the busy time alone",
            idle.percent
        )?;
    }
    writeln!(
        out,
        "# % include the idle task ([idle], {:.1}%); [kernel.kallsyms] is kernel work for \
         processes",
        idle.percent
    )
}

pub fn write_images(
    out: &mut dyn Write,
    r: &ImageReport,
    fmt: Format,
    style: Style,
) -> io::Result<()> {
    match fmt {
        Format::Folded | Format::Pprof | Format::Svg | Format::Html | Format::Speedscope => {
            Err(not_a_report(fmt))
        }
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, r)?;
            writeln!(out)
        }
        Format::Csv => {
            let mut t =
                vec!["image".to_owned(), "kind".into(), "build_id".into(), "image_id".into()];
            t.extend(csv_count_titles(&r.events));
            t.push("cumulative_percent".into());
            csv_titles(out, &t)?;
            for row in &r.rows {
                let mut c: Vec<CsvCell> = vec![
                    row.image.clone().into(),
                    row.kind.into(),
                    row.build_id.clone().unwrap_or_default().into(),
                    row.image_id.clone().unwrap_or_default().into(),
                ];
                c.extend(csv_count_cells(&row.counts));
                c.push(num(row.cumulative_percent));
                csv_line(out, &c)?;
            }
            Ok(())
        }
        Format::Table => {
            header(out, &r.scope, &r.events, r.total_samples, style)?;
            idle_note(out, &r.idle)?;
            let mut t = count_titles(&r.events);
            t.push("cum%".into());
            t.push("image".into());
            let rows = r
                .rows
                .iter()
                .map(|row| {
                    let mut c = count_cells(&row.counts, style);
                    c.push(format!("{:.2}", row.cumulative_percent));
                    c.push(row.image.clone());
                    c
                })
                .collect();
            table(out, t, rows)?;
            if r.rows_omitted > 0 {
                writeln!(out, "# {} more image(s) not shown (--limit)", r.rows_omitted)?;
            }
            Ok(())
        }
    }
}

pub fn write_symbols(
    out: &mut dyn Write,
    r: &SymbolReport,
    fmt: Format,
    style: Style,
) -> io::Result<()> {
    let with_source = r.rows.iter().any(|x| x.source.is_some());
    match fmt {
        Format::Folded | Format::Pprof | Format::Svg | Format::Html | Format::Speedscope => {
            Err(not_a_report(fmt))
        }
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, r)?;
            writeln!(out)
        }
        Format::Csv => {
            let mut t = vec!["symbol".to_owned(), "source".into()];
            t.extend(csv_count_titles(&r.events));
            t.push("cumulative_percent".into());
            csv_titles(out, &t)?;
            for row in &r.rows {
                let mut c: Vec<CsvCell> =
                    vec![row.symbol.clone().into(), row.source.clone().unwrap_or_default().into()];
                c.extend(csv_count_cells(&row.counts));
                c.push(num(row.cumulative_percent));
                csv_line(out, &c)?;
            }
            Ok(())
        }
        Format::Table => {
            header(out, &r.scope, &r.events, r.total_samples, style)?;
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
            writeln!(out, "# image: {}{id}", esc(&r.image.path))?;
            let mut t = count_titles(&r.events);
            t.push("cum%".into());
            let rows = if with_source {
                // Each source line under its symbol: the symbol's row carries the sum of its
                // lines (and the running total), its lines follow, indented, hottest first.
                t.push("symbol / source line".into());
                line_rows(r, style)
            } else {
                t.push("symbol".into());
                r.rows
                    .iter()
                    .map(|row| {
                        let mut c = count_cells(&row.counts, style);
                        c.push(format!("{:.2}", row.cumulative_percent));
                        c.push(row.symbol.clone());
                        c
                    })
                    .collect()
            };
            table(out, t, rows)?;
            if r.rows_omitted > 0 {
                writeln!(out, "# {} more row(s) not shown (--limit)", r.rows_omitted)?;
            }
            Ok(())
        }
    }
}

/// `--lines` table rows: one row per symbol (its lines summed, symbols in order of their
/// hottest line, as the report ranks rows), then its lines indented beneath it.
fn line_rows(r: &SymbolReport, style: Style) -> Vec<Vec<String>> {
    let mut order: Vec<&str> = Vec::new();
    let mut groups: std::collections::HashMap<&str, Vec<&super::report::SymbolRow>> =
        std::collections::HashMap::new();
    for row in &r.rows {
        let g = groups.entry(row.symbol.as_str()).or_default();
        if g.is_empty() {
            order.push(row.symbol.as_str());
        }
        g.push(row);
    }
    let mut out = Vec::new();
    let mut cum = 0.0;
    for sym in order {
        let lines = &groups[sym];
        let mut sum: Vec<EventCount> = lines[0].counts.clone();
        for l in &lines[1..] {
            for (a, b) in sum.iter_mut().zip(&l.counts) {
                a.samples += b.samples;
                a.events += b.events;
                a.percent += b.percent;
            }
        }
        cum += sum.first().map_or(0.0, |c| c.percent);
        let mut c = count_cells(&sum, style);
        c.push(format!("{:.2}", cum.min(100.0)));
        c.push(sym.to_owned());
        out.push(c);
        for l in lines {
            let mut c = count_cells(&l.counts, style);
            c.push(String::new());
            c.push(format!("    {}", l.source.as_deref().unwrap_or("??:0")));
            out.push(c);
        }
    }
    out
}

/// `dcpiprof --symbols` without `--image`: symbols of every image, ranked together.
pub fn write_global_symbols(
    out: &mut dyn Write,
    r: &super::global::GlobalReport,
    fmt: Format,
    style: Style,
) -> io::Result<()> {
    match fmt {
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, r)?;
            writeln!(out)
        }
        Format::Csv => {
            let mut t = vec!["image".to_owned(), "kind".into(), "build_id".into(), "symbol".into()];
            t.extend(csv_count_titles(&r.events));
            t.push("cumulative_percent".into());
            csv_titles(out, &t)?;
            for row in &r.rows {
                let mut c: Vec<CsvCell> = vec![
                    row.image.clone().into(),
                    row.kind.into(),
                    row.build_id.clone().unwrap_or_default().into(),
                    row.symbol.clone().into(),
                ];
                c.extend(csv_count_cells(&row.counts));
                c.push(num(row.cumulative_percent));
                csv_line(out, &c)?;
            }
            Ok(())
        }
        Format::Folded | Format::Pprof | Format::Svg | Format::Html | Format::Speedscope => {
            Err(not_a_report(fmt))
        }
        Format::Table => {
            header(out, &r.scope, &r.events, r.total_samples, style)?;
            writeln!(out, "# percent: of the machine's total (every image, [unknown] included)")?;
            let mut t = count_titles(&r.events);
            t.push("cum%".into());
            t.push("image".into());
            t.push("symbol".into());
            // The image column is text but not last: left-aligned to its widest cell.
            let w = r.rows.iter().map(|x| esc(&x.image).chars().count()).max().unwrap_or(0).max(5);
            let n = t.len();
            t[n - 2] = format!("{:<w$}", t[n - 2]);
            let rows = r
                .rows
                .iter()
                .map(|row| {
                    let mut c = count_cells(&row.counts, style);
                    c.push(format!("{:.2}", row.cumulative_percent));
                    c.push(format!("{:<w$}", esc(&row.image)));
                    c.push(row.symbol.clone());
                    c
                })
                .collect();
            table(out, t, rows)?;
            if r.rows_omitted > 0 {
                writeln!(out, "# {} more row(s) not shown (--limit)", r.rows_omitted)?;
            }
            Ok(())
        }
    }
}

/// A text field made safe for a terminal: control, format and separator characters escaped
/// ([`crate::escape::terminal`]).
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
    use crate::prof::report::{EventInfo, ImageInfo, SymbolRow};

    #[test]
    fn digits_are_grouped_only_for_people() {
        let human = Style { human: true };
        assert_eq!(number(0, human), "0");
        assert_eq!(number(999, human), "999");
        assert_eq!(number(1000, human), "1,000");
        assert_eq!(number(1_234_567, human), "1,234,567");
        assert_eq!(number(1_234_567, Style::default()), "1234567");
    }

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
            samples,
            events: c.events,
            percent: c.percent,
            cumulative_percent: 0.0,
            counts: vec![c],
        }
    }

    #[test]
    fn lines_are_listed_under_their_symbol() {
        let r = SymbolReport {
            report: "symbols",
            scope: Scope { database: "db".into(), epochs: vec![], hosts: vec![], newest_data: 0 },
            image: ImageInfo {
                path: "/bin/x".into(),
                kind: "elf",
                image_id: None,
                build_id: None,
                binary: None,
                debug_file: None,
                symbols_note: None,
            },
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
