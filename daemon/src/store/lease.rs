//! Ownership of the host name in the database (FORMAT.md §2.1): who this daemon is, and
//! whether the holder of an existing lease is still alive.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use profile_format::{Database, Lease};

use super::{create_database, Store, StoreConfig, StoreError};

/// A lease not renewed for this many of its owner's intervals is stale (the owner is on
/// another machine, so its pid cannot be checked).
pub(super) const STALE_AFTER_INTERVALS: u64 = 3;
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

/// This daemon's lease on its host name (FORMAT.md §2.1).
#[derive(Default)]
pub(super) struct LeaseState {
    /// Held and renewed.
    pub(super) mine: Option<Lease>,
    /// `take_lease` was asked for: retried at each tick while the database is unavailable.
    pub(super) wanted: bool,
    pub(super) last_renew: Option<Instant>,
    /// Taken over by another daemon: publishing stops.
    pub(super) lost_to: Option<String>,
}

impl Store {
    /// Take the lease on this host name in the database (FORMAT.md §2.1), or fail with
    /// [`StoreError::LeaseHeld`] naming the live daemon that holds it. A stale lease (its
    /// owner dead on this machine, or not renewed for several of its intervals) is taken over,
    /// and that is logged. Other failures (the database unavailable now) are returned too;
    /// the store then keeps trying at each tick.
    pub fn take_lease(&mut self) -> Result<(), StoreError> {
        self.lease.wanted = true;
        let mut aside = Vec::new();
        let db = create_database(&self.cfg.db, &mut |p, why| aside.push((p.to_path_buf(), why)));
        for (p, why) in aside {
            self.note_set_aside(&p, &why);
        }
        let db = db?;
        let interval_ms = self.cfg.publish_interval.as_millis().min(u128::from(u64::MAX)) as u64;
        let me = mine(&self.cfg.host, interval_ms);
        let path = db.lease_path(&self.cfg.host)?;
        // A few rounds: another daemon may create or take over the lease between our read and
        // our write; the round after sees it.
        for _ in 0..3 {
            let held = match db.read_lease(&self.cfg.host) {
                Ok(h) => h,
                Err(e @ profile_format::Error::Io { .. }) => return Err(e.into()),
                Err(profile_format::Error::NotDirectory { path: dir, kind }) => {
                    // `leases/` is a link (or a file): never written through; a fresh one is
                    // made in its place by `create_lease`.
                    self.set_aside_entry(
                        &dir,
                        &format!("is {kind}, not a directory"),
                        "leases directory",
                    );
                    None
                }
                Err(e) => {
                    // Not a lease (corrupt, a FIFO, a link, ...): nobody can prove ownership
                    // with it. Read without following a link nor blocking on a FIFO (safeio).
                    self.set_aside_entry(&path, &e, "lease file");
                    None
                }
            };
            match held {
                None => {
                    if db.create_lease(&me)? {
                        tracing::info!(lease = %path.display(), "store: took the lease on this host name");
                        return self.hold_lease(me);
                    }
                }
                Some(h) if profile_format::same_owner(&h, &me) => return self.hold_lease(me),
                Some(h) => match stale_reason(&h, &me, unix_ms_now()) {
                    None => {
                        return Err(StoreError::LeaseHeld {
                            host: self.cfg.host.clone(),
                            db: self.cfg.db.clone(),
                            owner: describe(&h, unix_ms_now()),
                            lease: path,
                        })
                    }
                    Some(why) => {
                        tracing::warn!(lease = %path.display(), previous_owner = %h, reason = %why,
                            "store: taking over a stale lease on this host name");
                        db.write_lease(&me)?;
                        if db
                            .read_lease(&self.cfg.host)?
                            .is_some_and(|l| profile_format::same_owner(&l, &me))
                        {
                            return self.hold_lease(me);
                        }
                    }
                },
            }
        }
        Err(StoreError::LeaseHeld {
            host: self.cfg.host.clone(),
            db: self.cfg.db.clone(),
            owner: "another daemon taking it at the same time".into(),
            lease: path,
        })
    }

    /// Whether the host name is free to take, without creating or changing anything: for the
    /// daemon's start, before any thread runs. `Err(LeaseHeld)` if a live daemon holds it;
    /// `Ok` otherwise (no database yet, no lease, a stale or unreadable one: [`Store::take_lease`]
    /// decides those for real).
    pub fn check_lease_free(cfg: &StoreConfig) -> Result<(), StoreError> {
        let Ok(db) = Database::open(&cfg.db) else { return Ok(()) };
        let Ok(Some(held)) = db.read_lease(&cfg.host) else { return Ok(()) };
        let me = mine(&cfg.host, 0);
        if profile_format::same_owner(&held, &me)
            || stale_reason(&held, &me, unix_ms_now()).is_some()
        {
            return Ok(());
        }
        Err(StoreError::LeaseHeld {
            host: cfg.host.clone(),
            db: cfg.db.clone(),
            owner: describe(&held, unix_ms_now()),
            lease: db.lease_path(&cfg.host)?,
        })
    }

    pub(super) fn hold_lease(&mut self, me: Lease) -> Result<(), StoreError> {
        self.lease.mine = Some(me);
        self.lease.last_renew = Some(Instant::now());
        self.lease.lost_to = None;
        Ok(())
    }

    /// Give the lease up (a clean stop), so that a successor need not wait for it to go stale.
    pub fn release_lease(&mut self) {
        let Some(me) = self.lease.mine.take() else { return };
        self.lease.wanted = false;
        if let Some(db) = &self.db {
            if let Err(e) = db.release_lease(&me) {
                tracing::warn!(error = %e, "store: could not release the lease on this host name");
            }
        }
    }

    /// Renew the lease once per publish interval (`force`: now), first checking that it is
    /// still ours: if another daemon took it over, stop publishing. Retake it while wanted
    /// but not yet held (the database was unavailable at start).
    pub(super) fn renew_lease(&mut self, now: Instant, force: bool) {
        if self.lease.lost_to.is_some() || self.db.is_none() {
            return;
        }
        let Some(mine) = self.lease.mine.clone() else {
            if self.lease.wanted {
                match self.take_lease() {
                    Ok(()) => {}
                    Err(StoreError::LeaseHeld { owner, .. }) => self.lose_lease(owner),
                    Err(e) => self.set_db_error(&e),
                }
            }
            return;
        };
        let due = self
            .lease
            .last_renew
            .is_none_or(|t| now.saturating_duration_since(t) >= self.cfg.publish_interval);
        if !due && !force {
            return;
        }
        let Some(db) = self.db.clone() else { return };
        let r = db.read_lease(&self.cfg.host).map_err(StoreError::from).and_then(|held| {
            if let Some(h) = held.filter(|h| !profile_format::same_owner(h, &mine)) {
                return Ok(Some(h));
            }
            let mut renewed = mine.clone();
            renewed.renewed_unix_ms = unix_ms_now();
            db.write_lease(&renewed)?;
            self.lease.mine = Some(renewed);
            Ok(None)
        });
        match r {
            Ok(None) => self.lease.last_renew = Some(now),
            Ok(Some(other)) => self.lose_lease(describe(&other, unix_ms_now())),
            Err(e) => self.set_db_error(&e),
        }
    }

    pub(super) fn lose_lease(&mut self, owner: String) {
        tracing::error!(host = %self.cfg.host, owner = %owner,
            "store: another daemon holds this host name now; publishing stops, data stays in the spool");
        self.lease.mine = None;
        self.lease.lost_to = Some(owner);
    }

    /// `Err` if the lease on the host name was lost: nothing may be written into its
    /// directories any more.
    pub(super) fn check_lease(&self) -> Result<(), StoreError> {
        match &self.lease.lost_to {
            Some(owner) => {
                Err(StoreError::LeaseLost { host: self.cfg.host.clone(), owner: owner.clone() })
            }
            None => Ok(()),
        }
    }
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
