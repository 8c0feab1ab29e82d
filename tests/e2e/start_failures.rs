//! End-to-end tests: a start that cannot work fails clearly (exit 2, naming the path) and
//! leaves nothing behind; a `--duration` run that could not publish does not exit 0.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dcpi_e2e::{bin, Sandbox};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Sandbox arguments with `key` (e.g. `--spool`) set to `value`.
fn args_with(sb: &Sandbox, host: &str, key: &str, value: &Path) -> Vec<String> {
    let mut a = sb.daemon_args(host);
    let i = a.iter().position(|x| x == key).expect("key in daemon_args");
    a[i + 1] = value.display().to_string();
    a.extend(["-e".into(), "cpu-clock".into(), "--duration".into(), "5".into()]);
    a
}

fn dcpid(args: &[String]) -> Output {
    Command::new(bin("dcpid")).args(args).output().expect("run dcpid")
}

/// Exit 2, one `dcpid:` message that contains every needle.
fn assert_exit_2(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    let msg: Vec<&str> = err.lines().filter(|l| l.starts_with("dcpid:")).collect();
    assert_eq!(msg.len(), 1, "one message: {err}");
    for n in needles {
        assert!(msg[0].contains(n), "message lacks {n:?}: {err}");
    }
}

/// Every path under `dir`, sorted (to compare before and after a failed start).
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(p.clone());
            }
            out.push(p.display().to_string());
        }
    }
    out.sort();
    out
}

#[test]
fn unusable_spool_exits_2_naming_it() {
    let sb = Sandbox::new();
    let before = tree(sb.dir.path());
    let out = dcpid(&args_with(&sb, "sp", "--spool", Path::new("/proc/dcpi-spool")));
    assert_exit_2(&out, &["spool /proc/dcpi-spool", "cannot create"]);
    assert_eq!(tree(sb.dir.path()), before, "a failed start left something behind");
    assert!(!sb.db().exists());
}

#[test]
fn read_only_spool_directory_exits_2_naming_it() {
    // Root writes into a 0555 directory anyway: run dcpid as `nobody` then.
    let setpriv = Command::new("setpriv").arg("--version").stdout(Stdio::null()).status();
    if is_root() && setpriv.is_err() {
        dcpi_testkit::skip!("as root, needs setpriv to run dcpid as an unprivileged user");
    }
    let dir = tempfile::Builder::new().prefix("dcpi-ro").tempdir().unwrap();
    let root = dir.path();
    let perm = |p: &Path, m: u32| {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(m)).unwrap()
    };
    perm(root, 0o777);
    let ro = root.join("ro");
    std::fs::create_dir(&ro).unwrap();
    perm(&ro, 0o555);
    let exe = root.join("dcpid");
    std::fs::copy(bin("dcpid"), &exe).unwrap();
    let spool = ro.join("spool");
    let mut cmd = if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    let out = cmd
        .args(["--config", "none", "--host", "ro", "-e", "cpu-clock", "--duration", "5"])
        .arg("--db")
        .arg(root.join("db"))
        .arg("--spool")
        .arg(&spool)
        .arg("--socket")
        .arg(root.join("d.sock"))
        .output()
        .unwrap();
    let shown = spool.display().to_string();
    assert_exit_2(&out, &[&shown, "Permission denied"]);
    assert!(!spool.exists() && !root.join("db").exists());
    // The same with an existing but read-only spool directory.
    perm(&ro, 0o777);
    std::fs::create_dir(&spool).unwrap();
    perm(&spool, 0o555);
    let out = if is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"]).arg(&exe);
        c
    } else {
        Command::new(&exe)
    }
    .args(["--config", "none", "--host", "ro", "-e", "cpu-clock", "--duration", "5"])
    .arg("--db")
    .arg(root.join("db"))
    .arg("--spool")
    .arg(&spool)
    .arg("--socket")
    .arg(root.join("d.sock"))
    .output()
    .unwrap();
    assert_exit_2(&out, &[&shown, "cannot write"]);
    assert_eq!(std::fs::read_dir(&spool).unwrap().count(), 0);
}

#[test]
fn failed_start_leaves_no_directories_behind() {
    let sb = Sandbox::new();
    let plain = sb.dir.path().join("plain-file");
    std::fs::write(&plain, b"x").unwrap();
    let before = tree(sb.dir.path());
    // A socket whose directory does not exist: an error, and neither it nor the spool's new
    // directories are created.
    let mut a = args_with(&sb, "nd", "--socket", &sb.dir.path().join("run/dcpi/d.sock"));
    let i = a.iter().position(|x| x == "--spool").unwrap();
    a[i + 1] = sb.dir.path().join("state/dcpid/spool").display().to_string();
    assert_exit_2(&dcpid(&a), &["run/dcpi", "does not exist"]);
    assert_eq!(tree(sb.dir.path()), before, "a failed start left something behind");
    // A database that can never be written (under a regular file): the spool's directories
    // created before the check are removed again.
    let mut a = args_with(&sb, "nd", "--db", &plain.join("db"));
    a[i + 1] = sb.dir.path().join("state/dcpid/spool").display().to_string();
    let out = dcpid(&a);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    if dcpi_testkit::has(&dcpi_testkit::Req::Perf) {
        // (Without perf the start fails earlier, for that reason; nothing is left either way.)
        assert_exit_2(&out, &["plain-file/db", "not writable"]);
    }
    assert_eq!(tree(sb.dir.path()), before, "a failed start left something behind");
}

#[test]
fn socket_path_naming_a_regular_file_is_kept() {
    let sb = Sandbox::new();
    let file = sb.dir.path().join("notes.txt");
    std::fs::write(&file, b"my notes").unwrap();
    assert_exit_2(
        &dcpid(&args_with(&sb, "rf", "--socket", &file)),
        &["notes.txt", "a regular file", "only ever replaces a socket"],
    );
    assert_eq!(std::fs::read(&file).unwrap(), b"my notes", "dcpid deleted the file");
    assert!(!sb.spool().exists() && !sb.db().exists());
}

#[dcpi_testkit::test(perf)]
fn duration_run_that_cannot_publish_exits_non_zero() {
    let sb = Sandbox::new();
    let mut a = sb.daemon_args("np");
    a.extend(["-e".into(), "cpu-clock".into(), "--duration".into(), "10".into()]);
    let mut child = Command::new(bin("dcpid"))
        .args(&a)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dcpid");
    // Once it runs, the database becomes unusable: a regular file takes its place.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sb.socket().exists() {
        assert!(Instant::now() < deadline, "dcpid did not start in 60 s");
        assert!(child.try_wait().unwrap().is_none(), "dcpid exited early");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::remove_dir_all(sb.db()).unwrap();
    std::fs::write(sb.db(), b"not a database").unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a run that published nothing exited 0: {err}");
    assert_eq!(out.status.code(), Some(1), "{err}");
    let last = err.lines().filter(|l| l.starts_with("dcpid:")).collect::<Vec<_>>();
    assert_eq!(last.len(), 1, "{err}");
    assert!(last[0].contains("could not publish") && last[0].contains("spool"), "{err}");
}

/// `/proc/PID/stat`'s state letter, `None` once the process is gone.
fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// Issue 35, defect 6. A second dcpid for a host name a live one holds exits 2 naming the
/// lease, before any thread starts: no false "daemon thread died" (before the fix it logged
/// `ERROR daemon thread died ... dcpi-resolve`). Then the first one is killed (-9) and NOT
/// reaped (as under a stopped supervisor or a container's PID 1 that does not reap): a zombie
/// with its /proc entry and start time. The next dcpid takes the lease over and runs (before
/// the fix it was refused with exit 2 for as long as the zombie lived).
#[dcpi_testkit::test(perf)]
fn refused_start_reports_no_thread_death_and_a_zombie_loses_its_lease() {
    let sb = Sandbox::new();
    let host = "e2e-zombie";
    let mut first = sb.start_daemon(host, &["-e", "cpu-clock"]);
    let second_sock = sb.dir.path().join("second.sock");
    let mut args = args_with(&sb, host, "--socket", &second_sock);
    // No --duration: the second one runs until stopped.
    args.truncate(args.len() - 2);

    // Several times: before the fix the false alarm raced with the process's exit (it was
    // logged in about 8 starts out of 10 here).
    for _ in 0..5 {
        let out = dcpid(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("lease") && err.contains(host), "{err}");
        assert!(!err.contains("thread died") && !err.contains("ERROR"), "false alarm: {err}");
    }

    // kill -9, no wait(): a zombie.
    let child = first.child.take().expect("running");
    let pid = child.id();
    // SAFETY: kill(2) on our own child, not reaped yet.
    assert_eq!(unsafe { libc::kill(pid.cast_signed(), libc::SIGKILL) }, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while proc_state(pid) != Some('Z') {
        assert!(Instant::now() < deadline, "pid {pid} never became a zombie");
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut second = Command::new(bin("dcpid"))
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dcpid");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = second.try_wait().expect("try_wait") {
            let out = second.wait_with_output().expect("output");
            panic!(
                "the successor exited with {st} while the old owner was a zombie: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let ok = Command::new(bin("dcpictl"))
            .arg("--socket")
            .arg(&second_sock)
            .arg("status")
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "the successor did not become ready in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(second.id().cast_signed(), libc::SIGTERM) };
    let out = second.wait_with_output().expect("wait");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("zombie"), "the takeover names why: {err}");
    drop(child); // reaped by nobody until now: let the zombie go
                 // SAFETY: waitpid on our own child.
    unsafe { libc::waitpid(pid.cast_signed(), std::ptr::null_mut(), 0) };
}
