//! What `dcpidiff`, `dcpistats` and `dcpiprof --by` share: choosing the one event compared,
//! resolving an image across rebuilds, per-symbol counts of a subset of profiles, errors,
//! colour (tables are drawn by [`dcpi_report::render`]).

use std::io::{self, Write};

use crate::args::NamesArgs;
use crate::prof;
use crate::prof::output::TableFormat;
pub use crate::prof::output::{printable, r4};
pub use crate::prof::subset::{resolve_image_builds, symbol_rows, ImageProfiles, Symbolizer};
use dcpi_report::error::ProfError;
use dcpi_report::report;
use dcpi_report::select::Loaded;

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
        ToolError::Prof(p) => prof::print_error_as(prog, err, p),
        other => {
            drop(writeln!(err, "{prog}: error: {}", escape::terminal(&other.to_string())));
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
// The variants' doc comments are --help text, printed as written (no backticks).
#[allow(clippy::doc_markdown)]
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

use dcpi_report::escape;
pub use dcpi_report::render::{signed, BOLD, GREEN, RED};

/// The flags that end both `dcpidiff`'s and `dcpistats`' command lines (flattened last, so
/// `--help` lists them where it always did). `--color` and `--limit` say what they do in each
/// tool: their help is set there, with [`OutputArgs::tool_help`].
#[derive(clap::Args, Debug, Clone)]
pub struct OutputArgs {
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: TableFormat,
    #[arg(long, value_enum, default_value = "auto")]
    pub color: ColorChoice,
    #[arg(long, value_name = "N", value_parser = crate::args::parse_limit)]
    pub limit: Option<usize>,
    #[command(flatten)]
    pub names: NamesArgs,
}

impl OutputArgs {
    /// For `#[command(mut_args(...))]`: give `--color` and `--limit` one tool's help. In place:
    /// `mut_arg` would move them last, which reorders the shell completions.
    pub fn tool_help(
        color: &'static str,
        limit: &'static str,
    ) -> impl FnMut(clap::Arg) -> clap::Arg {
        move |a| match a.get_id().as_str() {
            "color" => a.help(color),
            "limit" => a.help(limit),
            _ => a,
        }
    }
}
