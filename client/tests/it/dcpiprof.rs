//! dcpiprof against databases built in temporary directories with the profile-format API and
//! ELF files compiled at test time (gcc, g++, objcopy).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use crate::util::{
    asm_calling, assert_no_golden_mismatch, check_golden, compile, event, golden_dir, json_ok,
    prof, prof_command, row, rows, stderr, stdout, TestDb,
};
use dcpi_client::prof::debuginfo;
use dcpi_client::prof::select;
use dcpi_client::prof::symbolize;
use dcpi_testkit::db::Image;
use object::{Object, ObjectSegment, ObjectSymbol};
use profile_format::sumidx;
use profile_format::{
    EventSummary, HostSummary, ImageId, ImageKind, JitSymbol, KallsymsSnapshot, KernelModule,
    KernelSymbol,
};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// Helpers

fn unknown_id() -> ImageId {
    ImageId::special("[unknown]", b"")
}

fn approx(a: f64, b: f64) -> bool {
    (a - b).abs() < 0.01
}

/// File offsets of the first byte of the named functions, with their build-id.
struct ElfFacts {
    build_id: Vec<u8>,
    data: Vec<u8>,
}

impl ElfFacts {
    fn read(path: &Path) -> Self {
        let data = std::fs::read(path).expect("read elf");
        let build_id = {
            let f = object::File::parse(&*data).expect("parse elf");
            f.build_id().expect("build id").expect("has build id").to_vec()
        };
        Self { build_id, data }
    }
    fn id(&self) -> ImageId {
        ImageId::BuildId(self.build_id.clone())
    }
    /// (file offset, size) of a function symbol.
    fn func(&self, name: impl AsRef<[u8]>) -> (u64, u64) {
        let name = name.as_ref();
        let f = object::File::parse(&*self.data).expect("parse elf");
        let sym = f
            .symbols()
            .chain(f.dynamic_symbols())
            .find(|s| s.name_bytes().is_ok_and(|n| n == name))
            .unwrap_or_else(|| panic!("no symbol {}", String::from_utf8_lossy(name)));
        let vaddr = sym.address();
        for seg in f.segments() {
            let (off, size) = seg.file_range();
            if vaddr >= seg.address() && vaddr - seg.address() < size {
                return (vaddr - seg.address() + off, sym.size());
            }
        }
        panic!("{} not in a PT_LOAD segment", String::from_utf8_lossy(name));
    }
}

const C_PROG: &str = r#"
#include <stdio.h>
__attribute__((noinline)) int hot_alpha(int x) { int s = 0; for (int i = 0; i < x; i++) s += i * VARIANT; return s; }
__attribute__((noinline)) int hot_beta(int x) { int s = 1; for (int i = 0; i < x; i++) s ^= i + 7; return s; }
__attribute__((noinline)) int cold_gamma(int x) { return x * 3 + VARIANT; }
int main(int argc, char **argv) { (void)argv; printf("%d\n", hot_alpha(argc) + hot_beta(argc) + cold_gamma(argc)); return 0; }
"#;

fn build_c(dir: &Path, name: &str, variant: u32, extra: &[&str]) -> PathBuf {
    let def = format!("-DVARIANT={variant}");
    let mut flags = vec!["-O1", def.as_str()];
    flags.extend_from_slice(extra);
    compile(dir, name, C_PROG, "c", &flags)
}

// ---------------------------------------------------------------------------------------------
// Per-image report

#[test]
fn per_image_report_rows_percentages_unknown_and_json_schema() {
    let t = TestDb::new();
    let e = t.epoch(0);
    let hd = t.host(&e, "alpha");
    let ev = event("cpu-clock", 1000);
    let a = ImageId::BuildId(vec![0xaa; 20]);
    let b = ImageId::BuildId(vec![0xbb; 20]);
    Image::new(ImageKind::Elf, a.clone(), b"/usr/bin/aaa")
        .profile(&ev)
        .counts(&[(0x1000, 50), (0x1010, 10)])
        .period(1000)
        .write(&hd);
    Image::new(ImageKind::Elf, b.clone(), b"/usr/lib/libbbb.so")
        .profile(&ev)
        .counts(&[(0x2000, 30)])
        .period(1000)
        .write(&hd);
    Image::new(ImageKind::Unknown, unknown_id(), b"[unknown]")
        .profile(&ev)
        .counts(&[(0, 7), (1, 3)])
        .period(1000)
        .write(&hd);

    let v = json_ok(&t.root(), &["--host", "alpha"]);
    assert_eq!(v["report"], "images");
    assert_eq!(v["total_samples"], 100);
    assert_eq!(v["hosts"], serde_json::json!(["alpha"]));
    assert_eq!(v["epochs"], serde_json::json!([e.as_str()]));
    assert_eq!(v["events"][0]["name"], "cpu-clock");
    assert!(approx(v["events"][0]["mean_period"].as_f64().unwrap_or(0.0), 1000.0));
    let r = rows(&v);
    let order: Vec<&str> = r.iter().map(|x| x["image"].as_str().unwrap_or("")).collect();
    assert_eq!(order, ["/usr/bin/aaa", "/usr/lib/libbbb.so", "[unknown]"]);
    assert_eq!(r[0]["samples"], 60);
    assert_eq!(r[0]["events"], 60_000);
    assert!(approx(r[0]["percent"].as_f64().unwrap_or(0.0), 60.0));
    assert!(approx(r[1]["cumulative_percent"].as_f64().unwrap_or(0.0), 90.0));
    assert_eq!(r[0]["build_id"], hex::encode([0xaa; 20]));
    assert_eq!(r[0]["kind"], "elf");
    assert_eq!(r[2]["kind"], "unknown");
    assert_eq!(r[2]["samples"], 10);
    assert!(r[2]["image_id"].is_null());

    // Table: header names the database, epoch, host, event; rows in the same order.
    let o = prof(&t.root(), &["--host", "alpha"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(s.contains(&format!("# database: {}", t.root().display())), "{s}");
    assert!(s.contains("# hosts: alpha"), "{s}");
    assert!(s.contains("# event cpu-clock: 100 samples, mean period 1000"), "{s}");
    // Images by basename in the table (issue 39).
    let pa = s.find("  aaa\n").expect("aaa row");
    let pb = s.find("  libbbb.so\n").expect("bbb row");
    let pu = s.rfind("[unknown]").expect("unknown row");
    assert!(pa < pb && pb < pu, "{s}");

    // Per-symbol on [unknown] splits by reason.
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "unknown"]);
    assert_eq!(row(&v, "symbol", "[unknown: no-map]")["samples"], 7);
    assert_eq!(row(&v, "symbol", "[unknown: process-gone]")["samples"], 3);
}

#[test]
fn csv_and_limit() {
    let t = TestDb::new();
    let e = t.epoch(0);
    let hd = t.host(&e, "alpha");
    let ev = event("cpu-clock", 1000);
    for i in 0..5u8 {
        let id = ImageId::BuildId(vec![i + 1; 8]);
        let path = format!("/opt/img{i},\"q\"");
        Image::new(ImageKind::Elf, id.clone(), path.as_bytes())
            .profile(&ev)
            .counts(&[(0, 10 * (u64::from(i) + 1))])
            .period(1000)
            .write(&hd);
    }
    let o = prof(&t.root(), &["--host", "alpha", "--format", "csv", "--limit", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    let lines: Vec<&str> = s.lines().collect();
    assert_eq!(lines.len(), 3, "{s}");
    assert_eq!(
        lines[0],
        "image,kind,build_id,image_id,cpu-clock.samples,cpu-clock.events,cpu-clock.percent,cumulative_percent"
    );
    assert!(
        lines[1].starts_with(
            "\"/opt/img4,\"\"q\"\"\",elf,0505050505050505,b0505050505050505,50,50000,"
        ),
        "{s}"
    );
    assert!(lines[2].contains(",40,40000,"), "{s}");

    let v = json_ok(&t.root(), &["--host", "alpha", "--limit", "1"]);
    assert_eq!(rows(&v).len(), 1);
    assert_eq!(v["rows_omitted"], 4);
    assert_eq!(v["total_samples"], 150, "totals count every row, not only the shown ones");
}

#[test]
fn several_events_weighting_and_multiplex_scaling() {
    let t = TestDb::new();
    let e = t.epoch(0);
    let hd = t.host(&e, "alpha");
    let clock = event("cpu-clock", 1000);
    let faults = event("page-faults", 10);
    let x = ImageId::BuildId(vec![1; 8]);
    let y = ImageId::BuildId(vec![2; 8]);
    // Same number of samples, but y's samples were taken with a 3x longer period.
    Image::new(ImageKind::Elf, x.clone(), b"/bin/x")
        .profile(&clock)
        .counts(&[(0, 100)])
        .period(1000)
        .write(&hd);
    Image::new(ImageKind::Elf, y.clone(), b"/bin/y")
        .profile(&clock)
        .counts(&[(0, 100)])
        .period(3000)
        .write(&hd);
    Image::new(ImageKind::Elf, x.clone(), b"/bin/x")
        .profile(&faults)
        .counts(&[(0, 5)])
        .period(10)
        .write(&hd);
    Image::new(ImageKind::Elf, y.clone(), b"/bin/y")
        .profile(&faults)
        .counts(&[(0, 15)])
        .period(10)
        .write(&hd);
    let summary = HostSummary {
        format_version: 1,
        host: "alpha".into(),
        epoch: e.to_string(),
        events: vec![
            EventSummary {
                desc: Some(clock.clone()),
                source: "software".into(),
                samples: 200,
                total_period: 400_000,
                time_enabled_ns: 1000,
                time_running_ns: 1000,
            },
            EventSummary {
                desc: Some(faults.clone()),
                source: "software".into(),
                samples: 20,
                total_period: 200,
                // Counted half of the time: every count stands for twice as many events.
                time_enabled_ns: 2000,
                time_running_ns: 1000,
            },
        ],
        ..HostSummary::default()
    };
    summary.write(&hd.summary_path()).expect("write summary");

    let v = json_ok(&t.root(), &["--host", "alpha"]);
    let names: Vec<&str> = v["events"]
        .as_array()
        .map_or(Vec::new(), |a| a.iter().filter_map(|e| e["name"].as_str()).collect());
    assert_eq!(names, ["cpu-clock", "page-faults"]);
    assert!(approx(v["events"][0]["mean_period"].as_f64().unwrap_or(0.0), 2000.0));
    assert!(approx(v["events"][1]["multiplex_scale"].as_f64().unwrap_or(0.0), 2.0));
    let r = rows(&v);
    assert_eq!(r[0]["image"], "/bin/y", "sorted by weighted events of the first event");
    assert_eq!(r[0]["samples"], 100);
    assert_eq!(r[0]["events"], 300_000);
    assert!(approx(r[0]["percent"].as_f64().unwrap_or(0.0), 75.0));
    let yf = &r[0]["counts"][1];
    assert_eq!(yf["event"], "page-faults");
    assert_eq!(yf["samples"], 15);
    assert_eq!(yf["events"], 300, "15 samples * period 10 * multiplex 2");
    assert!(approx(yf["percent"].as_f64().unwrap_or(0.0), 75.0));

    // --event picks and orders columns; the first one decides the order.
    let v = json_ok(&t.root(), &["--host", "alpha", "--event", "page-faults"]);
    assert_eq!(v["events"].as_array().map(Vec::len), Some(1));
    assert_eq!(v["total_samples"], 20);
    let o = prof(&t.root(), &["--host", "alpha"]);
    let s = stdout(&o);
    assert!(s.contains("cpu-clock:events") && s.contains("page-faults:%"), "{s}");

    let o = prof(&t.root(), &["--host", "alpha", "--event", "cycles"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("event \"cycles\"") && err.contains("page-faults"), "{err}");
}

#[test]
fn hosts_epochs_merge_ranges_and_default_host() {
    let t = TestDb::new();
    let ev = event("cpu-clock", 1000);
    let id = ImageId::BuildId(vec![7; 8]);
    let e1 = t.epoch(0);
    let e2 = t.epoch(86_400 * 2);
    let e3 = t.epoch(86_400 * 4);
    for (e, host, n, period) in [
        (&e1, "alpha", 1, 1000),
        (&e1, "beta", 2, 2000),
        (&e2, "alpha", 4, 1000),
        (&e3, "beta", 8, 4000),
    ] {
        let hd = t.host(e, host);
        Image::new(ImageKind::Elf, id.clone(), b"/bin/app")
            .profile(&ev)
            .counts(&[(0x40, n)])
            .period(period)
            .write(&hd);
    }
    let samples = |args: &[&str]| -> (u64, u64) {
        let v = json_ok(&t.root(), args);
        (
            v["rows"][0]["samples"].as_u64().unwrap_or(0),
            v["rows"][0]["events"].as_u64().unwrap_or(0),
        )
    };
    // Latest epoch only (e3): beta.
    assert_eq!(samples(&["--host", "beta"]), (8, 32_000));
    assert_eq!(samples(&["--host", "all", "--epoch", "all"]), (15, 1000 + 4000 + 4000 + 32_000));
    assert_eq!(samples(&["--host", "all", "--epoch", e1.as_str()]), (3, 5000));
    let range = format!("{}..{}", e1.as_str(), e2.as_str());
    assert_eq!(samples(&["--host", "all", "--epoch", &range]), (7, 9000));
    let open = format!("{}..", e2.as_str());
    assert_eq!(samples(&["--host", "alpha", "--epoch", &open]), (4, 4000));
    let v = json_ok(&t.root(), &["--host", "all", "--epoch", "all"]);
    assert_eq!(v["hosts"], serde_json::json!(["alpha", "beta"]));
    assert_eq!(v["epochs"].as_array().map(Vec::len), Some(3));

    // alpha has nothing in the latest epoch: say so and suggest --host all.
    let o = prof(&t.root(), &["--host", "alpha"]);
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(err.contains("--host all") && err.contains(e2.as_str()), "{err}");

    // Default host is this machine's name.
    let me = select::this_host();
    let hd = t.host(&e3, &me);
    Image::new(ImageKind::Elf, id.clone(), b"/bin/app")
        .profile(&ev)
        .counts(&[(0x40, 21)])
        .period(1000)
        .write(&hd);
    assert_eq!(samples(&[]), (21, 21_000));

    // Bad epoch syntax is a usage error naming the argument.
    let o = prof(&t.root(), &["--epoch", "last-tuesday"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("last-tuesday"), "{}", stderr(&o));
    let o = prof(&t.root(), &["--epoch", "20000101..20000102", "--host", "all"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no epoch matches"), "{}", stderr(&o));
}

/// The error contract: one line on stderr naming the thing, exit status 2, no panic/backtrace.
fn assert_one_line_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {err}");
    assert!(lines[0].starts_with("dcpiprof: error: "), "{err}");
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "{err}");
    for n in needles {
        assert!(err.contains(n), "error lacks {n:?}: {err}");
    }
}

#[test]
fn bad_input_one_line_errors_exit_2() {
    let t = TestDb::new();
    // Missing database.
    let missing = t.tmp().join("nope");
    let o = prof(&missing, &[]);
    assert_one_line_error(&o, &[&missing.display().to_string(), "--db"]);

    // A database without epochs.
    let o = prof(&t.root(), &[]);
    assert_one_line_error(&o, &["no epochs"]);

    // An empty current epoch (the host directory exists, nothing in it yet) is not an error
    // (issue 36 item 6): an empty report that says when data appear (client it fresh::).
    let e = t.epoch(0);
    t.host(&e, "alpha");
    let o = prof(&t.root(), &["--host", "alpha"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("nothing sampled in the current epoch yet"), "{}", stdout(&o));

    // An image without samples of the chosen event.
    let ev = event("cpu-clock", 1000);
    let pf = event("page-faults", 10);
    let hd = t.host(&e, "alpha");
    let id = ImageId::BuildId(vec![1; 8]);
    Image::new(ImageKind::Elf, id.clone(), b"/bin/good")
        .profile(&ev)
        .counts(&[(0, 10)])
        .period(1000)
        .write(&hd);
    Image::new(ImageKind::Elf, ImageId::BuildId(vec![3; 8]), b"/bin/pf")
        .profile(&pf)
        .counts(&[(0, 1)])
        .period(10)
        .write(&hd);
    let o = prof(&t.root(), &["--host", "alpha", "--image", "good", "--event", "page-faults"]);
    assert_one_line_error(&o, &["\"good\"", "page-faults", "cpu-clock", "--event"]);
    let o = prof(&t.root(), &["--host", "alpha", "--image", "nothere"]);
    assert_one_line_error(&o, &["nothere", "/bin/good", "/bin/pf", "--host all"]);
}

/// Flags that do not go together are a usage error naming them before anything is read
/// (issue 34): a table-only report with an export format used to fail after reading the
/// profiles with an internal error (exit 1), and --callers/--callees with a who filter ran a
/// who-table report, ignoring --callers.
#[test]
fn conflicting_flags_are_usage_errors_naming_them() {
    let t = TestDb::new();
    let e = t.epoch(0);
    let hd = t.host(&e, "alpha");
    let ev = event("cpu-clock", 1000);
    Image::new(ImageKind::Elf, ImageId::BuildId(vec![1; 8]), b"/bin/good")
        .profile(&ev)
        .counts(&[(0, 10)])
        .period(1000)
        .write(&hd);
    let cases: &[(&[&str], &[&str])] = &[
        (&["--by", "epoch", "--format", "html"], &["--by epoch", "--format html"]),
        (&["--by", "host", "--format", "svg"], &["--by host", "--format svg"]),
        (&["--by", "command", "--format", "folded"], &["--by command", "--format folded"]),
        // --callers with --command selects call stacks (FORMAT.md §13 v3): none of x here.
        (&["--callers", "main", "--command", "x"], &["command \"x\"", "call stacks"]),
        (&["--callers", "main", "--pid", "1"], &["--callers", "--pid", "--command"]),
        (&["--callees", "main", "--cgroup", "/"], &["--callees", "--cgroup", "--command"]),
        (&["--callees", "main", "--format", "speedscope"], &["--callees", "--format speedscope"]),
        (&["--by", "image", "--image", "good"], &["--by image", "--image"]),
        (&["--by", "cpu", "--pid", "1"], &["--by cpu", "--pid"]),
    ];
    for (args, needles) in cases {
        let mut a = vec!["--host", "alpha"];
        a.extend_from_slice(args);
        let o = prof(&t.root(), &a);
        assert!(o.stdout.is_empty(), "{args:?}");
        assert_one_line_error(&o, needles);
    }
    // An export with --command holds that command's call stacks: none here (the flat samples'
    // symbolization may warn first).
    let o = prof(&t.root(), &["--host", "alpha", "--command", "x", "--format", "pprof"]);
    assert_eq!((o.status.code(), o.stdout.is_empty()), (Some(2), true), "{o:?}");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("error: no call stacks of the command \"x\""), "{e}");
}

#[test]
fn corrupt_and_foreign_version_profiles_fail_unless_keep_going() {
    let t = TestDb::new();
    let e = t.epoch(0);
    let hd = t.host(&e, "alpha");
    let ev = event("cpu-clock", 1000);
    let good = ImageId::BuildId(vec![1; 8]);
    let bad = ImageId::BuildId(vec![2; 8]);
    let future = ImageId::BuildId(vec![4; 8]);
    Image::new(ImageKind::Elf, good.clone(), b"/bin/good")
        .profile(&ev)
        .counts(&[(0, 10)])
        .period(1000)
        .write(&hd);
    Image::new(ImageKind::Elf, bad.clone(), b"/bin/bad")
        .profile(&ev)
        .counts(&[(0, 10)])
        .period(1000)
        .write(&hd);
    Image::new(ImageKind::Elf, future.clone(), b"/bin/future")
        .profile(&ev)
        .counts(&[(0, 10)])
        .period(1000)
        .write(&hd);
    let bad_path = hd.profile_path(&bad, "cpu-clock");
    let mut bytes = std::fs::read(&bad_path).expect("read");
    let n = bytes.len();
    bytes[n / 2] ^= 0x55;
    std::fs::write(&bad_path, &bytes).expect("corrupt");
    // A file from a newer dcpi: same magic, higher format version.
    let future_path = hd.profile_path(&future, "cpu-clock");
    let mut bytes = std::fs::read(&future_path).expect("read");
    bytes[8..10].copy_from_slice(&0x7777u16.to_le_bytes());
    std::fs::write(&future_path, &bytes).expect("write future");

    let o = prof(&t.root(), &["--host", "alpha"]);
    assert_one_line_error(&o, &[&bad_path.display().to_string(), "--keep-going", "1 more"]);
    assert!(stdout(&o).is_empty(), "no partial report without --keep-going: {}", stdout(&o));

    for flag in ["--keep-going", "--ignore-corrupt"] {
        let o = prof(&t.root(), &["--host", "alpha", flag]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
        let (out, err) = (stdout(&o), stderr(&o));
        // Images by basename in the table (issue 39).
        let rows: Vec<&str> = out.lines().filter(|l| !l.starts_with('#')).collect();
        assert!(
            rows.iter().any(|l| l.ends_with("  good"))
                && !rows.iter().any(|l| l.ends_with("  bad")),
            "{out}"
        );
        assert!(err.contains(&bad_path.display().to_string()), "skipped file named: {err}");
        assert!(err.contains(&future_path.display().to_string()), "{err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // The version error says which version; with only the foreign file, no report at all.
    std::fs::remove_file(&bad_path).expect("rm");
    let o = prof(&t.root(), &["--host", "alpha"]);
    assert_one_line_error(&o, &[&future_path.display().to_string(), "version"]);
}

#[test]
fn per_symbol_report_reads_only_the_images_files() {
    // 3 epochs x 2 hosts x 3 images; the other images' files are corrupt after the first
    // epoch, so any read of them would fail the run.
    let t = TestDb::new();
    let ev = event("cpu-clock", 1000);
    let ids: Vec<ImageId> = (1..=3u8).map(|i| ImageId::BuildId(vec![i; 20])).collect();
    let mut corrupted = Vec::new();
    for (k, secs) in [0u64, 3600, 7200].into_iter().enumerate() {
        let e = t.epoch(secs);
        for host in ["alpha", "beta"] {
            let hd = t.host(&e, host);
            for (i, id) in ids.iter().enumerate() {
                let path = format!("/opt/app{i}");
                Image::new(ImageKind::Elf, id.clone(), path.as_bytes())
                    .profile(&ev)
                    .counts(&[(0x10, 2)])
                    .period(1000)
                    .write(&hd);
                if i > 0 && k > 0 {
                    let f = hd.profile_path(id, "cpu-clock");
                    std::fs::write(&f, b"garbage").expect("corrupt");
                    corrupted.push(f);
                }
            }
        }
    }
    let stat = |err: &str, name: &str| -> u64 {
        let line = err.lines().find(|l| l.contains("stats:")).expect("stats line");
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    // By build-id: the file names decide; only the 6 files of app0 are read.
    let bid = hex::encode([1u8; 20]);
    let o = prof(&t.root(), &["--epoch", "all", "--host", "all", "--image", &bid[..12], "-v"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stat(&stderr(&o), "profiles_listed"), 18);
    assert_eq!(stat(&stderr(&o), "profiles_read"), 6);
    let v = json_ok(&t.root(), &["--epoch", "all", "--host", "all", "--image", &bid[..12]]);
    assert_eq!(v["total_samples"], 12);

    // By basename: one header per other image (from the first, intact epoch), then app0's.
    let o = prof(&t.root(), &["--epoch", "all", "--host", "all", "--image", "app0", "-v"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stat(&stderr(&o), "profiles_read"), 6 + 2);

    // The per-image report reads each file exactly once, and meets the corrupt ones.
    let o = prof(&t.root(), &["--epoch", "all", "--host", "all", "--keep-going", "-v"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stat(&stderr(&o), "profiles_read"), 18);
    for f in &corrupted {
        assert!(stderr(&o).contains(&f.display().to_string()), "{}", stderr(&o));
    }
}

// ---------------------------------------------------------------------------------------------
// Per-symbol reports on real ELF files

#[test]
fn per_symbol_report_on_compiled_c_program() {
    let t = TestDb::new();
    let bin = build_c(t.tmp(), "prog", 1, &[]);
    let f = ElfFacts::read(&bin);
    let (alpha, alpha_sz) = f.func("hot_alpha");
    let (beta, _) = f.func("hot_beta");
    let (gamma, _) = f.func("cold_gamma");
    assert!(alpha_sz > 2);
    let e = t.epoch(0);
    let hd = t.host(&e, "alpha");
    let ev = event("cpu-clock", 1000);
    let path = bin.display().to_string();
    Image::new(ImageKind::Elf, f.id(), path.as_bytes())
        .profile(&ev)
        .counts(&[
            (alpha, 40),
            (alpha + 1, 20),
            (alpha + alpha_sz - 1, 10),
            (beta, 25),
            (gamma, 5),
            (0x7fff_0000, 3),
        ])
        .period(1000)
        .write(&hd);
    for spec in [path.as_str(), "prog", &hex::encode(&f.build_id)[..8], &hex::encode(&f.build_id)] {
        let v = json_ok(&t.root(), &["--host", "alpha", "--image", spec]);
        assert_eq!(v["report"], "symbols");
        assert_eq!(v["image"]["path"], path.as_str());
        assert_eq!(v["image"]["build_id"], hex::encode(&f.build_id));
        assert_eq!(v["total_samples"], 103);
        let r = rows(&v);
        assert_eq!(r[0]["symbol"], "hot_alpha", "{v:#}");
        assert_eq!(r[0]["samples"], 70);
        assert!(approx(r[0]["percent"].as_f64().unwrap_or(0.0), 70.0 * 100.0 / 103.0));
        assert_eq!(row(&v, "symbol", "hot_beta")["samples"], 25);
        assert_eq!(row(&v, "symbol", "cold_gamma")["samples"], 5);
        assert_eq!(row(&v, "symbol", "prog+0x7fff0000")["samples"], 3, "{v:#}");
    }
    let o = prof(&t.root(), &["--host", "alpha", "--image", "prog", "--limit", "1"]);
    let s = stdout(&o);
    assert!(s.contains("hot_alpha") && !s.contains("hot_beta"), "{s}");
    assert!(s.contains("# image: ") && s.contains("build-id"), "{s}");

    let o = prof(&t.root(), &["--host", "alpha", "--image", "nosuchthing"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("nosuchthing"), "{}", stderr(&o));
}

#[test]
fn cpp_and_rust_symbols_are_demangled() {
    let t = TestDb::new();
    let src = r#"
namespace engine { struct Widget { __attribute__((noinline)) int spin(int n); };
int Widget::spin(int n) { int s = 0; for (int i = 0; i < n; i++) s += i; return s; } }
int main(int argc, char**) { engine::Widget w; return w.spin(argc); }
"#;
    let bin = compile(t.tmp(), "cxx", src, "cpp", &["-O1"]);
    let f = ElfFacts::read(&bin);
    let (spin, _) = f.func("_ZN6engine6Widget4spinEi");
    let e = t.epoch(0);
    let hd = t.host(&e, "alpha");
    let ev = event("cpu-clock", 1000);
    let path = bin.display().to_string();
    Image::new(ImageKind::Elf, f.id(), path.as_bytes())
        .profile(&ev)
        .counts(&[(spin, 9)])
        .period(1000)
        .write(&hd);
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "cxx"]);
    assert_eq!(row(&v, "symbol", "engine::Widget::spin(int)")["samples"], 9);

    // Rust (whichever mangling this rustc uses by default; the legacy hash is dropped).
    let rs = t.tmp().join("rsprog.rs");
    std::fs::write(
        &rs,
        "#[inline(never)] pub fn crunch(n: u64) -> u64 { (0..n).map(|i| i ^ 3).sum() }\n\
         fn main() { println!(\"{}\", crunch(std::env::args().count() as u64)); }\n",
    )
    .expect("write rs");
    let rbin = t.tmp().join("rsprog");
    let o = Command::new("rustc")
        .args(["-C", "opt-level=1", "-C", "link-arg=-Wl,--build-id=sha1", "-o"])
        .arg(&rbin)
        .arg(&rs)
        .output()
        .expect("rustc");
    assert!(o.status.success(), "rustc: {}", String::from_utf8_lossy(&o.stderr));
    let rf = ElfFacts::read(&rbin);
    let obj = object::File::parse(&*rf.data).expect("parse");
    let mangled = obj
        .symbols()
        .filter_map(|s| s.name().ok().map(str::to_owned))
        .find(|n| n.contains("6rsprog6crunch"))
        .expect("mangled crunch symbol");
    let (crunch, _) = rf.func(&mangled);
    let rpath = rbin.display().to_string();
    Image::new(ImageKind::Elf, rf.id(), rpath.as_bytes())
        .profile(&ev)
        .counts(&[(crunch, 4)])
        .period(1000)
        .write(&hd);
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "rsprog"]);
    assert_eq!(row(&v, "symbol", "rsprog::crunch")["samples"], 4);
}

#[test]
fn stripped_binary_with_separate_debug_info() {
    let t = TestDb::new();
    let full = build_c(t.tmp(), "full", 3, &["-g"]);
    let facts = ElfFacts::read(&full);
    let (beta, _) = facts.func("hot_beta");
    let objcopy = |args: &[&str]| {
        let o = Command::new("objcopy").args(args).output().expect("objcopy");
        assert!(o.status.success(), "objcopy {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    let dbg = t.tmp().join("full.debug");
    let stripped_dir = t.tmp().join("bin");
    std::fs::create_dir_all(&stripped_dir).expect("mkdir");
    let stripped = stripped_dir.join("stripped");
    let s = |p: &Path| p.display().to_string();
    objcopy(&["--only-keep-debug", &s(&full), &s(&dbg)]);
    objcopy(&["--strip-all", &s(&full), &s(&stripped)]);
    assert_eq!(ElfFacts::read(&stripped).build_id, facts.build_id);

    let e = t.epoch(0);
    let hd = t.host(&e, "alpha");
    let ev = event("cpu-clock", 1000);
    Image::new(ImageKind::Elf, facts.id(), s(&stripped).as_bytes())
        .profile(&ev)
        .counts(&[(beta, 11)])
        .period(1000)
        .write(&hd);
    let db = t.root();

    // No debug info anywhere: no function name.
    let v = json_ok(&db, &["--host", "alpha", "--image", "stripped"]);
    assert!(rows(&v).iter().all(|r| r["symbol"] != "hot_beta"), "{v:#}");

    // 1. --debug-dir with the build-id layout.
    let bid = hex::encode(&facts.build_id);
    let dd = t.tmp().join("dd");
    let link = dd.join(".build-id").join(&bid[..2]);
    std::fs::create_dir_all(&link).expect("mkdir");
    std::fs::copy(&dbg, link.join(format!("{}.debug", &bid[2..]))).expect("copy");
    let v = json_ok(&db, &["--host", "alpha", "--image", "stripped", "--debug-dir", &s(&dd)]);
    assert_eq!(row(&v, "symbol", "hot_beta")["samples"], 11);
    assert!(v["image"]["debug_file"].as_str().is_some_and(|p| p.ends_with(".debug")), "{v:#}");
    std::fs::remove_dir_all(&dd).expect("rm");

    // 2. .gnu_debuglink, found in a --debug-dir, CRC checked.
    let linked = stripped_dir.join("linked");
    objcopy(&["--strip-all", &format!("--add-gnu-debuglink={}", s(&dbg)), &s(&full), &s(&linked)]);
    let lf = ElfFacts::read(&linked);
    let hd2 = t.host(&t.epoch(10), "alpha");
    Image::new(ImageKind::Elf, lf.id(), s(&linked).as_bytes())
        .profile(&ev)
        .counts(&[(beta, 6)])
        .period(1000)
        .write(&hd2);
    let dl = t.tmp().join("dl");
    std::fs::create_dir_all(&dl).expect("mkdir");
    std::fs::copy(&dbg, dl.join("full.debug")).expect("copy");
    let v = json_ok(&db, &["--host", "alpha", "--image", "linked", "--debug-dir", &s(&dl)]);
    assert_eq!(row(&v, "symbol", "hot_beta")["samples"], 6);

    // Same name, wrong CRC: rejected with a warning.
    let mut bytes = std::fs::read(dl.join("full.debug")).expect("read");
    bytes.push(0);
    std::fs::write(dl.join("full.debug"), bytes).expect("write");
    let o = prof(
        &db,
        &["--host", "alpha", "--image", "linked", "--debug-dir", &s(&dl), "--format", "json"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("CRC32"), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(rows(&v).iter().all(|r| r["symbol"] != "hot_beta"), "wrong-CRC debug file used: {v:#}");
}

#[test]
fn rebuilt_binary_is_never_symbolized_with_the_new_build() {
    let t = TestDb::new();
    let bin = build_c(t.tmp(), "app", 1, &[]);
    let old = ElfFacts::read(&bin);
    let (alpha, _) = old.func("hot_alpha");
    let keep = t.tmp().join("keep");
    std::fs::create_dir_all(&keep).expect("mkdir");
    std::fs::copy(&bin, keep.join("app-v1")).expect("copy");
    let e = t.epoch(0);
    let hd = t.host(&e, "alpha");
    let ev = event("cpu-clock", 1000);
    let path = bin.display().to_string();
    Image::new(ImageKind::Elf, old.id(), path.as_bytes())
        .profile(&ev)
        .counts(&[(alpha, 12)])
        .period(1000)
        .write(&hd);

    // Rebuild in place with different code.
    build_c(t.tmp(), "app", 2, &["-O0"]);
    let new = ElfFacts::read(&bin);
    assert_ne!(new.build_id, old.build_id);
    let o = prof(&t.root(), &["--host", "alpha", "--image", &path, "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(rows(&v).len(), 1);
    assert_eq!(rows(&v)[0]["symbol"], "[build-id mismatch]");
    let err = stderr(&o);
    assert!(
        err.contains(&path)
            && err.contains(&hex::encode(&old.build_id))
            && err.contains(&hex::encode(&new.build_id)),
        "warning names the path and both ids: {err}"
    );

    // The original build, found by build-id in a --binary-path directory.
    let v = json_ok(
        &t.root(),
        &["--host", "alpha", "--image", &path, "--binary-path", &keep.display().to_string()],
    );
    assert_eq!(row(&v, "symbol", "hot_alpha")["samples"], 12);

    // Or in the build-id cache, filled with --cache-binary.
    let o = prof(&t.root(), &["--cache-binary", &keep.join("app-v1").display().to_string()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let hexid = hex::encode(&old.build_id);
    assert!(t.root().join("binaries").join(&hexid[..2]).join(&hexid[2..]).is_file());
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", &path]);
    assert_eq!(row(&v, "symbol", "hot_alpha")["samples"], 12);

    // A truncated or garbage file at the recorded path: no panic, no symbols from it.
    std::fs::remove_dir_all(t.root().join("binaries")).expect("rm cache");
    let data = std::fs::read(&bin).expect("read");
    for junk in
        [data[..200].to_vec(), data[..data.len() / 3].to_vec(), vec![0x7f; 5000], Vec::new()]
    {
        std::fs::write(&bin, &junk).expect("write junk");
        let o = prof(&t.root(), &["--host", "alpha", "--image", &path, "--format", "json"]);
        assert!(o.status.success(), "{}", stderr(&o));
        let v: Value = serde_json::from_slice(&o.stdout).expect("json");
        assert!(rows(&v).iter().all(|r| r["symbol"] != "hot_alpha"), "{v:#}");
        assert_eq!(v["total_samples"], 12);
    }

    // --cache-binary refuses a file without a build-id.
    let nob = compile(t.tmp(), "nobid", "int main(void){return 0;}", "c", &["-Wl,--build-id=none"]);
    let o = prof(&t.root(), &["--cache-binary", &nob.display().to_string()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("build-id"), "{}", stderr(&o));
}

/// A file at the recorded path whose section headers cannot be parsed is not another build:
/// its samples are NAME+0xOFFSET and the warning says it cannot be parsed (issue 35), not
/// "[build-id mismatch]".
#[test]
fn unparsable_elf_is_reported_as_such_not_as_a_build_id_mismatch() {
    let t = TestDb::new();
    let bin = build_c(t.tmp(), "app", 1, &[]);
    let facts = ElfFacts::read(&bin);
    let (alpha, _) = facts.func("hot_alpha");
    let e = t.epoch(0);
    let hd = t.host(&e, "alpha");
    let path = bin.display().to_string();
    let ev = event("cpu-clock", 1000);
    Image::new(ImageKind::Elf, facts.id(), path.as_bytes())
        .profile(&ev)
        .counts(&[(alpha, 12)])
        .period(1000)
        .write(&hd);
    // e_shoff (ELF64 header, offset 0x28) far past the end of the file.
    let mut data = facts.data.clone();
    data[0x28..0x30].copy_from_slice(&0x7fff_ffff_0000u64.to_le_bytes());
    std::fs::write(&bin, &data).expect("write corrupt binary");
    assert!(object::File::parse(&*data).is_err(), "the corrupt binary still parses");
    let o = prof(&t.root(), &["--host", "alpha", "--image", &path, "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    let symbols: Vec<&str> = rows(&v).iter().filter_map(|r| r["symbol"].as_str()).collect();
    assert_eq!(symbols, [format!("app+{:#x}", alpha & !0xfff)], "{v:#}");
    let err = stderr(&o);
    assert!(err.contains(&path) && err.contains("cannot parse"), "{err}");
    assert!(!err.contains("mismatch"), "{err}");
}

#[test]
fn fallback_identity_checked_by_file_metadata() {
    use std::os::unix::fs::MetadataExt;
    let t = TestDb::new();
    let bin =
        compile(t.tmp(), "nobid", C_PROG, "c", &["-O1", "-DVARIANT=1", "-Wl,--build-id=none"]);
    let data = std::fs::read(&bin).expect("read");
    let facts = ElfFacts { build_id: Vec::new(), data };
    let (alpha, _) = facts.func("hot_alpha");
    let md = std::fs::metadata(&bin).expect("stat");
    let path = bin.display().to_string();
    let id = ImageId::fallback(
        path.as_bytes(),
        md.len(),
        md.mtime() * 1_000_000_000 + md.mtime_nsec(),
        md.ino(),
    );
    let hd = t.host(&t.epoch(0), "alpha");
    let ev = event("cpu-clock", 1000);
    Image::new(ImageKind::Elf, id.clone(), path.as_bytes())
        .profile(&ev)
        .counts(&[(alpha, 5)])
        .period(1000)
        .write(&hd);
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "nobid"]);
    assert_eq!(row(&v, "symbol", "hot_alpha")["samples"], 5);
    // Touch the file (as a rebuild would): no longer verifiable, so not used.
    std::fs::write(&bin, std::fs::read(&bin).expect("read")).expect("rewrite");
    let f = std::fs::File::options().write(true).open(&bin).expect("open");
    f.set_modified(SystemTime::now() + Duration::from_secs(5)).expect("set mtime");
    let o = prof(&t.root(), &["--host", "alpha", "--image", "nobid", "--format", "json"]);
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(rows(&v).iter().all(|r| r["symbol"] != "hot_alpha"), "{v:#}");
    assert!(stderr(&o).contains(&path), "{}", stderr(&o));
}

#[test]
fn ambiguous_basename_lists_matches_and_exits_2() {
    let t = TestDb::new();
    let d1 = t.tmp().join("v1");
    let d2 = t.tmp().join("v2");
    std::fs::create_dir_all(&d1).expect("mkdir");
    std::fs::create_dir_all(&d2).expect("mkdir");
    let b1 = build_c(&d1, "foo", 1, &[]);
    let b2 = build_c(&d2, "foo", 2, &[]);
    let (f1, f2) = (ElfFacts::read(&b1), ElfFacts::read(&b2));
    let ev = event("cpu-clock", 1000);
    let e = t.epoch(0);
    let h1 = t.host(&e, "alpha");
    let h2 = t.host(&e, "beta");
    Image::new(ImageKind::Elf, f1.id(), b1.display().to_string().as_bytes())
        .profile(&ev)
        .counts(&[(f1.func("hot_alpha").0, 8)])
        .period(1000)
        .write(&h1);
    Image::new(ImageKind::Elf, f2.id(), b2.display().to_string().as_bytes())
        .profile(&ev)
        .counts(&[(f2.func("hot_beta").0, 9)])
        .period(1000)
        .write(&h2);
    let o = prof(&t.root(), &["--host", "all", "--image", "foo"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    for (b, f, n, h) in [(&b1, &f1, "8", "alpha"), (&b2, &f2, "9", "beta")] {
        assert!(err.contains(&b.display().to_string()), "{err}");
        assert!(err.contains(&hex::encode(&f.build_id)), "{err}");
        assert!(err.contains(&format!("{n} samples")) && err.contains(h), "{err}");
    }
    // A build-id prefix or the full path chooses.
    let v = json_ok(&t.root(), &["--host", "all", "--image", &hex::encode(&f2.build_id)[..10]]);
    assert_eq!(row(&v, "symbol", "hot_beta")["samples"], 9);
    let v = json_ok(&t.root(), &["--host", "all", "--image", &b1.display().to_string()]);
    assert_eq!(row(&v, "symbol", "hot_alpha")["samples"], 8);
}

#[test]
fn source_lines_and_inlines_from_dwarf() {
    let t = TestDb::new();
    let src = "static inline __attribute__((always_inline)) int helper(int x) {\n\
               \x20   int s = 0;\n\
               \x20   for (int i = 0; i < x; i++) s += i * i;\n\
               \x20   return s;\n\
               }\n\
               __attribute__((noinline)) int outer(int x) {\n\
               \x20   return helper(x) + helper(x + 1);\n\
               }\n\
               int main(int argc, char **argv) { (void)argv; return outer(argc); }\n";
    let bin = compile(t.tmp(), "lines", src, "c", &["-O1", "-g"]);
    let f = ElfFacts::read(&bin);
    let (outer, size) = f.func("outer");
    let hd = t.host(&t.epoch(0), "alpha");
    let ev = event("cpu-clock", 1000);
    let counts: Vec<(u64, u64)> = (0..size).map(|i| (outer + i, 1)).collect();
    let path = bin.display().to_string();
    Image::new(ImageKind::Elf, f.id(), path.as_bytes())
        .profile(&ev)
        .counts(&counts)
        .period(1000)
        .write(&hd);

    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "lines", "--lines"]);
    let r = rows(&v);
    assert!(r.len() >= 2, "several lines expected: {v:#}");
    let mut total = 0;
    for x in r {
        let src = x["source"].as_str().expect("source present with --lines");
        let (file, line) = src.rsplit_once(':').expect("file:line");
        let line: u32 = line.parse().expect("line number");
        assert!(file.ends_with("lines.c"), "{src}");
        assert!((1..=8).contains(&line), "line {line} outside outer/helper: {v:#}");
        total += x["samples"].as_u64().unwrap_or(0);
    }
    assert_eq!(total, size);
    assert!(
        r.iter().any(|x| x["source"].as_str().is_some_and(|s| s.ends_with(":3"))),
        "loop line: {v:#}"
    );

    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "lines", "--inlines"]);
    assert!(row(&v, "symbol", "helper")["samples"].as_u64().unwrap_or(0) > 0, "{v:#}");
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "lines"]);
    assert_eq!(
        row(&v, "symbol", "outer")["samples"],
        size,
        "without --inlines, the outer function"
    );
}

#[test]
fn kernel_and_modules_from_the_epoch_snapshot() {
    let t = TestDb::new();
    let hd = t.host(&t.epoch(0), "alpha");
    let ev = event("cpu-clock", 1000);
    // Addresses that the live kernel cannot have: symbolization must use the snapshot.
    let text = 0xffff_ffff_a100_0000u64;
    let modbase = 0xffff_ffff_c800_0000u64;
    let sym =
        |addr, name: &str, module| KernelSymbol { addr, kind: b't', name: name.into(), module };
    let snap = KallsymsSnapshot {
        kernel_release: "9.9.9-test".into(),
        kernel_build_id: None,
        text_base: text,
        modules: vec![KernelModule {
            name: "fakemod".into(),
            base: modbase,
            size: 0x2000,
            build_id: None,
        }],
        symbols: vec![
            sym(text, "_stext_test", None),
            sym(text + 0x100, "snap_schedule", None),
            sym(text + 0x900, "snap_copy_page", None),
            sym(modbase + 0x10, "fakemod_irq", Some(0)),
            sym(modbase + 0x400, "fakemod_poll", Some(0)),
        ],
    };
    snap.write(&hd.kallsyms_path()).expect("write snapshot");
    let kid = ImageId::special("[kernel.kallsyms]", b"9.9.9-test");
    Image::new(ImageKind::Kernel, kid.clone(), b"[kernel.kallsyms]")
        .profile(&ev)
        .counts(&[(0x100, 5), (0x180, 2), (0x950, 4)])
        .period(1000)
        .write(&hd);
    let mid = ImageId::special("[module]", b"fakemod");
    Image::new(ImageKind::KernelModule, mid.clone(), b"fakemod")
        .profile(&ev)
        .counts(&[(0x20, 3), (0x500, 1)])
        .period(1000)
        .write(&hd);

    for spec in ["kernel", "[kernel.kallsyms]", "vmlinux"] {
        let v = json_ok(&t.root(), &["--host", "alpha", "--image", spec]);
        assert_eq!(row(&v, "symbol", "snap_schedule")["samples"], 7, "{v:#}");
        assert_eq!(row(&v, "symbol", "snap_copy_page")["samples"], 4);
    }
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "fakemod"]);
    assert_eq!(row(&v, "symbol", "fakemod_irq")["samples"], 3);
    assert_eq!(row(&v, "symbol", "fakemod_poll")["samples"], 1);

    let v = json_ok(&t.root(), &["--host", "alpha"]);
    assert_eq!(row(&v, "image", "[kernel.kallsyms]")["kind"], "kernel");
    assert_eq!(row(&v, "image", "[fakemod]")["kind"], "module");

    // A snapshot of another kernel build must not name the samples.
    let hd2 = t.host(&t.epoch(10), "alpha");
    let mut other = snap.clone();
    other.kernel_build_id = Some(vec![0x11; 20]);
    other.write(&hd2.kallsyms_path()).expect("write snapshot");
    let kb = ImageId::BuildId(vec![0x22; 20]);
    Image::new(ImageKind::Kernel, kb.clone(), b"[kernel.kallsyms]")
        .profile(&ev)
        .counts(&[(0x100, 5)])
        .period(1000)
        .write(&hd2);
    let o = prof(&t.root(), &["--host", "alpha", "--image", "kernel", "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(row(&v, "symbol", "[build-id mismatch]")["samples"], 5);
    assert!(stderr(&o).contains(&hex::encode([0x11; 20])), "{}", stderr(&o));
}

#[test]
fn jit_symbols_from_the_profile_header() {
    let t = TestDb::new();
    let hd = t.host(&t.epoch(0), "alpha");
    let ev = event("cpu-clock", 1000);
    let id = ImageId::special("[anon]", b"1234");
    let jit = vec![
        JitSymbol { start: 0x7f00_0000_1000, size: 0x100, name: "LazyCompile:*fib".into() },
        JitSymbol { start: 0x7f00_0000_2000, size: 0x80, name: "_ZN3jit4loopEv".into() },
    ];
    Image::new(ImageKind::Anon, id.clone(), b"[anon:1234:node]")
        .profile(&ev)
        .counts(&[(0x7f00_0000_1010, 6), (0x7f00_0000_2004, 2), (0x7f00_0000_9000, 1)])
        .period(1000)
        .jit_symbols(jit)
        .write(&hd);
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "[anon:1234"]);
    assert_eq!(row(&v, "symbol", "LazyCompile:*fib")["samples"], 6);
    assert_eq!(row(&v, "symbol", "jit::loop()")["samples"], 2);
    assert_eq!(v["total_samples"], 9);
}

/// `--image anon` (and `[anon]`, `anon:PID`) names the JIT regions `[anon:PID:comm]`, as
/// `--image kernel` names `[kernel.kallsyms]` (issue 35). Several regions merge by symbol name,
/// as with `--image [anon`.
#[test]
fn image_anon_names_the_jit_regions() {
    let t = TestDb::new();
    let hd = t.host(&t.epoch(0), "alpha");
    let ev = event("cpu-clock", 1000);
    let jit = |name: &str| vec![JitSymbol { start: 0x1000, size: 0x100, name: name.into() }];
    let node = ImageId::special("[anon]", b"1234");
    Image::new(ImageKind::Anon, node.clone(), b"[anon:1234:node]")
        .profile(&ev)
        .counts(&[(0x1010, 6)])
        .period(1000)
        .jit_symbols(jit("fib"))
        .write(&hd);
    for spec in ["anon", "[anon]", "anon:1234", "[anon:1234:node]"] {
        let v = json_ok(&t.root(), &["--host", "alpha", "--image", spec]);
        assert_eq!(row(&v, "symbol", "fib")["samples"], 6, "--image {spec}");
    }
    let java = ImageId::special("[anon]", b"77");
    Image::new(ImageKind::Anon, java.clone(), b"[anon:77:java]")
        .profile(&ev)
        .counts(&[(0x1010, 3)])
        .period(1000)
        .jit_symbols(jit("loop"))
        .write(&hd);
    for spec in ["anon", "[anon"] {
        let v = json_ok(&t.root(), &["--host", "alpha", "--image", spec]);
        assert_eq!(row(&v, "symbol", "fib")["samples"], 6, "--image {spec}");
        assert_eq!(row(&v, "symbol", "loop")["samples"], 3, "--image {spec}");
    }
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "anon:77"]);
    assert_eq!(row(&v, "symbol", "loop")["samples"], 3);
    // The who-table filter reads `--image anon` the same way.
    let mut who = profile_format::WhoTable::new("alpha", &hd.epoch.to_string());
    for (command, image, n) in [("node", "[anon:1234:node]", 6), ("java", "[anon:77:java]", 3)] {
        let key = profile_format::WhoKey {
            cgroup: "/".into(),
            command: command.into(),
            pid: 0,
            image: image.into(),
            event: "cpu-clock".into(),
        };
        who.add(key, n);
    }
    who.write(&hd.who_path()).expect("who table");
    for (spec, want) in [("anon", vec!["node", "java"]), ("anon:77", vec!["java"])] {
        let v = json_ok(&t.root(), &["--host", "alpha", "--by", "command", "--image", spec]);
        let got: Vec<&str> = rows(&v).iter().filter_map(|r| r["command"].as_str()).collect();
        assert_eq!(got, want, "--by command --image {spec}: {v:#}");
    }
}

#[test]
fn help_documents_schema_and_generate_writes_man_and_completions() {
    let o = Command::new(env!("CARGO_BIN_EXE_dcpiprof")).arg("--help").output().expect("run");
    let s = stdout(&o);
    for needle in [
        "JSON SCHEMA",
        "\"total_samples\"",
        "\"cumulative_percent\"",
        "--cache-binary",
        "build-id mismatch",
        "--keep-going",
        "--symbol-cache",
        "--no-symbol-cache",
        "--verbose",
        "SYMBOL CACHE",
        "IMAGE+0xOFFSET",
        "EXIT STATUS",
    ] {
        assert!(s.contains(needle), "--help lacks {needle}: {s}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_dcpiprof"))
        .args(["--generate", "man"])
        .output()
        .expect("run");
    assert!(o.status.success());
    let man = stdout(&o);
    assert!(man.contains(".TH dcpiprof 1") || man.contains(".TH DCPIPROF 1"), "{man}");
    for shell in ["complete-bash", "complete-zsh", "complete-fish"] {
        let o = Command::new(env!("CARGO_BIN_EXE_dcpiprof"))
            .args(["--generate", shell])
            .output()
            .expect("run");
        assert!(o.status.success() && stdout(&o).contains("image"), "{shell}");
    }
}

/// This machine's vDSO: its build-id and the offset of `__vdso_clock_gettime` in it.
fn live_vdso_clock_gettime() -> (Vec<u8>, u64) {
    let vdso = debuginfo::live_vdso().expect("this process has a vDSO");
    let bid = symbolize::elf_identity(&vdso)
        .expect("vDSO is ELF")
        .build_id
        .expect("x86_64 vDSOs carry a build-id");
    let facts = ElfFacts { build_id: bid.clone(), data: vdso };
    let (off, _) = facts.func("__vdso_clock_gettime");
    (bid, off)
}

#[test]
fn vdso_symbolized_from_this_machine_when_the_build_id_matches() {
    let (bid, off) = live_vdso_clock_gettime();
    let t = TestDb::new();
    let hd = t.host(&t.epoch(0), "alpha");
    let ev = event("cpu-clock", 1000);
    Image::new(ImageKind::Vdso, ImageId::BuildId(bid), b"[vdso]")
        .profile(&ev)
        .counts(&[(off, 4)])
        .period(1000)
        .write(&hd);
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "[vdso]"]);
    let top = rows(&v)[0]["symbol"].as_str().unwrap_or("").to_owned();
    assert!(top.ends_with("clock_gettime"), "{v:#}");
    assert_eq!(rows(&v)[0]["samples"], 4);

    // Another kernel's vDSO (unknown build-id): offsets, never this machine's symbols.
    let hd2 = t.host(&t.epoch(10), "alpha");
    Image::new(ImageKind::Vdso, ImageId::BuildId(vec![9; 20]), b"[vdso]")
        .profile(&ev)
        .counts(&[(off, 4)])
        .period(1000)
        .write(&hd2);
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "[vdso]"]);
    assert_eq!(rows(&v)[0]["symbol"], format!("[vdso]+{off:#x}"));
}

/// Issue 34: a vDSO frame of a call stack is named as the flat report names the vDSO's samples
/// (before, stack frames in the vDSO were always `[vdso]+0xOFFSET`), in folded stacks and for
/// `--callers`.
#[test]
fn vdso_frames_in_stacks_are_named_as_in_flat_reports() {
    let (bid, off) = live_vdso_clock_gettime();
    let t = TestDb::new();
    let hd = t.host(&t.epoch(0), "alpha");
    let ev = event("cpu-clock", 1000);
    let vid = ImageId::BuildId(bid);
    Image::new(ImageKind::Vdso, vid.clone(), b"[vdso]")
        .profile(&ev)
        .counts(&[(off, 4)])
        .period(1000)
        .write(&hd);
    let flat = json_ok(&t.root(), &["--host", "alpha", "--image", "[vdso]"]);
    let name = rows(&flat)[0]["symbol"].as_str().unwrap_or("").to_owned();
    assert!(name.ends_with("clock_gettime"), "{flat:#}");

    let mut st = profile_format::StackProfile::new(&hd.host, hd.epoch.as_str(), "cpu-clock");
    let img = |kind, id: &ImageId, path: &[u8]| profile_format::StackImage {
        kind,
        id: id.clone(),
        path: path.to_vec(),
    };
    let a = st.image_index(&img(ImageKind::Vdso, &vid, b"[vdso]"));
    let app = ImageId::BuildId(vec![7; 20]);
    let b = st.image_index(&img(ImageKind::Elf, &app, b"/opt/app"));
    st.add(&[(a, off), (b, 0x1000)], false, 4);
    st.write(&hd.stacks_path("cpu-clock")).expect("write stacks");

    let o = prof(&t.root(), &["--host", "alpha", "--format", "folded"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let folded = stdout(&o);
    assert!(folded.lines().any(|l| l.ends_with(&format!(";{name} 4"))), "{name}: {folded}");
    // The vDSO function is found by its name as a callee.
    let o = prof(&t.root(), &["--host", "alpha", "--callers", &name, "--format", "json"]);
    assert!(o.status.success(), "--callers {name}: {}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert!(rows(&v).iter().any(|r| r["samples"] == 4), "--callers {name}: {v:#}");
}

// ---------------------------------------------------------------------------------------------
// Symbol cache

fn stat_of(err: &str, name: &str) -> u64 {
    let line = err.lines().find(|l| l.contains("stats:")).unwrap_or_else(|| panic!("{err}"));
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {line}"))
}

#[test]
fn symbol_cache_second_run_skips_symbols_and_dwarf_with_identical_results() {
    let t = TestDb::new();
    let bin = build_c(t.tmp(), "cached", 5, &["-g"]);
    let f = ElfFacts::read(&bin);
    let (alpha, asz) = f.func("hot_alpha");
    let (beta, _) = f.func("hot_beta");
    let hd = t.host(&t.epoch(0), "alpha");
    let ev = event("cpu-clock", 1000);
    let counts: Vec<(u64, u64)> =
        (0..asz).map(|i| (alpha + i, 1 + i % 3)).chain([(beta, 7), (0x7fff_0000, 1)]).collect();
    let path = bin.display().to_string();
    Image::new(ImageKind::Elf, f.id(), path.as_bytes())
        .profile(&ev)
        .counts(&counts)
        .period(1000)
        .write(&hd);
    let cache = t.tmp().join("c").join("symbols.sqlite");
    let cache_s = cache.display().to_string();
    let run = |extra: &[&str]| -> (String, String) {
        let mut a = vec!["--host", "alpha", "--image", "cached", "--format", "json", "-v"];
        a.extend_from_slice(extra);
        let o = prof(&t.root(), &a);
        assert!(o.status.success(), "{a:?}: {}", stderr(&o));
        (stdout(&o), stderr(&o))
    };
    for mode in [&["--lines"][..], &["--inlines"], &[]] {
        let with = |more: &[&'static str]| -> Vec<String> {
            mode.iter().chain(more).map(ToString::to_string).collect()
        };
        let cached = |m: &[&str]| -> Vec<String> {
            let mut v: Vec<String> = m.iter().map(ToString::to_string).collect();
            v.extend(["--symbol-cache".to_owned(), cache_s.clone()]);
            v
        };
        let strs = |v: &[String]| -> Vec<String> { v.to_vec() };
        let call = |v: Vec<String>| {
            let r: Vec<&str> = v.iter().map(String::as_str).collect();
            run(&r)
        };
        let (cold, e1) = call(cached(mode));
        let (warm, e2) = call(strs(&cached(mode)));
        assert_eq!(cold, warm, "{mode:?}: identical results from the cache");
        assert_eq!(stat_of(&e2, "symbol_cache_hits"), 1, "{e2}");
        assert_eq!(stat_of(&e2, "elf_tables_built"), 0, "warm run parses no symbols: {e2}");
        assert_eq!(stat_of(&e2, "dwarf_loads"), 0, "warm run loads no DWARF: {e2}");
        if !mode.is_empty() {
            assert!(stat_of(&e1, "dwarf_loads") <= 1, "{e1}");
            if mode == ["--lines"] {
                assert!(cold.contains("cached.c:"), "DWARF was used: {cold}");
            }
            assert!(stat_of(&e1, "dwarf_loads") == 1 || mode != ["--lines"], "{e1}");
        }
        let (nocache, e3) = call(with(&["--no-symbol-cache"]));
        assert_eq!(nocache, cold);
        assert_eq!(stat_of(&e3, "elf_tables_built"), 1, "{e3}");
    }
    assert!(cache.is_file());

    // The default location follows XDG_CACHE_HOME.
    let (_, e) = run(&[]);
    assert_eq!(stat_of(&e, "symbol_cache_misses"), 1, "{e}");
    assert!(t.tmp().join("cache/dcpi/symbols.sqlite").is_file());
    let (_, e) = run(&[]);
    assert_eq!(stat_of(&e, "symbol_cache_hits"), 1, "{e}");

    // A corrupt cache file: warning, rebuilt, same answer, no failure.
    let (good, _) = run(&["--lines", "--symbol-cache", &cache_s]);
    for suffix in ["-wal", "-shm"] {
        drop(std::fs::remove_file(format!("{cache_s}{suffix}")));
    }
    std::fs::write(&cache, vec![0x5a; 10_000]).expect("clobber cache");
    let (again, e) = run(&["--lines", "--symbol-cache", &cache_s]);
    assert_eq!(again, good);
    assert!(e.contains("corrupt") && e.contains(&cache_s), "{e}");
    let (_, e) = run(&["--lines", "--symbol-cache", &cache_s]);
    assert_eq!(stat_of(&e, "symbol_cache_hits"), 1, "rebuilt cache is used again: {e}");

    // Concurrent runs on a fresh cache all succeed with the same result.
    let fresh = t.tmp().join("fresh.sqlite");
    let kids: Vec<_> = (0..8)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_dcpiprof"))
                .arg("--db")
                .arg(t.root())
                .args(["--no-system-debug", "--host", "alpha", "--image", "cached", "--lines"])
                .args(["--format", "json", "--symbol-cache"])
                .arg(&fresh)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for k in kids {
        let o = k.wait_with_output().expect("wait");
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(stdout(&o), good);
        assert!(stderr(&o).is_empty(), "no warnings expected: {}", stderr(&o));
    }
}

#[test]
fn stripped_or_unreadable_binary_gives_offsets_and_one_warning() {
    let t = TestDb::new();
    let full = build_c(t.tmp(), "full", 4, &[]);
    let f = ElfFacts::read(&full);
    let (beta, _) = f.func("hot_beta");
    let dir = t.tmp().join("s");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let stripped = dir.join("libstrip.so.1");
    let o = Command::new("objcopy")
        .arg("--strip-all")
        .arg(&full)
        .arg(&stripped)
        .output()
        .expect("objcopy");
    assert!(o.status.success());
    let hd = t.host(&t.epoch(0), "alpha");
    let ev = event("cpu-clock", 1000);
    let sp = stripped.display().to_string();
    Image::new(ImageKind::Elf, f.id(), sp.as_bytes())
        .profile(&ev)
        .counts(&[(beta, 5)])
        .period(1000)
        .write(&hd);
    let o = prof(&t.root(), &["--host", "alpha", "--image", "libstrip.so.1", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    let want = format!("libstrip.so.1+{:#x}", beta & !0xfff);
    assert_eq!(row(&v, "symbol", &want)["samples"], 5, "{v:#}");
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&sp) && err.contains("--debug-dir") && err.contains("stripped"), "{err}");

    // Unreadable: the recorded path is now a directory.
    std::fs::remove_file(&stripped).expect("rm");
    std::fs::create_dir(&stripped).expect("mkdir in its place");
    let o = prof(&t.root(), &["--host", "alpha", "--image", "libstrip.so.1", "--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(row(&v, "symbol", &want)["samples"], 5, "{v:#}");
    let err = stderr(&o);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&sp) && err.contains("--binary-path"), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Symbolization across kinds of binaries

/// Virtual address of a symbol (to tell whether offsets and addresses differ).
fn vaddr_of(f: &ElfFacts, name: &str) -> u64 {
    let o = object::File::parse(&*f.data).expect("parse elf");
    o.symbols()
        .find(|s| s.name().is_ok_and(|n| n == name))
        .map(|s| s.address())
        .unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn pie_non_pie_and_shared_library_offsets() {
    let t = TestDb::new();
    let ev = event("cpu-clock", 1000);
    let hd = t.host(&t.epoch(0), "alpha");
    let pie = build_c(t.tmp(), "pieprog", 6, &["-fPIE", "-pie"]);
    let nopie = build_c(t.tmp(), "nopieprog", 7, &["-fno-pie", "-no-pie"]);
    let lib_src = r#"
__attribute__((noinline)) int lib_hot(int x) { int s = 0; for (int i = 0; i < x; i++) s += i * 5; return s; }
__attribute__((noinline)) int lib_cold(int x) { return x * 11; }
int lib_entry(int x) { return lib_hot(x) + lib_cold(x); }
"#;
    let lib = compile(t.tmp(), "libdemo.so", lib_src, "c", &["-O1", "-shared", "-fPIC"]);
    let cases = [
        (&pie, "pieprog", "hot_alpha", "hot_beta"),
        (&nopie, "nopieprog", "hot_alpha", "hot_beta"),
        (&lib, "libdemo.so", "lib_hot", "lib_cold"),
    ];
    for (bin, _, a, b) in cases {
        let f = ElfFacts::read(bin);
        let (oa, _) = f.func(a);
        let (ob, _) = f.func(b);
        let path = bin.display().to_string();
        Image::new(ImageKind::Elf, f.id(), path.as_bytes())
            .profile(&ev)
            .counts(&[(oa, 6), (ob, 4)])
            .period(1000)
            .write(&hd);
    }
    // The non-PIE executable is linked at 0x400000: its offsets differ from its addresses.
    let nf = ElfFacts::read(&nopie);
    assert!(vaddr_of(&nf, "hot_alpha") >= 0x400000);
    assert_ne!(nf.func("hot_alpha").0, vaddr_of(&nf, "hot_alpha"));
    let v = json_ok(&t.root(), &["--host", "alpha"]);
    assert_eq!(rows(&v).len(), 3, "{v:#}");
    for (_, name, a, b) in cases {
        let v = json_ok(&t.root(), &["--host", "alpha", "--image", name]);
        assert_eq!(row(&v, "symbol", a)["samples"], 6, "{name}: {v:#}");
        assert_eq!(row(&v, "symbol", b)["samples"], 4, "{name}: {v:#}");
        assert!(approx(row(&v, "symbol", a)["percent"].as_f64().unwrap_or(0.0), 60.0));
    }
}

#[test]
fn rust_v0_and_legacy_mangled_names_are_demangled() {
    let t = TestDb::new();
    let ev = event("cpu-clock", 1000);
    let hd = t.host(&t.epoch(0), "alpha");
    let src = t.tmp().join("rsmangle.rs");
    std::fs::write(
        &src,
        "#[inline(never)] pub fn crunch(n: u64) -> u64 { (0..n).map(|i| i ^ 3).sum() }\n\
         fn main() { println!(\"{}\", crunch(std::env::args().count() as u64)); }\n",
    )
    .expect("write rs");
    for scheme in ["v0", "legacy"] {
        let out = t.tmp().join(format!("rs_{scheme}"));
        let mut cmd = Command::new("rustc");
        if scheme == "legacy" {
            // Choosing legacy explicitly is still an unstable option on stable toolchains.
            cmd.env("RUSTC_BOOTSTRAP", "1").args(["-Z", "unstable-options"]);
        }
        let o = cmd
            .args(["-C", "opt-level=1", "-C", &format!("symbol-mangling-version={scheme}")])
            .args(["-C", "link-arg=-Wl,--build-id=sha1", "-o"])
            .arg(&out)
            .arg(&src)
            .output()
            .expect("rustc");
        assert!(o.status.success(), "rustc {scheme}: {}", String::from_utf8_lossy(&o.stderr));
        let f = ElfFacts::read(&out);
        let names: Vec<String> = object::File::parse(&*f.data)
            .expect("parse")
            .symbols()
            .filter_map(|s| s.name().ok().map(str::to_owned))
            .collect();
        let mangled = names
            .iter()
            .find(|n| match scheme {
                "v0" => n.starts_with("_RNv") && n.ends_with("8rsmangle6crunch"),
                _ => n.starts_with("_ZN8rsmangle6crunch17h"),
            })
            .unwrap_or_else(|| panic!("{scheme}: no mangled crunch among {} symbols", names.len()));
        let (off, _) = f.func(mangled);
        let path = out.display().to_string();
        Image::new(ImageKind::Elf, f.id(), path.as_bytes())
            .profile(&ev)
            .counts(&[(off, 3)])
            .period(1000)
            .write(&hd);
        let v = json_ok(&t.root(), &["--host", "alpha", "--image", &format!("rs_{scheme}")]);
        assert_eq!(row(&v, "symbol", "rsmangle::crunch")["samples"], 3, "{scheme}: {v:#}");
    }
}

// ---------------------------------------------------------------------------------------------
// Golden outputs (table, JSON, CSV). Regenerate with DCPI_UPDATE_GOLDEN=1 and review the diff.

/// A database whose content does not depend on this machine or on compiler output: kernel and
/// module symbols from a snapshot, JIT symbols from the profile, an ELF image whose binary is
/// absent (offset rows), unknown samples; two hosts, two events, one multiplexed.
fn golden_db(t: &TestDb) {
    let e = t.epoch(0);
    let clock = event("cpu-clock", 1000);
    let faults = event("page-faults", 10);
    let text = 0xffff_ffff_a100_0000u64;
    let modbase = 0xffff_ffff_c800_0000u64;
    let sym =
        |addr, name: &str, module| KernelSymbol { addr, kind: b't', name: name.into(), module };
    let snap = KallsymsSnapshot {
        kernel_release: "9.9.9-golden".into(),
        kernel_build_id: None,
        text_base: text,
        modules: vec![KernelModule {
            name: "goldmod".into(),
            base: modbase,
            size: 0x2000,
            build_id: None,
        }],
        symbols: vec![
            sym(text, "_stext", None),
            sym(text + 0x100, "schedule", None),
            sym(text + 0x900, "copy_page", None),
            sym(text + 0x2000, "do_syscall_64", None),
            sym(modbase + 0x10, "goldmod_irq", Some(0)),
        ],
    };
    let kid = ImageId::special("[kernel.kallsyms]", b"9.9.9-golden");
    let mid = ImageId::special("[module]", b"goldmod");
    let lib = ImageId::BuildId((0..20u8).collect());
    let jid = ImageId::special("[anon]", b"4242");
    let jit = vec![
        JitSymbol { start: 0x7f00_0000_1000, size: 0x100, name: "LazyCompile:*render".into() },
        JitSymbol { start: 0x7f00_0000_2000, size: 0x80, name: "_ZN3jit4loopEv".into() },
    ];
    for (host, scale) in [("alpha", 1u64), ("beta", 3)] {
        let hd = t.host(&e, host);
        snap.write(&hd.kallsyms_path()).expect("snapshot");
        let k = [(0x100, 5 * scale), (0x180, 2), (0x950, 4), (0x2010, 1), (0x5000, 2)];
        Image::new(ImageKind::Kernel, kid.clone(), b"[kernel.kallsyms]")
            .profile(&clock)
            .counts(&k)
            .period(1000)
            .write(&hd);
        Image::new(ImageKind::KernelModule, mid.clone(), b"goldmod")
            .profile(&clock)
            .counts(&[(0x20, 3)])
            .period(1000)
            .write(&hd);
        Image::new(ImageKind::Elf, lib.clone(), b"/usr/lib/libgolden.so.1")
            .profile(&clock)
            .counts(&[(0x1234, 9 * scale), (0x1ff0, 1), (0x8010, 4)])
            .period(2000)
            .write(&hd);
        Image::new(ImageKind::Elf, lib.clone(), b"/usr/lib/libgolden.so.1")
            .profile(&faults)
            .counts(&[(0x1234, 6)])
            .period(10)
            .write(&hd);
        Image::new(ImageKind::Anon, jid.clone(), b"[anon:4242:node]")
            .profile(&clock)
            .counts(&[(0x7f00_0000_1010, 6), (0x7f00_0000_2004, 2), (0x7f00_0000_9000, 1)])
            .period(1000)
            .jit_symbols(jit.clone())
            .write(&hd);
        Image::new(ImageKind::Unknown, unknown_id(), b"[unknown]")
            .profile(&clock)
            .counts(&[(0, 7), (1, scale)])
            .period(1000)
            .write(&hd);
    }
    let summary = HostSummary {
        format_version: 1,
        host: "alpha".into(),
        epoch: e.to_string(),
        events: vec![
            EventSummary {
                desc: Some(clock.clone()),
                source: "software".into(),
                samples: 0,
                total_period: 0,
                time_enabled_ns: 1000,
                time_running_ns: 1000,
            },
            EventSummary {
                desc: Some(faults.clone()),
                source: "software".into(),
                samples: 6,
                total_period: 60,
                time_enabled_ns: 3000,
                time_running_ns: 2000,
            },
        ],
        ..HostSummary::default()
    };
    summary.write(&t.host(&e, "alpha").summary_path()).expect("summary");
}

#[test]
fn golden_table_json_and_csv_outputs() {
    let t = TestDb::new();
    golden_db(&t);
    let (golden_dir, update) = golden_dir();
    let cases: &[(&str, &[&str])] = &[
        ("images", &["--host", "all"]),
        ("images-alpha-faults", &["--host", "alpha", "--event", "page-faults,cpu-clock"]),
        ("kernel", &["--host", "all", "--image", "kernel"]),
        ("module", &["--host", "alpha", "--image", "goldmod"]),
        ("missing-binary", &["--host", "all", "--image", "libgolden.so.1"]),
        ("jit", &["--host", "beta", "--image", "[anon:4242"]),
        ("unknown", &["--host", "all", "--image", "unknown", "--limit", "1"]),
    ];
    let mut mismatches = Vec::new();
    for (name, args) in cases {
        for (fmt, ext) in [("table", "txt"), ("json", "json"), ("csv", "csv")] {
            // A relative --db keeps the temporary directory's name out of the output.
            let o = Command::new(env!("CARGO_BIN_EXE_dcpiprof"))
                .current_dir(t.tmp())
                .args(["--db", "db", "--no-system-debug", "--no-symbol-cache", "--format", fmt])
                .args(*args)
                .output()
                .expect("run dcpiprof");
            assert!(o.status.success(), "{name} {fmt}: {}", stderr(&o));
            let file = golden_dir.join(format!("{name}.{ext}"));
            check_golden(&file, &o, update, &mut mismatches);
        }
    }
    assert_no_golden_mismatch(&mismatches);
}

#[test]
fn hostile_symbol_names_are_escaped_in_every_format() {
    let t = TestDb::new();
    let hd = t.host(&t.epoch(0), "alpha");
    let ev = event("cpu-clock", 1000);
    // An ELF symbol whose name is not UTF-8 and holds an ESC (raw bytes in the assembly).
    let name: &[u8] = b"\"bad\xff\x1bname\"";
    let asm = asm_calling(name);
    let src = t.tmp().join("hostile.s");
    std::fs::write(&src, &asm).expect("write asm");
    let bin = t.tmp().join("hostile");
    let o = Command::new("cc")
        .args(["-Wl,--build-id=sha1", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(o.status.success(), "cc: {}", String::from_utf8_lossy(&o.stderr));
    let f = ElfFacts::read(&bin);
    let (off, _) = f.func(b"bad\xff\x1bname");
    let path = bin.display().to_string();
    Image::new(ImageKind::Elf, f.id(), path.as_bytes())
        .profile(&ev)
        .counts(&[(off, 5)])
        .period(1000)
        .write(&hd);
    // JIT symbols (perf maps are text anyone can write): ESC, newline, a broken mangled name.
    let jit = vec![
        JitSymbol { start: 0x1000, size: 0x10, name: "js\u{1b}[2Jclear".into() },
        JitSymbol { start: 0x2000, size: 0x10, name: "two\nlines".into() },
        JitSymbol { start: 0x3000, size: 0x10, name: "_ZN3foo".into() },
        JitSymbol { start: 0x4000, size: 0x10, name: "_RNvCs_broken\u{7f}".into() },
    ];
    let anon = ImageId::special("[anon]", b"77");
    let counts = [(0x1000, 4), (0x2000, 3), (0x3000, 2), (0x4000, 1)];
    Image::new(ImageKind::Anon, anon.clone(), b"[anon:77:js]")
        .profile(&ev)
        .counts(&counts)
        .period(1000)
        .jit_symbols(jit)
        .write(&hd);

    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "hostile"]);
    assert_eq!(row(&v, "symbol", "bad\\xff\\u{1b}name")["samples"], 5, "{v:#}");
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "[anon:77"]);
    assert_eq!(row(&v, "symbol", "js\\u{1b}[2Jclear")["samples"], 4, "{v:#}");
    assert_eq!(row(&v, "symbol", "two\\nlines")["samples"], 3, "{v:#}");
    assert_eq!(row(&v, "symbol", "_ZN3foo")["samples"], 2, "{v:#}");
    assert_eq!(row(&v, "symbol", "_RNvCs_broken\\u{7f}")["samples"], 1, "{v:#}");
    for image in ["hostile", "[anon:77"] {
        for format in ["table", "csv", "json"] {
            let o = prof(&t.root(), &["--host", "alpha", "--image", image, "--format", format]);
            assert!(o.status.success(), "{image} {format}: {}", stderr(&o));
            let raw = &o.stdout;
            assert!(!raw.contains(&0x1b) && !raw.contains(&0x7f), "{image} {format}: {raw:?}");
            assert!(std::str::from_utf8(raw).is_ok(), "{image} {format}: not UTF-8");
            let rows = stdout(&o).lines().filter(|l| !l.starts_with('#')).count();
            // A name with a newline must not add a line: header + one line per row.
            if format != "json" {
                let want = if image == "hostile" { 2 } else { 5 };
                assert_eq!(rows, want, "{image} {format}: {}", stdout(&o));
            }
        }
    }
}

#[test]
fn raw_names_shows_mangled_symbols() {
    let t = TestDb::new();
    let src = "namespace engine { __attribute__((noinline)) int spin(int n) { int s = 0; \
               for (int i = 0; i < n; i++) s += i; return s; } }\n\
               int main(int argc, char**) { return engine::spin(argc); }\n";
    let bin = compile(t.tmp(), "rawcxx", src, "cpp", &["-O1"]);
    let f = ElfFacts::read(&bin);
    let (spin, _) = f.func("_ZN6engine4spinEi");
    let hd = t.host(&t.epoch(0), "alpha");
    let ev = event("cpu-clock", 1000);
    let path = bin.display().to_string();
    Image::new(ImageKind::Elf, f.id(), path.as_bytes())
        .profile(&ev)
        .counts(&[(spin, 7)])
        .period(1000)
        .write(&hd);
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "rawcxx"]);
    assert_eq!(row(&v, "symbol", "engine::spin(int)")["samples"], 7, "{v:#}");
    let v = json_ok(&t.root(), &["--host", "alpha", "--image", "rawcxx", "--raw-names"]);
    assert_eq!(row(&v, "symbol", "_ZN6engine4spinEi")["samples"], 7, "{v:#}");
}

// ---------------------------------------------------------------------------------------------
// Summary index (fleet-scale per-image reports)

#[test]
fn per_image_report_from_summary_index_equals_report_from_profiles() {
    let t = TestDb::new();
    let clock = event("cpu-clock", 1000);
    let faults = event("page-faults", 10);
    let mut dirs = Vec::new();
    for (ei, secs) in [0u64, 3600].into_iter().enumerate() {
        let e = t.epoch(secs);
        for (hi, host) in ["alpha", "beta", "gamma"].into_iter().enumerate() {
            let hd = t.host(&e, host);
            let k = (ei * 3 + hi) as u64 + 1;
            for i in 0..6u8 {
                let id = ImageId::BuildId(vec![i + 1; 20]);
                let path = format!("/usr/lib/lib{i}.so");
                let counts: Vec<(u64, u64)> =
                    (0..5).map(|o| (o * 64, k * (o + 1) + u64::from(i))).collect();
                // Periods differ per host so that each profile is weighted on its own.
                Image::new(ImageKind::Elf, id.clone(), path.as_bytes())
                    .profile(&clock)
                    .counts(&counts)
                    .period(900 + 37 * k)
                    .write(&hd);
                if i % 2 == 0 {
                    Image::new(ImageKind::Elf, id.clone(), path.as_bytes())
                        .profile(&faults)
                        .counts(&counts[..2])
                        .period(10)
                        .write(&hd);
                }
            }
            let kid = ImageId::special("[kernel]", b"6.1");
            Image::new(ImageKind::Kernel, kid.clone(), b"[kernel.kallsyms]")
                .profile(&clock)
                .counts(&[(16, 7 * k)])
                .period(1000)
                .write(&hd);
            let odd = ImageId::from_build_id(&[0xee; 20]).expect("id");
            Image::new(ImageKind::Elf, odd.clone(), b"/tmp/\xffodd\nname")
                .profile(&clock)
                .counts(&[(0, k)])
                .period(1000)
                .write(&hd);
            Image::new(ImageKind::Unknown, unknown_id(), b"")
                .profile(&clock)
                .counts(&[(1, 2 * k)])
                .period(1000)
                .write(&hd);
            let summary = HostSummary {
                format_version: 1,
                host: host.into(),
                epoch: e.to_string(),
                events: vec![
                    EventSummary {
                        desc: Some(clock.clone()),
                        source: "software".into(),
                        ..Default::default()
                    },
                    EventSummary {
                        desc: Some(faults.clone()),
                        source: "software".into(),
                        time_enabled_ns: 3000 + k,
                        time_running_ns: 1000,
                        ..Default::default()
                    },
                ],
                ..HostSummary::default()
            };
            summary.write(&hd.summary_path()).expect("write summary");
            dirs.push(hd);
        }
    }
    let runs = |label: &str| {
        let mut outs = Vec::new();
        for args in [
            &["--epoch", "all", "--host", "all", "--format", "json", "--verbose"][..],
            &["--epoch", "all", "--host", "all", "--format", "csv"][..],
            &["--epoch", "all", "--host", "beta", "--event", "page-faults"][..],
            &["--epoch", "all", "--host", "all", "--by", "epoch", "--verbose"][..],
        ] {
            let o = prof(&t.root(), args);
            assert!(o.status.success(), "{label}: dcpiprof {args:?}: {}", stderr(&o));
            outs.push((stdout(&o), stderr(&o)));
        }
        outs
    };
    // Old database: no index, every profile is read.
    let from_profiles = runs("profiles");
    let err = &from_profiles[0].1;
    assert_eq!(stat_of(err, "summary_indexes_used"), 0, "{err}");
    assert_eq!(stat_of(err, "profiles_read"), 6 * (6 + 3 + 3), "{err}");

    // The daemon's index in every summary: no profile is opened, same bytes out.
    for hd in &dirs {
        let mut s = HostSummary::read(&hd.summary_path()).expect("summary");
        s.index = Some(profile_format::SummaryIndex::of_host_dir(hd).expect("index"));
        s.write(&hd.summary_path()).expect("write summary");
    }
    let from_index = runs("index");
    let err = &from_index[0].1;
    assert_eq!(stat_of(err, "summary_indexes_used"), 6, "{err}");
    assert_eq!(stat_of(err, "profiles_read"), 0, "{err}");
    for (a, b) in from_profiles.iter().zip(&from_index) {
        assert_eq!(a.0, b.0, "index and profiles must give the same report");
    }
    let v: Value = serde_json::from_str(&from_index[0].0).expect("json");
    assert!(rows(&v).len() >= 8 && v["total_samples"].as_u64().unwrap_or(0) > 0, "{v:#}");

    // Mixed: one host-epoch written before the index (or whose index is unusable) falls back
    // to its profiles; the numbers do not change.
    let mut s = HostSummary::read(&dirs[1].summary_path()).expect("summary");
    s.index = None;
    s.write(&dirs[1].summary_path()).expect("write summary");
    let mut s = HostSummary::read(&dirs[4].summary_path()).expect("summary");
    if let Some(idx) = s.index.as_mut() {
        idx.images[0].event = 99;
    }
    s.write(&dirs[4].summary_path()).expect("write summary");
    let mixed = runs("mixed");
    let err = &mixed[0].1;
    assert_eq!(stat_of(err, "summary_indexes_used"), 4, "{err}");
    assert_eq!(stat_of(err, "profiles_read"), 2 * 12, "{err}");
    for (a, b) in from_profiles.iter().zip(&mixed) {
        assert_eq!(a.0, b.0, "a partial index must give the same report");
    }

    // Per-symbol report without any index: every directory listed, one profile read per
    // other image identity.
    let sym_args = ["--epoch", "all", "--host", "all", "--image", "lib0.so", "--format", "json"];
    let sym = |label: &str| {
        let mut a = sym_args.to_vec();
        a.push("--verbose");
        let o = prof(&t.root(), &a);
        assert!(o.status.success(), "{label}: {}", stderr(&o));
        (stdout(&o), stderr(&o))
    };
    for hd in &dirs {
        let mut s = HostSummary::read(&hd.summary_path()).expect("summary");
        s.index = None;
        s.write(&hd.summary_path()).expect("write summary");
    }
    let (sym_plain, err) = sym("no index");
    // lib0: 2 events x 6 host-epochs; 7 other identities (lib1-5, kernel, odd) read once.
    assert_eq!(stat_of(&err, "profiles_read"), 12 + 7, "{err}");

    // The binary index (summary.idx, as the daemon writes it now; summary.json without
    // index): same bytes out, no profile read by the per-image report, and the per-symbol
    // report opens only the image's files in the closed epoch (the newest one is listed).
    for hd in &dirs {
        let mut s = HostSummary::read(&hd.summary_path()).expect("summary");
        s.index = Some(profile_format::SummaryIndex::of_host_dir(hd).expect("index"));
        sumidx::write(&s, &hd.summary_index_path()).expect("write summary.idx");
    }
    let binary = runs("binary index");
    let err = &binary[0].1;
    assert_eq!(stat_of(err, "summary_indexes_used"), 6, "{err}");
    assert_eq!(stat_of(err, "profiles_read"), 0, "{err}");
    for (a, b) in from_profiles.iter().zip(&binary) {
        assert_eq!(a.0, b.0, "summary.idx and profiles must give the same report");
    }
    // `--by` (and dcpidiff) load the totals as profiles without counts: from summary.idx too.
    let err = &binary[3].1;
    assert_eq!(stat_of(err, "summary_indexes_used"), 6, "{err}");
    assert_eq!(stat_of(err, "profiles_read"), 0, "{err}");
    let (sym_idx, err) = sym("binary index");
    assert_eq!(sym_idx, sym_plain, "per-symbol report from the index's file list");
    assert_eq!(stat_of(&err, "summary_indexes_used"), 3, "{err}");
    assert_eq!(stat_of(&err, "profiles_read"), 12, "{err}");

    // Older databases mixed in: a summary.idx missing (JSON index used), one missing with no
    // JSON index either (profiles read), one corrupt (ignored, JSON index used).
    let json_index = |hd: &profile_format::HostDir| {
        let mut s = HostSummary::read(&hd.summary_path()).expect("summary");
        s.index = Some(profile_format::SummaryIndex::of_host_dir(hd).expect("index"));
        s.write(&hd.summary_path()).expect("write summary");
    };
    std::fs::remove_file(dirs[1].summary_index_path()).expect("rm");
    json_index(&dirs[1]);
    std::fs::remove_file(dirs[2].summary_index_path()).expect("rm");
    let mut junk = std::fs::read(dirs[3].summary_index_path()).expect("read");
    let mid = junk.len() / 2;
    junk[mid] ^= 0xff;
    std::fs::write(dirs[3].summary_index_path(), junk).expect("write");
    json_index(&dirs[3]);
    let old = runs("old formats mixed in");
    let err = &old[0].1;
    assert_eq!(stat_of(err, "summary_indexes_used"), 5, "{err}");
    assert_eq!(stat_of(err, "profiles_read"), 12, "{err}");
    for (a, b) in from_profiles.iter().zip(&old) {
        assert_eq!(a.0, b.0, "old and new indexes mixed must give the same report");
    }
    let (sym_old, _) = sym("old formats mixed in");
    assert_eq!(sym_old, sym_plain);
}

/// dcpiprof with `DCPI_IO_THREADS` (how many files are read at once).
fn prof_threads(db: &Path, threads: &str, args: &[&str]) -> Output {
    prof_command(db, args).env("DCPI_IO_THREADS", threads).output().expect("run dcpiprof")
}

#[test]
fn parallel_per_symbol_load_equals_sequential() {
    // 4 epochs x 7 hosts; each host-epoch has summary.idx (the daemon's) except where noted.
    // app0 has different offsets and counts per host-epoch; some host-epochs lack it; one of
    // its profiles is corrupt; one summary.idx cannot be read (a directory) and one host
    // directory is unreadable (mode 000: only for a non-root user, root reads it anyway).
    let t = TestDb::new();
    let ev = event("cpu-clock", 1000);
    let app = ImageId::BuildId(vec![0xa0; 20]);
    let others: Vec<ImageId> = (1..=4u8).map(|i| ImageId::BuildId(vec![i; 20])).collect();
    let mut expected: std::collections::BTreeMap<u64, u64> = Default::default();
    let mut corrupt = None;
    let mut locked = None;
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    for (ei, secs) in [0u64, 3600, 7200, 10800].into_iter().enumerate() {
        let e = t.epoch(secs);
        for hi in 0..7usize {
            let host = format!("host{hi}");
            let hd = t.host(&e, &host);
            for (i, id) in others.iter().enumerate() {
                let path = format!("/opt/other{i}");
                Image::new(ImageKind::Elf, id.clone(), path.as_bytes())
                    .profile(&ev)
                    .counts(&[(0x40, 3)])
                    .period(1000)
                    .write(&hd);
            }
            let lacks_app = (hi + ei) % 5 == 0;
            if !lacks_app {
                let counts: Vec<(u64, u64)> = (0..1 + rnd(12))
                    .map(|_| (rnd(64) * 0x1000 + 4 * rnd(16), 1 + rnd(1000)))
                    .collect::<std::collections::BTreeMap<u64, u64>>()
                    .into_iter()
                    .collect();
                Image::new(ImageKind::Elf, app.clone(), b"/opt/app0")
                    .profile(&ev)
                    .counts(&counts)
                    .period(1000)
                    .write(&hd);
                if ei == 1 && hi == 2 {
                    corrupt = Some(hd.profile_path(&app, "cpu-clock"));
                } else {
                    for (off, c) in counts {
                        *expected.entry(off & !0xfff).or_default() += c;
                    }
                }
            }
            let mut s = HostSummary {
                format_version: 1,
                host: host.clone(),
                epoch: e.to_string(),
                ..HostSummary::default()
            };
            s.index = Some(profile_format::SummaryIndex::of_host_dir(&hd).expect("index"));
            if ei == 2 && hi == 4 {
                std::fs::create_dir(hd.summary_index_path()).expect("summary.idx as a dir");
            } else {
                sumidx::write(&s, &hd.summary_index_path()).expect("summary.idx");
            }
            if ei == 0 && hi == 6 {
                locked = Some(hd.path.clone());
            }
        }
    }
    let corrupt = corrupt.expect("a corrupt profile");
    let mut bytes = std::fs::read(&corrupt).expect("read");
    let n = bytes.len();
    bytes[n / 2] ^= 0x55;
    std::fs::write(&corrupt, &bytes).expect("corrupt");
    let locked = locked.expect("a locked dir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).expect("chmod");
    let locked_out = std::fs::read_dir(&locked).is_err();
    if !locked_out {
        println!("running as root: the mode-000 host directory stays readable");
    }

    let args = ["--epoch", "all", "--host", "all", "--image", "app0", "--format", "json"];
    // Without --keep-going: exit 2 naming the corrupt file (or the unreadable directory),
    // the same whichever the concurrency.
    let mut errors = Vec::new();
    for threads in ["1", "3", "64"] {
        let o = prof_threads(&t.root(), threads, &args);
        assert_eq!(o.status.code(), Some(2), "threads {threads}: {}", stderr(&o));
        assert!(stdout(&o).is_empty(), "no partial report: {}", stdout(&o));
        let err = stderr(&o);
        let named = if locked_out { locked.display() } else { corrupt.display() }.to_string();
        assert!(err.contains(&named), "threads {threads}: {named} not named in {err}");
        errors.push(err);
    }
    assert!(errors.windows(2).all(|w| w[0] == w[1]), "{errors:#?}");

    // With --keep-going: the same counts, equal to what was written, with any concurrency.
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut a = args.to_vec();
    a.extend(["--keep-going", "--verbose"]);
    let mut outs = Vec::new();
    for threads in ["1", "3", "64"] {
        let o = prof_threads(&t.root(), threads, &a);
        assert!(o.status.success(), "threads {threads}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains(&corrupt.display().to_string()), "{err}");
        // The 7 host-epochs of the newest epoch are listed (their index may trail), and so is
        // the one whose summary.idx is a directory: 20 of the 28 indexes are used.
        assert_eq!(stat_of(&err, "summary_indexes_used"), 20, "{err}");
        outs.push(stdout(&o));
    }
    assert!(outs.windows(2).all(|w| w[0] == w[1]), "outputs differ with the concurrency");
    let v: Value = serde_json::from_str(&outs[0]).expect("json");
    let got: std::collections::BTreeMap<u64, u64> = rows(&v)
        .iter()
        .map(|r| {
            let name = r["symbol"].as_str().expect("symbol");
            let hex = name.rsplit_once("+0x").expect("unsymbolized offset row").1;
            let off = u64::from_str_radix(hex, 16).expect("hex offset");
            (off, r["samples"].as_u64().expect("samples"))
        })
        .collect();
    assert_eq!(got, expected);
    assert_eq!(v["total_samples"].as_u64(), Some(expected.values().sum::<u64>()));
}
