//! dcpilist: one function's samples per instruction and per source line; the hottest
//! instructions of the machine (`--top`).
#![forbid(unsafe_code)]
use std::process::ExitCode;

use clap::Parser;
use dcpi_client::list::{print_error, run, Args, ListError};
use dcpi_client::term;

fn main() -> ExitCode {
    term::tool_main(Args::parse, run, print_error, ListError::exit_code)
}
