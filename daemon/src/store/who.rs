//! The who table of each epoch (FORMAT.md §12): counts from the resolved batches, held in
//! memory and merged into `<host dir>/who.tbl` whenever the epoch's summary is written (at most
//! once per publish interval, and at every flush).
//!
//! Unlike profiles, these counts do not go through the spool: a crash loses the counts of
//! the last publish interval from the who table (the profiles keep them). That keeps the
//! spool format unchanged; the table is a breakdown of the profiles, not their record.

use std::collections::BTreeMap;

use profile_format::{EpochId, ThreadKey, WhoKey, WhoTable};

use super::{Store, StoreError};
use crate::who::WhoBatch;

/// Rows held per epoch before the oldest counts are dropped (the database being unwritable
/// for a long time): ~100 bytes each.
const MAX_ROWS: usize = 1_000_000;

/// Which qualified profiles (FORMAT.md §5.6) the store writes beside the flat ones.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WhoProfiles {
    /// One profile per (image, event, process) (`by_pid`).
    pub by_pid: bool,
    /// One profile per (image, event, cgroup) (`by_cgroup`).
    pub by_cgroup: bool,
    /// One profile per (image, event, command) (`by_command`, on by default).
    pub by_command: bool,
}

impl WhoProfiles {
    /// Whether any qualified profile is written: the aggregator must then keep each batch's
    /// profiles per process ([`crate::aggregate::Aggregator::set_who_profiles`]).
    pub fn any(self) -> bool {
        self.by_pid || self.by_cgroup || self.by_command
    }
}

/// Who counts not yet written, per epoch.
#[derive(Debug, Default)]
pub(super) struct WhoAccum {
    /// Qualified profiles to make from the batches' per-process profiles.
    pub profiles: WhoProfiles,
    /// Keep the pid in rows (`by_pid`); otherwise rows are per (cgroup, command, image, event).
    by_pid: bool,
    tables: BTreeMap<String, WhoTable>,
    dropped_logged: bool,
}

impl Store {
    /// `by_pid`: keep one row per process in the who table (reports `--by pid`).
    pub fn set_who_by_pid(&mut self, on: bool) {
        self.who.by_pid = on;
    }

    /// Per-process (`by_pid`) and per-cgroup (`by_cgroup`) profiles beside the flat ones, from
    /// the batches' [`crate::aggregate::Resolved::pid_profiles`] (the aggregator makes them
    /// when [`crate::aggregate::Aggregator::set_who_profiles`] is on).
    pub fn set_who_profiles(&mut self, p: WhoProfiles) {
        self.who.profiles = p;
    }

    /// Take a batch's who counts into the current epoch's table.
    pub(super) fn who_add(&mut self, b: &WhoBatch) {
        let Some(epoch) = self.epoch.as_ref().map(ToString::to_string) else { return };
        if b.cpus.is_empty() && b.user.is_empty() && b.kernel.is_empty() {
            return;
        }
        // The table is written with the epoch's summary: make sure one is due.
        self.summaries.dirty.insert(epoch.clone());
        let by_pid = self.who.by_pid;
        let events: Vec<String> = self.host.events.iter().map(|e| e.desc.name.clone()).collect();
        let t = self
            .who
            .tables
            .entry(epoch.clone())
            .or_insert_with(|| WhoTable::new(&self.cfg.host, &epoch));
        if t.rows.len() > MAX_ROWS {
            if !self.who.dropped_logged {
                tracing::warn!(epoch, "store: who table not written for long; dropping new counts");
                self.who.dropped_logged = true;
            }
            return;
        }
        for (pid, image, ev, n) in b.rows() {
            let Some(event) = events.get(usize::from(ev)) else { continue };
            let key = WhoKey {
                cgroup: b.cgroup(pid),
                command: b.command(pid),
                pid: if by_pid || pid == 0 { pid } else { 0 },
                image,
                event: event.clone(),
            };
            t.add(key, n);
        }
        for (&(cpu, ev), &n) in &b.cpus {
            if let Some(event) = events.get(usize::from(ev)) {
                t.add_cpu(cpu, event, n);
            }
        }
        // Threads named apart from their command: a second level of its rows (version 2).
        for (pid, thread, ev, n) in b.thread_rows() {
            let Some(event) = events.get(usize::from(ev)) else { continue };
            let key = ThreadKey {
                cgroup: b.cgroup(pid),
                command: b.command(pid),
                pid: if by_pid { pid } else { 0 },
                thread,
                event: event.clone(),
            };
            t.add_thread(key, n);
        }
    }

    /// Merge the held counts of `epoch` into its `who.tbl` (a file that cannot be read is set
    /// aside as `.corrupt`, like a profile). Returns the bytes written.
    pub(super) fn write_who(&mut self, epoch: &EpochId) -> Result<u64, StoreError> {
        if self.who.tables.get(epoch.as_str()).is_none_or(WhoTable::is_empty) {
            return Ok(0);
        }
        let hd = self.host_dir(epoch)?;
        let path = hd.who_path();
        let mut table = match WhoTable::read(&path) {
            Ok(t) => t,
            Err(profile_format::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                WhoTable::new(&self.cfg.host, epoch.as_str())
            }
            Err(e) => {
                self.set_aside(&path, &e);
                WhoTable::new(&self.cfg.host, epoch.as_str())
            }
        };
        if let Some(held) = self.who.tables.get(epoch.as_str()) {
            table.merge(held);
        }
        let n = table.write(&path)?;
        self.who.tables.remove(epoch.as_str());
        self.who.dropped_logged = false;
        Ok(n)
    }
}
