//! End-to-end tests: dcpidiff on a real program profiled by dcpid, with `dcpictl epoch new`
//! between two phases whose per-function time changes from 50/30/20 to 20/30/50.

use std::process::Command;

use dcpi_e2e::{run, Sandbox};

/// Three functions with the same loop body, called in small interleaved rounds (far shorter
/// than the sampling period, so the timer's phase cannot favour one) in the proportions the
/// argument names: `a` = 5:3:2 (`work_a:work_b:work_c`), `b` = 2:3:5.
const PHASES_C: &str = r#"
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define BODY { unsigned long s = 0; for (unsigned long i = 0; i < n; i++) s += i * i ^ (s >> 3); return s; }
__attribute__((noipa, noinline)) unsigned long work_a(unsigned long n) BODY
__attribute__((noipa, noinline)) unsigned long work_b(unsigned long n) BODY
__attribute__((noipa, noinline)) unsigned long work_c(unsigned long n) BODY
int main(int argc, char **argv) {
  const char *order = argc > 1 && strcmp(argv[1], "b") == 0 ? "CBCACBCACB" : "ABACABACAB";
  double secs = argc > 2 ? atof(argv[2]) : 1.0;
  struct timespec t0, t1; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
  volatile unsigned long sink = 0;
  do {
    for (int r = 0; r < 16; r++)
      for (int k = 0; k < 10; k++) {
        unsigned long n = 3000 + (sink & 1);
        sink += order[k] == 'A' ? work_a(n) : order[k] == 'B' ? work_b(n) : work_c(n);
      }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
  } while ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9 < secs);
  return (int)(sink & 1);
}
"#;

fn ok_stdout(out: &std::process::Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

#[dcpi_testkit::test(perf)]
fn dcpidiff_finds_a_50_30_20_to_20_30_50_shift_between_two_epochs() {
    let sb = Sandbox::new();
    let src = sb.dir.path().join("phases.c");
    std::fs::write(&src, PHASES_C).expect("write source");
    let bin = sb.dir.path().join("phases");
    let st = Command::new("cc")
        .args(["-O1", "-fno-inline", "-Wl,--build-id=sha1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    let host = "e2e-diff";
    // 4 kHz: thousands of samples per phase even when the machine is shared.
    let mut d = sb.start_daemon(host, &["--events", "cpu-clock:250000", "--flush-interval", "1s"]);
    let before = ok_stdout(&d.ctl(&["epoch", "show"]), "epoch show");
    let st = Command::new(&bin).args(["a", "3"]).status().expect("run phase a");
    assert!(st.success() || st.code() == Some(1), "phase a failed: {st}");
    let after = ok_stdout(&d.ctl(&["epoch", "new"]), "epoch new");
    assert_ne!(before, after);
    let st = Command::new(&bin).args(["b", "3"]).status().expect("run phase b");
    assert!(st.success() || st.code() == Some(1), "phase b failed: {st}");
    ok_stdout(&d.ctl(&["flush"]), "flush");
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");

    let db = sb.db().display().to_string();
    let cache = sb.dir.path().join("symbols.sqlite").display().to_string();
    let path = bin.display().to_string();
    let out = run(
        "dcpidiff",
        &[
            "--db",
            &db,
            "--host",
            host,
            "--before",
            &before,
            "--after",
            &after,
            "--image",
            &path,
            "--symbol-cache",
            &cache,
            "--format",
            "json",
        ],
    );
    let text = ok_stdout(&out, "dcpidiff");
    let v: serde_json::Value = serde_json::from_str(&text).expect("JSON diff");
    for side in ["before", "after"] {
        let n = v[side]["total_samples"].as_u64().unwrap_or(0);
        assert!(n >= 1000, "too few samples {side} for a few-points bound: {n}: {v:#}");
    }
    let row = |name: &str| -> &serde_json::Value {
        v["rows"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["symbol"] == name))
            .unwrap_or_else(|| panic!("no row {name}: {v:#}"))
    };
    let mut z = Vec::new();
    for (name, want) in [("work_a", -30.0), ("work_b", 0.0), ("work_c", 30.0)] {
        let r = row(name);
        let delta = r["delta"].as_f64().unwrap_or(f64::NAN);
        eprintln!(
            "{name}: delta {delta:+.2} points (want {want:+}), z {}, significant {}",
            r["z"], r["significant"]
        );
        assert!((delta - want).abs() <= 5.0, "{name}: {delta} vs {want}: {v:#}");
        z.push(r["z"].as_f64().unwrap_or(f64::NAN).abs());
    }
    // The two real shifts are significant and stand far above the unchanged function. Whether
    // work_b itself is flagged is not asserted: dcpidiff's test is on shares of the whole
    // selection, so a 2-point wobble of an unchanged function's share (seen in CI: 28.3 % ->
    // 30.3 %, z 3.4) can be "significant". That false positive is issue 39's (diffs in rate,
    // not share), whose acceptance test will check it.
    for (name, i) in [("work_a", 0), ("work_c", 2)] {
        assert_eq!(row(name)["significant"], true, "{name}: {v:#}");
        assert!(
            z[i] > 3.0 * z[1],
            "{name}'s z {} does not stand above work_b's {}: {v:#}",
            z[i],
            z[1]
        );
    }
}
