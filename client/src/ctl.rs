//! Talking to a running dcpid over its control socket (protocol: one JSON request line, one
//! JSON response line; see the daemon's `control` module).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
}

impl CtlError {
    /// Process exit code for this error (documented in `dcpictl --help`).
    pub fn exit_code(&self) -> u8 {
        match self {
            CtlError::Daemon(_) => 1,
            CtlError::NotRunning { .. } => 3,
            CtlError::Io { .. } | CtlError::Protocol { .. } => 4,
        }
    }
}

/// Send `{"cmd": cmd}` and return the `result` of a successful response.
pub fn request(socket: &Path, cmd: &str, timeout: Duration) -> Result<Value, CtlError> {
    let io = |what: &'static str| {
        move |source| CtlError::Io { socket: socket.to_path_buf(), what, source }
    };
    let mut s = UnixStream::connect(socket)
        .map_err(|source| CtlError::NotRunning { socket: socket.to_path_buf(), source })?;
    s.set_read_timeout(Some(timeout)).map_err(io("set timeout"))?;
    s.set_write_timeout(Some(Duration::from_secs(5))).map_err(io("set timeout"))?;
    let mut line = serde_json::json!({ "cmd": cmd }).to_string();
    line.push('\n');
    s.write_all(line.as_bytes()).map_err(io("send request"))?;
    let mut buf = Vec::new();
    let mut rd = BufReader::new(s).take(MAX_RESPONSE as u64);
    rd.read_until(b'\n', &mut buf).map_err(io("read response"))?;
    let v: Value = serde_json::from_slice(&buf)
        .map_err(|e| CtlError::Protocol { socket: socket.to_path_buf(), detail: e.to_string() })?;
    match v.get("ok").and_then(Value::as_bool) {
        Some(true) => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
        Some(false) => Err(CtlError::Daemon(
            v.get("error").and_then(Value::as_str).unwrap_or("unspecified error").to_string(),
        )),
        None => {
            Err(CtlError::Protocol { socket: socket.to_path_buf(), detail: "no `ok` field".into() })
        }
    }
}

fn u(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn f(v: &Value, k: &str) -> f64 {
    v.get(k).and_then(Value::as_f64).unwrap_or(0.0)
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or("-")
}

fn ago(unix_ms: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    format!("{:.1}s ago", now.saturating_sub(unix_ms) as f64 / 1000.0)
}

/// The human form of `status`.
pub fn render_status(v: &Value) -> String {
    let mut o = String::new();
    let store = v.get("store").cloned().unwrap_or(Value::Null);
    o += &format!(
        "dcpid {} (pid {}) on {}, up {:.0}s, database {}\n",
        s(v, "version"),
        u(v, "pid"),
        s(v, "host"),
        f(v, "uptime_s"),
        s(v, "db")
    );
    o += &format!("condition:  {}\n", s(v, "condition"));
    o += &format!("epoch:      {}\n", s(v, "epoch"));
    o += "\nEVENT                SOURCE     PERIOD WINDOW                 SAMPLES\n";
    for e in v.get("events").and_then(Value::as_array).into_iter().flatten() {
        let window = format!("[{}, {}]", u(e, "period_min"), u(e, "period_max"));
        o += &format!(
            "{:<20} {:<10} {:<24} {:>12}\n",
            s(e, "name"),
            s(e, "source"),
            window,
            u(e, "samples")
        );
    }
    o += "\nCPU  ONLINE     SAMPLES     LOST  THROTTLED  WAKEUPS/S  DRAIN MS/S  ERROR\n";
    for c in v.get("cpus").and_then(Value::as_array).into_iter().flatten() {
        o += &format!(
            "{:<4} {:<6} {:>11} {:>8} {:>10} {:>10.1} {:>11.3}  {}\n",
            u(c, "cpu"),
            if c.get("online").and_then(Value::as_bool).unwrap_or(false) { "yes" } else { "NO" },
            u(c, "samples"),
            u(c, "lost"),
            u(c, "throttled"),
            f(c, "wakeups_per_s"),
            f(c, "drain_cpu_ms_per_s"),
            c.get("error").and_then(Value::as_str).unwrap_or("")
        );
    }
    o += &format!("total{:>18} {:>8} {:>10}\n", u(v, "samples"), u(v, "lost"), u(v, "throttled"));
    let unk = v.get("unknown").cloned().unwrap_or(Value::Null);
    let reasons: Vec<String> = unk
        .get("by_reason")
        .and_then(Value::as_object)
        .map(|m| m.iter().map(|(k, n)| format!("{k} {}", n.as_u64().unwrap_or(0))).collect())
        .unwrap_or_default();
    o += &format!(
        "\nunknown:    {} ({:.2}%){}\n",
        u(&unk, "count"),
        f(&unk, "fraction") * 100.0,
        if reasons.is_empty() { String::new() } else { format!(": {}", reasons.join(", ")) }
    );
    let agg = v.get("aggregation").cloned().unwrap_or(Value::Null);
    o += &format!(
        "aggregation: {:.1} samples per entry ({} pending, {} late side-band)\n",
        f(&agg, "factor"),
        u(&agg, "pending"),
        u(&agg, "late_sideband")
    );
    let op = |k: &str| match store.get(k) {
        Some(x) if !x.is_null() => format!(
            "{} ({:.1} ms, {} items)",
            ago(u(x, "unix_ms")),
            f(x, "duration_ms"),
            u(x, "items")
        ),
        _ => "never".into(),
    };
    o += &format!("last flush:   {}\nlast publish: {}\n", op("last_flush"), op("last_publish"));
    o += &format!(
        "spool:      {} rows ({} bytes), {} profiles to publish, {} batches held in memory\n",
        u(&store, "spool_rows"),
        u(&store, "spool_bytes"),
        u(&store, "dirty_profiles"),
        u(&store, "pending_batches")
    );
    let d = v.get("daemon").cloned().unwrap_or(Value::Null);
    o += &format!(
        "daemon:     cpu {:.2}s user + {:.2}s sys, rss {} KiB\n",
        f(&d, "cpu_user_s"),
        f(&d, "cpu_sys_s"),
        u(&d, "rss_kib")
    );
    let r = v.get("rate").cloned().unwrap_or(Value::Null);
    o += &format!(
        "rate:       {:.0} samples/s over the last {:.1}s, {:.0}/s since start\n",
        f(&r, "samples_per_s_recent"),
        f(&r, "recent_window_s"),
        f(&r, "samples_per_s")
    );
    let ov = v.get("overhead").cloned().unwrap_or(Value::Null);
    o += &format!(
        "overhead:   daemon {:.2}% of one CPU ({:.2}% since start); sampling interrupts ~{:.2}% \
         of one CPU (estimate: {:.0} µs per sample); ~{:.2}% of the machine's {} CPUs\n",
        f(&ov, "daemon_cpu_pct_recent"),
        f(&ov, "daemon_cpu_pct"),
        f(&ov, "sampling_cpu_pct_estimate"),
        f(&ov, "sample_cost_us_estimate"),
        f(&ov, "machine_pct_estimate"),
        u(&ov, "ncpus")
    );
    o += &format!(
        "cost:       daemon {:.3} ms CPU per second, {:.0} ns per sample (recent window)\n",
        f(&ov, "daemon_cpu_ms_per_s"),
        f(&ov, "ns_per_sample")
    );
    let c = v.get("config").cloned().unwrap_or(Value::Null);
    o += &format!(
        "config:     {} | flush {}s, publish {}s, max memory {} MB, retention {} days (keep {})\n",
        c.get("file").and_then(Value::as_str).unwrap_or("(no file)"),
        f(&c, "flush_interval_s"),
        f(&c, "publish_interval_s"),
        u(&c, "max_memory_mb"),
        u(&c, "retention_days"),
        u(&c, "retention_keep")
    );
    if let Some(rl) = v.get("last_reload").filter(|x| !x.is_null()) {
        o += &format!(
            "last reload: {} ({}) {}\n",
            ago(u(rl, "unix_ms")),
            s(rl, "trigger"),
            reload_outcome(rl)
        );
    }
    o
}

/// One line for a reload result: what changed, what needs a restart, or why it was rejected.
pub fn reload_outcome(r: &Value) -> String {
    if r.get("ok").and_then(Value::as_bool) != Some(true) {
        return format!("rejected, running configuration kept: {}", s(r, "error"));
    }
    let list = |k: &str| -> Vec<String> {
        r.get(k)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default()
    };
    let applied = list("applied");
    let restart = list("restart_required");
    let mut out = if applied.is_empty() {
        "reloaded: nothing changed".to_string()
    } else {
        format!("reloaded: {}", applied.join("; "))
    };
    if !restart.is_empty() {
        out += &format!(
            "; needs a restart of dcpid to take effect (running values kept): {}",
            restart.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_running_names_socket() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("nope.sock");
        let e = request(&p, "status", Duration::from_secs(1)).unwrap_err();
        assert_eq!(e.exit_code(), 3);
        assert!(e.to_string().contains("nope.sock"), "{e}");
    }

    #[test]
    fn renders_status_fields() {
        let v = serde_json::json!({
            "version": "0.1.0", "pid": 7, "host": "h", "db": "/db", "uptime_s": 3.0,
            "condition": "ok", "epoch": "20260101T000000Z",
            "events": [{"name": "cpu-clock", "source": "software", "period_min": 938, "period_max": 1000, "samples": 5}],
            "cpus": [{"cpu": 0, "online": true, "samples": 5, "lost": 0, "throttled": 1, "error": null,
                "wakeups": 9, "wakeups_per_s": 1.5, "drain_cpu_ms_per_s": 0.042}],
            "samples": 5, "lost": 0, "throttled": 1,
            "unknown": {"count": 1, "fraction": 0.2, "by_reason": {"process-gone": 1}},
            "aggregation": {"factor": 2.5, "pending": 0, "late_sideband": 0},
            "store": {"last_flush": null, "spool_rows": 3},
            "daemon": {"cpu_user_s": 0.1, "cpu_sys_s": 0.2, "rss_kib": 1000},
            "rate": {"samples_per_s": 990.0, "samples_per_s_recent": 1994.6, "recent_window_s": 2.0},
            "overhead": {"daemon_cpu_pct": 0.5, "daemon_cpu_pct_recent": 0.25,
                "sample_cost_us_estimate": 20.0, "sampling_cpu_pct_estimate": 3.99,
                "ncpus": 2, "machine_pct_estimate": 2.12,
                "daemon_cpu_ms_per_s": 2.5, "ns_per_sample": 1253.0},
            "config": {"file": "/etc/dcpi/dcpid.toml", "flush_interval_s": 2.0},
            "last_reload": {"unix_ms": 1, "trigger": "SIGHUP", "ok": true,
                "applied": ["flush_interval: 2s -> 1s"], "restart_required": ["events"]}
        });
        let t = render_status(&v);
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
            "       1.5       0.042",
            "2.500 ms CPU per second, 1253 ns per sample",
            "/etc/dcpi/dcpid.toml",
            "flush_interval: 2s -> 1s",
            "restart of dcpid to take effect (running values kept): events",
        ] {
            assert!(t.contains(needle), "{needle} missing in:\n{t}");
        }
    }
}
