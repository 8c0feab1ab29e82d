//! How the client binaries meet their surroundings: colour only on a terminal (and never with
//! `NO_COLOR`), log set-up, and a reader that closed the pipe (`dcpiprof | head -1`).

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

/// Whether output to a stream that `is_tty` may carry ANSI colour: only a terminal, and only
/// when `NO_COLOR` is unset or empty (<https://no-color.org>).
pub fn colour_allowed(is_tty: bool) -> bool {
    is_tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// The client binaries' tracing subscriber: `DCPI_LOG` (default `warn`) to stderr, with ANSI
/// codes only when stderr is a terminal, so that a redirected log holds plain text.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DCPI_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_ansi(colour_allowed(std::io::stderr().is_terminal()))
        .with_writer(std::io::stderr)
        .init();
}

/// Whether `e`, or an error it wraps, is a write to a pipe whose reader has gone. A report cut
/// short by `| head` is what the user asked for, not a failure: the binaries exit 0 quietly.
pub fn is_broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(x) = cur {
        if x.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
        {
            return true;
        }
        cur = x.source();
    }
    false
}

/// The `main` of the report binaries (`dcpiprof`, `dcpilist`, `dcpidiff`, `dcpistats`): set up
/// logging, parse the command line (`parse` exits on a usage error as clap does), run the tool
/// into buffered stdout, and turn its error into a message on stderr (`report`) and the exit
/// status (`exit_code`). A reader that closed the pipe (`| head`) has what it wanted: exit 0.
pub fn tool_main<A, E>(
    parse: impl FnOnce() -> A,
    run: impl FnOnce(&A, &mut dyn Write, &mut dyn Write) -> Result<(), E>,
    report: impl FnOnce(&mut dyn Write, &E),
    exit_code: impl FnOnce(&E) -> u8,
) -> ExitCode
where
    E: std::error::Error + 'static,
{
    init_logging();
    let args = parse();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut err = std::io::stderr();
    match run(&args, &mut out, &mut err) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            // What the report wrote before failing goes out first; a flush that fails here
            // has nothing better to say than the error printed next.
            drop(out.flush());
            report(&mut err, &e);
            ExitCode::from(exit_code(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diff::common::ToolError;
    use dcpi_report::error::ProfError;

    #[test]
    fn broken_pipe_is_found_through_wrappers() {
        let io = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let e = ToolError::Prof(ProfError::Output(io));
        assert!(is_broken_pipe(&e));
        let other = ProfError::Output(std::io::Error::other("disk full"));
        assert!(!is_broken_pipe(&other));
        assert!(!is_broken_pipe(&ProfError::Usage("x".into())));
    }

    #[test]
    fn no_colour_off_a_terminal() {
        // Off a terminal colour is never allowed, whatever the environment says.
        assert!(!colour_allowed(false));
    }
}
