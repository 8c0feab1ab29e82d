//! `dcpiprof --by time` (issue 36 item 4) on databases built with the profile-format API: the
//! buckets sum exactly to the flat profiles' totals over hosts and epochs, at any resolution,
//! for one image and one function, after a roll-up to hour slices; a selection without
//! slices is a clear error.

use std::collections::BTreeMap;

use crate::util::{base_time, event, json_ok, prof, stderr, stdout, TestDb};
use dcpi_testkit::db::Image;
use profile_format::{HostDir, ImageId, ImageKind, JitSymbol, Slice, SliceKey, SliceWriter};
use serde_json::Value;

/// Unix seconds of the fixtures' base time, rounded down to a minute.
fn t0() -> u64 {
    let t = base_time(0).duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs();
    t - t % 60
}

fn app() -> ImageId {
    ImageId::BuildId(vec![0xa1; 20])
}

fn jit() -> ImageId {
    ImageId::special("[anon]", b"77")
}

fn unknown() -> ImageId {
    ImageId::special("[unknown]", b"")
}

/// One slice per `(start, image, offset, count)` group of the same start, appended to `hd`'s
/// slice log in order; `None` is the unknown samples' key.
fn write_slices(hd: &HostDir, len: u64, parts: &[(u64, Option<ImageId>, &str, u64, u64)]) {
    let (mut w, _) = SliceWriter::open(&hd.slices_path()).expect("slice writer");
    let mut by_start: BTreeMap<u64, Slice> = BTreeMap::new();
    for (start, image, ev, off, n) in parts {
        let s = by_start.entry(*start).or_insert_with(|| Slice {
            start: *start,
            len,
            ..Slice::default()
        });
        let k = SliceKey { event: (*ev).to_owned(), image: image.clone() };
        let pairs = s.counts.entry(k).or_default();
        match pairs.iter_mut().find(|p| p.0 == *off) {
            Some(p) => p.1 += n,
            None => pairs.push((*off, *n)),
        }
        pairs.sort_unstable();
    }
    for s in by_start.values() {
        w.append(s).expect("append slice");
    }
}

/// Two hosts in one epoch and one host in a second epoch, each with profiles of an ELF image,
/// a JIT region (two functions), the unknown samples and a second event, and slices holding
/// exactly those samples over a few minutes (the two hosts share minutes).
fn db() -> TestDb {
    let t = TestDb::new();
    let clock = event("cpu-clock", 1000);
    let faults = event("page-faults", 10);
    let m = |i: u64| t0() + 60 * i;
    let e1 = t.epoch_by(base_time(0), "alpha");
    let e2 = t.epoch_by(base_time(3600), "alpha");
    for (hd, base, k) in
        [(t.host(&e1, "alpha"), 0, 1), (t.host(&e1, "beta"), 1, 2), (t.host(&e2, "alpha"), 60, 3)]
    {
        let jit_syms = vec![
            JitSymbol { start: 0x1000, size: 0x100, name: "hot_loop".into() },
            JitSymbol { start: 0x2000, size: 0x100, name: "cold_path".into() },
        ];
        Image::elf(app(), "/usr/bin/app")
            .profile(&clock)
            .counts(&[(0x10, 30 * k), (0x20, 12 * k)])
            .period(1000)
            .write(&hd);
        Image::new(ImageKind::Anon, jit(), b"[anon:77:java]")
            .profile(&clock)
            .counts(&[(0x1010, 9 * k), (0x2010, 4 * k)])
            .period(1000)
            .jit_symbols(jit_syms)
            .write(&hd);
        Image::new(ImageKind::Unknown, unknown(), b"")
            .profile(&clock)
            .counts(&[(1, 5 * k)])
            .period(1000)
            .write(&hd);
        Image::elf(app(), "/usr/bin/app")
            .profile(&faults)
            .counts(&[(0x10, 7 * k)])
            .period(10)
            .write(&hd);
        let (a, j, c) = (Some(app()), Some(jit()), "cpu-clock");
        write_slices(
            &hd,
            60,
            &[
                (m(base), a.clone(), c, 0x10, 10 * k),
                (m(base), j.clone(), c, 0x1010, 9 * k),
                (m(base), a.clone(), "page-faults", 0x10, 7 * k),
                (m(base + 1), a.clone(), c, 0x10, 20 * k),
                (m(base + 1), None, c, 1, 5 * k),
                (m(base + 3), a.clone(), c, 0x20, 12 * k),
                (m(base + 3), j.clone(), c, 0x2010, 4 * k),
            ],
        );
    }
    t
}

fn rows(v: &Value) -> Vec<(u64, u64, u64)> {
    v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| {
            (
                r["start"].as_u64().expect("start"),
                r["seconds"].as_u64().expect("seconds"),
                r["samples"].as_u64().expect("samples"),
            )
        })
        .collect()
}

fn sum(v: &Value) -> u64 {
    rows(v).iter().map(|r| r.2).sum()
}

const ALL: [&str; 4] = ["--epoch", "all", "--host", "all"];

fn args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = ALL.to_vec();
    a.extend_from_slice(extra);
    a
}

#[test]
fn by_time_sums_to_the_flat_profiles_over_hosts_and_epochs_at_every_resolution() {
    let t = db();
    let flat = json_ok(&t.root(), &ALL);
    let total = flat["total_samples"].as_u64().expect("total");
    assert!(total > 100, "{flat}");
    let v = json_ok(&t.root(), &args(&["--by", "time"]));
    assert_eq!(v["by"], "time");
    assert_eq!(v["event"], "cpu-clock", "the first event, as the flat report's");
    assert_eq!(v["resolution"], 60, "the stored slice length");
    assert_eq!(sum(&v), total, "the buckets sum to the flat profiles' total: {v:#}");
    assert_eq!(v["total_samples"].as_u64(), Some(total));
    assert_eq!(v["profile_samples"].as_u64(), Some(total));
    // alpha's and beta's minute 1 are one bucket: hosts add up by time.
    let r = rows(&v);
    let m1 = r.iter().find(|x| x.0 == t0() + 60).expect("minute 1");
    assert_eq!(m1.2, (20 + 5) + (10 + 9) * 2, "alpha's minute 1 and beta's minute 0");
    for w in r.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "rows overlap: {r:?}");
    }
    let pct: f64 =
        v["rows"].as_array().expect("rows").iter().map(|x| x["percent"].as_f64().expect("%")).sum();
    assert!((pct - 100.0).abs() < 0.01, "shares of the selection: {pct}");
    for res in ["1s", "2m", "1h", "1d"] {
        let v = json_ok(&t.root(), &args(&["--by", "time", "--resolution", res]));
        assert_eq!(sum(&v), total, "--resolution {res}: {v:#}");
    }
    let two = json_ok(&t.root(), &args(&["--by", "time", "--resolution", "2m"]));
    assert!(rows(&two).len() < r.len(), "coarser: fewer rows");
    assert!(rows(&two).iter().all(|x| x.0 % 120 == 0 && x.1 == 120), "{two:#}");

    // The second event, when asked for.
    let flat_pf = json_ok(&t.root(), &args(&["--event", "page-faults"]));
    let pf = json_ok(&t.root(), &args(&["--by", "time", "--event", "page-faults"]));
    assert_eq!(sum(&pf), flat_pf["total_samples"].as_u64().expect("total"));

    // CSV and the text table (with its chart) through the same renderer.
    let o = prof(&t.root(), &args(&["--by", "time", "--format", "csv"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let csv = stdout(&o);
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("time,seconds,samples,per_second,percent"));
    let csv_sum: u64 =
        lines.map(|l| l.split(',').nth(2).expect("samples").parse::<u64>().expect("n")).sum();
    assert_eq!(csv_sum, total);
    let o = prof(&t.root(), &args(&["--by", "time"]));
    let text = stdout(&o);
    assert!(o.status.success(), "{}", stderr(&o));
    let chart = text.lines().find(|l| l.starts_with("# chart (2m per cell): ")).expect(&text);
    assert!(chart.contains('█') && chart.contains(' '), "the busiest minute and a gap: {chart}");
    assert!(text.contains(&profile_format_utc(t0())), "{text}");
}

fn profile_format_utc(t: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(t))
        .to_string()
}

#[test]
fn by_time_of_an_image_and_of_one_function_sums_to_their_reports() {
    let t = db();
    let img = json_ok(&t.root(), &args(&["--image", "app"]));
    let v = json_ok(&t.root(), &args(&["--by", "time", "--image", "app"]));
    assert_eq!(sum(&v), img["total_samples"].as_u64().expect("total"), "{v:#}");
    assert_eq!(v["image"], "/usr/bin/app");
    // Each bucket's share is of that bucket's samples.
    let all = json_ok(&t.root(), &args(&["--by", "time"]));
    for (r, a) in
        v["rows"].as_array().expect("rows").iter().zip(all["rows"].as_array().expect("rows"))
    {
        assert_eq!(r["start"], a["start"]);
        let want = 100.0 * r["samples"].as_f64().expect("n") / a["samples"].as_f64().expect("n");
        assert!((r["percent"].as_f64().expect("%") - want).abs() < 0.01, "{r} of {a}");
    }
    let syms = json_ok(&t.root(), &args(&["--image", "anon"]));
    let hot = syms["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["symbol"] == "hot_loop")
        .expect("hot_loop row")["samples"]
        .as_u64()
        .expect("n");
    let v = json_ok(&t.root(), &args(&["--by", "time", "--image", "anon", "--symbol", "hot_loop"]));
    assert_eq!(sum(&v), hot, "{v:#}");
    assert!(hot > 0 && hot < syms["total_samples"].as_u64().expect("t"));
    // A name no sample has: a clear error, not an empty timeline.
    let o = prof(&t.root(), &args(&["--by", "time", "--image", "anon", "--symbol", "nope"]));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--symbol nope"), "{}", stderr(&o));
}

#[test]
fn by_time_after_a_rollup_to_hours_keeps_every_sample() {
    let t = db();
    let total = json_ok(&t.root(), &ALL)["total_samples"].as_u64().expect("total");
    let before = json_ok(&t.root(), &args(&["--by", "time"]));
    // Roll every slice of every host-epoch up to hour slices, as dcpid does after
    // slice_rollup_after.
    let db = profile_format::Database::open(&t.root()).expect("db");
    let mut rolled = 0;
    for e in db.epochs().expect("epochs") {
        for h in db.hosts(&e).expect("hosts") {
            let hd = db.host_dir(&e, &h).expect("dir");
            let (mut w, _) = SliceWriter::open(&hd.slices_path()).expect("writer");
            w.rollup(u64::MAX, 3600).expect("rollup");
            rolled += 1;
        }
    }
    assert_eq!(rolled, 3);
    let after = json_ok(&t.root(), &args(&["--by", "time"]));
    assert_eq!(sum(&before), total);
    assert_eq!(sum(&after), total, "the roll-up keeps every sample: {after:#}");
    assert!(rows(&after).len() < rows(&before).len(), "coarser rows: {after:#}");
    assert!(rows(&after).iter().any(|r| r.1 > 60), "hour slices stay whole: {after:#}");
    let text = stdout(&prof(&t.root(), &args(&["--by", "time", "--resolution", "1m"])));
    assert!(text.contains("longer than 1m"), "the header says rows keep their length: {text}");
}

#[test]
fn by_time_without_slices_is_a_clear_error_and_a_warning_for_some() {
    let t = TestDb::new();
    let e = t.epoch_by(base_time(0), "alpha");
    let hd = t.host(&e, "alpha");
    Image::elf(app(), "/usr/bin/app")
        .profile(&event("cpu-clock", 1000))
        .counts(&[(0x10, 3)])
        .write(&hd);
    let o = prof(&t.root(), &args(&["--by", "time"]));
    assert_eq!(o.status.code(), Some(2), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains("slices.log") && err.contains("--by epoch"), "{err}");
    assert!(err.contains(&format!("{e}/alpha")), "names the host-epoch: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    // Another host with slices: its timeline, and a warning naming the one without.
    let hb = t.host(&e, "beta");
    Image::elf(app(), "/usr/bin/app")
        .profile(&event("cpu-clock", 1000))
        .counts(&[(0x10, 4)])
        .write(&hb);
    write_slices(&hb, 60, &[(t0(), Some(app()), "cpu-clock", 0x10, 4)]);
    let o = prof(&t.root(), &args(&["--by", "time", "--format", "json"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(sum(&v), 4);
    assert!(
        stderr(&o).contains("no slices.log") && stderr(&o).contains(&format!("{e}/alpha")),
        "{}",
        stderr(&o)
    );
}

#[test]
fn by_time_refuses_the_filters_slices_cannot_answer() {
    let t = db();
    for f in ["--command", "--cgroup", "--pid", "--cpu"] {
        let o = prof(&t.root(), &args(&["--by", "time", f, "1"]));
        assert_eq!(o.status.code(), Some(2), "{f}");
        let err = stderr(&o);
        assert!(err.contains(f) && err.contains("--by time"), "{f}: {err}");
    }
}
