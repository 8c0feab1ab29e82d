//! The one escaper of text from untrusted files (symbol and command names, paths, source lines,
//! event names) and the one CSV writer, used by every report tool and by dcpiexport.
//!
//! * [`controls`] escapes control characters (general category Cc: C0, DEL, C1) as Rust escapes
//!   (`\u{1b}`, `\n`). It makes the display form of a name that every output shares, JSON
//!   included: a line-based output cannot be broken by a name.
//! * [`terminal`] escapes, besides, the invisible format characters (Cf: the bidi overrides
//!   U+202E and isolates U+2066..U+2069, zero-width characters, U+FEFF, tag characters) and the
//!   line and paragraph separators (Zl U+2028, Zp U+2029). A bidi override in a name reorders
//!   what a terminal shows after it (a table row can be made to read as another), so tables,
//!   CSV and `dcpictl` print text through this. JSON keeps these characters as they are (a JSON
//!   reader gets the exact name; JSON's own escaping makes it valid).
//! * [`csv_line`] writes RFC 4180 CSV: text cells are escaped for terminals, quoted when they
//!   hold `,` `"` or a line break, and neutralised as OWASP recommends for spreadsheets: a text
//!   cell starting with `=` `+` `-` `@`, a tab or a carriage return gets a leading `'`, so a
//!   command named `=HYPERLINK(...)` is not a formula. Number cells are written as they are
//!   (`-0.5` stays a number).
//!
//! Escaping is idempotent: an escaped string holds only printable characters, so escaping it
//! again changes nothing (the `demangle` fuzz target checks this).

use std::borrow::Cow;
use std::io::{self, Write};

/// The code points of Unicode general categories Cf, Zl and Zp, as inclusive ranges in order.
/// Checked against regex-syntax's Unicode tables by the test
/// `format_ranges_are_unicode_cf_zl_zp` (which prints the table to paste when Unicode adds
/// characters).
const FORMAT_RANGES: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x2028, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
];

/// Whether `c` is a format character or a line/paragraph separator (Cf, Zl, Zp).
pub fn is_format(c: char) -> bool {
    let c = u32::from(c);
    // The common case (ASCII and most of the BMP below U+00AD) without a search.
    if c < 0xAD {
        return false;
    }
    let i = FORMAT_RANGES.partition_point(|&(_, end)| end < c);
    FORMAT_RANGES.get(i).is_some_and(|&(start, _)| start <= c)
}

/// Whether a terminal must not get `c` raw: a control (Cc), format (Cf) or separator (Zl, Zp)
/// character.
pub fn is_unsafe_for_terminal(c: char) -> bool {
    c.is_control() || is_format(c)
}

fn escape_where(s: &str, bad: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(&bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Control characters (ESC, newline, DEL, C1 controls) as Rust escapes (`\u{1b}`, `\n`): the
/// display form of names in every output, JSON included.
pub fn controls(s: &str) -> Cow<'_, str> {
    escape_where(s, char::is_control)
}

/// Text for a terminal (tables, CSV, `dcpictl`): control, format and separator characters as
/// Rust escapes (`\u{1b}`, `\u{202e}`).
pub fn terminal(s: &str) -> Cow<'_, str> {
    escape_where(s, is_unsafe_for_terminal)
}

/// One CSV cell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CsvCell {
    /// Text from anywhere (names, paths, titles): escaped, neutralised, quoted.
    Text(String),
    /// A number as Rust prints it (`12`, `-0.5`, `1e-7`), or empty. A cell that does not parse
    /// as a number is written as text.
    Number(String),
}

impl From<String> for CsvCell {
    fn from(s: String) -> Self {
        Self::Text(s)
    }
}

impl From<&str> for CsvCell {
    fn from(s: &str) -> Self {
        Self::Text(s.to_owned())
    }
}

/// A number cell.
pub fn num(x: impl std::fmt::Display) -> CsvCell {
    CsvCell::Number(x.to_string())
}

/// A text cell of CSV: escaped for a terminal, a leading `= + - @`, tab or CR neutralised with
/// `'` (OWASP's "CSV injection"), quoted (RFC 4180) when it holds `,`, `"` or a line break.
pub fn csv_text(s: &str) -> String {
    // Checked on the text itself: tab and CR are escaped below, but the cell still began with
    // them.
    let formula = s.starts_with(['=', '+', '-', '@', '\t', '\r']);
    let s = terminal(s);
    let s = if formula { Cow::Owned(format!("'{s}")) } else { s };
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.into_owned()
    }
}

fn csv_cell(c: &CsvCell) -> Cow<'_, str> {
    match c {
        CsvCell::Number(n) if n.is_empty() || n.parse::<f64>().is_ok() => Cow::Borrowed(n),
        CsvCell::Number(t) | CsvCell::Text(t) => Cow::Owned(csv_text(t)),
    }
}

/// One CSV line (RFC 4180 fields, `\n` ending).
pub fn csv_line(out: &mut dyn Write, cells: &[CsvCell]) -> io::Result<()> {
    let v: Vec<Cow<'_, str>> = cells.iter().map(csv_cell).collect();
    writeln!(out, "{}", v.join(","))
}

/// A CSV line of text cells (a header).
pub fn csv_titles<S: AsRef<str>>(out: &mut dyn Write, titles: &[S]) -> io::Result<()> {
    let cells: Vec<CsvCell> = titles.iter().map(|t| CsvCell::from(t.as_ref())).collect();
    csv_line(out, &cells)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hand-written table is exactly Unicode's Cf, Zl and Zp as regex-syntax's tables have
    /// them; on a mismatch the test prints the table to paste.
    #[test]
    fn format_ranges_are_unicode_cf_zl_zp() {
        use regex_syntax::hir::{Class, HirKind};
        let hir = regex_syntax::parse(r"[\p{Cf}\p{Zl}\p{Zp}]").expect("parse class");
        let HirKind::Class(Class::Unicode(class)) = hir.kind() else {
            panic!("not a Unicode class: {hir:?}")
        };
        let want: Vec<(u32, u32)> =
            class.ranges().iter().map(|r| (u32::from(r.start()), u32::from(r.end()))).collect();
        let table: String =
            want.iter().map(|(a, b)| format!("    (0x{a:04X}, 0x{b:04X}),\n")).collect();
        assert_eq!(FORMAT_RANGES, &want[..], "FORMAT_RANGES should be:\n{table}");
        // And the lookup agrees with the table on every code point.
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            let cu = u32::from(c);
            let listed = want.iter().any(|&(a, b)| a <= cu && cu <= b);
            assert_eq!(is_format(c), listed, "U+{cu:04X}");
        }
    }

    #[test]
    fn terminal_escapes_controls_format_and_separators() {
        assert_eq!(terminal("plain café ü 漢字"), "plain café ü 漢字");
        assert!(matches!(terminal("plain"), Cow::Borrowed(_)));
        assert_eq!(terminal("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(terminal("a\nb\tc\rd"), "a\\nb\\tc\\rd");
        assert_eq!(terminal("del\u{7f} c1\u{9b}"), "del\\u{7f} c1\\u{9b}");
        assert_eq!(terminal("evil\u{202e}gnp.exe"), "evil\\u{202e}gnp.exe");
        assert_eq!(terminal("iso\u{2066}x\u{2069}"), "iso\\u{2066}x\\u{2069}");
        assert_eq!(terminal("line\u{2028}para\u{2029}"), "line\\u{2028}para\\u{2029}");
        assert_eq!(
            terminal("zw\u{200b}bom\u{feff}tag\u{e0041}"),
            "zw\\u{200b}bom\\u{feff}tag\\u{e0041}"
        );
        // Controls only: format characters are kept (JSON's display form).
        assert_eq!(controls("a\u{1b}b\u{202e}c"), "a\\u{1b}b\u{202e}c");
        for s in ["x\u{202e}\u{1b}\n", "\\u{1b}", "\u{2028}\u{2028}"] {
            let once = terminal(s).into_owned();
            assert_eq!(terminal(&once), once, "idempotent on {s:?}");
            assert!(!once.chars().any(is_unsafe_for_terminal));
        }
    }

    fn line(cells: &[CsvCell]) -> String {
        let mut v = Vec::new();
        csv_line(&mut v, cells).expect("write");
        String::from_utf8(v).expect("utf8")
    }

    #[test]
    fn csv_quotes_neutralises_formulas_and_keeps_numbers() {
        assert_eq!(csv_text("=HYPERLINK(\"x\")"), "\"'=HYPERLINK(\"\"x\"\")\"");
        assert_eq!(csv_text("+1+cmd|' /C calc'!A0"), "'+1+cmd|' /C calc'!A0");
        assert_eq!(csv_text("-2+3"), "'-2+3");
        assert_eq!(csv_text("@SUM(A1)"), "'@SUM(A1)");
        assert_eq!(csv_text("\tx"), "'\\tx");
        assert_eq!(csv_text("\rx"), "'\\rx");
        assert_eq!(csv_text("a,b"), "\"a,b\"");
        assert_eq!(csv_text("ok=1-2"), "ok=1-2");
        assert_eq!(csv_text("bidi\u{202e}x"), "bidi\\u{202e}x");
        assert_eq!(
            line(&[
                "-5".into(),
                num(-0.5),
                num(12),
                num("1e-7"),
                CsvCell::Number(String::new()),
                CsvCell::Number("=1+1".into()),
            ]),
            "'-5,-0.5,12,1e-7,,'=1+1\n"
        );
    }
}
