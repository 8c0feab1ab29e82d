//! The symbol store's writer (FORMAT.md §10): the first time the store takes samples of an ELF
//! image with a build-id, it hands the image to a background thread, which stores the image's
//! function-symbol table once per database (a `stat` when another host or an earlier run
//! stored it). Reports fall back on it when the binary is rebuilt or deleted.
//!
//! Bounds, so that a host starting next to many images (or a hostile one) cannot make dcpid
//! busy or fill the database: the drain and flush threads only look up a set and send to a
//! bounded queue ([`QUEUE`] jobs; more are left for a later batch); the worker reads one image
//! at a time through the bounded reader of [`crate::resolve::symtab`], spends at most a tenth
//! of one CPU (after each table it sleeps nine times the CPU time it took, at least
//! [`MIN_GAP`]) and writes at most [`BYTES_PER_HOUR`] per hour (a token bucket; a full bucket
//! lets the first minute after a start store the running images' tables at once).

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dcpi_proto::status::SymbolTableStatus;
use profile_format::{Database, ImageId, ImageKind};

use crate::resolve::symtab::{extract, SymtabError, SYSTEM_DEBUG_DIR};
use crate::types::ImageInfo;

/// Jobs waiting for the worker at most.
const QUEUE: usize = 1024;
/// Shortest pause between two tables.
const MIN_GAP: Duration = Duration::from_millis(20);
/// CPU share the worker may use (of one CPU), as the ratio of sleep to work.
const SLEEP_PER_WORK: u32 = 9;
/// Bytes of tables written per hour at most (and the bucket's size).
pub(super) const BYTES_PER_HOUR: u64 = 256 << 20;
/// Name of the worker thread.
pub const SYMTAB_THREAD: &str = "dcpid-symstore";

/// One image to store.
#[derive(Debug)]
struct Job {
    db: PathBuf,
    build_id: Vec<u8>,
    path: PathBuf,
}

/// What the worker did (for logs, tests and benchmarks).
#[derive(Debug, Default)]
pub struct SymtabCounters {
    /// Tables written.
    pub stored: AtomicU64,
    /// Bytes of tables written.
    pub bytes: AtomicU64,
    /// Images whose table the database had already.
    pub present: AtomicU64,
    /// Images without a table: file gone or replaced, not ELF, stripped bare, over a bound.
    pub skipped: AtomicU64,
    /// Thread CPU time of the worker (ns).
    pub cpu_ns: AtomicU64,
    /// Jobs handed to the worker, and jobs it finished (whatever their outcome): the
    /// difference is its queue.
    pub offered: AtomicU64,
    pub finished: AtomicU64,
}

impl SymtabCounters {
    /// The counters as `dcpictl status` shows them.
    pub fn status(&self) -> SymbolTableStatus {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        // `finished` is read first: read after `offered`, a job finished in between could
        // make it the larger.
        let finished = get(&self.finished);
        let offered = get(&self.offered);
        SymbolTableStatus {
            offered,
            queued: offered.saturating_sub(finished),
            stored: get(&self.stored),
            bytes: get(&self.bytes),
            present: get(&self.present),
            skipped: get(&self.skipped),
            cpu_s: get(&self.cpu_ns) as f64 / 1e9,
        }
    }
}

/// The store's side: which images were offered, and the queue to the worker.
#[derive(Default)]
pub(super) struct SymtabStore {
    /// Build-ids offered in the current epoch (cleared when it changes, so that a table that
    /// retention removed is stored again once the image is profiled again).
    seen: HashSet<Vec<u8>>,
    epoch: Option<String>,
    tx: Option<SyncSender<Job>>,
    counters: Arc<SymtabCounters>,
    /// The worker could not be started (logged once; nothing is stored).
    failed: bool,
    /// Debug-file root (tests point it elsewhere); `/usr/lib/debug` by default.
    debug_root: Option<PathBuf>,
}

impl SymtabStore {
    fn sender(&mut self) -> Option<&SyncSender<Job>> {
        if self.tx.is_none() && !self.failed {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(QUEUE);
            let counters = Arc::clone(&self.counters);
            let root = self.debug_root.clone().unwrap_or_else(|| PathBuf::from(SYSTEM_DEBUG_DIR));
            match std::thread::Builder::new()
                .name(SYMTAB_THREAD.into())
                .spawn(move || worker(&rx, &counters, &root))
            {
                Ok(_) => self.tx = Some(tx),
                Err(e) => {
                    tracing::warn!(error = %e, "store: cannot start the symbol store thread; binaries' symbols are not stored");
                    self.failed = true;
                }
            }
        }
        self.tx.as_ref()
    }

    /// Offer the images of a batch (only ELF images with a build-id are stored).
    pub(super) fn offer<'a>(
        &mut self,
        db: &Path,
        epoch: Option<&str>,
        images: impl Iterator<Item = &'a ImageInfo>,
    ) {
        if self.epoch.as_deref() != epoch {
            self.epoch = epoch.map(str::to_owned);
            self.seen.clear();
        }
        for img in images {
            let (ImageKind::Elf, ImageId::BuildId(b)) = (img.kind, &img.id) else { continue };
            if self.seen.contains(b) || img.path.is_empty() {
                continue;
            }
            let Some(tx) = self.sender() else { return };
            let job = Job {
                db: db.to_owned(),
                build_id: b.clone(),
                path: PathBuf::from(std::ffi::OsStr::from_bytes(&img.path)),
            };
            match tx.try_send(job) {
                Ok(()) => {
                    self.counters.offered.fetch_add(1, Ordering::Relaxed);
                    self.seen.insert(b.clone());
                }
                // Offered again with a later batch.
                Err(TrySendError::Full(_)) => return,
                Err(TrySendError::Disconnected(_)) => {
                    self.tx = None;
                    self.failed = true;
                    return;
                }
            }
        }
    }

    pub(super) fn counters(&self) -> Arc<SymtabCounters> {
        Arc::clone(&self.counters)
    }
}

fn worker(rx: &Receiver<Job>, c: &SymtabCounters, debug_root: &Path) {
    use crate::sys::time::thread_cpu_ns;
    let mut tokens = BYTES_PER_HOUR;
    let mut refilled = Instant::now();
    let mut logged_errors = 0u32;
    while let Ok(job) = rx.recv() {
        let c0 = thread_cpu_ns();
        let db = match Database::open(&job.db) {
            Ok(db) => db,
            Err(_) => {
                c.finished.fetch_add(1, Ordering::Relaxed);
                continue;
            }
        };
        if db.has_symtab(&job.build_id) {
            c.present.fetch_add(1, Ordering::Relaxed);
            c.finished.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        // Refill the byte budget for the time passed.
        let now = Instant::now();
        let earned = (now - refilled).as_secs_f64() / 3600.0 * BYTES_PER_HOUR as f64;
        if earned >= 1.0 {
            tokens = tokens.saturating_add(earned as u64).min(BYTES_PER_HOUR);
            refilled = now;
        }
        let r = extract(&job.path, &job.build_id, debug_root);
        let written = match r {
            Ok(t) => match t.encode() {
                Ok(bytes) if bytes.len() as u64 > tokens => {
                    tracing::debug!(path = %job.path.display(), "store: symbol table over this hour's byte budget; not stored");
                    c.skipped.fetch_add(1, Ordering::Relaxed);
                    None
                }
                Ok(_) => match db.put_symtab(&t) {
                    Ok(n) => Some(n),
                    Err(e) => {
                        if logged_errors < 10 {
                            logged_errors += 1;
                            tracing::warn!(error = %e, "store: cannot store a symbol table");
                        }
                        None
                    }
                },
                Err(e) => {
                    tracing::debug!(error = %e, "store: symbol table over the format's bounds");
                    c.skipped.fetch_add(1, Ordering::Relaxed);
                    None
                }
            },
            Err(e) => {
                // Common and harmless (a binary replaced or stripped bare): debug level.
                match &e {
                    SymtabError::TooLarge { .. } => {
                        tracing::info!(error = %e, "store: symbol table not stored")
                    }
                    _ => tracing::debug!(error = %e, "store: symbol table not stored"),
                }
                c.skipped.fetch_add(1, Ordering::Relaxed);
                None
            }
        };
        if let Some(n) = written {
            tokens = tokens.saturating_sub(n);
            c.bytes.fetch_add(n, Ordering::Relaxed);
            if n > 0 {
                c.stored.fetch_add(1, Ordering::Relaxed);
            } else {
                c.present.fetch_add(1, Ordering::Relaxed);
            }
        }
        let spent = thread_cpu_ns().saturating_sub(c0);
        c.cpu_ns.fetch_add(spent, Ordering::Relaxed);
        // Before the pause: the job is done, the pause only paces the next one.
        c.finished.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(MIN_GAP.max(Duration::from_nanos(spent) * SLEEP_PER_WORK));
    }
}
