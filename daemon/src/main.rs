//! dcpid: the dcpi daemon.

use std::process::ExitCode;

use clap::Parser;
use dcpid::cli::{generate, Cli, LogFormat};
use tracing_subscriber::prelude::*;

fn init_logging(format: LogFormat, verbose: u8) {
    let level = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("DCPI_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let journald = match format {
        LogFormat::Journald => true,
        LogFormat::Text => false,
        LogFormat::Auto => std::env::var_os("JOURNAL_STREAM").is_some(),
    };
    if journald {
        match tracing_journald::layer() {
            Ok(layer) => {
                tracing_subscriber::registry().with(filter).with(layer).init();
                return;
            }
            Err(e) => eprintln!("dcpid: journald logging unavailable ({e}); logging to stderr"),
        }
    }
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(what) = cli.generate {
        let mut out = std::io::stdout().lock();
        return match generate(Cli::command(), what, "8", &mut out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dcpid: --generate: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if cli.probe {
        return match dcpid::perf::sampler::probe() {
            Ok(msg) => {
                println!("{msg}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("dcpid: sampling is not possible here: {e}");
                ExitCode::FAILURE
            }
        };
    }
    init_logging(cli.log_format, cli.verbose);
    let settings = match cli.settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dcpid: {e}");
            return ExitCode::from(2);
        }
    };
    match dcpid::service::run(settings) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("dcpid: {e}");
            ExitCode::FAILURE
        }
    }
}
