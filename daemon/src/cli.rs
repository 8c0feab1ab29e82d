//! The dcpid command line. Flags override the configuration file.

use std::path::PathBuf;
use std::time::Duration;

use clap::builder::PossibleValue;
use clap::{CommandFactory, Parser, ValueEnum};

use crate::config::{
    parse_duration, ConfigError, FileConfig, PartialSettings, Settings, DEFAULT_CONFIG,
};
use crate::man;

/// dcpid: continuous, system-wide, low-overhead profiling of every process and the kernel.
///
/// Samples every CPU with perf events, attributes each sample to an (image, offset) and merges
/// the counts into a profile database shared by many hosts (see dcpiprof(1)). Controlled with
/// dcpictl(8). SIGHUP (or `dcpictl reload`) re-reads the configuration file.
///
/// Exit status: 0 after SIGTERM/SIGINT or the end of --duration, with everything published (or,
/// after a signal, kept in the spool for the next start); 2 for a usage or configuration error
/// (bad flag or key, wrong type, unknown event, bad period, unwritable database or spool path,
/// a --socket whose directory is missing or that is not a socket, sampling not permitted); 1 for
/// other failures to start, for a --duration run that could not publish what it sampled, and
/// whenever samples were dropped (written neither to the spool nor to the database; the closing
/// log line says `dcpid stopped samples=N dropped=D`); 3
/// when a daemon thread died while it ran (status said `degraded`, the watchdog was not fed).
#[derive(Parser, Debug, Clone)]
#[command(name = "dcpid", version, about, long_about, max_term_width = 100)]
pub struct Cli {
    /// Configuration file (TOML). A missing default file is fine; `none` reads no file.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: Option<String>,
    /// Every setting of the configuration file, as a flag (the flag wins over the file).
    #[command(flatten)]
    pub settings: PartialSettings,
    /// Run for DUR (e.g. `20`, `20s`, `5m`; a plain number is seconds), then flush, publish
    /// everything and exit 0.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// Check whether sampling is possible here, print the result, exit 0 (yes) or 1 (no).
    #[arg(long)]
    pub probe: bool,
    /// Log destination: `journald` when run by systemd, `text` on stderr otherwise.
    #[arg(long, value_enum, default_value_t = LogFormat::Auto)]
    pub log_format: LogFormat,
    /// More log output (-v: debug, -vv: trace).
    #[arg(short, long, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Write the man page or a shell completion script to stdout.
    #[arg(long, value_enum, hide = true, value_name = "WHAT")]
    pub generate: Option<Generate>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum LogFormat {
    Auto,
    Journald,
    Text,
}

/// What `--generate` writes: what every dcpi binary generates ([`dcpi_manpage::Generate`]),
/// plus the configuration file's page.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Generate {
    /// The man page or a completion script, as every binary writes them.
    Common(dcpi_manpage::Generate),
    /// dcpid.toml(5), the configuration file's page.
    ManConfig,
}

/// The common values and `man-config`, listed once from the common enum.
static GENERATE_VALUES: std::sync::LazyLock<Vec<Generate>> = std::sync::LazyLock::new(|| {
    let common = dcpi_manpage::Generate::value_variants().iter().copied().map(Generate::Common);
    common.chain([Generate::ManConfig]).collect()
});

impl ValueEnum for Generate {
    fn value_variants<'a>() -> &'a [Self] {
        &GENERATE_VALUES
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        match self {
            Self::Common(g) => g.to_possible_value(),
            Self::ManConfig => Some(
                PossibleValue::new("man-config")
                    .help("dcpid.toml(5), the configuration file's page"),
            ),
        }
    }
}

/// Write a man page (section `section`) or a completion script for `cmd` to `out`.
pub fn generate(
    cmd: clap::Command,
    what: Generate,
    section: &str,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    match what {
        Generate::Common(g) => man::generate(cmd, g, section, out),
        Generate::ManConfig => man::config(out),
    }
}

impl Cli {
    pub fn command() -> clap::Command {
        <Self as CommandFactory>::command()
    }

    /// Read the configuration file (unless `--config none`) and merge: defaults, file, flags.
    /// Called again on reload (SIGHUP, `dcpictl reload`): the flags keep winning over the file.
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let (path, explicit) = match self.config.as_deref() {
            Some("none") => (None, false),
            Some(p) => (Some(PathBuf::from(p)), true),
            None => (Some(PathBuf::from(DEFAULT_CONFIG)), false),
        };
        let file = match &path {
            Some(p) => Some(FileConfig::load(p, explicit)?),
            None => None,
        };
        let mut flags = self.settings.clone();
        match self.verbose {
            0 => {}
            1 => flags.log_level = Some("debug".into()),
            _ => flags.log_level = Some("trace".into()),
        }
        let mut s = Settings::merge(file.as_ref().zip(path.as_deref()), &flags)?;
        s.duration = self.duration;
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_override_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("d.toml");
        std::fs::write(&cfg, "flush_interval = \"5s\"\nring_pages = 64\nhost = \"fromfile\"\n")
            .unwrap();
        let cli = Cli::try_parse_from([
            "dcpid",
            "-c",
            cfg.to_str().unwrap(),
            "--flush-interval",
            "1s",
            "--db",
            "/tmp/x-db",
        ])
        .unwrap();
        let s = cli.settings().unwrap();
        assert_eq!(s.flush_interval, Duration::from_secs(1));
        assert_eq!(s.ring_pages, 64);
        assert_eq!(s.host, "fromfile");
        assert_eq!(s.db, PathBuf::from("/tmp/x-db"));
    }

    #[test]
    fn duration_takes_plain_seconds() {
        for (arg, secs) in [("20", 20), ("20s", 20), ("1m", 60), ("1h 30m", 5400)] {
            let cli = Cli::try_parse_from(["dcpid", "-c", "none", "--duration", arg]).unwrap();
            assert_eq!(cli.duration, Some(Duration::from_secs(secs)), "{arg}");
        }
    }

    #[test]
    fn huge_durations_are_usage_errors() {
        for arg in ["18446744073709551615", "18446744073709551615s", "600000h"] {
            let e = Cli::try_parse_from(["dcpid", "-c", "none", "--duration", arg]).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{arg}");
            assert!(e.to_string().contains("--duration"), "{arg}: {e}");
        }
    }

    #[test]
    fn bad_flag_value_names_it() {
        let err =
            Cli::try_parse_from(["dcpid", "--flush-interval", "soon"]).unwrap_err().to_string();
        assert!(err.contains("--flush-interval"), "{err}");
        let cli = Cli::try_parse_from(["dcpid", "-c", "none", "--host", "a/b"]).unwrap();
        let err = cli.settings().unwrap_err().to_string();
        assert!(err.contains("--host"), "{err}");
        let cli = Cli::try_parse_from(["dcpid", "-c", "none", "--host", "h", "--ring-pages", "3"])
            .unwrap();
        let err = cli.settings().unwrap_err().to_string();
        assert!(err.contains("--ring-pages"), "{err}");
        let cli = Cli::try_parse_from(["dcpid", "-c", "/nonexistent/dcpid.toml"]).unwrap();
        let err = cli.settings().unwrap_err().to_string();
        assert!(err.contains("/nonexistent/dcpid.toml"), "{err}");
    }

    #[test]
    fn generate_man_and_completions() {
        let common = Generate::value_variants().iter().filter(|g| **g != Generate::ManConfig);
        assert_eq!(common.clone().count(), 4, "man and three shells");
        for &g in common {
            let mut out = Vec::new();
            generate(Cli::command(), g, "8", &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            assert!(text.contains("dcpid"), "{g:?}");
            // roff escapes the dash.
            assert!(text.contains("flush-interval") || text.contains("flush\\-interval"), "{g:?}");
        }
    }

    /// Every duration flag (`DUR`) and its configuration key refuse 2^64-1 seconds with an
    /// error naming them (exit 2), and accept the largest allowed value without a panic.
    #[test]
    fn every_duration_flag_and_key_is_bounded() {
        let cmd = Cli::command();
        let flags: Vec<String> = cmd
            .get_arguments()
            .filter(|a| a.get_value_names().is_some_and(|v| v.iter().any(|n| n.as_str() == "DUR")))
            .filter_map(|a| a.get_long().map(str::to_string))
            .collect();
        for expected in
            ["duration", "redraw-interval", "flush-interval", "publish-interval", "status-interval"]
        {
            assert!(flags.iter().any(|f| f == expected), "{expected} not found in {flags:?}");
        }
        let dir = tempfile::tempdir().unwrap();
        for flag in &flags {
            for huge in ["18446744073709551615", "18446744073709551615s", "10000000000d"] {
                let e = Cli::try_parse_from(["dcpid", "-c", "none", &format!("--{flag}"), huge])
                    .unwrap_err();
                assert_eq!(e.exit_code(), 2, "--{flag} {huge}");
                assert!(e.to_string().contains(&format!("--{flag}")), "--{flag} {huge}: {e}");
            }
            if flag == "duration" {
                continue;
            }
            let key = flag.replace('-', "_");
            let cfg = dir.path().join(format!("{key}.toml"));
            std::fs::write(&cfg, format!("host = \"h\"\n{key} = \"18446744073709551615s\"\n"))
                .unwrap();
            let cli = Cli::try_parse_from(["dcpid", "-c", cfg.to_str().unwrap()]).unwrap();
            let e = cli.settings().unwrap_err().to_string();
            assert!(e.contains(&key) && e.contains(":2:") && e.contains("too long"), "{e}");
        }
        // The largest value parses; the settings refuse it with a range error if they must.
        for flag in &flags {
            let cli = Cli::try_parse_from([
                "dcpid",
                "-c",
                "none",
                "--host",
                "h",
                &format!("--{flag}"),
                "365d",
            ])
            .unwrap();
            if let Err(e) = cli.settings() {
                assert!(e.to_string().contains(&format!("--{flag}")), "{e}");
            }
        }
    }
}
