use super::*;
use crate::safeio;
use crate::varint;
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
    fn round_trip_and_rollup(slices in prop::collection::vec(arb_slice(), 0..12), before in 0u64..4_100_000_000, shift in 0u32..14) {
        let log = SliceLog {
            slices: slices.iter().enumerate().map(|(i, s)| Slice { seq: i as u64 + 1, ..s.clone() }).collect(),
            ..Default::default()
        };
        let bytes = log.encode();
        let back = SliceLog::decode(&bytes, Path::new("x")).unwrap();
        prop_assert_eq!(&back.slices, &log.slices);
        prop_assert_eq!(back.valid_len, bytes.len() as u64);
        let r = log.rollup_at(before, 3600, 1 << shift);
        prop_assert_eq!(totals(&r.slices).values().sum::<u64>(), totals(&log.slices).values().sum::<u64>());
        if shift == 0 {
            prop_assert_eq!(totals(&r.slices), totals(&log.slices));
        }
        let rbytes = r.encode();
        let rb = SliceLog::decode(&rbytes, Path::new("x")).unwrap();
        prop_assert_eq!(&rb.slices, &r.slices);
        prop_assert_eq!(&rb.resolution, &r.resolution);
        check_totals_and_index(&bytes, &back);
        check_totals_and_index(&rbytes, &rb);
    }

    /// Arbitrary bytes after a valid header: an error or a log, never a panic.
    #[test]
    fn arbitrary_records_never_panic(body in prop::collection::vec(any::<u8>(), 0..200), shift in 0u8..20) {
        let mut b = header();
        let mut rec = vec![0x80, 0x04, 60, 1, shift];
        rec.extend_from_slice(&body);
        let len = rec.len() as u32;
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(&record_crc(len, &rec).to_le_bytes());
        b.extend_from_slice(&rec);
        drop(SliceLog::decode(&b, Path::new("x")));
        drop(SliceTotals::decode(&b, Path::new("x")));
        if let Ok(ix) = SliceIndex::decode(b, Path::new("x")) {
            for j in 0..ix.totals.slices.len() {
                drop(ix.pairs(j, &|_| true));
            }
        }
    }
}

#[test]
fn a_newer_version_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(SLICES_FILE);
    let mut h = b"DCPISLC\0".to_vec();
    h.extend_from_slice(&(SLICES_VERSION + 1).to_le_bytes());
    h.extend_from_slice(&0u16.to_le_bytes());
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h.extend_from_slice(b"records of version 3");
    std::fs::write(&p, &h).unwrap();
    let e = SliceWriter::open(&p).unwrap_err().to_string();
    let want = format!("unknown format version {}", SLICES_VERSION + 1);
    assert!(e.contains(&want) && e.contains(SLICES_FILE), "{e}");
    assert_eq!(std::fs::read(&p).unwrap(), h, "untouched");
}

#[test]
fn a_replaced_file_is_noticed() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(SLICES_FILE);
    let w = write_log(&p, &sample_slices()[..1]);
    assert!(w.is_current());
    safeio::set_aside(&p).unwrap();
    assert!(!w.is_current());
}

/// A version 1 file as dcpid 0.x wrote it (FORMAT.md §14.2: no resolution byte), built by
/// hand: two records, the second using the key the first defined.
fn v1_file() -> Vec<u8> {
    let mut out = b"DCPISLC\0".to_vec();
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    let img = key("cpu-clock", Some(1)).image.unwrap().to_text();
    for (seq, new_key, offsets) in
        [(1u64, true, vec![(0x11u64, 3u64), (0x25, 1)]), (2, false, vec![(0x13, 2)])]
    {
        let mut payload = Vec::new();
        varint::write_u64(&mut payload, u64::from(new_key));
        if new_key {
            put_bytes(&mut payload, b"cpu-clock");
            put_bytes(&mut payload, img.as_bytes());
        }
        varint::write_u64(&mut payload, 1); // entries
        varint::write_u64(&mut payload, 0); // key index
        varint::write_u64(&mut payload, offsets.len() as u64);
        let mut last: Option<u64> = None;
        for &(o, _) in &offsets {
            varint::write_u64(&mut payload, last.map_or(o, |l| o - l - 1));
            last = Some(o);
        }
        for &(_, c) in &offsets {
            varint::write_u64(&mut payload, c - 1);
        }
        let mut body = Vec::new();
        varint::write_u64(&mut body, 540 + seq * 60);
        varint::write_u64(&mut body, 60);
        varint::write_u64(&mut body, seq);
        body.push(0); // codec: raw
        body.extend_from_slice(&payload);
        let len = body.len() as u32;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&record_crc(len, &body).to_le_bytes());
        out.extend_from_slice(&body);
    }
    out
}

#[test]
fn version_1_files_still_read_and_are_upgraded_by_the_writer() {
    let v1 = v1_file();
    let log = SliceLog::decode(&v1, Path::new("v1")).unwrap();
    let k = key("cpu-clock", Some(1));
    assert_eq!(log.slices.len(), 2);
    assert_eq!(log.slices[0].counts[&k], vec![(0x11, 3), (0x25, 1)]);
    assert_eq!(log.slices[1].counts[&k], vec![(0x13, 2)]);
    assert!(log.slices.iter().all(|s| log.resolution_of(s) == 1), "version 1 is exact");
    // The writer rewrites it in the current version, every slice kept, then appends.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(SLICES_FILE);
    std::fs::write(&p, &v1).unwrap();
    let (mut w, rep) = SliceWriter::open(&p).unwrap();
    assert_eq!(rep.upgraded_from, Some(1));
    w.set_resolution(16);
    w.append(&slice(720, 60, &[(k.clone(), vec![(0x21, 1), (0x2f, 1)])])).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), SLICES_VERSION);
    let back = SliceLog::read(&p).unwrap().unwrap();
    assert_eq!(back.slices[..2], log.slices[..]);
    assert_eq!(back.slices[2].counts[&k], vec![(0x20, 2)], "two offsets in one 16-byte bucket");
    assert_eq!(
        back.slices.iter().map(|s| back.resolution_of(s)).collect::<Vec<_>>(),
        vec![1, 1, 16]
    );
    assert_eq!(back.range_resolution(&back.range(None, None)), 16);
    assert_eq!(back.range_resolution(&back.range(None, Some(700))), 1);
}

#[test]
fn coarser_offsets_keep_every_sample_and_unknown_codes_exact() {
    let s = slice(
        600,
        60,
        &[
            (key("cpu-clock", Some(1)), vec![(0, 1), (15, 2), (16, 3), (4095, 1), (u64::MAX, 5)]),
            (key("cpu-clock", None), vec![(1, 4), (2, 1)]),
        ],
    );
    for res in [1u64, 2, 16, 64, 4096, 1 << 20] {
        let log = SliceLog {
            slices: vec![Slice { seq: 1, ..s.clone() }],
            resolution: [(1, res)].into_iter().collect(),
            ..Default::default()
        };
        let back = SliceLog::decode(&log.encode(), Path::new("x")).unwrap();
        let stored = back.resolution_of(&back.slices[0]);
        assert_eq!(stored, res.min(1 << MAX_RESOLUTION_SHIFT));
        let b = &back.slices[0];
        assert_eq!(b.samples(), s.samples(), "resolution {res}");
        assert_eq!(b.counts[&key("cpu-clock", None)], vec![(1, 4), (2, 1)]);
        let img = &b.counts[&key("cpu-clock", Some(1))];
        assert!(img.iter().all(|(o, _)| o % stored == 0), "{res}: {img:?}");
        assert!(img.windows(2).all(|w| w[0].0 < w[1].0));
        if res == 16 {
            assert_eq!(img, &vec![(0, 3), (16, 3), (4080, 1), (!15, 5)]);
        }
    }
}

#[test]
fn rollup_at_a_coarser_resolution_keeps_every_sample() {
    let k = key("cpu-clock", Some(1));
    let log = SliceLog {
        slices: (0..5u64)
            .map(|i| Slice {
                seq: i + 1,
                ..slice(3600 + i * 60, 60, &[(k.clone(), vec![(i * 16, 1), (300 + i, 2)])])
            })
            .collect(),
        resolution: (1..=5).map(|s| (s, 16)).collect(),
        ..Default::default()
    };
    let r = log.rollup_at(3600 + 180, 3600, 256);
    assert_eq!(r.slices.len(), 1 + 2, "three minutes merged, two kept");
    assert_eq!(r.resolution_of(&r.slices[0]), 256);
    assert_eq!(r.slices[0].counts[&k], vec![(0, 3), (256, 6)]);
    assert_eq!((r.resolution_of(&r.slices[1]), r.resolution_of(&r.slices[2])), (16, 16));
    assert_eq!(totals(&r.slices).values().sum::<u64>(), 15);
    let back = SliceLog::decode(&r.encode(), Path::new("x")).unwrap();
    assert_eq!(back.slices, r.slices);
    assert_eq!(back.resolution, r.resolution);
    // A merge never makes offsets finer than its members.
    let fine = log.rollup(u64::MAX, 3600);
    assert_eq!(fine.resolution_of(&fine.slices[0]), 16);
}

/// A file of `version` (2 or 3) holding one record with its resolution byte set to `shift`
/// and one image offset `off` (stored, i.e. in units of the resolution), built by hand.
fn record_with_version(version: u16, shift: u8, off: u64) -> Vec<u8> {
    let mut out = header_of(version);
    let mut head = Vec::new();
    varint::write_u64(&mut head, 1);
    put_bytes(&mut head, b"cpu-clock");
    put_bytes(&mut head, key("e", Some(1)).image.unwrap().to_text().as_bytes());
    // One entry: key 0, one pair (and in version 3 its samples − pairs: 0).
    let entry: &[u64] = if version >= 3 { &[1, 0, 1, 0] } else { &[1, 0, 1] };
    for &v in entry {
        varint::write_u64(&mut head, v);
    }
    let mut columns = Vec::new();
    for v in [off, 0] {
        varint::write_u64(&mut columns, v);
    }
    let mut body = Vec::new();
    for v in [600, 60, 1] {
        varint::write_u64(&mut body, v);
    }
    body.push(shift);
    body.push(0);
    if version >= 3 {
        put_bytes(&mut body, &head);
        body.push(0);
    } else {
        body.extend_from_slice(&head);
    }
    body.extend_from_slice(&columns);
    let len = body.len() as u32;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&record_crc(len, &body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn record_with(shift: u8, off: u64) -> Vec<u8> {
    record_with_version(SLICES_VERSION, shift, off)
}

/// A file header of `version`.
fn header_of(version: u16) -> Vec<u8> {
    let mut h = SLICES_MAGIC.to_vec();
    h.extend_from_slice(&version.to_le_bytes());
    h.extend_from_slice(&0u16.to_le_bytes());
    let crc = crc32fast::hash(&h);
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

/// A version 2 file of `log`'s slices as dcpid of layout revisions 4-8 wrote it (FORMAT.md
/// §14.2: keys and entries inside the payload, no samples), each at its resolution: the
/// writer of that version, kept here to test that such files stay readable.
fn v2_file(log: &SliceLog) -> Vec<u8> {
    let mut out = header_of(2);
    let mut keys = KeyTable::default();
    for s in &log.slices {
        let res = log.resolution_of(s);
        let shift = shift_of(res);
        let s = if shift == 0 { s.clone() } else { bucket(s, 1 << shift) };
        let (new, idx) = index_keys(&s, &mut keys, shift);
        let mut payload = Vec::new();
        varint::write_u64(&mut payload, new.len() as u64);
        for k in new {
            put_bytes(&mut payload, k.event.as_bytes());
            let img = k.image.as_ref().map(ImageId::to_text).unwrap_or_default();
            put_bytes(&mut payload, img.as_bytes());
        }
        varint::write_u64(&mut payload, idx.len() as u64);
        let mut prev: Option<u64> = None;
        for (i, pairs, _) in &idx {
            varint::write_u64(&mut payload, prev.map_or(*i, |p| i - p - 1));
            prev = Some(*i);
            varint::write_u64(&mut payload, pairs.len() as u64);
        }
        for (_, pairs, sh) in &idx {
            let mut last: Option<u64> = None;
            for &(off, _) in pairs.iter() {
                let off = off >> sh;
                varint::write_u64(&mut payload, last.map_or(off, |l| off - l - 1));
                last = Some(off);
            }
        }
        for (_, pairs, _) in &idx {
            for &(_, c) in pairs.iter() {
                varint::write_u64(&mut payload, c - 1);
            }
        }
        let mut body = Vec::new();
        varint::write_u64(&mut body, s.start);
        varint::write_u64(&mut body, s.len);
        varint::write_u64(&mut body, s.seq);
        body.push(shift);
        let (codec, packed) = pack(&payload);
        body.push(codec);
        body.extend_from_slice(&packed);
        let len = body.len() as u32;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&record_crc(len, &body).to_le_bytes());
        out.extend_from_slice(&body);
    }
    out
}

/// Per slice, its totals per key as read by `read_totals` and by the index, and its pairs as
/// the index decodes them per key: equal to those of `want` (the slices a full read gives).
fn check_totals_and_index(bytes: &[u8], want: &SliceLog) {
    let t = SliceTotals::decode(bytes, Path::new("x")).unwrap();
    let ix = SliceIndex::decode(bytes.to_vec(), Path::new("x")).unwrap();
    assert_eq!(ix.totals, t);
    assert_eq!(t.slices.len(), want.slices.len());
    assert_eq!(t.resolution, want.resolution);
    for (j, (st, s)) in t.slices.iter().zip(&want.slices).enumerate() {
        assert_eq!((st.start, st.len, st.seq), (s.start, s.len, s.seq));
        let sums: BTreeMap<SliceKey, u64> =
            st.totals.iter().map(|&(i, n)| (t.keys[i].clone(), n)).collect();
        let want_sums: BTreeMap<SliceKey, u64> =
            s.counts.iter().map(|(k, v)| (k.clone(), v.iter().map(|p| p.1).sum())).collect();
        assert_eq!(sums, want_sums, "slice {j}");
        let all = ix.pairs(j, &|_| true).unwrap();
        let got: BTreeMap<SliceKey, Vec<(u64, u64)>> =
            all.into_iter().map(|(i, v)| (t.keys[i].clone(), v)).collect();
        assert_eq!(got, s.counts, "slice {j}");
        // One key only: the others are skipped, not returned.
        if let Some(&(first, _)) = st.totals.first() {
            let one = ix.pairs(j, &|i| i == first).unwrap();
            assert_eq!(one.len(), 1);
            assert_eq!(one[0].1, s.counts[&t.keys[first]]);
        }
    }
}

/// Sixteen-byte minutes and a 256-byte hour, exact unknown codes: what dcpid keeps.
fn mixed_log() -> SliceLog {
    let mut slices = sample_slices();
    slices.push(slice(
        3600,
        3600,
        &[
            (key("cpu-clock", Some(1)), vec![(0, 1), (300, 2), (4096, 7)]),
            (key("cpu-clock", None), vec![(3, 1)]),
        ],
    ));
    let log = SliceLog {
        slices: slices
            .into_iter()
            .enumerate()
            .map(|(i, s)| Slice { seq: i as u64 + 1, ..s })
            .collect(),
        resolution: [(1, 16), (2, 16), (4, 256)].into_iter().collect(),
        ..Default::default()
    };
    // As stored: read back once.
    SliceLog::decode(&log.encode(), Path::new("x")).unwrap()
}

#[test]
fn version_3_totals_come_from_the_heads_and_pairs_by_record() {
    let log = mixed_log();
    let bytes = log.encode();
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), 3);
    check_totals_and_index(&bytes, &log);
}

#[test]
fn version_2_files_still_read_whole_as_totals_and_by_record_and_are_upgraded() {
    let log = mixed_log();
    let v2 = v2_file(&log);
    assert_eq!(u16::from_le_bytes([v2[8], v2[9]]), 2);
    let back = SliceLog::decode(&v2, Path::new("v2")).unwrap();
    assert_eq!(back.slices, log.slices);
    assert_eq!(back.resolution, log.resolution);
    check_totals_and_index(&v2, &log);
    // The writer rewrites it in the current version, every slice kept, then appends.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join(SLICES_FILE);
    std::fs::write(&p, &v2).unwrap();
    let (mut w, rep) = SliceWriter::open(&p).unwrap();
    assert_eq!(rep.upgraded_from, Some(2));
    let k = key("cpu-clock", Some(2));
    w.append(&slice(7200, 60, &[(k.clone(), vec![(9, 1)])])).unwrap();
    let bytes = std::fs::read(&p).unwrap();
    assert_eq!(u16::from_le_bytes([bytes[8], bytes[9]]), SLICES_VERSION);
    let up = SliceLog::read(&p).unwrap().unwrap();
    assert_eq!(up.slices[..4], log.slices[..]);
    assert_eq!(up.slices[4].counts[&k], vec![(9, 1)]);
    check_totals_and_index(&bytes, &up);
    // A version 2 segment and a version 3 one of the same host directory read as one.
    let both = SliceIndex::combine(vec![
        SliceIndex::decode(v2.clone(), Path::new("a")).unwrap(),
        SliceIndex::decode(bytes, Path::new("b")).unwrap(),
    ]);
    assert_eq!(both.totals.slices.len(), 4 + 5);
    let n: u64 = (0..9)
        .flat_map(|j| both.pairs(j, &|_| true).unwrap())
        .flat_map(|(_, v)| v)
        .map(|p| p.1)
        .sum();
    assert_eq!(n, 2 * log.samples() + 1);
}

/// A head whose samples disagree with the counts: a full read and a record's pairs are
/// `Corrupt` naming `samples`; a read of totals takes the head as it is (it does not read the
/// columns, FORMAT.md §14.4).
#[test]
fn samples_that_disagree_with_the_counts_are_corrupt() {
    let mut b = record_with(0, 5);
    // The entry's samples − pairs (the head's last byte) from 0 to 1: head codec 0, so the
    // head is stored as it is; find it after the body's 5 head bytes and its length.
    let body_at = SLICES_HEADER_LEN + FRAME_LEN;
    let head_len = b[body_at + 6] as usize;
    let last = body_at + 7 + head_len - 1;
    assert_eq!(b[last], 0);
    b[last] = 1;
    let len = (b.len() - body_at) as u32;
    let crc = record_crc(len, &b[body_at..]);
    b[SLICES_HEADER_LEN + 4..body_at].copy_from_slice(&crc.to_le_bytes());
    let e = SliceLog::decode(&b, Path::new("slices.log")).unwrap_err().to_string();
    assert!(e.contains("samples"), "{e}");
    let t = SliceTotals::decode(&b, Path::new("x")).unwrap();
    assert_eq!(t.slices[0].totals, vec![(0, 2)]);
    let ix = SliceIndex::decode(b, Path::new("x")).unwrap();
    assert!(ix.pairs(0, &|_| true).unwrap_err().to_string().contains("samples"));
}

#[test]
fn hostile_resolutions_are_corrupt_naming_the_field() {
    for v in [2, 3] {
        hostile_resolutions_of(v);
    }
}

fn hostile_resolutions_of(version: u16) {
    let record_with = |shift, off| record_with_version(version, shift, off);
    let ok = SliceLog::decode(&record_with(4, 3), Path::new("x")).unwrap();
    assert_eq!(ok.slices[0].counts[&key("cpu-clock", Some(1))], vec![(48, 1)]);
    for (bytes, field) in [
        (record_with(MAX_RESOLUTION_SHIFT + 1, 1), "resolution"),
        (record_with(255, 1), "resolution"),
        // An offset that the resolution would shift beyond 2^64 - 1.
        (record_with(4, u64::MAX >> 3), "offset"),
    ] {
        let e = SliceLog::decode(&bytes, Path::new("slices.log")).unwrap_err().to_string();
        assert!(e.contains(field) && e.contains("slices.log"), "{field}: {e}");
    }
    // Every truncation of a record's body (with a recomputed checksum) is an error or a
    // shorter read, never a panic or a hang.
    let full = record_with(4, 3);
    for cut in SLICES_HEADER_LEN + FRAME_LEN..full.len() {
        let mut b = full[..SLICES_HEADER_LEN].to_vec();
        let body = &full[SLICES_HEADER_LEN + FRAME_LEN..cut];
        let len = body.len() as u32;
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(&record_crc(len, body).to_le_bytes());
        b.extend_from_slice(body);
        assert!(SliceLog::decode(&b, Path::new("x")).is_err(), "cut at {cut}");
    }
}

#[test]
fn a_busy_minute_at_16_byte_resolution_costs_far_less_than_exact() {
    // Many offsets inside few hot functions (instructions 1-7 bytes apart), most counted
    // once: what a minute of the busy mix looks like (BENCHMARKS.md "Time slices").
    let mut counts = BTreeMap::new();
    let mut x = 99u64;
    let mut pairs = 0;
    for i in 0..20u8 {
        let mut v = Vec::new();
        let mut off = 0x1000;
        for _ in 0..1000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            off += 1 + (x >> 61);
            v.push((off, 1 + u64::from(x >> 62 == 0)));
        }
        pairs += v.len();
        counts.insert(key("cpu-clock", Some(i)), v);
    }
    let s = Slice { start: 0, len: 60, seq: 1, counts };
    let (mut k1, mut k2) = (KeyTable::default(), KeyTable::default());
    let (mut exact, mut coarse) = (Vec::new(), Vec::new());
    encode_record(&mut exact, &s, &mut k1);
    encode_record_at(&mut coarse, &s, &mut k2, 16);
    assert!(coarse.len() * 2 < exact.len(), "{} vs {} bytes", coarse.len(), exact.len());
    assert!(exact.len() < 2 * pairs, "{} bytes for {pairs} pairs", exact.len());
}
