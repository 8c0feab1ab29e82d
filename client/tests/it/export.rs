//! `dcpiprof --format folded|pprof|svg|html` on databases built with the profile-format API and
//! a C program compiled at test time, checked with the tools users will open them with:
//! `go tool pprof` (Debian golang-go) and headless Chromium. Without those tools the tests
//! skip with the reason, and fail under `DCPI_REQUIRE_ALL=1` (`.ci/run` installs them).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::util::{base_time, event, json_ok, prof, TestDb};
use dcpi_testkit::db::Image;

use dcpi_client::prof::export::pprof::proto::Profile;
use dcpi_client::prof::select;
use dcpi_testkit::db::write_summaries;
use flate2::read::GzDecoder;
use object::{Object, ObjectSegment, ObjectSymbol};
use profile_format::{HostDir, ImageId, ImageKind, JitSymbol};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// Helpers

/// Host `host`'s directory in a new epoch it began `secs` after the base time.
fn host_dir(t: &TestDb, secs: u64, host: &str) -> HostDir {
    t.host(&t.epoch_by(base_time(secs), host), host)
}

fn ok(o: Output, what: &str) -> Vec<u8> {
    assert!(
        o.status.success(),
        "{what} failed ({:?}): {}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

/// A tool the test needs: its path, or `None` after printing why the test is skipped (a panic
/// under `DCPI_REQUIRE_ALL=1`, where CI must have installed it).
fn tool(name: &str, package: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH")
        .and_then(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|p| p.is_file()));
    if found.is_none() {
        let why = format!("{name} not installed (Debian package {package}; .ci/run installs it)");
        dcpi_testkit::skipped(format_args!("{why}"));
    }
    found
}

const C_PROG: &str = r#"
#include <stdio.h>
__attribute__((noinline)) int hot_alpha(int x) { int s = 0; for (int i = 0; i < x; i++) s += i * 3; return s; }
__attribute__((noinline)) int warm_beta(int x) { int s = 1; for (int i = 0; i < x; i++) s ^= i + 7; return s; }
__attribute__((noinline)) int cool_gamma(int x) { int s = 2; for (int i = 0; i < x; i++) s += i ^ 5; return s; }
int main(int argc, char **argv) { (void)argv; printf("%d\n", hot_alpha(argc) + warm_beta(argc) + cool_gamma(argc)); return 0; }
"#;

/// The compiled program, its build-id and the file offsets of its three functions.
struct Prog {
    path: PathBuf,
    id: ImageId,
    funcs: HashMap<&'static str, u64>,
}

fn build_prog(dir: &Path) -> Prog {
    let src = dir.join("prog.c");
    std::fs::write(&src, C_PROG).expect("write source");
    let path = dir.join("prog");
    let o = Command::new("cc")
        .args(["-O1", "-Wl,--build-id=sha1", "-o"])
        .arg(&path)
        .arg(&src)
        .output()
        .expect("run cc");
    assert!(o.status.success(), "cc: {}", String::from_utf8_lossy(&o.stderr));
    read_prog(path)
}

/// Build-id and function offsets of a compiled program.
fn read_prog(path: PathBuf) -> Prog {
    let data = std::fs::read(&path).expect("read prog");
    let f = object::File::parse(&*data).expect("parse");
    let id = ImageId::BuildId(f.build_id().expect("build id").expect("has build id").to_vec());
    let mut funcs = HashMap::new();
    for name in ["hot_alpha", "warm_beta", "cool_gamma"] {
        let sym = f.symbols().find(|s| s.name() == Ok(name)).expect("symbol");
        let off = f
            .segments()
            .find_map(|seg| {
                let (off, size) = seg.file_range();
                (sym.address() >= seg.address() && sym.address() - seg.address() < size)
                    .then(|| sym.address() - seg.address() + off)
            })
            .expect("in a segment");
        funcs.insert(name, off);
    }
    Prog { path, id, funcs }
}

/// Two epochs of one host: `prog` (counts per function, spread over two addresses each) with
/// different sampling periods, so that sample shares (40/30/30) and event-weighted shares
/// (50/30/20) differ; plus a library whose binary is gone and some unattributed samples.
fn workload(t: &TestDb, p: &Prog) {
    // (epoch start, period, samples per function)
    type Epoch<'a> = (u64, u64, [(&'a str, u64); 3]);
    let plan: [Epoch<'_>; 2] = [
        (0, 1000, [("hot_alpha", 20), ("warm_beta", 30), ("cool_gamma", 50)]),
        (3600, 3000, [("hot_alpha", 60), ("warm_beta", 30), ("cool_gamma", 10)]),
    ];
    for (secs, period, counts) in plan {
        let hd = host_dir(t, secs, "alpha");
        let ev = event("cpu-clock", period);
        let c: Vec<(u64, u64)> = counts
            .iter()
            .flat_map(|&(f, n)| [(p.funcs[f], n - n / 3), (p.funcs[f] + 1, n / 3)])
            .collect();
        Image::new(ImageKind::Elf, p.id.clone(), p.path.display().to_string().as_bytes())
            .profile(&ev)
            .counts(&c)
            .period(period)
            .write(&hd);
        let lib = ImageId::BuildId(vec![0xab; 20]);
        Image::new(ImageKind::Elf, lib.clone(), b"/usr/lib/libgone.so.1")
            .profile(&ev)
            .counts(&[(0x1234, 7), (0x5678, 3)])
            .period(period)
            .write(&hd);
        Image::new(ImageKind::Unknown, ImageId::special("[unknown]", b""), b"")
            .profile(&ev)
            .counts(&[(0, 4)])
            .period(period)
            .write(&hd);
    }
}

// ---------------------------------------------------------------------------------------------
// pprof

/// `go tool pprof -top` rows: (name, flat%).
fn pprof_top(file: &Path, home: &Path, extra: &[&str]) -> Vec<(String, f64)> {
    let go = tool("go", "golang-go").expect("checked by the caller");
    let o = Command::new(go)
        .env("HOME", home)
        .env("PPROF_TMPDIR", home)
        .args(["tool", "pprof", "-top", "-symbolize=none", "-nodecount=100"])
        .args(extra)
        .arg(file)
        .output()
        .expect("run go tool pprof");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "go tool pprof failed: {}{text}",
        String::from_utf8_lossy(&o.stderr)
    );
    let rows: Vec<(String, f64)> = text
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let pct = cols.get(1)?.strip_suffix('%')?.parse().ok()?;
            Some((cols.get(5..)?.join(" "), pct))
        })
        .collect();
    assert!(!rows.is_empty(), "no rows in pprof output:\n{text}");
    rows
}

fn share(rows: &[(String, f64)], name: &str) -> f64 {
    rows.iter()
        .find(|r| r.0 == name)
        .map(|r| r.1)
        .unwrap_or_else(|| panic!("{name} not in {rows:?}"))
}

#[dcpi_testkit::test(tool("go"))]
fn pprof_export_loads_in_go_tool_pprof_with_dcpiprofs_shares() {
    let t = TestDb::new();
    let p = build_prog(t.tmp());
    workload(&t, &p);
    let db = t.root();
    let sel = ["--host", "alpha", "--epoch", "all"];

    // The program alone: pprof's shares of the whole file are the per-symbol report's.
    let file = t.tmp().join("prog.pb.gz");
    let mut a = sel.to_vec();
    a.extend(["--image", "prog", "--format", "pprof", "--output", file.to_str().expect("utf8")]);
    ok(prof(&db, &a), "export pprof");
    let gz = std::fs::read(&file).expect("pprof file");
    assert_eq!(&gz[..2], &[0x1f, 0x8b], "not gzipped");
    let report = json_ok(&db, &[&sel[..], &["--image", "prog"]].concat());
    let top = pprof_top(&file, t.tmp(), &[]);
    let top_samples = pprof_top(&file, t.tmp(), &["-sample_index=samples"]);
    for f in ["hot_alpha", "warm_beta", "cool_gamma"] {
        let row = report["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .find(|r| r["symbol"] == f)
            .expect("row");
        let want = row["percent"].as_f64().expect("percent");
        assert!(
            (share(&top, f) - want).abs() <= 1.0,
            "{f}: pprof {} vs dcpiprof {want}: {top:?}",
            share(&top, f)
        );
        let want_samples = 100.0 * row["samples"].as_f64().expect("n")
            / report["total_samples"].as_f64().expect("t");
        let got = share(&top_samples, f);
        assert!((got - want_samples).abs() <= 1.0, "{f} samples: pprof {got} vs {want_samples}");
    }
    // The workload is 50/30/20 by events and 40/30/30 by samples: both views must hold.
    assert!((share(&top, "hot_alpha") - 50.0).abs() <= 1.0, "{top:?}");
    assert!((share(&top, "cool_gamma") - 20.0).abs() <= 1.0, "{top:?}");
    assert!((share(&top_samples, "hot_alpha") - 40.0).abs() <= 1.0, "{top_samples:?}");

    // The whole selection: a function's share is its image's share times its share of the image.
    let all = t.tmp().join("all.pb.gz");
    let mut a = sel.to_vec();
    a.extend(["--format", "pprof", "--output", all.to_str().expect("utf8")]);
    ok(prof(&db, &a), "export pprof (all images)");
    let images = json_ok(&db, &sel);
    let prog_pct = images["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["image"] == p.path.display().to_string())
        .and_then(|r| r["percent"].as_f64())
        .expect("prog row");
    let top = pprof_top(&all, t.tmp(), &[]);
    let want = report["rows"][0]["percent"].as_f64().expect("pct") * prog_pct / 100.0;
    assert!((share(&top, "hot_alpha") - want).abs() <= 1.0, "{top:?} vs {want}");
    assert!(top.iter().any(|r| r.0 == "libgone.so.1+0x1000"), "unsymbolized rows kept: {top:?}");

    // Labels and mappings are there for pprof's filters.
    let o = Command::new(tool("go", "golang-go").expect("go"))
        .env("HOME", t.tmp())
        .args(["tool", "pprof", "-raw", "-symbolize=none"])
        .arg(&all)
        .output()
        .expect("pprof -raw");
    let raw = String::from_utf8_lossy(&o.stdout);
    assert!(raw.contains("host:[alpha]") && raw.contains("epoch:["), "{raw}");
    assert!(
        raw.contains(&hex::encode([0xabu8; 20])) && raw.contains(&p.path.display().to_string()),
        "{raw}"
    );
}

#[test]
fn pprof_to_a_missing_directory_is_a_clear_error() {
    let t = TestDb::new();
    let p = build_prog(t.tmp());
    workload(&t, &p);
    let bad = t.tmp().join("no/such/dir/x.pb.gz");
    let o = prof(
        &t.root(),
        &["--host", "alpha", "--format", "pprof", "--output", bad.to_str().expect("utf8")],
    );
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no/such/dir/x.pb.gz") && err.contains("does not exist"), "{err}");
    assert_eq!(err.lines().count(), 1, "fails before reading anything: {err}");
}

// ---------------------------------------------------------------------------------------------
// Folded stacks

#[test]
fn folded_lines_sum_to_the_json_reports_total() {
    let t = TestDb::new();
    let p = build_prog(t.tmp());
    workload(&t, &p);
    for sel in [&["--host", "alpha"][..], &["--host", "alpha", "--epoch", "all"][..]] {
        let report = json_ok(&t.root(), sel);
        let folded = String::from_utf8(ok(
            prof(&t.root(), &[sel, &["--format", "folded"]].concat()),
            "folded",
        ))
        .expect("utf8");
        let mut sum = 0u64;
        let mut per_image: HashMap<String, u64> = HashMap::new();
        for line in folded.lines() {
            let (stack, n) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
            let n: u64 = n.parse().unwrap_or_else(|_| panic!("bad count in {line:?}"));
            let frames: Vec<&str> = stack.split(';').collect();
            assert_eq!(frames.len(), 2, "image;symbol expected: {line:?}");
            sum += n;
            *per_image.entry(frames[0].to_owned()).or_default() += n;
        }
        assert_eq!(sum, report["total_samples"].as_u64().expect("total"), "{folded}");
        for row in report["rows"].as_array().expect("rows") {
            let img = row["image"].as_str().expect("image");
            assert_eq!(per_image.get(img).copied(), row["samples"].as_u64(), "{img}: {folded}");
        }
        let prog = p.path.display().to_string();
        assert!(folded.contains(&format!("{prog};hot_alpha ")), "{folded}");
        assert!(folded.contains("[unknown];[unknown: "), "{folded}");
    }
}

// ---------------------------------------------------------------------------------------------
// Flame graph SVG and HTML, rendered by a real browser

/// The DOM after Chromium ran the page's scripts.
fn render(file: &Path, home: &Path) -> String {
    render_url(&format!("file://{}", file.display()), home)
}

fn render_url(url: &str, home: &Path) -> String {
    let chromium = tool("chromium", "chromium").expect("checked by the caller");
    let o = Command::new(chromium)
        .env("HOME", home)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--dump-dom"])
        .arg(url)
        .output()
        .expect("run chromium");
    let dom = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && !dom.is_empty(),
        "chromium failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    dom
}

#[dcpi_testkit::test(tool("chromium"))]
fn html_report_renders_offline_in_headless_chromium() {
    let t = TestDb::new();
    let p = build_prog(t.tmp());
    workload(&t, &p);
    let file = t.tmp().join("report.html");
    ok(
        prof(
            &t.root(),
            &[
                "--host",
                "alpha",
                "--epoch",
                "all",
                "--format",
                "html",
                "-o",
                file.to_str().expect("utf8"),
            ],
        ),
        "export html",
    );
    let page = std::fs::read_to_string(&file).expect("html");
    // Self-contained: nothing is fetched at view time.
    for needle in ["<script src", "<link", "@import", "url(http", "src=\"http"] {
        assert!(!page.contains(needle), "page references {needle}");
    }
    let dom = render(&file, t.tmp());
    assert!(dom.contains("data-ready=\"1\""), "scripts did not run to the end:\n{dom}");
    assert!(dom.contains("<svg") && dom.contains("dcpi-flame"), "no flame graph svg");
    assert!(dom.contains("class=\"trend\""), "two epochs selected but no trend chart");
    // The top symbol of the top image, in its table and as a flame graph frame.
    let report = json_ok(&t.root(), &["--host", "alpha", "--epoch", "all", "--image", "prog"]);
    let top = report["rows"][0]["symbol"].as_str().expect("top symbol");
    assert_eq!(top, "hot_alpha");
    assert!(dom.contains(&format!("data-v=\"{top}\"")), "no table row for {top}");
    assert!(dom.contains(&format!("data-n=\"{top}\"")), "no flame frame for {top}");
    assert!(dom.contains(&p.path.display().to_string()), "no image row");
}

#[dcpi_testkit::test(tool("chromium"))]
fn svg_flame_graph_is_searchable_and_zoomable_in_a_browser() {
    let t = TestDb::new();
    let p = build_prog(t.tmp());
    workload(&t, &p);
    let file = t.tmp().join("flame.svg");
    ok(
        prof(
            &t.root(),
            &["--host", "alpha", "--format", "svg", "--output", file.to_str().expect("utf8")],
        ),
        "export svg",
    );
    // ?s= runs a search at load: the script must have found and coloured the three functions.
    let dom = render_url(&format!("file://{}?s=_(alpha|beta|gamma)$", file.display()), t.tmp());
    assert!(dom.contains("data-ready=\"1\""), "svg script did not run: {dom}");
    assert_eq!(
        dom.matches("fill=\"rgb(230,0,230)\"").count(),
        3,
        "three frames should match: {dom}"
    );
    // prog's share of the latest epoch's samples (hot 60, warm 30, cool 10 of 100 + 10 + 4).
    let report = json_ok(&t.root(), &["--host", "alpha"]);
    let prog = report["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["image"] == p.path.display().to_string())
        .expect("prog");
    let want = format!(
        "Matched: {:.2}%",
        100.0 * prog["samples"].as_f64().expect("n") / report["total_samples"].as_f64().expect("t")
    );
    assert!(dom.contains(&want), "{want} not in {dom}");

    // Zoom: the same SVG inline in a page whose script clicks hot_alpha's frame.
    let svg = std::fs::read_to_string(&file).expect("svg");
    let svg = svg.split_once("?>").map_or(svg.as_str(), |(_, rest)| rest);
    let page = t.tmp().join("zoom.html");
    std::fs::write(
        &page,
        format!(
            "<!DOCTYPE html><html><body>{svg}<script>\n\
             var q = function (n) {{ return document.querySelector('g.f[data-n=\"' + n + '\"]'); }};\n\
             q('hot_alpha').dispatchEvent(new MouseEvent('click', {{ bubbles: true }}));\n\
             var b = document.body;\n\
             b.setAttribute('data-zoomed-width', q('hot_alpha').querySelector('rect').getAttribute('width'));\n\
             b.setAttribute('data-sibling', q('warm_beta').style.display);\n\
             b.setAttribute('data-parent', q('{}').getAttribute('class'));\n\
             </script></body></html>",
            p.path.display()
        ),
    )
    .expect("zoom page");
    let dom = render(&page, t.tmp());
    assert!(dom.contains("data-zoomed-width=\"1180.00\""), "clicked frame fills the width: {dom}");
    assert!(dom.contains("data-sibling=\"none\""), "siblings are hidden when zoomed: {dom}");
    assert!(dom.contains("data-parent=\"f anc\""), "ancestors stay, faded: {dom}");
}

// ---------------------------------------------------------------------------------------------
// speedscope, hostile names, progress

#[test]
fn speedscope_weights_are_dcpiprofs_events() {
    let t = TestDb::new();
    let p = build_prog(t.tmp());
    workload(&t, &p);
    let sel = ["--host", "alpha", "--epoch", "all"];
    let doc: Value = serde_json::from_slice(&ok(
        prof(&t.root(), &[&sel[..], &["--format", "speedscope"]].concat()),
        "speedscope",
    ))
    .expect("speedscope JSON");
    let frames = doc["shared"]["frames"].as_array().expect("frames");
    let prof0 = &doc["profiles"][0];
    assert_eq!(prof0["type"], "sampled");
    assert_eq!(prof0["unit"], "nanoseconds");
    let samples = prof0["samples"].as_array().expect("samples");
    let weights = prof0["weights"].as_array().expect("weights");
    assert_eq!(samples.len(), weights.len());
    let report = json_ok(&t.root(), &sel);
    let total: f64 = weights.iter().filter_map(Value::as_f64).sum();
    assert!((total - report["events"][0]["events"].as_f64().expect("events")).abs() <= 2.0);
    // hot_alpha's weight against the per-symbol report's events.
    let sym = json_ok(&t.root(), &[&sel[..], &["--image", "prog"]].concat());
    let want = sym["rows"][0]["events"].as_f64().expect("events");
    assert_eq!(sym["rows"][0]["symbol"], "hot_alpha");
    let got: f64 = samples
        .iter()
        .zip(weights)
        .filter(|(s, _)| {
            s.as_array()
                .and_then(|st| st.last())
                .and_then(Value::as_u64)
                .is_some_and(|f| frames[f as usize]["name"] == "hot_alpha")
        })
        .filter_map(|(_, w)| w.as_f64())
        .sum();
    assert!((got - want).abs() <= 2.0, "{got} vs {want}");
}

#[test]
fn hostile_symbol_names_cannot_break_any_format() {
    let t = TestDb::new();
    let hd = host_dir(&t, 0, "alpha");
    let ev = event("cpu-clock", 1000);
    let id = ImageId::special("[anon]", b"1234");
    let evil = "evil\nname;<script>alert(1)</script>\u{1b}[31m";
    let jit = vec![
        JitSymbol { start: 0x1000, size: 0x100, name: evil.into() },
        JitSymbol { start: 0x2000, size: 0x10, name: "plain_fn".into() },
    ];
    Image::new(ImageKind::Anon, id.clone(), b"[anon:1234:node]")
        .profile(&ev)
        .counts(&[(0x1010, 6), (0x2004, 2)])
        .period(1000)
        .jit_symbols(jit)
        .write(&hd);
    let run = |fmt: &str| -> String {
        String::from_utf8(ok(prof(&t.root(), &["--host", "alpha", "--format", fmt]), fmt))
            .expect("utf8")
    };
    let folded = run("folded");
    assert_eq!(folded.lines().count(), 2, "{folded:?}");
    assert!(
        folded.contains("[anon:1234:node];evil\\nname:<script>alert(1)</script>\\u{1b}[31m 6"),
        "{folded:?}"
    );
    assert!(!folded.contains('\u{1b}'));
    for fmt in ["svg", "html"] {
        let doc = run(fmt);
        assert!(!doc.contains("<script>alert"), "{fmt} lets markup through");
        assert!(doc.contains("evil\\nname;&lt;script&gt;alert(1)&lt;/script&gt;"), "{fmt}: {doc}");
        assert!(!doc.contains('\u{1b}'), "{fmt}");
    }
    let v: Value = serde_json::from_str(&run("speedscope")).expect("valid JSON");
    let names: Vec<&str> = v["shared"]["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .filter_map(|f| f["name"].as_str())
        .collect();
    assert!(names.iter().any(|n| n.starts_with("evil\\nname;")), "{names:?}");
    assert!(names.iter().all(|n| !n.contains(char::is_control)), "{names:?}");
}

#[test]
fn progress_bar_only_on_a_terminal() {
    let t = TestDb::new();
    let hd = host_dir(&t, 0, "alpha");
    let ev = event("cpu-clock", 1000);
    // A "fleet": 600 JIT images (no binaries to look up, so no warnings either).
    for i in 0u32..600 {
        let id = ImageId::special("[anon]", &i.to_le_bytes());
        Image::new(ImageKind::Anon, id.clone(), format!("[anon:{i}:java]").as_bytes())
            .profile(&ev)
            .counts(&[(0x1000, 1)])
            .period(1000)
            .write(&hd);
    }
    let out = t.tmp().join("f.folded");
    let o = prof(
        &t.root(),
        &["--host", "alpha", "--format", "folded", "-o", out.to_str().expect("utf8")],
    );
    ok(o.clone(), "folded");
    assert!(
        o.stderr.is_empty(),
        "a pipe gets no progress bar: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(std::fs::read_to_string(&out).expect("output").lines().count(), 600);
    // The same export on a terminal (script(1) gives it a pty) draws one.
    if tool("script", "util-linux").is_none() {
        return;
    }
    let cmd = format!(
        "env XDG_CACHE_HOME={} {} --db {} --host alpha --format folded -o {}",
        t.tmp().join("cache").display(),
        env!("CARGO_BIN_EXE_dcpiprof"),
        t.root().display(),
        out.display()
    );
    let o = Command::new("script").args(["-qec", &cmd, "/dev/null"]).output().expect("script");
    let tty = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{tty}");
    assert!(
        tty.contains("symbolizing") && tty.contains("/600 profiles"),
        "no progress bar on a tty: {tty:?}"
    );
}

#[test]
fn pprof_structure_sample_types_mappings_addresses_and_labels() {
    use dcpi_client::prof::export::pprof::proto;
    use prost::Message;
    use std::io::Read;

    let t = TestDb::new();
    let p = build_prog(t.tmp());
    workload(&t, &p);
    // A second event, in a third epoch, with its own period.
    let hd = host_dir(&t, 3600, "alpha");
    let faults = event("page-faults", 10);
    let alpha = p.funcs["hot_alpha"];
    Image::new(ImageKind::Elf, p.id.clone(), p.path.display().to_string().as_bytes())
        .profile(&faults)
        .counts(&[(alpha, 9)])
        .period(10)
        .write(&hd);
    let sel = ["--host", "alpha", "--epoch", "all"];
    let out = ok(prof(&t.root(), &[&sel[..], &["--format", "pprof"]].concat()), "pprof to a pipe");
    let mut raw = Vec::new();
    GzDecoder::new(&out[..]).read_to_end(&mut raw).expect("gunzip");
    let pb = proto::Profile::decode(&raw[..]).expect("decode profile.proto");
    let s = |i: i64| pb.string_table[i as usize].as_str();
    let types: Vec<String> =
        pb.sample_type.iter().map(|v| format!("{}/{}", s(v.r#type), s(v.unit))).collect();
    assert_eq!(
        types,
        [
            "cpu-clock_samples/count",
            "cpu/nanoseconds",
            "page-faults_samples/count",
            "page-faults/events"
        ]
    );
    assert_eq!(s(pb.default_sample_type), "cpu");
    assert_eq!(pb.period, 3000, "nominal period of the first event");
    let report = json_ok(&t.root(), &sel);
    for (ei, ev) in report["events"].as_array().expect("events").iter().enumerate() {
        let n: i64 = pb.sample.iter().map(|x| x.value[2 * ei]).sum();
        let w: i64 = pb.sample.iter().map(|x| x.value[2 * ei + 1]).sum();
        assert_eq!(n as u64, ev["samples"].as_u64().expect("samples"), "{ev}");
        assert!((w - ev["events"].as_i64().expect("events")).abs() <= 2, "{w} vs {ev}");
    }
    // prog's mapping: its path and build-id; each address is the mapping start plus the offset.
    let m = pb
        .mapping
        .iter()
        .find(|m| s(m.filename) == p.path.display().to_string())
        .expect("prog mapping");
    let ProfileId(bid) = profile_id(&p.id);
    assert_eq!(s(m.build_id), bid);
    assert!(m.has_functions && m.file_offset == 0);
    let loc = pb
        .location
        .iter()
        .find(|l| l.mapping_id == m.id && l.address == m.memory_start + alpha)
        .expect("location at hot_alpha's offset");
    assert!(loc.address < m.memory_limit);
    let f = pb.function.iter().find(|f| f.id == loc.line[0].function_id).expect("function");
    assert_eq!((s(f.name), s(f.system_name)), ("hot_alpha", "hot_alpha"));
    // Mappings do not overlap.
    for a in &pb.mapping {
        for b in pb.mapping.iter().filter(|b| b.id != a.id) {
            assert!(a.memory_limit <= b.memory_start || b.memory_limit <= a.memory_start);
        }
    }
    // Every sample says where it was taken.
    let epochs: std::collections::BTreeSet<&str> = pb
        .sample
        .iter()
        .map(|x| {
            let l =
                |k: &str| x.label.iter().find(|l| s(l.key) == k).map(|l| s(l.str)).expect("label");
            assert_eq!(l("host"), "alpha");
            l("epoch")
        })
        .collect();
    let want: std::collections::BTreeSet<&str> =
        report["epochs"].as_array().expect("epochs").iter().filter_map(Value::as_str).collect();
    assert_eq!(epochs, want);
}

struct ProfileId(String);

fn profile_id(id: &ImageId) -> ProfileId {
    match id {
        ImageId::BuildId(b) => ProfileId(b.iter().map(|x| format!("{x:02x}")).collect()),
        ImageId::Fallback(_) => panic!("prog has a build-id"),
    }
}

/// A JIT region sampled only as a caller has no flat profile: its names come from the JIT
/// symbols the stack file carries (FORMAT.md §13, version 2), in `--callers` and in folded
/// stacks; the leaf's come from its flat profile as before.
#[test]
fn jit_frames_sampled_only_as_callers_are_named_from_the_stack_file() {
    use profile_format::{StackImage, StackProfile};
    let t = TestDb::new();
    let hd = host_dir(&t, 0, "alpha");
    let ev = event("cpu-clock", 1_000_000);
    let leaf = ImageId::Fallback([1; 16]);
    let caller = ImageId::Fallback([2; 16]);
    let sym = |start: u64, name: &str| JitSymbol { start, size: 0x100, name: name.into() };
    Image::new(ImageKind::Anon, leaf.clone(), b"[anon:100]")
        .profile(&ev)
        .counts(&[(0x1010, 10)])
        .period(1_000_000)
        .jit_symbols(vec![sym(0x1000, "LazyCompile:leafjit")])
        .write(&hd);
    let mut st = StackProfile::new(&hd.host, hd.epoch.as_str(), "cpu-clock");
    let img = |id: &ImageId, path: &[u8]| StackImage {
        kind: ImageKind::Anon,
        id: id.clone(),
        path: path.to_vec(),
    };
    let a = st.image_index(&img(&leaf, b"[anon:100]"));
    let b = st.image_index(&img(&caller, b"[anon:100:2]"));
    st.add(&[(a, 0x1010), (b, 0x2020)], false, 10);
    st.add_jit_symbols(b, [&sym(0x2000, "LazyCompile:callerjit")]);
    st.write(&hd.stacks_path("cpu-clock")).expect("write stacks");

    let o = prof(
        &t.root(),
        &["--host", "alpha", "--callers", "LazyCompile:leafjit", "--format", "json"],
    );
    let r: Value = serde_json::from_slice(&ok(o, "--callers")).expect("json");
    assert_eq!(r["rows"][0]["symbol"], "LazyCompile:callerjit", "{r:#}");
    let folded = String::from_utf8(ok(
        prof(&t.root(), &["--host", "alpha", "--format", "folded"]),
        "folded",
    ))
    .expect("utf-8");
    assert!(
        folded.lines().any(|l| l.ends_with("LazyCompile:callerjit;LazyCompile:leafjit 10")),
        "{folded}"
    );
}

/// Decode a `--format pprof` export.
fn pprof_of(db: &Path, args: &[&str]) -> Profile {
    use prost::Message;
    use std::io::Read;
    let out = ok(prof(db, &[args, &["--format", "pprof"]].concat()), "pprof export");
    let mut raw = Vec::new();
    GzDecoder::new(&out[..]).read_to_end(&mut raw).expect("gunzip");
    Profile::decode(&raw[..]).expect("decode")
}

/// Issue 39 item 4: a 62 s epoch whose summary a restarted daemon rewrote 140 s after its
/// start. The profile's time is the epoch's start and its duration the time sampled (62 s),
/// not the span to `last_written`; the main mapping (`File:` in pprof) is the hottest user
/// image, not the kernel, and a profile of the kernel alone has no main file.
#[test]
fn pprof_duration_is_the_sampled_time_and_file_the_hottest_user_image() {
    let t = TestDb::new();
    let p = build_prog(t.tmp());
    let hd = host_dir(&t, 0, "alpha");
    let ev = event("cpu-clock", 1000);
    Image::new(ImageKind::Elf, p.id.clone(), p.path.display().to_string().as_bytes())
        .profile(&ev)
        .counts(&[(p.funcs["hot_alpha"], 30)])
        .write(&hd);
    Image::new(ImageKind::Elf, ImageId::BuildId(vec![0xab; 20]), b"/usr/lib/libcold.so.1")
        .profile(&ev)
        .counts(&[(0x1234, 5)])
        .write(&hd);
    // The kernel is hotter than any user image.
    Image::kernel("6.1.0").profile(&ev).counts(&[(0x100, 90)]).write(&hd);
    let start = hd.epoch.start_time().duration_since(std::time::UNIX_EPOCH).expect("epoch time");
    let mut s = write_summaries(&hd, 125);
    s.index = None;
    s.cpus = vec![0, 1];
    s.events = vec![profile_format::EventSummary {
        desc: Some(ev.clone()),
        time_enabled_ns: 124_000_000_000,
        time_running_ns: 124_000_000_000,
        ..Default::default()
    }];
    s.first_written = start.as_secs() + 5;
    s.last_written = start.as_secs() + 140;
    s.write(&hd.summary_path()).expect("summary.json");
    std::fs::remove_file(hd.summary_index_path()).expect("remove summary.idx");

    let pb = pprof_of(&t.root(), &["--host", "alpha", "--epoch", "all"]);
    let s = |i: i64| pb.string_table[i as usize].as_str();
    assert_eq!(pb.time_nanos, i64::try_from(start.as_nanos()).expect("ns"));
    assert_eq!(pb.duration_nanos, 62_000_000_000, "62 s sampled, not 140 s to last_written");
    assert_eq!(s(pb.mapping[0].filename), p.path.display().to_string(), "main mapping");
    assert!(pb.mapping.iter().any(|m| s(m.filename).contains("kernel")), "kernel mapped too");

    // Only the kernel: no main file.
    let pb = pprof_of(&t.root(), &["--host", "alpha", "--epoch", "all", "--image", "kernel"]);
    assert_eq!(pb.string_table[pb.mapping[0].filename as usize], "", "{:?}", pb.mapping);
    assert!(pb.location.iter().all(|l| l.mapping_id != pb.mapping[0].id));
}

/// Stacks name the command that ran them (FORMAT.md §13, version 3): every export roots them
/// at it (`comm;outer;...;leaf`, as stackcollapse-perf does), `--command` selects them, and
/// `--callers --command` counts that command's stacks only; stacks of older files, which have
/// no command, are rooted at `[unknown command]`.
#[test]
fn stacks_are_rooted_at_their_command_and_selected_by_it() {
    use profile_format::{StackImage, StackProfile};
    let t = TestDb::new();
    let hd = host_dir(&t, 0, "alpha");
    let ev = event("cpu-clock", 1_000_000);
    let leaf = ImageId::Fallback([1; 16]);
    let caller = ImageId::Fallback([2; 16]);
    let sym = |start: u64, name: &str| JitSymbol { start, size: 0x100, name: name.into() };
    Image::new(ImageKind::Anon, leaf.clone(), b"[anon:100]")
        .profile(&ev)
        .counts(&[(0x1010, 18)])
        .period(1_000_000)
        .jit_symbols(vec![sym(0x1000, "leafjit")])
        .write(&hd);
    let mut st = StackProfile::new(&hd.host, hd.epoch.as_str(), "cpu-clock");
    let img = |id: &ImageId, path: &[u8]| StackImage {
        kind: ImageKind::Anon,
        id: id.clone(),
        path: path.to_vec(),
    };
    let a = st.image_index(&img(&leaf, b"[anon:100]"));
    let b = st.image_index(&img(&caller, b"[anon:100:2]"));
    st.add_jit_symbols(b, [&sym(0x2000, "callerjit")]);
    let (pg, bench) = (st.command_index(b"postgres"), st.command_index(b"pgbench"));
    st.add_command(Some(pg), &[(a, 0x1010), (b, 0x2020)], false, 10);
    st.add_command(Some(bench), &[(a, 0x1010), (b, 0x2020)], false, 5);
    st.add(&[(a, 0x1010), (b, 0x2020)], false, 3);
    st.write(&hd.stacks_path("cpu-clock")).expect("write stacks");

    let folded = |extra: &[&str]| {
        let args = [&["--host", "alpha", "--format", "folded"][..], extra].concat();
        let out = String::from_utf8(ok(prof(&t.root(), &args), "folded")).expect("utf-8");
        let mut lines: Vec<String> = out.lines().map(str::to_owned).collect();
        lines.sort();
        lines
    };
    assert_eq!(
        folded(&[]),
        [
            "[unknown command];callerjit;leafjit 3",
            "pgbench;callerjit;leafjit 5",
            "postgres;callerjit;leafjit 10"
        ]
    );
    assert_eq!(folded(&["--command", "pgbench"]), ["pgbench;callerjit;leafjit 5"]);
    let svg = String::from_utf8(ok(
        prof(&t.root(), &["--host", "alpha", "--format", "svg", "--command", "postgres"]),
        "svg",
    ))
    .expect("utf-8");
    assert!(svg.contains("postgres") && !svg.contains("pgbench"), "{svg}");
    let calls = |extra: &[&str]| {
        let args =
            [&["--host", "alpha", "--callers", "leafjit", "--format", "json"][..], extra].concat();
        let r: Value =
            serde_json::from_slice(&ok(prof(&t.root(), &args), "--callers")).expect("json");
        r["samples"].as_u64().expect("samples")
    };
    assert_eq!(calls(&[]), 18);
    assert_eq!(calls(&["--command", "postgres"]), 10);
    assert_eq!(calls(&["--command", "[unknown command]"]), 3);
    // A command without stacks, and filters the stacks cannot answer, are clear errors.
    let o = prof(&t.root(), &["--host", "alpha", "--callers", "leafjit", "--command", "nginx"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("\"nginx\""), "{o:?}");
    let o = prof(&t.root(), &["--host", "alpha", "--callers", "leafjit", "--pid", "1"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("--pid") && e.contains("--command"), "{e}");
}

/// A function no symbol names (a stripped image's static function) is named by its image and
/// offset range (`IMAGE+0xSTART-0xEND`) for `--callers`/`--callees`, alone or with `--image`.
#[test]
fn a_function_without_a_symbol_is_named_by_its_offset_range() {
    use profile_format::{StackImage, StackProfile};
    let t = TestDb::new();
    let hd = host_dir(&t, 0, "alpha");
    let ev = event("cpu-clock", 1_000_000);
    let leaf = ImageId::Fallback([1; 16]);
    let stripped = ImageId::Fallback([2; 16]);
    let sym = |start: u64, name: &str| JitSymbol { start, size: 0x100, name: name.into() };
    Image::new(ImageKind::Anon, leaf.clone(), b"[anon:100]")
        .profile(&ev)
        .counts(&[(0x1010, 13)])
        .period(1_000_000)
        .jit_symbols(vec![sym(0x1000, "leafjit")])
        .write(&hd);
    // --image names an image by its flat profile: the stripped image's own samples.
    Image::new(ImageKind::Anon, stripped.clone(), b"[anon:stripped]")
        .profile(&ev)
        .counts(&[(0x3010, 1)])
        .period(1_000_000)
        .write(&hd);
    let mut st = StackProfile::new(&hd.host, hd.epoch.as_str(), "cpu-clock");
    let img = |id: &ImageId, path: &[u8]| StackImage {
        kind: ImageKind::Anon,
        id: id.clone(),
        path: path.to_vec(),
    };
    let a = st.image_index(&img(&leaf, b"[anon:100]"));
    let b = st.image_index(&img(&stripped, b"[anon:stripped]"));
    // Two functions of the stripped image in one page: 0x3010 and 0x3090 (0x3080-0x3100).
    st.add(&[(a, 0x1010), (b, 0x3010)], false, 4);
    st.add(&[(a, 0x1010), (b, 0x3090)], false, 9);
    st.write(&hd.stacks_path("cpu-clock")).expect("write stacks");
    let callees = |spec: &str, extra: &[&str]| {
        let args =
            [&["--host", "alpha", "--callees", spec, "--format", "json"][..], extra].concat();
        let o = prof(&t.root(), &args);
        (o.status.code(), serde_json::from_slice::<Value>(&o.stdout).ok())
    };
    // By page, both functions are one name, as the reports show them.
    let (code, r) = callees("[anon:stripped]+0x3000", &[]);
    assert_eq!((code, r.as_ref().map(|r| r["samples"].clone())), (Some(0), Some(13.into())));
    // By offset range, each alone.
    let (code, r) = callees("[anon:stripped]+0x3000-0x3080", &[]);
    let r = r.expect("json");
    assert_eq!((code, r["samples"].as_u64()), (Some(0), Some(4)), "{r:#}");
    assert_eq!(r["rows"][0]["symbol"], "leafjit", "{r:#}");
    let o = prof(
        &t.root(),
        &["--host", "alpha", "--callees", "+0x3080..0x3100", "--image", "[anon:stripped]"],
    );
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let (code, r) = callees("+0x3080..0x3100", &["--image", "[anon:stripped]"]);
    assert_eq!((code, r.map(|r| r["samples"].clone())), (Some(0), Some(9.into())));
    // A range in an image no stack has: nothing, and a clear error.
    let (code, _) = callees("other+0x3000-0x3080", &[]);
    assert_eq!(code, Some(2));
}

/// The HTML report's timeline (issue 36): one bar per minute slice of the selection, drawn by
/// a real browser, its samples those of the flat report (the slices hold exactly the
/// profiles' samples here, cut into three minutes per epoch).
#[dcpi_testkit::test(tool("chromium"))]
fn html_report_draws_the_timeline_of_the_slices() {
    let t = TestDb::new();
    let p = build_prog(t.tmp());
    workload(&t, &p);
    let db = profile_format::Database::open(&t.root()).expect("db");
    let mut minutes = 0;
    for e in db.epochs().expect("epochs") {
        let hd = db.host_dir(&e, "alpha").expect("dir");
        let start = select::epoch_start(e.as_str()).expect("epoch start");
        let start = start - start % 60;
        let (mut w, _) = profile_format::SliceWriter::open(&hd.slices_path()).expect("writer");
        let mut slices: Vec<profile_format::Slice> = (0..3)
            .map(|i| profile_format::Slice { start: start + 60 * i, len: 60, ..Default::default() })
            .collect();
        for entry in hd.profiles().expect("profiles") {
            let prof = profile_format::Profile::read(&entry.path).expect("profile");
            let image =
                (prof.header.kind != ImageKind::Unknown).then(|| prof.header.image_id.clone());
            let key = profile_format::SliceKey { event: prof.header.event.name.clone(), image };
            for (n, (&off, &c)) in prof.counts.iter().enumerate() {
                slices[n % 3].counts.entry(key.clone()).or_default().push((off, c));
            }
        }
        for s in &slices {
            w.append(s).expect("append");
        }
        minutes += slices.len();
    }
    let file = t.tmp().join("report.html");
    let f = file.to_str().expect("utf8");
    ok(
        prof(&t.root(), &["--host", "alpha", "--epoch", "all", "--format", "html", "-o", f]),
        "html",
    );
    let total = json_ok(&t.root(), &["--host", "alpha", "--epoch", "all"])["total_samples"]
        .as_u64()
        .expect("total");
    let dom = render(&file, t.tmp());
    assert!(dom.contains("data-ready=\"1\""), "scripts did not run to the end:\n{dom}");
    let want = format!("class=\"timeline\" data-buckets=\"{minutes}\" data-samples=\"{total}\"");
    assert!(dom.contains(&want), "{want} not in the rendered page:\n{dom}");
    assert_eq!(dom.matches("class=\"bucket\"").count(), minutes, "one bar per minute");
    assert!(dom.contains("href=\"#timeline\""), "the timeline is in the navigation");
}
