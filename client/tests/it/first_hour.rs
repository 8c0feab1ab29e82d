//! What a new user meets in the first hour (issue #21): selection by name prefix, day, time
//! and duration; host listing; freshness and readable numbers in the table; `--limit 0`;
//! quiet exit on a closed pipe; dcpictl's message when the socket is not accessible.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, SystemTime};

use profile_format::{EpochId, EventSummary, HostDir, HostSummary, ImageId};
use serde_json::Value;

use dcpi_testkit::db::{self, Image};

use crate::util::{self, cpu_clock, stderr, stdout, TestDb};

fn build_id(n: u8) -> ImageId {
    db::build_id(n, 20)
}

/// A cpu-clock profile of an ELF image at its mean period.
fn write_profile(hd: &HostDir, id: &ImageId, path: &str, counts: &[(u64, u64)]) {
    Image::elf(id.clone(), path).profile(&cpu_clock()).counts(counts).write(hd);
}

/// Images whose names share prefixes and substrings (`nginx`, `nginx-debug`, `libnginx.so`).
fn images(hd: &HostDir, scale: u64) {
    write_profile(hd, &build_id(1), "/usr/sbin/nginx", &[(0x1000, 50 * scale)]);
    write_profile(hd, &build_id(2), "/usr/sbin/nginx-debug", &[(0x1000, 30 * scale)]);
    write_profile(hd, &build_id(3), "/usr/lib/libnginx.so.2", &[(0x2000, 2_000 * scale)]);
    write_profile(hd, &build_id(4), "/usr/bin/postgres", &[(0x3000, 7 * scale)]);
}

fn tool(exe: &str, db: &Path, args: &[&str]) -> Output {
    Command::new(exe)
        .env_remove("DCPI_SYMBOL_CACHE")
        .env_remove("NO_COLOR")
        .arg("--db")
        .arg(db)
        .args(["--no-system-debug", "--no-symbol-cache"])
        .args(args)
        .output()
        .expect("run tool")
}

fn prof(db: &Path, args: &[&str]) -> Output {
    tool(env!("CARGO_BIN_EXE_dcpiprof"), db, args)
}

fn json(o: &Output) -> Value {
    assert!(o.status.success(), "failed: {}", stderr(o));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

/// One epoch at a fixed time, host alpha and beta.
fn one_epoch_db() -> (TestDb, EpochId) {
    let t = TestDb::new();
    let e = t.epoch_by(util::base_time(0), "alpha");
    images(&t.host(&e, "alpha"), 1);
    images(&t.host(&e, "beta"), 1);
    (t, e)
}

#[test]
fn image_prefix_or_substring_of_a_basename_exact_wins_several_are_listed() {
    let (t, _) = one_epoch_db();
    let db = t.root();
    let image_of = |spec: &str| -> String {
        let v = json(&prof(&db, &["--host", "alpha", "--image", spec, "--format", "json"]));
        v["image"]["path"].as_str().unwrap_or_default().to_owned()
    };
    // Exact basename wins over the longer names it is a prefix or substring of.
    assert_eq!(image_of("nginx"), "/usr/sbin/nginx");
    // A unique prefix, a unique substring.
    assert_eq!(image_of("post"), "/usr/bin/postgres");
    assert_eq!(image_of("debug"), "/usr/sbin/nginx-debug");
    assert_eq!(image_of("libng"), "/usr/lib/libnginx.so.2");
    // A prefix of two names: both listed, exit 2, nothing on stdout.
    let o = prof(&db, &["--host", "alpha", "--image", "ngin"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("ambiguous"), "{e}");
    assert!(e.contains("/usr/sbin/nginx-debug") && e.contains("/usr/sbin/nginx "), "{e}");
    assert!(!e.contains("libnginx"), "a prefix match beats a substring match: {e}");
    assert!(e.contains(&format!("build-id {}", "02".repeat(20))), "{e}");
    assert!(o.stdout.is_empty());
    // A substring of several names, none a prefix: all listed.
    let o = prof(&db, &["--host", "alpha", "--image", "inx"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("libnginx.so.2") && e.contains("nginx-debug"), "{e}");
    // The other tools share the selection model.
    let o = tool(env!("CARGO_BIN_EXE_dcpilist"), &db, &["--host", "alpha", "--top", "3"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = tool(
        env!("CARGO_BIN_EXE_dcpidiff"),
        &db,
        &["--before-host", "alpha", "--after-host", "beta", "--image", "debug", "--format", "json"],
    );
    let v = json(&o);
    assert!(v.to_string().contains("nginx-debug"), "{v:#}");
}

#[test]
fn epoch_day_since_and_until_select_by_time() {
    let t = TestDb::new();
    let now = SystemTime::now();
    let h = |n: u64| Duration::from_secs(n * 3600);
    // Epochs 50 h, 5 h, 4 h and 1 h ago: each lasts until the next one starts.
    let ids: Vec<EpochId> =
        [50, 5, 4, 1].iter().map(|&n| t.epoch_by(now - h(n), "alpha")).collect();
    for (i, e) in ids.iter().enumerate() {
        images(&t.host(e, "alpha"), i as u64 + 1);
    }
    let epochs_of = |args: &[&str]| -> Vec<String> {
        let mut a = vec!["--host", "alpha", "--format", "json"];
        a.extend_from_slice(args);
        let v = json(&prof(&t.root(), &a));
        v["epochs"].as_array().expect("epochs").iter().map(ToString::to_string).collect()
    };
    let id = |i: usize| format!("\"{}\"", ids[i]);
    // Two hours back: the epoch that started 4 h ago still ran then, and the current one.
    // These epochs have no time slices (slices.log): one that the range cuts is named and
    // left out of the counts (issue 36: a range is exact or says what it could not count).
    assert_eq!(epochs_of(&["--since", "2h"]), vec![id(2), id(3)]);
    let o = prof(&t.root(), &["--host", "alpha", "--since", "2h"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("no time slices") && stderr(&o).contains(&ids[2].to_string()));
    // Ranges inside epochs without slices: nothing can be counted; exit 2 naming them.
    for args in [&["--since", "4h 30min", "--until", "2h"][..], &["--until", "49h"]] {
        let o = prof(&t.root(), &[&["--host", "alpha"][..], args].concat());
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("no time slices"), "{args:?}: {}", stderr(&o));
    }
    // A day as --epoch (every epoch started that day) and as --since.
    let day = &ids[0].to_string()[..8];
    let v = epochs_of(&["--epoch", day]);
    assert!(v.contains(&id(0)) && !v.contains(&id(3)) || day == &ids[3].to_string()[..8], "{v:?}");
    let since_day = epochs_of(&["--since", day]);
    assert_eq!(since_day.len(), 4, "{since_day:?}");
    // A UTC time.
    let stamp = humantime::format_rfc3339_seconds(now - h(3)).to_string();
    assert_eq!(epochs_of(&["--since", &stamp]), vec![id(2), id(3)]);
    // Bad input: one line naming the value, exit 2.
    let o = prof(&t.root(), &["--since", "yesterdayish"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("yesterdayish"), "{}", stderr(&o));
    let o = prof(&t.root(), &["--since", "1h", "--epoch", "all"]);
    assert_eq!(o.status.code(), Some(2), "--since replaces --epoch: {}", stderr(&o));
}

#[test]
fn host_without_a_value_or_unknown_lists_the_hosts() {
    let (t, _) = one_epoch_db();
    for args in [&["--host"][..], &["--host", "gamma"], &["--image", "nginx", "--host"]] {
        let o = prof(&t.root(), args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains("alpha, beta"), "{args:?}: {e}");
        assert_eq!(e.lines().count(), 1, "one line: {e}");
    }
    let o = tool(env!("CARGO_BIN_EXE_dcpilist"), &t.root(), &["--top", "3", "--host"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("alpha, beta"), "{}", stderr(&o));
}

#[test]
fn limit_zero_means_no_limit() {
    let (t, _) = one_epoch_db();
    let v = json(&prof(&t.root(), &["--host", "alpha", "--limit", "0", "--format", "json"]));
    assert_eq!(v["rows"].as_array().map(Vec::len), Some(4), "{v:#}");
    assert_eq!(v["rows_omitted"], 0);
    let v = json(&prof(&t.root(), &["--host", "alpha", "--limit", "1", "--format", "json"]));
    assert_eq!(v["rows"].as_array().map(Vec::len), Some(1), "{v:#}");
    let o = prof(&t.root(), &["--host", "alpha", "--limit", "0"]);
    assert!(!stdout(&o).contains("not shown"), "{}", stdout(&o));
}

#[test]
fn header_says_how_fresh_the_data_is_and_json_is_unchanged() {
    let (t, e) = one_epoch_db();
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).expect("clock").as_secs();
    let summary = HostSummary {
        format_version: 1,
        host: "alpha".into(),
        epoch: e.to_string(),
        events: vec![EventSummary {
            desc: Some(cpu_clock()),
            source: "software".into(),
            samples: 0,
            total_period: 0,
            time_enabled_ns: 1,
            time_running_ns: 1,
        }],
        first_written: now - 100,
        last_written: now - 30,
        ..HostSummary::default()
    };
    summary.write(&t.host(&e, "alpha").summary_path()).expect("summary");
    let o = prof(&t.root(), &["--host", "alpha"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let line =
        out.lines().find(|l| l.starts_with("# newest data:")).unwrap_or_else(|| panic!("{out}"));
    let secs: u64 = line["# newest data: ".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!((30..90).contains(&secs), "{line}");
    assert!(line.contains("dcpictl flush"), "{line}");
    // The selection is in the header too.
    for want in ["# epochs: ", "# hosts: alpha", "# event cpu-clock:", "mean period"] {
        assert!(out.contains(want), "{want}: {out}");
    }
    // JSON keeps its schema.
    let v = json(&prof(&t.root(), &["--host", "alpha", "--format", "json"]));
    assert!(v.get("newest_data").is_none() && !v.to_string().contains("newest"), "{v:#}");
    // Without a summary (or one that does not say), no claim is made.
    let o = prof(&t.root(), &["--host", "beta"]);
    assert!(!stdout(&o).contains("newest data"), "{}", stdout(&o));
}

/// Run `cmd` under a pseudo-terminal (`script`), returning what it printed.
fn on_a_tty(cmd: &str) -> Option<String> {
    let o = Command::new("script")
        .args(["-qec", cmd, "/dev/null"])
        .env_remove("NO_COLOR")
        .stdin(Stdio::null())
        .output()
        .ok()?;
    o.status.success().then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

#[test]
fn numbers_are_grouped_on_a_terminal_and_raw_in_pipes_json_and_csv() {
    let (t, _) = one_epoch_db();
    let cmd = format!(
        "{} --db {} --host alpha --no-system-debug --no-symbol-cache",
        env!("CARGO_BIN_EXE_dcpiprof"),
        t.root().display()
    );
    // Piped: plain digits.
    let piped = stdout(&prof(&t.root(), &["--host", "alpha"]));
    assert!(piped.contains(" 2000 ") && !piped.contains("2,000"), "{piped}");
    let csv = stdout(&prof(&t.root(), &["--host", "alpha", "--format", "csv"]));
    assert!(csv.contains(",2000,") && !csv.contains("2,000"), "{csv}");
    match on_a_tty(&cmd) {
        Some(tty) => {
            assert!(tty.contains("2,000") && tty.contains("2,000,000,000"), "{tty}");
            // Columns still line up: every row of the table is as wide as its title line.
            let table: Vec<&str> = tty
                .lines()
                .map(|l| l.trim_end_matches('\r'))
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .collect();
            let col = table[0].find("image").expect("title");
            for l in &table[1..] {
                let aligned = l.get(..col).is_some_and(|b| b.ends_with(' '))
                    && l.get(col..).is_some_and(|c| !c.starts_with(' '));
                assert!(aligned, "image column aligned: {tty}");
            }
        }
        None => dcpi_testkit::skipped(format_args!(
            "(terminal part) `script` cannot run a pseudo-terminal here"
        )),
    }
}

/// Run a tool with its stdout a pipe whose reader is already gone.
fn into_closed_pipe(exe: &str, args: &[&str]) -> Output {
    // The write end of a pipe whose only reader (`true`) has exited: every write fails EPIPE.
    let mut reader = Command::new("true").stdin(Stdio::piped()).spawn().expect("run true");
    let writer = reader.stdin.take().expect("pipe");
    reader.wait().expect("wait for true");
    Command::new(exe)
        .args(args)
        .env_remove("DCPI_SYMBOL_CACHE")
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("run")
}

#[test]
fn closed_pipe_ends_quietly_with_exit_0() {
    let t = TestDb::new();
    let now = SystemTime::now();
    for n in [3u64, 2, 1] {
        let e = t.epoch_by(now - Duration::from_secs(n * 3600), "alpha");
        images(&t.host(&e, "alpha"), n);
    }
    let db = t.root().display().to_string();
    let common = ["--db", db.as_str(), "--host", "alpha", "--no-symbol-cache"];
    let with = |more: &[&'static str]| -> Vec<String> {
        common.iter().chain(more).map(ToString::to_string).collect()
    };
    let cases: Vec<(&str, Vec<String>)> = vec![
        (env!("CARGO_BIN_EXE_dcpiprof"), with(&[])),
        (env!("CARGO_BIN_EXE_dcpiprof"), with(&["--format", "json"])),
        (env!("CARGO_BIN_EXE_dcpiprof"), with(&["--image", "nginx"])),
        (env!("CARGO_BIN_EXE_dcpiprof"), with(&["--format", "folded"])),
        (env!("CARGO_BIN_EXE_dcpiprof"), vec!["--generate".into(), "man".into()]),
        (env!("CARGO_BIN_EXE_dcpilist"), with(&["--top", "5"])),
        (env!("CARGO_BIN_EXE_dcpidiff"), with(&["--epoch", "all", "--before", "latest"])),
        (env!("CARGO_BIN_EXE_dcpistats"), with(&["--epoch", "all", "--image", "nginx"])),
        (env!("CARGO_BIN_EXE_dcpictl"), vec!["--generate".into(), "man".into()]),
    ];
    for (exe, args) in cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        // The same command into a real reader works (so the pipe case is not a failure anyway).
        let ok = Command::new(exe).args(&a).output().expect("run");
        assert!(ok.status.success(), "{exe} {a:?}: {}", stderr(&ok));
        let o = into_closed_pipe(exe, &a);
        assert_eq!(o.status.code(), Some(0), "{exe} {a:?}: {}", stderr(&o));
        let e = stderr(&o);
        for noise in ["error", "roken pipe", "panicked"] {
            assert!(!e.contains(noise), "{exe} {a:?} quiet: {e}");
        }
    }
}

/// `dcpictl` as a user who may not connect to the socket: the message names the socket, its
/// owner and group, and what to do.
/// (Needs root: only root can switch to another user here.)
#[dcpi_testkit::test(root, tool("setpriv"))]
fn dcpictl_without_permission_names_the_socket_owner_and_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let sock = dir.path().join("dcpid.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o660)).expect("chmod");
    // The test binary's directory may not be readable by nobody: copy dcpictl somewhere that is.
    let exe = dir.path().join("dcpictl");
    std::fs::copy(env!("CARGO_BIN_EXE_dcpictl"), &exe).expect("copy dcpictl");
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&exe)
        .arg("--socket")
        .arg(&sock)
        .arg("status")
        .output();
    let o = match o {
        Ok(o) if !String::from_utf8_lossy(&o.stderr).starts_with("setpriv:") => o,
        Ok(o) => {
            dcpi_testkit::skip!("setpriv cannot switch users here: {}", stderr(&o));
        }
        Err(e) => {
            dcpi_testkit::skip!("setpriv not available: {e}");
        }
    };
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(e.contains(&sock.display().to_string()), "names the socket: {e}");
    assert!(e.contains("owner root") && e.contains("group root"), "owner and group: {e}");
    assert!(e.contains("mode 0660"), "{e}");
    // The socket's group is root: the advice is to run as root, not to join a `dcpi` group
    // the socket does not have (issue 35: the message named `dcpi` whatever --socket-group was).
    assert!(!e.contains("`dcpi` group"), "names a group the socket does not have: {e}");
    assert!(
        e.contains("must run as root") && e.contains("without a socket group"),
        "what to do: {e}"
    );
    assert_eq!(e.lines().count(), 1, "{e}");
}

#[test]
fn mistyped_event_gets_a_suggestion() {
    let (t, _) = one_epoch_db();
    let o = prof(&t.root(), &["--host", "alpha", "--event", "cpu-clok"]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(e.contains("(did you mean `cpu-clock`?)"), "{e}");
    assert!(e.contains("events there: cpu-clock"), "{e}");
    let o = prof(&t.root(), &["--host", "alpha", "--event", "page-faults"]);
    assert!(!stderr(&o).contains("did you mean"), "no guess when nothing is close: {}", stderr(&o));
    let o = tool(
        env!("CARGO_BIN_EXE_dcpidiff"),
        &t.root(),
        &["--before-host", "alpha", "--after-host", "beta", "--event", "cpuclock"],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("did you mean `cpu-clock`?"), "{}", stderr(&o));
}

/// File offset of function `name` in the ELF file at `path`.
fn func_offset(path: &Path, name: &str) -> u64 {
    use object::{Object, ObjectSegment, ObjectSymbol};
    let data = std::fs::read(path).expect("read elf");
    let f = object::File::parse(&*data).expect("parse elf");
    let s = f.symbols().find(|s| s.name() == Ok(name)).unwrap_or_else(|| panic!("{name}"));
    let seg = f
        .segments()
        .find(|g| (g.address()..g.address() + g.size()).contains(&s.address()))
        .expect("segment");
    s.address() - seg.address() + seg.file_range().0
}

#[test]
fn stripped_library_report_says_only_dynsym_and_how_to_get_symbols() {
    let t = TestDb::new();
    let dir = t.root().parent().expect("tmp").join("lib");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let src = dir.join("s.c");
    std::fs::write(
        &src,
        "static __attribute__((noinline)) int internal_work(int x) { int s = 0; \
         for (int i = 0; i < x; i++) s += i * x; return s; }\n\
         int exported_entry(int x) { return internal_work(x) + 1; }\n",
    )
    .expect("write c");
    let full = dir.join("libfull.so");
    let o = Command::new("cc")
        .args(["-O1", "-shared", "-fPIC", "-Wl,--build-id", "-o"])
        .arg(&full)
        .arg(&src)
        .output();
    match o {
        Ok(o) if o.status.success() => {}
        other => {
            dcpi_testkit::skip!("no C compiler to build a test library: {other:?}");
        }
    }
    let lib = dir.join("libstripped.so.1");
    let o = Command::new("objcopy").arg("--strip-all").arg(&full).arg(&lib).output();
    assert!(o.is_ok_and(|o| o.status.success()), "objcopy --strip-all");
    let data = std::fs::read(&lib).expect("read lib");
    let id = {
        use object::Object;
        let f = object::File::parse(&*data).expect("parse");
        ImageId::BuildId(f.build_id().ok().flatten().expect("build-id").to_vec())
    };
    let e = t.epoch_by(SystemTime::now(), "alpha");
    let hd = t.host(&e, "alpha");
    let inner = func_offset(&full, "internal_work");
    let outer = func_offset(&full, "exported_entry");
    let path = lib.display().to_string();
    write_profile(&hd, &id, &path, &[(inner, 9), (outer, 3)]);
    let o = prof(&t.root(), &["--host", "alpha", "--image", "libstripped.so.1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    let note =
        out.lines().find(|l| l.starts_with("# symbols: ")).unwrap_or_else(|| panic!("{out}"));
    for want in ["only .dynsym", "stripped", "-dbgsym/-debuginfo", "--debug-dir", "debuginfod-find"]
    {
        assert!(note.contains(want), "{want}: {note}");
    }
    assert!(out.contains("exported_entry"), "the exported function is named: {out}");
    assert!(stderr(&o).contains("only .dynsym"), "{}", stderr(&o));
    // The unstripped library (a full .symtab) has no such note.
    let full_data = std::fs::read(&full).expect("read");
    let full_id = {
        use object::Object;
        let f = object::File::parse(&*full_data).expect("parse");
        ImageId::BuildId(f.build_id().ok().flatten().expect("build-id").to_vec())
    };
    let e2 = t.epoch_by(SystemTime::now() + Duration::from_secs(2), "alpha");
    write_profile(&t.host(&e2, "alpha"), &full_id, &full.display().to_string(), &[(inner, 9)]);
    let o = prof(&t.root(), &["--host", "alpha", "--image", "libfull.so"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stdout(&o).contains("# symbols:"), "{}", stdout(&o));
    assert!(stdout(&o).contains("internal_work"), "{}", stdout(&o));
}

/// Issue 39 item 3: a report over 20 stripped images (a stock host: every system library is
/// stripped) prints at most one warning line, in each report tool; `-v` lists every image.
#[test]
fn twenty_stripped_images_make_at_most_one_warning_line() {
    let t = TestDb::new();
    let dir = t.root().parent().expect("tmp").join("libs");
    std::fs::create_dir_all(&dir).expect("mkdir");
    // Two epochs of the same images: dcpidiff and dcpistats compare them.
    let now = SystemTime::now();
    let epochs = [now - Duration::from_secs(3600), now].map(|w| t.epoch_by(w, "alpha"));
    for i in 0..20u32 {
        let src = dir.join(format!("l{i}.c"));
        std::fs::write(&src, format!("int f{i}(int x) {{ return x * {i} + 1; }}\n")).expect("c");
        let full = dir.join(format!("libfull{i}.so"));
        let o = Command::new("cc")
            .args(["-O1", "-shared", "-fPIC", "-nostdlib", "-Wl,--build-id", "-o"])
            .arg(&full)
            .arg(&src)
            .output();
        match o {
            Ok(o) if o.status.success() => {}
            other => dcpi_testkit::skip!("no C compiler to build test libraries: {other:?}"),
        }
        let lib = dir.join(format!("libstripped{i}.so.1"));
        // Stripped of both tables: no symbols at all, no debug file anywhere.
        let o = Command::new("strip")
            .arg("--strip-all")
            .arg("-R")
            .arg(".dynsym")
            .arg("-o")
            .arg(&lib)
            .arg(&full)
            .output();
        assert!(o.is_ok_and(|o| o.status.success()), "strip");
        let data = std::fs::read(&lib).expect("read lib");
        let id = {
            use object::Object;
            let f = object::File::parse(&*data).expect("parse");
            ImageId::BuildId(f.build_id().ok().flatten().expect("build-id").to_vec())
        };
        for (n, e) in epochs.iter().enumerate() {
            let hd = t.host(e, "alpha");
            write_profile(
                &hd,
                &id,
                &lib.display().to_string(),
                &[(0x1000 + u64::from(i), 5 + n as u64)],
            );
        }
    }
    let (e1, e2) = (epochs[0].to_string(), epochs[1].to_string());
    let one = "libstripped7.so.1";
    // (tool, arguments, how many images `-v` lists)
    let cases: [(&str, Vec<&str>, u32); 5] = [
        (env!("CARGO_BIN_EXE_dcpiprof"), vec!["--epoch", "all", "--symbols"], 20),
        (env!("CARGO_BIN_EXE_dcpiprof"), vec!["--epoch", "all", "--by", "symbol"], 20),
        (env!("CARGO_BIN_EXE_dcpilist"), vec!["--epoch", "all", "--top", "40"], 20),
        (env!("CARGO_BIN_EXE_dcpidiff"), vec!["--before", &e1, "--after", &e2, "--image", one], 1),
        (env!("CARGO_BIN_EXE_dcpistats"), vec!["--epoch", "all", "--image", one], 1),
    ];
    for (exe, args, listed) in cases {
        let mut args = args;
        args.extend(["--host", "alpha"]);
        let o = tool(exe, &t.root(), &args);
        assert!(o.status.success(), "{exe} {args:?}: {}", stderr(&o));
        let err = stderr(&o);
        let warnings: Vec<&str> = err.lines().filter(|l| l.contains("warning")).collect();
        assert!(warnings.len() <= 1, "{exe} {args:?}: {} warning lines: {err}", warnings.len());
        if listed == 20 {
            assert!(warnings.first().is_some_and(|l| l.contains("20 images")), "{exe}: {err}");
            assert!(stdout(&o).contains("libstripped7.so.1"), "{exe}: {}", stdout(&o));
        }
        args.push("-v");
        let o = tool(exe, &t.root(), &args);
        assert!(o.status.success(), "{exe} {args:?}: {}", stderr(&o));
        let err = stderr(&o);
        let named = (0..20).filter(|i| err.contains(&format!("libstripped{i}.so.1:"))).count();
        assert_eq!(named, listed as usize, "{exe} {args:?}: -v lists each image: {err}");
    }
}

/// Issue 39 item 3: text tables name images by basename; two images that differ only in
/// directory by as much of their paths as tells them apart; two builds of one path with a
/// short build-id. CSV and JSON keep the whole paths. The same in every report tool's table
/// of images (dcpiprof's image and symbol tables, dcpilist --top, dcpidiff's image rows).
#[test]
fn images_print_by_basename_with_directories_and_build_ids_only_where_needed() {
    let t = TestDb::new();
    let now = SystemTime::now();
    let epochs = [now - Duration::from_secs(3600), now].map(|w| t.epoch_by(w, "alpha"));
    for e in &epochs {
        let hd = t.host(e, "alpha");
        write_profile(&hd, &build_id(1), "/srv/releases/v1/app", &[(0x1000, 400)]);
        write_profile(&hd, &build_id(2), "/srv/releases/v2/app", &[(0x1000, 300)]);
        write_profile(&hd, &build_id(3), "/opt/tool", &[(0x1000, 200)]);
        write_profile(&hd, &build_id(4), "/opt/tool", &[(0x1000, 100)]);
        write_profile(&hd, &build_id(5), "/usr/lib/x86_64-linux-gnu/libz.so.1", &[(0x1000, 50)]);
    }
    let want = ["v1/app", "v2/app", "tool (03030303)", "tool (04040404)", "libz.so.1"];
    let (e1, e2) = (epochs[0].to_string(), epochs[1].to_string());
    let cases: [(&str, Vec<&str>, &[&str]); 4] = [
        (env!("CARGO_BIN_EXE_dcpiprof"), vec!["--epoch", "all"], &want),
        (env!("CARGO_BIN_EXE_dcpiprof"), vec!["--epoch", "all", "--symbols"], &want),
        (env!("CARGO_BIN_EXE_dcpilist"), vec!["--epoch", "all", "--top", "20"], &want),
        // dcpidiff has one row per path (builds merged, `(rebuilt)` when they changed).
        (
            env!("CARGO_BIN_EXE_dcpidiff"),
            vec!["--before", &e1, "--after", &e2, "--compare", "samples"],
            &["v1/app", "v2/app", "tool", "libz.so.1"],
        ),
    ];
    for (exe, args, labels) in cases {
        let mut args = args;
        args.extend(["--host", "alpha"]);
        let o = tool(exe, &t.root(), &args);
        assert!(o.status.success(), "{exe} {args:?}: {}", stderr(&o));
        let out = stdout(&o);
        for l in labels {
            assert!(
                out.lines().any(|x| x.contains(&format!("  {l}"))),
                "{exe} {args:?}: no image {l:?}: {out}"
            );
        }
        for path in ["/srv/releases/v1/app", "/opt/tool", "/usr/lib/x86_64-linux-gnu/libz.so.1"] {
            assert!(!out.contains(path), "{exe} {args:?}: the table has the path {path}: {out}");
        }
        args.extend(["--format", "csv"]);
        let o = tool(exe, &t.root(), &args);
        assert!(o.status.success(), "{exe} {args:?}: {}", stderr(&o));
        let csv = stdout(&o);
        for path in ["/srv/releases/v1/app", "/srv/releases/v2/app", "/opt/tool"] {
            assert!(csv.contains(path), "{exe} {args:?}: CSV lacks {path}: {csv}");
        }
    }
}
