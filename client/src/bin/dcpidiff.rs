//! dcpidiff: compare two selections of profiles (epochs, days, hosts) per symbol or image.
#![forbid(unsafe_code)]
use std::process::ExitCode;

use clap::Parser;
use dcpi_client::diff::common::{print_tool_error, ToolError};
use dcpi_client::diff::{run_diff, DiffArgs};
use dcpi_client::term;

fn main() -> ExitCode {
    term::tool_main(
        DiffArgs::parse,
        run_diff,
        |err, e| print_tool_error("dcpidiff", err, e),
        ToolError::exit_code,
    )
}
