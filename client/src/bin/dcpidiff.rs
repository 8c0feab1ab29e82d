//! dcpidiff: compare two selections of profiles (epochs, days, hosts) per symbol or image.
use std::process::ExitCode;

use clap::Parser;
use dcpi_client::diff::common::print_tool_error;
use dcpi_client::diff::{run_diff, DiffArgs};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DCPI_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = DiffArgs::parse();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut err = std::io::stderr();
    match run_diff(&args, &mut out, &mut err) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            use std::io::Write;
            let _ = out.flush();
            print_tool_error("dcpidiff", &mut err, &e);
            ExitCode::from(e.exit_code())
        }
    }
}
