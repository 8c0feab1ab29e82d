//! What `dcpidiff`, `dcpistats` and `dcpiprof --by` share: choosing the one event compared,
//! resolving an image across rebuilds, per-symbol counts of a subset of profiles, errors,
//! colour and text tables.

use std::io::{self, Write};

pub use crate::escape::{csv_line, csv_titles, num, CsvCell};
pub use crate::prof::output::{printable, r4};
use crate::prof::report;
use crate::prof::select::Loaded;
pub use crate::prof::subset::{resolve_image_builds, symbol_rows, ImageProfiles, Symbolizer};
use crate::prof::ProfError;

/// Errors of `dcpidiff` and `dcpistats`.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error(transparent)]
    Prof(#[from] ProfError),
    /// Bad combination of arguments or a selection with nothing to compare.
    #[error("{0}")]
    Usage(String),
    #[error("writing output: {0}")]
    Output(#[from] io::Error),
}

impl ToolError {
    /// 2 for usage and data errors, 1 for output errors.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Prof(e) => e.exit_code(),
            Self::Usage(_) => 2,
            Self::Output(_) => 1,
        }
    }
}

/// Print `e` as `PROG: error: ...` (with the candidates of an ambiguous `--image`).
pub fn print_tool_error(prog: &str, err: &mut dyn Write, e: &ToolError) {
    match e {
        ToolError::Prof(p) => crate::prof::print_error_as(prog, err, p),
        other => {
            let _ = writeln!(err, "{prog}: error: {}", crate::escape::terminal(&other.to_string()));
        }
    }
}

/// The one event a comparison uses: the first `--event`, else the first event present.
pub fn pick_event(loaded: &Loaded, wanted: &[String]) -> Result<String, ToolError> {
    if wanted.len() > 1 {
        return Err(ToolError::Usage(format!(
            "this tool compares one event at a time; got --event {} (pick one)",
            wanted.join(",")
        )));
    }
    let w = report::weights(loaded, wanted)?;
    w.events.first().cloned().ok_or_else(|| {
        ToolError::Usage("the selection has no samples of any event (nothing to compare)".into())
    })
}

/// `--color`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// Colour when stdout is a terminal and NO_COLOR is not set.
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    pub fn enabled(self) -> bool {
        use std::io::IsTerminal;
        match self {
            Self::Always => true,
            Self::Never => false,
            Self::Auto => {
                std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
                    && std::io::stdout().is_terminal()
            }
        }
    }
}

/// A table cell, optionally wrapped in an ANSI colour that does not count toward its width.
#[derive(Clone, Debug)]
pub struct Cell {
    pub text: String,
    pub color: Option<&'static str>,
}

impl From<String> for Cell {
    fn from(text: String) -> Self {
        Self { text, color: None }
    }
}

pub const RED: &str = "\x1b[31m";
pub const GREEN: &str = "\x1b[32m";
pub const BOLD: &str = "\x1b[1m";

/// Right-aligned columns, the last one free-width text (a symbol or image name). Cell text is
/// escaped for the terminal (its colour is not text).
pub fn table(out: &mut dyn Write, titles: &[&str], rows: &[Vec<Cell>]) -> io::Result<()> {
    let rows: Vec<Vec<Cell>> = rows
        .iter()
        .map(|r| r.iter().map(|c| Cell { text: printable(&c.text), color: c.color }).collect())
        .collect();
    let ncol = titles.len();
    let mut width: Vec<usize> = titles.iter().map(|t| t.chars().count()).collect();
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.text.chars().count());
        }
    }
    let mut line = |cells: Vec<Cell>| -> io::Result<()> {
        let mut s = String::new();
        for (i, c) in cells.into_iter().enumerate() {
            let padded =
                if i + 1 == ncol { c.text } else { format!("{:>w$}  ", c.text, w = width[i]) };
            match c.color {
                Some(code) => {
                    let trimmed = padded.trim_end();
                    let pad = padded.len() - trimmed.len();
                    s.push_str(&format!("{code}{trimmed}\x1b[0m{}", " ".repeat(pad)));
                }
                None => s.push_str(&padded),
            }
        }
        writeln!(out, "{}", s.trim_end())
    };
    line(titles.iter().map(|t| Cell::from(t.to_string())).collect())?;
    for r in &rows {
        line(r.clone())?;
    }
    Ok(())
}

/// One-decimal-place rendering of a signed number of points, sign always shown.
pub fn signed(x: f64, decimals: usize) -> String {
    let x = if x.abs() < 0.5 * 10f64.powi(-i32::try_from(decimals).unwrap_or(i32::MAX)) {
        0.0
    } else {
        x
    };
    format!("{x:+.decimals$}")
}
