//! Hostile names in a database (perf-map and ELF symbol names, image paths, kernel symbols, an
//! event name, command names in who tables: invalid UTF-8, ESC and other C0/C1 controls, DEL,
//! NUL, broken mangled names, bidi overrides and isolates, line separators, zero-width
//! characters, spreadsheet formulas) never panic a report tool and never reach the output raw:
//! every tool's tables and CSV escape control, format and separator characters (Unicode Cc, Cf,
//! Zl, Zp), CSV neutralises formulas, and JSON stays valid, with control characters escaped and
//! format characters exact.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use profile_format::{
    Database, EpochId, ImageId, ImageKind, JitSymbol, KallsymsSnapshot, KernelSymbol, WhoKey,
    WhoTable,
};

use crate::util::{asm_calling, event};
use dcpi_client::escape;
use dcpi_testkit::db::Image;

/// Names a hostile process or file could carry (all valid UTF-8 strings: the profile format
/// stores names as text; the daemon replaces bytes that are not UTF-8).
const EVIL: &[&str] = &[
    "esc\u{1b}[2Jclear",
    "two\nlines",
    "tab\there",
    "nul\u{0}byte",
    "del\u{7f}",
    "c1\u{9b}31mcsi",
    "bell\u{7}\u{1b}]0;title\u{7}",
    "_ZN3foo",
    "_ZN3foo3barE\u{1b}",
    "_RNvCs_broken\u{1b}",
    "_ZN4core3ptr\u{fffd}\u{fffd}17h0123456789abcdefE",
    "cr\rreturn",
    "rlo\u{202e}gnp.exe",
    "lri\u{2066}iso\u{2069}",
    "ls\u{2028}ps\u{2029}",
    "zw\u{200b}bom\u{feff}",
    "=HYPERLINK(\"x\")",
    "+cmd|' /C calc'!A0",
];

fn elf_with_hostile_symbol(dir: &Path) -> Option<(PathBuf, ImageId, u64)> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    // A symbol whose name is not UTF-8 and holds an ESC (raw bytes in the assembly).
    let name: &[u8] = b"\"bad\xff\x1b[31mname\xc2\x9b\"";
    let asm = asm_calling(name);
    let src = dir.join("hostile.s");
    std::fs::write(&src, &asm).ok()?;
    let bin = dir.join("hostile");
    let o =
        Command::new("cc").args(["-Wl,--build-id=sha1", "-o"]).arg(&bin).arg(&src).output().ok()?;
    if !o.status.success() {
        eprintln!("cc failed: {}", String::from_utf8_lossy(&o.stderr));
        return None;
    }
    let data = std::fs::read(&bin).ok()?;
    let obj = object::File::parse(&*data).ok()?;
    let id = ImageId::BuildId(obj.build_id().ok()??.to_vec());
    let sym = obj.symbols().find(|s| s.name_bytes().is_ok_and(|n| n.starts_with(b"bad\xff")))?;
    let seg = obj
        .segments()
        .find(|s| s.address() <= sym.address() && sym.address() < s.address() + s.size())?;
    let off = sym.address() - seg.address() + seg.file_range().0;
    Some((bin, id, off))
}

struct Db {
    _dir: tempfile::TempDir,
    root: PathBuf,
    tmp: PathBuf,
    epochs: Vec<EpochId>,
}

fn hostile_db() -> Db {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("db");
    let tmp = dir.path().to_path_buf();
    let db = Database::create(&root).expect("create db");
    let mut epochs = Vec::new();
    for (i, host) in ["alpha", "beta"].iter().enumerate() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000 + i as u64 * 3600);
        let e = db.new_epoch(t, host).expect("epoch");
        for h in ["alpha", "beta"] {
            let hd = db.host_dir(&e, h).expect("host dir");
            hd.create().expect("create host dir");
            let ev = event("cpu-clock", 1000);
            // JIT code: every hostile name, counts differing between epochs (for dcpidiff).
            let jit: Vec<JitSymbol> = EVIL
                .iter()
                .enumerate()
                .map(|(k, n)| JitSymbol {
                    start: 0x1000 * (k as u64 + 1),
                    size: 0x100,
                    name: (*n).into(),
                })
                .collect();
            let counts: Vec<(u64, u64)> = (0..EVIL.len() as u64)
                .map(|k| (0x1000 * (k + 1) + 4, 10 + k * (3 * i as u64 + 1)))
                .collect();
            let anon = ImageId::special("[anon]", format!("77{h}").as_bytes());
            let path = "[anon:77:js\u{1b}[31m\u{9b}]".as_bytes();
            Image::new(ImageKind::Anon, anon.clone(), path)
                .profile(&ev)
                .counts(&counts)
                .period(1000)
                .jit_symbols(jit.clone())
                .write(&hd);
            // An image path that is not UTF-8, with controls.
            let odd = ImageId::special("[odd]", h.as_bytes());
            Image::new(ImageKind::Anon, odd.clone(), b"/opt/\xff\x1b[2Jbad\x07path")
                .profile(&ev)
                .counts(&[(5, 3)])
                .period(1000)
                .jit_symbols(jit)
                .write(&hd);
            // The kernel, with a hostile symbol in the epoch's snapshot.
            let text = 0xffff_ffff_8100_0000u64;
            let snap = KallsymsSnapshot {
                kernel_release: "9.9.9-test".into(),
                kernel_build_id: None,
                text_base: text,
                modules: Vec::new(),
                symbols: vec![
                    KernelSymbol {
                        addr: text,
                        kind: b't',
                        name: "k\u{1b}[31mevil".into(),
                        module: None,
                    },
                    KernelSymbol {
                        addr: text + 0x100,
                        kind: b't',
                        name: "after\u{7f}".into(),
                        module: None,
                    },
                ],
            };
            snap.write(&hd.kallsyms_path()).expect("snapshot");
            let kid = ImageId::special("[kernel.kallsyms]", b"9.9.9-test");
            Image::new(ImageKind::Kernel, kid.clone(), b"[kernel.kallsyms]")
                .profile(&ev)
                .counts(&[(0x10, 4 + i as u64)])
                .period(1000)
                .write(&hd);
            // Who tables: every hostile name as a command, and as an image path.
            let mut who = WhoTable::new(h, &e.to_string());
            for (k, n) in EVIL.iter().enumerate() {
                let key = |image: &[u8]| WhoKey {
                    cgroup: format!("/system.slice/{}.service", n.replace('/', "_")),
                    command: n.as_bytes().to_vec(),
                    pid: 1000 + k as u32,
                    image: image.to_vec(),
                    event: "cpu-clock".into(),
                };
                who.add(key(b"/usr/bin/x"), 5 + k as u64);
                who.add(key(format!("/opt/{n}").as_bytes()), 2);
            }
            who.write(&hd.who_path()).expect("who table");
            // An event whose name holds an ESC (profiles are files anyone with write access to
            // the database may have made).
            let evil_ev = event("evil\u{1b}[31mevent", 1000);
            Image::new(ImageKind::Anon, anon.clone(), path)
                .profile(&evil_ev)
                .counts(&counts)
                .period(1000)
                .write(&hd);
        }
        epochs.push(e);
    }
    if let Some((bin, id, off)) = elf_with_hostile_symbol(&tmp) {
        let hd = db.host_dir(&epochs[1], "alpha").expect("host dir");
        Image::new(ImageKind::Elf, id.clone(), bin.display().to_string().as_bytes())
            .profile(&event("cpu-clock", 1000))
            .counts(&[(off, 5)])
            .period(1000)
            .write(&hd);
    }
    Db { _dir: dir, root, tmp, epochs }
}

fn run(tool: &str, db: &Db, args: &[&str]) -> Output {
    let exe = match tool {
        "dcpiprof" => env!("CARGO_BIN_EXE_dcpiprof"),
        "dcpilist" => env!("CARGO_BIN_EXE_dcpilist"),
        "dcpidiff" => env!("CARGO_BIN_EXE_dcpidiff"),
        "dcpistats" => env!("CARGO_BIN_EXE_dcpistats"),
        _ => unreachable!("{tool}"),
    };
    Command::new(exe)
        .env("XDG_CACHE_HOME", db.tmp.join("cache"))
        .env_remove("DCPI_SYMBOL_CACHE")
        .arg("--db")
        .arg(&db.root)
        .args(args)
        .output()
        .expect("run tool")
}

/// The first raw character a terminal must not get (a control other than the newline ending
/// each line, or, unless `json`, a format or separator character) in `bytes`. JSON keeps
/// format characters exact; its own escaping makes them valid.
fn raw_control(bytes: &[u8], json: bool) -> Option<(usize, char)> {
    let text = String::from_utf8_lossy(bytes);
    text.char_indices().find(|&(_, c)| {
        c != '\n' && if json { c.is_control() } else { escape::is_unsafe_for_terminal(c) }
    })
}

/// Run and check: no panic, no raw control character on stdout or stderr, JSON parses. What
/// is wrong goes to `bad` (a test reports every gap at once).
fn check(tool: &str, db: &Db, args: &[&str], bad: &mut Vec<String>) -> Output {
    let o = run(tool, db, args);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    if err.contains("panicked") || o.status.code().is_none_or(|c| c > 2) {
        bad.push(format!("{tool} {args:?}: {:?}: {err}", o.status));
    }
    let json = args.windows(2).any(|w| w == ["--format", "json"]);
    for (what, bytes, json) in [("stdout", &o.stdout, json), ("stderr", &o.stderr, false)] {
        if let Some((at, c)) = raw_control(bytes, json) {
            let s = String::from_utf8_lossy(bytes);
            let from =
                (0..=at.saturating_sub(60)).rev().find(|&i| s.is_char_boundary(i)).unwrap_or(0);
            let ctx: String = s[from..].chars().take(100).collect();
            bad.push(format!("{tool} {args:?}: raw {c:?} on {what} near {ctx:?}"));
        }
    }
    if args.windows(2).any(|w| w == ["--format", "json"]) && o.status.success() {
        if let Err(e) = serde_json::from_slice::<serde_json::Value>(&o.stdout) {
            bad.push(format!("{tool} {args:?}: not JSON ({e}): {out}"));
        }
    }
    o
}

fn assert_none(bad: &[String]) {
    assert!(bad.is_empty(), "{} gaps:\n{}", bad.len(), bad.join("\n"));
}

const FORMATS: &[&str] = &["table", "csv", "json"];

#[test]
fn dcpiprof_escapes_everywhere() {
    let db = hostile_db();
    let mut bad = Vec::new();
    let mut ran_ok = 0;
    for f in FORMATS {
        for extra in [
            &[][..],
            &["--image", "[anon:77"][..],
            &["--image", "[anon:77", "--raw-names"][..],
            &["--image", "[kernel.kallsyms]"][..],
            &["--image", "hostile"][..],
            &["--image", "hostile", "--lines"][..],
            &["--symbols"][..],
            &["--by", "host"][..],
            &["--by", "epoch"][..],
            &["--event", "evil\u{1b}[31mevent"][..],
            &["--image", "/opt/"][..],
            &["--by", "command"][..],
            &["--by", "cgroup"][..],
            &["--by", "image", "--command", "=HYPERLINK(\"x\")"][..],
        ] {
            for epoch in ["all", "latest"] {
                let mut a = vec!["--format", f, "--host", "all", "--epoch", epoch];
                a.extend_from_slice(extra);
                if check("dcpiprof", &db, &a, &mut bad).status.success() {
                    ran_ok += 1;
                }
            }
        }
    }
    assert_none(&bad);
    assert!(ran_ok >= 40, "only {ran_ok} runs succeeded");
    // The escaped forms are what the rows show.
    let o = check(
        "dcpiprof",
        &db,
        &["--format", "json", "--host", "alpha", "--image", "[anon:77"],
        &mut bad,
    );
    let text = String::from_utf8_lossy(&o.stdout);
    for want in ["esc\\\\u{1b}[2Jclear", "two\\\\nlines", "c1\\\\u{9b}31mcsi", "nul\\\\u{0}byte"] {
        assert!(text.contains(want), "{want} not in {text}");
    }
}

#[test]
fn dcpilist_escapes_everywhere() {
    let db = hostile_db();
    let mut bad = Vec::new();
    let mut ran_ok = 0;
    for f in FORMATS {
        for extra in [
            &["--top", "20"][..],
            &["--image", "[anon:77", "--symbol", "esc\u{1b}[2Jclear"][..],
            &["--image", "[anon:77", "--symbol", "two\nlines"][..],
            &["--image", "[anon:77", "--symbol", "nosuch"][..],
            &["--image", "[anon:77", "--symbol", "_ZN3foo"][..],
            &["--image", "[kernel.kallsyms]", "--symbol", "k\u{1b}[31mevil"][..],
            &["--image", "hostile", "--symbol", "main"][..],
            &["--image", "[anon:77", "--symbol", "c1\u{9b}31mcsi", "--both"][..],
            &["--image", "/opt/", "--symbol", "x"][..],
            &["--image", "no-such-image", "--symbol", "x"][..],
        ] {
            let mut a = vec!["--format", f, "--host", "all", "--epoch", "all"];
            a.extend_from_slice(extra);
            if check("dcpilist", &db, &a, &mut bad).status.success() {
                ran_ok += 1;
            }
        }
    }
    assert_none(&bad);
    assert!(ran_ok >= 15, "only {ran_ok} runs succeeded");
}

#[test]
fn dcpidiff_and_dcpistats_escape_everywhere() {
    let db = hostile_db();
    let (e0, e1) = (db.epochs[0].to_string(), db.epochs[1].to_string());
    let mut bad = Vec::new();
    let mut ran_ok = 0;
    for f in FORMATS {
        for extra in [
            &[][..],
            &["--image", "[anon:77"][..],
            &["--image", "[kernel.kallsyms]"][..],
            &["--image", "hostile"][..],
            &["--image", "/opt/"][..],
        ] {
            let mut a = vec!["--format", f, "--host", "all", "--before", &e0, "--after", &e1];
            a.extend_from_slice(extra);
            ran_ok += usize::from(check("dcpidiff", &db, &a, &mut bad).status.success());
            let mut a = vec!["--format", f, "--host", "all", "--epoch", "all"];
            a.extend_from_slice(extra);
            ran_ok += usize::from(check("dcpistats", &db, &a, &mut bad).status.success());
            a.extend(["--by", "epoch"]);
            ran_ok += usize::from(check("dcpistats", &db, &a, &mut bad).status.success());
        }
    }
    assert_none(&bad);
    assert!(ran_ok >= 20, "only {ran_ok} runs succeeded");
}

/// The names a test looks for in CSV: (stored name, its CSV cell, what a cell holding the
/// name with a suffix such as `+0x4` begins with).
const IN_CSV: &[(&str, &str, &str)] = &[
    ("rlo\u{202e}gnp.exe", "rlo\\u{202e}gnp.exe", "rlo\\u{202e}gnp.exe"),
    ("lri\u{2066}iso\u{2069}", "lri\\u{2066}iso\\u{2069}", "lri\\u{2066}iso\\u{2069}"),
    ("ls\u{2028}ps\u{2029}", "ls\\u{2028}ps\\u{2029}", "ls\\u{2028}ps\\u{2029}"),
    ("zw\u{200b}bom\u{feff}", "zw\\u{200b}bom\\u{feff}", "zw\\u{200b}bom\\u{feff}"),
    ("=HYPERLINK(\"x\")", "\"'=HYPERLINK(\"\"x\"\")\"", "\"'=HYPERLINK(\"\"x\"\")"),
    ("+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0", "'+cmd|' /C calc'!A0"),
];

/// Whether a CSV line's first cell is `cell` (the name columns come first in these reports).
fn first_cell_is(text: &str, cell: &str) -> bool {
    text.lines().any(|l| l.starts_with(&format!("{cell},")))
}

/// Formula cells are neutralised and format characters escaped in CSV, numbers stay numbers,
/// and JSON keeps the names exact: command names (who tables) and JIT symbol names.
#[test]
fn csv_neutralises_formulas_and_json_keeps_format_characters() {
    let db = hostile_db();
    let mut bad = Vec::new();
    let sel = ["--host", "all", "--epoch", "all"];
    for extra in [&["--by", "command"][..], &["--image", "[anon:77"][..]] {
        let mut a = sel.to_vec();
        a.extend_from_slice(extra);
        a.extend(["--format", "csv"]);
        let o = check("dcpiprof", &db, &a, &mut bad);
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        for (_, cell, _) in IN_CSV {
            if !first_cell_is(&text, cell) {
                bad.push(format!("{a:?}: no row starting {cell:?} in\n{text}"));
            }
        }
        // Numbers are not neutralised: every count cell parses.
        for l in text.lines().skip(1) {
            let last = l.rsplit(',').next().unwrap_or_default();
            if last.parse::<f64>().is_err() {
                bad.push(format!("{a:?}: last cell {last:?} of {l:?} is not a number"));
            }
        }
        let mut a = sel.to_vec();
        a.extend_from_slice(extra);
        a.extend(["--format", "json"]);
        let o = check("dcpiprof", &db, &a, &mut bad);
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        let key = if extra[1] == "command" { "command" } else { "symbol" };
        let names: Vec<String> = v["rows"]
            .as_array()
            .map(|r| r.iter().filter_map(|x| x[key].as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        for (name, _, _) in IN_CSV {
            if !names.iter().any(|n| n == name) {
                bad.push(format!("{a:?}: {name:?} not exact in JSON rows {names:?}"));
            }
        }
    }
    // dcpilist and dcpidiff CSV: the JIT names in the symbol columns.
    let (e0, e1) = (db.epochs[0].to_string(), db.epochs[1].to_string());
    for (tool, args) in [
        ("dcpilist", vec!["--top", "40", "--host", "all", "--epoch", "all", "--format", "csv"]),
        (
            "dcpidiff",
            vec![
                "--host", "all", "--before", &e0, "--after", &e1, "--image", "[anon:77",
                "--format", "csv",
            ],
        ),
    ] {
        let o = check(tool, &db, &args, &mut bad);
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        for (_, _, start) in IN_CSV {
            if !text.lines().any(|l| l.contains(&format!(",{start}")) || l.starts_with(start)) {
                bad.push(format!("{tool} {args:?}: no cell starting {start:?} in\n{text}"));
            }
        }
    }
    assert_none(&bad);
}
