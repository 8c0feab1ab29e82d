//! Scheduled epochs (`epoch_interval`): the boundary arithmetic, and the rotation itself.
//!
//! Boundaries are the UTC instants that are whole multiples of the interval since the Unix
//! epoch (with `1d`, 00:00 UTC), and the scheduled epoch's id is its boundary's
//! (`EpochId::from_time`): every host of a fleet computes the same boundary and the same name
//! from its own clock, and `mkdir` of that exact name settles which one creates it
//! ([`profile_format::Database::start_epoch_at`]).
//!
//! Whether a rotation is due depends only on the clock and the current epoch, not on a
//! remembered schedule: it is due when the latest boundary is later than the current epoch's
//! start. So a wall clock that jumps forward over several boundaries rotates once (into the
//! latest), one that jumps backwards rotates nothing until it passes a boundary later than the
//! current epoch again (never twice into one boundary, never an epoch older than the current
//! one), and a manual epoch (`dcpictl epoch new`) between two boundaries does not move them.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use profile_format::{EpochId, EpochStart};

use super::{Busy, Store, StoreError};

/// The schedule of `epoch_interval`: boundaries every `every_s` seconds since the Unix epoch.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct EpochSchedule {
    every_s: u64,
}

impl EpochSchedule {
    /// `None` for an interval under a second (`epoch_interval = "off"` is zero); sub-second
    /// parts are ignored (the configuration refuses them).
    pub fn new(interval: Duration) -> Option<Self> {
        let every_s = interval.as_secs();
        (every_s > 0).then_some(Self { every_s })
    }

    pub fn every_s(&self) -> u64 {
        self.every_s
    }

    /// Unix seconds of the latest boundary at or before `t` (a time before 1970 counts as 1970).
    pub fn boundary_at_or_before(&self, t: SystemTime) -> u64 {
        let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        secs - secs % self.every_s
    }

    /// How long from `now` until the first boundary after it (never zero).
    pub fn until_next(&self, now: SystemTime) -> Duration {
        let next = UNIX_EPOCH
            + Duration::from_secs(self.boundary_at_or_before(now).saturating_add(self.every_s));
        next.duration_since(now).unwrap_or(Duration::ZERO).max(Duration::from_millis(1))
    }

    /// The scheduled epoch of the boundary at or before `now`.
    pub fn epoch_at(&self, now: SystemTime) -> EpochId {
        EpochId::from_time(UNIX_EPOCH + Duration::from_secs(self.boundary_at_or_before(now)))
    }

    /// The epoch to rotate into at `now`, when the current epoch started before the latest
    /// boundary; `None` when it started at or after it (rotated already, by this host, another
    /// one or by hand, or the clock went back).
    pub fn due(&self, now: SystemTime, current: &EpochId) -> Option<EpochId> {
        let at = self.epoch_at(now);
        (at > *current).then_some(at)
    }
}

/// What [`Store::rotate_on_schedule`] did.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Rotation {
    /// This host started the scheduled epoch (created it, or completed one whose creator died
    /// before writing its marker).
    Started(EpochId),
    /// Another host had started it (or a later one): this host follows.
    Followed(EpochId),
    /// Another host is starting it right now: it is followed once its marker is there.
    Waiting,
}

impl Store {
    /// Rotate into the scheduled epoch `id` (the service calls this when
    /// [`EpochSchedule::due`] says so, after closing its batch). Another host may have started
    /// it already: then this host follows, as it follows any new epoch (the old epoch's data
    /// published first). Otherwise, as `dcpictl epoch new` does, everything held is published
    /// into the old epoch first, then the new epoch is made: a crash at any point leaves the
    /// old epoch's increments in the spool, tagged with their epoch, for the next start.
    /// An error (the database failing) leaves the old epoch current: the next tick tries again.
    pub fn rotate_on_schedule(
        &mut self,
        id: &EpochId,
        schedule: EpochSchedule,
    ) -> Result<Rotation, StoreError> {
        let r = self.rotate_inner(id, schedule);
        match &r {
            Ok(Rotation::Started(e)) => {
                tracing::info!(epoch = %e, every_s = schedule.every_s(), "store: started the scheduled epoch")
            }
            Ok(Rotation::Followed(e)) => {
                tracing::info!(epoch = %e, "store: following the scheduled epoch another host started")
            }
            Ok(Rotation::Waiting) => {
                tracing::debug!(epoch = %id, "store: another host is starting the scheduled epoch")
            }
            // Once per boundary, not once per tick while the database fails.
            Err(e) if self.rotation_warned.as_ref() != Some(id) => {
                tracing::warn!(epoch = %id, error = %e, "store: cannot start the scheduled epoch yet; retrying every flush");
                self.rotation_warned = Some(id.clone());
            }
            Err(_) => {}
        }
        if matches!(r, Ok(Rotation::Started(_) | Rotation::Followed(_))) {
            self.rotation_warned = None;
            // The epoch change made retention due (`epoch_changed`): apply it now rather
            // than at the next tick.
            self.maybe_retention(Instant::now());
        }
        r
    }

    fn rotate_inner(
        &mut self,
        id: &EpochId,
        schedule: EpochSchedule,
    ) -> Result<Rotation, StoreError> {
        let now = Instant::now();
        // Started elsewhere already (the common case in a fleet: one host is first)?
        self.epochs_seen = None;
        self.follow_epoch(now);
        if let Some(e) = self.epoch.as_ref().filter(|e| *e >= id) {
            return Ok(Rotation::Followed(e.clone()));
        }
        let db = self.db.as_ref().ok_or_else(|| StoreError::NoDatabase(self.cfg.db.clone()))?;
        // Publish the closing epoch first when this host is about to create the next one (a
        // directory already there is another host's start: following publishes then).
        if db.epochs()?.last().is_none_or(|n| n < id) {
            self.flush_everything()?;
        }
        let _busy = Busy::mark(std::sync::Arc::clone(&self.busy_since));
        let db = self.db.as_ref().ok_or_else(|| StoreError::NoDatabase(self.cfg.db.clone()))?;
        let started =
            db.start_epoch_at(id, &self.cfg.host, schedule.every_s(), SystemTime::now())?;
        // Become current through the same path as any new epoch: the newest with a marker
        // (a later manual epoch may have appeared meanwhile; then that one).
        self.epochs_seen = None;
        self.follow_epoch(Instant::now());
        let Some(current) = self.epoch.clone().filter(|e| e >= id) else {
            return Ok(Rotation::Waiting);
        };
        // The host directory of the new epoch at once, as after `dcpictl epoch new`.
        self.write_side_files(Instant::now(), true);
        Ok(match started {
            EpochStart::Created | EpochStart::Completed if current == *id => {
                Rotation::Started(current)
            }
            _ => Rotation::Followed(current),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    /// 2026-11-29T00:00:00Z.
    const DAY: u64 = 1_795_910_400;

    #[test]
    fn boundaries_are_utc_multiples_of_the_interval() {
        let day = EpochSchedule::new(Duration::from_secs(86_400)).unwrap();
        assert_eq!(day.epoch_at(at(DAY)).as_str(), "20261129T000000Z");
        assert_eq!(day.epoch_at(at(DAY + 86_399)).as_str(), "20261129T000000Z");
        assert_eq!(day.epoch_at(at(DAY + 86_400)).as_str(), "20261130T000000Z");
        assert_eq!(day.epoch_at(at(DAY - 1)).as_str(), "20261128T000000Z");
        // Sub-second parts of the clock do not matter: the name is the boundary's.
        let t = at(DAY + 3 * 3600) + Duration::from_nanos(999_999_999);
        assert_eq!(day.epoch_at(t).as_str(), "20261129T000000Z");
        assert_eq!(day.until_next(t), Duration::from_secs(21 * 3600 - 1) + Duration::from_nanos(1));
        let hour = EpochSchedule::new(Duration::from_secs(3600)).unwrap();
        assert_eq!(hour.epoch_at(at(DAY + 5400)).as_str(), "20261129T010000Z");
        assert_eq!(hour.until_next(at(DAY + 5400)), Duration::from_secs(1800));
        // An interval that does not divide a day still counts from the Unix epoch: 7 days
        // start on Thursdays (1970-01-01 was one), 00:00 UTC.
        let week = EpochSchedule::new(Duration::from_secs(7 * 86_400)).unwrap();
        assert_eq!(week.epoch_at(at(DAY)).as_str(), "20261126T000000Z");
        let odd = EpochSchedule::new(Duration::from_secs(7)).unwrap();
        assert_eq!(odd.boundary_at_or_before(at(DAY + 5)) % 7, 0);
        // Exactly on a boundary, the next one is a whole interval away, never zero.
        assert_eq!(day.until_next(at(DAY)), Duration::from_secs(86_400));
        assert_eq!(EpochSchedule::new(Duration::ZERO), None);
        assert_eq!(EpochSchedule::new(Duration::from_millis(999)), None);
        assert_eq!(day.boundary_at_or_before(UNIX_EPOCH - Duration::from_secs(5)), 0);
    }

    #[test]
    fn the_name_depends_on_the_boundary_only() {
        // Two hosts whose clocks differ, each past the boundary: the same name.
        let s = EpochSchedule::new(Duration::from_secs(3)).unwrap();
        let b = DAY + 30;
        let current = EpochId::from_time(at(b - 3));
        let one = s.due(at(b) + Duration::from_millis(2), &current);
        let other = s.due(at(b + 2) + Duration::from_millis(900), &current);
        assert_eq!(one, other);
        assert_eq!(one.unwrap().start_time(), at(b));
    }

    #[test]
    fn due_once_per_boundary() {
        let day = EpochSchedule::new(Duration::from_secs(86_400)).unwrap();
        // An epoch started by hand at 10:00 does not move the schedule...
        let manual = EpochId::from_time(at(DAY + 36_000));
        assert_eq!(day.due(at(DAY + 50_000), &manual), None);
        // ... the next boundary rotates.
        let next = day.due(at(DAY + 86_400), &manual).unwrap();
        assert_eq!(next.as_str(), "20261130T000000Z");
        // Once in it, nothing more is due until the boundary after.
        assert_eq!(day.due(at(DAY + 86_400), &next), None);
        assert_eq!(day.due(at(DAY + 2 * 86_400 - 1), &next), None);
        assert!(day.due(at(DAY + 2 * 86_400), &next).is_some());
        // A manual epoch in the boundary's own second (or later) counts as the rotation.
        let same_second = EpochId::from_time(at(DAY + 86_400));
        assert_eq!(day.due(at(DAY + 86_400), &same_second), None);
    }

    #[test]
    fn clock_jumps_neither_rotate_twice_nor_skip_for_ever() {
        let day = EpochSchedule::new(Duration::from_secs(86_400)).unwrap();
        let current = day.epoch_at(at(DAY + 100));
        // Forward over three boundaries: one rotation, into the latest boundary, not three.
        let jumped = day.due(at(DAY + 3 * 86_400 + 7), &current).unwrap();
        assert_eq!(jumped.as_str(), "20261202T000000Z");
        assert_eq!(day.due(at(DAY + 3 * 86_400 + 8), &jumped), None);
        // Backwards across the boundary the daemon just rotated at: no second rotation
        // (into the previous boundary, older than the current epoch)...
        assert_eq!(day.due(at(DAY + 3 * 86_400 - 60), &jumped), None);
        // ... nor when the clock passes that boundary again ...
        assert_eq!(day.due(at(DAY + 3 * 86_400 + 1), &jumped), None);
        // ... and the next boundary rotates as usual: nothing skipped for ever.
        assert!(day.due(at(DAY + 4 * 86_400), &jumped).is_some());
        // Backwards by days: nothing until the clock is past the current epoch's next boundary.
        assert_eq!(day.due(at(DAY - 5 * 86_400), &jumped), None);
        // The wake-up after a jump is computed from the clock as it is then.
        assert_eq!(day.until_next(at(DAY - 5 * 86_400 + 86_000)), Duration::from_secs(400));
    }
}
