//! Store: the who table (FORMAT.md §12) is merged into `who.tbl` at every flush, keeps pids
//! only with `by_pid`, and a corrupt table is set aside instead of being trusted.

use std::path::Path;
use std::sync::Arc;

use crate::store_support;
use dcpid::aggregate::{ImageInfo, Resolved};
use dcpid::store::Store;
use profile_format::{Database, ImageId, ImageKind, ThreadKey, WhoKey, WhoTable};
use store_support::open;

/// pid 42 (`web`, cgroup 7 = /system.slice/web.service): `user` samples in /usr/bin/web and
/// `kernel` in the kernel; the idle task `idle` samples; CPU 1 gets them all.
fn batch(user: u64, kernel: u64, idle: u64) -> Resolved {
    let mut r = Resolved::default();
    let img = Arc::new(ImageInfo {
        kind: ImageKind::Elf,
        id: ImageId::BuildId(vec![1; 20]),
        path: b"/usr/bin/web".to_vec(),
        jit_symbols: vec![],
    });
    let w = &mut r.who;
    w.add_user(42, Some(&img), 0, user);
    w.kernel.insert((42, 0), kernel);
    w.kernel.insert((0, 0), idle);
    w.comms.insert(42, b"web".to_vec());
    w.cgroups.insert(42, 7);
    w.cgroup_paths.insert(7, "/system.slice/web.service".into());
    w.cpus.insert((1, 0), user + kernel + idle);
    r
}

fn key(pid: u32, command: &str, image: &str, cgroup: &str) -> WhoKey {
    WhoKey {
        cgroup: cgroup.into(),
        command: command.as_bytes().to_vec(),
        pid,
        image: image.as_bytes().to_vec(),
        event: "cpu-clock".into(),
    }
}

fn who_path(root: &Path, s: &Store) -> std::path::PathBuf {
    let db = Database::open(&root.join("db")).expect("db");
    db.host_dir(s.current_epoch().expect("epoch"), "h1").expect("host dir").who_path()
}

#[test]
fn who_counts_are_merged_across_flushes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = open(dir.path());
    s.add(batch(10, 3, 100), 0, 0);
    s.flush_everything().expect("flush");
    s.add(batch(5, 1, 50), 0, 0);
    s.flush_everything().expect("flush");
    let t = WhoTable::read(&who_path(dir.path(), &s)).expect("who.tbl");
    let web = "/system.slice/web.service";
    assert_eq!(t.rows.get(&key(0, "web", "/usr/bin/web", web)), Some(&15), "{t:?}");
    assert_eq!(t.rows.get(&key(0, "web", "[kernel.kallsyms]", web)), Some(&4), "{t:?}");
    assert_eq!(t.rows.get(&key(0, "swapper", "[idle]", "/")), Some(&150), "{t:?}");
    assert_eq!(t.cpus.get(&(1, "cpu-clock".to_owned())), Some(&169));
    assert_eq!(t.samples(), 169);
}

/// Threads named apart from their command (FORMAT.md §12 version 2): a thread row per name,
/// merged across flushes; threads named as the command and unnamed ones add no row; a table
/// with no such thread stays version 1.
#[test]
fn threads_named_apart_are_thread_rows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = open(dir.path());
    s.add(batch(10, 3, 100), 0, 0);
    s.flush_everything().expect("flush");
    let path = who_path(dir.path(), &s);
    let v =
        |p: &Path| u16::from_le_bytes(std::fs::read(p).expect("read")[8..10].try_into().unwrap());
    assert_eq!(v(&path), 1, "no thread named apart: a version 1 table");
    for _ in 0..2 {
        let mut b = batch(10, 3, 0);
        let w = &mut b.who;
        // Threads 43 and 44 are "worker"s, 45 is named as its process, 46 has no name.
        for (tid, n) in [(43, 6), (44, 2), (45, 3), (46, 1)] {
            w.threads.insert((42, tid, 0), n);
        }
        w.thread_names.insert((42, 43), b"worker".to_vec());
        w.thread_names.insert((42, 44), b"worker".to_vec());
        w.thread_names.insert((42, 45), b"web".to_vec());
        s.add(b, 0, 0);
        s.flush_everything().expect("flush");
    }
    let t = WhoTable::read(&path).expect("who.tbl");
    assert_eq!(v(&path), 2);
    let k = ThreadKey {
        cgroup: "/system.slice/web.service".into(),
        command: b"web".to_vec(),
        pid: 0,
        thread: b"worker".to_vec(),
        event: "cpu-clock".into(),
    };
    assert_eq!(t.threads.len(), 1, "{:?}", t.threads);
    assert_eq!(t.threads.get(&k), Some(&16), "{:?}", t.threads);
    assert_eq!(t.samples(), 100 + 3 * 13, "thread rows are a breakdown, not more samples");
}

#[test]
fn pids_are_kept_only_with_by_pid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = open(dir.path());
    s.set_who_by_pid(true);
    s.add(batch(10, 0, 0), 0, 0);
    s.flush_everything().expect("flush");
    let t = WhoTable::read(&who_path(dir.path(), &s)).expect("who.tbl");
    let k = key(42, "web", "/usr/bin/web", "/system.slice/web.service");
    assert_eq!(t.rows.get(&k), Some(&10), "{t:?}");
}

#[test]
fn a_corrupt_who_table_is_set_aside() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = open(dir.path());
    s.add(batch(10, 0, 0), 0, 0);
    s.flush_everything().expect("flush");
    let path = who_path(dir.path(), &s);
    std::fs::write(&path, b"DCPIWHO\0garbage").expect("corrupt it");
    s.add(batch(2, 0, 0), 0, 0);
    s.flush_everything().expect("flush");
    let t = WhoTable::read(&path).expect("fresh who.tbl");
    assert_eq!(t.samples(), 2, "the corrupt file's counts are not trusted: {t:?}");
    let aside = path.with_file_name(format!("who.tbl{}", profile_format::CORRUPT_SUFFIX));
    assert!(aside.exists(), "{} missing", aside.display());
}
