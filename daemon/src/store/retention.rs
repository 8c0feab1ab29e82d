//! Retention: removing old epochs from the database.

use std::time::{Duration, Instant, SystemTime};

use profile_format::EpochId;

use super::{Store, StoreError};

impl Store {
    /// Apply retention now: remove this host's directories of epochs older than
    /// `retention_days`, always keeping the newest `retention_keep` epochs and the current one.
    /// Returns the epochs this host's directory was removed from.
    pub fn apply_retention(&mut self, now: SystemTime) -> Result<Vec<EpochId>, StoreError> {
        let db = self.db.as_ref().ok_or_else(|| StoreError::NoDatabase(self.cfg.db.clone()))?;
        let epochs = db.epochs()?;
        let keep_from = epochs.len().saturating_sub(self.cfg.retention_keep);
        let max_age = Duration::from_secs(u64::from(self.cfg.retention_days) * 86400);
        let mut removed = Vec::new();
        for (i, e) in epochs.iter().enumerate() {
            if i >= keep_from || Some(e) == self.epoch.as_ref() {
                continue;
            }
            let old = now.duration_since(e.start_time()).map(|age| age > max_age).unwrap_or(false);
            if !old {
                continue;
            }
            let hosts = db.hosts(e)?;
            if hosts.is_empty() {
                // An epoch no host wrote into (started, then every daemon stopped or moved on
                // before writing; with scheduled epochs, one per boundary): nobody's
                // directory to remove, so any host removes the marker and the directory
                // (FORMAT.md §9), or no retention ever would.
                db.remove_host_epoch(e, &self.cfg.host)?;
                if !db.epoch_dir(e).exists() {
                    tracing::info!(epoch = %e, "store: retention removed an epoch without data");
                }
                continue;
            }
            if !hosts.iter().any(|h| h == &self.cfg.host) {
                continue;
            }
            db.remove_host_epoch(e, &self.cfg.host)?;
            tracing::info!(epoch = %e, "store: retention removed this host's directory");
            if let Some(sp) = self.spool.as_mut() {
                sp.forget_epoch(e.as_str());
            }
            self.schedule.forget_epoch(e.as_str());
            self.sole.forget_epoch(e.as_str());
            self.summaries.current.remove(e.as_str());
            self.summaries.dirty.remove(e.as_str());
            removed.push(e.clone());
        }
        self.write_marks(Instant::now());
        // Snapshots no epoch references any more (of any host); young ones may be about to be
        // referenced by a host that has just stored them.
        let gc = self.db.as_ref().map(|db| db.gc_kallsyms(now, Duration::from_secs(3600)));
        match gc.unwrap_or(Ok(Vec::new())) {
            Ok(ids) if !ids.is_empty() => {
                tracing::info!(
                    snapshots = ids.len(),
                    "store: retention removed unreferenced kernel symbol snapshots"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "store: kernel symbol snapshot retention failed"),
        }
        // Symbol tables of builds no profile of any host and epoch names any more (the same
        // age guard: a table is stored shortly before its profile is published).
        let gc = self.db.as_ref().map(|db| db.gc_symtabs(now, Duration::from_secs(3600)));
        match gc.unwrap_or(Ok(Vec::new())) {
            Ok(ids) if !ids.is_empty() => {
                tracing::info!(
                    tables = ids.len(),
                    "store: retention removed unreferenced symbol tables"
                )
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "store: symbol table retention failed"),
        }
        Ok(removed)
    }

    pub(super) fn maybe_retention(&mut self, now: Instant) {
        if self
            .last_retention
            .is_some_and(|t| now.saturating_duration_since(t) < Duration::from_secs(3600))
        {
            return;
        }
        if self.db.is_none() {
            return;
        }
        self.last_retention = Some(now);
        if let Err(e) = self.apply_retention(SystemTime::now()) {
            tracing::warn!(error = %e, "store: retention failed; will retry in an hour");
        }
    }
}
