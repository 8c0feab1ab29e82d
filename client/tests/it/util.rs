//! Helpers shared by the client's integration tests: a database in a temporary directory,
//! events and profiles written with the profile-format API, running `dcpiprof`, reading its
//! output, golden files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

pub(crate) use dcpi_testkit::db::{base_time, cpu_clock, event, TestDb};

/// Run dcpiprof on `db`; the symbol cache goes to a `cache` dir beside the database (through
/// `XDG_CACHE_HOME`, so the default location logic is exercised and nothing leaks into ~/.cache).
pub(crate) fn prof(db: &Path, args: &[&str]) -> Output {
    prof_command(db, args).output().expect("run dcpiprof")
}

/// The command [`prof`] runs, for callers that add to it.
pub(crate) fn prof_command(db: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dcpiprof"));
    c.env("XDG_CACHE_HOME", db.parent().unwrap_or(db).join("cache"))
        .env_remove("DCPI_SYMBOL_CACHE")
        .arg("--db")
        .arg(db)
        .arg("--no-system-debug")
        .args(args);
    c
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// [`prof`] with `--format json`, which must succeed.
pub(crate) fn json_ok(db: &Path, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["--format", "json"]);
    let o = prof(db, &a);
    assert!(o.status.success(), "dcpiprof {a:?} failed: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(&o)))
}

pub(crate) fn rows(v: &Value) -> &Vec<Value> {
    v["rows"].as_array().expect("rows array")
}

pub(crate) fn row<'a>(v: &'a Value, key: &str, name: &str) -> &'a Value {
    rows(v)
        .iter()
        .find(|r| r[key].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no row {key}={name} in {v:#}"))
}

/// `client/tests/golden`, and whether `DCPI_UPDATE_GOLDEN=1` asks to rewrite its files.
pub(crate) fn golden_dir() -> (PathBuf, bool) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("golden");
    (dir, std::env::var_os("DCPI_UPDATE_GOLDEN").is_some_and(|v| v == "1"))
}

/// Compare a tool's output (stdout, then stderr after a marker) with the golden `file`, or
/// rewrite the file when `update`; a difference is added to `mismatches`.
pub(crate) fn check_golden(file: &Path, o: &Output, update: bool, mismatches: &mut Vec<String>) {
    let mut got = o.stdout.clone();
    if !o.stderr.is_empty() {
        got.extend_from_slice(b"--- stderr ---\n");
        got.extend_from_slice(&o.stderr);
    }
    if update {
        std::fs::create_dir_all(file.parent().expect("golden dir")).expect("mkdir golden");
        std::fs::write(file, &got).expect("write golden");
        return;
    }
    let want = std::fs::read(file).unwrap_or_else(|e| {
        panic!("{}: {e} (run with DCPI_UPDATE_GOLDEN=1 to create)", file.display())
    });
    if want != got {
        mismatches.push(format!(
            "{}:\n--- want\n{}\n--- got\n{}",
            file.display(),
            String::from_utf8_lossy(&want),
            String::from_utf8_lossy(&got)
        ));
    }
}

pub(crate) fn assert_no_golden_mismatch(mismatches: &[String]) {
    assert!(
        mismatches.is_empty(),
        "golden mismatch (DCPI_UPDATE_GOLDEN=1 to accept):\n{}",
        mismatches.join("\n")
    );
}

/// Assembly for a program whose `main` calls a function named `name` (raw bytes, quoted for
/// the assembler: names that are not UTF-8 or hold control characters).
pub(crate) fn asm_calling(name: &[u8]) -> Vec<u8> {
    let mut asm = b".text\n.globl ".to_vec();
    for part in [
        name,
        b"\n.type ",
        name,
        b",@function\n",
        name,
        b":\n ret\n.size ",
        name,
        b", .-",
        name,
        b"\n.globl main\nmain: call ",
        name,
        b"\n xor %eax,%eax\n ret\n.section .note.GNU-stack,\"\",@progbits\n",
    ] {
        asm.extend_from_slice(part);
    }
    asm
}

/// Compile `src` (C or C++ by extension) into `out` with extra flags.
pub(crate) fn compile(dir: &Path, name: &str, src: &str, ext: &str, flags: &[&str]) -> PathBuf {
    let src_path = dir.join(format!("{name}.{ext}"));
    std::fs::write(&src_path, src).expect("write source");
    let out = dir.join(name);
    let compiler = if ext == "cpp" { "g++" } else { "cc" };
    let mut cmd = Command::new(compiler);
    cmd.args(flags);
    if !flags.iter().any(|f| f.contains("--build-id")) {
        cmd.arg("-Wl,--build-id=sha1");
    }
    let o = cmd.arg("-o").arg(&out).arg(&src_path).output().expect("run compiler");
    assert!(o.status.success(), "{compiler} failed: {}", String::from_utf8_lossy(&o.stderr));
    out
}
