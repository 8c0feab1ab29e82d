//! dcpilist: one function's samples per instruction and per source line; the hottest
//! instructions of the machine (`--top`).
use std::process::ExitCode;

use clap::Parser;
use dcpi_client::list::{print_error, run, Args};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DCPI_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut err = std::io::stderr();
    match run(&args, &mut out, &mut err) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            use std::io::Write;
            let _ = out.flush();
            print_error(&mut err, &e);
            ExitCode::from(e.exit_code())
        }
    }
}
