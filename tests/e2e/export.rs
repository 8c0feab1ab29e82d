//! End-to-end tests: a real workload sampled by dcpid, exported by dcpiprof and read by the
//! tools users open exports with (`go tool pprof`, headless Chromium).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::report::PROPORTIONS_C;
use dcpi_e2e::json;
use dcpi_e2e::Sandbox;

/// A tool the test needs, or `None` after printing why (a panic under `DCPI_REQUIRE_ALL=1`,
/// where `.ci/run` must have installed it).
fn tool(name: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| p.is_file()));
    if found.is_none() {
        let why = format!("{name} not installed (Debian package {package}; .ci/run installs it)");
        dcpi_testkit::skipped(format_args!("{why}"));
    }
    found
}

/// flat% per function from `go tool pprof -top -symbolize=none`.
fn pprof_shares(go: &Path, file: &Path, home: &Path) -> Vec<(String, f64)> {
    let o = Command::new(go)
        .env("HOME", home)
        .env("PPROF_TMPDIR", home)
        .args(["tool", "pprof", "-top", "-symbolize=none", "-nodecount=50"])
        .arg(file)
        .output()
        .expect("run go tool pprof");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "pprof: {}{text}", String::from_utf8_lossy(&o.stderr));
    text.lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            Some((c.get(5..)?.join(" "), c.get(1)?.strip_suffix('%')?.parse().ok()?))
        })
        .collect()
}

#[dcpi_testkit::test(perf, tool("go"), tool("chromium"))]
fn sampled_5_3_2_workload_exports_to_pprof_folded_and_html() {
    let (Some(go), Some(chromium)) = (tool("go", "golang-go"), tool("chromium", "chromium")) else {
        return;
    };
    let sb = Sandbox::new();
    let dir = sb.dir.path();
    let src = dir.join("prop532.c");
    std::fs::write(&src, PROPORTIONS_C).expect("write source");
    let bin = dir.join("prop532");
    let st = Command::new("cc")
        .args(["-O1", "-fno-inline", "-Wl,--build-id=sha1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    let host = "e2e-export";
    let mut d = sb.start_daemon(host, &["--events", "cpu-clock:250000", "--flush-interval", "1s"]);
    let st = Command::new(&bin).arg("3").status().expect("run workload");
    assert!(st.success() || st.code() == Some(1), "workload failed: {st}");
    let fl = d.ctl(&["flush"]);
    assert!(fl.status.success(), "flush: {}", String::from_utf8_lossy(&fl.stderr));
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");

    let cache = dir.join("symbols.sqlite").display().to_string();
    let path = bin.display().to_string();
    let common = ["--host", host, "--symbol-cache", cache.as_str()];
    let with = |more: &[&str]| -> Vec<String> {
        common.iter().chain(more).map(ToString::to_string).collect()
    };
    let prof = |args: Vec<String>| {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        sb.prof(&a)
    };

    // pprof of the program: go tool pprof's shares are dcpiprof's (and the workload's 5:3:2).
    let pb = dir.join("prop532.pb.gz").display().to_string();
    let o = prof(with(&["--image", &path, "--format", "pprof", "-o", &pb]));
    assert!(o.status.success(), "export: {}", String::from_utf8_lossy(&o.stderr));
    let report = json(prof(with(&["--image", &path, "--format", "json"])));
    let shares = pprof_shares(&go, Path::new(&pb), dir);
    for (name, want) in [("work_five", 50.0), ("work_three", 30.0), ("work_two", 20.0)] {
        let ours = report["rows"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["symbol"] == name))
            .and_then(|r| r["percent"].as_f64())
            .unwrap_or_else(|| panic!("no {name}: {report:#}"));
        let theirs = shares
            .iter()
            .find(|s| s.0 == name)
            .map(|s| s.1)
            .unwrap_or_else(|| panic!("{name} not in pprof: {shares:?}"));
        eprintln!("{name}: dcpiprof {ours:.2}%, pprof {theirs:.2}% (workload {want}%)");
        assert!((ours - theirs).abs() <= 1.0, "{name}: dcpiprof {ours} vs pprof {theirs}");
        // The three functions are not the whole image (main, the loop, PLT): relative shares.
        assert!(theirs > 0.0);
    }
    let sum: f64 = ["work_five", "work_three", "work_two"]
        .iter()
        .filter_map(|n| shares.iter().find(|s| s.0 == *n).map(|s| s.1))
        .sum();
    let five = shares.iter().find(|s| s.0 == "work_five").map_or(0.0, |s| s.1);
    assert!((100.0 * five / sum - 50.0).abs() <= 3.0, "work_five {five} of {sum}: {shares:?}");

    // Folded stacks of the whole host sum to the report's total.
    let total = json(prof(with(&["--format", "json"])))["total_samples"].as_u64().expect("total");
    let o = prof(with(&["--format", "folded"]));
    assert!(o.status.success(), "folded: {}", String::from_utf8_lossy(&o.stderr));
    let folded = String::from_utf8_lossy(&o.stdout);
    let sum: u64 = folded
        .lines()
        .map(|l| l.rsplit_once(' ').and_then(|(_, n)| n.parse::<u64>().ok()).expect("count"))
        .sum();
    assert_eq!(sum, total);
    assert!(folded.contains(&format!("{path};work_five ")), "{folded}");

    // The HTML report of the program in a real browser (the whole host's took its turn above).
    let html = dir.join("report.html");
    let o = prof(with(&["--image", &path, "--format", "html", "-o", &html.display().to_string()]));
    assert!(o.status.success(), "html: {}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(chromium)
        .env("HOME", dir)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--dump-dom"])
        .arg(format!("file://{}", html.display()))
        .output()
        .expect("chromium");
    let dom = String::from_utf8_lossy(&o.stdout);
    assert!(dom.contains("data-ready=\"1\""), "scripts did not finish: {dom}");
    assert!(dom.contains("data-n=\"work_five\"") && dom.contains("class=\"dcpi-flame\""), "{dom}");
}
