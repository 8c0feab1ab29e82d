//! Store: the database's layout survives what happens to it while the daemon runs. A removed
//! database is recreated whole (epoch marker, kernel symbols, summary, lease), and the kernel
//! symbol snapshot follows module loads and unloads and each new epoch, stored only when its
//! content is new.

use crate::store_support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use dcpid::store::{KernelSymbolSource, Store};
use profile_format::sumidx;
use profile_format::{
    Database, EpochId, HostSummary, ImageId, KallsymsSnapshot, Profile, EPOCH_MARKER, KALLSYMS_DIR,
};
use store_support::{batch, cfg, events};

/// A kernel with `modules` loaded (each adds a module and a symbol).
fn kernel(modules: &[&str]) -> KallsymsSnapshot {
    let mut text = String::from("ffffffff81000000 T _text\nffffffff81001000 T start_kernel\n");
    let mut mods = String::new();
    for (i, m) in modules.iter().enumerate() {
        let base = 0xffffffffc0000000u64 + (i as u64) * 0x10000;
        text.push_str(&format!("{base:016x} t {m}_init\t[{m}]\n"));
        mods.push_str(&format!("{m} 16384 0 - Live 0x{base:016x}\n"));
    }
    KallsymsSnapshot::from_proc_text(&text, &mods, "6.18.0".into(), None, &|_| None).unwrap()
}

/// A fake /proc: the loaded modules, and how many snapshots were taken.
#[derive(Clone, Default)]
struct FakeKernel(Arc<Mutex<(Vec<&'static str>, u32)>>);

impl KernelSymbolSource for FakeKernel {
    fn fingerprint(&mut self) -> Option<Vec<u8>> {
        Some(self.0.lock().unwrap().0.join(",").into_bytes())
    }
    fn snapshot(&mut self) -> Result<KallsymsSnapshot, String> {
        let mut g = self.0.lock().unwrap();
        g.1 += 1;
        Ok(kernel(&g.0))
    }
}

fn module_names(db: &Database, e: &EpochId) -> Vec<String> {
    let snap = db.host_dir(e, "h1").unwrap().read_kallsyms().unwrap();
    snap.modules.iter().map(|m| m.name.clone()).collect()
}

fn stored_snapshots(root: &Path) -> usize {
    std::fs::read_dir(root.join("db").join(KALLSYMS_DIR)).map_or(0, std::iter::Iterator::count)
}

#[test]
fn removed_database_is_recreated_with_its_whole_layout() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut s = Store::open_leased(cfg(root)).unwrap();
    events(&mut s);
    s.set_kallsyms_source(Box::new(FakeKernel::default()));
    let epoch = s.current_epoch().cloned().unwrap();
    s.add(batch(1, 0x10, 5), 0, 0);
    s.flush_everything().unwrap();
    std::fs::remove_dir_all(root.join("db")).unwrap();
    s.add(batch(1, 0x20, 3), 0, 0);
    s.tick_at(Instant::now());
    s.flush_everything().unwrap();
    let db = Database::open(&root.join("db")).expect("database recreated");
    assert_eq!(db.current_epoch().unwrap(), Some(epoch.clone()), "the epoch is current again");
    assert!(db.epoch_dir(&epoch).join(EPOCH_MARKER).is_file(), "EPOCH marker recreated");
    let hd = db.host_dir(&epoch, "h1").unwrap();
    hd.read_kallsyms().expect("kernel symbols referenced and stored again");
    HostSummary::read(&hd.summary_path()).expect("summary.json written again");
    let idx = sumidx::read(&hd.summary_index_path()).expect("summary.idx");
    assert!(idx.index.is_some(), "the summary index is written again");
    let p = Profile::read(&hd.profile_path(&ImageId::BuildId(vec![1; 20]), "cpu-clock")).unwrap();
    assert_eq!(p.counts, BTreeMap::from([(0x20, 3)]), "new samples published");
    assert_eq!(db.read_lease("h1").unwrap().unwrap().pid, std::process::id(), "lease back");
    assert_eq!(s.status().db_error, None);
}

#[test]
fn kernel_symbols_follow_module_changes_and_new_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut s = Store::open(cfg(root));
    events(&mut s);
    let k = FakeKernel::default();
    s.set_kallsyms_source(Box::new(k.clone()));
    let e1 = s.current_epoch().cloned().unwrap();
    s.add(batch(1, 0x10, 5), 0, 0);
    s.flush_everything().unwrap();
    let db = Database::open(&root.join("db")).unwrap();
    assert!(module_names(&db, &e1).is_empty());
    let taken = k.0.lock().unwrap().1;
    // Nothing changed: no new snapshot is even taken.
    for _ in 0..3 {
        s.tick_at(Instant::now());
    }
    assert_eq!(k.0.lock().unwrap().1, taken, "no snapshot without a change");
    let bytes = s.status().bytes_written.kallsyms;
    // A module is loaded: the next tick takes a snapshot, the epoch references it.
    k.0.lock().unwrap().0.push("nf_tables");
    s.tick_at(Instant::now());
    assert_eq!(module_names(&db, &e1), ["nf_tables"]);
    assert_eq!(stored_snapshots(root), 2);
    let st = s.status();
    assert_eq!((st.kallsyms_refreshes, st.kallsyms_changes), (1, 1), "{st:?}");
    assert!(st.bytes_written.kallsyms > bytes);
    // Unloaded again: the first snapshot's content, already stored: only the reference.
    k.0.lock().unwrap().0.clear();
    s.tick_at(Instant::now());
    assert!(module_names(&db, &e1).is_empty());
    assert_eq!(stored_snapshots(root), 2, "content-addressed: nothing new stored");
    // A new epoch takes a fresh snapshot (same content here) and references it.
    let before = k.0.lock().unwrap().1;
    let e2 = s.new_epoch().unwrap();
    s.flush_everything().unwrap();
    assert!(k.0.lock().unwrap().1 > before, "snapshot taken for the new epoch");
    assert!(module_names(&db, &e2).is_empty());
    assert_eq!(stored_snapshots(root), 2);
    // A module loaded during the second epoch does not change the first's reference.
    k.0.lock().unwrap().0.push("kvm");
    s.tick_at(Instant::now());
    assert_eq!(module_names(&db, &e2), ["kvm"]);
    assert!(module_names(&db, &e1).is_empty());
}

/// `dcpictl epoch new` does not read /proc/kallsyms under the store lock: the new epoch
/// references the snapshot in hand at once, and the next tick takes the fresh one. (Reading
/// and sorting /proc/kallsyms was half of what an epoch change waited for; on a loaded
/// machine the command then ran past its 20 s bound and was refused, issue 39.)
#[test]
fn a_new_epoch_references_the_snapshot_at_once_and_refreshes_it_at_the_next_tick() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut s = Store::open(cfg(root));
    events(&mut s);
    let k = FakeKernel::default();
    k.0.lock().unwrap().0.push("kvm");
    s.set_kallsyms_source(Box::new(k.clone()));
    s.add(batch(1, 0x10, 5), 0, 0);
    s.flush_everything().unwrap();
    let taken = k.0.lock().unwrap().1;
    let e2 = s.new_epoch().unwrap();
    assert_eq!(k.0.lock().unwrap().1, taken, "the epoch change itself takes no snapshot");
    let db = Database::open(&root.join("db")).unwrap();
    assert_eq!(module_names(&db, &e2), ["kvm"], "the new epoch references one at once");
    s.tick_at(Instant::now());
    assert_eq!(k.0.lock().unwrap().1, taken + 1, "the next tick takes a fresh snapshot");
    s.tick_at(Instant::now());
    assert_eq!(k.0.lock().unwrap().1, taken + 1, "and only one");
    assert_eq!(module_names(&db, &e2), ["kvm"]);
}
