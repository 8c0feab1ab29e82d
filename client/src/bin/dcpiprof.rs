//! dcpiprof: per-image and per-symbol reports from the database.
#![forbid(unsafe_code)]
use std::process::ExitCode;

use clap::Parser;
use dcpi_client::prof::{print_error, run, Args, ProfError};
use dcpi_client::term;

fn main() -> ExitCode {
    term::tool_main(Args::parse, run, print_error, ProfError::exit_code)
}
