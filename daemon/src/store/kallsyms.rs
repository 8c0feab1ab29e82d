//! The kernel symbol snapshot each epoch references, refreshed when the modules change.

use std::path::Path;

use profile_format::{EpochId, KallsymsSnapshot};

use super::{Store, StoreError};

/// Where fresh kernel symbol snapshots come from (the daemon: /proc; tests: a fake).
pub trait KernelSymbolSource: Send {
    /// Cheap, read at each tick: changes when a snapshot would (the daemon: the content of
    /// /proc/modules, so that a module loaded or unloaded is noticed within one flush).
    fn fingerprint(&mut self) -> Option<Vec<u8>>;
    /// A fresh snapshot (reads several MB: only when the fingerprint changed, or an epoch
    /// starts).
    fn snapshot(&mut self) -> Result<KallsymsSnapshot, String>;
    /// A fresh snapshot as the bytes of its `kallsyms.snap`, which is all the store keeps.
    /// The default encodes [`Self::snapshot`]; the daemon's source builds the bytes without
    /// the decoded snapshot, which was most of its peak RSS (issue 13).
    fn snapshot_file_bytes(&mut self) -> Result<Vec<u8>, String> {
        self.snapshot()?
            .to_file_bytes(Path::new("kallsyms.snap"))
            .map_err(|e| format!("kallsyms snapshot not kept: {e}"))
    }
}

/// The kernel symbol snapshot to reference from each epoch.
#[derive(Default)]
pub(super) struct KernelSymbols {
    /// The encoded `kallsyms.snap`: a fraction of the decoded snapshot's memory.
    pub(super) encoded: Option<Vec<u8>>,
    /// The epoch whose host directory references `encoded` (re-referenced when it changes).
    pub(super) written: Option<EpochId>,
    pub(super) source: Option<Box<dyn KernelSymbolSource>>,
    pub(super) fingerprint: Option<Vec<u8>>,
    /// Snapshots taken after the first one, and how many of them were new content.
    pub(super) refreshes: u64,
    pub(super) changed: u64,
    pub(super) refresh_failing: bool,
    /// A fresh snapshot is owed to the current epoch (it started since the last one).
    pub(super) due: bool,
}

impl Store {
    /// Where to take fresh kernel symbol snapshots from: one is taken now, again when the
    /// source's fingerprint changes (a module loaded or unloaded; checked at each tick) and
    /// at the first tick after an epoch starts ([`Self::kallsyms_due`]). Each is stored only if its content is new (FORMAT.md §8.1).
    pub fn set_kallsyms_source(&mut self, mut source: Box<dyn KernelSymbolSource>) {
        self.kernel.fingerprint = source.fingerprint();
        match source.snapshot_file_bytes() {
            Ok(bytes) => self.set_kallsyms_bytes(bytes),
            Err(e) => {
                tracing::warn!(error = %e, "no kallsyms snapshot; kernel samples will not be symbolized")
            }
        }
        self.kernel.source = Some(source);
    }

    /// Take a fresh snapshot if `force`, [`Self::kallsyms_due`] or the source's fingerprint
    /// changed; the current epoch references it from then on.
    pub(super) fn refresh_kallsyms(&mut self, force: bool) {
        let Some(source) = self.kernel.source.as_mut() else { return };
        let fp = source.fingerprint();
        let force = force || std::mem::take(&mut self.kernel.due);
        if !force && fp == self.kernel.fingerprint {
            return;
        }
        let bytes = match source.snapshot_file_bytes() {
            Ok(s) => s,
            Err(e) => {
                // Keep the old one; retried at each tick, logged once until it works again.
                if !self.kernel.refresh_failing {
                    tracing::warn!(error = %e, "store: could not refresh the kallsyms snapshot; keeping the previous one");
                    self.kernel.refresh_failing = true;
                }
                return;
            }
        };
        if std::mem::take(&mut self.kernel.refresh_failing) {
            tracing::info!("store: kallsyms snapshot refreshed again");
        }
        self.kernel.fingerprint = fp;
        self.kernel.refreshes += 1;
        let old = self.kernel.encoded.take();
        let old_written = self.kernel.written.take();
        self.set_kallsyms_bytes(bytes);
        if self.kernel.encoded == old {
            // Same content: the epoch that references it already need not be written again.
            self.kernel.written = old_written;
        } else {
            self.kernel.changed += 1;
            tracing::info!(
                "store: kernel symbols changed; new kallsyms snapshot for the current epoch"
            );
        }
    }

    /// The kernel symbol snapshot: stored once per database, referenced from each epoch's
    /// host directory.
    pub fn set_kallsyms(&mut self, snap: KallsymsSnapshot) {
        match snap.to_file_bytes(Path::new("kallsyms.snap")) {
            Ok(b) => self.set_kallsyms_bytes(b),
            Err(e) => {
                tracing::warn!(error = %e, "kallsyms snapshot not kept; kernel samples will not be symbolized");
                self.kernel.encoded = None;
                self.kernel.written = None;
            }
        }
    }

    /// A new epoch is current: it references the snapshot in hand at once, and the next tick
    /// (or flush) takes a fresh one, which replaces the reference if its content differs (BPF
    /// programs and ftrace trampolines change /proc/kallsyms without a module change). Not
    /// taken by the epoch change itself: reading and sorting /proc/kallsyms (several MB) was
    /// half of what `dcpictl epoch new` waited for under the store lock (debug build at load
    /// 13: 3 of 7 s), and under heavier load the command ran past its 20 s bound and was
    /// refused ("store is busy") while it finished.
    pub(super) fn kallsyms_due(&mut self) {
        self.kernel.due = true;
    }

    /// [`Self::set_kallsyms`] with the snapshot already encoded (`kallsyms.snap`'s bytes).
    pub(super) fn set_kallsyms_bytes(&mut self, mut bytes: Vec<u8>) {
        bytes.shrink_to_fit();
        self.kernel.encoded = Some(bytes);
        self.kernel.written = None;
    }

    /// The kallsyms snapshot of the current epoch, if not written yet.
    pub(super) fn write_kallsyms(&mut self) {
        let Some(epoch) = self.epoch.clone() else { return };
        if self.kernel.encoded.is_none() || self.kernel.written.as_ref() == Some(&epoch) {
            return;
        }
        // Stored once per database under its content id (a stat when it is there already),
        // then referenced from this epoch's host directory.
        let r = self.host_dir(&epoch).and_then(|hd| {
            let db = self.db.as_ref().ok_or_else(|| StoreError::NoDatabase(self.cfg.db.clone()))?;
            let bytes = self.kernel.encoded.as_deref().unwrap_or_default();
            let (id, stored) = db.put_kallsyms(bytes)?;
            Ok(stored + hd.write_kallsyms_ref(&id)?)
        });
        match r {
            Ok(n) => {
                self.health.bytes.kallsyms += n;
                self.kernel.written = Some(epoch);
            }
            // `kallsyms/` is a link (or a file): set aside, never written through (FORMAT.md
            // §6.1); the next tick stores the snapshot in a real directory.
            Err(StoreError::Db(profile_format::Error::NotDirectory { path, kind })) => {
                let why = format!("is {kind}, not a directory");
                self.set_aside_entry(&path, &why, "database directory");
            }
            Err(e) => self.set_db_error(&e),
        }
    }
}
