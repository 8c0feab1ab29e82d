//! End-to-end tests: report.

use std::process::Command;

use dcpi_e2e::{require_perf, Sandbox};

/// A CPU-bound program with a known hot function, built with a build-id.
fn build_workload(dir: &std::path::Path) -> std::path::PathBuf {
    let src = dir.join("spinner.c");
    std::fs::write(
        &src,
        "#include <stdlib.h>\n#include <time.h>\n\
         __attribute__((noipa)) unsigned long spin_here(unsigned long n) {\n\
           unsigned long s = 0; for (unsigned long i = 0; i < n; i++) s += i * i ^ (s >> 3); return s; }\n\
         int main(int argc, char **argv) { double secs = argc > 1 ? atof(argv[1]) : 1.0;\n\
           struct timespec a, b; clock_gettime(CLOCK_MONOTONIC, &a); unsigned long t = 0;\n\
           do { t += spin_here(1000000 + (t & 1)); clock_gettime(CLOCK_MONOTONIC, &b); }\n\
           while ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9 < secs);\n\
           return (int)(t & 1); }\n",
    )
    .expect("write workload source");
    let out = dir.join("spinner");
    let st = Command::new("cc")
        .args(["-O1", "-Wl,--build-id=sha1", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    out
}

#[test]
fn daemon_profile_is_reported_per_image_and_per_symbol() {
    if !require_perf() {
        return;
    }
    let sb = Sandbox::new();
    let bin = build_workload(sb.dir.path());
    let host = "e2e-report";
    let mut d = sb.start_daemon(
        host,
        &["--events", "cpu-clock:1000000", "--flush-interval", "1s", "--publish-interval", "1s"],
    );
    let st = Command::new(&bin).arg("2").status().expect("run workload");
    assert!(st.success() || st.code() == Some(1), "workload failed: {st}");
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");

    let path = bin.display().to_string();
    let out = sb.prof(&["--host", host, "--format", "json"]);
    assert!(out.status.success(), "dcpiprof: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let rows = v["rows"].as_array().expect("rows");
    let row = rows
        .iter()
        .find(|r| r["image"].as_str() == Some(path.as_str()))
        .unwrap_or_else(|| panic!("no row for {path}: {v:#}"));
    assert!(row["samples"].as_u64().unwrap_or(0) > 0);
    assert!(row["build_id"].is_string(), "{row:#}");

    let out = sb.prof(&["--host", host, "--image", "spinner", "--format", "json"]);
    assert!(out.status.success(), "dcpiprof: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let top = &v["rows"][0];
    assert_eq!(top["symbol"], "spin_here", "{v:#}");
    assert!(top["percent"].as_f64().unwrap_or(0.0) > 50.0, "{v:#}");
}
