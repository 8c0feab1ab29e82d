//! Hostile files in place of database files (FORMAT.md §6.1): a FIFO, a symbolic link to
//! `/dev/zero`, a sparse 3 GiB file, a profile under another profile's name. Every reader
//! answers at once with an error naming the file; none blocks, reads without end or allocates
//! the file's size.

use crate::common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use dcpi_testkit::Hostile;
use profile_format::{
    Database, EpochId, Error, HostDir, HostSummary, ImageId, KallsymsSnapshot, Profile,
};

/// Run `f` on another thread; fail if it does not return within 30 s (a FIFO would block a
/// plain `open` forever, `/dev/zero` a plain `read`).
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        drop(tx.send(f()));
    });
    rx.recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|_| panic!("{what}: reader still blocked after 30 s"))
}

fn host_dir() -> (tempfile::TempDir, HostDir) {
    let dir = tempfile::tempdir().unwrap();
    let db = Database::create(dir.path()).unwrap();
    let epoch = EpochId::parse("20240521T093000Z").unwrap();
    let hd = db.host_dir(&epoch, "web-01").unwrap();
    hd.create().unwrap();
    (dir, hd)
}

fn profile_path(hd: &HostDir) -> PathBuf {
    let p = common::small_profile();
    hd.profile_path(&p.header.image_id, &p.header.event.name)
}

fn expect_named(e: &Error, path: &Path) {
    assert!(e.to_string().contains(&path.display().to_string()), "error does not name it: {e}");
}

#[test]
fn fifo_in_place_of_a_profile_is_refused_without_blocking() {
    let (_d, hd) = host_dir();
    let p = profile_path(&hd);
    Hostile::Fifo.plant(&p);
    let q = p.clone();
    let e = bounded("Profile::read of a FIFO", move || Profile::read(&q)).unwrap_err();
    assert!(matches!(e, Error::NotRegularFile { kind: "a FIFO", .. }), "{e}");
    expect_named(&e, &p);
    // The summary index (which reads every profile) fails the same way.
    let e = bounded("index", move || profile_format::SummaryIndex::of_host_dir(&hd)).unwrap_err();
    expect_named(&e, &p);
}

#[test]
fn symlink_to_dev_zero_is_refused() {
    let (_d, hd) = host_dir();
    let p = profile_path(&hd);
    Hostile::DevZeroLink.plant(&p);
    let q = p.clone();
    let e = bounded("Profile::read of /dev/zero", move || Profile::read(&q)).unwrap_err();
    assert!(matches!(e, Error::NotRegularFile { kind: "a symbolic link", .. }), "{e}");
    expect_named(&e, &p);
    // The same for a kernel symbol snapshot, the summary and the snapshot reference.
    for name in ["kallsyms.snap", "summary.json", "kallsyms.ref"] {
        Hostile::DevZeroLink.plant(&hd.path.join(name));
    }
    let hd2 = hd.clone();
    let e = bounded("kallsyms.ref", move || hd2.read_kallsyms()).unwrap_err();
    expect_named(&e, &hd.kallsyms_ref_path());
    let s = hd.kallsyms_path();
    let e = bounded("kallsyms.snap", move || KallsymsSnapshot::read(&s)).unwrap_err();
    expect_named(&e, &hd.kallsyms_path());
    let s = hd.summary_path();
    let e = bounded("summary", move || HostSummary::read(&s)).unwrap_err();
    expect_named(&e, &hd.summary_path());
}

#[test]
fn sparse_3_gib_files_are_refused_without_reading_them() {
    let (_d, hd) = host_dir();
    let p = profile_path(&hd);
    // A real profile's header, then a hole up to 3 GiB: larger than any profile, refused as
    // such (TooLarge: report tools refuse it even where they skip damaged optional files),
    // and not read.
    let good = common::small_profile().encode();
    std::fs::write(&p, &good).unwrap();
    Hostile::Sparse.plant(&p);
    let q = p.clone();
    let e = bounded("3 GiB profile", move || Profile::read(&q)).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    expect_named(&e, &p);
    // A header that announces the whole 3 GiB: over the bound, refused before reading.
    let mut head = good.clone();
    head[12..20].copy_from_slice(&(3u64 << 30).to_le_bytes());
    std::fs::write(&p, &head).unwrap();
    Hostile::Sparse.plant(&p);
    let q = p.clone();
    let e = bounded("3 GiB announced", move || Profile::read(&q)).unwrap_err();
    assert!(matches!(e, Error::Corrupt { field: "length", .. }), "{e}");
    assert!(e.to_string().contains("announces"), "{e}");
    // All zeros (no header at all): a foreign file.
    std::fs::remove_file(&p).unwrap();
    Hostile::Sparse.plant(&p);
    let q = p.clone();
    let e = bounded("3 GiB of zeros", move || Profile::read(&q)).unwrap_err();
    assert!(matches!(e, Error::BadMagic { .. }), "{e}");
    // A 3 GiB summary.json is refused by its size.
    let s = hd.summary_path();
    Hostile::Sparse.plant(&s);
    let e = bounded("3 GiB summary", move || HostSummary::read(&s)).unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
}

#[test]
fn profile_under_another_profiles_name_is_corrupt() {
    let (_d, hd) = host_dir();
    let p = common::small_profile();
    // Valid file, but named after another image.
    let other = ImageId::from_build_id(&[7; 20]).unwrap();
    let wrong = hd.profile_path(&other, &p.header.event.name);
    std::fs::write(&wrong, p.encode()).unwrap();
    let e = Profile::read(&wrong).unwrap_err();
    assert!(matches!(e, Error::Corrupt { field: "file name", .. }), "{e}");
    expect_named(&e, &wrong);
    // Or after another event.
    let wrong = hd.profile_path(&p.header.image_id, "cycles");
    std::fs::write(&wrong, p.encode()).unwrap();
    assert!(matches!(Profile::read(&wrong), Err(Error::Corrupt { field: "file name", .. })));
    // Or as the unknown profile.
    let wrong = hd.unknown_path(&p.header.event.name);
    std::fs::write(&wrong, p.encode()).unwrap();
    assert!(matches!(Profile::read(&wrong), Err(Error::Corrupt { field: "file name", .. })));
    // Under its own name it reads; under a name outside the scheme the name is not checked.
    let right = hd.profile_path(&p.header.image_id, &p.header.event.name);
    std::fs::write(&right, p.encode()).unwrap();
    assert_eq!(Profile::read(&right).unwrap(), p);
    let free = hd.path.join("copy.bin");
    std::fs::write(&free, p.encode()).unwrap();
    assert_eq!(Profile::read(&free).unwrap(), p);
}
