//! dcpid: the dcpi daemon.
#![forbid(unsafe_code)]

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use dcpid::cli::{generate, Cli, LogFormat};
use dcpid::perf::sampler;
use dcpid::service;
use dcpid::service::{Hooks, SetLogLevel};
use dcpid::sys::malloc;
use tracing_subscriber::prelude::*;
use tracing_subscriber::{fmt, reload, EnvFilter};

/// Set up logging with `level` (the configuration's `log_level`; `DCPI_LOG` wins). Returns the
/// hook that changes the level on reload.
fn init_logging(format: LogFormat, level: &str) -> SetLogLevel {
    let from_env = std::env::var_os("DCPI_LOG").is_some();
    let filter = EnvFilter::try_from_env("DCPI_LOG")
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let (filter, handle) = reload::Layer::new(filter);
    let set: SetLogLevel = Box::new(move |l: &str| {
        if from_env {
            // The environment was set on purpose (debugging); the file does not override it.
            return Ok(());
        }
        let f = EnvFilter::try_new(l).map_err(|e| e.to_string())?;
        handle.reload(f).map_err(|e| e.to_string())
    });
    let journald = match format {
        LogFormat::Journald => true,
        LogFormat::Text => false,
        LogFormat::Auto => std::env::var_os("JOURNAL_STREAM").is_some(),
    };
    if journald {
        match tracing_journald::layer() {
            Ok(layer) => {
                tracing_subscriber::registry().with(filter).with(layer).init();
                return set;
            }
            Err(e) => eprintln!("dcpid: journald logging unavailable ({e}); logging to stderr"),
        }
    }
    // Colour only for a person at a terminal: a log redirected to a file, a pipe or the
    // journal's stream must hold plain text (and NO_COLOR turns it off everywhere).
    let ansi = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt::layer().with_ansi(ansi).with_writer(std::io::stderr))
        .init();
    set
}

fn main() -> ExitCode {
    // Usage errors exit with 2 (clap's convention, and ours for bad configuration).
    let cli = Cli::parse();
    if let Some(what) = cli.generate {
        let mut out = std::io::stdout().lock();
        return match generate(Cli::command(), what, "8", &mut out) {
            Ok(()) => ExitCode::SUCCESS,
            // `dcpid --generate man | head`: the reader has what it wanted.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dcpid: --generate: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if cli.probe {
        return match sampler::probe() {
            Ok(msg) => {
                println!("{msg}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                let e = service::explain_sampler_error(e);
                eprintln!("dcpid: sampling is not possible here: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let settings = match cli.settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("dcpid: {e}");
            return ExitCode::from(2);
        }
    };
    let set_log_level = init_logging(cli.log_format, &settings.log_level);
    let reload_cli = cli.clone();
    let hooks = Hooks {
        reload: Some(Box::new(move || reload_cli.settings())),
        set_log_level: Some(set_log_level),
        faults: None,
        notifier: None,
    };
    // Before any thread starts: see sys::malloc for why two arenas and freed memory kept.
    malloc::limit_arenas(2);
    malloc::keep_freed_memory();
    match service::run(settings, hooks) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Once, on stderr: under systemd stderr is the journal too.
            eprintln!("dcpid: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
