//! Store: a bad record in the spool (a FIFO or directory where a segment should be, a
//! segment cut short after it was indexed, a record that passes its checksum but describes a
//! profile no reader accepts) is quarantined and counted; everything else is published, and
//! publishing goes on.

use crate::store_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dcpid::store::spool::{Increment, Spool, SpoolImage, SummaryDelta};
use profile_format::{Database, EpochId, EventDesc, ImageId, ImageKind, Profile};
use store_support::{batch, desc, open};

fn id_text(img: u8) -> String {
    ImageId::BuildId(vec![img; 20]).to_text()
}

/// Append one record per (image, desc, offset, count) to the spool at `dir`, as a previous run
/// would have left them.
fn spool_records(dir: &Path, epoch: &EpochId, recs: &[(u8, &EventDesc, u64, u64)]) {
    let (mut sp, _) = Spool::open(dir, Duration::from_secs(60)).unwrap();
    let img =
        SpoolImage { kind: ImageKind::Elf, path: b"/usr/bin/x".to_vec(), jit: vec![], who: None };
    for &(i, d, off, count) in recs {
        let text = id_text(i);
        let counts = [(off, count)];
        let inc = [Increment {
            image: Some((text.as_str(), &img)),
            desc: d,
            total_period: count * 1000,
            counts: &counts,
        }];
        let delta = SummaryDelta { samples: count, ..Default::default() };
        sp.append(epoch.as_str(), &inc, &delta, Instant::now()).unwrap();
    }
    sp.sync().unwrap();
}

fn profile(root: &Path, epoch: &EpochId, img: u8) -> Option<Profile> {
    let db = Database::open(&root.join("db")).unwrap();
    let p = db
        .host_dir(epoch, "h1")
        .unwrap()
        .profile_path(&ImageId::BuildId(vec![img; 20]), "cpu-clock");
    p.exists().then(|| Profile::read(&p).unwrap())
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    v.sort();
    v
}

/// A store over the database (to learn its epoch), closed again.
fn first_epoch(root: &Path) -> EpochId {
    let mut s = open(root);
    let e = s.current_epoch().cloned().unwrap();
    s.flush_everything().unwrap();
    e
}

#[test]
fn checksum_valid_record_of_an_invalid_profile_is_quarantined_and_the_rest_published() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let epoch = first_epoch(root);
    // The period window is not ordered (min > mean): no reader would accept the profile.
    let mut bad = desc();
    bad.period_min = 5000;
    let good = desc();
    spool_records(
        &root.join("spool/h1"),
        &epoch,
        &[(1, &good, 0x10, 3), (2, &bad, 0x20, 4), (1, &good, 0x30, 5), (3, &good, 0x40, 6)],
    );
    let mut s = open(root);
    s.flush_everything().expect("publishing goes on past the bad record");
    assert_eq!(profile(root, &epoch, 1).unwrap().counts, BTreeMap::from([(0x10, 3), (0x30, 5)]));
    assert_eq!(profile(root, &epoch, 3).unwrap().counts, BTreeMap::from([(0x40, 6)]));
    assert!(profile(root, &epoch, 2).is_none());
    let st = s.status();
    assert_eq!(st.spool_quarantined, 1, "{st:?}");
    assert_eq!(st.db_error, None);
    assert_eq!(st.spool_rows, 0, "nothing left to publish: {st:?}");
    // New data keeps flowing.
    s.add(batch(2, 0x50, 7), 0, 0);
    s.flush_everything().unwrap();
    assert_eq!(profile(root, &epoch, 2).unwrap().counts, BTreeMap::from([(0x50, 7)]));
    // The segment holding the bad record is kept aside for inspection once published.
    drop(s);
    let s = open(root);
    drop(s);
    let aside: Vec<_> = std::fs::read_dir(root.join("spool/h1"))
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".corrupt"))
        .collect();
    assert_eq!(aside.len(), 1, "segment set aside");
}

#[test]
fn fifo_or_directory_in_place_of_a_segment_does_not_keep_the_spool_closed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let epoch = first_epoch(root);
    // This host's log (`<spool>/<host>`).
    let spool = root.join("spool/h1");
    spool_records(&spool, &epoch, &[(1, &desc(), 0x10, 3)]);
    // Older segment names than the real one: they are loaded first.
    let fifo = spool.join(format!("seg-{:016x}.log", 1));
    dcpi_testkit::Hostile::Fifo.plant(&fifo);
    std::fs::create_dir(spool.join(format!("seg-{:016x}.log", 2))).unwrap();
    let (tx, rx) = mpsc::channel();
    let r = root.to_path_buf();
    std::thread::spawn(move || {
        let mut s = open(&r);
        let res = s.flush_everything().map_err(|e| e.to_string());
        drop(tx.send((res, s.status())));
    });
    let (res, st) = rx.recv_timeout(Duration::from_secs(30)).expect("store blocked on a FIFO");
    res.expect("flush with the good segment");
    assert_eq!(profile(root, &epoch, 1).unwrap().counts, BTreeMap::from([(0x10, 3)]));
    assert_eq!(st.spool_quarantined, 2, "{st:?}");
    assert_eq!(st.spool_error, None);
    assert!(fifo.with_extension("log.corrupt").exists(), "FIFO set aside");
}

#[test]
fn segment_cut_short_after_indexing_is_quarantined_not_retried_forever() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let epoch = first_epoch(root);
    // This host's log (`<spool>/<host>`).
    let spool = root.join("spool/h1");
    spool_records(&spool, &epoch, &[(1, &desc(), 0x10, 3), (2, &desc(), 0x20, 4)]);
    let mut s = open(root);
    // After the store indexed the segment, something cuts it short (a full disk repaired by
    // hand, an fsck): the second record's bytes are gone.
    let seg = segments(&spool).pop().unwrap();
    let len = std::fs::metadata(&seg).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&seg).unwrap().set_len(len - 3).unwrap();
    s.flush_everything().expect("publishing goes on");
    assert_eq!(profile(root, &epoch, 1).unwrap().counts, BTreeMap::from([(0x10, 3)]));
    let st = s.status();
    assert_eq!(st.spool_quarantined, 1, "{st:?}");
    assert_eq!(st.spool_error, None);
    assert_eq!(st.spool_rows, 0);
    s.add(batch(3, 0x50, 7), 0, 0);
    s.flush_everything().unwrap();
    assert_eq!(profile(root, &epoch, 3).unwrap().counts, BTreeMap::from([(0x50, 7)]));
}
