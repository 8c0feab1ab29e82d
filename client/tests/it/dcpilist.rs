//! dcpilist against databases built in temporary directories with the profile-format API and a
//! C program compiled at test time (`cc -g -O1`), so no sampling is needed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use iced_x86::{Decoder, DecoderOptions, Mnemonic};
use object::{Object, ObjectSegment, ObjectSymbol};
use profile_format::{ImageId, ImageKind, JitSymbol, KallsymsSnapshot, KernelSymbol};
use serde_json::Value;

use crate::util::{
    assert_no_golden_mismatch, check_golden, event, golden_dir, stderr, stdout, TestDb,
};
use dcpi_testkit::db::Image;

/// Run dcpilist in `cwd` (relative --db and binary paths keep temp names out of outputs).
fn list(cwd: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dcpilist"))
        .current_dir(cwd)
        .env_remove("DCPI_SYMBOL_CACHE")
        .args(["--db", "db", "--no-system-debug", "--no-symbol-cache"])
        .args(args)
        .output()
        .expect("run dcpilist")
}

fn json_ok(cwd: &Path, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["--format", "json"]);
    let o = list(cwd, &a);
    assert!(o.status.success(), "dcpilist {a:?} failed: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(&o)))
}

const SRC: &str = "#include <stdio.h>\n\
#include <stdlib.h>\n\
\n\
__attribute__((noinline)) long work(long n, long d) {\n\
    long s = 0;\n\
    for (long i = 0; i < n; i++)\n\
        s += i * 3;\n\
    long q = n;\n\
    for (long i = 0; i < n; i++)\n\
        q = q / d + i;\n\
    return s + q;\n\
}\n\
\n\
int main(int argc, char **argv) {\n\
    long n = argc > 1 ? atol(argv[1]) : 1000;\n\
    printf(\"%ld\\n\", work(n, argc + 1));\n\
    return 0;\n\
}\n";

/// The line of `q = q / d + i`.
const DIV_LINE: u32 = 10;

/// Compile SRC as `<dir>/list` (debug paths relative, so the build-id does not depend on the
/// temporary directory's name).
fn build(dir: &Path) -> PathBuf {
    std::fs::write(dir.join("list.c"), SRC).expect("write source");
    let map = format!("-fdebug-prefix-map={}=.", dir.display());
    let o = Command::new("cc")
        .current_dir(dir)
        .args(["-g", "-O1", "-fno-inline", &map, "-Wl,--build-id=sha1", "-o", "list", "list.c"])
        .output()
        .expect("run cc");
    assert!(o.status.success(), "cc failed: {}", String::from_utf8_lossy(&o.stderr));
    dir.join("list")
}

/// Facts about `work` in the compiled binary, found independently of dcpilist.
struct Work {
    id: ImageId,
    /// File offset and size of `work`.
    off: u64,
    size: u64,
    /// File offsets of its instructions, and of the (first) division.
    insns: Vec<u64>,
    div: u64,
}

fn facts(bin: &Path) -> Work {
    let data = std::fs::read(bin).expect("read binary");
    let f = object::File::parse(&*data).expect("parse");
    let id = ImageId::BuildId(f.build_id().expect("build id").expect("has build id").to_vec());
    let sym = f.symbols().find(|s| s.name() == Ok("work")).expect("symbol work");
    let (vaddr, size) = (sym.address(), sym.size());
    let seg = f
        .segments()
        .find(|s| vaddr >= s.address() && vaddr - s.address() < s.file_range().1)
        .expect("segment");
    let off = vaddr - seg.address() + seg.file_range().0;
    let code = &data[off as usize..(off + size) as usize];
    let mut d = Decoder::with_ip(64, code, off, DecoderOptions::NONE);
    let mut insns = Vec::new();
    let mut div = None;
    for ins in d.iter() {
        insns.push(ins.ip());
        if matches!(ins.mnemonic(), Mnemonic::Idiv | Mnemonic::Div) && div.is_none() {
            div = Some(ins.ip());
        }
    }
    Work { id, off, size, insns, div: div.expect("a division in work") }
}

/// A database with one epoch, host `h`: cpu-clock samples on `work` (most on the division
/// and the instruction after it), and on `main`.
fn setup(t: &TestDb, bin: &Path) -> Work {
    let w = facts(bin);
    let hd = t.host(&t.epoch(0), "h");
    let ev = event("cpu-clock", 1000);
    let next = *w.insns.iter().find(|&&o| o > w.div).expect("instruction after div");
    let mut counts: Vec<(u64, u64)> = vec![(w.off, 2), (w.div, 50), (next, 30)];
    // A sample in the middle of an instruction counts for that instruction.
    counts.push((w.insns[1] + 1, 1));
    Image::new(ImageKind::Elf, w.id.clone(), b"list")
        .profile(&ev)
        .counts(&counts)
        .period(1000)
        .write(&hd);
    w
}

#[test]
fn asm_json_rows_offsets_division_and_source_lines() {
    let t = TestDb::new();
    let bin = build(t.tmp());
    let w = setup(&t, &bin);
    let v = json_ok(t.tmp(), &["--host", "h", "--image", "list", "--symbol", "work"]);
    assert_eq!(v["report"], "listing");
    assert_eq!(v["image"], "list");
    assert_eq!(v["symbol"], "work");
    assert_eq!(v["mode"], "asm");
    assert_eq!(v["start_offset"], w.off);
    assert_eq!(v["size"], w.size);
    assert_eq!(v["total_samples"], 83);
    assert_eq!(v["events"][0]["name"], "cpu-clock");
    let rows = v["rows"].as_array().expect("rows");
    let offs: Vec<u64> = rows.iter().map(|r| r["offset"].as_u64().expect("offset")).collect();
    assert_eq!(offs, w.insns, "one row per instruction, by file offset");
    let div = rows.iter().find(|r| r["offset"] == w.div).expect("div row");
    assert!(div["instruction"].as_str().is_some_and(|s| s.contains("div")), "{div:#}");
    assert_eq!(div["samples"], 50);
    assert_eq!(div["events"][0]["samples"], 50);
    assert_eq!(div["events"][0]["events"], 50_000);
    assert!((div["percent"].as_f64().unwrap_or(0.0) - 5000.0 / 83.0).abs() < 0.01, "{div:#}");
    let src = div["source"].as_str().expect("source of div");
    assert!(src.ends_with(&format!("list.c:{DIV_LINE}")), "{src}");
    assert_eq!(rows[1]["samples"], 1, "mid-instruction sample counted for the instruction");
    let total: u64 = rows.iter().map(|r| r["samples"].as_u64().unwrap_or(0)).sum();
    assert_eq!(total, 83);
    // The loops branch backwards to labelled block starts inside the function.
    let back: Vec<&Value> = rows
        .iter()
        .filter(|r| {
            r["branch_target"].as_u64().is_some_and(|t| t < r["offset"].as_u64().unwrap_or(0))
        })
        .collect();
    assert!(!back.is_empty(), "a backward branch: {v:#}");
    for b in back {
        let target = rows.iter().find(|r| r["offset"] == b["branch_target"]).expect("target row");
        assert_eq!(target["block_start"], true);
        assert_eq!(target["label"], b["target_label"]);
    }
}

#[test]
fn source_mode_puts_the_division_line_first() {
    let t = TestDb::new();
    let bin = build(t.tmp());
    setup(&t, &bin);
    let v = json_ok(t.tmp(), &["--host", "h", "--image", "list", "--symbol", "work", "--source"]);
    let rows = v["rows"].as_array().expect("rows");
    let line = rows.iter().find(|r| r["line"] == DIV_LINE).expect("division line");
    // The division and the instruction after it are on the same line (or the skid lands on
    // the loop's increment, which gcc attributes to line 9).
    let s = line["samples"].as_u64().unwrap_or(0);
    assert!(s >= 50, "{line:#}");
    assert!(line["text"].as_str().is_some_and(|x| x.contains("q = q / d + i")), "{line:#}");
    assert!(rows.iter().all(|r| r["type"] == "source"));
    let total: u64 = rows.iter().map(|r| r["samples"].as_u64().unwrap_or(0)).sum();
    assert_eq!(total, 83);
}

#[test]
fn golden_asm_source_and_both_in_three_formats() {
    let t = TestDb::new();
    let bin = build(t.tmp());
    setup(&t, &bin);
    let (golden_dir, update) = golden_dir();
    let mut mismatches = Vec::new();
    for mode in ["asm", "source", "both"] {
        for (fmt, ext) in [("table", "txt"), ("json", "json"), ("csv", "csv")] {
            let flag = format!("--{mode}");
            let o = list(
                t.tmp(),
                &["--host", "h", "--image", "list", "--symbol", "work", &flag, "--format", fmt],
            );
            assert!(o.status.success(), "{mode} {fmt}: {}", stderr(&o));
            // What varies between machines: the epoch directory name is fixed by the test,
            // the build-id by -fdebug-prefix-map; host name is `h`. Nothing else to mask.
            let file = golden_dir.join(format!("list-{mode}.{ext}"));
            check_golden(&file, &o, update, &mut mismatches);
        }
    }
    assert_no_golden_mismatch(&mismatches);
}

#[test]
fn cpi_column_from_cycles_and_instructions() {
    let t = TestDb::new();
    let bin = build(t.tmp());
    let w = facts(&bin);
    let hd = t.host(&t.epoch(0), "h");
    let cycles = event("cycles", 1000);
    let insns = event("instructions", 2000);
    let next = w.insns[w.insns.iter().position(|&o| o == w.div).expect("div") + 1];
    let cc = [(w.div, 40), (next, 4)];
    Image::new(ImageKind::Elf, w.id.clone(), b"list")
        .profile(&cycles)
        .counts(&cc)
        .period(1000)
        .write(&hd);
    let ic = [(w.div, 10), (w.off, 3)];
    Image::new(ImageKind::Elf, w.id.clone(), b"list")
        .profile(&insns)
        .counts(&ic)
        .period(2000)
        .write(&hd);
    let v = json_ok(t.tmp(), &["--host", "h", "--image", "list", "--symbol", "work"]);
    let rows = v["rows"].as_array().expect("rows");
    let div = rows.iter().find(|r| r["offset"] == w.div).expect("div");
    // 40 cycle samples of 1000 over 10 instruction samples of 2000.
    assert_eq!(div["cpi"].as_f64(), Some(2.0), "{div:#}");
    let n = rows.iter().find(|r| r["offset"] == next).expect("next");
    assert!(n["cpi"].is_null(), "no instructions sampled there: {n:#}");
    let first = rows.iter().find(|r| r["offset"] == w.off).expect("entry");
    assert_eq!(first["cpi"].as_f64(), Some(0.0));
    let o = list(t.tmp(), &["--host", "h", "--image", "list", "--symbol", "work", "--source"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    let head = s.lines().find(|l| l.contains("cpi") && l.contains("source")).expect("titles");
    assert!(head.contains("cycles") && head.contains("instructions%"), "{head}");
    // The line: (40 + 4) x 1000 cycles over 10 x 2000 instructions.
    assert!(s.lines().any(|l| l.contains(" 2.20 ") && l.contains("q = q / d + i")), "{s}");
}

fn assert_exit2(o: &Output, needles: &[&str]) {
    assert_eq!(o.status.code(), Some(2), "stdout {} stderr {}", stdout(o), stderr(o));
    let e = stderr(o);
    for n in needles {
        assert!(e.contains(n), "stderr lacks {n:?}: {e}");
    }
}

#[test]
fn bad_input_is_a_clear_error_with_exit_2() {
    let t = TestDb::new();
    let bin = build(t.tmp());
    setup(&t, &bin);
    let o = list(t.tmp(), &["--host", "h", "--image", "list", "--symbol", "nosuch"]);
    assert_exit2(&o, &["no function \"nosuch\"", "hottest symbols: work"]);
    let o = list(t.tmp(), &["--host", "h", "--image", "nosuch", "--symbol", "work"]);
    assert_exit2(&o, &["--image \"nosuch\""]);
    let o = list(t.tmp(), &["--host", "h", "--image", "list"]);
    assert_exit2(&o, &["--symbol"]);
    let o =
        list(t.tmp(), &["--host", "h", "--image", "list", "--symbol", "work", "--asm", "--source"]);
    assert_exit2(&o, &["--source"]);
    // The binary is gone: nothing to disassemble.
    std::fs::rename(t.tmp().join("list"), t.tmp().join("moved")).expect("move");
    let o = list(t.tmp(), &["--host", "h", "--image", "list", "--symbol", "work"]);
    assert_exit2(&o, &["list: binary not found", "--binary-path"]);
    // ... until its directory is named.
    let o = list(
        t.tmp(),
        &["--host", "h", "--image", "list", "--symbol", "work", "--binary-path", "."],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let o = list(Path::new("/"), &["--image", "list", "--symbol", "work"]);
    assert_exit2(&o, &["no profile database at db"]);
}

#[test]
fn jit_function_listed_by_offset_without_code() {
    let t = TestDb::new();
    let hd = t.host(&t.epoch(0), "h");
    let ev = event("cpu-clock", 1000);
    let id = ImageId::special("[anon]", b"77");
    let jit = vec![
        JitSymbol { start: 0x7f00_0000_1000, size: 0x100, name: "LazyCompile:*fib".into() },
        JitSymbol { start: 0x7f00_0000_2000, size: 0x80, name: "_ZN3jit4loopEv".into() },
    ];
    let counts = [(0x7f00_0000_1010, 6), (0x7f00_0000_1020, 3), (0x7f00_0000_2004, 2)];
    Image::new(ImageKind::Anon, id.clone(), b"[anon:77:node]")
        .profile(&ev)
        .counts(&counts)
        .period(1000)
        .jit_symbols(jit)
        .write(&hd);
    let v =
        json_ok(t.tmp(), &["--host", "h", "--image", "[anon:77", "--symbol", "LazyCompile:*fib"]);
    assert_eq!(v["code"], false);
    let rows = v["rows"].as_array().expect("rows");
    let got: Vec<(u64, u64)> = rows
        .iter()
        .map(|r| (r["offset"].as_u64().unwrap_or(0), r["samples"].as_u64().unwrap_or(0)))
        .collect();
    assert_eq!(got, [(0x7f00_0000_1010, 6), (0x7f00_0000_1020, 3)]);
    assert_eq!(rows[0]["instruction"], "(no code bytes)");
    let v = json_ok(t.tmp(), &["--host", "h", "--image", "[anon:77", "--symbol", "jit::loop()"]);
    assert_eq!(v["total_samples"], 2);
    let o = list(t.tmp(), &["--host", "h", "--image", "[anon:77", "--symbol", "nope"]);
    assert_exit2(&o, &["LazyCompile:*fib"]);
}

/// A kernel profile whose "vmlinux" is the test program: `_text` is defined at `work`, and
/// the snapshot puts `work` at the (fake) runtime text base.
#[test]
fn kernel_function_disassembled_from_vmlinux() {
    let t = TestDb::new();
    let dir = t.tmp();
    std::fs::write(dir.join("list.c"), SRC).expect("write source");
    let o = Command::new("cc")
        .current_dir(dir)
        .args(["-g", "-O1", "-fno-inline", "-Wl,--defsym=_text=work", "-o", "vmlinux", "list.c"])
        .output()
        .expect("run cc");
    assert!(o.status.success(), "cc: {}", String::from_utf8_lossy(&o.stderr));
    let w = facts(&dir.join("vmlinux"));
    let text = 0xffff_ffff_8100_0000u64;
    let e = t.epoch(0);
    let hd = t.host(&e, "h");
    let snap = KallsymsSnapshot {
        kernel_release: "9.9.9-test".into(),
        kernel_build_id: None,
        text_base: text,
        modules: Vec::new(),
        symbols: vec![
            KernelSymbol { addr: text, kind: b't', name: "work".into(), module: None },
            KernelSymbol { addr: text + w.size, kind: b't', name: "after".into(), module: None },
        ],
    };
    snap.write(&hd.kallsyms_path()).expect("snapshot");
    let kid = ImageId::special("[kernel.kallsyms]", b"9.9.9-test");
    let ev = event("cpu-clock", 1000);
    let counts = [(w.div - w.off, 7), (1, 1)];
    Image::new(ImageKind::Kernel, kid.clone(), b"[kernel.kallsyms]")
        .profile(&ev)
        .counts(&counts)
        .period(1000)
        .write(&hd);
    let v = json_ok(
        dir,
        &["--host", "h", "--image", "kernel", "--symbol", "work", "--vmlinux", "vmlinux"],
    );
    assert_eq!(v["code"], true, "{v:#}");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), w.insns.len());
    let div = rows.iter().find(|r| r["offset"] == w.div - w.off).expect("div row");
    assert!(div["instruction"].as_str().is_some_and(|s| s.contains("idiv")), "{div:#}");
    assert_eq!(div["samples"], 7);
    assert_eq!(div["address"], text + (w.div - w.off));
    // Without code bytes (this is not the running kernel) the samples are listed by offset.
    let v = json_ok(dir, &["--host", "h", "--image", "kernel", "--symbol", "work"]);
    assert_eq!(v["code"], false);
    assert_eq!(v["total_samples"], 8);
}

#[test]
fn top_instructions_across_images() {
    let t = TestDb::new();
    let bin = build(t.tmp());
    let w = setup(&t, &bin);
    let e = t.db.epochs().expect("epochs")[0].clone();
    let hd = t.db.host_dir(&e, "h").expect("host dir");
    let ev = event("cpu-clock", 1000);
    let id = ImageId::special("[anon]", b"77");
    let jit = vec![JitSymbol { start: 0x7f00_0000_1000, size: 0x100, name: "jitted".into() }];
    let counts = [(0x7f00_0000_1010, 40)];
    Image::new(ImageKind::Anon, id.clone(), b"[anon:77:node]")
        .profile(&ev)
        .counts(&counts)
        .period(1000)
        .jit_symbols(jit)
        .write(&hd);
    let unk = ImageId::special("[unknown]", b"");
    Image::new(ImageKind::Unknown, unk.clone(), b"[unknown]")
        .profile(&ev)
        .counts(&[(0, 77)])
        .period(1000)
        .write(&hd);
    let v = json_ok(t.tmp(), &["--host", "h", "--top", "3"]);
    assert_eq!(v["report"], "top");
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["image"], "list");
    assert_eq!(rows[0]["offset"], w.div);
    assert!(rows[0]["instruction"].as_str().is_some_and(|s| s.contains("idiv")), "{v:#}");
    assert!(rows[0]["symbol"].as_str().is_some_and(|s| s.starts_with("work+0x")), "{v:#}");
    assert!(rows[0]["source"].as_str().is_some_and(|s| s.ends_with(&format!(":{DIV_LINE}"))));
    // Percent of the machine: 50 of 83 + 40 + 77 samples, all with the same period.
    assert!((rows[0]["percent"].as_f64().unwrap_or(0.0) - 5000.0 / 200.0).abs() < 0.01);
    assert_eq!(rows[1]["image"], "[anon:77:node]");
    assert_eq!(rows[1]["symbol"], "jitted+0x10");
    assert!(rows[1]["instruction"].is_null());
    assert_eq!(rows[2]["samples"], 30);
    let o = list(t.tmp(), &["--host", "h", "--top", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = stdout(&o);
    assert!(
        s.lines().any(|l| l.contains("idiv") && l.contains("work+0x") && l.contains("25.00")),
        "{s}"
    );
    let o = list(t.tmp(), &["--host", "h", "--top", "2", "--format", "csv"]);
    assert_eq!(stdout(&o).lines().count(), 3, "{}", stdout(&o));
    // --top with --image: that image's instructions only, the percent still of the machine.
    let v = json_ok(t.tmp(), &["--host", "h", "--top", "5", "--image", "anon"]);
    let rows = v["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 1, "{v:#}");
    assert_eq!(rows[0]["image"], "[anon:77:node]");
    assert!((rows[0]["percent"].as_f64().unwrap_or(0.0) - 4000.0 / 200.0).abs() < 0.01);
    let v = json_ok(t.tmp(), &["--host", "h", "--top", "5", "--image", "list"]);
    let rows = v["rows"].as_array().expect("rows");
    assert!(rows.iter().all(|r| r["image"] == "list") && rows.len() >= 3, "{v:#}");
}

/// Issue 38 item 4: `--min-percent` lists the hot instructions with their context and one
/// line per run of cold ones; the rows shown and the gaps add up to the function.
#[test]
fn min_percent_shows_the_hot_part_of_a_function() {
    let t = TestDb::new();
    let bin = build(t.tmp());
    let w = setup(&t, &bin);
    let args = ["--host", "h", "--image", "list", "--symbol", "work", "--min-percent", "10"];
    let v = json_ok(t.tmp(), &[&args[..], &["--context", "1"]].concat());
    let rows = v["rows"].as_array().expect("rows");
    let shown: Vec<u64> = rows.iter().filter_map(|r| r["offset"].as_u64()).collect();
    let gaps: usize = rows
        .iter()
        .filter(|r| r["type"] == "gap")
        .map(|r| r["skipped"].as_u64().unwrap_or(0) as usize)
        .sum();
    assert_eq!(shown.len() + gaps, w.insns.len(), "{v:#}");
    // The division (60 %) and the next instruction (36 %), each with one row of context.
    let i = w.insns.iter().position(|&o| o == w.div).expect("div");
    let want: Vec<u64> = w.insns[i.saturating_sub(1)..(i + 3).min(w.insns.len())].to_vec();
    assert_eq!(shown, want, "{v:#}");
    assert!(gaps > 0, "cold code left out: {v:#}");
    let o = list(t.tmp(), &args);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("rows below --min-percent"), "{}", stdout(&o));
    let o = list(
        t.tmp(),
        &["--host", "h", "--image", "list", "--symbol", "work", "--min-percent", "200"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--min-percent"), "{}", stderr(&o));
}

#[test]
fn help_documents_skid_and_json_schema_and_man_page_generates() {
    let o = Command::new(env!("CARGO_BIN_EXE_dcpilist")).arg("--help").output().expect("run");
    let s = stdout(&o);
    for needle in [
        "SKID",
        "JSON SCHEMA",
        "\"offset\"",
        "\"instruction\"",
        "\"source\"",
        "--top",
        "--vmlinux",
        "EXIT STATUS",
    ] {
        assert!(s.contains(needle), "--help lacks {needle}: {s}");
    }
    let o = Command::new(env!("CARGO_BIN_EXE_dcpilist"))
        .args(["--generate", "man"])
        .output()
        .expect("run");
    assert!(o.status.success());
    let man = stdout(&o);
    assert!(man.contains(".TH dcpilist 1") || man.contains(".TH DCPILIST 1"), "{man}");
    assert!(man.contains("JSON SCHEMA"));
}

#[test]
fn dcpiprof_symbols_ranks_every_images_symbols_by_machine_share() {
    let t = TestDb::new();
    let bin = build(t.tmp());
    setup(&t, &bin);
    let e = t.db.epochs().expect("epochs")[0].clone();
    let hd = t.db.host_dir(&e, "h").expect("host dir");
    let ev = event("cpu-clock", 1000);
    let id = ImageId::special("[anon]", b"77");
    let jit = vec![JitSymbol { start: 0x7f00_0000_1000, size: 0x100, name: "jitted".into() }];
    // Twice the period: 40 samples weigh as 80 of the others.
    Image::new(ImageKind::Anon, id.clone(), b"[anon:77:node]")
        .profile(&ev)
        .counts(&[(0x7f00_0000_1010, 40)])
        .period(2000)
        .jit_symbols(jit)
        .write(&hd);
    let prof = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_dcpiprof"))
            .current_dir(t.tmp())
            .args(["--db", "db", "--no-system-debug", "--no-symbol-cache", "--host", "h"])
            .args(args)
            .output()
            .expect("run dcpiprof")
    };
    let o = prof(&["--symbols", "--format", "json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).expect("json");
    assert_eq!(v["report"], "global-symbols");
    // A row stays flat, its keys in the order `--help` documents (the numbers are one
    // embedded, flattened `Counts`).
    let raw = String::from_utf8_lossy(&o.stdout);
    let row0 = &raw[raw.find("\"rows\"").expect("rows")..];
    let keys = ["image", "kind", "build_id", "symbol", "samples", "events", "percent"];
    let at: Vec<Option<usize>> = keys
        .iter()
        .chain(&["cumulative_percent", "counts"])
        .map(|k| row0.find(&format!("\"{k}\"")))
        .collect();
    assert!(at.iter().all(Option::is_some) && at.windows(2).all(|w| w[0] < w[1]), "{row0}");
    let rows = v["rows"].as_array().expect("rows");
    let got: Vec<(&str, &str, f64)> = rows
        .iter()
        .map(|r| {
            (
                r["image"].as_str().unwrap_or(""),
                r["symbol"].as_str().unwrap_or(""),
                r["percent"].as_f64().unwrap_or(0.0),
            )
        })
        .collect();
    // work: 83 000 events, jitted: 80 000, main: none; machine total 163 000.
    assert_eq!(got.len(), 2, "{v:#}");
    assert_eq!((got[0].0, got[0].1), ("list", "work"));
    assert!((got[0].2 - 8300.0 / 163.0).abs() < 0.01, "{v:#}");
    assert_eq!((got[1].0, got[1].1), ("[anon:77:node]", "jitted"));
    assert_eq!(rows[1]["cumulative_percent"].as_f64(), Some(100.0));
    let o = prof(&["--symbols", "--limit", "1"]);
    let s = stdout(&o);
    assert!(s.lines().any(|l| l.contains("list") && l.ends_with("work")), "{s}");
    assert!(s.contains("# 1 more row(s) not shown"), "{s}");
    let o = prof(&["--symbols", "--image", "list"]);
    assert_eq!(o.status.code(), Some(2), "--symbols with --image is a usage error");
}

#[test]
fn other_architectures_are_refused_for_asm_and_listed_per_line() {
    let t = TestDb::new();
    let bin = build(t.tmp());
    setup(&t, &bin);
    // The same file claiming to be AArch64 (e_machine 183): its bytes must not be decoded as x86.
    let mut data = std::fs::read(&bin).expect("read");
    data[18..20].copy_from_slice(&183u16.to_le_bytes());
    std::fs::write(&bin, &data).expect("write");
    let o = list(t.tmp(), &["--host", "h", "--image", "list", "--symbol", "work"]);
    assert_exit2(&o, &["not supported (x86-64 only)", "--source"]);
    let v = json_ok(t.tmp(), &["--host", "h", "--image", "list", "--symbol", "work", "--source"]);
    assert_eq!(v["code"], false);
    let line = v["rows"].as_array().and_then(|r| r.iter().find(|r| r["line"] == DIV_LINE).cloned());
    assert_eq!(line.map(|l| l["samples"].clone()), Some(Value::from(80)), "{v:#}");
}
