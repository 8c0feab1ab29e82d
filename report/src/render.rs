//! The one renderer of report tables: a [`Table`] describes the columns (title, alignment,
//! kind of value) and holds the rows; the same description is written as an aligned text
//! table, as CSV (through the one CSV quoter, [`crate::escape::csv_line`]) or as JSON (the
//! report's own document, whose schema each tool documents).
//!
//! * Text: every cell and title is escaped for the terminal ([`crate::escape::terminal`])
//!   first, so widths are those of what is printed, measured in terminal columns (a CJK
//!   character takes two, a combining mark none): a name with multibyte or escaped characters
//!   keeps the columns after it aligned. Columns are separated by two spaces; the last one is
//!   free width; trailing blanks are trimmed. A cell may carry an ANSI colour, which does not
//!   count toward its width.
//! * CSV: the columns with a CSV title, in the order of the description; count and decimal
//!   cells are number cells (written as Rust prints them), text cells are quoted and
//!   neutralised.
//! * The text table may show fewer columns, or the same ones in another order
//!   ([`Table::text_columns`]): tables put names last (free width), CSV puts them first.
//!
//! Rows may be shown in one form only ([`Show`]): a text table's blank separators, labels and
//! per-symbol subtotals have no CSV line.

use std::io::{self, Write};

use unicode_width::UnicodeWidthStr;

pub use crate::escape::CsvCell;
use crate::escape::{csv_line, csv_titles, num, terminal};
use crate::image::short_labels;

/// The output forms of a report table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// Aligned text with a header line (and the table's comment lines).
    Text,
    /// CSV with a header line.
    Csv,
    /// The report's JSON document, pretty-printed.
    Json,
}

/// How a text table is drawn: `human` groups digits (`172,000`) for a person at a terminal;
/// files and pipes get the plain numbers, as JSON and CSV always do. `width`: the table's
/// width limit in terminal columns (`None`: [`DEFAULT_WIDTH`]; `Some(0)`: no limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Style {
    pub human: bool,
    pub width: Option<usize>,
}

/// Text tables fit this many terminal columns unless told otherwise: text cells too long for
/// it (paths, C++ names) are cut in the middle with `…`; CSV and JSON keep them whole.
pub const DEFAULT_WIDTH: usize = 100;

/// A text column is never narrowed below this many terminal columns to fit the width: a
/// library's path or a function's name stays recognisable (`/usr/lib/x86_64-l…libc.so.6`);
/// a table of many number columns may then stay wider than the limit.
const MIN_FIT: usize = 24;

/// `s` cut to at most `w` terminal columns by dropping its middle for `…` (start and end are
/// where names differ: a path's directory and file name, a function's namespace and name).
pub fn cut_middle(s: &str, w: usize) -> String {
    if display_width(s) <= w {
        return s.to_owned();
    }
    if w == 0 {
        return String::new();
    }
    let budget = w - 1;
    let tail_budget = budget / 2;
    let head_budget = budget - tail_budget;
    let cw = |c: char| unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
    let mut head = String::new();
    let mut used = 0;
    for c in s.chars() {
        if used + cw(c) > head_budget {
            break;
        }
        used += cw(c);
        head.push(c);
    }
    let mut tail: Vec<char> = Vec::new();
    let mut used = 0;
    for c in s.chars().rev() {
        if used + cw(c) > tail_budget {
            break;
        }
        used += cw(c);
        tail.push(c);
    }
    tail.reverse();
    format!("{head}…{}", tail.into_iter().collect::<String>())
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

/// `x` with `decimals` places and its sign always shown; a value that rounds to zero is `+0.00`.
pub fn signed(x: f64, decimals: usize) -> String {
    let x = if x.abs() < 0.5 * 10f64.powi(-i32::try_from(decimals).unwrap_or(i32::MAX)) {
        0.0
    } else {
        x
    };
    format!("{x:+.decimals$}")
}

/// ANSI colours of text table cells ([`Cell::colored`]) and head lines.
pub const RED: &str = "\x1b[31m";
pub const GREEN: &str = "\x1b[32m";
pub const BOLD: &str = "\x1b[1m";

/// Width of `s` on a terminal, in columns.
pub fn display_width(s: &str) -> usize {
    UnicodeWidthStr::width(s)
}

/// Where a column's cells sit in their width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// What a column holds, which decides how a [`Value`] is written in each form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A count: digits grouped in a human text table; a number in CSV.
    Count,
    /// A real number with this many decimals in text (`12.50`), as Rust prints it in CSV.
    Decimal(usize),
    /// A change: sign always shown, this many decimals, in text (`+1.25`); a number in CSV.
    Signed(usize),
    /// An address or offset: `0x1f` in text, decimal in CSV.
    Hex,
    /// A probability: scientific notation (`1.5e-7`) in both.
    Scientific,
    /// Text from anywhere: escaped for a terminal; quoted and neutralised in CSV.
    Text,
}

/// One column of a [`Table`].
#[derive(Clone, Debug)]
pub struct Column {
    /// Title in the text table.
    pub title: String,
    /// Title in CSV; `None`: a column of the text table only.
    pub csv: Option<String>,
    pub kind: Kind,
    pub align: Align,
    /// Narrowest width in the text table (a fixed-width number column).
    pub min_width: usize,
}

impl Column {
    /// A column titled `title` in both forms, right-aligned unless it holds text.
    pub fn new(title: impl Into<String>, kind: Kind) -> Self {
        let title = title.into();
        let align = if kind == Kind::Text { Align::Left } else { Align::Right };
        Self { csv: Some(title.clone()), title, kind, align, min_width: 0 }
    }

    /// Another title in CSV.
    pub fn csv(mut self, title: impl Into<String>) -> Self {
        self.csv = Some(title.into());
        self
    }

    /// Not in CSV.
    pub fn text_only(mut self) -> Self {
        self.csv = None;
        self
    }

    pub fn align(mut self, a: Align) -> Self {
        self.align = a;
        self
    }

    pub fn right(self) -> Self {
        self.align(Align::Right)
    }

    pub fn min_width(mut self, w: usize) -> Self {
        self.min_width = w;
        self
    }
}

/// One cell's value; its column's [`Kind`] says how it is written.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// Nothing: empty in both forms.
    Empty,
    Count(u64),
    Real(f64),
    Text(String),
    /// Different words in each form (e.g. `new` in the table, an empty number in CSV).
    Both {
        text: String,
        csv: CsvCell,
    },
    /// An image (printable path, build-id hex): the text table names it by the short label
    /// [`crate::image::short_labels`] gives it among the column's images (basename, more of
    /// the path or a short build-id where needed to tell images apart); CSV has the whole path.
    Image {
        path: String,
        build_id: Option<String>,
    },
}

impl Value {
    /// An image cell ([`Value::Image`]).
    pub fn image(path: impl Into<String>, build_id: Option<&str>) -> Self {
        Self::Image { path: path.into(), build_id: build_id.map(str::to_owned) }
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Self {
        Self::Count(n)
    }
}

impl From<f64> for Value {
    fn from(x: f64) -> Self {
        Self::Real(x)
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Self::Text(s)
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Self::Text(s.to_owned())
    }
}

impl<T> From<Option<T>> for Value
where
    T: Into<Self>,
{
    fn from(v: Option<T>) -> Self {
        v.map_or(Self::Empty, Into::into)
    }
}

impl Value {
    fn text(&self, kind: Kind, style: Style) -> String {
        match (self, kind) {
            (Self::Empty, _) => String::new(),
            (Self::Both { text, .. }, _) => text.clone(),
            (Self::Text(s), _) | (Self::Image { path: s, .. }, _) => s.clone(),
            (Self::Count(n), Kind::Count | Kind::Text) => number(*n, style),
            (Self::Count(n), Kind::Hex) => format!("{n:#x}"),
            (Self::Count(n), Kind::Decimal(_) | Kind::Signed(_) | Kind::Scientific) => {
                Self::Real(*n as f64).text(kind, style)
            }
            (Self::Real(x), Kind::Decimal(d)) => format!("{x:.d$}"),
            (Self::Real(x), Kind::Signed(d)) => signed(*x, d),
            (Self::Real(x), Kind::Scientific) => format!("{x:e}"),
            (Self::Real(x), Kind::Count | Kind::Hex | Kind::Text) => x.to_string(),
        }
    }

    fn csv(&self, kind: Kind) -> CsvCell {
        match (self, kind) {
            (Self::Empty, Kind::Text) => CsvCell::Text(String::new()),
            (Self::Empty, _) => CsvCell::Number(String::new()),
            (Self::Both { csv, .. }, _) => csv.clone(),
            (Self::Text(s), _) | (Self::Image { path: s, .. }, _) => CsvCell::Text(s.clone()),
            (Self::Count(n), _) => num(n),
            (Self::Real(x), Kind::Scientific) => num(format!("{x:e}")),
            (Self::Real(x), _) => num(x),
        }
    }
}

/// A cell: a value, and in a text table an optional ANSI colour (e.g. `"\x1b[31m"`).
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    pub value: Value,
    pub color: Option<&'static str>,
}

impl<T: Into<Value>> From<T> for Cell {
    fn from(v: T) -> Self {
        Self { value: v.into(), color: None }
    }
}

impl Cell {
    /// `v` drawn in colour `color` (when `Some`) in a text table.
    pub fn colored(v: impl Into<Value>, color: Option<&'static str>) -> Self {
        Self { value: v.into(), color }
    }
}

/// In which forms a row appears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Show {
    Both,
    /// Only in the text table (separators, labels, subtotals).
    Text,
    /// Only in CSV.
    Csv,
}

/// One row: a cell per column of the description.
#[derive(Clone, Debug)]
pub struct Row {
    pub cells: Vec<Cell>,
    pub show: Show,
}

/// A report table: its columns, rows, and the comment lines a text table has around it.
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub columns: Vec<Column>,
    pub rows: Vec<Row>,
    /// Columns of the text table, in order; `None`: every column, in order.
    text: Option<Vec<usize>>,
    /// Lines before the text table (already escaped: `# database: ...`).
    pub head: Vec<String>,
    /// Lines after the text table.
    pub foot: Vec<String>,
}

impl Table {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add a column; its index.
    pub fn column(&mut self, c: Column) -> usize {
        self.columns.push(c);
        self.columns.len() - 1
    }

    /// Add columns.
    pub fn columns(&mut self, cs: impl IntoIterator<Item = Column>) {
        self.columns.extend(cs);
    }

    /// The text table shows these columns in this order (the others are CSV only).
    pub fn text_columns(&mut self, idx: Vec<usize>) {
        self.text = Some(idx);
    }

    /// Add a row shown in both forms.
    pub fn row(&mut self, cells: Vec<Cell>) {
        self.push(cells, Show::Both);
    }

    /// Add a row shown in `show`'s forms.
    pub fn push(&mut self, cells: Vec<Cell>, show: Show) {
        debug_assert_eq!(cells.len(), self.columns.len(), "one cell per column");
        self.rows.push(Row { cells, show });
    }

    /// A row of empty cells (a blank line in the text table).
    pub fn blank(&self) -> Vec<Cell> {
        vec![Cell::from(Value::Empty); self.columns.len()]
    }

    /// A comment line before the text table.
    pub fn head(&mut self, line: impl Into<String>) {
        self.head.push(line.into());
    }

    /// A comment line after the text table.
    pub fn foot(&mut self, line: impl Into<String>) {
        self.foot.push(line.into());
    }

    /// Write the table in `form`; JSON is `doc`, the report's own document.
    pub fn write<D: serde::Serialize + ?Sized>(
        &self,
        out: &mut dyn Write,
        form: Output,
        style: Style,
        doc: &D,
    ) -> io::Result<()> {
        match form {
            Output::Text => self.write_text(out, style),
            Output::Csv => self.write_csv(out),
            Output::Json => {
                serde_json::to_writer_pretty(&mut *out, doc)?;
                writeln!(out)
            }
        }
    }

    /// The CSV form: a header of the CSV titles, then the rows shown in CSV.
    pub fn write_csv(&self, out: &mut dyn Write) -> io::Result<()> {
        let cols: Vec<usize> =
            (0..self.columns.len()).filter(|&i| self.columns[i].csv.is_some()).collect();
        let titles: Vec<&str> =
            cols.iter().filter_map(|&i| self.columns[i].csv.as_deref()).collect();
        csv_titles(out, &titles)?;
        for r in self.rows.iter().filter(|r| r.show != Show::Text) {
            let cells: Vec<CsvCell> =
                cols.iter().map(|&i| r.cells[i].value.csv(self.columns[i].kind)).collect();
            csv_line(out, &cells)?;
        }
        Ok(())
    }

    /// The text form: head lines, the aligned table, foot lines.
    pub fn write_text(&self, out: &mut dyn Write, style: Style) -> io::Result<()> {
        for l in &self.head {
            writeln!(out, "{l}")?;
        }
        let cols: Vec<usize> =
            self.text.clone().unwrap_or_else(|| (0..self.columns.len()).collect());
        let esc = |s: String| terminal(&s).into_owned();
        let titles: Vec<(String, Option<&'static str>)> =
            cols.iter().map(|&i| (esc(self.columns[i].title.clone()), None)).collect();
        let shown: Vec<&Row> = self.rows.iter().filter(|r| r.show != Show::Csv).collect();
        // Image cells are named by their labels among the column's images.
        let labels: Vec<Vec<Option<String>>> = cols
            .iter()
            .map(|&i| {
                let images: Vec<(&str, Option<&str>)> = shown
                    .iter()
                    .filter_map(|r| match &r.cells[i].value {
                        Value::Image { path, build_id } => {
                            Some((path.as_str(), build_id.as_deref()))
                        }
                        _ => None,
                    })
                    .collect();
                let mut it = short_labels(&images).into_iter();
                shown
                    .iter()
                    .map(|r| match r.cells[i].value {
                        Value::Image { .. } => it.next(),
                        _ => None,
                    })
                    .collect()
            })
            .collect();
        let rows: Vec<Vec<(String, Option<&'static str>)>> = shown
            .iter()
            .enumerate()
            .map(|(row, r)| {
                cols.iter()
                    .enumerate()
                    .map(|(k, &i)| {
                        let c = &r.cells[i];
                        let text = labels[k][row]
                            .clone()
                            .unwrap_or_else(|| c.value.text(self.columns[i].kind, style));
                        (esc(text), c.color)
                    })
                    .collect()
            })
            .collect();
        let mut width: Vec<usize> = cols.iter().map(|&i| self.columns[i].min_width).collect();
        for r in std::iter::once(&titles).chain(&rows) {
            for (w, (c, _)) in width.iter_mut().zip(r) {
                *w = (*w).max(display_width(c));
            }
        }
        let n = cols.len();
        // Fit the width: narrow the widest text columns (never below MIN_FIT) and cut their
        // long cells in the middle. Numbers are never cut.
        let limit = style.width.unwrap_or(DEFAULT_WIDTH);
        let total = |w: &[usize]| w.iter().sum::<usize>() + 2 * w.len().saturating_sub(1);
        let mut rows = rows;
        if limit > 0 && total(&width) > limit {
            let text: Vec<usize> =
                (0..n).filter(|&k| self.columns[cols[k]].kind == Kind::Text).collect();
            let mut fit = width.clone();
            while total(&fit) > limit {
                let Some(&k) =
                    text.iter().filter(|&&k| fit[k] > MIN_FIT).max_by_key(|&&k| (fit[k], k))
                else {
                    break;
                };
                let over = total(&fit) - limit;
                let second = text.iter().filter(|&&j| j != k).map(|&j| fit[j]).max().unwrap_or(0);
                // Down to the next widest text column at most per step, so wide columns
                // share the cut.
                let step = over.min(fit[k] - MIN_FIT).min((fit[k] - second).max(1));
                fit[k] -= step;
            }
            for r in &mut rows {
                for &k in &text {
                    if display_width(&r[k].0) > fit[k] {
                        r[k].0 = cut_middle(&r[k].0, fit[k]);
                    }
                }
            }
            width = fit;
        }
        let line = |out: &mut dyn Write, cells: &[(String, Option<&'static str>)]| {
            let mut s = String::new();
            for (k, (text, color)) in cells.iter().enumerate() {
                let pad = width[k].saturating_sub(display_width(text));
                let (lead, trail) = match self.columns[cols[k]].align {
                    _ if k + 1 == n => (0, 0),
                    Align::Right => (pad, 2),
                    Align::Left => (0, pad + 2),
                };
                let padded = format!("{}{text}", " ".repeat(lead));
                match color {
                    // The colour spans the cell (blanks before the text included), not the
                    // blanks after it.
                    Some(code) => s.push_str(&format!("{code}{padded}\x1b[0m")),
                    None => s.push_str(&padded),
                }
                s.extend(std::iter::repeat_n(' ', trail));
            }
            writeln!(out, "{}", s.trim_end())
        };
        line(out, &titles)?;
        for r in &rows {
            line(out, r)?;
        }
        for l in &self.foot {
            writeln!(out, "{l}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(t: &Table) -> String {
        let mut v = Vec::new();
        t.write_text(&mut v, Style::default()).expect("write");
        String::from_utf8(v).expect("utf8")
    }

    #[test]
    fn digits_are_grouped_only_for_people() {
        let human = Style { human: true, width: None };
        assert_eq!(number(0, human), "0");
        assert_eq!(number(999, human), "999");
        assert_eq!(number(1000, human), "1,000");
        assert_eq!(number(1_234_567, human), "1,234,567");
        assert_eq!(number(1_234_567, Style::default()), "1234567");
    }

    /// Columns after a name with wide, combining or escaped characters stay aligned: every
    /// line's `|` is at the same terminal column.
    #[test]
    fn widths_are_terminal_columns_of_escaped_text() {
        let mut t = Table::new();
        t.columns([
            Column::new("name", Kind::Text),
            Column::new("n", Kind::Count),
            Column::new("end", Kind::Text),
        ]);
        for name in ["plain", "漢字漢字", "cafe\u{301}", "a\u{1b}b", "ü"] {
            t.row(vec![name.into(), 7u64.into(), "|".into()]);
        }
        let s = text(&t);
        let cols: Vec<usize> =
            s.lines().skip(1).map(|l| display_width(&l[..l.find('|').expect("bar")])).collect();
        assert!(cols.windows(2).all(|w| w[0] == w[1]), "{s}");
        assert!(s.contains("a\\u{1b}b"), "{s}");
    }

    #[test]
    fn csv_and_text_come_from_one_description() {
        let mut t = Table::new();
        let name = t.column(Column::new("symbol", Kind::Text));
        t.column(Column::new("kind", Kind::Text));
        let n = t.column(Column::new("samples", Kind::Count).csv("cpu.samples"));
        let pct = t.column(Column::new("%", Kind::Decimal(2)).csv("cpu.percent"));
        let off = t.column(Column::new("offset", Kind::Hex));
        t.text_columns(vec![n, pct, off, name]);
        t.row(vec!["=evil".into(), "elf".into(), 1234u64.into(), 12.5.into(), 31u64.into()]);
        t.push(t.blank(), Show::Text);
        t.push(
            vec!["x".into(), "".into(), 1u64.into(), 0.25.into(), Value::Empty.into()],
            Show::Csv,
        );
        let mut csv = Vec::new();
        t.write_csv(&mut csv).expect("csv");
        assert_eq!(
            String::from_utf8(csv).expect("utf8"),
            "symbol,kind,cpu.samples,cpu.percent,offset\n'=evil,elf,1234,12.5,31\nx,,1,0.25,\n"
        );
        let mut out = Vec::new();
        t.write_text(&mut out, Style { human: true, width: None }).expect("text");
        assert_eq!(
            String::from_utf8(out).expect("utf8"),
            "samples      %  offset  symbol\n  1,234  12.50    0x1f  =evil\n\n"
        );
    }

    #[test]
    fn colour_does_not_count_toward_width() {
        let mut t = Table::new();
        t.columns([Column::new("d", Kind::Signed(2)), Column::new("name", Kind::Text)]);
        t.row(vec![Cell::colored(1.5, Some("\x1b[31m")), "a".into()]);
        t.row(vec![(-12.25).into(), "b".into()]);
        assert_eq!(text(&t), "     d  name\n\x1b[31m +1.50\x1b[0m  a\n-12.25  b\n");
        assert_eq!(signed(-0.001, 2), "+0.00");
    }

    /// Issue 39 item 3: a text table names images by basename (more of the path or a short
    /// build-id only where two would look alike); CSV keeps the whole paths.
    #[test]
    fn image_cells_print_short_labels_in_text_and_whole_paths_in_csv() {
        let mut t = Table::new();
        t.columns([Column::new("samples", Kind::Count), Column::new("image", Kind::Text)]);
        let rows = [
            ("/usr/lib/x86_64-linux-gnu/libc.so.6", Some("aaaa0000aaaa")),
            ("/srv/releases/v1/app", Some("3b3b3b3b3b3b")),
            ("/srv/releases/v2/app", Some("4c4c4c4c4c4c")),
            ("/opt/tool", Some("5d5d5d5d5d5d")),
            ("/opt/tool", Some("6e6e6e6e6e6e")),
            ("[kernel.kallsyms]", None),
        ];
        for (n, (p, b)) in rows.iter().enumerate() {
            t.row(vec![(n as u64).into(), Value::image(*p, *b).into()]);
        }
        assert_eq!(
            text(&t),
            "samples  image\n      0  libc.so.6\n      1  v1/app\n      2  v2/app\n      \
             3  tool (5d5d5d5d)\n      4  tool (6e6e6e6e)\n      5  [kernel.kallsyms]\n"
        );
        let mut csv = Vec::new();
        t.write_csv(&mut csv).expect("csv");
        let csv = String::from_utf8(csv).expect("utf8");
        for (p, _) in rows {
            assert!(csv.contains(&format!(",{p}\n")), "{p}: {csv}");
        }
    }

    #[test]
    fn wide_tables_fit_100_columns_by_cutting_names_in_the_middle() {
        let long = format!("/usr/lib/x86_64-linux-gnu/{}/libverylongname.so.6", "d".repeat(120));
        let mut t = Table::new();
        t.columns([Column::new("samples", Kind::Count), Column::new("image", Kind::Text)]);
        t.row(vec![7u64.into(), long.as_str().into()]);
        t.row(vec![8u64.into(), "short".into()]);
        let s = text(&t);
        for l in s.lines() {
            assert!(display_width(l) <= DEFAULT_WIDTH, "{l}");
        }
        let cut = s.lines().nth(1).expect("row");
        assert!(cut.contains("/usr/lib/x86_64") && cut.contains("libverylongname.so.6"), "{cut}");
        assert!(cut.contains('…'), "{cut}");
        assert!(s.contains("short"), "{s}");
        // CSV keeps the name whole; no limit keeps it whole in text too.
        let mut csv = Vec::new();
        t.write_csv(&mut csv).expect("csv");
        assert!(String::from_utf8(csv).expect("utf8").contains(&long));
        let mut out = Vec::new();
        t.write_text(&mut out, Style { human: false, width: Some(0) }).expect("text");
        assert!(String::from_utf8(out).expect("utf8").contains(&long));
        // Wide characters are cut by terminal columns.
        assert_eq!(cut_middle("漢字漢字漢字", 5), "漢…字");
        assert_eq!(cut_middle("abcdef", 6), "abcdef");
        assert_eq!(cut_middle("abcdefgh", 5), "ab…gh");
    }
}
