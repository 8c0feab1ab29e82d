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

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use profile_format::{
    Database, EpochId, HostDir, HostSummary, ImageId, ImageKind, KallsymsSnapshot, KernelSymbol,
    Lease, SummaryIndex, WhoKey, WhoTable, SUMMARY_FORMAT_VERSION,
};

use crate::util::{self, event};

const HOST: &str = "h1";
const KTEXT: u64 = 0xffff_ffff_8100_0000;

/// The database files a hostile one can replace.
#[derive(Clone, Copy, Debug, PartialEq)]
enum FileKind {
    Profile,
    SummaryIdx,
    SummaryJson,
    Who,
    Stacks,
    Kallsyms,
    Lease,
}

const FILE_KINDS: [FileKind; 7] = [
    FileKind::Profile,
    FileKind::SummaryIdx,
    FileKind::SummaryJson,
    FileKind::Who,
    FileKind::Stacks,
    FileKind::Kallsyms,
    FileKind::Lease,
];

/// What replaces the file.
const HOSTILE: [&str; 4] = ["fifo", "symlink", "dev-zero", "sparse"];

/// A database of two epochs of host h1, each with a user profile (`/bin/img1`), a kernel
/// profile with its symbol snapshot, `summary.json` and `summary.idx`, a who table and a
/// stack file; and a lease for h1. Returns the older epoch and the newer epoch's directory (the
/// one whose files are replaced: every `--epoch latest` report reads it).
fn fixture(root: &Path) -> (EpochId, HostDir) {
    let db = Database::create(root).expect("create db");
    let mut last = None;
    let mut first = None;
    for secs in [0, 3600] {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_750_000_000 + secs);
        let e = db.new_epoch(t, HOST).expect("epoch");
        let hd = db.host_dir(&e, HOST).expect("host dir");
        hd.create().expect("create");
        let ev = event("cpu-clock", 1000);
        let id = ImageId::BuildId(vec![1; 8]);
        util::write_profile(&hd, ImageKind::Elf, &id, b"/bin/img1", &ev, &[(0x10, 7)], 1000);
        let kid = ImageId::special("[kernel.kallsyms]", b"9.9.9-test");
        util::write_profile(
            &hd,
            ImageKind::Kernel,
            &kid,
            b"[kernel.kallsyms]",
            &ev,
            &[(0x10, 5)],
            1000,
        );
        let snap = KallsymsSnapshot {
            kernel_release: "9.9.9-test".into(),
            kernel_build_id: None,
            text_base: KTEXT,
            modules: Vec::new(),
            symbols: vec![
                KernelSymbol { addr: KTEXT, kind: b't', name: "kwork".into(), module: None },
                KernelSymbol {
                    addr: KTEXT + 0x100,
                    kind: b't',
                    name: "kafter".into(),
                    module: None,
                },
            ],
        };
        snap.write(&hd.kallsyms_path()).expect("snapshot");
        let mut who = WhoTable::new(HOST, hd.epoch.as_str());
        let key = WhoKey {
            cgroup: "/".into(),
            command: "img1".into(),
            pid: 0,
            image: "/bin/img1".into(),
            event: "cpu-clock".into(),
        };
        who.add(key, 7);
        who.write(&hd.who_path()).expect("who table");
        let mut st = profile_format::StackProfile::new(HOST, hd.epoch.as_str(), "cpu-clock");
        let a = st.image_index(&profile_format::StackImage {
            kind: ImageKind::Elf,
            id: id.clone(),
            path: b"/bin/img1".to_vec(),
        });
        st.add(&[(a, 0x10)], false, 7);
        st.write(&hd.stacks_path("cpu-clock")).expect("stacks");
        let mut s = HostSummary {
            format_version: SUMMARY_FORMAT_VERSION,
            host: HOST.into(),
            epoch: hd.epoch.to_string(),
            samples: 12,
            ..HostSummary::default()
        };
        s.write(&hd.summary_path()).expect("summary.json");
        s.index = Some(SummaryIndex::of_host_dir(&hd).expect("index"));
        profile_format::sumidx::write(&s, &hd.summary_index_path()).expect("summary.idx");
        first.get_or_insert(e.clone());
        last = Some(hd);
    }
    let lease =
        Lease { host: HOST.into(), hostname: HOST.into(), interval_ms: 1000, ..Lease::default() };
    db.write_lease(&lease).expect("lease");
    (first.expect("epoch"), last.expect("host dir"))
}

fn file_of(kind: FileKind, db: &Path, hd: &HostDir) -> PathBuf {
    match kind {
        FileKind::Profile => hd.profile_path(&ImageId::BuildId(vec![1; 8]), "cpu-clock"),
        FileKind::SummaryIdx => hd.summary_index_path(),
        FileKind::SummaryJson => hd.summary_path(),
        FileKind::Who => hd.who_path(),
        FileKind::Stacks => hd.stacks_path("cpu-clock"),
        FileKind::Kallsyms => hd.kallsyms_path(),
        FileKind::Lease => Database::open(db).expect("open").lease_path(HOST).expect("lease path"),
    }
}

/// Replace `path` by `hostile`; the sparse file keeps the original's first bytes (its header,
/// announcing the real length) and grows to 3 GiB.
fn plant(path: &Path, hostile: &str) {
    let original = std::fs::read(path).expect("read original");
    std::fs::remove_file(path).expect("rm");
    match hostile {
        "fifo" => {
            let ok = Command::new("mkfifo").arg(path).status().expect("mkfifo");
            assert!(ok.success());
        }
        "symlink" => {
            // A link to a valid copy: still refused (a link can point anywhere).
            let target = path.with_extension("target");
            std::fs::write(&target, &original).expect("write target");
            std::os::unix::fs::symlink(&target, path).expect("symlink");
        }
        "dev-zero" => {
            // The device itself where permitted (root), else a link to it.
            let made = Command::new("mknod")
                .arg(path)
                .args(["c", "1", "5"])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !made {
                std::os::unix::fs::symlink("/dev/zero", path).expect("symlink");
            }
        }
        _ => {
            std::fs::write(path, &original).expect("write");
            let f = std::fs::OpenOptions::new().write(true).open(path).expect("open");
            f.set_len(3 << 30).expect("set_len");
        }
    }
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
            let _ = child.kill();
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
fn report(tool: &str, kind: FileKind, e1: &str) -> Option<Vec<String>> {
    use FileKind::*;
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
    Some(a.iter().map(|s| s.to_string()).collect())
}

/// The default (or simplest) report of each tool, for the files it does not read.
fn default_report(tool: &str, e1: &str) -> Vec<String> {
    let a: &[&str] = match tool {
        "dcpiprof" => &[],
        "dcpilist" => &["--top", "5"],
        "dcpidiff" => &["--before", e1, "--after", "latest"],
        _ => &["--image", "img1"],
    };
    a.iter().map(|s| s.to_string()).collect()
}

#[test]
fn every_database_file_kind_planted_hostile_is_exit_2_naming_it_under_every_tool() {
    let mut failures = Vec::new();
    let mut slowest = (Duration::ZERO, String::new());
    for kind in FILE_KINDS {
        for hostile in HOSTILE {
            let dir = tempfile::tempdir().expect("tempdir");
            let root = dir.path().join("db");
            let (e1, hd) = fixture(&root);
            if kind == FileKind::SummaryJson {
                // summary.json is read when there is no summary.idx (older daemons).
                std::fs::remove_file(hd.summary_index_path()).expect("rm summary.idx");
            }
            let path = file_of(kind, &root, &hd);
            plant(&path, hostile);
            for tool in ["dcpiprof", "dcpilist", "dcpidiff", "dcpistats"] {
                let reads = report(tool, kind, e1.as_str());
                let mut args =
                    vec!["--host".to_string(), HOST.to_string(), "--no-system-debug".into()];
                args.extend(reads.clone().unwrap_or_else(|| default_report(tool, e1.as_str())));
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                let case = format!("{kind:?} as {hostile}, {tool} {args:?}");
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
