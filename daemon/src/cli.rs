//! The dcpid command line. Flags override the configuration file.

use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, Parser, ValueEnum};

use crate::config::{parse_duration, ConfigError, FileConfig, Settings, DEFAULT_CONFIG};

/// dcpid: continuous, system-wide, low-overhead profiling of every process and the kernel.
///
/// Samples every CPU with perf events, attributes each sample to an (image, offset) and merges
/// the counts into a profile database shared by many hosts (see dcpiprof(1)). Controlled with
/// dcpictl(8). SIGHUP (or `dcpictl reload`) re-reads the configuration file.
///
/// Exit status: 0 after SIGTERM/SIGINT or the end of --duration, with everything published; 2
/// for a usage or configuration error (bad flag or key, wrong type, unknown event, bad period,
/// unwritable database or spool path, sampling not permitted); 1 for other failures to start.
#[derive(Parser, Debug, Clone)]
#[command(name = "dcpid", version, about, long_about, max_term_width = 100)]
pub struct Cli {
    /// Configuration file (TOML). A missing default file is fine; `none` reads no file.
    #[arg(short = 'c', long = "config", value_name = "FILE")]
    pub config: Option<String>,
    /// Profile database directory (may be shared by many hosts, e.g. over NFS).
    #[arg(long, value_name = "DIR")]
    pub db: Option<PathBuf>,
    /// Host-local spool directory (an append-only log) holding increments not yet published [default: /var/lib/dcpid/spool].
    #[arg(long, value_name = "DIR")]
    pub spool: Option<PathBuf>,
    /// Host name used for this host's directory in the database [default: the system host name].
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Events to sample: `auto` or a comma-separated list like `cycles,cpu-clock:1000000`.
    #[arg(short = 'e', long, value_name = "LIST")]
    pub events: Option<String>,
    /// Period randomization: periods are drawn from [P - P/N, P] [default: 16].
    #[arg(long, value_name = "N")]
    pub window_divisor: Option<u64>,
    /// Data pages of each per-CPU ring buffer (power of two) [default: 128].
    #[arg(long, value_name = "N")]
    pub ring_pages: Option<usize>,
    /// How often increments are written to the spool; bounds what a crash loses [default: 2s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub flush_interval: Option<Duration>,
    /// Each changed shared profile is rewritten at most this often, spread over the interval
    /// [default: 60s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub publish_interval: Option<Duration>,
    /// Bound on unwritten data held in memory while the disk fails; past it the oldest is
    /// dropped and counted [default: 256].
    #[arg(long, value_name = "MB")]
    pub max_memory: Option<u64>,
    /// Delete this host's epochs older than N days ... [default: 7]
    #[arg(long, value_name = "N")]
    pub retention_days: Option<u32>,
    /// ... but always keep the newest N epochs [default: 3].
    #[arg(long, value_name = "N")]
    pub retention_keep: Option<usize>,
    /// Control socket [default: /run/dcpi/dcpid.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Group allowed to use the control socket besides root [default: dcpi, if it exists].
    #[arg(long, value_name = "NAME")]
    pub socket_group: Option<String>,
    /// Log filter: `error`, `warn`, `info`, `debug`, `trace` or a directive like
    /// `dcpid::store=debug` [default: info; -v is debug]. `DCPI_LOG` in the environment wins.
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
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

/// What `--generate` writes.
#[derive(Clone, Copy, PartialEq, Eq, Debug, ValueEnum)]
pub enum Generate {
    Man,
    CompleteBash,
    CompleteZsh,
    CompleteFish,
}

/// Write a man page (section `section`) or a completion script for `cmd` to `out`.
pub fn generate(
    mut cmd: clap::Command,
    what: Generate,
    section: &str,
    out: &mut dyn std::io::Write,
) -> std::io::Result<()> {
    let name = cmd.get_name().to_string();
    match what {
        Generate::Man => clap_mangen::Man::new(cmd).section(section).render(out),
        Generate::CompleteBash => {
            clap_complete::generate(clap_complete::Shell::Bash, &mut cmd, name, out);
            Ok(())
        }
        Generate::CompleteZsh => {
            clap_complete::generate(clap_complete::Shell::Zsh, &mut cmd, name, out);
            Ok(())
        }
        Generate::CompleteFish => {
            clap_complete::generate(clap_complete::Shell::Fish, &mut cmd, name, out);
            Ok(())
        }
    }
}

impl Cli {
    pub fn command() -> clap::Command {
        <Cli as CommandFactory>::command()
    }

    /// Read the configuration file (unless `--config none`) and apply the flags on top. Called
    /// again on reload (SIGHUP, `dcpictl reload`): the flags keep winning over the file.
    pub fn settings(&self) -> Result<Settings, ConfigError> {
        let mut s = Settings::defaults();
        if let Some(h) = &self.host {
            // Set early so that validation of the file does not trip over an unusable system
            // host name the flag replaces.
            s.host = h.clone();
        }
        match self.config.as_deref() {
            Some("none") => {}
            Some(p) => {
                let path = PathBuf::from(p);
                let f = FileConfig::load(&path, true)?;
                s.apply_file(&f, &path)?;
            }
            None => {
                let path = PathBuf::from(DEFAULT_CONFIG);
                let f = FileConfig::load(&path, false)?;
                s.apply_file(&f, &path)?;
            }
        }
        if let Some(v) = &self.db {
            s.db = v.clone();
        }
        if let Some(v) = &self.spool {
            s.spool = v.clone();
        }
        if let Some(v) = &self.host {
            s.host = v.clone();
        }
        if let Some(v) = &self.events {
            s.events = v.clone();
        }
        if let Some(v) = self.window_divisor {
            s.window_divisor = v;
        }
        if let Some(v) = self.ring_pages {
            s.ring_pages = v;
        }
        if let Some(v) = self.flush_interval {
            s.flush_interval = v;
        }
        if let Some(v) = self.publish_interval {
            s.publish_interval = v;
        }
        if let Some(v) = self.max_memory {
            s.max_memory_mb = v;
        }
        if let Some(v) = self.retention_days {
            s.retention_days = v;
        }
        if let Some(v) = self.retention_keep {
            s.retention_keep = v;
        }
        if let Some(v) = &self.socket {
            s.socket = v.clone();
        }
        if let Some(v) = &self.socket_group {
            s.socket_group = Some(v.clone());
            s.socket_group_explicit = true;
        }
        if let Some(v) = &self.log_level {
            s.log_level = v.clone();
        }
        match self.verbose {
            0 => {}
            1 => s.log_level = "debug".into(),
            _ => s.log_level = "trace".into(),
        }
        s.duration = self.duration;
        // Flag names in errors: the field names match the flags with `_` for `-`.
        s.validate(crate::config::COMMAND_LINE)?;
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
        for (arg, secs) in [("20", 20), ("20s", 20), ("1m", 60)] {
            let cli = Cli::try_parse_from(["dcpid", "-c", "none", "--duration", arg]).unwrap();
            assert_eq!(cli.duration, Some(Duration::from_secs(secs)), "{arg}");
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
        for g in
            [Generate::Man, Generate::CompleteBash, Generate::CompleteZsh, Generate::CompleteFish]
        {
            let mut out = Vec::new();
            generate(Cli::command(), g, "8", &mut out).unwrap();
            let text = String::from_utf8(out).unwrap();
            assert!(text.contains("dcpid"), "{g:?}");
            // roff escapes the dash.
            assert!(text.contains("flush-interval") || text.contains("flush\\-interval"), "{g:?}");
        }
    }
}
