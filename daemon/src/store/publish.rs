//! Publishing one profile: when its turn comes ([`Schedule`]), where it goes ([`Target`]), and
//! merging its spooled increments into the published file exactly once.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use profile_format::{EpochId, HostDir, ImageId, ImageKind, Profile, ProfileHeader};

use super::spool::{Spool, SpoolError, SpoolKey, SpooledIncrement};

/// Profiles with unpublished increments and when each one's turn comes.
#[derive(Default)]
pub(super) struct Schedule {
    dirty: BTreeMap<SpoolKey, Instant>,
    last_published: HashMap<SpoolKey, Instant>,
}

impl Schedule {
    /// A profile changed: its turn is one publish interval after its last publication, or at
    /// a stable per-profile phase within the interval if it was never published.
    pub fn mark(&mut self, key: SpoolKey, now: Instant, interval: Duration) {
        if self.dirty.contains_key(&key) {
            return;
        }
        let due = match self.last_published.get(&key) {
            Some(t) => (*t + interval).max(now),
            None => {
                let mut h = std::collections::hash_map::DefaultHasher::new();
                key.hash(&mut h);
                let ms = interval.as_millis().max(1) as u64;
                now + Duration::from_millis(h.finish() % ms)
            }
        };
        self.dirty.insert(key, due);
    }

    /// Up to `cap` profiles whose turn has come, oldest turn first.
    pub fn due(&self, now: Instant, cap: usize) -> Vec<SpoolKey> {
        let mut due: Vec<(Instant, &SpoolKey)> =
            self.dirty.iter().filter(|(_, d)| **d <= now).map(|(k, d)| (*d, k)).collect();
        due.sort();
        due.into_iter().take(cap).map(|(_, k)| k.clone()).collect()
    }

    /// Every dirty profile (of `epoch`, or all), oldest turn first.
    pub fn all(&self, epoch: Option<&str>) -> Vec<SpoolKey> {
        let mut keys: Vec<(Instant, &SpoolKey)> = self
            .dirty
            .iter()
            .filter(|(k, _)| epoch.is_none_or(|e| k.epoch == e))
            .map(|(k, d)| (*d, k))
            .collect();
        keys.sort();
        keys.into_iter().map(|(_, k)| k.clone()).collect()
    }

    pub fn done(&mut self, key: SpoolKey, now: Instant) {
        self.dirty.remove(&key);
        self.last_published.insert(key, now);
    }

    pub fn forget_epoch(&mut self, epoch: &str) {
        self.dirty.retain(|k, _| k.epoch != epoch);
        self.last_published.retain(|k, _| k.epoch != epoch);
    }

    pub fn has_epoch(&self, epoch: &str) -> bool {
        self.dirty.keys().any(|k| k.epoch == epoch)
    }

    pub fn len(&self) -> usize {
        self.dirty.len()
    }
}

/// Identity of the published file of a spool key.
pub(super) struct Target {
    pub epoch: EpochId,
    /// `None` for the event's unknown profile.
    pub image: Option<ImageId>,
}

/// The published profile could not be read.
pub(super) enum Existing {
    /// Reading failed (the database is unavailable): retry later.
    Io(profile_format::Error),
    /// The file is not a valid profile: set it aside and start afresh.
    Corrupt(profile_format::Error),
}

/// The published profile at `path`, `None` if there is none yet.
pub(super) fn read_existing(path: &Path) -> Result<Option<Profile>, Existing> {
    match Profile::read(path) {
        Ok(p) => Ok(Some(p)),
        Err(profile_format::Error::Io { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            Ok(None)
        }
        Err(e @ profile_format::Error::Io { .. }) => Err(Existing::Io(e)),
        Err(e) => Err(Existing::Corrupt(e)),
    }
}

/// Result of merging increments into a profile.
pub(super) struct Merged {
    /// The profile to write; `None` if nothing new was merged.
    pub profile: Option<Profile>,
    /// The existing file describes another image or event than its name says.
    pub set_aside: Option<profile_format::Error>,
}

impl Target {
    /// `None` (logged) if the key names an invalid epoch or image id.
    pub fn of(key: &SpoolKey) -> Option<Target> {
        let epoch = match EpochId::parse(&key.epoch) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(epoch = key.epoch, error = %e, "store: spool names an invalid epoch; discarded");
                return None;
            }
        };
        let image = match &key.image {
            None => None,
            Some(text) => match ImageId::parse(text) {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::error!(image = text, error = %e, "store: spool names an invalid image id; discarded");
                    return None;
                }
            },
        };
        Some(Target { epoch, image })
    }

    pub fn path(&self, hd: &HostDir, key: &SpoolKey) -> PathBuf {
        match &self.image {
            None => hd.unknown_path(&key.event),
            Some(id) => hd.profile_path(id, &key.event),
        }
    }

    fn header(&self, inc: &SpooledIncrement, host: &str) -> ProfileHeader {
        let (image_id, kind, image_path, jit) = match (&self.image, &inc.image) {
            (Some(id), Some(img)) => (id.clone(), img.kind, img.path.clone(), img.jit.clone()),
            (Some(id), None) => (id.clone(), ImageKind::Elf, Vec::new(), Vec::new()),
            (None, _) => (
                ImageId::special("[unknown]", b""),
                ImageKind::Unknown,
                b"[unknown]".to_vec(),
                Vec::new(),
            ),
        };
        ProfileHeader {
            kind,
            image_id,
            image_path,
            event: (*inc.desc).clone(),
            host: host.to_owned(),
            epoch: self.epoch.clone(),
            total_samples: 0,
            total_period: 0,
            sequence: inc.seq,
            jit_symbols: if kind == ImageKind::Anon { jit } else { Vec::new() },
        }
    }

    /// Merge the increments above the existing file's `sequence` into it, one at a time.
    pub fn merge(
        &self,
        existing: Option<Profile>,
        incs: &[SpooledIncrement],
        spool: &mut Spool,
        host: &str,
    ) -> Result<Merged, SpoolError> {
        let published_seq = existing.as_ref().map_or(0, |p| p.header.sequence);
        let mut out = Merged { profile: existing, set_aside: None };
        let mut changed = false;
        for inc in incs.iter().filter(|i| i.seq > published_seq) {
            let Some((total_period, counts)) = spool.counts(inc)? else { continue };
            let header = self.header(inc, host);
            if let Err(e) = header.check() {
                // A record that passed its checksum but describes a profile no reader would
                // accept (written by a buggy or foreign writer): merged, it would make every
                // later write of this profile fail, and the publishing of all the others
                // wait behind it. Quarantine it and go on.
                tracing::error!(seq = inc.seq, event = %inc.desc.name, error = %e,
                    "spool: increment describes an invalid profile; quarantined");
                spool.quarantine(inc);
                continue;
            }
            let mut delta = Profile::new(header);
            for (off, c) in counts {
                delta.add(off, c, 0);
            }
            delta.header.total_period = total_period;
            out.profile = Some(match out.profile.take() {
                None => delta,
                Some(mut m) => match m.merge(&delta) {
                    Ok(()) => m,
                    Err(e) => {
                        out.set_aside = Some(e);
                        delta
                    }
                },
            });
            changed = true;
        }
        if !changed {
            out.profile = None;
        }
        Ok(out)
    }
}

/// Rename an unreadable profile (or whatever hostile file took its name: a FIFO, a link, a
/// huge file) to `NAME.corrupt`, or `NAME.<unix ms>.corrupt` if that exists already; readers
/// skip both (FORMAT.md §1).
pub(super) fn set_aside(path: &Path, why: &dyn std::fmt::Display) {
    let mut aside = path.as_os_str().to_owned();
    aside.push(profile_format::CORRUPT_SUFFIX);
    let mut aside = PathBuf::from(aside);
    if aside.symlink_metadata().is_ok() {
        let ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        let mut a = path.as_os_str().to_owned();
        a.push(format!(".{ms}{}", profile_format::CORRUPT_SUFFIX));
        aside = PathBuf::from(a);
    }
    match std::fs::rename(path, &aside) {
        Ok(()) => {
            tracing::warn!(file = %path.display(), moved_to = %aside.display(), error = %why,
            "store: corrupt profile set aside; starting a fresh one")
        }
        Err(e) => tracing::warn!(file = %path.display(), error = %why, rename_error = %e,
            "store: corrupt profile could not be renamed aside; overwriting it"),
    }
}
