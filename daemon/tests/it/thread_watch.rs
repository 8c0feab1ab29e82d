//! A daemon thread that dies is noticed: status turns `degraded` naming the thread and the
//! reason, the systemd watchdog is no longer fed (STATUS= still is), and the exit status is 3.
//! Faults are injected through `Hooks::faults` (a test-only trait; no setting reaches it).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dcpid::config::Settings;
use dcpid::notify::Notifier;
use dcpid::service::{run, Hooks};
use dcpid::watch::FaultInjector;

/// Panics once in the thread named by `target`, the next time that thread passes its fault
/// point.
#[derive(Default)]
struct PanicOnce {
    target: Mutex<Option<String>>,
}

impl PanicOnce {
    fn arm(&self, thread: &str) {
        *self.target.lock().unwrap() = Some(thread.to_string());
    }
}

impl FaultInjector for PanicOnce {
    fn at(&self, thread: &str) {
        let hit = {
            let mut t = self.target.lock().unwrap();
            if t.as_deref() == Some(thread) {
                t.take()
            } else {
                None
            }
        };
        if hit.is_some() {
            panic!("injected fault in {thread}");
        }
    }
}

fn status(socket: &Path) -> Option<serde_json::Value> {
    let mut s = UnixStream::connect(socket).ok()?;
    s.write_all(b"{\"cmd\":\"status\"}\n").ok()?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).ok()?;
    let v: serde_json::Value = serde_json::from_str(&line).ok()?;
    v.get("result").cloned()
}

/// Every datagram received on the notify socket, in order, collected by a thread.
fn collect(sock: UnixDatagram) -> Arc<Mutex<Vec<String>>> {
    let out = Arc::new(Mutex::new(Vec::new()));
    let o = Arc::clone(&out);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = sock.recv(&mut buf) {
            o.lock().unwrap().push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    });
    out
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "timed out after 60 s waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[dcpi_testkit::test(perf)]
fn a_dead_thread_degrades_status_stops_the_watchdog_and_sets_the_exit_status() {
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let seen = collect(notify);
    // What systemd would put in the environment, given to this daemon only.
    let notify_var = notify_path.clone().into_os_string();
    let notifier = Notifier::from_lookup(
        |name| match name {
            "NOTIFY_SOCKET" => Some(notify_var.clone()),
            "WATCHDOG_USEC" => Some("400000".into()),
            _ => None,
        },
        std::process::id(),
    );

    let mut s = Settings::defaults();
    s.db = dir.path().join("db");
    s.spool = dir.path().join("spool");
    s.socket = dir.path().join("d.sock");
    s.host = "tw".into();
    s.events = "cpu-clock".into();
    s.socket_group = None;
    s.flush_interval = Duration::from_millis(200);
    s.status_interval = Duration::from_millis(200);
    // A bound in case the test fails before it stops the daemon.
    s.duration = Some(Duration::from_secs(300));
    let socket = s.socket.clone();
    let faults = Arc::new(PanicOnce::default());
    let hooks = Hooks {
        faults: Some(Arc::<PanicOnce>::clone(&faults)),
        notifier: Some(notifier),
        ..Hooks::default()
    };
    let daemon = std::thread::spawn(move || run(s, hooks));

    // Healthy: READY=1, then watchdog pings.
    wait_until("READY=1 and two WATCHDOG=1", || {
        let seen = seen.lock().unwrap();
        seen.iter().any(|m| m.contains("READY=1"))
            && seen.iter().filter(|m| m.contains("WATCHDOG=1")).count() >= 2
    });
    let st = status(&socket).expect("status answers");
    assert_eq!(st["state"], "ok", "{st}");
    assert_eq!(st["failed_threads"].as_array().map(Vec::len), Some(0));

    // The flush thread panics.
    faults.arm("dcpid-flush");
    let mut st = serde_json::Value::Null;
    wait_until("status to say degraded", || {
        st = status(&socket).unwrap_or_default();
        st["state"] == "degraded"
    });
    let failed = st["failed_threads"].as_array().unwrap();
    assert_eq!(failed.len(), 1, "{st}");
    assert_eq!(failed[0]["thread"], "dcpid-flush");
    assert_eq!(failed[0]["reason"], "panicked: injected fault in dcpid-flush");
    let cond = st["condition"].as_str().unwrap();
    assert!(cond.starts_with("degraded: thread dcpid-flush panicked"), "{cond}");

    // The main loop goes on (STATUS= every 200 ms) but sends no WATCHDOG=1 after its first
    // degraded STATUS= (it checks the watch after sending STATUS=, in the same iteration).
    let degraded_status = |m: &String| m.contains("STATUS=") && m.contains("degraded");
    wait_until("five degraded STATUS= lines", || {
        seen.lock().unwrap().iter().filter(|m| degraded_status(m)).count() >= 5
    });
    let all = seen.lock().unwrap().clone();
    let first = all.iter().position(degraded_status).unwrap();
    let pings = all[first..].iter().filter(|m| m.contains("WATCHDOG=1")).count();
    assert_eq!(pings, 0, "watchdog pings after the flush thread died: {:?}", &all[first..]);

    // A drain thread too: it is named, and sampling goes on for the others.
    faults.arm("dcpi-drain-0");
    wait_until("the drain thread's failure in status", || {
        status(&socket).is_some_and(|v| {
            v["failed_threads"].as_array().is_some_and(|f| {
                f.iter().any(|t| {
                    t["thread"] == "dcpi-drain-0"
                        && t["reason"] == "panicked: injected fault in dcpi-drain-0"
                })
            })
        })
    });

    // The resolver thread: it only runs when side-band records are due, which a new process
    // (exec, mmap) makes sure of.
    faults.arm("dcpi-resolve");
    wait_until("the resolver thread's failure in status", || {
        drop(std::process::Command::new("true").status());
        status(&socket).is_some_and(|v| {
            v["failed_threads"].as_array().is_some_and(|f| {
                f.iter().any(|t| {
                    t["thread"] == "dcpi-resolve"
                        && t["reason"] == "panicked: injected fault in dcpi-resolve"
                })
            })
        })
    });

    // SIGTERM: the daemon stops, publishes what it has, and the exit status says degraded.
    // SAFETY: kill(2) on our own pid; the daemon's signal thread has a handler for SIGTERM.
    unsafe { libc::kill(std::process::id().cast_signed(), libc::SIGTERM) };
    let r = daemon.join().expect("run does not panic");
    let e = r.expect_err("a degraded daemon does not exit 0");
    assert_eq!(e.exit_code(), 3, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("dcpid-flush") && msg.contains("dcpi-drain-0"), "{msg}");
    assert!(msg.contains("dcpi-resolve"), "{msg}");
}
