//! What the flush loop, the control commands and the stop share.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use crate::aggregate::{Aggregator, Resolved};
use crate::config::Settings;
use crate::control::Access;
use crate::perf::sampler::Sampler;
use crate::status::{self, ReloadReport, StageCpu, StatusInputs, StatusReport};
use crate::store::{EventInfo, Store, StoreConfig};
use crate::watch::Watch;

use super::flush::Tick;
use super::start::{store_config, who_profiles};
use super::Hooks;
use crate::offcpu::OffCpu;
use crate::perf::sampler::SamplerStatus;
use crate::resolve::ResolverStats;
use crate::store::Losses;
use crate::store::StoreStatus;
use crate::who::HotView;
use serde_json::value::RawValue;

/// A store operation (tick or flush) running longer than this (or two flush intervals, if
/// more) means the database is not answering: `status` reports publishing as stalled.
pub(super) const STALL_AFTER: Duration = Duration::from_secs(10);

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(super) struct Counters {
    pub(super) lost: u64,
    pub(super) throttled: u64,
    pub(super) unknown_by_reason: BTreeMap<String, u64>,
    pub(super) resolved_samples: u64,
    /// Cumulative (enabled, running) ns per event as last seen, to turn them into deltas.
    pub(super) event_times: Vec<(u64, u64)>,
}

/// What only `status` reads (the flush loop and reloads write it): one lock, held briefly and
/// alone.
#[derive(Default)]
pub(super) struct StatusOnly {
    pub(super) last_reload: Option<ReloadReport>,
    /// The last flush ticks ([`Tick`]).
    pub(super) ticks: VecDeque<Tick>,
    /// CPU time of the periodic flushes, by stage (for `status`: where the cost goes).
    pub(super) stages: StageCpu,
    /// The resolver's counters as last read (status does not wait for a flush holding it).
    pub(super) resolver_stats: ResolverStats,
}

/// What the flush loop and the control commands share.
///
/// Lock order: `store` → `sampler` (read) → `counters` → `store_status`, and `store` →
/// `settings` (read). `sampler` and `settings` are never held together; `status_only` and
/// `flusher` are held alone. The aggregator's, the sampler's and the watch's own locks come
/// after all of these (no `Shared` lock is taken under them). The places that hold two at
/// once:
/// - `store` → `settings`: [`Shared::sync_store`] under the store (flush tick, cut, stop,
///   and a reload's `try_lock` of the store); the settings then → the aggregator's
///   (`set_who_profiles`).
/// - `store` → `sampler`: [`Shared::absorb`] and [`Shared::cut`] (the cut holds the sampler
///   through the aggregator's barrier), under the store.
/// - `store` → `counters`: [`Shared::absorb_with`], under the store.
/// - `store` → `store_status`: after every store operation (flush tick, `dcpictl flush`,
///   `epoch new`, stop).
/// - `counters` → `store_status`: [`Shared::status`].
/// - `status_only` → the aggregator's resolver (`try_resolver_stats`, which does not wait):
///   [`Shared::status`].
/// - `sampler` (write) at the stop, held while the sampler stops its drain threads.
pub(super) struct Shared {
    /// The settings in force; reload replaces the live-changeable ones.
    pub(super) settings: RwLock<Settings>,
    pub(super) hooks: Hooks,
    pub(super) access: Arc<Access>,
    pub(super) status_only: Mutex<StatusOnly>,
    /// The flush thread, woken when a reload changes its interval.
    pub(super) flusher: Mutex<Option<std::thread::Thread>>,
    pub(super) started: Instant,
    pub(super) aggregator: Arc<Aggregator>,
    pub(super) sampler: RwLock<Option<Sampler>>,
    /// The off-CPU source (`off_cpu = true`); stopped with the sampler.
    pub(super) offcpu: Mutex<Option<OffCpu>>,
    pub(super) store: Mutex<Store>,
    pub(super) counters: Mutex<Counters>,
    /// Last store status, so `status` answers while a slow publish holds the store.
    pub(super) store_status: Mutex<StoreStatus>,
    /// The daemon's threads: which died.
    pub(super) watch: Arc<Watch>,
    /// When the store's running operation began (0: idle), readable without its lock.
    pub(super) store_busy: Arc<std::sync::atomic::AtomicU64>,
    /// A `dcpictl flush` is running (possibly stuck on a hung database).
    pub(super) flush_running: Arc<std::sync::atomic::AtomicBool>,
    /// What a stop needs to spool the last samples when a hung database holds the store.
    pub(super) store_cfg: StoreConfig,
    pub(super) events: Vec<EventInfo>,
    /// Samples the store holds in memory and has dropped, readable without its lock (a stop
    /// whose last database operation hangs still says what it loses).
    pub(super) losses: Arc<Losses>,
    /// The last `top` answer's view and its encoding: a request that gets the same view back
    /// (nothing recorded or aged out since) sends the same bytes without encoding 8 000 rows.
    pub(super) top_answer: Mutex<Option<(Arc<HotView>, Box<RawValue>)>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").field("settings", &self.settings).finish()
    }
}

pub(super) fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub(super) fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Shared {
    pub(super) fn settings(&self) -> Settings {
        read(&self.settings).clone()
    }

    /// Give the store the live settings if a reload changed them.
    pub(super) fn sync_store(&self, store: &mut Store) {
        let s = read(&self.settings);
        let want = store_config(&s);
        if *store.config() != want {
            store.reconfigure(&want);
        }
        store.set_who_by_pid(s.by_pid);
        store.set_who_profiles(who_profiles(&s));
        self.aggregator.set_who_profiles(who_profiles(&s).any());
    }

    /// Move one resolved batch (and sampler loss counters since the last one) into the store.
    pub(super) fn absorb(&self, store: &mut Store, resolved: Resolved) {
        let status = read(&self.sampler).as_ref().map(super::super::perf::sampler::Sampler::status);
        self.absorb_with(store, resolved, status.as_ref(), None);
    }

    /// [`Shared::absorb`] with the sampler's status already taken (`None`: no sampler), its
    /// flat counts into the time slice of `slice_at` (`None`: now; [`Store::add_at`]).
    pub(super) fn absorb_with(
        &self,
        store: &mut Store,
        resolved: Resolved,
        status: Option<&SamplerStatus>,
        slice_at: Option<std::time::SystemTime>,
    ) {
        let (lost, throttled, times) = match status {
            Some(st) => (
                st.cpus.iter().map(|c| c.lost).sum(),
                st.cpus.iter().map(|c| c.throttled).sum(),
                st.events.iter().map(|e| (e.time_enabled, e.time_running)).collect(),
            ),
            None => {
                let c = lock(&self.counters);
                (c.lost, c.throttled, c.event_times.clone())
            }
        };
        let (dl, dt) = {
            let mut c = lock(&self.counters);
            // The kernel's times are cumulative per fd; the summary wants this epoch's share.
            if c.event_times.len() < times.len() {
                c.event_times.resize(times.len(), (0, 0));
            }
            let deltas: Vec<(u64, u64)> = times
                .iter()
                .zip(&c.event_times)
                .map(|(now, seen)| (now.0.saturating_sub(seen.0), now.1.saturating_sub(seen.1)))
                .collect();
            for (seen, now) in c.event_times.iter_mut().zip(&times) {
                seen.0 = seen.0.max(now.0);
                seen.1 = seen.1.max(now.1);
            }
            store.add_event_times(&deltas);
            let d = (lost.saturating_sub(c.lost), throttled.saturating_sub(c.throttled));
            c.lost = c.lost.max(lost);
            c.throttled = c.throttled.max(throttled);
            c.resolved_samples += resolved.samples;
            for ((_, reason), (n, _)) in &resolved.unknown {
                *c.unknown_by_reason.entry(reason.as_str().to_string()).or_insert(0) += n;
            }
            d
        };
        store.add_at(resolved, dl, dt, slice_at.unwrap_or_else(std::time::SystemTime::now));
    }

    /// Since when (Unix ms) the store's running operation has been stuck, if it has run for
    /// longer than a healthy one could.
    pub(super) fn stalled_since(&self, settings: &Settings) -> Option<u64> {
        let since = self.store_busy.load(std::sync::atomic::Ordering::Acquire);
        let bound = STALL_AFTER.max(settings.flush_interval * 2).as_millis() as u64;
        (since != 0 && unix_ms_now().saturating_sub(since) > bound).then_some(since)
    }

    /// The last store status, with a stall of the running operation (which holds the store,
    /// so its own status is not fresh).
    pub(super) fn store_status_now(&self, settings: &Settings) -> StoreStatus {
        let mut st = lock(&self.store_status).clone();
        st.publish_stalled_since_unix_ms = self.stalled_since(settings);
        st
    }

    pub(super) fn status(&self) -> StatusReport {
        let sampler_status = self
            .sampler
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
            .map(super::super::perf::sampler::Sampler::status);
        let agg = self.aggregator.stats();
        let settings = self.settings();
        let recent = self.recent_window(settings.flush_interval);
        let (last_reload, resolver, stages) = {
            let mut so = lock(&self.status_only);
            if let Some(s) = self.aggregator.try_resolver_stats() {
                so.resolver_stats = s;
            }
            (so.last_reload.clone(), so.resolver_stats.clone(), so.stages)
        };
        let c = lock(&self.counters);
        status::build(StatusInputs {
            host: &settings.host,
            db: &settings.db.display().to_string(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            sampler: sampler_status.as_ref(),
            aggregator: &agg,
            unknown_by_reason: &c.unknown_by_reason,
            resolved_samples: c.resolved_samples,
            store: self.store_status_now(&settings),
            settings: &settings,
            last_reload,
            recent,
            virtualized: status::virtualized(),
            stages,
            failed_threads: self.watch.failures(),
            resolver: &resolver,
            resolver_thread: self.aggregator.resolver_thread_stats(),
            stacks: self.aggregator.stack_report(),
            off_cpu: lock(&self.offcpu).as_ref().map(OffCpu::status),
        })
    }
}
