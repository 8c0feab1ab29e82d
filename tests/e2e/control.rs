//! The control socket under a connection flood (issue 35, defect 7): a client holding more
//! connections than there are places competes only with itself; `dcpictl status` from another
//! process is always answered, and idle connections are closed after the read timeout.

use std::io::{BufRead, BufReader, ErrorKind, Read};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dcpi_e2e::{bin, Sandbox};

/// Uid and gid of `nobody` / `nogroup` on Debian.
const NOBODY: u32 = 65534;

/// Drop this thread (only this one: the raw syscalls, unlike glibc's wrappers, change the
/// calling thread's credentials) to `nobody:nogroup`; the socket records the credentials of
/// the thread that connects.
fn thread_become_nobody() {
    // SAFETY: setresgid/setresuid with valid ids; they affect only the calling thread.
    unsafe {
        assert_eq!(libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()), 0);
        assert_eq!(libc::syscall(libc::SYS_setresgid, NOBODY, NOBODY, NOBODY), 0, "setresgid");
        assert_eq!(libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, NOBODY), 0, "setresuid");
    }
}

/// Keep `n` connections to `socket` open that never send anything: a connection the daemon
/// answers or closes is replaced at once (a flood, as a hostile client would do it), until
/// `stop`. Counts in `turned_away` the connections the daemon answered or closed.
fn flood(
    socket: PathBuf,
    n: usize,
    as_nobody: bool,
    stop: Arc<AtomicBool>,
    turned_away: Arc<AtomicUsize>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        if as_nobody {
            thread_become_nobody();
        }
        let mut conns: Vec<UnixStream> = Vec::new();
        while !stop.load(Ordering::Acquire) {
            while conns.len() < n {
                match UnixStream::connect(&socket) {
                    Ok(s) => {
                        s.set_nonblocking(true).expect("nonblocking");
                        conns.push(s);
                    }
                    // E.g. EMFILE under a 1024-descriptor limit: the two floods still hold
                    // more than the 512 places.
                    Err(_) => break,
                }
            }
            // Anything readable (an error line, an end of file) means the daemon is done with
            // that connection: drop it, to open another.
            let mut buf = [0u8; 512];
            let before = conns.len();
            conns.retain(
                |mut s| matches!(s.read(&mut buf), Err(e) if e.kind() == ErrorKind::WouldBlock),
            );
            turned_away.fetch_add(before - conns.len(), Ordering::AcqRel);
            std::thread::sleep(Duration::from_millis(5));
        }
    })
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// 600 connections from this (root) process and 600 from a `nobody` thread, kept open: five
/// `dcpictl status` (other processes, root like the first flood) are all answered. Before the
/// fix the flood took all 512 places and all five got "too many open connections" (or a broken
/// pipe: dcpictl was answered and cut off before it could send its request).
/// (Needs root: to flood as root and as nobody.)
#[dcpi_testkit::test(perf, root)]
fn status_is_answered_through_a_connection_flood() {
    let sb = Sandbox::new();
    // nobody reaches the socket: its directory searchable, the socket's group nogroup.
    std::fs::set_permissions(sb.socket().parent().expect("dir"), {
        use std::os::unix::fs::PermissionsExt;
        std::fs::Permissions::from_mode(0o755)
    })
    .expect("chmod sandbox");
    let d = sb.start_daemon("h1", &["-e", "cpu-clock", "--socket-group", "nogroup"]);
    let stop = Arc::new(AtomicBool::new(false));
    let root_away = Arc::new(AtomicUsize::new(0));
    let nobody_away = Arc::new(AtomicUsize::new(0));
    let floods = [
        flood(sb.socket(), 600, false, Arc::clone(&stop), Arc::clone(&root_away)),
        flood(sb.socket(), 600, true, Arc::clone(&stop), Arc::clone(&nobody_away)),
    ];
    // Both floods fill the daemon: 1200 connections for 512 places, so it has turned some of
    // each away (and they keep coming back).
    wait_for("the daemon to turn away connections of both floods", || {
        root_away.load(Ordering::Acquire) > 0 && nobody_away.load(Ordering::Acquire) > 0
    });
    let mut answered = 0;
    let mut errors = Vec::new();
    for _ in 0..5 {
        let out = d.ctl(&["status", "--json"]);
        if out.status.success() {
            answered += 1;
        } else {
            errors.push(String::from_utf8_lossy(&out.stderr).into_owned());
        }
    }
    stop.store(true, Ordering::Release);
    for f in floods {
        f.join().expect("flood thread");
    }
    assert_eq!(answered, 5, "status calls answered through the flood; errors: {errors:?}");
}

/// A connection that sends nothing is answered with an error and closed after the read
/// timeout (2 s; generous deadline here), so idle clients do not hold places.
#[dcpi_testkit::test(perf)]
fn idle_connections_are_closed_after_the_read_timeout() {
    let sb = Sandbox::new();
    let _d = sb.start_daemon("h1", &["-e", "cpu-clock"]);
    let idle: Vec<UnixStream> =
        (0..20).map(|_| UnixStream::connect(sb.socket()).expect("connect")).collect();
    for s in &idle {
        s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
        let mut line = String::new();
        let mut r = BufReader::new(s);
        r.read_line(&mut line).expect("an answer before the 60 s deadline");
        assert!(line.contains("not received within"), "{line}");
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).expect("closed after the answer");
        assert!(rest.is_empty(), "{rest:?}");
    }
}

/// A user refused by the socket's permissions is told which group to join: the socket's own
/// group (dcpid's `--socket-group`), not always `dcpi` (issue 35).
/// (Needs root: to run dcpictl as nobody and to give the socket a group.)
#[dcpi_testkit::test(root)]
fn permission_denied_names_the_socket_group() {
    use std::os::unix::fs::PermissionsExt;
    let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"].into_iter().find(|p| Path::new(p).exists());
    let Some(setpriv) = setpriv else {
        dcpi_testkit::skip!("setpriv (util-linux) is not installed");
    };
    // gid 1 (`daemon` on Debian), which nobody is not in, named as /etc/group names it.
    let groups = std::fs::read_to_string("/etc/group").expect("read /etc/group");
    let Some(group) = groups.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 4 && f[2] == "1" && f[3].is_empty()).then(|| f[0].to_owned())
    }) else {
        dcpi_testkit::skip!("no group with gid 1 and no members in /etc/group");
    };
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let socket = dir.path().join("dcpid.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o660)).expect("chmod");
    std::os::unix::fs::chown(&socket, Some(0), Some(1)).expect("chown");
    let out = std::process::Command::new(setpriv)
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(bin("dcpictl"))
        .arg("--socket")
        .arg(&socket)
        .arg("status")
        .output()
        .expect("run dcpictl as nobody");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("permission denied"), "{err}");
    assert!(err.contains(&format!("group `{group}`")), "the socket's group is not named: {err}");
    assert!(!err.contains("`dcpi`"), "names the default group, not the socket's: {err}");
}
