use super::*;
use proptest::prelude::*;

fn key(event: &str, img: Option<u8>) -> SliceKey {
    SliceKey {
        event: event.into(),
        image: img.map(|b| ImageId::from_build_id(&[b, 1, 2, 3]).unwrap()),
    }
}

fn slice(start: u64, len: u64, entries: &[(SliceKey, Vec<(u64, u64)>)]) -> Slice {
    Slice { start, len, seq: 0, counts: entries.iter().cloned().collect() }
}

/// Per (key, offset) totals of a set of slices.
fn totals<'a>(it: impl IntoIterator<Item = &'a Slice>) -> BTreeMap<(SliceKey, u64), u64> {
    let mut t = BTreeMap::new();
    for s in it {
        for (k, v) in &s.counts {
            for (o, c) in v {
                *t.entry((k.clone(), *o)).or_insert(0) += c;
            }
        }
    }
    t
}

fn sample_slices() -> Vec<Slice> {
    vec![
        slice(600, 60, &[(key("cpu-clock", Some(1)), vec![(0, 3), (17, 1), (4096, 9)])]),
        slice(
            660,
            60,
            &[
                (key("cpu-clock", Some(1)), vec![(17, 2)]),
                (key("cpu-clock", Some(2)), vec![(5, 1)]),
                (key("cpu-clock", None), vec![(1, 4)]),
            ],
        ),
        slice(720, 60, &[(key("page-faults", Some(2)), vec![(u64::MAX, 1)])]),
    ]
}

fn write_log(path: &Path, slices: &[Slice]) -> SliceWriter {
    let (mut w, rep) = SliceWriter::open(path).unwrap();
    assert_eq!(rep, OpenReport::default());
    for s in slices {
        w.append(s).unwrap();
    }
    w
}

#[test]
fn appended_slices_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(SLICES_FILE);
    let w = write_log(&p, &sample_slices());
    let log = SliceLog::read(&p).unwrap().unwrap();
    assert_eq!(log.torn_tail, 0);
    assert_eq!(log.valid_len, w.len());
    assert_eq!(log.slices.len(), 3);
    for (i, (got, want)) in log.slices.iter().zip(sample_slices()).enumerate() {
        assert_eq!(got.seq, i as u64 + 1);
        assert_eq!((got.start, got.len, &got.counts), (want.start, want.len, &want.counts));
    }
    // A second writer continues the key table and the sequence.
    drop(w);
    let (mut w, _) = SliceWriter::open(&p).unwrap();
    assert_eq!(w.next_seq(), 4);
    w.append(&slice(780, 60, &[(key("cpu-clock", Some(2)), vec![(5, 7)])])).unwrap();
    let log = SliceLog::read(&p).unwrap().unwrap();
    assert_eq!(log.slices.len(), 4);
    assert_eq!(log.slices[3].counts[&key("cpu-clock", Some(2))], vec![(5, 7)]);
    assert_eq!(log.samples(), 3 + 1 + 9 + 2 + 1 + 4 + 1 + 7);
}

#[test]
fn no_file_is_no_time_axis() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(SliceLog::read(&dir.path().join(SLICES_FILE)).unwrap(), None);
}

#[test]
fn range_selects_intersecting_slices_and_says_what_it_covers() {
    let log = SliceLog { slices: sample_slices(), ..Default::default() };
    // A request inside one minute is rounded out to that minute.
    let r = log.range(Some(610), Some(650));
    assert_eq!(r.covered, Some((600, 660)));
    assert_eq!(r.samples(), 13);
    // Across a boundary: both minutes.
    let r = log.range(Some(650), Some(670));
    assert_eq!(r.covered, Some((600, 720)));
    assert_eq!(r.slices.len(), 2);
    assert_eq!(r.sum()[&key("cpu-clock", Some(1))], vec![(0, 3), (17, 3), (4096, 9)]);
    // Boundaries are half-open.
    let r = log.range(Some(660), Some(720));
    assert_eq!(r.covered, Some((660, 720)));
    assert_eq!(log.range(Some(780), None).covered, None);
    assert_eq!(log.range(None, None).samples(), log.samples());
}

#[test]
fn rollup_keeps_every_sample_and_later_slices() {
    let mut slices = Vec::new();
    // 3 hours of minutes, 2 keys, with overlapping offsets.
    for m in 0..180u64 {
        slices.push(slice(
            3600 * 10 + m * 60,
            60,
            &[
                (key("cpu-clock", Some(1)), vec![(m % 7, 1 + m), (100 + m, 2)]),
                (key("cpu-clock", Some((m % 3) as u8)), vec![(m, 1)]),
            ],
        ));
    }
    let log = SliceLog { slices: slices.clone(), ..Default::default() };
    let before = 3600 * 12; // the first two hours
    let r = log.rollup(before, 3600);
    assert_eq!(totals(&r.slices), totals(&slices));
    assert_eq!(r.slices.len(), 2 + 60);
    assert_eq!((r.slices[0].start, r.slices[0].len), (36000, 3600));
    assert_eq!((r.slices[1].start, r.slices[1].len), (39600, 3600));
    assert_eq!(
        &r.slices[2..].iter().map(|s| &s.counts).collect::<Vec<_>>(),
        &slices[120..].iter().map(|s| &s.counts).collect::<Vec<_>>()
    );
    // Rolled up, written and read back: the same, and smaller than the minutes.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(SLICES_FILE);
    let w = write_log(&p, &slices);
    let fine = w.len();
    let mut w = w;
    let coarse = w.rollup(before, 3600).unwrap();
    assert!(coarse < fine, "{coarse} < {fine}");
    let back = SliceLog::read(&p).unwrap().unwrap();
    assert_eq!(totals(&back.slices), totals(&slices));
    assert_eq!(back.slices.len(), 62);
    // Appending continues after a roll-up.
    w.append(&slice(3600 * 13, 60, &[(key("x", None), vec![(1, 1)])])).unwrap();
    let back = SliceLog::read(&p).unwrap().unwrap();
    assert_eq!(back.slices.len(), 63);
    assert_eq!(back.slices[62].seq, 63);
}

#[test]
fn torn_tail_is_ignored_by_readers_and_cut_by_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(SLICES_FILE);
    let all = sample_slices();
    let w = write_log(&p, &all[..2]);
    let two = w.len();
    drop(w);
    let mut w = SliceWriter::open(&p).unwrap().0;
    w.append(&all[2]).unwrap();
    let full = std::fs::read(&p).unwrap();
    for cut in two + 1..full.len() as u64 {
        std::fs::write(&p, &full[..cut as usize]).unwrap();
        let log = SliceLog::read(&p).unwrap().unwrap();
        assert_eq!(log.slices.len(), 2, "cut at {cut}");
        assert_eq!((log.valid_len, log.torn_tail), (two, cut - two));
        let (mut w, rep) = SliceWriter::open(&p).unwrap();
        assert_eq!(rep.truncated, cut - two);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), two);
        w.append(&all[2]).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), full, "cut at {cut}");
    }
    // The last record's bytes garbled in place (an append seen half done over NFS): ignored.
    let mut g = full.clone();
    let n = g.len();
    g[n - 1] ^= 0x40;
    std::fs::write(&p, &g).unwrap();
    let log = SliceLog::read(&p).unwrap().unwrap();
    assert_eq!((log.slices.len(), log.valid_len), (2, two));
}

#[test]
fn damage_before_the_tail_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(SLICES_FILE);
    write_log(&p, &sample_slices());
    let full = std::fs::read(&p).unwrap();
    let n_slices = sample_slices().len();
    for i in 0..full.len() {
        for bit in [0x01u8, 0x80] {
            let mut b = full.clone();
            b[i] ^= bit;
            match SliceLog::decode(&b, &p) {
                Err(e) => assert!(e.to_string().contains(SLICES_FILE), "{e}"),
                // Only damage to the last record may read as a torn tail: a prefix, intact.
                Ok(log) => {
                    assert!(log.slices.len() < n_slices, "flip at byte {i} went unnoticed");
                    for (a, b) in log.slices.iter().zip(sample_slices()) {
                        assert_eq!(a.counts, b.counts);
                    }
                }
            }
        }
    }
    // The writer sets such a file aside and starts afresh.
    let mut b = full.clone();
    b[SLICES_HEADER_LEN + 9] ^= 0x10;
    std::fs::write(&p, &b).unwrap();
    let (w, rep) = SliceWriter::open(&p).unwrap();
    let (aside, why) = rep.set_aside.unwrap();
    assert!(aside.to_string_lossy().ends_with(".corrupt"), "{aside:?}");
    assert!(why.contains("checksum"), "{why}");
    assert_eq!(w.len(), SLICES_HEADER_LEN as u64);
    assert_eq!(SliceLog::read(&p).unwrap().unwrap().slices, vec![]);
}

#[test]
fn bad_headers_are_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(SLICES_FILE);
    let h = header();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"DCPIPROF........".to_vec(), "bad magic"),
        (h[..10].to_vec(), "truncated"),
        (
            {
                let mut b = h.clone();
                b[8] = 9;
                b
            },
            "unknown format version 9",
        ),
        (
            {
                let mut b = h.clone();
                b[10] = 1;
                b
            },
            "checksum",
        ),
    ];
    for (bytes, want) in cases {
        std::fs::write(&p, &bytes).unwrap();
        let e = SliceLog::read(&p).unwrap_err().to_string();
        assert!(e.contains(want) && e.contains(SLICES_FILE), "{want}: {e}");
    }
}

#[test]
fn hostile_files_are_refused_without_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo").join(SLICES_FILE);
    std::fs::create_dir(fifo.parent().unwrap()).unwrap();
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let link = dir.path().join("link");
    std::fs::create_dir(&link).unwrap();
    let link = link.join(SLICES_FILE);
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    let sparse = dir.path().join("sparse");
    std::fs::create_dir(&sparse).unwrap();
    let sparse = sparse.join(SLICES_FILE);
    let f = std::fs::File::create(&sparse).unwrap();
    f.set_len(MAX_CONTAINER_FILE + 1).unwrap();
    for (p, want) in [(&fifo, "FIFO"), (&link, "symbolic link"), (&sparse, "larger than")] {
        let e = SliceLog::read(p).unwrap_err();
        let s = e.to_string();
        assert!(s.contains(&*p.to_string_lossy()) && s.contains(want), "{s}");
        assert!(e.is_hostile_file(), "{s}");
        // The writer sets it aside instead of writing through it.
        let (w, rep) = SliceWriter::open(p).unwrap();
        assert!(rep.set_aside.is_some());
        assert_eq!(w.len(), SLICES_HEADER_LEN as u64);
        assert!(std::fs::symlink_metadata(p).unwrap().is_file());
    }
}

#[test]
fn a_busy_minute_costs_a_few_bytes_per_pair() {
    // 10 000 distinct offsets over 50 images, counts mostly small: what a minute of a busy
    // 2-CPU host holds (issue 36: ~40 KB of pairs in the profiles).
    let mut counts = BTreeMap::new();
    let mut x = 12345u64;
    for i in 0..50u8 {
        let mut v = Vec::new();
        let mut off = 0;
        for _ in 0..200 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            off += 1 + (x >> 58);
            v.push((off, 1 + (x >> 61)));
        }
        counts.insert(key("cpu-clock", Some(i)), v);
    }
    let s = Slice { start: 0, len: 60, seq: 1, counts };
    let mut keys = KeyTable::default();
    let mut first = Vec::new();
    encode_record(&mut first, &s, &mut keys);
    let mut again = Vec::new();
    encode_record(&mut again, &s, &mut keys);
    // Keys cost once per file; afterwards under 2 bytes per pair.
    assert!(again.len() < first.len());
    assert!(again.len() < 2 * 10_000, "{} bytes", again.len());
}

fn arb_slice() -> impl Strategy<Value = Slice> {
    (
        0u64..4_000_000_000,
        1u64..100_000,
        prop::collection::btree_map(
            (
                prop::sample::select(vec!["cpu-clock", "cycles", "raw:0x1a2"]),
                prop::option::of(0u8..4),
            ),
            prop::collection::btree_map(any::<u64>(), 1u64..1 << 40, 1..20),
            0..6,
        ),
    )
        .prop_map(|(start, len, m)| Slice {
            start,
            len,
            seq: 0,
            counts: m.into_iter().map(|((e, i), v)| (key(e, i), v.into_iter().collect())).collect(),
        })
}

proptest! {
    #[test]
    fn round_trip_and_rollup(slices in prop::collection::vec(arb_slice(), 0..12), before in 0u64..4_100_000_000) {
        let log = SliceLog {
            slices: slices.iter().enumerate().map(|(i, s)| Slice { seq: i as u64 + 1, ..s.clone() }).collect(),
            ..Default::default()
        };
        let bytes = log.encode();
        let back = SliceLog::decode(&bytes, Path::new("x")).unwrap();
        prop_assert_eq!(&back.slices, &log.slices);
        prop_assert_eq!(back.valid_len, bytes.len() as u64);
        let r = log.rollup(before, 3600);
        prop_assert_eq!(totals(&r.slices), totals(&log.slices));
        let rb = SliceLog::decode(&r.encode(), Path::new("x")).unwrap();
        prop_assert_eq!(rb.slices, r.slices);
    }
}

#[test]
fn a_newer_version_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(SLICES_FILE);
    let mut h = b"DCPISLC\0".to_vec();
    h.extend_from_slice(&2u16.to_le_bytes());
    h.extend_from_slice(&0u16.to_le_bytes());
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h.extend_from_slice(b"records of version 2");
    std::fs::write(&p, &h).unwrap();
    let e = SliceWriter::open(&p).unwrap_err().to_string();
    assert!(e.contains("unknown format version 2") && e.contains(SLICES_FILE), "{e}");
    assert_eq!(std::fs::read(&p).unwrap(), h, "untouched");
}

#[test]
fn a_replaced_file_is_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(SLICES_FILE);
    let w = write_log(&p, &sample_slices()[..1]);
    assert!(w.is_current());
    crate::safeio::set_aside(&p).unwrap();
    assert!(!w.is_current());
}
