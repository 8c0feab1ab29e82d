//! Store: the symbol store (FORMAT.md §10). The first batch with an ELF image of a build-id
//! hands it to the symbol store's thread, which stores the image's function-symbol table once
//! per database; a file replaced by another build is not stored under the profiled build-id;
//! each new epoch offers its images again (a table retention removed comes back).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::store_support::open;
use dcpid::aggregate::OffsetCounts;
use dcpid::aggregate::{ImageInfo, Resolved, ResolvedProfile};
use object::Object;
use profile_format::{Database, ImageId, ImageKind, SymtabOrigin};

fn batch(id: &[u8], path: &std::path::Path) -> Resolved {
    let mut r = Resolved::default();
    let id = ImageId::BuildId(id.to_vec());
    let info = Arc::new(ImageInfo {
        kind: ImageKind::Elf,
        id: id.clone(),
        path: path.as_os_str().as_encoded_bytes().to_vec(),
        jit_symbols: vec![],
    });
    let mut counts = OffsetCounts::default();
    counts.insert(0x1000, (3, 3000));
    r.profiles.insert((id, 0), ResolvedProfile { image: info, event: 0, counts });
    r.samples = 3;
    r
}

fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !cond() {
        assert!(Instant::now() < deadline, "not within 120 s: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// This test binary's build-id and one of its function symbols.
/// A small C program built here with a build-id and a symbol table: the image whose table is
/// stored. (The test binary itself was used before: at the daemon package's opt-level 1 its
/// marker function could be inlined away, and a fresh CI build then had no symbol to find.)
fn probe_image(dir: &std::path::Path) -> Option<(std::path::PathBuf, Vec<u8>, String)> {
    let src = dir.join("probe.c");
    std::fs::write(
        &src,
        "__attribute__((noinline)) int dcpi_symtab_probe(int x) { return x * 3; }\n\
         int main(int c, char **v) { (void)v; return dcpi_symtab_probe(c); }\n",
    )
    .ok()?;
    let bin = dir.join("probe");
    let st = std::process::Command::new("cc")
        .args(["-O1", "-Wl,--build-id=sha1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .ok()?;
    if !st.success() {
        return None;
    }
    #[allow(clippy::disallowed_methods)]
    let data = std::fs::read(&bin).ok()?;
    let f = object::File::parse(&*data).ok()?;
    let id = f.build_id().ok()??.to_vec();
    Some((bin, id, "dcpi_symtab_probe".to_owned()))
}

#[test]
fn first_batch_of_an_image_stores_its_symbol_table_once() {
    let dir = tempfile::tempdir().unwrap();
    let Some((exe, id, name)) = probe_image(dir.path()) else {
        dcpi_testkit::skip!("cc could not build a program with a build-id (is gcc installed?)");
    };
    let mut s = open(dir.path());
    let db = Database::open(&dir.path().join("db")).unwrap();
    let counters = s.symtab_counters();
    // The same path, but the profile says another build: the file there was replaced.
    let other = vec![0x5a; 20];
    s.add(batch(&id, &exe), 0, 0);
    s.add(batch(&other, &exe), 0, 0);
    s.tick_at(Instant::now());
    wait("table stored", || db.has_symtab(&id));
    wait("other build skipped", || counters.skipped.load(Ordering::Relaxed) >= 1);
    let t = db.read_symtab(&id).expect("stored table reads back");
    assert_eq!(t.build_id, id);
    assert_eq!(t.origin, SymtabOrigin::Symtab, "the probe is not stripped");
    assert!(t.symbols.iter().any(|s| s.name == name), "{name} not in the stored table");
    assert!(!t.segments.is_empty());
    assert!(!db.has_symtab(&other), "a replaced file is not stored under the profiled build");
    assert_eq!(counters.stored.load(Ordering::Relaxed), 1);
    let bytes = counters.bytes.load(Ordering::Relaxed);
    assert!(bytes > 0 && bytes == std::fs::metadata(db.symtab_path(&id)).unwrap().len());

    // A new epoch offers the image again: a table removed meanwhile (retention) is stored
    // again; one that is there costs a stat.
    std::fs::remove_file(db.symtab_path(&id)).unwrap();
    s.new_epoch().unwrap();
    s.add(batch(&id, &exe), 0, 0);
    s.add(batch(&id, &exe), 0, 0);
    wait("table stored again", || db.has_symtab(&id));
    wait("second store counted", || counters.stored.load(Ordering::Relaxed) == 2);
    s.new_epoch().unwrap();
    s.add(batch(&id, &exe), 0, 0);
    wait("present counted", || counters.present.load(Ordering::Relaxed) >= 1);
    assert_eq!(counters.stored.load(Ordering::Relaxed), 2, "stored once per database");
    // What `dcpictl status` shows: three offers (one per epoch: the other build's was the
    // first epoch's second), all finished.
    wait("queue empty", || s.status().symbol_tables.queued == 0);
    let st = s.status().symbol_tables;
    assert_eq!((st.offered, st.stored, st.present), (4, 2, 1), "{st:?}");
    assert!(st.skipped >= 1 && st.bytes >= bytes && st.cpu_s > 0.0, "{st:?}");
}
