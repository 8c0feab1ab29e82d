//! Store: a valid profile of a newer format version in this host's own directory (another
//! dcpid version of this host wrote it earlier in the epoch: a rolling downgrade) is left
//! untouched and shown in the status; this daemon's samples continue beside it under the
//! continuation name (FORMAT.md §3.1), which this build's readers list and add up. Before
//! the fix the file was renamed `.corrupt` and its samples vanished from every report.

use crate::store_support;

use std::path::Path;

use profile_format::{continuation_path, Database, EpochId, ImageId, Profile, PROFILE_VERSION};
use store_support::{batch, open};

/// The profile at `path` as a writer of the next container version would leave it: same
/// layout, a version this build does not know, a valid checksum.
fn make_newer(path: &Path) -> Vec<u8> {
    let mut b = std::fs::read(path).unwrap();
    b[8..10].copy_from_slice(&(PROFILE_VERSION + 1).to_le_bytes());
    let body = b.len() - 4;
    let crc = crc32fast::hash(&b[..body]);
    b[body..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(path, &b).unwrap();
    b
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn newer_format_profile_is_left_untouched_and_samples_continue_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = open(dir.path());
    let epoch: EpochId = s.current_epoch().cloned().unwrap();
    s.add(batch(1, 0x10, 5), 0, 0);
    s.add(batch(2, 0x20, 3), 0, 0);
    s.flush_everything().unwrap();
    let db = Database::open(&dir.path().join("db")).unwrap();
    let hd = db.host_dir(&epoch, "h1").unwrap();
    let newer = hd.profile_path(&ImageId::BuildId(vec![1; 20]), "cpu-clock");
    let newer_bytes = make_newer(&newer);
    assert!(matches!(Profile::read(&newer), Err(profile_format::Error::UnknownVersion { .. })));

    // More samples of that image and of the other one, published (a full flush also rewrites
    // the summary index, which reads every profile).
    s.add(batch(1, 0x10, 7), 0, 0);
    s.add(batch(1, 0x30, 2), 0, 0);
    s.add(batch(2, 0x20, 4), 0, 0);
    s.flush_everything().unwrap();

    assert_eq!(std::fs::read(&newer).unwrap(), newer_bytes, "the newer file is untouched");
    let listing = names(&hd.path);
    assert!(!listing.iter().any(|n| n.contains(".corrupt")), "nothing set aside: {listing:?}");
    let cont = continuation_path(&newer).unwrap();
    let p = Profile::read(&cont).expect("the continuation is a profile of this version");
    assert_eq!(p.header.image_id, ImageId::BuildId(vec![1; 20]));
    assert_eq!(p.header.total_samples, 9, "this daemon's new samples are kept");
    assert_eq!(p.counts.get(&0x10), Some(&7));
    assert_eq!(p.counts.get(&0x30), Some(&2));
    // The other image goes on in its own file as before.
    let other = Profile::read(&hd.profile_path(&ImageId::BuildId(vec![2; 20]), "cpu-clock"));
    assert_eq!(other.unwrap().header.total_samples, 7);

    // What this build's readers see: the continuation, listed as a profile of image 1; the
    // newer file, refused by name (a report names it, or skips it with --keep-going).
    let entries = hd.profiles().unwrap();
    let of_1: Vec<_> =
        entries.iter().filter(|e| e.image_id == Some(ImageId::BuildId(vec![1; 20]))).collect();
    assert_eq!(of_1.len(), 2, "{entries:?}");
    assert!(of_1.iter().any(|e| e.is_continuation() && e.path == cont));
    // No summary index while the directory holds such files: it would stand for one file per
    // (image, event); readers list the directory instead.
    assert!(!hd.summary_index_path().exists(), "{listing:?}");

    let st = s.status();
    assert_eq!(st.newer_format_files, 1, "{st:?}");
    let last = st.last_newer_format.unwrap();
    assert!(last.contains(&newer.display().to_string()) && last.contains("version"), "{last}");
    assert_eq!(st.corrupt_files_set_aside, 0);

    // A restart publishes into the continuation again (exactly once: its sequence).
    drop(s);
    let mut s = open(dir.path());
    s.add(batch(1, 0x10, 1), 0, 0);
    s.flush_everything().unwrap();
    assert_eq!(Profile::read(&cont).unwrap().header.total_samples, 10);
    assert_eq!(std::fs::read(&newer).unwrap(), newer_bytes);
}
