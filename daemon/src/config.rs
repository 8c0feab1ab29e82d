//! The dcpid configuration file (TOML) and the effective settings after merging it with the
//! command line (the command line wins).
//!
//! ```toml
//! db = "/var/lib/dcpi"
//! spool = "/var/lib/dcpid/spool"
//! host = "web-17"
//! events = ["cycles", "cpu-clock:1000000"]   # or "auto"
//! window_divisor = 16
//! ring_pages = 128
//! flush_interval = "2s"
//! publish_interval = "60s"
//! max_memory_mb = 256
//! retention_days = 7
//! retention_keep = 3
//! socket = "/run/dcpi/dcpid.sock"
//! socket_group = "dcpi"
//! log_level = "info"
//! ```
//!
//! Errors name the file, the line (and column, for syntax errors) and the key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

/// Default configuration file; a missing default file is not an error.
pub const DEFAULT_CONFIG: &str = "/etc/dcpi/dcpid.toml";
/// Default host-local spool (never on the shared database tree).
pub const DEFAULT_SPOOL: &str = "/var/lib/dcpid/spool";
/// Default control socket.
pub const DEFAULT_SOCKET: &str = "/run/dcpi/dcpid.sock";
/// Default group allowed on the control socket besides root (used only if it exists).
pub const DEFAULT_SOCKET_GROUP: &str = "dcpi";

/// Errors in the configuration file or in command-line values; each names the file and field
/// or the argument.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: cannot read configuration file: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Parse { path: PathBuf, line: usize, column: usize, message: String },
    #[error("{origin}: invalid value {value:?} for {field}: {detail}")]
    Invalid { origin: String, field: String, value: String, detail: String },
}

/// Events requested: `auto` or an explicit list of event specs (`perf::events` syntax).
#[derive(Clone, PartialEq, Eq, Debug, Deserialize)]
#[serde(untagged)]
pub enum EventsSetting {
    One(String),
    List(Vec<String>),
}

impl EventsSetting {
    /// The comma-separated form accepted by `perf::events::parse_event_list`.
    pub fn to_list_string(&self) -> String {
        match self {
            EventsSetting::One(s) => s.clone(),
            EventsSetting::List(v) => v.join(","),
        }
    }
}

/// The configuration file as written; every field optional.
#[derive(Clone, PartialEq, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub db: Option<PathBuf>,
    pub spool: Option<PathBuf>,
    pub host: Option<String>,
    pub events: Option<EventsSetting>,
    pub window_divisor: Option<u64>,
    pub ring_pages: Option<usize>,
    pub flush_interval: Option<String>,
    pub publish_interval: Option<String>,
    pub max_memory_mb: Option<u64>,
    pub retention_days: Option<u32>,
    pub retention_keep: Option<usize>,
    pub socket: Option<PathBuf>,
    pub socket_group: Option<String>,
    pub log_level: Option<String>,
    /// Line (1-based) of each top-level key, so that errors in values can name it.
    #[serde(skip)]
    pub key_lines: BTreeMap<String, usize>,
}

impl FileConfig {
    /// Parse TOML text; `path` names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<FileConfig, ConfigError> {
        let mut f: FileConfig = toml::from_str(text).map_err(|e| {
            let (line, column) = e.span().map(|s| line_col(text, s.start)).unwrap_or((1, 1));
            let mut message = e.message().trim().to_string();
            // Type errors point at the value; name the key too.
            let key =
                text.lines().nth(line - 1).and_then(|l| l.split_once('=')).map(|(k, _)| k.trim());
            if let Some(k) = key.filter(|k| !k.is_empty() && !message.contains(*k)) {
                message = format!("`{k}`: {message}");
            }
            ConfigError::Parse { path: path.to_path_buf(), line, column, message }
        })?;
        f.key_lines = key_lines(text);
        Ok(f)
    }

    /// `path:LINE` of `key` when the file sets it, else `path`.
    pub fn origin_of(&self, path: &Path, key: &str) -> String {
        match self.key_lines.get(key) {
            Some(l) => format!("{}:{l}", path.display()),
            None => path.display().to_string(),
        }
    }

    /// Load `path`. When `explicit` is false (the default path) a missing file gives the empty
    /// configuration; when true it is an error.
    pub fn load(path: &Path, explicit: bool) -> Result<FileConfig, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => FileConfig::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                Ok(FileConfig::default())
            }
            Err(source) => Err(ConfigError::Read { path: path.to_path_buf(), source }),
        }
    }
}

/// 1-based line and column (in characters) of byte offset `at`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let at = at.min(text.len());
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    (line, before[start..].chars().count() + 1)
}

/// Lines of top-level `key = value` assignments (before any `[table]`).
fn key_lines(text: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim_start();
        if l.starts_with('[') {
            break;
        }
        if let Some((k, _)) = l.split_once('=') {
            let k = k.trim().trim_matches('"');
            if !k.is_empty() && !k.starts_with('#') {
                out.entry(k.to_string()).or_insert(i + 1);
            }
        }
    }
    out
}

/// Parse a duration such as `2s`, `500ms`, `1m30s`, `1h`, `7d` (a bare number means seconds).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration".into());
    }
    if let Ok(secs) = t.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let mut total = Duration::ZERO;
    let mut rest = t;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(rest.len());
        if digits == 0 {
            return Err(format!("expected a number at {rest:?} (e.g. 2s, 500ms, 1m)"));
        }
        let value: f64 =
            rest[..digits].parse().map_err(|_| format!("bad number {:?}", &rest[..digits]))?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = rest[..unit_len].trim();
        rest = &rest[unit_len..];
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" | "sec" | "secs" => 1.0,
            "m" | "min" | "mins" => 60.0,
            "h" | "hour" | "hours" => 3600.0,
            "d" | "day" | "days" => 86400.0,
            "" => return Err(format!("missing unit after {value} (use ms, s, m, h or d)")),
            other => return Err(format!("unknown unit {other:?} (use ms, s, m, h or d)")),
        };
        let secs = value * scale;
        if !secs.is_finite() || secs > 1e12 {
            return Err("duration too large".into());
        }
        total += Duration::from_secs_f64(secs);
    }
    Ok(total)
}

/// Effective settings of a daemon run.
#[derive(Clone, PartialEq, Debug)]
pub struct Settings {
    pub db: PathBuf,
    pub spool: PathBuf,
    pub host: String,
    /// Comma-separated event list or `auto`.
    pub events: String,
    pub window_divisor: u64,
    pub ring_pages: usize,
    pub flush_interval: Duration,
    pub publish_interval: Duration,
    pub max_memory_mb: u64,
    pub retention_days: u32,
    pub retention_keep: usize,
    pub socket: PathBuf,
    /// Group allowed on the socket besides root; `None` = root only.
    pub socket_group: Option<String>,
    /// Whether the group was given explicitly (then it must exist).
    pub socket_group_explicit: bool,
    pub duration: Option<Duration>,
    /// Log filter (`info`, `debug`, or an EnvFilter directive such as `dcpid=debug`).
    pub log_level: String,
    /// The configuration file read (`None`: `--config none`); `reload` reads it again.
    pub config_file: Option<PathBuf>,
}

impl Settings {
    /// Built-in defaults (host name from the system).
    pub fn defaults() -> Settings {
        Settings {
            db: PathBuf::from(profile_format::DEFAULT_DB),
            spool: PathBuf::from(DEFAULT_SPOOL),
            host: system_host_name(),
            events: "auto".into(),
            window_divisor: 16,
            ring_pages: 128,
            flush_interval: Duration::from_secs(2),
            publish_interval: Duration::from_secs(60),
            max_memory_mb: 256,
            retention_days: 7,
            retention_keep: 3,
            socket: PathBuf::from(DEFAULT_SOCKET),
            socket_group: Some(DEFAULT_SOCKET_GROUP.into()),
            socket_group_explicit: false,
            duration: None,
            log_level: "info".into(),
            config_file: None,
        }
    }

    /// Apply a configuration file on top of `self`; `origin` names the file in errors.
    pub fn apply_file(&mut self, f: &FileConfig, path: &Path) -> Result<(), ConfigError> {
        let origin = |key: &str| f.origin_of(path, key);
        if let Some(v) = &f.db {
            self.db = v.clone();
        }
        if let Some(v) = &f.spool {
            self.spool = v.clone();
        }
        if let Some(v) = &f.host {
            self.host = v.clone();
        }
        if let Some(v) = &f.events {
            self.events = v.to_list_string();
        }
        if let Some(v) = f.window_divisor {
            self.window_divisor = v;
        }
        if let Some(v) = f.ring_pages {
            self.ring_pages = v;
        }
        if let Some(v) = &f.flush_interval {
            self.flush_interval = duration_field(&origin("flush_interval"), "flush_interval", v)?;
        }
        if let Some(v) = &f.publish_interval {
            self.publish_interval =
                duration_field(&origin("publish_interval"), "publish_interval", v)?;
        }
        if let Some(v) = f.max_memory_mb {
            self.max_memory_mb = v;
        }
        if let Some(v) = f.retention_days {
            self.retention_days = v;
        }
        if let Some(v) = f.retention_keep {
            self.retention_keep = v;
        }
        if let Some(v) = &f.socket {
            self.socket = v.clone();
        }
        if let Some(v) = &f.socket_group {
            self.socket_group = Some(v.clone());
            self.socket_group_explicit = true;
        }
        if let Some(v) = &f.log_level {
            self.log_level = v.clone();
        }
        self.config_file = Some(path.to_path_buf());
        self.validate_with(&path.display().to_string(), &f.key_lines)
    }

    /// Check ranges; `origin` is the file or `command line`.
    pub fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        self.validate_with(origin, &BTreeMap::new())
    }

    /// [`Settings::validate`], naming the line of the offending key from `lines`.
    pub fn validate_with(
        &self,
        origin: &str,
        lines: &BTreeMap<String, usize>,
    ) -> Result<(), ConfigError> {
        let bad = |field: &'static str, value: String, detail: &str| ConfigError::Invalid {
            origin: match lines.get(field) {
                Some(l) if origin != COMMAND_LINE => format!("{origin}:{l}"),
                _ => origin.to_string(),
            },
            field: if origin == COMMAND_LINE { flag_for(field) } else { format!("`{field}`") },
            value,
            detail: detail.into(),
        };
        if let Err(e) = profile_format::validate_host_name(&self.host) {
            return Err(bad("host", self.host.clone(), &e.to_string()));
        }
        if self.window_divisor < 2 {
            return Err(bad(
                "window_divisor",
                self.window_divisor.to_string(),
                "must be at least 2",
            ));
        }
        if self.ring_pages == 0 || !self.ring_pages.is_power_of_two() || self.ring_pages > 65536 {
            return Err(bad(
                "ring_pages",
                self.ring_pages.to_string(),
                "must be a power of two between 1 and 65536",
            ));
        }
        if self.flush_interval < Duration::from_millis(10)
            || self.flush_interval > Duration::from_secs(3600)
        {
            return Err(bad(
                "flush_interval",
                format!("{:?}", self.flush_interval),
                "must be between 10ms and 1h",
            ));
        }
        if self.publish_interval < self.flush_interval {
            return Err(bad(
                "publish_interval",
                format!("{:?}", self.publish_interval),
                "must be at least flush_interval",
            ));
        }
        if self.max_memory_mb == 0 {
            return Err(bad("max_memory_mb", "0".into(), "must be at least 1"));
        }
        if self.retention_keep == 0 {
            return Err(bad(
                "retention_keep",
                "0".into(),
                "must keep at least the current epoch (>= 1)",
            ));
        }
        if self.events.trim().is_empty() {
            return Err(bad("events", self.events.clone(), "empty event list"));
        }
        if let Err(e) = crate::perf::events::parse_event_list(&self.events) {
            return Err(bad("events", self.events.clone(), &e.to_string()));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log_level) {
            return Err(bad("log_level", self.log_level.clone(), &e.to_string()));
        }
        if self.spool.starts_with(&self.db) {
            return Err(bad(
                "spool",
                self.spool.display().to_string(),
                "the spool must be host-local, not inside the shared database",
            ));
        }
        Ok(())
    }
}

/// Origin of settings given as flags (errors then name the flag, or the file key it may come from).
pub const COMMAND_LINE: &str = "command line";

fn flag_for(field: &str) -> String {
    let flag = match field {
        "max_memory_mb" => "max-memory".to_string(),
        f => f.replace('_', "-"),
    };
    format!("`--{flag}` (or `{field}` in the configuration file)")
}

fn duration_field(origin: &str, field: &'static str, v: &str) -> Result<Duration, ConfigError> {
    parse_duration(v).map_err(|detail| ConfigError::Invalid {
        origin: origin.to_string(),
        field: format!("`{field}`"),
        value: v.to_string(),
        detail,
    })
}

/// This machine's host name (`uname -n`), reduced to its first label; `localhost` if unusable.
pub fn system_host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let name = raw.trim().split('.').next().unwrap_or("").to_string();
    if profile_format::validate_host_name(&name).is_ok() {
        name
    } else {
        "localhost".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert_eq!(parse_duration("1.5h").unwrap(), Duration::from_secs(5400));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("10").is_ok());
        assert!(parse_duration("12x").unwrap_err().contains("unknown unit"));
    }

    #[test]
    fn file_fields_and_unknown_field() {
        let p = Path::new("/etc/dcpi/test.toml");
        let f = FileConfig::parse(
            "db = \"/x\"\nevents = [\"cycles\", \"cpu-clock:1000000\"]\nflush_interval = \"3s\"\n",
            p,
        )
        .unwrap();
        assert_eq!(
            f.events,
            Some(EventsSetting::List(vec!["cycles".into(), "cpu-clock:1000000".into()]))
        );
        let f2 = FileConfig::parse("events = \"auto\"\n", p).unwrap();
        assert_eq!(f2.events.unwrap().to_list_string(), "auto");
        let err = FileConfig::parse("flush_intreval = \"3s\"\n", p).unwrap_err().to_string();
        assert!(err.contains("test.toml") && err.contains("flush_intreval"), "{err}");
        let err = FileConfig::parse("ring_pages = \"many\"\n", p).unwrap_err().to_string();
        assert!(err.contains("test.toml"), "{err}");
    }

    #[test]
    fn apply_and_validate_name_field() {
        let p = Path::new("/etc/dcpi/test.toml");
        let mut s = Settings::defaults();
        s.host = "h1".into();
        let f = FileConfig::parse("flush_interval = \"1s\"\nretention_keep = 5\n", p).unwrap();
        s.apply_file(&f, p).unwrap();
        assert_eq!(s.flush_interval, Duration::from_secs(1));
        assert_eq!(s.retention_keep, 5);
        let f = FileConfig::parse("flush_interval = \"soon\"\n", p).unwrap();
        let err = s.apply_file(&f, p).unwrap_err().to_string();
        assert!(err.contains("flush_interval") && err.contains("test.toml"), "{err}");
        let f = FileConfig::parse("ring_pages = 3\n", p).unwrap();
        let mut s2 = Settings::defaults();
        s2.host = "h1".into();
        let err = s2.apply_file(&f, p).unwrap_err().to_string();
        assert!(err.contains("ring_pages"), "{err}");
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let p = Path::new("/etc/dcpi/l.toml");
        let err = FileConfig::parse("# c\ndb = \"/x\"\n\nflush_intreval = \"3s\"\n", p)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/etc/dcpi/l.toml:4:1: "), "{err}");
        assert!(err.contains("flush_intreval"), "{err}");
        let err = FileConfig::parse("db = \"/x\"\nring_pages = \"many\"\n", p).unwrap_err();
        assert!(err.to_string().starts_with("/etc/dcpi/l.toml:2:14: "), "{err}");
        let err = FileConfig::parse("db = [\n", p).unwrap_err().to_string();
        assert!(err.starts_with("/etc/dcpi/l.toml:"), "{err}");
        // Values that parse but are out of range name the key's line too.
        let mut s = Settings::defaults();
        s.host = "h".into();
        let f = FileConfig::parse("host = \"h\"\n\n  ring_pages = 3\n", p).unwrap();
        let err = s.apply_file(&f, p).unwrap_err().to_string();
        assert!(err.starts_with("/etc/dcpi/l.toml:3: ") && err.contains("ring_pages"), "{err}");
        let f = FileConfig::parse("db = \"/x\"\nflush_interval = \"soon\"\n", p).unwrap();
        let err = Settings::defaults().apply_file(&f, p).unwrap_err().to_string();
        assert!(err.starts_with("/etc/dcpi/l.toml:2: "), "{err}");
        let f = FileConfig::parse("events = [\"cpu-clock:0\"]\n", p).unwrap();
        let err = Settings::defaults().apply_file(&f, p).unwrap_err().to_string();
        assert!(err.starts_with("/etc/dcpi/l.toml:1: ") && err.contains("cpu-clock:0"), "{err}");
        let f = FileConfig::parse("log_level = \"loud[\"\n", p).unwrap();
        let err = Settings::defaults().apply_file(&f, p).unwrap_err().to_string();
        assert!(err.contains("log_level"), "{err}");
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
    }

    #[test]
    fn missing_default_file_is_fine_explicit_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nope.toml");
        assert_eq!(FileConfig::load(&p, false).unwrap(), FileConfig::default());
        let err = FileConfig::load(&p, true).unwrap_err().to_string();
        assert!(err.contains("nope.toml"), "{err}");
    }
}
