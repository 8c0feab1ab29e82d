//! End-to-end tests: format. The database crate on its own, in a sandbox database, as the
//! daemon and the report tool use it (the binaries are exercised by the other modules).

use std::time::{Duration, UNIX_EPOCH};

use dcpi_e2e::Sandbox;
use profile_format::{
    Database, EpochId, EventDesc, ImageId, ImageKind, Profile, ProfileHeader, UnknownReason,
};

fn header(epoch: &EpochId, host: &str) -> ProfileHeader {
    ProfileHeader {
        kind: ImageKind::Elf,
        image_id: ImageId::fallback(b"/tmp/../odd\npath", 1, 2, 3),
        image_path: b"/tmp/../odd\npath".to_vec(),
        event: EventDesc {
            name: "cpu-clock".into(),
            perf_type: 1,
            perf_config: 0,
            period_mean: 1000,
            period_min: 1000,
            period_max: 1000,
        },
        host: host.into(),
        epoch: epoch.clone(),
        total_samples: 0,
        total_period: 0,
        sequence: 0,
        jit_symbols: vec![],
    }
}

/// Two hosts write into one shared database; a report merges their profiles.
#[test]
fn two_hosts_share_a_database() {
    let sb = Sandbox::new();
    let db = Database::create(&sb.db()).expect("create db");
    let epoch = db.new_epoch(UNIX_EPOCH + Duration::from_secs(1_716_283_800), "a").unwrap();
    for (i, host) in ["a", "b"].into_iter().enumerate() {
        let hd = db.host_dir(&epoch, host).unwrap();
        hd.create().unwrap();
        let mut p = Profile::new(header(&epoch, host));
        p.add(0x100, 1 + i as u64, 1000 * (1 + i as u64));
        p.write(&hd.profile_path(&p.header.image_id, "cpu-clock")).unwrap();
        let mut u = Profile::new(ProfileHeader {
            kind: ImageKind::Unknown,
            image_id: ImageId::special("[unknown]", b""),
            ..header(&epoch, host)
        });
        u.add(UnknownReason::ProcessGone as u64, 1, 1000);
        u.write(&hd.unknown_path("cpu-clock")).unwrap();
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
