//! End-to-end tests: report.

use std::process::Command;

use dcpi_e2e::Sandbox;

/// A CPU-bound program with a known hot function, built with a build-id.
fn build_workload(dir: &std::path::Path) -> std::path::PathBuf {
    let src = dir.join("spinner.c");
    std::fs::write(
        &src,
        "#include <stdlib.h>\n#include <time.h>\n\
         __attribute__((noipa)) unsigned long spin_here(unsigned long n) {\n\
           unsigned long s = 0; for (unsigned long i = 0; i < n; i++) s += i * i ^ (s >> 3); return s; }\n\
         int main(int argc, char **argv) { double secs = argc > 1 ? atof(argv[1]) : 1.0;\n\
           struct timespec a, b; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a); unsigned long t = 0;\n\
           do { t += spin_here(1000000 + (t & 1)); clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b); }\n\
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

#[dcpi_testkit::test(perf)]
fn daemon_profile_is_reported_per_image_and_per_symbol() {
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

/// Three functions with the same loop body, called 5:3:2 times in small interleaved rounds
/// (a round is far shorter than the sampling period, so the timer's phase cannot favour one).
pub(crate) const PROPORTIONS_C: &str = r#"
#include <stdlib.h>
#include <time.h>
#define BODY { unsigned long s = 0; for (unsigned long i = 0; i < n; i++) s += i * i ^ (s >> 3); return s; }
__attribute__((noipa, noinline)) unsigned long work_five(unsigned long n) BODY
__attribute__((noipa, noinline)) unsigned long work_three(unsigned long n) BODY
__attribute__((noipa, noinline)) unsigned long work_two(unsigned long n) BODY
static const char order[10] = "5352535253";
int main(int argc, char **argv) {
  double secs = argc > 1 ? atof(argv[1]) : 1.0;
  struct timespec a, b; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
  volatile unsigned long sink = 0;
  do {
    for (int r = 0; r < 16; r++)
      for (int k = 0; k < 10; k++) {
        unsigned long n = 3000 + (sink & 1);
        sink += order[k] == '5' ? work_five(n) : order[k] == '3' ? work_three(n) : work_two(n);
      }
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
  } while ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9 < secs);
  return (int)(sink & 1);
}
"#;

#[dcpi_testkit::test(perf)]
fn per_function_shares_match_a_known_5_3_2_workload() {
    let sb = Sandbox::new();
    let bin = sb.compile_c("prop532", PROPORTIONS_C);
    let host = "e2e-report-532";
    // 4 kHz: ~14000 samples in 3.5 s, so binomial noise (~0.4 pp) is far below the 3 pp bound.
    let mut d = sb.start_daemon(host, &["--events", "cpu-clock:250000", "--flush-interval", "1s"]);
    let st = Command::new(&bin).arg("3.5").status().expect("run workload");
    assert!(st.success() || st.code() == Some(1), "workload failed: {st}");
    let fl = d.ctl(&["flush"]);
    assert!(fl.status.success(), "flush: {}", String::from_utf8_lossy(&fl.stderr));
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");

    let cache = sb.dir.path().join("symbols.sqlite").display().to_string();
    let path = bin.display().to_string();
    let out =
        sb.prof(&["--host", host, "--image", &path, "--format", "json", "--symbol-cache", &cache]);
    assert!(out.status.success(), "dcpiprof: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let events = |name: &str| -> f64 {
        v["rows"]
            .as_array()
            .and_then(|rows| rows.iter().find(|r| r["symbol"] == name))
            .and_then(|r| r["events"].as_f64())
            .unwrap_or_else(|| panic!("no row {name}: {v:#}"))
    };
    let (five, three, two) = (events("work_five"), events("work_three"), events("work_two"));
    let total = five + three + two;
    let samples: u64 = ["work_five", "work_three", "work_two"]
        .iter()
        .filter_map(|n| {
            v["rows"].as_array()?.iter().find(|r| r["symbol"] == *n)?["samples"].as_u64()
        })
        .sum();
    assert!(samples >= 2000, "too few samples for a 3 pp bound: {samples}: {v:#}");
    for (name, got, want) in
        [("work_five", five, 50.0), ("work_three", three, 30.0), ("work_two", two, 20.0)]
    {
        let share = got / total * 100.0;
        eprintln!("{name}: {share:.2}% (want {want}%)");
        assert!((share - want).abs() <= 3.0, "{name}: {share:.2}% vs {want}%: {v:#}");
    }
}

/// A Rust trait method whose name is mangled the legacy way (`_ZN50_$LT$traitburn..Xor$u20$as…`):
/// reported as perf reports it, and mangled with `--raw-names`.
const TRAITBURN_RS: &str = r#"
use std::time::{Duration, Instant};
pub trait Burn { fn burn(&self, n: u64) -> u64; }
pub struct Xor(pub u64);
impl Burn for Xor {
    #[inline(never)]
    fn burn(&self, n: u64) -> u64 { (0..n).fold(self.0, |a, i| a.rotate_left(5) ^ i) }
}
fn main() {
    let secs: f64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1.0);
    let x: Box<dyn Burn> = Box::new(Xor(std::env::args().count() as u64));
    let (start, mut acc) = (Instant::now(), 0u64);
    while start.elapsed() < Duration::from_secs_f64(secs) { acc ^= x.burn(std::hint::black_box(1 << 20)); }
    std::process::exit((acc & 1) as i32);
}
"#;

#[dcpi_testkit::test(perf)]
fn legacy_mangled_rust_trait_method_is_reported_as_perf_does() {
    let sb = Sandbox::new();
    let src = sb.dir.path().join("traitburn.rs");
    std::fs::write(&src, TRAITBURN_RS).expect("write source");
    let bin = sb.dir.path().join("traitburn");
    // Choosing legacy explicitly is an unstable option on stable toolchains.
    let o = Command::new("rustc")
        .env("RUSTC_BOOTSTRAP", "1")
        .args(["-Z", "unstable-options", "-C", "symbol-mangling-version=legacy"])
        .args(["-C", "opt-level=1", "-C", "link-arg=-Wl,--build-id=sha1", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("run rustc");
    assert!(o.status.success(), "rustc: {}", String::from_utf8_lossy(&o.stderr));
    let host = "e2e-traitburn";
    let mut d = sb.start_daemon(host, &["--events", "cpu-clock:1000000", "--flush-interval", "1s"]);
    let st = Command::new(&bin).arg("2").status().expect("run workload");
    assert!(st.success() || st.code() == Some(1), "workload failed: {st}");
    let fl = d.ctl(&["flush"]);
    assert!(fl.status.success(), "flush: {}", String::from_utf8_lossy(&fl.stderr));
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");

    let path = bin.display().to_string();
    let report = |extra: &[&str]| -> serde_json::Value {
        let mut args =
            vec!["--host", host, "--image", &path, "--format", "json", "--no-symbol-cache"];
        args.extend_from_slice(extra);
        let out = sb.prof(&args);
        assert!(out.status.success(), "dcpiprof: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON report")
    };
    let v = report(&[]);
    assert_eq!(v["rows"][0]["symbol"], "<traitburn::Xor as traitburn::Burn>::burn", "{v:#}");
    let v = report(&["--raw-names"]);
    let raw = v["rows"][0]["symbol"].as_str().unwrap_or_default();
    assert!(
        raw.starts_with("_ZN50_$LT$traitburn..Xor$u20$as$u20$traitburn..Burn$GT$4burn17h"),
        "{v:#}"
    );
}
