//! Host leases (FORMAT.md §2.1): which daemon owns a host name in the database. Two daemons
//! writing one host's directories would each publish profiles that the other then overwrites
//! (a profile is read, merged and replaced whole), silently losing samples.
//!
//! This module only reads and writes the lease file; whether a lease is still live (its owner
//! alive) is the daemon's judgement.

use std::fs;
use std::io::ErrorKind;
use std::path::PathBuf;

use crate::atomic::{sync_dir, write_atomic, write_new};
use crate::db::Database;
use crate::error::{Error, Result};
use crate::ident::validate_host_name;
use crate::safeio;
use crate::safeio::MAX_SMALL_FILE;
use crate::safeio::{check_dir, ensure_dir};

/// Directory of the lease files, under the database root.
pub const LEASES_DIR: &str = "leases";
const LEASE_MAGIC: &str = "dcpi-lease";
/// Version of the lease file written by this build.
pub const LEASE_VERSION: u32 = 1;

/// Who holds a host name, and since when.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct Lease {
    pub host: String,
    /// `/etc/machine-id` of the owner (32 hex digits; empty if unknown).
    pub machine_id: String,
    /// `/proc/sys/kernel/random/boot_id` of the owner when it took the lease.
    pub boot_id: String,
    pub pid: u32,
    /// The owner process's start time in clock ticks since boot (`/proc/PID/stat` field 22),
    /// so that a reused pid is not taken for the owner.
    pub pid_start: u64,
    /// The system host name of the owner (for humans).
    pub hostname: String,
    /// Unix milliseconds: when the owner took the lease, and when it last renewed it.
    pub start_unix_ms: u64,
    pub renewed_unix_ms: u64,
    /// The owner's renewal interval (its publish interval), in milliseconds: a lease not
    /// renewed for several of them is stale.
    pub interval_ms: u64,
}

impl std::fmt::Display for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "dcpid pid {} on {} (machine-id {}, boot-id {})",
            self.pid,
            if self.hostname.is_empty() { "?" } else { &self.hostname },
            if self.machine_id.is_empty() { "?" } else { &self.machine_id },
            if self.boot_id.is_empty() { "?" } else { &self.boot_id },
        )
    }
}

fn one_line(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(256).collect()
}

impl Lease {
    fn encode(&self) -> String {
        format!(
            "{LEASE_MAGIC} {LEASE_VERSION}\nhost {}\nmachine_id {}\nboot_id {}\npid {}\n\
             pid_start {}\nhostname {}\nstart_unix_ms {}\nrenewed_unix_ms {}\ninterval_ms {}\n",
            one_line(&self.host),
            one_line(&self.machine_id),
            one_line(&self.boot_id),
            self.pid,
            self.pid_start,
            one_line(&self.hostname),
            self.start_unix_ms,
            self.renewed_unix_ms,
            self.interval_ms,
        )
    }

    fn decode(text: &str, path: &std::path::Path) -> Result<Self> {
        let corrupt = |field: &'static str, detail: String| Error::Corrupt {
            path: path.into(),
            field,
            detail,
        };
        let mut lines = text.lines();
        let version = lines
            .next()
            .and_then(|l| l.strip_prefix(LEASE_MAGIC))
            .and_then(|v| v.trim().parse::<u32>().ok())
            .ok_or_else(|| corrupt("magic", format!("first line is not `{LEASE_MAGIC} N`")))?;
        if version == 0 || version > LEASE_VERSION {
            return Err(Error::UnknownVersion {
                path: path.into(),
                version: u16::try_from(version).unwrap_or(u16::MAX),
                supported: LEASE_VERSION as u16,
            });
        }
        let mut l = Self::default();
        let num = |field: &'static str, v: &str| {
            v.parse::<u64>().map_err(|e| corrupt(field, format!("{v:?}: {e}")))
        };
        for line in lines {
            let (k, v) = line.split_once(' ').unwrap_or((line, ""));
            match k {
                "host" => l.host = v.to_owned(),
                "machine_id" => l.machine_id = v.to_owned(),
                "boot_id" => l.boot_id = v.to_owned(),
                "pid" => {
                    l.pid = u32::try_from(num("pid", v)?)
                        .map_err(|_| corrupt("pid", format!("{v} exceeds 32 bits")))?
                }
                "pid_start" => l.pid_start = num("pid_start", v)?,
                "hostname" => l.hostname = v.to_owned(),
                "start_unix_ms" => l.start_unix_ms = num("start_unix_ms", v)?,
                "renewed_unix_ms" => l.renewed_unix_ms = num("renewed_unix_ms", v)?,
                "interval_ms" => l.interval_ms = num("interval_ms", v)?,
                // Later versions may add fields.
                _ => {}
            }
        }
        Ok(l)
    }
}

impl Database {
    /// Path of `host`'s lease file: `<db>/leases/<host>.lease`.
    pub fn lease_path(&self, host: &str) -> Result<PathBuf> {
        validate_host_name(host)?;
        Ok(self.root().join(LEASES_DIR).join(format!("{host}.lease")))
    }

    /// `leases/`, created if missing; `NotDirectory` if it is a link or anything but a
    /// directory (FORMAT.md §6.1).
    fn leases_dir(&self) -> Result<PathBuf> {
        let dir = self.root().join(LEASES_DIR);
        ensure_dir(&dir)?;
        Ok(dir)
    }

    /// The lease on `host`, `None` if there is none. The file is opened without following a
    /// link and without blocking on a FIFO: anything but a regular file is `NotRegularFile`
    /// (and `leases/` itself must be a directory: `NotDirectory`).
    pub fn read_lease(&self, host: &str) -> Result<Option<Lease>> {
        let path = self.lease_path(host)?;
        if !check_dir(&self.root().join(LEASES_DIR))? {
            return Ok(None);
        }
        match safeio::read_small_string(&path, MAX_SMALL_FILE) {
            Ok(t) => Lease::decode(&t, &path).map(Some),
            Err(Error::Io { source, .. }) if source.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Take the lease on `lease.host` if nobody holds it: `Ok(false)` if a lease file exists
    /// (created meanwhile by another daemon). Atomic on NFS too (a hard link of a complete
    /// temporary file, which fails if the name exists).
    pub fn create_lease(&self, lease: &Lease) -> Result<bool> {
        let path = self.lease_path(&lease.host)?;
        let dir = self.leases_dir()?;
        let created = write_new(&path, lease.encode().as_bytes())?;
        if created {
            sync_dir(&dir)?;
        }
        Ok(created)
    }

    /// Replace the lease on `lease.host` (renewal by its owner, or the takeover of a stale
    /// lease), atomically.
    pub fn write_lease(&self, lease: &Lease) -> Result<()> {
        let path = self.lease_path(&lease.host)?;
        self.leases_dir()?;
        write_atomic(&path, lease.encode().as_bytes())
    }

    /// Remove the lease on `host` (a clean stop), if it is still `owner`'s.
    pub fn release_lease(&self, owner: &Lease) -> Result<()> {
        // `read_lease` checked that `leases/` is a directory.
        if self.read_lease(&owner.host)?.is_some_and(|l| same_owner(&l, owner)) {
            let path = self.lease_path(&owner.host)?;
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(path, e)),
            }
        }
        Ok(())
    }
}

/// Whether two leases name the same owner process (not the same renewal).
pub fn same_owner(a: &Lease, b: &Lease) -> bool {
    a.machine_id == b.machine_id
        && a.boot_id == b.boot_id
        && a.pid == b.pid
        && a.pid_start == b.pid_start
        && a.start_unix_ms == b.start_unix_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(pid: u32) -> Lease {
        Lease {
            host: "web-01.dc1".into(),
            machine_id: "3d1219c7c4c5404aaa1f6d2a48adfda4".into(),
            boot_id: "e9403269-0132-48a0-93e4-237f707d4b4c".into(),
            pid,
            pid_start: 77,
            hostname: "web-01.dc1".into(),
            start_unix_ms: 1_700_000_000_000,
            renewed_unix_ms: 1_700_000_060_000,
            interval_ms: 60_000,
        }
    }

    #[test]
    fn create_once_replace_release() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path()).unwrap();
        assert_eq!(db.read_lease("web-01.dc1").unwrap(), None);
        assert!(db.create_lease(&lease(1)).unwrap());
        assert!(!db.create_lease(&lease(2)).unwrap(), "a second creation fails");
        assert_eq!(db.read_lease("web-01.dc1").unwrap(), Some(lease(1)));
        db.write_lease(&lease(2)).unwrap();
        assert_eq!(db.read_lease("web-01.dc1").unwrap(), Some(lease(2)));
        db.release_lease(&lease(1)).unwrap();
        assert!(db.read_lease("web-01.dc1").unwrap().is_some(), "not released by another");
        db.release_lease(&lease(2)).unwrap();
        assert_eq!(db.read_lease("web-01.dc1").unwrap(), None);
        let names: Vec<_> = fs::read_dir(dir.path().join(LEASES_DIR)).unwrap().collect();
        assert!(names.is_empty(), "no temporary left: {names:?}");
        std::fs::write(db.lease_path("x").unwrap(), "garbage").unwrap();
        let e = db.read_lease("x").unwrap_err().to_string();
        assert!(e.contains("x.lease") && e.contains("magic"), "{e}");
    }
}
