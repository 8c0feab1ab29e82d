//! Listings and top-instruction reports as a table, JSON or CSV.

use std::io::{self, Write};

use super::listing::{AsmRow, Listing, Row, SourceRow};
use super::top::TopReport;
use crate::escape::{csv_line, csv_titles, num, terminal as esc, CsvCell};
use crate::prof::output::TableFormat as Format;
use crate::prof::output::{csv_count_cells, csv_count_titles};
use crate::prof::report::{EventCount, EventInfo, Scope};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Align {
    Left,
    Right,
}

/// Columns padded to their widest cell; the last one is free width. Every cell is escaped for
/// the terminal first, so widths are those of what is printed.
fn table(
    out: &mut dyn Write,
    titles: &[String],
    align: &[Align],
    rows: &[Vec<String>],
) -> io::Result<()> {
    let cells = |r: &[String]| -> Vec<String> { r.iter().map(|c| esc(c).into_owned()).collect() };
    let titles = &cells(titles)[..];
    let rows: Vec<Vec<String>> = rows.iter().map(|r| cells(r)).collect();
    let mut width: Vec<usize> = titles.iter().map(|t| t.chars().count()).collect();
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |out: &mut dyn Write, cells: &[String]| -> io::Result<()> {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else if align[i] == Align::Right {
                s.push_str(&format!("{c:>w$}  ", w = width[i]));
            } else {
                s.push_str(&format!("{c:<w$}  ", w = width[i]));
            }
        }
        writeln!(out, "{}", s.trim_end())
    };
    line(out, titles)?;
    for r in &rows {
        line(out, r)?;
    }
    Ok(())
}

fn header(out: &mut dyn Write, scope: &Scope, events: &[EventInfo], what: &str) -> io::Result<()> {
    writeln!(out, "# database: {}", esc(&scope.database))?;
    writeln!(out, "# epochs: {}", crate::prof::report::epoch_range(&scope.epochs))?;
    writeln!(out, "# hosts: {}", scope.hosts.join(", "))?;
    for e in events {
        let mux = if e.multiplex_scale > 1.0 {
            format!(", scaled for multiplexing (up to x{:.2})", e.multiplex_scale)
        } else {
            String::new()
        };
        writeln!(
            out,
            "# event {}: {} samples {what}, mean period {:.0} (nominal {}), ~{} events{mux}",
            esc(&e.name),
            e.samples,
            e.mean_period,
            e.nominal_period,
            e.events
        )?;
    }
    Ok(())
}

/// Titles of the count columns: samples and percent per event.
fn count_titles(events: &[EventInfo]) -> Vec<String> {
    if events.len() == 1 {
        return vec!["samples".into(), "%".into()];
    }
    events
        .iter()
        .flat_map(|e| {
            let n = esc(&e.name);
            [n.to_string(), format!("{n}%")]
        })
        .collect()
}

fn count_cells(c: &[EventCount]) -> Vec<String> {
    c.iter().flat_map(|c| [c.samples.to_string(), format!("{:.2}", c.percent)]).collect()
}

fn cpi_cell(c: Option<f64>) -> String {
    c.map(|x| format!("{x:.2}")).unwrap_or_default()
}

/// `file:line` shortened to the file's basename for the table (JSON/CSV keep the path).
fn short_source(s: &Option<String>) -> String {
    match s {
        Some(s) => {
            let (file, line) = s.rsplit_once(':').unwrap_or((s, ""));
            let base = file.rsplit('/').next().unwrap_or(file);
            format!("{base}:{line}")
        }
        None => String::new(),
    }
}

pub fn write_listing(out: &mut dyn Write, l: &Listing, fmt: Format, bytes: bool) -> io::Result<()> {
    match fmt {
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, l)?;
            writeln!(out)
        }
        Format::Csv => listing_csv(out, l),
        Format::Table => listing_table(out, l, bytes),
    }
}

fn listing_csv(out: &mut dyn Write, l: &Listing) -> io::Result<()> {
    let mut t: Vec<String> = ["type", "offset", "source", "label", "branch_target", "instruction"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    t.extend(csv_count_titles(&l.events));
    t.push("cpi".into());
    csv_titles(out, &t)?;
    for r in &l.rows {
        let (mut c, counts, cpi): (Vec<CsvCell>, _, _) = match r {
            Row::Asm(a) => (
                vec![
                    "asm".into(),
                    num(a.offset),
                    a.source.clone().unwrap_or_default().into(),
                    a.label.clone().unwrap_or_default().into(),
                    CsvCell::Number(a.branch_target.map(|t| t.to_string()).unwrap_or_default()),
                    a.instruction.clone().into(),
                ],
                &a.events,
                a.cpi,
            ),
            Row::Source(s) => (
                vec![
                    "source".into(),
                    CsvCell::Number(String::new()),
                    s.source.clone().unwrap_or_default().into(),
                    "".into(),
                    CsvCell::Number(String::new()),
                    s.text.clone().unwrap_or_default().into(),
                ],
                &s.events,
                s.cpi,
            ),
        };
        c.extend(csv_count_cells(counts));
        c.push(CsvCell::Number(cpi.map(|x| x.to_string()).unwrap_or_default()));
        csv_line(out, &c)?;
    }
    Ok(())
}

fn listing_table(out: &mut dyn Write, l: &Listing, bytes: bool) -> io::Result<()> {
    header(out, &l.scope, &l.events, "in the function")?;
    let id = l.build_id.as_ref().map(|b| format!(" (build-id {b})")).unwrap_or_default();
    writeln!(out, "# image: {}{id}", esc(&l.image))?;
    if let Some(b) = &l.binary {
        writeln!(out, "# code from: {}", esc(b))?;
    }
    let share = if l.image_samples > 0 {
        format!(
            " ({:.2}% of the image's {})",
            l.total_samples as f64 * 100.0 / l.image_samples as f64,
            l.image_samples
        )
    } else {
        String::new()
    };
    let insns = if l.code { format!(", {} instructions", l.instructions) } else { String::new() };
    writeln!(
        out,
        "# function: {} at offset {:#x}, {} bytes{insns}; {} samples{share}",
        esc(&l.symbol),
        l.start_offset,
        l.size,
        l.total_samples
    )?;
    if let Some(why) = &l.no_code_reason {
        writeln!(out, "# no code: {}", esc(why))?;
    }
    writeln!(out, "# note: {}", l.skid_note)?;
    let mut titles = count_titles(&l.events);
    let ncount = titles.len();
    if l.cpi {
        titles.push("cpi".into());
    }
    let mut align = vec![Align::Right; titles.len()];
    let mut rows: Vec<Vec<String>> = Vec::with_capacity(l.rows.len() * 2);
    let lead = |counts: &[EventCount], cpi: Option<f64>| {
        let mut c = count_cells(counts);
        if l.cpi {
            c.push(cpi_cell(cpi));
        }
        c
    };
    let asm_text = |a: &AsmRow| {
        let mut t = a.instruction.clone();
        if let Some(lab) = &a.target_label {
            t.push_str(&format!("  -> {lab}"));
        } else if let Some(c) = &a.call_target {
            t.push_str(&format!("  <{c}>"));
        }
        t
    };
    let blank = |n: usize| vec![String::new(); n];
    match l.mode {
        "source" => {
            titles.extend(["line".to_owned(), "source".to_owned()]);
            align.extend([Align::Left, Align::Left]);
            for r in &l.rows {
                if let Row::Source(s) = r {
                    let mut c = lead(&s.events, s.cpi);
                    c.push(short_source(&s.source));
                    c.push(s.text.clone().unwrap_or_default());
                    rows.push(c);
                }
            }
        }
        mode => {
            let both = mode == "both";
            titles.push("offset".into());
            align.push(Align::Right);
            if bytes {
                titles.push("bytes".into());
                align.push(Align::Left);
            }
            if !both {
                titles.push("line".into());
                align.push(Align::Left);
            }
            titles.push("instruction".into());
            align.push(Align::Left);
            let extra = titles.len() - ncount - usize::from(l.cpi) - 1;
            let mut first = true;
            // In --both the blank line between blocks goes before the block's source line.
            let mut separated = false;
            for (i, r) in l.rows.iter().enumerate() {
                match r {
                    Row::Asm(a) => {
                        if a.block_start && !first && l.code && !separated {
                            rows.push(blank(titles.len()));
                        }
                        separated = false;
                        first = false;
                        if let Some(lab) = &a.label {
                            let mut c = blank(titles.len() - 1);
                            c.push(format!("{lab}:"));
                            rows.push(c);
                        }
                        let mut c = lead(&a.events, a.cpi);
                        c.push(format!("{:#x}", a.offset));
                        if bytes {
                            c.push(a.bytes.clone().unwrap_or_default());
                        }
                        if !both {
                            c.push(short_source(&a.source));
                        }
                        let indent = if both { "    " } else { "" };
                        c.push(format!("{indent}{}", asm_text(a)));
                        rows.push(c);
                    }
                    Row::Source(s) => {
                        let next_starts = matches!(
                            l.rows.get(i + 1),
                            Some(Row::Asm(a)) if a.block_start && l.code
                        );
                        if next_starts && !first {
                            rows.push(blank(titles.len()));
                            separated = true;
                        }
                        let mut c = lead(&s.events, s.cpi);
                        c.extend(blank(extra));
                        c.push(source_line_text(s));
                        rows.push(c);
                    }
                }
            }
        }
    }
    table(out, &titles, &align, &rows)
}

fn source_line_text(s: &SourceRow) -> String {
    let loc = short_source(&s.source);
    let loc = if loc.is_empty() { "??".to_owned() } else { loc };
    match &s.text {
        Some(t) => format!("{loc}: {}", t.trim()),
        None => loc,
    }
}

pub fn write_top(out: &mut dyn Write, r: &TopReport, fmt: Format) -> io::Result<()> {
    match fmt {
        Format::Json => {
            serde_json::to_writer_pretty(&mut *out, r)?;
            writeln!(out)
        }
        Format::Csv => {
            let mut t: Vec<String> = ["image", "symbol", "offset", "instruction", "source"]
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
            t.extend(csv_count_titles(&r.events));
            csv_titles(out, &t)?;
            for row in &r.rows {
                let mut c: Vec<CsvCell> = vec![
                    row.image.clone().into(),
                    row.symbol.clone().unwrap_or_default().into(),
                    num(row.offset),
                    row.instruction.clone().unwrap_or_default().into(),
                    row.source.clone().unwrap_or_default().into(),
                ];
                c.extend(csv_count_cells(&row.events));
                csv_line(out, &c)?;
            }
            Ok(())
        }
        Format::Table => {
            header(out, &r.scope, &r.events, "in total")?;
            writeln!(out, "# percent: of the machine's total (every image, [unknown] included)")?;
            let mut titles = count_titles(&r.events);
            let mut align = vec![Align::Right; titles.len()];
            for (t, a) in [
                ("offset", Align::Right),
                ("image", Align::Left),
                ("symbol", Align::Left),
                ("line", Align::Left),
                ("instruction", Align::Left),
            ] {
                titles.push(t.into());
                align.push(a);
            }
            let rows: Vec<Vec<String>> = r
                .rows
                .iter()
                .map(|row| {
                    let mut c = count_cells(&row.events);
                    // The top-level percent is of the machine, like the per-event ones.
                    c.push(format!("{:#x}", row.offset));
                    c.push(row.image.clone());
                    c.push(row.symbol.clone().unwrap_or_else(|| "?".into()));
                    c.push(short_source(&row.source));
                    c.push(row.instruction.clone().unwrap_or_else(|| "?".into()));
                    c
                })
                .collect();
            table(out, &titles, &align, &rows)
        }
    }
}
