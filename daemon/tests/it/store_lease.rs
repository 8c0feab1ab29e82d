//! Store: one daemon per host name in a database. A live lease held by another process
//! refuses the start naming the owner; a stale one (owner dead on this machine, or not renewed
//! for several intervals on another) is taken over; a lease lost while running stops
//! publishing; a clean stop releases it.

use std::path::Path;

use crate::store_support;
use dcpid::store::{Store, StoreConfig, StoreError};
use profile_format::{Database, Lease};

fn cfg(root: &Path) -> StoreConfig {
    StoreConfig { host: "web1.dc1".into(), ..store_support::cfg(root) }
}

fn first_line(p: &str) -> String {
    std::fs::read_to_string(p).unwrap_or_default().lines().next().unwrap_or("").trim().to_owned()
}

fn pid_start(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// A lease as process `pid` of this machine would hold it.
fn local_lease(pid: u32, pid_start: u64) -> Lease {
    Lease {
        host: "web1.dc1".into(),
        machine_id: first_line("/etc/machine-id"),
        boot_id: first_line("/proc/sys/kernel/random/boot_id"),
        pid,
        pid_start,
        hostname: "other-daemon".into(),
        start_unix_ms: now_ms() - 1000,
        renewed_unix_ms: now_ms() - 1000,
        interval_ms: 60_000,
    }
}

fn db(root: &Path) -> Database {
    Database::create(&root.join("db")).unwrap()
}

#[test]
fn live_lease_of_another_process_refuses_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut owner = std::process::Command::new("sleep").arg("60").spawn().unwrap();
    let held = local_lease(owner.id(), pid_start(owner.id()));
    assert!(db(root).create_lease(&held).unwrap());
    let e = Store::open_leased(cfg(root)).expect_err("the host name is held");
    assert!(matches!(e, StoreError::LeaseHeld { .. }), "{e}");
    let msg = e.to_string();
    let pid = format!("pid {}", owner.id());
    for needle in [pid.as_str(), "other-daemon", "web1.dc1.lease", "--host"] {
        assert!(msg.contains(needle), "message lacks {needle:?}: {msg}");
    }
    // Nothing of this host was touched: no spool opened.
    assert!(!root.join("spool/web1.dc1").exists());
    // Its owner dies (kill -9): the next start takes the lease over.
    owner.kill().unwrap();
    owner.wait().unwrap();
    let mut s = Store::open_leased(cfg(root)).expect("stale lease taken over");
    let now = db(root).read_lease("web1.dc1").unwrap().unwrap();
    assert_eq!(now.pid, std::process::id());
    assert!(s.status().lease_file.unwrap().ends_with("leases/web1.dc1.lease"));
    s.flush_everything().unwrap();
    // A clean stop releases it.
    s.release_lease();
    assert_eq!(db(root).read_lease("web1.dc1").unwrap(), None);
}

#[test]
fn lease_of_another_machine_is_stale_only_when_not_renewed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut remote = local_lease(4242, 1);
    remote.machine_id = "0".repeat(32);
    assert!(db(root).create_lease(&remote).unwrap());
    // Renewed a second ago: live, whatever its pid means here.
    assert!(matches!(Store::open_leased(cfg(root)), Err(StoreError::LeaseHeld { .. })));
    // Not renewed for more than 3 intervals: taken over.
    remote.renewed_unix_ms = now_ms() - 4 * 60_000;
    db(root).write_lease(&remote).unwrap();
    let _s = Store::open_leased(cfg(root)).expect("stale remote lease taken over");
    assert_eq!(db(root).read_lease("web1.dc1").unwrap().unwrap().pid, std::process::id());
}

#[test]
fn lease_lost_while_running_stops_publishing() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut s = Store::open_leased(cfg(root)).unwrap();
    s.flush_everything().unwrap();
    // Another daemon found it stale (e.g. this one was stuck for minutes) and took it.
    let mut thief = local_lease(1, 1);
    thief.machine_id = "0".repeat(32);
    thief.hostname = "thief".into();
    db(root).write_lease(&thief).unwrap();
    let e = s.flush_everything().expect_err("no publishing without the lease");
    assert!(e.to_string().contains("thief"), "{e}");
    let st = s.status();
    assert!(st.lease_lost_to.as_deref().is_some_and(|o| o.contains("thief")), "{st:?}");
    // Releasing does not remove the other daemon's lease.
    s.release_lease();
    assert_eq!(db(root).read_lease("web1.dc1").unwrap().unwrap().hostname, "thief");
}

/// Issue 35, defect 6: the owner was killed but not reaped (its parent, a stopped supervisor or
/// a container's PID 1, never waits): `/proc/PID` is still there with its start time, in state
/// `Z`. It can write nothing any more: its lease is taken over. Before the fix the successor
/// was refused (exit 2) for as long as the zombie lived.
#[test]
fn lease_of_a_zombie_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut owner = std::process::Command::new("sleep").arg("600").spawn().unwrap();
    let pid = owner.id();
    let held = local_lease(pid, pid_start(pid));
    assert!(db(root).create_lease(&held).unwrap());
    assert!(matches!(Store::open_leased(cfg(root)), Err(StoreError::LeaseHeld { .. })));
    // SIGKILL, and no wait(): a zombie.
    owner.kill().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        if stat[stat.rfind(')').unwrap() + 1..].trim_start().starts_with('Z') {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "pid {pid} never became a zombie");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(pid_start(pid), held.pid_start, "the zombie keeps its start time");
    let _s = Store::open_leased(cfg(root)).expect("a zombie's lease is taken over");
    assert_eq!(db(root).read_lease("web1.dc1").unwrap().unwrap().pid, std::process::id());
    owner.wait().unwrap();
}

/// A FIFO, a link, or a link in place of `leases/`: named as the lease (not a "corrupt
/// profile"), set aside without blocking, counted in the status, and a real lease taken; a
/// link is never written through.
#[test]
fn fifo_or_link_lease_is_set_aside_as_the_lease() {
    for what in ["fifo", "link", "leases-link"] {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let d = db(root);
        let path = d.lease_path("web1.dc1").unwrap();
        let target = root.join("target");
        std::fs::create_dir(&target).unwrap();
        match what {
            "fifo" => {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                dcpi_testkit::Hostile::Fifo.plant(&path);
            }
            "link" => {
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                std::os::unix::fs::symlink(target.join("x.lease"), &path).unwrap();
            }
            _ => std::os::unix::fs::symlink(&target, path.parent().unwrap()).unwrap(),
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let c = cfg(root);
        std::thread::spawn(move || {
            drop(tx.send(Store::open_leased(c).map(|s| s.status())));
        });
        let st = rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("taking the lease blocked")
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let last = st.last_set_aside.unwrap_or_default();
        assert!(last.contains("lease") && !last.contains("profile"), "{what}: {last}");
        assert_eq!(st.corrupt_files_set_aside, 1, "{what}");
        assert!(std::fs::symlink_metadata(path.parent().unwrap()).unwrap().is_dir(), "{what}");
        assert!(std::fs::symlink_metadata(&path).unwrap().is_file(), "{what}");
        assert_eq!(db(root).read_lease("web1.dc1").unwrap().unwrap().pid, std::process::id());
        assert_eq!(std::fs::read_dir(&target).unwrap().count(), 0, "{what}: written through");
    }
}
