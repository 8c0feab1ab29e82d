//! Publishing one profile: when its turn comes ([`Schedule`]), where it goes ([`Target`]), and
//! merging its spooled increments into the published file exactly once.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use profile_format::safeio;
use profile_format::{EpochId, EventDesc, HostDir, ImageId, ImageKind, Profile, ProfileHeader};

use super::pending::PendingProfile;
use super::spool::{Spool, SpoolError, SpoolImage, SpoolKey, SpooledIncrement};

/// A published profile is rewritten at its turn only once its unpublished samples reach this
/// fraction of its published ones (or it waited `publish_max_delay`).
///
/// Why: a profile file is rewritten whole, so rewriting a big, slowly changing profile (cc1's,
/// the kernel's) every publish interval made publishing ~90% of dcpid's disk writes over an
/// hour of a busy machine (bench/disk.py, BENCHMARKS.md). With a growth threshold of 1 the
/// file holds at least half of what the daemon has counted, the rewrites of a profile growing
/// at a steady rate become geometric (at 1, 2, 4, 8... intervals) until the delay bound takes
/// over, and a flush, an epoch change or a stop still publishes everything (the barrier).
pub(super) const PUBLISH_GROWTH: f64 = 1.0;

/// Profiles with unpublished increments and when each one's turn comes.
#[derive(Default)]
pub(super) struct Schedule {
    dirty: BTreeMap<SpoolKey, Instant>,
    last_published: HashMap<SpoolKey, Instant>,
    /// Samples in the published file (as of our last publication of it).
    published_samples: HashMap<SpoolKey, u64>,
    /// Samples spooled since our last publication; `None` once unknown (recovered from the
    /// spool at start), which publishes at the next turn.
    pending_samples: HashMap<SpoolKey, Option<u64>>,
}

impl Schedule {
    /// A profile changed by `samples` (`None`: an unknown amount): its turn is one publish
    /// interval after its last publication, or at a stable per-profile phase within the
    /// interval if it was never published.
    pub(super) fn mark(
        &mut self,
        key: SpoolKey,
        now: Instant,
        interval: Duration,
        samples: Option<u64>,
    ) {
        let pending = self.pending_samples.entry(key.clone()).or_insert(Some(0));
        *pending = match (*pending, samples) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            _ => None,
        };
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

    /// Whether a profile whose turn has come is worth rewriting now ([`PUBLISH_GROWTH`]; a
    /// per-command, per-process or per-cgroup profile only after `max_delay`).
    ///
    /// Why per-command profiles do not take the growth rule: they are many (one per image
    /// and command) and small (median ~200 bytes on the busy mix), yet each rewrite is a new
    /// file: a data page plus inode, directory and bitmap blocks, and two fsyncs. Measured on
    /// the busy mix (`bench/write_attrib.py`, BENCHMARKS.md "Where dcpid's writes go"): in
    /// the first ten minutes of an epoch, 121 per-command files were written, 726 file
    /// writes an hour, most of dcpid's database writes besides the one-time symbol tables.
    /// A young profile doubles between two turns, so the growth rule rewrote each of them
    /// again at its next turn. A new one is still published at its first turn; a changed one
    /// at most `max_delay` later, the bound a slowly growing profile had already.
    fn grown_enough(&self, key: &SpoolKey, now: Instant, max_delay: Duration) -> bool {
        let Some(&published) = self.published_samples.get(key) else { return true };
        let Some(Some(pending)) = self.pending_samples.get(key) else { return true };
        if !is_qualified(key) && *pending as f64 >= PUBLISH_GROWTH * published as f64 {
            return true;
        }
        self.last_published.get(key).is_none_or(|t| now.saturating_duration_since(*t) >= max_delay)
    }

    /// Up to `cap` profiles whose turn has come and that have grown enough to be rewritten,
    /// flat profiles first, then oldest turn first.
    pub(super) fn due(&self, now: Instant, cap: usize, max_delay: Duration) -> Vec<SpoolKey> {
        let mut due: Vec<(bool, Instant, &SpoolKey)> = self
            .dirty
            .iter()
            .filter(|(k, d)| {
                **d <= now && self.grown_enough(k, now, max_delay) && !self.waits_for_flat(k)
            })
            .map(|(k, d)| (is_qualified(k), *d, k))
            .collect();
        due.sort();
        due.into_iter().take(cap).map(|(_, _, k)| k.clone()).collect()
    }

    /// Whether `key`, a per-command (per-process, per-cgroup) profile, waits for the first
    /// publication of its image's flat profile, which is dirty and has never been published.
    ///
    /// Why: each new profile's first turn falls at its own phase within the interval, so half
    /// of the per-command profiles came before their flat profile's; a per-command profile
    /// published while no flat file exists cannot be a sole-command stub (FORMAT.md §5.6.1)
    /// and is written as a full copy for the rest of the epoch. On the busy mix the default
    /// daemon's per-command bytes were 2.0x those of a daemon flushed every minute (whose
    /// flushes publish the flat profiles first): BENCHMARKS.md "Off-CPU bytes ... eleventh
    /// session". The wait is bounded by the flat profile's own first turn, within one interval.
    fn waits_for_flat(&self, key: &SpoolKey) -> bool {
        let Some((image, _)) = key.image.as_deref().and_then(|t| t.split_once('.')) else {
            return false;
        };
        let flat = SpoolKey {
            epoch: key.epoch.clone(),
            image: Some(image.into()),
            event: key.event.clone(),
        };
        // Not `last_published`: a turn at which the freshness cap held every increment back
        // wrote no file (FORMAT.md §7.3), and a per-command profile published after it found
        // no flat file to stand for (the first fix, measured on the default daemon: still 14
        // per-command files and no flat one 7 minutes into an epoch).
        self.dirty.contains_key(&flat) && !self.was_published(&flat)
    }

    /// Every dirty profile (of `epoch`, or all), flat profiles first, then oldest turn first.
    pub(super) fn all(&self, epoch: Option<&str>) -> Vec<SpoolKey> {
        let mut keys: Vec<(bool, Instant, &SpoolKey)> = self
            .dirty
            .iter()
            .filter(|(k, _)| epoch.is_none_or(|e| k.epoch == e))
            .map(|(k, d)| (is_qualified(k), *d, k))
            .collect();
        keys.sort();
        keys.into_iter().map(|(_, _, k)| k.clone()).collect()
    }

    /// `key` was published; its file now holds `samples` (`None`: nothing was written).
    pub(super) fn done(&mut self, key: SpoolKey, now: Instant, samples: Option<u64>) {
        self.dirty.remove(&key);
        self.pending_samples.remove(&key);
        if let Some(n) = samples {
            self.published_samples.insert(key.clone(), n);
        }
        self.last_published.insert(key, now);
    }

    pub(super) fn forget_epoch(&mut self, epoch: &str) {
        self.dirty.retain(|k, _| k.epoch != epoch);
        self.last_published.retain(|k, _| k.epoch != epoch);
        self.published_samples.retain(|k, _| k.epoch != epoch);
        self.pending_samples.retain(|k, _| k.epoch != epoch);
    }

    /// The samples of `key`'s file as this daemon last published it (since it started).
    pub(super) fn published_samples(&self, key: &SpoolKey) -> Option<u64> {
        self.published_samples.get(key).copied()
    }

    /// Whether this daemon wrote `key`'s profile file (since it started). Not merely "had its
    /// turn": a turn at which the freshness cap held every increment back writes no file, and
    /// a key reported published then was dropped from `fresh.json` while it still had no file,
    /// so readers named its slices `[not yet published: ...]` (e2e `fresh::` under load).
    pub(super) fn was_published(&self, key: &SpoolKey) -> bool {
        self.published_samples.contains_key(key)
    }

    pub(super) fn has_epoch(&self, epoch: &str) -> bool {
        self.dirty.keys().any(|k| k.epoch == epoch)
    }

    pub(super) fn len(&self) -> usize {
        self.dirty.len()
    }
}

/// Whether a key is a per-process or per-cgroup profile's (`<image id>.<who>`). They are
/// published after the flat profiles: a machine starting hundreds of processes a minute with
/// `by_pid` makes thousands of them (BENCHMARKS.md, "Who table"), and the flat reports must
/// not wait behind them.
pub(super) fn is_qualified(k: &SpoolKey) -> bool {
    k.image.as_deref().is_some_and(|t| t.contains('.'))
}

/// Identity of the published file of a spool key.
pub(super) struct Target {
    pub epoch: EpochId,
    /// `None` for the event's unknown profile.
    pub image: Option<ImageId>,
    /// `pid-N` / `cg-HASH` of a per-process or per-cgroup profile (FORMAT.md §5.6), whose
    /// spool key's image text is `<image id text>.<this>`.
    pub who: Option<String>,
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
    pub(super) fn of(key: &SpoolKey) -> Option<Self> {
        let epoch = match EpochId::parse(&key.epoch) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(epoch = key.epoch, error = %e, "store: spool names an invalid epoch; discarded");
                return None;
            }
        };
        let (text, who) = match key.image.as_deref().map(|t| t.split_once('.')) {
            Some(Some((id, who))) => (Some(id), Some(who.to_owned())),
            Some(None) => (key.image.as_deref(), None),
            None => (None, None),
        };
        let valid_who = who.as_deref().is_none_or(|w| {
            w.strip_prefix("pid-").is_some_and(|n| n.parse::<u32>().is_ok())
                || w.strip_prefix("cg-").or_else(|| w.strip_prefix("cmd-")).is_some_and(|h| {
                    h.len() == 16
                        && h.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
                })
        });
        if !valid_who {
            tracing::error!(
                image = key.image,
                "store: spool names an invalid qualified profile; discarded"
            );
            return None;
        }
        let image = match text {
            None => None,
            Some(text) => match ImageId::parse(text) {
                Ok(id) => Some(id),
                Err(e) => {
                    tracing::error!(image = text, error = %e, "store: spool names an invalid image id; discarded");
                    return None;
                }
            },
        };
        Some(Self { epoch, image, who })
    }

    pub(super) fn path(&self, hd: &HostDir, key: &SpoolKey) -> PathBuf {
        match (&self.image, &self.who) {
            (None, _) => hd.unknown_path(&key.event),
            (Some(id), None) => hd.profile_path(id, &key.event),
            (Some(id), Some(who)) => hd.path.join(format!(
                "{}.{}.{who}{}",
                id.to_text(),
                profile_format::event_file_component(&key.event),
                profile_format::PROFILE_SUFFIX
            )),
        }
    }

    fn header(&self, inc: &SpooledIncrement, host: &str) -> ProfileHeader {
        self.header_of(&inc.desc, inc.image.as_deref(), inc.seq, host)
    }

    fn header_of(
        &self,
        desc: &EventDesc,
        image: Option<&SpoolImage>,
        sequence: u64,
        host: &str,
    ) -> ProfileHeader {
        let (image_id, kind, image_path, jit) = match (&self.image, image) {
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
            event: desc.clone(),
            host: host.to_owned(),
            epoch: self.epoch.clone(),
            total_samples: 0,
            total_period: 0,
            sequence,
            jit_symbols: if kind == ImageKind::Anon { jit } else { Vec::new() },
        }
    }

    /// Merge the increments above the existing file's `sequence` into it, one at a time.
    pub(super) fn merge(
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
            let who = inc.image.as_ref().and_then(|i| i.who.clone());
            if who.as_ref().map(profile_format::ProfileWho::file_component) != self.who {
                tracing::error!(seq = inc.seq, event = %inc.desc.name, who = ?who, name = ?self.who,
                    "spool: increment's process or cgroup does not match its profile; quarantined");
                spool.quarantine(inc);
                continue;
            }
            let mut delta = Profile::new(header);
            delta.who = who;
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

/// What [`write_direct`] did.
pub(super) enum Direct {
    /// Merged into the published file, which is now this many bytes.
    Written(u64),
    /// Nothing can be published under the profile's name (logged): its samples are lost.
    Discarded,
}

/// Merge one profile of a batch that the spool could not take (its disk full or failing)
/// straight into the published file, so that a full spool does not stop publishing.
///
/// The file's `sequence` stays what it was: the samples have no spool sequence, and the
/// spooled increments above the file's sequence are still to be merged at their turn. They
/// are counted exactly once: they were never in the spool, and the atomic rename either
/// takes all of them or none (a kill -9 before it loses them, as it would any batch held in
/// memory).
pub(super) fn write_direct(
    hd: &HostDir,
    key: &SpoolKey,
    p: &PendingProfile,
    host: &str,
    set_aside_corrupt: &mut dyn FnMut(&Path, &profile_format::Error),
) -> Result<Direct, profile_format::Error> {
    let Some(target) = Target::of(key) else { return Ok(Direct::Discarded) };
    let path = target.path(hd, key);
    let image = p.image.as_ref().map(|(_, img)| img);
    let header = target.header_of(&p.desc, image, 0, host);
    if let Err(e) = header.check() {
        tracing::error!(event = %p.desc.name, error = %e,
            "store: batch describes an invalid profile; its samples are dropped");
        return Ok(Direct::Discarded);
    }
    let mut delta = Profile::new(header);
    delta.who = image.and_then(|i| i.who.clone());
    for &(off, c) in &p.counts {
        delta.add(off, c, 0);
    }
    delta.header.total_period = p.total_period;
    let merged = match read_existing(&path) {
        Ok(None) => delta,
        Ok(Some(mut m)) => match m.merge(&delta) {
            Ok(()) => m,
            Err(e) => {
                set_aside_corrupt(&path, &e);
                delta
            }
        },
        Err(Existing::Io(e)) => return Err(e),
        Err(Existing::Corrupt(e)) => {
            set_aside_corrupt(&path, &e);
            delta
        }
    };
    Ok(Direct::Written(merged.write(&path)?))
}

/// Rename an unreadable profile (or whatever hostile file took its name: a FIFO, a link, a
/// huge file) to `NAME.corrupt`, or `NAME.<unix ms>.corrupt` if that exists already; readers
/// skip both (FORMAT.md §1).
pub(super) fn set_aside(path: &Path, why: &dyn std::fmt::Display) {
    match safeio::set_aside(path) {
        Ok(aside) => {
            tracing::warn!(file = %path.display(), moved_to = %aside.display(), error = %why,
            "store: corrupt profile set aside; starting a fresh one")
        }
        Err(e) => tracing::warn!(file = %path.display(), error = %why, rename_error = %e,
            "store: corrupt profile could not be renamed aside; overwriting it"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IV: Duration = Duration::from_secs(300);
    const MAX_DELAY: Duration = Duration::from_secs(1800);

    fn key(image: &str) -> SpoolKey {
        SpoolKey {
            epoch: "20261125T000000Z".into(),
            image: Some(image.into()),
            event: "cpu-clock".into(),
        }
    }

    /// The schedule after `k` was published holding `samples`, at `t`.
    fn published(k: &SpoolKey, t: Instant, samples: u64) -> Schedule {
        let mut s = Schedule::default();
        s.mark(k.clone(), t, IV, Some(samples));
        s.done(k.clone(), t, Some(samples));
        s
    }

    /// A turn that wrote no file (all held back by the freshness cap) is not a publication:
    /// `fresh.json` must keep naming the key until a file exists.
    #[test]
    fn a_turn_that_wrote_nothing_does_not_count_as_published() {
        let t = Instant::now();
        let mut s = Schedule::default();
        let k = key("a");
        s.mark(k.clone(), t, IV, Some(3));
        s.done(k.clone(), t + IV, None);
        assert!(!s.was_published(&k), "no file was written");
        s.mark(k.clone(), t + IV, IV, Some(3));
        s.done(k.clone(), t + IV * 2, Some(6));
        assert!(s.was_published(&k));
    }

    /// A per-command profile whose turn comes before its flat profile's first one waits for
    /// it (so that it can be a sole-command stub), and then goes at its own turn.
    #[test]
    fn a_per_command_profile_waits_for_its_flat_profiles_first_publication() {
        let t = Instant::now();
        let flat = key("bimage");
        // Find a command whose first turn falls before the flat profile's.
        let mut s = Schedule::default();
        s.mark(flat.clone(), t, IV, Some(5));
        let flat_turn = s.dirty[&flat];
        let cmd = (0..1000)
            .map(|i| key(&format!("bimage.cmd-{i:016x}")))
            .find(|k| {
                let mut probe = Schedule::default();
                probe.mark(k.clone(), t, IV, Some(5));
                probe.dirty[k] < flat_turn
            })
            .expect("some phase precedes the flat profile's");
        s.mark(cmd.clone(), t, IV, Some(5));
        let cmd_turn = s.dirty[&cmd];
        assert!(s.due(cmd_turn, 100, MAX_DELAY).is_empty(), "the command waits for the flat");
        // Both due: the flat goes, the command at the next turn after it (the next tick).
        assert_eq!(s.due(flat_turn, 100, MAX_DELAY), vec![flat.clone()]);
        // A turn of the flat profile that wrote no file (the freshness cap held it all back)
        // does not release the command: there is still no flat file to stand for.
        s.done(flat.clone(), flat_turn, None);
        s.mark(flat.clone(), flat_turn, IV, None);
        assert!(s.waits_for_flat(&cmd), "no flat file was written yet");
        assert!(s.due(flat_turn, 100, MAX_DELAY).is_empty());
        let next = s.dirty[&flat];
        s.done(flat.clone(), next, Some(5));
        assert_eq!(s.due(next, 100, MAX_DELAY), vec![cmd.clone()]);
        // Another image's commands, and a flat profile already published, do not hold one.
        let other = key("bother.cmd-0000000000000001");
        s.mark(other.clone(), t, IV, Some(1));
        assert!(!s.waits_for_flat(&other));
        assert!(!s.waits_for_flat(&cmd));
    }

    #[test]
    fn a_new_profile_is_published_at_its_first_turn_whatever_its_size() {
        let t = Instant::now();
        let mut s = Schedule::default();
        let k = key("a");
        s.mark(k.clone(), t, IV, Some(1));
        assert_eq!(s.due(t + IV, 8, MAX_DELAY), vec![k]);
    }

    #[test]
    fn a_published_profile_waits_until_it_has_grown_by_the_threshold() {
        let t = Instant::now();
        let k = key("a");
        let mut s = published(&k, t, 1000);
        s.mark(k.clone(), t + IV / 2, IV, Some(400));
        assert!(s.due(t + IV, 8, MAX_DELAY).is_empty(), "40% growth is not worth a rewrite");
        s.mark(k.clone(), t + IV + IV / 2, IV, Some(600));
        assert_eq!(s.due(t + 2 * IV, 8, MAX_DELAY), vec![k.clone()], "100% growth is");
        // Published again: the next threshold is relative to the new size.
        s.done(k.clone(), t + 2 * IV, Some(2000));
        s.mark(k.clone(), t + 2 * IV, IV, Some(1500));
        assert!(s.due(t + 3 * IV, 8, MAX_DELAY).is_empty());
    }

    /// Per-command (and per-process, per-cgroup) profiles are rewritten once per delay
    /// bound, not each time they double: each rewrite is a new small file (see
    /// `grown_enough`). Their first publication is at their first turn, as before.
    #[test]
    fn a_per_command_profile_is_rewritten_after_the_delay_bound_not_when_it_doubles() {
        let t = Instant::now();
        let (cmd, flat) = (key("b01.cmd-0123456789abcdef"), key("b01"));
        let mut s = Schedule::default();
        s.mark(cmd.clone(), t, IV, Some(1));
        assert_eq!(s.due(t + IV, 8, MAX_DELAY), vec![cmd.clone()], "first turn: published");
        s.done(cmd.clone(), t + IV, Some(1000));
        s.mark(flat.clone(), t, IV, Some(1000));
        s.done(flat.clone(), t + IV, Some(1000));
        s.mark(cmd.clone(), t + IV, IV, Some(5000));
        s.mark(flat.clone(), t + IV, IV, Some(5000));
        assert_eq!(
            s.due(t + 2 * IV, 8, MAX_DELAY),
            vec![flat.clone()],
            "the flat profile has doubled: rewritten; the per-command one waits"
        );
        let just_before = t + IV + MAX_DELAY.checked_sub(Duration::from_secs(1)).unwrap();
        assert!(!s.due(just_before, 8, MAX_DELAY).contains(&cmd));
        assert!(s.due(t + IV + MAX_DELAY, 8, MAX_DELAY).contains(&cmd), "the delay bound holds");
        let mut all = s.all(None);
        all.sort();
        assert_eq!(all, vec![flat, cmd], "a flush still publishes it");
    }

    #[test]
    fn a_profile_that_grows_slowly_is_still_published_after_the_delay_bound() {
        let t = Instant::now();
        let k = key("a");
        let mut s = published(&k, t, 1_000_000);
        s.mark(k.clone(), t + IV, IV, Some(1));
        assert!(s
            .due(t + MAX_DELAY.checked_sub(Duration::from_secs(1)).unwrap(), 8, MAX_DELAY)
            .is_empty());
        assert_eq!(s.due(t + MAX_DELAY, 8, MAX_DELAY), vec![k]);
    }

    #[test]
    fn increments_of_unknown_size_are_published_at_the_next_turn() {
        let t = Instant::now();
        let k = key("a");
        let mut s = published(&k, t, 1_000_000);
        s.mark(k.clone(), t + IV, IV, None);
        s.mark(k.clone(), t + IV, IV, Some(1));
        assert_eq!(s.due(t + IV, 8, MAX_DELAY), vec![k]);
    }

    #[test]
    fn flat_profiles_are_published_before_per_process_ones() {
        let t = Instant::now();
        let mut s = Schedule::default();
        let (pid, flat) = (key("b01.pid-7"), key("b02"));
        s.mark(pid.clone(), t, IV, Some(1));
        s.mark(flat.clone(), t + IV / 2, IV, Some(1));
        assert_eq!(s.all(None), vec![flat.clone(), pid.clone()]);
        assert_eq!(s.due(t + 2 * IV, 1, MAX_DELAY), vec![flat]);
    }

    #[test]
    fn every_dirty_profile_is_listed_for_a_flush_whatever_its_growth() {
        let t = Instant::now();
        let (a, b) = (key("a"), key("b"));
        let mut s = published(&a, t, 1_000_000);
        s.mark(a.clone(), t, IV, Some(1));
        s.mark(b.clone(), t, IV, Some(1));
        let mut all = s.all(None);
        all.sort();
        assert_eq!(all, vec![a, b]);
    }
}
