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

/// A process's start time in clock ticks since boot (`/proc/PID/stat` field 22); `None` if
/// there is no such process.
fn pid_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
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
