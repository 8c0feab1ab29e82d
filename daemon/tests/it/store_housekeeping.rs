//! Store housekeeping: temporary files left by a kill -9 are removed at start (only old ones,
//! only in this host's directories), and an error that comes and goes is logged once per change
//! of state, not once per attempt.

use crate::store_support;

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use dcpid::store::KernelSymbolSource;
use profile_format::{Database, KallsymsSnapshot};
use store_support::{batch, open};
use tracing::subscriber::set_default;

fn aged(path: &Path, age: Duration) {
    std::fs::write(path, b"half a profile").unwrap();
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - age).unwrap();
}

#[test]
fn stale_temporary_files_of_this_host_are_removed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut s = open(root);
    let epoch = s.current_epoch().cloned().unwrap();
    s.add(batch(1, 0x10, 5), 0, 0);
    s.flush_everything().unwrap();
    drop(s);
    let db = Database::open(&root.join("db")).unwrap();
    let mine = db.host_dir(&epoch, "h1").unwrap();
    let other = db.host_dir(&epoch, "h2").unwrap();
    other.create().unwrap();
    let old_mine = mine.path.join(".tmp-h1-4242-00000000deadbeef");
    let new_mine = mine.path.join(".tmp-h1-4243-00000000cafef00d");
    let old_other = other.path.join(".tmp-h2-4242-00000000deadbeef");
    aged(&old_mine, Duration::from_secs(3 * 3600));
    aged(&new_mine, Duration::from_secs(5));
    aged(&old_other, Duration::from_secs(3 * 3600));
    let _s = open(root);
    assert!(!old_mine.exists(), "an old temporary file of a killed writer is removed");
    assert!(new_mine.exists(), "a young one may be a write in progress: kept");
    assert!(old_other.exists(), "another host's directory is not touched");
}

/// Log lines written while the guard lives.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn count(&self, needle: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap()).matches(needle).count()
    }
}

struct FailingKernel;

impl KernelSymbolSource for FailingKernel {
    fn fingerprint(&mut self) -> Option<Vec<u8>> {
        // Changes every time: a refresh is attempted at every tick.
        Some(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
                .to_le_bytes()
                .to_vec(),
        )
    }
    fn snapshot(&mut self) -> Result<KallsymsSnapshot, String> {
        Err("/proc/kallsyms: EIO".into())
    }
}

#[test]
fn flapping_errors_are_logged_once_per_change_of_state() {
    let logs = Logs::default();
    let w = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || w.clone())
        .finish();
    let _guard = set_default(subscriber);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let mut s = open(root);
    s.set_kallsyms_source(Box::new(FailingKernel));
    let epoch = s.current_epoch().cloned().unwrap();
    s.add(batch(1, 0x10, 5), 0, 0);
    s.flush_everything().unwrap();
    // The summary cannot be written (a directory took its name) while profiles can: within
    // every flush the database works for one file and fails for the next.
    let hd = Database::open(&root.join("db")).unwrap().host_dir(&epoch, "h1").unwrap();
    std::fs::remove_file(hd.summary_path()).unwrap();
    std::fs::create_dir_all(hd.summary_path().join("x")).unwrap();
    for i in 0..5 {
        s.add(batch(1, 0x20 + i, 1), 0, 0);
        assert!(s.flush_everything().is_err());
    }
    assert_eq!(logs.count("cannot write the profile database"), 1, "one failing state");
    assert_eq!(logs.count("writable again"), 0, "never recovered within a flush");
    // Repaired: one recovery line; broken again: one more error line.
    std::fs::remove_dir_all(hd.summary_path()).unwrap();
    for _ in 0..3 {
        s.add(batch(1, 0x40, 1), 0, 0);
        s.flush_everything().unwrap();
    }
    assert_eq!(logs.count("writable again"), 1);
    std::fs::remove_file(hd.summary_path()).unwrap();
    std::fs::create_dir_all(hd.summary_path().join("x")).unwrap();
    for _ in 0..3 {
        s.add(batch(1, 0x50, 1), 0, 0);
        assert!(s.flush_everything().is_err());
    }
    assert_eq!(logs.count("cannot write the profile database"), 2);
    // A kernel symbol refresh failing at every tick: one warning.
    for _ in 0..5 {
        s.tick();
    }
    assert_eq!(logs.count("could not refresh the kallsyms snapshot"), 1);
}
