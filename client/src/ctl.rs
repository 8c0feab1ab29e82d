//! Talking to a running dcpid over its control socket (protocol: one JSON request line, one
//! JSON response line; the types are in [`dcpi_proto`], shared with the daemon).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dcpi_proto::{OpStat, ReloadReport, Request, Response, StatusReport};
use dcpi_report::escape;
use dcpi_report::render::{
    Align, Column, CsvCell, Kind, Output, Show, Style, Table, Value as CellValue,
};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Default control socket of dcpid.
pub const DEFAULT_SOCKET: &str = "/run/dcpi/dcpid.sock";

/// Largest response accepted (status of a machine with many CPUs is a few hundred KiB at most).
const MAX_RESPONSE: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("cannot connect to dcpid at {socket}: {source} (is dcpid running? use --socket to name another socket)")]
    NotRunning {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "permission denied on dcpid's control socket {}: {owner}; dcpictl must run as root{who}",
        socket.display()
    )]
    PermissionDenied {
        socket: PathBuf,
        /// Who owns it (`owner root, group dcpi, mode 0660`), or why that is unknown.
        owner: String,
        /// Who else may use it: the socket's group, which dcpid's `--socket-group` chose
        /// (`dcpi` by default), with how to join it.
        who: String,
    },
    #[error("{socket}: {what}: {source}")]
    Io {
        socket: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{socket}: malformed response from dcpid: {detail}")]
    Protocol { socket: PathBuf, detail: String },
    #[error("dcpid: {0}")]
    Daemon(String),
    /// A request the daemon's answer cannot satisfy (`top --event` of an event not sampled).
    #[error("{0}")]
    Usage(String),
}

impl CtlError {
    /// Process exit code for this error (documented in `dcpictl --help`).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Daemon(_) => 1,
            Self::Usage(_) => 2,
            Self::NotRunning { .. } | Self::PermissionDenied { .. } => 3,
            Self::Io { .. } | Self::Protocol { .. } => 4,
        }
    }
}

/// Send `req` and return the raw `result` of a successful response.
pub fn request_value(socket: &Path, req: Request, timeout: Duration) -> Result<Value, CtlError> {
    let io = |what: &'static str| {
        move |source| CtlError::Io { socket: socket.to_path_buf(), what, source }
    };
    let protocol = |detail: String| CtlError::Protocol { socket: socket.to_path_buf(), detail };
    let mut s = UnixStream::connect(socket).map_err(|source| {
        if source.kind() == std::io::ErrorKind::PermissionDenied {
            let (owner, who) = owner_of(socket);
            CtlError::PermissionDenied { socket: socket.to_path_buf(), owner, who }
        } else {
            CtlError::NotRunning { socket: socket.to_path_buf(), source }
        }
    })?;
    s.set_read_timeout(Some(timeout)).map_err(io("set timeout"))?;
    s.set_write_timeout(Some(Duration::from_secs(5))).map_err(io("set timeout"))?;
    let mut line = serde_json::to_string(&req).map_err(|e| protocol(e.to_string()))?;
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(io("send request"))?;
    let mut buf = Vec::new();
    let mut rd = BufReader::new(s).take(MAX_RESPONSE as u64);
    rd.read_until(b'\n', &mut buf).map_err(io("read response"))?;
    let r: Response = serde_json::from_slice(&buf).map_err(|e| protocol(e.to_string()))?;
    match &r {
        Response { ok: true, .. } => r.result_value().map_err(|e| protocol(e.to_string())),
        Response { ok: false, error, .. } => {
            Err(CtlError::Daemon(error.clone().unwrap_or_else(|| "unspecified error".to_owned())))
        }
    }
}

/// `owner USER, group GROUP, mode 0660` of `path`, for a permission error (a directory on the
/// way that cannot be searched is named instead), and who besides root may use it: the
/// socket's own group, which is dcpid's `--socket-group` (not always `dcpi`).
fn owner_of(path: &Path) -> (String, String) {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata(path) {
        Ok(m) => {
            let group = id_name("/etc/group", m.gid());
            let who = if m.gid() == 0 {
                ": dcpid was started without a socket group (its --socket-group or socket_group)"
                    .to_owned()
            } else {
                format!(
                    " or as a member of the socket's group `{group}` (e.g. `sudo usermod -aG \
                     {group} $USER`, then log in again)"
                )
            };
            let owner = format!(
                "owner {}, group {group}, mode {:04o}",
                id_name("/etc/passwd", m.uid()),
                m.mode() & 0o7777
            );
            (owner, who)
        }
        Err(e) => {
            let dir = path.parent().map_or_else(String::new, |d| format!(" {}", d.display()));
            (
                format!("its directory{dir} cannot be searched by this user ({e})"),
                " or as a member of dcpid's socket group (`dcpi` unless its --socket-group or \
                 socket_group names another)"
                    .to_owned(),
            )
        }
    }
}

/// The name of user or group `id` from `/etc/passwd` or `/etc/group` (`name:x:id:...`), or
/// the number when it is not listed there (e.g. it comes from a directory service).
fn id_name(file: &str, id: u32) -> String {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .find_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?;
            (f.nth(1)?.parse::<u32>().ok()? == id).then(|| name.to_owned())
        })
        .unwrap_or_else(|| id.to_string())
}

/// The typed result of `req` (see [`dcpi_proto`]); a field missing from the daemon's answer is
/// a protocol error naming it, never a default.
pub fn parse_result<T: DeserializeOwned>(
    socket: &Path,
    req: Request,
    v: Value,
) -> Result<T, CtlError> {
    serde_json::from_value(v).map_err(|e| CtlError::Protocol {
        socket: socket.to_path_buf(),
        detail: format!("{} result: {e}", serde_json::to_string(&req).unwrap_or_default()),
    })
}

/// Send `req` and return its typed result.
pub fn request<T: DeserializeOwned>(
    socket: &Path,
    req: Request,
    timeout: Duration,
) -> Result<T, CtlError> {
    let v = request_value(socket, req, timeout)?;
    parse_result(socket, req, v)
}

fn ago(unix_ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    format!("{:.1}s ago", now.saturating_sub(unix_ms) as f64 / 1000.0)
}

/// The tables of `status`: its events, and its CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusTable {
    Events,
    Cpus,
}

/// `status`'s events: one description for the text form and CSV (`--format csv --table
/// events`). The event's name is last, as names are in every report table (free width).
pub fn events_table(v: &StatusReport) -> Table {
    let mut t = Table::new();
    let samples = t.column(Column::new("SAMPLES", Kind::Count).csv("samples"));
    let window = t.column(Column::new("PERIOD WINDOW", Kind::Text).text_only());
    let min = t.column(Column::new("period_min", Kind::Count));
    let max = t.column(Column::new("period_max", Kind::Count));
    let source = t.column(Column::new("SOURCE", Kind::Text).csv("source"));
    let name = t.column(Column::new("EVENT", Kind::Text).csv("event"));
    t.text_columns(vec![samples, window, source, name]);
    for e in &v.events {
        let mut cells = t.blank();
        cells[samples] = e.samples.into();
        cells[window] = format!("[{}, {}]", e.period_min, e.period_max).into();
        cells[min] = e.period_min.into();
        cells[max] = e.period_max.into();
        cells[source] = e.source.as_str().into();
        cells[name] = e.name.as_str().into();
        t.row(cells);
    }
    t
}

/// `status`'s CPUs: one description for the text form and CSV (`--format csv --table cpus`);
/// the text form ends with the totals (not a CSV line: a sum of the rows).
pub fn cpus_table(v: &StatusReport) -> Table {
    let mut t = Table::new();
    let cpu = t.column(Column::new("CPU", Kind::Count).align(Align::Left).csv("cpu"));
    let online = t.column(Column::new("ONLINE", Kind::Text).csv("online"));
    let samples = t.column(Column::new("SAMPLES", Kind::Count).csv("samples"));
    let lost = t.column(Column::new("LOST", Kind::Count).csv("lost"));
    let throttled = t.column(Column::new("THROTTLED", Kind::Count).csv("throttled"));
    let wakeups = t.column(Column::new("WAKEUPS/S", Kind::Decimal(1)).csv("wakeups_per_s"));
    let drain = t.column(Column::new("DRAIN MS/S", Kind::Decimal(3)).csv("drain_cpu_ms_per_s"));
    let error = t.column(Column::new("ERROR", Kind::Text).csv("error"));
    for c in &v.cpus {
        let mut cells = t.blank();
        cells[cpu] = u64::from(c.cpu).into();
        // `NO` stands out in the table; CSV says the same in lower case.
        cells[online] = CellValue::Both {
            text: if c.online { "yes" } else { "NO" }.into(),
            csv: CsvCell::Text(if c.online { "yes" } else { "no" }.into()),
        }
        .into();
        cells[samples] = c.samples.into();
        cells[lost] = c.lost.into();
        cells[throttled] = c.throttled.into();
        cells[wakeups] = c.wakeups_per_s.into();
        cells[drain] = c.drain_cpu_ms_per_s.into();
        cells[error] = c.error.clone().into();
        t.row(cells);
    }
    let mut total = t.blank();
    total[cpu] = "total".into();
    total[samples] = v.samples.into();
    total[lost] = v.lost.into();
    total[throttled] = v.throttled.into();
    t.push(total, Show::Text);
    t
}

/// How the text form of `status` draws its tables: plain numbers (as the rest of it prints
/// them), no width limit (an error message is shown whole).
const STATUS_STYLE: Style = Style { human: false, width: Some(0) };

/// Write `status` in `form`: the text form, one of its tables as CSV, or the daemon's JSON
/// document `raw` as it came (checked against the protocol types by the caller).
pub fn write_status(
    out: &mut dyn Write,
    v: &StatusReport,
    raw: &Value,
    form: Output,
    table: StatusTable,
) -> std::io::Result<()> {
    match form {
        Output::Text => out.write_all(render_status(v).as_bytes()),
        Output::Csv | Output::Json => {
            let t = match table {
                StatusTable::Events => events_table(v),
                StatusTable::Cpus => cpus_table(v),
            };
            t.write(out, form, STATUS_STYLE, raw)
        }
    }
}

/// The human form of `status`.
pub fn render_status(v: &StatusReport) -> String {
    let mut o = String::new();
    let store = &v.store;
    o += &format!(
        "dcpid {} (pid {}) on {}, up {:.0}s, database {}\n",
        v.version, v.pid, v.host, v.uptime_s, v.db
    );
    o += &format!("condition:  {}\n", v.condition);
    o += &format!("epoch:      {}\n", v.epoch.as_deref().unwrap_or("-"));
    let head = std::mem::take(&mut o);
    let rt = &v.resolver_thread;
    if rt.running {
        // The drain threads hand side-band records and full overflow buffers to it.
        o += &format!(
            "resolver thread: {:.1} wake-ups/s, {:.3} ms CPU/s; {} side-band records applied, \
             {} overflow buffers resolved\n",
            rt.wakeups_per_s, rt.cpu_ms_per_s, rt.records_applied, rt.early_buffers
        );
    }
    let unk = &v.unknown;
    let reasons: Vec<String> = unk.by_reason.iter().map(|(k, n)| format!("{k} {n}")).collect();
    o += &format!(
        "\nunknown:    {} ({:.2}%){}\n",
        unk.count,
        unk.fraction * 100.0,
        if reasons.is_empty() { String::new() } else { format!(": {}", reasons.join(", ")) }
    );
    let agg = &v.aggregation;
    o += &format!(
        "aggregation: {:.1} samples per entry ({} pending, {} late side-band)\n",
        agg.factor, agg.pending, agg.late_sideband
    );
    let op = |x: &Option<OpStat>| match x {
        Some(x) => format!("{} ({:.1} ms, {} items)", ago(x.unix_ms), x.duration_ms, x.items),
        None => "never".into(),
    };
    o += &format!(
        "last flush:   {}\nlast publish: {}\n",
        op(&store.last_flush),
        op(&store.last_publish)
    );
    o += &format!(
        "spool:      {} rows ({} bytes), {} profiles to publish, {} batches held in memory\n",
        store.spool_rows, store.spool_bytes, store.dirty_profiles, store.pending_batches
    );
    let sy = &store.symbol_tables;
    if sy.offered > 0 {
        o += &format!(
            "symbols:    {} tables stored ({} bytes), {} present, {} skipped, {} queued; \
             worker {:.2}s CPU\n",
            sy.stored, sy.bytes, sy.present, sy.skipped, sy.queued, sy.cpu_s
        );
    }
    if store.corrupt_files_set_aside > 0 || store.spool_quarantined > 0 {
        o += &format!(
            "bad files:  {} set aside from the host directory{}, {} spool records quarantined\n",
            store.corrupt_files_set_aside,
            store.last_set_aside.as_ref().map(|l| format!(" (last: {l})")).unwrap_or_default(),
            store.spool_quarantined
        );
    }
    if store.newer_format_files > 0 {
        o += &format!(
            "newer files: {} profiles of a newer format left untouched, samples continued beside them{}\n",
            store.newer_format_files,
            store.last_newer_format.as_ref().map(|l| format!(" (last: {l})")).unwrap_or_default(),
        );
    }
    if let Some(since) = store.publish_stalled_since_unix_ms {
        o += &format!("publishing: STALLED since {} (the database is not answering)\n", ago(since));
    }
    match (&store.lease_file, &store.lease_lost_to) {
        (_, Some(owner)) => o += &format!("lease:      LOST to {owner}; not publishing\n"),
        (Some(f), None) => {
            o += &format!("lease:      {f}, renewed {}\n", ago(store.lease_renewed_unix_ms))
        }
        (None, None) => {}
    }
    let d = &v.daemon;
    o += &format!(
        "daemon:     cpu {:.2}s user + {:.2}s sys, rss {} KiB\n",
        d.cpu_user_s, d.cpu_sys_s, d.rss_kib
    );
    let r = &v.rate;
    o += &format!(
        "rate:       {:.0} samples/s over the last {:.1}s, {:.0}/s since start\n",
        r.samples_per_s_recent, r.recent_window_s, r.samples_per_s
    );
    let ov = &v.overhead;
    o += &format!(
        "overhead:   daemon {:.2}% of one CPU ({:.2}% since start); sampling interrupts ~{:.2}% \
         of one CPU (estimate: {:.0} µs per sample); ~{:.2}% of the machine's {} CPUs\n",
        ov.daemon_cpu_pct_recent,
        ov.daemon_cpu_pct,
        ov.sampling_cpu_pct_estimate,
        ov.sample_cost_us_estimate,
        ov.machine_pct_estimate,
        ov.ncpus
    );
    o += &format!(
        "cost:       daemon {:.3} ms CPU per second, {:.0} ns per sample (recent window)\n",
        ov.daemon_cpu_ms_per_s, ov.ns_per_sample
    );
    let st = &ov.stage_cpu_s;
    // Since start, per second: the stage counters are totals, and the split only means
    // something over a long window.
    let per_s = |x: f64| if v.uptime_s > 0.0 { x * 1e3 / v.uptime_s } else { 0.0 };
    let drain_rest = st.drain - st.drain_parse - st.drain_aggregate - st.drain_rearm;
    o += &format!(
        "stages:     ms CPU per second since start; drain threads {:.3} (parse {:.3}, aggregate \
         {:.3}, re-arm {:.3}, wake-ups and the rest {:.3})\n            flush thread: take and \
         resolve {:.3}, store {:.3} (spool {:.3}, publish {:.3}), checks {:.3}; resolver thread \
         {:.3}\n",
        per_s(st.drain),
        per_s(st.drain_parse),
        per_s(st.drain_aggregate),
        per_s(st.drain_rearm),
        per_s(drain_rest.max(0.0)),
        per_s(st.flush_resolve),
        per_s(st.flush_store),
        per_s(st.flush_spool),
        per_s(st.flush_publish),
        per_s(st.flush_checks),
        per_s(st.resolver_thread)
    );
    let c = &v.config;
    o += &format!(
        "config:     {} | flush {}s, publish {}s, max memory {} MB, retention {} days (keep {})\n",
        c.file.as_deref().unwrap_or("(no file)"),
        c.flush_interval_s,
        c.publish_interval_s,
        c.max_memory_mb,
        c.retention_days,
        c.retention_keep
    );
    if let Some(s) = &v.stacks {
        let per: Vec<String> = s.distinct_per_cpu.iter().map(u64::to_string).collect();
        o += &format!(
            "stacks:     {} recorded, {} truncated, {} lost to full tables; distinct per CPU \
             [{}] (of {}), max depth {}; {} early flushes\n",
            s.recorded,
            s.truncated,
            s.overflow,
            per.join(", "),
            s.capacity_per_cpu,
            s.max_stack,
            s.early_flushes
        );
        if s.one_in > 1 {
            o += &format!(
                "            one stack in {} taken (each counts {}): {} samples skipped\n",
                s.one_in, s.one_in, s.skipped
            );
        }
        if let Some(d) = &s.dwarf {
            o += &format!(
                "dwarf:      {} unwound ({} through frame pointers: tables not loaded yet), {} \
                 truncated ({} at the stack copy's end, {} at the depth bound), {:.1} ms \
                 unwinding; loader {}: {} processes loaded, {} queued, {} failed loads; tables \
                 {} KiB of {} KiB, {} images\n",
                d.unwound,
                d.fp_fallback,
                d.truncated,
                d.truncated_copy_end,
                d.truncated_depth,
                d.unwind_ms,
                if d.loader_running {
                    "running"
                } else {
                    "NOT RUNNING (processes not loaded unwind through frame pointers)"
                },
                d.procs_loaded,
                d.loader_queue,
                d.load_panics,
                d.tables_bytes / 1024,
                d.tables_limit_bytes / 1024,
                d.images
            );
            if d.auto {
                o += &format!(
                    "            auto: {} frames stepped by frame pointer (images that keep them)\n",
                    d.fp_steps
                );
            }
        }
    }
    if let Some(f) = &v.off_cpu {
        o += &format!(
            "off-cpu:    ({}) {:.0} switches/s, {:.0} waits/s, {:.2} s off CPU per s; {} waits \
             without stack, {} lost, {} unpaired, {} threads off CPU now; own cost {:.2} ms/s \
             ({:.0} ns per switch) at nice {} ({} raises)\n",
            if f.source.is_empty() { "?" } else { f.source.as_str() },
            f.switches_per_s,
            f.waits_per_s,
            f.off_cpu_s_per_s,
            f.waits_without_stack,
            f.lost,
            f.unpaired,
            f.open,
            f.cpu_ms_per_s,
            f.ns_per_switch,
            f.nice,
            f.boosts
        );
    }
    if let Some(rl) = &v.last_reload {
        o += &format!("last reload: {} ({}) {}\n", ago(rl.unix_ms), rl.trigger, reload_outcome(rl));
    }
    if !v.failed_threads.is_empty() {
        o += "failed threads:\n";
        for t in &v.failed_threads {
            o += &format!("  {} ({}): {}\n", t.thread, ago(t.unix_ms), t.reason);
        }
    }
    // The tables escape their own cells.
    let mut tables = Vec::new();
    for t in [events_table(v), cpus_table(v)] {
        tables.push(b'\n');
        // Writing into memory cannot fail.
        drop(t.write_text(&mut tables, STATUS_STYLE));
    }
    format!("{}{}{}", escape_lines(&head), String::from_utf8_lossy(&tables), escape_lines(&o))
}

/// Errors carry file names and messages from the system: nothing reaches the terminal raw.
fn escape_lines(o: &str) -> String {
    o.split_inclusive('\n')
        .map(|l| {
            let (text, nl) = l.strip_suffix('\n').map_or((l, ""), |t| (t, "\n"));
            format!("{}{nl}", escape::terminal(text))
        })
        .collect()
}

/// Keys that `reload --help` names as needing a restart, as examples of "every other key" (the
/// test `reload_help_names_the_reloadable_keys` checks that none of them is reloadable).
const RESTART_EXAMPLES: &[&str] =
    &["db", "spool", "host", "events", "redraw_interval", "window_divisor", "ring_pages", "socket"];

/// The long help of `dcpictl reload`: the reloadable keys come from the protocol crate's list,
/// which dcpid's configuration uses, so the help cannot name a key that a reload does not apply.
pub fn reload_help() -> String {
    format!(
        "Re-read the configuration file, as on SIGHUP.\n\n\
         These keys change at once: {}. Every other key that changed ({}, ...) needs a restart: \
         the reload reports it and keeps the running value. A configuration with an error is \
         rejected (file, line, reason; exit status 1) and the running one stays.",
        dcpi_proto::RELOADABLE.join(", "),
        RESTART_EXAMPLES.join(", ")
    )
}

/// One line for a reload result: what changed, what needs a restart, or why it was rejected.
pub fn reload_outcome(r: &ReloadReport) -> String {
    if !r.ok {
        return format!(
            "rejected, running configuration kept: {}",
            r.error.as_deref().unwrap_or("-")
        );
    }
    let mut out = if r.applied.is_empty() {
        "reloaded: nothing changed".to_string()
    } else {
        format!("reloaded: {}", r.applied.join("; "))
    };
    if !r.restart_required.is_empty() {
        out += &format!(
            "; needs a restart of dcpid to take effect (running values kept): {}",
            r.restart_required.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reload_help_names_the_reloadable_keys() {
        let help = reload_help();
        let (at_once, other) = help.split_once("Every other key").expect(&help);
        for k in dcpi_proto::RELOADABLE {
            assert!(
                at_once.contains(&format!(" {k},")) || at_once.contains(&format!(" {k}.")),
                "{k}: {help}"
            );
        }
        for k in RESTART_EXAMPLES {
            assert!(!dcpi_proto::RELOADABLE.contains(k), "{k} is reloadable: {help}");
            assert!(other.contains(k), "{k}: {help}");
        }
        // The false claim this replaced: "intervals change at once"; redraw_interval does not.
        assert!(
            !at_once.contains("redraw_interval") && other.contains("redraw_interval"),
            "{help}"
        );
    }

    #[test]
    fn not_running_names_socket() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nope.sock");
        let e = request_value(&p, Request::Status, Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(e.to_string().contains("nope.sock"), "{e}");
    }

    fn sample_status() -> Value {
        let mut v = sample_status_base();
        // Beside the rest: one json! of it all passes the macro's recursion limit.
        v["stacks"]["dwarf"] = serde_json::json!({"unwound": 800, "fp_fallback": 12,
            "truncated": 5, "truncated_copy_end": 3, "truncated_depth": 1, "unwind_ms": 1.5,
            "procs_loaded": 9, "loader_queue": 1, "load_panics": 0, "loader_running": false,
            "tables_bytes": 2048, "tables_limit_bytes": 33554432, "images": 4});
        v
    }

    fn sample_status_base() -> Value {
        serde_json::json!({
            "version": "0.1.0", "pid": 7, "host": "h", "db": "/db", "uptime_s": 3.0,
            "condition": "ok", "epoch": "20260101T000000Z",
            "events": [{"name": "cpu-clock", "requested": "cpu-clock", "source": "software",
                "period_min": 938, "period_max": 1000, "samples": 5}],
            "cpus": [{"cpu": 0, "online": true, "samples": 5, "lost": 0, "throttled": 1, "error": null,
                "wakeups": 9, "wakeups_per_s": 1.5, "drain_cpu_ms_per_s": 0.042}],
            "samples": 5, "lost": 0, "throttled": 1,
            "unknown": {"count": 1, "fraction": 0.2, "by_reason": {"process-gone": 1}},
            "aggregation": {"samples_aggregated": 5, "entries_created": 2, "factor": 2.5,
                "pending": 0, "late_sideband": 0},
            "store": {"epoch": "20260101T000000Z", "last_flush": null, "last_publish": null,
                "spool_rows": 3, "spool_bytes": 10, "spool_quarantined": 0, "dirty_profiles": 1, "pending_batches": 0,
                "pending_bytes": 0, "max_memory_bytes": 1, "dropped_samples": 0,
                "dropped_batches": 0, "published_files": 0, "corrupt_files_set_aside": 0,
                "bytes_written": {"spool": 1, "profiles": 2, "summaries": 3, "kallsyms": 4},
                "db_error": null, "spool_error": null},
            "daemon": {"cpu_user_s": 0.1, "cpu_sys_s": 0.2, "rss_kib": 1000},
            "rate": {"samples_per_s": 990.0, "samples_per_s_recent": 1994.6, "recent_window_s": 2.0},
            "overhead": {"daemon_cpu_pct": 0.5, "daemon_cpu_pct_recent": 0.25,
                "sample_cost_us_estimate": 20.0, "sampling_cpu_pct_estimate": 3.99,
                "ncpus": 2, "machine_pct_estimate": 2.12,
                "daemon_cpu_ms_per_s": 2.5, "ns_per_sample": 1253.0,
                "stage_cpu_s": {"drain": 0.1, "drain_parse": 0.02, "drain_aggregate": 0.03,
                    "drain_rearm": 0.01, "flush_resolve": 0.2, "flush_store": 0.3,
                    "flush_spool": 0.1, "flush_publish": 0.15, "flush_checks": 0.05}},
            "config": {"file": "/etc/dcpi/dcpid.toml", "events": "cpu-clock", "window_divisor": 16,
                "ring_pages": 8, "redraw_interval_s": 1.0, "flush_interval_s": 2.0, "publish_interval_s": 60.0,
                "max_memory_mb": 64, "retention_days": 30, "retention_keep": 0,
                "socket": "/run/dcpi/dcpid.sock", "socket_group": null, "log_level": "info"},
            "last_reload": {"unix_ms": 1, "trigger": "SIGHUP", "ok": true, "error": null,
                "applied": ["flush_interval: 2s -> 1s"], "restart_required": ["events"]},
            "state": "ok", "failed_threads": [],
            "perf_maps": {"read": 2, "truncated": 0, "max_bytes": 16777216, "max_entries": 100000},
            "stacks": {"recorded": 900, "truncated": 7, "overflow": 3, "empty": 0,
                "distinct_per_cpu": [41, 17], "capacity_per_cpu": 65536, "max_stack": 127,
                "early_flushes": 4},
            "resolver_thread": {"running": true, "wakeups": 12, "wakeups_per_s": 0.5,
                "cpu_ms_per_s": 0.021, "records_applied": 340, "early_buffers": 2}
        })
    }

    #[test]
    fn renders_status_fields() {
        let p = Path::new("/x.sock");
        let v: StatusReport = parse_result(p, Request::Status, sample_status()).expect("typed");
        let mut v = v;
        v.condition = "disk \u{1b}[2J full".into();
        v.state = "degraded".into();
        v.failed_threads = vec![dcpi_proto::ThreadFailure {
            thread: "dcpid-flush".into(),
            reason: "panicked: boom".into(),
            unix_ms: 1,
        }];
        let t = render_status(&v);
        assert!(t.contains("disk \\u{1b}[2J full") && !t.contains('\u{1b}'), "{t}");
        assert!(t.contains("dcpid-flush") && t.contains("panicked: boom"), "{t}");
        for needle in [
            "cpu-clock",
            "software",
            "[938, 1000]",
            "20.00%",
            "process-gone 1",
            "3 rows",
            "never",
            "rss 1000 KiB",
            "1995 samples/s",
            "3.99% of one CPU",
            "20 µs per sample",
            "      1.5       0.042",
            "resolver thread: 0.5 wake-ups/s, 0.021 ms CPU/s; 340 side-band records applied, 2 \
             overflow buffers resolved",
            "2.500 ms CPU per second, 1253 ns per sample",
            "dwarf:      800 unwound (12 through frame pointers: tables not loaded yet), 5 \
             truncated (3 at the stack copy's end, 1 at the depth bound), 1.5 ms unwinding; \
             loader NOT RUNNING",
            "tables 2 KiB of 32768 KiB, 4 images",
            "drain threads 33.333 (parse 6.667, aggregate 10.000, re-arm 3.333, wake-ups and \
             the rest 13.333)",
            "take and resolve 66.667, store 100.000 (spool 33.333, publish 50.000), checks \
             16.667; resolver thread 0.000",
            "/etc/dcpi/dcpid.toml",
            "flush_interval: 2s -> 1s",
            "restart of dcpid to take effect (running values kept): events",
            "900 recorded, 7 truncated, 3 lost to full tables; distinct per CPU [41, 17] (of \
             65536), max depth 127; 4 early flushes",
        ] {
            assert!(t.contains(needle), "{needle} missing in:\n{t}");
        }
    }

    /// Status with two CPUs (one offline with an error from the system) and two events.
    fn two_cpu_status() -> (StatusReport, Value) {
        let mut raw = sample_status();
        raw["cpus"] = serde_json::json!([
            {"cpu": 0, "online": true, "samples": 5, "lost": 0, "throttled": 1, "error": null,
                "wakeups": 9, "wakeups_per_s": 1.5, "drain_cpu_ms_per_s": 0.042},
            {"cpu": 13, "online": false, "samples": 1234567, "lost": 12, "throttled": 0,
                "error": "=cmd|' /C calc'!A0, \u{1b}[2J", "wakeups": 0, "wakeups_per_s": 0.0,
                "drain_cpu_ms_per_s": 12.5}]);
        raw["samples"] = 1_234_572.into();
        raw["lost"] = 12.into();
        raw["events"] = serde_json::json!([
            {"name": "cpu-clock", "requested": "cpu-clock", "source": "software",
                "period_min": 938, "period_max": 1000, "samples": 5},
            {"name": "page-faults", "requested": "page-faults", "source": "software",
                "period_min": 1, "period_max": 1, "samples": 1234567}]);
        let v = parse_result(Path::new("/x.sock"), Request::Status, raw.clone()).expect("typed");
        (v, raw)
    }

    fn status_as(v: &StatusReport, raw: &Value, form: Output, table: StatusTable) -> String {
        let mut out = Vec::new();
        write_status(&mut out, v, raw, form, table).expect("write");
        String::from_utf8(out).expect("utf8")
    }

    #[test]
    fn status_tables_are_one_description_in_text_and_csv() {
        let (v, raw) = two_cpu_status();
        assert_eq!(
            status_as(&v, &raw, Output::Csv, StatusTable::Cpus),
            "cpu,online,samples,lost,throttled,wakeups_per_s,drain_cpu_ms_per_s,error\n\
             0,yes,5,0,1,1.5,0.042,\n\
             13,no,1234567,12,0,0,12.5,\"'=cmd|' /C calc'!A0, \\u{1b}[2J\"\n"
        );
        assert_eq!(
            status_as(&v, &raw, Output::Csv, StatusTable::Events),
            "samples,period_min,period_max,source,event\n\
             5,938,1000,software,cpu-clock\n\
             1234567,1,1,software,page-faults\n"
        );
        // JSON is the daemon's whole document, whichever table.
        let json = status_as(&v, &raw, Output::Json, StatusTable::Events);
        let back: Value = serde_json::from_str(&json).expect("json");
        assert_eq!(back, raw);
        // The text form draws the same tables, aligned: each number column ends where its
        // title does, whatever the width of the numbers (the fixed widths before were 11
        // digits for samples, 8 for losses).
        let text = status_as(&v, &raw, Output::Text, StatusTable::Cpus);
        assert_eq!(text, render_status(&v));
        assert!(!text.contains('\u{1b}'), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        let block = |title: &str| -> Vec<&str> {
            let i = lines.iter().position(|l| l.starts_with(title)).expect(title);
            lines[i..].iter().take_while(|l| !l.is_empty()).copied().collect()
        };
        let cpus = &block("CPU ")[..4];
        let end = |l: &str, col: &str| l.find(col).map(|i| i + col.len());
        let samples_end = end(cpus[0], "SAMPLES").expect("title");
        for (l, n) in cpus[1..].iter().zip(["5", "1234567", "1234572"]) {
            assert_eq!(end(l, &format!(" {n} ")), Some(samples_end + 1), "{l}\n{text}");
        }
        assert!(cpus[2].starts_with("13 ") && cpus[2].contains(" NO "), "{text}");
        assert!(cpus[2].ends_with("\\u{1b}[2J"), "escaped, whole: {text}");
        assert!(cpus[3].starts_with("total ") && cpus[3].ends_with(" 12          1"), "{text}");
        let events = block("SAMPLES ");
        assert_eq!(events.len(), 3, "{text}");
        let event_at = events[0].find("EVENT").expect("title");
        assert_eq!(events[1].find("cpu-clock"), Some(event_at), "{text}");
        assert_eq!(events[2].find("page-faults"), Some(event_at), "{text}");
        assert!(events[1].contains(" [938, 1000] "), "{text}");
    }

    #[test]
    fn a_missing_status_field_is_a_protocol_error_naming_it() {
        let p = Path::new("/x.sock");
        let mut v = sample_status();
        v["store"].as_object_mut().expect("store").remove("spool_rows");
        let e = parse_result::<StatusReport>(p, Request::Status, v).expect_err("must fail");
        assert_eq!(e.exit_code(), 4);
        assert!(e.to_string().contains("spool_rows"), "{e}");
        // An optional field is `null` when unset, never absent.
        let mut v = sample_status();
        v["store"].as_object_mut().expect("store").remove("db_error");
        let e = parse_result::<StatusReport>(p, Request::Status, v).expect_err("must fail");
        assert!(e.to_string().contains("db_error"), "{e}");
        let e = parse_result::<StatusReport>(p, Request::Status, serde_json::json!({}))
            .expect_err("must fail");
        assert!(e.to_string().contains("missing field"), "{e}");
    }

    #[test]
    fn typed_request_over_a_socket() {
        use std::os::unix::net::UnixListener;
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("d.sock");
        let l = UnixListener::bind(&sock).expect("bind");
        let server = std::thread::spawn(move || {
            for reply in [
                r#"{"ok":true,"result":{"epoch":"20260101T000000Z"}}"#,
                r#"{"ok":false,"error":"database not writable"}"#,
                r#"{"ok":true,"result":"20260101T000000Z"}"#,
            ] {
                let (s, _) = l.accept().expect("accept");
                let mut line = String::new();
                BufReader::new(&s).read_line(&mut line).expect("read");
                assert_eq!(line, "{\"cmd\":\"epoch-show\"}\n");
                (&s).write_all(format!("{reply}\n").as_bytes()).expect("write");
            }
        });
        let t = Duration::from_secs(30);
        let r: dcpi_proto::EpochResult = request(&sock, Request::EpochShow, t).expect("ok");
        assert_eq!(r.epoch.as_deref(), Some("20260101T000000Z"));
        let e = request::<dcpi_proto::EpochResult>(&sock, Request::EpochShow, t).unwrap_err();
        assert_eq!(e.exit_code(), 1);
        assert!(e.to_string().contains("not writable"), "{e}");
        let e = request::<dcpi_proto::EpochResult>(&sock, Request::EpochShow, t).unwrap_err();
        assert_eq!(e.exit_code(), 4);
        server.join().expect("server");
    }
}
