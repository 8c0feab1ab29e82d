//! The store's epochs: the current one, starting one, following another host's.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use profile_format::{Database, EpochId};

use super::{create_database, Busy, Store, StoreError};

impl Store {
    pub fn current_epoch(&self) -> Option<&EpochId> {
        self.epoch.as_ref()
    }

    /// Close the current epoch with everything flushed into it and start a new one.
    pub fn new_epoch(&mut self) -> Result<EpochId, StoreError> {
        self.flush_everything()?;
        let _busy = Busy::mark(Arc::clone(&self.busy_since));
        let db = self.db.as_ref().ok_or_else(|| StoreError::NoDatabase(self.cfg.db.clone()))?;
        let e = db.new_epoch(SystemTime::now(), &self.cfg.host)?;
        tracing::info!(epoch = %e, "store: started a new epoch");
        self.epoch = Some(e.clone());
        self.epoch_changed();
        self.kallsyms_due();
        self.write_side_files(Instant::now(), true);
        Ok(e)
    }

    /// Follow a new epoch started elsewhere: everything collected so far belongs to the old one.
    pub(super) fn follow_epoch(&mut self, now: Instant) {
        let Some(db) = &self.db else { return };
        // One stat per flush instead of a listing: the epochs directory changes when an epoch
        // starts or goes away, and a listing is reused only while it stays the same.
        let stamp = db.epochs_stamp();
        let newest = match (stamp, &self.epochs_seen) {
            (Some(s), Some((seen, e))) if s == *seen => e.clone(),
            _ => {
                let listed_at = SystemTime::now();
                match db.current_epoch_settled() {
                    Ok((n, settled)) => {
                        self.epochs_seen = stamp
                            .filter(|s| settled && s.settled_at(listed_at))
                            .map(|s| (s, n.clone()));
                        n
                    }
                    Err(e) => {
                        self.epochs_seen = None;
                        self.set_db_error(&e);
                        return;
                    }
                }
            }
        };
        let Some(old) = self.epoch.clone() else {
            self.epoch = newest;
            return;
        };
        let Some(newest) = newest.filter(|n| *n >= old) else {
            // Our epoch was current, so it had its marker: the database (or this epoch's
            // directory) was removed while we ran.
            self.restore_layout(&old);
            return;
        };
        if newest == old {
            return;
        }
        self.spool_pending(now, true);
        if let Err(e) = self.publish_all(now, Some(old.as_str()), super::Upto::Mark) {
            tracing::warn!(error = %e, epoch = %old, "store: could not publish all of the closing epoch yet; will retry");
        }
        self.write_side_files(now, true);
        tracing::info!(old = %old, new = %newest, "store: following a new epoch");
        self.epoch = Some(newest);
        self.epoch_changed();
        self.kallsyms_due();
    }

    /// A new epoch is current: retention's answer changes with the set of epochs, so the next
    /// tick applies it rather than within the hour (with scheduled epochs shorter than that,
    /// old ones would otherwise pile up in between).
    fn epoch_changed(&mut self) {
        self.last_retention = None;
    }

    /// The database, or the current epoch's directory, vanished (removed by hand, a wiped
    /// NFS export): recreate the whole layout, not just this host's directory: `epochs/`, the
    /// epoch with its `EPOCH` marker (without it no reader sees the epoch as current), and,
    /// by the following writes, the kernel symbol snapshot and its reference, the summary and
    /// the lease. What was published before is gone; what the spool holds is published again.
    pub(super) fn restore_layout(&mut self, epoch: &EpochId) {
        let mut aside = Vec::new();
        let mut r = create_database(&self.cfg.db, &mut |p, why| aside.push((p.to_path_buf(), why)))
            .and_then(|db| {
                let created = db.ensure_epoch(epoch, &self.cfg.host)?;
                Ok((db, created))
            });
        for (p, why) in aside {
            self.note_set_aside(&p, &why);
        }
        // A link (or anything but a directory) in place of `epochs/` or the epoch's directory:
        // set aside, never written through (FORMAT.md §6.1), and the layout made afresh.
        for _ in 0..2 {
            let Err(profile_format::Error::NotDirectory { path, kind }) = &r else { break };
            let (path, why) = (path.clone(), format!("is {kind}, not a directory"));
            self.set_aside_entry(&path, &why, "database directory");
            self.created_dirs.clear();
            r = Database::create(&self.cfg.db).and_then(|db| {
                let created = db.ensure_epoch(epoch, &self.cfg.host)?;
                Ok((db, created))
            });
        }
        match r {
            Ok((db, created)) => {
                if created {
                    tracing::warn!(db = %self.cfg.db.display(), epoch = %epoch,
                        "store: the database or the current epoch was removed; recreated its layout");
                }
                self.db = Some(db);
                self.created_dirs.clear();
                self.kernel.written = None;
                self.summaries.dirty.insert(epoch.to_string());
                // Every profile of the epoch must be written again from the cumulative state:
                // not possible for what was published, but the next writes start fresh files.
            }
            Err(e) => self.set_db_error(&e),
        }
    }
}
