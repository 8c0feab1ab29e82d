//! End-to-end tests: service (status, epochs, crash safety, shared database, control socket
//! robustness).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dcpi_e2e::{bin, Daemon, Sandbox};
use dcpi_testkit::spin;
use dcpi_testkit::tmpfs;
use dcpi_testkit::Tmpfs;
use profile_format::{Database, EpochId, Profile};

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

/// The recent rate's window spans a whole flush interval even when slice-boundary flushes come
/// between interval flushes (CI saw a 0.22 s window under a 0.5 s interval, rated 0 samples/s,
/// when a minute boundary fell just after a flush). Here a boundary every second falls between
/// flushes two seconds apart; every window, once the daemon has run one interval, is at least
/// 2 s long.
#[dcpi_testkit::test(perf)]
fn the_recent_rate_spans_a_flush_interval_across_slice_boundaries() {
    let sb = Sandbox::new();
    let d = sb.start_daemon(
        "h1",
        &["-e", "cpu-clock", "--flush-interval", "2s", "--slice-interval", "1s"],
    );
    let _busy = spin();
    // (uptime, window) each time the window changes.
    let mut windows: Vec<(f64, f64)> = Vec::new();
    // Real windows (not the uptime, which status reports before the first whole interval).
    let real = |ws: &[(f64, f64)]| -> Vec<f64> {
        ws.iter().filter(|(u, w)| (u - w).abs() > 0.05).map(|&(_, w)| w).collect()
    };
    wait_for(60, "eight seconds and three windows of flushes", || {
        let v = d.status_json();
        let (u, w) =
            (v["uptime_s"].as_f64().unwrap(), v["rate"]["recent_window_s"].as_f64().unwrap());
        if windows.last().is_none_or(|l| l.1 != w) {
            windows.push((u, w));
        }
        std::thread::sleep(Duration::from_millis(100));
        u > 8.0 && real(&windows).len() >= 3
    });
    // Slice boundaries once a second: the flushes come about a second apart, yet every window
    // reaches back a whole interval (2 s), and no further than the interval, one more boundary
    // and a flush thread held up by a loaded machine.
    let real = real(&windows);
    assert!(real.iter().all(|&w| (2.0..=10.0).contains(&w)), "{windows:?}");
    let v = d.status_json();
    let r = v["rate"]["samples_per_s_recent"].as_f64().unwrap();
    assert!(r > 200.0, "one CPU kept busy at ~1 kHz: {}", v["rate"]);
}

#[dcpi_testkit::test(perf)]
fn status_json_has_the_documented_fields() {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon("h1", &["-e", "cpu-clock", "--flush-interval", "500ms"]);
    let _busy = spin();
    std::thread::sleep(Duration::from_millis(1200));
    // Two flushes give the recent rate its window (the first one may be slow on a busy CI).
    wait_for(10, "two flushes", || {
        let v = d.status_json();
        v["rate"]["recent_window_s"].as_f64() < v["uptime_s"].as_f64().map(|u| u - 0.01)
    });
    let v = d.status_json();
    for k in [
        "rate",
        "overhead",
        "config",
        "last_reload",
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
    // Samples per second: positive, and no more than every CPU sampling at its shortest period.
    let ncpus = v["cpus"].as_array().unwrap().len() as f64;
    let max_rate = ncpus * 1e9 / ev["period_min"].as_f64().unwrap() * 1.2;
    let rate = &v["rate"];
    // The recent rate counts the samples delivered in its window, and drain threads deliver
    // about once a second (the redraw interval): a window can hold up to a second more of
    // samples than its length, and a window shorter than about a second may hold no delivery.
    let w = rate["recent_window_s"].as_f64().unwrap();
    let recent_min = if w < 1.5 { 0.0 } else { 200.0 };
    for (k, min, max) in [
        ("samples_per_s", 200.0, max_rate),
        ("samples_per_s_recent", recent_min, max_rate * (w + 1.0) / w),
    ] {
        let r = rate[k].as_f64().unwrap();
        // One CPU is kept busy at ~1 kHz.
        assert!(r >= min && r <= max && r.is_finite(), "{k} = {r} ({min}..={max}): {rate}");
    }
    let since_start = v["samples"].as_f64().unwrap() / v["uptime_s"].as_f64().unwrap();
    assert!(
        (rate["samples_per_s"].as_f64().unwrap() - since_start).abs() < since_start * 0.5,
        "{rate} vs {since_start}"
    );
    assert!((0.45..5.0).contains(&w), "a flush interval (0.5 s + the flush itself): {rate}");
    let o = &v["overhead"];
    let pct = |k: &str| o[k].as_f64().unwrap_or_else(|| panic!("overhead.{k}: {o}"));
    assert!(pct("daemon_cpu_pct") > 0.0 && pct("daemon_cpu_pct") < 100.0 * ncpus, "{o}");
    assert!(pct("daemon_cpu_pct_recent") >= 0.0, "{o}");
    assert!(pct("sample_cost_us_estimate") >= 1.0 && pct("sample_cost_us_estimate") <= 20.0);
    let expect =
        rate["samples_per_s_recent"].as_f64().unwrap() * pct("sample_cost_us_estimate") / 1e4;
    assert!((pct("sampling_cpu_pct_estimate") - expect).abs() < 1e-6, "{o}");
    assert!(pct("machine_pct_estimate") > 0.0 && pct("machine_pct_estimate") < 100.0, "{o}");
    assert_eq!(o["ncpus"].as_u64().unwrap() as f64, ncpus);
    // Collector cost (#13): the daemon's CPU per second and per sample, and per CPU the drain
    // thread's wake-ups: one re-arm instant per second plus the half-ring watermark (~0.2/s
    // at 1 kHz), where the 64-sample watermark woke a busy CPU ~16 times a second.
    assert!(pct("daemon_cpu_ms_per_s") > 0.0, "{o}");
    // Per sample over the recent window: a window in which no drain thread woke (they wake
    // about once a second; the window is one 0.5 s flush interval) has no samples to divide by.
    if rate["samples_per_s_recent"].as_f64().unwrap() > 0.0 {
        assert!(pct("ns_per_sample") > 0.0, "{o}");
    } else {
        assert!(pct("ns_per_sample") >= 0.0, "{o}");
    }
    for c in v["cpus"].as_array().unwrap() {
        let wps = c["wakeups_per_s"].as_f64().unwrap_or_else(|| panic!("wakeups_per_s: {c}"));
        // The recent window is one flush interval (0.5 s here), shorter than the 1 s redraw
        // window, so it may hold no wake-up at all: only the upper bound is the claim.
        assert!(c["wakeups"].as_u64().unwrap() > 0 && (0.0..=6.0).contains(&wps), "{c}");
        assert!(c["drain_cpu_ms_per_s"].as_f64().unwrap() >= 0.0, "{c}");
    }
    // The resolver thread (dcpi-resolve) applies side-band records for the drain threads,
    // which wake it at most once per pass: never more wake-ups than drain passes (plus one per
    // CPU: the counters are read one after the other).
    let rt = &v["resolver_thread"];
    assert_eq!(rt["running"], true, "{rt}");
    let drain_wakeups: u64 =
        v["cpus"].as_array().unwrap().iter().map(|c| c["wakeups"].as_u64().unwrap()).sum();
    let rt_wakeups = rt["wakeups"].as_u64().unwrap_or_else(|| panic!("resolver_thread: {rt}"));
    assert!(
        rt_wakeups <= drain_wakeups + ncpus as u64,
        "{rt_wakeups} > {drain_wakeups} drain passes: {v}"
    );
    assert!(rt["cpu_ms_per_s"].as_f64().unwrap() >= 0.0, "{rt}");
    assert!(rt["records_applied"].as_u64().is_some(), "{rt}");
    assert!(o["stage_cpu_s"]["resolver_thread"].as_f64().unwrap() >= 0.0, "{o}");
    // Where the time goes (#13): the drain threads' passes parsed and aggregated the samples
    // counted above, and the flush thread's checks ran at each flush. The parts are timed
    // inside passes by the wall clock, the totals by thread CPU clocks: a VM's stolen time
    // can make a part exceed its total, so only the parts' presence is the claim.
    let stage =
        |k: &str| o["stage_cpu_s"][k].as_f64().unwrap_or_else(|| panic!("stage_cpu_s.{k}: {o}"));
    assert!(v["samples"].as_u64().unwrap() > 0, "{v}");
    assert!(stage("drain_parse") > 0.0 && stage("drain_aggregate") > 0.0, "{o}");
    assert!(stage("drain_rearm") >= 0.0 && stage("flush_checks") > 0.0, "{o}");
    // Spool and publish are parts of the store stage, by the same thread's CPU clock.
    assert!(stage("flush_spool") + stage("flush_publish") <= stage("flush_store") + 1e-9, "{o}");
    assert_eq!(v["config"]["flush_interval_s"], 0.5);
    // The human form names the same things.
    let text = ok_stdout(&d, &["status"]);
    assert!(text.contains("cpu-clock") && text.contains("epoch"), "{text}");
    assert!(text.contains("samples/s") && text.contains("overhead"), "{text}");
    assert!(text.contains("WAKEUPS/S") && text.contains("ns per sample"), "{text}");
    let (st, err) = d.terminate();
    assert!(st.success(), "{err}");
}

#[dcpi_testkit::test(perf)]
fn epoch_new_separates_data() {
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

#[dcpi_testkit::test(perf)]
fn kill9_loses_at_most_a_few_seconds_and_restart_merges_once() {
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
        // At most flush interval + drain + publish path: target <= 5 s of samples. A flush
        // thread starved by a loaded machine flushes late (this test failed at load average
        // 10-12 with a fixed 5 s): what it had not flushed into the spool by the kill is
        // lost by design, so the window is the time since its last flush plus a drain pass
        // (read_every, 1.5 s) and the flush's own time, when that is longer than 5 s.
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let since_flush_s = v["store"]["last_flush"]["unix_ms"]
            .as_u64()
            .map_or(0.0, |t| now_ms.saturating_sub(t) as f64 / 1000.0);
        slack_low += (rate * (since_flush_s + 3.0).max(5.0)) as u64;
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
    let deadline = Instant::now() + dcpi_e2e::READY_WITHIN;
    while !(sock.exists() && d.ctl(&["status"]).status.success()) {
        assert!(Instant::now() < deadline, "second dcpid not ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    (d, sock)
}

#[dcpi_testkit::test(perf)]
fn second_host_on_shared_db_follows_new_epoch() {
    let sb = Sandbox::new();
    let mut a = sb.start_daemon("hosta", &["-e", "cpu-clock", "--flush-interval", "500ms"]);
    let (mut b, _) = start_other(&sb, "hostb");
    let _busy = spin();
    std::thread::sleep(Duration::from_millis(800));
    // hostb publishes what it sampled so far into the first epoch: on a loaded machine its
    // first timed flush can come after `epoch new`, and its samples would all be the second's.
    ok_stdout(&b, &["flush"]);
    let e1 = EpochId::parse(&ok_stdout(&b, &["epoch", "show"])).unwrap();
    let e2 = EpochId::parse(&ok_stdout(&a, &["epoch", "new"])).unwrap();
    assert!(e2 > e1);
    // hostb follows at its next flush (500 ms); on a loaded machine that flush can be seconds
    // late (it failed at 5 s at load 7), so the deadline is generous: what is tested is that
    // hostb follows without being told, not how fast a starved thread runs.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if ok_stdout(&b, &["epoch", "show"]) == e2.to_string() {
            break;
        }
        assert!(Instant::now() < deadline, "hostb did not pick up epoch {e2} within 60 s");
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

#[dcpi_testkit::test(perf)]
fn bad_control_clients_do_not_stall_sampling() {
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
    drop(huge.join());
    drop(slow);
    let out = d.ctl(&["flush"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn bad_arguments_and_config_are_named() {
    let out = dcpi_e2e::run("dcpid", &["--config", "/nonexistent/dcpid.toml", "--probe"]);
    // --probe does not read the configuration; a run does.
    drop(out);
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

#[dcpi_testkit::test(perf)]
fn host_summary_records_events_cpus_and_counter_times() {
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

/// Spawn dcpid with exactly `args` and wait until `socket` answers.
fn spawn_ready(args: &[String], socket: &Path) -> Daemon {
    let child = Command::new(bin("dcpid"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dcpid");
    let mut d = Daemon { child: Some(child), socket: socket.to_path_buf() };
    let deadline = Instant::now() + dcpi_e2e::READY_WITHIN;
    loop {
        if let Some(st) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            let mut err = String::new();
            if let Some(e) = d.child.as_mut().and_then(|c| c.stderr.as_mut()) {
                drop(std::io::Read::read_to_string(e, &mut err));
            }
            panic!("dcpid exited early with {st}: {err}");
        }
        if socket.exists() && d.ctl(&["status"]).status.success() {
            return d;
        }
        assert!(
            Instant::now() < deadline,
            "dcpid did not become ready in {:?}",
            dcpi_e2e::READY_WITHIN
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Wait until `f` holds (polling every 50 ms), at most `secs`.
fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn write_config(path: &Path, sb: &Sandbox, extra: &str) {
    let text = format!(
        "db = {:?}\nspool = {:?}\nsocket = {:?}\nhost = \"rl\"\nevents = \"cpu-clock\"\n{extra}",
        sb.db().display().to_string(),
        sb.spool().display().to_string(),
        sb.socket().display().to_string()
    );
    std::fs::write(path, text).expect("write config");
}

#[dcpi_testkit::test(perf)]
fn reload_applies_live_settings_and_survives_a_bad_file() {
    let sb = Sandbox::new();
    let cfg = sb.dir.path().join("dcpid.toml");
    write_config(&cfg, &sb, "flush_interval = \"2s\"\nretention_days = 7\n");
    let args: Vec<String> = vec!["--config".into(), cfg.display().to_string()];
    let mut d = spawn_ready(&args, &sb.socket());
    let v = d.status_json();
    assert_eq!(v["config"]["flush_interval_s"], 2.0, "{}", v["config"]);
    assert_eq!(v["config"]["retention_days"], 7);
    assert!(v["last_reload"].is_null());

    // dcpictl reload: live settings change, the flush thread follows the new interval.
    write_config(&cfg, &sb, "flush_interval = \"300ms\"\nretention_days = 3\n");
    let out = d.ctl(&["reload"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("flush_interval") && said.contains("retention_days"), "{said}");
    let v = d.status_json();
    assert_eq!(v["config"]["flush_interval_s"], 0.3, "{}", v["config"]);
    assert_eq!(v["config"]["retention_days"], 3);
    assert_eq!(v["last_reload"]["trigger"], "dcpictl");
    assert_eq!(v["last_reload"]["ok"], true);
    // The flushes' spacing shows the interval in force: the closest two seen must be well under
    // the old 2 s. Observed by polling (a status call can take a second on a loaded machine),
    // so gather several, within a generous deadline, and judge by the closest pair.
    let mut flushes = std::collections::BTreeSet::new();
    let t = Instant::now();
    while flushes.len() < 6 && t.elapsed() < Duration::from_secs(60) {
        let ms = d.status_json()["store"]["last_flush"]["unix_ms"].as_u64().unwrap_or(0);
        if ms > 0 {
            flushes.insert(ms);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let seen: Vec<u64> = flushes.iter().copied().collect();
    let closest = seen.windows(2).map(|w| w[1] - w[0]).min().unwrap_or(u64::MAX);
    assert!(closest < 1500, "flushes every 300 ms expected, saw {seen:?} (closest {closest} ms)");

    // SIGHUP: same path; a key that needs a restart is reported and keeps its value.
    write_config(&cfg, &sb, "flush_interval = \"1s\"\nretention_days = 3\n");
    let text =
        std::fs::read_to_string(&cfg).unwrap().replace("\"cpu-clock\"", "\"cpu-clock:2000000\"");
    std::fs::write(&cfg, text).unwrap();
    // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
    unsafe { libc::kill(d.pid().cast_signed(), libc::SIGHUP) };
    wait_for(10, "the SIGHUP reload", || d.status_json()["last_reload"]["trigger"] == "SIGHUP");
    let v = d.status_json();
    assert_eq!(v["last_reload"]["ok"], true, "{}", v["last_reload"]);
    assert_eq!(v["config"]["flush_interval_s"], 1.0);
    assert_eq!(v["config"]["events"], "cpu-clock", "events need a restart");
    let restart = v["last_reload"]["restart_required"].as_array().unwrap();
    assert!(restart.iter().any(|k| k == "events"), "{}", v["last_reload"]);
    let text = ok_stdout(&d, &["status"]);
    assert!(text.contains("events") && text.contains("restart"), "{text}");

    // A broken file is rejected with file, line and reason; the daemon keeps its settings.
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("{good}flush_interval = 5\n")).unwrap();
    let line = good.lines().count() + 1;
    let out = d.ctl(&["reload"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("dcpid.toml:{line}:")), "{err}");
    std::fs::write(&cfg, format!("{good}max_memory_mb = \"lots\"\nflush_intrval = \"1s\"\n"))
        .unwrap();
    // SAFETY: as above.
    unsafe { libc::kill(d.pid().cast_signed(), libc::SIGHUP) };
    wait_for(10, "the rejected SIGHUP reload", || {
        let v = d.status_json();
        v["last_reload"]["trigger"] == "SIGHUP" && v["last_reload"]["ok"] == false
    });
    let v = d.status_json();
    let e = v["last_reload"]["error"].as_str().unwrap();
    assert!(e.contains(&format!("dcpid.toml:{line}:")) && e.contains("max_memory_mb"), "{e}");
    assert_eq!(v["config"]["flush_interval_s"], 1.0, "the running configuration stays");
    assert!(v["samples"].as_u64().unwrap() > 0);
    let (st, err) = d.terminate();
    assert!(st.success(), "{err}");
    assert_eq!(err.matches("reload rejected").count(), 2, "{err}");
}

/// [`dcpi_e2e::dcpid_exits_2`], and the configuration errors come as one `dcpid:` message.
fn expect_exit_2(args: &[&str], needles: &[&str]) {
    let err = dcpi_e2e::dcpid_exits_2(args, needles);
    assert_eq!(err.lines().filter(|l| l.starts_with("dcpid:")).count(), 1, "one message: {err}");
}

#[test]
fn bad_configuration_exits_2_naming_file_line_and_reason() {
    let sb = Sandbox::new();
    let cfg = sb.dir.path().join("bad.toml");
    let c = cfg.to_str().unwrap();
    let base = |extra: &str| {
        format!(
            "db = {:?}\nspool = {:?}\nsocket = {:?}\n{extra}",
            sb.db().display().to_string(),
            sb.spool().display().to_string(),
            sb.socket().display().to_string()
        )
    };
    std::fs::write(&cfg, base("host = \"h\"\nflush_intreval = \"2s\"\n")).unwrap();
    expect_exit_2(&["-c", c], &["bad.toml:5:1:", "flush_intreval"]);
    std::fs::write(&cfg, base("ring_pages = \"many\"\n")).unwrap();
    expect_exit_2(&["-c", c], &["bad.toml:4:14:", "invalid type"]);
    std::fs::write(&cfg, base("\nretention_keep = 0\n")).unwrap();
    expect_exit_2(&["-c", c], &["bad.toml:5:", "retention_keep"]);
    std::fs::write(&cfg, base("events = [\"cpu-clock\", \"cyclez\"]\n")).unwrap();
    expect_exit_2(&["-c", c], &["bad.toml:4:", "unknown event `cyclez`"]);
    // Events on the command line name the flag; zero and absurd periods are refused.
    let args = sb.daemon_args("h");
    let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
    a.extend(["-e", "cpu-clock:0"]);
    expect_exit_2(&a, &["--events", "cpu-clock:0"]);
    a.pop();
    a.push("cpu-clock:1000");
    expect_exit_2(&a, &["--events", "cpu-clock:1000", "10 µs"]);
    a.pop();
    a.push("cycles:99999999999999");
    expect_exit_2(&a, &["cycles:99999999999999", "out of range"]);
    // A database this host can never write: under a regular file.
    let file = sb.dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let under = file.join("db");
    let u = under.to_str().unwrap();
    let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
    let i = a.iter().position(|x| *x == "--db").unwrap();
    a[i + 1] = u;
    expect_exit_2(&a, &["plain-file/db", "not writable", "Not a directory"]);
    // Same for the spool; and clap's usage errors are 2 as well.
    let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
    let i = a.iter().position(|x| *x == "--spool").unwrap();
    let sp = file.join("spool.sqlite");
    let sps = sp.to_str().unwrap().to_string();
    a[i + 1] = &sps;
    expect_exit_2(&a, &["plain-file", "not a directory"]);
    let out = dcpi_e2e::run("dcpid", &["--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
    let out = dcpi_e2e::run("dcpid", &["--duration", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--duration"));
}

#[dcpi_testkit::test(perf)]
fn duration_accepts_plain_seconds() {
    let sb = Sandbox::new();
    let args = sb.daemon_args("dur");
    let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
    a.extend(["-e", "cpu-clock", "--duration", "1"]);
    let t = Instant::now();
    let out = dcpi_e2e::run("dcpid", &a);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let took = t.elapsed();
    assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(30), "{took:?}");
    assert!(host_total(&sb.db(), "dur") > 0, "the run published its samples");
}

#[dcpi_testkit::test(root, tool("setpriv"))]
fn sampling_not_permitted_is_one_clear_message_and_exit_2() {
    let paranoid: i32 = std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(2);
    if paranoid <= 0 {
        dcpi_testkit::skip!(
            "needs kernel.perf_event_paranoid >= 1 (is {paranoid}) to run dcpid unprivileged \
             without perf"
        );
    }
    let dir = tempfile::Builder::new().prefix("dcpi-noperm").tempdir().unwrap();
    let root = dir.path();
    std::fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let exe = root.join("dcpid");
    std::fs::copy(bin("dcpid"), &exe).unwrap();
    let run = || {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all"])
            .arg(&exe)
            .args(["--config", "none", "--host", "np", "-e", "cpu-clock", "--duration", "5"])
            .arg("--db")
            .arg(root.join("db"))
            .arg("--spool")
            .arg(root.join("spool.sqlite"))
            .arg("--socket")
            .arg(root.join("d.sock"))
            .output()
            .unwrap()
    };
    // ETXTBSY: a child that another test thread forked while the copy was open for writing
    // still holds that descriptor until it execs; it lets go within moments.
    let mut out = run();
    let deadline = Instant::now() + Duration::from_secs(30);
    while String::from_utf8_lossy(&out.stderr).contains("Text file busy")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
        out = run();
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.matches("kernel.perf_event_paranoid").count(), 1, "{err}");
    assert_eq!(err.matches("CAP_PERFMON").count(), 1, "{err}");
    assert!(err.contains("cpu-clock") && err.contains("EACCES"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A workload: spins `SPIN_MS` of its own CPU time and exits. Each copy is compiled with its
/// own tag, so it has its own build-id, hence its own image (and profile) in the database.
const SPIN_C: &str = r#"
#include <time.h>
static volatile unsigned long tag = TAG;
int main(void) {
    struct timespec a, b;
    unsigned long x = tag;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a);
    do {
        for (int i = 0; i < 100000; i++) x = x * 6364136223846793005UL + i;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b);
    } while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < SPIN_MS * 1000000L);
    tag = x;
    return 0;
}
"#;
const SPIN_MS: u64 = 200;

/// Compile one workload per name into `dir` (with cc, which building dcpi needs anyway).
/// The tags are unique to this run: the daemon also sees workloads of other test runs on the
/// machine, and the same build-id would make them the same image.
fn build_workloads(dir: &Path, names: &[String]) -> Vec<std::path::PathBuf> {
    let src = dir.join("spin.c");
    std::fs::write(&src, SPIN_C).unwrap();
    let nonce = (std::process::id() as u64) << 32
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            << 12;
    names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let exe = dir.join(n);
            let out = Command::new("cc")
                .args(["-O1", "-Wl,--build-id", &format!("-DTAG={}UL", nonce + i as u64)])
                .arg(format!("-DSPIN_MS={SPIN_MS}"))
                .arg("-o")
                .arg(&exe)
                .arg(&src)
                .output()
                .expect("cc (a C compiler is needed to build dcpi)");
            assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
            exe
        })
        .collect()
}

fn run_workload(exe: &Path) {
    let st = Command::new(exe).status().expect("run workload");
    assert!(st.success());
}

/// Every file of every host directory must be readable; temporary files left by a kill
/// must never be listed as profiles, and nothing may have been set aside as corrupt. Returns
/// the samples per image path (profiles of `host`, all epochs).
fn check_db(db: &Path, host: &str) -> std::collections::HashMap<Vec<u8>, u64> {
    let mut per_image = std::collections::HashMap::new();
    if !db.exists() {
        return per_image;
    }
    let d = Database::open(db).expect("database readable");
    for e in d.epochs().expect("epochs") {
        let hd = d.host_dir(&e, host).expect("host dir");
        if !hd.path.exists() {
            continue;
        }
        for ent in std::fs::read_dir(&hd.path).unwrap().flatten() {
            let name = ent.file_name().to_string_lossy().to_string();
            assert!(!name.contains(".corrupt"), "a file was torn and set aside: {name}");
        }
        for p in hd.profiles().expect("list profiles") {
            let name = p.path.file_name().unwrap().to_string_lossy().to_string();
            assert!(!name.starts_with(".tmp-"), "temporary file listed as a profile: {name}");
            let prof = Profile::read(&p.path)
                .unwrap_or_else(|err| panic!("unreadable profile after kill -9: {err}"));
            *per_image.entry(prof.header.image_path.clone()).or_insert(0) +=
                prof.header.total_samples;
        }
        if hd.summary_path().exists() {
            profile_format::HostSummary::read(&hd.summary_path())
                .unwrap_or_else(|err| panic!("unreadable summary after kill -9: {err}"));
        }
        if hd.kallsyms_ref_path().exists() {
            hd.read_kallsyms()
                .unwrap_or_else(|err| panic!("unreadable kallsyms after kill -9: {err}"));
        }
    }
    per_image
}

fn samples_of(per_image: &std::collections::HashMap<Vec<u8>, u64>, exe: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    per_image.get(exe.as_os_str().as_bytes()).copied().unwrap_or(0)
}

#[dcpi_testkit::test(perf)]
fn crash_loop_kill9_while_flushing_keeps_files_readable_and_counts_once() {
    let t0 = Instant::now();
    let sb = Sandbox::new();
    const ROUNDS: usize = 50;
    // Every 10th round runs a workload and confirms its flush; rounds 5, 15, ... run one and
    // are killed without confirmation; the others just kill at a random instant.
    let names: Vec<String> = (0..ROUNDS)
        .filter(|i| i % 5 == 0)
        .map(|i| format!("work-{}-{i}", if i % 10 == 0 { "c" } else { "u" }))
        .collect();
    let exes = build_workloads(sb.dir.path(), &names);
    let exe_of = |i: usize| {
        names.iter().position(|n| n.ends_with(&format!("-{i}"))).map(|k| exes[k].clone())
    };
    let args = ["-e", "cpu-clock", "--flush-interval", "200ms", "--publish-interval", "400ms"];
    let mut r = (std::process::id() as u64) ^ 0x9e37_79b9_7f4a_7c15;
    let mut rand = |n: u64| {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        r % n
    };
    let mut confirmed: Vec<(std::path::PathBuf, u64)> = Vec::new();
    let mut unconfirmed: Vec<std::path::PathBuf> = Vec::new();
    let mut dargs = sb.daemon_args("crash");
    dargs.extend(args.iter().map(ToString::to_string));
    for i in 0..ROUNDS {
        let mut d = spawn_ready(&dargs, &sb.socket());
        if let Some(exe) = exe_of(i) {
            run_workload(&exe);
            if i % 10 == 0 {
                // Past the drain threads' longest pass (1 s), every sample of the finished
                // workload is out of the rings; a completed flush publishes all of them.
                std::thread::sleep(Duration::from_millis(1100));
                ok_stdout(&d, &["flush"]);
                let n = samples_of(&check_db(&sb.db(), "crash"), &exe);
                assert!(n >= 50, "round {i}: {n} samples of a {SPIN_MS} ms CPU spin at 1 kHz");
                confirmed.push((exe, n));
            } else {
                unconfirmed.push(exe);
            }
        }
        // Kill while a flush is running (started in the background) or at a random instant.
        let bg = if rand(2) == 0 {
            let sock = sb.socket().display().to_string();
            Some(
                Command::new(bin("dcpictl"))
                    .args(["--socket", &sock, "flush"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .unwrap(),
            )
        } else {
            None
        };
        let wait = if bg.is_some() { rand(150) } else { 100 + rand(500) };
        std::thread::sleep(Duration::from_millis(wait));
        d.kill9();
        if let Some(mut c) = bg {
            drop(c.wait());
        }
        let now = check_db(&sb.db(), "crash");
        for (exe, n) in &confirmed {
            assert_eq!(
                samples_of(&now, exe),
                *n,
                "round {i}: samples of {} changed after kill -9 (lost or counted twice)",
                exe.display()
            );
        }
    }
    let mut d = sb.start_daemon("crash", &args);
    std::thread::sleep(Duration::from_millis(300));
    ok_stdout(&d, &["flush"]);
    let (st, err) = d.terminate();
    assert!(st.success(), "{err}");
    let fin = check_db(&sb.db(), "crash");
    for (exe, n) in &confirmed {
        assert_eq!(samples_of(&fin, exe), *n, "{}: lost or counted twice", exe.display());
    }
    // At most one count per sampling period of the workload's CPU time (period_min = P -
    // P/32 = 968.75 µs, plus its start-up): a replayed spool would double it.
    let bound = ((SPIN_MS + 50) as f64 / 0.96875) as u64;
    for exe in &unconfirmed {
        let n = samples_of(&fin, exe);
        assert!(n <= bound, "{}: {n} samples, more than {bound} possible", exe.display());
    }
    assert_eq!(confirmed.len(), ROUNDS / 10);
    eprintln!("crash loop: {ROUNDS} kills in {:?}", t0.elapsed());
}

#[dcpi_testkit::test(perf)]
fn disk_full_daemon_survives_and_writes_once_space_is_back() {
    let sb = Sandbox::new();
    let mnt = sb.dir.path().join("small");
    let Some(_tmpfs) = Tmpfs::mount(&mnt, "4m") else { return };
    let db = mnt.join("db");
    let exes = build_workloads(sb.dir.path(), &["work-full".to_string()]);
    let mut args = sb.daemon_args("full");
    let i = args.iter().position(|a| a == "--db").unwrap();
    args[i + 1] = db.display().to_string();
    args.extend(
        ["-e", "cpu-clock", "--flush-interval", "250ms", "--publish-interval", "1s"]
            .map(String::from),
    );
    let mut d = spawn_ready(&args, &sb.socket());
    // The database is set up (epoch, kallsyms snapshot) before the disk fills.
    ok_stdout(&d, &["flush"]);
    let filler = mnt.join("filler");
    tmpfs::fill(&filler);
    run_workload(&exes[0]);
    wait_for(20, "the disk error in status", || {
        let v = d.status_json();
        v["store"]["db_error"].is_string()
            && v["condition"].as_str().unwrap_or("").contains("database not writable")
    });
    let v = d.status_json();
    let e = v["store"]["db_error"].as_str().unwrap();
    assert!(e.contains("No space left") || e.contains("os error 28"), "{e}");
    // The error can come first (the lease renewal hits the full disk) while the workload's
    // samples are still on their way from the rings (drain threads wake about once a second)
    // to the spool: wait for them rather than assert at once.
    wait_for(20, "the spool to hold the workload's samples", || {
        d.status_json()["store"]["spool_rows"].as_u64().unwrap_or(0) > 0
    });
    let v = d.status_json();
    let before = v["samples"].as_u64().unwrap();
    let out = d.ctl(&["flush"]);
    assert_eq!(out.status.code(), Some(1), "a flush that cannot publish says so");
    std::thread::sleep(Duration::from_millis(700));
    let v = d.status_json();
    assert!(v["samples"].as_u64().unwrap() > before, "still sampling while the disk is full");
    assert!(v["cpus"].as_array().unwrap().iter().all(|c| c["online"] == true), "{v}");
    assert_eq!(samples_of(&check_db(&db, "full"), &exes[0]), 0, "nothing fit on the disk");

    // Space is back: the data is written without a restart.
    std::fs::remove_file(&filler).unwrap();
    wait_for(20, "the workload's profile", || {
        d.status_json()["store"]["db_error"].is_null()
            && samples_of(&check_db(&db, "full"), &exes[0]) > 0
    });
    ok_stdout(&d, &["flush"]);
    let n = samples_of(&check_db(&db, "full"), &exes[0]);
    assert!(n >= 50, "{n} samples of a {SPIN_MS} ms CPU spin at 1 kHz");
    assert_eq!(d.status_json()["condition"], "ok");
    let (st, err) = d.terminate();
    assert!(st.success(), "{err}");
    assert_eq!(
        err.matches("cannot write the profile database").count(),
        1,
        "the failure is logged once, not every flush: {err}"
    );
    assert_eq!(err.matches("profile database writable again").count(), 1, "{err}");
}
