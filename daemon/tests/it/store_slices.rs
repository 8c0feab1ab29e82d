//! Store: the time slices of each host-epoch (FORMAT.md §14) hold exactly the samples of the
//! epoch's profiles, a flush in the middle of a slice neither loses nor doubles nor overlaps
//! anything, and a torn tail left by a crash is cut before the next append.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::store_support::{batch, open};
use dcpid::store::ROLLUP_RESOLUTION;
use dcpid::store::SLICE_RESOLUTION;
use dcpid::store::{SliceSettings, Store};
use profile_format::{Database, HostDir, Profile, SliceKey, SliceLog};

fn host_dir(root: &Path, s: &Store) -> HostDir {
    let db = Database::open(&root.join("db")).expect("db");
    db.host_dir(s.current_epoch().expect("epoch"), "h1").expect("host dir")
}

/// Per (key, offset), the counts of the host directory's flat profiles, image offsets
/// rounded down to `res` bytes (the slices' resolution, FORMAT.md §14.2).
fn profile_counts_at(hd: &HostDir, res: u64) -> BTreeMap<(SliceKey, u64), u64> {
    let mut t = BTreeMap::new();
    for e in hd.profiles().expect("profiles") {
        let p = Profile::read(&e.path).expect("profile");
        let key = SliceKey { event: p.header.event.name.clone(), image: e.image_id.clone() };
        for (o, c) in &p.counts {
            let o = if key.image.is_some() { o - o % res } else { *o };
            *t.entry((key.clone(), o)).or_insert(0) += c;
        }
    }
    t
}

/// [`profile_counts_at`] the resolution of `log`'s slices, which dcpid writes at
/// `SLICE_RESOLUTION` (16 bytes).
fn profile_counts(hd: &HostDir, log: &SliceLog) -> BTreeMap<(SliceKey, u64), u64> {
    let res = log.range_resolution(&log.range(None, None));
    assert_eq!(res, SLICE_RESOLUTION, "appended at the daemon's resolution");
    profile_counts_at(hd, res)
}

fn slice_counts(log: &SliceLog) -> BTreeMap<(SliceKey, u64), u64> {
    let mut t = BTreeMap::new();
    for (k, v) in log.range(None, None).sum() {
        for (o, c) in v {
            t.insert((k.clone(), o), c);
        }
    }
    t
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs()
}

/// Wait (on the clock, not a fixed sleep) until the Unix second is past `t`.
fn wait_past(t: u64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while unix_now() <= t {
        assert!(Instant::now() < deadline, "the clock does not advance");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn with_slices(root: &Path, interval: u64) -> Store {
    let mut s = open(root);
    s.set_slices(SliceSettings {
        interval: Duration::from_secs(interval),
        rollup_after: Duration::from_secs(6 * 3600),
    });
    s
}

#[test]
fn slices_add_up_to_the_epoch_profiles_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = with_slices(dir.path(), 1);
    // Batches in at least three different seconds (one-second slices), ticking in between.
    for round in 0..3u64 {
        let t = unix_now();
        s.add(batch(1, 0x100 + round, 5 + round), 0, 0);
        s.add(batch(2, 0x40, 7), 0, 0);
        s.tick();
        wait_past(t);
    }
    s.add(batch(1, 0x100, 1), 0, 0);
    s.flush_everything().expect("flush");
    let hd = host_dir(dir.path(), &s);
    let log = hd.read_slices().expect("readable").expect("a slice log");
    assert!(log.slices.len() >= 3, "one slice per second at least: {:?}", log.slices.len());
    assert_eq!(slice_counts(&log), profile_counts(&hd, &log));
    assert_eq!(log.samples(), 5 + 6 + 7 + 3 * 7 + 1);
    // Slices never overlap, and each lies within one one-second slot.
    let r = log.range(None, None);
    for w in r.slices.windows(2) {
        assert!(
            w[0].end() <= w[1].start,
            "{:?} overlaps {:?}",
            (w[0].start, w[0].len),
            (w[1].start, w[1].len)
        );
    }
    assert!(r.slices.iter().all(|x| x.len == 1));
    let st = s.slice_stats();
    assert_eq!(st.records, log.slices.len() as u64);
    assert!(st.bytes > 0 && st.dropped_samples == 0, "{st:?}");
}

#[test]
fn a_flush_mid_slice_continues_without_overlap_or_double_count() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Hour slices: every flush of this test falls inside one slice.
    let mut s = with_slices(dir.path(), 3600);
    s.add(batch(1, 0x10, 3), 0, 0);
    s.flush_everything().expect("flush");
    let hd = host_dir(dir.path(), &s);
    let first = hd.read_slices().expect("readable").expect("log");
    assert_eq!(first.slices.len(), 1);
    let t = first.slices[0].end();
    wait_past(t);
    s.add(batch(1, 0x10, 4), 0, 0);
    s.add(batch(3, 0x99, 2), 0, 0);
    s.flush_everything().expect("flush");
    // Nothing new: a flush appends nothing.
    s.flush_everything().expect("flush");
    let log = hd.read_slices().expect("readable").expect("log");
    assert_eq!(log.slices.len(), 2, "{:?}", log.slices);
    assert_eq!(log.slices[1].start, log.slices[0].end(), "continued where the first ended");
    assert_eq!(slice_counts(&log), profile_counts(&hd, &log));
    assert_eq!(log.samples(), 9);
}

#[test]
fn a_torn_tail_is_cut_and_appending_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = with_slices(dir.path(), 3600);
    s.add(batch(1, 0x10, 3), 0, 0);
    s.flush_everything().expect("flush");
    let hd = host_dir(dir.path(), &s);
    // The minute's segment (FORMAT.md §14.5): the file a crash can tear.
    let hours = hd.slice_files().expect("files").segments;
    assert_eq!(hours.len(), 1, "{hours:?}");
    let path = hd.slice_segment_path(*hours.iter().next().expect("a segment"));
    let good = std::fs::metadata(&path).expect("log").len();
    // What a crash in the middle of an append leaves: part of a record.
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(&[200, 0, 0, 0, 1, 2, 3, 4, 5]).expect("write");
    }
    let log = hd.read_slices().expect("a torn tail is no error").expect("log");
    assert_eq!((log.slices.len(), log.torn_tail), (1, 9));
    // A new daemon (a new store) cuts it and appends after it.
    drop(s);
    let mut s = with_slices(dir.path(), 3600);
    s.add(batch(1, 0x10, 4), 0, 0);
    s.flush_everything().expect("flush");
    let log = hd.read_slices().expect("readable").expect("log");
    assert_eq!(log.torn_tail, 0);
    assert!(log.valid_len > good);
    assert_eq!(slice_counts(&log), profile_counts(&hd, &log));
    assert_eq!(log.samples(), 7);
}

#[test]
fn no_slices_when_turned_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = with_slices(dir.path(), 0);
    s.add(batch(1, 0x10, 3), 0, 0);
    s.flush_everything().expect("flush");
    let hd = host_dir(dir.path(), &s);
    assert!(hd.read_slices().expect("readable").is_none());
    assert_eq!(profile_counts_at(&hd, 1).values().sum::<u64>(), 3);
}

/// FORMAT.md §14.5: minutes go to their UTC hour's segment; an hour older than
/// `slice_rollup_after` becomes one hour record appended to `slices.hours.log` and its segment
/// is removed, without rewriting anything live (the current segment keeps its inode and its
/// bytes), and every sample stays.
#[test]
fn old_hours_are_rolled_up_by_appending_not_rewriting() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = open(dir.path());
    s.set_slices(SliceSettings {
        interval: Duration::from_secs(60),
        rollup_after: Duration::from_secs(3600),
    });
    let hd = host_dir(dir.path(), &s);
    // Two hours of minutes from three and two hours ago, as an earlier run appended them.
    let now = unix_now();
    let h0 = now - now % 3600 - 3 * 3600;
    let key = SliceKey {
        event: "cpu-clock".into(),
        image: Some(profile_format::ImageId::BuildId(vec![9; 20])),
    };
    hd.create().expect("host dir");
    {
        let (mut w, _) = profile_format::SegmentWriter::open(&hd).expect("segments");
        w.set_resolution(16);
        for m in 0..120 {
            let counts = [(key.clone(), vec![(0x100 + m % 5 * 16, 3)])].into_iter().collect();
            w.append(&profile_format::Slice { start: h0 + m * 60, len: 60, seq: 0, counts })
                .expect("append");
        }
    }
    assert_eq!(hd.slice_files().expect("files").segments.len(), 2);
    // This run: a first minute appended, then the roll-up of the two old hours.
    s.add(batch(1, 0x10, 3), 0, 0);
    s.flush_everything().expect("flush");
    let files = hd.slice_files().expect("files");
    let current = now - now % 3600;
    assert!(files.hours, "{files:?}");
    assert_eq!(files.segments, [current].into_iter().collect(), "old segments removed");
    let hours = std::fs::metadata(hd.slice_hours_path()).expect("hours");
    let st = s.slice_stats();
    assert_eq!(st.rollups, 2);
    assert_eq!(st.rollup_bytes + 16, hours.len(), "the roll-ups wrote their records only");
    let seg = hd.slice_segment_path(current);
    let (ino, len) = {
        let m = std::fs::metadata(&seg).expect("segment");
        (m.ino(), m.len())
    };
    let before = std::fs::read(&seg).expect("segment");
    // Another minute: appended to the same segment, nothing rewritten.
    wait_past(unix_now());
    s.add(batch(1, 0x20, 4), 0, 0);
    s.flush_everything().expect("flush");
    let m = std::fs::metadata(&seg).expect("segment");
    assert_eq!(m.ino(), ino, "the live segment is never replaced");
    assert!(m.len() > len);
    assert_eq!(&std::fs::read(&seg).expect("segment")[..before.len()], &before[..]);
    let log = hd.read_slices().expect("readable").expect("slices");
    assert_eq!(log.samples(), 120 * 3 + 3 + 4, "every sample kept");
    let hours: Vec<_> = log.slices.iter().filter(|x| x.len == 3600).collect();
    assert_eq!(hours.len(), 2);
    assert!(hours.iter().all(|x| log.resolution_of(x) == ROLLUP_RESOLUTION));
}
