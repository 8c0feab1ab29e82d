//! dcpilist: one function's samples per instruction and per source line; the hottest
//! instructions of the machine (`--top`).
#![forbid(unsafe_code)]
use std::process::ExitCode;

use clap::Parser;
use dcpi_client::list::{print_error, run, Args};

fn main() -> ExitCode {
    dcpi_client::term::init_logging();
    let args = Args::parse();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut err = std::io::stderr();
    match run(&args, &mut out, &mut err) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader closed the pipe (`| head`): it has what it wanted.
        Err(e) if dcpi_client::term::is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            use std::io::Write;
            drop(out.flush());
            print_error(&mut err, &e);
            ExitCode::from(e.exit_code())
        }
    }
}
