//! The database layout: epochs, markers, host directories, listing and retention.

use crate::common;

use std::fs;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use profile_format::{
    Database, EpochId, Error, HostSummary, ImageId, ImageKind, KallsymsSnapshot, Profile,
};

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(secs)
}

#[test]
fn epochs_markers_and_current() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(&dir.path().join("db")).unwrap();
    assert_eq!(db.epochs().unwrap(), vec![]);
    assert_eq!(db.current_epoch().unwrap(), None);
    let e1 = db.new_epoch(at(1_700_000_000), "host-a").unwrap();
    assert_eq!(e1.as_str(), "20231114T221320Z");
    let marker = fs::read_to_string(db.epoch_dir(&e1).join("EPOCH")).unwrap();
    assert!(marker.contains("initiator host-a") && marker.contains(e1.as_str()), "{marker}");
    assert_eq!(db.current_epoch().unwrap(), Some(e1.clone()));
    // Same second again, and a clock that went backwards: always strictly newer.
    let e2 = db.new_epoch(at(1_700_000_000), "host-b").unwrap();
    assert_eq!(e2.as_str(), "20231114T221321Z");
    let e3 = db.new_epoch(at(1_600_000_000), "host-a").unwrap();
    assert_eq!(e3.as_str(), "20231114T221322Z");
    // A directory being created by another host (no marker yet) is skipped by new_epoch and
    // is not current.
    fs::create_dir(db.root().join("epochs/20231114T221323Z")).unwrap();
    assert_eq!(db.current_epoch().unwrap(), Some(e3.clone()));
    let e4 = db.new_epoch(at(1_700_000_003), "host-a").unwrap();
    assert_eq!(e4.as_str(), "20231114T221324Z");
    // Junk in epochs/ is ignored.
    fs::create_dir(db.root().join("epochs/not-an-epoch")).unwrap();
    fs::write(db.root().join("epochs/.tmp-x-1-2"), b"").unwrap();
    let all: Vec<String> = db.epochs().unwrap().iter().map(ToString::to_string).collect();
    assert_eq!(
        all,
        [
            "20231114T221320Z",
            "20231114T221321Z",
            "20231114T221322Z",
            "20231114T221323Z",
            "20231114T221324Z"
        ]
    );
    assert_eq!(db.current_epoch().unwrap(), Some(e4));
    assert!(matches!(db.new_epoch(at(0), "../x"), Err(Error::Invalid { .. })));
    assert!(Database::open(&dir.path().join("missing"))
        .unwrap_err()
        .to_string()
        .contains("missing"));
}

#[test]
fn host_dirs_profiles_and_weird_paths() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(dir.path()).unwrap();
    let epoch = db.new_epoch(at(1_716_283_800), "web-01").unwrap();
    let hd = db.host_dir(&epoch, "web-01").unwrap();
    assert!(db.host_dir(&epoch, "../etc").is_err());
    hd.create().unwrap();
    let long_path = vec![b'x'; 4096];
    let mut newline_path = b"/tmp/../x\nnext line".to_vec();
    newline_path.push(0xff);
    let mut written = Vec::new();
    for (i, path) in [b"/tmp/../x".to_vec(), newline_path, long_path].into_iter().enumerate() {
        let mut p = Profile::new(common::header(ImageKind::Elf, &path));
        p.header.epoch = epoch.clone();
        p.header.image_id = ImageId::fallback(&path, i as u64, 0, 0);
        p.add(0x40, 2, 2);
        let file = hd.profile_path(&p.header.image_id, "cpu-clock");
        assert_eq!(file.parent(), Some(hd.path.as_path()), "{file:?} escapes the host dir");
        p.write(&file).unwrap();
        assert_eq!(Profile::read(&file).unwrap(), p);
        written.push((file, p.header.image_id.clone()));
    }
    let mut unknown = Profile::new(common::header(ImageKind::Unknown, b"[unknown]"));
    unknown.header.image_id = ImageId::special("[unknown]", b"");
    unknown.add(1, 1, 1);
    unknown.write(&hd.unknown_path("raw:0x1a2")).unwrap();
    // Things listing must skip.
    fs::write(hd.path.join(".tmp-web-01-1-abc"), b"partial").unwrap();
    fs::write(hd.path.join("b00.cpu-clock.prof.corrupt"), b"bad").unwrap();
    fs::write(hd.path.join("notes.txt"), b"").unwrap();
    HostSummary { host: "web-01".into(), ..Default::default() }.write(&hd.summary_path()).unwrap();
    common::small_snapshot().write(&hd.kallsyms_path()).unwrap();
    assert_eq!(KallsymsSnapshot::read(&hd.kallsyms_path()).unwrap(), common::small_snapshot());

    let entries = hd.profiles().unwrap();
    assert_eq!(entries.len(), 4, "{entries:#?}");
    let unknown_entry = entries.iter().find(|e| e.image_id.is_none()).unwrap();
    assert!(unknown_entry.event_component.starts_with("raw-0x1a2_"));
    for (file, id) in &written {
        let e = entries.iter().find(|e| &e.path == file).unwrap();
        assert_eq!(e.image_id.as_ref(), Some(id));
        assert_eq!(e.event_component, "cpu-clock");
    }
    let mut names: Vec<_> = entries.iter().map(|e| e.path.clone()).collect();
    names.sort();
    assert_eq!(names, entries.iter().map(|e| e.path.clone()).collect::<Vec<_>>());
    assert_eq!(db.hosts(&epoch).unwrap(), ["web-01"]);
}

#[test]
fn retention_removes_only_own_dir_and_empty_old_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(dir.path()).unwrap();
    let old = db.new_epoch(at(1_000_000_000), "a").unwrap();
    for h in ["a", "b"] {
        db.host_dir(&old, h).unwrap().create().unwrap();
    }
    let cur = db.new_epoch(at(1_000_000_100), "a").unwrap();
    db.host_dir(&cur, "a").unwrap().create().unwrap();

    db.remove_host_epoch(&old, "a").unwrap();
    assert_eq!(db.hosts(&old).unwrap(), ["b"], "b's data must survive");
    db.remove_host_epoch(&old, "b").unwrap();
    assert!(!db.epoch_dir(&old).exists(), "empty old epoch should be gone");
    // The current epoch keeps its directory and marker even when empty.
    db.remove_host_epoch(&cur, "a").unwrap();
    assert!(db.epoch_dir(&cur).join("EPOCH").exists());
    assert_eq!(db.current_epoch().unwrap(), Some(cur.clone()));
    // Removing what is not there is fine (two hosts' retention can race).
    db.remove_host_epoch(&old, "a").unwrap();
    assert!(db.remove_host_epoch(&cur, "a/../b").is_err());
    drop(EpochId::parse(cur.as_str()).unwrap());
}

#[test]
fn profile_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("weird\nname.prof");
    fs::write(&path, b"DCPIPROF\x01\x00").unwrap();
    let err = Profile::read(&path).unwrap_err();
    assert!(matches!(err, Error::Truncated { .. }));
    assert!(err.to_string().contains("weird\nname.prof"), "{err}");
    let err = Profile::read(&dir.path().join("absent.prof")).unwrap_err();
    assert!(matches!(err, Error::Io { .. }) && err.to_string().contains("absent.prof"));
    fs::write(&path, b"#!/bin/sh\necho not a profile\n").unwrap();
    assert!(matches!(Profile::read(&path), Err(Error::BadMagic { .. })));
}

#[test]
fn kallsyms_shared_store_reference_legacy_and_retention() {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(&dir.path().join("db")).unwrap();
    let e1 = db.new_epoch(at(1_700_000_000), "a").unwrap();
    let e2 = db.new_epoch(at(1_700_000_100), "a").unwrap();
    let snap = common::small_snapshot();
    let bytes = snap.to_file_bytes(std::path::Path::new("s")).unwrap();
    let (id, written) = db.put_kallsyms(&bytes).unwrap();
    assert!(written > 0);
    assert_eq!(db.put_kallsyms(&bytes).unwrap(), (id.clone(), 0), "stored once");
    let h1 = db.host_dir(&e1, "a").unwrap();
    h1.create().unwrap();
    h1.write_kallsyms_ref(&id).unwrap();
    assert_eq!(h1.read_kallsyms().unwrap(), snap);
    // An older database: the snapshot inside the host directory.
    let h2 = db.host_dir(&e2, "b").unwrap();
    h2.create().unwrap();
    snap.write(&h2.kallsyms_path()).unwrap();
    assert_eq!(h2.read_kallsyms().unwrap(), snap);
    // Neither: an error naming the reference file.
    let h3 = db.host_dir(&e2, "c").unwrap();
    h3.create().unwrap();
    let err = h3.read_kallsyms().unwrap_err().to_string();
    assert!(err.contains("kallsyms.ref"), "{err}");
    // A snapshot whose content does not match its name is refused.
    let mut other = snap.clone();
    other.kernel_release = "other".into();
    let (id2, _) =
        db.put_kallsyms(&other.to_file_bytes(std::path::Path::new("s")).unwrap()).unwrap();
    fs::copy(db.kallsyms_store_path(&id2), db.kallsyms_store_path(&id)).unwrap();
    assert!(matches!(h1.read_kallsyms(), Err(Error::Corrupt { field: "content id", .. })));
    fs::remove_file(db.kallsyms_store_path(&id)).unwrap();
    db.put_kallsyms(&bytes).unwrap();
    // Retention: only unreferenced snapshots old enough go.
    let now = SystemTime::now();
    assert!(db.gc_kallsyms(now, Duration::from_secs(3600)).unwrap().is_empty(), "too young");
    let later = now + Duration::from_secs(7200);
    assert_eq!(db.gc_kallsyms(later, Duration::from_secs(3600)).unwrap(), vec![id2.clone()]);
    assert!(db.kallsyms_store_path(&id).exists(), "referenced snapshot kept");
    db.remove_host_epoch(&e1, "a").unwrap();
    assert_eq!(db.gc_kallsyms(later, Duration::from_secs(3600)).unwrap(), vec![id.clone()]);
    // A bad reference is an error naming it.
    fs::write(h2.kallsyms_ref_path(), "dcpi-kallsyms-ref 9\nsnapshot x\n").unwrap();
    assert!(matches!(h2.read_kallsyms(), Err(Error::UnknownVersion { version: 9, .. })));
}
