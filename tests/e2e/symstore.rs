//! End-to-end tests of the symbol store (issue 39, FORMAT.md §10): a program profiled, then
//! rebuilt over the same path with one function made slower and run in the next epoch, the
//! old binary deleted. Every report of the old epoch still names its functions, from the
//! table dcpid stored while the old build ran, and `dcpidiff` matches the two builds by name.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use dcpi_e2e::{json, run, Sandbox};

/// Three functions with the same body, called in small interleaved rounds, a fixed amount of
/// work (`argv[1]` rounds). `SLOW_B` (the rebuilt version) runs `work_b`'s loop twice.
const PROGRAM_C: &str = r#"
#include <stdlib.h>
#ifndef SLOW_B
#define SLOW_B 1
#endif
#define LOOP { for (unsigned long i = 0; i < n; i++) s += i * i ^ (s >> 3); }
__attribute__((noipa, noinline)) unsigned long work_a(unsigned long n) { unsigned long s = 0; LOOP return s; }
__attribute__((noipa, noinline)) unsigned long work_b(unsigned long n) { unsigned long s = 0; for (int r = 0; r < SLOW_B; r++) LOOP return s; }
__attribute__((noipa, noinline)) unsigned long work_c(unsigned long n) { unsigned long s = 0; LOOP return s; }
int main(int argc, char **argv) {
  long rounds = argc > 1 ? atol(argv[1]) : 1000;
  volatile unsigned long sink = 0;
  for (long r = 0; r < rounds; r++) {
    unsigned long n = 3000 + (sink & 1);
    sink += work_a(n); sink += work_b(n); sink += work_c(n);
  }
  return (int)(sink & 1);
}
"#;

const FUNCS: [&str; 3] = ["work_a", "work_b", "work_c"];

fn ok(out: &Output, what: &str) -> String {
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn sh(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what}: {}", String::from_utf8_lossy(&out.stderr));
}

/// Build `bin` from `src` with the fixed build-id `id` (hex); with `split_debug`, the symbols
/// go to `<bin>.debug` beside it (`objcopy --only-keep-debug`, `strip`, `.gnu_debuglink`), and the
/// binary itself keeps none.
fn build(dir: &Path, src: &Path, bin: &Path, id: &str, slow_b: u32, split_debug: bool) {
    sh(
        Command::new("cc")
            .args(["-O1", "-g", "-fno-inline", &format!("-DSLOW_B={slow_b}")])
            .arg(format!("-Wl,--build-id=0x{id}"))
            .arg("-o")
            .arg(bin)
            .arg(src),
        "cc",
    );
    if split_debug {
        let debug = bin.with_extension("debug");
        let name = debug.file_name().and_then(|n| n.to_str()).expect("name").to_owned();
        sh(
            Command::new("objcopy").arg("--only-keep-debug").arg(bin).arg(&debug),
            "objcopy --only-keep-debug",
        );
        sh(Command::new("strip").arg("--strip-all").arg(bin), "strip");
        sh(
            Command::new("objcopy")
                .current_dir(dir)
                .arg(format!("--add-gnu-debuglink={name}"))
                .arg(bin),
            "objcopy --add-gnu-debuglink",
        );
        let syms = Command::new("nm").arg(bin).output().expect("nm");
        assert!(
            !String::from_utf8_lossy(&syms.stdout).contains("work_b"),
            "the stripped binary must not name work_b itself"
        );
    }
}

fn wait_for(path: &Path, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if path.is_file() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

fn run_workload(bin: &Path, rounds: &str) {
    let st = Command::new(bin).arg(rounds).status().expect("run workload");
    assert!(st.success() || st.code() == Some(1), "workload failed: {st}");
}

fn scenario(split_debug: bool, tag: &str) {
    let sb = Sandbox::new();
    let dir = sb.dir.path();
    let src = dir.join("deploy.c");
    std::fs::write(&src, PROGRAM_C).expect("write source");
    let bin = dir.join("deploy");
    // Fixed, distinct build-ids: the store's file names are known in advance.
    let (old_id, new_id) = if split_debug {
        ("5d".repeat(20), "6e".repeat(20))
    } else {
        ("3b".repeat(20), "4c".repeat(20))
    };
    build(dir, &src, &bin, &old_id, 1, split_debug);
    let host = format!("e2e-symstore-{tag}");
    let mut d = sb.start_daemon(&host, &["--events", "cpu-clock:250000", "--flush-interval", "1s"]);
    let before = ok(&d.ctl(&["epoch", "show"]), "epoch show");
    // ~2 s of CPU here (more on a loaded machine).
    let rounds = "150000";
    run_workload(&bin, rounds);
    // dcpid stores the old build's table while it exists (a background thread, within a second
    // or two of the first flush that has its samples).
    let table = sb.db().join("binaries").join(&old_id[..2]).join(format!("{}.sym", &old_id[2..]));
    if !wait_for(&table, Duration::from_secs(90)) {
        let (_, err) = d.terminate();
        panic!("dcpid did not store {} within 90 s: {err}", table.display());
    }
    let after = ok(&d.ctl(&["epoch", "new"]), "epoch new");
    assert_ne!(before, after);
    // The deploy: the old binary (and its debug file) deleted, a new build at the same path.
    std::fs::remove_file(&bin).expect("delete the old binary");
    if split_debug {
        std::fs::remove_file(bin.with_extension("debug")).expect("delete the old debug file");
    }
    build(dir, &src, &bin, &new_id, 2, split_debug);
    run_workload(&bin, rounds);
    ok(&d.ctl(&["flush"]), "flush");
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");

    let path = bin.display().to_string();
    let cache = dir.join("symbols.sqlite").display().to_string();
    let common = ["--host", host.as_str(), "--symbol-cache", cache.as_str(), "--image", &path];
    let old_epoch = |more: &[&str]| -> Output {
        let mut a: Vec<&str> = vec!["--epoch", before.as_str()];
        a.extend_from_slice(&common);
        a.extend_from_slice(more);
        sb.prof(&a)
    };

    // dcpiprof per symbol, old epoch: every function named, nothing left as deploy+0x….
    let v = json(old_epoch(&["--format", "json"]));
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = rows.iter().filter_map(|r| r["symbol"].as_str()).collect();
    for f in FUNCS {
        assert!(names.contains(&f), "old epoch: {f} not named: {v:#}");
    }
    let named: u64 = rows
        .iter()
        .filter(|r| FUNCS.contains(&r["symbol"].as_str().unwrap_or("")))
        .filter_map(|r| r["samples"].as_u64())
        .sum();
    let total = v["total_samples"].as_u64().unwrap_or(0);
    assert!(total >= 200, "too few samples in the old epoch: {v:#}");
    assert!(named * 10 >= total * 9, "{named} of {total} samples named: {v:#}");
    assert!(
        !names.iter().any(|n| n.contains("mismatch") || n.starts_with("deploy+0x")),
        "unnamed rows: {names:?}"
    );
    let used = v["image"]["binary"].as_str().unwrap_or("");
    assert!(used.ends_with(".sym"), "old epoch not named from the stored table: {used:?}");

    // The pprof export of the old epoch names the functions too.
    let pb = dir.join("old.pb.gz");
    let pbs = pb.display().to_string();
    ok(&old_epoch(&["--format", "pprof", "-o", &pbs]), "pprof export");
    let raw = Command::new("gzip").arg("-dc").arg(&pb).output().expect("gzip -dc");
    assert!(raw.status.success(), "pprof export is not gzip");
    let text = String::from_utf8_lossy(&raw.stdout);
    for f in FUNCS {
        assert!(text.contains(f), "pprof export of the old epoch lacks {f}");
    }
    assert!(!text.contains("deploy+0x"), "pprof export has unsymbolized frames");

    // dcpidiff matches the two builds by function name, and work_b is what got slower.
    let out = run(
        "dcpidiff",
        &[
            "--db",
            &sb.db().display().to_string(),
            "--host",
            &host,
            "--before",
            &before,
            "--after",
            &after,
            "--image",
            &path,
            "--symbol-cache",
            &cache,
            "--format",
            "json",
        ],
    );
    let v: serde_json::Value = serde_json::from_str(&ok(&out, "dcpidiff")).expect("JSON diff");
    let rows = v["rows"].as_array().cloned().unwrap_or_default();
    let row = |name: &str| -> serde_json::Value {
        rows.iter()
            .find(|r| r["symbol"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no row {name}: {v:#}"))
    };
    for f in FUNCS {
        let r = row(f);
        assert!(
            r["before"].as_u64().unwrap_or(0) > 0 && r["after"].as_u64().unwrap_or(0) > 0,
            "{f} not matched across the builds: {r:#}"
        );
    }
    assert!(
        !rows.iter().any(|r| r["symbol"].as_str().is_some_and(|s| s.contains("mismatch"))),
        "a side is [build-id mismatch]: {v:#}"
    );
    let delta = |f: &str| row(f)["delta"].as_f64().unwrap_or(f64::NAN);
    assert!(
        delta("work_b") > delta("work_a") && delta("work_b") > delta("work_c"),
        "work_b (made 2x slower) is not the one that grew: {v:#}"
    );
    assert_eq!(row("work_b")["significant"], true, "{v:#}");
}

/// Items 1, 2 and 4 of issue 39: the binary's own `.symtab` stored, the binary deleted.
#[dcpi_testkit::test(perf)]
fn old_epoch_names_functions_after_the_binary_is_rebuilt_and_deleted() {
    scenario(false, "symtab");
}

/// The same with the symbols only in a separate debug file beside the binary
/// (`.gnu_debuglink`), deleted with it.
#[dcpi_testkit::test(perf)]
fn old_epoch_names_functions_from_a_stored_debug_file_table() {
    if Command::new("objcopy").arg("--version").output().is_err() {
        dcpi_testkit::skip!("objcopy (binutils) is not installed");
    }
    scenario(true, "debug");
}
