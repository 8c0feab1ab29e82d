//! Signals, the main thread's wait for a stop, and the stop itself.

use signal_hook::iterator::Handle;
use signal_hook::iterator::Signals;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::aggregate::Resolved;
use crate::notify::Notifier;
use crate::store::{Store, StoreError};
use crate::watch::Watch;

use super::shared::{lock, read, Shared};
use super::start::who_profiles;
use super::ServiceError;

/// A drain thread that has not completed a loop for this long withholds WATCHDOG=1.
pub(super) const PROGRESS_MAX_AGE: Duration = Duration::from_secs(5);

/// The main thread's longest sleep outside systemd: signals and `--duration` wake it anyway.
pub(super) const IDLE_WAKE: Duration = Duration::from_secs(60);

/// At a stop: how long to wait for the flush thread, and for the store's lock.
pub(super) const STOP_WAIT: Duration = Duration::from_secs(3);

/// At a stop with a database that answers: how long the last publish may take.
pub(super) const STOP_PUBLISH_WAIT: Duration = Duration::from_secs(60);

pub(super) enum Wake {
    Stop(&'static str),
    Reload,
}

/// SIGTERM/SIGINT stop, SIGHUP reloads; each arrives on `tx`.
pub(super) fn spawn_signal_thread(
    tx: mpsc::Sender<Wake>,
    watch: &Arc<Watch>,
) -> Result<(Handle, std::thread::JoinHandle<()>), ServiceError> {
    let mut signals =
        Signals::new([libc::SIGTERM, libc::SIGINT, libc::SIGHUP]).map_err(ServiceError::Signals)?;
    let handle = signals.handle();
    // It ends by itself after a stop signal, before the watch is told: only a panic counts.
    let thread = watch
        .spawn("dcpi-signals".into(), false, move || {
            for sig in signals.forever() {
                let wake = match sig {
                    libc::SIGHUP => Wake::Reload,
                    libc::SIGINT => Wake::Stop("SIGINT"),
                    _ => Wake::Stop("SIGTERM"),
                };
                let stop = matches!(wake, Wake::Stop(_));
                if tx.send(wake).is_err() || stop {
                    break;
                }
            }
        })
        .map_err(ServiceError::Signals)?;
    Ok((handle, thread))
}

/// The main thread's loop: reloads, systemd STATUS= and WATCHDOG=1 (only while every drain
/// thread progresses), until a stop signal or the end of `--duration`. Returns why it stopped.
pub(super) fn serve_until_stop(
    shared: &Shared,
    notifier: &Notifier,
    rx: &mpsc::Receiver<Wake>,
    duration: Option<Duration>,
) -> &'static str {
    let deadline = duration.map(|d| Instant::now() + d);
    // Ping twice per recommended interval (a quarter of WATCHDOG_USEC): a loaded machine may
    // delay one wake-up without systemd seeing a gap.
    let watchdog_every = notifier.watchdog_interval().map(|w| w / 2);
    let mut next_status = Instant::now() + read(&shared.settings).status_interval;
    loop {
        let now = Instant::now();
        let mut wake_at = if notifier.is_enabled() { next_status } else { now + IDLE_WAKE };
        if let Some(w) = watchdog_every {
            wake_at = wake_at.min(now + w);
        }
        if let Some(d) = deadline {
            wake_at = wake_at.min(d);
        }
        match rx.recv_timeout(wake_at.saturating_duration_since(now)) {
            Ok(Wake::Stop(why)) => return why,
            Ok(Wake::Reload) => {
                let r = shared.reload("SIGHUP");
                notifier.status(&if r.ok {
                    format!("configuration reloaded; {}", shared.status().one_line())
                } else {
                    format!("reload rejected: {}", r.error.unwrap_or_default())
                });
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => return "signal thread gone",
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return "--duration elapsed";
        }
        // A full status reads /proc and every component's counters: outside systemd nobody
        // reads the line, and the collector's cost is judged against perf's (issue 13).
        if now >= next_status && notifier.is_enabled() {
            next_status = now + read(&shared.settings).status_interval;
            notifier.status(&shared.status().one_line());
        }
        if watchdog_every.is_some() {
            // A dead thread (flush, control...) stops the pings too: systemd then restarts us.
            let progressing = !shared.watch.degraded()
                && read(&shared.sampler)
                    .as_ref()
                    .is_some_and(|s| s.drain_threads_progressing(PROGRESS_MAX_AGE));
            if progressing {
                notifier.watchdog();
            }
        }
    }
}

/// Stop sampling (every drain thread disables its events and delivers a final pass, which is
/// the barrier for SIGTERM and `--duration`), then spool and publish everything.
///
/// A hung database must not hold the stop: the last samples go to the local spool first;
/// publishing is skipped if the database has stalled, and bounded otherwise; if a stuck
/// operation holds the store, the samples are spooled without it. An error says what was not
/// published (a `--duration` run fails on it) or, `Unwritten`, what did not even reach the
/// spool (always a failure).
pub(super) fn shut_down(shared: &Arc<Shared>) -> Result<(), StoreError> {
    // Its last pass hands over every wait that ended (a wait still open is not counted).
    if let Some(mut o) = lock(&shared.offcpu).take() {
        o.stop();
    }
    let last = shared
        .sampler
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take()
        .map(super::super::perf::sampler::Sampler::stop);
    // The last flush applies what is still queued itself.
    shared.aggregator.stop_resolver_thread();
    let settings = shared.settings();
    let deadline = Instant::now() + STOP_WAIT;
    let mut store = loop {
        match shared.store.try_lock() {
            Ok(g) => break Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => break Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(std::sync::TryLockError::WouldBlock) => break None,
        }
    };
    let resolved = shared.aggregator.flush_all();
    let Some(st) = store.as_mut() else {
        lock(&shared.counters).resolved_samples += resolved.samples;
        spool_without_store(shared, resolved)?;
        return Err(StoreError::NoDatabase(settings.db.clone()));
    };
    shared.sync_store(st);
    // With the sampler's last status: its final counter times and losses go into this batch.
    shared.absorb_with(st, resolved, last.as_ref(), None);
    st.spool_held();
    *lock(&shared.store_status) = st.status();
    if let Some(since) = shared.stalled_since(&settings) {
        let dropped = st.drop_held();
        tracing::error!(
            stalled_since_unix_ms = since,
            dropped,
            "the database is not answering; not publishing at stop, the spool keeps {}",
            kept(dropped)
        );
        return Err(StoreError::NoDatabase(settings.db.clone()));
    }
    drop(store);
    // The last publish, bounded: the database may hang right now.
    let (tx, rx) = mpsc::channel();
    let sh = Arc::clone(shared);
    let spawned = std::thread::Builder::new().name("dcpid-stop".into()).spawn(move || {
        let r = sh.flush_everything();
        let mut st = lock(&sh.store);
        // Whatever is still held (the spool full, the database failing) ends with the process.
        let dropped = st.drop_held();
        st.release_lease();
        drop(tx.send((r, dropped)));
    });
    match spawned.map(|_| rx.recv_timeout(STOP_PUBLISH_WAIT)) {
        Ok(Ok((Ok(()), _))) => Ok(()),
        Ok(Ok((Err(e), dropped))) => {
            tracing::error!(error = %e, dropped,
                "could not publish everything; the spool keeps {}", kept(dropped));
            Err(e)
        }
        Ok(Err(_)) => {
            let held = shared.losses.held();
            tracing::error!(
                wait_s = STOP_PUBLISH_WAIT.as_secs(),
                dropped = held,
                "the last publish did not finish; the spool keeps {}",
                kept(held)
            );
            Err(StoreError::NoDatabase(settings.db.clone()))
        }
        Err(e) => {
            tracing::error!(error = %e, "cannot start the last publish");
            Err(StoreError::NoDatabase(settings.db.clone()))
        }
    }
}

/// What the spool keeps at a stop that could not publish everything, for its log line: the
/// spool does not keep what was dropped.
pub(super) fn kept(dropped: u64) -> String {
    if dropped == 0 {
        "everything for the next start".into()
    } else {
        format!(
            "what it took for the next start; {dropped} samples written neither to it nor to \
             the database are dropped"
        )
    }
}

/// The stop's last samples, when a stuck database operation holds the store: appended to the
/// spool directly, for the next start to publish. What it cannot take is counted as dropped.
pub(super) fn spool_without_store(shared: &Shared, resolved: Resolved) -> Result<(), StoreError> {
    let n = resolved.profiles.len();
    let samples = resolved.samples;
    let lost = |why: &dyn std::fmt::Display| {
        tracing::error!(samples, error = %why, "could not spool the last samples; they are dropped");
        shared.losses.dropped.fetch_add(samples, std::sync::atomic::Ordering::AcqRel);
        Err(StoreError::Unwritten(n))
    };
    let epoch = lock(&shared.store_status).epoch.clone();
    let Some(epoch) = epoch.and_then(|e| profile_format::EpochId::parse(&e).ok()) else {
        return lost(&"no epoch known");
    };
    let who = who_profiles(&read(&shared.settings));
    match Store::spool_directly(&shared.store_cfg, &shared.events, &epoch, resolved, 0, 0, who) {
        Ok(samples) => {
            tracing::error!(samples,
                "a stuck database operation holds the store; the last samples were spooled directly for the next start");
            Ok(())
        }
        Err(e) => lost(&e),
    }
}

impl Shared {
    /// At shutdown, after the sampler stopped (its drain threads delivered a final pass).
    pub(super) fn flush_everything(&self) -> Result<(), StoreError> {
        let mut store = lock(&self.store);
        let resolved = self.aggregator.flush_all();
        self.sync_store(&mut store);
        self.absorb(&mut store, resolved);
        let r = store.flush_everything();
        *lock(&self.store_status) = store.status();
        r
    }
}
