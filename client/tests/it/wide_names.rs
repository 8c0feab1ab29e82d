//! Names whose terminal width differs from their length in bytes or characters (CJK
//! characters take two columns, a combining accent none, an escaped control several) keep
//! every text table aligned in every report tool: the tables measure widths in terminal
//! columns of the escaped text (`dcpi_report::render`). Before, dcpiprof's and dcpilist's
//! tables counted characters (and some titles bytes), so a CJK image path or symbol name
//! pushed the columns after it to the right.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime};

use profile_format::{Database, EpochId, ImageId, ImageKind, JitSymbol, WhoKey, WhoTable};
use unicode_width::UnicodeWidthStr;

use crate::util::event;
use dcpi_testkit::db::Image;

/// Symbol, image and command names: wide, combining, escaped, plain.
const NAMES: &[&str] = &["漢字漢字_run", "cafe\u{301}_e\u{301}", "esc\u{1b}x", "plain_name", "ü"];

struct Db {
    _dir: tempfile::TempDir,
    root: PathBuf,
    tmp: PathBuf,
    epochs: Vec<EpochId>,
}

/// Three epochs of two JIT images (one with a CJK path), each symbol's count varying.
fn wide_db() -> Db {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("db");
    let tmp = dir.path().to_path_buf();
    let db = Database::create(&root).expect("create db");
    let mut epochs = Vec::new();
    for i in 0..3u64 {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000 + i * 3600);
        let e = db.new_epoch(t, "alpha").expect("epoch");
        let hd = db.host_dir(&e, "alpha").expect("host dir");
        hd.create().expect("create host dir");
        let ev = event("cpu-clock", 1000);
        let jit: Vec<JitSymbol> = NAMES
            .iter()
            .enumerate()
            .map(|(k, n)| JitSymbol {
                start: 0x1000 * (k as u64 + 1),
                size: 0x100,
                name: (*n).into(),
            })
            .collect();
        let counts: Vec<(u64, u64)> = (0..NAMES.len() as u64)
            .map(|k| (0x1000 * (k + 1) + 4, 300 + k * 40 + (i * 97 * (k + 1)) % 250))
            .collect();
        for (tag, path) in [("w", "[anon:漢字漢字ランタイム]"), ("p", "[anon:plain]")] {
            let id = ImageId::special("[anon]", tag.as_bytes());
            Image::new(ImageKind::Anon, id.clone(), path.as_bytes())
                .profile(&ev)
                .counts(&counts)
                .period(1000)
                .jit_symbols(jit.clone())
                .write(&hd);
        }
        let mut who = WhoTable::new("alpha", &e.to_string());
        for (k, n) in NAMES.iter().enumerate() {
            let key = WhoKey {
                cgroup: format!("/system.slice/{n}.service"),
                command: n.as_bytes().to_vec(),
                pid: 1000 + k as u32,
                image: b"/usr/bin/x".to_vec(),
                event: "cpu-clock".into(),
            };
            who.add(key, 5 + k as u64);
        }
        who.write(&hd.who_path()).expect("who table");
        epochs.push(e);
    }
    Db { _dir: dir, root, tmp, epochs }
}

fn run(tool: &str, db: &Db, args: &[&str]) -> String {
    let exe = match tool {
        "dcpiprof" => env!("CARGO_BIN_EXE_dcpiprof"),
        "dcpilist" => env!("CARGO_BIN_EXE_dcpilist"),
        "dcpidiff" => env!("CARGO_BIN_EXE_dcpidiff"),
        "dcpistats" => env!("CARGO_BIN_EXE_dcpistats"),
        _ => unreachable!("{tool}"),
    };
    let o = Command::new(exe)
        .env("XDG_CACHE_HOME", db.tmp.join("cache"))
        .env_remove("DCPI_SYMBOL_CACHE")
        .arg("--db")
        .arg(&db.root)
        .args(["--host", "alpha"])
        .args(args)
        .output()
        .expect("run tool");
    let out = String::from_utf8(o.stdout).expect("utf-8 output");
    assert!(o.status.success(), "{tool} {args:?}: {}\n{out}", String::from_utf8_lossy(&o.stderr));
    out
}

/// Every line of the table (header and rows) has its last column start at the same terminal
/// column; a misaligned line is reported with the column of each line.
fn misaligned(text: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
    let start = |l: &str| l.rfind("  ").map(|i| UnicodeWidthStr::width(&l[..i + 2]));
    let starts: Vec<Option<usize>> = lines.iter().map(|l| start(l)).collect();
    (lines.len() < 3 || starts.windows(2).any(|w| w[0] != w[1])).then(|| {
        let rows: Vec<String> =
            lines.iter().zip(&starts).map(|(l, s)| format!("{s:?}: {l}")).collect();
        rows.join("\n")
    })
}

#[test]
fn wide_names_keep_every_table_aligned() {
    let db = wide_db();
    let (e0, e2) = (db.epochs[0].to_string(), db.epochs[2].to_string());
    let runs: &[(&str, &[&str])] = &[
        ("dcpiprof", &["--epoch", "all"]),
        ("dcpiprof", &["--epoch", "all", "--symbols"]),
        ("dcpiprof", &["--epoch", "all", "--image", "[anon:漢字"]),
        ("dcpiprof", &["--epoch", "all", "--by", "command"]),
        ("dcpiprof", &["--epoch", "all", "--by", "epoch", "--image", "[anon:漢字"]),
        ("dcpilist", &["--epoch", "all", "--top", "20"]),
        ("dcpidiff", &["--before", &e0, "--after", &e2]),
        ("dcpidiff", &["--before", &e0, "--after", &e2, "--image", "[anon:漢字"]),
        (
            "dcpistats",
            &["--epoch", "all", "--image", "[anon:漢字", "--min-samples", "1", "--min-share", "0"],
        ),
    ];
    let mut bad = Vec::new();
    for (tool, args) in runs {
        let mut a = vec!["--format", "table", "--color", "never"];
        if *tool == "dcpiprof" || *tool == "dcpilist" {
            a.truncate(2);
        }
        a.extend_from_slice(args);
        let out = run(tool, &db, &a);
        // Every name is in the table, escaped where it must be.
        if args.contains(&"--symbols") || *tool == "dcpilist" {
            for n in ["漢字漢字_run", "cafe\u{301}_e\u{301}", "esc\\u{1b}x", "漢字漢字ランタイム"]
            {
                if !out.contains(n) {
                    bad.push(format!("{tool} {a:?}: {n:?} missing:\n{out}"));
                }
            }
        }
        if let Some(m) = misaligned(&out) {
            bad.push(format!("{tool} {a:?}: columns not aligned:\n{m}"));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n\n"));
}
