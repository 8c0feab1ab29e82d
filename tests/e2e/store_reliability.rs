//! End-to-end tests of the store's reliability (issue #14): hostile files in the daemon's own
//! host directory, one daemon per host name, a database removed while the daemon runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dcpi_e2e::{bin, Daemon, Sandbox};
use dcpi_testkit::spin;
use dcpi_testkit::{Hostile, Tmpfs};
use profile_format::Database;

/// Wait until `f` holds (polling every 100 ms), at most `secs`.
fn wait_for(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Run a command to completion, failing the test if it takes more than `secs`.
fn run_bounded(mut cmd: Command, secs: u64, what: &str) -> Output {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(secs);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            drop(child.kill());
            drop(child.wait());
            panic!("{what}: still running after {secs} s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

fn ctl_bounded(d: &Daemon, args: &[&str], secs: u64) -> Output {
    let mut cmd = Command::new(bin("dcpictl"));
    cmd.arg("--socket").arg(&d.socket).args(args);
    run_bounded(cmd, secs, &format!("dcpictl {args:?}"))
}

/// The daemon's host directory in the current epoch.
fn host_dir(db: &Path, host: &str) -> PathBuf {
    let d = Database::open(db).expect("db");
    let e = d.current_epoch().expect("epochs").expect("an epoch");
    d.host_dir(&e, host).expect("host dir").path
}

fn profiles_in(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    // Flat profiles only (`<id>.<event>.prof`): the summary index reads those, not the
    // per-command ones (`<id>.<event>.cmd-<hash>.prof`, FORMAT.md §5.6) dcpid now also writes.
    v.retain(|p| {
        let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        name.ends_with(".prof") && name.matches('.').count() == 2
    });
    v.sort();
    v
}

/// SIGTERM; the daemon must be gone within `secs`. Returns its exit status and stderr.
fn terminate_bounded(d: &mut Daemon, secs: u64) -> (std::process::ExitStatus, String) {
    let child = d.child.as_mut().expect("running");
    // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
    unsafe { libc::kill(child.id().cast_signed(), libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            let mut err = String::new();
            if let Some(e) = child.stderr.as_mut() {
                drop(std::io::Read::read_to_string(e, &mut err));
            }
            d.child = None;
            return (st, err);
        }
        assert!(Instant::now() < deadline, "dcpid still running {secs} s after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[dcpi_testkit::test(perf)]
fn hostile_profiles_in_own_host_dir_are_set_aside_and_flush_and_sigterm_still_work() {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon("h1", &["-e", "cpu-clock", "--flush-interval", "500ms"]);
    let dir = host_dir(&sb.db(), "h1");
    wait_for(60, "published profiles", || {
        let out = ctl_bounded(&d, &["flush"], 60);
        out.status.success() && profiles_in(&dir).len() >= 3
    });
    // Replace three published profiles: a FIFO, a link to /dev/zero, a sparse 3 GiB file.
    let victims: Vec<PathBuf> = profiles_in(&dir).into_iter().take(3).collect();
    for (p, hostile) in victims.iter().zip([Hostile::Fifo, Hostile::DevZeroLink, Hostile::Sparse]) {
        hostile.plant(p);
    }
    // A flush writes the summary index, which reads every profile: all three are met.
    let out = ctl_bounded(&d, &["flush"], 60);
    assert!(out.status.success(), "flush: {}", String::from_utf8_lossy(&out.stderr));
    let v = d.status_json();
    assert!(v["store"]["corrupt_files_set_aside"].as_u64() >= Some(3), "{}", v["store"]);
    assert!(v["store"]["last_set_aside"].is_string(), "{}", v["store"]);
    for p in &victims {
        let mut aside = p.clone().into_os_string();
        aside.push(".corrupt");
        assert!(
            std::fs::symlink_metadata(&aside).is_ok(),
            "{} not set aside as {}",
            p.display(),
            PathBuf::from(&aside).display()
        );
    }
    // The human status says so too.
    let human = ctl_bounded(&d, &["status"], 30);
    assert!(String::from_utf8_lossy(&human.stdout).contains("set aside"), "{human:?}");
    let (st, err) = terminate_bounded(&mut d, 30);
    assert!(st.success(), "{err}");
    // Every file left in the host directory reads.
    let out = sb.prof(&["--host", "h1"]);
    assert!(out.status.success(), "dcpiprof: {}", String::from_utf8_lossy(&out.stderr));
}

#[dcpi_testkit::test(perf)]
fn second_daemon_on_the_same_host_name_exits_2_naming_the_first_until_it_dies() {
    let sb = Sandbox::new();
    let mut first = sb.start_daemon("web1.dc1", &["-e", "cpu-clock"]);
    let first_pid = first.pid();
    // Same database and host name; its own socket and spool.
    let sock2 = sb.dir.path().join("second.sock");
    let spool2 = sb.dir.path().join("spool2");
    let second_args = |sock: &Path, host: &str| {
        let mut c = Command::new(bin("dcpid"));
        c.args(["--config", "none", "--db"])
            .arg(sb.db())
            .arg("--spool")
            .arg(&spool2)
            .arg("--socket")
            .arg(sock)
            .args(["--host", host, "-e", "cpu-clock"]);
        c
    };
    let out = run_bounded(second_args(&sock2, "web1.dc1"), 60, "second dcpid");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("pid {first_pid}")), "owner not named: {err}");
    assert!(err.contains("web1.dc1"), "{err}");
    assert!(!sock2.exists(), "the refused daemon must not serve");
    // A different host name on the same database is fine (the default is the full host
    // name, so web1.dc1 and web1.dc2 no longer collide).
    let sock3 = sb.dir.path().join("third.sock");
    let mut c = second_args(&sock3, "web1.dc2");
    c.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut third = Daemon { child: Some(c.spawn().expect("spawn")), socket: sock3.clone() };
    wait_for(60, "web1.dc2 ready", || {
        if let Some(st) = third.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("web1.dc2 exited with {st}");
        }
        sock3.exists() && third.ctl(&["status"]).status.success()
    });
    third.kill9();
    // kill -9 the first: its lease is stale (pid dead on this machine), a new one takes over.
    first.kill9();
    let child =
        second_args(&sock2, "web1.dc1").stdout(Stdio::null()).stderr(Stdio::piped()).spawn();
    let mut second = Daemon { child: Some(child.expect("spawn")), socket: sock2.clone() };
    wait_for(60, "the successor ready", || {
        if let Some(st) = second.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("successor exited with {st}");
        }
        sock2.exists() && second.ctl(&["status"]).status.success()
    });
    let v = second.status_json();
    assert!(v["store"]["lease_file"].as_str().is_some_and(|f| f.ends_with("web1.dc1.lease")));
    let lease = Database::open(&sb.db()).unwrap().read_lease("web1.dc1").unwrap().unwrap();
    assert_eq!(lease.pid, second.pid());
    let (st, err) = terminate_bounded(&mut second, 30);
    assert!(st.success(), "{err}");
    assert!(err.contains("taking over a stale lease"), "takeover logged: {err}");
    // A clean stop releases the lease.
    assert_eq!(Database::open(&sb.db()).unwrap().read_lease("web1.dc1").unwrap(), None);
}

fn status_of(d: &Daemon) -> serde_json::Value {
    let out = ctl_bounded(d, &["status", "--json"], 10);
    assert!(out.status.success(), "status: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// Every sample of `host` in the database (every profile must read).
fn host_total(db: &Path, host: &str) -> u64 {
    let d = Database::open(db).expect("db");
    let mut n = 0;
    for e in d.epochs().expect("epochs") {
        let hd = d.host_dir(&e, host).expect("host dir");
        for p in hd.profiles().unwrap_or_default() {
            n +=
                profile_format::Profile::read(&p.path).expect("profile reads").header.total_samples;
        }
    }
    n
}

#[dcpi_testkit::test(perf)]
fn hung_database_keeps_sampling_status_and_stop_and_loses_no_sample() {
    dcpi_e2e::require_fault_injection();
    let sb = Sandbox::new();
    let trigger = sb.dir.path().join("hang-the-database");
    let spawn = |stall: bool| {
        let mut c = Command::new(bin("dcpid"));
        c.args(sb.daemon_args("h1"))
            .args(["-e", "cpu-clock", "--flush-interval", "500ms", "--publish-interval", "1s"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if stall {
            // Test hook: while the file exists every database operation blocks, as on a
            // hung NFS server.
            c.env("DCPI_TEST_STALL_DB", &trigger);
        }
        let mut d = Daemon { child: Some(c.spawn().expect("spawn")), socket: sb.socket() };
        wait_for(60, "dcpid ready", || {
            if let Some(st) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                panic!("dcpid exited with {st}");
            }
            sb.socket().exists() && d.ctl(&["status"]).status.success()
        });
        d
    };
    let _busy = spin();
    let mut d = spawn(true);
    wait_for(60, "a first publish", || ctl_bounded(&d, &["flush"], 60).status.success());
    std::fs::write(&trigger, b"").expect("hang the database");
    // Status answers, and says publishing is stalled and since when.
    wait_for(60, "the stall reported", || {
        status_of(&d)["store"]["publish_stalled_since_unix_ms"].is_u64()
    });
    let v = status_of(&d);
    assert!(v["condition"].as_str().unwrap().contains("stalled"), "{}", v["condition"]);
    // Sampling goes on.
    let before = v["samples"].as_u64().unwrap();
    wait_for(60, "samples during the stall", || {
        status_of(&d)["samples"].as_u64().unwrap() > before + 100
    });
    // A flush answers, with an error, within its bound.
    let t = Instant::now();
    let out = ctl_bounded(&d, &["flush"], 60);
    assert!(!out.status.success(), "flush cannot succeed on a hung database");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not answering") && err.contains("spool"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(40), "flush took {:?}", t.elapsed());
    // So does an epoch change (the stuck flush is still running: at once).
    let out = ctl_bounded(&d, &["epoch", "new"], 60);
    assert!(!out.status.success(), "no new epoch on a hung database");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not answering"), "{err}");
    // SIGTERM stops it within a few seconds, the samples kept in the spool.
    let seen = status_of(&d)["samples"].as_u64().unwrap();
    let t = Instant::now();
    let (st, err) = terminate_bounded(&mut d, 20);
    assert!(st.success(), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10), "stop took {:?}: {err}", t.elapsed());
    // The database answers again: the next start publishes what the first one sampled.
    std::fs::remove_file(&trigger).expect("unhang");
    let mut d = spawn(false);
    let out = ctl_bounded(&d, &["flush"], 60);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (st, err2) = terminate_bounded(&mut d, 30);
    assert!(st.success(), "{err2}");
    let total = host_total(&sb.db(), "h1");
    assert!(total >= seen, "lost samples: {total} published, {seen} seen before the stop");
    // Exactly what the two runs say they took: nothing lost, nothing counted twice.
    let (a, b) = (stopped_samples(&err), stopped_samples(&err2));
    assert_eq!(total, a + b, "published {total}, the runs took {a} + {b}");
}

/// The sample count of dcpid's closing "dcpid stopped" log line.
fn stopped_samples(log: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains("dcpid stopped"))
        .unwrap_or_else(|| panic!("no closing line in the log:\n{log}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("samples="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no samples= in {line:?}"))
}

/// The dropped count of dcpid's closing "dcpid stopped" log line.
fn stopped_dropped(log: &str) -> u64 {
    let line = log
        .lines()
        .find(|l| l.contains("dcpid stopped"))
        .unwrap_or_else(|| panic!("no closing line in the log:\n{log}"));
    line.split_whitespace()
        .find_map(|w| w.strip_prefix("dropped="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no dropped= in {line:?}"))
}

/// A daemon whose spool log (`<spool>/h1`) is a full tmpfs from the start, its database in
/// `db` (flushing every 500 ms, publishing every second). Returns the daemon and the spool
/// log's directory.
fn daemon_on_a_full_spool(sb: &Sandbox, db: &Path, spool: &Path) -> Daemon {
    let mut c = Command::new(bin("dcpid"));
    c.args(["--config", "none", "--db"])
        .arg(db)
        .arg("--spool")
        .arg(spool)
        .arg("--socket")
        .arg(sb.socket())
        .args(["--host", "h1", "-e", "cpu-clock", "--flush-interval", "500ms"])
        .args(["--publish-interval", "1s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut d = Daemon { child: Some(c.spawn().expect("spawn")), socket: sb.socket() };
    wait_for(60, "dcpid ready", || {
        if let Some(st) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("dcpid exited with {st}");
        }
        sb.socket().exists() && d.ctl(&["status"]).status.success()
    });
    d
}

/// No segment file in the spool log is empty (a failed retry left none behind).
fn assert_no_empty_segment(dir: &Path) {
    for e in std::fs::read_dir(dir).expect("spool log").flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with("seg-") {
            let len = e.metadata().expect("stat").len();
            assert!(len > 0 && name.ends_with(".log"), "{name}: {len} bytes");
        }
    }
}

#[dcpi_testkit::test(perf)]
fn full_spool_publishes_straight_to_the_database_and_loses_nothing() {
    let sb = Sandbox::new();
    let spool = sb.dir.path().join("spool");
    let log_dir = spool.join("h1");
    let Some(fs) = Tmpfs::mount_mode(&log_dir, "64k", 0o700) else { return };
    fs.fill();
    let _busy = spin();
    let mut d = daemon_on_a_full_spool(&sb, &sb.db(), &spool);
    // The spool cannot take a batch, yet profiles are published while the daemon runs.
    wait_for(60, "profiles published without the spool", || {
        let v = status_of(&d);
        v["store"]["spool_error"].is_string()
            && v["store"]["published_files"].as_u64() > Some(2)
            && v["samples"].as_u64() > Some(200)
    });
    let v = status_of(&d);
    assert_eq!(v["store"]["dropped_samples"], 0, "{}", v["store"]);
    let (st, err) = terminate_bounded(&mut d, 60);
    let (taken, dropped) = (stopped_samples(&err), stopped_dropped(&err));
    let total = host_total(&sb.db(), "h1");
    assert_eq!((total, dropped), (taken, 0), "published {total} of {taken}:\n{err}");
    assert!(st.success(), "nothing dropped, a clean stop: {st}\n{err}");
    assert!(!err.contains("spool keeps"), "the spool keeps nothing here:\n{err}");
    assert_no_empty_segment(&log_dir);
    // The next start finds no segment to set aside.
    drop(fs);
    let mut d = daemon_on_a_full_spool(&sb, &sb.db(), &spool);
    let (st, err) = terminate_bounded(&mut d, 60);
    assert!(st.success(), "{err}");
    assert!(!err.contains("set aside"), "{err}");
}

#[dcpi_testkit::test(perf)]
fn full_spool_and_full_database_count_what_they_drop_and_exit_non_zero() {
    let sb = Sandbox::new();
    let spool = sb.dir.path().join("spool");
    let log_dir = spool.join("h1");
    let db_fs = sb.dir.path().join("dbfs");
    let Some(spool_fs) = Tmpfs::mount_mode(&log_dir, "64k", 0o700) else { return };
    let Some(dbfs) = Tmpfs::mount_mode(&db_fs, "64m", 0o700) else { return };
    spool_fs.fill();
    let db = db_fs.join("db");
    let _busy = spin();
    let mut d = daemon_on_a_full_spool(&sb, &db, &spool);
    wait_for(60, "a first publish without the spool", || {
        status_of(&d)["store"]["published_files"].as_u64() > Some(0)
    });
    // The database's disk fills too: batches are held in memory, within the bound.
    dbfs.fill();
    wait_for(60, "samples held in memory", || {
        let v = status_of(&d);
        v["store"]["db_error"].is_string() && v["store"]["pending_samples"].as_u64() > Some(100)
    });
    let (st, err) = terminate_bounded(&mut d, 60);
    let (taken, dropped) = (stopped_samples(&err), stopped_dropped(&err));
    assert!(dropped > 0, "{err}");
    assert!(!st.success(), "samples were dropped: the exit status says so:\n{err}");
    let total = host_total(&db, "h1");
    assert_eq!(total + dropped, taken, "published {total} + dropped {dropped} != taken:\n{err}");
    assert!(err.contains(&format!("dropped {dropped} of the {taken} samples")), "{err}");
    assert!(!err.contains("spool keeps everything"), "a false claim:\n{err}");
    assert_no_empty_segment(&log_dir);
}

/// Issue 35, defect 5, through the report tool. A profile of a newer format version in the
/// daemon's own host directory (a rolling downgrade within an epoch) is left untouched; the
/// daemon's samples continue beside it, and this version's `dcpiprof` reports them (with
/// `--keep-going`, naming the newer file it cannot read; without, it exits 2 naming it).
/// Before the fix the newer file was renamed `.corrupt` and its samples vanished.
#[test]
fn newer_format_profile_is_kept_and_reports_show_the_daemons_samples() {
    use dcpid::aggregate::{ImageInfo, OffsetCounts, Resolved, ResolvedProfile};
    use dcpid::store::{EventInfo, Store, StoreConfig};
    use profile_format::{EventDesc, ImageId, ImageKind, PROFILE_VERSION};

    let sb = Sandbox::new();
    let cfg = StoreConfig {
        db: sb.db(),
        spool: sb.spool(),
        host: "e2e-newer".into(),
        flush_interval: Duration::from_secs(2),
        publish_interval: Duration::from_secs(60),
        publish_max_delay: Duration::from_secs(360),
        max_memory_bytes: 64 << 20,
        retention_days: 7,
        retention_keep: 3,
    };
    let desc = EventDesc {
        name: "cpu-clock".into(),
        perf_type: 1,
        perf_config: 0,
        period_mean: 1000,
        period_min: 1000,
        period_max: 1000,
    };
    let id = ImageId::BuildId(vec![7; 20]);
    let batch = |count: u64| {
        let mut r = Resolved::default();
        let info = std::sync::Arc::new(ImageInfo {
            kind: ImageKind::Elf,
            id: id.clone(),
            path: b"/usr/bin/downgraded".to_vec(),
            jit_symbols: vec![],
        });
        let mut counts = OffsetCounts::default();
        counts.insert(0x40, (count, count * 1000));
        r.profiles.insert((id.clone(), 0), ResolvedProfile { image: info, event: 0, counts });
        r.samples = count;
        r
    };
    let mut s = Store::open(cfg);
    s.set_events(vec![EventInfo { desc, source: "software".into() }]);
    s.add(batch(11), 0, 0);
    s.flush_everything().expect("flush");
    let epoch = s.current_epoch().cloned().expect("epoch");
    let hd =
        profile_format::Database::open(&sb.db()).unwrap().host_dir(&epoch, "e2e-newer").unwrap();
    let path = hd.profile_path(&id, "cpu-clock");
    // What a newer dcpid of this host leaves: the next container version, whole and valid.
    let mut b = std::fs::read(&path).unwrap();
    b[8..10].copy_from_slice(&(PROFILE_VERSION + 1).to_le_bytes());
    let body = b.len() - 4;
    let crc = crc32fast::hash(&b[..body]);
    b[body..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, &b).unwrap();

    s.add(batch(5), 0, 0);
    s.flush_everything().expect("flush");
    drop(s);
    assert_eq!(std::fs::read(&path).unwrap(), b, "the newer file is untouched");

    let out = sb.prof(&["--host", "e2e-newer", "--format", "json"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(&path.display().to_string()) && err.contains("version"), "{err}");
    let out = sb.prof(&["--host", "e2e-newer", "--format", "json", "--keep-going"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON report");
    let row = v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .find(|r| r["image"].as_str() == Some("/usr/bin/downgraded"))
        .unwrap_or_else(|| panic!("no row for the image: {v:#}"));
    assert_eq!(row["samples"].as_u64(), Some(5), "the daemon's samples after the downgrade");
}
