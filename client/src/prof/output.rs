//! Rendering reports as a table, JSON or CSV.

use std::io::{self, Write};

use super::names::escape_controls as esc;
use super::report::{EventCount, EventInfo, IdleShare, ImageReport, Scope, SymbolReport};

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
        matches!(
            self,
            Format::Folded | Format::Pprof | Format::Svg | Format::Html | Format::Speedscope
        )
    }
}

pub(crate) fn not_a_report(fmt: Format) -> io::Error {
    io::Error::other(format!("{fmt:?} is an export format, not a report table"))
}

fn header(out: &mut dyn Write, scope: &Scope, events: &[EventInfo], total: u64) -> io::Result<()> {
    writeln!(out, "# database: {}", scope.database)?;
    let ep = match scope.epochs.as_slice() {
        [] => "none".to_owned(),
        [one] => one.clone(),
        [first, .., last] => format!("{first} .. {last} ({} epochs)", scope.epochs.len()),
    };
    writeln!(out, "# epochs: {ep}")?;
    writeln!(out, "# hosts: {}", scope.hosts.join(", "))?;
    for e in events {
        let mux = if e.multiplex_scale > 1.0 {
            format!(", scaled for multiplexing (up to x{:.2})", e.multiplex_scale)
        } else {
            String::new()
        };
        writeln!(
            out,
            "# event {}: {} samples, mean period {:.0} (nominal {}), ~{} events{mux}",
            esc(&e.name),
            e.samples,
            e.mean_period,
            e.nominal_period,
            e.events
        )?;
    }
    writeln!(out, "# total samples: {total}")
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

fn count_cells(counts: &[EventCount]) -> Vec<String> {
    counts
        .iter()
        .flat_map(|c| [c.samples.to_string(), c.events.to_string(), format!("{:.2}", c.percent)])
        .collect()
}

/// Right-aligned numeric columns, then a free-width text column (image or symbol).
fn table(out: &mut dyn Write, titles: Vec<String>, rows: Vec<Vec<String>>) -> io::Result<()> {
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
                // Escaped where made; the last line of defence (see csv_line).
                s.push_str(&esc(c));
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

fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

fn csv_line(out: &mut dyn Write, cells: &[String]) -> io::Result<()> {
    // Cells are escaped where they are made; this is the last line of defence for a field
    // that was not (a name from a hostile file must never reach a terminal raw).
    let v: Vec<String> = cells.iter().map(|c| csv_field(&esc(c))).collect();
    writeln!(out, "{}", v.join(","))
}

fn csv_count_titles(events: &[EventInfo]) -> Vec<String> {
    events
        .iter()
        .flat_map(|e| {
            let n = esc(&e.name);
            [format!("{n}.samples"), format!("{n}.events"), format!("{n}.percent")]
        })
        .collect()
}

fn csv_count_cells(counts: &[EventCount]) -> Vec<String> {
    counts
        .iter()
        .flat_map(|c| [c.samples.to_string(), c.events.to_string(), c.percent.to_string()])
        .collect()
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

pub fn write_images(out: &mut dyn Write, r: &ImageReport, fmt: Format) -> io::Result<()> {
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
            csv_line(out, &t)?;
            for row in &r.rows {
                let mut c = vec![
                    row.image.clone(),
                    row.kind.to_owned(),
                    row.build_id.clone().unwrap_or_default(),
                    row.image_id.clone().unwrap_or_default(),
                ];
                c.extend(csv_count_cells(&row.counts));
                c.push(row.cumulative_percent.to_string());
                csv_line(out, &c)?;
            }
            Ok(())
        }
        Format::Table => {
            header(out, &r.scope, &r.events, r.total_samples)?;
            idle_note(out, &r.idle)?;
            let mut t = count_titles(&r.events);
            t.push("cum%".into());
            t.push("image".into());
            let rows = r
                .rows
                .iter()
                .map(|row| {
                    let mut c = count_cells(&row.counts);
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

pub fn write_symbols(out: &mut dyn Write, r: &SymbolReport, fmt: Format) -> io::Result<()> {
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
            csv_line(out, &t)?;
            for row in &r.rows {
                let mut c = vec![row.symbol.clone(), row.source.clone().unwrap_or_default()];
                c.extend(csv_count_cells(&row.counts));
                c.push(row.cumulative_percent.to_string());
                csv_line(out, &c)?;
            }
            Ok(())
        }
        Format::Table => {
            header(out, &r.scope, &r.events, r.total_samples)?;
            let mut id = r.image.build_id.as_ref().map_or_else(
                || r.image.image_id.clone().map(|i| format!(" (id {i})")).unwrap_or_default(),
                |b| format!(" (build-id {b})"),
            );
            if let Some(b) = &r.image.binary {
                id.push_str(&format!("\n# symbols from: {b}"));
            }
            if let Some(d) = &r.image.debug_file {
                id.push_str(&format!("\n# debug info from: {d}"));
            }
            writeln!(out, "# image: {}{id}", r.image.path)?;
            let mut t = count_titles(&r.events);
            t.push("cum%".into());
            if with_source {
                t.push("source".into());
            }
            t.push("symbol".into());
            // The source column is text but not last: pad it on the left like the numbers.
            let rows = r
                .rows
                .iter()
                .map(|row| {
                    let mut c = count_cells(&row.counts);
                    c.push(format!("{:.2}", row.cumulative_percent));
                    if with_source {
                        c.push(row.source.clone().unwrap_or_default());
                    }
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

/// `dcpiprof --symbols` without `--image`: symbols of every image, ranked together.
pub fn write_global_symbols(
    out: &mut dyn Write,
    r: &super::global::GlobalReport,
    fmt: Format,
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
            csv_line(out, &t)?;
            for row in &r.rows {
                let mut c = vec![
                    row.image.clone(),
                    row.kind.to_owned(),
                    row.build_id.clone().unwrap_or_default(),
                    row.symbol.clone(),
                ];
                c.extend(csv_count_cells(&row.counts));
                c.push(row.cumulative_percent.to_string());
                csv_line(out, &c)?;
            }
            Ok(())
        }
        Format::Folded | Format::Pprof | Format::Svg | Format::Html | Format::Speedscope => {
            Err(not_a_report(fmt))
        }
        Format::Table => {
            header(out, &r.scope, &r.events, r.total_samples)?;
            writeln!(out, "# percent: of the machine's total (every image, [unknown] included)")?;
            let mut t = count_titles(&r.events);
            t.push("cum%".into());
            t.push("image".into());
            t.push("symbol".into());
            // The image column is text but not last: left-aligned to its widest cell.
            let w = r.rows.iter().map(|x| x.image.chars().count()).max().unwrap_or(0).max(5);
            let n = t.len();
            t[n - 2] = format!("{:<w$}", t[n - 2]);
            let rows = r
                .rows
                .iter()
                .map(|row| {
                    let mut c = count_cells(&row.counts);
                    c.push(format!("{:.2}", row.cumulative_percent));
                    c.push(format!("{:<w$}", row.image));
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
