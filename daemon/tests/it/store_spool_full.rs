//! Store: a spool that cannot take a batch (its filesystem full, or not openable) does not stop
//! publishing, what can be written nowhere is counted as dropped, and failed spool writes leave
//! nothing behind (issue 35, defect 2).
//!
//! The full-disk tests mount a tiny tmpfs, which needs root: without it they print `SKIPPED`
//! (and fail under `DCPI_REQUIRE_ALL=1`, as the CI runs them).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dcpi_testkit::Tmpfs;
use dcpid::store::spool::{Increment, Spool, SpoolImage, SpoolKey, SummaryDelta};
use dcpid::store::{Store, StoreConfig};
use profile_format::{Database, EpochId, EventDesc, HostSummary, ImageKind, Profile};

use crate::store_support::{self, batch, desc};

/// The shared store configuration, with the spool one level down (`local/spool`, where the
/// tests mount their tmpfs) and the memory bound under test.
fn cfg(root: &Path, max_memory_bytes: u64) -> StoreConfig {
    StoreConfig { spool: root.join("local/spool"), max_memory_bytes, ..store_support::cfg(root) }
}

fn open(c: StoreConfig) -> Store {
    let mut s = Store::open(c);
    store_support::events(&mut s);
    s
}

/// Samples in this host's published profiles of `epoch`.
fn total(root: &Path, epoch: &EpochId) -> u64 {
    let db = Database::open(&root.join("db")).unwrap();
    let hd = db.host_dir(epoch, "h1").unwrap();
    hd.profiles()
        .unwrap()
        .iter()
        .map(|e| Profile::read(&e.path).unwrap().header.total_samples)
        .sum()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    v.retain(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("seg-")));
    v.sort();
    v
}

#[test]
fn an_unopenable_spool_publishes_straight_to_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // The spool's directory is a file: the spool cannot be opened at all.
    std::fs::write(root.join("local"), b"x").unwrap();
    let mut s = open(cfg(root, 64 << 20));
    let epoch = s.current_epoch().cloned().unwrap();
    assert!(s.status().spool_error.is_some());
    let mut added = 0;
    let now = Instant::now();
    for i in 0..50u64 {
        s.add(batch((i % 7) as u8 + 1, i, 3), 0, 0);
        added += 3;
        s.tick_at(now + Duration::from_secs(2 * i));
    }
    let st = s.status();
    assert_eq!((st.pending_batches, st.pending_samples, st.dropped_samples), (0, 0, 0), "{st:?}");
    assert!(st.spool_error.is_some(), "the spool's failure is still shown: {st:?}");
    assert!(st.db_error.is_none(), "{st:?}");
    assert_eq!(total(root, &epoch), added, "every sample is published without the spool");
    s.flush_everything().unwrap();
    let db = Database::open(&root.join("db")).unwrap();
    let sum = HostSummary::read(&db.host_dir(&epoch, "h1").unwrap().summary_path()).unwrap();
    assert_eq!((sum.samples, sum.lost), (added, 0), "the summary counts them");
    assert_eq!(s.drop_held(), 0);
    assert_eq!(s.losses().dropped(), 0);
}

#[test]
fn a_full_spool_publishes_straight_to_the_database_and_leaves_no_empty_segment() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let Some(fs) = Tmpfs::mount(&root.join("local"), "64k") else { return };
    let mut s = open(cfg(root, 64 << 20));
    let epoch = s.current_epoch().cloned().unwrap();
    let spool_dir = s.spool_dir();
    let now = Instant::now();
    // Something spooled while there was room, not yet published (its turn has not come).
    s.add(batch(1, 0x10, 7), 0, 0);
    s.tick_at(now);
    assert_eq!(segments(&spool_dir).len(), 1);
    assert_eq!(total(root, &epoch), 0, "not yet published");
    let ballast = fs.fill();
    let mut added = 7;
    for i in 1..40u64 {
        // Big batches: each needs more than the page the open segment has left.
        for img in 1..=6u8 {
            let mut r = batch(img, 0x1000 * i, 2);
            if let Some(p) = r.profiles.values_mut().next() {
                for off in 0..200u64 {
                    p.counts.insert(off * 64 + i, (1, 1000));
                }
            }
            r.samples += 200;
            added += 202;
            s.add(r, 0, 0);
        }
        s.tick_at(now + Duration::from_secs(2 * i));
    }
    let st = s.status();
    assert!(st.spool_error.is_some(), "the full spool is reported: {st:?}");
    assert_eq!((st.pending_batches, st.dropped_samples), (0, 0), "{st:?}");
    assert_eq!(segments(&spool_dir).len(), 1, "failed retries leave no segment behind");
    // The spooled increment is merged exactly once beside what went straight in.
    s.flush_everything().unwrap_or_else(|e| panic!("flush: {e} {:?}", s.status()));
    assert_eq!(total(root, &epoch), added);
    // Room again: the spool takes batches again, and its log reads back whole.
    std::fs::remove_file(&ballast).unwrap();
    s.add(batch(2, 0x20, 5), 0, 0);
    added += 5;
    s.flush_everything().unwrap();
    assert!(s.status().spool_error.is_none(), "{:?}", s.status());
    assert_eq!(total(root, &epoch), added);
    drop(s);
    let (_, rec) = Spool::open(&spool_dir, Duration::from_secs(60)).unwrap();
    assert_eq!((rec.quarantined, rec.keys.len()), (0, 0), "{rec:?}");
    let names: Vec<_> = std::fs::read_dir(&spool_dir).unwrap().flatten().collect();
    assert!(names.iter().all(|e| !e.file_name().to_string_lossy().ends_with(".corrupt")));
}

fn increment<'a>(
    name: &'a str,
    image: &'a SpoolImage,
    desc: &'a EventDesc,
    counts: &'a [(u64, u64)],
) -> Increment<'a> {
    Increment { image: Some((name, image)), desc, total_period: 3000, counts }
}

#[test]
fn a_record_that_did_not_fit_leaves_no_definition_behind() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fs) = Tmpfs::mount(&dir.path().join("t"), "64k") else { return };
    let spool_dir = dir.path().join("t/spool");
    let (mut sp, _) = Spool::open(&spool_dir, Duration::from_secs(3600)).unwrap();
    let d = desc();
    let img = |n: u8, len: usize| SpoolImage {
        kind: ImageKind::Elf,
        path: vec![b'a' + n; len],
        jit: vec![],
        who: None,
    };
    let (small, big) = (img(0, 8), img(1, 6000));
    let counts = vec![(16u64, 3u64)];
    let inc = |name, i| increment(name, i, &d, &counts);
    let now = Instant::now();
    sp.append("E1", &[inc("b01", &small)], &SummaryDelta::default(), now).unwrap();
    let ballast = fs.fill();
    // The big image's definition (6000 bytes) does not fit in the segment's last page.
    let err = sp.append("E1", &[inc("b02", &big)], &SummaryDelta::default(), now);
    assert!(err.is_err(), "the filesystem is full");
    std::fs::remove_file(&ballast).unwrap();
    sp.append("E1", &[inc("b02", &big)], &SummaryDelta::default(), now).unwrap();
    drop(sp);
    // After a restart every record reads: the second defines the image again.
    let (mut sp, rec) = Spool::open(&spool_dir, Duration::from_secs(3600)).unwrap();
    assert_eq!(rec.quarantined, 0, "{rec:?}");
    let key = SpoolKey { epoch: "E1".into(), image: Some("b02".into()), event: d.name.clone() };
    let incs = sp.increments(&key);
    assert_eq!(incs.len(), 1);
    assert_eq!(**incs[0].image.as_ref().unwrap(), big);
    assert_eq!(sp.counts(&incs[0]).unwrap().unwrap().1, counts);
}

#[test]
fn an_empty_segment_is_removed_without_a_quarantine() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("spool");
    std::fs::create_dir(&p).unwrap();
    // Left by an older dcpid whose segment creation met a full disk, or a kill -9 there.
    std::fs::write(p.join("seg-0000000000000001.log"), b"").unwrap();
    std::fs::write(p.join("seg-0000000000000002.log"), b"DCPI").unwrap();
    let (_, rec) = Spool::open(&p, Duration::from_secs(60)).unwrap();
    assert_eq!(rec.quarantined, 0);
    let left: Vec<_> = std::fs::read_dir(&p).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn the_spool_directory_and_its_segments_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("a/spool");
    let (mut sp, _) = Spool::open(&fresh, Duration::from_secs(60)).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&fresh), 0o700);
    assert_eq!(mode(&dir.path().join("a")), 0o700, "created parents too");
    let d = desc();
    let counts = vec![(1u64, 1u64)];
    let inc = Increment { image: None, desc: &d, total_period: 1, counts: &counts };
    sp.append("E1", &[inc], &SummaryDelta::default(), Instant::now()).unwrap();
    for seg in segments(&fresh) {
        assert_eq!(mode(&seg) & 0o077, 0, "{}", seg.display());
    }
    // One an older dcpid made world-readable is closed.
    let old = dir.path().join("old");
    std::fs::create_dir(&old).unwrap();
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o755)).unwrap();
    Spool::open(&old, Duration::from_secs(60)).unwrap();
    assert_eq!(mode(&old), 0o700);
}

#[test]
fn written_nowhere_is_held_within_the_bound_then_counted_as_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::write(root.join("local"), b"x").unwrap();
    let max = 8 * 1024;
    let mut s = open(cfg(root, max));
    let epoch = s.current_epoch().cloned().unwrap();
    s.add(batch(9, 9, 4), 0, 0);
    s.tick_at(Instant::now());
    assert_eq!(total(root, &epoch), 4, "published straight to the database");
    // The database goes too.
    std::fs::rename(root.join("db"), root.join("db.away")).unwrap();
    std::fs::write(root.join("db"), b"not a directory").unwrap();
    let mut added = 0;
    for i in 0..200u64 {
        s.add(batch((i % 7) as u8 + 1, i, 3), 0, 0);
        added += 3;
        s.tick_at(Instant::now());
        assert!(s.status().pending_bytes <= max, "memory bound kept: {:?}", s.status());
    }
    let st = s.status();
    assert!(st.dropped_samples > 0 && st.pending_batches > 0, "{st:?}");
    assert_eq!(st.dropped_samples + st.pending_samples, added, "{st:?}");
    assert_eq!(s.losses().held(), st.pending_samples);
    // The daemon exits with them: counted as dropped.
    assert!(s.flush_everything().is_err());
    assert_eq!(s.drop_held(), st.pending_samples);
    let st = s.status();
    assert_eq!((st.dropped_samples, st.pending_samples), (added, 0));
    assert_eq!(s.losses().dropped(), added);
}
