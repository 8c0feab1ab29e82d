//! The control protocol between `dcpid` and `dcpictl`: one JSON request line in, one JSON
//! response line out, over the daemon's Unix socket.
//!
//! Requests: `{"cmd":"status"}`, `{"cmd":"flush"}`, `{"cmd":"epoch-new"}`,
//! `{"cmd":"epoch-show"}`, `{"cmd":"reload"}`. Responses: `{"ok":true,"result":...}` or
//! `{"ok":false,"error":"..."}`; the result of each request is typed here ([`StatusReport`],
//! [`FlushResult`], [`EpochResult`], [`ReloadReport`]). Both sides use these types, so a
//! renamed or removed field is a compile error rather than a silent 0 in `dcpictl`.
//!
//! On the wire, a field is required when read unless it is marked `#[serde(default)]`. The
//! fields so marked were added after the first version: a newer `dcpictl` still reads an older
//! `dcpid`'s answer, and an absent one reads as 0, empty or `None`. A required `Option` field
//! carries `deserialize_with = "Option::deserialize"`, which turns off serde's
//! missing-means-`None`: it is written as `null`, never left out. A [`Response`] leaves out
//! whichever of `result` and `error` does not apply.
#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

pub mod status;

use serde_json::value;
use serde_json::value::RawValue;
pub use status::*;

/// The configuration keys a `reload` (SIGHUP, `dcpictl reload`) applies while dcpid runs (their
/// consumers read the settings each time, or the service applies them: the socket group, the
/// log filter). Any other key that changes is reported in [`ReloadReport::restart_required`] and
/// keeps its running value. dcpid's configuration takes this list (`dcpid::config::RELOADABLE`),
/// and dcpictl's `reload --help`, dcpid.toml(5) and the README are generated from or tested
/// against it.
pub const RELOADABLE: &[&str] = &[
    "flush_interval",
    "stack_flush_interval",
    "publish_interval",
    "publish_max_delay",
    "max_memory_mb",
    "epoch_interval",
    "retention_days",
    "retention_keep",
    "socket_group",
    "log_level",
    "status_interval",
    "perf_map_max_bytes",
    "perf_map_max_entries",
    "by_pid",
    "by_cgroup",
    "by_command",
];

#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case")]
pub enum Request {
    Status,
    Flush,
    EpochNew,
    EpochShow,
    /// Re-read the configuration file, as on SIGHUP.
    Reload,
    /// The hottest (process, image, offset) of the last few seconds, from memory ([`TopResult`]).
    Top,
}

impl Request {
    /// Whether the request waits for disk work (flush, new epoch): clients give it longer.
    pub fn is_slow(self) -> bool {
        matches!(self, Self::Flush | Self::EpochNew)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    /// The result's JSON text, encoded once where it is made: through a `serde_json::Value`,
    /// `dcpictl top`'s 4 000 rows cost the daemon a map per row, built, written and freed at
    /// every request, ~35 % of its CPU time for a watching client (BENCHMARKS.md, "dcpictl
    /// top: where the daemon's time went").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Response {
    /// A success carrying `result` (any of this crate's result types).
    pub fn ok_with<T: Serialize + ?Sized>(result: &T) -> Self {
        match value::to_raw_value(result) {
            Ok(v) => Self::ok_raw(v),
            Err(e) => Self::err(format!("cannot encode the result: {e}")),
        }
    }

    /// A success whose result is already encoded (a cached answer sent again as it was).
    pub fn ok_raw(result: Box<value::RawValue>) -> Self {
        Self { ok: true, result: Some(result), error: None }
    }

    pub fn ok(result: serde_json::Value) -> Self {
        Self::ok_with(&result)
    }

    /// The result as a `serde_json::Value` (`Null` when there is none).
    pub fn result_value(&self) -> serde_json::Result<serde_json::Value> {
        match &self.result {
            Some(r) => serde_json::from_str(r.get()),
            None => Ok(serde_json::Value::Null),
        }
    }
    pub fn err(msg: impl Into<String>) -> Self {
        Self { ok: false, result: None, error: Some(msg.into()) }
    }
}

/// Result of `flush`.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct FlushResult {
    pub flushed: bool,
    /// The barrier's instant (`CLOCK_MONOTONIC` ns): every sample taken before it is flushed.
    pub until_ns: u64,
    /// CPUs whose drain thread did not read its ring up to the instant in time.
    pub unanswered_cpus: Vec<u32>,
}

/// Result of `top`: what ran over the last `window_ms`, hottest first.
///
/// Code rows (`rows`) are merged over the processes of one command: a function that runs in
/// four backends of one server is one row (issue 38), and the window's rows stay few however
/// many processes ran. `processes` gives each process's samples per image (no offsets), for
/// the per-process view.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct TopResult {
    pub window_ms: u64,
    /// Every sample of the window of the first event (the rows are the hottest part of it).
    pub samples: u64,
    pub rows: Vec<TopRow>,
    /// The events' names; a row's `event` indexes this list (empty from an older daemon: one
    /// event).
    #[serde(default)]
    pub events: Vec<String>,
    /// Samples of the window per event (as `events`).
    #[serde(default)]
    pub totals: Vec<u64>,
    /// The idle task's samples of the window per event (as `events`).
    #[serde(default)]
    pub idle: Vec<u64>,
    /// Samples per (process, image, event) of the window, hottest first.
    #[serde(default)]
    pub processes: Vec<TopProcess>,
}

/// One (command, image, offset, event) of [`TopResult`], merged over the command's processes.
/// Kernel code is one row per (kernel or module, offset) for every process together
/// (`command` empty): the daemon keeps kernel samples apart only per process, not per
/// process and address. The idle task is one row (`[idle]`, command `swapper`).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct TopRow {
    pub command: String,
    /// A process that ran the code (the hottest); 0 for kernel rows.
    pub pid: u32,
    /// Image path as profiles name it.
    pub image: String,
    /// The image's kind: `elf`, `kernel`, `module`, `vdso`, `anon`, `idle` (FORMAT.md §5.1).
    #[serde(default)]
    pub kind: String,
    /// GNU build-id (hex) of the image, when it has one.
    #[serde(deserialize_with = "Option::deserialize")]
    pub build_id: Option<String>,
    /// Offset of the sampled instructions in the image as FORMAT.md §5.1 defines it for its
    /// kind (symbolized by the client); `None` for the idle row.
    #[serde(deserialize_with = "Option::deserialize")]
    pub offset: Option<u64>,
    /// Index into [`TopResult::events`].
    #[serde(default)]
    pub event: u32,
    pub samples: u64,
}

/// Samples of one process in one image (`[kernel.kallsyms]`: all its kernel-mode samples).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct TopProcess {
    pub pid: u32,
    pub command: String,
    pub image: String,
    /// Index into [`TopResult::events`].
    pub event: u32,
    pub samples: u64,
}

/// Result of `epoch-show` and `epoch-new`: the current epoch id (`None` while the database is
/// not available).
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct EpochResult {
    #[serde(deserialize_with = "Option::deserialize")]
    pub epoch: Option<String>,
    /// `epoch-new`: the boundary instant (`CLOCK_MONOTONIC` ns); 0 for `epoch-show`.
    #[serde(default)]
    pub until_ns: u64,
    /// `epoch-new`: CPUs whose drain thread did not answer the barrier in time.
    #[serde(default)]
    pub unanswered_cpus: Vec<u32>,
}
