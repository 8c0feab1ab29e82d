//! Store: the summary index (per-(image, event) totals in summary.idx, FORMAT.md §7.2) always
//! describes the profiles as published, also when publishing comes after the last samples (an
//! idle host); summary.json no longer carries the JSON index.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store_support;
use dcpid::aggregate::OffsetCounts;
use dcpid::aggregate::{ImageInfo, Resolved, ResolvedProfile};
use profile_format::sumidx;
use profile_format::{Database, HostSummary, ImageId, ImageKind, SummaryIndex};
use store_support::open;

fn batch(entries: &[(u8, u64, u64)]) -> Resolved {
    let mut r = Resolved::default();
    for &(img, off, count) in entries {
        let id = ImageId::BuildId(vec![img; 20]);
        let info = Arc::new(ImageInfo {
            kind: ImageKind::Elf,
            id: id.clone(),
            path: format!("/usr/bin/img{img}").into_bytes(),
            jit_symbols: vec![],
        });
        let p = r.profiles.entry((id, 0)).or_insert_with(|| ResolvedProfile {
            image: info,
            event: 0,
            counts: OffsetCounts::default(),
        });
        let e = p.counts.entry(off).or_insert((0, 0));
        e.0 += count;
        e.1 += count * 1000;
        r.samples += count;
    }
    r
}

#[test]
fn summary_index_follows_every_publish() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let epoch = s.current_epoch().cloned().expect("first epoch created");
    let db = Database::open(&dir.path().join("db")).unwrap();
    let hd = db.host_dir(&epoch, "h1").unwrap();
    let index = || {
        let json = HostSummary::read(&hd.summary_path()).expect("summary");
        assert_eq!(json.index, None, "summary.json carries no index");
        let bin = sumidx::read(&hd.summary_index_path()).expect("summary.idx");
        assert_eq!(HostSummary { index: None, ..bin.clone() }, json, "same facts in both");
        bin.index
    };
    let per_image = |idx: &SummaryIndex| -> BTreeMap<String, u64> {
        idx.images.iter().map(|t| (t.path.clone(), t.samples)).collect()
    };

    let now = Instant::now();
    s.add(batch(&[(1, 0x10, 5), (1, 0x20, 3), (2, 0x10, 7)]), 0, 0);
    s.tick_at(now);
    // Spooled, not yet published: the summary is written but its index names no profile yet.
    assert_eq!(index().map(|i| i.images.len()), Some(0));

    // No new samples; the profiles' turn comes and they are published. The summary follows
    // without waiting for more samples or for the end of the epoch.
    s.tick_at(now + Duration::from_secs(61));
    assert_eq!(s.status().dirty_profiles, 0);
    let idx = index().expect("index after publishing");
    assert_eq!(idx, SummaryIndex::of_host_dir(&hd).unwrap());
    let want: BTreeMap<String, u64> =
        [("/usr/bin/img1".to_owned(), 8), ("/usr/bin/img2".to_owned(), 7)].into();
    assert_eq!(per_image(&idx), want);
    assert_eq!(idx.events.len(), 1);
    assert_eq!(idx.images.iter().map(|t| t.period).sum::<u64>(), 15_000);

    s.add(batch(&[(2, 0x10, 1), (3, 0x30, 4)]), 0, 0);
    s.flush_everything().unwrap();
    let idx = index().expect("index after flush");
    assert_eq!(idx, SummaryIndex::of_host_dir(&hd).unwrap());
    let want: BTreeMap<String, u64> = [
        ("/usr/bin/img1".to_owned(), 8),
        ("/usr/bin/img2".to_owned(), 8),
        ("/usr/bin/img3".to_owned(), 4),
    ]
    .into();
    assert_eq!(per_image(&idx), want);
}
