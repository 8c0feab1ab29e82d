//! Listings and top-instruction reports as a table, JSON or CSV.

use std::io::{self, Write};

use super::listing::{AsmRow, GapRow, Listing, Row, SourceRow};
use super::top::TopReport;
use dcpi_report::render::{Cell, Column, CsvCell, Kind, Show, Style, Table, Value};

use crate::prof::output::TableFormat as Format;
use crate::prof::output::{count_cells, count_columns, scope_lines, CountTitles};
use dcpi_report::escape::terminal as esc;
use dcpi_report::report::EventCount;
use dcpi_report::report::{EventInfo, Scope};

fn header(scope: &Scope, events: &[EventInfo], what: &str) -> Vec<String> {
    scope_lines(scope, events, what, Style::default())
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

/// The listing's columns: CSV `type,offset,source,label,branch_target,instruction`, the
/// counts and `cpi`; the text table shows the counts, `cpi`, then per mode `line source`
/// or `offset [bytes] [line] instruction`.
struct ListingColumns {
    offset: usize,
    bytes: usize,
    line: usize,
    instruction: usize,
}

pub fn write_listing(out: &mut dyn Write, l: &Listing, fmt: Format, bytes: bool) -> io::Result<()> {
    let mut t = Table::new();
    let text = |s: &str| Column::new(s, Kind::Text);
    t.column(text("type"));
    let offset = t.column(Column::new("offset", Kind::Hex));
    let bytes_col = t.column(text("bytes").text_only());
    t.column(text("source"));
    let line = t.column(text("line").text_only());
    t.column(text("label"));
    t.column(Column::new("branch_target", Kind::Count));
    let source_mode = l.mode == "source";
    let instruction =
        t.column(text(if source_mode { "source" } else { "instruction" }).csv("instruction"));
    let mut shown = count_columns(&mut t, &l.events, CountTitles::List);
    let cpi = t.column(Column::new("cpi", Kind::Decimal(2)));
    if l.cpi {
        shown.push(cpi);
    }
    let cols = ListingColumns { offset, bytes: bytes_col, line, instruction };
    if source_mode {
        shown.extend([line, instruction]);
    } else {
        shown.push(offset);
        if bytes {
            shown.push(bytes_col);
        }
        if l.mode != "both" {
            shown.push(line);
        }
        shown.push(instruction);
    }
    t.text_columns(shown);
    for r in &l.rows {
        let (mut c, counts, cpi): (Vec<Cell>, _, _) = match r {
            Row::Asm(a) => (
                vec![
                    "asm".into(),
                    a.offset.into(),
                    Value::Empty.into(),
                    a.source.as_deref().into(),
                    Value::Empty.into(),
                    a.label.as_deref().into(),
                    a.branch_target.into(),
                    a.instruction.as_str().into(),
                ],
                &a.events,
                a.cpi,
            ),
            // CSV has no gap line: its rows are the ones shown.
            Row::Gap(_) => continue,
            Row::Source(s) => (
                vec![
                    "source".into(),
                    Value::Empty.into(),
                    Value::Empty.into(),
                    s.source.as_deref().into(),
                    Value::Empty.into(),
                    Value::Empty.into(),
                    Value::Empty.into(),
                    s.text.as_deref().into(),
                ],
                &s.events,
                s.cpi,
            ),
        };
        c.extend(count_cells(counts));
        c.push(cpi.into());
        t.push(c, Show::Csv);
    }
    if fmt == Format::Table {
        listing_text(&mut t, &cols, l, bytes);
    }
    t.write(out, fmt.into(), Style::default(), l)
}

/// The text table's head and rows: labels, blank lines between blocks, source lines.
fn listing_text(t: &mut Table, cols: &ListingColumns, l: &Listing, bytes: bool) {
    t.head = header(&l.scope, &l.events, "in the function");
    let id = l.build_id.as_ref().map(|b| format!(" (build-id {b})")).unwrap_or_default();
    t.head(format!("# image: {}{id}", esc(&l.image)));
    if let Some(b) = &l.binary {
        t.head(format!("# code from: {}", esc(b)));
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
    t.head(format!(
        "# function: {} at offset {:#x}, {} bytes{insns}; {} samples{share}",
        esc(&l.symbol),
        l.start_offset,
        l.size,
        l.total_samples
    ));
    if let Some(why) = &l.no_code_reason {
        t.head(format!("# no code: {}", esc(why)));
    }
    t.head(format!("# note: {}", l.skid_note));
    let ncount = t.columns.len() - 9;
    let lead = |t: &Table, counts: &[EventCount], cpi: Option<f64>| {
        let mut c = t.blank();
        for (i, x) in count_cells(counts).enumerate() {
            c[8 + i] = x;
        }
        c[8 + ncount] = cpi.into();
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
    let gap = |t: &mut Table, g: &GapRow| {
        let mut c = t.blank();
        c[cols.instruction] = format!("... {} rows below --min-percent", g.skipped).into();
        t.push(c, Show::Text);
    };
    if l.mode == "source" {
        for r in &l.rows {
            match r {
                Row::Source(s) => {
                    let mut c = lead(t, &s.events, s.cpi);
                    c[cols.line] = short_source(&s.source).into();
                    c[cols.instruction] = s.text.as_deref().unwrap_or_default().into();
                    t.push(c, Show::Text);
                }
                Row::Gap(g) => gap(t, g),
                Row::Asm(_) => {}
            }
        }
        return;
    }
    let both = l.mode == "both";
    let mut first = true;
    // In --both the blank line between blocks goes before the block's source line.
    let mut separated = false;
    for (i, r) in l.rows.iter().enumerate() {
        match r {
            Row::Asm(a) => {
                if a.block_start && !first && l.code && !separated {
                    t.push(t.blank(), Show::Text);
                }
                separated = false;
                first = false;
                if let Some(lab) = &a.label {
                    let mut c = t.blank();
                    c[cols.instruction] = format!("{lab}:").into();
                    t.push(c, Show::Text);
                }
                let mut c = lead(t, &a.events, a.cpi);
                c[cols.offset] = a.offset.into();
                if bytes {
                    c[cols.bytes] = a.bytes.as_deref().into();
                }
                if !both {
                    c[cols.line] = short_source(&a.source).into();
                }
                let indent = if both { "    " } else { "" };
                c[cols.instruction] = format!("{indent}{}", asm_text(a)).into();
                t.push(c, Show::Text);
            }
            Row::Source(s) => {
                let next_starts = matches!(
                    l.rows.get(i + 1),
                    Some(Row::Asm(a)) if a.block_start && l.code
                );
                if next_starts && !first {
                    t.push(t.blank(), Show::Text);
                    separated = true;
                }
                let mut c = lead(t, &s.events, s.cpi);
                c[cols.instruction] = source_line_text(s).into();
                t.push(c, Show::Text);
            }
            Row::Gap(g) => {
                gap(t, g);
                separated = true;
            }
        }
    }
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
    let mut t = Table::new();
    let text = |s: &str| Column::new(s, Kind::Text);
    let image = t.column(text("image"));
    let symbol = t.column(text("symbol"));
    let offset = t.column(Column::new("offset", Kind::Hex));
    let instruction = t.column(text("instruction"));
    t.column(text("source"));
    let line = t.column(text("line").text_only());
    let mut shown = count_columns(&mut t, &r.events, CountTitles::List);
    shown.extend([offset, image, symbol, line, instruction]);
    t.text_columns(shown);
    t.head = header(&r.scope, &r.events, "in total");
    t.head("# percent: of the machine's total (every image, [unknown] included)");
    // A missing name is `?` in the table, empty in CSV.
    let unknown = |s: &Option<String>| match s {
        Some(s) => Value::Text(s.clone()),
        None => Value::Both { text: "?".into(), csv: CsvCell::Text(String::new()) },
    };
    for row in &r.rows {
        let mut c: Vec<Cell> = vec![
            Value::image(row.image.as_str(), row.build_id.as_deref()).into(),
            unknown(&row.symbol).into(),
            row.offset.into(),
            unknown(&row.instruction).into(),
            row.source.as_deref().into(),
            short_source(&row.source).into(),
        ];
        // The top-level percent is of the machine, like the per-event ones.
        c.extend(count_cells(&row.events));
        t.row(c);
    }
    t.write(out, fmt.into(), Style::default(), r)
}
