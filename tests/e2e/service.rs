//! End-to-end tests: service (status, epochs, crash safety, shared database, control socket
//! robustness).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dcpi_e2e::{bin, require_perf, Daemon, Sandbox};
use profile_format::{Database, EpochId, Profile};

/// Keep one CPU busy while the guard lives, so that there are samples to count.
struct Spin(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>);

fn spin() -> Spin {
    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    let h = std::thread::spawn(move || {
        let mut x = 1u64;
        while !s.load(Ordering::Relaxed) {
            for i in 0..10_000u64 {
                x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
            }
        }
    });
    Spin(stop, Some(h))
}

impl Drop for Spin {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
        if let Some(h) = self.1.take() {
            let _ = h.join();
        }
    }
}

/// Total samples of `host` in `epoch` (every profile, the unknown ones included); every file
/// must be readable.
fn epoch_total(db: &Path, epoch: &EpochId, host: &str) -> u64 {
    let db = Database::open(db).expect("database readable");
    let hd = db.host_dir(epoch, host).expect("host dir");
    if !hd.path.exists() {
        return 0;
    }
    hd.profiles()
        .expect("list profiles")
        .iter()
        .map(|e| {
            Profile::read(&e.path)
                .unwrap_or_else(|err| panic!("unreadable profile: {err}"))
                .header
                .total_samples
        })
        .sum()
}

fn host_total(db: &Path, host: &str) -> u64 {
    let d = Database::open(db).expect("database readable");
    d.epochs().expect("epochs").iter().map(|e| epoch_total(db, e, host)).sum()
}

fn ok_stdout(d: &Daemon, args: &[&str]) -> String {
    let out = d.ctl(args);
    assert!(out.status.success(), "dcpictl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn status_json_has_the_documented_fields() {
    if !require_perf() {
        return;
    }
    let sb = Sandbox::new();
    let mut d = sb.start_daemon("h1", &["-e", "cpu-clock", "--flush-interval", "500ms"]);
    let _busy = spin();
    std::thread::sleep(Duration::from_millis(1200));
    let v = d.status_json();
    for k in [
        "version",
        "pid",
        "host",
        "uptime_s",
        "events",
        "cpus",
        "samples",
        "lost",
        "throttled",
        "unknown",
        "aggregation",
        "epoch",
        "store",
        "condition",
        "daemon",
    ] {
        assert!(v.get(k).is_some(), "status --json lacks {k}: {v}");
    }
    let ev = &v["events"][0];
    assert_eq!(ev["name"], "cpu-clock");
    assert_eq!(ev["source"], "software");
    assert!(ev["period_min"].as_u64().unwrap() <= ev["period_max"].as_u64().unwrap());
    assert!(v["cpus"].as_array().unwrap().iter().all(|c| c["online"] == true), "{v}");
    assert!(v["samples"].as_u64().unwrap() > 0);
    assert!(v["unknown"]["fraction"].as_f64().is_some());
    assert!(v["daemon"]["rss_kib"].as_u64().unwrap() > 0);
    assert!(v["store"]["last_flush"].is_object(), "{v}");
    assert_eq!(v["condition"], "ok");
    assert_eq!(v["host"], "h1");
    // The human form names the same things.
    let text = ok_stdout(&d, &["status"]);
    assert!(text.contains("cpu-clock") && text.contains("epoch"), "{text}");
    let (st, err) = d.terminate();
    assert!(st.success(), "{err}");
}

#[test]
fn epoch_new_separates_data() {
    if !require_perf() {
        return;
    }
    let sb = Sandbox::new();
    let mut d = sb.start_daemon("h1", &["-e", "cpu-clock", "--flush-interval", "500ms"]);
    let _busy = spin();
    let e1 = EpochId::parse(&ok_stdout(&d, &["epoch", "show"])).expect("epoch id");
    std::thread::sleep(Duration::from_millis(1500));
    let e2 = EpochId::parse(&ok_stdout(&d, &["epoch", "new"])).expect("new epoch id");
    assert!(e2 > e1);
    assert_eq!(ok_stdout(&d, &["epoch", "show"]), e2.to_string());
    let old = epoch_total(&sb.db(), &e1, "h1");
    assert!(old > 0, "the closed epoch holds what came before");
    std::thread::sleep(Duration::from_millis(1500));
    ok_stdout(&d, &["flush"]);
    let (st, err) = d.terminate();
    assert!(st.success(), "{err}");
    assert_eq!(epoch_total(&sb.db(), &e1, "h1"), old, "nothing added to the closed epoch");
    assert!(epoch_total(&sb.db(), &e2, "h1") > 0, "new data lands in the new epoch");
}

#[test]
fn kill9_loses_at_most_a_few_seconds_and_restart_merges_once() {
    if !require_perf() {
        return;
    }
    let sb = Sandbox::new();
    let args = ["-e", "cpu-clock", "--flush-interval", "1s", "--publish-interval", "3s"];
    let _busy = spin();
    let mut seen_at_kill = 0u64;
    let mut slack_low = 0u64;
    let mut slack_high = 0u64;
    // Pseudo-random kill instants, different on every run.
    let mut r = (std::process::id() as u64).wrapping_mul(2654435761)
        ^ Instant::now().elapsed().as_nanos() as u64;
    for _ in 0..3 {
        let mut d = sb.start_daemon("h1", &args);
        r = r.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        std::thread::sleep(Duration::from_millis(1500 + (r >> 33) % 2000));
        let v = d.status_json();
        d.kill9();
        let n = v["samples"].as_u64().unwrap();
        let rate = n as f64 / v["uptime_s"].as_f64().unwrap().max(0.1);
        seen_at_kill += n;
        // At most flush interval + drain + publish path: target <= 5 s of samples.
        slack_low += (rate * 5.0) as u64;
        // Samples taken between the status request and the kill.
        slack_high += (rate * 0.5) as u64 + 100;
        // The database is readable at any instant.
        host_total(&sb.db(), "h1");
    }
    let mut d = sb.start_daemon("h1", &args);
    std::thread::sleep(Duration::from_millis(500));
    ok_stdout(&d, &["flush"]);
    let last = d.status_json()["samples"].as_u64().unwrap();
    let (st, err) = d.terminate();
    assert!(st.success(), "{err}");
    let total = host_total(&sb.db(), "h1");
    let low = seen_at_kill.saturating_sub(slack_low);
    let high = seen_at_kill + slack_high + last + last / 2 + 500;
    assert!(
        total >= low,
        "lost too much: {total} published, {seen_at_kill} seen before the kills (low bound {low})"
    );
    assert!(total <= high, "counted twice? {total} published, at most {high} expected");
}

fn start_other(sb: &Sandbox, host: &str) -> (Daemon, std::path::PathBuf) {
    let sock = sb.dir.path().join(format!("{host}.sock"));
    let spool = sb.dir.path().join(format!("{host}-spool.sqlite"));
    let child = Command::new(bin("dcpid"))
        .args(["--config", "none", "--db"])
        .arg(sb.db())
        .arg("--spool")
        .arg(&spool)
        .arg("--socket")
        .arg(&sock)
        .args(["--host", host, "-e", "cpu-clock", "--flush-interval", "500ms"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dcpid");
    let d = Daemon { child: Some(child), socket: sock.clone() };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(sock.exists() && d.ctl(&["status"]).status.success()) {
        assert!(Instant::now() < deadline, "second dcpid not ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    (d, sock)
}

#[test]
fn second_host_on_shared_db_follows_new_epoch() {
    if !require_perf() {
        return;
    }
    let sb = Sandbox::new();
    let mut a = sb.start_daemon("hosta", &["-e", "cpu-clock", "--flush-interval", "500ms"]);
    let (mut b, _) = start_other(&sb, "hostb");
    let _busy = spin();
    std::thread::sleep(Duration::from_millis(800));
    let e1 = EpochId::parse(&ok_stdout(&b, &["epoch", "show"])).unwrap();
    let e2 = EpochId::parse(&ok_stdout(&a, &["epoch", "new"])).unwrap();
    assert!(e2 > e1);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if ok_stdout(&b, &["epoch", "show"]) == e2.to_string() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "hostb did not pick up epoch {e2} within its flush interval"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(700));
    ok_stdout(&b, &["flush"]);
    ok_stdout(&a, &["flush"]);
    assert!(b.terminate().0.success());
    assert!(a.terminate().0.success());
    let db = Database::open(&sb.db()).unwrap();
    for e in [&e1, &e2] {
        let hosts = db.hosts(e).unwrap();
        assert!(
            hosts.contains(&"hosta".to_string()) && hosts.contains(&"hostb".to_string()),
            "{e}: {hosts:?}"
        );
    }
    assert!(epoch_total(&sb.db(), &e1, "hostb") > 0);
    assert!(epoch_total(&sb.db(), &e2, "hostb") > 0);
}

#[test]
fn bad_control_clients_do_not_stall_sampling() {
    if !require_perf() {
        return;
    }
    let sb = Sandbox::new();
    let d = sb.start_daemon("h1", &["-e", "cpu-clock", "--flush-interval", "500ms"]);
    let _busy = spin();
    let before = d.status_json()["samples"].as_u64().unwrap();
    let sock = sb.socket();
    // Slow clients that never finish their line, a huge one, malformed ones.
    let mut slow = Vec::new();
    for _ in 0..8 {
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        s.write_all(b"{\"cmd\":").unwrap();
        slow.push(s);
    }
    let huge_sock = sock.clone();
    let huge = std::thread::spawn(move || {
        if let Ok(mut s) = std::os::unix::net::UnixStream::connect(&huge_sock) {
            let chunk = vec![b'x'; 64 * 1024];
            for _ in 0..64 {
                if s.write_all(&chunk).is_err() {
                    break;
                }
            }
        }
    });
    for junk in [&b"\n"[..], b"{\"cmd\":\"shutdown\"}\n", b"\xff\xfe\n", b"[1,2,3]\n"] {
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        s.write_all(junk).unwrap();
    }
    let t = Instant::now();
    let v = d.status_json();
    assert!(t.elapsed() < Duration::from_secs(3), "status took {:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(1500));
    let after = d.status_json();
    assert!(
        after["samples"].as_u64().unwrap() > v["samples"].as_u64().unwrap().max(before),
        "sampling continued"
    );
    assert!(after["cpus"].as_array().unwrap().iter().all(|c| c["online"] == true));
    let _ = huge.join();
    drop(slow);
    let out = d.ctl(&["flush"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn bad_arguments_and_config_are_named() {
    let out = dcpi_e2e::run("dcpid", &["--config", "/nonexistent/dcpid.toml", "--probe"]);
    // --probe does not read the configuration; a run does.
    let _ = out;
    let out = dcpi_e2e::run("dcpid", &["--config", "/nonexistent/dcpid.toml", "--duration", "1s"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/dcpid.toml"));
    let out = dcpi_e2e::run("dcpid", &["--flush-interval", "soon"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--flush-interval"));
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("d.toml");
    std::fs::write(&cfg, "ring_pages = 3\n").unwrap();
    let out = dcpi_e2e::run("dcpid", &["--config", cfg.to_str().unwrap(), "--duration", "1s"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ring_pages") && err.contains("d.toml"), "{err}");
    let out = dcpi_e2e::run("dcpictl", &["--socket", "/nonexistent/x.sock", "status"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/x.sock"));
}

#[test]
fn host_summary_records_events_cpus_and_counter_times() {
    if !require_perf() {
        return;
    }
    let sb = Sandbox::new();
    let mut d =
        sb.start_daemon("hs", &["-e", "cpu-clock,page-faults", "--flush-interval", "500ms"]);
    let _busy = spin();
    std::thread::sleep(Duration::from_millis(2000));
    ok_stdout(&d, &["flush"]);
    let (st, err) = d.terminate();
    assert!(st.success(), "{err}");
    let db = Database::open(&sb.db()).expect("database");
    let epoch = db.current_epoch().expect("epochs").expect("an epoch");
    let hd = db.host_dir(&epoch, "hs").expect("host dir");
    let s = profile_format::HostSummary::read(&hd.summary_path()).expect("summary.json");
    assert_eq!(s.host, "hs");
    assert!(!s.cpus.is_empty(), "summary names the CPUs");
    assert!(!s.kernel_release.is_empty());
    let mut names: Vec<&str> =
        s.events.iter().filter_map(|e| e.desc.as_ref()).map(|d| d.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["cpu-clock", "page-faults"]);
    let clock = s
        .events
        .iter()
        .find(|e| e.desc.as_ref().is_some_and(|d| d.name == "cpu-clock"))
        .expect("cpu-clock in summary");
    assert_eq!(clock.source, "software");
    assert!(clock.samples > 0 && clock.total_period >= clock.samples);
    // Counters were enabled for about the run's length on every CPU; running <= enabled.
    assert!(
        clock.time_enabled_ns >= 1_000_000_000,
        "time_enabled_ns {} too small for a 2 s run",
        clock.time_enabled_ns
    );
    assert!(clock.time_running_ns > 0 && clock.time_running_ns <= clock.time_enabled_ns);
    assert_eq!(s.samples, epoch_total(&sb.db(), &epoch, "hs"), "summary agrees with profiles");
}
