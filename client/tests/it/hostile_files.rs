//! Every kind of database file (profile, `summary.idx`, `summary.json`, `who.tbl`, stack
//! file, kernel symbol snapshot, lease) replaced by a FIFO, a symbolic link, a character device
//! (`/dev/zero`) or a sparse 3 GiB file, under every report tool of this crate (dcpiprof,
//! dcpilist, dcpidiff, dcpistats; dcpiexport has the same table in its own crate's tests): a
//! tool whose report reads that file exits with status 2 and an error naming it, at once; a
//! tool that does not read it is not disturbed (exit 0). None hangs or panics.
//!
//! Before (issue 34): a FIFO, /dev/zero or a sparse 3 GiB file as `summary.idx` (dcpiprof,
//! dcpidiff) or `who.tbl` (dcpiprof --by) made the tool hang or read GiB (they were read with
//! `std::fs::read`, not through `profile_format::safeio`), and a link there was followed; a
//! hostile `summary.json` or kernel symbol snapshot was refused but only warned about (exit 0),
//! and `dcpilist --top` ignored a hostile snapshot without a word.
//!
//! The issue asks for "within 1 s"; unloaded every run here takes well under that (measured:
//! the slowest case printed by this test, `cargo test -p dcpi-client --test it
//! hostile_files -- --nocapture`). The assertion uses 5 s so that a loaded CI machine does
//! not fail it; a hang is killed after 20 s and fails.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dcpi_testkit::db::{base_time, create_db, every_kind_of_file, host_dir, write_lease, DbFile};
use dcpi_testkit::Hostile;
use profile_format::{Database, EpochId, HostDir};

const HOST: &str = "h1";

/// A database of two epochs of host h1, each with one file of every kind
/// (`dcpi_testkit::db::every_kind_of_file`: a user profile `/bin/img1`, a kernel profile with
/// its symbol snapshot, `summary.json` and `summary.idx`, a who table and a stack file); and a
/// lease for h1. Returns the database, the older epoch and the newer epoch's directory (the
/// one whose files are replaced: every `--epoch latest` report reads it).
fn fixture(root: &Path) -> (Database, EpochId, HostDir) {
    let db = create_db(root);
    let mut last = None;
    let mut first = None;
    for secs in [0, 3600] {
        let e = db.new_epoch(base_time(secs), HOST).expect("epoch");
        let hd = host_dir(&db, &e, HOST);
        every_kind_of_file(&hd);
        first.get_or_insert(e.clone());
        last = Some(hd);
    }
    write_lease(&db, HOST);
    (db, first.expect("epoch"), last.expect("host dir"))
}

/// How long a run may take before it is killed and counted as a hang.
const HANG: Duration = Duration::from_secs(20);

/// Run `tool`, killed past [`HANG`]; the output and wall time (`Err` with its stderr if it
/// was killed).
fn run_bounded(tool: &str, db: &Path, args: &[&str]) -> Result<(Output, Duration), String> {
    let exe = match tool {
        "dcpiprof" => env!("CARGO_BIN_EXE_dcpiprof"),
        "dcpilist" => env!("CARGO_BIN_EXE_dcpilist"),
        "dcpidiff" => env!("CARGO_BIN_EXE_dcpidiff"),
        _ => env!("CARGO_BIN_EXE_dcpistats"),
    };
    let start = Instant::now();
    let mut child = Command::new(exe)
        .env("XDG_CACHE_HOME", db.parent().unwrap_or(db).join("cache"))
        .env_remove("DCPI_SYMBOL_CACHE")
        .arg("--db")
        .arg(db)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tool");
    let deadline = start + HANG;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            drop(child.kill());
            let o = child.wait_with_output().expect("output");
            return Err(String::from_utf8_lossy(&o.stderr).into_owned());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let o = child.wait_with_output().expect("output");
    Ok((o, start.elapsed()))
}

/// The report of `tool` that reads a file of `kind` (`None`: the tool never reads one; it
/// runs its default report, which must not be disturbed). `e1` is the older epoch.
fn report(tool: &str, kind: DbFile, e1: &str) -> Option<Vec<String>> {
    use DbFile::*;
    let a: &[&str] = match (tool, kind) {
        // The lease is the daemons' business: no report reads it.
        (_, Lease) => return None,
        // Per-image reports come from the summary index, per-symbol ones from the profiles.
        ("dcpiprof", Profile) => &["--image", "img1"],
        ("dcpiprof", SummaryIdx | SummaryJson) => &[],
        ("dcpiprof", Who) => &["--by", "command"],
        ("dcpiprof", Stacks) => &["--format", "folded"],
        ("dcpiprof", Kallsyms) => &["--image", "kernel"],
        // Instruction reports read the profiles, and summary.json for the multiplexing scale.
        ("dcpilist", Profile | Kallsyms | SummaryJson) => &["--top", "5"],
        ("dcpilist", _) => return None,
        ("dcpidiff", Profile) => &["--before", e1, "--after", "latest", "--image", "img1"],
        ("dcpidiff", SummaryIdx | SummaryJson) => &["--before", e1, "--after", "latest"],
        ("dcpidiff", Kallsyms) => &["--before", e1, "--after", "latest", "--image", "kernel"],
        ("dcpidiff", _) => return None,
        ("dcpistats", Profile | SummaryJson) => &["--image", "img1"],
        ("dcpistats", Kallsyms) => &["--image", "kernel"],
        _ => return None,
    };
    Some(a.iter().map(ToString::to_string).collect())
}

/// The default (or simplest) report of each tool, for the files it does not read.
fn default_report(tool: &str, e1: &str) -> Vec<String> {
    let a: &[&str] = match tool {
        "dcpiprof" => &[],
        "dcpilist" => &["--top", "5"],
        "dcpidiff" => &["--before", e1, "--after", "latest"],
        _ => &["--image", "img1"],
    };
    a.iter().map(ToString::to_string).collect()
}

#[test]
fn every_database_file_kind_planted_hostile_is_exit_2_naming_it_under_every_tool() {
    let mut failures = Vec::new();
    let mut slowest = (Duration::ZERO, String::new());
    for kind in DbFile::ALL {
        for hostile in Hostile::ALL {
            let dir = tempfile::tempdir().expect("tempdir");
            let root = dir.path().join("db");
            let (db, e1, hd) = fixture(&root);
            if kind == DbFile::SummaryJson {
                // summary.json is read when there is no summary.idx (older daemons).
                std::fs::remove_file(hd.summary_index_path()).expect("rm summary.idx");
            }
            let path = kind.path(&db, &hd);
            hostile.plant(&path);
            for tool in ["dcpiprof", "dcpilist", "dcpidiff", "dcpistats"] {
                let reads = report(tool, kind, e1.as_str());
                let mut args =
                    vec!["--host".to_string(), HOST.to_string(), "--no-system-debug".into()];
                args.extend(reads.clone().unwrap_or_else(|| default_report(tool, e1.as_str())));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let case = format!("{kind:?} as {hostile:?}, {tool} {args:?}");
                let (o, took) = match run_bounded(tool, &root, &args) {
                    Ok(r) => r,
                    Err(err) => {
                        failures.push(format!("{case}: still running after {HANG:?}: {err}"));
                        continue;
                    }
                };
                let err = String::from_utf8_lossy(&o.stderr);
                if took > slowest.0 {
                    slowest = (took, case.clone());
                }
                if err.contains("panicked") {
                    failures.push(format!("{case}: panicked: {err}"));
                } else if reads.is_some() {
                    if o.status.code() != Some(2) || !err.contains(&path.display().to_string()) {
                        failures.push(format!(
                            "{case}: want exit 2 naming {}, got {:?}: {err}",
                            path.display(),
                            o.status.code()
                        ));
                    }
                } else if o.status.code() != Some(0) {
                    failures.push(format!("{case}: does not read it, yet {:?}: {err}", o.status));
                }
                if took > Duration::from_secs(5) {
                    failures.push(format!("{case}: took {took:?}"));
                }
            }
        }
    }
    println!("slowest run: {:?} ({})", slowest.0, slowest.1);
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
