//! End-to-end tests: dcpilist on a profile the daemon took, against `perf annotate` of the same
//! workload.

use std::collections::HashMap;
use std::process::{Command, Stdio};

use dcpi_e2e::{run, Sandbox};

/// A cheap loop (adds) and an expensive loop of dependent divisions, in one function. It runs
/// for a given CPU time (not wall time), so a loaded machine does not starve it of samples.
const LOOPS_C: &str = "#include <stdlib.h>
#include <time.h>

__attribute__((noinline, noipa)) long work(long n, long d) {
    long s = 0;
    for (long i = 0; i < n; i++)
        s += i * 3 + (s >> 7);
    long q = n;
    for (long i = 0; i < n / 16; i++)
        q = q / d + i;
    return s + q;
}

int main(int argc, char **argv) {
    double secs = argc > 1 ? atof(argv[1]) : 1.0;
    struct timespec a, b;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    volatile long sink = 0;
    do {
        sink += work(200000 + (sink & 1), argc + 2);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    } while ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9 < secs);
    return (int)(sink & 1);
}
";

/// The expensive loop: its `for` line and the division's line.
const EXPENSIVE_LINES: [u32; 2] = [9, 10];

/// perf annotate's per-instruction percentages (local period) of `sym`, by address.
fn perf_annotate(data: &std::path::Path, sym: &str) -> HashMap<u64, f64> {
    let out = Command::new("perf")
        .args(["annotate", "--stdio", "-s", sym, "-i"])
        .arg(data)
        .output()
        .expect("run perf annotate (install linux-perf)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "perf annotate: {}{text}", String::from_utf8_lossy(&out.stderr));
    // "   17.62 :   1191:   idiv   %rsi"
    let mut m = HashMap::new();
    for line in text.lines() {
        let Some((pct, rest)) = line.split_once(" : ") else { continue };
        let Ok(pct) = pct.trim().parse::<f64>() else { continue };
        let Some((addr, _)) = rest.trim_start().split_once(':') else { continue };
        if let Ok(a) = u64::from_str_radix(addr.trim(), 16) {
            m.insert(a, pct);
        }
    }
    assert!(!m.is_empty(), "no instructions in perf annotate's output:\n{text}");
    m
}

#[dcpi_testkit::test(perf)]
fn dcpilist_shares_of_the_division_loop_match_perf_annotate() {
    let sb = Sandbox::new();
    let dir = sb.dir.path();
    std::fs::write(dir.join("loops.c"), LOOPS_C).expect("write source");
    let bin = dir.join("loops");
    let st = Command::new("cc")
        .current_dir(dir)
        .args(["-g", "-O1", "-Wl,--build-id=sha1", "-o", "loops", "loops.c"])
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    let host = "e2e-listing";
    let mut d = sb.start_daemon(host, &["--events", "cpu-clock:250000", "--flush-interval", "1s"]);
    // perf samples the same run at the same rate. --buildid-mmap: without it perf 6.1 aborts
    // reading its own data ("assertion failed at util/build-id.c") when another profiler
    // (here dcpid) has build-ids in mmap records enabled; -N: nothing copied into ~/.debug.
    let data = dir.join("perf.data");
    let st = Command::new("perf")
        .args(["record", "-q", "--buildid-mmap", "-N", "-e", "cpu-clock", "-F", "4000", "-o"])
        .arg(&data)
        .arg(&bin)
        .arg("3")
        .stderr(Stdio::inherit())
        .status()
        .expect("run perf record (install linux-perf)");
    assert!(st.success() || st.code() == Some(1), "perf record of the workload failed: {st}");
    let fl = d.ctl(&["flush"]);
    assert!(fl.status.success(), "flush: {}", String::from_utf8_lossy(&fl.stderr));
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");

    let db = sb.db().display().to_string();
    let path = bin.display().to_string();
    let cache = dir.join("symbols.sqlite").display().to_string();
    let args = [
        "--db",
        &db,
        "--host",
        host,
        "--image",
        &path,
        "--symbol",
        "work",
        "--symbol-cache",
        &cache,
        "--format",
        "json",
    ];
    let out = run("dcpilist", &args);
    assert!(out.status.success(), "dcpilist: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON listing");
    let rows = v["rows"].as_array().expect("rows");
    assert!(v["total_samples"].as_u64().unwrap_or(0) >= 2000, "too few samples: {v:#}");
    let on_expensive = |r: &serde_json::Value| {
        r["source"].as_str().and_then(|s| s.rsplit_once(':')).is_some_and(|(f, l)| {
            f.ends_with("loops.c") && l.parse().is_ok_and(|l: u32| EXPENSIVE_LINES.contains(&l))
        })
    };
    let div = rows
        .iter()
        .find(|r| r["instruction"].as_str().is_some_and(|i| i.contains("div")))
        .unwrap_or_else(|| panic!("no division in the listing: {v:#}"));
    assert!(on_expensive(div), "the division is on the expensive loop's lines: {div:#}");
    let ours: f64 =
        rows.iter().filter(|r| on_expensive(r)).map(|r| r["percent"].as_f64().unwrap_or(0.0)).sum();

    let perf = perf_annotate(&data, "work");
    let theirs: f64 = rows
        .iter()
        .filter(|r| on_expensive(r))
        .filter_map(|r| perf.get(&r["address"].as_u64()?))
        .sum();
    let perf_total: f64 = perf.values().sum();
    assert!((perf_total - 100.0).abs() < 1.0, "perf annotate's rows sum to {perf_total}");
    eprintln!("expensive loop: dcpilist {ours:.2}%, perf annotate {theirs:.2}%");
    assert!(ours > 5.0, "the division loop has samples: {ours:.2}%");
    assert!((ours - theirs).abs() <= 4.0, "dcpilist {ours:.2}% vs perf annotate {theirs:.2}%");

    // The table shows the same: the division row with its samples, and the skid note.
    let mut targs = args.to_vec();
    targs.truncate(targs.len() - 2);
    targs.push("--both");
    let out = run("dcpilist", &targs);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && s.contains("# note: skid"), "{s}");
    assert!(s.lines().any(|l| l.contains("div") && l.contains("0x")), "{s}");
    assert!(s.lines().any(|l| l.contains("loops.c:10: q = q / d + i;")), "{s}");

    // The machine's hottest instructions include the workload's loops (other programs on a
    // shared machine are sampled too, so not necessarily first).
    let out = run("dcpilist", &["--db", &db, "--host", host, "--top", "50", "--format", "json"]);
    assert!(out.status.success(), "dcpilist --top: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON top");
    let ours = v["rows"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["image"].as_str() == Some(path.as_str())))
        .unwrap_or_else(|| panic!("the workload is not among the 50 hottest: {v:#}"));
    assert!(ours["symbol"].as_str().is_some_and(|s| s.starts_with("work")), "{ours:#}");
    assert!(ours["instruction"].is_string(), "{ours:#}");
    assert!(ours["source"].as_str().is_some_and(|s| s.contains("loops.c:")), "{ours:#}");

    // A kernel function of this boot: its code comes from /proc/kcore when readable (root).
    let out = sb.prof(&["--host", host, "--image", "kernel", "--format", "json"]);
    assert!(out.status.success(), "dcpiprof kernel: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let ksym = v["rows"]
        .as_array()
        .and_then(|r| r.iter().filter_map(|r| r["symbol"].as_str()).find(|s| !s.contains('+')))
        .map(str::to_owned);
    if let Some(ksym) = ksym {
        let args = ["--db", &db, "--host", host, "--image", "kernel", "--symbol", &ksym];
        let out = run("dcpilist", &[&args[..], &["--format", "json"]].concat());
        assert!(out.status.success(), "dcpilist {ksym}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON listing");
        if std::fs::File::open("/proc/kcore").is_ok() {
            assert_eq!(v["code"], true, "{ksym} from /proc/kcore: {v:#}");
            assert!(v["instructions"].as_u64().unwrap_or(0) > 0, "{v:#}");
        }
        assert!(v["total_samples"].as_u64().unwrap_or(0) > 0, "{v:#}");
    }
}
