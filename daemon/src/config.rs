//! The dcpid settings: one declaration ([`PartialSettings`], from the `settings!` list below)
//! that is at once the configuration file's schema (TOML, serde) and the command line's flags
//! (clap). Built-in defaults, the file and the flags are merged in that order (later wins);
//! a reload (SIGHUP, `dcpictl reload`) reads the file again and applies the same flags on top,
//! then takes the keys in [`RELOADABLE`] live and reports the others as needing a restart.
//!
//! Adding a key: one entry in `settings!` (type, default, flag and file attributes), and, if it
//! may change without a restart, its name in [`RELOADABLE`].
//!
//! ```toml
//! db = "/var/lib/dcpi"
//! spool = "/run/dcpid/spool"
//! host = "web-17"
//! events = ["cycles", "cpu-clock:1000000"]   # or "auto"
//! window_divisor = 16
//! ring_pages = 128        # 1024 by default with callchains "dwarf" or "auto"
//! redraw_interval = "1s"   # one period re-arm per CPU per interval, at a random instant
//! flush_interval = "15s"
//! stack_flush_interval = "1m"   # how often a timed flush takes the call stacks too
//! publish_interval = "15m"
//! max_memory_mb = 256
//! epoch_interval = "1d"   # or "off"
//! retention_days = 7
//! retention_keep = 3
//! socket = "/run/dcpi/dcpid.sock"
//! socket_group = "dcpi"
//! log_level = "info"
//! status_interval = "10s"
//! perf_map_max_bytes = 16777216
//! perf_map_max_entries = 100000
//! callchains = "none"      # or "fp": through frame pointers; "dwarf": through CFI;
//!                          # "auto": frame pointers where functions keep them, CFI elsewhere
//! sample_max_stack = 64
//! sample_user_stack = 8192  # bytes of user stack copied per sample with "dwarf" and "auto"
//! stack_one_in = 1          # take the stack of one sample in N (at random), each counts N
//! slice_interval = "1m"       # time slices in each host-epoch (FORMAT.md §14); "0": off
//! slice_rollup_after = "6h"   # older slices become hour slices
//! off_cpu = false             # off-CPU time with stacks, event "off-cpu" (nanoseconds)
//! off_cpu_threshold = "0"     # shorter waits are counted without a stack
//! off_cpu_source = "auto"     # or "bpf", "tracepoint", "switch-records"
//! ```
//!
//! Errors name the file, the line (and column, for syntax and type errors; from the spans
//! `toml` keeps with `serde_spanned`) and the key, or the flag.
// The doc comments of the clap types here are the --help text and man pages, printed as
// written: backticks around names would show up there.
#![allow(clippy::doc_markdown)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::offcpu::Source;
use crate::perf;
use crate::perf::callchain::DEFAULT_MAX_STACK;
use crate::perf::dwarf::DEFAULT_USER_STACK;
/// `ring_pages` when `callchains` is `dwarf` or `auto` and it is not set (its field docs).
pub const DWARF_RING_PAGES: usize = 1024;
use crate::perf::dwarf::MAX_USER_STACK;
use crate::perf::sampler::MAX_REDRAW_INTERVAL;
use crate::resolve::jit::MAX_JIT_MAP_BYTES;
use crate::resolve::jit::MAX_JIT_MAP_ENTRIES;
use serde::{de, Deserialize, Deserializer};
use toml::de::Error as TomlError;
use toml::Spanned;

/// Default configuration file; a missing default file is not an error.
pub const DEFAULT_CONFIG: &str = "/etc/dcpi/dcpid.toml";
/// Default host-local spool (never on the shared database tree).
pub const DEFAULT_SPOOL: &str = "/run/dcpid/spool";
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

/// Longest duration any setting accepts: larger values (e.g. 2^64-1 s) are refused with an
/// error rather than overflowing a deadline later.
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 86400);
const MAX_DURATION_TEXT: &str = "365d";

/// Parse a duration: humantime's syntax (`2s`, `500ms`, `1m 30s`, `1h`, `7d`), or a bare number
/// of seconds. At most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let d = match t.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) if t.bytes().all(|b| b.is_ascii_digit()) && !t.is_empty() => {
            return Err(format!(
                "{t} seconds is too long (at most {})",
                show_duration(MAX_DURATION)
            ))
        }
        Err(_) => humantime::parse_duration(t)
            .map_err(|e| format!("{e} (e.g. 2s, 500ms, 1m, 1h 30m, or plain seconds)"))?,
    };
    if d > MAX_DURATION {
        return Err(format!("too long (at most {MAX_DURATION_TEXT})"));
    }
    Ok(d)
}

/// `epoch_interval`: scheduled epochs start this often, aligned to UTC; zero is off.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct EpochInterval(pub Duration);

impl EpochInterval {
    /// One day (see `epoch_interval`'s help): DCPI-like, bounded history for retention, and
    /// few epoch directories on NFS.
    pub const DEFAULT: Self = Self(Duration::from_secs(86_400));
    pub const OFF: Self = Self(Duration::ZERO);

    /// The interval, `None` when scheduled epochs are off.
    pub fn get(self) -> Option<Duration> {
        (!self.0.is_zero()).then_some(self.0)
    }
}

impl ShowValue for EpochInterval {
    fn show(&self) -> String {
        match self.get() {
            Some(d) => show_duration(d),
            None => "off".into(),
        }
    }
}

/// `off`, or a duration as [`parse_duration`] reads it (`0` is off too). Range and whole
/// seconds are checked with the other keys ([`Settings::validate`]), so that the error names
/// where the value came from.
pub fn parse_epoch_interval(s: &str) -> Result<EpochInterval, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("off") {
        return Ok(EpochInterval::OFF);
    }
    parse_duration(t)
        .map(EpochInterval)
        .map_err(|e| format!("{e}; or `off` for no scheduled epochs"))
}

/// `epoch_interval = "1d"`, `"off"`, or a whole number of seconds (`0`: off).
fn de_epoch_interval<'de, D: Deserializer<'de>>(d: D) -> Result<Option<EpochInterval>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum TextOrSeconds {
        Text(String),
        Seconds(i64),
    }
    let text = match TextOrSeconds::deserialize(d)? {
        TextOrSeconds::Text(t) => t,
        TextOrSeconds::Seconds(n) if n < 0 => {
            return Err(de::Error::custom(format!("{n} is negative")))
        }
        TextOrSeconds::Seconds(n) => n.to_string(),
    };
    parse_epoch_interval(&text).map(Some).map_err(de::Error::custom)
}

fn show_duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn de_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    parse_duration(&text).map(Some).map_err(de::Error::custom)
}

/// `events = "auto"` or `events = ["cycles", "cpu-clock:1000000"]`: the comma-separated form
/// `perf::events::parse_event_list` reads.
fn de_events<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrList {
        One(String),
        List(Vec<String>),
    }
    Ok(Some(match OneOrList::deserialize(d)? {
        OneOrList::One(s) => s,
        OneOrList::List(v) => v.join(","),
    }))
}

/// A setting's value as reload reports and errors show it.
trait ShowValue {
    fn show(&self) -> String;
}

impl ShowValue for PathBuf {
    fn show(&self) -> String {
        self.display().to_string()
    }
}
impl ShowValue for String {
    fn show(&self) -> String {
        self.clone()
    }
}
impl ShowValue for Duration {
    fn show(&self) -> String {
        show_duration(*self)
    }
}
impl ShowValue for Option<String> {
    fn show(&self) -> String {
        self.clone().unwrap_or_else(|| "(none)".into())
    }
}
macro_rules! show_display {
    ($($t:ty),*) => { $(impl ShowValue for $t { fn show(&self) -> String { self.to_string() } })* };
}
show_display!(u16, u32, u64, usize, bool);

/// Declares every setting once: [`PartialSettings`] (each key optional: the file's schema and the
/// flags) and [`Settings`] (each key set), with the merge, diff and copy code between them.
macro_rules! settings {
    ($( $(#[$meta:meta])* $name:ident : $ty:ty = $default:expr; )*) => {
        /// What one source says: the configuration file or the command line. Every key optional.
        #[derive(Clone, PartialEq, Debug, Default, Deserialize, clap::Args)]
        #[serde(deny_unknown_fields)]
        pub struct PartialSettings {
            $( $(#[$meta])* pub $name: Option<$ty>, )*
        }

        /// Effective settings of a daemon run.
        #[derive(Clone, PartialEq, Debug)]
        pub struct Settings {
            $( pub $name: $ty, )*
            /// Whether the socket group was given explicitly (then it must exist).
            pub socket_group_explicit: bool,
            /// `--duration` (command line only).
            pub duration: Option<Duration>,
            /// The configuration file read (`None`: `--config none`); `reload` reads it again.
            pub config_file: Option<PathBuf>,
            /// Where each key not at its default came from (errors name it).
            pub origins: BTreeMap<&'static str, Origin>,
        }

        impl PartialSettings {
            /// Every key, in declaration order.
            pub const KEYS: &'static [&'static str] = &[$(stringify!($name)),*];
        }

        impl Settings {
            /// Built-in defaults (host name from the system).
            pub fn defaults() -> Settings {
                Settings {
                    $( $name: $default, )*
                    socket_group_explicit: false,
                    duration: None,
                    config_file: None,
                    origins: BTreeMap::new(),
                }
            }

            /// Take every key `p` sets; `origin` says where it came from.
            fn apply(&mut self, p: &PartialSettings, origin: &dyn Fn(&'static str) -> Origin) {
                $( if let Some(v) = &p.$name {
                    self.$name = v.clone();
                    self.origins.insert(stringify!($name), origin(stringify!($name)));
                } )*
            }

            /// Keys whose value differs in `new`, in declaration order.
            pub fn changed(&self, new: &Settings) -> Vec<&'static str> {
                let mut out = Vec::new();
                $( if self.$name != new.$name { out.push(stringify!($name)); } )*
                out
            }

            /// `key`'s value as text (empty for an unknown key).
            pub fn show(&self, key: &str) -> String {
                match key {
                    $( stringify!($name) => ShowValue::show(&self.$name), )*
                    _ => String::new(),
                }
            }

            /// Take `key`'s value from `new`.
            pub fn take(&mut self, key: &str, new: &Settings) {
                match key {
                    $( stringify!($name) => self.$name = new.$name.clone(), )*
                    _ => {}
                }
                match new.origins.get_key_value(key) {
                    Some((&k, o)) => {
                        self.origins.insert(k, o.clone());
                    }
                    None => {
                        self.origins.remove(key);
                    }
                }
            }
        }
    };
}

settings! {
    /// Profile database directory (may be shared by many hosts, e.g. over NFS).
    #[arg(long, value_name = "DIR")]
    db: PathBuf = PathBuf::from(profile_format::DEFAULT_DB);
    /// Host-local spool directory holding increments not yet published; each host name's
    /// append-only log is in its own subdirectory, `<spool>/<host>/` [default: /run/dcpid/spool,
    /// a tmpfs under systemd: it survives a crash of dcpid, not a reboot, and costs no disk
    /// writes].
    #[arg(long, value_name = "DIR")]
    spool: PathBuf = PathBuf::from(DEFAULT_SPOOL);
    /// Host name used for this host's directory in the database; one running dcpid per host
    /// name and database (a lease in `<db>/leases/` enforces it) [default: the full system
    /// host name].
    #[arg(long, value_name = "NAME")]
    host: String = system_host_name();
    /// Events to sample: `auto` or a comma-separated list like `cycles,cpu-clock:1000000`.
    #[arg(short = 'e', long, value_name = "LIST")]
    #[serde(default, deserialize_with = "de_events")]
    events: String = "auto".into();
    /// Period randomization: periods are drawn from [P - P/2N, P + P/2N], centred on the
    /// nominal period P so that the mean rate is the one asked for [default: 16].
    #[arg(long, value_name = "N")]
    window_divisor: u64 = 16;
    /// Data pages of each per-CPU ring buffer (power of two) [default: 128; 1024 with
    /// `callchains = "dwarf"` or `"auto"`, whose samples carry `sample_user_stack` bytes each: 128
    /// pages held 62 of them, and the drain threads, woken at every half ring (32 times a second
    /// per CPU at 1 kHz), spent twice the CPU of a 1024-page ring (BENCHMARKS.md "Call stacks:
    /// auto, one stack in N")].
    #[arg(long, value_name = "N")]
    ring_pages: usize = 128;
    /// Each CPU re-arms its sampling periods once per window of this length, at a random
    /// instant of it (its only timed wake-up) [default: 1s; at most 1.4s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    redraw_interval: Duration = Duration::from_secs(1);
    /// How often increments are written to the spool; bounds what a crash loses. A flush
    /// also falls at every time-slice boundary (`slice_interval`), which it cuts at that
    /// instant, so slices stay exact whatever this is; each flush has a fixed cost (a third of
    /// dcpid's CPU at 1 kHz with 5 s: BENCHMARKS.md "Flushes at slice boundaries")
    /// [default: 15s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    flush_interval: Duration = Duration::from_secs(15);
    /// How often a timed flush takes the call stacks too (the flushes between leave them
    /// counted in memory; `dcpictl flush`, an epoch's end, a stop and a full stack table take
    /// them at once, and so does each flush for the processes that exited or changed their
    /// mappings). Stacks reach reports only when published (`publish_interval`), so this bounds
    /// only the stacks a crash loses; each take resolves every distinct stack again, the
    /// largest cost of a flush with call stacks on (BENCHMARKS.md "Call stacks, fp against
    /// `perf record -a -g`"). At most 1h; at most flush_interval: every flush [default: 1m].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    stack_flush_interval: Duration = Duration::from_secs(60);
    /// Each changed shared profile is rewritten at most this often, spread over the interval,
    /// and once published only after it has doubled or waited `publish_max_delay`; `dcpictl
    /// flush` publishes everything at once [default: 15m: reports are fresh without it, from
    /// the minute slices newer than each profile (FORMAT.md §7.3); measured, a third of the
    /// 5-minute republish's bytes written (BENCHMARKS.md "Time-slice segments")].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    publish_interval: Duration = Duration::from_secs(900);
    /// A published profile that has not doubled since it was last written waits at most this
    /// long before its new samples are published (a flush publishes them at once); a
    /// per-command, per-process or per-cgroup profile always waits this long (many small files:
    /// BENCHMARKS.md "Where dcpid's writes go"); set it to `publish_interval` to rewrite every
    /// changed profile at every turn [default: 30m].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    publish_max_delay: Duration = Duration::from_secs(1800);
    /// Bound on unwritten data held in memory while the disk fails; past it the oldest is
    /// dropped and counted [default: 256].
    #[arg(long = "max-memory", value_name = "MB")]
    max_memory_mb: u64 = 256;
    /// Start a new epoch this often, on the UTC boundaries that are whole multiples of the
    /// interval since the Unix epoch (`1d`: at 00:00 UTC), so that every host of a fleet
    /// rotates at the same instant into the same epoch name without talking to the others;
    /// `off` (or `0`) never rotates by itself. A whole number of seconds, at least 1s.
    /// `dcpictl epoch new` still starts one in between, without moving the schedule
    /// [default: 1d: bounds a service's history so that retention can expire it, as DCPI's
    /// daily epochs did, with one epoch directory per day].
    #[arg(long, value_name = "DUR", value_parser = parse_epoch_interval)]
    #[serde(default, deserialize_with = "de_epoch_interval")]
    epoch_interval: EpochInterval = EpochInterval::DEFAULT;
    /// Delete this host's epochs older than N days ... [default: 7]
    #[arg(long, value_name = "N")]
    retention_days: u32 = 7;
    /// ... but always keep the newest N epochs [default: 3].
    #[arg(long, value_name = "N")]
    retention_keep: usize = 3;
    /// Control socket [default: /run/dcpi/dcpid.sock].
    #[arg(long, value_name = "PATH")]
    socket: PathBuf = PathBuf::from(DEFAULT_SOCKET);
    /// Group allowed to use the control socket besides root [default: dcpi, if it exists];
    /// `--socket-group` without a NAME: root only.
    #[arg(long, value_name = "NAME")]
    socket_group: Option<String> = Some(DEFAULT_SOCKET_GROUP.into());
    /// Log filter: `error`, `warn`, `info`, `debug`, `trace` or a directive like
    /// `dcpid::store=debug` [default: info; -v is debug]. `DCPI_LOG` in the environment wins.
    #[arg(long, value_name = "LEVEL")]
    log_level: String = "info".into();
    /// Bytes read from one JIT perf map (`/tmp/perf-PID.map`, written by the process) at most;
    /// a longer map is cut at a line and counted in status [default: 16777216].
    #[arg(long, value_name = "BYTES")]
    perf_map_max_bytes: u64 = MAX_JIT_MAP_BYTES;
    /// Symbols kept from one JIT perf map at most (the first ones in the file); more are
    /// counted in status [default: 100000].
    #[arg(long, value_name = "N")]
    perf_map_max_entries: usize = MAX_JIT_MAP_ENTRIES;
    /// How often the one-line status for systemd (`STATUS=`, shown by `systemctl status`) is
    /// refreshed (under systemd only) [default: 10s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    status_interval: Duration = Duration::from_secs(10);
    /// Keep one row per process (pid) in the who table, for `dcpiprof --by pid` (DCPI's
    /// `-bypid`), and one profile per (image, event, process) beside the flat profiles, for
    /// `dcpiprof --pid N --by symbol`; costs a row per process instead of per command, and a
    /// profile file per process and image: for machines of long-running processes (one that
    /// starts processes all the time gets thousands of files a minute) [default: false].
    #[arg(long, value_name = "BOOL")]
    by_pid: bool = false;
    /// Keep one profile per (image, event, cgroup v2) beside the flat profiles, for `dcpiprof
    /// --cgroup PATH --by symbol`; costs a profile file per cgroup and image [default: false].
    #[arg(long, value_name = "BOOL")]
    by_cgroup: bool = false;
    /// Keep one profile per (image, event, command) beside the flat profiles, so that every
    /// profile report and export takes `--command NAME` (`dcpiprof --command postgres --by
    /// symbol`); the command is the process's comm, as in the who table. Costs a profile file
    /// per command and image: about 1.2 times the flat profiles' bytes, measured on a busy
    /// mix and on a build machine (BENCHMARKS.md "Per-command profiles") [default: true].
    #[arg(long, value_name = "BOOL")]
    by_command: bool = true;
    /// Call stacks: `none`, `fp` to sample each sample's call chain (kernel frames, and
    /// user frames through frame pointers: stacks of code built without them end after their
    /// first frame and are counted as truncated), or `dwarf` to copy `sample_user_stack`
    /// bytes of the user stack with each sample and unwind it in dcpid with the images'
    /// `.eh_frame`/`.debug_frame` (code without frame pointers, libc; costs more CPU per
    /// sample), or `auto`: the copy of `dwarf`, whose caller frames are stepped by frame pointer
    /// where their function keeps one (told once per image from its `.eh_frame`) and by CFI
    /// elsewhere (the stacks of `dwarf`, at less CPU for frame-pointer code), into `stacks.<event>.stk` beside the flat profiles, for `dcpiprof
    /// --callers/--callees` and stacks in folded, pprof and flame graph output [default: none].
    #[arg(long, value_name = "MODE")]
    callchains: String = "none".into();
    /// Deepest call chain recorded with `callchains = "fp"` or `"dwarf"`, in frames; deeper
    /// stacks are cut
    /// and counted as truncated. At most the kernel's
    /// /proc/sys/kernel/perf_event_max_stack (127 by default) [default: 64].
    #[arg(long, value_name = "N")]
    sample_max_stack: u16 = DEFAULT_MAX_STACK;
    /// Bytes of user stack the kernel copies with each sample for `callchains = "dwarf"`, a
    /// multiple of 8 from 512 to 65528; a stack deeper than the copy ends there and counts as
    /// truncated. The copy is unwound and dropped by dcpid, never written [default: 8192].
    #[arg(long, value_name = "BYTES")]
    sample_user_stack: u32 = DEFAULT_USER_STACK;
    /// Take the call stack of one sample in N, drawn at random per sample (1: every sample);
    /// each stack taken counts N samples, so that stack counts stay estimates of the samples
    /// (FORMAT.md §13) while dcpid unwinds N times fewer stacks. The flat profile keeps every
    /// sample and its randomized periods. From 1 to 1000 [default: 1].
    #[arg(long, value_name = "N")]
    stack_one_in: u32 = 1;
    /// Length of the time slices each host-epoch keeps its counts in (`slices.<hour>.log`, for
    /// reports over a time range), aligned to UTC; whole seconds dividing an hour; `0`: no
    /// slices, only epoch totals [default: 1m].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    slice_interval: Duration = Duration::from_secs(60);
    /// Slices that ended longer ago than this are rolled up into hour slices, so that storage
    /// stays bounded: the resolution of `slice_interval` is kept for this long [default: 6h].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    slice_rollup_after: Duration = Duration::from_secs(6 * 3600);
    /// Off-CPU time: for every thread that blocks (not preempted; never the idle task), the
    /// time until it runs again, with the stack at which it blocked, as the event `off-cpu`
    /// (counts in nanoseconds; `dcpiprof --event off-cpu`). What each blocking switch costs
    /// depends on `off_cpu_source`: with `bpf` (auto's first choice) map updates in the
    /// kernel (and two stack walks when `callchains` is on), no record and no user-space
    /// work; with the perf sources a sample with a call chain or two switch records. Off by
    /// default because a switch-heavy machine pays that on every switch (BENCHMARKS.md,
    /// "Off-CPU") [default: false].
    #[arg(long, value_name = "BOOL")]
    off_cpu: bool = false;
    /// Waits shorter than this are counted in the `off-cpu` profiles but given no stack
    /// (`0`: every wait keeps its stack) [default: 0].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    #[serde(default, deserialize_with = "de_duration")]
    off_cpu_threshold: Duration = Duration::ZERO;
    /// Which kernel events time the waits: `bpf` (a BPF program on sched_switch pairs the
    /// waits in the kernel and sums them per thread and stack: no record per switch; needs
    /// CAP_BPF and CAP_PERFMON, the kernel's BTF and Linux 5.18 or later), `tracepoint` (the
    /// sched:sched_switch tracepoint, filtered in the kernel: a record with a call chain only
    /// when a thread blocks, and perf's 32-byte switch records for when threads run again;
    /// needs tracefs mounted), `switch-records` (perf's context-switches event: a sample with
    /// a call chain and two records at every context switch, preemptions and the idle task
    /// included), or `auto`: the first of these that starts, with a warning saying why the
    /// others did not [default: auto].
    #[arg(long, value_name = "SOURCE")]
    off_cpu_source: String = "auto".into();
}

/// Keys a reload may change while dcpid runs; any other key that changes is reported as needing
/// a restart, and keeps its running value. The list lives in the protocol crate so that
/// dcpictl's `reload --help` prints the same one.
pub use dcpi_proto::RELOADABLE;

/// Where a setting's value came from.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Origin {
    /// A line of a configuration file (none when the line is unknown).
    File {
        path: PathBuf,
        line: Option<usize>,
    },
    CommandLine,
}

/// The configuration file as read: its settings and the line of each key.
#[derive(Clone, PartialEq, Debug, Default)]
pub struct FileConfig {
    pub settings: PartialSettings,
    /// Line (1-based) of each top-level key, from the spans toml keeps.
    pub key_lines: BTreeMap<String, usize>,
}

/// Every top-level key and value of a TOML document, with their spans.
type SpannedDoc = BTreeMap<Spanned<String>, Spanned<toml::Value>>;

impl FileConfig {
    /// Parse TOML text; `path` names the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let doc: SpannedDoc =
            toml::from_str(text).map_err(|e| parse_error(text, path, &e, None))?;
        let settings: PartialSettings =
            toml::from_str(text).map_err(|e| parse_error(text, path, &e, Some(&doc)))?;
        let key_lines =
            doc.keys().map(|k| (k.get_ref().clone(), line_col(text, k.span().start).0)).collect();
        Ok(Self { settings, key_lines })
    }

    /// Load `path`. When `explicit` is false (the default path) a missing file gives the empty
    /// configuration; when true it is an error.
    pub fn load(path: &Path, explicit: bool) -> Result<Self, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(Self::default()),
            Err(source) => Err(ConfigError::Read { path: path.to_path_buf(), source }),
        }
    }
}

/// A toml error at its line and column; a type error in a value also names the key, which
/// serde's message does not.
fn parse_error(text: &str, path: &Path, e: &TomlError, doc: Option<&SpannedDoc>) -> ConfigError {
    let at = e.span().map_or(0, |s| s.start);
    let (line, column) = line_col(text, at);
    let mut message = e.message().trim().to_string();
    // A syntax error such as a duplicate key spans the key itself: name it.
    let spanned = e.span().and_then(|s| text.get(s)).map(str::trim).filter(|t| {
        !t.is_empty() && t.len() <= 64 && t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
    });
    // A value the TOML parser itself refuses (an integer beyond i64) leaves no document to
    // look the key up in: take it from the line, `key = value`.
    let line_key = text
        .get(..at)
        .and_then(|before| {
            let start = before.rfind('\n').map_or(0, |i| i + 1);
            let line = text[start..].lines().next()?;
            let (k, _) = line.split_once('=')?;
            Some(k.trim())
        })
        .filter(|k| !k.is_empty() && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    let key = doc
        .and_then(|d| {
            d.iter()
                .find(|(k, v)| k.span().contains(&at) || v.span().contains(&at))
                .map(|(k, _)| k.get_ref().as_str())
        })
        .or(line_key)
        .or(spanned);
    if let Some(k) = key.filter(|k| !message.contains(*k)) {
        message = format!("`{k}`: {message}");
    }
    ConfigError::Parse { path: path.to_path_buf(), line, column, message }
}

/// 1-based line and column (in characters) of byte offset `at`.
fn line_col(text: &str, at: usize) -> (usize, usize) {
    let at = at.min(text.len());
    let before = text.get(..at).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let start = before.rfind('\n').map(|i| i + 1).unwrap_or(0);
    (line, before[start..].chars().count() + 1)
}

impl Settings {
    /// Defaults, then the file (if any), then the command line: each later source wins where it
    /// says something. Validated once, at the end; an error names where the bad value came from.
    pub fn merge(
        file: Option<(&FileConfig, &Path)>,
        cli: &PartialSettings,
    ) -> Result<Self, ConfigError> {
        let mut s = Self::defaults();
        if let Some((f, path)) = file {
            s.apply(&f.settings, &|key| Origin::File {
                path: path.to_path_buf(),
                line: f.key_lines.get(key).copied(),
            });
            s.config_file = Some(path.to_path_buf());
        }
        s.apply(cli, &|_| Origin::CommandLine);
        s.socket_group_explicit = s.origins.contains_key("socket_group");
        // A stack copy per sample fills a default ring 60 times faster (field docs).
        if matches!(s.callchains.as_str(), "dwarf" | "auto")
            && !s.origins.contains_key("ring_pages")
        {
            s.ring_pages = DWARF_RING_PAGES;
        }
        s.validate()?;
        Ok(s)
    }

    /// Check ranges; errors name the file and line, or the flag, the value came from.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field: &'static str, value: String, detail: &str| {
            let (origin, field) = match self.origins.get(field) {
                Some(Origin::File { path, line: Some(l) }) => {
                    (format!("{}:{l}", path.display()), format!("`{field}`"))
                }
                Some(Origin::File { path, line: None }) => {
                    (path.display().to_string(), format!("`{field}`"))
                }
                Some(Origin::CommandLine) => (COMMAND_LINE.to_string(), flag_for(field)),
                None => ("built-in default".to_string(), format!("`{field}`")),
            };
            ConfigError::Invalid { origin, field, value, detail: detail.into() }
        };
        if let Err(e) = profile_format::validate_host_name(&self.host) {
            return Err(bad("host", self.host.clone(), &e.to_string()));
        }
        if !matches!(self.callchains.as_str(), "none" | "fp" | "dwarf" | "auto") {
            return Err(bad(
                "callchains",
                self.callchains.clone(),
                "must be `none`, `fp` (frame pointers), `dwarf` (CFI unwinding of a stack copy) \
                 or `auto` (a stack copy, unwound by frame pointer where the image keeps them)",
            ));
        }
        if !(1..=1000).contains(&self.stack_one_in) {
            return Err(bad(
                "stack_one_in",
                self.stack_one_in.to_string(),
                "must be from 1 (every sample's stack) to 1000",
            ));
        }
        if Source::parse(&self.off_cpu_source).is_none() {
            return Err(bad(
                "off_cpu_source",
                self.off_cpu_source.clone(),
                "must be `auto`, `bpf` (in-kernel pairing on sched_switch), `tracepoint` (the \
                 sched:sched_switch tracepoint) or `switch-records` (perf's context-switches \
                 event)",
            ));
        }
        if !(512..=MAX_USER_STACK).contains(&self.sample_user_stack)
            || !self.sample_user_stack.is_multiple_of(8)
        {
            return Err(bad(
                "sample_user_stack",
                self.sample_user_stack.to_string(),
                "must be a multiple of 8 from 512 to 65528",
            ));
        }
        if self.sample_max_stack == 0
            || usize::from(self.sample_max_stack) > profile_format::MAX_STACK_DEPTH
        {
            return Err(bad(
                "sample_max_stack",
                self.sample_max_stack.to_string(),
                "must be between 1 and 1024",
            ));
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
        if self.redraw_interval < Duration::from_millis(10)
            || self.redraw_interval > MAX_REDRAW_INTERVAL
        {
            return Err(bad(
                "redraw_interval",
                show_duration(self.redraw_interval),
                "must be between 10ms and 1.4s (idle CPUs report only when they wake)",
            ));
        }
        if self.flush_interval < Duration::from_millis(10)
            || self.flush_interval > Duration::from_secs(3600)
        {
            return Err(bad(
                "flush_interval",
                show_duration(self.flush_interval),
                "must be between 10ms and 1h",
            ));
        }
        if self.stack_flush_interval > Duration::from_secs(3600) {
            return Err(bad(
                "stack_flush_interval",
                show_duration(self.stack_flush_interval),
                "must be at most 1h",
            ));
        }
        if self.publish_interval < self.flush_interval {
            return Err(bad(
                "publish_interval",
                show_duration(self.publish_interval),
                "must be at least flush_interval",
            ));
        }
        // 0 would make the main loop spin: it wakes at each status refresh.
        if self.status_interval < Duration::from_millis(100) {
            return Err(bad(
                "status_interval",
                show_duration(self.status_interval),
                "must be at least 100ms",
            ));
        }
        if !(4096..=1 << 30).contains(&self.perf_map_max_bytes) {
            return Err(bad(
                "perf_map_max_bytes",
                self.perf_map_max_bytes.to_string(),
                "must be between 4096 and 1073741824 (1 GiB)",
            ));
        }
        if !(1..=10_000_000).contains(&self.perf_map_max_entries) {
            return Err(bad(
                "perf_map_max_entries",
                self.perf_map_max_entries.to_string(),
                "must be between 1 and 10000000",
            ));
        }
        if let Some(d) = self.epoch_interval.get() {
            // Boundaries are whole UTC seconds, as epoch names are.
            if d < Duration::from_secs(1) || d.subsec_nanos() != 0 {
                return Err(bad(
                    "epoch_interval",
                    show_duration(d),
                    "must be a whole number of seconds, at least 1s (or `off`)",
                ));
            }
        }
        let iv = self.slice_interval;
        if !iv.is_zero()
            && (iv.subsec_nanos() != 0 || iv.as_secs() > 3600 || 3600 % iv.as_secs() != 0)
        {
            return Err(bad(
                "slice_interval",
                show_duration(iv),
                "must be 0 (off) or whole seconds that divide an hour (1s .. 1h, e.g. 10s, 1m, 5m)",
            ));
        }
        if self.slice_rollup_after < Duration::from_secs(3600) {
            return Err(bad(
                "slice_rollup_after",
                show_duration(self.slice_rollup_after),
                "must be at least 1h",
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
        if let Err(e) = perf::events::parse_event_list(&self.events) {
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

/// This machine's full host name (`uname -n`): not its first label, which `web1.dc1` and
/// `web1.dc2` share (two daemons writing one host directory lose samples). Its first label if
/// the full name is not a valid host name (longer than 64 bytes), `localhost` if neither is.
pub fn system_host_name() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    host_name_from(raw.trim())
}

fn host_name_from(full: &str) -> String {
    let first = full.split('.').next().unwrap_or("");
    [full, first]
        .into_iter()
        .find(|n| profile_format::validate_host_name(n).is_ok())
        .unwrap_or("localhost")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_host_name_is_the_full_name() {
        assert_eq!(host_name_from("web1.dc1"), "web1.dc1");
        assert_ne!(host_name_from("web1.dc1"), host_name_from("web1.dc2"));
        let long = format!("web1.{}", "a".repeat(70));
        assert_eq!(host_name_from(&long), "web1");
        assert_eq!(host_name_from(""), "localhost");
        assert_eq!(host_name_from(".hidden"), "localhost");
    }

    fn file(text: &str) -> Result<Settings, ConfigError> {
        let p = Path::new("/etc/dcpi/l.toml");
        let f = FileConfig::parse(text, p)?;
        let cli = PartialSettings { host: Some("h".into()), ..Default::default() };
        Settings::merge(Some((&f, p)), &cli)
    }

    /// The shipped configuration (systemd/dcpid.toml) sets each key it sets to its default,
    /// but for the paths the unit gives it: the defaults are what BENCHMARKS.md measures, so
    /// a packaged file that differs (it said `publish_interval = "5m"` after the default became
    /// 15 minutes) would make those figures say nothing of the service.
    #[test]
    fn the_shipped_configuration_states_the_defaults() {
        let shipped = file(include_str!("../../systemd/dcpid.toml")).expect("shipped config");
        let mut defaults = Settings::defaults();
        defaults.host = "h".into();
        let differ: Vec<_> = defaults
            .changed(&shipped)
            .into_iter()
            .filter(|k| !["db", "spool", "socket"].contains(k))
            .map(|k| format!("{k}: default {}, shipped {}", defaults.show(k), shipped.show(k)))
            .collect();
        assert!(differ.is_empty(), "systemd/dcpid.toml differs from the defaults: {differ:?}");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("7").unwrap(), Duration::from_secs(7));
        assert_eq!(parse_duration("90min").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse_duration("7d").unwrap(), Duration::from_secs(7 * 86400));
        assert!(parse_duration("").is_err());
        assert!(parse_duration("s").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert!(parse_duration("12x").unwrap_err().contains("unknown time unit"));
        // Bounded: never a panic or an overflowing deadline.
        for huge in [
            "18446744073709551615",
            "18446744073709551616",
            "18446744073709551615s",
            "366d",
            "100000000000000000000000h",
        ] {
            let e = parse_duration(huge).unwrap_err();
            assert!(e.contains("too long") || e.contains("too large"), "{huge}: {e}");
        }
        assert_eq!(parse_duration("365d").unwrap(), MAX_DURATION);
    }

    #[test]
    fn file_fields_and_unknown_field() {
        let p = Path::new("/etc/dcpi/test.toml");
        let f = FileConfig::parse(
            "db = \"/x\"\nevents = [\"cycles\", \"cpu-clock:1000000\"]\nflush_interval = \"3s\"\n",
            p,
        )
        .unwrap();
        assert_eq!(f.settings.events.as_deref(), Some("cycles,cpu-clock:1000000"));
        assert_eq!(f.settings.flush_interval, Some(Duration::from_secs(3)));
        assert_eq!(f.key_lines.get("flush_interval"), Some(&3));
        let f2 = FileConfig::parse("events = \"auto\"\n", p).unwrap();
        assert_eq!(f2.settings.events.as_deref(), Some("auto"));
        let err = FileConfig::parse("flush_intreval = \"3s\"\n", p).unwrap_err().to_string();
        assert!(err.contains("test.toml") && err.contains("flush_intreval"), "{err}");
        let err = FileConfig::parse("ring_pages = \"many\"\n", p).unwrap_err().to_string();
        assert!(err.contains("test.toml") && err.contains("ring_pages"), "{err}");
    }

    #[test]
    fn defaults_then_file_then_command_line() {
        let p = Path::new("/etc/dcpi/test.toml");
        let f =
            FileConfig::parse("flush_interval = \"5s\"\nretention_keep = 5\nring_pages = 3\n", p)
                .unwrap();
        // The flag wins over the file's bad ring_pages: only the merged result is validated.
        let cli = PartialSettings {
            host: Some("h1".into()),
            flush_interval: Some(Duration::from_secs(1)),
            ring_pages: Some(64),
            ..Default::default()
        };
        let s = Settings::merge(Some((&f, p)), &cli).unwrap();
        assert_eq!(s.flush_interval, Duration::from_secs(1));
        assert_eq!(s.retention_keep, 5);
        assert_eq!(s.ring_pages, 64);
        assert_eq!(s.publish_interval, Duration::from_secs(900), "default");
        assert_eq!(s.config_file.as_deref(), Some(p));
        assert!(!s.socket_group_explicit);
        let d = Settings::defaults();
        assert_eq!(d.changed(&s), ["host", "ring_pages", "flush_interval", "retention_keep"]);
        assert_eq!(s.show("flush_interval"), "1s");
        let mut t = d.clone();
        t.take("retention_keep", &s);
        assert_eq!(t.retention_keep, 5);
        assert_eq!(t.origins.get("retention_keep"), s.origins.get("retention_keep"));
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
        let err = FileConfig::parse("db = \"/x\"\nring_pages = 1\nring_pages = 2\n", p)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/etc/dcpi/l.toml:3:1: ") && err.contains("`ring_pages`"), "{err}");
        // With two errors, the first in the file is reported.
        let err = FileConfig::parse("max_memory_mb = \"lots\"\nflush_intrval = \"1s\"\n", p)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("/etc/dcpi/l.toml:1:") && err.contains("max_memory_mb"), "{err}");
        let err = FileConfig::parse("db = [\n", p).unwrap_err().to_string();
        assert!(err.starts_with("/etc/dcpi/l.toml:"), "{err}");
        let err = FileConfig::parse("db = \"/x\"\nflush_interval = \"soon\"\n", p)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/etc/dcpi/l.toml:2:18: ") && err.contains("flush_interval"),
            "{err}"
        );
        let err = FileConfig::parse("publish_interval = \"18446744073709551615s\"\n", p)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("/etc/dcpi/l.toml:1:") && err.contains("publish_interval"),
            "{err}"
        );
        // Values that parse but are out of range name the key's line too.
        let err = file("host = \"h\"\n\n  ring_pages = 3\n").unwrap_err().to_string();
        assert!(err.starts_with("/etc/dcpi/l.toml:3: ") && err.contains("ring_pages"), "{err}");
        let err = file("events = [\"cpu-clock:0\"]\n").unwrap_err().to_string();
        assert!(err.starts_with("/etc/dcpi/l.toml:1: ") && err.contains("cpu-clock:0"), "{err}");
        let err = file("perf_map_max_entries = 0\n").unwrap_err().to_string();
        assert!(err.contains("perf_map_max_entries"), "{err}");
        let err = file("perf_map_max_bytes = 18446744073709551615\n").unwrap_err().to_string();
        assert!(err.contains("perf_map_max_bytes"), "{err}");
        let err = file("status_interval = \"0s\"\n").unwrap_err().to_string();
        assert!(
            err.starts_with("/etc/dcpi/l.toml:1: ") && err.contains("status_interval"),
            "{err}"
        );
        let err = file("log_level = \"loud[\"\n").unwrap_err().to_string();
        assert!(err.contains("log_level"), "{err}");
        let err = file("callchains = \"lbr\"\n").unwrap_err().to_string();
        assert!(err.starts_with("/etc/dcpi/l.toml:1: ") && err.contains("callchains"), "{err}");
        let err = file("sample_max_stack = 0\n").unwrap_err().to_string();
        assert!(err.contains("sample_max_stack"), "{err}");
        let ok = file("callchains = \"fp\"\nsample_max_stack = 127\n").expect("valid");
        assert_eq!((ok.callchains.as_str(), ok.sample_max_stack), ("fp", 127));
        let ok = file("callchains = \"dwarf\"\nsample_user_stack = 16384\n").expect("valid");
        assert_eq!((ok.callchains.as_str(), ok.sample_user_stack), ("dwarf", 16384));
        let ok = file("callchains = \"auto\"\nstack_one_in = 4\n").expect("valid");
        assert_eq!((ok.callchains.as_str(), ok.stack_one_in), ("auto", 4));
        // A stack copy per sample takes a larger ring, unless one is set.
        assert_eq!(ok.ring_pages, DWARF_RING_PAGES);
        let ok = file("callchains = \"dwarf\"\nring_pages = 256\n").expect("valid");
        assert_eq!(ok.ring_pages, 256);
        assert_eq!(file("callchains = \"fp\"\n").expect("valid").ring_pages, 128);
        for bad in [0, 1001] {
            let err = file(&format!("stack_one_in = {bad}\n")).unwrap_err().to_string();
            assert!(err.contains("stack_one_in"), "{err}");
        }
        let ok = file("stack_flush_interval = \"5m\"\n").expect("valid");
        assert_eq!(ok.stack_flush_interval, Duration::from_secs(300));
        let err = file("stack_flush_interval = \"2h\"\n").unwrap_err().to_string();
        assert!(err.contains("stack_flush_interval") && err.contains("2h"), "{err}");
        for bad in ["100", "8193", "65536"] {
            let err = file(&format!("sample_user_stack = {bad}\n")).unwrap_err().to_string();
            assert!(err.contains("sample_user_stack") && err.contains(bad), "{err}");
        }
        for bad in ["7s", "1500ms", "2h"] {
            let err = file(&format!("slice_interval = \"{bad}\"\n")).unwrap_err().to_string();
            assert!(
                err.starts_with("/etc/dcpi/l.toml:1: ") && err.contains("slice_interval"),
                "{err}"
            );
        }
        let err = file("slice_rollup_after = \"10m\"\n").unwrap_err().to_string();
        assert!(err.contains("slice_rollup_after"), "{err}");
        let ok = file("slice_interval = \"0\"\nslice_rollup_after = \"1d\"\n").expect("valid");
        assert_eq!(ok.slice_interval, Duration::ZERO);
        let ok = file("slice_interval = \"10s\"\n").expect("valid");
        assert_eq!(ok.slice_interval, Duration::from_secs(10));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        // From the command line, the flag is named.
        let cli =
            PartialSettings { host: Some("h".into()), ring_pages: Some(3), ..Default::default() };
        let err = Settings::merge(None, &cli).unwrap_err().to_string();
        assert!(err.starts_with("command line") && err.contains("--ring-pages"), "{err}");
    }

    #[test]
    fn epoch_interval_values_and_errors() {
        assert_eq!(Settings::defaults().epoch_interval.get(), Some(Duration::from_secs(86_400)));
        assert_eq!(Settings::defaults().show("epoch_interval"), "1day");
        for (text, want) in [
            ("epoch_interval = \"1d\"\n", Some(86_400)),
            ("epoch_interval = \"2s\"\n", Some(2)),
            ("epoch_interval = \"1h 30m\"\n", Some(5400)),
            ("epoch_interval = \"30\"\n", Some(30)),
            ("epoch_interval = 45\n", Some(45)),
            ("epoch_interval = \"off\"\n", None),
            ("epoch_interval = \"OFF\"\n", None),
            ("epoch_interval = \"0\"\n", None),
            ("epoch_interval = \"0s\"\n", None),
            ("epoch_interval = 0\n", None),
        ] {
            let s = file(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(s.epoch_interval.get(), want.map(Duration::from_secs), "{text}");
        }
        assert_eq!(file("epoch_interval = \"off\"\n").unwrap().show("epoch_interval"), "off");
        for bad in [
            "epoch_interval = \"soon\"\n",
            "epoch_interval = \"-1s\"\n",
            "epoch_interval = -1\n",
            "epoch_interval = \"500ms\"\n",
            "epoch_interval = \"1500ms\"\n",
            "epoch_interval = \"366d\"\n",
            "epoch_interval = 1.5\n",
            "epoch_interval = true\n",
        ] {
            let err = file(bad).unwrap_err().to_string();
            assert!(
                err.starts_with("/etc/dcpi/l.toml:1") && err.contains("epoch_interval"),
                "{bad}: {err}"
            );
        }
        // From the command line, the flag is named.
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            s: PartialSettings,
        }
        let t = T::try_parse_from(["t", "--epoch-interval", "off"]).unwrap();
        assert_eq!(t.s.epoch_interval, Some(EpochInterval::OFF));
        let err = T::try_parse_from(["t", "--epoch-interval=-5s"]).err().unwrap().to_string();
        assert!(err.contains("--epoch-interval"), "{err}");
        let cli = PartialSettings {
            host: Some("h".into()),
            epoch_interval: Some(EpochInterval(Duration::from_millis(100))),
            ..Default::default()
        };
        let err = Settings::merge(None, &cli).unwrap_err().to_string();
        assert!(err.starts_with("command line") && err.contains("--epoch-interval"), "{err}");
    }

    #[test]
    fn socket_group_from_flag_and_file() {
        use clap::Parser;
        #[derive(Parser)]
        struct T {
            #[command(flatten)]
            s: PartialSettings,
        }
        let t = T::try_parse_from(["t", "--socket-group", "wheel"]).unwrap();
        assert_eq!(t.s.socket_group, Some(Some("wheel".into())));
        let t = T::try_parse_from(["t", "--socket-group"]).unwrap();
        assert_eq!(t.s.socket_group, Some(None), "root only");
        let t = T::try_parse_from(["t"]).unwrap();
        assert_eq!(t.s.socket_group, None);
        let f = FileConfig::parse("socket_group = \"adm\"\n", Path::new("/x.toml")).unwrap();
        assert_eq!(f.settings.socket_group, Some(Some("adm".into())));
        let cli = PartialSettings { host: Some("h".into()), ..Default::default() };
        let s = Settings::merge(Some((&f, Path::new("/x.toml"))), &cli).unwrap();
        assert!(s.socket_group_explicit);
        assert_eq!(s.socket_group.as_deref(), Some("adm"));
    }

    #[test]
    fn missing_default_file_is_fine_explicit_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nope.toml");
        assert_eq!(FileConfig::load(&p, false).unwrap(), FileConfig::default());
        let err = FileConfig::load(&p, true).unwrap_err().to_string();
        assert!(err.contains("nope.toml"), "{err}");
    }

    #[test]
    fn every_reloadable_key_is_a_setting() {
        for k in RELOADABLE {
            assert!(PartialSettings::KEYS.contains(k), "{k}");
        }
    }
}
