//! Store: hostile files in this host's own directory (a FIFO, a symbolic link to /dev/zero, a
//! sparse 3 GiB file in place of a `.prof`) are set aside and counted; flushing never blocks on
//! them and publishing goes on.

use crate::store_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use dcpid::store::Store;
use profile_format::{Database, EpochId, ImageId, Profile};
use store_support::{batch, open};

/// `flush_everything` on another thread; the store comes back if it returned within 30 s
/// (before the fix a FIFO blocked it forever and /dev/zero made it read without end).
fn bounded_flush(mut s: Store) -> (Store, Result<(), String>) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = s.flush_everything().map_err(|e| e.to_string());
        let _ = tx.send((s, r));
    });
    rx.recv_timeout(Duration::from_secs(30)).expect("flush still blocked after 30 s")
}

fn mkfifo(p: &Path) {
    let ok = std::process::Command::new("mkfifo").arg(p).status().expect("run mkfifo");
    assert!(ok.success(), "mkfifo {}", p.display());
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
    let hostile = |img: u8| {
        let p = path(img);
        let header = std::fs::read(&p).unwrap();
        std::fs::remove_file(&p).unwrap();
        match img {
            1 | 4 => mkfifo(&p),
            2 => std::os::unix::fs::symlink("/dev/zero", &p).unwrap(),
            _ => {
                std::fs::write(&p, &header).unwrap();
                std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(3 << 30).unwrap();
            }
        }
    };
    for img in 1..=4 {
        hostile(img);
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
    let idx = profile_format::sumidx::read(&hd.summary_index_path())
        .unwrap()
        .index
        .expect("index written");
    assert_eq!(idx.images.len(), 3);
    // And a later flush finds nothing more to set aside.
    let mut s = s;
    s.add(batch(1, 0x30, 1), 0, 0);
    let (s, r) = bounded_flush(s);
    r.unwrap();
    assert_eq!(s.status().corrupt_files_set_aside, 4);
}
