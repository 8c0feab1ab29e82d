//! End-to-end tests: who used the CPU (issue 16): the idle task, per-command, per-cgroup.

use std::time::{Duration, Instant};

use dcpi_e2e::{require_perf, Daemon, Sandbox};

/// `dcpictl flush`, then the per-image JSON report (with `extra` arguments), until `done`
/// accepts it or 60 s pass.
fn report_until(
    sb: &Sandbox,
    d: &Daemon,
    extra: &[&str],
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let f = d.ctl(&["flush"]);
        assert!(f.status.success(), "flush: {}", String::from_utf8_lossy(&f.stderr));
        let out = sb.prof(extra);
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
            if done(&v) {
                return v;
            }
            assert!(Instant::now() < deadline, "no {what} in 60 s: {v:#}");
        } else {
            assert!(
                Instant::now() < deadline,
                "no {what} in 60 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

fn row<'a>(v: &'a serde_json::Value, key: &str, name: &str) -> Option<&'a serde_json::Value> {
    v["rows"].as_array()?.iter().find(|r| r[key].as_str() == Some(name))
}

/// The idle task's samples are their own `[idle]` row (not the kernel's), the report says
/// that its percentages include idle, and `--no-idle` removes the row.
#[test]
fn idle_task_is_its_own_image_and_no_idle_removes_it() {
    if !require_perf() {
        return;
    }
    let sb = Sandbox::new();
    let host = "e2e-idle";
    let d = sb.start_daemon(host, &["--events", "cpu-clock:1000000", "--flush-interval", "1s"]);
    let json = ["--host", host, "--format", "json"];
    let v = report_until(&sb, &d, &json, "[idle] row", |v| {
        row(v, "image", "[idle]").is_some_and(|r| r["samples"].as_u64().unwrap_or(0) > 0)
    });
    let idle = row(&v, "image", "[idle]").expect("idle row");
    assert_eq!(idle["kind"], "kernel", "{idle:#}");
    assert_eq!(v["idle"]["included"], true, "{v:#}");
    let pct = idle["percent"].as_f64().expect("percent");
    assert!((v["idle"]["percent"].as_f64().expect("idle percent") - pct).abs() < 1e-6, "{v:#}");
    // Idle samples are not the kernel's: the kernel row (if any) holds the rest.
    if let Some(k) = row(&v, "image", "[kernel.kallsyms]") {
        assert_ne!(k["image_id"], idle["image_id"], "{v:#}");
    }

    let out = sb.prof(&["--host", host, "--format", "json", "--no-idle"]);
    assert!(out.status.success(), "--no-idle: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    assert!(row(&v, "image", "[idle]").is_none(), "--no-idle kept [idle]: {v:#}");
    assert_eq!(v["idle"]["included"], false, "{v:#}");

    let out = sb.prof(&["--host", host]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "table: {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("% include the idle task ([idle]"), "{text}");
    if pct >= 50.0 {
        assert!(text.contains("the machine was mostly idle"), "{text}");
    }
    let out = sb.prof(&["--host", host, "--no-idle"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("the idle task ([idle]) is left out"), "{text}");
    assert!(!text.lines().any(|l| !l.starts_with('#') && l.ends_with("[idle]")), "{text}");
}
