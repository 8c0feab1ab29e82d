//! dcpistats: spread of one image's per-function shares over many epochs or hosts.
#![forbid(unsafe_code)]
use std::process::ExitCode;

use dcpi_client::diff::common::{print_tool_error, ToolError};
use dcpi_client::diff::stats_tool::{run_stats, StatsArgs};
use dcpi_client::term;

fn main() -> ExitCode {
    term::tool_main(
        StatsArgs::parse_args,
        run_stats,
        |err, e| print_tool_error("dcpistats", err, e),
        ToolError::exit_code,
    )
}
