//! End-to-end tests: format. The database crate on its own, in a sandbox database, as the
//! daemon and the report tool use it (the binaries are exercised by the other modules).

use std::time::{Duration, UNIX_EPOCH};

use dcpi_e2e::Sandbox;
use dcpi_testkit::db::{fixed_event, host_dir, Image};
use profile_format::{Database, ImageId, ImageKind, Profile, UnknownReason};

/// An ELF image whose path needs escaping.
fn odd_image() -> Image {
    Image::elf(ImageId::fallback(b"/tmp/../odd\npath", 1, 2, 3), b"/tmp/../odd\npath")
}

/// Two hosts write into one shared database; a report merges their profiles.
#[test]
fn two_hosts_share_a_database() {
    let sb = Sandbox::new();
    let db = Database::create(&sb.db()).expect("create db");
    let epoch = db.new_epoch(UNIX_EPOCH + Duration::from_secs(1_716_283_800), "a").unwrap();
    for (i, host) in ["a", "b"].into_iter().enumerate() {
        let hd = host_dir(&db, &epoch, host);
        let ev = fixed_event("cpu-clock", 1000);
        odd_image().profile(&ev).count(0x100, 1 + i as u64).write(&hd);
        let unknown = Image {
            kind: ImageKind::Unknown,
            id: ImageId::special("[unknown]", b""),
            ..odd_image()
        };
        unknown.profile(&ev).count(UnknownReason::ProcessGone as u64, 1).write(&hd);
    }
    let db = Database::open(&sb.db()).unwrap();
    assert_eq!(db.current_epoch().unwrap(), Some(epoch.clone()));
    let mut merged: Option<Profile> = None;
    for host in db.hosts(&epoch).unwrap() {
        for entry in db.host_dir(&epoch, &host).unwrap().profiles().unwrap() {
            if entry.image_id.is_none() {
                continue;
            }
            let p = Profile::read(&entry.path).unwrap();
            match &mut merged {
                None => merged = Some(p),
                Some(m) => m.merge(&p).unwrap(),
            }
        }
    }
    let merged = merged.expect("profiles found");
    assert_eq!(merged.counts.get(&0x100), Some(&3));
    assert_eq!(merged.header.total_period, 3000);
}
