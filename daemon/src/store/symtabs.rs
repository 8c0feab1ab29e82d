//! The symbol store's writer (FORMAT.md §10): the first time the store takes samples of an ELF
//! image with a build-id, it hands the image to a background thread, which stores the image's
//! function-symbol table once per database (a `stat` when another host or an earlier run
//! stored it). Reports fall back on it when the binary is rebuilt or deleted.
//!
//! Bounds, so that a host starting next to many images (or a hostile one) cannot make dcpid
//! busy or fill the database: the drain and flush threads only look up a set and send to a
//! bounded queue ([`QUEUE`] jobs; more are left for a later batch); the worker reads one image
//! at a time through the bounded reader of [`crate::resolve::symtab`] and is held to two token
//! buckets: CPU time ([`CPU_PER_SEC`] per second on average, bursts up to [`CPU_BURST`]) and
//! bytes ([`BYTES_PER_HOUR`] per hour). Full buckets let the first minutes after a start store
//! the running images' tables at once; after that a machine that links new binaries all day (a
//! CI runner) costs at most [`CPU_PER_SEC`]: the images beyond the budget wait in the queue (or
//! in the batches that offer them again) and are stored later, the image with the most
//! samples first. Before this bound the worker
//! could take a tenth of a CPU, and did: 21-31 ms/s on a VM where other builds kept linking
//! binaries (BENCHMARKS.md, "DWARF stacks (issue 37)").

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use profile_format::{Database, ImageId, ImageKind};

use crate::resolve::symtab::{extract, SymtabError, SYSTEM_DEBUG_DIR};

/// Jobs waiting for the worker at most.
const QUEUE: usize = 1024;
/// Shortest pause between two tables.
const MIN_GAP: Duration = Duration::from_millis(20);
/// Worker CPU time earned per second of wall time (0.2 % of one CPU): the steady-state cost
/// of the store however many new binaries appear. A small C program's table costs ~0.1-0.5 ms
/// to read and write, a large Rust test binary's a few ms, so this still stores a few
/// new images a minute.
pub(super) const CPU_PER_SEC: Duration = Duration::from_millis(2);
/// Worker CPU time that may be spent at once (the bucket's size): the tables of the images
/// running at start-up, a few hundred small ones.
pub(super) const CPU_BURST: Duration = Duration::from_millis(500);
/// Longest single sleep while waiting for CPU budget (the limits are read again after it).
const MAX_WAIT: Duration = Duration::from_secs(1);
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
    /// Samples of the image in the batch that offered it: the worker stores the most sampled
    /// waiting image first, so that under churn the budget goes to the images a report
    /// will show, and images seen only briefly (a build script) wait.
    samples: u64,
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
    /// Times the worker had a job but waited for CPU budget (the job stays queued).
    pub deferred: AtomicU64,
}

/// The worker's CPU budget, readable and settable while it runs (tests narrow it).
#[derive(Debug)]
pub struct SymtabBudget {
    /// CPU time earned per second (ns).
    pub cpu_ns_per_sec: AtomicU64,
    /// The bucket's size (ns).
    pub burst_ns: AtomicU64,
}

impl Default for SymtabBudget {
    fn default() -> Self {
        Self {
            cpu_ns_per_sec: AtomicU64::new(CPU_PER_SEC.as_nanos() as u64),
            burst_ns: AtomicU64::new(CPU_BURST.as_nanos() as u64),
        }
    }
}

/// A token bucket of CPU time: [`Pacer::wait`] says how long to wait before the next job may
/// start (none while the bucket holds any time), [`Pacer::charge`] takes a job's CPU time out.
/// A job may overdraw the bucket by its own cost; the debt is paid by waiting, so over any
/// span `T` the work done is at most `burst + rate * T + one job`.
#[derive(Debug)]
pub(super) struct Pacer {
    /// Budget left (ns); negative after an overdraft.
    tokens: i128,
    last: Instant,
}

impl Pacer {
    pub(super) fn new(now: Instant, burst_ns: u64) -> Self {
        Self { tokens: i128::from(burst_ns), last: now }
    }

    fn refill(&mut self, now: Instant, rate_ns_per_sec: u64, burst_ns: u64) {
        let dt = i128::try_from(now.saturating_duration_since(self.last).as_nanos())
            .unwrap_or(i128::MAX);
        let earned = dt.saturating_mul(i128::from(rate_ns_per_sec)) / 1_000_000_000;
        if earned > 0 {
            self.tokens = (self.tokens + earned).min(i128::from(burst_ns));
            self.last = now;
        } else if self.tokens > i128::from(burst_ns) {
            self.tokens = i128::from(burst_ns);
        }
    }

    /// How long to wait (at most [`MAX_WAIT`]) before a job may start at `now`; `None` if it
    /// may start now.
    pub(super) fn wait(
        &mut self,
        now: Instant,
        rate_ns_per_sec: u64,
        burst_ns: u64,
    ) -> Option<Duration> {
        self.refill(now, rate_ns_per_sec, burst_ns);
        if self.tokens > 0 {
            return None;
        }
        let need = u128::try_from(1 - self.tokens).unwrap_or(0);
        let wait = need
            .saturating_mul(1_000_000_000)
            .checked_div(u128::from(rate_ns_per_sec))
            .map_or(MAX_WAIT, |ns| Duration::from_nanos(u64::try_from(ns).unwrap_or(u64::MAX)));
        Some(wait.clamp(Duration::from_millis(1), MAX_WAIT))
    }

    pub(super) fn charge(&mut self, spent_ns: u64) {
        self.tokens -= i128::from(spent_ns);
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
    budget: Arc<SymtabBudget>,
}

impl SymtabStore {
    fn sender(&mut self) -> Option<&SyncSender<Job>> {
        if self.tx.is_none() && !self.failed {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(QUEUE);
            let counters = Arc::clone(&self.counters);
            let budget = Arc::clone(&self.budget);
            let root = self.debug_root.clone().unwrap_or_else(|| PathBuf::from(SYSTEM_DEBUG_DIR));
            match std::thread::Builder::new()
                .name(SYMTAB_THREAD.into())
                .spawn(move || worker(&rx, &counters, &budget, &root))
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
        images: impl Iterator<Item = (&'a crate::types::ImageInfo, &'a crate::aggregate::OffsetCounts)>,
    ) {
        if self.epoch.as_deref() != epoch {
            self.epoch = epoch.map(str::to_owned);
            self.seen.clear();
        }
        for (img, counts) in images {
            let (ImageKind::Elf, ImageId::BuildId(b)) = (img.kind, &img.id) else { continue };
            if self.seen.contains(b) || img.path.is_empty() {
                continue;
            }
            let Some(tx) = self.sender() else { return };
            let job = Job {
                db: db.to_owned(),
                build_id: b.clone(),
                path: PathBuf::from(std::ffi::OsStr::from_bytes(&img.path)),
                samples: counts.values().map(|c| c.0).sum(),
            };
            match tx.try_send(job) {
                Ok(()) => {
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

    pub(super) fn budget(&self) -> Arc<SymtabBudget> {
        Arc::clone(&self.budget)
    }
}

fn worker(rx: &Receiver<Job>, c: &SymtabCounters, budget: &SymtabBudget, debug_root: &Path) {
    use crate::sys::time::thread_cpu_ns;
    let mut tokens = BYTES_PER_HOUR;
    let mut refilled = Instant::now();
    let mut logged_errors = 0u32;
    let mut pacer = Pacer::new(Instant::now(), budget.burst_ns.load(Ordering::Relaxed));
    // Jobs taken off the channel, waiting (at most QUEUE: beyond, they wait in the channel).
    let mut pending: Vec<Job> = Vec::new();
    loop {
        if pending.is_empty() {
            match rx.recv() {
                Ok(j) => pending.push(j),
                Err(_) => return,
            }
        }
        // The CPU budget: wait (the jobs stay queued; the store offers more only while the
        // queue has room) until the bucket holds time again.
        loop {
            let rate = budget.cpu_ns_per_sec.load(Ordering::Relaxed);
            let burst = budget.burst_ns.load(Ordering::Relaxed);
            match pacer.wait(Instant::now(), rate, burst) {
                None => break,
                Some(d) => {
                    c.deferred.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(d);
                }
            }
        }
        while pending.len() < QUEUE {
            match rx.try_recv() {
                Ok(j) => pending.push(j),
                Err(_) => break,
            }
        }
        let most = (0..pending.len()).max_by_key(|&i| pending[i].samples).unwrap_or(0);
        let job = pending.swap_remove(most);
        let c0 = thread_cpu_ns();
        let db = match Database::open(&job.db) {
            Ok(db) => db,
            Err(_) => {
                pacer.charge(thread_cpu_ns().saturating_sub(c0));
                continue;
            }
        };
        if db.has_symtab(&job.build_id) {
            c.present.fetch_add(1, Ordering::Relaxed);
            pacer.charge(thread_cpu_ns().saturating_sub(c0));
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
        pacer.charge(spent);
        tracing::debug!(path = %job.path.display(), cpu_us = spent / 1000, bytes = written.unwrap_or(0), "store: symbol table done");
        std::thread::sleep(MIN_GAP);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CI runner's day in simulated time: a new image always waiting, each costing 30 ms of
    /// CPU. Over an hour the worker does at most the burst, the rate times the hour, and one
    /// job's overdraft; the old policy (sleep nine times the work) allowed a tenth of a CPU,
    /// 360 s of CPU in that hour.
    #[test]
    fn the_worker_stays_within_its_cpu_budget_however_many_images_wait() {
        let rate = CPU_PER_SEC.as_nanos() as u64;
        let burst = CPU_BURST.as_nanos() as u64;
        let job = 30_000_000u64;
        let t0 = Instant::now();
        let mut now = t0;
        let mut p = Pacer::new(now, burst);
        let (mut done, mut cpu) = (0u64, 0u64);
        let hour = Duration::from_secs(3600);
        while now - t0 < hour {
            match p.wait(now, rate, burst) {
                Some(d) => now += d,
                None => {
                    p.charge(job);
                    cpu += job;
                    done += 1;
                    now += Duration::from_nanos(job) + MIN_GAP;
                }
            }
        }
        let bound = burst + rate * 3600 + job;
        assert!(cpu <= bound, "{cpu} ns of CPU in an hour, bound {bound}");
        // And it is not starved: it does use the budget.
        assert!(cpu >= rate * 3600 / 2, "only {cpu} ns used of {} ns", rate * 3600);
        assert!(done > 0);
    }

    /// The burst is spent at once (the images running at start), then jobs wait.
    #[test]
    fn a_full_bucket_runs_at_once_then_defers() {
        let now = Instant::now();
        let mut p = Pacer::new(now, 10_000_000);
        assert_eq!(p.wait(now, 1_000_000, 10_000_000), None);
        p.charge(4_000_000);
        assert_eq!(p.wait(now, 1_000_000, 10_000_000), None);
        p.charge(7_000_000);
        // 1 ms overdrawn at 1 ms/s: about a second to wait.
        let w = p.wait(now, 1_000_000, 10_000_000).expect("over budget: must wait");
        assert!(w >= Duration::from_millis(900) && w <= MAX_WAIT, "{w:?}");
        // No rate: wait (and look again) however long.
        assert_eq!(p.wait(now, 0, 10_000_000), Some(MAX_WAIT));
        // A second later the debt is paid.
        assert_eq!(p.wait(now + Duration::from_millis(1001), 1_000_000, 10_000_000), None);
    }
}
