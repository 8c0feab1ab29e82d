//! dcpistats: spread of one image's per-function shares over many epochs or hosts.
#![forbid(unsafe_code)]
use std::process::ExitCode;

use dcpi_client::diff::common::print_tool_error;
use dcpi_client::diff::stats_tool::{run_stats, StatsArgs};

fn main() -> ExitCode {
    dcpi_client::term::init_logging();
    let args = StatsArgs::parse_args();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut err = std::io::stderr();
    match run_stats(&args, &mut out, &mut err) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader closed the pipe (`| head`): it has what it wanted.
        Err(e) if dcpi_client::term::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            use std::io::Write;
            drop(out.flush());
            print_tool_error("dcpistats", &mut err, &e);
            ExitCode::from(e.exit_code())
        }
    }
}
