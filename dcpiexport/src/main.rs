//! dcpiexport: a dcpi profile database as Parquet (or CSV) files for SQL engines.
#![forbid(unsafe_code)]
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use dcpi_client::args::{Selection, SymbolSearch};
use dcpi_client::manpages;
use dcpi_client::manpages::Generate;
use dcpi_client::notes;
use dcpi_client::term;
use dcpi_export::{describe, export, Format, Options};

/// Command line of `dcpiexport`.
#[derive(Parser, Debug)]
#[command(
    name = "dcpiexport",
    version,
    about = "Export dcpi profiles as Parquet (or CSV) for DuckDB, ClickHouse, Spark, Trino",
    long_about = "Export the counts of a dcpi profile database as files that SQL engines read \
                  directly: one row per (host, epoch, image, event, offset) with its samples \
                  (per time slice where dcpid recorded slices: slice_start, slice_seconds), \
                  and a symbols table mapping (image, offset range) to symbol names.\n\n\
                  Parquet output is Hive-partitioned (samples/epoch=ID/host=HOST/part-*.parquet, \
                  zstd) and incremental: manifest.json in --output records what was exported, \
                  and a later run writes only the host-epochs whose files changed (into new \
                  files; a finished partition is never rewritten). The schema and example \
                  queries (DuckDB, ClickHouse SummingMergeTree, Trino/Spark) are in \
                  dcpiexport/EXPORT.md.",
    after_long_help = "EXIT STATUS\n  0 success; 1 the output could not be written; 2 usage \
                       or data error (no database, nothing selected, a corrupt profile without \
                       --keep-going, an output directory holding something else)."
)]
struct Args {
    #[command(flatten)]
    sel: Selection,
    #[command(flatten)]
    symbols: SymbolSearch,
    /// Output format.
    #[arg(long, value_enum, default_value = "parquet")]
    format: Format,
    /// Output directory (created if missing).
    #[arg(long, value_name = "DIR", required_unless_present = "generate")]
    output: Option<PathBuf>,
    /// Do not export the symbols table (no binaries or debug files are looked up).
    #[arg(long)]
    no_symbols: bool,
    /// One row per offset for the whole epoch, without splitting it by time slice
    /// (the two slice columns are then null; fewer rows).
    #[arg(long)]
    no_slices: bool,
    /// List each image whose names are missing or partial (stripped, no debug file, binary
    /// gone or unreadable) with how to get its symbols, one warning line each; without it
    /// they are counted in one line.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// Export only this command's samples (as the who table names it), from the per-command
    /// profiles dcpid writes by default (`by_command`): rows hold the whole epoch (no time
    /// slices) and the `command` column. Use a separate --output directory per command.
    #[arg(long, value_name = "NAME")]
    command: Option<String>,
    /// Write a man page or shell completions to stdout and exit.
    #[arg(long, hide = true, value_enum, value_name = "WHAT")]
    generate: Option<Generate>,
}

fn main() -> ExitCode {
    term::init_logging();
    let args = Args::parse();
    if let Some(g) = args.generate {
        return match manpages::generate(Args::command(), g, &mut std::io::stdout().lock()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dcpiexport: {e}");
                ExitCode::from(1)
            }
        };
    }
    let Some(output) = args.output.as_deref() else {
        eprintln!("dcpiexport: --output DIR is required");
        return ExitCode::from(2);
    };
    let o = Options {
        sel: &args.sel,
        symbols: &args.symbols,
        format: args.format,
        output,
        no_symbols: args.no_symbols,
        slices: !args.no_slices,
        command: args.command.as_deref(),
    };
    let mut stderr = std::io::stderr();
    // Collected and written at the end: the missing-symbol notes, one per stripped image,
    // collapse into one line unless -v (as in the other report tools, issue 39).
    notes::set_verbose(args.verbose);
    let mut warnings = Vec::new();
    let r = export(&o, &mut |w: String| warnings.push(w));
    drop(notes::write_warnings("dcpiexport", &mut stderr, &mut warnings));
    match r {
        Ok(outcome) => {
            drop(describe(&outcome, &mut stderr));
            ExitCode::SUCCESS
        }
        Err(e) => {
            drop(writeln!(stderr, "dcpiexport: error: {e}"));
            ExitCode::from(e.exit_code())
        }
    }
}
