//! Store: a failing database or spool never stops the daemon, memory stays bounded, and what
//! was held is written once the disk is back.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dcpid::aggregate::OffsetCounts;
use dcpid::aggregate::{ImageInfo, Resolved, ResolvedProfile};
use dcpid::store::{EventInfo, Store, StoreConfig};
use profile_format::{Database, EpochId, EventDesc, HostSummary, ImageId, ImageKind, Profile};

fn cfg(root: &Path, max_memory_bytes: u64) -> StoreConfig {
    StoreConfig {
        db: root.join("db"),
        spool: root.join("local/spool.sqlite"),
        host: "h1".into(),
        flush_interval: Duration::from_secs(2),
        publish_interval: Duration::from_secs(60),
        publish_max_delay: Duration::from_secs(360),
        max_memory_bytes,
        retention_days: 7,
        retention_keep: 3,
    }
}

fn open(c: StoreConfig) -> Store {
    let mut s = Store::open(c);
    s.set_events(vec![EventInfo {
        desc: EventDesc {
            name: "cpu-clock".into(),
            perf_type: 1,
            perf_config: 0,
            period_mean: 1000,
            period_min: 938,
            period_max: 1000,
        },
        source: "software".into(),
    }]);
    s
}

fn batch(img: u8, off: u64, count: u64) -> Resolved {
    let mut r = Resolved::default();
    let id = ImageId::BuildId(vec![img; 20]);
    let info = Arc::new(ImageInfo {
        kind: ImageKind::Elf,
        id: id.clone(),
        path: format!("/usr/lib/lib{img}.so").into_bytes(),
        jit_symbols: vec![],
    });
    let mut counts = OffsetCounts::default();
    counts.insert(off, (count, count * 1000));
    r.profiles.insert((id, 0), ResolvedProfile { image: info, event: 0, counts });
    r.samples = count;
    r
}

fn total(root: &Path, epoch: &EpochId) -> u64 {
    let db = Database::open(&root.join("db")).unwrap();
    let hd = db.host_dir(epoch, "h1").unwrap();
    hd.profiles()
        .unwrap()
        .iter()
        .map(|e| Profile::read(&e.path).unwrap().header.total_samples)
        .sum()
}

#[test]
fn database_gone_then_back() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut s = open(cfg(root, 64 << 20));
    let epoch = s.current_epoch().cloned().unwrap();
    s.add(batch(1, 0x10, 10), 0, 0);
    s.flush_everything().unwrap();
    // The database disappears (an NFS server gone / a path no longer a directory): replace the
    // directory by a file. Root ignores permission bits, this it cannot write through.
    std::fs::rename(root.join("db"), root.join("db.away")).unwrap();
    std::fs::write(root.join("db"), b"not a directory").unwrap();
    let mut added = 10;
    let now = Instant::now();
    for i in 0..20u64 {
        s.add(batch((i % 4) as u8 + 1, 0x10 + i, 5), 0, 0);
        added += 5;
        s.tick_at(now + Duration::from_secs(10 * i));
    }
    let st = s.status();
    assert!(st.db_error.is_some(), "status shows the condition: {st:?}");
    assert!(st.spool_error.is_none());
    assert!(st.spool_rows > 0, "held in the spool meanwhile");
    assert_eq!(st.pending_batches, 0);
    assert!(s.flush_everything().is_err());
    // Back.
    std::fs::remove_file(root.join("db")).unwrap();
    std::fs::rename(root.join("db.away"), root.join("db")).unwrap();
    s.tick_at(now + Duration::from_secs(400));
    assert!(s.status().db_error.is_none(), "recovered: {:?}", s.status());
    s.flush_everything().unwrap();
    assert_eq!(s.status().spool_rows, 0);
    assert_eq!(total(root, &epoch), added);
}

#[test]
fn spool_and_database_unwritable_memory_bounded_then_recovered() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // The spool's directory is a file: the spool cannot be opened.
    std::fs::write(root.join("local"), b"x").unwrap();
    let max = 8 * 1024;
    let mut s = open(cfg(root, max));
    let epoch = s.current_epoch().cloned().unwrap();
    assert!(s.status().spool_error.is_some());
    // Nor can the database be written (a batch the spool cannot take is published straight
    // into it otherwise: store_spool_full.rs).
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
    assert!(st.dropped_samples > 0 && st.dropped_batches > 0, "{st:?}");
    assert!(st.pending_batches > 0);
    let dropped = st.dropped_samples;
    std::fs::remove_file(root.join("local")).unwrap();
    std::fs::remove_file(root.join("db")).unwrap();
    std::fs::rename(root.join("db.away"), root.join("db")).unwrap();
    s.flush_everything().unwrap();
    let st = s.status();
    assert!(st.spool_error.is_none() && st.pending_batches == 0, "{st:?}");
    assert_eq!(total(root, &epoch), added - dropped);
    let db = Database::open(&root.join("db")).unwrap();
    let sum = HostSummary::read(&db.host_dir(&epoch, "h1").unwrap().summary_path()).unwrap();
    assert_eq!(sum.lost, dropped, "dropped samples are reported as lost");
}

#[test]
fn startup_write_check_tells_unwritable_from_writable() {
    let dir = tempfile::tempdir().unwrap();
    let ok = dir.path().join("db");
    Store::check_db_writable(&ok, "h1").unwrap();
    let db = Database::open(&ok).unwrap();
    let epoch = db.current_epoch().unwrap().expect("the check creates the first epoch");
    let hd = db.host_dir(&epoch, "h1").unwrap();
    assert!(hd.path.is_dir());
    let left: Vec<_> = std::fs::read_dir(&hd.path).unwrap().flatten().collect();
    assert!(left.is_empty(), "the probe file is removed: {left:?}");
    // Under a regular file: ENOTDIR, naming the path.
    let file = dir.path().join("plain");
    std::fs::write(&file, b"x").unwrap();
    let err = Store::check_db_writable(&file.join("db"), "h1").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("plain/db") && msg.contains("Not a directory"), "{msg}");
}

#[test]
fn reconfigure_changes_live_settings() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(cfg(dir.path(), 1 << 20));
    s.reconfigure(&StoreConfig {
        flush_interval: Duration::from_millis(500),
        publish_interval: Duration::from_secs(5),
        max_memory_bytes: 2 << 20,
        retention_days: 3,
        retention_keep: 2,
        publish_max_delay: Duration::from_secs(42),
        // Where the data goes is not reloadable: kept.
        db: dir.path().join("elsewhere"),
        ..s.config().clone()
    });
    let c = s.config();
    assert_eq!(c.publish_max_delay, Duration::from_secs(42));
    assert_eq!(c.db, cfg(dir.path(), 1 << 20).db);
    assert_eq!(c.flush_interval, Duration::from_millis(500));
    assert_eq!(c.publish_interval, Duration::from_secs(5));
    assert_eq!(c.max_memory_bytes, 2 << 20);
    assert_eq!((c.retention_days, c.retention_keep), (3, 2));
    assert_eq!(s.status().max_memory_bytes, 2 << 20);
}
