//! dcpidiff: compare two selections of profiles (epochs, days, hosts) per symbol or image.
#![forbid(unsafe_code)]
use std::process::ExitCode;

use clap::Parser;
use dcpi_client::diff::common::print_tool_error;
use dcpi_client::diff::{run_diff, DiffArgs};

fn main() -> ExitCode {
    dcpi_client::term::init_logging();
    let args = DiffArgs::parse();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut err = std::io::stderr();
    match run_diff(&args, &mut out, &mut err) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader closed the pipe (`| head`): it has what it wanted.
        Err(e) if dcpi_client::term::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            use std::io::Write;
            drop(out.flush());
            print_tool_error("dcpidiff", &mut err, &e);
            ExitCode::from(e.exit_code())
        }
    }
}
