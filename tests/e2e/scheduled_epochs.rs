//! End-to-end tests: epochs on a schedule (`epoch_interval`): hosts of one database rotate at
//! the same UTC boundaries into the same epoch names without any command, retention expires
//! the old ones, a reload turns the schedule on and off, and bad values are refused.
//!
//! Every wait is on a condition with a generous deadline (these run beside busy loops on a
//! 2-CPU machine); a boundary every 3 s leaves each daemon a whole interval to rotate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use dcpi_e2e::{bin, Daemon, Sandbox};
use profile_format::{Database, EpochId};

/// Wait until `f` holds (polling every 50 ms), at most `secs`; `f` notes what it saw in its
/// argument, for the failure message.
fn wait_for(secs: u64, what: &str, mut f: impl FnMut(&mut String) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut saw = String::new();
    while !f(&mut saw) {
        assert!(Instant::now() < deadline, "timed out after {secs} s waiting for {what}: {saw}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `dcpid` for `host` on the sandbox's database, with its own spool, socket and log file
/// (read on failure), plus `extra`; ready when its socket answers.
fn start(sb: &Sandbox, host: &str, extra: &[&str]) -> (Daemon, PathBuf) {
    let sock = sb.dir.path().join(format!("{host}.sock"));
    let log = sb.dir.path().join(format!("{host}.log"));
    let child = Command::new(bin("dcpid"))
        .arg("--db")
        .arg(sb.db())
        .arg("--spool")
        .arg(sb.dir.path().join(format!("{host}-spool")))
        .arg("--socket")
        .arg(&sock)
        .args(["--host", host, "-e", "cpu-clock", "--flush-interval", "500ms"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn dcpid");
    let mut d = Daemon { child: Some(child), socket: sock.clone() };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(st) = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            panic!("dcpid {host} exited early with {st}: {}", read(&log));
        }
        if sock.exists() && d.ctl(&["status"]).status.success() {
            return (d, log);
        }
        assert!(Instant::now() < deadline, "dcpid {host} not ready in 60 s: {}", read(&log));
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

fn epoch_of(d: &Daemon) -> EpochId {
    let out = d.ctl(&["epoch", "show"]);
    assert!(out.status.success(), "epoch show: {}", String::from_utf8_lossy(&out.stderr));
    EpochId::parse(String::from_utf8_lossy(&out.stdout).trim()).expect("an epoch id")
}

fn unix(e: &EpochId) -> u64 {
    e.start_time().duration_since(UNIX_EPOCH).expect("after 1970").as_secs()
}

/// The daemon's last flush (Unix ms), 0 before the first.
fn last_flush_ms(d: &Daemon) -> u64 {
    d.status_json()["store"]["last_flush"]["unix_ms"].as_u64().unwrap_or(0)
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |t| t.as_millis() as u64)
}

/// The acceptance test of scheduled epochs: two daemons with different host names on one
/// database, a boundary every 3 s, retention as short as it goes (older than 0 days, keep 2):
/// with no command at all, both rotate into the same epochs, named after the boundaries, and
/// retention removes the oldest.
#[dcpi_testkit::test(perf)]
fn two_hosts_rotate_into_the_same_epochs_and_retention_removes_the_oldest() {
    const EVERY: u64 = 3;
    let sb = Sandbox::new();
    let args = [
        "--config",
        "none",
        "--epoch-interval",
        "3s",
        "--retention-days",
        "0",
        "--retention-keep",
        "2",
    ];
    let (mut a, log_a) = start(&sb, "fleet-a", &args);
    let (mut b, log_b) = start(&sb, "fleet-b", &args);
    let logs = || format!("\n--- fleet-a:\n{}\n--- fleet-b:\n{}", read(&log_a), read(&log_b));
    let first = epoch_of(&a);
    let db = Database::open(&sb.db()).expect("database");

    // Every epoch directory seen and the hosts seen in it, over time: retention removes them
    // again a few seconds later.
    let mut seen: BTreeMap<EpochId, BTreeSet<String>> = BTreeMap::new();
    let hosts = ["fleet-a".to_string(), "fleet-b".to_string()];
    let mut shared: Vec<EpochId> = Vec::new();
    wait_for(300, "four scheduled epochs with both hosts, and the oldest removed", |saw| {
        for e in db.epochs().unwrap_or_default() {
            let h = db.hosts(&e).unwrap_or_default();
            seen.entry(e).or_default().extend(h);
        }
        shared = seen
            .iter()
            .filter(|(e, h)| **e > first && hosts.iter().all(|x| h.contains(x)))
            .map(|(e, _)| e.clone())
            .collect();
        *saw = format!("seen {seen:?}{}", logs());
        shared.len() >= 4 && !db.epoch_dir(&first).exists() && !db.epoch_dir(&shared[0]).exists()
    });
    // Named after the boundaries: no host-specific or "next free second" names.
    let after: Vec<&EpochId> = seen.keys().filter(|e| **e > first).collect();
    assert!(
        after.iter().all(|e| unix(e).is_multiple_of(EVERY)),
        "unaligned epochs in {after:?}{}",
        logs()
    );
    // Retention keeps it bounded: the newest two (retention_keep), the one just started, and
    // one more while a daemon that lags behind the other has not rotated yet; nothing old.
    let now: Vec<EpochId> = db.epochs().expect("epochs");
    assert!(now.len() <= 5, "retention keeps at most a few epochs: {now:?}{}", logs());
    assert!(now.iter().all(|e| *e > shared[0]), "the oldest remain: {now:?}");
    // Both daemons are in the same epoch, one of the boundaries.
    wait_for(120, "both daemons in the same scheduled epoch", |saw| {
        let (ea, eb) = (epoch_of(&a), epoch_of(&b));
        *saw = format!("a {ea} b {eb}{}", logs());
        ea == eb && unix(&ea).is_multiple_of(EVERY)
    });
    let (sa, _) = a.terminate();
    let (sb_, _) = b.terminate();
    assert!(sa.success() && sb_.success(), "exit {sa} {sb_}{}", logs());
    let text = read(&log_a) + &read(&log_b);
    assert!(text.contains("started the scheduled epoch"), "{}", logs());
    assert!(text.contains("retention removed"), "{}", logs());
}

/// `epoch_interval` is reloadable: off, nothing rotates across several boundaries; on, the
/// daemon rotates at the next boundary; off again, it stops.
#[dcpi_testkit::test(perf)]
fn a_reload_turns_the_schedule_on_and_off() {
    const EVERY: u64 = 2;
    let sb = Sandbox::new();
    let cfg = sb.dir.path().join("dcpid.toml");
    std::fs::write(&cfg, "epoch_interval = \"off\"\n").unwrap();
    let c = cfg.display().to_string();
    let (mut d, log) = start(&sb, "solo", &["--config", c.as_str()]);
    assert_eq!(d.status_json()["config"]["epoch_interval_s"], 0);
    let e0 = epoch_of(&d);
    // Flushed past three boundaries (of 2 s): still the same epoch.
    let after = now_ms() + 3 * EVERY * 1000;
    wait_for(120, "flushes past three boundaries", |saw| {
        *saw = read(&log);
        last_flush_ms(&d) > after
    });
    assert_eq!(epoch_of(&d), e0, "off: no rotation{}", read(&log));

    std::fs::write(&cfg, "epoch_interval = \"2s\"\n").unwrap();
    let out = d.ctl(&["reload"]);
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("epoch_interval: off -> 2s"), "{said}");
    assert_eq!(d.status_json()["config"]["epoch_interval_s"], 2);
    wait_for(120, "a scheduled epoch after the reload", |saw| {
        *saw = read(&log);
        epoch_of(&d) != e0
    });
    let e1 = epoch_of(&d);
    assert!(e1 > e0 && unix(&e1).is_multiple_of(EVERY), "{e0} then {e1}");

    std::fs::write(&cfg, "epoch_interval = \"off\"\n").unwrap();
    let out = d.ctl(&["reload"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A rotation already under way when the reload came may finish: take the epoch after
    // one more flush, then flush past three more boundaries.
    let t = now_ms() + 1000;
    wait_for(120, "a flush after the reload", |saw| {
        *saw = read(&log);
        last_flush_ms(&d) > t
    });
    let e2 = epoch_of(&d);
    let after = now_ms() + 3 * EVERY * 1000;
    wait_for(120, "flushes past three boundaries", |saw| {
        *saw = read(&log);
        last_flush_ms(&d) > after
    });
    assert_eq!(epoch_of(&d), e2, "off again: no rotation{}", read(&log));
    let (st, _) = d.terminate();
    assert!(st.success(), "{}", read(&log));
}

/// Garbage, negative and sub-second values are configuration errors naming the key (and the
/// file's line) or the flag: exit status 2, nothing started.
#[test]
fn bad_epoch_interval_exits_2_naming_the_key() {
    let sb = Sandbox::new();
    let cfg = sb.dir.path().join("bad.toml");
    let c = cfg.to_str().unwrap();
    let base = |extra: &str| {
        format!(
            "db = {:?}\nspool = {:?}\nsocket = {:?}\nhost = \"h\"\n{extra}",
            sb.db().display().to_string(),
            sb.spool().display().to_string(),
            sb.socket().display().to_string()
        )
    };
    for (value, why) in [
        ("\"soon\"", "or `off`"),
        ("\"-1s\"", "epoch_interval"),
        ("-3", "negative"),
        ("\"250ms\"", "at least 1s"),
        ("\"2500ms\"", "whole number of seconds"),
        ("\"400d\"", "too long"),
    ] {
        std::fs::write(&cfg, base(&format!("epoch_interval = {value}\n"))).unwrap();
        dcpi_e2e::dcpid_exits_2(&["-c", c], &["bad.toml:5:", "epoch_interval", why]);
    }
    let args = sb.daemon_args("h");
    let mut a: Vec<&str> = args.iter().map(String::as_str).collect();
    a.push("--epoch-interval=-2s");
    dcpi_e2e::dcpid_exits_2(&a, &["--epoch-interval"]);
    a.pop();
    a.extend(["--epoch-interval", "often"]);
    dcpi_e2e::dcpid_exits_2(&a, &["--epoch-interval", "often"]);
    assert!(!sb.db().exists(), "nothing created");
}
