//! Issue 36: `--since`/`--until` select time slices, through the one selection model.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use profile_format::{
    Database, EpochId, EventDesc, HostDir, ImageId, ImageKind, Profile, ProfileHeader, Slice,
    SliceKey, SliceWriter,
};

use super::*;
use crate::timerange::apportion;

const EVENT: &str = "cpu-clock";

fn desc() -> EventDesc {
    EventDesc {
        name: EVENT.into(),
        perf_type: 1,
        perf_config: 0,
        period_mean: 1_000_000,
        period_min: 1_000_000,
        period_max: 1_000_000,
    }
}

fn image(n: u8) -> ImageId {
    ImageId::BuildId(vec![n; 20])
}

fn key(n: u8) -> SliceKey {
    SliceKey { event: EVENT.into(), image: Some(image(n)) }
}

/// Write a profile of image `n` holding `counts`.
fn write_profile(d: &HostDir, n: u8, counts: &BTreeMap<u64, u64>) {
    let samples: u64 = counts.values().sum();
    let p = Profile {
        header: ProfileHeader {
            kind: ImageKind::Elf,
            image_id: image(n),
            image_path: format!("/usr/bin/w{n}").into_bytes(),
            event: desc(),
            host: d.host.clone(),
            epoch: d.epoch.clone(),
            total_samples: samples,
            total_period: samples * 1_000_000,
            sequence: 0,
            jit_symbols: Vec::new(),
        },
        who: None,
        counts: counts.clone(),
        sole: false,
    };
    p.write(&d.profile_path(&image(n), EVENT)).unwrap();
}

/// A database with one epoch (started at `t0`) and host `h1`: three minutes, in each of which
/// one image (1, 2, 3) ran at offset 0x10·n, plus a little of image 1 everywhere; the
/// profiles hold the sum of the slices (as after a clean stop).
fn three_minutes() -> (tempfile::TempDir, Database, HostDir, u64) {
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::create(&tmp.path().join("db")).unwrap();
    let t0 = 1_795_960_800; // 2026-11-29T14:00:00Z
    let epoch = db.new_epoch(UNIX_EPOCH + Duration::from_secs(t0), "h1").unwrap();
    assert_eq!(epoch_start(epoch.as_str()), Some(t0));
    let d = db.host_dir(&epoch, "h1").unwrap();
    d.create().unwrap();
    let (mut w, _) = SliceWriter::open(&d.slices_path()).unwrap();
    let mut totals: BTreeMap<u8, BTreeMap<u64, u64>> = BTreeMap::new();
    for m in 0..3u8 {
        let n = m + 1;
        let mut counts = BTreeMap::new();
        counts.insert(key(n), vec![(0x10 * u64::from(n), 1000)]);
        if n != 1 {
            counts.insert(key(1), vec![(0x10, 5)]);
        }
        for (k, pairs) in &counts {
            let i = match &k.image {
                Some(ImageId::BuildId(b)) => b[0],
                _ => unreachable!(),
            };
            for (o, c) in pairs {
                *totals.entry(i).or_default().entry(*o).or_default() += c;
            }
        }
        let s = Slice { start: t0 + 60 * u64::from(m), len: 60, seq: 0, counts };
        w.append(&s).unwrap();
    }
    for (n, c) in &totals {
        write_profile(&d, *n, c);
    }
    (tmp, db, d, t0)
}

fn samples_by_image(l: &Loaded) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for p in &l.profiles {
        *out.entry(String::from_utf8_lossy(&p.profile.header.image_path).into_owned())
            .or_default() += p.samples;
    }
    out
}

#[test]
fn a_range_takes_the_slices_it_covers_in_every_load() {
    let (_tmp, db, _d, t0) = three_minutes();
    let host = HostSel::Named("h1".into());
    // The second minute, requested 10 s into it: rounded to the whole minute.
    let r = TimeRange::new(Some(t0 + 70), Some(t0 + 120));
    let sel = EpochSel::Between(r.since, r.until);
    let dirs = select_host_dirs(&db, &sel, &host).unwrap();
    let mut loaded = load_counts(dirs.clone(), None, true, &mut |_| {}).unwrap();
    restrict_loaded(&mut loaded, r, &mut |w| panic!("{w}")).unwrap();
    let by = samples_by_image(&loaded);
    assert_eq!(by.get("/usr/bin/w2"), Some(&1000), "{by:?}");
    assert_eq!(by.get("/usr/bin/w1"), Some(&5), "{by:?}");
    assert_eq!(by.get("/usr/bin/w3"), None, "{by:?}");
    // Counts offset by offset, and the totals that weight them, follow the range.
    let w2 = loaded.profiles.iter().find(|p| p.profile.header.image_path == b"/usr/bin/w2");
    let w2 = &w2.unwrap().profile;
    assert_eq!(w2.counts, [(0x20, 1000)].into_iter().collect());
    assert_eq!((w2.header.total_samples, w2.header.total_period), (1000, 1000 * 1_000_000));
    let cov = loaded.time.clone().unwrap();
    assert_eq!(cov.covered, Some((t0 + 60, t0 + 120)));
    assert_eq!(cov.rounded_by(), (10, 0));
    // The per-image totals (summary-less here: from the profiles) agree.
    let mut t = load_image_totals(dirs.clone(), &mut |_| {}).unwrap();
    restrict_totals(&mut t, r, &mut |w| panic!("{w}")).unwrap();
    let mut tot: BTreeMap<String, u64> = BTreeMap::new();
    for row in t.rows() {
        *tot.entry(String::from_utf8_lossy(&row.header.image_path).into_owned()).or_default() +=
            row.samples;
    }
    assert_eq!(tot, by);
    assert_eq!(t.time, loaded.time);
    // An image-filtered load (per-symbol reports, dcpilist) too.
    let f = ImageFilter::new("w3");
    let mut one = load(dirs, Some(&f), &mut |_| {}).unwrap();
    restrict_loaded(&mut one, TimeRange::new(Some(t0 + 120), None), &mut |w| panic!("{w}"))
        .unwrap();
    assert_eq!(samples_by_image(&one), [("/usr/bin/w3".to_owned(), 1000)].into_iter().collect());
    // The whole epoch as a range is the profiles exactly.
    let mut all = load_counts(
        select_host_dirs(&db, &EpochSel::Latest, &host).unwrap(),
        None,
        true,
        &mut |_| {},
    )
    .unwrap();
    let before = samples_by_image(&all);
    restrict_loaded(&mut all, TimeRange::new(Some(t0), None), &mut |w| panic!("{w}")).unwrap();
    assert_eq!(samples_by_image(&all), before);
}

#[test]
fn a_host_epoch_without_slices_is_whole_inside_the_range_and_left_out_when_cut() {
    let (_tmp, db, d, t0) = three_minutes();
    std::fs::remove_file(d.slices_path()).unwrap();
    // A later epoch closes the first one at t0 + 1 h.
    let e2: EpochId = db.new_epoch(UNIX_EPOCH + Duration::from_secs(t0 + 3600), "h1").unwrap();
    assert!(e2.as_str() > d.epoch.as_str());
    let dirs = vec![d.clone()];
    let mut warned = Vec::new();
    let mut l = load_counts(dirs.clone(), None, true, &mut |_| {}).unwrap();
    restrict_loaded(&mut l, TimeRange::new(Some(t0), Some(t0 + 3600)), &mut |w| warned.push(w))
        .unwrap();
    assert!(warned.is_empty(), "{warned:?}");
    assert_eq!(samples_by_image(&l).values().sum::<u64>(), 3010);
    let t = l.time.clone().unwrap();
    assert_eq!(t.whole_epochs, vec![format!("{}/h1", d.epoch)]);
    let mut l = load_counts(dirs, None, true, &mut |_| {}).unwrap();
    restrict_loaded(&mut l, TimeRange::new(Some(t0 + 60), Some(t0 + 120)), &mut |w| warned.push(w))
        .unwrap();
    assert!(l.profiles.is_empty());
    assert_eq!(l.time.clone().unwrap().left_out, vec![format!("{}/h1", d.epoch)]);
    assert!(warned.len() == 1 && warned[0].contains("left out"), "{warned:?}");
}

/// Slices stored at 16 and 256 bytes of offset resolution (FORMAT.md §14.2): a range's counts
/// land on the epoch profile's exact offsets, every block keeps its samples, the image total
/// is exact, and the coverage states the resolution.
#[test]
fn coarse_slices_are_placed_on_the_profile_offsets_block_by_block() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::create(&tmp.path().join("db")).unwrap();
    let t0 = 1_795_960_800;
    let epoch = db.new_epoch(UNIX_EPOCH + Duration::from_secs(t0), "h1").unwrap();
    let d = db.host_dir(&epoch, "h1").unwrap();
    d.create().unwrap();
    let (mut w, _) = SliceWriter::open(&d.slices_path()).unwrap();
    w.set_resolution(16);
    let minutes = [vec![(0x104, 30), (0x10c, 10), (0x238, 20)], vec![(0x104, 5), (0x238, 7)]];
    let mut profile: BTreeMap<u64, u64> = BTreeMap::new();
    for (m, pairs) in minutes.iter().enumerate() {
        for &(o, c) in pairs {
            *profile.entry(o).or_default() += c;
        }
        let counts = [(key(1), pairs.clone())].into_iter().collect();
        w.append(&Slice { start: t0 + 60 * m as u64, len: 60, seq: 0, counts }).unwrap();
    }
    // The first minute rolled up at 256 bytes, the second kept at 16.
    w.rollup_at(t0 + 60, 3600, 256).unwrap();
    write_profile(&d, 1, &profile);
    let host = HostSel::Named("h1".into());
    let check = |r: TimeRange, blocks: &[(u64, u64, u64)], res: u64| {
        let dirs = select_host_dirs(&db, &EpochSel::Between(r.since, r.until), &host).unwrap();
        let mut l = load_counts(dirs.clone(), None, true, &mut |_| {}).unwrap();
        restrict_loaded(&mut l, r, &mut |w| panic!("{w}")).unwrap();
        let counts = &l.profiles[0].profile.counts;
        for o in counts.keys() {
            assert!(profile.contains_key(o), "{o:#x} is not an offset of the profile: {counts:x?}");
        }
        for &(lo, hi, want) in blocks {
            let got: u64 = counts.range(lo..hi).map(|(_, c)| c).sum();
            assert_eq!(got, want, "[{lo:#x}, {hi:#x}) in {r:?}: {counts:x?}");
        }
        let want: u64 = blocks.iter().map(|b| b.2).sum();
        assert_eq!(l.profiles[0].samples, want);
        let cov = l.time.clone().unwrap();
        assert_eq!(cov.resolution, res);
        assert!(cov.lines().iter().any(|x| x.contains(&format!("{res}-byte"))), "{cov:?}");
        // The per-image totals agree.
        let mut t = load_image_totals(dirs, &mut |_| {}).unwrap();
        restrict_totals(&mut t, r, &mut |w| panic!("{w}")).unwrap();
        assert_eq!(t.rows().map(|r| r.samples).sum::<u64>(), want);
    };
    // Both minutes: the 256-byte hour and the 16-byte minute, blocks of 16 and 256 bytes.
    check(TimeRange::new(Some(t0), None), &[(0x100, 0x110, 45), (0x200, 0x300, 27)], 256);
    // The second minute alone, at 16 bytes.
    check(TimeRange::new(Some(t0 + 60), None), &[(0x100, 0x110, 5), (0x230, 0x240, 7)], 16);
}

#[test]
fn apportion_keeps_every_block_and_follows_the_reference() {
    let reference: BTreeMap<u64, u64> = [(0x104, 3), (0x108, 1), (0x238, 9)].into_iter().collect();
    // Block 0x100 split 3:1, block 0x230 on its one offset, block 0x400 unknown to the profile.
    let got = apportion(&[(0x100, 10), (0x230, 4), (0x400, 2)], 16, &reference);
    assert_eq!(got, vec![(0x104, 8), (0x108, 2), (0x238, 4), (0x400, 2)]);
    let total: u64 = got.iter().map(|p| p.1).sum();
    assert_eq!(total, 16);
}

/// Issue 36 item 6: the profiles of the current epoch plus the slices after the freshness mark
/// each is stamped with, exactly; a key not published yet gets all its slices and its header
/// from the host's previous epoch; a profile stamped with no recorded mark is left alone.
#[test]
fn fresh_merge_adds_the_slices_after_each_profiles_mark() {
    let (_tmp, db, _old, t0) = three_minutes();
    // The current epoch, an hour later: two minutes of slices.
    let t1 = t0 + 3600;
    let e = db.new_epoch(UNIX_EPOCH + Duration::from_secs(t1), "h1").unwrap();
    let d = db.host_dir(&e, "h1").unwrap();
    d.create().unwrap();
    let (mut w, _) = SliceWriter::open(&d.slices_path()).unwrap();
    let minute = |m: u64, counts: Vec<(SliceKey, Vec<(u64, u64)>)>| Slice {
        start: t1 + 60 * m,
        len: 60,
        seq: 0,
        counts: counts.into_iter().collect(),
    };
    // Minute 0: image 1 (published, stamped with the mark at t1 + 60).
    w.append(&minute(0, vec![(key(1), vec![(0x10, 100)])])).unwrap();
    // Minute 1: image 1 again, image 2 (stamped with a sequence no mark records), image 3
    // (never published: its header comes from the previous epoch).
    w.append(&minute(
        1,
        vec![
            (key(1), vec![(0x10, 7), (0x18, 1)]),
            (key(2), vec![(0x20, 9)]),
            (key(3), vec![(0x30, 4)]),
        ],
    ))
    .unwrap();
    let stamp = |n: u8, counts: &[(u64, u64)], seq: u64| {
        write_profile(&d, n, &counts.iter().copied().collect());
        let p = d.profile_path(&image(n), EVENT);
        let mut prof = Profile::read(&p).unwrap();
        prof.header.sequence = seq;
        prof.write(&p).unwrap();
    };
    stamp(1, &[(0x10, 100)], 5000);
    stamp(2, &[(0x20, 50)], 4321);
    let summary = profile_format::HostSummary {
        format_version: 1,
        host: "h1".into(),
        epoch: e.to_string(),
        events: vec![profile_format::EventSummary { desc: Some(desc()), ..Default::default() }],
        fresh: vec![profile_format::FreshMark { slice_end: t1 + 60, sequence: 5000 }],
        ..Default::default()
    };
    summary.write(&d.summary_path()).unwrap();
    let dirs = select_host_dirs(&db, &EpochSel::Latest, &HostSel::Named("h1".into())).unwrap();
    let mut l = load_counts(dirs.clone(), None, true, &mut |_| {}).unwrap();
    let added = freshen_loaded(&mut l, None, true).unwrap();
    assert_eq!(added.samples, 8 + 4, "image 1's second minute and image 3; not image 2's");
    let by = samples_by_image(&l);
    assert_eq!(by["/usr/bin/w1"], 108);
    assert_eq!(by["/usr/bin/w2"], 50, "stamped with no recorded mark: as published");
    assert_eq!(by["/usr/bin/w3"], 4, "header from the previous epoch");
    let w1 = l.profiles.iter().find(|p| p.profile.header.image_path == b"/usr/bin/w1");
    let w1 = &w1.unwrap().profile;
    assert_eq!(w1.counts, [(0x10, 107), (0x18, 1)].into_iter().collect());
    assert_eq!((w1.header.total_samples, w1.header.total_period), (108, 108_000_000));
    // The per-image totals agree.
    let mut t = load_image_totals(dirs.clone(), &mut |_| {}).unwrap();
    assert_eq!(freshen_totals(&mut t).unwrap().samples, 12);
    let mut tot: BTreeMap<String, u64> = BTreeMap::new();
    for row in t.rows() {
        *tot.entry(String::from_utf8_lossy(&row.header.image_path).into_owned()).or_default() +=
            row.samples;
    }
    assert_eq!(tot, by);
    // With a filter, only the image's keys are added.
    let f = ImageFilter::new("w3");
    let mut one = load(dirs, Some(&f), &mut |_| {}).unwrap();
    freshen_loaded(&mut one, Some(&f), true).unwrap();
    assert_eq!(samples_by_image(&one), [("/usr/bin/w3".to_owned(), 4)].into_iter().collect());
    // No mark recorded (an older daemon, or none written yet): the published profiles as
    // they are; a key without a profile still gets all its slices (nothing of it is published).
    let bare = profile_format::HostSummary { fresh: Vec::new(), ..summary };
    bare.write(&d.summary_path()).unwrap();
    let mut l = load_counts(
        select_host_dirs(&db, &EpochSel::Latest, &HostSel::Named("h1".into())).unwrap(),
        None,
        true,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(freshen_loaded(&mut l, None, true).unwrap().samples, 4);
    assert_eq!(samples_by_image(&l)["/usr/bin/w1"], 100);
}

/// Issue 36 item 6, right after `dcpictl epoch new`: no profile and no summary yet, only
/// slices (at dcpid's 16-byte resolution) and `fresh.json`. The new image is reported under
/// the name `fresh.json` gives, with every sample, its offsets at the slices' resolution;
/// counting only (`apply` false, dcpilist) changes nothing. A slice straddling a mark (a
/// roll-up across it) is not split: that key is left as published.
#[test]
fn a_new_epoch_reports_its_slices_under_the_names_of_fresh_json() {
    let tmp = tempfile::tempdir().unwrap();
    let db = Database::create(&tmp.path().join("db")).unwrap();
    let t0 = 1_795_960_800;
    let e = db.new_epoch(UNIX_EPOCH + Duration::from_secs(t0), "h1").unwrap();
    let d = db.host_dir(&e, "h1").unwrap();
    d.create().unwrap();
    let (mut w, _) = SliceWriter::open(&d.slices_path()).unwrap();
    w.set_resolution(16);
    let counts = [(key(4), vec![(0x13, 5), (0x2f, 2)])].into_iter().collect();
    w.append(&Slice { start: t0, len: 60, seq: 0, counts }).unwrap();
    let dirs = || select_host_dirs(&db, &EpochSel::Latest, &HostSel::Named("h1".into())).unwrap();
    // Without a name (no fresh.json, no summary, no previous epoch): no event to report under.
    let mut t = load_image_totals(dirs(), &mut |_| {}).unwrap();
    assert_eq!(freshen_totals(&mut t).unwrap().samples, 0);
    let mut names = profile_format::SummaryIndex::default();
    names.push(&ProfileHeader {
        kind: ImageKind::Elf,
        image_id: image(4),
        image_path: b"/opt/new/w4".to_vec(),
        event: desc(),
        host: String::new(),
        epoch: e.clone(),
        total_samples: 0,
        total_period: 0,
        sequence: 0,
        jit_symbols: Vec::new(),
    });
    d.write_fresh_names(&names).unwrap();
    let mut t = load_image_totals(dirs(), &mut |_| {}).unwrap();
    let f = freshen_totals(&mut t).unwrap();
    assert_eq!((f.samples, f.resolution), (7, 16));
    let rows: Vec<(String, u64)> = t
        .rows()
        .map(|r| (String::from_utf8_lossy(&r.header.image_path).into_owned(), r.samples))
        .collect();
    assert_eq!(rows, [("/opt/new/w4".to_owned(), 7)]);
    let mut l = load_counts(dirs(), None, true, &mut |_| {}).unwrap();
    let counted = freshen_loaded(&mut l, None, false).unwrap();
    assert_eq!((counted.samples, l.profiles.len()), (7, 0), "counted, not applied");
    freshen_loaded(&mut l, None, true).unwrap();
    let p = &l.profiles[0].profile;
    assert_eq!(p.counts, [(0x10, 5), (0x20, 2)].into_iter().collect(), "at 16 bytes");
    assert_eq!(p.header.total_period, 7 * 1_000_000, "weighted by the event's period");
    // A profile stamped with a mark inside a rolled-up slice: not split, left as published.
    let mut prof =
        Profile { header: p.header.clone(), who: None, counts: p.counts.clone(), sole: false };
    prof.header.sequence = 77;
    prof.write(&d.profile_path(&image(4), EVENT)).unwrap();
    let summary = profile_format::HostSummary {
        format_version: 1,
        host: "h1".into(),
        epoch: e.to_string(),
        fresh: vec![profile_format::FreshMark { slice_end: t0 + 30, sequence: 77 }],
        ..Default::default()
    };
    summary.write(&d.summary_path()).unwrap();
    let mut l = load_counts(dirs(), None, true, &mut |_| {}).unwrap();
    assert_eq!(freshen_loaded(&mut l, None, true).unwrap().samples, 0);
    assert_eq!(samples_by_image(&l)["/opt/new/w4"], 7);
}
