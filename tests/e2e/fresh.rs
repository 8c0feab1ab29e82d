//! Fresh by default (issue 36 item 6) at dcpid's default settings (1-minute slices, a
//! 5-minute publish interval): right after `dcpictl epoch new`, a plain `dcpiprof` shows what
//! was sampled since, within one slice, with no `dcpictl flush`, and exactly what the time
//! slices hold: the published profiles plus the slices after their freshness marks.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use dcpi_e2e::{compile_c, json, Sandbox};
use profile_format::{Database, HostDir};

/// A program that burns about a fifth of a CPU (2 ms of work, 8 ms asleep) until killed;
/// TAG makes the build distinct (its own build-id, hence its own image).
const DUTY_C: &str = r#"
#include <time.h>
volatile unsigned long sink = TAG;
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
int main(void) {
    struct timespec nap = { 0, 8000000 };
    for (;;) {
        double until = now() + 0.002;
        while (now() < until)
            for (int i = 0; i < 1000; i++) sink = sink * 6364136223846793005UL + i;
        nanosleep(&nap, 0);
    }
}
"#;

fn build(dir: &Path, tag: u32) -> PathBuf {
    let tag_flag = format!("-DTAG={tag}");
    compile_c(dir, &format!("duty{tag}"), DUTY_C, &["-O1", &tag_flag])
}

/// Killed when the test ends, however it ends.
struct Workload(Child);

impl Drop for Workload {
    fn drop(&mut self) {
        drop(self.0.kill());
        drop(self.0.wait());
    }
}

/// The host directory of the newest epoch.
fn newest_dir(db: &Path, host: &str) -> HostDir {
    let d = Database::open(db).expect("database");
    let e = d.epochs().expect("epochs").last().cloned().expect("an epoch");
    d.host_dir(&e, host).expect("host dir")
}

/// Samples of the image with build-id `hex` in the slices appended so far, and how many
/// slices hold some.
fn in_slices(hd: &HostDir, hex: &str) -> (u64, usize) {
    let Some(log) = hd.read_slices().expect("slices.log reads") else { return (0, 0) };
    let id = format!("b{hex}");
    let mut total = 0;
    let mut slices = 0;
    for s in &log.slices {
        let n: u64 = s
            .counts
            .iter()
            .filter(|(k, _)| k.image.as_ref().is_some_and(|i| i.to_text() == id))
            .flat_map(|(_, v)| v.iter().map(|(_, c)| *c))
            .sum();
        total += n;
        slices += usize::from(n > 0);
    }
    (total, slices)
}

/// The row of `image` in a plain per-image JSON report (every row: on a busy machine the
/// workload need not be among the top ones): (samples, build-id hex).
fn row_of(sb: &Sandbox, host: &str, image: &str) -> Option<(u64, String)> {
    let v = json(sb.prof(&["--host", host, "--limit", "0", "--format", "json"]));
    v["rows"].as_array()?.iter().find(|r| r["image"].as_str() == Some(image)).map(|r| {
        (r["samples"].as_u64().unwrap_or(0), r["build_id"].as_str().unwrap_or("").to_owned())
    })
}

/// The acceptance test of issue 36 item 6. A workload starts right after `epoch new` and
/// keeps running. A plain `dcpiprof` (no flush, default publish interval) must name it within
/// about one slice, and, once two of its slices are appended, must count exactly what the
/// slices hold: with the publish interval at 5 minutes, its profile (if published at all)
/// stops at the first freshness mark, so only the reader's merge of the newer slices gets
/// there (turned off, this fails: the report lags the slices by a whole slice or more).
#[dcpi_testkit::test(perf)]
fn right_after_epoch_new_a_plain_report_is_fresh_within_one_slice_without_a_flush() {
    let sb = Sandbox::new();
    let bin = build(sb.dir.path(), 36);
    let image = bin.display().to_string();
    let host = "h1";
    // Every setting at its default: 1-minute slices, 5-minute publish interval.
    let mut d = sb.start_daemon(host, &[]);
    let out = d.ctl(&["epoch", "new"]);
    assert!(out.status.success(), "epoch new: {}", String::from_utf8_lossy(&out.stderr));
    let hd = newest_dir(&sb.db(), host);
    let started = Instant::now();
    let _w = Workload(Command::new(&bin).spawn().expect("start the workload"));
    // Named within one slice (60 s) plus a flush, with a generous margin for a loaded machine.
    let deadline = started + Duration::from_secs(240);
    let hex = loop {
        if let Some((n, hex)) = row_of(&sb, host, &image) {
            if n > 0 {
                break hex;
            }
        }
        assert!(Instant::now() < deadline, "the workload never showed up without a flush");
        std::thread::sleep(Duration::from_millis(250));
    };
    let shown_after = started.elapsed();
    eprintln!("the workload was shown {shown_after:?} after it started");
    // Exact: once a second slice of it is appended, the report counts what the slices hold
    // (read before and after the report: a slice appended in between is allowed for).
    let deadline = Instant::now() + Duration::from_secs(300);
    let (before, n, after) = loop {
        let (before, slices) = in_slices(&hd, &hex);
        if slices >= 2 {
            let n = row_of(&sb, host, &image).map_or(0, |r| r.0);
            let (after, _) = in_slices(&hd, &hex);
            if before == after {
                break (before, n, after);
            }
        }
        assert!(Instant::now() < deadline, "two slices of the workload were never appended");
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(n, before, "report (no flush) vs the slices appended ({before}..{after})");
    assert!(before > 50, "the workload was sampled: {before}");
    // Within one slice: at most two slice boundaries (the slice it started in, and the next
    // if it started right at the end of one) plus the load margin.
    assert!(shown_after < Duration::from_secs(240), "shown after {shown_after:?}");
    let (st, err) = d.terminate();
    assert!(st.success(), "dcpid: {err}");
}
