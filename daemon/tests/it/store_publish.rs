//! Store: spool, exactly-once publishing across crashes, corrupt files, incremental rewrites,
//! epochs and retention, driven by synthetic resolved batches.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use crate::store_support;
use dcpid::aggregate::OffsetCounts;
use dcpid::aggregate::{ImageInfo, Resolved, ResolvedProfile};
use dcpid::faults::Faults;
use dcpid::store::{Store, StoreConfig, StoreError};
use profile_format::{Database, EpochId, HostSummary, ImageId, ImageKind, Profile, UnknownReason};

/// [`store_support::cfg`] for `host`, with a spool of its own (several hosts share a root).
fn cfg(root: &Path, host: &str) -> StoreConfig {
    StoreConfig {
        spool: root.join(format!("spool-{host}.sqlite")),
        host: host.into(),
        ..store_support::cfg(root)
    }
}

fn open(root: &Path, host: &str) -> Store {
    open_with(cfg(root, host))
}

fn open_with(c: StoreConfig) -> Store {
    let mut s = Store::open(c);
    store_support::events(&mut s);
    s
}

/// (image number, offset, count) entries for event 0; plus `unknown` `ProcessGone` samples.
fn batch(entries: &[(u8, u64, u64)], unknown: u64) -> Resolved {
    let mut r = Resolved::default();
    for &(img, off, count) in entries {
        let id = ImageId::BuildId(vec![img; 20]);
        let info = Arc::new(ImageInfo {
            kind: ImageKind::Elf,
            id: id.clone(),
            path: format!("/usr/bin/img{img}").into_bytes(),
            jit_symbols: vec![],
        });
        let p = r.profiles.entry((id, 0)).or_insert_with(|| ResolvedProfile {
            image: info,
            event: 0,
            counts: OffsetCounts::default(),
        });
        let e = p.counts.entry(off).or_insert((0, 0));
        e.0 += count;
        e.1 += count * 1000;
        r.samples += count;
    }
    if unknown > 0 {
        r.unknown.insert((0, UnknownReason::ProcessGone), (unknown, unknown * 1000));
        r.samples += unknown;
    }
    r
}

/// Sum of counts per (image number or 255 for unknown, offset) over every profile of `host`
/// in `epoch`.
fn totals(root: &Path, epoch: &EpochId, host: &str) -> BTreeMap<(u8, u64), u64> {
    let db = Database::open(&root.join("db")).unwrap();
    let hd = db.host_dir(epoch, host).unwrap();
    let mut out = BTreeMap::new();
    for entry in hd.profiles().unwrap() {
        let p = Profile::read(&entry.path).unwrap();
        let img = match &p.header.image_id {
            ImageId::BuildId(b) => b[0],
            _ => 255,
        };
        for (off, c) in &p.counts {
            *out.entry((img, *off)).or_insert(0) += c;
        }
    }
    out
}

fn expect(entries: &[&[(u8, u64, u64)]], unknown: u64) -> BTreeMap<(u8, u64), u64> {
    let mut out = BTreeMap::new();
    for b in entries {
        for &(i, o, c) in b.iter() {
            *out.entry((i, o)).or_insert(0) += c;
        }
    }
    if unknown > 0 {
        out.insert((255, UnknownReason::ProcessGone as u64), unknown);
    }
    out
}

#[test]
fn spool_then_spread_publish() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), "h1");
    let epoch = s.current_epoch().cloned().expect("first epoch created");
    let b1: &[(u8, u64, u64)] = &[(1, 0x10, 5), (1, 0x20, 3), (2, 0x10, 7)];
    s.add(batch(b1, 2), 0, 0);
    let now = Instant::now();
    s.tick_at(now);
    let st = s.status();
    assert_eq!(st.pending_batches, 0);
    assert_eq!(st.spool_rows, 3, "one increment per profile: {st:?}");
    assert_eq!(st.dirty_profiles, 3);
    // Every profile's turn comes within one publish interval.
    s.tick_at(now + Duration::from_secs(61));
    assert_eq!(s.status().spool_rows, 0);
    assert_eq!(s.status().dirty_profiles, 0);
    assert_eq!(totals(dir.path(), &epoch, "h1"), expect(&[b1], 2));
    // A profile just published is not rewritten before the publish interval has passed.
    s.add(batch(&[(1, 0x10, 1)], 0), 0, 0);
    s.tick_at(now + Duration::from_secs(62));
    assert_eq!(s.status().dirty_profiles, 1);
    // Its turn has come, but 1 sample more than the 8 published is not worth rewriting it.
    s.tick_at(now + Duration::from_secs(122));
    assert_eq!(s.status().dirty_profiles, 1);
    assert_eq!(totals(dir.path(), &epoch, "h1"), expect(&[b1], 2));
    // Grown by as much as it holds: rewritten at the next tick.
    s.add(batch(&[(1, 0x20, 7)], 0), 0, 0);
    s.tick_at(now + Duration::from_secs(123));
    assert_eq!(s.status().dirty_profiles, 0);
    assert_eq!(totals(dir.path(), &epoch, "h1"), expect(&[b1, &[(1, 0x10, 1), (1, 0x20, 7)]], 2));
    // Growth that never reaches the threshold is published after the delay bound.
    s.add(batch(&[(2, 0x10, 1)], 0), 0, 0);
    s.tick_at(now + Duration::from_secs(124));
    s.tick_at(now + Duration::from_secs(61 + 5 * 60));
    assert_eq!(s.status().dirty_profiles, 1, "not grown enough, not waited long enough");
    s.tick_at(now + Duration::from_secs(61 + 6 * 60));
    assert_eq!(s.status().dirty_profiles, 0);
    s.flush_everything().unwrap();
    let db = Database::open(&dir.path().join("db")).unwrap();
    let sum = HostSummary::read(&db.host_dir(&epoch, "h1").unwrap().summary_path()).unwrap();
    assert_eq!(sum.samples, 15 + 2 + 1 + 7 + 1);
    assert_eq!(sum.unknown, 2);
    assert_eq!(sum.events.len(), 1);
    assert_eq!(sum.events[0].source, "software");
}

#[test]
fn exactly_once_after_crash_between_rename_and_spool_delete() {
    let dir = tempfile::tempdir().unwrap();
    let b1: &[(u8, u64, u64)] = &[(1, 0x10, 5), (2, 0x10, 7), (3, 0x30, 1)];
    let b2: &[(u8, u64, u64)] = &[(1, 0x10, 4), (2, 0x18, 2)];
    let b3: &[(u8, u64, u64)] = &[(1, 0x10, 100), (3, 0x30, 9)];
    let epoch;
    {
        let mut s = open(dir.path(), "h1");
        epoch = s.current_epoch().cloned().unwrap();
        s.add(batch(b1, 0), 0, 0);
        s.tick_at(Instant::now());
        s.add(batch(b2, 0), 0, 0);
        // The second profile write "crashes" after its rename, before its spool rows go.
        s.inject_faults(&Faults { crash_after_writes: Some(2), ..Default::default() });
        match s.flush_everything() {
            Err(StoreError::InjectedCrash(_)) => {}
            other => panic!("expected the injected crash, got {other:?}"),
        }
        // b3 reaches the spool but is never published before the "crash".
        s.add(batch(b3, 0), 0, 0);
        s.tick_at(Instant::now());
        assert!(s.status().spool_rows > 0);
    } // dropped without a shutdown flush: a kill -9.
    let mut s = open(dir.path(), "h1");
    assert!(s.status().dirty_profiles > 0, "dirty profiles recovered from the spool");
    s.flush_everything().unwrap();
    assert_eq!(s.status().spool_rows, 0);
    assert_eq!(totals(dir.path(), &epoch, "h1"), expect(&[b1, b2, b3], 0));
    // And once more for good measure: nothing left to double.
    drop(s);
    let mut s = open(dir.path(), "h1");
    s.flush_everything().unwrap();
    assert_eq!(totals(dir.path(), &epoch, "h1"), expect(&[b1, b2, b3], 0));
}

#[test]
fn corrupt_profile_is_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), "h1");
    let epoch = s.current_epoch().cloned().unwrap();
    s.add(batch(&[(1, 0x10, 5)], 0), 0, 0);
    s.flush_everything().unwrap();
    let db = Database::open(&dir.path().join("db")).unwrap();
    let hd = db.host_dir(&epoch, "h1").unwrap();
    let path = hd.profile_path(&ImageId::BuildId(vec![1; 20]), "cpu-clock");
    assert!(path.exists());
    std::fs::write(&path, b"this is not a profile").unwrap();
    s.add(batch(&[(1, 0x10, 2), (1, 0x40, 1)], 0), 0, 0);
    s.flush_everything().unwrap();
    let mut aside = path.clone().into_os_string();
    aside.push(".corrupt");
    assert!(Path::new(&aside).exists(), "corrupt file kept aside");
    let p = Profile::read(&path).unwrap();
    assert_eq!(p.counts.get(&0x10), Some(&2));
    assert_eq!(p.counts.get(&0x40), Some(&1));
    assert_eq!(s.status().corrupt_files_set_aside, 1);
    // A store opened over a database with a corrupt file starts fine too.
    std::fs::write(&path, b"\0\0\0").unwrap();
    drop(s);
    let mut s = open(dir.path(), "h1");
    s.add(batch(&[(1, 0x10, 3)], 0), 0, 0);
    s.flush_everything().unwrap();
    assert_eq!(Profile::read(&path).unwrap().counts.get(&0x10), Some(&3));
}

#[test]
fn only_changed_profiles_are_rewritten() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), "h1");
    let epoch = s.current_epoch().cloned().unwrap();
    s.add(batch(&[(1, 0x10, 5), (2, 0x10, 5), (3, 0x10, 5)], 0), 0, 0);
    s.flush_everything().unwrap();
    let db = Database::open(&dir.path().join("db")).unwrap();
    let hd = db.host_dir(&epoch, "h1").unwrap();
    let ino = |n: u8| {
        std::fs::metadata(hd.profile_path(&ImageId::BuildId(vec![n; 20]), "cpu-clock"))
            .unwrap()
            .ino()
    };
    let before = [ino(1), ino(2), ino(3)];
    s.add(batch(&[(2, 0x10, 1)], 0), 0, 0);
    s.flush_everything().unwrap();
    let after = [ino(1), ino(2), ino(3)];
    assert_eq!(before[0], after[0]);
    assert_ne!(before[1], after[1], "changed profile rewritten (atomic rename: new inode)");
    assert_eq!(before[2], after[2]);
}

#[test]
fn epoch_started_by_another_host_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), "h1");
    let e1 = s.current_epoch().cloned().unwrap();
    let b1: &[(u8, u64, u64)] = &[(1, 0x10, 5)];
    let b2: &[(u8, u64, u64)] = &[(1, 0x10, 7), (2, 0x20, 1)];
    s.add(batch(b1, 0), 0, 0);
    s.tick_at(Instant::now());
    let other = Database::open(&dir.path().join("db")).unwrap();
    let e2 = other.new_epoch(SystemTime::now(), "h2").unwrap();
    assert!(e2 > e1);
    s.tick_at(Instant::now());
    assert_eq!(s.current_epoch(), Some(&e2));
    s.add(batch(b2, 0), 0, 0);
    s.flush_everything().unwrap();
    assert_eq!(totals(dir.path(), &e1, "h1"), expect(&[b1], 0));
    assert_eq!(totals(dir.path(), &e2, "h1"), expect(&[b2], 0));
}

/// Set the epochs directory's times an hour back: a listing made now is then one the store may
/// reuse while the directory stays the same (a flush costs one stat, not a listing).
fn age_epochs_dir(root: &Path) {
    let f = std::fs::File::open(root.join("db").join("epochs")).unwrap();
    let hour_ago = SystemTime::now() - Duration::from_secs(3600);
    f.set_times(std::fs::FileTimes::new().set_modified(hour_ago).set_accessed(hour_ago)).unwrap();
}

/// With the listing reused, a new epoch started elsewhere is still followed at the next tick
/// (its mkdir changes the directory), and so is an epoch whose marker appears only after the
/// directory was listed (the marker is written inside the new directory, which leaves the
/// epochs directory as it was).
#[test]
fn epochs_are_followed_when_the_listing_is_reused() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), "h1");
    let e1 = s.current_epoch().cloned().unwrap();
    let other = Database::open(&dir.path().join("db")).unwrap();
    age_epochs_dir(dir.path());
    s.tick_at(Instant::now());
    s.tick_at(Instant::now());
    assert_eq!(s.current_epoch(), Some(&e1));
    let e2 = other.new_epoch(SystemTime::now(), "h2").unwrap();
    s.tick_at(Instant::now());
    assert_eq!(s.current_epoch(), Some(&e2), "a new epoch's directory is seen");

    // A writer between its mkdir and its marker: the newest directory has no marker yet.
    age_epochs_dir(dir.path());
    s.tick_at(Instant::now());
    let e3 = EpochId::from_time(SystemTime::now() + Duration::from_secs(3600));
    std::fs::create_dir(other.epoch_dir(&e3)).unwrap();
    age_epochs_dir(dir.path());
    s.tick_at(Instant::now());
    assert_eq!(s.current_epoch(), Some(&e2), "no marker yet");
    std::fs::write(other.epoch_dir(&e3).join(profile_format::EPOCH_MARKER), b"h2\n").unwrap();
    s.tick_at(Instant::now());
    assert_eq!(s.current_epoch(), Some(&e3), "the marker that came later is seen");
}

#[test]
fn new_epoch_closes_the_old_one_with_everything_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), "h1");
    let e1 = s.current_epoch().cloned().unwrap();
    let b1: &[(u8, u64, u64)] = &[(1, 0x10, 5), (2, 0x10, 1)];
    let b2: &[(u8, u64, u64)] = &[(1, 0x10, 2)];
    s.add(batch(b1, 0), 0, 0);
    let e2 = s.new_epoch().unwrap();
    assert!(e2 > e1);
    assert_eq!(totals(dir.path(), &e1, "h1"), expect(&[b1], 0));
    s.add(batch(b2, 0), 0, 0);
    s.flush_everything().unwrap();
    assert_eq!(totals(dir.path(), &e1, "h1"), expect(&[b1], 0));
    assert_eq!(totals(dir.path(), &e2, "h1"), expect(&[b2], 0));
}

#[test]
fn retention_removes_only_own_old_directories() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(&dir.path().join("db")).unwrap();
    let day = Duration::from_secs(86400);
    let now = SystemTime::now();
    let mut old = Vec::new();
    for age in [40u64, 30, 20, 10, 9, 8] {
        let e = db.new_epoch(now - day * age as u32, "h2").unwrap();
        for h in ["h1", "h2"] {
            db.host_dir(&e, h).unwrap().create().unwrap();
        }
        old.push(e);
    }
    let mut s =
        Store::open(StoreConfig { retention_keep: 3, retention_days: 7, ..cfg(dir.path(), "h1") });
    let removed = s.apply_retention(now).unwrap();
    // Six epochs; the newest three are kept whatever their age; the first three are old.
    assert_eq!(removed, old[..3].to_vec());
    for (i, e) in old.iter().enumerate() {
        let hosts = db.hosts(e).unwrap();
        assert!(hosts.contains(&"h2".to_string()), "other host's directory untouched");
        assert_eq!(hosts.contains(&"h1".to_string()), i >= 3, "epoch {e}: {hosts:?}");
    }
}

/// Scheduled epochs (`epoch_interval`): two hosts rotating at the same boundaries start and
/// follow the same epoch names, in whichever order they get there, each closing the old epoch
/// with its data in it; a directory another host is still creating is waited for; retention
/// (kept short here) runs at the rotation and removes the oldest.
#[test]
fn scheduled_epochs_are_the_same_for_every_host_and_expire() {
    use dcpid::store::{EpochSchedule, Rotation};
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(&dir.path().join("db")).unwrap();
    let now = SystemTime::now();
    let hour = Duration::from_secs(3600);
    // The service's epoch from before: rotations below go to boundaries after it, all past
    // (retention measures an epoch's age from its start).
    let e0 = db.new_epoch(now - 4 * hour, "h1").unwrap();
    let short =
        |host| StoreConfig { retention_days: 0, retention_keep: 2, ..cfg(dir.path(), host) };
    let (mut h1, mut h2) = (open_with(short("h1")), open_with(short("h2")));
    assert_eq!((h1.current_epoch(), h2.current_epoch()), (Some(&e0), Some(&e0)));
    let every = EpochSchedule::new(Duration::from_secs(60)).unwrap();
    let b1: &[(u8, u64, u64)] = &[(1, 0x10, 5)];
    let b2: &[(u8, u64, u64)] = &[(2, 0x20, 3)];
    let mut ids = Vec::new();
    for (i, back) in [3u32, 2, 1].into_iter().enumerate() {
        let id = every.epoch_at(now - hour * back);
        assert_eq!(id.start_time(), every.epoch_at(id.start_time()).start_time(), "aligned");
        h1.add(batch(b1, 0), 0, 0);
        h2.add(batch(b2, 0), 0, 0);
        // Who comes first alternates; the second finds the first's epoch.
        let (first, second) = if i % 2 == 0 { (&mut h1, &mut h2) } else { (&mut h2, &mut h1) };
        assert_eq!(first.rotate_on_schedule(&id, every).unwrap(), Rotation::Started(id.clone()));
        assert_eq!(second.rotate_on_schedule(&id, every).unwrap(), Rotation::Followed(id.clone()));
        let prev = ids.last().unwrap_or(&e0).clone();
        // The closing epoch has each host's samples of before the rotation.
        if i < 2 {
            assert_eq!(totals(dir.path(), &prev, "h1"), expect(&[b1], 0), "{prev}");
            assert_eq!(totals(dir.path(), &prev, "h2"), expect(&[b2], 0), "{prev}");
        }
        ids.push(id);
    }
    // Two epochs kept (retention_keep), the older ones removed by both hosts.
    assert_eq!(db.epochs().unwrap(), ids[1..].to_vec());
    let marker =
        std::fs::read_to_string(db.epoch_dir(&ids[2]).join(profile_format::EPOCH_MARKER)).unwrap();
    assert!(marker.contains("interval 60\n"), "{marker}");

    // Another host between its mkdir and its marker: wait, and follow once the marker is there.
    let next = every.epoch_at(now);
    std::fs::create_dir(db.epoch_dir(&next)).unwrap();
    assert_eq!(h1.rotate_on_schedule(&next, every).unwrap(), Rotation::Waiting);
    assert_eq!(h1.current_epoch(), Some(&ids[2]));
    std::fs::write(db.epoch_dir(&next).join(profile_format::EPOCH_MARKER), b"h3\n").unwrap();
    assert_eq!(h1.rotate_on_schedule(&next, every).unwrap(), Rotation::Followed(next.clone()));
    // A later epoch (started by hand) is followed rather than an older one started.
    let manual = h2.new_epoch().unwrap();
    assert!(manual > next);
    assert_eq!(h1.rotate_on_schedule(&next, every).unwrap(), Rotation::Followed(manual.clone()));
    assert_eq!(db.hosts(&ids[1]).unwrap(), ["h2"], "h1's retention ran at the rotation");
    // Nobody wrote into ids[2] after the rotation: no host directory, only the marker; the
    // first retention removed it. h2 started its epoch by hand: its retention runs at its
    // next tick.
    assert!(!db.epoch_dir(&ids[2]).exists());
    h2.tick_at(Instant::now());
    assert_eq!(db.epochs().unwrap(), [next, manual]);
}

/// Bytes under a directory (files only).
fn dir_bytes(p: &Path) -> u64 {
    std::fs::read_dir(p)
        .map(|rd| rd.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
        .unwrap_or(0)
}

#[test]
fn spool_appends_only_what_changed_compactly() {
    // 60 flushes of 400 (offset, count) pairs spread over 4 images: the spool's write volume
    // is the encoded increments (~2-3 bytes per pair), not pages rewritten per flush.
    let dir = tempfile::tempdir().unwrap();
    // Nothing is published in these 6 simulated seconds: a profile's first turn falls at a
    // hash of its key within the publish interval, and with the usual 60 s one of the four
    // turns came within 6 s about a third of the time, compacting its rows out of the spool.
    let day = Duration::from_secs(86400);
    let mut s = open_with(StoreConfig {
        publish_interval: day,
        publish_max_delay: day,
        ..cfg(dir.path(), "h1")
    });
    let t0 = Instant::now();
    let mut pairs = 0u64;
    for i in 0..60u64 {
        let entries: Vec<(u8, u64, u64)> =
            (0..400u64).map(|j| ((j % 4) as u8 + 1, (j * 37 + i) % 4096 * 4, 1 + j % 3)).collect();
        pairs += 400;
        s.add(batch(&entries, 1), 0, 0);
        s.tick_at(t0 + Duration::from_millis(100 * i));
    }
    let st = s.status();
    let spool = dir_bytes(&dir.path().join("spool-h1.sqlite/h1"));
    assert_eq!(st.bytes_written.spool, spool, "every appended byte is in the log: {st:?}");
    assert!(spool < pairs * 3 + 60 * 64, "{spool} bytes for {pairs} pairs");
    assert_eq!(st.published_files, 0, "{st:?}");
    assert!(st.spool_rows >= 60 * 4, "{st:?}");
}

#[test]
fn summary_counted_once_across_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let epoch;
    {
        let mut s = open(dir.path(), "h1");
        epoch = s.current_epoch().cloned().unwrap();
        s.add(batch(&[(1, 0x10, 5)], 1), 3, 0);
        s.flush_everything().unwrap();
        s.add(batch(&[(2, 0x10, 7)], 2), 4, 1);
        s.tick_at(Instant::now());
    } // kill -9: the second batch is only in the spool.
    let mut s = open(dir.path(), "h1");
    s.flush_everything().unwrap();
    drop(s);
    let mut s = open(dir.path(), "h1");
    s.flush_everything().unwrap();
    let db = Database::open(&dir.path().join("db")).unwrap();
    let sum = HostSummary::read(&db.host_dir(&epoch, "h1").unwrap().summary_path()).unwrap();
    assert_eq!((sum.samples, sum.unknown, sum.lost, sum.throttled), (15, 3, 7, 1));
    assert_eq!(sum.events[0].samples, 15);
    assert_eq!(totals(dir.path(), &epoch, "h1"), expect(&[&[(1, 0x10, 5)], &[(2, 0x10, 7)]], 3));
}

#[test]
fn published_increments_are_not_offered_again_after_a_restart() {
    // A profile set aside as corrupt after publishing must not get the already published
    // increments back from the spool on restart (the spool records what was published).
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path(), "h1");
    let epoch = s.current_epoch().cloned().unwrap();
    s.add(batch(&[(1, 0x10, 5)], 0), 0, 0);
    s.flush_everything().unwrap();
    drop(s);
    let db = Database::open(&dir.path().join("db")).unwrap();
    let path = db
        .host_dir(&epoch, "h1")
        .unwrap()
        .profile_path(&ImageId::BuildId(vec![1; 20]), "cpu-clock");
    std::fs::write(&path, b"garbage").unwrap();
    let mut s = open(dir.path(), "h1");
    s.add(batch(&[(1, 0x10, 2)], 0), 0, 0);
    s.flush_everything().unwrap();
    assert_eq!(Profile::read(&path).unwrap().counts.get(&0x10), Some(&2));
}

/// A kernel symbol snapshot the size of a small real one (20 000 text symbols).
fn synthetic_kallsyms() -> profile_format::KallsymsSnapshot {
    let mut text = String::from("ffffffff81000000 T _text\n");
    for i in 0..20_000u64 {
        let kind = if i % 3 == 0 { 't' } else { 'T' };
        text.push_str(&format!(
            "{:016x} {kind} fn_{}_{i}\n",
            0xffffffff81001000 + i * 0x90,
            i % 97
        ));
    }
    profile_format::KallsymsSnapshot::from_proc_text(
        &text,
        "",
        "6.18.0".into(),
        Some(vec![7; 20]),
        &|_| None,
    )
    .unwrap()
}

fn tree_bytes(p: &Path) -> u64 {
    let mut n = 0;
    for e in std::fs::read_dir(p).unwrap().flatten() {
        let m = e.metadata().unwrap();
        n += if m.is_dir() { tree_bytes(&e.path()) } else { m.len() };
    }
    n
}

#[test]
fn kernel_symbols_stored_once_per_database() {
    // 1 host x 1 epoch.
    let snap = synthetic_kallsyms();
    let one = tempfile::tempdir().unwrap();
    let mut s = open(one.path(), "h1");
    s.set_kallsyms(snap.clone());
    s.add(batch(&[(1, 0x10, 5)], 1), 0, 0);
    s.flush_everything().unwrap();
    let one_bytes = tree_bytes(&one.path().join("db"));
    // 2 hosts x 3 epochs of the same kernel, into one database.
    let many = tempfile::tempdir().unwrap();
    let mut hosts = [open(many.path(), "h1"), open(many.path(), "h2")];
    let mut epochs = Vec::new();
    for round in 0..3 {
        for s in hosts.iter_mut() {
            s.set_kallsyms(snap.clone());
            s.tick_at(Instant::now());
            s.add(batch(&[(1, 0x10, 5)], 1), 0, 0);
            s.flush_everything().unwrap();
        }
        epochs.push(hosts[0].current_epoch().cloned().unwrap());
        if round < 2 {
            hosts[0].new_epoch().unwrap();
        }
    }
    let many_bytes = tree_bytes(&many.path().join("db"));
    assert!(
        many_bytes <= 2 * one_bytes,
        "2 hosts x 3 epochs take {many_bytes} bytes, 1 x 1 takes {one_bytes}"
    );
    let db = Database::open(&many.path().join("db")).unwrap();
    let stored: Vec<_> =
        std::fs::read_dir(db.root().join(profile_format::KALLSYMS_DIR)).unwrap().collect();
    assert_eq!(stored.len(), 1, "one snapshot for one kernel");
    for e in &epochs {
        for h in ["h1", "h2"] {
            let snap = db.host_dir(e, h).unwrap().read_kallsyms().unwrap();
            assert_eq!(snap.symbols.len(), 20_001, "{e}/{h}");
        }
    }
    // The snapshot is compressed: smaller than its canonical encoding.
    let raw = snap.to_file_bytes(Path::new("x")).unwrap().len() as u64;
    let packed = stored[0].as_ref().unwrap().metadata().unwrap().len();
    assert!(packed * 2 < raw, "compressed {packed} vs {raw}");
}
