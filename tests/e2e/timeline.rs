//! End-to-end test of the timeline (issue 36 item 4): a real daemon with one-second slices,
//! then `dcpiprof --by time` sums exactly to the epoch's flat profile total, at the stored
//! resolution and coarser, and still after its slices are rolled up to hour slices.

use std::time::{Duration, Instant};

use dcpi_e2e::{json, Sandbox};
use profile_format::{Database, SegmentWriter};

fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Slices in the database (every epoch of host h1).
fn slices(sb: &Sandbox) -> usize {
    let Ok(db) = Database::open(&sb.db()) else { return 0 };
    let epochs = db.epochs().unwrap_or_default();
    epochs
        .iter()
        .filter_map(|e| db.host_dir(e, "h1").ok())
        .filter_map(|hd| hd.read_slices().ok().flatten())
        .map(|l| l.slices.len())
        .sum()
}

fn sum(v: &serde_json::Value) -> u64 {
    v["rows"].as_array().expect("rows").iter().map(|r| r["samples"].as_u64().expect("n")).sum()
}

#[dcpi_testkit::test(perf)]
fn by_time_sums_to_the_epoch_total_exactly_and_after_a_rollup() {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon(
        "h1",
        &["-e", "cpu-clock", "--flush-interval", "200ms", "--slice-interval", "1s"],
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = std::sync::Arc::clone(&stop);
    let spin = std::thread::spawn(move || {
        let mut x = 1u64;
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            for i in 0..10_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
            }
        }
    });
    wait_for(120, "four one-second slices", || slices(&sb) >= 4);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    spin.join().expect("spin thread");
    // A clean stop publishes every sample to the profiles and to the slices.
    let (st, err) = d.terminate();
    assert!(st.success(), "{err}");
    let sel = ["--host", "h1", "--epoch", "all", "--format", "json"];
    let flat = json(sb.prof(&sel));
    let total = flat["total_samples"].as_u64().expect("total");
    assert!(total > 100, "samples: {total}");
    let by = |extra: &[&str]| {
        let mut a = sel.to_vec();
        a.extend_from_slice(&["--by", "time"]);
        a.extend_from_slice(extra);
        json(sb.prof(&a))
    };
    let v = by(&[]);
    assert_eq!(v["resolution"], 1, "the stored slice length: {v}");
    assert_eq!(sum(&v), total, "--by time sums to the epoch total: {v:#}");
    assert_eq!(v["profile_samples"].as_u64(), Some(total));
    assert!(v["rows"].as_array().expect("rows").len() >= 4, "{v:#}");
    for r in ["5s", "1m", "1h"] {
        assert_eq!(sum(&by(&["--resolution", r])), total, "--resolution {r}");
    }
    let image = flat["rows"][0]["image"].as_str().expect("top image").to_owned();
    let img =
        json(sb.prof(&["--host", "h1", "--epoch", "all", "--format", "json", "--image", &image]));
    assert_eq!(
        sum(&by(&["--image", &image])),
        img["total_samples"].as_u64().expect("n"),
        "{image}"
    );

    // Roll every slice up to hours, as dcpid does after slice_rollup_after: every sample stays.
    let db = Database::open(&sb.db()).expect("db");
    for e in db.epochs().expect("epochs") {
        let hd = db.host_dir(&e, "h1").expect("dir");
        // Every minute segment, whatever its age (FORMAT.md §14.5), at exact offsets.
        let (mut w, _) = SegmentWriter::open(&hd).expect("writer");
        let hours: Vec<u64> = w.segment_hours().iter().copied().collect();
        for h in hours {
            w.rollup(h, 1).expect("rollup");
        }
    }
    let rolled = by(&[]);
    assert_eq!(sum(&rolled), total, "after the roll-up: {rolled:#}");
    assert!(
        rolled["rows"].as_array().expect("rows").len() < v["rows"].as_array().expect("rows").len(),
        "hour slices: fewer rows: {rolled:#}"
    );
}
