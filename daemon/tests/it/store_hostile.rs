//! Store: hostile files in this host's own directory (a FIFO, a symbolic link to /dev/zero, a
//! sparse 3 GiB file in place of a `.prof`) are set aside and counted; flushing never blocks on
//! them and publishing goes on.

use crate::store_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use dcpi_testkit::Hostile;
use dcpid::store::Store;
use profile_format::sumidx;
use profile_format::{Database, EpochId, ImageId, Profile};
use store_support::{batch, open};

/// `flush_everything` on another thread; the store comes back if it returned within 30 s
/// (before the fix a FIFO blocked it forever and /dev/zero made it read without end).
fn bounded_flush(mut s: Store) -> (Store, Result<(), String>) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = s.flush_everything().map_err(|e| e.to_string());
        drop(tx.send((s, r)));
    });
    rx.recv_timeout(Duration::from_secs(30)).expect("flush still blocked after 30 s")
}

/// Names in `dir` that end in `.corrupt` and start with `stem`.
fn set_aside(dir: &Path, stem: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with(stem) && n.ends_with(".corrupt")
        })
        .collect()
}

#[test]
fn fifo_dev_zero_link_and_sparse_3_gib_profile_are_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let epoch: EpochId = s.current_epoch().cloned().unwrap();
    for img in 1..=4 {
        s.add(batch(img, 0x10, 5), 0, 0);
    }
    s.flush_everything().unwrap();
    let db = Database::open(&dir.path().join("db")).unwrap();
    let hd = db.host_dir(&epoch, "h1").unwrap();
    let path = |img: u8| hd.profile_path(&ImageId::BuildId(vec![img; 20]), "cpu-clock");
    let name = |img: u8| path(img).file_name().unwrap().to_string_lossy().into_owned();
    // 1: a FIFO; 2: a link to /dev/zero; 3: a sparse 3 GiB file with a valid header; all in
    // place of profiles this host publishes again. 4: a FIFO in place of a profile it does
    // not publish again, met only by the summary index, which reads every profile.
    for (img, hostile) in
        [(1, Hostile::Fifo), (2, Hostile::DevZeroLink), (3, Hostile::Sparse), (4, Hostile::Fifo)]
    {
        hostile.plant(&path(img));
    }
    for img in 1..=3 {
        s.add(batch(img, 0x20, 2), 0, 0);
    }
    let (s, r) = bounded_flush(s);
    r.unwrap();
    for img in 1..=4 {
        let aside = set_aside(&hd.path, &name(img));
        assert_eq!(aside.len(), 1, "image {img}: set aside once: {aside:?}");
    }
    for img in 1..=3 {
        let p = Profile::read(&path(img)).unwrap();
        assert_eq!(p.counts, BTreeMap::from([(0x20, 2)]), "image {img}: a fresh profile");
    }
    assert!(!path(4).exists());
    assert_eq!(s.status().corrupt_files_set_aside, 4);
    // The index matches the files that remain.
    let idx = sumidx::read(&hd.summary_index_path()).unwrap().index.expect("index written");
    assert_eq!(idx.images.len(), 3);
    // And a later flush finds nothing more to set aside.
    let mut s = s;
    s.add(batch(1, 0x30, 1), 0, 0);
    let (s, r) = bounded_flush(s);
    r.unwrap();
    assert_eq!(s.status().corrupt_files_set_aside, 4);
}

/// Entries of `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// A directory outside the database holding a file and a `.tmp-*` file 2 days old (what a
/// daemon's start removes from its own host directories).
fn victim(root: &Path, name: &str) -> PathBuf {
    let v = root.join(name);
    std::fs::create_dir(&v).unwrap();
    std::fs::write(v.join("keep.txt"), b"not dcpi's\n").unwrap();
    let tmp = v.join(".tmp-old-1-0");
    std::fs::write(&tmp, b"x").unwrap();
    let ok = std::process::Command::new("touch").args(["-d", "2 days ago"]).arg(&tmp).status();
    assert!(ok.unwrap().success());
    v
}

fn total(hd: &profile_format::HostDir, img: u8) -> u64 {
    Profile::read(&hd.profile_path(&ImageId::BuildId(vec![img; 20]), "cpu-clock"))
        .map(|p| p.header.total_samples)
        .unwrap_or(0)
}

/// Issue 35, defect 4: another writer of the shared database replaces this host's directory,
/// then the epoch's, by a link to a directory elsewhere. The daemon never writes (profiles,
/// summaries, temporaries) nor removes anything through the link: the link is set aside and
/// counted in the status, a real directory made in its place holds the new samples. Before
/// the fix it wrote everything wherever the link pointed, and reports showed 0 samples.
#[test]
fn linked_host_and_epoch_directories_are_set_aside_never_written_through() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut s = open(root);
    let epoch: EpochId = s.current_epoch().cloned().unwrap();
    s.add(batch(1, 0x10, 5), 0, 0);
    s.flush_everything().unwrap();
    let db = Database::open(&root.join("db")).unwrap();
    let hd = db.host_dir(&epoch, "h1").unwrap();
    assert_eq!(total(&hd, 1), 5);

    // The host directory becomes a link.
    let v1 = victim(root, "victim1");
    std::fs::remove_dir_all(&hd.path).unwrap();
    std::os::unix::fs::symlink(&v1, &hd.path).unwrap();
    s.add(batch(1, 0x10, 7), 0, 0);
    drop(s.flush_everything());
    assert_eq!(listing(&v1), [".tmp-old-1-0", "keep.txt"], "nothing written through the link");
    let meta = std::fs::symlink_metadata(&hd.path).unwrap();
    assert!(meta.is_dir(), "a real host directory again");
    assert_eq!(total(&hd, 1), 7, "the new samples are in the database");
    let aside = hd.path.with_file_name("h1.corrupt");
    assert!(std::fs::symlink_metadata(&aside).unwrap().file_type().is_symlink());
    let st = s.status();
    assert!(st.corrupt_files_set_aside >= 1, "{st:?}");
    let last = st.last_set_aside.unwrap();
    assert!(last.contains("h1") && last.contains("not a directory"), "{last}");
    // Readers list the real directory only (the link's name ends in .corrupt).
    assert_eq!(db.hosts(&epoch).unwrap(), ["h1"]);

    // Now the epoch's directory: moved away and replaced by a link to it.
    let moved = root.join("moved-epoch");
    let epoch_dir = db.epoch_dir(&epoch);
    std::fs::rename(&epoch_dir, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &epoch_dir).unwrap();
    let before = listing(&moved.join("h1"));
    let profile_before =
        std::fs::read(moved.join("h1").join(
            hd.profile_path(&ImageId::BuildId(vec![1; 20]), "cpu-clock").file_name().unwrap(),
        ))
        .unwrap();
    s.add(batch(1, 0x10, 3), 0, 0);
    s.add(batch(2, 0x20, 4), 0, 0);
    drop(s.flush_everything());
    s.flush_everything().expect("the layout is restored");
    assert_eq!(listing(&moved.join("h1")), before, "nothing written through the epoch link");
    let same =
        std::fs::read(moved.join("h1").join(
            hd.profile_path(&ImageId::BuildId(vec![1; 20]), "cpu-clock").file_name().unwrap(),
        ))
        .unwrap();
    assert_eq!(same, profile_before);
    assert!(std::fs::symlink_metadata(&epoch_dir).unwrap().is_dir());
    assert!(epoch_dir.join("EPOCH").is_file(), "the epoch's marker is back");
    assert_eq!(db.current_epoch().unwrap(), Some(epoch.clone()));
    assert_eq!(total(&hd, 2), 4);
    assert_eq!(total(&hd, 1), 3);
    drop(s);

    // A start with the host directory a link: its stale temporaries are not removed there.
    let v2 = victim(root, "victim2");
    std::fs::remove_dir_all(&hd.path).unwrap();
    std::os::unix::fs::symlink(&v2, &hd.path).unwrap();
    let mut s = open(root);
    s.add(batch(1, 0x10, 1), 0, 0);
    drop(s.flush_everything());
    assert_eq!(listing(&v2), [".tmp-old-1-0", "keep.txt"], "nothing removed or written there");
    assert!(std::fs::symlink_metadata(&hd.path).unwrap().is_dir());
    assert_eq!(total(&hd, 1), 1);
}

/// The start's write check, and `epochs/` itself a link.
#[test]
fn write_check_and_epochs_link_are_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let v = victim(root, "victim");
    let db_root = root.join("db");
    std::fs::create_dir(&db_root).unwrap();
    std::os::unix::fs::symlink(&v, db_root.join("epochs")).unwrap();
    Store::check_db_writable(&db_root, "h1").expect("the link is set aside, the check passes");
    assert_eq!(listing(&v), [".tmp-old-1-0", "keep.txt"]);
    assert!(std::fs::symlink_metadata(db_root.join("epochs")).unwrap().is_dir());
    let mut s = open(root);
    s.add(batch(1, 0x10, 2), 0, 0);
    s.flush_everything().unwrap();
    assert_eq!(listing(&v), [".tmp-old-1-0", "keep.txt"]);
    let db = Database::open(&db_root).unwrap();
    let epoch = db.current_epoch().unwrap().unwrap();
    assert_eq!(total(&db.host_dir(&epoch, "h1").unwrap(), 1), 2);
}

/// The shared kernel symbol store `kallsyms/` a link: the snapshot is not written (nor are
/// unreferenced snapshots removed) through it; the link is set aside and a real directory
/// holds the snapshot.
#[test]
fn linked_kallsyms_directory_is_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let v = victim(root, "victim");
    let mut s = open(root);
    let kdir = root.join("db").join(profile_format::KALLSYMS_DIR);
    std::os::unix::fs::symlink(&v, &kdir).unwrap();
    let text = "ffffffff81000000 T _text\nffffffff81001000 T f\n";
    let snap = profile_format::KallsymsSnapshot::from_proc_text(
        text,
        "",
        "6.18.0".into(),
        Some(vec![7; 20]),
        &|_| None,
    )
    .unwrap();
    s.set_kallsyms(snap);
    s.add(batch(1, 0x10, 1), 0, 0);
    drop(s.flush_everything());
    s.flush_everything().expect("the snapshot is stored on the second try");
    assert_eq!(listing(&v), [".tmp-old-1-0", "keep.txt"]);
    assert!(std::fs::symlink_metadata(&kdir).unwrap().is_dir());
    assert_eq!(listing(&kdir).len(), 1, "the snapshot: {:?}", listing(&kdir));
    let last = s.status().last_set_aside.unwrap();
    assert!(last.contains("kallsyms") && last.contains("not a directory"), "{last}");
    drop(s.apply_retention(std::time::SystemTime::now()));
    assert_eq!(listing(&v), [".tmp-old-1-0", "keep.txt"]);
}
