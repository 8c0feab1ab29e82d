//! `--command NAME` with every profile report and output format (issue 38 item 2): read from
//! the per-command profiles dcpid writes by default (`by_command`, FORMAT.md §5.6). The
//! database: /opt/none/app run by two commands, `alpha` (5 samples at 0x1000, 2 at 0x2000)
//! and `beta` (8 at 0x3000, 1 at 0x2000); the flat profile holds them all. Every test checks
//! that the output holds alpha's offsets and samples and none of beta's.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output};

use dcpi_testkit::db::{who_key, write_who, Image};
use flate2::read::GzDecoder;
use profile_format::{HostDir, ImageId, ProfileWho};

use crate::util::*;

const ALPHA: [(u64, u64); 2] = [(0x1000, 5), (0x2000, 2)];
const BETA: [(u64, u64); 2] = [(0x2000, 1), (0x3000, 8)];

fn app() -> Image {
    Image::elf(ImageId::from_build_id(&[0x6b; 20]).expect("id"), "/opt/none/app")
}

/// One epoch of `h1`: flat profile, per-command profiles (scaled by `scale`), who table.
fn write_epoch(hd: &HostDir, scale: u64, per_command: bool) {
    let img = app();
    let scaled = |c: &[(u64, u64)]| c.iter().map(|&(o, n)| (o, n * scale)).collect::<Vec<_>>();
    let (a, b) = (scaled(&ALPHA), scaled(&BETA));
    let mut flat = std::collections::BTreeMap::new();
    for &(o, n) in a.iter().chain(&b) {
        *flat.entry(o).or_insert(0) += n;
    }
    let flat: Vec<(u64, u64)> = flat.into_iter().collect();
    img.profile(&cpu_clock()).counts(&flat).period(1_000_000).write(hd);
    if per_command {
        for (cmd, counts) in [("alpha", &a), ("beta", &b)] {
            let who = ProfileWho::Command { command: cmd.as_bytes().to_vec() };
            img.profile(&cpu_clock()).who(who).counts(counts).period(1_000_000).write(hd);
        }
    }
    let sum = |c: &[(u64, u64)]| c.iter().map(|p| p.1).sum::<u64>();
    write_who(
        hd,
        &[
            (who_key("alpha", "/opt/none/app", "cpu-clock"), sum(&a)),
            (who_key("beta", "/opt/none/app", "cpu-clock"), sum(&b)),
        ],
    );
}

fn db(per_command: bool) -> TestDb {
    let t = TestDb::new();
    let e = t.epoch(0);
    write_epoch(&t.host(&e, "h1"), 1, per_command);
    t
}

fn run(tool: &str, db: &Path, args: &[&str]) -> Output {
    let exe = match tool {
        "dcpilist" => env!("CARGO_BIN_EXE_dcpilist"),
        "dcpidiff" => env!("CARGO_BIN_EXE_dcpidiff"),
        _ => env!("CARGO_BIN_EXE_dcpiprof"),
    };
    Command::new(exe)
        .env("XDG_CACHE_HOME", db.parent().unwrap_or(db).join("cache"))
        .env_remove("DCPI_SYMBOL_CACHE")
        .arg("--db")
        .arg(db)
        .arg("--no-system-debug")
        .args(["--host", "h1"])
        .args(args)
        .output()
        .expect("run")
}

fn ok(o: &Output, what: &str) -> String {
    assert!(o.status.success(), "{what}: exit {:?}: {}", o.status.code(), stderr(o));
    stdout(o)
}

/// alpha's offsets are named in `text`, beta's own offset (0x3000) is not.
fn only_alpha(text: &str, what: &str) {
    assert!(text.contains("0x1000"), "{what}: alpha's 0x1000 missing:\n{text}");
    assert!(!text.contains("0x3000"), "{what}: beta's 0x3000 present:\n{text}");
}

fn total(v: &serde_json::Value) -> u64 {
    v["total_samples"].as_u64().expect("total_samples")
}

#[test]
fn per_symbol_json_counts_only_the_command() {
    let t = db(true);
    let o =
        run("dcpiprof", &t.root(), &["--command", "alpha", "--image", "app", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&o, "json")).expect("JSON");
    assert_eq!(v["report"], "symbols", "{v:#}");
    assert_eq!(total(&v), 7, "{v:#}");
    let n: u64 = rows(&v).iter().map(|r| r["samples"].as_u64().unwrap_or(0)).sum();
    assert_eq!(n, 7, "{v:#}");
    only_alpha(&v.to_string(), "json");
    // Without --command: both commands, as the flat profile.
    let o = run("dcpiprof", &t.root(), &["--image", "app", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&o, "flat")).expect("JSON");
    assert_eq!(total(&v), 16, "{v:#}");
}

#[test]
fn per_symbol_table_and_csv() {
    let t = db(true);
    for f in ["table", "csv"] {
        let o = run("dcpiprof", &t.root(), &["--command", "beta", "--image", "app", "--format", f]);
        let text = ok(&o, f);
        assert!(text.contains("0x3000"), "{f}: beta's 0x3000 missing:\n{text}");
        assert!(!text.contains("0x1000"), "{f}: alpha's 0x1000 present:\n{text}");
    }
}

#[test]
fn all_symbols_and_by_symbol() {
    let t = db(true);
    for extra in [&["--symbols"][..], &["--by", "symbol"]] {
        let mut a = vec!["--command", "alpha", "--format", "json"];
        a.extend_from_slice(extra);
        let v: serde_json::Value =
            serde_json::from_str(&ok(&run("dcpiprof", &t.root(), &a), "symbols")).expect("JSON");
        assert_eq!(v["report"], "global-symbols", "{v:#}");
        assert_eq!(total(&v), 7, "{extra:?}: {v:#}");
        only_alpha(&v.to_string(), "--symbols");
    }
}

#[test]
fn per_image_from_the_per_command_profiles() {
    let t = db(true);
    let o = run("dcpiprof", &t.root(), &["--command", "beta", "--by", "image", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&o, "images")).expect("JSON");
    assert_eq!(v["report"], "images", "{v:#}");
    assert_eq!(row(&v, "image", "/opt/none/app")["samples"], 9, "{v:#}");
}

#[test]
fn folded_export() {
    let t = db(true);
    let text =
        ok(&run("dcpiprof", &t.root(), &["--command", "alpha", "--format", "folded"]), "folded");
    let n: u64 = text
        .lines()
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, c)| c.parse::<u64>().ok()))
        .sum();
    assert_eq!(n, 7, "{text}");
    only_alpha(&text, "folded");
}

#[test]
fn svg_export() {
    let t = db(true);
    let text = ok(&run("dcpiprof", &t.root(), &["--command", "alpha", "--format", "svg"]), "svg");
    assert!(text.contains("<svg"), "{text}");
    only_alpha(&text, "svg");
}

#[test]
fn html_export() {
    let t = db(true);
    let text = ok(&run("dcpiprof", &t.root(), &["--command", "alpha", "--format", "html"]), "html");
    assert!(
        text.contains("<html") || text.contains("<!DOCTYPE"),
        "{}",
        &text[..200.min(text.len())]
    );
    only_alpha(&text, "html");
}

#[test]
fn speedscope_export() {
    let t = db(true);
    let text =
        ok(&run("dcpiprof", &t.root(), &["--command", "alpha", "--format", "speedscope"]), "ss");
    serde_json::from_str::<serde_json::Value>(&text).expect("speedscope JSON");
    only_alpha(&text, "speedscope");
}

#[test]
fn pprof_export() {
    let t = db(true);
    let file = t.tmp().join("alpha.pb.gz");
    let f = file.to_str().expect("utf8");
    ok(
        &run("dcpiprof", &t.root(), &["--command", "alpha", "--format", "pprof", "--output", f]),
        "pprof",
    );
    let mut raw = Vec::new();
    GzDecoder::new(std::fs::File::open(&file).expect("open"))
        .read_to_end(&mut raw)
        .expect("gunzip");
    // The string table holds the function names: alpha's, not beta's.
    only_alpha(&String::from_utf8_lossy(&raw), "pprof");
}

#[test]
fn dcpilist_top_of_a_command() {
    let t = db(true);
    let o = run("dcpilist", &t.root(), &["--top", "10", "--command", "alpha", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&o, "dcpilist")).expect("JSON");
    assert_eq!(total(&v), 7, "{v:#}");
    let offsets: Vec<u64> = rows(&v).iter().filter_map(|r| r["offset"].as_u64()).collect();
    assert_eq!(offsets, [0x1000, 0x2000], "alpha's offsets only, hottest first: {v:#}");
}

#[test]
fn dcpidiff_of_a_command() {
    let t = TestDb::new();
    let (e1, e2) = (t.epoch(0), t.epoch(3600));
    write_epoch(&t.host(&e1, "h1"), 1, true);
    write_epoch(&t.host(&e2, "h1"), 10, true);
    let o = run(
        "dcpidiff",
        &t.root(),
        &[
            "--before",
            e1.as_str(),
            "--after",
            e2.as_str(),
            "--command",
            "alpha",
            "--image",
            "app",
            "--compare",
            "samples",
            "--format",
            "json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&ok(&o, "dcpidiff")).expect("JSON");
    only_alpha(&v.to_string(), "dcpidiff");
    let text = v.to_string();
    assert!(text.contains("70") || text.contains("7,"), "alpha's 7 -> 70 samples:\n{v:#}");
}

#[test]
fn a_time_range_is_refused_naming_why() {
    let t = db(true);
    for (tool, args) in [
        ("dcpiprof", &["--command", "alpha", "--image", "app", "--since", "2h"][..]),
        ("dcpiprof", &["--command", "alpha", "--format", "folded", "--since", "2h"]),
        ("dcpilist", &["--top", "3", "--command", "alpha", "--since", "2h"]),
    ] {
        let o = run(tool, &t.root(), args);
        assert_eq!(o.status.code(), Some(2), "{tool} {args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains("per-command profiles") && e.contains("no time axis"), "{args:?}: {e}");
    }
}

#[test]
fn without_per_command_profiles_the_report_says_so() {
    let t = db(false);
    let o = run("dcpiprof", &t.root(), &["--command", "alpha", "--image", "app"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("recorded without by_command"), "{}", stderr(&o));
    // --by image falls back to the who tables, which answer it.
    let o =
        run("dcpiprof", &t.root(), &["--command", "alpha", "--by", "image", "--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&ok(&o, "who")).expect("JSON");
    assert_eq!(row(&v, "image", "/opt/none/app")["samples"], 7, "{v:#}");
}

/// Issue 38: an image only `alpha` ran has a sole-command stub instead of a copy of its flat
/// profile (FORMAT.md §5.6.1): `--command alpha` reads the flat profile for it, per image and
/// per symbol; `beta` did not run it.
#[test]
fn a_sole_command_stub_reads_as_the_flat_profile() {
    let t = TestDb::new();
    let hd = t.host(&t.epoch(0), "h1");
    write_epoch(&hd, 1, true);
    let solo = Image::elf(ImageId::from_build_id(&[0x5c; 20]).expect("id"), "/opt/none/solo");
    let flat = solo.profile(&cpu_clock()).counts(&[(0x500, 4)]).period(1_000_000);
    flat.write(&hd);
    let header = flat.build(&hd.host, &hd.epoch).header;
    let stub = profile_format::Profile::sole_command_stub(&header, b"alpha".to_vec(), 0);
    let who = ProfileWho::Command { command: b"alpha".to_vec() };
    stub.write(&hd.who_profile_path(&solo.id, "cpu-clock", &who)).expect("stub");
    let json = |args: &[&str]| -> serde_json::Value {
        let mut a = args.to_vec();
        a.extend(["--format", "json"]);
        serde_json::from_str(&ok(&run("dcpiprof", &t.root(), &a), "json")).expect("JSON")
    };
    let v = json(&["--command", "alpha", "--image", "solo"]);
    assert_eq!(total(&v), 4, "{v:#}");
    let v = json(&["--command", "alpha", "--symbols"]);
    assert_eq!(total(&v), 7 + 4, "{v:#}");
    let v = json(&["--command", "beta", "--symbols"]);
    assert_eq!(total(&v), 9, "{v:#}");
    assert!(!v.to_string().contains("solo"), "{v:#}");
}

/// One epoch of `h1` with per-cgroup profiles (dcpid's `by_cgroup`): alpha's samples in
/// `/system.slice/web.service`, beta's in `/system.slice/db.service`, scaled by `scale`.
fn write_cgroup_epoch(hd: &HostDir, scale: u64) {
    write_epoch(hd, scale, false);
    let img = app();
    for (cg, counts) in [("/system.slice/web.service", &ALPHA), ("/system.slice/db.service", &BETA)]
    {
        let c: Vec<(u64, u64)> = counts.iter().map(|&(o, n)| (o, n * scale)).collect();
        let who = ProfileWho::Cgroup { path: cg.into() };
        img.profile(&cpu_clock()).who(who).counts(&c).period(1_000_000).write(hd);
    }
}

/// Issue 38 item 2: `--cgroup PATH` and `--unit NAME` in dcpilist (`--top`) and dcpidiff,
/// through the one who selection (the per-cgroup profiles, as dcpiprof reads them); a
/// database without per-cgroup profiles is an error saying so.
#[test]
fn dcpilist_and_dcpidiff_select_a_cgroup_or_unit() {
    let t = TestDb::new();
    let (e1, e2) = (t.epoch(0), t.epoch(3600));
    write_cgroup_epoch(&t.host(&e1, "h1"), 1);
    write_cgroup_epoch(&t.host(&e2, "h1"), 10);
    for sel in [["--cgroup", "/system.slice/web.service"], ["--unit", "web.service"]] {
        let mut a = vec!["--top", "10", "--epoch", e1.as_str(), "--format", "json"];
        a.extend(sel);
        let v: serde_json::Value =
            serde_json::from_str(&ok(&run("dcpilist", &t.root(), &a), "dcpilist")).expect("JSON");
        assert_eq!(total(&v), 7, "{sel:?}: {v:#}");
        let offsets: Vec<u64> = rows(&v).iter().filter_map(|r| r["offset"].as_u64()).collect();
        assert_eq!(offsets, [0x1000, 0x2000], "{sel:?}: web's offsets only: {v:#}");
        let mut a = vec!["--before", e1.as_str(), "--after", e2.as_str(), "--image", "app"];
        a.extend(["--compare", "samples", "--format", "json"]);
        a.extend(sel);
        let v: serde_json::Value =
            serde_json::from_str(&ok(&run("dcpidiff", &t.root(), &a), "dcpidiff")).expect("JSON");
        only_alpha(&v.to_string(), "dcpidiff --cgroup");
    }
    // Without per-cgroup profiles (only per-command ones): exit 2 naming by_cgroup.
    let t = db(true);
    let o = run("dcpilist", &t.root(), &["--top", "10", "--unit", "web.service"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("by_cgroup"), "{}", stderr(&o));
}
