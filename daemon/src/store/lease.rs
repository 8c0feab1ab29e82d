//! Ownership of the host name in the database (FORMAT.md §2.1): who this daemon is, and
//! whether the holder of an existing lease is still alive.

use std::time::{SystemTime, UNIX_EPOCH};

use profile_format::Lease;

/// A lease not renewed for this many of its owner's intervals is stale (the owner is on
/// another machine, so its pid cannot be checked).
pub const STALE_AFTER_INTERVALS: u64 = 3;
/// Floor of the interval used to judge staleness: a very short publish interval must not let a
/// daemon that is only slow (a loaded machine, an NFS hiccup) lose its lease.
const MIN_STALE_MS: u64 = 30_000;

pub(super) fn unix_ms_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn first_line(path: &str) -> String {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| s.lines().next().map(|l| l.trim().to_owned()))
        .unwrap_or_default()
}

fn machine_id() -> String {
    let id = first_line("/etc/machine-id");
    if id.is_empty() {
        first_line("/var/lib/dbus/machine-id")
    } else {
        id
    }
}

/// A task's state letter and start time in clock ticks since boot (`/proc/.../stat` fields 3
/// and 22); `None` if there is no such task.
fn task_stat(stat_path: &str) -> Option<(char, u64)> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last `)`.
    let mut rest = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = rest.next()?.chars().next()?;
    Some((state, rest.nth(18)?.parse().ok()?))
}

/// A process's start time in clock ticks since boot (`/proc/PID/stat` field 22); `None` if
/// there is no such process.
fn pid_start(pid: u32) -> Option<u64> {
    task_stat(&format!("/proc/{pid}/stat")).map(|(_, t)| t)
}

/// Whether process `pid` has exited and only waits to be reaped: a zombie (`Z`) or dead (`X`)
/// main thread and no live thread left. A dcpid killed under a supervisor that is stopped,
/// or under a container's PID 1 that never reaps, stays such a zombie, with its `/proc/PID`
/// and start time, for as long as its parent lives; it can write nothing any more. (A main
/// thread that ended while other threads run also shows `Z`: those threads are checked.)
fn is_zombie(pid: u32) -> bool {
    let dead = |s: char| s == 'Z' || s == 'X';
    if !task_stat(&format!("/proc/{pid}/stat")).is_some_and(|(s, _)| dead(s)) {
        return false;
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return true };
    tasks.filter_map(Result::ok).all(|t| {
        let stat = format!("{}/stat", t.path().display());
        task_stat(&stat).is_none_or(|(s, _)| dead(s))
    })
}

/// This process's lease on `host`, renewed every `interval_ms`.
pub(super) fn mine(host: &str, interval_ms: u64) -> Lease {
    let pid = std::process::id();
    let now = unix_ms_now();
    Lease {
        host: host.to_owned(),
        machine_id: machine_id(),
        boot_id: first_line("/proc/sys/kernel/random/boot_id"),
        pid,
        pid_start: pid_start(pid).unwrap_or(0),
        hostname: first_line("/proc/sys/kernel/hostname"),
        start_unix_ms: now,
        renewed_unix_ms: now,
        interval_ms,
    }
}

/// `None` if `held`'s owner may still be writing; otherwise why its lease is stale.
pub(super) fn stale_reason(held: &Lease, me: &Lease, now_ms: u64) -> Option<String> {
    let same_machine = if held.machine_id.is_empty() && me.machine_id.is_empty() {
        !held.hostname.is_empty() && held.hostname == me.hostname
    } else {
        held.machine_id == me.machine_id
    };
    if same_machine {
        if held.boot_id != me.boot_id {
            return Some("its machine has rebooted since".into());
        }
        return match pid_start(held.pid) {
            None => Some(format!("pid {} is not running", held.pid)),
            Some(t) if held.pid_start != 0 && t != held.pid_start => {
                Some(format!("pid {} is now another process", held.pid))
            }
            Some(_) if is_zombie(held.pid) => {
                Some(format!("pid {} has exited (a zombie not yet reaped by its parent)", held.pid))
            }
            // Alive: even if it has not renewed (stuck on a hung database), it may resume.
            Some(_) => None,
        };
    }
    let interval = held.interval_ms.max(MIN_STALE_MS);
    let age = now_ms.saturating_sub(held.renewed_unix_ms);
    (age > STALE_AFTER_INTERVALS.saturating_mul(interval)).then(|| {
        format!(
            "not renewed for {:.0} s (more than {STALE_AFTER_INTERVALS} of its {:.0} s intervals)",
            age as f64 / 1e3,
            interval as f64 / 1e3
        )
    })
}

/// How a lease held by another is described to the user.
pub(super) fn describe(held: &Lease, now_ms: u64) -> String {
    let ago = now_ms.saturating_sub(held.renewed_unix_ms) as f64 / 1e3;
    format!("{held}, lease renewed {ago:.0} s ago")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judges_liveness() {
        let me = mine("h", 60_000);
        assert!(me.pid_start > 0);
        // This very process, under another start time: a reused pid.
        let mut other = me.clone();
        other.pid_start += 1;
        assert!(stale_reason(&other, &me, unix_ms_now()).unwrap().contains("another process"));
        other.pid_start = me.pid_start;
        assert_eq!(stale_reason(&other, &me, unix_ms_now()), None, "alive");
        other.pid = u32::MAX - 1;
        assert!(stale_reason(&other, &me, unix_ms_now()).unwrap().contains("not running"));
        // A real zombie: a child killed and not waited for.
        let mut child = std::process::Command::new("sleep").arg("600").spawn().unwrap();
        let zpid = child.id();
        let mut zombie = me.clone();
        zombie.pid = zpid;
        zombie.pid_start = pid_start(zpid).unwrap();
        assert_eq!(stale_reason(&zombie, &me, unix_ms_now()), None, "alive while it runs");
        child.kill().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !is_zombie(zpid) {
            assert!(std::time::Instant::now() < deadline, "pid {zpid} never became a zombie");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(pid_start(zpid), Some(zombie.pid_start), "a zombie keeps its start time");
        assert!(stale_reason(&zombie, &me, unix_ms_now()).unwrap().contains("zombie"));
        child.wait().unwrap();
        other.boot_id = "x".into();
        assert!(stale_reason(&other, &me, unix_ms_now()).unwrap().contains("rebooted"));
        // Another machine: only the renewal time tells.
        let mut far = me.clone();
        far.machine_id = "0".repeat(32);
        let now = far.renewed_unix_ms;
        assert_eq!(stale_reason(&far, &me, now + 170_000), None);
        assert!(stale_reason(&far, &me, now + 181_000).unwrap().contains("not renewed"));
    }
}
