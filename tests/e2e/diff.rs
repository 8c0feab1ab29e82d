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
            "--compare",
            "share",
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
    // work_b itself is flagged is not asserted: this compares shares (the phases run for a
    // CPU time, not a fixed work, in epochs of unequal length), and a 2-point wobble of an
    // unchanged function's share (seen in CI: 28.3 % -> 30.3 %, z 3.4) can be "significant".
    // The rate comparison's causality test is
    // dcpidiff_rates_flag_only_the_function_made_1_3x_slower.
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

/// The causality run of issue 39: three functions with the same loop body, each doing the same
/// FIXED work per round; rounds are paced (`per_tick` rounds every 10 ms, on an absolute
/// schedule that catches up when it falls behind), so each function's work per second is fixed
/// while the program keeps pace. SIGUSR1 makes `work_b` do 1.3x its iterations from then on;
/// SIGUSR2 makes it exit printing how far behind its schedule it ever was (ms). `probe N` runs
/// N rounds unpaced and prints their CPU nanoseconds per round.
const CAUSAL_C: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define BODY { unsigned long s = 0; for (unsigned long i = 0; i < n; i++) s += i * i ^ (s >> 3); return s; }
__attribute__((noipa, noinline)) unsigned long work_a(unsigned long n) BODY
__attribute__((noipa, noinline)) unsigned long work_b(unsigned long n) BODY
__attribute__((noipa, noinline)) unsigned long work_c(unsigned long n) BODY
static volatile sig_atomic_t slow = 0, stop = 0;
static void on_usr1(int s) { (void)s; slow = 1; }
static void on_usr2(int s) { (void)s; stop = 1; }
static volatile unsigned long sink = 0;
static void round1(void) {
  unsigned long n = 3000 + (sink & 1);
  sink += work_a(n);
  sink += work_b(slow ? n * 13 / 10 : n);
  sink += work_c(n);
}
int main(int argc, char **argv) {
  if (argc > 2 && strcmp(argv[1], "probe") == 0) {
    long rounds = atol(argv[2]);
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    for (long r = 0; r < rounds; r++) round1();
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    printf("%.0f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / rounds);
    return 0;
  }
  long per_tick = argc > 1 ? atol(argv[1]) : 1;
  signal(SIGUSR1, on_usr1);
  signal(SIGUSR2, on_usr2);
  struct timespec next, now;
  clock_gettime(CLOCK_MONOTONIC, &next);
  double lag = 0;
  while (!stop) {
    clock_gettime(CLOCK_MONOTONIC, &now);
    double late = (now.tv_sec - next.tv_sec) * 1e3 + (now.tv_nsec - next.tv_nsec) / 1e6;
    if (late > lag) lag = late;
    for (long r = 0; r < per_tick; r++) round1();
    next.tv_nsec += 10000000;
    if (next.tv_nsec >= 1000000000) { next.tv_sec++; next.tv_nsec -= 1000000000; }
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, NULL);
  }
  printf("%.0f\n", lag);
  return 0;
}
"#;

/// Issue 39's causality test: fixed work per second, one function made 1.3x slower between
/// two epochs. dcpidiff (rates by default) flags exactly that function, with a rate ratio
/// within 1.2-1.4; the two unchanged ones, whose samples per second did not move, are not
/// flagged (the share comparison flagged them: their shares fell as `work_b`'s rose).
///
/// Robust under load and to when the daemon cuts: the program runs through both epochs at a
/// fixed pace (8 % of a CPU, so two busy loops on both CPUs leave it plenty), so its
/// functions' samples per second of each epoch do not depend on how long the epoch lasted,
/// and `dcpictl epoch new` may cut a second late on a busy machine without moving them. (A
/// fixed amount of work run once inside each epoch would not do: its count is fixed, so its
/// rate moves with the epoch's length, which the cut's timing moves by up to a second under
/// load: measured 9.4 to 9.9 s for three 10 s windows at load 18. Such runs compare with
/// --compare samples.) A machine so busy that the program fell behind its pace by more than
/// half a second (measured: at load 19 on 2 CPUs a 20 % pace could not be kept) skips the test:
/// its rates then follow the CPU it was given, not its work.
#[dcpi_testkit::test(perf)]
#[ignore = "issue 39: in CI's fresh run beside other e2e tests an unchanged paced function's rate rose 1.14x (z 4.4): samples per fixed work follow the CPU's speed under contention; the statistics are tested by dcpidiff::rates_flag_only_the_function_that_got_slower"]
fn dcpidiff_rates_flag_only_the_function_made_1_3x_slower() {
    let sb = Sandbox::new();
    let src = sb.dir.path().join("causal.c");
    std::fs::write(&src, CAUSAL_C).expect("write source");
    let bin = sb.dir.path().join("causal");
    let st = Command::new("cc")
        .args(["-O1", "-fno-inline", "-Wl,--build-id=sha1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    let probe = Command::new(&bin).args(["probe", "2000"]).output().expect("probe");
    let ns_per_round: f64 = ok_stdout(&probe, "probe").parse().expect("ns per round");
    // 8 % of a CPU: 0.8 ms of rounds per 10 ms tick; about 1600 samples per function and
    // epoch at 4 kHz, so the ratio's standard error is about 3 %.
    let per_tick = ((0.8e6 / ns_per_round.max(1.0)).round() as u64).max(1);
    let host = "e2e-causal";
    let mut d = sb.start_daemon(host, &["--events", "cpu-clock:250000", "--flush-interval", "1s"]);
    let prog = Command::new(&bin)
        .arg(per_tick.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run causal");
    let window = std::time::Duration::from_secs(15);
    let signal = |sig: &str| {
        let st = Command::new("kill").args([sig, &prog.id().to_string()]).status();
        assert!(st.as_ref().is_ok_and(std::process::ExitStatus::success), "kill {sig}: {st:?}");
    };
    std::thread::sleep(std::time::Duration::from_secs(1));
    let e1 = ok_stdout(&d.ctl(&["epoch", "new"]), "epoch new");
    let t0 = std::time::Instant::now();
    std::thread::sleep(window);
    // Slower from just before the cut: `epoch new` cuts when it gets the store, early in a
    // command that then publishes for a while (seconds on a busy machine), so this puts less
    // slow work in the wrong epoch than a signal after it returns.
    signal("-USR1");
    let e2 = ok_stdout(&d.ctl(&["epoch", "new"]), "epoch new");
    let w1 = t0.elapsed();
    let t1 = std::time::Instant::now();
    std::thread::sleep(window);
    let e3 = ok_stdout(&d.ctl(&["epoch", "new"]), "epoch new");
    let w2 = t1.elapsed();
    signal("-USR2");
    let out = prog.wait_with_output().expect("wait causal");
    let lag_ms: f64 = ok_stdout(&out, "causal").parse().expect("lag");
    assert!(e1 != e2 && e2 != e3, "{e1} {e2} {e3}");
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");
    eprintln!("the paced program was at most {lag_ms} ms behind");
    if lag_ms > 500.0 {
        dcpi_testkit::skip!(
            "the machine is too busy: the paced program fell {lag_ms} ms behind its schedule"
        );
    }
    eprintln!("{ns_per_round} ns per round, {per_tick} per tick; windows {w1:?} and {w2:?}");

    let db = sb.db().display().to_string();
    let cache = sb.dir.path().join("symbols.sqlite").display().to_string();
    let path = bin.display().to_string();
    let diff = |extra: &[&str]| -> serde_json::Value {
        let mut a = vec![
            "--db",
            &db,
            "--host",
            host,
            "--before",
            &e1,
            "--after",
            &e2,
            "--image",
            &path,
            "--symbol-cache",
            &cache,
            "--format",
            "json",
        ];
        a.extend_from_slice(extra);
        let text = ok_stdout(&run("dcpidiff", &a), "dcpidiff");
        serde_json::from_str(&text).expect("JSON diff")
    };
    let v = diff(&[]);
    assert_eq!(v["test"]["compare"], "rate", "{v:#}");
    // The sampled time of each epoch is its window, to within when the cuts happened (the
    // daemon reads the counters' times at each cut; it used to read them every 5 s, so an
    // epoch's time could be off by that much).
    eprintln!("sampled: {} s before, {} s after", v["before"]["seconds"], v["after"]["seconds"]);
    for (side, w) in [("before", w1), ("after", w2)] {
        let s = v[side]["seconds"].as_f64().unwrap_or(f64::NAN);
        let w = w.as_secs_f64();
        assert!((s - w).abs() <= 0.1 * w + 1.0, "{side}: {s} s sampled, window {w} s: {v:#}");
    }
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    for name in ["work_a", "work_b", "work_c"] {
        let r =
            rows.iter().find(|r| r["symbol"] == name).unwrap_or_else(|| panic!("no {name}: {v:#}"));
        eprintln!(
            "{name}: {} -> {} samples, {} -> {} /s, ratio {}, z {}, p_adj {}, significant {}",
            r["before"],
            r["after"],
            r["before_rate"],
            r["after_rate"],
            r["ratio"],
            r["z"],
            r["p_adjusted"],
            r["significant"]
        );
        let n = r["before"].as_u64().unwrap_or(0);
        assert!(n >= 1000, "{name}: too few samples for the bound ({n}): {v:#}");
    }
    let flagged: Vec<&serde_json::Value> =
        rows.iter().filter(|r| r["significant"] == true).collect();
    assert_eq!(flagged.len(), 1, "exactly one significant row: {v:#}");
    assert_eq!(flagged[0]["symbol"], "work_b", "{v:#}");
    let ratio = flagged[0]["ratio"].as_f64().unwrap_or(f64::NAN);
    assert!((1.2..=1.4).contains(&ratio), "rate ratio {ratio} not within 1.2-1.4: {v:#}");
}
