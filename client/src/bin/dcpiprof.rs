//! dcpiprof: per-image and per-symbol reports from the database.
#![forbid(unsafe_code)]
use std::process::ExitCode;

use clap::Parser;
use dcpi_client::prof::{print_error, run, Args, ProfError};

fn main() -> ExitCode {
    dcpi_client::term::tool_main(Args::parse, run, print_error, ProfError::exit_code)
}
