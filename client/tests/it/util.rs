//! Helpers shared by the client's integration tests: a database in a temporary directory,
//! events and profiles written with the profile-format API, running `dcpiprof`, reading its
//! output, golden files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, SystemTime};

use profile_format::{
    Database, EpochId, EventDesc, HostDir, ImageId, ImageKind, JitSymbol, Profile, ProfileHeader,
};
use serde_json::Value;

/// The tests' fixed base time (2025-06-15) plus `secs`.
pub fn base_time(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000 + secs)
}

/// A database in a temporary directory, removed when dropped.
pub struct TestDb {
    dir: tempfile::TempDir,
    pub db: Database,
}

impl TestDb {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Database::create(&dir.path().join("db")).expect("create db");
        Self { dir, db }
    }
    pub fn root(&self) -> PathBuf {
        self.db.root().to_owned()
    }
    /// The temporary directory (the database is its `db`).
    pub fn tmp(&self) -> &Path {
        self.dir.path()
    }
    /// A new epoch begun by host `h1`, `secs` after the base time.
    pub fn epoch(&self, secs: u64) -> EpochId {
        self.epoch_by(base_time(secs), "h1")
    }
    /// A new epoch begun by `initiator` at `t`.
    pub fn epoch_by(&self, t: SystemTime, initiator: &str) -> EpochId {
        self.db.new_epoch(t, initiator).expect("new epoch")
    }
    pub fn host(&self, e: &EpochId, host: &str) -> HostDir {
        let hd = self.db.host_dir(e, host).expect("host dir");
        hd.create().expect("create host dir");
        hd
    }
}

/// A software event with mean period `period` (the minimum 1/16 lower, as the daemon's
/// frequency mode gives).
pub fn event(name: &str, period: u64) -> EventDesc {
    EventDesc {
        name: name.into(),
        perf_type: 1,
        perf_config: 0,
        period_mean: period,
        period_min: period - period / 16,
        period_max: period,
    }
}

/// The default event: cpu-clock at 1 ms.
pub fn cpu_clock() -> EventDesc {
    event("cpu-clock", 1_000_000)
}

/// Write a profile: `counts` are (offset, count); every sample has period `period`.
pub fn write_profile(
    hd: &HostDir,
    kind: ImageKind,
    id: &ImageId,
    path: &[u8],
    ev: &EventDesc,
    counts: &[(u64, u64)],
    period: u64,
) {
    write_profile_jit(hd, kind, id, path, ev, counts, period, Vec::new());
}

#[allow(clippy::too_many_arguments)]
pub fn write_profile_jit(
    hd: &HostDir,
    kind: ImageKind,
    id: &ImageId,
    path: &[u8],
    ev: &EventDesc,
    counts: &[(u64, u64)],
    period: u64,
    jit_symbols: Vec<JitSymbol>,
) {
    let mut p = Profile::new(ProfileHeader {
        kind,
        image_id: id.clone(),
        image_path: path.to_vec(),
        event: ev.clone(),
        host: hd.host.clone(),
        epoch: hd.epoch.clone(),
        total_samples: 0,
        total_period: 0,
        sequence: 0,
        jit_symbols,
    });
    for &(off, c) in counts {
        p.add(off, c, c * period);
    }
    let file = if kind == ImageKind::Unknown {
        hd.unknown_path(&ev.name)
    } else {
        hd.profile_path(id, &ev.name)
    };
    p.write(&file).expect("write profile");
}

/// Run dcpiprof on `db`; the symbol cache goes to a `cache` dir beside the database (through
/// XDG_CACHE_HOME, so the default location logic is exercised and nothing leaks into ~/.cache).
pub fn prof(db: &Path, args: &[&str]) -> Output {
    prof_command(db, args).output().expect("run dcpiprof")
}

/// The command [`prof`] runs, for callers that add to it.
pub fn prof_command(db: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_dcpiprof"));
    c.env("XDG_CACHE_HOME", db.parent().unwrap_or(db).join("cache"))
        .env_remove("DCPI_SYMBOL_CACHE")
        .arg("--db")
        .arg(db)
        .arg("--no-system-debug")
        .args(args);
    c
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// [`prof`] with `--format json`, which must succeed.
pub fn json_ok(db: &Path, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["--format", "json"]);
    let o = prof(db, &a);
    assert!(o.status.success(), "dcpiprof {a:?} failed: {}", stderr(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(&o)))
}

pub fn rows(v: &Value) -> &Vec<Value> {
    v["rows"].as_array().expect("rows array")
}

pub fn row<'a>(v: &'a Value, key: &str, name: &str) -> &'a Value {
    rows(v)
        .iter()
        .find(|r| r[key].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no row {key}={name} in {v:#}"))
}

/// `client/tests/golden`, and whether DCPI_UPDATE_GOLDEN=1 asks to rewrite its files.
pub fn golden_dir() -> (PathBuf, bool) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests").join("golden");
    (dir, std::env::var_os("DCPI_UPDATE_GOLDEN").is_some_and(|v| v == "1"))
}

/// Compare a tool's output (stdout, then stderr after a marker) with the golden `file`, or
/// rewrite the file when `update`; a difference is added to `mismatches`.
pub fn check_golden(file: &Path, o: &Output, update: bool, mismatches: &mut Vec<String>) {
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

pub fn assert_no_golden_mismatch(mismatches: &[String]) {
    assert!(
        mismatches.is_empty(),
        "golden mismatch (DCPI_UPDATE_GOLDEN=1 to accept):\n{}",
        mismatches.join("\n")
    );
}

/// Assembly for a program whose `main` calls a function named `name` (raw bytes, quoted for
/// the assembler: names that are not UTF-8 or hold control characters).
pub fn asm_calling(name: &[u8]) -> Vec<u8> {
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
pub fn compile(dir: &Path, name: &str, src: &str, ext: &str, flags: &[&str]) -> PathBuf {
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
