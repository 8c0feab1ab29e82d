//! `Store::spool_directly`: what dcpid does at stop when a stuck database operation holds the
//! store. The last batch's flat counts and its call-stack increments both reach the spool, and
//! the next start publishes both.

use dcpid::store::{EventInfo, Store};
use profile_format::{Database, ImageId, ImageKind, Profile, StackImage, StackProfile};

use crate::store_support::{batch, cfg, desc, events, open};

#[test]
fn spool_directly_keeps_the_last_stack_increments_for_the_next_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path();
    // A first start makes the epoch (and the spool); the store is then "hung" and dropped.
    let epoch = {
        let mut s = open(root);
        let e = s.current_epoch().cloned().expect("epoch");
        s.flush_everything().expect("first publish");
        e
    };
    let mut r = batch(1, 0x40, 30);
    let mut p = StackProfile::default();
    let img = StackImage {
        kind: ImageKind::Elf,
        id: ImageId::BuildId(vec![1; 20]),
        path: b"/usr/bin/img1".to_vec(),
    };
    let ix = p.image_index(&img);
    p.add(&[(ix, 0x40), (ix, 0x90)], false, 20);
    p.add(&[(ix, 0x40)], true, 10);
    r.stacks.insert(0, p);
    let ev = vec![EventInfo { desc: desc(), source: "software".into() }];
    let n = Store::spool_directly(&cfg(root), &ev, &epoch, r, 0, 0, Default::default())
        .expect("spool directly");
    assert_eq!(n, 30);

    let mut s = Store::open(cfg(root));
    events(&mut s);
    s.flush_everything().expect("publish at the next start");
    let db = Database::open(&root.join("db")).expect("db");
    let hd = db.host_dir(&epoch, "h1").expect("host dir");
    let stk = StackProfile::read(&hd.stacks_path("cpu-clock")).expect("stack file published");
    assert_eq!((stk.samples(), stk.truncated_samples()), (30, 10));
    let mut got: Vec<(Vec<u64>, u64)> =
        stk.stacks().map(|s| (s.frames.iter().map(|f| f.1).collect(), s.samples)).collect();
    got.sort();
    assert_eq!(got, [(vec![0x40], 10), (vec![0x40, 0x90], 20)]);
    // The flat counts of the same batch are there too.
    let flat: u64 = hd
        .profiles()
        .expect("profiles")
        .iter()
        .map(|e| Profile::read(&e.path).expect("profile").header.total_samples)
        .sum();
    assert_eq!(flat, 30);
}
