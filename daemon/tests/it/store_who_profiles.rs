//! Store: per-process (`by_pid`) and per-cgroup (`by_cgroup`) profiles (FORMAT.md §5.6) are
//! written beside the unchanged flat profiles, merged across flushes through the spool, and a
//! corrupt one is set aside like a flat profile.

use std::path::Path;
use std::sync::Arc;

use crate::store_support;
use dcpid::aggregate::PidProfiles;
use dcpid::aggregate::{ImageInfo, OffsetCounts, Resolved, ResolvedProfile};
use dcpid::faults::Faults;
use dcpid::store::StoreError;
use dcpid::store::{Store, WhoProfiles};
use profile_format::{Database, HostDir, ImageId, ImageKind, Profile, ProfileWho};

fn open(root: &Path, who: WhoProfiles) -> Store {
    let mut s = store_support::open(root);
    s.set_who_profiles(who);
    s
}

fn image() -> Arc<ImageInfo> {
    Arc::new(ImageInfo {
        kind: ImageKind::Elf,
        id: ImageId::BuildId(vec![1; 20]),
        path: b"/usr/bin/web".to_vec(),
        jit_symbols: vec![],
    })
}

/// /usr/bin/web run by pids 42 and 44 (cgroup /a.service) and 43 (/b.service): `n` samples
/// each at offset 0x40 times (1, 2, 3), and pid 43 `n` more at 0x80.
fn batch(n: u64) -> Resolved {
    let img = image();
    let mut r = Resolved::default();
    let mut pp = PidProfiles::default();
    let mut flat = OffsetCounts::default();
    for (pid, k, extra) in [(42u32, 1u64, 0u64), (43, 2, n), (44, 3, 0)] {
        let mut c = OffsetCounts::default();
        c.insert(0x40, (k * n, k * n * 1000));
        if extra > 0 {
            c.insert(0x80, (extra, extra * 1000));
        }
        for (o, v) in &c {
            let f = flat.entry(*o).or_insert((0, 0));
            f.0 += v.0;
            f.1 += v.1;
        }
        pp.insert(
            (img.id.clone(), 0, pid),
            ResolvedProfile { image: Arc::clone(&img), event: 0, counts: c },
        );
        r.who.add_user(pid, Some(&img), 0, k * n + extra);
        r.who.comms.insert(pid, format!("web{pid}").into_bytes());
        r.who.cgroups.insert(pid, if pid == 43 { 8 } else { 7 });
    }
    r.who.cgroup_paths.insert(7, "/a.service".into());
    r.who.cgroup_paths.insert(8, "/b.service".into());
    r.samples = 7 * n;
    r.profiles.insert(
        (img.id.clone(), 0),
        ResolvedProfile { image: Arc::clone(&img), event: 0, counts: flat },
    );
    r.pid_profiles = Some(pp);
    r
}

fn host_dir(root: &Path, s: &Store) -> HostDir {
    let db = Database::open(&root.join("db")).expect("db");
    db.host_dir(s.current_epoch().expect("epoch"), "h1").expect("host dir")
}

fn counts(p: &Profile) -> Vec<(u64, u64)> {
    p.counts.iter().map(|(o, c)| (*o, *c)).collect()
}

#[test]
fn per_process_and_per_cgroup_profiles_add_up_across_flushes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = open(dir.path(), WhoProfiles { by_pid: true, by_cgroup: true, by_command: false });
    s.add(batch(10), 0, 0);
    s.flush_everything().expect("flush");
    s.add(batch(5), 0, 0);
    s.flush_everything().expect("flush");
    let hd = host_dir(dir.path(), &s);
    let id = image().id.clone();

    // The flat profile is what it would be without them, and the only one `profiles` lists.
    let flat = hd.profiles().expect("list");
    assert_eq!(flat.len(), 1, "{flat:?}");
    let p = Profile::read(&hd.profile_path(&id, "cpu-clock")).expect("flat");
    assert_eq!(counts(&p), [(0x40, 90), (0x80, 15)]);
    assert_eq!(p.who, None);

    let pid = |n: u32| ProfileWho::Pid { pid: n, command: format!("web{n}").into_bytes() };
    for (who, want) in [
        (pid(42), vec![(0x40, 15)]),
        (pid(43), vec![(0x40, 30), (0x80, 15)]),
        (pid(44), vec![(0x40, 45)]),
        (ProfileWho::Cgroup { path: "/a.service".into() }, vec![(0x40, 60)]),
        (ProfileWho::Cgroup { path: "/b.service".into() }, vec![(0x40, 30), (0x80, 15)]),
    ] {
        let path = hd.who_profile_path(&id, "cpu-clock", &who);
        let p = Profile::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(counts(&p), want, "{who:?}");
        assert_eq!(p.who.as_ref(), Some(&who));
        assert_eq!(p.header.total_period, want.iter().map(|c| c.1 * 1000).sum::<u64>());
    }
    let listed = hd.who_profiles().expect("list");
    assert_eq!(listed.len(), 5, "{listed:?}");
    assert_eq!(listed.iter().filter(|e| e.pid().is_some()).count(), 3);
    assert_eq!(listed.iter().filter(|e| e.is_cgroup()).count(), 2);
    // The summary counts each sample once.
    let sum = profile_format::HostSummary::read(&hd.summary_path()).expect("summary");
    assert_eq!(sum.samples, 105);
}

/// `by_command` (the default): pids 42 and 44 run `web`, 43 `api`; one profile per command,
/// the processes of one command added up, merged across flushes through the spool, and the
/// commands of an image adding up to its flat profile.
#[test]
fn per_command_profiles_add_up_the_processes_of_a_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = open(dir.path(), WhoProfiles { by_command: true, ..WhoProfiles::default() });
    for n in [10, 5] {
        let mut b = batch(n);
        for (pid, comm) in [(42, "web"), (43, "api"), (44, "web")] {
            b.who.comms.insert(pid, comm.as_bytes().to_vec());
        }
        s.add(b, 0, 0);
        s.flush_everything().expect("flush");
    }
    let hd = host_dir(dir.path(), &s);
    let id = image().id.clone();
    let listed = hd.who_profiles().expect("list");
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(profile_format::WhoProfileEntry::is_command), "{listed:?}");
    let mut sum = std::collections::BTreeMap::new();
    for (cmd, want) in [("web", vec![(0x40, 60)]), ("api", vec![(0x40, 30), (0x80, 15)])] {
        let who = ProfileWho::Command { command: cmd.as_bytes().to_vec() };
        let path = hd.who_profile_path(&id, "cpu-clock", &who);
        let p = Profile::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(counts(&p), want, "{cmd}");
        assert_eq!(p.who.as_ref(), Some(&who));
        for (o, c) in counts(&p) {
            *sum.entry(o).or_insert(0) += c;
        }
    }
    let flat = Profile::read(&hd.profile_path(&id, "cpu-clock")).expect("flat");
    assert_eq!(sum.into_iter().collect::<Vec<_>>(), counts(&flat));
}

#[test]
fn only_what_is_asked_for_is_written() {
    for (who, want) in [
        (WhoProfiles::default(), 0),
        (WhoProfiles { by_pid: true, ..WhoProfiles::default() }, 3),
        (WhoProfiles { by_cgroup: true, ..WhoProfiles::default() }, 2),
        (WhoProfiles { by_command: true, ..WhoProfiles::default() }, 3),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = open(dir.path(), who);
        s.add(batch(10), 0, 0);
        s.flush_everything().expect("flush");
        let hd = host_dir(dir.path(), &s);
        assert_eq!(hd.who_profiles().expect("list").len(), want, "{who:?}");
        assert_eq!(hd.profiles().expect("list").len(), 1, "{who:?}");
    }
}

#[test]
fn a_corrupt_per_process_profile_is_set_aside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = open(dir.path(), WhoProfiles { by_pid: true, ..WhoProfiles::default() });
    s.add(batch(10), 0, 0);
    s.flush_everything().expect("flush");
    let hd = host_dir(dir.path(), &s);
    let who = ProfileWho::Pid { pid: 42, command: b"web42".to_vec() };
    let path = hd.who_profile_path(&image().id, "cpu-clock", &who);
    std::fs::write(&path, b"DCPIPROF garbage").expect("corrupt it");
    s.add(batch(1), 0, 0);
    s.flush_everything().expect("flush");
    let p = Profile::read(&path).expect("fresh profile");
    assert_eq!(counts(&p), [(0x40, 1)], "the corrupt file's counts are not trusted");
    let mut aside = path.clone().into_os_string();
    aside.push(profile_format::CORRUPT_SUFFIX);
    assert!(Path::new(&aside).exists(), "{aside:?} missing");
}

/// [`batch`] with each pid's command.
fn batch_of(n: u64, comms: [&str; 3]) -> Resolved {
    let mut b = batch(n);
    for (pid, comm) in [42, 43, 44].into_iter().zip(comms) {
        b.who.comms.insert(pid, comm.as_bytes().to_vec());
    }
    b
}

/// A command's profile as readers take it: a sole-command stub stands for the flat profile
/// (FORMAT.md §5.6.1).
fn command_counts(hd: &HostDir, cmd: &str) -> Vec<(u64, u64)> {
    let who = ProfileWho::Command { command: cmd.as_bytes().to_vec() };
    let path = hd.who_profile_path(&image().id, "cpu-clock", &who);
    let p = Profile::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(p.who.as_ref(), Some(&who));
    if p.sole {
        counts(&Profile::read(&hd.profile_path(&image().id, "cpu-clock")).expect("flat"))
    } else {
        counts(&p)
    }
}

fn is_stub(hd: &HostDir, cmd: &str) -> bool {
    let who = ProfileWho::Command { command: cmd.as_bytes().to_vec() };
    Profile::is_sole_stub(&hd.who_profile_path(&image().id, "cpu-clock", &who))
}

/// Issue 38: an image only one command ran gets a stub, not a copy of its flat profile, and
/// the stub's command reads as exactly the flat profile; nothing stays in the spool.
#[test]
fn an_image_one_command_ran_alone_gets_a_stub_instead_of_a_copy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = open(dir.path(), WhoProfiles { by_command: true, ..WhoProfiles::default() });
    for n in [10, 5] {
        s.add(batch_of(n, ["web", "web", "web"]), 0, 0);
        s.flush_everything().expect("flush");
    }
    let hd = host_dir(dir.path(), &s);
    assert!(is_stub(&hd, "web"), "{:?}", hd.who_profiles());
    let flat = Profile::read(&hd.profile_path(&image().id, "cpu-clock")).expect("flat");
    assert_eq!(counts(&flat), [(0x40, 90), (0x80, 15)]);
    assert_eq!(command_counts(&hd, "web"), counts(&flat));
    let stub = hd.who_profiles().expect("list")[0].path.clone();
    let (stub_len, flat_len) = (
        std::fs::metadata(&stub).expect("stub").len(),
        std::fs::metadata(hd.profile_path(&image().id, "cpu-clock")).expect("flat").len(),
    );
    assert!(stub_len < flat_len, "stub {stub_len} bytes, flat {flat_len}");
    assert_eq!(s.status().spool_rows, 0, "the stub's increments were marked published");
}

/// Issue 38: a second command starts running the image later in the epoch (and the first
/// goes on): the first command's stub becomes a copy of the flat profile as it was, both
/// commands' profiles are exact, and they add up to the flat profile, across restarts (the
/// stub found on disk) and a crash after any of the second flush's writes.
#[test]
fn a_second_command_turns_the_stub_into_an_exact_copy_across_restarts_and_crashes() {
    for crash_after in [None, Some(1), Some(2), Some(3)] {
        let dir = tempfile::tempdir().expect("tempdir");
        let who = WhoProfiles { by_command: true, ..WhoProfiles::default() };
        let mut s = open(dir.path(), who);
        s.add(batch_of(10, ["web", "web", "web"]), 0, 0);
        s.flush_everything().expect("flush");
        assert!(is_stub(&host_dir(dir.path(), &s), "web"));
        drop(s);
        // A restart: the stub is found on disk.
        let mut s = open(dir.path(), who);
        s.add(batch_of(5, ["web", "api", "web"]), 0, 0);
        if let Some(n) = crash_after {
            s.inject_faults(&Faults { crash_after_writes: Some(n), ..Default::default() });
            match s.flush_everything() {
                Err(StoreError::InjectedCrash(_)) | Ok(()) => {}
                Err(e) => panic!("crash after {n} writes: {e}"),
            }
            drop(s); // a kill -9
            s = open(dir.path(), who);
        }
        s.add(batch_of(1, ["web", "web", "web"]), 0, 0);
        s.flush_everything().expect("flush");
        let hd = host_dir(dir.path(), &s);
        assert!(!is_stub(&hd, "web"), "crash after {crash_after:?}");
        // web: all of the first and last flush, pids 42 and 44 of the second.
        assert_eq!(command_counts(&hd, "web"), [(0x40, 60 + 20 + 6), (0x80, 10 + 1)]);
        assert_eq!(command_counts(&hd, "api"), [(0x40, 10), (0x80, 5)]);
        let flat = Profile::read(&hd.profile_path(&image().id, "cpu-clock")).expect("flat");
        assert_eq!(counts(&flat), [(0x40, 96), (0x80, 16)], "crash after {crash_after:?}");
        assert_eq!(s.status().spool_rows, 0);
    }
}

/// Issue 38: `by_command` turned off (reloaded) while a stub stands for the flat profile:
/// the flat profile then takes samples with no per-command increment, so the stub becomes a
/// copy of the flat profile as it was, and the command keeps exactly its samples.
#[test]
fn turning_by_command_off_keeps_a_stubbed_command_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = open(dir.path(), WhoProfiles { by_command: true, ..WhoProfiles::default() });
    s.add(batch_of(10, ["web", "web", "web"]), 0, 0);
    s.flush_everything().expect("flush");
    assert!(is_stub(&host_dir(dir.path(), &s), "web"));
    s.set_who_profiles(WhoProfiles::default());
    s.add(batch_of(5, ["api", "api", "api"]), 0, 0);
    s.flush_everything().expect("flush");
    let hd = host_dir(dir.path(), &s);
    assert!(!is_stub(&hd, "web"));
    assert_eq!(command_counts(&hd, "web"), [(0x40, 60), (0x80, 10)]);
    let flat = Profile::read(&hd.profile_path(&image().id, "cpu-clock")).expect("flat");
    assert_eq!(counts(&flat), [(0x40, 90), (0x80, 15)]);
}
